"""One key, one call, as a property: any interleaving of dials with the same or other Idempotency-Keys, the
attempts' ends (busy and no answer retried, an answer, a decline), the retries' timers, and the refusals the
operator owes (the do-not-call hook, the calling window, the trunk's full line) — over the server's own dial
path (bridge/server/api.py `Server.dial`, bridge/server/idempotency.py, bridge/server/dial_series.py) with an
immediate stand-in engine and the series' timers run on a virtual clock, as tests/unit/bridge/test_dial_retry.py
does. Checked after every step:

- one key, one call: every dial with a key returns the same call (the first attempt of its series), and of the
  calls placed for one key at most one is answered — at most one attempt of a series rings at a time;
- a refused dial places nothing: a dial that raises sent nothing, and no attempt (a first dial or a retry) is
  sent to a number on the do-not-call list, outside the calling window, or past the trunk's line limit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine.calling_hours import OutsideCallingHours, parse_calling_hours
from bridge.engine.dial_limits import TrunkLimits
from bridge.engine.dial_retry import RetryPolicy
from bridge.server.api import Application, DoNotCall, Server, ServerConfig
from bridge.server.dial_queue import DialRefused
from bridge.server.dialing import DialTrunk
from bridge.server.idempotency import KeyReused
from tests.support.dial_safety import _Dialer

NUMBERS = ("sip:ann@127.0.0.1", "sip:ben@127.0.0.1")
KEYS = (None, "k-1", "k-2")
LINES = 2  # the trunk's concurrent calls; nothing queues
HOURS = parse_calling_hours("09:00-17:00", "UTC")


class _Operator(Application):
    """The application's refusals: a do-not-call list and a calling window, changed by the steps."""

    def __init__(self) -> None:
        self.blocked: set[str] = set()
        self.closed = False

    def check_outbound(self, target: str, route: str | None) -> None:
        if self.closed:
            raise OutsideCallingHours("campaign", HOURS, None)
        if target in self.blocked:
            raise DoNotCall(f"{target} asked not to be called")


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000_000

    def __call__(self) -> int:
        return self.now


@dataclass
class _World:
    server: Server
    dialer: _Dialer
    app: _Operator
    clock: _Clock
    ringing: list[str] = field(default_factory=list)  # attempts placed and not yet ended
    series_of: dict[str, str] = field(default_factory=dict)  # attempt -> its series (its first attempt)
    answered: dict[str, list[str]] = field(default_factory=dict)  # series -> its answered attempts
    key_call: dict[str, str] = field(default_factory=dict)  # key -> the call its dials returned
    broken: list[str] = field(default_factory=list)  # what an attempt's sending broke


def _world() -> _World:
    app = _Operator()
    trunks = (
        DialTrunk("carrier", allow=("127.0.0.1/32",), limits=TrunkLimits(max_calls=LINES, max_queued=0)),
    )
    server = Server(app, ServerConfig(retry=RetryPolicy(attempts=3, delay_s=60), dial_trunks=trunks))
    dialer = _Dialer()
    server._agent = dialer  # type: ignore[assignment]
    clock = _Clock()
    server.dial_clock = clock
    world = _World(server, dialer, app, clock)

    def on_call(leg: Any, route: str | None = None, lead_frames: int | None = None) -> None:
        """The call's task starts: an attempt was sent. Whatever refused it then should have refused it."""
        call_id = leg.identity.call_id
        target = dialer.asked[-1]["target"]
        series = server._series_of[call_id].id or call_id
        ringing = [c for c in world.ringing if world.series_of[c] == series]
        for broken, what in (
            (app.closed, f"{call_id} sent outside the calling window"),
            (target in app.blocked, f"{call_id} sent to {target}, on the do-not-call list"),
            (len(world.ringing) >= LINES, f"{call_id} sent past the trunk's {LINES} lines"),
            (bool(ringing), f"series {series} rings twice: {ringing} and {call_id}"),
        ):
            if broken:  # (a retry's task swallows what it raises: told after the step)
                world.broken.append(what)
        world.ringing.append(call_id)
        world.series_of[call_id] = series

    server._on_call = on_call  # type: ignore[method-assign]
    return world


