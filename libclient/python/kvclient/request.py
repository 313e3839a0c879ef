# SPDX-License-Identifier: MIT
"""Request: one prompt's blocks through kvc_lookup, kvc_restore, kvc_alloc,
kvc_publish and kvc_req_free, its stage kept in Python so that a call out
of order or after release raises before reaching C.
"""
from __future__ import annotations

import ctypes
import errno as _errno
from ctypes import byref, c_char, c_void_p
from typing import TYPE_CHECKING, Any

from . import _buffers as _b
from . import _lib as _L
from .errors import (ForkedHandleError, InvalidArgumentError, NoPageError, NotSupportedError,
                     RequestReleasedError, RequestStateError, TensorError)
from ._ccall import (_ALLOCATED, _I64, _LOOKED_UP, _NEW, _PUBLISHED, _RELEASED, _error,
                     _event_of, _fork_gen, _u)
from .paged_kv import PagedKV

if TYPE_CHECKING:
    from .client import Client


def _label(req: "Request", r: Any, label: str, label_b: bytes) -> None:
    """kvc_req_label for a request just made; releases it on failure."""
    rc = _L.lib().req_label(r, label_b)
    if rc < 0:
        req.release()
        raise _error(rc, "kvc_req_label", what=f"label {label!r}")


def _keys_list(arr: Any, n: int) -> list[int]:
    raw = bytes(arr)[:16 * n]
    return [int.from_bytes(raw[i:i + 16], "little") for i in range(0, 16 * n, 16)]


