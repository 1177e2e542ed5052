"""The benchmark's pure helpers (tests/bench/stats.py): percentiles, packet intervals, pcap/RTP parsing, the
probe's content matching and the log lines it reads. No processes, no clocks."""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import stats

from rtp.g711 import ulaw_decode
from rtp.units import NS_PER_MS as MS


def test_percentile_interpolates_between_ranks_like_numpy() -> None:
    values = list(range(1, 101))
    assert stats.percentile(values, 50) == pytest.approx(50.5)
    assert stats.percentile(values, 99) == pytest.approx(99.01)
    assert stats.percentile(values, 100) == 100
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile([], 50) is None
    assert stats.summary([20.0, 20.0, 40.0], 1) == {"n": 3, "p50": 20.0, "p99": 39.6, "max": 40.0}
    assert stats.summary([]) == {"n": 0, "p50": None, "p99": None, "max": None}


def test_intervals_and_cpu_from_proc_text() -> None:
    assert stats.intervals_ms([1.0, 1.02, 1.041, 1.061]) == pytest.approx([20.0, 21.0, 20.0])
    assert stats.intervals_ms([5.0]) == []
    stat = "1234 (python (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 4"
    assert stats.proc_stat_cpu_seconds(stat, 100) == pytest.approx(3.0)
    assert stats.cpu_percent(1.0, 1.5, 10.0) == pytest.approx(5.0)
    assert stats.proc_status_rss_mb("Name:\tpython\nVmRSS:\t  57344 kB\n") == pytest.approx(56.0)
    host = "cpu  100 5 50 1000 20 3 2 0 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n"
    assert stats.host_cpu_busy_seconds(host, 100) == pytest.approx(1.6)  # 100+5+50+3+2 ticks


def _rtp(seq: int, ssrc: int, body: bytes, pt: int = 0) -> bytes:
    return struct.pack("!BBHII", 0x80, pt, seq, seq * 160, ssrc) + body


def _pcap(path: Path, packets: list[tuple[float, int, int, bytes]]) -> Path:
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))  # Ethernet, µs
    for t, sport, dport, payload in packets:
        udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
        ip = (
            struct.pack(
                "!BBHHHBBH4s4s",
                0x45,
                0,
                20 + len(udp),
                0,
                0,
                64,
                17,
                0,
                bytes([127, 0, 0, 1]),
                bytes([127, 0, 0, 1]),
            )
            + udp
        )
        frame = bytes(12) + b"\x08\x00" + ip
        sec = int(t)
        out += struct.pack("<IIII", sec, round((t - sec) * 1e6), len(frame), len(frame)) + frame
    path.write_bytes(bytes(out))
    return path


def test_pcap_rtp_and_intervals_per_stream(tmp_path: Path) -> None:
    voice = bytes([0x10]) * 160
    packets = [(100.0 + 0.02 * i, 4000, 30000, _rtp(i, 7, voice)) for i in range(5)]
    packets += [(100.005 + 0.021 * i, 4002, 30002, _rtp(i, 9, bytes([0xFF]) * 160)) for i in range(3)]
    packets += [
        (100.01, 30000, 4000, _rtp(1, 3, voice)),
        (100.03, 4001, 30001, b"\x81\xc8" + bytes(26)),
    ]  # RTCP
    parsed = stats.read_pcap(_pcap(tmp_path / "c.pcap", packets))
    assert len(parsed) == len(packets)
    assert parsed[0].sport == 4000 and parsed[0].dport == 30000 and parsed[0].src == "127.0.0.1"
    rtp = stats.parse_rtp(parsed[0].payload)
    assert rtp is not None and (rtp.pt, rtp.ssrc, rtp.body) == (0, 7, voice)
    assert stats.parse_rtp(parsed[-1].payload) is None  # RTCP
    gaps = stats.rtp_intervals_ms(parsed, {4000, 4002, 4001}, 100.0, 100.07)
    assert sorted(gaps) == [(4000, 7), (4002, 9)]
    assert gaps[(4000, 7)] == pytest.approx([20.0, 20.0, 20.0])  # packets at 100.08 are outside the window
    assert gaps[(4002, 9)] == pytest.approx([21.0, 21.0])
    assert stats.ulaw_dbfs(bytes([0xFF]) * 160) == float("-inf")
    assert stats.ulaw_dbfs(voice) > -10


def test_barge_in_on_the_wire(tmp_path: Path) -> None:
    loud, quiet = bytes([0x10]) * 160, bytes([0xFF]) * 160
    packets = []
    for i in range(100):  # 2 s, 20 ms apart
        t = 10.0 + 0.02 * i
        caller_talks = i >= 50  # from 11.0 s
        assistant_talks = 20 <= i < 54  # 10.4 s .. 11.06 s: stops 3 packets after the caller starts
        packets.append(
            stats.Packet(
                t, "127.0.0.1", 30000, "127.0.0.1", 4000, _rtp(i, 1, loud if caller_talks else quiet)
            )
        )
        packets.append(
            stats.Packet(
                t + 0.001,
                "127.0.0.1",
                4000,
                "127.0.0.1",
                30000,
                _rtp(i, 2, loud if assistant_talks else quiet),
            )
        )
    (reaction,) = stats.wire_barge_ins(packets, 4000, 0.0, 20.0)
    assert reaction == pytest.approx(61.0)  # last assistant packet at 11.061, the caller's onset at 11.0
    assert stats.wire_barge_ins(packets, 4000, 11.5, 20.0) == []  # onset outside the window


