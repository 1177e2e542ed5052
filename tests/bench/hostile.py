"""Hostile input on the wire: mutated and random SIP at the SIP port, random and mutated RTP/RTCP
into a live call's media ports, mutated provider frames from the fake, all at ONE `serve` (native engine,
the openai-realtime fake), inside a private network namespace. Then a normal call, and the log is read.

    .venv/bin/python tests/bench/hostile.py              # full: 60 s of SIP, 20 s of RTP, mutations on 4 calls
    .venv/bin/python tests/bench/hostile.py --quick      # CI: 3 s of SIP, 4 s of RTP, one mutated call (~22 s)
    .venv/bin/python tests/bench/hostile.py --seed 7 --keep --output hostile.json

The command re-executes itself as `unshare --net sh -c 'ip link set lo up && exec python hostile.py --inner
...'`: the RFC 4475 messages name 192.0.2.x and example.com hosts, so the bridge, the fake and every sender live
where only `lo` exists and nothing answered can leave the machine. Without `unshare --net` (not root) it prints
`{"skipped": reason}` and exits 0.

Phases (each bounded in count and time):
a. SIP, from 127.0.0.2 (serve's `--invite-rate` holds how many mutated INVITEs become calls): RFC 4475 corpus
   messages and well-formed INVITE/OPTIONS/BYE/REGISTER "captures" (as SIPp and the flood harness send them),
   mutated by tests/integration/rfc4475_sender.py's `mutate`; random bytes; random bytes behind a SIP start
   line; captures carrying a 4 KiB random marker in From and User-Agent. The harness runs the engine's own
   parser (sip.core.message.parse, sip.core.ua's keep-alive rule) on every message it sends, so it knows exactly how
   many the engine must reject: `unparseable + malformed_*` must grow by that number (each rejected message
   counted once), and `transport_datagrams_in` by the number sent. Datagrams the namespace's kernel dropped
   (UDP RcvbufErrors in /proc/net/snmp: the socket's buffer full under load) never reached the engine and
   are allowed for: as many rejects may be missing from the count, none counted twice. CI's quick form
   asserts there were none.
b. RTP/RTCP, during a live SIPp call (uac_stream): to the call's RTP port from another socket, random bytes,
   truncated headers, wrong versions, bad CSRC counts, bad extension lengths, bad padding, header-only
   packets, well-formed packets with a wrong SSRC or payload type, byte-mutated copies of a real packet;
   from the caller's own address (a raw socket, spoofed source port): malformed packets, wrong payload types,
   telephone-events of a bad length and two packets of a foreign SSRC; to the RTCP port (+1): random bytes and
   mutated SR/RR/SDES/BYE compounds from the caller's host and from 127.0.0.2. The harness predicts each
   packet's fate with the stream's own parsers (rtp.packet.parse, rtp.rtcp.parse_compound, the latch's rule)
   and compares with the call's `qos.media` counters (GET /calls/{id}): every drop reason must have grown by
   exactly what was predicted. The call must stay up, the caller must hear the echo (RTP from the bridge
   with a payload other than the idle pattern), and SIPp must end the call with its BYE.
c. Provider frames: a second SIPp call (beside b's) whose fake connection gets `mutate:7` every 1.5 s
   (providers/fakes/faults.py: truncated JSON, an unknown event, not an object, deep nesting, an error event
   with a huge code and message, huge strings, a lone surrogate): all survivable, so it must go on to its
   caller's BYE. The full form adds three calls given `mutate:8` (wrong types too: invalid audio in an audio
   delta, HR1) four times: each either continues to its caller's BYE or ends with a reason a rule declares
   (tests/bench/fault_campaign.py's `fatal_rule`).
d. Afterwards: the bridge process is alive, a normal SIPp call (uac_busy) is answered and completes, SIGTERM
   ends the bridge with status 0, and its whole stderr is read: the longest line, tracebacks, logging errors,
   and the longest run of any marker (the SIP marker, the RTP marker, the fake's huge strings) in it — each
   may appear only as a bounded prefix.

Prints one JSON object (and writes it to --output); tests/bench/README.md says what each figure means.
Exit status 0 when every check held (`ok`), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import select
import shutil
import socket
import string
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
INTEGRATION = BENCH.parent / "integration"
for _p in (INTEGRATION, BENCH, ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import conftest  # noqa: E402  (BRIDGE, READY, _clean_env, Fake)
import peers  # noqa: E402
from fault_campaign import fatal_rule  # noqa: E402
from floods import invite, request  # noqa: E402  (well-formed INVITE / OPTIONS / BYE, as a capture)
from report import run_in_scratch  # noqa: E402
from rfc4475_sender import Sniffer, mutate, normal_call, only_loopback  # noqa: E402

from providers.fakes.faults import MUTATIONS, huge_string  # noqa: E402
from rtp import packet as rtp_packet  # noqa: E402
from rtp import rtcp as rtp_rtcp  # noqa: E402
from sip.core.message import ParseError, parse  # noqa: E402
from sip.core.ua import UaConfig  # noqa: E402

_beside = ROOT.parent / "shared" / "corpus" / "rfc4475"
CORPUS = Path(
    os.environ.get("PARLORA_RFC4475_DIR", _beside if _beside.is_dir() else "/work/shared/corpus/rfc4475")
)
HOSTILE_SOURCE = "127.0.0.2"  # phase a's sender and the foreign RTCP host: not the callers' 127.0.0.1
MARKER_CHARS = 4096
LINE_BOUND = 4096  # no line of the bridge's log may be longer (a bounded prefix of a frame is 2,000)
MARKER_RUN_BOUND = 2048  # no marker may appear in the log for longer than this
SURVIVABLE = f"mutate:{len(MUTATIONS) - 1}"  # every mutation but wrong types: the call must go on
EVERY = f"mutate:{len(MUTATIONS)}"  # wrong types in an audio delta too: the call goes on or ends by HR1
PROTOCOL = "openai-realtime"
SENTENCE = "Hello bridge, please say this sentence back to me"

QUICK: dict[str, float] = {"sip_s": 3.0, "sip_max": 3000, "rtp_s": 4.0, "rtp_pps": 400, "mutated_calls": 1}
FULL: dict[str, float] = {"sip_s": 60.0, "sip_max": 60000, "rtp_s": 20.0, "rtp_pps": 800, "mutated_calls": 4}

_STARTED = re.compile(r"call (call-\d+) started: from \S*sipp@127\.0\.0\.1:(\d+)")
_MEDIA = re.compile(r"(call-\d+) media: \S+ to ([0-9.]+):(\d+) from ([0-9.]+):(\d+)")
_ENDED = re.compile(r"call (call-\d+) ended after ([\d.]+) s by (\w+) \(([^)]*)\)")
_PROVIDER_FRAME = re.compile(r"provider (\w+): .*; frame: ")
_PROVIDER_ERROR = re.compile(r"call (call-\d+) provider error (\S+?): ")


def marker(rng: random.Random, n: int = MARKER_CHARS) -> str:
    return "".join(rng.choices(string.ascii_lowercase + string.digits, k=n))


# --- small helpers ------------------------------------------------------------------------------------------


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # loopback inside the namespace
        return json.loads(response.read().decode())


def get_text(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # loopback inside the namespace
        body: bytes = response.read()
        return body.decode()


def udp_kernel_drops() -> int:
    """UDP datagrams the namespace's kernel dropped (receive buffer full), from /proc/net/snmp."""
    lines = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines() if ln.startswith("Udp:")]
    row = dict(zip(lines[0][1:], (int(v) for v in lines[1][1:]), strict=False))
    return row.get("RcvbufErrors", 0)


