"""One call's session shell: the call leg and its provider connections around a `SessionCoordinator`.

The shell only moves things, on its one injected clock: caller frames, provider events and the answers of the
application's hooks go into the coordinator with `now`; the commands it pulls go to the provider, the leg or
the application; its notices go to the log (bridge/server/log.py); its one timer is re-armed after every input. Every
rule — the goodbye before a BYE, the close and drain windows — is a deadline of the core, never a sleep here.

The call rings (180) while the provider session starts and is answered (200) once it has; a provider that
cannot be reached gets the caller a 503 instead of a silent call. The session ends when either side does: a
caller BYE closes the provider session (waiting briefly for its final usage); a provider close or a fatal
protocol error hangs up the call with the reason logged.

The leg's media events go to the core (S7, bridge/engine/coordinator.py): MediaHeld and MediaResumed put the call on
hold and take it off; a call the bridge placed (`sip.leg.DialledLeg`, declared `LegFeatures.dialled`) rings
until its MediaStarted.

Answering-machine detection (`CallSession(amd=AmdPlan(...))`, outbound calls only: bridge/engine/amd.py): the
detector is armed at the callee's answer (MediaStarted, never at early media), hears the callee's frames and
runs its deadlines on a timer of its own; the coordinator is told of the answer only when the action chosen
after the verdict starts (`AmdChoice`, `carry_out`), so the model's first words (the greeting, the first
response) stay held until then. The action: `talk` (the model is released, the plan's greeting asked for),
`message` (the plan's recording played, or the model released with the message to say, then BYE) or
`hang_up` (BYE; the model never released). A person, silence and unknown get `talk` at the verdict; a mailbox
(`machine`, `beep`) its route's choice, `talk` and `message` at its beep (or when none came: `AmdNoBeep`), so
the message is left after the tone. The application's answer to the verdict (`amd_hook`, a task) may choose
another action within `AmdPolicy.decide_ms`. Each event and the action go to the notice sink (the call record,
the CDR, the application's events). Frames of an inbound call, or after the detector is done, cost one flag
test (`CallerFrames.amd is None`).

The callee's audio before the action starts is withheld from the model, not sent with its answer held: the
coordinator's line still rings (bridge/engine/reservoir.py `Line`: nothing is forwarded while it rings), so a
mailbox's greeting is never heard, transcribed or answered by the model (a model that heard "leave a message
after the tone" would answer it, and its answer would be spoken into the recording, or cleared, costing a
response and its audio), a person's "hello?" costs nothing, and nothing is billed as input audio before the
call is known to need the model. The greeting the model is asked for covers what it missed ("hello?" is not
content). After a `hang_up` or a recorded message the model hears nothing at all.

Early media on a call the bridge placed (bridge/engine/early_media.py): from the leg's `EarlyMediaStarted` until
its `MediaStarted` (the answer) or `CallEnded`, the far end's frames go to the recording and to the detector
(evidence; its timers start at the answer), and to the provider only when the route asks
(`CallSession(early_media_to_provider=True)`: `SessionCoordinator.early_media_frame`, never the caller's turn
path): one attribute test a frame (`CallerFrames.early`). Its start and end are `EarlyMedia` notices; a call
that failed after it says so in its end reason.

The recording and the payment-card mode (the application's `LiveCall` calls, or the model's tools
`pause_recording`, `resume_recording`, `collect_card`: bridge/engine/telephony.py): `pause_recording` and
`resume_recording` hold the recording (bridge/server/recording.py: a gap of silence; a pause while paused changes
nothing and says so), each change a `RecordingChanged` notice for the record. `collect_card` runs one
`CardCollector` (bridge/engine/card.py): from its start the caller's frames are withheld from the coordinator
(`CallerFrames.card`: one attribute test a frame), the recording is paused, and every key the caller presses goes
to the collector alone — not to the `dtmf` handler, the coordinator (`dtmf_to_model`) or a log line. Its timer
is a `loop.call_at` of its own (a `_CardDue` in the inbox). At its end (collected, a timeout, invalid, cancelled,
the caller gone) the frames flow again, the recording resumes, the withheld stretch is one input
`audio_discontinuity` (`card_collection`), the record gets a `CardEnded` (the outcome: no digit, no count), the
model (when it asked) gets the outcome only, and the application the `CardResult` (the awaiting `collect_card`
call, or `card_handler` for a collection the model started).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from bridge.engine import commands as cmd
from bridge.engine.amd import (
    AmdAction,
    AmdChoice,
    AmdEvent,
    AmdOptions,
    AmdPlan,
    AmdStart,
    AmdTarget,
    AmdVerdict,
    AnsweringMachineDetector,
    carry_out,
)
from bridge.engine.barrier import Channel
from bridge.engine.card import CardCollector, CardOptions, CardOutcome, CardResult, model_answer
from bridge.engine.coordinator import CoordinatorOptions, SessionCoordinator
from bridge.engine.delegations import DeliverResult, DispatchJob, JobRequest, SendContext
from bridge.engine.early_media import EarlyMedia, EarlyMediaWindow
from bridge.engine.recovery import seeded_settings
from bridge.engine.telephony import TelephonyOptions, TransferInProgress
from bridge.engine.warm_transfer import TransferResult
from bridge.server.log import log_notice
from bridge.server.records import RecordingChanged
from bridge.server.warm import TargetEvent, WarmDeps, WarmDue, WarmSeat
from providers.base import DeliversEvents, Provider, ProviderUnavailable, ResumptionRejected, SessionSettings
from providers.events import ProviderEvent, SessionStarted, bounded
from rtp.resample import WIDE_FRAME_BYTES, NarrowView
from sip.leg import (
    CallEnded,
    CallLeg,
    DtmfReceived,
    EarlyMediaStarted,
    FrameReceived,
    MediaHeld,
    MediaResumed,
    MediaStarted,
    TransferProgress,
    offers_dialled,
    offers_frame_sink,
    offers_sip_headers,
)

log = logging.getLogger("parlora.session")

_LEG_DRAIN_TIMEOUT_S = 5.0  # before the session starts: how long a refused call waits for the leg to end
_HOOK_TIMEOUT_S = 10.0
MAX_QUEUED_FRAMES = 25  # 500 ms of caller audio waiting for a session loop that is behind, then shed
BACKSTOP_NS = 100_000_000  # while frames come, the timer waits this long after the latest one (CallerFrames)
TIMER_SLACK_NS = 1_000_000  # the timer is armed this long after its deadline (uvloop: whole milliseconds)
_LOGGED_URI_CHARS = 256  # a From/To URI as the log shows it: the caller chooses its length


def failure_tone() -> bytes:
    """The default closing message when a session fails: three short beeps (8 kHz PCM16)."""
    import numpy as np

    t = np.arange(1600) / 8000  # 200 ms
    beep = (6000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
    return (beep + bytes(1600)) * 3


JobHandler = Callable[[JobRequest], Awaitable[str]]
"""The application's answer to a tool call or delegation: the output text (JSON or plain) for the model."""

ApproveHook = Callable[[str], Awaitable[bool]]
"""Called with the rollover id before a rollover opens the next connection; False or an exception refuses."""

AuthorizeHook = Callable[[str], Awaitable[bool]]
"""`connection_hooks.authorize`: called with a connection id ("<call id>/conn-N") before every connection is
opened — the first, rollovers and recovery replacements (RO7). False refuses that connection."""

DtmfHandler = Callable[[str], Awaitable[None]]

CardHandler = Callable[[CardResult], Awaitable[None]]
"""The application's `card_collected`: the result of a collection the model started (the digits are in it)."""

AmdHook = Callable[[AmdVerdict, AmdAction], Awaitable[str | None]]
"""The application's answer to an AMD verdict, given the route's action for it: "talk", "message", "hang_up",
or None for the route's (bridge/engine/amd.py `AmdChoice`; waited for at most `AmdPolicy.decide_ms`)."""

Spawn = Callable[[str, Coroutine[Any, Any, None]], None]
"""Run a coroutine as one of the session's named tasks (cancelled when the session ends)."""


class MediaTap(Protocol):
    """`--record` (bridge/server/recording.py `CallRecording`): sees the caller's frames and the channel the core
    plays to. Per frame it may only keep a reference; everything else happens off the media path."""

    def channel(self, leg: Channel, start_ns: int) -> Channel: ...

    def caller(self, pcm: bytes, now: int) -> None: ...


