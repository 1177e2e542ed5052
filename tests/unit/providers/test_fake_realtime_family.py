"""The Realtime-family fakes (OpenAI GA and xAI) on virtual time: VAD, echo, responses, tools, barge-in, truncate,
session.update validation, the session cap, and every fault. OpenAI frames are validated strictly against the
openai SDK's per-type models as they are produced."""

from __future__ import annotations

import base64
import json
import typing
from typing import Any

import numpy as np
import pydantic
import pytest
from openai.types.realtime import RealtimeServerEvent

from providers.fakes.echo import EchoModel, EchoOptions, UtteranceDetected, UtteranceStarted
from providers.fakes.faults import parse_fault
from providers.fakes.openai_realtime import DIALECT as OPENAI
from providers.fakes.realtime_family import RealtimeFakeOptions, RealtimeFamilyConnection, threshold_dbfs
from providers.fakes.script import Script, ToolCallScript, Turn
from providers.fakes.server import SequentialIds
from providers.fakes.xai import DIALECT as XAI
from rtp.g711 import ulaw_decode, ulaw_encode
from rtp.units import NS_PER_MS as MS

UNIX = 1_800_000_000
PCMU = {"type": "audio/pcmu"}


def _server_models() -> dict[str, type[pydantic.BaseModel]]:
    union = typing.get_args(RealtimeServerEvent)[0]
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in typing.get_args(union)}


SERVER_MODELS = _server_models()


