"""The Gemini Live fake: its sans-I/O core on virtual time (no sockets, no sleeps), then TLS helpers."""

from __future__ import annotations

import base64
import json
import random
import ssl
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.genai import types

from providers.fakes.faults import FaultKind, parse_fault
from providers.fakes.gemini_live import (
    ALLOWED_SERVER_KEYS,
    DEADLINE_EXPIRED,
    INTERNAL_ERROR,
    INVALID_ARGUMENT,
    GeminiFakeConnection,
    GeminiFakeOptions,
    GeminiSessions,
    ensure_cert,
)
from providers.fakes.script import Script, ToolCallScript, Turn
from providers.fakes.server import CloseRequest, SequentialIds
from rtp.units import NS_PER_MS as MS
from rtp.units import NS_PER_S as S

MODEL = "models/gemini-3.1-flash-live-preview"
FAST = GeminiFakeOptions(response_latency_ms=0)


def tone(ms: int, rate: int = 16000, hz: float = 1000.0, amp: float = 0.3) -> bytes:
    t = np.arange(rate * ms // 1000) / rate
    return (amp * 32767 * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes()


def silence(ms: int, rate: int = 16000) -> bytes:
    return bytes(rate * ms // 1000 * 2)


def check(message: dict[str, Any]) -> dict[str, Any]:
    """A server message as the real service would send it: camelCase keys the SDK knows, valid per its model."""
    assert set(message) <= ALLOWED_SERVER_KEYS, message
    types.LiveServerMessage.model_validate(message)
    return message


class Harness:
    """One fake connection on a number line: `now` only moves when the test says so."""

    def __init__(
        self,
        options: GeminiFakeOptions = FAST,
        *,
        script: Script | None = None,
        faults: tuple[str, ...] = (),
        sessions: GeminiSessions | None = None,
        api_key: str | None = "k",
        index: int = 0,
        now: int = 0,
        ids: SequentialIds | None = None,
    ) -> None:
        self.now = now
        self.conn = GeminiFakeConnection(
            options,
            now=now,
            api_key=api_key,
            ids=ids or SequentialIds(),
            index=index,
            faults=tuple(parse_fault(f) for f in faults),
            script=script,
            sessions=sessions,
        )
        self.log: list[tuple[int, dict[str, Any] | str]] = []
        self.closed: CloseRequest | None = None

    def _pull(self) -> list[dict[str, Any] | str]:
        out: list[dict[str, Any] | str] = []
        for text in self.conn.frames_to_send():
            try:
                message: dict[str, Any] | str = json.loads(text)
            except ValueError:
                message = text  # the garbage_json fault
            else:
                if "!!not*base64!!" in text:
                    message = text  # the invalid_audio fault: invalid on purpose, the SDK cannot parse it
                else:
                    check(message)
            out.append(message)
            self.log.append((self.now, message))
        close = self.conn.close_to_send()
        if close is not None:
            assert self.closed is None, "closed twice"
            self.closed = close
        return out

    def send(self, frame: dict[str, Any] | str) -> list[dict[str, Any] | str]:
        self.conn.receive_message(frame if isinstance(frame, str) else json.dumps(frame), self.now)
        return self._pull()

    def setup(self, **fields: Any) -> list[dict[str, Any] | str]:
        return self.send({"setup": {"model": MODEL, **fields}})

    def advance(self, until: int) -> list[dict[str, Any] | str]:
        out: list[dict[str, Any] | str] = []
        for _ in range(100_000):
            deadline = self.conn.next_deadline()
            if deadline is None or deadline > until:
                break
            self.now = max(self.now, deadline)
            self.conn.handle_timer(self.now)
            out += self._pull()
        else:
            raise AssertionError("timer loop did not settle")
        self.now = max(self.now, until)
        return out

    def stream(self, pcm: bytes, rate: int = 16000, frame_ms: int = 20) -> list[dict[str, Any] | str]:
        """Real-time audio: one frame every `frame_ms`, timers run in between."""
        step = rate * frame_ms // 1000 * 2
        out: list[dict[str, Any] | str] = []
        for i in range(0, len(pcm), step):
            data = base64.b64encode(pcm[i : i + step]).decode()
            out += self.send(
                {"realtimeInput": {"audio": {"data": data, "mimeType": f"audio/pcm;rate={rate}"}}}
            )
            out += self.advance(self.now + frame_ms * MS)
        return out

    def messages(self, key: str, sub: str | None = None) -> list[tuple[int, Any]]:
        found = []
        for t, m in self.log:
            if isinstance(m, dict) and key in m and (sub is None or sub in m[key]):
                found.append((t, m[key] if sub is None else m[key][sub]))
        return found

    def audio(self) -> bytes:
        return b"".join(
            base64.b64decode(p["inlineData"]["data"])
            for _, turn in self.messages("serverContent", "modelTurn")
            for p in turn["parts"]
        )

    def content_flags(self) -> list[str]:
        flags = []
        for _, m in self.log:
            if isinstance(m, dict) and "serverContent" in m:
                flags += [
                    k
                    for k in ("interrupted", "generationComplete", "turnComplete")
                    if k in m["serverContent"]
                ]
        return flags


def peak_hz(pcm: bytes, rate: int) -> float:
    x = np.frombuffer(pcm, dtype="<i2").astype(float)
    return float(np.argmax(np.abs(np.fft.rfft(x * np.hanning(len(x))))) * rate / len(x))


# -- setup --------------------------------------------------------------------------------------------------


def test_setup_complete_in_camel_case() -> None:
    h = Harness()
    assert h.setup(generationConfig={"responseModalities": ["AUDIO"]}) == [{"setupComplete": {}}]
    assert h.conn.model == "gemini-3.1-flash-live-preview" and h.closed is None


def test_the_sdks_mixed_spelling_and_all_snake_case_are_accepted() -> None:
    sdk = {
        "setup": {
            "model": MODEL,
            "generationConfig": {
                "responseModalities": ["AUDIO"],
                "speechConfig": {"voice_config": {"prebuilt_voice_config": {"voice_name": "Puck"}}},
            },
            "systemInstruction": {"parts": [{"text": "Be brief."}], "role": "user"},
            "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}],
            "sessionResumption": {},
            "inputAudioTranscription": {},
            "outputAudioTranscription": {},
            "realtimeInputConfig": {
                "automatic_activity_detection": {"disabled": False, "silence_duration_ms": 300},
                "activity_handling": "NO_INTERRUPTION",
            },
            "contextWindowCompression": {"trigger_tokens": 25600, "sliding_window": {"target_tokens": 12800}},
        }
    }
    h = Harness()
    assert h.send(sdk)[0] == {"setupComplete": {}}
    assert h.conn._interrupts is False  # the snake_case inner key was read
    snake = {
        "setup": {
            "model": MODEL,
            "generation_config": {"response_modalities": ["AUDIO"]},
            "system_instruction": {"parts": [{"text": "x"}]},
            "realtime_input_config": {"automatic_activity_detection": {"disabled": True}},
            "input_audio_transcription": {},
            "session_resumption": {"handle": None},
            "context_window_compression": {"sliding_window": {}},
        }
    }
    h2 = Harness()
    assert h2.send(snake)[0] == {"setupComplete": {}}
    assert h2.conn._vad is not None and h2.conn._vad.manual


@pytest.mark.parametrize(
    ("frame", "code", "reason"),
    [
        ({"setup": {"model": "gemini-3.1-flash-live-preview"}}, 1007, INVALID_ARGUMENT),  # no models/ prefix
        (
            {"setup": {"model": "models/gemini-9"}},
            1008,
            "models/gemini-9 is not found for API version v1beta",
        ),
        (
            {"setup": {"model": MODEL, "generationConfig": {"responseModalities": ["TEXT"]}}},
            1007,
            INVALID_ARGUMENT,
        ),
        ({"setup": {"model": MODEL, "bogus": 1}}, 1007, 'Unknown name "bogus"'),
        ({"setup": {"model": MODEL, "generationConfig": {"bogus": 1}}}, 1007, 'Unknown name "bogus"'),
        (
            {"setup": {"model": MODEL, "contextWindowCompression": {"triggerTokens": "many"}}},
            1007,
            INVALID_ARGUMENT,
        ),
        (
            {"setup": {"model": MODEL, "tools": [{"functionDeclarations": [{"description": "no name"}]}]}},
            1007,
            INVALID_ARGUMENT,
        ),
        ({"realtimeInput": {"audioStreamEnd": True}}, 1007, INVALID_ARGUMENT),  # setup must come first
        ({"setup": {"model": MODEL}, "clientContent": {}}, 1007, INVALID_ARGUMENT),  # two top-level keys
        ({}, 1007, INVALID_ARGUMENT),
        ("}{", 1007, "Invalid JSON payload received"),
        ("[1]", 1007, "Invalid JSON payload received"),
    ],
)
def test_bad_first_frames_close_the_connection(frame: dict[str, Any] | str, code: int, reason: str) -> None:
    h = Harness()
    assert h.send(frame) == []
    assert h.closed is not None and h.closed.code == code and reason in h.closed.reason
    assert h.conn.closed and h.conn.next_deadline() is None
    assert h.send({"setup": {"model": MODEL}}) == [] and h.conn.close_to_send() is None  # ignored from now on


def test_speech_config_language_code_is_recorded_in_either_spelling_and_unknown_keys_close_1007() -> None:
    for speech in ({"languageCode": "de-DE"}, {"language_code": "de-DE", "voice_config": {}}):
        h = Harness()
        assert h.setup(generationConfig={"speechConfig": speech}) == [{"setupComplete": {}}]
        assert h.conn.language_code == "de-DE"
    for speech in ({"language": "de-DE"}, {"languageCode": 7}):
        h = Harness()
        h.setup(generationConfig={"speechConfig": speech})
        assert h.closed is not None and h.closed.code == 1007, speech


def test_a_second_setup_and_unknown_messages_close_1007() -> None:
    for frame in ({"setup": {"model": MODEL}}, {"somethingElse": {}}):
        h = Harness()
        h.setup()
        h.send(frame)
        assert h.closed is not None and h.closed.code == 1007


def test_close_reasons_fit_a_close_frame() -> None:
    h = Harness()
    h.send({"setup": {"model": "models/" + "x" * 300}})
    assert h.closed is not None and h.closed.code == 1008 and len(h.closed.reason.encode()) <= 123


def test_a_missing_or_wrong_key_closes_right_after_the_upgrade() -> None:
    h = Harness(api_key=None)
    assert h.conn.next_deadline() == 0
    h.advance(0)
    assert h.closed is not None and h.closed.code == 1008 and "API Key" in h.closed.reason
    h2 = Harness(GeminiFakeOptions(api_keys=frozenset({"good"})), api_key="bad")
    h2.setup()  # even a setup that arrives first is refused
    assert h2.closed is not None and h2.closed.code == 1007 and "API key not valid" in h2.closed.reason


# -- VAD and echo -------------------------------------------------------------------------------------------


def test_an_utterance_is_transcribed_and_echoed_at_24k_in_a_burst() -> None:
    h = Harness(GeminiFakeOptions(response_latency_ms=200))
    h.setup(inputAudioTranscription={}, outputAudioTranscription={})
    h.stream(tone(600) + silence(600))
    inputs = h.messages("serverContent", "inputTranscription")
    text = "".join(chunk["text"] for _, chunk in inputs)
    assert text == "[utterance 1, 0.7 s]" and inputs[-1][1].get("finished") is True
    assert [c.get("finished") for _, c in inputs[:-1]] == [None] * (len(inputs) - 1)
    t_end = inputs[0][0]  # the utterance ended (600 ms + 500 ms hangover, give or take a window)
    assert 1_080 * MS <= t_end <= 1_140 * MS
    h.advance(h.now + 2 * S)
    audio = h.audio()
    assert 640 <= len(audio) / 48 <= 680  # 600 ms + 60 ms padding, at 24 kHz
    assert abs(peak_hz(audio, 24000) - 1000) < 5
    chunks = [t for t, _ in h.messages("serverContent", "modelTurn")]
    assert chunks[0] == t_end + 200 * MS  # response latency
    assert chunks[-1] - chunks[0] <= (len(audio) / 48 / 4) * MS  # 4x faster than real time
    outputs = "".join(c["text"] for _, c in h.messages("serverContent", "outputTranscription"))
    assert outputs == "[echo 1, 0.7 s]"
    assert h.content_flags() == ["generationComplete", "turnComplete"]
    ((t_done, _),) = h.messages("serverContent", "turnComplete")
    assert t_done == chunks[0] + len(audio) * S // 48000  # when real-time playback would have ended


def test_usage_counts_a_growing_context() -> None:
    h = Harness()
    h.setup(systemInstruction={"parts": [{"text": "x" * 400}]})
    h.stream(tone(400) + silence(700))
    h.advance(h.now + 2 * S)
    h.stream(tone(400) + silence(700))
    h.advance(h.now + 2 * S)
    usage = [u for _, u in h.messages("usageMetadata")]
    assert len(usage) == 2
    first, second = usage
    assert first["promptTokenCount"] == 100 + 12  # 400 characters of instructions + 460 ms of audio
    assert first["responseTokenCount"] == 12 and first["totalTokenCount"] == 124
    # The context now holds the first answer and the second utterance (60 ms pre-roll + 400 + 60 ms padding).
    assert second["promptTokenCount"] == first["promptTokenCount"] + first["responseTokenCount"] + 13
    assert {d["modality"] for d in second["promptTokensDetails"]} == {"TEXT", "AUDIO"}


def test_short_noise_and_silence_make_no_turn() -> None:
    h = Harness()
    h.setup()
    h.stream(silence(500) + tone(60) + silence(800))  # 60 ms: speech, but under min_utterance_ms
    h.advance(h.now + 2 * S)
    assert h.messages("serverContent") == [] and not h.conn.replying


def test_input_at_other_rates_is_resampled() -> None:
    h = Harness()
    h.setup()
    h.stream(tone(600, rate=8000) + silence(700, rate=8000), rate=8000)
    h.advance(h.now + 2 * S)
    audio = h.audio()
    assert 640 <= len(audio) / 48 <= 680 and abs(peak_hz(audio, 24000) - 1000) < 5


def test_audio_stream_end_ends_the_utterance_at_once() -> None:
    h = Harness()
    h.setup()
    h.stream(tone(400))
    assert not h.conn.replying
    h.send({"realtimeInput": {"audioStreamEnd": True}})
    assert h.conn.replying


def test_bad_audio_closes_1007() -> None:
    for blob in (
        {"data": "!!", "mimeType": "audio/pcm;rate=16000"},
        {"data": "AAAA", "mimeType": "audio/wav"},
        {"data": "AAAA", "mimeType": "audio/pcm;rate=x"},
        {"data": "AAAA"},
    ):
        h = Harness()
        h.setup()
        h.send({"realtime_input": {"audio": blob}})
        assert h.closed is not None and h.closed.code == 1007, blob


def test_snake_case_url_safe_audio_and_odd_byte_counts_are_accepted() -> None:
    h = Harness()
    h.setup()
    pcm = tone(600) + silence(700)
    for i in range(0, len(pcm), 641):
        data = base64.urlsafe_b64encode(pcm[i : i + 641]).decode()  # google-genai's spelling of bytes
        h.send({"realtime_input": {"audio": {"data": data, "mime_type": "audio/pcm;rate=16000"}}})
    h.advance(h.now + 3 * S)
    assert h.closed is None and 640 <= len(h.audio()) / 48 <= 680


# -- barge-in -----------------------------------------------------------------------------------------------


LONG_TONE = Script(then=Turn("tone", duration_ms=3000, frequency_hz=500.0))


def test_speech_during_output_interrupts_without_generation_complete() -> None:
    h = Harness(script=LONG_TONE)
    h.setup()
    h.stream(tone(400) + silence(520))
    assert h.conn.replying
    h.stream(tone(100))  # the caller talks over the model
    assert h.content_flags() == ["interrupted", "turnComplete"]
    assert not h.conn.replying
    sent = len(h.audio())
    h.advance(h.now + 5 * S)
    assert len(h.audio()) == sent, "no audio after the interruption"


def test_speech_during_playback_after_generation_complete_still_interrupts() -> None:
    h = Harness(GeminiFakeOptions(response_latency_ms=0, burst_factor=100.0), script=LONG_TONE)
    h.setup()
    h.stream(tone(400) + silence(600))
    assert h.content_flags() == ["generationComplete"]  # all 3 s sent, playback not over
    h.stream(tone(100))
    assert h.content_flags() == ["generationComplete", "interrupted", "turnComplete"]


def test_no_interruption_queues_the_next_turn() -> None:
    h = Harness(script=Script(then=Turn("tone", duration_ms=1500)))
    h.setup(realtimeInputConfig={"activityHandling": "NO_INTERRUPTION"})
    h.stream(tone(300) + silence(520) + tone(300) + silence(600))
    h.advance(h.now + 10 * S)
    assert "interrupted" not in h.content_flags()
    assert h.content_flags().count("turnComplete") == 2


# -- manual activity, text --------------------------------------------------------------------------------


def test_activity_signals_need_manual_detection() -> None:
    h = Harness()
    h.setup()
    h.send({"realtimeInput": {"activityStart": {}}})
    assert h.closed is not None and h.closed.code == 1007
    m = Harness()
    m.setup(realtimeInputConfig={"automaticActivityDetection": {"disabled": True}})
    m.send({"realtimeInput": {"activityStart": {}}})
    m.stream(silence(200) + tone(300))  # energy does not matter in manual mode
    m.send({"realtime_input": {"activityEnd": {}}})
    m.advance(m.now + 2 * S)
    assert abs(len(m.audio()) / 48 - 500) <= 5 and m.content_flags()[-1] == "turnComplete"


def test_text_turns_get_a_tone_answer_with_the_text_as_transcript() -> None:
    h = Harness()
    h.setup(outputAudioTranscription={})
    h.send(
        {"clientContent": {"turns": [{"role": "user", "parts": [{"text": "seed"}]}], "turnComplete": False}}
    )
    h.advance(h.now + S)
    assert h.messages("serverContent") == []
    h.send(
        {
            "client_content": {
                "turns": [{"role": "user", "parts": [{"text": "hello there"}]}],
                "turnComplete": True,
            }
        }
    )
    h.advance(h.now + 2 * S)
    assert "".join(c["text"] for _, c in h.messages("serverContent", "outputTranscription")) == "hello there"
    assert len(h.audio()) == 48_000  # the echo turn's default 1000 ms, as a tone
    h.send({"realtimeInput": {"text": "again"}})
    h.advance(h.now + 2 * S)
    assert h.content_flags().count("turnComplete") == 2


def test_client_content_interrupts_an_answer() -> None:
    h = Harness(script=LONG_TONE)
    h.setup()
    h.stream(tone(400) + silence(520))
    h.send(
        {"clientContent": {"turns": [{"role": "user", "parts": [{"text": "stop"}]}], "turnComplete": True}}
    )
    assert h.content_flags() == ["interrupted", "turnComplete"] and h.conn.replying


# -- tools --------------------------------------------------------------------------------------------------


TOOL_SCRIPT = Script(turns=(Turn("tone", 800, tool_call=ToolCallScript("lookup_order", {"order_id": "42"})),))


def test_a_tool_call_blocks_the_turn_until_its_response() -> None:
    h = Harness(script=TOOL_SCRIPT)
    h.setup(sessionResumption={})
    h.stream(tone(400) + silence(600))
    ((_, call),) = h.messages("toolCall")
    (fc,) = call["functionCalls"]
    assert fc["name"] == "lookup_order" and fc["args"] == {"order_id": "42"} and fc["id"].startswith("fc_")
    h.advance(h.now + 12 * S)
    assert h.audio() == b"" and h.messages("serverContent", "turnComplete") == []
    assert h.messages("sessionResumptionUpdate")[-1][1] == {}, "not resumable while a tool call is open"
    h.send(
        {
            "tool_response": {
                "functionResponses": [
                    {"id": fc["id"], "name": "lookup_order", "response": {"output": {"status": "shipped"}}}
                ]
            }
        }
    )
    h.advance(h.now + 2 * S)
    assert len(h.audio()) == 800 * 48 and h.content_flags()[-1] == "turnComplete"


@pytest.mark.parametrize(
    "responses",
    [
        [{"id": "fc_unknown", "name": "lookup_order", "response": {}}],
        [{"name": "lookup_order", "response": {}}],
        [],
        "nope",
        [{"id": "*", "name": "lookup_order", "response": "not an object"}],
    ],
)
def test_a_tool_response_must_match_an_open_call(responses: Any) -> None:
    h = Harness(script=TOOL_SCRIPT)
    h.setup()
    h.stream(tone(400) + silence(600))
    ((_, call),) = h.messages("toolCall")
    if isinstance(responses, list) and responses and responses[0].get("id") == "*":
        responses[0]["id"] = call["functionCalls"][0]["id"]
    h.send({"toolResponse": {"functionResponses": responses}})
    assert h.closed is not None and h.closed.code == 1007


def test_a_tool_response_with_nothing_open_closes_1007() -> None:
    h = Harness()
    h.setup()
    h.send({"toolResponse": {"functionResponses": [{"id": "fc_1", "name": "x", "response": {}}]}})
    assert h.closed is not None and h.closed.code == 1007


def test_barge_in_retracts_an_open_tool_call() -> None:
    h = Harness(script=TOOL_SCRIPT)
    h.setup()
    h.stream(tone(400) + silence(600))
    ((_, call),) = h.messages("toolCall")
    h.stream(tone(100))
    assert h.messages("toolCallCancellation") == [
        (h.messages("toolCallCancellation")[0][0], {"ids": [call["functionCalls"][0]["id"]]})
    ]
    assert h.content_flags() == ["interrupted", "turnComplete"]


# -- session management -------------------------------------------------------------------------------------


def test_go_away_then_1011_at_the_end_of_the_connection_lifetime() -> None:
    h = Harness(GeminiFakeOptions(response_latency_ms=0, connection_lifetime_ms=60_000))
    h.setup()
    h.advance(9_999 * MS)
    assert h.messages("goAway") == []
    h.advance(10 * S)
    assert h.messages("goAway") == [(10 * S, {"timeLeft": "50s"})]
    h.advance(60 * S - 1)
    assert h.closed is None
    h.advance(60 * S)
    assert h.closed == CloseRequest(1011, DEADLINE_EXPIRED) and h.conn.record.close_code == 1011


def test_without_compression_the_session_ends_at_the_cap() -> None:
    opts = GeminiFakeOptions(response_latency_ms=0, connection_lifetime_ms=3_600_000, session_cap_ms=900_000)
    h = Harness(opts)
    h.setup()
    h.advance(900 * S)
    assert h.closed == CloseRequest(1011, DEADLINE_EXPIRED) and h.messages("goAway") == []
    c = Harness(opts)
    c.setup(contextWindowCompression={"slidingWindow": {}})
    c.advance(1000 * S)
    assert c.closed is None


def test_resumption_updates_and_resuming_on_a_new_connection() -> None:
    sessions = GeminiSessions()
    ids = SequentialIds()
    script = Script(then=Turn("tone", duration_ms=300))
    first = Harness(
        GeminiFakeOptions(response_latency_ms=0, resumption_update_ms=5_000),
        script=script,
        sessions=sessions,
        ids=ids,
    )
    first.setup(sessionResumption={}, outputAudioTranscription={})
    ((_, update),) = first.messages("sessionResumptionUpdate")
    assert update["resumable"] is True and update["newHandle"].startswith("handle_")
    first.stream(tone(300) + silence(600))
    first.advance(first.now + 2 * S)
    handle = first.messages("sessionResumptionUpdate")[-1][1]["newHandle"]
    assert first.conn.session is not None and first.conn.session.turns == 1

    busy = Harness(sessions=sessions, index=1, now=first.now, ids=ids)
    busy.setup(sessionResumption={"handle": handle})
    assert busy.closed == CloseRequest(1011, INTERNAL_ERROR), "the old socket still holds the session"

    first.conn.connection_lost(1000)
    second = Harness(script=script, sessions=sessions, index=2, now=first.now, ids=ids)
    assert second.setup(sessionResumption={"handle": handle}, outputAudioTranscription={})[0] == {
        "setupComplete": {}
    }
    second.stream(tone(300) + silence(600))
    second.advance(second.now + 2 * S)
    transcript = "".join(c["text"] for _, c in second.messages("serverContent", "outputTranscription"))
    assert transcript == "[tone 2, 0.3 s]", "the resumed session continues the conversation"
    assert second.conn.record.session_id == first.conn.record.session_id


def test_periodic_updates_and_unknown_or_expired_handles() -> None:
    sessions = GeminiSessions()
    ids = SequentialIds()  # one per server, as in the shell
    opts = GeminiFakeOptions(response_latency_ms=0, resumption_update_ms=5_000, handle_ttl_ms=60_000)
    h = Harness(opts, sessions=sessions, ids=ids)
    h.setup(sessionResumption={})
    h.advance(10 * S)
    assert [t for t, _ in h.messages("sessionResumptionUpdate")] == [0, 5 * S, 10 * S]
    assert Harness(sessions=sessions).setup(sessionResumption={"handle": "nope"}) == []
    handle = h.messages("sessionResumptionUpdate")[0][1]["newHandle"]
    h.conn.connection_lost(1000)
    in_time = Harness(opts, sessions=sessions, now=59 * S, index=3, ids=ids)
    assert in_time.setup(sessionResumption={"handle": handle})[0] == {"setupComplete": {}}
    in_time.conn.connection_lost(1000)
    # Valid for the TTL after the session last ended (59 s, when `in_time` closed), not after it was issued.
    late = Harness(opts, sessions=sessions, now=(59 + 61) * S, index=4, ids=ids)
    late.setup(sessionResumption={"handle": handle})
    assert late.closed is not None and late.closed.code == 1007
    plain = Harness()
    plain.setup()
    plain.advance(30 * S)
    assert plain.messages("sessionResumptionUpdate") == [], "no updates unless requested"


def test_a_handle_stays_valid_for_the_ttl_after_the_session_ends_not_after_it_was_issued() -> None:
    """ai.google.dev: handles are valid 2 hours after the session ends (providers.md §2.10)."""
    sessions, ids = GeminiSessions(), SequentialIds()
    opts = GeminiFakeOptions(response_latency_ms=0, resumption_update_ms=500_000, handle_ttl_ms=60_000)
    first = Harness(opts, sessions=sessions, ids=ids)
    first.setup(sessionResumption={})
    handle = first.messages("sessionResumptionUpdate")[0][1]["newHandle"]
    assert first.conn.record.handles == [handle]
    first.advance(100 * S)  # the session stays open well past the TTL counted from the handle's issue
    first.conn.connection_lost(1000, 100 * S)
    resumed = Harness(opts, sessions=sessions, now=159 * S, index=1, ids=ids)
    assert resumed.setup(sessionResumption={"handle": handle})[0] == {"setupComplete": {}}
    assert (
        resumed.conn.record.resumed_handle == handle
        and resumed.conn.record.session_id == first.conn.record.session_id
    )
    resumed.conn.connection_lost(1000, 159 * S)
    expired = Harness(opts, sessions=sessions, now=(159 + 61) * S, index=2, ids=ids)
    expired.setup(sessionResumption={"handle": handle})
    assert (
        expired.closed == CloseRequest(1007, INVALID_ARGUMENT) and expired.conn.record.resumed_handle is None
    )


def test_ro2_audio_stream_end_mid_speech_transcribes_and_answers_once() -> None:
    """The hard-stop commit on Gemini: audioStreamEnd ends the caller's activity; the rest of the speech, when
    it goes on, is a new activity."""
    h = Harness(script=Script(then=Turn("tone", duration_ms=200)))
    h.setup(inputAudioTranscription={})
    h.stream(tone(600))
    assert h.messages("serverContent", "inputTranscription") == []  # still speaking
    h.send({"realtimeInput": {"audioStreamEnd": True}})
    h.advance(h.now + 2 * S)
    chunks = [c for _, c in h.messages("serverContent", "inputTranscription")]
    assert "".join(c["text"] for c in chunks).startswith("[utterance 1,")
    assert [c.get("finished") for c in chunks].count(True) == 1
    assert h.content_flags().count("turnComplete") == 1
    h.send({"realtimeInput": {"audioStreamEnd": True}})  # nothing open: nothing more
    h.advance(h.now + 2 * S)
    assert h.content_flags().count("turnComplete") == 1


# -- faults -------------------------------------------------------------------------------------------------


def answer_times(h: Harness) -> list[int]:
    return [t for t, _ in h.messages("serverContent", "modelTurn")]


def test_burst_fault_changes_the_factor() -> None:
    script = Script(then=Turn("tone", duration_ms=1000))
    h = Harness(script=script, faults=("burst:20",))
    h.setup()
    h.stream(tone(300) + silence(600))
    h.advance(h.now + 3 * S)
    times = answer_times(h)
    assert times[-1] - times[0] <= 50 * MS  # 1 s of audio in 1/20 s
    assert h.conn.record.faults == ["burst:20"]


def test_stall_holds_everything_then_dumps_it() -> None:
    h = Harness(script=Script(then=Turn("tone", duration_ms=1000)), faults=("stall:3000@500",))
    h.setup()
    h.stream(tone(300) + silence(600))  # the answer is due inside the stall (0.5 s .. 3.5 s)
    h.advance(3500 * MS - 1)
    assert h.messages("serverContent") == []
    h.advance(3500 * MS)
    assert {t for t, _ in h.messages("serverContent")} == {3500 * MS}  # all of it, at once
    assert h.content_flags() == ["generationComplete", "turnComplete"]
    assert len(h.audio()) == 48_000


def test_half_open_says_nothing_more_and_never_closes() -> None:
    h = Harness(
        GeminiFakeOptions(response_latency_ms=0, connection_lifetime_ms=60_000), faults=("half_open@500",)
    )
    h.setup(sessionResumption={})
    h.advance(1 * S)
    h.stream(tone(300) + silence(600))
    h.advance(120 * S)
    assert [t for t, _ in h.log] == [0, 0]  # setupComplete and the first update only
    assert h.closed is None and h.conn.next_deadline() is None


def test_close_fault_is_go_away_then_1011_now() -> None:
    h = Harness(faults=("close@2000",))
    h.setup()
    h.advance(5 * S)
    assert h.messages("goAway") == [(2 * S, {"timeLeft": "0s"})]
    assert h.closed == CloseRequest(1011, DEADLINE_EXPIRED)


def test_abrupt_close_garbage_and_invalid_audio() -> None:
    a = Harness(faults=("abrupt_close@100",))
    a.setup()
    a.advance(S)
    assert a.closed is not None and a.closed.abrupt
    g = Harness(faults=("garbage_json@100",))
    g.setup()
    g.advance(S)
    assert [m for _, m in g.log if isinstance(m, str)] == ["}{ this is not JSON"]
    v = Harness(faults=("invalid_audio@100",))
    v.setup()
    v.advance(S)
    (bad,) = [json.loads(m) for _, m in v.log if isinstance(m, str)]
    blob = bad["serverContent"]["modelTurn"]["parts"][0]["inlineData"]
    assert blob["mimeType"] == "audio/pcm;rate=24000"
    with pytest.raises(ValueError):
        base64.b64decode(blob["data"], validate=True)


def test_duplicate_tool_call_delivers_each_call_twice() -> None:
    h = Harness(script=TOOL_SCRIPT, faults=("duplicate_tool_call",))
    h.setup()
    h.stream(tone(400) + silence(600))
    calls = h.messages("toolCall")
    assert len(calls) == 2 and calls[0][1] == calls[1][1]


def test_slow_handshake_delays_setup_complete_and_what_follows() -> None:
    h = Harness(faults=("slow_handshake:1500",))
    assert h.setup(sessionResumption={}) == []
    h.advance(1500 * MS - 1)
    assert h.log == []
    out = h.advance(1500 * MS)
    assert out[0] == {"setupComplete": {}} and "sessionResumptionUpdate" in out[1]


def test_faults_injected_at_runtime_count_from_injection() -> None:
    h = Harness()
    h.setup()
    h.advance(10 * S)
    h.conn.inject(parse_fault("close@500"), h.now)
    h.advance(h.now + 499 * MS)
    assert h.closed is None
    h.advance(h.now + 1 * MS)
    assert h.closed == CloseRequest(1011, DEADLINE_EXPIRED) and h.conn.record.faults == ["close@500"]
    early = Harness()
    early.conn.inject(parse_fault(FaultKind.GARBAGE_JSON.value), 0)  # before setup: fires at setup
    early.setup()
    assert "}{ this is not JSON" in [m for _, m in early.log]


def test_peer_input_never_raises() -> None:
    rng = random.Random(7)
    values: list[Any] = [
        None,
        0,
        -1,
        "x",
        True,
        [],
        {},
        [1],
        ["AUDIO"],
        {"parts": 5},
        {"data": "AAAA"},
        [{"functionDeclarations": 3}],
        [{"parts": [{"text": 1}]}],
        {"slidingWindow": []},
        {"automaticActivityDetection": {"disabled": "no", "prefixPaddingMs": "x"}},
        [{"id": 5}],
        {"data": "AAAA", "mimeType": 1},
        [{"data": "!"}],
    ]
    setup_keys = [
        "model",
        "generationConfig",
        "systemInstruction",
        "tools",
        "realtimeInputConfig",
        "sessionResumption",
        "contextWindowCompression",
        "input_audio_transcription",
    ]
    frame_keys = [
        "realtimeInput",
        "realtime_input",
        "clientContent",
        "toolResponse",
        "setup",
        "contextUpdate",
    ]
    inner_keys = [
        "audio",
        "audioStreamEnd",
        "activityStart",
        "text",
        "mediaChunks",
        "turns",
        "turnComplete",
        "functionResponses",
        "mime_type",
    ]
    for i in range(400):
        h = Harness()
        setup: dict[str, Any] = {"model": MODEL} if i % 4 else {}
        for key in rng.sample(setup_keys, rng.randint(0, 1 if i % 3 else 3)):
            setup[key] = rng.choice(values)
        h.send({"setup": setup})
        for _ in range(5):
            body = {k: rng.choice(values) for k in rng.sample(inner_keys, rng.randint(0, 3))}
            h.send({rng.choice(frame_keys): rng.choice([body, rng.choice(values)])})
            h.advance(h.now + 100 * MS)
        assert h.closed is None or h.closed.code in (1007, 1008, 1011)


# -- records and TLS ----------------------------------------------------------------------------------------


def test_recorded_frames_shorten_audio() -> None:
    h = Harness()
    h.setup()
    data = base64.b64encode(bytes(640)).decode()
    h.send({"realtime_input": {"audio": {"data": data, "mime_type": "audio/pcm;rate=16000"}}})
    last = h.conn.last_frame
    assert last is not None and last.audio_bytes == 640
    assert h.conn.recorded(last.frame or {}) == {
        "realtime_input": {"audio": {"mime_type": "audio/pcm;rate=16000", "data": {"bytes": 640}}}
    }
    assert h.conn.recorded({"setup": {"model": MODEL}}) == {"setup": {"model": MODEL}}
    assert [r.frame for r in h.conn.record.client_frames][0] == {"setup": {"model": MODEL}}


def test_ensure_cert_generates_a_localhost_pair(tmp_path: Path) -> None:
    from cryptography import x509

    cert, key, generated = ensure_cert(None, None, str(tmp_path))
    assert generated and Path(cert).exists() and Path(key).exists()
    parsed = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    san = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)  # a usable pair
    ssl.create_default_context(cafile=cert)  # and a usable trust anchor
    assert ensure_cert(cert, key, "/nonexistent") == (cert, key, False)
    with pytest.raises(ValueError):
        ensure_cert(cert, None, str(tmp_path))