@runtime_checkable
class PausableTap(Protocol):
    """A tap that can pause (bridge/server/recording.py `CallRecording`)."""

    @property
    def paused(self) -> bool: ...

    def pause(self, now: int, by: str, *, card: bool = False) -> bool: ...

    def resume(self, now: int, *, card: bool = False) -> bool: ...


async def _allow(_: str) -> bool:
    return True


# --- what the shell's tasks report into the inbox ---


@dataclass(frozen=True, slots=True)
class _ConnectFailed:
    token: int
    reason: str
    rollover: bool  # a rollover's next connection (else a recovery replacement)
    resumption: bool = False  # the provider refused the resumption handle

    def report(self, core: SessionCoordinator, now: int) -> None:
        if self.resumption:
            core.resumption_rejected(self.token, now)
        elif self.rollover:
            core.rollover_failed(self.token, self.reason, now)
        else:
            core.replacement_failed(self.token, self.reason, now)


@dataclass(frozen=True, slots=True)
class _JobAnswered:
    job_id: str
    output: str


@dataclass(frozen=True, slots=True)
class _Approved:
    rollover_id: str
    approved: bool | None
    error: str | None


@dataclass(frozen=True, slots=True)
class _Authorized:
    connection_id: str
    ok: bool


class _Wake:
    """Something outside the loop changed the coordinator (an application push): carry out its commands."""


class CallerFrames:
    """The caller's frames from the leg's media tick straight into the coordinator, its commands
    carried out there and then (`sip.leg.FrameSinkLeg`), instead of the leg's queue, a pump task and the inbox;
    and the session's one loop timer.

    Order: a frame goes through the inbox like any input while the inbox holds anything (a CallEnded, a hold,
    a provider event); the leg queues it itself while one of its own events waits. A timer of the core that
    is due when a frame comes is handled first, there and then, as the loop would have. Nothing raises into
    the media tick: a failure is counted (`errors`) and logged once.

    The timer: one `loop.call_at` per session, re-armed only when the core's next deadline comes
    sooner than the one it waits for. Its callback reads the core's deadline again and wakes the session's
    loop (`_Wake`) only when something is due; otherwise it re-arms, at the deadline, or, while the media tick
    brings frames (which handle whatever falls due), `BACKSTOP_NS` after the latest frame. The deadline the
    cushion keeps while output plays moves with every frame: waiting on it with `asyncio.timeout` woke the
    session's task 13 times a second per call for nothing (a task step, an exception, a future each time).

    Overload sheds, it does not grow: while the session's loop is behind, at most `MAX_QUEUED_FRAMES` of the
    caller's frames wait in the inbox; a frame beyond that is dropped and counted (`shed`), so the audio the
    provider hears lags the caller by a bounded amount instead of by however far the process fell behind.

    A provider's events come the same way (`provider_event`, from its socket's callback: providers.base
    DeliversEvents), by the same rule, except that a `SessionStarted` always goes through the inbox (the loop
    reads its expiry), and an event after which the core is finished wakes the loop. They are never shed."""

    __slots__ = (
        "_call_id",
        "_inbox",
        "_clock",
        "_tap",
        "_carry_out",
        "_loop",
        "links",
        "_handle",
        "_handle_at",
        "amd",
        "card",
        "core",
        "due",
        "early",
        "frame_ns",
        "errors",
        "queued",
        "shed",
        "timer_wakeups",
    )

    def __init__(
        self,
        call_id: str,
        inbox: asyncio.Queue[object],
        clock: Callable[[], int],
        tap: MediaTap | None,
        carry_out: Callable[[SessionCoordinator], None],
    ) -> None:
        self._call_id, self._inbox, self._clock, self._tap = call_id, inbox, clock, tap
        self._carry_out = carry_out
        self.links: ProviderLinks | None = None  # whose frames waiting for a pair end with each frame
        self._loop: asyncio.AbstractEventLoop | None = None  # the session's, taken at the first arm
        self._handle: asyncio.TimerHandle | None = None
        self._handle_at = 0  # the deadline the timer is armed for (on the injected clock)
        self.core: SessionCoordinator | None = None  # set while the session's loop runs
        self.amd: AmdGate | None = None  # an outbound call's machine detection, until it is done
        self.card: CardCollector | None = None  # a payment-card collection: frames withheld from the provider
        # while early media flows (bridge/engine/early_media.py): where its frames go instead of the coordinator's
        # caller path (nowhere, or the provider when the route asks)
        self.early: Callable[[bytes, int], None] | None = None
        self.due: int | None = None  # the core's next deadline as last read (None: none)
        self.frame_ns: int | None = None  # the latest frame through the sink: the media tick is running
        self.errors = 0
        self.queued = 0  # caller frames this sink put in the inbox, not yet fed
        self.shed = 0
        self.timer_wakeups = 0  # timer callbacks (each a re-arm, or a wake of the loop when something is due)

    def attach(self, leg: CallLeg, core: SessionCoordinator) -> None:
        self.core = core
        if offers_frame_sink(leg):
            leg.set_frame_sink(self)

    def detach(self, leg: CallLeg) -> None:
        self.core = None
        self.cancel()
        if offers_frame_sink(leg):
            leg.set_frame_sink(None)

    def feed(self, core: SessionCoordinator, frame: FrameReceived, now: int) -> None:
        """A caller frame from the inbox (queued here, or by the leg's own queue and pump), its commands
        carried out there and then, as the sink does."""
        if self.queued:
            self.queued -= 1
        self._forward(core, frame, now)
        self._carry_out(core)
        if (links := self.links) is not None and (links.held or links.waiting):
            links.frame_end()

    def counters(self) -> dict[str, int]:
        return {"queued": self.queued, "shed": self.shed, "errors": self.errors}

    # -- the timer ---------------------------------------------------------------------------------------------

    def settled(self, core: SessionCoordinator, now: int) -> None:
        """After an input: read the core's next deadline and keep the timer at or before it, or, while the media
        tick brings frames (each handles what is due), at or before `BACKSTOP_NS` after the latest one."""
        self._keep(core.next_deadline(), now)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _keep(self, due: int | None, now: int) -> None:
        self.due = due
        if due is None:
            return
        frame = self.frame_ns
        if frame is not None and now - frame < BACKSTOP_NS and due < frame + BACKSTOP_NS:
            due = frame + BACKSTOP_NS
        if self._handle is not None:
            if self._handle_at <= due:
                return
            self._handle.cancel()
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self._handle_at = due
        # (+ the slack: uvloop's timers count whole milliseconds and would fire up to 1 ms early, then spin)
        self._handle = loop.call_at(loop.time() + (due - now + TIMER_SLACK_NS) / 1e9, self._fired)

    def _fired(self) -> None:
        self._handle = None
        self.timer_wakeups += 1
        core = self.core
        if core is None:
            return
        now = self._clock()
        due = core.next_deadline()
        if (due is not None and due <= now) or core.finished(now):
            self.due = due
            self._inbox.put_nowait(_Wake())  # the loop handles the timer (and anything queued behind it)
        else:
            self._keep(due, now)

    # -- inputs --------------------------------------------------------------------------------------------------

    def _forward(self, core: SessionCoordinator, frame: FrameReceived, now: int) -> None:
        if self._tap is not None:
            self._tap.caller(frame.pcm, now)  # --record
        if self.amd is not None:
            self.amd.frame(frame.pcm, now)
        if self.early is not None:  # early media: the recording and the detector's evidence, not the caller's
            self.early(frame.pcm, now)
            return
        if self.card is not None:  # counted for one input discontinuity at its end (bridge/engine/card.py)
            self.card.withheld += 1
            core.frames_in += 1
            return
        core.caller_frame(frame.pcm, now)

    def key(self, core: SessionCoordinator, digit: str, now: int) -> CardResult | None:
        """A key the caller pressed: a card collection's alone while one runs (its result when the key ended
        it), else the coordinator's (`dtmf_to_model`)."""
        if (card := self.card) is not None:
            return card.digit(digit, now, core.timeline.ms(now))
        core.caller_pressed(digit, now)
        return None

    def provider_event(self, event: ProviderEvent) -> None:
        inbox, core = self._inbox, self.core
        if core is None or inbox.qsize() or isinstance(event, SessionStarted):
            inbox.put_nowait(event)
            return
        try:
            now = self._clock()
            due = self.due
            if due is not None and due <= now:  # a due timer first, as the loop would
                core.handle_timer(now)
            core.provider_event(event, now)
            self._carry_out(core)
            if core.finished(now):
                inbox.put_nowait(_Wake())
            else:
                self.settled(core, now)
        except Exception:  # never into the socket's callback
            self.errors += 1
            if self.errors == 1:
                log.exception(
                    "call %s: a provider event failed in the sink (counted from now on)", self._call_id
                )

    def __call__(self, frame: FrameReceived) -> None:
        inbox, core = self._inbox, self.core
        if core is None or inbox.qsize():
            if self.queued >= MAX_QUEUED_FRAMES:  # the loop is behind by that much already: shed this one
                self.shed += 1
                if self.shed == 1:
                    log.warning("call %s: the session is behind; caller frames shed (counted)", self._call_id)
                return
            self.queued += 1
            inbox.put_nowait(frame)  # behind what is queued
            return
        try:
            now = self.frame_ns = self._clock()
            due = self.due
            if due is not None and due <= now:  # a due timer first, as the loop would
                core.handle_timer(now)
            self._forward(core, frame, now)
            self._carry_out(core)
            if (links := self.links) is not None and (links.held or links.waiting):
                links.frame_end()  # (ProviderLinks: a frame waits for its pair one frame at most)
            if core.finished(now):
                inbox.put_nowait(_Wake())
            else:
                self.settled(core, now)
        except Exception:  # never into the media tick
            self.errors += 1
            if self.errors == 1:
                log.exception(
                    "call %s: a caller frame failed in the frame sink (counted from now on)", self._call_id
                )


