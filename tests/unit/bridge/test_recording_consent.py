"""The recording consent (bridge/server/recording.py, bridge/engine/disclosure.py) on virtual time: the recording
starts only once the announcement was heard whole — a recording the bridge plays (after the disclosure), timed by
the carrier ledger, or the model's first words, checked by the call record — and the WAV begins where it ended on
the wire, with no caller audio from before; a hang-up, a barge-in that cut the model's line or a provider recovery
that cleared it means no consent: nothing is recorded and the record says why."""

from __future__ import annotations

import asyncio
import json
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bridge.engine.card import CardEnded
from bridge.engine.commands import BargedIn, DisclosureResult, RecoveryChanged, Transcript
from bridge.engine.coordinator import CoordinatorOptions, SessionCoordinator
from bridge.engine.disclosure import CONSENT_ITEM, DISCLOSURE_ITEM, Disclosure
from bridge.server.recording import CallRecording, WavWriter
from bridge.server.records import CallRecord, RecordBuilder, RecordingChanged
from providers.events import AudioReceived, SessionStarted, SpeechStarted
from providers.limits import OPENAI_REALTIME
from rtp.audio import PCMU_8K
from rtp.ledger import CarrierLedger
from sip.leg import PlayoutLeg
from tests.support.records import INFO, MS, outcome
from tests.support.session_engine import REALTIME, TICK, pcmu_tone

CONSENT_WAV = Disclosure(audio=b"\x10\x00" * 8_000)  # "this call is recorded": 1 s, 50 frames
DISCLOSURE_WAV = Disclosure(audio=b"\x20\x00" * 4_000)  # "you are talking to an assistant": 0.5 s, 25 frames
LINE = "This call is recorded."


def pcm(value: int) -> bytes:
    return np.full(160, value, dtype="<i2").tobytes()


def left_and_right(stereo: bytes) -> tuple[list[int], list[int]]:
    """The first sample of each 20 ms frame of the WAV's two channels."""
    samples = np.frombuffer(stereo, dtype="<i2").reshape(-1, 2)
    return [int(v) for v in samples[::160, 0]], [int(v) for v in samples[::160, 1]]


class ConsentCall:
    """A session core whose channel is the recording's tee over a real playout and ledger, the call record fed
    its notices, and the recording told the record's consent verdict (as `CallRecords` does). The caller's
    frame of tick N carries the value 1000 + N, so the WAV's left channel says which frames it holds."""

    def __init__(self, consent: Disclosure, disclosure: Disclosure | None = None) -> None:
        self.now = 0
        self.leg = PlayoutLeg()
        self.tap = CallRecording(consent=True)
        self.core = SessionCoordinator(
            limits=OPENAI_REALTIME.for_format(PCMU_8K),
            output_format=PCMU_8K,
            capabilities=REALTIME,
            channel=self.tap.channel(self.leg, 0),
            now=0,
            options=CoordinatorOptions(disclosure=disclosure, consent=consent),
        )
        self.builder = RecordBuilder(
            INFO, ledger=self.leg.ledger, start_ns=0, started_at=0.0, disclosure=disclosure, consent=consent
        )
        self.core.provider_event(SessionStarted(1, "sess", None), 0)
        self.ticks = 0
        self.sent: list[str] = []  # the item of each frame the media clock transmitted
        self.wav = b""
        self.told = False
        self._drain()

    def provider(self, event: object) -> None:
        self.core.provider_event(event, self.now)  # type: ignore[arg-type]
        self._drain()

    def tick(self, count: int = 1, *, speech: bool = False) -> None:
        for _ in range(count):
            self.ticks += 1
            self.now += TICK
            frame = self.leg.playout.pull(self.now)
            if frame is not None:
                self.sent.append(frame.item_id)
            value = (-1 if speech else 1) * (1000 + self.ticks)
            self.core.caller_frame(pcm(value), self.now)
            self.tap.caller(pcm(value), self.now)
            deadline = self.core.next_deadline()
            if deadline is not None and deadline <= self.now:
                self.core.handle_timer(self.now)
            self._drain()
            if self.ticks % 50 == 0:  # the writer, once a second
                self.wav += self.tap.take(self.now)

    def _drain(self) -> None:
        for notice in self.core.notices():
            self.builder.notice(notice, self.now)
        self.core.commands()
        if (deadline := self.builder.next_deadline()) is not None and deadline <= self.now:
            self.builder.handle_timer(self.now)
        if not self.told and self.builder.consent is not None:
            self.told = True
            self.tap.verdict(self.builder.consent)

    def finish(self) -> CallRecord:
        self.wav += self.tap.take(self.now, final=True)
        start = self.tap.start_ms
        _, record = self.builder.finish(replace(outcome(), recording_start_ms=start), self.now)
        return record

    def consent_result(self) -> DisclosureResult:
        assert self.builder.consent is not None
        return self.builder.consent


