# SPDX-License-Identifier: MIT
"""The engine adapters: kvclient.vllm (a vLLM v1 KV connector) and
kvclient.sglang (an SGLang HiCache storage backend), each driven in real
engine processes against a real kvcached, with the engines' call
sequences (described in vllm_proc.py and sglang_proc.py, from the engines'
documented interfaces) and the stand-ins of tests/python/stubs for the
engine modules the adapters import (vLLM and SGLang cannot be installed
here)."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from conftest import EXAMPLES, ROOT, Zygote, child_env, wait_for

pytest.importorskip("torch")

HERE = ROOT / "tests" / "python"
STUBS = HERE / "stubs"


ZYGOTE: Zygote | None = None


@pytest.fixture(scope="module", autouse=True)
def engines_parent():
    """The parent every engine process of this module is forked from."""
    global ZYGOTE
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(STUBS)])
    ZYGOTE = Zygote(env)
    yield
    ZYGOTE.close()
    ZYGOTE = None


def engine(script: str, *args: str) -> subprocess.CompletedProcess:
    """An engine process running tests/python/<script> with args."""
    assert ZYGOTE is not None
    return ZYGOTE.run([str(HERE / script), *args], timeout=180)


@pytest.mark.parametrize("block_size,copy", [(16, "auto"), (32, "auto"), (8, "auto"),
                                             (16, "pages"), (32, "pages"), (16, "layers"),
                                             (32, "layers")])
def test_vllm_two_engines(daemon_factory, block_size, copy):
    """vLLM block_size equal to kvcached's 16-token blocks, a multiple, a
    divisor; copies by gather/scatter (one pass for all layers), by page
    views layer by layer (what a divisor uses, or vLLM's buffers on a GPU
    with a host pool this process cannot register with CUDA), or in the
    layer-wise order of the GPU path (a load per layer queued at
    start_load_kv, a save per layer at save_kv_layer, publish at
    wait_for_save; "layers": done on return on CPU tensors): the second
    engine's connector reports the first's prompt as matched, loads it
    into other block ids, and its logits equal a cold prefill's bit for
    bit."""
    d = daemon_factory("--page-size", "8K")
    opt = ("--block-size", str(block_size), "--copy", copy)
    a = engine("vllm_proc.py", "prefill", "--socket", d.sock, *opt)
    assert a.returncode == 0, a.stdout + a.stderr
    assert a.stdout.splitlines() == ["prefill: matched 0 errors 0 computed from 0 equal True"]
    b = engine("vllm_proc.py", "load", "--socket", d.sock, *opt)
    n = 6 * block_size	# 6 vLLM blocks + 5 tokens: every full block but never the last token
    assert b.stdout.splitlines() == [f"load: matched {n} errors 0 computed from {n} equal True"], \
        b.stdout + b.stderr
    assert b.returncode == 0
    ns = {r["model"]: r for r in d.kvstat()["namespaces"]}
    # The namespace: the model's name and its KV dtype (vLLM's "auto").
    assert ns["tinyllama-vllm/float32"]["name"] == "tinyllama-vllm/float32"
    assert ns["tinyllama-vllm/float32"]["hit_blocks"] > 0
    assert ns["tinyllama-vllm/float32"]["keys"] == "tokens"


def test_vllm_drafter_layers(daemon_factory):
    """A speculative decoding drafter's KV caches (EAGLE, MTP: numbered
    after the model's layers, here registered first) are not refused: one
    log line says they are not cached, the model's layers load as without
    them (logits bit-equal to a cold prefill), the drafter's stay as
    they were."""
    d = daemon_factory("--page-size", "8K")
    a = engine("vllm_proc.py", "prefill", "--socket", d.sock, "--drafter", "1")
    assert a.returncode == 0, a.stdout + a.stderr
    b = engine("vllm_proc.py", "load", "--socket", d.sock, "--drafter", "1")
    assert b.stdout.splitlines() == ["load: matched 96 errors 0 computed from 96 equal True",
                                     "drafter: untouched True"], b.stdout + b.stderr
    said = [ln for ln in b.stderr.splitlines() if "past the model's" in ln]
    assert len(said) == 1 and "model.layers.2.self_attn.attn" in said[0], b.stderr


@pytest.mark.parametrize("copy", ["auto", "layers"])
def test_vllm_chunked_prefill(daemon_factory, copy):
    """A prefill scheduled over three steps (new, then cached requests with
    the blocks each step adds): after each step kvcached holds the prompt
    blocks computed so far; the logits equal a cold prefill's; another
    engine then loads all of them. (This engine never calls save_kv_layer:
    with "layers", wait_for_save copies every layer itself.)"""
    d = daemon_factory("--page-size", "8K")
    a = engine("vllm_proc.py", "chunked", "--socket", d.sock, "--chunk", "48", "--copy", copy)
    assert a.stdout.splitlines() == [
        "chunk: computed 48, kvcached holds 3 blocks",
        "chunk: computed 96, kvcached holds 6 blocks",
        "chunk: computed 101, kvcached holds 6 blocks",
        "chunked: equal True"], a.stdout + a.stderr
    b = engine("vllm_proc.py", "load", "--socket", d.sock)
    assert b.stdout.splitlines() == ["load: matched 96 errors 0 computed from 96 equal True"], \
        b.stdout + b.stderr


def tp_engine(sock: str, mode: str, tp: int, *extra: str) -> str:
    """A tensor-parallel vLLM engine of tp rank processes (tp_proc.py);
    its one line of output."""
    r = engine("tp_proc.py", mode, "--socket", sock, "--tp", str(tp), *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("writer", [1, 2, 4])
def test_vllm_tp_any_size_loads_every_size(daemon_factory, writer):
    """A small GQA model (8 query heads, 4 KV heads) served by vLLM at TP
    `writer`, each rank a process of its own holding its share of the KV
    heads, publishes a prompt; engines at TP 1, 2 and 4 (other processes,
    other block tables) each load all of it, every rank its own heads, and
    their logits equal a cold prefill's bit for bit. One namespace, and one
    pool page per block whatever TP size wrote it."""
    d = daemon_factory("--page-size", "16K")
    name = ("--name", "tiny-tp")
    assert tp_engine(d.sock, "prefill", writer, *name) == \
        f"tp{writer} gqa prefill: matched 0 errors 0 computed from 0 equal True"
    for tp in (1, 2, 4):
        assert tp_engine(d.sock, "load", tp, *name) == \
            f"tp{tp} gqa load: matched 80 errors 0 computed from 80 equal True"
    ns = d.kvstat()["namespaces"]
    assert [(r["name"], r["pages"]) for r in ns] == [("tiny-tp/float32", 5)]


def test_vllm_tp_replicated_heads(daemon_factory):
    """2 KV heads at TP 4: two ranks hold each head, the first of them
    writes it, so each is stored once; TP 1 and TP 2 load it all."""
    d = daemon_factory("--page-size", "16K")
    opt = ("--name", "tiny-rep", "--kv-heads", "2")
    assert tp_engine(d.sock, "prefill", 4, *opt).endswith("equal True")
    for tp in (1, 2):
        assert tp_engine(d.sock, "load", tp, *opt) == \
            f"tp{tp} gqa load: matched 80 errors 0 computed from 80 equal True"
    assert [r["pages"] for r in d.kvstat()["namespaces"]] == [5]


def test_vllm_mla_one_copy(daemon_factory):
    """An MLA model (a latent of 32 + 16 rope dims per token and layer:
    vLLM's MLA cache [blocks, block_size, 48]) at TP 4: rank 0 publishes,
    the pool holds one page per block, a quarter of the four copies one per
    rank would take. Another engine process at TP 2 (two ranks reading one
    copy) and one at TP 1 load it all; logits equal a cold prefill's."""
    d = daemon_factory("--page-size", "16K")
    opt = ("--model", "mla", "--name", "tiny-mla")
    assert tp_engine(d.sock, "prefill", 4, *opt) == \
        "tp4 mla prefill: matched 0 errors 0 computed from 0 equal True"
    ns = d.kvstat()["namespaces"]
    assert [(r["name"], r["pages"]) for r in ns] == [("tiny-mla/float32 (MLA)", 5)]
    page = ns[0]["page_bytes"]
    assert page == 16 * 2 * 48 * 4	# block tokens x layers x latent x fp32
    for tp in (2, 1):
        assert tp_engine(d.sock, "load", tp, *opt) == \
            f"tp{tp} mla load: matched 80 errors 0 computed from 80 equal True"
    assert d.kvstat()["namespaces"][0]["pages"] == 5


def test_sglang_mla_two_processes(daemon_factory):
    """SGLang's MLA host pool (layer_first [layers, slots, 1, kv_lora_rank +
    qk_rope_head_dim]) through kvclient.sglang: a TP 2 engine backs its
    pages up from rank 0, its rank 1 prefetches the same copy into a pool
    of its own; another process (rank 1 of a TP 4 engine) prefetches them
    too: bytes equal, one page per key."""
    d = daemon_factory()
    a = engine("sglang_proc.py", "set", "--socket", d.sock, "--mla", "--tp", "2")
    assert a.stdout.splitlines() == ["set (v1): stored 6 of 6, rank 1 loaded 6, "
                                     "bytes equal True"], a.stdout + a.stderr
    flat = ("--extra-config", '{"module_path":"kvclient.sglang","class_name":"KvcachedStorage"}')
    for extra in ((), flat):	# HiCache's two paths: interface_v1, flat pages
        b = engine("sglang_proc.py", "get", "--socket", d.sock, "--mla", "--tp", "4",
                   "--rank", "1", *extra)
        assert b.stdout.splitlines() == [f"get ({'flat pages' if extra else 'v1'}): exists 6, "
                                         "loaded 6, bytes equal True, get() equal True"], \
            b.stdout + b.stderr
    ns = d.kvstat()["namespaces"]
    assert [(r["name"], r["pages"]) for r in ns] == \
        [("tiny-sglang-mla/bfloat16 (MLA) (engine keys)", 6)]


def stubs_on_path(monkeypatch):
    """In this process: the stand-ins, and the example engine vllm_proc uses."""
    monkeypatch.syspath_prepend(str(STUBS))
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_vllm_shard_and_refusals(monkeypatch):
    """What the connector takes from vLLM's configuration: a worker's tensor
    and pipeline ranks (parallel_config.rank) make its shard, the model's
    KV heads (every rank's) its namespace, the scheduler looks up as rank
    0; its KV dtype names the namespace; an MLA model is a latent
    namespace whose cache must be [blocks, block_size, head_size]; unknown
    KV cache shapes are refused with a reason. No daemon needed."""
    stubs_on_path(monkeypatch)
    import torch
    from types import SimpleNamespace
    from kvclient.vllm import KvcachedConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm_proc import ModelConfig, vllm_config
    from engine_loop import TinyLlama

    lm = TinyLlama(layers=4, heads=8, kv_heads=4)
    cfg = vllm_config(lm, "m", "/nonexistent/kv.sock", 16, 16)
    cfg.parallel_config = SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=2,
                                          rank=3)
    w = KvcachedConnector(cfg, KVConnectorRole.WORKER)
    assert (w.model.tp_rank, w.model.tp_size, w.model.pp_rank, w.model.pp_size) == (1, 2, 1, 2)
    # kv_heads: the model's 4 (vLLM's get_num_kv_heads is the rank's 2);
    # this rank holds and moves heads 2 and 3.
    assert (w.model.layers, w.model.kv_heads, w.model.name) == (2, 4, "m/float32")
    assert w.model.heads == (2, 2) and w.model.writes
    s = KvcachedConnector(cfg, KVConnectorRole.SCHEDULER)
    assert (s.model.tp_rank, s.model.pp_rank) == (0, 0)
    # Extra keys: cache_salt, LoRA, multimodal hashes.
    from kvclient.vllm import _extra_of
    assert _extra_of(SimpleNamespace()) is None
    assert _extra_of(SimpleNamespace(cache_salt="t", lora_request=SimpleNamespace(lora_name="x"),
                                     mm_features=[SimpleNamespace(identifier="h1")])) == \
        b"salt:t\0lora:x\0mm:h1"
    # kvcached away: no match, nothing raised.
    req = SimpleNamespace(request_id="r", prompt_token_ids=list(range(80)), cache_salt="t",
                          lora_request=None)
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    cfg.cache_config.cache_dtype = "fp8"
    assert KvcachedConnector(cfg, KVConnectorRole.WORKER).model.name == "m/float8_e4m3fn"
    with pytest.raises(ValueError, match="KV cache shape .* this rank's KV heads"):
        w.register_kv_caches({f"l{i}": torch.zeros(10, 16, 64) for i in range(2)})
    with pytest.raises(ValueError, match="2 KV caches for a model of 4 layers|hybrid"):
        KvcachedConnector(vllm_config(lm, "m", "/x", 16, 16), KVConnectorRole.WORKER) \
            .register_kv_caches({f"l{i}": torch.zeros(2, 4, 16, 4, 16) for i in range(2)})
    cfg.model_config = ModelConfig(lm, "m")
    cfg.model_config.use_mla = True
    mw = KvcachedConnector(cfg, KVConnectorRole.WORKER)
    assert mw.model.mla and mw.model.kv_heads == 1 and mw.model.heads == (0, 1)
    assert not mw.model.writes	# rank 1: rank 0 writes the latent
    with pytest.raises(ValueError, match="MLA cache shape"):
        mw.register_kv_caches({f"l{i}": torch.zeros(2, 10, 16, 1, 16) for i in range(2)})


