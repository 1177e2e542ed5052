"""The session's logical timeline: milliseconds since the call's session began, whatever the transports do.

Providers stamp transcripts and delegations on their own clocks (GPT-Live: ms since *its* session started;
OpenAI VAD events: ms of audio appended to *that* connection). Connections come and go — recovery replaces
them, rollover overlaps them — but the session's timeline does not restart. Each connection is registered with
the timeline position where its own clock began, and every provider time is rebased onto the session's (SE6,
HR11). Frames are stamped from the monotonic clock the same way.
"""

from __future__ import annotations

_NS_PER_MS = 1_000_000


class Timeline:
    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self._origins: dict[int, int] = {}  # transport token -> session ms at which its clock reads 0

    def ms(self, now_ns: int) -> int:
        """Session time of a monotonic instant."""
        return (now_ns - self.start_ns) // _NS_PER_MS

    def connection_started(self, token: int, now_ns: int) -> None:
        """A connection's clock starts now (its session was confirmed)."""
        self._origins[token] = self.ms(now_ns)

    def rebase(self, token: int, provider_ms: int | None, now_ns: int) -> int:
        """A provider time on connection `token` as session time; unknown times become "now"."""
        origin = self._origins.get(token)
        if provider_ms is None or origin is None:
            return self.ms(now_ns)
        return origin + provider_ms
