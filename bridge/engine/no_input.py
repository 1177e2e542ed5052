"""The caller's no-input timeout: after `timeout_ms` of the caller's silence the model is asked, once, to check in
with the caller; if the caller is still silent a timeout later, the model says a short goodbye and the call ends
once it was heard (per route: `no_input_timeout_s`; off by default — a caller hung up on for thinking, or for
reading a card number off a letter, is a complaint, so an operator switches it on knowingly).

What counts as silence is what an IVR's no-input timer counts: time in which the *caller* is the one expected
to speak. The clock runs only while all of these hold, and stops while any does not:
- the line is up and the model can be heard: not on hold, not ringing (an outbound call before its answer, and
  while answering-machine detection keeps it so until its verdict's release), not while a recorded disclosure
  plays (S7, bridge/engine/reservoir.py `Line.gated`);
- the assistant is not audible: everything the model said has been played to the carrier (the reservoir, the
  framer and the cushion are empty and its item is over: `OutputPath.drained`), so the timer counts from the
  end of its last word, as an IVR's counts from the end of its prompt;
- the voice path is whole: no recovery is active (HR5 reconnecting, HR13 awaiting the caller: the caller may be
  talking into a replacement that discards them, HR8), no rollover hands the floor over (RO8), and nothing the
  model is to be told waits (HR9: results and updates held until the caller spoke). A repair ends with the
  caller's fresh turn, so a caller who never speaks again after one is not timed out here — a check-in would be
  held for that very turn (HR9), and the replacement's own notice already asked them to repeat (HR7); the RTP
  timeout and the maximum duration bound that call;
- no job is pending (held, running at the application or as a telephony action, or answered and not yet
  delivered): the caller waits for its result (a lookup, a transfer ringing), and says nothing meanwhile;
- the caller is not speaking: from a caller start by the session's barge-in source (the provider's speech
  start, or the local detector where the session uses it for barge-in; a local start beside a provider's is
  not speech by itself) to the end of that turn (a speech end by any source, or its final caption);
- the session goes on: not ended, the leg not gone, no goodbye under way (end_call's, a drain's, the time
  limit's, this room's own).
Every stop restarts the clock from zero when it ends: the timeout is one unbroken stretch of expected silence.
A caller back from hold or after a repair gets the whole timeout; each of the assistant's replies starts it
anew.

The stages: `listening` — at the timeout the model is prompted (`prompt`: a speakable update through the job
ledger, as `LiveCall.push_update`: the model checks in in its own words and language) and the stage becomes
`prompted`; the clock restarts (and stops while the check-in plays). At the next timeout, `goodbye`: the model
is told to say a short goodbye, and the call ends once it has been played (bridge/engine/telephony.py
`CallEnding.end_after_goodbye`, as `LiveCall.say_goodbye`; its timeout bounds a model that says nothing), with
the reason `NO_INPUT_REASON`. The caller's speech returns the room to `listening` from `prompted`: one prompt
per silence, re-armed each time the caller spoke. After the goodbye nothing more is asked.

Sans-I/O: `check(now)` after every input (the coordinator's `_settle`: flag tests, no allocation, while the
timeout is on; one flag test while it is off), `next_deadline()` for the timer. The clock's state is read off
the rooms that own each condition, never mirrored: only the caller's turn is told here (`caller_started`,
`caller_quiet`, by bridge/engine/caller.py). While only the assistant's audio keeps the clock stopped, the
room asks to be checked every `POLL_MS` (its end is a matter of time, and a caller who sends no RTP in
silence gives no media tick to notice it on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bridge.engine.commands import NoInputTimeout, Outbox
from bridge.engine.delegations import Delegations
from bridge.engine.recovery import RecoveryController
from bridge.engine.reservoir import Line, OutputPath
from bridge.engine.telephony import CallEnding
from bridge.engine.timeline import Timeline
from rtp.units import NS_PER_MS

PROMPT = (
    "The caller has not said anything for a while. Check in with them briefly in the language of the call: "
    "ask whether they are still there and whether you can help with anything."
)
GOODBYE = (
    "The caller is still silent. Say a short, polite goodbye now in the language of the call; the call ends "
    "when you finish."
)
NO_INPUT_REASON = "no_input: the caller said nothing after a check-in"
POLL_MS = 250  # while the assistant's audio alone stops the clock: how often its end is looked for
LEAST_TIMEOUT_MS = 1_000  # anything shorter is a natural pause, not a silence

Stage = Literal["listening", "prompted", "done"]


@dataclass(frozen=True, slots=True)
class NoInputOptions:
    """A route's no-input timeout (`timeout_ms`), what the model is told at it, and at the second one."""

    timeout_ms: int
    prompt: str = PROMPT
    goodbye: str = GOODBYE

    def __post_init__(self) -> None:
        if self.timeout_ms < LEAST_TIMEOUT_MS:
            raise ValueError(f"a no-input timeout is at least {LEAST_TIMEOUT_MS} ms; got {self.timeout_ms}")
        if not self.prompt.strip() or not self.goodbye.strip():
            raise ValueError("the no-input prompt and goodbye are not empty")


