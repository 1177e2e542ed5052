"""The GPT-Live adapter against the GPT-Live fake over a real loopback socket."""

import asyncio

import numpy as np

from providers.base import ProviderUnavailable
from providers.events import AudioReceived, InputTranscript, SessionClosed
from providers.fakes.openai_live import serve
from providers.openai_live import LiveConfig, OpenAILiveAdapter
from rtp.audio import PCMU_8K
from rtp.g711 import ulaw_encode

import pytest


def tone_frames(ms: int, amplitude: int = 8000) -> list[bytes]:
    t = np.arange(ms * 8) / 8000
    pcm = (amplitude * np.sin(2 * np.pi * 1000 * t)).astype("<i2").tobytes()
    return [pcm[i : i + 320] for i in range(0, len(pcm), 320)]


def adapter(url: str, key: str = "sk-test") -> OpenAILiveAdapter:
    return OpenAILiveAdapter(key, LiveConfig(), limits=OpenAILiveAdapter.audio_limits(PCMU_8K), url=url)


async def test_caller_audio_goes_up_as_pcmu_and_the_echo_comes_back_bit_exact() -> None:
    async with await serve() as fake:
        live = adapter(fake.url)
        started = await live.connect()
        assert started.session_id.startswith("sess_")
        frames = tone_frames(600) + [bytes(320)] * 30  # a tone, then silence past the hangover
        for frame in frames:
            live.send_audio(frame)
        echoed = b""
        transcripts = []
        async with asyncio.timeout(10):
            async for event in live.events():
                if isinstance(event, InputTranscript):
                    transcripts.append(event)
                if isinstance(event, AudioReceived):
                    echoed += event.audio
                    if len(echoed) >= 600 * 8:
                        break
        assert transcripts and transcripts[0].start_ms is not None
        sent = ulaw_encode(b"".join(frames))
        assert echoed[:4800] in sent  # the fake echoes the exact PCMU bytes it was sent
        live.request_close()
        async with asyncio.timeout(5):
            closed = [e async for e in live.events() if isinstance(e, SessionClosed)]
        assert closed[-1].finalized and closed[-1].reason == "close_requested"
        await live.close()


async def test_a_refused_handshake_is_provider_unavailable_without_the_key() -> None:
    async with await serve() as fake:
        wrong_path = fake.url.replace("/v1/live/sessions", "/nope")
        with pytest.raises(ProviderUnavailable, match="HTTP 404") as info:
            await adapter(wrong_path, key="sk-secret-value").connect()
        assert "sk-secret-value" not in str(info.value)
