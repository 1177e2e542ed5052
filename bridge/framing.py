"""Cut provider audio into the carrier's 20 ms frames, tagged with an item id and the offset in that item.

Providers deliver audio in chunks of any size; the carrier takes exactly 160 samples every 20 ms. The framer
keeps the remainder between chunks and names the *item* each frame belongs to, because the carrier ledger
answers "how much of item X has the caller been sent" and barge-in truncation needs exactly that. When the
provider names its items (Realtime's `item_id`) those names are used; GPT-Live does not, so an item is a run
of output with no pause longer than `quiet_ms` between chunks.

Sans-I/O: `now` comes in, `next_deadline()` goes out.
"""

from __future__ import annotations

from rtp.audio import FRAME_MS, G711_FRAME_BYTES, PCM16_FRAME_BYTES, PCM16_8K, PCMA_8K, PCMU_8K, AudioFormat
from rtp.g711 import alaw_decode, ulaw_decode
from rtp.playout import OutboundFrame

_NS_PER_MS = 1_000_000


class OutputFramer:
    """Provider output (G.711 or PCM16 at 8 kHz) to tagged 20 ms PCM16 frames."""

    def __init__(self, fmt: AudioFormat, *, quiet_ms: int = 300) -> None:
        if fmt == PCMU_8K:
            self._decode, self._frame_bytes = ulaw_decode, G711_FRAME_BYTES
        elif fmt == PCMA_8K:
            self._decode, self._frame_bytes = alaw_decode, G711_FRAME_BYTES
        elif fmt == PCM16_8K:
            self._decode, self._frame_bytes = bytes, PCM16_FRAME_BYTES
        else:
            raise ValueError(f"no framing for {fmt} yet: output must be 8 kHz G.711 or PCM16")
        self._quiet_ns = quiet_ms * _NS_PER_MS
        self._pending = b""
        self._items = 0
        self._item_id: str | None = None
        self._epoch = 0
        self._offset_ms = 0
        self._deadline: int | None = None

    @property
    def item_id(self) -> str | None:
        """The item being framed now, or None between items."""
        return self._item_id

    def push(self, audio: bytes, now_ns: int, epoch: int, item_id: str | None = None) -> list[OutboundFrame]:
        """Frames completed by `audio`; a new item starts on a new provider item id, a new epoch, or after a
        pause of `quiet_ms`."""
        frames: list[OutboundFrame] = []
        if self._item_id is None or epoch != self._epoch or (item_id is not None and item_id != self._item_id):
            frames.extend(self._finish_item())
            self._start_item(item_id, epoch)
        self._deadline = now_ns + self._quiet_ns
        data = self._pending + audio
        whole = len(data) - len(data) % self._frame_bytes
        self._pending = data[whole:]
        if whole:
            pcm = self._decode(data[:whole])
            frames.extend(self._tag(pcm))
        return frames

    def next_deadline(self) -> int | None:
        return self._deadline

    def handle_timer(self, now_ns: int) -> list[OutboundFrame]:
        """After a pause of `quiet_ms` the item is over: its remainder is padded with silence and sent."""
        if self._deadline is None or now_ns < self._deadline:
            return []
        return self._finish_item()

    def discard(self) -> int:
        """Forget the current item (a clear); returns the bytes of remainder dropped."""
        dropped = len(self._pending)
        self._pending = b""
        self._item_id = None
        self._deadline = None
        return dropped

    def _start_item(self, item_id: str | None, epoch: int) -> None:
        self._items += 1
        self._item_id = item_id if item_id is not None else f"out-{self._items}"
        self._epoch = epoch
        self._offset_ms = 0

    def _finish_item(self) -> list[OutboundFrame]:
        frames: list[OutboundFrame] = []
        if self._pending:
            padded = self._pending + self._silence_byte() * (self._frame_bytes - len(self._pending))
            frames.extend(self._tag(self._decode(padded)))
        self._pending = b""
        self._item_id = None
        self._deadline = None
        return frames

    def _silence_byte(self) -> bytes:
        if self._decode is ulaw_decode:
            return b"\xff"
        if self._decode is alaw_decode:
            return b"\xd5"
        return b"\x00"

    def _tag(self, pcm: bytes) -> list[OutboundFrame]:
        assert self._item_id is not None
        frames = []
        for start in range(0, len(pcm), PCM16_FRAME_BYTES):
            frames.append(OutboundFrame(pcm[start : start + PCM16_FRAME_BYTES], self._epoch, self._item_id, self._offset_ms))
            self._offset_ms += FRAME_MS
        return frames