def engine_counters(http: str) -> tuple[dict[str, int], str]:
    """The native engine's counters: GET /sip's `counters` (the engine's whole stats()) when serve shows it,
    else the rejection counters /metrics exports (parlora_sip_messages_rejected_total{reason})."""
    sip = get_json(f"{http}/sip")
    counters = sip.get("counters") if isinstance(sip, dict) else None
    if isinstance(counters, dict) and any(k.startswith("transport_") for k in counters):
        return {str(k): int(v) for k, v in counters.items() if isinstance(v, int)}, "GET /sip counters"
    out: dict[str, int] = {}
    for line in get_text(f"{http}/metrics").splitlines():
        m = re.match(r'parlora_sip_messages_rejected_total\{reason="([^"]+)"\} ([0-9.e+]+)', line)
        if m:
            out[m.group(1)] = int(float(m.group(2)))
    return out, "/metrics parlora_sip_messages_rejected_total"


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(after) | set(before))}


def rejected_total(counters: dict[str, int]) -> int:
    return sum(v for k, v in counters.items() if k == "unparseable" or re.fullmatch(r"malformed_\d{3}", k))


def wait_line(
    proc: peers.ManagedProcess, rx: re.Pattern[str], timeout: float, pred: Callable[[re.Match[str]], bool]
) -> re.Match[str] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.running():
        for line in proc.lines:
            m = rx.search(line.text)
            if m and pred(m):
                return m
        time.sleep(0.1)
    return None


# --- phase a: SIP -------------------------------------------------------------------------------------------


def captures(target: tuple[str, int], source: tuple[str, int], tag: str, mark: str | None) -> list[bytes]:
    """Well-formed requests as SIPp and the flood harness send them; `mark` goes into From and User-Agent."""
    out = [
        invite(target, source, f"cap-inv-{tag}", 40000),
        request("OPTIONS", target, source, f"cap-opt-{tag}", 1, f"sip:bridge@{target[0]}:{target[1]}"),
        request(
            "BYE", target, source, f"cap-bye-{tag}", 2, f"sip:bridge@{target[0]}:{target[1]}", to_tag="x1"
        ),
        request("REGISTER", target, source, f"cap-reg-{tag}", 1, f"sip:{target[0]}:{target[1]}"),
    ]
    if mark is not None:
        out = [
            m.replace(b"User-Agent: parlora-floods", b"User-Agent: " + mark.encode()).replace(
                b"From: <sip:flood@",
                b'From: "' + mark[:1024].encode() + b'" <sip:' + mark.encode() + b"@",
            )
            for m in out
        ]
    return out


