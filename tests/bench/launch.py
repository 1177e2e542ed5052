"""Runs `python -m bridge ARGS...` with benchmark-only process settings, for `run.py --gc-stats/--gc-freeze`.

    python tests/bench/launch.py [--gc-stats FILE] [--gc-freeze-after S] -- serve --engine native ...

- `--gc-stats FILE`: times every collection of the cyclic garbage collector (`gc.callbacks`) and writes, at
  exit, per generation the number of collections, the seconds they took and the objects they collected, so a
  step can say how much of the bridge's CPU went to the collector.
- `--gc-freeze-after S`: S seconds after start (the server is listening, no call yet), `gc.collect()` then
  `gc.freeze()`: everything alive then (modules, classes, the server's own objects) moves to the permanent
  generation, which no later collection walks.

- `PARLORA_BENCH_GC_CENSUS=FILE` in the environment (`run.py --bridge-env`): on SIGUSR1 the objects the
  collector tracks are counted by type into FILE (what a full collection walks: the cause of its long pauses).

Nothing here is part of the product; `serve` itself is unchanged.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import gc
import json
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any


class GcClock:
    """Accumulates the collector's time per generation from `gc.callbacks`."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.collected = [0, 0, 0]
        self._started = 0.0
        self.frozen_at: float | None = None
        self.frozen_objects = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        gen = int(info.get("generation", 0))
        self.count[gen] += 1
        self.seconds[gen] += time.perf_counter() - self._started
        self.collected[gen] += int(info.get("collected", 0))

    def report(self) -> dict[str, Any]:
        return {
            "collections": self.count,
            "seconds": [round(s, 4) for s in self.seconds],
            "collected": self.collected,
            "frozen_at_s": self.frozen_at,
            "frozen_objects": self.frozen_objects,
            "thresholds": list(gc.get_threshold()),
        }


def write_census(path: Path) -> None:
    """On SIGUSR1: what the collector tracks now, by type (the objects a full collection walks), to `path`."""
    by_type = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    report = {
        "tracked": sum(by_type.values()),
        "frozen": gc.get_freeze_count(),
        "top": by_type.most_common(40),
    }
    path.write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # the bridge imports as under `python -m bridge`, not from tests/bench
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gc-stats", type=Path, default=None)
    parser.add_argument("--gc-freeze-after", type=float, default=None)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    t0 = time.monotonic()
    clock = GcClock()
    if args.gc_stats is not None:
        gc.callbacks.append(clock)
        path: Path = args.gc_stats

        def write() -> None:
            path.write_text(json.dumps(clock.report()) + "\n")

        atexit.register(write)
    if args.gc_freeze_after is not None:

        def freeze() -> None:
            gc.collect()
            gc.freeze()
            clock.frozen_at = round(time.monotonic() - t0, 2)
            clock.frozen_objects = gc.get_freeze_count()

        timer = threading.Timer(args.gc_freeze_after, freeze)
        timer.daemon = True
        timer.start()
    if census_path := os.environ.get(
        "PARLORA_BENCH_GC_CENSUS"
    ):  # run.py --bridge-env PARLORA_BENCH_GC_CENSUS=F
        signal.signal(signal.SIGUSR1, lambda *_: write_census(Path(census_path)))
    sys.argv = ["bridge", *rest]
    runpy.run_module("bridge", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
