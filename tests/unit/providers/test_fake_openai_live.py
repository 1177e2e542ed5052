"""The GPT-Live fake: protocol core on virtual time, strict SDK schema checks, and one loopback shell test."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
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
from providers.fakes.faults import Fault, parse_fault
from providers.fakes.openai_live import CloseRequest, LiveFakeConnection, SequentialIds, serve
from providers.fakes.openai_live import LiveFakeOptions as _LiveFakeOptions
from providers.fakes.script import ECHO, Script, ToolCallScript, Turn
from rtp.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from rtp.units import NS_PER_MS as MS
from rtp.units import NS_PER_S as S


def LiveFakeOptions(**options: Any) -> _LiveFakeOptions:
    """These tests time replies from t0 exactly: no initial lead unless a test asks for one."""
    options.setdefault("lead_ms", 0)
    return _LiveFakeOptions(**options)


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
    "session.delegation.created": {"type", "event_id", "delegation", "offset_ms"},
    "session.commentary.appended": {"type", "event_id", "start_ms", "end_ms"},
    "session.thinking.appended": {"type", "event_id", "start_ms", "end_ms"},
}
ERROR_KEYS = {"type", "code", "message", "param", "client_event_id"}


def check(event: dict[str, Any]) -> dict[str, Any]:
    """Validate one server event against the SDK model for its type, and its exact key set."""
    SERVER_MODELS[event["type"]].model_validate(event)
    assert set(event) - {"client_event_id"} == KEYS[event["type"]], event
    if event["type"] == "error":
        assert set(event["error"]) == ERROR_KEYS
    if event["type"] == "session.delegation.created":
        assert set(event["delegation"]) == {"id", "type", "target"}
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
    """Drives one core on a virtual clock; every frame it emits is schema-checked and kept with its time.

    Frames that are not JSON (only the garbage_json fault sends them) go to `raw` instead.
    """

    def __init__(self, options: LiveFakeOptions | None = None, faults: tuple[Fault, ...] = ()) -> None:
        self.core = LiveFakeConnection(
            options or LiveFakeOptions(), now=0, unix_time=UNIX, ids=SequentialIds(7), faults=faults
        )
        self.now = 0
        self.log: list[tuple[int, dict[str, Any]]] = []
        self.raw: list[tuple[int, str]] = []

    def _pull(self) -> list[dict[str, Any]]:
        got = []
        for text in self.core.frames_to_send():
            try:
                event = json.loads(text)
            except ValueError:
                self.raw.append((self.now, text))
                continue
            got.append(check(event))
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
    [started] = h.send(
        {
            "type": "session.start",
            "event_id": "evt_client_1",
            "session": {
                "model": "gpt-live-1",
                "instructions": "Be brief.",
                "audio": {"format": PCMU, "output": {"voice": "cedar"}},
                "delegation": {"type": "client"},
            },
        }
    )
    assert started["type"] == "session.started" and started["client_event_id"] == "evt_client_1"
    session = started["session"]
    assert set(session) == {
        "id",
        "expires_at",
        "model",
        "status",
        "audio",
        "instructions",
        "delegation",
        "store",
    }
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
        (
            {"model": "gpt-live-1", "audio": {"format": {**PCMU, "channels": 1}}},
            "unknown_parameter",
            "session.audio.format.channels",
        ),
        (
            {"model": "gpt-live-1", "audio": {"output": {"voice": "marin", "speed": 1}}},
            "unknown_parameter",
            "session.audio.output.speed",
        ),
        ({"model": "gpt-live-1", "audio": {"input": {}}}, "unknown_parameter", "session.audio.input"),
        ({"instructions": "hi"}, "missing_required_parameter", "session.model"),
        ({"model": 5}, "invalid_type", "session.model"),
        (
            {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 8000}}},
            "invalid_value",
            "session.audio.format.rate",
        ),
        (
            {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu", "rate": 16000}}},
            "invalid_value",
            "session.audio.format.rate",
        ),
        (
            {"model": "gpt-live-1", "audio": {"format": {"type": "audio/wav", "rate": 8000}}},
            "invalid_value",
            "session.audio.format.type",
        ),
        (
            {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu"}}},
            "missing_required_parameter",
            "session.audio.format.rate",
        ),
        (
            {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu", "rate": "8000"}}},
            "invalid_type",
            "session.audio.format.rate",
        ),
        (
            {"model": "gpt-live-1", "delegation": {"type": "robots"}},
            "invalid_value",
            "session.delegation.type",
        ),
        (
            {"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {}}},
            "unsupported_by_fake",
            "session.delegation.type",
        ),
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
    assert (
        error_of(h.send({"type": "session.start", "session": {"model": "m"}, "model": "m"}))["param"]
        == "model"
    )
    err = error_of(h.send({"type": "session.start"}))
    assert (err["code"], err["param"]) == ("missing_required_parameter", "session")


@pytest.mark.parametrize(
    "event",
    [
        {"type": "session.input_audio.append", "audio": ""},
        {"type": "session.close"},
        {"type": "session.update", "session": {}},
        {"type": "session.commentary.append", "content": "x", "delegation_id": None},
        {"type": "session.thinking.append", "content": "x", "delegation_id": None},
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
        (
            '{"type": "session.commentary.append", "content": "hi"}',
            "missing_required_parameter",
            "delegation_id",
        ),
        ('{"type": "session.instructions.append", "content": "hi"}', "unsupported_by_fake", "type"),
        ('{"type": "session.input_audio.append", "audio": "%%%not-base64"}', "invalid_value", "audio"),
        ('{"type": "session.input_audio.append", "audio": "AAA"}', "invalid_value", "audio"),
        ('{"type": "session.input_audio.append"}', "missing_required_parameter", "audio"),
        ('{"type": "session.input_audio.append", "audio": 5}', "invalid_type", "audio"),
        ('{"type": "session.input_audio.append", "audio": "", "rate": 1}', "unknown_parameter", "rate"),
        ('{"type": "session.close", "reason": "bye"}', "unknown_parameter", "reason"),
    ],
)
def test_bad_client_frames_become_errors_without_raising(
    data: str | bytes, code: str, param: str | None
) -> None:
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
    assert kinds[:3] == [
        "session.input_transcript.delta",
        "session.output_transcript.delta",
        "session.output_audio.delta",
    ]


def _compact_append(audio: bytes) -> str:
    """An append as the bridge's adapter writes it (providers/openai_live.py): the core's fast path."""
    return '{"type":"session.input_audio.append","audio":"' + base64.b64encode(audio).decode() + '"}'


@pytest.mark.parametrize(
    "text",
    [
        _compact_append(b"\x7f" * 160),
        _compact_append(b""),
        '{"type":"session.input_audio.append","audio":"AAA"}',  # not base64: an error either way
        '{"type":"session.input_audio.append","audio":"AA\\u0041A"}',  # an escape: json.loads reads it
        '{"type":"session.input_audio.append","audio":"AA\tA"}',  # a raw control character: not JSON
        '{"type":"session.input_audio.append","audio":"}',  # head and tail overlap: not JSON
        '{"type":"session.input_audio.append","audio":"AAAA"} ',
        '{"type":"session.input_audio.append","audio":"AA"AA"}',
    ],
)
def test_an_append_is_read_as_json_loads_reads_it(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter's compact append is taken without parsing; whatever the text, the record and the answer
    are those of the json.loads path."""
    import providers.fakes.openai_live as live

    def run() -> tuple[Any, ...]:
        h = Harness()
        h.start(audio={"format": PCMU})
        answer = h.send(text)
        record = h.core.record.client_frames[-1]
        return answer, record.frame, record.raw, record.audio_bytes, h.core.echo and h.core.echo.position_ms

    fast = run()
    monkeypatch.setattr(live, "exact_member", lambda text, head, tail: None)
    assert fast == run()


