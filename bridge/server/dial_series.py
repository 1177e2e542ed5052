"""The asyncio shell of bridge/engine/dial_retry.py: one dial's attempt series in the server — its timer, the
next attempt placed through the server's own dial path (calling hours, do-not-call, the trunk's queue, each
checked again), and its rows in the call records and the CDR."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from bridge.engine.dial_retry import DialSeries, Final, Retry
from rtp.units import NS_PER_S

log = logging.getLogger("parlora")


class DoNotCall(ValueError):
    """Raised by `Application.check_outbound` for a number the application may not call (a do-not-call list):
    nothing is sent, the refusal is a row of the CDR (reason `do_not_call`), `POST /calls` answers 403."""


class SeriesRun:
    """One dial's series (`request`: what each attempt dials). `redial(run)` places its next attempt when it is
    due; `finished(run)` once, at its end."""

    def __init__(
        self,
        core: DialSeries,
        request: Any,
        *,
        redial: Callable[[SeriesRun], None],
        finished: Callable[[SeriesRun], None],
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.core = core
        self.request = request
        self._redial, self._finished, self._clock = redial, finished, clock
        self._handle: asyncio.TimerHandle | None = None
        self._done = False
        self._told: set[str] = set()  # attempts whose end was told

    @property
    def id(self) -> str | None:
        return self.core.id

    def attempt_ended(self, call_id: str, status: int, answered: bool, reason: str) -> dict[str, Any]:
        """Attempt `call_id` is over (told again: the same answer); what its call record says of the series."""
        if call_id in self._told:
            return self.record(call_id)
        self._told.add(call_id)
        decision = self.core.ended(call_id, status, answered, reason, self._clock())
        if isinstance(decision, Retry):
            self._arm()
            log.info(
                "dial %s: attempt %d of %d %s; attempt %d in %.0f s",
                self.id,
                decision.attempt - 1,
                self.core.policy.attempts,
                self.core.attempts[decision.attempt - 2].outcome,
                decision.attempt,
                (decision.at - self._clock()) / NS_PER_S,
            )
        else:
            self._end()
        return self.record(call_id)

    def refused(self, reason: str, detail: str) -> Final:
        final = self.core.refused(reason, detail)
        self._end()
        return final

    def cancel(self, reason: str) -> None:
        """No further attempt (a hang-up from the API, a drain, a stop); one under way ends as it ends."""
        if self.core.cancel(reason) is not None:
            self._end()

    def record(self, call_id: str) -> dict[str, Any]:
        """An attempt's line in its call record: its number, outcome, and the next attempt or the end."""
        core = self.core
        attempt = next((a for a in core.attempts if a.call_id == call_id), None)
        body: dict[str, Any] = {
            "series": core.id,
            "attempt": attempt.n if attempt is not None else None,
            "max_attempts": core.policy.attempts,
            "outcome": attempt.outcome if attempt is not None else None,
        }
        if core.final is not None and attempt is not None and attempt.n == len(core.attempts):
            body["final"] = {"outcome": core.final.outcome, "reason": core.final.reason}
        elif (at := core.next_deadline()) is not None:
            body["next_attempt_in_s"] = round(max(0, at - self._clock()) / NS_PER_S, 3)
        return body

    def _arm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        due = self.core.next_deadline()
        if due is None:
            return
        loop = asyncio.get_running_loop()
        self._handle = loop.call_at(loop.time() + max(0, due - self._clock()) / NS_PER_S, self._fire)

    def _fire(self) -> None:
        self._handle = None
        if self.core.handle_timer(self._clock()) is not None:
            self._redial(self)
        else:
            self._arm()

    def _end(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self._done and self.core.final is not None:
            self._done = True
            self._finished(self)
