"""No test module imports another: what tests share lives in tests/support.

A test module that takes a fake or a constant from another test module ties the two files together
(collecting one runs the other's module code, renaming a test breaks a neighbour); the shared
harnesses live in tests/support/, and the test modules import them from there. The benches in
tests/bench are drivers, not tests, and stay outside the rule (properties.py drives the session
state machine of test_session_properties).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
CHECKED = ("unit", "integration", "conformance", "support")


def names_of_test_modules(tests: Path) -> set[str]:
    return {path.stem for path in tests.rglob("test_*.py")}


def imported_modules(node: ast.AST) -> list[str]:
    """The dotted module names an import statement may bring in: `from a import b` gives a and a.b."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module is not None:
        return [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return []


def imports_of_test_modules(tests: Path) -> list[str]:
    names = names_of_test_modules(tests)
    offences = []
    for folder in CHECKED:
        for path in sorted((tests / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                for module in imported_modules(node):
                    if any(part in names for part in module.split(".")):
                        offences.append(
                            f"{path.relative_to(tests)}:{getattr(node, 'lineno', 0)} imports {module}"
                        )
                        break
    return offences


def test_no_test_module_imports_another_test_module() -> None:
    assert imports_of_test_modules(TESTS) == []


def test_the_scan_sees_a_test_module_imported_either_way(tmp_path: Path) -> None:
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_a.py").write_text("X = 1\n")
    (tmp_path / "unit" / "test_b.py").write_text("from test_a import X\nimport test_a\n")
    (tmp_path / "unit" / "test_c.py").write_text(
        "from tests.unit import test_a\nfrom tests.support import fakes\n"
    )
    assert imports_of_test_modules(tmp_path) == [
        "unit/test_b.py:1 imports test_a",
        "unit/test_b.py:2 imports test_a",
        "unit/test_c.py:1 imports tests.unit.test_a",
    ]
