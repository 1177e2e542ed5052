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
- RO3 "never arrives": the new connection's final text for a shared utterance waits for the old one's at most
  `transcript_wait_ms`, and never past the old connection's close. Utterances match when their starts or their
  ends are within `match_slack_ms` (a connection opened mid-utterance hears only its end).
- RO4 "began while the old one was open" means: began before the old connection stopped receiving audio.
- `session_expiring` (Gemini goAway, OpenAI expires_at) squeezes what is left of the schedule (after -> cap)
  into the time left: approval at once, open at the next end of speech or at 60 % of the time left, hard stop
  at 90 %. Times only ever move earlier.
- On refusal the current connection keeps the call until its hard stop, stops input, finishes its items
  (at most `drain_ms`), then EndSession and CloseConnection follow.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from dataclasses import dataclass, field

_NS_PER_MS = 1_000_000
_NEVER = 1 << 62  # an instant that never comes (ns)


@dataclass(frozen=True, slots=True)
class RolloverOptions:
    """Connection ages in ms, counted from the confirmation of the connection's session configuration."""

    after_ms: int = 3_300_000  # older than this, the caller's first end of speech opens the next connection
    deadline_ms: int = 3_480_000  # the next connection opens whatever is being said
    overlap_ms: int = 3_000  # least time both connections hear the same caller audio
    hard_stop_ms: int = 3_570_000  # the old one's buffer is committed; no next connection by now ends the call
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
        ages = {"after_ms": cap_ms * 110 // 120, "deadline_ms": cap_ms * 116 // 120,
                "hard_stop_ms": cap_ms * 119 // 120, "cap_ms": cap_ms}
        return cls(**{**ages, **overrides})  # type: ignore[arg-type]


# --- actions -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RequestApproval:
    """Ask the application's approve hook; answer with `approve_answered(rollover_id, ...)`."""

    rollover_id: str
    connection_id: str  # the connection being replaced
    next_connection_id: str


@dataclass(frozen=True, slots=True)
class Authorize:
    """Ask connection_hooks.authorize to fund this connection (RO7); answer with `authorize_answered`."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class OpenConnection:
    """Open the next connection, seeded with context as HR7 but without the recovery notice (RO8)."""

    connection_id: str
    seeded: bool = True


@dataclass(frozen=True, slots=True)
class StartInput:
    """From now on this connection receives the caller's audio too."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit this connection's input buffer: the caller's words so far are one utterance."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class StopInput:
    """This connection receives no more caller audio."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class TakeFloor:
    """From now on only this connection's audio plays (one speaker at a time)."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class CloseConnection:
    connection_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class EmitUtterance:
    """A caller utterance for the application: each one exactly once (RO3)."""

    connection_id: str
    start_ms: int
    end_ms: int
    text: str


@dataclass(frozen=True, slots=True)
class EmitInterim:
    """Interim caller text for the application (never from a connection that only echoes the old one, RO4)."""

    connection_id: str
    start_ms: int
    end_ms: int
    text: str


@dataclass(frozen=True, slots=True)
class EndSession:
    """No connection can carry the call on: the shell says a clean goodbye and sends BYE."""

    reason: str


Action = (RequestApproval | Authorize | OpenConnection | StartInput | Commit | StopInput | TakeFloor
          | CloseConnection | EmitUtterance | EmitInterim | EndSession)


class Stage(enum.Enum):
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
    rollovers: int = 0  # completed
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
    closed: bool = False


@dataclass(slots=True)
class _Pending:
    start_ms: int
    end_ms: int
    text: str
    due_ns: int


@dataclass(slots=True)
class _Handover:
    """Transcript bookkeeping of one rollover: which utterances both connections heard (RO3, RO4)."""

    old: str
    new: str
    shared_until_ms: int | None = None  # when the old one stopped input; None while it still hears the caller
    old_outcomes: list[tuple[int, int, bool]] = field(default_factory=list)  # (start, end, emitted)
    new_emitted: list[tuple[int, int]] = field(default_factory=list)  # shared utterances emitted from new
    pending: list[_Pending] = field(default_factory=list)


class RolloverController:
    """One call's chain of connections: at most one rollover at a time, any number over the call (RO9)."""

    def __init__(self, first_connection_id: str, options: RolloverOptions | None = None, *,
                 start_ns: int = 0) -> None:
        self.options = options or RolloverOptions()
        self.start_ns = start_ns  # the session timeline's origin (bridge.timeline)
        self.stage = Stage.STEADY
        self.stats = RolloverStats()
        self._conns = {first_connection_id: _Conn(first_connection_id, receiving=True)}
        self._current = first_connection_id  # the connection holding the floor
        self._next: str | None = None
        self._rollover_id: str | None = None
        self._started = 0  # rollovers started (ids)
        match = re.fullmatch(r"(.*?)(\d+)", first_connection_id)
        self._prefix, self._seq = (match[1], int(match[2])) if match else (first_connection_id + "-", 1)
        self._boundary = False  # the caller ended an utterance since after_ms (RO1)
        self._overlap_end = _NEVER
        self._stop_ns = _NEVER  # when the old one stopped input (draining) or the refused one did (ending)
        self._refusal: str | None = None
        self._hand: _Handover | None = None
        self._finals: set[tuple[str, int, int]] = set()
        self._actions: list[Action] = []
        self._now = 0

    # --- queries ---------------------------------------------------------------------------------------------
    def actions(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    def audio_targets(self) -> tuple[str, ...]:
        return tuple(c.id for c in self._conns.values() if c.receiving and not c.closed)

    def confirmed_ns(self, connection_id: str) -> int | None:
        """When that connection's session configuration was confirmed (its age counts from then)."""
        conn = self._conns.get(connection_id)
        return conn.confirmed_ns if conn is not None else None

    def speaker(self) -> str:
        return self._current

    def status(self) -> dict[str, object]:
        """What `status()["rollover"]` shows."""
        return {"stage": self.stage.value, "current": self._current, "next": self._next,
                "rollover_id": self._rollover_id, "rollovers": self.stats.rollovers, "refusal": self._refusal,
                "ignored": self.stats.ignored, "receiving": list(self.audio_targets()),
                "ages_ms": {c.id: (self._now - c.confirmed_ns) // _NS_PER_MS for c in self._conns.values()
                            if not c.closed and c.confirmed_ns is not None}}

    def next_deadline(self) -> int | None:
        times = [p.due_ns for p in self._hand.pending] if self._hand else []
        after, deadline, hard, _ = self._ages(self._conns[self._current])
        st = self.stage
        if st is Stage.STEADY:
            times.append(after)
        elif st in (Stage.APPROVING, Stage.AUTHORIZING, Stage.OPENING):
            times.append(hard)
        elif st is Stage.ARMED:
            times += [deadline, hard]
        elif st is Stage.OVERLAP:
            speaking = self._conns[self._current].in_speech  # then its end of speech decides, not a timer
            times += [hard, _NEVER if speaking or self._overlap_end <= self._now else self._overlap_end]
        elif st is Stage.DRAINING and self._hand is not None:
            old = self._conns[self._hand.old]
            times.append(self._drain_by(old) if self._current == old.id else self._ages(old)[3])
        elif st is Stage.REFUSED:
            times.append(hard if self._stop_ns == _NEVER else self._drain_by(self._conns[self._current]))
        due = [t for t in times if t < _NEVER]
        return min(due) if due else None

    # --- inputs ----------------------------------------------------------------------------------------------
    def handle_timer(self, now: int) -> None:
        self._advance(now)

    def connection_confirmed(self, connection_id: str, now: int) -> None:
        """Its session configuration was confirmed: its age counts from now."""
        conn = self._live(connection_id, now)
        if conn is None or conn.confirmed_ns is not None:
            return
        conn.confirmed_ns = now
        if connection_id == self._next and self.stage is Stage.OPENING:
            if self.options.client_commits:
                self.stage = Stage.ARMED  # open but passive until the switch (RO5)
            else:
                self._start_input(conn)
                self._overlap_end = now + self.options.overlap_ms * _NS_PER_MS
                self.stage = Stage.OVERLAP
        self._advance(now)

    def speech_started(self, connection_id: str, at_ms: int, now: int) -> None:
        """That connection's server VAD heard the caller begin (`at_ms` on the session timeline)."""
        conn = self._live(connection_id, now)
        if conn is not None:
            conn.in_speech = True
            self._advance(now)

    def speech_stopped(self, connection_id: str, at_ms: int, now: int) -> None:
        conn = self._live(connection_id, now)
        if conn is None:
            return
        was_speaking, conn.in_speech = conn.in_speech, False
        if not self.options.client_commits:
            conn.busy = conn.busy or was_speaking  # server VAD answers the utterance
            if connection_id == self._current and now >= self._ages(conn)[0]:
                self._boundary = True
        self._advance(now)

    def flush(self, now: int) -> None:
        """Client commits: the application committed the input buffer (an utterance boundary, RO5)."""
        self._now = max(self._now, now)
        for connection_id in self.audio_targets():
            self._conns[connection_id].busy = True  # the committed utterance gets an answer
        if self.options.client_commits and self.stage is Stage.ARMED:
            self._switch(now, commit=False)
        self._advance(now)

    def items_pending(self, connection_id: str, now: int) -> None:
        """The connection started output of its own (e.g. a response the application asked for)."""
        conn = self._live(connection_id, now)
        if conn is not None:
            conn.busy = True

    def items_finished(self, connection_id: str, now: int) -> None:
        """The connection has no assistant output pending: its response is done and played."""
        conn = self._live(connection_id, now)
        if conn is not None:
            conn.busy = False
            self._advance(now)

    def session_expiring(self, connection_id: str, time_left_ms: int, now: int) -> None:
        """The provider ends this connection in `time_left_ms` (Gemini goAway): its cap is now + time left."""
        conn = self._live(connection_id, now)
        if conn is None:
            return
        cap_at = now + max(0, time_left_ms) * _NS_PER_MS
        if conn.cap_at is None or cap_at < conn.cap_at:
            conn.cap_at, conn.expiring_ns = cap_at, now
        self._advance(now)

    def approve_answered(self, rollover_id: str, approved: bool | None, error: str | None, now: int) -> None:
        """The approve hook resolved (`approved`), raised (`error`), or did neither in time (late)."""
        self._now = max(self._now, now)
        if self.stage is not Stage.APPROVING or rollover_id != self._rollover_id:
            self.stats.late_answers += 1
            return
        if error is not None or approved is not True:
            self._refuse("approve_error" if error is not None else "approve_refused")
        else:
            assert self._next is not None
            self._emit(Authorize(self._next))
            self.stage = Stage.AUTHORIZING
        self._advance(now)

    def authorize_answered(self, connection_id: str, ok: bool, now: int) -> None:
        self._now = max(self._now, now)
        if self.stage is not Stage.AUTHORIZING or connection_id != self._next:
            self.stats.late_answers += 1
            return
        if not ok:
            self._refuse("authorize_refused")
        elif self.options.client_commits:
            self._open()  # passive until the switch
        else:
            self.stage = Stage.ARMED
        self._advance(now)

    def transcript(self, connection_id: str, start_ms: int, end_ms: int, text: str, final: bool,
                   now: int) -> None:
        """Caller text with the utterance's times on the session timeline; interim when not `final`."""
        conn = self._live(connection_id, now)
        if conn is None:
            return
        hand = self._hand
        shared = hand is not None and connection_id == hand.new and (
            hand.shared_until_ms is None or start_ms < hand.shared_until_ms)
        if not final:
            if shared:
                self.stats.interim_suppressed += 1
            elif text:
                self._emit(EmitInterim(connection_id, start_ms, end_ms, text))
            return
        key = (connection_id, start_ms, end_ms)
        if key in self._finals:
            return
        self._finals.add(key)
        if hand is not None and connection_id == hand.old:
            self._old_result(hand, start_ms, end_ms, text if text.strip() else None)
        elif hand is not None and shared:
            self._new_shared(hand, start_ms, end_ms, text, now)
        elif text.strip():
            self._emit(EmitUtterance(connection_id, start_ms, end_ms, text))
        self._advance(now)

    def transcript_failed(self, connection_id: str, start_ms: int, end_ms: int, now: int) -> None:
        conn = self._live(connection_id, now)
        if conn is not None and self._hand is not None and connection_id == self._hand.old:
            self._old_result(self._hand, start_ms, end_ms, None)
            self._advance(now)

    # --- rules -----------------------------------------------------------------------------------------------
    def _advance(self, now: int) -> None:
        self._now = max(self._now, now)
        for _ in range(32):  # each step changes the stage or empties something: a handful at most
            if not self._step(self._now):
                return

    def _step(self, now: int) -> bool:
        hand, opts = self._hand, self.options
        if hand is not None and any(p.due_ns <= now for p in hand.pending):
            for p in [p for p in hand.pending if p.due_ns <= now]:
                self._fallback(hand, p)  # RO3: the old one's text never came
            return True
        cur = self._conns[self._current]
        after, deadline, hard, close_by = self._ages(cur)
        st = self.stage
        if st is Stage.STEADY and now >= after:
            self._begin(cur)
        elif st is Stage.ARMED and opts.client_commits:
            if now < deadline:
                return False
            self._switch(now, commit=True)  # RO5: no flush by the deadline
        elif st in (Stage.APPROVING, Stage.AUTHORIZING, Stage.ARMED, Stage.OPENING) and now >= hard:
            self._refuse({Stage.APPROVING: "approve_timeout",
                          Stage.AUTHORIZING: "authorize_timeout"}.get(st, "next_not_open"))
        elif st is Stage.ARMED and (now >= deadline or (self._boundary and not cur.in_speech)):
            self._open()  # RO1
        elif st is Stage.OVERLAP and (now >= hard or (now >= self._overlap_end and not cur.in_speech)):
            if cur.in_speech:
                self._emit(Commit(cur.id))  # RO2: hard stop in mid-utterance
                cur.busy = True
            self._stop_input(cur)
            self._stop_ns = now
            assert hand is not None
            hand.shared_until_ms = self._ms(now)
            self.stage = Stage.DRAINING
        elif st is Stage.DRAINING and hand is not None:
            return self._drain(hand, now)
        elif st is Stage.REFUSED and self._stop_ns == _NEVER and now >= hard:
            self._stop_input(cur)  # RO6: kept until the hard stop; now it finishes its items
            self._stop_ns = now
        elif st is Stage.REFUSED and self._stop_ns != _NEVER and (not cur.busy or now >= self._drain_by(cur)):
            self._emit(EndSession(self._refusal or "rollover_refused"))
            self._close(cur, self._refusal or "rollover_refused")
            self.stage = Stage.ENDED
        else:
            return False
        return True

    def _drain(self, hand: _Handover, now: int) -> bool:
        old, new = self._conns[hand.old], self._conns[hand.new]
        close_by = self._ages(old)[3]
        if self._current == old.id:
            if old.busy and now < self._drain_by(old):
                return False
            self._current = new.id  # RO8: the old one stopped input and finished (or ran out of time)
            self._emit(TakeFloor(new.id))
            return True
        if hand.pending and now < close_by:
            return False  # the old one's text may still come (RO3)
        self._close(old, "rollover")
        for p in list(hand.pending):
            self._fallback(hand, p)
        self._finals = {k for k in self._finals if k[0] != old.id}
        self._next, self._boundary, self._stop_ns = None, False, _NEVER
        self.stats.rollovers += 1
        self.stage = Stage.STEADY
        return True

    def _begin(self, cur: _Conn) -> None:
        self._started += 1
        self._seq += 1
        self._rollover_id, self._next = f"rollover-{self._started}", f"{self._prefix}{self._seq}"
        self._emit(RequestApproval(self._rollover_id, cur.id, self._next))
        self.stage = Stage.APPROVING

    def _open(self) -> None:
        assert self._next is not None
        self._conns[self._next] = _Conn(self._next)
        self._hand = _Handover(self._current, self._next)
        self._emit(OpenConnection(self._next, seeded=True))
        self.stage = Stage.OPENING

    def _switch(self, now: int, commit: bool) -> None:
        """RO5: the old one stops hearing the caller at the instant the new one starts: no overlap."""
        old, new, hand = self._conns[self._current], self._conns[self._next or ""], self._hand
        assert hand is not None
        if commit:
            self._emit(Commit(old.id))
            old.busy = True
        self._stop_input(old)
        self._start_input(new)
        hand.shared_until_ms = self._ms(now)
        self._stop_ns = now
        self.stage = Stage.DRAINING

    def _refuse(self, reason: str) -> None:
        """RO6/RO7: no next connection; the current one carries the call until its hard stop."""
        self._refusal = reason
        self.stats.refusals[reason] += 1
        if self._next in self._conns:
            self._close(self._conns[self._next], reason)
        self.stage = Stage.REFUSED

    def _old_result(self, hand: _Handover, start_ms: int, end_ms: int, text: str | None) -> None:
        """The old connection's transcription of an utterance: text, or None when it failed or was empty."""
        span = (start_ms, end_ms)
        emitted = text is not None and not any(self._same(span, s) for s in hand.new_emitted)
        hand.old_outcomes.append((start_ms, end_ms, emitted))
        if text is None:
            for p in [p for p in hand.pending if self._same(span, (p.start_ms, p.end_ms))]:
                self._fallback(hand, p)
        elif emitted:
            self._emit(EmitUtterance(hand.old, start_ms, end_ms, text))
            matched = [p for p in hand.pending if self._same(span, (p.start_ms, p.end_ms))]
            hand.pending = [p for p in hand.pending if p not in matched]
            self.stats.duplicates_dropped += len(matched)
        else:
            self.stats.duplicates_dropped += 1

    def _new_shared(self, hand: _Handover, start_ms: int, end_ms: int, text: str, now: int) -> None:
        """The new connection's final text of an utterance the old one heard too (RO3)."""
        if not text.strip():
            return
        span = (start_ms, end_ms)
        outcomes = [ok for s, e, ok in hand.old_outcomes if self._same(span, (s, e))]
        if any(outcomes):
            self.stats.duplicates_dropped += 1
            return
        pending = _Pending(start_ms, end_ms, text, now + self.options.transcript_wait_ms * _NS_PER_MS)
        hand.pending.append(pending)
        if outcomes or self._conns[hand.old].closed:  # the old one failed, was empty, or can no longer answer
            self._fallback(hand, pending)

    def _fallback(self, hand: _Handover, p: _Pending) -> None:
        hand.pending.remove(p)
        hand.new_emitted.append((p.start_ms, p.end_ms))
        self.stats.fallbacks += 1
        self._emit(EmitUtterance(hand.new, p.start_ms, p.end_ms, p.text))

    # --- helpers ---------------------------------------------------------------------------------------------
    def _ages(self, conn: _Conn) -> tuple[int, int, int, int]:
        """(after, deadline, hard stop, close-by) of a connection as instants; never while unconfirmed."""
        o = self.options
        marks = (o.after_ms, o.deadline_ms, o.hard_stop_ms, (o.hard_stop_ms + o.cap_ms) // 2)
        base = conn.confirmed_ns
        at = [_NEVER if base is None else base + m * _NS_PER_MS for m in marks]
        if conn.cap_at is not None:  # squeeze what is left of the schedule (after -> cap) into the time left
            left, span = conn.cap_at - conn.expiring_ns, o.cap_ms - o.after_ms
            at = [min(a, conn.expiring_ns + left * (m - o.after_ms) // span) for a, m in zip(at, marks)]
        return at[0], at[1], at[2], at[3]

    def _drain_by(self, conn: _Conn) -> int:
        """When a connection that stopped input gives up the floor even if it still holds items."""
        return min(self._stop_ns + self.options.drain_ms * _NS_PER_MS, self._ages(conn)[3])

    def _same(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        slack = self.options.match_slack_ms
        return abs(a[0] - b[0]) <= slack or abs(a[1] - b[1]) <= slack

    def _live(self, connection_id: str, now: int) -> _Conn | None:
        self._now = max(self._now, now)
        conn = self._conns.get(connection_id)
        if conn is None or conn.closed:
            self.stats.ignored += 1
            return None
        return conn

    def _start_input(self, conn: _Conn) -> None:
        conn.receiving = True
        self._emit(StartInput(conn.id))

    def _stop_input(self, conn: _Conn) -> None:
        if conn.receiving:
            conn.receiving = False
            self._emit(StopInput(conn.id))

    def _close(self, conn: _Conn, reason: str) -> None:
        conn.closed, conn.receiving = True, False
        self._emit(CloseConnection(conn.id, reason))

    def _ms(self, now: int) -> int:
        return (now - self.start_ns) // _NS_PER_MS

    def _emit(self, action: Action) -> None:
        self._actions.append(action)
