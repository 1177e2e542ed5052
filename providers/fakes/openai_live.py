"""A faithful fake of OpenAI's GPT-Live WebSocket (`/v1/live/sessions`): scripted turns, delegations and faults.

Two layers, in the aioquic shape:

* `LiveFakeConnection` is the sans-I/O protocol core for one connection. It never touches a socket or a clock.
  Drivers: `receive_message(data, now)`, `handle_timer(now)`, `inject(fault, now)` and `connection_lost(code)`.
  Outputs are pulled: `frames_to_send()` (text frames) and `close_to_send()`; `next_deadline()` gives the
  absolute `now` (monotonic int ns) at which `handle_timer` must run. Peer input never raises: it becomes an
  `error` event.
* `serve()` runs it in the shared fake shell (providers/fakes/server.py): HTTP checks, one loop per
  connection that feeds frames and the single timer, writes what the core pulls, runtime fault injection
  (`FakeServer.inject`, `GET /_fault?spec=`), and an optional JSONL record.

Wire shapes follow openai 3.57.0 `openai/types/live/` (the authoritative schema).

The model. The echo model (`echo.py`, with `speak=False`) only *detects* caller utterances here. The N-th
utterance is answered by `options.script.turn(N)` (providers/fakes/script.py):
`echo` speaks the utterance's exact client bytes back, `tone` a sine of `frequency_hz` for `duration_ms`,
`silence` digital silence for `duration_ms`, all in the session's audio format. One speaker plays every reply
in order (FIFO) on one paced timeline: chunk n (`chunk_ms` of audio) of a reply that starts at t0 is due when
the reply's media clock, which starts at `lead_ms` and runs at the current speed (1, or F under `burst:F`),
reaches n·chunk_ms; without faults that is max(t0, t0 + n·chunk_ms - lead_ms), as the echo model paces.
A reply starts when it is ready and the previous one has ended (its media clock reached its length).

Delegation (GPT-Live's tool calls). A turn with `tool_call` first emits `session.delegation.created` with a fresh
`del_...` id, target `client` and `offset_ms`; the tool's name and arguments go nowhere on the wire (GPT-Live
delegations carry no task text; tests read them from `LiveFakeConnection.delegations`). The turn's reply waits
until the client sends `session.commentary.append` (spoken) or `session.thinking.append` (silent) with that
`delegation_id`; replies behind it wait too. Both appends are acknowledged (`*.appended`, start_ms = end_ms =
the input position), also when `delegation_id` is null (session-wide context) or names a delegation already
answered (more context; no second reply). A non-null id the session never issued is `unknown_delegation`.

Choices where the real service is undocumented, all deliberate:

* Error codes: `session_not_started`, `session_already_started`, `unknown_parameter`, `missing_required_parameter`,
  `invalid_type`, `invalid_value`, `invalid_json`, `invalid_event_type`, `unknown_delegation`,
  `unsupported_by_fake`. `param` is a dotted path; `error.client_event_id` echoes the client's `event_id` (as
  does the top-level `client_event_id`).
* Known GPT-Live client events the fake does not model (session.update, mute/unmute, instructions append,
  fixture play, decision.*, response.*, transport.dtmf.send) get `unsupported_by_fake`, so a client relying on
  them fails loudly instead of silently.
* `session.start` checks every key it knows and shape-checks `client`, `input` and `triggers` only shallowly;
  delegation other than `client` is `unsupported_by_fake`; `acknowledgement_delay_ms` is echoed, not modelled.
  A failed start can be retried. Until `session.started` is sent (see `slow_handshake`) the session has not
  started: other client events get `session_not_started`.
* Every timeline (transcripts, `offset_ms`, `*.appended`) is input-audio ms since `session.started` (bytes, not
  clocks). An input transcript covers the echoed (padded) span; an output transcript starts at the input
  position when its reply starts (or where the previous reply ended) and lasts as long as the reply. Output
  transcripts: the turn's `transcript`, else `[echo N, X.X s]` / `[tone N, X.X s]` with N the utterance number;
  a silence turn has none unless the turn gives one.
* Usage is whole seconds of session time (`now` since `session.started`) as a float, every `usage_interval_ms`.
* The session ends with `session.closed` then a close frame with code 1000: on `session.close` (reason
  `close_requested`), after `session_length_ms` or on the `close` fault (reason `expired`). GPT-Live's real close
  code is undocumented; 1000 is a guess.
* At most `max_queued` replies wait; the utterances beyond are transcribed but not answered (`dropped`).
* Frames after the core asked to close are recorded but otherwise ignored.

Faults (providers/fakes/faults.py), from the options or `ConnectionContext.faults` (armed when `session.start`
arrives: their @AFTER_MS counts from then) or `inject(fault, now)` (counted from `now`, also before the session
starts). A fault is appended to `record.faults` when it fires. What each does here:

* `burst:F`        every reply's media clock runs F times faster from the moment it fires (lasts).
* `stall:MS`       every outbound frame is held for MS, then all are sent at once; pacing runs on meanwhile, so the
                   dump holds everything that became due. A graceful close ends a stall early (dump, then close).
* `half_open`      nothing more is sent, not even a close frame; client frames are still recorded but not
                   answered, and the model stops. Only `abrupt_close` still acts (it sends nothing).
* `close`          `session.closed` reason `expired` with the final usage, then close 1000 (before
                   `session.started`: just the close frame).
* `abrupt_close`   `CloseRequest(1006, abrupt=True)`: the shell drops TCP without a close frame; held frames are lost.
* `garbage_json`   one text frame that is not JSON (a truncated audio delta).
* `invalid_audio`  one extra `session.output_audio.delta` whose `delta` is not base64 (strict or lenient).
* `duplicate_tool_call` from then on every `session.delegation.created` is sent twice: same delegation id, each
                   with its own `event_id` (so only deduplication by delegation id works).
* `slow_handshake:MS` `session.started` is sent MS after `session.start` arrives; the session (usage, expiry,
                   audio) starts then. Fired after the session started, it has no effect.
* `refuse`         handled by the shell (HTTP 503); the core ignores it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from providers.fakes.connection import FakeCore, parse_client
from providers.fakes.echo import EchoModel, EchoOptions, MediaClock, Utterance, UtteranceDetected, codec
from providers.fakes.faults import Fault, FaultKind, FaultSchedule
from providers.fakes.schema import (
    Bool,
    ClientError,
    Int,
    ListOf,
    Nullable,
    Obj,
    Str,
    members,
    validate,
)
from providers.fakes.script import Script, ToolCallScript, Turn, label
from providers.fakes.server import (
    ClientFrameRecord,
    CloseRequest,
    ConnectionContext,
    ConnectionRecord,
    FakeServer,
    IdSource,
    SequentialIds,
    bearer_authorize,
    exact_member,
    serving,
)
from rtp.audio import PCM16_16K, PCM16_24K, PCMA_8K, PCMU_8K, AudioFormat
from rtp.units import NS_PER_MS, NS_PER_S

__all__ = [
    "LiveFakeOptions",
    "ClientFrameRecord",
    "ConnectionRecord",
    "CloseRequest",
    "DelegationRecord",
    "IdSource",
    "SequentialIds",
    "LiveFakeConnection",
    "LiveFakeServer",
    "serve",
    "server",
]

_TONE_AMPLITUDE = 0.3  # of full scale: about -10 dBFS peak, clearly voiced, far from clipping
_GARBAGE_FRAME = '{"type":"session.output_audio.delta","delta":"AAAA'  # a truncated frame: not JSON
# The hot frames, as json.dumps(..., separators=(",", ":")) writes them and the bridge's adapter sends them.
_APPEND_HEAD = '{"type":"session.input_audio.append","audio":"'
_DELTA_HEAD = '{"type":"session.output_audio.delta","delta":"'
_STRING_TAIL = '"}'
_NOT_JSON = "The client event is not valid JSON."
_BAD_BASE64 = "@@not base64@@"  # rejected by strict decoding, and by lenient decoding (9 data characters)

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
    lead_ms: int = 200
    """GPT-Live paces its output near real time, a little ahead: the first 200 ms of a reply go at once, so the
    client has a small store against network jitter (a guess; the real lead is undocumented)."""
    max_queued: int = 32
    usage_interval_ms: int = 15_000
    session_length_ms: int = 60 * 60 * 1000
    """GPT-Live's real limit is undocumented; 60 min like Realtime. Sets `expires_at` and the `expired` close."""
    default_voice: str = "marin"
    record_client_frames: bool = True
    """Keep every client frame in `ConnectionRecord.client_frames`; turn off for long in-process calls."""
    script: Script = Script()
    """How each caller utterance is answered; the default echoes every one."""

    def __post_init__(self) -> None:
        if self.usage_interval_ms <= 0 or self.session_length_ms <= 0:
            raise ValueError("usage_interval_ms and session_length_ms must be positive")
        self.echo_options()  # validates the echo knobs (chunk_ms, lead_ms, max_queued, ...)

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