def test_vllm_what_vllm_asks(monkeypatch):
    """The connector's answers to vLLM's class-level questions: PIECEWISE
    CUDA graphs whatever the copy mode (its loads are waited for in
    wait_for_layer_load, which a full graph's replay skips), and no
    reliable KV delivery for kv_both (a best-effort cache: vLLM's default
    would be True for a producer)."""
    stubs_on_path(monkeypatch)
    from kvclient.vllm import KvcachedConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm_proc import vllm_config
    from engine_loop import TinyLlama

    for extra in ({}, {"copy": "auto"}, {"copy": "pages"}):
        assert KvcachedConnector.requires_piecewise_for_cudagraph(extra) is True
    cfg = vllm_config(TinyLlama(), "m", "/nonexistent/kv.sock", 16, 16)
    for role in KVConnectorRole:
        assert KvcachedConnector(cfg, role).requires_kv_delivery is False


def test_vllm_refused_by_daemon(daemon, monkeypatch, caplog):
    """A daemon that refuses the model (its block tokens differ from what
    the connector was told) is logged with the daemon's reason and treated
    as kvcached away: 0 matched tokens, nothing raised."""
    stubs_on_path(monkeypatch)
    from types import SimpleNamespace
    from kvclient.vllm import KvcachedConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm_proc import vllm_config
    from engine_loop import TinyLlama

    s = KvcachedConnector(vllm_config(TinyLlama(block_tokens=32), "m", daemon.sock, 32, 32),
                          KVConnectorRole.SCHEDULER)
    req = SimpleNamespace(request_id="r", prompt_token_ids=list(range(80)), cache_salt=None,
                          lora_request=None)
    with caplog.at_level("ERROR"):
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    assert "kvcached refuses 'm/float32'" in caplog.text
    assert "uses 32-token blocks, this pool caches 16-token blocks" in caplog.text


