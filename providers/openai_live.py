"""OpenAI GPT-Live adapter (shared/reference/providers.md §1.13): a sans-I/O client core and a thin shell.

GPT-Live is full duplex with no turn detection to configure: the client sends `session.start`, waits for
`session.started`, then streams `session.input_audio.append` and plays `session.output_audio.delta`, which the
server paces near real time. Transcripts arrive as `session.input_transcript.delta` and
`session.output_transcript.delta` with session-timeline `start_ms`/`end_ms`; usage as cumulative
`session.usage.updated` snapshots; the end as `session.closed` with a reason and final usage.

`LiveClientProtocol` turns server frames into `providers.events` and never raises on peer input: a frame it
cannot understand becomes a `ProviderError` carrying the raw frame. Invalid audio (bad base64, an odd PCM16
length) is fatal (HR1): playing a guess would be worse than failing clearly.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from providers.base import ProviderUnavailable
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputTranscript,
    ProviderError,
    ProviderEvent,
    SessionClosed,
    SessionStarted,
    UsageUpdated,
)
from rtp.audio import PCMU_8K, AudioFormat, Encoding

log = logging.getLogger("parlora.providers.openai_live")

DEFAULT_URL = "wss://api.openai.com/v1/live/sessions"
DEFAULT_PATH = "/v1/live/sessions"
RAW_LOG_LIMIT = 2000  # characters of an offending frame kept for the log


@dataclass(frozen=True, slots=True)
class LiveConfig:
    """What `session.start` says. Model, instructions, voice and format are immutable after start."""

    model: str = "gpt-live-1"
    instructions: str | None = None
    voice: str = "marin"
    audio_format: AudioFormat = PCMU_8K


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
    if config.instructions:
        session["instructions"] = config.instructions
    return {"type": "session.start", "session": session}


class LiveClientProtocol:
    """The client side of one GPT-Live connection, without I/O. `token` tags every event it produces."""

    def __init__(self, config: LiveConfig, token: int = 1) -> None:
        self.config = config
        self.token = token
        self.started = False
        self.closed = False
        self.bytes_received = 0

    def start(self) -> str:
        return json.dumps(session_start_frame(self.config))

    def append_audio(self, audio: bytes) -> str:
        """An `session.input_audio.append` frame for audio already in the session's format."""
        return json.dumps(
            {"type": "session.input_audio.append", "audio": base64.b64encode(audio).decode("ascii")}
        )

    def close(self) -> str:
        return json.dumps({"type": "session.close"})

    def receive_text(self, text: str | bytes) -> list[ProviderEvent]:
        """Events for one server frame. Never raises."""
        try:
            event = json.loads(text)
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ValueError("not a JSON object with a string 'type'")
            return self._dispatch(event)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return [self._protocol_error("invalid_event", f"unparseable server event: {exc}", text, fatal=False)]

    def _dispatch(self, event: dict[str, Any]) -> list[ProviderEvent]:
        kind = event["type"]
        if kind == "session.output_audio.delta":
            return [self._audio(event)]
        if kind == "session.input_transcript.delta":
            return [InputTranscript(self.token, str(event["delta"]), event.get("start_ms"), event.get("end_ms"))]
        if kind == "session.output_transcript.delta":
            return [OutputTranscript(self.token, str(event["delta"]), event.get("start_ms"), event.get("end_ms"))]
        if kind == "session.usage.updated":
            return [UsageUpdated(self.token, float(event["usage"]["seconds"]))]
        if kind == "session.started":
            self.started = True
            session = event.get("session") or {}
            return [SessionStarted(self.token, str(session.get("id", "")), session.get("expires_at"))]
        if kind == "session.closed":
            self.closed = True
            usage = event.get("usage") or {}
            seconds = usage.get("seconds")
            return [
                SessionClosed(self.token, str(event.get("reason", "unknown")), True, None if seconds is None else float(seconds))
            ]
        if kind == "error":
            error = event.get("error") or {}
            code = str(error.get("code") or error.get("type") or "error")
            # GPT-Live errors answer a client command; the session stays open.
            return [ProviderError(self.token, code, str(error.get("message", "")), fatal=False, raw=_clip(event))]
        return []  # events this bridge does not use (info, delegation before issue 7, ...)

    def _audio(self, event: dict[str, Any]) -> ProviderEvent:
        delta = event["delta"]
        try:
            audio = base64.b64decode(delta, validate=True)
        except (binascii.Error, ValueError, TypeError):
            return self._protocol_error("invalid_audio", "output audio is not valid base64", event, fatal=True)
        fmt = self.config.audio_format
        if fmt.encoding is Encoding.PCM16 and len(audio) % 2:
            return self._protocol_error(
                "invalid_audio", f"PCM16 output audio has an odd length ({len(audio)} bytes)", event, fatal=True
            )
        self.bytes_received += len(audio)
        return AudioReceived(self.token, audio, fmt)

    def _protocol_error(self, code: str, message: str, raw: object, *, fatal: bool) -> ProviderError:
        return ProviderError(self.token, code, message, fatal=fatal, raw=_clip(raw))


