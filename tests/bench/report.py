"""What every tests/bench harness does around its run: a scratch directory (kept with --keep), one JSON object
printed (and written to --output), and the exit status from its `ok` (harnesses without one exit 0)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_in_scratch(
    run: Callable[[Path], dict[str, Any]], prefix: str, *, keep: bool, output: Path | None
) -> int:
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        result = run(work)
    finally:
        if keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if output:
        output.write_text(text + "\n")
    return 0 if result.get("ok", True) else 1
