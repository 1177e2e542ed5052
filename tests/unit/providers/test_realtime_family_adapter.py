"""The Realtime-family adapters (OpenAI Realtime GA and xAI Grok voice) against their fakes over a real loopback
socket. Cases that are the same for both dialects are parametrised over them; what one dialect does differently
(its usage, transcripts, truncation, session cap, keepalive) has its own test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
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
from providers.fakes import openai_realtime as openai_fake
from providers.fakes import xai as xai_fake
from providers.fakes.faults import Fault, parse_fault
from providers.fakes.realtime_family import RealtimeFakeOptions
from providers.fakes.script import Script, ToolCallScript, Turn
from providers.fakes.server import FakeServer
from providers.openai_realtime import OpenAIRealtimeAdapter
from providers.realtime_family import RealtimeAdapter
from providers.xai import XAIAdapter
from rtp.audio import PCMU_8K
from rtp.g711 import ulaw_encode

FAST = RealtimeFakeOptions(speed=20.0)
LOOKUP = ToolSpec(
    "lookup_order", "Find an order.", {"type": "object", "properties": {"order_id": {"type": "string"}}}
)


@dataclass(frozen=True)
class Family:
    """One dialect: its adapter, its fake, a test key, and the fake options its half-open test needs."""

    adapter: type[RealtimeAdapter]
    serve: Callable[..., Any]
    key: str
    keepalive: RealtimeFakeOptions  # options under which a half-open fake would otherwise talk at once


OPENAI = Family(OpenAIRealtimeAdapter, openai_fake.serve, "sk-test", FAST)
XAI = Family(XAIAdapter, xai_fake.serve, "xai-test", RealtimeFakeOptions(speed=20.0, ping_interval_ms=5))
FAMILIES = pytest.mark.parametrize("family", [OPENAI, XAI], ids=["openai", "xai"])


def tone(ms: int, amplitude: int = 8000) -> bytes:
    t = np.arange(ms * 8) / 8000
    return (amplitude * np.sin(2 * np.pi * 1000 * t)).astype("<i2").tobytes()


def utterance(tone_ms: int = 400, lead_ms: int = 200, tail_ms: int = 700) -> list[bytes]:
    """Silence, a 1 kHz tone, then silence past the fake VAD's 500 ms hangover, as 20 ms 8 kHz PCM16 frames."""
    pcm = bytes(lead_ms * 16) + tone(tone_ms) + bytes(tail_ms * 16)
    return [pcm[i : i + 320] for i in range(0, len(pcm), 320)]


def adapter(fake: FakeServer, family: Family = OPENAI, key: str | None = None, **kw: Any) -> RealtimeAdapter:
    settings = kw.pop("settings", SessionSettings(instructions="You are a phone agent.", tools=(LOOKUP,)))
    cls = family.adapter
    return cls(key or family.key, settings, limits=cls.audio_limits(PCMU_8K), url=fake.url, **kw)


class Events:
    """One pass over `events()`: every event is kept in `seen`; `until` reads up to the first match."""

    def __init__(self, provider: RealtimeAdapter) -> None:
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


async def session(fake: FakeServer, family: Family = OPENAI, **kw: Any) -> tuple[RealtimeAdapter, Events]:
    provider = adapter(fake, family, **kw)
    started = await provider.connect()
    assert isinstance(started, SessionStarted) and started.session_id
    if family is OPENAI:
        assert started.session_id.startswith("sess_")
    return provider, Events(provider)


def client_frames(fake: FakeServer, kind: str) -> list[dict[str, Any]]:
    return [
        f.frame
        for f in fake.connections[0].client_frames
        if f.frame is not None and f.frame.get("type") == kind
    ]


# -- OpenAI Realtime GA only ------------------------------------------------------------------------------------


