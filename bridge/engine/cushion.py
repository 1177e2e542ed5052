"""The playback cushion: how much output a channel keeps queued ahead of playback.

Separate from the generation reservoir (seed 000): the reservoir bounds what the provider sent and nobody
played yet; the cushion is the channel's playout target, which must stay small or barge-in cannot stop audio
quickly.

- RTP carrier: the bridge is the media clock, so the cushion is just the pacer's lead — at most two 20 ms
  frames (`CARRIER_LEAD_FRAMES`). Audio the caller has not been sent is never more than 40 ms ahead, which is
  what bounds barge-in to two frames.
- Browser and local-audio channels play on a clock the bridge does not own, and deliveries jitter: they keep an
  adaptive cushion between a 120 ms floor and a 200 ms ceiling (`AdaptiveCushion`).
"""

from __future__ import annotations

from dataclasses import dataclass

CARRIER_LEAD_FRAMES = 2


@dataclass(frozen=True, slots=True)
class AdaptiveCushion:
    """Target playout depth for a channel the bridge does not clock: twice the observed delivery jitter,
    held between the floor and the ceiling."""

    floor_ms: int = 120
    ceiling_ms: int = 200

    def target_ms(self, jitter_ms: float) -> int:
        return int(min(self.ceiling_ms, max(self.floor_ms, 2 * jitter_ms)))
