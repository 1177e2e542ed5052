"""Harness moved unchanged from tests/unit/bridge/test_session_engine.py: Call, GPT_LIVE_CAPS, MS, REALTIME, TICK, pcmu_tone, speech_frame."""

from __future__ import annotations

import numpy as np

from bridge.engine.coordinator import (
    CoordinatorOptions,
    SendAudio,
    SessionCoordinator,
)
from providers.base import Capabilities
from providers.events import SessionStarted
from providers.limits import (
    OPENAI_REALTIME,
    AudioLimits,
)
from rtp.audio import PCMU_8K
from rtp.g711 import ulaw_encode
from rtp.playout import OutboundFrame, Playout
from rtp.units import NS_PER_MS as MS
from sip.leg import PlayoutLeg

TICK = 20 * MS


REALTIME = Capabilities(server_vad=True, speech_end_events=True, timed_captions=True, truncate=True)


GPT_LIVE_CAPS = Capabilities(server_vad=False, speech_end_events=False, timed_captions=True, truncate=False)


class Call:
    """A coordinator, its carrier channel and a virtual media clock."""

    def __init__(
        self, caps: Capabilities = REALTIME, limits: AudioLimits | None = None, **options: object
    ) -> None:
        self.now = 0
        self.playout = Playout()
        self.core = SessionCoordinator(
            limits=limits or OPENAI_REALTIME.for_format(PCMU_8K),
            output_format=PCMU_8K,
            capabilities=caps,
            channel=PlayoutLeg(self.playout),
            now=0,
            options=CoordinatorOptions(**options),  # type: ignore[arg-type]
        )
        self.core.provider_event(SessionStarted(1, "sess", None), 0)
        self.sent: list[OutboundFrame] = []
        self.notices: list[object] = []
        self.commands: list[object] = []

    def provider(self, event: object) -> None:
        self.core.provider_event(event, self.now)  # type: ignore[arg-type]
        self._drain()

    def tick(self, caller_pcm: bytes = bytes(320), count: int = 1) -> None:
        """One media-clock tick per count: the clock takes a frame, then the caller's frame arrives."""
        for _ in range(count):
            self.now += TICK
            frame = self.playout.pull(self.now)
            if frame is not None:
                self.sent.append(frame)
            self.core.caller_frame(caller_pcm, self.now)
            deadline = self.core.next_deadline()
            if deadline is not None and deadline <= self.now:
                self.core.handle_timer(self.now)
            self._drain()

    def advance(self, ms: int) -> None:
        """Time passes with no media clock (e.g. the call is on hold)."""
        self.now += ms * MS
        self.core.handle_timer(self.now)
        self._drain()

    def _drain(self) -> None:
        self.notices += self.core.notices()
        self.commands += [c for c in self.core.commands() if not isinstance(c, SendAudio)]


def pcmu_tone(ms: int, amplitude: int = 6000, freq: float = 440.0) -> bytes:
    t = np.arange(ms * 8) / 8000
    return ulaw_encode((amplitude * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes())


def speech_frame(amplitude: int = 8000) -> bytes:
    t = np.arange(160) / 8000
    return (amplitude * np.sin(2 * np.pi * 300 * t)).astype("<i2").tobytes()