async def test_caller_audio_goes_up_as_pcmu_and_the_echo_comes_back_with_transcripts_and_usage() -> None:
    async with await openai_fake.serve(options=FAST) as fake:
        provider, events = await session(fake)
        frames = utterance()
        for frame in frames:
            provider.send_audio(frame)
        done = await events.until(is_(ResponseDone))
        await events.until(is_(UsageUpdated))
        [started] = events.of(SpeechStarted)
        [stopped] = events.of(SpeechStopped)
        assert started.item_id is not None and stopped.item_id == started.item_id
        assert started.at_ms is not None and stopped.at_ms is not None and stopped.at_ms > started.at_ms
        echoed = b"".join(e.audio for e in events.of(AudioReceived))
        assert {e.format for e in events.of(AudioReceived)} == {PCMU_8K}
        assert len(echoed) >= 400 * 8 and echoed in ulaw_encode(b"".join(frames))  # the exact PCMU bytes sent
        assert {e.item_id for e in events.of(AudioReceived)} == {
            next(iter(events.of(OutputTranscript))).item_id
        }
        assert any(t.final and t.item_id == started.item_id for t in events.of(InputTranscript))
        assert any(t.final for t in events.of(OutputTranscript))
        assert isinstance(done, ResponseDone) and done.status == "completed"
        [usage] = events.of(UsageUpdated)
        assert not usage.cumulative and usage.input_tokens and usage.output_tokens
        assert events.of(ProviderError) == []
        [update] = client_frames(fake, "session.update")
        assert update["session"]["type"] == "realtime"
        assert update["session"]["audio"]["input"]["format"] == {"type": "audio/pcmu"}
        assert update["session"]["tools"][0]["name"] == "lookup_order"
        provider.request_close()
        closed = await events.until(is_(SessionClosed))
        assert isinstance(closed, SessionClosed) and not closed.finalized and closed.close_code == 1000
        await provider.close()


async def test_history_is_seeded_before_the_caller_speaks() -> None:
    async with await openai_fake.serve(options=FAST) as fake:
        settings = SessionSettings(history=(("user", "My order is 42."), ("assistant", "Let me check.")))
        provider, events = await session(fake, settings=settings)
        provider.send_text("Hello?", speak=True)
        await events.until(is_(ResponseDone))  # the fake has read everything sent before
        items = [f["item"] for f in client_frames(fake, "conversation.item.create")]
        assert [(i["role"], i["content"][0]["type"]) for i in items] == [
            ("user", "input_text"),
            ("assistant", "output_text"),
            ("user", "input_text"),
        ]
        assert events.of(ProviderError) == []
        await provider.close()


async def test_truncate_reports_what_the_caller_heard() -> None:
    script = Script((Turn(reply="tone", duration_ms=600),))
    async with await openai_fake.serve(options=FAST, script=script) as fake:
        provider, events = await session(fake)
        for frame in utterance():
            provider.send_audio(frame)
        await events.until(is_(ResponseDone))
        [item_id] = {e.item_id for e in events.of(AudioReceived)}
        assert item_id is not None
        provider.truncate(
            item_id, 250
        )  # the fake answers conversation.item.truncated: no event for the engine
        provider.truncate(item_id, 60_000)  # longer than the item: the fake refuses it
        error = await events.until(is_(ProviderError))
        assert isinstance(error, ProviderError) and not error.fatal and error.code == "invalid_value"
        assert [e for e in events.seen if isinstance(e, ProviderError)] == [
            error
        ]  # the first one was accepted
        assert [f["audio_end_ms"] for f in client_frames(fake, "conversation.item.truncate")] == [250, 60_000]
        await provider.close()


async def test_cancel_stops_an_active_response() -> None:
    script = Script((Turn(reply="tone", duration_ms=20_000),))
    async with await openai_fake.serve(options=RealtimeFakeOptions(speed=1.0), script=script) as fake:
        provider, events = await session(fake)
        provider.cancel_response()  # nothing active: nothing sent
        for frame in utterance():
            provider.send_audio(frame)
        await events.until(is_(AudioReceived))
        provider.cancel_response()
        done = await events.until(is_(ResponseDone))
        assert isinstance(done, ResponseDone) and done.status == "cancelled"
        assert events.of(OutputInterrupted) == [] and events.of(ProviderError) == []
        assert len(client_frames(fake, "response.cancel")) == 1
        await provider.close()


async def test_send_text_speaks_when_asked() -> None:
    async with await openai_fake.serve(options=FAST) as fake:
        provider, events = await session(fake)
        provider.send_text("The caller pressed 5.", speak=True)
        done = await events.until(is_(ResponseDone))
        assert isinstance(done, ResponseDone) and done.status == "completed" and events.of(AudioReceived)
        await provider.close()


async def test_the_session_cap_announces_expiry_then_closes_1001() -> None:
    async with await openai_fake.serve(options=FAST) as fake:
        provider, events = await session(fake)
        fake.inject(parse_fault("close"))
        closed = await events.until(is_(SessionClosed))
        expiring, error = events.seen[:2]
        assert expiring == SessionExpiring(provider.token, 0, "session_expired")
        assert isinstance(error, ProviderError) and error.code == "session_expired" and not error.fatal
        assert isinstance(closed, SessionClosed) and closed.close_code == 1001 and not closed.finalized
        await provider.close()


