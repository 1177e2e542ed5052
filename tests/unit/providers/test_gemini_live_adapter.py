"""The Gemini Live adapter against the Gemini fake over TLS on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from providers.base import ProviderUnavailable, ResumptionRejected, SessionSettings, ToolSpec
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputInterrupted,
    OutputTranscript,
    ProviderError,
    ProviderEvent,
    ResponseDone,
    ResumptionUpdated,
    SessionClosed,
    SessionExpiring,
    SpeechStarted,
    ToolCallRequested,
    UsageUpdated,
)
from providers.fakes.faults import parse_fault
from providers.fakes.gemini_live import GeminiFakeOptions, GeminiFakeServer, serve
from providers.fakes.script import Script, ToolCallScript, Turn
from providers.gemini_live import GeminiLiveAdapter
from rtp.audio import PCM16_24K

OPTIONS = GeminiFakeOptions(response_latency_ms=20, burst_factor=8.0)
TOOL = ToolSpec(
    "lookup_order", "Find an order", {"type": "object", "properties": {"order_id": {"type": "string"}}}
)


def tone_frames(ms: int, hz: float = 1000.0, amplitude: int = 8000) -> list[bytes]:
    t = np.arange(ms * 8) / 8000
    pcm = (amplitude * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes()
    return [pcm[i : i + 320] for i in range(0, len(pcm), 320)]


def silence_frames(ms: int) -> list[bytes]:
    return [bytes(320)] * (ms // 20)


def adapter(
    fake: GeminiFakeServer, settings: SessionSettings | None = None, **kwargs: Any
) -> GeminiLiveAdapter:
    kwargs.setdefault("url", fake.url)
    return GeminiLiveAdapter(
        "test-key-123",
        settings or SessionSettings(),
        limits=GeminiLiveAdapter.audio_limits(PCM16_24K),
        ssl_context=fake.client_ssl_context(),
        **kwargs,
    )


async def collect(
    live: GeminiLiveAdapter, until: Callable[[ProviderEvent], bool], timeout: float = 5.0
) -> list[ProviderEvent]:
    events: list[ProviderEvent] = []
    async with asyncio.timeout(timeout):
        async for event in live.events():
            events.append(event)
            if until(event):
                break
    return events


def speak(live: GeminiLiveAdapter, frames: list[bytes]) -> None:
    for frame in frames:
        live.send_audio(frame)


async def test_a_tone_goes_up_at_16k_and_comes_back_at_24k() -> None:
    settings = SessionSettings(instructions="Be brief.", voice="Kore", history=(("user", "My name is Ada."),))
    async with await serve(options=OPTIONS) as fake:
        live = adapter(fake, settings)
        await live.connect()
        speak(live, tone_frames(600) + silence_frames(800))
        events = await collect(live, lambda e: isinstance(e, UsageUpdated))
        audio = b"".join(e.audio for e in events if isinstance(e, AudioReceived))
        assert {e.format for e in events if isinstance(e, AudioReceived)} == {PCM16_24K}
        x = np.frombuffer(audio, dtype="<i2").astype(float)
        peak = np.argmax(np.abs(np.fft.rfft(x * np.hanning(len(x))))) * 24000 / len(x)
        assert abs(peak - 1000) < 5 and 640 <= len(audio) / 48 <= 680
        heard = [e for e in events if isinstance(e, InputTranscript)]
        # The fragments add up to the utterance, and the final one is the whole of it (it replaces them).
        assert heard[-1].text.startswith("".join(e.text for e in heard if not e.final))
        assert heard[-1].final and heard[-1].text == "[utterance 1, 0.7 s]"
        assert "".join(e.text for e in events if isinstance(e, OutputTranscript)) == "[echo 1, 0.7 s]"
        assert [e for e in events if isinstance(e, ResponseDone)] == [ResponseDone(live.token)]
        usage = events[-1]
        assert (
            isinstance(usage, UsageUpdated)
            and usage.input_tokens
            and usage.output_tokens
            and usage.cumulative
        )
        assert any(isinstance(e, ResumptionUpdated) and e.resumable for e in events)
        await live.close()

        frames = [r.frame for r in fake.connections[0].client_frames]
        setup = frames[0]["setup"]
        assert setup["model"] == "models/gemini-3.1-flash-live-preview"
        assert (
            setup["generationConfig"]["speechConfig"]["voiceConfig"]["prebuiltVoiceConfig"]["voiceName"]
            == "Kore"
        )
        assert frames[1] == {
            "clientContent": {
                "turns": [{"role": "user", "parts": [{"text": "My name is Ada."}]}],
                "turnComplete": False,
            }
        }
        audio_frames = [f["realtimeInput"]["audio"] for f in frames[2:] if "realtimeInput" in f]
        assert {a["mimeType"] for a in audio_frames} == {"audio/pcm;rate=16000"}
        sent = sum(r.audio_bytes or 0 for r in fake.connections[0].client_frames)
        assert abs(sent - 1400 * 32) <= 64  # 1.4 s at 16 kHz, give or take the filter's delay


async def test_tool_round_trip() -> None:
    script = Script(turns=(Turn("tone", 400, tool_call=ToolCallScript("lookup_order", {"order_id": "42"})),))
    async with await serve(options=OPTIONS, script=script) as fake:
        live = adapter(fake, SessionSettings(tools=(TOOL,)))
        await live.connect()
        speak(live, tone_frames(300) + silence_frames(600))
        (call,) = [
            e
            for e in await collect(live, lambda e: isinstance(e, ToolCallRequested))
            if isinstance(e, ToolCallRequested)
        ]
        assert call.name == "lookup_order" and call.arguments == '{"order_id": "42"}'
        live.send_tool_result(call.call_id, call.name, '{"status": "shipped"}')
        events = await collect(live, lambda e: isinstance(e, ResponseDone))
        assert sum(len(e.audio) for e in events if isinstance(e, AudioReceived)) == 400 * 48
        await live.close()
        frames = [r.frame for r in fake.connections[0].client_frames]
        assert frames[0]["setup"]["tools"][0]["functionDeclarations"][0]["name"] == "lookup_order"
        (response,) = [f["toolResponse"] for f in frames if "toolResponse" in f]
        assert response == {
            "functionResponses": [
                {"id": call.call_id, "name": "lookup_order", "response": {"output": {"status": "shipped"}}}
            ]
        }


async def test_barge_in_interrupts_the_model() -> None:
    script = Script(then=Turn("tone", duration_ms=4000))
    async with await serve(
        options=GeminiFakeOptions(response_latency_ms=0, burst_factor=1.0), script=script
    ) as fake:
        live = adapter(fake)
        await live.connect()
        speak(live, tone_frames(300) + silence_frames(600))
        await collect(live, lambda e: isinstance(e, AudioReceived))
        speak(live, tone_frames(200))
        events = await collect(live, lambda e: isinstance(e, ResponseDone))
        kinds = [type(e) for e in events if isinstance(e, (SpeechStarted, OutputInterrupted, ResponseDone))]
        assert kinds == [SpeechStarted, OutputInterrupted, ResponseDone]
        assert sum(len(e.audio) for e in events if isinstance(e, AudioReceived)) < 2000 * 48  # cut short
        assert events[-1] == ResponseDone(live.token, status="cancelled")
        await live.close()


async def test_invalid_audio_is_a_fatal_error() -> None:
    async with await serve(options=OPTIONS, faults=[parse_fault("invalid_audio@100")]) as fake:
        live = adapter(fake)
        await live.connect()
        events = await collect(live, lambda e: isinstance(e, ProviderError))
        error = events[-1]
        assert isinstance(error, ProviderError) and error.fatal and error.code == "invalid_audio"
        await live.close()


async def test_garbage_is_a_non_fatal_error() -> None:
    async with await serve(options=OPTIONS, faults=[parse_fault("garbage_json@100")]) as fake:
        live = adapter(fake)
        await live.connect()
        events = await collect(live, lambda e: isinstance(e, ProviderError))
        assert isinstance(events[-1], ProviderError) and not events[-1].fatal
        await live.close()


async def test_the_close_fault_is_go_away_then_the_expected_1011() -> None:
    async with await serve(options=OPTIONS, faults=[parse_fault("close@200")]) as fake:
        live = adapter(fake)
        await live.connect()
        events = await collect(live, lambda e: isinstance(e, SessionClosed))
        expiring = [e for e in events if isinstance(e, SessionExpiring)]
        assert expiring == [SessionExpiring(live.token, 0, "go_away")]
        closed = events[-1]
        assert isinstance(closed, SessionClosed) and closed.close_code == 1011 and not closed.finalized
        assert closed.reason.startswith("go_away: ") and "Deadline expired" in closed.reason
        await live.close()


async def test_an_abrupt_close_is_a_lost_connection() -> None:
    async with await serve(options=OPTIONS, faults=[parse_fault("abrupt_close@200")]) as fake:
        live = adapter(fake)
        await live.connect()
        closed = (await collect(live, lambda e: isinstance(e, SessionClosed)))[-1]
        assert isinstance(closed, SessionClosed) and closed.close_code == 1006
        assert closed.reason.startswith("connection_lost")
        await live.close()


async def test_refusals_are_provider_unavailable_without_the_key() -> None:
    async with await serve(options=OPTIONS) as fake:
        with pytest.raises(ProviderUnavailable, match="1008") as info:
            await adapter(fake, model="gemini-9-live").connect()
        assert "test-key-123" not in str(info.value) and "gemini-9-live" in str(info.value)
    async with await serve(options=OPTIONS, faults=[parse_fault("refuse")]) as fake:
        with pytest.raises(ProviderUnavailable, match="HTTP 503"):
            await adapter(fake).connect()
    async with await serve(options=OPTIONS, faults=[parse_fault("slow_handshake:2000")]) as fake:
        with pytest.raises(ProviderUnavailable, match="within 0.3 s"):
            await adapter(fake, connect_timeout=0.3).connect()


async def test_an_untrusted_certificate_is_refused() -> None:
    async with await serve(options=OPTIONS) as fake:
        live = GeminiLiveAdapter(
            "k", SessionSettings(), limits=GeminiLiveAdapter.audio_limits(PCM16_24K), url=fake.url
        )
        with pytest.raises(ProviderUnavailable, match="cannot connect"):
            await live.connect()


async def test_a_host_only_url_gets_the_default_path_and_request_close_ends_the_session() -> None:
    async with await serve(options=OPTIONS) as fake:
        live = adapter(fake, url=f"wss://localhost:{fake.port}", api_version="v1alpha")
        assert live.url.endswith(
            "/ws/google.ai.generativelanguage.v1alpha.GenerativeService.BidiGenerateContent"
        )
        await live.connect()
        live.request_close()
        closed = (await collect(live, lambda e: isinstance(e, SessionClosed)))[-1]
        assert isinstance(closed, SessionClosed) and closed.reason.startswith("close_requested")
        assert closed.close_code == 1000
        await live.close()


async def test_a_new_connection_resumes_with_the_handle() -> None:
    script = Script(then=Turn("tone", duration_ms=200))
    async with await serve(options=OPTIONS, script=script) as fake:
        first = adapter(fake)
        await first.connect()
        speak(first, tone_frames(300) + silence_frames(600))
        await collect(first, lambda e: isinstance(e, ResponseDone))
        await collect(first, lambda e: isinstance(e, ResumptionUpdated))
        handle = first.core.resumption_handle
        assert handle
        await first.close()
        second = adapter(fake, SessionSettings(resume_handle=handle), token=2)
        await second.connect()
        second.send_text("hello", speak=True)
        events = await collect(second, lambda e: isinstance(e, ResponseDone))
        text = "".join(e.text for e in events if isinstance(e, OutputTranscript))
        assert text == "[tone 2, 0.2 s]" and {e.token for e in events} == {2}
        await second.close()
        assert fake.connections[1].session_id == fake.connections[0].session_id


# -- commit_input (audioStreamEnd, RO2) and resumption from SessionSettings.resume_handle --------------------


async def test_ro2_commit_input_ends_the_callers_activity_so_it_is_transcribed_and_answered() -> None:
    script = Script(then=Turn("tone", duration_ms=200))
    async with await serve(options=OPTIONS, script=script) as fake:
        live = adapter(fake)
        await live.connect()
        speak(live, tone_frames(600))  # no trailing silence: the fake's VAD still hears the caller speaking
        live.commit_input()
        events = await collect(live, lambda e: isinstance(e, ResponseDone))
        finals = [e for e in events if isinstance(e, InputTranscript) and e.final]
        assert len(finals) == 1
        assert finals[0].text.startswith("[utterance 1,")
        assert "".join(e.text for e in events if isinstance(e, OutputTranscript)) == "[tone 1, 0.2 s]"
        ends = [
            f.frame
            for f in fake.connections[0].client_frames
            if f.frame is not None and "audioStreamEnd" in (f.frame.get("realtimeInput") or {})
        ]
        assert ends == [{"realtimeInput": {"audioStreamEnd": True}}]
        await live.close()


async def test_a_resumed_connection_continues_the_conversation_without_seeding_history() -> None:
    script = Script(then=Turn("tone", duration_ms=200))
    history = (("user", "My name is Ada."),)
    async with await serve(options=OPTIONS, script=script) as fake:
        first = adapter(fake, SessionSettings(history=history))
        await first.connect()
        speak(first, tone_frames(300) + silence_frames(600))
        await collect(first, lambda e: isinstance(e, ResponseDone))
        updates = [
            e
            for e in await collect(first, lambda e: isinstance(e, ResumptionUpdated))
            if isinstance(e, ResumptionUpdated)
        ]
        assert updates[-1].resumable and updates[-1].handle == first.core.resumption_handle
        await first.close()
        second = adapter(
            fake, SessionSettings(history=history, resume_handle=first.core.resumption_handle), token=2
        )
        await second.connect()
        speak(second, tone_frames(300) + silence_frames(600))
        events = await collect(second, lambda e: isinstance(e, ResponseDone))
        heard = [e.text for e in events if isinstance(e, InputTranscript) and e.final]
        assert heard[0].startswith("[utterance 2,")  # the session's second utterance: the state went on
        await second.close()
        first_rec, second_rec = fake.connections
        assert second_rec.session_id == first_rec.session_id
        assert second_rec.resumed_handle == first_rec.handles[-1]
        seeded = [f for f in second_rec.client_frames if f.frame is not None and "clientContent" in f.frame]
        assert seeded == [] and [f for f in first_rec.client_frames if f.frame and "clientContent" in f.frame]


async def test_an_unknown_handle_is_resumption_rejected() -> None:
    async with await serve(options=OPTIONS) as fake:
        live = adapter(fake, SessionSettings(resume_handle="handle_never_issued"))
        with pytest.raises(ResumptionRejected, match="1007"):
            await live.connect()
        fresh = adapter(fake, token=2)  # the bridge's answer: a reseeded connection without the handle
        await fresh.connect()
        await fresh.close()


async def test_an_expired_handle_is_resumption_rejected() -> None:
    options = GeminiFakeOptions(response_latency_ms=20, burst_factor=8.0, handle_ttl_ms=100)
    async with await serve(options=options) as fake:
        first = adapter(fake)
        await first.connect()
        await collect(first, lambda e: isinstance(e, ResumptionUpdated) and e.resumable)
        handle = first.core.resumption_handle
        await first.close()
        await asyncio.sleep(0.3)  # past the handle's 100 ms after the session ended
        with pytest.raises(ResumptionRejected):
            await adapter(fake, SessionSettings(resume_handle=handle), token=2).connect()
        assert fake.connections[1].close_code == 1007


async def test_a_handle_whose_session_is_still_open_is_resumption_rejected() -> None:
    async with await serve(options=OPTIONS) as fake:
        first = adapter(fake)
        await first.connect()
        await collect(first, lambda e: isinstance(e, ResumptionUpdated) and e.resumable)
        with pytest.raises(ResumptionRejected, match="1011"):
            await adapter(
                fake, SessionSettings(resume_handle=first.core.resumption_handle), token=2
            ).connect()
        await first.close()


async def test_a_refusal_that_is_not_about_the_handle_stays_provider_unavailable() -> None:
    async with await serve(options=OPTIONS) as fake:
        first = adapter(fake)
        await first.connect()
        await collect(first, lambda e: isinstance(e, ResumptionUpdated) and e.resumable)
        handle = first.core.resumption_handle
        await first.close()
        unknown_model = adapter(fake, SessionSettings(resume_handle=handle), model="no-such-model", token=2)
        with pytest.raises(ProviderUnavailable) as info:
            await unknown_model.connect()
        assert not isinstance(info.value, ResumptionRejected) and "1008" in str(info.value)


async def test_paired_caller_frames_go_up_as_40_ms_audio_and_come_back_the_same() -> None:
    """`Capabilities.append_frames` 2 (the session joins two 20 ms frames per `send_audio`): the fake, which
    checks every client message, takes 40 ms of 16 kHz audio per `realtimeInput.audio` and answers as to 20 ms
    ones."""
    assert GeminiLiveAdapter.capabilities.append_frames == 2
    async with await serve(options=OPTIONS) as fake:
        live = adapter(fake)
        await live.connect()
        frames = tone_frames(600) + silence_frames(800)
        speak(live, [frames[i] + frames[i + 1] for i in range(0, len(frames), 2)])
        events = await collect(live, lambda e: isinstance(e, UsageUpdated))
        assert not [e for e in events if isinstance(e, ProviderError)]
        assert "".join(e.text for e in events if isinstance(e, OutputTranscript)) == "[echo 1, 0.7 s]"
        await live.close()
        audio = [r for r in fake.connections[0].client_frames if r.audio_bytes]
        assert (
            len(audio) == len(frames) // 2 and abs(sum(r.audio_bytes or 0 for r in audio) - 1400 * 32) <= 64
        )
    own = adapter(fake, append_ms=100)  # its own batcher joins the frames: the session gives them one by one
    assert own.capabilities.append_frames == 1 and GeminiLiveAdapter.capabilities.append_frames == 2
    assert adapter(fake, append_ms=20).capabilities.append_frames == 1  # each frame alone
    assert adapter(fake).capabilities.append_frames == 2  # the default, 40: the session's pairs
