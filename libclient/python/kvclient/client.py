# SPDX-License-Identifier: MIT
"""Model, Client, Request and PagedKV: the C contract of kvclient.h in Python.

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

import array
import ctypes
import enum
import errno as _errno
import os
import warnings
from ctypes import byref, c_char, c_void_p
from typing import Any

from . import _buffers as _b
from . import _lib as _L
from .errors import (ClientClosedError, DeviceMemoryError, ForkedHandleError,
                     InvalidArgumentError,
                     KvcError, KvcWarning, NoPageError, NotSupportedError,
                     RequestReleasedError, RequestStateError, TensorDeviceError, TensorError,
                     TooBigError, WrongDeviceError, error_class)

#: Limits of kvclient.h: KVC_MAX_LABEL (bytes of UTF-8), KVC_MAX_TOKENS,
#: KVC_MAX_EXTRA (bytes).
MAX_LABEL = 23
MAX_TOKENS = 1 << 22
MAX_EXTRA = 4096

# Bumped in a child after fork (os.register_at_fork), like the C library's
# own generation: a page view of an inherited Client is refused here, as
# every C call on it is refused there.
_fork_gen = [0]


def _after_fork_in_child():
    _fork_gen[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _error(rc: int, call: str, reason: str | None = None, what: str | None = None) -> KvcError:
    """The exception for negative return value rc of C function `call`."""
    err = -rc
    cls = error_class(err, call)
    text = _L.lib().strerror(rc).decode("utf-8", "replace")
    if err == _errno.ECHILD:
        text = ("this Client was opened by another process (this one was forked from "
                "it); open a new kvclient.Client in this process")
    # The daemon's or the library's own reason names the failure better
    # than the errno's text, which it would only repeat.
    msg = f"{what or call}: {reason or text}"
    return cls(err, msg, reason)


class PosKind(enum.IntEnum):
    """How positions are encoded (enum kvc_pos_kind); part of the namespace."""
    NONE = 0
    ROPE = 1
    ALIBI = 2
    LEARNED = 3


def _u(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{name} {v}: must be {lo}..{hi}")
    return v


class Model:
    """A model geometry and identity: its namespace (struct kvc_model).

    KV never crosses namespaces: clients hit each other's blocks only when
    name, dtype size, layers, kv_heads, head_dim, block_tokens, position
    kind, MLA or not, key kind and pipeline stage are all equal (the
    tensor-parallel rank and size are not part of it). Note that the namespace knows the dtype's
    size, not its kind: name the revision and precision in ``name``
    ("llama-3-8b@main/bf16") so that float16 and bfloat16 KV of one model
    stay apart.

    ``dtype``: a name ("float16", "bf16", "float32", "fp8", ...), a numpy or
    torch dtype, or a number of bytes (1, 2, 4, 8) for raw pages. The shard
    (``tp_rank``/``tp_size``, ``pp_rank``/``pp_size``) says which part of a
    model parallelised across processes this client holds; the defaults
    (0 of 1) mean not sharded. ``kv_heads`` are the model's, every
    tensor-parallel rank's together: the ranks of any TP size share the
    namespace and its pages (a page holds every head), each moving its
    own heads (``heads``; ``writes`` says whether this rank publishes
    them or, holding replicated heads, only reads them). A pipeline stage
    declares its own ``layers`` and has its own pages.

    ``mla=True`` (KVC_MODEL_MLA): multi-head latent attention (DeepSeek,
    Kimi K2): one latent vector of ``head_dim`` elements (kv_lora_rank +
    rope dims) per token per layer, no K and V, ``kv_heads`` 1. Every
    tensor-parallel rank holds all of it; rank 0 publishes, all read.

    ``keys="engine"`` (KVC_MODEL_ENGINE_KEYS) declares a namespace whose
    blocks the engine names by keys of its own (SGLang's page hashes):
    requests come from ``Client.request_keys``, never from tokens, and a
    hit is only as exact as the engine's key. Such a namespace never shares
    blocks with the token-keyed one of the same model.
    """

    __slots__ = ("name", "dtype", "dtype_bytes", "layers", "kv_heads", "head_dim",
                 "block_tokens", "pos", "tp_rank", "tp_size", "pp_rank", "pp_size", "keys",
                 "mla")

    def __init__(self, name: str, dtype: Any, layers: int, kv_heads: int, head_dim: int,
                 block_tokens: int, pos: PosKind | str | int = PosKind.ROPE, *,
                 tp_rank: int = 0, tp_size: int = 1, pp_rank: int = 0, pp_size: int = 1,
                 keys: str = "tokens", mla: bool = False):
        if not isinstance(name, str):
            raise TypeError("name must be a str")
        if not 1 <= len(name.encode()) <= 63 or "\0" in name:
            raise ValueError(f"model name {name!r}: must be 1..63 bytes of UTF-8, no NUL")
        self.name = name
        self.dtype, self.dtype_bytes = _b.parse_dtype(dtype)
        self.layers = _u("layers", layers, 1, 4096)
        self.kv_heads = _u("kv_heads", kv_heads, 1, 4096)
        self.head_dim = _u("head_dim", head_dim, 1, 65536)
        self.block_tokens = _u("block_tokens", block_tokens, 1, 2**32 - 1)
        if isinstance(pos, str):
            try:
                pos = PosKind[pos.upper()]
            except KeyError:
                raise ValueError(f"pos {pos!r}: one of none, rope, alibi, learned") from None
        self.pos = PosKind(pos)
        self.tp_size = _u("tp_size", tp_size, 0, 65535)
        self.tp_rank = _u("tp_rank", tp_rank, 0, max(self.tp_size - 1, 0))
        self.pp_size = _u("pp_size", pp_size, 0, 65535)
        self.pp_rank = _u("pp_rank", pp_rank, 0, max(self.pp_size - 1, 0))
        if keys not in ("tokens", "engine"):
            raise ValueError(f"keys {keys!r}: 'tokens' (kvcached keys blocks by their tokens)"
                             " or 'engine' (the engine names each block)")
        self.keys = keys
        self.mla = bool(mla)
        if self.mla and self.kv_heads != 1:
            raise ValueError(f"kv_heads {self.kv_heads}: an MLA model has one latent vector "
                             "per token and layer: kv_heads=1")
        self._part()	# tp_size and kv_heads must split evenly

    def _part(self) -> tuple[int, int, bool]:
        """(first head, heads, writes) of this rank: kvproto_part in shm/proto.c."""
        tp, r, h = max(self.tp_size, 1), self.tp_rank, self.kv_heads
        if self.mla:
            return 0, 1, r == 0
        if tp <= h:
            if h % tp:
                raise ValueError(f"tp_size {tp} does not divide the model's {h} KV heads "
                                 "(kv_heads counts every tensor-parallel rank's)")
            if tp > 32:
                raise ValueError(f"tp_size {tp}: at most 32 ranks write one page")
            return r * (h // tp), h // tp, True
        if tp % h:
            raise ValueError(f"the model's {h} KV heads do not divide tp_size {tp}")
        if h > 32:
            raise ValueError(f"{h} KV heads replicated: at most 32 ranks write one page")
        rep = tp // h
        return r // rep, 1, r % rep == 0

    @property
    def heads(self) -> tuple[int, int]:
        """(first, count): the KV heads of a page this rank holds and moves."""
        return self._part()[:2]

    @property
    def writes(self) -> bool:
        """Does this rank publish its heads (False: another rank of its engine
        writes them: replicated heads, an MLA rank other than 0)?"""
        return self._part()[2]

    @property
    def page_shape(self) -> tuple:
        """Shape of one block's page: [layers, 2 (K, V), block_tokens, kv_heads,
        head_dim] with every KV head of the model, or [layers, block_tokens,
        head_dim] for MLA."""
        if self.mla:
            return (self.layers, self.block_tokens, self.head_dim)
        return (self.layers, 2, self.block_tokens, self.kv_heads, self.head_dim)

    @property
    def page_bytes(self) -> int:
        """Bytes of one block's page."""
        return (self.block_tokens * self.layers * (1 if self.mla else 2) * self.kv_heads *
                self.head_dim * self.dtype_bytes)

    def _struct(self) -> _L.ModelStruct:
        m = _L.ModelStruct()
        m.size = ctypes.sizeof(m)
        m.flags = ((_L.MODEL_ENGINE_KEYS if self.keys == "engine" else 0) |
                   (_L.MODEL_MLA if self.mla else 0))
        m.name = self.name.encode()
        m.dtype_bytes = self.dtype_bytes
        m.layers = self.layers
        m.kv_heads = self.kv_heads
        m.head_dim = self.head_dim
        m.block_tokens = self.block_tokens
        m.pos_kind = int(self.pos)
        m.shard.tp_rank, m.shard.tp_size = self.tp_rank, self.tp_size
        m.shard.pp_rank, m.shard.pp_size = self.pp_rank, self.pp_size
        return m

    def _geometry(self) -> tuple:
        return (self.dtype, self.dtype_bytes, self.layers, self.kv_heads, self.head_dim,
                self.block_tokens, self.mla, self.heads)

    def __repr__(self) -> str:
        shard = ""
        if self.tp_size > 1:
            shard += f", tp_rank={self.tp_rank}, tp_size={self.tp_size}"
        if self.pp_size > 1:
            shard += f", pp_rank={self.pp_rank}, pp_size={self.pp_size}"
        if self.keys != "tokens":
            shard += f", keys={self.keys!r}"
        if self.mla:
            shard += ", mla=True"
        return (f"Model({self.name!r}, {self.dtype or self.dtype_bytes!r}, layers={self.layers}"
                f", kv_heads={self.kv_heads}, head_dim={self.head_dim}, block_tokens="
                f"{self.block_tokens}, pos={self.pos.name.lower()!r}{shard})")


