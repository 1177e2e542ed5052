"""Busy / no-answer retries of the calls the bridge places (bridge/engine/dial_retry.py and its shell in
bridge/server/api.py, bridge/server/dial_series.py), on virtual time: the core's decisions, then the server's series
(one key, one series; each attempt checked again; cancels; the CDR rows)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bridge.engine.calling_hours import OutsideCallingHours, parse_calling_hours
from bridge.engine.dial_limits import TrunkLimits
from bridge.engine.dial_retry import (
    DEFAULT_RETRY_ON,
    DialSeries,
    Final,
    Retry,
    RetryPolicy,
    outcome_of,
    parse_retry_on,
)
from bridge.server.api import Application, DoNotCall, Server, ServerConfig
from bridge.server.dial_queue import DialRefused
from bridge.server.dialing import DialTrunk
from rtp.units import NS_PER_S as S
from tests.support.dial_safety import _Dialer

# --- the core ---------------------------------------------------------------------------------------------------


def test_busy_then_no_answer_then_answered_waits_the_delay_then_twice_it_and_stops_at_the_answer() -> None:
    series = DialSeries(RetryPolicy(attempts=4, delay_s=60))
    assert series.placed("c1") == 1
    assert series.ended("c1", 486, False, "486 Busy Here", 10 * S) == Retry(2, 70 * S)
    assert series.next_deadline() == 70 * S
    assert series.handle_timer(70 * S - 1) is None
    assert series.handle_timer(70 * S) == 2
    series.placed("c2")
    assert series.ended("c2", 408, False, "no answer (ringing timeout)", 100 * S) == Retry(3, 220 * S)
    assert series.handle_timer(220 * S) == 3
    series.placed("c3")
    assert series.ended("c3", 200, True, "normal clearing", 400 * S) == Final("answered", "normal clearing")
    assert series.next_deadline() is None and series.handle_timer(10_000 * S) is None
    assert [a.outcome for a in series.attempts] == ["busy", "no_answer", "answered"]
    assert series.id == "c1"


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(603, "failed"), (404, "failed"), (487, "cancelled"), (503, "unavailable"), (401, "failed")],
)
def test_a_decline_a_wrong_number_a_cancel_and_by_default_a_trunks_503_are_never_retried(
    status: int, outcome: str
) -> None:
    series = DialSeries(RetryPolicy(attempts=5))
    series.placed("c1")
    decision = series.ended("c1", status, False, f"{status}", 0)
    assert isinstance(decision, Final) and decision.outcome == outcome
    assert series.next_deadline() is None


def test_the_attempts_bound_the_series_and_the_wait_is_capped_at_an_hour() -> None:
    series = DialSeries(RetryPolicy(attempts=3, retry_on=parse_retry_on("busy"), delay_s=3000))
    series.placed("c1")
    assert series.ended("c1", 600, False, "600 Busy Everywhere", 0) == Retry(2, 3000 * S)
    series.handle_timer(3000 * S)
    series.placed("c2")
    assert series.ended("c2", 486, False, "busy", 3000 * S) == Retry(3, 6600 * S)  # 6000 s capped at 3600
    series.handle_timer(6600 * S)
    series.placed("c3")
    assert series.ended("c3", 486, False, "busy", 6600 * S) == Final("busy", "busy")
    assert len(series.attempts) == 3


def test_a_cancel_ends_a_waiting_series_at_once_and_one_under_way_with_its_attempt() -> None:
    waiting = DialSeries(RetryPolicy(attempts=3))
    waiting.placed("c1")
    waiting.ended("c1", 486, False, "busy", 0)
    assert waiting.cancel("draining") == Final("cancelled", "draining")
    assert waiting.handle_timer(10_000 * S) is None

    ringing = DialSeries(RetryPolicy(attempts=3))
    ringing.placed("c1")
    assert ringing.cancel("hung up") is None  # its attempt is still ringing
    assert ringing.ended("c1", 408, False, "no answer", 0) == Final("cancelled", "hung up")


def test_a_refusal_is_the_series_end_and_told_twice_an_attempt_changes_nothing() -> None:
    series = DialSeries(RetryPolicy(attempts=3))
    series.placed("c1")
    first = series.ended("c1", 486, False, "busy", 0)
    assert series.ended("c1", 486, False, "busy", 5 * S) == first  # the same answer
    series.handle_timer(300 * S)
    assert series.refused("calling_hours", "outside the window") == Final("refused", "calling_hours")
    assert series.attempts[-1].call_id is None and series.attempts[-1].outcome == "refused"


def test_what_can_be_retried_is_a_closed_list() -> None:
    assert parse_retry_on("busy,no_answer") == DEFAULT_RETRY_ON == frozenset({486, 600, 408, 480})
    assert parse_retry_on("unavailable, 486") == frozenset({500, 502, 503, 504, 486})
    for bad in ("603", "404", "487", "sometimes"):
        with pytest.raises(ValueError, match="never retried"):
            parse_retry_on(bad)
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(retry_on=frozenset({603}))
    assert outcome_of(0, False) == "failed" and outcome_of(486, True) == "answered"


# --- the server's series ----------------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000 * S

    def __call__(self) -> int:
        return self.now


def _server(
    app: Application | None = None, *, cdr: Path | None = None, limits: TrunkLimits | None = None
) -> tuple[Server, _Dialer, _Clock, list[str]]:
    """A server placing calls through a stand-in engine: each placed call's id in the list; the test ends an
    attempt as the call's task would (`_end`)."""
    trunks = (DialTrunk("carrier", allow=("127.0.0.1/32",), limits=limits),) if limits else ()
    config = ServerConfig(
        retry=RetryPolicy(attempts=3, delay_s=60), cdr=str(cdr) if cdr else None, dial_trunks=trunks
    )
    server = Server(app or Application(), config)
    dialer = _Dialer()
    server._agent = dialer  # type: ignore[assignment]
    clock = _Clock()
    server.dial_clock = clock
    placed: list[str] = []

    def on_call(leg: Any, route: str | None = None, lead_frames: int | None = None) -> None:
        placed.append(leg.identity.call_id)
        if (ticket := server._dial_tickets.pop(leg.identity.call_id, None)) is not None:
            server.dial_queue.ended(ticket)

    server._on_call = on_call  # type: ignore[method-assign,assignment]
    return server, dialer, clock, placed


