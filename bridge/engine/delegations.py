"""Delegations: the job ledger and the rules that keep a reconnect from ever acting twice (DESIGN §8, HR6,
HR9, HR10, DL1, DL2).

A tool call (Realtime, xAI, Gemini) or a delegation (GPT-Live) becomes a *job* with a session-unique id. The
ledger lives in the session, not in a connection: every provider call id that ever named the job maps to it,
so a call delivered again — on the same connection or on a recovery replacement — is answered from the
ledger and never dispatched to the application a second time.

What the session tells the provider on the application's behalf (a tool result, a spoken or silent update) is
a *command record*. It stays outstanding until the connection that carried it shows it was taken in (the end
of a later response, or for GPT-Live, which has no response boundaries, the next assistant item). A record
still outstanding when its connection is lost is reported `unknown` and is never replayed (HR6): the
application decides whether to say it again.

Around a recovery:
- Results of work requested before the repair are held (HR9) until fresh caller speech has been interpreted —
  the end of the model's first reaction to the caller's first turn after the repair, or at most
  `results_hold_ms` after that turn — so a correction can supersede them: a call of the same tool in that reaction marks the held job
  superseded and its result is never announced. Speakable application updates wait the same way.
- Calls that arrive while the voice path is being repaired wait for the first fresh caller interval, bounded
  by `max_pending_delegations` (HR10); those stamped before that interval began are not dispatched as new
  work, and the model is told so. The interval opens with a turn that begins after the replacement is ready:
  the tail of a turn under way then, which the replacement hears, is not a new request, even when the
  replacement reports a speech start of its own for it (the rule is bridge/engine/recovery.py's, which the
  coordinator asks before `caller_started`).

S8, uncertain work is told: the application hears, as one `WorkUncertain` notice carrying each request (job
id, tool, bounded arguments) and what is known of its outcome, of
- commands reported `unknown` when their connection was lost (HR6, above), or closed before it took them in (a
  rollover's old connection, RO2; a listener that failed): outcome `unknown`;
- at the end of the session (`session_ending`, then `session_ended`): jobs still running — the application's
  handler gets `end_grace_ms` (2 s, bounded by the session's close window: the 2 s the caller's BYE leaves
  for the provider's final usage) to answer, an answer within it is delivered as usual and is not uncertain;
  after it the job is cut off (outcome `cut_off`: the application may have acted, the model never heard) —
  and answers or updates the application gave that never reached the model (held for the caller, HR9, or for
  the next floor, RO8: outcome `not_delivered`). With no job running the session ends when it would have
  without them; once it has ended a call the model still makes is not dispatched (the coordinator drops it).
  Calls held for the fresh caller interval (HR10) never reached the application: they are not uncertain and
  not told. Results sent at the end and not yet acknowledged are not told either: the caller is gone, nothing
  can be said any more, and the application knows its answer.
The arguments are the model's text (what the application's handler was given), cut at `MAX_TOLD_CHARS`; the
bridge's own secrets never appear in a job.

Around a rollover (S2, RO4, RO8): the next connection hears the caller's last utterances together with the old
one, and answers them too — the same request, asked twice. One caller request dispatches at most one job, so
a response a connection began while it was a listener (an answer to an utterance the old connection heard:
RO4's shared utterances) is never dispatched. Its calls become jobs in the state `handled_before`, answered to
that connection with `HANDLED_BEFORE` and kept in the ledger (a redelivery is answered the same). A listener
still listening gets that answer too — its function call is not left open — and nothing it says is played.
The next connection's calls are work again from the caller's first utterance that began after the old one
stopped hearing the caller (its StopInput: `stopped_hearing`), by any connection's or the local detector's
account, and by when that start was reported, not by the provider's time of it: the old connection stops
hearing only while its own detector hears no speech, so an utterance whose start was reported after that
never got an end, a commit or an answer from it, even when it began a moment earlier (RO2's hard stop
commits, so an utterance under way then is the old one's). Where the rules are silent, two guards for the
order in which events come:
- a call the provider stamped before that utterance began (GPT-Live's delegations carry their time) answers a
  shared utterance, whenever it comes;
- a call with no time of its own (Realtime, xAI, Gemini) that comes while the response under way at that
  utterance's start has not ended is the answer to the shared one: Realtime names no "response began" and
  sends a call at the end of its response, and the local detector or the provider's speech start may come
  before a call the provider had already made. A response is under way from the connection's end of speech,
  audio, caption or call until its `ResponseDone`; where a protocol has none, the caller's next utterance
  ends it.
What the old connection started stays its own: its jobs run and their results go to whichever connection holds
the floor (RO8). A recovery quarantines the rollover's connections; the replacement's calls follow HR10.

This module is sans-I/O: the coordinator calls it with session times and connection tokens and drains
`commands()` and `notices()`; the session shell runs the application's handler.
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

NOT_RUN_STALE = (
    '{"error": "not run: this request was made before the caller spoke again after an audio interruption; '
    'ask the caller and request it again if it is still wanted"}'
)


HANDLED_BEFORE = json.dumps(
    {
        "error": "not run: the previous connection of this call already handled this request (the caller's "
        "words were heard by both); any result will be given to you. Do not request it again and do not "
        "speak about it now"
    }
)


def refused_output(reason: str) -> str:
    return json.dumps({"error": f"refused: {reason}"})


class JobState(enum.Enum):
    HELD = "held"  # waiting for the first fresh caller interval (HR10)
    RUNNING = "running"  # dispatched to the application
    ANSWERED = "answered"  # the application answered; delivery waits for the caller (HR9) or a record slot
    DELIVERED = "delivered"  # the result was sent to the provider
    REFUSED = "refused"  # over a limit (DL2); the model was told
    NOT_DISPATCHED = "not_dispatched"  # stamped before the fresh caller interval (HR10)
    SUPERSEDED = "superseded"  # a correction replaced it before its result was announced (HR9)
    CANCELLED = "cancelled"  # the provider withdrew the call
    CUT_OFF = "cut_off"  # still running when the session ended, after the grace (S8)
    HANDLED_BEFORE = "handled_before"  # answers what the previous connection heard and handled (S2)

    @property
    def pending(self) -> bool:
        return self in (JobState.HELD, JobState.RUNNING, JobState.ANSWERED)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What the application's handler is given: one job, dispatched exactly once."""

    job_id: str
    name: str
    arguments: str  # JSON text, as the model produced it
    kind: str  # "function" (tool call) or "delegation" (GPT-Live)
    requested_at_ms: int  # on the session's logical timeline
    supersedes: str | None = None  # the job this one corrects (HR9)


