"""G.722 (ITU-T G.722, 64 kbit/s sub-band ADPCM, 16 kHz audio) at the call's edge, through PyAV (FFmpeg's g722).

On the wire (RFC 3551 §4.5.2): static payload type 9, rtpmap "G722/8000" although it samples at 16 kHz; the RTP
clock runs at 8000 Hz, so the timestamp advances 160 per 20 ms frame, as for G.711. A 20 ms frame is 160 bytes
(one byte per 125 µs: 6 bits of the low band, 2 of the high), so the jitter buffer (rtp.jitter) files and splits
G.722 payloads exactly as it does G.711's: slot = timestamp / 160, a 20 ms piece = 160 bytes.

The leg's media rate: a G.722 stream of the native engine runs at 16 kHz (rtp.stream `StreamConfig.media_rate`):
`G722Decoder(wide=True)` hands the session the decoder's 16 kHz frame as it is (640 bytes, 320 samples) and
`G722Encoder` encodes a 640-byte frame as it is, so the band above 4 kHz reaches the provider and comes back
(a session frame's length says its rate: 320 bytes 8 kHz, 640 bytes 16 kHz, both 20 ms). At 8 kHz (the
default; an engine that mixes at 8 kHz) `G722Decoder` brings the decoded frame down to 8 kHz and
`G722Encoder` brings a 320-byte frame up to 16 kHz: the provider hears and speaks 0-4 kHz, as on G.711.

Loss concealment and jitter: the jitter buffer decodes at playout, in slot order, so the ADPCM decoder sees
the packets that came in the order they were sent, never a late or duplicate one; a missing frame is
concealed by rtp.plc at the stream's media rate, as for G.711 (the decoder then resumes from its last state:
ADPCM re-adapts within a few ms, and rtp.plc's cross-fade covers the seam). A payload decoded twice in a row (the
jitter buffer's quiet-frame test before a shrink) is decoded once: the state must advance once per frame.

Outbound, the encoder is fed every slot we send audio, silence included (`G722Encoder.silence`): the peer's
decoder tracks our encoder's state through the bitstream, so a constant idle pattern in between would make
the two disagree when speech resumes.

Resampling is a 31-tap Kaiser-windowed sinc (cut-off 3.7 kHz, 15 samples of delay at 16 kHz each way), its
history kept across frames, so every frame in gives exactly one frame out (no delay line to fill, no short
first frame). Measured (tests/bench/rtp_micro.py, on a loaded 2-CPU host, so an upper bound): decode with the
decimation about 40 µs a frame, encode with the interpolation about 100 µs, against about 1 µs for a G.711
decode; the G.711 path is unchanged.
"""

from __future__ import annotations

import av
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rtp.audio import FRAME_SAMPLES, PCM16_FRAME_BYTES

__all__ = ["G722", "Decimator", "G722Decoder", "G722Encoder", "WIDE_RATE", "WideView", "lowpass", "to_pcm16"]

G722 = 9  # static payload type (RFC 3551 table 4)
WIDE_RATE = 16000
_WIDE_SAMPLES = 2 * FRAME_SAMPLES  # 320 samples of 16 kHz audio in 20 ms
_WIDE_BYTES = 2 * _WIDE_SAMPLES  # 640: a 16 kHz session frame
_SILENCE_8K = bytes(PCM16_FRAME_BYTES)
_SILENCE_16K = bytes(_WIDE_BYTES)


def lowpass(rate: int, taps: int, cutoff_hz: float = 3700.0, beta: float = 6.0) -> np.ndarray:
    """A linear-phase low-pass at `rate`, unity gain at DC: the anti-alias (and anti-image) filter between
    `rate` and the bridge's 8 kHz."""
    n = np.arange(taps) - (taps - 1) / 2
    h = np.sinc(2 * cutoff_hz / rate * n) * np.kaiser(taps, beta)
    return np.asarray(h / h.sum(), dtype=np.float32)


_H = lowpass(WIDE_RATE, 31)
_H2 = 2 * _H  # zero-stuffing halves the level: the interpolator's gain is 2
_HIST = len(_H) - 1  # 30: even, so the stuffed samples stay on even positions across frames


