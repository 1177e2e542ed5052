"""Caller frames in pairs (bridge/server/session.py `ProviderLinks`, `Capabilities.append_frames` 2): to a
connection whose protocol takes any length per append, two 20 ms frames leave in one `send_audio`; no frame
waits longer than one frame, a commit (or any other command) follows all of its audio, a card collection's
start drops the frame waiting for its pair (never sent, counted as withheld), and a closing connection drops
its own. Through the whole session shell, frames through the sink as the native leg's media tick gives them;
on virtual time.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine import commands as cmd
from bridge.engine.card import CARD_CAUSE, CardOptions
from bridge.engine.commands import AudioDiscontinuity
from bridge.server.session import ApplicationHooks, CallSession, ProviderLinks
from providers.base import Capabilities, SessionSettings
from providers.events import SessionClosed, SessionStarted
from rtp.resample import NarrowView
from sip.leg import CallEnded, FrameReceived, MediaHeld
from tests.support import session as support
from tests.support import virtual_time
from tests.support.session import FakeProvider, pcm_frame

event_loop_policy = virtual_time.policy_fixture()


class SinkLeg(support.SinkLeg):
    def __init__(self) -> None:
        super().__init__()
        self.seq = 0

    def tick(self, value: int) -> None:
        """One caller frame of `frame_of(value)`, as the native leg's media tick hands it."""
        self.seq += 1
        self.deliver(FrameReceived(frame_of(value), self.seq, self.seq * 160))


class PairProvider(FakeProvider):
    """Takes caller frames in pairs; every call the session makes on it, in order, in `wire`."""

    capabilities = Capabilities(
        server_vad=True, speech_end_events=True, timed_captions=True, truncate=True, append_frames=2
    )

    def __init__(self, token: int = 1) -> None:
        super().__init__()
        self.token = token
        self.wire: list[object] = []

    async def connect(self) -> SessionStarted:
        return SessionStarted(self.token, f"sess_{self.token}", None)

    def send_audio(self, audio: bytes, wide: bool = False) -> None:
        super().send_audio(audio)
        self.wire.append(audio)

    def commit_input(self) -> None:
        super().commit_input()
        self.wire.append("commit")

    def cancel_response(self) -> None:
        self.wire.append("cancel")

    def send_text(self, text: str, *, speak: bool = False) -> None:
        self.wire.append("text")


def frame_of(value: int) -> bytes:
    return pcm_frame(0x10 + value)


async def started(
    leg: SinkLeg, provider: PairProvider, **kwargs: object
) -> tuple[CallSession, asyncio.Task[object]]:
    call = CallSession(leg, provider, clock=virtual_time.loop_clock(), **kwargs)  # type: ignore[arg-type]
    task: asyncio.Task[object] = asyncio.create_task(call.run())  # type: ignore[arg-type]
    async with asyncio.timeout(5):
        while leg.sink is None:
            await asyncio.sleep(0.001)
    return call, task


async def ended(leg: SinkLeg, task: asyncio.Task[object]) -> None:
    leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)


async def until(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.001)


async def test_two_frames_leave_in_one_send_and_a_plain_provider_still_gets_each_frame() -> None:
    leg, provider = SinkLeg(), PairProvider()
    _, task = await started(leg, provider)
    leg.tick(0)
    assert provider.wire == []  # the first of a pair waits for the next frame
    leg.tick(1)
    assert provider.wire == [frame_of(0) + frame_of(1)]
    leg.tick(2)
    leg.tick(3)
    assert provider.wire == [frame_of(0) + frame_of(1), frame_of(2) + frame_of(3)]
    await ended(leg, task)

    plain_leg, plain = SinkLeg(), FakeProvider()  # append_frames 1 (the default): each frame alone, at once
    _, task = await started(plain_leg, plain)  # type: ignore[arg-type]
    plain_leg.tick(0)
    assert plain.sent == [frame_of(0)]
    await ended(plain_leg, task)


async def test_a_hold_sends_the_waiting_frame_alone_before_its_cancel_and_the_held_frames_never() -> None:
    """S7: the hold cancels the floor's response; the frame that waited for its pair goes first, alone, and no
    frame of the hold follows."""
    leg, provider = SinkLeg(), PairProvider()
    call, task = await started(leg, provider)
    leg.tick(0)
    leg.tick(1)
    leg.tick(2)
    leg.queue.put_nowait(MediaHeld())
    await until(lambda: call.coordinator is not None and call.coordinator.call_line.paused)
    assert provider.wire == [frame_of(0) + frame_of(1), frame_of(2), "cancel"]
    for value in range(3, 7):
        leg.tick(value)  # held: not forwarded
    assert provider.wire == [frame_of(0) + frame_of(1), frame_of(2), "cancel"]
    await ended(leg, task)


