"""The xAI Grok voice adapter against the xAI fake over a real loopback socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np
import pytest

from providers.base import ProviderUnavailable, SessionSettings, ToolSpec
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputInterrupted,
    OutputTranscript,
    ProviderError,
    ProviderEvent,
    ResponseDone,
    SessionClosed,
    SessionExpiring,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    UsageUpdated,
)
from providers.fakes.faults import Fault, parse_fault
from providers.fakes.script import Script, ToolCallScript, Turn
from providers.fakes.server import FakeServer
from providers.fakes.xai import RealtimeFakeOptions, serve
from providers.xai import XAIAdapter
from rtp.audio import PCMU_8K
from rtp.g711 import ulaw_encode

FAST = RealtimeFakeOptions(speed=20.0)
LOOKUP = ToolSpec("lookup_order", "Find an order.", {"type": "object", "properties": {"order_id": {"type": "string"}}})


def tone(ms: int, amplitude: int = 8000) -> bytes:
    t = np.arange(ms * 8) / 8000
    return (amplitude * np.sin(2 * np.pi * 1000 * t)).astype("<i2").tobytes()


def utterance(tone_ms: int = 400, lead_ms: int = 200, tail_ms: int = 700) -> list[bytes]:
    """Silence, a 1 kHz tone, then silence past the fake VAD's 500 ms hangover, as 20 ms 8 kHz PCM16 frames."""
    pcm = bytes(lead_ms * 16) + tone(tone_ms) + bytes(tail_ms * 16)
    return [pcm[i : i + 320] for i in range(0, len(pcm), 320)]


def adapter(fake: FakeServer, key: str = "xai-test", **kw: Any) -> XAIAdapter:
    settings = kw.pop("settings", SessionSettings(instructions="You are a phone agent.", tools=(LOOKUP,)))
    return XAIAdapter(key, settings, limits=XAIAdapter.audio_limits(PCMU_8K), url=fake.url, **kw)


class Events:
    """One pass over `events()`: every event is kept in `seen`; `until` reads up to the first match."""

    def __init__(self, provider: XAIAdapter) -> None:
        self._it: AsyncIterator[ProviderEvent] = provider.events()
        self.seen: list[ProviderEvent] = []

    async def until(self, match: Callable[[ProviderEvent], bool], timeout: float = 5.0) -> ProviderEvent:
        async with asyncio.timeout(timeout):
            while True:
                event = await anext(self._it)
                self.seen.append(event)
                if match(event):
                    return event

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.seen if isinstance(e, kind)]


def is_(kind: type) -> Callable[[ProviderEvent], bool]:
    return lambda e: isinstance(e, kind)


async def session(fake: FakeServer, **kw: Any) -> tuple[XAIAdapter, Events]:
    provider = adapter(fake, **kw)
    started = await provider.connect()
    assert isinstance(started, SessionStarted) and started.session_id
    return provider, Events(provider)


def client_frames(fake: FakeServer, kind: str) -> list[dict[str, Any]]:
    return [f.frame for f in fake.connections[0].client_frames if f.frame is not None and f.frame.get("type") == kind]


