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
from bridge import rollover as ro
from bridge.timeline import Timeline
from bridge.vad import VadOptions, VoiceActivityDetector, VoiceStarted, VoiceStopped
from providers.base import Capabilities
from providers.events import (
    AudioReceived,
    InputTranscript,
    InputTranscriptFailed,
    OutputInterrupted,
    OutputTranscript,
    ProviderError,
    ProviderEvent,
    ResponseDone,
    SessionClosed,
    SessionExpiring,
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
    token: int  # the connection that gets it (during a rollover's overlap, each listening connection does)


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
    """The session cannot go on (a fatal protocol error, a failed recovery, the provider's final close, a
    refused rollover). `goodbye`: the caller hears the closing message before the BYE."""

    reason: str
    failed: bool
    goodbye: bool = False


@dataclass(frozen=True, slots=True)
class ApproveRollover:
    """Ask the application's `approve` hook; answer with `rollover_approved` (RO6)."""

    rollover_id: str


@dataclass(frozen=True, slots=True)
class AuthorizeConnection:
    """Ask `connection_hooks.authorize` for connection `connection_id`; answer with `connection_authorized`
    (RO7)."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class OpenRollover:
    """Open the next connection under `token`, seeded with `snapshot` without the recovery notice (RO8)."""

    token: int
    connection_id: str
    snapshot: RecoverySnapshot


@dataclass(frozen=True, slots=True)
class CommitInput:
    """Commit connection `token`'s input buffer (its last utterance is complete; RO2 at the hard stop)."""

    token: int


Command = (
    SendAudio | Truncate | CancelResponse | OpenReplacement | CloseTransport | EndSession | ApproveRollover
    | AuthorizeConnection | OpenRollover | CommitInput | DelegationCommand
)

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
class RolloverChanged:
    """A rollover step: `what` is "opening", "floor", "closed", "refused" (with `detail`)."""

    what: str
    connection_id: str
    detail: str
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
    | RolloverChanged
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
    caption_close_ms: int = 1_000  # GPT-Live: a caller turn's caption fragments are final this long after it
    vad: VadOptions = field(default_factory=VadOptions)
    delegations: DelegationOptions = field(default_factory=DelegationOptions)
    rollover: ro.RolloverOptions | None = None  # None: no rollover (the call ends at the provider's cap)


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
        # Rollover (RO1-RO9): the controller names connections by string id; the coordinator maps them to
        # transport tokens. `_others`: tokens of rollover connections that do not hold the floor.
        self._ids: dict[int, str] = {}
        self._tokens: dict[str, int] = {}
        self._others: set[int] = set()
        self._utterances: dict[int, dict[str | None, list[int]]] = {}  # token -> item -> [start_ms, end_ms]
        self._speaker_busy = False
        # GPT-Live sends caller captions as timed fragments and never a final one: the fragments of one caller
        # turn (by the local detector) are grouped per connection and closed `caption_close_ms` after the turn.
        self._fragments: dict[int, list[tuple[str, int, int]]] = {}
        self._captions_due: int | None = None
        self._goodbye: tuple[int, int] | None = None  # end_call: (asked at, give up at), ns
        self._goodbye_spoken = False
        self._local_turn = [0, 0]  # the caller's last turn by the local detector, session ms (Gemini captions)
        self.rollover: ro.RolloverController | None = None
        self.listener_audio_bytes = 0  # audio from connections not holding the floor, never played
        self._new_rollover(token, now)

    # --- inputs ---

    def caller_frame(self, pcm: bytes, now: int) -> None:
        """One 20 ms caller frame: forwarded to the provider; it also marks a media-clock tick."""
        self.frames_in += 1
        if self.recovery.reconnecting:
            assert self.recovery.active is not None
            self.recovery.active.discarded_frames += 1  # HR8: never replayed faster than real time
        elif not self.ended:
            for target in self._targets:
                self._commands.append(SendAudio(pcm, target))
        transmitted = self.channel.ledger.frames_transmitted
        if transmitted == self._last_transmitted and self.framer.item_id is not None and not self._item_over(now):
            self.underruns += 1  # this tick's pull found the cushion empty mid-item: the caller heard a gap
        self._last_transmitted = transmitted
        if not self.capabilities.server_vad:
            change = self.vad.frame(pcm, now)
            if isinstance(change, VoiceStarted):
                self._barge_in(now, "local_vad")
                self._caller_started(now, None)
                if self.rollover is not None:  # without server VAD, the local detector marks utterances (RO1)
                    self.rollover.speech_started(self._ids[self.token], self.timeline.ms(now), now)
            elif isinstance(change, VoiceStopped):
                self._turn_ended(now)
                self._caller_resumed(now)
                self._expect_answer(now)
                self._captions_due = now + self.options.caption_close_ms * _NS_PER_MS
                if self.rollover is not None:
                    self.rollover.speech_stopped(self._ids[self.token], self.timeline.ms(now), now)
                    self._rollover_actions(now)
        elif self.capabilities.answer_within_ms is not None:
            # Gemini: the local detector watches for a silent provider, marks the caller's turns (its captions
            # carry no times) and ends a barge-in's suppression (Gemini reports no end of speech).
            change = self.vad.frame(pcm, now)
            if isinstance(change, VoiceStarted):
                self._local_turn = [self.timeline.ms(now), self.timeline.ms(now)]
                self._caller_started(now, None)  # (a fresh caller interval after a repair, HR10)
            elif isinstance(change, VoiceStopped):
                self._local_turn[1] = self.timeline.ms(now)
                self._expect_answer(now)
                self._turn_ended(now)
                self._caller_resumed(now)
        self._feed(now)

    def provider_event(self, event: ProviderEvent, now: int) -> None:
        if isinstance(event, UsageUpdated) or isinstance(event, SessionClosed):
            self._usage(event)  # usage of any transport counts, also a quarantined one (HR12)
        if event.token != self.token:
            if event.token in self._others:
                self._other_event(event, now)
            else:
                self.stale_events += 1  # a quarantined or unknown transport: inert (HR2, HR5)
            return
        self._answer_due = None  # the provider is alive
        self._rollover_input(event, now)
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
        elif isinstance(event, InputTranscript) and not event.final and not self.capabilities.server_vad:
            self._fragment(event, now)
        elif isinstance(event, InputTranscript):
            if self.rollover is None:
                at = self.timeline.rebase(self.token, event.start_ms, now)
                self._caller_said(event.text, at, event.final)
            if event.final and event.text.strip():
                self._caller_resumed(now)
        elif isinstance(event, OutputTranscript):
            at = self.timeline.rebase(self.token, event.start_ms, now)
            self._notices.append(Transcript("assistant", event.text, at, event.final, self.caption_epoch))
        elif isinstance(event, SessionStarted):
            self.state = "ready"
            self.timeline.connection_started(self.token, now)
            if self._replacement_ready(event.token, now):
                self._new_rollover(event.token, now)
            if self.rollover is not None:
                self.rollover.connection_confirmed(self._ids[event.token], now)
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
        self._rollover_actions(now)

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

    def rollover_approved(self, rollover_id: str, approved: bool | None, error: str | None, now: int) -> None:
        """The approve hook answered (False, an exception, or too late is a refusal: RO6)."""
        if self.rollover is not None:
            self.rollover.approve_answered(rollover_id, approved, error, now)
            self._rollover_actions(now)

    def connection_authorized(self, connection_id: str, ok: bool, now: int) -> None:
        """`connection_hooks.authorize` answered for a rollover connection (RO7)."""
        if self.rollover is not None:
            self.rollover.authorize_answered(connection_id, ok, now)
            self._rollover_actions(now)

    def rollover_failed(self, token: int, reason: str, now: int) -> None:
        """The next connection could not be opened, or was lost before it took the floor: drop it; the current
        connection keeps the call and a later rollover may be tried (the hard stop still applies)."""
        if token not in self._others:
            return
        cid = self._ids.get(token, "?")
        self._drop_other(token)
        self._notices.append(RolloverChanged("failed", cid, reason, self.timeline.ms(now)))
        if self.rollover is not None:
            current = self._ids[self.token]
            confirmed = self.rollover.confirmed_ns(current)
            self.rollover = None
            self._new_rollover(self.token, now, confirmed_ns=confirmed)

    def end_after_goodbye(self, now: int, timeout_ms: int) -> None:
        """The model asked to end the call (end_call): once its goodbye has been played — or after
        `timeout_ms` if it says nothing — the session ends and the call is hung up."""
        if self._goodbye is None:
            self._goodbye = (now, now + timeout_ms * _NS_PER_MS)
            self._goodbye_spoken = False

    def connection_expires(self, token: int, time_left_ms: int, now: int) -> None:
        """The provider said when connection `token` ends (GPT-Live's and Realtime's `expires_at`): sooner than
        the configured cap, it drives the rollover as Gemini's goAway does."""
        if self.rollover is not None and token in self._ids and self.rollover.options.cap_ms * 9 // 10 > time_left_ms:
            self.rollover.session_expiring(self._ids[token], max(0, time_left_ms), now)
            self._rollover_actions(now)

    def call_ended(self) -> None:
        """The call leg is gone: a connection lost from now on is the session closing, not a fault."""
        self.leg_ended = True

    def replacement_failed(self, token: int, reason: str, now: int) -> None:
        """The shell could not open the replacement: a dead replacement is fatal (HR5)."""
        if self.recovery.active is not None and self.recovery.active.token == token:
            self._fail_recovery(f"the replacement connection failed: {reason}", now)

    def handle_timer(self, now: int) -> None:
        if self._captions_due is not None and now >= self._captions_due:
            self._close_captions(now)
        if self._answer_due is not None and now >= self._answer_due:
            self._answer_due = None
            self._recover("provider_silent", now)  # a half-open socket: nothing arrives, nothing fails
        if self.recovery.expired(now):
            self._fail_recovery(f"output recovery did not complete within {self.recovery.budget_ns // 1_000_000_000} s", now)
            return
        self.delegations.handle_timer(self.token, self.timeline.ms(now))
        if self.rollover is not None:
            self.rollover.handle_timer(now)
            self._rollover_actions(now)
        condition = self.reservoir.check(now)
        if condition is not None:
            self._condition(condition, now)
        self._feed(now)

    def next_deadline(self) -> int | None:
        hold = self.delegations.deadline_ms()
        held_until = None if hold is None else self.timeline.start_ns + hold * _NS_PER_MS
        deadlines = (self._next_tick, self._goodbye[1] if self._goodbye is not None else None, self.reservoir.next_deadline(), self.recovery.deadline(), held_until,
                     self._answer_due, self.rollover.next_deadline() if self.rollover is not None else None,
                     self._captions_due)
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
        if self._goodbye is not None:
            self._goodbye_spoken = True
        if not self._speaker_busy and self.rollover is not None:
            self._speaker_busy = True
            self.rollover.items_pending(self._ids[self.token], now)
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
        self._next_tick = now + TICK_NS if busy or self._goodbye is not None else None
        if self._goodbye is not None and not self.ended:
            quiet = self._last_audio_ns is not None and now - self._last_audio_ns >= self.options.item_quiet_ms * _NS_PER_MS
            played = self._goodbye_spoken and quiet and not busy and self.channel.depth == 0
            if played or now >= self._goodbye[1]:
                self._goodbye = None
                self._end("the model ended the call (end_call)", failed=False)
        if self._speaker_busy and not busy and self.channel.depth == 0 and self.rollover is not None:
            quiet = self._last_audio_ns is None or now - self._last_audio_ns >= self.options.item_quiet_ms * _NS_PER_MS
            if quiet:
                self._speaker_busy = False  # everything the speaker said has been played (RO2, RO8)
                self.rollover.items_finished(self._ids[self.token], now)
                self._rollover_actions(now)

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
        for other in list(self._others):  # a rollover in progress is abandoned; the replacement starts afresh
            self._commands.append(CloseTransport(other))
            self._drop_other(other)
        self.rollover = None
        self._speaker_busy = False
        self._refresh_targets()
        self._commands.append(CloseTransport(old))
        snapshot = RecoverySnapshot(tuple(self._caller_text), self.delegations.snapshot_facts())
        self._commands.append(OpenReplacement(self.token, cause, snapshot))
        at = self.timeline.ms(now)
        self._notices.append(AudioDiscontinuity("output", dropped, cause, at))
        self._notices.append(RecoveryChanged(self.token, cause, Stage.RECONNECTING.value, 0))

    def _replacement_ready(self, token: int, now: int) -> bool:
        recovery = self.recovery.replacement_ready(token, now)
        if recovery is None:
            return False
        elapsed = (now - recovery.started_ns) // _NS_PER_MS
        # HR8: everything the caller said while no connection could hear it, counted once.
        self._notices.append(AudioDiscontinuity("input", recovery.discarded_frames, "voice_transport_recovery",
                                                self.timeline.ms(now)))
        self._notices.append(RecoveryChanged(token, recovery.cause, Stage.AWAITING_USER.value, elapsed))
        return True

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

    def _end(self, reason: str, *, failed: bool, goodbye: bool = False) -> None:
        if not self.ended:
            self.ended = True
            self.state = "failed" if failed else "closing"
            self._commands.append(EndSession(reason, failed, goodbye))

    # --- rollover (RO1-RO9): the glue between the session and bridge/rollover.py ---

    def _new_rollover(self, token: int, now: int, confirmed_ns: int | None = None) -> None:
        """Name connection `token` and, with rollover enabled, start a controller whose current connection it
        is (at the start of the call, and after a recovery replaced the connection)."""
        cid = self._ids.get(token) or f"conn-{token}"
        self._ids[token], self._tokens[cid] = cid, token
        if self.options.rollover is not None:
            self.rollover = ro.RolloverController(cid, self.options.rollover, start_ns=self.timeline.start_ns)
            if confirmed_ns is not None:
                self.rollover.connection_confirmed(cid, confirmed_ns)
        self._refresh_targets()

    def _refresh_targets(self) -> None:
        """The connections that get caller audio: worked out when they change, not on every frame."""
        if self.rollover is None:
            self._targets: tuple[int, ...] = (self.token,)
        else:
            self._targets = tuple(self._tokens[cid] for cid in self.rollover.audio_targets() if cid in self._tokens)

    def _utterance(self, token: int, item: str | None, start_ms: int | None, end_ms: int | None) -> list[int]:
        """The session-time span of an utterance on a connection, from its speech events (RO3 matching), or,
        for a caption that names no utterance and carries no times (Gemini), the local detector's last turn."""
        spans = self._utterances.setdefault(token, {})
        if item is None and start_ms is None and end_ms is None and self.capabilities.answer_within_ms is not None:
            return list(self._local_turn)
        span = spans.setdefault(item, [start_ms or 0, end_ms or start_ms or 0])
        if start_ms is not None and end_ms is None:
            span[:] = [start_ms, start_ms]
        elif end_ms is not None:
            span[1] = end_ms
        if len(spans) > 64:
            del spans[next(iter(spans))]
        return span

    def _rollover_input(self, event: ProviderEvent, now: int) -> None:
        """Feed what the rollover controller watches, from any connection it knows."""
        if self.rollover is None or event.token not in self._ids:
            return
        cid = self._ids[event.token]
        if isinstance(event, SpeechStarted):
            at = self.timeline.rebase(event.token, event.at_ms, now)
            self._utterance(event.token, event.item_id, at, None)
            self._utterance(event.token, None, at, None)
            self.rollover.speech_started(cid, at, now)
        elif isinstance(event, SpeechStopped):
            at = self.timeline.rebase(event.token, event.at_ms, now)
            self._utterance(event.token, event.item_id, None, at)
            self._utterance(event.token, None, None, at)
            self.rollover.speech_stopped(cid, at, now)
        elif isinstance(event, InputTranscript):
            start = self.timeline.rebase(event.token, event.start_ms, now) if event.start_ms is not None else None
            end = self.timeline.rebase(event.token, event.end_ms, now) if event.end_ms is not None else None
            span = self._utterance(event.token, event.item_id, start, end)
            self.rollover.transcript(cid, span[0], span[1], event.text, event.final, now)
        elif isinstance(event, InputTranscriptFailed):
            span = self._utterance(event.token, event.item_id, None, None)
            self.rollover.transcript_failed(cid, span[0], span[1], now)
        elif isinstance(event, SessionExpiring):
            self.rollover.session_expiring(cid, event.time_left_ms, now)
        elif isinstance(event, SessionStarted) and event.token != self.token:
            self.timeline.connection_started(event.token, now)
            self.rollover.connection_confirmed(cid, now)

    def _fragment(self, event: InputTranscript, now: int) -> None:
        """A timed caption fragment (GPT-Live): kept until the caller's turn is over."""
        start = self.timeline.rebase(event.token, event.start_ms, now)
        end = self.timeline.rebase(event.token, event.end_ms, now) if event.end_ms is not None else start
        self._fragments.setdefault(event.token, []).append((event.text, start, end))
        if self._captions_due is None and not self.vad.speaking:
            self._captions_due = now + self.options.caption_close_ms * _NS_PER_MS  # a late fragment

    def _close_captions(self, now: int) -> None:
        """Each connection's fragments of the last caller turn become one final caption (one utterance)."""
        self._captions_due = None
        fragments, self._fragments = self._fragments, {}
        for token, parts in fragments.items():
            text = "".join(part for part, _, _ in parts).strip()
            start, end = min(p[1] for p in parts), max(p[2] for p in parts)
            if self.rollover is not None and token in self._ids:
                cid = self._ids[token]
                self.rollover.transcript(cid, start, end, text, True, now)
            elif self.rollover is None and token == self.token:
                self._caller_said(text, start, True)
            if token == self.token and text:
                self._caller_resumed(now)
        self._rollover_actions(now)

    def _other_event(self, event: ProviderEvent, now: int) -> None:
        """An event from a rollover connection that does not hold the floor: it listens (RO2-RO4) but never
        speaks or acts (RO8): its audio is dropped and counted, its tool calls are not dispatched."""
        if isinstance(event, AudioReceived):
            self.listener_audio_bytes += len(event.audio)
        elif isinstance(event, SessionClosed):
            if not event.finalized and self.rollover is not None and event.token in self._others:
                self.rollover_failed(event.token, f"connection lost ({event.reason})", now)
            return
        if isinstance(event, InputTranscript) and not event.final and not self.capabilities.server_vad:
            self._fragment(event, now)
            return
        self._rollover_input(event, now)
        self._rollover_actions(now)

    def _drop_other(self, token: int) -> None:
        self._others.discard(token)
        cid = self._ids.pop(token, None)
        if cid is not None:
            self._tokens.pop(cid, None)
        self._utterances.pop(token, None)

    def _rollover_actions(self, now: int) -> None:
        if self.rollover is None:
            return
        at = self.timeline.ms(now)
        actions = self.rollover.actions()
        if actions:
            self._refresh_targets()  # (a rollover changes which connections hear the caller only by an action)
        for action in actions:
            if isinstance(action, ro.RequestApproval):
                self._commands.append(ApproveRollover(action.rollover_id))
            elif isinstance(action, ro.Authorize):
                self._commands.append(AuthorizeConnection(action.connection_id))
            elif isinstance(action, ro.OpenConnection):
                self._highest_token += 1
                token = self._highest_token
                self._ids[token], self._tokens[action.connection_id] = action.connection_id, token
                self._others.add(token)
                snapshot = RecoverySnapshot(tuple(self._caller_text), self.delegations.snapshot_facts())
                self._commands.append(OpenRollover(token, action.connection_id, snapshot))
                self._notices.append(RolloverChanged("opening", action.connection_id, f"token {token}", at))
            elif isinstance(action, ro.Commit) and action.connection_id in self._tokens:
                self._commands.append(CommitInput(self._tokens[action.connection_id]))
            elif isinstance(action, ro.TakeFloor) and action.connection_id in self._tokens:
                new = self._tokens[action.connection_id]
                if new != self.token:
                    self._others.add(self.token)  # the old one may still finish a transcript (RO3)
                    self._others.discard(new)
                    self.token = new
                    self._speaker_busy = False
                    self.caption_epoch += 1
                    self._notices.append(RolloverChanged("floor", action.connection_id, f"token {new}", at))
            elif isinstance(action, ro.CloseConnection) and action.connection_id in self._tokens:
                token = self._tokens[action.connection_id]
                if token != self.token:
                    self._commands.append(CloseTransport(token))
                    self._drop_other(token)
                self._notices.append(RolloverChanged("closed", action.connection_id, action.reason, at))
            elif isinstance(action, ro.EmitUtterance):
                self._caller_said(action.text, action.start_ms, True)
            elif isinstance(action, ro.EmitInterim):
                self._caller_said(action.text, action.start_ms, False)
            elif isinstance(action, ro.EndSession):
                self._notices.append(RolloverChanged("refused", self._ids.get(self.token, "?"), action.reason, at))
                self._end(f"rollover not possible: {action.reason}", failed=False, goodbye=True)

    def _caller_said(self, text: str, at_ms: int, final: bool) -> None:
        """A caller transcript for the application: emitted once, whichever connection heard it (RO3)."""
        self._notices.append(Transcript("caller", text, at_ms, final, self.caption_epoch))
        if final and text.strip():
            self._caller_text.append(text.strip()[:500])

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
            "rollover": self.rollover.status() if self.rollover is not None else None,
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
                "listener_audio_bytes": self.listener_audio_bytes,
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
