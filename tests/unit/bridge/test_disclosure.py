"""The disclosure gate (bridge/engine/disclosure.py) on virtual time: a recorded disclosure is the call's first audio,
the model is heard only once the carrier ledger shows all of it sent, and the record says whether it was
delivered; a line of text is checked against the first assistant utterance the ledger timed."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import pytest

from bridge.engine.commands import AudioDiscontinuity, DisclosureResult, Transcript
from bridge.engine.delegations import SendContext
from bridge.engine.disclosure import DISCLOSURE_ITEM, Disclosure, said, text_result
from bridge.server.records import RecordBuilder, Utterance
from providers.events import AudioReceived, SpeechStarted
from providers.limits import GPT_LIVE
from rtp.audio import PCMU_8K
from rtp.ledger import CarrierLedger
from tests.support.records import INFO, MS, T0, outcome
from tests.support.recovery import commands_of
from tests.support.session_engine import GPT_LIVE_CAPS, REALTIME, Call, pcmu_tone, speech_frame

ONE_SECOND = Disclosure(audio=b"\x10\x00" * 8_000)  # 50 frames


def results(call: Call) -> list[DisclosureResult]:
    return [n for n in call.notices if isinstance(n, DisclosureResult)]


def test_the_recording_plays_first_and_the_model_is_heard_only_once_all_of_it_left() -> None:
    call = Call(caps=REALTIME, disclosure=ONE_SECOND)
    call.provider(
        AudioReceived(1, pcmu_tone(600), PCMU_8K, "item_a")
    )  # the model speaks before the line is up
    assert call.core.push_update("Greet the caller.", speak=True, now=call.now)
    call._drain()
    call.core.answered(call.now)  # inbound: the session starts
    call._drain()
    call.tick(count=49)
    assert [f.item_id for f in call.sent] == [DISCLOSURE_ITEM] * 49
    assert commands_of(call, SendContext) == [] and results(call) == []  # the greeting waits too
    call.tick(count=40)
    items = [f.item_id for f in call.sent]
    assert items[:50] == [DISCLOSURE_ITEM] * 50 and set(items[50:]) == {"item_a"}  # then the model, whole
    [result] = results(call)
    assert (result.outcome, result.kind, result.transmitted_ms, result.length_ms) == (
        "delivered",
        "audio",
        1_000,
        1_000,
    )
    assert commands_of(call, SendContext) == [SendContext(1, "Greet the caller.", True)]


def test_a_barge_in_during_the_disclosure_cuts_nothing_of_it() -> None:
    call = Call(caps=REALTIME, disclosure=ONE_SECOND)
    call.core.answered(call.now)
    call._drain()
    call.tick(count=10)
    call.provider(SpeechStarted(1, 200, "in_1"))  # the caller says "hello?" over it
    call.tick(speech_frame(), count=20)
    call.tick(count=30)
    assert [f.item_id for f in call.sent][:50] == [DISCLOSURE_ITEM] * 50
    assert [r.outcome for r in results(call)] == ["delivered"]


def test_a_hang_up_in_the_middle_is_partial_and_one_before_the_answer_not_delivered() -> None:
    call = Call(caps=REALTIME, disclosure=ONE_SECOND)
    call.core.answered(call.now)
    call._drain()
    call.tick(count=20)
    call.core.call_ended(call.now)
    call._drain()
    [result] = results(call)
    assert (result.outcome, result.reason, result.transmitted_ms) == ("partial", "the call ended", 400)

    unanswered = Call(caps=REALTIME, disclosure=ONE_SECOND)
    unanswered.core.ring(unanswered.now)
    unanswered.tick(count=20)
    assert unanswered.sent == []  # nothing plays into the ringing line
    unanswered.core.call_ended(unanswered.now)
    unanswered._drain()
    [never] = results(unanswered)
    assert (never.outcome, never.reason, never.transmitted_ms) == (
        "not_delivered",
        "the call was never answered",
        0,
    )


def test_a_placed_call_hears_it_at_the_answer_and_what_the_model_said_beyond_the_reservoir_is_reported() -> (
    None
):
    call = Call(caps=GPT_LIVE_CAPS, limits=GPT_LIVE.for_format(PCMU_8K), disclosure=ONE_SECOND)
    call.core.ring(call.now)
    call.advance(3_000)
    call.core.answered(call.now)  # the callee answered (or AMD released it)
    call._drain()
    spoken = pcmu_tone(3_000)  # more than GPT-Live's 2 s reservoir, all while the disclosure plays
    for at in range(0, len(spoken), 800):
        call.provider(AudioReceived(1, spoken[at : at + 800], PCMU_8K))
    call.tick(count=150)
    items = [f.item_id for f in call.sent]
    assert items[:50] == [DISCLOSURE_ITEM] * 50 and DISCLOSURE_ITEM not in items[50:]
    assert [r.outcome for r in results(call)] == ["delivered"]
    [dropped] = [n for n in call.notices if isinstance(n, AudioDiscontinuity)]
    assert (dropped.direction, dropped.cause, dropped.amount) == ("output", "disclosure", 8_000)


def test_a_line_of_text_is_delivered_only_when_the_first_utterance_said_it_whole() -> None:
    line = "This call is answered by an automated assistant."
    assert said(line, "Hello! This call is answered by an automated assistant. How can I help?")
    assert not said(line, "Hello, how can I help?")
    assert text_result(line, "this call is answered by an automated assistant", False, 2_000, 0).outcome == (
        "delivered"
    )
    assert text_result(line, "Hello, how can I help?", False, 2_000, 0).outcome == "not_delivered"
    assert text_result(line, line, True, 800, 0).outcome == "partial"
    assert text_result(line, None, False, 0, 0).outcome == "not_delivered"


def test_a_disclosure_is_a_recording_or_a_line() -> None:
    with pytest.raises(ValueError):
        Disclosure()
    with pytest.raises(ValueError):
        Disclosure(audio=b"\x00", text="x")
    with pytest.raises(ValueError):
        Disclosure(audio=b"\x00\x00\x00")


# --- the call record ---------------------------------------------------------------------------------------------


def _transmit(ledger: CarrierLedger, item: str, from_ms: int, frames: int) -> None:
    for i in range(frames):
        ledger.record(item, 20 * i, 0, T0 + (from_ms + 20 * i) * MS)


def test_the_record_says_whether_the_recording_was_delivered_and_it_is_no_utterance_of_the_model() -> None:
    ledger = CarrierLedger()
    b = RecordBuilder(INFO, ledger=ledger, start_ns=T0, started_at=0.0, disclosure=ONE_SECOND)
    _transmit(ledger, DISCLOSURE_ITEM, 0, 50)
    b.notice(
        DisclosureResult("delivered", "audio", "every frame reached the carrier", 1_000, 1_000, 1_000), T0
    )
    b.notice(Transcript("assistant", "Hello, how can I help?", 1_000, True), T0 + 1_000 * MS)
    _transmit(ledger, "item_a", 1_000, 40)
    events, record = b.finish(outcome(), T0 + 3_000 * MS)
    [u] = [e for e in events if isinstance(e, Utterance)]
    assert (u.start_ms, u.heard_ms) == (1_000, 800)  # the disclosure's frames are not the model's words
    assert record.to_json()["disclosure"]["outcome"] == "delivered"

    silent = RecordBuilder(INFO, ledger=CarrierLedger(), start_ns=T0, started_at=0.0, disclosure=ONE_SECOND)
    _, never = silent.finish(outcome(), T0)  # no coordinator ever ran (the provider was unavailable)
    assert json.loads(never.cdr_line())["disclosure"]["outcome"] == "not_delivered"
    _, none = RecordBuilder(INFO, ledger=CarrierLedger(), start_ns=T0, started_at=0.0).finish(outcome(), T0)
    assert "disclosure" not in none.to_json()


@pytest.mark.parametrize(
    ("spoken", "expected"),
    [
        ("This call is answered by an automated assistant. How can I help?", "delivered"),
        ("Hi there, how can I help you today?", "not_delivered"),
    ],
)
def test_a_line_of_text_is_checked_against_the_first_assistant_utterance_the_ledger_timed(
    spoken: str, expected: str
) -> None:
    line = Disclosure(text="This call is answered by an automated assistant.")
    ledger = CarrierLedger()
    b = RecordBuilder(INFO, ledger=ledger, start_ns=T0, started_at=0.0, disclosure=line)
    b.notice(Transcript("assistant", spoken, 0, True), T0)
    _transmit(ledger, "item_a", 0, 150)
    b.handle_timer(T0 + 3_700 * MS)  # the utterance is over: its audio left, quiet since
    b.notice(
        Transcript("assistant", "This call is answered by an automated assistant.", 4_000, True),
        T0 + 4_000 * MS,
    )
    _, record = b.finish(outcome(), T0 + 9_000 * MS)
    assert (
        record.disclosure is not None and record.disclosure.outcome == expected
    )  # the second one is too late


def test_a_routes_disclosure_is_a_wav_it_checks_or_a_line(tmp_path: Path) -> None:
    from bridge.cli.config import ConfigError, load

    with wave.open(str(tmp_path / "disclosure.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x10\x00" * 800)
    path = tmp_path / "bridge.toml"
    path.write_text(
        '[[routes]]\nname = "a"\nnumber = "1"\ndisclosure = "disclosure.wav"\n'
        '[[routes]]\nname = "b"\ndisclosure = "You are talking to an automated assistant."\n'
    )
    first, second = load(path).routes
    assert first.disclosure_wav == str(tmp_path / "disclosure.wav") and first.disclosure is None
    assert second.disclosure == "You are talking to an automated assistant." and second.disclosure_wav is None
    path.write_text('[[routes]]\nname = "a"\ndisclosure = "missing.wav"\n')
    with pytest.raises(ConfigError, match=r"routes\[0\]\.disclosure"):
        load(path)
