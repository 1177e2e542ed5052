"""The compiled media path answers bit for bit as the pure one (rtp.speedups): the same inputs to both, every
output compared, by property. Packets, buffers and payloads are drawn at random (every header flag, CSRC,
extension and padding length, truncated and garbage datagrams, ints out of range, other buffer types), and
whole random packet streams (loss, reordering, duplicates, SSRC changes, marker bits, timestamp wraps, DTMF,
comfort noise, unknown payload types, garbage) go through an `RtpStream` on each path: every event, frame and
datagram, and the counters and QoS at the end, must be equal. Peer input never raises out of either.

Skipped where the extension is not built (then only the pure path exists: tests/unit/rtp/test_speedups.py
checks that this is so only where no compiler is)."""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rtp.stream
from rtp import speedups
from rtp.jitter import JitterBuffer
from rtp.packet import Drop, RtpPacket
from rtp.stream import RtpStream, StreamConfig
from rtp.units import NS_PER_MS as MS
from tests.support.media_paths import decoders, media_path, use

__all__ = ["media_path"]  # the fixture, from the shared harness

pytestmark = pytest.mark.skipif(speedups.compiled is None, reason="the compiled media path is not built")

EXAMPLES = int(os.environ.get("PARLORA_FUZZ_EXAMPLES", "200"))
prop = settings(max_examples=EXAMPLES, deadline=None)
PURE = speedups.pure
COMPILED: speedups.Impl = speedups.compiled  # type: ignore[assignment]  # (skipped when None)
ADDR = ("192.0.2.2", 4000)