def tone(ms: int, rate: int = 8000, amp: float = 0.3) -> np.ndarray:
    return amp * np.sin(2 * np.pi * 1000 * np.arange(rate * ms // 1000) / rate)


def quiet(ms: int, rate: int = 8000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 0.0005, rate * ms // 1000)


def pcm16(*parts: np.ndarray) -> bytes:
    return (np.clip(np.concatenate(parts), -1, 1) * 32767).astype("<i2").tobytes()


def utterance(lead_ms: int = 400, speech_ms: int = 800, tail_ms: int = 900) -> bytes:
    """µ-law: quiet, tone, quiet. With the defaults speech is 400..1200 ms of the input."""
    return ulaw_encode(pcm16(quiet(lead_ms), tone(speech_ms), quiet(tail_ms, seed=1)))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Harness:
    """One core on a virtual clock. Every frame is kept with its time; OpenAI frames are validated strictly."""

    def __init__(self, dialect=OPENAI, options: RealtimeFakeOptions | None = None, **kwargs: Any) -> None:
        self.dialect = dialect
        self.now = kwargs.pop("now", 0)
        self.core = RealtimeFamilyConnection(
            dialect, options, now=self.now, unix_time=UNIX, ids=SequentialIds(7), **kwargs
        )
        self.frames: list[tuple[int, str]] = []
        self.closes: list[tuple[int, Any]] = []
        self.event_ids: set[str] = set()
        self.advance(0)  # like the shell: the first timer runs at once (the handshake is due at creation)

    def _collect(self) -> None:
        for frame in self.core.frames_to_send():
            self.frames.append((self.now, frame))
            try:
                event = json.loads(frame)
            except ValueError:
                continue
            if "event_id" in event:
                assert event["event_id"] not in self.event_ids, event
                self.event_ids.add(event["event_id"])
            if self.dialect is OPENAI:
                SERVER_MODELS[event["type"]].model_validate(event)
        close = self.core.close_to_send()
        if close is not None:
            self.closes.append((self.now, close))

    def send(self, event: dict[str, Any] | str) -> None:
        self.core.receive_message(event if isinstance(event, str) else json.dumps(event), self.now)
        self._collect()

    def advance(self, ms: float) -> None:
        until = self.now + int(ms * MS)
        while (d := self.core.next_deadline()) is not None and d <= until:
            self.now = max(self.now, d)
            self.core.handle_timer(self.now)
            self._collect()
        self.now = until

    def stream(self, audio: bytes, frame_bytes: int = 160, frame_ms: int = 20) -> None:
        for i in range(0, len(audio), frame_bytes):
            self.send({"type": "input_audio_buffer.append", "audio": b64(audio[i : i + frame_bytes])})
            self.advance(frame_ms)

    def update(self, session: dict[str, Any], event_id: str | None = None) -> None:
        event: dict[str, Any] = {"type": "session.update", "session": session}
        if event_id:
            event["event_id"] = event_id
        self.send(event)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for _, frame in self.frames:
            try:
                out.append(json.loads(frame))
            except ValueError:
                pass
        return out

    def types(self) -> list[str]:
        return [e["type"] for e in self.events()]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["type"] == kind]

    def mark(self) -> int:
        return len(self.frames)

    def since(self, mark: int) -> list[dict[str, Any]]:
        return [json.loads(f) for _, f in self.frames[mark:]]

    def output_audio(self, response_id: str | None = None) -> bytes:
        return b"".join(
            base64.b64decode(e["delta"])
            for e in self.of("response.output_audio.delta")
            if response_id is None or e["response_id"] == response_id
        )


def pcmu_session(dialect=OPENAI, **extra_input: Any) -> dict[str, Any]:
    if dialect is OPENAI:
        return {
            "type": "realtime",
            "audio": {"input": {"format": PCMU, **extra_input}, "output": {"format": PCMU}},
        }
    return {"audio": {"input": {"format": PCMU, **extra_input}, "output": {"format": PCMU}}}


def errors(h: Harness) -> list[dict[str, Any]]:
    return [e["error"] for e in h.of("error")]


# -- echo.py extensions ---------------------------------------------------------------------------------------


def _run_echo(options: EchoOptions) -> list:
    model = EchoModel(8000, 1, options)
    audio = utterance()
    events = []
    now = 0
    for i in range(0, len(audio), 160):
        raw = audio[i : i + 160]
        model.receive_audio(raw, ulaw_decode(raw), now)
        now += 20 * MS
        while (ev := model.next_event()) is not None:
            events.append(ev)
    return events


def test_echo_reports_starts_only_when_asked_and_speak_false_only_detects() -> None:
    plain = _run_echo(EchoOptions())
    assert not any(isinstance(e, UtteranceStarted) for e in plain)
    events = _run_echo(EchoOptions(report_starts=True, speak=False, min_utterance_ms=100))
    assert [type(e) for e in events] == [UtteranceStarted, UtteranceDetected]
    started, detected = events
    assert started.index == detected.utterance.index == 1
    assert started.voiced_start == detected.utterance.voiced_start == 3200  # 400 ms at 8 kHz
    assert started.voiced_start_ms == 400
    assert started.at < detected.at


def test_threshold_mapping() -> None:
    assert threshold_dbfs(0.5) == -42.5 and threshold_dbfs(0.85) == pytest.approx(-33.75)


# -- handshake and session ------------------------------------------------------------------------------------


def test_openai_session_created_is_the_full_default_session_then_conversation_created() -> None:
    h = Harness(model="gpt-realtime-2.1-mini")
    created, conversation = h.events()
    assert created["type"] == "session.created" and conversation["type"] == "conversation.created"
    s = created["session"]
    assert s["id"].startswith("sess_") and s["object"] == "realtime.session" and s["type"] == "realtime"
    assert s["model"] == "gpt-realtime-2.1-mini" and s["expires_at"] == UNIX + 3600
    assert (
        s["audio"]["input"]["format"]
        == s["audio"]["output"]["format"]
        == {"type": "audio/pcm", "rate": 24000}
    )
    td = s["audio"]["input"]["turn_detection"]
    assert (td["type"], td["threshold"], td["prefix_padding_ms"], td["silence_duration_ms"]) == (
        "server_vad",
        0.5,
        300,
        500,
    )
    assert td["create_response"] is td["interrupt_response"] is True
    assert s["audio"]["output"]["voice"] == "marin"
    assert (s["tools"], s["tool_choice"], s["max_output_tokens"]) == ([], "auto", "inf")
    assert conversation["conversation"]["id"].startswith("conv_")
    assert h.core.record.session_id == s["id"]


def test_nothing_is_emitted_before_the_first_timer_which_is_due_at_creation() -> None:
    core = RealtimeFamilyConnection(OPENAI, now=5 * MS, unix_time=UNIX)
    assert core.frames_to_send() == [] and core.next_deadline() == 5 * MS
    core.handle_timer(5 * MS)
    assert [json.loads(f)["type"] for f in core.frames_to_send()] == [
        "session.created",
        "conversation.created",
    ]


def test_xai_session_created_is_xai_shaped() -> None:
    h = Harness(XAI)
    created, conversation = h.events()
    s = created["session"]
    assert "type" not in s and s["voice"] == "eve" and s["model"] == "grok-voice-think-fast-1.0"
    assert s["turn_detection"] == {
        "type": "server_vad",
        "threshold": 0.85,
        "silence_duration_ms": 500,
        "prefix_padding_ms": 333,
    }
    assert "voice" not in s["audio"].get("output", {}) and "turn_detection" not in s["audio"]["input"]
    assert conversation["conversation"]["object"] == "realtime.conversation"


def test_openai_session_update_deep_merges_and_replies_with_the_full_session() -> None:
    h = Harness()
    h.update(pcmu_session(transcription={"model": "gpt-4o-transcribe"}))
    h.update(
        {
            "type": "realtime",
            "instructions": "Be brief.",
            "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}},
        }
    )
    s = h.of("session.updated")[-1]["session"]
    assert s["instructions"] == "Be brief."
    assert s["audio"]["input"]["format"] == PCMU and s["audio"]["output"]["format"] == PCMU
    assert s["audio"]["input"]["transcription"] == {"model": "gpt-4o-transcribe"}
    assert s["audio"]["output"]["voice"] == "marin" and s["expires_at"] == UNIX + 3600
    td = s["audio"]["input"]["turn_detection"]
    assert td["silence_duration_ms"] == 800 and td["threshold"] == 0.5 and td["create_response"] is True


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        ({"instructions": "x"}, "missing_required_parameter", "session.type"),
        ({"type": "realtime", "voice": "alloy"}, "unknown_parameter", "session.voice"),
        ({"type": "realtime", "modalities": ["audio"]}, "unknown_parameter", "session.modalities"),
        (
            {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            "invalid_value",
            "session.audio.input.format.rate",
        ),
        (
            {"type": "realtime", "audio": {"input": {"format": {"type": "g711_ulaw"}}}},
            "invalid_value",
            "session.audio.input.format.type",
        ),
        (
            {"type": "realtime", "audio": {"output": {"format": {"type": "audio/pcmu", "rate": 8000}}}},
            "unknown_parameter",
            "session.audio.output.format.rate",
        ),
        (
            {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "bogus": 1}}}},
            "unknown_parameter",
            "session.audio.input.turn_detection.bogus",
        ),
        ({"type": "realtime", "max_output_tokens": 5000}, "invalid_value", "session.max_output_tokens"),
        ({"type": "realtime", "instructions": 5}, "invalid_type", "session.instructions"),
        ({"type": "transcription"}, "invalid_value", "session.type"),
    ],
)
def test_openai_session_update_rejections_keep_the_session(session: dict, code: str, param: str) -> None:
    h = Harness()
    before = h.core.session
    h.update(session, event_id="client_7")
    [error] = errors(h)
    assert (error["type"], error["code"], error["param"], error["event_id"]) == (
        "invalid_request_error",
        code,
        param,
        "client_7",
    )
    assert not h.of("session.updated") and h.core.session == before and not h.core.closed


