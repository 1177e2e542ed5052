"""A faithful fake of OpenAI's GPT-Live WebSocket (`/v1/live/sessions`): scripted turns, delegations and faults.

`LiveFakeConnection` is the sans-I/O core of one connection (a kit_openai.py `OpenAICore`), driven and pulled
as server.py says every core is; `serve()` runs it in that shared shell. Peer input never raises: it becomes an
`error` event.

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
* `half_open`, `abrupt_close`, `garbage_json` (here a truncated audio delta) and `mutate` act as in every fake
                   (connection.py): after `half_open` client frames are still recorded but not answered, and the
                   model stops.
* `close`          `session.closed` reason `expired` with the final usage, then close 1000 (before
                   `session.started`: just the close frame).
* `invalid_audio`  one extra `session.output_audio.delta` whose `delta` is not base64 (strict or lenient).
* `duplicate_tool_call` from then on every `session.delegation.created` is sent twice: same delegation id, each
                   with its own `event_id` (so only deduplication by delegation id works).
* `slow_handshake:MS` `session.started` is sent MS after `session.start` arrives; the session (usage, expiry,
                   audio) starts then. Fired after the session started, it has no effect.
* `refuse`         handled by the shell (HTTP 503); the core ignores it.
"""

from __future__ import annotations

import binascii
import dataclasses
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Unpack

from providers.fakes.connection import parse_client, soonest
from providers.fakes.echo import EchoModel, EchoOptions, MediaClock, Utterance, UtteranceDetected, codec
from providers.fakes.faults import Fault, FaultKind, FaultSchedule
from providers.fakes.kit_openai import (
    ClientEvent,
    CoreContext,
    OpenAICore,
    audio_format,
    context_args,
    decode_audio,
    fake_server,
    whole_samples,
)
from providers.fakes.schema import (
    AnyOf,
    Bool,
    ClientError,
    Int,
    ListOf,
    Nullable,
    Obj,
    Str,
    Tagged,
    members,
    validate,
)
from providers.fakes.script import Script, ToolCallScript, Turn, label
from providers.fakes.server import (
    CloseRequest,
    ConnectionContext,
    SequentialIds,
    bearer_authorize,
    exact_member,
    serving,
)
from providers.fakes.speech import Speech, turn_audio
from rtp.audio import AudioFormat
from rtp.units import NS_PER_MS, NS_PER_S

__all__ = [
    "CloseRequest",
    "DelegationRecord",
    "LiveFakeConnection",
    "LiveFakeOptions",
    "SequentialIds",
    "serve",
    "server",
]

_GARBAGE_FRAME = '{"type":"session.output_audio.delta","delta":"AAAA'  # a truncated frame: not JSON
# The hot frames, as json.dumps(..., separators=(",", ":")) writes them and the bridge's adapter sends them.
_APPEND_HEAD = '{"type":"session.input_audio.append","audio":"'
_DELTA_HEAD = '{"type":"session.output_audio.delta","delta":"'
_STRING_TAIL = '"}'
_BAD_BASE64 = "@@not base64@@"  # rejected by strict decoding, and by lenient decoding (9 data characters)

# -- options and records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LiveFakeOptions(EchoOptions):
    """Everything tunable about the fake: the echo model's knobs (echo.py), which detects the caller's utterances
    and paces the replies, and the session's."""

    lead_ms: int = 200
    """GPT-Live paces its output near real time, a little ahead: the first 200 ms of a reply go at once, so the
    client has a small store against network jitter (a guess; the real lead is undocumented)."""
    usage_interval_ms: int = 15_000
    session_length_ms: int = 60 * 60 * 1000
    """GPT-Live's real limit is undocumented; 60 min like Realtime. Sets `expires_at` and the `expired` close."""
    record_client_frames: bool = True
    """Keep every client frame in `ConnectionRecord.client_frames`; turn off for long in-process calls."""
    script: Script = Script()
    """How each caller utterance is answered; the default echoes every one."""

    def __post_init__(self) -> None:
        EchoOptions.__post_init__(self)  # (a slotted dataclass has no zero-argument super())
        if self.usage_interval_ms <= 0 or self.session_length_ms <= 0:
            raise ValueError("usage_interval_ms and session_length_ms must be positive")

    def echo_options(self) -> EchoOptions:
        """The echo model's knobs alone."""
        return EchoOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EchoOptions)})


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