def _end(server: Server, call_id: str, status: int, answered: bool = False) -> dict[str, Any]:
    run = server._series_of[call_id]
    return run.attempt_ended(call_id, status, answered, f"{status}")


async def _fire(server: Server, clock: _Clock, call_id: str) -> None:
    """The series' retry timer, on the virtual clock: its deadline reached, the timer run, the attempt placed."""
    run = server._series_of[call_id]
    due = run.core.next_deadline()
    assert due is not None and run._handle is not None
    run._handle.cancel()  # (armed on the loop's own clock: the test runs it on the virtual one)
    clock.now = due
    run._fire()
    await _settle(server)


async def _settle(server: Server) -> None:
    """Every task the server started (an attempt placed, a CDR row written in its thread) has run."""
    for _ in range(20):
        await asyncio.sleep(0)
    while server._tasks:
        await asyncio.wait(set(server._tasks))


def _rows(cdr: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in cdr.read_text().splitlines()] if cdr.exists() else []


def test_one_key_one_series_a_busy_call_is_placed_again_and_the_answer_ends_it(tmp_path: Path) -> None:
    async def go() -> None:
        cdr = tmp_path / "cdr.jsonl"
        server, dialer, clock, placed = _server(cdr=cdr)
        first = await server.dial("sip:alice@127.0.0.1", key="k-1")
        line = _end(server, first, 486)
        assert line["attempt"] == 1 and line["outcome"] == "busy" and line["next_attempt_in_s"] == 60
        # the client's answer was lost: the same key again while the series waits places nothing
        assert await server.dial("sip:alice@127.0.0.1", key="k-1") == first
        assert len(dialer.asked) == 1
        await _fire(server, clock, first)
        assert placed == ["out-1", "out-2"] and len(dialer.asked) == 2
        line = _end(server, "out-2", 200, answered=True)
        assert line["final"] == {"outcome": "answered", "reason": "200"}
        clock.now += 10_000 * S
        assert server._series_of == {}  # over: nothing more is due
        assert await server.dial("sip:alice@127.0.0.1", key="k-1") == first  # still the first call
        assert len(dialer.asked) == 2
        await _settle(server)
        series = [r for r in _rows(cdr) if r.get("kind") == "dial_series"]
        assert len(series) == 1 and series[0]["series"] == first and series[0]["outcome"] == "answered"
        assert [a["outcome"] for a in series[0]["attempts"]] == ["busy", "answered"]
        metrics = server.observer.metrics.render()
        assert b'parlora_dial_retries_total{after="busy"} 1.0' in metrics

    asyncio.run(go())


