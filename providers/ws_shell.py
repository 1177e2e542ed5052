"""The asyncio half of every WebSocket adapter: one socket, no tasks, at most one timer, events out.

Each adapter is a sans-I/O client core (its wire protocol) wrapped in this shell. The shell only moves
bytes: it connects, sends what the core has queued, feeds what arrives to the core, and yields the core's
events. It never decides anything about the session: no reconnects, no retries (the engine opens a new
adapter with a new token for that).

The WebSocket protocol itself is websockets' sans-I/O `ClientProtocol` (framing, masking, the opening and
closing handshakes, close codes), driven from this plain `asyncio.Protocol` (`loop.create_connection`, with
the TLS context for wss). It is given whole units only: the upgrade response alone, then whole frames; a final
text or binary frame of an open connection (the provider's audio, tens a second) is taken here instead
(`frame_extent`: a fifth of the protocol's parser), every other frame goes to the protocol, and from a frame
it would refuse on sight (masked, too long) on, everything does. That is the cheap way (measured: the
asyncio API cost 24-30 points of a core at 300 calls): no writer task and no keepalive task. A caller-audio frame with nothing
queued ahead of it is written to the transport in the call that sends it; control frames (and audio behind
them) queued during one loop iteration leave together at its end in one transport write; a received message
waits in a queue until `events()` takes it. Or, once the engine called `deliver_to(sink)`, each
message's events go to the sink in the socket's own callback, as it is parsed: no reader task, no queue, and
no loop iteration between the socket and the session. The end is the same `SessionClosed` either way.

A core provides:
- `token: int`;
- `receive_text(text) -> list[ProviderEvent]` (never raises on peer input);
- `frames_to_send() -> list[str]` (pulled; the shell calls it after every input and command);
- `close_frames() -> list[str]` (what ends the session politely; may be empty);
- `closed: bool` (the provider said the session is over).

Caller audio and control frames leave in one order (a commit must follow its audio). While the transport's
write buffer is over its high-water mark (`pause_writing`), frames wait in one FIFO; when the socket cannot
keep up, the oldest waiting audio frame is dropped and counted, so the provider hears the present; control
frames are never dropped. Received messages wait for `events()` in a bounded queue: above its high-water mark
the shell stops reading the socket (TCP back-pressure to the provider) until `events()` has caught up.

Benchmark instrumentation is injected, never imported (DESIGN §2: providers use only rtp's audio primitives):
the caller may pass a `WireTapFactory`, called once in the task that opens the connection; its `WireTap` sees
each caller-audio frame written and each assistant-audio chunk read. Without one nothing is measured and the
media path pays one `is None` test per frame.

The keepalive (a ping every 3 s, 3 s to answer, then 1 s for the close handshake) is what notices a
half-open connection — a peer whose network vanished without a FIN — so that recovery can replace it about
7 s after it went silent. (Gemini's pongs can take 8–30 s; its adapter asks for a longer timeout.) Its
deadlines live in `Keepalive`, a sans-I/O core on `now` (ns); the shell runs them on one re-armed loop timer
per connection, started once `connect()` has returned (the connect timeout is the only timer before that).

Differences from the websockets asyncio client this replaced (none of which the adapters or tests rely on):
no permessage-deflate offer unless `compression=True` (base64 audio deflates poorly and zlib per frame costs
CPU on the media path; the fakes never accepted it), and no HTTP/SOCKS proxy from the environment.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import ssl as ssl_module
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Protocol, cast

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
from websockets.frames import OP_BINARY, OP_CLOSE, OP_CONT, OP_PONG, OP_TEXT, CloseCode, Frame
from websockets.http11 import USER_AGENT
from websockets.protocol import CLOSED, CONNECTING, OPEN
from websockets.speedups import apply_mask
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from providers.base import ProviderUnavailable
from providers.events import AudioReceived, ProviderError, ProviderEvent, SessionClosed, SessionStarted
from rtp.audio import AudioFormat
from rtp.units import NS_PER_S


class ClientCore(Protocol):
    token: int
    closed: bool

    def receive_text(self, text: str | bytes) -> list[ProviderEvent]: ...

    def frames_to_send(self) -> list[str]: ...

    def close_frames(self) -> list[str]: ...


MAX_PENDING_AUDIO = 250  # caller-audio frames queued (5 s) before the oldest is dropped
CLOSE_TIMEOUT_S = 1.0  # for the close handshake
MAX_MESSAGE_BYTES = 2**24
WRITE_HIGH_WATER = 2**15  # transport write buffer (bytes) above which frames wait in the FIFO
READ_HIGH_WATER = 16  # received messages waiting for events() above which the socket is not read
READ_LOW_WATER = 4  # ... and at or below which it is read again
MAX_RESPONSE_BYTES = 2**16  # the upgrade response's head; longer, the protocol judges it


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


class _MaskKeys:
    """Masking keys for client frames (RFC 6455 §5.3: from a strong source of entropy), drawn from os.urandom
    1,024 keys at a time: websockets asks for each frame's key with its own getrandom() system call."""

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def take(self) -> bytes:
        if self._at >= len(self._pool):
            self._pool, self._at = os.urandom(4096), 0
        self._at += 4
        return self._pool[self._at - 4 : self._at]


