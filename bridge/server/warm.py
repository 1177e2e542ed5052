"""The warm transfer's shell: carries out the actions of bridge/engine/warm_transfer.py `WarmTransfer` for one
call's session (bridge/server/session.py `CallSession`).

- The target is dialled through the engine's outbound calls (sip/engine.py `Dialer.dial`, the server's
  `WarmDeps.dial`), with the transfer's ring timeout.
- The briefing is a second session on the target's leg (`WarmDeps.briefing`: a `CallSession` whose instructions
  are the briefing, no tools), started as soon as the leg exists: the session core holds its greeting while the
  leg rings (S7) and asks the model to speak once the human answered (`BriefTarget`). The events it reads of the
  target's leg are told to the transfer first (`_TeeLeg`): the answer, the human's keys, the hang-up.
- Hold music: the caller's line is held by the session core (bridge/engine/reservoir.py `Line`, holder
  "transfer"); what the caller hears meanwhile is the carrier's silence.
- Join by REFER with Replaces (`ReferCaller`, when the caller's leg takes one: sip/leg.py `ReplacesLeg`): the
  briefing session is stopped, the target's leg is read for its end (`_pump`, nothing relayed yet) and the
  caller's leg sends the REFER (`CallLeg.transfer`, the cold transfer's machinery: its `TransferProgress`
  reports come back through the caller session, `WarmSeat.refer_progress`). Joined that way, the session runs
  on only until the target ended its replaced leg or the core's bounded wait dropped it (`WarmSeat.lingering`).
- Join by relay: the briefing session is stopped (its provider connections closed, the target's leg kept), the caller's
  frames go to the target's leg (the session's frame path, `CallerFrames.early`, a flag it already tests) and the
  target's to the caller's; the caller's session core is ended without a BYE (the AI leaves; nothing is opened
  or funded after, S6) and the session runs on, relaying, until either leg ends (`CallSession.relaying`).
- The outcome: the application's `LiveCall.transfer(mode="warm")` future gets the `TransferResult`; the model is
  told through the session core (its tool's answer, or an update for the application's transfer).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.engine.commands import Transcript, WarmTransferCall
from bridge.engine.telephony import TransferInProgress
from bridge.engine.warm_transfer import (
    FAILED,
    BriefTarget,
    CallerHungUp,
    DialTarget,
    DropTarget,
    HangUpCaller,
    HoldCaller,
    JoinLegs,
    Outcome,
    ReferCaller,
    ReferProgress,
    ReleaseCaller,
    SendTargetDigits,
    SessionEnded,
    TargetDigit,
    TargetHungUp,
    TargetProgress,
    TransferResult,
    WarmAction,
    WarmEvent,
    WarmOptions,
    WarmTransfer,
    briefing,
    caller_side,
)
from rtp.playout import OutboundFrame
from sip.leg import (
    CallEnded,
    CallLeg,
    DtmfReceived,
    FrameReceived,
    LegEvent,
    MediaStarted,
    TransferProgress,
    offers_frame_sink,
    offers_replaces,
)

log = logging.getLogger("parlora")

BRIEF_NOW = "Your colleague has answered: greet them and brief them now."
RELAY_EPOCH = 1 << 40  # relayed frames: above every epoch a session's barrier could have cleared
RELAY_ITEM = "relay"
MUSIC_ITEM = "hold-music"
MUSIC_LEAD = 3  # frames of hold music waiting in the caller's playout at most


class Briefing(Protocol):
    """The second session on the target's leg (a `CallSession`)."""

    async def run(self) -> Any: ...

    def push_update(self, text: str, *, speak: bool = True) -> bool: ...


@dataclass(frozen=True, slots=True)
class WarmDeps:
    """What the server gives a session for warm transfers: the engine's dial and the briefing session's
    factory (the route's provider, with the briefing as its instructions)."""

    dial: Callable[[str, float], Awaitable[CallLeg]]
    briefing: Callable[[CallLeg, str], Briefing]
    hold_music: bytes = b""  # PCM16 8 kHz, looped to the waiting caller (empty: silence)


@dataclass(frozen=True, slots=True)
class TargetEvent:
    """An event of the transfer's target leg, through the caller session's inbox (its one loop)."""

    event: WarmEvent


