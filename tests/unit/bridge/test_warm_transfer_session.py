"""The warm transfer in the session shell (bridge/server/warm.py), on virtual time: a fake dial, the target's
leg a fake leg, the briefing a second session on it."""

from __future__ import annotations

import asyncio
import json

from bridge.engine.telephony import TelephonyOptions, TransferInProgress
from bridge.engine.warm_transfer import (
    ACCEPTED,
    JOIN_RELAY,
    JOIN_REPLACES,
    NO_ANSWER,
    REFUSED,
    REPLACED,
    TransferResult,
    WarmOptions,
)
from bridge.server.api import LiveCall
from bridge.server.session import CallSession, CallSummary
from bridge.server.warm import BRIEF_NOW, MUSIC_ITEM, WarmDeps
from providers.events import ToolCallRequested
from sip.leg import (
    CallEnded,
    CallLeg,
    DtmfReceived,
    FrameReceived,
    LegFeatures,
    MediaStarted,
    TransferProgress,
)
from tests.support import virtual_time
from tests.support.delegations import ToolProvider
from tests.support.session import FakeLeg, pcm_frame

event_loop_policy = virtual_time.policy_fixture()

TARGET = "sip:agent@127.0.0.1:5070"


class Leg(FakeLeg):
    def __init__(self, call_id: str = "call-1") -> None:
        super().__init__()
        self.digits: list[str] = []
        self.identity_id = call_id

    def send_dtmf(self, digits: str) -> None:
        self.digits.append(digits)


class TargetLeg(Leg):
    features = LegFeatures(dialled=True)
    outbound = True


REFER_TO = "sip:agent@127.0.0.1:5070?Replaces=t1%3Bto-tag%3Dtheirs%3Bfrom-tag%3Dours"


class ReplacesCaller(Leg):
    """A caller whose INVITE declared Replaces and allows REFER (sip/leg.py `ReplacesLeg`)."""

    features = LegFeatures(replaces=True)

    def __init__(self) -> None:
        super().__init__()
        self.refers: list[str] = []

    def accepts_replaces(self) -> bool:
        return True

    def replaces_refer_to(self) -> str:
        return ""

    def transfer(self, target: str) -> None:
        self.refers.append(target)


class ReplacesTarget(TargetLeg):
    features = LegFeatures(dialled=True, replaces=True)

    def accepts_replaces(self) -> bool:
        return False

    def replaces_refer_to(self) -> str:
        return REFER_TO


class TextProvider(ToolProvider):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[tuple[str, bool]] = []

    def send_text(self, text: str, *, speak: bool = False) -> None:
        self.texts.append((text, speak))


class Rig:
    def __init__(
        self, *, fail_dial: bool = False, tools: bool = False, music: bytes = b"", replaces: bool = False
    ) -> None:
        self.caller, self.provider = (ReplacesCaller() if replaces else Leg()), TextProvider()
        self.target, self.briefer = (ReplacesTarget() if replaces else TargetLeg()), TextProvider()
        self.dialled: list[tuple[str, float]] = []
        self.instructions: list[str] = []
        self.briefings: list[CallSession] = []

        async def dial(target: str, ring_timeout_s: float) -> CallLeg:
            self.dialled.append((target, ring_timeout_s))
            if fail_dial:
                raise OSError("no RTP port free")
            return self.target

        def briefing(leg: CallLeg, instructions: str) -> CallSession:
            self.instructions.append(instructions)
            session = CallSession(leg, self.briefer, clock=virtual_time.loop_clock())
            self.briefings.append(session)
            return session

        telephony = TelephonyOptions(
            transfer_targets={"agent": TARGET} if tools else {}, warm=WarmOptions(ring_timeout_ms=5_000)
        )
        self.session = CallSession(
            self.caller,
            self.provider,
            clock=virtual_time.loop_clock(),
            telephony_options=telephony,
            warm=WarmDeps(dial, briefing, music),
        )
        self.live = LiveCall(self.caller.identity, self.session)
        self.task: asyncio.Task[CallSummary] = asyncio.create_task(self.session.run())

    async def up(self) -> None:
        await until(lambda: self.session.coordinator is not None)

    def transfer(self) -> asyncio.Future[TransferResult]:
        result = self.live.transfer(TARGET, mode="warm", brief="wants a refund", digits="12")
        assert result is not None
        return result


