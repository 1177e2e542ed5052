"""The per-call RTP shell: one socket pair (RTP on an even port, RTCP on the next) from a configured range.

`PortPool` hands out even ports and takes them back; `RtpSocketPair.open` binds RTP and RTCP as two
non-blocking UDP sockets watched with `loop.add_reader` (no transport objects, no buffering between us and
the kernel), trying the pool's next pair when a port is taken by someone else. Opening is synchronous, so a
call's media address is known the moment its INVITE is accepted.

Inbound RTP is read by the media clock in its tick (`read_rtp`: `rtp.clock` polls the sockets of a
phase once and reads what is waiting), each datagram stamped with the time the kernel received it
(SO_TIMESTAMPNS), so that arrival times do not depend on when the datagram was read (on an IPv4 socket by the
compiled `recv_stamped` where it is built: rtp.speedups). RTCP (a report every few
seconds) is read one datagram per loop wake-up. Either goes to its callback with the time; outbound datagrams
leave with `send_rtp`/`send_rtcp`, which return True only once `sendto` has returned: the moment the carrier
ledger records a frame as transmitted (DESIGN §3.2). A datagram the kernel refuses (buffer full, ICMP error) is
counted, not retried: the next frame is 20 ms away. No parsing here: the per-call stream core does that.

The media clock's calls send their RTP together (`SendBatch`): each call's tick hands its slot's datagram, its
socket and destination to the batch (`add`: four list appends, no system call), and once every call of the
phase was served, `flush` sends them all in one call (rtp.speedups `send_batch`: one loop of sendto(2) in C on
the compiled path, the same loop of `socket.sendto` on the pure one), reads the clock once, and only then settles
each call: a datagram that left is recorded in the carrier ledger at that time, one the kernel refused is
counted (`send_errors`, the call's `frames_unsent`) and never recorded (DESIGN §3.2, §11, HR4). Each call has
its own socket, so `sendmmsg` (one socket, many datagrams) would not merge anything: what the batch saves is
the Python work around each send (a frame, the address's parsing, the clock read). The ledger's time of a
batched frame is the end of the phase's sends: later than its own sendto returned by the sends queued after
it (300 calls over the engine's 10 phases: 30 a phase, a few µs each), never earlier than the datagram left.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rtp import probe as _probe
from rtp import speedups
from rtp.speedups import recv_stamped

if TYPE_CHECKING:
    from rtp.media import CallMedia

log = logging.getLogger("parlora.rtp")

Address = tuple[str, int]
Clock = Callable[[], int]
DatagramSink = Callable[[bytes, Address, int], None]

MAX_DATAGRAM = 2048  # RTP/RTCP on a telephone call is far below the 1500-byte MTU
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux: each datagram's receive time, CLOCK_REALTIME
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)


class BatchedCall(Protocol):
    """What `SendBatch` settles once its datagram was sent or refused: a call's media shell (sip.native.leg)."""

    core: CallMedia  # whose `out` (the frame the datagram carries) goes into the ledger when it left

    @property
    def call_id(self) -> str: ...  # (the latency probe's key, read only while PARLORA_PROBE is set)

    def unsent(self) -> None:
        """The datagram was refused: counted on the socket pair and the core, never in the ledger."""
        ...


# a result not yet written: its entry was never tried (an exception stopped the sends); a view, so that
# resetting a tick's results copies into the batch's buffer without making a new bytes object each tick
_UNTRIED = memoryview(b"\x02" * 65536)


