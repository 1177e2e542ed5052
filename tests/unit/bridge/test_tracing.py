"""The optional OpenTelemetry spans of each turn (bridge/server/tracing.py), against the SDK's in-memory
exporter: one `turn` span from the caller's speech end to the first frame out, its `provider` and `bridge`
children at the turn's own times, once per turn; nothing for a call whose start was not seen."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bridge.server.records import CallStarted, TurnLatency, Utterance
from bridge.server.tracing import TurnSpans
from tests.support.records import INFO

STARTED_AT = 1_700_000_000.0  # the call's session began then (unix s)


def spans_of(*events: object) -> list:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = TurnSpans(provider.get_tracer("test"))
    for event in events:
        spans.event(event)  # type: ignore[arg-type]
    return list(exporter.get_finished_spans())


def reply(latency: TurnLatency | None, call_id: str = "call-1") -> Utterance:
    return Utterance(call_id, 2, "assistant", "Sure.", 1320, 1720, 400, latency=latency)


def ns(ms: int) -> int:
    return int(STARTED_AT * 1e9) + ms * 1_000_000


def test_a_turn_is_one_span_with_the_provider_s_and_the_bridge_s_share() -> None:
    turn = TurnLatency("conversation", 720, 1300, 1320, truncated_ms=200)
    spans = spans_of(CallStarted(INFO, STARTED_AT), reply(turn), reply(None))
    by_name = {s.name: s for s in spans}
    assert sorted(by_name) == ["bridge", "provider", "turn"] and len(spans) == 3  # the untimed reply: none
    root = by_name["turn"]
    assert (root.start_time, root.end_time) == (ns(720), ns(1320))
    assert (by_name["provider"].start_time, by_name["provider"].end_time) == (ns(720), ns(1300))
    assert (by_name["bridge"].start_time, by_name["bridge"].end_time) == (ns(1300), ns(1320))
    assert by_name["provider"].parent.span_id == root.context.span_id
    assert dict(root.attributes) == {
        "parlora.call_id": "call-1",
        "parlora.turn.kind": "conversation",
        "parlora.turn.provider_ms": 580,
        "parlora.turn.bridge_ms": 20,
        "parlora.turn.wait_ms": 600,
        "parlora.turn.truncated_ms": 200,
    }


def test_a_greeting_has_no_provider_span_and_an_unknown_call_none() -> None:
    greeting = TurnLatency("conversation", None, 400, 420)
    spans = spans_of(CallStarted(INFO, STARTED_AT), reply(greeting), reply(greeting, call_id="other"))
    assert sorted(s.name for s in spans) == ["bridge", "turn"]
    assert {s.name: s.start_time for s in spans} == {"turn": ns(400), "bridge": ns(400)}
