"""Outbound playout: frames waiting for the media clock, behind the playback-epoch barrier.

The session enqueues 20 ms PCM16 frames tagged with a playback epoch, an item id and the frame's offset in
that item. The media clock takes one frame per tick, and the frame goes into the carrier ledger the moment it
is handed to the carrier (DESIGN §11), in one of two ways:
- `pull(now)`: take and record at once, for an engine whose hand-over *is* the request for the frame
  (pjsua2's `onFrameRequested`);
- `take()`, then `transmitted(frame, now)` once the frame has left: the native engine records it when
  `sendto` has returned, and not at all when the send failed.
`clear(epoch)` raises the barrier: every queued frame of an older epoch is dropped, and once it returns no
older-epoch frame can ever be taken (the lock orders `clear` against `take`/`pull`).

Threads: `enqueue` and `clear` run on the session's thread, `pull` on the media clock thread. The lock is held
for microseconds by `pull`, so the clock never waits noticeably.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from rtp.audio import FRAME_MS
from rtp.ledger import CarrierLedger


@dataclass(frozen=True, slots=True)
class OutboundFrame:
    """20 ms of 8 kHz PCM16 for the caller, tagged for the barrier and the ledger.

    `pcmu` is the same 20 ms as the provider sent it, when it sent G.711 µ-law (160 bytes): a PCMU call sends
    those bytes as they are (µ-law → PCM16 → µ-law is not the identity: 0x7F comes back as 0xFF)."""

    pcm: bytes
    epoch: int
    item_id: str
    offset_ms: int
    pcmu: bytes | None = None


@dataclass(frozen=True, slots=True)
class ClearResult:
    """What a clear dropped, and how far each affected item had been transmitted when it took effect."""

    epoch: int
    dropped_frames: int
    transmitted_ms: dict[str, int]

    @property
    def dropped_ms(self) -> int:
        return self.dropped_frames * FRAME_MS


class Playout:
    """The carrier channel's queue: what the pacer will hand to the carrier next."""

    def __init__(self, ledger: CarrierLedger | None = None) -> None:
        self.ledger = ledger if ledger is not None else CarrierLedger()
        self._queue: deque[OutboundFrame] = deque()
        self._lock = threading.Lock()
        self._floor = 0  # frames with an epoch below this are never transmitted
        self.frames_dropped = 0

    @property
    def epoch_floor(self) -> int:
        return self._floor

    @property
    def depth(self) -> int:
        """Queued frames not yet transmitted."""
        return len(self._queue)

    def enqueue(self, frames: Iterable[OutboundFrame]) -> None:
        """Queue frames behind those already waiting. Frames below the barrier are refused silently: the
        session that cleared them has moved on, so they are counted as dropped."""
        with self._lock:
            for frame in frames:
                if frame.epoch < self._floor:
                    self.frames_dropped += 1
                else:
                    self._queue.append(frame)

    def clear(self, epoch: int) -> ClearResult:
        """Drop every queued frame older than `epoch`; afterwards none of them can be transmitted."""
        with self._lock:
            self._floor = max(self._floor, epoch)
            kept = [f for f in self._queue if f.epoch >= self._floor]
            dropped = [f for f in self._queue if f.epoch < self._floor]
            self._queue.clear()
            self._queue.extend(kept)
            self.frames_dropped += len(dropped)
            items = {f.item_id for f in dropped}
            transmitted = {item: self.ledger.transmitted_ms(item) for item in items}
        return ClearResult(epoch, len(dropped), transmitted)

    def pull(self, now_ns: int) -> OutboundFrame | None:
        """The next frame to transmit, recorded in the ledger as transmitted at `now_ns`; None means silence
        this tick."""
        with self._lock:
            if not self._queue:
                return None
            frame = self._queue.popleft()
            self.ledger.record(frame.item_id, frame.offset_ms, frame.epoch, now_ns)
        return frame

    def take(self) -> OutboundFrame | None:
        """The next frame to transmit, NOT yet in the ledger: record it with `transmitted` once it has left
        (a frame that never left is simply not recorded). None means silence this tick."""
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def transmitted(self, frame: OutboundFrame, now_ns: int) -> None:
        """`frame` (from `take`) was handed to the carrier at `now_ns`: it goes into the ledger. Call it before
        the next `take` (the native engine does, in the same media-clock slot)."""
        with self._lock:
            self.ledger.record(frame.item_id, frame.offset_ms, frame.epoch, now_ns)
