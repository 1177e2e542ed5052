"""The GPT-Live fake: protocol core on virtual time, strict SDK schema checks, and one loopback shell test."""

from __future__ import annotations

import asyncio
import base64
import json
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
import websockets
from openai.types.live import ServerEvent
from websockets.asyncio.client import connect

from providers.fakes.echo import EchoOptions
from providers.fakes.openai_live import LiveFakeConnection, LiveFakeOptions, SequentialIds, serve
from rtp.g711 import alaw_encode, ulaw_encode

MS = 1_000_000
S = 1_000_000_000
UNIX = 1_800_000_000
PCMU = {"type": "audio/pcmu", "rate": 8000}


# -- helpers ------------------------------------------------------------------------------------------------


def _server_models() -> dict[str, type[pydantic.BaseModel]]:
    union = typing.get_args(ServerEvent)[0]
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in typing.get_args(union)}


SERVER_MODELS = _server_models()
KEYS = {
    "session.started": {"type", "event_id", "session"},
    "session.closed": {"type", "event_id", "reason", "session", "usage"},
    "session.usage.updated": {"type", "event_id", "usage"},
    "session.input_transcript.delta": {"type", "event_id", "delta", "start_ms", "end_ms"},
    "session.output_transcript.delta": {"type", "event_id", "delta", "start_ms", "end_ms"},
    "session.output_audio.delta": {"type", "delta"},
    "error": {"type", "event_id", "error"},
}
ERROR_KEYS = {"type", "code", "message", "param", "client_event_id"}


def check(event: dict[str, Any]) -> dict[str, Any]:
    """Validate one server event against the SDK model for its type, and its exact key set."""
    SERVER_MODELS[event["type"]].model_validate(event)
    assert set(event) - {"client_event_id"} == KEYS[event["type"]], event
    if event["type"] == "error":
        assert set(event["error"]) == ERROR_KEYS
    return event


