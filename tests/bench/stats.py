"""Pure helpers of the benchmark (tests/bench/run.py): percentiles, packet timing, pcap/RTP parsing, the
probe's content matching and log parsing. No processes, no clocks: everything here is unit-tested
(tests/unit/bench/test_bench_stats.py).
"""

from __future__ import annotations

import math
import re
import struct
import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rtp.units import NS_PER_MS

FRAME_SAMPLES = 160  # 20 ms at 8 kHz
PCM_FRAME_BYTES = 2 * FRAME_SAMPLES
SILENT_KEYS = frozenset({zlib.crc32(bytes(PCM_FRAME_BYTES))})  # digital silence: identical everywhere


# --- statistics -------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default);
    None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (pos - low))


def summary(values: Sequence[float], digits: int = 1) -> dict[str, float | int | None]:
    """n, p50, p99 and max of some values, rounded (None where there are none)."""

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    return {
        "n": len(values),
        "p50": r(percentile(values, 50)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values) if values else None),
    }


def intervals_ms(times_s: Sequence[float]) -> list[float]:
    """Gaps between consecutive timestamps (seconds in, milliseconds out), in order."""
    return [1000.0 * (b - a) for a, b in zip(times_s, times_s[1:], strict=False)]


def cpu_percent(cpu_s_before: float, cpu_s_after: float, wall_s: float) -> float:
    """CPU time used over a wall-clock window, in percent of one core."""
    return 100.0 * (cpu_s_after - cpu_s_before) / wall_s if wall_s > 0 else float("nan")


def proc_stat_cpu_seconds(stat_text: str, ticks_per_s: int) -> float:
    """utime + stime (seconds) from the text of /proc/PID/stat (the command name may contain spaces)."""
    fields = stat_text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def host_cpu_busy_seconds(stat_text: str, ticks_per_s: int) -> float:
    """CPU seconds all cores spent busy (not idle or waiting for I/O), from the text of /proc/stat."""
    fields = [int(x) for x in stat_text.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is inside user)
    return busy / ticks_per_s


def proc_status_rss_mb(status_text: str) -> float | None:
    """VmRSS in MiB from the text of /proc/PID/status."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


# --- pcap and RTP -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Packet:
    """One captured UDP datagram."""

    t: float  # capture time, seconds since the epoch
    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes


_PCAP_MAGIC = {
    b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
    b"\xa1\xb2\xc3\xd4": (">", 1e-6),
    b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
    b"\xa1\xb2\x3c\x4d": (">", 1e-9),
}
_LINK_OFFSETS = {0: 4, 1: 14, 101: 0, 113: 16, 276: 20}  # null/loopback, Ethernet, raw IP, Linux SLL, SLL2


def read_pcap(path: str | Path) -> list[Packet]:
    """UDP-over-IPv4 datagrams of a classic pcap file (what `tshark -F pcap -w` writes); other packets are
    skipped, a truncated last record is ignored."""
    data = Path(path).read_bytes()
    if len(data) < 24 or data[:4] not in _PCAP_MAGIC:
        raise ValueError(f"{path}: not a classic pcap file")
    endian, unit = _PCAP_MAGIC[data[:4]]
    linktype = struct.unpack_from(endian + "I", data, 20)[0] & 0x0FFFFFFF
    if linktype not in _LINK_OFFSETS:
        raise ValueError(f"{path}: unsupported link type {linktype}")
    link = _LINK_OFFSETS[linktype]
    record = struct.Struct(endian + "IIII")
    packets: list[Packet] = []
    pos = 24
    while pos + 16 <= len(data):
        sec, frac, incl, _orig = record.unpack_from(data, pos)
        pos += 16
        frame = data[pos : pos + incl]
        pos += incl
        if len(frame) < incl:
            break
        ip = frame[link:]
        if linktype == 1 and frame[12:14] != b"\x08\x00":
            continue
        if len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != 17:
            continue
        ihl = (ip[0] & 0x0F) * 4
        sport, dport, ulen = struct.unpack_from("!HHH", ip, ihl)
        payload = ip[ihl + 8 : ihl + max(8, ulen)]
        packets.append(Packet(sec + frac * unit, _ip(ip[12:16]), sport, _ip(ip[16:20]), dport, payload))
    return packets


def _ip(raw: bytes) -> str:
    return ".".join(str(b) for b in raw)


@dataclass(frozen=True, slots=True)
class Rtp:
    pt: int
    seq: int
    ts: int
    ssrc: int
    body: bytes


def parse_rtp(payload: bytes) -> Rtp | None:
    """An RTP packet's header fields and payload; None for anything else (RTCP included)."""
    if len(payload) < 12 or payload[0] >> 6 != 2:
        return None
    pt = payload[1] & 0x7F
    if 72 <= pt <= 76:  # RTCP SR/RR/SDES/BYE/APP share the port range on some stacks
        return None
    seq, ts, ssrc = struct.unpack_from("!HII", payload, 2)
    start = 12 + 4 * (payload[0] & 0x0F)
    if payload[0] & 0x10 and len(payload) >= start + 4:  # header extension
        start += 4 + 4 * struct.unpack_from("!H", payload, start + 2)[0]
    end = len(payload)
    if payload[0] & 0x20 and end > start:  # padding
        end -= payload[-1]
    return Rtp(pt, seq, ts, ssrc, payload[start:end])


