#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The tour of docs/PYTHON.md, runnable: attach, look a prompt up, fill and
publish its missed blocks, look it up again; then describe a paged KV cache
in both layouts kvclient takes. A small float32 model so that it fits the
page size of a test daemon; a real engine declares its own geometry.

The tour needs only the standard library, like kvclient itself; the
paged caches are numpy arrays (torch tensors work the same), and that
part is skipped, saying so, where numpy is missing.

    KVCLIENT_LIB=build/libkvclient.so PYTHONPATH=libclient/python \\
        python3 libclient/python/examples/tour.py   # uses $KVCACHED_SOCKET
"""
import array

import kvclient

prompt_ids = array.array("I", range(100, 180))    # 80 tokens: 5 full blocks

# quote: tour
model = kvclient.Model("tour-tiny@main/fp32", "float32", layers=2, kv_heads=2,
                       head_dim=16, block_tokens=16, pos="rope")
with kvclient.Client(model) as c:                 # $KVCACHED_SOCKET or the default
    for attempt in (1, 2):
        with c.request(prompt_ids) as r:          # keys the full blocks
            hits = r.lookup()                     # blocks 0..hits-1, pinned
            got = r.alloc() if hits < r.blocks else 0   # pages for the rest
            for i in range(hits, hits + got):
                page = r.page(i).cast("f")        # its KV, in place (zero-copy)
                page[:] = array.array("f", [float(i)]) * len(page)
            if got:
                r.publish()                       # one round trip
            print(f"attempt {attempt}: {hits} of {r.blocks} blocks cached")
# end quote

# Paged caches of 8 blocks, in the two layouts (section "PagedKV").
try:
    import numpy
except ImportError:
    print("PagedKV: skipped (it takes numpy arrays or torch tensors; neither is here)")
    raise SystemExit(0)
shape = (8, model.block_tokens, 2, 16)
kv_caches = [numpy.zeros((2,) + shape, numpy.float32) for _ in range(2)]
k_caches = [numpy.zeros(shape, numpy.float32) for _ in range(2)]
v_caches = [numpy.zeros(shape, numpy.float32) for _ in range(2)]
with kvclient.Client(model) as c:
    # quote: paged
    kv = kvclient.PagedKV(c, kv_caches)          # vLLM FlashAttention: per layer
                                                 # [2, num_blocks, block_tokens, kv_heads, head_dim]
    kv = kvclient.PagedKV(c, k_caches, v_caches) # per layer K and V:
                                                 # [num_blocks, block_tokens, kv_heads, head_dim]
    # end quote
    with c.request(prompt_ids) as r:
        hits = r.lookup()
        r.gather(kv, list(range(hits)))
    print(f"gathered {hits} blocks: block 3 holds {k_caches[0][3].flatten()[0].item()}")
