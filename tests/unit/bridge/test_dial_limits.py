"""Calls per second, calls at once and the queue of a trunk's dials (bridge/engine/dial_limits.py), on virtual time."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine.dial_limits import DialLimits, Refused, Start, TrunkLimits, Wait
from bridge.server.api import Application, Server, ServerConfig
from bridge.server.dial_queue import DialRefused
from bridge.server.dialing import DialTrunk
from bridge.server.http import StatusServer
from rtp.units import NS_PER_MS as MS
from rtp.units import NS_PER_S as S
from tests.support.dial_safety import _Dialer, _post


def test_one_call_a_second_spaces_the_dials_a_second_apart_in_order() -> None:
    limits = DialLimits({"carrier": TrunkLimits(cps=1)})
    assert limits.request("carrier", 0) == Start(1)
    assert limits.request("carrier", 10 * MS) == Wait(2, 1)
    assert limits.request("carrier", 20 * MS) == Wait(3, 2)
    due = limits.next_deadline()
    assert due is not None and S - MS <= due <= S + MS
    assert limits.handle_timer(due - 2 * MS) == []  # not a whole token yet
    assert limits.handle_timer(due) == [Start(2)]
    second = limits.next_deadline()
    assert second is not None and 2 * S - MS <= second <= 2 * S + MS
    assert limits.handle_timer(second) == [Start(3)]
    assert limits.next_deadline() is None
    assert limits.counts == {"started": 3, "queued": 2}


def test_calls_at_once_wait_for_an_end_and_the_first_waiting_goes_first() -> None:
    limits = DialLimits({"carrier": TrunkLimits(max_calls=2)})
    assert [limits.request("carrier", 0), limits.request("carrier", 0)] == [Start(1), Start(2)]
    assert limits.request("carrier", 0) == Wait(3, 1)
    assert limits.request("carrier", 0) == Wait(4, 2)
    assert limits.ended(2, 5 * S) == [Start(3)]
    assert limits.active("carrier") == 2 and limits.waiting("carrier") == 1
    assert limits.ended(3, 6 * S) == [Start(4)]


def test_a_dial_never_overtakes_one_that_waits() -> None:
    """A token free at the instant a new dial asks still goes to the dial waiting first."""
    limits = DialLimits({"carrier": TrunkLimits(cps=1, max_calls=1)})
    assert limits.request("carrier", 0) == Start(1)
    assert limits.request("carrier", 0) == Wait(2, 1)
    assert limits.request("carrier", 3 * S) == Wait(3, 2)  # a token is whole by now, but 2 waits for a line
    assert limits.ended(1, 3 * S) == [Start(2)]


def test_a_full_queue_and_a_wait_past_its_limit_are_refused_and_nothing_is_sent() -> None:
    limits = DialLimits({"carrier": TrunkLimits(max_calls=1, max_queued=1, max_wait_ms=2_000)})
    assert limits.request("carrier", 0) == Start(1)
    assert limits.request("carrier", 0) == Wait(2, 1)
    assert limits.request("carrier", 0) == Refused(3, "queue_full", "carrier")
    assert limits.next_deadline() == 2 * S
    assert limits.handle_timer(2 * S - 1) == []
    assert limits.handle_timer(2 * S) == [Refused(2, "queue_timeout", "carrier")]
    assert limits.ended(2, 3 * S) == []  # a refused ticket's end is nothing
    assert limits.counts["refused_queue_full"] == 1 and limits.counts["refused_queue_timeout"] == 1


def test_a_withdrawn_wait_frees_its_place_in_the_queue() -> None:
    limits = DialLimits({"carrier": TrunkLimits(max_calls=1)})
    limits.request("carrier", 0)
    assert limits.request("carrier", 0) == Wait(2, 1)
    assert limits.request("carrier", 0) == Wait(3, 2)
    assert limits.ended(2, S) == []  # the application gave up on it
    assert limits.ended(1, 2 * S) == [Start(3)]


def test_trunks_are_limited_apart_and_an_unlimited_one_never_waits() -> None:
    limits = DialLimits({"carrier": TrunkLimits(cps=1)})
    assert limits.request("carrier", 0) == Start(1)
    assert limits.request("carrier", 0) == Wait(2, 1)
    assert all(isinstance(limits.request("pbx", 0), Start) for _ in range(50))
    assert all(isinstance(limits.request(None, 0), Start) for _ in range(50))


def test_limits_that_cannot_hold_are_refused() -> None:
    for bad in ({"cps": 0}, {"burst": 0}, {"max_calls": 0}, {"max_queued": -1}):
        with pytest.raises(ValueError):
            TrunkLimits(**bad)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    cps=st.sampled_from([None, 1.0, 2.5]),
    max_calls=st.sampled_from([None, 1, 3]),
    steps=st.lists(
        st.tuples(st.sampled_from(["dial", "end", "wait"]), st.integers(0, 1_500), st.integers(0, 40)),
        max_size=60,
    ),
)
def test_never_over_a_limit_and_every_dial_answered_once(
    cps: float | None, max_calls: int | None, steps: list[tuple[str, int, int]]
) -> None:
    """Whatever the order of dials, ends and time: never more calls at once than `max_calls`, starts never
    closer than 1/cps (burst 1), each dial answered exactly once (a start or a refusal), and a waiting dial
    never overtaken."""
    limits = DialLimits({"t": TrunkLimits(cps=cps, max_calls=max_calls, max_queued=5, max_wait_ms=3_000)})
    now, started_at, active, answered, waiting = 0, [], set(), {}, []

    def take(answers: list[Start | Wait | Refused]) -> None:
        for a in answers:
            if isinstance(a, Wait):
                waiting.append(a.ticket)
                continue
            assert a.ticket not in answered
            answered[a.ticket] = a
            if a.ticket in waiting:
                assert waiting[0] == a.ticket  # the first waiting, never a later one
                waiting.remove(a.ticket)
            if isinstance(a, Start):
                active.add(a.ticket)
                started_at.append(now)

    for kind, ms, pick in steps:
        now += ms * MS
        take(limits.handle_timer(now) if (d := limits.next_deadline()) is not None and d <= now else [])
        if kind == "dial":
            take([limits.request("t", now)])
        elif kind == "end" and active:
            ticket = sorted(active)[pick % len(active)]
            active.discard(ticket)
            take(limits.ended(ticket, now))
        assert max_calls is None or len(active) <= max_calls
    if cps is not None:
        gaps = [b - a for a, b in zip(started_at, started_at[1:], strict=False)]
        assert all(g >= S / cps - MS for g in gaps)


# --- the server: Server.dial and POST /calls wait in the trunk's queue ------------------------------------------


def _limited(limits: TrunkLimits) -> tuple[Server, _Dialer, list[int]]:
    """A server whose one trunk (the carrier at 127.0.0.1) has `limits`; its calls' tickets are kept, so a test
    ends a call by freeing its ticket as the call's task would."""
    trunk = DialTrunk("carrier", allow=("127.0.0.1/32",), limits=limits)
    server = Server(Application(), ServerConfig(dial_trunks=(trunk,)))
    dialer = _Dialer()
    server._agent = dialer  # type: ignore[assignment]
    tickets: list[int] = []

    def on_call(leg: object, route: str | None = None, lead_frames: int | None = None) -> None:
        tickets.append(server._dial_tickets.pop(leg.identity.call_id))  # type: ignore[attr-defined]

    server._on_call = on_call  # type: ignore[method-assign,assignment]
    return server, dialer, tickets


