"""The session engine's one vocabulary: commands (imperatives) the shell carries out, and notices (facts) for
the log and the metrics.

Every part of the session core — the coordinator, recovery, the rollover controller, delegations, telephony —
speaks these types; none has a private dialect to translate. A command that names a connection does so by its
connection id (RO7), and `token` reads the transport token back out of it (bridge/engine/connections.py makes both).
A few commands are consumed inside the core (`StartInput`, `StopInput`, `TakeFloor`, `EmitUtterance`,
`EmitInterim`: the rollover controller's decisions that the coordinator routes to the connection registry and
to the captions); the rest reach the shell through `SessionCoordinator.commands()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bridge.engine.connections import token_of
from bridge.engine.delegations import DelegationCommand, DelegationNotice
from providers.events import ProviderError


@dataclass(frozen=True, slots=True)
class RecoverySnapshot:
    """What a further connection is seeded with (HR3, HR7, RO8): bounded, caller side only."""

    caller_text: tuple[str, ...]  # recent final caller transcripts, oldest first
    facts: tuple[str, ...] = ()  # current task facts and verified results (from the application)


NO_SNAPSHOT = RecoverySnapshot(())


# --- commands for the provider, the leg and the application (imperatives) ---


@dataclass(frozen=True, slots=True)
class SendAudio:
    pcm16_8k: bytes
    token: int  # the connection that gets it (during a rollover's overlap, each listening connection does)


@dataclass(frozen=True, slots=True)
class Truncate:
    """Tell the connection holding the floor what the caller heard of `item_id` (SE5)."""

    item_id: str
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class CancelResponse:
    """Stop the response connection `token` is generating, where its protocol has one (S7: the caller put the
    call on hold; nothing it says now can be heard)."""

    token: int


@dataclass(frozen=True, slots=True)
class OpenReplacement:
    """Open the one replacement connection (HR5), seeded with `snapshot` and the recovery notice (HR7), and
    continuing by `resume_handle` where the provider supports resumption."""

    connection_id: str
    cause: str
    snapshot: RecoverySnapshot
    resume_handle: str | None = None

    @property
    def token(self) -> int:
        return token_of(self.connection_id)


@dataclass(frozen=True, slots=True)
class OpenRollover:
    """Open the next connection, seeded with `snapshot` without the recovery notice (RO8); it listens until it
    takes the floor."""

    connection_id: str
    snapshot: RecoverySnapshot = NO_SNAPSHOT
    resume_handle: str | None = None

    @property
    def token(self) -> int:
        return token_of(self.connection_id)


@dataclass(frozen=True, slots=True)
class CloseTransport:
    """Close a connection: nothing it sends can reach the caller any more (HR2, RO2)."""

    connection_id: str
    reason: str = ""

    @property
    def token(self) -> int:
        return token_of(self.connection_id)


@dataclass(frozen=True, slots=True)
class CommitInput:
    """Commit the connection's input buffer: the caller's words so far are one utterance (RO2, RO5)."""

    connection_id: str

    @property
    def token(self) -> int:
        return token_of(self.connection_id)


@dataclass(frozen=True, slots=True)
class RequestClose:
    """The call leg is gone: ask connection `token` to end its session (its final usage follows, HR12)."""

    token: int


@dataclass(frozen=True, slots=True)
class EndSession:
    """The session cannot go on (a fatal protocol error, a failed recovery, the provider's final close, a
    refused rollover). `goodbye` or `failed`: the caller hears the closing message before the BYE."""

    reason: str
    failed: bool = False
    goodbye: bool = False


@dataclass(frozen=True, slots=True)
class HangUp:
    """Send BYE now (any goodbye or closing message has been played)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ApproveRollover:
    """Ask the application's `approve` hook; answer with `rollover_approved` (RO6)."""

    rollover_id: str
    connection_id: str = ""  # the connection being replaced
    next_connection_id: str = ""


