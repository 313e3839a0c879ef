# SPDX-License-Identifier: MIT
"""The Python binding's API against a real kvcached: requests, keys from
every kind of token sequence, page views, gather/scatter in both layouts,
stats as kvstat shows them, shards, salts, threads."""
from __future__ import annotations

import array
import ctypes
import errno
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import kvclient
from conftest import BUILD, ROOT, child_env, tiny_model, tokens, wait_for

torch = pytest.importorskip("torch")


def publish(c: kvclient.Client, toks, fill=None) -> int:
    """Publish a prompt; fill(i, page array) writes granted block i."""
    with c.request(toks) as r:
        r.lookup()
        r.alloc()
        for i in range(r.hits, r.hits + r.granted):
            a = r.page_array(i)
            if fill:
                fill(i, a)
        return r.publish() if r.granted else r.hits


def test_version_matches_header():
    h = (ROOT / "libclient" / "kvclient.h").read_text()
    want = ".".join(re.search(r"^#define KVC_VERSION_%s (\d+)$" % part, h, re.M).group(1)
                    for part in ("MAJOR", "MINOR", "PATCH"))
    assert kvclient.version() == want
    assert kvclient.__version__ == want
    assert ".".join(map(str, kvclient.version_info())) == want
    assert kvclient.library_path().endswith("libkvclient.so")