def test_compact_appends_echo_as_spaced_ones_do_and_deltas_are_json_dumps_own() -> None:
    audio = utterance_pcmu()
    logs = []
    for compact in (False, True):
        h = Harness()
        h.start(audio={"format": PCMU})
        texts: list[str] = []
        for i in range(0, len(audio), 160):
            chunk = audio[i : i + 160]
            data = (
                _compact_append(chunk)
                if compact
                else json.dumps(
                    {"type": "session.input_audio.append", "audio": base64.b64encode(chunk).decode()}
                )
            )
            h.core.receive_message(data, h.now)
            texts += h.core.frames_to_send()
            until = h.now + 20 * MS
            while (d := h.core.next_deadline()) is not None and d <= until:
                h.now = max(h.now, d)
                h.core.handle_timer(h.now)
                texts += h.core.frames_to_send()
            h.now = until
        while (d := h.core.next_deadline()) is not None and d <= 10 * S:
            h.core.handle_timer(d)
            texts += h.core.frames_to_send()
        logs.append(texts)
        deltas = [t for t in texts if '"session.output_audio.delta"' in t]
        assert len(deltas) == 23
        assert all(t == json.dumps(json.loads(t), separators=(",", ":")) for t in deltas)
    assert logs[0] == logs[1]


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
        (
            {"type": "audio/pcm", "rate": 24000},
            bytes,
            24000,
            2,
            957,
        ),  # odd sizes: split samples across appends
    ],
)
def test_other_formats_echo_the_client_bytes(
    fmt: dict, encode: Any, rate: int, width: int, frame_bytes: int
) -> None:
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
    assert _LiveFakeOptions().lead_ms == 200  # the default: a little ahead of real time
    assert LiveFakeOptions(hangover_ms=250, chunk_ms=20).echo_options() == EchoOptions(
        hangover_ms=250, chunk_ms=20
    )


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
            await ws.send(
                json.dumps(
                    {"type": "session.start", "session": {"model": "gpt-live-1", "audio": {"format": PCMU}}}
                )
            )
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
    appends = [
        line["frame"]["audio"] for line in lines if line["frame"]["type"] == "session.input_audio.append"
    ]
    assert all(a["bytes"] == 160 for a in appends)
    assert b"".join(base64.b64decode(a["base64"]) for a in appends) == audio
    assert "sk-test" not in record_path.read_text()


