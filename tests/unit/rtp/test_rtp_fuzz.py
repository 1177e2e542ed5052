"""Property tests of the RTP and RTCP parsers (and the stream that uses them): arbitrary and mutated bytes
never raise, and whatever is built parses back to itself.

CI runs 200 examples per property; `PARLORA_FUZZ_EXAMPLES=100000` runs a longer campaign (tests/bench)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtp.packet import Drop, RtpPacket, build, parse
from rtp.rtcp import (
    Goodbye,
    ReceiverReport,
    ReportBlock,
    SenderReport,
    SourceDescription,
    build_bye,
    build_rr,
    build_sdes,
    build_sr,
    parse_compound,
)
from rtp.stream import RtpStream, StreamConfig
from tests.support.media_paths import media_path

__all__ = ["media_path"]  # the fixture, from the shared harness

EXAMPLES = int(os.environ.get("PARLORA_FUZZ_EXAMPLES", "200"))
fuzz = settings(max_examples=EXAMPLES, deadline=None)

u32 = st.integers(0, 2**32 - 1)
u16 = st.integers(0, 2**16 - 1)


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """A valid datagram with a few bytes overwritten, truncated or extended."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(0, 4))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) + draw(st.binary(max_size=8))


rtp_packets = st.builds(
    RtpPacket, st.integers(0, 127), st.booleans(), u16, u32, u32, st.binary(min_size=1, max_size=300)
)
rtp_bytes = rtp_packets.map(lambda p: build(p.pt, p.marker, p.seq, p.timestamp, p.ssrc, p.payload))


@pytest.mark.usefixtures("media_path")  # on each media path (rtp.speedups)
@fuzz
@given(rtp_packets)
def test_rtp_build_parse_round_trip(p: RtpPacket) -> None:
    assert parse(build(p.pt, p.marker, p.seq, p.timestamp, p.ssrc, p.payload)) == p


@pytest.mark.usefixtures("media_path")
@fuzz
@given(st.one_of(st.binary(max_size=400), mutated(rtp_bytes)))
def test_rtp_parse_never_raises(data: bytes) -> None:
    result = parse(data)
    assert isinstance(result, (RtpPacket, Drop))
    if isinstance(result, RtpPacket):
        assert 0 < len(result.payload) <= len(data) - 12


blocks = st.builds(
    ReportBlock, u32, st.integers(0, 255), st.integers(-(2**23), 2**23 - 1), u32, u32, u32, u32
)
block_lists = st.lists(blocks, max_size=3).map(tuple)
cname = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40).filter(
    lambda s: len(s.encode()) <= 255
)
rtcp_items = st.one_of(
    st.builds(SenderReport, u32, st.integers(0, 2**64 - 1), u32, u32, u32, block_lists).map(
        lambda p: (p, build_sr(p))
    ),
    st.builds(ReceiverReport, u32, block_lists).map(lambda p: (p, build_rr(p))),
    st.tuples(u32, cname).map(lambda t: (SourceDescription(((t[0], t[1]),)), build_sdes(t[0], t[1]))),
    st.tuples(
        st.lists(u32, max_size=3).map(tuple), st.one_of(st.none(), st.text(min_size=1, max_size=20))
    ).map(
        lambda t: (
            Goodbye(t[0], t[1] if t[1] and len(t[1].encode()) <= 255 else None),
            build_bye(t[0], t[1] if t[1] and len(t[1].encode()) <= 255 else None),
        )
    ),
)


@fuzz
@given(st.lists(rtcp_items, min_size=1, max_size=4))
def test_rtcp_compound_build_parse_round_trip(items: list[tuple[object, bytes]]) -> None:
    data = b"".join(raw for _, raw in items)
    assert parse_compound(data) == [p for p, _ in items]


rtcp_bytes = st.lists(rtcp_items, min_size=1, max_size=3).map(lambda items: b"".join(raw for _, raw in items))


@fuzz
@given(st.one_of(st.binary(max_size=300), mutated(rtcp_bytes)))
def test_rtcp_parse_never_raises(data: bytes) -> None:
    result = parse_compound(data)
    assert isinstance(result, (list, Drop))


@fuzz
@given(st.lists(st.one_of(st.binary(max_size=200), mutated(rtp_bytes), mutated(rtcp_bytes)), max_size=30))
def test_stream_survives_any_datagrams(datagrams: list[bytes]) -> None:
    s = RtpStream(
        StreamConfig(
            ssrc=1, initial_seq=0, initial_timestamp=0, cname="x", remote=("h", 1), rtcp_mux=True, nat=True
        ),
        rand=lambda: 0.5,
    )
    for i, d in enumerate(datagrams):
        s.receive(d, ("h", 1), i * 20_000_000)
        frame = s.pull_frame(i * 20_000_000 + 10_000_000)
        assert frame is None or len(frame.pcm) == 320
        s.handle_timer(i * 20_000_000)
    assert sum(s.counters().values()) >= 0
