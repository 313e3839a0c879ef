#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Time to first token of a Llama-3-8B-shaped PyTorch model on a GPU, cold
and warm through kvcached's vLLM connector (kvclient.vllm), on a host pool
and on a cuda pool (issue #32).

The model: Llama-3-8B's shape (32 layers, hidden 4096, 32 query heads, 8 KV
heads of 128, MLP 14336, vocabulary 128256, RoPE), random bf16 weights,
one batched causal prefill of the whole prompt per forward
(scaled_dot_product_attention; no Python loop over blocks or tokens), its
KV cache paged as vLLM keeps it with FlashAttention: one [2, num_blocks,
16, 8, 128] tensor per layer, written through a block table.

For each pool (a kvcached of its own, started here) and prompt length:

  cold       the prefill alone, no kvcached (the baseline);
  cold+save  the prefill with the connector saving every prompt block
             (save_kv_layer after each layer's attention, wait_for_save);
  warm       another request of the same prompt into other blocks: the
             scheduler-side connector matches every full block but the
             last token's, the worker loads them (start_load_kv, then
             wait_for_layer_load before each layer) and the model computes
             the rest; the time to its first token.

Each row checks what it can: the warm prefix's K and V equal the cold
prefill's bit for bit, and the warm first-token logits are within bf16's
rounding of the cold ones (the suffix is computed with other shapes, so
not bit for bit). Timed with torch.cuda.synchronize() around each pass;
the best of --repeat runs after one untimed warm-up of each kind.

  ttft_torch.py [--pool host,cuda] [--tokens 2048,8192,32768] [--json]
  ttft_torch.py --smoke    # a tiny model on the CPU, host pool: the code
                           # path and the checks, no timing worth reading
  --copy layers            # the connector's copy option (smoke: the GPU
                           # path's layer-wise order on CPU tensors)

Without a GPU (and without --smoke) it prints why it skipped and exits 0.
It finds kvcached and libkvclient in .gpu/build (a GPU bundle) or
$BUILD (default build); --kvcached names the daemon.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _build_dir() -> Path:
    if (ROOT / ".gpu" / "build" / "kvcached").exists() and "BUILD" not in os.environ:
        return ROOT / ".gpu" / "build"
    return (ROOT / os.environ.get("BUILD", "build")).resolve()


def _paths() -> None:
    """The package, this tree's library and, where vLLM is not installed,
    the project's vLLM stand-ins (tests/python/stubs)."""
    os.environ.setdefault("KVCLIENT_LIB", str(_build_dir() / "libkvclient.so"))
    for p in (ROOT / "libclient" / "python", ROOT / "libclient" / "python" / "examples",
              ROOT / "tests" / "python"):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    try:
        import vllm  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "tests" / "python" / "stubs"))


LLAMA3_8B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336,
                 vocab=128256, block=16)
SMOKE = dict(layers=3, hidden=64, heads=4, kv_heads=2, head_dim=16, mlp=128, vocab=300,
             block=16)


