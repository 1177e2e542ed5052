"""What `/metrics` takes from the engine at each scrape (bridge/server/observe.py `CallObserver.scrape`) and
the provider connect time the session reports (bridge/server/session.py `ProviderLinks.timed_connect`)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.server.metrics import BridgeMetrics
from bridge.server.observe import CallObserver
from bridge.server.session import ProviderLinks
from providers.events import SessionStarted
from sip.engine import EngineFeatures


def _value(m: BridgeMetrics, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


class _Engine:
    """The native engine's two reports, as plain data."""

    features = EngineFeatures(status=True, counters=True)

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.policy: dict[str, int] = {}
        self.registrations: list[dict[str, object]] = []

    def stats(self) -> dict[str, int]:
        return dict(self.counters)

    def sip_status(self) -> dict[str, object]:
        return {"policy": {"counters": dict(self.policy)}, "registrations": list(self.registrations)}


def test_engine_refusals_and_responses_move_by_their_delta_at_each_scrape() -> None:
    obs, engine = CallObserver(), _Engine()
    engine.counters = {"invite_503_draining": 2, "options_503_draining": 1, "method_405": 1, "calls": 9}
    obs.scrape(engine)
    engine.counters["invite_503_draining"] = 5  # three more since the last scrape
    engine.counters["invite_503_max_calls"] = 1
    engine.counters["invite_488"] = 1
    engine.policy = {"scanner": 2, "auth_failed": 1, "auth_ok": 7}
    obs.scrape(engine)
    obs.scrape(engine)  # nothing new: nothing counted twice
    m = obs.metrics
    assert _value(m, "parlora_refusals_total", reason="draining") == 6
    assert _value(m, "parlora_refusals_total", reason="max_calls") == 1
    assert _value(m, "parlora_refusals_total", reason="no_common_codec") == 1
    assert _value(m, "parlora_refusals_total", reason="blocked_user_agent") == 2
    assert _value(m, "parlora_refusals_total", reason="auth_failed") == 1
    assert _value(m, "parlora_sip_responses_sent_total", code="503") == 7
    assert _value(m, "parlora_sip_responses_sent_total", code="405") == 1
    assert _value(m, "parlora_sip_responses_sent_total", code="488") == 1


def test_offers_refused_before_the_180_are_refusals_by_cause_and_488s() -> None:
    obs, engine = CallObserver(), _Engine()
    engine.counters = {"offer_488_codec": 2, "offer_488_srtp_off": 1, "offer_488_no_audio": 1}
    obs.scrape(engine)
    m = obs.metrics
    assert _value(m, "parlora_refusals_total", reason="no_common_codec") == 2
    assert _value(m, "parlora_refusals_total", reason="unanswerable_offer") == 2
    assert _value(m, "parlora_sip_responses_sent_total", code="488") == 4


def test_policy_refusals_are_counted_once_each_from_the_policy_s_own_counters() -> None:
    # a dropped scanner is also the engine's policy_dropped, a 403 its policy_403: counted once, by reason
    obs, engine = CallObserver(), _Engine()
    engine.counters = {"policy_dropped": 5, "policy_403": 1, "policy_503": 2}
    engine.policy = {"scanner": 3, "not_allowed": 1, "rate_limited": 2, "options_rate_limited": 2}
    obs.scrape(engine)
    m = obs.metrics
    assert _value(m, "parlora_refusals_total", reason="blocked_user_agent") == 3
    assert _value(m, "parlora_refusals_total", reason="not_allowed") == 1
    assert _value(m, "parlora_refusals_total", reason="rate_limited") == 2
    assert _value(m, "parlora_refusals_total", reason="options_rate_limited") == 2


def test_digest_failures_and_bans_reach_their_metrics() -> None:
    obs, engine = CallObserver(), _Engine()
    engine.policy = {
        "auth_failed": 5,
        "auth_bans_source": 1,
        "auth_ban_dropped": 3,
        "auth_backoff_dropped": 2,
    }
    obs.scrape(engine)
    engine.policy.update(auth_failed=25, auth_bans_user=1)
    obs.scrape(engine)
    m = obs.metrics
    assert _value(m, "parlora_sip_auth_failures_total") == 25
    assert _value(m, "parlora_sip_bans_total", scope="source") == 1
    assert _value(m, "parlora_sip_bans_total", scope="user") == 1
    assert _value(m, "parlora_refusals_total", reason="auth_banned") == 5
    assert _value(m, "parlora_refusals_total", reason="auth_failed") == 25