def test_each_attempt_asks_the_do_not_call_hook_again_and_its_refusal_is_a_cdr_row(tmp_path: Path) -> None:
    class Dnc(Application):
        def __init__(self) -> None:
            self.blocked: set[str] = set()

        def check_outbound(self, target: str, route: str | None) -> None:
            if target in self.blocked:
                raise DoNotCall(f"{target} asked not to be called")

    async def go() -> None:
        cdr = tmp_path / "cdr.jsonl"
        app = Dnc()
        server, dialer, clock, placed = _server(app, cdr=cdr)
        first = await server.dial("sip:bob@127.0.0.1")
        _end(server, first, 480)
        app.blocked.add("sip:bob@127.0.0.1")  # the callee asked, between the attempts
        await _fire(server, clock, first)
        assert placed == [first] and len(dialer.asked) == 1  # nothing was sent
        await _settle(server)
        rows = _rows(cdr)
        refused = [r for r in rows if r.get("kind") == "dial_refused"]
        assert len(refused) == 1 and refused[0]["reason"] == "do_not_call"
        assert refused[0]["series"] == first and refused[0]["attempt"] == 2
        series = [r for r in rows if r.get("kind") == "dial_series"]
        assert series[0]["outcome"] == "refused" and series[0]["reason"] == "do_not_call"
        # and a first dial refused by the hook is a row too, before the 400 it always was
        with pytest.raises(DoNotCall):
            await server.dial("sip:bob@127.0.0.1")
        await _settle(server)
        assert sum(r.get("reason") == "do_not_call" for r in _rows(cdr)) == 3  # 2 refusals + the series' end

    asyncio.run(go())


def test_a_retry_outside_the_calling_window_is_refused_not_postponed(tmp_path: Path) -> None:
    hours = parse_calling_hours("09:00-17:00", "UTC")

    class Windowed(Application):
        def __init__(self) -> None:
            self.open = True

        def check_outbound(self, target: str, route: str | None) -> None:
            if not self.open:
                raise OutsideCallingHours("reminders", hours, None)

    async def go() -> None:
        cdr = tmp_path / "cdr.jsonl"
        app = Windowed()
        server, dialer, clock, _ = _server(app, cdr=cdr)
        first = await server.dial("sip:carol@127.0.0.1")
        _end(server, first, 486)
        app.open = False  # the window closed while the series waited
        await _fire(server, clock, first)
        await _settle(server)
        assert len(dialer.asked) == 1 and server._series_of == {}
        assert [r["reason"] for r in _rows(cdr) if r.get("kind") == "dial_refused"] == ["calling_hours"]
        assert b'parlora_dials_total{outcome="refused_calling_hours",trunk=""} 1.0' in (
            server.observer.metrics.render()
        )

    asyncio.run(go())


def test_a_full_queue_is_a_cdr_row_with_its_reason(tmp_path: Path) -> None:
    async def go() -> None:
        cdr = tmp_path / "cdr.jsonl"
        server, dialer, _, placed = _server(cdr=cdr, limits=TrunkLimits(max_calls=1, max_queued=0))

        def holding(leg: Any, route: str | None = None, lead_frames: int | None = None) -> None:
            placed.append(leg.identity.call_id)  # its ticket is kept: the call holds the trunk's one line

        server._on_call = holding  # type: ignore[method-assign,assignment]
        await server.dial("sip:dave@127.0.0.1")  # holds the one line
        with pytest.raises(DialRefused):
            await server.dial("sip:erin@127.0.0.1")
        await _settle(server)
        rows = [r for r in _rows(cdr) if r.get("kind") == "dial_refused"]
        assert len(rows) == 1 and rows[0]["reason"] == "queue_full" and rows[0]["trunk"] == "carrier"
        assert rows[0]["to"] == "sip:erin@127.0.0.1" and len(dialer.asked) == 1

    asyncio.run(go())


