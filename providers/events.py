"""The provider-neutral event vocabulary: what any realtime provider can tell the session engine.

Adapters translate their wire protocol into these facts (past tense, frozen). The session engine never sees a
provider's JSON. Every event carries the transport token of the connection it came from (DESIGN principle 3):
output from an old token is inert.

Times (`*_ms`) are milliseconds on the provider's own session timeline when the provider gives them (audio
offsets for OpenAI-family VAD events, session-relative ms for GPT-Live), or None. The session engine rebases
them onto its logical timeline (bridge/engine/timeline.py); adapters never guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtp.audio import AudioFormat

TEXT_LIMIT = 200  # characters of a provider's own words (error code and message, close reason) kept


def bounded(text: object, limit: int = TEXT_LIMIT) -> str:
    """`str(text)`, cut to `limit` characters (and "..."). A provider's error code and message and its close
    reason go into the log and the call's end reason; a broken or hostile peer can make them any size
    (nothing is logged raw beyond a bounded prefix)."""
    value = str(text)
    return value if len(value) <= limit else value[:limit] + "..."


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """The provider confirmed the session configuration; `expires_at` is unix seconds, when known."""

    token: int
    session_id: str
    expires_at: int | None = None


@dataclass(frozen=True, slots=True)
class AudioReceived:
    """Assistant audio exactly as received (bytes of `format`), already validated: invalid audio is a fatal
    ProviderError instead (HR1). `item_id` names the assistant item when the protocol has one."""

    token: int
    audio: bytes
    format: AudioFormat
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """The provider's voice activity detection heard the caller start speaking (a barge-in signal)."""

    token: int
    at_ms: int | None = None
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """The provider heard the caller stop speaking."""

    token: int
    at_ms: int | None = None
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class OutputInterrupted:
    """The provider stopped its own output because the caller spoke (Gemini `interrupted`, a Realtime
    response cancelled with reason `turn_detected`). Audio already received for it must not be played."""

    token: int
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class InputTranscript:
    """Text of what the caller said.

    `final` marks the complete transcript of an utterance (`item_id` names it when the protocol does).
    Non-final text is a fragment to append, or, when `cumulative`, the whole text so far (xAI snapshots,
    which may revise earlier words) to replace the previous one.
    """

    token: int
    text: str
    item_id: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    final: bool = False
    cumulative: bool = False


@dataclass(frozen=True, slots=True)
class InputTranscriptFailed:
    """The provider could not transcribe an utterance (so another connection's text may stand: RO3)."""

    token: int
    item_id: str | None
    message: str


@dataclass(frozen=True, slots=True)
class OutputTranscript:
    """Text of what the assistant said or is saying; never proof that the caller heard it."""

    token: int
    text: str
    item_id: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    final: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallRequested:
    """The model asks the application to act: a function call (`kind="function"`, `name` and JSON
    `arguments`) or a GPT-Live delegation (`kind="delegation"`, no task text: `name` is the target).
    `call_id` is the provider's id; the session's job ledger maps it to a job (DL1)."""

    token: int
    call_id: str
    name: str
    arguments: str = "{}"
    kind: str = "function"
    at_ms: int | None = None
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallCancelled:
    """The provider withdrew calls it had requested (Gemini `toolCallCancellation`)."""

    token: int
    call_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ResponseDone:
    """A response or turn is complete (`status`: completed, cancelled, failed, incomplete)."""

    token: int
    response_id: str | None = None
    status: str = "completed"


@dataclass(frozen=True, slots=True)
class UsageUpdated:
    """A usage observation. `cumulative` snapshots replace the previous one (never sum them); otherwise it
    is the usage of one response, to be added."""

    token: int
    audio_seconds: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cumulative: bool = True


@dataclass(frozen=True, slots=True)
class SessionExpiring:
    """The provider will end this connection in about `time_left_ms` (OpenAI `expires_at`, Gemini `goAway`,
    xAI's configured cap): the trigger for a rollover (RO1)."""

    token: int
    time_left_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class ResumptionUpdated:
    """Gemini's session resumption handle: a new connection may continue the conversation with it."""

    token: int
    handle: str
    resumable: bool


@dataclass(frozen=True, slots=True)
class ProviderError:
    """An error the provider reported, or a protocol violation we detected. `fatal` ends the session."""

    token: int
    code: str
    message: str
    fatal: bool
    raw: str | None = None  # the offending frame, for the log (never contains our key)


@dataclass(frozen=True, slots=True)
class SessionClosed:
    """The provider's session is over. `finalized` is true only when the provider said so with its final
    usage (GPT-Live `session.closed`); a socket that just went away is not finalised (HR12)."""

    token: int
    reason: str
    finalized: bool
    audio_seconds: float | None = None
    close_code: int | None = None


ProviderEvent = (
    SessionStarted
    | AudioReceived
    | SpeechStarted
    | SpeechStopped
    | OutputInterrupted
    | InputTranscript
    | InputTranscriptFailed
    | OutputTranscript
    | ToolCallRequested
    | ToolCallCancelled
    | ResponseDone
    | UsageUpdated
    | SessionExpiring
    | ResumptionUpdated
    | ProviderError
    | SessionClosed
)
