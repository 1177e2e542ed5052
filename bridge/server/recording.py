"""The shells around a call's records: events to the application, `--cdr FILE`, `--record DIR`.

`CallReporter` — one per call — queues the session's notices (bridge/server/records.py `RECORD_NOTICES`, a few per
call) with the time they were made, feeds them to the `RecordBuilder` in a task of its own and hands each
event to the application in order (`Application.call_started`/`utterance`/`call_ended`, which the webhook
application POSTs). At the end it appends the record to the CDR file. Nothing here runs on the media path:
the session's only cost is one `put_nowait` per notice.

`CallRecording` — `--record DIR` — makes a stereo WAV per call (8 kHz, 16-bit): left the caller's frames as
they reached the session, right exactly what was transmitted to the carrier. The right channel is read from
the carrier ledger: `TeeChannel` keeps a reference to every frame the session queues for the caller, and each
ledger entry (item, offset, epoch, time) picks its frame out of them; frames cleared before they left are
never written. Both channels are placed on the call's timeline in 20 ms slots (silence where nothing was
sent or received). Per frame, the session only appends a reference to a list (`caller`, `enqueue`); the
matching, the interleaving and the file writes happen once a second in `WavWriter`'s task, the writes in a
worker thread.

Recording consent (a route's `recording_consent` or `recording_consent_wav`; two-party-consent jurisdictions
require the announcement before capture): the recording starts only once the announcement was heard whole —
the call record's consent result (bridge/server/records.py `RecordBuilder.consent`: a recording's from the
carrier ledger, bridge/engine/disclosure.py; a line of text's from the model's first utterance) is `delivered`
— and the WAV begins where its last frame's audio ended on the wire (`ended_ms`): no caller audio from before
that point is ever written, and there is no file until then. While it is awaited the caller's frames of the
last `HELD_KEEP_MS` are kept in memory only (the verdict on a line of text comes when its utterance closes,
`quiet_ms` after its last frame; the caller's "yes" right after the announcement belongs in the recording),
older ones are dropped unwritten. Not delivered — a barge-in cut the model's line, a provider recovery cleared
it, the caller hung up first, the model said something else — means no consent: nothing of the call is
recorded and the record says why (`consent`). A recording plays whole through a barge-in (the caller heard
every frame of it), so it counts; the recording starts after its last frame either way.

Pausing (`CallRecording.pause`/`resume`: the application's or the model's `pause_recording`, and a payment-card
collection, bridge/engine/card.py): while paused, neither channel keeps any audio, and the file gets silence for
the gap's real duration, so the timeline stays true (a second in the file is a second of the call, and the
record's `recording_gaps` and `card_collections` are offsets into it; its other times are on the call's timeline,
where the file begins at `recording_start_ms`). Each gap (start, end, who asked) is kept in `gaps`, and the session tells
the record (bridge/server/records.py `RecordingChanged`); the file marks each one too, as a cue point at its
start ("recording paused (card)") and one at its end ("recording resumed"), in a RIFF `cue ` chunk with a
`LIST`/`adtl` of their labels after the audio (read by audio editors; players skip it). A card collection holds its own pause: the application
or the model resuming meanwhile ends their pause only, the gap goes on until the collection ends.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
import wave
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np

from bridge.engine.barrier import Channel
from bridge.engine.commands import DisclosureResult
from bridge.engine.disclosure import Disclosure
from bridge.server.records import (
    RECORD_NOTICES,
    AppEvent,
    CallEnded,
    CallInfo,
    CallOutcome,
    CallRecord,
    DialRow,
    RecordBuilder,
)
from bridge.server.session import CallSummary
from rtp.audio import FRAME_MS
from rtp.ledger import CarrierLedger
from rtp.playout import ClearResult, OutboundFrame
from rtp.resample import NarrowView
from rtp.rtcp import QoS
from rtp.units import NS_PER_MS
from sip.leg import CallIdentity, CushionedChannel, LegFeatures, QosSource, offers_cushion, offers_qos

log = logging.getLogger("parlora.records")

FRAME_NS = FRAME_MS * NS_PER_MS
FRAME_BYTES = 320  # 20 ms of 8 kHz PCM16
SILENCE = bytes(FRAME_BYTES)
RATE = 8000
MARGIN_FRAMES = 10  # slots this recent are not written yet (a frame may still be placed there)
EVENT_TIMEOUT_S = 10.0  # one application event handler, at most
HELD_KEEP_MS = 3_000  # awaiting the consent: the caller's latest frames kept in memory (module docstring)
MAX_QUEUED_NOTICES = 10_000
MAX_GAPS = 256  # a recording's pauses kept (the oldest ended ones go first)

Deliver = Callable[[AppEvent], Awaitable[None]]


# --- events and the CDR ---


class CdrWriter:
    """`--cdr FILE`: one JSON line per finished call, appended (in a worker thread, one write per line)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()  # lines of calls ending at once never interleave

    def _write(self, line: str) -> None:
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")

    async def append(self, record: CallRecord | DialRow) -> None:
        label = record.call.call_id if isinstance(record, CallRecord) else record.label
        try:
            await asyncio.to_thread(self._write, record.cdr_line())
        except OSError as exc:
            log.error("call %s: cannot append to the CDR file %s: %s", label, self.path, exc)


