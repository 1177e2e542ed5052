"""The carrier ledger: which frames of which item have been handed to the carrier, and when.

A frame is *transmitted* the moment it is handed to the carrier side (the RTP socket, or pjmedia's
`onFrameRequested`, whose frame is on the wire about 0.2 ms later). Transmitted audio cannot be retracted and
is what the caller may have heard, so barge-in truncation and recovery read what was heard from here, never
from elapsed wall time.

`record` runs on the media clock thread 50 times a second per call: it appends one entry to a bounded deque
and updates one item's progress in place, both atomic under the GIL, so readers on another thread need no
lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rtp.audio import FRAME_MS


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One transmitted frame."""

    item_id: str
    offset_ms: int  # start of the frame within its item
    epoch: int
    transmitted_ns: int  # monotonic time it was handed to the carrier


@dataclass(slots=True)
class ItemProgress:
    """How much of an item has left: `transmitted_ms` is the end of its last transmitted frame.

    Updated in place by the media clock (no allocation per frame); read it, do not change it."""

    item_id: str
    frames: int
    transmitted_ms: int
    first_ns: int
    last_ns: int


class CarrierLedger:
    """Bounded record of transmitted frames plus a per-item summary that is never trimmed by the bound."""

    def __init__(self, max_entries: int = 500, max_items: int = 64) -> None:
        # Bounded: 10 s of entries (the recording reads the new ones once a second). Each is an object the
        # garbage collector walks in a full collection: at 3,000 a call, 100 calls held 300,000 of them, and
        # every full collection paused the media clock for that long. What was heard per item is `progress`,
        # for the last 64 items (a reply each: minutes of a call; the record reads an item as its reply ends).
        # Kept as plain tuples (item, offset, epoch, ns): the collector stops tracking a tuple of atoms after
        # its first collection, so a full one no longer walks them (a dataclass instance is always tracked).
        self._entries: deque[tuple[str, int, int, int]] = deque(maxlen=max_entries)
        self._items: dict[str, ItemProgress] = {}
        self._max_items = max_items
        self.frames_transmitted = 0

    def record(self, item_id: str, offset_ms: int, epoch: int, now_ns: int) -> None:
        """Note that a frame has been handed to the carrier (media clock thread)."""
        self._entries.append((item_id, offset_ms, epoch, now_ns))
        self.frames_transmitted += 1
        prev = self._items.get(item_id)
        end_ms = offset_ms + FRAME_MS
        if prev is None:
            if len(self._items) >= self._max_items:
                self._items.pop(next(iter(self._items)))
            self._items[item_id] = ItemProgress(item_id, 1, end_ms, now_ns, now_ns)
        else:
            prev.frames += 1
            prev.transmitted_ms = max(prev.transmitted_ms, end_ms)
            prev.last_ns = now_ns

    def progress(self, item_id: str) -> ItemProgress | None:
        """What of `item_id` has left, or None when none of it has."""
        return self._items.get(item_id)

    def transmitted_ms(self, item_id: str) -> int:
        """Milliseconds of `item_id` transmitted from its start (0 when nothing has left)."""
        progress = self._items.get(item_id)
        return progress.transmitted_ms if progress else 0

    def items_between(self, after_ns: int, until_ns: int) -> list[str]:
        """The items with frames transmitted after `after_ns` that had begun by `until_ns`, in the order they
        began; from the per-item summary, which the entry bound does not trim."""
        return [p.item_id for p in self._items.values() if p.last_ns > after_ns and p.first_ns <= until_ns]

    def entries(self, item_id: str | None = None) -> list[LedgerEntry]:
        """The retained entries, optionally of one item, oldest first."""
        snapshot = list(self._entries)
        return [LedgerEntry(*e) for e in snapshot if item_id is None or e[0] == item_id]

    def entries_after(self, after_ns: int) -> list[LedgerEntry]:
        """The retained entries transmitted after `after_ns`, oldest first: only those are made into
        `LedgerEntry` (the recording asks once a second for the new ones)."""
        snapshot = list(self._entries)
        first = len(snapshot)
        while first > 0 and snapshot[first - 1][3] > after_ns:
            first -= 1
        return [LedgerEntry(*e) for e in snapshot[first:]]

    def last(self) -> LedgerEntry | None:
        """The most recently transmitted frame."""
        try:
            return LedgerEntry(*self._entries[-1])
        except IndexError:
            return None