def expected_fate(data: bytes, max_size: int) -> str:
    """What sip.core.ua.UserAgent.receive does with `data`: `keepalive`, `rejected` (the parser refuses it: counted
    in unparseable or malformed_NNN) or `parsed`."""
    if len(data) <= 4 and not data.strip(b"\r\n"):
        return "keepalive"
    try:
        parse(data, max_size=max_size)
    except ParseError:
        return "rejected"
    return "parsed"


def sip_phase(
    rng: random.Random, target: tuple[str, int], seconds: float, limit: int, mark: str
) -> dict[str, Any]:
    seeds = [p.read_bytes() for p in sorted(CORPUS.glob("*/*.dat"))]
    assert seeds, f"no RFC 4475 corpus at {CORPUS}"
    max_size = UaConfig().max_message_size
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((HOSTILE_SOURCE, 0))
    sock.setblocking(False)
    source = sock.getsockname()
    responses: Counter[int] = Counter()
    reading = threading.Event()

    def read_responses() -> None:  # the sender reads what it is answered (else its own buffer overflows)
        while not reading.is_set():
            ready, _, _ = select.select([sock], [], [], 0.1)
            while ready:
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, OSError):
                    break
                m = re.match(rb"SIP/2\.0 (\d{3}) ", data)
                responses[int(m.group(1)) if m else 0] += 1

    reader = threading.Thread(target=read_responses, daemon=True)
    reader.start()
    kinds: Counter[str] = Counter()
    fates: Counter[str] = Counter()
    start = time.monotonic()
    sent = send_errors = 0
    while sent < limit and time.monotonic() - start < seconds:
        roll = rng.random()
        if roll < 0.55:
            kind, data = "corpus_mutated", mutate(rng, rng.choice(seeds), rng.randint(1, 6))
        elif roll < 0.70:
            cap = rng.choice(captures(target, source, f"{sent}x{rng.getrandbits(32):08x}", None))
            kind, data = "capture_mutated", mutate(rng, cap, rng.randint(1, 4))
        elif roll < 0.78:
            kind = "capture_marked"
            cap = rng.choice(captures(target, source, f"{sent}m{rng.getrandbits(32):08x}", mark))
            data = cap if rng.random() < 0.5 else mutate(rng, cap, rng.randint(1, 3))
        elif roll < 0.90:
            kind, data = "random_bytes", rng.randbytes(rng.randint(0, 1400))
        else:
            line = rng.choice(
                [b"INVITE sip:bridge@127.0.0.1 SIP/2.0\r\n", b"SIP/2.0 200 OK\r\n", b"ACK sip:x SIP/2.0\r\n"]
            )
            kind, data = "start_line_then_random", line + rng.randbytes(rng.randint(0, 1400))
        data = data[:65000]
        try:
            sock.sendto(data, target)
        except BlockingIOError:
            time.sleep(0.01)
            send_errors += 1
            continue
        except OSError:
            send_errors += 1
            continue
        sent += 1
        kinds[kind] += 1
        fates[expected_fate(data, max_size)] += 1
        if sent % 25 == 0:
            time.sleep(0.02)  # bursts of 25, then a breath: a flood is floods.py's subject, not this one's
    time.sleep(0.5)  # the last answers come in (pacing, not a check)
    reading.set()
    reader.join(2.0)
    sock.close()
    return {
        "responses_to_sender": dict(sorted(responses.items())),
        "sent": sent,
        "send_errors": send_errors,
        "seconds": round(time.monotonic() - start, 1),
        "by_kind": dict(sorted(kinds.items())),
        "expected": dict(sorted(fates.items())),
    }


# --- phase b: RTP / RTCP ------------------------------------------------------------------------------------


def _hdr(b0: int, b1: int, seq: int, ts: int, ssrc: int) -> bytes:
    return struct.pack("!BBHII", b0, b1, seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc & 0xFFFFFFFF)


