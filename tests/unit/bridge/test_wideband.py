"""A 16 kHz leg (G.722 at its own rate: sip.leg `MediaStarted.rate`) in the session, on virtual time: the
provider's audio is framed at the leg's rate (bridge/engine/framing.py), resampled once, never through 8 kHz;
the caller's 640-byte frames reach the provider as they are; what analyses or records at 8 kHz (the machine
detector, the recording) takes an explicit 8 kHz view; an 8 kHz leg is framed as before."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np

from bridge.engine.amd import AmdOptions, AmdVerdict
from bridge.engine.reservoir import TICK_NS, OutputPath
from bridge.server.recording import CallRecording
from providers.events import AudioReceived
from providers.limits import AudioLimits
from rtp.audio import PCM16_24K, PCMU_8K, AudioFormat
from rtp.g711 import ulaw_encode
from rtp.playout import OutboundFrame, Playout
from rtp.units import NS_PER_MS as MS
from sip.leg import CallEnded, FrameReceived, MediaStarted, PlayoutLeg
from tests.support import virtual_time
from tests.support.amd import quiet, speech
from tests.support.seams_hold import DialledFakeLeg, TextProvider, wait_for
from tests.support.session import FakeLeg, FakeProvider, session

event_loop_policy = virtual_time.policy_fixture()


def tone(hz: float, ms: int, rate: int, level: float = 8000.0) -> np.ndarray:
    t = np.arange(rate * ms // 1000) / rate
    return np.asarray(level * np.sin(2 * np.pi * hz * t), dtype="<i2")


def share(pcm: bytes, rate: int, lo: float, hi: float) -> float:
    """The share of the signal's energy between `lo` and `hi` Hz."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    power = np.abs(np.fft.rfft(x * np.hanning(len(x)))) ** 2
    hz = np.fft.rfftfreq(len(x), 1 / rate)
    return float(power[(hz >= lo) & (hz <= hi)].sum() / power.sum())


def output(fmt: AudioFormat) -> tuple[OutputPath, Playout]:
    playout = Playout()
    path = OutputPath(AudioLimits(16_000, 3_000), fmt, PlayoutLeg(playout), lead_frames=2, item_quiet_ms=300)
    return path, playout


def played(path: OutputPath, playout: Playout, ticks: int) -> list[OutboundFrame]:
    out = []
    for i in range(ticks):
        path.tick(i * TICK_NS)
        frame = playout.take()
        if frame is not None:
            playout.transmitted(frame, i * TICK_NS)
            out.append(frame)
    return out


def test_gemini_s_24khz_voice_is_framed_at_16khz_for_a_16khz_leg_and_keeps_its_6khz() -> None:
    voice = tone(6000.0, 300, 24000).tobytes()  # 14400 bytes: within the reservoir's 16000
    wide, playout = output(PCM16_24K)
    wide.set_rate(16000)
    wide.push(voice, "item_a", 0)
    frames = played(wide, playout, 25)
    assert len(frames) == 15 and {len(f.pcm) for f in frames} == {640}  # 20 ms each: the ledger's unit
    assert [f.offset_ms for f in frames] == [20 * i for i in range(15)]
    assert share(b"".join(f.pcm for f in frames[2:-2]), 16000, 5800, 6200) > 0.9
    narrow, playout = output(PCM16_24K)  # an 8 kHz leg: the 6 kHz tone cannot be carried
    narrow.push(voice, "item_a", 0)
    frames = played(narrow, playout, 25)
    assert {len(f.pcm) for f in frames} == {320}
    assert np.frombuffer(b"".join(f.pcm for f in frames[2:-2]), dtype="<i2").std() < 300


def test_a_mulaw_provider_on_a_16khz_leg_is_framed_at_8khz_as_before() -> None:
    """8 kHz G.711 has nothing above 4 kHz: its frames stay 8 kHz, G.722's encoder interpolates them as before
    (the same bytes on the wire as before the media rate existed)."""
    audio = ulaw_encode(tone(1000.0, 100, 8000).tobytes())
    frames = {}
    for rate in (8000, 16000):
        path, playout = output(PCMU_8K)
        path.set_rate(rate)
        path.push(audio, "item_a", 0)
        frames[rate] = played(path, playout, 8)
    assert path.rate == 8000 and frames[16000] and frames[16000] == frames[8000]


