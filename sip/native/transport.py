"""Thin asyncio shells for SIP transports: UDP and TCP (RFC 3261 §18), IPv4 and IPv6, and the one timer.

Nothing here knows SIP beyond framing a stream into messages. Every byte that arrives goes to one `receiver`
callback with its source address, the `TransportRef` naming the socket or connection it came on, and `now`
(monotonic ns from the injected clock); the user-agent core decides what it means. What the core wants sent
comes back through `SipTransports.send(data, destination, transport)`.

- UDP: one `asyncio.DatagramProtocol` per listening address.
- TCP: a server per listening address and client connections opened on demand; each connection frames its
  byte stream with the parser's `StreamFramer` (Content-Length, RFC 3261 §18.3). A response goes back over
  the connection its request came on (§18.2.2): the core hands back the `TransportRef` it was given. A
  request to an address we already have a connection with reuses it; otherwise a client connection is opened
  and the data queued until it is up. A framing error closes that connection (a stream cannot resynchronise).
- `DeadlineTimer`: ONE `loop.call_at` re-armed for the core's `next_deadline()`, never a timer per
  transaction; re-armed only when the deadline changed (the aioquic shape).

Counts (`stats()`) let tests prove that sockets and connections go back to zero.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from sip.core.message import Message, ParseError

log = logging.getLogger("parlora.sip.transport")

Address = tuple[str, int]
Clock = Callable[[], int]


@dataclass(frozen=True, slots=True)
class TransportRef:
    """Where a message came from, or must leave by: `kind` "udp" or "tcp", the local listening address, and
    for TCP the connection's id (0 means "any connection to the destination, or a new one")."""

    kind: str
    local: Address
    connection: int = 0


class Framer(Protocol):
    """Splits a byte stream into SIP messages (the parser's `StreamFramer`): `feed` returns what the bytes
    completed (messages, or errors the core answers); `must_close` once the stream cannot be framed any more;
    `take_pings` counts RFC 5626 double-CRLF keep-alives, each answered with one CRLF."""

    def feed(self, data: bytes) -> Sequence[Message | ParseError]: ...

    @property
    def must_close(self) -> bool: ...

    def take_pings(self) -> int: ...


Inbound = bytes | Message | ParseError  # a datagram (UDP) or what the framer made of the stream (TCP)
Receiver = Callable[[Inbound, Address, TransportRef, int], None]
FramerFactory = Callable[[], Framer]


def _address(addr: tuple[object, ...]) -> Address:
    """(host, port) of a socket address; IPv6 addresses come as 4-tuples."""
    return str(addr[0]), int(addr[1])  # type: ignore[call-overload]


