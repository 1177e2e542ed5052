"""Floods: INVITEs at up to 1,000/s and an OPTIONS flood from one loopback source at one `serve` with an
`--invite-rate` policy, while a legitimate caller from another source (127.0.0.2) places a call.

    .venv/bin/python tests/bench/floods.py                  # 1,000 INVITE/s for 20 s, 1,000 OPTIONS/s for 10 s
    .venv/bin/python tests/bench/floods.py --quick          # 1,000 INVITE/s for 3 s, 1,000 OPTIONS/s for 2 s
    .venv/bin/python tests/bench/floods.py --rate 500 --invite-seconds 10 --invite-rate 5

`serve` runs the embedded echo provider (no key) on the native engine with `--invite-rate R` (default 5) and
`--max-calls` (default 200), and `--options-rate O` (default 10, burst 20: beyond it OPTIONS are dropped). Each admitted flood INVITE is answered and never ACKed, so it holds a call (and a
provider session) until the bridge gives up on the ACK: R per second fill R x 32 s slots; with `--max-calls 40`
the legitimate caller gets 503 (max calls) after about 8 s. The flooder is a plain UDP socket on 127.0.0.1 sending well-formed INVITEs (each its own
Call-ID, with SDP) at the asked rate, paced in 10 ms batches, and counting the responses by status. Halfway
through the INVITE flood the legitimate caller, a socket bound to 127.0.0.2, sends one INVITE and times the
first response and the 200 (then ACKs and BYEs). Then the OPTIONS flood. RSS of the bridge is sampled every
0.5 s. The flood's accepted INVITEs are never ACKed: the bridge's own timers end them.

Prints one JSON object (and writes it to --output); tests/bench/README.md says what each figure means.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
for _p in (BENCH.parent / "integration", BENCH, ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import conftest  # noqa: E402  (BRIDGE, READY, _clean_env)
import peers  # noqa: E402
import stats  # noqa: E402
from report import run_in_scratch  # noqa: E402

LEGIT_SOURCE = "127.0.0.2"
_STATUS = re.compile(rb"^SIP/2\.0 (\d{3}) ")
_CSEQ = re.compile(rb"\r\nCSeq: *\d+ +([A-Z]+)", re.IGNORECASE)


def invite(target: tuple[str, int], source: tuple[str, int], call_id: str, rtp_port: int) -> bytes:
    sdp = (
        f"v=0\r\no=flood 1 1 IN IP4 {source[0]}\r\ns=-\r\nc=IN IP4 {source[0]}\r\nt=0 0\r\n"
        f"m=audio {rtp_port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=sendrecv\r\n"
    )
    return request("INVITE", target, source, call_id, 1, f"sip:bridge@{target[0]}:{target[1]}", body=sdp)


def request(
    method: str,
    target: tuple[str, int],
    source: tuple[str, int],
    call_id: str,
    cseq: int,
    uri: str,
    *,
    to_tag: str = "",
    body: str = "",
) -> bytes:
    to = f"<sip:bridge@{target[0]}:{target[1]}>" + (f";tag={to_tag}" if to_tag else "")
    lines = [
        f"{method} {uri} SIP/2.0",
        f"Via: SIP/2.0/UDP {source[0]}:{source[1]};branch=z9hG4bK{call_id}{cseq}{method[:2]};rport",
        "Max-Forwards: 70",
        f"From: <sip:flood@{source[0]}:{source[1]}>;tag=f{call_id[:8]}",
        f"To: {to}",
        f"Call-ID: {call_id}",
        f"CSeq: {cseq} {method}",
        f"Contact: <sip:flood@{source[0]}:{source[1]}>",
        "User-Agent: parlora-floods",
    ]
    if body:
        lines.append("Content-Type: application/sdp")
    lines.append(f"Content-Length: {len(body.encode())}")
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


class Flooder:
    """A UDP socket that sends at a rate and counts the responses to `method` it gets, by status code (the
    200s of INVITEs admitted earlier, retransmitted while they wait for an ACK, are not OPTIONS answers)."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.2)
        self.address: tuple[str, int] = self.sock.getsockname()
        self.codes: Counter[int] = Counter()
        self.method = b"INVITE"
        self.sent = 0
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except (TimeoutError, OSError):
                continue
            m = _STATUS.match(data)
            cseq = _CSEQ.search(data)
            if m and cseq is not None and cseq.group(1) == self.method:
                self.codes[int(m.group(1))] += 1

    def flood(self, make: Any, target: tuple[str, int], rate: float, seconds: float) -> float:
        """Send `make(i)` datagrams at `rate` per second for `seconds`; returns the rate achieved."""
        start = time.monotonic()
        batch = max(1, round(rate / 100))  # one batch every 10 ms
        n = 0
        while (elapsed := time.monotonic() - start) < seconds:
            for _ in range(batch):
                self.sock.sendto(make(n), target)
                n += 1
            time.sleep(max(0.0, start + n / rate - time.monotonic()))  # pacing, not a check
        self.sent += n
        return n / max(elapsed, 1e-9)

    def settle(self, quiet: float = 0.3, at_most: float = 5.0) -> None:
        """Until no response came for `quiet` seconds (at most `at_most`): the responses to the last requests
        sent, which a busy bridge sends late, are counted before the counts are read."""
        deadline, seen = time.monotonic() + at_most, -1
        while (total := sum(self.codes.values())) != seen and time.monotonic() < deadline:
            seen = total
            time.sleep(quiet)  # pacing, not a check

    def close(self) -> None:
        self._stop.set()
        self._reader.join(1.0)
        self.sock.close()


