# SPDX-License-Identifier: MIT
"""Exceptions: one class per failure the C library reports, by its errno.

Every call that fails raises a subclass of :class:`KvcError`, which is an
:class:`OSError`: ``e.errno`` is the positive errno the library returned,
``e.strerror`` its text (``kvc_strerror``) with what the binding knows
(which call, and for a refused connection the daemon's own reason), and
``e.reason`` the daemon's reason alone (or ``None``). Classes also derive
from the built-in exception a Python programmer would catch for the same
thing (``ConnectionError``, ``PermissionError``, ``ValueError``,
``MemoryError``), so either kind of ``except`` works.

No call of this package ever returns a negative number for an error.
"""
from __future__ import annotations

import errno as _e
from typing import Any


class KvcError(OSError):
    """Base of every error of this package."""

    def __init__(self, err: int, message: str, reason: str | None = None) -> None:
        super().__init__(err, message)
        self.reason = reason

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.errno, self.strerror, self.reason))


class KvcWarning(UserWarning):
    """What a call that succeeded has to say (``warnings.warn``): the
    daemon's warning when a Client opens, for now that the model's pages
    fill at most half of the pool's (kvc_open's errbuf on success). The
    Client keeps the text in ``Client.warning``."""


class NoDaemonError(KvcError, ConnectionError):
    """No kvcached listens at the socket path (ENOENT, ECONNREFUSED)."""


class NotTrustedError(KvcError, PermissionError):
    """The daemon does not trust this user (allow-users / allow-groups), or
    the socket file's mode keeps this user out (EACCES)."""


class UntrustedDaemonError(KvcError, ConnectionError):
    """This process refused the daemon: it runs as a user that is not this
    one, root, the kvcached service user or $KVCACHED_DAEMON_USER, or the
    per-user socket folder is not this user's own (EKEYREJECTED)."""


class ProtocolError(KvcError):
    """The daemon speaks another protocol or segment version, or sent a reply
    that does not parse (EPROTO, EBADMSG)."""


class GeometryError(KvcError, ValueError):
    """The model's geometry does not fit the daemon's pool: block tokens
    differ, or a page is larger than a pool page (EMEDIUMTYPE)."""


class TooManyClientsError(KvcError):
    """The daemon has max-clients clients already (EUSERS)."""


class TooManyModelsError(KvcError):
    """64 models with clients attached already (ETOOMANYREFS)."""


class ConnectionLostError(KvcError, ConnectionError):
    """The connection to the daemon ended; the Client is dead (ENOTCONN).
    Pages pinned before stay readable until their requests are released."""


class ForkedHandleError(KvcError):
    """A Client opened by another process (the parent of a fork) was used:
    open a new Client in this process (ECHILD)."""


class NoSpaceError(KvcError):
    """No free pages or pin slots: the pool is full of pinned pages, or
    this Client's pin quota (max_pins) is used up (ENOSPC)."""


class QuotaError(KvcError):
    """This process, its tenant or its namespace holds its share of the pool
    already, pinned or being written (the daemon's max-share, a tenant's or
    a namespace's share; the message names which): release requests first
    (EDQUOT)."""


class NoInsertError(KvcError, PermissionError):
    """A no-insert Client (``no_insert=True``, or a tenant the daemon's
    config makes no-insert) reads the cache and never publishes: alloc()
    refuses, with the reason (EROFS)."""


class InFlightError(KvcError):
    """alloc() of a single-flight request (one that waited) found its first
    missed block being written by another client since: nothing was
    granted; wait() for it, then alloc() again (EINPROGRESS)."""


class KeyCollisionError(KvcError):
    """A different block holds this block's key; it was refused (EEXIST)."""


class NotSupportedError(KvcError):
    """Not possible here: a cuda pool without CUDA in the library or a
    usable driver, or a page view of a pool in GPU memory (ENOTSUP)."""


class NoDeviceError(KvcError):
    """The GPU of the daemon's cuda pool is not visible to this process
    (ENODEV): check CUDA_VISIBLE_DEVICES."""


class InvalidArgumentError(KvcError, ValueError):
    """An argument the library refused (EINVAL, ENAMETOOLONG)."""


