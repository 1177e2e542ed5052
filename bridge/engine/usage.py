"""Provider usage across every transport of a call (HR12), what it cost, and the route's budget.

Each transport reports its own usage (cumulative or in increments). Observed totals add up each transport's
latest audio seconds, including transports that were interrupted (quarantined, lost) before they finalised;
`complete` stays false once any transport ended without the provider finalising its usage.

The split (`parts`): every report's growth over that transport's previous one is counted in the part the
transport was in when the report came — `recovery` while it is a recovery's replacement whose repair is not
complete (seeded with the call's context, then its notice, HR7: what a repair replays and costs), `rollover`
while it is a rollover's next connection that has not taken the floor (its seed and the caller audio both
connections hear during the overlap, RO2, RO8), `conversation` otherwise. A provider reports usage per
response or as running totals, never per seeded item, so the split is as fine as its reports: usage it reports
after the hand-over, for a seed it took before, counts as conversation.

The price (`Pricing`, per provider: `[pricing.NAME]` in the config file) is audio minutes and tokens at the
table's rates, replay included, currency-less. A route's `budget`: when the running price reaches it, the
model is asked for a short goodbye and the call ends once it has played, as `LiveCall.say_goodbye` does, with
the end reason "budget" — once, and never after the caller hung up (`on_budget` is the session's: the
coordinator's rooms give it). No budget, no limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from providers.events import SessionClosed, UsageUpdated

BUDGET_REASON = "budget"  # the end reason of a call that reached its route's budget
BUDGET_NOTE = (  # what the model is told (a caller is not told about money)
    "This call has to end now. Tell the caller so politely in one short sentence and say goodbye."
)
Part = Literal["conversation", "recovery", "rollover"]
PARTS: tuple[Part, ...] = ("conversation", "recovery", "rollover")

TRANSPORTS_KEPT = 16  # bounded: transports whose latest usage is kept apart; older ones are folded in


@dataclass(slots=True)
class Usage:
    audio_seconds: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    complete: bool = False  # the provider confirmed final usage for every transport


@dataclass(frozen=True, slots=True)
class Pricing:
    """A provider's rates (currency-less): per minute of audio, per million input and output tokens."""

    audio_per_minute: float = 0.0
    input_tokens_per_million: float = 0.0
    output_tokens_per_million: float = 0.0

    def price(self, audio_seconds: float, input_tokens: int, output_tokens: int) -> float:
        return (
            audio_seconds / 60.0 * self.audio_per_minute
            + input_tokens / 1e6 * self.input_tokens_per_million
            + output_tokens / 1e6 * self.output_tokens_per_million
        )


@dataclass(slots=True)
class Share:
    """One part's usage (the module docstring)."""

    audio_seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0


