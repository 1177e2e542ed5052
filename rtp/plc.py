"""Packet-loss concealment for 8 kHz G.711, after the idea of ITU-T G.711 Appendix I (own implementation).

A 16 kHz stream (G.722 at its own rate, rtp.g722) runs the same rules on `Concealer(2)`: every length below
is then twice as many samples, the pitch is searched on every second sample of the history (the same lags
at 8 kHz: enough for a period; the band above 4 kHz is repeated with it).

When a 20 ms frame is missing, the lost audio is synthesised from the last ~60 ms that was played:
- the pitch period P (40..120 samples, 5..15 ms) is the lag with the highest normalised correlation between
  the last 20 ms of history and the history P samples earlier;
- the signal is continued by repeating the last pitch period (a loop whose end is cross-faded over P/4 into
  the samples before it, so the repeat has no click at the seam);
- after 10 ms of loss the loop grows to two periods, after 20 ms to three (one repeated period sounds
  buzzy), each switch cross-faded over P/4;
- the first 10 ms play at full level, then the level falls linearly by 20 % per 10 ms, so 60 ms after the
  loss began the output is silence (and stays silence, at no cost);
- the first good frame after a loss is cross-faded in from the synthetic signal over 4 ms plus 1 ms per
  further 10 ms lost (at most 10 ms).

Unlike Appendix I this adds no delay: the bridge plays a frame as soon as its tick comes, so nothing already
played can be overlap-added afterwards. The cost on the good path is three reference swaps per frame (the
history is the last three frames as the `bytes` they already are); numpy work happens only around a loss.
"""

from __future__ import annotations

import numpy as np

from rtp.audio import FRAME_SAMPLES, PCM16_FRAME_BYTES

__all__ = ["Concealer", "SILENCE_FRAME"]

SILENCE_FRAME = bytes(PCM16_FRAME_BYTES)

_MIN_PITCH = 40
_MAX_PITCH = 120
_CORR_LEN = 160  # the last 20 ms are matched against earlier history
_FULL_LEVEL = 80  # samples (10 ms) of synthesis at full level
_FADE_PER_SAMPLE = 0.2 / 80  # then -20 % per 10 ms
_SILENT_AFTER = 480  # 60 ms: fully attenuated
_HISTORY = 3 * FRAME_SAMPLES  # 480 samples >= 3 * MAX_PITCH + MAX_PITCH // 4


