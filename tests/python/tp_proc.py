#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A tensor-parallel vLLM engine of test_engines.py: --tp N rank processes
(this one is rank 0 and the scheduler; it forks the others before any of
them attaches), each with its own KvcachedConnector worker, its own
kvclient Client (its shard) and a paged KV cache holding only its heads,
as vLLM's workers do. A forward pass runs on every rank: each computes its
query heads' attention from its own KV heads and the ranks all-reduce the
output projection (through pipes to rank 0), the rest of the layer is
replicated. Every rank gets the scheduler's connector metadata each step,
as vLLM broadcasts the scheduler's output to its workers.

The model is small and float32. Two kinds:

  gqa  8 query heads, 4 KV heads (--kv-heads) of 16, RoPE: vLLM's
       FlashAttention layout [2, num_blocks, block_size, this rank's KV
       heads, 16] per layer.
  mla  4 query heads over a latent of 32 (kv_lora_rank) + 16 rope dims
       per token and layer (vLLM's MLA cache [num_blocks, block_size, 48]
       per layer, the same on every rank): keys are the latent
       up-projected per head plus the shared rope part, values the latent
       up-projected per head.

Each head's projections are separate matmuls and the all-reduce sums the
heads' contributions in head order, so a head's K and V and the logits
are the same bit for bit at every TP size: a prompt published at TP 2
loads at TP 1 or 4, and the logits equal a cold prefill's (computed here
by rank 0 alone at TP 1).

  prefill: a cold prefill; the connectors save the prompt's blocks.
  load:    another block table; prints the matched tokens and whether the
           logits of the tokens computed here equal a cold prefill's.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import sys
from types import SimpleNamespace

import torch

from kvclient.vllm import KvcachedConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm_proc import Blocks

BT = 16