@dataclass(slots=True)
class DelegationRecord:
    """A delegation the fake model made (what a test may check; none of it but `id` is on the wire)."""

    id: str
    utterance: int
    tool_call: ToolCallScript
    created_at: int
    answered_at: int | None = None
    answers: list[str] = field(default_factory=list)
    """Client event types that named this delegation, in order (`session.commentary.append`, ...)."""


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
    {
        "model",
        "audio",
        "client",
        "delegation",
        "input",
        "instructions",
        "safety_identifier",
        "store",
        "triggers",
    }
)
_UNMODELLED = frozenset(
    {
        "session.update",
        "session.input_audio.mute",
        "session.input_audio.unmute",
        "session.output_audio.fixture.play",
        "session.instructions.append",
        "decision.create",
        "decision.item.create",
        "decision.item.delete",
        "response.item.create",
        "response.create",
        "transport.dtmf.send",
    }
)


def _validate_audio(audio: Any) -> dict[str, Any]:
    """Resolve `session.audio` to the format and voice the session will use."""
    validate(members({"format", "output"}), audio, "session.audio")
    fmt = audio.get("format", _DEFAULT_FORMAT)
    validate(members({"type", "rate"}, ("type", "rate")), fmt, "session.audio.format")
    validate(Str(), fmt["type"], "session.audio.format.type")
    if fmt["type"] not in _FORMAT_TYPES:
        raise ClientError(
            "invalid_value",
            f"Invalid value: '{fmt['type']}'. Supported values are: 'audio/pcm', 'audio/pcmu', and 'audio/pcma'.",
            "session.audio.format.type",
        )
    validate(Int(), fmt["rate"], "session.audio.format.rate")
    if (fmt["type"], fmt["rate"]) not in _FORMATS:
        supported = "16000 or 24000" if fmt["type"] == "audio/pcm" else "8000"
        raise ClientError(
            "invalid_value",
            f"Invalid value: {fmt['rate']}. '{fmt['type']}' supports a rate of {supported}.",
            "session.audio.format.rate",
        )
    voice: Any = None
    if "output" in audio:
        output = audio["output"]
        validate(members({"voice"}), output, "session.audio.output")
        voice = output.get("voice")
        if isinstance(voice, dict):
            validate(members({"id"}, ("id",)), voice, "session.audio.output.voice")
            validate(Str(), voice["id"], "session.audio.output.voice.id")
        elif voice is not None:
            validate(Str(), voice, "session.audio.output.voice")
            if not voice:
                message = "Invalid value: ''. Voice must not be empty."
                raise ClientError("invalid_value", message, "session.audio.output.voice")
    return {"format": {"type": fmt["type"], "rate": fmt["rate"]}, "voice": voice}


