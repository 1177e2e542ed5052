"""16 kHz caller audio (a G.722 leg at its own rate, rtp.g722; `send_audio(pcm, wide=True)`) at the adapters:
Gemini (`Capabilities.wide_input`) takes it as its own 16 kHz input, as it is; 8 kHz audio, one frame or two
joined (as long as one 16 kHz frame), is resampled as before. The G.711 adapters take 8 kHz only: the session
gives them the 8 kHz view (tests/unit/bridge/test_session_pairs.py). And through the Gemini fake's echo, a 6 kHz
tone (above what 8 kHz carries) comes back."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np

from providers.base import SessionSettings
from providers.events import AudioReceived, ProviderEvent, UsageUpdated
from providers.fakes.gemini_live import GeminiFakeOptions, serve
from providers.gemini_live import GeminiLiveAdapter
from providers.openai_live import LiveConfig, OpenAILiveAdapter
from providers.openai_realtime import OpenAIRealtimeAdapter
from rtp.audio import PCM16_24K, PCMU_8K
from rtp.g711 import ulaw_encode
from rtp.resample import PcmInput, Resampler


def tone(hz: float, ms: int, rate: int, level: float = 8000.0) -> bytes:
    t = np.arange(rate * ms // 1000) / rate
    return np.asarray(level * np.sin(2 * np.pi * hz * t), dtype="<i2").tobytes()


def cut(pcm: bytes, size: int) -> list[bytes]:
    return [pcm[i : i + size] for i in range(0, len(pcm), size)]


def gemini(**kwargs: object) -> GeminiLiveAdapter:
    return GeminiLiveAdapter(
        "k",
        SessionSettings(),
        limits=GeminiLiveAdapter.audio_limits(PCM16_24K),
        url="ws://127.0.0.1:9/",
        **kwargs,
    )  # type: ignore[arg-type]


def test_gemini_takes_a_16khz_frame_as_it_is_and_resamples_an_8khz_one() -> None:
    live, sent = gemini(), []
    live.shell.send_audio_frame = sent.append  # type: ignore[method-assign]
    wide = tone(6000.0, 20, 16000)
    live.send_audio(wide, True)
    [frame] = sent
    audio = json.loads(frame)["realtimeInput"]["audio"]
    assert base64.b64decode(audio["data"]) == wide and audio["mimeType"] == "audio/pcm;rate=16000"
    narrow = tone(1000.0, 100, 8000)
    reference = Resampler(8000, 16000)
    sent.clear()
    for f in cut(narrow, 320):
        live.send_audio(f)
    up = b"".join(base64.b64decode(json.loads(f)["realtimeInput"]["audio"]["data"]) for f in sent)
    assert up == b"".join(reference.process(f) for f in cut(narrow, 320))  # the 8 kHz path as before
    joined, reference = gemini(), Resampler(8000, 16000)  # two 8 kHz frames in one call: 640 bytes, not wide
    sent.clear()
    joined.shell.send_audio_frame = sent.append  # type: ignore[method-assign]
    for pair in cut(narrow, 640):
        joined.send_audio(pair)
    up = b"".join(base64.b64decode(json.loads(f)["realtimeInput"]["audio"]["data"]) for f in sent)
    assert up == b"".join(reference.process(f) for f in cut(narrow, 640))


def test_the_g711_adapters_take_two_joined_8khz_frames_as_40_ms_of_8khz_audio() -> None:
    """A pair of 8 kHz frames is as long as one 16 kHz frame: it is 8 kHz audio, encoded whole (no guess from the
    length, which once took it for a 16 kHz frame and sent half of it)."""
    pairs = cut(tone(1000.0, 80, 8000), 640)
    realtime = OpenAIRealtimeAdapter(
        "k", SessionSettings(), limits=OpenAIRealtimeAdapter.audio_limits(PCMU_8K)
    )
    live = OpenAILiveAdapter(
        "k", LiveConfig.from_settings(SessionSettings()), limits=OpenAILiveAdapter.audio_limits(PCMU_8K)
    )
    for adapter in (realtime, live):
        sent: list[str | bytes] = []
        adapter.shell.send_audio_frame = sent.append  # type: ignore[method-assign]
        for pair in pairs:
            adapter.send_audio(pair)
        expected = [ulaw_encode(pair) for pair in pairs]
        assert len(sent) == 2 and all(
            base64.b64encode(e) in (s if isinstance(s, bytes) else s.encode())
            for e, s in zip(expected, sent, strict=True)
        )


async def test_a_6khz_tone_in_16khz_frames_comes_back_from_the_gemini_echo() -> None:
    options = GeminiFakeOptions(response_latency_ms=20, burst_factor=8.0)
    async with await serve(options=options) as fake:
        live = GeminiLiveAdapter(
            "k", SessionSettings(), limits=GeminiLiveAdapter.audio_limits(PCM16_24K), url=fake.url,
            ssl_context=fake.client_ssl_context(),
        )  # fmt: skip
        await live.connect()
        for f in cut(tone(6000.0, 600, 16000) + bytes(800 * 32), 640):
            live.send_audio(f, True)
        events: list[ProviderEvent] = []
        async with asyncio.timeout(5):
            async for event in live.events():
                events.append(event)
                if isinstance(event, UsageUpdated):
                    break
        await live.close()
    audio = b"".join(e.audio for e in events if isinstance(e, AudioReceived))
    x = np.frombuffer(audio, dtype="<i2").astype(float)
    peak = np.argmax(np.abs(np.fft.rfft(x * np.hanning(len(x))))) * 24000 / len(x)
    assert abs(peak - 6000) < 10 and 640 <= len(audio) / 48 <= 680  # the tone, not a 3 kHz one twice as long


# --- the OpenAI family at PCM16 24 kHz on a 16 kHz leg (bridge/server/providers.py `ProviderKind.wide_format`) ---

OPENAI_FAMILY = ("openai-live", "openai-realtime", "xai")


def _appended(frame: str | bytes) -> bytes:
    """The audio of one append frame (either protocol's: `{"type": ..., "audio": base64}`)."""
    return base64.b64decode(json.loads(frame)["audio"])


def test_on_a_16khz_leg_the_openai_family_negotiates_pcm16_at_24khz_and_on_8khz_g711_as_before() -> None:
    from bridge.server.providers import KINDS, ProviderChoice
    from providers.openai_live import session_start_frame
    from providers.realtime_family import session_update_frame

    for name in OPENAI_FAMILY:
        wide = ProviderChoice(KINDS[name], "k", None, SessionSettings(), media_rate=16000).connect(1)
        narrow = ProviderChoice(KINDS[name], "k", None, SessionSettings()).connect(1)
        assert (wide.output_format, narrow.output_format) == (PCM16_24K, PCMU_8K), name
        assert (
            wide.limits.capacity_bytes == 6 * narrow.limits.capacity_bytes
        )  # the same seconds: 48 B/ms, not 8
        if isinstance(wide, OpenAILiveAdapter):
            fmt = session_start_frame(wide.core.config)["session"]["audio"]["format"]
            assert fmt == {"type": "audio/pcm", "rate": 24000}
        else:
            audio = session_update_frame(wide.dialect, SessionSettings(), wide.core.audio_format)["session"][
                "audio"
            ]
            assert audio["input"]["format"]["type"] == audio["output"]["format"]["type"] == "audio/pcm"
    gemini_wide = ProviderChoice(KINDS["gemini-live"], "k", None, SessionSettings(), media_rate=16000)
    assert gemini_wide.audio_format() == PCM16_24K == KINDS["gemini-live"].output_format  # its own, as before


def test_the_openai_family_on_pcm16_sends_each_16khz_frame_resampled_once_to_24khz() -> None:
    from bridge.server.providers import KINDS, ProviderChoice

    wide = cut(tone(6000.0, 200, 16000), 640)
    for name in OPENAI_FAMILY:
        adapter = ProviderChoice(KINDS[name], "k", None, SessionSettings(), media_rate=16000).connect(1)
        sent: list[str | bytes] = []
        adapter.shell.send_audio_frame = sent.append  # type: ignore[attr-defined]
        assert adapter.capabilities.wide_input  # the session gives it the 16 kHz frames as they are
        for f in wide:
            adapter.send_audio(f, True)
        reference = Resampler(16000, 24000)
        expected = [reference.process(f) for f in wide]
        assert [_appended(s) for s in sent] == expected, name  # one resampler, frame by frame
        assert all(
            len(e) == 960 for e in expected[1:]
        )  # 20 ms at 24 kHz (the first: less the filter's delay)
        x = np.frombuffer(b"".join(expected[2:]), dtype="<i2").astype(np.float64)
        power = np.abs(np.fft.rfft(x * np.hanning(len(x)))) ** 2
        hz = np.fft.rfftfreq(len(x), 1 / 24000)
        assert power[np.abs(hz - 6000) < 200].sum() > 0.9 * power.sum()  # the 6 kHz tone itself
        narrow = ProviderChoice(KINDS[name], "k", None, SessionSettings()).connect(1)
        assert not narrow.capabilities.wide_input  # G.711: the session gives it the 8 kHz view


def test_a_client_commit_on_pcm16_waits_for_100_ms_of_24khz_audio_not_800_bytes() -> None:
    from providers.realtime_family import RealtimeClientProtocol
    from providers.xai import DIALECT

    core = RealtimeClientProtocol(DIALECT, SessionSettings(turn_detection="client"), audio_format=PCM16_24K)
    core.append_audio(bytes(960 * 4))  # 80 ms at 24 kHz: 3840 bytes, over G.711's 800 but under 100 ms
    core.commit_input()
    assert not any("input_audio_buffer.commit" in f for f in core.frames_to_send())
    core.append_audio(bytes(960))  # 100 ms
    core.commit_input()
    assert any("input_audio_buffer.commit" in f for f in core.frames_to_send())


def test_pcm_input_takes_joined_frames_at_the_rate_it_is_told() -> None:
    """Two 8 kHz frames joined (the session's pairs) are as long as one 16 kHz frame: told 8 kHz, they are 40 ms
    of 8 kHz audio; told 16 kHz, a joined pair is 40 ms of 16 kHz audio."""
    narrow_pairs = cut(tone(1000.0, 400, 8000), 640)
    told_narrow = PcmInput(24000)
    out = b"".join(told_narrow(pair, False) for pair in narrow_pairs)
    assert abs(len(out) - 400 * 48) <= 2 * 960  # 400 ms at 24 kHz (less the filters' delay), not 200
    x = np.frombuffer(out[960 * 4 :], dtype="<i2").astype(np.float64)
    hz = np.fft.rfftfreq(len(x), 1 / 24000)[np.argmax(np.abs(np.fft.rfft(x * np.hanning(len(x)))))]
    assert abs(hz - 1000) < 30  # its pitch kept: not read as 16 kHz (which would give 2 kHz)
    wide_pairs = cut(tone(6000.0, 400, 16000), 1280)
    told_wide = PcmInput(24000)
    out = b"".join(told_wide(pair, True) for pair in wide_pairs)
    assert abs(len(out) - 400 * 48) <= 2 * 960
    x = np.frombuffer(out[960 * 4 :], dtype="<i2").astype(np.float64)
    hz = np.fft.rfftfreq(len(x), 1 / 24000)[np.argmax(np.abs(np.fft.rfft(x * np.hanning(len(x)))))]
    assert abs(hz - 6000) < 30
