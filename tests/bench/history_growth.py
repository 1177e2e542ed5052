"""What one long call keeps in memory, measured with tracemalloc on virtual time.

Drives tests/support/long_call.py's `LongCall` (the session engine's in-process pieces, no sockets, no sleeps:
a turn every 10 s with a tool call, a rollover every 30 s, a recovery every 37 turns) and takes a tracemalloc
snapshot at simulated 30, 60 and 120 minutes (after a 5-minute warm-up). Prints the top growers between 30 and
120 minutes by source line, in bytes per simulated hour, and the total growth per hour of each interval (the
bounded windows fill in the first hour: the 60-120 figure is the steady state).

    .venv/bin/python tests/bench/history_growth.py            # 2 simulated hours (about a minute)
    .venv/bin/python tests/bench/history_growth.py --quick    # 40 simulated minutes
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.support

from tests.support.long_call import LongCall


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="10/20/40 simulated minutes instead of 30/60/120"
    )
    parser.add_argument("--marks", help="the simulated minutes to snapshot at, e.g. 60,120,240")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--output", help="also write the figures as JSON here")
    args = parser.parse_args()
    marks: tuple[int, ...] = (10, 20, 40) if args.quick else (30, 60, 120)
    if args.marks:
        marks = tuple(int(m) for m in args.marks.split(","))
    call = LongCall()
    call.run(5)  # warm-up: caches, interned strings, the first connections
    tracemalloc.start(1)
    snapshots: dict[int, tracemalloc.Snapshot] = {}
    done = 5.0
    for mark in marks:
        call.run(mark - done)
        done = mark
        gc.collect()
        snapshots[mark] = tracemalloc.take_snapshot().filter_traces(
            (
                tracemalloc.Filter(False, tracemalloc.__file__),
                tracemalloc.Filter(False, "<frozen*>"),
                tracemalloc.Filter(False, "*/long_call.py"),
            )
        )
    tracemalloc.stop()
    first, last = marks[0], marks[-1]
    hours = (last - first) / 60
    stats = snapshots[last].compare_to(snapshots[first], "lineno")
    total = sum(s.size_diff for s in stats)
    top = [
        {
            "where": f"{s.traceback[0].filename.split('/work/main/')[-1]}:{s.traceback[0].lineno}",
            "bytes_per_hour": round(s.size_diff / hours),
            "count_per_hour": round(s.count_diff / hours),
        }
        for s in stats[: args.top]
    ]
    by_mark = {m: sum(t.size for t in snapshots[m].traces) for m in marks}
    intervals = {  # growth per simulated hour in each interval: the last one shows the windows full
        f"{a}-{b}": round((by_mark[b] - by_mark[a]) * 60 / (b - a))
        for a, b in zip(marks, marks[1:], strict=False)
    }
    result = {
        "simulated_minutes": list(marks),
        "traced_bytes": by_mark,
        "growth_bytes_per_hour": round(total / hours),
        "growth_bytes_per_hour_by_interval": intervals,
        "turns": call.turns,
        "rollovers_opened": call.rollovers_opened,
        "recoveries": call.recoveries,
        "jobs_dispatched": call.dispatched,
        "top": top,
    }
    print(json.dumps(result, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
