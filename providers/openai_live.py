"""OpenAI GPT-Live adapter (shared/reference/providers.md §1.13): a sans-I/O client core and a thin shell.

GPT-Live is full duplex with no turn detection to configure: the client sends `session.start`, waits for
`session.started`, then streams `session.input_audio.append` and plays `session.output_audio.delta`, which the
server paces near real time. Transcripts arrive as `session.input_transcript.delta` and
`session.output_transcript.delta` with session-timeline `start_ms`/`end_ms`; usage as cumulative
`session.usage.updated` snapshots; the end as `session.closed` with a reason and final usage.

`LiveClientProtocol` turns server frames into `providers.events` and never raises on peer input: a frame it
cannot understand becomes a `ProviderError` carrying the raw frame. Invalid audio (bad base64, an odd PCM16
length) is fatal (HR1): playing a guess would be worse than failing clearly.

Language: `session.start` has no language field and its config is strict (unknown fields are refused, §1.13),
so the call's language (`SessionSettings.language`, BCP 47) is the last line of the instructions, "Speak German
(de-DE)." (providers/language.py); GPT-Live's own transcription follows the speech. Any tag can be said so.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from binascii import b2a_base64
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from providers.base import Capabilities, SessionSettings
from providers.batching import DEFAULT_APPEND_MS, caller_input
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputTranscript,
    ProviderError,
    ProviderEvent,
    SessionClosed,
    SessionStarted,
    ToolCallRequested,
    UsageUpdated,
    bounded,
)
from providers.language import with_speak_line
from providers.limits import GPT_LIVE, AudioLimits, require_limits
from providers.ws_shell import WebSocketShell, WireTapFactory
from rtp.audio import PCM16_24K, PCMA_8K, PCMU_8K, AudioFormat, Encoding
from rtp.g711 import alaw_encode, ulaw_encode

log = logging.getLogger("parlora.providers.openai_live")

DEFAULT_URL = "wss://api.openai.com/v1/live/sessions"
DEFAULT_PATH = "/v1/live/sessions"
RAW_LOG_LIMIT = 2000  # characters of an offending frame kept for the log
_APPEND_HEAD, _APPEND_TAIL = b'{"type":"session.input_audio.append","audio":"', b'"}'


@dataclass(frozen=True, slots=True)
class LiveConfig:
    """What `session.start` says. Model, instructions, voice and format are immutable after start."""

    model: str = "gpt-live-1"
    instructions: str | None = None
    voice: str = "marin"
    audio_format: AudioFormat = PCMU_8K
    history: tuple[tuple[str, str], ...] = ()  # (role, text) given as `session.input` (at most 128 messages)
    language: str | None = None  # BCP 47: a line of the instructions (module docstring)

    @classmethod
    def from_settings(cls, settings: SessionSettings, audio_format: AudioFormat = PCMU_8K) -> LiveConfig:
        defaults = cls()
        return cls(
            model=settings.model or defaults.model,
            instructions=settings.instructions,
            voice=settings.voice or defaults.voice,
            audio_format=audio_format,
            history=settings.history[-128:],
            language=settings.language,
        )


def session_start_frame(config: LiveConfig) -> dict[str, Any]:
    """The `session.start` client event for `config`."""
    session: dict[str, Any] = {
        "model": config.model,
        "audio": {
            "format": {"type": config.audio_format.encoding.value, "rate": config.audio_format.rate},
            "output": {"voice": config.voice},
        },
        "delegation": {"type": "client"},
    }
    instructions = with_speak_line(config.instructions, config.language)
    if instructions:
        session["instructions"] = instructions
    if config.history:
        session["input"] = [_history_item(role, text) for role, text in config.history]
    return {"type": "session.start", "session": session}


def _history_item(role: str, text: str) -> dict[str, Any]:
    """One `session.input` message: GPT-Live knows developer, user and assistant text, one part each."""
    role = "developer" if role == "system" else role
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


class LiveClientProtocol:
    """The client side of one GPT-Live connection, without I/O. `token` tags every event it produces.

    Inputs: `receive_text` (server frames) and commands (`append_audio`, `append_commentary`, ...).
    Outputs: the returned events, and frames pulled with `frames_to_send()`.
    """

    def __init__(self, config: LiveConfig, token: int = 1) -> None:
        self.config = config
        self.token = token
        self.started = False
        self.closed = False
        self.bytes_received = 0
        self._outgoing: list[str] = [self._frame(session_start_frame(config))]

    def frames_to_send(self) -> list[str]:
        frames, self._outgoing = self._outgoing, []
        return frames

    def close_frames(self) -> list[str]:
        return [] if self.closed else [self._frame({"type": "session.close"})]

    def append_audio(self, audio: bytes) -> bytes:
        """A `session.input_audio.append` frame (UTF-8) for audio already in the session's format (returned, not
        queued: the shell queues audio separately so that it may drop it under back-pressure)."""
        # The hot path: base64 needs no JSON escaping, so the frame is built as the bytes that go on the wire.
        return _APPEND_HEAD + b2a_base64(audio, newline=False) + _APPEND_TAIL

    def append_commentary(self, content: str, delegation_id: str | None) -> None:
        """Spoken context: GPT-Live says it (the answer to a delegation, or a session-wide update)."""
        self._outgoing.append(
            self._frame(
                {"type": "session.commentary.append", "content": content, "delegation_id": delegation_id}
            )
        )

    def append_thinking(self, content: str, delegation_id: str | None) -> None:
        """Silent context: GPT-Live knows it but does not say it."""
        self._outgoing.append(
            self._frame(
                {"type": "session.thinking.append", "content": content, "delegation_id": delegation_id}
            )
        )

    @staticmethod
    def _frame(event: dict[str, Any]) -> str:
        return orjson.dumps(event).decode()

    def receive_text(self, text: str | bytes) -> list[ProviderEvent]:
        """Events for one server frame. Never raises."""
        try:
            event = orjson.loads(text)
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ValueError("not a JSON object with a string 'type'")
            return self._dispatch(event)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return [
                self._protocol_error("invalid_event", f"unparseable server event: {exc}", text, fatal=False)
            ]

    def _dispatch(self, event: dict[str, Any]) -> list[ProviderEvent]:
        kind = event["type"]
        if kind == "session.output_audio.delta":
            return [self._audio(event)]
        if kind == "session.input_transcript.delta":
            return [
                InputTranscript(
                    self.token,
                    str(event["delta"]),
                    start_ms=event.get("start_ms"),
                    end_ms=event.get("end_ms"),
                )
            ]
        if kind == "session.output_transcript.delta":
            return [
                OutputTranscript(
                    self.token,
                    str(event["delta"]),
                    start_ms=event.get("start_ms"),
                    end_ms=event.get("end_ms"),
                )
            ]
        if kind == "session.usage.updated":
            return [UsageUpdated(self.token, audio_seconds=float(event["usage"]["seconds"]))]
        if kind == "session.delegation.created":
            delegation = event["delegation"]
            return [
                ToolCallRequested(
                    self.token,
                    str(delegation["id"]),
                    str(delegation.get("target", "client")),
                    kind="delegation",
                    at_ms=event.get("offset_ms"),
                )
            ]
        if kind == "session.started":
            self.started = True
            session = event.get("session") or {}
            return [SessionStarted(self.token, str(session.get("id", "")), session.get("expires_at"))]
        if kind == "session.closed":
            self.closed = True
            usage = event.get("usage") or {}
            seconds = usage.get("seconds")
            return [
                SessionClosed(
                    self.token,
                    bounded(event.get("reason", "unknown")),  # the provider's words: bounded
                    True,
                    None if seconds is None else float(seconds),
                )
            ]
        if kind == "error":
            error = event.get("error") or {}
            code = bounded(error.get("code") or error.get("type") or "error")  # the provider's words: bounded
            # GPT-Live errors answer a client command; the session stays open.
            return [
                ProviderError(
                    self.token, code, bounded(error.get("message", "")), fatal=False, raw=_clip(event)
                )
            ]
        return []  # events this bridge does not use (info, commentary acks, ...)

    def _audio(self, event: dict[str, Any]) -> ProviderEvent:
        delta = event["delta"]
        try:
            audio = base64.b64decode(delta, validate=True)
        except (binascii.Error, ValueError, TypeError):
            return self._protocol_error(
                "invalid_audio", "output audio is not valid base64", event, fatal=True
            )
        fmt = self.config.audio_format
        if fmt.encoding is Encoding.PCM16 and len(audio) % 2:
            return self._protocol_error(
                "invalid_audio",
                f"PCM16 output audio has an odd length ({len(audio)} bytes)",
                event,
                fatal=True,
            )
        self.bytes_received += len(audio)
        return AudioReceived(self.token, audio, fmt)

    def _protocol_error(self, code: str, message: str, raw: object, *, fatal: bool) -> ProviderError:
        return ProviderError(self.token, code, message, fatal=fatal, raw=_clip(raw))


def _clip(raw: object) -> str:
    text = (
        raw
        if isinstance(raw, str)
        else raw.decode("utf-8", "replace")
        if isinstance(raw, bytes)
        else json.dumps(raw)
    )
    return text if len(text) <= RAW_LOG_LIMIT else text[:RAW_LOG_LIMIT] + "..."


def resolve_url(url: str | None) -> str:
    """The session endpoint: the default, or `url` with the default path when it names only a host."""
    if not url:
        return DEFAULT_URL
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path=DEFAULT_PATH)
    return urlunsplit(parts)


_ENCODERS = {PCMU_8K: ulaw_encode, PCMA_8K: alaw_encode}


class OpenAILiveAdapter:
    """GPT-Live as a `providers.base.Provider`: the client core inside a `WebSocketShell`."""

    name = "openai-live"
    capabilities = Capabilities(
        server_vad=False, speech_end_events=False, timed_captions=True, truncate=False, append_frames=2
    )

    def __init__(
        self,
        api_key: str,
        config: LiveConfig,
        *,
        limits: AudioLimits | None,
        url: str | None = None,
        token: int = 1,
        connect_timeout: float = 10.0,
        wire_tap: WireTapFactory | None = None,
        append_ms: int = DEFAULT_APPEND_MS,
    ) -> None:
        """`append_ms`: caller audio per `session.input_audio.append` (providers/batching.py)."""
        if config.audio_format not in _ENCODERS and config.audio_format != PCM16_24K:
            raise ValueError(
                f"the telephone bridge speaks 8 kHz G.711 or 24 kHz PCM16 to GPT-Live, not {config.audio_format}"
            )
        self._limits = require_limits(limits, type(self).__name__)
        self.core = LiveClientProtocol(config, token)
        self.token = token
        self.url = resolve_url(url)
        given = caller_input(config.audio_format, _ENCODERS, append_ms, self.capabilities)
        self._pcm, self._encode, self._batch, self.capabilities = (
            given.pcm,
            given.encode,
            given.batch,
            given.capabilities,
        )
        self.shell = WebSocketShell(
            self.core,
            self.url,
            {"Authorization": f"Bearer {api_key}"},
            log=log,
            connect_timeout=connect_timeout,
            wire_tap=wire_tap,
        )

    @staticmethod
    def check_language(tag: str) -> None:
        """Any language: it is a line of the instructions (module docstring)."""

    @staticmethod
    def audio_limits(fmt: AudioFormat) -> AudioLimits:
        """GPT-Live paces its output near real time: 2 s of capacity, a 3 s residence deadline (DESIGN §5)."""
        return GPT_LIVE.for_format(fmt)

    @property
    def output_format(self) -> AudioFormat:
        return self.core.config.audio_format

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
        """GPT-Live has no truncation; its server-side mixer owns what was said."""

    def cancel_response(self) -> None:
        """GPT-Live has no response to cancel: it is one continuous full-duplex stream."""

    def commit_input(self) -> None:
        """Nothing to commit (§1.13): GPT-Live has no input buffer, commit or turn detection to configure; the
        server transcribes and answers the stream as it arrives, so every frame sent is already taken in."""

    def send_tool_result(self, call_id: str, name: str, output: str) -> None:
        self.core.append_commentary(output, call_id)
        self.shell.flush()

    def send_text(self, text: str, *, speak: bool = False) -> None:
        if speak:
            self.core.append_commentary(text, None)
        else:
            self.core.append_thinking(text, None)
        self.shell.flush()

    def events(self) -> AsyncIterator[ProviderEvent]:
        return self.shell.events()

    def deliver_to(self, sink: Callable[[ProviderEvent], None]) -> None:
        self.shell.deliver_to(sink)

    def request_close(self) -> None:
        self.shell.request_close()

    async def close(self, timeout: float = 2.0) -> None:
        await self.shell.close(timeout)
