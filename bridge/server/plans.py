"""Which provider each call connects to: a provider per config route.

`ProviderPlans` holds the server's default plan — the provider, key, URL and adapter options of `ServerConfig`
with the rollover options scaled from that provider's cap — and one plan per `ProviderEndpoint` a config route
names (`ServerConfig.route_providers`). A call whose `CallSetup.provider` names one of them connects there; any
other call (no route, a route without a provider) takes the default. Plans are built once at start, so a
route's missing key or impossible turn mode refuses the server's start, never a call.

The echo provider is the embedded GPT-Live fake: it is started (once) when the default or any route uses echo
without a URL, and `embed(url)` points every echo plan at it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from bridge.engine.rollover import RolloverOptions
from bridge.server.providers import KINDS, ProviderChoice
from providers.base import SessionSettings
from providers.limits import LimitOverrides

ECHO = "echo"
ECHO_LOCAL_KEY = "echo-local"  # the embedded fake accepts any bearer token; this one is not a secret

Plan = tuple[ProviderChoice, RolloverOptions | None]


@dataclass(frozen=True, slots=True)
class ProviderEndpoint:
    """A provider a config route names, besides the default: its key (read from the environment variable the
    file names; never logged), URL, adapter options and rollover options ("default": from its cap)."""

    name: str  # a name in bridge.server.providers.KINDS, or "echo"
    key: str | None
    url: str | None = None
    options: tuple[tuple[str, Any], ...] = ()
    rollover: RolloverOptions | None | str = "default"
    model: str | None = None  # [providers.NAME] model and voice: this provider's, where a call names none
    voice: str | None = None


class PlanSource(Protocol):
    """What the plans read of the server's configuration (bridge/server/api.py `ServerConfig`)."""

    @property
    def provider(self) -> str: ...
    @property
    def key(self) -> str | None: ...
    @property
    def provider_url(self) -> str | None: ...
    @property
    def provider_options(self) -> tuple[tuple[str, Any], ...]: ...
    @property
    def rollover(self) -> RolloverOptions | None | str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def voice(self) -> str | None: ...
    @property
    def limits(self) -> LimitOverrides | None: ...
    @property
    def turn_detection(self) -> str: ...
    @property
    def route_providers(self) -> tuple[ProviderEndpoint, ...]: ...


def provider_plan(ep: ProviderEndpoint, config: PlanSource) -> Plan:
    """The plan of provider `ep` (with the server's limits and turn mode) and the rollover options scaled from
    its cap; ValueError for a key that is missing or a turn mode the provider cannot do."""
    embedded = ep.name == ECHO
    kind = KINDS["openai-live" if embedded else ep.name]
    key = ECHO_LOCAL_KEY if embedded else ep.key
    if key is None:
        raise ValueError(f"provider {kind.name} needs an API key")
    client_turns = config.turn_detection == "client"
    if client_turns and not kind.client_commits():
        raise ValueError(
            f"provider {kind.name} cannot switch turn detection off (turn detection 'client' "
            "needs openai-realtime or xai)"
        )
    settings = SessionSettings(model=ep.model, voice=ep.voice)  # the provider's own (a call's win)
    choice = ProviderChoice(kind, key, ep.url, settings, config.limits, ep.options)
    rollover = ep.rollover
    options = (
        RolloverOptions.for_cap(kind.session_cap_ms) if isinstance(rollover, str) else rollover
    )  # "default"
    if options is not None and options.client_commits != client_turns:
        options = replace(options, client_commits=client_turns)  # RO5 follows the turn mode
    return choice, options


class ProviderPlans:
    """The default plan and one per route provider (see the module docstring)."""

    def __init__(self, config: PlanSource) -> None:
        c = config
        own = ProviderEndpoint(
            c.provider, c.key, c.provider_url, c.provider_options, c.rollover, c.model, c.voice
        )
        self.default = provider_plan(own, config)
        self._default_echo = config.provider == ECHO and config.provider_url is None
        self._named = {ep.name: provider_plan(ep, config) for ep in config.route_providers}
        self._route_echo = any(ep.name == ECHO and ep.url is None for ep in config.route_providers)

    @property
    def embedded(self) -> bool:
        """Some plan is the embedded echo fake: the server starts it."""
        return self._default_echo or self._route_echo

    def embed(self, url: str) -> None:
        """The embedded fake listens at `url`: every echo plan connects there."""
        if self._default_echo:
            self.default = replace(self.default[0], url=url), self.default[1]
        if self._route_echo:
            choice, rollover = self._named[ECHO]
            self._named[ECHO] = replace(choice, url=url), rollover

    def for_call(self, provider: str | None) -> Plan:
        """The plan of a call whose setup named `provider` (None or an unknown name: the default)."""
        if provider is None:
            return self.default
        return self._named.get(provider, self.default)

    def names(self) -> list[str]:
        return list(self._named)
