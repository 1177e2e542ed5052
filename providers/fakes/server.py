"""The thin WebSocket shell every provider fake runs in, and the records all fakes keep.

Each fake is a sans-I/O connection core (its protocol and scripted model, on `now`) plus this shell: HTTP checks
on the upgrade, the client's messages fed to the core and its single deadline run on one re-armed loop timer,
what the core pulls written, the close the core asks for performed, and an optional JSON-lines record of every
client frame. Faults (providers/fakes/faults.py) reach connections from the options, at runtime through
`inject()`, or through `GET /_fault?spec=...` on the fake's own port (for a fake running as a separate process);
`GET /_connections` lists the connections open now (1-based, as a fault's `N/` counts them). With a record
file, each connection's lifetime is appended to `<record>.connections` when it ends (JSON lines: `conn`,
`opened_ns`, `closed_ns` on the monotonic clock, `close_code`, `session_id`, `handles`, `resumed_handle`), so
that a test in another process can tell whether two connections overlapped. With a notes file (`keep_notes`,
`fake-provider --notes`), each connection's facts go there as JSON lines as they happen: `open`, `session` (its
id, once the core named it), what the model `heard` (each caller utterance it transcribed) and answered
(`response`, `tool_call` by call id with the utterance it answers), each fault as it `fault`ed, and `closed`;
each line with `conn`, `session`, `t_ns` (monotonic) and `unix` (wall clock, s), so that a harness can join
them with what the bridge emitted (tests/bench/fault_campaign.py). No audio goes there.

The WebSocket protocol is websockets' sans-I/O `ServerProtocol` (the upgrade's checks and answer, framing,
pings and pongs, the closing handshake, close codes) driven from a plain `asyncio.Protocol` made by
`loop.create_server` (with the TLS context for wss), as providers/ws_shell.py drives the client side: no task
and no queue per connection, the core fed in the socket's callback, its frames written at the end of that
callback in one transport write, and one loop timer per connection at the earlier of the core's next deadline
and the keepalive's. The client's whole final text and binary frames (its audio) are unmasked and fed to the
core directly; the protocol sees the request and every other frame, whole. That costs a fraction of what
websockets' asyncio server did (a reader task, a loop task, a queue and a timeout per message). What the
asyncio server did and this shell keeps: the `Server` header, 16 MiB messages at most (1009 beyond), no
compression, invalid UTF-8 failing the connection (1007), a ping every 20 s with 20 s for its pong (then 1011
"keepalive ping timeout"), 10 s for the upgrade request and for the client's half of a close handshake (then
the TCP connection is dropped), 1001 to every open connection when the server stops, and 1011 when a core
raises. A client frame is never fed to a core that asked to close or once the close handshake has begun.
Unlike it, a slow reader gets no back-pressure: the fake writes on, as a paced provider does.

A connection core is a `FakeConnection`: a subclass of providers/fakes/connection.py `FakeCore`, or anything
alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import ssl as ssl_module
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import IO, Any, Protocol, Self, TypeVar, cast
from urllib.parse import parse_qs, urlsplit

from websockets.frames import OP_BINARY, OP_CONT, OP_PONG, OP_TEXT, CloseCode, Frame
from websockets.http11 import SERVER, Request, Response
from websockets.protocol import CLOSING, OPEN
from websockets.server import ServerProtocol
from websockets.speedups import apply_mask

from providers.fakes.faults import Fault, FaultKind, parse_fault
from providers.ws_shell import Keepalive, KeepaliveAction, frame_extent
from rtp.units import NS_PER_S


@dataclass(frozen=True, slots=True)
class ClientFrameRecord:
    """One client frame as received: `frame` when it parsed to a JSON object, else `raw` (the text)."""

    now: int
    frame: dict[str, Any] | None
    raw: str | None = None
    audio_bytes: int | None = None
    """Decoded length of an audio payload, when the frame carried one that decoded."""


@dataclass(slots=True)
class ConnectionRecord:
    """What one connection did; grows while the connection runs."""

    index: int
    client_frames: list[ClientFrameRecord] = field(default_factory=list)
    server_frames: int = 0
    close_code: int | None = None
    session_id: str | None = None
    faults: list[str] = field(default_factory=list)  # faults that fired, as spec strings
    opened_ns: int | None = None  # monotonic ns (CLOCK_MONOTONIC, the same clock in every local process)
    closed_ns: int | None = None
    handles: list[str] = field(default_factory=list)  # resumption handles issued (Gemini)
    resumed_handle: str | None = None  # the handle this connection resumed its session with (Gemini)
    notes: list[dict[str, Any]] | None = None
    faults_noted: int = 0  # faults already in the notes file
    session_noted: str | None = None  # the session id the notes file last named
    """What the connection heard and answered, as `note()` adds it (None: not kept). The shell sets a list when
    the server has a notes file and empties it into the file after every input and timer."""

    def note(self, now: int | None, kind: str, **fields: Any) -> None:
        """A fact for the notes file (`heard`: a caller utterance the model took, with its transcript text;
        `tool_call`: a call the model made, by its call id, and the input it answers; `response`: a reply the
        model began, and the input it answers; `mutated`: a frame the `mutate` fault corrupted, by what it was).
        Nothing when no notes are kept. `now` None: when the shell writes it (the input or timer under way)."""
        if self.notes is not None:
            self.notes.append({"kind": kind, "t_ns": now, **fields})


@dataclass(frozen=True, slots=True)
class CloseRequest:
    """The core asks the shell to close: with a close frame (`code`, `reason`), or `abrupt`ly (no frame)."""

    code: int
    reason: str = ""
    abrupt: bool = False


class IdSource(Protocol):
    def new(self, prefix: str) -> str: ...


class SequentialIds:
    """Predictable ids (`<prefix>_<seed><counter>` in hex); share one per server so ids are unique within it."""

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed & 0xFFFFFFFF
        self._n = 0

    def new(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._seed:08x}{self._n:016x}"


@dataclass(frozen=True, slots=True)
class ConnectionContext:
    """What a connection core is created with."""

    index: int  # 0-based; fault specs count connections from 1
    now: int
    unix_time: int
    ids: IdSource
    request: Request
    faults: tuple[Fault, ...]


class FakeConnection(Protocol):
    """What the shell drives. `recorded(frame)` is the frame as written to the record file (audio payloads
    shortened). Optionally `half_open: bool`: once true, the shell stops reading and writing on the socket
    (pings go unanswered), as a peer whose network vanished would, until the client closes, the server stops,
    or 50 s have passed (HALF_OPEN_LIMIT_S: then it drops the TCP connection, about when websockets' keepalive
    did)."""

    record: ConnectionRecord

    @property
    def last_frame(self) -> ClientFrameRecord | None: ...

    def receive_message(self, data: str | bytes, now: int) -> None: ...

    def handle_timer(self, now: int) -> None: ...

    def connection_lost(self, code: int | None, now: int | None = None) -> None: ...

    def inject(self, fault: Fault, now: int) -> None: ...

    def frames_to_send(self) -> list[str]: ...

    def close_to_send(self) -> CloseRequest | None: ...

    def next_deadline(self) -> int | None: ...

    def recorded(self, frame: dict[str, Any]) -> dict[str, Any]: ...


Authorize = Callable[[Request], HTTPStatus | None]

SERVER_HEADER = SERVER  # the `Server` header of every answer, as websockets' asyncio server sends it
MAX_MESSAGE_BYTES = 16 * 2**20  # a larger client message fails the connection (close 1009)
OPEN_TIMEOUT_S = 10.0  # for the HTTP upgrade request to arrive
PING_INTERVAL_S = 20.0  # the server's keepalive: a ping every 20 s, 20 s for its pong
PING_TIMEOUT_S = 20.0
CLOSE_TIMEOUT_S = 10.0  # for the client's side of a close handshake (then the TCP connection is dropped)
MAX_REQUEST_BYTES = 2**16  # an upgrade request longer than this goes to the protocol whole (which refuses it)
HALF_OPEN_LIMIT_S = 50.0  # a half-open connection is dropped (no frame, no FIN of ours) this long after
_HEAD_7 = struct.Struct("!BB")
_HEAD_16 = struct.Struct("!BBH")
_HEAD_64 = struct.Struct("!BBQ")


def server_text_frame(payload: bytes) -> bytes:
    """One final, unmasked text frame (RFC 6455 §5.2), byte for byte as websockets' `Frame.serialize` gives."""
    n = len(payload)
    if n < 126:
        return _HEAD_7.pack(0x81, n) + payload
    if n < 65536:
        return _HEAD_16.pack(0x81, 126, n) + payload
    return _HEAD_64.pack(0x81, 127, n) + payload