def _validate_delegation(delegation: Any) -> dict[str, Any]:
    if delegation is None:
        return {"type": "client", "acknowledgement_delay_ms": 0}
    validate(Obj(open=True), delegation, "session.delegation")
    if "type" not in delegation:
        message = "Missing required parameter: 'session.delegation.type'."
        raise ClientError("missing_required_parameter", message, "session.delegation.type")
    kind = delegation["type"]
    if kind in ("responses", "decisions"):
        message = f"The fake does not model '{kind}' delegation."
        raise ClientError("unsupported_by_fake", message, "session.delegation.type")
    if kind != "client":
        raise ClientError(
            "invalid_value",
            f"Invalid value: {json.dumps(kind)}. Supported values are: 'client', 'responses', and 'decisions'.",
            "session.delegation.type",
        )
    validate(members({"type", "acknowledgement_delay_ms"}), delegation, "session.delegation")
    delay = delegation.get("acknowledgement_delay_ms", 0)
    validate(Int(), delay, "session.delegation.acknowledgement_delay_ms")
    if delay < 0:
        message = f"Invalid value: {delay}. Must be >= 0."
        raise ClientError("invalid_value", message, "session.delegation.acknowledgement_delay_ms")
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
    validate(members(_SESSION_KEYS, ("model",)), session, "session")
    validate(Str(), session["model"], "session.model")
    if not session["model"]:
        raise ClientError(
            "invalid_value", "Invalid value: ''. 'session.model' must not be empty.", "session.model"
        )
    for key in ("instructions", "safety_identifier"):
        validate(Nullable(Str()), session.get(key), f"session.{key}")
    if "store" in session:
        validate(Bool(), session["store"], "session.store")
    if "client" in session:
        client = session["client"]
        validate(members({"data_channel"}, ("data_channel",)), client, "session.client")
        allowed = {"allowed_client_events", "allowed_server_events"}
        validate(members(allowed), client["data_channel"], "session.client.data_channel")
    for key in ("input", "triggers"):
        if key in session:
            validate(ListOf(Obj(open=True)), session[key], f"session.{key}")
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


# -- the speaker: scripted replies on one paced timeline ------------------------------------------------------

