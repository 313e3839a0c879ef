# SPDX-License-Identifier: MIT
"""The binding's optional C fast path (_kvcfast, libclient/python/kvclient/
_kvcfast.c): built by make next to the library and loaded from there; with
it and without it (KVCLIENT_NO_FAST=1, the ctypes path) every token form
gives the same keys, hits and errors; a value it does not take goes the
ctypes way and is refused there as before."""
from __future__ import annotations

import array
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import kvclient
from conftest import BUILD, child_env, tiny_model, tokens

FORMS = """
import array, numpy as np, torch
def forms(t):
    n = np.array(t, dtype=np.uint32)
    strided = np.zeros(2 * len(t), dtype=np.uint32)
    strided[::2] = t
    return [t, tuple(t), array.array("I", t), array.array("i", t), array.array("q", t),
            array.array("Q", t), n, n.astype(np.int32), n.astype(np.int64),
            n.astype(np.uint64), strided[::2], memoryview(array.array("I", t)), iter(t),
            range(1000, 1000 + len(t)), torch.tensor(t, dtype=torch.int32),
            torch.tensor(t), torch.tensor(t)[None].expand(2, -1)[1],
            torch.tensor(t, dtype=torch.float32).requires_grad_().detach().long(),
            torch.tensor([7] * 5 + list(t), dtype=torch.int32)[5:],
            torch.tensor([7] * 5 + list(t))[5:],
            torch.stack([torch.tensor(t)] * 2, 1)[:, 0],
            torch.nn.Parameter(torch.tensor(t, dtype=torch.int32), requires_grad=False)]
"""
exec(FORMS)

# A child that publishes nothing: it reports, per form, the request's keys
# (as hex), and per bad input the exception's type, with the fast path or
# without, as the environment says.
CHILD = FORMS + r"""
import json, sys
import kvclient
from conftest import tiny_model, tokens
bad = [[-1, 2], [2**32], [1, "a"], [1.0], b"\x01\x02", "tok", np.array([-3]),
       np.array([2**32], dtype=np.uint64), np.array([1.5]), np.array([[1, 2]]),
       torch.tensor([-1]), torch.tensor([[1]]), torch.tensor([1.0]), [True, 2]]
with kvclient.Client(tiny_model(), socket=sys.argv[1]) as c:
    out = {"fast": c._fast is not None, "keys": [], "bad": []}
    for f in forms(tokens(3 * 16 + 1, 3)):
        with c.request(f) as r:
            out["keys"].append([hex(k) for k in r.keys()])
    for b in bad:
        try:
            with c.request(b) as r:
                out["bad"].append(["ok", r.blocks])
        except Exception as e:
            out["bad"].append([type(e).__name__, getattr(e, "errno", None)])
print(json.dumps(out))
"""


def run_child(sock, **env):
    p = subprocess.run([sys.executable, "-c", CHILD, sock], env=child_env(**env),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def need_headers():
    import os
    import sysconfig
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("python3-dev not installed: make builds no fast path")


def test_fast_path_is_built_and_loaded(daemon):
    """make builds _kvcfast beside libkvclient.so, and the binding uses it."""
    need_headers()
    built = list(BUILD.glob("_kvcfast*.so"))
    assert built, "make did not build the fast path (python3-dev missing?)"
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        assert c._fast is not None
        assert c._lookup is c._fast.lookup


def test_same_keys_and_errors_with_and_without(daemon):
    need_headers()
    fast = run_child(daemon.sock)
    slow = run_child(daemon.sock, KVCLIENT_NO_FAST="1")
    assert fast["fast"] and not slow["fast"]
    assert fast["keys"] == slow["keys"]
    want = fast["keys"][0]
    assert len(want) == 3
    # Every form but range() (other tokens) names the same blocks.
    assert all(k == want for i, k in enumerate(fast["keys"]) if i != 13)
    assert fast["bad"] == slow["bad"]
    # The refusals are the binding's documented ones, not the fast path's.
    kinds = [b[0] for b in fast["bad"]]
    assert kinds[:2] == ["TensorError", "TensorError"]
    assert kinds[2:6] == ["TypeError"] * 4
    assert kinds[6:13] == ["TensorError"] * 7
    assert fast["bad"][13] == ["ok", 0]	# bools are ints, as array('I') takes them


def test_hits_through_the_fast_path(daemon):
    """A published prompt hits from a list, a numpy int64 array and a
    torch int64 tensor (each converted in C), and from 32-bit buffers
    (by address); a range of them as well through the ctypes fallback."""
    need_headers()
    t = tokens(4 * 16, 9)
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        assert c._fast is not None
        with c.request(t) as r:
            assert r.lookup() == 0
            r.alloc()
            r.publish()
        for f in forms(t):
            with c.request(f) as r:
                hits = r.lookup()
                assert hits == (4 if not isinstance(f, range) else 0), type(f)
        # A token over 2**32 - 1 deep in a long list: refused, nothing leaks.
        bad = list(t) * 64
        bad[-5] = 2**32
        with pytest.raises(kvclient.TensorError):
            c.request(bad)
        # Over KVC_MAX_TOKENS: left to the ctypes path, refused there.
        with pytest.raises(kvclient.TooBigError):
            c.request([1] * ((1 << 22) + 16))
        assert not c._live