class FakeServer:
    """A running fake on loopback; `close()` or `async with` stops it."""

    def __init__(
        self,
        name: str,
        factory: Callable[[ConnectionContext], FakeConnection],
        *,
        path: str,
        accepts_path: Callable[[str], bool],
        authorize: Authorize,
        faults: Sequence[Fault] = (),
        record_path: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        self.name = name
        self._factory = factory
        self._path = path
        self._accepts_path = accepts_path
        self._authorize = authorize
        self.faults = list(faults)
        self._record_path = record_path
        self._record: IO[str] | None = None
        self._notes: IO[str] | None = None
        self._ssl = ssl
        self._ids = SequentialIds(secrets.randbits(32))
        self._listener: asyncio.Server | None = None
        self._sockets: set[_Socket] = set()  # every TCP connection, upgraded or not
        self._live: dict[int, _Socket] = {}  # open WebSocket connections by index
        self._later: list[Fault] = []  # runtime faults for connections not yet open
        self._stopping = False
        self.connections: list[ConnectionRecord] = []
        self.keep_records = True
        """False: only the open connections' records are kept (serve's embedded echo, `fake-provider`: a fake
        that runs for weeks must not grow by one record per call)."""
        self._opened = 0  # upgrades seen, refused ones included: fault specs count connections by it
        self._ws_logger = logging.getLogger(f"providers.fakes.{name}.websockets")
        # websockets logs request headers (Authorization included) at DEBUG: never below INFO here.
        self._ws_logger.setLevel(max(logging.INFO, self._ws_logger.level))
        self.host = "127.0.0.1"
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> Self:
        if self._record_path is not None:
            self._record = open(self._record_path, "a", encoding="utf-8")
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(lambda: _Socket(self), host, port, ssl=self._ssl)
        self.host, self.port = host, self._listener.sockets[0].getsockname()[1]
        self._ws_logger.info("server listening on %s:%d", host, self.port)
        return self

    def keep_notes(self, path: str) -> None:
        """Append each connection's notes (the module docstring) to `path` from now on."""
        self._notes = open(path, "a", encoding="utf-8")

    def _write_notes(self, record: ConnectionRecord, now: int, *extra: dict[str, Any]) -> None:
        """The record's new notes (and `extra` ones, the shell's own) to the notes file, the record's emptied."""
        notes = self._notes
        if notes is None or record.notes is None:
            return
        if not (record.notes or extra or len(record.faults) > record.faults_noted) and (
            record.session_id == record.session_noted
        ):
            return  # (every client frame comes here: nothing to write is the common case)
        # a fault fired since the last write comes before what it did
        fired = [{"kind": "fault", "t_ns": now, "spec": f} for f in record.faults[record.faults_noted :]]
        record.faults_noted = len(record.faults)
        pending = [*fired, *record.notes, *extra]
        record.notes.clear()
        if record.session_id != record.session_noted:
            record.session_noted = record.session_id
            pending.insert(0, {"kind": "session", "t_ns": now})
        if not pending:
            return
        unix, mono = time.time(), time.monotonic_ns()
        for note in pending:
            line = {"conn": record.index, "session": record.session_id, **note}
            if line["t_ns"] is None:
                line["t_ns"] = now
            line["unix"] = round(unix - (mono - int(line["t_ns"])) / NS_PER_S, 4)
            notes.write(json.dumps(line, separators=(",", ":")) + "\n")
        notes.flush()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "wss" if self._ssl is not None else "ws"
        return f"{scheme}://{host}:{self.port}{self._path}"

    def inject(self, fault: Fault) -> None:
        """Apply a fault now: to every open connection (or the N-th, now or when it opens). `refuse` applies
        to the upgrades that follow."""
        if fault.kind is FaultKind.REFUSE:
            self.faults.append(fault)
            return
        now = time.monotonic_ns()
        applied = False
        for index, sock in self._live.items():
            if fault.applies_to(index + 1):
                sock.inject(fault, now)
                applied = True
        if fault.connection is not None and not applied:
            self._later.append(fault)

    async def close(self) -> None:
        """Stop listening, close every open connection (1001, as websockets' server does; a half-open or
        unfinished one is dropped), and wait until each has ended and left its lifetime in the records."""
        self._stopping = True
        if self._listener is not None:
            self._listener.close()
        sockets = list(self._sockets)
        for sock in sockets:
            sock.shut_down()
        waiting = [sock.lost for sock in sockets if not sock.lost.done()]
        if waiting:
            _, late = await asyncio.wait(waiting, timeout=CLOSE_TIMEOUT_S + 1.0)
            if late:
                for sock in sockets:
                    sock.abort()
                await asyncio.wait(late, timeout=1.0)
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None
        if self._record is not None:
            self._record.close()
            self._record = None
        if self._notes is not None:
            self._notes.close()
            self._notes = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- the HTTP upgrade and the connection's lifetime, called by _Socket ----------------------------------

    def _process_request(self, proto: ServerProtocol, request: Request) -> Response | None:
        """The answer to a request that is not a WebSocket upgrade to take (None: go on with the upgrade)."""
        path = urlsplit(request.path).path
        if path == "/_fault":
            return self._fault_request(proto, request)
        if path == "/_connections":
            live = {"open": sorted(index + 1 for index, sock in self._live.items() if not sock.hanging)}
            return proto.reject(HTTPStatus.OK, json.dumps(live) + "\n")
        if not self._accepts_path(path):
            return proto.reject(HTTPStatus.NOT_FOUND, "Not Found\n")
        status = self._authorize(request)
        if status is not None:
            return proto.reject(status, f"{status.phrase}\n")
        if self._stopping:
            return proto.reject(HTTPStatus.SERVICE_UNAVAILABLE, "Server is shutting down.\n")
        upcoming = self._opened + 1
        if any(f.kind is FaultKind.REFUSE and f.applies_to(upcoming) for f in self.faults + self._later):
            if self.keep_records:
                self.connections.append(ConnectionRecord(self._opened, faults=["refuse"]))
            self._opened += 1
            return proto.reject(HTTPStatus.SERVICE_UNAVAILABLE, "Service Unavailable\n")
        return None

    def _fault_request(self, proto: ServerProtocol, request: Request) -> Response:
        specs = parse_qs(urlsplit(request.path).query).get("spec", [])
        try:
            faults = [parse_fault(spec) for spec in specs]
        except ValueError as exc:
            return proto.reject(HTTPStatus.BAD_REQUEST, f"{exc}\n")
        if not faults:
            return proto.reject(HTTPStatus.BAD_REQUEST, "give ?spec=KIND[:VALUE][@AFTER_MS]\n")
        for fault in faults:
            self.inject(fault)
        return proto.reject(HTTPStatus.OK, "ok\n")

    def _open(self, sock: _Socket, request: Request) -> tuple[int, FakeConnection]:
        """An upgrade was accepted: the connection's core, its index and its record."""
        index = self._opened
        self._opened += 1
        faults = tuple(f for f in self.faults if f.applies_to(index + 1))
        later = [f for f in self._later if f.applies_to(index + 1)]
        self._later = [f for f in self._later if f not in later]
        core = self._factory(
            ConnectionContext(
                index, time.monotonic_ns(), int(time.time()), self._ids, request, faults + tuple(later)
            )
        )
        core.record.opened_ns = time.monotonic_ns()
        if self._notes is not None:
            core.record.notes = []
            self._write_notes(
                core.record, core.record.opened_ns, {"kind": "open", "t_ns": core.record.opened_ns}
            )
        self.connections.append(core.record)
        self._live[index] = sock
        return index, core

    def _ended(self, index: int, core: FakeConnection, code: int | None) -> None:
        """An open connection's TCP connection has ended (whoever ended it): its lifetime goes to the records."""
        del self._live[index]
        core.record.closed_ns = time.monotonic_ns()
        core.connection_lost(code if code is not None else core.record.close_code, core.record.closed_ns)
        if not self.keep_records:
            self.connections.remove(core.record)
        if self._record is not None:
            self._record.flush()
            self._write_lifetime(core.record)
        self._write_notes(
            core.record,
            core.record.closed_ns,
            {"kind": "closed", "t_ns": core.record.closed_ns, "code": code},
        )

    def _write_lifetime(self, record: ConnectionRecord) -> None:
        assert self._record_path is not None
        line = {
            "conn": record.index,
            "opened_ns": record.opened_ns,
            "closed_ns": record.closed_ns,
            "close_code": record.close_code,
            "session_id": record.session_id,
            "handles": record.handles,
            "resumed_handle": record.resumed_handle,
        }
        with open(self._record_path + ".connections", "a", encoding="utf-8") as f:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")

    def _write_record(self, core: FakeConnection) -> None:
        entry = core.last_frame
        if self._record is None or entry is None:
            return
        line: dict[str, Any] = {"conn": core.record.index, "t_ns": entry.now}
        if entry.frame is None:
            line["raw"] = entry.raw
        else:
            line["frame"] = core.recorded(entry.frame)
        self._record.write(json.dumps(line, separators=(",", ":")) + "\n")


class _Socket(asyncio.Protocol):
    """One TCP connection to the fake: the HTTP upgrade, then one core over websockets' sans-I/O protocol.

    Everything happens in the transport's callbacks and on one re-armed loop timer (the core's next deadline,
    or the keepalive's, whichever comes first): no task, no queue. Frames the core pulls after an input leave
    in one transport write at the end of the callback, behind what the protocol itself queued (pongs, close
    frames), in order. Once the core asked to close (or the client did), the core takes no more input.
    """

    def __init__(self, server: FakeServer) -> None:
        self._server = server
        self._proto = ServerProtocol(max_size=MAX_MESSAGE_BYTES, logger=server._ws_logger)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self.lost: asyncio.Future[None] = self._loop.create_future()
        self._core: FakeConnection | None = None
        self._index = -1
        self._active = False  # the core takes input: open, not closing, not half-open
        self.hanging = False  # half-open: nothing read or written any more
        # Before the upgrade, the close deadline is the open timeout (the keepalive proper starts with the
        # connection).
        self._keepalive = Keepalive(None, None, OPEN_TIMEOUT_S)
        self._keepalive_due: int | None = None  # its next deadline, kept as it changes (asked every message)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._out: list[bytes] = []  # written at the end of the current callback, in one write
        self._eof = False  # the protocol asked to end the stream after _out
        self._fragments: list[bytes] = []
        self._fragment_text = False
        self._buffer = b""  # received bytes not yet given to the protocol or taken as a frame here
        self._split = True  # frames are split here, each whole frame to the protocol or taken directly

    # -- asyncio.Protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._server._sockets.add(self)
        self._closing()  # the open timeout
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.hanging:
            return
        proto = self._proto
        if not self._split:
            proto.receive_data(data)
            self._events()
        else:
            self._buffer += data
            if self._core is None:
                self._request()
            if self._core is not None:
                self._frames()
        self._take_writes()
        if proto.state is not OPEN:
            self._active = False
            if proto.close_expected():
                self._closing()
        self._flush()
        self._arm()

    def eof_received(self) -> bool | None:
        if self._buffer:  # a part of a request or frame: the protocol sees it end early
            self._proto.receive_data(self._buffer)
            self._buffer = b""
        self._proto.receive_eof()
        self._take_writes()
        self._flush()
        return None  # the transport closes itself (a WebSocket never writes after the peer's EOF)

    def connection_lost(self, exc: Exception | None) -> None:
        self._proto.receive_eof()  # idempotent; the state becomes CLOSED
        self._active = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport = None
        self._server._sockets.discard(self)
        core, self._core = self._core, None
        try:
            if core is not None:
                self._server._ended(self._index, core, self._proto.close_code)
        finally:
            if not self.lost.done():
                self.lost.set_result(None)

    # -- the server's side ---------------------------------------------------------------------------------

    def inject(self, fault: Fault, now: int) -> None:
        """A runtime fault: the core may act on it at once (what it pulls goes out now) or at a deadline."""
        core = self._core
        assert core is not None
        core.inject(fault, now)
        self._server._write_notes(core.record, now)
        if self._active:
            self._pull()
            self._send()

    def shut_down(self) -> None:
        """The server stops: an open connection is closed with 1001 (its close handshake may take up to
        CLOSE_TIMEOUT_S), any other dropped."""
        if self._proto.state is OPEN and not self.hanging:
            self._active = False
            self._proto.send_close(CloseCode.GOING_AWAY)
            self._closing()
            self._send()
        elif self._proto.state is not CLOSING:
            self.abort()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # -- reading -------------------------------------------------------------------------------------------
    #
    # The protocol always sees whole units: the upgrade request alone (up to its blank line), then whole frames,
    # so that its parser is at a boundary whenever a frame is taken here instead. A final text or binary frame
    # of an open connection (the client's audio, 50 a second) is unmasked and fed to the core directly, which
    # costs a sixth of the protocol's parser; every other frame (control frames, fragments, anything odd) goes
    # to the protocol, and from a frame it would refuse on sight (too long, unmasked) on, everything does.

    def _request(self) -> None:
        """The upgrade request, once its blank line is in: to the protocol alone, the bytes behind it kept."""
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > MAX_REQUEST_BYTES:  # the protocol refuses it (a line or header too long)
                self._unsplit(buffer)
            return
        self._buffer = buffer[end + 4 :]
        self._proto.receive_data(buffer[: end + 4])
        self._events()
        if self._core is None:  # refused or not a request: whatever follows goes to the protocol
            self._unsplit(self._buffer)

    def _unsplit(self, data: bytes) -> None:
        """From here on every byte goes to the protocol, `data` (what was buffered) first."""
        self._split, self._buffer = False, b""
        if data:
            self._proto.receive_data(data)
            self._events()

    def _frames(self) -> None:
        """Every whole frame in the buffer, in order; a partial one waits for the rest."""
        buffer, proto = self._buffer, self._proto
        at, size = 0, len(buffer)
        while not self.hanging and (extent := frame_extent(buffer, at)) is not None:
            head, length = extent  # head: with the masking key
            if not buffer[at + 1] & 0x80 or length > MAX_MESSAGE_BYTES:  # the protocol fails the connection
                self._unsplit(buffer[at:])
                return
            end = at + head + length
            if end > size:
                break
            first = buffer[at]
            if (first == 0x81 or first == 0x82) and proto.state is OPEN and proto.cur_size is None:
                payload = apply_mask(buffer[at + head : end], buffer[at + head - 4 : at + head])
                message = self._text(payload) if first == 0x81 else payload
                if message is not None and self._active:
                    self._feed(message)
            else:
                proto.receive_data(buffer[at:end])
                self._events()
            at = end
        self._buffer = buffer[at:] if at else buffer
        if self.hanging:
            self._buffer = b""

    def _events(self) -> None:
        """What the protocol made of the bytes it was given: the request, whole messages, pongs."""
        for event in self._proto.events_received():
            if not isinstance(event, Frame):
                if isinstance(event, Request):
                    self._upgrade(event)
                continue
            opcode = event.opcode
            message: str | bytes | None = None
            if opcode is OP_TEXT or opcode is OP_BINARY:
                if event.fin:
                    message = bytes(event.data) if opcode is OP_BINARY else self._text(event.data)
                else:
                    self._fragment_text = opcode is OP_TEXT
                    self._fragments = [bytes(event.data)]
            elif opcode is OP_CONT:
                self._fragments.append(bytes(event.data))
                if event.fin:
                    whole, self._fragments = b"".join(self._fragments), []
                    message = self._text(whole) if self._fragment_text else whole
            elif opcode is OP_PONG:
                self._keepalive.pong(bytes(event.data), time.monotonic_ns())
                self._keepalive_due = self._keepalive.next_deadline()
            if message is not None and self._active:
                self._feed(message)
            if self.hanging:
                break

    # -- the upgrade ---------------------------------------------------------------------------------------

    def _upgrade(self, request: Request) -> None:
        proto = self._proto
        response = self._server._process_request(proto, request)
        if response is None:
            response = proto.accept(request)
        response.headers["Server"] = SERVER_HEADER
        proto.send_response(response)
        self._take_writes()
        if proto.state is not OPEN:  # refused: the answer, then the end of the connection
            self._flush()
            if self._transport is not None:
                self._transport.close()
            return
        self._index, self._core = self._server._open(self, request)
        self._active = True
        now = time.monotonic_ns()
        self._keepalive = Keepalive(PING_INTERVAL_S, PING_TIMEOUT_S, CLOSE_TIMEOUT_S)
        self._keepalive.start(now)
        self._keepalive_due = self._keepalive.next_deadline()

    # -- the core --------------------------------------------------------------------------------------------

    def _text(self, data: bytes | bytearray | memoryview) -> str | None:
        """A text message, or None when it is not UTF-8 (the connection fails)."""
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as exc:
            self._not_utf8(exc)
            return None

    def _not_utf8(self, exc: UnicodeDecodeError) -> None:
        """Invalid UTF-8 in a text message fails the connection (close 1007), as websockets' server does."""
        self._active = False
        self._proto.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")

    def _feed(self, message: str | bytes) -> None:
        core = self._core
        assert core is not None
        try:
            now = time.monotonic_ns()
            core.receive_message(message, now)
            if self._server._record is not None:
                self._server._write_record(core)
            self._server._write_notes(core.record, now)
        except Exception:
            self._crashed()
            return
        self._pull()

    def _pull(self) -> None:
        """Send what the core has for the client, then hang or close as it asks."""
        core = self._core
        assert core is not None
        frames = core.frames_to_send()
        if frames and self._proto.state is OPEN:
            self._take_writes()
            self._out += [server_text_frame(frame.encode()) for frame in frames]
        if getattr(core, "half_open", False):
            self._hang()
            return
        request = core.close_to_send()
        if request is None:
            return
        self._active = False
        if request.abrupt:
            self._flush()
            self.abort()
        elif self._proto.state is OPEN:
            self._take_writes()
            self._proto.send_close(request.code, request.reason)
            self._take_writes()
            self._closing()

    def _hang(self) -> None:
        """A half-open socket: what was already pulled goes out, then nothing is read (so pings go unanswered
        and nothing more is recorded) or written, but the TCP connection stays, until the client gives up, the
        server stops, or HALF_OPEN_LIMIT_S have passed (websockets' keepalive used to drop it about then)."""
        self._active = False
        self._flush()
        self.hanging = True
        if self._transport is not None:
            self._transport.pause_reading()
        self._keepalive = Keepalive(None, None, HALF_OPEN_LIMIT_S)
        self._closing()

    def _crashed(self) -> None:
        """A core raised (a bug in the fake): logged, and the connection fails with 1011, as websockets'
        server does when a handler raises."""
        self._server._ws_logger.error("connection handler failed", exc_info=True)
        self._active = False
        if self._proto.state is OPEN:
            self._proto.fail(CloseCode.INTERNAL_ERROR)
            self._closing()

    # -- writing ---------------------------------------------------------------------------------------------

    def _take_writes(self) -> None:
        """What the protocol queued (handshake answers, pongs, pings, close frames, the end of the stream)."""
        for data in self._proto.data_to_send():
            if data:
                self._out.append(data)
            else:
                self._eof = True

    def _send(self) -> None:
        """Everything queued goes out in one write, and the timer is re-armed for what is due next."""
        self._take_writes()
        self._flush()
        self._arm()

    def _flush(self) -> None:
        transport, out = self._transport, self._out
        if transport is None or transport.is_closing() or self.hanging:
            out.clear()
            self._eof = False
            return
        if out:
            transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()
        if self._eof:
            self._eof = False
            if transport.can_write_eof():  # half-close; the client's FIN ends the connection
                try:
                    transport.write_eof()
                except (OSError, RuntimeError):  # uvloop may raise RuntimeError
                    pass
            else:  # TLS: close (what was written still goes out first)
                transport.close()

    # -- the one timer ---------------------------------------------------------------------------------------

    def _closing(self) -> None:
        """The TCP connection must end within the keepalive's close timeout (or the open timeout, or the
        half-open limit), or it is dropped."""
        self._keepalive.closing(time.monotonic_ns())
        self._keepalive_due = self._keepalive.next_deadline()

    def _deadline(self) -> int | None:
        due = self._keepalive_due
        if self._active:
            assert self._core is not None
            core_due = self._core.next_deadline()
            if core_due is not None and (due is None or core_due < due):
                due = core_due
        return due

    def _arm(self) -> None:
        """Keep one loop timer at or before the next deadline (one that fires early re-arms)."""
        due = self._deadline()
        if due is None or self._transport is None:
            return
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.cancel()
        self._timer_at = due
        self._timer = self._loop.call_later(max(0.0, (due - time.monotonic_ns()) / NS_PER_S), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        # What the timer was armed for is never seen as early, even if the loop's clock rounds.
        now = max(time.monotonic_ns(), self._timer_at)
        proto = self._proto
        action = None
        if self._keepalive_due is not None and now >= self._keepalive_due:
            action = self._keepalive.handle_timer(now)
            self._keepalive_due = self._keepalive.next_deadline()
        if action is KeepaliveAction.ABORT:
            self.abort()
            return
        if action is KeepaliveAction.PING and proto.state is OPEN:
            proto.send_ping(self._keepalive.payload)
        elif action is KeepaliveAction.FAIL:
            self._active = False
            proto.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
        if self._active:
            core = self._core
            assert core is not None
            due = core.next_deadline()
            if due is not None and due <= now:
                try:
                    core.handle_timer(now)
                except Exception:
                    self._crashed()
                else:
                    self._server._write_notes(core.record, now)
                    self._pull()
        self._send()


def exact_member(text: str, head: str, tail: str) -> str | None:
    """`value` when `text` is exactly `head + value + tail` and `value` needs no JSON unescaping (no quote,
    backslash or control character): the string json.loads would read there, found without parsing (a fake's
    hot audio frame, as the bridge's adapter writes it). None otherwise: the caller parses the frame."""
    if len(text) < len(head) + len(tail) or not text.startswith(head) or not text.endswith(tail):
        return None
    value = text[len(head) : len(text) - len(tail)]
    if '"' in value or "\\" in value or not value.isprintable():
        return None
    return value


def frame_kind(frame: str) -> str:
    """What an outbound frame is, for the notes: its `type` (OpenAI family), else its top-level key and, for
    `serverContent`, the keys inside (Gemini); `?` when it is not a JSON object."""
    try:
        data = json.loads(frame)
    except ValueError:
        return "?"
    if not isinstance(data, dict):
        return "?"
    if isinstance(data.get("type"), str):
        return str(data["type"])
    inner = data.get("serverContent")
    if isinstance(inner, dict):
        return "serverContent." + ",".join(sorted(inner))
    return ",".join(sorted(data))


def shorten_audio(frame: dict[str, Any], event_type: str, decoded_bytes: int | None) -> dict[str, Any]:
    """An OpenAI-family audio append as the record file keeps it: its decoded length plus the base64."""
    if frame.get("type") == event_type and isinstance(frame.get("audio"), str):
        return {**frame, "audio": {"bytes": decoded_bytes, "base64": frame["audio"]}}
    return frame


def bearer_authorize(request: Request) -> HTTPStatus | None:
    """OpenAI-style auth: `Authorization: Bearer <non-empty>` (the token itself is never logged)."""
    try:
        auth = request.headers.get("Authorization", "")
    except Exception:  # a repeated header
        return HTTPStatus.UNAUTHORIZED
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return HTTPStatus.UNAUTHORIZED
    return None


_Server = TypeVar("_Server", bound=FakeServer)


def serving(server: Callable[..., _Server]) -> Callable[..., Awaitable[_Server]]:
    """A fake module's `serve(host="127.0.0.1", port=0, **arguments of its server())`: the fake started and
    listening (port 0 picks a free port: see `.port` / `.url`)."""

    async def serve(host: str = "127.0.0.1", port: int = 0, *args: Any, **kwargs: Any) -> _Server:
        return await server(*args, **kwargs).start(host, port)

    serve.__doc__ = f"Start the fake of `server()` on host:port and return it. {server.__doc__ or ''}"
    return serve
