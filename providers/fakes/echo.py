"""A deterministic echo "model": find the caller's utterances by energy and speak each one back verbatim.

The fake provider servers use it as their scripted model. It is format-agnostic: the protocol core decodes the
client's audio to PCM16 for analysis and also hands over the *raw client bytes*, and the echo replays exactly
those bytes, so a test can check the bridge's passthrough bit for bit.

Rules (all positions are input-audio samples, counted from bytes, never from a clock):

* A `window_ms` analysis window is voiced when its RMS exceeds `threshold_dbfs` (full scale = 32768).
* An utterance starts at the first voiced window and ends once `hangover_ms` of unvoiced audio has followed
  the end of the last voiced window, or once its voiced span reaches `max_utterance_ms`.
* Utterances with less than `min_utterance_ms` of voiced audio in total are ignored.
* The echoed span is [first voiced - pad_ms, last voiced end + pad_ms], clipped to what was received.

Speaking back is the only part that runs on the `now` clock (monotonic int ns, always passed in): the echo of an
utterance starts at t0, the `now` at which it was detected, or when the previous echo has finished playing
(t0_prev + its duration) if that is later, so utterances queue. Chunk n (`chunk_ms` of audio) is due at
max(t0, t0 + n*chunk_ms - lead_ms). Outputs are events pulled with `next_event()`; `next_deadline()` says when
`handle_timer(now)` must run next.

Memory is bounded: idle, only `pad_ms` of raw audio is kept; during an utterance, its padded span (capped by
`max_utterance_ms`); and at most `max_queued` finished utterances wait to be spoken.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EchoOptions",
    "Utterance",
    "UtteranceDetected",
    "EchoStarted",
    "EchoAudio",
    "EchoFinished",
    "EchoEvent",
    "EchoModel",
]

_NS_PER_MS = 1_000_000
_FULL_SCALE = 32768.0


@dataclass(frozen=True, slots=True)
class EchoOptions:
    """Detection and playback knobs; the defaults suit telephone speech."""

    threshold_dbfs: float = -40.0
    window_ms: int = 20
    hangover_ms: int = 400
    min_utterance_ms: int = 120
    pad_ms: int = 60
    max_utterance_ms: int = 30_000
    chunk_ms: int = 40
    lead_ms: int = 0
    max_queued: int = 32

    def __post_init__(self) -> None:
        for name in ("window_ms", "chunk_ms", "max_utterance_ms", "max_queued"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in ("hangover_ms", "min_utterance_ms", "pad_ms", "lead_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")


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
class UtteranceDetected:
    """An utterance ended (hangover elapsed or length cap reached) at `now` = `at`."""

    utterance: Utterance
    at: int


@dataclass(frozen=True, slots=True)
class EchoStarted:
    """The echo of `utterance` began at `at`; start_ms/end_ms place it on the input-audio timeline."""

    utterance: Utterance
    at: int
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class EchoAudio:
    """Chunk `n` of an echo, in the client's own encoding; `due` is its scheduled send time."""

    index: int
    n: int
    data: bytes
    due: int


@dataclass(frozen=True, slots=True)
class EchoFinished:
    """The last chunk of echo `index` was handed out at `at`."""

    index: int
    at: int


EchoEvent = UtteranceDetected | EchoStarted | EchoAudio | EchoFinished


@dataclass(slots=True)
class _Playout:
    utterance: Utterance
    t0: int
    started: bool = False
    sent: int = 0
    n: int = 0


