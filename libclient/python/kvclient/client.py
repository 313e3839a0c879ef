# SPDX-License-Identifier: MIT
"""Client: an attachment to kvcached (kvc_open), and the calls made on it.
Model (model.py), Request (request.py) and PagedKV (paged_kv.py) are the
rest of kvclient.h's contract in Python.

One request's life, as in C (kvclient.h)::

    with kvclient.Client(model) as c:
        with c.request(tokens) as r:       # kvc_req_new
            hits = r.lookup()              # pinned blocks 0..hits-1
            r.gather(kv, table[:hits])     # hit pages -> engine cache
            ...prefill the rest...
            got = r.alloc()                # pages for hits..hits+got-1
            r.scatter(kv, table[hits:hits + got])
            r.publish()
                                           # kvc_req_free on exit

Threads: a Client may be shared by threads; one Request is used by one
thread at a time (as in C). Calls that can wait release the GIL (see
``_lib``).
"""
from __future__ import annotations

import ctypes
import errno as _errno
import os
import warnings
from ctypes import byref, c_void_p
from typing import TYPE_CHECKING, Any

from . import _buffers as _b
from . import _lib as _L
from .errors import ClientClosedError, KvcWarning
from ._ccall import (_NEW, _U32, _array, _bytes_arg, _error, _fork_gen, _label_bytes,
                     _new_request, _stream_of, _too_big, _u)
from .model import Model
from .request import Request, _keys_list, _label

if TYPE_CHECKING:
    from .paged_kv import PagedKV