def test_xai_session_update_shape_and_rates() -> None:
    h = Harness(XAI)
    h.update(
        {
            "voice": "ara",
            "turn_detection": {"type": "server_vad", "threshold": 0.6},
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 16000}},
                "output": {"format": {"type": "audio/pcma"}},
            },
        }
    )
    s = h.of("session.updated")[-1]["session"]
    assert s["voice"] == "ara" and s["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
    assert s["turn_detection"] == {
        "type": "server_vad",
        "threshold": 0.6,
        "silence_duration_ms": 500,
        "prefix_padding_ms": 333,
    }
    h.update({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 12345}}}})
    h.update({"audio": {"output": {"voice": "ara"}}})  # OpenAI-shaped: voice belongs at the top for xAI
    assert [(e["code"], e["param"]) for e in errors(h)] == [
        ("invalid_value", "session.audio.input.format.rate"),
        ("unknown_parameter", "session.audio.output.voice"),
    ]


def test_openai_voice_is_locked_after_audio_was_produced() -> None:
    h = Harness()
    h.update(pcmu_session())
    h.update({"type": "realtime", "audio": {"output": {"voice": "cedar"}}})  # fine before any audio
    h.stream(utterance())
    h.advance(2000)
    h.update({"type": "realtime", "audio": {"output": {"voice": "alloy"}}})
    assert errors(h)[-1]["code"] == "cannot_update_voice"
    assert h.core.session["audio"]["output"]["voice"] == "cedar"


def test_beta_header_gets_an_error_and_close_4000_without_a_session() -> None:
    h = Harness(beta_header=True)
    [event] = h.events()
    assert event["error"]["code"] == "beta_api_shape_disabled"
    assert h.closes[0][1].code == 4000
    assert h.closes[0][1].reason == "invalid_request_error.beta_api_shape_disabled"


def test_peer_garbage_becomes_errors_not_exceptions() -> None:
    h = Harness()
    h.send("{not json")
    h.send("[1, 2]")
    h.send({"type": "bogus.event", "event_id": "e1"})
    h.send({"session": {}})
    h.send({"type": "input_audio_buffer.append", "audio": "***"})
    h.send({"type": "input_audio_buffer.append", "audio": "AAAA", "extra": 1})
    h.send({"type": "output_audio_buffer.clear"})
    codes = [e["code"] for e in errors(h)]
    assert codes == [
        "invalid_json",
        "invalid_json",
        "invalid_value",
        "missing_required_parameter",
        "invalid_value",
        "unknown_parameter",
        "unsupported_event",
    ]
    assert errors(h)[2]["event_id"] == "e1" and not h.core.closed
    assert h.core.record.client_frames[0].raw == "{not json"


# -- VAD, echo, pacing ----------------------------------------------------------------------------------------

