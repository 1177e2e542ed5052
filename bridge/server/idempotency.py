"""One key, one call: `POST /calls` with `Idempotency-Key` and `Server.dial(key=...)`.

A client whose answer to `POST /calls` was lost sends it again; without a key that is a second call to the
same person. With a key (the IETF httpapi "Idempotency-Key" header draft, Stripe's semantics):

- The first request with a key places the call; a repeat gets the first call's id (HTTP: the first answer's
  body with 200 rather than 202) and the dialler is not called again.
- A repeat that arrives while the first dial is still in flight waits for it and gets the same call; if the
  first dial fails (a bad number, no engine), every waiter gets the same error and the key is freed: nothing
  was placed, so a retry may place it.
- The same key with a different request (another number, trunk, route, caller id or headers) is refused
  (`KeyReused`, HTTP 422): it is a client bug, and guessing which request was meant could call the wrong
  person.
- A key is 1 to 255 printable ASCII characters (0x21-0x7E and space inside), else `ValueError` (HTTP 400).

Keys are kept 24 h and at most 10,000 of them, the least recently used forgotten first. 24 h covers a
campaign dialler's retry-with-backoff horizon and Stripe's own window; 10,000 is far more than a day of a
trunk's calls at the common 1 CPS (86,400 would be the ceiling at that rate, but a retry comes within
minutes, and 10,000 keys of at most 255 bytes are under 3 MB). These are not operator options: the window
only has to outlast a client's retries, and no operator is better served by a shorter one. A process restart
forgets the keys (a restart also ends every call it placed).

The core is sans-I/O except for the in-flight future: `now` is monotonic ns, passed in.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

from rtp.units import NS_PER_S

KEY_TTL_S = 24 * 3600
MAX_KEYS = 10_000
MAX_KEY_CHARS = 255


class KeyReused(ValueError):
    """The key was used before with a different request (HTTP 422)."""


@dataclass(frozen=True, slots=True)
class Dialled:
    """A dial's outcome: the call id, and whether it is an earlier call returned for a repeated key."""

    call_id: str
    replayed: bool = False


@dataclass(slots=True)
class _Entry:
    fingerprint: Hashable
    expires: int
    result: asyncio.Future[str] = field(repr=False)


def check_key(key: str) -> str:
    """`key` if it is 1 to 255 printable ASCII characters, else ValueError saying what a key is."""
    if not 1 <= len(key) <= MAX_KEY_CHARS or not all(" " <= c <= "~" for c in key):
        raise ValueError(f"an Idempotency-Key is 1 to {MAX_KEY_CHARS} printable ASCII characters")
    return key


class DialKeys:
    """The keys seen in the last `ttl_s`, at most `max_keys`, least recently used forgotten first."""

    def __init__(self, *, ttl_s: float = KEY_TTL_S, max_keys: int = MAX_KEYS) -> None:
        self._ttl = int(ttl_s * NS_PER_S)
        self._max = max_keys
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.replays = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self, now: int) -> None:
        """Forget the expired keys and the least recently used beyond `max_keys`; never one in flight."""
        for key in list(self._entries):
            entry = self._entries[key]
            if len(self._entries) <= self._max and entry.expires > now:
                break
            if entry.result.done():
                del self._entries[key]

    async def once(
        self, key: str, fingerprint: Hashable, now: int, place: Callable[[], Awaitable[str]]
    ) -> Dialled:
        """The call for `key`: `place()`d on its first use, the first call's id on a repeat (waiting for it
        while in flight). KeyReused for the same key with another `fingerprint`; ValueError for a bad key."""
        check_key(key)
        self._expire(now)
        entry = self._entries.get(key)
        if entry is not None and entry.expires <= now and entry.result.done():
            del self._entries[key]
            entry = None
        if entry is not None:
            if entry.fingerprint != fingerprint:
                raise KeyReused(f"Idempotency-Key {key[:40]!r} was used with a different request")
            self._entries.move_to_end(key)
            call_id = await asyncio.shield(entry.result)
            self.replays += 1
            return Dialled(call_id, replayed=True)
        result: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._entries[key] = _Entry(fingerprint, now + self._ttl, result)
        self._expire(now)
        try:
            call_id = await place()
        except BaseException as exc:
            if self._entries.get(key) is not None and self._entries[key].result is result:
                del self._entries[key]  # nothing was placed: a retry may place it
            if isinstance(exc, Exception):
                result.set_exception(exc)
            else:  # the first request was cancelled: its waiters are told, not cancelled themselves
                result.set_exception(
                    RuntimeError("the first request with this Idempotency-Key was cancelled")
                )
            result.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        result.set_result(call_id)
        return Dialled(call_id)
