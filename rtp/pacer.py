"""The media clock core: one process-wide 20 ms tick on absolute deadlines (DESIGN §3 principle 2).

Slot n is due at `t0 + n * period`; the shell sleeps until `next_deadline()` (never "20 ms from now", so
wake-up latency does not accumulate into drift) and calls `tick(now)`, which says which slots are due. One
timer serves every call: on each tick the shell asks every stream for `due` frames.

After a late wake-up several slots may have passed. At most `max_catch_up` of them are served, the newest
ones, sent back to back, so a short stall (up to 40 ms by default) is bridged without audible loss and the
receiver's jitter buffer absorbs the burst; older ones are skipped and counted (`slots_skipped`), so a long
stall never turns into a burst of stale audio. Streams advance their RTP timestamps over skipped slots
(`RtpStream.skip`), keeping media time equal to wall time.

Wake-up lateness (now minus the deadline of the first slot that came due) is kept as a running maximum and
a count of ticks later than `late_threshold_ns` (2 ms), for the pacing figures in status and the bench.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Tick", "MediaClock"]


class Tick(NamedTuple):
    """What a `tick(now)` found due: serve slots `first .. first + due - 1`; `skipped` older ones were given up."""

    first: int
    due: int
    skipped: int


_NOTHING = Tick(0, 0, 0)


class MediaClock:
    """Absolute-deadline pacing: slot n at t0 + n * period_ns."""

    __slots__ = (
        "t0",
        "period_ns",
        "max_catch_up",
        "late_threshold_ns",
        "_next",
        "ticks",
        "slots_served",
        "slots_skipped",
        "late_ticks",
        "max_lateness_ns",
        "last_lateness_ns",
    )

    def __init__(
        self,
        t0: int,
        *,
        period_ns: int = 20_000_000,
        max_catch_up: int = 2,
        late_threshold_ns: int = 2_000_000,
    ) -> None:
        if period_ns <= 0 or max_catch_up < 1:
            raise ValueError("period_ns must be positive and max_catch_up at least 1")
        self.t0 = t0
        self.period_ns = period_ns
        self.max_catch_up = max_catch_up
        self.late_threshold_ns = late_threshold_ns
        self._next = 0  # the next slot not yet served or skipped
        self.ticks = 0
        self.slots_served = 0
        self.slots_skipped = 0
        self.late_ticks = 0
        self.max_lateness_ns = 0
        self.last_lateness_ns = 0  # of the latest tick that had a slot due

    @property
    def next_slot(self) -> int:
        return self._next

    def deadline(self, slot: int) -> int:
        return self.t0 + slot * self.period_ns

    def next_deadline(self) -> int:
        """When the shell must call `tick` next (absolute, monotonic ns)."""
        return self.t0 + self._next * self.period_ns

    def slot_at(self, now: int) -> int:
        """The slot whose period contains `now` (for a stream joining the clock)."""
        return (now - self.t0) // self.period_ns

    def tick(self, now: int) -> Tick:
        """The slots due at `now`. A call before the next deadline returns `due == 0`."""
        first_deadline = self.t0 + self._next * self.period_ns
        if now < first_deadline:
            return _NOTHING
        self.ticks += 1
        lateness = self.last_lateness_ns = now - first_deadline
        if lateness > self.max_lateness_ns:
            self.max_lateness_ns = lateness
        if lateness > self.late_threshold_ns:
            self.late_ticks += 1
        passed = (now - self.t0) // self.period_ns + 1 - self._next  # slots whose deadline is <= now
        due = passed if passed <= self.max_catch_up else self.max_catch_up
        skipped = passed - due
        first = self._next + skipped
        self._next += passed
        self.slots_served += due
        self.slots_skipped += skipped
        return Tick(first, due, skipped)
