"""Per-turn latency on virtual time (bridge/engine/latency.py, bridge/server/records.py): the caller's speech
end on the wire, the provider's first audio, the first frame out and the truncation point, with the split
between the provider's share and the bridge's; the record's summary and the /metrics histograms."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from bridge.engine.commands import Outbox, TurnTiming
from bridge.engine.latency import TurnClock
from bridge.engine.timeline import Timeline
from bridge.server.metrics import BridgeMetrics
from bridge.server.observe import CallObserver
from bridge.server.records import AppEvent, RecordBuilder, TurnLatency, Utterance
from providers.events import (
    AudioReceived,
    OutputTranscript,
    SessionClosed,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
)
from rtp.audio import PCMU_8K
from tests.support.records import INFO, outcome
from tests.support.rollover_session import RolloverCall
from tests.support.session_engine import GPT_LIVE_CAPS, MS, Call, pcmu_tone, speech_frame


def timings(call: Call | RolloverCall) -> list[TurnTiming]:
    return [n for n in call.notices if isinstance(n, TurnTiming)]


def _events(call: Call) -> list[AppEvent]:
    """The call's events so far, from a record builder over its own carrier ledger."""
    b = RecordBuilder(INFO, ledger=call.playout.ledger, start_ns=0, started_at=1_700_000_000.0)
    return [e for n in call.notices for e in b.notice(n, call.now)]


def record_of(call: Call) -> RecordBuilder:
    """A record builder over the call's own carrier ledger, fed every notice the call made so far."""
    b = RecordBuilder(INFO, ledger=call.playout.ledger, start_ns=0, started_at=1_700_000_000.0)
    for n in call.notices:
        b.notice(n, call.now)
    return b


