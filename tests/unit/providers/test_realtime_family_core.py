"""The Realtime-family client core in both dialects, on canned frames (shared/reference/providers.md §1.5, §3.5):
wire frames in, vocabulary events out; commands out as frames; peer input never raises."""

import base64
import gc
import json
import weakref
from typing import Any

import pytest

from providers import openai_realtime, xai
from providers.base import SessionSettings, ToolSpec
from providers.events import (
    AudioReceived,
    InputTranscript,
    InputTranscriptFailed,
    OutputInterrupted,
    OutputTranscript,
    ProviderError,
    ProviderEvent,
    ResponseDone,
    SessionExpiring,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    UsageUpdated,
)
from providers.openai_realtime import OpenAIRealtimeAdapter
from providers.realtime_family import Dialect, RealtimeClientProtocol, resolve_url
from providers.xai import XAIAdapter
from rtp.audio import PCM16_16K, PCMA_8K, PCMU_8K

OPENAI, XAI = openai_realtime.DIALECT, xai.DIALECT
TOOL = ToolSpec(
    "lookup_order", "Find an order.", {"type": "object", "properties": {"order_id": {"type": "string"}}}
)


def core(dialect: Dialect = OPENAI, **settings: Any) -> RealtimeClientProtocol:
    return RealtimeClientProtocol(dialect, SessionSettings(**settings), token=7)


def feed(c: RealtimeClientProtocol, *frames: dict[str, Any] | str) -> list[ProviderEvent]:
    return [e for f in frames for e in c.receive_text(f if isinstance(f, str) else json.dumps(f))]


def sent(c: RealtimeClientProtocol) -> list[dict[str, Any]]:
    return [json.loads(f) for f in c.frames_to_send()]


def started(dialect: Dialect = OPENAI, **settings: Any) -> RealtimeClientProtocol:
    """A core whose handshake is done and whose handshake frames are already pulled."""
    c = core(dialect, **settings)
    feed(c, SESSION_CREATED, SESSION_UPDATED)
    c.frames_to_send()
    return c


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


SESSION_CREATED = {
    "type": "session.created",
    "event_id": "event_1",
    "session": {
        "type": "realtime",
        "object": "realtime.session",
        "id": "sess_1",
        "model": "gpt-realtime-2",
        "expires_at": 1767229200,
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 24000}},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"},
        },
    },
}
SESSION_UPDATED = {
    "type": "session.updated",
    "event_id": "event_2",
    "session": {
        "type": "realtime",
        "object": "realtime.session",
        "id": "sess_1",
        "model": "gpt-realtime-2",
        "expires_at": 1767229200,
    },
}
CONVERSATION_CREATED = {
    "type": "conversation.created",
    "event_id": "event_3",
    "conversation": {"id": "conv_1", "object": "realtime.conversation"},
}


# -- handshake ------------------------------------------------------------------------------------------------


def test_openai_handshake_configures_after_session_created_in_the_ga_shape() -> None:
    c = core(OPENAI, instructions="You are a phone agent.", voice="cedar", tools=(TOOL,))
    assert c.frames_to_send() == []  # the server speaks first
    assert feed(c, SESSION_CREATED) == []
    assert sent(c) == [
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "instructions": "You are a phone agent.",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcmu"},
                        "transcription": {"model": "gpt-live-transcribe"},
                        "turn_detection": {
                            "type": "server_vad",
                            "create_response": True,
                            "interrupt_response": True,
                        },
                    },
                    "output": {"format": {"type": "audio/pcmu"}, "voice": "cedar"},
                },
                "tools": [
                    {
                        "type": "function",
                        "name": "lookup_order",
                        "description": "Find an order.",
                        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
                    }
                ],
            },
        }
    ]
    assert feed(c, CONVERSATION_CREATED) == [] and sent(c) == []  # configured once
    assert c.configuring and not c.started
    assert feed(c, SESSION_UPDATED) == [SessionStarted(7, "sess_1", 1767229200)]
    assert c.started and not c.configuring
    assert feed(c, SESSION_UPDATED) == []  # a later update's echo is not a second start


def test_xai_handshake_has_no_session_type_and_puts_voice_and_vad_at_the_top_level() -> None:
    c = core(XAI, instructions="Be brief.")
    feed(
        c,
        {
            "type": "session.created",
            "event_id": "e",
            "session": {"model": "grok-voice-think-fast-1.0", "voice": "eve"},
        },
    )
    assert sent(c) == [
        {
            "type": "session.update",
            "session": {
                "instructions": "Be brief.",
                "voice": "eve",
                "turn_detection": {"type": "server_vad", "create_response": True, "interrupt_response": True},
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcmu", "rate": 8000},
                        "transcription": {"model": "grok-transcribe"},
                    },
                    "output": {"format": {"type": "audio/pcmu", "rate": 8000}},
                },
            },
        }
    ]
    feed(c, CONVERSATION_CREATED)
    assert sent(c) == []
    # xAI's session object has no id: the conversation names the session instead.
    assert feed(c, {"type": "session.updated", "event_id": "e", "session": {"voice": "eve"}}) == [
        SessionStarted(7, "conv_1", None)
    ]


