# SPDX-License-Identifier: MIT
"""kvclient: kvcached from Python, over libkvclient with ctypes.

kvcached is a host-local KV-cache service for LLM inference: serving
processes on one machine share the KV of common prompt prefixes through a
pool of pages in shared memory. This package is a thin layer over the C
library (kvclient.h): the same calls, the same costs, Python types.

    import kvclient

    model = kvclient.Model("llama-3-8b@main/bf16", "bfloat16", layers=32,
                           kv_heads=8, head_dim=128, block_tokens=16)
    with kvclient.Client(model) as c:
        kv = kvclient.PagedKV(c, kv_caches)        # vLLM FlashAttention layout
        with c.request(prompt_ids) as r:
            hits = r.lookup()
            r.gather(kv, block_table[:hits])
            ...                                    # prefill the rest
            got = r.alloc()
            r.scatter(kv, block_table[hits:hits + got])
            r.publish()

Only the standard library is needed; numpy and torch are used when present
(page views, tensors as tokens, gather/scatter targets). The library is
found through $KVCLIENT_LIB, the copy a `pip install` put next to this
file, the directory `make install` put it in, or the dynamic linker
(libkvclient.so.0), and loaded on first use.
See docs/PYTHON.md.
"""
from __future__ import annotations

from . import _lib
from .client import Client
from .model import Model, PosKind
from .paged_kv import PagedKV
from .request import Request
from .errors import (ClientClosedError, ConnectionLostError, DeviceMemoryError,
                     ForkedHandleError, GeometryError, InFlightError, InvalidArgumentError,
                     KeyCollisionError,
                     KvcError, KvcWarning, NoDaemonError, NoDeviceError, NoInsertError,
                     NoPageError, NoPinError, NoSpaceError,
                     NotSupportedError, NotTrustedError, OutOfMemoryError, ProtocolError,
                     QuotaError, ReadOnlyBlockError, RequestReleasedError, RequestStateError,
                     TensorDeviceError, TensorError, TooBigError, TooManyClientsError,
                     TooManyModelsError, UntrustedDaemonError, WrongDeviceError)

LibraryNotFound = _lib.LibraryNotFound

# The release this package belongs to (KVC_VERSION_STRING of kvclient.h).
__version__ = "0.2.0"

__all__ = [
    "Client", "Model", "PagedKV", "PosKind", "Request", "version", "version_info",
    "library_path", "LibraryNotFound",
    "KvcError", "KvcWarning", "ClientClosedError", "ConnectionLostError", "DeviceMemoryError",
    "ForkedHandleError", "GeometryError", "InFlightError", "InvalidArgumentError", "KeyCollisionError",
    "NoDaemonError", "NoDeviceError", "NoInsertError", "NoPageError", "NoPinError",
    "NoSpaceError", "NotSupportedError",
    "NotTrustedError", "OutOfMemoryError", "ProtocolError", "QuotaError", "ReadOnlyBlockError",
    "RequestReleasedError", "RequestStateError", "TensorDeviceError", "TensorError",
    "TooBigError", "TooManyClientsError", "TooManyModelsError", "UntrustedDaemonError",
    "WrongDeviceError",
]


def version() -> str:
    """Version of the libkvclient actually loaded (kvc_version_string)."""
    return _lib.lib().version_string().decode()


def version_info() -> tuple[int, int, int]:
    """(major, minor, patch) of the libkvclient loaded (from kvc_version)."""
    v = _lib.lib().version()
    return (v // 1000000, v // 1000 % 1000, v % 1000)


def library_path() -> str:
    """Path (or soname) of the libkvclient this process loaded."""
    return _lib.lib().path
