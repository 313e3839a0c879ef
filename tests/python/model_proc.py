#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The two processes of test_model.py, each its own Python interpreter with
the example engine (libclient/python/examples/engine_loop.py):

  publish: prefill a prompt cold, scatter its blocks from the engine's paged
           cache into kvcached and publish them; save the logits.
  check:   with another block table, for every cached prefix length k of
           0..n: a prompt sharing the first k blocks, looked up (k hits),
           hits gathered, the rest prefilled; its logits must equal a cold
           prefill's bit for bit, and for k = n the publisher's too.
"""
from __future__ import annotations

import argparse
import sys

import torch

import kvclient
from engine_loop import Engine, TinyLlama


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("publish", "check"))
    ap.add_argument("--socket", required=True)
    ap.add_argument("--ref", required=True, help="the publisher's logits file")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--tail", type=int, default=5, help="tokens of a last partial block")
    args = ap.parse_args()
    torch.set_num_threads(1)

    lm = TinyLlama(seed=7)
    bt, n = lm.block_tokens, args.blocks
    g = torch.Generator().manual_seed(8)
    prompt = torch.randint(lm.vocab, (n * bt + args.tail,), generator=g)
    nb = n + 2
    with kvclient.Client(lm.kv_model("tinyllama-two-procs"), socket=args.socket) as c:
        if args.mode == "publish":
            engine = Engine(lm, c, num_blocks=nb)
            logits, hits, table = engine.prefill(prompt)
            torch.save(logits, args.ref)
            print(f"publish: hits {hits}, table {table.tolist()}, "
                  f"published {c.stats()['client']['published']}")
            return 0 if hits == 0 else 1
        ref = torch.load(args.ref)
        # Another block table than the publisher's, and a cold engine.
        warm = Engine(lm, c, num_blocks=2 * nb, block_order=list(range(2 * nb))[::-1][:nb])
        cold = Engine(lm, c, num_blocks=nb, block_order=[(3 * i + 1) % nb for i in range(nb)])
        ok = True
        for k in range(n + 1):
            other = torch.randint(lm.vocab, (len(prompt) - k * bt,), generator=g)
            if k < n and other[0] == prompt[k * bt]:
                other[0] = (other[0] + 1) % lm.vocab	# block k must differ
            q = torch.cat((prompt[:k * bt], other)) if k < n else prompt
            logits, hits, table = warm.prefill(q)
            full = cold.forward(q, 0, cold.block_table(len(q)))
            equal = hits == k and torch.equal(logits, full[k * bt:])
            print(f"k={k} hits={hits} prefilled={len(logits)} equal={equal}")
            ok = ok and equal
            if k == n:
                same = torch.equal(full, ref)
                print(f"cold prefill equals the publisher's: {same}")
                ok = ok and same
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
