"""The OpenAI-Realtime family (shared/reference/providers.md §1, §3): one sans-I/O client core for every protocol
shaped like OpenAI's Realtime GA, parameterised by a `Dialect` of vendor differences.

OpenAI Realtime GA and xAI's Grok Voice Agent speak the same conversation protocol: the server sends
`session.created`, the client configures with `session.update` and waits for `session.updated`, streams
`input_audio_buffer.append`, and the server's voice activity detection drives responses made of
`response.output_audio.delta` chunks, transcripts, function calls and a closing `response.done`. Where the two
differ (§3.6) the difference is a field of `Dialect`, never a branch on the vendor's name, a copy of this module,
or a subclass overriding its privates (aesthetics §8.9, §9.3). The vendor modules (`providers/openai_realtime.py`,
`providers/xai.py`) hold their `Dialect` and a thin adapter class.

`RealtimeClientProtocol` turns server frames into `providers.events` and never raises on peer input: a frame it
cannot understand becomes a non-fatal `ProviderError` carrying the raw frame. Invalid output audio (bad base64)
is fatal (HR1). An `error` before the session is configured is fatal too: the shell turns it into
`ProviderUnavailable`.

Language: `SessionSettings.language` (BCP 47, "de-DE") goes in `audio.input.transcription` as its ISO 639-1
code (`Dialect.transcription_language`: OpenAI `language`, xAI `language_hint`), so the caller's words are
transcribed in it; neither protocol has a field for the language the model speaks, so the instructions end
with "Speak German (de-DE)." (providers/language.py). A language without an ISO 639-1 code ("yue") cannot be
given to the transcription: the adapter refuses it (ValueError) rather than send half of it.

Commits and turn detection: `SessionSettings.turn_detection="server"` configures server VAD (it commits each
caller turn and answers it); `"client"` sends `turn_detection: null` (§1.3, §3.3), and the engine ends each turn
with `commit_input()` (RO5): `input_audio_buffer.commit`, then `response.create` where the dialect needs one
(GA; xAI answers a manual commit by itself, §3.4). In server mode `commit_input()` commits what the VAD has not
taken yet, without asking for an answer (RO2's commit at the hard stop), and only while the VAD has an utterance
open (speech started, not yet committed). The core counts the audio appended since the last commit so that it
never sends a commit the server must refuse (under 100 ms, §1.9).

Response bookkeeping (the one piece of state that is more than translation): the core tracks which responses
are active (`response.created` .. `response.done`) and whether it has asked for one that has not started yet.
`response.cancel` goes out only when something is active, and a `response.create` wanted while a response is
active (a tool result, a spoken text) waits for that response's `response.done`, so the bridge never triggers
`conversation_already_has_active_response` (§1.7).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from binascii import b2a_base64
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from providers.base import Capabilities, SessionSettings
from providers.batching import DEFAULT_APPEND_MS, caller_input
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
    bounded,
)
from providers.language import iso639_1, with_speak_line
from providers.limits import AudioLimits, require_limits
from providers.ws_shell import WebSocketShell, WireTapFactory
from rtp.audio import PCM16_24K, PCMA_8K, PCMU_8K, AudioFormat
from rtp.g711 import alaw_encode, ulaw_encode

RAW_LOG_LIMIT = 2000  # characters of an offending frame kept for the log
MIN_COMMIT_BYTES = 800  # 100 ms of 8 kHz G.711, the least audio a commit may hold (§1.9 commit_empty)
HISTORY_ROLES = ("user", "assistant", "system")
_APPEND_HEAD, _APPEND_TAIL = b'{"type":"input_audio_buffer.append","audio":"', b'"}'

UsageReader = Callable[[int, dict[str, Any]], UsageUpdated | None]
"""Reads the usage a dialect reports in `response.done` (token, event) -> event or None."""


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def token_usage(token: int, event: dict[str, Any]) -> UsageUpdated | None:
    """OpenAI GA (§1.8): `response.done.response.usage` holds the tokens of that one response, to be added."""
    usage = (event.get("response") or {}).get("usage")
    if not isinstance(usage, dict):
        return None
    input_tokens, output_tokens = (
        _int_or_none(usage.get("input_tokens")),
        _int_or_none(usage.get("output_tokens")),
    )
    if input_tokens is None and output_tokens is None:
        return None
    return UsageUpdated(token, input_tokens=input_tokens, output_tokens=output_tokens, cumulative=False)


def billable_audio_usage(token: int, event: dict[str, Any]) -> UsageUpdated | None:
    """xAI (§3.6): `billable_audio_seconds`, a running total for the conversation, in the top-level `usage` of
    `response.done` (where xAI actually sends it) or in `response.usage`. A snapshot: it replaces, never adds."""
    for usage in (event.get("usage"), (event.get("response") or {}).get("usage")):
        if isinstance(usage, dict):
            seconds = usage.get("billable_audio_seconds")
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                return UsageUpdated(token, audio_seconds=float(seconds), cumulative=True)
    return None


@dataclass(frozen=True, slots=True)
class Dialect:
    """Everything in which one Realtime-family protocol differs from another (§3.6 and §4)."""

    name: str
    default_url: str
    """Scheme, host and path of the endpoint; the model goes in `?model=`."""
    default_model: str
    default_voice: str
    transcription_model: str
    """Input transcription model asked for in `session.update` (OpenAI `gpt-live-transcribe`, xAI `grok-transcribe`)."""
    transcription_language: str
    """Key of the caller's language (ISO 639-1) in `audio.input.transcription`: OpenAI `language`, xAI
    `language_hint` (§1.3, §3.3)."""
    session_type: str | None
    """`session.type` in `session.update`: required by OpenAI GA (`"realtime"`), absent on xAI."""
    nested_audio_settings: bool
    """GA nests `voice` under `audio.output` and `turn_detection` under `audio.input`; xAI puts both at the top
    level of `session`."""
    format_with_rate: bool
    """Whether `audio.*.format` names the rate for G.711 too (`{type, rate}`), or only the type (GA)."""
    session_update_after: frozenset[str]
    """Server events, any one of which means the connection is ready for `session.update` (the first one wins)."""
    input_transcript_partial: str
    """Event carrying partial input transcripts: GA `.delta` fragments, xAI `.updated` whole snapshots."""
    cumulative_input_transcripts: bool
    """Partial (and final) input transcripts are whole snapshots to replace, not fragments to append (xAI)."""
    text_event_prefix: str
    """Text-output events: GA `response.output_text`, xAI the beta name `response.text` (+ `.delta` / `.done`)."""
    assistant_text_type: str
    """Content type of an assistant text message in `conversation.item.create` (`output_text`)."""
    supports_truncate: bool
    """`conversation.item.truncate` is honoured (GA); without it `truncate()` sends nothing (xAI)."""
    commit_answers: bool
    """With turn detection off, the server answers an `input_audio_buffer.commit` by itself (xAI, §3.4); GA needs
    a `response.create` after the commit (§1.3: "manual: client commits and calls `response.create`")."""
    usage: UsageReader
    """How `response.done` reports usage (per-response tokens, or a running audio-seconds total)."""


def server_vad() -> dict[str, Any]:
    """Server turn detection that answers and lets the caller interrupt (§1.3, §3.3)."""
    return {"type": "server_vad", "create_response": True, "interrupt_response": True}


def audio_format_json(dialect: Dialect, fmt: AudioFormat) -> dict[str, Any]:
    """`audio.*.format` for `fmt` in the dialect's shape."""
    return (
        {"type": fmt.encoding.value, "rate": fmt.rate}
        if dialect.format_with_rate
        else {"type": fmt.encoding.value}
    )


