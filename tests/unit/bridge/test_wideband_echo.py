"""End to end on a G.722 leg, sans-I/O apart from the Gemini fake on loopback: the caller's RTP (a 6 kHz tone,
above the 4 kHz an 8 kHz frame carries) through the jitter buffer, the Gemini adapter, the fake's echo, the
output path and G.722's encoder, back onto the wire. At the leg's 16 kHz the tone comes back; with the stream
at 8 kHz (an engine that mixes at 8 kHz) it is filtered out on the way, as it always was. The same through
Opus at 16 kHz (rtp.opus): the adapter is given 640-byte frames and the tone comes back."""

from __future__ import annotations

import asyncio

import numpy as np

from bridge.engine.reservoir import TICK_NS, OutputPath
from providers.base import SessionSettings
from providers.events import AudioReceived, UsageUpdated
from providers.fakes.gemini_live import GeminiFakeOptions, serve
from providers.gemini_live import GeminiLiveAdapter
from providers.limits import AudioLimits
from rtp.audio import PCM16_24K
from rtp.g722 import G722, G722Encoder
from rtp.media import CallMedia
from rtp.opus import OpusEncoder
from rtp.packet import RtpPacket, build, parse
from rtp.playout import Playout
from rtp.stream import RtpStream, StreamConfig
from rtp.units import NS_PER_MS as MS
from sip.leg import PlayoutLeg

PEER = ("127.0.0.1", 40000)


OPUS_PT = 107


def _stream(ssrc: int, media_rate: int, codec: str = "G722") -> RtpStream:
    opus = codec == "OPUS"
    config = StreamConfig(
        ssrc=ssrc, initial_seq=1, initial_timestamp=0, cname="t", remote=PEER,
        payload_type=OPUS_PT if opus else G722, codec=codec, clock_rate=48000 if opus else 8000,
        dtmf_payload_type=None if opus else 101, media_rate=media_rate,
    )  # fmt: skip
    return RtpStream(config, lambda: 0.5)


def _share(pcm: bytes, rate: int, lo: float, hi: float) -> float:
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    power = np.abs(np.fft.rfft(x * np.hanning(len(x)))) ** 2
    hz = np.fft.rfftfreq(len(x), 1 / rate)
    return float(power[(hz >= lo) & (hz <= hi)].sum() / power.sum())


async def _echo(media_rate: int, codec: str = "G722") -> tuple[list[int], bytes]:
    """The caller's 6 kHz tone through the bridge and the Gemini echo: the peak of each caller frame the
    adapter was given, and what the caller's G.722 (or Opus) decoder hears (16 kHz PCM16)."""
    t = np.arange(16 * 600) / 16000
    caller = np.concatenate([8000 * np.sin(2 * np.pi * 6000 * t), np.zeros(16 * 800)]).astype("<i2").tobytes()
    phone = G722Encoder() if codec == "G722" else OpusEncoder(16000)
    payloads = [phone(caller[i : i + 640]) for i in range(0, len(caller), 640)]
    inbound, outbound, ear = (
        _stream(1, media_rate, codec),
        _stream(2, media_rate, codec),
        _stream(3, 16000, codec),
    )
    pt, step = inbound._pt, inbound._step
    rate = inbound.media_rate
    sent: list[int] = []  # the peak of each frame the provider was given
    sizes: set[int] = set()
    async with await serve(options=GeminiFakeOptions(response_latency_ms=20, burst_factor=8.0)) as fake:
        live = GeminiLiveAdapter(
            "k", SessionSettings(), limits=GeminiLiveAdapter.audio_limits(PCM16_24K), url=fake.url,
            ssl_context=fake.client_ssl_context(),
        )  # fmt: skip
        await live.connect()
        for i, payload in enumerate(payloads):  # the media clock's ticks, on virtual RTP time
            inbound.receive(build(pt, False, i + 1, step * i, 7, payload), PEER, i * 20 * MS)
            frame = inbound.pull_frame(i * 20 * MS + 10 * MS)
            if frame is not None:
                live.send_audio(frame.pcm, len(frame.pcm) == 640)  # as the session says the rate
                sent.append(int(np.abs(np.frombuffer(frame.pcm, dtype="<i2")).max()))
                sizes.add(len(frame.pcm))
        assert sizes == {2 * rate // 50}  # the frames the adapter was given: 20 ms at the leg's rate
        voice = b""
        if max(sent, default=0) < 2000:  # the provider heard nothing to echo
            await live.close()
            return sent, b""
        async with asyncio.timeout(5):
            async for event in live.events():
                if isinstance(event, AudioReceived):
                    voice += event.audio
                if isinstance(event, UsageUpdated):
                    break
        await live.close()
    playout = Playout()
    path = OutputPath(
        AudioLimits(64_000, 3_000), PCM16_24K, PlayoutLeg(playout), lead_frames=2, item_quiet_ms=300
    )
    path.set_rate(rate)  # what the session does at MediaStarted
    path.push(voice, "echo", 0)
    media = CallMedia(outbound, playout)
    heard = []
    for i in range(len(voice) // 960 + 4):
        now = i * TICK_NS
        path.tick(now)
        datagram = media.pull_datagram(now)
        assert datagram is not None
        packet = parse(bytes(datagram))
        assert isinstance(packet, RtpPacket)
        media.sent(now)
        ear.receive(bytes(datagram), PEER, now)
        played = ear.pull_frame(now + 10 * MS)
        if played is not None:
            heard.append(played.pcm)
    return sent, b"".join(heard)


async def test_a_6khz_tone_comes_back_through_the_echo_on_a_16khz_leg() -> None:
    _, heard = await _echo(16000)
    loud = np.flatnonzero(np.abs(np.frombuffer(heard, dtype="<i2")) > 2000)
    assert loud.size > 16 * 400  # the echo's 600 ms, give or take its edges
    echo = heard[2 * loud[0] + 640 * 3 : 2 * loud[-1] - 640 * 3]
    assert _share(echo, 16000, 5800, 6200) > 0.9


async def test_on_an_8khz_stream_the_6khz_tone_is_filtered_out_as_before() -> None:
    sent, heard = await _echo(8000)
    assert len(sent) > 60 and max(sent) < 2000 and not heard  # nothing above 4 kHz crosses 8 kHz frames


async def test_a_6khz_tone_reaches_gemini_in_640_byte_frames_and_comes_back_on_a_16khz_opus_leg() -> None:
    sent, heard = await _echo(16000, "OPUS")  # `_echo` checks the adapter was given 640-byte frames
    assert max(sent) > 6000  # the tone itself reached the adapter, not its 8 kHz view (nothing there)
    loud = np.flatnonzero(np.abs(np.frombuffer(heard, dtype="<i2")) > 2000)
    assert loud.size > 16 * 400
    echo = heard[2 * loud[0] + 640 * 3 : 2 * loud[-1] - 640 * 3]
    assert _share(echo, 16000, 5800, 6200) > 0.9