def test_sglang_shard_and_layouts(daemon_factory, monkeypatch):
    """The shard from HiCacheStorageConfig (every tensor-parallel rank shares
    the namespace, context-parallel ranks stay apart by name); the
    page_first_direct host layout round-trips through kvcached; page_first
    and an MLA pool of the wrong shape are refused with a reason; no
    daemon makes every key a miss."""
    stubs_on_path(monkeypatch)
    daemon = daemon_factory("--page-size", "8K")	# every head of the model
    import torch
    from types import SimpleNamespace
    from kvclient.sglang import KvcachedStorage
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    def cfg(sock, **kw):
        base = dict(tp_rank=1, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0,
                    attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                    is_page_first_layout=False, model_name="sg",
                    extra_config={"socket": sock})
        base.update(kw)
        return HiCacheStorageConfig(**base)

    st = KvcachedStorage(cfg(daemon.sock))
    assert (st.tp_rank, st.tp_size) == (1, 2)
    assert KvcachedStorage(cfg(daemon.sock, is_mla_model=True)).mla
    # page_first_direct: [2, pages, layers, page_size, heads, head_dim],
    # 2 heads a rank of a model of 4 at TP 2: rank 1 holds heads 2 and 3.
    L, P, H, D, N = 2, 16, 2, 16, 8
    buf = torch.randn(2, N, L, P, H, D).to(torch.float16)
    pool = SimpleNamespace(layout="page_first_direct", page_size=P, layer_num=L, head_num=H,
                           head_dim=D, dtype=torch.float16, size=N * P, kv_buffer=buf)
    st.register_mem_pool_host(pool)
    assert st.model.kv_heads == 4 and st.model.heads == (2, 2)
    buf0 = torch.randn(2, N, L, P, H, D).to(torch.float16)
    st0 = KvcachedStorage(cfg(daemon.sock, tp_rank=0))
    st0.register_mem_pool_host(SimpleNamespace(**{**vars(pool), "kv_buffer": buf0}))
    keys = ["k%d" % i for i in range(3)]
    slots = torch.cat([torch.arange(p * P, (p + 1) * P) for p in (5, 1, 6)])
    # Rank 1's slices, then rank 0's: one page per key, whole at the last.
    assert st.batch_set_v1(keys, slots) == [True] * 3
    assert st.batch_exists(keys) == 0	# not whole yet
    assert st0.batch_set_v1(keys, slots) == [True] * 3
    want = buf[:, [5, 1, 6]].clone()
    buf.zero_()
    other = torch.cat([torch.arange(p * P, (p + 1) * P) for p in (0, 2, 3)])
    assert st.batch_get_v1(keys + ["nope"], torch.cat([other, torch.arange(7 * P, 8 * P)])) == \
        [True, True, True, False]
    assert torch.equal(buf[:, [0, 2, 3]], want)
    # An engine at TP 1 reads all four heads of the same pages.
    buf1 = torch.zeros(2, N, L, P, 2 * H, D).to(torch.float16)
    one = KvcachedStorage(cfg(daemon.sock, tp_rank=0, tp_size=1))
    one.register_mem_pool_host(SimpleNamespace(**{**vars(pool), "kv_buffer": buf1,
                                                  "head_num": 2 * H}))
    assert one.batch_get_v1(keys, other) == [True] * 3
    assert torch.equal(buf1[:, [0, 2, 3], :, :, :H], buf0[:, [5, 1, 6]])
    assert torch.equal(buf1[:, [0, 2, 3], :, :, H:], want)
    cp = KvcachedStorage(cfg(daemon.sock, attn_cp_rank=1, attn_cp_size=2))
    cp.register_mem_pool_host(pool)
    assert cp.batch_exists(keys) == 0	# another context-parallel rank: another namespace
    ns = {r["name"]: r for r in daemon.kvstat()["namespaces"]}
    # One namespace for every tensor-parallel rank and size; 3 pages.
    assert set(ns) == {"sg/float16 (engine keys)", "sg/float16 cp1/2 (engine keys)"}
    assert ns["sg/float16 (engine keys)"]["pages"] == 3
    with pytest.raises(ValueError, match="page_first"):
        KvcachedStorage(cfg(daemon.sock)).register_mem_pool_host(
            SimpleNamespace(**{**vars(pool), "layout": "page_first"}))
    with pytest.raises(ValueError, match="MLA host pool buffer"):
        KvcachedStorage(cfg(daemon.sock, is_mla_model=True)).register_mem_pool_host(
            SimpleNamespace(layout="layer_first", page_size=P, layer_num=L, dtype=torch.float16,
                            kv_lora_rank=32, qk_rope_head_dim=16,
                            kv_buffer=torch.zeros(L, N * P, 64)))
    with pytest.raises(ValueError, match="host pool holds 2 KV heads"):
        KvcachedStorage(cfg(daemon.sock, extra_config={"socket": daemon.sock, "kv_heads": 2})
                        ).register_mem_pool_host(pool)
    away = KvcachedStorage(cfg("/nonexistent/kv.sock"))
    away.register_mem_pool_host(pool)
    assert away.batch_exists(keys) == 0
    assert away.batch_get_v1(keys, other) == [False] * 3
    assert away.batch_set_v1(keys, other) == [False] * 3
    assert away.get(keys[0]) is None and not away.exists(keys[0])