_ULAW_LINEAR = None


def ulaw_dbfs(body: bytes) -> float:
    """RMS level (dBFS, full scale 32768) of µ-law audio; -inf for digital silence or no audio."""
    global _ULAW_LINEAR
    if _ULAW_LINEAR is None:
        u = ~np.arange(256, dtype=np.int32) & 0xFF
        t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
        _ULAW_LINEAR = np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.float64)
    if not body:
        return -math.inf
    x = _ULAW_LINEAR[np.frombuffer(body, dtype=np.uint8)]
    ms = float(np.mean(x * x))
    return 10 * math.log10(ms / 32768.0**2) if ms > 0 else -math.inf


def sdp_audio_ports(sipp_messages: str) -> tuple[list[int], list[int]]:
    """(ports the bridge answered with, ports SIPp offered) from a SIPp `-trace_msg` log: the `m=audio`
    lines of received 200 OKs and of sent INVITEs, each port once, in order."""
    answered: list[int] = []
    offered: list[int] = []
    for block in re.split(r"\n-{10,}[^\n]*\n", "\n" + sipp_messages):
        m = re.search(r"^m=audio (\d+)", block, re.MULTILINE)
        if m is None:
            continue
        port = int(m.group(1))
        if "message received" in block and re.search(r"^SIP/2\.0 200", block, re.MULTILINE):
            if port not in answered:
                answered.append(port)
        elif "message sent" in block and re.search(r"^INVITE ", block, re.MULTILINE):
            if port not in offered:
                offered.append(port)
    return answered, offered


def rtp_intervals_ms(
    packets: Iterable[Packet], bridge_ports: set[int], t0: float, t1: float
) -> dict[tuple[int, int], list[float]]:
    """Inter-packet intervals (ms) of each RTP stream the bridge sent, per (source port, SSRC), counting only
    packets captured in [t0, t1]."""
    times: dict[tuple[int, int], list[float]] = {}
    for p in packets:
        if p.sport not in bridge_ports or not t0 <= p.t <= t1:
            continue
        rtp = parse_rtp(p.payload)
        if rtp is None or rtp.pt >= 96:  # telephone-event etc.: not the audio clock
            continue
        times.setdefault((p.sport, rtp.ssrc), []).append(p.t)
    return {k: intervals_ms(sorted(v)) for k, v in times.items()}