# -- xAI only ---------------------------------------------------------------------------------------------------


async def test_caller_audio_goes_up_as_pcmu_and_the_echo_comes_back_with_snapshots_and_audio_usage() -> None:
    async with await xai_fake.serve(options=FAST) as fake:
        provider, events = await session(fake, XAI)
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
    async with await xai_fake.serve(options=RealtimeFakeOptions(speed=20.0, ping_interval_ms=5)) as fake:
        provider, events = await session(fake, XAI)
        provider.send_text("Hello?", speak=True)
        await events.until(is_(UsageUpdated))
        assert events.of(ProviderError) == []
        await provider.close()


async def test_truncate_is_not_sent_to_xai() -> None:
    async with await xai_fake.serve(options=FAST) as fake:
        provider, events = await session(fake, XAI)
        assert not provider.capabilities.truncate
        provider.truncate("msg_1", 250)  # xAI has no truncation (it would answer unsupported_event)
        provider.send_text("Hello?", speak=True)
        await events.until(is_(ResponseDone))
        assert client_frames(fake, "conversation.item.truncate") == [] and events.of(ProviderError) == []
        await provider.close()


async def test_the_session_cap_closes_without_an_expiry_error() -> None:
    async with await xai_fake.serve(options=FAST) as fake:
        provider, events = await session(fake, XAI)
        fake.inject(parse_fault("close"))
        closed = await events.until(is_(SessionClosed))
        assert events.seen == [closed] and events.of(SessionExpiring) == []
        assert isinstance(closed, SessionClosed) and closed.close_code == 1000 and not closed.finalized
        await provider.close()


# -- both dialects ----------------------------------------------------------------------------------------------


@FAMILIES
async def test_a_tool_call_round_trip_ends_in_a_spoken_answer(family: Family) -> None:
    script = Script(
        (Turn(reply="tone", duration_ms=400, tool_call=ToolCallScript("lookup_order", {"order_id": "42"})),)
    )
    async with await family.serve(options=FAST, script=script) as fake:
        provider, events = await session(fake, family)
        for frame in utterance():
            provider.send_audio(frame)
        call = await events.until(is_(ToolCallRequested))
        assert isinstance(call, ToolCallRequested)
        assert (call.name, call.arguments, call.kind) == ("lookup_order", '{"order_id":"42"}', "function")
        # The tool-call response is still open here (xAI sends the call alongside response.done): the adapter
        # must hold response.create until it is done.
        provider.send_tool_result(call.call_id, call.name, '{"status":"shipped"}')
        await events.until(is_(ResponseDone))
        answer = await events.until(is_(ResponseDone))
        assert isinstance(answer, ResponseDone) and answer.status == "completed"
        assert sum(len(e.audio) for e in events.of(AudioReceived)) == 400 * 8
        assert events.of(ProviderError) == []  # never conversation_already_has_active_response
        [output] = client_frames(fake, "conversation.item.create")
        assert output["item"] == {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": '{"status":"shipped"}',
        }
        assert len(client_frames(fake, "response.create")) == 1
        await provider.close()


@FAMILIES
async def test_barge_in_during_a_long_answer_interrupts_it(family: Family) -> None:
    script = Script((Turn(reply="tone", duration_ms=20_000),))
    async with await family.serve(options=RealtimeFakeOptions(speed=1.0), script=script) as fake:
        provider, events = await session(fake, family)
        for frame in utterance():
            provider.send_audio(frame)
        first = await events.until(is_(AudioReceived))
        assert isinstance(first, AudioReceived)
        for frame in utterance(tail_ms=0):  # the caller speaks over the answer
            provider.send_audio(frame)
        interrupted = await events.until(is_(OutputInterrupted))
        assert interrupted == OutputInterrupted(provider.token, first.item_id)
        assert len(events.of(SpeechStarted)) == 2
        done = events.of(ResponseDone)[-1]
        assert done.status == "cancelled"
        assert sum(len(e.audio) for e in events.of(AudioReceived)) < 20_000 * 8
        await provider.close()


