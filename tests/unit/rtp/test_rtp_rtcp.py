"""RTCP: SR/RR/SDES/BYE wire format, RFC 3550 A.1/A.3/A.8 statistics against hand-computed values, RTT
from LSR/DLSR, the report schedule and the qos() snapshot."""

from __future__ import annotations

import struct

import pytest

from rtp.packet import Drop
from rtp.rtcp import (
    Goodbye,
    ReceiverReport,
    ReceiverStats,
    ReportBlock,
    RtcpSession,
    SenderReport,
    SourceDescription,
    build_bye,
    build_rr,
    build_sdes,
    build_sr,
    ntp_from_ns,
    parse_compound,
)
from rtp.units import NS_PER_MS as MS
from rtp.units import NS_PER_S as S

US, THEM = 0x11111111, 0x22222222


def feed(
    stats: ReceiverStats, seqs: list[int], start_ts: int = 0, arrivals_ms: list[float] | None = None
) -> None:
    for i, seq in enumerate(seqs):
        arrival = int((arrivals_ms[i] if arrivals_ms else 20 * i) * MS)
        stats.update(seq & 0xFFFF, start_ts + 160 * i, arrival, 160)


def test_a1_probation_then_a3_cumulative_and_fractional_loss() -> None:
    stats = ReceiverStats()
    stats.reset(THEM)
    # 100 is on probation (A.1, MIN_SEQUENTIAL 2), 101 validates the source; 103 and 105 are lost
    for seq in [100, 101, 102, 104, 106, 107, 108, 109]:
        stats.update(seq, 0, 0, 160)
    assert stats.received == 7 and stats.extended_max == 109 and stats.expected == 9
    assert stats.cumulative_lost == 2
    block = stats.report_block(0, 0)
    assert block.fraction_lost == (2 << 8) // 9 == 56  # A.3: lost_interval << 8 / expected_interval
    assert block.cumulative_lost == 2 and block.highest_seq == 109
    for seq in range(110, 120):
        stats.update(seq, 0, 0, 160)
    block = stats.report_block(0, 0)
    assert block.fraction_lost == 0 and block.cumulative_lost == 2 and block.highest_seq == 119


def test_a1_extended_highest_sequence_counts_wrap_cycles() -> None:
    stats = ReceiverStats()
    stats.reset(THEM)
    feed(stats, [65533, 65534, 65535, 0, 1, 2])
    assert stats.cycles == 65536 and stats.extended_max == 65536 + 2
    assert stats.cumulative_lost == 0 and stats.expected == 5


def test_duplicates_make_cumulative_loss_negative_as_the_rfc_allows() -> None:
    stats = ReceiverStats()
    stats.reset(THEM)
    feed(stats, [1, 2, 3, 3, 3, 4])
    assert stats.received == 5 and stats.expected == 3  # base 2 .. max 4
    assert stats.cumulative_lost == -2
    assert stats.report_block(0, 0).fraction_lost == 0


def test_a1_restart_after_a_large_jump_needs_two_sequential_packets() -> None:
    stats = ReceiverStats()
    stats.reset(THEM)
    feed(stats, [10, 11, 12])
    assert not stats.update(40000, 0, 0, 160)  # a wild jump is not believed at once
    assert stats.update(40001, 0, 0, 160)  # confirmed: the sender restarted
    assert stats.base_seq == 40001 and stats.extended_max == 40001


def test_a8_interarrival_jitter_matches_the_hand_computed_integer_value() -> None:
    stats = ReceiverStats()
    stats.reset(THEM)
    # timestamps 160 apart; arrivals 0, 20, 45, 60, 80 ms -> transit 0, 0, 40, 0, 0 (timestamp units)
    feed(stats, [1, 2, 3, 4, 5], arrivals_ms=[0, 20, 45, 60, 80])
    # packet 1 is on probation; from packet 2: J16 = 40 - 0 = 40; 40 + 40 - 3 = 77; 77 + 0 - 5 = 72
    assert stats.jitter16 == 72 and stats.jitter == 4
    # the floating-point form of A.8 gives 4.54 for the same arrivals
    j = 0.0
    for d in (40, 40, 0):
        j += (d - j) / 16
    assert int(j) == stats.jitter