def hostile_rtp(rng: random.Random, mark: bytes, spoofed: bool) -> tuple[str, bytes]:
    """One hostile RTP datagram and its kind."""
    seq, ts, ssrc = rng.getrandbits(16), rng.getrandbits(32), rng.getrandbits(32)
    payload = rng.randbytes(160)
    kinds = ["random", "truncated", "bad_version", "bad_csrc", "bad_extension", "bad_padding", "header_only",
             "wrong_pt", "mutated_real", "marked"]  # fmt: skip
    if not spoofed:
        kinds.append("wrong_ssrc")
    else:
        kinds.append("bad_dtmf")
    kind = rng.choice(kinds)
    if kind == "random":
        return kind, rng.randbytes(rng.randint(0, 300))
    if kind == "truncated":
        return kind, _hdr(0x80, 0, seq, ts, ssrc)[: rng.randint(0, 11)]
    if kind == "bad_version":
        return kind, _hdr(rng.choice([0x00, 0x40, 0xC0]) | rng.getrandbits(6), 0, seq, ts, ssrc) + payload
    if kind == "bad_csrc":
        cc = rng.randint(1, 15)
        return kind, _hdr(0x80 | cc, 0, seq, ts, ssrc) + rng.randbytes(rng.randint(0, 4 * cc - 1))
    if kind == "bad_extension":
        words = rng.randint(1, 0xFFFF)
        body = struct.pack("!HH", 0xBEDE, words) + rng.randbytes(rng.randint(0, min(4 * words - 1, 200)))
        return kind, _hdr(0x90, 0, seq, ts, ssrc) + (body if rng.random() < 0.8 else body[:3])
    if kind == "bad_padding":
        body = rng.randbytes(rng.randint(0, 40))
        pad = 0 if rng.random() < 0.4 else len(body) + 1 + rng.randint(0, 200)
        return kind, _hdr(0xA0, 0, seq, ts, ssrc) + body + bytes([min(pad, 255)])
    if kind == "header_only":
        return kind, _hdr(0x80, 0, seq, ts, ssrc)
    if kind == "wrong_pt":
        return kind, _hdr(
            0x80, rng.choice([8, 9, 18, 96, 100, 127]) | rng.choice([0, 0x80]), seq, ts, ssrc
        ) + payload
    if kind == "wrong_ssrc":
        return kind, _hdr(0x80, 0, seq, ts, ssrc) + payload
    if kind == "bad_dtmf":
        return kind, _hdr(0x80, 101, seq, ts, ssrc) + rng.randbytes(rng.choice([1, 2, 3, 5, 6, 7]))
    if kind == "marked":
        return kind, _hdr(0x80, rng.choice([0, 96]), seq, ts, ssrc) + mark[:1000]
    return kind, mutate(rng, _hdr(0x80, 0, seq, ts, ssrc) + payload, rng.randint(1, 4))


def hostile_rtcp(rng: random.Random, mark: bytes) -> tuple[str, bytes]:
    ssrc = rng.getrandbits(32)
    block = rtp_rtcp.ReportBlock(rng.getrandbits(32), rng.getrandbits(8), 0, rng.getrandbits(32), 7, 0, 0)
    valid = [
        rtp_rtcp.build_rr(rtp_rtcp.ReceiverReport(ssrc, (block,))) + rtp_rtcp.build_sdes(ssrc, "hostile"),
        rtp_rtcp.build_sr(rtp_rtcp.SenderReport(ssrc, rng.getrandbits(64), 1, 2, 3, ())),
        rtp_rtcp.build_bye((ssrc,), "hostile"),
    ]
    kind = rng.choice(["random", "mutated", "marked_sdes", "truncated"])
    if kind == "random":
        return kind, rng.randbytes(rng.randint(0, 300))
    if kind == "truncated":
        v = rng.choice(valid)
        return kind, v[: rng.randint(0, len(v) - 1)]
    if kind == "marked_sdes":
        return kind, rtp_rtcp.build_rr(rtp_rtcp.ReceiverReport(ssrc, ())) + rtp_rtcp.build_sdes(
            ssrc, mark[:255].decode()
        )
    return kind, mutate(rng, rng.choice(valid), rng.randint(1, 4))


# the fates of a packet from the caller's address that the stream takes (so a foreign SSRC switches it)
TAKEN = ("accepted", "accepted_dtmf", "comfort_noise")


def rtp_fate(data: bytes, spoofed: bool, pt: int = 0, dtmf_pt: int = 101) -> str:
    """The drop counter rtp.stream.RtpStream.receive raises for `data` (the call negotiated PCMU and
    telephone-event 101, no rtcp-mux), or `accepted`."""
    p = rtp_packet.parse(data)
    if isinstance(p, rtp_packet.Drop):
        return f"drop_{p.name.lower()}"
    if not spoofed:
        return "drop_wrong_source"
    if p.pt == pt:
        return "accepted"
    if p.pt == dtmf_pt:
        return "drop_bad_dtmf" if len(p.payload) % 4 else "accepted_dtmf"
    if p.pt == 13:
        return "comfort_noise"
    return "drop_unknown_pt"


class Spoofer:
    """UDP datagrams with a chosen source port, through a raw socket (root, inside the namespace only)."""

    def __init__(self, source_port: int) -> None:
        self.port = source_port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)

    def send(self, data: bytes, destination: tuple[str, int]) -> None:
        header = struct.pack("!HHHH", self.port, destination[1], 8 + len(data), 0)  # checksum 0: none (IPv4)
        self.sock.sendto(header + data, (destination[0], 0))

    def close(self) -> None:
        self.sock.close()


class EchoListener:
    """Counts the RTP packets the bridge sends from `port` whose payload is not one repeated byte (the idle
    pattern): what the caller hears of the echo."""

    def __init__(self, port: int) -> None:
        self.sniffer = Sniffer(port)
        self.packets = self.voiced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for datagram in self.sniffer.read(0.2):
                p = rtp_packet.parse(datagram)
                if isinstance(p, rtp_packet.Drop) or p.pt != 0:
                    continue
                self.packets += 1
                self.voiced += len(set(p.payload)) > 2

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.sniffer.sock.close()


def call_media(http: str, call: str) -> dict[str, int]:
    status = get_json(f"{http}/calls/{call}")
    media = (status.get("qos") or {}).get("media") or {}
    return {str(k): int(v) for k, v in media.items() if isinstance(v, int)}


