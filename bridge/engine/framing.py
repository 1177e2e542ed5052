"""From provider audio to the carrier's 20 ms frames of PCM16 at the leg's media rate, tagged with item and offset.

The media rate is the call's (sip.leg `MediaStarted.rate`, set once at the answer): 8 kHz, or 16 kHz on a G.722
leg, whose encoder then takes the frames as they are (rtp.g722). The frame stays 20 ms at any rate, so the
carrier ledger, the offsets and every count of frames are in the same unit; only a frame's length changes
(320 bytes at 8 kHz, 640 at 16 kHz). A closing message or disclosure (8 kHz WAV files) is framed at 8 kHz on
any call: the leg plays an 8 kHz frame as well.

Two small pieces, both sans-I/O:
- `CarrierConverter` turns audio of the received format into PCM16 at the media rate: G.711 is decoded with the
  standard tables (bit-exact; always at 8 kHz, on any leg), PCM16 at another rate goes through PyAV's
  resampler (rtp/resample.py), once: Gemini's 24 kHz goes straight to a G.722 leg's 16 kHz.
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
    """Received-format bytes to PCM16 at `rate` (the leg's media rate). `frame_bytes` is how many received bytes
    make 20 ms."""

    def __init__(self, fmt: AudioFormat, rate: int = 8000) -> None:
        self.format = fmt
        self.rate = rate
        self.frame_bytes = fmt.bytes_per_ms * FRAME_MS
        self._resampler = None
        self._convert: Callable[[bytes], bytes]
        if rate != 8000:  # a wider leg: PCM16 only (8 kHz G.711 is framed at 8 kHz: reservoir `set_rate`)
            if fmt.encoding is not Encoding.PCM16:
                raise ValueError(f"no conversion from {fmt} to the carrier's {rate} Hz PCM16")
            from rtp.resample import Resampler

            self._resampler = Resampler(fmt.rate, rate)
            self._convert = self._resampler.process
        elif fmt == PCMU_8K:
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
    """PCM16 of one item at a time (8 kHz, or the rate `start` names), cut into tagged 20 ms frames."""

    def __init__(self) -> None:
        self.item_id: str | None = None
        self._frame = PCM16_FRAME_BYTES  # bytes a 20 ms frame: 320 at 8 kHz, 640 at 16 kHz (`start`)
        self._epoch = 0
        self._offset_ms = 0
        self._pending = b""
        self._pending_pcmu: bytes | None = None  # the µ-law of `_pending`, while the item carries it

    def start(self, item_id: str, epoch: int, *, pcmu: bool = False, rate: int = 8000) -> None:
        """A new item of PCM16 at `rate`; with `pcmu` (8 kHz only), every `add` gives the µ-law its PCM was
        decoded from."""
        self.item_id, self._epoch, self._offset_ms, self._pending = item_id, epoch, 0, b""
        self._frame = rate * FRAME_MS // 500
        self._pending_pcmu = b"" if pcmu and rate == 8000 else None

    def add(self, pcm: bytes, pcmu: bytes | None = None) -> list[OutboundFrame]:
        """Frames completed by `pcm` (the remainder waits for more of the same item)."""
        data = self._pending + pcm
        whole = len(data) - len(data) % self._frame
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
        pad = self._frame - len(self._pending)
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
        size = self._frame
        half = size // 2
        for start in range(0, len(pcm), size):
            encoded = None if pcmu is None else pcmu[start // 2 : start // 2 + half]
            frames.append(
                OutboundFrame(
                    pcm[start : start + size],
                    self._epoch,
                    self.item_id,
                    self._offset_ms,
                    encoded,
                )
            )
            self._offset_ms += FRAME_MS
        return frames
