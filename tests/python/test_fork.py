# SPDX-License-Identifier: MIT
"""A process forked by multiprocessing cannot use its parent's Client (a
clear ForkedHandleError, the parent's pins untouched) and opens its own."""
from __future__ import annotations

import multiprocessing

import pytest

import kvclient
from conftest import tiny_model, tokens, wait_for


def _child(client, request, fresh, sock, t_parent, t_child, q):
    out = {}
    try:
        client.request(t_parent).lookup()
    except kvclient.ForkedHandleError as e:
        out["lookup"] = (e.errno, str(e))
    for name, call in [("page", lambda: request.page(0)), ("stats", client.stats),
                       ("alloc", fresh.alloc)]:	# looked up in the parent
        try:
            call()
            out[name] = "worked"
        except kvclient.ForkedHandleError as e:
            out[name] = e.errno
    with kvclient.Client(tiny_model(), socket=sock) as own:
        with own.request(t_parent) as r:
            out["hits"] = r.lookup()
        with own.request(t_child) as r:
            r.lookup()
            r.alloc()
            out["published"] = r.publish()
    # Dropping the inherited handle here leaves the parent's pins alone.
    request.release()
    client.close()
    q.put(out)


def test_fork_child_opens_its_own_client(daemon):
    t_parent, t_child = tokens(3 * 16, 31), tokens(2 * 16, 32)
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        with c.request(t_parent) as r:
            r.lookup()
            r.alloc()
            r.page_array(0)[...] = 3
            r.publish()
        held = c.request(t_parent)
        assert held.lookup() == 3	# pinned across the child's life
        fresh = c.request(t_child)
        assert fresh.lookup() == 0
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_child, args=(c, held, fresh, daemon.sock, t_parent, t_child, q))
        p.start()
        out = q.get(timeout=60)
        p.join(60)
        assert p.exitcode == 0
        err, msg = out["lookup"]
        assert err == 10 and "opened by another process" in msg and "open a new" in msg
        assert (out["page"], out["stats"], out["alloc"]) == (10, 10, 10)
        assert (out["hits"], out["published"]) == (3, 2)
        # The parent's handle, request and pins are as they were.
        assert (held.page_array(0) == 3).all()
        assert wait_for(lambda: daemon.kvstat()["counters"]["pins"] == 3,
                        "the parent's 3 pins, and only those")
        fresh.release()
        with c.request(t_child) as r:
            assert r.lookup() == 2
        held.release()
        assert wait_for(lambda: daemon.kvstat()["counters"]["pins"] == 0, "pins released")


@pytest.mark.parametrize("method", ["fork"])
def test_pool_of_forked_workers(daemon, method):
    """The usual pattern: each worker opens its Client after the fork."""
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        t = tokens(4 * 16, 33)
        with c.request(t) as r:
            r.lookup()
            r.alloc()
            r.publish()
        with multiprocessing.get_context(method).Pool(2) as pool:
            hits = pool.starmap(_lookup_in_worker, [(daemon.sock, t)] * 4)
        assert hits == [4] * 4


def _lookup_in_worker(sock, t):
    with kvclient.Client(tiny_model(), socket=sock) as c, c.request(t) as r:
        return r.lookup()
