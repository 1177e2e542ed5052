"""The per-call RTP shell: one socket pair (RTP on an even port, RTCP on the next) from a configured range.

`PortPool` hands out even ports and takes them back; `RtpSocketPair.open` binds RTP and RTCP as two
non-blocking UDP sockets watched with `loop.add_reader` (no transport objects, no buffering between us and
the kernel), trying the pool's next pair when a port is taken by someone else. Opening is synchronous, so a
call's media address is known the moment its INVITE is accepted.

Inbound datagrams are read one per wake-up and go to the callbacks with `now`; outbound ones leave
with `send_rtp`/`send_rtcp`, which return True only once `sendto` has returned: the moment the carrier ledger
records a frame as transmitted (DESIGN §3.2). A datagram the kernel refuses (buffer full, ICMP error) is
counted, not retried: the next frame is 20 ms away. No parsing here: the per-call stream core does that.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

log = logging.getLogger("parlora.rtp")

Address = tuple[str, int]
Clock = Callable[[], int]
DatagramSink = Callable[[bytes, Address, int], None]

MAX_DATAGRAM = 2048  # RTP/RTCP on a telephone call is far below the 1500-byte MTU


class PortsExhausted(RuntimeError):
    """No free RTP/RTCP port pair is left in the configured range."""


class PortPool:
    """Even RTP ports in [first, last); each allocation also reserves port + 1 for RTCP (RFC 3550 §11)."""

    def __init__(self, first: int, last: int) -> None:
        self.first = first + (first % 2)
        self.last = last
        if not 0 < self.first < self.last <= 65535:
            raise ValueError(f"RTP port range {self.first}-{self.last} is empty or out of range")
        self._ports = list(range(self.first, self.last, 2))
        self._used: set[int] = set()
        self._next = 0

    @property
    def in_use(self) -> int:
        return len(self._used)

    @property
    def capacity(self) -> int:
        return len(self._ports)

    def candidates(self) -> list[int]:
        """Free ports in round-robin order from where the last allocation stopped, so a port just released
        is the last to be reused (late packets of an ended call do not land in a new one)."""
        n = len(self._ports)
        order = (self._ports[(self._next + i) % n] for i in range(n))
        return [p for p in order if p not in self._used]

    def take(self, port: int) -> None:
        self._used.add(port)
        self._next = (self._ports.index(port) + 1) % len(self._ports)

    def release(self, port: int) -> None:
        self._used.discard(port)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class RtpSocketPair:
    """One call's RTP and RTCP sockets, registered with the loop until `close()`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pool: PortPool,
        port: int,
        rtp: socket.socket,
        rtcp: socket.socket,
        on_rtp: DatagramSink,
        on_rtcp: DatagramSink,
        clock: Clock,
    ) -> None:
        self._loop = loop
        self._pool = pool
        self.port = port
        self._rtp = rtp
        self._rtcp = rtcp
        self._on_rtp = on_rtp
        self._on_rtcp = on_rtcp
        self._clock = clock
        self.host = str(rtp.getsockname()[0])
        self.send_errors = 0
        self.receive_errors = 0
        self.closed = False
        loop.add_reader(rtp.fileno(), self._readable, rtp, on_rtp)
        loop.add_reader(rtcp.fileno(), self._readable, rtcp, on_rtcp)

    @classmethod
    def open(
        cls,
        loop: asyncio.AbstractEventLoop,
        host: str,
        pool: PortPool,
        on_rtp: DatagramSink,
        on_rtcp: DatagramSink,
        clock: Clock,
    ) -> RtpSocketPair:
        """Bind the next free pair of the pool; PortsExhausted when none is left."""
        for port in pool.candidates():
            try:
                rtp = _bind(host, port)
            except OSError:
                continue
            try:
                rtcp = _bind(host, port + 1)
            except OSError:
                rtp.close()
                continue
            pool.take(port)
            try:
                return cls(loop, pool, port, rtp, rtcp, on_rtp, on_rtcp, clock)
            except BaseException:
                pool.release(port)
                rtp.close()
                rtcp.close()
                raise
        raise PortsExhausted(f"no free RTP port pair in {pool.first}-{pool.last} ({pool.in_use} in use)")

    def _readable(self, sock: socket.socket, sink: DatagramSink) -> bool:
        """One datagram to `sink`; False when none was waiting or the read failed.

        One datagram per wake-up: a call's RTP arrives one packet per 20 ms, and the selector is level-
        triggered, so anything left wakes us again at once. Reading until EAGAIN would cost an exception per
        packet (measured: half of all recvfrom calls at 50 calls)."""
        try:
            data, addr = sock.recvfrom(MAX_DATAGRAM)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:  # ICMP port unreachable from a caller that went away, reported on the next read
            self.receive_errors += 1
            return False
        try:  # IPv4 gives (host, port) as it is; IPv6 (host, port, flowinfo, scope_id) is cut to two
            sink(data, addr if len(addr) == 2 else (addr[0], addr[1]), self._clock())
        except Exception:  # a core bug must not stop the socket
            self.receive_errors += 1
            log.exception("RTP receiver failed")
        return True

    def drain_rtp(self, limit: int) -> int:
        """Read at most `limit` RTP datagrams waiting now; returns how many. Issue 17: a media tick that woke
        late calls this before it serves its slots, which then find the packets that came during the stall
        (the loop would read them only after the tick, and the slots would be concealed instead)."""
        read = 0
        while read < limit and self._readable(self._rtp, self._on_rtp):
            read += 1
        return read

    def send_rtp(self, data: bytes | bytearray | memoryview, destination: Address) -> bool:
        """Hand one RTP datagram to the kernel; True once `sendto` has returned without error."""
        try:
            self._rtp.sendto(data, destination)
        except OSError:  # BlockingIOError (socket buffer full), unreachable, closed
            self.send_errors += 1
            return False
        return True

    def send_rtcp(self, data: bytes, destination: Address) -> bool:
        try:
            self._rtcp.sendto(data, destination)
        except OSError:
            self.send_errors += 1
            return False
        return True

    @property
    def open_sockets(self) -> int:
        return sum(1 for s in (self._rtp, self._rtcp) if s.fileno() >= 0)

    def close(self) -> None:
        """Unregister and close both sockets and give the port pair back (idempotent)."""
        if self.closed:
            return
        self.closed = True
        for sock in (self._rtp, self._rtcp):
            if sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
                sock.close()
        self._pool.release(self.port)