class Client:
    """An attachment to kvcached (kvc_open): one per process and model.

    ``socket``: the daemon's socket path; None means ``$KVCACHED_SOCKET``,
    else the default path. ``salt``: tenant secret mixed into every key
    chain (only clients with the same salt hit each other's blocks).
    ``max_pins``: pin slots wanted, 0 for the daemon's default.
    ``alloc_ahead``: after each publish, ask for as many pages again without
    waiting (KVC_OPEN_ALLOC_AHEAD), for engines that publish continuously.
    ``no_insert``: look up and read, never publish (KVC_OPEN_NO_INSERT):
    alloc() raises NoInsertError, so none of this process's KV stays on
    the host. ``max_share``: percent of the pool (1..100) this process
    asks to be held to, below the daemon's max-share; 0 for the daemon's.

    Raises NoDaemonError, NotTrustedError, GeometryError (with the daemon's
    reason), ProtocolError, TooManyClientsError, TooManyModelsError,
    InvalidArgumentError, and, for a cuda pool, NotSupportedError or
    NoDeviceError.

    An open that succeeds may still have something to say: the daemon's
    warning (the model's pages fill at most half of the pool's, so most of
    every page it takes stays unused) is ``Client.warning`` (None when
    there is none) and, unless ``warn=False``, a ``kvclient.KvcWarning``
    through the ``warnings`` module. The engine adapters pass
    ``warn=False`` and put it in the engine's log instead.

    Use it as a context manager, or call close(); a Client belongs to the
    process that opened it (a forked child gets ForkedHandleError from
    every call and opens its own).
    """

    def __init__(self, model: Model, socket: str | os.PathLike | None = None,
                 salt: bytes | str = b"", max_pins: int = 0, alloc_ahead: bool = False,
                 warn: bool = True, no_insert: bool = False, max_share: int = 0) -> None:
        if not isinstance(model, Model):
            raise TypeError("model must be a kvclient.Model")
        L = _L.lib()
        self._h = None
        self.model = model
        m = model._struct()
        o = _L.Options()
        o.size = ctypes.sizeof(o)
        o.flags = ((_L.OPEN_ALLOC_AHEAD if alloc_ahead else 0) |
                   (_L.OPEN_NO_INSERT if no_insert else 0))
        path = os.fsencode(socket) if socket is not None else None
        o.socket_path = path
        salt_b = _bytes_arg(salt, "salt") or b""
        if salt_b:
            o.salt = ctypes.cast(ctypes.c_char_p(salt_b), c_void_p)
            o.salt_len = len(salt_b)
        o.max_pins = _u("max_pins", max_pins, 0, 2**32 - 1)
        o.max_share = _u("max_share", max_share, 0, 100)
        eb = _L.errbuf()
        o.errbuf = ctypes.cast(eb, c_void_p)
        o.errbuf_len = len(eb)
        h = c_void_p()
        rc = L.open(byref(m), byref(o), byref(h))
        if rc < 0:
            reason = eb.value.decode("utf-8", "replace") or None
            where = os.fsdecode(path) if path else "the default socket"
            what = ("attach to kvcached" if reason and where in reason else
                    f"attach to kvcached at {where}")
            raise _error(rc, "kvc_open", reason, what)
        self._h = h
        # kvc_open's errbuf on success: empty, or the daemon's warning.
        self.warning: str | None = eb.value.decode("utf-8", "replace") or None
        if self.warning and warn:
            warnings.warn(f"kvclient: {self.warning}", KvcWarning, stacklevel=2)
        self._pid = os.getpid()
        self._fork = _fork_gen[0]
        self._live: set[int | None] = set()	# C requests not yet freed
        self.page_bytes: int = L.page_bytes(h)
        self.block_tokens: int = L.block_tokens(h)
        kind = L.pool_kind(h)
        self.pool_kind: str = "cuda" if kind == _L.POOL_CUDA else "host"
        dev = L.pool_device(h)
        self.pool_device: int | None = dev if dev >= 0 else None
        self._geom = model._geometry()
        # Hot-path functions, bound once: the C fast path's (requests are
        # then plain ints) when it is built, else ctypes' (c_void_p).
        self._fast = F = _L.fast()
        self._hv = h.value
        self._req_new = L.req_new
        self._lookup = F.lookup if F else L.lookup
        self._free_nowait = F.req_free if F else L.req_free_nowait
        self._free_wait = L.req_free

    # -------------------------------------------------------------- life

    def close(self) -> None:
        """Detach (kvc_close): releases every request still open, then every
        pin and unpublished page of this Client. Harmless when closed."""
        h, self._h = self._h, None
        if h is None:
            return
        L = _L.lib()
        for r in list(self._live):
            L.req_free(c_void_p(r))
        self._live.clear()
        L.close(h)

    @property
    def closed(self) -> bool:
        return self._h is None

    def connected(self) -> bool:
        """Is the daemon still there (kvc_connected)? One poll() of the
        socket, no round trip. False once the daemon has closed the
        connection (exited, killed): the Client is then dead, and pages
        pinned before stay readable until their requests are released."""
        h = self._h
        return h is not None and _L.lib().connected(h) == 0

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass	# interpreter shutdown: the process exit releases everything

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"{self.pool_kind} pool"
        return f"<kvclient.Client {self.model.name!r} {state}>"

    def _handle(self) -> c_void_p:
        h = self._h
        if h is None:
            raise ClientClosedError(_errno.EBADF, "the Client is closed")
        return h

    # ---------------------------------------------------------- requests

    def request(self, tokens: Any, extra: bytes | str | None = None,
                label: str | None = None) -> "Request":
        """Start a request for one prompt (kvc_req_new): its full blocks'
        tokens are copied and keyed; a trailing partial block is not cached.

        ``tokens``: a list/tuple/range of ints, an ``array.array``, a numpy
        array or a torch tensor (uint32/int32 buffers are passed without a
        copy). ``extra``: bytes mixed into every block's key (a LoRA id,
        multimodal hashes). ``label``: names the prefix for kvstat's top
        prefixes (at most 23 bytes).
        """
        h = self._h
        if h is None:
            raise ClientClosedError(_errno.EBADF, "the Client is closed")
        if extra is not None:
            extra = _bytes_arg(extra, "extra")
        if label is not None:
            label_b = _label_bytes(label)
        F = self._fast
        # The C fast path takes lists, tuples, buffers (array.array, numpy)
        # and CPU torch tensors (their numpy() view) itself; None: not
        # taken (CUDA, grad, strided, out of range), go the ctypes way,
        # which says what is wrong.
        rc = F.req_new(self._hv, tokens, extra) if F else None
        n = 0	# the fast path takes no more than KVC_MAX_TOKENS tokens
        addr: int | None
        if rc is None:
            if type(tokens) is _array and tokens.typecode in "Ii":
                addr, n = tokens.buffer_info()
            else:
                conv = _U32.get(type(tokens))
                addr, n, keep = conv(tokens) if conv else _b.u32(tokens)
            if F:	# a tensor: by address, still without ctypes
                rc = F.req_new_at(self._hv, addr or 0, n, extra)
            else:
                r = c_void_p()
                rc = self._req_new(h, addr, n, extra, len(extra) if extra else 0, r)
                if rc >= 0:
                    rc = r
        if not isinstance(rc, c_void_p) and rc < 0:
            what = None
            if rc == -_errno.EINVAL and self.model.keys == "engine":
                what = ("request: this Client's namespace is engine-keyed "
                        "(Model(keys='engine')): use request_keys()")
            raise _too_big("request", rc, n, extra) or _error(rc, "kvc_req_new", what=what)
        # Request.__init__, inlined: this is the per-prompt path.
        req = _new_request(Request)
        req._c = self
        req._r = rc
        req._key = key = rc if F else rc.value
        req._stage = _NEW
        req.hits = req.granted = 0
        self._live.add(key)
        if label is not None:
            _label(req, req._r, label, label_b)
        return req

    def request_keys(self, keys: Any, label: str | None = None) -> "Request":
        """Start a request of an engine-keyed Client (``Model(keys="engine")``)
        for blocks the engine names (kvc_req_new_keys): ``keys`` is a
        sequence of str or bytes, one per block, each 1..1024 bytes. Block i
        is the same block in every request that names it ``keys[i]``; lookup()
        counts the leading ones cached. The rest of the request is as for
        request()."""
        h = self._handle()
        if isinstance(keys, (str, bytes)):
            raise TypeError("keys must be a sequence of str or bytes, one per block")
        bs = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
        if label is not None:
            label_b = _label_bytes(label)
        lens = _array("I", map(len, bs))
        buf = b"".join(bs)
        r = c_void_p()
        rc = _L.lib().req_new_keys(h, buf, lens.buffer_info()[0] if bs else None, len(bs), r)
        if rc < 0:
            what = None
            if rc == -_errno.EINVAL and self.model.keys != "engine":
                what = ("request_keys: this Client's namespace keys blocks by tokens; "
                        "open it with Model(..., keys='engine')")
            elif rc in (-_errno.EINVAL, -_errno.E2BIG):
                what = f"request_keys: every key must be 1..{_L.MAX_ENGINE_KEY} bytes"
            raise _error(rc, "kvc_req_new_keys", what=what)
        req = Request(self, r)
        if label is not None:
            _label(req, r, label, label_b)
        return req

    def unpin(self, pin_id: int) -> None:
        """End a pin of this Client's tenant and namespace before its time
        (kvc_unpin). Raises NoPinError (no such pin: ended, expired, or
        another tenant's)."""
        rc = _L.lib().unpin(self._handle(), _u("pin_id", pin_id, 1, 2**31 - 1))
        if rc < 0:
            raise _error(rc, "kvc_unpin", what=f"unpin({pin_id!r})")

    def keys(self, tokens: Any, extra: bytes | str | None = None) -> list[int]:
        """The key chain of the full blocks of ``tokens`` (kvc_keys), each a
        128-bit int (hi << 64 | lo, as kvstat prints keys in hex). Not a hot
        path: one Python int per block."""
        h = self._handle()
        addr, n, keep = _b.u32(tokens)
        ex = _bytes_arg(extra, "extra")
        nb = n // self.block_tokens
        out = (_L.Key * max(nb, 1))()
        rc = _L.lib().keys(h, addr, n, ex, len(ex) if ex else 0, out, nb)
        if rc < 0:
            raise _too_big("keys", rc, n, ex) or _error(rc, "kvc_keys")
        return _keys_list(out, rc)

    def _stream(self, stream: Any, kv: "PagedKV") -> int | None:
        """The stream argument of kvc_gather/kvc_scatter: None for CPU copies
        (a host pool and CPU tensors, which ignore it; the type is checked
        either way); for GPU copies the given one, else torch's current
        stream of the GPU they run on."""
        gpu = kv.device
        if stream is not None:
            s = _stream_of(stream)
            return s if gpu is not None else None
        if gpu is None:
            return None
        if kv._torch:
            import torch
            return torch.cuda.current_stream(gpu).cuda_stream
        return None	# the legacy default stream

    # -------------------------------------------------------------- GPUs

    def gpu_prepare(self, device: int, wait: bool = False) -> None:
        """Prepare copies between the pool and tensors on CUDA device
        ``device`` (kvc_gpu_prepare), off the request path: the kernels
        loaded in its context; on a host pool, the pool registered with
        CUDA by a thread of the library (``wait``: return once done), so
        that gather/scatter with that GPU's tensors run as one kernel over
        the bus. PagedKV calls it for tensors on a GPU. Raises
        NotSupportedError saying why where there is no CUDA here (a library
        built without it, no driver, no GPU), WrongDeviceError on a cuda
        pool for another GPU than the pool's."""
        h = self._handle()
        rc = _L.lib().gpu_prepare(h, _u("device", device, 0, 2**31 - 1),
                                  _L.GPU_WAIT if wait else 0)
        if rc < 0:
            raise _error(rc, "kvc_gpu_prepare", self.gpu_status()["why"] or None,
                         f"gpu_prepare({device})")

    def gpu_status(self) -> dict:
        """What gpu_prepare did (kvc_gpu_status): ``state`` "none",
        "registering", "ready" or "failed"; ``device``; for a host pool the
        registration's ``chunks``, ``chunks_registered``,
        ``bytes_registered`` and ``register_s``; ``why`` it failed."""
        st = _L.GpuStatus()
        st.size = ctypes.sizeof(st)
        rc = _L.lib().gpu_status(self._handle(), byref(st))
        if rc < 0:
            raise _error(rc, "kvc_gpu_status")
        names = {_L.GPU_NONE: "none", _L.GPU_REGISTERING: "registering",
                 _L.GPU_READY: "ready"}
        return {"state": names.get(st.state, "failed"),
                "error": -st.state if st.state < 0 else 0,
                "device": st.device if st.device >= 0 else None,
                "chunks": st.chunks, "chunks_registered": st.chunks_registered,
                "bytes_registered": st.bytes_registered,
                "register_s": st.register_ns / 1e9,
                "why": st.why.decode("utf-8", "replace")}

    # ------------------------------------------------------------- stats

    def stats(self) -> dict:
        """What kvstat reads, as a dict, from one snapshot of shared memory.

        ``counters``: every daemon-wide counter and gauge by the names of
        ``kvstat --json``'s "counters"; ``pages`` and ``hit_ratio`` as in
        kvstat --json; ``pool``: pages, block_tokens, kind; ``client``:
        this Client's own counters (struct kvc_stats). No round trip.
        """
        h = self._handle()
        L = _L.lib()
        n = L.daemon_stats(h, None, 0)
        if n < 0:
            raise _error(n, "kvc_daemon_stats")
        arr = (_L.Stat * n)()
        n = L.daemon_stats(h, arr, n)
        if n < 0:
            raise _error(n, "kvc_daemon_stats")
        counters = {s.name.decode(): s.value for s in arr}
        own = _L.Stats()
        rc = L.stats(h, byref(own))
        if rc < 0:
            raise _error(rc, "kvc_stats")
        client = {f: getattr(own, f) for f, _ in _L.Stats._fields_}
        hb, mb = counters.get("hit_blocks", 0), counters.get("miss_blocks", 0)
        ht, lt = counters.get("hit_tokens", 0), counters.get("lookup_tokens", 0)
        return {
            "counters": counters,
            "pages": {k: counters.get("pages_" + k, 0)
                      for k in ("free", "writing", "ready", "pinned", "spilled")},
            "hit_ratio": {"blocks": hb / (hb + mb) if hb + mb else None,
                          "tokens": ht / lt if lt else None},
            "pool": {"pages": client["pages_total"], "block_tokens": self.block_tokens,
                     "kind": self.pool_kind},
            "client": client,
        }

    def metrics(self) -> str:
        """The same snapshot with per-client rows and the hottest prefixes,
        in the Prometheus text format of the daemon's /metrics (what
        ``kvstat --prometheus`` prints): for an engine's own exporter."""
        h = self._handle()
        L = _L.lib()
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = L.daemon_metrics(h, buf, size)
            if n < 0:
                raise _error(int(n), "kvc_daemon_metrics")
            if n < size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = int(n) + 1
