"""The provider-neutral event vocabulary: what any realtime provider can tell the session engine.

Adapters translate their wire protocol into these facts (past tense, frozen). The session engine never sees a
provider's JSON. Every event carries the transport token of the connection it came from (DESIGN principle 3):
output from an old token is inert.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtp.audio import AudioFormat


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """The provider confirmed the session configuration; `expires_at` is unix seconds, when known."""

    token: int
    session_id: str
    expires_at: int | None


@dataclass(frozen=True, slots=True)
class AudioReceived:
    """Assistant audio in the provider's output format, already validated (HR1: invalid audio is fatal)."""

    token: int
    audio: bytes
    format: AudioFormat
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class InputTranscript:
    """Text of what the caller said; times are ms on the provider's session timeline."""

    token: int
    text: str
    start_ms: int | None = None
    end_ms: int | None = None


@dataclass(frozen=True, slots=True)
class OutputTranscript:
    """Text of what the assistant said (or will say); not proof that the caller heard it."""

    token: int
    text: str
    start_ms: int | None = None
    end_ms: int | None = None


@dataclass(frozen=True, slots=True)
class UsageUpdated:
    """A cumulative usage snapshot: replace, never sum."""

    token: int
    audio_seconds: float


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
    """The provider's session is over (`session.closed`, or the socket went away)."""

    token: int
    reason: str
    finalized: bool
    audio_seconds: float | None = None


ProviderEvent = (
    SessionStarted | AudioReceived | InputTranscript | OutputTranscript | UsageUpdated | ProviderError | SessionClosed
)
