"""google-genai 3.6.1's own live client against the Gemini fake over TLS, and strict checks of every frame
the fake emits (shared/reference/providers.md §6.2): `types.LiveServerMessage.model_validate` (extra="forbid")
plus the top-level keys the SDK's mldev parser knows (it crashes on anything else)."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from typing import Any

import numpy as np
import pytest
from google import genai
from google.genai import errors, types

from providers.fakes.faults import parse_fault
from providers.fakes.gemini_live import ALLOWED_SERVER_KEYS, GeminiFakeConnection, GeminiFakeOptions, serve
from providers.fakes.script import Script, ToolCallScript, Turn
from providers.fakes.server import SequentialIds

OPTIONS = GeminiFakeOptions(response_latency_ms=20, burst_factor=8.0)
MODEL = "gemini-3.1-flash-live-preview"


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every frame any fake connection hands to its shell."""
    frames: list[str] = []
    original = GeminiFakeConnection.frames_to_send

    def spy(self: GeminiFakeConnection) -> list[str]:
        out = original(self)
        frames.extend(out)
        return out

    monkeypatch.setattr(GeminiFakeConnection, "frames_to_send", spy)
    return frames


def validate(frames: list[str]) -> set[str]:
    """Each frame strictly valid for the SDK; returns the (top-level and serverContent) keys seen."""
    seen: set[str] = set()
    for text in frames:
        message = json.loads(text)
        assert message and set(message) <= ALLOWED_SERVER_KEYS, message
        types.LiveServerMessage.model_validate(message)
        seen |= set(message) | {f"serverContent.{k}" for k in message.get("serverContent", {})}
    return seen


