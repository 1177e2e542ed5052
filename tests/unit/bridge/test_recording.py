"""`--record` and `--cdr` and the per-call event pump (bridge/server/recording.py).

The recording is driven on virtual time through a real playout and ledger (sip.leg.PlayoutLeg): the test is
the media clock (take, then transmitted), so "exactly what was transmitted" is checked frame by frame,
including frames a barge-in cleared before they left.
"""

from __future__ import annotations

import asyncio
import json
import threading
import wave
from collections import deque
from pathlib import Path

import numpy as np

from bridge.engine.commands import Transcript
from bridge.server.recording import (
    FRAME_BYTES,
    CallRecording,
    CallReporter,
    CdrWriter,
    TeeChannel,
    WavWriter,
    interleave,
    recording_path,
    tee_channel,
)
from bridge.server.records import (
    AppEvent,
    CallEnded,
    CallInfo,
    CallOutcome,
    CallStarted,
    RecordBuilder,
    Utterance,
)
from rtp.ledger import CarrierLedger
from rtp.playout import OutboundFrame
from rtp.rtcp import QoS
from rtp.units import NS_PER_MS as MS
from sip.leg import LegFeatures, PlayoutLeg, offers_cushion, offers_qos

T0 = 7_000 * MS
INFO = CallInfo("call-1", "abc@h", "<sip:a@h>", "<sip:b@h>", "b", "127.0.0.1:5070", None, "echo")


def pcm(value: int) -> bytes:
    return np.full(160, value, dtype="<i2").tobytes()


def frames(item: str, values: list[int], epoch: int) -> list[OutboundFrame]:
    return [OutboundFrame(pcm(v), epoch, item, 20 * i) for i, v in enumerate(values)]


def send(leg: PlayoutLeg, count: int, from_ms: int) -> None:
    """The media clock: `count` ticks from session time `from_ms` (3 ms off the 20 ms grid), one frame each."""
    for i in range(count):
        frame = leg.playout.take()
        assert frame is not None
        leg.playout.transmitted(frame, T0 + (from_ms + 20 * i + 3) * MS)


def channels(stereo: bytes) -> tuple[np.ndarray, np.ndarray]:
    samples = np.frombuffer(stereo, dtype="<i2").reshape(-1, 2)
    return samples[:, 0].reshape(-1, 160), samples[:, 1].reshape(-1, 160)


async def first_write(writer: WavWriter) -> None:
    for _ in range(200):  # bounded: the writer's first step
        if writer.frames_written:
            break
        await asyncio.sleep(0.01)


def scenario() -> tuple[CallRecording, PlayoutLeg]:
    leg = PlayoutLeg()
    rec = CallRecording()
    tee = rec.channel(leg, T0)
    for slot in range(100):  # the caller: 2 s of frames, each with its slot number as its value
        rec.caller(pcm(1000 + slot), T0 + (20 * slot + 5) * MS)
    tee.enqueue(frames("out-1", [11, 12, 13, 14, 15, 16, 17, 18, 19, 20], epoch=0))
    send(leg, 4, 1000)  # slots 50-53 leave
    result = tee.clear(1)  # barge-in: the other 6 never leave
    assert result.dropped_frames == 6
    tee.enqueue(frames("out-2", [31, 32, 33], epoch=1))
    send(leg, 3, 1200)  # slots 60-62
    return rec, leg


def test_the_right_channel_is_exactly_what_left_for_the_carrier_on_the_call_s_timeline() -> None:
    rec, leg = scenario()
    left, right = channels(rec.take(T0 + 2000 * MS, final=True))
    assert left.shape == right.shape == (100, 160)
    assert [int(f[0]) for f in left] == [1000 + slot for slot in range(100)]  # the caller as received
    sent = {slot: int(f[0]) for slot, f in enumerate(right) if f.any()}
    assert sent == {50: 11, 51: 12, 52: 13, 53: 14, 60: 31, 61: 32, 62: 33}  # cleared frames never appear
    assert rec.frames_right == leg.ledger.frames_transmitted == 7 and rec.unmatched == 0
    assert all((f == f[0]).all() for f in right)  # whole frames, never split across slots