_MASK_KEYS = _MaskKeys()
_HEAD_7 = struct.Struct("!BB")
_HEAD_16 = struct.Struct("!BBH")
_HEAD_64 = struct.Struct("!BBQ")


def text_frame(payload: bytes, mask: bytes) -> bytes:
    """One final, masked text frame (RFC 6455 §5.2), byte for byte as websockets' `Frame.serialize` gives."""
    n = len(payload)
    if n < 126:
        head = _HEAD_7.pack(0x81, 0x80 | n)
    elif n < 65536:
        head = _HEAD_16.pack(0x81, 0x80 | 126, n)
    else:
        head = _HEAD_64.pack(0x81, 0x80 | 127, n)
    return head + mask + apply_mask(payload, mask)


def frame_extent(buffer: bytes, at: int) -> tuple[int, int] | None:
    """Where the frame at `at` of `buffer` ends (RFC 6455 §5.2): (header length, with the masking key when the
    frame has one; payload length), or None while the header is not all in."""
    size = len(buffer)
    if size - at < 2:
        return None
    second = buffer[at + 1]
    length, head = second & 0x7F, 2
    if length == 126:
        if size - at < 4:
            return None
        length, head = (buffer[at + 2] << 8) | buffer[at + 3], 4
    elif length == 127:
        if size - at < 10:
            return None
        length, head = int.from_bytes(buffer[at + 2 : at + 10], "big"), 10
    return (head + 4 if second & 0x80 else head), length


class KeepaliveAction(enum.Enum):
    PING = "ping"  # send a ping with `Keepalive.payload`
    FAIL = "fail"  # the pong is late: fail the connection (close 1011 "keepalive ping timeout")
    ABORT = "abort"  # the close handshake is late: drop the TCP connection


class Keepalive:
    """The timers of one connection, without I/O: the next ping, the pong it waits for, the close handshake.

    Same rules as websockets' asyncio keepalive: a ping `interval` after the last one was sent (or at once
    when its pong came later than that), `timeout` for its pong (None: never waits, pings every `interval`);
    once the connection is closing (a close frame sent or received, or a failed pong) no more pings, and the
    TCP connection must end within `close_timeout` of that or it is aborted.
    """

    def __init__(self, interval_s: float | None, timeout_s: float | None, close_timeout_s: float) -> None:
        self._interval = None if interval_s is None else int(interval_s * NS_PER_S)
        self._timeout = None if timeout_s is None else int(timeout_s * NS_PER_S)
        self._close_timeout = int(close_timeout_s * NS_PER_S)
        self.ping_due: int | None = None
        self.pong_due: int | None = None
        self.close_due: int | None = None
        self._sent_at = 0
        self._count = 0
        self.payload = b""  # of the ping awaiting its pong

    def start(self, now: int) -> None:
        """The connection is open: the first ping is due an interval from now."""
        if self._interval is not None and self.close_due is None:
            self.ping_due = now + self._interval

    def pong(self, payload: bytes, now: int) -> None:
        """A pong arrived; it answers our ping only when it carries the ping's payload."""
        if self.pong_due is None or payload != self.payload or self._interval is None:
            return
        self.pong_due = None
        self.ping_due = max(self._sent_at + self._interval, now)

    def closing(self, now: int) -> None:
        """A close frame went out or came in: the TCP connection must end within the close timeout."""
        self.ping_due = self.pong_due = None
        if self.close_due is None:
            self.close_due = now + self._close_timeout

    def next_deadline(self) -> int | None:
        due = [d for d in (self.ping_due, self.pong_due, self.close_due) if d is not None]
        return min(due) if due else None

    def handle_timer(self, now: int) -> KeepaliveAction | None:
        if self.close_due is not None:
            return KeepaliveAction.ABORT if now >= self.close_due else None
        if self.pong_due is not None and now >= self.pong_due:
            self.closing(now)
            return KeepaliveAction.FAIL
        if self.ping_due is not None and now >= self.ping_due and self._interval is not None:
            self._count += 1
            self.payload = self._count.to_bytes(4, "big")
            self._sent_at = now
            if self._timeout is None:
                self.ping_due = now + self._interval
            else:
                self.ping_due, self.pong_due = None, now + self._timeout
            return KeepaliveAction.PING
        return None