class _TeeLeg:
    """The target's leg as the briefing session sees it: every event it reads is told to the transfer first."""

    def __init__(self, leg: CallLeg, tell: Callable[[LegEvent], None]) -> None:
        self._leg, self._tell = leg, tell

    def __getattr__(self, name: str) -> Any:
        return getattr(self._leg, name)

    async def events(self) -> AsyncIterator[LegEvent]:
        async for event in self._leg.events():
            self._tell(event)
            yield event


class WarmShell:
    """One warm transfer of one call: the core, the target leg, the briefing session, the relay."""

    def __init__(
        self,
        transfer: WarmTransfer,
        deps: WarmDeps,
        *,
        call_id: str,
        caller: CallLeg,
        inbox: asyncio.Queue[object],
        spawn: Callable[[str, Any], None],
        cancel: Callable[[str], None],
    ) -> None:
        self.transfer = transfer
        self._deps, self._call_id, self._caller = deps, call_id, caller
        self._inbox, self._spawn, self._cancel = inbox, spawn, cancel
        self.target: CallLeg | None = None
        self._briefing: Briefing | None = None
        self.result: asyncio.Future[TransferResult] = asyncio.get_running_loop().create_future()
        self.joined = False  # relaying
        self.refer_to = ""  # the REFER with Replaces sent to the caller, if any
        self._pumping = False  # the target's leg is read by `_pump`
        self._answered = False
        self.relayed = [0, 0]  # frames relayed: to the target, to the caller

    # --- events of the target leg, into the caller session's inbox ---
    def _leg_event(self, event: LegEvent) -> None:
        warm: WarmEvent | None = None
        if isinstance(event, MediaStarted) and not self._answered:
            self._answered = True
            target = self.target
            refer_to = target.replaces_refer_to() if target is not None and offers_replaces(target) else ""
            warm = TargetProgress(200, refer_to=refer_to)
        elif isinstance(event, DtmfReceived):
            warm = TargetDigit(event.digit)
        elif isinstance(event, CallEnded):
            warm = TargetHungUp() if self._answered else TargetProgress(event.status_code, event.reason)
        if warm is not None:
            self._inbox.put_nowait(TargetEvent(warm))

    def relay_to_caller(self, frame: FrameReceived) -> None:
        """The target's frame to the caller (the target leg's frame sink, or its events, once joined)."""
        self.relayed[1] += 1
        self._caller.enqueue([OutboundFrame(frame.pcm, RELAY_EPOCH, RELAY_ITEM, 0)])

    def relay_to_target(self, pcm: bytes, now: int) -> None:
        """The caller's frame to the target (the caller session's frame path, once joined)."""
        if (target := self.target) is not None:
            self.relayed[0] += 1
            target.enqueue([OutboundFrame(pcm, RELAY_EPOCH, RELAY_ITEM, 0)])

    # --- the actions ---
    def act(self, core: Any, actions: list[WarmAction], now: int) -> None:
        """Carry out the transfer's actions: the caller's side on the session core, the rest on the legs."""
        for action in caller_side(core, actions, now):
            log.info("call %s warm transfer: %s", self._call_id, action)
            if self.joined and isinstance(action, (HangUpCaller, DropTarget)):
                to_target, to_caller = self.relayed
                log.info(
                    "call %s warm transfer relay ended: %d frames to the target, %d to the caller",
                    self._call_id,
                    to_target,
                    to_caller,
                )
            if isinstance(action, HoldCaller) and self._deps.hold_music:
                self._spawn("warm-music", self._music(self._deps.hold_music))
            elif isinstance(action, (ReleaseCaller, JoinLegs, Outcome)):
                self._cancel("warm-music")
            if isinstance(action, DialTarget):
                self._spawn("warm-dial", self._dial(action.target, action.ring_timeout_ms / 1000))
            elif isinstance(action, SendTargetDigits) and self.target is not None:
                self.target.send_dtmf(action.digits)
            elif isinstance(action, BriefTarget) and self._briefing is not None:
                self._briefing.push_update(BRIEF_NOW, speak=True)
            elif isinstance(action, DropTarget):
                self._drop(action.reason)
            elif isinstance(action, ReferCaller):
                self._refer(action.refer_to)
            elif isinstance(action, JoinLegs):
                self._join()
            elif isinstance(action, HangUpCaller):
                self._caller.hangup(action.reason[:100])
            elif isinstance(action, Outcome) and not self.result.done():
                self.result.set_result(action.result)

    def handle(self, core: Any, event: WarmEvent, now: int) -> None:
        self.act(core, self.transfer.handle(event, now), now)

    def caller_gone(self, core: Any, now: int) -> None:
        self.handle(core, CallerHungUp(), now)

    async def _music(self, music: bytes) -> None:
        """Hold music to the caller's leg, looped, paced by the carrier: at most `MUSIC_LEAD` frames wait in its
        playout (what is left of them when the caller is released plays before the model: 60 ms at most)."""
        frames = [music[at : at + 320].ljust(320, b"\0") for at in range(0, len(music), 320)]
        played = 0
        while True:
            while self._caller.depth < MUSIC_LEAD:
                frame = OutboundFrame(frames[played % len(frames)], RELAY_EPOCH, MUSIC_ITEM, 0)
                self._caller.enqueue([frame])
                played += 1
            await asyncio.sleep(0.02)

    async def _dial(self, target: str, ring_timeout_s: float) -> None:
        try:
            leg = await self._deps.dial(target, ring_timeout_s)
        except Exception as exc:  # a bad target, no port, a draining engine: the transfer fails, typed
            self._inbox.put_nowait(TargetEvent(TargetProgress(0, f"the dial failed: {exc}")))
            return
        self.target = leg
        if not self.transfer.active:  # undone while the dial was being placed
            leg.hangup("transfer undone")
            return
        self._briefing = self._deps.briefing(_TeeLeg(leg, self._leg_event), self.transfer.brief_text)
        self._spawn("warm-briefing", self._brief(self._briefing))

    async def _brief(self, briefing: Briefing) -> None:
        await briefing.run()

    def _drop(self, reason: str) -> None:
        self._cancel("warm-dial")
        if self.target is not None:
            self.target.hangup(reason[:100])

    def _refer(self, refer_to: str) -> None:
        """The AI leaves the target's leg (the briefing session stops; its leg stays up, read for its end) and the
        caller is sent the REFER with Replaces; a REFER the leg cannot send is a failed one (the relay then)."""
        self._cancel("warm-briefing")
        self.refer_to = refer_to
        if (target := self.target) is not None and not self._pumping:
            self._pumping = True
            self._spawn("warm-target", self._pump(target))
        try:
            self._caller.transfer(refer_to)
        except ValueError as exc:
            self._inbox.put_nowait(TargetEvent(ReferProgress(500, f"REFER not sent: {exc}", True)))

    def _join(self) -> None:
        """The AI leaves the target's leg (the briefing session stops; its leg stays up) and the relay starts."""
        self.joined = True
        self._cancel("warm-briefing")
        target = self.target
        if target is None:
            return
        if not self._pumping:
            self._pumping = True
            self._spawn("warm-target", self._pump(target))
        if offers_frame_sink(target):
            target.set_frame_sink(self.relay_to_caller)

    async def _pump(self, target: CallLeg) -> None:
        async for event in target.events():
            if isinstance(event, FrameReceived):
                if self.joined:  # (joining by Replaces: the caller hears the hold music, not the target)
                    self.relay_to_caller(event)
            elif isinstance(event, CallEnded):
                self._inbox.put_nowait(TargetEvent(TargetHungUp()))
                return


