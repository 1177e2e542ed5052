"""A faithful fake of Google's Gemini Live WebSocket (BidiGenerateContent) over TLS, with a scripted model.

Two layers, in the aioquic shape:

* `GeminiFakeConnection` is the sans-I/O protocol core of one connection: no socket, no clock. Drivers are
  `receive_message(data, now)`, `handle_timer(now)`, `connection_lost(code, now)` and `inject(fault, now)`; outputs
  are pulled with `frames_to_send()` and `close_to_send()`; `next_deadline()` says when the timer is due
  (`now` is monotonic int ns). Peer input never raises: a bad frame becomes a close, as on the real service.
* `serve()` / `server()` run it in the shared fake shell (providers/fakes/server.py) over `wss://`, because
  google-genai insists on TLS for API-key clients (shared/reference/providers.md §6.2). `ensure_cert()` makes a
  self-signed pair for `localhost` / `127.0.0.1` with `cryptography`.

Protocol (providers.md §2, §5.2). Client frames may use camelCase or snake_case keys at every level (the SDK
sends a mix); server frames are camelCase only and use only top-level keys the SDK knows. The first frame must
be `setup` (else close 1007 "Request contains an invalid argument."); an unknown model closes 1008. Auth comes
from `x-goog-api-key`, `?key=` or `Authorization: Token`; none closes 1008 right after the upgrade.

The model (choices where the real service is undocumented, all deliberate):

* Input audio `audio/pcm;rate=N` at any rate (16000 when the mime names none) is resampled to 16 kHz. An
  energy VAD (the kit's, echo.py: 20 ms windows over `threshold_dbfs`) starts speech after `vad.onset_ms` (40)
  of voiced audio (`prefixPaddingMs` overrides) and ends it after `vad.hangover_ms` (500) of silence
  (`silenceDurationMs` overrides); sensitivities are ignored. With `automaticActivityDetection.disabled`,
  `activityStart`/`activityEnd` delimit turns instead (and are a 1007 otherwise).
* Each user turn (utterance, `realtimeInput.text`, or `clientContent` with `turnComplete`) gets the script's
  turn (providers/fakes/script.py). Echo speaks the utterance back, upsampled 16 -> 24 kHz; a text turn's echo
  is a tone of the turn's duration whose transcript is the text. Output starts `response_latency_ms` after the
  turn ends and goes out `burst_factor` (default 4) times faster than real time in `chunk_ms` chunks, with
  `outputTranscription` word chunks interleaved; then `generationComplete`, and `turnComplete` (+
  `usageMetadata`) when real-time playback of the turn would have finished (`wait_for_playback`).
* Input transcription is a placeholder ("[utterance 2, 0.6 s]") in word chunks, the last one `finished`.
* Usage: 25 tokens per second of audio, 1 per 4 characters of text. `promptTokenCount` is the whole context
  (instructions, tools, every utterance and answer so far), so it grows every turn; with compression enabled
  the context slides down to `targetTokens` when it passes `triggerTokens`.
* Barge-in (`START_OF_ACTIVITY_INTERRUPTS`, the default): speech while a turn is open (generating, playing
  back, or awaiting a tool) sends `toolCallCancellation` for its open calls, `interrupted`, then
  `turnComplete` (no `generationComplete`). With `NO_INTERRUPTION`, turns queue instead.
* Tools: `toolCall.functionCalls[{id,name,args}]`; the turn blocks until every call is answered by a
  `toolResponse` with a matching `id` (anything else closes 1007). `NON_BLOCKING` is not modelled.
* Sessions: with `sessionResumption`, an update `{newHandle, resumable: true}` follows setupComplete, every
  turnComplete and every `resumption_update_ms`; while a turn is open the update is `{}` (proto3 JSON omits
  `resumable: false` and an empty handle). A handle resumes its session on a new connection: the conversation
  continues from the state the handle was issued at (turn count, so the next utterance is numbered after the
  last one, and context; an older handle rolls back to its point, a choice where the docs are silent). Handles
  stay valid `handle_ttl_ms` (2 h) after the session's last socket closed (ai.google.dev: "valid 2 hours after
  the session ends"); an unknown or expired handle closes 1007 "Request contains an invalid argument."
  (observed for failed resumptions), a session whose old socket is still open closes 1011 (observed). No
  history is needed on a resumed connection, and a resumed connection issues handles of its own. A connection lives `connection_lifetime_ms` (10 min): `goAway {timeLeft}` `go_away_ms` before,
  then close 1011 "Deadline expired before operation could complete.". Without `contextWindowCompression`
  the session (across resumptions) ends after `session_cap_ms` (15 min) with the same 1011 and no goAway.

Faults (providers/fakes/faults.py) count from setup: burst:F (factor F instead of `burst_factor`), stall:MS
(every outbound frame held, then dumped), half_open, close (goAway "0s" then 1011 now), abrupt_close,
garbage_json, invalid_audio (an `inlineData` that is not base64), duplicate_tool_call, slow_handshake:MS
(setupComplete MS late; other output waits behind it). `refuse` is the shell's.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import ipaddress
import json
import math
import os
import re
import ssl as ssl_module
import tempfile
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from providers.fakes.connection import FakeCore, parse_client, soonest
from providers.fakes.echo import EchoModel, EchoOptions, UtteranceDetected, UtteranceStarted, check_options
from providers.fakes.faults import Fault, FaultKind, FaultSchedule
from providers.fakes.kit_openai import ms_of, whole_samples
from providers.fakes.script import Script, Turn, label
from providers.fakes.server import (
    CloseRequest,
    ConnectionContext,
    FakeServer,
    IdSource,
    serving,
)
from providers.fakes.speech import Speech, turn_audio
from rtp.audio import AudioFormat, Encoding
from rtp.resample import Resampler
from rtp.units import NS_PER_MS

__all__ = [
    "ALLOWED_SERVER_KEYS",
    "DEFAULT_PATH",
    "KNOWN_MODELS",
    "GeminiFakeOptions",
    "GeminiSessions",
    "GeminiFakeConnection",
    "GeminiFakeServer",
    "ensure_cert",
    "server",
    "serve",
]

_IN_RATE = 16_000
_OUT_RATE = 24_000
_OUT = AudioFormat(Encoding.PCM16, _OUT_RATE)
_TOKENS_PER_AUDIO_S = 25
_CONTEXT_LIMIT = 128_000

INVALID_ARGUMENT = "Request contains an invalid argument."
DEADLINE_EXPIRED = "Deadline expired before operation could complete."
INTERNAL_ERROR = "Internal error encountered."
NO_KEY = (
    "Method doesn't allow unregistered callers. Please use API Key or other form of API consumer identity."
)
BAD_KEY = "API key not valid. Please pass a valid API key."

KNOWN_MODELS = frozenset(
    {
        "gemini-3.1-flash-live-preview",
        "gemini-2.5-flash-native-audio-preview-12-2025",
        "gemini-2.5-flash-native-audio-preview-09-2025",
        "gemini-live-2.5-flash-preview",
        "gemini-2.0-flash-live-001",
    }
)
ALLOWED_SERVER_KEYS = frozenset(
    "setupComplete serverContent toolCall toolCallCancellation usageMetadata goAway sessionResumptionUpdate "
    "voiceActivityDetectionSignal voiceActivity".split()
)
DEFAULT_PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
# `//ws/...` (what the SDK requests) reaches the shell's path check as `/google.ai...` (urlsplit reads `ws` as
# a host), so both forms pass the upgrade; the version is read from the raw path.
_PATH = re.compile(
    r"^/(?:ws/)?google\.ai\.generativelanguage\.(v1|v1beta|v1alpha)\.GenerativeService\."
    r"BidiGenerateContent(?:Constrained)?$"
)
_SETUP_KEYS = frozenset(
    "model generationConfig systemInstruction tools realtimeInputConfig sessionResumption "
    "contextWindowCompression inputAudioTranscription outputAudioTranscription proactivity explicitVadSignal "
    "historyConfig safetySettings avatarConfig labels".split()
)
_GENERATION_KEYS = frozenset(
    "responseModalities speechConfig temperature maxOutputTokens topK topP seed mediaResolution "
    "enableAffectiveDialog thinkingConfig translationConfig candidateCount presencePenalty frequencyPenalty".split()
)
_SPEECH_KEYS = frozenset({"voiceConfig", "languageCode", "multiSpeakerVoiceConfig"})  # SpeechConfig
_REALTIME_INPUT_KEYS = frozenset(
    {"audio", "audioStreamEnd", "activityStart", "activityEnd", "text", "mediaChunks", "video"}
)


# -- options, shared sessions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GeminiFakeOptions:
    """Everything tunable about the fake; times in ms."""

    vad: EchoOptions = EchoOptions(onset_ms=40, hangover_ms=500)
    """The energy VAD's knobs (the kit's, echo.py); `onset_ms` and `hangover_ms` are the defaults of the setup's
    `prefixPaddingMs` and `silenceDurationMs`."""
    chunk_ms: int = 40
    burst_factor: float = 4.0
    response_latency_ms: int = 300
    wait_for_playback: bool = True
    resumption_update_ms: int = 10_000
    connection_lifetime_ms: int = 10 * 60_000
    go_away_ms: int = 50_000
    session_cap_ms: int = 15 * 60_000
    handle_ttl_ms: int = 2 * 3_600_000
    models: frozenset[str] = KNOWN_MODELS
    api_keys: frozenset[str] | None = None
    """Keys accepted; None accepts any non-empty key."""
    record_client_frames: bool = True
    name_sessions: bool = False
    """setupComplete carries the session's id (`sessionId`, which the bridge's adapter reads) instead of `{}`,
    so that a harness can join the bridge's log of each connection with the fake's notes (a resumed
    connection names the session it resumed)."""

    def __post_init__(self) -> None:
        lives = ("connection_lifetime_ms", "session_cap_ms", "resumption_update_ms", "handle_ttl_ms")
        check_options(self, ("chunk_ms", "burst_factor", *lives))


@dataclass(slots=True)
class _Session:
    id: str
    started: int
    holder: int | None  # index of the connection that has it open
    turns: int = 0
    context_text: int = 0
    context_audio: int = 0
    released: int | None = None  # when the last socket holding it closed


@dataclass(frozen=True, slots=True)
class _Snapshot:
    session: _Session
    state: tuple[int, int, int]  # the session's turns, context_text and context_audio when issued
    issued: int


class GeminiSessions:
    """Resumable sessions shared by the connections of one fake server, by handle."""

    def __init__(self) -> None:
        self.handles: dict[str, _Snapshot] = {}

    def issue(self, handle: str, session: _Session, now: int) -> None:
        state = (session.turns, session.context_text, session.context_audio)
        self.handles[handle] = _Snapshot(session, state, now)


class _Reject(Exception):
    """A client error the real service answers by closing the socket."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, _close_reason(reason)


