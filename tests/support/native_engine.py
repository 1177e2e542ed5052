"""Harness moved unchanged from tests/integration/test_native_engine.py: _wait_until."""

from __future__ import annotations

import asyncio
import time


async def _wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)  # polling a condition, bounded; not an assertion on time
    return True