def test_a_recorded_consent_heard_whole_starts_the_recording_where_it_ended_on_the_wire() -> None:
    call = ConsentCall(CONSENT_WAV)
    call.provider(AudioReceived(1, pcmu_tone(400), PCMU_8K, "item_a"))  # the model's greeting waits for it
    call.core.answered(call.now)
    call.tick(49)
    assert call.sent == [CONSENT_ITEM] * 49 and call.builder.consent is None and call.tap.held
    call.tick(101)
    assert call.sent[:50] == [CONSENT_ITEM] * 50 and set(call.sent[50:]) == {"item_a"}  # then the model
    result = call.consent_result()
    # its last frame left at 1,000 ms (tick 50): its audio ended on the wire 20 ms later
    assert (result.outcome, result.what, result.kind, result.ended_ms) == (
        "delivered",
        "consent",
        "audio",
        1_020,
    )
    record = call.finish()
    left, right = left_and_right(call.wav)
    assert call.tap.start_ms == 1_020
    assert left[0] == 1051 and min(left) == 1051  # tick 51 (1,020 ms) first: nothing of the caller before it
    assert 0x10 not in right and any(right[:3])  # the announcement is not in the WAV; the model's greeting is
    assert json.loads(record.cdr_line())["consent"] == {
        "announced": True,
        "how": "wav",
        "outcome": "delivered",
        "reason": "every frame reached the carrier",
        "ended_ms": 1_020,
        "recording_start_ms": 1_020,
    }


def test_the_disclosure_plays_first_then_the_consent_and_the_recording_starts_after_both() -> None:
    call = ConsentCall(CONSENT_WAV, disclosure=DISCLOSURE_WAV)
    call.provider(AudioReceived(1, pcmu_tone(400), PCMU_8K, "item_a"))
    call.core.answered(call.now)
    call.tick(120)
    assert call.sent[:75] == [DISCLOSURE_ITEM] * 25 + [CONSENT_ITEM] * 50
    assert set(call.sent[75:]) == {"item_a"}
    assert call.builder.disclosure is not None and call.builder.disclosure.outcome == "delivered"
    assert call.consent_result().ended_ms == 1_520
    call.finish()
    assert call.tap.start_ms == 1_520 and left_and_right(call.wav)[0][0] == 1076


def test_a_barge_in_during_a_recorded_consent_cuts_nothing_and_the_recording_starts_after_it() -> None:
    call = ConsentCall(CONSENT_WAV)
    call.core.answered(call.now)
    call.tick(10)
    call.provider(SpeechStarted(1, 200, "in_1"))  # "hello? hello?" over the announcement
    call.tick(30, speech=True)
    call.tick(60)
    assert call.sent[:50] == [CONSENT_ITEM] * 50  # it played whole: the caller heard every frame of it
    assert call.consent_result().outcome == "delivered"
    call.finish()
    left, _ = left_and_right(call.wav)
    assert left[0] == 1051 and all(v > 0 for v in left)  # none of what they said over it is recorded


