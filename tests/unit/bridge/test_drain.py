"""The drain's pieces (bridge/server/drain.py): POST /drain is a first SIGTERM, and the drain timeout's
goodbye. Loop-level tests on a fresh event loop: nothing here sleeps on wall time but for bounded waits on events
the test sets itself."""

from __future__ import annotations

import asyncio

from bridge.server.drain import DRAIN_END_REASON, ShutdownSignals, http_drain, say_goodbye


class _Server:
    def __init__(self, calls: int) -> None:
        self.calls, self.drains = calls, 0

    def drain(self) -> None:
        self.drains += 1

    def live_calls(self) -> int:
        return self.calls


class _Call:
    def __init__(self, live: bool, calls: dict[str, _Call], name: str) -> None:
        self.live, self.calls, self.name = live, calls, name
        self.asked: list[tuple[str, str]] = []
        self.hung_up: list[str] = []

    def say_goodbye(self, note: str, reason: str) -> bool:
        self.asked.append((note, reason))
        return self.live

    def hang_up(self, reason: str = "") -> None:
        self.hung_up.append(reason)


def test_post_drain_is_a_first_sigterm_and_idempotent() -> None:
    signals, server = ShutdownSignals(), _Server(3)
    request = http_drain(server, signals)
    first = request()
    assert signals.requested.is_set() and signals.changed.is_set() and not signals.now.is_set()
    signals.changed.clear()
    second = request()
    assert first == {"draining": True, "live_calls": 3, "already": False}
    assert second["already"] is True
    assert not signals.now.is_set() and not signals.changed.is_set()  # a repeated POST never ends at once
    assert server.drains == 2  # the server's drain is idempotent itself (the engine's is)


def test_a_sigterm_after_post_drain_ends_at_once() -> None:
    signals = ShutdownSignals()
    signals.drain_requested()
    signals._term()  # the process's SIGTERM handler (install() registers it)
    assert signals.now.is_set()


def test_drain_timeout_asks_each_live_call_for_a_goodbye_and_hangs_up_the_dead() -> None:
    async def scenario() -> tuple[int, dict[str, _Call]]:
        calls: dict[str, _Call] = {}
        calls["a"] = _Call(True, calls, "a")
        calls["b"] = _Call(False, calls, "b")  # its session never came up: hung up at once
        changed = asyncio.Event()
        signals = ShutdownSignals()
        seen = dict(calls)
        waiting = asyncio.create_task(say_goodbye(calls, signals, changed, wait_s=5.0))
        await asyncio.sleep(0)
        del calls["a"], calls["b"]  # the goodbye was played and the BYE sent: the calls ended
        changed.set()
        return await asyncio.wait_for(waiting, 5.0), seen

    left, seen = asyncio.run(scenario())
    assert left == 0
    assert [r for _, r in seen["a"].asked] == [DRAIN_END_REASON] and seen["a"].hung_up == []
    assert seen["b"].hung_up == [DRAIN_END_REASON]


def test_the_goodbye_wait_is_bounded_and_a_second_signal_cuts_it() -> None:
    async def scenario() -> tuple[int, int]:
        calls: dict[str, _Call] = {}
        calls["a"] = _Call(True, calls, "a")
        bounded = await say_goodbye(calls, ShutdownSignals(), asyncio.Event(), wait_s=0.01)
        signals = ShutdownSignals()
        waiting = asyncio.create_task(say_goodbye(calls, signals, asyncio.Event(), wait_s=30.0))
        await asyncio.sleep(0)
        signals._int()
        return bounded, await asyncio.wait_for(waiting, 5.0)

    assert asyncio.run(scenario()) == (1, 1)