def outcome(fn: Any, *args: Any) -> Any:
    """What a call gave: its result, or the type and text of what it raised."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # compared, not hidden: both paths must raise alike
        return ("raised", type(exc), str(exc))


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types, down to the items of a tuple (a Drop member is the same object)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@st.composite
def rtp_datagrams(draw: st.DrawFn) -> bytes:
    """An RTP-ish datagram: any version, padding, extension and CSRC bits, and each length drawn at and around
    the boundary where it fits (the CSRC list, the extension, the padding count against what is left)."""
    b0 = draw(st.one_of(st.integers(0x80, 0xBF), st.integers(0, 255)))
    head = struct.pack("!BBHII", b0, draw(st.integers(0, 255)), *draw(st.tuples(u16, u32, u32)))
    near = st.sampled_from([-2, -1, 0, 0, 0, 1])
    body = bytes(max(0, 4 * (b0 & 0x0F) + draw(near)))  # the CSRC list, maybe a little short or long
    if b0 & 0x10:
        words = draw(st.integers(0, 4))
        body += struct.pack("!HH", draw(u16), words) + bytes(max(0, 4 * words + draw(near)))
    payload = draw(st.one_of(st.just(b""), st.binary(max_size=4), st.binary(max_size=200)))
    if b0 & 0x20:  # the padding count: none, one, exactly what is left (nothing but padding), more, any
        pad = draw(st.sampled_from([0, 1, 2, len(payload) + 1, len(payload) + 2, 255]))
        payload += bytes(max(0, pad - 1)) + bytes([pad & 0xFF]) if pad else b"\x00"
    data = head + body + payload
    return data[: draw(st.integers(0, len(data)))] if draw(st.integers(0, 4)) == 0 else data


u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
datagrams = st.one_of(rtp_datagrams(), st.binary(max_size=64))


@prop
@given(datagrams, st.sampled_from([bytes, bytearray, memoryview]))
def test_parse_is_the_same_on_both_paths(data: bytes, kind: type) -> None:
    pure, compiled = outcome(PURE.parse, kind(data)), outcome(COMPILED.parse, kind(data))
    if kind is memoryview and pure[0] == "ok" and isinstance(pure[1], RtpPacket):
        pure = ("ok", pure[1]._replace(payload=bytes(pure[1].payload)))  # two views of equal bytes
        compiled = ("ok", compiled[1]._replace(payload=bytes(compiled[1].payload)))
    assert same(pure, compiled), (pure, compiled)
    if kind is bytes:
        result = compiled[1]
        assert type(result) in (RtpPacket, Drop)  # peer input never raises
        if type(result) is RtpPacket:
            assert type(result.marker) is bool and type(result.payload) is bytes


wide = st.one_of(st.integers(-(2**70), 2**70), st.integers(0, 2**32), st.booleans())


@prop
@given(
    st.integers(0, 400),
    wide,
    st.one_of(st.booleans(), st.integers(-2, 2), st.none()),
    wide,
    wide,
    wide,
    st.binary(max_size=300),
    st.sampled_from([bytes, bytearray, memoryview]),
)
def test_pack_into_is_the_same_on_both_paths(
    size: int, pt: int, marker: Any, seq: int, ts: int, ssrc: int, payload: bytes, kind: type
) -> None:
    a, b = bytearray(b"\xaa" * size), bytearray(b"\xaa" * size)
    pure = outcome(PURE.pack_into, a, pt, marker, seq, ts, ssrc, kind(payload))
    compiled = outcome(COMPILED.pack_into, b, pt, marker, seq, ts, ssrc, kind(payload))
    assert same(pure, compiled) and a == b, (pure, compiled)


@prop
@given(st.binary(max_size=400), st.sampled_from([bytes, bytearray]))
def test_g711_decode_is_the_same_on_both_paths(payload: bytes, kind: type) -> None:
    for pure, compiled in zip(decoders(PURE), decoders(COMPILED), strict=True):
        assert same(outcome(pure, kind(payload)), outcome(compiled, kind(payload)))


# --- whole packet streams ---------------------------------------------------------------------------------

packet_step = st.tuples(
    st.sampled_from([1, 1, 1, 1, 2, 3, 0, -1, -2, 40, -60]),  # sequence step: on, loss, dup, reorder, jumps
    st.sampled_from([0, 0, 0, 0, 0, 101, 13, 8, 96]),  # audio, telephone-event, comfort noise, unknown
    st.sampled_from([160, 160, 160, 80, 320, 4, 8, 1]),  # payload length
    st.booleans(),  # marker
    st.integers(0, 30),  # arrival jitter, ms
)
stream_op = st.one_of(
    st.tuples(st.just("rtp"), packet_step),
    st.tuples(st.just("ssrc"), u32),
    st.tuples(st.just("garbage"), datagrams),
    st.tuples(st.just("truncate"), st.integers(0, 11)),
    st.tuples(st.just("tick"), st.sampled_from([None, 160, 80])),
    st.tuples(st.just("skip"), st.integers(1, 3)),
    st.tuples(st.just("stranger"), st.just(0)),
)


def run_stream(ops: list[tuple[str, Any]], start_ts: int, codec_pt: int) -> list[Any]:
    """Feed `ops` to a new stream on the path in place (tests.support.media_paths `use`); every output."""
    config = StreamConfig(
        ssrc=0xB,
        initial_seq=0xFFF0,
        initial_timestamp=start_ts,
        cname="p",
        remote=ADDR,
        payload_type=codec_pt,
    )
    stream = RtpStream(config, rand=lambda: 0.5)
    out: list[Any] = []
    seq, ts, ssrc, now, last = 0xFFF8, start_ts, 0xA, 0, b""
    for kind, arg in ops:
        if kind == "rtp":
            step, pt, size, marker, jitter = arg
            seq, ts = (seq + step) & 0xFFFF, (ts + 160 * step) & 0xFFFFFFFF
            pt = codec_pt if pt == 0 else pt
            payload = bytes((seq + i) & 0xFF for i in range(size))
            last = struct.pack("!BBHII", 0x80 | 0, (0x80 if marker else 0) | pt, seq, ts, ssrc) + payload
            out.append(stream.receive(last, ADDR, now + jitter * MS))
        elif kind == "ssrc":
            ssrc = arg
        elif kind == "garbage":
            out.append(stream.receive(arg, ADDR, now))
        elif kind == "truncate":
            out.append(stream.receive(last[:arg], ADDR, now))
        elif kind == "stranger":
            out.append(stream.receive(last, ("198.51.100.7", 9), now))
        elif kind == "tick":
            now += 20 * MS
            out.append(stream.pull_frame(now))
            view = stream.next_packet(
                None if arg is None else bytes(range(arg % 256)) * (arg // 256 + 1), now
            )
            out.append(None if view is None else bytes(view))
        else:
            stream.skip(arg)
            stream.jitter.skip(arg, now)
            out.append(stream.jitter.pop_backlog(now + 20 * MS))
    out.append(stream.counters())
    out.append(stream.qos())
    return out


@prop
@given(
    st.lists(stream_op, max_size=120),
    st.sampled_from([0, 2**32 - 160 * 20, 2**31]),  # timestamps that wrap within the stream
    st.sampled_from([0, 8]),  # PCMU, PCMA
)
def test_random_packet_streams_give_the_same_outputs_on_both_paths(
    ops: list[tuple[str, Any]], start_ts: int, codec_pt: int
) -> None:
    with use(PURE):
        pure = run_stream(ops, start_ts, codec_pt)
    with use(COMPILED):
        compiled = run_stream(ops, start_ts, codec_pt)
    assert len(pure) == len(compiled)
    for i, (a, b) in enumerate(zip(pure, compiled, strict=True)):
        assert same(a, b), (i, a, b)


def test_the_fixture_puts_each_path_where_the_cores_look(media_path: speedups.Impl) -> None:
    assert rtp.stream.parse is media_path.parse and rtp.stream.pack_into is media_path.pack_into
    decode = JitterBuffer()._decode
    assert (type(decode).__name__ == "partial") is (media_path is COMPILED)


def _read_all(recv: Any) -> tuple[list[bytes], list[int], list[bool], int]:
    """Datagrams (one longer than MAX_DATAGRAM), an empty socket and a closed one, read by
    rtp.endpoint `read_rtp` with `recv` (None: the pure read): what reached `on_rtp`, the arrival ages, what
    each read returned, and the receive errors counted."""
    import asyncio
    import socket
    import time

    from rtp.endpoint import MAX_DATAGRAM, PortPool, RtpSocketPair

    got: list[tuple[bytes, tuple[str, int], int]] = []
    loop = asyncio.new_event_loop()
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    first = probe.getsockname()[1] + 2
    probe.close()
    pair = RtpSocketPair.open(
        loop,
        "127.0.0.1",
        PortPool(first, first + 400),
        lambda data, source, arrival: got.append((data, source, arrival)),
        lambda *a: None,
        time.monotonic_ns,
    )
    pair._recv = recv
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.bind(("127.0.0.1", 0))
    try:
        for k in range(4):
            sender.sendto(bytes([0x80, k]) * (10 + k), ("127.0.0.1", pair.port))
        sender.sendto(b"\x80" * (MAX_DATAGRAM + 100), ("127.0.0.1", pair.port))  # cut to MAX_DATAGRAM
        now, later = 10**12, time.time_ns() + 5 * 10**9
        results = [pair.read_rtp(now, later) for _ in range(6)]
        results.append(pair.read_rtp(now, later))
        pair._rtp.close()  # a read after the socket closed: an error counted, nothing raised
        results.append(pair.read_rtp(now, later))
        port = sender.getsockname()[1]
        assert [source for _, source, _ in got] == [("127.0.0.1", port)] * len(got)  # each from its sender
        return (
            [data for data, _, _ in got],
            [now - arrival for _, _, arrival in got],
            results,
            pair.receive_errors,
        )
    finally:
        sender.close()
        pair.close()
        loop.close()


def test_the_rtp_read_is_the_same_on_both_paths() -> None:
    pure, compiled = _read_all(None), _read_all(COMPILED.recv_stamped)
    assert pure[0] == compiled[0] and [len(d) for d in pure[0]] == [20, 22, 24, 26, 2048]
    assert pure[2] == compiled[2] == [True] * 5 + [False] * 3  # empty, closed: False, nothing raised
    assert pure[3] == compiled[3] == 1  # the closed socket's error
    assert all(4.9e9 < age < 5.1e9 for age in pure[1] + compiled[1])  # both stamped by the kernel
