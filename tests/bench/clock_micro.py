"""Micro-benchmark of the media clock shell's own per-tick cost (rtp/clock.py), on virtual time.

    .venv/bin/python tests/bench/clock_micro.py [--ticks 200000] [--channels 10] [--clock-file PATH] [--json]

One tick is what the loop timer does every 2 ms with 10 phases: `_fire()` (read the clock, `run_due`, re-arm
the one timer). The channels do nothing, so the figure is the shell's own work, not the calls'. The loop is a
stand-in whose `call_at` returns a handle that is never run; the clock is virtual and moved to 1.2 ms past the
next deadline before each tick (an on-time tick, the common case). `--clock-file` loads `MediaClockShell` from
another copy of rtp/clock.py (e.g. `git show HEAD:rtp/clock.py > /tmp/clock_head.py`) to compare two versions
in one sitting. A second figure is the cost of one generation-0 collection (`gc.collect(0)`) while a clock is
running, which includes any `gc.callbacks` the clock registers. Figures are CPU time of this process, best
of 5 runs; run on an idle CPU (or under `taskset`).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class _Handle:
    def cancel(self) -> None:
        pass


class _Loop:
    """Just what the shell uses of a loop: `time()` and `call_at()`."""

    def __init__(self) -> None:
        self.handle = _Handle()

    def time(self) -> float:
        return 0.0

    def call_at(self, when: float, callback: Any) -> _Handle:
        return self.handle


class _Noop:
    def on_slots(self, now: int, due: int, skipped: int) -> None:
        pass


class _Now:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


def load_shell(path: Path | None) -> Any:
    if path is None:
        from rtp.clock import MediaClockShell

        return MediaClockShell
    spec = importlib.util.spec_from_file_location("clock_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MediaClockShell


def per_tick_ns(shell_cls: Any, ticks: int, channels: int, runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        now = _Now()
        shell = shell_cls(_Loop(), now, phases=10)
        for _ in range(channels):
            shell.add(_Noop())
        fire = shell._fire
        next_deadline = shell.next_deadline
        gc.disable()
        t0 = time.process_time_ns()
        for _ in range(ticks):
            now.now = next_deadline() + 1_200_000
            fire()
        spent = time.process_time_ns() - t0
        gc.enable()
        # the loop's own next_deadline() call is part of the harness, not of a tick: measured and taken off
        t1 = time.process_time_ns()
        for _ in range(ticks):
            now.now = next_deadline() + 1_200_000
        harness = time.process_time_ns() - t1
        shell.stop()
        best = min(best, (spent - harness) / ticks)
    return best


def gc0_ns(shell_cls: Any, count: int = 20_000, runs: int = 5) -> float:
    best = float("inf")
    shell = shell_cls(_Loop(), _Now(), phases=10)
    shell.add(_Noop())  # a running clock (whatever it registers is in place)
    try:
        for _ in range(runs):
            t0 = time.process_time_ns()
            for _ in range(count):
                gc.collect(0)
            best = min(best, (time.process_time_ns() - t0) / count)
    finally:
        shell.stop()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=200_000)
    ap.add_argument("--channels", type=int, default=10, help="no-op channels (spread over the 10 phases)")
    ap.add_argument("--clock-file", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    shell_cls = load_shell(args.clock_file)
    results = {
        "clock": str(args.clock_file or "rtp/clock.py"),
        "channels": args.channels,
        "ns_per_tick": round(per_tick_ns(shell_cls, args.ticks, args.channels), 1),
        "ns_per_gen0_collection": round(gc0_ns(shell_cls), 1),
    }
    # 10 phases: 500 ticks a second
    results["pct_of_a_core_at_500_ticks_per_s"] = round(results["ns_per_tick"] * 500 / 1e9 * 100, 4)
    if args.json:
        print(json.dumps(results))
        return
    for k, v in results.items():
        print(f"  {k:<36} {v}")


if __name__ == "__main__":
    main()
