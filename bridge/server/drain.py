"""Graceful drain on SIGTERM and `POST /drain` (DESIGN §11 behind a load balancer).

The first SIGTERM (or `POST /drain` on the HTTP listener, the same drain for an orchestrator that cannot send
signals) drains: the engine refuses new INVITEs and OPTIONS with 503 (`SipEngine.drain()`) and `/readyz` says
so, live calls may finish for up to the drain timeout, then the rest get a goodbye from the model and a BYE
(`say_goodbye`), and the process exits 0. A second SIGTERM, or SIGINT at any time, ends at once. A timeout of 0 is the old behaviour: every call
is hung up on the first signal. `POST /drain` again is harmless (it never ends the process at once: only a
signal does).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Mapping
from typing import Any, Protocol

log = logging.getLogger("parlora")


class Drainable(Protocol):
    def drain(self) -> None: ...

    def live_calls(self) -> int: ...


class ShutdownSignals:
    """SIGTERM and SIGINT as two events: `requested` (any signal, or `POST /drain`) and `now` (SIGINT or a
    second SIGTERM). Made with the server; `install(loop)` adds the process's signal handlers (`Server.run`)."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.now = asyncio.Event()
        self.changed = asyncio.Event()

    def install(self, loop: asyncio.AbstractEventLoop) -> ShutdownSignals:
        loop.add_signal_handler(signal.SIGTERM, self._term)
        loop.add_signal_handler(signal.SIGINT, self._int)
        return self

    def drain_requested(self) -> None:
        """`POST /drain`: as a first SIGTERM, and idempotent (a repeated request never ends at once)."""
        if not self.requested.is_set():
            self.requested.set()
            self.changed.set()

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
        await _changed(calls_changed, signals, left)
    return "calls finished"


async def _changed(calls_changed: asyncio.Event, signals: ShutdownSignals, timeout_s: float) -> None:
    """Until a call ends or starts, a signal comes, or `timeout_s` passes (whichever first)."""
    calls_changed.clear()
    signals.changed.clear()
    waits = [asyncio.ensure_future(calls_changed.wait()), asyncio.ensure_future(signals.changed.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def http_drain(server: Drainable, signals: ShutdownSignals) -> Callable[[], dict[str, Any]]:
    """`POST /drain`'s answer: the drain starts (503 to new INVITEs and OPTIONS at once, `/readyz` 503) and, when
    the server runs under `Server.run`, the process exits once the live calls are over or the timeout hit."""

    def request() -> dict[str, Any]:
        already = signals.requested.is_set()
        signals.drain_requested()
        server.drain()
        if not already:
            log.info("POST /drain: draining with %d live call(s)", server.live_calls())
        return {"draining": True, "live_calls": server.live_calls(), "already": already}

    return request


class Farewell(Protocol):
    """A live call as the drain's end sees it (bridge.server.api.LiveCall)."""

    def say_goodbye(self, note: str, reason: str) -> bool: ...

    def hang_up(self, reason: str = ...) -> None: ...


DRAIN_GOODBYE_NOTE = (
    "This line is closing for maintenance now. Tell the caller so in one short sentence and say goodbye."
)
DRAIN_END_REASON = "drain timeout: the bridge is shutting down"
GOODBYE_WAIT_S = (
    12.0  # the model's goodbye may take its timeout (bridge.engine.telephony goodbye_timeout_ms, 10 s)
)


async def say_goodbye(
    calls: Mapping[str, Farewell],
    signals: ShutdownSignals,
    calls_changed: asyncio.Event,
    wait_s: float = GOODBYE_WAIT_S,
) -> int:
    """The drain timeout is over: every live call gets a goodbye from the model and then its BYE (a call with no
    live session is hung up at once); waits, bounded by `wait_s` and a second signal, for them to end. Returns
    how many calls were still live when the wait ended (the server's stop hangs those up)."""
    asked = 0
    for call in list(calls.values()):
        if call.say_goodbye(DRAIN_GOODBYE_NOTE, DRAIN_END_REASON):
            asked += 1
        else:
            call.hang_up(DRAIN_END_REASON)
    log.info("drain timeout: %d live call(s) get a goodbye, then BYE", asked)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + wait_s
    while calls and not signals.now.is_set() and (left := give_up - loop.time()) > 0:
        await _changed(calls_changed, signals, left)
    return len(calls)
