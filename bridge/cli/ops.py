"""Operations wiring: `serve` (with or without `--config FILE`), `parlora-bridge config check FILE` and
per-route call setup.

bridge/cli/config.py reads and checks the file and lays the command line over it; this module turns the merged
`BridgeConfig` into the `ServerConfig` the server runs with (`server_config`: the one path, for `serve` with and
without a file and for `call`) and into the application that gives each call its route's instructions, voice,
tools and greeting. A thin shell: it reads the environment, files and the click context, never a socket.

Choices (the brief was silent): an inbound call that matches no route when the file has inbound routes is
refused with 404 (`CallRefused`); a call the bridge places gets an outbound route (the one its request names,
or the first matching the dialled number) and [defaults] when none matches, never an inbound route
(bridge/cli/config.py, "Directions"); it goes out on a trunk of the file (bridge/server/dialing.py); a route's `provider`
connects that route's calls to it (bridge/server/plans.py), with its own key, URL, CA and rollover options from the
file's [providers.NAME], checked at start like the default's; a route's (or [defaults]') `language` that its
provider cannot carry refuses the start (`language_problems`). Every key is acted on; what cannot be honoured
refuses to start (`bridge.cli.config.deployment_problems`).

Trunks are identities (sip/core/trunks.py): each `[[trunks]]` becomes the engine's `Trunk` (`trunk_policies`), whose
allowlist, digest, SRTP, NAT, RTP source, external address and registration apply to its own requests alone;
a file with one trunk (or the command line's trunk) is also the global policy, for requests that match none.
A registering trunk's password is optional (a registrar may not challenge; a challenge without it fails,
logged).
"""

from __future__ import annotations

import logging
import os
import ssl
import sys
import wave
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

import click

from bridge.cli.config import (
    ECHO,
    BridgeConfig,
    ConfigError,
    ProviderConfig,
    Route,
    apply_options,
    call_limits,
    deployment_problems,
    environment_problems,
    load,
    missing_files,
    named_route,
    select_route,
)
from bridge.cli.config import Trunk as TrunkSection
from bridge.engine.amd import AmdAction, AmdVerdict
from bridge.engine.calling_hours import OutsideCallingHours
from bridge.engine.card import CardResult
from bridge.engine.delegations import JobRequest
from bridge.engine.dial_limits import TrunkLimits
from bridge.engine.dial_retry import RetryPolicy
from bridge.engine.disclosure import Disclosure
from bridge.engine.rollover import RolloverOptions
from bridge.server.api import (
    ECHO_LOCAL_KEY,
    Application,
    CallRefused,
    CallSetup,
    LiveCall,
    Server,
    ServerConfig,
)
from bridge.server.dialing import DialTrunk
from bridge.server.jsonlog import CALLS as LOG_CALLS
from bridge.server.jsonlog import use_json_logs
from bridge.server.plans import ProviderEndpoint
from bridge.server.providers import KINDS
from bridge.server.records import (
    AmdResult,
    CallRecord,
    CallStarted,
    EarlyMediaReport,
    UncertainWork,
    Utterance,
)
from bridge.server.session import CallSummary
from bridge.server.webhook import WebhookConfig
from providers.batching import DEFAULT_APPEND_MS
from rtp.tones import RINGBACK_TONES
from sip.core.app_headers import DEFAULT_ALLOW
from sip.core.identity import request_user
from sip.core.offer_answer import DEFAULT_CODECS
from sip.core.trunks import Trunk, TrunkTable
from sip.leg import CallIdentity

log = logging.getLogger("parlora")

LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


# --- BridgeConfig -> ServerConfig ------------------------------------------------------------------------------


def _read_message(path: str) -> bytes:
    with wave.open(path, "rb") as wav:
        return wav.readframes(wav.getnframes())


@cache
def early_audio(value: str | None) -> str | bytes | None:
    """`early_media` as the server takes it: None or "off" as they are, a tone by name, a WAV's samples (read
    once per file: the file was checked when the configuration was read)."""
    if value is None or value == "off" or value in RINGBACK_TONES:
        return value
    return _read_message(value)