def spoken_turn(call: Call, *, end_at_ms: int, answer_after_ms: int, item: str = "a1") -> None:
    """The caller's turn ends at provider time `end_at_ms`; `answer_after_ms` later the answer's audio arrives."""
    call.provider(SpeechStopped(call.core.token, at_ms=end_at_ms))
    call.tick(count=answer_after_ms // 20)
    call.provider(OutputTranscript(call.core.token, "Sure.", item, final=False))
    call.provider(AudioReceived(call.core.token, pcmu_tone(400), PCMU_8K, item))


def test_a_turn_s_four_times_and_the_split_between_the_provider_and_the_bridge() -> None:
    call = Call()
    call.tick(count=50)  # caller frames at 20 .. 1000 ms: audio position p was forwarded at p + 20 ms
    spoken_turn(call, end_at_ms=700, answer_after_ms=300)  # reported at 1000 ms, answered at 1300 ms
    [timing] = timings(call)
    assert timing == TurnTiming("a1", 1, "conversation", 720, 1300)  # the end on the wire, not its report
    call.tick(count=40)  # it plays: its first frame leaves at the next media tick
    b = record_of(call)
    [u] = b.handle_timer(call.now + 1_000 * MS)
    assert isinstance(u, Utterance) and u.latency == TurnLatency("conversation", 720, 1300, 1320)
    assert (u.latency.provider_ms, u.latency.bridge_ms, u.latency.wait_ms) == (580, 20, 600)
    assert u.to_json()["latency"]["provider_ms"] == 580 and u.latency.truncated_ms is None


def test_the_local_detector_s_end_is_the_last_voiced_frame_not_its_hangover() -> None:
    call = Call(caps=GPT_LIVE_CAPS)  # no speech events: the bridge's own detector ends the turn
    call.tick(count=10)
    call.tick(speech_frame(), count=25)  # voiced 220 .. 700 ms
    call.tick(count=20)  # 300 ms of hangover: the stop comes at 1000 ms
    call.provider(AudioReceived(1, pcmu_tone(200), PCMU_8K))  # GPT-Live names no items
    [timing] = timings(call)
    assert (timing.item_id, timing.speech_end_ms, timing.first_audio_ms) == ("out-1", 700, 1100)


def test_a_barged_in_turn_keeps_its_times_and_the_truncation_point() -> None:
    call = Call()
    call.tick(count=50)
    spoken_turn(call, end_at_ms=700, answer_after_ms=300)
    call.tick(count=10)  # 200 ms of it leave (1320 .. 1500 ms)
    call.provider(SpeechStarted(1, at_ms=1_480))  # the caller cuts in
    [u] = [e for e in _events(call) if isinstance(e, Utterance)]  # closed by the barge-in
    assert isinstance(u, Utterance) and u.interrupted and u.latency is not None
    assert u.latency == TurnLatency("conversation", 720, 1300, 1320, truncated_ms=200)
    assert u.to_json()["latency"]["truncated_ms"] == 200


def test_a_turn_during_a_recovery_s_replay_waits_from_the_caller_s_end_and_says_recovery() -> None:
    call = Call()
    call.tick(count=50)
    call.provider(SpeechStopped(1, at_ms=700))  # the caller ends at 720 ms; the connection drops unanswered
    call.provider(SessionClosed(1, "connection lost", False))
    call.tick(count=10)  # 200 ms reconnecting: the caller's frames are discarded (HR8)
    call.provider(SessionStarted(2, "sess_2", None))  # the replacement is up, awaiting the caller
    call.provider(AudioReceived(2, pcmu_tone(300), PCMU_8K, "notice"))  # its recovery notice (HR7)
    notice = timings(call)[-1]
    assert notice == TurnTiming("notice", 2, "recovery", 720, call.now // MS)
    # The caller answers it: the replacement's own clock (from its start) stamps the end.
    started_at = call.now // MS
    call.tick(count=15)
    call.provider(SpeechStarted(2, at_ms=200))  # fresh speech: once over, the repair is complete (HR13)
    call.tick(count=10)
    call.provider(SpeechStopped(2, at_ms=480))  # 480 ms into what the replacement heard
    call.tick(count=5)
    call.provider(AudioReceived(2, pcmu_tone(300), PCMU_8K, "answer"))
    after = timings(call)[-1]
    assert after.kind == "conversation" and after.speech_end_ms == started_at + 20 + 480


def test_a_turn_across_a_rollover_ends_on_the_old_connection_and_is_answered_by_the_next() -> None:
    call = RolloverCall()
    silent_from = None
    for _ in range(10):  # turns until the next connection is opened and the old one stops hearing the caller
        call.utterance += 1
        call.step(True, 75)
        silent_from = call.now + 20 * MS
        for _ in range(50):
            call.step(False)
            if call.core.connections.handing_over:
                break
        if call.core.connections.handing_over:
            break
    assert silent_from is not None and call.core.connections.handing_over and call.core.token == 1
    for _ in range(100):  # the old one, with nothing to say, hands the floor over
        if call.core.token != 1:
            break
        call.step(False)
    token = call.core.token
    assert token != 1
    call.core.provider_event(AudioReceived(token, pcmu_tone(300), PCMU_8K, "next"), call.now)
    call._carry_out()
    first = timings(call)[-1]
    assert (first.item_id, first.token, first.kind) == ("next", token, "rollover")
    assert first.speech_end_ms == silent_from // MS  # the caller's end as the old connection heard it


def test_an_old_floor_s_tail_never_takes_the_turn_the_next_connection_heard() -> None:
    out, floor = Outbox(), [1]
    clock = TurnClock(out, Timeline(0), lambda: floor[0], lambda token: False)
    clock.speech_ended(4_000, 2)  # the hand-over: only the next connection heard the caller (S3)
    clock.item_began("tail", 4_100 * MS)  # the old floor finishes what it held (RO2)
    floor[0] = 2
    clock.item_began("next", 4_300 * MS)
    assert out.notices == [
        TurnTiming("tail", 1, "conversation", None, 4_100),
        TurnTiming("next", 2, "rollover", 4_000, 4_300),
    ]


def test_each_turn_is_observed_once_in_the_histograms_and_summarised_in_the_record() -> None:
    call = Call()
    b = RecordBuilder(INFO, ledger=call.playout.ledger, start_ns=0, started_at=1_700_000_000.0)
    events: list[AppEvent] = []

    def feed() -> None:  # as the call's reporter does: its notices as they come, the timer when due
        events.extend(e for n in call.notices for e in b.notice(n, call.now))
        call.notices.clear()
        events.extend(b.handle_timer(call.now))

    call.tick(count=50)
    spoken_turn(call, end_at_ms=700, answer_after_ms=300, item="a1")  # provider 580 ms, bridge 20 ms
    for _ in range(60):
        call.tick()
        feed()
    spoken_turn(
        call, end_at_ms=2_300, answer_after_ms=500, item="a2"
    )  # reported at 2500: end 2320, audio 3000
    for _ in range(60):
        call.tick()
        feed()
    more, record = b.finish(outcome(), call.now)
    events += more
    metrics = BridgeMetrics()
    seen: list[AppEvent] = []

    async def deliver(event: AppEvent) -> None:
        seen.append(event)

    async def run() -> None:
        send = CallObserver(metrics).events(deliver)
        for e in events:
            await send(e)

    asyncio.run(run())
    turns = [e.latency for e in seen if isinstance(e, Utterance) and e.latency is not None]
    assert turns == [
        TurnLatency("conversation", 720, 1300, 1320),
        TurnLatency("conversation", 2320, 3000, 3020),
    ]
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    counts = {
        name: [s.value for s in families[name].samples if s.name.endswith("_count")]
        for name in (
            "parlora_turn_provider_seconds",
            "parlora_turn_bridge_seconds",
            "parlora_turn_wait_seconds",
        )
    }
    assert counts == {name: [2.0] for name in counts}  # each turn once, each share once
    body = record.to_json()["latency"]
    assert body["turns"] == 2 and body["provider_ms"] == {"p50": 580, "max": 680}
    assert body["bridge_ms"] == {"p50": 20, "max": 20} and len(body["items"]) == 2