async def test_caller_audio_goes_up_as_pcmu_and_the_echo_comes_back_with_snapshots_and_audio_usage() -> None:
    async with await serve(options=FAST) as fake:
        provider, events = await session(fake)
        frames = utterance()
        for frame in frames:
            provider.send_audio(frame)
        done = await events.until(is_(ResponseDone))
        usage = await events.until(is_(UsageUpdated))
        [started] = events.of(SpeechStarted)
        [stopped] = events.of(SpeechStopped)
        assert started.item_id is not None and stopped.item_id == started.item_id
        echoed = b"".join(e.audio for e in events.of(AudioReceived))
        assert {e.format for e in events.of(AudioReceived)} == {PCMU_8K}
        assert len(echoed) >= 400 * 8 and echoed in ulaw_encode(b"".join(frames))  # the exact PCMU bytes sent
        transcripts = [t for t in events.of(InputTranscript) if t.item_id == started.item_id]
        assert transcripts and all(t.cumulative for t in transcripts)  # grok-transcribe snapshots: replace
        assert not transcripts[0].final and transcripts[-1].final
        assert transcripts[-1].text.startswith(transcripts[0].text)
        assert any(t.final for t in events.of(OutputTranscript))
        assert isinstance(done, ResponseDone) and done.status == "completed"
        # A running total of billable audio: the caller's audio so far.
        assert isinstance(usage, UsageUpdated) and usage.cumulative
        assert usage.audio_seconds == pytest.approx(len(frames) * 0.02, abs=0.01)
        assert events.of(ProviderError) == []
        [update] = client_frames(fake, "session.update")
        assert "type" not in update["session"] and update["session"]["voice"] == "eve"
        assert update["session"]["turn_detection"]["type"] == "server_vad"
        assert update["session"]["audio"]["input"]["format"] == {"type": "audio/pcmu", "rate": 8000}
        provider.request_close()
        closed = await events.until(is_(SessionClosed))
        assert isinstance(closed, SessionClosed) and not closed.finalized and closed.close_code == 1000
        await provider.close()


async def test_keepalive_pings_are_ignored() -> None:
    async with await serve(options=RealtimeFakeOptions(speed=20.0, ping_interval_ms=5)) as fake:
        provider, events = await session(fake)
        provider.send_text("Hello?", speak=True)
        await events.until(is_(UsageUpdated))
        assert events.of(ProviderError) == []
        await provider.close()


async def test_a_tool_call_round_trip_ends_in_a_spoken_answer() -> None:
    script = Script((Turn(reply="tone", duration_ms=400, tool_call=ToolCallScript("lookup_order", {"order_id": "42"})),))
    async with await serve(options=FAST, script=script) as fake:
        provider, events = await session(fake)
        for frame in utterance():
            provider.send_audio(frame)
        call = await events.until(is_(ToolCallRequested))
        assert isinstance(call, ToolCallRequested)
        assert (call.name, call.arguments) == ("lookup_order", '{"order_id":"42"}')
        # xAI sends the call alongside response.done: response.create must wait for it.
        provider.send_tool_result(call.call_id, call.name, '{"status":"shipped"}')
        await events.until(is_(ResponseDone))
        answer = await events.until(is_(ResponseDone))
        assert isinstance(answer, ResponseDone) and answer.status == "completed"
        assert sum(len(e.audio) for e in events.of(AudioReceived)) == 400 * 8
        assert events.of(ProviderError) == []
        [output] = client_frames(fake, "conversation.item.create")
        assert output["item"] == {"type": "function_call_output", "call_id": call.call_id, "output": '{"status":"shipped"}'}
        assert len(client_frames(fake, "response.create")) == 1
        await provider.close()


async def test_barge_in_during_a_long_answer_interrupts_it() -> None:
    script = Script((Turn(reply="tone", duration_ms=20_000),))
    async with await serve(options=RealtimeFakeOptions(speed=1.0), script=script) as fake:
        provider, events = await session(fake)
        for frame in utterance():
            provider.send_audio(frame)
        first = await events.until(is_(AudioReceived))
        assert isinstance(first, AudioReceived)
        for frame in utterance(tail_ms=0):
            provider.send_audio(frame)
        interrupted = await events.until(is_(OutputInterrupted))
        assert interrupted == OutputInterrupted(provider.token, first.item_id)
        assert len(events.of(SpeechStarted)) == 2 and events.of(ResponseDone)[-1].status == "cancelled"
        await provider.close()


async def test_truncate_is_not_sent_to_xai() -> None:
    async with await serve(options=FAST) as fake:
        provider, events = await session(fake)
        assert not provider.capabilities.truncate
        provider.truncate("msg_1", 250)  # xAI has no truncation (it would answer unsupported_event)
        provider.send_text("Hello?", speak=True)
        await events.until(is_(ResponseDone))
        assert client_frames(fake, "conversation.item.truncate") == [] and events.of(ProviderError) == []
        await provider.close()


