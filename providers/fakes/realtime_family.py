"""The shared sans-I/O core of the OpenAI-Realtime-family fakes (OpenAI Realtime GA and xAI Grok Voice Agent).

xAI's Voice Agent API is an OpenAI Realtime clone with a list of differences (providers.md §3.6). Both fakes run
this one core; everything that differs is data in a `Dialect` (openai_realtime.py and xai.py each define one).
Nothing here names a vendor: a behaviour that only one service has is a dialect field.

`RealtimeFamilyConnection` is the sans-I/O core (a kit_openai.py `OpenAICore`), driven and pulled as server.py
says every core is. Peer input never raises: it becomes an `error` event (the session stays open).

The model behind it (deterministic, on bytes and `now` only):

* Input audio is decoded per the session's input format and its length counted from bytes (the `*_ms` values
  of VAD events are offsets into the appended audio, never clock readings). The server VAD is the energy
  detector of echo.py: `threshold` t (0..1) maps to -55 + 25*t dBFS per 20 ms window, `silence_duration_ms` is
  the hangover, speech counts once it holds 100 ms of voiced audio. `speech_started.audio_start_ms` =
  first voiced ms - `prefix_padding_ms`; `speech_stopped.audio_end_ms` = last voiced ms + `silence_duration_ms`.
* `turn_detection: null` runs no VAD at all: nothing is committed or answered until the client's
  `input_audio_buffer.commit` (under 100 ms: `input_audio_buffer_commit_empty`), which is transcribed at once
  and answered after `response.create` (GA) or at once unless it holds only silence (xAI). Under server VAD a
  client commit takes the utterance the VAD has open (its item id) and restarts the detector on what follows.
* Each answered input takes the next `Script` turn (default: echo). The echo speaks the utterance's exact input
  bytes (first voiced - prefix .. last voiced + prefix) when the input and output formats are equal; otherwise
  it speaks a tone of the same length (no transcoding). A tool-call turn first answers with the function call,
  then waits for `function_call_output` + `response.create` before speaking.
* Output audio goes out faster than real time: chunks of `chunk_ms`, chunk k+1 due `chunk_ms / speed` after
  chunk k (`speed` default 4x; a `burst:F` fault makes it F). Transcript deltas (one per word) ride along.

Faults (faults.py) act at the funnels of the connection base (connection.py): every outbound frame goes through
`_send`, every close through `_close_with`, every fired fault through `_fault` (appended to `record.faults` as
its spec string); a stall holds frames here until it ends.
"""

from __future__ import annotations

import base64
import copy
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Unpack
from urllib.parse import parse_qs, urlsplit

from providers.fakes.connection import parse_client, soonest
from providers.fakes.echo import (
    EchoModel,
    EchoOptions,
    UtteranceDetected,
    UtteranceStarted,
    codec,
    mean_square,
    voiced_windows,
)
from providers.fakes.faults import Fault, FaultKind, FaultSchedule
from providers.fakes.kit_openai import (
    ClientEvent,
    CoreContext,
    OpenAICore,
    audio_format,
    b64_length,
    context_args,
    decode_audio,
    fake_server,
    ms_of,
    whole_samples,
)
from providers.fakes.schema import (
    Anything,
    ClientError,
    Int,
    ListOf,
    Nullable,
    Obj,
    Spec,
    Str,
    Tagged,
    invalid_value,
    merge,
    validate,
)
from providers.fakes.script import Script, ToolCallScript, Turn, label
from providers.fakes.server import Authorize, CloseRequest, ConnectionContext, FakeServer
from providers.fakes.speech import Speech, turn_audio
from rtp.audio import AudioFormat
from rtp.units import NS_PER_MS

__all__ = [
    "FUNCTION_TOOL",
    "METADATA",
    "UNLIMITED",
    "Dialect",
    "RealtimeFakeOptions",
    "RealtimeFamilyConnection",
    "audio_formats",
    "content_part",
    "dialect_server",
    "item_variants",
    "session_audio",
    "threshold_dbfs",
]

_MAX_APPEND_B64 = 15 * 2**20  # providers.md §1.4: up to 15 MiB of base64 per append
_MIN_COMMIT_MS = 100  # §1.9: a commit needs at least 100 ms of audio
_GARBAGE = '{"type":"response.output_audio.delta","event_id":"event_'  # garbage_json: cut-off JSON
_INVALID_B64 = "!!not*base64!!"  # invalid_audio: not decodable as base64
_INPUT_FORMAT = ("audio", "input", "format")  # where both dialects keep it
_WINDOW_MS = 20  # the VAD's analysis window
_MIN_SPEECH_MS = 100  # voiced audio needed before `speech_started` (and barge-in)
_MAX_UTTERANCE_MS = 30_000
_FORCE_MESSAGE_MS_PER_CHAR = 60  # how long a `force_message` item speaks (at least 300 ms)
_EAGERNESS_SILENCE_MS = {"low": 1000, "medium": 700, "auto": 700, "high": 400}  # semantic_vad stand-in
_RATE_LIMITS = [
    {"name": "requests", "limit": 5000, "remaining": 4999, "reset_seconds": 0.012},
    {"name": "tokens", "limit": 400000, "remaining": 395000, "reset_seconds": 0.75},
]


