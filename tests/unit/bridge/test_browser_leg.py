"""The browser channel's leg (bridge/server/browser.py): its adaptive cushion, its clear scope, its contract, on
virtual time (the cushion takes `now`; the leg is given a fake clock)."""

from __future__ import annotations

import asyncio
import fractions

import av
import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from bridge.engine.cushion import AdaptiveCushion
from bridge.server.browser import (
    BrowserCushion,
    BrowserLeg,
    _read_inbound,
    check_offer,
    loopback_candidates,
    negotiated_codec,
)
from rtp.playout import OutboundFrame, Playout
from rtp.units import NS_PER_MS as MS
from sip.leg import CallEnded, CallIdentity, FrameReceived, TransferProgress

TICK = 20 * MS


def frames(item: str, n: int, epoch: int = 1, start_ms: int = 0) -> list[OutboundFrame]:
    return [OutboundFrame(bytes([i % 256]) * 320, epoch, item, start_ms + 20 * i) for i in range(n)]


def run_ticks(cushion: BrowserCushion, start: int, ticks: int) -> list[OutboundFrame | None]:
    return [cushion.pull(start + k * TICK) for k in range(ticks)]


def test_cushion_holds_the_floor_before_a_talkspurt_then_plays_one_frame_per_tick() -> None:
    cushion = BrowserCushion(Playout())
    assert cushion.target_ms == 120  # no jitter yet: the 120 ms floor
    cushion.playout.enqueue(frames("a", 3))
    cushion.delivered(0, 3)
    assert run_ticks(cushion, 0, 3) == [None, None, None]  # 60 ms queued < 120 ms: buffering
    cushion.playout.enqueue(frames("a", 4, start_ms=60))
    cushion.delivered(60 * MS, 4)
    out = run_ticks(cushion, 60 * MS, 8)
    assert [f.offset_ms if f else None for f in out] == [0, 20, 40, 60, 80, 100, 120, None]
    assert cushion.underruns == 1 and not cushion.playing  # ran dry: buffering again


def test_a_short_item_is_not_held_longer_than_the_target() -> None:
    cushion = BrowserCushion(Playout())
    cushion.playout.enqueue(frames("a", 2))
    cushion.delivered(0, 2)
    out = run_ticks(cushion, 0, 9)
    played = [k for k, f in enumerate(out) if f is not None]
    assert played == [6, 7]  # waited 120 ms (6 ticks), then played: no frame is held forever


def test_delivery_jitter_raises_the_target_up_to_the_ceiling() -> None:
    cushion = BrowserCushion(Playout())
    now = 0
    for k in range(200):  # one frame per delivery, arriving 0 or 200 ms apart: heavy jitter
        now += (200 if k % 2 else 0) * MS
        cushion.delivered(now, 1)
    assert cushion.jitter_ms > 90
    assert cushion.target_ms == 200  # capped at the ceiling
    steady = BrowserCushion(Playout())
    for k in range(200):
        steady.delivered(k * TICK, 1)
    assert steady.jitter_ms < 1 and steady.target_ms == 120
    assert BrowserCushion(Playout(), AdaptiveCushion(60, 100)).target_ms == 60


def test_pause_between_items_is_not_jitter() -> None:
    cushion = BrowserCushion(Playout())
    cushion.delivered(0, 5)
    cushion.delivered(5000 * MS, 5)
    assert cushion.jitter_ms == 0


def test_hr4_clear_scope_is_what_was_handed_to_the_track() -> None:
    leg = BrowserLeg(identity(), clock=lambda: 0)
    leg.enqueue(frames("reply-1", 10))  # 200 ms: the ceiling
    assert leg.depth == 10 and leg.lead_frames == 10
    handed = run_ticks(leg.cushion, 0, 4)  # 200 ms queued is past the target: it plays at once
    assert [f.offset_ms if f else None for f in handed] == [0, 20, 40, 60]
    result = leg.clear(2)  # barge-in
    assert result.dropped_frames == 6 and result.transmitted_ms == {"reply-1": 80}
    assert leg.ledger.transmitted_ms("reply-1") == 80  # the truncation point: what the browser was sent
    assert leg.depth == 0 and run_ticks(leg.cushion, 12 * TICK, 10) == [None] * 10
    leg.enqueue(frames("old", 3, epoch=1))  # below the barrier: never transmitted
    assert leg.depth == 0


def identity() -> CallIdentity:
    return CallIdentity(
        "web-1",
        "web-1",
        "browser:console",
        "browser:talk",
        "talk",
        "127.0.0.1:5000",
        (("X-Channel", "browser"),),
    )


async def test_leg_events_hangup_transfer_and_dtmf() -> None:
    leg = BrowserLeg(identity(), clock=lambda: 42)
    leg.frame_in(bytes(320))
    with pytest.raises(ValueError):
        leg.transfer("http://nope")
    leg.transfer("sip:agent@example.invalid")
    with pytest.raises(ValueError):
        leg.send_dtmf("12x")
    leg.send_dtmf("12#")
    leg.answer()
    leg.hangup("done")
    leg.hangup("twice")  # idempotent
    leg.frame_in(bytes(320))  # after the end: not delivered
    got = [event async for event in leg.events()]
    assert got[0] == FrameReceived(bytes(320), 1, 42)
    assert isinstance(got[1], TransferProgress) and got[1].final and got[1].status_code == 501
    assert got[2] == CallEnded("done", 503, False, 1, 0) and len(got) == 3 and leg.frames_in == 1
    assert leg.identity.header("x-channel") == "browser"