def rtp_phase(
    rng: random.Random, http: str, call: str, bridge_rtp: tuple[str, int], caller_rtp: tuple[str, int],
    seconds: float, pps: float, mark: bytes,
) -> dict[str, Any]:  # fmt: skip
    before = call_media(http, call)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    foreign = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    foreign.bind((HOSTILE_SOURCE, 0))
    spoofer = Spoofer(caller_rtp[1])
    rtcp_target = (bridge_rtp[0], bridge_rtp[1] + 1)
    expected: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    sent = {"rtp_other_socket": 0, "rtp_spoofed": 0, "rtcp_caller_host": 0, "rtcp_foreign_host": 0}
    foreign_ssrc_left = (
        2  # spoofed packets of a foreign SSRC the stream takes (TAKEN): plain RTP lets them in
    )
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        roll = rng.random()
        if roll < 0.6:
            kind, data = hostile_rtp(rng, mark, spoofed=False)
            other.sendto(data, bridge_rtp)
            sent["rtp_other_socket"] += 1
            expected[rtp_fate(data, spoofed=False)] += 1
        elif roll < 0.8:
            kind, data = hostile_rtp(rng, mark, spoofed=True)
            if rtp_fate(data, spoofed=True) in TAKEN:
                if not foreign_ssrc_left:
                    continue
                foreign_ssrc_left -= 1
                kind = "foreign_ssrc_accepted"
            spoofer.send(data, bridge_rtp)
            sent["rtp_spoofed"] += 1
            expected[rtp_fate(data, spoofed=True)] += 1
            kind = "spoofed_" + kind
        else:
            kind, data = hostile_rtcp(rng, mark)
            bad = isinstance(rtp_rtcp.parse_compound(data), rtp_packet.Drop)
            if roll < 0.92:
                other.sendto(data, rtcp_target)
                sent["rtcp_caller_host"] += 1
                expected["drop_bad_rtcp" if bad else "rtcp_accepted"] += 1
            else:
                foreign.sendto(data, rtcp_target)
                sent["rtcp_foreign_host"] += 1
                expected["drop_wrong_source"] += 1
            kind = "rtcp_" + kind
        kinds[kind] += 1
        n += 1
        time.sleep(max(0.0, start + n / pps - time.monotonic()))  # pacing, not a check
    time.sleep(0.5)  # the media loop reads the last datagrams (pacing, not a check)
    after = call_media(http, call)
    for s in (other, foreign, spoofer):
        s.close()
    counted = {k: v for k, v in delta(after, before).items() if k.startswith("drop_") and v}
    checked = sorted({k for k in expected if k.startswith("drop_")} | set(counted))
    # the caller's own stream may be late, duplicated or overflow the jitter buffer: those are not ours
    checked = [k for k in checked if k not in ("drop_late", "drop_duplicate", "drop_overflow")]
    mismatch = {k: {"expected": expected.get(k, 0), "counted": counted.get(k, 0)} for k in checked
                if expected.get(k, 0) != counted.get(k, 0)}  # fmt: skip
    return {
        "sent": sent,
        "sent_total": sum(sent.values()),
        "by_kind": dict(sorted(kinds.items())),
        "expected": dict(sorted(expected.items())),
        "counted": counted,
        "mismatch": mismatch,
        "ssrc_changes": after.get("ssrc_changes", 0) - before.get("ssrc_changes", 0),
        "packets_in_during": after.get("packets_in", 0) - before.get("packets_in", 0),
        "seconds": round(time.monotonic() - start, 1),
    }


# --- the run ------------------------------------------------------------------------------------------------


def start_caller(work: Path, sip_port: int, call_ms: int, tag: str) -> tuple[peers.ManagedProcess, int]:
    local = peers.free_udp_port()
    argv = [
        "sipp", "-sf", str(peers.SCENARIOS / "uac_stream.xml"), "-s", "bridge", f"127.0.0.1:{sip_port}",
        "-i", "127.0.0.1", "-mi", "127.0.0.1", "-p", str(local), "-mp", str(peers._free_udp_port_pair()),
        "-m", "1", "-l", "1", "-d", str(call_ms), "-nostdin", "-timeout", f"{call_ms // 1000 + 30}s",
        "-trace_logs", "-log_file", str(work / f"sipp-{tag}.log"),
    ]  # fmt: skip
    return peers.ManagedProcess(argv, cwd=work, name=f"sipp-{tag}"), local


def sipp_outcome(proc: peers.ManagedProcess, work: Path, tag: str, timeout: float) -> dict[str, Any]:
    rc = proc.wait(timeout)
    log = (work / f"sipp-{tag}.log").read_text() if (work / f"sipp-{tag}.log").exists() else ""
    return {"rc": rc, "answered": log.count("ANSWERED"), "closed": log.count("CLOSED")}


def call_of(
    bridge: peers.ManagedProcess, port: int, timeout: float = 15.0
) -> tuple[str, tuple[str, int], tuple[str, int]]:
    """The bridge's call id for the SIPp caller on `port`, its media line's (caller, bridge) RTP addresses."""
    started = wait_line(bridge, _STARTED, timeout, lambda m: int(m.group(2)) == port)
    if started is None:
        raise RuntimeError(f"no call from sipp@127.0.0.1:{port} started")
    call = started.group(1)
    media = wait_line(bridge, _MEDIA, timeout, lambda m: m.group(1) == call)
    if media is None:
        raise RuntimeError(f"{call}: no media line")
    return call, (media.group(2), int(media.group(3))), (media.group(4), int(media.group(5)))


