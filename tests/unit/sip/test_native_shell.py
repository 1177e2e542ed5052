"""The native engine's thin shells on loopback: SIP transports (UDP, TCP, IPv4/IPv6), the one core timer,
RTP socket pairs from the port pool, and the process-wide media clock (on virtual time where it decides).

No sleep is an assertion: every wait is for an event, bounded by a timeout."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest

from rtp.clock import FRAME_NS, MediaClockShell
from rtp.dtmf import DtmfDigit
from rtp.endpoint import PortPool, PortsExhausted, RtpSocketPair
from sip.core.framing import StreamFramer
from sip.core.message import ParseError, Request, serialize
from sip.native.transport import DeadlineTimer, Inbound, SipTransports, TransportRef
from tests.support.native_shell import VirtualClock, _call_media, _FakeLeg, _FakeSockets, can_bind

WAIT_S = 5.0


def message(body: bytes = b"", call_id: str = "abc") -> bytes:
    return (
        "OPTIONS sip:bridge@127.0.0.1 SIP/2.0\r\n"
        "Via: SIP/2.0/TCP 127.0.0.1:5999;branch=z9hG4bK-1\r\n"
        "From: <sip:t@127.0.0.1>;tag=1\r\nTo: <sip:bridge@127.0.0.1>\r\n"
        f"Call-ID: {call_id}\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Inbox:
    def __init__(self) -> None:
        self.items: list[tuple[Inbound, tuple[str, int], TransportRef, int]] = []
        self.changed = asyncio.Event()

    def __call__(self, data: Inbound, source: tuple[str, int], ref: TransportRef, now: int) -> None:
        self.items.append((data, source, ref, now))
        self.changed.set()

    async def wait(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.items) < count:
                self.changed.clear()
                await self.changed.wait()


def ipv6_available() -> bool:
    return can_bind("::1")


# --- SIP transports ---


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        pytest.param("::1", marks=pytest.mark.skipif(not ipv6_available(), reason="no IPv6 loopback")),
    ],
)
async def test_udp_datagram_in_with_source_and_now_and_reply_out(host: str) -> None:
    loop = asyncio.get_running_loop()
    inbox = Inbox()
    transports = SipTransports(loop, inbox, StreamFramer, time.monotonic_ns)
    ref = await transports.listen_udp(host, 0)
    assert ref.kind == "udp" and ref.local[1] > 0
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    peer = socket.socket(family, socket.SOCK_DGRAM)
    peer.bind((host, 0))
    peer.setblocking(False)
    try:
        before = time.monotonic_ns()
        peer.sendto(message(b"x"), ref.local)
        await inbox.wait(1)
        data, source, got_ref, now = inbox.items[0]
        assert data == message(b"x") and source == peer.getsockname()[:2] and got_ref == ref
        assert now >= before
        assert transports.send(b"reply", source, "UDP")
        reply = await asyncio.wait_for(loop.sock_recv(peer, 100), WAIT_S)
        assert reply == b"reply"
    finally:
        peer.close()
        await transports.close()
    assert transports.stats()["udp_sockets"] == 0


async def test_tcp_stream_is_framed_and_the_reply_goes_back_on_the_same_connection() -> None:
    loop = asyncio.get_running_loop()
    inbox = Inbox()
    transports = SipTransports(loop, inbox, StreamFramer, time.monotonic_ns)
    ref = await transports.listen_tcp("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*ref.local)
    try:
        one, two = message(b"first", "c1"), message(b"second body", "c2")
        writer.write(one + two[:10])  # one and a half messages in one segment
        await writer.drain()
        await inbox.wait(1)
        writer.write(two[10:])
        await writer.drain()
        await inbox.wait(2)
        got_messages = [item[0] for item in inbox.items]
        assert all(isinstance(m, Request) for m in got_messages)
        assert [serialize(m) for m in got_messages if isinstance(m, Request)] == [one, two]
        (_, source, conn_ref, _), (_, _, conn_ref2, _) = inbox.items
        assert conn_ref.kind == "tcp" and conn_ref.connection > 0 and conn_ref == conn_ref2
        assert source == writer.get_extra_info("sockname")[:2]
        assert transports.stats()["tcp_connections"] == 1
        assert transports.send(b"by ref\r\n", source, conn_ref)  # the ref it came in on
        assert transports.send(
            b"by name\r\n", source, "TCP"
        )  # the core's Transmit: same peer, same connection
        got = await asyncio.wait_for(reader.readexactly(len(b"by ref\r\nby name\r\n")), WAIT_S)
        assert got == b"by ref\r\nby name\r\n"
        assert transports.stats()["tcp_connections"] == 1
    finally:
        writer.close()
        await transports.close()
    assert transports.stats()["tcp_connections"] == 0 and transports.stats()["tcp_servers"] == 0


async def test_tcp_framing_error_is_delivered_then_only_that_connection_closes() -> None:
    loop = asyncio.get_running_loop()
    inbox = Inbox()
    transports = SipTransports(loop, inbox, StreamFramer, time.monotonic_ns)
    ref = await transports.listen_tcp("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*ref.local)
    try:
        writer.write(b"\r\n\r\n")  # an RFC 5626 keep-alive ping: answered with one CRLF
        assert await asyncio.wait_for(reader.readexactly(2), WAIT_S) == b"\r\n"
        writer.write(message().replace(b"Content-Length: 0", b"Content-Length: x"))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""  # closed by us
        assert len(inbox.items) == 1 and isinstance(inbox.items[0][0], ParseError)  # the core could answer it
        assert transports.stats()["framing_errors"] == 1
        reader2, writer2 = await asyncio.open_connection(*ref.local)  # the listener is still there
        writer2.write(message())
        await inbox.wait(2)
        writer2.close()
    finally:
        writer.close()
        await transports.close()


async def test_tcp_request_to_a_new_peer_opens_a_client_connection() -> None:
    loop = asyncio.get_running_loop()
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.put_nowait(await reader.readexactly(5))
        writer.write(message(b"ok"))
        await writer.drain()
        await reader.read()
        writer.close()

    peer = await asyncio.start_server(serve, "127.0.0.1", 0)
    peer_addr = peer.sockets[0].getsockname()[:2]
    inbox = Inbox()
    transports = SipTransports(loop, inbox, StreamFramer, time.monotonic_ns)
    await transports.listen_tcp("127.0.0.1", 0)
    try:
        assert transports.send(b"hello", peer_addr, "TCP")  # queued until the connection is up
        assert await asyncio.wait_for(received.get(), WAIT_S) == b"hello"
        await inbox.wait(1)  # what the peer answers on that connection reaches the core
        answer = inbox.items[0][0]
        assert isinstance(answer, Request) and serialize(answer) == message(b"ok")
        assert inbox.items[0][1] == peer_addr
    finally:
        await transports.close()
        peer.close()
        await peer.wait_closed()
    assert transports.stats()["tcp_connections"] == 0


async def test_receiver_bug_is_counted_and_the_socket_keeps_working() -> None:
    loop = asyncio.get_running_loop()
    inbox = Inbox()
    calls = 0

    def flaky(data: Inbound, source: tuple[str, int], ref: TransportRef, now: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("core bug")
        inbox(data, source, ref, now)

    transports = SipTransports(loop, flaky, StreamFramer, time.monotonic_ns)
    ref = await transports.listen_udp("127.0.0.1", 0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        peer.sendto(b"one", ref.local)
        peer.sendto(b"two", ref.local)
        await inbox.wait(1)
    assert [i[0] for i in inbox.items] == [b"two"] and transports.stats()["receiver_errors"] == 1
    await transports.close()


# --- the one core timer ---


async def test_deadline_timer_rearms_only_when_the_deadline_changes_and_never_fires_early() -> None:
    loop = asyncio.get_running_loop()
    fired: list[int] = []
    done = asyncio.Event()

    def on_due(now: int) -> None:
        fired.append(now)
        done.set()

    timer = DeadlineTimer(loop, time.monotonic_ns, on_due)
    far = time.monotonic_ns() + 60 * 10**9
    timer.arm(far)
    handle = timer._handle
    timer.arm(far)  # same deadline: the same handle, nothing re-armed
    assert timer._handle is handle and timer.armed
    soon = time.monotonic_ns() + 5_000_000
    timer.arm(soon)  # earlier: re-armed
    assert timer._handle is not handle and timer.deadline == soon
    await asyncio.wait_for(done.wait(), WAIT_S)
    assert fired == [max(fired[0], soon)] and fired[0] >= soon and not timer.armed
    timer.arm(time.monotonic_ns() + 10**9)
    timer.arm(None)
    assert not timer.armed and timer.fired == 1


# --- RTP sockets ---


def test_port_pool_hands_out_even_ports_round_robin_and_runs_out() -> None:
    pool = PortPool(40001, 40007)
    assert pool.first == 40002 and pool.capacity == 3
    assert pool.candidates() == [40002, 40004, 40006]
    pool.take(40002)
    assert pool.candidates() == [40004, 40006]
    pool.release(40002)
    assert pool.candidates() == [40004, 40006, 40002]  # the port just freed is reused last
    with pytest.raises(ValueError):
        PortPool(5000, 5000)


async def test_rtp_socket_pairs_bind_rtp_even_rtcp_odd_and_close_back_to_zero() -> None:
    loop = asyncio.get_running_loop()
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    base = probe.getsockname()[1] & ~1
    probe.close()
    pool = PortPool(base, base + 20)
    blocker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    blocker.bind(("127.0.0.1", base + 1))  # someone else holds the first pair's RTCP port
    got: asyncio.Queue[tuple[str, bytes, tuple[str, int], int]] = asyncio.Queue()
    pairs = []
    try:
        for name in ("a", "b"):
            pairs.append(
                RtpSocketPair.open(
                    loop,
                    "127.0.0.1",
                    pool,
                    _sink(got, name + "-rtp"),
                    _sink(got, name + "-rtcp"),
                    time.monotonic_ns,
                )
            )
        a, b = pairs
        assert a.port == base + 2 and b.port == base + 4 and pool.in_use == 2
        assert a.send_rtp(b"\x80" * 20, ("127.0.0.1", b.port))
        assert b.send_rtcp(b"\x81\xc9", ("127.0.0.1", a.port + 1))
        rtcp = await asyncio.wait_for(got.get(), WAIT_S)  # RTCP: the loop reads it
        assert rtcp[0] == "a-rtcp" and rtcp[2][1] == b.port + 1
        assert got.empty() and b.read_rtp(1, time.time_ns())  # RTP: the media clock reads it (read_rtp)
        rtp = got.get_nowait()
        assert rtp[0] == "b-rtp" and rtp[2][1] == a.port
        a.close()
        a.close()  # idempotent
        assert a.open_sockets == 0 and pool.in_use == 1
        assert not a.send_rtp(b"\x80" * 20, ("127.0.0.1", b.port))  # closed: refused and counted
    finally:
        for pair in pairs:
            pair.close()
        blocker.close()
    assert pool.in_use == 0


def test_read_rtp_reads_one_waiting_datagram_at_the_time_the_kernel_received_it() -> None:
    """The media clock reads RTP in its tick, one datagram a call, oldest first; each is stamped with
    its kernel receive time on the caller's clock (`now` less its age on the wall clock), so a datagram read a
    tick late keeps its arrival time. Nothing waiting: False at once (no exception escapes); RTCP is not read."""
    loop = asyncio.new_event_loop()
    got: asyncio.Queue[tuple[str, bytes, tuple[str, int], int]] = asyncio.Queue()
    pair = RtpSocketPair.open(
        loop,
        "127.0.0.1",
        PortPool(*_free_pair_range()),
        _sink(got, "rtp"),
        _sink(got, "rtcp"),
        time.monotonic_ns,
    )
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for k in range(5):
            sender.sendto(bytes([0x80, k]) * 10, ("127.0.0.1", pair.port))
        sender.sendto(b"\x81\xc9", ("127.0.0.1", pair.port + 1))  # RTCP is not the tick's business
        now, later = 10**12, time.time_ns() + 5 * 10**9  # read as if 5 s after they came
        read = [pair.read_rtp(now, later) for _ in range(6)]
        assert read == [True] * 5 + [False]
        items = [got.get_nowait() for _ in range(got.qsize())]
        assert [(name, data[1]) for name, data, _, _ in items] == [("rtp", k) for k in range(5)]
        ages = [now - arrival for _, _, _, arrival in items]
        assert all(4.9e9 < age < 5.1e9 for age in ages)  # stamped when the kernel received them
        assert pair.read_rtp(now, later) is False
    finally:
        sender.close()
        pair.close()
        loop.close()


def _free_pair_range() -> tuple[int, int]:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    base = probe.getsockname()[1] & ~1
    probe.close()
    return base, base + 20


def _sink(
    got: asyncio.Queue[tuple[str, bytes, tuple[str, int], int]], name: str
) -> Callable[[bytes, tuple[str, int], int], None]:
    def sink(data: bytes, source: tuple[str, int], now: int) -> None:
        got.put_nowait((name, data, source, now))

    return sink


def test_port_pool_exhausted_raises() -> None:
    loop = asyncio.new_event_loop()
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1] & ~1
        probe.close()
        pool = PortPool(base, base + 2)
        pair = RtpSocketPair.open(
            loop, "127.0.0.1", pool, lambda *a: None, lambda *a: None, time.monotonic_ns
        )
        with pytest.raises(PortsExhausted):
            RtpSocketPair.open(loop, "127.0.0.1", pool, lambda *a: None, lambda *a: None, time.monotonic_ns)
        pair.close()
    finally:
        loop.close()


# --- the media clock ---


class Channel:
    def __init__(self) -> None:
        self.slots: list[int] = []  # `now` of each served slot
        self.skipped = 0

    def on_slots(self, now: int, due: int, skipped: int) -> None:
        self.skipped += skipped
        self.slots.extend([now] * due)


async def test_media_clock_serves_every_channel_once_per_period_on_absolute_deadlines() -> None:
    loop = asyncio.get_running_loop()
    clock = VirtualClock()
    media = MediaClockShell(loop, clock)
    a, b = Channel(), Channel()
    media.add(a)
    media.add(b)
    t0 = clock.now
    try:
        assert media.next_deadline() == t0 + FRAME_NS and media.stats()["timers"] == 1
        clock.now = t0 + FRAME_NS - 1
        assert media.run_due(clock.now) == 0  # early: nothing
        clock.now = t0 + FRAME_NS + 3_000_000  # 3 ms late: one slot; the next deadline does not drift
        assert media.run_due(clock.now) == 1
        assert media.next_deadline() == t0 + 2 * FRAME_NS
        clock.now = t0 + 3 * FRAME_NS + 1  # a stall: slots 2 and 3 both served (catch-up)
        assert media.run_due(clock.now) == 2
        assert len(a.slots) == len(b.slots) == 3 and a.skipped == 0
        clock.now = t0 + 100 * FRAME_NS  # a long stall: at most max_catch_up slots, the rest skipped
        assert media.run_due(clock.now) == media.max_catch_up
        assert a.skipped == b.skipped == 97 - media.max_catch_up
        assert media.next_deadline() == t0 + 101 * FRAME_NS
    finally:
        media.stop()
    assert media.stats()["timers"] == 0


async def test_media_clock_counts_its_ticks_by_lateness_for_the_pacing_histogram() -> None:
    loop = asyncio.get_running_loop()
    clock = VirtualClock()
    media = MediaClockShell(loop, clock)
    media.add(Channel())
    t0 = clock.now
    try:
        for n, late_us in enumerate((100, 300, 300, 3_000, 50_000), start=1):
            clock.now = t0 + n * FRAME_NS + late_us * 1_000
            assert media.run_due(clock.now) == (1 if late_us < 20_000 else 2)  # 50 ms late: one caught up
        stats = media.stats()
    finally:
        media.stop()
    buckets = {k: v for k, v in stats.items() if k.startswith("lateness_bucket_") and v}
    assert buckets == {
        "lateness_bucket_200": 1,
        "lateness_bucket_500": 2,
        "lateness_bucket_5000": 1,
        "lateness_bucket_inf": 1,
    }


async def test_media_clock_drops_a_failing_channel_and_stops_with_the_last() -> None:
    loop = asyncio.get_running_loop()
    clock = VirtualClock()
    media = MediaClockShell(loop, clock)

    class Broken:
        def on_slots(self, now: int, due: int, skipped: int) -> None:
            raise RuntimeError("boom")

    good = Channel()
    media.add(Broken())
    media.add(good)
    clock.now += FRAME_NS
    media.run_due(clock.now)
    assert media.channel_errors == 1 and media.channels == 1 and len(good.slots) == 1
    media.remove(good)
    assert not media.running and media.next_deadline() is None and media.stats()["timers"] == 0


async def test_media_clock_on_the_real_loop_is_one_timer_for_all_channels() -> None:
    loop = asyncio.get_running_loop()
    media = MediaClockShell(loop, time.monotonic_ns)
    done = asyncio.Event()

    class Counting(Channel):
        def on_slots(self, now: int, due: int, skipped: int) -> None:
            super().on_slots(now, due, skipped)
            if len(self.slots) >= 5:
                done.set()

    channels = [Counting() for _ in range(3)]
    for ch in channels:
        media.add(ch)
    assert media.core is not None
    t0 = media.core.t0
    try:
        await asyncio.wait_for(done.wait(), WAIT_S)
    finally:
        wakeups = media.wakeups
        media.stop()
    first = channels[0]
    # never early: the n-th slot is served at or after t0 + n·20 ms
    assert all(now >= t0 + (i + 1) * FRAME_NS for i, now in enumerate(first.slots))
    assert all(ch.slots == first.slots for ch in channels)  # one wake-up serves every channel
    assert wakeups <= len(first.slots) + 5  # early wake-ups aside, one timer per period, not one per channel


# --- the carrier ledger records a frame only once sendto has returned ---


def test_the_ledger_records_a_frame_when_sendto_has_returned_and_never_a_failed_send() -> None:
    from rtp.playout import OutboundFrame

    clock = VirtualClock()
    media, leg = _call_media(clock)
    ledger = leg.playout.ledger
    leg.playout.enqueue(
        [OutboundFrame(b"\x00" * 320, 1, "item", 0), OutboundFrame(b"\x00" * 320, 1, "item", 20)]
    )
    slot = clock.now
    media.on_slots(slot, 1, 0)
    ((sent_at, _),) = leg.sockets.sent
    assert sent_at == slot + 40_000  # after the send, not at the slot
    assert ledger.frames_transmitted == 1 and ledger.entries("item")[0].transmitted_ns == sent_at
    assert ledger.transmitted_ms("item") == 20 and media.frames_out == 1
    leg.sockets.fail = True  # sendto fails (buffer full, unreachable): the frame did not leave
    clock.now += FRAME_NS
    media.on_slots(clock.now, 1, 0)
    assert ledger.frames_transmitted == 1 and ledger.transmitted_ms("item") == 20
    assert media.frames_unsent == 1 and media.frames_out == 1 and leg.playout.depth == 0


def test_the_frames_of_slots_a_late_clock_skipped_still_reach_the_session() -> None:
    """A 200 ms stall (the clock serves 2 slots late and skips 8) while the caller's packets keep
    coming: every packet's frame is handed to the session, the skipped slots' one extra a slot afterwards,
    and none is dropped by the jitter buffer's ceiling or shrink."""
    from rtp.packet import build
    from sip.leg import FrameReceived

    clock = VirtualClock()
    media, leg = _call_media(clock)
    source, t0 = ("127.0.0.1", 40000), clock.now

    def packet(k: int, at: int) -> None:
        media.on_rtp(build(0, False, k, 160 * k, 0xA, bytes([0x55]) * 160), source, at)

    for k in range(400):
        slot = t0 + k * FRAME_NS
        if 100 <= k < 109:  # stalled: nothing runs
            continue
        if k == 109:
            media.on_slots(slot + 1_000_000, 2, 8)  # the late wake-up, before the stalled packets are read
            for j in range(100, 110):
                packet(j, slot + 2_000_000)
            continue
        packet(k, slot + 3_000_000)
        media.on_slots(slot + 3_000_000, 1, 0)
    jb = media.stream.jitter
    frames = sum(isinstance(e, FrameReceived) for e in leg.posted)
    assert jb.frames_backlog == 8 and jb.frames_dropped_shrink + jb.overflows <= jb.frames_concealed
    assert frames == media.frames_in == 390 + 2 + 8  # a frame per slot served (2 at the wake-up), the 8 owed
    assert jb.frames_played >= 400 - jb.frames_concealed


