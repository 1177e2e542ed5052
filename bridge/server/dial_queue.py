"""The asyncio shell of bridge/engine/dial_limits.py: a dial awaits its start in its trunk's queue; one timer, re-armed
at the core's next deadline, answers the dials a token or a freed line lets start and refuses those whose wait is
over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bridge.engine.dial_limits import DialLimits, Refused, Start, Wait


class DialRefused(RuntimeError):
    """A dial refused before anything was sent: its trunk's queue was full, or its wait ran out."""

    def __init__(self, refused: Refused) -> None:
        trunk = f"trunk {refused.trunk}" if refused.trunk is not None else "calls with no trunk"
        why = (
            "its queue of dials is full"
            if refused.reason == "queue_full"
            else "the wait for its calls-per-second or concurrent-call limit ran out"
        )
        super().__init__(f"dial refused ({refused.reason}): {trunk}: {why}")
        self.refused = refused


class DialQueue:
    """`admit` a dial (its ticket once it may start), `ended` when its call is over (or its INVITE failed)."""

    def __init__(
        self,
        limits: DialLimits,
        clock: Callable[[], int] = time.monotonic_ns,
        count: Callable[[str | None, str], None] | None = None,
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._count = count or (lambda trunk, outcome: None)  # (trunk, outcome) for /metrics
        self._waiting: dict[int, tuple[str | None, asyncio.Future[Start | Refused]]] = {}
        self._handle: asyncio.TimerHandle | None = None

    async def admit(self, trunk: str | None) -> int:
        """Wait until a dial through `trunk` may start; its ticket. DialRefused when it may not."""
        answer = self.limits.request(trunk, self._clock())
        if isinstance(answer, Refused):
            self._count(trunk, f"refused_{answer.reason}")
            raise DialRefused(answer)
        if isinstance(answer, Start):
            self._count(trunk, "started")
            return answer.ticket
        assert isinstance(answer, Wait)
        self._count(trunk, "queued")
        future: asyncio.Future[Start | Refused] = asyncio.get_running_loop().create_future()
        self._waiting[answer.ticket] = (trunk, future)
        self._rearm()
        try:
            result = await future
        except asyncio.CancelledError:  # the caller gave up: its place (or its start) goes to the next
            self._waiting.pop(answer.ticket, None)
            self.ended(answer.ticket)
            raise
        if isinstance(result, Refused):
            raise DialRefused(result)
        return answer.ticket

    def ended(self, ticket: int) -> None:
        self._answer(self.limits.ended(ticket, self._clock()))

    def _answer(self, answers: list[Start | Wait | Refused]) -> None:
        for answer in answers:
            if isinstance(answer, Wait) or (waiting := self._waiting.pop(answer.ticket, None)) is None:
                continue
            trunk, future = waiting
            self._count(trunk, "started" if isinstance(answer, Start) else f"refused_{answer.reason}")
            if not future.done():
                future.set_result(answer)
        self._rearm()

    def _rearm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        deadline = self.limits.next_deadline()
        if deadline is None:
            return
        loop = asyncio.get_running_loop()
        self._handle = loop.call_at(loop.time() + max(0, deadline - self._clock()) / 1e9, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._answer(self.limits.handle_timer(self._clock()))