# -- faults -----------------------------------------------------------------------------------------------------


async def test_garbage_json_is_a_non_fatal_protocol_error() -> None:
    async with await serve(options=FAST) as fake:
        provider, events = await session(fake)
        fake.inject(parse_fault("garbage_json"))
        error = await events.until(is_(ProviderError))
        assert isinstance(error, ProviderError) and not error.fatal and error.code == "invalid_event"
        provider.send_text("Still there?", speak=True)
        await events.until(is_(ResponseDone))
        await provider.close()


async def test_invalid_audio_is_a_fatal_protocol_error() -> None:
    async with await serve(options=FAST) as fake:
        provider, events = await session(fake)
        fake.inject(parse_fault("invalid_audio"))
        provider.send_text("Say something.", speak=True)
        error = await events.until(is_(ProviderError))
        assert isinstance(error, ProviderError) and error.fatal and error.code == "invalid_audio"
        await provider.close()


async def test_the_session_cap_closes_without_an_expiry_error() -> None:
    async with await serve(options=FAST) as fake:
        provider, events = await session(fake)
        fake.inject(parse_fault("close"))
        closed = await events.until(is_(SessionClosed))
        assert events.seen == [closed] and events.of(SessionExpiring) == []
        assert isinstance(closed, SessionClosed) and closed.close_code == 1000 and not closed.finalized
        await provider.close()


async def test_an_abrupt_close_is_an_unfinalised_session_closed() -> None:
    async with await serve(options=FAST) as fake:
        provider, events = await session(fake)
        fake.inject(parse_fault("abrupt_close"))
        closed = await events.until(is_(SessionClosed))
        assert isinstance(closed, SessionClosed) and not closed.finalized and closed.close_code == 1006
        await provider.close()


async def test_a_half_open_connection_yields_no_events() -> None:
    async with await serve(options=RealtimeFakeOptions(speed=20.0, ping_interval_ms=5)) as fake:
        provider, events = await session(fake)
        fake.inject(parse_fault("half_open"))
        for frame in utterance():
            provider.send_audio(frame)
        with pytest.raises(TimeoutError):
            await events.until(lambda e: True, timeout=0.5)
        assert events.seen == []
        await provider.close(timeout=0.5)


async def test_a_duplicated_tool_call_is_passed_on_twice_with_one_call_id() -> None:
    script = Script((Turn(reply="tone", duration_ms=300, tool_call=ToolCallScript("lookup_order", {"order_id": "7"})),))
    async with await serve(options=FAST, script=script, faults=[parse_fault("duplicate_tool_call")]) as fake:
        provider, events = await session(fake)
        for frame in utterance():
            provider.send_audio(frame)
        await events.until(is_(ResponseDone))
        first, second = events.of(ToolCallRequested)
        assert first == second
        await provider.close()


@pytest.mark.parametrize(("faults", "timeout", "reason"), [
    ([parse_fault("slow_handshake:1000")], 0.2, "no session from"),
    ([parse_fault("refuse")], 5.0, "HTTP 503"),
])
async def test_a_late_or_refused_session_is_provider_unavailable_without_the_key(
    faults: Sequence[Fault], timeout: float, reason: str
) -> None:
    async with await serve(options=FAST, faults=faults) as fake:
        with pytest.raises(ProviderUnavailable, match=reason) as info:
            await adapter(fake, key="xai-secret-value", connect_timeout=timeout).connect()
        assert "xai-secret-value" not in str(info.value)


async def test_a_slow_handshake_within_the_connect_timeout_still_starts() -> None:
    async with await serve(options=FAST, faults=[parse_fault("slow_handshake:200")]) as fake:
        provider, _ = await session(fake, connect_timeout=5.0)
        await provider.close()
