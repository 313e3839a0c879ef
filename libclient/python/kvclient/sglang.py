# SPDX-License-Identifier: MIT
"""kvcached as an SGLang HiCache storage backend: ``KvcachedStorage``.

Selected with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name":"kvcached",
        "module_path":"kvclient.sglang","class_name":"KvcachedStorage",
        "interface_v1":1,"socket":"/run/kvcached/kvcached.sock"}'

``"interface_v1": 1`` makes HiCache call batch_get_v1/batch_set_v1 (pages
copied straight between its host pool and kvcached's); without it HiCache
goes through batch_get/batch_set with flat page copies, which work too.

HiCache's storage tier is a key-value store of pages: SGLang names each
page by a hash string (its own chain over the page's tokens and its
prefix) and never hands the backend the tokens. kvcached keeps these pages
in an engine-keyed namespace (``Model(keys="engine")``): a page is found by
SGLang's key, so a hit is only as exact as SGLang's hash, and such a
namespace never shares blocks with a token-keyed one (vLLM's, tinylm's).
One HiCache page is one kvcached block: ``--page-size`` must equal the
daemon's ``block-tokens``.

The copies go between the host KV pool SGLang registers and kvcached's
pages with kvclient's gather/scatter, page by page, no intermediate buffer:
supported host layouts are ``layer_first`` (each layer's K and V viewed as
[pages, page_size, heads, head_dim]) and ``page_first_direct`` (the same
with a block stride); ``page_first`` keeps a page's tokens apart per layer
and is refused.

Tensor parallelism: a kvcached page holds every KV head of the model, and
all ranks of every TP size share it: each rank moves its own heads (the
host pool's), the ranks write each page together. The model's KV heads
are the host pool's ``head_num`` times ``tp_size``, or the extra config's
``kv_heads`` (needed where heads are replicated: fewer than ranks).

MLA host pools (``MLATokenToKVPoolHost``: one latent vector of
kv_lora_rank + qk_rope_head_dim per token and layer; ``layer_first``
[layers, slots, 1, dim] or ``page_first_direct`` [pages, layers,
page_size, 1, dim]): one copy for every rank; rank 0 writes it, every
rank reads it.
Written against SGLang's documented ``HiCacheStorage`` (see
docs/ENGINES.md for the version followed); nothing here is SGLang code.

``"no_insert": true`` in the extra config makes the engine a reader: pages
kvcached holds are found and read, and no write stores anything (its
Client is no-insert, KVC_OPEN_NO_INSERT), so none of its KV stays on the
host. A tenant the daemon's config makes no-insert is treated the same.
"""
from __future__ import annotations

import logging
from typing import Any, List, Optional

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from .client import Client
from .model import Model
from .paged_kv import PagedKV
from ._engine import Reconnecting, flag, namespace_name, read_only
from .errors import KvcError, NoInsertError

log = logging.getLogger("kvclient.sglang")

__all__ = ["KvcachedStorage"]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