async def test_a_record_file_without_records_in_memory_gets_every_frame(tmp_path: Path) -> None:
    """`fake-provider --record`: frames are not kept in memory (record_client_frames off), yet each one, the
    last frame included, reaches the record file."""
    record_path = tmp_path / "live.jsonl"
    options = LiveFakeOptions(record_client_frames=False)
    async with await serve(options=options, record_path=str(record_path)) as server:
        async with connect(server.url, additional_headers={"Authorization": "Bearer sk-test"}) as ws:
            await ws.send(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
            assert json.loads(await ws.recv())["type"] == "session.started"
            await ws.send(_compact_append(b"\x00\x01" * 160))
            await ws.send("not json")
            await ws.send(json.dumps({"type": "session.close"}))
            assert json.loads(await ws.recv())["type"] == "error"
            assert json.loads(await ws.recv())["type"] == "session.closed"
        assert server.connections[0].client_frames == []
    lines = [json.loads(line) for line in record_path.read_text().splitlines()]
    assert [line.get("raw") or line["frame"]["type"] for line in lines] == [
        "session.start",
        "session.input_audio.append",
        "not json",
        "session.close",
    ]
    assert lines[1]["frame"]["audio"]["bytes"] == 320


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
        client = AsyncOpenAI(
            api_key="sk-test", base_url=base, websocket_base_url=base.replace("http", "ws", 1)
        )
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


# -- scripted turns and delegations -------------------------------------------------------------------------

T0 = 1680 * MS  # when utterance_pcmu(), streamed in 20 ms frames from 0, is detected
LOOKUP = ToolCallScript("lookup_order", {"order_id": "42"})
CONTEXT_KINDS = ("session.commentary.append", "session.thinking.append")


def scripted(*turns: Turn, then: Turn = ECHO, **options: Any) -> LiveFakeOptions:
    return LiveFakeOptions(script=Script(turns, then), **options)


def faults(*specs: str) -> tuple[Fault, ...]:
    return tuple(parse_fault(spec) for spec in specs)


def audio_out(h: Harness) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for _, e in h.of("session.output_audio.delta"))


def delta_times(h: Harness) -> list[int]:
    return [t for t, _ in h.of("session.output_audio.delta")]


@pytest.mark.parametrize("kind", CONTEXT_KINDS)
def test_delegation_round_trip(kind: str) -> None:
    turn = Turn(reply="tone", duration_ms=400, tool_call=LOOKUP, transcript="Your order ships today.")
    h = Harness(scripted(turn))
    h.start(audio={"format": PCMU})
    h.stream(utterance_pcmu())
    h.advance(5 * S)
    assert [e["type"] for _, e in h.log] == [
        "session.started",
        "session.input_transcript.delta",
        "session.delegation.created",
    ]
    [(t, created)] = h.of("session.delegation.created")
    delegation = created["delegation"]
    assert t == T0 and created["offset_ms"] == 1700
    assert delegation["id"].startswith("del_")
    assert (delegation["type"], delegation["target"]) == ("delegation", "client")
    record = h.core.delegations[delegation["id"]]
    assert (record.tool_call, record.utterance, record.answered_at) == (LOOKUP, 1, None)
    wire = json.dumps([e for _, e in h.log])
    assert "lookup_order" not in wire and "order_id" not in wire  # GPT-Live delegations carry no task text
    assert h.core.next_deadline() == 15 * S  # only usage: the reply waits for the answer

    answer = {
        "type": kind,
        "event_id": "a1",
        "content": "Order 42 ships today.",
        "delegation_id": delegation["id"],
    }
    got = h.send(answer)
    assert [e["type"] for e in got] == [
        kind.replace("append", "appended"),
        "session.output_transcript.delta",
        "session.output_audio.delta",
    ]
    ack, transcript, _ = got
    assert (ack["start_ms"], ack["end_ms"], ack["client_event_id"]) == (1700, 1700, "a1")
    assert transcript["delta"] == "Your order ships today."
    assert (transcript["start_ms"], transcript["end_ms"]) == (1700, 2100)
    h.advance(10 * S)
    assert delta_times(h) == [5 * S + n * 40 * MS for n in range(10)]
    assert len(audio_out(h)) == 3200
    assert (record.answered_at, record.answers) == (5 * S, [kind])


