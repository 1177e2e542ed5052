"""A faithful fake of OpenAI's GPT-Live WebSocket (`/v1/live/sessions`) whose model is the echo in `echo.py`.

Two layers, in the aioquic shape:

* `LiveFakeConnection` is the sans-I/O protocol core for one connection. It never touches a socket or a clock.
  Drivers: `receive_message(data, now)`, `handle_timer(now)` and `connection_lost(code)`. Outputs are pulled:
  `frames_to_send()` (JSON text frames) and `close_to_send()`; `next_deadline()` gives the absolute `now`
  (monotonic int ns) at which `handle_timer` must run. Peer input never raises: it becomes an `error` event.
* `serve()` runs it in the shared fake shell (providers/fakes/server.py): HTTP checks, one loop per
  connection that feeds frames and the single timer, writes what the core pulls, and an optional JSONL record.

Wire shapes follow openai 3.57.0 `openai/types/live/` (the authoritative schema). Choices where the real service
is undocumented, all deliberate:

* Error codes: `session_not_started`, `session_already_started`, `unknown_parameter`, `missing_required_parameter`,
  `invalid_type`, `invalid_value`, `invalid_json`, `invalid_event_type`, `unsupported_by_fake`. `param` is a dotted
  path; `error.client_event_id` echoes the client's `event_id` (as does the top-level `client_event_id`).
* Known GPT-Live client events that the echo does not model (session.update, mute/unmute, instructions/thinking/
  commentary append, fixture play, decision.*, response.*, transport.dtmf.send) get `unsupported_by_fake`, so a
  client relying on them fails loudly instead of silently.
* `session.start` checks every key it knows and shape-checks `client`, `input` and `triggers` only shallowly;
  delegation other than `client` is `unsupported_by_fake`. A failed start can be retried.
* Both transcript timelines are input-audio ms since `session.started` (bytes, not clocks): an input transcript
  covers the echoed (padded) span; an output transcript starts at the input position when its echo starts (or
  where the previous echo ended) and lasts as long as the echo.
* Usage is whole seconds of session time (`now` since `session.started`) as a float, every `usage_interval_ms`.
* After `session_length_ms` the session ends with `session.closed` reason `expired` and close code 1000 (guess).
* Frames after the core asked to close are recorded but otherwise ignored.

Fault injection (later) plugs in at two funnels: every outbound event goes through `_emit`, every close through
`_close`; a `faults` field on `LiveFakeOptions` can then drop, delay or corrupt there without touching handlers.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from providers.fakes.echo import EchoAudio, EchoModel, EchoOptions, EchoStarted, UtteranceDetected
from providers.fakes.faults import Fault
from providers.fakes.server import (
    ClientFrameRecord,
    CloseRequest,
    ConnectionContext,
    ConnectionRecord,
    FakeServer,
    IdSource,
    SequentialIds,
    bearer_authorize,
)
from rtp.audio import PCM16_16K, PCM16_24K, PCMA_8K, PCMU_8K, AudioFormat
from rtp.g711 import alaw_decode, ulaw_decode

__all__ = [
    "LiveFakeOptions",
    "ClientFrameRecord",
    "ConnectionRecord",
    "CloseRequest",
    "IdSource",
    "SequentialIds",
    "LiveFakeConnection",
    "LiveFakeServer",
    "serve",
]

_NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000

# -- options and records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LiveFakeOptions:
    """Everything tunable about the fake. Echo fields mirror `EchoOptions` (see `echo_options()`)."""

    threshold_dbfs: float = -40.0
    hangover_ms: int = 400
    min_utterance_ms: int = 120
    pad_ms: int = 60
    max_utterance_ms: int = 30_000
    chunk_ms: int = 40
    lead_ms: int = 0
    max_queued: int = 32
    usage_interval_ms: int = 15_000
    session_length_ms: int = 60 * 60 * 1000
    """GPT-Live's real limit is undocumented; 60 min like Realtime. Sets `expires_at` and the `expired` close."""
    default_voice: str = "marin"
    record_client_frames: bool = True
    """Keep every client frame in `ConnectionRecord.client_frames`; turn off for long in-process calls."""

    def __post_init__(self) -> None:
        if self.usage_interval_ms <= 0 or self.session_length_ms <= 0:
            raise ValueError("usage_interval_ms and session_length_ms must be positive")

    def echo_options(self) -> EchoOptions:
        return EchoOptions(
            threshold_dbfs=self.threshold_dbfs,
            hangover_ms=self.hangover_ms,
            min_utterance_ms=self.min_utterance_ms,
            pad_ms=self.pad_ms,
            max_utterance_ms=self.max_utterance_ms,
            chunk_ms=self.chunk_ms,
            lead_ms=self.lead_ms,
            max_queued=self.max_queued,
        )


