# SPDX-License-Identifier: MIT
"""What the engine adapters (kvclient.vllm, kvclient.sglang) share: a
Client that is opened when kvcached is there, dropped when it goes, and
reopened at most once a second, so that kvcached being away never fails an
engine's request. Not public API.

The engine's log hears of a change of state once: kvcached unreachable
(and why), refused (and why), back; each line after the first says how
many calls went on without kvcached since the last one. A state that
lasts is repeated at most every REMIND_S seconds, with its count. The
daemon's warning at open (Client.warning) is logged once per text."""
from __future__ import annotations

import hashlib
import logging
import time
from typing import Callable, Optional

from .client import Client
from .model import Model
from .errors import GeometryError, KvcError

log = logging.getLogger("kvclient.engines")

RECONNECT_S = 1.0
REMIND_S = 600.0

# The clock the retries and reminders follow (tests drive it).
clock = time.monotonic

_UP, _AWAY, _REFUSED = "up", "away", "refused"


def namespace_name(model: str, dtype: str, suffix: str = "") -> str:
    """The namespace's name both adapters give a model: the model (the
    engine's model and revision, or the extra config's model_name), "/",
    the KV dtype (the namespace knows the dtype's size only: float16 and
    bfloat16 KV stay apart by name), and a suffix. Names longer than a
    namespace's 63 bytes keep 50 and end in a digest of the whole."""
    name = f"{model}/{dtype}{suffix}"
    b = name.encode()
    if len(b) > 63:
        name = b[:50].decode("utf-8", "ignore") + "~" + hashlib.sha256(b).hexdigest()[:12]
    return name


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


def read_only(who: str, e: Exception, logger: Optional[logging.Logger] = None) -> None:
    """The daemon refused an allocation because this client's tenant is
    no-insert (NoInsertError): said once (in the adapter's log), then the
    adapter stops saving."""
    (logger or log).info("%s: kvcached makes this engine's tenant no-insert: it reads the cache and "
             "saves nothing (%s)", who, e)


class Reconnecting:
    """A Client of `model` at `socket`, or None while kvcached is away.

    ``on_open(client)`` runs on every (re)opened Client before it is used
    (the adapters check the engine's buffers against it there). Nothing
    here raises: a daemon that refuses the model (GeometryError, with its
    reason) or an on_open that refuses the Client is logged as an error
    and treated as kvcached being away, since an engine's request must
    never fail because of kvcached. The adapters check what they can of
    the configuration when they are built, and raise there. ``logger``:
    where the state changes go (the adapter's, so that they reach the
    engine's log)."""

    def __init__(self, model: Model, socket: Optional[str], salt: bytes | str = b"",
                 on_open: Optional[Callable[[Client], None]] = None, who: str = "kvcached",
                 logger: Optional[logging.Logger] = None, no_insert: bool = False) -> None:
        self.model, self.socket, self.salt = model, socket, salt
        self.no_insert = no_insert
        self.on_open, self.who = on_open, who
        self.log = logger or log
        self.c: Optional[Client] = None
        self.on_drop: Optional[Callable[[], None]] = None
        self._next_try = 0.0
        self._state: Optional[str] = None	# None until the first try
        self._why = ""				# the reason logged for _state
        self._since = 0.0			# when _state was last logged
        self._without = 0			# calls without kvcached since then
        self._warned = ""			# the last Client.warning logged

    def _where(self) -> str:
        return f"at {self.socket}" if self.socket else "at the default socket"

    def _enter(self, state: str, key: str, text: str, level: int) -> None:
        """Log a change of state once (key: what makes it another one: the
        error's kind, the refusal's reason); a state that lasts is said
        again every REMIND_S seconds. Each line after the first counts the
        calls that went on without kvcached since the one before."""
        now = clock()
        same = state == self._state and key == self._why
        if same and now - self._since < REMIND_S:
            return
        if state == _AWAY and self._state == _AWAY and self._why == "lost":
            self._why = key		# the reopen after a loss failing: no news
            return
        n, self._without = self._without, 0
        if self._state is not None and self._state != _UP:
            text += (f" ({'still; ' if same else ''}{n} call{'s' if n != 1 else ''} went on "
                     f"without kvcached in {now - self._since:.0f} s)")
        self.log.log(level, "%s: %s", self.who, text)
        self._state, self._why, self._since = state, key, now

    def _failed(self, state: str, key: str, text: str) -> None:
        """This call goes on without kvcached, in state (counted after the
        line, which counts the calls of the state before)."""
        self._enter(state, key, text + ", going on without it",
                    logging.WARNING if state == _AWAY else logging.ERROR)
        self._without += 1

    def get(self) -> Optional[Client]:
        c = self.c
        if c is not None:
            if c.connected():
                return c
            self.drop("the daemon closed the connection")
        now = clock()
        if now < self._next_try:
            self._without += 1
            return None
        self._next_try = now + RECONNECT_S
        try:
            c = Client(self.model, socket=self.socket, salt=self.salt, warn=False,
                       no_insert=self.no_insert)
        except GeometryError as e:
            self._failed(_REFUSED, str(e), f"kvcached refuses {self.model.name!r}: {e.strerror}")
            return None
        except KvcError as e:	# its text names the socket
            self._failed(_AWAY, type(e).__name__, f"kvcached unreachable: {e.strerror}")
            return None
        if self.on_open is not None:
            try:
                self.on_open(c)
            except (ValueError, KvcError) as e:
                c.close()
                self._failed(_REFUSED, str(e), f"cannot use kvcached {self._where()}: {e}")
                return None
        self.c = c
        if self._state is None:
            self._state = _UP
        elif self._state != _UP:	# a warning, next to the one it ends
            self._enter(_UP, "", f"kvcached {self._where()} back", logging.WARNING)
        if c.warning and c.warning != self._warned:
            self._warned = c.warning
            self.log.warning("%s: kvcached: %s", self.who, c.warning)
        return c

    def drop(self, why: str) -> None:
        """Forget the Client (kvcached went away or refused): log once, close."""
        self._next_try = 0.0
        self._enter(_AWAY, "lost", f"kvcached {self._where()} lost ({why}), going on "
                    "without it", logging.WARNING)
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
