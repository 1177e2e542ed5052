"""Payment-card mode through the whole session shell (bridge/server/session.py, bridge/engine/card.py): the
model asks for a card, the caller keys it in by RFC 4733, and the digits are then searched for in everything
the bridge let out — the provider's wire, the record and the CDR line, the webhook bodies, every log record at
DEBUG, the /metrics exposition and the WAV file — and found only in the application's `card_collected`.

On virtual time: the session, the recording's writer and the record's reporter read the loop's clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import wave
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest

from bridge.engine.card import CardOptions, CardResult
from bridge.engine.commands import AudioDiscontinuity
from bridge.engine.telephony import TelephonyOptions, tool_specs
from bridge.server.observe import CallObserver
from bridge.server.recording import CallRecording, CallReporter, CdrWriter, WavWriter
from bridge.server.records import AppEvent, CallInfo, CallOutcome, RecordBuilder, RecordingChanged
from bridge.server.session import CallSession
from bridge.server.webhook import event_body
from providers.events import AudioReceived, ToolCallRequested
from rtp.audio import PCMU_8K
from sip.leg import CallEnded, DtmfReceived, FrameReceived
from tests.support import virtual_time
from tests.support.delegations import ToolProvider
from tests.support.session import FakeLeg, pcm_frame

event_loop_policy = virtual_time.policy_fixture()

PAN = "4929512345678907"
MS = 1_000_000


class WireProvider(ToolProvider):
    """Every call the session makes on its provider, as text (the audio as its bytes, kept apart)."""

    def __init__(self) -> None:
        super().__init__()
        self.wire: list[str] = []
        self.texts: list[str] = []

    def send_tool_result(self, call_id: str, name: str, output: str) -> None:
        self.wire.append(f"tool_result {call_id} {name} {output}")
        super().send_tool_result(call_id, name, output)

    def send_text(self, text: str, *, speak: bool = False) -> None:
        self.wire.append(f"text {text} {speak}")
        self.texts.append(text)

    def truncate(self, item_id: str, audio_end_ms: int) -> None:
        self.wire.append(f"truncate {item_id} {audio_end_ms}")


async def until(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0)


async def frames(leg: FakeLeg, count: int, value: int, seq: list[int]) -> None:
    """The caller's frames, 20 ms apart, and the media clock taking one frame of the assistant's each time."""
    clock = virtual_time.loop_clock()
    for _ in range(count):
        seq[0] += 1
        leg.queue.put_nowait(FrameReceived(pcm_frame(value), seq[0], seq[0]))
        leg.playout.pull(clock())
        await asyncio.sleep(0.02)


async def test_card_digits_reach_the_application_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = virtual_time.loop_clock()
    leg, provider = FakeLeg(), WireProvider()
    tap, observer = CallRecording(), CallObserver()
    cards: list[CardResult] = []
    pressed: list[str] = []
    bodies: list[bytes] = []

    async def deliver(event: AppEvent) -> None:  # the webhook application's POST bodies
        bodies.append(event_body(event)[1])

    async def on_dtmf(digit: str) -> None:
        pressed.append(digit)

    async def on_card(result: CardResult) -> None:
        cards.append(result)

    session = CallSession(
        leg,
        provider,
        clock=clock,
        telephony_options=TelephonyOptions(dtmf_to_model=True, card=CardOptions(min_digits=12)),
        dtmf_handler=on_dtmf,
        card_handler=on_card,
        media_tap=tap,
    )
    builder = RecordBuilder(
        CallInfo.of(leg.identity, route=None, provider="fake"),
        ledger=leg.ledger,
        start_ns=session.started_ns,
        started_at=0.0,
    )
    reporter = CallReporter(builder, deliver, cdr=CdrWriter(tmp_path / "cdr.jsonl"), clock=clock)
    session._notice_sink = observer.tee(reporter.notice)  # as the server wires it (bridge/server/api.py)
    wav = WavWriter(tap, tmp_path / "call.wav", clock=clock)
    reporter.start()
    wav.start()
    task = asyncio.create_task(session.run())
    seq = [0]
    await frames(leg, 50, 0x20, seq)  # 1 s of the caller
    leg.queue.put_nowait(DtmfReceived("5"))  # a key outside the collection: the usual paths
    await until(lambda: pressed == ["5"] and len(provider.texts) == 1)
    sent_before = len(provider.sent)
    provider.queue.put_nowait(ToolCallRequested(1, "call_card", "collect_card", "{}"))
    await until(lambda: session.collecting_card)
    provider.queue.put_nowait(AudioReceived(1, b"\x2a" * 1_600, PCMU_8K))  # its prompt: 200 ms, still played
    for digit in PAN + "#":  # keyed in while the caller's line still sends frames
        await frames(leg, 15, 0x30, seq)
        leg.queue.put_nowait(DtmfReceived(digit))
    await until(lambda: bool(cards) and len(provider.results) == 1)
    assert not session.collecting_card
    assert leg.ledger.frames_transmitted == 10  # the prompt played while collecting
    withheld = len(provider.sent) - sent_before
    await frames(leg, 50, 0x40, seq)
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, seq[0], 0))
    summary = await asyncio.wait_for(task, 10)
    path = await wav.close()
    observer.call_ended(None, summary, leg)
    record = await reporter.finish(
        CallOutcome(
            summary.duration_s, summary.ended_by, summary.reason, 200, session.status(), seq[0], 0, path
        )
    )

    # the application, and it alone, has the digits
    assert [(c.outcome, c.digits, c.by) for c in cards] == [("collected", PAN, "model")]
    assert pressed == ["5"]  # the dtmf handler saw no key of the card
    assert provider.results == [("call_card", '{"outcome": "collected"}')]  # the model: the outcome only
    assert provider.texts == [
        "The caller pressed the key 5 on their keypad."
    ]  # dtmf_to_model: not the card's
    # the caller's audio was withheld from the provider while collecting: one input discontinuity says so
    assert withheld == 0 and summary.frames_in == seq[0]
    assert len(provider.sent) == seq[0] - 17 * 15
    gaps = [n for n in _notices(caplog) if "card_collection" in n]
    assert len(gaps) == 1 and "255 caller frames" in gaps[0]

    # the record: the collection and the recording's gap, no digit
    body = record.to_json()
    assert [c["outcome"] for c in body["card_collections"]] == ["collected"]
    (gap,) = body["recording_gaps"]
    assert gap["by"] == "card" and 5_000 <= gap["end_ms"] - gap["start_ms"] <= 5_200

    # the WAV: silence for the gap's real length, the caller before and after it
    with wave.open(str(path), "rb") as wav_file:
        stereo = np.frombuffer(wav_file.readframes(wav_file.getnframes()), dtype="<i2").reshape(-1, 2)
    start, end = gap["start_ms"] * 8, gap["end_ms"] * 8
    assert not stereo[start + 160 : end - 160].any()
    assert stereo[start - 1_600 : start - 160, 0].any() and stereo[end + 160 : end + 1_600, 0].any()

    # and the digits nowhere else
    cdr = (tmp_path / "cdr.jsonl").read_text()
    logs = [f"{r.getMessage()} {r.args!r}" for r in caplog.records]
    metrics = generate_latest(observer.metrics.registry).decode()
    wav_bytes = Path(str(path)).read_bytes()
    outputs = {
        "provider": "\n".join(provider.wire),
        "provider audio": repr(provider.sent),
        "record": json.dumps(body),
        "cdr": cdr,
        "webhook": b"\n".join(bodies).decode(),
        "logs": "\n".join(logs),
        "metrics": metrics,
        "wav": wav_bytes.decode("latin-1"),
    }
    for name, text in outputs.items():
        for piece in (PAN, PAN[:6], PAN[6:12], PAN[-6:]):
            assert piece not in text, f"card digits {piece} found in the {name}"
    assert 'cause="card_collection"' in metrics  # the gap is counted, by its cause only
    # nor one key at a time: the only log record with a key in it is the key pressed before the collection
    keyed = [
        r.getMessage()
        for r in caplog.records
        if isinstance(r.args, tuple) and any(isinstance(a, str) and a in set(PAN + "#") for a in r.args)
    ]
    assert keyed == ["call call-1 caller pressed 5"]


def _notices(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "audio_discontinuity" in r.getMessage()]


async def test_a_second_collection_while_one_runs_is_refused_and_a_hang_up_ends_the_first() -> None:
    leg, provider = FakeLeg(), WireProvider()
    session = CallSession(leg, provider, clock=virtual_time.loop_clock())
    task = asyncio.create_task(session.run())
    await until(lambda: session.coordinator is not None)
    first = asyncio.create_task(session.collect_card(CardOptions(reference="pay-7")))
    await until(lambda: session.collecting_card)
    second = await session.collect_card()
    assert second.outcome == "refused"
    leg.queue.put_nowait(DtmfReceived("4"))
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    result = await asyncio.wait_for(first, 5)
    assert (result.outcome, result.digits, result.reference, result.by) == (
        "hangup",
        "",
        "pay-7",
        "application",
    )
    await asyncio.wait_for(task, 5)


async def test_the_application_cancels_and_the_timeout_ends_a_collection() -> None:
    leg, provider = FakeLeg(), WireProvider()
    session = CallSession(leg, provider, clock=virtual_time.loop_clock())
    task = asyncio.create_task(session.run())
    await until(lambda: session.coordinator is not None)
    started = virtual_time.loop_clock()()
    result = await asyncio.wait_for(session.collect_card(CardOptions(digit_timeout_ms=3_000)), 10)
    assert result.outcome == "timeout" and 3_000 * MS <= virtual_time.loop_clock()() - started < 3_100 * MS
    cancelled = asyncio.create_task(session.collect_card())
    await until(lambda: session.collecting_card)
    assert session.cancel_card() and not session.cancel_card()
    assert (await cancelled).outcome == "cancelled"
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)


async def test_pause_and_resume_recording_are_idempotent_and_tell_the_record() -> None:
    leg, provider = FakeLeg(), WireProvider()
    notices: list[object] = []
    session = CallSession(
        leg,
        provider,
        clock=virtual_time.loop_clock(),
        media_tap=CallRecording(),
        notice_sink=lambda _id, n: notices.append(n),
        telephony_options=TelephonyOptions(recording_tools=True),
    )
    task = asyncio.create_task(session.run())
    await until(lambda: session.coordinator is not None)
    assert session.pause_recording() and not session.pause_recording()
    provider.queue.put_nowait(ToolCallRequested(1, "call_p", "pause_recording", "{}"))
    provider.queue.put_nowait(ToolCallRequested(1, "call_r", "resume_recording", "{}"))
    await until(lambda: len(provider.results) == 2)
    assert [json.loads(o) for _, o in provider.results] == [
        {"recording": True, "paused": True, "changed": False},  # already paused: says so
        {"recording": True, "paused": False, "changed": True},
    ]
    assert not session.resume_recording()
    changes = [(n.paused, n.by) for n in notices if isinstance(n, RecordingChanged)]
    assert changes == [(True, "application"), (False, "model")]
    assert not any(isinstance(n, AudioDiscontinuity) for n in notices)
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)


def test_the_tools_are_offered_only_when_enabled_and_tell_the_model_to_key_not_say() -> None:
    assert tool_specs(TelephonyOptions()) == ()
    specs = {s.name: s for s in tool_specs(TelephonyOptions(recording_tools=True, card=CardOptions()))}
    assert set(specs) == {"pause_recording", "resume_recording", "collect_card"}
    assert "never ask the caller to say it" in specs["collect_card"].description.lower()


async def test_a_hang_up_right_after_the_digits_does_not_cut_the_applications_handler() -> None:
    """The caller keys the card in and hangs up at once: the application's `card_collected` still runs to its
    end (it is not one of the session's tasks, which the call's end cancels)."""
    leg, provider = FakeLeg(), WireProvider()
    done: list[str] = []
    handled = asyncio.Event()

    async def on_card(result: CardResult) -> None:
        await asyncio.sleep(5)  # the payment processor, slower than the call's close window
        done.append(result.digits)
        handled.set()

    session = CallSession(
        leg,
        provider,
        clock=virtual_time.loop_clock(),
        telephony_options=TelephonyOptions(card=CardOptions()),
        card_handler=on_card,
    )
    task = asyncio.create_task(session.run())
    provider.queue.put_nowait(ToolCallRequested(1, "call_card", "collect_card", "{}"))
    await until(lambda: session.collecting_card)
    for digit in PAN + "#":
        leg.queue.put_nowait(DtmfReceived(digit))
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)
    await asyncio.wait_for(handled.wait(), 10)  # (virtual time moves while the loop waits)
    assert done == [PAN]
