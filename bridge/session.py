"""One call's session: the caller's leg joined to one provider connection, in both directions.

Inbound, each 20 ms caller frame goes to the provider adapter, which converts it and queues it on the socket. Outbound,
provider audio is cut into tagged 20 ms frames and queued on the leg's playout, which the SIP engine's media
clock drains (the bridge is the clock: nothing here sleeps to pace audio).

The call rings (180) while the provider session starts and is answered (200) once it has; a provider that
cannot be reached gets the caller a 503 instead of a silent call. The session ends when either side does: a caller BYE closes the provider session; a provider close or a fatal
protocol error hangs up the call with the reason logged. (Recovery and rollover, which keep the call up
through provider trouble, build on this in bridge/recovery.py and bridge/rollover.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from bridge.framing import OutputFramer
from providers.base import Provider, ProviderUnavailable
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputTranscript,
    ProviderError,
    ProviderEvent,
    SessionClosed,
    UsageUpdated,
)
from sip.leg import CallEnded, CallLeg, FrameReceived, MediaStarted

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
        self, leg: CallLeg, provider: Provider, *, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self.leg = leg
        self.provider = provider
        self._clock = clock
        self._framer = OutputFramer(provider.output_format)
        self._epoch = 0
        self.frames_in = 0
        self.usage_seconds: float | None = None
        self._ended: CallEnded | None = None
        self._end_reason = ""
        self._ended_by = ""

    async def run(self) -> CallSummary:
        ident = self.leg.identity
        started = self._clock()
        log.info("call %s started: from %s to %s (source %s)", ident.call_id, ident.from_uri, ident.to_uri, ident.source)
        try:
            await self.provider.connect()
        except ProviderUnavailable as exc:
            # Not answered yet: the caller gets 503 rather than a call that cannot talk.
            self._hangup("bridge", f"provider unavailable: {exc}")
            await self._drain_leg()
        else:
            self.leg.answer()
            await self._bridge()
        summary = self._summary(started)
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
        provider_events: asyncio.Queue[ProviderEvent] = asyncio.Queue()
        reader = asyncio.create_task(self._read_provider(provider_events), name="provider-reader")
        inbound = asyncio.create_task(self._pump_inbound(), name="leg-inbound")
        outbound = asyncio.create_task(self._pump_outbound(provider_events), name="provider-outbound")
        try:
            await asyncio.wait({inbound, outbound}, return_when=asyncio.FIRST_COMPLETED)
            if not inbound.done():  # the provider side ended first: hang up, then see the call end
                await asyncio.wait({inbound}, timeout=_LEG_DRAIN_TIMEOUT_S)
            elif not outbound.done():  # the call ended: close the provider session, keep its final usage
                self.provider.request_close()
                await asyncio.wait({outbound}, timeout=_PROVIDER_CLOSE_TIMEOUT_S)
        finally:
            for task in (inbound, outbound, reader):
                task.cancel()
            await asyncio.gather(inbound, outbound, reader, return_exceptions=True)
            await self.provider.close()

    async def _read_provider(self, sink: asyncio.Queue[ProviderEvent]) -> None:
        async for event in self.provider.events():
            sink.put_nowait(event)

    async def _pump_inbound(self) -> None:
        """Caller frames to the provider until the call ends."""
        async for event in self.leg.events():
            if isinstance(event, FrameReceived):
                self.frames_in += 1
                self.provider.send_audio(event.pcm)
            elif isinstance(event, CallEnded):
                self._ended = event
                if event.by_remote:
                    self._ended_by, self._end_reason = "caller", f"{event.status_code} {event.reason}"
                elif not self._ended_by:
                    self._ended_by, self._end_reason = "bridge", event.reason
            elif isinstance(event, MediaStarted):
                log.info("call %s media: %s", self.leg.identity.call_id, event.codec)

    async def _pump_outbound(self, events: asyncio.Queue[ProviderEvent]) -> None:
        """Provider events to the caller until the provider session ends or fails."""
        while True:
            deadline = self._framer.next_deadline()
            timeout = None if deadline is None else max(0.0, (deadline - self._clock()) / 1e9)
            try:
                event = await asyncio.wait_for(events.get(), timeout)
            except TimeoutError:
                self.leg.enqueue(self._framer.handle_timer(self._clock()))
                continue
            if isinstance(event, AudioReceived):
                self.leg.enqueue(self._framer.push(event.audio, self._clock(), self._epoch, event.item_id))
            elif isinstance(event, InputTranscript):
                log.debug("call %s caller: %s", self.leg.identity.call_id, event.text)
            elif isinstance(event, OutputTranscript):
                log.debug("call %s assistant: %s", self.leg.identity.call_id, event.text)
            elif isinstance(event, UsageUpdated):
                self.usage_seconds = event.audio_seconds
            elif isinstance(event, ProviderError):
                if event.fatal:
                    self._hangup("provider", f"protocol error {event.code}: {event.message}")
                    return
                log.warning("call %s provider error %s: %s", self.leg.identity.call_id, event.code, event.message)
            elif isinstance(event, SessionClosed):
                if event.audio_seconds is not None:
                    self.usage_seconds = event.audio_seconds
                self._hangup("provider", f"provider session closed: {event.reason}")
                return

    def _hangup(self, by: str, reason: str) -> None:
        if self._ended is None:
            self._ended_by, self._end_reason = by, reason
            log.warning("call %s: %s; hanging up", self.leg.identity.call_id, reason)
            self.leg.hangup(reason[:100])

    async def _drain_leg(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_LEG_DRAIN_TIMEOUT_S):
                async for event in self.leg.events():
                    if isinstance(event, CallEnded):
                        self._ended = event

    def _summary(self, started_ns: int) -> CallSummary:
        ended = self._ended
        return CallSummary(
            call_id=self.leg.identity.call_id,
            duration_s=(self._clock() - started_ns) / 1e9,
            frames_in=self.frames_in,
            frames_out=self.leg.ledger.frames_transmitted,
            ended_by=self._ended_by or "unknown",
            reason=self._end_reason or (f"{ended.status_code} {ended.reason}" if ended else "unknown"),
            usage_seconds=self.usage_seconds,
        )
