"""A dial's attempts: when a call the bridge placed was busy or not answered, whether and when it is placed again
(sans-I/O: every call takes `now`, monotonic ns).

An outbound platform retries what a person would: the line was busy, nobody answered, the phone was off. It
never retries what the callee or the carrier meant: a decline, a wrong number, a refused caller id. The rules:

- `attempts` counts every attempt, the first included: 1 (the default) places one call and never retries.
  Retrying calls a person again, which only the operator may decide (a campaign's policy, the regulator's
  limits on repeated calls), so it is off until asked for; at most `MAX_ATTEMPTS`.
- Only the final statuses of `retry_on` are retried. Its classes: `busy` (486 Busy Here, 600 Busy Everywhere),
  `no_answer` (408: our ringing timeout, or nothing answered the INVITE at all; 480 Temporarily Unavailable,
  which carriers send for a phone that is off or does not answer), `unavailable` (500, 502, 503, 504: the
  trunk or the far end failed). The default is `busy` and `no_answer`: a trunk's 503 is usually its own
  overload or a calls-per-second cap, which the dial queue paces (bridge/engine/dial_limits.py), so it is
  retried only when the operator lists it. Never retried whatever the list says: 487 (we cancelled: a hang-up,
  the API, a drain), 603 Decline (the callee refused the call: calling again is what do-not-call rules
  forbid), 404/484/604 (no such number), 401/403/407 (the trunk refused us), and any attempt that was answered.
- The first retry waits `delay_s` after the failed attempt ended; each further one twice the one before, at
  most `MAX_DELAY_S` (a dialler's usual busy retry is minutes, a no-answer retry tens of minutes).
- One series, at most one answered call: an attempt starts only after the one before ended unanswered, and an
  answered attempt ends the series whatever happens after. An Idempotency-Key names the series (its first
  call): a repeat returns that call and never starts another series (bridge/server/idempotency.py).
- A cancel (a hang-up of the series from the API, a drain, the server stopping) ends it: no attempt follows.
- Each attempt is checked again as a first dial is (calling hours, the application's do-not-call hook, the
  trunk's queue): a refusal is the series' final outcome (`refused`), never postponed (calling_hours.py).

`DialSeries` is told `placed`, `ended`, `refused` and `cancel`; `next_deadline()` is when the next attempt is
due, and `handle_timer(now)` says whether it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rtp.units import NS_PER_S

MAX_ATTEMPTS = 10
MAX_DELAY_S = 3600.0
RETRY_CLASSES: dict[str, tuple[int, ...]] = {
    "busy": (486, 600),
    "no_answer": (408, 480),
    "unavailable": (500, 502, 503, 504),
}
RETRYABLE = frozenset(s for statuses in RETRY_CLASSES.values() for s in statuses)
DEFAULT_RETRY_ON = frozenset(RETRY_CLASSES["busy"] + RETRY_CLASSES["no_answer"])

Outcome = Literal["answered", "busy", "no_answer", "unavailable", "failed", "cancelled", "refused"]


def parse_retry_on(text: str) -> frozenset[int]:
    """`busy,no_answer` or `486,408,503` (classes and statuses mixed) as statuses; ValueError naming what cannot
    be retried."""
    out: set[int] = set()
    for part in (p.strip().lower() for p in text.split(",")):
        if part in RETRY_CLASSES:
            out.update(RETRY_CLASSES[part])
        elif part.isdigit() and int(part) in RETRYABLE:
            out.add(int(part))
        else:
            raise ValueError(
                f"{part!r}: retry_on takes {', '.join(RETRY_CLASSES)} or the statuses "
                f"{', '.join(map(str, sorted(RETRYABLE)))} (a decline, a wrong number or a cancel is never retried)"
            )
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """One route's (or `[outbound]`'s) retry policy (module docstring)."""

    attempts: int = 1
    retry_on: frozenset[int] = DEFAULT_RETRY_ON
    delay_s: float = 300.0

    def __post_init__(self) -> None:
        if not 1 <= self.attempts <= MAX_ATTEMPTS:
            raise ValueError(f"attempts must be 1 to {MAX_ATTEMPTS}, got {self.attempts}")
        if not self.retry_on <= RETRYABLE:
            raise ValueError(f"retry_on: {sorted(self.retry_on - RETRYABLE)} are never retried")
        if not 0 < self.delay_s <= MAX_DELAY_S:
            raise ValueError(f"delay_s must be above 0 and at most {MAX_DELAY_S:g}, got {self.delay_s}")

    def delay_ns(self, retry: int) -> int:
        """The wait before retry number `retry` (1: the second attempt)."""
        return int(min(self.delay_s * 2 ** (retry - 1), MAX_DELAY_S) * NS_PER_S)


def outcome_of(status: int, answered: bool) -> Outcome:
    """An attempt's outcome from its final SIP status (0: none known) and whether it was answered."""
    if answered:
        return "answered"
    if status == 487:
        return "cancelled"
    if status in RETRY_CLASSES["busy"]:
        return "busy"
    if status in RETRY_CLASSES["no_answer"]:
        return "no_answer"
    if status in RETRY_CLASSES["unavailable"]:
        return "unavailable"
    return "failed"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt: its call (None when it was refused before anything was sent), outcome and status."""

    n: int
    call_id: str | None
    outcome: Outcome | None = None  # None: still under way
    sip_status: int | None = None
    reason: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "attempt": self.n,
            "call_id": self.call_id,
            "outcome": self.outcome,
            "sip_status": self.sip_status,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Retry:
    """The series goes on: attempt `attempt` is due at `at`."""

    attempt: int
    at: int


@dataclass(frozen=True, slots=True)
class Final:
    """The series is over: its outcome is the last attempt's (or `cancelled`, `refused`)."""

    outcome: Outcome
    reason: str


