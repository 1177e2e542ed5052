"""The Gemini Live client core on canned server frames, and the adapter's construction."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest

from providers.base import SessionSettings, ToolSpec
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputInterrupted,
    OutputTranscript,
    ProviderError,
    ResponseDone,
    ResumptionUpdated,
    SessionExpiring,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallCancelled,
    ToolCallRequested,
    UsageUpdated,
)
from providers.gemini_live import (
    DEFAULT_MODEL,
    GeminiClientProtocol,
    GeminiConfig,
    GeminiLiveAdapter,
    parse_duration_ms,
    resolve_url,
    setup_frame,
)
from providers.limits import GEMINI_LIVE
from rtp.audio import PCM16_24K

TOOL = ToolSpec(
    "lookup_order", "Find an order", {"type": "object", "properties": {"order_id": {"type": "string"}}}
)


def core(**config: Any) -> GeminiClientProtocol:
    return GeminiClientProtocol(GeminiConfig(**config), token=7)


def feed(c: GeminiClientProtocol, message: dict[str, Any] | str) -> list[Any]:
    return c.receive_text(message if isinstance(message, str) else json.dumps(message))


def audio_message(data: str, mime: str = "audio/pcm;rate=24000") -> dict[str, Any]:
    return {"serverContent": {"modelTurn": {"parts": [{"inlineData": {"mimeType": mime, "data": data}}]}}}


# -- setup --------------------------------------------------------------------------------------------------


def test_setup_is_the_first_frame_in_camel_case_with_every_default() -> None:
    c = core(instructions="Be brief.", tools=(TOOL,), voice="Kore")
    frames = c.frames_to_send()
    assert len(frames) == 1 and c.frames_to_send() == []
    setup = json.loads(frames[0])["setup"]
    assert setup["model"] == f"models/{DEFAULT_MODEL}"
    assert setup["generationConfig"] == {
        "responseModalities": ["AUDIO"],
        "speechConfig": {"voiceConfig": {"prebuiltVoiceConfig": {"voiceName": "Kore"}}},
    }
    assert setup["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert setup["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "lookup_order",
                    "description": "Find an order",
                    "parametersJsonSchema": TOOL.parameters,
                }
            ]
        }
    ]
    assert setup["realtimeInputConfig"] == {
        "automaticActivityDetection": {"disabled": False},
        "activityHandling": "START_OF_ACTIVITY_INTERRUPTS",
    }
    assert setup["inputAudioTranscription"] == {} and setup["outputAudioTranscription"] == {}
    assert setup["sessionResumption"] == {}
    assert setup["contextWindowCompression"] == {"slidingWindow": {}}  # on by default: calls may pass 15 min


def test_setup_options_resumption_compression_and_model_prefix() -> None:
    setup = setup_frame(
        GeminiConfig(
            model="models/gemini-2.0-flash-live-001",
            resume_handle="h-1",
            trigger_tokens=25600,
            target_tokens=12800,
            interrupts=False,
        )
    )["setup"]
    assert setup["model"] == "models/gemini-2.0-flash-live-001"
    assert setup["sessionResumption"] == {"handle": "h-1"}
    assert setup["contextWindowCompression"] == {
        "slidingWindow": {"targetTokens": 12800},
        "triggerTokens": 25600,
    }
    assert setup["realtimeInputConfig"]["activityHandling"] == "NO_INTERRUPTION"
    assert "tools" not in setup and "systemInstruction" not in setup
    assert "contextWindowCompression" not in setup_frame(GeminiConfig(compression=False))["setup"]


def test_setup_complete_starts_the_session_and_seeds_history() -> None:
    c = core(history=(("user", "My name is Ada."), ("assistant", "Hello Ada.")))
    c.frames_to_send()
    events = feed(c, {"setupComplete": {"sessionId": "s-9"}})
    assert events == [SessionStarted(7, "s-9")] and c.started
    (seed,) = [json.loads(f) for f in c.frames_to_send()]
    assert seed == {
        "clientContent": {
            "turns": [
                {"role": "user", "parts": [{"text": "My name is Ada."}]},
                {"role": "model", "parts": [{"text": "Hello Ada."}]},
            ],
            "turnComplete": False,
        }
    }


def test_a_resumed_session_is_not_seeded_again() -> None:
    c = core(history=(("user", "hi"),), resume_handle="h")
    c.frames_to_send()
    assert feed(c, {"setupComplete": {}}) == [SessionStarted(7, "")]
    assert c.frames_to_send() == []


# -- audio --------------------------------------------------------------------------------------------------


def test_audio_is_passed_on_exactly_as_received() -> None:
    c = core()
    pcm = bytes(range(256)) * 3
    (event,) = feed(c, audio_message(base64.b64encode(pcm).decode()))
    assert event == AudioReceived(7, pcm, PCM16_24K)
    assert c.bytes_received == len(pcm)
    urlsafe = base64.urlsafe_b64encode(pcm).decode()  # proto3 JSON also allows the URL-safe alphabet
    assert feed(c, audio_message(urlsafe))[0].audio == pcm


@pytest.mark.parametrize(
    ("data", "mime", "why"),
    [
        ("!!not*base64!!", "audio/pcm;rate=24000", "not valid base64"),
        ("QUJD", "audio/pcm;rate=24000", "odd length"),  # b"ABC"
        ("AAAA", "audio/pcm;rate=16000", "unexpected output audio format"),
        ("AAA", "audio/pcm;rate=24000", "not valid base64"),  # missing padding
    ],
)
def test_invalid_audio_is_fatal(data: str, mime: str, why: str) -> None:
    c = core()
    message = audio_message(data, mime)
    message["serverContent"]["turnComplete"] = True
    events = feed(c, message)
    assert len(events) == 1, "nothing after invalid audio counts"
    (error,) = events
    assert isinstance(error, ProviderError) and error.fatal and error.code == "invalid_audio"
    assert why in error.message and error.raw is not None and data in error.raw


def test_text_thoughts_and_empty_audio_are_not_played() -> None:
    c = core()
    message = {
        "serverContent": {
            "modelTurn": {
                "parts": [
                    {"text": "thinking..."},
                    {"thought": True, "inlineData": {"mimeType": "audio/pcm;rate=24000", "data": "AAAA"}},
                    {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                    {"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": ""}},
                ]
            }
        }
    }
    assert feed(c, message) == []


def test_a_part_whose_mime_type_is_not_a_string_is_a_counted_error_and_the_next_part_still_plays() -> None:
    c = core()
    good = base64.b64encode(b"\x01\x02" * 4).decode()
    message = {
        "serverContent": {
            "modelTurn": {
                "parts": [
                    {"inlineData": {"mimeType": 24000, "data": good}},
                    {"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": good}},
                ]
            }
        }
    }
    error, audio = feed(c, message)
    assert isinstance(error, ProviderError) and not error.fatal and error.code == "invalid_event"
    assert "mimeType" in error.message
    assert isinstance(audio, AudioReceived) and audio.audio == b"\x01\x02" * 4


def test_audio_frame_is_16k_realtime_input() -> None:
    frame = json.loads(GeminiClientProtocol.audio_frame(b"\x01\x02" * 4))
    assert frame == {
        "realtimeInput": {
            "audio": {"data": base64.b64encode(b"\x01\x02" * 4).decode(), "mimeType": "audio/pcm;rate=16000"}
        }
    }


# -- turns, transcripts, barge-in ---------------------------------------------------------------------------


def test_interrupted_is_a_barge_in_and_the_turn_ends_cancelled() -> None:
    c = core()
    assert feed(c, {"serverContent": {"interrupted": True}}) == [SpeechStarted(7), OutputInterrupted(7)]
    assert feed(c, {"serverContent": {"turnComplete": True}}) == [ResponseDone(7, status="cancelled")]
    assert feed(c, {"serverContent": {"turnComplete": True}}) == [ResponseDone(7, status="completed")]


def test_voice_activity_is_reported_once_per_activity() -> None:
    c = core()
    assert feed(c, {"voiceActivity": {"type": "ACTIVITY_START"}}) == [SpeechStarted(7)]
    assert feed(c, {"serverContent": {"interrupted": True}}) == [OutputInterrupted(7)]
    assert feed(c, {"voiceActivity": {"type": "ACTIVITY_END"}}) == [SpeechStopped(7)]


def test_transcription_chunks_and_finished() -> None:
    c = core()
    assert feed(c, {"serverContent": {"inputTranscription": {"text": "where is"}}}) == [
        InputTranscript(7, "where is")
    ]
    assert feed(c, {"serverContent": {"inputTranscription": {"text": " my order", "finished": True}}}) == [
        InputTranscript(7, "where is my order", final=True)  # the whole utterance: the contract's `final`
    ]
    assert feed(c, {"serverContent": {"outputTranscription": {"text": "Sure, "}}}) == [
        OutputTranscript(7, "Sure, ")
    ]
    assert feed(c, {"serverContent": {"outputTranscription": {"finished": True}}}) == [
        OutputTranscript(7, "", final=True)
    ]
    assert feed(c, {"serverContent": {"outputTranscription": {}}}) == []


def test_turn_complete_with_usage_in_one_message() -> None:
    c = core()
    events = feed(
        c,
        {
            "serverContent": {"generationComplete": True, "turnComplete": True},
            "usageMetadata": {"promptTokenCount": 412, "responseTokenCount": "96", "totalTokenCount": 508},
        },
    )
    assert events == [ResponseDone(7), UsageUpdated(7, input_tokens=412, output_tokens=96, cumulative=True)]


# -- tools --------------------------------------------------------------------------------------------------


def test_tool_calls_and_cancellation() -> None:
    c = core()
    events = feed(
        c,
        {
            "toolCall": {
                "functionCalls": [
                    {"id": "fc-1", "name": "lookup_order", "args": {"order_id": "42"}},
                    {"id": "fc-2", "name": "hang_up"},
                    {"name": "no_id"},
                ]
            }
        },
    )
    assert events[:2] == [
        ToolCallRequested(7, "fc-1", "lookup_order", '{"order_id": "42"}'),
        ToolCallRequested(7, "fc-2", "hang_up", "{}"),
    ]
    assert (
        isinstance(events[2], ProviderError) and not events[2].fatal and events[2].code == "invalid_tool_call"
    )
    assert feed(c, {"toolCallCancellation": {"ids": ["fc-1", "fc-2"]}}) == [
        ToolCallCancelled(7, ("fc-1", "fc-2"))
    ]


def test_dl5_gemini_tool_results_are_tool_responses_and_text_is_client_content() -> None:
    c = core()
    c.frames_to_send()
    c.send_tool_result("fc-1", "lookup_order", '{"status": "shipped"}')
    c.send_tool_result("fc-2", "note", "plain words")
    c.send_text("Caller pressed 5", speak=True)
    c.send_text("The caller is a VIP", speak=False)
    frames = [json.loads(f) for f in c.frames_to_send()]
    assert frames[0] == {
        "toolResponse": {
            "functionResponses": [
                {"id": "fc-1", "name": "lookup_order", "response": {"output": {"status": "shipped"}}}
            ]
        }
    }
    assert frames[1]["toolResponse"]["functionResponses"][0]["response"] == {"output": "plain words"}
    assert frames[2] == {
        "clientContent": {
            "turns": [{"role": "user", "parts": [{"text": "Caller pressed 5"}]}],
            "turnComplete": True,
        }
    }
    assert frames[3]["clientContent"]["turnComplete"] is False
    assert c.close_frames() == []


# -- session management -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "ms"), [("50s", 50_000), ("1.500s", 1_500), ("0s", 0), ("0.000000001s", 0)])
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["50", "s", "-1s", "1.5m", None, 50])
def test_bad_durations(text: object) -> None:
    assert parse_duration_ms(text) is None


def test_go_away_and_the_expected_1011() -> None:
    c = core()
    assert feed(c, {"goAway": {"timeLeft": "50s"}}) == [SessionExpiring(7, 50_000, "go_away")]
    closed = c.connection_closed(1011, "Deadline expired before operation could complete.")
    assert closed.close_code == 1011 and closed.reason.startswith("go_away: ") and not closed.finalized
    assert c.closed
    assert feed(core(), {"goAway": {"timeLeft": "soon"}}) == [SessionExpiring(7, 0, "go_away")]


@pytest.mark.parametrize(
    ("code", "label"),
    [
        (1007, "invalid_argument"),
        (1008, "policy_violation"),
        (1011, "internal_error"),
        (1000, "closed"),
        (1006, "connection_lost"),
        (None, "connection_lost"),
    ],
)
def test_close_codes_are_labelled(code: int | None, label: str) -> None:
    closed = core().connection_closed(code, "why")
    assert closed.reason == f"{label}: why" and closed.close_code == code


def test_a_requested_close_is_labelled_so() -> None:
    c = core()
    c.close_requested = True
    assert c.connection_closed(1000, "bye").reason.startswith("close_requested")


def test_resumption_updates_keep_the_latest_resumable_handle() -> None:
    c = core(resume_handle="h-0")
    assert feed(c, {"sessionResumptionUpdate": {"newHandle": "h-1", "resumable": True}}) == [
        ResumptionUpdated(7, "h-1", True)
    ]
    assert feed(c, {"sessionResumptionUpdate": {}}) == [ResumptionUpdated(7, "", False)]
    assert feed(c, {"sessionResumptionUpdate": {"newHandle": "h-2", "resumable": False}}) == [
        ResumptionUpdated(7, "h-2", False)
    ]
    assert c.resumption_handle == "h-1"


# -- robustness ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["}{ not json", "[1, 2]", '"text"', '{"serverContent": 5}', b"\xff\xfe"])
def test_unparseable_frames_are_non_fatal_errors(text: str | bytes) -> None:
    (error,) = core().receive_text(text)
    assert isinstance(error, ProviderError) and error.code == "invalid_event" and not error.fatal


def test_unknown_keys_are_ignored_and_binary_frames_parse() -> None:
    c = core()
    assert feed(c, {"somethingNew": {"x": 1}}) == []
    assert c.receive_text(json.dumps({"setupComplete": {}}).encode()) == [SessionStarted(7, "")]


def test_peer_input_never_raises() -> None:
    rng = random.Random(5)
    keys = [
        "setupComplete",
        "serverContent",
        "toolCall",
        "toolCallCancellation",
        "usageMetadata",
        "goAway",
        "sessionResumptionUpdate",
        "voiceActivity",
    ]
    values: list[Any] = [
        None,
        1,
        "x",
        [],
        {},
        [1],
        {"parts": 1},
        {"functionCalls": [1]},
        {"ids": 5},
        {"modelTurn": {"parts": [{"inlineData": 3}]}},
        {"inputTranscription": "x"},
    ]
    c = core()
    for _ in range(2000):
        message = {rng.choice(keys): rng.choice(values) for _ in range(rng.randint(1, 3))}
        for event in c.receive_text(json.dumps(message)):
            assert event.token == 7


# -- adapter construction -----------------------------------------------------------------------------------


def test_url_resolution() -> None:
    assert resolve_url(None) == (
        "wss://generativelanguage.googleapis.com/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
    )
    assert resolve_url("wss://127.0.0.1:9443", "v1") == (
        "wss://127.0.0.1:9443/ws/google.ai.generativelanguage.v1.GenerativeService.BidiGenerateContent"
    )
    assert resolve_url("wss://h/").endswith("v1beta.GenerativeService.BidiGenerateContent")
    assert resolve_url("wss://h/custom/path?x=1") == "wss://h/custom/path?x=1"


def test_adapter_declares_itself_and_needs_limits() -> None:
    with pytest.raises(ValueError, match="explicit AudioLimits"):
        GeminiLiveAdapter("k", SessionSettings(), limits=None)
    adapter = GeminiLiveAdapter(
        "k", SessionSettings(model="from-settings"), limits=GEMINI_LIVE.for_format(PCM16_24K)
    )
    assert adapter.name == "gemini-live" and adapter.output_format == PCM16_24K
    assert adapter.capabilities.server_vad and not adapter.capabilities.speech_end_events
    assert (
        not adapter.capabilities.truncate
        and adapter.capabilities.resumption
        and not adapter.capabilities.timed_captions
    )
    assert GeminiLiveAdapter.audio_limits(PCM16_24K) == GEMINI_LIVE.for_format(PCM16_24K)
    assert adapter.core.config.model == "from-settings"
    explicit = GeminiLiveAdapter(
        "k", SessionSettings(model="m1", resume_handle="h"), limits=adapter.limits, model="m2"
    )
    assert explicit.core.config.model == "m2" and explicit.core.config.resume_handle == "h"
    assert GeminiLiveAdapter("k", SessionSettings(), limits=adapter.limits).core.config.model == DEFAULT_MODEL
    assert adapter.shell.url.startswith("wss://generativelanguage.googleapis.com/ws/")


# -- commit_input (RO2), the resume handle from SessionSettings --------------------------------------------


def test_ro2_commit_input_is_audio_stream_end_after_audio_only() -> None:
    c = core()
    c.frames_to_send()
    c.commit_input()
    assert c.frames_to_send() == []  # no audio since the last end: nothing to flush
    c.stream_audio(b"\x01\x02" * 4)
    c.commit_input()
    c.commit_input()
    assert [json.loads(f) for f in c.frames_to_send()] == [{"realtimeInput": {"audioStreamEnd": True}}]
    c.stream_audio(b"\x01\x02")  # audio reopens the stream
    c.commit_input()
    assert [json.loads(f) for f in c.frames_to_send()] == [{"realtimeInput": {"audioStreamEnd": True}}]


def test_the_resume_handle_comes_from_session_settings_and_goes_in_setup() -> None:
    settings = SessionSettings(resume_handle="h-9", history=(("user", "hi"),))
    config = GeminiConfig.from_settings(settings)
    assert config.resume_handle == "h-9"
    assert setup_frame(config)["setup"]["sessionResumption"] == {"handle": "h-9"}
    assert setup_frame(GeminiConfig.from_settings(SessionSettings()))["setup"]["sessionResumption"] == {}
    adapter = GeminiLiveAdapter("k", settings, limits=GEMINI_LIVE.for_format(PCM16_24K))
    assert adapter.core.config.resume_handle == "h-9" and adapter.core.resumption_handle == "h-9"


def test_client_turn_detection_is_refused_for_gemini() -> None:
    with pytest.raises(ValueError, match="turn_detection"):
        GeminiLiveAdapter(
            "k", SessionSettings(turn_detection="client"), limits=GEMINI_LIVE.for_format(PCM16_24K)
        )
    assert not GeminiLiveAdapter.capabilities.client_commits
