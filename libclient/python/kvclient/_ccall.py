# SPDX-License-Identifier: MIT
"""What the modules of the binding share: the limits of kvclient.h, the
exception for a C return value, the fork generation, argument checks and
conversions (labels, extra bytes, CUDA streams and events), request stages.
"""
from __future__ import annotations

import array
import errno as _errno
import os
from typing import Any

from . import _buffers as _b
from . import _lib as _L
from .errors import InvalidArgumentError, KvcError, TooBigError, error_class


#: Limits of kvclient.h: KVC_MAX_LABEL (bytes of UTF-8), KVC_MAX_TOKENS,
#: KVC_MAX_EXTRA (bytes).
MAX_LABEL = 23
MAX_TOKENS = 1 << 22
MAX_EXTRA = 4096

# Bumped in a child after fork (os.register_at_fork), like the C library's
# own generation: a page view of an inherited Client is refused here, as
# every C call on it is refused there.
_fork_gen = [0]


def _after_fork_in_child() -> None:
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


def _u(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{name} {v}: must be {lo}..{hi}")
    return v


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
            h = getattr(event, "cuda_event")
        return h
    raise TypeError(f"an event must be None, an int (cudaEvent_t) or a torch.cuda.Event, "
                    f"not {type(event).__name__}")


_U32 = _b._U32
_array = array.array
_I64 = _b._I64
_new_request = object.__new__

# Request stages (the C library's, plus released).
_NEW, _LOOKED_UP, _ALLOCATED, _PUBLISHED, _RELEASED = 0, 1, 2, 3, 4
