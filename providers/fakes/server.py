"""The thin websockets shell every provider fake runs in, and the records all fakes keep.

Each fake is a sans-I/O connection core (its protocol and scripted model, on `now`) plus this shell: HTTP checks
on the upgrade, one loop per connection that feeds client frames and the single re-armed timer, writes what
the core pulls, performs the close the core asks for, and keeps an optional JSON-lines record of every client
frame. Faults (providers/fakes/faults.py) reach connections from the options, at runtime through `inject()`,
or through `GET /_fault?spec=...` on the fake's own port (for a fake running as a separate process);
`GET /_connections` lists the connections open now (1-based, as a fault's `N/` counts them). With a record
file, each connection's lifetime is appended to `<record>.connections` when it ends (JSON lines: `conn`,
`opened_ns`, `closed_ns` on the monotonic clock, `close_code`, `session_id`, `handles`, `resumed_handle`), so
that a test in another process can tell whether two connections overlapped.

A connection core provides:
- `record: ConnectionRecord`, `last_frame: ClientFrameRecord | None`;
- `receive_message(data, now)`, `handle_timer(now)`, `connection_lost(code, now)`, `inject(fault, now)`;
- `frames_to_send() -> list[str]`, `close_to_send() -> CloseRequest | None`, `next_deadline() -> int | None`;
- `recorded(frame) -> dict`: the frame as written to the record file (audio payloads shortened);
- optionally `half_open: bool`: once true, the shell stops reading and writing on the socket (pings go
  unanswered), as a peer whose network vanished would, until the client closes or the server stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import ssl as ssl_module
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import IO, Any, Protocol
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from providers.fakes.faults import Fault, FaultKind, parse_fault

_NS_PER_S = 1_000_000_000
_WAKE = object()  # queued to a connection loop to make it look at its timer again


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
    record: ConnectionRecord
    last_frame: ClientFrameRecord | None

    def receive_message(self, data: str | bytes, now: int) -> None: ...

    def handle_timer(self, now: int) -> None: ...

    def connection_lost(self, code: int | None, now: int | None = None) -> None: ...

    def inject(self, fault: Fault, now: int) -> None: ...

    def frames_to_send(self) -> list[str]: ...

    def close_to_send(self) -> CloseRequest | None: ...

    def next_deadline(self) -> int | None: ...

    def recorded(self, frame: dict[str, Any]) -> dict[str, Any]: ...


Authorize = Callable[[Request], HTTPStatus | None]


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
        self._ssl = ssl
        self._ids = SequentialIds(secrets.randbits(32))
        self._server: Server | None = None
        self._live: dict[int, tuple[FakeConnection, asyncio.Queue[object]]] = {}
        self._later: list[Fault] = []  # runtime faults for connections not yet open
        self._hanging: set[ServerConnection] = set()  # half-open sockets: no close handshake is possible
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

    async def start(self, host: str, port: int) -> FakeServer:
        if self._record_path is not None:
            self._record = open(self._record_path, "a", encoding="utf-8")
        self._server = await ws_serve(
            self._handler,
            host,
            port,
            process_request=self._process_request,
            max_size=16 * 2**20,
            compression=None,
            ssl=self._ssl,
            logger=self._ws_logger,
        )
        self.host, self.port = host, next(iter(self._server.sockets)).getsockname()[1]
        return self

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
        for index, (core, wake) in self._live.items():
            if fault.applies_to(index + 1):
                core.inject(fault, now)
                wake.put_nowait(_WAKE)
                applied = True
        if fault.connection is not None and not applied:
            self._later.append(fault)

    async def close(self) -> None:
        for ws in list(self._hanging):  # a half-open peer would never finish a close handshake
            if ws.transport is not None:
                ws.transport.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self._record is not None:
            self._record.close()
            self._record = None

    async def __aenter__(self) -> FakeServer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == "/_fault":
            return self._fault_request(connection, request)
        if path == "/_connections":
            live = {
                "open": sorted(
                    index + 1
                    for index, (core, _) in self._live.items()
                    if not getattr(core, "half_open", False)
                )
            }
            return connection.respond(HTTPStatus.OK, json.dumps(live) + "\n")
        if not self._accepts_path(path):
            return connection.respond(HTTPStatus.NOT_FOUND, "Not Found\n")
        status = self._authorize(request)
        if status is not None:
            return connection.respond(status, f"{status.phrase}\n")
        upcoming = self._opened + 1
        if any(f.kind is FaultKind.REFUSE and f.applies_to(upcoming) for f in self.faults + self._later):
            if self.keep_records:
                self.connections.append(ConnectionRecord(self._opened, faults=["refuse"]))
            self._opened += 1
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "Service Unavailable\n")
        return None

    def _fault_request(self, connection: ServerConnection, request: Request) -> Response:
        specs = parse_qs(urlsplit(request.path).query).get("spec", [])
        try:
            faults = [parse_fault(spec) for spec in specs]
        except ValueError as exc:
            return connection.respond(HTTPStatus.BAD_REQUEST, f"{exc}\n")
        if not faults:
            return connection.respond(HTTPStatus.BAD_REQUEST, "give ?spec=KIND[:VALUE][@AFTER_MS]\n")
        for fault in faults:
            self.inject(fault)
        return connection.respond(HTTPStatus.OK, "ok\n")

    async def _handler(self, ws: ServerConnection) -> None:
        index = self._opened
        self._opened += 1
        assert ws.request is not None
        faults = tuple(f for f in self.faults if f.applies_to(index + 1))
        later = [f for f in self._later if f.applies_to(index + 1)]
        self._later = [f for f in self._later if f not in later]
        core = self._factory(
            ConnectionContext(
                index, time.monotonic_ns(), int(time.time()), self._ids, ws.request, faults + tuple(later)
            )
        )
        core.record.opened_ns = time.monotonic_ns()
        self.connections.append(core.record)
        inbox: asyncio.Queue[object] = asyncio.Queue()
        self._live[index] = (core, inbox)
        reader = asyncio.create_task(self._read(ws, inbox))
        try:
            await self._run(ws, core, inbox)
        except ConnectionClosed:
            pass
        finally:
            reader.cancel()
            del self._live[index]
            code = ws.close_code if ws.close_code is not None else core.record.close_code
            core.record.closed_ns = time.monotonic_ns()
            core.connection_lost(code, core.record.closed_ns)
            if not self.keep_records:
                self.connections.remove(core.record)
            if self._record is not None:
                self._record.flush()
                self._write_lifetime(core.record)

    @staticmethod
    async def _read(ws: ServerConnection, inbox: asyncio.Queue[object]) -> None:
        try:
            async for message in ws:
                inbox.put_nowait(message)
        except ConnectionClosed:
            pass
        inbox.put_nowait(None)  # the client went away

    async def _run(self, ws: ServerConnection, core: FakeConnection, inbox: asyncio.Queue[object]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            deadline = core.next_deadline()
            now = time.monotonic_ns()
            if deadline is not None and deadline <= now:
                core.handle_timer(now)
                await asyncio.sleep(
                    0
                )  # never starve the other connections, even if a core's deadline is stuck
            else:
                try:
                    if deadline is None:
                        item = await inbox.get()
                    else:
                        async with asyncio.timeout_at(loop.time() + (deadline - now) / _NS_PER_S):
                            item = await inbox.get()
                except TimeoutError:
                    core.handle_timer(max(deadline or 0, time.monotonic_ns()))
                else:
                    if item is None:
                        return
                    if item is not _WAKE:
                        assert isinstance(item, (str, bytes))
                        core.receive_message(item, time.monotonic_ns())
                        self._write_record(core)
            for frame in core.frames_to_send():
                await ws.send(frame)
            if getattr(core, "half_open", False):
                await self._hang(ws)
                return
            request = core.close_to_send()
            if request is not None:
                if request.abrupt:
                    if ws.transport is not None:
                        ws.transport.abort()
                else:
                    await ws.close(request.code, request.reason)
                return

    async def _hang(self, ws: ServerConnection) -> None:
        """A half-open socket: stop reading (so pings go unanswered and nothing more is recorded) and stop
        writing, but keep the TCP connection, until the client gives up or the server shuts down."""
        if ws.transport is not None:
            ws.transport.pause_reading()
        self._hanging.add(ws)
        try:
            await ws.wait_closed()
        finally:
            self._hanging.discard(ws)

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