class UsageMeter:
    def __init__(
        self,
        part: Callable[[int], Part] | None = None,
        pricing: Pricing | None = None,
        budget: float | None = None,
        on_budget: Callable[[int], None] | None = None,
    ) -> None:
        self._part = part
        self.pricing = pricing or Pricing()
        self.budget = budget
        self.on_budget = on_budget  # told once, with `now`, when the running price reaches the budget
        self.budget_reached = False
        self.parts: dict[Part, Share] = {p: Share() for p in PARTS}
        self._latest: dict[int, tuple[float, int, int]] = {}  # each recent transport's cumulative figures
        self.totals = Usage()
        self._audio_by_token: dict[
            int, float
        ] = {}  # latest cumulative audio seconds of each recent transport
        self._unfinalized = False  # some transport ended without the provider finalising its usage
        # Bounded: the oldest transports' latest audio seconds, summed once more than TRANSPORTS_KEPT have
        # reported (tokens only grow: the oldest is long closed). A report from a folded transport would count
        # it twice, so it is ignored and counted in `late_reports`.
        self._folded_seconds = 0.0
        self._folded_below = 0  # every token below this one is folded (or never reported)
        self.late_reports = 0

    def observe(self, event: UsageUpdated | SessionClosed, now: int = 0) -> None:
        """Usage of any transport counts, a quarantined one's too (HR12); its growth goes to its part, and the
        budget is checked against the running price."""
        totals = self.totals
        if event.token < self._folded_below and event.audio_seconds is not None:
            self.late_reports += 1  # its seconds are in the folded sum already (HR12)
            event = replace(event, audio_seconds=None)
        elif event.token >= self._folded_below:
            self._split(event)
        if isinstance(event, SessionClosed):
            if event.audio_seconds is not None:
                self._audio_by_token[event.token] = event.audio_seconds
            if not event.finalized:
                self._unfinalized = True
            totals.complete = event.finalized and not self._unfinalized
        else:
            if event.audio_seconds is not None:
                previous = self._audio_by_token.get(event.token, 0.0)
                self._audio_by_token[event.token] = (
                    event.audio_seconds if event.cumulative else previous + event.audio_seconds
                )
            # Tokens: each transport's latest running totals (or its increments) added up, as its audio is; a
            # second transport's running totals no longer replace the first's (HR12).
            totals.input_tokens = sum(part.input_tokens for part in self.parts.values())
            totals.output_tokens = sum(part.output_tokens for part in self.parts.values())
        by_token = self._audio_by_token
        while len(by_token) > TRANSPORTS_KEPT:
            oldest = min(by_token)
            self._folded_seconds += by_token.pop(oldest)
            self._folded_below = max(self._folded_below, oldest + 1)
        if by_token:
            totals.audio_seconds = self._folded_seconds + sum(by_token.values())
        budget = self.budget
        if budget is not None and not self.budget_reached and self.price() >= budget:
            self.budget_reached = True
            if self.on_budget is not None:
                self.on_budget(now)

    def _split(self, event: UsageUpdated | SessionClosed) -> None:
        """The report's growth over the transport's previous one, to the part it is in now."""
        seconds, tokens_in, tokens_out = self._latest.get(event.token, (0.0, 0, 0))
        grown_in = grown_out = 0
        grown_seconds = 0.0
        if isinstance(event, SessionClosed):
            if event.audio_seconds is not None:
                grown_seconds, seconds = (
                    max(event.audio_seconds - seconds, 0.0),
                    max(event.audio_seconds, seconds),
                )
        elif event.cumulative:
            if event.audio_seconds is not None:
                grown_seconds, seconds = (
                    max(event.audio_seconds - seconds, 0.0),
                    max(event.audio_seconds, seconds),
                )
            if event.input_tokens is not None:
                grown_in, tokens_in = (
                    max(event.input_tokens - tokens_in, 0),
                    max(event.input_tokens, tokens_in),
                )
            if event.output_tokens is not None:
                grown_out, tokens_out = (
                    max(event.output_tokens - tokens_out, 0),
                    max(event.output_tokens, tokens_out),
                )
        else:
            grown_seconds = event.audio_seconds or 0.0
            grown_in, grown_out = event.input_tokens or 0, event.output_tokens or 0
            seconds, tokens_in, tokens_out = (
                seconds + grown_seconds,
                tokens_in + grown_in,
                tokens_out + grown_out,
            )
        latest = self._latest
        latest.pop(event.token, None)
        latest[event.token] = (seconds, tokens_in, tokens_out)
        while len(latest) > TRANSPORTS_KEPT:  # bounded: the oldest transports are long closed
            del latest[next(iter(latest))]
        share = self.parts[self._part(event.token) if self._part is not None else "conversation"]
        share.audio_seconds += grown_seconds
        share.input_tokens += grown_in
        share.output_tokens += grown_out

    def price(self) -> float:
        """The call's running price at its provider's rates, replay included."""
        price = self.pricing.price
        return sum(price(s.audio_seconds, s.input_tokens, s.output_tokens) for s in self.parts.values())

    def cost_status(self) -> dict[str, object]:
        """The split and the price (`status()["cost"]`, the record's `cost`)."""
        return {
            "parts": {
                part: {
                    "audio_seconds": round(s.audio_seconds, 3),
                    "input_tokens": s.input_tokens,
                    "output_tokens": s.output_tokens,
                }
                for part, s in self.parts.items()
            },
            "price": round(self.price(), 6),
            "budget": self.budget,
            "budget_reached": self.budget_reached,
        }

    def status(self) -> dict[str, object]:
        t = self.totals
        return {
            "audio_seconds": t.audio_seconds,
            "input_tokens": t.input_tokens,
            "output_tokens": t.output_tokens,
            "complete": t.complete,
        }