class Request:
    """One prompt's blocks (struct kvc_req), from Client.request().

    Use it as a context manager (or call release()): on exit its pins are
    released and pages granted but not published go back to the daemon.
    The order of calls is C's: lookup(), then restore() if ``spilled``,
    then alloc(), then publish(); gather() after lookup, scatter() after
    alloc. Out of order raises RequestStateError; any call after release
    raises RequestReleasedError.
    """

    __slots__ = ("_c", "_r", "_key", "_stage", "hits", "granted", "__weakref__")

    def __init__(self, client: Client, r: c_void_p) -> None:
        self._c = client
        # With the C fast path (client._fast) requests are plain ints.
        self._r = r.value if client._fast else r
        self._key = r.value
        self._stage = _NEW
        #: leading blocks that are cached and pinned (after lookup/restore/publish)
        self.hits = 0
        #: blocks alloc() granted pages for, from block ``hits`` on
        self.granted = 0
        client._live.add(self._key)

    # -------------------------------------------------------------- life

    def release(self) -> None:
        """Unpin every page and give back granted pages never published
        (kvc_req_free). Harmless when released. Page views obtained from this
        request must not be used afterwards."""
        self.__exit__(None, None, None)

    def __enter__(self) -> "Request":
        return self

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass

    def __repr__(self) -> str:
        stage = ("new", "looked up", "allocated", "published", "released")[self._stage]
        return f"<kvclient.Request {self.blocks} blocks, {stage}, hits={self.hits}>"

    def _req(self, call: str) -> Any:
        """The C request, if this request may still be used."""
        if self._stage == _RELEASED or self._c._h is None:
            raise RequestReleasedError(_errno.EINVAL, f"{call}: the request was released")
        return self._r

    def _stage_error(self, call: str, need: str) -> RequestStateError:
        if self._stage == _RELEASED or self._c._h is None:
            return RequestReleasedError(_errno.EINVAL, f"{call}: the request was released")
        stage = ("new", "looked up", "allocated", "published")[self._stage]
        return RequestStateError(_errno.EINVAL, f"{call}: {need} (the request is {stage})")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # release(); the body is here because this runs once per prompt.
        stage = self._stage
        if stage == _RELEASED:
            return
        self._stage = _RELEASED
        c = self._c
        if c._h is not None:
            c._live.discard(self._key)
            if stage == _ALLOCATED and self.granted:
                c._free_wait(self._r)
            else:
                c._free_nowait(self._r)

    # -------------------------------------------------------------- info

    @property
    def blocks(self) -> int:
        """Full blocks in the prompt (a trailing partial block is not cached)."""
        return _L.lib().req_blocks(self._req("blocks"))

    @property
    def spilled(self) -> int:
        """Blocks right after the hits that wait in the daemon's spill tier
        (after lookup, before alloc); restore() brings them back."""
        return _L.lib().req_spilled(self._req("spilled"))

    @property
    def remote(self) -> int:
        """Blocks after the hits and the spilled run that may be in the
        daemon's remote tier (after lookup, before alloc); restore() asks
        for them in the same round trip."""
        return _L.lib().req_remote(self._req("remote"))

    @property
    def inflight(self) -> int:
        """Blocks right after the hits that another client is writing now
        (after lookup, before alloc): wait() for them, or alloc() and
        prefill them yourself."""
        return _L.lib().req_inflight(self._req("inflight"))

    def keys(self) -> list[int]:
        """The request's key chain, one 128-bit int per full block."""
        r = self._req("keys")
        L = _L.lib()
        n = L.req_blocks(r)
        out = (_L.Key * max(n, 1))()
        rc = L.req_keys(r, out, n)
        if rc < 0:
            raise _error(rc, "kvc_req_keys")
        return _keys_list(out, rc)

    # ----------------------------------------------------------- lookup

    def lookup(self) -> int:
        """Find and pin the longest cached prefix (kvc_lookup): no system
        call. Returns the number of leading blocks hit (also ``hits``)."""
        if self._stage != _NEW or self._c._h is None:
            raise self._stage_error("lookup", "call it once, first")
        rc = self._c._lookup(self._r)
        if rc < 0:
            raise _error(rc, "kvc_lookup")
        self._stage = _LOOKED_UP
        self.hits = rc
        return rc

    def wait(self, timeout_ms: int) -> int:
        """Single flight (kvc_wait): sleep until the blocks another client
        is writing (``inflight``) are published, their writer gives them up
        or dies, or ``timeout_ms`` pass; pin what was published as hits.
        Returns the new number of leading hits (also ``hits``); at once when
        nothing is in flight. The GIL is released while it sleeps. The
        request's first wait sets its deadline: later waits of the same
        request end by then, so the loop below ends however often a writer
        gives its blocks up and announces them again. A daemon that dies
        meanwhile raises ConnectionLostError within about a tick. After a
        wait with a timeout that did not run out, alloc() may raise
        InFlightError (another client took the next block meanwhile): wait()
        again, then alloc()::

            hits = req.lookup()
            while True:
                hits = req.wait(timeout_ms)
                try:
                    got = req.alloc()
                    break
                except kvclient.InFlightError:
                    continue
        """
        if self._stage != _LOOKED_UP or self._c._h is None:
            raise self._stage_error("wait", "call it after lookup() and before alloc()")
        if not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise InvalidArgumentError(_errno.EINVAL,
                                       f"wait({timeout_ms!r}): the timeout must be an int >= 0")
        rc = _L.lib().wait(self._r, timeout_ms)
        if rc < 0:
            raise _error(rc, "kvc_wait")
        self.hits = rc
        return rc

    def restore(self) -> int:
        """Bring the spilled run back from the daemon's spill tier (one round
        trip that waits for the disk reads) and pin it; returns the new
        number of leading hits (also ``hits``)."""
        if self._stage != _LOOKED_UP or self._c._h is None:
            raise self._stage_error("restore", "call it after lookup() and before alloc()")
        rc = _L.lib().restore(self._r)
        if rc < 0:
            raise _error(rc, "kvc_restore")
        self.hits = rc
        return rc

    def restore_pays(self, prefill_tokens_per_s: float) -> bool:
        """Whether restoring the spilled run should take less time than
        prefilling its tokens at this engine's prefill speed (tokens/s)."""
        r = self._req("restore_pays")
        rc = _L.lib().restore_pays(r, float(prefill_tokens_per_s))
        if rc < 0:
            raise _error(rc, "kvc_restore_pays",
                         what=f"restore_pays({prefill_tokens_per_s!r}): the speed must be > 0")
        return bool(rc)

    def pin(self, ttl_s: int) -> int:
        """Keep this request's prefix resident for ``ttl_s`` seconds (1..30
        days; kvc_pin): the daemon holds its blocks that are cached now and
        each further one as it is published, so that no eviction takes
        them until the time is up. For an engine's system prompt. Counted
        against this Client's tenant's share. Returns the pin's id (for
        Client.unpin and kvstat --pins); pinning the same prefix again
        keeps it and lasts until the later end. Raises QuotaError (the
        tenant holds its share), NoSpaceError (64 pins already),
        InvalidArgumentError."""
        r = self._req("pin")
        ttl = _u("ttl_s", ttl_s, 1, 30 * 86400)
        rc = _L.lib().pin(r, ttl)
        if rc < 0:
            raise _error(rc, "kvc_pin", self._message(), f"pin({ttl_s!r})")
        return rc

    def _message(self) -> str | None:
        """The daemon's (or the library's) reason for the last refusal
        (kvc_req_message), or None."""
        m = _L.lib().req_message(self._r)
        return m.decode("utf-8", "replace") if m else None

    # ------------------------------------------------------------ write

    def alloc(self) -> int:
        """Ask for pages for every block after the hits, in one round trip.
        Returns how many were granted (also ``granted``), for blocks
        ``hits .. hits + granted - 1``; fewer than asked when the pool is
        full of pinned pages or this Client's pin slots run out."""
        if self._stage != _LOOKED_UP or self._c._h is None:
            raise self._stage_error("alloc", "call it once, after lookup() and before publish()")
        rc = _L.lib().alloc(self._r)
        if rc < 0:	# InFlightError leaves it looked up: wait() again
            raise _error(rc, "kvc_alloc", self._message())
        self._stage = _ALLOCATED
        self.granted = rc
        return rc

    def publish(self) -> int:
        """Publish every granted block, in one round trip; returns how many
        blocks of the request are now cached and pinned (hits included)."""
        if self._stage != _ALLOCATED or self._c._h is None:
            raise self._stage_error("publish", "call it once, after alloc()")
        if not self.granted:
            raise RequestStateError(_errno.EINVAL,
                                    "publish: alloc() granted no pages: nothing to publish")
        rc = _L.lib().publish(self._r)
        if rc < 0:
            raise _error(rc, "kvc_publish", self._message())
        self._stage = _PUBLISHED
        self.hits = rc
        self.granted = 0
        return rc

    # ----------------------------------------------------- page views

    def _page(self, i: int, call: str) -> tuple[Any, bool]:
        r = self._req(call)
        c = self._c
        if _fork_gen[0] != c._fork:
            raise ForkedHandleError(_errno.ECHILD, f"{call}: this Client was opened by "
                                    "another process; open a new kvclient.Client here")
        if c.pool_kind != "host":
            raise NotSupportedError(_errno.ENOTSUP, f"{call}: the pool is in GPU memory: "
                                    "use gather()/scatter() to move pages")
        n = _L.lib().req_blocks(r)
        if not 0 <= i < n:
            raise IndexError(f"{call}: block {i} of a request of {n} blocks")
        addr = _L.lib().block(r, i)
        if not addr:
            raise NoPageError(_errno.ENOENT, f"{call}: block {i} has no page (not a hit, "
                              "not granted)")
        buf = (c_char * c.page_bytes).from_address(addr)
        writable = self._stage == _ALLOCATED and self.hits <= i < self.hits + self.granted
        return buf, writable

    def page(self, i: int) -> memoryview:
        """Block i's page in the pool, without a copy: a memoryview of
        ``page_bytes`` bytes, laid out [layers][K|V][token][kv_head][head_dim]
        (every head of the model; a tensor-parallel rank's are
        ``model.heads``), or [layers][token][head_dim] for MLA.
        Writable for a block alloc() granted (before publish), read-only for
        a hit. Valid until the request is released."""
        buf, writable = self._page(i, "page")
        mv = memoryview(buf).cast("B")
        return mv if writable else mv.toreadonly()

    def page_array(self, i: int) -> Any:
        """Block i's page as a numpy array view ``model.page_shape`` ([layers,
        2, block_tokens, kv_heads, head_dim], or [layers, block_tokens,
        head_dim] for MLA) of the model's dtype (raw unsigned ints of its
        width for dtypes numpy lacks, such as bfloat16). Read-only for a hit."""
        import numpy
        buf, writable = self._page(i, "page_array")
        m = self._c.model
        mv = memoryview(buf) if writable else memoryview(buf).toreadonly()
        return numpy.frombuffer(mv, dtype=_b.numpy_dtype(m.dtype, m.dtype_bytes)).reshape(
            m.page_shape)

    def page_tensor(self, i: int) -> Any:
        """Block i's page as a CPU torch tensor view ``model.page_shape`` of
        the model's dtype. torch has no read-only tensors: a hit's page is
        shared with every client and must not be written (nor, by a
        tensor-parallel rank, another rank's heads of a granted page)."""
        import torch
        buf, _ = self._page(i, "page_tensor")
        m = self._c.model
        return torch.frombuffer(buf, dtype=_b.torch_dtype(m.dtype, m.dtype_bytes)).view(
            m.page_shape)

    def page_index(self, i: int) -> int:
        """Pool page number of block i (kvc_block_page)."""
        rc = _L.lib().block_page(self._req("page_index"), i)
        if rc < 0:
            raise _error(int(rc), "kvc_block_page", what=f"page_index({i})")
        return rc

    # --------------------------------------------------- gather/scatter

    def gather(self, kv: "PagedKV", block_ids: Any, first: int = 0, stream: Any = None, *,
               first_layer: int = 0, layers: int | None = None, event: Any = None,
               layer_events: Any = None) -> None:
        """Copy the KV of blocks ``first .. first + len(block_ids) - 1``
        (hits) from their pool pages into the engine's cache ``kv``, block
        ``first + j`` into engine block ``block_ids[j]``, all layers, K and V,
        in one C call. CPU tensors on a host pool: done on return. GPU
        tensors (a cuda pool, or a host pool registered with CUDA): queued
        on ``stream`` (default: torch's current stream of their GPU);
        synchronize it before release().

        ``first_layer`` and ``layers`` (None: to the last) copy a range of
        layers only. GPU copies: ``event`` (a torch.cuda.Event or a
        cudaEvent_t) is recorded on the stream after the copy;
        ``layer_events`` (one per layer copied) splits the copy into one
        launch per layer, each event recorded after its layer."""
        if self._stage == _NEW:
            raise self._stage_error("gather", "call it after lookup()")
        self._copy("kvc_gather", kv, block_ids, first, stream, first_layer, layers, event,
                   layer_events)

    def scatter(self, kv: "PagedKV", block_ids: Any, first: int | None = None,
                stream: Any = None, *, first_layer: int = 0, layers: int | None = None,
                event: Any = None, layer_events: Any = None) -> None:
        """The other way: engine blocks ``block_ids[j]`` into the pages alloc()
        granted for blocks ``first + j`` (``first`` defaults to ``hits``, the
        first granted block), before publish(). GPU copies: synchronize the
        stream (or the event) before publish(). The layer and event options
        are gather's."""
        if self._stage in (_NEW, _LOOKED_UP, _PUBLISHED):
            raise self._stage_error("scatter", "call it after alloc() and before publish()")
        self._copy("kvc_scatter", kv, block_ids, self.hits if first is None else first,
                   stream, first_layer, layers, event, layer_events)

    def _copy(self, call: str, kv: "PagedKV", block_ids: Any, first: int, stream: Any,
              first_layer: int = 0, layers: int | None = None, event: Any = None,
              layer_events: Any = None) -> None:
        r = self._req(call[4:])
        c = self._c
        if type(kv) is not PagedKV:
            raise TypeError(f"{call[4:]}: kv must be a kvclient.PagedKV")
        if kv._geom != c._geom or kv._pool != (c.pool_kind, c.pool_device):
            raise TensorError(_errno.EINVAL, f"{call[4:]}: this PagedKV was checked against "
                              "another model or pool than this request's Client")
        conv = _I64.get(type(block_ids))
        addr, n, keep = conv(block_ids) if conv else _b.i64(block_ids)
        nb = _L.lib().req_blocks(r)
        if first < 0 or first + n > nb:
            raise TensorError(_errno.EINVAL, f"{call[4:]}: blocks {first}..{first + n - 1} "
                              f"are outside the request's {nb} blocks")
        s = c._stream(stream, kv) if stream is not None or kv.device is not None else None
        if not first_layer and layers is None and event is None and layer_events is None:
            rc = getattr(_L._lib, call[4:])(r, first, n, kv._layout, addr, s)
        else:
            rc = self._copy_v2(call, kv, r, first, n, addr, s, first_layer, layers, event,
                               layer_events)
        if rc < 0:
            what = None
            if rc == -_errno.EINVAL:
                what = (f"{call[4:]}: refused before any copy: an engine block id outside "
                        f"0..{kv.num_blocks - 1}")
            raise _error(rc, call, what=what)

    def _copy_v2(self, call: str, kv: PagedKV, r: Any, first: int, n: int, addr: int | None,
                 s: int | None, first_layer: int, layers: int | None, event: Any,
                 layer_events: Any) -> int:
        L = kv.layers
        fl = _u("first_layer", first_layer, 0, L - 1)
        nl = L - fl if layers is None else _u("layers", layers, 1, L - fl)
        o = _L.CopyOpts()
        o.size = ctypes.sizeof(o)
        o.first_layer = fl
        o.layers = nl
        o.stream = s
        o.event = _event_of(event, s) if kv.device is not None else None
        if layer_events is not None and kv.device is not None:
            evs = [_event_of(e, s) for e in layer_events]
            if len(evs) != nl:
                raise ValueError(f"{call[4:]}: {len(evs)} layer events for {nl} layers")
            o.layer_events = (c_void_p * nl)(*evs)
        return getattr(_L._lib, call[4:] + "_v2")(r, first, n, kv._layout, addr, byref(o))
