"""Hard-limit recovery (seed 000, DESIGN §6 HR1–HR13): repair the voice path while the call stays up.

When the provider's output overflows the reservoir or goes stale, or its connection is lost without a
proper end, the session does not hang up. It quarantines the old transport (its output and events become
inert), clears everything unplayed through the playback barrier, and opens ONE replacement connection with a
fresh handshake, seeded with context. Until the replacement is ready the caller's frames are discarded and
counted (never replayed faster than real time); once it is ready the session waits for the caller to speak
again before it considers the voice path repaired. The whole repair has a budget of 5 s: past it, or with a
replacement that cannot be opened, the session fails with a clear reason.

`OutputRecovery` is the bookkeeping (stages, the deadline, the counters, `status()["output_recovery"]`);
`RecoveryController` applies the rules: condition -> replacement -> ready -> awaiting the caller -> done or
failed, with the half-open watchdog and the seed of the replacement (`seeded_settings`, HR7). The session
shell only opens the connection it is told to.

Hold and ringing are not media conditions (S7). While the caller holds the call, or an outbound call still
rings, nothing plays: the reservoir is paused (bridge/engine/reservoir.py), so neither overflow nor staleness is
reported, and the silence watchdog is neither armed nor left armed (`pause`): a provider that owes no answer
to a line that hears nothing is not half-open. A connection that is lost meanwhile is a fault of its own and
is repaired as at any time; a repair already under way when the hold begins goes on, inside its 5 s budget,
and completes with the caller's first fresh turn after the resume (HR13).

Where the rules are silent: a provider with `Capabilities.resumption` continues the conversation by the
latest resumable handle the lost connection announced; if the provider refuses the handle, the replacement is
opened once more, reseeded without it, inside the same 5 s budget. A rollover's next connection opens while
the old one is still open, so it resumes by the handle only where the provider allows that
(`Capabilities.resumption_while_open`; Gemini does not): otherwise it is reseeded at once (`seeds`).

A recovery during a rollover quarantines its next connection with the floor and opens one replacement, as any
recovery (no promotion of the next one); before the replacement is seeded, the next connection's caller text
still waiting for the old one's is emitted, and what it alone heard in the hand-over is reported as an input
discontinuity (S1; the rule and its reasons are in bridge/engine/rollover.py, "Seams").

A tail is not a fresh turn (HR7, HR10, HR13). The replacement hears only what follows its ready instant
(HR8): a caller still speaking then is finishing the sentence the lost connection heard the start of, which
HR7's notice asks them to repeat. Only the caller's first turn that begins after the replacement is ready
opens HR10's fresh interval and completes the repair. The local detector hears every frame, so its turn under
way simply goes on (no new start); a server-VAD provider's replacement, though, reports a speech start of its
own at the first audio it hears. That start is the tail's, not a fresh one, when the caller's turn was under
way at the ready instant:
- a start the replacement stamps (Realtime's `audio_start_ms`) once it has been sent caller audio: the stamp
  decides. At or within `TAIL_FRAMES` frames of the ready instant, the speech ran from its first audio on and
  began before it was ready (heard by the lost connection, or discarded while the replacement connected, HR8),
  even where no start was reported before; later, the replacement heard silence first, and the start is fresh
  whatever the lost connection last reported (a caller who fell silent while the replacement connected:
  nobody heard that end).
- a start with no time of its own (Gemini's, xAI's where it sends none): it says nothing of when the speech
  began. It is the tail's when a caller start with no end since (by any source: the local detector, where it
  runs, hears every frame) came before it and the replacement has sent no audio yet.
Where the rules are silent, the choice: a post-repair tail is not a new request. A tool call the model makes
for it stays held (HR10), and at the caller's next, fresh turn it is not run and the model is told to ask
again (`NOT_RUN_STALE`): the caller's words were cut, the request may be incomplete, and the start of the
sentence went to the lost connection, which may already have asked for it (S2: one request, one job). The
tail's end neither completes the repair nor arms the silence watchdog (`expect_answer`). Once the replacement
has sent audio (the recovery notice), the caller's next start with no time of its own answers it and is
fresh (played, or dropped by a suppression the lost connection's turn left: the model spoke to a silent
line, no sentence was under way). The costs: a caller who
begins a new sentence so soon after the ready instant that the provider stamps it at its first audio
(Realtime's stamp includes its prefix padding, about 300 ms) is taken for a tail and asked to repeat; so is,
with a provider that stamps nothing and no local detector, a caller who fell silent while the replacement
connected and speaks again before it said anything (the lost connection's open start is all there is).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.engine.commands import (
    AudioDiscontinuity,
    CloseTransport,
    ConditionDetected,
    OpenReplacement,
    Outbox,
    RecoveryChanged,
    RecoverySnapshot,
    Reseeded,
)
from bridge.engine.connections import Connections, connection_id
from bridge.engine.delegations import Delegations, seed_facts
from bridge.engine.reservoir import MediaCondition, OutputOverflow, OutputPath
from bridge.engine.timeline import Captions
from providers.base import Capabilities, SessionSettings
from rtp.audio import FRAME_MS
from rtp.units import NS_PER_MS

__all__ = ["RECOVERY_NOTICE", "RecoveryController", "RecoverySnapshot", "Stage", "seeded_settings"]

TAIL_FRAMES = 2  # a replacement's stamped speech start this close to its ready instant began before it
SEEDED_HISTORY = 20  # messages of the application's history a further connection is seeded with (HR7)

RECOVERY_BUDGET_MS = 5_000
RECOVERY_NOTICE = (
    "The audio connection to the caller was interrupted for a moment and has just been restored. Start by "
    "telling the caller, in one short sentence, that there was a brief audio problem, and ask them to repeat "
    "what they said last."
)


class Stage(enum.Enum):
    RECONNECTING = "reconnecting"  # the replacement connection is being opened
    AWAITING_USER = "awaiting_user"  # it is open; fresh caller speech has not been heard yet


def seeded_settings(
    original: SessionSettings, snapshot: RecoverySnapshot, *, notice: bool, resume_handle: str | None = None
) -> SessionSettings:
    """HR7: the original instructions, a bounded part of the history, recent caller text and current facts;
    never the assistant's captions as heard messages; with `notice`, a fresh instruction to say what happened.
    With `resume_handle` the provider continues the conversation it had (the seed still goes along)."""
    instructions = original.instructions or ""
    if notice:
        instructions = f"{instructions}\n\n{RECOVERY_NOTICE}".strip()
    history = list(original.history[-SEEDED_HISTORY:])
    history += [("system", f"Verified fact: {fact}") for fact in snapshot.facts]
    history += [("user", text) for text in snapshot.caller_text]
    return SessionSettings(
        instructions=instructions,
        voice=original.voice,
        model=original.model,
        tools=original.tools,
        history=tuple(history),
        turn_detection=original.turn_detection,
        resume_handle=resume_handle,
        language=original.language,
    )


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
    ready_ms: int | None = None  # when the replacement was ready (session ms)
    ready_fed_ms: int = 0  # the caller audio forwarded by then (bridge/engine/timeline.py `fed_ms`)
    under_way: bool = False  # the caller's turn was under way at that instant and has not ended since

    def status(self) -> dict[str, object]:
        return {
            "token": self.token,
            "cause": self.cause,
            "started_at": self.started_ms,
            "stage": self.stage.value,
        }


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
        self.budget_ns = budget_ms * NS_PER_MS
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
        self.stats.reconnect_ms.append((now - active.started_ns) // NS_PER_MS)
        self.stats.discarded_frames += active.discarded_frames
        return active

    def caller_started(self, at_ms: int, open_before: bool, fed_ms: int | None) -> bool:
        """The caller began to speak at `at_ms` (`open_before`: a start with no end since came before it;
        `fed_ms`: the caller audio forwarded so far, for a start the provider stamped; None: unstamped). Once
        the replacement is ready this is fresh speech, unless it is the tail of a turn under way at the ready
        instant (the module's docstring); True when the start is fresh (or no repair waits for one)."""
        active = self.active
        if active is None or active.stage is not Stage.AWAITING_USER or active.fresh_speech:
            return True
        ready = active.ready_ms
        if fed_ms is not None and fed_ms > active.ready_fed_ms and ready is not None:
            tail = (
                at_ms <= ready + TAIL_FRAMES * FRAME_MS
            )  # stamped after audio reached it: the stamp decides
        else:
            tail = open_before and active.under_way
        if tail:
            active.under_way = True  # its end is the tail's
            return False
        active.fresh_speech = True
        return True

    def caller_spoke(self, now: int) -> Recovery | None:
        """A caller turn that began after the replacement was ready has ended: the voice path is repaired."""
        active = self.active
        if active is None or active.stage is not Stage.AWAITING_USER or not active.fresh_speech:
            return None
        self.active = None
        self.stats.completed += 1
        self.stats.durations_ms.append((now - active.started_ns) // NS_PER_MS)
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


Seed = Callable[[], tuple[RecoverySnapshot, str | None]]
"""The seed of a further connection: the snapshot and the resumption handle to continue by (or None)."""


def seed_from(
    connections: Connections, captions: Captions, delegations: Delegations, *, resumption: bool
) -> Seed:
    """HR7/RO8: a further connection is seeded with recent caller text and the current task facts, and resumes
    by the latest valid handle where the provider has resumption."""

    def seed() -> tuple[RecoverySnapshot, str | None]:
        handle = connections.resume_handle if resumption else None
        return RecoverySnapshot(captions.recent_caller_text(), seed_facts(delegations)), handle

    return seed


def seeds(
    connections: Connections, captions: Captions, delegations: Delegations, caps: Capabilities
) -> tuple[Seed, Seed]:
    """The seeds of a recovery's replacement and of a rollover's next connection. The replacement opens once the
    old connection is gone, so it resumes by the handle where the provider has resumption; the next one opens
    beside the old one, which is still open, so it resumes only where the provider honours a handle then
    (Gemini rejects it: the fault campaign lost two calls to RO6's hard stop while a refused attempt and the
    reseeded one after it took two handshakes)."""
    return (
        seed_from(connections, captions, delegations, resumption=caps.resumption),
        seed_from(
            connections, captions, delegations, resumption=caps.resumption and caps.resumption_while_open
        ),
    )


class RecoveryController:
    """HR1-HR3, HR5, HR7 (the seed), HR8, HR13 and the half-open watchdog, for one call."""

    def __init__(
        self,
        out: Outbox,
        connections: Connections,
        output: OutputPath,
        delegations: Delegations,
        seed: Seed,
        afresh: Callable[[int, int], None],
        *,
        answer_within_ms: int | None,
        budget_ms: int = RECOVERY_BUDGET_MS,
    ) -> None:
        self.state = OutputRecovery(budget_ms)
        self._out = out
        self._connections = connections
        self._output = output
        self._delegations = delegations
        self._seed = seed
        self._afresh = (
            afresh  # a replacement starts afresh: new caption epoch (HR11), no rollover in progress
        )
        self._answer_within_ms = answer_within_ms
        self._answer_due: int | None = None  # the silent-provider watchdog's deadline (half-open detection)
        self._paused = False  # S7: the line is held or ringing; the watchdog is off
        self._caller_open = False  # a caller start with no end since, by any source (a tail's test)

    @property
    def reconnecting(self) -> bool:
        return self.state.reconnecting

    @property
    def active(self) -> Recovery | None:
        return self.state.active

    @property
    def stats(self) -> RecoveryStats:
        return self.state.stats

    def _changed(self, recovery: Recovery, stage: str, now: int) -> None:
        elapsed = (now - recovery.started_ns) // NS_PER_MS
        self._out.notices.append(RecoveryChanged(recovery.token, recovery.cause, stage, elapsed))

    def condition(self, condition: MediaCondition, now: int, at_ms: int) -> bool:
        """HR1: overflow and staleness are recoverable media conditions."""
        self._out.notices.append(ConditionDetected(condition, at_ms))
        return self.begin(
            "output_overflow" if isinstance(condition, OutputOverflow) else "output_stale", now, at_ms
        )

    def begin(self, cause: str, now: int, at_ms: int) -> bool:
        """Quarantine the floor connection and open one replacement; True when a new replacement is opened
        (the coordinator then starts the call's connection bookkeeping afresh)."""
        if self.state.reconnecting:
            self.state.begin(cause, self._connections.floor, now, at_ms, 0)  # counted, still one worker (HR5)
            return False
        if self.state.active is not None:  # the replacement itself failed before the caller spoke again
            self._changed(self.state.active, "interrupted", now)
        self._answer_due = None
        # HR2/HR3: quarantine the old transport and clear everything unplayed through the barrier. The
        # suppression state is left as it is: a caller who is speaking stays suppressed.
        dropped = self._output.reservoir.depth_bytes + self._output.framer.pending_bytes
        self._output.clear()
        old = self._connections.floor
        token, quarantined = self._connections.replace_floor()
        recovery = self.state.begin(cause, token, now, at_ms, dropped)
        assert recovery is not None
        self._afresh(old, now)
        self._delegations.recovery_started(old, at_ms)  # HR6, HR9, HR10
        for other in quarantined[1:]:  # a rollover in progress is abandoned; the replacement starts afresh
            self._out.commands.append(CloseTransport(connection_id(other)))
        self._out.commands.append(CloseTransport(connection_id(old)))
        self._open(recovery)
        self._out.notices.append(AudioDiscontinuity("output", dropped, cause, at_ms))
        self._changed(recovery, Stage.RECONNECTING.value, now)
        return True

    def _open(self, recovery: Recovery) -> None:
        snapshot, handle = self._seed()
        self._out.commands.append(
            OpenReplacement(connection_id(recovery.token), recovery.cause, snapshot, handle)
        )

    def resumption_rejected(self, token: int, now: int) -> None:
        """The provider refused the resumption handle: open the replacement once more, reseeded without it
        (still inside the 5 s budget)."""
        active = self.state.active
        if active is None or active.token != token or not self.state.reconnecting:
            return
        self._connections.resume_handle = None
        self._out.notices.append(Reseeded(token, "recovery"))
        self._open(active)

    def replacement_ready(self, token: int, now: int, at_ms: int, fed_ms: int) -> bool:
        """The replacement is ready at `at_ms`, the caller audio forwarded so far `fed_ms` (HR11's map): it
        hears the caller from the next frame on."""
        recovery = self.state.replacement_ready(token, now)
        if recovery is None:
            return False
        recovery.ready_ms, recovery.ready_fed_ms = at_ms, fed_ms
        recovery.under_way = self._caller_open  # a tail of it is not fresh speech (the module's docstring)
        # HR8: everything the caller said while no connection could hear it, counted once.
        self._out.notices.append(
            AudioDiscontinuity("input", recovery.discarded_frames, "voice_transport_recovery", at_ms)
        )
        self._changed(recovery, Stage.AWAITING_USER.value, now)
        return True

    def discard_frame(self) -> bool:
        """HR8: while reconnecting, a caller frame is discarded and counted (never replayed faster than real
        time); True when it was."""
        if not self.state.reconnecting:
            return False
        assert self.state.active is not None
        self.state.active.discarded_frames += 1
        return True

    def caller_started(self, at_ms: int, fed_ms: int | None) -> bool:
        """A caller start (any source; `at_ms` rebased, HR11; `fed_ms`: the caller audio forwarded so far, for
        a start the provider stamped; None for one it did not, or the local detector's). True when it opens
        the fresh caller interval (HR10, HR13): never while reconnecting, nor for the tail of a turn under way
        at the replacement's ready instant."""
        open_before, self._caller_open = self._caller_open, True
        return not self.state.reconnecting and self.state.caller_started(at_ms, open_before, fed_ms)

    def caller_ended(self) -> None:
        """The caller's turn ended (a speech end, by any source): a tail under way is over."""
        self._caller_open = False
        if self.state.active is not None:
            self.state.active.under_way = False

    def floor_audio(self) -> bool:
        """The floor sent audio: False while reconnecting (nothing reaches the caller until the replacement is
        ready); a ready replacement's answers the repair (`replacement_spoke`: the caller's next start is
        fresh, HR10)."""
        if self.state.reconnecting:
            return False
        self.replacement_spoke()
        return True

    def replacement_spoke(self) -> None:
        """The replacement sent audio (its notice, HR7; played or not: a caller still suppressed drops it)
        while the repair waits for the caller: the caller's next start answers it."""
        if self.state.active is not None and not self.state.reconnecting:
            self.state.active.under_way = False

    def caller_stopped(self, now: int) -> None:
        """A caller turn ended: after the repair, fresh speech completes it (HR13); the watchdog is armed."""
        recovery = self.state.caller_spoke(now)
        if recovery is not None:
            self._changed(recovery, "done", now)

    def expect_answer(self, now: int) -> None:
        """The caller stopped speaking: a provider that cannot be trusted to answer pings must show life
        within `answer_within_ms`, or its connection is presumed half-open and replaced. Not while a recovery
        is active: a replacement hears only the end of a turn under way (HR8), which a provider may not
        answer; the first fresh turn completes the recovery (HR13) and arms the watchdog as any turn does.
        (Armed by such a tail, the watchdog fired about when the provider would have answered the caller's
        next whole turn, and its replacement again: one every turn for the rest of the call.)"""
        limit = self._answer_within_ms
        if limit is not None and self._answer_due is None and self.state.active is None and not self._paused:
            self._answer_due = now + limit * NS_PER_MS  # (a later turn never postpones an armed watchdog)

    def pause(self) -> None:
        """S7: the line is held or ringing: the silence watchdog is disarmed and stays off until `resume`; the
        caller's next turn after it arms it as any turn does."""
        self._paused = True
        self._answer_due = None

    def resume(self) -> None:
        self._paused = False

    def alive(self) -> None:
        """The floor connection sent something."""
        self._answer_due = None

    def replacement_failed(self, token: int, now: int) -> bool:
        """A dead replacement is fatal (HR5): True when it was this recovery's, which has then failed."""
        if self.state.active is None or self.state.active.token != token:
            return False
        self.fail(now)
        return True

    def fail(self, now: int) -> None:
        recovery = self.state.fail()
        self._delegations.recovery_failed()
        if recovery is not None:
            self._changed(recovery, "failed", now)

    def handle_timer(self, now: int, at_ms: int, *, may_begin: bool) -> str | None:
        """The watchdog and the budget; returns why the session fails, if it does."""
        if self._answer_due is not None and now >= self._answer_due:
            self._answer_due = None
            if may_begin:
                self.begin(
                    "provider_silent", now, at_ms
                )  # a half-open socket: nothing arrives, nothing fails
        if self.state.expired(now):
            self.fail(now)
            return f"output recovery did not complete within {self.state.budget_ns // 1_000_000_000} s"
        return None

    def next_deadline(self) -> int | None:
        due, answer = self.state.deadline(), self._answer_due
        return answer if due is None or (answer is not None and answer < due) else due

    def status(self) -> dict[str, object]:
        stats = self.state.stats
        return {
            "by_cause": dict(stats.by_cause),
            "completed": stats.completed,
            "failed": stats.failed,
            "ignored": stats.ignored,
            "interrupted": stats.interrupted,
            "durations_ms": list(stats.durations_ms[-20:]),
            "reconnect_ms": list(stats.reconnect_ms[-20:]),
            "dropped_bytes": stats.dropped_bytes,
            "discarded_frames": stats.discarded_frames,
        }
