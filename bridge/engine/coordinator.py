"""The session coordinator: one call's session core, the routes between the rooms that own its rules.

Inputs (each with `now`, monotonic ns): caller frames from the call leg, provider events, the application's
answers, the timer. Outputs: commands for the shell (pulled with `commands()`), frames pushed into the carrier
channel (the leg's playout), facts for the log (pulled with `notices()`), `next_deadline()` and `status()`.
The rooms, and the rules each owns, are in bridge/engine/rooms.py: a rule found here belongs in a room. The
floor's provider events go through `_FLOOR` (event type: handler), the caller's turns through
bridge/engine/caller.py `CallerTurns`. `caller_frame` runs every 20 ms: flag tests there, no new allocation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from bridge.engine.commands import *  # noqa: F403 - the vocabulary, re-exported for the shell and the tests
from bridge.engine.commands import AudioDiscontinuity
from bridge.engine.connections import Role
from bridge.engine.rooms import CoordinatorOptions as CoordinatorOptions
from bridge.engine.rooms import SessionRooms
from providers import events as ev


class SessionCoordinator(SessionRooms):
    """One call's session core: its rooms (bridge/engine/rooms.py) and the routes between them. The shell
    feeds it and carries out what it pulls."""

    def caller_frame(self, pcm: bytes, now: int) -> None:
        """One 20 ms caller frame: forwarded to the provider; it also marks a media-clock tick."""
        self.frames_in += 1
        if self.call_line.paused:  # S7: held or ringing: the provider hears nothing
            return
        self.caller.forward(pcm, now, held=False)  # to the connections that hear the caller (HR8, HR11)
        self.output.count_underrun(now)  # the cushion is fed once, by `_settle`
        change = self.turns.frame(pcm, now, self.timeline.ms(now))
        if change is not None:
            self.caller.turn(change, now)
        self._settle(now, change is not None)

    def provider_event(self, event: ev.ProviderEvent, now: int) -> None:
        if isinstance(event, (ev.UsageUpdated, ev.SessionClosed)):
            self.usage.observe(event, now)  # usage of any transport counts, also a quarantined one (HR12)
        role = self.connections.classify(event.token)  # another token is inert (HR2, HR5)
        if self.delegations.echoes and role is not Role.STALE:  # S2: a rollover's next connection
            self.rollover.echo(event, now)
        if role is Role.LISTENER:
            if self.connections.handing_over and isinstance(event, (ev.SpeechStarted, ev.SpeechStopped)):
                self.caller.turn(self.turns.provider(event), now, event.token)  # S3: only it hears the caller
            if isinstance(event, ev.ToolCallRequested):  # S2: the ledger's rule; never left unanswered
                self._call(event, now)
            else:
                self.rollover.listener(event, now, speaking=self.turns.speaking)
        elif role is Role.FLOOR:
            self.recovery.alive()
            self.rollover.observe(event, now)
            if (handler := self._FLOOR.get(type(event))) is not None:
                handler(self, event, now)
            self.unheard.floor_seen = now  # (after: a close that begins a recovery is no sign of hearing)
        self._settle(now)

    # --- the floor's events, one handler per type (`_FLOOR`) ---
    def _audio(self, e: ev.AudioReceived, now: int) -> None:
        if not self.recovery.floor_audio() or self.barge.drop(e.audio) or self.rollover.begun_as_listener(e):
            return  # reconnecting; the caller is speaking: this output is interrupted (or a listener's, RO8)
        if self.call_line.held(e.audio, e.item_id, e.token):  # S7: nobody hears it
            return
        self.ending.assistant_audio()
        self.rollover.speaker_output(now)
        began, overflow = self.output.push(e.audio, e.item_id, now)
        if began:
            self.delegations.taken_in(self.token, self.timeline.ms(now))  # GPT-Live: a new item answers
        if overflow is not None and self._may_recover():
            self.recovery.condition(overflow, now, self.timeline.ms(now))

    def _interrupted(self, event: ev.OutputInterrupted, now: int) -> None:
        self.barge.cut_in(self.out, now, self.timeline.ms(now), "provider")

    def _speech(self, event: ev.SpeechStarted | ev.SpeechStopped, now: int) -> None:
        self.caller.turn(self.turns.provider(event), now)

    def _transcript(self, event: ev.InputTranscript | ev.OutputTranscript, now: int) -> None:
        self.caller.transcript(event, now)

    def _started(self, event: ev.SessionStarted, now: int) -> None:
        self.state = "ready"
        self.timeline.connection_started(event.token, now)
        if self.recovery.replacement_ready(event.token, now, self.timeline.ms(now), self.timeline.fed_ms):
            self.rollover.start(now)  # the repaired connection's age counts from now

    def _closed(self, event: ev.SessionClosed, now: int) -> None:
        if event.finalized:
            self._end(f"provider session closed: {event.reason}", now)
        elif self._may_recover():
            self.recovery.begin("transport_lost", now, self.timeline.ms(now))

    def _error(self, event: ev.ProviderError, now: int) -> None:
        self.out.notices.append(event)
        if event.fatal:  # HR1: invalid audio is a protocol error, not a media condition
            self._end(f"protocol error {event.code}: {event.message}", now, failed=True)

    def _resumption(self, event: ev.ResumptionUpdated, now: int) -> None:
        self.connections.resumption_updated(event.token, event.handle, event.resumable)

    def _call(self, e: ev.ToolCallRequested, now: int) -> None:
        """A call from the floor or a listener: a job, or answered from the ledger (DL1, HR10, S2)."""
        if not self.delegations.ended:  # S8: nothing is dispatched after the session ended
            at, stamped = self.timeline.rebase(e.token, e.at_ms, now), e.at_ms is not None  # HR11
            self.delegations.call_requested(
                e.token, e.call_id, e.name, e.arguments, e.kind, at, stamped=stamped
            )

    def _cancelled(self, event: ev.ToolCallCancelled, now: int) -> None:
        self.delegations.call_cancelled(event.call_ids, self.timeline.ms(now))

    def _response_done(self, event: ev.ResponseDone, now: int) -> None:
        self.rollover.floor_response_done(event.token, now)

    # Built once, looked up with `type(event)` (no event type is subclassed); other types change nothing here.
    _FLOOR: ClassVar[dict[type, Callable[[SessionCoordinator, Any, int], None]]] = {
        ev.AudioReceived: _audio,
        ev.OutputInterrupted: _interrupted,
        ev.SpeechStarted: _speech,
        ev.SpeechStopped: _speech,
        ev.InputTranscript: _transcript,
        ev.OutputTranscript: _transcript,
        ev.SessionStarted: _started,
        ev.SessionClosed: _closed,
        ev.ProviderError: _error,
        ev.ResumptionUpdated: _resumption,
        ev.ToolCallRequested: _call,
        ev.ToolCallCancelled: _cancelled,
        ev.ResponseDone: _response_done,
    }

    # --- the application's answers and the shell's reports ---
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

    def transfer_progress(self, status: int, reason: str, final: bool, now: int, outcome: str = "") -> None:
        self.telephony.transfer_progress(status, reason, final, self.token, self.timeline.ms(now), outcome)
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
        self.disclosure.leg_ended(now)
        self.ending.call_ended(self.token, now, reconnecting=self.recovery.reconnecting)
        self.rollover.end("call_ended", now)  # S6: nothing more is opened, authorised or funded
        self._ending(now)
        self.delegations.end_check(self.timeline.ms(now), self.ending.finished(now))
        self.deadlines.moved()

    # --- the line: hold and ringing (S7, bridge/engine/reservoir.py `Line`) ---
    def hold(self, now: int, by: str = "caller") -> None:
        """The caller (or a warm transfer, `by`) held the call: the assistant stops at what the caller heard."""
        cancel, at = not self.recovery.reconnecting, self.timeline.ms(now)  # (a replacement has said nothing)
        if not self.ending.ended and self.call_line.hold(self.token, now, at, cancel=cancel, by=by):
            self._settle(now)

    def resume(self, now: int, by: str = "caller") -> None:
        """The caller took the call off hold (or the warm transfer was undone): the conversation goes on."""
        if self.call_line.resume(self.token, now, truncate=not self.ending.ended, by=by):
            self._settle(now)

    def ring(self, now: int) -> None:
        """An outbound call rings: nothing plays until the callee answers (`answered`)."""
        if not self.ending.ended and self.call_line.ring(now):
            self._settle(now)

    def answered(self, now: int) -> None:
        """The callee answered (media started): what waited plays, the held greeting goes to the model."""
        if (lost := self.call_line.answer(now)) is not None:
            self._settle(now)
            if lost:  # what the model said beyond the capacity while it rang
                self.out.notices.append(AudioDiscontinuity("output", lost, "ringing", self.timeline.ms(now)))
        if not self.ending.ended and self.disclosure.answered(now):  # it plays first
            self.deadlines.moved()

    def end(self, reason: str, now: int, *, message: bytes | None = None) -> None:
        """The application ends the call (answering-machine detection's hang-up or recorded message): BYE at
        once, or once `message` (PCM16 8 kHz) has played. Nothing is opened, authorised or funded after (S6)."""
        if self.ending.end(reason, now, goodbye=message is not None, message=message):
            self._ended(reason, now, failed=False)
        self._settle(now)

    def early_media_frame(self, pcm: bytes, now: int) -> None:
        """A placed call's early media, to the model when its route asks (bridge/engine/early_media.py)."""
        self.caller.forward(pcm, now, held=self.call_line.on_hold)

    def end_after_speech(self, reason: str, now: int, within_ms: int) -> None:
        """BYE once the model's next words have played (end_call's goodbye), or after `within_ms`."""
        self.ending.end_after_goodbye(now, reason, within_ms)
        self.deadlines.moved()

    # --- the timer, the outputs, and what every input ends with ---
    def handle_timer(self, now: int) -> None:
        at = self.timeline.ms(now)
        if self.captions.due(now):
            self.caller.close_captions(now)
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

    def _settle(self, now: int, moved: bool = True) -> None:
        """After every input: the output fed, the drain checked, rollover decisions and jobs routed (each a
        test of a flag or a list where nothing of theirs changed). The other rooms' deadlines are asked again
        (`Deadlines.moved`) after any input but a caller frame that changed no turn and made no room act."""
        output, rollover, jobs = self.output, self.rollover, self.delegations
        if self.call_line.disclosing:
            self.disclosure.check(now)
            moved = True  # (its deadline: the ledger read again a frame later)
        output.feed(now)
        if rollover.speaker_busy and output.drained(now):
            rollover.speaker_drained(now)
            moved = True
        if rollover.deciding:
            moved = True
            if (refused := rollover.route(now)) is not None:
                self._end(f"rollover not possible: {refused}", now, goodbye=True)
            rollover.gone(now)
        gate = self.connections.handing_over or self.call_line.gated  # RO8; S7: told only what can be heard
        if jobs.handover != gate:  # (a bool test per frame)
            jobs.floor(self.token, gate, self.timeline.ms(now))
            moved = True
        moved |= self.no_input.on and self.no_input.check(now)  # a check-in or a goodbye: jobs to route
        if jobs.waiting():  # DL6: jobs to the tools or the shell
            self.telephony.route(self.token, self.timeline.ms(now), now)
            moved = True
        if jobs.ending_due_ms is not None:  # S8: the session is ending (never during a call)
            jobs.end_check(self.timeline.ms(now), self.ending.finished(now))
            moved = True
        if moved:
            self.deadlines.moved()

    def _end(self, reason: str, now: int, *, failed: bool = False, goodbye: bool = False) -> None:
        if self.ending.end(reason, now, failed=failed, goodbye=goodbye):
            self._ended(reason, now, failed=failed)

    def _ended(self, reason: str, now: int, *, failed: bool) -> None:
        self.disclosure.over(f"the session ended: {reason}", now)
        self.state = "failed" if failed else "closing"
        self.rollover.end("session_ended", now)  # S6
        self._ending(now)

    def _ending(self, now: int) -> None:
        """S8: the leg or the session ended: running jobs get their grace, bounded by the close window."""
        self.delegations.session_ending(self.timeline.ms(now), self.options.telephony.close_ms)
