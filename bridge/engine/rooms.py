"""One session's rooms, built and wired once: each room gets the collaborators it needs and nothing more.
Which room is told what, and when, is bridge/engine/coordinator.py `SessionCoordinator` (these rooms and the
routes between them).

Where each rule lives (DESIGN §2):
- reservoir.py `OutputPath`: the reservoir, the cushion, item boundaries, the final message (SE2, SE3);
  `Line`: hold and ringing, states of the line that never start a recovery (S7).
- barrier.py `BargeIn`: clears through the playback-epoch barrier, barge-in, suppression (SE4, SE5).
- turns.py `TurnTracker`: the caller's turns, local VAD merged with provider speech events (SE5); caller.py
  `CallerTurns`: each turn change and caption told to the rooms that keep one.
- recovery.py `RecoveryController`: HR1-HR3, HR5, HR7, HR8, HR13 and the half-open watchdog.
- connections.py `Connections`: tokens, connection ids, floor and listeners (principle 3, RO7).
- rollover.py `RolloverController` and `RolloverLink`: RO1-RO9.
- delegations.py `Delegations`: the job ledger, HR6, HR9, HR10, DL1, DL2.
- telephony.py `TelephonyTools` and `CallEnding`: DL6, and one way to say goodbye, then BYE.
- timeline.py `Timeline` and `Captions`: SE6, HR11; `Unheard`: S1; `Deadlines`: the soonest deadline.
- usage.py `UsageMeter`: HR12. status.py: the `status()` view. latency.py `TurnClock`: each turn's times.
- disclosure.py `DisclosureRoom`: a recorded disclosure is the call's first audio, timed by the ledger; a recorded
  recording consent follows it.
- no_input.py `NoInputRoom`: the caller's no-input timeout (a check-in, then a goodbye), off by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.engine.barrier import BargeIn, Channel
from bridge.engine.caller import CallerTurns
from bridge.engine.commands import Command, Notice, Outbox
from bridge.engine.connections import Connections
from bridge.engine.cushion import CARRIER_LEAD_FRAMES
from bridge.engine.delegations import DelegationOptions, Delegations
from bridge.engine.disclosure import CONSENT_ITEM, Disclosure, DisclosureGate, DisclosureRoom
from bridge.engine.latency import TurnClock
from bridge.engine.no_input import NoInputOptions, NoInputRoom
from bridge.engine.recovery import RecoveryController, seeds
from bridge.engine.reservoir import Line, OutputPath
from bridge.engine.rollover import RolloverLink, RolloverOptions
from bridge.engine.status import session_status
from bridge.engine.telephony import CallEnding, TelephonyOptions, TelephonyTools
from bridge.engine.timeline import Captions, Deadlines, Timeline, Unheard
from bridge.engine.turns import TurnTracker
from bridge.engine.usage import BUDGET_NOTE, BUDGET_REASON, Part, Pricing, UsageMeter
from bridge.engine.vad import VadOptions
from providers.base import Capabilities, SessionSettings
from providers.limits import AudioLimits
from rtp.audio import AudioFormat


@dataclass(frozen=True, slots=True)
class CoordinatorOptions:
    lead_frames: int = CARRIER_LEAD_FRAMES  # the carrier cushion: frames waiting in the playout at most
    item_quiet_ms: int = 300  # GPT-Live names no items: a pause this long ends one
    caption_close_ms: int = 1_000  # GPT-Live: a caller turn's caption fragments are final this long after it
    vad: VadOptions = field(default_factory=VadOptions)
    delegations: DelegationOptions = field(default_factory=DelegationOptions)
    rollover: RolloverOptions | None = None  # None: no rollover (the call ends at the provider's cap)
    telephony: TelephonyOptions = field(default_factory=TelephonyOptions)
    closing_message: bytes = b""  # what the caller hears before a failed or refused session's BYE
    disclosure: Disclosure | None = (
        None  # played or said before the model is heard (bridge/engine/disclosure.py)
    )
    consent: Disclosure | None = (
        None  # the recording consent, after the disclosure (bridge/engine/disclosure.py)
    )
    no_input: NoInputOptions | None = None  # the caller's no-input timeout (bridge/engine/no_input.py)
    pricing: Pricing | None = None  # the provider's rates (bridge/engine/usage.py); None: nothing is priced
    budget: float | None = None  # the route's: the call ends politely at this price (None: no limit)


class SessionRooms:
    """One call's rooms, with the session's own figures (`state`, `frames_in`) and `next_deadline`."""

    next_deadline: Callable[[], int | None]

    def __init__(
        self,
        *,
        limits: AudioLimits,
        output_format: AudioFormat,
        capabilities: Capabilities,
        channel: Channel,
        now: int,
        token: int = 1,
        options: CoordinatorOptions | None = None,
        settings: SessionSettings | None = None,
    ) -> None:
        o = self.options = options or CoordinatorOptions()
        self.capabilities = caps = capabilities
        # RO5: turn detection off where the protocol allows it; the bridge's own VAD turns are committed.
        self.client_turns = (settings or SessionSettings()).turn_detection == "client" and caps.client_commits
        out = self.out = Outbox()
        timeline = self.timeline = Timeline(now)
        conns = self.connections = Connections(token)
        output = self.output = OutputPath(
            limits, output_format, channel, lead_frames=o.lead_frames, item_quiet_ms=o.item_quiet_ms
        )
        barge = self.barge = BargeIn(output, truncate=caps.truncate)
        turns = self.turns = TurnTracker(caps, o.vad, client_turns=self.client_turns)
        jobs = self.delegations = Delegations(o.delegations)
        captions = self.captions = Captions(out, close_ms=o.caption_close_ms, fragments=not caps.server_vad)
        unheard = self.unheard = Unheard(out, timeline, captions, now)  # S1
        seed, next_seed = seeds(conns, captions, jobs, caps)  # HR7, RO8
        recovery = self.recovery = RecoveryController(
            out, conns, output, jobs, seed, self._afresh, answer_within_ms=caps.answer_within_ms
        )
        rollover = self.rollover = RolloverLink(
            out,
            conns,
            timeline,
            captions,
            turns,
            o.rollover,
            next_seed,
            client_commits=self.client_turns,
            jobs=jobs,
            responses=caps.response_events,
            unheard=unheard.rollover_closed,
        )
        line = self.call_line = Line(output, out, recovery, truncate=caps.truncate, token=token)  # S7
        recording = o.disclosure if o.disclosure is not None and o.disclosure.audio is not None else None
        gate = DisclosureGate(recording) if recording is not None else None
        consent = o.consent if o.consent is not None and o.consent.audio is not None else None
        consent_gate = DisclosureGate(consent, CONSENT_ITEM, "consent") if consent is not None else None
        disclosure = self.disclosure = DisclosureRoom(gate, output, line, out, timeline, now, consent_gate)
        ending = self.ending = CallEnding(out, output, o.telephony, o.closing_message)
        self.telephony = TelephonyTools(out, o.telephony, jobs, ending)
        repairing = _repairing(recovery)
        self.usage = UsageMeter(
            _part(conns, repairing), o.pricing, o.budget, _goodbye_at_budget(jobs, ending, conns)
        )
        no_input = self.no_input = NoInputRoom(
            o.no_input, out, output, line, recovery, jobs, ending, timeline, lambda: conns.floor
        )
        clock = self.turn_clock = TurnClock(out, timeline, lambda: conns.floor, repairing)
        output.on_item = clock.item_began  # each item's first audio (per item, never per frame)
        self.caller = CallerTurns(
            out,
            conns,
            timeline,
            turns,
            captions,
            unheard,
            barge,
            recovery,
            jobs,
            rollover,
            ending,
            no_input,
            clock,
        )
        # The soonest of every room's deadlines (S8: the jobs' grace at the end of the session, too).
        rooms = (recovery, ending, rollover, captions, disclosure, no_input)
        self.deadlines = Deadlines(output.next_deadline, rooms, timeline, jobs.next_deadline_ms)
        self.next_deadline = self.deadlines.soonest  # when `handle_timer` is due (monotonic ns; None: never)
        self.state = "connecting"  # then "ready", "closing" or "failed": the coordinator moves it
        self.frames_in = 0
        rollover.start()

    def _may_recover(self) -> bool:
        return not self.ending.ended and not self.ending.leg_ended

    def _afresh(self, old: int, now: int) -> None:
        """A replacement starts afresh (`CallerTurns.afresh`; the recovery room is built before it)."""
        self.caller.afresh(old, now)

    def commands(self) -> list[Command]:
        """What the shell carries out, in order (taken: each once)."""
        return self.out.take_commands()

    def notices(self) -> list[Notice]:
        """Facts for the log, the application and the records, in order (taken: each once)."""
        mine, jobs = self.out.take_notices(), self.delegations.notices()
        return [*mine, *jobs] if jobs else mine

    def finished(self, now: int) -> bool:
        """The close and drain windows are over and the uncertain work was told (S8): the shell may stop."""
        jobs = self.delegations
        return self.ending.finished(now) and (jobs.ended or jobs.ending_due_ms is None)

    def status(self, now: int) -> dict[str, Any]:
        """The session's state for `status()` and `GET /calls/{id}` (SE7, HR13): bridge/engine/status.py."""
        return session_status(self, now)

    @property
    def token(self) -> int:  # the transport token of the connection holding the floor
        return self.connections.floor

    @property
    def on_hold(self) -> bool:
        return self.call_line.on_hold

    @property
    def hold_dropped_bytes(self) -> int:  # the floor's audio dropped while held
        return self.call_line.dropped_bytes


