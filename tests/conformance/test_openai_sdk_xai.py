"""The openai SDK as a client of the xAI Grok Voice Agent fake (xAI has no SDK of its own, providers.md §6.3).

OpenAI's GA models would reject xAI's thinner events, so every raw server frame is validated against the small
project-owned models below (extra keys forbidden, types strict): they pin the xAI shapes the fake emits, and a
frame of a type they do not know (e.g. an OpenAI-only `conversation.item.done`) fails the test.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import numpy as np
import pydantic
import pytest
from openai import AsyncOpenAI
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from providers.fakes import xai
from providers.fakes.realtime_family import RealtimeFakeOptions
from providers.fakes.script import Script, ToolCallScript, Turn
from providers.fakes.server import FakeServer
from rtp.g711 import ulaw_encode

pytestmark = pytest.mark.timeout(30)

MODEL = "grok-voice-think-fast-1.0"

# -- project-owned models of the xAI events the fake emits ---------------------------------------------------


class _M(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)


class Event(_M):
    event_id: str


class Format(_M):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
    rate: int | None = None


class TurnDetection(_M):
    type: Literal["server_vad"]
    threshold: float
    silence_duration_ms: int
    prefix_padding_ms: int
    create_response: bool | None = None
    interrupt_response: bool | None = None


class Transcription(_M):
    model: str
    language_hint: str | None = None
    language: str | None = None
    keyterms: list[str] | None = None


class AudioInput(_M):
    format: Format
    transcription: Transcription | None


class AudioOutput(_M):
    format: Format


class Audio(_M):
    input: AudioInput
    output: AudioOutput


class Session(_M):
    id: str
    model: str
    instructions: str
    voice: str
    turn_detection: TurnDetection | None
    audio: Audio
    tools: list[dict[str, Any]]
    reasoning: dict[str, str]
    type: Literal["realtime"] | None = None
    resumption: dict[str, bool] | None = None
    tool_choice: str | dict[str, str] | None = None
    max_output_tokens: int | str | None = None
    parallel_tool_calls: bool | None = None


class SessionEvent(Event):
    type: Literal["session.created", "session.updated"]
    session: Session


class Conversation(_M):
    id: str
    object: Literal["realtime.conversation"]


class ConversationCreated(Event):
    type: Literal["conversation.created"]
    conversation: Conversation


class SpeechStarted(Event):
    type: Literal["input_audio_buffer.speech_started"]
    item_id: str
    audio_start_ms: int


class SpeechStopped(Event):
    type: Literal["input_audio_buffer.speech_stopped"]
    item_id: str
    audio_end_ms: int


class Committed(Event):
    type: Literal["input_audio_buffer.committed"]
    item_id: str
    previous_item_id: str | None


class Content(_M):
    type: Literal["input_audio", "input_text", "output_audio", "output_text"]
    transcript: str | None = None
    text: str | None = None


class Item(_M):
    id: str
    object: Literal["realtime.item"]
    type: Literal["message", "function_call", "function_call_output"]
    status: Literal["completed", "incomplete", "in_progress"]
    role: Literal["user", "assistant", "system"] | None = None
    content: list[Content] | None = None
    name: str | None = None
    call_id: str | None = None
    arguments: str | None = None
    output: str | None = None


class ItemAdded(Event):
    type: Literal["conversation.item.added"]
    previous_item_id: str | None
    item: Item


class TranscriptionSnapshot(Event):
    type: Literal[
        "conversation.item.input_audio_transcription.updated",
        "conversation.item.input_audio_transcription.completed",
    ]
    item_id: str
    transcript: str


class Usage(_M):
    total_tokens: int
    input_tokens: int
    output_tokens: int
    input_token_details: dict[Literal["grok_tokens"], int]
    output_token_details: dict[Literal["grok_tokens"], int]
    billable_audio_seconds: float


class StatusDetails(_M):
    type: Literal["cancelled"]
    reason: Literal["turn_detected", "client_cancelled"]


class Response(_M):
    id: str
    object: Literal["realtime.response"]
    status: Literal["in_progress", "completed", "cancelled"]
    output: list[Item]
    status_details: StatusDetails | None = None
    usage: Usage | None = None


class ResponseCreated(Event):
    type: Literal["response.created"]
    response: Response


class ResponseDone(Event):
    type: Literal["response.done"]
    response: Response
    usage: Usage


class OutputItem(Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    response_id: str
    output_index: int
    item: Item


class Part(_M):
    type: Literal["audio"]
    transcript: str


class ContentPart(Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: Part


class Delta(Event):
    type: Literal[
        "response.output_audio.delta", "response.output_audio_transcript.delta", "response.text.delta"
    ]
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


class AudioDone(Event):
    type: Literal["response.output_audio.done"]
    response_id: str
    item_id: str
    output_index: int
    content_index: int


class TranscriptDone(AudioDone):
    type: Literal["response.output_audio_transcript.done"]  # type: ignore[assignment]
    transcript: str


class FunctionCallDone(Event):
    type: Literal["response.function_call_arguments.done"]
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


class Error(_M):
    type: str
    code: str | None
    message: str
    param: str | None
    event_id: str | None


class ErrorEvent(Event):
    type: Literal["error"]
    error: Error


class Ping(_M):
    type: Literal["ping"]
    timestamp: int


MODELS: dict[str, type[_M]] = {}
for _model in (
    SessionEvent,
    ConversationCreated,
    SpeechStarted,
    SpeechStopped,
    Committed,
    ItemAdded,
    TranscriptionSnapshot,
    ResponseCreated,
    ResponseDone,
    OutputItem,
    ContentPart,
    Delta,
    AudioDone,
    TranscriptDone,
    FunctionCallDone,
    ErrorEvent,
    Ping,
):
    for _kind in _model.model_fields["type"].annotation.__args__:  # type: ignore[union-attr]
        MODELS[_kind] = _model


# -- helpers --------------------------------------------------------------------------------------------------


def utterance() -> bytes:
    """µ-law at 8 kHz: 400 ms quiet, 800 ms of a 1 kHz tone, 900 ms quiet."""
    rng = np.random.default_rng(0)
    t = np.arange(6400) / 8000
    x = np.concatenate(
        [rng.normal(0, 5e-4, 3200), 0.3 * np.sin(2 * np.pi * 1000 * t), rng.normal(0, 5e-4, 7200)]
    )
    return ulaw_encode((x * 32767).astype("<i2").tobytes())


SESSION = {
    "instructions": "You are a phone agent.",
    "voice": "ara",
    "turn_detection": {
        "type": "server_vad",
        "threshold": 0.5,
        "silence_duration_ms": 500,
        "prefix_padding_ms": 333,
    },
    "audio": {
        "input": {
            "format": {"type": "audio/pcmu"},
            "transcription": {"model": "grok-transcribe", "language_hint": "en"},
        },
        "output": {"format": {"type": "audio/pcmu"}},
    },
    "tools": [
        {
            "type": "function",
            "name": "lookup_order",
            "description": "Find an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        }
    ],
    "reasoning": {"effort": "none"},
}


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
        ids = [f["event_id"] for f in self.frames if "event_id" in f]
        assert len(ids) == len(set(ids))
        for frame in self.frames:
            assert frame["type"] in MODELS, f"the xAI fake sent an event xAI does not send: {frame['type']}"
            MODELS[frame["type"]].model_validate(frame)

    def types(self) -> list[str]:
        return [f["type"] for f in self.frames]


async def until(conn: Any, kind: str) -> list[Any]:
    seen = []
    async for event in conn:
        seen.append(event)
        if event.type == kind:
            return seen
    raise AssertionError(f"connection ended before {kind}")


@pytest.fixture
async def fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeServer]:
    server = await xai.serve(**getattr(request, "param", {}))
    try:
        yield server
    finally:
        await server.close()


def client(server: FakeServer) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="xai-test", base_url=f"http://127.0.0.1:{server.port}/v1")


# -- tests ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fake", [{"options": RealtimeFakeOptions(ping_interval_ms=150)}], indirect=True)
async def test_sdk_against_xai_voice_turn(fake: FakeServer) -> None:
    audio = utterance()
    async with client(fake).realtime.connect(model=MODEL) as conn:
        cap = Capture(conn)
        await until(conn, "conversation.created")
        await conn.session.update(session=SESSION)  # xAI-shaped: the SDK passes the dict through untouched
        await until(conn, "session.updated")  # a ping may come first
        for i in range(0, len(audio), 800):  # xAI suggests ~100 ms per append
            await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + 800]).decode())
        await until(conn, "response.done")
        if "ping" not in cap.types():
            await until(conn, "ping")  # lenient SDK parsing: comes back as an object whose .type is "ping"
    cap.validate_all()
    types = cap.types()
    assert types[:2] == ["session.created", "conversation.created"]
    assert cap.frames[0]["session"]["model"] == MODEL
    assert cap.frames[types.index("session.updated")]["session"]["voice"] == "ara"
    for kind in (
        "conversation.item.input_audio_transcription.updated",
        "conversation.item.input_audio_transcription.completed",
        "response.output_audio.delta",
    ):
        assert kind in types
    assert (
        types.index("input_audio_buffer.speech_started")
        < types.index("input_audio_buffer.committed")
        < types.index("response.created")
        < types.index("response.done")
    )
    spoken = b"".join(
        base64.b64decode(f["delta"]) for f in cap.frames if f["type"] == "response.output_audio.delta"
    )
    assert spoken == audio[(400 - 333) * 8 : (1200 + 333) * 8]
    done = next(f for f in cap.frames if f["type"] == "response.done")
    assert done["usage"] == done["response"]["usage"] and done["usage"]["billable_audio_seconds"] > 0
    assert fake.connections[0].client_frames[0].frame == {"type": "session.update", "session": SESSION}


@pytest.mark.parametrize(
    "fake",
    [{"script": Script((Turn("tone", 500, tool_call=ToolCallScript("lookup_order", {"order_id": "7"})),))}],
    indirect=True,
)
async def test_sdk_against_xai_tool_call_and_unsupported_truncate(fake: FakeServer) -> None:
    audio = utterance()
    async with client(fake).realtime.connect(model=MODEL) as conn:
        cap = Capture(conn)
        await conn.session.update(session=SESSION)
        await until(conn, "session.updated")
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio).decode())
        events = await until(conn, "response.done")
        assert [e.type for e in events[-3:]] == [
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.done",
        ]
        call = events[-3]
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": call.call_id, "output": '{"status":"shipped"}'}
        )
        await conn.response.create()
        events = await until(conn, "response.done")
        spoken = b"".join(
            base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
        )
        assert len(spoken) == 500 * 8
        item_id = next(e.item.id for e in events if e.type == "response.output_item.done")
        await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=100)
        [error] = await until(conn, "error")
        assert error.error.code == "unsupported_event"
    cap.validate_all()
    assert "conversation.item.done" not in cap.types() and "rate_limits.updated" not in cap.types()


async def test_xai_auth_bearer_or_client_secret_subprotocol(fake: FakeServer) -> None:
    url = f"ws://127.0.0.1:{fake.port}/v1/realtime?model={MODEL}"
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url):
            pass
    assert refused.value.response.status_code == 401
    async with connect(url, subprotocols=["xai-client-secret.ephemeral-token"]) as ws:  # type: ignore[list-item]
        first = json.loads(await ws.recv())
        assert first["type"] == "session.created" and ws.subprotocol is None  # accepted, not echoed
    async with connect(url, additional_headers={"Authorization": "Bearer xai-key"}) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
