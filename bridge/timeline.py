"""The session's logical timeline: milliseconds since the call's session began, whatever the transports do.

Providers stamp transcripts and delegations on their own clocks (GPT-Live: ms since *its* session started;
OpenAI VAD events: ms of audio appended to *that* connection). Connections come and go — recovery replaces
them, rollover overlaps them — but the session's timeline does not restart. Each connection is registered with
the timeline position where its own clock began, and every provider time is rebased onto the session's (SE6,
HR11). Frames are stamped from the monotonic clock the same way.
"""

from __future__ import annotations

from collections import deque

from bridge.commands import Outbox, Transcript
from providers.events import InputTranscript, ProviderEvent

_NS_PER_MS = 1_000_000
ORIGINS_KEPT = 32  # issue 17: connections whose clock origin is kept (the most recently used ones)


class Timeline:
    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self._origins: dict[int, int] = {}  # transport token -> session ms at which its clock reads 0

    def instant(self, at_ms: int | None) -> int | None:
        """A time on the session timeline as a monotonic instant (ns); None stays None."""
        return None if at_ms is None else self.start_ns + at_ms * _NS_PER_MS

    def ms(self, now_ns: int) -> int:
        """Session time of a monotonic instant."""
        return (now_ns - self.start_ns) // _NS_PER_MS

    def connection_started(self, token: int, now_ns: int) -> None:
        """A connection's clock starts now (its session was confirmed). Issue 17: only the `ORIGINS_KEPT` most
        recently used are kept. The live ones — the floor, a rollover's one or two listeners — are among them:
        every rebase keeps its connection's origin fresh, and the rest are gone, their events inert (HR2)."""
        origins = self._origins
        origins.pop(token, None)
        origins[token] = self.ms(now_ns)
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
        if origin is None:
            return self.ms(now_ns)
        if next(reversed(origins)) != token:  # the most recently used last (a dict lookup when it is already)
            origins[token] = origins.pop(token)
        return self.ms(now_ns) if provider_ms is None else origin + provider_ms


class Captions:
    """Caller and assistant captions for the application (SE6, HR11, the emission of RO3/RO4).

    Each transcript is emitted once, stamped on the session timeline, with its grouping epoch: a recovery or a
    change of floor starts a fresh epoch, so old fragments never merge into the repaired reply (HR11). GPT-Live
    sends caller captions as timed fragments and never a final one: the fragments of one caller turn (by the
    local detector) are grouped per connection and closed `close_ms` after the turn. Recent final caller text
    is kept (bounded) for the seed of a further connection (HR7).
    """

    def __init__(self, out: Outbox, *, close_ms: int, fragments: bool) -> None:
        self._out = out
        self._grouped = fragments  # caller captions arrive as timed fragments (no server VAD: GPT-Live)
        self._close_ns = close_ms * _NS_PER_MS
        self.epoch = 0
        self._caller_text: deque[str] = deque(maxlen=5)
        self._fragments: dict[int, list[tuple[str, int, int]]] = {}
        self._due: int | None = None

    def new_epoch(self) -> None:
        self.epoch += 1

    def recent_caller_text(self) -> tuple[str, ...]:
        return tuple(self._caller_text)

    def caller(self, text: str, at_ms: int, final: bool, end_ms: int | None = None) -> None:
        """A caller transcript for the application: emitted once, whichever connection heard it (RO3)."""
        self._out.notices.append(Transcript("caller", text, at_ms, final, self.epoch, end_ms))
        if final and text.strip():
            self._caller_text.append(text.strip()[:500])

    def assistant(self, text: str, at_ms: int, final: bool) -> None:
        self._out.notices.append(Transcript("assistant", text, at_ms, final, self.epoch))

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

    def turn_over(self, now: int) -> None:
        self._due = now + self._close_ns

    def due(self, now: int) -> bool:
        return self._due is not None and now >= self._due

    def close(self) -> list[tuple[int, str, int, int]]:
        """Each connection's fragments of the last caller turn as one utterance: (token, text, start, end)."""
        self._due = None
        fragments, self._fragments = self._fragments, {}
        return [
            (token, "".join(p[0] for p in parts).strip(), min(p[1] for p in parts), max(p[2] for p in parts))
            for token, parts in fragments.items()
        ]

    def next_deadline(self) -> int | None:
        return self._due