def test_a_hang_up_during_the_consent_means_no_recording_no_file_and_the_record_says_why(
    tmp_path: Path,
) -> None:
    call = ConsentCall(CONSENT_WAV)
    call.core.answered(call.now)
    call.tick(20)
    call.core.call_ended(call.now)
    call._drain()
    result = call.consent_result()
    assert (result.outcome, result.reason, result.transmitted_ms) == ("partial", "the call ended", 400)
    record = call.finish()
    assert call.wav == b"" and call.tap.start_ms is None
    assert json.loads(record.cdr_line())["consent"] == {
        "announced": False,
        "how": "wav",
        "outcome": "partial",
        "reason": "the call ended",
        "ended_ms": None,
        "recording_start_ms": None,
    }

    async def write() -> str | None:  # the writer makes no file for a call that never consented
        writer = WavWriter(call.tap, tmp_path / "call.wav", interval_s=0.01)
        writer.start()
        await asyncio.sleep(0.03)
        return await writer.close()

    assert asyncio.run(write()) is None and not (tmp_path / "call.wav").exists()


# --- a line of text: the model's first words, checked by the call record ---------------------------------------


def _transmit(ledger: CarrierLedger, item: str, from_ms: int, frames: int) -> None:
    for i in range(frames):
        ledger.record(item, 20 * i, 0, (from_ms + 20 * i) * MS)


def _text_call() -> tuple[CarrierLedger, CallRecording, RecordBuilder]:
    leg = PlayoutLeg()
    tap = CallRecording(consent=True)
    tap.channel(leg, 0)
    consent = Disclosure(text=LINE)
    return (
        leg.ledger,
        tap,
        RecordBuilder(INFO, ledger=leg.ledger, start_ns=0, started_at=0.0, consent=consent),
    )


def test_a_line_said_whole_starts_the_recording_where_it_ended_and_keeps_the_caller_s_reply() -> None:
    ledger, tap, b = _text_call()
    b.notice(Transcript("assistant", f"{LINE} How can I help?", 0, True), 0)
    _transmit(ledger, "item_a", 0, 100)  # 0-2,000 ms
    for tick in range(1, 130):  # the caller answers right after it: 2,000-2,600 ms
        tap.caller(pcm(1000 + tick), tick * 20 * MS)
    assert b.handle_timer(2_600 * MS)  # the utterance closes 600 ms after its last frame: the verdict
    assert b.consent is not None and (b.consent.outcome, b.consent.ended_ms) == ("delivered", 2_000)
    tap.verdict(b.consent)
    left, _ = left_and_right(tap.take(2_600 * MS, final=True))
    assert tap.start_ms == 2_000 and left[0] == 1100  # from 2,000 ms: the reply kept while the verdict came
    _, record = b.finish(replace(outcome(), recording_start_ms=tap.start_ms), 3_000 * MS)
    assert record.consent is not None and record.consent.to_json()["how"] == "text"


def test_the_record_s_recording_gaps_are_offsets_into_the_wav_that_begins_after_the_consent() -> None:
    ledger, tap, b = _text_call()
    b.notice(Transcript("assistant", f"{LINE} How can I help?", 0, True), 0)
    _transmit(ledger, "item_a", 0, 100)  # the line: 0-2,000 ms, the WAV begins where it ended
    changes = [(300, True, "model"), (600, False, "model"), (1_500, True, "application")]
    changes += [(2_500, False, "application"), (4_000, True, "card")]  # the card's gap runs to the end
    for at, paused, by in changes:  # as the session does it: the tap, and the record told
        card = by == "card"
        assert tap.pause(at * MS, by, card=card) if paused else tap.resume(at * MS, card=card)
        b.notice(RecordingChanged(paused, by, at), at * MS)
        if at == 2_500:
            assert b.handle_timer(2_600 * MS)  # the consent's verdict
            tap.verdict(b.consent)  # type: ignore[arg-type]
    assert tap.start_ms == 2_000
    _, record = b.finish(replace(outcome(), recording_start_ms=tap.start_ms), 5_000 * MS)
    # the one before the WAV is not in it; the one it began in starts at 0
    assert record.to_json()["recording_gaps"] == [
        {"start_ms": 0, "end_ms": 500, "by": "application"},
        {"start_ms": 2_000, "end_ms": None, "by": "card"},
    ]
    # the same places as the file's own cue points (8 samples a ms)
    assert tap.marks()[2:] == [
        (0, "recording paused (application)"),
        (500 * 8, "recording resumed"),
        (2_000 * 8, "recording paused (card)"),
    ]