_HANDED: set[asyncio.Task[None]] = set()  # card results being handed to the application (kept until done)


class _CardDue:
    """The card collection's deadline has come (its timer, through the inbox)."""


class _AmdDue:
    """The machine detector's deadline has come (its timer, through the inbox)."""


@dataclass(frozen=True, slots=True)
class _AmdAnswer:
    """The application's answer to the verdict (an action, or None: the route's)."""

    action: str | None


class AmdGate:
    """An outbound call's machine detection: the detector, the choice after its verdict (bridge/engine/amd.py
    `AmdChoice`), their timer and the action carried out on the core (`carry_out`: module docstring). Sans-I/O
    but for the timer, which puts an `_AmdDue` in the session's inbox, and the application's answer (`ask`: a
    task whose answer comes back as an `_AmdAnswer`; None: the route's choice at once)."""

    __slots__ = (
        "detector",
        "choice",
        "plan",
        "events",
        "_inbox",
        "_clock",
        "_core",
        "_handle",
        "_report",
        "_ask",
        "_narrow",
    )

    def __init__(
        self,
        plan: AmdPlan,
        inbox: asyncio.Queue[object],
        clock: Callable[[], int],
        core: AmdTarget,
        report: Callable[[AmdEvent | AmdStart], None],
        ask: Callable[[AmdVerdict, AmdAction], None] | None = None,
    ) -> None:
        self.plan = plan
        self.detector = AnsweringMachineDetector(plan.options)
        self.choice = AmdChoice(plan.policy, can_message=plan.can_message)
        self.events: list[AmdEvent] = []
        self._inbox, self._clock, self._core, self._report, self._ask = inbox, clock, core, report, ask
        self._handle: asyncio.TimerHandle | None = None
        self._narrow = NarrowView()  # the detector's 8 kHz view of a 16 kHz (G.722) leg's frames

    @property
    def released(self) -> bool:
        """The action has started (the model released, or the call being ended)."""
        return self.choice.started is not None

    def answered(self, now: int) -> None:
        self.detector.answered(now)
        self._arm(now)

    def frame(self, pcm: bytes, now: int) -> None:
        if (event := self.detector.frame(self._narrow(pcm), now)) is not None:
            self._event(event, now)

    def due(self) -> None:
        now = self._clock()
        if (event := self.detector.handle_timer(now)) is not None:
            self._event(event, now)
        elif (start := self.choice.handle_timer(now)) is not None:
            self._start(start, now)
        self._arm(now)

    def application_answered(self, action: str | None) -> None:
        now, late = self._clock(), self.choice.late
        if (start := self.choice.answer(action, now)) is not None:
            self._start(start, now)
        if self.choice.late > late:
            log.info("AMD: the application's answer %r came after the choice was made: ignored", action)
        self._arm(now)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _event(self, event: AmdEvent, now: int) -> None:
        self.events.append(event)
        self._report(event)
        start = self.choice.event(event, now)
        if isinstance(event, AmdVerdict):
            if self._ask is not None:  # (asked even when it is not waited for: it is told the verdict)
                self._ask(event, self.choice.default(event.kind))
            elif self.choice.chosen is None:
                start = self.choice.answer(None, now)  # nobody to ask: the route's choice at once
        if start is not None:
            self._start(start, now)
        self._arm(now)

    def _start(self, start: AmdStart, now: int) -> None:
        self._report(start)
        carry_out(self._core, start, self.plan, now)

    def _arm(self, now: int) -> None:
        self.cancel()
        due = _soonest(self.detector.next_deadline(), self.choice.next_deadline())
        if due is None:
            return
        loop = asyncio.get_running_loop()
        inbox = self._inbox
        self._handle = loop.call_at(
            loop.time() + (due - now + TIMER_SLACK_NS) / 1e9, lambda: inbox.put_nowait(_AmdDue())
        )


def _soonest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


class _Tasks(dict[str, "asyncio.Task[None]"]):
    """A session's own tasks by name (the pumps, jobs, hooks, closes). Bounded: a finished one is forgotten at
    once, its failure logged, so that a long call's thousands of jobs and rollovers do not pile up here."""

    def spawn(self, name: str, coro: Any, task_name: str) -> None:
        task = self[name] = asyncio.create_task(coro, name=task_name)
        task.add_done_callback(lambda done: self._finished(name, done))

    def _finished(self, name: str, task: asyncio.Task[None]) -> None:
        if self.get(name) is task:  # (not a later task under the same name)
            del self[name]
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("task %s failed: %s", task.get_name(), bounded(repr(exc)))


@dataclass(frozen=True, slots=True)
class CallSummary:
    """What the end-of-call log line says."""

    call_id: str
    duration_s: float
    frames_in: int
    frames_out: int
    ended_by: str  # "caller", "bridge" (its own policy too: no input, budget, limits) or "provider"
    reason: str
    usage_seconds: float | None

    def __str__(self) -> str:
        usage = "unknown" if self.usage_seconds is None else f"{self.usage_seconds:g} s"
        return (
            f"call {self.call_id} ended after {self.duration_s:.2f} s by {self.ended_by} ({self.reason}): "
            f"frames in {self.frames_in}, out {self.frames_out}, provider usage {usage}"
        )


class ApplicationHooks:
    """The application's side of one call: its job handler and its rollover and funding hooks, each run as a
    task whose answer goes back to the session's inbox. A failing or silent hook refuses; it never crashes
    the call."""

    def __init__(
        self,
        call_id: str,
        inbox: asyncio.Queue[object],
        *,
        job_handler: JobHandler | None,
        approve: ApproveHook | None,
        authorize: AuthorizeHook | None,
    ) -> None:
        self._call_id, self._inbox = call_id, inbox
        self._job_handler = job_handler
        self._approve = approve or _allow
        self._authorize = authorize or _allow

    async def authorized(self, connection_id: str) -> bool:
        """RO7: every connection is authorised by its id ("<call id>/conn-N") before it is opened."""
        key = f"{self._call_id}/{connection_id}"
        try:
            return bool(await asyncio.wait_for(self._authorize(key), _HOOK_TIMEOUT_S))
        except Exception as exc:  # a failing hook refuses, it never crashes the call
            log.warning("call %s authorize(%s) failed: %r", self._call_id, key, exc)
            return False

    async def ask_approval(self, rollover_id: str) -> None:
        try:
            approved: bool | None = bool(await self._approve(f"{self._call_id}/{rollover_id}"))
            error = None
        except Exception as exc:  # RO6: an exception is a refusal
            approved, error = False, repr(exc)
        self._inbox.put_nowait(_Approved(rollover_id, approved, error))

    async def ask_authorization(self, connection_id: str) -> None:
        self._inbox.put_nowait(_Authorized(connection_id, await self.authorized(connection_id)))

    async def run_job(self, request: JobRequest) -> None:
        """The application's handler runs once for this job; its answer comes back through the inbox."""
        if self._job_handler is None:
            output = '{"error": "no application handler is configured for tools"}'
        else:
            try:
                output = await self._job_handler(request)
            except Exception as exc:  # the application's failure is the model's answer, not the call's end
                log.warning(
                    "call %s %s (%s) failed in the application: %r",
                    self._call_id,
                    request.job_id,
                    request.name,
                    exc,
                )
                output = '{"error": "the application could not complete this request"}'
        self._inbox.put_nowait(_JobAnswered(request.job_id, output))

    def carriers(self, spawn: Spawn) -> dict[type, Callable[[Any], None]]:
        """The coordinator's commands that ask the application: each runs as a task of the session."""
        return {
            DispatchJob: lambda c: spawn(c.request.job_id, self.run_job(c.request)),
            cmd.ApproveRollover: lambda c: spawn(
                f"approve-{c.rollover_id}", self.ask_approval(c.rollover_id)
            ),
            cmd.AuthorizeConnection: lambda c: spawn(
                f"authorize-{c.connection_id}", self.ask_authorization(c.connection_id)
            ),
        }


