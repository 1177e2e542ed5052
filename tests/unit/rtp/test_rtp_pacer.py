"""The media clock: absolute deadlines t0 + n*20 ms, bounded catch-up after a late wake-up."""

import pytest

from rtp.pacer import MediaClock, Tick
from rtp.units import NS_PER_MS as MS


def test_deadlines_are_absolute_and_do_not_drift_with_wake_up_latency() -> None:
    clock = MediaClock(t0=1_000 * MS)
    woke = []
    for n in range(100):
        deadline = clock.next_deadline()
        assert deadline == 1_000 * MS + n * 20 * MS  # never "20 ms after the last wake-up"
        now = deadline + (n % 3) * MS // 2  # every wake-up 0-1 ms late
        woke.append(clock.tick(now))
    assert all(t == Tick(n, 1, 0) for n, t in enumerate(woke))
    assert clock.slots_served == 100 and clock.slots_skipped == 0 and clock.late_ticks == 0
    assert clock.max_lateness_ns == MS


def test_early_wake_up_serves_nothing() -> None:
    clock = MediaClock(t0=0)
    assert clock.tick(0) == Tick(0, 1, 0)
    assert clock.tick(19 * MS) == Tick(0, 0, 0)
    assert clock.next_deadline() == 20 * MS


def test_late_wake_up_catches_up_a_bounded_number_and_skips_the_rest() -> None:
    clock = MediaClock(t0=0, max_catch_up=2)
    clock.tick(0)
    # next deadline 20 ms; we wake at 45 ms: slots 1 and 2 are due (20, 40 ms), both served
    assert clock.tick(45 * MS) == Tick(1, 2, 0)
    assert clock.next_deadline() == 60 * MS
    # a 130 ms stall: slots 3..9 have passed (60..180 ms); the newest two are served, five skipped
    assert clock.tick(190 * MS) == Tick(8, 2, 5)
    assert clock.next_deadline() == 200 * MS
    assert clock.slots_skipped == 5 and clock.slots_served == 5 and clock.late_ticks == 2
    assert clock.max_lateness_ns == 130 * MS


def test_slot_at_and_settings_validation() -> None:
    clock = MediaClock(t0=5 * MS)
    assert clock.slot_at(5 * MS) == 0 and clock.slot_at(24 * MS) == 0 and clock.slot_at(25 * MS) == 1
    assert clock.deadline(3) == 65 * MS
    with pytest.raises(ValueError):
        MediaClock(t0=0, max_catch_up=0)