class TooBigError(KvcError, ValueError):
    """A prompt over KVC_MAX_TOKENS, extra keys over KVC_MAX_EXTRA, a label
    too long (E2BIG)."""


class OutOfMemoryError(KvcError, MemoryError):
    """The library could not allocate memory (ENOMEM)."""


class NoPageError(KvcError, LookupError):
    """A block of the run has no page: not a hit and not granted (ENOENT)."""


class NoPinError(KvcError, LookupError):
    """unpin() of a pin that is not there: ended, expired, or another
    tenant's or namespace's (ENOENT)."""


class ReadOnlyBlockError(KvcError, PermissionError):
    """Scatter into a block that is a hit or already published: its page is
    shared and read-only (EPERM)."""


class RequestStateError(InvalidArgumentError):
    """A request call out of order: lookup twice, publish before alloc or
    twice, alloc after publish (EINVAL)."""


class RequestReleasedError(RequestStateError):
    """The request was released (its ``with`` block ended, or release() or
    its Client's close() ran): its pins and pages are gone."""


class ClientClosedError(KvcError):
    """The Client was closed (EBADF)."""


class TensorError(InvalidArgumentError):
    """A tensor, array or id list that does not match the model or the
    request: wrong shape, dtype, strides or length. Raised before any copy."""


class TensorDeviceError(TensorError):
    """A tensor in the wrong memory for the pool: not CPU memory for a host
    pool, not on the pool's GPU for a cuda pool. Raised before any copy."""


class DeviceMemoryError(TensorDeviceError):
    """GPU copies: a tensor is not GPU memory CUDA knows (EFAULT)."""


class WrongDeviceError(TensorDeviceError):
    """GPU copies: a tensor is on another GPU than the one copying (EXDEV)."""


# One class per row of libclient/client.c's errors[] (kvc_strerror's
# table), by its errno; tests/python/test_error_table.py checks both ways.
_BY_ERRNO = {
    _e.ENOENT: NoDaemonError,
    _e.ECONNREFUSED: NoDaemonError,
    _e.EACCES: NotTrustedError,
    _e.EKEYREJECTED: UntrustedDaemonError,
    _e.EDQUOT: QuotaError,
    _e.EROFS: NoInsertError,
    _e.EINPROGRESS: InFlightError,
    _e.EPROTO: ProtocolError,
    _e.EBADMSG: ProtocolError,
    _e.EMEDIUMTYPE: GeometryError,
    _e.EUSERS: TooManyClientsError,
    _e.ETOOMANYREFS: TooManyModelsError,
    _e.ENOTCONN: ConnectionLostError,
    _e.ECHILD: ForkedHandleError,
    _e.ENOSPC: NoSpaceError,
    _e.EEXIST: KeyCollisionError,
    _e.ENOTSUP: NotSupportedError,
    _e.ENODEV: NoDeviceError,
    _e.EINVAL: InvalidArgumentError,
    _e.ENAMETOOLONG: InvalidArgumentError,
    _e.E2BIG: TooBigError,
    _e.ENOMEM: OutOfMemoryError,
    _e.EPERM: ReadOnlyBlockError,
    _e.EFAULT: DeviceMemoryError,
    _e.EXDEV: WrongDeviceError,
    _e.EBADF: ClientClosedError,
}

# Errnos of the map the C library never returns: the binding raises them.
_BINDING_ONLY = {_e.EBADF}

# Calls on blocks: ENOENT there means "no page", not "no daemon".
_BLOCK_CALLS = {"kvc_gather", "kvc_scatter", "kvc_gather_v2", "kvc_scatter_v2",
                "kvc_block_page"}


def error_class(err: int, call: str = "") -> type:
    """The class for positive errno ``err`` returned by C function ``call``."""
    if err == _e.ENOENT and call in _BLOCK_CALLS:
        return NoPageError
    if err == _e.ENOENT and call == "kvc_unpin":
        return NoPinError
    if err == _e.EOPNOTSUPP:
        return NotSupportedError
    return _BY_ERRNO.get(err, KvcError)
