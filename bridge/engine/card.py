"""Payment-card mode: digits the caller keys in, collected by the bridge itself and handed to the application only.

While a collection runs (`CardCollector`, one at a time per call):
- the caller's audio is withheld from the provider: the session shell's frame path (bridge/server/session.py
  `CallerFrames.card`) counts each frame here instead of giving it to the coordinator, so no caller frame reaches
  any connection, the local VAD starts no turn and the provider's clock does not run. At the end the stretch is
  one input `audio_discontinuity` with cause `card_collection` (`discontinuity`), as a repair reports what it
  discarded (HR8): the provider is never sent made-up frames for the time it did not hear, and S1 accounts for
  anything the caller said meanwhile. In-band DTMF (tones in the audio) is withheld with the rest of the audio;
  what is collected are the RFC 4733 telephone-events (and SIP INFO digits) the leg reports as `DtmfReceived`.
- the call's recording is paused (a gap of silence, bridge/server/recording.py), and the assistant's audio still
  plays (its prompt: "please key in your card number, then the hash key").
- the digits go to the collector only: not to the application's `dtmf` handler, the model (`dtmf_to_model`), the
  webhook, the call record, a log line, a metric label or a transcript. `CardResult.digits` is left out of its
  repr, so a result logged by mistake still shows none.

Where the rules are silent, chosen as a caller keying in a card would want:
- digits are 0-9; the terminator (default "#") ends the entry; any other key (`*`, A-D) is ignored, never
  collected. `max_digits` digits end it without the terminator.
- the terminator with fewer than `min_digits` digits is `invalid` (the model may ask again).
- `digit_timeout_ms` after the last digit (or after the start, for the first) with at least `min_digits` digits:
  `collected` (callers forget the hash key); with fewer: `timeout`. `timeout_ms` after the start: `timeout`
  whatever was keyed (the caller did not finish).
- the application or the model may cancel (`cancelled`); the caller hanging up or the session ending is
  `hangup`. A second collection while one runs is `refused` and changes nothing.
- the model is told the outcome only (`model_answer`): never a digit, nor how many.

Sans-I/O: every call takes `now` (monotonic ns); `next_deadline()` says when `handle_timer` is due.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from bridge.engine.commands import AudioDiscontinuity
from rtp.units import NS_PER_MS

CardOutcome = Literal["collected", "timeout", "invalid", "cancelled", "hangup", "refused"]
CARD_DIGITS = frozenset("0123456789")
CARD_CAUSE = "card_collection"  # the input discontinuity's cause
_FRAME_MS = 20


@dataclass(frozen=True, slots=True)
class CardOptions:
    """One collection's shape. The defaults fit a card number (ISO/IEC 7812: 12 to 19 digits)."""

    min_digits: int = 12
    max_digits: int = 19
    terminator: str = "#"
    digit_timeout_ms: int = 10_000  # after the start (the first digit) or the last digit
    timeout_ms: int = 90_000  # the whole entry
    reference: str | None = None  # the application's own token for this collection, given back in the result

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits <= 64:
            raise ValueError("card digits: 1 <= min_digits <= max_digits <= 64")
        if self.terminator not in ("#", "*", ""):
            raise ValueError("card terminator: '#', '*' or '' (none)")
        if self.digit_timeout_ms <= 0 or self.timeout_ms <= 0:
            raise ValueError("card timeouts must be positive")


@dataclass(frozen=True, slots=True)
class CardResult:
    """How a collection ended. `digits` (empty unless `collected`) is for the application alone: it is left out
    of the repr, and nothing in the bridge writes it anywhere."""

    outcome: CardOutcome
    digits: str = field(default="", repr=False)
    reference: str | None = None
    started_ms: int = 0  # on the session timeline (the recording's clock too)
    ended_ms: int = 0
    by: str = ""  # who started it: "application" or "model"


@dataclass(frozen=True, slots=True)
class CardEnded:
    """A notice for the record and the log: that a collection happened and how it ended; no digit, no count."""

    outcome: CardOutcome
    started_ms: int
    ended_ms: int
    by: str


def model_answer(result: CardResult) -> str:
    """What the model is told: the outcome only."""
    return json.dumps({"outcome": result.outcome})


class CardCollector:
    """One collection (see the module docstring). `result` is set once it has ended."""

    __slots__ = ("options", "by", "withheld", "result", "_digits", "_start", "_at_ms", "_last", "_ns")

    def __init__(self, options: CardOptions, now: int, at_ms: int, by: str) -> None:
        self.options, self.by = options, by
        self.withheld = 0  # caller frames kept from the provider (20 ms each)
        self.result: CardResult | None = None
        self._digits: list[str] = []
        self._start = self._last = now
        self._at_ms = at_ms  # the start on the session timeline
        self._ns = NS_PER_MS

    def digit(self, digit: str, now: int, at_ms: int) -> CardResult | None:
        """A key the caller pressed: collected, or ending the entry. Taken whatever it is (never passed on)."""
        if self.result is not None:
            return None
        o = self.options
        if digit in CARD_DIGITS:
            self._digits.append(digit)
            self._last = now
            if len(self._digits) >= o.max_digits:
                return self._end("collected", at_ms)
        elif o.terminator and digit == o.terminator:
            return self._end("collected" if len(self._digits) >= o.min_digits else "invalid", at_ms)
        return None

    def next_deadline(self) -> int | None:
        if self.result is not None:
            return None
        o = self.options
        return min(self._last + o.digit_timeout_ms * self._ns, self._start + o.timeout_ms * self._ns)

    def handle_timer(self, now: int, at_ms: int) -> CardResult | None:
        if self.result is not None:
            return None
        o = self.options
        if now >= self._start + o.timeout_ms * self._ns:
            return self._end("timeout", at_ms)
        if now >= self._last + o.digit_timeout_ms * self._ns:
            return self._end("collected" if len(self._digits) >= o.min_digits else "timeout", at_ms)
        return None

    def end(self, outcome: CardOutcome, at_ms: int) -> CardResult | None:
        """Cancelled by the application or the model, or the call is gone (`hangup`); None when already over."""
        return None if self.result is not None else self._end(outcome, at_ms)

    def discontinuity(self) -> AudioDiscontinuity | None:
        """The caller frames withheld, as one input discontinuity at the end (None: none came, or still on)."""
        if self.result is None or not self.withheld:
            return None
        return AudioDiscontinuity("input", self.withheld, CARD_CAUSE, self.result.ended_ms)

    def _end(self, outcome: CardOutcome, at_ms: int) -> CardResult:
        digits = "".join(self._digits) if outcome == "collected" else ""
        self._digits.clear()
        self.result = CardResult(outcome, digits, self.options.reference, self._at_ms, at_ms, self.by)
        return self.result

    @property
    def notice(self) -> CardEnded | None:
        r = self.result
        return None if r is None else CardEnded(r.outcome, r.started_ms, r.ended_ms, r.by)
