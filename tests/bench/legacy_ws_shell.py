"""The provider WebSocket shell as it was before the sans-I/O one (the websockets asyncio client API and a
writer task), kept verbatim only so that tests/bench/provider_micro.py can measure old against new. The bridge
never uses it."""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from providers.base import ProviderUnavailable
from providers.events import AudioReceived, ProviderError, ProviderEvent, SessionClosed, SessionStarted
from rtp.audio import AudioFormat


class ClientCore(Protocol):
    token: int
    closed: bool

    def receive_text(self, text: str | bytes) -> list[ProviderEvent]: ...

    def frames_to_send(self) -> list[str]: ...

    def close_frames(self) -> list[str]: ...


MAX_PENDING_AUDIO = 250  # caller-audio frames queued (5 s) before the oldest is dropped
CLOSE_TIMEOUT_S = 1.0  # for the close handshake


class WireTap(Protocol):
    """Sees one connection's audio as it crosses the socket (monotonic ns), for the latency benchmark."""

    def audio_sent(self, t_ns: int, frame: str) -> None:
        """A caller-audio frame (the protocol's JSON text) was written to the socket."""
        ...

    def audio_received(self, t_ns: int, audio: bytes, fmt: AudioFormat) -> None:
        """An assistant-audio chunk (`fmt`, as received) was read from the socket."""
        ...


WireTapFactory = Callable[[], WireTap]
"""Called once as the connection opens, in the task that opens it (so it may learn its call from the task)."""