# -- validation ---------------------------------------------------------------------------------------------

_FORMATS: dict[tuple[str, int], AudioFormat] = {
    ("audio/pcmu", 8000): PCMU_8K,
    ("audio/pcma", 8000): PCMA_8K,
    ("audio/pcm", 16000): PCM16_16K,
    ("audio/pcm", 24000): PCM16_24K,
}
_FORMAT_TYPES = ("audio/pcm", "audio/pcmu", "audio/pcma")
_DEFAULT_FORMAT = {"type": "audio/pcm", "rate": 24000}
_SESSION_KEYS = frozenset(
    {"model", "audio", "client", "delegation", "input", "instructions", "safety_identifier", "store", "triggers"}
)
_UNMODELLED = frozenset(
    {
        "session.update",
        "session.input_audio.mute",
        "session.input_audio.unmute",
        "session.output_audio.fixture.play",
        "session.instructions.append",
        "session.thinking.append",
        "session.commentary.append",
        "decision.create",
        "decision.item.create",
        "decision.item.delete",
        "response.item.create",
        "response.create",
        "transport.dtmf.send",
    }
)
_JSON_TYPE_NAMES = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object", list: "an array"}


class _ClientError(Exception):
    """A bad client event; caught in `receive_message` and turned into an `error` event."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a number"
    return _JSON_TYPE_NAMES.get(type(value), "an unknown type")


def _expect(value: Any, kind: type, path: str) -> None:
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise _ClientError(
            "invalid_type",
            f"Invalid type for '{path}': expected {_JSON_TYPE_NAMES[kind]}, but got {_json_type(value)} instead.",
            path,
        )


def _object(value: Any, path: str, allowed: frozenset[str] | set[str], required: tuple[str, ...] = ()) -> dict:
    _expect(value, dict, path)
    prefix = f"{path}." if path else ""
    for key in value:
        if key not in allowed:
            raise _ClientError("unknown_parameter", f"Unknown parameter: '{prefix}{key}'.", prefix + key)
    for key in required:
        if key not in value:
            message = f"Missing required parameter: '{prefix}{key}'."
            raise _ClientError("missing_required_parameter", message, prefix + key)
    return value


def _optional_str(obj: dict, key: str, path: str) -> None:
    if obj.get(key) is not None:
        _expect(obj[key], str, f"{path}.{key}")


def _validate_audio(audio: Any) -> dict[str, Any]:
    """Resolve `session.audio` to the format and voice the session will use."""
    _object(audio, "session.audio", {"format", "output"})
    fmt = audio.get("format", _DEFAULT_FORMAT)
    _object(fmt, "session.audio.format", {"type", "rate"}, ("type", "rate"))
    _expect(fmt["type"], str, "session.audio.format.type")
    if fmt["type"] not in _FORMAT_TYPES:
        raise _ClientError(
            "invalid_value",
            f"Invalid value: '{fmt['type']}'. Supported values are: 'audio/pcm', 'audio/pcmu', and 'audio/pcma'.",
            "session.audio.format.type",
        )
    _expect(fmt["rate"], int, "session.audio.format.rate")
    if (fmt["type"], fmt["rate"]) not in _FORMATS:
        supported = "16000 or 24000" if fmt["type"] == "audio/pcm" else "8000"
        raise _ClientError(
            "invalid_value",
            f"Invalid value: {fmt['rate']}. '{fmt['type']}' supports a rate of {supported}.",
            "session.audio.format.rate",
        )
    voice: Any = None
    if "output" in audio:
        output = _object(audio["output"], "session.audio.output", {"voice"})
        voice = output.get("voice")
        if isinstance(voice, dict):
            _object(voice, "session.audio.output.voice", {"id"}, ("id",))
            _expect(voice["id"], str, "session.audio.output.voice.id")
        elif voice is not None:
            _expect(voice, str, "session.audio.output.voice")
            if not voice:
                message = "Invalid value: ''. Voice must not be empty."
                raise _ClientError("invalid_value", message, "session.audio.output.voice")
    return {"format": {"type": fmt["type"], "rate": fmt["rate"]}, "voice": voice}


def _validate_delegation(delegation: Any) -> dict[str, Any]:
    if delegation is None:
        return {"type": "client", "acknowledgement_delay_ms": 0}
    _expect(delegation, dict, "session.delegation")
    if "type" not in delegation:
        message = "Missing required parameter: 'session.delegation.type'."
        raise _ClientError("missing_required_parameter", message, "session.delegation.type")
    kind = delegation["type"]
    if kind in ("responses", "decisions"):
        message = f"The fake does not model '{kind}' delegation."
        raise _ClientError("unsupported_by_fake", message, "session.delegation.type")
    if kind != "client":
        raise _ClientError(
            "invalid_value",
            f"Invalid value: {json.dumps(kind)}. Supported values are: 'client', 'responses', and 'decisions'.",
            "session.delegation.type",
        )
    _object(delegation, "session.delegation", {"type", "acknowledgement_delay_ms"})
    delay = delegation.get("acknowledgement_delay_ms", 0)
    _expect(delay, int, "session.delegation.acknowledgement_delay_ms")
    if delay < 0:
        message = f"Invalid value: {delay}. Must be >= 0."
        raise _ClientError("invalid_value", message, "session.delegation.acknowledgement_delay_ms")
    return {"type": "client", "acknowledgement_delay_ms": delay}


@dataclass(frozen=True, slots=True)
class _SessionConfig:
    model: str
    fmt: AudioFormat
    format_json: dict[str, Any]
    voice: Any
    instructions: str | None
    delegation: dict[str, Any]
    store: bool
    safety_identifier: str | None


def _validate_session(session: Any) -> _SessionConfig:
    """SessionConfigParam, strictly: unknown keys anywhere we look are rejected, like the real service."""
    _object(session, "session", _SESSION_KEYS, ("model",))
    _expect(session["model"], str, "session.model")
    if not session["model"]:
        raise _ClientError("invalid_value", "Invalid value: ''. 'session.model' must not be empty.", "session.model")
    _optional_str(session, "instructions", "session")
    _optional_str(session, "safety_identifier", "session")
    if "store" in session:
        _expect(session["store"], bool, "session.store")
    if "client" in session:
        client = _object(session["client"], "session.client", {"data_channel"}, ("data_channel",))
        allowed = {"allowed_client_events", "allowed_server_events"}
        _object(client["data_channel"], "session.client.data_channel", allowed)
    for key in ("input", "triggers"):
        if key in session:
            _expect(session[key], list, f"session.{key}")
            for i, item in enumerate(session[key]):
                _expect(item, dict, f"session.{key}[{i}]")
    audio = _validate_audio(session.get("audio", {}))
    return _SessionConfig(
        model=session["model"],
        fmt=_FORMATS[(audio["format"]["type"], audio["format"]["rate"])],
        format_json=audio["format"],
        voice=audio["voice"],
        instructions=session.get("instructions"),
        delegation=_validate_delegation(session.get("delegation")),
        store=session.get("store", False),
        safety_identifier=session.get("safety_identifier"),
    )


# -- the sans-I/O core --------------------------------------------------------------------------------------


class LiveFakeConnection:
    """One GPT-Live WebSocket connection, server side, with the echo model behind it.

    `unix_time` is the wall clock (seconds) at `now`; it only feeds `expires_at`, so the core stays clock-free.
    """

    def __init__(
        self,
        options: LiveFakeOptions | None = None,
        *,
        now: int,
        unix_time: int,
        ids: IdSource | None = None,
        index: int = 0,
    ) -> None:
        self.options = options or LiveFakeOptions()
        self.record = ConnectionRecord(index)
        self._ids: IdSource = ids or SequentialIds()
        self._created_now = now
        self._unix_time = unix_time
        self._out: list[str] = []
        self._close: CloseRequest | None = None
        self._closing = False
        self._config: _SessionConfig | None = None
        self._resource: dict[str, Any] | None = None
        self._started_at = 0
        self._echo: EchoModel | None = None
        self._decode: Callable[[bytes], bytes] = bytes
        self._carry = b""  # odd trailing byte of PCM16 input, completed by the next append
        self._next_usage: int | None = None
        self._expires: int | None = None
        self._utterance_no = 0
        self._echo_no = 0
        self._audio_bytes: int | None = None
        self.last_frame: ClientFrameRecord | None = None
        """The client frame most recently received (also when `record_client_frames` is off)."""

    # -- drivers --------------------------------------------------------------------------------------------

    def receive_message(self, data: str | bytes, now: int) -> None:
        """Handle one client WebSocket message. Never raises for bad peer input."""
        frame: dict[str, Any] | None = None
        raw: str | None = None
        self._audio_bytes = None
        try:
            try:
                text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
                parsed = json.loads(text)
            except (UnicodeDecodeError, ValueError, RecursionError):
                raw = data if isinstance(data, str) else data.decode("utf-8", "replace")
                if not self._closing:
                    raise _ClientError("invalid_json", "The client event is not valid JSON.") from None
                return
            if not isinstance(parsed, dict):
                raw = text
                if not self._closing:
                    raise _ClientError("invalid_json", "A client event must be a JSON object.")
                return
            frame = parsed
            if not self._closing:
                self._dispatch(frame, now)
        except _ClientError as exc:
            client_event_id = frame.get("event_id") if frame is not None else None
            self._error(exc.code, exc.message, exc.param, client_event_id if isinstance(client_event_id, str) else None)
        finally:
            self.last_frame = ClientFrameRecord(now, frame, raw, self._audio_bytes)
            if self.options.record_client_frames:
                self.record.client_frames.append(self.last_frame)

    def handle_timer(self, now: int) -> None:
        """Run everything due at or before `now`: echo chunks, usage snapshots, expiry."""
        if self._closing or self._config is None:
            return
        if self._expires is not None and now >= self._expires:
            self._finish("expired", now, None)
            return
        assert self._echo is not None
        self._echo.handle_timer(now)
        self._drain_echo()
        if self._next_usage is not None and now >= self._next_usage:
            self._emit({"type": "session.usage.updated", "event_id": self._ids.new("event"), "usage": self._usage(now)})
            interval = self.options.usage_interval_ms * _NS_PER_MS
            k = (now - self._started_at) // interval + 1
            self._next_usage = self._started_at + k * interval

    def connection_lost(self, code: int | None) -> None:
        """The socket is gone (either side closed it); stop all timers."""
        self._closing = True
        self.record.close_code = code

    def inject(self, fault: Fault, now: int) -> None:
        """Apply a fault at runtime (see providers/fakes/faults.py)."""
        self.record.faults.append(str(fault))

    def recorded(self, frame: dict[str, Any]) -> dict[str, Any]:
        """The frame for the record file: an audio payload as its decoded length plus the base64."""
        if frame.get("type") == "session.input_audio.append" and isinstance(frame.get("audio"), str):
            assert self.last_frame is not None
            return {**frame, "audio": {"bytes": self.last_frame.audio_bytes, "base64": frame["audio"]}}
        return frame

    # -- outputs --------------------------------------------------------------------------------------------

    def frames_to_send(self) -> list[str]:
        out, self._out = self._out, []
        self.record.server_frames += len(out)
        return out

    def close_to_send(self) -> CloseRequest | None:
        """The close the shell must perform after sending the frames, handed out once."""
        req, self._close = self._close, None
        return req

    def next_deadline(self) -> int | None:
        if self._closing or self._config is None:
            return None
        assert self._echo is not None
        candidates = [t for t in (self._echo.next_deadline(), self._next_usage, self._expires) if t is not None]
        return min(candidates) if candidates else None

    @property
    def started(self) -> bool:
        return self._config is not None

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def audio_format(self) -> AudioFormat | None:
        return self._config.fmt if self._config else None

    @property
    def echo(self) -> EchoModel | None:
        """The echo model (after session.start), for introspection in tests."""
        return self._echo

    # -- client events --------------------------------------------------------------------------------------

    def _dispatch(self, event: dict[str, Any], now: int) -> None:
        if "type" not in event:
            raise _ClientError("missing_required_parameter", "Missing required parameter: 'type'.", "type")
        kind = event["type"]
        _expect(kind, str, "type")
        if "event_id" in event and event["event_id"] is not None:
            _expect(event["event_id"], str, "event_id")
        if kind == "session.start":
            self._on_session_start(event, now)
        elif kind == "session.input_audio.append":
            self._require_started()
            self._on_audio_append(event, now)
        elif kind == "session.close":
            self._require_started()
            _object(event, "", {"type", "event_id"})
            self._finish("close_requested", now, event.get("event_id"))
        elif kind in _UNMODELLED:
            self._require_started()
            raise _ClientError("unsupported_by_fake", f"The fake GPT-Live server does not model '{kind}'.", "type")
        else:
            raise _ClientError("invalid_event_type", f"Invalid value: '{kind}'. Unknown client event type.", "type")

    def _require_started(self) -> None:
        if self._config is None:
            raise _ClientError("session_not_started", "Send 'session.start' and wait for 'session.started' first.")

    def _on_session_start(self, event: dict[str, Any], now: int) -> None:
        if self._config is not None:
            raise _ClientError("session_already_started", "The session has already started.")
        _object(event, "", {"type", "event_id", "session"}, ("session",))
        config = _validate_session(event["session"])
        self._config = config
        self._started_at = now
        self._echo = EchoModel(config.fmt.rate, config.fmt.sample_width, self.options.echo_options())
        self._decode = {PCMU_8K: ulaw_decode, PCMA_8K: alaw_decode}.get(config.fmt, bytes)
        self._next_usage = now + self.options.usage_interval_ms * _NS_PER_MS
        self._expires = now + self.options.session_length_ms * _NS_PER_MS
        session_id = self._ids.new("sess")
        self.record.session_id = session_id
        expires_at = self._unix_time + (now - self._created_now) // _NS_PER_S + self.options.session_length_ms // 1000
        resource: dict[str, Any] = {
            "id": session_id,
            "expires_at": expires_at,
            "model": config.model,
            "status": "active",
            "audio": {"format": config.format_json, "output": {"voice": config.voice or self.options.default_voice}},
            "instructions": config.instructions,
            "delegation": config.delegation,
            "store": config.store,
        }
        if config.safety_identifier is not None:
            resource["safety_identifier"] = config.safety_identifier
        self._resource = resource
        started = {"type": "session.started", "event_id": self._ids.new("event"), "session": resource}
        self._emit(self._reply(started, event))

    def _on_audio_append(self, event: dict[str, Any], now: int) -> None:
        _object(event, "", {"type", "event_id", "audio"}, ("audio",))
        _expect(event["audio"], str, "audio")
        try:
            raw = base64.b64decode(event["audio"], validate=True)
        except (binascii.Error, ValueError):
            message = "Invalid value for 'audio': expected base64-encoded audio."
            raise _ClientError("invalid_value", message, "audio") from None
        self._audio_bytes = len(raw)
        assert self._echo is not None and self._config is not None
        if self._config.fmt.sample_width == 2:
            raw = self._carry + raw
            whole = len(raw) & ~1
            raw, self._carry = raw[:whole], raw[whole:]
        if raw:
            self._echo.receive_audio(raw, self._decode(raw), now)
            self._drain_echo()

    # -- server events --------------------------------------------------------------------------------------

    def _drain_echo(self) -> None:
        assert self._echo is not None
        while (ev := self._echo.next_event()) is not None:
            if isinstance(ev, UtteranceDetected):
                self._utterance_no += 1
                u = ev.utterance
                self._emit({
                    "type": "session.input_transcript.delta",
                    "event_id": self._ids.new("event"),
                    "delta": f"[utterance {self._utterance_no}, {u.duration_ms / 1000:.1f} s]",
                    "start_ms": u.start_ms,
                    "end_ms": u.end_ms,
                })
            elif isinstance(ev, EchoStarted):
                self._echo_no += 1
                self._emit({
                    "type": "session.output_transcript.delta",
                    "event_id": self._ids.new("event"),
                    "delta": f"[echo {self._echo_no}, {ev.utterance.duration_ms / 1000:.1f} s]",
                    "start_ms": ev.start_ms,
                    "end_ms": ev.end_ms,
                })
            elif isinstance(ev, EchoAudio):
                # No event_id on the primary WebSocket (OutputAudioDeltaEvent).
                self._emit({"type": "session.output_audio.delta", "delta": base64.b64encode(ev.data).decode("ascii")})

    def _usage(self, now: int) -> dict[str, float]:
        return {"seconds": float((now - self._started_at) // _NS_PER_S)}

    def _finish(self, reason: str, now: int, client_event_id: str | None) -> None:
        assert self._resource is not None
        closed = {
            "type": "session.closed",
            "event_id": self._ids.new("event"),
            "reason": reason,
            "session": self._resource,
            "usage": self._usage(now),
        }
        if client_event_id is not None:
            closed["client_event_id"] = client_event_id
        self._emit(closed)
        self._close_with(CloseRequest(1000))

    def _error(self, code: str, message: str, param: str | None, client_event_id: str | None) -> None:
        event: dict[str, Any] = {
            "type": "error",
            "event_id": self._ids.new("event"),
            "error": {
                "type": "invalid_request_error",
                "code": code,
                "message": message,
                "param": param,
                "client_event_id": client_event_id,
            },
        }
        if client_event_id is not None:
            event["client_event_id"] = client_event_id
        self._emit(event)

    @staticmethod
    def _reply(event: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        if isinstance(request.get("event_id"), str):
            event["client_event_id"] = request["event_id"]
        return event

    def _emit(self, event: dict[str, Any]) -> None:
        """The single outbound funnel (fault-injection hook point)."""
        self._out.append(json.dumps(event, separators=(",", ":")))

    def _close_with(self, request: CloseRequest) -> None:
        """The single close funnel (fault-injection hook point)."""
        self._closing = True
        self._close = request
        self.record.close_code = request.code


# -- the shell ----------------------------------------------------------------------------------------------


def _accepts_path(path: str) -> bool:
    return path.endswith("/live/sessions")


def server(
    options: LiveFakeOptions | None = None,
    *,
    faults: Sequence[Fault] = (),
    record_path: str | None = None,
) -> FakeServer:
    """A GPT-Live fake (not yet listening: `await server(...).start(host, port)`)."""
    opts = options or LiveFakeOptions()

    def factory(ctx: ConnectionContext) -> LiveFakeConnection:
        return LiveFakeConnection(opts, now=ctx.now, unix_time=ctx.unix_time, ids=ctx.ids, index=ctx.index)

    return FakeServer(
        "openai_live",
        factory,
        path="/v1/live/sessions",
        accepts_path=_accepts_path,
        authorize=bearer_authorize,
        faults=faults,
        record_path=record_path,
    )


async def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    options: LiveFakeOptions | None = None,
    faults: Sequence[Fault] = (),
    record_path: str | None = None,
) -> FakeServer:
    """Start a fake GPT-Live server; `port=0` picks a free port (see `.port` / `.url`)."""
    return await server(options, faults=faults, record_path=record_path).start(host, port)


LiveFakeServer = FakeServer
