"""Micro-benchmark of rtp/srtp.py: ns per 172-byte RTP packet (12-byte header + 160 bytes of PCMU), best of 5.

    .venv/bin/python tests/bench/srtp_micro.py [--n 50000] [--json]

For each suite: `protect` (our frame out), `unprotect` (the caller's frame in; each packet a new sequence
number, as on the wire, so the replay window moves as it does in a call), and the RTCP pair for a 52-byte
receiver report. The media path runs protect and unprotect 50 times a second per call: at 300 calls that is
15,000 of each per second, so the table also prints the share of one core that costs. CPU time of this
process; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rtp.packet import build
from rtp.srtp import SUITES, SrtpContext

CALLS = 300
PACKETS_PER_S = 50


def best(fn: Callable[[int], None], n: int, runs: int = 5) -> float:
    """ns per iteration of `fn(n)` (which loops n times), best of `runs`."""
    out = math.inf
    for _ in range(runs):
        t0 = time.process_time_ns()
        fn(n)
        out = min(out, (time.process_time_ns() - t0) / n)
    return out


def measure(name: str, n: int) -> dict[str, float]:
    info = SUITES[name]
    a, b = os.urandom(info.key_salt_length), os.urandom(info.key_salt_length)
    payload = bytes(range(160))
    plain = [build(0, False, seq & 0xFFFF, seq * 160, 0x1234ABCD, payload) for seq in range(n * 6)]
    rr = (
        struct.pack("!BBHI", 0x81, 201, 7, 0x1234ABCD)
        + bytes(24)
        + struct.pack("!BBH", 0x81, 202, 4)
        + bytes(12)
    )
    results: dict[str, float] = {}
    tx = SrtpContext(name, a, b)
    rx = SrtpContext(name, b, a)
    wire = [tx.protect(p) for p in plain]  # one context numbering them, for the unprotect runs below
    tx2 = SrtpContext(name, a, b)
    out_chunk, in_chunk = iter(range(6)), iter(range(6))  # each run sends packets not yet sent (no replays)

    def run_protect(k: int) -> None:
        start = next(out_chunk) * n
        protect = tx2.protect
        for p in plain[start : start + k]:
            protect(p)

    def run_unprotect(k: int) -> None:
        start = next(in_chunk) * n
        unprotect = rx.unprotect
        for w in wire[start : start + k]:
            unprotect(w)

    results["protect_ns"] = best(run_protect, n)
    results["unprotect_ns"] = best(run_unprotect, n)
    assert rx.auth_failures == 0 and rx.errors == 0, rx.counters()  # every packet was fresh and authentic
    srtcp = [tx.protect_rtcp(rr) for _ in range(n)]

    def run_protect_rtcp(k: int) -> None:
        for _ in range(k):
            tx.protect_rtcp(rr)

    def run_unprotect_rtcp(k: int) -> None:
        for w in srtcp[:k]:
            rx.unprotect_rtcp(w)

    results["protect_rtcp_ns"] = best(run_protect_rtcp, n, runs=1)
    results["unprotect_rtcp_ns"] = best(run_unprotect_rtcp, n, runs=1)  # once: a second pass is all replays
    per_s = CALLS * PACKETS_PER_S * (results["protect_ns"] + results["unprotect_ns"])
    results[f"core_share_at_{CALLS}_calls_pct"] = per_s / 1e9 * 100
    results["wire_bytes"] = float(len(wire[0]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    table = {name: measure(name, args.n) for name in SUITES}
    if args.json:
        print(json.dumps(table, indent=1))
        return
    print(
        f"{'suite':26} {'protect':>9} {'unprotect':>9} {'rtcp out':>9} {'rtcp in':>9} {'wire':>5}  core@{CALLS}"
    )
    for name, r in table.items():
        print(
            f"{name:26} {r['protect_ns']:8.0f}n {r['unprotect_ns']:8.0f}n {r['protect_rtcp_ns']:8.0f}n "
            f"{r['unprotect_rtcp_ns']:8.0f}n {r['wire_bytes']:5.0f}  {r[f'core_share_at_{CALLS}_calls_pct']:.2f} %"
        )
    print(
        "ns per 172-byte RTP packet (RTCP: a 52-byte RR+SDES); core share = protect + unprotect at 50 pkt/s/call"
    )


if __name__ == "__main__":
    main()
