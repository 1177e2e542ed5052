"""What the session engine needs from a provider connection, whatever the wire protocol.

This grows into the full `Provider` protocol (recovery, rollover, delegations) in later work; today it is the
audio path and the event stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from providers.events import ProviderEvent, SessionStarted
from rtp.audio import AudioFormat


class ProviderUnavailable(RuntimeError):
    """The provider could not be reached or refused the session; the message says why (never the key)."""


class ProviderConnection(Protocol):
    """One upstream realtime session."""

    @property
    def audio_format(self) -> AudioFormat:
        """The format of audio in both directions (GPT-Live uses one format for input and output)."""
        ...

    async def connect(self) -> SessionStarted:
        """Open and configure the session; raises `ProviderUnavailable` with a reason."""
        ...

    def send_audio(self, audio: bytes) -> None:
        """Caller audio in `audio_format`; never blocks."""
        ...

    def events(self) -> AsyncIterator[ProviderEvent]:
        """Events until the session closes (the last one is `SessionClosed`)."""
        ...

    def request_close(self) -> None:
        """Ask the provider to end the session; its `SessionClosed` (with final usage) follows in `events()`."""
        ...

    async def close(self, timeout: float = 2.0) -> None:
        """Close the socket within `timeout` (asking the provider to end the session first if not yet asked)."""
        ...