def test_the_record_s_card_collections_are_offsets_into_the_wav_as_their_gaps() -> None:
    ledger, tap, b = _text_call()
    b.notice(Transcript("assistant", f"{LINE} How can I help?", 0, True), 0)
    _transmit(ledger, "item_a", 0, 100)  # the line: 0-2,000 ms, the WAV begins where it ended
    cards = [(500, 900, "timeout"), (1_500, 3_000, "collected"), (4_000, 5_000, "cancelled")]
    for start, end, result in cards:  # as the session does it: the card's pause and resume, then its notice
        assert tap.pause(start * MS, "card", card=True)
        b.notice(RecordingChanged(True, "card", start), start * MS)
        if start == 1_500:
            assert b.handle_timer(2_600 * MS)  # the consent's verdict
            tap.verdict(b.consent)  # type: ignore[arg-type]
        assert tap.resume(end * MS, card=True)
        b.notice(RecordingChanged(False, "card", end), end * MS)
        b.notice(CardEnded(result, start, end, "application"), end * MS)  # type: ignore[arg-type]
    assert tap.start_ms == 2_000
    _, record = b.finish(replace(outcome(), recording_start_ms=tap.start_ms), 6_000 * MS)
    out = record.to_json()
    # each collection where its gap is in the file; the one that began before it from 0, and the one that
    # ended before it still listed (the record lists every collection), at 0
    assert [(c["outcome"], c["started_ms"], c["ended_ms"]) for c in out["card_collections"]] == [
        ("timeout", 0, 0),
        ("collected", 0, 1_000),
        ("cancelled", 2_000, 3_000),
    ]
    assert [(g["start_ms"], g["end_ms"]) for g in out["recording_gaps"]] == [(0, 1_000), (2_000, 3_000)]


def test_a_barge_in_that_cuts_the_line_means_no_consent_and_no_recording() -> None:
    ledger, tap, b = _text_call()
    b.notice(Transcript("assistant", LINE, 0, True), 0)  # the transcript runs ahead of the audio
    _transmit(ledger, "item_a", 0, 30)
    tap.caller(pcm(7), 500 * MS)
    b.notice(BargedIn(600, "caller", 900, (("item_a", 600),)), 600 * MS)
    assert b.consent is not None and (b.consent.outcome, b.consent.reason) == ("partial", "a barge-in cut it")
    tap.verdict(b.consent)
    tap.caller(pcm(8), 700 * MS)
    assert tap.take(5_000 * MS, final=True) == b"" and tap.start_ms is None


def test_a_provider_recovery_that_cleared_the_line_means_no_consent_and_the_record_says_why() -> None:
    ledger, tap, b = _text_call()
    b.notice(Transcript("assistant", LINE, 0, True), 0)  # all of its text, only 800 ms of its audio left
    _transmit(ledger, "item_a", 0, 40)
    b.notice(RecoveryChanged(2, "output_stale", "reconnecting", 0), 800 * MS)  # the rest was cleared (HR3)
    b.notice(Transcript("assistant", "Sorry, the line broke up. Could you repeat?", 1_500, True), 1_500 * MS)
    assert b.consent is not None
    assert (b.consent.outcome, b.consent.reason) == ("partial", "a provider recovery cut it")
    tap.verdict(b.consent)
    assert tap.take(5_000 * MS, final=True) == b""
    _, record = b.finish(replace(outcome(), recording_start_ms=tap.start_ms), 5_000 * MS)
    assert record.to_json()["consent"]["reason"] == "a provider recovery cut it"


