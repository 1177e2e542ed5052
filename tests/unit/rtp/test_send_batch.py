"""The media clock's send batch (rtp.endpoint `SendBatch`, rtp.speedups `send_batch`): every call of a phase
sends its tick's RTP in one call, and the carrier ledger records a frame only once its datagram left.

Both paths by property: the same random multi-call ticks (PCMU and PCMA, SRTP, muted, held, ended, a
destination the kernel refuses, one given by name, a socket closed under the call, DTMF, late ticks) run through
a `MediaClockShell` with the pure and with the compiled `send_batch`; every datagram the peers received, every
ledger record and every counter must be equal. And `send_batch` itself against garbage (sockets, buffers and
addresses of every wrong kind): the same results, the same exceptions, on both paths; nothing crashes."""

from __future__ import annotations

import asyncio
import os
import socket
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rtp import speedups
from rtp.clock import MediaClockShell
from rtp.endpoint import PortPool, RtpSocketPair, SendBatch
from rtp.ledger import CarrierLedger
from rtp.playout import OutboundFrame, Playout
from rtp.stream import PCMA, PCMU, RtpStream, StreamConfig
from sip.core.offer_answer import NegotiatedMedia
from sip.core.sdes import SrtpKeys
from sip.native.leg import _CallMedia
from tests.support.media_paths import IMPLS, use