class _HoldingEngine(_Engine):
    features = EngineFeatures(status=True, counters=True, held=True)

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, int] = {}

    def counts(self) -> dict[str, int]:
        return dict(self.held)


def test_rejected_sip_input_and_what_the_engine_holds_are_served_live() -> None:
    obs, engine = CallObserver(), _HoldingEngine()
    engine.counters = {"unparseable": 4, "malformed_400": 2, "internal_errors": 1, "calls": 3}
    engine.held = {"calls": 2, "transactions": 5, "rtp_ports": 4, "tasks": 1}
    obs.scrape(engine)
    engine.counters["unparseable"] = 10
    engine.held = {"calls": 0, "transactions": 1, "rtp_ports": 0, "tasks": 0}
    obs.scrape(engine)
    m = obs.metrics
    assert _value(m, "parlora_sip_messages_rejected_total", reason="unparseable") == 10
    assert _value(m, "parlora_sip_messages_rejected_total", reason="malformed_400") == 2
    assert _value(m, "parlora_sip_messages_rejected_total", reason="internal_error") == 1
    assert _value(m, "parlora_engine_held", resource="transactions") == 1  # set, not added
    assert _value(m, "parlora_engine_held", resource="calls") == 0


def test_registrations_by_state_follow_the_engine() -> None:
    obs, engine = CallObserver(), _Engine()
    engine.registrations = [{"aor": "sip:bridge@pbx", "state": "registering"}]
    obs.scrape(engine)
    assert _value(obs.metrics, "parlora_registrations", trunk="sip:bridge@pbx", state="registering") == 1
    engine.registrations = [{"aor": "sip:bridge@pbx", "state": "registered"}]
    obs.scrape(engine)
    m = obs.metrics
    assert _value(m, "parlora_registrations", trunk="sip:bridge@pbx", state="registered") == 1
    assert _value(m, "parlora_registrations", trunk="sip:bridge@pbx", state="registering") == 0


def test_the_media_clock_counters_become_pacing_metrics() -> None:
    obs, engine = CallObserver(), _Engine()
    engine.counters = {"clock_slots_served": 100, "clock_slots_skipped": 1, "clock_late_ticks": 3}
    engine.counters["clock_max_lateness_us"] = 2500
    obs.scrape(engine)
    engine.counters["clock_slots_served"] = 150
    obs.scrape(engine)
    m = obs.metrics
    assert _value(m, "parlora_pacing_ticks_total", outcome="served") == 150
    assert _value(m, "parlora_pacing_ticks_total", outcome="skipped") == 1
    assert _value(m, "parlora_pacing_ticks_total", outcome="late") == 3
    assert _value(m, "parlora_pacing_max_lateness_seconds") == 0.0025


def test_the_media_clock_lateness_buckets_become_the_pacing_histogram() -> None:
    obs, engine = CallObserver(), _Engine()
    engine.counters = {"clock_lateness_bucket_200": 40, "clock_lateness_bucket_2000": 2}
    obs.scrape(engine)
    engine.counters.update({"clock_lateness_bucket_200": 90, "clock_lateness_bucket_inf": 1})
    obs.scrape(engine)
    m = obs.metrics
    assert _value(m, "parlora_pacing_lateness_seconds_bucket", le="0.0002") == 90
    assert _value(m, "parlora_pacing_lateness_seconds_bucket", le="0.002") == 92  # cumulative
    assert _value(m, "parlora_pacing_lateness_seconds_bucket", le="0.04") == 92
    assert _value(m, "parlora_pacing_lateness_seconds_count") == 93
    for code in ("200", "500"):  # a bucket's bound is no SIP response
        assert _value(m, "parlora_sip_responses_sent_total", code=code) == 0


class _Plain:
    """An engine that declares nothing beyond `SipEngine` (as pjsua2 does)."""

    features = EngineFeatures()


def test_an_engine_without_counters_is_left_alone() -> None:
    obs = CallObserver()
    obs.scrape(None)
    obs.scrape(_Plain())
    assert _value(obs.metrics, "parlora_refusals_total", reason="draining") == 0