# -- the session (SessionConfigParam, strictly: unknown keys anywhere are rejected, like the real service) ---

_G711 = Obj({"type": Str(), "rate": Int(choices=(8000,))}, required=("rate",))
_ANY_OBJECT = Obj(open=True)
SESSION = Obj(
    {
        "model": Str(nonempty=True),
        "audio": Obj(
            {
                "format": Tagged(
                    {
                        "audio/pcm": Obj({"type": Str(), "rate": Int(choices=(16000, 24000))}, ("rate",)),
                        "audio/pcmu": _G711,
                        "audio/pcma": _G711,
                    }
                ),
                "output": Obj(
                    {"voice": Nullable(AnyOf((Str(nonempty=True), Obj({"id": Str()}, required=("id",)))))}
                ),
            }
        ),
        "client": Obj(
            {"data_channel": members({"allowed_client_events", "allowed_server_events"})},
            required=("data_channel",),
        ),
        "delegation": Nullable(
            Tagged(
                {
                    "client": Obj({"type": Str(), "acknowledgement_delay_ms": Int(lo=0)}),
                    "responses": _ANY_OBJECT,
                    "decisions": _ANY_OBJECT,
                }
            )
        ),
        "input": ListOf(_ANY_OBJECT),
        "instructions": Nullable(Str()),
        "safety_identifier": Nullable(Str()),
        "store": Bool(),
        "triggers": ListOf(_ANY_OBJECT),
    },
    required=("model",),
)
"""`session.start`'s `session`: `client`, `input` and `triggers` are shape-checked only shallowly."""


def _session(session: dict[str, Any]) -> tuple[AudioFormat, dict[str, Any]]:
    """A valid `session.start` session: its audio format and the session resource's settings (the voice None
    when the client names none)."""
    validate(SESSION, session, "session")
    delegation = session.get("delegation") or {"type": "client"}
    if delegation["type"] != "client":
        message = f"The fake does not model '{delegation['type']}' delegation."
        raise ClientError("unsupported_by_fake", message, "session.delegation.type")
    audio = session.get("audio", {})
    fmt = audio.get("format", {"type": "audio/pcm", "rate": 24000})
    resource = {
        "model": session["model"],
        "status": "active",
        "audio": {
            "format": {"type": fmt["type"], "rate": fmt["rate"]},
            "output": {"voice": audio.get("output", {}).get("voice")},
        },
        "instructions": session.get("instructions"),
        "delegation": {
            "type": "client",
            "acknowledgement_delay_ms": delegation.get("acknowledgement_delay_ms", 0),
        },
        "store": session.get("store", False),
    }
    if session.get("safety_identifier") is not None:
        resource["safety_identifier"] = session["safety_identifier"]
    return audio_format(fmt), resource


# -- the speaker: scripted replies on one paced timeline ------------------------------------------------------


@dataclass(slots=True)
class _Reply:
    """The answer to one utterance, waiting in the speaker's queue; `ready_at` is None while its delegation is open."""

    number: int  # the utterance it answers (1-based)
    turn: Turn
    utterance: Utterance
    ready_at: int | None
    delegation_id: str | None = None


# -- the sans-I/O core --------------------------------------------------------------------------------------