def _clip(raw: object) -> str:
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace") if isinstance(raw, bytes) else json.dumps(raw)
    return text if len(text) <= RAW_LOG_LIMIT else text[:RAW_LOG_LIMIT] + "..."


def resolve_url(url: str | None) -> str:
    """The session endpoint: the default, or `url` with the default path when it names only a host."""
    if not url:
        return DEFAULT_URL
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path=DEFAULT_PATH)
    return urlunsplit(parts)


class OpenAILiveAdapter:
    """The asyncio shell: one WebSocket, a writer task for caller audio, events out as an async iterator."""

    def __init__(
        self,
        api_key: str,
        config: LiveConfig,
        *,
        url: str | None = None,
        token: int = 1,
        connect_timeout: float = 10.0,
        max_pending_frames: int = 250,
    ) -> None:
        self._api_key = api_key
        self.url = resolve_url(url)
        self.core = LiveClientProtocol(config, token)
        self._connect_timeout = connect_timeout
        self._ws: ClientConnection | None = None
        self._outbox: asyncio.Queue[str] = asyncio.Queue(max_pending_frames)
        self._writer: asyncio.Task[None] | None = None
        self._early: list[ProviderEvent] = []
        self._close_requested = False
        self.frames_sent = 0
        self.frames_dropped = 0  # caller audio dropped because the socket could not keep up

    @property
    def audio_format(self) -> AudioFormat:
        return self.core.config.audio_format

    async def connect(self) -> SessionStarted:
        """Open the socket and start the session; raises ProviderUnavailable with the reason."""
        try:
            async with asyncio.timeout(self._connect_timeout):
                self._ws = await connect(
                    self.url,
                    additional_headers={"Authorization": f"Bearer {self._api_key}"},
                    max_size=2**24,
                    ping_interval=20,
                    ping_timeout=20,
                )
                await self._ws.send(self.core.start())
                while True:
                    for event in self.core.receive_text(await self._ws.recv()):
                        if isinstance(event, SessionStarted):
                            self._writer = asyncio.create_task(self._write_loop(), name="openai-live-writer")
                            return event
                        if isinstance(event, ProviderError):
                            raise ProviderUnavailable(f"session.start refused: {event.code}: {event.message}")
                        self._early.append(event)
        except TimeoutError:
            await self._abort()
            raise ProviderUnavailable(f"no session.started from {self.url} within {self._connect_timeout:.0f} s") from None
        except (OSError, InvalidHandshake, InvalidURI) as exc:
            await self._abort()
            raise ProviderUnavailable(f"cannot connect to {self.url}: {exc}") from None
        except ConnectionClosed as exc:
            await self._abort()
            raise ProviderUnavailable(f"{self.url} closed the connection during start: {exc}") from None
        except ProviderUnavailable:
            await self._abort()
            raise

    def send_audio(self, audio: bytes) -> None:
        """Queue caller audio (in the session's format). Never blocks the media path: when the socket cannot
        keep up, the oldest waiting frame is dropped and counted, so the provider hears the present."""
        frame = self.core.append_audio(audio)
        if self._outbox.full():
            self._outbox.get_nowait()
            self.frames_dropped += 1
        self._outbox.put_nowait(frame)

    def request_close(self) -> None:
        """Queue `session.close` behind the caller audio already queued; `session.closed` answers it."""
        if not self._close_requested:
            self._close_requested = True
            if self._outbox.full():
                self._outbox.get_nowait()
                self.frames_dropped += 1
            self._outbox.put_nowait(self.core.close())

    async def events(self) -> AsyncIterator[ProviderEvent]:
        """Provider events until the session closes; a lost socket ends with an unfinalised SessionClosed."""
        assert self._ws is not None, "connect() first"
        for event in self._early:
            yield event
        self._early.clear()
        token = self.core.token
        try:
            async for message in self._ws:
                for event in self.core.receive_text(message):
                    if isinstance(event, ProviderError) and event.raw is not None:
                        log.warning("provider %s: %s; frame: %s", event.code, event.message, event.raw)
                    yield event
                    if isinstance(event, SessionClosed):
                        return
        except ConnectionClosed:
            pass
        code = self._ws.close_code
        yield SessionClosed(token, f"connection closed (code {code}, {self._ws.close_reason or 'no reason'})", False)

    async def close(self, timeout: float = 2.0) -> None:
        """Ask the provider to close the session, then close the socket; bounded by `timeout`."""
        ws = self._ws
        if ws is None:
            return
        try:
            async with asyncio.timeout(timeout):
                if not self.core.closed and not self._close_requested:
                    await ws.send(self.core.close())
                await ws.close()
        except (TimeoutError, ConnectionClosed, OSError):
            pass
        await self._abort()

    async def _write_loop(self) -> None:
        assert self._ws is not None
        try:
            while True:
                frame = await self._outbox.get()
                await self._ws.send(frame)
                self.frames_sent += 1
        except ConnectionClosed:
            pass

    async def _abort(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        if self._ws is not None and self._ws.transport is not None:
            self._ws.transport.abort()