EXAMPLES = int(os.environ.get("PARLORA_FUZZ_EXAMPLES", "200"))
prop = settings(
    max_examples=max(EXAMPLES // 4, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
HOST = "127.0.0.1"
FRAME_NS = 20_000_000
KEY = bytes(range(30))


def _free_range(pairs: int) -> tuple[int, int]:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind((HOST, 0))
    first = probe.getsockname()[1] + 2
    probe.close()
    return first, first + 4 * pairs + 200


def _drain(sock: socket.socket) -> list[bytes]:
    """Every datagram waiting on the non-blocking `sock`."""
    got = []
    while True:
        try:
            got.append(sock.recv(70000))
        except BlockingIOError:
            return got


class _Leg:
    """What `_CallMedia` uses of a NativeLeg, over a real socket pair."""

    def __init__(self, sockets: RtpSocketPair, clock: Any, call: str) -> None:
        self.call = call
        self.sockets = sockets
        self.playout = Playout(CarrierLedger())
        self.agent = SimpleNamespace(clock=clock, one_way_audio=Counter(), limit_hangups=Counter())
        self.identity = SimpleNamespace(call_id=call)
        self.posted: list[object] = []

    def _post(self, event: object) -> None:
        self.posted.append(event)

    def _limit_reached(self, action: str) -> None:
        pass


call_spec = st.fixed_dictionaries(
    {
        "codec": st.sampled_from([PCMU, PCMA]),
        "srtp": st.booleans(),
        "to": st.sampled_from(["peer", "peer", "peer", "refused", "name", "closed"]),
        "held": st.booleans(),  # we send nothing (recvonly): RTP time goes on
        "muted": st.booleans(),
        "ends": st.one_of(st.none(), st.integers(0, 8)),  # the tick it leaves the clock
        "frames": st.lists(st.integers(0, 2), min_size=10, max_size=10),  # frames queued before each tick
        "dtmf": st.one_of(st.none(), st.integers(0, 8)),
    }
)
tick_lateness = st.lists(st.sampled_from([0, 0, 0, 0, 1, 25, 45]), min_size=10, max_size=10)  # ms


def run_calls(impl: speedups.Impl, specs: list[dict[str, Any]], late: list[int]) -> list[Any]:
    """The calls of `specs` on one clock with `impl`'s send_batch: what the peer received tick by tick, each
    call's ledger and counters at the end."""
    loop = asyncio.new_event_loop()
    now = [10**12]
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind((HOST, 0))
    peer.setblocking(False)
    port = peer.getsockname()[1]
    clock = lambda: now[0]  # noqa: E731
    shell = MediaClockShell(loop, clock, phases=1, watch_gc=False)
    shell.sends = SendBatch(clock, impl.send_batch)
    first, last = _free_range(len(specs))
    pool = PortPool(first, last)
    calls: list[tuple[_Leg, _CallMedia, dict[str, Any]]] = []
    out: list[Any] = []
    try:
        with use(impl):
            for k, spec in enumerate(specs):
                pair = RtpSocketPair.open(loop, HOST, pool, lambda *a: None, lambda *a: None, clock)
                leg = _Leg(pair, clock, f"call-{k}")
                address = {"refused": "255.255.255.255", "name": "localhost"}.get(spec["to"], HOST)
                keys = SrtpKeys("AES_CM_128_HMAC_SHA1_80", 1, KEY, KEY) if spec["srtp"] else None
                direction = "recvonly" if spec["held"] else "sendrecv"
                codec = "PCMU" if spec["codec"] == PCMU else "PCMA"
                negotiated = NegotiatedMedia(
                    codec, spec["codec"], 101, address, port, direction, "sendrecv", srtp=keys
                )
                config = StreamConfig(
                    ssrc=k,
                    initial_seq=k,
                    initial_timestamp=0,
                    cname="t",
                    remote=(address, port),
                    payload_type=spec["codec"],
                )
                media = _CallMedia(leg, RtpStream(config, lambda: 0.5), negotiated)  # type: ignore[arg-type]
                media.set_limits(now[0], None, None)
                media.core.mute_input(spec["muted"])
                shell.add(media)
                calls.append((leg, media, spec))
            core = shell.core
            assert core is not None
            for tick in range(10):
                for leg, media, spec in calls:
                    leg.playout.enqueue(
                        OutboundFrame(bytes([tick, j]) * 160, 1, f"{leg.call}-{tick}", 20 * j)
                        for j in range(spec["frames"][tick])
                    )
                    if spec["dtmf"] == tick:
                        media.stream.send_dtmf("5")
                    if spec["ends"] == tick:
                        shell.remove(media)
                    if spec["to"] == "closed" and tick == 3:
                        leg.sockets._rtp.close()
                due = core.next_deadline() if shell.running else now[0] + FRAME_NS
                now[0] = due + late[tick] * 1_000_000
                shell.run_due(now[0])
                out.append(_drain(peer))
            for leg, media, _ in calls:
                out.append(
                    (
                        leg.playout.ledger.entries(),
                        media.frames_out,
                        media.frames_unsent,
                        leg.sockets.send_errors,
                        leg.playout.depth,
                    )
                )
    finally:
        shell.stop()
        for leg, _, _ in calls:
            leg.sockets.close()
        peer.close()
        loop.close()
    return out


@pytest.mark.skipif(speedups.compiled is None, reason="the compiled media path is not built")
@prop
@given(st.lists(call_spec, min_size=1, max_size=5), tick_lateness)
def test_random_multi_call_ticks_send_and_record_the_same_on_both_paths(
    specs: list[dict[str, Any]], late: list[int]
) -> None:
    pure = run_calls(IMPLS["pure"], specs, late)
    compiled = run_calls(IMPLS["compiled"], specs, late)
    assert pure == compiled
    for (entries, frames_out, unsent, errors, _), spec in zip(pure[10:], specs, strict=True):
        if spec["to"] == "refused":  # every send refused by the kernel (EACCES): none recorded as heard
            assert entries == [] and frames_out == 0
            assert errors >= unsent  # (a refused datagram of silence or DTMF carries no frame)
        assert len(entries) == frames_out


@dataclass
class _Plain:
    """Plain PCMU calls on one clock (`plain_calls`): the shell, its loop's clock, the peer, the calls."""

    shell: MediaClockShell
    now: list[int]
    peer: socket.socket
    calls: list[tuple[_Leg, _CallMedia]]

    def tick(self, tick: int) -> None:
        """One frame queued for each call, then the clock's next tick."""
        for leg, _ in self.calls:
            leg.playout.enqueue([OutboundFrame(bytes(320), 1, leg.call, 20 * tick)])
        core = self.shell.core
        assert core is not None
        self.now[0] = core.next_deadline()
        self.shell.run_due(self.now[0])


@contextmanager
def plain_calls(send: Any, hosts: list[str], batch_clock_offset: int = 0) -> Iterator[_Plain]:
    """A PCMU call to the peer's port at each of `hosts`, on a clock whose batch sends with `send` and reads
    its clock `batch_clock_offset` ns after the shell's."""
    loop = asyncio.new_event_loop()
    now = [10**12]
    clock = lambda: now[0]  # noqa: E731
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind((HOST, 0))
    peer.setblocking(False)
    shell = MediaClockShell(loop, clock, phases=1, watch_gc=False)
    shell.sends = SendBatch(lambda: now[0] + batch_clock_offset, send)
    pool = PortPool(*_free_range(len(hosts)))
    calls: list[tuple[_Leg, _CallMedia]] = []
    try:
        for k, address in enumerate(hosts):
            pair = RtpSocketPair.open(loop, HOST, pool, lambda *a: None, lambda *a: None, clock)
            leg = _Leg(pair, clock, f"call-{k}")
            to = (address, peer.getsockname()[1])
            negotiated = NegotiatedMedia("PCMU", PCMU, 101, *to, "sendrecv", "sendrecv")
            config = StreamConfig(ssrc=k, initial_seq=0, initial_timestamp=0, cname="t", remote=to)
            media = _CallMedia(leg, RtpStream(config, lambda: 0.5), negotiated)  # type: ignore[arg-type]
            shell.add(media)
            calls.append((leg, media))
        yield _Plain(shell, now, peer, calls)
    finally:
        shell.stop()
        for leg, _ in calls:
            leg.sockets.close()
        peer.close()
        loop.close()


@pytest.mark.parametrize("path", list(IMPLS))
def test_each_phase_tick_sends_every_calls_rtp_in_one_call_and_records_only_what_left(path: str) -> None:
    """Four calls on one clock, one of them to a destination the kernel refuses (broadcast without
    SO_BROADCAST: EACCES): each tick is one `send_batch` call carrying the four datagrams; the three that
    left are in their ledgers at the time the batch returned, the refused one is counted and never recorded."""
    impl = IMPLS[path]
    batches: list[int] = []

    def counting(socks: list[Any], datagrams: list[Any], addresses: list[Any], results: bytearray) -> int:
        batches.append(len(socks))
        return impl.send_batch(socks, datagrams, addresses, results)

    # the batch reads its clock 7 ns after the tick: once its sends returned
    with plain_calls(counting, [HOST, HOST, "255.255.255.255", HOST], 7) as run:
        for tick in range(3):
            run.tick(tick)
            assert batches[-1] == 4
            for k, (leg, media) in enumerate(run.calls):
                entries = leg.playout.ledger.entries()
                if k == 2:
                    assert entries == [] and media.frames_unsent == leg.sockets.send_errors == tick + 1
                else:
                    assert entries[-1].transmitted_ns == run.now[0] + 7 and media.frames_out == tick + 1
        assert batches == [4, 4, 4] and run.shell.sends.flushes == 3
        assert len(_drain(run.peer)) == 9


def test_an_exception_of_the_sends_settles_every_call_and_the_clock_goes_on() -> None:
    """The sends raise (not an OSError: a bug) after the first datagram left: that call's frame is recorded,
    the untried one is counted unsent and never recorded, the batch is emptied (its views would be stale by the
    next tick), the clock counts the error and the next tick sends both."""
    impl = speedups.pure
    raised: list[int] = []

    def failing_once(socks: list[Any], datagrams: list[Any], addresses: list[Any], results: bytearray) -> int:
        if not raised:
            raised.append(1)
            impl.send_batch(socks[:1], datagrams[:1], addresses[:1], results)
            raise RuntimeError("a bug in the sends")
        return impl.send_batch(socks, datagrams, addresses, results)

    with plain_calls(failing_once, [HOST, HOST]) as run:
        for tick in range(2):
            run.tick(tick)
            assert run.shell.sends.owners == [] and run.shell.sends.datagrams == []
        (first, m0), (second, m1) = run.calls
        assert run.shell.channel_errors == 1 and len(_drain(run.peer)) == 3
        assert [e.offset_ms for e in first.playout.ledger.entries()] == [0, 20] and m0.frames_out == 2
        assert [e.offset_ms for e in second.playout.ledger.entries()] == [20]
        assert m1.frames_unsent == 1 and second.sockets.send_errors == 1 and m1.frames_out == 1


# --- send_batch against garbage -----------------------------------------------------------------------------

hosts = st.sampled_from(
    [
        HOST,
        HOST,
        "127.0.0.1\x00",
        "127.1",
        "::1",
        "localhost",
        "",
        "<broadcast>",
        "255.255.255.255",
        "1.2.3.256",
        "é",
    ]
)
ports = st.one_of(st.sampled_from([0, 65535, 65536, -1, 2**70, True]), st.just("port"))
addresses = st.one_of(
    st.tuples(hosts, ports),
    st.tuples(hosts, st.just("sink")),
    st.just((HOST, "sink")),
    st.just((HOST, "sink", 0)),
    st.sampled_from([None, "127.0.0.1", (b"127.0.0.1", 9), [HOST, 9], (HOST,), (1, 2)]),
)
datagram_kinds = st.sampled_from(["bytes", "bytearray", "memoryview", "str", "none", "empty", "huge"])
socket_kinds = st.sampled_from(["open", "open", "closed", "int", "none", "v6"])


@pytest.mark.skipif(speedups.compiled is None, reason="the compiled media path is not built")
@prop
@given(st.lists(st.tuples(socket_kinds, datagram_kinds, addresses), max_size=6))
def test_send_batch_answers_garbage_as_the_pure_sends_do(entries: list[tuple[str, str, Any]]) -> None:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind((HOST, 0))
    sink.setblocking(False)
    sink_port = sink.getsockname()[1]
    opened: list[socket.socket] = []

    def make(kind: str) -> Any:
        if kind == "int":
            return 3
        if kind == "none":
            return None
        sock = socket.socket(socket.AF_INET6 if kind == "v6" else socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        opened.append(sock)
        if kind == "closed":
            sock.close()
        return sock

    def payload(kind: str) -> Any:
        return {
            "bytes": b"\x80" * 20,
            "bytearray": bytearray(b"\x81" * 20),
            "memoryview": memoryview(b"\x82" * 40)[10:30],
            "str": "text",
            "none": None,
            "empty": b"",
            "huge": b"\x83" * 70000,
        }[kind]

    def outcome(impl: speedups.Impl) -> Any:
        socks = [make(s) for s, _, _ in entries]
        datagrams = [payload(d) for _, d, _ in entries]
        where = [
            tuple(sink_port if part == "sink" else part for part in a) if isinstance(a, tuple) else a
            for _, _, a in entries
        ]
        results = bytearray(b"\x09" * (len(entries) + 1))
        try:
            answer: Any = ("ok", impl.send_batch(socks, datagrams, where, results))
        except Exception as exc:  # compared: both paths raise alike
            answer = ("raised", type(exc), str(exc))
        got = _drain(sink)
        for sock in opened:
            sock.close()
        opened.clear()
        return answer, bytes(results), got

    try:
        pure, compiled = outcome(speedups.pure), outcome(IMPLS["compiled"])
    finally:
        sink.close()
    assert pure == compiled


def test_send_batch_refuses_mismatched_arguments_on_the_compiled_path() -> None:
    if speedups.compiled is None:
        pytest.skip("the compiled media path is not built")
    send = speedups.compiled.send_batch
    with pytest.raises(TypeError):
        send((), [], [], bytearray())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        send([None], [], [], bytearray(1))
    with pytest.raises(ValueError):
        send([None], [b""], [None], bytearray(0))
    assert send([], [], [], bytearray()) == 0
