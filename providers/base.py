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

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from providers.events import ProviderEvent, SessionStarted
from providers.limits import AudioLimits
from rtp.audio import AudioFormat


class ProviderUnavailable(RuntimeError):
    """The provider could not be reached or refused the session; the message says why (never the key)."""


class ResumptionRejected(ProviderUnavailable):
    """The provider refused `SessionSettings.resume_handle` (expired or unknown): open a reseeded connection
    without it."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a protocol offers, declared instead of tested with isinstance or by the vendor's name.

    `server_vad`: the provider reports the start of caller speech (SpeechStarted) itself; without it the
    session's local voice-activity detector drives barge-in (GPT-Live). `speech_end_events`: it also reports
    the end of caller speech (SpeechStopped); without it the local detector ends the caller's turn (Gemini).
    `timed_captions`: caller captions carry start/end times on the session timeline; without them they take
    the local detector's turn. `truncate`: the provider accepts "the caller heard up to N ms of item X"
    (Realtime GA `conversation.item.truncate`). `resumption`: a new connection can continue the conversation
    by a handle (`SessionSettings.resume_handle`, from `ResumptionUpdated`); `resumption_while_open`: also while
    the connection that issued the handle is still open, as a rollover's next connection would ask (Gemini
    refuses that, providers.md). `client_commits`: turn detection
    can be switched off (`SessionSettings.turn_detection = "client"`), the engine then commits each caller
    turn with `Provider.commit_input()` (RO5). `answer_within_ms`: for protocols whose keepalive cannot be
    trusted (Gemini's pong may take 30 s), the longest the provider may stay entirely silent after the caller
    stops speaking before the connection is presumed dead (half-open); None where WebSocket pings find that
    out. `response_events`: every response ends with ResponseDone (Realtime's and xAI's `response.done`,
    Gemini's `turnComplete`), also one whose last part is a tool call that comes after its audio; GPT-Live
    names no response boundaries. `append_frames`: how many 20 ms caller frames the session may join into one
    `send_audio` (1: each frame alone); 2 where the protocol takes any length of audio per append, so that the
    provider path's per-append work (encoding, JSON, WebSocket frame, socket write) is paid every 40 ms. The
    session holds a frame for at most one frame (bridge/server/session.py `ProviderLinks`), so the provider,
    its server VAD included, hears the caller at most 20 ms later. `wide_input`: a 16 kHz leg's caller frames
    (G.722, rtp.g722) go to the protocol as they are, `send_audio(pcm, wide=True)`; any other connection gets
    their 8 kHz view from the session (rtp.resample.NarrowView), so an adapter never guesses a rate from a
    length (two 8 kHz frames joined are as long as one 16 kHz frame).
    """

    server_vad: bool
    speech_end_events: bool
    timed_captions: bool
    truncate: bool
    resumption: bool = False
    resumption_while_open: bool = False
    client_commits: bool = False
    answer_within_ms: int | None = None
    response_events: bool = False
    append_frames: int = 1
    wide_input: bool = False


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What the application asks of every provider session (each adapter maps it to its protocol)."""

    instructions: str | None = None
    voice: str | None = None
    model: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    history: tuple[tuple[str, str], ...] = ()  # (role, text) seeded before the caller speaks
    # "server": the provider detects caller turns; "client": turn detection off, the engine commits each turn
    # with `Provider.commit_input()` (only where `Capabilities.client_commits`).
    turn_detection: Literal["server", "client"] = "server"
    # Continue an earlier conversation by the provider's handle (only where `Capabilities.resumption`); a
    # handle the provider no longer honours makes `connect()` raise `ResumptionRejected`.
    resume_handle: str | None = None
    # The language the call is in, a BCP 47 tag ("de-DE"): each adapter puts it in its protocol's own field
    # (providers/language.py) and refuses to be built with one its protocol cannot carry (ValueError).
    language: str | None = None


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

    def send_audio(self, pcm16_8k: bytes, wide: bool = False) -> None:
        """Caller audio, one or more 20 ms frames of 8 kHz PCM16LE, or of 16 kHz when `wide` (a G.722 leg; only
        to a protocol whose capabilities say `wide_input`); never blocks (the adapter converts and queues it)."""
        ...

    def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Tell the provider the caller heard only `audio_end_ms` of `item_id` (no-op without support)."""
        ...

    def cancel_response(self) -> None:
        """Stop the response being generated, if the protocol has one."""
        ...

    def commit_input(self) -> None:
        """Commit the caller audio sent so far as one user turn (RO2 at the hard stop, RO5 in client mode), so
        that it is transcribed and answered; a no-op where the provider has nothing uncommitted."""
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


@runtime_checkable
class DeliversEvents(Protocol):
    """A provider that can hand each event to a sink as its socket's callback parses it, instead of
    through `events()` (no reader task, no queue, no loop iteration per event)."""

    def deliver_to(self, sink: Callable[[ProviderEvent], None]) -> None:
        """From now on every event (the last a `SessionClosed`) goes to `sink`; `events()` is not read."""
        ...
