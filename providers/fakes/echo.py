"""A deterministic echo "model": find the caller's utterances by energy, each with the client's own bytes.

Every fake's VAD is this detector. It is format-agnostic: the protocol core decodes the client's audio to PCM16
for analysis and also hands over the *raw client bytes*, and each utterance carries exactly those bytes, so a
scripted reply may echo them and a test can check the bridge's passthrough bit for bit. Replies and their
pacing (`MediaClock`) are the protocol core's.

Rules (all positions are input-audio samples, counted from bytes, never from a clock):

* A `window_ms` analysis window is voiced when its RMS exceeds `threshold_dbfs` (full scale = 32768).
* An utterance starts at the first voiced window and ends once `hangover_ms` of unvoiced audio has followed
  the end of the last voiced window, or once its voiced span reaches `max_utterance_ms`.
* Utterances with less than `min_utterance_ms` of voiced audio in total are ignored.
* The utterance's span is [first voiced - pad_ms, last voiced end + pad_ms], clipped to what was received.

Outputs are events pulled with `next_event()`, stamped with the `now` of the audio that decided them. Memory
is bounded: idle, only `pad_ms` of raw audio is kept; during an utterance, its padded span (capped by
`max_utterance_ms`).

Two opt-in extensions serve the Realtime-family fakes, whose server VAD reports the *start* of speech (for
`speech_started` and barge-in):

* `report_starts`: an `UtteranceStarted` event once an utterance has `min_utterance_ms` of voiced audio, i.e.
  exactly when it is certain to be reported by `UtteranceDetected` later (same `index`).

Gemini's VAD is this detector too, with two more: `onset_ms`, an utterance begins only with that much
consecutive voiced audio (its pre-roll is the `pad_ms` before that run), and `report_onsets`, its
`UtteranceStarted` comes as soon as it begins (a barge-in), even if it then ends too short to be detected (the
next one takes its index). `end_utterance(now)` ends the one in progress at once (the client's audio ended).
"""

from __future__ import annotations

import math
import sys
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from rtp.audio import Encoding
from rtp.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

_audioop: ModuleType | None = None
if sys.byteorder == "little":  # audioop reads native samples; ours are little-endian
    try:
        with warnings.catch_warnings():  # deprecated in 3.11, gone in 3.13 (as rtp/g711.py uses it)
            warnings.simplefilter("ignore", DeprecationWarning)
            import audioop as _audioop
    except ImportError:  # pragma: no cover - Python 3.13 and later
        pass

__all__ = [
    "EchoOptions",
    "Utterance",
    "UtteranceStarted",
    "UtteranceDetected",
    "EchoEvent",
    "EchoModel",
    "MediaClock",
    "check_options",
    "codec",
    "mean_square",
    "voiced_windows",
]

_FULL_SCALE = 32768.0


_CODECS: dict[Encoding, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
    Encoding.PCMU: (ulaw_decode, ulaw_encode),
    Encoding.PCMA: (alaw_decode, alaw_encode),
}


def codec(encoding: Encoding) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    """(to PCM16LE, from PCM16LE) for a client's encoding (`bytes` both ways for PCM16 itself)."""
    return _CODECS.get(encoding, (bytes, bytes))


def check_options(options: object, positive: tuple[str, ...], non_negative: tuple[str, ...] = ()) -> None:
    """A fake's options checked when made: ValueError naming the first field that is not positive (or is
    negative)."""
    for name in positive:
        if getattr(options, name) <= 0:
            raise ValueError(f"{name} must be positive")
    for name in non_negative:
        if getattr(options, name) < 0:
            raise ValueError(f"{name} must not be negative")


def mean_square(dbfs: float) -> float:
    """The mean square of a window at `dbfs` (full scale 32768): the energy detector compares mean squares, so
    the test per window needs no sqrt or log."""
    return (_FULL_SCALE * 10 ** (dbfs / 20)) ** 2


def voiced_windows(pcm: bytes, window: int, threshold: float) -> list[bool]:
    """The energy detector every fake's VAD runs: for each whole `window` (samples) of PCM16LE, whether its mean
    square exceeds `threshold` (see `mean_square`); a partial last window is left out."""
    n = len(pcm) // (2 * window)
    x = np.frombuffer(pcm, dtype="<i2", count=n * window).astype(np.float64).reshape(n, window)
    voiced: list[bool] = (np.einsum("ij,ij->i", x, x) / window > threshold).tolist()
    return voiced


