"""Caller audio gathered into fewer, larger provider appends (`serve --provider-append-ms`).

Each caller frame is 20 ms. Sending each one as its own append (20) is the lowest latency; at 300 calls the
per-frame JSON, base64, WebSocket framing and TLS record cost most of the provider path, and appending every
100 ms instead cuts that cost about in half (tests/bench/provider_micro.py has the numbers). The price is
latency: the provider hears the caller up to `append_ms - 20` ms later, which delays its turn detection and
answers by as much.

The default, 40, is the most a caller frame waits that the provider path allows (one frame): the session
itself joins two frames per `send_audio` to a protocol that declares `Capabilities.append_frames` 2 (every
one here: their appends take any length), with the rules of bridge/server/session.py `ProviderLinks`, for
20-40 % less CPU per caller frame (tests/bench/session_frame_micro.py). An adapter built with 20 or with 60 to
100 declares 1 instead: each frame goes alone, or its own `AppendBatcher` gathers them.

A plain value object without I/O: the adapter asks it for the bytes to append, and takes what it holds before
a commit, so that a commit still follows all of its audio.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from providers.base import Capabilities
from rtp.audio import AudioFormat
from rtp.resample import PcmInput

APPEND_MS_CHOICES = (20, 40, 60, 80, 100)
DEFAULT_APPEND_MS = 40
PAIRED_APPEND_MS = 40  # the session's pairs (module docstring): the adapter gathers nothing itself


def adapter_batcher(append_ms: int, bytes_per_ms: int) -> AppendBatcher | None:
    """What an adapter built with `append_ms` gathers itself: nothing for 20 (each frame alone) or 40 (the
    session's pairs), an `AppendBatcher` above; ValueError for a value not in APPEND_MS_CHOICES."""
    if append_ms not in APPEND_MS_CHOICES:
        raise ValueError(f"append_ms must be one of {APPEND_MS_CHOICES}, got {append_ms}")
    return AppendBatcher(append_ms, bytes_per_ms) if append_ms > PAIRED_APPEND_MS else None


@dataclass(frozen=True, slots=True)
class CallerInput:
    """How an adapter whose protocol speaks G.711 or PCM16 takes caller audio: G.711 takes 8 kHz frames (a 16 kHz
    leg's 8 kHz view, from the session); PCM16 (on a 16 kHz leg, sip.leg `CallIdentity.media_rate`) takes the
    16 kHz frames as they are, resampled once to its rate (`pcm`), and says so (`Capabilities.wide_input`)."""

    pcm: PcmInput | None
    encode: Callable[[bytes], bytes]
    batch: AppendBatcher | None
    capabilities: Capabilities


def caller_input(
    fmt: AudioFormat,
    encoders: Mapping[AudioFormat, Callable[[bytes], bytes]],
    append_ms: int,
    capabilities: Capabilities,
) -> CallerInput:
    pcm = PcmInput(fmt.rate) if fmt not in encoders else None
    if append_ms != PAIRED_APPEND_MS:  # each frame alone, or its own batcher gathers them (module docstring)
        capabilities = replace(capabilities, append_frames=1)
    if pcm is not None:
        capabilities = replace(capabilities, wide_input=True)
    return CallerInput(
        pcm, encoders.get(fmt, bytes), adapter_batcher(append_ms, fmt.bytes_per_ms), capabilities
    )


class AppendBatcher:
    """Audio bytes in, one append's worth out every `append_ms` (of audio at `bytes_per_ms`)."""

    def __init__(self, append_ms: int, bytes_per_ms: int) -> None:
        if append_ms not in APPEND_MS_CHOICES:
            raise ValueError(f"append_ms must be one of {APPEND_MS_CHOICES}, got {append_ms}")
        self.append_ms = append_ms
        self._limit = append_ms * bytes_per_ms
        self._parts: list[bytes] = []
        self._held = 0

    def add(self, audio: bytes) -> bytes | None:
        """The bytes of the next append once `append_ms` of audio is held, else None (held)."""
        if not self._parts and len(audio) >= self._limit:
            return audio  # 20 ms appends: every frame goes as it is
        self._parts.append(audio)
        self._held += len(audio)
        if self._held < self._limit:
            return None
        return self.take()

    def take(self) -> bytes:
        """Whatever is held (possibly nothing), now: before a commit."""
        audio = b"".join(self._parts)
        self._parts.clear()
        self._held = 0
        return audio