def server_config(config: BridgeConfig, environ: Mapping[str, str], *, inbound: bool = True) -> ServerConfig:
    """The `ServerConfig` of a checked configuration (the file, the command line over it, or both); ConfigError
    for what it asks that cannot be honoured (`deployment_problems`; `inbound` False: `call`, which answers
    none) and what only the environment can refuse (a missing variable or file, an HTTP listener off loopback
    without a token, inconsistent rollover ages)."""
    problems = [
        str(p) for p in environment_problems(config, environ) if not _optional_password(config.trunks, p.path)
    ]
    problems += deployment_problems(config, inbound=inbound) + missing_files(config)
    provider = config.default_provider(environ)
    pc = config.provider(provider)
    key = ECHO_LOCAL_KEY if provider == ECHO else (environ.get(pc.key_env, "") if pc.key_env else "")
    extra = _adapter_options(pc)
    lis = config.listeners
    token = environ.get(lis.http_token_env) or None if lis.http_token_env else None
    if lis.http is not None and token is None and lis.http[0] not in LOOPBACK_HOSTS:
        problems.append(f"listeners.http: {lis.http[0]} is off loopback: set listeners.http_token_env")
    if lis.http is None and (lis.webrtc_address is not None or lis.stun is not None):
        problems.append(
            "listeners.webrtc_address, stun: apply to the console's Talk button: set listeners.http"
        )
    try:
        rollover = config.rollover_options(provider)
    except ValueError as exc:
        problems.append(f"rollover: {exc}")
        rollover = None
    routed = route_providers(config, provider, environ, problems)
    problems += language_problems(config, provider)
    for name in (provider, *(ep.name for ep in routed)):
        # echo is the embedded GPT-Live fake: no client commits either
        if config.defaults.turn_detection == "client" and not KINDS[_kind(name)].client_commits():
            problems.append(
                f"defaults.turn_detection: client needs openai-realtime or xai; a provider in use is {name}"
            )
    trunks = trunk_policies(config, environ)
    try:
        TrunkTable(trunks)
    except ValueError as exc:  # two trunks with one inbound digest user: a request could not be told apart
        problems.append(f"trunks: {exc}")
    if config.engine.name == "pjsua2" and any(t.codecs != DEFAULT_CODECS for t in trunks):
        problems.append("trunks: codecs: the pjsua2 engine negotiates its own codecs; use the native engine")
    if config.engine.name == "pjsua2" and len({t.policy_key() for t in trunks}) > 1:
        problems.append(
            "engine.name: pjsua2 cannot tell one trunk's requests from another's (it has no per-request "
            f"policy), and trunks {', '.join(t.name for t in trunks)} differ: use the native engine"
        )
    if config.engine.name == "pjsua2" and (config.outbound.amd or any(r.amd for r in config.routes)):
        problems.append(
            "outbound.amd: the pjsua2 engine places no calls and gives no callee frames to a detector: use "
            "the native engine"
        )
    problems += amd_message_problems(config)
    if config.engine.name == "pjsua2" and _early_media_asked(config):
        problems.append(
            "inbound.early_media / outbound.early_media_to_provider: the pjsua2 engine sends no 183 with early "
            "media and gives no early media of the calls it places: use the native engine"
        )
    if config.engine.name == "pjsua2" and (
        config.inbound.sip_headers != DEFAULT_ALLOW or any(t.trust_identity_headers for t in config.trunks)
    ):
        problems.append(
            "inbound.sip_headers / trunks[].trust_identity_headers: the pjsua2 engine matches no trunk to an "
            "INVITE and passes only the default headers: use the native engine"
        )
    if problems:
        raise ConfigError([f"{config.source or 'command line'}: {p}" for p in problems])
    limits = call_limits(config)
    return ServerConfig(
        provider=provider,
        key=key,
        provider_url=pc.url,
        provider_options=extra,
        model=pc.model,
        voice=pc.voice,
        sip=lis.sip_udp,
        rtp_port=config.engine.rtp_port_low,
        rtp_port_high=config.engine.rtp_port_high,
        sip_tcp=lis.tcp,
        tls=lis.sip_tls,
        cert=lis.tls_cert,
        tls_key=lis.tls_key,
        tls_ca=lis.tls_ca,
        max_call_duration_s=limits.max_call_duration_s,
        rtp_timeout_s=limits.rtp_timeout_s,
        hold_timeout_s=limits.hold_timeout_s,
        session_expires_s=config.telephony.session_expires_s,
        max_calls=config.engine.max_calls,
        engine=config.engine.name,
        turn_detection=config.defaults.turn_detection,
        no_input_timeout_s=config.defaults.no_input_timeout_s,
        http=lis.http,
        http_token=token,
        webrtc_address=lis.webrtc_address,
        stun=(lis.stun,) if lis.stun else (),
        instructions=config.defaults.instructions,
        limits=config.limit_overrides(),
        failure_message=_read_message(config.recovery.failure_message)
        if config.recovery.failure_message
        else None,
        rollover=rollover,
        telephony=config.telephony_options(),
        hold_music=_read_message(config.telephony.hold_music) if config.telephony.hold_music else None,
        trunks=trunks,  # each trunk's allowlist, digest, SRTP, NAT and registration: sip/core/trunks.py
        drop_unknown=config.inbound.drop_unknown,
        allow_any=config.inbound.allow_any,
        invite_rate_per_s=config.inbound.invite_rate_per_s,
        options_rate_per_s=config.inbound.options_rate_per_s,
        server_header=config.inbound.server_header,
        realm=config.inbound.realm,
        refuse_failed_attestation=config.inbound.refuse_failed_attestation,
        drain_timeout_s=config.drain.timeout_s,
        amd=config.outbound.amd,
        retry=config.outbound.retry_policy(),  # busy / no-answer retries (bridge/engine/dial_retry.py)
        amd_options=config.outbound.amd_options(),
        amd_machine=config.outbound.amd_machine,
        amd_message=config.outbound.amd_message,
        amd_message_audio=_read_message(config.outbound.amd_message_wav)
        if config.outbound.amd_message_wav
        else None,
        amd_decide_ms=config.outbound.amd_decide_ms,
        early_media=early_audio(config.inbound.early_media),
        early_media_to_provider=config.outbound.early_media_to_provider,
        route_providers=routed,
        pricing=config.pricing,  # each provider's rates (bridge/engine/usage.py)
        cdr=config.logging.cdr,  # bridge/server/records.py: one JSON line per finished call
        record_dir=config.recording.dir,  # bridge/server/recording.py: a stereo WAV per call
        recording_consent=_consent(config.defaults.recording_consent, config.defaults.recording_consent_wav),
        dial_trunks=dial_trunks(config, environ),
        blocked_user_agents=config.inbound.blocked_user_agents,
        sip_headers=config.inbound.sip_headers,
        **_one_trunk_global(trunks),
    )


