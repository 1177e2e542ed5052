"""Audio limits of the generation reservoir: how much received, unplayed audio may wait, and for how long.

Seed 000: the reservoir (audio the provider has sent and the caller has not yet been played) is bounded by a
capacity and a residence deadline. Each provider declares defaults that fit how it sends audio — GPT-Live
paces its output near real time, so 2 s is plenty; providers that burst faster than real time need room for a
whole burst. Session start merges these defaults with the application's explicit limits, explicit winning
per field. An adapter used without the session engine gets no defaults: it must be given limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtp.audio import AudioFormat


@dataclass(frozen=True, slots=True)
class AudioLimits:
    """Capacity in bytes of the received format, and the residence deadline in ms (age since arrival)."""

    capacity_bytes: int
    residence_ms: int

    def __post_init__(self) -> None:
        if self.capacity_bytes <= 0 or self.residence_ms <= 0:
            raise ValueError(f"audio limits must be positive, got {self}")


@dataclass(frozen=True, slots=True)
class LimitOverrides:
    """The application's explicit limits; a field left None keeps the provider's default."""

    capacity_bytes: int | None = None
    residence_ms: int | None = None


@dataclass(frozen=True, slots=True)
class LimitProfile:
    """A provider's defaults in time, converted to bytes for whatever format it sends."""

    capacity_ms: int
    residence_ms: int

    def for_format(self, fmt: AudioFormat) -> AudioLimits:
        return AudioLimits(self.capacity_ms * fmt.bytes_per_ms, self.residence_ms)


# DESIGN §5. OpenAI Realtime GA is not named by the seed; it bursts like xAI, whose protocol it shares.
GPT_LIVE = LimitProfile(capacity_ms=2_000, residence_ms=3_000)
GEMINI_LIVE = LimitProfile(capacity_ms=10_000, residence_ms=11_000)
XAI = LimitProfile(capacity_ms=20_000, residence_ms=21_000)
OPENAI_REALTIME = LimitProfile(capacity_ms=20_000, residence_ms=21_000)
UNDECLARED = LimitProfile(capacity_ms=700, residence_ms=750)


def merge_limits(defaults: AudioLimits, explicit: LimitOverrides | None) -> AudioLimits:
    """Provider defaults with the application's explicit limits on top, per field (SE1)."""
    if explicit is None:
        return defaults
    return AudioLimits(
        explicit.capacity_bytes if explicit.capacity_bytes is not None else defaults.capacity_bytes,
        explicit.residence_ms if explicit.residence_ms is not None else defaults.residence_ms,
    )


def require_limits(limits: AudioLimits | None, adapter: str) -> AudioLimits:
    """An adapter used directly must be told its limits; guessing would hide an overflow."""
    if limits is None:
        raise ValueError(
            f"{adapter} needs explicit AudioLimits when used without the session engine "
            f"(e.g. limits={adapter}.audio_limits(fmt), or your own)"
        )
    return limits