def _bytes_arg(v: Any, what: str) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{what} must be bytes or str, not {type(v).__name__}")


def _label_bytes(label: Any) -> bytes:
    """A request label as C takes it: at most KVC_MAX_LABEL bytes, no NUL."""
    if not isinstance(label, str):
        raise TypeError(f"label must be a str, not {type(label).__name__}")
    b = label.encode()
    if len(b) > MAX_LABEL:
        raise TooBigError(_errno.E2BIG, f"label {label!r}: {len(b)} bytes, at most "
                          f"{MAX_LABEL} (KVC_MAX_LABEL)")
    if b"\0" in b:
        raise InvalidArgumentError(_errno.EINVAL, f"label {label!r}: contains a NUL")
    return b


def _too_big(call: str, rc: int, n: int, extra: bytes | None) -> TooBigError | None:
    """For -E2BIG from kvc_req_new/kvc_keys: the error naming the limit."""
    if rc != -_errno.E2BIG:
        return None
    if n > MAX_TOKENS:
        what = f"the prompt is too long: {n} tokens, at most {MAX_TOKENS} (KVC_MAX_TOKENS)"
    else:
        what = (f"the extra keys are too long: {len(extra or b'')} bytes, at most "
                f"{MAX_EXTRA} (KVC_MAX_EXTRA)")
    return TooBigError(_errno.E2BIG, f"{call}: {what}")


