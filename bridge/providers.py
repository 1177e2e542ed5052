"""Which provider adapter a session gets: names, API-key variables, defaults, and the merged limits.

The engine builds every connection through `ProviderChoice.connect(token)`, so the first connection and any
later one (recovery replacements, rollovers) are made the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from providers.base import Provider, SessionSettings
from providers.limits import LimitOverrides, merge_limits
from rtp.audio import PCM16_24K, PCMU_8K, AudioFormat


@dataclass(frozen=True, slots=True)
class ProviderKind:
    name: str
    module: str
    adapter: str
    key_variable: str
    output_format: AudioFormat  # what its audio arrives as: the reservoir's limits are bytes of this
    tls_fake: bool = False  # its fake serves TLS only (google-genai insists on wss)
    # How long one connection may last (DESIGN §7): the rollover ages scale from it. OpenAI documents 60 min;
    # xAI's cap is configurable (30-120 min, 30 assumed); Gemini announces each connection's end with goAway
    # (about 10 min), which drives the rollover earlier when it comes.
    session_cap_ms: int = 60 * 60_000


KINDS = {
    kind.name: kind
    for kind in (
        ProviderKind("openai-live", "providers.openai_live", "OpenAILiveAdapter", "OPENAI_API_KEY", PCMU_8K),
        ProviderKind("openai-realtime", "providers.openai_realtime", "OpenAIRealtimeAdapter", "OPENAI_API_KEY", PCMU_8K),
        ProviderKind("gemini-live", "providers.gemini_live", "GeminiLiveAdapter", "GEMINI_API_KEY", PCM16_24K, True,
                     session_cap_ms=10 * 60_000),
        ProviderKind("xai", "providers.xai", "XAIAdapter", "XAI_API_KEY", PCMU_8K, session_cap_ms=30 * 60_000),
    )
}


class MissingKey(ValueError):
    """The provider's API key variable is not set (the message names it)."""


def api_key(kind: ProviderKind, environ: dict[str, str] | None = None) -> str:
    key = (environ if environ is not None else os.environ).get(kind.key_variable, "")
    if not key:
        raise MissingKey(f"--provider {kind.name} needs an API key in the environment variable {kind.key_variable}")
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

    def adapter_class(self) -> Any:
        return getattr(import_module(self.kind.module), self.kind.adapter)

    def connect(self, token: int) -> Provider:
        """A new, not yet connected adapter with its merged limits (SE1)."""
        cls = self.adapter_class()
        if self.kind.name == "openai-live":
            from providers.openai_live import LiveConfig

            config = LiveConfig.from_settings(self.settings)
            limits = merge_limits(cls.audio_limits(config.audio_format), self.overrides)
            return cls(self.key, config, limits=limits, url=self.url, token=token, **dict(self.extra))
        limits = merge_limits(cls.audio_limits(self.kind.output_format), self.overrides)
        return cls(self.key, self.settings, limits=limits, url=self.url, token=token, **dict(self.extra))


ConnectionFactory = Callable[[int], Provider]
