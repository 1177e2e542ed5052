"""Finds the event loop's long callbacks in a live bridge: what held the loop, how long, and where it was.

Bench only: the bridge loads it through a `sitecustomize.py` on its PYTHONPATH (`--write-site DIR` writes one),
with the stdlib loop (`PARLORA_EVENT_LOOP=asyncio`: uvloop's handles are compiled and cannot be timed here):

    python tests/bench/slow_callbacks.py --write-site /tmp/slowcb
    python tests/bench/fault_campaign.py --quick --calls 24 \\
        --bridge-env PYTHONPATH=/tmp/slowcb:$PWD --bridge-env PARLORA_EVENT_LOOP=asyncio \\
        --bridge-env PARLORA_BENCH_SLOW_CB=/tmp/slowcb/report.json
    python tests/bench/slow_callbacks.py --show /tmp/slowcb/report.json

What it does in the bridge (`PARLORA_BENCH_SLOW_CB=FILE`, `PARLORA_BENCH_SLOW_CB_MS=5`):

- every `asyncio.events.Handle._run` (a callback, a task's step, a timer) is timed with `thread_time_ns` (CPU:
  on a shared host the wall time is mostly the kernel running others) and `perf_counter_ns`: a run that took
  more CPU than the threshold is kept, under the handle's own description (asyncio's `_format_handle`: the
  task's coroutine, or the callback's function) and the project frames a sampler saw while it ran;
- a sampler thread looks every millisecond whether the current run has lasted more than half the threshold
  and, if so, notes the main thread's stack (its innermost frames in this repository: where the time went, not
  only who was called);
- the cyclic collector's pauses (`gc.callbacks`, CPU time): per generation the count, total, longest and the pauses
  over the threshold, so GC settings can be compared under the same load.

At exit (SIGTERM ends `serve` normally) it writes FILE. The sampler takes the GIL once a millisecond: the
bridge runs slower under it, so read which callbacks are long and by how much relative to each other.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import gc
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parents[2])
SITE = """# written by tests/bench/slow_callbacks.py --write-site: the bridge's long loop callbacks, bench only
import os, sys
if os.environ.get("PARLORA_BENCH_SLOW_CB"):
    sys.path.insert(0, {bench!r})
    import slow_callbacks
    slow_callbacks.install(os.environ["PARLORA_BENCH_SLOW_CB"], float(os.environ.get("PARLORA_BENCH_SLOW_CB_MS", "5")))
