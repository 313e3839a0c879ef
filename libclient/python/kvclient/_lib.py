# SPDX-License-Identifier: MIT
"""Loading libkvclient and declaring its C contract for ctypes.

Only the standard library: the structs of kvclient.h as ctypes
Structures and one prototype per function. Nothing here is public API.

Where the library is looked for, in order:

1. ``$KVCLIENT_LIB``: a path to libkvclient.so (a build tree:
   ``KVCLIENT_LIB=build/libkvclient.so``);
2. the package's own copy, ``libkvclient.so.0`` next to this file, which
   a ``pip install libclient/python`` puts there (the wheel carries the
   library it was built with; absent in the source tree and in a
   ``make install``);
3. the library directory ``make install`` recorded in ``_installed.py``
   (absent in the source tree);
4. the soname ``libkvclient.so.0`` through the dynamic linker
   (``LD_LIBRARY_PATH``, ld.so.cache).

The library is loaded on first use, not on import, so that ``import
kvclient`` works on a machine without it (documentation builds, type
checkers, a package installed before its library).

GIL: functions that can wait (a socket round trip, a restore from disk, a
copy of many pages) are called through ``ctypes.CDLL``, which releases the
GIL for the call's duration, so other Python threads run meanwhile. The
few that are pure memory work of a microsecond or less, with no system
call and no wait on another process (``kvc_req_new``, ``kvc_lookup``,
``kvc_block``, counts), go through ``ctypes.PyDLL`` on the same library
and keep the GIL: dropping and retaking it would cost more than the call.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import TYPE_CHECKING, Any, List, Tuple

from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_int, c_int32,
                    c_int64, c_size_t, c_uint16, c_uint32, c_uint64, c_void_p)

SONAME = "libkvclient.so.0"
# kvc_version() of the oldest library this package speaks to: 0.2.0, the
# first with the parallel shard in struct kvc_model.
MIN_VERSION = 2000


class Shard(Structure):
    _fields_ = [("tp_rank", c_uint16), ("tp_size", c_uint16),
                ("pp_rank", c_uint16), ("pp_size", c_uint16)]


class ModelStruct(Structure):
    _fields_ = [("size", c_uint32), ("flags", c_uint32), ("name", c_char_p),
                ("dtype_bytes", c_uint32), ("layers", c_uint32), ("kv_heads", c_uint32),
                ("head_dim", c_uint32), ("block_tokens", c_uint32), ("pos_kind", c_uint32),
                ("shard", Shard), ("resv", c_uint64 * 3)]


class Options(Structure):
    _fields_ = [("size", c_uint32), ("flags", c_uint32), ("socket_path", c_char_p),
                ("salt", c_void_p), ("salt_len", c_size_t), ("max_pins", c_uint32),
                ("pad", c_uint32), ("errbuf", c_void_p), ("errbuf_len", c_size_t),
                ("max_share", c_uint32), ("pad2", c_uint32), ("resv", c_uint64 * 3)]


class Key(Structure):
    _fields_ = [("lo", c_uint64), ("hi", c_uint64)]


class Stats(Structure):
    _fields_ = [(n, c_uint64) for n in (
        "lookups", "hit_blocks", "miss_blocks", "lookup_tokens", "hit_tokens",
        "pin_failures", "pins_held", "published", "pages_total", "pages_free",
        "pages_ready", "pages_writing")]


class Stat(Structure):
    _fields_ = [("name", c_char_p), ("value", c_uint64)]


class Layout(Structure):
    _fields_ = [("size", c_uint32), ("kind", c_uint32), ("flags", c_uint32),
                ("layers", c_uint32), ("num_blocks", c_uint64), ("block_stride", c_uint64),
                ("k", POINTER(c_void_p)), ("v", POINTER(c_void_p)), ("device", c_int32),
                ("resv32", c_uint32), ("resv", c_uint64 * 3)]


class CopyOpts(Structure):
    _fields_ = [("size", c_uint32), ("flags", c_uint32), ("first_layer", c_uint32),
                ("layers", c_uint32), ("stream", c_void_p), ("event", c_void_p),
                ("layer_events", POINTER(c_void_p)), ("resv", c_uint64 * 4)]


class GpuStatus(Structure):
    _fields_ = [("size", c_uint32), ("state", c_int32), ("device", c_int32),
                ("chunks", c_uint32), ("chunks_registered", c_uint32), ("resv32", c_uint32),
                ("bytes_registered", c_uint64), ("register_ns", c_uint64),
                ("why", c_char * 256), ("resv", c_uint64 * 4)]


# The mirror of each struct of kvclient.h (tests/python/test_ctypes_header.py
# parses the header and holds every field, in order, to these).
C_STRUCTS = {"kvc_shard": Shard, "kvc_model": ModelStruct, "kvc_options": Options,
             "kvc_key": Key, "kvc_stats": Stats, "kvc_stat": Stat, "kvc_layout": Layout,
             "kvc_copy_opts": CopyOpts, "kvc_gpu_status": GpuStatus}

OPEN_ALLOC_AHEAD = 0x1
OPEN_NO_INSERT = 0x2
MODEL_ENGINE_KEYS = 0x1
MODEL_MLA = 0x2
MAX_ENGINE_KEY = 1024
POOL_HOST = 1
POOL_CUDA = 2
LAYOUT_KV = 1
LAYOUT_FLASH = 2
LAYOUT_DEVICE = 0x1
GPU_WAIT = 0x1
GPU_NONE, GPU_REGISTERING, GPU_READY = 0, 1, 2
GPU_CHUNK = 256 << 20
LAYOUT_MLA = 3

# (name, restype, argtypes, releases the GIL)
_PROTOS: Tuple[Tuple[str, Any, List[Any], bool], ...] = (
    ("kvc_open", c_int, [POINTER(ModelStruct), POINTER(Options), POINTER(c_void_p)], True),
    ("kvc_close", None, [c_void_p], True),
    ("kvc_keys", c_int, [c_void_p, c_void_p, c_size_t, c_char_p, c_size_t, c_void_p,
                         c_size_t], False),
    ("kvc_req_new", c_int, [c_void_p, c_void_p, c_size_t, c_char_p, c_size_t,
                            POINTER(c_void_p)], False),
    ("kvc_req_new_keys", c_int, [c_void_p, c_char_p, c_void_p, c_size_t,
                                 POINTER(c_void_p)], False),
    ("kvc_req_label", c_int, [c_void_p, c_char_p], False),
    ("kvc_req_blocks", c_size_t, [c_void_p], False),
    ("kvc_req_keys", c_int, [c_void_p, c_void_p, c_size_t], False),
    ("kvc_lookup", c_int, [c_void_p], False),
    ("kvc_req_spilled", c_size_t, [c_void_p], False),
    ("kvc_req_remote", c_size_t, [c_void_p], False),
    ("kvc_req_inflight", c_size_t, [c_void_p], False),
    ("kvc_wait", c_int, [c_void_p, c_int], True),
    ("kvc_restore", c_int, [c_void_p], True),
    ("kvc_restore_pays", c_int, [c_void_p, c_double], False),
    ("kvc_alloc", c_int, [c_void_p], True),
    ("kvc_req_message", c_char_p, [c_void_p], False),
    ("kvc_pin", c_int, [c_void_p, c_uint32], True),
    ("kvc_unpin", c_int, [c_void_p, c_int], True),
    ("kvc_block", c_void_p, [c_void_p, c_size_t], False),
    ("kvc_block_page", c_int64, [c_void_p, c_size_t], False),
    ("kvc_publish", c_int, [c_void_p], True),
    ("kvc_req_free", None, [c_void_p], True),
    ("kvc_connected", c_int, [c_void_p], False),
    ("kvc_pool_kind", c_int, [c_void_p], False),
    ("kvc_pool_device", c_int, [c_void_p], False),
    ("kvc_gather", c_int, [c_void_p, c_size_t, c_size_t, POINTER(Layout), c_void_p,
                           c_void_p], True),
    ("kvc_scatter", c_int, [c_void_p, c_size_t, c_size_t, POINTER(Layout), c_void_p,
                            c_void_p], True),
    ("kvc_gather_v2", c_int, [c_void_p, c_size_t, c_size_t, POINTER(Layout), c_void_p,
                              POINTER(CopyOpts)], True),
    ("kvc_scatter_v2", c_int, [c_void_p, c_size_t, c_size_t, POINTER(Layout), c_void_p,
                               POINTER(CopyOpts)], True),
    ("kvc_gpu_prepare", c_int, [c_void_p, c_int, c_uint32], True),
    ("kvc_gpu_status", c_int, [c_void_p, POINTER(GpuStatus)], False),
    ("kvc_page_bytes", c_size_t, [c_void_p], False),
    ("kvc_block_tokens", c_size_t, [c_void_p], False),
    ("kvc_heads", c_int, [c_void_p, POINTER(c_uint32), POINTER(c_uint32)], False),
    ("kvc_stats", c_int, [c_void_p, POINTER(Stats)], False),
    ("kvc_daemon_stats", c_int, [c_void_p, POINTER(Stat), c_size_t], False),
    ("kvc_daemon_metrics", c_int64, [c_void_p, c_void_p, c_size_t], True),
    ("kvc_strerror", c_char_p, [c_int], False),
    ("kvc_version", c_int, [], False),
    ("kvc_version_string", c_char_p, [], False),
)

# Functions of kvclient.h the binding does not call, and why.
NOT_BOUND = {
    "kvc_req_short_reason": "Request.message carries the reason's text",
    "kvc_group": "batch ordering is the engine's (kvdemo calls it from C)",
    "kvc_drop_namespace": "a namespace drop: kvstat --drop-namespace (an operator's ADMIN)",
}


# Called once or twice per prompt, always with a c_void_p instance, which
# ctypes passes as the pointer it holds; without argtypes it skips the
# conversion step (about 70 ns a call on the development VM).
_UNCHECKED = {"kvc_lookup", "kvc_req_free"}


class LibraryNotFound(ImportError):
    """libkvclient could not be loaded (see the message for where it looked)."""


class Lib:
    """The loaded library: one attribute per C function, named without kvc_."""

    if TYPE_CHECKING:	# the functions are set from _PROTOS below
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, path: str) -> None:
        self.path = path
        cdll = ctypes.CDLL(path)
        pydll = ctypes.PyDLL(path)
        missing = []
        for name, restype, argtypes, waits in _PROTOS:
            try:
                fn = getattr(cdll if waits else pydll, name)
            except AttributeError:
                missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = None if name in _UNCHECKED else argtypes
            setattr(self, name[4:], fn)
        # kvc_req_free waits only for a request with pages granted and not
        # published (one FREE round trip); else it is pure memory work.
        self.req_free_nowait = pydll.kvc_req_free
        self.req_free_nowait.restype = None
        if missing:
            raise LibraryNotFound(
                f"{path} is too old for this kvclient package: it lacks {', '.join(missing)}"
                f" (build and install the library of the same release)")
        v = self.version()
        if v < MIN_VERSION:
            raise LibraryNotFound(f"{path} is libkvclient {v}: this package needs "
                                  f"{MIN_VERSION} or later")


_lib: Lib | None = None
_lock = threading.Lock()


def _candidates() -> list[tuple[str, str]]:
    """(where it came from, what to dlopen), in the order they are tried."""
    out = []
    env = os.environ.get("KVCLIENT_LIB")
    if env:
        out.append(("$KVCLIENT_LIB", env))
        return out	# named explicitly: nothing else may stand in for it
    own = os.path.join(os.path.dirname(os.path.abspath(__file__)), SONAME)
    if os.path.exists(own):
        out.append(("the package's own copy (pip install)", own))
    try:
        from . import _installed  # type: ignore[attr-defined]  # written by make install
        out.append(("the install's libdir", os.path.join(_installed.LIBDIR, SONAME)))
    except ImportError:
        pass
    out.append(("the dynamic linker's path", SONAME))
    return out


def lib() -> Lib:
    """The library, loaded on first call; LibraryNotFound says where it looked."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            tried = []
            for where, path in _candidates():
                if os.sep in path and not os.path.exists(path):
                    tried.append(f"{path} ({where}): no such file")
                    continue
                try:
                    _lib = Lib(path)
                    break
                except OSError as e:
                    tried.append(f"{path} ({where}): {e}")
            else:
                raise LibraryNotFound(
                    "cannot load libkvclient: tried " + "; ".join(tried) +
                    ". Build it (make) and set KVCLIENT_LIB=/path/to/build/libkvclient.so,"
                    " or install it (make install)")
    return _lib


