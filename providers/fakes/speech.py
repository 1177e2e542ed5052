"""The response engine of the speaking fakes: what a scripted turn says, cut in chunks and paced in real time.

Vendor-neutral: a response is a `Speech`, its audio in the session's output format cut in chunks of `step`
bytes (one empty chunk when it has no audio, so a text-only response still goes out once), with the words of
its transcript riding along. A vendor core takes each chunk when it is due (`take(now)`), wraps it in its own
events, and stops taking when the response is cancelled or truncated; the faults act through the pacing (a
burst) and through the core's outbound funnel (connection.py).

Two pacings, each a vendor's measured behaviour kept exactly:

* gaps (Realtime family, Gemini): chunk k+1 is due `gap(bytes of chunk k, now)` after chunk k, the gap (the
  chunk's real-time length over the speed) computed as chunk k goes, so a burst shortens the gaps after it;
* a media clock (GPT-Live, echo.py `MediaClock`): chunk n is due when the reply's clock reaches n chunks; a
  burst rebases the clock at the moment it fires, so the chunks already due keep their times.

The words: with `words_by_bytes` the transcript keeps up with the audio sent (ceil(words x bytes sent / bytes),
Gemini); otherwise each chunk carries its share of the words by chunk count (floor, Realtime family).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from providers.fakes.echo import MediaClock, codec
from providers.fakes.script import Turn
from rtp.audio import AudioFormat

__all__ = ["TONE_AMPLITUDE", "Speech", "turn_audio"]

TONE_AMPLITUDE = 0.3  # of full scale: about -10 dBFS peak, clearly voiced, far from clipping


def turn_audio(turn: Turn, fmt: AudioFormat, samples: int) -> bytes:
    """A tone turn's `samples` in `fmt`, a sine from phase 0 (an echo turn with nothing to echo speaks its tone);
    a silence turn's, digital silence."""
    if turn.reply == "silence" or turn.frequency_hz <= 0:
        pcm = bytes(2 * samples)
    else:
        n = np.arange(samples, dtype=np.float64)
        wave = np.round(TONE_AMPLITUDE * 32767 * np.sin(2 * np.pi * turn.frequency_hz * n / fmt.rate))
        pcm = wave.astype("<i2").tobytes()
    return codec(fmt.encoding)[1](pcm)


class Speech:
    """One response being spoken (the module docstring): `gap` paces it by gaps from `start`, else `clock` does,
    `chunk_ns` a chunk on the clock."""

    __slots__ = (
        *("audio", "step", "words", "chunks", "n", "sent", "words_sent", "first_at", "next_at"),
        *("gap", "clock", "chunk_ns", "words_by_bytes"),
    )

    def __init__(
        self,
        audio: bytes,
        step: int,
        words: Sequence[str],
        start: int,
        *,
        gap: Callable[[int, int], int] | None = None,
        clock: MediaClock | None = None,
        chunk_ns: int = 0,
        words_by_bytes: bool = False,
    ) -> None:
        self.audio, self.step, self.words = audio, step, list(words)
        self.chunks = max(1, -(-len(audio) // step))
        self.n = 0  # chunks taken
        self.sent = 0  # bytes taken
        self.words_sent = 0
        self.first_at: int | None = None  # when the first chunk was due
        self.next_at = start
        self.gap, self.clock, self.chunk_ns = gap, clock, chunk_ns
        self.words_by_bytes = words_by_bytes

    @property
    def done(self) -> bool:
        """Every chunk was taken."""
        return self.n >= self.chunks

    def due(self) -> int:
        """When the next chunk is due."""
        return self.next_at if self.clock is None else self.clock.due(self.n * self.chunk_ns)

    def take(self, now: int) -> tuple[bytes, list[str]] | None:
        """The next chunk and the words riding with it, when it is due at `now`; None otherwise."""
        if self.n >= self.chunks:
            return None
        due = self.due()
        if due > now:
            return None
        if self.first_at is None:
            self.first_at = due
        data = self.audio[self.sent : self.sent + self.step]
        self.n += 1
        self.sent += len(data)
        total = len(self.words)
        if self.n >= self.chunks:
            upto = total
        elif self.words_by_bytes:
            upto = -(-total * self.sent // len(self.audio))
        else:
            upto = total * self.n // self.chunks
        words, self.words_sent = self.words[self.words_sent : upto], max(self.words_sent, upto)
        if self.gap is not None:
            self.next_at += self.gap(len(data), now)
        return data, words
