"""bridge/server/looplag.py: the event loop's lag probe, its arithmetic on virtual time and its /metrics figures."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.server.looplag import LAG_BOUNDS_US, SUMMARY_EVERY_NS, LagMeter, LoopLagMonitor
from bridge.server.metrics import BridgeMetrics
from tests.support import virtual_time

event_loop_policy = virtual_time.policy_fixture()
MS = 1_000_000


def test_each_probe_is_bucketed_by_its_lateness_and_rearmed_from_when_it_fired() -> None:
    meter = LagMeter(interval_ns=20 * MS, late_ns=5 * MS, bounds_us=(1_000, 5_000, 20_000))
    t = 1_000 * MS
    assert meter.start(t) == t + 20 * MS
    # on time, early (a timer's rounding: on time), 1 ms (the bound: its bucket), 5 ms (not late: the bound),
    # 5 ms + 1 ns (late), 60 ms (over the last bound)
    for lag in (0, -700_000, 1 * MS, 5 * MS, 5 * MS + 1, 60 * MS):
        fired_at = meter.due + lag
        assert meter.fired(fired_at) == fired_at + 20 * MS  # no catch-up burst after a stall
    assert meter.buckets == [3, 1, 1, 1]
    assert meter.probes == 6 and meter.late == 2
    assert meter.sum_ns == (1 + 5 + 5 + 60) * MS + 1
    assert meter.max_ns == 60 * MS


def test_a_non_positive_interval_is_refused() -> None:
    with pytest.raises(ValueError):
        LagMeter(interval_ns=0)


async def test_the_monitor_sees_a_callback_that_holds_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, virtual_time.VirtualTimeLoop)
    monitor = LoopLagMonitor(clock=loop.clock)
    monitor.start(loop)
    await asyncio.sleep(1.01)  # 50 probes on an idle loop, none late
    assert monitor.meter.probes == 50 and monitor.meter.late == 0 and monitor.meter.max_ns < 1_000  # float s

    def hold(ns: int) -> None:  # a callback that runs `ns` (virtual time moves only here)
        loop.now_ns += ns

    loop.call_later(0.005, hold, 30 * MS)  # a 30 ms callback: the probe due in it is late by up to 30 ms
    loop.call_later(0.505, hold, 2 * MS)  # 2 ms: seen (it overlaps a deadline), not late
    await asyncio.sleep(1.0)
    assert monitor.meter.late == 1
    assert 10 * MS < monitor.meter.max_ns <= 30 * MS
    with caplog.at_level(logging.WARNING, logger="parlora.looplag"):
        await asyncio.sleep(SUMMARY_EVERY_NS / 1e9)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["event loop held"]
    monitor.stop()
    probes = monitor.meter.probes
    await asyncio.sleep(1.0)
    assert monitor.meter.probes == probes  # stopped


def test_the_probe_is_a_histogram_counter_and_gauge_on_metrics() -> None:
    m = BridgeMetrics()
    families = {f.name: f for f in text_string_to_metric_families(m.render().decode())}
    assert families["parlora_loop_lag_seconds"].type == "histogram"  # present before the probe runs
    meter = LagMeter()
    meter.start(0)
    for lag in (0, 3 * MS, 7 * MS, 400 * MS):
        meter.fired(meter.due + lag)
    m.loop_lag.meter = meter
    samples = {
        (s.name, s.labels.get("le")): s.value
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
        if s.name.startswith("parlora_loop_lag")
    }
    assert samples[("parlora_loop_lag_seconds_bucket", "0.001")] == 1
    assert samples[("parlora_loop_lag_seconds_bucket", "0.005")] == 2  # cumulative
    assert samples[("parlora_loop_lag_seconds_bucket", "0.01")] == 3
    assert samples[("parlora_loop_lag_seconds_bucket", "0.25")] == 3
    assert samples[("parlora_loop_lag_seconds_bucket", "+Inf")] == 4
    assert samples[("parlora_loop_lag_seconds_count", None)] == 4
    assert samples[("parlora_loop_lag_seconds_sum", None)] == pytest.approx(0.410)
    assert samples[("parlora_loop_lag_late_total", None)] == 2
    assert samples[("parlora_loop_lag_max_seconds", None)] == pytest.approx(0.4)
    assert len(LAG_BOUNDS_US) + 1 == len(meter.buckets)