class Concealer:
    """Per-stream PLC state. Call `good(pcm)` for every frame that arrived (it returns the frame to play, the
    same object unless a loss just ended) and `conceal()` for every missing frame."""

    __slots__ = (
        "_f",
        "_frame",
        "_h0",
        "_h1",
        "_h2",
        "_lost",
        "_pitch",
        "_synthetic",
        "frames_concealed",
        "silence",
    )

    def __init__(self, factor: int = 1) -> None:
        # `factor` x 8 kHz frames (2: a 16 kHz G.722 leg): every length above in samples scales with it, the
        # pitch is searched on every `factor`-th sample (the same 40..120 lags at 8 kHz)
        self._f = factor
        self._frame = factor * FRAME_SAMPLES
        self.silence = SILENCE_FRAME if factor == 1 else bytes(2 * self._frame)
        self._h0 = self._h1 = self._h2 = self.silence  # newest first
        self._lost = 0  # samples synthesised since the loss began (0: not in a loss)
        self._pitch = 0
        self._synthetic = _GAIN * 0.0  # the current loss's concealment signal, gain applied
        self.frames_concealed = 0

    def reset(self) -> None:
        """Forget the history (new SSRC): the next loss conceals from silence."""
        self._h0 = self._h1 = self._h2 = self.silence
        self._lost = 0
        self._pitch = 0

    def good(self, pcm: bytes) -> bytes:
        """A received 20 ms PCM16 frame; returns what to play (cross-faded in if a loss just ended)."""
        if self._lost:
            pcm = self._recover(pcm)
        self._h2, self._h1, self._h0 = self._h1, self._h0, pcm
        return pcm

    def conceal(self) -> bytes:
        """Synthesise the next missing 20 ms frame (PCM16LE, 320 bytes; 640 at 16 kHz)."""
        self.frames_concealed += 1
        if self._lost == 0:
            self._start()
        start, n = self._lost, self._frame
        self._lost += n
        if start >= _SILENT_AFTER * self._f or self._pitch == 0:
            return self.silence
        return _to_pcm(self._synthetic[start : start + n])

    # --- internals (run only around a loss) ---

    def _start(self) -> None:
        """Synthesise the whole loss at once: 60 ms of concealment plus the longest cross-fade (10 ms)."""
        joined = self._h2 + self._h1 + self._h0
        if not joined.strip(b"\x00"):  # digital silence: nothing to continue (a C scan, not numpy's any)
            self._pitch = 0
            return
        hist = np.frombuffer(joined, dtype="<i2").astype(np.float32)
        f = self._f
        self._pitch = _pitch(hist[f - 1 :: f]) * f
        if self._pitch:
            self._synthetic = _synthesise(hist, self._pitch, f) * _gain(f)

    def _recover(self, pcm: bytes) -> bytes:
        lost = self._lost
        self._lost = 0
        f = self._f
        if len(pcm) != 2 * self._frame:
            return pcm
        real = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
        # 4 ms + 1 ms per further 10 ms, <= 10 ms
        ola = f * min(32 + 8 * max(0, (lost // (8 * f) - 10) // 10), 80)
        w = _ramp(ola)
        synth: np.ndarray | float = 0.0
        if self._pitch and lost < _SILENT_AFTER * f:
            synth = self._synthetic[lost : lost + ola]
        real[:ola] = (1.0 - w) * synth + w * real[:ola]
        return _to_pcm(real)


def _pitch(hist: np.ndarray) -> int:
    """Lag in [40, 120] maximising the normalised correlation of the last 20 ms with the history before it."""
    target = hist[-_CORR_LEN:]
    span = hist[-_CORR_LEN - _MAX_PITCH : hist.size - _MIN_PITCH]  # windows for lags 120 down to 40
    dots = np.correlate(span, target, mode="valid")
    sq = np.concatenate(([0.0], np.cumsum(span.astype(np.float64) ** 2)))
    energy = sq[_CORR_LEN:] - sq[: sq.size - _CORR_LEN] + 1e-3
    score = np.where(dots > 0, dots * dots / energy, 0.0)
    return int(_MAX_PITCH - int(np.argmax(score)))


def _loop(hist: np.ndarray, n: int, q: int) -> np.ndarray:
    """The last n samples of history, their end cross-faded into what preceded them (a click-free loop)."""
    loop = hist[-n:].copy()
    w = _FADE_IN[q]
    loop[-q:] = (1.0 - w) * hist[-q:] + w * hist[-n - q : -n]
    return loop


def _synthesise(hist: np.ndarray, pitch: int, f: int = 1) -> np.ndarray:
    """Samples 0.._SYNTH_LEN (x f) of the concealment: one period repeated for the first 10 ms, two up to 20 ms,
    three after, each switch cross-faded over P/4 (before the gain is applied)."""
    q = max(1, pitch // 4)
    pos = _POS if f == 1 else np.arange(_SYNTH_LEN * f)
    t1, t2 = 80 * f, 160 * f
    s1, s2, s3 = (_loop(hist, m * pitch, q)[pos % (m * pitch)] for m in (1, 2, 3))
    out = np.where(pos < t1, s1, np.where(pos < t2, s2, s3))
    w = _ramp(q)
    out[t1 : t1 + q] = (1.0 - w) * s1[t1 : t1 + q] + w * s2[t1 : t1 + q]
    out[t2 : t2 + q] = (1.0 - w) * s2[t2 : t2 + q] + w * s3[t2 : t2 + q]
    return out


def _gain(f: int) -> np.ndarray:
    """The level envelope at f x 8 kHz (f = 1: `_GAIN`)."""
    gain: np.ndarray = _GAIN
    if f != 1:
        pos = np.arange(_SYNTH_LEN * f) / f
        gain = np.clip(1.0 - (pos - _FULL_LEVEL) * _FADE_PER_SAMPLE, 0.0, 1.0).astype(np.float32)
    return gain


def _ramp(n: int) -> np.ndarray:
    """(1 .. n) / (n + 1): an exclusive linear cross-fade of n samples."""
    return _RAMPS[n]


_SYNTH_LEN = _SILENT_AFTER + 80
_POS = np.arange(_SYNTH_LEN)
_GAIN = np.clip(1.0 - (_POS - _FULL_LEVEL) * _FADE_PER_SAMPLE, 0.0, 1.0).astype(np.float32)
_RAMPS = {n: (np.arange(n, dtype=np.float32) + 1.0) / (n + 1) for n in range(1, 161)}  # up to 10 ms at 16 kHz
_FADE_IN = {
    q: np.linspace(0.0, 1.0, q, endpoint=False, dtype=np.float32) for q in range(1, _MAX_PITCH // 2 + 1)
}


def _to_pcm(samples: np.ndarray) -> bytes:
    pcm: bytes = np.clip(np.rint(samples), -32768, 32767).astype("<i2").tobytes()
    return pcm