Decision = Retry | Final


class DialSeries:
    """One dial's attempts (module docstring)."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.attempts: list[Attempt] = []
        self.state: Literal["dialling", "waiting", "done"] = "dialling"
        self.retry_at: int | None = None
        self.final: Final | None = None
        self._cancelled: str | None = None  # a cancel while an attempt was under way: none follows it

    @property
    def id(self) -> str | None:
        """The series' name: its first call's id (what the dial returned)."""
        return next((a.call_id for a in self.attempts if a.call_id is not None), None)

    @property
    def retries(self) -> int:
        return max(0, len(self.attempts) - 1)

    def placed(self, call_id: str) -> int:
        """The current attempt's INVITE went out as call `call_id`; its number."""
        self.attempts.append(Attempt(len(self.attempts) + 1, call_id))
        return len(self.attempts)

    def ended(self, call_id: str, status: int, answered: bool, reason: str, now: int) -> Decision:
        """Call `call_id` (an attempt) is over: the next attempt, or the series' end. Asked again for the same
        call, the same answer (nothing changes)."""
        index = next((i for i, a in enumerate(self.attempts) if a.call_id == call_id), None)
        if index is None:
            return self.final or Final("failed", "not an attempt of this series")
        attempt = self.attempts[index]
        if attempt.outcome is not None:  # told twice
            return self._decision()
        outcome = outcome_of(status, answered)
        self.attempts[index] = Attempt(attempt.n, call_id, outcome, status or None, reason)
        if self.state != "dialling" or index != len(self.attempts) - 1:
            return self._decision()
        if self._cancelled is not None and outcome != "answered":
            return self._finish("cancelled", self._cancelled)
        if (
            outcome in ("answered", "cancelled", "failed")
            or status not in self.policy.retry_on
            or len(self.attempts) >= self.policy.attempts
        ):
            return self._finish(outcome, reason)
        self.state = "waiting"
        self.retry_at = now + self.policy.delay_ns(len(self.attempts))
        return Retry(len(self.attempts) + 1, self.retry_at)

    def refused(self, reason: str, detail: str) -> Final:
        """The attempt under way was refused before anything was sent (its reason: `calling_hours`,
        `do_not_call`, `queue_full`, ...): the series ends."""
        if self.final is not None:
            return self.final
        self.attempts.append(Attempt(len(self.attempts) + 1, None, "refused", None, f"{reason}: {detail}"))
        return self._finish("refused", reason)

    def cancel(self, reason: str) -> Final | None:
        """No attempt follows: a waiting series ends now (its Final); one whose attempt is under way ends with
        that attempt (None now: its `ended` gives the Final). None too when it is over already."""
        if self.state == "done":
            return None
        if self.state == "waiting" or (self.attempts and self.attempts[-1].outcome is not None):
            return self._finish("cancelled", reason)  # (due, but not placed yet: none will be)
        self._cancelled = reason
        return None

    def next_deadline(self) -> int | None:
        return self.retry_at if self.state == "waiting" else None

    def handle_timer(self, now: int) -> int | None:
        """The next attempt's number when it is due now (the series is dialling again), else None."""
        if self.state != "waiting" or self.retry_at is None or now < self.retry_at:
            return None
        self.state, self.retry_at = "dialling", None
        return len(self.attempts) + 1

    def _decision(self) -> Decision:
        if self.final is not None:
            return self.final
        if self.state == "waiting" and self.retry_at is not None:
            return Retry(len(self.attempts) + 1, self.retry_at)
        return Final("failed", "under way")

    def _finish(self, outcome: Outcome, reason: str) -> Final:
        self.state, self.retry_at = "done", None
        self.final = Final(outcome, reason)
        return self.final

    def to_json(self) -> dict[str, object]:
        """The series as its CDR row and the call record list it."""
        final = self.final
        return {
            "series": self.id,
            "attempts": [a.to_json() for a in self.attempts],
            "max_attempts": self.policy.attempts,
            "outcome": None if final is None else final.outcome,
            "reason": None if final is None else final.reason,
        }