VOICE_TURN = [
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.added",
    "conversation.item.done",
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
    "response.created",
    "rate_limits.updated",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def _collapse(types: list[str]) -> list[str]:
    """Each run of delta events becomes its distinct types, in first-seen order."""
    out: list[str] = []
    run: list[str] = []
    for t in [*types, ""]:
        if t.endswith(".delta"):
            if t not in run:
                run.append(t)
            continue
        out += run
        run = []
        if t:
            out.append(t)
    return out


def test_openai_voice_turn_events_in_order_with_byte_timeline() -> None:
    h = Harness()
    h.update(pcmu_session(transcription={"model": "gpt-4o-transcribe"}))
    mark = h.mark()
    audio = utterance()
    h.stream(audio)
    h.advance(3000)
    events = h.since(mark)
    assert _collapse([e["type"] for e in events]) == VOICE_TURN
    started, stopped, committed = events[0], events[1], events[2]
    assert started["audio_start_ms"] == 400 - 300 and stopped["audio_end_ms"] == 1200 + 500
    assert (
        started["item_id"] == stopped["item_id"] == committed["item_id"]
        and committed["previous_item_id"] is None
    )
    user = h.of("conversation.item.done")[0]["item"]
    assert (user["role"], user["content"][0]["type"]) == ("user", "input_audio")
    completed = h.of("conversation.item.input_audio_transcription.completed")[0]
    assert completed["usage"]["type"] == "duration" and completed["transcript"].startswith("[utterance 1")
    assert (
        "".join(e["delta"] for e in h.of("conversation.item.input_audio_transcription.delta"))
        == completed["transcript"]
    )
    done = h.of("response.done")[0]["response"]
    assert done["status"] == "completed" and done["usage"]["output_token_details"]["audio_tokens"] > 0
    assert (
        done["output"][0]["content"][0]["transcript"]
        == h.of("response.output_audio_transcript.done")[0]["transcript"]
    )
    assert h.of("conversation.item.added")[1]["previous_item_id"] == committed["item_id"]


def test_echo_is_the_exact_input_bytes_from_speech_start_minus_prefix_to_end_plus_prefix() -> None:
    h = Harness()
    h.update(pcmu_session())
    audio = utterance()
    h.stream(audio)
    h.advance(3000)
    # speech 400..1200 ms, prefix 300 ms, 8 bytes per ms
    assert h.output_audio() == audio[100 * 8 : 1500 * 8]


def test_output_is_paced_faster_than_real_time_in_chunks() -> None:
    h = Harness(options=RealtimeFakeOptions(speed=4.0, chunk_ms=100))
    h.update(pcmu_session())
    h.stream(utterance(tail_ms=520))  # ends right at detection: nothing else drives the clock
    h.advance(3000)
    deltas = [
        (t, e)
        for t, e in ((t, json.loads(f)) for t, f in h.frames)
        if e["type"] == "response.output_audio.delta"
    ]
    sizes = [len(base64.b64decode(e["delta"])) for _, e in deltas]
    assert sizes == [800] * 14  # 1400 ms in 100 ms chunks
    gaps = {(b - a) // MS for (a, _), (b, _) in zip(deltas, deltas[1:], strict=False)}
    assert gaps == {25}  # 100 ms of audio every 25 ms: 4x real time


def test_different_input_and_output_formats_speak_a_tone_of_the_same_length() -> None:
    h = Harness()
    h.update({"type": "realtime", "audio": {"input": {"format": PCMU}}})  # output stays pcm 24 kHz
    h.stream(utterance())
    h.advance(3000)
    out = h.output_audio()
    assert len(out) == 1400 * 48
    assert np.abs(np.frombuffer(out, "<i2")).max() > 5000


def test_pcm24k_input_is_counted_in_ms_from_bytes() -> None:
    h = Harness()
    audio = pcm16(quiet(400, 24000), tone(800, 24000), quiet(900, 24000, seed=1))
    h.stream(audio, frame_bytes=960, frame_ms=20)
    h.advance(3000)
    assert h.of("input_audio_buffer.speech_started")[0]["audio_start_ms"] == 100
    assert h.of("input_audio_buffer.speech_stopped")[0]["audio_end_ms"] == 1700
    assert h.output_audio() == audio[100 * 48 : 1500 * 48]
    assert h.core.input_ms == pytest.approx(2100)


def test_create_response_false_is_honoured_by_openai_and_ignored_by_xai() -> None:
    for dialect, responds in ((OPENAI, False), (XAI, True)):
        h = Harness(dialect)
        td = {"type": "server_vad", "create_response": False}
        session = pcmu_session(dialect, **({"turn_detection": td} if dialect is OPENAI else {}))
        if dialect is XAI:
            session["turn_detection"] = td
        h.update(session)
        h.stream(utterance())
        h.advance(3000)
        assert bool(h.of("response.created")) is responds, dialect.name
        assert h.of("input_audio_buffer.committed")


def test_script_turns_tone_and_silence() -> None:
    script = Script((Turn("tone", 600, transcript="hello there"), Turn("silence", 300)))
    h = Harness(script=script)
    h.update(pcmu_session())
    h.stream(utterance() + utterance())
    h.advance(3000)
    first, second = h.of("response.done")
    assert len(h.output_audio(first["response"]["id"])) == 600 * 8
    assert set(h.output_audio(second["response"]["id"])) == {0xFF}  # µ-law silence
    assert h.of("response.output_audio_transcript.done")[0]["transcript"] == "hello there"


# -- manual turns ---------------------------------------------------------------------------------------------


def test_openai_manual_commit_needs_100ms_then_response_create_echoes_the_buffer() -> None:
    h = Harness()
    h.update(
        {
            **pcmu_session(),
            "audio": {"input": {"format": PCMU, "turn_detection": None}, "output": {"format": PCMU}},
        }
    )
    audio = utterance()
    h.send({"type": "input_audio_buffer.append", "audio": b64(audio[:400])})  # 50 ms
    h.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
    [error] = errors(h)
    assert error["code"] == "input_audio_buffer_commit_empty" and "50.00ms" in error["message"]
    h.send({"type": "input_audio_buffer.clear"})
    assert h.of("input_audio_buffer.cleared")
    h.stream(audio)
    assert not h.of("input_audio_buffer.speech_started")
    h.send({"type": "input_audio_buffer.commit"})
    assert [e["type"] for e in h.events()[-3:]] == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    h.advance(3000)
    assert not h.of("response.created")
    h.send({"type": "response.create"})
    h.advance(3000)
    assert h.output_audio() == audio


def test_xai_commit_answers_at_once_ignores_silence_and_drops_a_bare_response_create() -> None:
    h = Harness(XAI)
    session = pcmu_session(XAI)
    session["turn_detection"] = None
    h.update(session)
    h.stream(ulaw_encode(pcm16(quiet(500))))
    h.send({"type": "input_audio_buffer.commit"})
    h.advance(2000)
    assert h.of("input_audio_buffer.committed") and not h.of("response.created")
    h.stream(utterance())
    h.send({"type": "input_audio_buffer.commit"})
    h.advance(3000)
    assert len(h.of("response.done")) == 1
    h.send({"type": "response.create"})
    h.advance(3000)
    assert len(h.of("response.created")) == 1 and not errors(h)


@pytest.mark.parametrize("dialect", [OPENAI, XAI], ids=["openai", "xai"])
def test_ro2_a_commit_mid_utterance_under_server_vad_takes_the_speech_item_and_transcribes_it_once(
    dialect,
) -> None:
    """The bridge's hard-stop commit: the item the VAD opened is committed and transcribed now; what follows
    is heard afresh."""
    h = Harness(dialect)
    transcription = {"model": "gpt-live-transcribe" if dialect is OPENAI else "grok-transcribe"}
    h.update(pcmu_session(dialect, transcription=transcription))
    h.stream(ulaw_encode(pcm16(quiet(300), tone(600))))
    [started] = h.of("input_audio_buffer.speech_started")
    assert not h.of("input_audio_buffer.committed")
    h.send({"type": "input_audio_buffer.commit"})
    [committed] = h.of("input_audio_buffer.committed")
    assert committed["item_id"] == started["item_id"]
    [completed] = h.of("conversation.item.input_audio_transcription.completed")
    assert completed["item_id"] == started["item_id"] and completed["transcript"].startswith("[utterance 1, ")
    h.stream(ulaw_encode(pcm16(quiet(900, seed=2))))
    h.advance(3000)
    assert (
        len(h.of("conversation.item.input_audio_transcription.completed")) == 1
    )  # nothing transcribed twice
    assert not errors(h)


# -- tools ----------------------------------------------------------------------------------------------------

TOOL_SCRIPT = Script((Turn("tone", 400, tool_call=ToolCallScript("lookup_order", {"order_id": "42"})),))


def test_openai_tool_call_round_trip() -> None:
    h = Harness(script=TOOL_SCRIPT)
    h.update(pcmu_session())
    h.stream(utterance())
    h.advance(2000)
    first = [e["type"] for e in h.events() if e["type"].startswith(("response.", "conversation.item"))]
    assert first[-9:] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    args = h.of("response.function_call_arguments.done")[0]
    assert (args["name"], json.loads(args["arguments"])) == ("lookup_order", {"order_id": "42"})
    assert args["call_id"].startswith("call_") and args["item_id"].startswith("item_")
    assert "".join(e["delta"] for e in h.of("response.function_call_arguments.delta")) == args["arguments"]
    assert h.of("response.done")[0]["response"]["output"][0]["type"] == "function_call"
    assert not h.of("response.output_audio.delta")
    h.advance(5000)
    assert len(h.of("response.created")) == 1  # waits for the tool result
    h.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": args["call_id"], "output": '{"ok":true}'},
        }
    )
    assert h.events()[-1]["item"]["type"] == "function_call_output"
    h.send({"type": "response.create"})
    h.advance(2000)
    assert len(h.output_audio()) == 400 * 8
    assert h.of("response.done")[-1]["response"]["status"] == "completed"