@dataclass(slots=True)
class Job:
    request: JobRequest
    call_ids: list[str]  # every provider call id that named this job (redeliveries included)
    token: int  # the connection of the latest call id
    state: JobState
    revision: int = 0  # bumped by each answer from the application
    output: str | None = None
    redeliveries: int = 0
    held_since_recovery: int | None = None  # the recovery count when its result was held
    finished_ms: int | None = None  # when it last left the pending states (the ledger's window, DL1)

    @property
    def job_id(self) -> str:
        return self.request.job_id


@dataclass(slots=True)
class Echo:
    """A rollover's next connection, while what it answers may be what the previous connection heard (S2)."""

    since_ms: int | None = None  # when the previous connection stopped hearing the caller (None: not yet)
    fresh_ms: int | None = None  # when the caller's first utterance after that began: its own work from then
    fresh_over: bool = False  # that utterance has ended
    responding: bool = False  # a response of this connection is under way (until its ResponseDone)
    shared_response: bool = False  # the one under way when that utterance began: it answers a shared one


@dataclass(slots=True)
class CommandRecord:
    command_id: int
    token: int
    what: str  # "tool_result" or "update"
    job_id: str | None
    state: str = "sent"  # "sent", then "acknowledged" or "unknown"
    text: str = ""  # an update's text (S8: told back, bounded, if it becomes unknown)
    speak: bool = False  # an update: spoken or silent


# --- what the coordinator is asked to do ---


@dataclass(frozen=True, slots=True)
class DispatchJob:
    """Run the application's handler for this job (the shell does; the answer comes back as `job_answered`)."""

    request: JobRequest


@dataclass(frozen=True, slots=True)
class DeliverResult:
    """Answer the provider's call `call_id` on connection `token`."""

    token: int
    call_id: str
    name: str
    output: str


@dataclass(frozen=True, slots=True)
class SendContext:
    """Context for the conversation on connection `token`; `speak` asks the model to say something."""

    token: int
    text: str
    speak: bool


@dataclass(frozen=True, slots=True)
class JobChanged:
    """A job moved: for the log, the metrics and the application."""

    job_id: str
    name: str
    state: str
    detail: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class CommandsUnknown:
    """Commands sent on a connection that was lost before it took them in: never replayed (HR6)."""

    token: int
    records: tuple[CommandRecord, ...]


UNKNOWN_DETAIL = "sent, never acknowledged"
CUT_OFF_DETAIL = "cut off: still running when the session ended"
NOT_DELIVERED_DETAIL = "answered, never delivered: the session ended before it could be given to the model"
MAX_TOLD_CHARS = 1_000  # S8: the arguments (or an update's text) told back with uncertain work, at most