def test_sglang_older_config_and_close(daemon, monkeypatch):
    """A HiCacheStorageConfig of an older SGLang (bb424de: no pipeline or
    context-parallel fields) builds a backend of one stage without
    context parallelism that stores and finds pages; close(), which
    HiCache calls on detach, closes its Client (the daemon sees it go),
    after which every key is a miss and nothing raises."""
    stubs_on_path(monkeypatch)
    import torch
    from dataclasses import dataclass
    from typing import Optional
    from kvclient.sglang import KvcachedStorage
    from sglang_proc import HostPool, PAGE

    @dataclass
    class OldConfig:	# SGLang's HiCacheStorageConfig at bb424de
        tp_rank: int
        tp_size: int
        is_mla_model: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        extra_config: Optional[dict] = None

    st = KvcachedStorage(OldConfig(0, 1, False, False, "old", {"socket": daemon.sock}), {})
    assert (st.pp_rank, st.pp_size, st.cp) == (0, 1, None)
    pool = HostPool(4 * PAGE)
    pool.kv_buffer.normal_()
    st.register_mem_pool_host(pool)
    slots = torch.arange(2 * PAGE)
    assert st.batch_set_v1(["a", "b"], slots) == [True, True]
    assert st.batch_exists(["a", "b", "c"]) == 2
    names = {r["name"] for r in daemon.kvstat()["namespaces"]}
    assert names == {"old/float16 (engine keys)"}
    assert len(daemon.kvstat()["clients"]) == 1
    st.close()
    wait_for(lambda: not daemon.kvstat()["clients"], "the closed Client detached")
    assert st.batch_exists(["a", "b"]) == 0
    assert st.batch_get_v1(["a"], slots[:PAGE]) == [False]
    assert st.batch_set_v1(["c"], slots[:PAGE]) == [False] and st.get("a") is None
    st.close()	# twice: nothing


