"""No Python file under sip/ is longer than 800 lines: a SIP module that grows past it is split along its seams
(its RFC sections, the sans-I/O core beside its shell), as message, sdp, transaction and the native engine were.
README.md stays a front door of at most 200 lines.

The files are read as text (nothing is imported); a line is what `wc -l` counts.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MAX_LINES = 800


def too_long(root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """Every .py file under `root`/sip with more than `limit` lines, with its length."""
    found: list[str] = []
    for path in sorted((root / "sip").rglob("*.py")):
        lines = path.read_bytes().count(b"\n")
        if lines > limit:
            found.append(f"{path.relative_to(root).as_posix()}: {lines} lines")
    return found


def test_no_sip_file_is_over_800_lines() -> None:
    assert too_long() == []


def test_the_check_sees_a_long_file(tmp_path: Path) -> None:
    """A planted tree: 801 lines is reported, 800 is not, and only files under sip/ count."""
    (tmp_path / "sip" / "core").mkdir(parents=True)
    (tmp_path / "bridge").mkdir()
    (tmp_path / "sip" / "core" / "long.py").write_text("x = 1\n" * 801)
    (tmp_path / "sip" / "core" / "full.py").write_text("x = 1\n" * 800)
    (tmp_path / "bridge" / "long.py").write_text("x = 1\n" * 900)
    assert too_long(tmp_path) == ["sip/core/long.py: 801 lines"]


def test_the_readme_is_a_front_door() -> None:
    """README.md says what it is, the two commands, a first call, placing calls, the shape of a deployment and
    where to read on, in at most 200 lines; the manual is docs/."""
    assert (ROOT / "README.md").read_bytes().count(b"\n") <= 200