def ended(bridge: peers.ManagedProcess, call: str, timeout: float) -> dict[str, Any]:
    m = wait_line(bridge, _ENDED, timeout, lambda m: m.group(1) == call)
    if m is None:
        return {"ended_by": None, "reason": None, "rule": None}
    by, reason = m.group(3), m.group(4)
    return {"ended_by": by, "reason": reason, "rule": None if by == "caller" else fatal_rule(reason)}


def longest_run(text: str, needle: str, k: int = 24) -> int:
    """The longest piece of `needle` (random letters and digits) found in `text`: each `k`-character piece of
    a long enough run of letters and digits in `text` is looked up among `needle`'s and the match extended both
    ways. Pieces shorter than `k` are not looked for (0)."""
    grams = {needle[i : i + k]: i for i in range(len(needle) - k + 1)}
    best = 0
    for m in re.finditer("[A-Za-z0-9]{" + str(k) + ",}", text):
        run = m.group(0)
        i = 0
        while i <= len(run) - k:
            j = grams.get(run[i : i + k])
            if j is None:
                i += 1
                continue
            a, b = i, j
            while a > 0 and b > 0 and run[a - 1] == needle[b - 1]:
                a, b = a - 1, b - 1
            e, f = i + k, j + k
            while e < len(run) and f < len(needle) and run[e] == needle[f]:
                e, f = e + 1, f + 1
            best = max(best, e - a)
            i = e - k + 1
    return best


def log_figures(log: str, markers: dict[str, str]) -> dict[str, Any]:
    lines = log.splitlines()
    longest = max(lines, key=len) if lines else ""
    return {
        "lines": len(lines),
        "bytes": len(log),
        "longest_line": len(longest),
        "longest_line_head": longest[:160],
        "line_bound": LINE_BOUND,
        "tracebacks": log.count("Traceback"),
        "logging_errors": log.count("--- Logging error ---"),
        "marker_longest_run": {name: longest_run(log, m) for name, m in markers.items()},
        "marker_lengths": {name: len(m) for name, m in markers.items()},
        "marker_run_bound": MARKER_RUN_BOUND,
    }


def inject(control: str, conns: set[int], spec: str, log: list[str]) -> bool:
    """`spec` into each of `conns` still open at the fake (GET /_fault); False when none is open any more."""
    try:
        open_now = set(get_json(f"{control}/_connections")["open"]) & conns
        for index in sorted(open_now):
            answer = get_text(f"{control}/_fault?spec={index}/{spec}")
            log.append(f"{index}/{spec} {answer.strip()}")
    except OSError as exc:
        log.append(f"failed: {exc!r}")
        return False
    return bool(open_now)