def test_sr_rr_sdes_bye_compound_round_trip() -> None:
    block = ReportBlock(THEM, 56, -3, 70000, 12, 0xAABBCCDD, 32768)
    sr = SenderReport(US, ntp_from_ns(1_700_000_000 * S), 123456, 500, 80000, (block,))
    rr = ReceiverReport(US, (block, block))
    data = build_sr(sr) + build_rr(rr) + build_sdes(US, "parlora@bridge") + build_bye((US, THEM), "hang-up")
    assert len(data) % 4 == 0
    packets = parse_compound(data)
    assert packets == [sr, rr, SourceDescription(((US, "parlora@bridge"),)), Goodbye((US, THEM), "hang-up")]


def test_wire_layout_of_an_rr_is_exact() -> None:
    data = build_rr(ReceiverReport(US, (ReportBlock(THEM, 1, 2, 3, 4, 5, 6),)))
    assert data[:4] == bytes([0x81, 201, 0, 7])  # V=2 RC=1, PT=201, length 7 words (32 bytes)
    assert struct.unpack("!IIIIIII", data[4:]) == (US, THEM, (1 << 24) | 2, 3, 4, 5, 6)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80\xc8",
        bytes([0x40, 201, 0, 1]) + b"\x00" * 4,  # version 1
        bytes([0x81, 201, 0, 1]) + b"\x00" * 4,  # RC 1 but no block
        bytes([0x80, 201, 0, 9]) + b"\x00" * 4,  # length past the end
        bytes([0x81, 202, 0, 2]) + struct.pack("!I", 1) + bytes([1, 200, 0, 0]),  # SDES item too long
        bytes([0x82, 203, 0, 1]) + b"\x00" * 4,  # BYE count 2, one SSRC
        bytes([0xA0, 201, 0, 1]) + b"\x00\x00\x00\x00",  # padding count 0
    ],
)
def test_malformed_rtcp_is_a_drop_reason(data: bytes) -> None:
    assert parse_compound(data) is Drop.BAD_RTCP


def test_unknown_packet_types_are_skipped() -> None:
    app = bytes([0x80, 204, 0, 2]) + b"\x00" * 8
    packets = parse_compound(build_rr(ReceiverReport(US, ())) + app + build_bye((US,)))
    assert packets == [ReceiverReport(US, ()), Goodbye((US,), None)]


def session(rand: float = 0.5, offset: int = 1_700_000_000 * S) -> RtcpSession:
    return RtcpSession(US, "us@test", lambda: rand, wallclock_offset_ns=offset)


def test_round_trip_time_from_lsr_and_dlsr() -> None:
    ours = session()
    ours.on_rtp_sent(8000, 160, 1 * S)
    report = ours.build_report(1 * S)
    sr = parse_compound(report)
    assert not isinstance(sr, Drop) and isinstance(sr[0], SenderReport)
    lsr = (sr[0].ntp >> 16) & 0xFFFFFFFF
    # the peer holds our SR 500 ms, then reports; it arrives 600 ms after we sent it: RTT 100 ms
    rr = build_rr(ReceiverReport(THEM, (ReportBlock(US, 0, 0, 0, 0, lsr, 32768),)))
    ours.receive(rr, 1 * S + 600 * MS)
    assert ours.rtt_ms == pytest.approx(100.0, abs=0.05)


def test_our_reports_carry_lsr_and_dlsr_of_the_peers_sr() -> None:
    ours = session()
    for i in range(5):
        ours.receiver.update(i, 160 * i, i * 20 * MS, 160)
    ours.receiver.ssrc = THEM
    their_ntp = (0x12345678 << 32) | 0x9ABC0000
    ours.receive(build_sr(SenderReport(THEM, their_ntp, 0, 10, 1600, ())), 2 * S)
    packets = parse_compound(ours.build_report(2 * S + 250 * MS))
    assert not isinstance(packets, Drop)
    rr = packets[0]
    assert isinstance(rr, ReceiverReport)  # we sent no RTP yet: RR, not SR
    (block,) = rr.reports
    assert block.ssrc == THEM and block.lsr == 0x56789ABC and block.dlsr == 16384  # 0.25 s in 1/65536 s
    assert isinstance(packets[1], SourceDescription) and packets[1].chunks == ((US, "us@test"),)


