#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A paged-attention engine loop over kvcached, in PyTorch.

A small Llama-shaped model (RMSNorm, grouped-query attention with RoPE, a
SiLU MLP; float32, random weights from a seed) keeps its KV cache the way
vLLM does with FlashAttention: one tensor per layer of [2, num_blocks,
block_tokens, kv_heads, head_dim], K then V, and a block table per
request mapping the prompt's blocks to blocks of that cache. Its prefill:

    lookup -> gather the hits -> prefill the misses -> scatter -> publish

The forward pass runs in chunks of one block and attends through the
block table, so a prompt whose first blocks came from kvcached computes
the rest with exactly the operations, shapes and inputs of a cold
prefill: the logits are equal bit for bit.

Run it against a kvcached (the socket from --socket or $KVCACHED_SOCKET):

    KVCLIENT_LIB=build/libkvclient.so PYTHONPATH=libclient/python \\
        python3 libclient/python/examples/engine_loop.py --socket /tmp/kvcached.sock
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

import kvclient


class TinyLlama:
    """The model: weights only; Engine runs it."""

    def __init__(self, seed: int = 0, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                 head_dim: int = 16, vocab: int = 256, block_tokens: int = 16,
                 max_pos: int = 4096):
        g = torch.Generator().manual_seed(seed)
        d = heads * head_dim

        def w(rows, cols):
            return torch.randn(rows, cols, generator=g) / math.sqrt(rows)

        self.layers, self.heads, self.kv_heads = layers, heads, kv_heads
        self.head_dim, self.vocab, self.block_tokens = head_dim, vocab, block_tokens
        self.embed = torch.randn(vocab, d, generator=g)
        self.w = [dict(q=w(d, heads * head_dim), k=w(d, kv_heads * head_dim),
                       v=w(d, kv_heads * head_dim), o=w(heads * head_dim, d),
                       up=w(d, 4 * d), down=w(4 * d, d)) for _ in range(layers)]
        self.lm_head = w(d, vocab)
        inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        ang = torch.outer(torch.arange(max_pos).float(), inv)
        self.cos, self.sin = ang.cos(), ang.sin()

    def kv_model(self, name: str) -> kvclient.Model:
        """This model's namespace in kvcached."""
        return kvclient.Model(name, "float32", layers=self.layers, kv_heads=self.kv_heads,
                              head_dim=self.head_dim, block_tokens=self.block_tokens,
                              pos="rope")


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _rope(x, cos, sin):
    # x: [tokens, heads, head_dim]; rotate pairs (even, odd) by position.
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Engine:
    """The model, its paged KV cache, and a kvcached client."""

    def __init__(self, lm: TinyLlama, client: kvclient.Client, num_blocks: int = 64,
                 block_order: list[int] | None = None):
        self.lm, self.client = lm, client
        shape = (2, num_blocks, lm.block_tokens, lm.kv_heads, lm.head_dim)
        self.cache = [torch.zeros(shape) for _ in range(lm.layers)]
        # Checked once: shapes, dtype, strides, device. Every gather and
        # scatter then passes it as it is.
        self.kv = kvclient.PagedKV(client, self.cache)
        self.blocks = list(block_order) if block_order else list(range(num_blocks))

    def block_table(self, n_tokens: int) -> torch.Tensor:
        """Engine blocks for a prompt (this toy engine runs one at a time)."""
        n = -(-n_tokens // self.lm.block_tokens)
        return torch.tensor(self.blocks[:n], dtype=torch.int64)

    def forward(self, tokens: torch.Tensor, start: int, table: torch.Tensor) -> torch.Tensor:
        """Logits of tokens[start:], whose K and V are written into the cache
        through `table`; tokens before `start` must be in the cache already.
        Runs in chunks of one block, from a block boundary."""
        lm, bt = self.lm, self.lm.block_tokens
        out = []
        for c0 in range(start, len(tokens), bt):
            c1 = min(c0 + bt, len(tokens))
            blk = c0 // bt
            x = lm.embed[tokens[c0:c1]]
            cos, sin = lm.cos[c0:c1], lm.sin[c0:c1]
            mask = torch.arange(c1)[None, :] > torch.arange(c0, c1)[:, None]
            for layer, w in enumerate(lm.w):
                h = _rms(x)
                q = _rope((h @ w["q"]).view(c1 - c0, lm.heads, lm.head_dim), cos, sin)
                k = _rope((h @ w["k"]).view(c1 - c0, lm.kv_heads, lm.head_dim), cos, sin)
                v = (h @ w["v"]).view(c1 - c0, lm.kv_heads, lm.head_dim)
                cache = self.cache[layer]
                cache[0, table[blk], :c1 - c0] = k
                cache[1, table[blk], :c1 - c0] = v
                # This chunk attends to every token so far, through the table.
                keys = cache[0, table[:blk + 1]].flatten(0, 1)[:c1]
                vals = cache[1, table[:blk + 1]].flatten(0, 1)[:c1]
                group = lm.heads // lm.kv_heads
                keys = keys.repeat_interleave(group, dim=1)
                vals = vals.repeat_interleave(group, dim=1)
                s = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(lm.head_dim)
                p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
                a = torch.einsum("hqk,khd->qhd", p, vals).flatten(1)
                x = x + a @ w["o"]
                x = x + torch.nn.functional.silu(_rms(x) @ w["up"]) @ w["down"]
            out.append(_rms(x) @ lm.lm_head)
        return torch.cat(out) if out else torch.empty(0, lm.vocab)

    # quote: prefill
    def prefill(self, prompt: torch.Tensor, publish: bool = True):
        """Prefill one prompt through kvcached: returns (logits of the tokens
        computed here, blocks that came from the cache, the block table)."""
        bt = self.lm.block_tokens
        table = self.block_table(len(prompt))
        with self.client.request(prompt) as req:
            hits = req.lookup()                  # pinned, no system call
            if req.spilled and req.restore_pays(prefill_tokens_per_s=2000.0):
                hits = req.restore()             # NVMe is faster than recomputing
            req.gather(self.kv, table[:hits])    # pool pages -> our cache
            logits = self.forward(prompt, hits * bt, table)
            if publish and hits < req.blocks:
                got = req.alloc()                # pages for blocks hits..hits+got-1
                if got:
                    req.scatter(self.kv, table[hits:hits + got])
                    req.publish()                # now every client can hit them
        return logits, hits, table               # pins released on exit
    # end quote


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", help="kvcached's socket (default: $KVCACHED_SOCKET)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)    # one reduction order, so warm == cold bit for bit

    lm = TinyLlama(seed=args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    system = torch.randint(lm.vocab, (3 * lm.block_tokens,), generator=g)
    questions = [torch.randint(lm.vocab, (21,), generator=g) for _ in range(2)]

    with kvclient.Client(lm.kv_model(f"tinyllama-seed{args.seed}"), socket=args.socket) as c:
        engine = Engine(lm, c)
        for i, q in enumerate(questions):
            prompt = torch.cat((system, q))
            logits, hits, table = engine.prefill(prompt)
            # The check an engine would not make: a cold prefill, same logits?
            cold = engine.forward(prompt, 0, table)[hits * lm.block_tokens:]
            same = torch.equal(logits, cold)
            print(f"request {i}: {len(prompt)} tokens, {hits} of {len(prompt) // lm.block_tokens}"
                  f" blocks from kvcached, {len(logits)} tokens prefilled, logits equal to a cold"
                  f" prefill: {same}")
            if not same:
                return 1
        s = c.stats()["client"]
        print(f"this client: {s['lookups']} lookups, {s['hit_blocks']} blocks hit, "
              f"{s['published']} published")
    return 0


if __name__ == "__main__":
    sys.exit(main())