def test_xai_function_call_comes_alongside_response_done() -> None:
    h = Harness(XAI, script=TOOL_SCRIPT)
    h.update(pcmu_session(XAI))
    h.stream(utterance())
    h.advance(2000)
    types = h.types()
    start = types.index("response.created")
    assert types[start:] == [
        "response.created",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.done",
    ]
    done = h.of("response.done")[0]
    assert done["usage"] == done["response"]["usage"]
    assert done["usage"]["billable_audio_seconds"] == pytest.approx(1.7)  # input received at detection
    call_id = h.of("response.function_call_arguments.done")[0]["call_id"]
    h.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": call_id, "output": "{}"},
        }
    )
    h.send({"type": "response.create"})
    h.advance(2000)
    assert len(h.output_audio()) == 400 * 8


# -- barge-in and cancel --------------------------------------------------------------------------------------

LONG = Script(then=Turn("tone", 4000))


def test_barge_in_cancels_the_response_with_turn_detected() -> None:
    h = Harness(options=RealtimeFakeOptions(speed=1.0), script=LONG)
    h.update(pcmu_session())
    h.stream(utterance(tail_ms=520))
    h.advance(500)
    mark = h.mark()
    h.stream(utterance(lead_ms=100, speech_ms=400, tail_ms=100))
    events = h.since(mark)
    types = [e["type"] for e in events]
    i = types.index("input_audio_buffer.speech_started")
    assert types[i + 1 : i + 7] == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    done = events[i + 6]["response"]
    assert done["status"] == "cancelled" and done["status_details"] == {
        "type": "cancelled",
        "reason": "turn_detected",
    }
    assert events[i + 4]["item"]["status"] == "incomplete"
    first = done["id"]
    assert not [
        e for e in events[i:] if e["type"] == "response.output_audio.delta" and e["response_id"] == first
    ]
    heard = len(h.output_audio(first))
    assert 0 < heard < 4000 * 8


def test_no_barge_in_when_interrupt_response_is_false() -> None:
    h = Harness(options=RealtimeFakeOptions(speed=1.0), script=LONG)
    h.update(pcmu_session(turn_detection={"type": "server_vad", "interrupt_response": False}))
    h.stream(utterance(tail_ms=520))
    h.advance(500)
    h.stream(utterance(lead_ms=100, speech_ms=400, tail_ms=100))
    h.advance(5000)
    assert h.of("input_audio_buffer.speech_started")[1]
    assert h.of("response.done")[0]["response"]["status"] == "completed"


