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


class Reconnecting:
    """A Client of `model` at `socket`, or None while kvcached is away.

    ``on_open(client)`` runs on every (re)opened Client before it is used
    (the adapters check the engine's buffers against it there). A
    GeometryError is a configuration error, not an absence: it raises
    ValueError with the daemon's reason."""

    def __init__(self, model: Model, socket: Optional[str], salt: bytes | str = b"",
                 on_open: Optional[Callable[[Client], None]] = None, who: str = "kvcached"):
        self.model, self.socket, self.salt = model, socket, salt
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
            c = Client(self.model, socket=self.socket, salt=self.salt)
        except GeometryError as e:
            raise ValueError(f"{self.who}: {e}") from e
        except KvcError as e:
            log.warning("%s: kvcached unreachable, going on without it: %s", self.who, e)
            return None
        if self.on_open is not None:
            try:
                self.on_open(c)
            except BaseException:
                c.close()
                raise
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