def tone(ms: int, rate: int = 8000, amp: float = 0.3) -> np.ndarray:
    return amp * np.sin(2 * np.pi * 1000 * np.arange(rate * ms // 1000) / rate)


def quiet(ms: int, rate: int = 8000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 0.0005, rate * ms // 1000)


def pcm16(*parts: np.ndarray) -> bytes:
    return (np.clip(np.concatenate(parts), -1, 1) * 32767).astype("<i2").tobytes()


def utterance_pcmu() -> bytes:
    """500 ms quiet, 800 ms tone, 400 ms quiet: detected in the last frame, span 440..1360 ms."""
    return ulaw_encode(pcm16(quiet(500), tone(800), quiet(400, seed=1)))


class Harness:
    """Drives one core on a virtual clock; every frame it emits is schema-checked and kept with its time."""

    def __init__(self, options: LiveFakeOptions | None = None) -> None:
        self.core = LiveFakeConnection(options, now=0, unix_time=UNIX, ids=SequentialIds(7))
        self.now = 0
        self.log: list[tuple[int, dict[str, Any]]] = []

    def _pull(self) -> list[dict[str, Any]]:
        got = [check(json.loads(f)) for f in self.core.frames_to_send()]
        self.log += [(self.now, e) for e in got]
        return got

    def send(self, event: dict[str, Any] | str | bytes) -> list[dict[str, Any]]:
        data = event if isinstance(event, (str, bytes)) else json.dumps(event)
        self.core.receive_message(data, self.now)
        return self._pull()

    def start(self, **session: Any) -> dict[str, Any]:
        [started] = self.send({"type": "session.start", "session": {"model": "gpt-live-1", **session}})
        assert started["type"] == "session.started"
        return started

    def advance(self, until: int) -> list[dict[str, Any]]:
        got = []
        while (d := self.core.next_deadline()) is not None and d <= until:
            self.now = max(self.now, d)
            self.core.handle_timer(self.now)
            got += self._pull()
        self.now = max(self.now, until)
        return got

    def stream(self, audio: bytes, frame_bytes: int = 160, frame_ms: int = 20) -> None:
        for i in range(0, len(audio), frame_bytes):
            chunk = base64.b64encode(audio[i : i + frame_bytes]).decode()
            assert self.send({"type": "session.input_audio.append", "audio": chunk}) is not None
            self.advance(self.now + frame_ms * MS)

    def of(self, kind: str) -> list[tuple[int, dict[str, Any]]]:
        return [(t, e) for t, e in self.log if e["type"] == kind]


def error_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    [event] = events
    assert event["type"] == "error"
    assert event["error"]["type"] == "invalid_request_error"
    return event["error"]


# -- session.start --------------------------------------------------------------------------------------------


def test_session_started_shape() -> None:
    h = Harness()
    h.now = 3 * S
    [started] = h.send({
        "type": "session.start",
        "event_id": "evt_client_1",
        "session": {
            "model": "gpt-live-1",
            "instructions": "Be brief.",
            "audio": {"format": PCMU, "output": {"voice": "cedar"}},
            "delegation": {"type": "client"},
        },
    })
    assert started["type"] == "session.started" and started["client_event_id"] == "evt_client_1"
    session = started["session"]
    assert set(session) == {"id", "expires_at", "model", "status", "audio", "instructions", "delegation", "store"}
    assert session["id"].startswith("sess_") and int(session["id"][5:], 16) >= 0
    assert session["expires_at"] == UNIX + 3 + 3600
    assert session["model"] == "gpt-live-1" and session["status"] == "active"
    assert session["audio"] == {"format": PCMU, "output": {"voice": "cedar"}}
    assert session["instructions"] == "Be brief."
    assert session["delegation"] == {"type": "client", "acknowledgement_delay_ms": 0}
    assert started["event_id"].startswith("event_") and started["event_id"] != session["id"]
    assert h.core.record.session_id == session["id"]


def test_session_start_defaults_to_pcm_24k_and_marin() -> None:
    session = Harness().start()["session"]
    assert session["audio"] == {"format": {"type": "audio/pcm", "rate": 24000}, "output": {"voice": "marin"}}


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        ({"model": "gpt-live-1", "voice": "marin"}, "unknown_parameter", "session.voice"),
        ({"model": "gpt-live-1", "audio": {"format": {**PCMU, "channels": 1}}}, "unknown_parameter",
         "session.audio.format.channels"),
        ({"model": "gpt-live-1", "audio": {"output": {"voice": "marin", "speed": 1}}}, "unknown_parameter",
         "session.audio.output.speed"),
        ({"model": "gpt-live-1", "audio": {"input": {}}}, "unknown_parameter", "session.audio.input"),
        ({"instructions": "hi"}, "missing_required_parameter", "session.model"),
        ({"model": 5}, "invalid_type", "session.model"),
        ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 8000}}}, "invalid_value",
         "session.audio.format.rate"),
        ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu", "rate": 16000}}}, "invalid_value",
         "session.audio.format.rate"),
        ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/wav", "rate": 8000}}}, "invalid_value",
         "session.audio.format.type"),
        ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu"}}}, "missing_required_parameter",
         "session.audio.format.rate"),
        ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu", "rate": "8000"}}}, "invalid_type",
         "session.audio.format.rate"),
        ({"model": "gpt-live-1", "delegation": {"type": "robots"}}, "invalid_value", "session.delegation.type"),
        ({"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {}}}, "unsupported_by_fake",
         "session.delegation.type"),
        ({"model": "gpt-live-1", "store": "yes"}, "invalid_type", "session.store"),
    ],
)
def test_session_start_is_validated_strictly(session: dict[str, Any], code: str, param: str) -> None:
    h = Harness()
    err = error_of(h.send({"type": "session.start", "event_id": "c1", "session": session}))
    assert (err["code"], err["param"], err["client_event_id"]) == (code, param, "c1")
    assert not h.core.started and h.core.next_deadline() is None
    h.start(audio={"format": PCMU})  # a failed start can be retried


def test_session_start_unknown_top_level_key_and_missing_session() -> None:
    h = Harness()
    assert error_of(h.send({"type": "session.start", "session": {"model": "m"}, "model": "m"}))["param"] == "model"
    err = error_of(h.send({"type": "session.start"}))
    assert (err["code"], err["param"]) == ("missing_required_parameter", "session")


@pytest.mark.parametrize(
    "event",
    [
        {"type": "session.input_audio.append", "audio": ""},
        {"type": "session.close"},
        {"type": "session.update", "session": {}},
    ],
)
def test_anything_before_session_start_is_an_error(event: dict[str, Any]) -> None:
    h = Harness()
    err = error_of(h.send({**event, "event_id": "early"}))
    assert (err["code"], err["client_event_id"]) == ("session_not_started", "early")
    assert not h.core.closed


def test_second_session_start_is_rejected() -> None:
    h = Harness()
    h.start()
    assert error_of(h.send({"type": "session.start", "session": {"model": "gpt-live-1"}}))["code"] == (
        "session_already_started"
    )


