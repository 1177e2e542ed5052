"""The session's logical timeline: milliseconds since the call's session began, whatever the transports do.

Providers stamp transcripts and delegations on their own clocks (GPT-Live: ms since *its* session started;
OpenAI VAD events: ms of audio appended to *that* connection). Connections come and go — recovery replaces
them, rollover overlaps them — but the session's timeline does not restart. Every provider time is rebased
onto the session's (SE6, HR11). Frames are stamped from the monotonic clock the same way.

A provider's clock counts the caller audio it was sent, not the time that passed (providers.md: "derived
from bytes, not wall clock"). The two part whenever audio was not sent: the caller was on hold, HR8 discarded
it during a repair, or the session's loop fell behind and shed frames. So the timeline keeps the *audio map*
(bounded): each caller frame forwarded to the connections is counted (`fed`), and a *mark* is kept where the
forwarded audio restarted after such a gap, as (audio position, session time minus audio position). A
connection is registered with the audio position at which its clock began (`connection_started`), and a
provider time p on it is the audio position origin + p, on the session timeline through the mark that holds
it; until a frame has been forwarded to it, through the instant it started. Within one stretch of continuous
audio the offset is the lowest seen (a frame handled late, or frames handled in a burst after a stall, came
no earlier than they were heard), and a frame later than that by over `GAP_MS` starts a new stretch; a burst
that brings the offset back merges the two again. Beyond `MARKS_KEPT` stretches two neighbours are merged
(`_thin`), never the oldest dropped: a position older than every kept mark was rebased through its connection's
start, seconds early once the caller's audio had come short for a while.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from typing import Protocol

from bridge.engine.commands import AudioDiscontinuity, Outbox, Transcript
from providers.events import InputTranscript, OutputTranscript, ProviderEvent
from rtp.units import NS_PER_MS

_FRAME_MS = 20
ORIGINS_KEPT = 32  # bounded: connections whose clock origin is kept (the most recently used ones)
MARKS_KEPT = 64  # bounded: stretches of continuous caller audio kept (old ones merged, `_thin`)
GAP_MS = 100  # a forwarded frame this much later than its stretch's audio says starts a new stretch
BOUNDS_KEPT = 8  # turn ends and hand-overs kept to split caption groups at (whose fragments may still wait)
# S1: a floor connection that sent nothing for this long before a fault may not have heard the caller at all.
UNHEARD_SILENCE_MS = 1_000
UNTOLD_TURNS_KEPT = 8  # S1: the caller's latest turn starts kept, to find the earliest whose text is not in


class Timeline:
    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        # transport token -> (audio position at which its clock reads 0, session ms minus that position then)
        self._origins: dict[int, tuple[int, int]] = {}
        self.fed_ms = 0  # caller audio forwarded to the provider connections so far
        self._marks: deque[list[int]] = deque()  # [audio position, session ms minus it]; at most MARKS_KEPT

    def instant(self, at_ms: int | None) -> int | None:
        """A time on the session timeline as a monotonic instant (ns); None stays None."""
        return None if at_ms is None else self.start_ns + at_ms * NS_PER_MS

    def ms(self, now_ns: int) -> int:
        """Session time of a monotonic instant."""
        return (now_ns - self.start_ns) // NS_PER_MS

    def fed(self, now_ns: int) -> None:
        """One 20 ms caller frame was forwarded to the connections now (every caller frame: no allocation but
        at the start of a stretch)."""
        fed = self.fed_ms
        offset = (now_ns - self.start_ns) // NS_PER_MS - fed
        self.fed_ms = fed + _FRAME_MS
        marks = self._marks
        if not marks:
            marks.append([fed, offset])
            return
        last = marks[-1]
        if offset > last[1] + GAP_MS:  # audio was not forwarded for a while: a new stretch
            marks.append([fed, offset])
            if len(marks) > MARKS_KEPT:
                self._thin()
        elif offset < last[1]:  # earlier than the stretch's estimate: the estimate was late
            last[1] = offset
            if len(marks) > 1 and offset <= marks[-2][1] + _FRAME_MS:
                marks.pop()  # a burst after a stall: no audio was missing after all

    def _thin(self) -> None:
        """One stretch too many: merge the one whose step (the audio missing before it) weighs least against
        its age into the one before it. A live connection may still stamp audio older than the newest
        `MARKS_KEPT` stretches (the start of a long utterance, after the caller's audio came short for a while:
        a stretch every 100 ms), and dropping the oldest mapped such a time through the connection's start,
        seconds early (campaign seed 756114676: three utterances logged before the one logged before them).
        Merged, the stretch's audio maps early by its step at most; recent stretches and long gaps (a hold, a
        repair) are the dearest to merge, so they stay exact, and the first mark (audio 0) is never merged."""
        marks, fed = self._marks, self.fed_ms
        best, best_cost = 1, -1.0
        for i in range(1, len(marks) - 1):  # the newest stretch is still growing: never merged
            cost = (marks[i][1] - marks[i - 1][1]) / (fed - marks[i][0] + _FRAME_MS)
            if best_cost < 0 or cost < best_cost:
                best, best_cost = i, cost
        del marks[best]

    def connection_started(self, token: int, now_ns: int) -> None:
        """A connection's clock starts now (its session was confirmed), at the audio forwarded next.
        Bounded: only the `ORIGINS_KEPT` most recently used are kept. The live ones — the floor, a rollover's
        one or two listeners — are among them: every rebase keeps its connection's origin fresh, and the rest
        are gone, their events inert (HR2)."""
        origins = self._origins
        origins.pop(token, None)
        origins[token] = (self.fed_ms, self.ms(now_ns) - self.fed_ms)
        while len(origins) > ORIGINS_KEPT:
            del origins[next(iter(origins))]

    def span(
        self, token: int, start_ms: int | None, end_ms: int | None, now_ns: int
    ) -> tuple[int, int | None]:
        """A provider span as session times: the start as `rebase`, the end only if the provider gave one."""
        end = None if end_ms is None else self.rebase(token, end_ms, now_ns)
        return self.rebase(token, start_ms, now_ns), end

    def rebase(self, token: int, provider_ms: int | None, now_ns: int) -> int:
        """A provider time on connection `token` as session time; unknown times become "now"."""
        origins = self._origins
        origin = origins.get(token)
        if origin is None or provider_ms is None:
            return self.ms(now_ns)
        if next(reversed(origins)) != token:  # the most recently used last (a dict lookup when it is already)
            origins[token] = origins.pop(token)
        start, offset = origin
        position = start + provider_ms
        for mark in reversed(self._marks):  # the newest first: what providers stamp is recent
            if mark[0] <= position:
                # a stretch that began before this connection counts once audio went on to it
                if mark[0] >= start or self.fed_ms > start:
                    offset = mark[1]
                break
        return position + offset


class Captions:
    """Caller and assistant captions for the application (SE6, HR11, the emission of RO3/RO4).

    Each transcript is emitted once, stamped on the session timeline, with its grouping epoch: a recovery or a
    change of floor starts a fresh epoch, so old fragments never merge into the repaired reply (HR11). GPT-Live
    sends caller captions as timed fragments and never a final one: the fragments of one caller turn (by the
    local detector) are grouped per connection and closed `close_ms` after the turn. Recent final caller text
    is kept (bounded) for the seed of a further connection (HR7).

    A group never spans the end of a caller turn (S1, RO3): a fragment of one turn can arrive after the next
    turn began (a provider's captions lag its audio), and the groups close together `close_ms` after the later
    turn; each fragment belongs to the turn whose end comes after its start, and each turn's fragments are
    one utterance. (Merged, a rollover's next connection's text of an old turn's last words and of the new turn
    matched the old connection's text of the old turn, and the new turn was dropped as its duplicate.) Nor does
    a group span the instant a rollover's old connection stopped hearing the caller (`boundary`): the next
    connection's words before it the old one heard too (RO3 matches them), those after are its own, however
    short the caller's pause there (the local detector's turn may go on through it). A fragment that straddles
    the instant goes with its start (at most one fragment's words of the caller talking through a hard stop).
    """

    def __init__(self, out: Outbox, *, close_ms: int, fragments: bool) -> None:
        self._out = out
        self._grouped = fragments  # caller captions arrive as timed fragments (no server VAD: GPT-Live)
        self._close_ns = close_ms * NS_PER_MS
        self.epoch = 0
        self._caller_text: deque[str] = deque(maxlen=5)
        self.told_to_ms = 0  # the end of the latest caller utterance emitted (S1: what is accounted for)
        self._fragments: dict[int, list[tuple[str, int, int]]] = {}
        self._due: int | None = None
        self._bounds: deque[int] = deque(maxlen=BOUNDS_KEPT)  # session ms: the latest turns' ends, hand-overs

    def new_epoch(self) -> None:
        self.epoch += 1

    def recent_caller_text(self) -> tuple[str, ...]:
        return tuple(self._caller_text)

    def caller(self, text: str, at_ms: int, final: bool, end_ms: int | None = None) -> None:
        """A caller transcript for the application: emitted once, whichever connection heard it (RO3). An end
        equal to the start is a turn whose end nothing reported (a caption with no times of its own while the
        turn was under way, as Gemini's at a rollover's hard stop, RO2): the application is told its end is not
        known, not a span of no length that ends where it began (HR11)."""
        if end_ms == at_ms:
            end_ms = None
        self._out.notices.append(Transcript("caller", text, at_ms, final, self.epoch, end_ms))
        if final and text.strip():
            self._caller_text.append(text.strip()[:500])
            self.told_to_ms = max(self.told_to_ms, at_ms if end_ms is None else end_ms)

    def assistant(self, text: str, at_ms: int, final: bool) -> None:
        self._out.notices.append(Transcript("assistant", text, at_ms, final, self.epoch))

    def transcript(
        self,
        event: InputTranscript | OutputTranscript,
        timeline: Timeline,
        now: int,
        *,
        speaking: bool,
        emit: bool,
    ) -> bool:
        """A transcript of the connection holding the floor: an assistant caption is emitted; a caller one is
        kept (a timed fragment) or emitted (`emit`: no rollover controller decides which connection's text is
        emitted, RO3). True for a final caller text: the caller's turn is over."""
        if isinstance(event, OutputTranscript):
            self.assistant(event.text, timeline.rebase(event.token, event.start_ms, now), event.final)
            return False
        if self.fragment(event, timeline, now, speaking=speaking):
            return False
        if emit:
            start, end = timeline.span(event.token, event.start_ms, event.end_ms, now)
            self.caller(event.text, start, event.final, end)
        return event.final and bool(event.text.strip())

    def fragment(self, event: ProviderEvent, timeline: Timeline, now: int, *, speaking: bool) -> bool:
        """A timed caption fragment is kept until the caller's turn is over; False for anything else."""
        if not isinstance(event, InputTranscript) or event.final or not self._grouped:
            return False
        start = timeline.rebase(event.token, event.start_ms, now)
        end = timeline.rebase(event.token, event.end_ms, now) if event.end_ms is not None else start
        self._fragments.setdefault(event.token, []).append((event.text, start, end))
        if self._due is None and not speaking:
            self._due = now + self._close_ns  # a late fragment
        return True

    def turn_over(self, now: int, at_ms: int | None = None) -> None:
        """The caller's turn ended (at session time `at_ms`, where known: the fragments are split there)."""
        self._due = now + self._close_ns
        if at_ms is not None:
            self.boundary(at_ms)

    def boundary(self, at_ms: int) -> None:
        """No group spans this instant (session ms): a caller turn ended, or a rollover's old connection stopped
        hearing the caller."""
        if not self._bounds or at_ms >= self._bounds[-1]:
            self._bounds.append(at_ms)

    def due(self, now: int) -> bool:
        return self._due is not None and now >= self._due

    def close(self) -> list[tuple[int, str, int, int]]:
        """Each connection's fragments of the last caller turn as one utterance: (token, text, start, end)."""
        self._due = None
        fragments, self._fragments = self._fragments, {}
        return [group for token, parts in fragments.items() for group in self._groups(token, parts)]

    def close_one(self, token: int) -> list[tuple[int, str, int, int]]:
        """One connection's groups now (it is being closed: what it heard is not dropped with it, S1)."""
        parts = self._fragments.pop(token, None)
        if not self._fragments:
            self._due = None
        return self._groups(token, parts) if parts else []

    def _groups(self, token: int, parts: list[tuple[str, int, int]]) -> list[tuple[int, str, int, int]]:
        """A connection's fragments as one utterance per caller turn, the earliest first."""
        turns: dict[int, list[tuple[str, int, int]]] = {}
        for part in parts:
            turns.setdefault(bisect_right(self._bounds, part[1]), []).append(part)
        return [_group(token, turns[turn]) for turn in sorted(turns)]

    def next_deadline(self) -> int | None:
        return self._due


class Unheard:
    """S1: what the caller said that a connection was sent and no emitted text accounts for, told when that
    connection can no longer say it. Keeps where the caller's latest turns began (session ms; the earliest
    after the text told so far, `Captions.told_to_ms`, is the first not accounted for) and when the floor
    last sent anything (`floor_seen`)."""

    def __init__(self, out: Outbox, timeline: Timeline, captions: Captions, now: int) -> None:
        self._out, self._timeline, self._captions = out, timeline, captions
        self.floor_seen = now
        self._turn_starts: deque[int] = deque(maxlen=UNTOLD_TURNS_KEPT)

    def turn_started(self, at_ms: int) -> None:
        self._turn_starts.append(at_ms)

    def recovery(self, now: int) -> None:
        """S1: the caller audio the quarantined floor connection was sent and no emitted text accounts for —
        from the caller's earliest turn not told yet, or, where the connection had gone silent (half-open, a
        stall: it may have heard nothing at all, and without a local detector nobody knows whether the caller
        spoke), from its last sign of life — in one input `audio_discontinuity` with cause `recovery_unheard`.
        Its text can no longer come (its events are inert, HR2), and the replacement hears only what follows
        (HR8, whose own discontinuity counts the frames discarded while it connects)."""
        at, told = self._timeline.ms(now), self._captions.told_to_ms
        start = self._untold(told)
        if now - self.floor_seen >= UNHEARD_SILENCE_MS * NS_PER_MS:
            silent = max(told, self._timeline.ms(self.floor_seen))
            start = silent if start is None else min(start, silent)
        self._turn_starts.clear()
        if start is not None and (frames := (at - start) // _FRAME_MS) > 0:
            self._out.notices.append(AudioDiscontinuity("input", frames, "recovery_unheard", at))

    def rollover_closed(self, until_ms: int, now: int) -> None:
        """S1: a rollover closed its old connection (its close-by age: a provider's goAway may leave no time),
        and its text of a caller turn begun before the next connection heard the caller (`until_ms`) has not
        come: the stretch from that turn's start to `until_ms` is reported in one input `audio_discontinuity`
        with cause `rollover_unheard` (its `at_ms` is the stretch's end). What followed, the next one heard."""
        start = self._untold(self._captions.told_to_ms)
        if start is not None and (frames := (until_ms - start) // _FRAME_MS) > 0:
            self._out.notices.append(AudioDiscontinuity("input", frames, "rollover_unheard", until_ms))
            kept = [at for at in self._turn_starts if at >= until_ms]  # (the next connection heard those)
            self._turn_starts.clear()
            self._turn_starts.extend(kept)

    def _untold(self, told_ms: int) -> int | None:
        """The start of the caller's earliest recent turn that began after the text told so far ended."""
        return min((at for at in self._turn_starts if at > told_ms), default=None)


class Room(Protocol):
    """A room with deadlines of its own: the soonest, monotonic ns (None: none)."""

    def next_deadline(self) -> int | None: ...


class Deadlines:
    """The soonest of a session's deadlines (monotonic ns). `hot`'s is asked every time: the output path's, which
    every caller frame moves. The other `rooms`' and the job ledger's (`ledger_ms`, session ms on `timeline`)
    are asked again only after an input that may have moved one (`moved`); a caller frame that changed no turn
    and made no room act does not."""

    __slots__ = ("_hot", "_rooms", "_timeline", "_ledger_ms", "_known", "_due")

    def __init__(
        self,
        hot: Callable[[], int | None],
        rooms: tuple[Room, ...],
        timeline: Timeline,
        ledger_ms: Callable[[], int | None],
    ) -> None:
        self._hot, self._rooms, self._timeline, self._ledger_ms = hot, rooms, timeline, ledger_ms
        self._known = False
        self._due: int | None = None

    def moved(self) -> None:
        self._known = False

    def soonest(self) -> int | None:
        if not self._known:
            due = self._timeline.instant(self._ledger_ms())
            for room in self._rooms:  # (a loop: asked after most timer ticks)
                if (t := room.next_deadline()) is not None and (due is None or t < due):
                    due = t
            self._due, self._known = due, True
        due, rooms = self._hot(), self._due
        return rooms if due is None or (rooms is not None and rooms < due) else due


def _group(token: int, parts: list[tuple[str, int, int]]) -> tuple[int, str, int, int]:
    return token, "".join(p[0] for p in parts).strip(), min(p[1] for p in parts), max(p[2] for p in parts)
