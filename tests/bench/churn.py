"""Churn and leaks: many short calls in sequence and calls that CANCEL while ringing, through one `serve`; then
what the process holds, against a baseline taken after a warm-up.

    .venv/bin/python tests/bench/churn.py                 # 10,000 short calls, 2,000 CANCEL races
    .venv/bin/python tests/bench/churn.py --quick         # 150 short calls, 50 CANCEL races (CI)
    .venv/bin/python tests/bench/churn.py --calls 1000 --cancels 200 --concurrency 10

`serve` (native engine, the embedded echo provider) is called by SIPp: `uac_stream.xml` with a 300 ms call
(`-d 300`), `--concurrency` calls at a time at `--rate` per second; then `uac_cancel.xml` (INVITE, CANCEL at
the 180: a race with the bridge's 200, answered by 487 or, when the 200 won, by the call's own end). 20 calls
warm the process up first (imports, caches, the allocator's pools); the baseline is taken after them. After
the churn the harness waits (bounded) until `GET /sip` shows no active call and `GET /calls` is empty, lets
the RFC 3261 timers of the last transactions run out (`--settle`, default 33 s full, 5 s quick), and reads
again. At exit the engine logs what it still held (`native engine stopped: calls …, transactions …, rtp_ports
…, tasks …`), which the harness parses.

What `serve` does not expose while running (sip/native/agent.py `counts()` has them, no endpoint serves them):
transactions, RTP ports in use, asyncio tasks. Those figures come from the stop line only.

Prints one JSON object (and writes it to --output); tests/bench/README.md says what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
for _p in (BENCH.parent / "integration", BENCH, ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import conftest  # noqa: E402  (BRIDGE, _clean_env)
import peers  # noqa: E402
import stats  # noqa: E402
from report import run_in_scratch  # noqa: E402

_STOPPED = re.compile(r"native engine stopped: (.*)$")
_HEAP = re.compile(r'^parlora_heap\{figure="(\w+)"\} (\S+)$', re.MULTILINE)


def http_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:  # loopback only
        return json.loads(response.read())


def held(pid: int, http: int) -> dict[str, Any]:
    """What the process holds now: RSS, open fds, threads (from /proc) and live calls (from HTTP)."""
    proc = Path(f"/proc/{pid}")
    status = (proc / "status").read_text()
    threads = re.search(r"^Threads:\s+(\d+)", status, re.MULTILINE)
    sip = http_json(http, "/sip")
    calls = http_json(http, "/calls")
    with urllib.request.urlopen(
        f"http://127.0.0.1:{http}/metrics?heap=walk", timeout=5
    ) as response:  # loopback only
        heap = {  # bridge/server/heap.py: glibc's bytes in use, free and mmapped in MB; the interpreter's blocks in k
            figure: round(float(value) / (1e3 if figure == "python_blocks" else 2**20), 2)
            for figure, value in _HEAP.findall(response.read().decode())
        }
    return {
        "heap": heap,
        "rss_mb": round(stats.proc_status_rss_mb(status) or 0.0, 1),
        "fds": len(os.listdir(proc / "fd")),
        "threads": int(threads.group(1)) if threads else None,
        "active_calls": sip.get("active_calls"),
        "calls_listed": len(calls) if isinstance(calls, list) else len(calls.get("calls", [])),
    }


def sipp(
    scenario: str, port: int, work: Path, calls: int, concurrency: int, rate: float, tag: str, *extra: str
) -> peers.SippResult:
    return peers.run_sipp(
        scenario,
        port,
        calls=calls,
        limit=concurrency,
        rate=rate,
        workdir=work / tag,
        extra_args=list(extra),
        timeout=60 + 2 * calls / rate,
    )


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    sip, http = peers.free_udp_port(), peers.free_udp_port(also_tcp=True)
    argv = [*conftest.BRIDGE, "serve", "--sip", f"127.0.0.1:{sip}", "--rtp-port", str(peers.free_rtp_port())]
    argv += ["--http", f"127.0.0.1:{http}", "--max-calls", str(max(50, 4 * args.concurrency))]
    argv += ["--drain-timeout", "0", "--log-level", "info"]
    speech = peers.make_utterance(
        work / "speech.wav", "Hello", lead_silence_s=0.05, tail_silence_s=0.1, ulaw=True
    )
    assert speech.ulaw_path is not None  # ulaw=True
    for tag in ("warmup", "short", "cancel"):
        (work / tag).mkdir()
        (work / tag / "speech.ul").write_bytes(speech.ulaw_path.read_bytes())
    result: dict[str, Any] = {"load_before": [round(x, 2) for x in os.getloadavg()]}
    # the run's parameters: the time depends on them (calls x call length / concurrency), so runs compare only
    # with the same ones
    plan = ("calls", "cancels", "concurrency", "rate", "settle")
    result["plan"] = {k: getattr(args, k) for k in plan} | {"call_ms": 300}
    t_start = time.monotonic()
    bridge = peers.ManagedProcess(argv, cwd=work, env=conftest._clean_env(), name="parlora-bridge")
    try:
        bridge.wait_for(r"listening on udp 127\.0\.0\.1:(\d+)", timeout=30)
        result["at_start"] = held(bridge.pid, http)
        sipp("uac_stream", sip, work, 20, 5, 20, "warmup", "-d", "300")
        _quiet(bridge.pid, http, 30)
        result["baseline"] = held(bridge.pid, http)
        t0 = time.monotonic()
        short = sipp("uac_stream", sip, work, args.calls, args.concurrency, args.rate, "short", "-d", "300")
        t1 = time.monotonic()
        cancel = sipp("uac_cancel", sip, work, args.cancels, args.concurrency, args.rate, "cancel")
        result["churn_seconds"] = round(time.monotonic() - t0, 1)
        # What bounds the churn's time: SIPp holds `concurrency` calls of ~310 ms each (-d 300), so the short
        # calls take calls x call length / concurrency at least, whatever the bridge does (5 at a time: ~640 s).
        result["short_seconds"], result["cancel_seconds"] = round(t1 - t0, 1), round(time.monotonic() - t1, 1)
        result["short_sipp"] = {
            k: short.stats.get(k) for k in ("CallLength(C)", "CallRate(C)", "ResponseTime1(C)")
        }
        result["short_seconds_bound"] = short_bound(short.stats, args.calls, args.concurrency, args.rate)
        result["short_calls"] = {k: short.stats.get(k) for k in ("SuccessfulCall(C)", "FailedCall(C)")}
        result["short_closed"] = len(short.log_events.get("CLOSED", []))
        result["cancel_calls"] = {k: cancel.stats.get(k) for k in ("SuccessfulCall(C)", "FailedCall(C)")}
        result["cancel_terminated_487"] = len(cancel.log_events.get("TERMINATED", []))
        # the race's other outcome: the 200 left before the CANCEL arrived (RFC 3261 9.2: the CANCEL changes
        # nothing); uac_cancel.xml then aborts the call, which SIPp ends with a BYE
        result["cancel_answered_first"] = len(
            re.findall(r"while expecting '487'[^\n]*received 'SIP/2\.0 200", cancel.errors)
        )
        result["quiet_after_s"] = _quiet(bridge.pid, http, 60)
        result["after_churn"] = held(bridge.pid, http)
        time.sleep(
            args.settle
        )  # the last transactions' RFC 3261 timers (Timer J/H: 32 s); pacing, not a check
        result["after_settle"] = held(bridge.pid, http)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5).read().decode()
        (work / "metrics.txt").write_text(metrics)
        result["calls_total_by_outcome"] = {
            m.group(1): float(m.group(2))
            for m in re.finditer(
                r'^parlora_calls_total\{[^}]*outcome="(\w+)"[^}]*\} (\S+)', metrics, re.MULTILINE
            )
        }
    finally:
        bridge.stop(term_timeout=15.0)
        (work / "bridge.log").write_text(bridge.stderr)
    stopped: re.Match[str] | None = None
    for line in reversed(bridge.stderr.splitlines()):
        if m := _STOPPED.search(line):
            stopped = m
            break
    result["engine_at_stop"] = (
        {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", stopped.group(1))} if stopped else None
    )
    base, after = result.get("baseline", {}), result.get("after_settle", {})
    result["growth"] = {
        k: round(after[k] - base[k], 1) for k in ("rss_mb", "fds", "threads") if k in base and k in after
    }
    b_heap, a_heap = base.get("heap", {}), after.get("heap", {})
    result["growth"] |= {  # what a leak grows (malloc_in_use, python_blocks) and what fragmentation does
        f"heap_{k}": round(a_heap[k] - b_heap[k], 2) for k in a_heap.keys() & b_heap.keys()
    }
    result["seconds"] = round(time.monotonic() - t_start, 1)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def sipp_seconds(value: str | None) -> float | None:
    """SIPp's `HH:MM:SS:mmmmmm` duration (its stat CSV's CallLength, ResponseTime) in seconds."""
    if not value or not re.fullmatch(r"\d+:\d+:\d+:\d+", value):
        return None
    h, m, s, us = (int(x) for x in value.split(":"))
    return h * 3600 + m * 60 + s + us / 1e6


def short_bound(stats: dict[str, str], calls: int, concurrency: int, rate: float) -> float | None:
    """The least time SIPp can take for the short calls: at most `concurrency` at once of the measured call
    length each, and no more than `rate` per second."""
    length = sipp_seconds(stats.get("CallLength(C)"))
    if length is None or concurrency <= 0 or rate <= 0:
        return None
    return round(calls / min(rate, concurrency / length), 1)


def _quiet(pid: int, http: int, timeout: float) -> float | None:
    """Wait (bounded) until the bridge holds no call; the seconds it took, or None."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        now = held(pid, http)
        if now["active_calls"] == 0 and now["calls_listed"] == 0:
            return round(time.monotonic() - start, 1)
        time.sleep(0.25)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="150 short calls and 50 CANCEL races (CI)")
    parser.add_argument("--calls", type=int)
    parser.add_argument("--cancels", type=int)
    parser.add_argument("--concurrency", type=int, default=5)
    parser.add_argument("--rate", type=float, default=25.0, help="calls per second")
    parser.add_argument("--settle", type=float, help="seconds for the last transactions' timers")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, SIPp traces)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    args.calls = args.calls or (150 if args.quick else 10_000)
    args.cancels = args.cancels or (50 if args.quick else 2_000)
    args.settle = args.settle if args.settle is not None else (5.0 if args.quick else 33.0)
    return run_in_scratch(lambda work: run(args, work), "parlora-churn-", keep=args.keep, output=args.output)


if __name__ == "__main__":
    sys.exit(main())
