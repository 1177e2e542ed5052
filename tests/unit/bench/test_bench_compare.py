"""run.py's side-by-side runs (tests/bench/compare.py): the --paths and --pin settings it accepts and refuses,
and the table that sets each step's figures on the two media paths next to each other. No processes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compare


def test_paths_are_compiled_and_or_pure_each_once_in_the_order_given() -> None:
    assert compare.parse_paths("compiled,pure") == ("compiled", "pure")
    assert compare.parse_paths(" pure , compiled ") == ("pure", "compiled")
    assert compare.parse_paths("pure") == ("pure",)
    for bad in ("", ",", "fast", "pure,pure", "compiled,c"):
        with pytest.raises(ValueError, match="--paths"):
            compare.parse_paths(bad)


def test_pins_are_pin_settings_or_off_each_once() -> None:
    assert compare.parse_pins(["auto", "off"], 2) == (("1", "0"), None)
    assert compare.parse_pins(["off", "3:0-2"], 4) == (None, ("3", "0-2"))
    assert compare.parse_pins(["auto"], 4) == (("3", "0-2"),)
    with pytest.raises(ValueError, match="each given once"):
        compare.parse_pins(["auto", "auto"], 2)
    with pytest.raises(ValueError, match="BRIDGE:PEERS"):
        compare.parse_pins(["auto", "none"], 2)
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        compare.parse_pins(["auto"], 1)
    assert [compare.pin_label(p) for p in compare.parse_pins(["1:0", "off"], 2)] == ["pinned 1:0", "unpinned"]


def _row(path: str | None, calls: int, pinned: dict[str, str] | None, **figures: Any) -> dict[str, Any]:
    return {"engine": "native", "calls": calls, "media_path_asked": path, "pinned": pinned, **figures}


def test_side_by_side_gives_each_step_one_line_with_each_figure_per_path() -> None:
    pinned = {"bridge": "1", "peers": "0"}
    rows = [
        _row("compiled", 100, pinned, cpu_pct_per_call=0.31, rtp_interval_p99_ms=21.5, calls_failed=0),
        _row("pure", 100, pinned, cpu_pct_per_call=0.4, rtp_interval_p99_ms=23.25, calls_failed=0),
        _row("compiled", 100, None, cpu_pct_per_call=0.33, calls_failed=1),
        _row("compiled", 200, pinned, cpu_pct_per_call=0.35),  # its pure run failed to start: no row
    ]
    lines = compare.side_by_side(rows).splitlines()
    head = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert head[:3] == ["engine", "pin", "calls"]
    assert head[3:] == [f"{label} (compiled / pure)" for label, _ in compare.FIGURES]
    assert lines[1] == "|" + "---|" * len(head)
    body = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert [b[:3] for b in body] == [
        ["native", "pinned 1:0", "100"],
        ["native", "unpinned", "100"],
        ["native", "pinned 1:0", "200"],
    ]
    column = {key: 3 + i for i, (_, key) in enumerate(compare.FIGURES)}
    assert body[0][column["cpu_pct_per_call"]] == "0.31 / 0.4"
    assert body[0][column["rtp_interval_p99_ms"]] == "21.5 / 23.25"
    assert body[0][column["calls_failed"]] == "0 / 0"
    assert body[0][column["barge_in_ms_p99"]] == "— / —"  # not measured: null in the JSON
    assert body[1][column["calls_failed"]] == "1 / —"  # no pure row for this pin setting
    assert body[2][column["cpu_pct_per_call"]] == "0.35 / —"
