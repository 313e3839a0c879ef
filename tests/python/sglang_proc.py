#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One SGLang engine process of test_engines.py, driving kvclient.sglang's
KvcachedStorage the way SGLang's HiCache does with a storage backend, with
a host KV pool in HiCache's layer_first layout ([2, layers, slots, heads,
head_dim], page_size slots a page).

The call sequence, as SGLang's HiCacheController and its storage backend
factory make it (read at the commits docs/ENGINES.md names): the "dynamic"
backend is built as class(storage_config, kwargs) from the extra config's
module_path and class_name; register_mem_pool_host(pool); then one of two
paths, chosen by the extra config's "interface_v1":

  true   a backup of pages that reached host memory is batch_set_v1(keys,
         host_indices); a prefetch is batch_exists(keys) (the leading
         hits), then batch_get_v1(keys[:hits], host_indices) into newly
         allocated host slots;
  false  (absent) the same, but a backup is batch_set(keys, [the pool's
         get_data_page(first slot of each page)]) and a prefetch
         batch_get(keys[:hits], [the pool's get_dummy_flat_data_page() per
         key]), each leading page returned then written into the host pool
         with set_from_flat_data_page(first slot, page).

On detach, close(). Keys are SGLang's page hashes: SHA-256 over the
previous page's hash (its bytes) and the page's tokens (4 bytes each,
little-endian), as hex strings.

  set: fill pages of the host pool with KV and back them up.
  get: another host pool and slots: the leading-hit count (stopping at a
       missing key), the pages prefetched, their bytes equal to set's.

--extra-config is the JSON of SGLang's --hicache-storage-backend-extra-config
(the socket is added); each mode prints which path ran.

With --mla the host pool is SGLang's MLATokenToKVPoolHost (layer_first:
[layers, slots, 1, kv_lora_rank + qk_rope_head_dim]) of a model served at
TP --tp: set backs the pages up from rank 0 (rank 0 writes an MLA latent)
and then prefetches them as rank 1 into another host pool of the same
process (two ranks of one engine reading one copy); get runs as rank
--rank.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

LAYERS, HEADS, HEAD_DIM, PAGE = 2, 2, 16, 16
LORA, ROPE = 32, 16	# MLA: kv_lora_rank, qk_rope_head_dim


def page_keys(tokens: list, page: int) -> list:
    keys, prev = [], None
    for i in range(0, len(tokens) - len(tokens) % page, page):
        h = hashlib.sha256()
        if prev:
            h.update(bytes.fromhex(prev))
        for t in tokens[i:i + page]:
            h.update(t.to_bytes(4, "little"))
        prev = h.hexdigest()
        keys.append(prev)
    return keys


class HostPool:
    """SGLang's MHATokenToKVPoolHost in the layer_first layout, as much as
    HiCache and a storage backend use: the buffer, its geometry and the
    flat page copies of the path without interface_v1."""

    layout = "layer_first"

    def __init__(self, slots: int):
        self.page_size, self.layer_num, self.head_num, self.head_dim = PAGE, LAYERS, HEADS, HEAD_DIM
        self.dtype, self.size = torch.float16, slots
        self.kv_buffer = torch.zeros(2, LAYERS, slots, HEADS, HEAD_DIM, dtype=torch.float16)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self.kv_buffer[:, :, index:index + PAGE]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(2, LAYERS, PAGE, HEADS, HEAD_DIM, dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, page: torch.Tensor) -> None:
        self.kv_buffer[:, :, index:index + PAGE] = page.reshape(2, LAYERS, PAGE, HEADS, HEAD_DIM)