class Llama:
    """Random weights of a Llama shape; one causal prefill per forward."""

    def __init__(self, shape: dict, device, dtype, seed: int = 1):
        import torch
        self.torch = torch
        for k, v in shape.items():
            setattr(self, k, v)
        g = torch.Generator(device=device).manual_seed(seed)
        H, nh, kvh, hd, I = self.hidden, self.heads, self.kv_heads, self.head_dim, self.mlp

        def w(*shape, scale=None):
            s = scale if scale is not None else shape[0] ** -0.5
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32)
                    * s).to(dtype)
        self.embed = w(self.vocab, H, scale=1.0)
        self.wqkv = [w(H, (nh + 2 * kvh) * hd) for _ in range(self.layers)]
        self.wo = [w(nh * hd, H) for _ in range(self.layers)]
        self.w13 = [w(H, 2 * I) for _ in range(self.layers)]
        self.w2 = [w(I, H) for _ in range(self.layers)]
        self.head = w(H, self.vocab)
        self.inv_freq = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=device,
                                                        dtype=torch.float32) / hd))

    def _rms(self, x):
        t = self.torch
        return (x.float() * t.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)

    def _rope(self, x, pos):
        t = self.torch
        ang = t.outer(pos.float(), self.inv_freq)
        c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
        x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
        return t.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2).to(x.dtype)

    def _attention(self, q, k, v, mask):
        """scaled_dot_product_attention, causal (mask None) or with a mask;
        spelled out where torch predates it (Debian's 1.13: --smoke only)."""
        t = self.torch
        F = t.nn.functional
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                  is_causal=mask is None)
        if mask is None:
            n = q.shape[-2]
            mask = t.ones(n, n, dtype=t.bool, device=q.device).tril()
        a = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return a.masked_fill(~mask, float("-inf")).softmax(-1) @ v

    def forward(self, tokens, start: int, cache: list, table, hooks=None):
        """Prefill tokens[start:] attending to the cache's K and V of
        tokens[:start] (through the block table) and to their own; writes
        their K and V into the cache. Returns the last token's logits.
        hooks: before(layer), after_attention(layer)."""
        t = self.torch
        F = t.nn.functional
        n, bs = tokens.shape[0], self.block
        nh, kvh, hd = self.heads, self.kv_heads, self.head_dim
        pos = t.arange(start, n, device=tokens.device)
        slots = table[pos // bs] * bs + pos % bs
        every = t.arange(n, device=tokens.device)
        all_slots = table[every // bs] * bs + every % bs
        x = self.embed[tokens[start:]]
        s = n - start
        mask = None
        if start:	# the suffix's queries: causal from the bottom right
            mask = every[None, :] <= pos[:, None]
        for li in range(self.layers):
            if hooks:
                hooks.before(li)
            h = self._rms(x)
            qkv = h @ self.wqkv[li]
            q = qkv[:, :nh * hd].view(s, nh, hd)
            k = qkv[:, nh * hd:(nh + kvh) * hd].view(s, kvh, hd)
            v = qkv[:, (nh + kvh) * hd:].view(s, kvh, hd)
            q, k = self._rope(q, pos), self._rope(k, pos)
            kc = cache[li][0].view(-1, kvh, hd)
            vc = cache[li][1].view(-1, kvh, hd)
            kc[slots] = k
            vc[slots] = v
            if start:
                k, v = kc[all_slots], vc[all_slots]
            rep = nh // kvh
            o = self._attention(
                q.transpose(0, 1)[None], k.transpose(0, 1).repeat_interleave(rep, 0)[None],
                v.transpose(0, 1).repeat_interleave(rep, 0)[None], mask)
            x = x + o[0].transpose(0, 1).reshape(s, nh * hd) @ self.wo[li]
            if hooks:
                hooks.after_attention(li)
            h = self._rms(x)
            gu = h @ self.w13[li]
            x = x + (F.silu(gu[:, :self.mlp]) * gu[:, self.mlp:]) @ self.w2[li]
        return (self._rms(x[-1:]) @ self.head)[0].float()


class Hooks:
    """The worker connector's per-layer calls, as vLLM's attention layers
    make them."""

    def __init__(self, worker, cache, names):
        self.worker, self.cache, self.names = worker, cache, names

    def before(self, i):
        self.worker.wait_for_layer_load(self.names[i])

    def after_attention(self, i):
        self.worker.save_kv_layer(self.names[i], self.cache[i], None)


def start_daemon(kvcached: Path, pool: str, pool_bytes: int, page_bytes: int):
    d = tempfile.mkdtemp(prefix="kvttft.")
    sock = os.path.join(d, "kvcached.sock")
    log = open(os.path.join(d, "log"), "w")
    env = dict(os.environ)
    lib = ROOT / ".gpu" / "lib"
    if lib.is_dir():
        env["LD_LIBRARY_PATH"] = str(lib) + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    p = subprocess.Popen([str(kvcached), "--socket", sock, "--pool", pool,
                          "--pool-size", str(pool_bytes), "--page-size", str(page_bytes),
                          "--max-share", "100", "--hugepages", "off", "--log-level", "warning"],
                         stdout=log, stderr=subprocess.STDOUT, env=env)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if p.poll() is not None:
            raise RuntimeError(f"kvcached --pool {pool} exited {p.returncode}: "
                               f"{open(log.name).read()[-2000:]}")
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sock)
            return p, sock, d
        except OSError:
            time.sleep(0.05)
        finally:
            s.close()
    p.kill()
    raise RuntimeError(f"kvcached --pool {pool} did not start")


def stop_daemon(p, d) -> int:
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    shutil.rmtree(d, ignore_errors=True)
    return rc


def run_pool(args, pool: str, shape: dict, device, dtype, lengths: list, rows: list) -> bool:
    import torch
    from kvclient.vllm import KvcachedConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm_proc import Blocks, vllm_config

    gpu = device.type == "cuda"

    def sync():
        if gpu:
            torch.cuda.synchronize()

    L, bs, kvh, hd = shape["layers"], shape["block"], shape["kv_heads"], shape["head_dim"]
    esize = torch.tensor([], dtype=dtype).element_size()
    page = L * 2 * bs * kvh * hd * esize
    nmax = max(lengths)
    nb = -(-(nmax + 1) // bs)
    pool_bytes = max(2 * nb * page + (64 << 20), 64 << 20)
    pool_bytes = -(-pool_bytes // page) * page
    p, sock, tmp = start_daemon(Path(args.kvcached), pool, pool_bytes, page)
    ok = True
    try:
        model = Llama(shape, device, dtype)
        lm = SimpleNamespace(layers=L, heads=shape["heads"], kv_heads=kvh, head_dim=hd,
                             block_tokens=bs)
        cfg = vllm_config(lm, "ttft-llama-shape", sock, bs, bs, args.copy)
        cfg.model_config.dtype = dtype
        sched = KvcachedConnector(cfg, KVConnectorRole.SCHEDULER)
        worker = KvcachedConnector(cfg, KVConnectorRole.WORKER)
        # Two block ranges: the cold request's and the warm one's.
        cache = [torch.zeros((2, 2 * nb + 1, bs, kvh, hd), dtype=dtype, device=device)
                 for _ in range(L)]
        names = [f"model.layers.{i}.self_attn.attn" for i in range(L)]
        t0 = time.perf_counter()
        worker.register_kv_caches(dict(zip(names, cache)))
        reg = {"state": "n/a"}
        c = worker._rc.c
        if c is not None and c.pool_kind == "host":	# the registration, waited for
            while (reg := c.gpu_status())["state"] == "registering":
                time.sleep(0.01)
        t_reg = time.perf_counter() - t0
        hooks = Hooks(worker, cache, names)
        gen = torch.Generator().manual_seed(11)
        for n in lengths:
            prompt = torch.randint(shape["vocab"], (n,), generator=gen).to(device)
            nblk = -(-n // bs)
            cold_ids = list(range(nblk))
            warm_ids = list(range(2 * nb, 2 * nb - nblk, -1))
            cold_t = torch.tensor(cold_ids, device=device)
            warm_t = torch.tensor(warm_ids, device=device)

            def timed(fn):
                sync()
                t = time.perf_counter()
                out = fn()
                sync()
                return time.perf_counter() - t, out

            model.forward(prompt, 0, cache, cold_t)	# untimed: kernels, autotuning
            cold = min(timed(lambda: model.forward(prompt, 0, cache, cold_t))[0]
                       for _ in range(args.repeat))
            _, cold_logits = timed(lambda: model.forward(prompt, 0, cache, cold_t))
            ref = [x[:, :nblk].clone() for x in cache]

            def step(rid, ids, table):
                req = SimpleNamespace(request_id=rid, prompt_token_ids=prompt.tolist(),
                                      cache_salt=None, lora_request=None,
                                      num_computed_tokens=0)
                matched, _ = sched.get_num_new_matched_tokens(req, 0)
                sched.update_state_after_alloc(req, Blocks(ids), matched)
                out = SimpleNamespace(
                    scheduled_new_reqs=[SimpleNamespace(req_id=rid,
                                                        prompt_token_ids=req.prompt_token_ids,
                                                        block_ids=(list(ids),),
                                                        num_computed_tokens=matched)],
                    scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                                          num_computed_tokens=[],
                                                          resumed_req_ids=set()),
                    num_scheduled_tokens={rid: n - matched}, finished_req_ids=set())
                meta = sched.build_connector_meta(out)

                def run():
                    worker.bind_connector_metadata(meta)
                    worker.start_load_kv(SimpleNamespace())
                    logits = model.forward(prompt, matched, cache, table, hooks)
                    worker.wait_for_save()
                    worker.clear_connector_metadata()
                    return logits
                t, logits = timed(run)
                errors = worker.get_block_ids_with_load_errors()
                sched.request_finished(req, ids)
                return t, matched, logits, errors

            cold_save, m0, _, _ = step(f"cold-{n}", cold_ids, cold_t)
            warm, matched, warm_logits, errors = None, 0, None, set()
            for r in range(args.repeat + 1):	# the first one untimed
                for x in cache:	# the warm blocks hold nothing of this prompt
                    x[:, 2 * nb - nblk + 1:].zero_()
                t, matched, warm_logits, errors = step(f"warm-{n}-{r}", warm_ids, warm_t)
                if r:
                    warm = t if warm is None else min(warm, t)
            mb = matched // bs
            widx = torch.tensor(warm_ids[:mb], device=device)
            kv_equal = all(torch.equal(x[:, widx], y[:, :mb]) for x, y in zip(cache, ref))
            diff = (warm_logits - cold_logits).abs().max().item()
            scale = cold_logits.abs().max().item()
            close = diff <= (0.05 if dtype == torch.bfloat16 else 1e-3) * max(scale, 1.0)
            row = {"bench": "ttft-torch", "pool": pool, "copy": args.copy, "tokens": n,
                   "matched": matched,
                   "cold_ms": round(cold * 1e3, 3), "cold_save_ms": round(cold_save * 1e3, 3),
                   "warm_ms": round(warm * 1e3, 3), "warm_over_cold": round(warm / cold, 4),
                   "kv_equal": kv_equal, "logits_max_abs_diff": diff, "logits_close": close,
                   "load_errors": len(errors), "saved_before": m0,
                   "register_s": round(t_reg, 3), "registration": reg.get("state"),
                   "device": torch.cuda.get_device_name(device) if gpu else "cpu",
                   "dtype": str(dtype).replace("torch.", ""), "layers": L,
                   "hidden": shape["hidden"], "page_bytes": page}
            rows.append(row)
            ok &= kv_equal and close and not errors and matched == (n - 1) // bs * bs
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"{pool:4} {n:6} tokens: cold {row['cold_ms']:9.2f} ms, cold+save "
                      f"{row['cold_save_ms']:9.2f} ms, warm {row['warm_ms']:9.2f} ms "
                      f"({100 * row['warm_over_cold']:.1f}% of cold), matched {matched}, "
                      f"KV equal {kv_equal}, logits diff {diff:.3g}", flush=True)
        worker.shutdown()
        sched.shutdown()
    finally:
        rc = stop_daemon(p, tmp)
        if rc != 0:
            print(f"kvcached --pool {pool} exited {rc} at SIGTERM (want 0)", file=sys.stderr)
            ok = False
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", default="host,cuda", help="pools, comma-separated")
    ap.add_argument("--tokens", default="2048,8192,32768", help="prompt lengths")
    ap.add_argument("--repeat", type=int, default=2, help="timed runs of each kind (best)")
    ap.add_argument("--json", action="store_true", help="one JSON object per row")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny model on the CPU, host pool, short prompts: the checks")
    ap.add_argument("--kvcached", help="the daemon (default: next to the library)")
    ap.add_argument("--copy", default="auto", choices=("auto", "pages", "layers"),
                    help="the connector's copy option (kv_connector_extra_config)")
    args = ap.parse_args()
    _paths()
    args.kvcached = args.kvcached or str(_build_dir() / "kvcached")
    try:
        import torch
    except ImportError:
        print("ttft_torch: skipped: no PyTorch here")
        return 0
    if args.smoke:
        shape, device, dtype = SMOKE, torch.device("cpu"), torch.float32
        pools, lengths = ["host"], [int(x) for x in (args.tokens if args.tokens !=
                                                      ap.get_default("tokens") else "100,37")
                                    .split(",")]
        torch.manual_seed(0)
        torch.set_num_threads(1)
        args.repeat = 1
    else:
        if not torch.cuda.is_available():
            why = "no GPU: torch.cuda.is_available() is False"
            print(json.dumps({"bench": "ttft-torch", "skipped": why}) if args.json
                  else f"ttft_torch: skipped: {why}")
            return 0
        shape, device, dtype = LLAMA3_8B, torch.device("cuda", 0), torch.bfloat16
        pools = args.pool.split(",")
        lengths = [int(x) for x in args.tokens.split(",")]
    rows: list = []
    ok = True
    for pool in pools:
        ok &= run_pool(args, pool, shape, device, dtype, lengths, rows)
    if not args.json:
        print("ttft_torch:", "every check passed" if ok else "A CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
