"""GPT-Live client core: wire frames in, vocabulary events out; peer input never raises."""

import base64
import json

import pytest

from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputTranscript,
    ProviderError,
    SessionClosed,
    SessionStarted,
    ToolCallRequested,
    UsageUpdated,
)
from providers.openai_live import (
    LiveClientProtocol,
    LiveConfig,
    OpenAILiveAdapter,
    resolve_url,
    session_start_frame,
)
from rtp.audio import PCM16_24K, PCMU_8K


def core(**kw: object) -> LiveClientProtocol:
    return LiveClientProtocol(LiveConfig(**kw), token=7)  # type: ignore[arg-type]


def test_session_start_asks_for_pcmu_8k_passthrough_and_client_delegation() -> None:
    c = core(instructions="Be brief.")
    [text] = c.frames_to_send()
    frame = json.loads(text)
    assert frame == {
        "type": "session.start",
        "session": {
            "model": "gpt-live-1",
            "instructions": "Be brief.",
            "audio": {"format": {"type": "audio/pcmu", "rate": 8000}, "output": {"voice": "marin"}},
            "delegation": {"type": "client"},
        },
    }
    assert "instructions" not in session_start_frame(LiveConfig())["session"]
    assert c.frames_to_send() == []  # pulled once


def test_audio_append_is_base64_of_the_exact_bytes() -> None:
    frame = json.loads(core().append_audio(b"\x00\xff\x7f"))
    assert frame == {
        "type": "session.input_audio.append",
        "audio": base64.b64encode(b"\x00\xff\x7f").decode(),
    }


def test_server_events_map_to_the_vocabulary() -> None:
    c = core()
    delta = base64.b64encode(bytes(range(160))).decode()
    frames = [
        {
            "type": "session.started",
            "event_id": "e1",
            "session": {"id": "sess_1", "expires_at": 99, "model": "gpt-live-1", "status": "active"},
        },
        {"type": "session.output_audio.delta", "delta": delta},
        {
            "type": "session.input_transcript.delta",
            "event_id": "e2",
            "delta": "hi",
            "start_ms": 10,
            "end_ms": 900,
        },
        {
            "type": "session.output_transcript.delta",
            "event_id": "e3",
            "delta": "hello",
            "start_ms": 1000,
            "end_ms": 1000,
        },
        {"type": "session.usage.updated", "event_id": "e4", "usage": {"seconds": 15}},
        {"type": "info", "event_id": "e5", "info": {}},
        {
            "type": "session.closed",
            "event_id": "e6",
            "reason": "expired",
            "session": {},
            "usage": {"seconds": 42},
        },
    ]
    events = [e for f in frames for e in c.receive_text(json.dumps(f))]
    assert events == [
        SessionStarted(7, "sess_1", 99),
        AudioReceived(7, bytes(range(160)), PCMU_8K),
        InputTranscript(7, "hi", start_ms=10, end_ms=900),
        OutputTranscript(7, "hello", start_ms=1000, end_ms=1000),
        UsageUpdated(7, audio_seconds=15.0),
        SessionClosed(7, "expired", True, 42.0),
    ]
    assert c.started and c.closed and c.bytes_received == 160


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1,2]",
        '{"no_type": 1}',
        '{"type": "session.output_audio.delta"}',
        '{"type": "session.usage.updated", "usage": {}}',
    ],
)
def test_malformed_frames_become_non_fatal_protocol_errors_with_the_raw_frame(text: str) -> None:
    [event] = core().receive_text(text)
    assert isinstance(event, ProviderError) and not event.fatal
    assert event.code == "invalid_event" and event.raw == text


def test_invalid_base64_audio_is_fatal() -> None:
    [event] = core().receive_text(
        json.dumps({"type": "session.output_audio.delta", "delta": "@@not base64@@"})
    )
    assert isinstance(event, ProviderError) and event.fatal and event.code == "invalid_audio"


def test_odd_length_pcm16_audio_is_fatal() -> None:
    c = core(audio_format=PCM16_24K)
    [event] = c.receive_text(
        json.dumps({"type": "session.output_audio.delta", "delta": base64.b64encode(b"abc").decode()})
    )
    assert isinstance(event, ProviderError) and event.fatal and "odd length" in event.message


def test_provider_error_events_are_reported_not_fatal() -> None:
    err = {
        "type": "error",
        "event_id": "e",
        "error": {
            "type": "invalid_request_error",
            "code": "unknown_parameter",
            "message": "Unknown parameter: 'session.x'.",
        },
    }
    [event] = core().receive_text(json.dumps(err))
    assert isinstance(event, ProviderError) and event.code == "unknown_parameter" and not event.fatal


def test_url_resolution() -> None:
    assert resolve_url(None) == "wss://api.openai.com/v1/live/sessions"
    assert resolve_url("ws://127.0.0.1:9000") == "ws://127.0.0.1:9000/v1/live/sessions"
    assert resolve_url("ws://127.0.0.1:9000/custom/path") == "ws://127.0.0.1:9000/custom/path"


def test_dl5_gpt_live_delegations_are_answered_as_commentary_with_the_delegation_id() -> None:
    c = core()
    c.frames_to_send()
    created = {
        "type": "session.delegation.created",
        "event_id": "e",
        "offset_ms": 4200,
        "delegation": {"id": "del_1", "type": "delegation", "target": "client"},
    }
    [event] = c.receive_text(json.dumps(created))
    assert event == ToolCallRequested(7, "del_1", "client", kind="delegation", at_ms=4200)
    c.append_commentary("Your order shipped.", "del_1")
    c.append_thinking("Order 42 is in transit.", None)
    assert [json.loads(f) for f in c.frames_to_send()] == [
        {"type": "session.commentary.append", "content": "Your order shipped.", "delegation_id": "del_1"},
        {"type": "session.thinking.append", "content": "Order 42 is in transit.", "delegation_id": None},
    ]
    assert [json.loads(f) for f in c.close_frames()] == [{"type": "session.close"}]


def test_an_adapter_without_limits_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="needs explicit AudioLimits"):
        OpenAILiveAdapter("sk-test", LiveConfig(), limits=None)
    limits = OpenAILiveAdapter.audio_limits(PCMU_8K)
    assert (limits.capacity_bytes, limits.residence_ms) == (16_000, 3_000)  # 2 s of PCMU, 3 s residence
    assert OpenAILiveAdapter.audio_limits(PCM16_24K).capacity_bytes == 96_000


def test_config_from_application_settings_keeps_defaults_for_what_is_not_given() -> None:
    from providers.base import SessionSettings

    assert LiveConfig.from_settings(SessionSettings(instructions="Hi")) == LiveConfig(instructions="Hi")
    assert LiveConfig.from_settings(SessionSettings(voice="cedar", model="gpt-live-1.1")).voice == "cedar"


def test_history_goes_into_session_start_as_input_messages() -> None:
    config = LiveConfig(history=(("system", "Order 42 is late."), ("user", "Where is my order?")))
    assert session_start_frame(config)["session"]["input"] == [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Order 42 is late."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Where is my order?"}],
        },
    ]