def _stream_of(stream: Any) -> int:
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    cs = getattr(stream, "cuda_stream", None)	# torch.cuda.Stream / ExternalStream
    if isinstance(cs, int):
        return cs
    raise TypeError(f"stream must be None, an int (cudaStream_t) or a torch.cuda.Stream, "
                    f"not {type(stream).__name__}")


def _event_of(event: Any, stream: int | None) -> int | None:
    """A CUevent / cudaEvent_t for the C calls: an int, or a torch.cuda.Event
    (whose event torch creates at its first record: recorded once on the
    copy's stream here first if it has none yet)."""
    if event is None:
        return None
    if isinstance(event, int) and not isinstance(event, bool):
        return event
    h = getattr(event, "cuda_event", None)
    if isinstance(h, int):
        if not h and hasattr(event, "record"):
            import torch
            event.record(torch.cuda.ExternalStream(stream) if stream else None)
            h = event.cuda_event
        return h
    raise TypeError(f"an event must be None, an int (cudaEvent_t) or a torch.cuda.Event, "
                    f"not {type(event).__name__}")


_U32 = _b._U32
_array = array.array
_I64 = _b._I64
_new_request = object.__new__

# Request stages (the C library's, plus released).
_NEW, _LOOKED_UP, _ALLOCATED, _PUBLISHED, _RELEASED = 0, 1, 2, 3, 4


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
                 warn: bool = True, no_insert: bool = False, max_share: int = 0):
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
        self._live: set[int] = set()	# C requests not yet freed
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

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass	# interpreter shutdown: the process exit releases everything

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"{self.pool_kind} pool"
        return f"<kvclient.Client {self.model.name!r} {state}>"

    def _handle(self):
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

    def _stream(self, stream: Any, kv: "PagedKV"):
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


