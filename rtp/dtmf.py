"""RFC 4733 telephone-events: the receiver that turns event packets into digits, and the sender's schedule.

Payload (§2.3): event (8 bits), E (end), R, volume (6 bits), duration (16 bits, timestamp units since the
event's RTP timestamp). Every packet of one event carries the same RTP timestamp.

Receiver rules:
- An event is identified by its RTP timestamp, never by the marker bit (carriers that never set it exist,
  and a lost first packet must not lose the digit).
- A digit is reported once, when the event ends: at the first packet with E set (the two or more copies of
  the end packet that follow are ignored), when a packet with a new timestamp arrives (the old event's end was
  lost), or when no packet of the event has arrived for `end_timeout_ms` (default 400 ms; updates come
  every ~50 ms). The digit carries the longest duration seen.
- Packets of an event already reported (late updates, repeated end packets) are ignored; so are packets
  up to 10 s older than the newest event (further back is a restarted sender's new event).

Sender schedule (`DtmfSender`, driven by the media clock one tick at a time): for each digit, packets at
0, 50, 100, ... ms after its start, each carrying the duration up to the end of its interval (50 ms → 400
timestamp units), the packet reaching the tone's duration (160 ms default) with E set and sent three times on
consecutive ticks, the marker on the first packet only, one RTP timestamp per event, and a pause (100 ms
default) from the end of one tone to the start of the next. A packet is sent on the first tick at or after
its time; ticks in between send nothing (the event replaces the audio).
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

from rtp.packet import Drop
from rtp.units import NS_PER_MS

__all__ = ["DtmfDigit", "DtmfReceiver", "DtmfPacket", "DtmfSender", "DIGITS", "event_code"]

DIGITS = "0123456789*#ABCD"  # event codes 0..15 (§3.2)
_EVENT = struct.Struct("!BBH")


def event_code(digit: str) -> int:
    """RFC 4733 event code of a DTMF digit (a-d taken as A-D); ValueError for anything else."""
    code = DIGITS.find(digit.upper()) if len(digit) == 1 else -1
    if code < 0:
        raise ValueError(f"{digit!r} is not a DTMF digit (0-9, *, #, A-D)")
    return code


@dataclass(frozen=True, slots=True)
class DtmfDigit:
    """A digit the caller pressed: reported once, when its event ended."""

    digit: str
    duration_ms: int
    timestamp: int  # the event's RTP timestamp
    ended_by: str  # "end" (E bit), "next" (a new event began), "timeout"


class DtmfReceiver:
    """RFC 4733 receiver for one stream. `receive` per telephone-event packet; `handle_timer` at
    `next_deadline()` ends an event whose end packets were all lost."""

    def __init__(self, clock_rate: int = 8000, end_timeout_ms: int = 400) -> None:
        self._rate = clock_rate
        self._timeout = end_timeout_ms * NS_PER_MS
        self._stale = 10 * clock_rate  # further back than 10 s: a restarted sender, not a stale packet
        self._ts: int | None = None  # current event's timestamp
        self._latest: int | None = None  # timestamp of the newest event seen (current or reported)
        self._code = 0
        self._duration = 0
        self._last_ns = 0
        self._done: deque[int] = deque(maxlen=8)  # timestamps of events already reported
        self.digits = 0
        self.ignored = 0  # repeated end packets, late updates, stale or non-DTMF events

    def reset(self) -> None:
        """A new source (SSRC change): forget the current event without reporting it."""
        self._ts = self._latest = None
        self._done.clear()

    def next_deadline(self) -> int | None:
        return None if self._ts is None else self._last_ns + self._timeout

    def handle_timer(self, now: int) -> DtmfDigit | None:
        if self._ts is None or now < self._last_ns + self._timeout:
            return None
        return self._finish("timeout")

    def receive(self, timestamp: int, payload: bytes, now: int) -> tuple[DtmfDigit, ...] | Drop:
        """One telephone-event packet. Returns the digits that ended with it (usually none; two when a new
        event's end packet also ends an old event whose end was lost), or `Drop.BAD_DTMF` for a malformed
        payload. With several events in one payload (§2.5.1.5) the last one counts."""
        n = len(payload)
        if n < 4 or n % 4:
            return Drop.BAD_DTMF
        code, flags, duration = _EVENT.unpack_from(payload, n - 4)
        if timestamp in self._done:
            self.ignored += 1
            return ()
        finished: tuple[DtmfDigit, ...] = ()
        latest = self._latest
        if latest is not None and timestamp != latest:
            if ((latest - timestamp) & 0xFFFFFFFF) < self._stale:  # older than the latest event (< 10 s)
                self.ignored += 1
                return ()
            if self._ts is not None:
                finished = (self._finish("next"),)  # its end was lost
        self._latest = timestamp
        if code >= len(DIGITS):  # flash and other events: not digits
            self.ignored += 1
            return finished
        if self._ts is None:
            self._ts, self._code, self._duration = timestamp, code, duration
        elif duration > self._duration:
            self._duration = duration
        self._last_ns = now
        if flags & 0x80:  # E: the first end packet reports the digit; its copies are then in `_done`
            return finished + (self._finish("end"),)
        return finished

    def _finish(self, how: str) -> DtmfDigit:
        assert self._ts is not None
        digit = DtmfDigit(DIGITS[self._code], self._duration * 1000 // self._rate, self._ts, how)
        self._done.append(self._ts)
        self._ts = None
        self.digits += 1
        return digit


@dataclass(frozen=True, slots=True)
class DtmfPacket:
    """One telephone-event packet to send: the stream adds the sequence number and SSRC."""

    payload: bytes
    marker: bool
    timestamp: int


class DtmfSender:
    """Turns queued digits into RFC 4733 packets, one media tick at a time.

    Each tick the stream calls `poll(now, timestamp)` (timestamp: the RTP timestamp this tick's audio would
    have). It returns the packet to send this tick, or None; while `in_event` is true a None means "send
    nothing this tick" (the event replaces the audio), otherwise "send audio"."""

    def __init__(
        self,
        *,
        duration_ms: int = 160,
        update_ms: int = 50,
        gap_ms: int = 100,
        volume: int = 10,
        end_packets: int = 3,
        clock_rate: int = 8000,
    ) -> None:
        if not (update_ms > 0 and duration_ms > 0 and gap_ms >= 0 and 0 <= volume <= 63 and end_packets >= 1):
            raise ValueError("bad DTMF sender settings")
        self._units_per_ms = clock_rate // 1000
        self._duration = duration_ms
        self._update = update_ms
        self._gap = gap_ms * NS_PER_MS
        self._volume = volume
        self._end_packets = end_packets
        self._queue: deque[int] = deque()
        self._plan: deque[tuple[int, DtmfPacket]] = deque()  # (send at or after ns, packet) of the event
        self._not_before = 0  # the next event starts no earlier than this
        self.in_event = False
        self.digits_sent = 0

    @property
    def pending(self) -> bool:
        """True while digits are queued or one is being sent (the stream then polls every tick)."""
        return bool(self._queue or self._plan)

    def busy(self, now: int) -> bool:
        """True if this tick belongs to an event (being sent, or starting now): audio must wait."""
        return bool(self._plan) or (bool(self._queue) and now >= self._not_before)

    def queue(self, digits: str) -> None:
        """Queue digits behind those still being sent; ValueError (nothing queued) for a non-DTMF digit."""
        codes = [event_code(d) for d in digits]
        self._queue.extend(codes)

    def cancel(self) -> None:
        """Drop queued digits; an event already begun is finished (its end packets still go out)."""
        self._queue.clear()

    def _begin(self, code: int, now: int, timestamp: int) -> None:
        offsets = list(range(0, self._duration, self._update))
        for i, off in enumerate(offsets):
            end = i == len(offsets) - 1
            units = min(off + self._update, self._duration) * self._units_per_ms
            payload = _EVENT.pack(code, (0x80 if end else 0) | self._volume, units)
            packet = DtmfPacket(payload, i == 0, timestamp)
            self._plan.append((now + off * NS_PER_MS, packet))
            if end:
                for _ in range(self._end_packets - 1):  # repeats: one per following tick
                    self._plan.append((0, packet))
        self._not_before = now + (self._duration * NS_PER_MS) + self._gap
        self.digits_sent += 1

    def poll(self, now: int, timestamp: int) -> DtmfPacket | None:
        if not self._plan:
            self.in_event = False
            if not self._queue or now < self._not_before:
                return None
            self._begin(self._queue.popleft(), now, timestamp)
        self.in_event = True
        at, packet = self._plan[0]
        if now < at:
            return None
        self._plan.popleft()
        if not self._plan:
            self.in_event = False  # the last end packet: audio resumes on the next tick
        return packet