class NoInputRoom:
    """One session's no-input timer (the rules: the module's docstring). Without options every call is a no-op
    and `on` is False."""

    def __init__(
        self,
        options: NoInputOptions | None,
        out: Outbox,
        output: OutputPath,
        line: Line,
        recovery: RecoveryController,
        jobs: Delegations,
        ending: CallEnding,
        timeline: Timeline,
        floor: Callable[[], int],
    ) -> None:
        self.options = options
        self.on = options is not None
        self._timeout_ns = options.timeout_ms * NS_PER_MS if options is not None else 0
        self._out, self._output, self._line, self._recovery = out, output, line, recovery
        self._jobs, self._ending, self._timeline, self._floor = jobs, ending, timeline, floor
        self.stage: Stage = "listening"
        self.speaking = False  # between a caller start and the end of that turn
        self.since: int | None = None  # when the running stretch of expected silence began (None: stopped)
        self._poll: int | None = None  # the next look for the assistant's audio to have ended
        self.prompts = 0  # prompts given over the call (one per silence)

    # --- the caller's turns (bridge/engine/caller.py) ---
    def caller_started(self) -> None:
        """The caller speaks (the session's barge-in source): the clock stops; a prompted silence is over."""
        if self.on:
            self.speaking = True
            self.since = None
            if self.stage == "prompted":
                self.stage = "listening"

    def caller_quiet(self) -> None:
        """The caller's turn is over: the clock may run again (from zero)."""
        self.speaking = False

    # --- after every input ---
    def _blocked(self) -> bool:
        """A reason the caller is not the one expected to speak, other than the assistant's audio."""
        ending, jobs = self._ending, self._jobs
        return (
            self.stage == "done"
            or self.speaking
            or ending.ended
            or ending.leg_ended
            or ending.goodbye_due
            or self._line.gated
            or self._recovery.active is not None
            or jobs.held
            or jobs.handover
            or bool(jobs.ledger.open)
        )

    def check(self, now: int) -> bool:
        """After every input, while `on`: the clock started, stopped or fired. True when its deadline moved."""
        if self._blocked():
            moved = self.since is not None or self._poll is not None
            self.since = self._poll = None
            return moved
        if not self._output.drained(now):  # the assistant is audible
            self.since = None
            if self._poll is not None and now < self._poll:
                return False
            self._poll = now + POLL_MS * NS_PER_MS
            return True
        self._poll = None
        if self.since is None:
            self.since = now
            return True
        if now - self.since < self._timeout_ns:
            return False
        self._timed_out(now)
        return True

    def _timed_out(self, now: int) -> None:
        options = self.options
        assert options is not None and self.since is not None
        silent_ms, at_ms = (now - self.since) // NS_PER_MS, self._timeline.ms(now)
        if self.stage == "listening":
            self.stage, self.since = "prompted", now  # the clock restarts
            self.prompts += 1
            sent = self._jobs.push_update(options.prompt, True, self._floor())
            self._out.notices.append(NoInputTimeout("prompt", silent_ms, sent, at_ms))
        else:
            self.stage, self.since = "done", None
            sent = self._jobs.push_update(options.goodbye, True, self._floor())
            self._ending.end_after_goodbye(now, NO_INPUT_REASON)
            self._out.notices.append(NoInputTimeout("goodbye", silent_ms, sent, at_ms))

    def next_deadline(self) -> int | None:
        """The timeout while the clock runs; the next look while the assistant's audio alone stops it. None
        once the call or the session ended (a hang-up cancels it)."""
        if self._ending.ended or self._ending.leg_ended:
            return None
        if self.since is not None:
            return self.since + self._timeout_ns
        return self._poll

    def status(self) -> dict[str, object] | None:
        """`status()["no_input"]`: None while off."""
        if self.options is None:
            return None
        return {"timeout_ms": self.options.timeout_ms, "stage": self.stage, "prompts": self.prompts}