async def _settle(server: Server) -> None:
    for _ in range(20):
        await asyncio.sleep(0)
    while server._tasks:
        await asyncio.wait(set(server._tasks))


async def _dial(world: _World, key: str | None, to: str) -> None:
    asked = len(world.dialer.asked)
    try:
        call_id = await world.server.dial(to, key=key)
    except (KeyReused, DoNotCall, OutsideCallingHours, DialRefused) as refused:
        assert len(world.dialer.asked) == asked, f"a refused dial ({refused!r}) sent a call"
        return
    if key is not None:
        repeat = key in world.key_call
        first = world.key_call.setdefault(key, call_id)
        assert call_id == first, f"key {key} returned {first}, then {call_id}"
        assert not repeat or len(world.dialer.asked) == asked, f"a repeat of key {key} sent a call"


async def _end(world: _World, index: int, status: int) -> None:
    """An attempt ends as the call's task ends it: its line freed, its series told."""
    if not world.ringing:
        return
    call_id = world.ringing.pop(index % len(world.ringing))
    server = world.server
    server.dial_queue.ended(server._dial_tickets.pop(call_id))
    if status == 200:
        series = world.series_of[call_id]
        world.answered.setdefault(series, []).append(call_id)
    server._series_of[call_id].attempt_ended(call_id, status, status == 200, f"{status}")
    await _settle(server)


async def _retry(world: _World, index: int) -> None:
    """A waiting series' timer falls due (on the virtual clock) and its next attempt is placed or refused."""
    server, clock = world.server, world.clock
    runs = {r.id: r for r in server._series_of.values() if r._handle is not None}
    if not runs:
        return
    run = runs[sorted(runs)[index % len(runs)]]  # type: ignore[type-var]
    due = run.core.next_deadline()
    assert due is not None and run._handle is not None
    run._handle.cancel()  # (armed on the loop's own clock: run here on the virtual one)
    clock.now = max(clock.now, due)
    run._fire()
    await _settle(server)


STEP = st.one_of(
    st.tuples(st.just("dial"), st.sampled_from(KEYS), st.sampled_from(NUMBERS)),
    st.tuples(st.just("end"), st.integers(0, 3), st.sampled_from([200, 486, 408, 603])),
    st.tuples(st.just("retry"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("block"), st.sampled_from(NUMBERS), st.just(0)),
    st.tuples(st.just("hours"), st.just(""), st.just(0)),
)


def _run(steps: list[tuple[str, Any, Any]]) -> None:
    async def go() -> None:
        world = _world()
        for kind, a, b in steps:
            if kind == "dial":
                await _dial(world, a, b)
            elif kind == "end":
                await _end(world, a, b)
            elif kind == "retry":
                await _retry(world, a)
            elif kind == "block":
                world.app.blocked ^= {a}
            else:
                world.app.closed = not world.app.closed
            assert not world.broken, world.broken
            for key, call_id in world.key_call.items():
                answered = world.answered.get(world.series_of[call_id], [])
                assert len(answered) <= 1, f"key {key}: calls {answered} both answered"
            for series, answered in world.answered.items():
                assert len(answered) <= 1, f"series {series}: calls {answered} both answered"
        for run in list(world.server._series_of.values()):
            run.cancel("test over")
        await _settle(world.server)

    asyncio.run(go())


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(STEP, min_size=1, max_size=30))
def test_one_key_places_one_call_and_a_refused_dial_places_nothing(steps: list[tuple[str, Any, Any]]) -> None:
    _run(steps)


def test_a_key_repeated_around_a_busy_retry_and_a_refusal_is_still_one_call() -> None:
    """The plain history: a keyed dial is busy, its repeat and a repeat for another number place nothing, the
    retry is answered; the same key afterwards is still that call."""
    _run(
        [
            ("dial", "k-1", NUMBERS[0]),
            ("end", 0, 486),
            ("dial", "k-1", NUMBERS[0]),
            ("dial", "k-1", NUMBERS[1]),
            ("retry", 0, 0),
            ("dial", "k-1", NUMBERS[0]),
            ("end", 0, 200),
            ("dial", "k-1", NUMBERS[0]),
            ("block", NUMBERS[1], 0),
            ("dial", "k-2", NUMBERS[1]),
            ("dial", "k-2", NUMBERS[1]),
        ]
    )