class MLAHostPool:
    """SGLang's MLATokenToKVPoolHost in the layer_first layout ([layers,
    slots, 1, kv_lora_rank + qk_rope_head_dim]), as much as HiCache and a
    storage backend use."""

    layout = "layer_first"

    def __init__(self, slots: int):
        self.page_size, self.layer_num = PAGE, LAYERS
        self.kv_lora_rank, self.qk_rope_head_dim = LORA, ROPE
        self.dtype, self.size = torch.bfloat16, slots
        self.kv_buffer = torch.zeros(LAYERS, slots, 1, LORA + ROPE, dtype=self.dtype)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self.kv_buffer[:, index:index + PAGE]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(LAYERS, PAGE, 1, LORA + ROPE, dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, page: torch.Tensor) -> None:
        self.kv_buffer[:, index:index + PAGE] = page.reshape(LAYERS, PAGE, 1, LORA + ROPE)


def page_latent(i: int) -> torch.Tensor:
    """Page i's latent: [layers, page, 1, lora + rope], from a seed."""
    g = torch.Generator().manual_seed(2000 + i)
    return torch.randn(LAYERS, PAGE, 1, LORA + ROPE, generator=g).to(torch.bfloat16)


class Controller:
    """HiCacheController's storage side: the backend built by the factory's
    "dynamic" rule and the page get/set path chosen by interface_v1."""

    def __init__(self, cfg: HiCacheStorageConfig, pool: HostPool):
        extra = cfg.extra_config
        cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
        assert issubclass(cls, HiCacheStorage)
        self.backend = cls(cfg, {})
        self.backend.register_mem_pool_host(pool)
        self.pool, self.v1 = pool, bool(extra.get("interface_v1", 0))
        self.path = "v1" if self.v1 else "flat pages"

    def page_set(self, keys: list, host_indices: torch.Tensor) -> int:
        """Back pages up; how many are stored (all or none, as HiCache counts)."""
        if self.v1:
            return len(keys) if all(self.backend.batch_set_v1(keys, host_indices)) else 0
        data = [self.pool.get_data_page(int(host_indices[i * PAGE])) for i in range(len(keys))]
        return len(keys) if self.backend.batch_set(keys, data) else 0

    def page_get(self, keys: list, host_indices: torch.Tensor) -> int:
        """Prefetch pages; how many leading ones arrived."""
        if self.v1:
            ok = self.backend.batch_get_v1(keys, host_indices)
            return ok.index(False) if False in ok else len(ok)
        got = self.backend.batch_get(keys, [self.pool.get_dummy_flat_data_page()
                                            for _ in keys])
        n = 0
        for i, page in enumerate(got or []):
            if page is None:
                break
            self.pool.set_from_flat_data_page(int(host_indices[i * PAGE]), page)
            n += 1
        return n


def page_kv(i: int) -> torch.Tensor:
    """Page i's KV: [2, layers, page, heads, head_dim], from a seed."""
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(2, LAYERS, PAGE, HEADS, HEAD_DIM, generator=g).to(torch.float16)


