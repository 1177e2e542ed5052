"""The generation reservoir: audio the provider has sent that the caller has not yet been played.

Seed 000 separates it from the playback cushion. The cushion is the channel's small playout target (for the
RTP carrier, the pacer's lead of one or two frames); the reservoir is everything received beyond that, bounded
by `AudioLimits`:

- `output_overflow`: the next bytes would exceed the capacity (bytes of the received format). Those bytes are
  not stored: the reservoir never grows past its bound.
- `output_stale`: the oldest unplayed audio has waited longer than the residence deadline.

Both are recoverable media conditions (HR1): the reservoir detects, counts and reports them; the repair
belongs to bridge/engine/recovery.py.

Hold and ringing are not media conditions (S7): while nothing can play — the caller put the call on hold, or
an outbound call still rings — the reservoir is *paused*. Its residence clocks stop (the stored audio's age
does not grow while paused: on resume every arrival stamp moves on by the paused time), nothing goes stale,
and audio beyond the capacity is dropped and counted (`paused_dropped_bytes`), never reported as an overflow:
no consumer was late, the line was. The coordinator decides what is stored while paused (on hold: nothing, the
assistant was cut at what the caller heard; while ringing: what the model says waits for the answer). The reservoir adds no initial wait — audio can be taken out the moment it
arrives — and never changes samples or rate: it hands out the bytes it was given, in order.

`OutputPath` (below) is the whole output path around it: framing for the carrier, the cushion, item
boundaries, clears through the playback barrier and the final message.

Sans-I/O: every call takes `now` (monotonic ns); `next_deadline()` says when staleness must be checked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from bridge.engine.barrier import Channel, PlaybackBarrier
from bridge.engine.commands import BargedIn, CancelResponse, Outbox, Truncate

# re-exported: the media conditions this path detects (HR1)
from bridge.engine.commands import MediaCondition as MediaCondition
from bridge.engine.commands import OutputOverflow as OutputOverflow
from bridge.engine.commands import OutputStale as OutputStale
from bridge.engine.framing import CarrierConverter, ItemFramer
from providers.limits import AudioLimits
from rtp.audio import FRAME_MS, PCMU_8K, AudioFormat
from rtp.playout import OutboundFrame
from rtp.units import NS_PER_MS
from sip.leg import offers_cushion

TICK_NS = FRAME_MS * NS_PER_MS
# How late a caller frame (the media tick that tops the cushion up) may come before the cushion's own timer
# does it instead. Without it the timer, due a tick after the last frame, raced the next frame and won: the
# session's loop woke for every frame while output played (measured: 0.5 wake-ups a frame, each a task step,
# a timer and a queue get), and the frame went through the inbox behind it.
FRAME_LATE_NS = TICK_NS // 2


class GenerationReservoir:
    """Bounded FIFO of received audio chunks, each stamped with its arrival time."""

    def __init__(self, limits: AudioLimits, fmt: AudioFormat) -> None:
        self.limits = limits
        self.format = fmt
        self._chunks: deque[tuple[int, bytes, str | None]] = deque()  # (arrival ns, audio, item id)
        self._head_offset = 0  # bytes of the first chunk already taken
        self.depth_bytes = 0
        self.overflows = 0
        self.stales = 0
        self.dropped_bytes = 0  # by overflow or clear
        self._stale_reported = False
        self.paused_at: int | None = None  # S7: when the line went on hold or started ringing (None: playing)
        self.paused_dropped_bytes = 0  # beyond the capacity while paused: dropped, not an overflow (S7)
        self._dropped_before_pause = 0

    def push(self, audio: bytes, now: int, item_id: str | None = None) -> OutputOverflow | None:
        """Store received audio, or report an overflow (and keep none of `audio`)."""
        if not audio:
            return None
        if self.depth_bytes + len(audio) > self.limits.capacity_bytes:
            self.dropped_bytes += len(audio)
            if self.paused_at is not None:  # S7: nothing can play; the line is held, not the consumer late
                self.paused_dropped_bytes += len(audio)
                return None
            self.overflows += 1
            return OutputOverflow(len(audio), self.depth_bytes, self.limits.capacity_bytes)
        self._chunks.append((now, audio, item_id))
        self.depth_bytes += len(audio)
        return None

    def pull(self, nbytes: int) -> tuple[bytes, str | None]:
        """Up to `nbytes` of the oldest audio, with the item id it belongs to (a pull never spans items)."""
        chunks = self._chunks
        if chunks:  # most pulls: the oldest chunk holds them whole (a slice of it, no buffer)
            _, chunk, head_item = chunks[0]
            start = self._head_offset
            end = start + nbytes
            if end <= len(chunk):
                if end == len(chunk):
                    chunks.popleft()
                    self._head_offset = 0
                    if not chunks:
                        self._stale_reported = False
                else:
                    self._head_offset = end
                self.depth_bytes -= nbytes
                return chunk[start:end], head_item
        out = bytearray()
        item: str | None = None
        while self._chunks and len(out) < nbytes:
            arrived, chunk, chunk_item = self._chunks[0]
            if out and chunk_item != item:
                break
            item = chunk_item
            take = chunk[self._head_offset : self._head_offset + nbytes - len(out)]
            out += take
            self._head_offset += len(take)
            if self._head_offset >= len(chunk):
                self._chunks.popleft()
                self._head_offset = 0
        self.depth_bytes -= len(out)
        if not self._chunks:
            self._stale_reported = False
        return bytes(out), item

    def pause(self, now: int) -> None:
        """S7: nothing can play from now on (hold, ringing): the residence clocks stop."""
        if self.paused_at is None:
            self.paused_at = now

    def resume(self, now: int) -> int:
        """The line is up again: the stored audio's age goes on from where it stopped. Returns the bytes
        dropped beyond the capacity during this pause."""
        at, self.paused_at = self.paused_at, None
        if at is not None and now > at and self._chunks:
            shift = now - at
            self._chunks = deque((arrived + shift, audio, item) for arrived, audio, item in self._chunks)
        dropped = self.paused_dropped_bytes - self._dropped_before_pause
        self._dropped_before_pause = self.paused_dropped_bytes
        return dropped

    def check(self, now: int) -> OutputStale | None:
        """Report staleness once per episode (until the reservoir has drained or been cleared); never while
        paused (S7)."""
        if self.paused_at is not None:
            return None
        age_ms = self.oldest_age_ms(now)
        if age_ms is None or age_ms <= self.limits.residence_ms or self._stale_reported:
            return None
        self._stale_reported = True
        self.stales += 1
        return OutputStale(age_ms, self.limits.residence_ms, self.depth_bytes)

    def oldest_age_ms(self, now: int) -> int | None:
        """How long the oldest audio has waited to be played (the paused time does not count)."""
        if not self._chunks:
            return None
        at = now if self.paused_at is None else min(now, self.paused_at)
        return (at - self._chunks[0][0]) // NS_PER_MS

    def next_deadline(self) -> int | None:
        """When the oldest audio goes stale (None when empty, already reported or paused)."""
        if not self._chunks or self._stale_reported or self.paused_at is not None:
            return None
        return self._chunks[0][0] + self.limits.residence_ms * NS_PER_MS + 1

    def item_ids(self) -> list[str | None]:
        """The items with audio waiting, oldest first."""
        seen: dict[str | None, None] = {}
        for _, _, item in self._chunks:
            seen[item] = None
        return list(seen)

    def clear(self) -> int:
        """Drop everything (a barrier clear or a recovery); returns the bytes dropped."""
        dropped = self.depth_bytes
        self._chunks.clear()
        self._head_offset = 0
        self.depth_bytes = 0
        self.dropped_bytes += dropped
        self._stale_reported = False
        return dropped

    @property
    def depth_ms(self) -> float:
        return self.format.duration_ms(self.depth_bytes)


class OutputPath:
    """The output path (SE2, SE3, HR1 detection, DESIGN §5): received audio → reservoir → carrier converter →
    item framer → the channel's playback cushion, with item boundaries and the final message.

    Audio is stored with its item; GPT-Live names no items, so a pause of `item_quiet_ms` ends one. The cushion
    is topped up to `lead_frames` (or the channel's own `cushion_frames`, read each time) on every media tick
    (a caller frame) and, while anything waits, on a timer: due `FRAME_LATE_NS` after the next caller frame
    should have come, then every 20 ms while none comes (a hold, a caller that sends nothing), so the first
    frame plays as soon as it arrives. Every clear
    goes through the playback-epoch barrier (SE4). While paused (S7: hold, ringing) nothing moves to the
    cushion and no timer runs: the carrier does not take frames then, and the audio waits where it is.
    """

    def __init__(
        self, limits: AudioLimits, fmt: AudioFormat, channel: Channel, *, lead_frames: int, item_quiet_ms: int
    ) -> None:
        self.reservoir = GenerationReservoir(limits, fmt)
        self.converter = CarrierConverter(fmt)
        self._pcmu = fmt == PCMU_8K  # frames carry the provider's µ-law too, for a PCMU call as it came
        self.rate = 8000  # the leg's media rate: the PCM rate of the frames played (`set_rate`)
        self.framer = ItemFramer()
        self.barrier = PlaybackBarrier(channel)
        self.channel = channel
        self._lead = (
            lead_frames  # the carrier's; a channel with its own cushion says how many on every top-up
        )
        self._cushion = channel if offers_cushion(channel) else None  # (asked once, not per frame)
        self._quiet_ns = item_quiet_ms * NS_PER_MS
        self._ready: list[OutboundFrame] = []  # framed output waiting for room in the cushion
        self._next_tick: int | None = None
        self._items = 0
        self._item_id: str | None = None  # the item audio is arriving for now
        self._last_audio_ns: int | None = None
        self._last_transmitted = 0
        self._frame_ns: int | None = None  # the latest caller frame's tick (`count_underrun`)
        self.underruns = 0  # media ticks that found no frame ready in the middle of an item
        self.paused = False  # S7: the line is held or ringing (`pause`)
        # the disclosure plays (bridge/engine/disclosure.py): a clear (a barge-in, a hold) leaves the channel alone
        self.protected = False
        self.on_item: Callable[[str, int], None] | None = None  # told of each item's first audio (item, now)

    def set_rate(self, rate: int) -> None:
        """The leg's media rate, from its answer (sip.leg `MediaStarted.rate`): frames are made at it from the
        next item on (16 kHz on a G.722 leg: Gemini's 24 kHz is resampled once, never through 8 kHz). A
        provider that speaks 8 kHz G.711 stays framed at 8 kHz, as before: it has nothing above 4 kHz, and the
        leg's encoder takes an 8 kHz frame (G.722's own interpolator). An item already being framed finishes
        at the rate it started at."""
        self.rate = rate if self.reservoir.format.rate > 8000 else 8000

    def _start_item(self, item: str) -> None:
        if self.converter.rate != self.rate:  # the media rate changed: the converter follows (once an item)
            self.converter = CarrierConverter(self.reservoir.format, self.rate)
        self.framer.start(item, self.barrier.epoch, pcmu=self._pcmu, rate=self.rate)

    def _quiet(self, now: int) -> bool:
        """No audio for `item_quiet_ms` (or none yet): the item audio was arriving for is over."""
        return self._last_audio_ns is None or now - self._last_audio_ns >= self._quiet_ns

    def push(self, audio: bytes, item_id: str | None, now: int) -> tuple[bool, OutputOverflow | None]:
        """Store received audio; returns (whether it began an unnamed item, the overflow if it did not fit)."""
        began = new = False
        if item_id is None:  # GPT-Live: a pause ends an item
            if self._item_id is None or self._quiet(now):
                self._items += 1
                self._item_id = f"out-{self._items}"
                began = new = True
            item_id = self._item_id
        elif item_id != self._item_id:
            self._item_id, new = item_id, True
        if (
            new and self.on_item is not None
        ):  # the first audio of an item arrived (a turn's times: latency.py)
            self.on_item(item_id, now)
        self._last_audio_ns = now
        overflow = self.reservoir.push(audio, now, item_id)
        if overflow is None:
            self.feed(now)
        return began, overflow

    def tick(self, now: int) -> None:
        """A media-clock tick (a caller frame arrived): the underrun count, then the cushion topped up."""
        self.count_underrun(now)
        self.feed(now)

    def count_underrun(self, now: int) -> None:
        """Count an underrun if the cushion ran dry mid-item since the last tick (the coordinator calls this on
        a caller frame and feeds once, after the frame's turn decisions)."""
        transmitted = self.channel.ledger.frames_transmitted
        if transmitted == self._last_transmitted and self.framer.item_id is not None and not self._quiet(now):
            self.underruns += 1  # this tick's pull found the cushion empty mid-item: the caller heard a gap
        self._last_transmitted = transmitted
        self._frame_ns = now

    def feed(self, now: int) -> None:
        """Top the cushion up from the reservoir: to `lead_frames`, or to what the channel's cushion asks."""
        ready = self._ready
        if self.paused or (not ready and self.framer.item_id is None and not self.reservoir.depth_bytes):
            self._next_tick = None  # nothing received waits (most caller frames of a call)
            return
        lead = self._cushion.cushion_frames if self._cushion is not None else self._lead
        room = lead - self.channel.depth
        while room > len(self._ready):
            data, item = self.reservoir.pull(self.converter.frame_bytes)
            if not data:
                if self.framer.item_id is not None and self._quiet(now):
                    self._ready += self.framer.finish() + self._flush_converter()
                break
            if item != self.framer.item_id:
                self._ready += self._flush_converter() + self.framer.finish()
                self._start_item(item or "out")
            self._ready += self.framer.add(self.converter.convert(data), data if self._pcmu else None)
        if room > 0 and self._ready:
            batch, self._ready = self._ready[:room], self._ready[room:]
            self.channel.enqueue(batch)
        if self.busy:  # the timer tops up only where the next caller frame is late, or none comes (a hold)
            late = None if self._frame_ns is None else self._frame_ns + TICK_NS + FRAME_LATE_NS
            self._next_tick = now + TICK_NS if late is None or late < now + TICK_NS else late
        else:
            self._next_tick = None

    @property
    def busy(self) -> bool:
        """Output is waiting in the reservoir or the framer (not yet in the cushion)."""
        return bool(self.reservoir.depth_bytes or self._ready or self.framer.pending_bytes)

    def drained(self, now: int) -> bool:
        """Everything received has been played and the item is over (RO2, RO8, DL6)."""
        return not self.busy and self.channel.depth == 0 and self._quiet(now)

    def _flush_converter(self) -> list[OutboundFrame]:
        tail = self.converter.end_item()
        return self.framer.add(tail) if tail and self.framer.item_id is not None else []

    def clear(self) -> tuple[int, list[str]]:
        """Drop all unplayed output through the barrier; returns the ms dropped and the items it belonged to.
        While the disclosure plays (`protected`) the channel holds only it: the model's output is dropped, the
        channel is not cleared."""
        items: dict[str, None] = {frame.item_id: None for frame in self._ready}
        if self.framer.item_id is not None:
            items[self.framer.item_id] = None
        for item in self.reservoir.item_ids():
            if item is not None:
                items[item] = None
        dropped_ms = int(self.reservoir.format.duration_ms(self.reservoir.clear()))
        pending = len(self._ready) * FRAME_MS + (FRAME_MS if self.framer.pending_bytes else 0)
        self._ready = []
        self.framer.discard()
        self.converter.reset()
        self._item_id = None
        if self.protected:
            return dropped_ms + pending, list(items)
        result = self.barrier.clear()
        for item in result.transmitted_ms:
            items[item] = None
        return dropped_ms + pending + result.dropped_ms, list(items)

    def cut(self) -> tuple[int, list[tuple[str, int]]]:
        """Stop the assistant at what the caller heard: clear everything unplayed through the barrier; returns
        the ms dropped and each cut item with the ms of it transmitted (the carrier ledger, HR4)."""
        cleared_ms, items = self.clear()
        ledger = self.channel.ledger
        return cleared_ms, [(item, ledger.transmitted_ms(item)) for item in items]

    def pause(self, now: int) -> None:
        """S7: nothing can play (hold, ringing): the reservoir's clocks stop and the cushion is not topped up."""
        self.paused = True
        self.reservoir.pause(now)
        self._next_tick = None

    def resume(self, now: int) -> int:
        """The line is up again: what waits plays on, its residence clocks going on from where they stopped.
        Returns the bytes that did not fit while paused."""
        if not self.paused:
            return 0
        self.paused = False
        dropped = self.reservoir.resume(now)
        self.feed(now)
        return dropped

    def play_disclosure(self, pcm16_8k: bytes, item_id: str) -> int:
        """Queue the disclosure recording for the caller ahead of anything of the model's (the line's output is
        held meanwhile, `Line.disclose`), protected from clears; returns its length in frames."""
        framer = ItemFramer()  # its own: the model's item being framed is not touched
        framer.start(item_id, self.barrier.epoch)
        frames = framer.add(pcm16_8k) + framer.finish()
        self.channel.enqueue(frames)
        self.protected = True
        return len(frames)

    def play_final_message(self, pcm16_8k: bytes) -> int:
        """Clear all output and queue a closing message for the caller; returns its length in ms."""
        self.protected = False  # the session ends: a disclosure still playing goes too
        self.clear()
        self.framer.start("final-message", self.barrier.epoch)
        frames = self.framer.add(pcm16_8k) + self.framer.finish()
        self.channel.enqueue(frames)
        return len(frames) * FRAME_MS

    def handle_timer(self, now: int) -> OutputStale | None:
        """Staleness, checked on the timer (the coordinator feeds after every input)."""
        return self.reservoir.check(now)

    def next_deadline(self) -> int | None:
        tick, stale = self._next_tick, self.reservoir.next_deadline()
        return stale if tick is None or (stale is not None and stale < tick) else tick

    def status(self, now: int) -> dict[str, object]:
        r = self.reservoir
        return {
            "limits": {
                "capacity_bytes": r.limits.capacity_bytes,
                "residence_ms": r.limits.residence_ms,
                "format": str(r.format),
            },
            "reservoir": {
                "depth_bytes": r.depth_bytes,
                "depth_ms": round(r.depth_ms),
                "oldest_age_ms": r.oldest_age_ms(now),
                "overflows": r.overflows,
                "stales": r.stales,
                "dropped_bytes": r.dropped_bytes,
                "paused": self.paused,
                "paused_dropped_bytes": r.paused_dropped_bytes,
            },
        }


class Watchdog(Protocol):
    """The silence watchdog (bridge/engine/recovery.py `RecoveryController`): off while nothing can play."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class Line:
    """The line the output plays to (S7): hold and ringing are states of the line, not media conditions — they
    never start a recovery.

    - `hold` (the leg's MediaHeld): the assistant stops at what the caller heard — everything unplayed is cleared
      through the barrier, as a barge-in would (`BargedIn` with source "hold"), the provider is told the
      truncation point where it can take one and asked to stop its response. While held, the floor's audio is
      dropped, not stored (nobody hears it, and the caller is not to come back to the middle of a sentence
      spoken into the hold); the reservoir's clocks are paused and the silence watchdog is off
      (bridge/engine/recovery.py). Caller frames that still come while held (music on hold, where an engine passes
      it; the native engine passes none) are counted and not forwarded: the provider hears nothing — no
      silence is made up and sent, which a provider would bill as input audio; the timeline keeps the gap
      (bridge/engine/timeline.py). Results and application updates wait for the resume (the ledger's hand-over
      gate), so what the caller is told is heard.
    - `resume` (MediaResumed): the conversation goes on — no recovery, no notice, no apology; what waited is
      delivered, and the model answers the caller's next words. Items whose audio was dropped during the hold
      are truncated at 0 ms where the provider takes truncations.
    - A recovery under way when the hold begins goes on (its 5 s budget still applies) and completes with the
      caller's first fresh turn after the resume; a connection lost during the hold is repaired as at any
      time. A rollover goes on by its own timeline: with output cut, the old connection is drained and the
      floor moves. A hang-up while held ends the session as any hang-up.
    - `ring` (an outbound call not answered yet): what the model says is stored, paused, and plays when the
      callee answers (`answered`, the leg's MediaStarted); speakable updates — the route's greeting — are held
      until then, so the greeting is spoken to the callee, not to the ringing line.
    - A hold has holders (`by`): the caller's (MediaHeld) and a warm transfer's (bridge/engine/warm_transfer.py,
      the caller waiting on hold music). The line is held while either holds it and resumes when the last
      lets go: a caller who resumes during a warm transfer still does not hear the model.
    """

    def __init__(
        self, output: OutputPath, out: Outbox, watchdog: Watchdog, *, truncate: bool, token: int
    ) -> None:
        self._output, self._out, self._watchdog, self._truncate = output, out, watchdog, truncate
        self.on_hold = False  # the caller holds the call (`hold`)
        self._holders: set[str] = set()  # who holds it: "caller", "transfer"
        self.unanswered = False  # an outbound call still rings (`ring`)
        # the disclosure has not reached the carrier yet (`disclose`): the output is held, caller frames still go
        self.disclosing = False
        self.paused = False  # either: nothing can play, nothing is forwarded (a flag test per caller frame)
        self.dropped_bytes = 0  # the floor's audio dropped while held
        # The floor's items whose audio came while held: True, truncated at 0 ms on resume (a truncation goes
        # to the floor); False, cut at the hold itself. Another floor since (a rollover, a repair): forgotten.
        self._unheard: dict[str, bool] = {}
        self._unheard_token = token

    @property
    def state(self) -> str:
        return "held" if self.on_hold else "ringing" if self.unanswered else "up"

    def hold(self, token: int, now: int, at_ms: int, *, cancel: bool, by: str = "caller") -> bool:
        """The caller put the call on hold: the assistant stops at what the caller heard (`cancel`: the floor
        has a response to stop; a replacement being opened has said nothing yet). False when already held."""
        held, self._holders = self.on_hold, self._holders | {by}
        if held:
            return False
        self.on_hold = True
        cleared_ms, heard = self._output.cut()
        if cleared_ms or heard:
            self._out.notices.append(BargedIn(at_ms, "hold", cleared_ms, tuple(heard)))
        if cancel:
            self._out.commands.append(CancelResponse(token))  # first: a truncation then sticks
        if self._truncate:
            self._out.commands.extend(Truncate(item, ms) for item, ms in heard)
        self._unheard, self._unheard_token = {item: False for item, _ in heard}, token
        self._settle(now)
        return True

    def held(self, audio: bytes, item_id: str | None, token: int) -> bool:
        """The floor's audio while held is dropped and counted: nobody hears it; not stored, so it cannot
        overflow or go stale. False when the call is not held."""
        if not self.on_hold:
            return False
        self.dropped_bytes += len(audio)
        if token != self._unheard_token:
            self._unheard, self._unheard_token = {}, token
        if item_id is not None and item_id not in self._unheard:
            self._unheard[item_id] = True
        return True

    def resume(self, token: int, now: int, *, truncate: bool, by: str = "caller") -> bool:
        """The caller took the call off hold (`truncate`: the session goes on, so unheard items are cut).
        False when it was not held, or another holder still holds it."""
        self._holders = self._holders - {by}
        if not self.on_hold or self._holders:
            return False
        self.on_hold = False
        if self._truncate and truncate and self._unheard_token == token:
            self._out.commands.extend(Truncate(item, 0) for item, unheard in self._unheard.items() if unheard)
        self._unheard = {}
        self._settle(now)
        return True

    @property
    def gated(self) -> bool:
        """Results and speakable updates wait: nothing of the model's can be heard now."""
        return self.paused or self.disclosing

    def disclose(self, now: int) -> None:
        """The disclosure is to be the call's first audio: the model's output is held until `disclosed`."""
        self.disclosing = True
        self._settle(now)

    def disclosed(self, now: int) -> int:
        """The disclosure has reached the carrier (or never will): the model's output plays, unless the line is
        held or rings. Returns the bytes of output that did not fit while it was held."""
        if not self.disclosing:
            return 0
        self.disclosing = False
        return self._settle(now)

    def ring(self, now: int) -> bool:
        """An outbound call rings (False when it already did)."""
        if self.unanswered:
            return False
        self.unanswered = True
        self._settle(now)
        return True

    def answer(self, now: int) -> int | None:
        """The callee answered: None when the call did not ring, else the bytes of output that did not fit
        while it rang."""
        if not self.unanswered:
            return None
        self.unanswered = False
        return self._settle(now)

    def _settle(self, now: int) -> int:
        """After a change of the line: pause or resume what plays and the silence watchdog; returns the bytes
        of output that did not fit while paused (0 on pausing, or when nothing changed). The disclosure holds
        the output only: the caller is heard and the watchdog runs."""
        paused = self.on_hold or self.unanswered
        output = self._output
        if paused != self.paused:
            self.paused = paused
            if paused:
                output.pause(now)
                self._watchdog.pause()
            else:
                self._watchdog.resume()
        if paused or self.disclosing:
            if not output.paused:
                output.pause(now)
            return 0
        return output.resume(now)
