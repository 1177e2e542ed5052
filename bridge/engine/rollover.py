"""Rollover (seed 001, DESIGN §7 RO1–RO9): move a call to a fresh provider connection before the cap.

A provider ends each connection after a fixed time (OpenAI Realtime 60 min, xAI configurable, Gemini announces
it with `goAway`), but a phone call may last hours. Ahead of the cap the session asks the application
(`approve`) and the host's funding (`authorize`, keyed by the connection id) for the next connection, opens it
seeded with context, lets both connections hear the caller for a moment, and hands the floor over once the old
one has said everything it holds. Exactly one connection speaks at a time; each caller utterance reaches the
application once, however many connections transcribed it.

This is the pure core (aioquic shape): every input carries `now` (monotonic ns), outputs are frozen actions
pulled with `actions()`, and time moves only through `next_deadline()` / `handle_timer(now)`. The session shell
performs the actions. Peer input never raises: events from unknown or closed connections are counted, and
duplicates are harmless.

Choices where the rules are silent:
- Approval and authorisation are asked as soon as a connection is older than `after_ms`, so that the next
  connection can open right at the caller's end of speech. An end of speech seen while they were pending is
  remembered: the connection opens once authorised if the caller is still between utterances.
- With client commits the next connection is opened (passively: no caller audio) as soon as it is authorised;
  the switch (old StopInput + new StartInput, in one batch) happens at the first flush after `after_ms` once
  it is confirmed, or with a Commit at `deadline_ms`.
- A connection is busy (holds items) from its end of speech, a flush, a Commit or `items_pending` until
  `items_finished`. The old connection keeps the floor after it stopped input until it is idle, at most
  `drain_ms`; it closes at the latest halfway between its hard stop and its cap.
- Where the provider ends each response with ResponseDone (`Capabilities.response_events`), the old
  connection gives up the floor once its audio is played, but is closed only once its response has ended (at
  most `drain_ms` after it stopped hearing the caller): Realtime sends a function call after the audio of the
  same response, and closed at the floor's move the old connection could no longer ask for what the caller
  requested, while the next one's call for it is an echo of a shared request (S2) — the request was lost.
- RO3 "never arrives": the new connection's final text for a shared utterance waits for the old one's at most
  `transcript_wait_ms`, and never past the old connection's close. Utterances match when their spans overlap
  within `match_slack_ms`: a connection opened mid-utterance hears only its end, and one committed at the hard
  stop in mid-utterance (RO2) transcribes only its beginning. Matching is one-to-one (S1): a connection's text
  joins the utterance that connection already reported overlapping it (a retry, a duplicate delivery), else the
  nearest utterance only the other connection reported (the largest overlap first); two utterances closer than
  the slack stay two, so the second is never dropped as a duplicate of the first. The old connection's
  utterances over before the new one started hearing the caller are its alone, matched to nothing.
- RO3 against S1, a caller talking through the hard stop: the old connection's text (committed there, RO2) is
  of the utterance's start, the new one's of everything it heard, from its opening to the end. The seed emits
  the old one's once; the new one's words after the old one's end are then in no text (Realtime gives no
  word times to cut it by), and emitting both repeats the overlap. The stretch only the dropped text covered
  is reported as an input `audio_discontinuity`, cause `rollover_untold`, where longer than `match_slack_ms`
  (RO3's own tolerance for two connections' times of the same words). GPT-Live's timed captions are cut at
  the instant the old connection stopped hearing (bridge/engine/timeline.py `Captions`): the new one's words after it
  are its own text, told.
- A final text (or its failure) of the utterance under way on a connection whose speech stop never came (lost
  to a corrupted frame, with the commit) means the provider committed it: the utterance is over. Its span
  ends when that text arrives (a little after the words: RO3 matches within the slack and the largest
  overlap first), and it is that connection's end of speech, so no RO2 commit of the silence after it is
  sent at the hard stop. Left open, its span was [start, start]: it matched no text of the next connection,
  and both were emitted. Only where the provider reports speech starts and stops (Realtime, xAI, server turn
  detection); Gemini's untimed captions and GPT-Live's timed caption groups keep their spans.
- RO4 "began while the old one was open" means: began before the old connection stopped receiving audio.
- `session_expiring` (Gemini goAway, OpenAI expires_at) squeezes what is left of the schedule (after -> cap)
  into the time left: approval at once, open at the next end of speech or at 60 % of the time left, hard stop
  at 90 %. Times only ever move earlier.
- On refusal the current connection keeps the call until its hard stop, stops input, finishes its items
  (at most `drain_ms`), then EndSession and CloseConnection follow.

Seams with recovery and barge-in (DESIGN §14 S1, S3):
- A recovery during the overlap or the drain quarantines the whole chain, the healthy next connection too,
  and opens one replacement (HR5). Promoting the next connection instead was weighed and left: it carries no
  recovery notice (HR7), its age and the 5 s budget would need rules of their own, and in the overlap it did
  not hear all the floor heard. What it held is not lost with it: its texts still waiting for the old one's are
  emitted at once (RO3: the old one's never arrives now), before the replacement is seeded, and the stretch it
  alone heard in the hand-over is reported as below. Its texts not yet delivered are lost with it, as the
  floor's are in any recovery; the replacement's notice asks the caller to repeat (HR7).
- The next connection lost while it alone hears the caller (after the old one's StopInput, before TakeFloor):
  the old connection hears the caller again at once and keeps the call (a later rollover may be tried; the
  hard stop still applies), and the stretch only the lost one heard is reported as one input
  `audio_discontinuity` of that many 20 ms frames, cause `rollover_next_lost` (HR8 style). No recovery is
  begun (it would clear the old one's answer and cost a reconnect) and no spoken request to repeat is made:
  the stretch begins at a pause of the caller, and a speech start the lost one reported in it would already
  have moved the floor to it (next rule), so at most the first moments of an utterance are lost, whose rest
  the old connection hears. Lost after TakeFloor, the next connection is the floor: a recovery, as any.
- The old connection closed at its close-by age (a goAway can leave no time at all) before its text of a
  caller turn it alone heard has come: the stretch from that turn's start to the instant the next connection
  began to hear the caller is reported as one input `audio_discontinuity`, cause `rollover_unheard` (S1; the
  coordinator knows the turns and what was told). Waiting longer is not possible: the provider ends it.
- Barge-in in the hand-over: the next connection's speech start, while it alone hears the caller, is a
  barge-in on the floor's output (clear, truncate, suppression: the session routes it as the floor's own), and
  the old connection's answer is over: the floor moves to the connection hearing the caller at once, so its
  answer is played whole, from its start. Audio of an item a connection began while it listened (its answer
  to an utterance the old one answered) is never played, not even the tail that comes after it took the
  floor; only named items can be told apart (Realtime, xAI), GPT-Live and Gemini name none.
"""

from __future__ import annotations

import enum
import re
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bridge.engine.commands import (
    NO_SNAPSHOT,
    ApproveRollover,
    AudioDiscontinuity,
    AuthorizeConnection,
    CloseTransport,
    CommitInput,
    EmitInterim,
    EmitUntold,
    EmitUtterance,
    EndSession,
    OpenRollover,
    Outbox,
    RecoverySnapshot,
    Reseeded,
    RolloverAction,
    RolloverChanged,
    StartInput,
    StopInput,
    TakeFloor,
)
from bridge.engine.connections import Connections, connection_id, token_of
from bridge.engine.delegations import Delegations
from bridge.engine.timeline import Captions, Timeline
from bridge.engine.turns import TurnTracker
from providers.events import (
    AudioReceived,
    InputTranscript,
    InputTranscriptFailed,
    OutputTranscript,
    ProviderEvent,
    ResponseDone,
    SessionClosed,
    SessionExpiring,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
)
from rtp.audio import FRAME_MS
from rtp.units import NS_PER_MS

Seed = Callable[[], tuple[RecoverySnapshot, str | None]]

_NEVER = 1 << 62  # an instant that never comes (ns)
# S1: a stretch of caller speech only a dropped duplicate's text covered is reported when longer than this and
# than `match_slack_ms` (two connections' times of one utterance differ by their VAD's padding, a caption
# fragment is 200 ms: RO3 counts spans within the slack as the same words).
UNTOLD_MIN_MS = 100