def test_xai_configures_on_conversation_created_when_it_comes_first() -> None:
    c = core(XAI)
    feed(c, CONVERSATION_CREATED)
    assert [f["type"] for f in sent(c)] == ["session.update"]
    feed(c, {"type": "session.created", "event_id": "e", "session": {"id": "sess_x"}})
    assert sent(c) == []
    assert feed(c, {"type": "session.updated", "session": {}}) == [SessionStarted(7, "sess_x", None)]


def test_openai_does_not_configure_on_conversation_created_alone() -> None:
    c = core(OPENAI)
    feed(c, CONVERSATION_CREATED)
    assert sent(c) == []


@pytest.mark.parametrize("dialect", [OPENAI, XAI], ids=["openai", "xai"])
def test_history_is_seeded_after_session_updated(dialect: Dialect) -> None:
    c = core(
        dialect,
        history=(
            ("user", "My order is 42."),
            ("assistant", "Let me check."),
            ("system", "Caller is verified."),
        ),
    )
    feed(c, SESSION_CREATED)
    assert [f["type"] for f in sent(c)] == ["session.update"]
    feed(c, SESSION_UPDATED)
    assert sent(c) == [
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "My order is 42."}],
            },
        },
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me check."}],
            },
        },
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "system",
                "content": [{"type": "input_text", "text": "Caller is verified."}],
            },
        },
    ]


def test_an_error_before_session_updated_is_fatal() -> None:
    c = core()
    feed(c, SESSION_CREATED)
    err = {
        "type": "error",
        "event_id": "e",
        "error": {
            "type": "invalid_request_error",
            "code": "unknown_parameter",
            "message": "Unknown parameter: 'session.voice'.",
            "param": "session.voice",
            "event_id": None,
        },
    }
    [event] = feed(c, err)
    assert isinstance(event, ProviderError) and event.fatal and event.code == "unknown_parameter"
    assert event.message == "Unknown parameter: 'session.voice'." and event.raw == json.dumps(err)


def test_settings_the_protocol_cannot_express_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match="history role"):
        core(history=(("tool", "x"),))
    with pytest.raises(ValueError, match="8 kHz G.711"):
        RealtimeClientProtocol(OPENAI, SessionSettings(), audio_format=PCM16_16K)  # PCM16 only at 24 kHz


# -- server events ----------------------------------------------------------------------------------------------


def test_openai_voice_turn_maps_to_the_vocabulary() -> None:
    c = started(OPENAI)
    audio = bytes(range(256)) * 2
    frames = [
        {
            "type": "input_audio_buffer.speech_started",
            "event_id": "e4",
            "audio_start_ms": 1000,
            "item_id": "item_u1",
        },
        {
            "type": "input_audio_buffer.speech_stopped",
            "event_id": "e5",
            "audio_end_ms": 2400,
            "item_id": "item_u1",
        },
        {
            "type": "input_audio_buffer.committed",
            "event_id": "e6",
            "item_id": "item_u1",
            "previous_item_id": None,
        },
        {
            "type": "conversation.item.added",
            "event_id": "e",
            "previous_item_id": None,
            "item": {"id": "item_u1", "type": "message", "role": "user", "content": []},
        },
        {
            "type": "conversation.item.input_audio_transcription.delta",
            "event_id": "e",
            "item_id": "item_u1",
            "content_index": 0,
            "delta": "Hel",
        },
        {
            "type": "conversation.item.input_audio_transcription.delta",
            "event_id": "e",
            "item_id": "item_u1",
            "content_index": 0,
            "delta": "lo there",
        },
        {
            "type": "conversation.item.input_audio_transcription.completed",
            "event_id": "e",
            "item_id": "item_u1",
            "content_index": 0,
            "transcript": "Hello there",
            "usage": {"type": "duration", "seconds": 1.4},
        },
        {
            "type": "response.created",
            "event_id": "e",
            "response": {
                "id": "resp_1",
                "object": "realtime.response",
                "status": "in_progress",
                "output": [],
                "usage": None,
            },
        },
        {
            "type": "rate_limits.updated",
            "event_id": "e",
            "rate_limits": [{"name": "requests", "limit": 1000, "remaining": 999, "reset_seconds": 0.06}],
        },
        {
            "type": "response.output_item.added",
            "event_id": "e",
            "response_id": "resp_1",
            "output_index": 0,
            "item": {
                "id": "item_a1",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            },
        },
        {
            "type": "response.content_part.added",
            "event_id": "e",
            "response_id": "resp_1",
            "item_id": "item_a1",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "audio", "transcript": ""},
        },
        {
            "type": "response.output_audio.delta",
            "event_id": "e",
            "response_id": "resp_1",
            "item_id": "item_a1",
            "output_index": 0,
            "content_index": 0,
            "delta": b64(audio),
        },
        {
            "type": "response.output_audio_transcript.delta",
            "event_id": "e",
            "response_id": "resp_1",
            "item_id": "item_a1",
            "output_index": 0,
            "content_index": 0,
            "delta": "Sure, ",
        },
        {
            "type": "response.output_audio.done",
            "event_id": "e",
            "response_id": "resp_1",
            "item_id": "item_a1",
            "output_index": 0,
            "content_index": 0,
        },
        {
            "type": "response.output_audio_transcript.done",
            "event_id": "e",
            "response_id": "resp_1",
            "item_id": "item_a1",
            "output_index": 0,
            "content_index": 0,
            "transcript": "Sure, one moment.",
        },
        {
            "type": "response.done",
            "event_id": "e",
            "response": {
                "id": "resp_1",
                "object": "realtime.response",
                "status": "completed",
                "status_details": None,
                "output": [{"id": "item_a1", "type": "message"}],
                "usage": {
                    "total_tokens": 520,
                    "input_tokens": 400,
                    "output_tokens": 120,
                    "input_token_details": {"text_tokens": 300, "audio_tokens": 100},
                },
            },
        },
    ]
    assert feed(c, *frames) == [
        SpeechStarted(7, 1000, "item_u1"),
        SpeechStopped(7, 2400, "item_u1"),
        InputTranscript(7, "Hel", "item_u1"),
        InputTranscript(7, "lo there", "item_u1"),
        InputTranscript(7, "Hello there", "item_u1", final=True),
        AudioReceived(7, audio, PCMU_8K, "item_a1"),
        OutputTranscript(7, "Sure, ", "item_a1"),
        OutputTranscript(7, "Sure, one moment.", "item_a1", final=True),
        ResponseDone(7, "resp_1", "completed"),
        UsageUpdated(7, input_tokens=400, output_tokens=120, cumulative=False),
    ]
    assert c.bytes_received == 512 and not c.response_active


