"""What the session engine needs from a provider connection, whatever the wire protocol.

One `Provider` object is one upstream connection (one transport token). Recovery and rollover open another
object with a new token; nothing here reconnects by itself (seed 000: reconnection is never authorisation to
act again, so the engine, not the adapter, decides when a new connection exists).

Audio in is always the caller's telephone audio, 8 kHz PCM16 in 20 ms frames: each adapter converts it to its
wire format (µ-law, or 16 kHz PCM through PyAV for Gemini). Audio out is passed on exactly as received
(`AudioReceived.format`): the generation reservoir counts bytes of the received format, and the session's
framing converts to the carrier's 8 kHz frames only when playing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from providers.events import ProviderEvent, SessionStarted
from providers.limits import AudioLimits
from rtp.audio import AudioFormat


class ProviderUnavailable(RuntimeError):
    """The provider could not be reached or refused the session; the message says why (never the key)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a protocol offers, declared instead of tested with isinstance.

    `server_vad`: the provider reports caller speech (SpeechStarted) itself; without it the session's local
    voice-activity detector drives barge-in (GPT-Live). `truncate`: the provider accepts "the caller heard
    up to N ms of item X" (Realtime GA `conversation.item.truncate`). `interrupts_itself`: the provider stops
    its own output on barge-in. `resumption`: a new connection can continue the conversation by handle.
    `answer_within_ms`: for protocols whose keepalive cannot be trusted (Gemini's pong may take 30 s), the
    longest the provider may stay entirely silent after the caller stops speaking before the connection is
    presumed dead (half-open); None where WebSocket pings find that out.
    """

    server_vad: bool
    truncate: bool
    interrupts_itself: bool
    tool_calls: bool
    resumption: bool = False
    answer_within_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What the application asks of every provider session (each adapter maps it to its protocol)."""

    instructions: str | None = None
    voice: str | None = None
    model: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    history: tuple[tuple[str, str], ...] = ()  # (role, text) seeded before the caller speaks


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call: JSON-schema `parameters` as a JSON object."""

    name: str
    description: str
    parameters: dict[str, object]


class Provider(Protocol):
    """One upstream realtime session."""

    name: str
    token: int
    capabilities: Capabilities

    @property
    def output_format(self) -> AudioFormat:
        """The format of `AudioReceived` audio."""
        ...

    @property
    def limits(self) -> AudioLimits:
        """The reservoir limits this connection runs with (merged by the engine, or given explicitly)."""
        ...

    async def connect(self) -> SessionStarted:
        """Open and configure the session; raises `ProviderUnavailable` with a reason."""
        ...

    def send_audio(self, pcm16_8k: bytes) -> None:
        """Caller audio, 8 kHz PCM16LE; never blocks (the adapter converts and queues it)."""
        ...

    def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Tell the provider the caller heard only `audio_end_ms` of `item_id` (no-op without support)."""
        ...

    def cancel_response(self) -> None:
        """Stop the response being generated, if the protocol has one."""
        ...

    def send_tool_result(self, call_id: str, name: str, output: str) -> None:
        """Answer a ToolCallRequested; the provider continues with a spoken response."""
        ...

    def send_text(self, text: str, *, speak: bool = False) -> None:
        """Add context to the conversation (and ask for a spoken response when `speak`)."""
        ...

    def events(self) -> AsyncIterator[ProviderEvent]:
        """Events until the session closes (the last one is `SessionClosed`)."""
        ...

    def request_close(self) -> None:
        """Ask the provider to end the session; a `SessionClosed` follows in `events()`."""
        ...

    async def close(self, timeout: float = 2.0) -> None:
        """Close the socket within `timeout` (asking the provider to end the session first if not yet asked)."""
        ...