async def test_a_commit_follows_all_of_its_audio_and_other_commands_keep_their_order() -> None:
    leg, provider = SinkLeg(), PairProvider()
    call, task = await started(leg, provider)
    carriers = call.links.carriers()
    leg.tick(0)
    carriers[cmd.CommitInput](cmd.CommitInput("conn-1"))  # (RO2's hard stop, RO5's flush)
    assert provider.wire == [frame_of(0), "commit"]
    leg.tick(1)
    leg.tick(2)  # a fresh pair from frame 1
    assert provider.wire == [frame_of(0), "commit", frame_of(1) + frame_of(2)]
    leg.tick(3)
    carriers[cmd.CancelResponse](cmd.CancelResponse(1))
    assert provider.wire[-2:] == [frame_of(3), "cancel"]
    await ended(leg, task)


async def test_a_card_collection_started_with_half_a_pair_waiting_never_sends_it() -> None:
    """The nasty case: the frame waiting for its pair as the collection starts may carry the first key's tone.
    It is dropped, not sent (nor any frame of the collection), and the card's input discontinuity counts it."""
    leg, provider = SinkLeg(), PairProvider()
    notices: list[object] = []
    call, task = await started(leg, provider, notice_sink=lambda _id, n: notices.append(n))
    leg.tick(0)
    leg.tick(1)
    leg.tick(2)  # waits for its pair
    assert provider.wire == [frame_of(0) + frame_of(1)]
    result = asyncio.create_task(call.collect_card(CardOptions(min_digits=1, max_digits=4)))
    await until(lambda: call._frames.card is not None)
    for value in range(3, 6):
        leg.tick(value)  # withheld
    assert call.cancel_card()
    assert (await asyncio.wait_for(result, 5)).outcome == "cancelled"
    leg.tick(6)
    leg.tick(7)  # the frames flow again, in fresh pairs
    assert provider.wire == [frame_of(0) + frame_of(1), frame_of(6) + frame_of(7)]
    assert not any(frame_of(v) in chunk for v in range(2, 6) for chunk in provider.sent)
    gaps = [n for n in notices if isinstance(n, AudioDiscontinuity) and n.cause == CARD_CAUSE]
    assert [(g.direction, g.amount) for g in gaps] == [("input", 4)]  # frame 2 and the three withheld
    await ended(leg, task)


async def test_a_closing_connection_drops_its_waiting_frame_and_a_replacement_starts_its_own_pairs() -> None:
    """HR5: the floor is lost with a frame waiting for its pair; it is dropped with the connection, never sent
    to the replacement, whose own pairs begin with the first frame it is given."""
    leg, first = SinkLeg(), PairProvider(1)
    replacements: list[PairProvider] = []

    def reconnect(token: int, settings: SessionSettings) -> PairProvider:
        replacements.append(PairProvider(token))
        return replacements[-1]

    call, task = await started(leg, first, reconnect=reconnect)
    leg.tick(0)
    leg.tick(1)
    leg.tick(2)  # waits for its pair
    first.queue.put_nowait(SessionClosed(1, "connection closed (code 1006)", False))
    await until(lambda: 1 not in call.providers)
    assert 1 not in call.links.waiting and 1 not in call.links.held
    await until(lambda: call.coordinator is not None and call.coordinator.token == 2)
    for value in range(3, 7):
        leg.tick(value)
    assert first.wire == [frame_of(0) + frame_of(1)]  # frame 2 went nowhere: its connection is gone
    second = replacements[0]
    assert second.wire == [frame_of(3) + frame_of(4), frame_of(5) + frame_of(6)]  # its own pairs
    await ended(leg, task)


async def test_a_connection_that_stops_hearing_the_caller_gets_its_waiting_frame_alone_at_the_next_frame() -> (
    None
):
    """RO2: a rollover's connections pair independently; the old one's frame waiting when it stops hearing the
    caller goes alone at the end of the next frame, the one it did not get."""
    leg, first = SinkLeg(), PairProvider(1)
    call, task = await started(leg, first, reconnect=lambda token, _settings: PairProvider(token))
    links = call.links
    links.open(cmd.OpenRollover("conn-2"))
    second = links.providers[2]
    assert isinstance(second, PairProvider)
    send = links.carriers()[cmd.SendAudio]
    send(cmd.SendAudio(frame_of(0), 1))  # both hear frame 0: each waits for its pair
    send(cmd.SendAudio(frame_of(0), 2))
    links.frame_end()
    send(cmd.SendAudio(frame_of(1), 1))  # the second no longer hears the caller
    links.frame_end()
    # frame 1 reached the first connection only: the second's frame 0 went alone at that frame's end
    assert first.wire == [frame_of(0) + frame_of(1)] and second.wire == [frame_of(0)]
    send(cmd.SendAudio(frame_of(2), 2))
    links.frame_end()
    send(cmd.SendAudio(frame_of(3), 2))
    links.frame_end()
    assert second.wire == [frame_of(0), frame_of(2) + frame_of(3)]
    await ended(leg, task)


