"""The adaptive jitter buffer core: RTP payloads in as they arrive, one 20 ms PCM16 frame out per media tick.

Sans-I/O: `push(seq, timestamp, ssrc, payload, arrival_ns)` files a packet, `pop(now)` is called by the media
clock once per 20 ms tick and returns the frame to hand to the session (`FrameReceived(pcm, seq, arrival_ns)`).

How it works (all in units of 20 ms *slots*: RTP timestamp / 160, unwrapped past 2**32):
- A ring of 16 slots (320 ms) holds payloads by slot, so reordering within the window costs nothing and a
  second copy of a slot is a duplicate (`Drop.DUPLICATE`). A slot that arrives after its tick is late
  (`Drop.LATE`): it was already concealed.
- Playout starts at the first tick after the first packet (the 20 ms floor: a frame waits 0-20 ms).
- Underrun (the cursor's slot is missing and nothing newer is buffered): conceal and *hold* the cursor, so
  the delay grows by one frame and a packet that is merely late still plays. When a newer slot arrives after
  a hold, the missing slots are skipped again up to the frames held, so a real loss does not leave the delay
  raised.
- A missing slot with newer ones buffered: if the next buffered packet's sequence number follows the last
  one played, nothing was lost (the sender suppressed silence): play silence, or the next packet at once if
  frames were held. Otherwise, while the buffer holds fewer frames than the target, wait for it (conceal and
  hold: the packet may only be late); once it holds the target, give it up as lost (conceal, rtp.plc) and
  move on, taking back frames held meanwhile.
- Target depth: one frame plus the spread (max - min over the last ~1-2 s) of transit time (arrival minus
  media time, late packets included), rounded to frames and bounded to 20..200 ms. Once a second, if the
  lowest level seen at a pop (frames from the cursor to the newest buffered) stayed above the target, one
  frame is dropped to bring the delay down: the first quiet (< -30 dBFS) or missing one within 2 s, else
  whichever is next then. A late packet makes the next tick hold one frame if the buffer is below the
  target. Above 200 ms the oldest frames are discarded (`overflows`).
- Slots the media clock skipped are owed (`skip`): a late slot is not a lost frame. A clock that wakes late
  serves only its newest slots and skips the rest, while the caller's packets for them kept coming. Without
  them the caller's audio to the provider falls behind the call by every skipped slot (the buffer later takes
  the extra frames out of the caller's words, by shrink or ceiling). `pop_backlog` gives one owed frame per
  tick from the next one on (by then the loop has read the stall's packets), exactly as that slot's `pop`
  would have: so the session gets one frame per slot, served or skipped. These frames go to a provider's
  socket, not a loudspeaker, so a frame early costs nothing.
- A timestamp far outside the window (a jump after silence suppression, a restarted sender) resyncs the
  cursor onto the new packet; an SSRC change resets the buffer (and the concealment history).
- Before the first packet `pop` returns None; afterwards it returns a frame every tick, AUDIO, CONCEALED or
  SILENCE (the stream stopped: hold, end of a talkspurt without comfort noise, the caller's DTMF).

Per tick the good path is one ring lookup, one G.711 decode (two `bytes.translate`, ~0.5 µs), a few integer
operations and one small tuple (about 1.8 µs for push + pop, tests/bench/rtp_micro.py). No logging, no clock
reads.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Callable
from typing import NamedTuple

from rtp.audio import FRAME_MS, FRAME_SAMPLES
from rtp.g711 import alaw_decode, ulaw_decode
from rtp.packet import Drop
from rtp.plc import Concealer
from rtp.speedups import table_decode

__all__ = [
    "FrameKind",
    "PlayoutFrame",
    "JitterBuffer",
    "table_decoder",
    "fast_ulaw_decode",
    "fast_alaw_decode",
]

_RING = 16  # slots: must exceed the 200 ms ceiling (10 slots) plus the reordering margin
_MASK = _RING - 1
_SLOT_NS = FRAME_MS * 1_000_000
_RESYNC_BACK = 50  # a slot this far (1 s) behind the cursor is a sender restart, not a late packet
_WINDOW_PACKETS = 50  # transit min/max bucket (two buckets: ~1-2 s of history)
_SHRINK_TICKS = 50  # at most one frame dropped per second
_EMPTY = -(1 << 62)  # ring slot number meaning "nothing filed here"
_SHRINK_WAIT_NS = 2_000_000_000  # a shrink waits this long for a quiet frame, then drops whatever is there
_QUIET = 1036  # -30 dBFS: a frame whose peak stays under this can be dropped unheard


def table_decoder(
    decode: Callable[[bytes], bytes],
    choose: Callable[[bytes, Callable[[bytes], bytes]], Callable[[bytes], bytes]] = table_decode,
) -> Callable[[bytes], bytes]:
    """A G.711 decoder built from `decode`'s own 256-entry table (so bit-exact with it) that needs no numpy:
    two `bytes.translate` passes give the low and high bytes of each PCM16 sample. About 0.5 µs per 20 ms
    frame against 1.1 µs for rtp.g711's numpy lookup, which matters at 15,000 frames a second. Where the
    compiled media path is built, its twin of `decode_frame` runs (`choose`: rtp.speedups `table_decode`, or
    one implementation's own, as the parity test asks for both)."""
    table = decode(bytes(range(256)))
    lo, hi = table[0::2], table[1::2]

    def decode_frame(payload: bytes) -> bytes:
        out = bytearray(2 * len(payload))
        out[0::2] = payload.translate(lo)
        out[1::2] = payload.translate(hi)
        return bytes(out)

    return choose(table, decode_frame)


fast_ulaw_decode = table_decoder(ulaw_decode)
fast_alaw_decode = table_decoder(alaw_decode)


class FrameKind(enum.IntEnum):
    AUDIO = 0  # decoded from a received packet
    CONCEALED = 1  # synthesised for a missing packet (PLC; silence once fully faded)
    SILENCE = 2  # the sender suppressed silence (no sequence gap), or nothing received for a while


class PlayoutFrame(NamedTuple):
    """One 20 ms frame for the session: 8 kHz PCM16LE (320 bytes; 16 kHz, 640, on a wide G.722 stream: rtp.g722 and
    its `Concealer(2)`), an output counter (+1 per frame), the
    arrival time of the packet it came from (the tick's `now` when synthesised) and its kind."""

    pcm: bytes
    seq: int
    arrival_ns: int
    kind: FrameKind


class JitterBuffer:
    """One inbound stream's jitter buffer and loss concealment. Not thread-safe: one media loop drives it."""

    def __init__(
        self,
        decode: Callable[[bytes], bytes] = fast_ulaw_decode,
        *,
        min_ms: int = 20,
        max_ms: int = 200,
        silence_byte: int = 0xFF,
        frame_ts: int = FRAME_SAMPLES,
        sliced: bool = True,
        plc: Concealer | None = None,
    ) -> None:
        if not FRAME_MS <= min_ms <= max_ms <= (_RING - 4) * FRAME_MS:
            raise ValueError("jitter buffer depth must satisfy 20 <= min_ms <= max_ms <= 240")
        self._decode = decode
        self._frame_ts = frame_ts  # RTP timestamp units a slot: 160 in an 8000 Hz clock, 960 in Opus's 48000
        self._sliced = (
            sliced  # a payload of n x 160 bytes is n frames (G.711, G.722); Opus: one packet a slot
        )
        self._min_frames = min_ms // FRAME_MS
        self._max_frames = max_ms // FRAME_MS
        self._pad = bytes([silence_byte])
        self.plc = plc if plc is not None else Concealer()  # a 16 kHz leg's: Concealer(2)
        self._silence = self.plc.silence  # SILENCE_FRAME at 8 kHz
        self._payload: list[bytes | None] = [None] * _RING
        self._slot: list[int] = [_EMPTY] * _RING
        self._seq: list[int] = [0] * _RING
        self._arrival: list[int] = [0] * _RING
        self._out_seq = 0
        # counters (read by stream.qos / status)
        self.frames_played = 0
        self.frames_concealed = 0
        self.frames_silence = 0
        self.frames_dropped_shrink = 0
        self.frames_backlog = 0  # owed frames of skipped slots delivered by `pop_backlog`
        self.underruns = 0
        self.waits = 0  # ticks held for a missing packet that might still come
        self.lost = 0  # slots given up as lost (concealed or skipped)
        self.late = 0
        self.duplicates = 0
        self.overflows = 0
        self.resyncs = 0
        self.resets = 0
        self._reset_stream(None)

    def recodec(
        self, decode: Callable[[bytes], bytes], silence_byte: int, plc: Concealer | None = None
    ) -> None:
        """A new codec in the same RTP clock (a re-INVITE's answer): what is buffered is of the old one and
        is dropped; the next packet starts the stream afresh (counted in `resets`). `plc`: the concealer of
        the new codec's frame rate, where it changed."""
        if plc is not None:
            self.plc, self._silence = plc, plc.silence
        self._decode = decode
        self._pad = bytes([silence_byte])
        self.resets += 1
        self._reset_stream(None)

    # --- state ---

    def _reset_stream(self, ssrc: int | None) -> None:
        self._ssrc = ssrc
        self._started = False
        self._base_ts = 0  # extended timestamp of slot 0
        self._last_ts = 0  # last 32-bit timestamp seen, for unwrapping
        self._last_ext = 0
        self._cursor = 0  # next slot to play
        self._highest = -1  # highest slot buffered
        self._held = 0  # frames the cursor was held for (delay added by underruns)
        self._last_seq = -1  # sequence number of the last packet played
        self._min_level = 1 << 30
        self._ticks = 0
        self._grow = False
        self._shrink_by = 0  # a shrink is pending until this time (0: none)
        self.owed = 0  # slots the media clock skipped, not yet caught up (`skip`, `pop_backlog`)
        self._owed_after = 0  # ... from a tick after this instant
        self._tr_cur_min = self._tr_prev_min = 1 << 62
        self._tr_cur_max = self._tr_prev_max = -(1 << 62)
        self._tr_count = 0
        for i in range(_RING):
            self._payload[i] = None
            self._slot[i] = _EMPTY

    @property
    def target_ms(self) -> int:
        """The depth the buffer aims at, from the observed transit-time spread (20..200 ms)."""
        return self._target_frames() * FRAME_MS

    @property
    def depth_ms(self) -> int:
        """Audio buffered ahead of the playout point now (0 before the first packet)."""
        if not self._started:
            return 0
        return max(0, self._highest - self._cursor + 1) * FRAME_MS

    @property
    def spread_ms(self) -> float:
        """Transit-time spread over the last ~1-2 s (what the target is sized for)."""
        lo = min(self._tr_cur_min, self._tr_prev_min)
        hi = max(self._tr_cur_max, self._tr_prev_max)
        return (hi - lo) / 1e6 if hi >= lo else 0.0

    def _target_frames(self) -> int:
        lo = min(self._tr_cur_min, self._tr_prev_min)
        hi = max(self._tr_cur_max, self._tr_prev_max)
        spread = hi - lo if hi >= lo else 0
        frames = 1 + (spread + _SLOT_NS // 2) // _SLOT_NS  # one frame plus the spread, rounded
        return min(self._max_frames, max(self._min_frames, frames))

    # --- input ---

    def push(self, seq: int, timestamp: int, ssrc: int, payload: bytes, arrival_ns: int) -> Drop | None:
        """File one audio packet; returns why it was not kept (counted here too), or None."""
        if ssrc != self._ssrc:
            if self._ssrc is not None:
                self.resets += 1
                self.plc.reset()
            self._reset_stream(ssrc)
        if not self._started:
            self._started = True
            self._base_ts = self._last_ext = timestamp
            self._last_ts = timestamp
            ext = timestamp
        else:
            delta = ((timestamp - self._last_ts + 0x80000000) & 0xFFFFFFFF) - 0x80000000
            ext = self._last_ext + delta
            if delta > 0:
                self._last_ts, self._last_ext = timestamp, ext
        frame_ts = self._frame_ts
        slot = (ext - self._base_ts + frame_ts // 2) // frame_ts
        cursor = self._cursor
        if slot < cursor:
            if cursor - slot > _RESYNC_BACK:
                self._resync(slot)
            else:
                idx = slot & _MASK
                if self._slot[idx] == slot:
                    self.duplicates += 1
                    return Drop.DUPLICATE
                self.late += 1
                self._grow = True
                self._note_transit(arrival_ns - slot * _SLOT_NS)  # lateness is what the target must cover
                return Drop.LATE
        elif slot >= cursor + _RING - 1:
            self._resync(slot)
        # transit spread (ns): arrival minus media time
        transit = arrival_ns - slot * _SLOT_NS
        if transit < self._tr_cur_min:
            self._tr_cur_min = transit
        if transit > self._tr_cur_max:
            self._tr_cur_max = transit
        self._tr_count += 1
        if self._tr_count >= _WINDOW_PACKETS:
            self._tr_prev_min, self._tr_prev_max = self._tr_cur_min, self._tr_cur_max
            self._tr_cur_min, self._tr_cur_max = 1 << 62, -(1 << 62)
            self._tr_count = 0
        n = len(payload)
        if n == FRAME_SAMPLES or not self._sliced:
            return self._store(slot, seq, payload, arrival_ns)
        # other packet times: 20 ms pieces; a short tail is padded with the codec's silence
        if n < FRAME_SAMPLES:
            return self._store(slot, seq, payload + self._pad * (FRAME_SAMPLES - n), arrival_ns)
        result = None
        for i in range(0, n - FRAME_SAMPLES + 1, FRAME_SAMPLES):
            if slot + i // FRAME_SAMPLES >= self._cursor + _RING - 1:
                break
            r = self._store(slot + i // FRAME_SAMPLES, seq, payload[i : i + FRAME_SAMPLES], arrival_ns)
            result = result or r
        return result

    def _note_transit(self, transit: int) -> None:
        if transit < self._tr_cur_min:
            self._tr_cur_min = transit
        if transit > self._tr_cur_max:
            self._tr_cur_max = transit

    def _store(self, slot: int, seq: int, payload: bytes, arrival_ns: int) -> Drop | None:
        idx = slot & _MASK
        if self._slot[idx] == slot:
            self.duplicates += 1
            return Drop.DUPLICATE
        self._slot[idx] = slot
        self._payload[idx] = payload
        self._seq[idx] = seq
        self._arrival[idx] = arrival_ns
        if slot > self._highest:
            self._highest = slot
        return None

    def _resync(self, slot: int) -> None:
        """Jump the playout point to `slot` (timestamp jump): what was buffered is discarded."""
        self.resyncs += 1
        for i in range(_RING):
            if self._payload[i] is not None:
                self.overflows += 1
            self._payload[i] = None
            self._slot[i] = _EMPTY
        self._tr_cur_min = self._tr_prev_min = 1 << 62
        self._tr_cur_max = self._tr_prev_max = -(1 << 62)
        self._tr_count = 0
        self._cursor = slot
        self._highest = slot - 1
        self._held = 0
        self._min_level = 1 << 30
        self._ticks = 0
        self._shrink_by = 0

    # --- output ---

    def pop(self, now: int) -> PlayoutFrame | None:
        """The frame for this 20 ms tick, or None before the first packet of the stream has arrived."""
        if not self._started:
            return None
        cursor = self._cursor
        level = self._highest - cursor + 1
        if level > self._max_frames:  # above the ceiling: discard the oldest
            for s in range(cursor, self._highest - self._max_frames + 1):
                idx = s & _MASK
                if self._slot[idx] == s and self._payload[idx] is not None:
                    self._payload[idx] = None
                    self.overflows += 1
            advanced = self._highest - self._max_frames + 1 - cursor
            cursor = self._cursor = cursor + advanced
            self._held = max(0, self._held - advanced)  # moving the cursor on takes back delay it held
            level = self._max_frames
        # adaptation bookkeeping: the lowest level seen per second decides a shrink
        if level < self._min_level:
            self._min_level = level
        self._ticks += 1
        if self._ticks >= _SHRINK_TICKS:
            if self._min_level > self._target_frames() and not self._shrink_by:
                self._shrink_by = now + _SHRINK_WAIT_NS  # drop a frame, a quiet one if one comes soon
            self._ticks = 0
            self._min_level = 1 << 30
        if self._shrink_by and level > 1 and self._try_shrink(now):
            cursor = self._cursor
            level -= 1
        if self._grow:
            self._grow = False
            if 0 < level < self._target_frames() and self._held < self._max_frames:
                self._held += 1
                return self._conceal(now)  # hold one frame: more delay before the next packet is due
        idx = cursor & _MASK
        payload = self._payload[idx]
        if payload is not None and self._slot[idx] == cursor:  # the common case, inlined
            self._payload[idx] = None  # the slot number stays: a later copy is a duplicate
            self._cursor = cursor + 1
            self._last_seq = self._seq[idx]
            self.frames_played += 1
            self._out_seq += 1
            return PlayoutFrame(
                self.plc.good(self._decode(payload)), self._out_seq, self._arrival[idx], FrameKind.AUDIO
            )
        if level <= 0:  # underrun: nothing newer buffered either; hold the cursor (the delay grows)
            self.underruns += 1
            if self._held < _RING:
                self._held += 1
            return self._conceal(now)
        # the cursor's slot is missing and something newer is here
        first = cursor + 1
        while first <= self._highest:
            j = first & _MASK
            if self._slot[j] == first and self._payload[j] is not None:
                break
            first += 1
        gap = first - cursor
        if self._last_seq >= 0 and self._seq[first & _MASK] == (self._last_seq + 1) & 0xFFFF:
            # no sequence number is missing: the sender suppressed silence (DTX), nothing is late
            if self._held >= gap:
                self._held -= gap
                return self._play(first & _MASK, first)
            self._cursor = cursor + 1
            self.frames_silence += 1
            return self._emit(self._silence, now, FrameKind.SILENCE)
        if level < self._target_frames() and self._held < self._max_frames:
            self._held += 1  # thinner than the jitter needs: wait for it (the delay grows by a frame)
            self.waits += 1
            return self._conceal(now)
        if self._held >= gap:  # lost, and the delay was raised while waiting for it: take it back
            self._held -= gap
            self.lost += gap
            return self._play(first & _MASK, first)
        self._cursor = cursor + 1
        self.lost += 1
        return self._conceal(now)

    def skip(self, slots: int, now: int) -> None:
        """The media clock skipped `slots` slots (it woke late at `now`): their frames are owed, at most the
        ceiling's, from the next tick on (their packets are still in the socket: the loop reads them after
        the late tick)."""
        if self._started and slots > 0:
            self.owed = min(self.owed + slots, self._max_frames)
            self._owed_after = now

    def pop_backlog(self, now: int) -> PlayoutFrame | None:
        """After a later tick's `pop`: one owed frame, as that slot's `pop` would have given it (the packet, or
        its concealment when it is missing: a frame for every slot, served or skipped), else None. The common
        case is one comparison."""
        if not self.owed or now <= self._owed_after:
            return None
        self.owed -= 1
        self.frames_backlog += 1
        return self.pop(now)

    def _play(self, idx: int, slot: int) -> PlayoutFrame:
        payload = self._payload[idx]
        assert payload is not None
        self._payload[idx] = None  # the slot number stays: a later copy is a duplicate
        self._cursor = slot + 1
        self._last_seq = self._seq[idx]
        self.frames_played += 1
        pcm = self.plc.good(self._decode(payload))
        return self._emit(pcm, self._arrival[idx], FrameKind.AUDIO)

    def _conceal(self, now: int) -> PlayoutFrame:
        pcm = self.plc.conceal()
        if pcm is self._silence:  # faded out (or nothing to conceal from)
            self.frames_silence += 1
            return self._emit(pcm, now, FrameKind.SILENCE)
        self.frames_concealed += 1
        return self._emit(pcm, now, FrameKind.CONCEALED)

    def _emit(self, pcm: bytes, arrival_ns: int, kind: FrameKind) -> PlayoutFrame:
        self._out_seq += 1
        return PlayoutFrame(pcm, self._out_seq, arrival_ns, kind)

    def _try_shrink(self, now: int) -> bool:
        """Lower the delay by one frame if the cursor's frame is a good one to lose: missing (it would only be
        concealed), quiet (peak under -30 dBFS), or the shrink has waited 2 s for a quiet one."""
        cursor = self._cursor
        idx = cursor & _MASK
        payload = self._payload[idx]
        if payload is not None and self._slot[idx] == cursor:
            if now < self._shrink_by:
                samples = array("h")
                samples.frombytes(self._decode(payload))
                if max(samples) >= _QUIET or min(samples) <= -_QUIET:
                    return False
            self._last_seq = self._seq[idx]
            self._payload[idx] = None
        self._cursor = cursor + 1
        if self._held:
            self._held -= 1
        self._shrink_by = 0
        self.frames_dropped_shrink += 1
        return True
