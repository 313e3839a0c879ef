# SPDX-License-Identifier: MIT
"""Single flight from Python: a request sees the blocks another process is
writing (``inflight``), ``wait()`` sleeps (GIL released) until they are
published and pins them as hits, or returns at its timeout with a miss;
``remote`` is 0 without a remote tier."""
from __future__ import annotations

import os
import threading
import time

import pytest

import kvclient
from conftest import tiny_model

BT = 16


def prompt(seed: int, blocks: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 50000 + 1 for i in range(blocks * BT)]


def writer(sock: str, toks: list[int], ready, go, publish: bool) -> None:
    """In a child process: claim every block, say so, then publish (or
    release unpublished) when told."""
    with kvclient.Client(tiny_model(), socket=sock) as c, c.request(toks) as r:
        r.lookup()
        got = r.alloc()
        for i in range(got):
            r.page(i)[:] = bytes([i + 1]) * len(r.page(i))
        os.write(ready, b"r")
        os.read(go, 1)
        if publish:
            r.publish()


def spawn_writer(sock, toks, publish):
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            writer(sock, toks, ready_w, go_r, publish)
        except BaseException:
            code = 1
        os._exit(code)
    assert os.read(ready_r, 1) == b"r"
    return pid, go_w


@pytest.mark.parametrize("publish", [True, False])
def test_wait_for_another_process(daemon, publish):
    toks = prompt(11 if publish else 12, 4)
    pid, go = spawn_writer(daemon.sock, toks, publish)
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c, c.request(toks) as r:
        assert r.lookup() == 0
        assert r.inflight == 4
        assert r.remote == 0
        # The writer goes on while we sleep in C, GIL released.
        t = threading.Timer(0.2, lambda: os.write(go, b"g"))
        t.start()
        hits = r.wait(60000)
        t.join()
        if publish:
            assert hits == 4 and r.hits == 4
            assert all(bytes(r.page(i)) == bytes([i + 1]) * c.page_bytes for i in range(4))
        else:	# released unpublished: a miss at once, ours to compute
            assert hits == 0
            assert r.alloc() == 4
    _, st = os.waitpid(pid, 0)
    assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0


def test_wait_times_out_and_goes_on(daemon):
    toks = prompt(13, 3)
    pid, go = spawn_writer(daemon.sock, toks, True)
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c, c.request(toks) as r:
        r.lookup()
        assert r.inflight == 3
        assert r.wait(20) == 0	# the writer holds on: we go on alone
        assert r.alloc() == 3
    os.write(go, b"g")
    _, st = os.waitpid(pid, 0)
    assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0


def test_wait_arguments(daemon):
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        with c.request(prompt(14, 2)) as r:
            with pytest.raises(kvclient.RequestStateError):
                r.wait(10)	# before lookup
            r.lookup()
            with pytest.raises(kvclient.InvalidArgumentError):
                r.wait(-1)
            assert r.wait(0) == 0	# nothing in flight: at once
            r.alloc()
            with pytest.raises(kvclient.RequestStateError):
                r.wait(10)	# after alloc
    assert issubclass(kvclient.InFlightError, kvclient.KvcError)


def test_wait_ends_when_the_daemon_dies(daemon):
    """A daemon SIGKILLed while we wait for another process's blocks wakes
    nobody, and its orphaned segment still shows them in flight: wait()
    must notice the daemon's end (within about a tick) and raise
    ConnectionLostError, not sleep out its timeout and return a miss."""
    toks = prompt(17, 4)
    pid, go = spawn_writer(daemon.sock, toks, False)
    try:
        with kvclient.Client(tiny_model(), socket=daemon.sock) as c, c.request(toks) as r:
            assert r.lookup() == 0
            assert r.inflight == 4
            t = threading.Timer(0.2, daemon.proc.kill)
            t.start()
            with pytest.raises(kvclient.ConnectionLostError):
                r.wait(20000)	# without the check: 20 s, then 0 hits
            t.join()
            daemon.proc.wait(timeout=30)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
