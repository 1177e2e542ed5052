"""HR12: observed usage adds up every transport, interrupted ones too; `complete` stays false once any
transport ended without finalising."""

from __future__ import annotations

import asyncio

from bridge.engine.commands import EndSession
from bridge.engine.delegations import SendContext
from bridge.engine.usage import BUDGET_NOTE, Pricing, UsageMeter
from bridge.server.metrics import BridgeMetrics
from bridge.server.observe import CallObserver
from bridge.server.records import CallEnded
from providers.events import (
    AudioReceived,
    SessionClosed,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    UsageUpdated,
)
from rtp.audio import PCMU_8K
from rtp.ledger import CarrierLedger
from tests.support.records import builder, outcome
from tests.support.session_engine import Call, pcmu_tone


def test_hr12_each_transport_s_latest_audio_counts_and_increments_add_up() -> None:
    meter = UsageMeter()
    meter.observe(UsageUpdated(1, audio_seconds=10.0))
    meter.observe(UsageUpdated(1, audio_seconds=12.0))  # cumulative: the latest, not the sum
    meter.observe(UsageUpdated(2, audio_seconds=1.0, input_tokens=5, cumulative=False))
    meter.observe(UsageUpdated(2, audio_seconds=2.0, input_tokens=7, cumulative=False))
    assert meter.status() == {
        "audio_seconds": 15.0,
        "input_tokens": 12,
        "output_tokens": 0,
        "complete": False,
    }


def test_hr12_complete_stays_false_once_a_transport_ended_unfinalised() -> None:
    meter = UsageMeter()
    meter.observe(SessionClosed(1, "lost", False, 4.0))
    meter.observe(SessionClosed(2, "close_requested", True, 6.0))
    assert meter.totals.audio_seconds == 10.0 and meter.totals.complete is False
    clean = UsageMeter()
    clean.observe(SessionClosed(1, "close_requested", True, 3.0))
    assert clean.totals.complete is True


# --- the split into conversation, recovery and rollover replay; the price; the route's budget ---


def _budget_call(budget: float) -> Call:
    return Call(pricing=Pricing(audio_per_minute=1.0, input_tokens_per_million=100.0), budget=budget)


def _updates(call: Call) -> list[SendContext]:
    return [c for c in call.commands if isinstance(c, SendContext) and c.text == BUDGET_NOTE]


def _ends(call: Call) -> list[EndSession]:
    return [c for c in call.commands if isinstance(c, EndSession)]


def test_a_recovery_s_replay_counts_as_recovery_not_conversation() -> None:
    call = Call(pricing=Pricing(audio_per_minute=0.5, input_tokens_per_million=10.0))
    call.provider(UsageUpdated(1, audio_seconds=10.0, input_tokens=1_000))  # the conversation so far
    call.provider(SessionClosed(1, "connection lost", False))  # a recovery: replacement token 2, seeded
    call.tick(count=3)
    call.provider(SessionStarted(2, "sess_2", None))
    call.provider(UsageUpdated(2, audio_seconds=2.0, input_tokens=4_000))  # its seed and notice (HR7)
    call.tick(count=10)
    call.provider(SpeechStarted(2, at_ms=100))  # the caller's fresh turn completes the repair (HR13)
    call.tick(count=10)
    call.provider(SpeechStopped(2, at_ms=300))
    assert call.core.status(call.now)["output_recovery"] is None
    call.provider(UsageUpdated(2, audio_seconds=7.0, input_tokens=4_500))  # running totals: 5 s and 500 more
    cost = call.core.status(call.now)["cost"]
    assert cost["parts"] == {
        "conversation": {"audio_seconds": 15.0, "input_tokens": 1_500, "output_tokens": 0},
        "recovery": {"audio_seconds": 2.0, "input_tokens": 4_000, "output_tokens": 0},
        "rollover": {"audio_seconds": 0.0, "input_tokens": 0, "output_tokens": 0},
    }
    assert cost["price"] == round(17.0 / 60 * 0.5 + 5_500 / 1e6 * 10.0, 6)
    # HR12: the two transports' running token totals add up (the second's no longer replace the first's)
    assert call.core.status(call.now)["usage"]["input_tokens"] == 5_500