@dataclass(frozen=True, slots=True)
class AuthorizeConnection:
    """Ask `connection_hooks.authorize` to fund connection `connection_id`; answer with
    `connection_authorized` (RO7)."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class TransferCall:
    """DL6: a blind transfer by SIP REFER; the transferee's final answer comes back as `transfer_progress`.
    `headers`: the application's on the REFER (`LiveCall.transfer`, checked by sip/core/app_headers.py); the
    model's `transfer_call` sets none."""

    target: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class WarmTransferCall:
    """DL6: the model's warm transfer (bridge/engine/warm_transfer.py); its outcome comes back as
    `transfer_progress` with the typed reason and answers job `job_id`. `brief`: None, a summary of the call."""

    target: str
    brief: str | None
    job_id: str


@dataclass(frozen=True, slots=True)
class SendDtmf:
    """DL6: RFC 4733 digits to the caller's side; the result answers job `job_id`."""

    digits: str
    job_id: str


@dataclass(frozen=True, slots=True)
class RecordingTool:
    """DL6: the model's `pause_recording` (`pause`) or `resume_recording`; the shell answers job `job_id`."""

    pause: bool
    job_id: str


@dataclass(frozen=True, slots=True)
class CollectCard:
    """DL6: the model's `collect_card` (bridge/engine/card.py); the shell answers job `job_id` with the outcome."""

    job_id: str


# --- decisions of the rollover controller routed inside the core ---


@dataclass(frozen=True, slots=True)
class StartInput:
    """From now on this connection receives the caller's audio too."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class StopInput:
    """This connection receives no more caller audio."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class TakeFloor:
    """From now on only this connection's audio plays (one speaker at a time, RO8)."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class EmitUtterance:
    """A caller utterance for the application: each one exactly once (RO3)."""

    connection_id: str
    start_ms: int
    end_ms: int
    text: str


@dataclass(frozen=True, slots=True)
class EmitInterim:
    """Interim caller text (never from a connection that only echoes the old one, RO4)."""

    connection_id: str
    start_ms: int
    end_ms: int
    text: str


@dataclass(frozen=True, slots=True)
class EmitUntold:
    """Caller speech (session ms) in no text told: the only text of it, a connection's, was dropped as the
    duplicate of the other connection's, which covers less (RO3; S1: reported as an input discontinuity)."""

    connection_id: str
    start_ms: int
    end_ms: int


RolloverAction = (
    ApproveRollover
    | AuthorizeConnection
    | OpenRollover
    | StartInput
    | CommitInput
    | StopInput
    | TakeFloor
    | CloseTransport
    | EmitUtterance
    | EmitInterim
    | EmitUntold
    | EndSession
)

Command = (
    SendAudio
    | Truncate
    | CancelResponse
    | OpenReplacement
    | OpenRollover
    | CloseTransport
    | CommitInput
    | RequestClose
    | EndSession
    | HangUp
    | ApproveRollover
    | AuthorizeConnection
    | TransferCall
    | WarmTransferCall
    | SendDtmf
    | RecordingTool
    | CollectCard
    | DelegationCommand
)

# --- notices for the log and the metrics (facts) ---


# The output path's media conditions (HR1), detected by bridge/engine/reservoir.py.
@dataclass(frozen=True, slots=True)
class OutputOverflow:
    """`output_overflow`: `dropped_bytes` did not fit (capacity `capacity_bytes`, `depth_bytes` stored)."""

    dropped_bytes: int
    depth_bytes: int
    capacity_bytes: int


@dataclass(frozen=True, slots=True)
class OutputStale:
    """`output_stale`: the oldest unplayed audio is `age_ms` old (deadline `residence_ms`)."""

    age_ms: int
    residence_ms: int
    depth_bytes: int


MediaCondition = OutputOverflow | OutputStale


@dataclass(frozen=True, slots=True)
class ConditionDetected:
    condition: MediaCondition
    at_ms: int


@dataclass(frozen=True, slots=True)
class BargedIn:
    """The caller interrupted: `source` is "provider" or "local_vad" ("hold": the caller put the call on hold,
    S7); `cleared_ms` of unplayed output dropped; `heard` lists each interrupted item with the ms of it
    transmitted, from the carrier ledger."""

    at_ms: int
    source: str
    cleared_ms: int
    heard: tuple[tuple[str, int], ...]
    last_frame_ms: float | None = None  # when the last assistant frame left, relative to the event


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """The caller's turn ended: the barge-in's suppression is over."""

    at_ms: int


