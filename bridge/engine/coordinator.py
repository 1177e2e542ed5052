"""The session coordinator: one call's session core, a router between the parts that own its rules.

Inputs (each with `now`, monotonic ns): caller frames from the call leg, provider events, the application's
answers, the timer. Outputs: commands for the shell (pulled with `commands()`), frames pushed into the carrier
channel (the leg's playout), facts for the log (pulled with `notices()`), `next_deadline()` and `status()`.

Where each rule lives (DESIGN §2):
- bridge/engine/reservoir.py `OutputPath`: the reservoir, the cushion, item boundaries, the final message (SE2, SE3).
- bridge/engine/barrier.py `BargeIn`: clears through the playback-epoch barrier, barge-in, suppression (SE4, SE5).
- bridge/engine/turns.py `TurnTracker`: the caller's turns, local VAD merged with provider speech events (SE5).
- bridge/engine/recovery.py `RecoveryController`: HR1-HR3, HR5, HR7, HR8, HR13 and the half-open watchdog.
- bridge/engine/connections.py `Connections`: tokens, connection ids, floor and listeners (principle 3, RO7).
- bridge/engine/rollover.py `RolloverController` and `RolloverLink`: RO1-RO9.
- bridge/engine/delegations.py `Delegations`: the job ledger, HR6, HR9, HR10, DL1, DL2.
- bridge/engine/telephony.py `TelephonyTools` and `CallEnding`: DL6, and one way to say goodbye, then BYE.
- bridge/engine/timeline.py `Timeline` and `Captions`: SE6, HR11; `Unheard`: S1; `Deadlines`: the soonest deadline.
- bridge/engine/reservoir.py `Line`: hold and ringing (S7).  bridge/engine/usage.py `UsageMeter`: HR12.

Hold and ringing (S7) are states of the line, not media conditions: they never start a recovery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.engine.barrier import BargeIn, Channel
from bridge.engine.commands import *  # noqa: F403 - the vocabulary, re-exported for the shell and the tests
from bridge.engine.commands import AudioDiscontinuity, Command, Notice, Outbox, SendAudio
from bridge.engine.connections import Connections, Role
from bridge.engine.cushion import CARRIER_LEAD_FRAMES
from bridge.engine.delegations import DelegationOptions, Delegations
from bridge.engine.recovery import RecoveryController, seeds
from bridge.engine.reservoir import Line, OutputPath
from bridge.engine.rollover import RolloverLink, RolloverOptions
from bridge.engine.status import session_status
from bridge.engine.telephony import CallEnding, TelephonyOptions, TelephonyTools
from bridge.engine.timeline import Captions, Deadlines, Timeline, Unheard
from bridge.engine.turns import CallerStarted, CallerStopped, TurnChange, TurnTracker
from bridge.engine.usage import UsageMeter
from bridge.engine.vad import VadOptions
from providers import events as ev
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


class SessionCoordinator:
    """One call's session core. The shell feeds it and carries out what it pulls."""

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
        self.barge = BargeIn(output, truncate=caps.truncate)
        self.turns = TurnTracker(caps, o.vad, client_turns=self.client_turns)
        jobs = self.delegations = Delegations(o.delegations)
        captions = self.captions = Captions(out, close_ms=o.caption_close_ms, fragments=not caps.server_vad)
        self.unheard = Unheard(out, timeline, captions, now)  # S1
        seed, next_seed = seeds(conns, captions, jobs, caps)  # HR7, RO8
        self.recovery = RecoveryController(
            out, conns, output, jobs, seed, self._afresh, answer_within_ms=caps.answer_within_ms
        )
        self.rollover = RolloverLink(
            out,
            conns,
            timeline,
            captions,
            self.turns,
            o.rollover,
            next_seed,
            client_commits=self.client_turns,
            jobs=jobs,
            responses=caps.response_events,
            unheard=self.unheard.rollover_closed,
        )
        self.call_line = Line(output, out, self.recovery, truncate=caps.truncate, token=token)  # S7
        self.ending = CallEnding(out, output, o.telephony, o.closing_message)
        self.telephony = TelephonyTools(out, o.telephony, jobs, self.ending)
        self.usage = UsageMeter()
        self.deadlines = Deadlines(output.next_deadline, self._rooms_deadlines)
        self.next_deadline = self.deadlines.soonest  # when `handle_timer` is due (monotonic ns; None: never)
        self.state = "connecting"
        self.frames_in = 0
        self.rollover.start()

    @property
    def token(self) -> int:  # the transport token of the connection holding the floor
        return self.connections.floor

    def caller_frame(self, pcm: bytes, now: int) -> None:
        """One 20 ms caller frame: forwarded to the provider; it also marks a media-clock tick."""
        self.frames_in += 1
        if (
            self.call_line.paused
        ):  # S7: held (music on hold, if an engine passes it): the provider hears nothing
            return
        if not self.recovery.discard_frame() and not self.ending.ended:  # HR8 while reconnecting
            commands = self.out.commands
            for target in self.connections.audio_targets:
                commands.append(SendAudio(pcm, target))
            self.timeline.fed(now)  # HR11: the audio map that provider times are rebased through
        self.output.count_underrun(now)  # the cushion is fed once, by `_settle`
        change = self.turns.frame(pcm, now, self.timeline.ms(now))
        if change is not None:
            self._turn(change, now)
        self._settle(now, change is not None)

    def provider_event(self, event: ev.ProviderEvent, now: int) -> None:
        if isinstance(event, (ev.UsageUpdated, ev.SessionClosed)):
            self.usage.observe(event)  # usage of any transport counts, also a quarantined one (HR12)
        role = self.connections.classify(event.token)  # another token is inert (HR2, HR5)
        if self.delegations.echoes and role is not Role.STALE:  # S2: a rollover's next connection
            self.rollover.echo(event, now)
        if role is Role.LISTENER:
            if self.connections.handing_over and isinstance(event, (ev.SpeechStarted, ev.SpeechStopped)):
                self._turn(self.turns.provider(event), now, event.token)  # S3: it alone hears the caller
            if isinstance(event, ev.ToolCallRequested):  # S2: the ledger's rule; never left unanswered
                self._call(event, now)
            else:
                self.rollover.listener(event, now, speaking=self.turns.speaking)
        elif role is Role.FLOOR:
            self.recovery.alive()
            self.rollover.observe(event, now)
            self._floor_event(event, now)
            self.unheard.floor_seen = now  # (after: a close that begins a recovery is no sign of hearing)
        self._settle(now)

    def _floor_event(self, event: ev.ProviderEvent, now: int) -> None:
        if isinstance(event, ev.AudioReceived):
            self._audio(event, now)
        elif isinstance(event, ev.OutputInterrupted):
            self.barge.cut_in(self.out, now, self.timeline.ms(now), "provider")
        elif isinstance(event, (ev.SpeechStarted, ev.SpeechStopped)):
            self._turn(self.turns.provider(event), now)
        elif isinstance(event, (ev.InputTranscript, ev.OutputTranscript)):
            emit, speaking = self.rollover.controller is None, self.turns.speaking
            if self.captions.transcript(event, self.timeline, now, speaking=speaking, emit=emit):
                self._turn_over(now)
        elif isinstance(event, ev.SessionStarted):
            self.state = "ready"
            self.timeline.connection_started(event.token, now)
            if self.recovery.replacement_ready(event.token, now, self.timeline.ms(now), self.timeline.fed_ms):
                self.rollover.start(now)  # the repaired connection's age counts from now
        elif isinstance(event, ev.SessionClosed):
            if event.finalized:
                self._end(f"provider session closed: {event.reason}", now)
            elif self._may_recover():
                self.recovery.begin("transport_lost", now, self.timeline.ms(now))
        elif isinstance(event, ev.ProviderError):
            self.out.notices.append(event)
            if event.fatal:  # HR1: invalid audio is a protocol error, not a media condition
                self._end(f"protocol error {event.code}: {event.message}", now, failed=True)
        elif isinstance(event, ev.ResumptionUpdated):
            self.connections.resumption_updated(event.token, event.handle, event.resumable)
        elif isinstance(event, ev.ToolCallRequested):
            self._call(event, now)
        elif isinstance(event, ev.ToolCallCancelled):
            self.delegations.call_cancelled(event.call_ids, self.timeline.ms(now))
        elif isinstance(event, ev.ResponseDone):
            self.rollover.floor_response_done(event.token, now)

    def _call(self, e: ev.ToolCallRequested, now: int) -> None:
        """A call from the floor or a listener: a job, or answered from the ledger (DL1, HR10, S2)."""
        if not self.delegations.ended:  # S8: nothing is dispatched after the session ended
            at, stamped = self.timeline.rebase(e.token, e.at_ms, now), e.at_ms is not None  # HR11
            self.delegations.call_requested(
                e.token, e.call_id, e.name, e.arguments, e.kind, at, stamped=stamped
            )

    def job_answered(self, job_id: str, output: str, now: int) -> bool:
        """The application answered a dispatched job; False when the job no longer takes an answer."""
        accepted = self.delegations.job_answered(job_id, output, self.token, self.timeline.ms(now))
        self._settle(now)
        return accepted

    def push_update(self, text: str, *, speak: bool, now: int) -> bool:
        """An update, spoken or silent: held in a recovery until the caller spoke (HR9); False over DL2."""
        accepted = self.delegations.push_update(text, speak, self.token)
        self._settle(now)
        return accepted

    def caller_pressed(self, digit: str, now: int) -> None:
        self.telephony.caller_pressed(digit, self.token)
        self._settle(now)

    def transfer_progress(self, status: int, reason: str, final: bool, now: int) -> None:
        self.telephony.transfer_progress(status, reason, final, self.token, self.timeline.ms(now))
        self._settle(now)

    def rollover_approved(self, rollover_id: str, approved: bool | None, error: str | None, now: int) -> None:
        self.rollover.approved(rollover_id, approved, error, now)
        self._settle(now)

    def connection_authorized(self, cid: str, ok: bool, now: int) -> None:
        self.rollover.authorized(cid, ok, now)
        self._settle(now)

    def rollover_failed(self, token: int, reason: str, now: int) -> None:
        self.rollover.failed(token, reason, now)
        self._settle(now)

    def connection_expires(self, token: int, time_left_ms: int, now: int) -> None:
        self.rollover.expires(token, time_left_ms, now)
        self._settle(now)

    def replacement_failed(self, token: int, reason: str, now: int) -> None:
        """The shell could not open the replacement: a dead replacement is fatal (HR5)."""
        if self.recovery.replacement_failed(token, now):
            self._end(f"the replacement connection failed: {reason}", now, failed=True)
        self._settle(now)

    def resumption_rejected(self, token: int, now: int) -> None:
        """The provider refused the resumption handle of connection `token`: reseed without it."""
        if self.recovery.reconnecting:
            if self._may_recover():  # S6: after the hang-up nothing is opened
                self.recovery.resumption_rejected(token, now)
        elif not self.ending.ended:
            self.rollover.resumption_rejected(token)  # (nor here: RolloverLink.end, S6)
        self._settle(now)

    def call_ended(self, now: int) -> None:
        """The call leg is gone: a connection lost from now on is the session closing, not a fault."""
        self.ending.call_ended(self.token, now, reconnecting=self.recovery.reconnecting)
        self.rollover.end("call_ended", now)  # S6: nothing more is opened, authorised or funded
        self._ending(now)
        self.delegations.end_check(self.timeline.ms(now), self.ending.finished(now))
        self.deadlines.moved()

    # --- the line: hold and ringing (S7, bridge/engine/reservoir.py `Line`) ---

    def hold(self, now: int) -> None:
        """The caller put the call on hold: the assistant stops at what the caller heard; nothing recovers."""
        cancel = not self.recovery.reconnecting  # (a replacement being opened has said nothing yet)
        if not self.ending.ended and self.call_line.hold(
            self.token, now, self.timeline.ms(now), cancel=cancel
        ):
            self._settle(now)

    def resume(self, now: int) -> None:
        """The caller took the call off hold: the conversation goes on."""
        if self.call_line.resume(self.token, now, truncate=not self.ending.ended):
            self._settle(now)

    def ring(self, now: int) -> None:
        """An outbound call rings: nothing plays until the callee answers (`answered`)."""
        if not self.ending.ended and self.call_line.ring(now):
            self._settle(now)

    def answered(self, now: int) -> None:
        """The callee answered (media started): what waited plays, the held greeting goes to the model."""
        if (dropped := self.call_line.answer(now)) is not None:
            self._settle(now)
            if dropped:  # what the model said beyond the capacity while it rang
                self.out.notices.append(
                    AudioDiscontinuity("output", dropped, "ringing", self.timeline.ms(now))
                )

    @property
    def on_hold(self) -> bool:
        return self.call_line.on_hold

    @property
    def hold_dropped_bytes(self) -> int:  # the floor's audio dropped while held
        return self.call_line.dropped_bytes

    def handle_timer(self, now: int) -> None:
        at = self.timeline.ms(now)
        if self.captions.due(now):
            self._close_captions(now)
        failure = self.recovery.handle_timer(now, at, may_begin=self._may_recover())
        if failure is not None:
            self._end(failure, now, failed=True)
        else:
            self.delegations.handle_timer(self.token, at)
            self.rollover.handle_timer(now)
            if (stale := self.output.handle_timer(now)) is not None and self._may_recover():
                self.recovery.condition(stale, now, at)
            if (reason := self.ending.handle_timer(now)) is not None:
                self._end(reason, now)
        self._settle(now)

    def _rooms_deadlines(self) -> tuple[int | None, ...]:
        """Every room's next deadline but the output's (S8: the jobs' grace at the end of the session, too)."""
        timeline, jobs = self.timeline, self.delegations
        return (
            self.recovery.next_deadline(),
            timeline.instant(jobs.deadline_ms()),
            timeline.instant(jobs.ending_due_ms),
            self.ending.next_deadline(),
            self.rollover.next_deadline(),
            self.captions.next_deadline(),
        )

    def finished(self, now: int) -> bool:
        """The close and drain windows are over and the uncertain work was told (S8): the shell may stop."""
        return self.ending.finished(now) and (
            self.delegations.ended or self.delegations.ending_due_ms is None
        )

    def commands(self) -> list[Command]:
        return self.out.take_commands()

    def notices(self) -> list[Notice]:
        mine, jobs = self.out.take_notices(), self.delegations.notices()
        return [*mine, *jobs] if jobs else mine

    def _settle(self, now: int, moved: bool = True) -> None:
        """After every input: the output fed, the drain checked, rollover decisions and jobs routed (each a
        test of a flag or a list where nothing of theirs changed). The other rooms' deadlines are asked again
        (`Deadlines.moved`) after any input but a caller frame that changed no turn and made no room act."""
        output, rollover, jobs = self.output, self.rollover, self.delegations
        output.feed(now)
        if rollover.speaker_busy and output.drained(now):
            rollover.speaker_drained(now)
            moved = True
        if rollover.deciding:
            moved = True
            if (refused := rollover.route(now)) is not None:
                self._end(f"rollover not possible: {refused}", now, goodbye=True)
            rollover.gone(now)
        gate = self.connections.handing_over or self.call_line.paused  # RO8; S7: told only what can be heard
        if jobs.handover != gate:  # (a bool test per frame)
            jobs.floor(self.token, gate, self.timeline.ms(now))
            moved = True
        if jobs.waiting():  # DL6: jobs to the tools or the shell
            self.telephony.route(self.token, self.timeline.ms(now), now)
            moved = True
        if jobs.ending_due_ms is not None:  # S8: the session is ending (never during a call)
            jobs.end_check(self.timeline.ms(now), self.ending.finished(now))
            moved = True
        if moved:
            self.deadlines.moved()

    def _audio(self, event: ev.AudioReceived, now: int) -> None:
        if (
            not self.recovery.floor_audio()
            or self.barge.drop(event.audio)
            or self.rollover.begun_as_listener(event)
        ):
            return  # reconnecting; the caller is speaking: this output is interrupted (or a listener's, RO8)
        if self.call_line.held(event.audio, event.item_id, event.token):  # S7: nobody hears it
            return
        self.ending.assistant_audio()
        self.rollover.speaker_output(now)
        began, overflow = self.output.push(event.audio, event.item_id, now)
        if began:
            self.delegations.taken_in(self.token, self.timeline.ms(now))  # GPT-Live: a new item answers
        if overflow is not None and self._may_recover():
            self.recovery.condition(overflow, now, self.timeline.ms(now))

    def _turn(self, change: TurnChange | None, now: int, token: int | None = None) -> None:
        """One place for "the caller started" and "the caller's turn ended", whichever source saw it (`token`:
        the connection that reported it, when not the floor: in a rollover's hand-over the next connection alone
        hears the caller, and its speech start is a barge-in on the floor's output, S3)."""
        if isinstance(change, CallerStarted):
            source = self.token if token is None else token
            heard, at = change.heard_ns, self.timeline.rebase(source, change.provider_ms, now)
            # S1: where the caller's words begin (its text accounts for them)
            self.unheard.turn_started(self.timeline.ms(heard) if heard is not None else at)
            if change.barge and (change.source == "local_vad" or not self.barge.suppressed):
                self.barge.cut_in(self.out, now, self.timeline.ms(now), change.source)
            # After a repair, a fresh start opens the first fresh interval (HR10); a tail's does not
            # (bridge/engine/recovery.py: a replacement's own start of a turn under way at its ready instant).
            stamped = change.provider_ms is not None and heard is None
            if self.recovery.caller_started(at, self.timeline.fed_ms if stamped else None):
                self.delegations.caller_started(self.token, at)
            if not self.recovery.reconnecting:
                self.rollover.caller_heard(True, now)  # S2: the next one's own work
            if change.source == "local_vad" and change.barge:
                self.rollover.local_turn(True, now)  # without server VAD, the local detector marks utterances
        elif isinstance(change, CallerStopped):
            self.recovery.caller_ended()
            if (ended := self.barge.turn_over(self.timeline.ms(now))) is not None:
                self.out.notices.append(ended)
            self.rollover.caller_heard(False, now)
            self._turn_over(now)
            if change.source == "local_vad":
                if not self.ending.ended:
                    self.recovery.expect_answer(now)
                self.rollover.local_turn_over(now)

    def _turn_over(self, now: int) -> None:
        """The caller's turn is over: delegations' fresh interval ends; after a repair, it is complete."""
        self.delegations.caller_turn_ended(self.timeline.ms(now))
        self.recovery.caller_stopped(now)

    def _close_captions(self, now: int) -> None:
        for token, text, start, end in self.captions.close():
            if not self.rollover.caption(token, text, start, end, now) and token == self.token:
                self.captions.caller(text, start, True, end)
            if token == self.token and text:
                self._turn_over(now)

    def _may_recover(self) -> bool:
        return not self.ending.ended and not self.ending.leg_ended

    def _afresh(self, old: int, now: int) -> None:
        """A replacement is being opened for the floor connection `old`, now quarantined: what the caller said
        is not lost silently (S1: `RolloverLink.lost`, `Unheard.recovery`). Then captions start a fresh epoch
        (HR11)."""
        self.rollover.lost(old, now)
        self.unheard.recovery(now)
        self.captions.new_epoch()

    def _end(self, reason: str, now: int, *, failed: bool = False, goodbye: bool = False) -> None:
        if self.ending.end(reason, now, failed=failed, goodbye=goodbye):
            self.state = "failed" if failed else "closing"
            self.rollover.end("session_ended", now)  # S6
            self._ending(now)

    def _ending(self, now: int) -> None:
        """S8: the leg or the session ended: running jobs get their grace, bounded by the close window."""
        self.delegations.session_ending(self.timeline.ms(now), self.options.telephony.close_ms)

    def status(self, now: int) -> dict[str, Any]:
        """The session's state for `status()` and `GET /calls/{id}` (SE7, HR13): bridge/engine/status.py."""
        return session_status(self, now)
