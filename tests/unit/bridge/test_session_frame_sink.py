"""Caller frames from a leg's media tick go straight into the session (`sip.leg.FrameSinkLeg`).

The sink keeps the order with the leg's other events (a frame never overtakes a queued CallEnded or hold),
never raises into the media tick (a failure is counted and logged once), and a leg without the capability
still delivers its frames as events. In-memory fakes on virtual time, as in test_session.py.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from bridge.engine.barrier import Channel
from bridge.server.session import (
    BACKSTOP_NS,
    MAX_QUEUED_FRAMES,
    TIMER_SLACK_NS,
    CallerFrames,
    CallSession,
    _Wake,
)
from providers.events import AudioReceived, SessionClosed, SessionStarted
from rtp.audio import PCMU_8K
from sip.leg import (
    CallEnded,
    FrameReceived,
    MediaHeld,
    MediaStarted,
    offers_frame_sink,
)
from tests.support import virtual_time
from tests.support.session import FakeLeg, FakeProvider, SinkLeg, pcm_frame, session

event_loop_policy = virtual_time.policy_fixture()


async def _attached(leg: SinkLeg) -> None:
    for _ in range(200):  # bounded: the session attaches once its provider has connected
        if leg.sink is not None:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the session never set a frame sink")


def _frame(i: int) -> FrameReceived:
    return FrameReceived(pcm_frame(0x10 + i), i, i)


async def test_frames_through_the_sink_reach_the_provider_without_the_leg_queue() -> None:
    leg, provider = SinkLeg(), FakeProvider()
    assert offers_frame_sink(leg) and not offers_frame_sink(FakeLeg())
    task = asyncio.create_task(session(leg, provider).run())
    await _attached(leg)
    for i in range(5):
        leg.deliver(_frame(i))
        # synchronous: sent before the tick returns, nothing waits in a queue
        assert provider.sent == [pcm_frame(0x10 + k) for k in range(i + 1)] and leg.queue.empty()
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 5, 0))
    summary = await asyncio.wait_for(task, 5)
    assert summary.frames_in == 5 and summary.ended_by == "caller"
    assert leg.sinks_set == [True, False]  # set for the call, taken back when the session ended


async def test_a_frame_never_overtakes_an_event_queued_before_it() -> None:
    leg, provider = SinkLeg(), FakeProvider()
    task = asyncio.create_task(session(leg, provider).run())
    await _attached(leg)
    leg.deliver(_frame(0))
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 2, 0))
    leg.deliver(_frame(1))  # after the BYE: queued behind it, so the ended call never forwards it
    summary = await asyncio.wait_for(task, 5)
    assert provider.sent == [pcm_frame(0x10)]
    assert summary.frames_in == 1


async def test_a_leg_without_the_sink_still_delivers_frames_as_events() -> None:
    leg, provider = FakeLeg(), FakeProvider()
    task = asyncio.create_task(session(leg, provider).run())
    leg.queue.put_nowait(MediaStarted("PCMU/8000"))
    for i in range(3):
        leg.queue.put_nowait(_frame(i))
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 3, 0))
    summary = await asyncio.wait_for(task, 5)
    assert provider.sent == [pcm_frame(0x10 + i) for i in range(3)] and summary.frames_in == 3


class FailingTap:
    """A --record tap that fails on every caller frame: the failure must stay in the sink."""

    def __init__(self) -> None:
        self.calls = 0

    def channel(self, leg: Channel, start_ns: int) -> Channel:
        return leg

    def caller(self, pcm: bytes, now: int) -> None:
        self.calls += 1
        raise RuntimeError("disk full")


async def test_an_exception_in_the_sink_is_counted_logged_once_and_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leg, provider, tap = SinkLeg(), FakeProvider(), FailingTap()
    call: CallSession = session(leg, provider, media_tap=tap)
    task = asyncio.create_task(call.run())
    await _attached(leg)
    with caplog.at_level(logging.ERROR, logger="parlora.session"):
        for i in range(3):
            leg.deliver(_frame(i))  # would raise into the media tick without the guard
    assert tap.calls == 3 and call._frames.errors == 3
    assert sum("frame sink" in r.getMessage() for r in caplog.records) == 1
    assert not task.done()  # the call goes on
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 3, 0))
    await asyncio.wait_for(task, 5)


# --- CallerFrames on its own, with a recording stand-in for the coordinator ---


class FakeCore:
    def __init__(self, deadline: int | None = None, fail: bool = False) -> None:
        self.frames: list[tuple[bytes, int]] = []
        self.timers: list[int] = []
        self.deadline, self.fail = deadline, fail

    def caller_frame(self, pcm: bytes, now: int) -> None:
        if self.fail:
            raise ValueError("boom")
        self.frames.append((pcm, now))

    def handle_timer(self, now: int) -> None:
        self.timers.append(now)

    def next_deadline(self) -> int | None:
        return self.deadline

    def finished(self, now: int) -> bool:
        return False


def _sink(core: FakeCore, now: int = 1_000) -> tuple[CallerFrames, asyncio.Queue[object], list[object]]:
    inbox: asyncio.Queue[object] = asyncio.Queue()
    carried: list[object] = []
    clock: Callable[[], int] = lambda: now  # noqa: E731
    frames = CallerFrames("call-1", inbox, clock, None, carried.append)
    frames.core = core  # type: ignore[assignment]
    return frames, inbox, carried


def _drain(inbox: asyncio.Queue[object]) -> list[Any]:
    return [inbox.get_nowait() for _ in range(inbox.qsize())]


def test_a_frame_queues_behind_anything_in_the_inbox() -> None:
    core = FakeCore()
    frames, inbox, carried = _sink(core)
    held = MediaHeld()
    inbox.put_nowait(held)
    frames(_frame(0))
    assert core.frames == [] and carried == [] and _drain(inbox) == [held, _frame(0)]
    frames(_frame(1))  # the inbox is empty again: straight in, its commands carried out at once
    assert core.frames == [(pcm_frame(0x11), 1_000)] and carried == [core] and inbox.empty()


def test_a_due_timer_is_handled_first_in_the_media_tick_and_a_frame_queues_before_attach() -> None:
    core = FakeCore()
    frames, inbox, _ = _sink(core, now=1_000)
    frames.due = (
        1_000  # a timer of the core is due: handled there and then, before the frame (as the loop would)
    )
    frames(_frame(0))
    assert core.timers == [1_000] and core.frames == [(pcm_frame(0x10), 1_000)] and inbox.empty()
    frames(_frame(1))  # (the core said: no deadline now)
    assert core.timers == [1_000] and len(core.frames) == 2
    frames.core = None  # not attached (the session's loop is not running)
    frames(_frame(2))
    assert len(core.frames) == 2 and _drain(inbox) == [_frame(2)]


async def test_the_timer_wakes_the_loop_only_when_something_is_due_and_waits_behind_the_media_tick() -> None:
    """One re-armed loop timer per session. A deadline that every frame moves on (the cushion's while
    output plays) never wakes the loop: while frames come, the timer waits `BACKSTOP_NS` behind the latest;
    once they stop, it wakes the loop at the deadline (the old loop waited on each deadline with
    asyncio.timeout and woke 13 times a second per call for nothing)."""
    clock = virtual_time.loop_clock()
    inbox: asyncio.Queue[object] = asyncio.Queue()
    frames = CallerFrames("call-1", inbox, clock, None, lambda core: None)
    core = FakeCore()
    frames.core = core  # type: ignore[assignment]
    start = clock()
    for i in range(50):  # one second of frames, 20 ms apart, each moving the deadline to 30 ms after it
        while clock() < start + i * 20_000_000:
            await asyncio.sleep(0.02 - (clock() - start) % 20_000_000 / 1e9)
        core.deadline = clock() + 30_000_000
        frames(_frame(i % 100))
    assert core.timers == [] and inbox.empty()  # nothing fell due, nothing woke the loop
    # a backstop re-armed behind the latest frame, which is at most a tick old when it fires
    assert frames.timer_wakeups <= 1_000_000_000 // (BACKSTOP_NS - 20_000_000) + 1
    last = clock()
    while inbox.empty() and clock() < last + 1_000_000_000:  # the frames stop: the deadline is 30 ms on
        await asyncio.sleep(0.001)
    assert [type(x) for x in _drain(inbox)] == [_Wake]  # woken once, at most a backstop after the last frame
    assert last + 30_000_000 <= clock() <= last + BACKSTOP_NS + TIMER_SLACK_NS + 1_000_000


def test_a_session_loop_that_is_behind_gets_at_most_the_bound_of_frames_and_the_rest_are_shed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = FakeCore()
    frames, inbox, _ = _sink(core)
    inbox.put_nowait(MediaHeld())  # the loop has not taken its input yet: every frame queues
    with caplog.at_level(logging.WARNING, logger="parlora.session"):
        for i in range(MAX_QUEUED_FRAMES + 7):
            frames(_frame(i % 100))
    assert frames.counters() == {"queued": MAX_QUEUED_FRAMES, "shed": 7, "errors": 0}
    assert inbox.qsize() == 1 + MAX_QUEUED_FRAMES and core.frames == []
    assert sum("shed" in r.getMessage() for r in caplog.records) == 1  # logged once, counted always
    queued = _drain(inbox)[1:]
    assert queued == [_frame(i) for i in range(MAX_QUEUED_FRAMES)]  # the oldest wait; the newest were shed
    for i, frame in enumerate(queued[:10]):  # the loop catches up: each one fed makes room for one more
        frames.feed(core, frame, 2_000 + i)  # type: ignore[arg-type]
    assert frames.queued == MAX_QUEUED_FRAMES - 10 and len(core.frames) == 10
    frames(_frame(0))  # the inbox is empty again: straight in, nothing shed
    assert frames.shed == 7 and len(core.frames) == 11


def test_a_failing_core_is_counted_not_raised() -> None:
    frames, inbox, carried = _sink(FakeCore(fail=True))
    for i in range(4):
        frames(_frame(i))
    assert frames.errors == 4 and carried == [] and inbox.empty()


async def test_the_native_leg_hands_a_frame_to_the_sink_only_while_no_event_waits() -> None:
    from sip.native.leg import NativeLeg

    leg = object.__new__(NativeLeg)  # only the queue and the sink of the real leg: no engine behind it
    leg._queue, leg._sink = asyncio.Queue(), None
    got: list[FrameReceived] = []
    leg._post(_frame(0))  # no sink: queued as an event
    leg.set_frame_sink(got.append)
    leg._post(_frame(1))  # an earlier event still waits: behind it
    assert got == [] and [leg._queue.get_nowait() for _ in range(2)] == [_frame(0), _frame(1)]
    leg._post(_frame(2))
    held = MediaHeld()
    leg._post(held)  # not a frame: always queued
    leg._post(_frame(3))
    assert got == [_frame(2)] and [leg._queue.get_nowait() for _ in range(2)] == [held, _frame(3)]
    leg.set_frame_sink(None)
    leg._post(_frame(4))
    assert got == [_frame(2)] and leg._queue.get_nowait() == _frame(4)


class SinkProvider(FakeProvider):
    """A provider with the capability (providers.base.DeliversEvents), as the WebSocket adapters have it: its
    events go to the session's sink from its socket's callback (`push` here), not through `events()`."""

    def __init__(self) -> None:
        super().__init__()
        self.sink: Callable[[Any], None] | None = None

    def deliver_to(self, sink: Callable[[Any], None]) -> None:
        self.sink = sink

    async def events(self) -> Any:  # never read once delivering
        raise AssertionError("events() read although the provider delivers to a sink")
        yield

    def push(self, event: Any) -> None:
        assert self.sink is not None
        self.sink(event)

    def request_close(self) -> None:  # the close comes later, from the socket (never inside the command)
        self.close_requested = True
        asyncio.get_running_loop().call_soon(
            self.push, SessionClosed(self.token, "close_requested", True, 3.0)
        )


async def _delivering(provider: SinkProvider) -> None:
    for _ in range(200):  # bounded: the session hands over its sink once the provider has connected
        if provider.sink is not None:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the session never asked for the provider's events by a sink")


async def test_provider_events_through_the_sink_reach_the_coordinator_in_the_sockets_callback() -> None:
    """No reader task and no inbox: the audio is in the leg's playout before the push returns, and
    the provider's close ends the call through the same sink."""
    from providers.base import DeliversEvents

    leg, provider = SinkLeg(), SinkProvider()
    assert isinstance(provider, DeliversEvents) and not isinstance(FakeProvider(), DeliversEvents)
    s = session(leg, provider)
    task = asyncio.create_task(s.run())
    await _delivering(provider)
    await _attached(leg)
    audio = bytes(range(256)) * 5  # 160 ms of PCMU
    provider.push(AudioReceived(1, audio, PCMU_8K))
    assert leg.playout.depth >= 2  # the cushion, enqueued there and then
    assert all(isinstance(item, _Wake) for item in s._inbox._queue)  # type: ignore[attr-defined]  # at most a wake
    provider.push(SessionClosed(1, "expired", True, 12.0))
    summary = await asyncio.wait_for(task, 5)
    assert summary.ended_by == "provider" and summary.usage_seconds == 12.0 and s._frames.errors == 0


async def test_a_provider_event_never_overtakes_an_input_queued_before_it() -> None:
    """While the inbox holds anything the event queues behind it, as a caller frame does; SessionStarted always
    goes through the inbox."""
    leg, provider = SinkLeg(), SinkProvider()
    s = session(leg, provider)
    task = asyncio.create_task(s.run())
    await _delivering(provider)
    await _attached(leg)
    s._inbox.put_nowait(_Wake())  # something the loop has not taken yet
    provider.push(AudioReceived(1, bytes(range(256)) * 5, PCMU_8K))
    assert leg.playout.depth == 0 and s._inbox.qsize() == 2  # behind it, not into the core
    provider.push(SessionStarted(1, "sess-2", None))
    assert s._inbox.qsize() == 3
    provider.push(SessionClosed(1, "expired", True, 1.0))
    summary = await asyncio.wait_for(task, 5)
    assert summary.ended_by == "provider"