_CONTEXT_EVENTS = ("session.commentary.append", "session.thinking.append")
_APPEND_KEYS = frozenset({"type", "event_id", "audio"})


def _detector_options(options: LiveFakeOptions) -> EchoOptions:
    """The echo model as a pure utterance detector (`speak=False`): it never queues, plays or asks for a timer."""
    return dataclasses.replace(options.echo_options(), speak=False)


def _tone_pcm(frequency_hz: float, rate: int, first: int, count: int) -> bytes:
    """Samples [first, first + count) of a sine starting at phase 0, as PCM16LE (chunks join seamlessly)."""
    n = np.arange(first, first + count, dtype=np.float64)
    wave = np.round(_TONE_AMPLITUDE * 32767 * np.sin(2 * np.pi * frequency_hz * n / rate))
    return wave.astype("<i2").tobytes()


@dataclass(slots=True)
class _Reply:
    """The answer to one utterance, waiting in the speaker's queue; `ready_at` is None while its delegation is open."""

    number: int  # the utterance it answers (1-based)
    turn: Turn
    utterance: Utterance
    ready_at: int | None
    delegation_id: str | None = None


@dataclass(slots=True)
class _Playout:
    """A reply being spoken on its media clock (echo.py; a burst rebases it, so the chunks already due keep their
    times)."""

    reply: _Reply
    length: int  # bytes in the session's format
    length_ns: int
    clock: MediaClock
    n: int = 0
    sent: int = 0


# -- the sans-I/O core --------------------------------------------------------------------------------------