def test_response_cancel_and_response_create_while_active() -> None:
    h = Harness(options=RealtimeFakeOptions(speed=1.0))
    h.send({"type": "response.cancel", "event_id": "x1"})
    assert errors(h)[-1]["code"] == "response_cancel_not_active" and errors(h)[-1]["event_id"] == "x1"
    h.send({"type": "response.create"})
    rid = h.of("response.created")[0]["response"]["id"]
    h.advance(100)
    h.send({"type": "response.create"})
    error = errors(h)[-1]
    assert error["code"] == "conversation_already_has_active_response" and rid in error["message"]
    h.send({"type": "response.cancel", "response_id": "resp_other"})
    assert errors(h)[-1]["code"] == "response_cancel_not_active"
    h.send({"type": "response.cancel"})
    done = h.of("response.done")[0]["response"]
    assert done["status_details"]["reason"] == "client_cancelled" and done["id"] == rid
    assert not h.core.responding


# -- conversation items ---------------------------------------------------------------------------------------


def _answered(h: Harness) -> tuple[str, str]:
    h.update(pcmu_session())
    h.stream(utterance())
    h.advance(3000)
    user = h.of("input_audio_buffer.committed")[0]["item_id"]
    assistant = h.of("response.output_item.done")[0]["item"]["id"]
    return user, assistant


def test_openai_truncate_rules() -> None:
    h = Harness(script=Script(then=Turn("tone", 1000, transcript="one two three four")))
    user, assistant = _answered(h)
    h.send({"type": "conversation.item.truncate", "item_id": user, "content_index": 0, "audio_end_ms": 10})
    h.send(
        {"type": "conversation.item.truncate", "item_id": assistant, "content_index": 0, "audio_end_ms": 1001}
    )
    h.send(
        {"type": "conversation.item.truncate", "item_id": "item_nope", "content_index": 0, "audio_end_ms": 1}
    )
    assert [e["code"] for e in errors(h)] == ["invalid_value", "invalid_value", "item_not_found"]
    h.send(
        {"type": "conversation.item.truncate", "item_id": assistant, "content_index": 0, "audio_end_ms": 500}
    )
    truncated = h.events()[-1]
    assert truncated == {
        **truncated,
        "type": "conversation.item.truncated",
        "item_id": assistant,
        "audio_end_ms": 500,
        "content_index": 0,
    }
    h.send({"type": "conversation.item.retrieve", "item_id": assistant})
    assert h.events()[-1]["item"]["content"][0]["transcript"] == "one two"
    h.send(
        {"type": "conversation.item.truncate", "item_id": assistant, "content_index": 0, "audio_end_ms": 600}
    )
    assert errors(h)[-1]["code"] == "invalid_value"  # now only 500 ms long
    h.send({"type": "conversation.item.delete", "item_id": user})
    assert h.events()[-1] == {**h.events()[-1], "type": "conversation.item.deleted", "item_id": user}
    h.send({"type": "conversation.item.delete", "item_id": user})
    assert errors(h)[-1]["code"] == "item_not_found"


def test_xai_truncate_and_retrieve_are_unsupported() -> None:
    h = Harness(XAI)
    _, assistant = _answered(h)
    h.send(
        {"type": "conversation.item.truncate", "item_id": assistant, "content_index": 0, "audio_end_ms": 5}
    )
    h.send({"type": "conversation.item.retrieve", "item_id": assistant})
    assert [e["code"] for e in errors(h)] == ["unsupported_event", "unsupported_event"]
    assert "conversation.item.done" not in h.types() and "rate_limits.updated" not in h.types()


def test_text_input_item_and_text_only_response() -> None:
    h = Harness()
    h.update({"type": "realtime", "output_modalities": ["text"]})
    h.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        }
    )
    assert [e["type"] for e in h.events()[-2:]] == ["conversation.item.added", "conversation.item.done"]
    h.send({"type": "response.create"})
    h.advance(100)
    assert not h.of("response.output_audio.delta")
    text = "".join(e["delta"] for e in h.of("response.output_text.delta"))
    assert text == h.of("response.output_text.done")[0]["text"] == "[tone 1, 1.0 s]"
    assert h.of("response.done")[0]["response"]["output"][0]["content"][0]["type"] == "output_text"


def test_xai_force_message_speaks_the_text_and_text_modality_adds_text_deltas() -> None:
    h = Harness(XAI)
    h.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "force_message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Please hold."}],
            },
        }
    )
    h.advance(2000)
    assert h.of("response.output_audio_transcript.done")[0]["transcript"] == "Please hold."
    assert len(h.output_audio()) == 12 * 60 * 48  # 60 ms per character at pcm 24 kHz
    h.send({"type": "response.create", "response": {"modalities": ["text", "audio"]}})
    h.advance(2000)
    assert h.of("response.text.delta") and h.of("response.output_audio.delta")


