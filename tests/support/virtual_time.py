"""Virtual time for the session shell's tests: an asyncio loop whose clock only moves when every task waits.

`VirtualTimeLoop.time()` reads a counter instead of the monotonic clock. When the loop would block in its
selector with a timeout, the counter jumps by that timeout at once, so `asyncio.sleep`, `wait_for` and
`timeout` take no real time, and the session shell, given `clock=loop_clock()`, reads the same instant as
its loop. A test module opts in with `event_loop_policy = virtual_time.policy_fixture()`.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Callable
from typing import Any

import pytest


class _Selector(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._virtual = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # nothing is scheduled: only another thread can wake the loop
            return super().select(None)
        self._virtual.now_ns += max(1, math.ceil(timeout * 1e9))
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now_ns = 1_000_000_000  # (not 0: nothing may mistake the start for "unset")
        super().__init__(_Selector(self))

    def time(self) -> float:
        return self.now_ns / 1e9

    def clock(self) -> int:
        return self.now_ns


class VirtualTimePolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return VirtualTimeLoop()


def loop_clock() -> Callable[[], int]:
    """The running virtual loop's clock, for `CallSession(clock=...)`."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop), "this test must run on virtual time"
    return loop.clock


def policy_fixture() -> Any:
    # (pytest-asyncio's loop-factory hook would need a conftest shared by every test; this override is local)
    @pytest.fixture(scope="module")
    def event_loop_policy() -> asyncio.AbstractEventLoopPolicy:
        return VirtualTimePolicy()

    return event_loop_policy