@dataclass(frozen=True, slots=True)
class EchoOptions:
    """Detection knobs, in two groups: how an utterance begins and is reported, what it spans; then the pacing
    a speaking fake inherits. The defaults suit telephone speech."""

    threshold_dbfs: float = -40.0
    window_ms: int = 20
    onset_ms: int = 0
    """Consecutive voiced audio that begins an utterance (0: its first voiced window)."""
    min_utterance_ms: int = 120
    report_starts: bool = False
    """Emit `UtteranceStarted` when an utterance becomes certain (see the module docstring)."""
    report_onsets: bool = False
    """Emit `UtteranceStarted` as soon as an utterance begins, before it is certain."""

    hangover_ms: int = 400
    pad_ms: int = 60
    max_utterance_ms: int = 30_000

    speak: bool = False
    """Always False: the model only detects; a fake's replies are its protocol core's."""
    chunk_ms: int = 40
    lead_ms: int = 0
    max_queued: int = 32
    """The pacing of a fake that speaks its replies (GPT-Live's options inherit these): `chunk_ms` of audio
    per chunk, `lead_ms` allowed out at once, at most `max_queued` replies waiting."""

    def __post_init__(self) -> None:
        if self.speak:
            raise ValueError("speak: the echo model only detects utterances")
        positive = ("window_ms", "chunk_ms", "max_utterance_ms", "max_queued")
        check_options(self, positive, ("hangover_ms", "min_utterance_ms", "pad_ms", "lead_ms", "onset_ms"))