class TinyTP:
    """The model's weights, one matrix per head (seeded)."""

    def __init__(self, mla: bool, kv_heads: int, seed: int = 11, layers: int = 2,
                 heads: int = 8, head_dim: int = 16, vocab: int = 256):
        g = torch.Generator().manual_seed(seed)
        self.mla, self.layers, self.vocab = mla, layers, vocab
        self.heads = 4 if mla else heads
        self.kv_heads = 1 if mla else kv_heads
        self.head_dim = head_dim
        self.latent, self.rope = 32, 16
        d = self.d = 64

        def w(rows, cols):
            return torch.randn(rows, cols, generator=g) / math.sqrt(rows)

        self.embed = torch.randn(vocab, d, generator=g)
        self.w = []
        for _ in range(layers):
            lw = dict(up=w(d, 4 * d), down=w(4 * d, d),
                      o=[w(head_dim, d) for _ in range(self.heads)])
            if mla:
                lw.update(dkv=w(d, self.latent), kr=w(d, self.rope),
                          qn=[w(d, head_dim) for _ in range(self.heads)],
                          qr=[w(d, self.rope) for _ in range(self.heads)],
                          uk=[w(self.latent, head_dim) for _ in range(self.heads)],
                          uv=[w(self.latent, head_dim) for _ in range(self.heads)])
            else:
                lw.update(q=[w(d, head_dim) for _ in range(self.heads)],
                          k=[w(d, head_dim) for _ in range(self.kv_heads)],
                          v=[w(d, head_dim) for _ in range(self.kv_heads)])
            self.w.append(lw)
        self.lm_head = w(d, vocab)
        rd = self.rope if mla else head_dim
        inv = 1.0 / (10000.0 ** (torch.arange(0, rd, 2).float() / rd))
        ang = torch.outer(torch.arange(4096).float(), inv)
        self.cos, self.sin = ang.cos(), ang.sin()

    @property
    def cache_dim(self) -> int:
        return self.latent + self.rope


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _rope(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Rank:
    """One rank: its heads, its KV cache, its share of the forward pass."""

    def __init__(self, lm: TinyTP, tp: int, rank: int, num_blocks: int, allreduce):
        self.lm, self.tp, self.rank = lm, tp, rank
        q_per = lm.heads // tp
        self.qheads = list(range(rank * q_per, (rank + 1) * q_per))
        if lm.mla:
            self.kvheads = [0]
            shape = (num_blocks, BT, lm.cache_dim)
        else:
            group = lm.heads // lm.kv_heads	# query heads per KV head
            self.kvheads = sorted({q // group for q in self.qheads})
            shape = (2, num_blocks, BT, len(self.kvheads), lm.head_dim)
        self.cache = [torch.zeros(shape) for _ in range(lm.layers)]
        self.allreduce = allreduce

    def forward(self, tokens: torch.Tensor, start: int, table: torch.Tensor) -> torch.Tensor:
        """Logits of tokens[start:] (chunks of one block from a block
        start), writing this rank's KV through `table`; the tokens before
        `start` must be cached already."""
        lm = self.lm
        out = []
        for c0 in range(start, len(tokens), BT):
            c1 = min(c0 + BT, len(tokens))
            blk, n = c0 // BT, c1 - c0
            x = lm.embed[tokens[c0:c1]]
            cos, sin = lm.cos[c0:c1], lm.sin[c0:c1]
            mask = torch.arange(c1)[None, :] > torch.arange(c0, c1)[:, None]
            for layer, w in enumerate(lm.w):
                h = _rms(x)
                contrib = self._attend(layer, w, h, blk, n, c1, cos, sin, mask, table)
                x = x + self.allreduce(contrib)
                x = x + torch.nn.functional.silu(_rms(x) @ w["up"]) @ w["down"]
            out.append(_rms(x) @ lm.lm_head)
        return torch.cat(out) if out else torch.empty(0, lm.vocab)

    def _attend(self, layer, w, h, blk, n, c1, cos, sin, mask, table):
        """{query head: its output projection} for this rank's heads."""
        lm, cache = self.lm, self.cache[layer]
        contrib = {}
        if lm.mla:
            lat = torch.cat((h @ w["dkv"], _rope((h @ w["kr"])[:, None, :], cos[:, None, :],
                                                 sin[:, None, :])[:, 0]), dim=-1)
            cache[table[blk], :n] = lat
            allat = cache[table[:blk + 1]].flatten(0, 1)[:c1]
            c, kr = allat[:, :lm.latent], allat[:, lm.latent:]
            for q in self.qheads:
                qn = h @ w["qn"][q]
                qr = _rope((h @ w["qr"][q])[:, None, :], cos[:, None, :], sin[:, None, :])[:, 0]
                s = (qn @ (c @ w["uk"][q]).T + qr @ kr.T) / math.sqrt(lm.head_dim + lm.rope)
                p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
                contrib[q] = (p @ (c @ w["uv"][q])) @ w["o"][q]
            return contrib
        group = lm.heads // lm.kv_heads
        for i, g in enumerate(self.kvheads):
            k = _rope((h @ w["k"][g])[:, None, :], cos[:, None, :], sin[:, None, :])[:, 0]
            cache[0, table[blk], :n, i] = k
            cache[1, table[blk], :n, i] = h @ w["v"][g]
        for q in self.qheads:
            i = self.kvheads.index(q // group)
            keys = cache[0, table[:blk + 1], :, i].flatten(0, 1)[:c1]
            vals = cache[1, table[:blk + 1], :, i].flatten(0, 1)[:c1]
            qq = _rope((h @ w["q"][q])[:, None, :], cos[:, None, :], sin[:, None, :])[:, 0]
            s = (qq @ keys.T) / math.sqrt(lm.head_dim)
            p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
            contrib[q] = (p @ vals) @ w["o"][q]
        return contrib


def head_order_sum(parts: list) -> torch.Tensor:
    """The all-reduce: every head's contribution, summed in head order."""
    heads = {}
    for p in parts:
        heads.update(p)
    total = None
    for q in sorted(heads):
        total = heads[q] if total is None else total + heads[q]
    return total


class ModelConfig:
    """vLLM's ModelConfig, as much as the connector reads."""

    def __init__(self, lm: TinyTP, name: str):
        self.model, self.dtype, self.revision = name, torch.float32, None
        self.use_mla = lm.mla
        self._lm = lm

    def get_num_layers(self, pc) -> int:
        return self._lm.layers

    def get_num_kv_heads(self, pc) -> int:
        return 1 if self._lm.mla else max(1, self._lm.kv_heads // pc.tensor_parallel_size)

    def get_total_num_kv_heads(self) -> int:
        return self._lm.kv_heads

    def get_head_size(self) -> int:
        return self._lm.cache_dim if self._lm.mla else self._lm.head_dim


def vllm_config(lm, name, sock, tp, rank):
    return SimpleNamespace(
        model_config=ModelConfig(lm, name),
        cache_config=SimpleNamespace(block_size=BT, cache_dtype="auto"),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1,
                                        rank=rank),
        kv_transfer_config=SimpleNamespace(
            kv_connector="KvcachedConnector", kv_connector_module_path="kvclient.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"socket": sock, "block_tokens": BT}))


def worker_step(worker, r: Rank, meta, prompt, start, table):
    """One step on a rank, in vLLM's worker order."""
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(SimpleNamespace())
    for i in range(r.lm.layers):
        worker.wait_for_layer_load(f"model.layers.{i}.self_attn.attn")
    logits = r.forward(prompt, start, table)
    for i in range(r.lm.layers):
        worker.save_kv_layer(f"model.layers.{i}.self_attn.attn", r.cache[i], None)
    worker.wait_for_save()
    errors = worker.get_block_ids_with_load_errors()
    worker.clear_connector_metadata()
    return logits, errors


def other_rank(conn, args, rank: int) -> None:
    """Ranks 1..tp-1: attach, then serve steps from rank 0 until told to stop."""
    torch.set_num_threads(1)
    lm = TinyTP(args.model == "mla", args.kv_heads)

    def allreduce(contrib):
        conn.send(contrib)
        return conn.recv()
    worker = KvcachedConnector(vllm_config(lm, args.name, args.socket, args.tp, rank),
                               KVConnectorRole.WORKER)
    r = Rank(lm, args.tp, rank, args.num_blocks, allreduce)
    worker.register_kv_caches({f"model.layers.{i}.self_attn.attn": t
                               for i, t in enumerate(r.cache)})
    conn.send(("ready", rank))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        meta, prompt, start, table = msg
        _, errors = worker_step(worker, r, meta, prompt, start, table)
        conn.send(("done", len(errors)))
    worker.shutdown()
    conn.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("prefill", "load"))
    ap.add_argument("--socket", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--model", choices=("gqa", "mla"), default="gqa")
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=5, help="prompt length in blocks")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    args.name = args.name or f"tiny-tp-{args.model}"
    args.num_blocks = 2 * (args.blocks + 2)
    torch.set_num_threads(1)

    # The other ranks first, before this process attaches anything.
    ctx = mp.get_context("fork")
    conns, procs = [], []
    for rank in range(1, args.tp):
        a, b = ctx.Pipe()
        p = ctx.Process(target=other_rank, args=(b, args, rank), daemon=True)
        p.start()
        conns.append(a)
        procs.append(p)
    for c in conns:
        assert c.recv()[0] == "ready"

    lm = TinyTP(args.model == "mla", args.kv_heads)

    def allreduce(contrib):
        parts = [contrib] + [c.recv() for c in conns]
        total = head_order_sum(parts)
        for c in conns:
            c.send(total)
        return total
    cfg = vllm_config(lm, args.name, args.socket, args.tp, 0)
    sched = KvcachedConnector(cfg, KVConnectorRole.SCHEDULER)
    worker = KvcachedConnector(cfg, KVConnectorRole.WORKER)
    r0 = Rank(lm, args.tp, 0, args.num_blocks, allreduce)
    worker.register_kv_caches({f"model.layers.{i}.self_attn.attn": t
                               for i, t in enumerate(r0.cache)})

    g = torch.Generator().manual_seed(21)
    prompt = torch.randint(lm.vocab, (args.blocks * BT + 5,), generator=g)
    nb = args.blocks + 1
    order = list(range(nb)) if args.mode == "prefill" else list(range(args.num_blocks))[::-1]
    ids = order[:nb]
    req = SimpleNamespace(request_id="req-0", prompt_token_ids=prompt.tolist(),
                          cache_salt=None, lora_request=None, num_computed_tokens=0)
    matched, _ = sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, Blocks(ids), matched)
    out = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="req-0", prompt_token_ids=req.prompt_token_ids,
                                            block_ids=(list(ids),), num_computed_tokens=matched)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                              num_computed_tokens=[], resumed_req_ids=set()),
        num_scheduled_tokens={"req-0": len(prompt) - matched}, finished_req_ids=set())
    meta = sched.build_connector_meta(out)
    table = torch.tensor(ids, dtype=torch.int64)
    for c in conns:	# vLLM broadcasts the scheduler's output to its workers
        c.send((meta, prompt, matched, table))
    logits, errors = worker_step(worker, r0, meta, prompt, matched, table)
    n_err = len(errors) + sum(c.recv()[1] for c in conns)
    sched.request_finished(req, ids)
    for c in conns:
        c.send(None)
    for p in procs:
        p.join(60)
    worker.shutdown()
    sched.shutdown()

    # A cold prefill: rank 0 alone, every head, no kvcached.
    cold = Rank(lm, 1, 0, args.num_blocks, lambda x: head_order_sum([x]))
    full = cold.forward(prompt, 0, torch.arange(nb, dtype=torch.int64))
    equal = torch.equal(logits, full[matched:])
    print(f"tp{args.tp} {args.model} {args.mode}: matched {matched} errors {n_err} "
          f"computed from {matched} equal {equal}")
    return 0 if equal and all(p.exitcode == 0 for p in procs) else 1


if __name__ == "__main__":
    sys.exit(main())