def test_sglang_pages_after_daemon_restart(daemon_factory, monkeypatch, tmp_path):
    """SGLang's pages evicted to the spill tier come back after the daemon
    restarts: a new backend's batch_exists counts them (restoring them into
    the pool) and batch_get_v1 copies them out, bytes equal."""
    stubs_on_path(monkeypatch)
    import torch
    from kvclient.sglang import KvcachedStorage
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang_proc import HostPool, PAGE, page_keys

    n = 384	# pages: one and a half times the daemon's pool
    args = ("--spill-dir", str(tmp_path), "--spill-size", "4M", "--eviction", "lru")
    keys = page_keys(list(range(n * PAGE)), PAGE)
    src = HostPool(n * PAGE)
    src.kv_buffer.normal_()

    def storage(d):
        st = KvcachedStorage(HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
            model_name="restart", extra_config={"socket": d.sock}), {})
        return st

    d = daemon_factory(*args)
    st = storage(d)
    st.register_mem_pool_host(src)
    for b in range(0, n, 16):
        assert st.batch_set_v1(keys[b:b + 16], torch.arange(b * PAGE, (b + 16) * PAGE)) == \
            [True] * 16
    wait_for(lambda: (lambda c: c["spills"] > 0 and c["pages_spilled"] == c["spills"])(
        d.kvstat()["counters"]), "spill writes done")
    st.close()
    d.proc.terminate()	# a clean stop; its folder goes with the fixture
    assert d.proc.wait(timeout=30) == 0

    d = daemon_factory(*args)
    st = storage(d)
    dst = HostPool(n * PAGE)
    st.register_mem_pool_host(dst)
    hits = st.batch_exists(keys[:64])
    assert hits == 64	# the oldest pages: all spilled, all back
    assert st.batch_get_v1(keys[:hits], torch.arange(hits * PAGE)) == [True] * hits
    assert torch.equal(dst.kv_buffer[:, :, :hits * PAGE], src.kv_buffer[:, :, :hits * PAGE])
    st.close()


