"""G.722 at the call's edge (rtp/g722.py) on virtual time: a tone through the encoder and decoder, one frame out
per frame in; PT 9 on the wire with the timestamp in the 8000 Hz clock (RFC 3551 §4.5.2: +160 per 20 ms); the
jitter buffer and rtp.plc on a lost packet; the encoder fed every slot, silence included."""

from __future__ import annotations

import numpy as np

from rtp.g722 import G722, G722Decoder, G722Encoder
from rtp.jitter import FrameKind
from rtp.media import CallMedia
from rtp.playout import OutboundFrame, Playout
from rtp.stream import RtpStream, StreamConfig
from rtp.units import NS_PER_MS as MS
from tests.support import codec_signal as cs

A_ADDR = ("127.0.0.1", 40000)
B_ADDR = ("127.0.0.1", 50000)


def _tone(hz: float, frames: int, level: float = 8000.0) -> np.ndarray:
    t = np.arange(160 * frames) / 8000
    return np.asarray(level * np.sin(2 * np.pi * hz * t), dtype="<i2")


def _stream(ssrc: int, remote: tuple[str, int]) -> RtpStream:
    config = StreamConfig(
        ssrc=ssrc,
        initial_seq=65530,
        initial_timestamp=2**32 - 320,
        cname="t",
        remote=remote,
        payload_type=G722,
    )
    return RtpStream(config, lambda: 0.5)


def test_a_tone_comes_back_through_encoder_and_decoder_at_its_level_a_frame_per_frame() -> None:
    for hz in (300.0, 1000.0, 3000.0):
        signal = _tone(hz, 50)
        encoder, decoder = G722Encoder(), G722Decoder()
        packets = [encoder(frame) for frame in cs.frames(signal)]
        assert {len(p) for p in packets} == {160}  # 64 kbit/s: 160 bytes a 20 ms frame, from the first
        decoded = [decoder(p) for p in packets]
        assert {len(d) for d in decoded} == {320}  # 8 kHz PCM16: one frame out per frame in
        lag, score = cs.best(signal.astype(np.float64), cs.pcm(decoded), max_lag=40)
        assert score > 0.99, (hz, lag, score)
        out = cs.pcm(decoded)[lag + 400 :]
        assert 0.9 < out.std() / signal[400:].std() < 1.1, hz


def test_a_sweep_comes_back_a_few_milliseconds_late_and_undistorted() -> None:
    t = np.arange(160 * 50) / 8000
    sweep = np.asarray(
        6000 * np.sin(2 * np.pi * (200 * t + 1700 * t * t / t[-1])), dtype="<i2"
    )  # 200-3600 Hz
    encoder, decoder = G722Encoder(), G722Decoder()
    decoded = cs.pcm([decoder(encoder(frame)) for frame in cs.frames(sweep)])
    lag, score = cs.best(sweep.astype(np.float64), decoded, max_lag=60)
    assert 20 <= lag <= 32 and score > 0.98, (lag, score)  # the two filters and the QMF: 2.5-4 ms


def test_a_payload_ffmpeg_refuses_decodes_to_silence_and_is_counted() -> None:
    decoder = G722Decoder()
    for payload in (b"", b"\x00" * 7):
        assert decoder(payload) == bytes(320)
    assert decoder.errors == 2


def test_a_frame_decoded_twice_in_a_row_moves_the_decoder_state_once() -> None:
    packets = [G722Encoder()(f) for f in cs.frames(_tone(700.0, 4))]
    once, twice = G722Decoder(), G722Decoder()
    plain = [once(p) for p in packets]
    again = [twice(packets[0]), twice(packets[1]), twice(packets[1]), twice(packets[2]), twice(packets[3])]
    assert again == plain[:2] + plain[1:]  # the jitter buffer's quiet test then its playout: one decode


def test_g722_on_the_wire_is_pt_9_with_160_timestamp_units_a_frame_and_plays_back_with_one_loss_concealed() -> (
    None
):
    sender, receiver = _stream(0xA, B_ADDR), _stream(0xB, A_ADDR)
    signal = _tone(440.0, 30)
    encoder = G722Encoder()
    out: list[bytes] = []
    kinds: list[FrameKind] = []
    for i, frame in enumerate(cs.frames(signal)):
        packet = cs.sent(sender.next_packet(encoder(frame), i * 20 * MS))
        assert packet.pt == 9 and len(packet.payload) == 160
        assert packet.timestamp == (2**32 - 320 + 160 * i) % 2**32  # the 8000 Hz clock, across the wrap
        if i != 12:  # one packet lost
            receiver.receive(cs.wire(packet), A_ADDR, i * 20 * MS)
        played = receiver.pull_frame(i * 20 * MS + 10 * MS)
        if played is not None:
            out.append(played.pcm)
            kinds.append(played.kind)
    assert kinds.count(FrameKind.CONCEALED) == 1 and receiver.counters()["frames_concealed"] == 1
    assert all(len(pcm) == 320 for pcm in out)
    lag, score = cs.best(signal.astype(np.float64), cs.pcm(out), max_lag=400)
    assert score > 0.95, (lag, score)  # the concealed frame continues the tone (rtp.plc), no gap, no click


def test_the_encoder_is_fed_every_slot_silence_included_so_the_peers_decoder_stays_in_step() -> None:
    stream = _stream(0xA, B_ADDR)
    media = CallMedia(stream, Playout())
    speech = cs.frames(_tone(500.0, 3))
    reference = G722Encoder()
    expected = [reference(speech[0]), reference(bytes(320)), reference(speech[1])]
    media.playout.enqueue([OutboundFrame(speech[0], 1, "item", 0, None)])
    first = cs.sent(media.pull_datagram(0)).payload
    idle = cs.sent(media.pull_datagram(20 * MS)).payload  # nothing to say: silence through the encoder
    media.playout.enqueue([OutboundFrame(speech[1], 1, "item", 20, None)])
    third = cs.sent(media.pull_datagram(40 * MS)).payload
    assert [first, idle, third] == expected
    assert idle != bytes([0xFA]) * 160  # not a constant pattern: the encoder's state after the speech