class SendBatch:
    """One media-clock phase tick's RTP datagrams, sent in one call (the module's docstring)."""

    __slots__ = ("_clock", "_results", "_send", "addresses", "datagrams", "flushes", "owners", "socks")

    def __init__(
        self, clock: Clock, send: Callable[[list[Any], list[Any], list[Any], bytearray], int] | None = None
    ):
        self._clock = clock
        self._send = send if send is not None else speedups.send_batch  # (a test gives one path's)
        self.socks: list[socket.socket] = []
        self.datagrams: list[bytes | bytearray | memoryview] = []
        self.addresses: list[Address] = []
        self.owners: list[BatchedCall] = []
        self._results = bytearray(64)
        self.flushes = 0

    def add(
        self, sock: socket.socket, datagram: bytes | bytearray | memoryview, to: Address, owner: BatchedCall
    ) -> None:
        """Queue `datagram` (a view of the call's stream buffer is fine: it is sent before that call's next
        slot) for `flush`."""
        self.socks.append(sock)
        self.datagrams.append(datagram)
        self.addresses.append(to)
        self.owners.append(owner)

    def _settle(self, results: bytearray) -> None:
        now = self._clock()  # every datagram of the batch had left by now
        probe = _probe.ENABLED
        for i, owner in enumerate(self.owners):
            if results[i]:
                owner.unsent()
                continue
            core = owner.core
            out = core.out
            if out is not None:
                core.sent(now)
                if probe:
                    _probe.media_out(owner.call_id, now, out.pcm)

    def flush(self) -> int:
        """Send every queued datagram, in the order queued, then settle each call; returns how many were
        refused. An exception of the sends (not an OSError: those are refusals) is raised after the calls are
        settled, the entries it left untried counted as refused."""
        owners = self.owners
        n = len(owners)
        if n > len(self._results):
            self._results = bytearray(n)
        results = self._results
        results[:n] = _UNTRIED[:n]
        try:
            refused = self._send(self.socks, self.datagrams, self.addresses, results)
        finally:
            try:
                self._settle(results)
            finally:  # (emptied whatever happens: a datagram view is only valid until its call's next slot)
                self.socks.clear()
                self.datagrams.clear()
                self.addresses.clear()
                owners.clear()
                self.flushes += 1
        return refused


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
        self.on_rtp = (
            on_rtp  # where `read_rtp` hands RTP (the engine points it at the call's stream once it has one)
        )
        self._on_rtcp = on_rtcp
        self._clock = clock
        self.host = str(rtp.getsockname()[0])
        self.send_errors = 0
        self.receive_errors = 0
        self.closed = False
        try:
            rtp.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:  # no receive times: a datagram is stamped when it is read
            pass
        self.rtp_fileno = rtp.fileno()  # read by the media clock (`read_rtp`), not by a loop reader
        # what the media clock's SendBatch sends RTP from: IPv4 sockets; an IPv6 call sends with send_rtp
        self.batch_socket = rtp if rtp.family == socket.AF_INET else None
        # the compiled read (rtp.speedups `recv_stamped`, IPv4 sockets), or None: the pure one below
        self._recv = recv_stamped if rtp.family == socket.AF_INET else None
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
        except OSError:  # a closed socket (Linux tells an unconnected UDP socket of no ICMP error)
            self.receive_errors += 1
            return False
        try:  # IPv4 gives (host, port) as it is; IPv6 (host, port, flowinfo, scope_id) is cut to two
            sink(data, addr if len(addr) == 2 else (addr[0], addr[1]), self._clock())
        except Exception:  # a core bug must not stop the socket
            self.receive_errors += 1
            log.exception("RTP receiver failed")
        return True

    def read_rtp(self, now: int, wall: int) -> bool:
        """One RTP datagram waiting now to `on_rtp`; False when none was (or the read failed). Its time is `now`
        less how long ago the kernel received it (`wall`: the wall clock's ns at `now`, the clock of the
        receive time), so a datagram read in a later tick keeps its arrival time."""
        recv = self._recv
        if recv is not None:  # the compiled path: the same, no exception for an empty socket
            try:
                got = recv(self._rtp, MAX_DATAGRAM)
            except OSError:
                self.receive_errors += 1
                return False
            if got is None:
                return False
            data, source, received = got
            arrival = now
            if received >= 0:
                age = wall - received
                if age > 0:
                    arrival = now - age
            try:
                self.on_rtp(data, source, arrival)
            except Exception:  # a core bug must not stop the socket
                self.receive_errors += 1
                log.exception("RTP receiver failed")
            return True
        try:
            data, ancillary, _, addr = self._rtp.recvmsg(MAX_DATAGRAM, _ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:  # a closed socket (Linux tells an unconnected UDP socket of no ICMP error)
            self.receive_errors += 1
            return False
        arrival = now
        if ancillary:
            level, kind, stamp = ancillary[0]
            if kind == SO_TIMESTAMPNS and level == socket.SOL_SOCKET and len(stamp) >= _TIMESPEC.size:
                seconds, ns = _TIMESPEC.unpack_from(stamp)
                age = wall - (seconds * 1_000_000_000 + ns)
                if age > 0:
                    arrival = now - age
        try:  # IPv4 gives (host, port) as it is; IPv6 (host, port, flowinfo, scope_id) is cut to two
            self.on_rtp(data, addr if len(addr) == 2 else (addr[0], addr[1]), arrival)
        except Exception:  # a core bug must not stop the socket
            self.receive_errors += 1
            log.exception("RTP receiver failed")
        return True

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
        if self._rtcp.fileno() >= 0:
            self._loop.remove_reader(self._rtcp.fileno())
        for sock in (self._rtp, self._rtcp):
            sock.close()
        self._pool.release(self.port)