class LiveFakeConnection(FakeCore):
    """One GPT-Live WebSocket connection, server side, with the scripted model and the faults behind it.

    `unix_time` is the wall clock (seconds) at `now`; it only feeds `expires_at`, so the core stays clock-free.
    `faults` are armed when `session.start` arrives (their @AFTER_MS counts from then); `index` is 0-based.
    """

    append_type = "session.input_audio.append"
    garbage = _GARBAGE_FRAME

    def __init__(
        self,
        options: LiveFakeOptions | None = None,
        *,
        now: int,
        unix_time: int,
        ids: IdSource | None = None,
        index: int = 0,
        faults: Sequence[Fault] = (),
    ) -> None:
        self.options = options or LiveFakeOptions()
        super().__init__(index, ids, self.options.record_client_frames)
        self._created_now = now
        self._unix_time = unix_time
        self._config: _SessionConfig | None = None
        self._start_event_id: str | None = None
        self._announce_at: int | None = None  # when session.started is due (slow_handshake)
        self._resource: dict[str, Any] | None = None
        self._started_at = 0
        self._echo: EchoModel | None = None
        self._decode: Callable[[bytes], bytes] = bytes
        self._encode: Callable[[bytes], bytes] = bytes
        self._carry = b""  # odd trailing byte of PCM16 input, completed by the next append
        self._pcm16 = False  # the session's audio is PCM16 (two bytes a sample)
        self._next_usage: int | None = None
        self._expires: int | None = None
        self._utterance_no = 0
        # the speaker
        self._replies: deque[_Reply] = deque()
        self._playout: _Playout | None = None
        self._free_at = 0  # when the last reply's media clock reached its end
        self._out_end_ms = 0  # where the last output transcript ended on the input timeline
        self._chunk_ns = self.options.chunk_ms * NS_PER_MS
        self._lead_ns = self.options.lead_ms * NS_PER_MS
        self._chunk_bytes = 1
        self.delegations: dict[str, DelegationRecord] = {}
        self.dropped = 0
        """Utterances left unanswered because `max_queued` replies were already waiting."""
        # faults
        self._schedule = FaultSchedule([], index + 1, now)
        self._armed = tuple(f for f in faults if f.kind is not FaultKind.REFUSE)  # added at session.start
        self._speed = 1.0
        self._stall_until: int | None = None  # while set, frames are held (connection.py)
        self._duplicate = False
        self._slow_handshake_ms = 0.0
        self._next_due: int | None = None  # next_deadline(), as the last driver left it (none yet)

    # -- drivers --------------------------------------------------------------------------------------------

    def receive_message(self, data: str | bytes, now: int) -> None:
        """Handle one client WebSocket message. Never raises for bad peer input."""
        if self._next_due is not None and self._next_due <= now:  # before it, _advance would do nothing
            self._advance(now)
        raw: str | None = None
        self._audio_bytes = None
        answering = not self._closing and not self._half_open
        audio = exact_member(data, _APPEND_HEAD, _STRING_TAIL) if isinstance(data, str) else None
        frame: dict[str, Any] | None = None
        try:
            if audio is not None:  # what json.loads gives, without parsing
                frame = {"type": "session.input_audio.append", "audio": audio}
                if answering and self._resource is not None:
                    # An append of a started session, whose shape _dispatch and _on_audio_append would check:
                    # a string type and audio, no other key. Straight to the audio.
                    self._append_audio(audio, now)
                    return
            else:
                frame, raw, is_json = parse_client(data)
                if frame is None:
                    if answering:
                        message = "A client event must be a JSON object." if is_json else _NOT_JSON
                        raise ClientError("invalid_json", message)
                    return
            if answering:
                self._dispatch(frame, now)
        except ClientError as exc:
            client_event_id = frame.get("event_id") if frame is not None else None
            self._error(
                exc.code,
                exc.message,
                exc.param,
                client_event_id if isinstance(client_event_id, str) else None,
            )
        finally:
            self._received(now, frame, raw)
            self._next_due = self._compute_deadline()

    def handle_timer(self, now: int) -> None:
        """Run everything due at or before `now`: faults, the handshake, reply chunks, usage snapshots, expiry."""
        self._advance(now)
        self._next_due = self._compute_deadline()

    def connection_lost(self, code: int | None, now: int | None = None) -> None:
        super().connection_lost(code, now)
        self._next_due = None

    def inject(self, fault: Fault, now: int) -> None:
        """Schedule a fault at runtime: it fires at `now` + its AFTER_MS (see providers/fakes/faults.py)."""
        if not self._closing and fault.kind is not FaultKind.REFUSE:
            self._schedule.add(fault, now)
            self._next_due = self._compute_deadline()

    # -- outputs --------------------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        return self._next_due

    def _compute_deadline(self) -> int | None:
        """The next deadline, kept in `_next_due` at the end of every driver (they alone change it)."""
        if self._closing:
            return None
        due = self._fault_deadline()
        if self._half_open:
            return due
        for t in (self._announce_at, self._speaker_deadline() if self._resource is not None else None):
            if t is not None and (due is None or t < due):
                due = t
        if self._resource is not None:  # both set when the session started
            assert self._next_usage is not None and self._expires is not None
            t = min(self._next_usage, self._expires)
            if due is None or t < due:
                due = t
        return due

    @property
    def started(self) -> bool:
        """`session.started` has been sent."""
        return self._resource is not None

    @property
    def audio_format(self) -> AudioFormat | None:
        return self._config.fmt if self._config else None

    @property
    def echo(self) -> EchoModel | None:
        """The echo model used as the utterance detector (after session.started), for introspection in tests."""
        return self._echo

    @property
    def queued(self) -> int:
        """Replies waiting behind the one being spoken (including those waiting for their delegation)."""
        return len(self._replies)

    # -- time -----------------------------------------------------------------------------------------------

    def _advance(self, now: int) -> None:
        """Bring the model up to `now`, firing faults at their own times so each one splits the timeline."""
        while not self._closing:
            at = self._fault_deadline()
            if at is None or at > now:
                break
            self._run(at)
            if not self._closing:
                self._faults_at(at)
        if not self._closing:
            self._run(now)

    def _run(self, now: int) -> None:
        """The model's own timers up to `now` (faults excluded)."""
        if self._half_open or self._closing:
            return
        if self._announce_at is not None and now >= self._announce_at:
            self._announce(self._announce_at)
        if self._resource is None:
            return
        assert self._expires is not None and self._next_usage is not None
        if now >= self._expires:
            self._finish("expired", now, None)
            return
        self._speak(now)
        if now >= self._next_usage:
            self._emit(
                {
                    "type": "session.usage.updated",
                    "event_id": self._ids.new("event"),
                    "usage": self._usage(now),
                }
            )
            interval = self.options.usage_interval_ms * NS_PER_MS
            k = (now - self._started_at) // interval + 1
            self._next_usage = self._started_at + k * interval

    # -- faults ---------------------------------------------------------------------------------------------

    def _fault_deadline(self) -> int | None:
        due, stall = self._schedule.next_deadline(), self._stall_until
        if stall is None:
            return due
        return stall if due is None else min(due, stall)

    def _faults_at(self, now: int) -> None:
        """Fire what the schedule has due at `now`, then end a stall whose time is up."""
        for fault in self._schedule.due(now):
            self._fault(fault, now)
            if self._closing:
                return
        self._schedule.active(FaultKind.STALL, now)  # lets the schedule forget a stall that has ended
        if self._stall_until is not None and now >= self._stall_until:
            self._end_stall()

    def _on_fault(self, fault: Fault, now: int) -> None:
        kind = fault.kind
        if kind is FaultKind.BURST:
            self._set_speed(fault.value if fault.value and fault.value > 0 else 1.0, now)
        elif kind is FaultKind.STALL:
            self._stall_until = self._schedule.stall_ends()
        elif kind is FaultKind.HALF_OPEN:
            self._stall_until = None
        elif kind is FaultKind.CLOSE:
            if self._resource is not None:
                self._finish("expired", now, None)
            else:
                self._close_with(CloseRequest(1000))
        elif kind is FaultKind.INVALID_AUDIO:
            # No event_id on the primary WebSocket (OutputAudioDeltaEvent).
            self._emit({"type": "session.output_audio.delta", "delta": _BAD_BASE64})
        elif kind is FaultKind.DUPLICATE_TOOL_CALL:
            self._duplicate = True
        elif kind is FaultKind.SLOW_HANDSHAKE:
            if self._resource is None and self._announce_at is None:  # only a start not yet answered
                self._slow_handshake_ms = fault.value or 0.0

    def _set_speed(self, speed: float, now: int) -> None:
        p = self._playout
        if p is not None:
            p.clock.rebase(now, speed)
        self._speed = speed

    def _end_stall(self) -> None:
        self._stall_until = None
        self._release()

    # -- client events --------------------------------------------------------------------------------------

    def _dispatch(self, event: dict[str, Any], now: int) -> None:
        if "type" not in event:
            raise ClientError("missing_required_parameter", "Missing required parameter: 'type'.", "type")
        kind = event["type"]
        validate(Str(), kind, "type")
        if "event_id" in event and event["event_id"] is not None:
            validate(Str(), event["event_id"], "event_id")
        if kind == "session.start":
            self._on_session_start(event, now)
        elif kind == "session.input_audio.append":
            self._require_started()
            self._on_audio_append(event, now)
        elif kind in _CONTEXT_EVENTS:
            self._require_started()
            self._on_context_append(event, kind, now)
        elif kind == "session.close":
            self._require_started()
            validate(members({"type", "event_id"}), event, "")
            self._finish("close_requested", now, event.get("event_id"))
        elif kind in _UNMODELLED:
            self._require_started()
            raise ClientError(
                "unsupported_by_fake", f"The fake GPT-Live server does not model '{kind}'.", "type"
            )
        else:
            raise ClientError(
                "invalid_event_type", f"Invalid value: '{kind}'. Unknown client event type.", "type"
            )

    def _require_started(self) -> None:
        if self._resource is None:
            raise ClientError(
                "session_not_started", "Send 'session.start' and wait for 'session.started' first."
            )

    def _on_session_start(self, event: dict[str, Any], now: int) -> None:
        if self._config is not None:
            raise ClientError("session_already_started", "The session has already started.")
        validate(members({"type", "event_id", "session"}, ("session",)), event, "")
        self._config = _validate_session(event["session"])
        self._start_event_id = event.get("event_id")
        for fault in self._armed:
            self._schedule.add(fault, now)
        self._armed = ()
        fired = self._schedule.due(now)
        for fault in fired:  # a slow handshake must be known before session.started can be sent
            if fault.kind is FaultKind.SLOW_HANDSHAKE:
                self._fault(fault, now)
        self._announce_at = now + int(self._slow_handshake_ms * NS_PER_MS)
        if self._slow_handshake_ms <= 0:
            self._announce(now)
        for fault in fired:
            if fault.kind is not FaultKind.SLOW_HANDSHAKE and not self._closing:
                self._fault(fault, now)

    def _announce(self, now: int) -> None:
        """The session starts: send `session.started` and start its clocks."""
        config = self._config
        assert config is not None
        self._announce_at = None
        self._started_at = now
        self._echo = EchoModel(config.fmt.rate, config.fmt.sample_width, _detector_options(self.options))
        self._decode, self._encode = codec(config.fmt.encoding)
        self._chunk_bytes = max(1, config.fmt.rate * self.options.chunk_ms // 1000) * config.fmt.sample_width
        self._pcm16 = config.fmt.sample_width == 2
        self._next_usage = now + self.options.usage_interval_ms * NS_PER_MS
        self._expires = now + self.options.session_length_ms * NS_PER_MS
        session_id = self._ids.new("sess")
        self.record.session_id = session_id
        expires_at = (
            self._unix_time + (now - self._created_now) // NS_PER_S + self.options.session_length_ms // 1000
        )
        resource: dict[str, Any] = {
            "id": session_id,
            "expires_at": expires_at,
            "model": config.model,
            "status": "active",
            "audio": {
                "format": config.format_json,
                "output": {"voice": config.voice or self.options.default_voice},
            },
            "instructions": config.instructions,
            "delegation": config.delegation,
            "store": config.store,
        }
        if config.safety_identifier is not None:
            resource["safety_identifier"] = config.safety_identifier
        self._resource = resource
        started: dict[str, Any] = {
            "type": "session.started",
            "event_id": self._ids.new("event"),
            "session": resource,
        }
        if isinstance(self._start_event_id, str):
            started["client_event_id"] = self._start_event_id
        self._emit(started)

    def _on_audio_append(self, event: dict[str, Any], now: int) -> None:
        validate(members(_APPEND_KEYS, ("audio",)), event, "")
        validate(Str(), event["audio"], "audio")
        self._append_audio(event["audio"], now)

    def _append_audio(self, audio: str, now: int) -> None:
        """A valid append's audio (base64) to the detector."""
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            message = "Invalid value for 'audio': expected base64-encoded audio."
            raise ClientError("invalid_value", message, "audio") from None
        self._audio_bytes = len(raw)
        assert self._echo is not None and self._config is not None
        if self._pcm16:
            raw = self._carry + raw
            whole = len(raw) & ~1
            raw, self._carry = raw[:whole], raw[whole:]
        if raw:
            self._echo.receive_audio(raw, self._decode(raw), now)
            self._drain_detector()
            self._speak(now)

    def _on_context_append(self, event: dict[str, Any], kind: str, now: int) -> None:
        """`session.commentary.append` / `session.thinking.append` (CommentaryAppendEventParam and its twin)."""
        validate(
            members({"type", "event_id", "content", "delegation_id"}, ("content", "delegation_id")), event, ""
        )
        validate(Str(), event["content"], "content")
        delegation_id = event["delegation_id"]
        delegation: DelegationRecord | None = None
        if delegation_id is not None:
            validate(Str(), delegation_id, "delegation_id")
            delegation = self.delegations.get(delegation_id)
            if delegation is None:
                message = (
                    f"Unknown delegation: '{delegation_id}'. Use an id from 'session.delegation.created'."
                )
                raise ClientError("unknown_delegation", message, "delegation_id")
        position = self._position_ms()
        appended = {
            "type": kind.removesuffix("append") + "appended",
            "event_id": self._ids.new("event"),
            "start_ms": position,
            "end_ms": position,
        }
        self._emit(self._reply(appended, event))
        if delegation is None:
            return  # session-wide context: acknowledged, nothing waits for it
        delegation.answers.append(kind)
        if delegation.answered_at is None:
            delegation.answered_at = now
            for reply in self._replies:
                if reply.delegation_id == delegation.id:
                    reply.ready_at = now
            self._speak(now)

    # -- the model ------------------------------------------------------------------------------------------

    def _position_ms(self) -> int:
        return self._echo.position_ms if self._echo is not None else 0

    def _drain_detector(self) -> None:
        assert self._echo is not None
        while (ev := self._echo.next_event()) is not None:
            if isinstance(
                ev, UtteranceDetected
            ):  # the only event a non-speaking detector without starts emits
                self._on_utterance(ev.utterance, ev.at)

    def _on_utterance(self, u: Utterance, now: int) -> None:
        self._utterance_no += 1
        number = self._utterance_no
        text = label("utterance", number, u.duration_ms / 1000)
        self._emit(
            {
                "type": "session.input_transcript.delta",
                "event_id": self._ids.new("event"),
                "delta": text,
                "start_ms": u.start_ms,
                "end_ms": u.end_ms,
            }
        )
        self._heard(now, str(number), number, u.duration_ms / 1000, u.duration_ms)
        if len(self._replies) >= self.options.max_queued:
            self.dropped += 1
            return
        turn = self.options.script.turn(number)
        reply = _Reply(number, turn, u, now)
        if turn.tool_call is not None:
            delegation_id = self._ids.new("del")
            self.delegations[delegation_id] = DelegationRecord(delegation_id, number, turn.tool_call, now)
            reply.ready_at, reply.delegation_id = None, delegation_id
            deliveries = 2 if self._duplicate else 1
            self._answers(now, turn, str(number), "audio", delegation_id)
            for _ in range(deliveries):
                # GPT-Live delegations carry no task text: the tool's name and arguments stay in the fake.
                self._emit(
                    {
                        "type": "session.delegation.created",
                        "event_id": self._ids.new("event"),
                        "delegation": {"id": delegation_id, "type": "delegation", "target": "client"},
                        "offset_ms": self._position_ms(),
                    }
                )
        else:
            self._answers(now, turn, str(number), "audio")
        self._replies.append(reply)

    def _speaker_deadline(self) -> int | None:
        if self._playout is not None:
            return self._due(self._playout)
        if self._replies and self._replies[0].ready_at is not None:
            return max(self._replies[0].ready_at, self._free_at)
        return None

    def _due(self, p: _Playout) -> int:
        """When chunk `p.n` is due: the media clock reaches n·chunk_ms."""
        return p.clock.due(p.n * self._chunk_ns)

    def _speak(self, now: int) -> None:
        """Hand out every reply chunk due at or before `now`, starting queued replies in order."""
        while True:
            p = self._playout
            if p is None:
                head = self._replies[0] if self._replies else None
                if head is None or head.ready_at is None:
                    return
                t0 = max(head.ready_at, self._free_at)
                if t0 > now:
                    return
                self._replies.popleft()
                p = self._playout = self._start(head, t0)
            while p.sent < p.length:
                due = self._due(p)
                if due > now:
                    return
                end = min(p.length, p.sent + self._chunk_bytes)
                data = self._audio(p.reply, p.sent, end)
                # No event_id on the primary WebSocket (OutputAudioDeltaEvent). Byte for byte what _emit writes
                # (base64 needs no JSON escaping), without json.dumps.
                self._send(
                    _DELTA_HEAD + binascii.b2a_base64(data, newline=False).decode("ascii") + _STRING_TAIL
                )
                p.sent = end
                p.n += 1
            self._free_at = p.clock.due(self._lead_ns + p.length_ns)  # its media clock reached its end
            self._playout = None

    def _start(self, reply: _Reply, t0: int) -> _Playout:
        """A reply starts speaking at t0: its output transcript, then a playout on the current speed."""
        assert self._config is not None
        fmt = self._config.fmt
        turn = reply.turn
        if turn.reply == "echo":
            length, duration_ms = len(reply.utterance.audio), reply.utterance.duration_ms
        else:
            length, duration_ms = (
                fmt.rate * turn.duration_ms // 1000 * fmt.sample_width,
                float(turn.duration_ms),
            )
        start_ms = max(self._position_ms(), self._out_end_ms)
        self._out_end_ms = start_ms + math.ceil(duration_ms)
        text = turn.transcript
        if text is None and turn.reply != "silence":
            text = label(turn.reply, reply.number, duration_ms / 1000)
        if text is not None:
            self._emit(
                {
                    "type": "session.output_transcript.delta",
                    "event_id": self._ids.new("event"),
                    "delta": text,
                    "start_ms": start_ms,
                    "end_ms": self._out_end_ms,
                }
            )
        length_ns = length * NS_PER_S // (fmt.rate * fmt.sample_width)
        return _Playout(reply, length, length_ns, MediaClock(t0, float(self._lead_ns), self._speed))

    def _audio(self, reply: _Reply, start: int, end: int) -> bytes:
        """Bytes [start, end) of a reply in the session's format."""
        if reply.turn.reply == "echo":
            return reply.utterance.audio[start:end]
        assert self._config is not None
        width = self._config.fmt.sample_width
        first, count = start // width, (end - start) // width
        if reply.turn.reply == "tone":
            return self._encode(_tone_pcm(reply.turn.frequency_hz, self._config.fmt.rate, first, count))
        return self._encode(bytes(2 * count))

    # -- server events --------------------------------------------------------------------------------------

    def _usage(self, now: int) -> dict[str, float]:
        return {"seconds": float((now - self._started_at) // NS_PER_S)}

    def _finish(self, reason: str, now: int, client_event_id: str | None) -> None:
        assert self._resource is not None
        self._end_stall()  # a graceful end flushes what a stall held back first
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

    def _holding(self) -> bool:
        return self._stall_until is not None


# -- the shell ----------------------------------------------------------------------------------------------


def _accepts_path(path: str) -> bool:
    return path.endswith("/live/sessions")


def server(
    options: LiveFakeOptions | None = None,
    *,
    faults: Sequence[Fault] = (),
    script: Script | None = None,
    record_path: str | None = None,
) -> FakeServer:
    """A GPT-Live fake (not yet listening: `await server(...).start(host, port)`); `script` overrides the options'."""
    opts = options or LiveFakeOptions()
    if script is not None:
        opts = dataclasses.replace(opts, script=script)

    def factory(ctx: ConnectionContext) -> LiveFakeConnection:
        return LiveFakeConnection(
            opts, now=ctx.now, unix_time=ctx.unix_time, ids=ctx.ids, index=ctx.index, faults=ctx.faults
        )

    return FakeServer(
        "openai_live",
        factory,
        path="/v1/live/sessions",
        accepts_path=_accepts_path,
        authorize=bearer_authorize,
        faults=faults,
        record_path=record_path,
    )


serve = serving(server)

LiveFakeServer = FakeServer