def test_the_scrape_reads_what_the_engine_declares_not_what_it_happens_to_have() -> None:
    """`sip.engine.EngineFeatures`: counters and a status an engine does not declare are not read."""
    obs, engine = CallObserver(), _Engine()
    engine.features = EngineFeatures()  # type: ignore[misc]  # the methods are there, the declaration is not
    engine.counters = {"invite_503_draining": 2}
    engine.policy = {"scanner": 1}
    obs.scrape(engine)
    assert _value(obs.metrics, "parlora_refusals_total", reason="draining") == 0
    assert _value(obs.metrics, "parlora_refusals_total", reason="blocked_user_agent") == 0
    engine.features = EngineFeatures(status=True, counters=True)  # type: ignore[misc]
    obs.scrape(engine)
    assert _value(obs.metrics, "parlora_refusals_total", reason="draining") == 2
    assert _value(obs.metrics, "parlora_refusals_total", reason="blocked_user_agent") == 1


def test_each_scrape_reports_the_heap_live_data_apart_from_fragmentation() -> None:
    """A leak shows in malloc_in_use and python_blocks, fragmentation in malloc_free."""
    obs = CallObserver()
    obs.scrape(None)
    before = _value(obs.metrics, "parlora_heap", figure="python_blocks")
    held = [bytearray(64) for _ in range(20_000)]  # 20,000 more blocks, alive at the next scrape
    obs.scrape(None)
    assert _value(obs.metrics, "parlora_heap", figure="python_blocks") - before >= 20_000 and len(held) > 0
    if sys.platform.startswith("linux"):  # glibc: this machine's CI
        assert _value(obs.metrics, "parlora_heap", figure="malloc_in_use") > 1_000_000
        assert 'parlora_heap{figure="malloc_free"}' in obs.metrics.render().decode()


def test_glibc_s_heap_is_walked_at_most_once_a_minute_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """mallinfo2 walks every free chunk under the arena's lock (tens of ms on a fragmented heap, the loop held):
    a scrape walks when the last walk is a minute old or `?heap=walk` asks; python_blocks is read every time."""
    import bridge.server.observe as observe

    walks: list[bool] = []
    blocks = iter(range(1, 100))

    def figures(walk: bool = True) -> dict[str, int]:
        walks.append(walk)
        return {"python_blocks": next(blocks)} | ({"malloc_free": len(walks)} if walk else {})

    monkeypatch.setattr(observe, "heap_figures", figures)
    now = [0]
    obs = CallObserver(clock=lambda: now[0])
    answer = obs.http_extra(lambda: (True, "listening"), in_pieces=True)

    def get(target: str) -> tuple[int, bytes, str]:
        pending = answer(target)
        assert pending is not None and not isinstance(pending, tuple)  # /metrics renders in pieces

        async def wait() -> tuple[int, bytes, str]:
            return await pending

        return asyncio.run(wait())

    for at_s in (0, 15, 30, 45, 60, 75):
        now[0] = at_s * 1_000_000_000
        assert get("/metrics")[0] == 200
    assert walks == [True, False, False, False, True, False]
    assert _value(obs.metrics, "parlora_heap", figure="malloc_free") == 5  # the last walk's, kept
    assert _value(obs.metrics, "parlora_heap", figure="python_blocks") == 6  # live
    assert b'parlora_heap{figure="malloc_free"} 7.0' in get("/metrics?heap=walk")[1]
    assert walks[-1] is True


async def test_metrics_render_in_pieces_as_in_one_letting_the_loop_through() -> None:
    """A scrape's exposition is rendered one collector at a time with the loop let through between them (in
    one piece it held the loop 5-14 ms), byte for byte what `render()` gives."""
    m = CallObserver().metrics
    m.call_started("sales")
    m.pacing_buckets({0.0002: 10, None: 1})
    m.loop_lag.meter = None
    ran = 0

    async def other() -> None:
        nonlocal ran
        while True:
            ran += 1
            await asyncio.sleep(0)

    beside = asyncio.ensure_future(other())
    await asyncio.sleep(0)
    before = ran
    pieces = await m.render_in_pieces()
    beside.cancel()
    assert pieces == m.render()
    families = len(list(m.registry.collect()))
    assert ran - before >= families > 20  # the other task ran between the families


class _Provider:
    name = "xai"
    token = 1

    async def connect(self) -> SessionStarted:
        await asyncio.sleep(0)
        return SessionStarted(1, "s-1")


def test_provider_connect_time_reaches_the_histogram() -> None:
    m = BridgeMetrics()
    links = ProviderLinks.__new__(ProviderLinks)  # only timed_connect is exercised
    links.on_connected = m.provider_connected
    provider: Any = _Provider()
    started = asyncio.run(links.timed_connect(provider))
    assert started.session_id == "s-1"
    assert _value(m, "parlora_provider_connect_seconds_count", provider="xai") == 1
    assert _value(m, "parlora_provider_connect_seconds_bucket", provider="xai", le="+Inf") == 1
