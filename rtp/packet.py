"""RTP packets (RFC 3550 §5.1): parse inbound datagrams, pack outbound ones into a reusable buffer.

The fixed header is one precompiled `struct.Struct("!BBHII")`; the common case (no CSRC, no extension, no
padding) costs one `unpack_from`, one slice for the payload and one small tuple. Bad input never raises: `parse`
returns a `Drop` reason instead of a packet, and the caller counts it (DESIGN §3 principle 4: malformed RTP is
counted and dropped). `Drop` is the one reason-code enum of the whole media edge, so a stream keeps its drop
counters in a list indexed by it.

Outbound, `pack_into` writes the header and payload into a caller-owned `bytearray` and returns the length, so
the per-frame send path allocates nothing but the memoryview the socket is handed.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

__all__ = ["Drop", "RtpPacket", "parse", "pack_into", "build", "HEADER_SIZE", "is_rtcp"]

HEADER = struct.Struct("!BBHII")  # V/P/X/CC, M/PT, sequence number, timestamp, SSRC
HEADER_SIZE = HEADER.size  # 12
_EXT = struct.Struct("!HH")  # profile-defined id, length in 32-bit words
_unpack_header = HEADER.unpack_from
_pack_header = HEADER.pack_into


class Drop(enum.IntEnum):
    """Why an inbound datagram (or a packet inside it) was not used. One counter per member."""

    TOO_SHORT = 0  # shorter than the 12-byte header
    BAD_VERSION = 1  # V != 2
    BAD_CSRC = 2  # CSRC list runs past the end
    BAD_EXTENSION = 3  # header extension runs past the end
    BAD_PADDING = 4  # padding count 0 or larger than what is left
    EMPTY_PAYLOAD = 5  # nothing after header (and padding)
    UNKNOWN_PT = 6  # payload type not negotiated
    WRONG_SOURCE = 7  # symmetric-RTP policy refused the source address (rtp.latch)
    DUPLICATE = 8  # same sequence number already buffered or played
    LATE = 9  # arrived after its playout slot
    BAD_DTMF = 10  # telephone-event payload not 4 bytes (or a multiple)
    BAD_RTCP = 11  # malformed RTCP compound packet
    OVERFLOW = 12  # jitter buffer above its 200 ms ceiling (or resynced): buffered frame discarded


class RtpPacket(NamedTuple):
    """One parsed RTP packet: the fields the media edge uses. `payload` excludes CSRC, extension and padding."""

    pt: int
    marker: bool
    seq: int
    timestamp: int
    ssrc: int
    payload: bytes


def is_rtcp(data: bytes) -> bool:
    """RFC 5761 §4 demultiplexing (rtcp-mux): second byte 192..223 is RTCP (SR 200, RR 201, SDES 202, ...)."""
    return len(data) >= 2 and 192 <= data[1] <= 223


def parse(data: bytes) -> RtpPacket | Drop:
    """Parse one RTP datagram; a `Drop` member names what was wrong. Never raises for any `bytes` input."""
    n = len(data)
    if n < 12:
        return Drop.TOO_SHORT
    b0, b1, seq, ts, ssrc = _unpack_header(data)
    if b0 & 0xC0 != 0x80:
        return Drop.BAD_VERSION
    if b0 & 0x3F == 0:  # fast path: no padding, no extension, no CSRC
        if n == 12:
            return Drop.EMPTY_PAYLOAD
        return RtpPacket(b1 & 0x7F, b1 >= 0x80, seq, ts, ssrc, data[12:])
    offset = 12 + 4 * (b0 & 0x0F)
    if offset > n:
        return Drop.BAD_CSRC
    if b0 & 0x10:  # header extension (§5.3.1): 4-byte header then length words; skipped
        if offset + 4 > n:
            return Drop.BAD_EXTENSION
        offset += 4 + 4 * _EXT.unpack_from(data, offset)[1]
        if offset > n:
            return Drop.BAD_EXTENSION
    end = n
    if b0 & 0x20:  # padding (§5.1): last octet counts the padding octets, itself included
        pad = data[n - 1]
        if pad == 0 or pad > n - offset:
            return Drop.BAD_PADDING
        end = n - pad
    if end <= offset:
        return Drop.EMPTY_PAYLOAD
    return RtpPacket(b1 & 0x7F, b1 >= 0x80, seq, ts, ssrc, data[offset:end])


def pack_into(
    buf: bytearray, pt: int, marker: bool, seq: int, timestamp: int, ssrc: int, payload: bytes | bytearray
) -> int:
    """Write a 12-byte header (V=2, no padding/extension/CSRC) and `payload` into `buf`; return the length.

    `buf` must hold 12 + len(payload) bytes. `seq` and `timestamp` are taken modulo 2**16 and 2**32."""
    n = 12 + len(payload)
    _pack_header(
        buf,
        0,
        0x80,
        (0x80 if marker else 0) | (pt & 0x7F),
        seq & 0xFFFF,
        timestamp & 0xFFFFFFFF,
        ssrc & 0xFFFFFFFF,
    )
    buf[12:n] = payload
    return n


def build(pt: int, marker: bool, seq: int, timestamp: int, ssrc: int, payload: bytes) -> bytes:
    """`pack_into` into a fresh buffer (tests, DTMF, the rare path)."""
    buf = bytearray(12 + len(payload))
    pack_into(buf, pt, marker, seq, timestamp, ssrc, payload)
    return bytes(buf)