@dataclass(frozen=True, slots=True)
class RolloverOptions:
    """Connection ages in ms, counted from the confirmation of the connection's session configuration."""

    after_ms: int = 3_300_000  # older than this, the caller's first end of speech opens the next connection
    deadline_ms: int = 3_480_000  # the next connection opens whatever is being said
    overlap_ms: int = 3_000  # least time both connections hear the same caller audio
    hard_stop_ms: int = (
        3_570_000  # the old one's buffer is committed; no next connection by now ends the call
    )
    match_slack_ms: int = 500
    client_commits: bool = False  # turn detection off: the application flushes utterances itself (RO5)
    cap_ms: int = 3_600_000  # the provider's limit for one connection
    drain_ms: int = 30_000  # longest the old connection keeps the floor after it stopped hearing the caller
    transcript_wait_ms: int = 5_000  # longest the new connection's text waits for the old one's (RO3)

    def __post_init__(self) -> None:
        if not 0 < self.after_ms <= self.deadline_ms <= self.hard_stop_ms < self.cap_ms:
            raise ValueError("rollover ages must satisfy 0 < after <= deadline <= hard_stop < cap")
        if min(self.overlap_ms, self.match_slack_ms, self.drain_ms, self.transcript_wait_ms) < 0:
            raise ValueError("rollover durations must not be negative")

    @classmethod
    def for_cap(cls, cap_ms: int, **overrides: object) -> RolloverOptions:
        """The defaults' proportions (55, 58 and 59.5 of 60 minutes) for another provider cap."""
        ages = {
            "after_ms": cap_ms * 110 // 120,
            "deadline_ms": cap_ms * 116 // 120,
            "hard_stop_ms": cap_ms * 119 // 120,
            "cap_ms": cap_ms,
        }
        return cls(**{**ages, **overrides})  # type: ignore[arg-type]


# --- actions: the session's own command types (bridge/engine/commands.py), one vocabulary -----------------------
Action = RolloverAction


class RolloverStage(enum.Enum):
    STEADY = "steady"  # one connection; waiting for its age to reach after_ms
    APPROVING = "approving"  # the approve hook has been asked
    AUTHORIZING = "authorizing"  # authorize has been asked for the next connection
    ARMED = "armed"  # allowed; waiting for the caller's boundary (end of speech, or a flush) or the deadline
    OPENING = "opening"  # the next connection is being opened
    OVERLAP = "overlap"  # both connections hear the caller
    DRAINING = "draining"  # the old one stopped input: it finishes its items, hands over the floor, closes
    REFUSED = "refused"  # no next connection: the current one carries on until its hard stop
    ENDED = "ended"


@dataclass(slots=True)
class RolloverStats:
    """One call's, across its controllers: a recovery or a failed next connection starts a new controller,
    not new counts (the status and the rollover ids go on from where they were)."""

    rollovers: int = 0  # completed
    started: int = 0  # begun (each one's id is rollover-<started>)
    refusals: Counter[str] = field(default_factory=Counter)
    ignored: int = 0  # events from unknown or closed connections
    late_answers: int = 0  # approve/authorize answers that came after their question was settled
    duplicates_dropped: int = 0  # utterances already emitted from the other connection
    interim_suppressed: int = 0  # RO4
    fallbacks: int = 0  # utterances emitted from the new connection in place of the old one's (RO3)