def test_xai_snapshots_text_events_ping_and_running_audio_usage() -> None:
    c = started(XAI)
    frames = [
        {"type": "ping", "timestamp": 1767229200123},
        {
            "event_id": "e",
            "type": "input_audio_buffer.speech_started",
            "item_id": "msg_003",
        },  # no audio_start_ms on xAI
        {
            "event_id": "e",
            "type": "conversation.item.input_audio_transcription.updated",
            "item_id": "msg_003",
            "transcript": "Hello how",
        },
        {
            "event_id": "e",
            "type": "conversation.item.input_audio_transcription.updated",
            "item_id": "msg_003",
            "transcript": "Hello, how are",
        },
        {
            "event_id": "e",
            "type": "conversation.item.input_audio_transcription.completed",
            "item_id": "msg_003",
            "transcript": "Hello, how are you?",
        },
        {
            "event_id": "e",
            "type": "response.created",
            "response": {
                "id": "resp_001",
                "object": "realtime.response",
                "status": "in_progress",
                "output": [],
            },
        },
        {
            "event_id": "e",
            "type": "response.output_audio_transcript.delta",
            "response_id": "resp_001",
            "item_id": "msg_008",
            "delta": "Fine, ",
        },
        {
            "event_id": "e",
            "type": "response.output_audio_transcript.delta",
            "response_id": "resp_001",
            "item_id": "msg_008",
            "delta": "thanks.",
        },
        {
            "event_id": "e",
            "type": "response.output_audio_transcript.done",
            "response_id": "resp_001",
            "item_id": "msg_008",
        },  # no transcript on xAI
        {
            "event_id": "e",
            "type": "response.text.delta",
            "response_id": "resp_001",
            "item_id": "msg_009",
            "delta": "typed",
        },
        {
            "event_id": "e",
            "type": "response.output_text.delta",
            "response_id": "resp_001",
            "item_id": "msg_009",
            "delta": "GA name, not xAI's",
        },
        {
            "event_id": "e",
            "type": "response.done",
            "response": {"id": "resp_001", "object": "realtime.response", "status": "completed", "usage": {}},
            "usage": {
                "input_tokens": 10,
                "output_tokens": 277,
                "output_audio_seconds": 5.134,
                "billable_audio_seconds": 3,
            },
        },
    ]
    assert feed(c, *frames) == [
        SpeechStarted(7, None, "msg_003"),
        InputTranscript(7, "Hello how", "msg_003", cumulative=True),
        InputTranscript(7, "Hello, how are", "msg_003", cumulative=True),
        InputTranscript(7, "Hello, how are you?", "msg_003", final=True, cumulative=True),
        OutputTranscript(7, "Fine, ", "msg_008"),
        OutputTranscript(7, "thanks.", "msg_008"),
        OutputTranscript(7, "Fine, thanks.", "msg_008", final=True),
        OutputTranscript(7, "typed", "msg_009"),
        ResponseDone(7, "resp_001", "completed"),
        UsageUpdated(7, audio_seconds=3.0, cumulative=True),
    ]


def test_xai_usage_is_also_read_inside_the_response_and_tokens_alone_are_not_audio_usage() -> None:
    c = started(XAI)
    inside = {
        "type": "response.done",
        "response": {"id": "r1", "status": "completed", "usage": {"billable_audio_seconds": 7.5}},
    }
    tokens_only = {
        "type": "response.done",
        "response": {"id": "r2", "status": "completed"},
        "usage": {"input_tokens": 3},
    }
    assert feed(c, inside, tokens_only) == [
        ResponseDone(7, "r1"),
        UsageUpdated(7, audio_seconds=7.5, cumulative=True),
        ResponseDone(7, "r2"),
    ]