def tone16k(ms: int, hz: float = 1000.0) -> bytes:
    t = np.arange(16 * ms) / 16000
    return (9000 * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes()


def client(base_url: str, cafile: str, api_version: str | None = "v1beta") -> genai.Client:
    options: dict[str, Any] = {
        "base_url": base_url,
        "async_client_args": {"ssl": ssl.create_default_context(cafile=cafile)},
    }
    if api_version is not None:
        options["api_version"] = api_version
    return genai.Client(api_key="k", http_options=types.HttpOptions(**options))


def live_config() -> types.LiveConnectConfig:
    return types.LiveConnectConfig(
        response_modalities=[types.Modality.AUDIO],
        speech_config=types.SpeechConfig(
            voice_config=types.VoiceConfig(prebuilt_voice_config=types.PrebuiltVoiceConfig(voice_name="Puck"))
        ),
        system_instruction="You are a phone agent.",
        tools=[
            types.Tool(
                function_declarations=[
                    types.FunctionDeclaration(
                        name="lookup_order",
                        description="Find an order",
                        parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
                    )
                ]
            )
        ],
        realtime_input_config=types.RealtimeInputConfig(
            automatic_activity_detection=types.AutomaticActivityDetection(
                disabled=False, silence_duration_ms=400
            ),
            activity_handling=types.ActivityHandling.START_OF_ACTIVITY_INTERRUPTS,
        ),
        input_audio_transcription=types.AudioTranscriptionConfig(),
        output_audio_transcription=types.AudioTranscriptionConfig(),
        session_resumption=types.SessionResumptionConfig(),
        context_window_compression=types.ContextWindowCompressionConfig(
            trigger_tokens=25600, sliding_window=types.SlidingWindow(target_tokens=12800)
        ),
    )


async def test_the_sdk_talks_audio_transcripts_and_tools_with_the_fake(emitted: list[str]) -> None:
    script = Script(
        turns=(Turn("echo"), Turn("tone", 300, tool_call=ToolCallScript("lookup_order", {"order_id": "42"})))
    )
    async with await serve(options=OPTIONS, script=script) as fake:
        sdk = client(fake.base_url, fake.cert_path)
        async with asyncio.timeout(15):
            async with sdk.aio.live.connect(model=MODEL, config=live_config()) as session:
                # Turn 1: a 600 ms tone, then silence; the fake echoes it at 24 kHz.
                utterance = tone16k(600) + bytes(32 * 700)
                for i in range(0, len(utterance), 640):
                    blob = types.Blob(data=utterance[i : i + 640], mime_type="audio/pcm;rate=16000")
                    await session.send_realtime_input(audio=blob)
                audio = b""
                heard, said = "", ""
                async for message in session.receive():
                    content = message.server_content
                    if message.data:
                        audio += message.data
                    if content and content.input_transcription and content.input_transcription.text:
                        heard += content.input_transcription.text
                    if content and content.output_transcription and content.output_transcription.text:
                        said += content.output_transcription.text
                assert 640 <= len(audio) / 48 <= 680
                x = np.frombuffer(audio, dtype="<i2").astype(float)
                assert abs(np.argmax(np.abs(np.fft.rfft(x * np.hanning(len(x))))) * 24000 / len(x) - 1000) < 5
                assert heard == "[utterance 1, 0.7 s]" and said == "[echo 1, 0.7 s]"

                # Turn 2: the model calls a tool, waits for the answer, then speaks.
                await session.send_realtime_input(text="Where is order 42?")
                calls: list[types.FunctionCall] = []
                answer = b""
                async for message in session.receive():
                    if message.tool_call and message.tool_call.function_calls:
                        calls += message.tool_call.function_calls
                        await session.send_tool_response(
                            function_responses=[
                                types.FunctionResponse(
                                    id=calls[0].id,
                                    name=calls[0].name,
                                    response={"output": {"status": "shipped"}},
                                )
                            ]
                        )
                    if message.data:
                        answer += message.data
                    if message.usage_metadata:
                        assert message.usage_metadata.prompt_token_count
                assert [(c.name, c.args) for c in calls] == [("lookup_order", {"order_id": "42"})]
                assert len(answer) == 300 * 48

        setup = fake.connections[0].client_frames[0].frame
        assert setup is not None and setup["setup"]["model"] == f"models/{MODEL}"
    seen = validate(emitted)
    assert {"setupComplete", "serverContent", "toolCall", "usageMetadata", "sessionResumptionUpdate"} <= seen
    assert {
        "serverContent.modelTurn",
        "serverContent.inputTranscription",
        "serverContent.outputTranscription",
        "serverContent.generationComplete",
        "serverContent.turnComplete",
    } <= seen


async def test_the_sdks_default_v1_path_with_a_trailing_slash(emitted: list[str]) -> None:
    async with await serve(options=OPTIONS) as fake:
        sdk = client(fake.base_url + "/", fake.cert_path, api_version=None)  # requests //ws/...v1...
        async with asyncio.timeout(10):
            async with sdk.aio.live.connect(
                model=MODEL, config=types.LiveConnectConfig(response_modalities=[types.Modality.AUDIO])
            ) as session:
                assert session is not None
        assert fake.connections[0].client_frames[0].frame is not None
        with pytest.raises(errors.APIError, match="for API version v1, "):  # the version read from the path
            async with sdk.aio.live.connect(model="gemini-9-live"):
                pass
    assert validate(emitted) == {"setupComplete"}


async def test_the_sdk_sees_the_fakes_closes_as_api_errors(emitted: list[str]) -> None:
    async with await serve(options=OPTIONS) as fake:
        with pytest.raises(errors.APIError) as refused:
            async with client(fake.base_url, fake.cert_path).aio.live.connect(model="gemini-9-live"):
                pass
        assert refused.value.code == 1008
    async with await serve(options=OPTIONS, faults=[parse_fault("close@300")]) as fake:
        sdk = client(fake.base_url, fake.cert_path)
        go_away: list[types.LiveServerGoAway] = []
        with pytest.raises(errors.APIError) as ended:
            async with asyncio.timeout(10):
                async with sdk.aio.live.connect(model=MODEL, config=live_config()) as session:
                    while True:
                        async for message in session.receive():
                            if message.go_away:
                                go_away.append(message.go_away)
        assert ended.value.code == 1011 and "Deadline expired" in str(ended.value)
        assert [g.time_left for g in go_away] == ["0s"]
    validate(emitted)


def test_every_kind_of_frame_the_fake_emits_is_valid_for_the_sdk() -> None:
    """Drive one core through every message kind on virtual time and check each frame."""
    ms = 1_000_000
    opts = GeminiFakeOptions(response_latency_ms=0, connection_lifetime_ms=60_000, resumption_update_ms=2_000)
    script = Script(
        turns=(Turn("tone", 2000), Turn("tone", 300, tool_call=ToolCallScript("f", {"a": [1, "x"]})))
    )
    conn = GeminiFakeConnection(
        opts,
        now=0,
        api_key="k",
        ids=SequentialIds(),
        script=script,
        faults=(parse_fault("duplicate_tool_call"),),
    )
    frames: list[str] = []
    now = 0

    def send(message: dict[str, Any]) -> None:
        conn.receive_message(json.dumps(message), now)
        frames.extend(conn.frames_to_send())

    def advance(until: int) -> None:
        nonlocal now
        while (deadline := conn.next_deadline()) is not None and deadline <= until:
            now = max(now, deadline)
            conn.handle_timer(now)
            frames.extend(conn.frames_to_send())
        now = until

    def speak(pcm: bytes) -> None:
        for i in range(0, len(pcm), 640):
            send(
                {
                    "realtimeInput": {
                        "audio": {
                            "data": base64.b64encode(pcm[i : i + 640]).decode(),
                            "mimeType": "audio/pcm;rate=16000",
                        }
                    }
                }
            )
            advance(now + 20 * ms)

    send(
        {
            "setup": {
                "model": f"models/{MODEL}",
                "sessionResumption": {},
                "inputAudioTranscription": {},
                "outputAudioTranscription": {},
            }
        }
    )
    speak(tone16k(300) + bytes(32 * 600))
    advance(now + 2_500 * ms)  # a periodic update while the answer plays: not resumable
    speak(tone16k(200))  # barge-in: interrupted
    speak(bytes(32 * 600))  # that utterance asks for a tool (twice, by the fault) ...
    speak(tone16k(200))  # ... and a barge-in retracts it
    advance(70_000 * ms)  # goAway, then the 1011 close
    assert conn.close_to_send() is not None
    seen = validate(frames)
    assert seen == {
        "setupComplete",
        "serverContent",
        "toolCall",
        "toolCallCancellation",
        "usageMetadata",
        "goAway",
        "sessionResumptionUpdate",
        "serverContent.modelTurn",
        "serverContent.inputTranscription",
        "serverContent.outputTranscription",
        "serverContent.generationComplete",
        "serverContent.turnComplete",
        "serverContent.interrupted",
    }
    updates = [json.loads(f)["sessionResumptionUpdate"] for f in frames if "sessionResumptionUpdate" in f]
    assert {} in updates and any(u.get("resumable") for u in updates)