def turn_detection(settings: SessionSettings) -> dict[str, Any] | None:
    """Server VAD, or `null` (turn detection off: the client commits each turn, RO5) for `turn_detection="client"`."""
    return None if settings.turn_detection == "client" else server_vad()


def session_update_frame(dialect: Dialect, settings: SessionSettings, fmt: AudioFormat) -> dict[str, Any]:
    """The `session.update` client event: `fmt` both ways (G.711, or PCM16 at 24 kHz on a 16 kHz leg), server VAD (or none in client turn-detection mode),
    input transcription, function tools. The call's language (module docstring) goes in the transcription's
    language field and, since the protocol has no field for the model's spoken language, in the instructions."""
    voice = settings.voice or dialect.default_voice
    transcription = {"model": dialect.transcription_model}
    if settings.language:
        transcription[dialect.transcription_language] = iso639_1(settings.language)
    audio_in: dict[str, Any] = {"format": audio_format_json(dialect, fmt), "transcription": transcription}
    audio_out: dict[str, Any] = {"format": audio_format_json(dialect, fmt)}
    session: dict[str, Any] = {}
    if dialect.session_type is not None:
        session["type"] = dialect.session_type
    instructions = with_speak_line(settings.instructions, settings.language)
    if instructions:
        session["instructions"] = instructions
    if dialect.nested_audio_settings:
        audio_in["turn_detection"] = turn_detection(settings)
        audio_out["voice"] = voice
    else:
        session["voice"] = voice
        session["turn_detection"] = turn_detection(settings)
    session["audio"] = {"input": audio_in, "output": audio_out}
    if settings.tools:
        session["tools"] = [
            {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
            for t in settings.tools
        ]
    return {"type": "session.update", "session": session}


def message_item_frame(dialect: Dialect, role: str, text: str) -> dict[str, Any]:
    """A `conversation.item.create` text message (assistant text is output text, the rest input text)."""
    kind = dialect.assistant_text_type if role == "assistant" else "input_text"
    item = {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}
    return {"type": "conversation.item.create", "item": item}


class RealtimeClientProtocol:
    """The client side of one Realtime-family connection, without I/O. `token` tags every event it produces.

    Inputs: `receive_text` (server frames) and commands (`append_audio`, `truncate`, `cancel_response`,
    `send_tool_result`, `send_text`). Outputs: the returned events, and frames pulled with `frames_to_send()`.
    """

    def __init__(
        self,
        dialect: Dialect,
        settings: SessionSettings,
        token: int = 1,
        *,
        audio_format: AudioFormat = PCMU_8K,
    ) -> None:
        if audio_format not in (PCMU_8K, PCMA_8K, PCM16_24K):
            raise ValueError(
                f"the telephone bridge speaks 8 kHz G.711 or 24 kHz PCM16 to {dialect.name}, not {audio_format}"
            )
        for role, _ in settings.history:
            if role not in HISTORY_ROLES:
                raise ValueError(f"history role must be one of {HISTORY_ROLES}, got {role!r}")
        if settings.language:
            iso639_1(settings.language)  # ValueError now, not when the server's session.created arrives
        self.dialect = dialect
        self.settings = settings
        self.audio_format = audio_format
        self.token = token
        self.configuring = False  # session.update sent, session.updated not yet received
        self.started = False
        self.closed = False  # the Realtime protocols have no "session closed" message: the socket says it
        self.session_id: str | None = None
        self.expires_at: int | None = None
        self.bytes_received = 0
        self._conversation_id: str | None = None
        self._outgoing: list[str] = []
        self._active: set[str] = set()  # ids of responses between response.created and response.done
        self._create_sent = False  # response.create sent, its response.created not yet seen
        self._create_wanted = False  # response.create deferred until the active response is done
        self._tool_names: dict[str, str] = {}  # call_id -> name, from function_call output items
        self._output_text: dict[str, list[str]] = {}  # item_id -> transcript fragments, for a bare `.done`
        self._audio_item: dict[str, str] = {}  # response_id -> item_id of its latest audio
        self._uncommitted = 0  # bytes appended since the input buffer was last committed or cleared
        self._own_commits = 0  # our commits whose `input_audio_buffer.committed` has not arrived yet
        self._speech_open = False  # the server VAD heard the caller start and has not committed the utterance
        self._handlers = _handlers(dialect)  # (functions, not bound methods: no cycle through self)
        # Everything else (rate_limits.updated, conversation.item.*, content parts, xAI's keepalive `ping`, ...)
        # carries nothing the session engine needs and is ignored.

    # -- outputs ---------------------------------------------------------------------------------------------

    def frames_to_send(self) -> list[str]:
        frames, self._outgoing = self._outgoing, []
        return frames

    def close_frames(self) -> list[str]:
        """Nothing: the Realtime protocols end a session by closing the socket."""
        return []

    @property
    def response_active(self) -> bool:
        """A response is being generated, or has been asked for and not yet started."""
        return bool(self._active) or self._create_sent

    # -- commands --------------------------------------------------------------------------------------------

    def append_audio(self, audio: bytes) -> bytes:
        """An `input_audio_buffer.append` frame (UTF-8) for audio already in the session's format (returned, not
        queued: the shell queues audio separately so that it may drop it under back-pressure)."""
        self._uncommitted += len(audio)
        # The hot path: base64 needs no JSON escaping, so the frame is built as the bytes that go on the wire.
        return _APPEND_HEAD + b2a_base64(audio, newline=False) + _APPEND_TAIL

    def commit_input(self) -> None:
        """`input_audio_buffer.commit` for the caller audio appended since the last commit (RO2 at the hard stop,
        RO5 in client mode), so the server transcribes it as one user item; with turn detection off, also the
        response that answers it where the dialect does not answer a commit by itself (GA `response.create`,
        deferred while a response is active). Nothing when under 100 ms are uncommitted: the server would
        refuse the commit (`input_audio_buffer_commit_empty`), and a server-VAD commit has already taken it; in
        server mode nothing either while the VAD hears no one (it would commit silence as an empty user turn)."""
        if self._uncommitted < MIN_COMMIT_BYTES * self.audio_format.bytes_per_ms // 8:  # 100 ms in its format
            return
        if self.settings.turn_detection == "server" and not self._speech_open:
            return
        self._speech_open = False
        self._uncommitted = 0
        self._own_commits += 1
        self._send({"type": "input_audio_buffer.commit"})
        if self.settings.turn_detection == "client" and not self.dialect.commit_answers:
            self._request_response()

    def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """The caller heard only `audio_end_ms` of assistant item `item_id` (§1.6); nothing where unsupported."""
        if self.dialect.supports_truncate:
            self._send(
                {
                    "type": "conversation.item.truncate",
                    "item_id": item_id,
                    "content_index": 0,
                    "audio_end_ms": max(0, int(audio_end_ms)),
                }
            )

    def cancel_response(self) -> None:
        """`response.cancel`, only while a response is active (otherwise the server answers with an error)."""
        if self._active:
            self._send({"type": "response.cancel"})

    def send_tool_result(self, call_id: str, output: str) -> None:
        """The function's output, then a response that speaks it (deferred while a response is active)."""
        self._send(
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": call_id, "output": output},
            }
        )
        self._request_response()

    def send_text(self, text: str, *, speak: bool = False) -> None:
        """A user text message as context; with `speak`, a response follows (deferred while one is active)."""
        self._send(message_item_frame(self.dialect, "user", text))
        if speak:
            self._request_response()

    def _request_response(self) -> None:
        if self.response_active:
            self._create_wanted = True
        else:
            self._send({"type": "response.create"})
            self._create_sent = True

    def _send(self, event: dict[str, Any]) -> None:
        self._outgoing.append(self._frame(event))

    @staticmethod
    def _frame(event: dict[str, Any]) -> str:
        return orjson.dumps(event).decode()

    # -- server frames ---------------------------------------------------------------------------------------

    def receive_text(self, text: str | bytes) -> list[ProviderEvent]:
        """Events for one server frame. Never raises."""
        try:
            event = orjson.loads(text)
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ValueError("not a JSON object with a string 'type'")
            handler = self._handlers.get(event["type"])
            return [] if handler is None else handler(self, event)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return [
                self._protocol_error("invalid_event", f"unparseable server event: {exc}", text, fatal=False)
            ]

    def _on_session_created(self, event: dict[str, Any]) -> list[ProviderEvent]:
        session = event.get("session") or {}
        self.session_id = _str_or_none(session.get("id")) or self.session_id
        self.expires_at = _int_or_none(session.get("expires_at")) or self.expires_at
        return self._maybe_configure("session.created")

    def _on_conversation_created(self, event: dict[str, Any]) -> list[ProviderEvent]:
        self._conversation_id = _str_or_none((event.get("conversation") or {}).get("id"))
        return self._maybe_configure("conversation.created")

    def _maybe_configure(self, trigger: str) -> list[ProviderEvent]:
        if trigger in self.dialect.session_update_after and not (self.configuring or self.started):
            self._send(session_update_frame(self.dialect, self.settings, self.audio_format))
            self.configuring = True
        return []

    def _on_session_updated(self, event: dict[str, Any]) -> list[ProviderEvent]:
        if self.started:
            return []  # the echo of a later update
        session = event.get("session") or {}
        self.session_id = _str_or_none(session.get("id")) or self.session_id
        self.expires_at = _int_or_none(session.get("expires_at")) or self.expires_at
        self.started, self.configuring = True, False
        for role, text in self.settings.history:  # seeded before the caller speaks
            self._send(message_item_frame(self.dialect, role, text))
        return [SessionStarted(self.token, self.session_id or self._conversation_id or "", self.expires_at)]

    def _on_error(self, event: dict[str, Any]) -> list[ProviderEvent]:
        error = event.get("error") or {}
        code = bounded(error.get("code") or error.get("type") or "error")  # the provider's words: bounded
        message = bounded(error.get("message", ""))
        raw = _clip(event)
        if not self.started:  # the session was refused: nothing else will configure it
            return [ProviderError(self.token, code, message, fatal=True, raw=raw)]
        if (
            code == "input_audio_buffer_commit_empty" and self._own_commits
        ):  # our commit will not be acknowledged
            self._own_commits -= 1
        if code == "conversation_already_has_active_response":  # only our response.create causes it
            self._create_sent = False
            self._request_response()  # ask again once the response in the way is done
        if code == "session_expired":  # §1.9: the server closes with 1001 next
            self.closed = True
            expiring = SessionExpiring(self.token, 0, "session_expired")
            return [expiring, ProviderError(self.token, code, message, fatal=False, raw=raw)]
        return [ProviderError(self.token, code, message, fatal=False, raw=raw)]

    def _on_speech_started(self, event: dict[str, Any]) -> list[ProviderEvent]:
        self._speech_open = True
        at_ms, item_id = _int_or_none(event.get("audio_start_ms")), _str_or_none(event.get("item_id"))
        return [SpeechStarted(self.token, at_ms, item_id)]

    def _on_speech_stopped(self, event: dict[str, Any]) -> list[ProviderEvent]:
        self._speech_open = False  # the VAD commits the utterance itself
        at_ms, item_id = _int_or_none(event.get("audio_end_ms")), _str_or_none(event.get("item_id"))
        return [SpeechStopped(self.token, at_ms, item_id)]

    def _on_committed(self, event: dict[str, Any]) -> list[ProviderEvent]:
        if self._own_commits:
            self._own_commits -= 1  # ours: the count already restarted when we sent it
        else:
            self._uncommitted = 0  # the server's VAD committed the buffer
            self._speech_open = False
        return []

    def _on_cleared(self, event: dict[str, Any]) -> list[ProviderEvent]:
        self._uncommitted = 0
        self._speech_open = False
        return []

    def _on_response_created(self, event: dict[str, Any]) -> list[ProviderEvent]:
        self._active.add(str(event["response"]["id"]))
        self._create_sent = False
        return []

    def _on_response_done(self, event: dict[str, Any]) -> list[ProviderEvent]:
        response = event["response"]
        response_id = _str_or_none(response.get("id"))
        status = str(response.get("status") or "completed")
        output = response.get("output") or []
        self._active.discard(response_id or "")
        audio_item = self._audio_item.pop(response_id or "", None)
        for item in output:
            self._output_text.pop(str(item.get("id")), None)
        events: list[ProviderEvent] = [ResponseDone(self.token, response_id, status)]
        details = response.get("status_details") or {}
        if status == "cancelled" and details.get("reason") == "turn_detected":  # §1.6: barge-in
            message_ids = [str(i["id"]) for i in output if i.get("type") == "message" and "id" in i]
            events.append(OutputInterrupted(self.token, message_ids[0] if message_ids else audio_item))
        usage = self.dialect.usage(self.token, event)
        if usage is not None:
            events.append(usage)
        if self._create_wanted and not self.response_active:
            self._create_wanted = False
            self._request_response()
        return events

    def _on_output_item_added(self, event: dict[str, Any]) -> list[ProviderEvent]:
        item = event.get("item") or {}
        if item.get("type") == "function_call" and "call_id" in item and "name" in item:
            self._tool_names[str(item["call_id"])] = str(item["name"])
        return []

    def _on_audio_delta(self, event: dict[str, Any]) -> list[ProviderEvent]:
        delta = event["delta"]
        try:
            audio = base64.b64decode(delta, validate=True)
        except (binascii.Error, ValueError, TypeError):
            return [
                self._protocol_error("invalid_audio", "output audio is not valid base64", event, fatal=True)
            ]
        item_id = _str_or_none(event.get("item_id"))
        response_id = _str_or_none(event.get("response_id"))
        if response_id is not None and item_id is not None:
            self._audio_item[response_id] = item_id
        self.bytes_received += len(audio)
        return [AudioReceived(self.token, audio, self.audio_format, item_id)]

    def _on_output_transcript_delta(self, event: dict[str, Any]) -> list[ProviderEvent]:
        text, item_id = str(event["delta"]), _str_or_none(event.get("item_id"))
        if item_id is not None:
            self._output_text.setdefault(item_id, []).append(text)
        return [OutputTranscript(self.token, text, item_id)]

    def _on_output_transcript_done(self, event: dict[str, Any]) -> list[ProviderEvent]:
        item_id = _str_or_none(event.get("item_id"))
        fragments = self._output_text.pop(item_id or "", [])
        text = event.get("transcript", event.get("text"))  # xAI may omit it: what the deltas said
        final = str(text) if text is not None else "".join(fragments)
        return [OutputTranscript(self.token, final, item_id, final=True)]

    def _on_input_transcript_partial(self, event: dict[str, Any]) -> list[ProviderEvent]:
        cumulative = self.dialect.cumulative_input_transcripts
        text = str(event["transcript"] if cumulative else event["delta"])
        return [InputTranscript(self.token, text, _str_or_none(event.get("item_id")), cumulative=cumulative)]

    def _on_input_transcript_completed(self, event: dict[str, Any]) -> list[ProviderEvent]:
        return [
            InputTranscript(
                self.token,
                str(event["transcript"]),
                _str_or_none(event.get("item_id")),
                final=True,
                cumulative=self.dialect.cumulative_input_transcripts,
            )
        ]

    def _on_input_transcript_failed(self, event: dict[str, Any]) -> list[ProviderEvent]:
        error = event.get("error") or {}
        message = str(error.get("message") or error.get("code") or "transcription failed")
        return [InputTranscriptFailed(self.token, _str_or_none(event.get("item_id")), message)]

    def _on_function_call_done(self, event: dict[str, Any]) -> list[ProviderEvent]:
        call_id = str(event["call_id"])
        name = event.get("name") or self._tool_names.get(call_id)
        if not isinstance(name, str):
            return [
                self._protocol_error(
                    "invalid_event", f"function call {call_id} has no name", event, fatal=False
                )
            ]
        self._tool_names.pop(call_id, None)
        arguments = event.get("arguments")
        return [
            ToolCallRequested(
                self.token,
                call_id,
                name,
                arguments if isinstance(arguments, str) else "{}",
                item_id=_str_or_none(event.get("item_id")),
            )
        ]

    def _protocol_error(self, code: str, message: str, raw: object, *, fatal: bool) -> ProviderError:
        return ProviderError(self.token, code, message, fatal=fatal, raw=_clip(raw))


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _clip(raw: object) -> str:
    text = (
        raw
        if isinstance(raw, str)
        else raw.decode("utf-8", "replace")
        if isinstance(raw, bytes)
        else json.dumps(raw)
    )
    return text if len(text) <= RAW_LOG_LIMIT else text[:RAW_LOG_LIMIT] + "..."