@dataclass(slots=True)
class _Conn:
    id: str
    confirmed_ns: int | None = None
    cap_at: int | None = None  # session_expiring: the provider ends this connection at this instant
    expiring_ns: int = 0  # when that was announced
    receiving: bool = False
    in_speech: bool = False
    busy: bool = False
    answering: bool = False  # a response is under way: begun, its ResponseDone not come (response_events)
    closed: bool = False
    _ages: tuple[tuple[object, int | None, int | None, int], tuple[int, int, int, int]] | None = field(
        default=None, compare=False, repr=False
    )

    def start_input(self) -> list[Action]:
        self.receiving = True
        return [StartInput(self.id)]

    def stop_input(self) -> list[Action]:
        was, self.receiving = self.receiving, False
        return [StopInput(self.id)] if was else []

    def close(self, reason: str) -> list[Action]:
        self.closed, self.receiving = True, False
        return [CloseTransport(self.id, reason)]

    def expire(self, time_left_ms: int, now: int) -> None:
        """The provider ends this connection in `time_left_ms` (Gemini goAway): its cap is now + time left."""
        cap_at = now + max(0, time_left_ms) * NS_PER_MS
        if self.cap_at is None or cap_at < self.cap_at:
            self.cap_at, self.expiring_ns = cap_at, now

    def ages(self, o: RolloverOptions) -> tuple[int, int, int, int]:
        """(after, deadline, hard stop, close-by) of this connection as instants; never while unconfirmed.
        Asked on every caller frame (`next_deadline`), so worked out again only when its inputs change."""
        key = (o, self.confirmed_ns, self.cap_at, self.expiring_ns)
        if self._ages is not None and self._ages[0] == key:
            return self._ages[1]
        marks = (o.after_ms, o.deadline_ms, o.hard_stop_ms, (o.hard_stop_ms + o.cap_ms) // 2)
        base = self.confirmed_ns
        at = [_NEVER if base is None else base + m * NS_PER_MS for m in marks]
        if self.cap_at is not None:  # squeeze what is left of the schedule (after -> cap) into the time left
            left, span = self.cap_at - self.expiring_ns, o.cap_ms - o.after_ms
            at = [
                min(a, self.expiring_ns + left * (m - o.after_ms) // span)
                for a, m in zip(at, marks, strict=True)
            ]
        ages = at[0], at[1], at[2], at[3]
        self._ages = (key, ages)
        return ages


class _Chain(dict[str, _Conn]):
    """The chain's connections by id: which hear the caller, how old each is, and whose input still counts."""

    def __init__(self, first: str, stats: RolloverStats) -> None:
        super().__init__({first: _Conn(first, receiving=True)})
        self._stats = stats

    def receiving(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.values() if c.receiving and not c.closed)

    def live(self, connection_id: str) -> _Conn | None:
        """The connection an input is about; None (and counted as ignored) for an unknown or closed one."""
        if (conn := self.get(connection_id)) is None or conn.closed:
            self._stats.ignored += 1
            return None
        return conn

    def ages_ms(self, now: int) -> dict[str, int]:
        live = [c for c in self.values() if not c.closed and c.confirmed_ns is not None]
        return {c.id: (now - (c.confirmed_ns or 0)) // NS_PER_MS for c in live}


@dataclass(slots=True, eq=False)
class _Utterance:
    """One caller utterance of a rollover's shared stretch, as each connection reported it (RO3). Each
    connection's report is matched to one utterance only: two utterances closer than the slack stay two."""

    old: tuple[int, int] | None = None  # its span as the old connection transcribed it
    new: tuple[int, int] | None = None  # as the new one did
    emitted: bool = False  # its text reached the application, from either connection
    told: tuple[int, int] | None = None  # the span of the text that did
    old_failed: bool = False  # the old one's transcription failed or was empty
    pending: _Pending | None = None  # the new one's text, waiting for the old one's


@dataclass(slots=True, eq=False)
class _Pending:
    start_ms: int
    end_ms: int
    text: str
    due_ns: int
    utterance: _Utterance


def _counter(first_connection_id: str) -> Callable[[], str]:
    """Ids after the first one's number, for a controller used on its own (`conn-1` -> `conn-2`, ...)."""
    match = re.fullmatch(r"(.*?)(\d+)", first_connection_id)
    prefix, seq = (match[1], int(match[2])) if match else (first_connection_id + "-", 1)
    numbers = iter(range(seq + 1, 1 << 62))
    return lambda: f"{prefix}{next(numbers)}"


class Handover:
    """Transcript bookkeeping of one rollover (RO3, RO4): which utterances both connections heard, and which
    connection's text of each is emitted — once.

    Matching is one-to-one: a connection's report joins the utterance that connection already reported
    overlapping it (a retry or a duplicate delivery), or else the utterance the other connection alone reported
    that lies nearest within `match_slack_ms` (the largest overlap first). An utterance matched once is never
    matched by another of the same connection's utterances, so two utterances closer than the slack are never
    merged into one (S1: the second is not dropped as a duplicate of the first when the old text of it fails)."""

    def __init__(
        self,
        old: str,
        new: str,
        options: RolloverOptions,
        stats: RolloverStats,
        emit: Callable[[Action], None],
    ) -> None:
        self.old, self.new = old, new
        self.shared_from_ms: int | None = None  # when the new one started hearing the caller
        self.shared_until_ms: int | None = None  # when the old one stopped input; None while it still hears
        self.old_closed = False
        self.utterances: list[_Utterance] = []
        self.before: list[_Utterance] = []  # the previous rollover's, whose new connection is this one's old
        self.pending: list[_Pending] = []
        self._options, self._stats, self._emit = options, stats, emit

    def shared(self, connection_id: str, start_ms: int, end_ms: int) -> bool:
        """RO4: the new connection's utterance began before the old one stopped hearing the caller, or overlaps
        one the old one reported (it heard its first frames: the frame under way when it stopped, S1)."""
        if connection_id != self.new:
            return False
        if self.shared_until_ms is None or start_ms < self.shared_until_ms:
            return True
        return any(u.old is not None and start_ms <= u.old[1] and u.old[0] <= end_ms for u in self.utterances)

    def same(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        """Two connections' spans of one utterance overlap, within the slack (RO3)."""
        slack = self._options.match_slack_ms
        return a[0] <= b[1] + slack and b[0] <= a[1] + slack

    def _match(self, span: tuple[int, int], side: str, pool: list[_Utterance]) -> _Utterance | None:
        """The utterance of `pool` that `span`, reported by the `side` ("old" or "new") connection, is: one that
        connection already reported overlapping it, else the nearest one only the other connection reported."""
        other = "new" if side == "old" else "old"
        best, most = None, 0
        for u in pool:
            mine, theirs = getattr(u, side), getattr(u, other)
            if mine is not None:
                if span == mine or (span[0] < mine[1] and mine[0] < span[1]):
                    return u  # one connection's utterances never overlap each other: this is it again
            elif theirs is not None and self.same(span, theirs):
                overlap = min(span[1], theirs[1]) - max(span[0], theirs[0])
                if best is None or overlap > most:
                    best, most = u, overlap
        return best

    def _utterance(self, span: tuple[int, int], side: str, pool: list[_Utterance]) -> _Utterance:
        u = self._match(span, side, pool)
        if u is None:
            u = _Utterance()
            self.utterances.append(u)
        if getattr(u, side) is None:
            setattr(u, side, span)
        return u

    def old_result(self, start_ms: int, end_ms: int, text: str | None) -> None:
        """The old connection's transcription of an utterance: text, or None when it failed or was empty. Its
        late text of an utterance it shared with its own predecessor (as the previous rollover's new
        connection) is settled by that rollover's bookkeeping."""
        span = (start_ms, end_ms)
        u = self._match(span, "new", self.before)
        # Over before the new one heard anything: the old one's alone. (A span whose end is not known yet is
        # not over: a caption with no times of its own takes the caller's turn under way, start = end, as
        # Gemini's old connection's text of an utterance committed at the hard stop in mid-speech does, RO2.)
        over = self.shared_from_ms is None or start_ms < end_ms < self.shared_from_ms
        if u is None and over:
            if text is not None:
                self._emit(EmitUtterance(self.old, start_ms, end_ms, text))
            return
        if u is not None and u.new is None:
            u.new = span  # (as the previous rollover's new connection: its later texts are not this one)
        u = u or self._utterance(span, "old", self.utterances)
        if u.emitted:
            self._stats.duplicates_dropped += text is not None
            if text is not None:
                self._untold(self.old, span, u.told)
            return
        if text is None:
            u.old_failed = True
            if u.pending is not None:
                self.fallback(u.pending)
            return
        u.emitted, u.told = True, span
        self._emit(EmitUtterance(self.old, start_ms, end_ms, text))
        if (p := u.pending) is not None:
            self.pending.remove(p)
            u.pending = None
            self._stats.duplicates_dropped += 1
            self._untold(self.new, (p.start_ms, p.end_ms), span)

    def new_shared(self, start_ms: int, end_ms: int, text: str, now: int, *, old_closed: bool) -> None:
        """The new connection's final text of an utterance the old one heard too (RO3)."""
        if not text.strip():
            return
        u = self._utterance((start_ms, end_ms), "new", self.utterances)
        if u.emitted or u.pending is not None:
            self._stats.duplicates_dropped += 1
            if u.emitted:
                self._untold(self.new, (start_ms, end_ms), u.told)
            return
        u.pending = _Pending(start_ms, end_ms, text, now + self._options.transcript_wait_ms * NS_PER_MS, u)
        self.pending.append(u.pending)
        if u.old_failed or old_closed:  # the old one failed, was empty, or can no longer answer
            self.fallback(u.pending)

    def _untold(self, connection_id: str, dropped: tuple[int, int], told: tuple[int, int] | None) -> None:
        """S1: a text dropped as the duplicate of one told that covers less of the caller's speech (the old
        connection committed at its hard stop in mid-utterance, RO2, or stopped hearing as it began, transcribes
        only its start; the next one opened in mid-utterance only its end): what only the dropped text covered
        is in no text — reported, stretch by stretch, where longer than the slack (and `UNTOLD_MIN_MS`)."""
        if told is None:
            return
        least = max(self._options.match_slack_ms, UNTOLD_MIN_MS)
        for start, end in ((dropped[0], min(dropped[1], told[0])), (max(dropped[0], told[1]), dropped[1])):
            if end - start > least:
                self._emit(EmitUntold(connection_id, start, end))

    def adopt(self, emit: Callable[[Action], None]) -> None:
        """Its decisions go to another controller from now on (`RolloverController.carry`)."""
        self._emit = emit

    def fallback(self, p: _Pending) -> None:
        self.pending.remove(p)
        p.utterance.pending, p.utterance.emitted, p.utterance.told = None, True, (p.start_ms, p.end_ms)
        self._stats.fallbacks += 1
        self._emit(EmitUtterance(self.new, p.start_ms, p.end_ms, p.text))


class CallerTexts:
    """Caller text from every connection of the chain (RO3, RO4): interim text passed on unless RO4 suppresses
    it, each final text once per connection and utterance, shared utterances settled by the handover of the
    latest rollover, whose old connection's text is waited for until `transcript_wait_ms`."""

    def __init__(
        self, options: RolloverOptions, stats: RolloverStats, emit: Callable[[Action], None]
    ) -> None:
        self._options, self._stats, self._emit = options, stats, emit
        self._finals: set[tuple[str, int, int]] = set()
        self.hand: Handover | None = None

    def begin(self, old: str, new: str) -> None:
        """A rollover opens `new`: from now on both may transcribe the same utterances. `old` was the previous
        rollover's new connection: what was emitted then stays known, so that its late text of an utterance
        it shared with its own predecessor is not emitted a second time (RO3); after a failed rollover of the
        same old connection, what it kept of that predecessor's stays known the same way."""
        hand, prev = Handover(old, new, self._options, self._stats, self._emit), self.hand
        if prev is not None and prev.new == old:
            hand.before = prev.utterances
        elif prev is not None and prev.old == old:
            hand.before = prev.before
        self.hand = hand

    def start_sharing(self, at_ms: int) -> None:
        """The new connection started hearing the caller at `at_ms` (session time): the old one's utterances
        over before then are its alone, never matched to the new one's (RO3)."""
        assert self.hand is not None
        self.hand.shared_from_ms = at_ms

    def stop_sharing(self, at_ms: int) -> None:
        """The old connection stopped hearing the caller at `at_ms` (session time)."""
        assert self.hand is not None
        self.hand.shared_until_ms = at_ms

    def failed(self, connection_id: str, start_ms: int, end_ms: int) -> bool:
        """The old connection's transcription of an utterance failed (RO3: the new one's text stands in)."""
        if self.hand is None or connection_id != self.hand.old:
            return False
        self.hand.old_result(start_ms, end_ms, None)
        return True

    def overdue(self, now: int) -> bool:
        """RO3: the old one's text never came in time: the new one's is emitted. True when any was."""
        due = [p for p in self.hand.pending if p.due_ns <= now] if self.hand is not None else []
        for p in due:
            assert self.hand is not None
            self.hand.fallback(p)
        return bool(due)

    def deadlines(self) -> list[int]:
        return [p.due_ns for p in self.hand.pending] if self.hand is not None else []

    def waiting(self) -> bool:
        """The old connection's text of a shared utterance may still come."""
        return self.hand is not None and bool(self.hand.pending)

    def flush(self) -> None:
        """The old connection's text can no longer come: whatever waits for it is emitted from the new one."""
        if self.hand is not None:
            for p in list(self.hand.pending):
                self.hand.fallback(p)

    def settle(self, old_id: str) -> None:
        """The old connection closed: whatever still waits for its text is emitted from the new one."""
        if self.hand is not None:
            self.hand.old_closed = True  # it can no longer answer
            self.flush()
        self._finals = {k for k in self._finals if k[0] != old_id}

    def transcript(
        self,
        connection_id: str,
        start_ms: int,
        end_ms: int,
        text: str,
        final: bool,
        now: int,
    ) -> None:
        hand = self.hand
        shared = hand is not None and hand.shared(connection_id, start_ms, end_ms)
        if not final:
            if shared:
                self._stats.interim_suppressed += 1
            elif text:
                self._emit(EmitInterim(connection_id, start_ms, end_ms, text))
            return
        key = (connection_id, start_ms, end_ms)
        if key in self._finals:
            return
        self._finals.add(key)
        if hand is not None and connection_id == hand.old:
            hand.old_result(start_ms, end_ms, text if text.strip() else None)
        elif hand is not None and shared:
            hand.new_shared(start_ms, end_ms, text, now, old_closed=hand.old_closed)
        elif text.strip():
            self._emit(EmitUtterance(connection_id, start_ms, end_ms, text))


# The stages that wait for an answer or a connection; at the hard stop each is refused for this reason (RO6).
_ASKING = {
    RolloverStage.APPROVING: "approve_timeout",
    RolloverStage.AUTHORIZING: "authorize_timeout",
    RolloverStage.ARMED: "next_not_open",
    RolloverStage.OPENING: "next_not_open",
}


class RolloverController:
    """One call's chain of connections: at most one rollover at a time, any number over the call (RO9)."""

    def __init__(
        self,
        first_connection_id: str,
        options: RolloverOptions | None = None,
        *,
        start_ns: int = 0,
        allocate: Callable[[], str] | None = None,
        seed: Seed | None = None,
        stats: RolloverStats | None = None,
        responses: bool = False,
        last_words: Callable[[str], list[tuple[int, int, str]]] | None = None,
    ) -> None:
        self.options = options or RolloverOptions()
        self._responses = responses  # the provider ends each response with ResponseDone (`response_done`)
        self.start_ns = start_ns  # the session timeline's origin (bridge.engine.timeline)
        self.stage = RolloverStage.STEADY
        self.stats = stats if stats is not None else RolloverStats()
        self._conns = _Chain(first_connection_id, self.stats)
        self._current = first_connection_id  # the connection holding the floor
        self._next: str | None = None
        self._rollover_id: str | None = None
        self._allocate = allocate or _counter(first_connection_id)  # the session's registry names them (RO7)
        self._seed = seed or (lambda: (NO_SNAPSHOT, None))  # what the next connection is seeded with (RO8)
        self._last_words = last_words or (lambda _cid: [])  # a closing connection's text not in yet
        self._boundary = False  # the caller ended an utterance since after_ms (RO1)
        self._overlap_end = _NEVER
        self._stop_ns = _NEVER  # when the old one stopped input (draining) or the refused one did (ending)
        self._refusal: str | None = None
        self._texts = CallerTexts(self.options, self.stats, self._emit)  # RO3, RO4
        self._actions: list[Action] = []
        self._now = 0
        self._over = False  # the call is over (S6)

    def actions(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    def audio_targets(self) -> tuple[str, ...]:
        return self._conns.receiving()

    def shared_from(self, close: CloseTransport) -> int | None:
        """When (session ms) the next connection began to hear the caller, if `close` closes the old one of
        the latest hand-over: what the caller said before then, only the old connection heard."""
        hand = self._texts.hand
        return hand.shared_from_ms if hand is not None and close.connection_id == hand.old else None

    def confirmed_ns(self, connection_id: str) -> int | None:
        """When that connection's session configuration was confirmed (its age counts from then)."""
        return conn.confirmed_ns if (conn := self._conns.get(connection_id)) is not None else None

    def speaker(self) -> str:
        return self._current

    @property
    def texts(self) -> CallerTexts:
        return self._texts

    def carry(self, texts: CallerTexts) -> None:
        """A previous controller's caller texts, whose latest hand-over's old connection is this one's current:
        that connection was the new one of the rollover before (its texts of utterances emitted then are still
        their duplicates, RO3, S1), and the failed next connection's texts still waiting for it still wait."""
        hand = texts.hand
        if hand is not None and hand.old == self._current:
            hand.adopt(self._emit)
            self._texts.hand = hand

    def status(self) -> dict[str, object]:  # status()["rollover"]
        return {
            "stage": self.stage.value,
            "current": self._current,
            "next": self._next,
            "rollover_id": self._rollover_id,
            "rollovers": self.stats.rollovers,
            "refusal": self._refusal,
            "ignored": self.stats.ignored,
            "receiving": list(self.audio_targets()),
            "ages_ms": self._conns.ages_ms(self._now),
        }

    def next_deadline(self) -> int | None:
        if self.stage is RolloverStage.STEADY and self._texts.hand is None:  # most frames: one age
            return a if (a := self._conns[self._current].ages(self.options)[0]) < _NEVER else None
        times, hand = self._texts.deadlines(), self._texts.hand
        after, deadline, hard, _ = self._conns[self._current].ages(self.options)
        st = self.stage
        if st is RolloverStage.STEADY:
            times.append(after)
        elif st in (RolloverStage.APPROVING, RolloverStage.AUTHORIZING, RolloverStage.OPENING):
            times.append(hard)
        elif st is RolloverStage.ARMED:
            times += [deadline, hard]
        elif st is RolloverStage.OVERLAP:
            speaking = self._conns[self._current].in_speech  # then its end of speech decides, not a timer
            times += [hard, _NEVER if speaking or self._overlap_end <= self._now else self._overlap_end]
        elif st is RolloverStage.DRAINING and hand is not None:
            old = self._conns[hand.old]
            times.append(self._drain_by(old) if self._current == old.id else old.ages(self.options)[3])
            if old.answering:
                times.append(self._drain_by(old))
        elif st is RolloverStage.REFUSED:
            times.append(hard if self._stop_ns == _NEVER else self._drain_by(self._conns[self._current]))
        due = [t for t in times if t < _NEVER]
        return min(due) if due else None

    # --- inputs ----------------------------------------------------------------------------------------------
    def handle_timer(self, now: int) -> None:
        self._advance(now)

    def end(self) -> None:
        """S6: the call is over. No rollover is begun, asked, opened or refused any more; a hand-over whose
        floor has moved finishes (the old connection's text may still come, RO3), then the chain ends."""
        self._over = True
        hand = self._texts.hand
        moved = self.stage is RolloverStage.DRAINING and hand is not None and self._current == hand.new
        if not moved:
            self.stage = RolloverStage.ENDED

    def connection_confirmed(self, connection_id: str, now: int) -> None:
        """Its session configuration was confirmed: its age counts from now."""
        conn = self._live(connection_id, now)
        if conn is None or conn.confirmed_ns is not None:
            return
        conn.confirmed_ns = now
        if connection_id == self._next and self.stage is RolloverStage.OPENING:
            if self.options.client_commits:
                self.stage = RolloverStage.ARMED  # open but passive until the switch (RO5)
            else:
                self._actions += conn.start_input()
                self._texts.start_sharing((now - self.start_ns) // NS_PER_MS)
                self._overlap_end = now + self.options.overlap_ms * NS_PER_MS
                self.stage = RolloverStage.OVERLAP
        self._advance(now)

    def speech_started(self, connection_id: str, at_ms: int, now: int) -> None:
        """That connection's server VAD heard the caller begin (`at_ms` on the session timeline)."""
        if (conn := self._live(connection_id, now)) is not None:
            conn.in_speech = True
            self._advance(now)

    def speech_stopped(self, connection_id: str, at_ms: int, now: int) -> None:
        conn = self._live(connection_id, now)
        if conn is None:
            return
        was_speaking, conn.in_speech = conn.in_speech, False
        if not self.options.client_commits:
            conn.busy = conn.busy or was_speaking  # server VAD answers the utterance
            conn.answering = conn.answering or (was_speaking and self._responses)
            if connection_id == self._current and now >= conn.ages(self.options)[0]:
                self._boundary = True
        self._advance(now)

    def committed(self, connection_id: str, at_ms: int, now: int) -> None:
        """The provider committed the utterance under way by itself (its final text came) but its speech stop
        was lost: that is the stop, or the hard stop would commit the silence after it (RO2)."""
        conn = self._conns.get(connection_id)
        if conn is not None and not conn.closed and conn.in_speech:
            self.speech_stopped(connection_id, at_ms, now)

    def flush(self, now: int) -> None:
        """Client commits: the application committed the input buffer (an utterance boundary, RO5)."""
        self._now = max(self._now, now)
        for cid in self.audio_targets():
            conn = self._conns[cid]
            conn.busy = True  # the committed utterance gets an answer
            conn.answering = conn.answering or self._responses
        if self.options.client_commits and self.stage is RolloverStage.ARMED:
            self._switch(now, commit=False)
        self._advance(now)

    def items_pending(self, connection_id: str, now: int) -> None:
        """The connection started output of its own (e.g. a response the application asked for)."""
        if (conn := self._live(connection_id, now)) is not None:
            conn.busy = True
            conn.answering = conn.answering or self._responses

    def response_done(self, connection_id: str, now: int) -> None:
        """The connection's response ended (ResponseDone): whatever it was going to say or ask has come."""
        if (conn := self._live(connection_id, now)) is not None and conn.answering:
            conn.answering = False
            self._advance(now)

    def items_finished(self, connection_id: str, now: int) -> None:
        """The connection has no assistant output pending: its response is done and played."""
        if (conn := self._live(connection_id, now)) is not None:
            conn.busy = False
            self._advance(now)

    def session_expiring(self, connection_id: str, time_left_ms: int, now: int) -> None:
        """The provider ends this connection in `time_left_ms` (Gemini goAway): its schedule is squeezed."""
        if (conn := self._live(connection_id, now)) is not None:
            conn.expire(time_left_ms, now)
            self._advance(now)

    def approve_answered(self, rollover_id: str, approved: bool | None, error: str | None, now: int) -> None:
        """The approve hook resolved (`approved`), raised (`error`), or did neither in time (late)."""
        if self._late(RolloverStage.APPROVING, rollover_id == self._rollover_id, now):
            return
        if error is not None or approved is not True:
            self._refuse("approve_error" if error is not None else "approve_refused")
        else:
            assert self._next is not None
            self._emit(AuthorizeConnection(self._next))
            self.stage = RolloverStage.AUTHORIZING
        self._advance(now)

    def authorize_answered(self, connection_id: str, ok: bool, now: int) -> None:
        if self._late(RolloverStage.AUTHORIZING, connection_id == self._next, now):
            return
        if not ok:
            self._refuse("authorize_refused")
        elif self.options.client_commits:
            self._open()  # passive until the switch
        else:
            self.stage = RolloverStage.ARMED
        self._advance(now)

    def transcript(
        self, connection_id: str, start_ms: int, end_ms: int, text: str, final: bool, now: int
    ) -> None:
        """Caller text with the utterance's times on the session timeline; interim when not `final`."""
        if self._live(connection_id, now) is not None:
            self._texts.transcript(connection_id, start_ms, end_ms, text, final, now)
            self._advance(now)

    def transcript_failed(self, connection_id: str, start_ms: int, end_ms: int, now: int) -> None:
        conn = self._live(connection_id, now)
        if conn is not None and self._texts.failed(connection_id, start_ms, end_ms):
            self._advance(now)

    def abandon(self) -> list[Action]:
        """A recovery quarantines the whole chain: the events of the old connection, of the next one too, are
        inert from now on. The next connection's texts still waiting for the old one's are emitted (RO3: the
        old one's never arrives); returns them (the rest of this controller's decisions go with it)."""
        self._texts.flush()
        return [a for a in self.actions() if isinstance(a, (EmitUtterance, EmitUntold))]

    # --- rules -----------------------------------------------------------------------------------------------
    def _advance(self, now: int) -> None:
        self._now = max(self._now, now)
        for _ in range(32):  # each step changes the stage or empties something: a handful at most
            if not self._step(self._now):
                return

    def _step(self, now: int) -> bool:
        hand, opts = self._texts.hand, self.options
        if self._texts.overdue(now):
            return True
        cur = self._conns[self._current]
        after, deadline, hard, close_by = cur.ages(self.options)
        st = self.stage
        if st is RolloverStage.STEADY and now >= after:
            self._begin(cur)
        elif st is RolloverStage.ARMED and opts.client_commits:
            if now < deadline:
                return False
            self._switch(now, commit=True)  # RO5: no flush by the deadline
        elif st in _ASKING and now >= hard:  # a session ended with no time left gave nobody time to answer
            self._refuse("ended_without_notice" if cur.cap_at == cur.expiring_ns else _ASKING[st])
        elif st is RolloverStage.ARMED and (now >= deadline or (self._boundary and not cur.in_speech)):
            self._open()  # RO1
        elif st is RolloverStage.OVERLAP and (
            now >= hard or (now >= self._overlap_end and not cur.in_speech)
        ):
            if cur.in_speech:
                self._emit(CommitInput(cur.id))  # RO2: hard stop in mid-utterance
                cur.busy = True
                cur.answering = self._responses
            self._actions += cur.stop_input()
            self._stop_ns = now
            self._texts.stop_sharing((now - self.start_ns) // NS_PER_MS)
            self.stage = RolloverStage.DRAINING
        elif st is RolloverStage.DRAINING and hand is not None:
            return self._drain(hand, now)
        elif st is RolloverStage.REFUSED and self._stop_ns == _NEVER and now >= hard:
            self._actions += cur.stop_input()  # RO6: kept until the hard stop; now it finishes its items
            self._stop_ns = now
        elif (
            st is RolloverStage.REFUSED
            and self._stop_ns != _NEVER
            and (not cur.busy or now >= self._drain_by(cur))
        ):
            self._emit(EndSession(self._refusal or "rollover_refused", goodbye=True))
            self._actions += cur.close(self._refusal or "rollover_refused")
            self.stage = RolloverStage.ENDED
        else:
            return False
        return True

    def _drain(self, hand: Handover, now: int) -> bool:
        old, new = self._conns[hand.old], self._conns[hand.new]
        close_by = old.ages(self.options)[3]
        if self._current == old.id:
            if old.busy and now < self._drain_by(old):
                return False
            self._current = new.id  # RO8: the old one stopped input and finished (or ran out of time)
            self._emit(TakeFloor(new.id))
            return True
        if now < close_by and (self._texts.waiting() or (old.answering and now < self._drain_by(old))):
            return False  # the old one's text may still come (RO3), or the rest of its response (S2)
        for words in self._last_words(old.id):  # (GPT-Live: its caption groups, S1)
            self._texts.transcript(old.id, *words, True, now)
        self._actions += self._conns.pop(old.id).close("rollover")  # forgotten (then ignored), not kept
        self._texts.settle(old.id)
        self._next, self._boundary, self._stop_ns = None, False, _NEVER
        self.stats.rollovers += 1
        self.stage = RolloverStage.ENDED if self._over else RolloverStage.STEADY
        return True

    def _begin(self, cur: _Conn) -> None:
        self.stats.started += 1
        self._rollover_id, self._next = f"rollover-{self.stats.started}", self._allocate()
        self._emit(ApproveRollover(self._rollover_id, cur.id, self._next))
        self.stage = RolloverStage.APPROVING

    def _open(self) -> None:
        assert self._next is not None
        self._conns[self._next] = _Conn(self._next)
        self._texts.begin(self._current, self._next)
        self._emit(OpenRollover(self._next, *self._seed()))
        self.stage = RolloverStage.OPENING

    def _switch(self, now: int, commit: bool) -> None:
        """RO5: the old one stops hearing the caller at the instant the new one starts: no overlap."""
        old, new = self._conns[self._current], self._conns[self._next or ""]
        if commit:
            self._emit(CommitInput(old.id))
            old.busy = True
        self._actions += old.stop_input()
        self._actions += new.start_input()
        self._texts.start_sharing((now - self.start_ns) // NS_PER_MS)
        self._texts.stop_sharing((now - self.start_ns) // NS_PER_MS)
        self._stop_ns = now
        self.stage = RolloverStage.DRAINING

    def _refuse(self, reason: str) -> None:
        """RO6/RO7: no next connection; the current one carries the call until its hard stop."""
        self._refusal = reason
        self.stats.refusals[reason] += 1
        if self._next is not None and self._next in self._conns:
            self._actions += self._conns[self._next].close(reason)
        self.stage = RolloverStage.REFUSED

    # --- helpers ---------------------------------------------------------------------------------------------
    def _drain_by(self, conn: _Conn) -> int:
        """When a connection that stopped input gives up the floor even if it still holds items."""
        return min(self._stop_ns + self.options.drain_ms * NS_PER_MS, conn.ages(self.options)[3])

    def _late(self, stage: RolloverStage, same: bool, now: int) -> bool:
        """RO6: an answer to a question already settled (a late one) opens nothing; it is counted."""
        self._now = max(self._now, now)
        late = self.stage is not stage or not same
        self.stats.late_answers += late
        return late

    def _live(self, connection_id: str, now: int) -> _Conn | None:
        self._now = max(self._now, now)
        return self._conns.live(connection_id)

    def _emit(self, action: Action) -> None:
        self._actions.append(action)


class RolloverLink:
    """The glue between one call's session and its rollover controller (RO1-RO9): what the controller watches,
    from every connection it knows, and where each of its decisions goes — the connection registry (floor,
    listeners, caller-audio targets), the captions (each utterance once), or the shell (the same command
    types). Connections that listen but do not hold the floor never speak (RO8): their audio is dropped and
    counted. The job ledger learns when a next connection opens and when the old one stops hearing the caller:
    until the caller's first utterance after that, the next one's calls answer what the old one heard and
    handled, and are never dispatched (S2, bridge/engine/delegations.py).

    S6: once the caller hung up or the session ended (`end`), nothing more is asked, opened or funded: the
    approve, authorise and open decisions are dropped, their late answers counted as late, and a next
    connection still listening is closed. A previous connection still waiting for its text (RO3) may finish."""

    def __init__(
        self,
        out: Outbox,
        connections: Connections,
        timeline: Timeline,
        captions: Captions,
        turns: TurnTracker,
        options: RolloverOptions | None,
        seed: Seed,
        *,
        client_commits: bool,
        jobs: Delegations | None = None,
        responses: bool = False,
        unheard: Callable[[int, int], None] | None = None,
    ) -> None:
        self._out, self._connections, self._timeline, self._captions = out, connections, timeline, captions
        self._unheard = unheard  # S1: told what a closed old connection alone heard, up to (session ms), now
        self._jobs = jobs
        self.ended = False  # the caller hung up or the session ended: nothing more is opened (S6)
        self._turns, self._seed = turns, seed
        self.options = replace(options, client_commits=True) if options and client_commits else options
        self._client = client_commits
        self._responses = responses  # Capabilities.response_events
        self.controller: RolloverController | None = None
        self._utterances: dict[int, dict[str | None, list[int]]] = {}  # token -> item -> [start_ms, end_ms]
        self.speaker_busy = False  # the floor's output has not all been played yet (RO2, RO8)
        self.listener_audio_bytes = 0  # audio from connections not holding the floor, never played
        self.stats = RolloverStats()  # the call's, kept by every controller it starts
        self._alone_from: int | None = None  # caller audio forwarded (ms) when the next one alone heard
        self._unplayed: deque[tuple[int, str]] = deque(maxlen=16)  # (token, item) begun as a listener (RO8)

    def start(self, confirmed_ns: int | None = None) -> None:
        """A controller whose current connection is the floor (at the start of the call, after a repair, after
        a failed next connection). The spans the floor's speech events gave its utterances are kept: the
        transcript of one under way carries no times of its own (Realtime, xAI), and without its span it was
        stamped 0 ms of the session's timeline (HR11). After a failed next connection, the hand-over the floor
        was the old connection of goes on settling its texts (`RolloverController.carry`)."""
        token = self._connections.floor
        heard = self._utterances.get(token)
        before = self.controller.texts if self.controller is not None else None
        self.stop()
        if heard is not None:
            self._utterances[token] = heard
        if self.options is not None and not self.ended:
            floor = connection_id(self._connections.floor)
            self.controller = RolloverController(
                floor,
                self.options,
                start_ns=self._timeline.start_ns,
                allocate=self._connections.allocate_id,
                seed=self._seed,
                stats=self.stats,
                responses=self._responses,
                last_words=self._last_words,
            )
            if before is not None:
                self.controller.carry(before)
            if confirmed_ns is not None:
                self.controller.connection_confirmed(floor, confirmed_ns)

    def _last_words(self, cid: str) -> list[tuple[int, int, str]]:
        """S1: the caption fragments of the caller's last turns that a connection about to be closed sent (GPT-Live
        groups them until `caption_close_ms` after the turn, which may be later than its close): its text of
        each turn's utterance, settled (RO3) before it is closed instead of dropped with it."""
        groups = self._captions.close_one(token_of(cid))
        return [(start, end, text) for _, text, start, end in groups if text]

    def stop(self) -> None:
        """No rollover in progress any more: only the floor hears the caller."""
        self.controller, self.speaker_busy, self._alone_from = None, False, None
        self._utterances.clear()
        self._unplayed.clear()
        self._connections.reset_inputs()

    def last_text(self, token: int, text: str, start_ms: int, end_ms: int, now: int) -> bool:
        """A recovery is quarantining connection `token` (no longer known): its last text still goes through
        the controller, which emits it once (RO3) when `abandon` follows; False when no controller takes it."""
        if self.controller is None:
            return False
        self.controller.transcript(connection_id(token), start_ms, end_ms, text, True, now)
        return True

    def lost(self, old: int, now: int) -> None:
        """A replacement is being opened for the floor connection `old`, now quarantined: the caption fragments
        `old` sent of the caller's last turn (GPT-Live groups them until the turn is over) are its text and are
        emitted (S1); then any rollover is abandoned (what its next connection held for the application is
        emitted first)."""
        for token, text, start, end in self._captions.close():
            if token == old and text and not self.last_text(token, text, start, end, now):
                self._captions.caller(text, start, True, end)
        self.abandon(now)

    def abandon(self, now: int) -> None:
        """A recovery abandons any rollover in progress (the replacement starts afresh) and quarantines its
        healthy next connection with the floor. What that one held is not lost with it (S1): its text of an
        utterance both heard, still waiting for the old one's, is emitted now (RO3), and what it alone heard
        during the hand-over is reported (`_lost_alone`)."""
        if self.controller is not None:
            for emit in self.controller.abandon():
                if isinstance(emit, EmitUtterance):
                    self._captions.caller(emit.text, emit.start_ms, True, emit.end_ms)
                elif isinstance(emit, EmitUntold):
                    self._untold(emit)
        self._lost_alone(now)
        self.stop()

    def _untold(self, action: EmitUntold) -> None:
        """S1: caller speech in no text told (RO3's choice of the text that covers less), one input
        `audio_discontinuity` of its 20 ms frames, cause `rollover_untold`, at its end."""
        frames = (action.end_ms - action.start_ms) // FRAME_MS
        self._out.notices.append(AudioDiscontinuity("input", frames, "rollover_untold", action.end_ms))

    def _lost_alone(self, now: int) -> None:
        """S1 (HR8 style): the caller audio only the next connection heard — from when the old one stopped
        hearing the caller until now — is lost with it, in one input `audio_discontinuity` of that many 20 ms
        frames with cause `rollover_next_lost`. Whatever of it that connection had already transcribed was
        emitted; the rest is not promised."""
        if self._alone_from is not None:
            frames = (self._timeline.fed_ms - self._alone_from) // FRAME_MS
            if frames:
                at = self._timeline.ms(now)
                self._out.notices.append(AudioDiscontinuity("input", frames, "rollover_next_lost", at))
            self._alone_from = None

    def _span(
        self, token: int, item: str | None, start_ms: int | None, end_ms: int | None, now: int
    ) -> list[int]:
        """The session-time span of an utterance on a connection, from its speech events (RO3 matching), or,
        for a caption that names no utterance and carries no times, the local detector's last turn. An
        utterance none of whose times are known is placed at its end or now, never at the session's 0 (HR11,
        as `Timeline.rebase`)."""
        spans = self._utterances.setdefault(token, {})
        untimed = start_ms is None and end_ms is None
        # No times and no speech events for it: Gemini's captions, or any caption with turn detection off (RO5).
        if untimed and (
            (item is None and not self._turns.timed_captions) or (self._client and item not in spans)
        ):
            return list(self._turns.local_turn)
        at = start_ms if start_ms is not None else end_ms if end_ms is not None else self._timeline.ms(now)
        span = spans.setdefault(item, [at, at if end_ms is None else end_ms])
        if start_ms is not None and end_ms is None:
            span[:] = [start_ms, start_ms]
        elif end_ms is not None:
            span[1] = end_ms
        if len(spans) > 64:
            del spans[next(iter(spans))]
        return span

    def _cut(self, token: int, at_ms: int) -> None:
        """The connection's input was committed or stopped in mid-utterance: what it heard of the utterance
        ends here (its transcript then matches the next connection's of the rest, RO3)."""
        for span in self._utterances.get(token, {}).values():
            if span[0] == span[1] <= at_ms:
                span[1] = at_ms

    def _committed(self, ctl: RolloverController, token: int, span: list[int], now: int) -> None:
        """A final text (or its failure) of the utterance under way, whose speech stop never came (lost to a
        fault): the provider committed it, so it is over. Its span ends now, and this is the connection's end of
        speech (`RolloverController.committed`). Only where the provider reports speech starts and stops
        (Realtime, xAI): elsewhere an untimed caption's start = end is by design."""
        spans = self._utterances.get(token, {})
        if not self._turns.provider_ends or span[0] != span[1] or spans.get(None) != span:
            return  # not the speech start under way: its stop came, or a later utterance has begun
        at = max(span[0], self._timeline.ms(now))
        span[1] = spans[None][1] = at  # the item's and the connection's last utterance's
        ctl.committed(connection_id(token), at, now)

    def observe(self, event: ProviderEvent, now: int) -> None:
        """Feed what the controller watches, from the floor or a listener."""
        ctl, token = self.controller, event.token
        if ctl is None:
            return
        cid, rebase = connection_id(token), self._timeline.rebase
        if isinstance(event, (SpeechStarted, SpeechStopped)):
            at = rebase(token, event.at_ms, now)
            started = isinstance(event, SpeechStarted)
            for item in {event.item_id, None}:
                self._span(token, item, at if started else None, None if started else at, now)
            (ctl.speech_started if started else ctl.speech_stopped)(cid, at, now)
        elif isinstance(event, InputTranscript):
            start = rebase(token, event.start_ms, now) if event.start_ms is not None else None
            end = rebase(token, event.end_ms, now) if event.end_ms is not None else None
            span = self._span(token, event.item_id, start, end, now)
            if event.final:
                self._committed(ctl, token, span, now)
            ctl.transcript(cid, span[0], span[1], event.text, event.final, now)
        elif isinstance(event, InputTranscriptFailed):
            span = self._span(token, event.item_id, None, None, now)
            self._committed(ctl, token, span, now)
            ctl.transcript_failed(cid, span[0], span[1], now)
        elif isinstance(event, SessionExpiring):
            ctl.session_expiring(cid, event.time_left_ms, now)
        elif isinstance(event, ResponseDone):
            ctl.response_done(cid, now)
        elif isinstance(event, SessionStarted):
            if token != self._connections.floor:
                self._timeline.connection_started(token, now)
            ctl.connection_confirmed(cid, now)

    def caller_heard(self, started: bool, now: int) -> None:
        """S2: a caller turn began or ended while a rollover's next connection's own work is not settled yet."""
        if self._jobs is not None and self._jobs.echoes:
            self._jobs.caller_heard(started, self._timeline.ms(now))

    def local_turn_over(self, now: int) -> None:
        """The local detector ended the caller's turn: caption fragments are split there and closed after
        it; the utterance is marked (RO3) and, with client commits, it is the bridge's own turn (RO5)."""
        self._captions.turn_over(now, self._timeline.ms(now))
        self.local_turn(False, now)
        self.turn_committed(now)

    def listener(self, event: ProviderEvent, now: int, *, speaking: bool) -> None:
        """An event of a connection that listens and does not hold the floor (its speech events and calls are
        routed by the coordinator): what the controller watches, caption fragments kept, and a response
        done acknowledging the commands it was sent (HR6: not unknown when it closes, S8)."""
        jobs = self._jobs
        if isinstance(event, ResponseDone) and jobs is not None and jobs.records:
            jobs.acknowledged(event.token)
            self.listener_event(event, now)
        elif not self._captions.fragment(event, self._timeline, now, speaking=speaking):
            self.listener_event(event, now)
            if isinstance(event, SessionClosed):
                self.gone(now)

    def gone(self, now: int) -> None:
        """HR6, S8: commands on a connection the rollover closed or dropped, never taken in, are unknown."""
        if self._jobs is not None and self._jobs.records:
            self._jobs.connections_gone(self._connections.known, self._timeline.ms(now))

    def echo(self, event: ProviderEvent, now: int) -> None:
        """S2: what the ledger watches of a rollover's next connection until its own work begins
        (bridge/engine/delegations.py): the caller's utterances it hears (when reported), and its responses."""
        jobs, token = self._jobs, event.token
        if jobs is None:
            return
        if isinstance(event, SpeechStarted):
            jobs.caller_heard(True, self._timeline.ms(now))
        elif isinstance(event, (SpeechStopped, AudioReceived, OutputTranscript)):
            jobs.echo_output(token)  # (after an end of speech, the server's turn detection answers)
            if isinstance(event, SpeechStopped):
                jobs.caller_heard(False, self._timeline.ms(now))
        elif isinstance(event, ResponseDone):
            jobs.echo_response_done(token)

    def listener_event(self, event: ProviderEvent, now: int) -> None:
        if isinstance(event, AudioReceived):
            self.listener_audio_bytes += len(event.audio)
            if event.item_id is not None and (key := (event.token, event.item_id)) not in self._unplayed:
                self._unplayed.append(key)
        elif isinstance(event, SessionClosed):
            if not event.finalized:
                self.failed(event.token, f"connection lost ({event.reason})", now)
            return
        self.observe(event, now)
        if isinstance(event, SpeechStarted) and self._connections.handing_over:
            self.floor_interrupted(now)

    def begun_as_listener(self, event: AudioReceived) -> bool:
        """RO8, S3: the floor's audio of an item it began while it was a listener — its own answer to an
        utterance the old connection answered — is never played, not even the tail that comes after it took
        the floor (half an answer, repeating the old one's); counted with the listeners' audio. (Only named
        items can be told apart: GPT-Live and Gemini name none.)"""
        if not self._unplayed or event.item_id is None or (event.token, event.item_id) not in self._unplayed:
            return False
        self.listener_audio_bytes += len(event.audio)
        return True

    def floor_interrupted(self, now: int) -> None:
        """S3: during the hand-over the caller spoke over the old connection's answer, and only the next one
        hears them (the session barged in on the floor's output for it). What is left of the old one's answer
        is not wanted: it holds no more items, and the floor moves at once to the connection that heard the
        caller, whose answer is then played whole, from its start (the old one's late audio is a listener's)."""
        if self.controller is not None:
            self.speaker_busy = False
            self.controller.items_finished(connection_id(self._connections.floor), now)

    def local_turn(self, started: bool, now: int) -> None:
        """The local detector's turn of the caller, on the floor connection (no server VAD)."""
        if self.controller is not None:
            cid, at = connection_id(self._connections.floor), self._timeline.ms(now)
            (self.controller.speech_started if started else self.controller.speech_stopped)(cid, at, now)

    def caption(self, token: int, text: str, start_ms: int, end_ms: int, now: int) -> bool:
        """A closed group of caption fragments; False when no controller takes it."""
        if self.controller is None or not self._connections.known(token):
            return False
        self.controller.transcript(connection_id(token), start_ms, end_ms, text, True, now)
        return True

    def flush(self, now: int) -> None:
        if self.controller is not None:
            self.controller.flush(now)

    def turn_committed(self, now: int) -> None:
        """RO5: with client commits, the bridge's own VAD turn is committed on every connection hearing the
        caller, then flushed (the first flush after `after_ms` switches)."""
        if self._client:
            self._out.commands.extend(CommitInput(connection_id(t)) for t in self._connections.audio_targets)
            self.flush(now)

    def handle_timer(self, now: int) -> None:
        if self.controller is not None:
            self.controller.handle_timer(now)

    def speaker_output(self, now: int) -> None:
        if self.controller is not None and not self.speaker_busy:
            self.speaker_busy = True
            self.controller.items_pending(connection_id(self._connections.floor), now)

    def speaker_drained(self, now: int) -> None:
        """Everything the floor connection said has been played (RO2, RO8)."""
        if self.controller is not None and self.speaker_busy:
            self.speaker_busy = False
            self.controller.items_finished(connection_id(self._connections.floor), now)

    def floor_response_done(self, token: int, now: int) -> None:
        """The floor finished a response (the ledger: it took in what it was sent); one that ended in a tool
        call holds no items (`tool_turn_done`)."""
        if self._jobs is not None and self._jobs.response_ended(token, self._timeline.ms(now)):
            self.tool_turn_done(now)

    def tool_turn_done(self, now: int) -> None:
        """The floor's response ended in a tool call with nothing left to play: it holds no items, for the
        result goes to whichever connection holds the floor when it comes (RO8)."""
        if self.controller is not None and not self.speaker_busy:
            self.controller.items_finished(connection_id(self._connections.floor), now)

    def approved(self, rollover_id: str, approved: bool | None, error: str | None, now: int) -> None:
        if self.ended:
            self.stats.late_answers += 1  # S6: after the hang-up, an answer opens nothing
        elif self.controller is not None:
            self.controller.approve_answered(rollover_id, approved, error, now)

    def authorized(self, cid: str, ok: bool, now: int) -> None:
        if self.ended:
            self.stats.late_answers += 1
        elif self.controller is not None:
            self.controller.authorize_answered(cid, ok, now)

    def end(self, reason: str, now: int) -> None:
        """S6: the caller hung up, or the session ended: nothing more is asked, opened or funded, and the next
        connection, if one listens (it never took the floor), is closed."""
        if self.ended:
            return
        self.ended = True
        ctl = self.controller
        nxt = ctl.status()["next"] if ctl is not None else None
        if ctl is not None:
            ctl.end()
        token = token_of(nxt) if isinstance(nxt, str) else -1
        if token in self._connections.listeners:
            self._out.commands.append(CloseTransport(connection_id(token), reason))
            self._connections.drop(token)
            self._utterances.pop(token, None)
            if self._jobs is not None:
                self._jobs.forget_echo(token)
            self._out.notices.append(
                RolloverChanged("abandoned", connection_id(token), reason, self._timeline.ms(now))
            )

    def expires(self, token: int, time_left_ms: int, now: int) -> None:
        """An announced end (GPT-Live's and Realtime's `expires_at`) sooner than the configured cap drives the
        rollover as Gemini's goAway does."""
        ctl = self.controller
        if ctl is not None and self._connections.known(token) and ctl.options.cap_ms * 9 // 10 > time_left_ms:
            ctl.session_expiring(connection_id(token), max(0, time_left_ms), now)

    def resumption_rejected(self, token: int) -> None:
        """The next connection's provider refused the resumption handle: open it once more, reseeded without."""
        if token in self._connections.listeners and not self.ended:
            self._connections.resume_handle = None
            self._out.notices.append(Reseeded(token, "rollover"))
            self._out.commands.append(OpenRollover(connection_id(token), *self._seed()))

    def failed(self, token: int, reason: str, now: int) -> None:
        """The next connection could not be opened, or was lost before it took the floor: drop it; the current
        connection keeps the call and a later rollover may be tried (the hard stop still applies). The old one,
        lost after it handed the floor over, has simply ended: the new one's text of an utterance still waiting
        for the old one's is emitted now (RO3), not lost with a restarted controller."""
        if token not in self._connections.listeners:
            return
        alone = self._connections.handing_over and token in self._connections.audio_targets
        self._connections.drop(token)
        self._utterances.pop(token, None)
        if self._jobs is not None:
            self._jobs.forget_echo(token)
        cid = connection_id(token)
        self._out.notices.append(RolloverChanged("failed", cid, reason, self._timeline.ms(now)))
        if self.controller is not None and self.controller.status()["next"] != cid:
            self.controller.session_expiring(cid, 0, now)  # its end is now: it closes, its waits settle
        elif self.controller is not None:
            if alone:  # it alone heard the caller: the old one hears them again, from now (`start`)
                self._lost_alone(now)
            self.start(self.controller.confirmed_ns(connection_id(self._connections.floor)))

    @property
    def deciding(self) -> bool:
        """The controller has decisions for `route` (most inputs: none, so the coordinator skips `route`)."""
        return self.controller is not None and bool(self.controller._actions)

    def route(self, now: int) -> str | None:
        """Carry the controller's decisions to where they belong; returns a refusal's reason (RO6)."""
        ctl = self.controller
        actions = ctl.actions() if ctl is not None else []
        at, refused = self._timeline.ms(now), None
        for action in actions:
            token = 0 if isinstance(action, EndSession) else token_of(action.connection_id)
            if self.ended and isinstance(action, (ApproveRollover, AuthorizeConnection, OpenRollover)):
                continue  # S6: after the hang-up nothing is asked, opened or funded (RolloverController.end)
            if isinstance(action, (CommitInput, StopInput)):
                self._cut(token, at)
            if isinstance(action, (ApproveRollover, AuthorizeConnection, CommitInput)):
                self._out.commands.append(action)
            elif isinstance(action, OpenRollover):
                self._connections.add_listener(token)
                if self._jobs is not None:
                    self._jobs.listening(token)  # S2: it answers what the floor hears, too
                self._out.commands.append(action)
                self._out.notices.append(
                    RolloverChanged("opening", action.connection_id, f"token {token}", at)
                )
            elif isinstance(action, StartInput):
                self._connections.start_input(token)
            elif isinstance(action, StopInput):
                if token == self._connections.floor:
                    self._captions.boundary(at)  # S1: the next one's captions from now on are its own
                if token == self._connections.floor and self._jobs is not None:
                    self._jobs.stopped_hearing(at)  # S2: utterances from now on are the next one's
                self._connections.stop_input(token)
            elif isinstance(action, TakeFloor) and self._connections.take_floor(token):
                self.speaker_busy = False
                self._captions.new_epoch()
                self._out.notices.append(RolloverChanged("floor", action.connection_id, f"token {token}", at))
            elif isinstance(action, CloseTransport):
                if token != self._connections.floor:
                    heard = ctl.shared_from(action) if ctl is not None else None
                    if self._unheard is not None and heard is not None:
                        self._unheard(heard, now)  # S1: what only it heard, and it never said, is told
                    self._out.commands.append(action)
                    self._connections.drop(token)
                    self._utterances.pop(token, None)
                self._out.notices.append(RolloverChanged("closed", action.connection_id, action.reason, at))
            elif isinstance(action, EmitUntold):
                self._untold(action)
            elif isinstance(action, (EmitUtterance, EmitInterim)):
                final = isinstance(action, EmitUtterance)  # with its end, for the application
                self._captions.caller(action.text, action.start_ms, final, action.end_ms)
            elif isinstance(action, EndSession):
                self._out.notices.append(
                    RolloverChanged("refused", connection_id(self._connections.floor), action.reason, at)
                )
                refused = action.reason
        if not self._connections.handing_over:
            self._alone_from = None
        elif self._alone_from is None:  # only the next connection hears the caller from now (S1)
            self._alone_from = self._timeline.fed_ms
        return refused

    def next_deadline(self) -> int | None:
        return self.controller.next_deadline() if self.controller is not None else None

    def status(self) -> dict[str, object] | None:
        return self.controller.status() if self.controller is not None else None
