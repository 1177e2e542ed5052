"""Which provider adapter a session gets: names, API-key variables, defaults, and the merged limits.

The engine builds every connection through `ProviderChoice.connect(token)`, so the first connection and any
later one (recovery replacements, rollovers) are made the same way. With `PARLORA_PROBE` set it also hands
each adapter the benchmark's wire tap (rtp/probe.py): providers never import the probe themselves (DESIGN §2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from providers.base import Capabilities, Provider, SessionSettings
from providers.limits import LimitOverrides, merge_limits
from providers.ws_shell import WireTap
from rtp import probe
from rtp.audio import PCM16_24K, PCMU_8K, AudioFormat


@dataclass(frozen=True, slots=True)
class ProviderKind:
    name: str
    module: str
    adapter: str
    key_variable: str
    output_format: AudioFormat  # what its audio arrives as: the reservoir's limits are bytes of this
    # How long one connection may last (DESIGN §7): the rollover ages scale from it. OpenAI documents 60 min;
    # xAI's cap is configurable (30-120 min, 30 assumed); Gemini announces each connection's end with goAway
    # (about 10 min), which drives the rollover earlier when it comes.
    session_cap_ms: int = 60 * 60_000
    # Its format both ways on a 16 kHz leg (G.722, Opus: sip.leg `CallIdentity.media_rate`), where it has one
    # wider than `output_format`: the OpenAI family's PCM16 at 24 kHz (Gemini's input is 16 kHz anyway).
    wide_format: AudioFormat | None = None

    def check_language(self, tag: str) -> None:
        """ValueError when this protocol cannot carry the language `tag` (each adapter's `check_language`)."""
        getattr(import_module(self.module), self.adapter).check_language(tag)

    def client_commits(self) -> bool:
        """Whether the protocol can run with turn detection off (`SessionSettings.turn_detection="client"`)."""
        capabilities: Capabilities = getattr(import_module(self.module), self.adapter).capabilities
        return capabilities.client_commits


KINDS = {
    kind.name: kind
    for kind in (
        ProviderKind(
            "openai-live",
            "providers.openai_live",
            "OpenAILiveAdapter",
            "OPENAI_API_KEY",
            PCMU_8K,
            wide_format=PCM16_24K,
        ),
        ProviderKind(
            "openai-realtime",
            "providers.openai_realtime",
            "OpenAIRealtimeAdapter",
            "OPENAI_API_KEY",
            PCMU_8K,
            wide_format=PCM16_24K,
        ),
        ProviderKind(
            "gemini-live",
            "providers.gemini_live",
            "GeminiLiveAdapter",
            "GEMINI_API_KEY",
            PCM16_24K,
            session_cap_ms=10 * 60_000,
        ),
        ProviderKind(
            "xai",
            "providers.xai",
            "XAIAdapter",
            "XAI_API_KEY",
            PCMU_8K,
            session_cap_ms=30 * 60_000,
            wide_format=PCM16_24K,
        ),
    )
}


class ProbeTap:
    """The latency probe's points `ws_sent` / `ws_received` for one connection, keyed by its call (the session
    task that opens every connection of a call is named after it)."""

    def __init__(self) -> None:
        self.call = probe.current_call()

    def audio_sent(self, t_ns: int, frame: str) -> None:
        probe.ws_sent(self.call, t_ns, frame)

    def audio_received(self, t_ns: int, audio: bytes, fmt: AudioFormat) -> None:
        probe.ws_received(self.call, t_ns, audio, fmt)


def probe_tap() -> WireTap:
    return ProbeTap()


class MissingKey(ValueError):
    """The provider's API key variable is not set (the message names it)."""


def api_key(kind: ProviderKind, environ: dict[str, str] | None = None) -> str:
    key = (environ if environ is not None else os.environ).get(kind.key_variable, "")
    if not key:
        raise MissingKey(
            f"--provider {kind.name} needs an API key in the environment variable {kind.key_variable}"
        )
    return key


@dataclass(frozen=True)
class ProviderChoice:
    """Everything needed to open a connection to the chosen provider."""

    kind: ProviderKind
    key: str
    url: str | None
    settings: SessionSettings
    overrides: LimitOverrides | None = None
    extra: tuple[tuple[str, Any], ...] = ()  # adapter-specific keyword arguments (e.g. a TLS context)
    media_rate: int = 8000  # the leg's (sip.leg `CallIdentity.media_rate`): 16000 picks `kind.wide_format`

    def audio_format(self) -> AudioFormat:
        """The format the connection negotiates: the kind's wide one on a 16 kHz leg, else its own."""
        wide = self.kind.wide_format
        return wide if wide is not None and self.media_rate == 16000 else self.kind.output_format

    def adapter_class(self) -> Any:
        return getattr(import_module(self.kind.module), self.kind.adapter)

    def connect(self, token: int) -> Provider:
        """A new, not yet connected adapter with its merged limits (SE1)."""
        cls = self.adapter_class()
        if self.settings.turn_detection == "client" and not cls.capabilities.client_commits:
            raise ValueError(f"{self.kind.name} cannot switch turn detection off (client turn detection)")
        extra = dict(self.extra)
        if probe.ENABLED:  # benchmark instrumentation (PARLORA_PROBE)
            extra.setdefault("wire_tap", probe_tap)
        if self.kind.name == "openai-live":
            from providers.openai_live import LiveConfig

            config = LiveConfig.from_settings(self.settings, self.audio_format())
            limits = merge_limits(cls.audio_limits(config.audio_format), self.overrides)
            live: Provider = cls(self.key, config, limits=limits, url=self.url, token=token, **extra)
            return live
        fmt = self.audio_format()
        if fmt != self.kind.output_format:
            extra["audio_format"] = fmt
        limits = merge_limits(cls.audio_limits(fmt), self.overrides)
        adapter: Provider = cls(self.key, self.settings, limits=limits, url=self.url, token=token, **extra)
        return adapter
