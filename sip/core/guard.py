"""The digest guesser's brake, sans-I/O: failures of inbound digest authentication counted per source address
and per user, across every challenged method (INVITE, BYE, INFO, UPDATE, ... — whatever `sip.core.policy` checks),
with a back-off and a temporary ban. `sip.core.policy.InboundPolicy` asks it before and tells it after every digest
check; it reads no clock (`now` is monotonic ns) and keeps bounded state.

The rules (`GuardConfig`; the numbers are what a carrier-facing SBC ships, fail2ban's asterisk jail and
Kamailio's pike module are of this order):
- A failure is a wrong digest response, an unknown user, a nonce we did not make, a replayed nc (sip.core.auth's
  `AuthFailed`). A request without credentials (every caller's first INVITE) and a right answer on an old
  nonce (stale=true) are not failures.
- Back-off: from the `backoff_after`-th failure (2) of a source within `window_s` (60 s), that source's next
  digest check waits `backoff_s` (1 s), doubling with each further failure (1, 2, 4 s). A challenged request
  that comes sooner is dropped unanswered and *unchecked*: a right password sent during the back-off is not
  accepted either (it is not even looked at), so the answer never tells a right guess from a wrong one
  faster than the back-off allows. A phone that mistyped retransmits (RFC 3261 Timer A/E) and gets through
  once the wait is over.
- Ban: `ban_after` failures (5) of a source within `window_s` ban it for `ban_s` (10 min); each further ban
  of the same source within `remember_s` (24 h) of the last one doubles, up to `max_ban_s` (24 h). While
  banned, every out-of-dialog request of that source, whatever its method, is dropped silently. Dropping,
  not 403: a 403 tells the scanner it was noticed and that someone listens, and costs an answer per request;
  silence makes its tools wait for their time-outs (svcrack gives up after 10 s of silence), as an SBC's
  blacklist or fail2ban's DROP does. A guesser gets 5 guesses in ~7 s, then one more round of 5 per ban
  (10, 20, 40 min ...): under 50 guesses a day.
- Per user: `user_ban_after` failures (20) naming one user within `window_s`, from any number of sources
  (a distributed guesser), guard that user for `ban_s` (doubling as above): requests naming it are dropped
  unchecked, except from a source that authenticated as that user within `trust_s` (1 h), so a guesser
  cannot lock the real trunk out by guessing from elsewhere. The per-user limit is higher than the
  per-source one because many sources share it (every phone of an office behind one user is still below it).
- Keyed by address, as an SBC's blacklist is: phones behind one NAT share their fate, and a trunk whose
  password is wrong (changed at one end only) is banned like a guesser; its calls fail either way, and once
  its credentials are right it waits out the ban (10 min the first time). The numbers are not operator
  options yet: `GuardConfig` is the place for them.
- Memory: at most `max_entries` (10,000) records per table (sources, users, bans, trusted pairs), least
  recently touched evicted first; a record whose failures have left the window, whose back-off and ban are
  over and whose ban level is older than `remember_s` expires and is swept as it is met. Bans live in a table
  of their own, so a flood of spoofed sources cannot push a banned source out of the failure table to free it.
  Usernames are kept to 64 characters.
- One log line per ban (INFO, logger "parlora.sip"): source, user, failures and the ban's length; never the
  password, the nonce or the response hash. `bans` counts bans by scope ("source", "user") for the metrics.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Literal, TypeVar

from rtp.units import NS_PER_S

__all__ = ["AuthGuard", "GuardConfig", "Hold"]

log = logging.getLogger("parlora.sip")
MAX_USER = 64  # characters of a username kept (peer input)

Hold = Literal["banned", "backoff", "user_banned"]
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """The numbers of the module docstring. `ban_after` 0 turns the guard off."""

    ban_after: int = 5
    window_s: float = 60.0
    ban_s: float = 600.0
    max_ban_s: float = 86_400.0
    backoff_after: int = 2
    backoff_s: float = 1.0
    user_ban_after: int = 20
    remember_s: float = 86_400.0
    trust_s: float = 3_600.0
    max_entries: int = 10_000


class _Count:
    __slots__ = ("failures", "next_check")

    def __init__(self, limit: int) -> None:
        self.failures: deque[int] = deque(maxlen=max(1, limit))  # times of the latest failures
        self.next_check = 0  # the back-off: no digest check before this


class _Ban:
    __slots__ = ("until", "level", "at")

    def __init__(self) -> None:
        self.until = 0
        self.level = 0  # bans so far (the next one lasts ban_s * 2**level)
        self.at = 0  # when the last one began


def _bounded(table: OrderedDict[str, _V], max_entries: int) -> None:
    while len(table) > max_entries:
        table.popitem(last=False)


class _Ledger:
    """Failure counts and bans of one kind of key (source addresses or usernames)."""

    __slots__ = ("scope", "limit", "backoff_after", "counts", "bans")

    def __init__(self, scope: str, limit: int, backoff_after: int) -> None:
        self.scope = scope
        self.limit = limit
        self.backoff_after = backoff_after  # 0: no back-off
        self.counts: OrderedDict[str, _Count] = OrderedDict()
        self.bans: OrderedDict[str, _Ban] = OrderedDict()


class AuthGuard:
    """See the module docstring. `hold` before a digest check, `failed`/`succeeded` after it."""

    def __init__(self, config: GuardConfig | None = None) -> None:
        self.config = c = config or GuardConfig()
        self._window = int(c.window_s * NS_PER_S)
        self._remember = int(c.remember_s * NS_PER_S)
        self._trust_ns = int(c.trust_s * NS_PER_S)
        self._sources = _Ledger("source", c.ban_after, c.backoff_after)
        self._users = _Ledger("user", c.user_ban_after, 0)
        self._trusted: OrderedDict[str, int] = OrderedDict()  # "source user" → last success
        self.bans: Counter[str] = Counter()  # bans begun, by scope

    @property
    def enabled(self) -> bool:
        return self.config.ban_after > 0

    def entries(self) -> int:
        """Records held, every table together (what `max_entries` bounds, four times over)."""
        tables = (self._sources, self._users)
        return len(self._trusted) + sum(len(t.counts) + len(t.bans) for t in tables)

    def banned(self, source: str, now: int) -> bool:
        """Whether `source` is banned now (every request of it is dropped)."""
        if not self.enabled:
            return False
        ban = self._sources.bans.get(source)
        return ban is not None and now < ban.until

    def hold(self, source: str, user: str | None, now: int) -> Hold | None:
        """Whether a challenged request of `source` naming `user` (None: no credentials) must be dropped
        unchecked: the source is banned or backing off, or the user is guarded against this source."""
        if not self.enabled:
            return None
        if self.banned(source, now):
            return "banned"
        count = self._sources.counts.get(source)
        if count is not None and now < count.next_check:
            return "backoff"
        if user is not None:
            user = user[:MAX_USER]
            ban = self._users.bans.get(user)
            if ban is not None and now < ban.until and not self._is_trusted(source, user, now):
                return "user_banned"
        return None

    def failed(self, source: str, user: str | None, now: int) -> None:
        """A digest check of `source` (naming `user`) failed: count it, back off, ban."""
        if not self.enabled:
            return
        name = user[:MAX_USER] if user is not None else None
        self._count(self._sources, source, source, name, now)
        if name is not None and self.config.user_ban_after > 0:
            self._count(self._users, name, source, name, now)

    def succeeded(self, source: str, user: str, now: int) -> None:
        """A digest check of `source` as `user` passed: that source may use that user while it is guarded."""
        if not self.enabled:
            return
        key = f"{source} {user[:MAX_USER]}"
        self._trusted[key] = now
        self._trusted.move_to_end(key)
        while self._trusted:  # sweep the oldest while they are out of date, then bound
            oldest, at = next(iter(self._trusted.items()))
            if now - at <= self._trust_ns:
                break
            del self._trusted[oldest]
        _bounded(self._trusted, self.config.max_entries)

    # --- inside ---

    def _is_trusted(self, source: str, user: str, now: int) -> bool:
        at = self._trusted.get(f"{source} {user}")
        return at is not None and now - at <= self._trust_ns

    def _count(self, ledger: _Ledger, key: str, source: str, user: str | None, now: int) -> None:
        c = self.config
        self._sweep(ledger, now)
        count = ledger.counts.get(key)
        if count is None:
            count = ledger.counts[key] = _Count(ledger.limit)
        ledger.counts.move_to_end(key)
        _bounded(ledger.counts, c.max_entries)
        failures = count.failures
        failures.append(now)
        while failures and now - failures[0] >= self._window:
            failures.popleft()
        n = len(failures)
        if n >= ledger.limit:
            self._ban(ledger, key, source, user, n, now)
            failures.clear()
            count.next_check = 0
        elif ledger.backoff_after and n >= ledger.backoff_after:
            wait = c.backoff_s * 2 ** (n - ledger.backoff_after)
            count.next_check = now + int(wait * NS_PER_S)

    def _ban(self, ledger: _Ledger, key: str, source: str, user: str | None, n: int, now: int) -> None:
        c = self.config
        ban = ledger.bans.get(key)
        if ban is None or now - ban.at > self._remember:
            ban = ledger.bans[key] = _Ban()
        ledger.bans.move_to_end(key)
        _bounded(ledger.bans, c.max_entries)
        seconds = min(c.max_ban_s, c.ban_s * 2**ban.level)
        ban.until = now + int(seconds * NS_PER_S)
        ban.at = now
        ban.level += 1
        self.bans[ledger.scope] += 1
        shown = "-" if user is None else user.encode("unicode_escape").decode("ascii")
        if ledger.scope == "source":
            what, other = f"source {source}", f"last user {shown!r}"
        else:
            what, other = f"user {shown!r}", f"last source {source}"
        log.info(
            "digest auth: %s banned for %d s after %d failures within %g s (ban %d, %s); dropped unanswered",
            what,
            seconds,
            n,
            c.window_s,
            ban.level,
            other,
        )

    def _sweep(self, ledger: _Ledger, now: int) -> None:
        """Drop the least recently touched records of `ledger` while they have expired (a few per call)."""
        for _ in range(4):
            if not ledger.counts:
                break
            key, count = next(iter(ledger.counts.items()))
            last = count.failures[-1] if count.failures else 0
            if now - last < self._window or now < count.next_check:
                break
            del ledger.counts[key]
        for _ in range(4):
            if not ledger.bans:
                break
            key, ban = next(iter(ledger.bans.items()))
            if now < ban.until or now - ban.at <= self._remember:
                break
            del ledger.bans[key]
