"""G.722 at its own 16 kHz (rtp/g722.py, `StreamConfig.media_rate`): a 6 kHz tone (above the 4 kHz an 8 kHz frame
can carry) goes through the encoder, the wire and the jitter buffer and comes out in 640-byte frames; a lost
packet is concealed at 16 kHz (rtp.plc `Concealer(2)`); an 8 kHz codec given a 16 kHz frame sends its 8 kHz
view; and the 8 kHz path gives the same bytes as before the media rate existed."""

from __future__ import annotations

import hashlib

import numpy as np

from rtp.g711 import ulaw_decode, ulaw_encode
from rtp.g722 import G722, G722Decoder, G722Encoder
from rtp.jitter import FrameKind
from rtp.media import CallMedia
from rtp.packet import build
from rtp.playout import OutboundFrame, Playout
from rtp.plc import Concealer
from rtp.resample import NarrowView
from rtp.stream import RtpStream, StreamConfig
from rtp.units import NS_PER_MS as MS
from tests.support import codec_signal as cs

PEER = ("127.0.0.1", 40000)


_tone = cs.tone
_frames = cs.split
_share = cs.band_share


def _receiver(payload_type: int, media_rate: int = 8000) -> RtpStream:
    config = StreamConfig(
        ssrc=2, initial_seq=1, initial_timestamp=0, cname="t", remote=PEER, payload_type=payload_type,
        media_rate=media_rate,
    )  # fmt: skip
    return RtpStream(config, lambda: 0.5)


def _through(
    stream: RtpStream, payloads: list[bytes], lost: tuple[int, ...] = ()
) -> list[tuple[bytes, FrameKind]]:
    out = []
    for i, payload in enumerate(payloads):
        if i not in lost:
            stream.receive(build(stream._pt, False, i + 1, 160 * i, 7, payload), PEER, i * 20 * MS)
        frame = stream.pull_frame(i * 20 * MS + 10 * MS)
        if frame is not None:
            out.append((frame.pcm, frame.kind))
    return out


def test_a_6khz_tone_reaches_the_session_at_16khz_on_a_wide_g722_stream_and_not_on_an_8khz_one() -> None:
    encoder = G722Encoder()
    payloads = [encoder(f) for f in _frames(_tone(6000.0, 40, 16000), 320)]  # 640-byte frames in
    assert {len(p) for p in payloads} == {160}
    wide = _receiver(G722, 16000)
    assert wide.media_rate == 16000
    frames = [pcm for pcm, _ in _through(wide, payloads)]
    assert {len(pcm) for pcm in frames} == {640}
    heard = b"".join(frames[5:])
    assert _share(heard, 16000, 5800, 6200) > 0.9  # the tone itself, at 16 kHz
    narrow = [pcm for pcm, _ in _through(_receiver(G722), payloads)]  # the 8 kHz frame path: gone
    assert {len(pcm) for pcm in narrow} == {320}
    x = np.frombuffer(b"".join(narrow[5:]), dtype="<i2").astype(np.float64)
    assert x.std() < 0.05 * 8000 / np.sqrt(2)


def test_a_lost_packet_of_a_wide_stream_is_concealed_at_16khz() -> None:
    encoder = G722Encoder()
    signal = _tone(440.0, 30, 16000) + _tone(5000.0, 30, 16000, 2000.0)
    payloads = [encoder(f) for f in _frames(signal, 320)]
    out = _through(_receiver(G722, 16000), payloads, lost=(12,))
    kinds = [kind for _, kind in out]
    assert kinds.count(FrameKind.CONCEALED) == 1 and all(len(pcm) == 640 for pcm, _ in out)
    lag, score = cs.best(signal.astype(np.float64), cs.pcm([pcm for pcm, _ in out]), max_lag=800)
    assert score > 0.9, (lag, score)  # the concealed frame continues the signal: no gap, no click


def test_the_wide_concealer_fades_to_its_own_silence_after_60_ms() -> None:
    plc = Concealer(2)
    tone = _frames(_tone(300.0, 3, 16000), 320)
    for frame in tone:
        plc.good(frame)
    concealed = [plc.conceal() for _ in range(4)]
    assert [len(c) for c in concealed] == [640] * 4
    assert any(concealed[0]) and concealed[3] is plc.silence == bytes(640)
    assert Concealer().silence == bytes(320)


