"""The minimal session joins a leg to a provider both ways and ends cleanly from either side.

Driven with in-memory fakes of both sides: no sockets, no SIP engine, no sleeps, on virtual time (the loop's
clock only moves when every task waits, and the session reads that clock).
"""

import asyncio
import time

from providers.events import AudioReceived, ProviderError, SessionClosed
from rtp.audio import PCMU_8K
from rtp.g711 import ulaw_decode
from sip.leg import CallEnded, FrameReceived, MediaStarted
from tests.support import virtual_time
from tests.support.session import FakeLeg, FakeProvider, pcm_frame, session

event_loop_policy = virtual_time.policy_fixture()


async def test_caller_audio_reaches_the_provider_as_pcmu_and_the_caller_bye_closes_it() -> None:
    leg, provider = FakeLeg(), FakeProvider()
    task = asyncio.create_task(session(leg, provider).run())
    leg.queue.put_nowait(MediaStarted("PCMU/8000"))
    for i in range(3):
        leg.queue.put_nowait(FrameReceived(pcm_frame(0x10 + i), i, i))
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 3, 0))
    summary = await asyncio.wait_for(task, 5)
    assert provider.sent == [pcm_frame(0x10 + i) for i in range(3)]  # the adapter converts, not the session
    assert provider.close_requested and provider.closed and leg.hangups == [] and leg.answered
    assert summary.ended_by == "caller" and summary.frames_in == 3
    assert summary.usage_seconds == 3.0  # the final usage from the provider's session.closed


async def test_provider_audio_reaches_the_leg_playout_and_a_provider_close_hangs_up() -> None:
    leg, provider = FakeLeg(), FakeProvider()
    task = asyncio.create_task(session(leg, provider).run())
    audio = bytes(range(256)) * 5  # 160 ms of PCMU
    provider.queue.put_nowait(AudioReceived(1, audio, PCMU_8K))
    provider.queue.put_nowait(SessionClosed(1, "expired", True, 12.0))
    summary = await asyncio.wait_for(task, 5)
    first = [leg.playout.pull(t) for t in range(2)]  # the cushion: two frames ahead of the media clock
    assert b"".join(f.pcm for f in first if f) == ulaw_decode(audio[:320])
    assert leg.hangups and "expired" in leg.hangups[0]
    assert summary.ended_by == "provider" and summary.usage_seconds == 12.0


async def test_fatal_protocol_error_hangs_up_with_the_reason() -> None:
    leg, provider = FakeLeg(), FakeProvider()
    task = asyncio.create_task(session(leg, provider).run())
    provider.queue.put_nowait(
        ProviderError(1, "invalid_audio", "output audio is not valid base64", fatal=True)
    )
    summary = await asyncio.wait_for(task, 5)
    assert leg.hangups == ["protocol error invalid_audio: output audio is not valid base64"]
    assert summary.ended_by == "provider" and provider.closed


async def test_non_fatal_provider_errors_keep_the_call_up() -> None:
    leg, provider = FakeLeg(), FakeProvider()
    task = asyncio.create_task(session(leg, provider).run())
    provider.queue.put_nowait(ProviderError(1, "invalid_event", "unparseable", fatal=False))
    leg.queue.put_nowait(FrameReceived(pcm_frame(0x20), 1, 1))
    await asyncio.wait_for(provider.got_audio.wait(), 5)  # still bridging after the error
    assert leg.hangups == []
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 1, 0))
    summary = await asyncio.wait_for(task, 5)
    assert summary.ended_by == "caller"


async def test_unreachable_provider_hangs_up_the_call_with_the_reason() -> None:
    leg, provider = FakeLeg(), FakeProvider(refuse=True)
    summary = await asyncio.wait_for(session(leg, provider).run(), 5)
    assert leg.hangups == ["provider unavailable: connection refused"]
    assert summary.ended_by == "bridge" and not leg.answered


async def test_a_call_ended_by_the_bridge_is_not_blamed_on_the_caller() -> None:
    leg, provider = FakeLeg(), FakeProvider()
    task = asyncio.create_task(session(leg, provider).run())
    leg.queue.put_nowait(CallEnded("bridge shutting down", 200, False, 0, 0))
    summary = await asyncio.wait_for(task, 5)
    assert (summary.ended_by, summary.reason) == ("bridge", "bridge shutting down")
    assert provider.closed


async def test_the_session_runs_on_virtual_time() -> None:
    """The close window (2 s for the provider's final usage) passes on the loop's clock, not the wall's."""
    leg, provider = FakeLeg(), FakeProvider()
    provider.request_close = lambda: None  # type: ignore[method-assign]  # the provider never confirms
    started = time.monotonic()
    loop_started = virtual_time.loop_clock()()
    task = asyncio.create_task(session(leg, provider).run())
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    summary = await asyncio.wait_for(task, 5)
    waited_ns = virtual_time.loop_clock()() - loop_started
    assert summary.ended_by == "caller" and 2_000_000_000 <= waited_ns < 2_100_000_000
    assert time.monotonic() - started < 1.0  # two virtual seconds, no real ones


async def test_every_notice_reaches_the_notice_sink_beside_the_log() -> None:
    """The console's hook (bridge/server/console.py `ConsoleFeed.notice`): each notice the session logs, at once."""
    from bridge.engine.commands import Transcript
    from bridge.server.console import ConsoleFeed
    from providers.events import InputTranscript

    leg, provider, feed = FakeLeg(), FakeProvider(), ConsoleFeed()
    sub = feed.subscribe()
    got: list[tuple[str, object]] = []

    def sink(call_id: str, notice: object) -> None:
        got.append((call_id, notice))
        feed.notice(call_id, notice)

    task = asyncio.create_task(session(leg, provider, notice_sink=sink).run())
    provider.queue.put_nowait(InputTranscript(1, "opening hours please", "item-1", 100, 900, final=True))
    provider.queue.put_nowait(ProviderError(1, "invalid_event", "unparseable", fatal=False))
    provider.queue.put_nowait(SessionClosed(1, "expired", True, 1.0))
    await asyncio.wait_for(task, 5)
    assert {call_id for call_id, _ in got} == {"call-1"}
    assert any(isinstance(n, ProviderError) for _, n in got)
    captions = [n for _, n in got if isinstance(n, Transcript)]
    assert [(c.role, c.text) for c in captions] == [("caller", "opening hours please")]
    events = []
    while (taken := sub.take()) is not None:
        events.append(taken[0])
    assert [e.data["text"] for e in events if e.kind == "caption"] == ["opening hours please"]
