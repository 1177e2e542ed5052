"""One call's session shell: the call leg and one provider connection around a `SessionCoordinator`.

The shell only moves things: caller frames and provider events go into the coordinator with `now`; the
commands it pulls go to the provider; its notices go to the log; its one timer is re-armed after every input.
All rules live in bridge/coordinator.py.

The call rings (180) while the provider session starts and is answered (200) once it has; a provider that
cannot be reached gets the caller a 503 instead of a silent call. The session ends when either side does: a
caller BYE closes the provider session (waiting briefly for its final usage); a provider close or a fatal
protocol error hangs up the call with the reason logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from bridge.coordinator import (
    BargedIn,
    CancelResponse,
    ConditionDetected,
    CoordinatorOptions,
    SendAudio,
    SessionCoordinator,
    Transcript,
    Truncate,
    TurnEnded,
)
from bridge.reservoir import OutputOverflow
from providers.base import Provider, ProviderUnavailable
from providers.events import ProviderError, ProviderEvent, SessionClosed, ToolCallRequested
from sip.leg import CallEnded, CallLeg, DtmfReceived, FrameReceived, LegEvent, MediaHeld, MediaResumed, MediaStarted

log = logging.getLogger("parlora.session")

_LEG_DRAIN_TIMEOUT_S = 5.0
_PROVIDER_CLOSE_TIMEOUT_S = 2.0  # how long a finished call waits for the provider's final usage


@dataclass(frozen=True, slots=True)
class CallSummary:
    """What the end-of-call log line says."""

    call_id: str
    duration_s: float
    frames_in: int
    frames_out: int
    ended_by: str  # "caller", "bridge" or "provider"
    reason: str
    usage_seconds: float | None


class CallSession:
    """Runs one call to completion. `run()` returns when the call leg has ended."""

    def __init__(
        self,
        leg: CallLeg,
        provider: Provider,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        options: CoordinatorOptions | None = None,
    ) -> None:
        self.leg = leg
        self.provider = provider
        self._clock = clock
        self._options = options
        self.started_ns = clock()
        self.coordinator: SessionCoordinator | None = None
        self._ended: CallEnded | None = None
        self._end_reason = ""
        self._ended_by = ""
        self._provider_done = False
        self.frames_in = 0

    @property
    def call_id(self) -> str:
        return self.leg.identity.call_id

    def status(self) -> dict[str, Any]:
        """`status()` of the session (SE7): identity, state and the coordinator's view."""
        ident = self.leg.identity
        now = self._clock()
        body: dict[str, Any] = {
            "call_id": ident.call_id,
            "from": ident.from_uri,
            "to": ident.to_uri,
            "called": ident.request_user,
            "source": ident.source,
            "provider": self.provider.name,
            "duration_ms": (now - self.started_ns) // 1_000_000,
        }
        if self.coordinator is None:
            body["state"] = "closed" if self._ended else "connecting"
        else:
            body.update(self.coordinator.status(now))
            if self._ended is not None:
                body["state"] = "closed"
            elif self._provider_done:
                body["state"] = "closing"
        return body

    async def run(self) -> CallSummary:
        ident = self.leg.identity
        log.info("call %s started: from %s to %s (source %s)", ident.call_id, ident.from_uri, ident.to_uri, ident.source)
        try:
            started = await self.provider.connect()
        except ProviderUnavailable as exc:
            # Not answered yet: the caller gets 503 rather than a call that cannot talk.
            self._hangup("bridge", f"provider unavailable: {exc}")
            await self._drain_leg()
        else:
            self.coordinator = SessionCoordinator(
                limits=self.provider.limits,
                output_format=self.provider.output_format,
                capabilities=self.provider.capabilities,
                channel=self.leg,
                now=self.started_ns,
                token=self.provider.token,
                options=self._options,
            )
            self.coordinator.provider_event(started, self._clock())
            self.leg.answer()
            await self._bridge()
        summary = self._summary()
        log.info(
            "call %s ended after %.2f s by %s (%s): frames in %d, out %d, provider usage %s",
            summary.call_id,
            summary.duration_s,
            summary.ended_by,
            summary.reason,
            summary.frames_in,
            summary.frames_out,
            "unknown" if summary.usage_seconds is None else f"{summary.usage_seconds:g} s",
        )
        return summary

    async def _bridge(self) -> None:
        assert self.coordinator is not None
        coordinator = self.coordinator
        inbox: asyncio.Queue[LegEvent | ProviderEvent | None] = asyncio.Queue()
        readers = [
            asyncio.create_task(_pump(self.leg.events(), inbox), name=f"{self.call_id}-leg"),
            asyncio.create_task(_pump(self.provider.events(), inbox), name=f"{self.call_id}-provider"),
        ]
        loop = asyncio.get_running_loop()
        close_deadline: float | None = None
        try:
            while True:
                deadline = coordinator.next_deadline()
                now = self._clock()
                timeout = None if deadline is None else max(0.0, (deadline - now) / 1e9)
                if close_deadline is not None:
                    left = max(0.0, close_deadline - loop.time())
                    timeout = left if timeout is None else min(timeout, left)
                try:
                    item = await asyncio.wait_for(inbox.get(), timeout)
                except TimeoutError:
                    if close_deadline is not None and loop.time() >= close_deadline:
                        break
                    coordinator.handle_timer(self._clock())
                else:
                    if self._handle(item):
                        if self._ended is not None and self._provider_done:
                            break
                        if self._ended is not None and close_deadline is None:
                            self.provider.request_close()  # the call is over: ask for the final usage
                            close_deadline = loop.time() + _PROVIDER_CLOSE_TIMEOUT_S
                        elif self._provider_done and close_deadline is None:
                            close_deadline = loop.time() + _LEG_DRAIN_TIMEOUT_S
                self._carry_out()
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            await self.provider.close()

    def _handle(self, item: LegEvent | ProviderEvent | None) -> bool:
        """Feed one input to the coordinator; True when one side has just ended."""
        assert self.coordinator is not None
        now = self._clock()
        if isinstance(item, FrameReceived):
            self.frames_in += 1
            self.coordinator.caller_frame(item.pcm, now)
            return False
        if isinstance(item, CallEnded):
            self._ended = item
            if item.by_remote:
                self._ended_by, self._end_reason = "caller", f"{item.status_code} {item.reason}"
            elif not self._ended_by:
                self._ended_by, self._end_reason = "bridge", item.reason
            return True
        if isinstance(item, MediaStarted):
            log.info("call %s media: %s", self.call_id, item.codec)
            return False
        if item is None:  # a reader ended; its side's end arrives (or arrived) as an event
            return False
        if isinstance(item, (MediaHeld, MediaResumed, DtmfReceived)):
            log.info("call %s %s", self.call_id, item)  # not acted on yet
            return False
        self.coordinator.provider_event(item, now)
        if isinstance(item, ProviderError) and item.fatal:
            self._provider_done = True
            self._hangup("provider", f"protocol error {item.code}: {item.message}")
            return True
        if isinstance(item, SessionClosed):
            self._provider_done = True
            self._hangup("provider", f"provider session closed: {item.reason}")
            return True
        return False

    def _carry_out(self) -> None:
        assert self.coordinator is not None
        for command in self.coordinator.commands():
            if isinstance(command, SendAudio):
                if not self._provider_done:
                    self.provider.send_audio(command.pcm16_8k)
            elif isinstance(command, Truncate):
                self.provider.truncate(command.item_id, command.audio_end_ms)
            elif isinstance(command, CancelResponse):
                self.provider.cancel_response()
        for notice in self.coordinator.notices():
            self._log_notice(notice)

    def _log_notice(self, notice: object) -> None:
        cid = self.call_id
        if isinstance(notice, ConditionDetected):
            log.warning("call %s %s at %d ms: %s", cid, _condition_name(notice.condition), notice.at_ms, notice.condition)
        elif isinstance(notice, BargedIn):
            level = logging.INFO if notice.cleared_ms else logging.DEBUG
            reaction = "n/a" if notice.last_frame_ms is None else f"{notice.last_frame_ms:+.1f} ms"
            log.log(level, "call %s barge-in (%s) at %d ms: cleared %d ms of output; heard %s; last assistant frame "
                    "left %s from the event", cid, notice.source, notice.at_ms, notice.cleared_ms,
                    list(notice.heard) or "nothing interrupted", reaction)
        elif isinstance(notice, TurnEnded):
            log.debug("call %s caller turn ended at %d ms", cid, notice.at_ms)
        elif isinstance(notice, Transcript):
            log.debug("call %s %s (%d ms): %s", cid, notice.role, notice.at_ms, notice.text)
        elif isinstance(notice, ProviderError) and not notice.fatal:
            log.warning("call %s provider error %s: %s", cid, notice.code, notice.message)
        elif isinstance(notice, ToolCallRequested):
            log.info("call %s tool call %s (%s) — no application handler yet", cid, notice.name, notice.call_id)

    def _hangup(self, by: str, reason: str) -> None:
        if self._ended is None and not self._ended_by:
            self._ended_by, self._end_reason = by, reason
            log.warning("call %s: %s; hanging up", self.call_id, reason)
            self.leg.hangup(reason[:100])

    async def _drain_leg(self) -> None:
        try:
            async with asyncio.timeout(_LEG_DRAIN_TIMEOUT_S):
                async for event in self.leg.events():
                    if isinstance(event, CallEnded):
                        self._ended = event
        except TimeoutError:
            pass

    def _summary(self) -> CallSummary:
        ended = self._ended
        usage = self.coordinator.usage.audio_seconds if self.coordinator else None
        return CallSummary(
            call_id=self.call_id,
            duration_s=(self._clock() - self.started_ns) / 1e9,
            frames_in=self.frames_in,
            frames_out=self.leg.ledger.frames_transmitted,
            ended_by=self._ended_by or "unknown",
            reason=self._end_reason or (f"{ended.status_code} {ended.reason}" if ended else "unknown"),
            usage_seconds=usage,
        )


def _condition_name(condition: object) -> str:
    return "output_overflow" if isinstance(condition, OutputOverflow) else "output_stale"


async def _pump(source: AsyncIterator[Any], inbox: asyncio.Queue[Any]) -> None:
    async for item in source:
        inbox.put_nowait(item)
    inbox.put_nowait(None)
