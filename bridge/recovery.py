"""Hard-limit recovery (seed 000, DESIGN §6 HR1–HR13): repair the voice path while the call stays up.

When the provider's output overflows the reservoir or goes stale, or its connection is lost without a
proper end, the session does not hang up. It quarantines the old transport (its output and events become
inert), clears everything unplayed through the playback barrier, and opens ONE replacement connection with a
fresh handshake, seeded with context. Until the replacement is ready the caller's frames are discarded and
counted (never replayed faster than real time); once it is ready the session waits for the caller to speak
again before it considers the voice path repaired. The whole repair has a budget of 5 s: past it, or with a
replacement that cannot be opened, the session fails with a clear reason.

This module is the bookkeeping: stages, the deadline, the counters and what `status()["output_recovery"]`
shows. The coordinator applies the rules; the session shell opens the connection.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

_NS_PER_MS = 1_000_000

RECOVERY_BUDGET_MS = 5_000
RECOVERY_NOTICE = (
    "The audio connection to the caller was interrupted for a moment and has just been restored. Start by "
    "telling the caller, in one short sentence, that there was a brief audio problem, and ask them to repeat "
    "what they said last."
)


class Stage(enum.Enum):
    RECONNECTING = "reconnecting"  # the replacement connection is being opened
    AWAITING_USER = "awaiting_user"  # it is open; fresh caller speech has not been heard yet


@dataclass(frozen=True, slots=True)
class RecoverySnapshot:
    """What the replacement connection is seeded with (HR3, HR7): bounded, caller side only."""

    caller_text: tuple[str, ...]  # recent final caller transcripts, oldest first
    facts: tuple[str, ...] = ()  # current task facts and verified results (from the application)


@dataclass(slots=True)
class Recovery:
    token: int  # the replacement's transport token
    cause: str
    started_ns: int
    started_ms: int  # on the session timeline
    stage: Stage = Stage.RECONNECTING
    discarded_frames: int = 0  # caller frames discarded while no connection could take them (HR8)
    dropped_bytes: int = 0  # output dropped when the old transport was quarantined (HR2)
    fresh_speech: bool = False  # the caller began to speak after the replacement was ready

    def status(self) -> dict[str, object]:
        return {"token": self.token, "cause": self.cause, "started_at": self.started_ms, "stage": self.stage.value}


@dataclass(slots=True)
class RecoveryStats:
    by_cause: Counter[str] = field(default_factory=Counter)
    completed: int = 0
    failed: int = 0
    ignored: int = 0  # conditions reported while a recovery was already running (still one worker)
    interrupted: int = 0  # replacements lost before the caller spoke again (a new recovery took over)
    durations_ms: list[int] = field(default_factory=list)  # from the condition to the caller speaking again
    reconnect_ms: list[int] = field(default_factory=list)  # from the condition to the replacement being ready
    dropped_bytes: int = 0
    discarded_frames: int = 0


class OutputRecovery:
    """At most one recovery at a time, with its deadline."""

    def __init__(self, budget_ms: int = RECOVERY_BUDGET_MS) -> None:
        self.budget_ns = budget_ms * _NS_PER_MS
        self.active: Recovery | None = None
        self.stats = RecoveryStats()

    def begin(self, cause: str, token: int, now: int, now_ms: int, dropped_bytes: int) -> Recovery | None:
        """Start a recovery, or None while a replacement is being opened (HR5: at most one replacement
        worker). A replacement that is already up but fails before the caller spoke again is replaced in turn:
        its recovery ends as interrupted and a new one, with a new budget, begins."""
        if self.reconnecting:
            self.stats.ignored += 1
            return None
        if self.active is not None:
            self.stats.interrupted += 1
        self.active = Recovery(token, cause, now, now_ms, dropped_bytes=dropped_bytes)
        self.stats.by_cause[cause] += 1
        self.stats.dropped_bytes += dropped_bytes
        return self.active

    @property
    def reconnecting(self) -> bool:
        return self.active is not None and self.active.stage is Stage.RECONNECTING

    def replacement_ready(self, token: int, now: int) -> Recovery | None:
        """The replacement's session is confirmed: caller audio may flow to it again."""
        active = self.active
        if active is None or active.token != token or active.stage is not Stage.RECONNECTING:
            return None
        active.stage = Stage.AWAITING_USER
        self.stats.reconnect_ms.append((now - active.started_ns) // _NS_PER_MS)
        self.stats.discarded_frames += active.discarded_frames
        return active

    def caller_started(self) -> None:
        """The caller began to speak; once the replacement is ready, this is fresh speech."""
        if self.active is not None and self.active.stage is Stage.AWAITING_USER:
            self.active.fresh_speech = True

    def caller_spoke(self, now: int) -> Recovery | None:
        """A caller turn that began after the replacement was ready has ended: the voice path is repaired."""
        active = self.active
        if active is None or active.stage is not Stage.AWAITING_USER or not active.fresh_speech:
            return None
        self.active = None
        self.stats.completed += 1
        self.stats.durations_ms.append((now - active.started_ns) // _NS_PER_MS)
        return active

    def deadline(self) -> int | None:
        """When the replacement must be ready (the 5 s budget includes the playback barrier)."""
        return self.active.started_ns + self.budget_ns if self.reconnecting and self.active else None

    def expired(self, now: int) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def fail(self) -> Recovery | None:
        active, self.active = self.active, None
        if active is not None:
            self.stats.failed += 1
        return active

    def status(self) -> dict[str, object] | None:
        return self.active.status() if self.active is not None else None
