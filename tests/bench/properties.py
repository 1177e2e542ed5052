"""The session core's stateful property test (tests/unit/test_session_properties.py, DESIGN §14 S1-S7) with
the long profile: many more and longer call histories than CI runs.

CI runs 200 examples of 60 steps (under a minute); this runs `long` (5,000 examples of 150
steps) or as many as asked, and exits with pytest's status, so a run that finds a broken promise fails and
prints the shrunk step sequence.

    .venv/bin/python tests/bench/properties.py                    # the long profile
    .venv/bin/python tests/bench/properties.py --examples 50000   # overnight
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROPERTY = "tests/unit/test_session_properties.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=None, help="examples (default: the long profile's)")
    parser.add_argument("--steps", type=int, default=None, help="steps per example (default: the profile's)")
    args = parser.parse_args()
    env = {**os.environ, "HYPOTHESIS_PROFILE": "long"}
    if args.examples is not None:
        env["PARLORA_PROPERTY_EXAMPLES"] = str(args.examples)
    if args.steps is not None:
        env["PARLORA_PROPERTY_STEPS"] = str(args.steps)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=0", PROPERTY]
    print(f"session properties, long profile: {PROPERTY}", flush=True)
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
