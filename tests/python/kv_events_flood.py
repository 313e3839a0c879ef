# SPDX-License-Identifier: MIT
"""KV events throughput, for docs/BENCHMARKS.md ("KV events"): a kvcached
of BUILD with --kv-events on ipc:// and one SUB that reads everything;
`kvev flood` (this tree's, tests/helpers/kvev.c) publishes PROMPTS
(default 3000) 8-block prompts as fast as it can. Prints the flood's wall
time, the daemon's CPU seconds during it, the batches and payload bytes
received. Not a test (pytest does not collect it).

    /usr/bin/python3 tests/python/kv_events_flood.py BUILD LABEL [daemon args...]
"""
import os, signal, socket, subprocess, sys, tempfile, threading, time
import zmq

build, label, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
PROMPTS = int(os.environ.get("PROMPTS", "3000"))

def cpu(pid):
    with open("/proc/%d/stat" % pid) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")

with tempfile.TemporaryDirectory(prefix="i39b.") as tmp:
    sock = os.path.join(tmp, "s"); ev = "ipc://" + os.path.join(tmp, "ev")
    log = open(os.path.join(tmp, "log"), "w")
    p = subprocess.Popen([os.path.join(build, "kvcached"), "--socket", sock, "--page-size", "4K",
                          "--pool-size", "64M", "--hugepages", "off", "--kv-events", ev] + extra,
                         stderr=log)
    for _ in range(500):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sock); break
        except OSError:
            time.sleep(0.01)
        finally:
            s.close()
    ctx = zmq.Context(); sub = ctx.socket(zmq.SUB); sub.connect(ev); sub.setsockopt(zmq.SUBSCRIBE, b"")
    got = {"b": 0, "bytes": 0}; stop = threading.Event()
    def reader():
        while not stop.is_set():
            if sub.poll(50):
                parts = sub.recv_multipart(); got["b"] += 1; got["bytes"] += len(parts[2])
    t = threading.Thread(target=reader); t.start(); time.sleep(0.3)
    kvev = os.path.join(os.environ.get("KVEV_BUILD", "build"), "tests", "helpers", "kvev")
    c0 = cpu(p.pid); t0 = time.time()
    r = subprocess.run([kvev, "flood", sock, "kvt-m", str(PROMPTS), "1"], capture_output=True, text=True)
    t1 = time.time(); c1 = cpu(p.pid)
    assert r.returncode == 0, r.stderr
    time.sleep(0.5); stop.set(); t.join()
    p.send_signal(signal.SIGTERM); p.wait()
    print("%-10s flood %.3f s  daemon cpu %.3f s  batches %d  payload %.1f MiB" %
          (label, t1 - t0, c1 - c0, got["b"], got["bytes"] / 2**20), flush=True)
