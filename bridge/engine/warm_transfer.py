"""Warm transfer: the caller waits on hold while the bridge dials a human, briefs them, and joins the two legs
only once the human accepts; anything else puts everything back as it was.

`WarmTransfer` is a sans-I/O state machine, one per transfer: events and `now` (monotonic ns) in, actions out,
`next_deadline()` for its timers. The shell (bridge/server/session.py) carries the actions out on the legs;
the session core keeps the caller's side (bridge/engine/reservoir.py `Line`: the transfer holds the line as a
hold by the caller does, S7 — the caller's audio does not reach the provider and nothing the model says is
heard).

States: dialing → ringing → briefing → awaiting (acceptance) → [joining →] joined, or undone with a typed reason.

- Start: `HoldCaller` (hold music, a WAV from the config, or silence) and `DialTarget` (the outbound-call
  machinery: sip/engine.py `Dialer.dial`), with a ring timeout counted from the start.
- Answer (a 2xx): `SendTargetDigits` when an extension is to be keyed in (RFC 4733, after the answer: an IVR
  answers first), then `BriefTarget`: the briefing — the application's `brief`, or a summary built from the
  call's utterances (`summary`) — spoken to the human by a second provider session on the target's leg, whose
  instructions it is. The human's decision is awaited from the answer on, within `accept_timeout_ms`.
- Acceptance: the human keys `accept_digit` (1 by default); the briefing may be cut short by it. Refusal: the
  human hangs up, or keys `refuse_digit` (2). Chosen here where the issue is silent: a key press is the only
  acceptance (a spoken "yes" would depend on a recogniser on the second session, and a human who silently
  stays on the line has decided nothing: after `accept_timeout_ms` that is `no_decision`); other keys are
  ignored, so a human keying through the briefing is not taken as a refusal.
- Join, by REFER with Replaces (RFC 5589 §7 attended transfer, RFC 3891) when the caller's side can take one
  (`caller_replaces`: sip/core/replaces.py `accepts_replaces`) and the target's engine gave the Refer-To that
  replaces its dialog (`TargetProgress.refer_to`): `ReferCaller` — the briefing stops and the caller is sent
  that REFER in its own dialog (the cold transfer's machinery, sip/core/transfer.py); the caller stays on hold
  meanwhile (joining). Its outcome (`ReferProgress`, the NOTIFY sipfrag or the REFER's error response):
  - 2xx: joined by `replaces` — the caller now talks to the target directly; the bridge's caller leg is ended
    (`HangUpCaller`: the transfer machinery's BYE after a 2xx sipfrag, where it sent one already), the target ends its replaced leg with a BYE (the
    normal end there, not a refusal, even when it comes before the NOTIFY), and what the target has not ended
    within `replaced_wait_ms` is ended by the bridge (`DropTarget`). The AI leaves.
  - a refusal (REFER 4xx-6xx, 405/501 included, a failed sipfrag) or no outcome within `join_timeout_ms`:
    the join falls back to the relay below, so the call is never lost; if the target's leg ended meanwhile
    there is nothing to relay to: undone (`failed`), the caller back with the model.
  - the caller hanging up while joining: undone (`caller_hung_up`), the target's leg ended.
- Joined by `relay` (`JoinLegs`): the bridge relays media between the two legs and the AI leaves (the model's
  session ends; the caller's leg stays up); from then a hang-up of either leg ends the other (`HangUpCaller`,
  `DropTarget`). An accepted outcome names the join it got (`TransferResult.join`).
- Undone (refusal, no answer, busy, a failure, no decision, the caller hanging up first, the session ending):
  `DropTarget` (CANCEL before the answer, BYE after) unless the target is already gone, `ReleaseCaller`
  (hold music stops, the caller is back with the model) unless the caller is gone, and one `Outcome`.

Every transfer reports exactly one `Outcome` (`TransferResult`: the typed reason and the SIP status the target
leg gave, 0 when it gave none). Peer input never raises: an event that does not fit the state is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from rtp.units import NS_PER_MS


class WarmState(Enum):
    DIALING = "dialing"
    RINGING = "ringing"
    BRIEFING = "briefing"
    AWAITING = "awaiting"
    JOINING = "joining"  # REFER with Replaces sent to the caller, its outcome awaited
    JOINED = "joined"
    UNDONE = "undone"


# The typed reasons of an outcome (`TransferResult.outcome`).
ACCEPTED = "accepted"
REFUSED = "refused"  # the human hung up or keyed the refusal
NO_ANSWER = "no_answer"  # the ring timeout, 408 or 480
BUSY = "busy"  # 486, 600
DECLINED = "declined"  # 603
FAILED = "failed"  # any other final status, or the dial could not be placed
NO_DECISION = "no_decision"  # answered, but neither accepted nor refused in time
CALLER_HUNG_UP = "caller_hung_up"
SESSION_ENDED = "session_ended"  # the call's session ended (the application, a failure) first

# How an accepted transfer joined the legs (`TransferResult.join`)
JOIN_REPLACES = (
    "replaces"  # the caller's side replaced the bridge's dialog with the target's: the bridge left
)
JOIN_RELAY = "relay"  # the bridge relays media between the legs

REPLACED = "transferred (warm, replaced)"  # the reason on the caller's leg joined by Replaces

OUTCOMES = (ACCEPTED, REFUSED, NO_ANSWER, BUSY, DECLINED, FAILED, NO_DECISION, CALLER_HUNG_UP, SESSION_ENDED)


@dataclass(frozen=True, slots=True)
class WarmOptions:
    ring_timeout_ms: int = 30_000  # from the start: no answer by then is `no_answer` (CANCEL)
    accept_timeout_ms: int = 60_000  # from the answer: the briefing and the human's decision
    accept_digit: str = "1"
    refuse_digit: str = "2"
    join_timeout_ms: int = 8_000  # REFER with Replaces sent: no outcome by then falls back to the relay
    replaced_wait_ms: int = (
        3_000  # joined by Replaces: the target's BYE of its replaced leg awaited this long
    )


@dataclass(frozen=True, slots=True)
class TransferResult:
    """The outcome of one transfer, for the application (`LiveCall.transfer`) and the model (its tool's answer).
    `status`: the SIP status the target leg gave (0: none, e.g. the caller hung up before any answer);
    `elapsed_ms`: from the start; `join`: how an accepted transfer joined the legs (`JOIN_REPLACES`,
    `JOIN_RELAY`), "" when it was not accepted."""

    target: str
    outcome: str
    status: int
    reason: str
    elapsed_ms: int
    join: str = ""

    @property
    def transferred(self) -> bool:
        return self.outcome == ACCEPTED


# --- events (inputs) ---
@dataclass(frozen=True, slots=True)
class TargetProgress:
    """The target leg's INVITE got a response: 1xx (ringing), 2xx (answered), 3xx-6xx (failed); status 0 with a
    reason: the dial could not be placed at all."""

    status: int
    reason: str = ""
    refer_to: str = ""  # with the 2xx: the Refer-To that replaces the target's dialog (sip/core/replaces.py)


@dataclass(frozen=True, slots=True)
class TargetDigit:
    digit: str


@dataclass(frozen=True, slots=True)
class BriefingSpoken:
    """The briefing has been played to the human (the second session's first answer has been heard)."""


@dataclass(frozen=True, slots=True)
class TargetHungUp:
    status: int = 0  # a BYE: 0


@dataclass(frozen=True, slots=True)
class CallerHungUp:
    pass


@dataclass(frozen=True, slots=True)
class SessionEnded:
    """The caller's session ended for another reason (the application, a failure, the time limit)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ReferProgress:
    """A report on the caller's REFER with Replaces (sip/leg.py `TransferProgress`): the NOTIFY sipfrag's
    status, or the REFER's error response; `final` for its outcome."""

    status: int
    reason: str
    final: bool


WarmEvent = (
    TargetProgress | TargetDigit | BriefingSpoken | TargetHungUp | CallerHungUp | SessionEnded | ReferProgress
)


# --- actions (outputs) ---
@dataclass(frozen=True, slots=True)
class HoldCaller:
    """The caller's line is held for the transfer: hold music plays, the caller's audio stops reaching the
    provider, the model is not heard."""


@dataclass(frozen=True, slots=True)
class DialTarget:
    target: str
    ring_timeout_ms: int


@dataclass(frozen=True, slots=True)
class SendTargetDigits:
    digits: str


@dataclass(frozen=True, slots=True)
class BriefTarget:
    """Start the briefing on the target's leg: `text` is the second session's instructions."""

    text: str


@dataclass(frozen=True, slots=True)
class DropTarget:
    """End the target leg: CANCEL when it was not answered (`answered` False), BYE when it was."""

    answered: bool
    reason: str


@dataclass(frozen=True, slots=True)
class ReferCaller:
    """The human accepted: the briefing stops (the AI leaves the target's leg) and the caller is sent a REFER
    whose Refer-To, `refer_to`, replaces the target's dialog with the bridge (RFC 5589 §7)."""

    refer_to: str


@dataclass(frozen=True, slots=True)
class JoinLegs:
    """The human accepted: relay media between the caller's and the target's legs; the AI leaves."""


@dataclass(frozen=True, slots=True)
class ReleaseCaller:
    """Hold music stops; the caller is back with the model."""


@dataclass(frozen=True, slots=True)
class HangUpCaller:
    """The joined target hung up: the caller's leg is ended too."""

    reason: str


@dataclass(frozen=True, slots=True)
class Outcome:
    result: TransferResult


WarmAction = (
    HoldCaller
    | DialTarget
    | SendTargetDigits
    | BriefTarget
    | DropTarget
    | ReferCaller
    | JoinLegs
    | ReleaseCaller
    | HangUpCaller
    | Outcome
)


def final_outcome(status: int) -> str:
    """The typed reason of a final failure status of the target's INVITE."""
    if status in (408, 480):
        return NO_ANSWER
    if status in (486, 600):
        return BUSY
    if status == 603:
        return DECLINED
    return FAILED


def briefing(brief: str | None, utterances: list[tuple[str, str]], *, limit: int = 12) -> str:
    """The second session's instructions: the application's brief, or a summary of the call's last utterances
    (`(role, text)` pairs, "caller" or "assistant"), bounded."""
    lead = (
        "You are calling a colleague to hand over a phone call. Greet them, tell them in two or three "
        "sentences what the caller needs, then ask them to press 1 to take the call, or hang up to refuse. "
    )
    if brief:
        return lead + "What to tell them: " + brief.strip()
    lines = [f"{role}: {text.strip()}" for role, text in utterances[-limit:] if text.strip()]
    if not lines:
        return lead + "Nothing was said on the call yet: say that a caller is waiting."
    return lead + "The call so far:\n" + "\n".join(lines)


HOLDER = "transfer"  # the warm transfer's hold of the caller's line (bridge/engine/reservoir.py `Line`)


class SessionSide(Protocol):
    """What of the session core (bridge/engine/coordinator.py) a warm transfer uses."""

    def hold(self, now: int, by: str = ...) -> None: ...

    def resume(self, now: int, by: str = ...) -> None: ...

    def transfer_progress(
        self, status: int, reason: str, final: bool, now: int, outcome: str = ...
    ) -> None: ...


def caller_side(core: SessionSide, actions: list[WarmAction], now: int) -> list[WarmAction]:
    """Carry out on the session core what is its part: the line held for the transfer (S7: the provider hears
    nothing, the model is not heard, results wait) and released, and the one outcome told to the model (its
    tool's answer, or an update for the application's transfer). Returns the actions, all of them, for the
    shell (hold music, the target leg, the relay, the application's result)."""
    for action in actions:
        if isinstance(action, HoldCaller):
            core.hold(now, by=HOLDER)
        elif isinstance(action, ReleaseCaller):
            core.resume(now, by=HOLDER)
        elif isinstance(action, Outcome):
            done = action.result
            core.transfer_progress(done.status, done.reason, True, now, done.outcome)
    return actions


class WarmTransfer:
    """One warm transfer's state machine (see the module's docstring)."""

    def __init__(
        self,
        target: str,
        brief_text: str,
        now: int,
        options: WarmOptions,
        digits: str = "",
        *,
        caller_replaces: bool = False,
    ) -> None:
        self.target = target
        self.options = options
        self.brief_text = brief_text  # the briefing session's instructions
        self._digits = digits
        self._started = now
        self.state = WarmState.DIALING
        self.status = 0  # the last status the target leg gave
        self.result: TransferResult | None = None
        self._deadline: int | None = now + options.ring_timeout_ms * NS_PER_MS
        self._caller_gone = False
        self._target_gone = False
        self._caller_replaces = caller_replaces  # the caller's side takes a REFER with Replaces
        self._refer_to = ""  # the target's: the Refer-To that replaces its dialog
        self.join = ""  # JOIN_REPLACES or JOIN_RELAY once joined

    def start(self) -> list[WarmAction]:
        return [HoldCaller(), DialTarget(self.target, self.options.ring_timeout_ms)]

    @property
    def active(self) -> bool:
        """Not decided yet: a second transfer is refused meanwhile."""
        return self.state not in (WarmState.JOINED, WarmState.UNDONE)

    @property
    def answered(self) -> bool:
        return self.state in (WarmState.BRIEFING, WarmState.AWAITING, WarmState.JOINING, WarmState.JOINED)

    @property
    def lingering(self) -> bool:
        """Joined by Replaces and the target has not ended its replaced leg yet (the bounded wait)."""
        return self.join == JOIN_REPLACES and not self._target_gone

    def next_deadline(self) -> int | None:
        return self._deadline if self.active or self.lingering else None

    def handle_timer(self, now: int) -> list[WarmAction]:
        if self._deadline is None or now < self._deadline:
            return []
        if self.lingering:  # the target kept the dialog it replaced: the bridge ends it
            self._deadline = None
            self._target_gone = True
            return [DropTarget(True, "the replaced leg was not ended by the target")]
        if not self.active:
            return []
        if self.state is WarmState.JOINING:
            return self._refer_failed(f"no REFER outcome within {self.options.join_timeout_ms} ms", now)
        if self.answered:
            return self._undo(NO_DECISION, "no decision in time", now)
        return self._undo(NO_ANSWER, "no answer in time", now)

    def handle(self, event: WarmEvent, now: int) -> list[WarmAction]:
        if self.state is WarmState.JOINED:
            return self._joined(event)
        if self.state is WarmState.UNDONE:
            return []
        if self.state is WarmState.JOINING:
            return self._joining(event, now)
        if isinstance(event, ReferProgress):
            return []  # (no REFER of ours is in progress)
        if isinstance(event, TargetProgress):
            return self._progress(event, now)
        if isinstance(event, TargetDigit):
            if not self.answered:
                return []
            if event.digit == self.options.accept_digit:
                return self._join(now)
            if event.digit == self.options.refuse_digit:
                return self._undo(REFUSED, "the target refused (keyed)", now)
            return []
        if isinstance(event, BriefingSpoken):
            if self.state is WarmState.BRIEFING:
                self.state = WarmState.AWAITING
            return []
        if isinstance(event, TargetHungUp):
            self._target_gone = True
            if event.status:
                self.status = event.status
            if self.answered:
                return self._undo(REFUSED, "the target hung up", now)
            return self._undo(FAILED, "the target leg ended", now)
        if isinstance(event, CallerHungUp):
            self._caller_gone = True
            return self._undo(CALLER_HUNG_UP, "the caller hung up first", now)
        return self._undo(SESSION_ENDED, event.reason, now)

    def _progress(self, event: TargetProgress, now: int) -> list[WarmAction]:
        status = event.status
        if 100 < status < 200:
            self.status = status
            if self.state is WarmState.DIALING:
                self.state = WarmState.RINGING
            return []
        if 200 <= status < 300:
            if self.answered:
                return []  # a retransmitted 2xx
            self.status = status
            self._refer_to = event.refer_to
            self.state = WarmState.BRIEFING
            self._deadline = now + self.options.accept_timeout_ms * NS_PER_MS
            actions: list[WarmAction] = []
            if self._digits:
                actions.append(SendTargetDigits(self._digits))
            actions.append(BriefTarget(self.brief_text))
            return actions
        if status >= 300 or status == 0:
            if self.answered:
                return []  # (a late final response after the answer changes nothing)
            self.status = status
            self._target_gone = True
            reason = event.reason or ("the dial failed" if status == 0 else f"the target answered {status}")
            return self._undo(final_outcome(status), reason, now)
        return []  # 100 Trying: the next hop, not the target

    def _join(self, now: int) -> list[WarmAction]:
        if self._caller_replaces and self._refer_to:
            self.state = WarmState.JOINING
            self._deadline = now + self.options.join_timeout_ms * NS_PER_MS
            return [ReferCaller(self._refer_to)]
        return self._relay("the target accepted", now)

    def _relay(self, reason: str, now: int) -> list[WarmAction]:
        self.state = WarmState.JOINED
        self.join = JOIN_RELAY
        self._deadline = None
        return [JoinLegs(), self._outcome(ACCEPTED, reason, now)]

    def _joining(self, event: WarmEvent, now: int) -> list[WarmAction]:
        """The REFER with Replaces is out: its outcome decides the join (see the module's docstring)."""
        if isinstance(event, ReferProgress):
            if not event.final and event.status < 200:
                return []  # 100 Accepted, a 1xx sipfrag: the caller is working on it
            if 200 <= event.status < 300:
                self.state = WarmState.JOINED
                self.join = JOIN_REPLACES
                self._caller_gone = True
                self._deadline = (
                    None if self._target_gone else now + self.options.replaced_wait_ms * NS_PER_MS
                )
                return [
                    HangUpCaller(REPLACED),  # (the transfer machinery's BYE already, where it sends one)
                    self._outcome(ACCEPTED, "the target accepted; the caller replaced the bridge", now),
                ]
            return self._refer_failed(f"REFER with Replaces: {event.status} {event.reason}".strip(), now)
        if isinstance(event, TargetHungUp):
            self._target_gone = True  # the target ends the leg it replaced: the REFER's outcome decides
            return []
        if isinstance(event, CallerHungUp):
            self._caller_gone = True
            return self._undo(CALLER_HUNG_UP, "the caller hung up during the join", now)
        if isinstance(event, SessionEnded):
            return self._undo(SESSION_ENDED, event.reason, now)
        return []  # the human's keys, a late response: the join is under way

    def _refer_failed(self, why: str, now: int) -> list[WarmAction]:
        if self._target_gone:  # nothing to relay to
            return self._undo(FAILED, f"the target's leg ended during the join ({why})", now)
        return self._relay(f"the target accepted; {why}: media relayed", now)

    def _joined(self, event: WarmEvent) -> list[WarmAction]:
        """After the join the bridge only relays (either side's hang-up ends the other), or, joined by Replaces,
        waits for the target to end the leg it replaced."""
        if self.join == JOIN_REPLACES:
            if isinstance(event, TargetHungUp):
                self._target_gone = True
                self._deadline = None
            return []
        if isinstance(event, TargetHungUp) and not self._target_gone:
            self._target_gone = True
            return [] if self._caller_gone else [HangUpCaller("the transfer target hung up")]
        if isinstance(event, CallerHungUp) and not self._caller_gone:
            self._caller_gone = True
            return [] if self._target_gone else [DropTarget(True, "the caller hung up")]
        return []

    def _undo(self, outcome: str, reason: str, now: int) -> list[WarmAction]:
        answered = self.answered
        self.state = WarmState.UNDONE
        self._deadline = None
        actions: list[WarmAction] = []
        if not self._target_gone:
            self._target_gone = True
            actions.append(DropTarget(answered, reason))
        if not self._caller_gone:
            actions.append(ReleaseCaller())
        actions.append(self._outcome(outcome, reason, now))
        return actions

    def _outcome(self, outcome: str, reason: str, now: int) -> Outcome:
        elapsed = max(0, (now - self._started) // NS_PER_MS)
        self.result = TransferResult(self.target, outcome, self.status, reason, elapsed, self.join)
        return Outcome(self.result)
