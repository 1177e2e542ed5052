"""Harness moved unchanged from tests/unit/bridge/test_session.py: FakeLeg, FakeProvider, pcm_frame, session."""

import asyncio
from collections.abc import AsyncIterator

from bridge.server.session import CallSession
from providers.base import Capabilities, ProviderUnavailable
from providers.events import ProviderEvent, SessionClosed, SessionStarted
from providers.limits import AudioLimits
from rtp.audio import PCMU_8K, AudioFormat
from rtp.g711 import ulaw_decode
from sip.leg import CallEnded, CallIdentity, FrameReceived, FrameSink, LegEvent, LegFeatures, PlayoutLeg
from tests.support import virtual_time


class FakeLeg(PlayoutLeg):
    def __init__(self) -> None:
        super().__init__()  # the playout half of CallLeg (sip.leg.PlayoutLeg)
        self.queue: asyncio.Queue[LegEvent] = asyncio.Queue()
        self.hangups: list[str] = []
        self.answered = False
        self._identity = CallIdentity("call-1", "abc@host", "<sip:a@h>", "<sip:b@h>", "b", "127.0.0.1:5080")

    @property
    def identity(self) -> CallIdentity:
        return self._identity

    async def events(self) -> AsyncIterator[LegEvent]:
        while True:
            event = await self.queue.get()
            yield event
            if isinstance(event, CallEnded):
                return

    def answer(self) -> None:
        self.answered = True

    def hangup(self, reason: str = "normal clearing", status: int = 503) -> None:
        self.hangups.append(reason)
        self.queue.put_nowait(CallEnded("bridge hangup", 200, False, 0, 0))


class SinkLeg(FakeLeg):
    """A fake leg with a frame sink (`sip.leg.FrameSinkLeg`): `deliver` hands a frame over the way the native
    leg's media tick does (sip/native/leg.py `NativeLeg._post`): straight in, or queued behind its events."""

    features = LegFeatures(frame_sink=True)

    def __init__(self) -> None:
        super().__init__()
        self.sink: FrameSink | None = None
        self.sinks_set: list[bool] = []

    def set_frame_sink(self, sink: FrameSink | None) -> None:
        self.sink = sink
        self.sinks_set.append(sink is not None)

    def deliver(self, frame: FrameReceived) -> None:
        if self.sink is not None and self.queue.empty():
            self.sink(frame)
        else:
            self.queue.put_nowait(frame)


class FakeProvider:
    name = "fake"
    token = 1
    output_format: AudioFormat = PCMU_8K
    capabilities = Capabilities(server_vad=True, speech_end_events=True, timed_captions=True, truncate=True)
    limits = AudioLimits(16_000, 3_000)

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.sent: list[bytes] = []
        self.queue: asyncio.Queue[ProviderEvent] = asyncio.Queue()
        self.closed = False
        self.close_requested = False
        self.truncated: list[tuple[str, int]] = []
        self.commits = 0
        self.wide: list[bool] = []  # each send_audio's rate: 16 kHz (True) or 8 kHz
        self.got_audio = asyncio.Event()

    async def connect(self) -> SessionStarted:
        if self.refuse:
            raise ProviderUnavailable("connection refused")
        return SessionStarted(1, "sess", None)

    def send_audio(self, audio: bytes, wide: bool = False) -> None:
        self.sent.append(audio)
        self.wide.append(wide)
        self.got_audio.set()

    async def events(self) -> AsyncIterator[ProviderEvent]:
        while True:
            event = await self.queue.get()
            yield event
            if isinstance(event, SessionClosed):
                return

    def truncate(self, item_id: str, audio_end_ms: int) -> None:
        self.truncated.append((item_id, audio_end_ms))

    def cancel_response(self) -> None:
        pass

    def commit_input(self) -> None:
        self.commits += 1

    def send_tool_result(self, call_id: str, name: str, output: str) -> None:
        pass

    def send_text(self, text: str, *, speak: bool = False) -> None:
        pass

    def request_close(self) -> None:
        self.close_requested = True
        self.queue.put_nowait(SessionClosed(self.token, "close_requested", True, 3.0))

    async def close(self, timeout: float = 2.0) -> None:
        self.closed = True


def session(leg: FakeLeg, provider: "FakeProvider", **kwargs: object) -> CallSession:
    """A session on the running loop's virtual clock."""
    return CallSession(leg, provider, clock=virtual_time.loop_clock(), **kwargs)  # type: ignore[arg-type]


def pcm_frame(value: int) -> bytes:
    return ulaw_decode(bytes([value]) * 160)
