"""The official openai SDK (3.57.0) against the OpenAI Realtime fake on loopback.

The SDK parses leniently, so every raw server frame is also validated strictly against the SDK's per-type model
(providers.md §6.1 recipe), and every client frame the SDK sent against the client-event models.
"""

from __future__ import annotations

import asyncio
import base64
import json
import typing
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pydantic
import pytest
from openai import AsyncOpenAI
from openai.types.realtime import (
    RealtimeClientEvent,
    RealtimeServerEvent,
    ResponseAudioDeltaEvent,
    ResponseDoneEvent,
    SessionCreatedEvent,
)
from websockets.exceptions import ConnectionClosedError

from providers.fakes import openai_realtime
from providers.fakes.faults import parse_fault
from providers.fakes.realtime_family import RealtimeFakeOptions
from providers.fakes.script import Script, ToolCallScript, Turn
from providers.fakes.server import FakeServer
from rtp.g711 import ulaw_encode

pytestmark = pytest.mark.timeout(30)


def _type_map(alias: Any) -> dict[str, type[pydantic.BaseModel]]:
    union = typing.get_args(alias)[0]
    return {typing.get_args(c.model_fields["type"].annotation)[0]: c for c in typing.get_args(union)}


SERVER, CLIENT = _type_map(RealtimeServerEvent), _type_map(RealtimeClientEvent)
PCMU = {"type": "audio/pcmu"}
SESSION = {
    "type": "realtime",
    "instructions": "You are a phone agent.",
    "audio": {
        "input": {
            "format": PCMU,
            "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
            "turn_detection": {
                "type": "server_vad",
                "threshold": 0.5,
                "prefix_padding_ms": 300,
                "silence_duration_ms": 500,
                "create_response": True,
                "interrupt_response": True,
            },
        },
        "output": {"format": PCMU, "voice": "marin"},
    },
}


def utterance() -> bytes:
    """µ-law at 8 kHz: 400 ms quiet, 800 ms of a 1 kHz tone, 900 ms quiet."""
    rng = np.random.default_rng(0)
    t = np.arange(6400) / 8000
    x = np.concatenate(
        [rng.normal(0, 5e-4, 3200), 0.3 * np.sin(2 * np.pi * 1000 * t), rng.normal(0, 5e-4, 7200)]
    )
    return ulaw_encode((x * 32767).astype("<i2").tobytes())


class Capture:
    """Every raw frame the SDK connection receives (its `recv()` parses through `parse_event`)."""

    def __init__(self, conn: Any) -> None:
        self.frames: list[dict[str, Any]] = []
        parse = conn.parse_event

        def capture(data: str | bytes) -> Any:
            self.frames.append(json.loads(data))
            return parse(data)

        conn.parse_event = capture

    def validate_all(self) -> None:
        ids = [f["event_id"] for f in self.frames]
        assert len(ids) == len(set(ids)), "server event_ids must be unique"
        for frame in self.frames:
            try:
                SERVER[frame["type"]].model_validate(frame)
            except pydantic.ValidationError as exc:  # pragma: no cover - the message is the point
                pytest.fail(f"{frame['type']} does not match the SDK model: {exc}\n{frame}")

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == kind]


def validate_client_frames(server: FakeServer) -> None:
    for conn in server.connections:
        for entry in conn.client_frames:
            assert entry.frame is not None
            CLIENT[entry.frame["type"]].model_validate(entry.frame)


async def until(conn: Any, kind: str) -> list[Any]:
    """Events from `async for` up to and including the first of type `kind`."""
    seen = []
    async for event in conn:
        seen.append(event)
        if event.type == kind:
            return seen
    raise AssertionError(f"connection ended before {kind}")


@pytest.fixture
async def fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeServer]:
    kwargs = getattr(request, "param", {})
    server = await openai_realtime.serve(**kwargs)
    try:
        yield server
    finally:
        await server.close()


def client(server: FakeServer) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="sk-test", base_url=f"http://127.0.0.1:{server.port}/v1")


async def test_sdk_voice_turn_pcmu_both_ways_with_transcription(fake: FakeServer) -> None:
    audio = utterance()
    async with client(fake).realtime.connect(model="gpt-realtime-2") as conn:
        cap = Capture(conn)
        first = await until(conn, "conversation.created")
        assert isinstance(first[0], SessionCreatedEvent) and first[0].session.model == "gpt-realtime-2"
        await conn.session.update(session=SESSION)
        [updated] = await until(conn, "session.updated")
        assert updated.session.audio.input.format.type == "audio/pcmu"
        for i in range(0, len(audio), 160):
            await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + 160]).decode())
        events = await until(conn, "response.done")
    cap.validate_all()
    validate_client_frames(fake)
    types = [e.type for e in events]
    for kind in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "rate_limits.updated",
        "response.output_audio_transcript.done",
    ):
        assert kind in types
    assert (
        types.index("input_audio_buffer.speech_started")
        < types.index("input_audio_buffer.committed")
        < types.index("response.created")
        < types.index("response.done")
    )
    deltas = [e for e in events if isinstance(e, ResponseAudioDeltaEvent)]
    assert b"".join(base64.b64decode(e.delta) for e in deltas) == audio[100 * 8 : 1500 * 8]
    assert isinstance(events[-1], ResponseDoneEvent) and events[-1].response.status == "completed"
    assert cap.of("input_audio_buffer.speech_started")[0]["audio_start_ms"] == 100
    assert fake.connections[0].client_frames[1].audio_bytes == 160