def wire_barge_ins(
    packets: Sequence[Packet],
    bridge_port: int,
    t0: float,
    t1: float,
    *,
    caller_dbfs: float = -40.0,
    assistant_dbfs: float = -90.0,
    quiet_s: float = 0.3,
    playing_s: float = 0.06,
    horizon_s: float = 1.0,
) -> list[float]:
    """Barge-ins seen on the wire for one call, in ms: for every caller speech onset in [t0, t1] (a voiced
    packet to `bridge_port` after at least `quiet_s` of unvoiced ones) while the bridge was sending assistant
    audio (a packet above `assistant_dbfs` — by default anything but digital silence, which is what the bridge
    sends when it has no frame — within `playing_s` before the onset), the time from that onset to the last
    such packet the bridge sent within `horizon_s` after it: the assistant audio that still left."""
    to_bridge = [(p.t, p) for p in packets if p.dport == bridge_port]
    from_bridge = [(p.t, p) for p in packets if p.sport == bridge_port]
    to_bridge.sort(key=lambda x: x[0])
    from_bridge.sort(key=lambda x: x[0])

    def voiced(items: list[tuple[float, Packet]], level: float) -> list[tuple[float, bool]]:
        out = []
        for t, p in items:
            rtp = parse_rtp(p.payload)
            if rtp is not None and rtp.pt < 96:
                out.append((t, ulaw_dbfs(rtp.body) > level))
        return out

    caller = voiced(to_bridge, caller_dbfs)
    assistant = [t for t, v in voiced(from_bridge, assistant_dbfs) if v]
    results: list[float] = []
    last_voiced: float | None = None
    for t, v in caller:
        if not v:
            continue
        onset = last_voiced is None or t - last_voiced >= quiet_s
        last_voiced = t
        if not onset or not t0 <= t <= t1:
            continue
        i = bisect_right(assistant, t)
        if i == 0 or t - assistant[i - 1] > playing_s:
            continue  # the assistant was not speaking: not a barge-in
        j = bisect_right(assistant, t + horizon_s) - 1
        results.append(1000.0 * (assistant[j] - t))
    return results


# --- the probe's records ------------------------------------------------------------------------------------


def match_forward(
    src: tuple[Sequence[int], Sequence[int]],
    dst: tuple[Sequence[int], Sequence[int]],
    *,
    t0: int,
    t1: int,
    unique_ns: int = 1_000_000_000,
    max_ns: int = 1_000_000_000,
    skip: frozenset[int] = SILENT_KEYS,
) -> tuple[list[float], int]:
    """Latencies (ms) from the `src` point to the `dst` point of the same content: each `dst` record (time,
    key) in [t0, t1] is paired with the latest `src` record of the same key at or before it. A pair is not
    counted when that content also passed `src` less than `unique_ns` earlier (repeated audio, e.g. silence,
    is ambiguous) or the delay exceeds `max_ns`. Returns (latencies, records left unpaired)."""
    by_key: dict[int, list[int]] = {}
    for t, k in zip(*src, strict=False):
        by_key.setdefault(k, []).append(t)
    for times in by_key.values():
        times.sort()
    return _pair(by_key, dst, t0=t0, t1=t1, unique_ns=unique_ns, max_ns=max_ns, skip=skip)


def _pair(
    by_key: dict[int, list[int]],
    dst: tuple[Sequence[int], Sequence[int]],
    *,
    t0: int,
    t1: int,
    unique_ns: int,
    max_ns: int,
    skip: frozenset[int],
) -> tuple[list[float], int]:
    """Each `dst` (time, key) in [t0, t1] against the latest earlier time of its key in `by_key` (ascending)."""
    out: list[float] = []
    unpaired = 0
    for t, k in zip(*dst, strict=False):
        if not t0 <= t <= t1 or k in skip:
            continue
        times = by_key.get(k)
        j = bisect_right(times, t) - 1 if times else -1
        if j < 0 or t - times[j] > max_ns or (j > 0 and times[j] - times[j - 1] < unique_ns):
            unpaired += 1
            continue
        out.append((t - times[j]) / NS_PER_MS)
    return out, unpaired