def test_vllm_block_size_refused(daemon_factory):
    """A vLLM block size neither a multiple nor a divisor of kvcached's
    block tokens is refused with both named."""
    d = daemon_factory("--page-size", "8K")
    b = engine("vllm_proc.py", "prefill", "--socket", d.sock, "--block-size", "24")
    assert b.returncode != 0
    assert "block_size 24 is neither a multiple nor a divisor of kvcached's block tokens 16" \
        in b.stderr


def test_vllm_daemon_killed(daemon_factory):
    """The daemon SIGKILLed between the scheduler's promise and the
    worker's load: the connector reports every promised block as failed
    (get_block_ids_with_load_errors), the engine recomputes them, its
    logits equal a cold prefill's, and nothing raises."""
    d = daemon_factory("--page-size", "8K")
    a = engine("vllm_proc.py", "prefill", "--socket", d.sock)
    assert a.returncode == 0, a.stdout + a.stderr
    b = engine("vllm_proc.py", "kill", "--socket", d.sock, "--daemon-pid", str(d.proc.pid))
    assert b.stdout.splitlines() == ["kill: matched 96 errors 6 computed from 0 equal True"], \
        b.stdout + b.stderr
    assert b.returncode == 0
    assert d.proc.wait(timeout=30) == -9
    # With no daemon at all the connector reports no match.
    c = engine("vllm_proc.py", "load", "--socket", d.sock)
    assert c.stdout.splitlines() == ["load: matched 0 errors 0 computed from 0 equal True"], \
        c.stdout + c.stderr