def test_duplicate_tool_call_delivers_each_delegation_twice_and_one_answer_suffices() -> None:
    h = Harness(
        scripted(Turn(reply="tone", duration_ms=200, tool_call=LOOKUP)), faults("duplicate_tool_call")
    )
    h.start(audio={"format": PCMU})
    h.stream(utterance_pcmu())
    h.advance(3 * S)
    [(t1, first), (t2, second)] = h.of("session.delegation.created")
    assert t1 == t2 == T0
    assert first["delegation"] == second["delegation"] and first["offset_ms"] == second["offset_ms"]
    assert first["event_id"] != second["event_id"]
    [delegation_id] = h.core.delegations
    answer = {"type": "session.commentary.append", "content": "Shipped.", "delegation_id": delegation_id}
    assert [e["type"] for e in h.send(answer)][:2] == [
        "session.commentary.appended",
        "session.output_transcript.delta",
    ]
    assert [e["type"] for e in h.send(answer)] == [
        "session.commentary.appended"
    ]  # acknowledged, no second reply
    h.advance(10 * S)
    assert len(h.of("session.output_transcript.delta")) == 1 and len(audio_out(h)) == 1600
    assert h.core.delegations[delegation_id].answers == ["session.commentary.append"] * 2
    assert h.core.record.faults == ["duplicate_tool_call"]


def test_commentary_for_an_unknown_delegation_is_an_error() -> None:
    h = Harness(scripted(Turn(tool_call=LOOKUP)))
    h.start(audio={"format": PCMU})
    h.stream(utterance_pcmu())
    event = {
        "type": "session.commentary.append",
        "event_id": "c9",
        "content": "x",
        "delegation_id": "del_nope",
    }
    err = error_of(h.send(event))
    assert (err["code"], err["param"], err["client_event_id"]) == (
        "unknown_delegation",
        "delegation_id",
        "c9",
    )
    h.advance(5 * S)
    assert h.of("session.output_audio.delta") == []  # the real delegation is still open


@pytest.mark.parametrize("kind", CONTEXT_KINDS)
def test_session_wide_context_is_acknowledged(kind: str) -> None:
    h = Harness()
    h.start(audio={"format": PCMU})
    h.stream(ulaw_encode(pcm16(quiet(300))))
    [ack] = h.send({"type": kind, "content": "The caller is a VIP.", "delegation_id": None})
    assert ack["type"] == kind.replace("append", "appended")
    assert (ack["start_ms"], ack["end_ms"]) == (300, 300) and "client_event_id" not in ack


@pytest.mark.parametrize("kind", CONTEXT_KINDS)
@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"delegation_id": None}, "missing_required_parameter", "content"),
        ({"content": "x"}, "missing_required_parameter", "delegation_id"),
        ({"content": 5, "delegation_id": None}, "invalid_type", "content"),
        ({"content": "x", "delegation_id": 7}, "invalid_type", "delegation_id"),
        ({"content": "x", "delegation_id": None, "role": "system"}, "unknown_parameter", "role"),
    ],
)
def test_context_appends_are_validated_strictly(
    kind: str, fields: dict[str, Any], code: str, param: str
) -> None:
    h = Harness()
    h.start()
    err = error_of(h.send({"type": kind, **fields}))
    assert (err["code"], err["param"]) == (code, param)


