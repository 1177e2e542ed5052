"""The per-call media core end to end on virtual time: two streams wired back to back."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from rtp.dtmf import DtmfDigit
from rtp.g711 import ulaw_decode
from rtp.jitter import FrameKind
from rtp.packet import Drop, RtpPacket, build, parse
from rtp.rtcp import Goodbye, ReceiverReport, SenderReport, parse_compound
from rtp.stream import RtcpReceived, RtpStream, StreamConfig
from rtp.units import NS_PER_MS as MS
from tests.support.media_paths import media_path

__all__ = ["media_path"]  # the fixture, from the shared harness

pytestmark = pytest.mark.usefixtures("media_path")  # on each media path (rtp.speedups)

A_ADDR = ("127.0.0.1", 40000)
B_ADDR = ("127.0.0.1", 50000)


def stream(local_ssrc: int, remote: tuple[str, int], **kw: Any) -> RtpStream:
    cfg = StreamConfig(
        ssrc=local_ssrc,
        initial_seq=65530,
        initial_timestamp=2**32 - 480,
        cname=f"{local_ssrc}@t",
        remote=remote,
        **kw,
    )
    return RtpStream(cfg, rand=lambda: 0.5)


def sent(view: memoryview | None) -> RtpPacket:
    assert view is not None
    p = parse(bytes(view))
    assert isinstance(p, RtpPacket)
    return p


def test_provider_pcmu_goes_on_the_wire_byte_for_byte_with_continuous_seq_and_timestamp() -> None:
    a = stream(0xA, B_ADDR)
    frames = [bytes((i * 7 + j) % 256 for j in range(160)) for i in range(6)]  # includes 0x7F and 0xFF codes
    out = [sent(a.next_packet(f, i * 20 * MS)) for i, f in enumerate(frames)]
    assert [p.payload for p in out] == frames
    assert [p.seq for p in out] == [65530, 65531, 65532, 65533, 65534, 65535]
    assert [p.timestamp for p in out] == [(2**32 - 480 + 160 * i) % 2**32 for i in range(6)]
    assert [p.marker for p in out] == [True] + [False] * 5
    assert {p.ssrc for p in out} == {0xA} and {p.pt for p in out} == {0}
    assert a.destination == B_ADDR


def test_silence_and_epoch_changes_do_not_break_continuity_and_skips_advance_the_clock() -> None:
    a = stream(0xA, B_ADDR)
    p0 = sent(a.next_packet(b"\x01" * 160, 0))
    p1 = sent(a.next_packet(None, 20 * MS))  # nothing queued (e.g. after a barge-in clear): idle pattern
    assert p1.payload == b"\xff" * 160 and p1.seq == (p0.seq + 1) & 0xFFFF and not p1.marker
    a.skip(3)  # the media clock skipped three slots
    p2 = sent(a.next_packet(b"\x02" * 160, 100 * MS))
    assert p2.seq == (p1.seq + 1) & 0xFFFF
    assert p2.timestamp == (p1.timestamp + 4 * 160) & 0xFFFFFFFF and p2.marker
    with pytest.raises(ValueError):
        a.next_packet(b"\x00" * 1300, 120 * MS)


def test_received_audio_comes_out_as_pcm_frames_one_per_slot() -> None:
    a, b = stream(0xA, B_ADDR), stream(0xB, A_ADDR)
    payloads = [bytes([0x10 + i]) * 160 for i in range(5)]
    frames = []
    for i, pl in enumerate(payloads):
        dgram = a.next_packet(pl, i * 20 * MS)
        assert dgram is not None
        assert b.receive(bytes(dgram), A_ADDR, i * 20 * MS + 2 * MS) is None
        frames.append(b.pull_frame(i * 20 * MS + 10 * MS))
    assert [f.pcm for f in frames if f] == [ulaw_decode(pl) for pl in payloads]
    assert all(f is not None and f.kind is FrameKind.AUDIO and len(f.pcm) == 320 for f in frames)
    assert b.qos().packets_in == 4  # the first packet is on A.1 probation
    assert b.counters()["frames_played"] == 5


def test_every_drop_reason_is_counted_and_nothing_raises() -> None:
    b = stream(0xB, A_ADDR)
    good = build(0, False, 1, 160, 0xA, b"\x55" * 160)
    assert b.receive(b"\x80", A_ADDR, 0) is None
    assert b.receive(b"\x00" * 20, A_ADDR, 0) is None
    assert b.receive(good, ("127.0.0.1", 1), 0) is None  # not the signalled source
    assert b.receive(build(96, False, 2, 320, 0xA, b"x"), A_ADDR, 0) is None
    assert b.receive(good, A_ADDR, 0) is None
    assert b.receive(good, A_ADDR, MS) is None  # duplicate
    assert b.receive(build(13, False, 3, 480, 0xA, b"\x40"), A_ADDR, 2 * MS) is None  # comfort noise
    c = b.counters()
    assert c["drop_too_short"] == 1 and c["drop_bad_version"] == 1 and c["drop_wrong_source"] == 1
    assert c["drop_unknown_pt"] == 1 and c["drop_duplicate"] == 1 and c["comfort_noise"] == 1


def test_dtmf_in_gives_one_digit_per_event() -> None:
    b = stream(0xB, A_ADDR)
    got = []
    for i, (dur, end) in enumerate(
        [(400, False), (800, False), (1200, False), (1280, True), (1280, True), (1280, True)]
    ):
        payload = struct.pack("!BBH", 3, (0x80 if end else 0) | 10, dur)
        got.append(b.receive(build(101, False, 10 + i, 8000, 0xA, payload), A_ADDR, i * 20 * MS))
    assert [g for g in got if g is not None] == [DtmfDigit("3", 160, 8000, "end")]


def test_dtmf_lost_end_comes_from_handle_timer() -> None:
    b = stream(0xB, A_ADDR)
    b.receive(build(101, True, 1, 8000, 0xA, struct.pack("!BBH", 7, 10, 400)), A_ADDR, 0)
    deadline = b.next_deadline()
    assert deadline == 400 * MS
    assert DtmfDigit("7", 50, 8000, "timeout") in b.handle_timer(deadline)


def test_dtmf_out_replaces_audio_and_keeps_the_clock() -> None:
    a = stream(0xA, B_ADDR)
    a.next_packet(b"\x01" * 160, 0)
    a.send_dtmf("9")
    log = []
    for n in range(1, 14):
        now = n * 20 * MS
        wants = a.wants_audio(now)
        dgram = a.next_packet(b"\x02" * 160 if wants else None, now)
        log.append((n, wants, None if dgram is None else sent(dgram)))
    dtmf = [(n, p) for n, w, p in log if p is not None and p.pt == 101]
    assert [n for n, _ in dtmf] == [1, 4, 6, 9, 10, 11]
    assert {p.timestamp for _, p in dtmf} == {(2**32 - 480 + 160) % 2**32}
    assert [p.marker for _, p in dtmf] == [True] + [False] * 5
    assert all(not w for n, w, _ in log if n <= 11) and all(w for n, w, _ in log if n > 11)
    audio = [p for n, w, p in log if p is not None and p.pt == 0]
    assert audio[0].timestamp == (2**32 - 480 + 12 * 160) % 2**32  # the clock ran on under the event
    seqs = [p.seq for _, _, p in log if p is not None]
    assert seqs == [(65531 + i) % 65536 for i in range(len(seqs))]  # one sequence space, no gaps
    with pytest.raises(ValueError):
        stream(0xC, B_ADDR, dtmf_payload_type=None).send_dtmf("1")


def test_rtcp_reports_flow_both_ways_and_give_rtt() -> None:
    a, b = stream(0xA, B_ADDR), stream(0xB, A_ADDR)
    now = 0
    for n in range(300):  # 6 s of audio both ways, 5 ms one-way delay
        now = n * 20 * MS
        for src, dst, src_addr in ((a, b, A_ADDR), (b, a, B_ADDR)):
            dgram = src.next_packet(b"\x33" * 160, now)
            assert dgram is not None
            dst.receive(bytes(dgram), src_addr, now + 5 * MS)
            dst.pull_frame(now + 10 * MS)
        for src, dst, src_addr in ((a, b, A_ADDR), (b, a, B_ADDR)):
            for item in src.handle_timer(now):
                assert isinstance(item, bytes)
                r = dst.receive_rtcp(item, (src_addr[0], src_addr[1] + 1), now + 5 * MS)
                assert isinstance(r, RtcpReceived) and isinstance(r.packets[0], SenderReport)
    qa = a.qos()
    assert qa.rtt_ms == pytest.approx(10.0, abs=0.1)
    assert qa.packets_out == 300 and qa.octets_out == 300 * 160 and qa.packets_lost == 0
    assert qa.remote_fraction_lost == 0.0 and qa.jitter_ms == 0.0
    assert a.rtcp_destination == ("127.0.0.1", 50001)  # where b's RTCP came from


def test_rtcp_mux_is_demultiplexed_from_the_rtp_socket() -> None:
    a, b = stream(0xA, B_ADDR, rtcp_mux=True), stream(0xB, A_ADDR, rtcp_mux=True)
    a.next_packet(b"\x01" * 160, 0)
    report = a.rtcp.build_report(MS)
    r = b.receive(report, A_ADDR, MS)
    assert isinstance(r, RtcpReceived) and r.bye is None
    assert b.receive(b"\x80\xc9\x00\x09", A_ADDR, MS) is None  # truncated RR
    assert b.counters()["drop_bad_rtcp"] == 1
    assert b.rtcp_destination == A_ADDR


def test_goodbye_and_ssrc_change() -> None:
    a, b = stream(0xA, B_ADDR), stream(0xB, A_ADDR)
    bye = parse_compound(a.goodbye(0, "bye"))
    assert not isinstance(bye, Drop)
    assert isinstance(bye[0], ReceiverReport) and bye[-1] == Goodbye((0xA,), "bye")
    r = b.receive_rtcp(a.goodbye(0), A_ADDR, 0)
    assert isinstance(r, RtcpReceived) and r.bye == Goodbye((0xA,), None)
    for i, ssrc in enumerate([1, 1, 1, 2, 2]):
        b.receive(
            build(0, False, 100 + i if ssrc == 1 else 7 + i, 160 * i, ssrc, b"\x22" * 160),
            A_ADDR,
            i * 20 * MS,
        )
        b.pull_frame(i * 20 * MS + 10 * MS)
    assert b.counters()["ssrc_changes"] == 1 and b.jitter.resets == 1


def test_nat_mode_latches_and_answers_the_latched_source() -> None:
    b = stream(0xB, ("10.0.0.5", 4000), nat=True)
    natted = ("198.51.100.7", 31000)
    b.receive(build(0, False, 1, 160, 0xA, b"\x22" * 160), natted, 0)
    assert b.destination == natted
    assert b.rtcp_destination == ("198.51.100.7", 31001)


def test_qos_carries_jitter_buffer_figures_and_is_json_ready() -> None:
    a, b = stream(0xA, B_ADDR), stream(0xB, A_ADDR)
    dgrams = [bytes(d) for d in (a.next_packet(bytes([0x20 + i]) * 160, i * 20 * MS) for i in range(6)) if d]
    order = [0, 1, 3, 2, 4, 5]  # 2 arrives after its slot was concealed
    for n, k in enumerate(order):
        b.receive(dgrams[k], A_ADDR, n * 20 * MS + 2 * MS)
        b.pull_frame(n * 20 * MS + 10 * MS)
    q = b.qos()
    assert q.late_packets == 1 and q.frames_concealed == 2  # the lost slot, then one held to grow the buffer
    d = q.as_dict()
    assert d["late_packets"] == 1 and d["packets_in"] == 5 and "rtt_ms" in d


def test_rtcp_schedule_starts_with_the_first_packet_received() -> None:
    b = stream(0xB, A_ADDR)
    assert b.next_deadline() is None
    b.receive(build(0, False, 1, 160, 0xA, b"\x22" * 160), A_ADDR, 7 * MS)
    assert b.next_deadline() == 7 * MS + 2_500 * MS  # half of 5 s, factor 1.0 from rand() == 0.5
    (report,) = b.handle_timer(7 * MS + 2_500 * MS)
    assert isinstance(report, bytes)
    packets = parse_compound(report)
    assert not isinstance(packets, Drop) and isinstance(packets[0], ReceiverReport)  # nothing sent: RR


def test_sr_timestamp_follows_the_media_clock_during_dtmf() -> None:
    a = stream(0xA, B_ADDR)
    for n in range(3):
        a.next_packet(b"\x01" * 160, n * 20 * MS)
    a.send_dtmf("1")
    for n in range(3, 8):
        a.next_packet(None, n * 20 * MS)  # DTMF packets carry the event's (older) timestamp
    packets = parse_compound(a.rtcp.build_report(7 * 20 * MS))
    assert not isinstance(packets, Drop)
    sr = packets[0]
    assert isinstance(sr, SenderReport)
    assert sr.rtp_timestamp == (2**32 - 480 + 7 * 160) % 2**32  # the slot sent at 140 ms, not the event's


def test_two_digits_ended_by_one_packet_both_come_out() -> None:
    b = stream(0xB, A_ADDR)
    b.receive(build(101, True, 1, 8000, 0xA, struct.pack("!BBH", 4, 10, 400)), A_ADDR, 0)
    first = b.receive(
        build(101, True, 2, 9600, 0xA, struct.pack("!BBH", 6, 0x80 | 10, 800)), A_ADDR, 300 * MS
    )
    assert first == DtmfDigit("4", 50, 8000, "next")
    assert b.next_deadline() == 300 * MS
    assert b.handle_timer(300 * MS) == [DtmfDigit("6", 100, 9600, "end")]


def test_digits_waiting_keep_the_earliest_deadline() -> None:
    b = stream(0xB, A_ADDR)

    def event(code: int, ts: int, end: bool, now: int) -> DtmfDigit | object:
        payload = struct.pack("!BBH", code, (0x80 if end else 0) | 10, 400)
        return b.receive(build(101, True, ts // 160, ts, 0xA, payload), A_ADDR, now)

    event(1, 8000, False, 0)
    assert event(2, 9600, True, 100 * MS) == DtmfDigit("1", 50, 8000, "next")  # the '2' waits
    event(3, 11200, False, 110 * MS)
    assert event(4, 12800, True, 120 * MS) == DtmfDigit("3", 50, 11200, "next")
    assert b.next_deadline() == 100 * MS  # not pushed back to 120 ms by the second pair
    assert [d.digit for d in b.handle_timer(100 * MS) if isinstance(d, DtmfDigit)] == ["2", "4"]


def test_one_media_clock_drives_every_stream_and_media_time_tracks_wall_time() -> None:
    from rtp.pacer import MediaClock

    clock = MediaClock(t0=0, max_catch_up=2)
    streams = [stream(0x100 + i, B_ADDR) for i in range(3)]
    wakes = [0, 20, 41, 60, 145, 160, 180, 300, 320]  # late at 41 (fine), 145 (two skipped), 300 (four)
    sent_ts: dict[int, list[tuple[int, int]]] = {i: [] for i in range(3)}
    for ms in wakes:
        tick = clock.tick(ms * MS)
        for i, s in enumerate(streams):
            s.skip(tick.skipped)
            for slot in range(tick.first, tick.first + tick.due):
                p = sent(s.next_packet(b"\x11" * 160, ms * MS))
                sent_ts[i].append((slot, p.timestamp))
    for i in range(3):
        # whatever was skipped, the timestamp of every packet is the initial one plus 160 per slot
        assert all(ts == (2**32 - 480 + 160 * slot) % 2**32 for slot, ts in sent_ts[i])
        assert [slot for slot, _ in sent_ts[i]] == [0, 1, 2, 3, 6, 7, 8, 9, 14, 15, 16]
    assert clock.slots_skipped == 6 and streams[0].slots_skipped == 6


def test_pcmu_at_a_dynamic_payload_type_runs_as_the_sdp_named_it() -> None:
    # an offer may map PCMU/8000 to a dynamic PT (sip.core.offer_answer answers it); the stream takes the codec
    # by name: before, any PT but 0 and 8 was refused and the call's media never started
    a, b = (
        stream(0xA, B_ADDR, payload_type=98, codec="PCMU"),
        stream(0xB, A_ADDR, payload_type=98, codec="PCMU"),
    )
    voice = bytes(range(160))
    out = sent(a.next_packet(voice, 0))
    assert out.pt == 98 and out.payload == voice
    b.receive(bytes(a.next_packet(voice, 20 * MS) or b""), A_ADDR, 21 * MS)
    frame = b.pull_frame(30 * MS)
    assert frame is not None and frame.kind is FrameKind.AUDIO and frame.pcm == ulaw_decode(voice)