def run_mla(args, keys, extra) -> int:
    """The MLA host pool: the ranks of an engine reading one copy."""
    def cfg(rank):
        return HiCacheStorageConfig(tp_rank=rank, tp_size=args.tp, pp_rank=0, pp_size=1,
                                    attn_cp_rank=0, attn_cp_size=1, is_mla_model=True,
                                    enable_storage_metrics=False, is_page_first_layout=False,
                                    model_name="tiny-sglang-mla", extra_config=extra)

    def slots_of(pages):
        return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])

    def loaded(pool, pages):
        return all(torch.equal(pool.kv_buffer[:, p * PAGE:(p + 1) * PAGE], page_latent(i))
                   for i, p in enumerate(pages))
    if args.mode == "set":
        pool = MLAHostPool(args.pages * PAGE * 2)
        pages = list(range(args.pages))[::-1]
        for i, p in enumerate(pages):
            pool.kv_buffer[:, p * PAGE:(p + 1) * PAGE] = page_latent(i)
        r0 = Controller(cfg(0), pool)
        ok = r0.page_set(keys, slots_of(pages))
        # Rank 1 of the same engine writes nothing and reads the copy rank
        # 0 wrote into a pool of its own.
        pool1 = MLAHostPool(args.pages * PAGE * 2)
        r1 = Controller(cfg(1), pool1)
        other = [2 * i + 1 for i in range(args.pages)]
        got = r1.page_get(keys, slots_of(other))
        r0.backend.close()
        r1.backend.close()
        print(f"set ({r0.path}): stored {ok} of {len(keys)}, rank 1 loaded {got}, "
              f"bytes equal {loaded(pool1, other)}")
        return 0 if ok == got == len(keys) and loaded(pool1, other) else 1
    pool = MLAHostPool(args.pages * PAGE * 4)
    ctl = Controller(cfg(args.rank), pool)
    store = ctl.backend
    hits = store.batch_exists(keys)
    pages = [3 * i + 5 for i in range(args.pages)]
    got = ctl.page_get(keys[:hits], slots_of(pages))
    flat = store.get(keys[1])
    flat_equal = flat is not None and torch.equal(flat.view(LAYERS, PAGE, 1, LORA + ROPE),
                                                  page_latent(1))
    store.close()
    print(f"get ({ctl.path}): exists {hits}, loaded {got}, bytes equal "
          f"{loaded(pool, pages[:hits])}, get() equal {flat_equal}")
    return 0 if hits == got == len(keys) and loaded(pool, pages) and flat_equal else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("set", "get"))
    ap.add_argument("--socket", required=True)
    ap.add_argument("--pages", type=int, default=6)
    ap.add_argument("--extra-config", default='{"backend_name":"kvcached",'
                    '"module_path":"kvclient.sglang","class_name":"KvcachedStorage",'
                    '"interface_v1":1}')
    ap.add_argument("--no-insert", action="store_true",
                    help="the backend's no_insert option: read, never store")
    ap.add_argument("--mla", action="store_true", help="an MLA host pool")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    args = ap.parse_args()

    tokens = list(range(7, 7 + args.pages * PAGE))
    keys = page_keys(tokens, PAGE)
    extra = {**json.loads(args.extra_config), "socket": args.socket}
    if args.no_insert:
        extra["no_insert"] = "true"
    if args.mla:
        return run_mla(args, keys, extra)
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                               is_page_first_layout=False, model_name="tinyllama-sglang",
                               extra_config=extra)
    if args.mode == "set":
        pool = HostPool(args.pages * PAGE * 2)
        pages = list(range(args.pages))[::-1]	# host pages, any order
        for i, p in enumerate(pages):
            pool.kv_buffer[:, :, p * PAGE:(p + 1) * PAGE] = page_kv(i)
        ctl = Controller(cfg, pool)
        slots = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])
        ok = ctl.page_set(keys, slots)
        again = ctl.page_set(keys, slots)	# all held already
        ctl.backend.close()
        print(f"set ({ctl.path}): stored {ok} of {len(keys)}, again {again}")
        if args.no_insert:
            return 0 if ok == again == 0 else 1
        return 0 if ok == again == len(keys) else 1
    pool = HostPool(args.pages * PAGE * 4)
    ctl = Controller(cfg, pool)
    store = ctl.backend
    hits = store.batch_exists(keys)
    gap = store.batch_exists(keys[:3] + ["0" * 64] + keys[4:])
    pages = [3 * i + 5 for i in range(args.pages)]	# other host pages
    slots = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])
    got = ctl.page_get(keys[:hits], slots)
    equal = all(torch.equal(pool.kv_buffer[:, :, p * PAGE:(p + 1) * PAGE], page_kv(i))
                for i, p in enumerate(pages[:hits]))
    flat = store.get(keys[1])
    flat_equal = flat is not None and torch.equal(flat.view(2, LAYERS, PAGE, HEADS, HEAD_DIM),
                                                  page_kv(1))
    missing = store.exists("0" * 64)
    store.close()
    print(f"get ({ctl.path}): exists {hits} with a gap at 3: {gap}, loaded {got}, "
          f"bytes equal {equal}, get() equal {flat_equal}, exists(missing) {missing}")
    return 0 if equal and flat_equal else 1


if __name__ == "__main__":
    sys.exit(main())
