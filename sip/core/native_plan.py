"""The native engine's plan from its `EngineConfig` (sip/engine.py), worked out once at start: the registrations
it keeps (RFC 3261 §10: one binding per `register` AoR and per trunk with a registrar), the inbound policy its
core asks about every out-of-dialog request (sip/core/policy.py), the per-source INVITE and OPTIONS rates in force,
and the log line that says who may call. Pure functions: the engine (sip/native/agent.py) does the I/O."""

from __future__ import annotations

import random
from dataclasses import dataclass

from sip.core.auth import Credentials, DigestServer
from sip.core.policy import InboundPolicy, PolicyConfig, check_bind
from sip.core.register import Registration, RegistrationConfig
from sip.core.trunks import TrunkTable
from sip.core.uri import parse_uri
from sip.engine import EngineConfig, digest_realm

DEFAULT_INVITE_RATE = 5.0  # INVITEs per second per source off loopback, then 503
DEFAULT_OPTIONS_RATE = 10.0  # out-of-dialog OPTIONS per second per source off loopback, then dropped


@dataclass(frozen=True, slots=True)
class Binding:
    """One registration to keep (RFC 3261 §10): the AoR, whose credentials, its expiry and keep-alive, the
    address to advertise (None: the local one towards the registrar), and the trunk it belongs to."""

    aor: str
    credentials: Credentials | None = None
    expires_s: int = 3600
    keepalive_s: float | None = 30.0
    external_address: str | None = None
    trunk: str | None = None

    def registration(
        self, destination: tuple[str, int], ours: str, port: int, user_agent: str | None, rng: random.Random
    ) -> Registration:
        """The `Registration` core of this binding, sending to `destination`, advertising `ours`:`port`."""
        user = parse_uri(self.aor).user
        shown = f"[{ours}]" if ":" in ours else ours
        return Registration(
            RegistrationConfig(
                aor=self.aor,
                contact=f"sip:{user}@{shown}:{port}",
                via_host=ours,
                via_port=port,
                destination=destination,
                expires_s=self.expires_s,
                keepalive_s=self.keepalive_s or None,  # the OPTIONS keepalive to the registrar
                user_agent=user_agent,
            ),
            credentials=self.credentials,
            rng=rng,
        )


def registration_plan(config: EngineConfig) -> list[Binding]:
    """The bindings the engine keeps: one per `register` AoR with the engine's credentials (`auth_user`,
    `register_password`), then one per trunk with a registrar, with that trunk's own credentials, expiry,
    keep-alive and external address (an AoR that is both is kept once, as the trunk's). ValueError for an AoR
    that is not sip:USER@HOST[:PORT]."""
    out: list[Binding] = []
    trunk_aors = {t.registrar for t in config.trunks}
    wanted: list[tuple[str, str | None, str | None, int, float | None, str | None, str | None]] = [
        (
            aor,
            config.auth_user,
            config.register_password,
            config.register_expires_s,
            config.register_keepalive_s,
            config.external_address,
            None,
        )
        for aor in config.register
        if aor not in trunk_aors
    ]
    wanted += [
        (
            t.registrar,
            t.auth_user,
            t.register_password,
            t.register_expires_s,
            t.register_keepalive_s,
            t.external_address,
            t.name,
        )
        for t in config.trunks
        if t.registrar is not None
    ]
    for aor, user, password, expires, keepalive, external, trunk in wanted:
        uri = parse_uri(aor)
        if uri.scheme not in ("sip", "sips") or not uri.user:
            raise ValueError(f"expected sip:USER@HOST[:PORT], got {aor!r}")
        credentials = Credentials(user or uri.user, password) if password is not None else None
        out.append(Binding(aor, credentials, expires, keepalive, external, trunk))
    return out


def build_policy(
    config: EngineConfig, registrar_addresses: dict[str, tuple[str, ...]] | None = None
) -> InboundPolicy:
    """The inbound policy (sip/core/policy.py) the engine's core asks first about every out-of-dialog request: the
    allowlist, the per-source INVITE rate, the scanner blocklist and, with `inbound_auth`, a
    digest challenge (401, SHA-256 and MD5) with the configured user's password; each trunk's allowlist and
    digest for the requests matched to it (`registrar_addresses`: trunk name → its registrar's addresses)."""
    auth = None
    if config.inbound_auth is not None:
        user, password = config.inbound_auth
        auth = DigestServer(digest_realm(config), [Credentials(user, password)])
    return InboundPolicy(
        PolicyConfig(
            allow=config.allow,
            drop_unknown=config.drop_unknown,
            invite_rate_per_s=invite_rate(config),
            invite_burst=config.invite_burst,
            options_rate_per_s=options_rate(config),
            options_burst=config.options_burst,
            scanner_user_agents=config.scanner_user_agents,
        ),
        auth=auth,
        trunks=TrunkTable(config.trunks, registrar_addresses),
        realm=digest_realm(config),
    )


def invite_rate(config: EngineConfig) -> float:
    """The per-source INVITE rate in force: the configured one, else 5/s off loopback and none on it."""
    if config.invite_rate_per_s is not None:
        return config.invite_rate_per_s
    return 0.0 if check_bind(config.host, None).ok else DEFAULT_INVITE_RATE


def options_rate(config: EngineConfig) -> float:
    """The per-source OPTIONS rate in force: the configured one, else 10/s off loopback and none on it."""
    if config.options_rate_per_s is not None:
        return config.options_rate_per_s
    return 0.0 if check_bind(config.host, None).ok else DEFAULT_OPTIONS_RATE


def describe_policy(config: EngineConfig) -> str:
    """One log line: who may call."""
    parts = [f"allow {', '.join(config.allow)}" if config.allow else "every source"]
    if config.allow:
        parts.append("others dropped" if config.drop_unknown else "others 403")
    if config.inbound_auth is not None:
        parts.append(
            f"digest user {config.inbound_auth[0]!r} (realm {digest_realm(config)!r}; 5 failures in 60 s ban the "
            "source 10 min, doubling)"
        )
    rate = invite_rate(config)
    if rate > 0:
        parts.append(f"INVITE rate {rate:g}/s per source (burst {config.invite_burst})")
    if (rate := options_rate(config)) > 0:
        parts.append(f"OPTIONS rate {rate:g}/s per source (burst {config.options_burst}), then dropped")
    parts.append("scanner User-Agents dropped")
    for trunk in config.trunks:
        sources = [
            *trunk.allow,
            *([f"registrar {parse_uri(trunk.registrar).host}"] if trunk.registrar else []),
        ]
        user = trunk.inbound_user
        known = ", ".join(sources) or (
            "its digest user only" if user is not None else "nothing: never matched"
        )
        parts.append(
            f"trunk {trunk.name}: from {known}, "
            + (f"digest user {user!r}" if user is not None else "not challenged")
            + f", srtp {trunk.srtp}, nat {'on' if trunk.nat else 'off'}"
            + (f", external address {trunk.external_address}" if trunk.external_address else "")
        )
    return "; ".join(parts)