def _close_reason(reason: str) -> str:
    data = reason.encode()
    return reason if len(data) <= 123 else data[:120].decode("utf-8", "ignore") + "..."


def _snake(key: str) -> str:
    return re.sub(r"([A-Z])", r"_\1", key).lower()


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _get(obj: dict[str, Any], key: str, default: Any = None) -> Any:
    """`key` (camelCase) in either spelling."""
    if key in obj:
        return obj[key]
    return obj.get(_snake(key), default)


def _obj(value: Any, where: str, known: frozenset[str] | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Reject(1007, f"Invalid JSON payload received. Expected an object at '{where}'.")
    if known is not None:
        for key in value:
            if _camel(key) not in known:
                message = (
                    f"Invalid JSON payload received. Unknown name \"{key}\" at '{where}': Cannot find field."
                )
                raise _Reject(1007, message)
    return value


def _member(
    parent: dict[str, Any], key: str, where: str, known: frozenset[str] | None = None
) -> dict[str, Any]:
    """The object member `key` (camelCase) of `parent`, which is at `where`; `{}` when it is absent."""
    return _obj(_get(parent, key, {}), f"{where}.{_snake(key)}", known)


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Reject(1007, INVALID_ARGUMENT)
    return value


def _int64(value: Any) -> int:
    """A proto3 JSON int64: a number or a decimal string."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise _Reject(1007, INVALID_ARGUMENT)
    return int(value)


def _bytes_field(data: str) -> bytes:
    """A proto3 JSON bytes field: standard or URL-safe base64 (google-genai sends URL-safe), padded."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return base64.b64decode(data, altchars=b"-_", validate=True)


def _duration(ms: int) -> str:
    """A proto3 JSON Duration: "50s", "1.500s"."""
    seconds, rest = divmod(max(ms, 0), 1000)
    return f"{seconds}s" if not rest else f"{seconds}.{rest:03d}s"


def _text_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _words(text: str) -> list[str]:
    return re.findall(r"\s*\S+", text) or [text]


def _audio_message(data: str) -> dict[str, Any]:
    """A model turn's audio chunk (`data`: the base64 of 24 kHz PCM16)."""
    inline = {"mimeType": f"audio/pcm;rate={_OUT_RATE}", "data": data}
    return {"serverContent": {"modelTurn": {"parts": [{"inlineData": inline}]}}}


# -- voice activity -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Vad:
    """The kit's utterance detector (echo.py) on 16 kHz PCM (`GeminiFakeOptions.vad`, with the setup's onset and
    hangover). With `manual` (automaticActivityDetection.disabled) the
    client's activityStart/activityEnd delimit `speech` instead, whatever its energy."""

    detector: EchoModel
    manual: bool
    speech: bytearray | None = None  # manual: the audio since activityStart


# -- turns --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Reply:
    """One model turn, from the user's turn to turnComplete."""

    number: int
    script: Turn
    utterance: bytes | None  # 16 kHz PCM the user said, when spoken
    text: str | None  # what the user typed, when text
    calls: dict[str, str] = field(default_factory=dict)  # open tool calls: id -> name
    speech: Speech | None = None  # once generated (its last chunk taken: generationComplete sent)
    done_at: int | None = None  # when turnComplete goes


# -- the sans-I/O core --------------------------------------------------------------------------------------


class GeminiFakeConnection(FakeCore):
    """One Gemini Live connection, server side, with the scripted model behind it."""

    garbage = "}{ this is not JSON"

    def __init__(
        self,
        options: GeminiFakeOptions | None = None,
        *,
        now: int,
        api_key: str | None,
        api_version: str = "v1beta",
        ids: IdSource | None = None,
        index: int = 0,
        faults: Sequence[Fault] = (),
        script: Script | None = None,
        sessions: GeminiSessions | None = None,
    ) -> None:
        self.options = opts = options or GeminiFakeOptions()
        super().__init__(index, ids, opts.record_client_frames)
        self.index = index
        self.api_version = api_version
        self.script = script or Script()
        self.sessions = sessions if sessions is not None else GeminiSessions()
        self._created = self._last_now = now
        self._initial_faults = list(faults)
        self._faults: FaultSchedule | None = None
        self._reject: _Reject | None = None  # a bad key: the close right after the upgrade (at `now`)
        if not api_key:
            self._reject = _Reject(1008, NO_KEY)
        elif opts.api_keys is not None and api_key not in opts.api_keys:
            self._reject = _Reject(1007, BAD_KEY)
        # After setup:
        self.setup: dict[str, Any] | None = None
        self.language_code: str | None = None  # setup's speechConfig.languageCode (BCP 47), if it gave one
        self.session: _Session | None = None
        self.model = ""
        self._setup_complete_at: int | None = None
        self._vad: _Vad | None = None
        self._interrupts = True
        self._transcribe_in = self._transcribe_out = False
        self._resumption = False
        self._compression: tuple[int, int] | None = None  # (trigger, target) tokens
        self._next_update: int | None = None
        self._go_away_at: int | None = None
        self._close_at: int | None = None
        self._cap_at: int | None = None
        self._reply: _Reply | None = None
        self._queue: deque[_Reply] = deque()
        self._in_rate = 0
        self._in_resampler: Resampler | None = None
        self._carry = b""

    @classmethod
    def from_context(
        cls,
        ctx: ConnectionContext,
        options: GeminiFakeOptions,
        script: Script | None,
        sessions: GeminiSessions,
    ) -> GeminiFakeConnection:
        raw_path = ctx.request.path
        while raw_path.startswith("//"):
            raw_path = raw_path[1:]
        parts = urlsplit(raw_path)
        match = _PATH.match(parts.path)
        headers = ctx.request.headers
        key = next(iter(headers.get_all("x-goog-api-key")), None)
        key = key or next(iter(parse_qs(parts.query).get("key", [])), None)
        scheme, _, token = next(iter(headers.get_all("Authorization")), "").partition(" ")
        if not key and scheme.lower() == "token":
            key = token.strip()
        return cls(
            options,
            now=ctx.now,
            api_key=key,
            api_version=match.group(1) if match else "v1beta",
            ids=ctx.ids,
            index=ctx.index,
            faults=ctx.faults,
            script=script,
            sessions=sessions,
        )

    # -- drivers --------------------------------------------------------------------------------------------

    def receive_message(self, data: str | bytes, now: int) -> None:
        """Handle one client frame. Never raises for bad peer input (it becomes a close)."""
        self._last_now = max(self._last_now, now)
        self._audio_bytes = None
        frame, raw, is_json = parse_client(data)
        try:
            if frame is None:
                detail = "Expected an object." if is_json else "Unexpected token."
                raise _Reject(1007, f"Invalid JSON payload received. {detail}")
            if self._reject is not None:
                raise self._reject
            if not self._closing:
                self._fire_faults(now)
                try:
                    self._dispatch(frame, now)
                except (TypeError, AttributeError, KeyError, ValueError) as exc:
                    # A shape the checks above did not foresee: the service refuses any malformed request so.
                    raise _Reject(1007, INVALID_ARGUMENT) from exc
                self._tick(now)
        except _Reject as exc:
            if not self._closing:
                self._close_with(CloseRequest(exc.code, exc.reason))
        finally:
            self._received(now, frame, raw)

    def handle_timer(self, now: int) -> None:
        """Run everything due at or before `now`."""
        self._last_now = max(self._last_now, now)
        if self._closing:
            return
        if self._reject is not None and now >= self._created:
            self._close_with(CloseRequest(self._reject.code, self._reject.reason))
            return
        self._fire_faults(now)
        self._tick(now)

    def connection_lost(self, code: int | None, now: int | None = None) -> None:
        """The socket is gone (either side closed it): stop all timers and free the session."""
        self._closing = True
        if self.record.close_code is None:
            self.record.close_code = code
        if self.session is not None and self.session.holder == self.index:
            self.session.holder = None
            self.session.released = self._last_now if now is None else max(now, self._last_now)

    def inject(self, fault: Fault, now: int) -> None:
        """Apply a fault at runtime; AFTER_MS counts from now."""
        if self._faults is None:
            self._initial_faults.append(fault)  # counts from setup, like the configured ones
            return
        self._faults.add(fault, now)
        if not self._closing:
            self._fire_faults(now)
            self._tick(now)

    def recorded(self, frame: dict[str, Any]) -> dict[str, Any]:
        """The frame for the record file, audio payloads shortened to their decoded length."""
        for key in ("realtimeInput", "realtime_input"):
            body = frame.get(key)
            if isinstance(body, dict) and isinstance(body.get("audio"), dict) and "data" in body["audio"]:
                audio = {k: v for k, v in body["audio"].items() if k != "data"}
                audio["data"] = {"bytes": self.last_frame.audio_bytes if self.last_frame else None}
                return {key: {**body, "audio": audio}}
        return frame

    # -- outputs (the frames and the close: connection.py) ----------------------------------------------------

    def next_deadline(self) -> int | None:
        if self._closing or self._half_open:
            return None
        if self._reject is not None:
            return self._created
        faults = self._faults.next_deadline() if self._faults is not None else None
        reply, speech = self._reply, None
        if reply is not None and reply.speech is not None:
            speech = reply.done_at if reply.speech.done else reply.speech.due()
        timers = (self._setup_complete_at, self._next_update, self._go_away_at, self._close_at, self._cap_at)
        return soonest(*timers, faults, speech)

    @property
    def replying(self) -> bool:
        """A model turn is open (generating, playing back or awaiting a tool)."""
        return self._reply is not None

    # -- client frames --------------------------------------------------------------------------------------

    def _dispatch(self, frame: dict[str, Any], now: int) -> None:
        if len(frame) != 1:
            raise _Reject(1007, INVALID_ARGUMENT)
        key, body = next(iter(frame.items()))
        kind = _camel(key)
        if self.setup is None:
            if kind != "setup":
                raise _Reject(1007, INVALID_ARGUMENT)
            self._on_setup(_obj(body, "setup", _SETUP_KEYS), now)
        elif kind == "realtimeInput":
            self._on_realtime_input(_obj(body, "realtime_input", _REALTIME_INPUT_KEYS), now)
        elif kind == "clientContent":
            self._on_client_content(_obj(body, "client_content"), now)
        elif kind == "toolResponse":
            self._on_tool_response(_obj(body, "tool_response"), now)
        elif kind == "setup":
            raise _Reject(1007, INVALID_ARGUMENT)
        elif kind == "contextUpdate":
            _obj(body, "context_update")
        else:
            raise _Reject(1007, f'Invalid JSON payload received. Unknown name "{key}": Cannot find field.')

    def _on_setup(self, setup: dict[str, Any], now: int) -> None:
        opts = self.options
        model = _get(setup, "model")
        if not isinstance(model, str) or not model.startswith("models/"):
            raise _Reject(1007, INVALID_ARGUMENT)
        name = model.removeprefix("models/")
        if name not in opts.models:
            raise _Reject(
                1008,
                f"models/{name} is not found for API version {self.api_version}, "
                "or is not supported for bidiGenerateContent.",
            )
        generation = _member(setup, "generationConfig", "setup", _GENERATION_KEYS)
        modalities = _get(generation, "responseModalities", ["AUDIO"])
        if modalities != ["AUDIO"]:
            raise _Reject(1007, INVALID_ARGUMENT)
        speech = _member(generation, "speechConfig", "setup.generation_config", _SPEECH_KEYS)
        language = _get(speech, "languageCode")
        if language is not None and not isinstance(language, str):
            raise _Reject(1007, INVALID_ARGUMENT)
        rt = _member(setup, "realtimeInputConfig", "setup")
        aad = _member(rt, "automaticActivityDetection", "setup.realtime_input_config")
        handling = _get(rt, "activityHandling", "START_OF_ACTIVITY_INTERRUPTS")
        if handling not in (
            "START_OF_ACTIVITY_INTERRUPTS",
            "NO_INTERRUPTION",
            "ACTIVITY_HANDLING_UNSPECIFIED",
        ):
            raise _Reject(1007, INVALID_ARGUMENT)
        self._interrupts = handling != "NO_INTERRUPTION"
        start_ms = _get(aad, "prefixPaddingMs", opts.vad.onset_ms)
        hangover_ms = _get(aad, "silenceDurationMs", opts.vad.hangover_ms)
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (start_ms, hangover_ms)
        ):
            raise _Reject(1007, INVALID_ARGUMENT)
        detector = dataclasses.replace(
            opts.vad, onset_ms=start_ms, hangover_ms=hangover_ms, report_onsets=True, speak=False
        )
        self._vad = _Vad(EchoModel(_IN_RATE, 2, detector), manual=bool(_get(aad, "disabled", False)))
        instruction_tokens = self._setup_tokens(setup)
        self._transcribe_in = _get(setup, "inputAudioTranscription") is not None
        self._transcribe_out = _get(setup, "outputAudioTranscription") is not None
        compression = _get(setup, "contextWindowCompression")
        if compression is not None:
            compression = _obj(compression, "setup.context_window_compression")
            trigger = _int64(_get(compression, "triggerTokens", int(_CONTEXT_LIMIT * 0.8)))
            window = _member(compression, "slidingWindow", "setup.context_window_compression")
            self._compression = (trigger, _int64(_get(window, "targetTokens", trigger // 2)))
        resumption = _get(setup, "sessionResumption")
        handle = None
        if resumption is not None:
            self._resumption = True
            handle = _get(_obj(resumption, "setup.session_resumption"), "handle")
        self.session = self._open_session(handle, instruction_tokens, now)
        self.setup, self.model, self.language_code = setup, name, language
        self.record.session_id = self.session.id
        # The session (and every timer and fault) starts now.
        self._faults = FaultSchedule(
            [f for f in self._initial_faults if f.kind is not FaultKind.SLOW_HANDSHAKE], self.index + 1, now
        )
        slow = [f for f in self._initial_faults if f.kind is FaultKind.SLOW_HANDSHAKE]
        delay = int((slow[-1].value or 0) * NS_PER_MS) if slow else 0
        for f in slow:
            self._note_fault(f)
        self._setup_complete_at = now + delay
        life = opts.connection_lifetime_ms * NS_PER_MS
        self._close_at = self._created + life
        self._go_away_at = max(now, self._close_at - opts.go_away_ms * NS_PER_MS)
        if self._compression is None:
            self._cap_at = self.session.started + opts.session_cap_ms * NS_PER_MS
        if self._resumption:
            self._next_update = now  # the first update follows setupComplete
        self._fire_faults(now)

    def _setup_tokens(self, setup: dict[str, Any]) -> int:
        tokens = 0
        instruction = _get(setup, "systemInstruction")
        if isinstance(instruction, str):
            tokens += _text_tokens(instruction)
        elif instruction is not None:
            for part in _list(_get(_obj(instruction, "setup.system_instruction"), "parts", [])):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    tokens += _text_tokens(part["text"])
        for tool in _list(_get(setup, "tools", [])):
            for decl in _list(_get(_obj(tool, "setup.tools"), "functionDeclarations", [])):
                if not isinstance(decl, dict) or not isinstance(decl.get("name"), str):
                    raise _Reject(1007, INVALID_ARGUMENT)
            tokens += _text_tokens(json.dumps(tool))
        return tokens

    def _open_session(self, handle: Any, instruction_tokens: int, now: int) -> _Session:
        if handle:
            snap = self.sessions.handles.get(handle) if isinstance(handle, str) else None
            if snap is None:
                raise _Reject(1007, INVALID_ARGUMENT)
            session = snap.session
            if session.holder is not None:
                raise _Reject(1011, INTERNAL_ERROR)  # the old socket still holds the session
            ended = max(snap.issued, session.released or snap.issued)
            if now - ended > self.options.handle_ttl_ms * NS_PER_MS:
                raise _Reject(1007, INVALID_ARGUMENT)  # expired
            session.turns, session.context_text, session.context_audio = snap.state
            session.holder = self.index
            self.record.resumed_handle = handle
            return session
        return _Session(self._ids.new("session"), now, self.index, context_text=instruction_tokens)

    def _on_realtime_input(self, body: dict[str, Any], now: int) -> None:
        assert self._vad is not None
        for key, value in body.items():
            kind = _camel(key)
            if kind == "audio":
                self._on_audio(value, now)
            elif kind == "mediaChunks":
                if not isinstance(value, list):
                    raise _Reject(1007, INVALID_ARGUMENT)
                for blob in value:
                    self._on_audio(blob, now)
            elif kind == "audioStreamEnd":
                if value is True and not self._vad.manual:
                    self._vad.detector.end_utterance(now)
                    self._detected(now)
            elif kind in ("activityStart", "activityEnd"):
                vad = self._vad
                if not vad.manual:
                    raise _Reject(1007, INVALID_ARGUMENT)
                if kind == "activityStart" and vad.speech is None:
                    vad.speech = bytearray()
                    self._speech_started(now)
                elif kind == "activityEnd" and vad.speech is not None:
                    audio, vad.speech = bytes(vad.speech), None
                    if audio and len(audio) // 2 >= _IN_RATE * self.options.vad.min_utterance_ms // 1000:
                        self._speech_ended(audio, now)
            elif kind == "text":
                if not isinstance(value, str):
                    raise _Reject(1007, INVALID_ARGUMENT)
                self._user_text(value, now)

    def _on_audio(self, blob: Any, now: int) -> None:
        blob = _obj(blob, "realtime_input.audio", frozenset({"data", "mimeType", "displayName"}))
        mime, data = _get(blob, "mimeType"), blob.get("data")
        if not isinstance(mime, str) or not isinstance(data, str):
            raise _Reject(1007, INVALID_ARGUMENT)
        kind, _, params = mime.replace(" ", "").partition(";")
        if kind != "audio/pcm":
            raise _Reject(1007, INVALID_ARGUMENT)
        rate = _IN_RATE
        for param in params.split(";") if params else ():
            name, _, value = param.partition("=")
            if name == "rate":
                if not value.isdigit() or not 0 < int(value) <= 192_000:
                    raise _Reject(1007, INVALID_ARGUMENT)
                rate = int(value)
        try:
            pcm = _bytes_field(data)
        except (binascii.Error, ValueError):
            raise _Reject(1007, INVALID_ARGUMENT) from None
        self._audio_bytes = len(pcm)
        if rate != self._in_rate:
            self._in_rate, self._in_resampler, self._carry = rate, Resampler(rate, _IN_RATE), b""
        pcm, self._carry = whole_samples(self._carry, pcm, 2)
        assert self._in_resampler is not None and self._vad is not None and self.session is not None
        pcm = self._in_resampler.process(pcm)
        if self._vad.manual:
            if self._vad.speech is not None:
                self._vad.speech += pcm
            return
        self._vad.detector.receive_audio(pcm, pcm, now)
        self._detected(now)

    def _detected(self, now: int) -> None:
        """What the detector made of the audio: speech started (a barge-in), an utterance (a user turn)."""
        assert self._vad is not None
        while (event := self._vad.detector.next_event()) is not None:
            if isinstance(event, UtteranceStarted):
                self._speech_started(now)
            elif isinstance(event, UtteranceDetected):
                self._speech_ended(event.utterance.audio, now)

    def _on_client_content(self, body: dict[str, Any], now: int) -> None:
        assert self.session is not None
        turns = _get(body, "turns", [])
        if not isinstance(turns, list):
            raise _Reject(1007, INVALID_ARGUMENT)
        last_user = ""
        for content in turns:
            content = _obj(content, "client_content.turns")
            parts = _get(content, "parts", [])
            if not isinstance(parts, list):
                raise _Reject(1007, INVALID_ARGUMENT)
            for part in parts:
                text = _obj(part, "client_content.turns.parts").get("text")
                if isinstance(text, str):
                    self.session.context_text += _text_tokens(text)
                    if content.get("role", "user") == "user":
                        last_user = text
        if _get(body, "turnComplete", False) is True:
            self._user_text(last_user, now, counted=True)

    def _on_tool_response(self, body: dict[str, Any], now: int) -> None:
        responses = _get(body, "functionResponses", [])
        if not isinstance(responses, list) or not responses:
            raise _Reject(1007, INVALID_ARGUMENT)
        reply = self._reply
        for response in responses:
            response = _obj(response, "tool_response.function_responses")
            call_id = response.get("id")
            if reply is None or not isinstance(call_id, str) or call_id not in reply.calls:
                raise _Reject(1007, INVALID_ARGUMENT)
            result = response.get("response")
            if result is not None and not isinstance(result, dict):
                raise _Reject(1007, INVALID_ARGUMENT)
            assert self.session is not None
            self.session.context_text += _text_tokens(json.dumps(result))
            del reply.calls[call_id]
        if reply is not None and not reply.calls:
            self._generate(reply, now)

    # -- the model ------------------------------------------------------------------------------------------

    def _speech_started(self, now: int) -> None:
        if self._reply is not None and self._interrupts:
            self._interrupt(now)

    def _speech_ended(self, utterance: bytes, now: int) -> None:
        assert self.session is not None
        self.session.turns += 1
        self.session.context_audio += math.ceil(len(utterance) / 2 / _IN_RATE * _TOKENS_PER_AUDIO_S)
        number = self.session.turns
        seconds = len(utterance) / 2 / _IN_RATE
        text = self._heard(now, str(number), number, seconds, seconds * 1000)
        if self._transcribe_in:
            words = _words(text)
            for i, word in enumerate(words):
                chunk: dict[str, Any] = {"text": word}
                if i == len(words) - 1:
                    chunk["finished"] = True
                self._emit({"serverContent": {"inputTranscription": chunk}})
        self._begin(_Reply(number, self.script.turn(number), utterance, None), now)

    def _user_text(self, text: str, now: int, *, counted: bool = False) -> None:
        assert self.session is not None
        if self._reply is not None and self._interrupts:
            self._interrupt(now)
        self.session.turns += 1
        if not counted:
            self.session.context_text += _text_tokens(text)
        number = self.session.turns
        turn = self.script.turn(number)
        if self.script.tools_answer_callers and turn.tool_call is not None:
            turn = dataclasses.replace(turn, tool_call=None)  # a text is spoken to, not a request (script.py)
        self._begin(_Reply(number, turn, None, text), now)

    def _begin(self, reply: _Reply, now: int) -> None:
        if self._reply is not None:
            self._queue.append(reply)  # NO_INTERRUPTION: answer after the current turn
            return
        self._reply = reply
        call = reply.script.tool_call
        kind = "audio" if reply.utterance is not None else "text"
        if call is None:
            self._answers(now, reply.script, str(reply.number), kind)
            self._generate(reply, now)
            return
        call_id = self._ids.new("fc")
        reply.calls[call_id] = call.name
        self._answers(now, reply.script, str(reply.number), kind, call_id)
        message = {
            "toolCall": {"functionCalls": [{"id": call_id, "name": call.name, "args": dict(call.arguments)}]}
        }
        self._emit(message)
        if self._faults is not None and self._faults.active(FaultKind.DUPLICATE_TOOL_CALL, now):
            self._emit(message)

    def _generate(self, reply: _Reply, now: int) -> None:
        turn = reply.script
        if turn.reply == "echo" and reply.utterance is not None:
            up = Resampler(_IN_RATE, _OUT_RATE)
            audio = up.process(reply.utterance) + up.flush()
            transcript = turn.transcript or label("echo", reply.number, ms_of(_OUT, len(audio)) / 1000)
        else:
            audio = turn_audio(turn, _OUT, _OUT_RATE * turn.duration_ms // 1000)
            placeholder = label("tone", reply.number, turn.duration_ms / 1000)
            echoed = reply.text if turn.reply == "echo" and reply.text else placeholder
            transcript = turn.transcript or ("" if turn.reply == "silence" else echoed)
        faults, burst = self._faults, self.options.burst_factor
        assert faults is not None

        def gap(nbytes: int, now: int) -> int:  # the chunk's real-time length over the speed
            return int(nbytes / 2 / _OUT_RATE * 1e9 / faults.speed(now, burst))

        step = 2 * _OUT_RATE * self.options.chunk_ms // 1000
        start = now + self.options.response_latency_ms * NS_PER_MS
        words = _words(transcript) if transcript else []
        reply.speech = Speech(audio, step, words, start, gap=gap, words_by_bytes=True)

    def _pump(self, now: int) -> None:
        """Send what is due of the open turn; then generationComplete, then turnComplete."""
        reply = self._reply
        speech = reply.speech if reply is not None else None
        if reply is None or speech is None:
            return
        while (chunk := speech.take(now)) is not None:
            data, words = chunk
            if data:
                self._emit(_audio_message(base64.b64encode(data).decode("ascii")))
            for word in words if self._transcribe_out else ():
                self._emit({"serverContent": {"outputTranscription": {"text": word}}})
            if speech.done:
                self._emit({"serverContent": {"generationComplete": True}})
                assert speech.first_at is not None
                playback_end = speech.first_at + len(speech.audio) * 1_000_000_000 // (2 * _OUT_RATE)
                reply.done_at = max(now, playback_end) if self.options.wait_for_playback else now
        if speech.done and reply.done_at is not None and now >= reply.done_at:
            self._complete(reply, now, interrupted=False)

    def _interrupt(self, now: int) -> None:
        reply = self._reply
        assert reply is not None
        if reply.calls:
            self._emit({"toolCallCancellation": {"ids": list(reply.calls)}})
            reply.calls.clear()
        self._emit({"serverContent": {"interrupted": True}})
        self._complete(reply, now, interrupted=True)

    def _complete(self, reply: _Reply, now: int, *, interrupted: bool) -> None:
        session = self.session
        assert session is not None
        sent = reply.speech.sent if reply.speech is not None else 0
        response = math.ceil(sent / 2 / _OUT_RATE * _TOKENS_PER_AUDIO_S)
        prompt_text, prompt_audio = session.context_text, session.context_audio
        prompt = prompt_text + prompt_audio
        usage: dict[str, Any] = {
            "promptTokenCount": prompt,
            "responseTokenCount": response,
            "totalTokenCount": prompt + response,
            "promptTokensDetails": [
                {"modality": "TEXT", "tokenCount": prompt_text},
                {"modality": "AUDIO", "tokenCount": prompt_audio},
            ],
            "responseTokensDetails": [{"modality": "AUDIO", "tokenCount": response}],
        }
        self._emit({"serverContent": {"turnComplete": True}, "usageMetadata": usage})
        session.context_audio += response
        if self._compression is not None:
            trigger, target = self._compression
            total = session.context_text + session.context_audio
            if total > trigger and total > 0:
                scale = target / total
                session.context_text = int(session.context_text * scale)
                session.context_audio = int(session.context_audio * scale)
        self._reply = None
        if self._resumption:
            self._update_resumption(now)
        while self._reply is None and self._queue:
            self._begin(self._queue.popleft(), now)

    def _setup_complete(self) -> dict[str, str]:
        if self.options.name_sessions and self.session is not None:
            return {"sessionId": self.session.id}
        return {}

    def _update_resumption(self, now: int) -> None:
        assert self.session is not None
        if self._reply is not None:
            self._emit({"sessionResumptionUpdate": {}})  # not resumable: proto3 JSON omits the defaults
        else:
            handle = self._ids.new("handle")
            self.sessions.issue(handle, self.session, now)
            self.record.handles.append(handle)
            self._emit({"sessionResumptionUpdate": {"newHandle": handle, "resumable": True}})
        self._next_update = now + self.options.resumption_update_ms * NS_PER_MS

    # -- timers and faults ----------------------------------------------------------------------------------

    def _tick(self, now: int) -> None:
        if self._closing or self.setup is None:
            return
        if self._setup_complete_at is not None and now >= self._setup_complete_at:
            self._setup_complete_at = None
            self._out.append(json.dumps({"setupComplete": self._setup_complete()}))
            if not self._stalled(now):
                self._release()
        if self._cap_at is not None and now >= self._cap_at:
            self._close_with(CloseRequest(1011, DEADLINE_EXPIRED))
            return
        if self._close_at is not None and now >= self._close_at:
            self._close_with(CloseRequest(1011, DEADLINE_EXPIRED))
            return
        if self._go_away_at is not None and now >= self._go_away_at:
            left = (self._close_at or now) - now
            self._go_away_at = None
            self._emit({"goAway": {"timeLeft": _duration(left // NS_PER_MS)}})
        self._pump(now)
        if self._next_update is not None and now >= self._next_update:
            self._update_resumption(now)
        if self._setup_complete_at is None and not self._stalled(now):
            self._release()

    def _stalled(self, now: int) -> bool:
        return self._faults is not None and self._faults.stalled(now)

    def _fire_faults(self, now: int) -> None:
        if self._faults is not None:
            self._fire(self._faults.due(now), now)

    def _on_fault(self, fault: Fault, now: int) -> None:
        if fault.kind is FaultKind.CLOSE:
            self._emit({"goAway": {"timeLeft": "0s"}})
            self._release()
            self._close_with(CloseRequest(1011, DEADLINE_EXPIRED))
        elif fault.kind is FaultKind.INVALID_AUDIO:
            self._emit(_audio_message("!!not*base64!!"))  # not base64

    # -- the funnels (connection.py) ------------------------------------------------------------------------

    def _holding(self) -> bool:
        """Every frame waits for the end of the driver call (`_tick`), which releases them unless a stall or
        the slow handshake holds them; a call that closes first sends none of them."""
        return True

    def _release(self) -> None:
        if self._setup_complete_at is None and not self._half_open:
            super()._release()


# -- TLS ----------------------------------------------------------------------------------------------------


def ensure_cert(cert: str | None, key: str | None, directory: str) -> tuple[str, str, bool]:
    """The given pair, or a new self-signed one for CN=localhost (SAN localhost, 127.0.0.1) in `directory`."""
    if cert is not None and key is not None:
        return cert, key, False
    if cert is not None or key is not None:
        raise ValueError("give both a certificate and its key, or neither")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ski = x509.SubjectKeyIdentifier.from_public_key(private.public_key())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=365))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(private, hashes.SHA256())
    )
    os.makedirs(directory, exist_ok=True)
    cert_path, key_path = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    with open(cert_path, "wb") as f:
        f.write(certificate.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return cert_path, key_path, True


_default_pair: tuple[str, str] | None = None


def _default_cert() -> tuple[str, str]:
    """One generated pair per process, in a private temporary directory."""
    global _default_pair
    if _default_pair is None:
        cert, key, _ = ensure_cert(None, None, tempfile.mkdtemp(prefix="parlora-gemini-fake-"))
        _default_pair = (cert, key)
    return _default_pair


# -- the shell ----------------------------------------------------------------------------------------------


class GeminiFakeServer(FakeServer):
    """The shared fake shell over TLS: the pair (`cert_path`, `key_path`) a client needs to trust it, and the
    sessions its connections resume. `shell`: FakeServer's `faults` and `record_path`."""

    def __init__(
        self, options: GeminiFakeOptions, script: Script | None, tls: tuple[str, str], **shell: Any
    ) -> None:
        self.cert_path, self.key_path = tls
        self.sessions = GeminiSessions()
        context = ssl_module.SSLContext(ssl_module.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)

        def connect(ctx: ConnectionContext) -> GeminiFakeConnection:
            return GeminiFakeConnection.from_context(ctx, options, script, self.sessions)

        super().__init__(
            "gemini_live",
            connect,
            path=DEFAULT_PATH,
            accepts_path=_accepts_path,
            authorize=_authorize,
            ssl=context,
            **shell,
        )

    def client_ssl_context(self) -> ssl_module.SSLContext:
        """A client context that trusts this fake's certificate (and nothing else)."""
        return ssl_module.create_default_context(cafile=self.cert_path)

    @property
    def base_url(self) -> str:
        """For google-genai's `HttpOptions(base_url=...)` (it derives wss:// and the path itself)."""
        return f"https://localhost:{self.port}"


def _accepts_path(path: str) -> bool:
    return _PATH.match(path) is not None


def _authorize(request: Any) -> HTTPStatus | None:
    return None  # the core closes with the real service's reason text instead (see GeminiFakeConnection)


def server(
    options: GeminiFakeOptions | None = None,
    *,
    faults: Sequence[Fault] = (),
    record_path: str | None = None,
    script: Script | None = None,
    cert: str | None = None,
    key: str | None = None,
) -> GeminiFakeServer:
    """A Gemini Live fake over TLS (not yet listening: `await server(...).start(host, port)`): with the given
    certificate and key, or a self-signed pair made once per process."""
    cert_path, key_path = (cert, key) if cert is not None or key is not None else _default_cert()
    tls = ensure_cert(cert_path, key_path, tempfile.gettempdir())[:2]
    return GeminiFakeServer(
        options or GeminiFakeOptions(), script, tls, faults=faults, record_path=record_path
    )


serve = serving(server)