def test_openai_idle_timeout_triggers_a_response() -> None:
    h = Harness(options=RealtimeFakeOptions(speed=4.0))
    h.update(pcmu_session(turn_detection={"type": "server_vad", "idle_timeout_ms": 2000}))
    h.stream(utterance(tail_ms=520))
    played_out = _delta_times(h)[0] + 1400 * MS  # 1.4 s of echo, played from its first delta on
    h.stream(ulaw_encode(pcm16(quiet(3500))))
    [timeout] = h.of("input_audio_buffer.timeout_triggered")
    t = next(t for t, f in h.frames if "timeout_triggered" in f)
    assert t == played_out + 2000 * MS
    assert timeout["audio_end_ms"] - timeout["audio_start_ms"] == 2000
    assert len(h.of("response.created")) == 2


# -- cap, pings, records --------------------------------------------------------------------------------------


def test_openai_session_cap_sends_session_expired_then_closes_1001() -> None:
    h = Harness(options=RealtimeFakeOptions(session_length_ms=5000))
    assert h.events()[0]["session"]["expires_at"] == UNIX + 5
    h.advance(4999)
    assert not h.closes
    h.advance(1)
    error = errors(h)[-1]
    assert error["code"] == "session_expired"
    assert error["message"] == "Your session hit the maximum duration of 5 seconds."
    assert h.closes == [(5000 * MS, h.closes[0][1])]
    assert (h.closes[0][1].code, h.closes[0][1].reason) == (1001, error["message"])
    assert h.core.next_deadline() is None


def test_openai_real_cap_message_is_60_minutes() -> None:
    h = Harness()
    h.advance(60 * 60 * 1000)
    assert h.closes[0][1].reason == "Your session hit the maximum duration of 60 minutes."


def test_xai_cap_closes_1000_without_an_error_and_pings_every_15s() -> None:
    h = Harness(XAI)
    h.advance(46_000)
    pings = h.of("ping")
    assert [p["timestamp"] for p in pings] == [
        UNIX * 1000 + 15_000,
        UNIX * 1000 + 30_000,
        UNIX * 1000 + 45_000,
    ]
    assert set(pings[0]) == {"type", "timestamp"}
    h.advance(30 * 60 * 1000)
    assert not h.of("error") and h.closes[0][1].code == 1000


def test_recorded_frames_shorten_audio() -> None:
    h = Harness()
    h.send({"type": "input_audio_buffer.append", "audio": b64(b"\x01\x02" * 50)})
    frame = h.core.last_frame.frame
    assert h.core.recorded(frame)["audio"] == {"bytes": 100, "base64": frame["audio"]}
    assert h.core.last_frame.audio_bytes == 100


# -- faults ---------------------------------------------------------------------------------------------------


def _delta_times(h: Harness) -> list[int]:
    return [t for t, f in h.frames if '"response.output_audio.delta"' in f]


def _faulted(spec: str, **kwargs: Any) -> Harness:
    h = Harness(options=RealtimeFakeOptions(speed=1.0, chunk_ms=100), faults=(parse_fault(spec),), **kwargs)
    h.update(pcmu_session())
    return h


