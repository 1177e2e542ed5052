"""RTP never stops: every late tick of the media clock gets a cause (rtp/clock.py).

On virtual time: the wall clock, the CPU clock and the collector's stamps are all injected, the loop is a
stand-in that never runs its timer, and every tick is a `run_due(now)` call. With 10 phases 2 ms apart, slot n of
phase k is due at t0 + k·2 ms + n·20 ms (the k-th channel added at t0 joins phase k; phase 0's slot 0 is t0 itself,
served as it starts, and `warm_phases` serves the other phases' on time); the clock's lateness threshold is 5 ms,
its severe one 20 ms."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.server.metrics import BridgeMetrics
from bridge.server.observe import CallObserver
from rtp.clock import FRAME_NS, LATE_CAUSES, MediaClockShell
from rtp.units import NS_PER_MS as MS
from sip.engine import EngineFeatures

T0 = 1_000_000_000


class Clocks:
    """Wall and CPU time of a process on virtual time: `run(ms)` is work on the CPU, `wait(ms)` is time off it."""

    def __init__(self) -> None:
        self.wall = T0
        self.cpu = 0

    def run(self, ms: float) -> None:
        self.wall += int(ms * MS)
        self.cpu += int(ms * MS)

    def wait(self, ms: float) -> None:
        self.wall += int(ms * MS)

    def to(self, wall: int) -> None:
        """Idle (off the CPU) until `wall`."""
        assert wall >= self.wall
        self.wall = wall


class _Handle:
    def cancel(self) -> None:
        pass


class _Loop:
    def time(self) -> float:
        return 0.0

    def call_at(self, when: float, callback: Any) -> _Handle:
        return _Handle()


class Quick:
    def on_slots(self, now: int, due: int, skipped: int) -> None:
        pass


class Slow:
    """A channel whose slot takes `ms` of CPU (and, with `collect_ms`, a collection of that long inside it)."""

    def __init__(self, clocks: Clocks, media: MediaClockShell, ms: float, collect_ms: float = 0.0) -> None:
        self.clocks, self.media, self.ms, self.collect_ms = clocks, media, ms, collect_ms

    def on_slots(self, now: int, due: int, skipped: int) -> None:
        self.clocks.run(self.ms)
        if self.collect_ms:
            collect(self.clocks, self.media, 1, self.collect_ms)


def collect(clocks: Clocks, media: MediaClockShell, gen: int, ms: float, cpu: bool = True) -> None:
    """A collection of generation `gen` taking `ms` (on the CPU, or, with cpu=False, preempted all along)."""
    media.gc_watch("start", {"generation": gen})
    (clocks.run if cpu else clocks.wait)(ms)
    media.gc_watch("stop", {"generation": gen, "collected": 0, "uncollectable": 0})


def deadline(slot: int, phase: int = 0) -> int:
    """Slot `slot` of phase `phase` (10 phases 2 ms apart; with one phase, phase 0's)."""
    return T0 + phase * 2 * MS + slot * FRAME_NS


def shell(clocks: Clocks, channels: list[Any] | None = None, phases: int = 1, **kw: Any) -> MediaClockShell:
    """A clock on `clocks` with `channels` (the k-th in phase k), by default one quick channel and one phase."""
    media = MediaClockShell(
        cast(asyncio.AbstractEventLoop, _Loop()),
        lambda: clocks.wall,
        phases=phases,
        cpu_clock=lambda: clocks.cpu,
        watch_gc=kw.pop("watch_gc", False),
        **kw,
    )
    for channel in channels if channels is not None else [Quick()]:
        media.add(channel)
    return media


def tick(clocks: Clocks, media: MediaClockShell, at: int) -> None:
    clocks.to(at)
    media.run_due(at)


def late(media: MediaClockShell) -> dict[str, int]:
    stats = media.stats()
    return {cause: stats[f"late_ticks_{cause}"] for cause in LATE_CAUSES}


def only(cause: str, count: int) -> dict[str, int]:
    return dict.fromkeys(LATE_CAUSES, 0) | {cause: count}


NONE = dict.fromkeys(LATE_CAUSES, 0)


def warm_phases(clocks: Clocks, media: MediaClockShell) -> None:
    """Phases 1-9's slot 0, each 1 ms after its deadline (its own run): phase 0's slot 1 is next."""
    for phase in range(1, 10):
        tick(clocks, media, deadline(0, phase) + MS)


def warm(clocks: Clocks, media: MediaClockShell) -> int:
    """One on-time tick (1 ms after slot 1, the timer's slack); returns the next deadline, 19 ms away."""
    tick(clocks, media, deadline(1) + MS)
    return deadline(2)


def test_on_time_ticks_and_a_long_idle_wait_before_the_deadline_count_no_late_tick() -> None:
    clocks = Clocks()
    media = shell(clocks, [Quick() for _ in range(10)], phases=10)
    warm_phases(clocks, media)
    for slot in range(1, 4):
        for phase in range(10):
            tick(clocks, media, deadline(slot, phase) + MS + 200_000)  # the timer's slack and a little
    assert late(media) == NONE
    media = shell(clocks := Clocks())
    for slot in range(1, 4):
        tick(clocks, media, deadline(slot) + MS)
    clocks.to(deadline(4) - 2 * MS)  # idle 17 ms, off the CPU: the loop waited for the timer
    tick(clocks, media, deadline(4) + 4 * MS)  # 4 ms late, off the CPU: under the threshold
    assert late(media) == NONE
    assert media.stats()["late_threshold_us"] == 5_000


def test_own_a_previous_run_that_overran_the_next_phases_deadlines() -> None:
    clocks = Clocks()
    media = shell(clocks, [], phases=10)
    media.add(Slow(clocks, media, 9.0))  # phase 0's only channel: its slot takes 9 ms of CPU
    for _ in range(9):
        media.add(Quick())
    warm_phases(clocks, media)
    tick(clocks, media, deadline(1) + MS)  # phase 0 runs from 1 ms to 10 ms past its deadline
    media.run_due(clocks.wall)  # phases 1-5 (due 2, 4, 6, 8 and 10 ms after phase 0): 8, 6, 4, 2, 0 ms late
    stats = media.stats()
    assert late(media) == only("own", 2)
    assert stats["late_max_us_own"] == 8_000 and stats["late_ticks_20ms_own"] == 0
    assert stats["late_own_worst_run_us"] == 9_000 and stats["late_own_worst_channels"] == 1
    assert stats["late_own_worst_phase"] == 0
    assert stats["late_spent_ms_own"] == 8


def test_gc_a_collection_past_the_deadline_is_counted_with_its_generation() -> None:
    clocks = Clocks()
    media = shell(clocks)
    due = warm(clocks, media)
    clocks.to(due - MS)  # idle, then a callback sets off a gen-2 collection of 30 ms
    collect(clocks, media, 2, 30.0)
    media.run_due(clocks.wall)  # 29 ms late
    stats = media.stats()
    assert late(media) == only("gc", 1)
    assert (
        stats["late_ticks_gc_gen2"] == 1 and stats["late_ticks_gc_gen0"] == stats["late_ticks_gc_gen1"] == 0
    )
    assert stats["late_ticks_20ms_gc"] == 1 and stats["late_max_us_gc"] == 29_000
    assert (
        stats["gc_collections_gen2"] == 1 and stats["gc_max_us_gen2"] == 30_000 and stats["gc_ms_gen2"] == 30
    )
    assert stats["gc_max_cpu_us_gen2"] == 30_000  # all of it on the CPU


def test_gc_a_collection_that_ended_before_the_deadline_explains_nothing() -> None:
    clocks = Clocks()
    media = shell(clocks)
    due = warm(clocks, media)
    clocks.to(due - 15 * MS)
    collect(clocks, media, 2, 10.0)  # over 5 ms before the deadline
    clocks.run(20.0)  # then another callback holds the loop 15 ms past it
    media.run_due(clocks.wall)
    assert late(media) == only("loop", 1)
    assert media.stats()["late_spent_ms_gc"] == 0


def test_gc_a_collection_inside_the_previous_run_is_the_collectors_not_the_clocks_own() -> None:
    clocks = Clocks()
    media = shell(clocks, [], phases=10)
    media.add(Slow(clocks, media, 0.5, collect_ms=12.0))  # 0.5 ms of own work, then a 12 ms gen-1 collection
    for _ in range(9):
        media.add(Quick())
    warm_phases(clocks, media)
    tick(clocks, media, deadline(1) + MS)
    media.run_due(clocks.wall)  # phases 1-4 later than 5 ms (11.5, 9.5, 7.5 and 5.5)
    stats = media.stats()
    assert late(media) == only("gc", 4)
    assert stats["late_ticks_gc_gen1"] == 4


def test_loop_another_callback_on_the_cpu_past_the_deadline() -> None:
    clocks = Clocks()
    media = shell(clocks)
    due = warm(clocks, media)
    clocks.to(due - 3 * MS)
    clocks.run(33.0)  # e.g. a session's coroutine: on the CPU, no collection
    media.run_due(clocks.wall)
    stats = media.stats()
    assert late(media) == only("loop", 1)
    assert stats["late_max_us_loop"] == 30_000 and stats["late_ticks_20ms_loop"] == 1
    assert stats["late_spent_ms_loop"] == 29  # 30 ms less the timer's 1 ms of slack


def test_unscheduled_the_kernel_ran_something_else_over_the_deadline() -> None:
    clocks = Clocks()
    media = shell(clocks)
    due = warm(clocks, media)
    clocks.to(due + 30 * MS)  # no CPU time for us: the timer was due, the kernel did not run us
    media.run_due(clocks.wall)
    assert late(media) == only("unscheduled", 1)
    assert media.stats()["late_max_us_unscheduled"] == 30_000


def test_unscheduled_a_preempted_collection_is_the_kernels_time_not_the_collectors() -> None:
    clocks = Clocks()
    media = shell(clocks)
    due = warm(clocks, media)
    clocks.to(due - MS)
    collect(clocks, media, 0, 30.0, cpu=False)  # the collection's wall time, all of it off the CPU
    media.run_due(clocks.wall)
    assert late(media) == only("unscheduled", 1)
    stats = media.stats()
    assert stats["gc_max_us_gen0"] == 30_000 and stats["gc_max_cpu_us_gen0"] == 0


def test_unscheduled_a_run_preempted_in_the_middle_is_not_its_own_work() -> None:
    clocks = Clocks()

    class Preempted:
        def on_slots(self, now: int, due: int, skipped: int) -> None:
            clocks.run(0.5)
            clocks.wait(10.0)  # the kernel took the CPU away mid-run

    media = shell(clocks, [Preempted(), *(Quick() for _ in range(9))], phases=10)
    warm_phases(clocks, media)
    tick(clocks, media, deadline(1) + MS)
    media.run_due(clocks.wall)  # phases 1-3: 9.5, 7.5 and 5.5 ms late
    assert late(media) == only("unscheduled", 3)


def test_a_slow_run_reads_the_cpu_clock_at_its_end_a_quick_one_does_not() -> None:
    clocks = Clocks()
    reads: list[int] = []

    def cpu() -> int:
        reads.append(clocks.cpu)
        return clocks.cpu

    media = MediaClockShell(
        cast(asyncio.AbstractEventLoop, _Loop()),
        lambda: clocks.wall,
        phases=10,
        cpu_clock=cpu,
        watch_gc=False,
    )
    media.add(Slow(clocks, media, 2.0))
    media.add(Quick())
    tick(clocks, media, deadline(0, 1) + MS)
    reads.clear()
    tick(clocks, media, deadline(1) + MS)  # phase 0's 2 ms run: at its start and end
    assert len(reads) == 2
    tick(clocks, media, deadline(1, 1) + 2 * MS)  # phase 1's quick run: at its start only
    assert len(reads) == 3


def test_the_real_collector_is_watched_only_while_the_clock_runs() -> None:
    clocks = Clocks()
    media = shell(clocks, watch_gc=True)
    try:
        assert media.gc_watch in gc.callbacks
        before = media.stats()["gc_collections_gen2"]
        gc.collect()
        assert media.stats()["gc_collections_gen2"] == before + 1
        assert media.stats()["gc_heap_blocks_at_gen2"] > 1000  # this process's heap, about an object a block
    finally:
        media.stop()
    assert media.gc_watch not in gc.callbacks


def test_one_summary_line_a_minute_at_most(caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    media = shell(clocks)
    caplog.set_level(logging.INFO, logger="parlora.rtp.clock")
    for slot in range(2, 40):  # a tick 8 ms late every period for 0.76 s
        tick(clocks, media, deadline(slot) + 8 * MS)
    assert late(media) == only("unscheduled", 38)
    assert len([r for r in caplog.records if "phase ticks late" in r.getMessage()]) == 1
    tick(clocks, media, clocks.wall + 61_000 * MS)
    lines = [r.getMessage() for r in caplog.records if "phase ticks late" in r.getMessage()]
    assert len(lines) == 2 and "by unscheduled" in lines[-1]


def test_the_metrics_count_late_ticks_by_cause_from_the_engines_counters() -> None:
    class Engine:
        features = EngineFeatures(counters=True)

        def __init__(self) -> None:
            self.counters: dict[str, int] = {}

        def stats(self) -> dict[str, int]:
            return dict(self.counters)

    obs, engine = CallObserver(BridgeMetrics()), Engine()
    engine.counters = {"clock_late_ticks_gc": 3, "clock_late_ticks_own": 1, "clock_late_ticks_20ms_gc": 2}
    obs.scrape(engine)
    engine.counters.update({"clock_late_ticks_gc": 5, "clock_late_ticks_unscheduled": 4})
    obs.scrape(engine)
    value = obs.metrics.registry.get_sample_value
    assert value("parlora_media_clock_late_ticks_total", {"cause": "gc"}) == 5
    assert value("parlora_media_clock_late_ticks_total", {"cause": "own"}) == 1
    assert value("parlora_media_clock_late_ticks_total", {"cause": "unscheduled"}) == 4
    assert value("parlora_media_clock_late_ticks_total", {"cause": "loop"}) is None


@settings(max_examples=300, deadline=None)
@given(
    idle=st.floats(0, 18),
    busy=st.floats(0, 40),
    off=st.floats(0, 40),
    collecting=st.floats(0, 40),
)
def test_a_late_tick_is_counted_once_under_one_cause_and_the_split_is_its_lateness_less_the_slack(
    idle: float, busy: float, off: float, collecting: float
) -> None:
    clocks = Clocks()
    media = shell(clocks)
    due = warm(clocks, media)
    clocks.wait(idle)  # before the deadline: the loop waited for its timer
    clocks.run(busy)
    clocks.wait(off)
    collect(clocks, media, 2, collecting)
    lateness = clocks.wall - due
    media.run_due(clocks.wall)
    counted = late(media)
    stats = media.stats()
    if lateness <= 5 * MS:
        assert counted == NONE
        return
    assert sum(counted.values()) == 1
    spent_ms = sum(stats[f"late_spent_ms_{c}"] for c in LATE_CAUSES)
    assert lateness // MS - 1 - 4 <= spent_ms <= lateness // MS  # all but the 1 ms slack; 4 floors to ms
    if busy == 0 and collecting == 0:  # no CPU time at all: the kernel did not run us
        assert counted == only("unscheduled", 1)
    if off == 0 and collecting == 0:  # on the CPU all along past the deadline, no collection
        assert counted == only("loop", 1)