def test_openai_text_output_and_a_response_without_usage() -> None:
    c = started(OPENAI)
    frames = [
        {
            "type": "response.output_text.delta",
            "event_id": "e",
            "response_id": "r",
            "item_id": "i",
            "output_index": 0,
            "content_index": 0,
            "delta": "Hi",
        },
        {
            "type": "response.output_text.done",
            "event_id": "e",
            "response_id": "r",
            "item_id": "i",
            "output_index": 0,
            "content_index": 0,
            "text": "Hi!",
        },
        {
            "type": "response.text.delta",
            "event_id": "e",
            "response_id": "r",
            "item_id": "i",
            "delta": "beta name, ignored",
        },
        {
            "type": "response.done",
            "event_id": "e",
            "response": {"id": "r", "status": "failed", "usage": None},
        },
    ]
    assert feed(c, *frames) == [
        OutputTranscript(7, "Hi", "i"),
        OutputTranscript(7, "Hi!", "i", final=True),
        ResponseDone(7, "r", "failed"),
    ]


def test_input_transcription_failure() -> None:
    c = started()
    failed = {
        "type": "conversation.item.input_audio_transcription.failed",
        "event_id": "e",
        "item_id": "item_u1",
        "content_index": 0,
        "error": {
            "type": "transcription_error",
            "code": "audio_unintelligible",
            "message": "Audio could not be transcribed.",
            "param": None,
        },
    }
    assert feed(c, failed) == [InputTranscriptFailed(7, "item_u1", "Audio could not be transcribed.")]


@pytest.mark.parametrize("dialect", [OPENAI, XAI], ids=["openai", "xai"])
def test_barge_in_cancels_the_response_and_interrupts_the_output(dialect: Dialect) -> None:
    c = started(dialect)
    frames = [
        {
            "type": "response.created",
            "event_id": "e",
            "response": {"id": "resp_2", "status": "in_progress", "output": []},
        },
        {
            "type": "response.output_audio.delta",
            "event_id": "e",
            "response_id": "resp_2",
            "item_id": "item_a2",
            "delta": b64(b"\xff" * 160),
        },
        {
            "type": "input_audio_buffer.speech_started",
            "event_id": "e",
            "audio_start_ms": 5200,
            "item_id": "item_u2",
        },
        {
            "type": "response.done",
            "event_id": "e",
            "response": {
                "id": "resp_2",
                "status": "cancelled",
                "status_details": {"type": "cancelled", "reason": "turn_detected"},
                "output": [{"id": "item_a2", "type": "message", "status": "incomplete"}],
            },
        },
    ]
    events = feed(c, *frames)
    assert events[1:3] == [SpeechStarted(7, 5200, "item_u2"), ResponseDone(7, "resp_2", "cancelled")]
    assert events[3] == OutputInterrupted(7, "item_a2")


def test_an_interrupted_response_without_output_items_names_its_last_audio_item() -> None:
    c = started()
    frames = [
        {"type": "response.created", "response": {"id": "r"}},
        {
            "type": "response.output_audio.delta",
            "response_id": "r",
            "item_id": "item_a9",
            "delta": b64(b"\x7f"),
        },
        {
            "type": "response.done",
            "response": {
                "id": "r",
                "status": "cancelled",
                "status_details": {"type": "cancelled", "reason": "turn_detected"},
            },
        },
    ]
    assert feed(c, *frames)[-1] == OutputInterrupted(7, "item_a9")


def test_a_client_cancelled_response_is_not_an_interruption() -> None:
    c = started()
    frames = [
        {"type": "response.created", "response": {"id": "r"}},
        {
            "type": "response.done",
            "response": {
                "id": "r",
                "status": "cancelled",
                "status_details": {"type": "cancelled", "reason": "client_cancelled"},
            },
        },
    ]
    assert feed(c, *frames) == [ResponseDone(7, "r", "cancelled")]


def test_function_calls_become_tool_call_requests() -> None:
    c = started()
    frames = [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {
            "type": "response.output_item.added",
            "event_id": "e",
            "response_id": "resp_1",
            "output_index": 1,
            "item": {
                "id": "item_f1",
                "type": "function_call",
                "name": "lookup_order",
                "call_id": "call_ABC",
                "arguments": "",
            },
        },
        {
            "type": "response.function_call_arguments.delta",
            "event_id": "e",
            "response_id": "resp_1",
            "item_id": "item_f1",
            "output_index": 1,
            "call_id": "call_ABC",
            "delta": '{"order_id":',
        },
        {
            "type": "response.function_call_arguments.done",
            "event_id": "e",
            "response_id": "resp_1",
            "item_id": "item_f1",
            "output_index": 1,
            "call_id": "call_ABC",
            "name": "lookup_order",
            "arguments": '{"order_id":"42"}',
        },
        # a `.done` without its name (older servers) takes it from the output item
        {
            "type": "response.output_item.added",
            "response_id": "resp_1",
            "item": {"id": "item_f2", "type": "function_call", "name": "hang_up", "call_id": "call_D"},
        },
        {
            "type": "response.function_call_arguments.done",
            "response_id": "resp_1",
            "item_id": "item_f2",
            "call_id": "call_D",
            "arguments": "{}",
        },
    ]
    assert feed(c, *frames) == [
        ToolCallRequested(7, "call_ABC", "lookup_order", '{"order_id":"42"}', item_id="item_f1"),
        ToolCallRequested(7, "call_D", "hang_up", "{}", item_id="item_f2"),
    ]
    [error] = feed(
        c, {"type": "response.function_call_arguments.done", "call_id": "call_X", "arguments": "{}"}
    )
    assert isinstance(error, ProviderError) and not error.fatal and "call_X" in error.message


