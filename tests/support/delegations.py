"""Harness moved unchanged from tests/unit/bridge/test_delegations.py: ToolProvider."""

from __future__ import annotations

import asyncio

from tests.support.session import FakeProvider


class ToolProvider(FakeProvider):
    """The in-memory provider, recording the tool results it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.results: list[tuple[str, str]] = []
        self.answered = asyncio.Event()

    def send_tool_result(self, call_id: str, name: str, output: str) -> None:
        self.results.append((call_id, output))
        self.answered.set()