@dataclass(frozen=True, slots=True)
class Transcript:
    role: str  # "caller" or "assistant"
    text: str
    at_ms: int
    final: bool
    caption_epoch: int = (
        0  # a recovery starts a fresh grouping epoch: old fragments never merge into new (HR11)
    )
    end_ms: int | None = None  # where the utterance ended on the session timeline, when the provider said


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
    """A rollover step: `what` is "opening", "floor", "closed", "failed", "refused", or "abandoned" (the next
    connection closed because the call ended before it took the floor, S6), with `detail`."""

    what: str
    connection_id: str
    detail: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class RecoveryChanged:
    """`output_recovery` moved: `stage` is "reconnecting", "awaiting_user", "done", "interrupted" (the
    replacement failed in turn) or "failed"."""

    token: int
    cause: str
    stage: str
    elapsed_ms: int


@dataclass(frozen=True, slots=True)
class Reseeded:
    """The provider refused the resumption handle connection `token` was opened with: it is opened once more,
    seeded without it (`purpose` "recovery" or "rollover")."""

    token: int
    purpose: str


Outcome = Literal["delivered", "partial", "not_delivered"]


@dataclass(frozen=True, slots=True)
class DisclosureResult:
    """Whether the disclosure reached the carrier (a notice: the call record and the CDR keep it)."""

    outcome: Outcome
    kind: Literal["audio", "text"]
    reason: str
    transmitted_ms: int
    length_ms: int | None  # the recording's length (None: a line of text)
    at_ms: int  # on the session timeline
    # which announcement: the AI disclosure, or the recording consent (bridge/server/recording.py)
    what: Literal["disclosure", "consent"] = "disclosure"
    ended_ms: int | None = None  # delivered: when its last frame's audio ended on the wire (session ms)

    def to_json(self) -> dict[str, object]:
        return {
            "outcome": self.outcome,
            "kind": self.kind,
            "reason": self.reason,
            "transmitted_ms": self.transmitted_ms,
            "length_ms": self.length_ms,
            "at_ms": self.at_ms,
        }


@dataclass(frozen=True, slots=True)
class NoInputTimeout:
    """The caller was silent for the route's no-input timeout (bridge/engine/no_input.py): the model was asked to
    check in (`prompt`) or, the second time, to say goodbye before the call ends (`goodbye`)."""

    stage: Literal["prompt", "goodbye"]
    silent_ms: int  # the stretch of expected silence that timed out
    sent: bool  # the instruction went to the model (False: over the command-record limit, DL2)
    at_ms: int  # on the session timeline


@dataclass(frozen=True, slots=True)
class TurnTiming:
    """The first audio of an assistant item arrived (bridge/engine/latency.py): the turn's times as the session
    knows them, session ms. `speech_end_ms`: the caller's speech end it answers (None: it answers none, e.g. a
    greeting, a second item of a reply); `kind`: "conversation", "recovery" (a replacement's, HR7) or
    "rollover" (the caller's end was heard by another connection than the one answering, RO8). The first frame
    out is the carrier ledger's (bridge/server/records.py reads it there)."""

    item_id: str
    token: int
    kind: Literal["conversation", "recovery", "rollover"]
    speech_end_ms: int | None
    first_audio_ms: int


Notice = (
    ConditionDetected
    | BargedIn
    | TurnEnded
    | Transcript
    | ProviderError
    | AudioDiscontinuity
    | RecoveryChanged
    | RolloverChanged
    | Reseeded
    | DelegationNotice
    | DisclosureResult
    | NoInputTimeout
    | TurnTiming
)


class Outbox:
    """Where the parts of one session core put what they decided, in order, until the shell pulls it."""

    def __init__(self) -> None:
        self.commands: list[Command] = []
        self.notices: list[Notice] = []

    def take_commands(self) -> list[Command]:
        """What was decided since the last take. (Nothing: the outbox's own empty list, to iterate, not keep.)"""
        commands = self.commands
        if commands:
            self.commands = []
        return commands

    def take_notices(self) -> list[Notice]:
        """As `take_commands` (the shell takes both after every input: no list is made for nothing)."""
        notices = self.notices
        if notices:
            self.notices = []
        return notices