def test_errors_after_the_handshake_are_not_fatal_and_session_expired_announces_the_end() -> None:
    c = started()
    cancel = {
        "type": "error",
        "event_id": "e",
        "error": {
            "type": "invalid_request_error",
            "code": "response_cancel_not_active",
            "message": "no response",
        },
    }
    [event] = feed(c, cancel)
    assert isinstance(event, ProviderError) and not event.fatal and event.code == "response_cancel_not_active"
    server = {
        "type": "error",
        "event_id": "e",
        "error": {"type": "server_error", "code": None, "message": "The server had an error"},
    }
    [event] = feed(c, server)
    assert isinstance(event, ProviderError) and event.code == "server_error" and not event.fatal
    expired = {
        "type": "error",
        "event_id": "event_9",
        "error": {
            "type": "invalid_request_error",
            "code": "session_expired",
            "message": "Your session hit the maximum duration of 60 minutes.",
            "param": None,
            "event_id": None,
        },
    }
    expiring, error = feed(c, expired)
    assert expiring == SessionExpiring(7, 0, "session_expired")
    assert isinstance(error, ProviderError) and error.code == "session_expired" and not error.fatal
    assert error.message == "Your session hit the maximum duration of 60 minutes."
    assert c.closed


@pytest.mark.parametrize("dialect", [OPENAI, XAI], ids=["openai", "xai"])
def test_invalid_audio_is_fatal(dialect: Dialect) -> None:
    c = started(dialect)
    for bad in ("@@not base64@@", "AAA", 42):
        [event] = feed(
            c, {"type": "response.output_audio.delta", "response_id": "r", "item_id": "i", "delta": bad}
        )
        assert isinstance(event, ProviderError) and event.fatal and event.code == "invalid_audio", bad
        assert event.raw is not None and "response.output_audio.delta" in event.raw
    assert c.bytes_received == 0


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1,2]",
        '{"no_type": 1}',
        '{"type": 5}',
        '{"type": "response.output_audio.delta"}',
        '{"type": "response.created", "response": {}}',
        '{"type": "conversation.item.input_audio_transcription.completed"}',
    ],
)
def test_malformed_frames_become_non_fatal_protocol_errors_with_the_raw_frame(text: str) -> None:
    [event] = started().receive_text(text)
    assert isinstance(event, ProviderError) and not event.fatal
    assert event.code == "invalid_event" and event.raw == text


def test_raw_frames_are_clipped_for_the_log() -> None:
    [event] = started().receive_text("x" * 5000)
    assert isinstance(event, ProviderError) and event.raw is not None and len(event.raw) == 2003


@pytest.mark.parametrize(
    "kind",
    [
        "mcp_list_tools.completed",
        "output_audio_buffer.started",
        "conversation.item.truncated",
        "some.future.event",
    ],
)
def test_unknown_and_unused_events_are_ignored(kind: str) -> None:
    c = started()
    assert feed(c, {"type": kind, "event_id": "e"}) == [] and sent(c) == []


# -- commands -----------------------------------------------------------------------------------------------------


def test_audio_append_is_base64_of_the_exact_bytes() -> None:
    assert json.loads(core().append_audio(b"\x00\xff\x7f")) == {
        "type": "input_audio_buffer.append",
        "audio": b64(b"\x00\xff\x7f"),
    }


def test_truncate_reports_what_the_caller_heard_on_openai_and_is_a_no_op_on_xai() -> None:
    c = started(OPENAI)
    c.truncate("item_a1", 1480)
    c.truncate("item_a1", -5)
    assert sent(c) == [
        {
            "type": "conversation.item.truncate",
            "item_id": "item_a1",
            "content_index": 0,
            "audio_end_ms": 1480,
        },
        {"type": "conversation.item.truncate", "item_id": "item_a1", "content_index": 0, "audio_end_ms": 0},
    ]
    x = started(XAI)
    x.truncate("item_a1", 1480)
    assert sent(x) == []


def test_cancel_goes_out_only_while_a_response_is_active() -> None:
    c = started()
    c.cancel_response()
    assert sent(c) == []
    feed(c, {"type": "response.created", "response": {"id": "r1"}})
    assert c.response_active
    c.cancel_response()
    assert sent(c) == [{"type": "response.cancel"}]
    feed(c, {"type": "response.done", "response": {"id": "r1", "status": "cancelled"}})
    c.cancel_response()
    assert sent(c) == [] and not c.response_active


