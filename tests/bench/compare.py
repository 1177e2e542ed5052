"""The side-by-side runs of tests/bench/run.py: which media paths and pin settings each step runs on, and the
table that sets their figures next to each other. Pure helpers (no process, no clock), unit-tested in
tests/unit/bench/test_bench_compare.py.

`--paths compiled,pure` runs every step once per media path (rtp.speedups: the bridge's environment gets
PARLORA_PURE_MEDIA=1 for the pure one and an empty one for the compiled one; the step records what GET /sip says
the bridge ran). `--pin auto --pin off` runs every step once per pin setting (`--pin` is repeatable; `off` is
unpinned). One step's runs follow each other (pin, then calls, then path innermost), so that the two paths of
one step see the machine in the same state.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

MEDIA_PATHS = ("compiled", "pure")
UNPINNED = "off"
# (label, key) of each figure set side by side: today's table's headline figures
FIGURES = (
    ("failed", "calls_failed"),
    ("CPU %/call", "cpu_pct_per_call"),
    ("RSS MB/call", "rss_mb_per_call"),
    ("RTP p99 ms", "rtp_interval_p99_ms"),
    ("outside 20±2 %", "rtp_interval_outside_2ms_pct"),
    ("latency in p99 ms", "added_latency_in_p99_ms"),
    ("out first frame p99 ms", "added_latency_out_first_p99_ms"),
    ("barge-in p99 ms", "barge_in_ms_p99"),
    ("recovery p99 ms", "recovery_ms_p99"),
)


def parse_pin(value: str, ncpu: int) -> tuple[str, str]:
    """`--pin`: "auto" (the bridge on the last CPU, the peers on the others) or "BRIDGE:PEERS" CPU lists."""
    if value == "auto":
        if ncpu < 2:
            raise ValueError("--pin needs at least 2 CPUs")
        return str(ncpu - 1), "0" if ncpu == 2 else f"0-{ncpu - 2}"
    bridge, sep, others = value.partition(":")
    if not sep or not re.fullmatch(r"[0-9,-]+", bridge) or not re.fullmatch(r"[0-9,-]+", others):
        raise ValueError(f"--pin takes auto or BRIDGE:PEERS CPU lists (e.g. 1:0), not {value!r}")
    return bridge, others


def parse_paths(value: str) -> tuple[str, ...]:
    """`--paths`: media paths, comma-separated, each once (compiled, pure)."""
    paths = tuple(p.strip() for p in value.split(",") if p.strip())
    unknown = [p for p in paths if p not in MEDIA_PATHS]
    if not paths or unknown or len(set(paths)) != len(paths):
        raise ValueError(
            f"--paths takes {' and/or '.join(MEDIA_PATHS)}, comma-separated, each once: {value!r}"
        )
    return paths


def parse_pins(values: Sequence[str], ncpu: int) -> tuple[tuple[str, str] | None, ...]:
    """`--pin`, repeatable: each setting as one `--pin` takes it, or `off` (unpinned: None), each once."""
    if len(set(values)) != len(values):
        raise ValueError(f"--pin settings are each given once, not {list(values)!r}")
    return tuple(None if value == UNPINNED else parse_pin(value, ncpu) for value in values)


def pin_label(pin: tuple[str, str] | None) -> str:
    return "unpinned" if pin is None else f"pinned {pin[0]}:{pin[1]}"


def _fmt(value: Any) -> str:
    return "—" if value is None else f"{value:g}"


def side_by_side(rows: Sequence[dict[str, Any]], paths: Sequence[str] = MEDIA_PATHS) -> str:
    """One line per engine, pin setting and step; per figure, its value on each path ("compiled / pure").
    A path a step has no row for (it failed to start) shows "—"."""
    steps: dict[tuple[Any, str, Any], dict[str, dict[str, Any]]] = {}
    for r in rows:
        key = (r.get("engine"), pin_label(pin_of(r.get("pinned"))), r.get("calls"))
        steps.setdefault(key, {})[str(r.get("media_path_asked"))] = r
    head = (
        "| engine | pin | calls | "
        + " | ".join(f"{label} ({' / '.join(paths)})" for label, _ in FIGURES)
        + " |"
    )
    lines = [head, "|" + "---|" * (3 + len(FIGURES))]
    for (engine, pin, calls), by_path in steps.items():
        cells = [" / ".join(_fmt(by_path.get(path, {}).get(key)) for path in paths) for _, key in FIGURES]
        lines.append(f"| {engine} | {pin} | {calls} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pin_of(pinned: dict[str, str] | None) -> tuple[str, str] | None:
    """A step's `pinned` (JSON) as the (bridge, peers) pair `pin_label` takes."""
    return None if pinned is None else (pinned["bridge"], pinned["peers"])
