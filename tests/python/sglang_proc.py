#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One SGLang engine process of test_engines.py, driving kvclient.sglang's
KvcachedStorage the way SGLang's HiCache does with a storage backend, with
a host KV pool in HiCache's layer_first layout ([2, layers, slots, heads,
head_dim], page_size slots a page).

The call sequence, as SGLang documents it (HiCacheStorage's docstrings,
its storage backend factory and the HiCache design document): the
"dynamic" backend is built as class(storage_config, kwargs) from the
extra config's module_path and class_name; register_mem_pool_host(pool);
a backup of pages that reached host memory is batch_set_v1(keys,
host_indices); a prefetch is batch_exists(keys) (the leading hits), then
batch_get_v1(keys[:hits], host_indices) into newly allocated host slots.
Keys are SGLang's page hashes: a chain of SHA-256 over each page's tokens
and the previous page's hash, as hex strings.

  set: fill pages of the host pool with KV and back them up.
  get: another host pool and slots: the leading-hit count (stopping at a
       missing key), the pages prefetched, their bytes equal to set's.

With --mla the host pool is SGLang's MLATokenToKVPoolHost (layer_first:
[layers, slots, 1, kv_lora_rank + qk_rope_head_dim]) of a model served at
TP --tp: set backs the pages up from rank 0 (rank 0 writes an MLA
latent) and then prefetches them as rank 1 into another host pool of the
same process (the two ranks read one copy); get runs as rank --rank.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from types import SimpleNamespace

import torch

from kvclient.sglang import KvcachedStorage
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

LAYERS, HEADS, HEAD_DIM, PAGE = 2, 2, 16, 16
LORA, ROPE = 32, 16	# MLA: kv_lora_rank, qk_rope_head_dim


def page_keys(tokens: list, page: int) -> list:
    keys, prev = [], b""
    for i in range(0, len(tokens) - len(tokens) % page, page):
        h = hashlib.sha256(prev + str(tokens[i:i + page]).encode()).hexdigest()
        keys.append(h)
        prev = h.encode()
    return keys


def host_pool(slots: int):
    """SGLang's MHATokenToKVPoolHost, as much as a storage backend reads."""
    return SimpleNamespace(layout="layer_first", page_size=PAGE, layer_num=LAYERS,
                           head_num=HEADS, head_dim=HEAD_DIM, dtype=torch.float16, size=slots,
                           kv_buffer=torch.zeros(2, LAYERS, slots, HEADS, HEAD_DIM,
                                                 dtype=torch.float16))


def page_kv(i: int) -> torch.Tensor:
    """Page i's KV: [2, layers, page, heads, head_dim], from a seed."""
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(2, LAYERS, PAGE, HEADS, HEAD_DIM, generator=g).to(torch.float16)


def mla_pool(slots: int):
    """SGLang's MLATokenToKVPoolHost (layer_first), as much as a storage
    backend reads."""
    return SimpleNamespace(layout="layer_first", page_size=PAGE, layer_num=LAYERS,
                           dtype=torch.bfloat16, size=slots, kv_lora_rank=LORA,
                           qk_rope_head_dim=ROPE,
                           kv_buffer=torch.zeros(LAYERS, slots, 1, LORA + ROPE,
                                                 dtype=torch.bfloat16))


def page_latent(i: int) -> torch.Tensor:
    """Page i's latent: [layers, page, 1, lora + rope], from a seed."""
    g = torch.Generator().manual_seed(2000 + i)
    return torch.randn(LAYERS, PAGE, 1, LORA + ROPE, generator=g).to(torch.bfloat16)


def storage_config(sock: str, mla: bool = False, tp: int = 1, rank: int = 0):
    return HiCacheStorageConfig(tp_rank=rank, tp_size=tp, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                                is_page_first_layout=False,
                                model_name="tiny-sglang-mla" if mla else "tinyllama-sglang",
                                extra_config={"backend_name": "kvcached",
                                              "module_path": "kvclient.sglang",
                                              "class_name": "KvcachedStorage", "socket": sock})