def _consent(text: str | None, wav: str | None) -> Disclosure | None:
    """A recording consent (bridge/server/recording.py): a line, or a recording read from its WAV."""
    if text is not None:
        return Disclosure(text=text)
    return Disclosure(audio=_read_message(wav)) if wav is not None else None


def amd_message_problems(config: BridgeConfig) -> list[str]:
    """A mailbox's `message` needs a message to leave: [outbound]'s or the route's text or recording."""
    o, problems = config.outbound, []
    if o.amd_machine == "message" and not (o.amd_message or o.amd_message_wav):
        problems.append(
            "outbound.amd_machine: message needs amd_message (a text the model says) or amd_message_wav (a "
            "recording the bridge plays)"
        )
    for i, r in enumerate(config.routes):
        if r.direction == "outbound" and r.amd_machine == "message":
            if not (r.amd_message or r.amd_message_wav or o.amd_message or o.amd_message_wav):
                problems.append(
                    f"routes[{i}].amd_machine: message needs amd_message or amd_message_wav (the route's or "
                    "[outbound]'s)"
                )
    return problems


def _early_media_asked(config: BridgeConfig) -> bool:
    """Whether the configuration asks for early media anywhere (which only the native engine does)."""
    return (
        config.inbound.early_media not in (None, "off")
        or config.outbound.early_media_to_provider
        or any(r.early_media not in (None, "off") or r.early_media_to_provider for r in config.routes)
    )