async def test_a_late_tick_reads_the_packets_of_the_stall_before_it_serves_its_slots_so_none_is_concealed() -> (
    None
):
    """The caller's packets keep coming while the clock stalls 200 ms. The late tick reads them out of
    the socket before it serves its 2 slots, so those slots play the caller's audio, and the 8 skipped slots'
    frames follow one extra a tick: every frame is the caller's own, none concealed, none dropped. The
    media clock reads every call's RTP in its tick (one poll of the phase, then a datagram a call), so an
    on-time tick reads its packet the same way; through a real socket pair and the real clock here."""
    from rtp.jitter import fast_ulaw_decode
    from rtp.packet import build
    from sip.leg import FrameReceived

    loop = asyncio.get_running_loop()
    clock = VirtualClock()
    media, leg = _call_media(clock)
    pair = RtpSocketPair.open(
        loop, "127.0.0.1", PortPool(*_free_pair_range()), lambda *a: None, lambda *a: None, clock
    )
    leg.sockets.rtp_fileno = pair.rtp_fileno  # the fake's sends, the real socket's reads
    leg.sockets.read_rtp = pair.read_rtp  # type: ignore[method-assign]
    pair.on_rtp = media.on_rtp  # (what _CallMedia points its own pair at)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.connect(("127.0.0.1", pair.port))
    media.stream.signal(sender.getsockname())  # the caller sends from there
    clocked = MediaClockShell(loop, clock, watch_gc=False)

    def payload(k: int) -> bytes:
        return bytes([k % 200 + 20]) * 160  # a level per packet: each frame says which packet it came from

    try:
        clocked.add(media)
        t0 = clocked.next_deadline()
        assert t0 is not None
        for k in range(200):
            sender.send(build(0, False, k, 160 * k, 0xA, payload(k)))
            if 100 <= k < 109:  # stalled: nothing runs; the packets wait in the socket
                continue
            clock.now = t0 + k * FRAME_NS + 3_000_000
            clocked.run_due(clock.now)  # at k = 109: the late wake-up, 2 slots served, 8 skipped
    finally:
        clocked.stop()
        sender.close()
        pair.close()
    jb = media.stream.jitter
    frames = [e.pcm for e in leg.posted if isinstance(e, FrameReceived)]
    assert jb.frames_concealed == 0 and jb.frames_dropped_shrink == 0 and jb.overflows == 0
    assert jb.frames_backlog == 8 and len(frames) == media.frames_in == 190 + 2 + 8
    assert frames == [fast_ulaw_decode(payload(k)) for k in range(200)]  # each packet once, in order
    assert jb.frames_played == 200 and clocked.rtp_reads == 200