def test_a_dial_over_the_trunks_calls_at_once_waits_for_a_call_to_end_and_no_invite_goes_meanwhile() -> None:
    async def go() -> None:
        server, dialer, tickets = _limited(TrunkLimits(max_calls=1))
        assert await server.dial("sip:alice@127.0.0.1") == "out-1"
        second = asyncio.ensure_future(server.dial("sip:bob@127.0.0.1"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not second.done() and len(dialer.asked) == 1  # waiting: no INVITE
        server.dial_queue.ended(tickets[0])  # the first call ended
        assert await asyncio.wait_for(second, 1.0) == "out-2"
        assert [a["target"] for a in dialer.asked] == ["sip:alice@127.0.0.1", "sip:bob@127.0.0.1"]

    asyncio.run(go())


def test_a_failed_invite_frees_its_place_for_the_next_dial() -> None:
    async def go() -> None:
        server, dialer, _ = _limited(TrunkLimits(max_calls=1, max_queued=0))

        async def refused(target: str, **kwargs: object) -> object:
            raise RuntimeError("486 Busy Here")

        dialer.dial = refused  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="486"):
            await server.dial("sip:alice@127.0.0.1")
        assert server.dial_queue.limits.active("carrier") == 0

    asyncio.run(go())


def test_post_calls_over_a_full_queue_answers_503_and_sends_nothing() -> None:
    async def go() -> None:
        server, dialer, _ = _limited(TrunkLimits(max_calls=1, max_queued=0))
        http = await StatusServer(lambda: {}, dial=server._dial_from_http).start("127.0.0.1", 0)
        try:
            assert (await _post(http.port, {"to": "sip:alice@127.0.0.1"}, {}))[0] == 202
            status, answer = await _post(http.port, {"to": "sip:bob@127.0.0.1"}, {})
            assert status == 503 and answer["reason"] == "queue_full" and "trunk carrier" in answer["error"]
            assert len(dialer.asked) == 1
            with pytest.raises(DialRefused):
                await server.dial("sip:carol@127.0.0.1")
            metrics = server.observer.metrics.render()
            assert b'parlora_dials_total{outcome="started",trunk="carrier"} 1.0' in metrics
            assert b'parlora_dials_total{outcome="refused_queue_full",trunk="carrier"} 2.0' in metrics
        finally:
            await http.close()

    asyncio.run(go())


def test_the_file_gives_a_trunk_its_limits_and_refuses_ones_that_cannot_hold(tmp_path: object) -> None:
    from pathlib import Path

    from bridge.cli.config import ConfigError, load
    from bridge.cli.ops import dial_trunks

    path = Path(str(tmp_path)) / "bridge.toml"
    path.write_text('[[trunks]]\nname = "carrier"\nallow = ["192.0.2.0/24"]\ncps = 1.5\nmax_calls = 30\n')
    (trunk,) = dial_trunks(load(path), {})
    assert trunk.limits == TrunkLimits(cps=1.5, max_calls=30)
    path.write_text('[[trunks]]\nname = "carrier"\nallow = ["192.0.2.0/24"]\ncps = 0\nmax_calls = 0\n')
    with pytest.raises(ConfigError) as refused:
        load(path)
    assert "trunks[0].cps" in str(refused.value) and "trunks[0].max_calls" in str(refused.value)
