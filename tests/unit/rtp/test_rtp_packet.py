"""RTP packets (RFC 3550 §5.1): parse with every optional part, reject malformed input with a reason."""

import struct

import pytest

from rtp.packet import Drop, RtpPacket, build, is_rtcp, pack_into, parse
from tests.support.media_paths import media_path

__all__ = ["media_path"]  # the fixture, from the shared harness

pytestmark = pytest.mark.usefixtures("media_path")  # on each media path (rtp.speedups)


def header(b0: int = 0x80, b1: int = 0, seq: int = 1, ts: int = 160, ssrc: int = 0x11223344) -> bytes:
    return struct.pack("!BBHII", b0, b1, seq, ts, ssrc)


def test_fixed_header_fields_are_read() -> None:
    p = parse(header(b1=0x80 | 8, seq=0xFFFF, ts=0xFFFFFFFF, ssrc=0xDEADBEEF) + b"\x01\x02")
    assert p == RtpPacket(
        pt=8, marker=True, seq=0xFFFF, timestamp=0xFFFFFFFF, ssrc=0xDEADBEEF, payload=b"\x01\x02"
    )


def test_csrc_list_extension_and_padding_are_skipped() -> None:
    csrcs = struct.pack("!II", 1, 2)
    ext = struct.pack("!HH", 0xBEDE, 2) + b"\xaa" * 8
    payload = b"\x7f" * 160
    padding = b"\x00\x00\x03"
    data = header(b0=0x80 | 0x20 | 0x10 | 2) + csrcs + ext + payload + padding
    p = parse(data)
    assert isinstance(p, RtpPacket)
    assert p.payload == payload


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", Drop.TOO_SHORT),
        (header()[:11], Drop.TOO_SHORT),
        (header(b0=0x40) + b"x", Drop.BAD_VERSION),
        (header(b0=0x00) + b"x", Drop.BAD_VERSION),
        (header(), Drop.EMPTY_PAYLOAD),
        (header(b0=0x83) + b"\x00" * 8, Drop.BAD_CSRC),  # 3 CSRCs announced, 2 present
        (header(b0=0x90) + b"\xbe\xde", Drop.BAD_EXTENSION),
        (header(b0=0x90) + struct.pack("!HH", 0xBEDE, 5) + b"\x00" * 8, Drop.BAD_EXTENSION),
        (header(b0=0xA0) + b"abc\x00", Drop.BAD_PADDING),  # padding count 0
        (header(b0=0xA0) + b"abc\x09", Drop.BAD_PADDING),  # more padding than bytes
        (header(b0=0xA0) + b"abc\x04", Drop.EMPTY_PAYLOAD),  # all padding
        (header(b0=0x81) + b"\x00" * 4, Drop.EMPTY_PAYLOAD),  # CSRC, then nothing
    ],
)
def test_malformed_packets_give_a_reason_not_an_exception(data: bytes, reason: Drop) -> None:
    assert parse(data) is reason


def test_build_and_pack_into_produce_the_same_bytes_and_round_trip() -> None:
    payload = bytes(range(160))
    data = build(0, True, 65535, 2**32 - 160, 0xCAFEBABE, payload)
    assert len(data) == 172 and data[0] == 0x80 and data[1] == 0x80
    buf = bytearray(200)
    n = pack_into(buf, 0, True, 65535, 2**32 - 160, 0xCAFEBABE, payload)
    assert bytes(buf[:n]) == data
    assert parse(data) == RtpPacket(0, True, 65535, 2**32 - 160, 0xCAFEBABE, payload)


def test_pack_into_wraps_sequence_and_timestamp() -> None:
    p = parse(build(8, False, 65536 + 5, 2**32 + 7, 1, b"x"))
    assert isinstance(p, RtpPacket) and (p.seq, p.timestamp, p.pt, p.marker) == (5, 7, 8, False)


def test_pack_into_reuses_the_buffer_without_resizing_it() -> None:
    buf = bytearray(12 + 1200)
    view = memoryview(buf)  # an exported buffer cannot be resized: pack_into must write in place
    n1 = pack_into(buf, 0, False, 1, 160, 9, b"\xff" * 160)
    n2 = pack_into(buf, 0, False, 2, 320, 9, b"\x01" * 20)
    assert (n1, n2) == (172, 32) and len(buf) == 1212
    assert parse(bytes(view[:n2])) == RtpPacket(0, False, 2, 320, 9, b"\x01" * 20)


def test_rtcp_mux_demultiplexing_by_second_byte() -> None:
    assert is_rtcp(bytes([0x80, 200, 0, 6]))  # SR
    assert is_rtcp(bytes([0x81, 201]))  # RR
    assert not is_rtcp(build(0, True, 1, 1, 1, b"x"))  # PT 0 with marker: byte 0x80
    assert not is_rtcp(build(101, False, 1, 1, 1, b"x"))
    assert not is_rtcp(b"\x80")