class ProviderLinks:
    """The session's provider connections by transport token: opening a further one (HR5, RO8), closing one,
    and carrying the coordinator's provider commands to the connection each names. A connection that is gone
    takes no command: its commands are dropped here.

    Caller frames in pairs (`Capabilities.append_frames` 2: the protocol's appends take any length, and
    `--provider-append-ms` is 40, the default; providers/batching.py): the first frame of a pair
    waits (`held`, then `waiting` once its frame's commands are all carried out) and leaves joined with the
    next one, one `send_audio` (one encoding, one append, one WebSocket frame, one write) per 40 ms. No frame
    waits longer than one frame, whatever happens meanwhile:
    - the next caller frame does not reach that connection (hold or ringing, S7; a recovery's discarded frames,
      HR8; a rollover's old connection that stopped hearing, RO2; the session's end): the waiting frame goes
      alone once that frame's commands are carried out (`frame_end`), 20 ms late, as it would have paired;
    - any other command for that connection (a commit, RO2/RO5; a truncation, a cancel, context, a tool's
      result, a request to close) sends it first: a commit follows all of its audio, and the order of a
      connection's messages is the order the core gave them;
    - a payment-card collection starts (bridge/engine/card.py: caller audio withheld): it is dropped, never
      sent, and counted among the card's withheld frames (`drop_waiting`). It is the caller's audio just
      before the collection began, which may already carry the first key's in-band tone; the withheld stretch
      then reports it (S1), as it reports the frames after it;
    - its connection closes (a recovery's lost or replaced connection, a rollover's old one, the caller hung
      up): it is dropped with the connection. A lost connection loses what it was sent last anyway, and the
      frame was counted as fed before it was held (HR8 counts only the frames the core discards); after a
      hang-up nothing more goes to a provider (S6).
    A recovery's replacement and a rollover's next connection begin their own pairs at their first frame.
    A 16 kHz leg's frame (G.722, 640 bytes) goes as it is to a connection that takes 16 kHz
    (`Capabilities.wide_input`), with `wide=True`; the others get its 8 kHz view, one view per connection (its
    filter's history is that connection's stream). The rate is known here, from one frame's length, and is
    passed on: two 8 kHz frames joined are as long as one 16 kHz frame. A pair never mixes rates: a frame
    waiting across a re-offer that changed the rate goes alone.
    Measured (tests/bench/session_frame_micro.py, CPU per call and caller frame from the frame sink to the socket,
    loopback): GPT-Live 83 -> 67 µs, Realtime 70 -> 49, xAI 71 -> 52, Gemini (TLS, resampled) 220 -> 138."""

    def __init__(
        self,
        first: Provider,
        *,
        call_id: str,
        inbox: asyncio.Queue[object],
        hooks: ApplicationHooks,
        spawn: Spawn,
        cancel: Callable[[str], None],
        floor: Callable[[], int],
        reconnect: Callable[[int, SessionSettings], Provider] | None,
        settings: SessionSettings,
    ) -> None:
        self.first_token, self.name = first.token, first.name  # (not the connection: it goes when it closes)
        self.providers: dict[int, Provider] = {first.token: first}  # by transport token
        self._pairs: set[int] = set()  # the connections that take caller frames in pairs (class docstring)
        self._narrow: dict[int, NarrowView] = {}  # by token: an 8 kHz connection's view of 16 kHz frames
        self.held: dict[int, bytes] = {}  # by token: the first frame of a pair, in the frame under way
        self.waiting: dict[int, bytes] = {}  # ... from the frame before, waiting for its pair
        self._added(first)
        self._call_id, self._inbox, self._hooks = call_id, inbox, hooks
        self._spawn, self._cancel, self._floor = spawn, cancel, floor
        self._reconnect, self._settings = reconnect, settings
        # Each connection's open-to-session-confirmed seconds, by provider name (the server's metrics).
        self.on_connected: Callable[[str, float], None] | None = None
        self.sink: Callable[[ProviderEvent], None] | None = None  # CallerFrames.provider_event

    async def timed_connect(self, provider: Provider) -> SessionStarted:
        """`provider.connect()`, its duration (wall clock: a metric, never a rule) given to `on_connected`."""
        begun = time.monotonic()
        started = await provider.connect()
        if self.on_connected is not None:
            self.on_connected(provider.name, time.monotonic() - begun)
        return started

    def carriers(self) -> dict[type, Callable[[Any], None]]:
        return {
            cmd.SendAudio: self._send_audio,
            cmd.Truncate: lambda c: self._on(self._floor(), lambda p: p.truncate(c.item_id, c.audio_end_ms)),
            cmd.CancelResponse: lambda c: self._on(c.token, lambda p: p.cancel_response()),
            cmd.OpenReplacement: self.open,
            cmd.OpenRollover: self.open,
            cmd.CloseTransport: self.close,
            cmd.CommitInput: lambda c: self._on(c.token, lambda p: p.commit_input()),
            cmd.RequestClose: lambda c: self._on(c.token, lambda p: p.request_close()),
            DeliverResult: lambda c: self._on(
                c.token, lambda p: p.send_tool_result(c.call_id, c.name, c.output)
            ),
            SendContext: lambda c: self._on(c.token, lambda p: p.send_text(c.text, speak=c.speak)),
        }

    def _send_audio(self, command: cmd.SendAudio) -> None:  # every caller frame: no closure made
        token, pcm = command.token, command.pcm16_8k
        if (provider := self.providers.get(token)) is None:
            return
        if len(pcm) == WIDE_FRAME_BYTES and (view := self._narrow.get(token)) is not None:
            pcm = view(pcm)
        if token not in self._pairs:
            provider.send_audio(pcm, len(pcm) == WIDE_FRAME_BYTES)
        elif (first := self.waiting.pop(token, None)) is None:
            self.held[token] = pcm  # the first of a pair (class docstring)
        elif len(first) == len(pcm):
            provider.send_audio(first + pcm, len(pcm) == WIDE_FRAME_BYTES)
        else:  # the rate changed between the two (a re-offer): the waiting frame alone, this one waits
            provider.send_audio(first, len(first) == WIDE_FRAME_BYTES)
            self.held[token] = pcm

    def frame_end(self) -> None:
        """A caller frame's commands are carried out: a frame that waited through it without its pair goes
        alone; the ones this frame held wait for the next (class docstring). Called while either is held."""
        waiting, providers = self.waiting, self.providers
        for token, pcm in waiting.items():
            if (provider := providers.get(token)) is not None:
                provider.send_audio(pcm, len(pcm) == WIDE_FRAME_BYTES)
        waiting.clear()
        self.waiting, self.held = self.held, waiting

    def drop_waiting(self) -> int:
        """Caller audio is withheld from now on (a card collection): the frame waiting for its pair is dropped,
        not sent; 1 when one was (one caller frame, whichever connections it waited for), else 0."""
        dropped = 1 if self.waiting or self.held else 0
        self.waiting.clear()
        self.held.clear()
        return dropped

    def _added(self, provider: Provider) -> None:
        if provider.capabilities.append_frames == 2:
            self._pairs.add(provider.token)
        if not provider.capabilities.wide_input:
            self._narrow[provider.token] = NarrowView()

    def _flush(self, token: int, provider: Provider) -> None:
        """Before any other command for connection `token`: its frame that waits for a pair, alone."""
        first = self.waiting.pop(token, None)
        if first is None:
            first = self.held.pop(token, None)
        if first is not None:
            provider.send_audio(first, len(first) == WIDE_FRAME_BYTES)

    def _on(self, token: int, act: Callable[[Provider], None]) -> None:
        if (provider := self.providers.get(token)) is not None:
            if self.waiting or self.held:
                self._flush(token, provider)
            act(provider)

    def open(self, command: cmd.OpenReplacement | cmd.OpenRollover) -> None:
        """HR5/RO8: a passive further connection with a fresh handshake, seeded as the core says (HR7); it
        carries no caller audio until the core makes it a target."""
        rollover, token = isinstance(command, cmd.OpenRollover), command.token
        if self._reconnect is None:
            self._inbox.put_nowait(_ConnectFailed(token, "no way to open another connection", rollover))
            return
        self.close(cmd.CloseTransport(command.connection_id))  # (a reseeded retry replaces its first attempt)
        settings = seeded_settings(
            self._settings, command.snapshot, notice=not rollover, resume_handle=command.resume_handle
        )
        provider = self._reconnect(token, settings)
        self.providers[token] = provider
        self._added(provider)
        self._spawn(f"provider-{token}", self._connect(provider, rollover))

    async def _connect(self, provider: Provider, rollover: bool) -> None:
        """Open a further connection (a recovery replacement, or a rollover's next one, which was authorised
        before it was asked for) and feed its events to the inbox; a failure is reported."""
        token = provider.token
        try:
            if not rollover and not await self._hooks.authorized(f"conn-{token}"):
                raise ProviderUnavailable(f"connection {self._call_id}/conn-{token} not authorised")
            started = await self.timed_connect(provider)
        except ResumptionRejected as exc:
            self._inbox.put_nowait(_ConnectFailed(token, str(exc), rollover, resumption=True))
            return
        except ProviderUnavailable as exc:
            self._inbox.put_nowait(_ConnectFailed(token, str(exc), rollover))
            return
        self._inbox.put_nowait(started)
        await self.read(provider)

    async def read(self, provider: Provider) -> None:
        """A connection's events into the session: from its socket's callback where it can (no loop step),
        else through the inbox by a reader task."""
        if self.sink is not None and isinstance(provider, DeliversEvents):
            provider.deliver_to(self.sink)
        else:
            await _pump(provider.events(), self._inbox)

    def close(self, command: cmd.CloseTransport) -> None:
        token = command.token
        self._cancel(f"provider-{token}")
        self._pairs.discard(token)
        self._narrow.pop(token, None)
        self.held.pop(token, None)  # dropped with its connection (class docstring)
        self.waiting.pop(token, None)
        if (provider := self.providers.pop(token, None)) is not None:
            self._spawn(f"close-{token}-{id(provider)}", provider.close(timeout=1.0))

    async def close_all(self) -> None:
        self.held.clear()  # dropped with the connections (class docstring)
        self.waiting.clear()
        await asyncio.gather(*(p.close(timeout=1.0) for p in self.providers.values()), return_exceptions=True)