class LiveFakeConnection(OpenAICore):
    """One GPT-Live WebSocket connection, server side, with the scripted model and the faults behind it.

    `unix_time` is the wall clock (seconds) at `now`; it only feeds `expires_at`, so the core stays clock-free.
    `faults` are armed when `session.start` arrives (their @AFTER_MS counts from then); `index` is 0-based.
    """

    append_type = "session.input_audio.append"
    client_event_key = "client_event_id"
    garbage = _GARBAGE_FRAME

    def __init__(self, options: LiveFakeOptions | None = None, **context: Unpack[CoreContext]) -> None:
        self.options = options or LiveFakeOptions()
        super().__init__(self.options.record_client_frames, context)
        self._fmt: AudioFormat | None = None  # the session's, once `session.start` was valid
        self._settings: dict[str, Any] = {}  # and what the session resource will say
        self._start_event_id: str | None = None
        self._announce_at: int | None = None  # when session.started is due (slow_handshake)
        self._resource: dict[str, Any] | None = None
        self._started_at = 0
        self._echo: EchoModel | None = None
        self._decode: Callable[[bytes], bytes] = bytes
        self._carry = b""  # odd trailing byte of PCM16 input, completed by the next append
        self._next_usage: int | None = None
        self._expires: int | None = None
        self._utterance_no = 0
        # the speaker
        self._replies: deque[_Reply] = deque()
        self._playout: Speech | None = None  # the reply being spoken, on its media clock (speech.py)
        self._free_at = 0  # when the last reply's media clock reached its end
        self._out_end_ms = 0  # where the last output transcript ended on the input timeline
        self._chunk_ns = self.options.chunk_ms * NS_PER_MS
        self._lead_ns = self.options.lead_ms * NS_PER_MS
        self._chunk_bytes = 1
        self.delegations: dict[str, DelegationRecord] = {}
        self.dropped = 0
        """Utterances left unanswered because `max_queued` replies were already waiting."""
        # faults
        self._schedule = FaultSchedule([], self.record.index + 1, context["now"])
        faults = context.get("faults", ())
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
        self._audio_bytes = None
        answering = not self._closing and not self._half_open
        audio = exact_member(data, _APPEND_HEAD, _STRING_TAIL) if isinstance(data, str) else None
        if audio is None:
            frame, raw, is_json = parse_client(data)
            if answering:
                self._client_frame(frame, is_json, now)
        else:  # what json.loads gives, without parsing
            frame, raw = {"type": "session.input_audio.append", "audio": audio}, None
            if answering and self._resource is not None:
                # An append of a started session, whose shape _dispatch would check: a string type and audio,
                # no other key. Straight to the audio.
                try:
                    self._append_audio(audio, now)
                except ClientError as exc:
                    self._error(exc.code, exc.message, exc.param, None)
            elif answering:
                self._client_frame(frame, True, now)
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
        if self._half_open:
            return self._fault_deadline()
        started = self._resource is not None
        speaker = self._speaker_deadline() if started else None
        return soonest(self._fault_deadline(), self._announce_at, speaker, self._next_usage, self._expires)

    @property
    def started(self) -> bool:
        """`session.started` has been sent."""
        return self._resource is not None

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
            self._event("session.usage.updated", usage=self._usage(now))
            interval = self.options.usage_interval_ms * NS_PER_MS
            k = (now - self._started_at) // interval + 1
            self._next_usage = self._started_at + k * interval

    # -- faults ---------------------------------------------------------------------------------------------

    def _fault_deadline(self) -> int | None:
        return soonest(self._schedule.next_deadline(), self._stall_until)

    def _faults_at(self, now: int) -> None:
        """Fire what the schedule has due at `now`, then end a stall whose time is up."""
        self._fire(self._schedule.due(now), now)
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
        if p is not None and p.clock is not None:
            p.clock.rebase(now, speed)
        self._speed = speed

    def _end_stall(self) -> None:
        self._stall_until = None
        self._release()

    def _holding(self) -> bool:
        return self._stall_until is not None

    # -- client events --------------------------------------------------------------------------------------

    def _admit(self, kind: str) -> None:
        if kind != "session.start":
            if self._resource is None:
                message = "Send 'session.start' and wait for 'session.started' first."
                raise ClientError("session_not_started", message)
        elif self._fmt is not None:
            raise ClientError("session_already_started", "The session has already started.")

    def _unknown_event(self, kind: str) -> ClientError:
        return ClientError(
            "invalid_event_type", f"Invalid value: '{kind}'. Unknown client event type.", "type"
        )

    def _on_session_start(self, event: dict[str, Any], now: int) -> None:
        self._fmt, self._settings = _session(event["session"])
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
        self._fire([f for f in fired if f.kind is not FaultKind.SLOW_HANDSHAKE], now)

    def _announce(self, now: int) -> None:
        """The session starts: send `session.started` and start its clocks."""
        fmt = self._fmt
        assert fmt is not None
        self._announce_at = None
        self._started_at = now
        # the echo model as a pure utterance detector: it never queues, plays or asks for a timer
        detector = dataclasses.replace(self.options.echo_options(), speak=False)
        self._echo = EchoModel(fmt.rate, fmt.sample_width, detector)
        self._decode = codec(fmt.encoding)[0]
        self._chunk_bytes = max(1, fmt.rate * self.options.chunk_ms // 1000) * fmt.sample_width
        self._next_usage = now + self.options.usage_interval_ms * NS_PER_MS
        self._expires = now + self.options.session_length_ms * NS_PER_MS
        self.record.session_id = session_id = self._ids.new("sess")
        lifetime_s = (now - self._created_now) // NS_PER_S + self.options.session_length_ms // 1000
        self._resource = {"id": session_id, "expires_at": self._unix_time + lifetime_s, **self._settings}
        output = self._resource["audio"]["output"]
        output["voice"] = output["voice"] or "marin"  # as Realtime's default session speaks
        started: dict[str, Any] = {"type": "session.started", "event_id": self._ids.new("event")}
        self._emit(self._answering({**started, "session": self._resource}, self._start_event_id))

    def _on_audio_append(self, event: dict[str, Any], now: int) -> None:
        validate(Str(), event["audio"], "audio")
        self._append_audio(event["audio"], now)

    def _append_audio(self, audio: str, now: int) -> None:
        """A valid append's audio (base64) to the detector."""
        raw = decode_audio(audio, "Invalid value for 'audio': expected base64-encoded audio.")
        self._audio_bytes = len(raw)
        assert self._echo is not None and self._fmt is not None
        raw, self._carry = whole_samples(self._carry, raw, self._fmt.sample_width)
        if raw:
            self._echo.receive_audio(raw, self._decode(raw), now)
            self._drain_detector()
            self._speak(now)

    def _on_context_append(self, event: dict[str, Any], now: int) -> None:
        """`session.commentary.append` / `session.thinking.append` (CommentaryAppendEventParam and its twin)."""
        kind = event["type"]
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
        self._emit(self._answering(appended, event.get("event_id")))
        if delegation is None:
            return  # session-wide context: acknowledged, nothing waits for it
        delegation.answers.append(kind)
        if delegation.answered_at is None:
            delegation.answered_at = now
            for reply in self._replies:
                if reply.delegation_id == delegation.id:
                    reply.ready_at = now
            self._speak(now)

    def _on_close(self, event: dict[str, Any], now: int) -> None:
        self._finish("close_requested", now, event.get("event_id"))

    def _unmodelled(self, event: dict[str, Any], now: int) -> None:
        kind = event["type"]
        raise ClientError("unsupported_by_fake", f"The fake GPT-Live server does not model '{kind}'.", "type")

    _CONTEXT = ClientEvent(_on_context_append, ("content", "delegation_id"), ("content", "delegation_id"))
    client_events = {
        "session.start": ClientEvent(_on_session_start, ("session",), ("session",)),
        "session.input_audio.append": ClientEvent(_on_audio_append, ("audio",), ("audio",)),
        "session.commentary.append": _CONTEXT,
        "session.thinking.append": _CONTEXT,
        "session.close": ClientEvent(_on_close),
        # Known GPT-Live client events the fake does not model.
        **dict.fromkeys(
            (
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
            ),
            ClientEvent(_unmodelled, None),
        ),
    }

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
        self._event("session.input_transcript.delta", delta=text, start_ms=u.start_ms, end_ms=u.end_ms)
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
            self._answers(now, turn, str(number), "audio", delegation_id)
            # GPT-Live delegations carry no task text: the tool's name and arguments stay in the fake.
            delegation = {"id": delegation_id, "type": "delegation", "target": "client"}
            for _ in range(2 if self._duplicate else 1):
                self._event(
                    "session.delegation.created", delegation=delegation, offset_ms=self._position_ms()
                )
        else:
            self._answers(now, turn, str(number), "audio")
        self._replies.append(reply)

    def _speaker_deadline(self) -> int | None:
        if self._playout is not None:
            return self._playout.due()
        if self._replies and self._replies[0].ready_at is not None:
            return max(self._replies[0].ready_at, self._free_at)
        return None

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
            while (chunk := p.take(now)) is not None:
                # No event_id on the primary WebSocket (OutputAudioDeltaEvent). Byte for byte what _emit writes
                # (base64 needs no JSON escaping), without json.dumps.
                self._send(
                    _DELTA_HEAD + binascii.b2a_base64(chunk[0], newline=False).decode("ascii") + _STRING_TAIL
                )
            if not p.done:
                return
            assert p.clock is not None and self._fmt is not None
            length_ns = len(p.audio) * NS_PER_S // (self._fmt.rate * self._fmt.sample_width)
            self._free_at = p.clock.due(self._lead_ns + length_ns)  # its media clock reached its end
            self._playout = None

    def _start(self, reply: _Reply, t0: int) -> Speech:
        """A reply starts speaking at t0: its output transcript, then its speech on a media clock at the current
        speed (a burst rebases it, so the chunks already due keep their times)."""
        fmt = self._fmt
        assert fmt is not None
        turn = reply.turn
        if turn.reply == "echo":
            audio, duration_ms = reply.utterance.audio, reply.utterance.duration_ms
        else:
            audio = turn_audio(turn, fmt, fmt.rate * turn.duration_ms // 1000)
            duration_ms = float(turn.duration_ms)
        start_ms = max(self._position_ms(), self._out_end_ms)
        self._out_end_ms = start_ms + math.ceil(duration_ms)
        text = turn.transcript
        if text is None and turn.reply != "silence":
            text = label(turn.reply, reply.number, duration_ms / 1000)
        if text is not None:
            self._event(
                "session.output_transcript.delta", delta=text, start_ms=start_ms, end_ms=self._out_end_ms
            )
        clock = MediaClock(t0, float(self._lead_ns), self._speed)
        return Speech(audio, self._chunk_bytes, (), t0, clock=clock, chunk_ns=self._chunk_ns)

    # -- server events --------------------------------------------------------------------------------------

    def _usage(self, now: int) -> dict[str, float]:
        return {"seconds": float((now - self._started_at) // NS_PER_S)}

    def _finish(self, reason: str, now: int, client_event_id: str | None) -> None:
        assert self._resource is not None
        self._end_stall()  # a graceful end flushes what a stall held back first
        closed = {"type": "session.closed", "event_id": self._ids.new("event"), "reason": reason}
        self._emit(
            self._answering({**closed, "session": self._resource, "usage": self._usage(now)}, client_event_id)
        )
        self._close_with(CloseRequest(1000))


# -- the shell ----------------------------------------------------------------------------------------------


def _connect(
    options: LiveFakeOptions | None, script: Script | None, ctx: ConnectionContext
) -> LiveFakeConnection:
    """A connection's core; the server's `script` overrides the options'."""
    options = options or LiveFakeOptions()
    if script is not None:
        options = dataclasses.replace(options, script=script)
    return LiveFakeConnection(options, **context_args(ctx))


server = fake_server("openai_live", "/v1/live/sessions", bearer_authorize, _connect)
serve = serving(server)
