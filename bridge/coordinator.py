"""The session coordinator: one call's rules, as a sans-I/O core.

Inputs (each with `now`, monotonic ns): caller frames from the call leg, provider events, the timer.
Outputs: commands for the provider (pulled with `commands()`), frames pushed into the carrier channel (the
leg's playout, a plain data structure), facts for the log (pulled with `notices()`), and `status()`.

What it enforces:
- The generation reservoir (bridge/reservoir.py) holds received, unplayed audio within the session's limits;
  overflow and staleness are detected, counted and surfaced (SE2).
- The carrier's playback cushion is the pacer's lead: at most `lead_frames` frames wait in the playout; the
  reservoir tops it up on every media tick (each inbound caller frame marks one) and on a 20 ms timer, so the
  first frame plays as soon as it arrives (SE3).
- Barge-in (SE5): the caller starting to speak — the provider's speech-started or interrupted event, or the
  local voice-activity detector for providers without one — suppresses assistant output, clears it through
  the playback barrier (SE4), and tells the provider what the caller heard, read from the carrier ledger
  (Realtime: `truncate(item, audio_end_ms)`). Suppression ends when the caller's turn ends.
- Everything is stamped on the session's logical timeline (SE6); events from another transport token are
  inert (DESIGN principle 3).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bridge.barrier import Channel, PlaybackBarrier
from bridge.cushion import CARRIER_LEAD_FRAMES
from bridge.delegations import DelegationCommand, DelegationNotice, DelegationOptions, Delegations
from bridge.framing import CarrierConverter, ItemFramer
from bridge.recovery import OutputRecovery, RecoverySnapshot, Stage
from bridge.reservoir import GenerationReservoir, MediaCondition, OutputOverflow, OutputStale
from bridge.timeline import Timeline
from bridge.vad import VadOptions, VoiceActivityDetector, VoiceStarted, VoiceStopped
from providers.base import Capabilities
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputInterrupted,
    OutputTranscript,
    ProviderError,
    ProviderEvent,
    ResponseDone,
    SessionClosed,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallCancelled,
    ToolCallRequested,
    UsageUpdated,
)
from providers.limits import AudioLimits
from rtp.audio import FRAME_MS, AudioFormat

_NS_PER_MS = 1_000_000
TICK_NS = FRAME_MS * _NS_PER_MS

# --- commands for the provider (imperatives) ---


@dataclass(frozen=True, slots=True)
class SendAudio:
    pcm16_8k: bytes


@dataclass(frozen=True, slots=True)
class Truncate:
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class CancelResponse:
    pass


@dataclass(frozen=True, slots=True)
class OpenReplacement:
    """Open the one replacement connection (HR5), seeded with `snapshot` (HR7), under `token`."""

    token: int
    cause: str
    snapshot: RecoverySnapshot


@dataclass(frozen=True, slots=True)
class CloseTransport:
    """Close a quarantined connection: nothing it sends can reach the caller any more (HR2)."""

    token: int


@dataclass(frozen=True, slots=True)
class EndSession:
    """The session cannot go on (a fatal protocol error, a failed recovery, the provider's final close)."""

    reason: str
    failed: bool


Command = SendAudio | Truncate | CancelResponse | OpenReplacement | CloseTransport | EndSession | DelegationCommand

# --- notices for the log and the metrics (facts) ---


@dataclass(frozen=True, slots=True)
class ConditionDetected:
    condition: MediaCondition
    at_ms: int


@dataclass(frozen=True, slots=True)
class BargedIn:
    """The caller interrupted: `source` is "provider" or "local_vad"; `cleared_ms` of unplayed output dropped;
    `heard` lists each interrupted item with the ms of it transmitted, from the carrier ledger."""

    at_ms: int
    source: str
    cleared_ms: int
    heard: tuple[tuple[str, int], ...]
    last_frame_ms: float | None = None  # when the last assistant frame left, relative to the event


@dataclass(frozen=True, slots=True)
class TurnEnded:
    at_ms: int


@dataclass(frozen=True, slots=True)
class Transcript:
    role: str  # "caller" or "assistant"
    text: str
    at_ms: int
    final: bool
    caption_epoch: int = 0  # a recovery starts a fresh grouping epoch: old fragments never merge into new (HR11)


@dataclass(frozen=True, slots=True)
class AudioDiscontinuity:
    """Audio that will never be heard: `direction` "output" (provider audio dropped) or "input" (caller
    frames discarded while no connection could take them)."""

    direction: str
    amount: int  # bytes of the received format (output) or 20 ms caller frames (input)
    cause: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class RecoveryChanged:
    """`output_recovery` moved: `stage` is "reconnecting", "awaiting_user", "done", "interrupted" (the replacement failed in turn) or
    "failed"."""

    token: int
    cause: str
    stage: str
    elapsed_ms: int


Notice = (
    ConditionDetected
    | BargedIn
    | TurnEnded
    | Transcript
    | ProviderError
    | AudioDiscontinuity
    | RecoveryChanged
    | DelegationNotice
)


@dataclass(slots=True)
class Usage:
    audio_seconds: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    complete: bool = False  # the provider confirmed final usage for every transport


@dataclass(frozen=True, slots=True)
class CoordinatorOptions:
    lead_frames: int = CARRIER_LEAD_FRAMES  # the carrier cushion: frames waiting in the playout at most
    item_quiet_ms: int = 300  # GPT-Live names no items: a pause this long ends one
    vad: VadOptions = field(default_factory=VadOptions)
    delegations: DelegationOptions = field(default_factory=DelegationOptions)


class SessionCoordinator:
    """One call's session rules. The shell feeds it and carries out what it pulls."""

    def __init__(
        self,
        *,
        limits: AudioLimits,
        output_format: AudioFormat,
        capabilities: Capabilities,
        channel: Channel,
        now: int,
        token: int = 1,
        options: CoordinatorOptions | None = None,
    ) -> None:
        self.options = options or CoordinatorOptions()
        self.capabilities = capabilities
        self.timeline = Timeline(now)
        self.reservoir = GenerationReservoir(limits, output_format)
        self.converter = CarrierConverter(output_format)
        self.framer = ItemFramer()
        self.barrier = PlaybackBarrier(channel)
        self.channel = channel
        self.vad = VoiceActivityDetector(self.options.vad)
        self.token = token
        self.state = "connecting"
        self.suppressed = False
        self.usage = Usage()
        self._commands: list[Command] = []
        self._notices: list[Notice] = []
        self._ready_frames: list = []  # framed output waiting for room in the cushion
        self._next_tick: int | None = None
        self._items = 0
        self._item_id: str | None = None  # the item audio is arriving for now
        self._last_audio_ns: int | None = None
        self.frames_in = 0
        self.recovery = OutputRecovery()
        self.delegations = Delegations(self.options.delegations)
        self._highest_token = token
        self._caller_text: deque[str] = deque(maxlen=5)  # recent final caller transcripts, for a re-seed
        self._audio_by_token: dict[int, float] = {}  # latest cumulative audio seconds of each transport (HR12)
        self._unfinalized = False  # some transport ended without the provider finalising its usage
        self.caption_epoch = 0
        self.ended = False
        self.leg_ended = False
        self.stale_events = 0  # events from another transport token, ignored
        self.suppressed_bytes = 0  # output dropped while the caller spoke
        self.barge_ins = 0
        self.underruns = 0  # media ticks that found no frame ready in the middle of an item
        self._last_transmitted = 0
        self._answer_due: int | None = None  # the silent-provider watchdog's deadline (half-open detection)

    # --- inputs ---

    def caller_frame(self, pcm: bytes, now: int) -> None:
        """One 20 ms caller frame: forwarded to the provider; it also marks a media-clock tick."""
        self.frames_in += 1
        if self.recovery.reconnecting:
            assert self.recovery.active is not None
            self.recovery.active.discarded_frames += 1  # HR8: never replayed faster than real time
        elif not self.ended:
            self._commands.append(SendAudio(pcm))
        transmitted = self.channel.ledger.frames_transmitted
        if transmitted == self._last_transmitted and self.framer.item_id is not None and not self._item_over(now):
            self.underruns += 1  # this tick's pull found the cushion empty mid-item: the caller heard a gap
        self._last_transmitted = transmitted
        if not self.capabilities.server_vad:
            change = self.vad.frame(pcm, now)
            if isinstance(change, VoiceStarted):
                self._barge_in(now, "local_vad")
                self._caller_started(now, None)
            elif isinstance(change, VoiceStopped):
                self._turn_ended(now)
                self._caller_resumed(now)
                self._expect_answer(now)
        elif self.capabilities.answer_within_ms is not None:
            if isinstance(self.vad.frame(pcm, now), VoiceStopped):  # the local detector only watches here
                self._expect_answer(now)
        self._feed(now)

    def provider_event(self, event: ProviderEvent, now: int) -> None:
        if isinstance(event, UsageUpdated) or isinstance(event, SessionClosed):
            self._usage(event)  # usage of any transport counts, also a quarantined one (HR12)
        if event.token != self.token:
            self.stale_events += 1  # a quarantined or unknown transport: inert (HR2, HR5)
            return
        self._answer_due = None  # the provider is alive
        if isinstance(event, AudioReceived):
            if not self.recovery.reconnecting:
                self._audio(event, now)
        elif isinstance(event, (SpeechStarted, OutputInterrupted)):
            if not self.suppressed or isinstance(event, OutputInterrupted):
                self._barge_in(now, "provider")
            if isinstance(event, SpeechStarted):
                self._caller_started(now, event.at_ms)
        elif isinstance(event, SpeechStopped):
            self._turn_ended(now)
            self._caller_resumed(now)
        elif isinstance(event, InputTranscript):
            at = self.timeline.rebase(self.token, event.start_ms, now)
            self._notices.append(Transcript("caller", event.text, at, event.final, self.caption_epoch))
            if event.final and event.text.strip():
                self._caller_text.append(event.text.strip()[:500])
                self._caller_resumed(now)
        elif isinstance(event, OutputTranscript):
            at = self.timeline.rebase(self.token, event.start_ms, now)
            self._notices.append(Transcript("assistant", event.text, at, event.final, self.caption_epoch))
        elif isinstance(event, SessionStarted):
            self.state = "ready"
            self.timeline.connection_started(self.token, now)
            self._replacement_ready(event.token, now)
        elif isinstance(event, SessionClosed):
            if event.finalized:
                self._end(f"provider session closed: {event.reason}", failed=False)
            else:
                self._recover("transport_lost", now)
        elif isinstance(event, ProviderError):
            self._notices.append(event)
            if event.fatal:  # HR1: invalid audio is a protocol error, not a media condition
                self._end(f"protocol error {event.code}: {event.message}", failed=True)
        elif isinstance(event, ToolCallRequested):
            at = self.timeline.rebase(self.token, event.at_ms, now)  # HR11
            self.delegations.call_requested(self.token, event.call_id, event.name, event.arguments, event.kind, at)
        elif isinstance(event, ToolCallCancelled):
            self.delegations.call_cancelled(event.call_ids, self.timeline.ms(now))
        elif isinstance(event, ResponseDone):
            self.delegations.response_ended(self.token, self.timeline.ms(now))

    def job_answered(self, job_id: str, output: str, now: int) -> bool:
        """The application answered a dispatched job; False when the job no longer takes an answer."""
        return self.delegations.job_answered(job_id, output, self.token, self.timeline.ms(now))

    def push_update(self, text: str, *, speak: bool, now: int) -> bool:
        """An application update for the conversation (spoken, or silent context); held during a recovery
        until the caller has spoken (HR9). False when over the limit on command records (DL2)."""
        return self.delegations.push_update(text, speak, self.token)

    def push_fact(self, text: str) -> None:
        """A task fact or verified result, kept (bounded) for the seed of any replacement connection (HR7)."""
        self.delegations.push_fact(text)

    def play_final_message(self, pcm16_8k: bytes) -> int:
        """Clear all output and queue a closing message for the caller; returns its length in ms."""
        self._clear()
        self.framer.start("final-message", self.barrier.epoch)
        frames = self.framer.add(pcm16_8k) + self.framer.finish()
        self.channel.enqueue(frames)
        return len(frames) * FRAME_MS

    def call_ended(self) -> None:
        """The call leg is gone: a connection lost from now on is the session closing, not a fault."""
        self.leg_ended = True

    def replacement_failed(self, token: int, reason: str, now: int) -> None:
        """The shell could not open the replacement: a dead replacement is fatal (HR5)."""
        if self.recovery.active is not None and self.recovery.active.token == token:
            self._fail_recovery(f"the replacement connection failed: {reason}", now)

    def handle_timer(self, now: int) -> None:
        if self._answer_due is not None and now >= self._answer_due:
            self._answer_due = None
            self._recover("provider_silent", now)  # a half-open socket: nothing arrives, nothing fails
        if self.recovery.expired(now):
            self._fail_recovery(f"output recovery did not complete within {self.recovery.budget_ns // 1_000_000_000} s", now)
            return
        self.delegations.handle_timer(self.token, self.timeline.ms(now))
        condition = self.reservoir.check(now)
        if condition is not None:
            self._condition(condition, now)
        self._feed(now)

    def next_deadline(self) -> int | None:
        hold = self.delegations.deadline_ms()
        held_until = None if hold is None else self.timeline.start_ns + hold * _NS_PER_MS
        deadlines = (self._next_tick, self.reservoir.next_deadline(), self.recovery.deadline(), held_until,
                     self._answer_due)
        candidates = [t for t in deadlines if t is not None]
        return min(candidates) if candidates else None

    # --- outputs ---

    def commands(self) -> list[Command]:
        commands: list[Command] = [*self._commands, *self.delegations.commands()]
        self._commands = []
        return commands

    def notices(self) -> list[Notice]:
        notices: list[Notice] = [*self._notices, *self.delegations.notices()]
        self._notices = []
        return notices

    # --- rules ---

    def _audio(self, event: AudioReceived, now: int) -> None:
        if self.suppressed:
            self.suppressed_bytes += len(event.audio)  # the caller is speaking: this output is interrupted
            return
        item = event.item_id
        if item is None:  # GPT-Live: a pause ends an item
            quiet = self.options.item_quiet_ms * _NS_PER_MS
            if self._item_id is None or (self._last_audio_ns is not None and now - self._last_audio_ns >= quiet):
                self._items += 1
                self._item_id = f"out-{self._items}"
                self.delegations.taken_in(self.token, self.timeline.ms(now))  # GPT-Live: a new item answers
            item = self._item_id
        else:
            self._item_id = item
        self._last_audio_ns = now
        overflow = self.reservoir.push(event.audio, now, item)
        if isinstance(overflow, OutputOverflow):
            self._condition(overflow, now)
            return
        self._feed(now)

    def _feed(self, now: int) -> None:
        """Top the carrier cushion up to `lead_frames` from the reservoir."""
        room = self.options.lead_frames - self.channel.depth
        while room > len(self._ready_frames):
            data, item = self.reservoir.pull(self.converter.frame_bytes)
            if not data:
                if self._item_over(now):
                    self._ready_frames += self.framer.finish() + self._flush_converter()
                break
            if item != self.framer.item_id:
                self._ready_frames += self._flush_converter() + self.framer.finish()
                self.framer.start(item or "out", self.barrier.epoch)
            self._ready_frames += self.framer.add(self.converter.convert(data))
        if room > 0 and self._ready_frames:
            batch, self._ready_frames = self._ready_frames[:room], self._ready_frames[room:]
            self.channel.enqueue(batch)
        busy = self.reservoir.depth_bytes or self._ready_frames or self.framer.pending_bytes
        self._next_tick = now + TICK_NS if busy else None

    def _item_over(self, now: int) -> bool:
        if self.framer.item_id is None:
            return False
        quiet = self.options.item_quiet_ms * _NS_PER_MS
        return self._last_audio_ns is None or now - self._last_audio_ns >= quiet

    def _flush_converter(self) -> list:
        tail = self.converter.end_item()
        return self.framer.add(tail) if tail and self.framer.item_id is not None else []

    def _barge_in(self, now: int, source: str) -> None:
        self.suppressed = True
        self.barge_ins += 1
        old_epoch = self.barrier.epoch
        cleared_ms, items = self._clear()
        ledger = self.channel.ledger
        last = ledger.last()  # after the clear nothing of the old epoch can leave: this is the last one
        last_frame_ms = (last.transmitted_ns - now) / _NS_PER_MS if last is not None and last.epoch == old_epoch else None
        heard = [(item, ledger.transmitted_ms(item)) for item in items]
        if self.capabilities.truncate:
            # What the caller heard of each interrupted item, from the ledger; never from elapsed time.
            self._commands.extend(Truncate(item, ms) for item, ms in heard)
        self._notices.append(BargedIn(self.timeline.ms(now), source, cleared_ms, tuple(heard), last_frame_ms))

    def _clear(self) -> tuple[int, list[str]]:
        """Drop all unplayed output through the barrier; returns the ms dropped and the items it belonged to."""
        items: dict[str, None] = {}
        for frame in self._ready_frames:
            items[frame.item_id] = None
        if self.framer.item_id is not None:
            items[self.framer.item_id] = None
        for item in self.reservoir.item_ids():
            if item is not None:
                items[item] = None
        dropped_bytes = self.reservoir.clear()
        dropped_ms = int(self.reservoir.format.duration_ms(dropped_bytes))
        pending = len(self._ready_frames) * FRAME_MS + (FRAME_MS if self.framer.pending_bytes else 0)
        self._ready_frames = []
        self.framer.discard()
        self.converter.reset()
        self._item_id = None
        result = self.barrier.clear()
        for item in result.transmitted_ms:
            items[item] = None
        return dropped_ms + pending + result.dropped_ms, list(items)

    # --- recovery (HR1-HR13) ---

    def _condition(self, condition: MediaCondition, now: int) -> None:
        """HR1: overflow and staleness are recoverable media conditions."""
        self._notices.append(ConditionDetected(condition, self.timeline.ms(now)))
        self._recover("output_overflow" if isinstance(condition, OutputOverflow) else "output_stale", now)

    def _recover(self, cause: str, now: int) -> None:
        if self.ended or self.leg_ended:
            return
        if self.recovery.reconnecting:
            self.recovery.begin(cause, self.token, now, self.timeline.ms(now), 0)  # counted, still one worker
            return
        if self.recovery.active is not None:  # the replacement itself failed before the caller spoke again
            interrupted = self.recovery.active
            elapsed = (now - interrupted.started_ns) // _NS_PER_MS
            self._notices.append(RecoveryChanged(interrupted.token, interrupted.cause, "interrupted", elapsed))
        old = self.token
        self._answer_due = None
        # HR2/HR3: quarantine the old transport and clear everything unplayed through the barrier. The
        # suppression state is left as it is: a caller who is speaking stays suppressed.
        dropped = self.reservoir.depth_bytes + self.framer.pending_bytes
        self._clear()
        self._highest_token += 1
        self.token = self._highest_token
        recovery = self.recovery.begin(cause, self.token, now, self.timeline.ms(now), dropped)
        assert recovery is not None
        self.caption_epoch += 1  # HR11
        self.delegations.recovery_started(old, self.timeline.ms(now))  # HR6, HR9, HR10
        self._commands.append(CloseTransport(old))
        snapshot = RecoverySnapshot(tuple(self._caller_text), self.delegations.snapshot_facts())
        self._commands.append(OpenReplacement(self.token, cause, snapshot))
        at = self.timeline.ms(now)
        self._notices.append(AudioDiscontinuity("output", dropped, cause, at))
        self._notices.append(RecoveryChanged(self.token, cause, Stage.RECONNECTING.value, 0))

    def _replacement_ready(self, token: int, now: int) -> None:
        recovery = self.recovery.replacement_ready(token, now)
        if recovery is None:
            return
        elapsed = (now - recovery.started_ns) // _NS_PER_MS
        # HR8: everything the caller said while no connection could hear it, counted once.
        self._notices.append(AudioDiscontinuity("input", recovery.discarded_frames, "voice_transport_recovery",
                                                self.timeline.ms(now)))
        self._notices.append(RecoveryChanged(token, recovery.cause, Stage.AWAITING_USER.value, elapsed))

    def _expect_answer(self, now: int) -> None:
        """The caller stopped speaking: a provider that cannot be trusted to answer pings must show life
        within `answer_within_ms`, or its connection is presumed half-open and replaced."""
        limit = self.capabilities.answer_within_ms
        if limit is not None and self._answer_due is None and not self.recovery.reconnecting and not self.ended:
            self._answer_due = now + limit * _NS_PER_MS  # (a later turn never postpones an armed watchdog)

    def _caller_started(self, now: int, provider_ms: int | None) -> None:
        """The caller began to speak: after a repair, this opens the first fresh caller interval (HR10)."""
        if not self.recovery.reconnecting:
            self.recovery.caller_started()
            self.delegations.caller_started(self.token, self.timeline.rebase(self.token, provider_ms, now))

    def _caller_resumed(self, now: int) -> None:
        self.delegations.caller_turn_ended(self.timeline.ms(now))
        recovery = self.recovery.caller_spoke(now)
        if recovery is not None:
            elapsed = (now - recovery.started_ns) // _NS_PER_MS
            self._notices.append(RecoveryChanged(recovery.token, recovery.cause, "done", elapsed))

    def _fail_recovery(self, reason: str, now: int) -> None:
        recovery = self.recovery.fail()
        self.delegations.recovery_failed()
        if recovery is not None:
            elapsed = (now - recovery.started_ns) // _NS_PER_MS
            self._notices.append(RecoveryChanged(recovery.token, recovery.cause, "failed", elapsed))
        self._end(reason, failed=True)

    def _end(self, reason: str, *, failed: bool) -> None:
        if not self.ended:
            self.ended = True
            self.state = "failed" if failed else "closing"
            self._commands.append(EndSession(reason, failed))

    def _turn_ended(self, now: int) -> None:
        if self.suppressed:
            self.suppressed = False
            self._notices.append(TurnEnded(self.timeline.ms(now)))

    def _usage(self, event: UsageUpdated | SessionClosed) -> None:
        """Observed totals: each transport's latest audio seconds, added up across transports (HR12)."""
        if isinstance(event, SessionClosed):
            if event.audio_seconds is not None:
                self._audio_by_token[event.token] = event.audio_seconds
            if not event.finalized:
                self._unfinalized = True
            self.usage.complete = event.finalized and not self._unfinalized
        else:
            if event.audio_seconds is not None:
                previous = self._audio_by_token.get(event.token, 0.0)
                self._audio_by_token[event.token] = event.audio_seconds if event.cumulative else previous + event.audio_seconds
            if event.cumulative:
                self.usage.input_tokens = event.input_tokens or self.usage.input_tokens
                self.usage.output_tokens = event.output_tokens or self.usage.output_tokens
            else:
                self.usage.input_tokens += event.input_tokens or 0
                self.usage.output_tokens += event.output_tokens or 0
        if self._audio_by_token:
            self.usage.audio_seconds = sum(self._audio_by_token.values())

    # --- status ---

    def status(self, now: int) -> dict[str, Any]:
        """The session's state for `status()` and `GET /calls/{id}` (SE7)."""
        ledger = self.channel.ledger
        age = self.reservoir.oldest_age_ms(now)
        return {
            "state": self.state,
            "session_ms": self.timeline.ms(now),
            "transport_token": self.token,
            "output_recovery": self.recovery.status(),
            "rollover": None,
            "limits": {
                "capacity_bytes": self.reservoir.limits.capacity_bytes,
                "residence_ms": self.reservoir.limits.residence_ms,
                "format": str(self.reservoir.format),
            },
            "reservoir": {
                "depth_bytes": self.reservoir.depth_bytes,
                "depth_ms": round(self.reservoir.depth_ms),
                "oldest_age_ms": age,
                "overflows": self.reservoir.overflows,
                "stales": self.reservoir.stales,
                "dropped_bytes": self.reservoir.dropped_bytes,
            },
            "playback": {
                "epoch": self.barrier.epoch,
                "settled": self.barrier.settled,
                "cushion_frames": self.channel.depth,
                "suppressed": self.suppressed,
                "barge_ins": self.barge_ins,
                "frames_transmitted": ledger.frames_transmitted,
            },
            "qos": {
                "frames_in": self.frames_in,
                "underruns": self.underruns,
                "suppressed_bytes": self.suppressed_bytes,
                "stale_events": self.stale_events,
            },
            "recoveries": {
                "by_cause": dict(self.recovery.stats.by_cause),
                "completed": self.recovery.stats.completed,
                "failed": self.recovery.stats.failed,
                "ignored": self.recovery.stats.ignored,
                "interrupted": self.recovery.stats.interrupted,
                "durations_ms": list(self.recovery.stats.durations_ms[-20:]),
                "dropped_bytes": self.recovery.stats.dropped_bytes,
                "discarded_frames": self.recovery.stats.discarded_frames,
            },
            "delegations": self.delegations.status(),
            "usage": {
                "audio_seconds": self.usage.audio_seconds,
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
                "complete": self.usage.complete,
            },
        }
