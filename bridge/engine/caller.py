"""The caller's turns told to the rooms: one place for "the caller started" and "the caller's turn ended",
whichever source saw it (the local detector or a provider's speech events, bridge/engine/turns.py
`TurnTracker`), and for the floor's captions, whose final caller text also ends the turn.

Each rule stays in its room; this object only tells them, in this order:
- a start: where the caller's words begin (S1, timeline.py `Unheard`), the barge-in (barrier.py, SE5), the
  first fresh interval after a repair (HR10, recovery.py, then delegations.py), the rollover's marks (S2, RO3);
  the barge-in source's start stops the no-input clock (no_input.py);
- an end: where the caller's speech ended (latency.py), the barge-in's suppression ends, the rollover's marks, the ledger's fresh interval and the repair's
  completion (`turn_over`), and the half-open watchdog's wait for an answer (recovery.py); the no-input clock
  may run again (`turn_over`);
- captions (timeline.py `Captions`, HR11; which connection's text is emitted: rollover.py, RO3);
- a repair begins (`afresh`): what the quarantined connection heard is not lost silently (S1), and captions
  start a fresh epoch (HR11);
- the caller's audio, and a placed call's early media when its route gives it to the model (`forward`): sent
  to the connections that hear the caller (early media with no turn of the caller's).
Sans-I/O: changes and events in with `now`.
"""

from __future__ import annotations

from bridge.engine.barrier import BargeIn
from bridge.engine.commands import Outbox, SendAudio
from bridge.engine.connections import Connections
from bridge.engine.delegations import Delegations
from bridge.engine.latency import TurnClock
from bridge.engine.no_input import NoInputRoom
from bridge.engine.recovery import RecoveryController
from bridge.engine.rollover import RolloverLink
from bridge.engine.telephony import CallEnding
from bridge.engine.timeline import Captions, Timeline, Unheard
from bridge.engine.turns import CallerStarted, CallerStopped, TurnChange, TurnTracker
from providers.events import InputTranscript, OutputTranscript


class CallerTurns:
    """Tells one session's rooms of the caller's turns and the floor's captions (the order: module docstring)."""

    def __init__(
        self,
        out: Outbox,
        connections: Connections,
        timeline: Timeline,
        turns: TurnTracker,
        captions: Captions,
        unheard: Unheard,
        barge: BargeIn,
        recovery: RecoveryController,
        jobs: Delegations,
        rollover: RolloverLink,
        ending: CallEnding,
        no_input: NoInputRoom,
        clock: TurnClock,
    ) -> None:
        self._out, self._connections, self._timeline, self._turns = out, connections, timeline, turns
        self._captions, self._unheard, self._barge = captions, unheard, barge
        self._recovery, self._jobs, self._rollover, self._ending = recovery, jobs, rollover, ending
        self._no_input = no_input
        self._clock = clock

    def forward(self, pcm: bytes, now: int, *, held: bool) -> None:
        """A caller frame, or a placed call's early media (bridge/engine/early_media.py), to the connections that
        hear the caller: never while held, after the end, or while reconnecting (HR8). Every 20 ms: flag tests."""
        if held or self._ending.ended or self._recovery.discard_frame():
            return
        commands = self._out.commands
        for target in self._connections.audio_targets:
            commands.append(SendAudio(pcm, target))
        self._timeline.fed(now)  # HR11: the audio map that provider times are rebased through

    def turn(self, change: TurnChange | None, now: int, token: int | None = None) -> None:
        """A turn change (`token`: the connection that reported it, when not the floor: in a rollover's
        hand-over the next connection alone hears the caller, and its speech start is a barge-in on the floor's
        output, S3)."""
        timeline, recovery, rollover = self._timeline, self._recovery, self._rollover
        if isinstance(change, CallerStarted):
            source = self._connections.floor if token is None else token
            heard, at = change.heard_ns, timeline.rebase(source, change.provider_ms, now)
            # S1: where the caller's words begin (its text accounts for them)
            self._unheard.turn_started(timeline.ms(heard) if heard is not None else at)
            if change.barge and (change.source == "local_vad" or not self._barge.suppressed):
                self._barge.cut_in(self._out, now, timeline.ms(now), change.source)
            if change.barge:  # the session's barge-in source: the caller speaks (no-input clock stopped)
                self._no_input.caller_started()
            # After a repair, a fresh start opens the first fresh interval (HR10); a tail's does not
            # (bridge/engine/recovery.py: a replacement's own start of a turn under way at its ready instant).
            stamped = change.provider_ms is not None and heard is None
            if recovery.caller_started(at, timeline.fed_ms if stamped else None):
                self._jobs.caller_started(self._connections.floor, at)
            if not recovery.reconnecting:
                rollover.caller_heard(True, now)  # S2: the next one's own work
            if change.source == "local_vad" and change.barge:
                rollover.local_turn(True, now)  # without server VAD, the local detector marks utterances
        elif isinstance(change, CallerStopped):
            source = self._connections.floor if token is None else token
            last = change.ended_ns  # where the caller's speech ended on the wire (bridge/engine/latency.py)
            end_ms = (
                timeline.ms(last) if last is not None else timeline.rebase(source, change.provider_ms, now)
            )
            self._clock.speech_ended(end_ms, source)
            recovery.caller_ended()
            if (ended := self._barge.turn_over(timeline.ms(now))) is not None:
                self._out.notices.append(ended)
            rollover.caller_heard(False, now)
            self.turn_over(now)
            if change.source == "local_vad":
                if not self._ending.ended:
                    recovery.expect_answer(now)
                rollover.local_turn_over(now)

    def turn_over(self, now: int) -> None:
        """The caller's turn is over: delegations' fresh interval ends; after a repair, it is complete."""
        self._no_input.caller_quiet()
        self._jobs.caller_turn_ended(self._timeline.ms(now))
        self._recovery.caller_stopped(now)

    def transcript(self, event: InputTranscript | OutputTranscript, now: int) -> None:
        """A caption of the floor: emitted here unless a rollover controller decides whose text is (RO3)."""
        emit, speaking = self._rollover.controller is None, self._turns.speaking
        if self._captions.transcript(event, self._timeline, now, speaking=speaking, emit=emit):
            self.turn_over(now)

    def close_captions(self, now: int) -> None:
        """The caller's timed fragments are due: each connection's as one utterance (the rollover's, RO3)."""
        for token, text, start, end in self._captions.close():
            if not self._rollover.caption(token, text, start, end, now) and token == self._connections.floor:
                self._captions.caller(text, start, True, end)
            if token == self._connections.floor and text:
                self.turn_over(now)

    def afresh(self, old: int, now: int) -> None:
        """A replacement is being opened for the floor connection `old`, now quarantined: what the caller said
        is not lost silently (S1: `RolloverLink.lost`, `Unheard.recovery`). Then captions start a fresh epoch
        (HR11)."""
        self._rollover.lost(old, now)
        self._unheard.recovery(now)
        self._captions.new_epoch()