def to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples (overwritten) as PCM16LE bytes, rounded and clipped."""
    np.rint(samples, out=samples)
    np.clip(samples, -32768, 32767, out=samples)
    return samples.astype("<i2").tobytes()


class Decimator:
    """One 20 ms frame of `factor` x 8 kHz PCM16 in, the 8 kHz frame out (320 bytes), filtered by `taps` of
    `lowpass` whose history carries across frames: every frame in gives one frame out, `(taps - 1) / 2` input
    samples late. `push(None)` (nothing decoded) filters silence."""

    __slots__ = ("_buffer", "_filter", "_history", "_samples", "_windows")

    def __init__(self, factor: int, taps: int) -> None:
        self._samples = factor * FRAME_SAMPLES
        self._filter = lowpass(factor * 8000, taps)
        self._history = taps - 1
        self._buffer = np.zeros(self._history + self._samples, dtype=np.float32)  # history, then this frame
        self._windows = sliding_window_view(self._buffer, taps)[::factor]  # only the outputs kept

    def push(self, wide: np.ndarray | None) -> bytes:
        buffer, history = self._buffer, self._history
        buffer[:history] = buffer[self._samples :]
        if wide is not None:
            buffer[history:] = wide
        else:
            buffer[history:] = 0
        return to_pcm16(self._windows @ self._filter)


class G722Decoder:
    """One stream's G.722 decoder: `decoder(payload)` is the 8 kHz PCM16 of one 160-byte frame (320 bytes), as
    rtp.jitter's `decode` wants it; with `wide`, its 16 kHz PCM16 (640 bytes). Never raises on peer input: a
    payload FFmpeg refuses decodes to silence."""

    __slots__ = ("_context", "_decimator", "_last_in", "_last_out", "_silence", "errors")

    def __init__(self, *, wide: bool = False) -> None:
        context = av.CodecContext.create("g722", "r")
        context.sample_rate = WIDE_RATE
        context.layout = "mono"
        context.open()
        self._context = context
        self._decimator = None if wide else Decimator(2, len(_H))
        self._silence = _SILENCE_16K if wide else _SILENCE_8K
        self._last_in: bytes | None = None
        self._last_out = self._silence
        self.errors = 0

    def __call__(self, payload: bytes) -> bytes:
        if (
            payload is self._last_in
        ):  # the same frame asked again (rtp.jitter's shrink test): state moves once
            return self._last_out
        try:  # (an empty packet would end FFmpeg's stream: every later decode would fail)
            frames = self._context.decode(av.Packet(payload)) if payload else []
        except (av.FFmpegError, ValueError):
            frames = []
        wide = None
        if len(frames) == 1 and frames[0].samples == _WIDE_SAMPLES:
            wide = np.frombuffer(memoryview(frames[0].planes[0]), dtype="<i2", count=_WIDE_SAMPLES)
        else:
            self.errors += 1
        decimator = self._decimator
        if decimator is not None:
            out = decimator.push(wide)
        else:
            out = self._silence if wide is None else wide.tobytes()
        self._last_in, self._last_out = payload, out
        return out


class WideView:
    """The 16 kHz view of a stream of session frames, for an encoder that runs at 16 kHz (G.722 always, Opus
    on a 16 kHz leg: rtp.opus): `view(pcm)` is a 640-byte frame itself and a 320-byte (8 kHz) one brought up
    through the zero-stuffing interpolator (a short one padded with silence), its history kept across frames
    (one frame in, one out); after a 16 kHz frame the history goes on from silence. One view per stream."""

    __slots__ = ("_buffer", "_windows")

    def __init__(self) -> None:
        self._buffer = np.zeros(_HIST + _WIDE_SAMPLES, dtype=np.float32)  # zero-stuffed: history, this frame
        self._windows = sliding_window_view(self._buffer, len(_H2))

    def __call__(self, pcm: bytes) -> bytes:
        buffer = self._buffer
        if len(pcm) == _WIDE_BYTES:  # a 16 kHz leg's frame: no detour through 8 kHz
            buffer[:] = 0
            return pcm
        narrow = np.frombuffer(pcm, dtype="<i2", count=min(len(pcm) // 2, FRAME_SAMPLES))
        buffer[:_HIST] = buffer[_WIDE_SAMPLES:]
        buffer[_HIST:] = 0
        buffer[_HIST : _HIST + 2 * len(narrow) : 2] = narrow
        return to_pcm16(self._windows @ _H2)


class G722Encoder:
    """One stream's G.722 encoder: `encoder(pcm)` is the 160-byte G.722 frame of one 20 ms frame of 8 kHz PCM16
    (320 bytes; a short one is padded with silence), or of 16 kHz PCM16 (640 bytes, encoded as it is; the
    interpolator's history then goes on from silence): `WideView`."""

    __slots__ = ("_context", "_frame", "_wide")

    silence = _SILENCE_8K  # what to encode in a slot with nothing to say (see the module docstring)

    def __init__(self) -> None:
        context = av.CodecContext.create("g722", "w")
        context.sample_rate = WIDE_RATE
        context.layout = "mono"
        context.format = "s16"
        context.open()
        self._context = context
        self._frame = av.AudioFrame(format="s16", layout="mono", samples=_WIDE_SAMPLES)
        self._frame.sample_rate = WIDE_RATE
        self._wide = WideView()

    def __call__(self, pcm: bytes) -> bytes:
        frame = self._frame
        frame.planes[0].update(self._wide(pcm))
        frame.pts = None
        packets = self._context.encode(frame)
        return bytes(packets[0]) if len(packets) == 1 else b"".join(bytes(p) for p in packets)