@dataclass(frozen=True, slots=True)
class UncertainItem:
    """One piece of uncertain work (S8): what was requested and what is known of its outcome."""

    job_id: str | None  # None: an application update, not a job
    name: str  # the tool or delegation; "update" for an application update
    kind: str  # "function", "delegation" or "update"
    arguments: str  # the model's arguments (an update's text), at most MAX_TOLD_CHARS
    truncated: bool  # the arguments were longer and were cut
    requested_at_ms: int | None  # on the session timeline (None: an update)
    outcome: str  # "unknown", "cut_off" or "not_delivered"
    detail: str  # the same in words, for a person

    @classmethod
    def of_job(cls, request: JobRequest, outcome: str, detail: str) -> UncertainItem:
        args = request.arguments
        return cls(
            request.job_id,
            request.name,
            request.kind,
            args[:MAX_TOLD_CHARS],
            len(args) > MAX_TOLD_CHARS,
            request.requested_at_ms,
            outcome,
            detail,
        )

    @classmethod
    def of_update(cls, text: str, speak: bool, outcome: str, detail: str) -> UncertainItem:
        what = "spoken update" if speak else "silent update"
        return cls(
            None,
            "update",
            "update",
            text[:MAX_TOLD_CHARS],
            len(text) > MAX_TOLD_CHARS,
            None,
            outcome,
            f"{what}: {detail}",
        )


@dataclass(frozen=True, slots=True)
class WorkUncertain:
    """S8: work whose outcome became uncertain, told to the application with what was requested. `cause` is
    "connection_lost" (commands connection `token` never acknowledged before it was lost, HR6),
    "connection_closed" (the same, of a connection a rollover closed or a listener that failed) or
    "session_ended" (jobs cut off after the grace, answers and updates never delivered)."""

    cause: str
    items: tuple[UncertainItem, ...]
    at_ms: int
    token: int | None = None  # the lost connection ("connection_lost")


DelegationCommand = DispatchJob | DeliverResult | SendContext
DelegationNotice = JobChanged | CommandsUnknown | WorkUncertain


@dataclass(frozen=True, slots=True)
class DelegationOptions:
    max_pending_delegations: int = 4  # jobs held, running or waiting to be delivered, at most (DL2, HR10)
    max_command_records: int = 32  # outstanding commands and queued updates, at most (DL2, HR6)
    max_facts: int = 10  # task facts and verified results kept for a re-seed (HR7)
    results_hold_ms: int = 3_000  # after the caller's fresh turn, results wait at most this long (HR9)
    # Bounded: finished jobs are kept (and redeliveries of them answered from the ledger, DL1) while they are
    # among the last `keep_finished` or finished less than `keep_finished_ms` ago; never more than
    # `max_finished`. Pending jobs are always kept (DL2 bounds them).
    keep_finished: int = 64
    keep_finished_ms: int = 180_000
    max_finished: int = 256
    # S8: at the end of the session, jobs still running get this long to be answered before they are cut
    # off and told as uncertain; never longer than the session's close window (TelephonyOptions.close_ms).
    end_grace_ms: int = 2_000


@dataclass(slots=True)
class DelegationStats:
    dispatched: int = 0
    redeliveries: int = 0
    refused: int = 0
    not_dispatched: int = 0
    superseded: int = 0
    handled_before: int = 0  # calls answering what the previous connection handled (S2)
    unknown_commands: int = 0
    uncertain: int = 0  # S8: pieces of work told as uncertain
    by_state: Counter[str] = field(default_factory=Counter)


class JobLedger:
    """Every job of the call by job id and by each provider call id that named it (DL1), bounded:
    pending jobs are all kept; a finished job is forgotten — with every call id that named it — only once it
    is neither among the last `keep_finished` finished jobs nor finished within `keep_finished_ms`, or when
    more than `max_finished` are kept. A redelivery comes after a reconnect, seconds after the call, so the
    window (the last 64 jobs, and those of the last 3 minutes up to 256: a tool call every turn of a busy
    call is about 7 minutes of it) holds every redelivery that is actually possible. It is full minutes into
    a call, not most of an hour: a 30-minute run at 100 calls measured RSS still growing while the earlier
    window (256 jobs, 10 minutes) filled, and every kept job is an object a full collection walks.
    `forgotten` keeps the final states of what it dropped, so the status still reports totals. A call
    redelivered after its job was forgotten would be dispatched as new work."""

    def __init__(self, options: DelegationOptions) -> None:
        self._options = options
        self.jobs: dict[str, Job] = {}
        self.by_call: dict[str, Job] = {}
        self.open: dict[str, Job] = {}  # the pending jobs (held, running, answered), oldest first
        self._finished: dict[str, Job] = {}  # finished jobs, the oldest finish first
        self.forgotten: Counter[str] = Counter()  # final states of the jobs the window dropped

    def add(self, job: Job, call_id: str) -> None:
        self.jobs[job.job_id] = self.open[job.job_id] = job
        self.by_call[call_id] = job

    def moved(self, job: Job, at_ms: int) -> None:
        """A job changed state: a finished one joins the window (again, at its end), a pending one leaves it."""
        self._finished.pop(job.job_id, None)
        if job.state.pending:
            self.open.setdefault(job.job_id, job)
            job.finished_ms = None
            return
        self.open.pop(job.job_id, None)
        job.finished_ms = at_ms
        self._finished[job.job_id] = job
        o, finished = self._options, self._finished
        while finished:
            oldest = next(iter(finished.values()))
            recent = (
                len(finished) <= o.keep_finished or at_ms - (oldest.finished_ms or 0) < o.keep_finished_ms
            )
            if recent and len(finished) <= o.max_finished:
                return
            self._forget(oldest)

    def _forget(self, job: Job) -> None:
        del self._finished[job.job_id]
        self.jobs.pop(job.job_id, None)
        for call_id in job.call_ids:
            if self.by_call.get(call_id) is job:
                del self.by_call[call_id]
        self.forgotten[job.state.value] += 1

    def pending(self) -> int:
        return len(self.open)

    def states(self) -> dict[str, int]:
        """Jobs by state over the whole call: those kept by their state now, the forgotten by their last."""
        return dict(Counter(job.state.value for job in self.jobs.values()) + self.forgotten)