def _one_trunk_global(trunks: tuple[Trunk, ...]) -> dict[str, Any]:
    """One trunk is also the global policy, as `serve`'s flags are (nothing can leak to another trunk): a
    request it does not match gets its allowlist, digest and SRTP, a call its NAT, RTP source and address. Its
    registrar is kept once, as the trunk's binding (sip.core.native_plan.registration_plan)."""
    if len(trunks) != 1:
        return {}
    t = trunks[0]
    return {
        "allow": t.allow,
        "inbound_auth": t.inbound_auth,
        "register": (t.registrar,) if t.registrar is not None else (),
        "auth_user": t.auth_user,
        "register_password": t.register_password,
        "register_keepalive_s": t.register_keepalive_s,
        "register_expires_s": t.register_expires_s,
        "srtp": t.srtp,
        "codecs": t.codecs,
        "external_address": t.external_address,
        "nat": t.nat,
        "rtp_source": t.rtp_source,
    }


def trunk_policies(config: BridgeConfig, environ: Mapping[str, str]) -> tuple[Trunk, ...]:
    """Each `[[trunks]]` as the SIP engine's `Trunk` (sip/core/trunks.py), its passwords from the environment."""
    return tuple(
        Trunk(
            t.name,
            allow=t.allow,
            inbound_auth=(t.inbound_auth_user, environ.get(t.inbound_password_env, ""))
            if t.inbound_auth_user is not None
            else None,
            srtp="required" if t.srtp == "require" else "optional" if t.srtp == "offer" else "off",
            nat=t.nat,
            rtp_source=t.rtp_source,
            external_address=t.external_address,
            registrar=t.registrar,
            auth_user=t.auth_user,
            register_password=environ.get(t.password_env) or None if t.needs_password else None,
            register_expires_s=t.register_expires_s,
            register_keepalive_s=t.register_keepalive_s or None,
            trust_identity_headers=t.trust_identity_headers,
            codecs=t.codecs,
        )
        for t in config.trunks
    )


def dial_trunks(config: BridgeConfig, environ: Mapping[str, str]) -> tuple[DialTrunk, ...]:
    """The file's trunks as calls placed through them use them (bridge/server/dialing.py), each with its own password."""
    return tuple(
        DialTrunk(
            t.name,
            t.registrar,
            t.allow,
            t.auth_user,
            environ.get(t.password_env) or None if t.needs_password else None,
            TrunkLimits(cps=t.cps, max_calls=t.max_calls),
        )
        for t in config.trunks
    )


def _kind(provider: str) -> str:
    """The protocol of `provider`: the embedded echo speaks GPT-Live's."""
    return "openai-live" if provider == ECHO else provider


def language_problems(config: BridgeConfig, default: str) -> list[str]:
    """Each language (of [defaults] and of every route) that the provider its calls reach cannot carry
    (providers/language.py): refused at start rather than dropped."""
    d = config.defaults
    uses = [("defaults.language", d.language, default)]
    for i, r in enumerate(config.routes):
        where = f"routes[{i}].language" if r.language else f"defaults.language (for routes[{i}])"
        uses.append((where, r.language or d.language, r.provider or default))
    out: list[str] = []
    for where, language, provider in uses:
        if language is None:
            continue
        try:
            KINDS[_kind(provider)].check_language(language)
        except ValueError as exc:
            out.append(f"{where}: {provider}: {exc}")
    return list(dict.fromkeys(out))


def _optional_password(trunks: Sequence[TrunkSection], path: str) -> bool:
    """A registering trunk without an auth_user may do without its password (the registrar may not challenge;
    the AoR's user is the digest user when it does): not a reason to refuse the start."""
    for i, trunk in enumerate(trunks):
        if path == f"trunks[{i}].password_env":
            return trunk.auth_user is None
    return False


