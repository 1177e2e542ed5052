"""bridge/server/metrics.py: each recording method shows in the text exposition, parsed back with prometheus-client's
own parser; the registry is the instance's, not the process-global one."""

from __future__ import annotations

import math

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bridge.server.metrics import CONTENT_TYPE, BridgeMetrics


def _samples(m: BridgeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(m: BridgeMetrics, name: str, **labels: str) -> float:
    return _samples(m)[(name, tuple(sorted(labels.items())))]


def test_calls_active_and_total_by_route_and_outcome() -> None:
    m = BridgeMetrics()
    for _ in range(3):
        m.call_started("sales")
    m.call_started("support")
    m.call_ended("sales", "completed")
    m.call_ended("sales", "failed")
    m.call_refused("support", "busy")
    assert _value(m, "parlora_calls_active", route="sales") == 1
    assert _value(m, "parlora_calls_active", route="support") == 1
    assert _value(m, "parlora_calls_total", route="sales", outcome="completed") == 1
    assert _value(m, "parlora_calls_total", route="sales", outcome="failed") == 1
    assert _value(m, "parlora_calls_total", route="support", outcome="busy") == 1


def test_sip_responses_by_code_and_refusals_by_reason() -> None:
    m = BridgeMetrics()
    for code in (100, 200, 200, 503, 42, 700):
        m.sip_response_sent(code)
    m.refused("draining")
    m.refused("draining")
    m.refused("not_allowed")
    assert _value(m, "parlora_sip_responses_sent_total", code="200") == 2
    assert _value(m, "parlora_sip_responses_sent_total", code="503") == 1
    assert _value(m, "parlora_sip_responses_sent_total", code="other") == 2  # out of range: one bounded label
    assert _value(m, "parlora_refusals_total", reason="draining") == 2
    assert _value(m, "parlora_refusals_total", reason="not_allowed") == 1


def test_rtp_counters_add_batches() -> None:
    m = BridgeMetrics()
    m.rtp(received=50, sent=49, lost=1)
    m.rtp(received=50, sent=50, late=2, concealed=3)
    assert _value(m, "parlora_rtp_packets_total", direction="in") == 100
    assert _value(m, "parlora_rtp_packets_total", direction="out") == 99
    assert _value(m, "parlora_rtp_packets_lost_total") == 1
    assert _value(m, "parlora_rtp_packets_late_total") == 2
    assert _value(m, "parlora_rtp_frames_concealed_total") == 3
    with pytest.raises(ValueError):
        m.rtp(received=-1)


def test_jitter_and_pacing_histograms_bucket_their_samples() -> None:
    m = BridgeMetrics()
    m.jitter([0.004, 0.015, 0.5])
    m.pacing([0.0001, 0.0003, 0.003, -0.001])  # early counts as on time
    assert _value(m, "parlora_rtp_jitter_seconds_bucket", le="0.005") == 1
    assert _value(m, "parlora_rtp_jitter_seconds_bucket", le="0.02") == 2
    assert _value(m, "parlora_rtp_jitter_seconds_bucket", le="+Inf") == 3
    assert _value(m, "parlora_rtp_jitter_seconds_count") == 3
    assert math.isclose(_value(m, "parlora_rtp_jitter_seconds_sum"), 0.519)
    assert _value(m, "parlora_pacing_lateness_seconds_bucket", le="0.0002") == 2
    assert _value(m, "parlora_pacing_lateness_seconds_bucket", le="0.005") == 4
    assert math.isclose(_value(m, "parlora_pacing_lateness_seconds_sum"), 0.0034)


def test_provider_recovery_rollover_discontinuity() -> None:
    m = BridgeMetrics()
    m.provider_connected("gemini-live", 0.8)
    m.recovery("output_stale", "recovered", 1.2)
    m.recovery("output_stale", "failed", 5.0)
    m.recovery("transport_lost", "recovered", 0.4)
    m.rollover("completed")
    m.rollover("refused")
    m.discontinuity("in", "voice_transport_recovery")
    m.discontinuity("out", "output_stale")
    assert _value(m, "parlora_provider_connect_seconds_bucket", provider="gemini-live", le="0.75") == 0
    assert _value(m, "parlora_provider_connect_seconds_bucket", provider="gemini-live", le="1.0") == 1
    assert _value(m, "parlora_recoveries_total", cause="output_stale", outcome="recovered") == 1
    assert _value(m, "parlora_recoveries_total", cause="output_stale", outcome="failed") == 1
    assert _value(m, "parlora_recovery_duration_seconds_count", cause="output_stale") == 2
    assert _value(m, "parlora_recovery_duration_seconds_bucket", cause="output_stale", le="5.0") == 2
    assert _value(m, "parlora_recovery_duration_seconds_bucket", cause="transport_lost", le="0.5") == 1
    assert _value(m, "parlora_rollovers_total", outcome="completed") == 1
    assert _value(m, "parlora_rollovers_total", outcome="refused") == 1
    assert (
        _value(m, "parlora_audio_discontinuities_total", direction="in", cause="voice_transport_recovery")
        == 1
    )
    assert _value(m, "parlora_audio_discontinuities_total", direction="out", cause="output_stale") == 1


def test_jobs_by_outcome_and_duration() -> None:
    m = BridgeMetrics()
    m.job("completed", 0.3)
    m.job("completed", 2.0)
    m.job("timeout", 30.0)
    assert _value(m, "parlora_jobs_total", outcome="completed") == 2
    assert _value(m, "parlora_jobs_total", outcome="timeout") == 1
    assert _value(m, "parlora_job_duration_seconds_bucket", le="0.5") == 1
    assert _value(m, "parlora_job_duration_seconds_count") == 3


def test_registration_state_is_one_hot_per_trunk() -> None:
    m = BridgeMetrics()
    m.registration("pbx", "registering")
    m.registration("pbx", "registered")
    m.registration("carrier", "failed")
    states = {
        s: _value(m, "parlora_registrations", trunk="pbx", state=s)
        for s in ("unregistered", "registering", "registered", "failed")
    }
    assert states == {"unregistered": 0, "registering": 0, "registered": 1, "failed": 0}
    assert _value(m, "parlora_registrations", trunk="carrier", state="failed") == 1
    assert _value(m, "parlora_registrations", trunk="carrier", state="registered") == 0


def test_each_instance_has_its_own_registry_and_the_global_one_stays_clean() -> None:
    a, b = BridgeMetrics(), BridgeMetrics()
    a.call_started("r")
    assert _value(a, "parlora_calls_active", route="r") == 1
    assert ("parlora_calls_active", (("route", "r"),)) not in _samples(b)
    assert not any(name.startswith("parlora_") for name in REGISTRY._names_to_collectors)


def test_render_is_the_text_format_with_help_and_type() -> None:
    m = BridgeMetrics()
    text = m.render().decode()
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")
    names = {f.name: f.type for f in text_string_to_metric_families(text)}
    expected = {
        "parlora_calls_active": "gauge",
        "parlora_calls": "counter",
        "parlora_sip_responses_sent": "counter",
        "parlora_refusals": "counter",
        "parlora_rtp_packets": "counter",
        "parlora_rtp_packets_lost": "counter",
        "parlora_rtp_packets_late": "counter",
        "parlora_rtp_frames_concealed": "counter",
        "parlora_rtp_jitter_seconds": "histogram",
        "parlora_pacing_lateness_seconds": "histogram",
        "parlora_provider_connect_seconds": "histogram",
        "parlora_recoveries": "counter",
        "parlora_recovery_duration_seconds": "histogram",
        "parlora_rollovers": "counter",
        "parlora_audio_discontinuities": "counter",
        "parlora_jobs": "counter",
        "parlora_job_duration_seconds": "histogram",
        "parlora_registrations": "gauge",
    }
    assert {n: names.get(n) for n in expected} == expected
    assert "# HELP parlora_calls_active Calls in progress." in text


def test_the_pacing_buckets_are_added_whole_as_observing_each_tick_would_count_them() -> None:
    """A scrape's worth of the media clock's ticks is one addition per bucket (observing each tick held the loop
    for 18 ms at 7,500 ticks), with the exposition a prometheus-client Histogram observing each tick gives."""
    from prometheus_client import CollectorRegistry, Histogram

    from bridge.server.metrics import PACING_BUCKETS

    ticks: dict[float | None, int] = {0.0002: 7_000, 0.001: 150, 0.005: 40, 0.04: 3, None: 2}
    m = BridgeMetrics()
    m.pacing_buckets(ticks)
    m.pacing([0.0003, 0.05])
    reference = CollectorRegistry()
    h = Histogram("parlora_pacing_lateness_seconds", "", buckets=PACING_BUCKETS, registry=reference)
    for bound, count in ticks.items():
        for _ in range(count):
            h.observe(bound if bound is not None else 2 * PACING_BUCKETS[-1])
    h.observe(0.0003)
    h.observe(0.05)
    expected = {
        (s.name, s.labels.get("le")): s.value
        for f in text_string_to_metric_families(generate_latest(reference).decode())
        for s in f.samples
        if not s.name.endswith("_created")
    }
    got = {
        (name, dict(labels).get("le")): value
        for (name, labels), value in _samples(m).items()
        if name.startswith("parlora_pacing_lateness_seconds") and not name.endswith("_created")
    }
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert math.isclose(got[key], value), key
    m.pacing_buckets({0.0002: 2_000_000})  # an unscraped hour and more: every tick counted
    assert _value(m, "parlora_pacing_lateness_seconds_bucket", le="0.0002") == 2_007_000