def _repairing(recovery: RecoveryController) -> Callable[[int], bool]:
    """Whether connection `token` is a recovery's replacement whose repair is not complete (HR7, HR13)."""

    def repairing(token: int) -> bool:
        active = recovery.active
        return active is not None and active.token == token

    return repairing


def _part(conns: Connections, repairing: Callable[[int], bool]) -> Callable[[int], Part]:
    """Which part a connection's usage counts in now (bridge/engine/usage.py): a replacement still repairing, a
    rollover's next connection before it takes the floor (tokens only grow), or the conversation."""

    def part(token: int) -> Part:
        if repairing(token):
            return "recovery"
        if token in conns.listeners and token > conns.floor:
            return "rollover"
        return "conversation"

    return part


def _goodbye_at_budget(jobs: Delegations, ending: CallEnding, conns: Connections) -> Callable[[int], None]:
    """The budget is reached: a short goodbye, then BYE once it has played (`LiveCall.say_goodbye`'s way); at
    once when the update is refused. Nothing after the session ended or the caller hung up."""

    def goodbye(now: int) -> None:
        if ending.ended or ending.leg_ended:
            return
        spoken = jobs.push_update(BUDGET_NOTE, True, conns.floor)
        ending.end_after_goodbye(now, BUDGET_REASON, None if spoken else 0)

    return goodbye