def family_of(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class _UdpListener(asyncio.DatagramProtocol):
    def __init__(self, owner: SipTransports, ref: TransportRef) -> None:
        self._owner = owner
        self.ref = ref
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        owner = self._owner
        owner.datagrams_in += 1
        owner.deliver(data, _address(addr), self.ref)

    def error_received(self, exc: Exception) -> None:
        self._owner.send_errors += 1  # ICMP unreachable for an earlier datagram: the core's timers cope
        log.debug("udp %s: %s", self.ref.local, exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


class _TcpConnection(asyncio.Protocol):
    """One TCP connection, accepted or opened by us, framed into SIP messages."""

    def __init__(
        self,
        owner: SipTransports,
        local: Address,
        conn_id: int,
        peer: Address | None = None,
        kind: str = "tcp",
    ) -> None:
        self._owner = owner
        self.ref = TransportRef(kind, local, conn_id)
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self._framer = owner.new_framer()
        self._pending: list[bytes] = []  # queued while a client connection is being opened
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.peer is None:
            self.peer = _address(transport.get_extra_info("peername"))
        self._owner.connection_up(self)
        for data in self._pending:
            self.transport.write(data)
        self._pending.clear()

    def data_received(self, data: bytes) -> None:
        owner = self._owner
        framer = self._framer
        try:
            items = framer.feed(data)
            pings = framer.take_pings()
        except Exception:  # a framer bug: this stream cannot be trusted any more
            owner.framing_errors += 1
            log.exception("tcp %s: framing failed; closing the connection", self.peer)
            self.close()
            return
        if pings and self.transport is not None:
            self.transport.write(b"\r\n" * pings)  # RFC 5626 §4.4.1: a CRLF pong per ping
        assert self.peer is not None
        for item in items:
            if isinstance(item, ParseError):
                owner.framing_errors += 1
            owner.deliver(item, self.peer, self.ref)  # the core answers what it can (400 with a partial)
        if framer.must_close:
            log.info("tcp %s: the stream cannot be framed any more; closing the connection", self.peer)
            self.close()  # after the core's answer was written: asyncio flushes before it closes

    def write(self, data: bytes) -> None:
        if self.transport is None:
            self._pending.append(data)
        else:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.closed = True
        self._owner.connection_down(self)


class SipTransports:
    """Every SIP socket of one user agent: listeners, TCP connections, and the send path."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        receiver: Receiver,
        framer_factory: FramerFactory,
        clock: Clock,
    ) -> None:
        self._loop = loop
        self._receiver = receiver
        self.new_framer = framer_factory
        self._clock = clock
        self._udp: dict[Address, _UdpListener] = {}
        self._servers: dict[Address, asyncio.Server] = {}
        self._connections: dict[int, _TcpConnection] = {}
        self._by_peer: dict[Address, int] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.tls_client: ssl.SSLContext | None = None  # outbound TLS: sip.native.tls.client_context(--tls-ca)
        self.datagrams_in = 0
        self.messages_out = 0
        self.send_errors = 0
        self.framing_errors = 0
        self.receiver_errors = 0

    # --- listening ---

    async def listen_udp(self, host: str, port: int) -> TransportRef:
        """Bind a UDP socket; returns its ref (the local address has the real port when `port` is 0)."""
        transport, protocol = await self._loop.create_datagram_endpoint(
            lambda: _UdpListener(self, TransportRef("udp", (host, port))),
            local_addr=(host, port),
            family=family_of(host),
        )
        local = _address(transport.get_extra_info("sockname"))
        ref = TransportRef("udp", local)
        protocol.ref = ref
        self._udp[local] = protocol
        return ref

    async def listen_tcp(self, host: str, port: int) -> TransportRef:
        """Listen for TCP connections; each accepted connection gets its own ref."""
        holder: list[Address] = [(host, port)]

        def factory() -> _TcpConnection:
            return _TcpConnection(self, holder[0], next(self._ids))

        server = await self._loop.create_server(
            factory, host, port, family=family_of(host), reuse_address=True
        )
        local = _address(server.sockets[0].getsockname())
        holder[0] = local
        self._servers[local] = server
        return TransportRef("tcp", local)

    async def listen_tls(self, host: str, port: int, context: ssl.SSLContext) -> TransportRef:
        """Listen for TLS connections (sip.native.tls.server_context); each accepted connection gets its own ref."""
        holder: list[Address] = [(host, port)]

        def factory() -> _TcpConnection:
            return _TcpConnection(self, holder[0], next(self._ids), kind="tls")

        server = await self._loop.create_server(
            factory,
            host,
            port,
            family=family_of(host),
            reuse_address=True,
            ssl=context,
            ssl_handshake_timeout=10.0,  # a peer that connects and never says hello is dropped
        )
        local = _address(server.sockets[0].getsockname())
        holder[0] = local
        self._servers[local] = server
        return TransportRef("tls", local)

    # --- in ---

    def deliver(self, data: Inbound, source: Address, ref: TransportRef) -> None:
        if self._closing:
            return
        try:
            self._receiver(data, source, ref, self._clock())
        except Exception:  # a core bug must not take the socket down with it
            self.receiver_errors += 1
            log.exception("SIP receiver failed on a message from %s", source)

    def connection_up(self, conn: _TcpConnection) -> None:
        self._connections[conn.ref.connection] = conn
        if conn.peer is not None:
            self._by_peer[conn.peer] = conn.ref.connection

    def connection_down(self, conn: _TcpConnection) -> None:
        self._connections.pop(conn.ref.connection, None)
        if conn.peer is not None and self._by_peer.get(conn.peer) == conn.ref.connection:
            del self._by_peer[conn.peer]

    # --- out ---

    def send(self, data: bytes, destination: Address, transport: str | TransportRef) -> bool:
        """Send one message ("UDP"/"TCP" as the core names it, or the ref it came in on); False (counted) when
        it cannot go. Over TCP, a connection with `destination` is reused (the one the peer opened, §18.2.2);
        failing that, a client connection is opened."""
        if self._closing:
            return False
        ref: TransportRef | None
        if isinstance(transport, TransportRef):
            ref, kind = transport, transport.kind
        else:
            ref, kind = None, transport.lower()
        self.messages_out += 1
        try:
            if kind == "udp":
                return self._send_udp(data, destination, ref)
            if kind in ("tcp", "tls"):
                return self._send_tcp(data, destination, ref, kind)
            log.info("no %s transport: message to %s dropped", kind, destination)
        except (OSError, RuntimeError, ValueError) as exc:
            # ValueError: uvloop's for a destination that is no IP address (a Contact naming a host: names
            # are not resolved here). The destination is the peer's choosing: logged as a bounded prefix.
            log.info("sending to %.200s over %s failed: %.200s", destination, kind, exc)
        self.send_errors += 1
        return False

    def _send_udp(self, data: bytes, destination: Address, ref: TransportRef | None) -> bool:
        listener = self._udp.get(ref.local) if ref is not None else None
        if listener is None:
            listener = self._udp_for(destination)
        if listener is None or listener.transport is None:
            self.send_errors += 1
            return False
        listener.transport.sendto(data, destination)
        return True

    def _udp_for(self, destination: Address) -> _UdpListener | None:
        family = family_of(destination[0])
        return next((u for a, u in self._udp.items() if family_of(a[0]) == family), None)

    def _send_tcp(self, data: bytes, destination: Address, ref: TransportRef | None, kind: str) -> bool:
        conn = self._connections.get(ref.connection) if ref is not None and ref.connection else None
        if conn is None or conn.closed:
            known = self._by_peer.get(destination)
            conn = self._connections.get(known) if known is not None else None
        if conn is None or conn.closed or conn.ref.kind != kind:  # never TLS data over a plain connection
            local = ref.local if ref is not None else self._tcp_local(destination)
            conn = self._open(destination, local, kind)
        conn.write(data)
        return True

    def _tcp_local(self, destination: Address) -> Address:
        family = family_of(destination[0])
        return next((a for a in self._servers if family_of(a[0]) == family), ("", 0))

    def _open(self, destination: Address, local: Address, kind: str = "tcp") -> _TcpConnection:
        """A client connection (RFC 3261 §18.1.1); data written meanwhile is queued in it. TLS verifies the
        peer's certificate for the destination's host (a name, or an IP address in its subjectAltName)."""
        conn = _TcpConnection(self, local, next(self._ids), destination, kind)
        tls = self.tls_client if kind == "tls" else None
        if kind == "tls" and tls is None:
            raise RuntimeError("no TLS client context (SipTransports.tls_client)")
        self._connections[conn.ref.connection] = conn
        self._by_peer[destination] = conn.ref.connection

        async def connect() -> None:
            try:
                await self._loop.create_connection(
                    lambda: conn,
                    destination[0],
                    destination[1],
                    ssl=tls,
                    server_hostname=destination[0] if tls is not None else None,
                )
            except OSError as exc:
                self.send_errors += 1
                log.info("tcp connection to %s failed: %s", destination, exc)
                conn.connection_lost(exc)

        self._spawn(connect())
        return conn

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- shutdown and counts ---

    async def close(self) -> None:
        """Close every listener and connection; waits until the sockets are gone."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for listener in self._udp.values():
            if listener.transport is not None:
                listener.transport.close()
        for server in self._servers.values():
            server.close()
        for conn in list(self._connections.values()):
            conn.close()
        for server in self._servers.values():
            await server.wait_closed()
        for _ in range(50):  # let transports run connection_lost (a TLS close_notify takes a few rounds)
            if not self._connections:
                break
            await asyncio.sleep(0.01)
        self._udp.clear()
        self._servers.clear()

    def stats(self) -> dict[str, int]:
        return {
            "udp_sockets": sum(1 for u in self._udp.values() if u.transport is not None),
            "tcp_servers": len(self._servers),
            "tcp_connections": len(self._connections),
            "tasks": len(self._tasks),
            "datagrams_in": self.datagrams_in,
            "messages_out": self.messages_out,
            "send_errors": self.send_errors,
            "framing_errors": self.framing_errors,
            "receiver_errors": self.receiver_errors,
        }


class DeadlineTimer:
    """The one timer of a sans-I/O core: `arm(deadline_ns)` after every input; calls `on_due(now)` then.

    The deadline is on the injected clock; it is converted to the loop's clock at arming time, so any
    monotonic clock works (uvloop's `loop.time()` included). Re-arming to the same deadline costs nothing."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Clock, on_due: Callable[[int], None]) -> None:
        self._loop = loop
        self._clock = clock
        self._on_due = on_due
        self._handle: asyncio.TimerHandle | None = None
        self._deadline: int | None = None
        self.fired = 0

    @property
    def deadline(self) -> int | None:
        return self._deadline

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def arm(self, deadline: int | None) -> None:
        if deadline == self._deadline and (deadline is None or self._handle is not None):
            return
        self.cancel()
        if deadline is None:
            return
        self._deadline = deadline
        delay = max(0, deadline - self._clock()) / 1e9
        self._handle = self._loop.call_at(self._loop.time() + delay, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._deadline = None

    def _fire(self) -> None:
        deadline = self._deadline
        self._handle = None
        self._deadline = None
        self.fired += 1
        now = self._clock()
        # The loop may wake a hair early against the injected clock: the core never sees time before its
        # own deadline (aioquic's max(timer_at, now)).
        self._on_due(now if deadline is None else max(now, deadline))
