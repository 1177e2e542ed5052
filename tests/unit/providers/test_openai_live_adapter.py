"""The GPT-Live adapter against the GPT-Live fake over a real loopback socket."""

import asyncio

import numpy as np
import pytest

from providers.base import ProviderUnavailable
from providers.events import AudioReceived, InputTranscript, SessionClosed
from providers.fakes.openai_live import serve
from providers.openai_live import LiveConfig, OpenAILiveAdapter
from rtp.audio import PCMU_8K
from rtp.g711 import ulaw_encode


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


# --- faults, tools and usage against the fake --------------------------------------------------------------

from providers.events import ProviderError, ToolCallRequested, UsageUpdated  # noqa: E402
from providers.fakes.faults import parse_fault  # noqa: E402
from providers.fakes.openai_live import LiveFakeOptions  # noqa: E402
from providers.fakes.script import Script, ToolCallScript, Turn  # noqa: E402


async def _events_until(live: OpenAILiveAdapter, done, seconds: float = 5.0) -> list:
    seen = []
    try:
        async with asyncio.timeout(seconds):
            async for event in live.events():
                seen.append(event)
                if done(event, seen):
                    break
    except TimeoutError:
        pass
    return seen


def _speak(live: OpenAILiveAdapter, ms: int = 400) -> None:
    for frame in tone_frames(ms) + [bytes(320)] * 30:
        live.send_audio(frame)


async def test_garbage_json_is_a_non_fatal_error_and_invalid_audio_a_fatal_one() -> None:
    async with await serve(faults=[parse_fault("garbage_json"), parse_fault("invalid_audio@50")]) as fake:
        live = adapter(fake.url)
        await live.connect()
        errors = await _events_until(live, lambda e, s: sum(isinstance(x, ProviderError) for x in s) >= 2)
        kinds = [(e.code, e.fatal) for e in errors if isinstance(e, ProviderError)]
        assert kinds == [("invalid_event", False), ("invalid_audio", True)]
        await live.close()


async def test_the_close_fault_ends_the_session_finalised_and_an_abrupt_close_does_not() -> None:
    async with await serve(faults=[parse_fault("1/close@50"), parse_fault("2/abrupt_close@50")]) as fake:
        for finalized in (True, False):
            live = adapter(fake.url)
            await live.connect()
            [closed] = [
                e
                for e in await _events_until(live, lambda e, s: isinstance(e, SessionClosed))
                if isinstance(e, SessionClosed)
            ]
            assert closed.finalized is finalized
            assert closed.reason == "expired" if finalized else "connection closed" in closed.reason
            await live.close()


async def test_a_half_open_socket_goes_silent() -> None:
    async with await serve(faults=[parse_fault("half_open")]) as fake:
        live = adapter(fake.url)
        await live.connect()
        _speak(live)
        assert await _events_until(live, lambda e, s: True, seconds=1.5) == []  # no echo, no close
        await live.close(timeout=0.5)


async def test_slow_handshake_and_refusal_are_provider_unavailable() -> None:
    async with await serve(faults=[parse_fault("slow_handshake:3000")]) as fake:
        live = OpenAILiveAdapter(
            "sk-test",
            LiveConfig(),
            limits=OpenAILiveAdapter.audio_limits(PCMU_8K),
            url=fake.url,
            connect_timeout=0.5,
        )
        with pytest.raises(ProviderUnavailable, match="no session"):
            await live.connect()
    async with await serve(faults=[parse_fault("refuse")]) as fake:
        with pytest.raises(ProviderUnavailable, match="HTTP 503"):
            await adapter(fake.url).connect()