def test_a_disclosure_line_cleared_by_a_recovery_is_not_delivered_either() -> None:
    ledger = CarrierLedger()
    b = RecordBuilder(INFO, ledger=ledger, start_ns=0, started_at=0.0, disclosure=Disclosure(text=LINE))
    b.notice(Transcript("assistant", LINE, 0, True), 0)
    _transmit(ledger, "item_a", 0, 40)
    b.notice(RecoveryChanged(2, "output_overflow", "reconnecting", 0), 800 * MS)
    b.notice(Transcript("assistant", "Sorry, could you repeat that?", 1_500, True), 1_500 * MS)
    assert b.disclosure is not None and b.disclosure.outcome == "partial"


def test_both_lines_are_the_model_s_first_words_disclosure_first() -> None:
    from bridge.server.api import CallSetup, ServerConfig, _first_words, _settings

    setup = CallSetup(
        greeting="Greet the caller.",
        disclosure=Disclosure(text="You are talking to an automated assistant."),
        recording_consent=Disclosure(text=LINE),
    )
    words = _first_words(setup)
    assert words is not None and words.index("automated assistant") < words.index(LINE) < words.index("Greet")
    instructions = _settings(ServerConfig(), setup).instructions
    assert instructions is not None and "automated assistant. This call is recorded." in instructions


# --- what cannot be honoured refuses to start ----------------------------------------------------------------------


def _wav(path: Path) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x10\x00" * 800)
    return path


def test_a_consent_with_recording_off_or_after_a_spoken_disclosure_refuses_to_start(tmp_path: Path) -> None:
    from bridge.cli.config import ConfigError, load
    from bridge.cli.ops import server_config
    from bridge.server.api import Application, Server, ServerConfig

    _wav(tmp_path / "consent.wav")
    path = tmp_path / "bridge.toml"
    route = '[[routes]]\nname = "a"\nrecording_consent = "This call is recorded."\n'
    path.write_text(route)
    with pytest.raises(ConfigError, match=r"routes\[0\]\.recording_consent: recording is off"):
        server_config(load(path), {})
    path.write_text('[defaults]\nrecording_consent_wav = "consent.wav"\n')
    with pytest.raises(ConfigError, match=r"defaults\.recording_consent: recording is off"):
        server_config(load(path), {})
    recording = f'[recording]\ndir = "{tmp_path}"\n'
    path.write_text(recording + route)
    assert server_config(load(path), {}).record_dir == str(tmp_path)  # with recording on it starts
    path.write_text(
        recording
        + '[defaults]\nrecording_consent_wav = "consent.wav"\n'
        + '[[routes]]\nname = "a"\ndisclosure = "You are talking to an assistant."\n'
    )
    with pytest.raises(
        ConfigError, match=r"routes\[0\]\.recording_consent_wav: a recorded consent cannot follow"
    ):
        server_config(load(path), {})
    path.write_text(route + 'recording_consent_wav = "consent.wav"\n')
    with pytest.raises(ConfigError, match="not both"):
        load(path)
    with pytest.raises(ValueError, match="recording is off"):
        Server(Application(), ServerConfig(recording_consent=Disclosure(text=LINE)))


def test_a_hang_up_while_the_line_plays_means_no_consent_though_its_transcript_is_whole() -> None:
    ledger, tap, b = _text_call()
    b.notice(Transcript("assistant", LINE, 0, True), 0)  # the whole text came at once
    _transmit(ledger, "item_a", 0, 40)  # 800 ms of its audio left, then the caller hung up
    _, record = b.finish(replace(outcome(), recording_start_ms=tap.start_ms), 900 * MS)
    assert record.consent is not None
    assert (record.consent.announced, record.consent.reason) == (False, "the call ended while it played")