OUTPUT_ITEM = {
    "type": "conversation.item.create",
    "item": {"type": "function_call_output", "call_id": "call_ABC", "output": '{"status":"shipped"}'},
}


def test_dl5_realtime_tool_results_are_function_call_output_plus_response_create() -> None:
    c = started()
    c.send_tool_result("call_ABC", '{"status":"shipped"}')
    assert sent(c) == [OUTPUT_ITEM, {"type": "response.create"}]
    assert c.response_active  # asked for, not yet created: a second result must wait
    c.send_tool_result("call_D", "{}")
    assert [f["type"] for f in sent(c)] == ["conversation.item.create"]
    feed(c, {"type": "response.created", "response": {"id": "r2"}})
    assert sent(c) == []
    assert feed(c, {"type": "response.done", "response": {"id": "r2", "status": "completed"}}) == [
        ResponseDone(7, "r2")
    ]
    assert sent(c) == [{"type": "response.create"}]


def test_tool_results_during_a_response_wait_for_response_done_and_share_one_response_create() -> None:
    c = started()
    feed(c, {"type": "response.created", "response": {"id": "resp_1"}})
    c.send_tool_result("call_ABC", '{"status":"shipped"}')
    c.send_tool_result("call_D", "{}")
    assert [f["item"]["call_id"] for f in sent(c)] == ["call_ABC", "call_D"]  # no response.create yet
    feed(c, {"type": "response.done", "response": {"id": "resp_1", "status": "completed"}})
    assert sent(c) == [{"type": "response.create"}]
    assert sent(c) == []


def test_overlapping_responses_all_finish_before_the_deferred_create() -> None:
    c = started(XAI)  # xAI may start a new response while the old one is active (§3.7)
    feed(
        c,
        {"type": "response.created", "response": {"id": "a"}},
        {"type": "response.created", "response": {"id": "b"}},
    )
    c.send_tool_result("call_1", "ok")
    sent(c)
    feed(c, {"type": "response.done", "response": {"id": "a", "status": "cancelled"}})
    assert sent(c) == []
    feed(c, {"type": "response.done", "response": {"id": "b", "status": "completed"}})
    assert sent(c) == [{"type": "response.create"}]


def test_a_refused_response_create_is_asked_again_after_the_active_response() -> None:
    c = started()
    c.send_text("Caller pressed 5", speak=True)
    assert [f["type"] for f in sent(c)] == ["conversation.item.create", "response.create"]
    # A VAD-started response beat ours to it.
    feed(c, {"type": "response.created", "response": {"id": "vad"}})
    busy = {
        "type": "error",
        "event_id": "e",
        "error": {
            "type": "invalid_request_error",
            "code": "conversation_already_has_active_response",
            "message": "Conversation already has an active response in progress: vad.",
        },
    }
    [event] = feed(c, busy)
    assert isinstance(event, ProviderError) and not event.fatal
    assert sent(c) == []
    feed(c, {"type": "response.done", "response": {"id": "vad", "status": "completed"}})
    assert sent(c) == [{"type": "response.create"}]


def test_send_text_adds_context_and_speaks_only_when_asked() -> None:
    c = started()
    c.send_text("The caller is a premium customer.")
    assert sent(c) == [
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "The caller is a premium customer."}],
            },
        }
    ]
    c.send_text("Say goodbye.", speak=True)
    assert [f["type"] for f in sent(c)] == ["conversation.item.create", "response.create"]


def test_pcma_is_the_other_telephone_format() -> None:
    c = RealtimeClientProtocol(OPENAI, SessionSettings(), 3, audio_format=PCMA_8K)
    feed(c, SESSION_CREATED)
    [update] = sent(c)
    assert update["session"]["audio"]["input"]["format"] == {"type": "audio/pcma"}
    feed(c, SESSION_UPDATED)
    [event] = feed(c, {"type": "response.output_audio.delta", "item_id": "i", "delta": b64(b"\xd5")})
    assert event == AudioReceived(3, b"\xd5", PCMA_8K, "i")
    assert c.close_frames() == []


# -- URLs and adapters ------------------------------------------------------------------------------------------


def test_url_resolution() -> None:
    assert (
        resolve_url(OPENAI, None, "gpt-realtime-2") == "wss://api.openai.com/v1/realtime?model=gpt-realtime-2"
    )
    assert (
        resolve_url(XAI, None, "grok-voice-think-fast-1.0")
        == "wss://api.x.ai/v1/realtime?model=grok-voice-think-fast-1.0"
    )
    assert resolve_url(OPENAI, "ws://127.0.0.1:9000", "m") == "ws://127.0.0.1:9000/v1/realtime?model=m"
    assert resolve_url(OPENAI, "ws://127.0.0.1:9000/", "m") == "ws://127.0.0.1:9000/v1/realtime?model=m"
    assert (
        resolve_url(OPENAI, "ws://127.0.0.1:9000/proxy/realtime", "m")
        == "ws://127.0.0.1:9000/proxy/realtime?model=m"
    )
    assert resolve_url(OPENAI, "ws://h/v1/realtime?model=other", "m") == "ws://h/v1/realtime?model=other"
    assert resolve_url(OPENAI, "ws://h/v1/realtime?call_id=rtc_1", "m") == "ws://h/v1/realtime?call_id=rtc_1"
    assert resolve_url(XAI, "ws://h:1?reasoning=none", "m") == "ws://h:1/v1/realtime?reasoning=none&model=m"