class EchoModel:
    """Energy-based utterance detector plus a paced, queued speaker, driven by `receive_audio` and `handle_timer`.

    `sample_width` is the byte width of one sample in the client's encoding (1 for G.711, 2 for PCM16); it maps
    sample positions to raw byte offsets so the echo can be the exact client bytes.
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
        self._max_span = rate * opts.max_utterance_ms // 1000
        # Compare mean squares, not dBFS, so the per-window test needs no sqrt or log.
        self._threshold_ms = (_FULL_SCALE * 10 ** (opts.threshold_dbfs / 20)) ** 2
        self._chunk_bytes = max(1, rate * opts.chunk_ms // 1000) * sample_width
        self._chunk_ns = opts.chunk_ms * _NS_PER_MS
        self._lead_ns = opts.lead_ms * _NS_PER_MS

        self._received = 0  # samples received
        self._analysed = 0  # samples covered by complete windows
        self._pending = bytearray()  # PCM16 not yet in a complete window
        self._raw = bytearray()  # raw client bytes from sample _raw_start on
        self._raw_start = 0
        self._first_voiced: int | None = None
        self._last_voiced_end = 0
        self._voiced = 0
        self._count = 0
        self.dropped = 0
        """Utterances dropped because `max_queued` were already waiting."""

        self._queue: deque[tuple[Utterance, int]] = deque()
        self._current: _Playout | None = None
        self._echo_end_ms = 0
        self._events: deque[EchoEvent] = deque()

    # -- inputs ---------------------------------------------------------------------------------------------

    def receive_audio(self, raw: bytes, pcm: bytes, now: int) -> None:
        """Take the next stretch of client audio: `raw` as sent, `pcm` the same samples as PCM16LE."""
        samples = len(pcm) // 2
        if len(pcm) % 2 or len(raw) != samples * self.sample_width:
            raise ValueError("raw and pcm must hold the same whole number of samples")
        self._raw += raw
        self._received += samples
        self._pending += pcm
        n = len(self._pending) // (2 * self._window)
        if n:
            cut = n * 2 * self._window
            x = np.frombuffer(bytes(self._pending[:cut]), dtype="<i2").astype(np.float64).reshape(n, self._window)
            del self._pending[:cut]
            voiced = np.einsum("ij,ij->i", x, x) / self._window > self._threshold_ms
            for v in voiced.tolist():
                self._analyse_window(v, now)
        self._trim()
        self._pump(now)

    def handle_timer(self, now: int) -> None:
        """Hand out every echo chunk due at or before `now`."""
        self._pump(now)

    # -- outputs --------------------------------------------------------------------------------------------

    def next_event(self) -> EchoEvent | None:
        return self._events.popleft() if self._events else None

    def next_deadline(self) -> int | None:
        p = self._current
        if p is None:
            return None
        if not p.started:
            return p.t0
        return self._due(p)

    @property
    def position_ms(self) -> int:
        """Input audio received so far, in ms."""
        return self._received * 1000 // self.rate

    @property
    def retained_bytes(self) -> int:
        """Raw and PCM bytes held for detection (introspection for memory-bound tests)."""
        return len(self._raw) + len(self._pending)

    @property
    def queued(self) -> int:
        """Utterances waiting behind the echo being spoken."""
        return len(self._queue)

    # -- detection ------------------------------------------------------------------------------------------

    def _analyse_window(self, voiced: bool, now: int) -> None:
        start = self._analysed
        end = self._analysed = start + self._window
        if self._first_voiced is None:
            if voiced:
                self._first_voiced, self._last_voiced_end, self._voiced = start, end, self._window
            return
        if voiced:
            self._last_voiced_end = end
            self._voiced += self._window
        elif end - self._last_voiced_end >= self._hangover:
            self._end_utterance(now)
            return
        if self._last_voiced_end - self._first_voiced >= self._max_span:
            self._end_utterance(now)

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
        if self._current is None:
            self._current = _Playout(u, now)
        elif len(self._queue) < self.options.max_queued:
            self._queue.append((u, now))
        else:
            self.dropped += 1

    def _trim(self) -> None:
        """Drop raw audio no future echo can need: anything before (utterance start or next window) - pad."""
        anchor = self._analysed if self._first_voiced is None else self._first_voiced
        keep = max(anchor - self._pad, self._raw_start)
        if keep > self._raw_start:
            del self._raw[: (keep - self._raw_start) * self.sample_width]
            self._raw_start = keep

    # -- playback -------------------------------------------------------------------------------------------

    def _due(self, p: _Playout) -> int:
        return max(p.t0, p.t0 + p.n * self._chunk_ns - self._lead_ns)

    def _pump(self, now: int) -> None:
        while (p := self._current) is not None:
            u = p.utterance
            if not p.started:
                if now < p.t0:
                    return
                p.started = True
                start_ms = max(self.position_ms, self._echo_end_ms)
                self._echo_end_ms = start_ms + math.ceil(u.duration_ms)
                self._events.append(EchoStarted(u, now, start_ms, self._echo_end_ms))
            while p.sent < len(u.audio):
                due = self._due(p)
                if due > now:
                    return
                data = u.audio[p.sent : p.sent + self._chunk_bytes]
                self._events.append(EchoAudio(u.index, p.n, data, due))
                p.sent += len(data)
                p.n += 1
            self._events.append(EchoFinished(u.index, now))
            played_until = p.t0 + len(u.audio) * 1_000_000_000 // (self.rate * self.sample_width)
            self._current = None
            if self._queue:
                nxt, detected_at = self._queue.popleft()
                self._current = _Playout(nxt, max(played_until, detected_at))