def test_sr_sender_info_counts_and_rtp_timestamp_follows_the_clock() -> None:
    ours = session()
    for i in range(50):
        ours.on_rtp_sent(1000 + 160 * i, 160, i * 20 * MS)
    packets = parse_compound(ours.build_report(49 * 20 * MS + 10 * MS))
    assert not isinstance(packets, Drop)
    sr = packets[0]
    assert isinstance(sr, SenderReport)
    assert (sr.packet_count, sr.octet_count) == (50, 8000)
    assert sr.rtp_timestamp == 1000 + 160 * 49 + 80  # 10 ms after the last packet's timestamp
    assert sr.ntp == ntp_from_ns(1_700_000_000 * S + 49 * 20 * MS + 10 * MS)


def test_ntp_conversion() -> None:
    assert ntp_from_ns(0) == 2_208_988_800 << 32
    assert ntp_from_ns(S // 2) & 0xFFFFFFFF == 1 << 31


def test_schedule_is_half_an_interval_first_then_randomised_around_5_s() -> None:
    ours = session(rand=0.5)  # factor 1.0
    assert ours.next_deadline() is None and ours.handle_timer(10 * S) is None
    ours.start(0)
    assert ours.next_deadline() == 2_500 * MS
    assert ours.handle_timer(2_499 * MS) is None
    assert ours.handle_timer(2_500 * MS) is not None
    assert ours.next_deadline() == 7_500 * MS
    low, high = session(rand=0.0), session(rand=0.999999)
    low.start(0)
    high.start(0)
    assert low.next_deadline() == 1_250 * MS and high.next_deadline() == pytest.approx(3_750 * MS, abs=MS)


def test_goodbye_is_a_report_then_bye_and_stops_the_schedule() -> None:
    ours = session()
    ours.start(0)
    packets = parse_compound(ours.build_goodbye(1 * S, "call ended"))
    assert not isinstance(packets, Drop)
    assert isinstance(packets[0], ReceiverReport) and packets[-1] == Goodbye((US,), "call ended")
    assert ours.next_deadline() is None


def test_qos_snapshot() -> None:
    ours = session()
    ours.receiver.reset(THEM)
    feed(ours.receiver, [1, 2, 3, 4, 5], arrivals_ms=[0, 20, 45, 60, 80])
    ours.on_rtp_sent(0, 160, 0)
    ours.receive(build_rr(ReceiverReport(THEM, (ReportBlock(US, 64, 7, 0, 80, 0, 0),))), S)
    q = ours.qos()
    assert q.jitter_ms == pytest.approx(0.5)  # 4 timestamp units at 8 kHz
    assert (q.packets_in, q.octets_in, q.packets_out, q.octets_out) == (4, 640, 1, 160)
    assert q.packets_lost == 0 and q.rtt_ms is None  # LSR 0: no RTT yet
    assert q.remote_fraction_lost == 0.25 and q.remote_cumulative_lost == 7 and q.remote_jitter_ms == 10.0


def test_telephone_events_count_for_loss_but_not_for_jitter() -> None:
    stats = ReceiverStats()
    stats.reset(THEM)
    feed(stats, [1, 2, 3])  # audio at 0, 20, 40 ms, timestamps 0, 160, 320
    for i, seq in enumerate([4, 5, 6]):  # an event: one timestamp while time runs on
        stats.update(seq, 480, (60 + 50 * i) * MS, 4, timing=False)
    stats.update(7, 480 + 160 * 8, 60 * MS + 160 * MS, 160)  # audio again, on time
    assert stats.jitter16 == 0 and stats.received == 6 and stats.cumulative_lost == 0