def test_probe_pairs_frames_by_content_and_skips_repeats_and_silence() -> None:
    a, b, silence = zlib.crc32(b"a"), zlib.crc32(b"b"), zlib.crc32(bytes(320))
    src = ([1000 * MS, 1020 * MS, 1040 * MS, 1500 * MS, 3000 * MS], [a, silence, b, b, a])
    dst = (
        [1000 * MS + 300_000, 1021 * MS, 1501 * MS, 3002 * MS, 4000 * MS],
        [a, silence, b, a, zlib.crc32(b"c")],
    )
    got, unpaired = stats.match_forward(src, dst, t0=0, t1=10_000 * MS)
    # a -> 0.3 ms; silence skipped; b repeated 460 ms apart: ambiguous; the later a pairs with its own; c unknown
    assert got == pytest.approx([0.3, 2.0])
    assert unpaired == 2


def test_provider_chunks_to_transmitted_frames() -> None:
    speech = np.random.default_rng(1).integers(0, 256, 640, dtype=np.uint8).tobytes()  # 80 ms of µ-law noise
    chunks = [(0, speech[:320]), (40 * MS, speech[320:])]  # two 40 ms chunks, the second 40 ms later
    pcm = ulaw_decode(speech)
    frames = (
        [5 * MS, 25 * MS, 45 * MS, 65 * MS],
        [zlib.crc32(pcm[i * 320 : (i + 1) * 320]) for i in range(4)],
    )
    got, unpaired = stats.match_chunks_to_frames(chunks, frames, ulaw_decode, t0=0, t1=10**12)
    assert got == pytest.approx([5.0, 25.0, 5.0, 25.0]) and unpaired == 0
    # first frames: a chunk run at 0 and one at 1 s; frames at 19 ms (then every 20) and at 1.018 s
    first = stats.first_frame_latencies(
        [0, 40 * MS, 1000 * MS], [19 * MS, 39 * MS, 59 * MS, 1018 * MS], t0=0, t1=10**12
    )
    assert first == pytest.approx([19.0, 18.0])


def test_log_lines_and_sdp_ports() -> None:
    lines = [
        "2026-12-01 01:24:24,310 INFO parlora.session: call call-1 barge-in (local_vad) at 3108 ms: cleared 200 ms "
        "of output; heard [('out-1', 840)]; last assistant frame left -0.4 ms from the event",
        "call call-2 barge-in (local_vad) at 10 ms: cleared 0 ms of output; heard nothing interrupted; last assistant "
        "frame left n/a from the event",
        "WARNING parlora.session: call call-1 output_recovery awaiting_user: token 2, cause output_overflow, 2 ms since the condition",
        "WARNING parlora.session: call call-1 output_recovery done: token 2, cause output_overflow, 2613 ms since the condition",
    ]
    assert stats.barge_in_reactions(lines) == [-0.4]
    assert stats.recovery_stages(lines) == {"awaiting_user": [2], "done": [2613]}
    log = (
        "----------------------------------------------- 2026-12-01 01:24:21.167638\nUDP message sent (582 bytes):\n\n"
        "INVITE sip:bridge@127.0.0.1:5060 SIP/2.0\nm=audio 34893 RTP/AVP 0 101\n\n"
        "----------------------------------------------- 2026-12-01 01:24:21.206905\nUDP message received [816] bytes :\n\n"
        "SIP/2.0 200 OK\nm=audio 40066 RTP/AVP 0 101\n\n"
        "----------------------------------------------- 2026-12-01 01:24:21.706856\nUDP message received [816] bytes :\n\n"
        "SIP/2.0 200 OK\nm=audio 40066 RTP/AVP 0 101\n"
    )
    assert stats.sdp_audio_ports(log) == ([40066], [34893])


def test_an_append_of_two_caller_frames_is_noted_as_two_frames_at_its_write() -> None:
    """`ws_sent` keys each 20 ms of an append, so the caller's frames (`media_in`) are followed through the
    session's pairs (and `--provider-append-ms` above 20); a whole-append key matched no frame."""
    import base64

    from rtp import probe
    from rtp.g711 import ulaw_encode

    pcm = np.random.default_rng(2).integers(-8000, 8000, 320, dtype="<i2").tobytes()  # two 20 ms frames
    ulaw = ulaw_encode(pcm)
    frame = '{"type":"input_audio_buffer.append","audio":"' + base64.b64encode(ulaw).decode() + '"}'
    probe.ws_sent("probe-test-call", 7 * MS, frame)
    times, keys = probe._records.pop("probe-test-call")["ws_sent"]
    decoded = ulaw_decode(ulaw)
    assert list(times) == [7 * MS, 7 * MS]
    assert list(keys) == [probe.key(decoded[:320]), probe.key(decoded[320:])]
