"""The event loop's lag, always on: a timer that notes how late it fires.

The same loop paces every call's RTP every 20 ms (rtp/clock.py), so any callback that runs longer than a few
milliseconds — a recovery's seeding, the JSON of a large provider event, a TLS handshake, a recording's write,
a collection of the cyclic garbage collector — delays every call's next packet. The media clock attributes its
own late ticks while calls run; this probe watches the loop itself, with or without calls, and is what
`/metrics` shows as

    loop_lag_seconds             histogram of how late the probe fired after its deadline (LAG_BOUNDS_US)
    loop_lag_late_total          probes later than `LAG_LATE_NS` (5 ms: a quarter of a frame)
    loop_lag_max_seconds         the worst lateness since start

The probe fires every `LAG_INTERVAL_NS` (20 ms, one frame): a stall of D ms is seen by a probe with a
probability of about D / 20 ms, so a stall of a frame or more is always seen, a 5 ms one in about one case in
four (the histogram samples the loop; it does not count callbacks). It re-arms from the time it fired, not on
a grid, so a long stall is one late probe, not a burst of catch-up probes.

Measured cost (uvloop, this 2-core VM shared with other work, tests/bench/README.md "The media clock
protected"): a probe's callback and re-arm take ~13 µs, 50 a second: ~0.07 % of a core while calls run (the
media clock wakes the loop every 2 ms anyway; 10 s with and without the probe beside a 2 ms timer differed by
less than the run-to-run noise). On an idle process each probe is also a wake-up from epoll: ~150 µs of CPU
each on the busy VM (~0.7 % of a core), which is what an idle bridge pays to be watched. Nothing here
allocates per probe but the loop's own timer handle; the histogram is read at a scrape
(`bridge/server/metrics.py` `LoopLagCollector`), and at most one warning line a minute says that the loop was
held.

`LagMeter` is the sans-I/O core (virtual time in the unit tests); `LoopLagMonitor` is its shell on a loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections.abc import Callable

log = logging.getLogger("parlora.looplag")

LAG_INTERVAL_NS = 20_000_000  # one frame
LAG_LATE_NS = 5_000_000  # later than this: the loop was held long enough to move a call's packet
# Upper bounds of the lateness buckets in µs, the last bucket open (uvloop's timers count whole milliseconds,
# so a probe is up to ~1 ms late when nothing held the loop).
LAG_BOUNDS_US = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 250_000, 1_000_000)
SUMMARY_EVERY_NS = 60_000_000_000  # at most one warning line a minute


class LagMeter:
    """How late each probe fired after its deadline. `start(now)` and `fired(now)` return the next deadline;
    `buckets[i]` counts the probes late by at most `bounds_ns[i]` (and more than the bound before it; the last
    entry: later than every bound), `late` those later than `late_ns`, `sum_ns` and `max_ns` the total and
    the worst lateness. A probe that fired early (a timer's rounding) counts as on time."""

    __slots__ = (
        "_bounds_ns",
        "buckets",
        "due",
        "interval_ns",
        "late",
        "late_ns",
        "max_ns",
        "probes",
        "sum_ns",
    )

    def __init__(
        self,
        interval_ns: int = LAG_INTERVAL_NS,
        late_ns: int = LAG_LATE_NS,
        bounds_us: tuple[int, ...] = LAG_BOUNDS_US,
    ) -> None:
        if interval_ns <= 0:
            raise ValueError("the probe interval must be positive")
        self.interval_ns = interval_ns
        self.late_ns = late_ns
        self._bounds_ns = tuple(us * 1000 for us in bounds_us)
        self.due = 0
        self.probes = self.late = self.sum_ns = self.max_ns = 0
        self.buckets = [0] * (len(bounds_us) + 1)

    def start(self, now: int) -> int:
        self.due = now + self.interval_ns
        return self.due

    def fired(self, now: int) -> int:
        """The probe ran at `now`: note its lateness; the next deadline, one interval from now."""
        lag = now - self.due
        if lag < 0:
            lag = 0
        self.probes += 1
        self.sum_ns += lag
        if lag > self.max_ns:
            self.max_ns = lag
        if lag > self.late_ns:
            self.late += 1
        self.buckets[bisect_left(self._bounds_ns, lag)] += 1
        self.due = now + self.interval_ns
        return self.due


class LoopLagMonitor:
    """`LagMeter` on a running loop: one timer, re-armed at each firing, until `stop()`. `clock` is the
    monotonic clock in ns (the loop's own timers decide when the probe runs; this clock measures how late)."""

    def __init__(self, meter: LagMeter | None = None, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.meter = meter if meter is not None else LagMeter()
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._summary_at = 0
        self._late_told = 0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        now = self._clock()
        self._summary_at = now + SUMMARY_EVERY_NS
        self._arm(self.meter.start(now), now)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, due: int, now: int) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_at(self._loop.time() + (due - now) / 1e9, self._fire)

    def _fire(self) -> None:
        now = self._clock()
        due = self.meter.fired(now)
        if now >= self._summary_at:
            self._summary(now)
        self._arm(due, now)

    def _summary(self, now: int) -> None:
        self._summary_at = now + SUMMARY_EVERY_NS
        late = self.meter.late - self._late_told
        if late:
            log.warning(
                "event loop held: %d probes more than %d ms late in the last minute (the worst %d ms since "
                "start); every call's RTP waited as long",
                late,
                self.meter.late_ns // 1_000_000,
                self.meter.max_ns // 1_000_000,
            )
        self._late_told = self.meter.late