async def test_the_frame_waiting_at_the_callers_hang_up_goes_before_the_close_request() -> None:
    """The caller's last frame before the BYE reaches the provider as it would have without pairs: alone, before
    the session asks the connection to close (and nothing after that)."""
    leg, provider = SinkLeg(), PairProvider()
    _, task = await started(leg, provider)
    leg.tick(0)
    leg.tick(1)
    leg.tick(2)
    await ended(leg, task)
    assert provider.wire == [frame_of(0) + frame_of(1), frame_of(2)] and provider.close_requested


# -- the pairing rules alone, over any sequence (ProviderLinks without a session) ----------------------------

TOKENS = (1, 2, 3)  # 1 and 2 take pairs, 3 frames one by one
STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("frame"), st.frozensets(st.sampled_from(TOKENS))
        ),  # the connections the core sent it to
        st.tuples(st.just("commit"), st.sampled_from(TOKENS)),
        st.tuples(st.just("cancel"), st.sampled_from(TOKENS)),
        st.tuples(st.just("card"), st.just(0)),
        st.tuples(st.just("close"), st.sampled_from((2, 3))),
    ),
    max_size=40,
)


def _links(providers: dict[int, FakeProvider]) -> ProviderLinks:
    inbox: asyncio.Queue[object] = asyncio.Queue()
    made = iter((providers[2], providers[3]))
    links = ProviderLinks(
        providers[1],
        call_id="c",
        inbox=inbox,
        hooks=ApplicationHooks("c", inbox, job_handler=None, approve=None, authorize=None),
        spawn=lambda _name, coro: coro.close(),  # (no connection is opened: nothing runs)
        cancel=lambda _name: None,
        floor=lambda: 1,
        reconnect=lambda _token, _settings: next(made),
        settings=SessionSettings(),
    )
    links.open(cmd.OpenRollover("conn-2"))
    links.open(cmd.OpenRollover("conn-3"))
    return links


@settings(max_examples=300, deadline=None)
@given(steps=STEPS)
def test_every_frame_goes_once_in_order_at_most_one_frame_late_unless_a_card_or_its_close_drops_it(
    steps: list[tuple[str, object]],
) -> None:
    """Whatever the interleaving of frames (to any subset of the connections, as holds, recoveries and
    rollovers make it), commands, card starts and closes, each connection's calls are exactly the rules'
    (ProviderLinks' docstring): a pair's first frame waits for the next frame, goes alone at the end of a frame
    that did not bring its pair or before another command, and is dropped only at a card's start (then never
    sent to that connection) or with its connection."""
    three = FakeProvider()
    three.token = 3
    providers: dict[int, FakeProvider] = {1: PairProvider(1), 2: PairProvider(2), 3: three}
    links = _links(providers)
    carriers = links.carriers()
    expected: dict[int, list[bytes]] = {t: [] for t in TOKENS}  # each connection's audio, send by send
    given: dict[int, list[int]] = {t: [] for t in TOKENS}
    pending: dict[int, int] = {}  # the model: a connection's frame waiting for its pair
    lost: dict[int, set[int]] = {t: set() for t in TOKENS}  # frames dropped at a card's start
    closed_with: dict[int, set[int]] = {t: set() for t in TOKENS}  # ... with their connection
    open_tokens = set(TOKENS)
    n = 0
    for kind, arg in steps:
        if kind == "frame":
            n += 1
            for token in sorted(arg):  # type: ignore[call-overload]
                carriers[cmd.SendAudio](cmd.SendAudio(frame_of(n), token))
                if token not in open_tokens:
                    continue
                given[token].append(n)
                if token == 3:
                    expected[3].append(frame_of(n))
                elif token in pending:
                    expected[token].append(frame_of(pending.pop(token)) + frame_of(n))
                else:
                    pending[token] = n
            if links.held or links.waiting:  # as CallerFrames does once a frame's commands are carried out
                links.frame_end()
            for token, first in list(pending.items()):
                if first < n:  # its pair did not come with this frame: alone, now
                    expected[token].append(frame_of(pending.pop(token)))
        elif kind in ("commit", "cancel") and arg in open_tokens:
            command = cmd.CommitInput(f"conn-{arg}") if kind == "commit" else cmd.CancelResponse(arg)  # type: ignore[arg-type]
            carriers[type(command)](command)
            if arg in pending:
                expected[arg].append(frame_of(pending.pop(arg)))  # type: ignore[call-overload]
        elif kind == "card":
            assert links.drop_waiting() == (1 if pending else 0)
            for token, first in pending.items():
                lost[token].add(first)
            pending.clear()
        elif kind == "close" and arg in open_tokens:
            links.close(cmd.CloseTransport(f"conn-{arg}"))
            if (first := pending.pop(arg, None)) is not None:  # type: ignore[call-overload]
                closed_with[arg].add(first)  # type: ignore[index]
            open_tokens.discard(arg)  # type: ignore[arg-type]
        for token in TOKENS:
            assert providers[token].sent == expected[token], (token, n)
    for token in TOKENS:  # and, from what was given alone: order, sizes, nothing dropped but by card or close
        sent = providers[token].sent
        assert all(len(chunk) in ((320,) if token == 3 else (320, 640)) for chunk in sent)
        gone = lost[token] | closed_with[token] | ({pending[token]} if token in pending else set())
        assert b"".join(sent) == b"".join(frame_of(f) for f in given[token] if f not in gone)
        assert not any(frame_of(f) in chunk for f in lost[token] for chunk in sent)