class CallReporter:
    """One call's events, in order, and its record (see the module docstring)."""

    def __init__(
        self,
        builder: RecordBuilder,
        deliver: Deliver,
        *,
        cdr: CdrWriter | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        on_consent: Callable[[DisclosureResult], None] | None = None,
    ) -> None:
        self.builder = builder
        self._on_consent = on_consent  # told once, when the builder has the recording consent's result
        self._deliver = deliver
        self._cdr = cdr
        self._clock = clock
        self._queue: asyncio.Queue[tuple[object, int] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.record: CallRecord | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"{self.builder.call.call_id}-events")

    def notice(self, call_id: str, notice: object) -> None:
        """The session's notice sink (synchronous, cheap): only what the builder reads is queued."""
        if isinstance(notice, RECORD_NOTICES):
            if self._queue.qsize() >= MAX_QUEUED_NOTICES:  # an application that never returns
                self.dropped += 1
                return
            self._queue.put_nowait((notice, self._clock()))

    async def _send(self, event: AppEvent) -> None:
        try:
            await asyncio.wait_for(self._deliver(event), EVENT_TIMEOUT_S)
        except Exception as exc:  # the application's failure never ends the call or the events
            log.warning(
                "call %s: the application's %s handler failed: %r",
                self.builder.call.call_id,
                type(event).__name__,
                exc,
            )

    async def _run(self) -> None:
        builder = self.builder
        await self._send(builder.started())
        while True:
            deadline = builder.next_deadline()
            timeout = None if deadline is None else max(0.0, (deadline - self._clock()) / 1e9)
            try:
                item = await asyncio.wait_for(self._queue.get(), timeout)
            except TimeoutError:
                events = builder.handle_timer(self._clock())
            else:
                if item is None:
                    return
                events = builder.notice(*item)
            if self._on_consent is not None and builder.consent is not None:
                self._on_consent(builder.consent)
                self._on_consent = None
            for event in events:
                await self._send(event)

    async def finish(self, outcome: CallOutcome) -> CallRecord:
        """The call is over: the remaining events, `call_ended` with the record, and the CDR line."""
        self._queue.put_nowait(None)
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), EVENT_TIMEOUT_S)
            except TimeoutError:
                self._task.cancel()
        events, record = self.builder.finish(outcome, self._clock())
        self.record = record
        if self._cdr is not None:  # first: a slow application cannot keep the line from being written
            await self._cdr.append(record)
        for event in events:
            await self._send(event)
        await self._send(CallEnded(record))
        if self.dropped:
            log.warning(
                "call %s: %d notices not reported (the application was too slow)",
                record.call.call_id,
                self.dropped,
            )
        return record


# --- the recording ---


