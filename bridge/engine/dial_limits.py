"""How fast and how many calls the bridge places through one trunk: calls per second, calls at once, and the
queue of dials that wait for either (sans-I/O: every call takes `now`, monotonic ns).

A carrier caps what an account may place: calls per second (CPS; 1 is a common default on SIP trunks, and an
INVITE over the cap is answered 503 or 403, or silently counted against the account) and concurrent calls (the
channels bought). A dial over either limit waits in the trunk's queue, in order, rather than being sent to be
refused. The rules:

- CPS is a token bucket of `burst` tokens refilled at `cps` a second: a dial takes one token when it starts.
  `burst` is 1 by default, so dials are spaced 1/cps apart: a carrier counts calls in a sliding second, and a
  burst that fits a bucket of several can still exceed it.
- A dial holds one of `max_calls` from its start until the application's call ends (`ended`): ringing counts, a
  carrier's channel is taken at the INVITE.
- A dial that cannot start waits in a first-in, first-out queue of at most `max_queued` dials for at most
  `max_wait_ms`; past either it is refused (`queue_full`, `queue_timeout`) and nothing is sent. The first in the
  queue goes first: a later dial never overtakes one that waits (a fair trunk, and the order an operator sees).
- `None` for `cps` or `max_calls` means no such limit (a PBX on the LAN).

`DialLimits.request` answers `Start` (send the INVITE now) or `Wait` (a ticket); `handle_timer` answers the tickets
that may start now, and those refused for their wait. Each trunk's limits are kept by its name (`None`: the calls
that go direct, through no trunk). Counted for `/metrics`: started, queued, refused by reason.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from rtp.units import NS_PER_MS, NS_PER_S


@dataclass(frozen=True, slots=True)
class TrunkLimits:
    """One trunk's limits (module docstring); the defaults limit nothing but the queue."""

    cps: float | None = None
    burst: int = 1
    max_calls: int | None = None
    max_queued: int = 100
    max_wait_ms: int = 30_000

    def __post_init__(self) -> None:
        if self.cps is not None and not self.cps > 0:
            raise ValueError(f"cps must be positive, got {self.cps}")
        if self.burst < 1:
            raise ValueError(f"burst must be at least 1, got {self.burst}")
        if self.max_calls is not None and self.max_calls < 1:
            raise ValueError(f"max_calls must be at least 1, got {self.max_calls}")
        if self.max_queued < 0 or self.max_wait_ms < 0:
            raise ValueError("max_queued and max_wait_ms must not be negative")


@dataclass(frozen=True, slots=True)
class Start:
    """Send the dial's INVITE now (`ticket` names it, for `ended`)."""

    ticket: int


@dataclass(frozen=True, slots=True)
class Wait:
    """The dial waits in its trunk's queue; `handle_timer` will answer `Start` or `Refused` for `ticket`."""

    ticket: int
    position: int  # 1: first in the queue


@dataclass(frozen=True, slots=True)
class Refused:
    """The dial is refused before anything is sent: `queue_full` or `queue_timeout`."""

    ticket: int
    reason: str
    trunk: str | None


Answer = Start | Wait | Refused


class _Trunk:
    __slots__ = ("limits", "tokens", "filled_at", "active", "queue")

    def __init__(self, limits: TrunkLimits, now: int) -> None:
        self.limits = limits
        self.tokens = float(limits.burst)
        self.filled_at = now
        self.active = 0
        self.queue: deque[tuple[int, int]] = deque()  # (ticket, refused at)

    def refill(self, now: int) -> None:
        cps = self.limits.cps
        if cps is not None and now > self.filled_at:
            self.tokens = min(float(self.limits.burst), self.tokens + (now - self.filled_at) * cps / NS_PER_S)
        self.filled_at = now

    def may_start(self) -> bool:
        limits = self.limits
        if limits.max_calls is not None and self.active >= limits.max_calls:
            return False
        return limits.cps is None or self.tokens >= 1.0

    def start(self) -> None:
        self.active += 1
        if self.limits.cps is not None:
            self.tokens -= 1.0

    def token_at(self) -> int | None:
        """When the next token is whole (None: no CPS limit, or one is already)."""
        cps = self.limits.cps
        if cps is None or self.tokens >= 1.0:
            return None
        return self.filled_at + int((1.0 - self.tokens) * NS_PER_S / cps) + 1


