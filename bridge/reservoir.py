"""The generation reservoir: audio the provider has sent that the caller has not yet been played.

Seed 000 separates it from the playback cushion. The cushion is the channel's small playout target (for the
RTP carrier, the pacer's lead of one or two frames); the reservoir is everything received beyond that, bounded
by `AudioLimits`:

- `output_overflow`: the next bytes would exceed the capacity (bytes of the received format). Those bytes are
  not stored: the reservoir never grows past its bound.
- `output_stale`: the oldest unplayed audio has waited longer than the residence deadline.

Both are recoverable media conditions (HR1): the reservoir detects, counts and reports them; the repair
belongs to bridge/recovery.py. The reservoir adds no initial wait — audio can be taken out the moment it
arrives — and never changes samples or rate: it hands out the bytes it was given, in order.

Sans-I/O: every call takes `now` (monotonic ns); `next_deadline()` says when staleness must be checked.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from providers.limits import AudioLimits
from rtp.audio import AudioFormat

_NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class OutputOverflow:
    """`output_overflow`: `dropped_bytes` did not fit (capacity `capacity_bytes`, `depth_bytes` stored)."""

    dropped_bytes: int
    depth_bytes: int
    capacity_bytes: int


@dataclass(frozen=True, slots=True)
class OutputStale:
    """`output_stale`: the oldest unplayed audio is `age_ms` old (deadline `residence_ms`)."""

    age_ms: int
    residence_ms: int
    depth_bytes: int


MediaCondition = OutputOverflow | OutputStale


class GenerationReservoir:
    """Bounded FIFO of received audio chunks, each stamped with its arrival time."""

    def __init__(self, limits: AudioLimits, fmt: AudioFormat) -> None:
        self.limits = limits
        self.format = fmt
        self._chunks: deque[tuple[int, bytes, str | None]] = deque()  # (arrival ns, audio, item id)
        self._head_offset = 0  # bytes of the first chunk already taken
        self.depth_bytes = 0
        self.overflows = 0
        self.stales = 0
        self.dropped_bytes = 0  # by overflow or clear
        self._stale_reported = False

    def push(self, audio: bytes, now: int, item_id: str | None = None) -> OutputOverflow | None:
        """Store received audio, or report an overflow (and keep none of `audio`)."""
        if not audio:
            return None
        if self.depth_bytes + len(audio) > self.limits.capacity_bytes:
            self.overflows += 1
            self.dropped_bytes += len(audio)
            return OutputOverflow(len(audio), self.depth_bytes, self.limits.capacity_bytes)
        self._chunks.append((now, audio, item_id))
        self.depth_bytes += len(audio)
        return None

    def pull(self, nbytes: int) -> tuple[bytes, str | None]:
        """Up to `nbytes` of the oldest audio, with the item id it belongs to (a pull never spans items)."""
        out = bytearray()
        item: str | None = None
        while self._chunks and len(out) < nbytes:
            arrived, chunk, chunk_item = self._chunks[0]
            if out and chunk_item != item:
                break
            item = chunk_item
            take = chunk[self._head_offset : self._head_offset + nbytes - len(out)]
            out += take
            self._head_offset += len(take)
            if self._head_offset >= len(chunk):
                self._chunks.popleft()
                self._head_offset = 0
        self.depth_bytes -= len(out)
        if not self._chunks:
            self._stale_reported = False
        return bytes(out), item

    def check(self, now: int) -> OutputStale | None:
        """Report staleness once per episode (until the reservoir has drained or been cleared)."""
        age_ms = self.oldest_age_ms(now)
        if age_ms is None or age_ms <= self.limits.residence_ms or self._stale_reported:
            return None
        self._stale_reported = True
        self.stales += 1
        return OutputStale(age_ms, self.limits.residence_ms, self.depth_bytes)

    def oldest_age_ms(self, now: int) -> int | None:
        return (now - self._chunks[0][0]) // _NS_PER_MS if self._chunks else None

    def next_deadline(self) -> int | None:
        """When the oldest audio goes stale (None when empty or already reported)."""
        if not self._chunks or self._stale_reported:
            return None
        return self._chunks[0][0] + self.limits.residence_ms * _NS_PER_MS + 1

    def item_ids(self) -> list[str | None]:
        """The items with audio waiting, oldest first."""
        seen: dict[str | None, None] = {}
        for _, _, item in self._chunks:
            seen[item] = None
        return list(seen)

    def clear(self) -> int:
        """Drop everything (a barrier clear or a recovery); returns the bytes dropped."""
        dropped = self.depth_bytes
        self._chunks.clear()
        self._head_offset = 0
        self.depth_bytes = 0
        self.dropped_bytes += dropped
        self._stale_reported = False
        return dropped

    @property
    def depth_ms(self) -> float:
        return self.format.duration_ms(self.depth_bytes)