# -- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "code", "param"),
    [
        ("{not json", "invalid_json", None),
        (b"\xff\xfe", "invalid_json", None),
        ("[1, 2]", "invalid_json", None),
        ('{"audio": "AAAA"}', "missing_required_parameter", "type"),
        ('{"type": 3}', "invalid_type", "type"),
        ('{"type": "conversation.item.create"}', "invalid_event_type", "type"),
        ('{"type": "session.commentary.append", "content": "hi"}', "unsupported_by_fake", "type"),
        ('{"type": "session.input_audio.append", "audio": "%%%not-base64"}', "invalid_value", "audio"),
        ('{"type": "session.input_audio.append", "audio": "AAA"}', "invalid_value", "audio"),
        ('{"type": "session.input_audio.append"}', "missing_required_parameter", "audio"),
        ('{"type": "session.input_audio.append", "audio": 5}', "invalid_type", "audio"),
        ('{"type": "session.input_audio.append", "audio": "", "rate": 1}', "unknown_parameter", "rate"),
        ('{"type": "session.close", "reason": "bye"}', "unknown_parameter", "reason"),
    ],
)
def test_bad_client_frames_become_errors_without_raising(data: str | bytes, code: str, param: str | None) -> None:
    h = Harness()
    h.start(audio={"format": PCMU})
    err = error_of(h.send(data))
    assert (err["code"], err["param"]) == (code, param)
    assert not h.core.closed
    record = h.core.record.client_frames[-1]
    assert (record.frame is None) == (code == "invalid_json")
    if record.frame is None:
        assert record.raw is not None


def test_client_frames_are_recorded_with_now() -> None:
    h = Harness()
    h.now = 5
    h.send("garbage")
    h.now = 9
    h.start(audio={"format": PCMU})
    h.now = 11
    h.send({"type": "session.input_audio.append", "audio": base64.b64encode(b"\xff" * 160).decode()})
    frames = h.core.record.client_frames
    assert [f.now for f in frames] == [5, 9, 11]
    assert frames[0].frame is None and frames[0].raw == "garbage"
    assert frames[1].frame is not None and frames[1].frame["type"] == "session.start"
    assert frames[2].audio_bytes == 160
    assert h.core.record.server_frames == 2  # the error and session.started


def test_frame_recording_can_be_turned_off() -> None:
    h = Harness(LiveFakeOptions(record_client_frames=False))
    h.start()
    h.send("junk")
    assert h.core.record.client_frames == []
    assert h.core.last_frame is not None and h.core.last_frame.raw == "junk"


# -- echo over the protocol ---------------------------------------------------------------------------------


def test_utterance_gives_transcripts_and_a_paced_bit_exact_echo() -> None:
    h = Harness()
    h.start(audio={"format": PCMU})
    audio = utterance_pcmu()
    h.stream(audio)
    h.advance(10 * S)

    [(t_in, tin)] = h.of("session.input_transcript.delta")
    assert tin["delta"] == "[utterance 1, 0.9 s]"
    assert (tin["start_ms"], tin["end_ms"]) == (440, 1360)
    [(t_out, tout)] = h.of("session.output_transcript.delta")
    assert tout["delta"] == "[echo 1, 0.9 s]"
    assert (tout["start_ms"], tout["end_ms"]) == (1700, 1700 + 920)
    t0 = 1680 * MS
    assert t_in == t_out == t0

    deltas = h.of("session.output_audio.delta")
    assert [t for t, _ in deltas] == [t0 + n * 40 * MS for n in range(23)]
    echoed = b"".join(base64.b64decode(e["delta"]) for _, e in deltas)
    assert echoed == audio[440 * 8 : 1360 * 8]
    # Order on the wire: input transcript, output transcript, then audio.
    kinds = [e["type"] for _, e in h.log if e["type"] != "session.started"]
    assert kinds[:3] == ["session.input_transcript.delta", "session.output_transcript.delta",
                         "session.output_audio.delta"]


def test_echo_deltas_are_not_sent_early() -> None:
    h = Harness()
    h.start(audio={"format": PCMU})
    h.stream(utterance_pcmu())
    t0 = 1680 * MS
    for n in range(1, 5):
        due = t0 + n * 40 * MS
        assert h.core.next_deadline() == due
        h.core.handle_timer(due - 1)
        assert h.core.frames_to_send() == []
        h.now = due
        h.core.handle_timer(due)
        assert [e["type"] for e in h._pull()] == ["session.output_audio.delta"]