class DialLimits:
    """Every trunk's limits and queue (module docstring)."""

    def __init__(self, limits: dict[str | None, TrunkLimits], default: TrunkLimits | None = None) -> None:
        self._limits = dict(limits)
        self._default = default or TrunkLimits()
        self._trunks: dict[str | None, _Trunk] = {}
        self._of: dict[int, str | None] = {}  # a started or waiting ticket's trunk
        self._next = 0
        self.counts: Counter[str] = Counter()  # started, queued, refused_queue_full, refused_queue_timeout

    def _trunk(self, name: str | None, now: int) -> _Trunk:
        trunk = self._trunks.get(name)
        if trunk is None:
            trunk = self._trunks[name] = _Trunk(self._limits.get(name, self._default), now)
        return trunk

    def request(self, trunk_name: str | None, now: int) -> Answer:
        """A dial through `trunk_name` asks to start."""
        self._next += 1
        ticket = self._next
        trunk = self._trunk(trunk_name, now)
        trunk.refill(now)
        if not trunk.queue and trunk.may_start():  # nobody waits before it
            trunk.start()
            self._of[ticket] = trunk_name
            self.counts["started"] += 1
            return Start(ticket)
        if len(trunk.queue) >= trunk.limits.max_queued:
            self.counts["refused_queue_full"] += 1
            return Refused(ticket, "queue_full", trunk_name)
        trunk.queue.append((ticket, now + trunk.limits.max_wait_ms * NS_PER_MS))
        self._of[ticket] = trunk_name
        self.counts["queued"] += 1
        return Wait(ticket, len(trunk.queue))

    def ended(self, ticket: int, now: int) -> list[Answer]:
        """The call of a started `ticket` ended (or its INVITE failed): its place is free; the dials that may start
        now are answered, as `handle_timer` would. An unknown or waiting ticket's end is a withdrawal."""
        if ticket not in self._of:
            return []
        trunk = self._trunks[self._of.pop(ticket)]
        for i, (waiting, _) in enumerate(trunk.queue):
            if waiting == ticket:  # withdrawn while it waited
                del trunk.queue[i]
                return []
        trunk.active -= 1
        return self.handle_timer(now)

    def handle_timer(self, now: int) -> list[Answer]:
        """The dials that may start now (in each trunk's order), and those whose wait is over."""
        out: list[Answer] = []
        for name, trunk in self._trunks.items():
            queue = trunk.queue
            if not queue:
                continue
            trunk.refill(now)
            while queue and trunk.may_start():
                ticket, _ = queue.popleft()
                trunk.start()
                self.counts["started"] += 1
                out.append(Start(ticket))
            while queue and queue[0][1] <= now:
                ticket, _ = queue.popleft()
                self._of.pop(ticket, None)
                self.counts["refused_queue_timeout"] += 1
                out.append(Refused(ticket, "queue_timeout", name))
        return out

    def next_deadline(self) -> int | None:
        """The soonest instant a waiting dial may start (a token) or must be refused (its wait)."""
        soonest: int | None = None
        for trunk in self._trunks.values():
            if not trunk.queue:
                continue
            for at in (trunk.queue[0][1], trunk.token_at()):
                if at is not None and (soonest is None or at < soonest):
                    soonest = at
        return soonest

    def waiting(self, trunk_name: str | None) -> int:
        trunk = self._trunks.get(trunk_name)
        return len(trunk.queue) if trunk is not None else 0

    def active(self, trunk_name: str | None) -> int:
        trunk = self._trunks.get(trunk_name)
        return trunk.active if trunk is not None else 0
