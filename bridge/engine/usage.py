"""Provider usage across every transport of a call (HR12).

Each transport reports its own usage (cumulative or in increments). Observed totals add up each transport's
latest audio seconds, including transports that were interrupted (quarantined, lost) before they finalised;
`complete` stays false once any transport ended without the provider finalising its usage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from providers.events import SessionClosed, UsageUpdated

TRANSPORTS_KEPT = 16  # bounded: transports whose latest usage is kept apart; older ones are folded in


@dataclass(slots=True)
class Usage:
    audio_seconds: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    complete: bool = False  # the provider confirmed final usage for every transport


class UsageMeter:
    def __init__(self) -> None:
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

    def observe(self, event: UsageUpdated | SessionClosed) -> None:
        """Usage of any transport counts, a quarantined one's too (HR12)."""
        totals = self.totals
        if event.token < self._folded_below and event.audio_seconds is not None:
            self.late_reports += 1  # its seconds are in the folded sum already (HR12)
            event = replace(event, audio_seconds=None)
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
            if event.cumulative:
                totals.input_tokens = event.input_tokens or totals.input_tokens
                totals.output_tokens = event.output_tokens or totals.output_tokens
            else:
                totals.input_tokens += event.input_tokens or 0
                totals.output_tokens += event.output_tokens or 0
        by_token = self._audio_by_token
        while len(by_token) > TRANSPORTS_KEPT:
            oldest = min(by_token)
            self._folded_seconds += by_token.pop(oldest)
            self._folded_below = max(self._folded_below, oldest + 1)
        if by_token:
            totals.audio_seconds = self._folded_seconds + sum(by_token.values())

    def status(self) -> dict[str, object]:
        t = self.totals
        return {
            "audio_seconds": t.audio_seconds,
            "input_tokens": t.input_tokens,
            "output_tokens": t.output_tokens,
            "complete": t.complete,
        }
