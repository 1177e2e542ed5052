"""RTCP (RFC 3550 §6): SR, RR, SDES CNAME and BYE built and parsed, receiver statistics, RTT and the interval.

- `ReceiverStats`: what we know about the one source we receive from: sequence validation and the extended
  highest sequence number (A.1), cumulative and fractional loss (A.3), interarrival jitter (A.8, the integer
  form, in timestamp units). `update` runs once per accepted RTP packet (a handful of integer operations).
- `parse_compound(data)` returns the packets of a compound datagram (`SenderReport`, `ReceiverReport`,
  `SourceDescription`, `Goodbye`; other types are skipped), or `Drop.BAD_RTCP`. It never raises.
- `RtcpSession`: one call's RTCP endpoint. It counts what we send, builds SR (or RR while we have sent
  nothing) + SDES CNAME compounds on the §6.3 schedule (5 s nominal, each interval drawn from 0.5..1.5 of it,
  the first one from half of it), reads the peer's reports (round-trip time from LSR/DLSR, §6.4.1) and gives
  the `qos()` snapshot behind `status()["qos"]`.

Time: every call takes `now` (monotonic ns). NTP timestamps are `now` plus `wallclock_offset_ns` (the shell
passes `time.time_ns() - time.monotonic_ns()` once), so RTT arithmetic uses one clock throughout. Randomness
for the interval comes from an injected `rand() -> [0, 1)`, so tests are deterministic.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from rtp.packet import Drop

__all__ = [
    "ReportBlock",
    "SenderReport",
    "ReceiverReport",
    "SourceDescription",
    "Goodbye",
    "RtcpPacket",
    "parse_compound",
    "build_sr",
    "build_rr",
    "build_sdes",
    "build_bye",
    "ReceiverStats",
    "RtcpSession",
    "QoS",
    "ntp_from_ns",
]

SR, RR, SDES, BYE = 200, 201, 202, 203
_HDR = struct.Struct("!BBH")
_SR_BODY = struct.Struct("!IIIIII")  # SSRC, NTP msw, NTP lsw, RTP ts, packet count, octet count
_BLOCK = struct.Struct("!IIIIII")  # SSRC, fraction<<24 | cumulative lost, ext highest seq, jitter, LSR, DLSR
_SSRC = struct.Struct("!I")
_NTP_UNIX_OFFSET = 2_208_988_800  # seconds from 1900 to 1970
_RTP_SEQ_MOD = 1 << 16
_MAX_DROPOUT = 3000
_MAX_MISORDER = 100
_MIN_SEQUENTIAL = 2


def ntp_from_ns(unix_ns: int) -> int:
    """64-bit NTP timestamp (32.32 fixed point since 1900) of a Unix time in ns."""
    secs, rem = divmod(unix_ns, 1_000_000_000)
    return ((secs + _NTP_UNIX_OFFSET) & 0xFFFFFFFF) << 32 | (rem << 32) // 1_000_000_000


# --- packets ---


@dataclass(frozen=True, slots=True)
class ReportBlock:
    """One reception report (§6.4.1). `cumulative_lost` is signed (duplicates can make it negative);
    `jitter` is in timestamp units; `lsr`/`dlsr` are NTP middle-32 / 1/65536 s."""

    ssrc: int
    fraction_lost: int  # 0..255, fraction of 256
    cumulative_lost: int
    highest_seq: int  # extended
    jitter: int
    lsr: int
    dlsr: int


@dataclass(frozen=True, slots=True)
class SenderReport:
    ssrc: int
    ntp: int  # 64-bit
    rtp_timestamp: int
    packet_count: int
    octet_count: int
    reports: tuple[ReportBlock, ...]


@dataclass(frozen=True, slots=True)
class ReceiverReport:
    ssrc: int
    reports: tuple[ReportBlock, ...]


@dataclass(frozen=True, slots=True)
class SourceDescription:
    """SDES chunks as (SSRC, CNAME or None); other items are skipped."""

    chunks: tuple[tuple[int, str | None], ...]


@dataclass(frozen=True, slots=True)
class Goodbye:
    ssrcs: tuple[int, ...]
    reason: str | None


RtcpPacket = SenderReport | ReceiverReport | SourceDescription | Goodbye


def _blocks(data: bytes, offset: int, count: int) -> tuple[ReportBlock, ...]:
    out = []
    for i in range(count):
        ssrc, lost, ext, jitter, lsr, dlsr = _BLOCK.unpack_from(data, offset + 24 * i)
        cumulative = lost & 0xFFFFFF
        if cumulative & 0x800000:
            cumulative -= 0x1000000
        out.append(ReportBlock(ssrc, lost >> 24, cumulative, ext, jitter, lsr, dlsr))
    return tuple(out)


def parse_compound(data: bytes) -> list[RtcpPacket] | Drop:
    """The packets of one RTCP datagram, in order; `Drop.BAD_RTCP` if its structure is wrong anywhere
    (version, lengths, counts that do not fit). Unknown packet types (APP, feedback, XR) are skipped."""
    try:
        return _parse_compound(data)
    except (struct.error, IndexError, ValueError):  # belt and braces: bounds are checked below
        return Drop.BAD_RTCP


def _parse_compound(data: bytes) -> list[RtcpPacket] | Drop:
    out: list[RtcpPacket] = []
    n, offset = len(data), 0
    if n < 4:
        return Drop.BAD_RTCP
    while offset < n:
        if offset + 4 > n:
            return Drop.BAD_RTCP
        b0, pt, words = _HDR.unpack_from(data, offset)
        if b0 >> 6 != 2:
            return Drop.BAD_RTCP
        end = offset + 4 * (words + 1)
        if end > n:
            return Drop.BAD_RTCP
        body_end = end
        if b0 & 0x20:  # padding: only meaningful in the last packet
            pad = data[end - 1]
            if pad == 0 or pad > end - offset - 4:
                return Drop.BAD_RTCP
            body_end = end - pad
        count = b0 & 0x1F
        p = offset + 4
        if pt == SR:
            if p + 24 + 24 * count > body_end:
                return Drop.BAD_RTCP
            ssrc, msw, lsw, ts, pkts, octets = _SR_BODY.unpack_from(data, p)
            out.append(SenderReport(ssrc, msw << 32 | lsw, ts, pkts, octets, _blocks(data, p + 24, count)))
        elif pt == RR:
            if p + 4 + 24 * count > body_end:
                return Drop.BAD_RTCP
            out.append(ReceiverReport(_SSRC.unpack_from(data, p)[0], _blocks(data, p + 4, count)))
        elif pt == SDES:
            chunks = []
            for _ in range(count):
                if p + 4 > body_end:
                    return Drop.BAD_RTCP
                ssrc = _SSRC.unpack_from(data, p)[0]
                p += 4
                cname: str | None = None
                while True:
                    if p >= body_end:
                        return Drop.BAD_RTCP
                    item = data[p]
                    if item == 0:  # end of items: skip to the next 32-bit boundary
                        p = (p + 4) & ~3
                        break
                    if p + 2 > body_end or p + 2 + data[p + 1] > body_end:
                        return Drop.BAD_RTCP
                    length = data[p + 1]
                    if item == 1:
                        cname = data[p + 2 : p + 2 + length].decode("utf-8", "replace")
                    p += 2 + length
                chunks.append((ssrc, cname))
            out.append(SourceDescription(tuple(chunks)))
        elif pt == BYE:
            if p + 4 * count > body_end:
                return Drop.BAD_RTCP
            ssrcs = tuple(_SSRC.unpack_from(data, p + 4 * i)[0] for i in range(count))
            p += 4 * count
            reason = None
            if p < body_end:
                length = data[p]
                if p + 1 + length > body_end:
                    return Drop.BAD_RTCP
                reason = data[p + 1 : p + 1 + length].decode("utf-8", "replace")
            out.append(Goodbye(ssrcs, reason))
        offset = end
    return out


def _pack_blocks(reports: tuple[ReportBlock, ...]) -> bytes:
    return b"".join(
        _BLOCK.pack(
            r.ssrc,
            (r.fraction_lost & 0xFF) << 24 | (r.cumulative_lost & 0xFFFFFF),
            r.highest_seq & 0xFFFFFFFF,
            r.jitter & 0xFFFFFFFF,
            r.lsr & 0xFFFFFFFF,
            r.dlsr & 0xFFFFFFFF,
        )
        for r in reports
    )


def build_sr(sr: SenderReport) -> bytes:
    if len(sr.reports) > 31:
        raise ValueError("at most 31 report blocks per SR")
    body = _SR_BODY.pack(
        sr.ssrc,
        sr.ntp >> 32 & 0xFFFFFFFF,
        sr.ntp & 0xFFFFFFFF,
        sr.rtp_timestamp & 0xFFFFFFFF,
        sr.packet_count & 0xFFFFFFFF,
        sr.octet_count & 0xFFFFFFFF,
    ) + _pack_blocks(sr.reports)
    return _HDR.pack(0x80 | len(sr.reports), SR, len(body) // 4) + body


def build_rr(rr: ReceiverReport) -> bytes:
    if len(rr.reports) > 31:
        raise ValueError("at most 31 report blocks per RR")
    body = _SSRC.pack(rr.ssrc) + _pack_blocks(rr.reports)
    return _HDR.pack(0x80 | len(rr.reports), RR, len(body) // 4) + body


def build_sdes(ssrc: int, cname: str) -> bytes:
    text = cname.encode()[:255]
    chunk = _SSRC.pack(ssrc) + bytes([1, len(text)]) + text + b"\x00"
    chunk += b"\x00" * (-len(chunk) % 4)
    return _HDR.pack(0x81, SDES, len(chunk) // 4) + chunk


def build_bye(ssrcs: tuple[int, ...], reason: str | None = None) -> bytes:
    body = b"".join(_SSRC.pack(s) for s in ssrcs)
    if reason:
        text = reason.encode()[:255]
        body += bytes([len(text)]) + text
        body += b"\x00" * (-len(body) % 4)
    return _HDR.pack(0x80 | len(ssrcs), BYE, len(body) // 4) + body


# --- receiver statistics (A.1, A.3, A.8) ---


class ReceiverStats:
    """Statistics of the source we receive from (RFC 3550 A.1, A.3, A.8). `update` returns False while the
    source is on probation or for a packet the A.1 algorithm rejects (a wild jump it has not confirmed)."""

    __slots__ = (
        "ssrc", "max_seq", "cycles", "base_seq", "bad_seq", "probation", "received", "expected_prior",
        "received_prior", "transit", "jitter16", "octets", "started", "_timed", "ns_per_ts",
    )  # fmt: skip

    def __init__(self, clock_rate: int = 8000) -> None:
        self.ns_per_ts = 1_000_000_000 // clock_rate  # one RTP timestamp unit in ns (8000 Hz: 125,000)
        self.reset(0)

    def reset(self, ssrc: int) -> None:
        self.ssrc = ssrc
        self.started = False
        self.max_seq = self.cycles = self.base_seq = 0
        self.bad_seq = _RTP_SEQ_MOD + 1
        self.probation = _MIN_SEQUENTIAL
        self.received = self.expected_prior = self.received_prior = 0
        self.transit = 0
        self._timed = False  # a packet's transit is known (the first timed one has no predecessor)
        self.jitter16 = 0  # jitter in timestamp units, times 16 (A.8 integer form)
        self.octets = 0

    def _init_seq(self, seq: int) -> None:
        self.base_seq = seq
        self.max_seq = seq
        self.bad_seq = _RTP_SEQ_MOD + 1
        self.cycles = 0
        self.received = self.received_prior = self.expected_prior = 0

    def update(self, seq: int, timestamp: int, arrival_ns: int, octets: int, timing: bool = True) -> bool:
        """One RTP packet of this source (A.1 `update_seq` plus the A.8 jitter step). `timing=False` leaves a
        packet out of the jitter (RFC 4733 events keep one timestamp for a whole event)."""
        if not self.started:
            self.started = True
            self._init_seq(seq)
            self.max_seq = seq - 1
            self.probation = _MIN_SEQUENTIAL
        if self.probation:  # source not valid until MIN_SEQUENTIAL packets in sequence
            if seq == (self.max_seq + 1) & 0xFFFF:
                self.probation -= 1
                self.max_seq = seq
                if self.probation == 0:
                    self._init_seq(seq)
                    self._count(timestamp, arrival_ns, octets, first=True, timing=timing)
                    return True
            else:
                self.probation = _MIN_SEQUENTIAL - 1
                self.max_seq = seq
            return False
        udelta = (seq - self.max_seq) & 0xFFFF
        if udelta < _MAX_DROPOUT:  # in order, with permissible gap
            if seq < self.max_seq:
                self.cycles += _RTP_SEQ_MOD
            self.max_seq = seq
        elif udelta <= _RTP_SEQ_MOD - _MAX_MISORDER:  # the sequence number made a very large jump
            if seq == self.bad_seq:  # two sequential packets: the sender restarted without telling us
                self._init_seq(seq)
            else:
                self.bad_seq = (seq + 1) & 0xFFFF
                return False
        # else: duplicate or reordered packet
        self._count(timestamp, arrival_ns, octets, first=False, timing=timing)
        return True

    def _count(self, timestamp: int, arrival_ns: int, octets: int, first: bool, timing: bool) -> None:
        self.received += 1
        self.octets += octets
        if not timing:
            return
        first = first or not self._timed
        self._timed = True
        transit = (arrival_ns // self.ns_per_ts - timestamp) & 0xFFFFFFFF  # A.8, in timestamp units mod 2**32
        if not first:
            d = ((transit - self.transit + 0x80000000) & 0xFFFFFFFF) - 0x80000000
            if d < 0:
                d = -d
            self.jitter16 += d - ((self.jitter16 + 8) >> 4)
        self.transit = transit

    @property
    def extended_max(self) -> int:
        return self.cycles + self.max_seq

    @property
    def expected(self) -> int:
        return self.extended_max - self.base_seq + 1 if self.received else 0

    @property
    def cumulative_lost(self) -> int:
        """A.3: expected minus received, clamped to the 24-bit signed field."""
        lost = self.expected - self.received
        return max(-0x800000, min(0x7FFFFF, lost))

    @property
    def jitter(self) -> int:
        """Interarrival jitter in timestamp units (1/8000 s, Opus 1/48000 s), as reported."""
        return self.jitter16 >> 4

    def report_block(self, lsr: int, dlsr: int) -> ReportBlock:
        """The block for a report now; advances the A.3 interval (fraction lost since the last block)."""
        expected = self.expected
        expected_interval = expected - self.expected_prior
        self.expected_prior = expected
        received_interval = self.received - self.received_prior
        self.received_prior = self.received
        lost_interval = expected_interval - received_interval
        fraction = (
            0 if expected_interval == 0 or lost_interval <= 0 else (lost_interval << 8) // expected_interval
        )
        return ReportBlock(
            self.ssrc,
            min(fraction, 255),
            self.cumulative_lost,
            self.extended_max & 0xFFFFFFFF,
            self.jitter,
            lsr,
            dlsr,
        )


# --- the per-call RTCP endpoint ---


@dataclass(frozen=True, slots=True)
class QoS:
    """`status()["qos"]` for one call. Loss figures are of what we receive; `remote_*` is what the peer
    reported about what we send. `rtt_ms` is None until a report block with LSR has come back."""

    jitter_ms: float
    packets_lost: int
    loss_fraction: float  # cumulative lost / expected
    fraction_lost_last: float  # in the last report interval we sent
    rtt_ms: float | None
    packets_in: int
    octets_in: int
    packets_out: int
    octets_out: int
    remote_jitter_ms: float | None
    remote_fraction_lost: float | None
    remote_cumulative_lost: int | None
    late_packets: int = 0  # the jitter buffer's figures (filled in by rtp.stream)
    frames_concealed: int = 0
    buffer_ms: int = 0
    one_way_audio: str | None = None  # why no usable RTP arrived (rtp.stream.OneWayAudio.cause), if so

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class RtcpSession:
    """One call's RTCP: counts, reports and the report schedule. `receiver` is fed by the RTP path."""

    def __init__(
        self,
        ssrc: int,
        cname: str,
        rand: Callable[[], float],
        *,
        wallclock_offset_ns: int = 0,
        interval_ns: int = 5_000_000_000,
        clock_rate: int = 8000,
    ) -> None:
        self.ssrc = ssrc
        self.cname = cname
        self._rand = rand
        self._offset = wallclock_offset_ns
        self._interval = interval_ns
        self._rate = clock_rate
        self.receiver = ReceiverStats(clock_rate)
        self.packets_sent = 0
        self.octets_sent = 0
        self._last_rtp_ts = 0
        self._last_rtp_ns = 0
        self._next: int | None = None
        self._their_sr_mid = 0  # middle 32 bits of the peer's last SR NTP time (our LSR)
        self._their_sr_at = 0  # when it arrived
        self.rtt_ms: float | None = None
        self.remote: ReportBlock | None = None
        self.reports_sent = 0
        self.reports_received = 0
        self.bye_received: Goodbye | None = None
        self._fraction_last = 0

    # --- sending side ---

    def on_rtp_sent(self, timestamp: int, payload_len: int, now: int) -> None:
        """Count one RTP packet sent (for the SR sender info and the RTP/NTP timestamp pairing)."""
        self.packets_sent += 1
        self.octets_sent += payload_len
        self._last_rtp_ts = timestamp
        self._last_rtp_ns = now

    def start(self, now: int) -> None:
        """Arm the schedule: the first report after half an interval, randomised (§6.2, §6.3.1)."""
        self._next = now + self._randomised(self._interval // 2)

    def _randomised(self, interval: int) -> int:
        return int(interval * (0.5 + self._rand()))

    def next_deadline(self) -> int | None:
        return self._next

    def handle_timer(self, now: int) -> bytes | None:
        """The compound report due at `now` (SR or RR + SDES CNAME), or None if none is due yet."""
        if self._next is None or now < self._next:
            return None
        self._next = now + self._randomised(self._interval)
        return self.build_report(now)

    def _ntp(self, now: int) -> int:
        return ntp_from_ns(now + self._offset)

    def _blocks(self, now: int) -> tuple[ReportBlock, ...]:
        if not self.receiver.received:
            return ()
        lsr = self._their_sr_mid
        dlsr = ((now - self._their_sr_at) << 16) // 1_000_000_000 if lsr else 0
        block = self.receiver.report_block(lsr, dlsr)
        self._fraction_last = block.fraction_lost
        return (block,)

    def build_report(self, now: int) -> bytes:
        """SR (once we have sent RTP) or RR, then SDES CNAME: one compound datagram (§6.1)."""
        blocks = self._blocks(now)
        if self.packets_sent:
            elapsed = now - self._last_rtp_ns
            rtp_ts = (self._last_rtp_ts + elapsed * self._rate // 1_000_000_000) & 0xFFFFFFFF
            head = build_sr(
                SenderReport(self.ssrc, self._ntp(now), rtp_ts, self.packets_sent, self.octets_sent, blocks)
            )
        else:
            head = build_rr(ReceiverReport(self.ssrc, blocks))
        self.reports_sent += 1
        return head + build_sdes(self.ssrc, self.cname)

    def build_goodbye(self, now: int, reason: str | None = None) -> bytes:
        """A final report with BYE (§6.6), for when the call ends; stops the schedule."""
        self._next = None
        return self.build_report(now) + build_bye((self.ssrc,), reason)

    # --- receiving side ---

    def receive(self, data: bytes, now: int) -> list[RtcpPacket] | Drop:
        """Read one RTCP datagram from the peer: RTT from blocks about us, LSR from its SR."""
        packets = parse_compound(data)
        if isinstance(packets, Drop):
            return packets
        self.reports_received += 1
        for p in packets:
            if isinstance(p, SenderReport):
                self._their_sr_mid = (p.ntp >> 16) & 0xFFFFFFFF
                self._their_sr_at = now
                self._read_blocks(p.reports, now)
            elif isinstance(p, ReceiverReport):
                self._read_blocks(p.reports, now)
            elif isinstance(p, Goodbye):
                self.bye_received = p
        return packets

    def _read_blocks(self, reports: tuple[ReportBlock, ...], now: int) -> None:
        for block in reports:
            if block.ssrc != self.ssrc:
                continue
            self.remote = block
            if block.lsr:  # §6.4.1: RTT = A - LSR - DLSR, all in 1/65536 s
                arrival = (self._ntp(now) >> 16) & 0xFFFFFFFF
                rtt = (arrival - block.lsr - block.dlsr) & 0xFFFFFFFF
                if rtt < 0x80000000:  # a negative result (clock trouble) is ignored
                    self.rtt_ms = rtt * 1000 / 65536

    def qos(self) -> QoS:
        r = self.receiver
        expected = r.expected
        remote = self.remote
        return QoS(
            jitter_ms=r.jitter * 1000 / self._rate,
            packets_lost=r.cumulative_lost,
            loss_fraction=max(0, r.cumulative_lost) / expected if expected else 0.0,
            fraction_lost_last=self._fraction_last / 256,
            rtt_ms=self.rtt_ms,
            packets_in=r.received,
            octets_in=r.octets,
            packets_out=self.packets_sent,
            octets_out=self.octets_sent,
            remote_jitter_ms=remote.jitter * 1000 / self._rate if remote else None,
            remote_fraction_lost=remote.fraction_lost / 256 if remote else None,
            remote_cumulative_lost=remote.cumulative_lost if remote else None,
        )