class CallSession:
    """Runs one call to completion. `run()` returns when the call leg has ended."""

    def __init__(
        self,
        leg: CallLeg,
        provider: Provider,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        options: CoordinatorOptions | None = None,
        reconnect: Callable[[int, SessionSettings], Provider] | None = None,
        settings: SessionSettings | None = None,
        failure_message: bytes | None = None,
        job_handler: JobHandler | None = None,
        approve: ApproveHook | None = None,
        authorize: AuthorizeHook | None = None,
        telephony_options: TelephonyOptions | None = None,
        dtmf_handler: DtmfHandler | None = None,
        notice_sink: Callable[[str, object], None] | None = None,
        media_tap: MediaTap | None = None,
        amd: AmdOptions | AmdPlan | None = None,
        amd_hook: AmdHook | None = None,
        early_media_to_provider: bool = False,
        card_handler: CardHandler | None = None,
        warm: WarmDeps | None = None,
    ) -> None:
        self.leg = leg
        self._card_handler = card_handler  # the application's `card_collected`
        self._card: CardCollector | None = None  # the collection under way
        self._card_job: str | None = None  # the model's collect_card job it answers
        self._card_waiters: list[asyncio.Future[CardResult]] = []
        self._card_timer: asyncio.TimerHandle | None = None
        # outbound calls only (an inbound call never runs AMD); options alone: the route's defaults
        self._amd_plan = AmdPlan(options=amd) if isinstance(amd, AmdOptions) else amd
        self._amd_hook = amd_hook  # the application's answer to the verdict (None: the route's choice)
        self._hangup_by = "provider"  # whom a HangUp of the core is put down to (AMD's own: the bridge)
        self._tap = media_tap  # --record
        self._settings = settings or SessionSettings()
        options = options or CoordinatorOptions()
        self._options = replace(
            options,
            telephony=telephony_options or options.telephony,
            closing_message=failure_message if failure_message is not None else failure_tone(),
        )
        self._dtmf_handler = dtmf_handler
        self._notice_sink = notice_sink  # e.g. the console feed (bridge/server/console.py ConsoleFeed.notice)
        self._tasks = _Tasks()
        self._clock = clock
        self.started_ns = clock()
        self.early_media = EarlyMediaWindow(self.started_ns, to_provider=early_media_to_provider)
        self.coordinator: SessionCoordinator | None = None
        self._inbox: asyncio.Queue[object] = asyncio.Queue()
        self._hooks = ApplicationHooks(
            leg.identity.call_id, self._inbox, job_handler=job_handler, approve=approve, authorize=authorize
        )
        self._ended: CallEnded | None = None
        self.answered_ns: int | None = None  # a placed call: when the callee answered (MediaStarted)
        self._frames = CallerFrames(leg.identity.call_id, self._inbox, clock, media_tap, self._carry_out)
        self._end_reason = ""
        self._ended_by = ""
        self._amd_gate: AmdGate | None = None
        self.links = ProviderLinks(
            provider,
            call_id=leg.identity.call_id,
            inbox=self._inbox,
            hooks=self._hooks,
            spawn=self._spawn,
            cancel=self._cancel,
            floor=lambda: self.coordinator.token if self.coordinator is not None else self.links.first_token,
            reconnect=reconnect,
            settings=self._settings,
        )
        self.links.sink = self._frames.provider_event  # events straight from the socket
        self._frames.links = self.links
        self.providers = self.links.providers  # by transport token
        self._carriers: dict[type, Callable[[Any], None]] = {
            **self.links.carriers(),
            **self._hooks.carriers(self._spawn),
            cmd.EndSession: self._session_ended,
            cmd.HangUp: lambda c: self._hangup(self._bye_by(), c.reason),
            cmd.TransferCall: self._transfer,
            cmd.SendDtmf: self._send_dtmf,
            cmd.RecordingTool: self._recording_tool,
            cmd.CollectCard: self._model_card,
            cmd.WarmTransferCall: lambda c: self.warm.model(self.coordinator, c),
        }
        # warm transfers (bridge/server/warm.py): the dial and the briefing session are the server's
        self.warm = WarmSeat(
            warm,
            self._options.telephony.warm,
            call_id=leg.identity.call_id,
            caller=leg,
            inbox=self._inbox,
            spawn=self._spawn,
            cancel=self._cancel,
            clock=clock,
            tell=self._tell,
        )

    @property
    def call_id(self) -> str:
        return self.leg.identity.call_id

    def status(self) -> dict[str, Any]:
        """`status()` of the session (SE7): identity, state and the coordinator's view."""
        ident, now = self.leg.identity, self._clock()
        body: dict[str, Any] = {
            "call_id": ident.call_id,
            "from": ident.from_uri,
            "to": ident.to_uri,
            "called": ident.request_user,
            "source": ident.source,
            "provider": self.links.name,
            "duration_ms": (now - self.started_ns) // 1_000_000,
        }
        if self.coordinator is None:
            body["state"] = "closed" if self._ended else "connecting"
        else:
            body.update(self.coordinator.status(now))
        return body | {"caller_frames": self._frames.counters()}

    async def run(self) -> CallSummary:
        ident = self.leg.identity
        log.info(
            "call %s started: from %s to %s (source %s)",
            ident.call_id,
            bounded(ident.from_uri, _LOGGED_URI_CHARS),  # status and the CDR keep them whole
            bounded(ident.to_uri, _LOGGED_URI_CHARS),
            ident.source,
        )
        first = self.providers[self.links.first_token]
        try:
            if not await self._hooks.authorized(f"conn-{first.token}"):
                raise ProviderUnavailable(f"connection {self.call_id}/conn-{first.token} not authorised")
            started = await self.links.timed_connect(first)  # provider connect time (/metrics)
        except ProviderUnavailable as exc:
            # Not answered yet: the caller gets 503 rather than a call that cannot talk.
            self._hangup("bridge", f"provider unavailable: {exc}")
            self._ended = await _leg_end(self.leg)
        else:
            self.coordinator = SessionCoordinator(
                limits=first.limits,
                output_format=first.output_format,
                capabilities=first.capabilities,
                channel=self.leg if self._tap is None else self._tap.channel(self.leg, self.started_ns),
                now=self.started_ns,
                token=first.token,
                options=self._options,
                settings=self._settings,
            )
            now = self._clock()
            self.coordinator.provider_event(started, now)
            self._connection_started(self.coordinator, started, now)
            if offers_dialled(self.leg) and self.leg.outbound:
                self.coordinator.ring(now)  # S7: the greeting waits for the callee's answer
                if self._amd_plan is not None:
                    self._frames.amd = self._amd_gate = AmdGate(
                        self._amd_plan,
                        self._inbox,
                        self._clock,
                        self.coordinator,
                        self._amd_event,
                        None if self._amd_hook is None else self._ask_amd,
                    )
            self.leg.answer()
            if not (offers_dialled(self.leg) and self.leg.outbound):
                self.coordinator.answered(now)  # inbound: up now (a route's disclosure plays first)
            del first  # bounded: a closed first connection is freed, not held to the call's end
            await self._bridge(self.coordinator)
        summary = self._summary()
        log.info("%s", summary)
        return summary

    async def _bridge(self, core: SessionCoordinator) -> None:
        self._frames.attach(self.leg, core)  # before the pump: no frame is left behind in the leg's queue
        self._spawn("leg", _pump(self.leg.events(), self._inbox))
        first = self.links.first_token
        self._spawn(f"provider-{first}", self.links.read(self.providers[first]))
        frames, inbox = self._frames, self._inbox
        try:
            while (
                not core.finished(now := self._clock())
                or (self.warm.relaying and self._ended is None)
                or self.warm.lingering  # (joined by Replaces: until the target ended its leg, bounded)
            ):
                # (relaying, or a finished core lingering for a replaced leg: the AI left)
                left = self.warm.relaying or (self.warm.lingering and core.finished(now))
                deadline = None if left else core.next_deadline()
                if deadline is not None and deadline <= now:
                    core.handle_timer(now)  # a due timer first, then one queued input: neither starves
                    if not inbox.empty():
                        self._handle(inbox.get_nowait())
                else:
                    if not left:  # (relaying: no timer of the core's is waited for)
                        frames.settled(
                            core, now
                        )  # the one timer: its callback wakes this loop when one is due
                    self._handle(inbox.get_nowait() if inbox.qsize() else await inbox.get())
                self._carry_out(core)
        finally:
            if self._card is not None:
                self._card_end("hangup")
            if (gate := self._amd_gate) is not None:
                gate.cancel()
            self._frames.detach(self.leg)
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            await self.links.close_all()

    def _spawn(self, name: str, coro: Any) -> None:  # a coroutine (the DTMF handler's is an Awaitable)
        self._tasks.spawn(name, coro, f"{self.call_id}-{name}")

    def _cancel(self, name: str) -> None:
        if (task := self._tasks.pop(name, None)) is not None:
            task.cancel()

    def _handle(self, item: object) -> None:
        """Feed one input to the coordinator."""
        core, now = self.coordinator, self._clock()
        assert core is not None
        if isinstance(item, FrameReceived):
            self._frames.feed(core, item, now)
        elif isinstance(item, CallEnded):
            self._ended = item
            if self._card is not None:
                self._card_end("hangup")
            self._early_media_notice(self.early_media.ended(item.status_code, item.reason, now))
            core.call_ended(now)
            self.warm.caller_gone(core, now)  # a warm transfer under way is undone, a relay ends the target
            if item.by_remote:
                self._ended_by, self._end_reason = "caller", f"{item.status_code} {item.reason}"
            elif not self._ended_by:
                self._ended_by, self._end_reason = "bridge", item.reason
        elif isinstance(item, DtmfReceived) and self._card is not None:
            # a payment-card collection takes every key, and tells nobody but the application (never logged)
            if (result := self._frames.key(core, item.digit, now)) is not None:
                self._card_over(result)
            else:
                self._arm_card(now)
        elif isinstance(item, _CardDue):
            if (card := self._card) is not None:
                if (result := card.handle_timer(now, core.timeline.ms(now))) is not None:
                    self._card_over(result)
                else:
                    self._arm_card(now)
        elif isinstance(item, DtmfReceived):
            log.info("call %s caller pressed %s", self.call_id, item.digit)
            if self._dtmf_handler is not None:
                self._spawn(f"dtmf-{core.frames_in}-{item.digit}", self._dtmf_handler(item.digit))
            self._frames.key(core, item.digit, now)
        elif isinstance(item, TransferProgress) and self.warm.refer_progress(core, item, now):
            self._warm_joined(core, now)  # (the warm transfer's REFER with Replaces)
        elif isinstance(item, TransferProgress):
            log.info(
                "call %s transfer to %s: %d %s%s",
                self.call_id,
                item.target,
                item.status_code,
                item.reason,
                " (final)" if item.final else "",
            )
            core.transfer_progress(item.status_code, item.reason, item.final, now)
        elif isinstance(item, (MediaStarted, MediaHeld, MediaResumed)):
            log.info(
                "call %s media: %s", self.call_id, item.codec if isinstance(item, MediaStarted) else item
            )
            # S7: hold is not a media condition (the assistant stops at what was heard, and goes on after the
            # resume); MediaStarted answers a call the bridge placed (for an inbound call: nothing to do)
            if isinstance(item, MediaStarted) and self.answered_ns is None:
                self.answered_ns = now
            if isinstance(item, MediaStarted):
                core.output.set_rate(item.rate)  # the leg's media rate: the provider's audio is framed at it
            if isinstance(item, MediaHeld):
                core.hold(now)
            elif isinstance(item, MediaResumed):
                core.resume(now)
            else:
                self._answered_after_early(now)
                if (gate := self._frames.amd) is not None:
                    gate.answered(now)  # the greeting waits for the verdict (the gate tells the core)
                else:
                    core.answered(now)
        elif isinstance(item, EarlyMediaStarted):
            # when it started, if the leg's clock is this session's (a leg queued it while the provider connected)
            at = item.at_ns if self.started_ns <= item.at_ns <= now else now
            if (notice := self.early_media.started(item.status, at)) is not None:
                self._early_media_notice(notice)
                self._frames.early = core.early_media_frame if self.early_media.to_provider else _unheard
        elif isinstance(item, _AmdDue):
            if (gate := self._amd_gate) is not None and self._ended is None:  # (a call gone decides nothing)
                gate.due()
        elif isinstance(item, _AmdAnswer):
            if (gate := self._amd_gate) is not None and self._ended is None:
                gate.application_answered(item.action)
        elif isinstance(item, (TargetEvent, WarmDue)):
            self.warm.handle(core, item, now)
            self._warm_joined(core, now)
        elif isinstance(item, _ConnectFailed):
            item.report(core, now)
        elif isinstance(item, _Approved):
            core.rollover_approved(item.rollover_id, item.approved, item.error, now)
        elif isinstance(item, _Authorized):
            core.connection_authorized(item.connection_id, item.ok, now)
        elif isinstance(item, _JobAnswered):
            if not core.job_answered(item.job_id, item.output, now):
                log.info(
                    "call %s %s answered after it was withdrawn or superseded: not delivered",
                    self.call_id,
                    item.job_id,
                )
        elif item is not None and not isinstance(
            item, _Wake
        ):  # a provider event (an ended reader sends None)
            core.provider_event(item, now)  # type: ignore[arg-type]
            if isinstance(item, SessionStarted):
                self._connection_started(core, item, now)

    def _carry_out(self, core: SessionCoordinator) -> None:
        """Synchronous: each command goes to the provider, the leg or a task for the application."""
        for command in core.commands():
            self._carriers[type(command)](command)
        for notice in core.notices():
            self.warm.heard(notice)  # (the last utterances, for a warm transfer's briefing)
            log_notice(self.call_id, notice)
            if self._notice_sink is not None:
                self._notice_sink(self.call_id, notice)

    @property
    def leg_ended(self) -> CallEnded | None:
        """How the leg ended (its final status for a placed call that was never answered); None: not reported."""
        return self._ended

    @property
    def amd_events(self) -> list[AmdEvent]:
        """The machine detector's events so far (the verdict first), empty without AMD."""
        return [] if self._amd_gate is None else list(self._amd_gate.events)

    @property
    def amd_action(self) -> AmdStart | None:
        """The action that followed the verdict (talk, message, hang_up), once it started; None before or
        without AMD."""
        return None if self._amd_gate is None else self._amd_gate.choice.started

    def _ask_amd(self, verdict: AmdVerdict, default: AmdAction) -> None:
        """The application's answer to the verdict, as a task; its answer (None on a failure) to the inbox."""
        hook, inbox = self._amd_hook, self._inbox
        assert hook is not None

        async def ask() -> None:
            try:
                action = await asyncio.wait_for(hook(verdict, default), _HOOK_TIMEOUT_S)
            except Exception as exc:  # a failing hook leaves the route's choice; it never crashes the call
                log.warning("call %s: the application's AMD answer failed: %r", self.call_id, exc)
                action = None
            inbox.put_nowait(_AmdAnswer(action if isinstance(action, str) else None))

        self._spawn("amd-answer", ask())

    def _amd_event(self, event: AmdEvent | AmdStart) -> None:
        if isinstance(event, AmdStart):
            log.info(
                "call %s AMD action %s after %d ms (the %s's choice for %s)",
                self.call_id,
                event.action,
                event.since_answer_ms,
                event.by,
                event.verdict,
            )
            if event.action != "talk":
                self._hangup_by = "bridge"  # the BYE that follows is the bridge's
        elif isinstance(event, AmdVerdict):
            log.info(
                "call %s AMD verdict %s after %d ms: %s",
                self.call_id,
                event.kind,
                event.since_answer_ms,
                event.reason,
            )
        else:
            log.info(
                "call %s AMD %s after %d ms: %s",
                self.call_id,
                type(event).__name__,
                event.since_answer_ms,
                event.reason,
            )
        if self._notice_sink is not None:
            self._notice_sink(self.call_id, event)
        if self._amd_gate is not None and self._amd_gate.detector.done:
            self._frames.amd = None  # the frames pay one flag test from now on

    def _answered_after_early(self, now: int) -> None:
        """The answer ends early media (if any): from now on every frame goes to the coordinator."""
        self._frames.early = None
        self._early_media_notice(self.early_media.ended(200, "answered", now))

    def _early_media_notice(self, notice: EarlyMedia | None) -> None:
        if notice is None:
            return
        if notice.phase == "started":
            log.info(
                "call %s early media (%d) at %d ms%s",
                self.call_id,
                notice.status,
                notice.at_ms,
                ", given to the provider" if notice.to_provider else "",
            )
        else:
            log.info(
                "call %s early media for %d ms, then %s", self.call_id, notice.duration_ms, notice.outcome
            )
        if self._notice_sink is not None:
            self._notice_sink(self.call_id, notice)

    def _session_ended(self, command: cmd.EndSession) -> None:
        if self.coordinator is not None:
            self.warm.session_ended(self.coordinator, command.reason, self._clock())
        if self._ended is None and (command.failed or command.goodbye):
            log.log(
                logging.ERROR if command.failed else logging.WARNING,
                "call %s %s: %s; playing the closing message, then hanging up",
                self.call_id,
                "failed" if command.failed else "ends",
                command.reason,
            )

    def transfer(self, command: cmd.TransferCall) -> None:
        """The application's transfer (`LiveCall.transfer`): one at a time per call, the model's included
        (bridge/engine/telephony.py); TransferInProgress, nothing sent, while one awaits its outcome."""
        core = self.coordinator
        if core is not None and core.telephony.transferring:
            raise TransferInProgress(f"call {self.call_id}: a transfer is already in progress")
        self._transfer(command)
        if core is not None:
            core.telephony.application_transfer()

    def warm_transfer(
        self, target: str, brief: str | None, digits: str = ""
    ) -> asyncio.Future[TransferResult]:
        """The application's warm transfer (bridge/server/warm.py): its result when decided."""
        result = self.warm.start(self.coordinator, target, brief, digits)
        self._inbox.put_nowait(_Wake())  # the core's commands (hold) carried out by the loop
        return result

    def _transfer(self, command: cmd.TransferCall) -> None:
        log.info("call %s transferring to %s", self.call_id, command.target)
        if command.headers and offers_sip_headers(self.leg):  # the application's (LiveCall.transfer checked)
            self.leg.transfer(command.target, command.headers)
        else:
            self.leg.transfer(command.target)

    def _send_dtmf(self, command: cmd.SendDtmf) -> None:
        try:
            self.leg.send_dtmf(command.digits)
        except ValueError as exc:  # the engine's own limits (the core checked the digits)
            log.warning(
                "call %s send_dtmf(%r) for %s failed: %s", self.call_id, command.digits, command.job_id, exc
            )

    def _connection_started(self, core: SessionCoordinator, started: SessionStarted, now: int) -> None:
        """One line a connection, the first included, with the provider's session id (a bench joins the two)."""
        sid, at_ms = started.session_id or "-", core.timeline.ms(now)
        log.info(
            "call %s conn-%d provider session %s started at %d ms", self.call_id, started.token, sid, at_ms
        )
        self._expires(started)

    def _expires(self, started: SessionStarted) -> None:
        """`expires_at` (unix seconds) as time left, from the wall clock: the one place it is read."""
        if self.coordinator is not None and started.expires_at:
            left_ms = int((started.expires_at - time.time()) * 1000)
            self.coordinator.connection_expires(started.token, left_ms, self._clock())

    # --- the application's pushes into a live call (DL3) ---

    def push_update(self, text: str, *, speak: bool = True) -> bool:
        """A speakable update (or silent context) for the model; held during a recovery until the caller has
        spoken again (HR9). False when the call is not live or the limit on command records is reached."""
        if self.coordinator is None or self.coordinator.ending.ended:
            return False
        accepted = self.coordinator.push_update(text, speak=speak, now=self._clock())
        self._inbox.put_nowait(_Wake())
        return accepted

    def now(self) -> int:
        """The session's clock (monotonic ns; the injected one: virtual time in the tests), for a core call the
        application's side makes on this session (`LiveCall.say_goodbye`)."""
        return self._clock()

    def push_fact(self, text: str) -> None:
        """A task fact or verified result: kept for the seed of any later connection (HR7), never spoken."""
        if self.coordinator is not None:
            self.coordinator.delegations.push_fact(text)

    def push_result(self, job_id: str, output: str) -> bool:
        """A (new revision of a) result for a job, e.g. when the application finishes work later."""
        if self.coordinator is None:
            return False
        accepted = self.coordinator.job_answered(job_id, output, self._clock())
        self._inbox.put_nowait(_Wake())
        return accepted

    # --- the recording's pauses and the payment-card mode (the module docstring) ---

    def _tell(self, notice: object) -> None:
        """A notice the shell itself makes: the log, then the sink (the record, /metrics, the console)."""
        log_notice(self.call_id, notice)
        if self._notice_sink is not None:
            self._notice_sink(self.call_id, notice)

    def _at_ms(self, now: int) -> int:
        return (now - self.started_ns) // 1_000_000

    def pause_recording(self, by: str = "application", *, card: bool = False) -> bool:
        """Pause the recording (a gap of silence); False when there is none, or it was already paused by this
        hold (nothing changes)."""
        tap, now = self._tap, self._clock()
        if not isinstance(tap, PausableTap):
            log.info("call %s pause_recording (%s): the call is not recorded", self.call_id, by)
            return False
        was = tap.paused
        if not tap.pause(now, by, card=card):
            log.info("call %s pause_recording (%s): already paused, nothing changed", self.call_id, by)
            return False
        if not was:
            log.info("call %s recording paused (%s)", self.call_id, by)
            self._tell(RecordingChanged(True, by, self._at_ms(now)))
        return True

    def resume_recording(self, by: str = "application", *, card: bool = False) -> bool:
        """End this pause (`card`: the card collection's); False when it was not paused so. The gap ends when no
        other pause holds it (a card collection's goes on until the collection ends)."""
        tap, now = self._tap, self._clock()
        if not isinstance(tap, PausableTap) or not tap.resume(now, card=card):
            log.info("call %s resume_recording (%s): not paused, nothing changed", self.call_id, by)
            return False
        if not tap.paused:
            log.info("call %s recording resumed (%s)", self.call_id, by)
            self._tell(RecordingChanged(False, by, self._at_ms(now)))
        return True

    def _recording_tool(self, command: cmd.RecordingTool) -> None:
        """The model's pause_recording / resume_recording: done, and the model told whether it changed anything."""
        changed = self.pause_recording("model") if command.pause else self.resume_recording("model")
        tap = self._tap
        recorded = isinstance(tap, PausableTap)
        paused = isinstance(tap, PausableTap) and tap.paused
        output = json.dumps({"recording": recorded, "paused": paused, "changed": changed})
        self._inbox.put_nowait(_JobAnswered(command.job_id, output))

    @property
    def collecting_card(self) -> bool:
        """A card collection is under way (the caller's audio is withheld from the provider)."""
        return self._card is not None

    def _model_card(self, command: cmd.CollectCard) -> None:
        """The model's collect_card: answered with the outcome when the collection ends (or refused now)."""
        self._start_card(None, "model", command.job_id)

    async def collect_card(self, options: CardOptions | None = None) -> CardResult:
        """The application's `collect_card`: the collection's result (`refused` at once when one is under way or
        the call is not up)."""
        started = self._start_card(options, "application", None)
        return started if isinstance(started, CardResult) else await started

    def cancel_card(self) -> bool:
        """End the collection under way as `cancelled`; False when there is none."""
        if self._card is None:
            return False
        self._card_end("cancelled")
        self._inbox.put_nowait(_Wake())
        return True

    def _start_card(
        self, options: CardOptions | None, by: str, job_id: str | None
    ) -> CardResult | asyncio.Future[CardResult]:
        core, now = self.coordinator, self._clock()
        options = options or self._options.telephony.card or CardOptions()
        up = core is not None and not core.ending.ended and not core.call_line.unanswered
        if self._card is not None or not up or self._ended is not None or self._frames.early is not None:
            refused = CardResult("refused", reference=options.reference, by=by)
            log.info("call %s card collection (%s) refused", self.call_id, by)
            if job_id is not None:
                self._inbox.put_nowait(_JobAnswered(job_id, model_answer(refused)))
            return refused
        assert core is not None
        card = self._card = CardCollector(options, now, core.timeline.ms(now), by)
        self._card_job = job_id
        self._frames.card = card  # from the next frame on: withheld from the provider
        card.withheld += self.links.drop_waiting()  # and the frame waiting for its pair (ProviderLinks)
        self.pause_recording("card", card=True)
        log.info("call %s card collection started (%s)", self.call_id, by)
        self._arm_card(now)
        future: asyncio.Future[CardResult] = asyncio.get_running_loop().create_future()
        self._card_waiters.append(future)
        return future

    def _arm_card(self, now: int) -> None:
        if self._card_timer is not None:
            self._card_timer.cancel()
            self._card_timer = None
        card = self._card
        if card is None or (due := card.next_deadline()) is None:
            return
        loop, inbox = asyncio.get_running_loop(), self._inbox
        at = loop.time() + (due - now + TIMER_SLACK_NS) / 1e9
        self._card_timer = loop.call_at(at, lambda: inbox.put_nowait(_CardDue()))

    def _card_end(self, outcome: CardOutcome) -> None:
        card, now = self._card, self._clock()
        if card is not None:
            at = self.coordinator.timeline.ms(now) if self.coordinator is not None else self._at_ms(now)
            if (result := card.end(outcome, at)) is not None:
                self._card_over(result)

    def _card_over(self, result: CardResult) -> None:
        """The collection ended: the frames flow, the recording resumes; the model, the record and the
        application told (the module docstring)."""
        card, self._card = self._card, None
        self._frames.card = None
        if self._card_timer is not None:
            self._card_timer.cancel()
            self._card_timer = None
        self.resume_recording("card", card=True)
        log.info(
            "call %s card collection %s (%s) after %d ms",
            self.call_id,
            result.outcome,
            result.by,
            result.ended_ms - result.started_ms,
        )
        if card is not None:
            if (gap := card.discontinuity()) is not None:
                self._tell(gap)
            if (notice := card.notice) is not None:
                self._tell(notice)
        if (job := self._card_job) is not None:
            self._card_job = None
            self._inbox.put_nowait(_JobAnswered(job, model_answer(result)))
            if self._card_handler is not None:  # not one of the session's tasks: the call's end never cuts it
                task = asyncio.create_task(self._handed_over(self._card_handler, result), name=f"{job}-card")
                _HANDED.add(task)
                task.add_done_callback(_HANDED.discard)
        waiters, self._card_waiters = self._card_waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(result)

    async def _handed_over(self, handler: CardHandler, result: CardResult) -> None:
        try:
            await handler(result)
        except Exception as exc:  # the application's failure, logged without the result (it has the digits)
            log.warning(
                "call %s: the application's card_collected failed: %s", self.call_id, type(exc).__name__
            )

    def _warm_joined(self, core: SessionCoordinator, now: int) -> None:
        """A warm transfer joined: the AI leaves (relaying: the caller's leg is the relay's)."""
        if self.warm.joined and not core.ending.ended:
            if self.warm.relaying:
                self._frames.early = self.warm.relay_to_target
            core.end("transferred (warm)", now)
            self._spawn("warm-ai-leaves", self.links.close_all())

    def _bye_by(self) -> str:
        """Whom the core's BYE is put down to: the bridge when its policy's goodbye ended the session (no input,
        budget, time limit, drain: bridge/engine/telephony.py `CallEnding.by_bridge`), else `_hangup_by`."""
        core = self.coordinator
        return "bridge" if core is not None and core.ending.by_bridge else self._hangup_by

    def _hangup(self, by: str, reason: str) -> None:
        if self.warm.joined:  # the caller's leg is the relay's now, or replaced: the transfer ends it
            return
        if self._ended is None and not self._ended_by:
            self._ended_by, self._end_reason = by, reason
            log.warning("call %s: %s; hanging up", self.call_id, reason)
            self.leg.hangup(reason[:100])

    def _summary(self) -> CallSummary:
        ended, core = self._ended, self.coordinator
        return CallSummary(
            call_id=self.call_id,
            duration_s=(self._clock() - self.started_ns) / 1e9,
            frames_in=core.frames_in if core is not None else 0,
            frames_out=self.leg.ledger.frames_transmitted,
            ended_by=self._ended_by or "unknown",
            reason=_with_note(
                self._end_reason or (f"{ended.status_code} {ended.reason}" if ended else "unknown"),
                self.early_media.failure_note,
            ),
            usage_seconds=core.usage.totals.audio_seconds if core is not None else None,
        )


def _unheard(pcm: bytes, now: int) -> None:
    """Early media the route keeps from the model: it went to the recording and the detector already."""


def _with_note(reason: str, note: str | None) -> str:
    return reason if note is None else f"{reason}; {note}"


async def _leg_end(leg: CallLeg) -> CallEnded | None:
    """A call refused before its session started: wait (bounded) for the leg to report its end."""
    ended = None
    try:
        async with asyncio.timeout(_LEG_DRAIN_TIMEOUT_S):
            async for event in leg.events():
                if isinstance(event, CallEnded):
                    ended = event
    except TimeoutError:
        pass
    return ended


async def _pump(source: AsyncIterator[Any], inbox: asyncio.Queue[Any]) -> None:
    async for item in source:
        inbox.put_nowait(item)
    inbox.put_nowait(None)
