"""A longer fuzzing campaign of the SIP, SDP, RTP and RTCP parsers than CI runs.

CI runs each hypothesis property of tests/unit/sip/test_sip_fuzz.py and tests/unit/rtp/test_rtp_fuzz.py with 200
examples; this runs the same properties with as many as asked (default 20,000 each) and exits with pytest's
status, so a campaign that finds a crash fails and prints the shrunk input.

    .venv/bin/python tests/bench/fuzz.py                   # 20,000 examples per property
    .venv/bin/python tests/bench/fuzz.py --examples 200000 # overnight
    .venv/bin/python tests/bench/fuzz.py --quick           # 1,000 examples: a minute or two
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROPERTIES = ("tests/unit/sip/test_sip_fuzz.py", "tests/unit/rtp/test_rtp_fuzz.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=20_000, help="examples per property")
    parser.add_argument("--quick", action="store_true", help="1,000 examples per property")
    args = parser.parse_args()
    examples = 1_000 if args.quick else args.examples
    env = {**os.environ, "PARLORA_FUZZ_EXAMPLES": str(examples)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PROPERTIES]
    print(f"fuzzing with {examples} examples per property: {' '.join(PROPERTIES)}", flush=True)
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