def test_lead_option_front_loads_the_echo() -> None:
    h = Harness(LiveFakeOptions(lead_ms=200))
    h.start(audio={"format": PCMU})
    h.stream(utterance_pcmu())
    t0 = 1680 * MS
    assert [t for t, _ in h.of("session.output_audio.delta")] == [t0] * 6  # n*40 - 200 <= 0 for n <= 5
    assert h.core.next_deadline() == t0 + 40 * MS


@pytest.mark.parametrize(
    ("fmt", "encode", "rate", "width", "frame_bytes"),
    [
        ({"type": "audio/pcma", "rate": 8000}, alaw_encode, 8000, 1, 160),
        ({"type": "audio/pcm", "rate": 16000}, bytes, 16000, 2, 640),
        ({"type": "audio/pcm", "rate": 24000}, bytes, 24000, 2, 957),  # odd sizes: split samples across appends
    ],
)
def test_other_formats_echo_the_client_bytes(fmt: dict, encode: Any, rate: int, width: int, frame_bytes: int) -> None:
    h = Harness()
    h.start(audio={"format": fmt})
    audio = encode(pcm16(quiet(500, rate), tone(800, rate), quiet(1000, rate, seed=2)))
    h.stream(audio, frame_bytes=frame_bytes, frame_ms=frame_bytes * 1000 // (rate * width))
    h.advance(h.now + 10 * S)
    [(_, tin)] = h.of("session.input_transcript.delta")
    assert (tin["start_ms"], tin["end_ms"]) == (440, 1360)
    bpm = rate * width // 1000
    echoed = b"".join(base64.b64decode(e["delta"]) for _, e in h.of("session.output_audio.delta"))
    assert echoed == audio[440 * bpm : 1360 * bpm]


def test_options_map_onto_echo_defaults() -> None:
    assert LiveFakeOptions().echo_options() == EchoOptions()
    assert LiveFakeOptions(hangover_ms=250, chunk_ms=20).echo_options() == EchoOptions(hangover_ms=250, chunk_ms=20)


# -- usage, close, expiry -----------------------------------------------------------------------------------


def test_usage_snapshots_are_cumulative_whole_seconds() -> None:
    h = Harness(LiveFakeOptions(usage_interval_ms=1500))
    h.now = 2 * S
    h.start(audio={"format": PCMU})
    h.advance(2 * S + 6 * S)
    usage = h.of("session.usage.updated")
    assert [t for t, _ in usage] == [2 * S + k * 1500 * MS for k in (1, 2, 3, 4)]
    assert [e["usage"]["seconds"] for _, e in usage] == [1.0, 3.0, 4.0, 6.0]
    assert all(isinstance(e["usage"]["seconds"], float) for _, e in usage)


def test_usage_default_interval_is_15_s() -> None:
    h = Harness()
    h.start()
    assert h.core.next_deadline() == 15 * S
    h.advance(31 * S)
    assert [e["usage"]["seconds"] for _, e in h.of("session.usage.updated")] == [15.0, 30.0]


def test_session_close_sends_closed_then_asks_for_close_1000() -> None:
    h = Harness()
    started = h.start(audio={"format": PCMU})
    h.advance(7 * S + 500 * MS)
    [closed] = h.send({"type": "session.close", "event_id": "bye"})
    assert closed["type"] == "session.closed" and closed["reason"] == "close_requested"
    assert closed["session"] == started["session"] and closed["client_event_id"] == "bye"
    assert closed["usage"] == {"seconds": 7.0}
    request = h.core.close_to_send()
    assert request is not None and request.code == 1000
    assert h.core.close_to_send() is None  # handed out once
    assert h.core.next_deadline() is None and h.core.closed
    assert h.send({"type": "session.input_audio.append", "audio": ""}) == []
    assert h.send("junk") == []
    assert len(h.core.record.client_frames) == 4 and h.core.record.close_code == 1000


def test_session_expires_after_session_length() -> None:
    h = Harness(LiveFakeOptions(session_length_ms=4000, usage_interval_ms=60_000))
    started = h.start()
    assert started["session"]["expires_at"] == UNIX + 4
    h.advance(10 * S)
    [(t, closed)] = h.of("session.closed")
    assert t == 4 * S and closed["reason"] == "expired" and closed["usage"] == {"seconds": 4.0}
    assert h.core.close_to_send().code == 1000


def test_connection_lost_stops_timers() -> None:
    h = Harness()
    h.start()
    h.core.connection_lost(1006)
    assert h.core.next_deadline() is None and h.core.record.close_code == 1006


# -- the websockets shell on loopback -----------------------------------------------------------------------


async def test_shell_echoes_over_loopback_and_records(tmp_path: Path) -> None:
    record_path = tmp_path / "live.jsonl"
    audio = ulaw_encode(pcm16(quiet(500), tone(800), quiet(600, seed=1)))
    expected = audio[440 * 8 : 1360 * 8]
    async with await serve(options=LiveFakeOptions(lead_ms=200), record_path=str(record_path)) as server:
        assert server.url == f"ws://127.0.0.1:{server.port}/v1/live/sessions"
        async with connect(server.url, additional_headers={"Authorization": "Bearer sk-test"}) as ws:
            await ws.send(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1",
                                                                          "audio": {"format": PCMU}}}))
            started = check(json.loads(await asyncio.wait_for(ws.recv(), 2)))
            assert started["type"] == "session.started"
            for i in range(0, len(audio), 160):
                chunk = base64.b64encode(audio[i : i + 160]).decode()
                await ws.send(json.dumps({"type": "session.input_audio.append", "audio": chunk}))

            echoed = b""
            kinds: list[str] = []
            async with asyncio.timeout(5):
                while len(echoed) < len(expected):
                    event = check(json.loads(await ws.recv()))
                    kinds.append(event["type"])
                    if event["type"] == "session.output_audio.delta":
                        echoed += base64.b64decode(event["delta"])
            assert echoed == expected
            assert kinds[:2] == ["session.input_transcript.delta", "session.output_transcript.delta"]

            await ws.send(json.dumps({"type": "session.close"}))
            async with asyncio.timeout(2):
                closed = check(json.loads(await ws.recv()))
                assert closed["type"] == "session.closed"
                with pytest.raises(websockets.ConnectionClosedOK):
                    await ws.recv()
            assert ws.close_code == 1000

        [conn] = server.connections
        assert conn.close_code == 1000
        assert len(conn.client_frames) == 2 + len(audio) // 160
        assert conn.server_frames == 2 + len(kinds)

    lines = [json.loads(line) for line in record_path.read_text().splitlines()]
    assert len(lines) == 2 + len(audio) // 160
    assert all(line["conn"] == 0 and isinstance(line["t_ns"], int) for line in lines)
    appends = [line["frame"]["audio"] for line in lines if line["frame"]["type"] == "session.input_audio.append"]
    assert all(a["bytes"] == 160 for a in appends)
    assert b"".join(base64.b64decode(a["base64"]) for a in appends) == audio
    assert "sk-test" not in record_path.read_text()


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/v1/live/sessions", {}, 401),
        ("/v1/live/sessions", {"Authorization": "Bearer "}, 401),
        ("/v1/live/sessions", {"Authorization": "Basic dXNlcjpwYXNz"}, 401),
        ("/v1/realtime", {"Authorization": "Bearer sk-test"}, 404),
        ("/v1/live/sessions/extra", {"Authorization": "Bearer sk-test"}, 404),
    ],
)
async def test_shell_rejects_bad_upgrades(path: str, headers: dict[str, str], status: int) -> None:
    async with await serve() as server:
        with pytest.raises(websockets.InvalidStatus) as info:
            async with asyncio.timeout(2):
                await connect(f"ws://127.0.0.1:{server.port}{path}", additional_headers=headers)
        assert info.value.response.status_code == status
        assert server.connections == []


