"""Graceful drain on SIGTERM (issue 15; DESIGN §11 behind a load balancer).

The first SIGTERM drains: the engine refuses new INVITEs and OPTIONS with 503 (`SipEngine.drain()`) and
`/readyz` says so, live calls may finish for up to the drain timeout, then the server hangs up the rest and
exits 0. A second SIGTERM, or SIGINT at any time, ends at once. A timeout of 0 is the old behaviour: every call
is hung up on the first signal.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Protocol

log = logging.getLogger("parlora")


class Drainable(Protocol):
    def drain(self) -> None: ...

    def live_calls(self) -> int: ...


class ShutdownSignals:
    """SIGTERM and SIGINT as two events: `requested` (any signal) and `now` (SIGINT or a second SIGTERM)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.requested = asyncio.Event()
        self.now = asyncio.Event()
        self.changed = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, self._term)
        loop.add_signal_handler(signal.SIGINT, self._int)

    def _term(self) -> None:
        if self.requested.is_set():
            self.now.set()
        self.requested.set()
        self.changed.set()

    def _int(self) -> None:
        self.requested.set()
        self.now.set()
        self.changed.set()


async def drain(
    server: Drainable, signals: ShutdownSignals, timeout_s: float, calls_changed: asyncio.Event
) -> str:
    """After the first signal: drain and wait for the live calls up to `timeout_s`; why the wait ended."""
    if signals.now.is_set() or timeout_s <= 0:
        return "at once"
    server.drain()
    log.info("draining: refusing new calls; %d live may finish within %g s", server.live_calls(), timeout_s)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout_s
    while server.live_calls() > 0:
        if signals.now.is_set():
            return "second signal"
        left = give_up - loop.time()
        if left <= 0:
            return "drain timeout"
        calls_changed.clear()
        signals.changed.clear()
        waits = [asyncio.ensure_future(calls_changed.wait()), asyncio.ensure_future(signals.changed.wait())]
        try:
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
    return "calls finished"