def chunk_windows(chunks: Sequence[tuple[int, bytes]], wanted: set[int], decode) -> dict[int, list[int]]:
    """For provider audio chunks (receive time ns, G.711 bytes) of one call, in order: key -> the times at
    which a 20 ms window of the decoded stream with that key became complete (the receive time of the chunk
    holding its last sample), for every sample offset whose window's key is in `wanted`; times ascending."""
    stream = b"".join(c for _, c in chunks)
    ends: list[int] = []
    total = 0
    for _, c in chunks:
        total += len(c)
        ends.append(total)
    pcm = memoryview(decode(stream))
    index: dict[int, list[int]] = {}
    crc = zlib.crc32
    for s in range(0, len(stream) - FRAME_SAMPLES + 1):
        k = crc(pcm[2 * s : 2 * s + PCM_FRAME_BYTES])
        if k in wanted:
            index.setdefault(k, []).append(chunks[bisect_right(ends, s + FRAME_SAMPLES - 1)][0])
    return index


def match_chunks_to_frames(
    chunks: Sequence[tuple[int, bytes]],
    frames: tuple[Sequence[int], Sequence[int]],
    decode,
    *,
    t0: int,
    t1: int,
    unique_ns: int = 1_000_000_000,
    max_ns: int = 3_000_000_000,
    skip: frozenset[int] = SILENT_KEYS,
) -> tuple[list[float], int]:
    """Latencies (ms) from the provider chunk that completed each transmitted frame's audio to the frame's
    transmission, for frames (time ns, key of its PCM16) transmitted in [t0, t1], paired as `match_forward`
    pairs; returns (latencies, frames left unpaired: their audio was not found, or only ambiguously)."""
    wanted = {k for t, k in zip(*frames, strict=False) if t0 <= t <= t1 and k not in skip}
    by_key = chunk_windows(chunks, wanted, decode)
    return _pair(by_key, frames, t0=t0, t1=t1, unique_ns=unique_ns, max_ns=max_ns, skip=skip)


def run_starts(times: Sequence[int], gap_ns: int) -> list[int]:
    """The times that follow a gap longer than `gap_ns` (the first one included)."""
    return [t for i, t in enumerate(times) if i == 0 or t - times[i - 1] > gap_ns]


def first_frame_latencies(
    chunk_times: Sequence[int],
    frame_times: Sequence[int],
    *,
    t0: int,
    t1: int,
    gap_ns: int = 100_000_000,
    max_ns: int = 1_000_000_000,
) -> list[float]:
    """Latencies (ms) of the first frame of each assistant utterance: from the first chunk of a run of provider
    chunks (none received in the `gap_ns` before it) to the first frame transmitted after it, when that frame
    starts a run of transmitted frames in [t0, t1] (the utterance's audio waited behind nothing). Needs the
    first chunk to hold at least one frame (the echo fake sends 40 ms chunks)."""
    starts = run_starts(chunk_times, gap_ns)
    frames = list(frame_times)
    frame_starts = set(run_starts(frames, gap_ns))
    out: list[float] = []
    for n, c in enumerate(starts):
        i = bisect_left(frames, c)
        if i == len(frames):
            continue
        t = frames[i]
        later_run = n + 1 < len(starts) and starts[n + 1] <= t  # then t belongs to a later utterance
        if t in frame_starts and t0 <= t <= t1 and t - c <= max_ns and not later_run:
            out.append((t - c) / NS_PER_MS)
    return out


def read_chunks(path: str | Path, header: struct.Struct) -> dict[int, list[tuple[int, bytes]]]:
    """The probe's chunk file: call index -> [(receive time ns, bytes)] in file order."""
    data = Path(path).read_bytes() if Path(path).exists() else b""
    out: dict[int, list[tuple[int, bytes]]] = {}
    pos = 0
    while pos + header.size <= len(data):
        t, call, n = header.unpack_from(data, pos)
        pos += header.size
        out.setdefault(call, []).append((t, data[pos : pos + n]))
        pos += n
    return out