def _label(req: "Request", r, label: str, label_b: bytes) -> None:
    """kvc_req_label for a request just made; releases it on failure."""
    rc = _L._lib.req_label(r, label_b)
    if rc < 0:
        req.release()
        raise _error(rc, "kvc_req_label", what=f"label {label!r}")


def _keys_list(arr, n: int) -> list[int]:
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

    def __init__(self, client: Client, r: c_void_p):
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

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    def __repr__(self) -> str:
        stage = ("new", "looked up", "allocated", "published", "released")[self._stage]
        return f"<kvclient.Request {self.blocks} blocks, {stage}, hits={self.hits}>"

    def _req(self, call: str):
        """The C request, if this request may still be used."""
        if self._stage == _RELEASED or self._c._h is None:
            raise RequestReleasedError(_errno.EINVAL, f"{call}: the request was released")
        return self._r

    def _stage_error(self, call: str, need: str) -> RequestStateError:
        if self._stage == _RELEASED or self._c._h is None:
            return RequestReleasedError(_errno.EINVAL, f"{call}: the request was released")
        stage = ("new", "looked up", "allocated", "published")[self._stage]
        return RequestStateError(_errno.EINVAL, f"{call}: {need} (the request is {stage})")

    def __exit__(self, exc_type, exc, tb) -> None:
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

    def _page(self, i: int, call: str):
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

    def page_array(self, i: int):
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

    def page_tensor(self, i: int):
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

    def _copy(self, call: str, kv: "PagedKV", block_ids, first: int, stream,
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
        nb = _L._lib.req_blocks(r)
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

    def _copy_v2(self, call, kv, r, first, n, addr, s, first_layer, layers, event,
                 layer_events) -> int:
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


# ---------------------------------------------------------- paged KV



class PagedKV:
    """An engine's paged KV cache, checked once against a Client's model and
    pool, for Request.gather() and Request.scatter().

    ``layout="flash"`` (vLLM's FlashAttention layout): ``k`` is a sequence of
    one tensor per layer, each [2, num_blocks, block_tokens, kv_heads,
    head_dim] (K then V), or one tensor [layers, 2, num_blocks, ...].
    ``layout="kv"``: ``k`` and ``v`` are each a sequence of one tensor per
    layer, [num_blocks, block_tokens, kv_heads, head_dim], or one tensor
    [layers, num_blocks, ...]. ``layout="mla"`` (an MLA model; vLLM's MLA
    cache): ``k`` is a sequence of one latent tensor per layer, each
    [num_blocks, block_tokens, head_dim], or one tensor [layers,
    num_blocks, ...]. kv_heads is this rank's count (``model.heads``):
    gather and scatter move only its heads of each page. The layout
    defaults to "kv" when ``v`` is given, "mla" for an MLA model, else
    "flash".

    torch tensors or numpy arrays of the model's dtype; within a block dense,
    between blocks any stride (padding) the same for every tensor; the
    pool's GPU for a cuda pool; for a host pool either CPU memory (copies on
    the calling thread) or one GPU, all tensors on it (a GPU engine: the
    pool is registered with CUDA for that GPU, Client.gpu_prepare, and the
    copies run there as kernels; NotSupportedError says why where that
    cannot be). Anything else raises TensorError / TensorDeviceError here,
    before any copy. The tensors are referenced, not copied: keep using
    them.
    """

    def __init__(self, client: Client, k: Any, v: Any = None, *, layout: str | None = None):
        if not isinstance(client, Client):
            raise TypeError("client must be a kvclient.Client")
        client._handle()
        m = client.model
        layout = layout or ("kv" if v is not None else "mla" if m.mla else "flash")
        if layout not in ("kv", "flash", "mla"):
            raise ValueError(f"layout {layout!r}: 'kv', 'flash' or 'mla'")
        if layout != "kv" and v is not None:
            raise ValueError(f"layout {layout!r} keeps a layer's KV in one tensor: no v")
        if layout == "kv" and v is None:
            raise ValueError("layout 'kv' needs v, the V tensors")
        if (layout == "mla") != m.mla:
            raise ValueError(f"layout {layout!r} for a model {'with' if m.mla else 'without'}"
                             " MLA: " + ("'mla'" if m.mla else "'kv' or 'flash'"))
        self.layout = layout
        self.layers = m.layers
        self._geom = client._geom
        self._pool = (client.pool_kind, client.pool_device)
        lead = (2,) if layout == "flash" else ()
        ks, kinfo = self._tensors(client, k, "k", lead)
        if layout == "kv":
            vs, vinfo = self._tensors(client, v, "v", lead)
        else:
            vs, vinfo = [], []
        infos = kinfo + vinfo
        self.num_blocks: int = infos[0][1].shape[len(lead)]
        stride = infos[0][1].strides[len(lead)]
        for what, t in infos:
            if t.shape[len(lead)] != self.num_blocks:
                raise TensorError(_errno.EINVAL, f"{what}: {t.shape[len(lead)]} blocks, "
                                  f"{infos[0][0]} has {self.num_blocks}")
            if t.strides[len(lead)] != stride:
                raise TensorError(_errno.EINVAL, f"{what}: block stride {t.strides[len(lead)]}"
                                  f" elements, {infos[0][0]} has {stride}: one stride for all")
        #: bytes from one block to the next in each tensor
        self.block_stride: int = stride * m.dtype_bytes
        self._torch = infos[0][1].lib == "torch"
        #: the CUDA device the copies run on, None for CPU copies
        self.device: int | None = client.pool_device
        gpu = infos[0][1].device == "cuda"
        if client.pool_kind == "host":
            self.device = (infos[0][1].index or 0) if gpu else None
            for what, t in infos:
                if (t.device == "cuda") != gpu or (gpu and (t.index or 0) != self.device):
                    raise TensorDeviceError(_errno.EINVAL, f"{what} is on {t.device}"
                                            f"{':' + str(t.index) if t.index is not None else ''}"
                                            f", {infos[0][0]} on {infos[0][1].device}: "
                                            "every tensor in one place")
        kp = (c_void_p * m.layers)(*ks)
        vp = (c_void_p * m.layers)(*vs) if vs else None
        lay = _L.Layout()
        lay.size = ctypes.sizeof(lay)
        lay.kind = {"flash": _L.LAYOUT_FLASH, "kv": _L.LAYOUT_KV, "mla": _L.LAYOUT_MLA}[layout]
        lay.layers = m.layers
        lay.num_blocks = self.num_blocks
        lay.block_stride = self.block_stride
        lay.k = kp
        if vp is not None:
            lay.v = vp
        if client.pool_kind == "host" and self.device is not None:
            lay.flags = _L.LAYOUT_DEVICE
            lay.device = self.device
            client.gpu_prepare(self.device)	# registers the pool, off the request path
        self._layout = lay
        self._keep = (k, v, kp, vp)

    def _tensors(self, client: Client, x: Any, name: str, lead: tuple):
        """Per-layer start addresses and infos of `x` (a sequence of one tensor
        per layer, or one tensor with a leading layers dimension)."""
        m = client.model
        if m.mla:
            inner, names = (m.block_tokens, m.head_dim), ["block_tokens", "head_dim"]
        else:
            inner = (m.block_tokens, m.heads[1], m.head_dim)
            names = ["block_tokens", "kv_heads", "head_dim"]
        want = "[" + ", ".join(["2"] * len(lead) + ["num_blocks"] + names) + "]"
        if isinstance(x, (list, tuple)):
            if len(x) != m.layers:
                raise TensorError(_errno.EINVAL, f"{name}: {len(x)} tensors for a model of "
                                  f"{m.layers} layers: one per layer")
            infos = [(f"{name}[{i}]", _b.TensorInfo(t, f"{name}[{i}]")) for i, t in enumerate(x)]
            for what, t in infos:
                self._check(client, what, t, lead, inner, want)
            return [t.ptr for _, t in infos], infos
        t = _b.TensorInfo(x, name)
        if len(t.shape) != len(lead) + 2 + len(inner) or t.shape[0] != m.layers:
            raise TensorError(_errno.EINVAL, f"{name}: shape {t.shape}, want one tensor per "
                              f"layer {want} or [layers={m.layers}] + {want}")
        sub = _b.TensorInfo.__new__(_b.TensorInfo)
        for f in _b.TensorInfo.__slots__:
            setattr(sub, f, getattr(t, f))
        sub.shape, sub.strides = t.shape[1:], t.strides[1:]
        self._check(client, name, sub, lead, inner, want)
        step = t.strides[0] * t.itemsize
        return [t.ptr + i * step for i in range(m.layers)], [(name, sub)]

    @staticmethod
    def _check(client: Client, what: str, t: "_b.TensorInfo", lead: tuple, inner: tuple,
               want: str) -> None:
        m = client.model
        if client.pool_kind == "host":
            if t.device not in ("cpu", "cuda"):
                raise TensorDeviceError(_errno.EINVAL, f"{what} is on {t.device}: the pool is"
                                        " host memory, gather/scatter take CPU or CUDA tensors")
        elif t.device != "cuda":
            raise DeviceMemoryError(_errno.EFAULT, f"{what} is on {t.device}: the pool is on "
                                    f"cuda:{client.pool_device}")
        elif t.index != client.pool_device:
            raise WrongDeviceError(_errno.EXDEV, f"{what} is on cuda:{t.index}: the pool is "
                                   f"on cuda:{client.pool_device}")
        if not _b._dtype_matches(m.dtype, m.dtype_bytes, t.dtype, t.itemsize, t.integer,
                                 t.lib):
            raise TensorError(_errno.EINVAL, f"{what}: dtype {t.dtype} ({t.itemsize} bytes), "
                              f"the model's is {m.dtype or f'{m.dtype_bytes} bytes'}")
        if not t.writable:
            raise TensorError(_errno.EINVAL, f"{what} is read-only; gather writes into it")
        n = len(lead)
        names = want[1:-1].split(", ")[n + 1:]
        if len(t.shape) != n + 1 + len(inner) or t.shape[:n] != lead or t.shape[n + 1:] != inner:
            heads = (f" ({inner[1]}: this rank's KV heads, {m.heads[0]}.."
                     f"{m.heads[0] + m.heads[1] - 1} of the model's {m.kv_heads})"
                     if len(inner) == 3 and m.heads[1] != m.kv_heads else "")
            raise TensorError(_errno.EINVAL, f"{what}: shape {t.shape}, want {want} with "
                              f"{', '.join(names)} = {inner}{heads}")
        s = t.strides
        dense, block = [], 1
        for size in reversed(inner):
            dense.insert(0, block)
            block *= size
        if any(size > 1 and st != d for size, st, d in zip(inner, s[n + 1:], dense)):
            raise TensorError(_errno.EINVAL, f"{what}: strides {s}: a block must be dense "
                              f"[{', '.join(names)}]")
        if s[n] < block:
            raise TensorError(_errno.EINVAL, f"{what}: block stride {s[n]} elements, smaller "
                              f"than a block ({block})")
        if n and s[0] != t.shape[1] * s[1]:
            raise TensorError(_errno.EINVAL, f"{what}: V must start right after K's "
                              f"num_blocks blocks (stride of the K/V dimension {s[0]}, want "
                              f"{t.shape[1] * s[1]})")
        if not t.ptr:
            raise TensorError(_errno.EINVAL, f"{what}: no data (an empty tensor)")

    def __repr__(self) -> str:
        return (f"<kvclient.PagedKV {self.layout} {self.layers} layers x {self.num_blocks} "
                f"blocks>")