@dataclass(frozen=True, slots=True)
class WarmDue:
    """The transfer's deadline (the ring timeout, the human's decision) is due: through the inbox."""


class WarmSeat:
    """A session's place for warm transfers: one at a time (`TransferInProgress`), the call's last utterances
    for the summary briefing, the relay once joined. `CallSession` routes to it."""

    def __init__(
        self,
        deps: WarmDeps | None,
        options: WarmOptions | None,
        *,
        call_id: str,
        caller: CallLeg,
        inbox: asyncio.Queue[object],
        spawn: Callable[[str, Any], None],
        cancel: Callable[[str], None],
        clock: Callable[[], int],
        tell: Callable[[object], None],
    ) -> None:
        self._deps, self._options = deps, options or WarmOptions()
        self._tell = tell  # the outcome, to the log and the call's record
        self._call_id, self._caller, self._inbox = call_id, caller, inbox
        self._spawn, self._cancel, self._clock = spawn, cancel, clock
        self.said: deque[tuple[str, str]] = deque(maxlen=24)  # (role, text) of the final transcripts
        self.shell: WarmShell | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def relaying(self) -> bool:
        """Joined: the session runs on, relaying, until either leg ends."""
        return self.shell is not None and self.shell.joined

    @property
    def joined(self) -> bool:
        """Joined either way (relaying, or replaced by the caller's side): the AI leaves."""
        return self.shell is not None and self.shell.transfer.join != ""

    @property
    def lingering(self) -> bool:
        """Joined by Replaces, the target's replaced leg not ended yet: the session runs on for the core's
        bounded wait."""
        return self.shell is not None and self.shell.transfer.lingering

    def refer_progress(self, core: Any, progress: TransferProgress, now: int) -> bool:
        """A report on the caller's leg's REFER: the warm join's (told to its core: True) or not (False)."""
        shell = self.shell
        if shell is None or not shell.refer_to or progress.target != shell.refer_to:
            return False
        event = ReferProgress(progress.status_code, progress.reason, progress.final)
        self._act(core, shell.transfer.handle(event, now), now)
        return True

    def heard(self, notice: object) -> None:
        if isinstance(notice, Transcript) and notice.final and notice.text:
            self.said.append((notice.role, notice.text))

    def start(
        self, core: Any, target: str, brief: str | None, digits: str = "", *, model: bool = False
    ) -> asyncio.Future[TransferResult]:
        """Start a warm transfer (the application's, or the model's `transfer_call` with mode warm: `model`).
        The application's: TransferInProgress while one awaits its outcome, ValueError when this session
        cannot place calls or is not up; nothing is sent then."""
        over = core is not None and (core.ending.ended or core.ending.leg_ended)  # S6: nothing dialled then
        if not model:
            if core is not None and core.telephony.transferring:
                raise TransferInProgress(f"call {self._call_id}: a transfer is already in progress")
            if self._deps is None or core is None or over:
                raise ValueError(
                    f"call {self._call_id}: a warm transfer needs a live call on an engine that dials"
                )
            core.telephony.application_transfer()
        now = self._clock()
        replaces = offers_replaces(self._caller) and self._caller.accepts_replaces()
        transfer = WarmTransfer(
            target, briefing(brief, list(self.said)), now, self._options, digits, caller_replaces=replaces
        )
        deps = self._deps
        if (
            deps is None or over
        ):  # the model's, on an engine that cannot dial or a call that is over: told now
            shell_result: asyncio.Future[TransferResult] = asyncio.get_running_loop().create_future()
            why = "the call is over" if over else "this bridge cannot place calls"
            core.transfer_progress(0, why, True, now, FAILED)
            return shell_result
        self.shell = WarmShell(
            transfer,
            deps,
            call_id=self._call_id,
            caller=self._caller,
            inbox=self._inbox,
            spawn=self._spawn,
            cancel=self._cancel,
        )
        self._act(core, transfer.start(), now)
        return self.shell.result

    def model(self, core: Any, command: WarmTransferCall) -> None:
        self.start(core, command.target, command.brief, model=True)
        self._inbox.put_nowait(WarmDue())  # (a wake: the core's new commands are carried out by the loop)

    def relay_to_target(self, pcm: bytes, now: int) -> None:
        if self.shell is not None:
            self.shell.relay_to_target(pcm, now)

    def handle(self, core: Any, item: object, now: int) -> None:
        """A `TargetEvent` or `WarmDue` from the inbox."""
        shell = self.shell
        if shell is None:
            return
        if isinstance(item, TargetEvent):
            self._act(core, shell.transfer.handle(item.event, now), now)
        else:
            self._act(core, shell.transfer.handle_timer(now), now)

    def caller_gone(self, core: Any, now: int) -> None:
        if self.shell is not None:
            self._act(core, self.shell.transfer.handle(CallerHungUp(), now), now)

    def session_ended(self, core: Any, reason: str, now: int) -> None:
        if self.shell is not None and self.shell.transfer.active:
            self._act(core, self.shell.transfer.handle(SessionEnded(reason), now), now)

    def _act(self, core: Any, actions: list[WarmAction], now: int) -> None:
        shell = self.shell
        assert shell is not None
        shell.act(core, actions, now)
        for action in actions:
            if isinstance(action, Outcome):
                self._tell(action.result)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if (due := shell.transfer.next_deadline()) is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0, due - now) / 1e9, self._inbox.put_nowait, WarmDue())