def test_a_second_digit_ended_by_the_same_packet_is_handed_over_with_the_first() -> None:
    import struct

    from rtp.packet import build
    from sip.leg import DtmfReceived

    clock = VirtualClock()
    media, leg = _call_media(clock)
    media.on_timer = leg._stream_timer  # the timer is noted here, its items left in the stream
    source = ("127.0.0.1", 40000)
    media.on_rtp(build(101, True, 1, 8000, 0xA, struct.pack("!BBH", 4, 10, 400)), source, clock.now)
    at = clock.now + 5_000_000  # a new event's end packet: it ends the '4' (its end was lost) and itself
    media.on_rtp(build(101, True, 2, 9600, 0xA, struct.pack("!BBH", 6, 0x80 | 10, 800)), source, at)
    assert leg.posted == [DtmfReceived("4")]
    assert leg.timers == [at]  # the stream's timer run at once, not at the next slot: it hands over the '6'
    assert media.stream.next_deadline() == at
    first = media.stream.handle_timer(at)[0]
    assert isinstance(first, DtmfDigit) and first.digit == "6"


def test_media_address_is_the_bound_one_or_the_route_to_the_caller_never_the_wildcard() -> None:
    from sip.native.leg import media_address

    assert media_address("127.0.0.1", "127.0.0.1") == "127.0.0.1"
    assert media_address("0.0.0.0", "127.0.0.1") == "127.0.0.1"  # c=0.0.0.0 would put the caller on hold
    if ipv6_available():
        assert media_address("::", "::1") == "::1"


