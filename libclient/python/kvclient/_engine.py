# SPDX-License-Identifier: MIT
"""What the engine adapters (kvclient.vllm, kvclient.sglang) share: a
Client that is opened when kvcached is there, dropped when it goes, and
reopened at most once a second, so that kvcached being away never fails an
engine's request. Not public API."""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from .client import Client, Model
from .errors import GeometryError, KvcError

log = logging.getLogger("kvclient.engines")

RECONNECT_S = 1.0


def flag(extra: dict, key: str) -> bool:
    """A yes/no key of an engine's extra config: true, "true", "yes", "1" or
    1 for yes; absent, false, "false", "no", "0" or 0 for no; else
    ValueError naming the key."""
    v = extra.get(key, False)
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "yes", "1", "false", "no", "0"):
        return v.lower() in ("true", "yes", "1")
    raise ValueError(f"{key} {v!r}: must be true or false")


def read_only(who: str, e: Exception) -> None:
    """The daemon refused an allocation because this client's tenant is
    no-insert (NoInsertError): said once, then the adapter stops saving."""
    log.info("%s: kvcached makes this engine's tenant no-insert: it reads the cache and "
             "saves nothing (%s)", who, e)


class Reconnecting:
    """A Client of `model` at `socket`, or None while kvcached is away.

    ``on_open(client)`` runs on every (re)opened Client before it is used
    (the adapters check the engine's buffers against it there). Nothing
    here raises: a daemon that refuses the model (GeometryError, with its
    reason) or an on_open that refuses the Client is logged as an error
    and treated as kvcached being away, since an engine's request must
    never fail because of kvcached. The adapters check what they can of
    the configuration when they are built, and raise there."""

    def __init__(self, model: Model, socket: Optional[str], salt: bytes | str = b"",
                 on_open: Optional[Callable[[Client], None]] = None, who: str = "kvcached",
                 no_insert: bool = False):
        self.model, self.socket, self.salt = model, socket, salt
        self.no_insert = no_insert
        self.on_open, self.who = on_open, who
        self.c: Optional[Client] = None
        self.on_drop: Optional[Callable[[], None]] = None
        self._next_try = 0.0

    def get(self) -> Optional[Client]:
        c = self.c
        if c is not None:
            if c.connected():
                return c
            self.drop("the daemon closed the connection")
        now = time.monotonic()
        if now < self._next_try:
            return None
        self._next_try = now + RECONNECT_S
        try:
            c = Client(self.model, socket=self.socket, salt=self.salt,
                       no_insert=self.no_insert)
        except GeometryError as e:
            log.error("%s: kvcached refuses %r, going on without it: %s", self.who,
                      self.model.name, e)
            return None
        except KvcError as e:
            log.warning("%s: kvcached unreachable, going on without it: %s", self.who, e)
            return None
        if self.on_open is not None:
            try:
                self.on_open(c)
            except (ValueError, KvcError) as e:
                c.close()
                log.error("%s: cannot use kvcached, going on without it: %s", self.who, e)
                return None
        self.c = c
        return c

    def drop(self, why: str) -> None:
        """Forget the Client (kvcached went away or refused): log, close."""
        log.warning("%s: %s; going on without kvcached", self.who, why)
        c, self.c = self.c, None
        if self.on_drop is not None:
            self.on_drop()
        if c is not None:
            try:
                c.close()
            except KvcError:
                pass

    def close(self) -> None:
        c, self.c = self.c, None
        if c is not None:
            c.close()