_fast_mod: Any = None
_fast_tried = False


def fast() -> Any:
    """The optional C fast path (_kvcfast.c), bound to the loaded library,
    or None: not built, not loadable, or KVCLIENT_NO_FAST set. Looked for
    inside the package (an installed build), then next to the library
    (a build tree: make puts it beside libkvclient.so)."""
    global _fast_mod, _fast_tried
    if _fast_tried:
        return _fast_mod
    L = lib()
    with _lock:
        if _fast_tried:
            return _fast_mod
        mod = None
        if not os.environ.get("KVCLIENT_NO_FAST"):
            try:
                from . import _kvcfast as mod  # type: ignore[attr-defined,no-redef]
            except ImportError:
                mod = _fast_beside(L.path)
        if mod is not None:
            addr = [ctypes.cast(getattr(L, n), c_void_p).value
                    for n in ("req_new", "lookup", "req_free_nowait")]
            mod.bind(*addr)
        _fast_mod, _fast_tried = mod, True
    return _fast_mod


def _fast_beside(path: str) -> Any:
    import importlib.machinery
    import importlib.util
    if os.sep not in path:
        return None	# found by the dynamic linker: no folder to look in
    d = os.path.dirname(path)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        f = os.path.join(d, "_kvcfast" + suffix)
        if os.path.exists(f):
            try:
                spec = importlib.util.spec_from_file_location(__package__ + "._kvcfast", f)
                if spec is None or spec.loader is None:
                    return None
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                return mod
            except (ImportError, OSError):
                return None
    return None


def errbuf(n: int = 512) -> "ctypes.Array[c_char]":
    """A zeroed buffer for kvc_options.errbuf."""
    return (c_char * n)()