def resolve_url(dialect: Dialect, url: str | None, model: str) -> str:
    """The session endpoint: the dialect's default, or `url` (the default path when it names only a host), with
    `?model=` added unless the query already names a model or attaches to a call (`call_id`)."""
    parts = urlsplit(url or dialect.default_url)
    if parts.path in ("", "/"):
        parts = parts._replace(path=urlsplit(dialect.default_url).path)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not any(key in ("model", "call_id") for key, _ in query):
        parts = parts._replace(query=urlencode([*query, ("model", model)]))
    return urlunsplit(parts)


_ENCODERS = {PCMU_8K: ulaw_encode, PCMA_8K: alaw_encode}


class RealtimeAdapter:
    """A Realtime-family protocol as a `providers.base.Provider`: the client core inside a `WebSocketShell`.

    A vendor module subclasses it only to name itself: `name`, `capabilities`, `dialect` and a `log`; it adds no
    behaviour (the differences live in the `Dialect`).
    """

    name: ClassVar[str]
    capabilities: Capabilities  # (the vendor's, per class; an instance with its own batcher joins no frames)
    dialect: ClassVar[Dialect]
    log: ClassVar[logging.Logger]

    @staticmethod
    def check_language(tag: str) -> None:
        """ValueError unless `tag` has an ISO 639-1 code for the transcription (module docstring)."""
        iso639_1(tag)

    def __init__(
        self,
        api_key: str,
        settings: SessionSettings,
        *,
        limits: AudioLimits | None,
        url: str | None = None,
        token: int = 1,
        connect_timeout: float = 10.0,
        model: str | None = None,
        wire_tap: WireTapFactory | None = None,
        append_ms: int = DEFAULT_APPEND_MS,
        audio_format: AudioFormat = PCMU_8K,
    ) -> None:
        """`append_ms`: caller audio per `input_audio_buffer.append` (providers/batching.py); `audio_format`
        both ways: G.711, or PCM16 at 24 kHz on a 16 kHz leg (sip.leg `CallIdentity.media_rate`)."""
        if settings.turn_detection == "client" and not self.capabilities.client_commits:
            raise ValueError(f"{self.name} cannot switch turn detection off (turn_detection='client')")
        self._limits = require_limits(limits, type(self).__name__)
        self.model = model or settings.model or self.dialect.default_model
        self.core = RealtimeClientProtocol(self.dialect, settings, token, audio_format=audio_format)
        self.token = token
        self.url = resolve_url(self.dialect, url, self.model)
        given = caller_input(audio_format, _ENCODERS, append_ms, self.capabilities)
        self._pcm, self._encode, self._batch, self.capabilities = (
            given.pcm,
            given.encode,
            given.batch,
            given.capabilities,
        )
        self._closing: asyncio.Task[None] | None = None
        self.shell = WebSocketShell(
            self.core,
            self.url,
            {"Authorization": f"Bearer {api_key}"},
            log=self.log,
            connect_timeout=connect_timeout,
            wire_tap=wire_tap,
        )

    @property
    def output_format(self) -> AudioFormat:
        return self.core.audio_format

    @property
    def limits(self) -> AudioLimits:
        return self._limits

    async def connect(self) -> SessionStarted:
        return await self.shell.connect()

    def send_audio(self, pcm16_8k: bytes, wide: bool = False) -> None:
        """G.711 at 8 kHz (`Capabilities.wide_input` False: a 16 kHz leg's frames come as their 8 kHz view);
        PCM16 at 24 kHz from the 16 kHz frames as they are (`wide`), or from 8 kHz ones."""
        pcm = self._pcm
        audio = self._encode(pcm16_8k) if pcm is None else pcm(pcm16_8k, wide)
        if self._batch is not None:
            batch = self._batch.add(audio)
            if batch is None:
                return
            audio = batch
        self.shell.send_audio_frame(self.core.append_audio(audio))

    def truncate(self, item_id: str, audio_end_ms: int) -> None:
        self.core.truncate(item_id, audio_end_ms)
        self.shell.flush()

    def cancel_response(self) -> None:
        self.core.cancel_response()
        self.shell.flush()

    def commit_input(self) -> None:
        if self._batch is not None and (held := self._batch.take()):
            self.shell.send_audio_frame(self.core.append_audio(held))  # the commit follows all its audio
        self.core.commit_input()
        self.shell.flush()

    def send_tool_result(self, call_id: str, name: str, output: str) -> None:
        self.core.send_tool_result(call_id, output)
        self.shell.flush()

    def send_text(self, text: str, *, speak: bool = False) -> None:
        self.core.send_text(text, speak=speak)
        self.shell.flush()

    def events(self) -> AsyncIterator[ProviderEvent]:
        return self.shell.events()

    def deliver_to(self, sink: Callable[[ProviderEvent], None]) -> None:
        self.shell.deliver_to(sink)

    def request_close(self) -> None:
        """The protocol has no close message: close the socket (`events()` then ends with `SessionClosed`)."""
        self.shell.request_close()
        if self._closing is None:
            name = f"{self.name}-close-{self.token}"
            self._closing = asyncio.get_running_loop().create_task(self.shell.close(), name=name)

    async def close(self, timeout: float = 2.0) -> None:
        await self.shell.close(timeout)
        if self._closing is not None:
            await self._closing