def documented_sglang_extra_config() -> str:
    """The extra config of the SGLang command line in docs/ENGINES.md."""
    text = (ROOT / "docs" / "ENGINES.md").read_text()
    m = re.search(r"--hicache-storage-backend-extra-config '([^']*)'", text)
    assert m, "docs/ENGINES.md has no SGLang command line"
    return m.group(1)


FLAT_PAGES = '{"backend_name":"kvcached","module_path":"kvclient.sglang",' \
             '"class_name":"KvcachedStorage"}'


@pytest.mark.parametrize("extra,path", [(None, "v1"), (FLAT_PAGES, "flat pages")])
def test_sglang_two_engines(daemon_factory, extra, path):
    """One SGLang process backs its host pool's pages up, another
    prefetches them into other host pages: bytes equal; the leading-hit
    count stops at the first missing key; the namespace is engine-keyed,
    apart from a token-keyed one, under the model's name in kvstat. The
    extra config of docs/ENGINES.md selects HiCache's v1 path
    (batch_get_v1/batch_set_v1); without "interface_v1" HiCache's other
    path (batch_get/batch_set of flat pages, set_from_flat_data_page)
    gives the same bytes."""
    d = daemon_factory()
    extra = extra or documented_sglang_extra_config()
    a = engine("sglang_proc.py", "set", "--socket", d.sock, "--extra-config", extra)
    assert a.stdout.splitlines() == [f"set ({path}): stored 6 of 6, again 6"], a.stdout + a.stderr
    b = engine("sglang_proc.py", "get", "--socket", d.sock, "--extra-config", extra)
    assert b.stdout.splitlines() == [
        f"get ({path}): exists 6 with a gap at 3: 3, loaded 6, bytes equal True, "
        "get() equal True, exists(missing) False"], b.stdout + b.stderr
    ns = {r["model"]: r for r in d.kvstat()["namespaces"]}
    assert ns["tinyllama-sglang/float16"]["name"] == "tinyllama-sglang/float16 (engine keys)"
    assert ns["tinyllama-sglang/float16"]["pages"] == 6
    assert ns["tinyllama-sglang/float16"]["keys"] == "engine"


def test_no_insert_engines(daemon_factory):
    """``"no_insert": true`` in either adapter's extra config: the engine
    loads what others cached and leaves nothing of its own (issue #35)."""
    d = daemon_factory("--page-size", "8K")
    a = engine("vllm_proc.py", "prefill", "--socket", d.sock, "--no-insert")
    assert a.stdout.splitlines() == ["prefill: matched 0 errors 0 computed from 0 equal True"], \
        a.stdout + a.stderr
    assert d.kvstat()["counters"]["publishes"] == 0
    b = engine("vllm_proc.py", "prefill", "--socket", d.sock)
    assert b.returncode == 0, b.stdout + b.stderr
    published = d.kvstat()["counters"]["publishes"]
    assert published > 0
    c = engine("vllm_proc.py", "load", "--socket", d.sock, "--no-insert")
    n = 6 * 16
    assert c.stdout.splitlines() == [f"load: matched {n} errors 0 computed from {n} equal True"], \
        c.stdout + c.stderr
    assert d.kvstat()["counters"]["publishes"] == published
    s = engine("sglang_proc.py", "set", "--socket", d.sock, "--no-insert")
    assert s.stdout.splitlines() == ["set (v1): stored 0 of 6, again 0"], s.stdout + s.stderr
    assert s.returncode == 0
    assert d.kvstat()["counters"]["publishes"] == published
    s = engine("sglang_proc.py", "set", "--socket", d.sock)
    assert s.stdout.splitlines() == ["set (v1): stored 6 of 6, again 6"], s.stdout + s.stderr
    g = engine("sglang_proc.py", "get", "--socket", d.sock, "--no-insert")
    assert g.returncode == 0 and "loaded 6, bytes equal True" in g.stdout, g.stdout + g.stderr


