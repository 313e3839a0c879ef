# SPDX-License-Identifier: MIT
"""Zero-copy page views read exactly what C wrote, and C reads exactly what
Python wrote through them. The C side is tests/python/kvpage.c, which
fills and checks pages with the harness's pattern (64-bit words derived
from each block's key: tests/lib/harness.c, kvt_fill / kvt_check)."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

import kvclient
from conftest import BUILD, tiny_model, tokens

torch = pytest.importorskip("torch")
M64 = (1 << 64) - 1


def _mix(x):
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xff51afd7ed558ccd)
    return x ^ (x >> np.uint64(33))


def pattern(key: int, nbytes: int) -> np.ndarray:
    """kvt_fill's words for a block key (hi << 64 | lo)."""
    lo, hi = key & M64, key >> 64
    s = np.array([lo], np.uint64) ^ _mix(np.array([hi], np.uint64))
    return _mix(s + np.arange(nbytes // 8, dtype=np.uint64))


def kvpage(mode: str, sock: str, toks, tmp_path) -> subprocess.CompletedProcess:
    f = tmp_path / f"tokens-{mode}.bin"
    np.asarray(toks, dtype="<u4").tofile(f)
    return subprocess.run([str(BUILD / "tests" / "python" / "kvpage"), mode, sock, str(f)],
                          capture_output=True, text=True, timeout=60)


def test_python_reads_what_c_wrote(daemon, tmp_path):
    t = tokens(4 * 16 + 3, 21)
    out = kvpage("put", daemon.sock, t, tmp_path)
    assert (out.returncode, out.stdout) == (0, "hits 0\n"), out.stderr
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        keys = c.keys(t)
        kv = kvclient.PagedKV(c, [np.zeros((4, 16, 2, 32), np.float16)],
                              [np.zeros((4, 16, 2, 32), np.float16)])
        with c.request(t) as r:
            assert r.lookup() == 4
            for i, key in enumerate(keys):
                want = pattern(key, c.page_bytes)
                assert np.array_equal(np.frombuffer(r.page(i), np.uint64), want)
                assert np.array_equal(r.page_array(i).view(np.uint64).ravel(), want)
                got = r.page_tensor(i).view(torch.int64).flatten().numpy().view(np.uint64)
                assert np.array_equal(got, want)
            # Gather puts each page's K half and V half in the engine's blocks.
            r.gather(kv, [3, 2, 1, 0])
            half = c.page_bytes // 2 // 8
            for i, key in enumerate(keys):
                want = pattern(key, c.page_bytes)
                k, v = kv._keep[0][0][3 - i], kv._keep[1][0][3 - i]
                assert np.array_equal(k.view(np.uint64).ravel(), want[:half])
                assert np.array_equal(v.view(np.uint64).ravel(), want[half:])


def test_c_reads_what_python_wrote(daemon, tmp_path):
    t = tokens(3 * 16, 22)
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        keys = c.keys(t)
        with c.request(t) as r:
            assert r.lookup() == 0 and r.alloc() == 3
            # One block through each kind of view.
            r.page(0)[:] = pattern(keys[0], c.page_bytes).tobytes()
            r.page_array(1).view(np.uint64).ravel()[:] = pattern(keys[1], c.page_bytes)
            r.page_tensor(2).view(torch.int64).flatten()[:] = torch.from_numpy(
                pattern(keys[2], c.page_bytes).view(np.int64))
            assert r.publish() == 3
        out = kvpage("get", daemon.sock, t, tmp_path)
        assert (out.returncode, out.stdout) == (0, "hits 3\n"), out.stderr
        # And the check can fail: one word off in a page of another prompt.
        bad = tokens(2 * 16, 23)
        keys = c.keys(bad)
        with c.request(bad) as r:
            r.lookup()
            r.alloc()
            for i in range(2):
                r.page(i)[:] = pattern(keys[i], c.page_bytes).tobytes()
            r.page_array(1).view(np.uint64).ravel()[100] ^= np.uint64(1)
            r.publish()
        out = kvpage("get", daemon.sock, bad, tmp_path)
        assert out.returncode == 3, (out.stdout, out.stderr)