def _adapter_options(pc: ProviderConfig) -> tuple[tuple[str, object], ...]:
    extra: tuple[tuple[str, object], ...] = ()
    if pc.ca is not None:
        extra += (("ssl_context", ssl.create_default_context(cafile=pc.ca)),)
    if pc.append_ms != DEFAULT_APPEND_MS:
        extra += (("append_ms", pc.append_ms),)
    return extra


def route_providers(
    config: BridgeConfig, default: str, environ: Mapping[str, str], problems: list[str]
) -> tuple[ProviderEndpoint, ...]:
    """The providers the routes name besides `default`, each with its key from its variable (a missing one is
    in `problems` already, from `environment_problems`), URL, adapter options and rollover options."""
    out: list[ProviderEndpoint] = []
    for name in dict.fromkeys(r.provider for r in config.routes if r.provider and r.provider != default):
        pc = config.provider(name)
        key = ECHO_LOCAL_KEY if name == ECHO else (environ.get(pc.key_env, "") if pc.key_env else "")
        try:
            rollover: RolloverOptions | None = config.rollover_options(name)
        except ValueError as exc:
            problems.append(f"rollover ({name}): {exc}")
            rollover = None
        out.append(ProviderEndpoint(name, key, pc.url, _adapter_options(pc), rollover, pc.model, pc.voice))
    return tuple(out)


def dialled_user(target: str) -> str:
    """The number a dial's target names: a bare number as it is (the trunk's), else the URI's user part, as an
    outbound route matches the call it places (`RoutedApplication.setup_outbound`)."""
    return request_user(target) if ":" in target else target.strip()


# --- per-call setup from the routes -----------------------------------------------------------------------------