class Delegations:
    """The session's job ledger and command records, with the recovery gates."""

    def __init__(self, options: DelegationOptions | None = None) -> None:
        self.options = options or DelegationOptions()
        self.ledger = JobLedger(self.options)
        self.jobs = self.ledger.jobs  # the jobs kept (bounded: pending ones and a window of finished ones)
        self._by_call = self.ledger.by_call
        self.records: list[CommandRecord] = []  # outstanding only
        self.updates: list[tuple[str, bool]] = []  # speakable/silent application updates waiting (HR9)
        self.facts: list[str] = []  # task facts and verified results, newest last (HR7)
        self.stats = DelegationStats()
        self._commands: list[DelegationCommand] = []
        self._notices: list[DelegationNotice] = []
        self._next_job = 0
        self._next_command = 0
        # The recovery gates. `resuming`: a recovery is running and the caller has not spoken since the
        # repair; `fresh_start_ms`: when the caller's first fresh interval began; `held`: results wait.
        self.resuming = False
        self.fresh_start_ms: int | None = None
        self.held = False
        self.handover = False  # a rollover is handing the floor over: what is for the model waits (RO8)
        self.recoveries = 0
        self._release_at_ms: int | None = None  # the fallback end of the hold (HR9)
        # S8: the end of the session. `ending_due_ms`: when the grace of running jobs is over (None: the
        # session goes on); `ended`: the uncertain work was told, nothing more will be.
        self.ending_due_ms: int | None = None
        self.ended = False
        self.echoes: dict[int, Echo] = {}  # a rollover's next connections, by token, until settled (S2)
        self.own_work_from: dict[int, int] = {}  # settled ones: when their own work began (the latest few)

    # --- provider side ---

    def call_requested(
        self,
        token: int,
        call_id: str,
        name: str,
        arguments: str,
        kind: str,
        at_ms: int,
        *,
        stamped: bool = True,
    ) -> None:
        """The model asked for a tool or a delegation (`at_ms` already on the session timeline; `stamped`: the
        provider's time of the call, not when it came)."""
        known = self._by_call.get(call_id)
        if known is not None:
            self._redelivered(known, token, call_id, at_ms)
            return
        if (self.echoes or self.own_work_from) and self.echoed(token, at_ms, stamped):
            self._handled_before(token, call_id, name, arguments, kind, at_ms)
            return
        fresh = self.fresh_start_ms
        supersedes = (
            self._supersede(name, fresh, at_ms)
            if self.held and fresh is not None and at_ms >= fresh
            else None
        )
        self._next_job += 1
        request = JobRequest(f"job-{self._next_job}", name, arguments, kind, at_ms, supersedes)
        job = Job(request, [call_id], token, JobState.HELD)
        self.ledger.add(job, call_id)
        if self.ledger.pending() > self.options.max_pending_delegations:
            self._refuse(
                job, f"{self.options.max_pending_delegations} delegations are already pending", at_ms
            )
        elif self.resuming and (self.fresh_start_ms is None or at_ms < self.fresh_start_ms):
            self._changed(job, JobState.HELD, "waiting for the caller's first fresh interval (HR10)", at_ms)
        else:
            self._dispatch(job, at_ms)

    def _handled_before(
        self, token: int, call_id: str, name: str, arguments: str, kind: str, at_ms: int
    ) -> None:
        """S2: a call of a response begun while the connection was a listener — the previous connection heard
        the same request and handled it. Kept in the ledger, answered, never dispatched."""
        self.echo_output(token)
        self._next_job += 1
        request = JobRequest(f"job-{self._next_job}", name, arguments, kind, at_ms)
        job = Job(request, [call_id], token, JobState.HELD)
        self.ledger.add(job, call_id)
        self.stats.handled_before += 1
        self._changed(
            job, JobState.HANDLED_BEFORE, "the previous connection handled this request (S2)", at_ms
        )
        self._answer_model(job, HANDLED_BEFORE, token)

    def call_cancelled(self, call_ids: Iterable[str], at_ms: int) -> None:
        for call_id in call_ids:
            job = self._by_call.get(call_id)
            if job is not None and job.state.pending:
                self._changed(job, JobState.CANCELLED, "the provider withdrew the call", at_ms)

    def taken_in(self, token: int, at_ms: int) -> None:
        """Connection `token` showed it processed what it was sent (a response ended, a new item began)."""
        self.acknowledged(token)
        self._flush(token, at_ms)

    def acknowledged(self, token: int) -> None:
        """What connection `token` was sent has been taken in; nothing more goes to it (a rollover's old
        connection, listening on after the floor moved: its response's end acknowledges, HR6)."""
        for record in self.records:
            if record.token == token and record.state == "sent":
                record.state = "acknowledged"
        self.records = [r for r in self.records if r.state == "sent"]

    # --- application side ---

    def job_answered(self, job_id: str, output: str, token: int, at_ms: int) -> bool:
        """The application's answer for a job; returns False when the job no longer takes one."""
        job = self.jobs.get(job_id)
        if job is None or job.state not in (JobState.RUNNING, JobState.ANSWERED, JobState.DELIVERED):
            return False
        job.revision += 1
        job.output = output
        job.state = JobState.ANSWERED
        fresh = self.fresh_start_ms is not None and job.request.requested_at_ms >= self.fresh_start_ms
        if self.handover:
            self._changed(job, JobState.ANSWERED, f"revision {job.revision} waits for the next floor", at_ms)
        elif (
            self.held and not fresh
        ):  # (a call made in the caller's fresh interval is the model's reaction to it)
            job.held_since_recovery = self.recoveries
            self._changed(
                job,
                JobState.ANSWERED,
                f"revision {job.revision} held until the caller has spoken (HR9)",
                at_ms,
            )
        else:
            self._deliver(job, token, at_ms)
        return True

    def push_update(self, text: str, speak: bool, token: int) -> bool:
        """A speakable (or silent) update from the application; False when over the command-record limit."""
        if self._outstanding() >= self.options.max_command_records:
            return False
        if self.held or self.handover:
            self.updates.append((text, speak))
        else:
            self._send_context(token, text, speak, None)
        return True

    def floor(self, token: int, handing_over: bool, at_ms: int) -> None:
        """RO8: while the floor is handed over (the old connection stopped hearing the caller and finishes its
        items), results and updates wait; the connection that takes the floor gets them."""
        if handing_over != self.handover:
            self.handover = handing_over
            self._flush(token, at_ms)

    def push_fact(self, text: str) -> None:
        """A task fact or verified result: seeded into any replacement connection (HR7)."""
        self.facts.append(text[:500])
        del self.facts[: -self.options.max_facts]

    # --- the rollover gate (S2) ---

    def listening(self, token: int) -> None:
        """A rollover opened connection `token`: it hears what the floor hears, and answers it too."""
        self.echoes[token] = Echo()

    def stopped_hearing(self, at_ms: int) -> None:
        """The previous connection stopped hearing the caller: utterances from now on are the next one's."""
        for echo in self.echoes.values():
            if echo.since_ms is None:
                echo.since_ms = at_ms

    def echoed(self, token: int, at_ms: int, stamped: bool) -> bool:
        """A call of connection `token` at `at_ms` (`stamped`: the provider's own time of the call, else when it
        came) answers what the previous connection heard (S2)."""
        echo = self.echoes.get(token)
        if echo is None:
            own = self.own_work_from.get(token)
            return own is not None and at_ms < own
        if echo.fresh_ms is None or at_ms < echo.fresh_ms:
            return True
        return echo.shared_response and not stamped

    def caller_heard(self, started: bool, at_ms: int) -> None:
        """The caller began (or ended) an utterance, by any connection's or the local detector's account: the
        first one begun after the previous connection stopped hearing opens the next connection's own work;
        the rule is settled at its end, or once the shared response under way then has ended too."""
        for token, echo in list(self.echoes.items()):
            if echo.since_ms is None or at_ms < echo.since_ms:
                continue
            if started and echo.fresh_ms is None:
                echo.fresh_ms, echo.shared_response = at_ms, echo.responding
            elif echo.fresh_ms is None or at_ms < echo.fresh_ms:
                continue
            elif not started:
                echo.fresh_over = True
                if not echo.shared_response:
                    self._settle_echo(token, echo.fresh_ms)
            elif echo.fresh_over:  # the caller's next utterance: no response outlives that (no ResponseDone)
                self._settle_echo(token, echo.fresh_ms)

    def echo_output(self, token: int) -> None:
        """Connection `token` is answering (its end of speech, audio, a caption, a call): a response is under
        way; begun before the caller's fresh utterance, it answers a shared one."""
        if (echo := self.echoes.get(token)) is not None:
            echo.responding = True

    def echo_response_done(self, token: int) -> None:
        if (echo := self.echoes.get(token)) is not None:
            echo.responding = echo.shared_response = False
            if echo.fresh_over and echo.fresh_ms is not None:
                self._settle_echo(token, echo.fresh_ms)

    def forget_echo(self, token: int) -> None:
        """Connection `token` is gone (failed or closed before it took the floor)."""
        self.echoes.pop(token, None)

    def _settle_echo(self, token: int, fresh_ms: int) -> None:
        """Watched no more: a call of `token` is an echo only when the provider stamped it before `fresh_ms`."""
        del self.echoes[token]
        self.own_work_from[token] = fresh_ms
        while len(self.own_work_from) > 4:  # the latest rollovers' (a provider stamps what is recent)
            del self.own_work_from[next(iter(self.own_work_from))]

    # --- recovery gates ---

    def recovery_started(self, old_token: int, at_ms: int) -> None:
        """HR6: what the lost connection had not taken in is unknown; HR9/HR10: results and calls wait."""
        self._lose(old_token, "connection_lost", at_ms)
        self.echoes.clear()  # the rollover's connections are quarantined: the replacement follows HR10
        self.own_work_from.clear()
        self.recoveries += 1
        self.resuming = True
        self.held = True
        self.fresh_start_ms = None
        self._release_at_ms = None

    def connections_gone(self, known: Callable[[int], bool], at_ms: int) -> None:
        """HR6, S8: a connection closed — a rollover's old one, a listener that failed — before it took in what
        it was sent: those commands are unknown too, told, never replayed (and free their records)."""
        for token in sorted({r.token for r in self.records if not known(r.token)}):
            self._lose(token, "connection_closed", at_ms)

    def caller_started(self, token: int, at_ms: int) -> None:
        """The caller began to speak. The first time after a repair, held calls stamped before now are stale."""
        if not self.resuming or self.fresh_start_ms is not None:
            return
        self.fresh_start_ms = at_ms
        for job in list(self.ledger.open.values()):
            if job.state is JobState.HELD:
                if job.request.requested_at_ms < at_ms:
                    self.stats.not_dispatched += 1
                    self._changed(
                        job, JobState.NOT_DISPATCHED, "requested before the caller's fresh interval", at_ms
                    )
                    self._answer_model(job, NOT_RUN_STALE, token)
                else:
                    self._dispatch(job, at_ms)

    def caller_turn_ended(self, at_ms: int) -> None:
        """The caller's fresh turn is over: the model's reaction to it ends the hold (or the fallback does)."""
        if self.resuming and self.fresh_start_ms is not None:
            self.resuming = False
            self._release_at_ms = at_ms + self.options.results_hold_ms

    def response_ended(self, token: int, at_ms: int) -> bool:
        """The model finished a response on `token`: it took in what it was sent; after the caller's fresh
        turn, the fresh speech has been interpreted and held results may go. True when `token` now waits for
        a result (it asked for a tool): it says nothing more until then (RO8)."""
        self.taken_in(token, at_ms)
        if self.held and not self.resuming and self.fresh_start_ms is not None:
            self._release(token, at_ms)
        return any(job.token == token for job in self.ledger.open.values())

    def recovery_failed(self) -> None:
        self.resuming = False

    def deadline_ms(self) -> int | None:
        return self._release_at_ms if self.held else None

    def next_deadline_ms(self) -> int | None:
        """The ledger's soonest deadline, session ms: the held results' release or the end's grace (S8)."""
        due, ending = self.deadline_ms(), self.ending_due_ms
        return ending if due is None or (ending is not None and ending < due) else due

    def handle_timer(self, token: int, at_ms: int) -> None:
        if self.held and self._release_at_ms is not None and at_ms >= self._release_at_ms:
            self._release(token, at_ms)

    # --- the end of the session (S8) ---

    def session_ending(self, at_ms: int, window_ms: int) -> None:
        """The session is ending (the call leg is gone, or the session ended): jobs still running get the
        grace, `end_grace_ms` but never longer than `window_ms` (the session's close window), to be answered.
        Only the first call counts; `end_check` says when the session has ended."""
        if self.ending_due_ms is None and not self.ended:
            self.ending_due_ms = at_ms + max(0, min(self.options.end_grace_ms, window_ms))

    def end_check(self, at_ms: int, closed: bool) -> None:
        """After every input while ending: the session has ended once the grace is over, or once nothing else
        keeps it (`closed`: the close window is over) and no job is running."""
        due = self.ending_due_ms
        if due is not None and not self.ended and (at_ms >= due or (closed and not self.running())):
            self.session_ended(at_ms)

    def running(self) -> bool:
        """A job is with the application (its handler, or a telephony action) and not answered yet."""
        return any(job.state is JobState.RUNNING for job in self.ledger.open.values())

    def session_ended(self, at_ms: int) -> None:
        """S8: the session is over. Jobs still running are cut off; answers and updates that never reached the
        model are not delivered; together they are told as one `WorkUncertain` notice (none when nothing is
        uncertain). Once: later answers find no job to take them."""
        if self.ended:
            return
        self.ended = True
        self.ending_due_ms = None
        items: list[UncertainItem] = []
        for job in list(self.ledger.open.values()):  # (the pending ones: they move meanwhile)
            if job.state is JobState.RUNNING:
                items.append(UncertainItem.of_job(job.request, "cut_off", CUT_OFF_DETAIL))
                self._changed(job, JobState.CUT_OFF, "still running when the session ended (S8)", at_ms)
            elif job.state is JobState.ANSWERED:
                items.append(UncertainItem.of_job(job.request, "not_delivered", NOT_DELIVERED_DETAIL))
        items += [
            UncertainItem.of_update(text, speak, "not_delivered", NOT_DELIVERED_DETAIL)
            for text, speak in self.updates
        ]
        self.updates.clear()
        self._tell("session_ended", tuple(items), at_ms)

    # --- outputs ---

    def waiting(self) -> bool:
        """Commands wait for `commands()` (the coordinator asks on every input, so this is a cheap test)."""
        return bool(self._commands)

    def commands(self) -> list[DelegationCommand]:
        """What the ledger decided since the last call. (Nothing: its own empty list, to iterate, not keep.)"""
        commands = self._commands
        if commands:
            self._commands = []
        return commands

    def notices(self) -> list[DelegationNotice]:
        notices = self._notices
        if notices:
            self._notices = []
        return notices

    def status(self) -> dict[str, object]:
        return {
            "jobs": self.ledger.states(),
            "jobs_forgotten": sum(self.ledger.forgotten.values()),
            "pending": self.ledger.pending(),
            "dispatched": self.stats.dispatched,
            "redeliveries": self.stats.redeliveries,
            "refused": self.stats.refused,
            "not_dispatched": self.stats.not_dispatched,
            "superseded": self.stats.superseded,
            "handled_before": self.stats.handled_before,
            "outstanding_commands": self._outstanding(),
            "unknown_commands": self.stats.unknown_commands,
            "uncertain": self.stats.uncertain,
            "results_held": self.held,
        }

    # --- rules ---

    def _redelivered(self, job: Job, token: int, call_id: str, at_ms: int) -> None:
        """DL1: the same call again — answered from the ledger, never dispatched again."""
        job.redeliveries += 1
        self.stats.redeliveries += 1
        job.token = token
        if call_id not in job.call_ids:
            job.call_ids.append(call_id)
        self._notices.append(
            JobChanged(
                job.job_id,
                job.request.name,
                job.state.value,
                f"call {call_id} delivered again: answered from the ledger",
                at_ms,
            )
        )
        if (
            job.state
            in (JobState.DELIVERED, JobState.REFUSED, JobState.NOT_DISPATCHED, JobState.HANDLED_BEFORE)
            and job.output is not None
        ):
            self._answer_model(job, job.output, token, call_id)

    def _supersede(self, name: str, fresh_start_ms: int, at_ms: int) -> str | None:
        """HR9: a call of the same tool in the caller's fresh interval corrects an older result not yet announced."""
        replaced = None
        for job in list(self.ledger.open.values()):  # (the pending ones: they move meanwhile)
            older = job.request.requested_at_ms < fresh_start_ms
            if older and job.request.name == name and job.state in (JobState.RUNNING, JobState.ANSWERED):
                self.stats.superseded += 1
                self._changed(job, JobState.SUPERSEDED, "a correction after the repair replaced it", at_ms)
                replaced = job.job_id
        return replaced

    def _dispatch(self, job: Job, at_ms: int) -> None:
        self.stats.dispatched += 1
        self._changed(
            job, JobState.RUNNING, f"dispatched to the application (call {job.call_ids[-1]})", at_ms
        )
        self._commands.append(DispatchJob(job.request))

    def _refuse(self, job: Job, reason: str, at_ms: int) -> None:
        self.stats.refused += 1
        self._changed(job, JobState.REFUSED, reason, at_ms)
        self._answer_model(job, refused_output(reason), job.token)

    def _answer_model(self, job: Job, output: str, token: int, call_id: str | None = None) -> None:
        """Tell the model something about its call (not an application result: no record, no hold)."""
        job.output = output
        self._commands.append(DeliverResult(token, call_id or job.call_ids[-1], job.request.name, output))

    def _deliver(self, job: Job, token: int, at_ms: int) -> None:
        if len(self.records) >= self.options.max_command_records:
            self._changed(job, JobState.ANSWERED, "waiting for a free command record", at_ms)
            return  # delivered by _flush once the connection takes in what it was sent
        assert job.output is not None
        self._next_command += 1
        self.records.append(CommandRecord(self._next_command, token, "tool_result", job.job_id))
        if job.token == token:
            self._commands.append(DeliverResult(token, job.call_ids[-1], job.request.name, job.output))
        else:
            # The call came on a connection that is gone: its result is an update for the session (HR6).
            text = f"Result of {job.request.name} ({job.job_id}), which you requested earlier: {job.output}"
            self._commands.append(SendContext(token, text, True))
        self._changed(job, JobState.DELIVERED, f"revision {job.revision} sent on connection {token}", at_ms)

    def _send_context(self, token: int, text: str, speak: bool, job_id: str | None) -> None:
        self._next_command += 1
        self.records.append(
            CommandRecord(self._next_command, token, "update", job_id, text=text, speak=speak)
        )
        self._commands.append(SendContext(token, text, speak))

    def _release(self, token: int, at_ms: int) -> None:
        self.held = False
        self._release_at_ms = None
        self._flush(token, at_ms)

    def _flush(self, token: int, at_ms: int) -> None:
        """Deliver what waits, oldest first, while command records allow."""
        if self.held or self.handover:
            return
        for job in list(self.ledger.open.values()):  # (the pending ones: they move meanwhile)
            if job.state is JobState.ANSWERED and len(self.records) < self.options.max_command_records:
                self._deliver(job, token, at_ms)
        while self.updates and len(self.records) < self.options.max_command_records:
            text, speak = self.updates.pop(0)
            self._send_context(token, text, speak, None)

    def _changed(self, job: Job, state: JobState, detail: str, at_ms: int) -> None:
        job.state = state
        self.ledger.moved(job, at_ms)  # the bounded window of finished jobs (DL1)
        self.stats.by_state[state.value] += 1
        self._notices.append(JobChanged(job.job_id, job.request.name, state.value, detail, at_ms))

    def _tell(
        self, cause: str, items: tuple[UncertainItem, ...], at_ms: int, token: int | None = None
    ) -> None:
        if items:
            self.stats.uncertain += len(items)
            self._notices.append(WorkUncertain(cause, items, at_ms, token))

    def _lose(self, token: int, cause: str, at_ms: int) -> None:
        """HR6: what connection `token` had not taken in is unknown: reported, told (S8), never replayed."""
        lost = tuple(r for r in self.records if r.token == token and r.state == "sent")
        for record in lost:
            record.state = "unknown"
        self.records = [r for r in self.records if r.state == "sent"]
        if lost:
            self.stats.unknown_commands += len(lost)
            self._notices.append(CommandsUnknown(token, lost))
            self._tell(cause, tuple(self._unknown_item(r, token, cause) for r in lost), at_ms, token)

    def _unknown_item(self, record: CommandRecord, token: int, cause: str) -> UncertainItem:
        how = "was lost" if cause == "connection_lost" else "closed first"
        detail = f"{UNKNOWN_DETAIL} (connection {token} {how}); not sent again"
        job = self.jobs.get(record.job_id) if record.job_id is not None else None
        if job is not None:
            return UncertainItem.of_job(job.request, "unknown", f"result {detail}")
        if record.job_id is not None:  # (a job the ledger's window already forgot)
            return UncertainItem(record.job_id, "", "", "", False, None, "unknown", f"result {detail}")
        return UncertainItem.of_update(record.text, record.speak, "unknown", detail)

    def _outstanding(self) -> int:
        return len(self.records) + len(self.updates)


def seed_facts(d: Delegations) -> tuple[str, ...]:
    """What a further connection is told of the task (HR7, RO8): facts, verified results and the calls still
    running (that connection never saw them asked, and must not ask again), bounded, newest last."""
    verified = [
        f"{job.request.name} ({job.job_id}) returned {job.output}"
        for job in d.jobs.values()
        if job.state is JobState.DELIVERED
        and job.output is not None
        and not any(r.job_id == job.job_id for r in d.records)
    ]
    running = [
        f"{job.request.name} ({job.job_id}) was requested with {job.request.arguments[:200]} and is still "
        "running: its result will be given to you, do not request it again"
        for job in d.ledger.open.values()
    ]
    return tuple((d.facts + verified + running)[-d.options.max_facts :])