@pytest.mark.parametrize(
    "fake",
    [
        {
            "script": Script(
                (
                    Turn(
                        "tone",
                        800,
                        transcript="Your order ships today.",
                        tool_call=ToolCallScript("lookup_order", {"order_id": "42"}),
                    ),
                )
            )
        }
    ],
    indirect=True,
)
async def test_sdk_tool_call_round_trip_and_truncate(fake: FakeServer) -> None:
    audio = utterance()
    async with client(fake).realtime.connect(model="gpt-realtime-2") as conn:
        cap = Capture(conn)
        await conn.session.update(session=SESSION)
        await until(conn, "session.updated")
        for i in range(0, len(audio), 800):
            await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + 800]).decode())
        events = await until(conn, "response.done")
        [call] = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert (call.name, json.loads(call.arguments)) == ("lookup_order", {"order_id": "42"})
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": call.call_id, "output": '{"status":"shipped"}'}
        )
        await conn.response.create()
        events = await until(conn, "response.done")
        assert events[-1].response.status == "completed"
        spoken = b"".join(
            base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
        )
        assert len(spoken) == 800 * 8
        [item] = [e.item for e in events if e.type == "response.output_item.done"]
        await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=400)
        [truncated] = await until(conn, "conversation.item.truncated")
        assert (truncated.item_id, truncated.audio_end_ms) == (item.id, 400)
        await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=900)
        [error] = await until(conn, "error")
        assert error.error.code == "invalid_value"
        await conn.send({"type": "output_audio_buffer.clear"})
        [error] = await until(conn, "error")
        assert error.error.code == "unsupported_event"
    cap.validate_all()
    validate_client_frames(fake)
    assert [f["type"] for f in cap.frames].count("conversation.item.added") == 4  # user, call, output, answer


@pytest.mark.parametrize("fake", [{"options": RealtimeFakeOptions(session_length_ms=600)}], indirect=True)
async def test_sdk_session_cap_error_then_clean_close_1001(fake: FakeServer) -> None:
    async with client(fake).realtime.connect(model="gpt-realtime-2") as conn:
        cap = Capture(conn)
        events = [e async for e in conn]  # ends without an exception: 1001 is a clean close
    assert events[-1].type == "error" and events[-1].error.code == "session_expired"
    cap.validate_all()
    await asyncio.sleep(0.05)  # let the server side finish its close bookkeeping
    assert fake.connections[0].close_code == 1001


async def test_sdk_beta_header_is_refused_with_4000(fake: FakeServer) -> None:
    async with client(fake).realtime.connect(
        model="gpt-realtime-2", extra_headers={"OpenAI-Beta": "realtime=v1"}
    ) as conn:
        cap = Capture(conn)
        events = []
        with pytest.raises(ConnectionClosedError) as closed:  # 4000 is not a clean close: `async for` raises
            async for event in conn:
                events.append(event)
    assert [e.type for e in events] == ["error"] and events[0].error.code == "beta_api_shape_disabled"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4000
    assert closed.value.rcvd.reason == "invalid_request_error.beta_api_shape_disabled"
    cap.validate_all()


async def test_runtime_fault_injection_reaches_the_connection(fake: FakeServer) -> None:
    async with client(fake).realtime.connect(model="gpt-realtime-2") as conn:
        cap = Capture(conn)
        await until(conn, "conversation.created")
        fake.inject(parse_fault("close"))  # the provider's real end, now: session_expired + 1001
        events = [e async for e in conn]
    assert [e.type for e in events] == ["error"] and events[0].error.code == "session_expired"
    cap.validate_all()
    await asyncio.sleep(0.05)
    assert fake.connections[0].faults == ["close"] and fake.connections[0].close_code == 1001


async def test_ro5_sdk_manual_turns_commit_then_response_create(fake: FakeServer) -> None:
    """Turn detection off (`turn_detection: None`, as the bridge's client mode sends it): the SDK's
    `input_audio_buffer.commit` is transcribed at once, and `response.create` answers it; every frame strict."""
    audio = utterance()
    manual = {
        **SESSION,
        "audio": {**SESSION["audio"], "input": {**SESSION["audio"]["input"], "turn_detection": None}},
    }
    async with client(fake).realtime.connect(model="gpt-realtime-2") as conn:
        cap = Capture(conn)
        await until(conn, "conversation.created")
        await conn.session.update(session=manual)
        [updated] = await until(conn, "session.updated")
        assert updated.session.audio.input.turn_detection is None
        for i in range(0, len(audio), 160):
            await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + 160]).decode())
        await conn.input_audio_buffer.commit()
        committed = await until(conn, "conversation.item.input_audio_transcription.completed")
        await conn.response.create()
        answered = await until(conn, "response.done")
    cap.validate_all()
    validate_client_frames(fake)
    assert "input_audio_buffer.speech_started" not in [e.type for e in committed + answered]
    assert [e.type for e in committed].count("input_audio_buffer.committed") == 1
    echoed = b"".join(base64.b64decode(e.delta) for e in answered if isinstance(e, ResponseAudioDeltaEvent))
    assert echoed == audio  # the whole committed buffer, spoken back