class RoutedApplication(Application):
    """The route of each call gives its instructions, voice, tools and greeting; everything else goes to the
    wrapped application (`serve`'s default, or the webhook). An answered call's route is `select_route` on the
    called number and SIP headers among the inbound routes (none matching while the file has inbound routes:
    404); a placed call's is the outbound route its request named, or the first outbound route matching the
    dialled number, or none ([defaults])."""

    def __init__(
        self,
        inner: Application,
        config: BridgeConfig,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._inner = inner
        self._config = config
        self._now = now  # the wall clock a route's calling window is read on
        self._recordings: dict[str, bytes] = {}  # routes' disclosure WAVs, read at their first call
        # each route's own recording consent, read once ([defaults]' is the server's: ServerConfig)
        self._consents = {
            r.name: _consent(r.recording_consent, r.recording_consent_wav) for r in config.routes
        }
        # each outbound route's AMD message recording, read once (the file was checked at load)
        self._messages = {
            r.name: _read_message(r.amd_message_wav) for r in config.routes if r.amd_message_wav is not None
        }

    async def setup(self, call: CallIdentity) -> CallSetup:
        base = await self._inner.setup(call)
        routes = self._config.routes
        route = select_route(routes, call.request_user, call.headers, "inbound", call.caller)
        if route is None and any(r.direction == "inbound" for r in routes):
            raise CallRefused(404, f"no route for the called number {call.request_user!r}")
        return self._setup(call, base, route)

    def check_outbound(self, target: str, route: str | None) -> None:
        """The named route must be an outbound one; the route the call goes out on (named, or the first
        matching the dialled number) must be inside its calling window (OutsideCallingHours); then the wrapped
        application's own check (a do-not-call list, say)."""
        routes = self._config.routes
        chosen = (
            named_route(routes, route, "outbound")  # ValueError: unknown, or an inbound route
            if route is not None
            else select_route(routes, dialled_user(target), (), "outbound")
        )
        if chosen is not None and (hours := chosen.calling_hours) is not None:
            now = self._now()
            if not hours.allows(now):
                raise OutsideCallingHours(chosen.name, hours, hours.opens_after(now))
        self._inner.check_outbound(target, None)

    def retry_policy(self, target: str, route: str | None) -> RetryPolicy | None:
        """The retry policy of the route the call goes out on (its fields over [outbound]'s), else [outbound]'s."""
        routes = self._config.routes
        chosen = (
            named_route(routes, route, "outbound")
            if route is not None
            else select_route(routes, dialled_user(target), (), "outbound")
        )
        return self._config.outbound.retry_policy(chosen)

    async def setup_outbound(self, call: CallIdentity, route: str | None) -> CallSetup:
        base = await self._inner.setup_outbound(call, None)
        routes = self._config.routes
        chosen = (
            named_route(routes, route, "outbound")
            if route is not None
            else select_route(routes, call.request_user, (), "outbound")
        )
        return self._setup(call, base, chosen)

    def _setup(self, call: CallIdentity, base: CallSetup, route: Route | None) -> CallSetup:
        """`route`'s setup over the wrapped application's `base` over [defaults] (None: [defaults] alone)."""
        d = self._config.defaults
        if route is None:
            return CallSetup(
                instructions=base.instructions or d.instructions,
                voice=base.voice or d.voice,
                tools=base.tools,
                history=base.history,
                greeting=base.greeting or d.greeting,
                language=base.language or d.language,
                amd=base.amd,
                disclosure=base.disclosure,
                amd_machine=base.amd_machine,
                amd_message=base.amd_message,
                amd_message_audio=base.amd_message_audio,
                early_media=base.early_media,
                early_media_to_provider=base.early_media_to_provider,
                recording_consent=base.recording_consent,
                no_input_timeout_s=base.no_input_timeout_s,
                budget=base.budget,
            )
        own_message = route.amd_message is not None or route.amd_message_wav is not None
        LOG_CALLS.route(call.call_id, route.name)  # JSON log lines carry it from here on
        log.info("call %s: route %s", call.call_id, route.name)
        return CallSetup(
            instructions=route.instructions or base.instructions or d.instructions,
            voice=route.voice or base.voice or d.voice,
            tools=route.tools + base.tools,
            history=base.history,
            greeting=route.greeting or base.greeting or d.greeting,
            route=route.name,
            provider=route.provider,  # None: the default provider (bridge/server/plans.py)
            language=route.language or base.language or d.language,
            amd=route.amd if route.amd is not None else base.amd,
            disclosure=self._disclosure(route) or base.disclosure,
            amd_machine=route.amd_machine or base.amd_machine,
            # the route's message (its text, its recording or both) replaces any other
            amd_message=route.amd_message if own_message else base.amd_message,
            amd_message_audio=self._messages.get(route.name) if own_message else base.amd_message_audio,
            early_media=early_audio(route.early_media) if route.early_media is not None else base.early_media,
            early_media_to_provider=route.early_media_to_provider
            if route.early_media_to_provider is not None
            else base.early_media_to_provider,
            recording_consent=self._consents.get(route.name) or base.recording_consent,
            no_input_timeout_s=route.no_input_timeout_s
            if route.no_input_timeout_s is not None
            else base.no_input_timeout_s,
            budget=route.budget if route.budget is not None else base.budget,
        )

    def _disclosure(self, route: Route) -> Disclosure | None:
        """A route's disclosure (bridge/engine/disclosure.py): its line, or its recording (read once)."""
        if route.disclosure is not None:
            return Disclosure(text=route.disclosure)
        if route.disclosure_wav is None:
            return None
        if (audio := self._recordings.get(route.disclosure_wav)) is None:
            audio = self._recordings[route.disclosure_wav] = _read_message(route.disclosure_wav)
        return Disclosure(audio=audio)

    async def job(self, call: LiveCall, job: JobRequest) -> str:
        return await self._inner.job(call, job)

    async def dtmf(self, call: LiveCall, digit: str) -> None:
        await self._inner.dtmf(call, digit)

    async def card_collected(self, call: LiveCall, result: CardResult) -> None:
        await self._inner.card_collected(call, result)

    async def call_started(self, call: LiveCall, event: CallStarted) -> None:
        await self._inner.call_started(call, event)

    async def utterance(self, call: LiveCall, utterance: Utterance) -> None:
        await self._inner.utterance(call, utterance)

    async def work_uncertain(self, call: LiveCall, event: UncertainWork) -> None:
        await self._inner.work_uncertain(call, event)

    async def amd_result(self, call: LiveCall, event: AmdResult) -> None:
        await self._inner.amd_result(call, event)

    async def amd_action(self, call: LiveCall, verdict: AmdVerdict, default: AmdAction) -> AmdAction | None:
        return await self._inner.amd_action(call, verdict, default)

    async def early_media(self, call: LiveCall, event: EarlyMediaReport) -> None:
        await self._inner.early_media(call, event)

    async def call_ended(self, call: LiveCall, record: CallRecord) -> None:
        await self._inner.call_ended(call, record)

    async def ended(self, call: LiveCall, summary: CallSummary) -> None:
        await self._inner.ended(call, summary)

    async def approve_rollover(self, call: LiveCall, rollover_id: str) -> bool:
        return await self._inner.approve_rollover(call, rollover_id)

    async def authorize(self, connection_id: str) -> bool:
        return await self._inner.authorize(connection_id)


# --- the commands -------------------------------------------------------------------------------------------------


def _refuse(problems: tuple[str, ...] | list[str]) -> NoReturn:
    for line in problems:
        click.echo(f"error: {line}", err=True)
    sys.exit(2)


@dataclass(frozen=True, slots=True)
class Built:
    """What `serve` runs: the merged configuration, the server's, and the application's webhook (if any)."""

    config: BridgeConfig
    server: ServerConfig
    webhook: WebhookConfig | None


def build(
    path: str | None, given: Mapping[str, object], environ: Mapping[str, str], *, inbound: bool = True
) -> Built:
    """The one path of `serve` (and `call`): the file (or an empty configuration) with the command line's
    given options over it, its ServerConfig and webhook. ConfigError with one line per problem."""
    config = apply_options(load(path) if path else BridgeConfig(), given)
    server = server_config(config, environ, inbound=inbound)
    webhook = None
    if config.webhook.url is not None:
        try:
            webhook = WebhookConfig.from_options(
                config.webhook.url,
                timeout_s=config.webhook.timeout_s,
                ca_file=config.webhook.ca,
                environ=environ,
            )
        except ValueError as exc:
            raise ConfigError([f"{config.source or 'command line'}: webhook.url: {exc}"]) from None
    return Built(config, server, webhook)


def serve_config(
    path: str | None,
    given: Mapping[str, object],
    *,
    setup_logging: Callable[[str], None],
    webhook_application: Callable[[WebhookConfig], Application],
    run: Callable[[Server], int],
) -> int:
    """The body of `serve`: build (exit 2 with one line per problem when it cannot), set up logging, run."""
    try:
        built = build(path, given, os.environ)
    except ConfigError as exc:
        _refuse(exc.problems)
    config, sc = built.config, built.server
    setup_logging(config.logging.level)
    if config.logging.format == "json":
        use_json_logs()
    log.info("call limits: %s", call_limits(config).describe())
    for ep in sc.route_providers:  # a provider per route (bridge/server/plans.py)
        routes = [r.name for r in config.routes if r.provider == ep.name]
        log.info("provider %s for route(s) %s at %s", ep.name, ", ".join(routes), ep.url or "its endpoint")
    application: Application = Application()
    if built.webhook is not None:
        log.info(
            "application webhook: POST %s (timeout %g s)", built.webhook.display_url, built.webhook.timeout_s
        )
        application = webhook_application(built.webhook)
    return run(Server(RoutedApplication(application, config), sc))


@click.group("config")
def config_group() -> None:
    """The configuration file (deploy/example.toml shows every section)."""


@config_group.command("check")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def config_check(path: Path) -> None:
    """Check FILE without starting: exit 1 on errors; unset environment variables are warnings."""
    try:
        config = load(path)
    except ConfigError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        sys.exit(1)
    refused = deployment_problems(config)
    for line in refused:
        click.echo(f"error: {path}: {line}", err=True)
    if refused:
        sys.exit(1)
    for problem in [*map(str, environment_problems(config, os.environ)), *missing_files(config)]:
        click.echo(f"warning: {path}: {problem}", err=True)
    click.echo(f"{path}: ok ({len(config.routes)} routes, {len(config.trunks)} trunks)")
