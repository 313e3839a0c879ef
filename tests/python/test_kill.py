# SPDX-License-Identifier: MIT
"""A Python process killed with SIGKILL while it holds pins and unpublished
pages gives them all back: kvstat --json before, during and after."""
from __future__ import annotations

import signal
import subprocess
import sys

import kvclient
from conftest import child_env, tiny_model, tokens, wait_for

CHILD = """
import sys, time, kvclient
m = kvclient.Model("kvt-tiny", "float16", 1, 2, 32, 16)
c = kvclient.Client(m, socket=sys.argv[1])
hit = c.request([int(x) for x in sys.argv[2].split(",")])
assert hit.lookup() == 3
fresh = c.request(list(range(5000, 5000 + 4 * 16)))
fresh.lookup()
assert fresh.alloc() == 4
fresh.page_array(0)[...] = 1	# half-written, never published
print("holding", flush=True)
time.sleep(600)
"""


def test_sigkill_gives_back_pins_and_pages(daemon):
    t = tokens(3 * 16, 41)
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        with c.request(t) as r:
            r.lookup()
            r.alloc()
            r.publish()
        before = wait_for(lambda: (lambda j: j if j["counters"]["pins"] == 0 else None)(
            daemon.kvstat()), "no pins before")
        assert before["pages"]["writing"] == 0
        child = subprocess.Popen([sys.executable, "-c", CHILD, daemon.sock,
                                  ",".join(map(str, t))], env=child_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = child.stdout.readline()
            assert line == "holding\n", child.stderr.read()
            during = wait_for(lambda: (lambda j: j if j["counters"]["pins"] >= 3 else None)(
                daemon.kvstat()), "the child's pins counted")
            assert during["pages"]["writing"] == 4
            assert during["pages"]["free"] == before["pages"]["free"] - 4
            assert during["counters"]["clients_attached"] == 2
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert child.returncode == -signal.SIGKILL

        def settled():
            j = daemon.kvstat()
            return j if (j["counters"]["pins"] == 0 and j["pages"]["writing"] == 0 and
                         j["counters"]["clients_attached"] == 1) else None
        after = wait_for(settled, "the killed child's pins and pages given back")
        assert after["pages"]["free"] == before["pages"]["free"]
        assert after["pages"]["ready"] == before["pages"]["ready"]
        assert after["counters"]["reclaimed"] == before["counters"]["reclaimed"] + 4
        # The blocks it pinned are still cached for everyone.
        with c.request(t) as r:
            assert r.lookup() == 3