class WebSocketShell:
    """Runs one client core over one WebSocket."""

    def __init__(
        self,
        core: ClientCore,
        url: str,
        headers: Mapping[str, str],
        *,
        log: logging.Logger,
        ssl: ssl_module.SSLContext | None = None,
        connect_timeout: float = 10.0,
        ping_interval: float | None = 3.0,
        ping_timeout: float | None = 3.0,
        wire_tap: WireTapFactory | None = None,
    ) -> None:
        self.core = core
        self.url = url
        self._headers = dict(headers)
        self._log = log
        self._ssl = ssl
        self._connect_timeout = connect_timeout
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._ws: ClientConnection | None = None
        self._outbox: deque[tuple[bool, str]] = deque()
        self._pending_audio = 0
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._early: list[ProviderEvent] = []
        self._close_requested = False
        self.frames_sent = 0
        self.audio_dropped = 0  # caller audio frames dropped because the socket could not keep up
        self._tap_factory = wire_tap
        self._tap: WireTap | None = None  # benchmark instrumentation, when injected
        self.handshake_close_code: int | None = (
            None  # the peer's close code, when it closed during the handshake
        )

    async def connect(self) -> SessionStarted:
        """Open the socket and run the handshake; raises ProviderUnavailable with the reason (never the key)."""
        if self._tap_factory is not None:
            self._tap = self._tap_factory()
        try:
            async with asyncio.timeout(self._connect_timeout):
                # websockets refuses ssl=None for wss
                tls: dict[str, Any] = {"ssl": self._ssl} if self._ssl is not None else {}
                self._ws = await connect(
                    self.url,
                    additional_headers=self._headers,
                    max_size=2**24,
                    ping_interval=self._ping_interval,
                    ping_timeout=self._ping_timeout,
                    close_timeout=CLOSE_TIMEOUT_S,
                    open_timeout=None,
                    **tls,
                )
                for frame in self.core.frames_to_send():
                    await self._ws.send(frame)
                while True:
                    message = await self._ws.recv()
                    events = self.core.receive_text(message)
                    for frame in self.core.frames_to_send():
                        await self._ws.send(frame)
                    for event in events:
                        if isinstance(event, SessionStarted):
                            self._writer = asyncio.create_task(
                                self._write_loop(), name=f"ws-writer-{self.core.token}"
                            )
                            return event
                        if isinstance(event, ProviderError) and event.fatal:
                            raise ProviderUnavailable(f"session refused: {event.code}: {event.message}")
                        if isinstance(event, ProviderError):
                            self._log.warning(
                                "provider error during handshake %s: %s", event.code, event.message
                            )
                        self._early.append(event)
        except TimeoutError:
            await self.abort()
            raise ProviderUnavailable(
                f"no session from {self.url} within {self._connect_timeout:g} s"
            ) from None
        except InvalidStatus as exc:
            await self.abort()
            raise ProviderUnavailable(
                f"{self.url} refused the connection: HTTP {exc.response.status_code}"
            ) from None
        except (OSError, InvalidHandshake, InvalidURI) as exc:
            await self.abort()
            raise ProviderUnavailable(f"cannot connect to {self.url}: {exc}") from None
        except ConnectionClosed as exc:
            self.handshake_close_code = exc.rcvd.code if exc.rcvd is not None else None
            await self.abort()
            raise ProviderUnavailable(
                f"{self.url} closed the connection during the handshake: {exc}"
            ) from None
        except ProviderUnavailable:
            await self.abort()
            raise

    def flush(self) -> None:
        """Queue whatever the core wants to send (after a command)."""
        for frame in self.core.frames_to_send():
            self._outbox.append((False, frame))
        self._wakeup.set()

    def send_audio_frame(self, frame: str) -> None:
        """Queue one caller-audio frame; never blocks."""
        if self._pending_audio >= MAX_PENDING_AUDIO:
            for i, (is_audio, _) in enumerate(self._outbox):
                if is_audio:
                    del self._outbox[i]
                    self._pending_audio -= 1
                    self.audio_dropped += 1
                    break
        self._outbox.append((True, frame))
        self._pending_audio += 1
        self._wakeup.set()

    async def events(self) -> AsyncIterator[ProviderEvent]:
        """Events until the session closes; a lost socket ends with an unfinalised SessionClosed."""
        assert self._ws is not None, "connect() first"
        early, self._early = self._early, []
        for event in early:
            yield event
        try:
            tap = self._tap
            async for message in self._ws:
                received_ns = time.monotonic_ns() if tap is not None else 0
                events = self.core.receive_text(message)
                self.flush()
                for event in events:
                    if tap is not None and isinstance(event, AudioReceived):  # benchmark instrumentation
                        tap.audio_received(received_ns, event.audio, event.format)
                    if isinstance(event, ProviderError) and event.raw is not None:
                        self._log.warning("provider %s: %s; frame: %s", event.code, event.message, event.raw)
                    yield event
                    if isinstance(event, SessionClosed):
                        return
        except ConnectionClosed:
            pass
        if self.audio_dropped:
            self._log.warning(
                "%d caller audio frames were dropped: the socket could not keep up", self.audio_dropped
            )
        code, reason = self._ws.close_code, self._ws.close_reason
        yield SessionClosed(
            self.core.token,
            f"connection closed (code {code}, {reason or 'no reason'})",
            False,
            close_code=code,
        )

    def request_close(self) -> None:
        """Queue the core's close frames behind what is already queued."""
        if not self._close_requested:
            self._close_requested = True
            for frame in self.core.close_frames():
                self._outbox.append((False, frame))
            self._wakeup.set()

    async def close(self, timeout: float = 2.0) -> None:
        """Close the socket within `timeout`."""
        ws = self._ws
        if ws is None:
            return
        try:
            async with asyncio.timeout(timeout):
                if not self.core.closed and not self._close_requested:
                    for frame in self.core.close_frames():
                        await ws.send(frame)
                await ws.close()
        except (TimeoutError, ConnectionClosed, OSError):
            pass
        await self.abort()

    async def abort(self) -> None:
        """Drop the connection at once (no close handshake)."""
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        if self._ws is not None and self._ws.transport is not None:
            self._ws.transport.abort()

    async def _write_loop(self) -> None:
        assert self._ws is not None
        tap = self._tap
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._outbox:
                    is_audio, frame = self._outbox.popleft()
                    if is_audio:
                        self._pending_audio -= 1
                    await self._ws.send(frame)
                    self.frames_sent += 1
                    if is_audio and tap is not None:  # benchmark instrumentation
                        tap.audio_sent(time.monotonic_ns(), frame)
        except ConnectionClosed:
            pass
