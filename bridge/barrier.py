"""The playback-epoch barrier: once output is cleared, no older output can ever reach the caller.

Every frame queued for the caller carries the epoch in force when it was framed. `clear()` starts a new epoch
and asks the channel to drop every queued frame of an older one; it is complete when the channel confirms, and
from then on the channel refuses older-epoch frames outright (rtp/playout.py orders the clear against the
media clock, so the confirmation is immediate for the RTP carrier). Frames the channel already handed to the
carrier are out of its clear scope (HR4): they stay in the carrier ledger as what the caller may have heard.
"""

from __future__ import annotations

from typing import Protocol

from rtp.ledger import CarrierLedger
from rtp.playout import ClearResult, OutboundFrame


class Channel(Protocol):
    """Where frames for the caller wait (the call leg's playout): the session's view of the carrier."""

    @property
    def depth(self) -> int: ...

    @property
    def ledger(self) -> CarrierLedger: ...

    def enqueue(self, frames: list[OutboundFrame]) -> None: ...

    def clear(self, epoch: int) -> ClearResult: ...


class PlaybackBarrier:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.epoch = 0
        self.confirmed_epoch = 0
        self.clears = 0
        self.frames_cleared = 0

    def clear(self) -> ClearResult:
        """Raise the barrier: a new epoch, and every older queued frame dropped before this returns."""
        self.epoch += 1
        result = self._channel.clear(self.epoch)
        self.confirmed_epoch = result.epoch  # the carrier confirms synchronously
        self.clears += 1
        self.frames_cleared += result.dropped_frames
        return result

    @property
    def settled(self) -> bool:
        """The channel has confirmed the latest clear."""
        return self.confirmed_epoch == self.epoch