@dataclass(frozen=True, slots=True)
class Utterance:
    """One detected utterance. Positions are samples on the input timeline (0 = first sample received)."""

    index: int
    """1-based, in detection order."""
    rate: int
    start: int
    """Start of the echoed (padded, clipped) span."""
    end: int
    """End (exclusive) of the echoed span."""
    voiced_start: int
    voiced_end: int
    voiced_samples: int
    audio: bytes
    """The client's raw bytes for [start, end), exactly as received."""

    @property
    def start_ms(self) -> int:
        return self.start * 1000 // self.rate

    @property
    def end_ms(self) -> int:
        return -(-self.end * 1000 // self.rate)

    @property
    def duration_ms(self) -> float:
        return (self.end - self.start) * 1000 / self.rate


@dataclass(frozen=True, slots=True)
class UtteranceStarted:
    """Utterance `index` has begun (first voiced sample `voiced_start`); reported at `now` = `at`.

    Only with `EchoOptions.report_starts`. It comes once the utterance holds `min_utterance_ms` of voiced audio,
    so an `UtteranceDetected` with the same index always follows.
    """

    index: int
    rate: int
    voiced_start: int
    voiced_start_ms: int
    """The same in ms (floored)."""
    at: int


@dataclass(frozen=True, slots=True)
class UtteranceDetected:
    """An utterance ended (hangover elapsed or length cap reached) at `now` = `at`."""

    utterance: Utterance
    at: int


EchoEvent = UtteranceStarted | UtteranceDetected


@dataclass(slots=True)
class MediaClock:
    """The pacing of one reply: `m` ns of its audio may be out at `due(m)`. The clock reads `at_m` at `at_t` and
    runs at `speed` (1: real time); `rebase` changes the speed at `now`, so that what was already due keeps its
    time. A reply that starts at t0 with `lead` ns allowed out at once: `MediaClock(t0, lead)`."""

    at_t: int
    at_m: float
    speed: float = 1.0

    def due(self, m: int) -> int:
        if m <= self.at_m:
            return self.at_t
        return self.at_t + math.ceil((m - self.at_m) / self.speed)

    def rebase(self, now: int, speed: float) -> None:
        if now > self.at_t:
            self.at_m += (now - self.at_t) * self.speed
            self.at_t = now
        self.speed = speed


class EchoModel:
    """Energy-based utterance detector, driven by `receive_audio` (and `end_utterance`).

    `sample_width` is the byte width of one sample in the client's encoding (1 for G.711, 2 for PCM16); it maps
    sample positions to raw byte offsets so an utterance's audio is the exact client bytes.
    """

    def __init__(self, rate: int, sample_width: int, options: EchoOptions | None = None) -> None:
        if rate <= 0 or sample_width not in (1, 2):
            raise ValueError(f"unsupported audio: rate={rate}, sample_width={sample_width}")
        self.options = opts = options or EchoOptions()
        self.rate = rate
        self.sample_width = sample_width
        self._window = rate * opts.window_ms // 1000
        if self._window <= 0:
            raise ValueError("window_ms is shorter than one sample")
        self._hangover = rate * opts.hangover_ms // 1000
        self._min_voiced = rate * opts.min_utterance_ms // 1000
        self._pad = rate * opts.pad_ms // 1000
        self._onset = max(1, -(-opts.onset_ms // opts.window_ms))  # in windows
        self._max_span = rate * opts.max_utterance_ms // 1000
        self._threshold_ms = mean_square(opts.threshold_dbfs)
        self._threshold_rms = math.sqrt(self._threshold_ms)

        self._received = 0  # samples received
        self._analysed = 0  # samples covered by complete windows
        self._pending = bytearray()  # PCM16 not yet in a complete window
        self._raw = bytearray()  # raw client bytes from sample _raw_start on
        self._raw_start = 0
        self._run = 0  # voiced windows in a row before an utterance begins
        self._first_voiced: int | None = None
        self._last_voiced_end = 0
        self._voiced = 0
        self._started = False  # UtteranceStarted reported for the utterance in progress
        self._count = 0
        self._events: deque[EchoEvent] = deque()

    # -- inputs ---------------------------------------------------------------------------------------------

    def receive_audio(self, raw: bytes, pcm: bytes, now: int) -> None:
        """Take the next stretch of client audio: `raw` as sent, `pcm` the same samples as PCM16LE."""
        samples = len(pcm) // 2
        if len(pcm) % 2 or len(raw) != samples * self.sample_width:
            raise ValueError("raw and pcm must hold the same whole number of samples")
        self._raw += raw
        self._received += samples
        if not self._pending and samples == self._window:
            # One whole window and nothing pending (a 20 ms frame, the common case).
            self._analyse_window(self._voiced_window(pcm), now)
        else:
            self._pending += pcm
            if cut := len(self._pending) // (2 * self._window) * 2 * self._window:
                voiced = voiced_windows(bytes(self._pending[:cut]), self._window, self._threshold_ms)
                del self._pending[:cut]
                for v in voiced:
                    self._analyse_window(v, now)
        self._trim()

    def end_utterance(self, now: int) -> None:
        """End the utterance in progress now, as its hangover would (the client said its audio ended)."""
        if self._first_voiced is not None:
            self._end_utterance(now)
            self._trim()

    # -- outputs --------------------------------------------------------------------------------------------

    def next_event(self) -> EchoEvent | None:
        return self._events.popleft() if self._events else None

    @property
    def position_ms(self) -> int:
        """Input audio received so far, in ms."""
        return self._received * 1000 // self.rate

    @property
    def retained_bytes(self) -> int:
        """Raw and PCM bytes held for detection (introspection for memory-bound tests)."""
        return len(self._raw) + len(self._pending)

    # -- detection ------------------------------------------------------------------------------------------

    def _voiced_window(self, pcm: bytes) -> bool:
        """One window's mean square above the threshold, decided exactly as the general path's einsum does.

        audioop.rms is floor(sqrt(q)) of the very double q = sum of squares / window that einsum's path compares
        (both sums are exact: every partial sum is an integer below 2**53), and a correctly rounded sqrt keeps
        order: an rms above sqrt(threshold) is voiced, one whose next integer is at or below it is not. Only a
        window whose rms is floor(sqrt(threshold)) itself is computed in full, as a dot product (exact too).
        """
        if _audioop is not None:
            r = _audioop.rms(pcm, 2)
            if r > self._threshold_rms:
                return True
            if r + 1 <= self._threshold_rms:
                return False
        x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
        return float(x @ x) / self._window > self._threshold_ms

    def _analyse_window(self, voiced: bool, now: int) -> None:
        start = self._analysed
        end = self._analysed = start + self._window
        if self._first_voiced is None:
            self._run = self._run + 1 if voiced else 0
            if self._run >= self._onset:
                self._voiced = self._run * self._window
                self._first_voiced, self._last_voiced_end, self._run = end - self._voiced, end, 0
                self._started = False
                self._report_start(now)
            return
        if voiced:
            self._last_voiced_end = end
            self._voiced += self._window
            self._report_start(now)
        elif end - self._last_voiced_end >= self._hangover:
            self._end_utterance(now)
            return
        if self._last_voiced_end - self._first_voiced >= self._max_span:
            self._end_utterance(now)

    def _report_start(self, now: int) -> None:
        opts = self.options
        if not self._started and (
            opts.report_onsets or opts.report_starts and self._voiced >= self._min_voiced
        ):
            self._started = True
            assert self._first_voiced is not None
            first = self._first_voiced
            self._events.append(
                UtteranceStarted(self._count + 1, self.rate, first, first * 1000 // self.rate, now)
            )

    def _end_utterance(self, now: int) -> None:
        first = self._first_voiced
        assert first is not None
        self._first_voiced = None
        if self._voiced < self._min_voiced:
            return
        start = max(first - self._pad, self._raw_start)
        end = min(self._last_voiced_end + self._pad, self._received)
        w = self.sample_width
        audio = bytes(self._raw[(start - self._raw_start) * w : (end - self._raw_start) * w])
        self._count += 1
        u = Utterance(self._count, self.rate, start, end, first, self._last_voiced_end, self._voiced, audio)
        self._events.append(UtteranceDetected(u, now))

    def _trim(self) -> None:
        """Drop raw audio no future utterance can need: anything before (utterance start or next window) - pad."""
        anchor = (
            self._analysed - self._run * self._window if self._first_voiced is None else self._first_voiced
        )
        keep = max(anchor - self._pad, self._raw_start)
        if keep > self._raw_start:
            del self._raw[: (keep - self._raw_start) * self.sample_width]
            self._raw_start = keep
