# SPDX-License-Identifier: MIT
"""Fixtures of the Python binding's tests: the build under test ($BUILD,
default "build"), the package from the source tree with that build's
library, and real kvcached daemons on private sockets started the way
tests/lib/harness.c starts them (small host pool, 4 KiB pages, debug
logs, 5 ms tick)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = (ROOT / os.environ.get("BUILD", "build")).resolve()
PKG = ROOT / "libclient" / "python"
EXAMPLES = PKG / "examples"

os.environ["KVCLIENT_LIB"] = str(BUILD / "libkvclient.so")
os.environ.pop("KVCACHED_SOCKET", None)
sys.path.insert(0, str(PKG))


def child_env(**extra) -> dict:
    """Environment for a Python child process: this package, this library."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PKG), str(EXAMPLES), str(ROOT / "tests" / "python")])
    env["KVCLIENT_LIB"] = str(BUILD / "libkvclient.so")
    env.update(extra)
    return env


class Zygote:
    """Engine processes forked from one parent that imported torch once
    (tests/python/zygote.py); run() answers as subprocess.run(...,
    capture_output=True, text=True) would."""

    def __init__(self, env: dict):
        self.dir = tempfile.mkdtemp(prefix="kvt-zygote.")
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "python" / "zygote.py")],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        if json.loads(self.proc.stdout.readline() or "{}").get("ready") is not True:
            raise RuntimeError("tests/python/zygote.py did not start")

    def run(self, argv: list, timeout: float = 180) -> subprocess.CompletedProcess:
        out, err = os.path.join(self.dir, "out"), os.path.join(self.dir, "err")
        self.proc.stdin.write(json.dumps({"argv": [str(a) for a in argv], "out": out,
                                          "err": err, "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tests/python/zygote.py ended (status {self.proc.wait()})")
        r = json.loads(line)
        with open(out) as f, open(err) as g:
            done = subprocess.CompletedProcess(argv, r["rc"], f.read(), g.read())
        if r.get("timeout"):
            raise subprocess.TimeoutExpired(argv, timeout, done.stdout, done.stderr)
        return done

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def can_connect(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    """A kvcached of $BUILD on a private socket; stop() wants a clean exit."""

    BASE = ["--page-size", "4K", "--pool-size", "1M", "--hugepages", "off",
            "--log-level", "debug", "--tick-ms", "5"]

    def __init__(self, *args: str):
        self.dir = tempfile.mkdtemp(prefix="kvt-py.")
        os.chmod(self.dir, 0o755)
        self.sock = os.path.join(self.dir, "kvcached.sock")
        self.log = os.path.join(self.dir, "kvcached.log")
        argv = [str(BUILD / "kvcached"), "--socket", self.sock, *self.BASE, *args]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log)
        for _ in range(1000):	# up to 10 s, like the harness
            if can_connect(self.sock):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvcached exited {self.proc.returncode}: "
                                   f"{Path(self.log).read_text()[-2000:]}")
            time.sleep(0.01)
        self.proc.kill()
        raise RuntimeError("kvcached did not start listening in 10 s")

    def log_text(self) -> str:
        return Path(self.log).read_text(errors="replace")

    def kvstat(self) -> dict:
        """kvstat --json of this daemon."""
        out = subprocess.run([str(BUILD / "kvstat"), "--socket", self.sock, "--json"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def stop(self) -> int | None:
        """SIGTERM and wait: the exit status (None if it was gone already)."""
        rc = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(timeout=30)
        for f in (self.log, self.sock):
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass
        os.rmdir(self.dir)
        return rc


@pytest.fixture
def daemon_factory():
    """Start daemons with extra flags; each must shut down cleanly."""
    started = []

    def start(*args: str) -> Daemon:
        d = Daemon(*args)
        started.append(d)
        return d
    yield start
    bad = []
    for d in started:
        alive = d.proc.poll() is None
        text = d.log_text()
        rc = d.stop()
        if alive and rc != 0:
            bad.append(f"kvcached exited {rc}:\n{text[-3000:]}")
    assert not bad, "\n".join(bad)


@pytest.fixture
def daemon(daemon_factory) -> Daemon:
    return daemon_factory()


def tiny_model(name: str = "kvt-tiny", **kw):
    """The harness's test model (kvt_model): 16-token blocks, 1 layer, 2 kv
    heads, head dim 32, 2-byte dtype: 4096-byte pages."""
    import kvclient
    kw.setdefault("dtype", "float16")
    return kvclient.Model(name, kw.pop("dtype"), layers=1, kv_heads=2, head_dim=32,
                          block_tokens=16, pos="rope", **kw)


def tokens(n: int, seed: int, shared: int = 0) -> list[int]:
    """n token ids: the first `shared` from seed 1, the rest from `seed`."""
    import random
    a = random.Random(1).choices(range(32000), k=n)
    b = random.Random(seed).choices(range(32000), k=n)
    return a[:shared] + b[shared:]


def wait_for(pred, what: str, seconds: float = 20.0):
    """Poll pred() until it returns a true value; a liveness bound, not a
    timing assertion: failing means it never happened."""
    end = time.monotonic() + seconds
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(0.02)
