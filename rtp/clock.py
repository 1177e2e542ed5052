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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from rtp.audio import FRAME_MS
from rtp.pacer import MediaClock

log = logging.getLogger("parlora.rtp.clock")

FRAME_NS = FRAME_MS * 1_000_000
Clock = Callable[[], int]


class MediaChannel(Protocol):
    def on_slots(self, now: int, due: int, skipped: int) -> None:
        """Skip `skipped` slots, then serve `due` slots (normally 0 and 1) at `now`."""
        ...


class MediaClockShell:
    """One `loop.call_at` timer for all channels, driven by the `rtp.pacer.MediaClock` core."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        clock: Clock,
        *,
        period_ns: int = FRAME_NS,
        max_catch_up: int = 2,
    ) -> None:
        self._loop = loop
        self._clock = clock
        self.period_ns = period_ns
        self.max_catch_up = max_catch_up
        self._channels: dict[int, MediaChannel] = {}
        self._handle: asyncio.TimerHandle | None = None
        self.core: MediaClock | None = None
        self.channel_errors = 0
        self.wakeups = 0

    @property
    def running(self) -> bool:
        return self.core is not None

    @property
    def channels(self) -> int:
        return len(self._channels)

    def next_deadline(self) -> int | None:
        return self.core.next_deadline() if self.core is not None else None

    def add(self, channel: MediaChannel) -> None:
        """Serve `channel` from the next slot on (the clock starts with its first channel)."""
        self._channels[id(channel)] = channel
        if self.core is None:
            now = self._clock()
            self.core = MediaClock(now, period_ns=self.period_ns, max_catch_up=self.max_catch_up)
            self.core.tick(now)  # slot 0 is now: the first frame goes out one period from here
            self._arm()

    def remove(self, channel: MediaChannel) -> None:
        self._channels.pop(id(channel), None)
        if not self._channels:
            self.stop()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self.core = None

    def stats(self) -> dict[str, int]:
        core = self.core
        return {
            "channels": len(self._channels),
            "timers": 1 if self._handle is not None else 0,
            "wakeups": self.wakeups,
            "slots_served": core.slots_served if core else 0,
            "slots_skipped": core.slots_skipped if core else 0,
            "late_ticks": core.late_ticks if core else 0,
            "max_lateness_us": core.max_lateness_ns // 1000 if core else 0,
            "channel_errors": self.channel_errors,
        }

    def _arm(self) -> None:
        assert self.core is not None
        delay = max(0, self.core.next_deadline() - self._clock()) / 1e9
        self._handle = self._loop.call_at(self._loop.time() + delay, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self.wakeups += 1
        self.run_due(self._clock())
        if self.core is not None and self._channels:
            self._arm()

    def run_due(self, now: int) -> int:
        """Serve what the core says is due at `now`; returns the slots served. The timer calls this; tests
        call it on virtual time."""
        core = self.core
        if core is None:
            return 0
        tick = core.tick(now)
        if tick.due == 0:  # woke early against the injected clock (the loop's clock is coarser)
            return 0
        for channel in list(self._channels.values()):
            try:
                channel.on_slots(now, tick.due, tick.skipped)
            except Exception:
                self.channel_errors += 1
                log.exception("media channel failed; removed from the clock")
                self._channels.pop(id(channel), None)
        return tick.due