async def until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_accepted_the_legs_are_relayed_the_ai_leaves_and_the_target_s_hang_up_ends_the_call() -> None:
    rig = Rig()
    await rig.up()
    result = rig.transfer()
    await until(lambda: rig.dialled)
    assert rig.dialled == [(TARGET, 5.0)] and "wants a refund" in rig.instructions[0]
    assert rig.session.status()["line"] == "held"
    sent = len(rig.provider.sent)
    for n in range(10):  # the caller on hold music: nothing reaches the model
        rig.caller.queue.put_nowait(FrameReceived(pcm_frame(0x10), n, 0))
    await asyncio.sleep(0.3)
    assert len(rig.provider.sent) == sent
    rig.target.queue.put_nowait(MediaStarted("PCMU"))  # the human answers
    await until(lambda: rig.target.digits == ["12"])
    await until(lambda: (BRIEF_NOW, True) in rig.briefer.texts)  # the second session briefs them
    rig.target.queue.put_nowait(DtmfReceived("1"))  # and they accept
    done = await asyncio.wait_for(result, 5)
    assert done.outcome == ACCEPTED and done.transferred and done.status == 200
    await until(lambda: rig.provider.closed and rig.briefer.closed)  # the AI leaves both legs
    assert rig.caller.hangups == [] and rig.target.hangups == []
    queued = rig.target.playout.depth
    for n in range(5):  # the caller's voice reaches the human, and the human's the caller
        rig.caller.queue.put_nowait(FrameReceived(pcm_frame(0x20), 100 + n, 0))
        rig.target.queue.put_nowait(FrameReceived(pcm_frame(0x30), n, 0))
    await until(lambda: rig.target.playout.depth >= queued + 5 and rig.caller.playout.depth >= 5)
    assert not rig.task.done()
    rig.target.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(rig.task, 5)
    assert rig.caller.hangups == ["the transfer target hung up"]


async def test_refused_the_caller_is_back_with_the_model_who_is_told_why() -> None:
    rig = Rig()
    await rig.up()
    result = rig.transfer()
    await until(lambda: rig.dialled)
    rig.target.queue.put_nowait(MediaStarted("PCMU"))
    await until(lambda: rig.target.digits)
    rig.target.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))  # the human hangs up
    done = await asyncio.wait_for(result, 5)
    assert done.outcome == REFUSED and rig.target.hangups == []
    await until(lambda: any("did not go through: refused" in t for t, _ in rig.provider.texts))
    assert rig.session.status()["line"] == "up" and rig.caller.hangups == []
    sent = len(rig.provider.sent)
    rig.caller.queue.put_nowait(FrameReceived(pcm_frame(0x10), 0, 0))
    await until(lambda: len(rig.provider.sent) > sent)  # the caller reaches the model again
    rig.transfer()  # and a new transfer may start
    rig.caller.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(rig.task, 5)


async def test_no_answer_in_time_cancels_the_target_and_one_transfer_at_a_time() -> None:
    rig = Rig()
    await rig.up()
    result = rig.transfer()
    try:
        rig.transfer()
        raise AssertionError("a second transfer was started")
    except TransferInProgress:
        pass
    done = await asyncio.wait_for(result, 10)  # the 5 s ring timeout
    assert done.outcome == NO_ANSWER and rig.target.hangups == ["no answer in time"]
    assert rig.session.status()["line"] == "up"
    rig.caller.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(rig.task, 5)


async def test_the_model_s_warm_transfer_that_cannot_be_dialled_is_answered_failed() -> None:
    rig = Rig(fail_dial=True, tools=True)
    await rig.up()
    args = {"destination": "agent", "mode": "warm"}
    rig.provider.queue.put_nowait(ToolCallRequested(1, "call_w", "transfer_call", json.dumps(args)))
    await asyncio.wait_for(rig.provider.answered.wait(), 5)
    [(call_id, output)] = rig.provider.results
    answer = json.loads(output)
    assert call_id == "call_w" and answer["outcome"] == "failed" and answer["mode"] == "warm"
    assert "no RTP port free" in answer["reason"] and answer["transferred"] is False
    rig.caller.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(rig.task, 5)