def test_a_rollover_s_next_connection_counts_as_rollover_until_it_takes_the_floor() -> None:
    meter = UsageMeter(lambda token: "rollover" if token == 2 else "conversation")
    meter.observe(UsageUpdated(1, audio_seconds=30.0))
    meter.observe(UsageUpdated(2, audio_seconds=3.0, input_tokens=800))
    assert meter.parts["rollover"].audio_seconds == 3.0 and meter.parts["rollover"].input_tokens == 800
    assert meter.parts["conversation"].audio_seconds == 30.0


def test_the_budget_ends_the_call_with_one_goodbye() -> None:
    call = _budget_call(0.5)
    call.provider(UsageUpdated(1, audio_seconds=20.0))  # 0.33: under the budget
    assert not _updates(call) and call.core.ending._goodbye is None
    call.provider(UsageUpdated(1, audio_seconds=31.0))  # 0.52: reached
    assert len(_updates(call)) == 1
    call.provider(UsageUpdated(1, audio_seconds=45.0))  # still over: not asked twice
    assert len(_updates(call)) == 1
    call.provider(AudioReceived(1, pcmu_tone(600), PCMU_8K, "bye"))  # the model's goodbye plays
    call.tick(count=60)
    assert _ends(call) == [EndSession("budget", False)]
    assert call.core.ending.by_bridge  # the record's ended_by: "bridge", the model did not choose to end
    call.provider(UsageUpdated(1, audio_seconds=60.0))  # its final usage after the end
    assert len(_updates(call)) == 1 and len(_ends(call)) == 1


def test_the_budget_asks_nothing_after_the_caller_hung_up_and_no_budget_is_no_limit() -> None:
    call = _budget_call(0.5)
    call.core.call_ended(call.now)  # the caller hung up; the final usage comes after
    call.provider(SessionClosed(1, "close_requested", True, 120.0))
    assert not _updates(call) and [e.reason for e in _ends(call)] != ["budget"]
    unlimited = Call(pricing=Pricing(audio_per_minute=1.0))
    unlimited.provider(UsageUpdated(1, audio_seconds=3_600.0))
    assert not _updates(unlimited) and unlimited.core.status(unlimited.now)["cost"]["price"] == 60.0


def test_the_record_and_metrics_carry_the_split_and_the_price() -> None:
    call = Call(pricing=Pricing(audio_per_minute=0.5))
    call.provider(UsageUpdated(1, audio_seconds=60.0, input_tokens=100, output_tokens=40))
    b = builder(CarrierLedger())
    _, record = b.finish(outcome(call.core.status(call.now)), call.now)
    assert record.to_json()["cost"] == {
        "parts": {
            "conversation": {"audio_seconds": 60.0, "input_tokens": 100, "output_tokens": 40},
            "recovery": {"audio_seconds": 0.0, "input_tokens": 0, "output_tokens": 0},
            "rollover": {"audio_seconds": 0.0, "input_tokens": 0, "output_tokens": 0},
        },
        "price": 0.5,
        "budget": None,
        "budget_reached": False,
    }
    metrics = BridgeMetrics()
    seen: list[object] = []

    async def deliver(event: object) -> None:
        seen.append(event)

    asyncio.run(CallObserver(metrics).events(deliver)(CallEnded(record)))
    text = metrics.render().decode()
    assert 'parlora_call_price_total{provider="echo"} 0.5' in text
    assert 'parlora_provider_audio_seconds_total{part="conversation",provider="echo"} 60.0' in text
    assert (
        'parlora_provider_tokens_total{direction="output",part="conversation",provider="echo"} 40.0' in text
    )
    assert len(seen) == 1