@FAMILIES
async def test_garbage_json_is_a_non_fatal_protocol_error(family: Family) -> None:
    async with await family.serve(options=FAST) as fake:
        provider, events = await session(fake, family)
        fake.inject(parse_fault("garbage_json"))
        error = await events.until(is_(ProviderError))
        assert isinstance(error, ProviderError) and not error.fatal and error.code == "invalid_event"
        assert error.raw is not None and error.raw.startswith('{"type":"response.output_audio.delta"')
        provider.send_text("Still there?", speak=True)  # the session goes on
        await events.until(is_(ResponseDone))
        await provider.close()


@FAMILIES
async def test_invalid_audio_is_a_fatal_protocol_error(family: Family) -> None:
    async with await family.serve(options=FAST) as fake:
        provider, events = await session(fake, family)
        fake.inject(parse_fault("invalid_audio"))
        provider.send_text("Say something.", speak=True)
        error = await events.until(is_(ProviderError))
        assert isinstance(error, ProviderError) and error.fatal and error.code == "invalid_audio"
        await provider.close()


@FAMILIES
async def test_an_abrupt_close_is_an_unfinalised_session_closed(family: Family) -> None:
    async with await family.serve(options=FAST) as fake:
        provider, events = await session(fake, family)
        fake.inject(parse_fault("abrupt_close"))
        closed = await events.until(is_(SessionClosed))
        assert events.seen == [closed]
        assert isinstance(closed, SessionClosed) and not closed.finalized and closed.close_code == 1006
        await provider.close()


@FAMILIES
async def test_a_half_open_connection_yields_no_events(family: Family) -> None:
    async with await family.serve(options=family.keepalive) as fake:
        provider, events = await session(fake, family)
        fake.inject(parse_fault("half_open"))
        for frame in utterance():
            provider.send_audio(frame)  # would give speech_started at once on a healthy connection
        with pytest.raises(TimeoutError):
            await events.until(lambda e: True, timeout=0.5)
        assert events.seen == []
        await provider.close(timeout=0.5)


@FAMILIES
async def test_a_duplicated_tool_call_is_passed_on_twice_with_one_call_id(family: Family) -> None:
    script = Script(
        (Turn(reply="tone", duration_ms=300, tool_call=ToolCallScript("lookup_order", {"order_id": "7"})),)
    )
    async with await family.serve(
        options=FAST, script=script, faults=[parse_fault("duplicate_tool_call")]
    ) as fake:
        provider, events = await session(fake, family)
        for frame in utterance():
            provider.send_audio(frame)
        await events.until(is_(ResponseDone))
        first, second = events.of(ToolCallRequested)  # the session's job ledger dedups, not the adapter
        assert first == second
        await provider.close()


@FAMILIES
@pytest.mark.parametrize(
    ("faults", "timeout", "reason"),
    [
        ([parse_fault("slow_handshake:1000")], 0.2, "no session from"),
        ([parse_fault("refuse")], 5.0, "HTTP 503"),
    ],
)
async def test_a_late_or_refused_session_is_provider_unavailable_without_the_key(
    family: Family, faults: Sequence[Fault], timeout: float, reason: str
) -> None:
    secret = family.key.replace("test", "secret-value")
    async with await family.serve(options=FAST, faults=faults) as fake:
        with pytest.raises(ProviderUnavailable, match=reason) as info:
            await adapter(fake, family, key=secret, connect_timeout=timeout).connect()
        assert secret not in str(info.value)


@FAMILIES
async def test_a_slow_handshake_within_the_connect_timeout_still_starts(family: Family) -> None:
    async with await family.serve(options=FAST, faults=[parse_fault("slow_handshake:200")]) as fake:
        provider, _ = await session(fake, family, connect_timeout=5.0)
        await provider.close()


# -- commits: RO2's commit at the hard stop, RO5's client turn detection -------------------------------


@FAMILIES
async def test_ro2_a_commit_mid_utterance_is_transcribed_once(family: Family) -> None:
    """The hard stop commits what the caller is still saying: the server transcribes that item (once)."""
    async with await family.serve(options=FAST) as fake:
        provider, events = await session(fake, family, settings=SessionSettings())
        for frame in utterance(tone_ms=1200, tail_ms=0)[
            :45
        ]:  # 200 ms silence, 700 ms of speech: still talking
            provider.send_audio(frame)
        started = await events.until(is_(SpeechStarted))
        assert isinstance(started, SpeechStarted)
        provider.commit_input()
        final = await events.until(lambda e: isinstance(e, InputTranscript) and e.final)
        assert isinstance(final, InputTranscript) and final.item_id == started.item_id
        assert final.text.startswith("[utterance 1, ")
        provider.commit_input()  # nothing new: nothing sent
        await asyncio.sleep(0)
        assert len(client_frames(fake, "input_audio_buffer.commit")) == 1
        assert [t for t in events.of(InputTranscript) if t.final] == [final]
        assert events.of(ProviderError) == []
        await provider.close()