def test_engine_keys_never_mix_with_tokens(daemon):
    """An engine-keyed namespace and the token-keyed one of the same model
    are two namespaces: a block of one is never a hit in the other, and
    each kind of request is refused on the other kind of Client."""
    import kvclient
    from conftest import tiny_model, tokens
    toks = tokens(48, 3)
    with kvclient.Client(tiny_model("mix"), socket=daemon.sock) as ct, \
            kvclient.Client(tiny_model("mix", keys="engine"), socket=daemon.sock) as ce:
        with ct.request(toks) as r:
            r.lookup()
            r.alloc()
            assert r.publish() == 3
        with ce.request_keys(["a", "b", "c"]) as r:
            assert r.lookup() == 0
            r.alloc()
            assert r.publish() == 3
        with ce.request_keys(["b", "c"]) as r:	# pages are keyed on their own
            assert r.lookup() == 2
        with ct.request(toks) as r:
            assert r.lookup() == 3
        with pytest.raises(kvclient.InvalidArgumentError, match="use request_keys"):
            ce.request(toks)
        with pytest.raises(kvclient.InvalidArgumentError, match="keys blocks by tokens"):
            ct.request_keys(["a"])
        with pytest.raises(kvclient.TooBigError):
            ce.request_keys(["x" * 1025])
        with pytest.raises(kvclient.InvalidArgumentError):
            ce.request_keys(["", "a"])
    names = sorted(r["name"] for r in daemon.kvstat()["namespaces"])
    assert names == ["mix", "mix (engine keys)"]


def test_engine_keys_single_flight(daemon):
    """A block another client of an engine-keyed namespace is writing is
    reported in flight wherever it sits in the asking request (blocks are
    keyed on their own, their parent is the root), and wait() gets it once
    published."""
    import kvclient
    from conftest import tiny_model
    m = tiny_model("flight", keys="engine")
    with kvclient.Client(m, socket=daemon.sock) as a, kvclient.Client(m, socket=daemon.sock) as b:
        with a.request_keys(["p", "q"]) as ra:
            assert ra.lookup() == 0
            assert ra.alloc() == 2
            with b.request_keys(["q"]) as rb:
                assert rb.lookup() == 0
                assert rb.inflight == 1
            ra.publish()
            with b.request_keys(["q"]) as rb:
                assert rb.lookup() == 1


def test_connected_sees_daemon_exit(daemon_factory):
    """Client.connected() turns False once the daemon is gone, with no
    round trip; a lookup that follows finds the handle dead."""
    import kvclient
    from conftest import tiny_model
    d = daemon_factory()
    c = kvclient.Client(tiny_model(), socket=d.sock)
    assert c.connected()
    d.proc.kill()
    d.proc.wait(timeout=30)
    assert not c.connected()
    with pytest.raises(kvclient.ConnectionLostError):
        with c.request(list(range(16))) as r:
            r.lookup()
    c.close()


def test_vllm_copy_options(monkeypatch):
    """The copy path's options are checked when the connector is made: copy
    is "auto", "pages" or "layers"; register_wait is seconds >= 0."""
    stubs_on_path(monkeypatch)
    from kvclient.vllm import KvcachedConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm_proc import vllm_config
    from engine_loop import TinyLlama

    lm = TinyLlama()
    for copy in ("auto", "pages", "layers"):
        KvcachedConnector(vllm_config(lm, "m", "/nonexistent/kv.sock", 16, 16, copy),
                          KVConnectorRole.WORKER)
    with pytest.raises(ValueError, match="copy 'gpu'"):
        KvcachedConnector(vllm_config(lm, "m", "/x", 16, 16, "gpu"), KVConnectorRole.WORKER)
    for bad in (-1, "soon", None):
        cfg = vllm_config(lm, "m", "/x", 16, 16)
        cfg.kv_transfer_config.kv_connector_extra_config["register_wait"] = bad
        with pytest.raises(ValueError, match="register_wait"):
            KvcachedConnector(cfg, KVConnectorRole.WORKER)
    cfg = vllm_config(lm, "m", "/x", 16, 16)
    cfg.kv_transfer_config.kv_connector_extra_config["register_wait"] = "2.5"
    assert KvcachedConnector(cfg, KVConnectorRole.WORKER)._register_wait == 2.5
