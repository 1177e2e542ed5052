"""Harness moved unchanged from tests/integration/test_reliability_quick.py: BENCH, run_quick."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import peers

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run_quick(script: str, tmp_path: Path, *args: str, timeout: float) -> dict[str, Any]:
    """Run tests/bench/SCRIPT --quick (bounded, stopped by PID) and return the JSON it wrote."""
    output = tmp_path / f"{Path(script).stem}.json"
    argv = [sys.executable, str(BENCH / script), "--quick", "--output", str(output), *args]
    proc = peers.ManagedProcess(argv, cwd=tmp_path, name=Path(script).stem)
    try:
        proc.wait(timeout)
    finally:
        proc.stop(term_timeout=15.0)
    assert output.exists(), f"{script} wrote no JSON (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(output.read_text())
    print(json.dumps(result, indent=1, sort_keys=True))  # the figures of this run, in the test's output
    return result