@FAMILIES
async def test_ro5_client_turn_detection_answers_only_committed_audio(family: Family) -> None:
    """turn_detection null: no server VAD events, nothing answered until the commit; then the commit is
    transcribed and answered once (OpenAI after our response.create, xAI by itself)."""
    async with await family.serve(options=FAST) as fake:
        provider, events = await session(fake, family, settings=SessionSettings(turn_detection="client"))
        frames = utterance()
        said = fake.connections[0].server_frames
        for frame in frames:
            provider.send_audio(frame)
        await asyncio.sleep(0.8)  # a server VAD would have answered within this (the tests above: ~0.3 s)
        assert fake.connections[0].server_frames == said and len(fake.connections[0].client_frames) > len(
            frames
        )
        provider.commit_input()
        done = await events.until(is_(ResponseDone))
        assert isinstance(done, ResponseDone) and done.status == "completed"
        assert events.of(SpeechStarted) == [] and events.of(SpeechStopped) == []
        [final] = [t for t in events.of(InputTranscript) if t.final]
        echoed = b"".join(e.audio for e in events.of(AudioReceived))
        assert echoed and echoed in ulaw_encode(b"".join(frames))  # the committed audio, answered
        [update] = client_frames(fake, "session.update")
        session_json = update["session"]
        td = (
            session_json["audio"]["input"]["turn_detection"]
            if family is OPENAI
            else session_json["turn_detection"]
        )
        assert td is None
        creates = client_frames(fake, "response.create")
        assert len(creates) == (1 if family is OPENAI else 0)
        assert len(client_frames(fake, "input_audio_buffer.commit")) == 1 and final.item_id
        assert events.of(ProviderError) == []
        await provider.close()


# -- the injected wire tap (DESIGN §2: providers never import rtp.probe) and the choice of turn detection ---------


class Tap:
    def __init__(self, log: list[tuple[str, int, object]]) -> None:
        self.log = log

    def audio_sent(self, t_ns: int, frame: str) -> None:
        self.log.append(("sent", t_ns, frame))

    def audio_received(self, t_ns: int, audio: bytes, fmt: object) -> None:
        self.log.append(("received", t_ns, (len(audio), fmt)))


async def test_an_injected_wire_tap_sees_the_audio_both_ways() -> None:
    log: list[tuple[str, int, object]] = []
    opened: list[Tap] = []

    def factory() -> Tap:
        opened.append(Tap(log))
        return opened[-1]

    async with await openai_fake.serve(options=FAST) as fake:
        provider, events = await session(fake, wire_tap=factory)
        assert len(opened) == 1  # once per connection, as it opens
        frames = utterance()
        for frame in frames:
            provider.send_audio(frame)
        await events.until(is_(ResponseDone))
        sent = [entry for entry in log if entry[0] == "sent"]
        received = [entry for entry in log if entry[0] == "received"]
        assert len(sent) == len(frames) and all('"input_audio_buffer.append"' in str(e[2]) for e in sent)
        assert sum(n for _, _, (n, _) in received) == sum(len(e.audio) for e in events.of(AudioReceived))  # type: ignore[misc]
        assert all(fmt == PCMU_8K for _, _, (_, fmt) in received)  # type: ignore[misc]
        await provider.close()


def test_the_provider_choice_passes_client_turn_detection_on_and_refuses_it_where_impossible() -> None:
    from bridge.server.providers import KINDS, ProviderChoice

    client = SessionSettings(turn_detection="client")
    for name in ("openai-realtime", "xai"):
        kind = KINDS[name]
        assert kind.client_commits()
        built = ProviderChoice(kind, "k", "ws://127.0.0.1:9/v1/realtime", client).connect(1)
        assert isinstance(built, RealtimeAdapter) and built.core.settings.turn_detection == "client"
    for name in ("openai-live", "gemini-live"):
        assert not KINDS[name].client_commits()
        with pytest.raises(ValueError, match="turn detection"):
            ProviderChoice(KINDS[name], "k", None, client).connect(1)