def test_an_8khz_codec_sends_the_8khz_view_of_a_16khz_frame() -> None:
    config = StreamConfig(ssrc=1, initial_seq=1, initial_timestamp=0, cname="t", remote=PEER, payload_type=0)
    media = CallMedia(RtpStream(config, lambda: 0.5), Playout())
    wide = _tone(1000.0, 2, 16000)
    media.playout.enqueue(
        [OutboundFrame(f, 1, "relay", 20 * i, None) for i, f in enumerate(_frames(wide, 320))]
    )
    payloads = [cs.sent(media.pull_datagram(i * 20 * MS)).payload for i in range(2)]
    view = NarrowView()
    assert payloads == [ulaw_encode(view(f)) for f in _frames(wide, 320)]
    assert {len(p) for p in payloads} == {160}  # 20 ms of µ-law, not 40
    narrow = _tone(1000.0, 1, 8000).tobytes()
    assert view(narrow) is narrow  # an 8 kHz frame is not touched
    assert ulaw_decode(payloads[1])  # (decodes)


def test_the_g722_encoder_takes_a_16khz_frame_as_it_is_and_an_8khz_one_as_before() -> None:
    wide = _frames(_tone(6000.0, 10, 16000), 320)
    encoder, decoder = G722Encoder(), G722Decoder(wide=True)
    back = b"".join(decoder(encoder(f)) for f in wide)
    assert _share(back[640 * 3 :], 16000, 5800, 6200) > 0.9
    narrow = _frames(_tone(1000.0, 10, 8000), 160)
    before, now = G722Encoder(), G722Encoder()
    assert [before(f) for f in narrow] == [now(f) for f in narrow]  # the narrow path: the same encoder


# The 8 kHz path's bytes, hashed: PCMU in through the jitter buffer with three losses concealed, and PCMU out
# passed through from the provider's µ-law (DESIGN §5). Computed on the tree before the media rate existed.
GOLDEN = {"pcmu_in": "dcec5364f24a5ffb:12800", "pcmu_passthrough": "0192ae401fb64076:9600"}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16] + f":{len(data)}"


def _golden_tone() -> np.ndarray:
    t = np.arange(160 * 40) / 8000
    return (6000 * np.sin(2 * np.pi * 440 * t) + 2000 * np.sin(2 * np.pi * 1320 * t)).astype("<i2")


def test_the_8khz_path_gives_the_same_bytes_as_before() -> None:
    from bridge.engine.reservoir import TICK_NS, OutputPath
    from providers.limits import AudioLimits
    from rtp.audio import PCMU_8K
    from rtp.packet import parse
    from sip.leg import PlayoutLeg

    narrow = _golden_tone()
    received = _through(_receiver(0), [ulaw_encode(f) for f in _frames(narrow, 160)], lost=(12, 20, 21))
    assert _digest(b"".join(pcm for pcm, _ in received)) == GOLDEN["pcmu_in"]
    playout = Playout()
    path = OutputPath(
        AudioLimits(16_000, 3_000), PCMU_8K, PlayoutLeg(playout), lead_frames=2, item_quiet_ms=300
    )
    path.push(ulaw_encode(narrow.tobytes()), "item", 0)
    config = StreamConfig(ssrc=1, initial_seq=1, initial_timestamp=0, cname="t", remote=PEER, payload_type=0)
    media = CallMedia(RtpStream(config, lambda: 0.5), playout)
    wire = []
    for i in range(60):
        path.tick(i * TICK_NS)
        datagram = media.pull_datagram(i * TICK_NS)
        if datagram is not None:
            packet = parse(bytes(datagram))
            assert packet is not None and not isinstance(packet, int)
            wire.append(packet.payload)
            media.sent(i * TICK_NS)
    assert _digest(b"".join(wire)) == GOLDEN["pcmu_passthrough"]


def test_a_re_offer_from_wide_g722_to_pcmu_and_back_changes_the_frames_rate_and_the_concealer() -> None:
    stream = _receiver(G722, 16000)
    assert stream.media_rate == 16000 and stream.jitter.plc.silence == bytes(640)
    stream.recodec(0, None, 101)  # PCMU: its 8 kHz frames, an 8 kHz concealer
    assert stream.media_rate == 8000 and stream.jitter.plc.silence == bytes(320)
    narrow = _frames(_tone(1000.0, 5, 8000), 160)
    out = _through(stream, [ulaw_encode(f) for f in narrow])
    assert out and {len(pcm) for pcm, _ in out} == {320}
    stream.recodec(G722, None, 101)  # and back: 16 kHz again
    assert stream.media_rate == 16000 and stream.jitter.plc.silence == bytes(640)


def test_the_8khz_view_of_a_wide_decode_is_the_narrow_decode_byte_for_byte() -> None:
    """A G.711 provider (or AMD, the recording) on a 16 kHz G.722 leg hears what it heard when the leg was
    decoded to 8 kHz: the same decimator, in the same place."""
    encoder = G722Encoder()
    payloads = [encoder(f) for f in _frames(_tone(300.0, 20, 16000) + _tone(5000.0, 20, 16000, 3000.0), 320)]
    wide, narrow, view = G722Decoder(wide=True), G722Decoder(), NarrowView()
    assert [view(wide(p)) for p in payloads] == [narrow(p) for p in payloads]