@pytest.mark.parametrize("cls", [OpenAIRealtimeAdapter, XAIAdapter])
def test_an_adapter_without_limits_is_a_clear_error(
    cls: type[OpenAIRealtimeAdapter] | type[XAIAdapter],
) -> None:
    with pytest.raises(ValueError, match="needs explicit AudioLimits"):
        cls("sk-test", SessionSettings(), limits=None)
    limits = cls.audio_limits(PCMU_8K)
    assert (limits.capacity_bytes, limits.residence_ms) == (160_000, 21_000)  # 20 s of PCMU, 21 s residence


def test_adapters_declare_what_their_protocol_offers() -> None:
    o = OpenAIRealtimeAdapter(
        "sk-test",
        SessionSettings(model="gpt-realtime-2.1-mini"),
        limits=OpenAIRealtimeAdapter.audio_limits(PCMU_8K),
    )
    assert o.name == "openai-realtime" and o.output_format == PCMU_8K
    assert o.url == "wss://api.openai.com/v1/realtime?model=gpt-realtime-2.1-mini"
    assert (
        o.capabilities.server_vad
        and o.capabilities.truncate
        and o.capabilities.speech_end_events
        and o.capabilities.client_commits
    )
    x = XAIAdapter(
        "xai-test",
        SessionSettings(model="ignored"),
        limits=XAIAdapter.audio_limits(PCMU_8K),
        model="grok-voice-think-fast-2.0",
        token=4,
    )
    assert x.name == "xai" and x.token == 4 and x.core.token == 4
    assert x.url == "wss://api.x.ai/v1/realtime?model=grok-voice-think-fast-2.0"
    assert (
        x.capabilities.server_vad
        and not x.capabilities.truncate
        and x.capabilities.speech_end_events
        and x.capabilities.client_commits
    )
    assert x.limits == XAIAdapter.audio_limits(PCMU_8K)


def test_a_refused_response_create_after_the_response_in_the_way_ended_is_asked_again_at_once() -> None:
    c = started()
    c.send_tool_result("call_1", "ok")
    sent(c)
    feed(
        c,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "code": "conversation_already_has_active_response",
                "message": "busy",
            },
        },
    )
    assert sent(c) == [{"type": "response.create"}]


def test_openai_usage_without_token_counts_is_no_usage() -> None:
    c = started()
    done = {
        "type": "response.done",
        "response": {"id": "r", "status": "completed", "usage": {"total_tokens": 0}},
    }
    assert feed(c, done) == [ResponseDone(7, "r")]


# -- commits and client turn detection (RO2 at the hard stop, RO5) -------------------------------------------


def _turn_detection(dialect: Dialect, update: dict[str, Any]) -> Any:
    session = update["session"]
    return (
        session["audio"]["input"]["turn_detection"]
        if dialect.nested_audio_settings
        else session["turn_detection"]
    )


@pytest.mark.parametrize("dialect", [OPENAI, XAI], ids=["openai", "xai"])
def test_ro5_client_turn_detection_switches_the_server_vad_off(dialect: Dialect) -> None:
    for mode, expected in (
        ("server", {"type": "server_vad", "create_response": True, "interrupt_response": True}),
        ("client", None),
    ):
        c = core(dialect, turn_detection=mode)
        feed(c, SESSION_CREATED, CONVERSATION_CREATED)
        [update] = sent(c)
        assert _turn_detection(dialect, update) == expected, mode


SPEECH_STARTED = {
    "type": "input_audio_buffer.speech_started",
    "event_id": "e",
    "audio_start_ms": 0,
    "item_id": "item_u",
}
SPEECH_STOPPED = {
    "type": "input_audio_buffer.speech_stopped",
    "event_id": "e",
    "audio_end_ms": 900,
    "item_id": "item_u",
}


@pytest.mark.parametrize("dialect", [OPENAI, XAI], ids=["openai", "xai"])
def test_ro2_commit_in_server_mode_commits_only_what_is_uncommitted_and_asks_for_nothing(
    dialect: Dialect,
) -> None:
    c = started(dialect)
    feed(c, SPEECH_STARTED)
    c.commit_input()
    assert sent(c) == []  # nothing appended: a commit would be refused (commit_empty)
    c.append_audio(b"\xff" * 799)  # 99.9 ms of G.711
    c.commit_input()
    assert sent(c) == []
    c.append_audio(b"\xff")
    c.commit_input()
    assert sent(c) == [
        {"type": "input_audio_buffer.commit"}
    ]  # server mode: the VAD's settings answer, not us
    c.append_audio(b"\xff" * 800)
    c.commit_input()
    assert sent(c) == []  # already committed: the utterance the VAD had open is taken