def test_with_the_probe_on_the_provider_choice_injects_its_tap(monkeypatch: pytest.MonkeyPatch) -> None:
    """PARLORA_PROBE: bridge/server/providers.py hands each adapter rtp.probe's points; providers/ never imports it."""
    import bridge.server.providers as choice_module
    from bridge.server.providers import KINDS, ProbeTap, ProviderChoice
    from rtp import probe

    choice = ProviderChoice(KINDS["openai-realtime"], "k", "ws://127.0.0.1:9/v1/realtime", SessionSettings())
    monkeypatch.setattr(probe, "ENABLED", False)
    assert choice.connect(1).shell._tap_factory is None  # type: ignore[attr-defined]
    monkeypatch.setattr(probe, "ENABLED", True)
    assert choice.connect(2).shell._tap_factory is choice_module.probe_tap  # type: ignore[attr-defined]
    seen: list[tuple[str, object]] = []
    monkeypatch.setattr(probe, "current_call", lambda: "call-7")
    monkeypatch.setattr(probe, "ws_sent", lambda call, t, frame: seen.append(("sent", (call, t, frame))))
    monkeypatch.setattr(
        probe, "ws_received", lambda call, t, audio, fmt: seen.append(("received", (call, t, fmt)))
    )
    tap = choice_module.probe_tap()
    assert isinstance(tap, ProbeTap) and tap.call == "call-7"
    tap.audio_sent(5, "{}")
    tap.audio_received(6, b"\xff", PCMU_8K)
    assert seen == [("sent", ("call-7", 5, "{}")), ("received", ("call-7", 6, PCMU_8K))]
    import providers.ws_shell as shell_module

    assert "probe" not in vars(shell_module)  # DESIGN §2


def test_ro5_the_server_config_turn_detection_reaches_the_rollover_and_is_refused_where_impossible() -> None:
    from bridge.engine.rollover import RolloverOptions
    from bridge.server.api import Application, Server, ServerConfig

    for name in ("openai-realtime", "xai"):
        server = Server(Application(), ServerConfig(provider=name, key="k", turn_detection="client"))
        rollover = server._plans.default[1]  # the default provider's plan (bridge/server/plans.py)
        assert rollover is not None and rollover.client_commits  # RO5: flushes switch
        explicit = ServerConfig(provider=name, key="k", turn_detection="client", rollover=RolloverOptions())
        assert Server(Application(), explicit)._plans.default[1] == RolloverOptions(client_commits=True)
    plain = Server(Application(), ServerConfig(provider="openai-realtime", key="k"))
    assert plain._plans.default[1] is not None and not plain._plans.default[1].client_commits
    for name in ("echo", "openai-live", "gemini-live"):
        with pytest.raises(ValueError, match="turn detection"):
            Server(Application(), ServerConfig(provider=name, key="k", turn_detection="client"))


@FAMILIES
async def test_paired_caller_frames_go_up_as_40_ms_appends_and_are_heard_as_20_ms_ones(
    family: Family,
) -> None:
    """`Capabilities.append_frames` 2 (the session joins two 20 ms frames per `send_audio`): the fake, which
    checks every client message, takes 40 ms appends, and its VAD places the caller's speech where it placed it
    from 20 ms appends."""
    assert family.adapter.capabilities.append_frames == 2
    frames = utterance()
    starts: list[tuple[int | None, int | None]] = []
    for batch in (frames, [frames[i] + frames[i + 1] for i in range(0, len(frames) - 1, 2)]):
        async with await family.serve(options=FAST) as fake:
            provider, events = await session(fake, family)
            for audio in batch:
                provider.send_audio(audio)
            await events.until(is_(ResponseDone))
            [started] = events.of(SpeechStarted)
            [stopped] = events.of(SpeechStopped)
            starts.append((started.at_ms, stopped.at_ms))
            assert events.of(ProviderError) == []
            appends = client_frames(fake, "input_audio_buffer.append")
            assert len(appends) == len(batch)
            await provider.close()
    assert starts[0] == starts[1]
    own = adapter(
        fake, family, append_ms=100
    )  # its own batcher joins the frames: the session gives them alone
    assert own.capabilities.append_frames == 1 and family.adapter.capabilities.append_frames == 2
    assert adapter(fake, family, append_ms=20).capabilities.append_frames == 1  # each frame alone
    assert adapter(fake, family).capabilities.append_frames == 2  # the default, 40: the session's pairs