async def test_media_clock_phases_spread_the_channels_each_served_once_per_period_on_its_grid() -> None:
    """Inbound latency: with G phases no more than ceil(N/G) channels are served at one instant;
    each channel is served once per period on absolute deadlines t0 + k·period/G + n·period; one timer."""
    loop = asyncio.get_running_loop()
    clock = VirtualClock()
    phases = 4
    media = MediaClockShell(loop, clock, phases=phases)
    t0 = clock.now
    channels = [Channel() for _ in range(10)]
    try:
        for ch in channels:
            media.add(ch)
        assert media.phase_sizes() == [3, 3, 2, 2] and media.stats()["timers"] == 1
        assert media.next_deadline() == t0 + FRAME_NS // phases  # phase 1 first; phase 0 at t0 + 20 ms
        batch_sizes = []
        for step in range(1, 3 * FRAME_NS // 1_000_000 + 1):  # 60 ms of virtual time in 1 ms steps
            clock.now = t0 + step * 1_000_000
            before = sum(len(ch.slots) for ch in channels)
            media.run_due(clock.now)
            served = sum(len(ch.slots) for ch in channels) - before
            if served:
                batch_sizes.append(served)
            assert media.stats()["timers"] == 1
        assert max(batch_sizes) == 3  # ceil(10 / 4), never all ten at once
        for ch in channels:
            phase = media.phase_of(ch)
            assert phase is not None
            offset = phase * FRAME_NS // phases
            first = t0 + offset if offset else t0 + FRAME_NS
            assert ch.slots == list(range(first, t0 + 3 * FRAME_NS + 1, FRAME_NS))  # exactly on its grid
    finally:
        media.stop()
    assert media.stats()["timers"] == 0 and not media.running


async def test_media_clock_a_new_channel_fills_the_emptiest_phase_an_empty_one_costs_nothing() -> None:
    loop = asyncio.get_running_loop()
    clock = VirtualClock()
    media = MediaClockShell(loop, clock, phases=2)
    a, b, c = Channel(), Channel(), Channel()
    media.add(a)
    media.add(b)
    assert media.phase_of(a) == 0 and media.phase_of(b) == 1
    media.remove(a)
    assert media.stats()["phases_active"] == 1 and media.next_deadline() == clock.now + FRAME_NS // 2
    clock.now += 7_000_000  # later, inside the period: c joins phase 0 on the clock's original grid
    media.add(c)
    t0 = clock.now - 7_000_000
    assert media.phase_of(c) == 0 and media.next_deadline() == t0 + FRAME_NS // 2
    for at in (t0 + FRAME_NS // 2, t0 + FRAME_NS, t0 + 3 * FRAME_NS // 2):
        clock.now = at
        media.run_due(at)
    assert b.slots == [t0 + FRAME_NS // 2, t0 + 3 * FRAME_NS // 2] and c.slots == [t0 + FRAME_NS]
    assert media.stats()["timers"] == 1
    media.stop()


def test_media_clock_on_uvloop_wakes_once_per_slot_instead_of_spinning_to_the_deadline() -> None:
    """uvloop's timers count whole milliseconds: a timer armed for the deadline itself fired early and every
    re-arm for the rest fired at once again (22 wake-ups per slot measured). With the slack: one per slot."""
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        media = MediaClockShell(loop, time.monotonic_ns, phases=4)
        channels = [Channel() for _ in range(4)]
        done = loop.create_future()

        class Last(Channel):
            def on_slots(self, now: int, due: int, skipped: int) -> None:
                super().on_slots(now, due, skipped)
                if len(self.slots) >= 10 and not done.done():
                    done.set_result(None)

        last = Last()
        for ch in [*channels, last]:
            media.add(ch)
        loop.run_until_complete(asyncio.wait_for(done, WAIT_S))
        stats = media.stats()
        media.stop()
    finally:
        loop.close()
    assert stats["slots_served"] >= 40
    assert stats["wakeups"] <= stats["slots_served"] + 8  # about one wake-up per phase slot, never a spin


def test_a_caller_frame_is_handed_on_in_the_slot_it_becomes_playable_before_that_slots_send() -> None:
    """Inbound latency: the frame leaves the jitter buffer and reaches the leg's sink within the one
    `on_slots` call of its slot, ahead of the slot's outbound work; nothing holds it for a later tick."""
    from rtp.jitter import fast_ulaw_decode
    from rtp.packet import build
    from sip.leg import FrameReceived

    clock = VirtualClock()
    media, leg = _call_media(clock)
    order: list[str] = []

    class Sockets(_FakeSockets):
        def send_rtp(self, data: bytes | bytearray | memoryview, destination: tuple[str, int]) -> bool:
            order.append("send")
            return super().send_rtp(data, destination)

    class Leg(_FakeLeg):
        def _post(self, event: object) -> None:
            order.append("post")
            super()._post(event)

    leg.__class__ = Leg
    leg.sockets.__class__ = Sockets
    payload = bytes(range(160))
    media.on_rtp(build(0, True, 1, 0, 0xA, payload), ("127.0.0.1", 40000), clock.now)
    assert leg.posted == []  # filed in the jitter buffer: playable at the next slot
    clock.now += FRAME_NS
    media.on_slots(clock.now, 1, 0)
    frames = [e for e in leg.posted if isinstance(e, FrameReceived)]
    assert len(frames) == 1 and order == ["post", "send"]
    assert frames[0].pcm == fast_ulaw_decode(payload)
