"""Opus at the call's edge (rtp/opus.py) on virtual time: a sweep through the encoder and decoder, one 8 kHz frame
out per packet; a dynamic PT on the wire with the timestamp in the 48000 Hz clock (RFC 7587: +960 per 20 ms)
and packets of any size filed whole by the jitter buffer; one loss concealed; the interarrival jitter in the
48 kHz clock's units; the encoder fed every slot, silence included."""

from __future__ import annotations

import numpy as np
import pytest

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


def _sweep(frames: int) -> np.ndarray:
    t = np.arange(160 * frames) / 8000
    return np.asarray(6000 * np.sin(2 * np.pi * (200 * t + 1000 * t * t / t[-1])), dtype="<i2")  # 200-2200 Hz


def _stream(ssrc: int, remote: tuple[str, int]) -> RtpStream:
    config = StreamConfig(
        ssrc=ssrc,
        initial_seq=100,
        initial_timestamp=2**32 - 1920,
        cname="t",
        remote=remote,
        payload_type=PT,
        codec="OPUS",
        clock_rate=48000,
        dtmf_payload_type=None,
    )
    return RtpStream(config, lambda: 0.5)


def test_a_sweep_comes_back_through_encoder_and_decoder_a_frame_per_packet() -> None:
    sweep = _sweep(60)
    encoder, decoder = OpusEncoder(), OpusDecoder()
    packets = [encoder(frame) for frame in cs.frames(sweep)]
    assert len({len(p) for p in packets}) > 1 and max(len(p) for p in packets) < 160  # variable, compressed
    decoded = [decoder(i.to_bytes(2, "big") + p) for i, p in enumerate(packets)]  # as rtp.stream files them
    assert {len(d) for d in decoded} == {320} and decoder.errors == 0
    lag, score = cs.best(sweep.astype(np.float64), cs.pcm(decoded), max_lag=200)
    assert score > 0.95 and 20 <= lag <= 80, (lag, score)  # libopus's look-ahead
    assert decoder.plc == 0 and decoder.long_packets == 0


def test_a_packet_libopus_refuses_decodes_to_silence_and_is_counted_and_the_next_one_decodes() -> None:
    decoder = OpusDecoder()
    good = OpusEncoder()(cs.frames(_sweep(1))[0])
    assert decoder(b"\x00\x01") == bytes(320) and decoder(b"\x00\x02\xff\xff") == bytes(320)
    assert decoder.errors == 2
    assert decoder(b"\x00\x03" + good) != bytes(320) and decoder.errors == 2


def test_a_stream_of_another_codec_at_48000_or_opus_at_8000_is_refused() -> None:
    for codec, clock in (("OPUS", 8000), (None, 48000), ("G729", 8000)):
        config = StreamConfig(1, 1, 0, "t", B_ADDR, payload_type=PT, codec=codec, clock_rate=clock)
        with pytest.raises(ValueError):
            RtpStream(config, lambda: 0.5)


def _voice(frames: int) -> np.ndarray:
    """Something like a voice (a gliding harmonic tone, syllable by syllable, and breath noise): a pure sweep
    is no test of a loss, libopus's long-term predictor runs away on it whatever the decoder does."""
    t = np.arange(160 * frames) / 8000
    tone = (
        3000 * np.sin(2 * np.pi * (150 * t + 20 * np.sin(2 * np.pi * 3 * t))) * np.sin(2 * np.pi * 2 * t) ** 2
    )
    noise = 300 * np.random.default_rng(1).standard_normal(len(t))
    return np.asarray(tone + noise, dtype="<i2")


def test_opus_on_the_wire_advances_960_a_frame_is_filed_whole_and_one_loss_is_concealed() -> None:
    sender, receiver = _stream(0xA, B_ADDR), _stream(0xB, A_ADDR)
    sweep = _voice(40)
    encoder = OpusEncoder()
    out: list[bytes] = []
    kinds: list[FrameKind] = []
    for i, frame in enumerate(cs.frames(sweep)):
        packet = cs.sent(sender.next_packet(encoder(frame), i * 20 * MS))
        assert packet.pt == PT and packet.timestamp == (2**32 - 1920 + 960 * i) % 2**32  # across the wrap
        if i != 15:
            receiver.receive(cs.wire(packet), A_ADDR, i * 20 * MS + 3 * MS)
        played = receiver.pull_frame(i * 20 * MS + 10 * MS)
        if played is not None:
            out.append(played.pcm)
            kinds.append(played.kind)
    assert kinds.count(FrameKind.CONCEALED) == 1 and len(kinds) == 40
    assert all(len(pcm) == 320 for pcm in out)
    decoder = receiver.jitter._decode
    assert isinstance(decoder, OpusDecoder) and decoder.plc == 1  # told of the lost packet before the next
    lag, score = cs.best(sweep.astype(np.float64), cs.pcm(out[:15]), max_lag=100)
    assert score > 0.7, (lag, score)  # the breath noise is coded by its spectrum, not its waveform
    heard, said = cs.pcm(out[17:]), sweep[17 * 160 : 40 * 160 - lag].astype(np.float64)
    assert 0.5 < heard.std() / said.std() < 1.5  # after the loss: the voice at its level, not a burst
    # packets that left every 20 ms and came 3 ms later each: no interarrival jitter in the 48 kHz clock's units
    assert receiver.qos().jitter_ms == pytest.approx(0.0, abs=0.1)


def test_the_encoder_is_fed_every_slot_silence_included() -> None:
    media = CallMedia(_stream(0xA, B_ADDR), Playout())
    speech = cs.frames(_sweep(3))
    reference = OpusEncoder()
    expected = [reference(speech[0]), reference(bytes(320)), reference(speech[1])]
    media.playout.enqueue([OutboundFrame(speech[0], 1, "item", 0, None)])
    first = cs.sent(media.pull_datagram(0))
    idle = cs.sent(media.pull_datagram(20 * MS))
    media.playout.enqueue([OutboundFrame(speech[1], 1, "item", 20, None)])
    third = cs.sent(media.pull_datagram(40 * MS))
    assert [first.payload, idle.payload, third.payload] == expected
    assert [(p.timestamp - first.timestamp) % 2**32 for p in (idle, third)] == [960, 1920]