class WebSocketShell(asyncio.Protocol):
    """Runs one client core over one WebSocket (this object is the connection's `asyncio.Protocol`)."""

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
        subprotocols: Sequence[str] | None = None,
        compression: bool = False,
    ) -> None:
        self.core = core
        self.url = url
        self._headers = dict(headers)
        self._log = log
        self._ssl = ssl
        self._connect_timeout = connect_timeout
        self._subprotocols = None if subprotocols is None else [Subprotocol(s) for s in subprotocols]
        self._compression = compression
        self._keepalive = Keepalive(ping_interval, ping_timeout, CLOSE_TIMEOUT_S)
        self._proto: ClientProtocol | None = None
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lost: asyncio.Future[None] | None = None  # done when the TCP connection has ended
        self._waiter: asyncio.Future[None] | None = None  # a reader waiting for a message or the end
        self._messages: deque[str | bytes] = deque()  # received, not yet taken by connect()/events()
        self._fragments: list[bytes] = []
        self._fragment_text = False
        self._buffer = b""  # received bytes not yet a whole unit (the upgrade response, a frame)
        self._split = True  # whole units to the protocol, data frames taken here (the module's docstring)
        self._reading_paused = False
        self._writing_paused = False
        self._running = False  # connect() returned: queued frames go to the socket
        self._drain_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._outbox: deque[tuple[bool, str | bytes]] = deque()  # bytes: a frame already UTF-8
        self._pending_audio = 0
        self._early: list[ProviderEvent] = []
        self._sink: Callable[[ProviderEvent], None] | None = None  # `deliver_to`'s, in place of events()
        self._delivered_end = False  # the sink had the last event (a SessionClosed)
        self._close_requested = False
        self.frames_sent = 0
        self.audio_dropped = 0  # caller audio frames dropped because the socket could not keep up
        self._tap_factory = wire_tap
        self._tap: WireTap | None = None  # benchmark instrumentation, when injected
        self.handshake_close_code: int | None = (
            None  # the peer's close code, when it closed during the handshake
        )

    # -- the adapter's side -------------------------------------------------------------------------------

    async def connect(self) -> SessionStarted:
        """Open the socket and run the handshake; raises ProviderUnavailable with a reason (never the key)."""
        if self._tap_factory is not None:
            self._tap = self._tap_factory()
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._open()
                self._write_text_all(self.core.frames_to_send())
                while True:
                    message = await self._next_message()
                    if message is None:
                        raise _ClosedDuringHandshake()
                    events = self.core.receive_text(message)
                    self._write_text_all(self.core.frames_to_send())
                    for event in events:
                        if isinstance(event, SessionStarted):
                            self._start()
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
        except _ClosedDuringHandshake:
            proto = self._proto
            assert proto is not None and proto.state is CLOSED
            self.handshake_close_code = proto.close_rcvd.code if proto.close_rcvd is not None else None
            await self.abort()
            raise ProviderUnavailable(
                f"{self.url} closed the connection during the handshake: {proto.close_exc}"
            ) from None
        except ProviderUnavailable:
            await self.abort()
            raise

    def flush(self) -> None:
        """Send whatever the core wants to send (after a command)."""
        for frame in self.core.frames_to_send():
            self._send(False, frame)

    def send_audio_frame(self, frame: str | bytes) -> None:
        """Send one caller-audio frame; never blocks. With nothing queued ahead of it the frame is written to
        the transport at once, in this call (a frame waits for no loop iteration, so inbound latency
        is the path's own work); otherwise it queues behind what waits (order kept) and leaves with it."""
        if not self._outbox and self._running and not self._writing_paused:
            self._write_audio_now(frame)
            return
        if self._pending_audio >= MAX_PENDING_AUDIO:
            for i, (is_audio, _) in enumerate(self._outbox):
                if is_audio:
                    del self._outbox[i]
                    self._pending_audio -= 1
                    self.audio_dropped += 1
                    if self.audio_dropped == 1:  # once, as it starts: the total follows when the socket ends
                        self._log.warning("caller audio frames dropped: the socket cannot keep up (counted)")
                    break
        self._outbox.append((True, frame))
        self._pending_audio += 1
        self._schedule_drain()

    async def events(self) -> AsyncIterator[ProviderEvent]:
        """Events until the session closes; a lost socket ends with an unfinalised SessionClosed."""
        assert self._proto is not None, "connect() first"
        early, self._early = self._early, []
        for event in early:
            yield event
        while True:
            message = await self._next_message()
            if message is None:
                break
            for event in self._parse(message):
                yield event
                if isinstance(event, SessionClosed):
                    return
        yield self._ended()

    def deliver_to(self, sink: Callable[[ProviderEvent], None]) -> None:
        """From now on each event goes to `sink` as its message is parsed, in the socket's callback
        (`events()` must not be read then). What came before is delivered first, in order; the last event is
        a `SessionClosed`, as `events()` ends with. The sink must not raise."""
        assert self._proto is not None, "connect() first"
        self._sink = sink
        early, self._early = self._early, []
        for event in early:
            sink(event)
            if isinstance(event, SessionClosed):
                self._delivered_end, self._sink = True, None
                return
        self._deliver()

    def _deliver(self) -> None:
        """Every message received so far to the sink, then the end once the connection has ended."""
        sink, messages = self._sink, self._messages
        assert sink is not None
        while messages and not self._delivered_end:
            for event in self._parse(messages.popleft()):
                sink(event)
                if isinstance(event, SessionClosed):
                    self._delivered_end = True
                    break
        if not self._delivered_end and self._lost is not None and self._lost.done():
            self._delivered_end = True
            sink(self._ended())
        if self._delivered_end:
            # Nothing follows the end. A sink that holds its adapter (Gemini's labels the end) made
            # the shell a cycle, so a closed connection, its TLS objects and resampler waited for a full
            # collection: ~60 of them every 2.5 minutes at 100 calls, tens of MB of C heap.
            self._sink = None

    def _parse(self, message: str | bytes) -> list[ProviderEvent]:
        """One received message's events (the core's answers sent at once)."""
        tap = self._tap
        received_ns = time.monotonic_ns() if tap is not None else 0
        events = self.core.receive_text(message)
        self.flush()
        for event in events:
            if tap is not None and isinstance(event, AudioReceived):  # benchmark instrumentation
                tap.audio_received(received_ns, event.audio, event.format)
            if isinstance(event, ProviderError) and event.raw is not None:
                self._log.warning("provider %s: %s; frame: %s", event.code, event.message, event.raw)
        return events

    def _ended(self) -> SessionClosed:
        """The last event when the socket ended without the core saying the session was over."""
        if self.audio_dropped:
            self._log.warning(
                "%d caller audio frames were dropped: the socket could not keep up", self.audio_dropped
            )
        assert self._proto is not None
        code, reason = self._proto.close_code, self._proto.close_reason
        return SessionClosed(
            self.core.token,
            f"connection closed (code {code}, {reason or 'no reason'})",
            False,
            close_code=code,
        )

    def request_close(self) -> None:
        """Send the core's close frames behind what is already queued."""
        if not self._close_requested:
            self._close_requested = True
            for frame in self.core.close_frames():
                self._send(False, frame)

    async def close(self, timeout: float = 2.0) -> None:
        """Close the socket within `timeout`: the core's goodbye, a close frame, the peer's TCP close."""
        proto, lost = self._proto, self._lost
        if proto is None or lost is None or self._transport is None:
            return
        try:
            async with asyncio.timeout(timeout):
                if not self.core.closed and not self._close_requested:
                    self._write_text_all(self.core.close_frames())
                if proto.state is OPEN:
                    proto.send_close(CloseCode.NORMAL_CLOSURE)
                    self._write_pending()
                    self._closing()
                await asyncio.shield(lost)
        except TimeoutError:
            pass
        await self.abort()

    async def abort(self) -> None:
        """Drop the connection at once (no close handshake)."""
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.abort()

    # -- opening -------------------------------------------------------------------------------------------

    async def _open(self) -> None:
        uri = parse_uri(self.url)
        loop = self._loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        extensions = [ClientPerMessageDeflateFactory()] if self._compression else None
        self._proto = ClientProtocol(
            uri,
            extensions=extensions,
            subprotocols=self._subprotocols,
            max_size=MAX_MESSAGE_BYTES,
            logger=logging.getLogger("websockets.client"),
        )
        tls: ssl_module.SSLContext | None = None
        if uri.secure:
            tls = self._ssl if self._ssl is not None else ssl_module.create_default_context()
        await loop.create_connection(
            lambda: self, uri.host, uri.port, ssl=tls, server_hostname=uri.host if tls is not None else None
        )
        proto = self._proto
        while proto.state is not OPEN:
            if proto.handshake_exc is not None:
                raise proto.handshake_exc
            if self._lost.done():
                raise ConnectionResetError("the connection closed during the HTTP upgrade")
            await self._wait()

    def _start(self) -> None:
        """connect() succeeded: the keepalive starts and what was queued meanwhile goes out."""
        self._running = True
        self._keepalive.start(self._now())
        self._arm()
        self._schedule_drain()

    # -- asyncio.Protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(WRITE_HIGH_WATER)
        proto = self._proto
        assert proto is not None
        request = proto.connect()
        for name, value in self._headers.items():
            request.headers[name] = value
        request.headers.setdefault("User-Agent", USER_AGENT)
        proto.send_request(request)
        self._write_pending()

    def data_received(self, data: bytes) -> None:
        proto = self._proto
        assert proto is not None
        if not self._split:
            proto.receive_data(data)
            self._events()
        else:
            self._buffer = self._buffer + data if self._buffer else data
            if proto.state is CONNECTING:
                self._response()
            if self._split:
                if proto.state is OPEN:
                    self._frames()
                elif proto.state is not CONNECTING:  # closing: the protocol takes what follows
                    self._to_protocol()
        self._write_pending()
        if proto.close_expected():
            self._closing()
        if self._sink is not None:
            self._deliver()
        elif (
            len(self._messages) > READ_HIGH_WATER and not self._reading_paused and self._transport is not None
        ):
            self._reading_paused = True
            self._transport.pause_reading()
        self._wake()

    def _response(self) -> None:
        """The upgrade response, once its blank line is in: to the protocol alone, the bytes behind it kept (a
        refusal's body, and anything after a refusal, goes to the protocol)."""
        proto, buffer = self._proto, self._buffer
        assert proto is not None
        end = buffer.find(b"\r\n\r\n")
        if end < 0 and len(buffer) <= MAX_RESPONSE_BYTES:
            return
        head, self._buffer = (buffer, b"") if end < 0 else (buffer[: end + 4], buffer[end + 4 :])
        proto.receive_data(head)
        self._events()
        if proto.state is not OPEN:
            self._to_protocol()

    def _to_protocol(self) -> None:
        """From now on every byte goes to the protocol (it judges what this shell would not take)."""
        proto, rest = self._proto, self._buffer
        assert proto is not None
        self._split, self._buffer = False, b""
        if rest:
            proto.receive_data(rest)
            self._events()

    def _frames(self) -> None:
        """Every whole frame in the buffer, in order; a partial one waits for the rest."""
        buffer, proto = self._buffer, self._proto
        assert proto is not None
        at = 0
        while (extent := frame_extent(buffer, at)) is not None:
            head, length = extent
            if (
                length > MAX_MESSAGE_BYTES or buffer[at + 1] & 0x80
            ):  # too long, or masked: the protocol fails it
                self._buffer = buffer[at:]
                self._to_protocol()
                return
            end = at + head + length
            if end > len(buffer):
                break
            first = buffer[at]
            if first == 0x81 and proto.state is OPEN and proto.cur_size is None:  # final text, no RSV bits
                if not self._text(buffer[at + head : end]):  # the protocol failed the connection (1007)
                    self._buffer = buffer[end:]
                    self._to_protocol()
                    return
            elif first == 0x82 and proto.state is OPEN and proto.cur_size is None:  # final binary
                self._messages.append(buffer[at + head : end])
            else:
                proto.receive_data(buffer[at:end])
                self._events()
                if not self._split:
                    return
            at = end
        self._buffer = buffer[at:] if at else buffer

    def _events(self) -> None:
        """What the protocol made of the bytes it was given: the response, whole messages, pongs, a close."""
        proto = self._proto
        assert proto is not None
        messages = self._messages
        for event in proto.events_received():
            if not isinstance(event, Frame):
                continue  # the handshake Response: _open() looks at the protocol's state
            opcode = event.opcode
            if opcode is OP_TEXT or opcode is OP_BINARY:
                if event.fin:
                    if opcode is OP_BINARY:
                        messages.append(bytes(event.data))
                    elif not self._text(event.data):
                        break
                else:
                    self._fragment_text = opcode is OP_TEXT
                    self._fragments = [bytes(event.data)]
            elif opcode is OP_CONT:
                self._fragments.append(bytes(event.data))
                if event.fin:
                    whole, self._fragments = b"".join(self._fragments), []
                    if not self._fragment_text:
                        messages.append(whole)
                    elif not self._text(whole):
                        break
            elif opcode is OP_PONG:
                self._keepalive.pong(bytes(event.data), self._now())
            elif opcode is OP_CLOSE:
                self._closing()

    def eof_received(self) -> bool | None:
        proto = self._proto
        assert proto is not None
        proto.receive_eof()
        self._write_pending()
        self._wake()
        return None  # the transport closes itself (a WebSocket never writes after the peer's EOF)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._proto is not None:
            self._proto.receive_eof()  # idempotent; the state becomes CLOSED
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        self._transport = None  # gone; the transport and this protocol no longer hold each other
        if self._sink is not None:
            self._deliver()
        self._wake()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._schedule_drain()

    # -- reading ---------------------------------------------------------------------------------------------

    def _text(self, data: bytes | bytearray | memoryview) -> bool:
        """Queue a text message; invalid UTF-8 fails the connection (close 1007), as RFC 6455 requires."""
        try:
            self._messages.append(str(data, "utf-8"))
            return True
        except UnicodeDecodeError as exc:
            assert self._proto is not None
            self._proto.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
            return False

    async def _next_message(self) -> str | bytes | None:
        """The next received message, or None once the connection has ended and every message was taken."""
        messages = self._messages
        while not messages:
            if self._lost is None or self._lost.done():
                return None
            await self._wait()
        message = messages.popleft()
        if self._reading_paused and len(messages) <= READ_LOW_WATER and self._transport is not None:
            self._reading_paused = False
            self._transport.resume_reading()
        return message

    async def _wait(self) -> None:
        assert self._loop is not None
        self._waiter = waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- writing ---------------------------------------------------------------------------------------------

    def _send(self, is_audio: bool, frame: str | bytes) -> None:
        """A control frame, in order behind what is queued."""
        self._outbox.append((is_audio, frame))
        if is_audio:
            self._pending_audio += 1
        self._schedule_drain()

    def _schedule_drain(self) -> None:
        """Whatever is queued in this loop iteration leaves together at its end, in one transport write."""
        if (
            not self._drain_scheduled
            and self._running
            and not self._writing_paused
            and self._loop is not None
        ):
            self._drain_scheduled = True
            self._loop.call_soon(self._drain_outbox)

    def _drain_outbox(self) -> None:
        self._drain_scheduled = False
        proto, tap, outbox = self._proto, self._tap, self._outbox
        if proto is None or not self._running or self._writing_paused:
            return
        if proto.state is not OPEN:  # closing or closed: nothing more goes out
            outbox.clear()
            self._pending_audio = 0
            return
        tapped: list[str | bytes] | None = [] if tap is not None else None
        direct = not proto.extensions  # no extension transforms frames: frame them here, one write for all
        frames: list[bytes] = []
        while outbox:
            is_audio, frame = outbox.popleft()
            data = frame.encode() if isinstance(frame, str) else frame
            if direct:
                frames.append(text_frame(data, _MASK_KEYS.take()))
            else:
                proto.send_text(data)
            self.frames_sent += 1
            if is_audio:
                self._pending_audio -= 1
                if tapped is not None:
                    tapped.append(frame)
        self._write_pending()  # what the protocol itself queued goes first (none: it is written at once)
        if frames and self._transport is not None and not self._transport.is_closing():
            self._transport.write(frames[0] if len(frames) == 1 else b"".join(frames))
        if tap is not None and tapped:  # benchmark instrumentation: once the write has returned
            sent_ns = time.monotonic_ns()
            for frame in tapped:
                tap.audio_sent(sent_ns, frame if isinstance(frame, str) else frame.decode())

    def _write_audio_now(self, frame: str | bytes) -> None:
        proto, transport = self._proto, self._transport
        if proto is None or proto.state is not OPEN or transport is None or transport.is_closing():
            return  # closing or closed: nothing more goes out (as `_drain_outbox` does)
        data = frame.encode() if isinstance(frame, str) else frame
        if proto.extensions:  # an extension transforms frames: the protocol frames it
            proto.send_text(data)
            self._write_pending()
        else:
            transport.write(text_frame(data, _MASK_KEYS.take()))
        self.frames_sent += 1
        tap = self._tap
        if tap is not None:  # benchmark instrumentation: once the write has returned
            tap.audio_sent(time.monotonic_ns(), frame if isinstance(frame, str) else frame.decode())

    def _write_text_all(self, frames: list[str]) -> None:
        for frame in frames:
            self._write_text(frame)

    def _write_text(self, frame: str) -> bool:
        """One text frame to the socket; False when the connection no longer takes data frames."""
        proto = self._proto
        if proto is None or proto.state is not OPEN:
            return False
        proto.send_text(frame.encode())
        self._write_pending()
        return True

    def _write_pending(self) -> None:
        proto, transport = self._proto, self._transport
        if proto is None:
            return
        writes = proto.data_to_send()
        if len(writes) > 1 and writes[-1]:
            writes = [b"".join(writes)]  # many frames, one write
        for data in writes:
            if transport is None or transport.is_closing():
                continue
            if data:
                transport.write(data)
            elif transport.can_write_eof():  # the protocol's end of stream: half-close where possible
                try:
                    transport.write_eof()
                except (OSError, RuntimeError):  # uvloop may raise RuntimeError
                    pass
            else:
                transport.close()

    # -- the one timer ---------------------------------------------------------------------------------------

    def _now(self) -> int:
        assert self._loop is not None
        return int(self._loop.time() * NS_PER_S)

    def _closing(self) -> None:
        if self._loop is None:
            return
        self._keepalive.closing(self._now())
        self._arm()

    def _arm(self) -> None:
        """Keep one loop timer at or before the keepalive's next deadline (one that fires early re-arms)."""
        due = self._keepalive.next_deadline()
        if due is None or self._loop is None or (self._lost is not None and self._lost.done()):
            return
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.cancel()
        self._timer_at = due
        self._timer = self._loop.call_at(due / NS_PER_S, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        proto = self._proto
        action = self._keepalive.handle_timer(self._now())
        if proto is not None and action is KeepaliveAction.PING and proto.state is OPEN:
            proto.send_ping(self._keepalive.payload)
            self._write_pending()
        elif proto is not None and action is KeepaliveAction.FAIL:
            self._log.info("provider connection %s: keepalive ping timeout", self.core.token)
            proto.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
            self._write_pending()
        elif action is KeepaliveAction.ABORT:
            if self._transport is not None:
                self._transport.abort()
            return
        self._arm()


class _ClosedDuringHandshake(Exception):
    """The connection ended before the session started."""