async def test_the_waiting_caller_hears_the_hold_music_looped_and_it_stops_when_the_caller_is_back() -> None:
    music = bytes(range(256)) * 5  # 1,280 bytes: four frames, looped
    rig = Rig(music=music)
    await rig.up()
    result = rig.transfer()
    await until(lambda: rig.caller.playout.depth == 3)  # paced: three frames wait at most
    pulled = [rig.caller.playout.pull(n * 20_000_000) for n in range(1, 7)]
    await asyncio.sleep(0.1)
    pulled += [rig.caller.playout.pull(n * 20_000_000) for n in range(7, 10)]
    frames = [f for f in pulled if f is not None]
    assert [f.item_id for f in frames] == [MUSIC_ITEM] * len(frames) and len(frames) >= 6
    assert frames[0].pcm == music[:320] and frames[4].pcm == music[:320]  # the loop
    rig.target.queue.put_nowait(CallEnded("Busy Here", 486, True, 0, 0))
    assert (await asyncio.wait_for(result, 5)).outcome == "busy"
    await asyncio.sleep(0.1)
    for n in range(10, 14):
        rig.caller.playout.pull(n * 20_000_000)
    await asyncio.sleep(0.1)
    assert rig.caller.playout.depth == 0  # the music stopped with the caller back
    rig.caller.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(rig.task, 5)


async def test_after_the_caller_hung_up_nothing_is_dialled() -> None:
    rig = Rig()
    await rig.up()
    core = rig.session.coordinator
    assert core is not None
    rig.caller.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await until(lambda: core.ending.leg_ended)
    try:
        rig.transfer()
        raise AssertionError("a warm transfer started on a call that is over")
    except ValueError:
        pass
    await asyncio.wait_for(rig.task, 5)
    assert rig.dialled == []


async def accepted_by_replaces() -> tuple[Rig, asyncio.Future[TransferResult]]:
    """The human keys 1: the caller, who declared Replaces, is sent the REFER that replaces the target's dialog."""
    rig = Rig(replaces=True)
    await rig.up()
    result = rig.transfer()
    await until(lambda: rig.dialled)
    rig.target.queue.put_nowait(MediaStarted("PCMU"))
    await until(lambda: (BRIEF_NOW, True) in rig.briefer.texts)
    rig.target.queue.put_nowait(DtmfReceived("1"))
    caller = rig.caller
    assert isinstance(caller, ReplacesCaller)
    await until(lambda: caller.refers == [REFER_TO])
    await until(lambda: rig.briefer.closed)  # the AI left the target's leg
    assert not result.done() and not rig.provider.closed  # the caller's session waits for the REFER's outcome
    assert rig.session.status()["line"] == "held"
    caller.queue.put_nowait(TransferProgress(REFER_TO, 100, "Accepted", False))
    return rig, result


async def test_joined_by_replaces_the_ai_leaves_and_the_targets_bye_ends_the_session() -> None:
    rig, result = await accepted_by_replaces()
    rig.caller.queue.put_nowait(TransferProgress(REFER_TO, 200, "OK", True))
    done = await asyncio.wait_for(result, 5)
    assert done.outcome == ACCEPTED and done.join == JOIN_REPLACES and done.transferred
    await until(lambda: rig.provider.closed)  # the AI leaves
    assert rig.caller.hangups == [REPLACED]  # the bridge's caller leg ends (the transfer machinery's BYE)
    await asyncio.sleep(0.5)
    assert not rig.task.done()  # waiting for the target to end the leg it replaced
    rig.target.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))  # the target's BYE
    await asyncio.wait_for(rig.task, 5)
    assert rig.target.hangups == []  # its BYE was the normal end: the bridge sent none


async def test_joined_by_replaces_a_replaced_leg_the_target_keeps_is_ended_after_the_bounded_wait() -> None:
    rig, result = await accepted_by_replaces()
    rig.caller.queue.put_nowait(TransferProgress(REFER_TO, 200, "OK", True))
    await asyncio.wait_for(result, 5)
    await asyncio.wait_for(rig.task, 10)  # the 3 s wait (WarmOptions.replaced_wait_ms), virtual time
    assert rig.target.hangups == ["the replaced leg was not ended by the target"]


async def test_a_refused_refer_with_replaces_falls_back_to_the_relay() -> None:
    rig, result = await accepted_by_replaces()
    rig.caller.queue.put_nowait(TransferProgress(REFER_TO, 405, "Method Not Allowed", True))
    done = await asyncio.wait_for(result, 5)
    assert done.outcome == ACCEPTED and done.join == JOIN_RELAY and "405 Method Not Allowed" in done.reason
    await until(lambda: rig.provider.closed)
    queued = rig.target.playout.depth
    for n in range(5):  # relayed both ways
        rig.caller.queue.put_nowait(FrameReceived(pcm_frame(0x20), 100 + n, 0))
        rig.target.queue.put_nowait(FrameReceived(pcm_frame(0x30), n, 0))
    await until(lambda: rig.target.playout.depth >= queued + 5 and rig.caller.playout.depth >= 5)
    rig.target.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(rig.task, 5)
    assert rig.caller.hangups == ["the transfer target hung up"]
