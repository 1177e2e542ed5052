"""Opus at a 16 kHz leg's media rate (rtp/opus.py, `StreamConfig.media_rate`): a 6 kHz tone (above the 4 kHz an
8 kHz frame can carry) goes through the encoder, the wire and the jitter buffer and comes out in 640-byte
frames; a lost packet is concealed at 16 kHz; the encoder takes a 320-byte frame through G.722's interpolator
(rtp.g722 `WideView`); and the 8 kHz Opus path gives the same bytes as before the 16 kHz one existed."""

from __future__ import annotations

import hashlib

import numpy as np

from rtp.g722 import WideView
from rtp.jitter import FrameKind
from rtp.media import CallMedia
from rtp.opus import OpusDecoder, OpusEncoder
from rtp.playout import OutboundFrame, Playout
from rtp.stream import RtpStream, StreamConfig
from rtp.units import NS_PER_MS as MS
from tests.support import codec_signal as cs

A_ADDR = ("127.0.0.1", 40000)
B_ADDR = ("127.0.0.1", 50000)
PT = 107


_tone = cs.tone
_frames = cs.split
_share = cs.band_share


def _stream(ssrc: int, remote: tuple[str, int], media_rate: int = 8000) -> RtpStream:
    config = StreamConfig(
        ssrc=ssrc, initial_seq=100, initial_timestamp=0, cname="t", remote=remote, payload_type=PT,
        codec="OPUS", clock_rate=48000, dtmf_payload_type=None, media_rate=media_rate,
    )  # fmt: skip
    return RtpStream(config, lambda: 0.5)


def _call(
    frames: list[bytes], media_rate: int, lost: tuple[int, ...] = ()
) -> tuple[list[bytes], list[tuple[bytes, FrameKind]]]:
    """`frames` sent by one Opus stream's media core and received by another's, both at `media_rate`: the
    payloads sent and the frames played (with their kind)."""
    media = CallMedia(_stream(0xA, B_ADDR, media_rate), Playout())
    media.playout.enqueue([OutboundFrame(f, 1, "item", 20 * i, None) for i, f in enumerate(frames)])
    receiver = _stream(0xB, A_ADDR, media_rate)
    sent, played = [], []
    for i in range(len(frames)):
        datagram = media.pull_datagram(i * 20 * MS)
        assert datagram is not None
        media.sent(i * 20 * MS)
        sent.append(cs.sent(datagram).payload)
        if i not in lost:
            receiver.receive(bytes(datagram), A_ADDR, i * 20 * MS + 3 * MS)
        frame = receiver.pull_frame(i * 20 * MS + 10 * MS)
        if frame is not None:
            played.append((frame.pcm, frame.kind))
    return sent, played


def test_a_6khz_tone_crosses_an_opus_stream_at_16khz_in_640_byte_frames_and_not_an_8khz_one() -> None:
    tone = _frames(_tone(6000.0, 40, 16000), 320)  # 640-byte frames in
    _, wide = _call(tone, 16000)
    assert _stream(1, A_ADDR, 16000).media_rate == 16000
    assert {len(pcm) for pcm, _ in wide} == {640}
    assert _share(b"".join(pcm for pcm, _ in wide[5:]), 16000, 5800, 6200) > 0.9  # the tone itself
    _, narrow = _call(tone, 8000)  # the 8 kHz stream: its encoder takes the 8 kHz view, 6 kHz is gone
    assert {len(pcm) for pcm, _ in narrow} == {320}
    x = np.frombuffer(b"".join(pcm for pcm, _ in narrow[5:]), dtype="<i2").astype(np.float64)
    assert x.std() < 0.05 * 8000 / np.sqrt(2)


def test_a_lost_packet_of_a_16khz_opus_stream_is_concealed_at_16khz() -> None:
    signal = _tone(440.0, 40, 16000) + _tone(5000.0, 40, 16000, 2000.0)
    _, played = _call(_frames(signal, 320), 16000, lost=(15,))
    kinds = [kind for _, kind in played]
    assert kinds.count(FrameKind.CONCEALED) == 1 and len(kinds) == 40
    assert all(len(pcm) == 640 for pcm, _ in played)
    concealed = played[kinds.index(FrameKind.CONCEALED)][0]
    assert np.frombuffer(concealed, dtype="<i2").astype(np.float64).std() > 1000  # not a gap of silence
    lag, score = cs.best(signal.astype(np.float64), cs.pcm([pcm for pcm, _ in played[:15]]), max_lag=800)
    assert score > 0.9, (lag, score)


def test_the_16khz_decoder_gives_640_bytes_and_640_of_silence_for_a_refused_packet() -> None:
    decoder = OpusDecoder(16000)
    good = OpusEncoder(16000)(_tone(1000.0, 1, 16000).tobytes())
    assert decoder(b"\x00\x01\xff\xff") == bytes(640) and decoder.errors == 1
    out = decoder(b"\x00\x02" + good)
    assert len(out) == 640 and out != bytes(640) and decoder.errors == 1 and decoder.plc == 0


def test_the_16khz_encoder_takes_an_8khz_frame_through_g722s_interpolator() -> None:
    narrow = _frames(_tone(1000.0, 6, 8000), 160)
    wide = _frames(_tone(6000.0, 3, 16000), 320)
    frames = narrow[:3] + wide + narrow[3:]  # a G.711 provider's voice, then Gemini's, then a closing message
    encoder, reference, view = OpusEncoder(16000), OpusEncoder(16000), WideView()
    assert [encoder(f) for f in frames] == [reference(view(f)) for f in frames]
    media = CallMedia(_stream(0xA, B_ADDR, 16000), Playout())  # the media core feeds it both as they are
    media.playout.enqueue([OutboundFrame(f, 1, "item", 20 * i, None) for i, f in enumerate(frames)])
    reference, view = OpusEncoder(16000), WideView()
    for i, f in enumerate(frames):
        datagram = media.pull_datagram(i * 20 * MS)
        media.sent(i * 20 * MS)
        assert cs.sent(datagram).payload == reference(view(f))


# The 8 kHz Opus path's bytes (a two-tone signal sent by one media core and received by another, three
# packets lost): computed on the tree before Opus ran at 16 kHz.
GOLDEN = {"opus_out": "a7af8e3ac96eb1e7:1243", "opus_in": "684f7b5a665970c2:12800"}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16] + f":{len(data)}"


def test_the_8khz_opus_path_gives_the_same_bytes_as_before() -> None:
    t = np.arange(160 * 40) / 8000
    tone = (6000 * np.sin(2 * np.pi * 440 * t) + 2000 * np.sin(2 * np.pi * 1320 * t)).astype("<i2")
    sent, played = _call(_frames(tone, 160), 8000, lost=(12, 20, 21))
    assert _digest(b"".join(sent)) == GOLDEN["opus_out"]
    assert _digest(b"".join(pcm for pcm, _ in played)) == GOLDEN["opus_in"]