def _get(obj: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def item_variants(common: Mapping[str, Spec], content: Spec) -> dict[str, Obj]:
    """The `conversation.item.create` items both dialects take (a message, a function call, its output), over
    the dialect's `common` item members (type, id, object, status) and its message `content` part."""
    return {
        "message": Obj(
            {**common, "role": Str(choices=("user", "assistant", "system")), "content": ListOf(content)},
            required=("role", "content"),
        ),
        "function_call": Obj(
            {**common, "name": Str(nonempty=True), "arguments": Str(), "call_id": Str()},
            required=("name", "arguments"),
        ),
        "function_call_output": Obj(
            {**common, "call_id": Str(nonempty=True), "output": Str()}, required=("call_id", "output")
        ),
    }


def _part(text_only: bool, text: str, prefix: str) -> dict[str, Any]:
    """A response message's content part (`prefix` "output_": as its item's content names it), with `text`."""
    return (
        {"type": prefix + "text", "text": text}
        if text_only
        else {"type": prefix + "audio", "transcript": text}
    )


def _message(item_id: str | None, role: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    """A conversation message item."""
    item = {"id": item_id, "object": "realtime.item", "type": "message"}
    return {**item, "role": role, "status": status, "content": content}


# -- what both dialects' schemas share -----------------------------------------------------------------------

FUNCTION_TOOL = Obj(
    {"type": Str(), "name": Str(nonempty=True), "description": Str(), "parameters": Anything()},
    required=("name",),
)
UNLIMITED = Str(choices=("inf",))
"""`max_output_tokens: "inf"`."""
METADATA = Nullable(Anything())
"""A response's `metadata`."""


def audio_formats(pcm_rates: tuple[int, ...], g711_rate: bool) -> Tagged:
    """The `format` of either audio direction: PCM16 at `pcm_rates` (24 kHz when it names none) or G.711 (with a
    `rate` of 8000 allowed when `g711_rate`)."""
    g711 = Obj({"type": Str(), "rate": Int(choices=(8000,))} if g711_rate else {"type": Str()})
    pcm = Obj({"type": Str(), "rate": Int(choices=pcm_rates)}, defaults={"rate": 24000})
    return Tagged({"audio/pcm": pcm, "audio/pcmu": g711, "audio/pcma": g711})


def session_audio(input: Mapping[str, Spec], output: Mapping[str, Spec]) -> Obj:
    """The session's `audio`: its `input` and `output` members, all deep-merged by a `session.update`."""
    return Obj({"input": Obj(input, merge=True), "output": Obj(output, merge=True)}, merge=True)


def content_part(types: tuple[str, ...], **more: Spec) -> Obj:
    """A message item's content part of one of `types`."""
    return Obj(
        {"type": Str(choices=types), "text": Str(), "audio": Str(), "transcript": Nullable(Str()), **more}
    )


# -- the dialect ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dialect:
    """Everything the OpenAI Realtime GA and xAI Voice Agent fakes do differently (providers.md §3.6). Where a
    switch has a default, it is the GA protocol's (the reference the clone lists its differences from)."""

    name: str
    default_model: str
    session_schema: Obj
    """The `session` object of `session.update`."""
    response_schema: Obj
    """The `response` object of `response.create`."""
    item_schema: Tagged
    """The `item` of `conversation.item.create`."""
    new_session: Callable[[str, str, int], dict[str, Any]]
    """(model, session id, expires_at unix s) -> the full default session of `session.created`."""
    expiry_message: Callable[[int], str]
    """Session length in ms -> the error message / close reason at the cap."""
    voice_path: tuple[str, ...] = ("audio", "output", "voice")
    turn_detection_path: tuple[str, ...] = ("audio", "input", "turn_detection")
    modalities_path: tuple[str, ...] | None = ("output_modalities",)
    """Where the session says which output modalities it wants (None: audio always)."""
    response_modalities_key: str = "output_modalities"
    """The key in `response.create.response` that overrides the modalities."""
    text_alongside_audio: bool = False
    """True: text cannot replace audio; a text modality adds text deltas to the audio (xAI)."""
    text_delta_type: str = "response.output_text.delta"
    text_done_type: str | None = "response.output_text.done"
    item_prefix: str = "item"
    item_done_events: bool = True
    """`conversation.item.done` after `conversation.item.added` (OpenAI; xAI never sends it)."""
    rate_limits: bool = True
    """`rate_limits.updated` after `response.created`."""
    transcription_events: Literal["deltas", "snapshots"] = "deltas"
    snapshot_model: str | None = None
    """With `snapshots`, only this transcription model sends `.updated` snapshots before `.completed`."""
    function_call_events: Literal["streamed", "at_done"] = "streamed"
    """`streamed`: item added, argument deltas, done (OpenAI); `at_done`: `arguments.done` + item done just
    before `response.done`, after any audio (xAI)."""
    usage: Literal["tokens", "audio_seconds"] = "tokens"
    rich_response: bool = True
    """Response objects carry conversation_id, output_modalities, audio, max_output_tokens, metadata."""
    unsupported_events: frozenset[str] = frozenset()
    """Client event types answered with an `error` (code `unsupported_event`)."""
    commit_creates_response: bool = False
    """A manual `input_audio_buffer.commit` is answered at once, without `response.create` (xAI)."""
    commit_ignores_silence: bool = False
    """... unless the committed audio holds no speech (xAI)."""
    drops_repeat_response_create: bool = False
    """A `response.create` with nothing new since the last answer is silently dropped (xAI)."""
    honours_create_response: bool = True
    """False: auto-responds even when `turn_detection.create_response` is false (xAI echoes it, ignores it)."""
    voice_locked_after_audio: bool = True
    idle_timeout: bool = True
    """`turn_detection.idle_timeout_ms` -> `input_audio_buffer.timeout_triggered` (OpenAI server_vad)."""
    ping_interval_ms: int | None = None
    """Periodic `{"type":"ping","timestamp":ms}` keepalive (xAI)."""
    session_length_ms: int = 60 * 60 * 1000
    expiry_error: bool = True
    """At the session cap: an `error` `session_expired` before the close."""
    expiry_close_code: int = 1001
    beta_header_rejected: bool = True
    """An `OpenAI-Beta` header gets `error` `beta_api_shape_disabled` and close 4000."""


@dataclass(frozen=True, slots=True)
class RealtimeFakeOptions:
    """Tunables of the fake model and its pacing (dialect defaults where None)."""

    speed: float = 4.0
    """Output audio goes out this many times faster than real time."""
    chunk_ms: int = 100
    """Audio per `response.output_audio.delta`."""
    session_length_ms: int | None = None
    ping_interval_ms: int | None = None
    """0 turns the dialect's keepalive ping off."""
    record_client_frames: bool = True

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError("speed must be positive")
        if self.chunk_ms <= 0:
            raise ValueError("chunk_ms must be positive")
        if self.session_length_ms is not None and self.session_length_ms <= 0:
            raise ValueError("session_length_ms must be positive")


def threshold_dbfs(threshold: float) -> float:
    """The energy threshold (dBFS per window) standing in for a VAD `threshold` in 0..1.

    The real threshold is a speech probability, not a level: even xAI's default 0.85 accepts ordinary speech.
    The map keeps every threshold well below speech levels (0.5 -> -42.5 dBFS, 0.85 -> -33.75 dBFS) so that
    the default never splits a spoken sentence at its softer syllables."""
    return -55.0 + 25.0 * threshold


def _vad_dbfs(td: Mapping[str, Any]) -> float:
    """The energy threshold of a `turn_detection` (0.5 when it names none)."""
    threshold = td.get("threshold")
    return threshold_dbfs(0.5 if threshold is None else float(threshold))


# -- audio helpers -------------------------------------------------------------------------------------------


def _has_speech(fmt: AudioFormat, raw: bytes, dbfs: float) -> bool:
    pcm = codec(fmt.encoding)[0](raw[: len(raw) - len(raw) % fmt.sample_width])
    return any(voiced_windows(pcm, max(1, fmt.rate * _WINDOW_MS // 1000), mean_square(dbfs)))


# -- conversation state --------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Input:
    """A user input waiting to be answered: committed audio (in `fmt`) or a text item."""

    item_id: str
    audio: bytes | None
    fmt: AudioFormat | None
    ms: float
    index: int  # n-th committed audio input (0 for text)


@dataclass(slots=True)
class _Item:
    item: dict[str, Any]
    audio_ms: float = 0.0
    words: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Response:
    id: str
    fmt: AudioFormat
    fmt_json: dict[str, Any]
    modalities: tuple[str, ...]
    in_conversation: bool
    metadata: Any
    interruptible: bool
    text_only: bool
    """Text instead of audio (the response's modalities leave audio out, and the dialect allows that)."""
    output: list[dict[str, Any]] = field(default_factory=list)
    item_id: str | None = None
    speech: Speech | None = None  # None: a response that only calls a tool
    audio_ms: float = 0.0

    @property
    def words(self) -> list[str]:
        """The words of its transcript that went out."""
        return self.speech.words[: self.speech.words_sent] if self.speech is not None else []

    def part(self, **fields: Any) -> dict[str, Any]:
        """The members every event about the response's message part carries, and `fields`."""
        return {
            "response_id": self.id,
            "item_id": self.item_id,
            "output_index": 0,
            "content_index": 0,
            **fields,
        }


@dataclass(slots=True)
class _PendingTool:
    turn: Turn
    source: _Input | None
    turn_no: int
    call_id: str


# -- the core ------------------------------------------------------------------------------------------------


class RealtimeFamilyConnection(OpenAICore):
    """One Realtime-family WebSocket connection, server side (see the module docstring)."""

    append_type = "input_audio_buffer.append"
    garbage = _GARBAGE

    def __init__(
        self,
        dialect: Dialect,
        options: RealtimeFakeOptions | None = None,
        *,
        script: Script | None = None,
        model: str | None = None,
        beta_header: bool = False,
        **context: Unpack[CoreContext],
    ) -> None:
        self.dialect = d = dialect
        self.options = opts = options or RealtimeFakeOptions()
        super().__init__(opts.record_client_frames, context)
        now = self._now = context["now"]
        self.script = script or Script()
        self._corrupt_audio = False
        self._schedule = FaultSchedule(list(context.get("faults", ())), self.record.index + 1, now)
        self._handlers = {
            kind: replace(entry, handler=_unsupported) if kind in d.unsupported_events else entry
            for kind, entry in _CLIENT_EVENTS.items()
        }

        length = opts.session_length_ms or d.session_length_ms
        self._length_ms = length
        self._expires: int | None = now + length * NS_PER_MS
        interval = d.ping_interval_ms if opts.ping_interval_ms is None else opts.ping_interval_ms
        self._ping_ns = interval * NS_PER_MS if interval else None
        self._next_ping = now + self._ping_ns if self._ping_ns else None

        session_id = self._ids.new("sess")
        self.record.session_id = session_id
        self._session = d.new_session(model or d.default_model, session_id, self._unix_time + length // 1000)
        self._conversation_id = self._ids.new("conv")
        self._items: dict[str, _Item] = {}
        self._input_fmt = audio_format(_get(self._session, _INPUT_FORMAT) or {})
        self._carry = b""
        self._input_ms = 0.0
        self._buffer = bytearray()  # raw input since the last commit/clear (its last max_utterance_ms)
        self._buffer_ms = 0.0
        self._vad: EchoModel | None = None
        self._vad_base_ms = 0.0
        self._vad_key: Any = None
        self._speech_item: str | None = None
        self._response: _Response | None = None
        self._pending_tool: _PendingTool | None = None
        self._unanswered: _Input | None = None
        self._answered_any = False
        self._turn_no = 0
        self._audio_inputs = 0
        self._audio_out_any = False
        self._input_total_ms = 0.0
        self._idle_at: int | None = None
        self._reconfigure()

        # Nothing is emitted here: the shell writes frames only after a driver call, so the handshake (or the
        # beta refusal) is due at `now` and goes out from the first `handle_timer`.
        self._handshake_at: int | None = now
        self._refuse_beta = beta_header and d.beta_header_rejected
        self._early: list[dict[str, Any]] = []  # client events received before session.created

    # -- drivers --------------------------------------------------------------------------------------------

    def receive_message(self, data: str | bytes, now: int) -> None:
        """Handle one client WebSocket message. Never raises for bad peer input."""
        self._now = now
        self._faults(now)
        self._audio_bytes = None
        frame, raw, is_json = parse_client(data)
        if self._closing:
            pass
        elif frame is None or self._handshake_at is None:
            self._client_frame(frame, is_json, now)
        else:  # before session.created: answered after it
            self._early.append(frame)
            if frame.get("type") == self.append_type and isinstance(frame.get("audio"), str):
                self._audio_bytes = b64_length(frame["audio"])
        self._received(now, frame, raw)

    def handle_timer(self, now: int) -> None:
        """Run everything due at or before `now`."""
        self._now = now
        if self._closing:
            return
        self._faults(now)
        if self._closing:
            return
        if self._refuse_beta:
            message = "The Realtime Beta API is no longer supported. Please use /v1/realtime for the GA API."
            self._error("beta_api_shape_disabled", message)
            self._close_with(CloseRequest(4000, "invalid_request_error.beta_api_shape_disabled"))
            return
        if self._handshake_at is not None and now >= self._handshake_at:
            self._handshake(now)
        if self._expires is not None and now >= self._expires:
            self._expire()
            return
        while self._next_ping is not None and self._ping_ns and now >= self._next_ping:
            stamp = self._unix_time * 1000 + (self._next_ping - self._created_now) // NS_PER_MS
            self._emit({"type": "ping", "timestamp": stamp})
            self._next_ping += self._ping_ns
        if self._idle_at is not None and now >= self._idle_at:
            self._idle_timeout(now)
        self._pump(now)
        self._flush_held(now)

    def inject(self, fault: Fault, now: int) -> None:
        """Apply a fault at runtime; its AFTER_MS counts from `now` (see providers/fakes/faults.py)."""
        self._now = now
        if self._closing:
            return
        self._schedule.add(fault, now)
        self._faults(now)
        self._flush_held(now)

    # -- outputs --------------------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        if self._closing or self._half_open:
            return None
        r = self._response
        speech = r.speech.due() if r is not None and r.speech is not None and not r.speech.done else None
        schedule = self._schedule.next_deadline()
        return soonest(self._handshake_at, self._expires, self._next_ping, self._idle_at, schedule, speech)

    # -- introspection --------------------------------------------------------------------------------------

    @property
    def session(self) -> dict[str, Any]:
        """A copy of the full effective session (as `session.updated` would carry it)."""
        return copy.deepcopy(self._session)

    @property
    def input_ms(self) -> float:
        """Input audio received so far, in ms (from bytes)."""
        return self._input_ms

    @property
    def responding(self) -> bool:
        return self._response is not None

    # -- faults and funnels (connection.py) -----------------------------------------------------------------

    def _faults(self, now: int) -> None:
        for fault in self._schedule.due(now):
            self._fault(fault, now)

    def _on_fault(self, fault: Fault, now: int) -> None:
        kind = fault.kind
        if kind is FaultKind.HALF_OPEN:
            self._out.clear()
        elif kind is FaultKind.CLOSE:
            self._expire()
        elif kind is FaultKind.INVALID_AUDIO:
            self._corrupt_audio = True
        elif kind is FaultKind.SLOW_HANDSHAKE and self._handshake_at is not None:
            delay = int((fault.value or 0) * NS_PER_MS)
            self._handshake_at = max(self._handshake_at, now + delay)
        # BURST, STALL and DUPLICATE_TOOL_CALL are states, asked for where they act.

    def _flush_held(self, now: int) -> None:
        if self._held and not self._schedule.stalled(now):
            self._release()

    def _holding(self) -> bool:
        return self._schedule.stalled(self._now)

    def _close_with(self, request: CloseRequest) -> None:
        """A stall's frames go out before the close; a half-open connection does not even drop TCP."""
        if not self._closing and not self._half_open:
            self._release()
            super()._close_with(request)

    def _events(self) -> Mapping[str, ClientEvent]:
        return self._handlers

    def _unknown_event(self, kind: str) -> ClientError:
        supported = ", ".join(f"'{k}'" for k in _CLIENT_EVENTS)
        return invalid_value(kind, "type", f"Supported values are: {supported}.")

    # -- session lifecycle ----------------------------------------------------------------------------------

    def _handshake(self, now: int) -> None:
        self._handshake_at = None
        self._event("session.created", session=self.session)
        conversation = {"id": self._conversation_id, "object": "realtime.conversation"}
        self._event("conversation.created", conversation=conversation)
        early, self._early = self._early, []
        for frame in early:
            if self._closing:
                break
            self._client_frame(frame, True, now)

    def _expire(self) -> None:
        message = self.dialect.expiry_message(self._length_ms)
        if self.dialect.expiry_error:
            self._error("session_expired", message)
        self._close_with(CloseRequest(self.dialect.expiry_close_code, message))

    def _reconfigure(self) -> None:
        """Apply the session's formats and turn detection (a changed input side restarts the VAD)."""
        d = self.dialect
        fmt = audio_format(_get(self._session, _INPUT_FORMAT) or {})
        td = _get(self._session, d.turn_detection_path)
        key = (fmt, json.dumps(td, sort_keys=True))
        if key == self._vad_key:
            return
        self._vad_key = key
        if fmt != self._input_fmt:
            self._carry = b""
            self._buffer.clear()
            self._buffer_ms = 0.0
        self._input_fmt = fmt
        self._vad = None
        self._vad_base_ms = self._input_ms
        self._speech_item = None
        if isinstance(td, dict):
            self._vad = EchoModel(fmt.rate, fmt.sample_width, self._vad_options(td))

    def _vad_options(self, td: dict[str, Any]) -> EchoOptions:
        silence = td.get("silence_duration_ms")
        if td.get("type") == "semantic_vad":
            silence = _EAGERNESS_SILENCE_MS.get(td.get("eagerness") or "auto", 700)
        return EchoOptions(
            threshold_dbfs=_vad_dbfs(td),
            window_ms=_WINDOW_MS,
            hangover_ms=int(500 if silence is None else silence),
            min_utterance_ms=_MIN_SPEECH_MS,
            pad_ms=int(td.get("prefix_padding_ms") or 0) if td.get("type") == "server_vad" else 300,
            max_utterance_ms=_MAX_UTTERANCE_MS,
            report_starts=True,
            speak=False,
        )

    @property
    def _td(self) -> dict[str, Any]:
        """The session's turn detection ({} when it has none)."""
        td = _get(self._session, self.dialect.turn_detection_path)
        return td if isinstance(td, dict) else {}

    # -- client events --------------------------------------------------------------------------------------

    def _on_session_update(self, event: dict[str, Any], now: int) -> None:
        d = self.dialect
        update = event["session"]
        validate(d.session_schema, update, "session")
        candidate = merge(d.session_schema, self._session, update)
        if d.voice_locked_after_audio and self._audio_out_any:
            if _get(candidate, d.voice_path) != _get(self._session, d.voice_path):
                message = "Cannot update a conversation's voice if assistant audio is present."
                raise ClientError("cannot_update_voice", message, "session." + ".".join(d.voice_path))
        self._session = candidate
        self._reconfigure()
        self._event("session.updated", session=self.session)

    def _on_append(self, event: dict[str, Any], now: int) -> None:
        audio = event["audio"]
        validate(Str(), audio, "audio")
        if len(audio) > _MAX_APPEND_B64:
            raise invalid_value(f"<{len(audio)} chars>", "audio", "Audio is larger than 15 MiB of base64.")
        raw = decode_audio(audio, "Invalid 'audio': expected base64-encoded audio data.")
        self._audio_bytes = len(raw)
        fmt = self._input_fmt
        raw, self._carry = whole_samples(self._carry, raw, fmt.sample_width)
        if not raw:
            return
        ms = ms_of(fmt, len(raw))
        self._input_ms += ms
        self._input_total_ms += ms
        self._buffer += raw
        self._buffer_ms += ms
        keep = int(_MAX_UTTERANCE_MS * fmt.rate / 1000) * fmt.sample_width
        if len(self._buffer) > keep:
            del self._buffer[: len(self._buffer) - keep]
        if self._vad is not None:
            self._vad.receive_audio(raw, codec(fmt.encoding)[0](raw), now)
            self._drain_vad(now)

    def _on_commit(self, event: dict[str, Any], now: int) -> None:
        if self._buffer_ms < _MIN_COMMIT_MS:
            message = (
                "Error committing input audio buffer: buffer too small. Expected at least 100ms of audio, "
                f"but buffer only has {self._buffer_ms:.2f}ms of audio."
            )
            raise ClientError("input_audio_buffer_commit_empty", message)
        d, fmt = self.dialect, self._input_fmt
        respond = d.commit_creates_response
        if respond and d.commit_ignores_silence:
            respond = _has_speech(fmt, bytes(self._buffer), _vad_dbfs(self._td))
        item_id = self._speech_item or self._ids.new(d.item_prefix)
        self._commit(self._buffered(item_id), now, respond=respond)

    def _buffered(self, item_id: str) -> _Input:
        """The buffered input audio as the next user input `item_id`; the buffer and the detector start anew."""
        source = self._input(item_id, bytes(self._buffer), self._buffer_ms)
        self._reset_buffer()
        return source

    def _input(self, item_id: str, audio: bytes, ms: float) -> _Input:
        self._audio_inputs += 1
        return _Input(item_id, audio, self._input_fmt, ms, self._audio_inputs)

    def _reset_buffer(self) -> None:
        self._buffer.clear()
        self._buffer_ms = 0.0
        self._speech_item = None
        self._vad_key = None  # restart the detector at the current position
        self._reconfigure()

    def _on_clear(self, event: dict[str, Any], now: int) -> None:
        self._reset_buffer()
        self._event("input_audio_buffer.cleared")

    def _on_item_create(self, event: dict[str, Any], now: int) -> None:
        d = self.dialect
        item = event["item"]
        validate(d.item_schema, item, "item")
        previous = event.get("previous_item_id")
        if previous is not None:
            self._item(previous, "previous_item_id")
        if item["type"] == "force_message":
            text = " ".join(str(c.get("text", "")) for c in item.get("content", []))
            ms = max(300, len(text) * _FORCE_MESSAGE_MS_PER_CHAR)
            turn = Turn(reply="tone", duration_ms=ms)
            self._no_active_response()
            self._speak(
                turn, None, 0, now, {}, transcript=text, interruptible=bool(item.get("interruptible", True))
            )
            return
        item = copy.deepcopy(item)
        item_id = item.get("id") or self._ids.new(d.item_prefix)
        if item_id in self._items:
            raise ClientError("duplicate_item_id", f"Item with id '{item_id}' already exists.", "item.id")
        item = {"id": item_id, "object": "realtime.item", **{k: v for k, v in item.items() if k != "id"}}
        item.setdefault("status", "completed")
        self._add_item(item)
        if item["type"] == "message" and item.get("role") == "user":
            self._unanswered = _Input(item_id, None, None, 0.0, 0)

    def _add_item(self, item: dict[str, Any]) -> None:
        previous = self._last_item()
        self._items[item["id"]] = _Item(item)
        self._conversation_item("added", item, previous)
        self._conversation_item("done", item, previous)

    def _conversation_item(self, stage: str, item: dict[str, Any], previous: str | None) -> None:
        """`conversation.item.added` / `.done` (the latter only where the dialect sends it)."""
        if stage == "added" or self.dialect.item_done_events:
            self._event(f"conversation.item.{stage}", previous_item_id=previous, item=item)

    def _output_item(
        self,
        r: _Response,
        index: int,
        stage: str,
        item: dict[str, Any],
        previous: str | None | Literal[False],
    ) -> None:
        """`response.output_item.added` / `.done` of the response's output `index`, then its conversation event
        when the response is in the conversation (`previous` False: the item has left it)."""
        self._event(f"response.output_item.{stage}", response_id=r.id, output_index=index, item=item)
        if r.in_conversation and previous is not False:
            self._conversation_item(stage, item, previous)

    def _item(self, item_id: Any, param: str) -> _Item:
        """The conversation item `item_id` (named by the client's `param`, a string), else `item_not_found`."""
        validate(Str(), item_id, param)
        entry = self._items.get(item_id)
        if entry is None:
            raise ClientError("item_not_found", f"Item with item_id not found: {item_id}", param)
        return entry

    def _on_truncate(self, event: dict[str, Any], now: int) -> None:
        item_id, index, end = event["item_id"], event["content_index"], event["audio_end_ms"]
        validate(Str(), item_id, "item_id")
        validate(Int(lo=0), index, "content_index")
        validate(Int(lo=0), end, "audio_end_ms")
        entry = self._item(item_id, "item_id")
        item = entry.item
        if item.get("type") != "message" or item.get("role") != "assistant":
            raise ClientError("invalid_value", "Only assistant messages can be truncated.", "item_id")
        if index != 0:
            raise invalid_value(index, "content_index", "The item has one content part (index 0).")
        if end > entry.audio_ms:
            message = f"Audio content of {math.floor(entry.audio_ms)}ms is shorter than {end}ms"
            raise ClientError("invalid_value", message, "audio_end_ms")
        keep = int(len(entry.words) * end / entry.audio_ms) if entry.audio_ms else 0
        entry.words = entry.words[:keep]
        entry.audio_ms = float(end)
        for part in item.get("content", []):
            if "transcript" in part:
                part["transcript"] = " ".join(entry.words)
        self._event("conversation.item.truncated", item_id=item_id, content_index=index, audio_end_ms=end)

    def _on_delete(self, event: dict[str, Any], now: int) -> None:
        item_id = event["item_id"]
        self._item(item_id, "item_id")
        del self._items[item_id]
        self._event("conversation.item.deleted", item_id=item_id)

    def _on_retrieve(self, event: dict[str, Any], now: int) -> None:
        self._event("conversation.item.retrieved", item=self._item(event["item_id"], "item_id").item)

    def _on_response_create(self, event: dict[str, Any], now: int) -> None:
        d = self.dialect
        params = event.get("response") or {}
        validate(d.response_schema, params, "response")
        self._no_active_response()
        if self._pending_tool is not None:
            pending, self._pending_tool = self._pending_tool, None
            self._speak(pending.turn, pending.source, pending.turn_no, now, params)
        elif self._unanswered is not None:
            self._answer(now, params)
        elif not d.drops_repeat_response_create or not self._answered_any:
            self._answered_any = True
            self._speak(Turn(reply="tone", duration_ms=500), None, 0, now, params)

    def _no_active_response(self) -> None:
        if self._response is not None:
            message = (
                f"Conversation already has an active response in progress: {self._response.id}. "
                "Wait until the response is finished before creating a new one."
            )
            raise ClientError("conversation_already_has_active_response", message)

    def _on_response_cancel(self, event: dict[str, Any], now: int) -> None:
        r = self._response
        wanted = event.get("response_id")
        if wanted is not None:
            validate(Str(), wanted, "response_id")
        if r is None or (wanted is not None and wanted != r.id):
            raise ClientError("response_cancel_not_active", "Cancellation failed: no active response found.")
        self._finish(r, "cancelled", "client_cancelled", now)

    def _on_output_audio_buffer_clear(self, event: dict[str, Any], now: int) -> None:
        message = "output_audio_buffer.clear is only supported for WebRTC and SIP connections."
        raise ClientError("unsupported_event", message, "type")

    # -- VAD ------------------------------------------------------------------------------------------------

    def _drain_vad(self, now: int) -> None:
        assert self._vad is not None
        vad, base, td = self._vad, self._vad_base_ms, self._td
        while (ev := vad.next_event()) is not None:
            if isinstance(ev, UtteranceStarted):
                item_id = self._speech_item = self._ids.new(self.dialect.item_prefix)
                start = max(0.0, (ev.voiced_start - vad.options.pad_ms * vad.rate / 1000) * 1000 / vad.rate)
                self._event(
                    "input_audio_buffer.speech_started", audio_start_ms=int(base + start), item_id=item_id
                )
                self._idle_at = None
                r = self._response
                if r is not None and r.interruptible and td.get("interrupt_response", True) is not False:
                    self._finish(r, "cancelled", "turn_detected", now)
            elif isinstance(ev, UtteranceDetected):
                u = ev.utterance
                item_id = self._speech_item or self._ids.new(self.dialect.item_prefix)
                self._speech_item = None
                end_ms = base + (u.voiced_end * 1000 / u.rate) + vad.options.hangover_ms
                self._event("input_audio_buffer.speech_stopped", audio_end_ms=int(end_ms), item_id=item_id)
                source = self._input(item_id, u.audio, u.duration_ms)
                self._buffer.clear()
                self._buffer_ms = 0.0
                respond = (
                    td.get("create_response", True) is not False or not self.dialect.honours_create_response
                )
                self._commit(source, now, respond=respond)

    def _idle_timeout(self, now: int) -> None:
        self._idle_at = None
        if self._response is not None or self._speech_item is not None:
            return
        idle = int(self._td.get("idle_timeout_ms") or 0)
        end = int(self._input_ms)
        item_id = self._ids.new(self.dialect.item_prefix)
        self._event(
            "input_audio_buffer.timeout_triggered",
            item_id=item_id,
            audio_start_ms=max(0, end - idle),
            audio_end_ms=end,
        )
        self._commit(self._buffered(item_id), now, respond=True)

    def _commit(self, source: _Input, now: int, *, respond: bool) -> None:
        """A user audio item enters the conversation: committed, item events, transcription, answer."""
        previous = self._last_item()
        self._event("input_audio_buffer.committed", previous_item_id=previous, item_id=source.item_id)
        content = [{"type": "input_audio", "transcript": None}]
        self._add_item(_message(source.item_id, "user", "completed", content))
        self._transcribe(source)
        self._heard(now, source.item_id, source.index, source.ms / 1000, source.ms)
        self._unanswered = source
        if respond and self._response is None:
            self._answer(now, {})

    def _transcribe(self, source: _Input) -> None:
        d = self.dialect
        config = _get(self._session, ("audio", "input", "transcription"))
        if not isinstance(config, dict):
            return
        text = label("utterance", source.index, source.ms / 1000)
        words = text.split(" ")
        kind = "conversation.item.input_audio_transcription"
        about: dict[str, Any] = {"item_id": source.item_id}
        if d.transcription_events == "deltas":
            about["content_index"] = 0
            for i, word in enumerate(words):
                self._event(f"{kind}.delta", **about, delta=word if i == len(words) - 1 else word + " ")
            usage = {"type": "duration", "seconds": round(source.ms / 1000, 3)}
            self._event(f"{kind}.completed", **about, transcript=text, usage=usage)
        else:
            if config.get("model") == d.snapshot_model:
                for i in range(1, len(words)):
                    self._event(f"{kind}.updated", **about, transcript=" ".join(words[:i]))
            self._event(f"{kind}.completed", **about, transcript=text)
        entry = self._items.get(source.item_id)
        if entry is not None:
            entry.item["content"][0]["transcript"] = text

    # -- responses ------------------------------------------------------------------------------------------

    def _answer(self, now: int, params: dict[str, Any]) -> None:
        """Answer the unanswered input with the next script turn."""
        source, self._unanswered = self._unanswered, None
        self._answered_any = True
        self._turn_no += 1
        turn = self.script.turn(self._turn_no)
        caller = source if source is not None and source.audio is not None else None
        item = source.item_id if source is not None else None
        kind = None if source is None else "audio" if caller is not None else "text"
        if turn.tool_call is not None and (caller is not None or not self.script.tools_answer_callers):
            r = self._new_response(now, params)
            call_id = self._tool_events(r, turn.tool_call, 0)
            self._pending_tool = _PendingTool(turn, caller, self._turn_no, call_id)
            self._done(r, "completed", None)
            self._answers(now, turn, item, kind, call_id)
        else:  # with `tools_answer_callers`, a text (the application's context) is spoken, not a call
            self._speak(turn, caller, self._turn_no, now, params)
            self._answers(now, turn, item, kind)

    def _new_response(self, now: int, params: dict[str, Any], *, interruptible: bool = True) -> _Response:
        d = self.dialect
        fmt_json = _get(params, ("audio", "output", "format")) or _get(
            self._session, ("audio", "output", "format")
        )
        fmt_json = copy.deepcopy(fmt_json or {"type": "audio/pcm"})
        if fmt_json.get("type") == "audio/pcm":
            fmt_json.setdefault("rate", 24000)
        modalities = params.get(d.response_modalities_key)
        if modalities is None and d.modalities_path is not None:
            modalities = _get(self._session, d.modalities_path)
        modalities = tuple(modalities or ("audio",))
        r = _Response(
            id=self._ids.new("resp"),
            fmt=audio_format(fmt_json),
            fmt_json=fmt_json,
            modalities=modalities,
            in_conversation=params.get("conversation", "auto") != "none",
            metadata=params.get("metadata"),
            interruptible=interruptible,
            text_only="audio" not in modalities and not d.text_alongside_audio,
        )
        self._idle_at = None
        self._event("response.created", response=self._response_json(r, "in_progress", None, None))
        if d.rate_limits:
            self._event("rate_limits.updated", rate_limits=_RATE_LIMITS)
        return r

    def _speak(
        self,
        turn: Turn,
        source: _Input | None,
        turn_no: int,
        now: int,
        params: dict[str, Any],
        *,
        transcript: str | None = None,
        interruptible: bool = True,
    ) -> None:
        """A response that speaks `turn` (echoing `source` when it is audio): its message opens, its chunks are
        planned and the first go out."""
        r = self._new_response(now, params, interruptible=interruptible)
        audio, text = self._reply(turn, source, turn_no, r.fmt)
        text = transcript if transcript is not None else text
        words = text.split(" ") if text else []
        r.item_id = self._ids.new(self.dialect.item_prefix)
        item = _message(r.item_id, "assistant", "in_progress", [])
        self._output_item(r, 0, "added", item, self._last_item())
        if r.in_conversation:
            self._items[r.item_id] = _Item(item)
        self._event("response.content_part.added", **r.part(part=_part(r.text_only, "", "")))
        fmt = r.fmt
        step = max(1, int(round(fmt.rate * self.options.chunk_ms / 1000))) * fmt.sample_width

        def gap(nbytes: int, now: int) -> int:  # the chunk's real-time length over the speed
            return int(int(ms_of(fmt, nbytes) * NS_PER_MS) / self._schedule.speed(now, self.options.speed))

        r.speech = Speech(b"" if r.text_only else audio, step, words, now, gap=gap)
        self._response = r
        self._pump(now)

    def _reply(self, turn: Turn, source: _Input | None, turn_no: int, fmt: AudioFormat) -> tuple[bytes, str]:
        """The audio of a reply in `fmt` and its transcript: the echo of `source`'s exact input bytes (a tone of
        the same length when the formats differ: no transcoding), else the turn's tone or silence."""
        echo = source if turn.reply == "echo" and source is not None and source.audio is not None else None
        ms = echo.ms if echo is not None else float(turn.duration_ms)
        if echo is not None and echo.audio is not None and echo.fmt == fmt:
            audio = echo.audio
        else:
            audio = turn_audio(turn, fmt, int(round(fmt.rate * ms / 1000)))
        kind = "echo" if echo is not None else "silence" if turn.reply == "silence" else "tone"
        return audio, turn.transcript if turn.transcript is not None else label(kind, turn_no, ms / 1000)

    def _pump(self, now: int) -> None:
        """Send every chunk of the active response that is due at `now`; finish it after the last."""
        r = self._response
        while r is not None and r is self._response and r.speech is not None:
            chunk = r.speech.take(now)
            if chunk is None:
                return
            audio, words = chunk
            if audio:
                delta = base64.b64encode(audio).decode("ascii")
                if self._corrupt_audio:
                    self._corrupt_audio, delta = False, _INVALID_B64
                self._event("response.output_audio.delta", **r.part(delta=delta))
                r.audio_ms += ms_of(r.fmt, len(audio))
                self._audio_out_any = True
            for i, word in enumerate(words):
                last = r.speech.done and i == len(words) - 1
                delta = word if last else word + " "
                if r.text_only:
                    self._event(self.dialect.text_delta_type, **r.part(delta=delta))
                else:
                    self._event("response.output_audio_transcript.delta", **r.part(delta=delta))
                    if "text" in r.modalities and self.dialect.text_alongside_audio:
                        self._event(self.dialect.text_delta_type, **r.part(delta=delta))
            if r.speech.done:
                self._finish(r, "completed", None, now)

    def _finish(self, r: _Response, status: str, reason: str | None, now: int) -> None:
        """Close the response's message item, any tool call after it, then `response.done`."""
        d = self.dialect
        self._response = None
        complete = status == "completed"
        text = " ".join(r.words)
        if not r.text_only:
            self._event("response.output_audio.done", **r.part())
            self._event("response.output_audio_transcript.done", **r.part(transcript=text))
        elif d.text_done_type is not None:
            self._event(d.text_done_type, **r.part(text=text))
        self._event("response.content_part.done", **r.part(part=_part(r.text_only, text, "")))
        content = [_part(r.text_only, text, "output_")]
        item = _message(r.item_id, "assistant", "completed" if complete else "incomplete", content)
        r.output.append(item)
        entry = self._items.get(r.item_id or "") if r.in_conversation else None
        if entry is not None:
            entry.item, entry.audio_ms, entry.words = copy.deepcopy(item), r.audio_ms, list(r.words)
        self._output_item(r, 0, "done", item, self._previous_of(r.item_id) if entry is not None else False)
        self._done(r, status, None if complete else {"type": "cancelled", "reason": reason})
        # The idle timeout runs from when the response's audio has played out (at real time, from its first
        # delta) plus `idle_timeout_ms` (providers.md §1.3).
        td = self._td
        idle = td.get("idle_timeout_ms")
        if d.idle_timeout and td.get("type") == "server_vad" and idle:
            first_at = r.speech.first_at if r.speech is not None else None
            played_out = (first_at if first_at is not None else now) + int(r.audio_ms * NS_PER_MS)
            self._idle_at = max(now, played_out) + int(idle) * NS_PER_MS

    def _previous_of(self, item_id: str | None) -> str | None:
        previous = None
        for key in self._items:
            if key == item_id:
                return previous
            previous = key
        return previous

    def _done(self, r: _Response, status: str, details: dict[str, Any] | None) -> None:
        usage = self._usage(r)
        event: dict[str, Any] = {"response": self._response_json(r, status, details, usage)}
        if self.dialect.usage == "audio_seconds":
            event["usage"] = usage
        self._event("response.done", **event)

    def _tool_events(self, r: _Response, call: ToolCallScript, index: int) -> str:
        """The scripted function call as the response's output `index` (twice under `duplicate_tool_call`)."""
        d = self.dialect
        item_id, call_id = self._ids.new(d.item_prefix), self._ids.new("call")
        arguments = json.dumps(call.arguments, separators=(",", ":"))
        base = {"id": item_id, "object": "realtime.item", "type": "function_call", "name": call.name}
        base["call_id"] = call_id
        done_item = {**base, "status": "completed", "arguments": arguments}
        about = {"response_id": r.id, "item_id": item_id, "output_index": index, "call_id": call_id}
        copies = 2 if self._schedule.active(FaultKind.DUPLICATE_TOOL_CALL, self._now) is not None else 1
        for _ in range(copies):
            if d.function_call_events == "streamed":
                added = {**base, "status": "in_progress", "arguments": ""}
                self._output_item(r, index, "added", added, self._last_item())
                cut = max(1, len(arguments) // 2)
                for piece in (arguments[:cut], arguments[cut:]):
                    if piece:
                        self._event("response.function_call_arguments.delta", **about, delta=piece)
            self._event("response.function_call_arguments.done", **about, name=call.name, arguments=arguments)
            self._output_item(r, index, "done", done_item, self._last_item())
        if r.in_conversation:
            self._items[item_id] = _Item(copy.deepcopy(done_item))
        r.output.append(done_item)
        return call_id

    def _last_item(self) -> str | None:
        return next(reversed(self._items), None) if self._items else None

    def _response_json(
        self, r: _Response, status: str, details: dict[str, Any] | None, usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        obj: dict[str, Any] = {"id": r.id, "object": "realtime.response", "status": status}
        if self.dialect.rich_response:
            voice = _get(self._session, self.dialect.voice_path)
            obj.update(
                status_details=details,
                output=r.output,
                conversation_id=self._conversation_id if r.in_conversation else None,
                output_modalities=list(r.modalities),
                audio={"output": {"format": r.fmt_json, "voice": voice}},
                max_output_tokens=self._session.get("max_output_tokens", "inf"),
                metadata=r.metadata,
                usage=usage,
            )
        else:
            obj["output"] = r.output
            if details is not None:
                obj["status_details"] = details
            if usage is not None:
                obj["usage"] = usage
        return obj

    def _usage(self, r: _Response) -> dict[str, Any]:
        """Made-up but consistent numbers: 10 input audio tokens per s, 20 output audio tokens per s."""
        in_audio = int(self._input_total_ms // 100)
        in_text = 10 + len(str(self._session.get("instructions") or "").split())
        out_audio, out_text = int(r.audio_ms // 50), len(r.words)
        usage = {
            "total_tokens": in_audio + in_text + out_audio + out_text,
            "input_tokens": in_audio + in_text,
            "output_tokens": out_audio + out_text,
        }
        if self.dialect.usage == "tokens":
            cached = {"text_tokens": 0, "audio_tokens": 0, "image_tokens": 0}
            details = {
                "text_tokens": in_text,
                "audio_tokens": in_audio,
                "image_tokens": 0,
                "cached_tokens": 0,
            }
            return {
                **usage,
                "input_token_details": {**details, "cached_tokens_details": cached},
                "output_token_details": {"text_tokens": out_text, "audio_tokens": out_audio},
            }
        return {
            **usage,
            "input_token_details": {"grok_tokens": in_audio + in_text},
            "output_token_details": {"grok_tokens": out_audio + out_text},
            "billable_audio_seconds": round(self._input_total_ms / 1000, 3),
        }


def _unsupported(core: RealtimeFamilyConnection, event: dict[str, Any], now: int) -> None:
    """A client event the dialect does not take (after its members were checked)."""
    raise ClientError("unsupported_event", f"The event type '{event['type']}' is not supported.", "type")


_C = RealtimeFamilyConnection
# Client event type -> its handler, allowed keys besides type/event_id, required keys. providers.md §1.4.
_ITEM_ID = ("item_id",)
_TRUNCATE = ("item_id", "content_index", "audio_end_ms")
_CLIENT_EVENTS: dict[str, ClientEvent] = {
    "session.update": ClientEvent(_C._on_session_update, ("session",), ("session",)),
    "input_audio_buffer.append": ClientEvent(_C._on_append, ("audio",), ("audio",)),
    "input_audio_buffer.commit": ClientEvent(_C._on_commit),
    "input_audio_buffer.clear": ClientEvent(_C._on_clear),
    "conversation.item.create": ClientEvent(_C._on_item_create, ("item", "previous_item_id"), ("item",)),
    "conversation.item.truncate": ClientEvent(_C._on_truncate, _TRUNCATE, _TRUNCATE),
    "conversation.item.delete": ClientEvent(_C._on_delete, _ITEM_ID, _ITEM_ID),
    "conversation.item.retrieve": ClientEvent(_C._on_retrieve, _ITEM_ID, _ITEM_ID),
    "response.create": ClientEvent(_C._on_response_create, ("response",)),
    "response.cancel": ClientEvent(_C._on_response_cancel, ("response_id",)),
    "output_audio_buffer.clear": ClientEvent(_C._on_output_audio_buffer_clear),
}


# -- the shell ----------------------------------------------------------------------------------------------


def dialect_server(dialect: Dialect, authorize: Authorize) -> Callable[..., FakeServer]:
    """A dialect module's `server()` (kit_openai.fake_server): any path ending in `/realtime`; the `?model=` query
    and an `OpenAI-Beta` header reach the core."""

    def connect(
        options: RealtimeFakeOptions | None, script: Script | None, ctx: ConnectionContext
    ) -> RealtimeFamilyConnection:
        model = next(iter(parse_qs(urlsplit(ctx.request.path).query).get("model", ())), None)
        try:
            beta = ctx.request.headers.get("OpenAI-Beta") is not None
        except Exception:  # a repeated header is still a beta header
            beta = True
        return RealtimeFamilyConnection(
            dialect, options, script=script, model=model, beta_header=beta, **context_args(ctx)
        )

    return fake_server(dialect.name, "/v1/realtime", authorize, connect)