async def test_a_delegation_round_trip_and_a_duplicate_delivery() -> None:
    script = Script(
        (Turn(reply="tone", duration_ms=200, tool_call=ToolCallScript("lookup_order", {"id": "42"})),)
    )
    async with await serve(
        options=LiveFakeOptions(script=script), faults=[parse_fault("duplicate_tool_call")]
    ) as fake:
        live = adapter(fake.url)
        await live.connect()
        _speak(live)
        calls = [
            e
            for e in await _events_until(
                live, lambda e, s: sum(isinstance(x, ToolCallRequested) for x in s) >= 2
            )
            if isinstance(e, ToolCallRequested)
        ]
        assert len(calls) == 2 and calls[0].call_id == calls[1].call_id and calls[0].kind == "delegation"
        live.send_tool_result(calls[0].call_id, "lookup_order", "Order 42 shipped today.")
        audio = await _events_until(
            live, lambda e, s: sum(len(x.audio) for x in s if isinstance(x, AudioReceived)) >= 1600
        )
        assert (
            sum(len(e.audio) for e in audio if isinstance(e, AudioReceived)) >= 1600
        )  # the answer is spoken
        await live.close()


async def test_usage_snapshots_are_cumulative_audio_seconds() -> None:
    async with await serve(options=LiveFakeOptions(usage_interval_ms=200)) as fake:
        live = adapter(fake.url)
        await live.connect()
        usage = [
            e
            for e in await _events_until(live, lambda e, s: sum(isinstance(x, UsageUpdated) for x in s) >= 2)
            if isinstance(e, UsageUpdated)
        ]
        assert len(usage) == 2 and all(u.cumulative for u in usage)
        await live.close()


async def test_ro2_commit_input_is_a_no_op_on_gpt_live() -> None:
    """GPT-Live has no input buffer to commit (§1.13): the audio already sent is all the server needs."""
    async with await serve() as fake:
        live = adapter(fake.url)
        await live.connect()
        before = live.shell.frames_sent
        for frame in tone_frames(200):
            live.send_audio(frame)
        live.commit_input()
        live.send_text("still here", speak=False)  # a frame after it: everything queued before has gone out
        async with asyncio.timeout(5):
            while live.shell.frames_sent < before + 11:
                await asyncio.sleep(0.01)
        assert live.shell.frames_sent == before + 11  # the ten audio frames and the thinking, nothing else
        types = [f.frame.get("type") for f in fake.connections[0].client_frames if f.frame is not None]
        assert "session.thinking.append" in types and not any("commit" in str(t) for t in types)
        assert not OpenAILiveAdapter.capabilities.client_commits
        await live.close()


async def test_paired_caller_frames_go_up_as_40_ms_appends_and_the_echo_comes_back_bit_exact() -> None:
    """`Capabilities.append_frames` 2 (the session joins two 20 ms frames per `send_audio`): the fake, which
    checks every client message, takes 40 ms appends and echoes the same PCMU bytes."""
    assert OpenAILiveAdapter.capabilities.append_frames == 2
    async with await serve() as fake:
        live = adapter(fake.url)
        await live.connect()
        frames = tone_frames(600) + [bytes(320)] * 30
        for i in range(0, len(frames), 2):
            live.send_audio(frames[i] + frames[i + 1])
        echoed = b""
        errors = []
        async with asyncio.timeout(10):
            async for event in live.events():
                errors += [event] if isinstance(event, ProviderError) else []
                if isinstance(event, AudioReceived):
                    echoed += event.audio
                    if len(echoed) >= 600 * 8:
                        break
        assert errors == [] and echoed[:4800] in ulaw_encode(b"".join(frames))
        await live.close()
    limits = OpenAILiveAdapter.audio_limits(PCMU_8K)
    own = OpenAILiveAdapter("k", LiveConfig(), limits=limits, url=fake.url, append_ms=100)
    assert (
        own.capabilities.append_frames == 1
    )  # its own batcher gathers the frames: the session gives them alone
    alone = OpenAILiveAdapter("k", LiveConfig(), limits=limits, url=fake.url, append_ms=20)
    assert alone.capabilities.append_frames == 1 and alone._batch is None  # each frame its own append
    assert adapter(fake.url).capabilities.append_frames == 2  # the default, 40: the session's pairs