class WideSinkLeg(SinkLeg):
    def tick_wide(self, pcm: bytes) -> None:
        """One 16 kHz caller frame (a G.722 leg's, 640 bytes)."""
        self.seq += 1
        assert self.sink is not None and self.queue.empty()
        self.sink(FrameReceived(pcm, self.seq, self.seq * 160))


class RatedPairProvider(PairProvider):
    """A pairing provider that also notes each send's rate; `wide_input` as the test says."""

    def __init__(self, wide_input: bool) -> None:
        super().__init__()
        self.capabilities = replace(PairProvider.capabilities, wide_input=wide_input)
        self.rates: list[bool] = []

    def send_audio(self, audio: bytes, wide: bool = False) -> None:
        super().send_audio(audio, wide)
        self.rates.append(wide)


def wide_frames(n: int) -> list[bytes]:
    """`n` 20 ms frames of a 1 kHz tone at 16 kHz."""
    t = np.arange(n * 320) / 16000
    pcm = np.asarray(8000 * np.sin(2 * np.pi * 1000 * t), dtype="<i2").tobytes()
    return [pcm[640 * i : 640 * (i + 1)] for i in range(n)]


async def test_a_16khz_leg_s_pairs_go_wide_to_a_wide_provider_and_as_their_8khz_view_to_the_others() -> None:
    """Two 8 kHz frames joined are as long as one 16 kHz frame: the session, which knows each frame's rate,
    says it (`wide`) to a provider that takes 16 kHz and gives the others the 8 kHz view, one view per stream."""
    frames = wide_frames(4)
    leg, wide = WideSinkLeg(), RatedPairProvider(wide_input=True)
    _, task = await started(leg, wide)
    for pcm in frames:
        leg.tick_wide(pcm)
    assert wide.wire == [frames[0] + frames[1], frames[2] + frames[3]] and wide.rates == [True, True]
    await ended(leg, task)

    leg, narrow = WideSinkLeg(), RatedPairProvider(wide_input=False)
    _, task = await started(leg, narrow)
    for pcm in frames:
        leg.tick_wide(pcm)
    view = NarrowView()
    views = [view(pcm) for pcm in frames]
    assert narrow.wire == [views[0] + views[1], views[2] + views[3]] and narrow.rates == [False, False]
    assert all(len(v) == 320 for v in views)
    await ended(leg, task)

    leg, eight = WideSinkLeg(), RatedPairProvider(wide_input=True)  # an 8 kHz leg: its pairs are not wide
    _, task = await started(leg, eight)
    for value in range(4):
        leg.tick(value)
    assert [len(a) for a in eight.wire] == [640, 640] and eight.rates == [False, False]
    await ended(leg, task)


async def test_a_pair_never_joins_frames_of_two_rates() -> None:
    """A re-offer changed the leg's rate between two frames: the waiting one goes alone at its rate."""
    [wide_frame] = wide_frames(1)
    leg, provider = WideSinkLeg(), RatedPairProvider(wide_input=True)
    _, task = await started(leg, provider)
    leg.tick(0)
    leg.tick_wide(wide_frame)
    assert provider.wire == [frame_of(0)] and provider.rates == [False]
    leg.tick_wide(wide_frame)
    assert provider.wire == [frame_of(0), wide_frame + wide_frame] and provider.rates == [False, True]
    await ended(leg, task)