class _Track:
    """A remote track yielding 48 kHz stereo Opus-decoded frames of 20 ms, then ending."""

    def __init__(self, count: int) -> None:
        self._n = 0
        self._count = count

    async def recv(self) -> av.AudioFrame:
        if self._n >= self._count:
            raise MediaStreamError
        t = (np.arange(960) + 960 * self._n) / 48000
        tone = (8000 * np.sin(2 * np.pi * 400 * t)).astype("<i2")
        frame = av.AudioFrame.from_ndarray(np.repeat(tone, 2).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = 48000
        frame.pts = 960 * self._n
        frame.time_base = fractions.Fraction(1, 48000)
        self._n += 1
        return frame


async def test_inbound_audio_becomes_20ms_frames_of_8khz_pcm16() -> None:
    leg = BrowserLeg(identity(), clock=lambda: 0)
    await asyncio.wait_for(_read_inbound(leg, _Track(50)), 5)
    got = [event async for event in leg.events()]
    pcm = [e for e in got if isinstance(e, FrameReceived)]
    assert 45 <= len(pcm) <= 50 and all(len(e.pcm) == 320 for e in pcm)
    assert [e.seq for e in pcm] == list(range(1, len(pcm) + 1))
    samples = np.frombuffer(b"".join(e.pcm for e in pcm[5:]), "<i2").astype(float)
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) * 8000 / samples.size - 400) < 10  # the 400 Hz tone survived the resampler
    assert isinstance(got[-1], CallEnded) and got[-1].by_remote


OFFER = (
    "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111 0\r\n"
    "a=ice-ufrag:abcd\r\na=ice-pwd:0123456789012345678901\r\na=fingerprint:sha-256 AA:BB\r\n"
    "a=candidate:1 1 udp 2122260223 192.0.2.2 50000 typ host\r\n"
    "a=candidate:2 1 udp 2122194687 127.0.0.1 50001 typ host\r\n"
)


def test_offers_are_checked_and_kept_on_loopback() -> None:
    assert check_offer(OFFER) is OFFER
    for bad, reason in (
        ("hello", "v=0"),
        ("v=0\r\ns=-\r\n", "audio"),
        ("v=0\r\nm=audio 9 RTP/AVP 0\r\n", "ICE"),
        ("v=0" + "x" * 70_000, "too large"),
    ):
        with pytest.raises(ValueError, match=reason):
            check_offer(bad)
    kept = loopback_candidates(OFFER)
    assert "127.0.0.1 50001" in kept and "192.0.2.2" not in kept and "a=ice-ufrag:abcd" in kept


def test_negotiated_codec_is_the_answers_first() -> None:
    answer = (
        "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0 111\r\na=rtpmap:111 opus/48000/2\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    assert negotiated_codec(answer) == "PCMU/8000"
    assert negotiated_codec(answer.replace("SAVPF 0 111", "SAVPF 111 0")) == "opus/48000"
    assert negotiated_codec("v=0\r\n") == "unknown"


async def test_a_peer_that_never_completes_ice_is_cleaned_up() -> None:
    from aiortc import RTCPeerConnection

    from bridge.server.browser import BrowserChannel

    legs: list[BrowserLeg] = []
    channel = BrowserChannel(legs.append, connect_timeout_s=1.0)
    client = RTCPeerConnection()
    client.addTransceiver("audio", direction="sendrecv")
    await client.setLocalDescription(await client.createOffer())
    try:
        answer = await channel.answer(client.localDescription.sdp, "127.0.0.1:1")
        assert answer.call_id == "web-1" and "m=audio" in answer.sdp and "127.0.0.1" in answer.sdp
        assert negotiated_codec(answer.sdp) in ("opus/48000", "PCMU/8000")
        assert [leg.identity.call_id for leg in legs] == ["web-1"] and "web-1" in channel.legs
        # The client never applies the answer: no ICE, no DTLS. The channel ends the call by itself.
        async with asyncio.timeout(5):
            got = [event async for event in legs[0].events()]
        assert isinstance(got[-1], CallEnded) and got[-1].by_remote, got
        assert "web-1" not in channel.legs
        with pytest.raises(ValueError, match="v=0"):
            await channel.answer("garbage", "127.0.0.1:1")
    finally:
        await client.close()
        await channel.close()


def test_the_sessions_cushion_follows_the_browser_legs_adaptive_target() -> None:
    """sip.leg.CushionedChannel: the output path reads `cushion_frames` at each top-up (120-200 ms)."""
    from bridge.engine.reservoir import OutputPath
    from providers.limits import AudioLimits
    from rtp.audio import PCMU_8K
    from sip.leg import offers_cushion

    now = [0]
    leg = BrowserLeg(identity(), clock=lambda: now[0])
    assert offers_cushion(leg) and leg.cushion_frames == 6  # the 120 ms floor
    out = OutputPath(AudioLimits(16_000, 3_000), PCMU_8K, leg, lead_frames=2, item_quiet_ms=300)
    out.push(bytes(160 * 40), "reply-1", 0)  # 800 ms received
    assert leg.depth == 6
    for k in range(1, 40):  # deliveries 120 ms late, every other tick: the jitter estimate climbs
        now[0] = k * TICK + (120 * MS if k % 2 else 0)
        leg.cushion.delivered(now[0], 1)
    assert leg.cushion.target_ms == 200 and leg.cushion_frames == 10
    out.feed(now[0])
    assert leg.depth == 10  # the session now keeps the ceiling queued
