"""Sample-rate conversion of mono PCM16LE on the media path, through PyAV (FFmpeg's libswresample).

Gemini Live takes 16 kHz input and sends 24 kHz output; the telephone leg is 8 kHz. One `Resampler` converts
one direction of one stream: it is stateful, so consecutive 20 ms chunks join without clicks (the filter's
history carries across calls), and the output length tracks the input exactly over time (no drift): after
`flush()`, n input samples have produced round(n * out_rate / in_rate) output samples.

The filter delays its output by a few samples (libswresample's polyphase filter needs look-ahead: 16 output
samples for 8 -> 16 kHz), so the first chunk comes out slightly short and `flush()` returns the tail.

Cost: about 30 µs per 20 ms frame (one frame allocation, one filter pass); nothing else is allocated per call.

`NarrowView` is the other way a frame changes rate: the 8 kHz view of a 16 kHz leg's frames (rtp.g722) for
what runs at 8 kHz only, through rtp.g722's own decimator (one frame in, one out, no delay line to fill).
`PcmInput` brings a 16 kHz leg's frames to a PCM16 provider's input rate (24 kHz for the OpenAI family).
"""

from __future__ import annotations

import av
import numpy as np

from rtp.g722 import WIDE_RATE, Decimator, WideView

__all__ = ["WIDE_FRAME_BYTES", "NarrowView", "PcmInput", "Resampler"]

WIDE_FRAME_BYTES = WIDE_RATE * 2 // 50  # 640: a 20 ms frame at 16 kHz
_TAPS = 31  # rtp.g722's decimation filter (cut-off 3.7 kHz)


class Resampler:
    """Converts PCM16LE mono from `in_rate` to `out_rate`, chunk by chunk.

    `process` may be given any number of bytes (an odd trailing byte waits for the next call). `flush` ends the
    stream, returns what the filter still holds and leaves the resampler ready for a new stream; `reset`
    drops everything held without returning it (after a barge-in, say).
    """

    __slots__ = ("in_rate", "out_rate", "_resampler", "_carry", "_passthrough")

    def __init__(self, in_rate: int, out_rate: int) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._passthrough = in_rate == out_rate
        self._carry = b""
        self._resampler: av.AudioResampler | None = None
        self.reset()

    def process(self, pcm: bytes) -> bytes:
        """Resample the next stretch of input; returns whatever output is ready (possibly empty)."""
        if self._carry:
            pcm = self._carry + pcm
            self._carry = b""
        if len(pcm) % 2:
            pcm, self._carry = pcm[:-1], pcm[-1:]
        if not pcm:
            return b""
        if self._passthrough:
            return bytes(pcm)
        frame = av.AudioFrame(format="s16", layout="mono", samples=len(pcm) // 2)
        frame.planes[0].update(pcm)
        frame.sample_rate = self.in_rate
        assert self._resampler is not None
        return self._collect(self._resampler.resample(frame))

    def flush(self) -> bytes:
        """End the stream: the filter's remaining output (a lone odd byte of input is dropped)."""
        self._carry = b""
        if self._passthrough or self._resampler is None:
            return b""
        tail = self._collect(self._resampler.resample(None))
        self._resampler = self._new()
        return tail

    def reset(self) -> None:
        """Forget all history and anything held: the next `process` starts a fresh stream."""
        self._carry = b""
        self._resampler = None if self._passthrough else self._new()

    def _new(self) -> av.AudioResampler:
        return av.AudioResampler(format="s16", layout="mono", rate=self.out_rate)

    @staticmethod
    def _collect(frames: list[av.AudioFrame]) -> bytes:
        if len(frames) == 1:
            f = frames[0]
            return bytes(f.planes[0])[: f.samples * 2]
        return b"".join(bytes(f.planes[0])[: f.samples * 2] for f in frames)


class NarrowView:
    """The 8 kHz view of a stream of session frames, for what analyses or sends at 8 kHz only (AMD, the
    recording, a G.711 provider or encoder): `view(pcm)` is a 320-byte frame itself (no work, no allocation)
    and a 16 kHz one (640 bytes) brought down through a `Decimator` made at the first (its history is this
    stream's: one view per stream, frames in order)."""

    __slots__ = ("_decimator",)

    def __init__(self) -> None:
        self._decimator: Decimator | None = None

    def __call__(self, pcm: bytes) -> bytes:
        if len(pcm) != WIDE_FRAME_BYTES:
            return pcm
        if self._decimator is None:
            self._decimator = Decimator(2, _TAPS)
        return self._decimator.push(np.frombuffer(pcm, dtype="<i2"))


class PcmInput:
    """A stream of caller audio as PCM16 at `rate` (a provider's input rate) through one `Resampler` from 16 kHz:
    16 kHz frames (`wide`: a 16 kHz leg's, one or more joined) as they are; 8 kHz ones (the leg went back to
    G.711) brought up to 16 kHz first, frame by frame (rtp.g722 `WideView`), so the resampler's stream stays at
    one rate. The caller says the rate: two 8 kHz frames joined are as long as one 16 kHz frame. One per
    stream, frames in order."""

    __slots__ = ("_resampler", "_wide")

    def __init__(self, rate: int) -> None:
        self._wide = WideView()
        self._resampler = Resampler(WIDE_RATE, rate)

    def __call__(self, pcm: bytes, wide: bool) -> bytes:
        if not wide:
            view, step = self._wide, WIDE_FRAME_BYTES // 2
            pcm = b"".join([view(pcm[i : i + step]) for i in range(0, len(pcm), step)])
        return self._resampler.process(pcm)