class _Track:
    """One channel: frames placed in 20 ms slots of the call's timeline (the first frame fixes the phase)."""

    def __init__(self, start_ns: int) -> None:
        self._start = start_ns
        self._phase: int | None = None
        self.next_slot = 0  # the first slot not yet placed
        self.written = 0  # slots up to here are written
        self._placed: deque[tuple[int, bytes]] = deque()
        self._narrow = NarrowView()  # the WAV is 8 kHz: a 16 kHz (G.722) leg's frames are brought down to it

    def place(self, at_ns: int, pcm: bytes) -> None:
        rel = at_ns - self._start
        if self._phase is None:
            self._phase = rel % FRAME_NS
        slot = max((rel - self._phase + FRAME_NS // 2) // FRAME_NS, self.next_slot, self.written)
        self._placed.append((slot, pcm))
        self.next_slot = slot + 1

    def take(self, upto: int) -> bytes:
        """PCM for slots [written, upto), silence where nothing was placed."""
        parts: list[bytes] = []
        slot, placed = self.written, self._placed
        while placed and placed[0][0] < upto:
            at, pcm = placed.popleft()
            if at > slot:
                parts.append(SILENCE * (at - slot))
            pcm = self._narrow(pcm)
            parts.append(pcm if len(pcm) == FRAME_BYTES else pcm[:FRAME_BYTES].ljust(FRAME_BYTES, b"\0"))
            slot = at + 1
        if upto > slot:
            parts.append(SILENCE * (upto - slot))
        self.written = max(upto, self.written)
        return b"".join(parts)


class CallRecording:
    """The stereo recording of one call (see the module docstring). Sans-I/O: `take(now)` returns the
    interleaved PCM that is ready; `WavWriter` writes it."""

    def __init__(self, *, consent: bool = False) -> None:
        # awaiting the recording consent (module docstring): nothing is written until `consented`
        self.held = consent
        self._origin = 0  # the session's start
        self._dropped_ns = 0  # awaiting it: caller frames and ledger entries before this were dropped
        self._caller: list[tuple[int, bytes]] = []
        self._sent: deque[OutboundFrame] = deque()
        self._ledger: CarrierLedger | None = None
        self._left: _Track | None = None
        self._right: _Track | None = None
        self._start = 0
        self._ledger_seen = 0
        self.frames_right = 0  # ledger frames matched: written on the right, or let go before a consent
        self.unmatched = 0  # ledger entries whose frame was not seen queued (written as silence)
        self._on = True
        self._tee: Channel | None = None
        self._paused = False  # a gap: nothing is kept (a flag test per caller frame)
        self._holds: dict[str, str] = {}  # "manual" or "card" -> who asked
        self.gaps: list[list[Any]] = []  # [start ns, end ns or None, by]: the latest MAX_GAPS
        self._gap_seen = 0  # gaps before this index ended before the last ledger entry placed

    # --- the session's side (per frame: one append) ---

    def channel(self, leg: Channel, start_ns: int) -> Channel:
        """The channel the session core plays to: the leg, with every queued frame kept for the recording."""
        self._start, self._ledger_seen, self._origin = start_ns, start_ns - 1, start_ns
        self._ledger = leg.ledger
        self._left, self._right = _Track(start_ns), _Track(start_ns)
        self._tee = tee_channel(leg, self._sent)
        return self._tee

    def caller(self, pcm: bytes, now: int) -> None:
        if self._on and not self._paused:
            self._caller.append((now, pcm))

    def pause(self, now: int, by: str, *, card: bool = False) -> bool:
        """A gap begins (or goes on under another hold); False when this hold was already on."""
        key = "card" if card else "manual"
        if key in self._holds:
            return False
        self._holds[key] = by
        if not self._paused:
            self._paused = True
            self.gaps.append([now, None, by])
            if len(self.gaps) > MAX_GAPS and self._gap_seen:
                del self.gaps[0]
                self._gap_seen -= 1
        return True

    def resume(self, now: int, *, card: bool = False) -> bool:
        """This hold ends, and the gap with it unless the other hold is still on; False when it was not on."""
        if self._holds.pop("card" if card else "manual", None) is None:
            return False
        if not self._holds:
            self._paused = False
            self.gaps[-1][1] = now
        return True

    @property
    def paused(self) -> bool:
        return self._paused

    def marks(self) -> list[tuple[int, str]]:
        """Each gap's start and end as (sample offset into the file, label), for the file's cue points."""
        rate = RATE / 1e9
        marks: list[tuple[int, str]] = []
        for start, end, by in self.gaps:
            marks.append((max(0, round((start - self._start) * rate)), f"recording paused ({by})"))
            if end is not None:
                marks.append((max(0, round((end - self._start) * rate)), "recording resumed"))
        return marks

    def _in_gap(self, at: int) -> bool:
        """Whether `at` (a ledger entry's time: they come in order) lies in a gap."""
        gaps, seen = self.gaps, self._gap_seen
        while seen < len(gaps) and gaps[seen][1] is not None and gaps[seen][1] <= at:
            seen += 1
        self._gap_seen = seen
        return seen < len(gaps) and gaps[seen][0] <= at

    def abandon(self) -> None:
        """The file cannot be written: keep nothing more for the rest of the call."""
        self._on = False
        if isinstance(self._tee, TeeChannel):
            self._tee.keep = False
        self._caller.clear()
        self._sent.clear()

    def verdict(self, result: DisclosureResult) -> None:
        """The recording consent's result (the call record's, module docstring): the recording starts where its
        audio ended on the wire, or never."""
        if result.outcome == "delivered" and result.ended_ms is not None:
            self.consented(self._origin + result.ended_ms * NS_PER_MS)
        else:
            self.refused()

    def refused(self) -> None:
        """The consent was not heard whole: nothing of this call is recorded."""
        self.abandon()

    def consented(self, ended_ns: int) -> None:
        """The consent was heard whole, its audio ending on the wire at `ended_ns`: the WAV begins there (or
        where frames were already dropped, if the verdict came later than `HELD_KEEP_MS` after it)."""
        if not self.held or not self._on:
            return
        self.held = False
        start = max(ended_ns, self._dropped_ns, self._origin)
        self._start = start
        self._left, self._right = _Track(start), _Track(start)

    @property
    def start_ms(self) -> int | None:
        """Where the WAV begins on the session timeline; None while nothing may be written."""
        return None if self.held else (self._start - self._origin) // NS_PER_MS

    # --- the writer's side (once a second) ---

    def take(self, now: int, *, final: bool = False) -> bytes:
        left, right, ledger = self._left, self._right, self._ledger
        if left is None or right is None or ledger is None:
            return b""
        caller, self._caller = self._caller, []
        if self.held and not self._on:  # no consent: nothing is kept or written
            return b""
        if self.held:  # awaiting the consent: the latest frames kept in memory, nothing written
            cutoff = self._dropped_ns = max(self._dropped_ns, now - HELD_KEEP_MS * NS_PER_MS)
            self._caller = [frame for frame in caller if frame[0] >= cutoff]
            for entry in ledger.entries_after(self._ledger_seen):
                if entry.transmitted_ns >= cutoff:
                    break
                self._match(entry.item_id, entry.offset_ms, entry.epoch)  # its queued frame is let go
                self._ledger_seen = entry.transmitted_ns
            return b""
        start = self._start
        for at, pcm in caller:
            if at >= start:
                left.place(at, pcm)
        # only the entries new since the last call (the media clock may be recording meanwhile)
        entries = ledger.entries_after(self._ledger_seen)
        for entry in entries:
            pcm = self._match(entry.item_id, entry.offset_ms, entry.epoch)
            if entry.transmitted_ns >= start:
                right.place(
                    entry.transmitted_ns, SILENCE if self.gaps and self._in_gap(entry.transmitted_ns) else pcm
                )
        if entries:
            self._ledger_seen = entries[-1].transmitted_ns
        if final:
            upto = max(left.next_slot, right.next_slot)
        else:
            upto = (now - self._start) // FRAME_NS - MARGIN_FRAMES
        if upto <= left.written:
            return b""
        return interleave(left.take(upto), right.take(upto))

    def _match(self, item_id: str, offset_ms: int, epoch: int) -> bytes:
        """The queued frame a ledger entry names; the frames before it were cleared and never left."""
        sent = self._sent
        while sent:
            frame = sent.popleft()
            if frame.item_id == item_id and frame.offset_ms == offset_ms and frame.epoch == epoch:
                self.frames_right += 1
                return frame.pcm
        self.unmatched += 1
        return SILENCE


def interleave(left: bytes, right: bytes) -> bytes:
    """Two mono PCM16 blocks of one length as one stereo block (left first)."""
    stereo = np.empty((len(left) // 2, 2), dtype="<i2")
    stereo[:, 0] = np.frombuffer(left, dtype="<i2")
    stereo[:, 1] = np.frombuffer(right, dtype="<i2")
    return stereo.tobytes()


class WavWriter:
    """Writes a `CallRecording` to `path` once a second (in a worker thread) until `close()`."""

    def __init__(
        self,
        recording: CallRecording,
        path: Path,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.recording, self.path = recording, path
        self._interval = interval_s
        self._clock = clock
        self._wav: wave.Wave_write | None = None
        self._file: BinaryIO | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.frames_written = 0  # 20 ms stereo frames

    def _open(self) -> None:
        self._file = self.path.open("wb")  # opened here, so a failure leaves no half-made wave writer
        wav = wave.open(self._file, "wb")
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        self._wav = wav

    def _write(self, block: bytes) -> None:
        if self._wav is not None:
            self._wav.writeframes(block)

    def _close(self) -> None:
        if self._wav is not None:
            frames = self.frames_written * FRAME_BYTES // 2  # samples per channel
            self._wav.close()  # writes the header's lengths
            self._wav = None
            if self._file is not None and (marks := self.recording.marks()):
                _append_cues(self._file, [(min(at, frames), label) for at, label in marks])
        if self._file is not None:
            self._file.close()
            self._file = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"record-{self.path.name}")

    async def _flush(self, *, final: bool = False) -> None:
        block = self.recording.take(self._clock(), final=final)
        if block and self._wav is None:  # awaiting the consent, the file was not made yet
            await asyncio.to_thread(self._open)
        if block:
            self.frames_written += len(block) // (2 * FRAME_BYTES)
            await asyncio.to_thread(self._write, block)

    async def _run(self) -> None:
        try:
            if not self.recording.held:
                await asyncio.to_thread(self._open)
            while not self._stop.is_set():
                try:
                    await asyncio.wait_for(self._stop.wait(), self._interval)
                except TimeoutError:
                    await self._flush()
            # the rest of the call, also when close() came while a once-a-second write was in its thread (the
            # loop then ends without another turn: the end of the call would be lost)
            await self._flush(final=True)
        except OSError as exc:
            log.error("recording %s: %s; not recording the rest of this call", self.path, exc)
            self.recording.abandon()
        finally:
            await asyncio.to_thread(self._close)

    async def close(self) -> str | None:
        """The rest of the call written, then the file closed; its path (None when it could not be written)."""
        if self._task is None:
            return None
        self._stop.set()
        await asyncio.gather(self._task, return_exceptions=True)
        return str(self.path) if self.path.exists() else None


def _append_cues(file: BinaryIO, marks: list[tuple[int, str]]) -> None:
    """Cue points (sample offset, label) after the audio: a `cue ` chunk and a `LIST`/`adtl` of `labl` chunks;
    the RIFF size patched to include them."""
    points = b"".join(struct.pack("<II4sIII", i, at, b"data", 0, 0, at) for i, (at, _) in enumerate(marks, 1))
    labels = b""
    for i, (_, label) in enumerate(marks, 1):
        text = label.encode("ascii", "replace") + b"\0"
        labels += b"labl" + struct.pack("<II", 4 + len(text), i) + text + b"\0" * (len(text) % 2)
    cue = b"cue " + struct.pack("<II", 4 + len(points), len(marks)) + points
    chunks = cue + b"LIST" + struct.pack("<I", 4 + len(labels)) + b"adtl" + labels
    file.seek(0, 2)
    size = file.tell() + len(chunks)
    file.write(chunks)
    file.seek(4)
    file.write(struct.pack("<I", size - 8))


def recording_path(directory: str | Path, call_id: str, wall: float | None = None) -> Path:
    """`<dir>/<UTC start>-<call id>.wav`, with a suffix if that name is taken (call ids restart per process)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if wall is None else wall))
    base = Path(directory) / f"{stamp}-{call_id}"
    path, n = base.with_suffix(".wav"), 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}.wav")
    return path


# --- the tee: the leg as the session sees it, with every queued frame kept ---


class TeeChannel:
    """A `Channel` over the leg that keeps a reference to every frame queued for the caller."""

    features: ClassVar[LegFeatures] = LegFeatures()  # what the output path asks of it: the cushion, RTP QoS

    def __init__(self, inner: Channel, sent: deque[OutboundFrame]) -> None:
        self._inner = inner
        self._sent = sent
        self.ledger: CarrierLedger = inner.ledger  # one per leg: read per frame, so not a forwarding property
        self.keep = True  # False once the recording is abandoned

    @property
    def depth(self) -> int:
        return self._inner.depth

    def enqueue(self, frames: list[OutboundFrame]) -> None:
        if self.keep:
            self._sent.extend(frames)
        self._inner.enqueue(frames)

    def clear(self, epoch: int) -> ClearResult:
        return self._inner.clear(epoch)


class _CushionedTee(TeeChannel):
    features = LegFeatures(cushion=True)

    def __init__(self, inner: CushionedChannel, sent: deque[OutboundFrame]) -> None:
        super().__init__(inner, sent)  # type: ignore[arg-type]  # a cushioned leg is a Channel too
        self._cushioned = inner

    @property
    def cushion_frames(self) -> int:
        return self._cushioned.cushion_frames


class _QosTee(TeeChannel):
    features = LegFeatures(qos=True)

    def __init__(self, inner: QosSource, sent: deque[OutboundFrame]) -> None:
        super().__init__(inner, sent)  # type: ignore[arg-type]  # a leg with QoS is a Channel too
        self._qos = inner

    def qos(self) -> QoS | None:
        return self._qos.qos()

    def media_counters(self) -> dict[str, int]:
        return self._qos.media_counters()


def tee_channel(leg: Channel, sent: deque[OutboundFrame]) -> Channel:
    """The tee with the same optional features as the leg declares (a cushion, RTP QoS: bridge/engine/status.py)."""
    if offers_cushion(leg):
        return _CushionedTee(leg, sent)
    if offers_qos(leg):
        return _QosTee(leg, sent)
    return TeeChannel(leg, sent)


# --- what the server wires per call ---


class RecordKeeper:
    """The server's side: the CDR file and the recording directory, shared by every call."""

    def __init__(self, cdr: str | None = None, record_dir: str | None = None) -> None:
        self.cdr = CdrWriter(cdr) if cdr else None
        self.record_dir = record_dir

    def call(
        self,
        identity: CallIdentity,
        route: str | None,
        provider: str,
        deliver: Deliver,
        disclosure: Disclosure | None = None,
        consent: Disclosure | None = None,
    ) -> CallRecords:
        """One call's records (`route`, `provider`, its `disclosure` and recording `consent` as the call's setup
        chose them)."""
        info = CallInfo.of(identity, route=route, provider=provider)
        return CallRecords(self, info, deliver, disclosure, consent)

    async def row(self, row: DialRow) -> None:
        """A CDR row that is no call's record (a refusal, a dial series' end); nothing without `--cdr`."""
        if self.cdr is not None:
            await self.cdr.append(row)


class CallRecords:
    """One call's events, record and recording: `sink` and `tap` go into its `CallSession`; `begin` when the
    session exists, `end` once it has run."""

    def __init__(
        self,
        keeper: RecordKeeper,
        info: CallInfo,
        deliver: Deliver,
        disclosure: Disclosure | None = None,
        consent: Disclosure | None = None,
    ) -> None:
        self._keeper, self.info, self._deliver = keeper, info, deliver
        self._disclosure, self._consent = disclosure, consent
        self.tap = CallRecording(consent=consent is not None) if keeper.record_dir else None
        self._reporter: CallReporter | None = None
        self._wav: WavWriter | None = None
        self._ending = False

    def sink(self, other: Callable[[str, object], None]) -> Callable[[str, object], None]:
        """A notice sink that feeds this call's reporter, then `other`."""

        def both(call_id: str, notice: object) -> None:
            if self._reporter is not None:
                self._reporter.notice(call_id, notice)
            other(call_id, notice)

        return both

    def begin(self, start_ns: int, ledger: CarrierLedger) -> None:
        builder = RecordBuilder(
            self.info,
            ledger=ledger,
            start_ns=start_ns,
            started_at=time.time(),
            disclosure=self._disclosure,
            consent=self._consent,
        )
        self._reporter = CallReporter(
            builder, self._deliver, cdr=self._keeper.cdr, on_consent=self._consented
        )
        self._reporter.start()
        if self.tap is not None and self._keeper.record_dir is not None:
            self._wav = WavWriter(self.tap, recording_path(self._keeper.record_dir, self.info.call_id))
            self._wav.start()

    def _consented(self, result: DisclosureResult) -> None:
        if self.tap is not None:
            self.tap.verdict(result)

    async def end(
        self,
        summary: CallSummary | None,
        status: Mapping[str, Any],
        *,
        answered: bool,
        dial: Mapping[str, Any] | None = None,
    ) -> CallRecord | None:
        """The WAV file closed, the CDR line, `call_ended` with the record to the application; once (a second
        call returns the same record; None before `begin`)."""
        if self._reporter is None or self._reporter.record is not None or self._ending:
            return None if self._reporter is None else self._reporter.record
        self._ending = True
        path = await self._wav.close() if self._wav is not None else None
        outcome = CallOutcome(
            duration_s=summary.duration_s if summary else 0.0,
            ended_by=summary.ended_by if summary else "unknown",
            reason=summary.reason if summary else "the session failed",
            sip_status=200 if answered else 503,
            status=status,
            frames_in=summary.frames_in if summary else 0,
            frames_out=summary.frames_out if summary else 0,
            recording=path,
            dial=dial,
            recording_start_ms=self.tap.start_ms if self.tap is not None and path is not None else None,
        )
        return await self._reporter.finish(outcome)
