"""Comments, docstrings and prose carry the rule, the RFC section or the measured fact, never a tracker's number.

A tracker's number in a comment tells a reader nothing the tree can: "bounded" followed by a number sends them
elsewhere, "bounded: hostile input cannot grow it" is the rule. This scans the repository's source and prose
(.py, .md, .sh, .toml, .xml, and `.ci/run`) for the word issue followed by a number (also plural, with `#`, or
with the number wrapped onto the next comment line) and for dashed fences around the word. Test function names
are not prose: a name that glues the number to the word is left to its file. The forms caught and spared are
spelled out in the first test (built from pieces, so this file passes its own scan).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SUFFIXES = frozenset({".py", ".md", ".sh", ".toml", ".xml"})
EXTRA_FILES = (".ci/run",)
# Directories never scanned: virtual environments, git's own, caches, and dated bench results (data, not prose).
SKIPPED_DIRS = frozenset(
    {".git", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
)
SKIPPED_PATHS = ("tests/bench/results/",)

# The word (capitalised or not, singular or plural), an optional `#`, then digits, possibly on the next comment
# line. `\b` keeps a test name that glues them with `_` and the word "issued" out.
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues?\b[ \t]*(?:\n[ \t]*#?[ \t]*)?#?(?:[ \t]|\n)*\d", re.MULTILINE)
FENCE = re.compile(r"-{2,}[ \t]*(?:end[ \t]+)?[Ii]ssue\b")


def _skipped(rel: str) -> bool:
    parts = rel.split("/")
    if any(part in SKIPPED_DIRS or part.startswith(".venv") for part in parts[:-1]):
        return True
    return rel.startswith(SKIPPED_PATHS)


def _files() -> list[Path]:
    found = [p for p in ROOT.rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    found += [ROOT / extra for extra in EXTRA_FILES if (ROOT / extra).is_file()]
    return sorted(p for p in found if not _skipped(p.relative_to(ROOT).as_posix()))


def _hits(text: str) -> list[tuple[int, str]]:
    hits = []
    for pattern in (ISSUE_NUMBER, FENCE):
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            hits.append((line, " ".join(match.group(0).split())))
    return sorted(hits)


def test_the_patterns_catch_each_form_and_spare_names() -> None:
    caught = [
        text.format(i="issue", I="Issue")
        for text in (
            "# bounded ({i} 17)",
            "{I} 13: no list made for nothing",
            "({i}s 13 and 17)",
            "# --- {i} 14: `call` ---",
            "# --- end {i} 14 ---",
            '"""POST /calls: 202 with the call id ({i}\n        14)."""',
            "# the drain ({i}\n    # 15) waits",
            "{i} #12",
        )
    ]
    spared = [
        "def test_{i}15_events_cdr_and_recording_of_a_live_call():".format(i="issue"),
        "def test_zeromf_gets_483_under_{i}_13s_rule():".format(i="issue"),
        "handles issued 3 times",
        "the nonce's issue time",
        "# hard stop 35 s",
    ]
    assert [bool(_hits(text)) for text in caught] == [True] * len(caught)
    assert [_hits(text) for text in spared] == [[]] * len(spared)


def test_the_scan_reads_the_tree_and_skips_what_it_should() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in _files()}
    assert {
        "bridge/engine/coordinator.py",
        "pyproject.toml",
        "README.md",
        "tests/unit/project/test_comments.py",
    } <= files
    assert not [f for f in files if f.startswith((".venv", ".git/", "tests/bench/results/"))]
    assert {"sip/native/agent.py", "sip/core/ua.py", "rtp/clock.py"} <= files


def test_no_comment_docstring_or_prose_names_an_issue_number_or_fence() -> None:
    found = []
    for path in _files():
        for line, what in _hits(path.read_text(encoding="utf-8", errors="replace")):
            found.append(f"{path.relative_to(ROOT).as_posix()}:{line}: {what}")
    assert found == [], f"{len(found)} issue tags or fences:\n" + "\n".join(found)