async def test_openai_sdk_live_client_talks_to_the_fake() -> None:
    from openai import AsyncOpenAI
    from openai.types.live import OutputAudioDeltaEvent, SessionClosedEvent, SessionStartedEvent

    audio = ulaw_encode(pcm16(quiet(200), tone(300), quiet(400, seed=3)))
    async with await serve(options=LiveFakeOptions(lead_ms=10_000)) as server:
        base = f"http://127.0.0.1:{server.port}/v1"
        client = AsyncOpenAI(api_key="sk-test", base_url=base, websocket_base_url=base.replace("http", "ws", 1))
        async with asyncio.timeout(5), client.live.connect() as conn:
            await conn.session.start(session={"model": "gpt-live-1", "audio": {"format": PCMU}})
            assert isinstance(await conn.recv(), SessionStartedEvent)
            await conn.session.input_audio.append(audio=base64.b64encode(audio).decode())
            echoed = b""
            while len(echoed) < (300 + 120) * 8:
                event = await conn.recv()
                if isinstance(event, OutputAudioDeltaEvent):
                    echoed += base64.b64decode(event.delta)
            assert echoed == audio[140 * 8 : 560 * 8]
            await conn.session.close()
            closed = await conn.recv()
            assert isinstance(closed, SessionClosedEvent) and closed.reason == "close_requested"
        assert server.connections[0].close_code == 1000