def run_mla(args, keys) -> int:
    """The MLA host pool, ranks of one engine reading one copy."""
    def slots_of(pages):
        return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])

    def loaded(pool, pages):
        return all(torch.equal(pool.kv_buffer[:, p * PAGE:(p + 1) * PAGE], page_latent(i))
                   for i, p in enumerate(pages))
    if args.mode == "set":
        r0 = KvcachedStorage(storage_config(args.socket, True, args.tp, 0), {})
        pool = mla_pool(args.pages * PAGE * 2)
        pages = list(range(args.pages))[::-1]
        for i, p in enumerate(pages):
            pool.kv_buffer[:, p * PAGE:(p + 1) * PAGE] = page_latent(i)
        r0.register_mem_pool_host(pool)
        ok = r0.batch_set_v1(keys, slots_of(pages))
        # Rank 1 of the same engine: it writes nothing, and reads the copy
        # rank 0 wrote into a pool of its own.
        r1 = KvcachedStorage(storage_config(args.socket, True, args.tp, 1), {})
        pool1 = mla_pool(args.pages * PAGE * 2)
        r1.register_mem_pool_host(pool1)
        other = [2 * i + 1 for i in range(args.pages)]
        got = r1.batch_get_v1(keys, slots_of(other))
        print(f"set: stored {sum(ok)} of {len(keys)}, rank 1 loaded {sum(got)}, "
              f"bytes equal {loaded(pool1, other)}")
        return 0 if all(ok) and all(got) and loaded(pool1, other) else 1
    st = KvcachedStorage(storage_config(args.socket, True, args.tp, args.rank), {})
    pool = mla_pool(args.pages * PAGE * 4)
    st.register_mem_pool_host(pool)
    hits = st.batch_exists(keys)
    pages = [3 * i + 5 for i in range(args.pages)]
    got = st.batch_get_v1(keys[:hits], slots_of(pages))
    flat = st.get(keys[1])
    flat_equal = flat is not None and torch.equal(flat.view(LAYERS, PAGE, 1, LORA + ROPE),
                                                  page_latent(1))
    print(f"get: exists {hits}, loaded {sum(got)}, bytes equal {loaded(pool, pages[:hits])}, "
          f"get() equal {flat_equal}")
    return 0 if hits == len(keys) and loaded(pool, pages) and flat_equal else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("set", "get"))
    ap.add_argument("--socket", required=True)
    ap.add_argument("--pages", type=int, default=6)
    ap.add_argument("--mla", action="store_true", help="an MLA host pool")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    args = ap.parse_args()

    tokens = list(range(7, 7 + args.pages * PAGE))
    keys = page_keys(tokens, PAGE)
    if args.mla:
        return run_mla(args, keys)
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                               is_page_first_layout=False, model_name="tinyllama-sglang",
                               extra_config={"backend_name": "kvcached",
                                             "module_path": "kvclient.sglang",
                                             "class_name": "KvcachedStorage",
                                             "socket": args.socket})
    store = KvcachedStorage(cfg, {})
    if args.mode == "set":
        pool = host_pool(args.pages * PAGE * 2)
        pages = list(range(args.pages))[::-1]	# host pages, any order
        for i, p in enumerate(pages):
            pool.kv_buffer[:, :, p * PAGE:(p + 1) * PAGE] = page_kv(i)
        store.register_mem_pool_host(pool)
        slots = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])
        ok = store.batch_set_v1(keys, slots)
        again = store.batch_set_v1(keys, slots)	# all held already
        print(f"set: stored {sum(ok)} of {len(keys)}, again {sum(again)}")
        return 0 if all(ok) and all(again) else 1
    pool = host_pool(args.pages * PAGE * 4)
    store.register_mem_pool_host(pool)
    hits = store.batch_exists(keys)
    gap = store.batch_exists(keys[:3] + ["0" * 64] + keys[4:])
    pages = [3 * i + 5 for i in range(args.pages)]	# other host pages
    slots = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])
    got = store.batch_get_v1(keys[:hits], slots)
    equal = all(torch.equal(pool.kv_buffer[:, :, p * PAGE:(p + 1) * PAGE], page_kv(i))
                for i, p in enumerate(pages[:hits]))
    flat = store.get(keys[1])
    flat_equal = flat is not None and torch.equal(flat.view(2, LAYERS, PAGE, HEADS, HEAD_DIM),
                                                  page_kv(1))
    print(f"get: exists {hits} with a gap at 3: {gap}, loaded {sum(got)}, bytes equal {equal}, "
          f"get() equal {flat_equal}, exists(missing) {store.exists('0' * 64)}")
    return 0 if equal and flat_equal else 1


if __name__ == "__main__":
    sys.exit(main())