@pytest.mark.parametrize(
    ("fmt", "encode", "decode", "rate", "width"),
    [
        (PCMU, ulaw_encode, ulaw_decode, 8000, 1),
        ({"type": "audio/pcma", "rate": 8000}, alaw_encode, alaw_decode, 8000, 1),
        ({"type": "audio/pcm", "rate": 24000}, bytes, bytes, 24000, 2),
    ],
)
def test_tone_turn_length_frequency_and_pacing(
    fmt: dict, encode: Any, decode: Any, rate: int, width: int
) -> None:
    h = Harness(scripted(Turn(reply="tone", duration_ms=1000, frequency_hz=500)))
    h.start(audio={"format": fmt})
    frame = rate * width // 50
    h.stream(encode(pcm16(quiet(500, rate), tone(800, rate), quiet(400, rate, seed=1))), frame_bytes=frame)
    h.advance(10 * S)
    [(t0, transcript)] = h.of("session.output_transcript.delta")
    assert t0 == T0
    assert (transcript["delta"], transcript["start_ms"], transcript["end_ms"]) == (
        "[tone 1, 1.0 s]",
        1700,
        2700,
    )
    chunks = [base64.b64decode(e["delta"]) for _, e in h.of("session.output_audio.delta")]
    assert delta_times(h) == [t0 + n * 40 * MS for n in range(25)]
    assert {len(c) for c in chunks} == {rate * width * 40 // 1000}
    x = np.frombuffer(decode(b"".join(chunks)), dtype="<i2") / 32768
    assert len(x) == rate  # one second
    expected = 0.3 * np.sin(2 * np.pi * 500 * np.arange(rate) / rate)
    assert np.max(np.abs(x - expected)) < 0.01  # the right sine, continuous across chunk boundaries


def test_silence_turn_is_digital_silence_without_a_transcript() -> None:
    h = Harness(scripted(Turn(reply="silence", duration_ms=200)))
    h.start(audio={"format": PCMU})
    h.stream(utterance_pcmu())
    h.advance(5 * S)
    assert h.of("session.output_transcript.delta") == []
    assert delta_times(h) == [T0 + n * 40 * MS for n in range(5)]
    assert audio_out(h) == ulaw_encode(bytes(2 * 1600))


def test_replies_are_spoken_in_order_behind_an_open_delegation() -> None:
    audio = ulaw_encode(pcm16(quiet(500), tone(800), quiet(600, seed=1), tone(600), quiet(600, seed=2)))
    h = Harness(scripted(Turn(reply="tone", duration_ms=300, tool_call=LOOKUP)))  # then: echo
    h.start(audio={"format": PCMU})
    h.stream(audio)
    h.advance(4 * S)
    assert len(h.of("session.input_transcript.delta")) == 2 and h.of("session.output_audio.delta") == []
    assert h.core.queued == 2
    [delegation_id] = h.core.delegations
    h.send({"type": "session.thinking.append", "content": "found it", "delegation_id": delegation_id})
    h.advance(10 * S)
    outputs = [
        (t, e["delta"], e["start_ms"], e["end_ms"]) for t, e in h.of("session.output_transcript.delta")
    ]
    assert outputs == [(4 * S, "[tone 1, 0.3 s]", 3100, 3400), (4300 * MS, "[echo 2, 0.7 s]", 3400, 4120)]
    assert audio_out(h)[2400:] == audio[(1900 - 60) * 8 : (2500 + 60) * 8]


def test_utterances_beyond_max_queued_are_transcribed_but_not_answered() -> None:
    audio = ulaw_encode(pcm16(quiet(500), tone(800), quiet(600, seed=1), tone(600), quiet(600, seed=2)))
    h = Harness(scripted(then=Turn(tool_call=LOOKUP), max_queued=1))
    h.start(audio={"format": PCMU})
    h.stream(audio)
    assert len(h.of("session.input_transcript.delta")) == 2
    assert len(h.of("session.delegation.created")) == 1 and h.core.dropped == 1


# -- faults on virtual time ---------------------------------------------------------------------------------


@pytest.mark.parametrize("factor", [4, 3, 0.5])
def test_burst_sends_chunk_n_at_t0_plus_n_chunks_over_the_factor(factor: float) -> None:
    h = Harness(faults=faults(f"burst:{factor:g}"))
    h.start(audio={"format": PCMU})
    h.stream(utterance_pcmu())
    h.advance(10 * S)
    assert delta_times(h) == [T0 + math.ceil(n * 40 * MS / factor) for n in range(23)]
    assert audio_out(h) == utterance_pcmu()[440 * 8 : 1360 * 8]
    assert h.core.record.faults == [f"burst:{factor:g}"]


def test_burst_injected_mid_reply_speeds_up_only_what_follows() -> None:
    h = Harness()
    h.start(audio={"format": PCMU})
    h.stream(utterance_pcmu())
    h.advance(T0 + 100 * MS)
    h.core.inject(parse_fault("burst:4"), h.now)
    assert h.core.record.faults == []  # recorded when it fires, not when injected
    h.advance(10 * S)
    times = delta_times(h)
    assert times[:3] == [T0, T0 + 40 * MS, T0 + 80 * MS]
    assert times[3:] == [T0 + 100 * MS + (n * 40 - 100) * MS // 4 for n in range(3, 23)]
    assert audio_out(h) == utterance_pcmu()[440 * 8 : 1360 * 8]
    assert h.core.record.faults == ["burst:4"]


def test_stall_sends_nothing_then_dumps_everything_that_became_due() -> None:
    h = Harness(faults=faults("stall:200@1730"))
    h.start(audio={"format": PCMU})
    h.stream(utterance_pcmu())
    h.advance(10 * S)
    end = 1930 * MS
    assert delta_times(h) == [T0, T0 + 40 * MS] + [end] * 5 + [T0 + n * 40 * MS for n in range(7, 23)]
    assert not any(1730 * MS <= t < end for t, _ in h.log)
    assert audio_out(h) == utterance_pcmu()[440 * 8 : 1360 * 8]


def test_a_graceful_close_ends_a_stall_first() -> None:
    h = Harness(LiveFakeOptions(usage_interval_ms=100), faults("stall:5000@250"))
    h.start()
    h.advance(700 * MS)
    assert [t for t, _ in h.of("session.usage.updated")] == [100 * MS, 200 * MS]
    got = h.send({"type": "session.close"})
    assert [e["type"] for e in got] == ["session.usage.updated"] * 5 + ["session.closed"]
    assert h.core.close_to_send() == CloseRequest(1000)


def test_half_open_sends_nothing_more_but_keeps_recording() -> None:
    h = Harness(faults=faults("half_open@1000"))
    h.start(audio={"format": PCMU})
    h.stream(utterance_pcmu())
    h.advance(20 * S)
    assert [e["type"] for _, e in h.log] == ["session.started"] and h.raw == []
    assert h.core.half_open and h.core.next_deadline() is None
    frames = len(h.core.record.client_frames)
    assert h.send({"type": "session.close"}) == [] and h.send("junk") == []
    assert h.core.close_to_send() is None and not h.core.closed
    assert len(h.core.record.client_frames) == frames + 2
    h.core.inject(parse_fault("close"), h.now)  # fires, but a wedged connection sends nothing
    h.core.inject(parse_fault("abrupt_close@100"), h.now)  # sends nothing either: it still acts
    h.advance(h.now + S)
    assert len(h.log) == 1 and h.raw == []
    assert h.core.close_to_send() == CloseRequest(1006, abrupt=True)
    assert h.core.record.faults == ["half_open@1000", "close", "abrupt_close@100"]


def test_close_fault_is_gpt_lives_real_end() -> None:
    h = Harness(faults=faults("close@3000"))
    started = h.start(audio={"format": PCMU})
    h.advance(10 * S)
    [(t, closed)] = h.of("session.closed")
    assert t == 3 * S and closed["reason"] == "expired" and closed["usage"] == {"seconds": 3.0}
    assert closed["session"] == started["session"] and "client_event_id" not in closed
    assert h.core.close_to_send() == CloseRequest(1000)
    assert h.core.closed and h.core.next_deadline() is None
    assert (h.core.record.faults, h.core.record.close_code) == (["close@3000"], 1000)


def test_abrupt_close_sends_no_close_frame_and_loses_held_frames() -> None:
    h = Harness(LiveFakeOptions(usage_interval_ms=500), faults("stall:1000@2200", "abrupt_close@2500"))
    h.start()
    h.advance(5 * S)
    assert [t for t, _ in h.of("session.usage.updated")] == [500 * MS, 1000 * MS, 1500 * MS, 2000 * MS]
    assert h.core.close_to_send() == CloseRequest(1006, abrupt=True)
    assert h.of("session.closed") == [] and h.core.closed and h.core.next_deadline() is None
    assert h.core.record.faults == ["stall:1000@2200", "abrupt_close@2500"]


def test_garbage_json_is_one_frame_that_is_not_json() -> None:
    h = Harness(LiveFakeOptions(usage_interval_ms=1000), faults("garbage_json@1500"))
    h.start()
    h.advance(3 * S)
    [(t, text)] = h.raw
    assert t == 1500 * MS
    with pytest.raises(ValueError):
        json.loads(text)
    assert [t for t, _ in h.of("session.usage.updated")] == [1 * S, 2 * S, 3 * S]  # the session goes on
    assert not h.core.closed


def test_invalid_audio_is_one_delta_whose_payload_is_not_base64() -> None:
    h = Harness(faults=faults("invalid_audio@500"))
    h.start(audio={"format": PCMU})
    h.advance(S)
    [(t, delta)] = h.of("session.output_audio.delta")  # schema-valid (checked by the harness)
    assert t == 500 * MS
    for validate in (True, False):
        with pytest.raises(ValueError):
            base64.b64decode(delta["delta"], validate=validate)


def test_slow_handshake_sends_session_started_late() -> None:
    h = Harness(faults=faults("slow_handshake:800"))
    h.now = S
    start = {
        "type": "session.start",
        "event_id": "s1",
        "session": {"model": "gpt-live-1", "audio": {"format": PCMU}},
    }
    assert h.send(start) == []
    assert not h.core.started and h.core.next_deadline() == 1800 * MS
    h.now = 1500 * MS
    assert (
        error_of(h.send({"type": "session.input_audio.append", "audio": ""}))["code"] == "session_not_started"
    )
    assert error_of(h.send(start))["code"] == "session_already_started"
    h.advance(1799 * MS)
    assert h.of("session.started") == []
    h.advance(2 * S)
    [(t, started)] = h.of("session.started")
    assert t == 1800 * MS and started["client_event_id"] == "s1"
    assert started["session"]["expires_at"] == UNIX + 1 + 3600
    assert h.core.next_deadline() == 1800 * MS + 15 * S  # usage counts from the real start
    assert h.core.record.faults == ["slow_handshake:800"]


@pytest.mark.parametrize("late_ms", [0, 30])
def test_a_message_at_or_after_a_deadline_sees_what_was_due_first(late_ms: int) -> None:
    """The shell's timer may not have run yet when a message comes at (or after) a deadline: the core runs it
    first, so the append finds the session started (and a fault injected for then has fired)."""
    h = Harness(faults=faults("slow_handshake:800"))
    start = {"type": "session.start", "session": {"model": "gpt-live-1", "audio": {"format": PCMU}}}
    assert h.send(start) == []
    h.now = 800 * MS
    h.core.inject(parse_fault("invalid_audio@0"), h.now + late_ms * MS)
    h.now += late_ms * MS
    got = h.send({"type": "session.input_audio.append", "audio": base64.b64encode(bytes(160)).decode()})
    assert [e["type"] for e in got] == ["session.started", "session.output_audio.delta"]
    assert h.raw == [] and h.core.record.faults == ["slow_handshake:800", "invalid_audio"]
    assert not h.core.echo or h.core.echo.position_ms == 20


def test_slow_handshake_injected_before_the_start_delays_it() -> None:
    h = Harness()
    h.core.inject(parse_fault("slow_handshake:500"), 0)
    assert h.core.next_deadline() == 0
    h.advance(0)
    h.now = 100 * MS
    assert h.send({"type": "session.start", "session": {"model": "gpt-live-1"}}) == []
    h.advance(S)
    assert [t for t, _ in h.of("session.started")] == [600 * MS]


def test_runtime_faults_count_from_injection() -> None:
    h = Harness()
    h.now = 2 * S
    h.core.inject(parse_fault("garbage_json@300"), h.now)
    h.core.inject(parse_fault("refuse"), h.now)  # the shell's business: ignored by the core
    assert h.core.next_deadline() == 2300 * MS and h.core.record.faults == []
    h.advance(2299 * MS)
    assert h.raw == []
    h.advance(3 * S)
    assert [t for t, _ in h.raw] == [2300 * MS] and h.core.record.faults == ["garbage_json@300"]
    assert h.core.next_deadline() is None


def test_option_faults_count_from_session_start_and_only_for_their_connection() -> None:
    h = Harness(faults=faults("close@1000", "2/abrupt_close"))
    assert h.core.next_deadline() is None
    h.now = 5 * S
    h.start()
    assert h.core.next_deadline() == 6 * S
    h.advance(10 * S)
    assert [t for t, _ in h.of("session.closed")] == [6 * S]
    assert h.core.close_to_send() == CloseRequest(1000) and h.core.record.faults == ["close@1000"]


async def test_shell_passes_script_and_faults_to_each_connection() -> None:
    turn = Turn(reply="tone", duration_ms=200, tool_call=LOOKUP)
    audio = ulaw_encode(pcm16(quiet(200), tone(300), quiet(400, seed=3)))
    async with await serve(
        script=Script((turn,)), faults=faults("duplicate_tool_call", "garbage_json")
    ) as server:
        async with connect(server.url, additional_headers={"Authorization": "Bearer sk-test"}) as ws:
            await ws.send(
                json.dumps(
                    {"type": "session.start", "session": {"model": "gpt-live-1", "audio": {"format": PCMU}}}
                )
            )
            async with asyncio.timeout(5):
                assert check(json.loads(await ws.recv()))["type"] == "session.started"
                garbage = await ws.recv()
                with pytest.raises(ValueError):
                    json.loads(garbage)
                await ws.send(
                    json.dumps(
                        {"type": "session.input_audio.append", "audio": base64.b64encode(audio).decode()}
                    )
                )
                delegations = []
                while len(delegations) < 2:
                    event = check(json.loads(await ws.recv()))
                    if event["type"] == "session.delegation.created":
                        delegations.append(event["delegation"]["id"])
                assert delegations[0] == delegations[1]
                await ws.send(
                    json.dumps(
                        {
                            "type": "session.commentary.append",
                            "content": "ok",
                            "delegation_id": delegations[0],
                        }
                    )
                )
                played = b""
                while len(played) < 1600:
                    event = check(json.loads(await ws.recv()))
                    if event["type"] == "session.output_audio.delta":
                        played += base64.b64decode(event["delta"])
                assert played == ulaw_encode(pcm16(0.3 * np.sin(2 * np.pi * 440 * np.arange(1600) / 8000)))
        assert server.connections[0].faults == ["duplicate_tool_call", "garbage_json"]


async def test_notes_file_tells_each_connection_s_session_what_it_heard_its_tool_calls_and_its_faults(
    tmp_path: Path,
) -> None:
    """`fake-provider --notes`: one JSON line per fact of a connection (server.py), joined by a harness with
    the bridge's log by session id and with what the application received by the heard text."""
    notes_path = tmp_path / "notes.jsonl"
    audio = ulaw_encode(pcm16(quiet(500), tone(800), quiet(600, seed=1)))
    script = Script(then=Turn(tool_call=ToolCallScript("lookup_order", {"order_id": "42"})))
    server = await serve(options=LiveFakeOptions(lead_ms=200), script=script)
    server.keep_notes(str(notes_path))
    async with server:
        async with connect(server.url, additional_headers={"Authorization": "Bearer sk-test"}) as ws:
            await ws.send(
                json.dumps(
                    {"type": "session.start", "session": {"model": "gpt-live-1", "audio": {"format": PCMU}}}
                )
            )
            started = check(json.loads(await asyncio.wait_for(ws.recv(), 2)))
            for i in range(0, len(audio), 160):
                chunk = base64.b64encode(audio[i : i + 160]).decode()
                await ws.send(json.dumps({"type": "session.input_audio.append", "audio": chunk}))
            seen: dict[str, dict[str, Any]] = {}
            async with asyncio.timeout(5):
                while "session.delegation.created" not in seen:
                    event = check(json.loads(await ws.recv()))
                    seen.setdefault(event["type"], event)
            server.inject(parse_fault("mutate:1"))  # the next frame (session.closed) goes out corrupted
            await ws.send(json.dumps({"type": "session.close"}))
            async with asyncio.timeout(2):
                with pytest.raises(websockets.ConnectionClosedOK):
                    while True:
                        await ws.recv()
    notes = [json.loads(line) for line in notes_path.read_text().splitlines()]
    assert [n["kind"] for n in notes] == [
        "open",
        "session",
        "heard",
        "tool_call",
        "fault",
        "mutated",
        "closed",
    ]
    session = started["session"]["id"]
    assert all(n["conn"] == 0 for n in notes) and [n["session"] for n in notes] == [None] + [session] * 6
    heard, call = notes[2], notes[3]
    assert heard["text"] == seen["session.input_transcript.delta"]["delta"] and heard["n"] == 1
    assert call["call_id"] == seen["session.delegation.created"]["delegation"]["id"]
    assert (call["for"], call["input"], call["name"]) == (heard["item"], "audio", "lookup_order")
    assert notes[4]["spec"] == "mutate:1" and notes[5]["of"] == "session.closed" and notes[6]["code"] == 1000
    times = [n["unix"] for n in notes]
    assert times == sorted(times) and abs(time.time() - times[-1]) < 5
    assert "sk-test" not in notes_path.read_text()