def legit_call(target: tuple[str, int], timeout: float = 5.0) -> dict[str, Any]:
    """One INVITE from 127.0.0.2: the time to the first response and to the 200, then ACK and BYE."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((LEGIT_SOURCE, 0))
        source = sock.getsockname()
        rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rtp.bind((LEGIT_SOURCE, 0))
        call_id = f"legit{os.getpid()}{int(time.time() * 1000)}"
        t0 = time.monotonic()
        sock.sendto(invite(target, source, call_id, rtp.getsockname()[1]), target)
        first = answered = None
        status = None
        final = b""
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            m = _STATUS.match(data)
            if not m:
                continue
            first = first if first is not None else time.monotonic() - t0
            status = int(m.group(1))
            if status >= 200:
                answered = time.monotonic() - t0
                final = data
                break
        if status == 200:
            tag = re.search(rb"^To:.*;tag=([^;\r\n]+)", final, re.MULTILINE | re.IGNORECASE)
            contact = re.search(rb"^(?:Contact|m):\s*<?([^>\r\n;]+)", final, re.MULTILINE | re.IGNORECASE)
            uri = contact.group(1).decode() if contact else f"sip:bridge@{target[0]}:{target[1]}"
            to_tag = tag.group(1).decode() if tag else ""
            sock.sendto(request("ACK", target, source, call_id, 1, uri, to_tag=to_tag), target)
            time.sleep(0.3)  # a short call, not a check
            sock.sendto(request("BYE", target, source, call_id, 2, uri, to_tag=to_tag), target)
        rtp.close()
    return {
        "legit_first_response_ms": None if first is None else round(first * 1000, 1),
        "legit_final_status": status,
        "legit_answered_ms": None if answered is None else round(answered * 1000, 1),
    }


def metric(text: str, name: str, label: str | None = None) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (label is None or label in line) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def rss_mb(pid: int) -> float:
    return stats.proc_status_rss_mb(Path(f"/proc/{pid}/status").read_text()) or 0.0


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    sip, http = peers.free_udp_port(), peers.free_udp_port(also_tcp=True)
    target = ("127.0.0.1", sip)
    argv = [*conftest.BRIDGE, "serve", "--sip", f"127.0.0.1:{sip}", "--rtp-port", str(peers.free_rtp_port())]
    argv += [
        "--http",
        f"127.0.0.1:{http}",
        "--invite-rate",
        str(args.invite_rate),
        "--max-calls",
        str(args.max_calls),
        "--options-rate",
        str(args.options_rate),
    ]
    argv += ["--drain-timeout", "0", "--log-level", "info"]
    result: dict[str, Any] = {
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "invite_rate": args.invite_rate,
        "options_rate": args.options_rate,
    }
    bridge = peers.ManagedProcess(argv, cwd=work, env=conftest._clean_env(), name="parlora-bridge")
    samples: list[float] = []
    stop = threading.Event()
    t_start = time.monotonic()
    try:
        bridge.wait_for(r"listening on udp 127\.0\.0\.1:(\d+)", timeout=30)
        result["rss_idle_mb"] = rss_mb(bridge.pid)

        def sample() -> None:
            while not stop.wait(0.5):
                if bridge.running():
                    samples.append(rss_mb(bridge.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        flooder = Flooder("127.0.0.1")
        legit: dict[str, Any] = {}
        timer = threading.Timer(args.invite_seconds / 2, lambda: legit.update(legit_call(target)))
        timer.start()
        achieved = flooder.flood(
            lambda i: invite(target, flooder.address, f"fl{i:08d}x{os.getpid()}", 40000), target, args.rate,
            args.invite_seconds,
        )  # fmt: skip
        timer.join(10)
        flooder.settle()
        invite_codes = dict(flooder.codes)
        flooder.codes.clear()
        invites_sent = flooder.sent
        flooder.method = b"OPTIONS"
        options_achieved = flooder.flood(
            lambda i: request("OPTIONS", target, flooder.address, f"op{i:08d}x{os.getpid()}", 1,
                              f"sip:bridge@127.0.0.1:{sip}"),
            target, args.rate, args.options_seconds,
        )  # fmt: skip
        time.sleep(1.0)  # the last responses arrive (pacing, not a check)
        options_codes = dict(flooder.codes)
        flooder.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as response:  # loopback
            metrics = response.read().decode()
        (work / "metrics.txt").write_text(metrics)
        result.update(legit)
        result.update(
            {
                "invites_sent": invites_sent,
                "options_sent": flooder.sent - invites_sent,
                "invite_rate_achieved_per_s": round(achieved, 1),
                "invite_responses": invite_codes,
                "options_rate_achieved_per_s": round(options_achieved, 1),
                "options_responses": options_codes,
                "rate_limited_total": metric(metrics, "parlora_refusals_total", 'reason="rate_limited"'),
                "options_rate_limited_total": metric(
                    metrics, "parlora_refusals_total", 'reason="options_rate_limited"'
                ),
                "responses_503_total": metric(metrics, "parlora_sip_responses_sent_total", 'code="503"'),
                "calls_total": metric(metrics, "parlora_calls_total"),
                "bridge_alive": bridge.running(),
                "rss_max_mb": round(max(samples), 1) if samples else None,
                "rss_end_mb": round(rss_mb(bridge.pid), 1) if bridge.running() else None,
            }
        )
    finally:
        stop.set()
        bridge.stop(term_timeout=10.0)
        (work / "bridge.log").write_text(bridge.stderr)
    accepted = sum(
        n for code, n in result.get("invite_responses", {}).items() if code in (100, 180, 183, 200)
    )
    result["invites_not_refused_responses"] = accepted
    result["seconds"] = round(time.monotonic() - t_start, 1)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["ok"] = bool(
        result.get("bridge_alive")
        and result.get("legit_final_status") == 200
        and (result.get("legit_answered_ms") or 1e9) < 1000
        and result.get("rate_limited_total", 0) > 0
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s of INVITEs and 2 s of OPTIONS (CI)")
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second from the flooder")
    parser.add_argument("--invite-seconds", type=float)
    parser.add_argument("--options-seconds", type=float)
    parser.add_argument("--invite-rate", type=float, default=5.0, help="serve --invite-rate")
    parser.add_argument("--options-rate", type=float, default=10.0, help="serve --options-rate (burst 20)")
    parser.add_argument("--max-calls", type=int, default=200, help="serve --max-calls (the engine's default)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    args.invite_seconds = args.invite_seconds or (3.0 if args.quick else 20.0)
    args.options_seconds = args.options_seconds or (2.0 if args.quick else 10.0)
    return run_in_scratch(lambda work: run(args, work), "parlora-floods-", keep=args.keep, output=args.output)


if __name__ == "__main__":
    sys.exit(main())