def test_an_item_being_framed_finishes_at_its_rate_and_the_next_takes_the_new_one() -> None:
    path, playout = output(PCM16_24K)
    path.push(tone(500.0, 100, 24000).tobytes(), "item_a", 0)
    first = played(path, playout, 2)  # item_a started at 8 kHz
    path.set_rate(16000)
    path.push(tone(500.0, 100, 24000).tobytes(), "item_b", 0)
    rest = played(path, playout, 12)
    sizes = {(f.item_id, len(f.pcm)) for f in first + rest}
    assert sizes == {("item_a", 320), ("item_b", 640)}
    assert [f.offset_ms for f in first + rest if f.item_id == "item_a"] == [0, 20, 40, 60, 80]


def test_the_final_message_plays_its_8khz_frames_on_a_16khz_leg() -> None:
    path, playout = output(PCM16_24K)
    path.set_rate(16000)
    assert path.play_final_message(bytes(320) * 3) == 60
    assert [len(f.pcm) for f in played(path, playout, 3)] == [320] * 3  # G.722's encoder takes either


def test_the_recording_writes_a_16khz_leg_at_8khz() -> None:
    rec = CallRecording()
    rec.channel(PlayoutLeg(), 0)
    wide = tone(1000.0, 200, 16000).tobytes()
    for slot in range(10):
        rec.caller(wide[640 * slot : 640 * (slot + 1)], (20 * slot + 5) * MS)
    left = np.frombuffer(rec.take(0, final=True), dtype="<i2").reshape(-1, 2)[:, 0]
    assert left.size == 10 * 160  # 20 ms a slot at 8 kHz, not 10 ms of each frame
    steady = left[40:].astype(np.float64)  # the decimator's 15-sample start aside
    assert share(steady.astype("<i2").tobytes(), 8000, 950, 1050) > 0.95  # the 1 kHz tone, at its pitch
    assert 0.95 < steady.std() / (8000 / np.sqrt(2)) < 1.05  # and its level


async def test_a_16khz_leg_s_caller_frames_reach_the_provider_and_its_voice_the_leg_at_16khz() -> None:
    leg, provider = FakeLeg(), FakeProvider()
    provider.output_format = PCM16_24K  # Gemini's voice
    provider.capabilities = replace(provider.capabilities, wide_input=True)  # takes 16 kHz as Gemini does
    task = asyncio.create_task(session(leg, provider).run())
    leg.queue.put_nowait(MediaStarted("G722/8000", 16000))
    caller = tone(6000.0, 60, 16000).tobytes()
    for i in range(3):
        leg.queue.put_nowait(FrameReceived(caller[640 * i : 640 * (i + 1)], i, i))
    await wait_for(lambda: len(provider.sent) == 3)
    assert provider.sent == [caller[640 * i : 640 * (i + 1)] for i in range(3)]  # as they are, said wide
    assert provider.wide == [True, True, True]
    provider.queue.put_nowait(AudioReceived(1, tone(6000.0, 200, 24000).tobytes(), PCM16_24K, "item_a"))
    await wait_for(lambda: leg.playout.depth >= 2)
    frames = [leg.playout.take() for _ in range(2)]
    assert all(f is not None and len(f.pcm) == 640 for f in frames)
    heard = b"".join(f.pcm for f in frames if f is not None)
    assert share(heard, 16000, 5800, 6200) > 0.8
    leg.queue.put_nowait(CallEnded("bye", 200, True, 3, 0))
    await asyncio.wait_for(task, 5)


def _wide(frames: list[bytes]) -> list[bytes]:
    """8 kHz frames brought to 16 kHz (each sample twice, then a 3-tap smoothing: enough for the detector)."""
    out = []
    for f in frames:
        x = np.repeat(np.frombuffer(f, dtype="<i2").astype(np.float64), 2)
        x = np.convolve(x, [0.25, 0.5, 0.25], mode="same")
        out.append(np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes())
    return out


async def test_the_machine_detector_hears_a_16khz_leg_through_its_8khz_view() -> None:
    leg, provider, notices = DialledFakeLeg(), TextProvider(), []
    call = session(leg, provider, amd=AmdOptions(), notice_sink=lambda _id, n: notices.append(n))
    task: asyncio.Task[object] = asyncio.create_task(call.run())  # type: ignore[arg-type]
    await wait_for(lambda: call.coordinator is not None)
    assert call.push_update("Greet the callee.")
    leg.queue.put_nowait(MediaStarted("G722/8000", 16000))
    await asyncio.sleep(0.01)
    for i, pcm in enumerate(_wide(speech(500) + quiet(900))):
        leg.queue.put_nowait(FrameReceived(pcm, i, i))
        await asyncio.sleep(0.02)
    verdicts = [n for n in notices if isinstance(n, AmdVerdict)]
    assert [v.kind for v in verdicts] == ["human"] and provider.texts == ["Greet the callee."]
    leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)