def test_written_in_steps_it_is_the_same_recording() -> None:
    whole, _ = scenario()
    expected = whole.take(0, final=True)
    stepped, _ = scenario()
    parts = [stepped.take(T0 + ms * MS) for ms in (300, 900, 1100, 1500)]
    parts.append(stepped.take(T0 + 2000 * MS, final=True))
    assert parts[0] and b"".join(parts) == expected
    assert len(parts[0]) == (300 // 20 - 10) * 2 * FRAME_BYTES  # the last 200 ms wait for stragglers


def test_a_call_with_nothing_sent_records_silence_on_the_right() -> None:
    rec = CallRecording()
    rec.channel(PlayoutLeg(), T0)
    for slot in (0, 1, 5):  # a gap in what arrived is silence too
        rec.caller(pcm(3), T0 + 20 * slot * MS)
    left, right = channels(rec.take(T0, final=True))
    assert [int(f[0]) for f in left] == [3, 3, 0, 0, 0, 3] and not right.any()


def test_interleave_puts_left_first() -> None:
    stereo = np.frombuffer(interleave(pcm(1), pcm(2)), dtype="<i2")
    assert list(stereo[:4]) == [1, 2, 1, 2]


class _QosLeg(PlayoutLeg):
    features = LegFeatures(qos=True)

    def qos(self) -> QoS | None:
        return None

    def media_counters(self) -> dict[str, int]:
        return {"late": 3}


class _CushionLeg(PlayoutLeg):
    features = LegFeatures(cushion=True)

    @property
    def cushion_frames(self) -> int:
        return 8


def test_the_tee_keeps_the_leg_s_capabilities() -> None:
    sent: deque[OutboundFrame] = deque()
    plain = tee_channel(PlayoutLeg(), sent)
    assert isinstance(plain, TeeChannel) and not (offers_qos(plain) or offers_cushion(plain))
    qos = tee_channel(_QosLeg(), sent)
    assert offers_qos(qos) and qos.media_counters() == {"late": 3}
    cushioned = tee_channel(_CushionLeg(), sent)
    assert offers_cushion(cushioned) and cushioned.cushion_frames == 8


async def test_the_wav_file_has_two_channels_at_8_khz_16_bit(tmp_path: Path) -> None:
    rec, _ = scenario()
    writer = WavWriter(rec, tmp_path / "call.wav", interval_s=0.01, clock=lambda: T0 + 600 * MS)
    writer.start()
    await first_write(writer)
    assert writer.frames_written == 600 // 20 - 10
    assert await writer.close() == str(tmp_path / "call.wav")
    with wave.open(str(tmp_path / "call.wav"), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (2, 2, 8000)
        left, right = channels(wav.readframes(wav.getnframes()))
    assert len(left) == 100 and {slot for slot, f in enumerate(right) if f.any()} == {
        50,
        51,
        52,
        53,
        60,
        61,
        62,
    }


async def test_a_close_while_a_write_is_in_its_thread_still_writes_the_rest_of_the_call(
    tmp_path: Path,
) -> None:
    """close() during a once-a-second write: the writer still takes the rest (final), the file is the whole
    call (the loop used to end at its next check, the end of the call lost)."""
    rec, _ = scenario()
    writer = WavWriter(rec, tmp_path / "call.wav", interval_s=0.01, clock=lambda: T0 + 600 * MS)
    in_write, release = threading.Event(), threading.Event()
    write = writer._write

    def slow_write(block: bytes) -> None:  # the first write waits, in its thread, until close() was called
        in_write.set()
        release.wait(5)
        write(block)

    writer._write = slow_write  # type: ignore[method-assign]
    writer.start()
    for _ in range(500):  # bounded: until the first write is in its thread
        if in_write.is_set():
            break
        await asyncio.sleep(0.01)
    assert in_write.is_set()
    closing = asyncio.create_task(writer.close())
    await asyncio.sleep(0.05)  # close() has set the stop while the write is still in its thread
    release.set()
    assert await closing == str(tmp_path / "call.wav")
    with wave.open(str(tmp_path / "call.wav"), "rb") as wav:
        left, _ = channels(wav.readframes(wav.getnframes()))
    assert len(left) == 100  # the whole 2 s of the caller, not the 600 ms of the first write


def test_recording_paths_never_collide(tmp_path: Path) -> None:
    first = recording_path(tmp_path, "call-1", wall=1_700_000_000.0)
    assert first.name == "20231114T221320Z-call-1.wav"
    first.write_bytes(b"")
    assert recording_path(tmp_path, "call-1", wall=1_700_000_000.0).name == "20231114T221320Z-call-1-2.wav"


class _Now:
    def __init__(self) -> None:
        self.ns = T0

    def __call__(self) -> int:
        return self.ns


async def test_events_reach_the_application_in_order_and_the_record_is_one_cdr_line(tmp_path: Path) -> None:
    clock = _Now()
    seen: list[AppEvent] = []

    async def deliver(event: AppEvent) -> None:
        seen.append(event)
        if isinstance(event, Utterance) and event.seq == 1:
            raise RuntimeError("the application's bug")  # logged; the next events still come

    cdr = CdrWriter(tmp_path / "cdr.jsonl")
    builder = RecordBuilder(INFO, ledger=CarrierLedger(), start_ns=T0, started_at=1.0)
    reporter = CallReporter(builder, deliver, cdr=cdr, clock=clock)
    reporter.start()
    reporter.notice("call-1", Transcript("caller", "one", 100, True, 0, 900))
    reporter.notice("call-1", object())  # not a record notice: ignored
    reporter.notice("call-1", Transcript("caller", "two", 2000, True, 0, 2600))
    record = await reporter.finish(CallOutcome(3.0, "caller", "200 OK", 200, {}, 150, 0))
    assert [type(e) for e in seen] == [CallStarted, Utterance, Utterance, CallEnded]
    assert [e.text for e in seen if isinstance(e, Utterance)] == ["one", "two"]
    assert isinstance(seen[-1], CallEnded) and seen[-1].record is record
    second = RecordBuilder(INFO, ledger=CarrierLedger(), start_ns=T0, started_at=2.0)
    other = CallReporter(second, deliver, cdr=cdr, clock=clock)
    other.start()
    await other.finish(CallOutcome(1.0, "bridge", "x", 503, {}, 0, 0))
    lines = (tmp_path / "cdr.jsonl").read_text().splitlines()
    assert [json.loads(line)["sip_status"] for line in lines] == [200, 503]  # one line per call, appended
    assert json.loads(lines[0])["utterances"] == 2


async def test_a_recording_that_cannot_be_written_keeps_nothing_for_the_rest_of_the_call(
    tmp_path: Path,
) -> None:
    rec, leg = scenario()
    writer = WavWriter(rec, tmp_path / "no-such-dir" / "call.wav", interval_s=0.01)
    writer.start()
    assert await writer.close() is None
    rec.caller(pcm(1), T0)
    tee = rec._tee
    assert tee is not None
    tee.enqueue(frames("out-3", [1, 2], epoch=1))
    assert not rec._caller  # nothing kept
    assert not rec._sent and leg.depth == 2  # the call's audio still goes out


# --- pausing: a gap of silence for its real duration, on both channels ---


def test_a_paused_recording_keeps_nothing_and_its_gap_lasts_as_long_as_the_pause() -> None:
    """Paused from 400 to 1,000 ms: neither the caller's frames nor what left for the carrier in between are in
    the file, which still has every slot (the timeline stays true); before and after, everything is."""
    leg = PlayoutLeg()
    rec = CallRecording()
    tee = rec.channel(leg, T0)
    tee.enqueue(frames("out-1", list(range(1, 61)), epoch=0))
    for slot in range(75):  # 1.5 s of the caller, and of the assistant for the first 1.2 s
        now = T0 + (20 * slot + 5) * MS
        if slot == 20:
            assert rec.pause(now, "application")
            assert not rec.pause(now, "model")  # idempotent: already paused, nothing changes
        if slot == 50:
            assert rec.resume(now)
            assert not rec.resume(now)
        rec.caller(pcm(1000 + slot), now)
        if slot < 60:
            send(leg, 1, 20 * slot)
    left, right = channels(rec.take(T0 + 5 * 1000 * MS, final=True))
    assert len(left) == 75  # every slot, the gap's too
    for slot in range(75):
        gap = 20 <= slot < 50
        assert (left[slot] == (0 if gap else 1000 + slot)).all(), slot
        if slot < 60:  # (the carrier's frames leave 3 ms into their slot, 2 ms before the caller's come)
            sent_in_gap = 21 <= slot <= 50
            assert (right[slot] == (0 if sent_in_gap else slot + 1)).all(), slot
    assert rec.gaps == [[T0 + 405 * MS, T0 + 1005 * MS, "application"]]


def test_a_card_collections_pause_outlasts_the_applications_resume() -> None:
    rec = CallRecording()
    rec.channel(PlayoutLeg(), T0)
    assert rec.pause(T0 + 100 * MS, "card", card=True)
    assert rec.pause(T0 + 200 * MS, "model")  # a second hold under the same gap
    assert rec.resume(T0 + 300 * MS)  # the model's hold ends; the card's goes on
    assert rec.paused
    rec.caller(pcm(5), T0 + 320 * MS)
    assert rec.resume(T0 + 500 * MS, card=True)
    assert not rec.paused
    assert rec.gaps == [[T0 + 100 * MS, T0 + 500 * MS, "card"]]
    left, _ = channels(rec.take(T0 + 10 * 1000 * MS, final=True))
    assert not left.any()


async def test_the_file_marks_each_gap_with_cue_points_and_stays_a_valid_wav(tmp_path: Path) -> None:
    rec, _ = scenario()  # (its caller frames came before the pause: kept, as they reached the tap before it)
    rec.pause(T0 + 500 * MS, "card", card=True)
    rec.resume(T0 + 1_250 * MS, card=True)
    writer = WavWriter(rec, tmp_path / "call.wav", interval_s=0.01, clock=lambda: T0 + 600 * MS)
    writer.start()
    await first_write(writer)
    assert await writer.close() == str(tmp_path / "call.wav")
    data = (tmp_path / "call.wav").read_bytes()
    assert int.from_bytes(data[4:8], "little") == len(data) - 8  # the RIFF size covers the cue chunks
    cue = data.index(b"cue ")
    count = int.from_bytes(data[cue + 8 : cue + 12], "little")
    offsets = [
        int.from_bytes(data[cue + 12 + 24 * i + 4 : cue + 12 + 24 * i + 8], "little") for i in range(count)
    ]
    assert offsets == [500 * 8, 1_250 * 8]  # samples at 8 kHz from the file's start
    assert b"recording paused (card)\0" in data and b"recording resumed\0" in data
    with wave.open(str(tmp_path / "call.wav"), "rb") as wav:  # a reader skips them
        left, _ = channels(wav.readframes(wav.getnframes()))
    assert len(left) == 100
