"""Harness moved unchanged from tests/unit/bridge/test_seams_hold.py: DialledFakeLeg, TextProvider, wait_for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sip.leg import LegFeatures
from tests.support.session import FakeLeg, FakeProvider


class TextProvider(FakeProvider):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def send_text(self, text: str, *, speak: bool = False) -> None:
        self.texts.append(text)


class DialledFakeLeg(FakeLeg):
    features = LegFeatures(dialled=True)
    outbound = True  # sip.leg.DialledLeg: a call the bridge placed rings until MediaStarted


async def wait_for(condition: Callable[[], bool], steps: int = 200) -> None:
    for _ in range(steps):
        if condition():
            return
        await asyncio.sleep(0.01)