def test_works_without_numpy_and_torch(daemon):
    """numpy and torch are optional: lists in, memoryviews out."""
    code = f"""
import sys
sys.modules["numpy"] = None
sys.modules["torch"] = None
import kvclient
m = kvclient.Model("kvt-tiny", "float16", 1, 2, 32, 16)
with kvclient.Client(m, socket={daemon.sock!r}) as c:
    t = list(range(100, 164))
    with c.request(t) as r:
        assert r.lookup() == 0 and r.alloc() == 4
        for i in range(4):
            r.page(i)[:4] = bytes([i, 1, 2, 3])
        assert r.publish() == 4
    with c.request(t) as r:
        assert r.lookup() == 4
        assert bytes(r.page(2)[:4]) == bytes([2, 1, 2, 3])
        assert r.page(2).readonly
    try:
        r2 = c.request(t)
        r2.page_array(0)
    except ImportError:
        print("no numpy: ImportError")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["no", "numpy:", "ImportError", "ok"]


def test_model_arguments():
    m = kvclient.Model("m", "bf16", 2, 4, 8, 16, tp_rank=1, tp_size=2)
    assert (m.dtype, m.dtype_bytes, m.page_shape) == ("bfloat16", 2, (2, 2, 16, 4, 8))
    assert m.page_bytes == 2 * 2 * 16 * 4 * 8 * 2
    assert kvclient.Model("m", np.float32, 1, 1, 1, 1).dtype == "float32"
    assert kvclient.Model("m", torch.float16, 1, 1, 1, 1).dtype == "float16"
    assert kvclient.Model("m", 2, 1, 1, 1, 1).dtype is None
    assert kvclient.Model("m", "fp8", 1, 1, 1, 1).dtype_bytes == 1
    assert kvclient.Model("m", 4, 1, 1, 1, 1, pos="alibi").pos == kvclient.PosKind.ALIBI
    assert "tp_rank=1, tp_size=2" in repr(m)
    for kw, msg in [(dict(name=""), "1..63 bytes"), (dict(name="x" * 64), "1..63 bytes"),
                    (dict(layers=0), "layers 0"), (dict(dtype=3), "3 bytes"),
                    (dict(dtype="int4"), "not a KV dtype"), (dict(pos="sinus"), "pos"),
                    (dict(tp_rank=2, tp_size=2), "tp_rank 2"), (dict(head_dim=70000), "head_dim")]:
        args = dict(name="m", dtype="float16", layers=1, kv_heads=1, head_dim=1,
                    block_tokens=16)
        args.update(kw)
        with pytest.raises(ValueError, match=msg):
            kvclient.Model(**args)
    with pytest.raises(TypeError):
        kvclient.Model("m", "float16", 1.0, 1, 1, 1)


def test_request_cycle(daemon):
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        assert (c.page_bytes, c.block_tokens, c.pool_kind, c.pool_device) == (4096, 16, "host",
                                                                             None)
        t = tokens(4 * 16 + 5, 2)
        with c.request(t) as r:
            assert r.blocks == 4 and r.lookup() == 0 and r.hits == 0
            assert r.spilled == 0
            assert r.alloc() == 4 and r.granted == 4
            assert [r.page_index(i) >= 0 for i in range(4)] == [True] * 4
            assert r.publish() == 4 and r.hits == 4
        with c.request(t[:3 * 16 + 7]) as r:
            assert r.lookup() == 3
            assert r.restore() == 3	# nothing spilled: a no-op
            assert not r.restore_pays(1.0)
            assert r.alloc() == 0
        # A different block 2: the prefix ends there.
        t2 = t[:32] + tokens(32, 9)
        with c.request(t2) as r:
            assert r.lookup() == 2
        s = c.stats()["client"]
        assert (s["lookups"], s["hit_blocks"], s["published"]) == (3, 5, 4)


def test_keys_from_every_token_type(daemon):
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        t = tokens(3 * 16 + 1, 3)
        want = c.keys(t)
        assert len(want) == 3 and len(set(want)) == 3
        assert all(0 < k < 2**128 for k in want)
        n = np.array(t, dtype=np.uint32)
        strided = np.zeros(2 * len(t), dtype=np.uint32)
        strided[::2] = t
        ro = n.copy()
        ro.flags.writeable = False
        forms = [t, tuple(t), array.array("I", t), array.array("i", t), array.array("q", t),
                 n, n.astype(np.int32), n.astype(np.int64), strided[::2], ro,
                 torch.tensor(t, dtype=torch.int32), torch.tensor(t, dtype=torch.int64),
                 torch.tensor(t, dtype=torch.int64)[None].expand(2, -1)[1],
                 memoryview(array.array("I", t)), iter(t)]
        for f in forms:
            with c.request(f) as r:
                assert r.keys() == want, type(f)
        assert c.keys(range(16)) == c.keys(list(range(16)))
        # Extra keys split identical tokens; so do salts and models.
        assert c.keys(t, extra=b"lora-7") != want
        with c.request(t, extra="lora-7") as r:
            assert r.keys() == c.keys(t, extra=b"lora-7")
        with kvclient.Client(tiny_model(), socket=daemon.sock, salt=b"tenant-b") as c2:
            assert c2.keys(t) != want
        assert c.keys([]) == []


def test_page_views(daemon):
    """Granted pages are writable views; hits are read-only; every view shows
    the same bytes, and another Client sees what this one wrote."""
    m = tiny_model()
    with kvclient.Client(m, socket=daemon.sock) as c, \
            kvclient.Client(m, socket=daemon.sock) as c2:
        t = tokens(3 * 16, 4)
        with c.request(t) as r:
            r.lookup()
            assert r.alloc() == 3
            a0, t1, mv2 = r.page_array(0), r.page_tensor(1), r.page(2)
            assert a0.shape == m.page_shape == tuple(t1.shape)
            assert (a0.dtype, t1.dtype, mv2.nbytes) == (np.float16, torch.float16, 4096)
            assert not mv2.readonly and a0.flags.writeable
            a0[...] = np.arange(a0.size, dtype=np.float16).reshape(a0.shape)
            t1.fill_(1.5)
            mv2[:] = bytes(range(256)) * 16
            # The same memory through another view.
            assert bytes(r.page(0)) == a0.tobytes()
            assert r.page_array(1).ravel()[7] == 1.5
            assert r.publish() == 3
            assert r.page(0).readonly and not r.page_array(0).flags.writeable
        with c2.request(t) as r:
            assert r.lookup() == 3
            assert np.array_equal(r.page_array(0).ravel(),
                                  np.arange(m.page_bytes // 2, dtype=np.float16))
            assert torch.all(r.page_tensor(1) == 1.5)
            assert bytes(r.page(2)) == bytes(range(256)) * 16
            with pytest.raises(ValueError):
                r.page_array(0)[0, 0, 0, 0, 0] = 1
            with pytest.raises(TypeError):
                r.page(0)[0] = 1
    # dtypes numpy lacks are viewed as raw integers of their width.
    with kvclient.Client(tiny_model("kvt-bf16", dtype="bfloat16"), socket=daemon.sock) as c:
        with c.request(tokens(16, 5)) as r:
            r.lookup()
            r.alloc()
            assert r.page_array(0).dtype == np.uint16
            assert r.page_tensor(0).dtype == torch.bfloat16


def _fill_engine(cache, seed):
    g = np.random.default_rng(seed)
    for x in cache:
        x[...] = g.standard_normal(x.shape).astype(x.dtype)


@pytest.mark.parametrize("form", ["kv-lists", "kv-stacked", "kv-padded", "flash-lists",
                                  "flash-stacked", "flash-torch"])
def test_gather_scatter(daemon_factory, form):
    """Engine blocks scattered by one Client come back, gathered into other
    engine blocks by another, byte for byte, in every layout form."""
    d = daemon_factory("--page-size", "8K")
    m = kvclient.Model("kvt-two-layer", "float16", 2, 2, 16, 16)
    L, nb = m.layers, 6
    blk = (m.block_tokens, m.kv_heads, m.head_dim)

    def cache():
        if form == "kv-lists":
            k = [np.zeros((nb,) + blk, np.float16) for _ in range(L)]
            v = [np.zeros((nb,) + blk, np.float16) for _ in range(L)]
            return (k, v), k + v, lambda x, b: [t[b] for t in x[0]] + [t[b] for t in x[1]]
        if form == "kv-stacked":
            k, v = np.zeros((L, nb) + blk, np.float16), np.zeros((L, nb) + blk, np.float16)
            return (k, v), [k, v], lambda x, b: [x[0][:, b], x[1][:, b]]
        if form == "kv-padded":	# 3 padding tokens between blocks
            k = [np.zeros((nb, blk[0] + 3) + blk[1:], np.float16)[:, :blk[0]] for _ in range(L)]
            v = [np.zeros((nb, blk[0] + 3) + blk[1:], np.float16)[:, :blk[0]] for _ in range(L)]
            return (k, v), k + v, lambda x, b: [t[b] for t in x[0]] + [t[b] for t in x[1]]
        if form == "flash-lists":
            k = [np.zeros((2, nb) + blk, np.float16) for _ in range(L)]
            return (k, None), k, lambda x, b: [t[:, b] for t in x[0]]
        if form == "flash-stacked":
            k = np.zeros((L, 2, nb) + blk, np.float16)
            return (k, None), [k], lambda x, b: [x[0][:, :, b]]
        k = [torch.zeros((2, nb) + blk, dtype=torch.float16) for _ in range(L)]
        return (k, None), [t.numpy() for t in k], lambda x, b: [t[:, b].numpy() for t in x[0]]

    t = tokens(4 * 16, 6)
    with kvclient.Client(m, socket=d.sock) as c1, kvclient.Client(m, socket=d.sock) as c2:
        (k1, v1), arrays1, blocks1 = cache()
        _fill_engine(arrays1, 1)
        kv1 = kvclient.PagedKV(c1, k1, v1)
        assert (kv1.num_blocks, kv1.layout) == (nb, "kv" if form.startswith("kv") else "flash")
        with c1.request(t) as r:
            assert r.lookup() == 0 and r.alloc() == 4
            r.scatter(kv1, [5, 0, 3, 1])
            assert r.publish() == 4
        (k2, v2), arrays2, blocks2 = cache()
        kv2 = kvclient.PagedKV(c2, k2, v2)
        with c2.request(t) as r:
            assert r.lookup() == 4
            r.gather(kv2, np.array([2, 4], dtype=np.int64), first=1)	# blocks 1, 2
            r.gather(kv2, torch.tensor([0]), first=3)			# block 3
            r.gather(kv2, [])						# nothing
        # Request block j was engine block [5, 0, 3, 1][j] in c1's cache.
        for src, dst in [(0, 2), (3, 4), (1, 0)]:
            for a, b in zip(blocks1((k1, v1), src), blocks2((k2, v2), dst)):
                assert np.array_equal(np.asarray(a), np.asarray(b))
        # Engine blocks no gather wrote stay zero.
        for b in (1, 3, 5):
            assert all(not np.asarray(x).any() for x in blocks2((k2, v2), b))


def test_stats_as_kvstat_shows_them(daemon):
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        t = tokens(2 * 16, 7)
        publish(c, t)
        with c.request(t, label="sys-prompt-v1") as r:
            assert r.lookup() == 2
        ks = wait_for(lambda: (lambda j: j if j["counters"]["lookups"] == 2 else None)(
            daemon.kvstat()), "kvstat counts both lookups")
        s = c.stats()
        assert set(s["counters"]) == set(ks["counters"])
        for k in ("lookups", "hit_blocks", "miss_blocks", "publishes", "allocs"):
            assert s["counters"][k] == ks["counters"][k], k
        assert s["pages"] == ks["pages"]
        assert s["hit_ratio"] == pytest.approx(ks["hit_ratio"])
        assert s["pool"] == {"pages": ks["pool"]["pages"], "block_tokens": 16, "kind": "host"}
        assert s["client"]["lookups"] == 2 and s["client"]["published"] == 2
        assert any(p["label"] == "sys-prompt-v1" for p in ks["top_prefixes"])
        text = wait_for(lambda: (lambda x: x if "sys-prompt-v1" in x else None)(c.metrics()),
                        "the label in /metrics' top prefixes")
        assert re.search(r"^kvcached_lookups_total 2$", text, re.M)
        prom = subprocess.run([str(BUILD / "kvstat"), "--socket", daemon.sock, "--prometheus"],
                              capture_output=True, text=True, timeout=30).stdout

        def families(x):
            return re.findall(r"^# TYPE (\S+)", x, re.M)
        assert families(text) == families(prom) and len(families(text)) > 30


def test_tp_ranks_share_and_salts_keep_apart(daemon):
    """Tensor-parallel ranks share one namespace and write each page
    together: rank 1's slices alone are not a hit; with rank 0's they are,
    for another process of rank 1, for rank 0 and for the unsharded model.
    A salt keeps tenants apart. kvstat shows one namespace for the model."""
    t = tokens(2 * 16, 8)
    with kvclient.Client(tiny_model(tp_rank=0, tp_size=2), socket=daemon.sock) as r0, \
            kvclient.Client(tiny_model(tp_rank=1, tp_size=2), socket=daemon.sock) as r1, \
            kvclient.Client(tiny_model(tp_rank=1, tp_size=2), socket=daemon.sock) as r1b, \
            kvclient.Client(tiny_model(), socket=daemon.sock) as one, \
            kvclient.Client(tiny_model(), socket=daemon.sock, salt="other") as salted:
        assert r1.model.heads == (1, 1) and r0.model.heads == (0, 1)
        assert publish(r1, t) == 2	# its slices in
        with one.request(t) as r:
            assert r.lookup() == 0 and r.inflight == 2	# not whole yet
        assert publish(r0, t) == 2
        for c, want in [(r0, 2), (r1b, 2), (one, 2), (salted, 0)]:
            with c.request(t) as r:
                assert r.lookup() == want
        names = {p["namespace"] for p in daemon.kvstat()["clients"]}
        assert names == {"kvt-tiny"}
    with pytest.raises(ValueError, match="2 KV heads do not divide tp_size 3"):
        tiny_model(tp_rank=0, tp_size=3)
    with pytest.raises(ValueError, match="kv_heads=1"):
        tiny_model(mla=True)


def test_pins_quota_and_alloc_ahead(daemon):
    with kvclient.Client(tiny_model(), socket=daemon.sock, max_pins=4) as c:
        with c.request(tokens(8 * 16, 9)) as r:
            r.lookup()
            assert r.alloc() == 4	# no more than the pin slots
            assert r.publish() == 4
    with kvclient.Client(tiny_model(), socket=daemon.sock, alloc_ahead=True) as c:
        for seed in (10, 11, 12):
            assert publish(c, tokens(3 * 16, seed)) == 3


def test_close_releases_open_requests(daemon):
    with kvclient.Client(tiny_model(), socket=daemon.sock) as watcher:
        c = kvclient.Client(tiny_model(), socket=daemon.sock)
        t = tokens(3 * 16, 13)
        publish(c, t)
        r = c.request(t)
        assert r.lookup() == 3
        r2 = c.request(tokens(2 * 16, 14))
        r2.lookup()
        assert r2.alloc() == 2	# unpublished pages
        wait_for(lambda: watcher.stats()["counters"]["pins"] >= 5, "pins counted")
        c.close()
        assert c.closed
        with pytest.raises(kvclient.RequestReleasedError):
            r.page(0)
        r.release()	# harmless
        wait_for(lambda: watcher.stats()["pages"]["writing"] == 0 and
                 watcher.stats()["counters"]["pins"] == 0, "pins and pages back")


def test_threads_share_a_client(daemon):
    """A Client is shared by threads (the GIL is released around calls that
    wait); each thread uses its own requests."""
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        t = tokens(4 * 16, 15)
        publish(c, t)
        errors = []

        def work(seed):
            try:
                for i in range(50):
                    with c.request(t) as r:
                        assert r.lookup() == 4
                    publish(c, tokens(16, 1000 * seed + i))
            except Exception as e:	# reported below
                errors.append(e)
        th = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for x in th:
            x.start()
        for x in th:
            x.join()
        assert not errors
        assert c.stats()["client"]["lookups"] == 1 + 4 * 50 * 2


def test_ctypes_structs_match_the_header():
    """kvclient/_lib.py's Structures of the GPU-engine calls have the C
    compiler's sizes and offsets (tests/python/kvsizes.c prints them)."""
    from kvclient import _lib as L
    out = subprocess.run([str(BUILD / "tests" / "python" / "kvsizes")], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    py = {"kvc_layout": L.Layout, "kvc_copy_opts": L.CopyOpts, "kvc_gpu_status": L.GpuStatus}
    seen = 0
    for line in out:
        name, value = line.rsplit(" ", 1)
        if name == "KVC_GPU_CHUNK":
            assert int(value) == L.GPU_CHUNK
        elif name.endswith(" size"):
            assert ctypes.sizeof(py[name[:-5]]) == int(value), name
        else:
            struct, field = name.split(".")
            assert getattr(py[struct], field).offset == int(value), name
        seen += 1
    assert seen == 3 + 11 + 8 + 10 + 1


def test_layer_ranges(daemon_factory):
    """gather/scatter of a range of layers move those layers' K and V only:
    a prompt scattered layer by layer, gathered in two ranges, is the
    whole, byte for byte; a range past the model is refused."""
    d = daemon_factory("--page-size", "8K")
    m = kvclient.Model("kvt-four-layer", "float16", 4, 2, 16, 16)
    shape = (2, 4, 16, 2, 16)
    src = [torch.randn(shape).to(torch.float16) for _ in range(m.layers)]
    dst = [torch.zeros(shape, dtype=torch.float16) for _ in range(m.layers)]
    t = tokens(3 * 16, 8)
    with kvclient.Client(m, socket=d.sock) as c:
        kv1, kv2 = kvclient.PagedKV(c, src), kvclient.PagedKV(c, dst)
        assert kv1.device is None	# CPU copies
        with c.request(t) as r:
            assert r.lookup() == 0 and r.alloc() == 3
            for layer in reversed(range(m.layers)):
                r.scatter(kv1, [0, 1, 2], first_layer=layer, layers=1)
            assert r.publish() == 3
        with c.request(t) as r:
            assert r.lookup() == 3
            r.gather(kv2, [3, 2, 1], first_layer=0, layers=1)
            assert torch.equal(dst[0][:, [3, 2, 1]], src[0][:, :3])
            assert all(not x.any() for x in dst[1:])
            r.gather(kv2, [3, 2, 1], first_layer=1, event=None, layer_events=None)
            for x, y in zip(dst, src):
                assert torch.equal(x[:, [3, 2, 1]], y[:, :3]) and not x[:, 0].any()
            with pytest.raises(ValueError, match="first_layer"):
                r.gather(kv2, [0], first_layer=4)
            with pytest.raises(ValueError, match="layers"):
                r.gather(kv2, [0], first_layer=1, layers=4)
            with pytest.raises(ValueError, match="layers"):
                r.gather(kv2, [0], layers=0)


def test_gpu_prepare_without_a_gpu(daemon):
    """No CUDA here: gpu_prepare says why in the exception and gpu_status
    keeps it; CPU copies go on. (tests/gpu/hostpool.c runs the GPU path.)"""
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        st = c.gpu_status()
        assert st["state"] == "none" and st["device"] is None and st["chunks"] == 1
        with pytest.raises(kvclient.NotSupportedError) as e:
            c.gpu_prepare(0)
        st = c.gpu_status()
        if "libcuda.so.1" not in st["why"] and "without CUDA" not in st["why"]:
            pytest.skip(f"a CUDA driver is here: {st['why'] or 'prepared'}")
        assert st["state"] == "failed" and st["error"] == errno.ENOTSUP
        assert st["why"] in str(e.value)
        assert st["chunks_registered"] == 0 and st["bytes_registered"] == 0
        with pytest.raises(ValueError):
            c.gpu_prepare(-1)


def test_no_insert_pin_and_share(daemon):
    """Issue #35 from Python: a no-insert Client hits and never publishes
    (NoInsertError with the reason); a request's prefix pinned with a TTL
    (Request.pin) holds its pages, Client.unpin ends it; max_share holds a
    process to less than the daemon's max-share (QuotaError naming it)."""
    toks = tokens(64, 500)
    with kvclient.Client(tiny_model(), socket=daemon.sock) as w:
        assert publish(w, toks) == 4
        with kvclient.Client(tiny_model(), socket=daemon.sock, no_insert=True) as ro:
            with ro.request(toks) as r:
                assert r.lookup() == 4
            with ro.request(tokens(64, 501)) as r:
                r.lookup()
                with pytest.raises(kvclient.NoInsertError, match="KVC_OPEN_NO_INSERT") as e:
                    r.alloc()
                assert isinstance(e.value, PermissionError)
        with w.request(toks) as r:
            pin = r.pin(60)
            assert pin > 0
            assert r.pin(120) == pin	# the same prefix: the same pin, longer
        wait_for(lambda: daemon.kvstat()["counters"]["pinned_pages"] == 4, "the pin's pages")
        pinned = daemon.kvstat()["pinned"]
        assert [(p["id"], p["blocks"], p["resident"]) for p in pinned] == [(pin, 4, 4)]
        w.unpin(pin)
        with pytest.raises(kvclient.NoPinError):
            w.unpin(pin)
        assert daemon.kvstat()["counters"]["pinned_pages"] == 0
        with w.request(toks) as r:
            with pytest.raises(ValueError):
                r.pin(0)
    with kvclient.Client(tiny_model(), socket=daemon.sock, salt=b"own", max_share=2) as c:
        keep = []	# requests not released: their pages stay pinned
        with pytest.raises(kvclient.QuotaError, match=r"max-share of 2% \(as its client asked\)"):
            for i in range(20):
                r = c.request(tokens(64, 600 + i))
                keep.append(r)
                r.lookup()
                if r.alloc():
                    r.publish()
        for r in keep:
            r.release()
    with pytest.raises(ValueError):
        kvclient.Client(tiny_model(), socket=daemon.sock, max_share=101)
