"""The session core's stateful property test (DESIGN §14 S1-S7): the machine of
tests/unit/bridge/test_session_properties.py over many drawn call histories — caller speech and pauses, each
connection's events, faults, the rollover timeline, hold and ringing, barge-in, jobs, hang-up — checking every
promise after every step. Exits 1 with the shrunk step sequence of the first broken promise it finds, 0 when
none broke.

CI runs the machine on the `--quick` budget with the same histories every run, and the cases it has found, as
that module's tests. This runs it over new histories: 200 examples of 60 steps (`--quick`, about 10 s when no
promise breaks, plus up to 40 s of shrinking when one does) or the long profile (5,000 of 150), or as many as
asked.

    .venv/bin/python tests/bench/properties.py --quick
    .venv/bin/python tests/bench/properties.py                    # the long profile
    .venv/bin/python tests/bench/properties.py --examples 50000   # overnight
    .venv/bin/python tests/bench/properties.py --quick --seed 7   # one history set again
    .venv/bin/python tests/bench/properties.py --warm --statistics # the warm-transfer machine, how far it got

`--warm` runs `WarmTransferMachine` (the warm transfer amid recoveries, rollovers, holds, barge-ins) instead of
the session's machine; `--statistics` prints hypothesis's statistics of the run, with the machine's `event`s
(how far each warm transfer got and what its acceptance met), which pytest's `--hypothesis-show-statistics`
does not show for a state machine run from a plain test.

A failing case is kept in hypothesis's example database (.hypothesis/, in the working directory) and is tried
first on the next run.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import hypothesis.core
from hypothesis import settings
from hypothesis.statistics import collector, describe_statistics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "bridge"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the tests' tests.support

import test_session_properties as machine  # the unit tests' folder, put on the path above


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 examples of 60 steps")
    parser.add_argument("--examples", type=int, default=None, help="examples (default: the profile's)")
    parser.add_argument("--steps", type=int, default=None, help="steps per example (default: the profile's)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis's seed (default: a random one)")
    parser.add_argument("--warm", action="store_true", help="the warm-transfer machine")
    parser.add_argument("--statistics", action="store_true", help="print the run's statistics and events")
    args = parser.parse_args()
    profile = machine.PROFILE if args.quick else machine.LONG
    if args.examples is not None:
        profile = settings(profile, max_examples=args.examples)
    if args.steps is not None:
        profile = settings(profile, stateful_step_count=args.steps)
    print(
        f"session properties: {profile.max_examples} examples of {profile.stateful_step_count} steps",
        flush=True,
    )
    if args.seed is not None:
        hypothesis.core.global_force_seed = args.seed  # what pytest's --hypothesis-seed sets
    which = machine.WarmTransferMachine if args.warm else machine.SessionMachine
    stats: list[str] = []
    try:
        with collector.with_value(lambda found: stats.append(describe_statistics(found))):
            machine.run_the_machine(profile, 40 if args.quick else 300, which)
    except AssertionError:
        traceback.print_exc()
        return 1
    finally:
        if args.statistics:  # (hypothesis's own events name whole strategies: cut short)
            print("\n".join(line[:160] for found in stats for line in found.splitlines()))
    print("no promise broken")
    return 0


if __name__ == "__main__":
    sys.exit(main())