class KvcachedStorage(HiCacheStorage):
    """kvcached as HiCache's storage tier (see the module docstring).

    Built by SGLang's storage factory as ``KvcachedStorage(storage_config,
    kwargs)``; usable once ``register_mem_pool_host`` has given it the host
    pool (the geometry comes from there). Until then, and whenever kvcached
    is away, every key is a miss and every write is refused (False), never
    an exception."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None) -> None:
        self.config = storage_config
        extra = dict(storage_config.extra_config or {})
        self.socket = extra.get("socket")
        self.salt = extra.get("salt", b"")
        self.no_insert = flag(extra, "no_insert")
        self.name = extra.get("model_name") or storage_config.model_name or "sglang-model"
        cfg = storage_config
        # Every rank of every TP size shares the namespace and its pages
        # (an MLA model's ranks all read rank 0's latent).
        self.tp_rank, self.tp_size = cfg.tp_rank, cfg.tp_size
        self.mla = bool(cfg.is_mla_model)
        self.kv_heads = extra.get("kv_heads")
        # Older SGLang configs have no pipeline or context-parallel fields
        # (before pp_rank, pp_size, attn_cp_rank, attn_cp_size): one stage,
        # no context parallelism.
        self.pp_rank, self.pp_size = getattr(cfg, "pp_rank", 0), getattr(cfg, "pp_size", 1)
        cp_rank, cp_size = getattr(cfg, "attn_cp_rank", 0), getattr(cfg, "attn_cp_size", 1)
        # Context-parallel ranks hold disjoint parts of each page: apart.
        self.cp = (cp_rank, cp_size) if cp_size > 1 else None
        self._rc: Optional[Reconnecting] = None
        self._kv = None
        self.model: Optional[Model] = None
        self.page_size = 0

    # -------------------------------------------------------------- setup

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """The host KV pool HiCache moves pages through; its geometry makes
        the kvcached namespace."""
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        layout = getattr(pool, "layout", "layer_first")
        buf = getattr(pool, "kv_buffer", None)
        if layout not in ("layer_first", "page_first_direct"):
            raise ValueError(f"KvcachedStorage: host layout {layout!r} keeps a page's tokens "
                             "apart per layer; use --hicache-mem-layout layer_first or "
                             "page_first_direct")
        ps, layers = int(pool.page_size), int(pool.layer_num)
        self.page_size = ps
        if self.mla:
            return self._register_mla(pool, buf, layout, ps, layers)
        if buf is None or buf.dim() < 5 or buf.shape[0] != 2:
            raise ValueError("KvcachedStorage: not an MHA host pool's kv_buffer [2, layers, "
                             "slots, heads, head_dim] (an MLA pool needs is_mla_model)")
        heads, hd = int(pool.head_num), int(pool.head_dim)
        name = self._ns_name(pool)
        if layout == "layer_first":	# [2, layers, slots, heads, head_dim]
            pages = buf.shape[2] // ps
            ks = [buf[0, i].view(pages, ps, heads, hd) for i in range(layers)]
            vs = [buf[1, i].view(pages, ps, heads, hd) for i in range(layers)]
        else:				# [2, pages, layers, page_size, heads, head_dim]
            ks = [buf[0, :, i] for i in range(layers)]
            vs = [buf[1, :, i] for i in range(layers)]
        total = int(self.kv_heads or heads * max(self.tp_size, 1))
        model = Model(name, _dtype_name(pool.dtype), layers=layers, kv_heads=total,
                              head_dim=hd, block_tokens=ps, pos="rope", tp_rank=self.tp_rank,
                              tp_size=self.tp_size, pp_rank=self.pp_rank,
                              pp_size=self.pp_size, keys="engine")
        if model.heads[1] != heads:
            raise ValueError(f"KvcachedStorage: the host pool holds {heads} KV heads, rank "
                             f"{self.tp_rank} of {self.tp_size} of a model of {total} holds "
                             f"{model.heads[1]} (extra config kv_heads: the model's)")
        self._open(model, lambda c: PagedKV(c, ks, vs))

    def _register_mla(self, pool: Any, buf: Any, layout: Any, ps: Any, layers: Any) -> None:
        """An MLA host pool: one latent of kv_lora_rank + qk_rope_head_dim
        per token and layer, the same on every rank."""
        dim = int(getattr(pool, "kv_cache_dim", 0) or
                  int(pool.kv_lora_rank) + int(pool.qk_rope_head_dim))
        want = 4 if layout == "layer_first" else 5
        if buf is None or buf.dim() != want or buf.shape[-2:] != (1, dim):
            raise ValueError(f"KvcachedStorage: MLA host pool buffer of shape "
                             f"{None if buf is None else tuple(buf.shape)}: want "
                             + ("[layers, slots, 1, " if layout == "layer_first"
                                else "[pages, layers, page_size, 1, ") + f"{dim}]")
        if layout == "layer_first":	# [layers, slots, 1, dim]
            pages = buf.shape[1] // ps
            ks = [buf[i].view(pages, ps, dim) for i in range(layers)]
        else:				# [pages, layers, page_size, 1, dim]
            ks = [buf[:, i, :, 0] for i in range(layers)]
        model = Model(self._ns_name(pool), _dtype_name(pool.dtype), layers=layers,
                              kv_heads=1, head_dim=dim, block_tokens=ps, pos="rope",
                              tp_rank=self.tp_rank, tp_size=self.tp_size,
                              pp_rank=self.pp_rank, pp_size=self.pp_size, keys="engine",
                              mla=True)
        self._open(model, lambda c: PagedKV(c, ks, layout="mla"))

    def _ns_name(self, pool: Any) -> str:
        return namespace_name(self.name, _dtype_name(pool.dtype),
                              f" cp{self.cp[0]}/{self.cp[1]}" if self.cp else "")

    def _open(self, model: Any, paged: Any) -> None:
        self.model = model

        def opened(c: Any) -> None:
            self._kv = paged(c)
        self._rc = Reconnecting(model, self.socket, self.salt, opened, "KvcachedStorage",
                                logger=log, no_insert=self.no_insert)
        self._rc.get()

    def _client(self) -> Optional[Client]:
        return self._rc.get() if self._rc is not None else None

    def close(self) -> None:
        """Close the Client (SGLang's HiCache calls this when it detaches
        the backend); every key is a miss and every write False afterwards."""
        rc, self._rc = self._rc, None
        self._kv = None
        if rc is not None:
            rc.close()

    def _pages(self, host_indices: Any, n: int) -> list:
        """Host pool pages of the first token slot of each of n pages."""
        idx = host_indices[::self.page_size][:n]
        return (idx // self.page_size).tolist()

    def _failed(self, c: Any, call: str, e: KvcError) -> None:
        """A call failed: drop the Client if the daemon went, else log."""
        rc = self._rc
        if not c.connected() and rc is not None:
            rc.drop(str(e))
        else:
            log.warning("KvcachedStorage: %s: %s", call, e)

    # --------------------------------------------------- zero-copy batch

    def _looked_up(self, keys: List[str], call: str, body: Any, restore: bool) -> int:
        """body(request, hits) on a request of keys after its lookup (and,
        with restore, after the pages that wait on the daemon's spill or
        remote tier came back): the number of leading pages it returns, or 0
        when kvcached is away or the call failed (logged; the Client
        dropped if the daemon went)."""
        c = self._client()
        if c is None or not keys:
            return 0
        try:
            with c.request_keys(keys) as r:
                hits = r.lookup()
                if restore and (r.spilled or r.remote):
                    try:
                        hits = r.restore()
                    except KvcError as e:	# the tiers failed: the hits stand
                        if not c.connected():
                            raise
                        log.warning("KvcachedStorage: %s: restore: %s", call, e)
                return body(r, hits)
        except KvcError as e:
            self._failed(c, call, e)
            return 0

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many of keys, from the first, kvcached holds (pages on its
        spill or remote tier are brought back into its pool to find out)."""
        return self._looked_up(keys, "batch_exists", lambda r, hits: hits, True)

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        """Copy the leading cached pages of keys into the host pool pages
        host_indices names (page_size slots per key); True for each copied."""
        def get(r: Any, hits: int) -> int:
            if hits:
                r.gather(self._kv, self._pages(host_indices, hits))
            return hits
        done = self._looked_up(keys, "batch_get_v1", get, True)
        return [True] * done + [False] * (len(keys) - done)

    def _alloc(self, r: Any) -> int:
        """Pages for the request's misses, or 0 for a reader (no_insert,
        or a tenant the daemon makes no-insert, found out here once)."""
        if self.no_insert:
            return 0
        try:
            return r.alloc()
        except NoInsertError as e:
            read_only("KvcachedStorage", e, log)
            self.no_insert = True
            return 0

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        """Store the host pool pages of keys: those kvcached holds already
        are left as they are, the rest copied into new pages and published.
        True for each page that kvcached holds afterwards (a full pool
        stores a leading part)."""
        n = len(keys)

        def put(r: Any, hits: int) -> int:
            if hits >= n:
                return hits
            got = self._alloc(r)
            if got:
                r.scatter(self._kv, self._pages(host_indices, n)[hits:hits + got])
                r.publish()
            return hits + got
        done = self._looked_up(keys, "batch_set_v1", put, False)
        return [True] * done + [False] * (n - done)

    # --------------------------------- flat pages (without interface_v1)

    # Without "interface_v1" in the extra config SGLang's HiCache moves a
    # page at a time through its host pool's flat pages: batch_get(keys,
    # [get_dummy_flat_data_page() per key]) then set_from_flat_data_page
    # for each leading page returned; batch_set(keys, [get_data_page(i)]).
    # A flat page is [2, layers, page_size, heads, head_dim] of the pool's
    # dtype (this rank's heads); kvcached's is [layers, 2, ..., every head]
    # (_flat). For MLA both are [layers, page_size, (1,) dim]. One copy each
    # way, one kvcached request per batch.

    def _flat(self, page: Any) -> Any:
        """A kvcached page as SGLang's flat page of this rank: [2, layers,
        page_size, its heads, head_dim]; for MLA [layers, page_size, 1,
        dim], the page itself."""
        if self.mla:
            return page.unsqueeze(2)
        assert self.model is not None	# registered before any copy
        h0, hn = self.model.heads
        return page[:, :, :, h0:h0 + hn].transpose(0, 1)

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> list:
        """SGLang's flat page of each of keys, into target_locations[i] when
        given, else a new CPU tensor; None from the first key not cached on
        (host pool only: pages are read through their views)."""
        out: list = [None] * len(keys)

        def get(r: Any, hits: int) -> int:
            for i in range(hits):
                page = self._flat(r.page_tensor(i))	# [2, layers, ...]
                t = target_locations[i] if target_locations is not None else None
                if t is not None:
                    t.view(page.shape).copy_(page)
                    out[i] = t
                else:
                    out[i] = page.contiguous().flatten()
            return hits
        self._looked_up(keys, "batch_get", get, True)
        return out

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Store SGLang's flat pages values under keys (pages cached already
        are left as they are); True when kvcached holds all of them."""
        if values is None or not keys:
            return False
        n, vals = len(keys), values

        def put(r: Any, hits: int) -> int:
            if hits >= n:
                return hits
            got = self._alloc(r)
            for i in range(hits, hits + got):
                page = self._flat(r.page_tensor(i))	# this rank's heads
                page.copy_(vals[i].view(page.shape))
            return r.publish() if got else hits
        return self._looked_up(keys, "batch_set", put, False) == n

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Any:
        """The flat page of key (see batch_get), or None."""
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def set(self, key: str, value: Optional[Any] = None,
            target_location: Optional[Any] = None, target_sizes: Optional[Any] = None) -> bool:
        """Store the flat page value under key (see batch_set)."""
        return value is not None and self.batch_set([key], [value])

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1
