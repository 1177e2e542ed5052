"""The process-wide media clock shell: ONE timer for every call, on absolute deadlines t0 + n·20 ms.

DESIGN §3.2: the bridge is the media clock. A timer per call would cost a heap entry and a wake-up per call
per frame (the prototype measured +14 points of a core at 300 calls); one timer walking every active channel
costs one wake-up per 20 ms. The pacing decisions (which slots are due, how many are caught up after a stall,
how many are skipped) are the core's, `rtp.pacer.MediaClock`; this shell only arms `loop.call_at` at the
core's `next_deadline()` and hands each tick to every channel:

    channel.on_slots(now, due, skipped)   # skip `skipped` slots (RTP timestamps advance), then serve `due`

A channel serves a slot by taking the next frame from its Playout, sending it with `sendto`, recording it in
the carrier ledger once `sendto` has returned, and pulling one inbound frame from its jitter buffer
(`sip.native`). A channel that raises is logged and removed; the others go on.

The clock starts with its first channel and stops with the last, so an idle process has no timer at all.

Phases (issue 13, inbound latency): with `phases=G` the period is cut into G evenly spaced phases, phase k's
slot n due at t0 + k·period/G + n·period, and each channel joins the phase that has the fewest channels. A
frame's way from the jitter buffer to the provider's socket takes a few loop iterations (the session's
queues), and in each of them every channel served at the same instant does its share first: with one phase
the last of 300 calls waits for the other 299 at every step (measured: 6.7 ms median, 10.5 ms p99 at 100
calls). G phases cut that queue G-fold. Each channel is still served once per period on absolute deadlines
(its own phase's), so its RTP interval is unchanged; the cost is up to G wake-ups per period instead of one,
and still ONE loop timer at any time (armed at the soonest phase), never a timer per call.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections.abc import Callable
from typing import Protocol

from rtp.audio import FRAME_MS
from rtp.pacer import MediaClock

log = logging.getLogger("parlora.rtp.clock")

FRAME_NS = FRAME_MS * 1_000_000
TIMER_SLACK_NS = 1_000_000  # the loop timer is armed this long after a deadline (uvloop: whole ms; see _arm)
MEDIA_PHASES = 10  # what the native engine runs: phases 2 ms apart (issue 13; tests/bench/README.md)
Clock = Callable[[], int]
# How late a tick came after its deadline, counted per tick (every channel of the phase is served by it):
# upper bounds in µs, the last bucket open. `stats()` gives `lateness_bucket_<µs>` (ticks late by more than
# the bound before and at most this one; not cumulative) and `lateness_bucket_inf`.
LATENESS_BOUNDS_US = (200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 40_000)
_LATENESS_BOUNDS_NS = tuple(us * 1_000 for us in LATENESS_BOUNDS_US)


class MediaChannel(Protocol):
    def on_slots(self, now: int, due: int, skipped: int) -> None:
        """Skip `skipped` slots, then serve `due` slots (normally 0 and 1) at `now`."""
        ...


class MediaClockShell:
    """One `loop.call_at` timer for all channels, driven by one `rtp.pacer.MediaClock` core per phase."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        clock: Clock,
        *,
        period_ns: int = FRAME_NS,
        max_catch_up: int = 2,
        phases: int = 1,
        timer_slack_ns: int = TIMER_SLACK_NS,
    ) -> None:
        if phases < 1 or period_ns // phases < 1:
            raise ValueError("phases must be at least 1 and at most period_ns")
        self._loop = loop
        self._clock = clock
        self.period_ns = period_ns
        self.max_catch_up = max_catch_up
        self.phases = phases
        self.timer_slack_ns = timer_slack_ns
        self.early_wakeups = 0  # the timer fired before any phase was due (re-armed, never served early)
        self._groups: list[dict[int, MediaChannel]] = [{} for _ in range(phases)]
        self._phase_of: dict[int, int] = {}  # id(channel) -> its phase
        self._cores: list[MediaClock | None] = [None] * phases  # None: the phase has no channel
        self._t0: int | None = None  # phase k's slots at t0 + k * period / phases + n * period
        self._handle: asyncio.TimerHandle | None = None
        self._handle_at: int | None = None
        self.channel_errors = 0
        self.wakeups = 0
        # figures of phase cores that stopped (a phase whose last channel left), kept for stats()
        self._gone = [0, 0, 0, 0]  # slots served, slots skipped, late ticks, max lateness ns
        self._lateness = [0] * (len(LATENESS_BOUNDS_US) + 1)  # ticks per lateness bucket

    @property
    def running(self) -> bool:
        return self._t0 is not None

    @property
    def channels(self) -> int:
        return len(self._phase_of)

    @property
    def core(self) -> MediaClock | None:
        """The core of the first phase that has channels (with one phase: the core)."""
        return next((c for c in self._cores if c is not None), None)

    def phase_of(self, channel: MediaChannel) -> int | None:
        return self._phase_of.get(id(channel))

    def phase_sizes(self) -> list[int]:
        return [len(g) for g in self._groups]

    def next_deadline(self) -> int | None:
        due = [c.next_deadline() for c in self._cores if c is not None]
        return min(due) if due else None

    def add(self, channel: MediaChannel) -> None:
        """Serve `channel` from its phase's next slot on, in the phase with the fewest channels (the clock
        starts with its first channel; a phase's first slot is at most one period away)."""
        key = id(channel)
        if key in self._phase_of:
            return
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        sizes = [len(g) for g in self._groups]
        phase = sizes.index(min(sizes))
        self._groups[phase][key] = channel
        self._phase_of[key] = phase
        if self._cores[phase] is None:
            anchor = self._t0 + phase * (self.period_ns // self.phases)
            anchor += (
                (now - anchor) // self.period_ns
            ) * self.period_ns  # the phase's last slot at or before now
            core = MediaClock(anchor, period_ns=self.period_ns, max_catch_up=self.max_catch_up)
            core.tick(now)  # that slot is now or past: the first frame goes out at the next one
            self._cores[phase] = core
        self._arm()

    def remove(self, channel: MediaChannel) -> None:
        phase = self._phase_of.pop(id(channel), None)
        if phase is None:
            return
        group = self._groups[phase]
        group.pop(id(channel), None)
        if not group:
            self._retire(phase)
        if not self._phase_of:
            self.stop()

    def _retire(self, phase: int) -> None:
        core = self._cores[phase]
        if core is not None:
            gone = self._gone
            gone[0] += core.slots_served
            gone[1] += core.slots_skipped
            gone[2] += core.late_ticks
            gone[3] = max(gone[3], core.max_lateness_ns)
        self._cores[phase] = None

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._handle_at = None
        for phase in range(self.phases):
            self._retire(phase)
        for group in self._groups:
            group.clear()
        self._phase_of.clear()
        self._t0 = None

    def stats(self) -> dict[str, int]:
        cores = [c for c in self._cores if c is not None]
        gone = self._gone
        return {
            "channels": len(self._phase_of),
            "phases": self.phases,
            "phases_active": len(cores),
            "timers": 1 if self._handle is not None else 0,
            "wakeups": self.wakeups,
            "early_wakeups": self.early_wakeups,
            "slots_served": gone[0] + sum(c.slots_served for c in cores),
            "slots_skipped": gone[1] + sum(c.slots_skipped for c in cores),
            "late_ticks": gone[2] + sum(c.late_ticks for c in cores),
            "max_lateness_us": max([gone[3], *(c.max_lateness_ns for c in cores)]) // 1000,
            "channel_errors": self.channel_errors,
            **{f"lateness_bucket_{us}": n for us, n in zip(LATENESS_BOUNDS_US, self._lateness, strict=False)},
            "lateness_bucket_inf": self._lateness[-1],
        }

    def _arm(self) -> None:
        """Keep the one loop timer at the soonest phase deadline."""
        due = self.next_deadline()
        if due is None:
            return
        if self._handle is not None:
            if self._handle_at is not None and self._handle_at <= due:
                return
            self._handle.cancel()
        # uvloop's timers count whole milliseconds: armed for the deadline itself, the timer fires up to ~1 ms
        # early, and every re-arm for the sub-millisecond rest fires at once again (measured: 22 wake-ups per
        # slot, 9,600 a second with 10 phases). The slack puts the wake-up just after the deadline instead.
        delay = (max(0, due - self._clock()) + self.timer_slack_ns) / 1e9
        self._handle_at = due
        self._handle = self._loop.call_at(self._loop.time() + delay, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._handle_at = None
        self.wakeups += 1
        if self.run_due(self._clock()) == 0:
            self.early_wakeups += 1
        if self._phase_of:
            self._arm()

    def run_due(self, now: int) -> int:
        """Serve every phase that is due at `now`; returns the slots served (summed over the phases). The timer
        calls this; tests call it on virtual time."""
        served = 0
        for phase, core in enumerate(self._cores):
            if core is None:
                continue
            tick = core.tick(now)
            if tick.due == 0:  # not due yet (or woke early against the injected clock: the loop's is coarser)
                continue
            served += tick.due
            self._lateness[bisect_left(_LATENESS_BOUNDS_NS, core.last_lateness_ns)] += 1
            group = self._groups[phase]
            for key, channel in list(group.items()):
                try:
                    channel.on_slots(now, tick.due, tick.skipped)
                except Exception:
                    self.channel_errors += 1
                    log.exception("media channel failed; removed from the clock")
                    if group.pop(key, None) is not None:
                        self._phase_of.pop(key, None)
            if not group:
                self._retire(phase)
        if not self._phase_of and self._t0 is not None:
            self.stop()
        return served
