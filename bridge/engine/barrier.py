"""The playback-epoch barrier: once output is cleared, no older output can ever reach the caller.

Every frame queued for the caller carries the epoch in force when it was framed. `clear()` starts a new epoch
and asks the channel to drop every queued frame of an older one; it is complete when the channel confirms, and
from then on the channel refuses older-epoch frames outright (rtp/playout.py orders the clear against the
media clock, so the confirmation is immediate for the RTP carrier). Frames the channel already handed to the
carrier are out of its clear scope (HR4): they stay in the carrier ledger as what the caller may have heard.
"""

from __future__ import annotations

from typing import Protocol

from bridge.engine.commands import BargedIn, Outbox, Truncate, TurnEnded
from rtp.ledger import CarrierLedger
from rtp.playout import ClearResult, OutboundFrame
from sip.leg import LegFeatures


class Channel(Protocol):
    """Where frames for the caller wait (the call leg's playout): the session's view of the carrier. Its
    `features` are the leg's (`sip.leg.LegFeatures`): a channel that keeps its own cushion declares it."""

    @property
    def features(self) -> LegFeatures: ...

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


class Clearable(Protocol):
    """What a barge-in clears (bridge/engine/reservoir.py `OutputPath`): the queued output, through its barrier."""

    barrier: PlaybackBarrier
    channel: Channel

    def clear(self) -> tuple[int, list[str]]: ...


class BargeIn:
    """Barge-in and user suppression (SE4, SE5 output side, HR4): the caller starting to speak clears every
    unplayed frame through the barrier, tells the provider what the caller heard — read from the carrier
    ledger, never from elapsed time — and suppresses assistant output until the caller's turn ends."""

    def __init__(self, output: Clearable, *, truncate: bool) -> None:
        self._output = output
        self._truncate = truncate
        self.suppressed = False
        self.suppressed_bytes = 0  # output dropped while the caller spoke
        self.barge_ins = 0

    def interrupt(self, now: int, at_ms: int, source: str) -> tuple[BargedIn, list[Truncate]]:
        self.suppressed = True
        self.barge_ins += 1
        old_epoch = self._output.barrier.epoch
        cleared_ms, items = self._output.clear()
        ledger = self._output.channel.ledger
        last = ledger.last()  # after the clear nothing of the old epoch can leave: this is the last one
        last_ms = (
            (last.transmitted_ns - now) / 1_000_000 if last is not None and last.epoch == old_epoch else None
        )
        heard = [(item, ledger.transmitted_ms(item)) for item in items]  # HR4: what left is out of scope
        truncates = [Truncate(item, ms) for item, ms in heard] if self._truncate else []
        return BargedIn(at_ms, source, cleared_ms, tuple(heard), last_ms), truncates

    def cut_in(self, out: Outbox, now: int, at_ms: int, source: str) -> None:
        """`interrupt`, its truncations to the provider and its notice to the log."""
        notice, truncates = self.interrupt(now, at_ms, source)
        out.commands.extend(truncates)
        out.notices.append(notice)

    def drop(self, audio: bytes) -> bool:
        """Output that arrives while the caller speaks is interrupted: dropped and counted."""
        if self.suppressed:
            self.suppressed_bytes += len(audio)
        return self.suppressed

    def turn_over(self, at_ms: int) -> TurnEnded | None:
        """The caller's turn ended: suppression is over."""
        if not self.suppressed:
            return None
        self.suppressed = False
        return TurnEnded(at_ms)

    def status(self) -> dict[str, object]:
        barrier = self._output.barrier
        return {
            "epoch": barrier.epoch,
            "settled": barrier.settled,
            "cushion_frames": self._output.channel.depth,
            "suppressed": self.suppressed,
            "barge_ins": self.barge_ins,
            "frames_transmitted": self._output.channel.ledger.frames_transmitted,
        }
