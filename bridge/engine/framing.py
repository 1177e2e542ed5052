"""From provider audio to the carrier's 20 ms frames of 8 kHz PCM16, tagged with item and offset.

Two small pieces, both sans-I/O:
- `CarrierConverter` turns audio of the received format into 8 kHz PCM16: G.711 is decoded with the standard
  tables (bit-exact), PCM16 at another rate goes through PyAV's resampler (rtp/resample.py).
- `ItemFramer` cuts that PCM into exact 20 ms frames and numbers them within their *item* (an assistant
  utterance), because the carrier ledger answers "how much of item X has the caller been sent" and barge-in
  truncation needs exactly that. A partial last frame is padded with silence when its item ends. When the
  provider sent PCMU, each frame also carries its 160 µ-law bytes as received, so a PCMU call's RTP payload
  is the provider's, byte for byte (DESIGN §5: PCMU passthrough is bit-exact).
"""

from __future__ import annotations

from collections.abc import Callable

from rtp.audio import FRAME_MS, PCM16_8K, PCM16_FRAME_BYTES, PCMA_8K, PCMU_8K, AudioFormat, Encoding
from rtp.g711 import alaw_decode, ulaw_decode
from rtp.playout import OutboundFrame


class CarrierConverter:
    """Received-format bytes to 8 kHz PCM16. `frame_bytes` is how many received bytes make 20 ms."""

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        self.frame_bytes = fmt.bytes_per_ms * FRAME_MS
        self._resampler = None
        self._convert: Callable[[bytes], bytes]
        if fmt == PCMU_8K:
            self._convert = ulaw_decode
        elif fmt == PCMA_8K:
            self._convert = alaw_decode
        elif fmt == PCM16_8K:
            self._convert = bytes
        elif fmt.encoding is Encoding.PCM16:
            from rtp.resample import Resampler

            self._resampler = Resampler(fmt.rate, 8000)
            self._convert = self._resampler.process
        else:
            raise ValueError(f"no conversion from {fmt} to the carrier's 8 kHz PCM16")

    def convert(self, audio: bytes) -> bytes:
        return self._convert(audio)

    def end_item(self) -> bytes:
        """What a stateful converter still holds at the end of an item (resampler tail)."""
        if self._resampler is None:
            return b""
        tail = self._resampler.flush()
        self._resampler.reset()
        return tail

    def reset(self) -> None:
        """Forget state (a clear): the next audio starts a fresh stream."""
        if self._resampler is not None:
            self._resampler.reset()


class ItemFramer:
    """8 kHz PCM16 of one item at a time, cut into tagged 20 ms frames."""

    def __init__(self) -> None:
        self.item_id: str | None = None
        self._epoch = 0
        self._offset_ms = 0
        self._pending = b""
        self._pending_pcmu: bytes | None = None  # the µ-law of `_pending`, while the item carries it

    def start(self, item_id: str, epoch: int, *, pcmu: bool = False) -> None:
        """A new item; with `pcmu`, every `add` gives the µ-law its PCM was decoded from."""
        self.item_id, self._epoch, self._offset_ms, self._pending = item_id, epoch, 0, b""
        self._pending_pcmu = b"" if pcmu else None

    def add(self, pcm: bytes, pcmu: bytes | None = None) -> list[OutboundFrame]:
        """Frames completed by `pcm` (the remainder waits for more of the same item)."""
        data = self._pending + pcm
        whole = len(data) - len(data) % PCM16_FRAME_BYTES
        self._pending = data[whole:]
        encoded = None
        if self._pending_pcmu is not None:
            if pcmu is None or 2 * len(pcmu) != len(pcm):
                self._pending_pcmu = None  # not µ-law for this PCM: the rest of the item is re-encoded
            else:
                both = self._pending_pcmu + pcmu
                encoded, self._pending_pcmu = both[: whole // 2], both[whole // 2 :]
        return self._tag(data[:whole], encoded)

    def finish(self) -> list[OutboundFrame]:
        """End the item: its partial last frame, padded with silence (digital zero; 0xFF in µ-law)."""
        pad = PCM16_FRAME_BYTES - len(self._pending)
        encoded = None if self._pending_pcmu is None else self._pending_pcmu + b"\xff" * (pad // 2)
        frames = self._tag(self._pending + bytes(pad), encoded) if self._pending else []
        self.item_id, self._pending, self._pending_pcmu = None, b"", None
        return frames

    def discard(self) -> None:
        self.item_id, self._pending, self._pending_pcmu = None, b"", None

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    def _tag(self, pcm: bytes, pcmu: bytes | None = None) -> list[OutboundFrame]:
        assert self.item_id is not None
        frames = []
        half = PCM16_FRAME_BYTES // 2
        for start in range(0, len(pcm), PCM16_FRAME_BYTES):
            encoded = None if pcmu is None else pcmu[start // 2 : start // 2 + half]
            frames.append(
                OutboundFrame(
                    pcm[start : start + PCM16_FRAME_BYTES],
                    self._epoch,
                    self.item_id,
                    self._offset_ms,
                    encoded,
                )
            )
            self._offset_ms += FRAME_MS
        return frames