def _code(code: str) -> str:
    """An error code as the figures show it: a huge one (the fake's as_error mutation) by its length."""
    return code if len(code) <= 40 else f"<code of {len(code)} characters>"


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    d = QUICK if args.quick else FULL
    rng = random.Random(args.seed)
    t_start = time.monotonic()
    result: dict[str, Any] = {
        "seed": args.seed,
        "quick": args.quick,
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    if not only_loopback():
        return result | {"ok": False, "error": f"not in a private network namespace: {socket.if_nameindex()}"}
    sip_mark, rtp_mark = marker(rng), marker(rng)
    markers = {"sip": sip_mark, "rtp": rtp_mark} | {
        f"fake_huge_{i}": huge_string(i) for i, k in enumerate(MUTATIONS) if k in ("as_error", "huge_strings")
    }
    procs: list[peers.ManagedProcess] = []
    bridge: peers.ManagedProcess | None = None
    try:
        speech = peers.make_utterance(
            work / "speech.wav", SENTENCE, lead_silence_s=0.3, tail_silence_s=1.5, ulaw=True
        )
        assert speech.ulaw_path is not None
        (work / "speech.ul").write_bytes(speech.ulaw_path.read_bytes())
        fport = peers.free_udp_port(also_tcp=True)
        fake_argv = [
            *conftest.BRIDGE,
            "fake-provider",
            "--protocol",
            PROTOCOL,
            "--listen",
            f"127.0.0.1:{fport}",
        ]
        fake = peers.ManagedProcess(fake_argv, cwd=work, env=conftest._clean_env(), name="fake")
        procs.append(fake)
        sip, http_port, rtp = peers.free_udp_port(), peers.free_udp_port(also_tcp=True), peers.free_rtp_port()
        http = f"http://127.0.0.1:{http_port}"
        url = fake.wait_for(r"listening on (wss?://\S+)", timeout=30).group(1)
        control = url.replace("ws://", "http://", 1).split("/", 3)
        control_url = "/".join(control[:3])
        argv = [*conftest.BRIDGE, "serve", "--sip", f"127.0.0.1:{sip}", "--http", f"127.0.0.1:{http_port}"]
        argv += ["--rtp-port", str(rtp), "--provider", PROTOCOL, "--provider-url", url]
        argv += ["--invite-rate", str(args.invite_rate), "--drain-timeout", "0", "--log-level", "info"]
        bridge = peers.ManagedProcess(
            argv, cwd=work, env=conftest._clean_env({"OPENAI_API_KEY": "sk-hostile"}), name="parlora-bridge"
        )
        procs.append(bridge)
        bridge.wait_for(conftest.READY.pattern, timeout=30)
        target = ("127.0.0.1", sip)

        # a. SIP
        drops0 = udp_kernel_drops()
        before, source = engine_counters(http)
        sip_result = sip_phase(rng, target, d["sip_s"], int(d["sip_max"]), sip_mark)
        time.sleep(1.0)  # the engine reads the last datagrams (pacing, not a check)
        after, _ = engine_counters(http)
        grown = {k: v for k, v in delta(after, before).items() if v}
        sip_result |= {
            "counters_source": source,
            "counters_grown": grown,
            "counted_rejected": rejected_total(after) - rejected_total(before),
            "counted_keepalives": grown.get("keepalives"),
            "datagrams_in": grown.get("transport_datagrams_in"),
            "kernel_drops": udp_kernel_drops() - drops0,
            "alive_after": bridge.running(),
        }
        result["sip"] = sip_result

        # c's call first, so that its fake connection is the one opened now; then b's call beside it
        mutated_calls = int(d["mutated_calls"])
        call_ms = int((d["rtp_s"] + 4.5) * 1000)
        open_before = set(get_json(f"{control_url}/_connections")["open"])
        provider_calls: list[dict[str, Any]] = []
        c_proc, c_port = start_caller(work, sip, call_ms + 2000, "mutated-0")
        procs.append(c_proc)
        c_call, _, _ = call_of(bridge, c_port)
        conns = set(get_json(f"{control_url}/_connections")["open"]) - open_before
        b_proc, b_port = start_caller(work, sip, call_ms, "rtp")
        procs.append(b_proc)
        b_call, caller_rtp, bridge_rtp = call_of(bridge, b_port)
        echo = EchoListener(bridge_rtp[1])
        stop_mutating = threading.Event()
        injected: list[str] = []

        def mutator() -> None:
            stop_mutating.wait(1.0)  # the session is up and the caller speaking
            while not stop_mutating.is_set() and inject(control_url, conns, SURVIVABLE, injected):
                stop_mutating.wait(1.5)

        injector = threading.Thread(target=mutator, daemon=True)
        injector.start()
        time.sleep(0.5)  # the caller's stream is latched first (pacing, not a check)
        result["rtp"] = rtp_phase(
            rng, http, b_call, bridge_rtp, caller_rtp, d["rtp_s"], d["rtp_pps"], rtp_mark.encode()
        )
        result["rtp"]["call"] = sipp_outcome(b_proc, work, "rtp", call_ms / 1000 + 20) | ended(
            bridge, b_call, 10
        )
        echo.close()
        result["rtp"]["echo_packets"], result["rtp"]["echo_voiced"] = echo.packets, echo.voiced
        stop_mutating.set()
        injector.join(5)
        provider_calls.append(
            {"call": c_call, "spec": SURVIVABLE, "connections": sorted(conns), "injected": list(injected)}
            | sipp_outcome(c_proc, work, "mutated-0", call_ms / 1000 + 20)
            | ended(bridge, c_call, 10)
        )
        for i in range(1, mutated_calls):  # the full form: more calls, every mutation (wrong types too)
            open_before = set(get_json(f"{control_url}/_connections")["open"])
            proc, port = start_caller(work, sip, 8000, f"mutated-{i}")
            procs.append(proc)
            call, _, _ = call_of(bridge, port)
            conns = set(get_json(f"{control_url}/_connections")["open"]) - open_before
            injected = []
            for _round in range(4):
                time.sleep(1.2)
                if not inject(control_url, conns, EVERY, injected):
                    break
            provider_calls.append(
                {"call": call, "spec": EVERY, "connections": sorted(conns), "injected": injected}
                | sipp_outcome(proc, work, f"mutated-{i}", 30)
                | ended(bridge, call, 10)
            )
        lines = [ln.text for ln in bridge.lines]
        result["provider"] = {
            "mutations": list(MUTATIONS),
            "calls": provider_calls,
            "faults_injected": sum(1 for c in provider_calls for s in c["injected"] if s.endswith(" ok")),
            "protocol_errors_logged": dict(
                Counter(m.group(1) for ln in lines if (m := _PROVIDER_FRAME.search(ln)))
            ),
            "provider_errors_logged": dict(
                Counter(_code(m.group(2)) for ln in lines if (m := _PROVIDER_ERROR.search(ln)))
            ),
        }

        # d. afterwards
        result["alive_after_hostile"] = bridge.running()
        result["normal_call"], _ = normal_call(sip, work / "normal")
        result["alive_at_end"] = bridge.running()
        final, _ = engine_counters(http)
        result["engine_counters_at_end"] = final
    except Exception as exc:  # reported in the JSON; `ok` is false
        result["error"] = repr(exc)
    finally:
        rc = None
        if bridge is not None:
            rc = bridge.stop(term_timeout=15.0)
            (work / "bridge.log").write_text(bridge.stderr)
            result["log"] = log_figures(bridge.stderr, markers)
        result["bridge_rc"] = rc
        for proc in reversed(procs):
            if proc is not bridge:
                proc.stop(term_timeout=3.0)
    result["seconds"] = round(time.monotonic() - t_start, 1)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["checks"] = checks(result)
    result["ok"] = "error" not in result and all(result["checks"].values())
    return result


def checks(r: dict[str, Any]) -> dict[str, bool]:
    sip, rtp, log = r.get("sip", {}), r.get("rtp", {}), r.get("log", {})
    normal = r.get("normal_call", {})
    rtp_call = rtp.get("call", {})
    provider_calls = r.get("provider", {}).get("calls", [])
    datagrams = sip.get("datagrams_in")
    rejected, drops = sip.get("expected", {}).get("rejected", 0), sip.get("kernel_drops", 0)
    return {
        # what the kernel dropped (the socket's buffer full under load) never reached the engine: of those, as
        # many as `kernel_drops` may be rejects the engine could not count; none may be counted twice
        "sip_every_rejection_counted_once": sip.get("sent", 0) > 0
        and rejected - drops <= sip.get("counted_rejected", -1) <= rejected,
        "sip_every_datagram_read": datagrams is None or datagrams + drops == sip.get("sent"),
        "rtp_every_drop_counted": not rtp.get("mismatch", {"missing": 1}) and rtp.get("sent_total", 0) > 0,
        "rtp_call_stayed_up": rtp_call.get("ended_by") == "caller"
        and rtp_call.get("rc") == 0
        and rtp_call.get("closed") == 1,
        "rtp_caller_heard_the_echo": rtp.get("echo_voiced", 0) > 0,
        # each accepted packet of a foreign SSRC switches the source there and the caller's next one back:
        # nothing else may (a packet the call cannot use never switches it)
        "rtp_only_usable_packets_switch_source": rtp.get("ssrc_changes", 1 << 30)
        <= 2 * sum(rtp.get("expected", {}).get(fate, 0) for fate in TAKEN),
        "provider_survivable_mutations_leave_the_call_up": all(
            c.get("ended_by") == "caller" and c.get("rc") == 0
            for c in provider_calls
            if c["spec"] == SURVIVABLE
        ),
        "provider_calls_continue_or_end_by_rule": bool(provider_calls)
        and all(c.get("ended_by") == "caller" or c.get("rule") for c in provider_calls),
        "provider_faults_injected": r.get("provider", {}).get("faults_injected", 0) > 0,
        "alive": bool(r.get("alive_after_hostile")) and bool(r.get("alive_at_end")),
        "normal_call_works": (normal.get("rc"), normal.get("answered"), normal.get("closed")) == (0, 1, 1),
        "clean_exit": r.get("bridge_rc") == 0,
        "no_traceback": log.get("tracebacks", 1) == 0 and log.get("logging_errors", 1) == 0,
        "log_lines_bounded": log.get("longest_line", LINE_BOUND + 1) <= LINE_BOUND,
        "no_marker_logged_whole": all(
            v <= MARKER_RUN_BOUND for v in log.get("marker_longest_run", {"?": MARKER_RUN_BOUND + 1}).values()
        ),
    }


def outer(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Re-execute inside `unshare --net` (lo up), bounded; `{"skipped": reason}` where that is impossible."""
    reason = None
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        reason = "needs unshare and ip (util-linux, iproute2) for a private network namespace"
    elif subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=10).returncode != 0:
        reason = "unshare --net is not permitted here (needs root or user namespaces)"
    if reason is not None:
        text = json.dumps({"skipped": reason, "ok": True})
        print(text)
        if args.output:
            args.output.write_text(text + "\n")
        return 0
    inner = " ".join(_quote(a) for a in [sys.executable, str(Path(__file__).resolve()), "--inner", *argv])
    proc = peers.ManagedProcess(
        ["unshare", "--net", "sh", "-c", f"ip link set lo up && exec {inner}"], name="hostile-inner"
    )
    try:
        rc = proc.wait(args.timeout)
    finally:
        proc.stop(term_timeout=15.0)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr[-20000:])
    return rc if rc is not None else 1


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s of SIP, 4 s of RTP, one mutated call (CI)")
    parser.add_argument(
        "--seed", type=int, default=int(os.environ.get("PARLORA_HOSTILE_SEED", random.randrange(1 << 30)))
    )
    parser.add_argument("--invite-rate", type=float, default=2.0, help="serve --invite-rate (per source)")
    parser.add_argument("--timeout", type=float, help="bound on the whole run, s (quick 120, full 900)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs)")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.timeout = args.timeout or (120.0 if args.quick else 900.0)
    if not args.inner:
        if "--seed" not in argv:
            argv += ["--seed", str(args.seed)]
        print(f"hostile seed {args.seed}", file=sys.stderr, flush=True)
        return outer(args, argv)
    return run_in_scratch(
        lambda work: run(args, work), "parlora-hostile-", keep=args.keep, output=args.output
    )


if __name__ == "__main__":
    sys.exit(main())