# --- the bridge's log ---------------------------------------------------------------------------------------

BARGE_IN = re.compile(
    r"call (\S+) barge-in \((\w+)\) at (\d+) ms: cleared (\d+) ms of output; .*"
    r"last assistant frame left ([-+]?[\d.]+) ms from the event"
)
RECOVERY = re.compile(r"call (\S+) output_recovery (\w+): token (\d+), cause (\w+), (\d+) ms")


def barge_in_reactions(lines: Iterable[str]) -> list[float]:
    """The "last assistant frame left X ms from the event" figures of the barge-in lines."""
    return [float(m.group(5)) for line in lines if (m := BARGE_IN.search(line))]


def recovery_stages(lines: Iterable[str]) -> dict[str, list[int]]:
    """stage -> the "N ms since the condition" of each `output_recovery <stage>` line."""
    out: dict[str, list[int]] = {}
    for line in lines:
        m = RECOVERY.search(line)
        if m:
            out.setdefault(m.group(2), []).append(int(m.group(5)))
    return out


# --- engines without probe hooks at the media edge: the same points read off the wire -------------------------


def share_outside(values: Sequence[float], centre: float, tolerance: float) -> float | None:
    """Percentage of `values` outside centre ± tolerance (None for no values)."""
    if not values:
        return None
    outside = sum(1 for v in values if abs(v - centre) > tolerance)
    return 100.0 * outside / len(values)


_NATIVE_MEDIA = re.compile(r"(call-\d+) media: \S+ to \S+ from [0-9.]+:(\d+)")


def native_media_ports(lines: Iterable[str]) -> dict[int, str]:
    """The native engine's local RTP port of each call, from its log lines
    `call-N media: PCMU/8000 to HOST:PORT from HOST:PORT`: {local port: call id} (the first line per call)."""
    ports: dict[int, str] = {}
    for line in lines:
        m = _NATIVE_MEDIA.search(line)
        if m and m.group(1) not in ports.values():
            ports[int(m.group(2))] = m.group(1)
    return ports


def wire_points(
    packets: Iterable[Packet], ports: dict[int, str], offset_s: float, decode
) -> dict[str, dict[str, tuple[list[int], list[int]]]]:
    """The probe's `media_in` / `media_out` points of each call, taken from a capture instead of the media
    port: `media_in` a PCMU packet captured on its way to the call's RTP port, `media_out` one captured leaving
    it; each as (monotonic ns = capture time − `offset_s`, CRC-32 of the decoded 20 ms of PCM16), so that
    `match_forward` / `match_chunks_to_frames` pair them with the WebSocket points as they pair the probe's.
    Only 160-byte PCMU payloads count (telephone-event and other frame sizes are skipped), and on the way out
    not a payload of one repeated byte: what an engine sends when it has no frame to send, as the probe's
    `media_out` records no packet for it."""
    out: dict[str, dict[str, tuple[list[int], list[int]]]] = {}
    crc = zlib.crc32
    for p in packets:
        if p.dport in ports:
            call, point = ports[p.dport], "media_in"
        elif p.sport in ports:
            call, point = ports[p.sport], "media_out"
        else:
            continue
        rtp = parse_rtp(p.payload)
        if rtp is None or rtp.pt != 0 or len(rtp.body) != FRAME_SAMPLES:
            continue
        if point == "media_out" and rtp.body.count(rtp.body[0]) == FRAME_SAMPLES:
            continue  # the filler the engine sends when it has no frame (µ-law digital silence): not a frame
        per_call = out.setdefault(call, {"media_in": ([], []), "media_out": ([], [])})
        times, keys = per_call[point]
        times.append(round((p.t - offset_s) * 1e9))
        keys.append(crc(decode(rtp.body)))
    return out