@pytest.mark.parametrize("dialect", [OPENAI, XAI], ids=["openai", "xai"])
def test_ro2_in_server_mode_nothing_is_committed_while_the_vad_hears_no_one(dialect: Dialect) -> None:
    c = started(dialect)
    c.append_audio(b"\xff" * 1600)  # 200 ms the VAD found no speech in: committing it would add an empty turn
    c.commit_input()
    feed(c, SPEECH_STARTED, SPEECH_STOPPED)  # an utterance the VAD ended (and commits) itself
    c.append_audio(b"\xff" * 800)
    c.commit_input()
    assert sent(c) == []


@pytest.mark.parametrize("dialect", [OPENAI, XAI], ids=["openai", "xai"])
def test_ro2_a_server_vad_commit_empties_the_buffer_and_our_own_acknowledgement_does_not(
    dialect: Dialect,
) -> None:
    c = started(dialect)
    feed(c, SPEECH_STARTED)
    c.append_audio(b"\xff" * 1600)
    feed(
        c,
        {
            "type": "input_audio_buffer.committed",
            "event_id": "e",
            "item_id": "item_u1",
            "previous_item_id": None,
        },
    )
    feed(c, SPEECH_STARTED)
    c.commit_input()
    assert sent(c) == []  # the server VAD took it
    c.append_audio(b"\xff" * 800)
    c.commit_input()
    feed(c, SPEECH_STARTED)
    c.append_audio(b"\xff" * 800)  # appended after our commit, before its acknowledgement
    feed(
        c,
        {
            "type": "input_audio_buffer.committed",
            "event_id": "e",
            "item_id": "item_u2",
            "previous_item_id": None,
        },
    )
    c.commit_input()
    assert sent(c) == [{"type": "input_audio_buffer.commit"}, {"type": "input_audio_buffer.commit"}]
    feed(c, SPEECH_STARTED)
    c.append_audio(b"\xff" * 800)
    feed(c, {"type": "input_audio_buffer.cleared", "event_id": "e"})
    c.commit_input()
    assert sent(c) == []


def test_ro5_openai_client_commit_asks_for_the_response_and_waits_for_an_active_one() -> None:
    c = started(OPENAI, turn_detection="client")
    c.append_audio(b"\xff" * 800)
    c.commit_input()
    assert sent(c) == [{"type": "input_audio_buffer.commit"}, {"type": "response.create"}]
    feed(c, {"type": "response.created", "event_id": "e", "response": {"id": "resp_1"}})
    c.append_audio(b"\xff" * 800)
    c.commit_input()
    assert sent(c) == [{"type": "input_audio_buffer.commit"}]  # the response waits for the active one
    events = feed(
        c, {"type": "response.done", "event_id": "e", "response": {"id": "resp_1", "status": "completed"}}
    )
    assert isinstance(events[0], ResponseDone) and sent(c) == [{"type": "response.create"}]


def test_ro5_xai_answers_a_client_commit_itself() -> None:
    c = started(XAI, turn_detection="client")
    c.append_audio(b"\xff" * 800)
    c.commit_input()
    assert sent(c) == [
        {"type": "input_audio_buffer.commit"}
    ]  # §3.4: no response.create (it would be dropped)
    assert not c.response_active


@pytest.mark.parametrize("cls", [OpenAIRealtimeAdapter, XAIAdapter])
def test_ro5_adapters_accept_client_turn_detection(
    cls: type[OpenAIRealtimeAdapter] | type[XAIAdapter],
) -> None:
    limits = cls.audio_limits(PCMU_8K)
    adapter = cls("k", SessionSettings(turn_detection="client"), limits=limits)
    assert adapter.core.settings.turn_detection == "client" and cls.capabilities.client_commits


def test_ro2_a_refused_commit_is_not_awaited_so_the_next_vad_commit_still_counts() -> None:
    c = started(OPENAI)
    feed(c, SPEECH_STARTED)
    c.append_audio(b"\xff" * 800)
    c.commit_input()
    sent(c)
    feed(
        c,
        {
            "type": "error",
            "event_id": "e",
            "error": {
                "type": "invalid_request_error",
                "code": "input_audio_buffer_commit_empty",
                "message": "m",
            },
        },
    )
    feed(c, SPEECH_STARTED)
    c.append_audio(b"\xff" * 800)
    feed(
        c,
        {
            "type": "input_audio_buffer.committed",
            "event_id": "e",
            "item_id": "item_u3",
            "previous_item_id": None,
        },
    )
    feed(c, SPEECH_STARTED)
    c.commit_input()
    assert (
        sent(c) == []
    )  # the VAD's commit took the audio: it was not mistaken for the acknowledgement of ours


@pytest.mark.parametrize("dialect", [OPENAI, XAI])
def test_a_core_is_freed_by_reference_counting(dialect: Dialect) -> None:
    """Each core kept a table of its own bound methods, so every core was a cycle and a closed
    connection's core waited for a full collection (100 of them every 2.5 minutes at 100 calls)."""
    c = started(dialect)
    feed(c, {"type": "response.created", "response": {"id": "r1"}})  # through the handler table
    gc.disable()
    try:
        gone = weakref.ref(c)
        del c
        assert gone() is None
    finally:
        gc.enable()