def test_a_drain_and_a_hang_up_from_the_api_cancel_the_next_attempt(tmp_path: Path) -> None:
    async def go() -> None:
        cdr = tmp_path / "cdr.jsonl"
        server, dialer, clock, _ = _server(cdr=cdr)
        first = await server.dial("sip:frank@127.0.0.1")
        _end(server, first, 486)
        run = server._series_of[first]
        server.drain()
        assert run.core.final == Final("cancelled", "draining")
        await _settle(server)
        run._fire()  # (the timer was cancelled; even if it ran, nothing is placed)
        await _settle(server)
        assert len(dialer.asked) == 1

        server.draining = False
        second = await server.dial("sip:grace@127.0.0.1")
        _end(server, second, 408)
        assert server._hangup(second)  # POST /calls/{id}/hangup with the series' id while it waits
        assert server._series_of == {} and len(dialer.asked) == 2
        await _settle(server)
        ends = [r["reason"] for r in _rows(cdr) if r.get("kind") == "dial_series"]
        assert ends == ["draining", "hung up from the console"]

    asyncio.run(go())


# --- the configuration ------------------------------------------------------------------------------------------


def test_outbound_and_a_routes_retry_policy_come_from_the_file_and_what_cannot_be_retried_is_refused(
    tmp_path: Path,
) -> None:
    from bridge.cli.config import ConfigError, load
    from bridge.cli.ops import RoutedApplication

    path = tmp_path / "bridge.toml"
    path.write_text(
        '[outbound]\nretry_attempts = 3\nretry_on = "busy"\nretry_delay_s = 120\n'
        '[[routes]]\nname = "surveys"\ndirection = "outbound"\nnumber = "4930100"\n'
        'retry_attempts = 2\nretry_on = [486, "no_answer"]\n'
    )
    config = load(path)
    assert config.outbound.retry_policy() == RetryPolicy(3, frozenset({486, 600}), 120.0)
    app = RoutedApplication(Application(), config)
    assert app.retry_policy("sip:4930100@127.0.0.1", None) == RetryPolicy(
        2, frozenset({486, 408, 480}), 120.0
    )
    assert app.retry_policy("sip:4930999@127.0.0.1", None) == RetryPolicy(3, frozenset({486, 600}), 120.0)
    path.write_text(
        '[outbound]\nretry_on = "603"\nretry_attempts = 11\n[[routes]]\nname = "in"\nretry_attempts = 2\n'
    )
    with pytest.raises(ConfigError) as refused:
        load(path)
    problems = str(refused.value)
    assert "outbound.retry_on" in problems and "never retried" in problems
    assert "outbound.retry_attempts" in problems and "routes[0].retry_attempts" in problems


def test_post_calls_to_a_number_on_the_do_not_call_list_answers_403_and_sends_nothing(tmp_path: Path) -> None:
    from bridge.server.http import StatusServer
    from tests.support.dial_safety import _post

    class Dnc(Application):
        def check_outbound(self, target: str, route: str | None) -> None:
            raise DoNotCall(f"{target} is on the do-not-call list")

    async def go() -> None:
        server, dialer, _, _ = _server(Dnc(), cdr=tmp_path / "cdr.jsonl")
        http = await StatusServer(lambda: {}, dial=server._dial_from_http).start("127.0.0.1", 0)
        try:
            status, answer = await _post(http.port, {"to": "sip:heidi@127.0.0.1"}, {})
        finally:
            await http.close()
        assert status == 403 and answer["reason"] == "do_not_call" and dialer.asked == []
        assert [r["reason"] for r in _rows(tmp_path / "cdr.jsonl")] == ["do_not_call"]

    asyncio.run(go())