def test_fault_burst_speeds_output_up() -> None:
    h = _faulted("burst:10@1000")
    h.stream(utterance(tail_ms=520))
    h.advance(3000)
    times = _delta_times(h)
    gaps = [(b - a) // MS for a, b in zip(times, times[1:], strict=False)]
    assert gaps == [10] * 13  # 1.4 s of audio, chunk every 10 ms
    assert h.core.record.faults == ["burst:10@1000"]


def test_fault_stall_holds_everything_back_then_dumps_it() -> None:
    h = _faulted("stall:500@1800")
    h.stream(utterance(tail_ms=520))
    h.advance(3000)
    times = _delta_times(h)
    first = times[0]
    assert first == 1680 * MS  # detected in the frame appended at 1680 ms
    assert all(t < 1800 * MS or t >= 2300 * MS for t in times)
    # chunks are due every 100 ms from 1680; those due at 1880..2280 go out together when the stall ends
    assert sum(t == 2300 * MS for t in times) == 5
    assert times[-1] == first + 13 * 100 * MS
    assert len(times) == 14 and h.core.record.faults == ["stall:500@1800"]


def test_fault_half_open_sends_nothing_more_and_never_closes() -> None:
    h = _faulted("half_open@500")
    h.stream(utterance())
    h.advance(70 * 60 * 1000)
    assert all(t < 500 * MS for t, _ in h.frames) and not h.closes
    assert len(h.core.record.client_frames) > 50


def test_fault_close_is_the_real_session_end_now() -> None:
    h = _faulted("close@700")
    h.advance(1000)
    assert errors(h)[-1]["code"] == "session_expired"
    assert h.closes[0] == (700 * MS, h.closes[0][1]) and h.closes[0][1].code == 1001


def test_fault_abrupt_close() -> None:
    h = _faulted("abrupt_close@10")
    h.advance(20)
    assert h.closes[0][1].abrupt and not h.of("error")


def test_fault_garbage_json_and_invalid_audio() -> None:
    h = Harness(faults=(parse_fault("garbage_json@5"), parse_fault("invalid_audio")))
    h.update(pcmu_session())
    h.advance(10)
    [garbage] = [f for _, f in h.frames if not f.startswith('{"type"') or not f.endswith("}")]
    with pytest.raises(ValueError):
        json.loads(garbage)
    h.stream(utterance())
    h.advance(2000)
    deltas = [e["delta"] for e in h.of("response.output_audio.delta")]
    with pytest.raises(ValueError):
        base64.b64decode(deltas[0], validate=True)
    assert all(base64.b64decode(d, validate=True) for d in deltas[1:])
    assert h.core.record.faults == ["invalid_audio", "garbage_json@5"]


def test_fault_duplicate_tool_call_delivers_every_call_twice() -> None:
    for dialect in (OPENAI, XAI):
        h = Harness(dialect, script=TOOL_SCRIPT, faults=(parse_fault("duplicate_tool_call"),))
        h.update(pcmu_session(dialect))
        h.stream(utterance())
        h.advance(1000)
        calls = h.of("response.function_call_arguments.done")
        assert len(calls) == 2 and calls[0]["call_id"] == calls[1]["call_id"], dialect.name
        assert len(h.of("response.done")[0]["response"]["output"]) == 1


def test_fault_slow_handshake_delays_session_created_and_queues_client_events() -> None:
    h = Harness(faults=(parse_fault("slow_handshake:800"),))
    assert not h.frames
    h.update(pcmu_session(), event_id="early")
    h.advance(799)
    assert not h.frames
    h.advance(1)
    assert h.types() == ["session.created", "conversation.created", "session.updated"]
    assert {t for t, _ in h.frames} == {800 * MS}


def test_runtime_inject_fires_at_inject_time_plus_after() -> None:
    h = Harness()
    h.advance(1000)
    h.core.inject(parse_fault("close@250"), h.now)
    h.advance(249)
    assert not h.closes
    h.advance(1)
    assert h.closes[0][0] == 1250 * MS and h.core.record.faults == ["close@250"]


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        RealtimeFakeOptions(speed=0)
    with pytest.raises(ValueError):
        RealtimeFakeOptions(chunk_ms=0)


TRANSCRIBER = {True: "gpt-4o-transcribe", False: "grok-transcribe"}


def _notes(h: Harness) -> list[dict[str, Any]]:
    notes = h.core.record.notes
    assert notes is not None
    return notes


@pytest.mark.parametrize("dialect", [OPENAI, XAI])
def test_notes_say_what_the_connection_heard_and_which_utterance_each_tool_call_answers(dialect: Any) -> None:
    """The notes a harness joins with the bridge's log (server.py, fault_campaign.py): the caller utterance
    heard, with the transcript the bridge was given, and the tool call answering it by call id; a context
    message with `tools_answer_callers` is answered with speech, never with a second request for the tool."""
    script = Script(
        then=Turn(tool_call=ToolCallScript("lookup_order", {"order_id": "42"})), tools_answer_callers=True
    )
    h = Harness(dialect, script=script)
    h.core.record.notes = []
    h.update(pcmu_session(dialect, transcription={"model": TRANSCRIBER[dialect is OPENAI]}))
    h.stream(utterance())
    h.advance(2000)
    [heard, call] = _notes(h)
    assert heard["kind"] == "heard" and heard["n"] == 1 and heard["text"].startswith("[utterance 1, ")
    [transcribed] = h.of("conversation.item.input_audio_transcription.completed")
    assert transcribed["transcript"] == heard["text"] and transcribed["item_id"] == heard["item"]
    args = h.of("response.function_call_arguments.done")[0]
    assert call == {
        "kind": "tool_call",
        "t_ns": call["t_ns"],
        "call_id": args["call_id"],
        "name": "lookup_order",
        "for": heard["item"],
        "input": "audio",
    }
    h.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": args["call_id"], "output": "{}"},
        }
    )
    h.send({"type": "response.create"})
    h.advance(3000)
    del _notes(h)[:]
    h.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "order shipped"}],
            },
        }
    )
    h.send({"type": "response.create"})
    h.advance(3000)
    assert [(n["kind"], n["input"]) for n in _notes(h)] == [("response", "text")]
    assert len(h.of("response.function_call_arguments.done")) == 1  # the tool was asked for once


def test_notes_name_each_frame_the_mutate_fault_corrupted_by_what_it_was() -> None:
    """A harness tells a transcript lost to a corrupted frame from one the bridge dropped: the notes say what
    each corrupted frame was (the same frames, uncorrupted, in a run without the fault)."""
    silence = bytes(ulaw_encode(np.zeros(8000, dtype=np.int16)))
    runs = []
    for fault in (None, "mutate:7"):
        h = Harness(XAI, script=Script())  # (xAI: frames are not checked against OpenAI's SDK)
        h.core.record.notes = []
        h.update(pcmu_session(XAI, transcription={"model": "grok-transcribe"}))
        h.stream(utterance(speech_ms=800, tail_ms=0))
        mark = h.mark()
        if fault is None:
            h.stream(silence)
        else:  # the corrupted frames are not for the harness to parse: the core is driven bare
            h.core.inject(parse_fault(fault), h.now)
            for i in range(0, len(silence), 160):
                h.core.receive_message(
                    json.dumps({"type": "input_audio_buffer.append", "audio": b64(silence[i : i + 160])}),
                    h.now,
                )
                h.now += 20 * MS
                while (d := h.core.next_deadline()) is not None and d <= h.now:
                    h.core.handle_timer(h.now)
        runs.append((h, mark))
    (clean, mark), (hit, _) = runs
    first = [json.loads(frame)["type"] for _, frame in clean.frames[mark : mark + 7]]
    assert [n["of"] for n in _notes(hit) if n["kind"] == "mutated"] == first
    assert any("input_audio_transcription" in kind for kind in first), first  # the caller's transcript, hit
