"""The session coordinator stays a router (DESIGN §2): its module, class included, is at most 300 lines.

A rule that grows there belongs in the room that owns it (bridge/engine/rooms.py lists them); the coordinator
only tells each room what concerns it.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
COORDINATOR = ROOT / "bridge" / "engine" / "coordinator.py"
MAX_LINES = 300


def test_the_coordinator_is_at_most_300_lines() -> None:
    lines = len(COORDINATOR.read_text().splitlines())
    assert lines <= MAX_LINES, f"bridge/engine/coordinator.py has {lines} lines (at most {MAX_LINES})"
