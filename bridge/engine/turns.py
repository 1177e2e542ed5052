"""The caller's turns: the local voice-activity detector merged with the provider's speech events (SE5 input
side), keyed by declared capabilities, never by the vendor's name.

- `Capabilities.server_vad`: the provider reports the start of caller speech; without it (GPT-Live), or with
  turn detection switched off (`SessionSettings.turn_detection == "client"`, RO5), the local detector's start
  is the barge-in.
- `Capabilities.speech_end_events`: the provider reports the end of caller speech; without it (Gemini), the
  local detector ends the caller's turn, which ends a barge-in's suppression.
- `Capabilities.timed_captions`: caller captions carry times; without them a caption takes the local
  detector's last turn as its span (`local_turn`, for RO3 matching).

The detector runs only where one of those needs it. Every other part sees the result: `CallerStarted`
(`barge`: whether this start is the barge-in source) and `CallerStopped`. Sans-I/O: frames and events in
with `now`, transitions out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.engine.vad import VadOptions, VoiceActivityDetector, VoiceStarted, VoiceStopped
from providers.base import Capabilities
from providers.events import ProviderEvent, SpeechStarted, SpeechStopped
from rtp.units import NS_PER_MS


@dataclass(frozen=True, slots=True)
class CallerStarted:
    source: str  # "provider" or "local_vad"
    provider_ms: int | None  # the provider's time of the start (None: now)
    barge: bool  # this start interrupts the assistant (the authoritative source of starts)
    # the local detector's: when the first voiced frame of the turn arrived (a fact beside the change, not of it)
    heard_ns: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class CallerStopped:
    source: str
    # facts beside the change (bridge/engine/latency.py): the provider's time of the end (its audio offset) and,
    # for the local detector's, when the last voiced frame arrived (monotonic ns)
    provider_ms: int | None = field(default=None, compare=False)
    ended_ns: int | None = field(default=None, compare=False)


TurnChange = CallerStarted | CallerStopped


class TurnTracker:
    def __init__(self, capabilities: Capabilities, vad: VadOptions, *, client_turns: bool = False) -> None:
        self.provider_starts = capabilities.server_vad and not client_turns
        self.provider_ends = capabilities.speech_end_events and self.provider_starts
        self.timed_captions = capabilities.timed_captions
        needed = not self.provider_starts or not self.provider_ends or not self.timed_captions
        self._vad = VoiceActivityDetector(vad) if needed else None
        self._hangover_ns = (
            vad.hangover_ms * NS_PER_MS
        )  # a local stop comes this long after the last voiced frame
        self.local_turn = (0, 0)  # the caller's last turn by the local detector, session ms

    @property
    def speaking(self) -> bool:
        """The local detector hears the caller now (False where it does not run)."""
        return self._vad is not None and self._vad.speaking

    def frame(self, pcm: bytes, now: int, at_ms: int) -> TurnChange | None:
        """One caller frame through the local detector (where it runs)."""
        if self._vad is None:
            return None
        change = self._vad.frame(pcm, now)
        if isinstance(change, VoiceStarted):
            self.local_turn = (at_ms, at_ms)
            # A local start still opens a fresh caller interval (HR10) where the provider reports starts too.
            return CallerStarted("local_vad", None, barge=not self.provider_starts, heard_ns=change.at)
        if isinstance(change, VoiceStopped):
            self.local_turn = (self.local_turn[0], at_ms)
            if self.provider_ends:
                return None
            return CallerStopped("local_vad", ended_ns=change.at - self._hangover_ns)
        return None

    def provider(self, event: ProviderEvent) -> TurnChange | None:
        """A speech event of the connection holding the floor."""
        if isinstance(event, SpeechStarted) and self.provider_starts:
            return CallerStarted("provider", event.at_ms, barge=True)
        if isinstance(event, SpeechStopped):
            return CallerStopped("provider", event.at_ms)
        return None
