"""What tests/bench/hostile.py found on the wire, each pinned here on the core that owns it, and
the fakes' `mutate` fault it injects.

Found and fixed:
1. A provider's error event with a 64 Ki-character code and message was logged whole (a 71,722-character line):
   the adapters now keep at most `providers.events.TEXT_LIMIT` characters of a provider's own words (error code
   and message, GPT-Live's close reason).
2. A packet from the caller's address with a foreign SSRC and a payload type the call cannot use (or a
   telephone-event of a malformed length) switched the stream's source before it was dropped: the receiver
   statistics and the digit receiver were reset each time (160 SSRC changes for 2 accepted foreign packets in
   4 s). Now only a packet the call can use switches the source.
3. A caller's From URI was logged whole however long (a 2,048-character piece of the marker stood in the log):
   the log line now shows at most 256 characters of From and To.
4. (full form) A BYE to a Contact naming a host (`hungry.example.net`) made uvloop's `sendto` raise ValueError,
   which `SipTransports.send` did not catch: 29 tracebacks from the SIP timer callback, whose flush then lost
   the rest of its transmits and never re-armed the timer. Now a counted send error.
5. (full form) A mutated offer's `c=IN IP4 1<27.0.0.2` was taken as the media address: the media clock's
   `sendto` looked the "name" up on every 20 ms slot. An offer whose connection address is no IP address of
   its type now has no usable stream (488, or the re-offer refused).
6. (read while building phase b) Every datagram at a call's RTP port, from anyone and however malformed, reset
   its `--rtp-timeout`: hostile traffic kept a dead call (and its provider session) alive. Now only a packet
   the stream takes does.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import time
from typing import Any

import orjson
import pytest

from bridge.server.session import CallSession
from providers import openai_realtime
from providers.base import SessionSettings
from providers.events import TEXT_LIMIT, ProviderError, ProviderEvent, SessionClosed, bounded
from providers.fakes.faults import (
    HUGE_CHARS,
    MUTATIONS,
    FaultKind,
    Mutator,
    huge_string,
    mutate_frame,
    parse_fault,
)
from providers.fakes.gemini_live import GeminiFakeConnection
from providers.fakes.openai_live import LiveFakeConnection, LiveFakeOptions
from providers.fakes.openai_realtime import DIALECT as FAKE_OPENAI
from providers.fakes.realtime_family import RealtimeFamilyConnection
from providers.gemini_live import GeminiClientProtocol, GeminiConfig
from providers.openai_live import LiveClientProtocol, LiveConfig
from providers.realtime_family import RAW_LOG_LIMIT, RealtimeClientProtocol
from rtp.packet import build
from rtp.stream import RtpStream, StreamConfig
from rtp.units import NS_PER_MS as MS
from sip.core.framing import StreamFramer
from sip.core.offer_answer import LocalMedia, answer
from sip.core.sdp import parse_sdp
from sip.leg import CallEnded
from sip.native.transport import SipTransports
from tests.support.session import FakeLeg, FakeProvider

CALLER = ("127.0.0.1", 40000)
HUGE = "x" * 65_536


# --- 1. a provider's own words are bounded ------------------------------------------------------------------


def realtime_started() -> RealtimeClientProtocol:
    c = RealtimeClientProtocol(openai_realtime.DIALECT, SessionSettings(), token=7)
    c.receive_text(json.dumps({"type": "session.created", "session": {"id": "sess_1"}}))
    c.receive_text(json.dumps({"type": "session.updated", "session": {"id": "sess_1"}}))
    c.frames_to_send()
    assert c.started
    return c


def test_a_realtime_error_event_with_a_huge_code_and_message_keeps_a_bounded_prefix_of_each() -> None:
    for c in (
        realtime_started(),
        RealtimeClientProtocol(openai_realtime.DIALECT, SessionSettings(), token=7),
    ):
        error = {"type": "error", "error": {"type": "server_error", "code": HUGE, "message": HUGE + "y"}}
        [event] = c.receive_text(json.dumps(error))
        assert isinstance(event, ProviderError)
        assert event.code == HUGE[:TEXT_LIMIT] + "..." and event.message == HUGE[:TEXT_LIMIT] + "..."
        assert event.raw is not None and len(event.raw) == RAW_LOG_LIMIT + 3  # the frame: a bounded prefix


def test_a_gpt_live_error_and_close_reason_keep_a_bounded_prefix() -> None:
    c = LiveClientProtocol(LiveConfig(), token=7)
    [error] = c.receive_text(json.dumps({"type": "error", "error": {"code": HUGE, "message": HUGE}}))
    assert isinstance(error, ProviderError) and not error.fatal
    assert len(error.code) == len(error.message) == TEXT_LIMIT + 3
    [closed] = c.receive_text(json.dumps({"type": "session.closed", "reason": HUGE, "usage": {"seconds": 3}}))
    assert isinstance(closed, SessionClosed) and closed.reason == HUGE[:TEXT_LIMIT] + "..."


def test_bounded_leaves_short_text_alone() -> None:
    assert bounded("rate_limited") == "rate_limited" and bounded(None) == "None"
    assert bounded("a" * TEXT_LIMIT) == "a" * TEXT_LIMIT


# --- 2. only a usable packet switches the stream's source ---------------------------------------------------


def stream() -> RtpStream:
    config = StreamConfig(ssrc=1, initial_seq=0, initial_timestamp=0, cname="1@t", remote=CALLER)
    return RtpStream(config, rand=lambda: 0.5)


def test_a_foreign_ssrc_of_an_unusable_payload_type_or_malformed_dtmf_does_not_switch_the_source() -> None:
    s = stream()
    for i in range(5):
        s.receive(build(0, i == 0, 100 + i, 160 * i, 0xAAAA, b"\x7f" * 160), CALLER, i * 20 * MS)
    received = s.qos().packets_in  # the receiver statistics' count (the first packet is on probation)
    assert received >= 4
    s.receive(build(96, False, 9, 9, 0xBBBB, b"\x00" * 160), CALLER, 101 * MS)  # not negotiated
    s.receive(build(101, False, 9, 9, 0xBBBB, b"\x01\x02\x03"), CALLER, 102 * MS)  # DTMF of 3 bytes
    s.receive(build(0, False, 105, 800, 0xAAAA, b"\x7f" * 160), CALLER, 103 * MS)  # the caller goes on
    counters = s.counters()
    assert counters["ssrc_changes"] == 0
    assert counters["drop_unknown_pt"] == 1 and counters["drop_bad_dtmf"] == 1
    assert s.qos().packets_in == received + 1  # the receiver statistics were never reset


def test_a_foreign_ssrc_of_the_calls_own_payload_type_still_switches_the_source() -> None:
    s = stream()  # a carrier handing the call to another media server: new SSRC, audio first
    s.receive(build(0, True, 100, 0, 0xAAAA, b"\x7f" * 160), CALLER, 0)
    s.receive(build(0, True, 7000, 99999, 0xCCCC, b"\x7f" * 160), CALLER, 20 * MS)
    s.receive(build(101, True, 7001, 99999, 0xDDDD, bytes([5, 0x8A, 0, 160])), CALLER, 40 * MS)  # valid DTMF
    assert s.counters()["ssrc_changes"] == 2


# --- 3. a caller's From/To in the log -----------------------------------------------------------------------


def test_a_caller_chosen_from_uri_is_logged_as_a_bounded_prefix(caplog: pytest.LogCaptureFixture) -> None:
    long_uri = "sip:" + "a" * 5000 + "@example.com"
    leg, provider = FakeLeg(), FakeProvider()
    leg._identity = dataclasses.replace(leg.identity, from_uri=long_uri, to_uri="sip:alice@example.com")

    async def run() -> None:
        task = asyncio.create_task(CallSession(leg, provider).run())  # type: ignore[arg-type]
        leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
        await asyncio.wait_for(task, 5)

    with caplog.at_level(logging.INFO, logger="parlora"):
        asyncio.run(run())
    started = [r.getMessage() for r in caplog.records if "a" * 200 in r.getMessage()]
    assert started, "the call-started line names the caller"
    assert all(long_uri not in m and len(m) < 1_000 for m in started)
    assert any("a" * 252 + "..." in m and "sip:alice@example.com" in m for m in started)


# --- 4. a destination that is a host name -------------------------------------------------------------------


def test_a_udp_destination_naming_a_host_is_a_counted_send_error_not_an_exception() -> None:
    uvloop = pytest.importorskip("uvloop")  # serve's loop: it raises ValueError where asyncio would resolve
    loop = uvloop.new_event_loop()

    async def run() -> dict[str, int]:
        transports = SipTransports(
            asyncio.get_running_loop(), lambda *_: None, StreamFramer, time.monotonic_ns
        )
        await transports.listen_udp("127.0.0.1", 0)
        try:
            assert transports.send(b"BYE sip:x SIP/2.0\r\n\r\n", ("hungry.example.net", 5060), "UDP") is False
            return transports.stats()
        finally:
            await transports.close()

    try:
        stats = loop.run_until_complete(run())
    finally:
        loop.close()
    assert stats["send_errors"] == 1 and stats["messages_out"] == 1


# --- 5. an offer's connection address must be an IP address -------------------------------------------------


def _offer_to(address: str, addrtype: str = "IP4") -> bytes:
    lines = ["v=0", f"o=- 1 1 IN {addrtype} {address}", "s=-", f"c=IN {addrtype} {address}", "t=0 0",
             "m=audio 30000 RTP/AVP 0", "a=rtpmap:0 PCMU/8000"]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n").encode()


@pytest.mark.parametrize(
    ("address", "addrtype"),
    [("1<27.0.0.2", "IP4"), ("pbx.example.com", "IP4"), ("::1", "IP4"), ("192.0.2.1", "IP6"), ("", "IP4")],
)
def test_an_offer_whose_connection_address_is_no_ip_address_of_its_type_has_no_usable_stream(
    address: str, addrtype: str
) -> None:
    local = LocalMedia("192.0.2.10", 40000, session_id=1)
    try:
        offer = parse_sdp(_offer_to(address, addrtype))
    except ValueError:
        return  # refused by the parser already: no media either
    assert answer(offer, local) is None  # the caller gets 488


@pytest.mark.parametrize(
    ("address", "addrtype"), [("192.0.2.1", "IP4"), ("0.0.0.0", "IP4"), ("2001:db8::1", "IP6")]
)
def test_an_offer_with_an_ip_address_of_its_type_is_answered(address: str, addrtype: str) -> None:
    result = answer(parse_sdp(_offer_to(address, addrtype)), LocalMedia("192.0.2.10", 40000, session_id=1))
    assert result is not None and result.media.remote_address == address


# --- 6. --rtp-timeout counts only packets the stream took ---------------------------------------------------


def test_rtp_timeout_is_reset_by_a_caller_packet_only_never_by_hostile_datagrams() -> None:
    from tests.support.native_shell import VirtualClock, _call_media

    clock = VirtualClock()
    media, _leg = _call_media(clock)  # the caller is 127.0.0.1:40000
    media.set_limits(0, None, 5.0)
    assert media.last_rtp == 0
    media.on_rtp(b"\x80", ("127.0.0.1", 40000), 1 * MS)  # truncated
    media.on_rtp(build(0, True, 1, 0, 7, b"\x7f" * 160), ("127.0.0.1", 40001), 2 * MS)  # another source
    media.on_rtp(build(0, True, 1, 0, 7, b"\x7f" * 160)[:12], ("127.0.0.1", 40000), 3 * MS)  # header only
    assert media.last_rtp == 0
    media.on_rtp(build(0, True, 1, 0, 7, b"\x7f" * 160), ("127.0.0.1", 40000), 4 * MS)
    assert media.last_rtp == 4 * MS


# --- the `mutate` fault -------------------------------------------------------------------------------------


def test_mutate_keeps_the_fault_syntax() -> None:
    fault = parse_fault("3/mutate:8@250")
    assert (fault.kind, fault.value, fault.connection, fault.after_ms) == (FaultKind.MUTATE, 8.0, 3, 250)
    assert str(fault) == "3/mutate:8@250" and parse_fault("mutate").value is None


AUDIO = json.dumps(
    {"type": "response.output_audio.delta", "event_id": "e1", "delta": base64.b64encode(b"\xff" * 8).decode()}
)


def _loads(text: str) -> Any:
    return orjson.loads(text)  # what the adapters parse with


def test_each_mutation_corrupts_a_real_frame_as_it_says() -> None:
    out = {kind: mutate_frame(AUDIO, n) for n, kind in enumerate(MUTATIONS)}
    for kind in ("truncated", "deep_nesting", "lone_surrogate"):
        with pytest.raises(orjson.JSONDecodeError):
            _loads(out[kind])
    assert _loads(out["unknown_type"])["type"] == "parlora.hostile.unknown_1"
    assert isinstance(_loads(out["not_an_object"]), list)
    error = _loads(out["as_error"])["error"]
    assert error["message"] == huge_string(4) and len(error["code"]) == 4096
    huge = _loads(out["huge_strings"])
    assert huge["type"] == "response.output_audio.delta" and huge["delta"] == huge_string(5)
    assert len(base64.b64decode(huge["delta"], validate=True)) == HUGE_CHARS // 4 * 3  # still base64
    wrong = _loads(out["wrong_types"])
    assert wrong["type"] == "response.output_audio.delta" and wrong["delta"] == 12345


def test_huge_strings_keep_two_corrupted_frames_ids_apart_and_their_texts_the_huge_string() -> None:
    """Two frames of two items corrupted by huge_strings (on two connections or two faults: the same n) carry
    two item ids, as their originals did; their texts stay the exact huge string a log search looks for."""
    n = MUTATIONS.index("huge_strings")
    frames = [
        {
            "type": "response.output_audio_transcript.delta",
            "event_id": f"event_{k}",
            "response_id": f"resp_{k}",
            "item_id": f"item_{k}",
            "output_index": 0,
            "content_index": 0,
            "delta": "hello ",
        }
        for k in (1, 2)
    ]
    first, second = (_loads(mutate_frame(json.dumps(f), n)) for f in frames)
    for key in ("item_id", "event_id", "response_id"):
        assert first[key] != second[key]
        assert first[key].startswith(huge_string(n)) and second[key].startswith(huge_string(n))
    assert first["delta"] == second["delta"] == huge_string(n)
    cancel = _loads(mutate_frame(json.dumps({"toolCallCancellation": {"ids": ["fc_1", "fc_2"]}}), n))
    assert cancel["toolCallCancellation"]["ids"] == [huge_string(n) + "fc_1", huge_string(n) + "fc_2"]


def test_the_mutator_corrupts_as_many_frames_as_asked_each_fault_from_the_first_mutation() -> None:
    m = Mutator()
    assert m(AUDIO) == AUDIO
    m.arm(parse_fault("mutate:2"))
    assert [m(AUDIO) for _ in range(3)] == [mutate_frame(AUDIO, 0), mutate_frame(AUDIO, 1), AUDIO]
    m.arm(parse_fault("mutate"))
    assert [m(AUDIO), m(AUDIO)] == [mutate_frame(AUDIO, 0), AUDIO]  # a new fault: the cycle starts again
    m.arm(parse_fault("mutate:2"))
    assert m(AUDIO) == mutate_frame(AUDIO, 0)
    m.arm(parse_fault("mutate:2"))  # one still pending is replaced: never past the second mutation
    assert [m(AUDIO), m(AUDIO), m(AUDIO)] == [mutate_frame(AUDIO, 0), mutate_frame(AUDIO, 1), AUDIO]


def _fake_frames(kind: str, mutate: bool) -> list[str]:
    """What one fake sends in its first 300 ms with `garbage_json@200` (and `mutate@100` first if asked)."""
    faults = ((parse_fault("mutate@100"),) if mutate else ()) + (parse_fault("garbage_json@200"),)
    core: RealtimeFamilyConnection | LiveFakeConnection | GeminiFakeConnection
    if kind == "realtime":
        core = RealtimeFamilyConnection(FAKE_OPENAI, now=0, unix_time=1_800_000_000, faults=faults)
    elif kind == "live":
        core = LiveFakeConnection(LiveFakeOptions(), now=0, unix_time=1_800_000_000, faults=faults)
        core.receive_message(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}), 0)
    else:
        core = GeminiFakeConnection(None, now=0, api_key="k", faults=faults)
        core.receive_message(json.dumps({"setup": {"model": "models/gemini-3.1-flash-live-preview"}}), 0)
    frames: list[str] = list(core.frames_to_send())
    now = 0
    while (deadline := core.next_deadline()) is not None and deadline <= 300 * MS:
        now = max(now, deadline)
        core.handle_timer(now)
        frames += core.frames_to_send()
    return frames


@pytest.mark.parametrize("kind", ["realtime", "live", "gemini"])
def test_each_fake_sends_the_next_frame_after_mutate_corrupted_and_the_rest_as_before(kind: str) -> None:
    plain, mutated = _fake_frames(kind, mutate=False), _fake_frames(kind, mutate=True)
    assert len(plain) == len(mutated) and plain, (plain, mutated)
    changed = [(a, b) for a, b in zip(plain, mutated, strict=True) if a != b]
    assert changed == [
        (changed[0][0], mutate_frame(changed[0][0], 0))
    ]  # one frame: truncated, the first kind


# --- the adapters take every mutation of real frames without raising ----------------------------------------

REALTIME_FRAMES: list[dict[str, Any]] = [
    {"type": "input_audio_buffer.speech_started", "event_id": "e2", "audio_start_ms": 100, "item_id": "i1"},
    {"type": "response.created", "event_id": "e3", "response": {"id": "r1", "status": "in_progress"}},
    json.loads(AUDIO) | {"response_id": "r1", "item_id": "i2"},
    {"type": "response.output_audio_transcript.delta", "event_id": "e4", "delta": "hi", "item_id": "i2"},
    {"type": "response.output_audio_transcript.done", "event_id": "e5", "transcript": "hi", "item_id": "i2"},
    {"type": "response.function_call_arguments.done", "call_id": "c1", "name": "f", "arguments": "{}"},
    {
        "type": "response.done",
        "event_id": "e6",
        "response": {"id": "r1", "status": "completed", "output": []},
    },
    {
        "type": "error",
        "event_id": "e7",
        "error": {"type": "invalid_request_error", "code": "x", "message": "y"},
    },
]
LIVE_FRAMES: list[dict[str, Any]] = [
    {"type": "session.started", "event_id": "e1", "session": {"id": "s", "expires_at": 9}},
    {"type": "session.output_audio.delta", "delta": base64.b64encode(b"\xff" * 8).decode()},
    {"type": "session.input_transcript.delta", "event_id": "e2", "delta": "hi", "start_ms": 1, "end_ms": 2},
    {"type": "session.output_transcript.delta", "event_id": "e3", "delta": "hi"},
    {"type": "session.usage.updated", "event_id": "e4", "usage": {"seconds": 3}},
    {"type": "error", "event_id": "e5", "error": {"code": "x", "message": "y"}},
]
GEMINI_FRAMES: list[dict[str, Any]] = [
    {"setupComplete": {"sessionId": "s"}},
    {"serverContent": {"modelTurn": {"parts": [{"inlineData": {"mimeType": "audio/pcm;rate=24000",
                                                               "data": base64.b64encode(b"\0" * 8).decode()}}]}}},
    {"serverContent": {"outputTranscription": {"text": "hi"}, "turnComplete": True}},
    {"toolCall": {"functionCalls": [{"id": "c1", "name": "f", "args": {"a": 1}}]}},
    {"goAway": {"timeLeft": "10s"}},
    {"usageMetadata": {"totalTokenCount": 3}},
]  # fmt: skip


def _survives(feed: Any, frames: list[dict[str, Any]], audio: set[int]) -> None:
    for i, frame in enumerate(frames):
        for n, kind in enumerate(MUTATIONS):
            events: list[ProviderEvent] = feed(mutate_frame(json.dumps(frame), n))  # never raises
            errors = [e for e in events if isinstance(e, ProviderError)]
            for e in errors:
                assert len(e.code) <= TEXT_LIMIT + 3 and len(e.message) <= 400, (kind, frame)
                assert e.raw is None or len(e.raw) <= RAW_LOG_LIMIT + 3, (kind, frame)
            fatal = [e for e in errors if e.fatal]
            # only wrong types in an audio payload are fatal (HR1: invalid audio); the rest is survivable
            assert bool(fatal) == (kind == "wrong_types" and i in audio), (kind, frame, fatal)


def test_the_realtime_family_adapter_survives_every_mutation_of_real_frames() -> None:
    c = realtime_started()
    _survives(c.receive_text, REALTIME_FRAMES, audio={2})


def test_the_gpt_live_adapter_survives_every_mutation_of_real_frames() -> None:
    c = LiveClientProtocol(LiveConfig(), token=7)
    c.receive_text(json.dumps(LIVE_FRAMES[0]))
    _survives(c.receive_text, LIVE_FRAMES[1:], audio={0})


def test_the_gemini_adapter_survives_every_mutation_of_real_frames() -> None:
    c = GeminiClientProtocol(GeminiConfig(), token=7)
    c.receive_text(json.dumps(GEMINI_FRAMES[0]))
    # a part whose mimeType is not an audio type is not audio (it is skipped): wrong types are not fatal here
    _survives(c.receive_text, GEMINI_FRAMES, audio=set())