"""


class _State:
    def __init__(self, threshold_ns: int) -> None:
        self.threshold_ns = threshold_ns
        self.started = 0  # perf_counter_ns of the running handle's start, 0 when none runs
        self.samples: collections.Counter[str] = collections.Counter()  # for the running handle
        self.slow: dict[str, dict[str, Any]] = {}
        self.runs = 0
        self.gc_started = 0
        self.gc = {g: {"count": 0, "total_ms": 0.0, "max_ms": 0.0, "over": 0} for g in range(3)}
        self.gc_pauses_ms: list[float] = []
        self.lock = threading.Lock()


def _where(frame: Any, depth: int = 6) -> str:
    """The innermost project frames of a stack, innermost first."""
    inner = frame.f_code.co_filename
    out = (
        []
        if inner.startswith(ROOT)
        else [f"{'/'.join(inner.split('/')[-2:])}:{frame.f_lineno} {frame.f_code.co_name}"]
    )
    while frame is not None and len(out) < depth:
        path = frame.f_code.co_filename
        if path.startswith(ROOT) and "/tests/bench/" not in path:
            out.append(f"{path[len(ROOT) + 1 :]}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(out) or "(outside the project)"


def install(report: str, threshold_ms: float) -> None:
    import asyncio.base_events
    import asyncio.events

    state = _State(int(threshold_ms * 1e6))
    main_id = threading.get_ident()
    original = asyncio.events.Handle._run

    def timed(self: asyncio.events.Handle) -> None:
        state.samples.clear()
        cpu = time.thread_time_ns()
        state.started = begun = time.perf_counter_ns()
        try:
            original(self)
        finally:
            took = time.perf_counter_ns() - begun
            cpu = time.thread_time_ns() - cpu
            state.started = 0
            state.runs += 1
            if cpu > state.threshold_ns:  # CPU time: on a busy host the wall time is mostly preemption
                with state.lock:
                    where = state.samples.most_common(1)[0][0] if state.samples else "(not sampled)"
                    what = asyncio.base_events._format_handle(self)  # type: ignore[attr-defined]
                    what = re.sub(r" when=[0-9.]+| wait_for=.*| cb=\[.*| at 0x[0-9a-f]+", "", what)[:160]
                    key = f"{what} @ {where}"
                    entry = state.slow.setdefault(
                        key, {"count": 0, "total_cpu_ms": 0.0, "max_cpu_ms": 0.0, "max_wall_ms": 0.0}
                    )
                    entry["count"] += 1
                    entry["total_cpu_ms"] += cpu / 1e6
                    entry["max_cpu_ms"] = max(entry["max_cpu_ms"], cpu / 1e6)
                    entry["max_wall_ms"] = max(entry["max_wall_ms"], took / 1e6)

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]

    def sampler() -> None:
        half = state.threshold_ns // 2
        while True:
            time.sleep(0.001)
            started = state.started
            if started and time.perf_counter_ns() - started > half:
                frame = sys._current_frames().get(main_id)
                if frame is not None and state.started == started:
                    with state.lock:
                        state.samples[_where(frame)] += 1

    threading.Thread(target=sampler, name="slow-callbacks", daemon=True).start()

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            state.gc_started = time.thread_time_ns()
            return
        took_ms = (time.thread_time_ns() - state.gc_started) / 1e6  # CPU: the host is shared
        g = state.gc[info.get("generation", 0)]
        g["count"] += 1
        g["total_ms"] += took_ms
        g["max_ms"] = max(g["max_ms"], took_ms)
        g["over"] += took_ms * 1e6 > state.threshold_ns
        state.gc_pauses_ms.append(took_ms)

    gc.callbacks.append(on_gc)

    def write() -> None:
        pauses = sorted(state.gc_pauses_ms)
        out = {
            "threshold_ms": threshold_ms,
            "runs": state.runs,
            "slow": sorted(
                ({"what": k, **{n: round(v, 2) for n, v in e.items()}} for k, e in state.slow.items()),
                key=lambda e: -e["max_cpu_ms"],
            ),
            "gc": {
                "thresholds": list(gc.get_threshold()),
                "frozen": gc.get_freeze_count(),
                "by_generation": {
                    str(g): {n: round(v, 2) for n, v in e.items()} for g, e in state.gc.items()
                },
                "pause_p50_ms": round(pauses[len(pauses) // 2], 3) if pauses else None,
                "pause_p99_ms": round(pauses[int(len(pauses) * 0.99)], 3) if pauses else None,
                "pause_max_ms": round(pauses[-1], 3) if pauses else None,
                "total_ms": round(sum(pauses), 1),
            },
            "pid": os.getpid(),
        }
        Path(report).write_text(json.dumps(out, indent=1) + "\n")

    atexit.register(write)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write-site", type=Path, help="write DIR/sitecustomize.py that installs this")
    parser.add_argument("--show", type=Path, help="print a report's slow callbacks, longest first")
    args = parser.parse_args()
    if args.write_site:
        args.write_site.mkdir(parents=True, exist_ok=True)
        (args.write_site / "sitecustomize.py").write_text(SITE.format(bench=str(Path(__file__).parent)))
    if args.show:
        report = json.loads(args.show.read_text())
        for e in report["slow"]:
            print(
                f"{e['max_cpu_ms']:7.1f} ms CPU max ({e['max_wall_ms']:6.1f} wall) {e['count']:5d}x "
                f"{e['total_cpu_ms']:8.1f} ms  {e['what']}"
            )
        print(json.dumps(report["gc"]))


if __name__ == "__main__":
    main()