@cache
def _handlers(
    dialect: Dialect,
) -> dict[str, Callable[[RealtimeClientProtocol, dict[str, Any]], list[ProviderEvent]]]:
    """The server events a core handles, by type, for its dialect. A table of bound methods in each
    core made every core a cycle, freed only by a full collection (100 cores and 2,100 methods of garbage
    every 2.5 minutes at 100 calls); plain functions, shared by every core of a dialect, make none."""
    partial = f"conversation.item.input_audio_transcription.{dialect.input_transcript_partial}"
    c = RealtimeClientProtocol
    return {
        "session.created": c._on_session_created,
        "conversation.created": c._on_conversation_created,
        "session.updated": c._on_session_updated,
        "error": c._on_error,
        "input_audio_buffer.speech_started": c._on_speech_started,
        "input_audio_buffer.speech_stopped": c._on_speech_stopped,
        "input_audio_buffer.committed": c._on_committed,
        "input_audio_buffer.cleared": c._on_cleared,
        "response.created": c._on_response_created,
        "response.done": c._on_response_done,
        "response.output_item.added": c._on_output_item_added,
        "response.output_audio.delta": c._on_audio_delta,
        "response.output_audio_transcript.delta": c._on_output_transcript_delta,
        "response.output_audio_transcript.done": c._on_output_transcript_done,
        f"{dialect.text_event_prefix}.delta": c._on_output_transcript_delta,
        f"{dialect.text_event_prefix}.done": c._on_output_transcript_done,
        partial: c._on_input_transcript_partial,
        "conversation.item.input_audio_transcription.completed": c._on_input_transcript_completed,
        "conversation.item.input_audio_transcription.failed": c._on_input_transcript_failed,
        "response.function_call_arguments.done": c._on_function_call_done,
    }
