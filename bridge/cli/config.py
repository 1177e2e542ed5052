"""`serve --config bridge.toml`: the typed configuration file, its checks, route selection and CLI overrides.

The file (read with `tomllib`) has these sections; every key is optional unless marked, and deploy/example.toml
shows each one with a comment:

    [listeners]   sip_udp, sip_tcp ("HOST:PORT": sip_udp's, the default; or "off"), sip_tls, tls_cert, tls_key,
                  tls_ca, http, http_token_env, webrtc_address, stun ("stun:HOST[:PORT]")
    [engine]      name (native | pjsua2), max_calls, rtp_ports ("LOW-HIGH", or the first port as a number)
    [defaults]    provider, instructions | instructions_file, greeting, language, voice, turn_detection,
                  recording_consent | recording_consent_wav (the recording consent: bridge/server/recording.py),
                  no_input_timeout_s (the caller's silence before the model checks in, and again before the call
                  ends with a goodbye: bridge/engine/no_input.py; 0 or "off", the default: never)
    [providers.NAME]  (NAME one of openai-live, openai-realtime, gemini-live, xai) key_env, model, voice, url, ca
    [[trunks]]    name*, registrar, auth_user, password_env, register_expires_s, register_keepalive_s,
                  allow (CIDRs), inbound_auth_user, inbound_password_env, transport, srtp, external_address, nat,
                  rtp_source (learn | strict), cps, max_calls, trust_identity_headers (its P-Asserted-Identity
                  and Diversion give the caller ID: sip/core/app_headers.py), codecs (offered and accepted, in
                  order, of PCMU, PCMA, G722, OPUS (16 kHz inside: rtp/g722.py, rtp/opus.py); default
                  PCMU, PCMA)
    [inbound]     drop_unknown, allow_any, invite_rate_per_s, options_rate_per_s, blocked_user_agents,
                  server_header, realm, refuse_failed_attestation, early_media (off | ringback | ringback-us |
                  a WAV: 183 and early media while the provider connects, sip/native/early.py), sip_headers
                  (the inbound headers the application sees: sip/core/app_headers.py)
    [[routes]]    name*, direction (inbound | outbound), number | pattern, header = {name, value}, caller (the
                  caller's number or a pattern: P-Asserted-Identity's on a trusted trunk, else From's), attestation
                  (passed | failed | none | absent), provider,
                  instructions | instructions_file, tools = [{name, description, parameters}], greeting,
                  language, voice, amd, amd_machine, amd_message, amd_message_wav (outbound routes: override
                  [outbound]'s), calling_hours and timezone (outbound routes: "mon-fri 09:00-20:00" in an IANA
                  zone), retry_attempts, retry_on, retry_delay_s (outbound routes: override [outbound]'s),
                  disclosure (the AI disclosure, the call's first audio: a WAV file — a value ending in .wav — the
                  bridge plays, or a line the model must say first: bridge/engine/disclosure.py), early_media
                  (inbound routes: overrides [inbound] early_media), early_media_to_provider (outbound routes:
                  overrides [outbound] early_media_to_provider), recording_consent (a line the model says
                  first) | recording_consent_wav (a recording the bridge plays; both over [defaults]'s: the
                  recording starts once it was heard whole, bridge/server/recording.py), no_input_timeout_s
                  (overrides [defaults]'), budget (a price, currency-less: at it the call ends with a goodbye,
                  reason "budget": bridge/engine/usage.py; none: no limit)
    [pricing.NAME]  (NAME a provider, or echo) audio_per_minute, input_tokens_per_million,
                  output_tokens_per_million: the rates a call's usage is priced at, replay included
    [rollover]    enabled, session_cap_ms, after_ms, deadline_ms, hard_stop_ms, overlap_ms
    [recovery]    reservoir_bytes, residence_ms, failure_message (a WAV, 8 kHz mono 16-bit)
    [telephony]   end_call_tool, send_dtmf_tool, dtmf_to_model, recording_tools, warm_transfer_ring_s, transfer_targets = {NAME = "sip:URI"},
                  max_call_duration_s, rtp_timeout_s, hold_timeout_s (seconds, or 0 / "off")
    [webhook]     url, timeout_s, ca              (the signing secret is always in $PARLORA_WEBHOOK_SECRET)
    [logging]     level, format (text | json), cdr (a file: one JSON line per finished call)
    [recording]   dir (a stereo WAV per call)
    [drain]       timeout_s
    [outbound]    amd (answering-machine detection on calls placed: bridge/engine/amd.py, bridge/server/session.py),
                  retry_attempts, retry_on, retry_delay_s (busy / no-answer retries: bridge/engine/dial_retry.py)
                  amd_machine (talk | message | hang_up: after a mailbox verdict), amd_message (the text the model
                  says) | amd_message_wav (a recording played; 8 kHz mono 16-bit), amd_total_ms,
                  amd_machine_greeting_ms, amd_beep_wait_ms, amd_decide_ms
                  early_media_to_provider (the far end's early media to the model too: bridge/engine/early_media.py)

Rules:
- A bad file is refused with every problem at once, one line each: the file, the key path and what was
  expected, e.g. `bridge.toml: routes[2].provider: expected one of openai-live, openai-realtime, gemini-live,
  xai, echo; got "gpt"`. Array indexes are 0-based (`routes[0]` is the first `[[routes]]`). Unknown keys are
  errors (with a "did you mean" where one is close), never ignored.
- Secrets are never in the file: keys and passwords are named by their environment variable (`key_env`,
  `password_env`, ...). A value there that is not a variable name is refused without being echoed back.
- Relative paths (instructions_file, failure_message, TLS files, cdr, recording dir) are relative to the
  directory of the config file.
- Environment variables the configuration needs but that are not set are found by `environment_problems()`
  (the file itself stays valid): `parlora-bridge config check` prints them as warnings (the file may be
  checked on another machine than the one it runs on) and `serve` refuses to start while any is missing.
  Only what is in use is needed: the key of a provider no route (and not the default) uses is not.

Routes: the first route in file order that matches the call wins. A route matches when its number matches
the called number (the Request-URI user) and its header, if it has one, is present with that value (header
names case-insensitive, value exact); a route without number and pattern matches every number (a catch-all:
it must be the last route without a header, or the routes after it could never match). An inbound route with
`attestation` matches only calls whose carrier verstat (sip/core/attestation.py: passed, failed, none, absent) is
that one, e.g. a route for "failed" that screens the caller instead of refusing. `number` is compared
exactly. `pattern` uses Asterisk's dialplan syntax, which telephony engineers already read:

    _         starts every pattern
    X Z N     one digit 0-9, 1-9, 2-9 (case-insensitive)
    [1-5]     one character of a set (digits, ranges)
    .  !      as the last character: one or more / zero or more characters of anything
    other     0-9 + * # are literal

    _+4930XXXXXXX   a Berlin number   _0800.   anything after 0800   _[2-9]XX   three-digit extensions

No route matching means the call has no configuration: `select_route` returns None and the caller refuses the
call (404). A file without routes sends every call to [defaults].

Directions: a route is for calls the bridge answers (`direction = "inbound"`, the default) or for calls it
places (`"outbound"`: `POST /calls`, `parlora-bridge call`). Each call is matched against the routes of its own
direction only, so an outbound call never gets an inbound route's instructions or greeting. An outbound route
matches on the dialled number (the target URI's user part) with the same `number`/`pattern` language; it has no
`header` (the bridge writes the INVITE itself). An outbound call may name its route (`route` in `POST /calls`,
`call --route`): it must be an outbound route. An outbound call that matches no outbound route is placed with
[defaults]: the operator asked for it, and refusing it with 404 would only hide the mistake in a log (an
inbound 404 tells the caller's carrier; an outbound one tells nobody).

One configuration (DESIGN §3.7): `OPTIONS` is the one table of `serve`'s options, one row each: its flags,
the file key it sets, its click type, the default --help shows, and its help. `serve`'s (and `call`'s and
`doctor`'s) click options are made from it (`click_options`). A flag's value becomes its key's value as the
file would hold it and goes through the file's own reader (`apply_options`), so a flag and its key cannot
differ; `given_options(ctx)` picks the options the user actually gave (not click's defaults), so `serve` is
`apply_options(load(path) if path else BridgeConfig(), given_options(ctx))`, and bridge.cli.ops.server_config
is the one way from there to the server's configuration. What the merged configuration asks for that cannot
be honoured (a TLS trunk without a TLS listener, a limit the engine cannot enforce, ...) is refused at start
(`deployment_problems`), never warned about and ignored.

Defaults a telephony engineer ships (`call_limits`; each one is switched off by 0 or "off"; the pjsua2
engine, which cannot end calls on the maximum duration or the RTP timeout, has only the hold limit and
refuses the other two):
- RTP timeout 60 s (`rtp_timeout_s`): a live caller's phone sends RTP every 20 ms (one with silence
  suppression sends comfort noise now and then); 60 s without any is a call whose BYE was lost (a phone that lost power or network, a NAT binding gone), and a lost BYE otherwise keeps a billed
  provider connection open for ever (rollover renews it every 55 minutes). 60 s is Asterisk's customary
  `rtptimeout` and rides out a network outage a person would wait through.
- Hold limit 2 h (`hold_timeout_s`): on hold the caller sends no RTP (sendonly/inactive), so the RTP timeout
  is suspended; a hold longer than any queue or consultation (2 h) is a forgotten or dead call.
- Maximum call duration 4 h (`max_call_duration_s`): far beyond any real conversation with an assistant (the
  longest support calls run one to two hours), it bounds what a call stuck in any way not caught above can
  cost; the model says a short goodbye first.
- Session timers (RFC 4028) 1800 s (`session_expires_s`, at least 90, 0: none asked): asked of every caller
  (refresher=uac when it supports them, else the bridge refreshes) and offered on calls placed, so a call
  whose far end vanished without a BYE ends within half an hour even while held.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import tomllib
import wave
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar

import click

from bridge.engine.amd import AMD_ACTIONS, AmdAction, AmdOptions, AmdPolicy
from bridge.engine.calling_hours import CallingHours, parse_calling_hours
from bridge.engine.dial_retry import DEFAULT_RETRY_ON, MAX_ATTEMPTS, MAX_DELAY_S, RetryPolicy, parse_retry_on
from bridge.engine.rollover import RolloverOptions
from bridge.engine.telephony import TelephonyOptions
from bridge.engine.usage import Pricing
from bridge.engine.warm_transfer import WarmOptions
from bridge.server.console import parse_stun_url, parse_webrtc_address
from bridge.server.providers import KINDS
from bridge.server.webhook import SECRET_ENV
from providers.base import ToolSpec
from providers.batching import APPEND_MS_CHOICES, DEFAULT_APPEND_MS
from providers.limits import LimitOverrides
from rtp.latch import SOURCE_POLICIES, SourcePolicy
from rtp.opus import available as opus_available
from rtp.tones import RINGBACK_TONES
from sip.core.app_headers import DEFAULT_ALLOW, NEVER_PASSED
from sip.core.attestation import VERSTATS, Verstat, attestation_of
from sip.core.offer_answer import CODECS, DEFAULT_CODECS, codec_list
from sip.core.policy import DEFAULT_SCANNERS
from sip.engine import DEFAULT_ENGINE, ENGINES

ECHO = "echo"
PROVIDER_NAMES: tuple[str, ...] = (*KINDS, ECHO)
TELEPHONY_TOOLS = frozenset(
    {"end_call", "transfer_call", "send_dtmf", "pause_recording", "resume_recording", "collect_card"}
)
DEFAULT_SIP_PASSWORD_ENV = "PARLORA_SIP_PASSWORD"  # the registration password's variable
DEFAULT_INBOUND_PASSWORD_ENV = (
    "PARLORA_INBOUND_PASSWORD"  # as `serve --inbound-auth` (bridge/cli/commands.py)
)
DEFAULT_DRAIN_S = 300.0  # [drain] timeout_s, `serve --drain-timeout`
# Call limits (module docstring, "Defaults"): what a call gets where neither the file nor the command line says
DEFAULT_RTP_TIMEOUT_S = 60.0
DEFAULT_HOLD_TIMEOUT_S = 7200.0
DEFAULT_MAX_CALL_DURATION_S = 14400.0
# A no-input timeout shorter than this prompts callers in a natural pause (bridge/engine/no_input.py); off by default
NO_INPUT_LEAST_S = 5.0
DEFAULT_BLOCKED_USER_AGENTS = DEFAULT_SCANNERS  # the engine's (sip/core/policy.py)

Address = tuple[str, int]
TurnDetection = Literal["server", "client"]
Transport = Literal["udp", "tcp", "tls"]
Srtp = Literal["off", "offer", "require"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]


class ConfigError(ValueError):
    """A configuration that cannot be used; `problems` has one line per problem (file: key path: what)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


# --- the schema ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Listeners:
    sip_udp: Address = ("127.0.0.1", 5060)
    sip_tcp: Address | None = None  # None: TCP on sip_udp's address (the native engine's), unless tcp is off
    tcp: bool = True  # sip_tcp = "off": no SIP over TCP
    sip_tls: Address | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None  # to verify peers of outbound TLS
    http: Address | None = None  # status, /metrics, /healthz, /readyz
    http_token_env: str | None = None  # the variable holding the bearer token the HTTP listener requires
    webrtc_address: str | None = None  # the browser channel's ICE address (default: the HTTP listener's)
    stun: str | None = None  # a STUN server for the browser channel and its page (default: none)


@dataclass(frozen=True, slots=True)
class Engine:
    name: str = DEFAULT_ENGINE
    max_calls: int | None = None  # None: the engine's default
    rtp_port_low: int = 4000
    rtp_port_high: int | None = None  # None: the engine's own pool size from rtp_port_low


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    name: str  # a name in PROVIDER_NAMES
    key_env: str | None  # the variable holding the API key (None for echo)
    model: str | None = None
    voice: str | None = None
    url: str | None = None
    ca: str | None = None  # CA file to trust for a wss:// url
    append_ms: int = DEFAULT_APPEND_MS  # caller audio per append to the provider (20, 40, 60, 80 or 100)


@dataclass(frozen=True, slots=True)
class Defaults:
    """What a call gets where its route says nothing (and every call when there are no routes)."""

    provider: str | None = None  # None: openai-live when $OPENAI_API_KEY is set, else echo (as `serve`)
    instructions: str | None = None  # the text, read from instructions_file when that was given
    greeting: str | None = None
    language: str | None = None
    voice: str | None = None
    turn_detection: TurnDetection = "server"
    # the recording consent every call gets where its route names none (bridge/server/recording.py): a line the
    # model says first, or a recording the bridge plays (a path)
    recording_consent: str | None = None
    recording_consent_wav: str | None = None
    no_input_timeout_s: float = 0.0  # the caller's no-input timeout (bridge/engine/no_input.py); 0: off


@dataclass(frozen=True, slots=True)
class Trunk:
    name: str
    registrar: str | None = None  # sip:USER@HOST[:PORT] to register to
    auth_user: str | None = None
    password_env: str = DEFAULT_SIP_PASSWORD_ENV
    register_expires_s: int = 3600
    register_keepalive_s: float = 30.0  # OPTIONS to the registrar this often while registered
    allow: tuple[str, ...] = ()  # CIDRs whose INVITEs are accepted
    inbound_auth_user: str | None = None  # digest-challenge INVITEs from this trunk
    inbound_password_env: str = DEFAULT_INBOUND_PASSWORD_ENV
    transport: Transport = "udp"
    srtp: Srtp = "off"
    external_address: str | None = None  # the public IP for SDP c=, Contact and Via behind NAT
    nat: bool = False  # symmetric RTP, in-dialog requests to the INVITE's source (`serve --nat`)
    rtp_source: SourcePolicy = (
        "learn"  # without NAT mode: learn the caller's RTP source, or "strict" (rtp/latch.py)
    )
    cps: float | None = (
        None  # calls placed through it per second (bridge/engine/dial_limits.py); None: no limit
    )
    max_calls: int | None = None  # calls placed through it at once, ringing ones too; None: no limit
    trust_identity_headers: bool = (
        False  # its P-Asserted-Identity / Diversion give the caller ID (app_headers)
    )
    codecs: tuple[str, ...] = DEFAULT_CODECS  # offered and accepted, in our order (sip.core.offer_answer)

    @property
    def needs_password(self) -> bool:
        return self.registrar is not None or self.auth_user is not None


@dataclass(frozen=True, slots=True)
class Inbound:
    drop_unknown: bool = False  # a source no trunk allows is dropped silently instead of 403
    allow_any: bool = False  # accept any source on a non-loopback address (warned loudly)
    invite_rate_per_s: float | None = None  # per source; beyond it 503
    options_rate_per_s: float | None = None  # per source; beyond it dropped unanswered
    blocked_user_agents: tuple[str, ...] = DEFAULT_BLOCKED_USER_AGENTS
    server_header: str | None = (
        None  # the Server / User-Agent field; none by default (sip.engine.EngineConfig)
    )
    realm: str | None = (
        None  # the inbound digest realm; default: the advertised address (sip.engine.digest_realm)
    )
    refuse_failed_attestation: bool = False  # verstat=TN-Validation-Failed → 608 (sip/core/attestation.py)
    # 183 with early media while the provider connects: None (off), a tone of rtp.tones.RINGBACK_TONES, a WAV
    early_media: str | None = None
    # the inbound headers the application sees (sip/core/app_headers.py): names, a trailing "*" a prefix
    sip_headers: tuple[str, ...] = DEFAULT_ALLOW


# a SIP header value we may send as it is: printable ASCII, no CR/LF (RFC 3261 §25.1 TEXT-UTF8 kept to ASCII)
HEADER_TEXT = re.compile(r"[\x20-\x7e]{1,128}")


@dataclass(frozen=True, slots=True)
class HeaderMatch:
    name: str
    value: str


Direction = Literal["inbound", "outbound"]
DIRECTIONS: tuple[Direction, ...] = ("inbound", "outbound")


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    direction: Direction = "inbound"  # calls answered, or calls placed (module docstring)
    number: str | None = None  # exact called number
    pattern: str | None = None  # Asterisk-style (see the module docstring)
    header: HeaderMatch | None = None
    # the caller's number (sip/core/app_headers.py: P-Asserted-Identity's on a trusted trunk, else From's): an
    # exact number, or an Asterisk-style pattern when it starts with "_"
    caller: str | None = None
    attestation: Verstat | None = None  # the carrier's verstat (sip/core/attestation.py); None: any
    provider: str | None = None  # None: [defaults] provider
    instructions: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    greeting: str | None = None
    language: str | None = None
    voice: str | None = None
    amd: bool | None = None  # an outbound route's machine detection (None: [outbound] amd)
    amd_machine: AmdAction | None = None  # after a mailbox verdict (None: [outbound] amd_machine)
    amd_message: str | None = None  # (None: [outbound]'s)
    amd_message_wav: str | None = None  # a WAV path (None: [outbound]'s)
    calling_hours: CallingHours | None = None  # an outbound route's window (bridge/engine/calling_hours.py)
    # an outbound route's retry policy, each field over [outbound]'s (None: [outbound]'s; dial_retry.py)
    retry_attempts: int | None = None
    retry_on: frozenset[int] | None = None
    retry_delay_s: float | None = None
    disclosure: str | None = None  # a line the model must say first (bridge/engine/disclosure.py)
    disclosure_wav: str | None = None  # or a recording the bridge plays first (a path)
    early_media: str | None = None  # an inbound route's ("off", a tone, a WAV; None: [inbound] early_media)
    early_media_to_provider: bool | None = None  # an outbound route's (None: [outbound]'s)
    recording_consent: str | None = None  # a line the model says first (None: [defaults]'s)
    recording_consent_wav: str | None = None  # or a recording the bridge plays (a path; None: [defaults]'s)
    no_input_timeout_s: float | None = None  # (None: [defaults]'; 0: off for this route)
    budget: float | None = (
        None  # the call ends with a goodbye at this price (bridge/engine/usage.py); None: none
    )
    _regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def matches(self, called: str, headers: Sequence[tuple[str, str]], caller: str = "") -> bool:
        if self.caller is not None and not (
            compile_pattern(self.caller).fullmatch(caller) is not None
            if self.caller.startswith("_")
            else caller == self.caller
        ):
            return False
        if self.number is not None and called != self.number:
            return False
        if self.pattern is not None:
            regex = self._regex if self._regex is not None else compile_pattern(self.pattern)
            if regex.fullmatch(called) is None:
                return False
        if self.header is not None:
            wanted = self.header.name.lower()
            if not any(k.lower() == wanted and v.strip() == self.header.value for k, v in headers):
                return False
        if self.attestation is not None and attestation_of("", tuple(headers)).verstat != self.attestation:
            return False
        return True

    @property
    def catch_all(self) -> bool:
        return (
            self.number is None
            and self.pattern is None
            and self.header is None
            and self.attestation is None
            and self.caller is None
        )


@dataclass(frozen=True, slots=True)
class Rollover:
    enabled: bool = True
    session_cap_ms: int | None = None  # None: the provider's
    after_ms: int | None = None
    deadline_ms: int | None = None
    hard_stop_ms: int | None = None
    overlap_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Recovery:
    reservoir_bytes: int | None = None
    residence_ms: int | None = None
    failure_message: str | None = None  # WAV path


@dataclass(frozen=True, slots=True)
class Telephony:
    end_call_tool: bool = False
    send_dtmf_tool: bool = False
    dtmf_to_model: bool = False
    recording_tools: bool = False
    transfer_targets: tuple[tuple[str, str], ...] = ()  # (name the model uses, SIP URI)
    warm_transfer_ring_s: float | None = None  # transfer_call may be warm: its ring timeout (None: cold)
    hold_music: str | None = None  # WAV path: what a caller waiting for a warm transfer hears (None: silence)
    # None: the default (`call_limits`: DEFAULT_* on the native engine); 0.0: off ("off" or 0 in the file)
    max_call_duration_s: float | None = None
    rtp_timeout_s: float | None = None
    hold_timeout_s: float | None = None
    session_expires_s: int = 1800  # RFC 4028 interval asked and offered; 0: none


@dataclass(frozen=True, slots=True)
class Webhook:
    url: str | None = None
    timeout_s: float = 10.0
    ca: str | None = None


@dataclass(frozen=True, slots=True)
class Logging:
    level: LogLevel = "info"
    format: LogFormat = "text"
    cdr: str | None = None


@dataclass(frozen=True, slots=True)
class Recording:
    dir: str | None = None


@dataclass(frozen=True, slots=True)
class Drain:
    timeout_s: float = DEFAULT_DRAIN_S


_AMD = AmdOptions()  # the detector's defaults, tuned on tests/bench/amd.py's corpus
_AMD_POLICY = AmdPolicy()


@dataclass(frozen=True, slots=True)
class Outbound:
    amd: bool = False  # answering-machine detection on calls placed; the greeting waits for its verdict
    # busy / no-answer retries of calls placed (bridge/engine/dial_retry.py): one attempt, no retry, by default
    retry_attempts: int = 1
    retry_on: frozenset[int] = DEFAULT_RETRY_ON
    retry_delay_s: float = 300.0

    def retry_policy(self, route: Route | None = None) -> RetryPolicy:
        """The retry policy of calls placed on `route` (its fields over these), or of calls on none."""

        def pick(own: T | None, default: T) -> T:
            return default if own is None else own

        if route is None:
            return RetryPolicy(self.retry_attempts, self.retry_on, self.retry_delay_s)
        return RetryPolicy(
            pick(route.retry_attempts, self.retry_attempts),
            pick(route.retry_on, self.retry_on),
            pick(route.retry_delay_s, self.retry_delay_s),
        )

    amd_machine: AmdAction = _AMD_POLICY.machine  # after a mailbox verdict: talk, message (then BYE), hang_up
    amd_message: str | None = None  # the message the model is told to say
    amd_message_wav: str | None = None  # or a recording the bridge plays (wins over the text)
    amd_total_ms: int = _AMD.total_ms  # the verdict at the latest this long after the answer
    amd_machine_greeting_ms: int = _AMD.machine_greeting_ms  # a greeting this long is a machine
    amd_beep_wait_ms: int = _AMD.beep_wait_ms  # after a machine verdict, the beep is waited for this long
    amd_decide_ms: int = _AMD_POLICY.decide_ms  # the application's answer to the verdict, waited this long

    def amd_options(self) -> AmdOptions:
        """The detector's options: these keys over its defaults."""
        return replace(
            _AMD,
            total_ms=self.amd_total_ms,
            initial_silence_ms=min(_AMD.initial_silence_ms, self.amd_total_ms),
            machine_greeting_ms=self.amd_machine_greeting_ms,
            beep_wait_ms=self.amd_beep_wait_ms,
        )

    early_media_to_provider: bool = (
        False  # the far end's early media goes to the model too (off: it does not)
    )


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    source: str | None = None  # the file it was read from (None: command line only)
    listeners: Listeners = field(default_factory=Listeners)
    engine: Engine = field(default_factory=Engine)
    defaults: Defaults = field(default_factory=Defaults)
    providers: tuple[ProviderConfig, ...] = ()  # the configured ones; provider() fills in the rest
    trunks: tuple[Trunk, ...] = ()
    inbound: Inbound = field(default_factory=Inbound)
    routes: tuple[Route, ...] = ()
    rollover: Rollover = field(default_factory=Rollover)
    recovery: Recovery = field(default_factory=Recovery)
    telephony: Telephony = field(default_factory=Telephony)
    webhook: Webhook = field(default_factory=Webhook)
    logging: Logging = field(default_factory=Logging)
    recording: Recording = field(default_factory=Recording)
    drain: Drain = field(default_factory=Drain)
    outbound: Outbound = field(default_factory=Outbound)
    pricing: tuple[
        tuple[str, Pricing], ...
    ] = ()  # [pricing.NAME]: each provider's rates (bridge/engine/usage.py)

    def provider(self, name: str) -> ProviderConfig:
        """The configuration of provider `name`: the file's section, or the defaults (its usual key variable)."""
        for p in self.providers:
            if p.name == name:
                return p
        return ProviderConfig(name, None if name == ECHO else KINDS[name].key_variable)

    def default_provider(self, environ: Mapping[str, str]) -> str:
        """[defaults] provider, or `serve`'s choice: openai-live when its key variable is set, else echo."""
        if self.defaults.provider is not None:
            return self.defaults.provider
        key_env = self.provider("openai-live").key_env
        return "openai-live" if key_env and environ.get(key_env) else ECHO

    # Pieces the `serve` wiring builds its ServerConfig from.

    def limit_overrides(self) -> LimitOverrides | None:
        r = self.recovery
        if r.reservoir_bytes is None and r.residence_ms is None:
            return None
        return LimitOverrides(r.reservoir_bytes, r.residence_ms)

    def telephony_options(self) -> TelephonyOptions:
        t = self.telephony
        return TelephonyOptions(
            end_call=t.end_call_tool,
            transfer_targets=dict(t.transfer_targets),
            send_dtmf=t.send_dtmf_tool,
            dtmf_to_model=t.dtmf_to_model,
            recording_tools=t.recording_tools,
            warm=None
            if t.warm_transfer_ring_s is None
            else WarmOptions(ring_timeout_ms=int(t.warm_transfer_ring_s * 1000)),
        )

    def rollover_options(self, provider: str) -> RolloverOptions | None:
        """None when rollover is off; ValueError when the ages are inconsistent for this provider's cap."""
        r = self.rollover
        if not r.enabled:
            return None
        kind = KINDS["openai-live" if provider == ECHO else provider]
        given: dict[str, object] = {
            "after_ms": r.after_ms,
            "deadline_ms": r.deadline_ms,
            "hard_stop_ms": r.hard_stop_ms,
            "overlap_ms": r.overlap_ms,
        }
        if self.defaults.turn_detection == "client":
            given["client_commits"] = True
        return RolloverOptions.for_cap(
            r.session_cap_ms or kind.session_cap_ms, **{k: v for k, v in given.items() if v is not None}
        )


# --- route selection ---------------------------------------------------------------------------------------


def select_route(
    routes: Sequence[Route],
    called: str,
    headers: Sequence[tuple[str, str]] = (),
    direction: Direction = "inbound",
    caller: str = "",
) -> Route | None:
    """The first route (file order) of `direction` matching the called (for an outbound call: the dialled)
    number, SIP headers and caller's number; None when none does. A route of the other direction never
    matches."""
    for route in routes:
        if route.direction == direction and route.matches(called, headers, caller):
            return route
    return None


def named_route(routes: Sequence[Route], name: str, direction: Direction = "outbound") -> Route:
    """The route called `name`, which must be of `direction` (an outbound call that names an inbound route
    would get the inbound greeting); ValueError saying which routes could be named."""
    route = next((r for r in routes if r.name == name), None)
    if route is None or route.direction != direction:
        names = [r.name for r in routes if r.direction == direction]
        why = "no route has that name" if route is None else f"it is an {route.direction} route"
        raise ValueError(f"route {json.dumps(name)}: {why}; {direction} routes: {', '.join(names) or 'none'}")
    return route


_PATTERN_TOKEN = re.compile(r"\[[0-9-]+\]|[XxZzNn]|[0-9+*#]|[.!]$")


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """An Asterisk-style pattern (module docstring) as a regex for `fullmatch`; ValueError saying what is wrong."""
    if not pattern.startswith("_") or len(pattern) < 2:
        raise ValueError('a pattern starts with "_" and has at least one character after it')
    body, pos, out = pattern[1:], 0, []
    while pos < len(body):
        m = _PATTERN_TOKEN.match(body, pos)
        if m is None:
            ch = body[pos]
            where = "only as the last character" if ch in ".!" else "not a pattern character"
            raise ValueError(f"{ch!r} at position {pos + 1}: {where} (X Z N [..] . ! 0-9 + * #)")
        token = m.group(0)
        upper = token.upper()
        if upper == "X":
            out.append("[0-9]")
        elif upper == "Z":
            out.append("[1-9]")
        elif upper == "N":
            out.append("[2-9]")
        elif token == ".":
            out.append(".+")
        elif token == "!":
            out.append(".*")
        elif token.startswith("["):
            inner = token[1:-1]
            if not inner or inner.startswith("-") or inner.endswith("-") or "--" in inner:
                raise ValueError(f"{token}: a set holds digits and ranges like [1-5] or [137]")
            for a, b in re.findall(r"(\d)-(\d)", inner):
                if a > b:
                    raise ValueError(f"{token}: range {a}-{b} runs backwards")
            out.append(token)
        else:
            out.append(re.escape(token))
        pos = m.end()
    return re.compile("".join(out))


# --- the environment -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnvProblem:
    """A variable the configuration needs that is not set: `path` is the key naming it (or what needs it)."""

    path: str
    variable: str

    def __str__(self) -> str:
        return f"{self.path}: environment variable {self.variable} is not set"


def environment_problems(config: BridgeConfig, environ: Mapping[str, str]) -> tuple[EnvProblem, ...]:
    """Every needed variable that is unset or empty: the keys of the providers in use (the default provider
    and every route's), trunk passwords, the HTTP token and the webhook secret. Values are never read out."""
    needed: list[tuple[str, str]] = []
    in_use = [config.default_provider(environ)] + [
        r.provider for r in config.routes if r.provider is not None
    ]
    for name in dict.fromkeys(in_use):
        if name == ECHO:
            continue
        p = config.provider(name)
        if p.key_env is not None:
            where = (
                f"providers.{name}.key_env"
                if any(c.name == name for c in config.providers)
                else f"providers.{name} (default key variable)"
            )
            needed.append((where, p.key_env))
    for i, trunk in enumerate(config.trunks):
        if trunk.needs_password:
            needed.append((f"trunks[{i}].password_env", trunk.password_env))
        if trunk.inbound_auth_user is not None:
            needed.append((f"trunks[{i}].inbound_password_env", trunk.inbound_password_env))
    if config.listeners.http_token_env is not None:
        needed.append(("listeners.http_token_env", config.listeners.http_token_env))
    if config.webhook.url is not None:
        needed.append(("webhook.url (the signing secret)", SECRET_ENV))
    return tuple(EnvProblem(path, var) for path, var in needed if not environ.get(var))


# --- reading the file ------------------------------------------------------------------------------------------

T = TypeVar("T")
D = TypeVar("D")
_MISSING = object()
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ROUTE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_LANGUAGE = re.compile(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})*")
_HEADER_NAME = re.compile(r"[A-Za-z0-9!%'*+.^_`|~-]+")  # an RFC 3261 token


def _describe(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


class _Reader:
    """Collects every problem of one file; the typed getters return a default after recording a problem."""

    def __init__(self, label: str, base: Path, *, paths: bool = True) -> None:
        self.label = label
        self.base = base
        self.paths = paths  # False: the label names the key already (a command-line option)
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{self.label}: {path}: {message}" if self.paths else f"{self.label}: {message}")

    def expect(self, path: str, expected: str, value: object) -> None:
        self.fail(path, f"expected {expected}; got {_describe(value)}")

    def keys(self, table: Mapping[str, object], path: str, allowed: Sequence[str]) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                self.fail(_join(path, key), f"unknown key{hint}; expected one of {', '.join(allowed)}")

    def named_tables(
        self,
        parent: Mapping[str, object],
        prefix: str,
        what: str,
        names: Sequence[str],
        hints: Mapping[str, str] | None = None,
    ) -> Iterator[tuple[str, dict[str, object], str]]:
        """The [PREFIX.NAME] tables (`what` sections) whose NAME is one of `names`: (name, table, path); any other
        NAME is a problem, with its hint if `hints` has one."""
        for name, section in parent.items():
            path = f"{prefix}.{name}"
            if name not in names:
                self.fail(
                    path,
                    f"expected a {what} section named one of {', '.join(names)}{(hints or {}).get(name, '')}; "
                    f"got {json.dumps(name)}",
                )
            elif not isinstance(section, dict):
                self.expect(path, "a table", section)
            else:
                yield name, section, path

    def table(self, parent: Mapping[str, object], key: str, path: str) -> dict[str, object]:
        value = parent.get(key, _MISSING)
        if value is _MISSING:
            return {}
        if not isinstance(value, dict):
            self.expect(_join(path, key), "a table", value)
            return {}
        return value

    def tables(self, parent: Mapping[str, object], key: str) -> list[dict[str, object]]:
        value = parent.get(key, _MISSING)
        if value is _MISSING:
            return []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.expect(key, f"an array of tables ([[{key}]])", value)
            return []
        return value

    def get(
        self,
        t: Mapping[str, object],
        key: str,
        path: str,
        kind: type[T],
        expected: str,
        default: D,
        check: Callable[[T], str | None] | None = None,
    ) -> T | D:
        value = t.get(key, _MISSING)
        if value is _MISSING:
            return default
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.expect(_join(path, key), expected, value)
            return default
        if check is not None:
            problem = check(value)
            if problem is not None:
                self.fail(_join(path, key), problem)
                return default
        return value

    def string(
        self,
        t: Mapping[str, object],
        key: str,
        path: str,
        *,
        default: str | None = None,
        regex: re.Pattern[str] | None = None,
        what: str = "a string",
    ) -> str | None:
        def check(v: str) -> str | None:
            if not v:
                return f"expected {what}; got an empty string"
            if regex is not None and not regex.fullmatch(v):
                return f"expected {what}; got {_describe(v)}"
            return None

        return self.get(t, key, path, str, what, default, check)

    def integer(
        self,
        t: Mapping[str, object],
        key: str,
        path: str,
        *,
        lo: int,
        hi: int | None = None,
        default: int | None = None,
    ) -> int | None:
        what = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"

        def check(v: int) -> str | None:
            return None if v >= lo and (hi is None or v <= hi) else f"expected {what}; got {v}"

        return self.get(t, key, path, int, what, default, check)

    def number(
        self,
        t: Mapping[str, object],
        key: str,
        path: str,
        *,
        lo: float,
        default: float | None,
        inclusive: bool = False,
    ) -> float | None:
        what = f"a number >= {lo:g}" if inclusive else f"a number > {lo:g}"

        def check(v: float) -> str | None:
            return None if v > lo or (inclusive and v == lo) else f"expected {what}; got {v:g}"

        return self.get(t, key, path, float, what, default, check)

    def seconds_or_off(
        self, t: Mapping[str, object], key: str, path: str, *, least: float = 1.0
    ) -> float | None:
        """A limit in seconds: a number >= `least`, or 0 / "off" (switched off: 0.0); None when not given
        (the default of `call_limits`)."""
        value = t.get(key, _MISSING)
        if value is _MISSING:
            return None
        try:
            return parse_seconds_or_off(value, least)
        except ValueError as exc:
            self.fail(_join(path, key), str(exc))
            return None

    def boolean(self, t: Mapping[str, object], key: str, path: str, default: bool) -> bool:
        return self.get(t, key, path, bool, "true or false", default)

    def choice(
        self, t: Mapping[str, object], key: str, path: str, choices: Sequence[str], default: str | None
    ) -> str | None:
        what = "one of " + ", ".join(choices)

        def check(v: str) -> str | None:
            return None if v in choices else f"expected {what}; got {_describe(v)}"

        return self.get(t, key, path, str, what, default, check)

    def env_name(self, t: Mapping[str, object], key: str, path: str, default: str | None) -> str | None:
        value = t.get(key, _MISSING)
        if value is _MISSING:
            return default
        if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
            # Never echo it back: someone may have pasted the secret itself here.
            self.fail(
                _join(path, key),
                "expected the NAME of an environment variable (letters, digits and _, "
                "e.g. OPENAI_API_KEY), not the secret itself; the value is not shown",
            )
            return default
        return value

    def address(
        self, t: Mapping[str, object], key: str, path: str, default_port: int, default: Address | None = None
    ) -> Address | None:
        value = self.string(t, key, path, what='"HOST:PORT"')
        if value is None:
            return default
        try:
            return parse_address(value, default_port)
        except ValueError as exc:
            self.fail(_join(path, key), str(exc))
            return default

    def file(
        self,
        t: Mapping[str, object],
        key: str,
        path: str,
        *,
        directory: bool = False,
        must_exist: bool = True,
    ) -> str | None:
        value = self.string(t, key, path, what="a path")
        if value is None:
            return None
        resolved = Path(value) if Path(value).is_absolute() else self.base / value
        if must_exist and not (resolved.is_dir() if directory else resolved.is_file()):
            self.fail(
                _join(path, key),
                f"expected an existing {'directory' if directory else 'file'}; {str(resolved)!r} is not one",
            )
        return str(resolved)

    def string_list(
        self, t: Mapping[str, object], key: str, path: str, default: tuple[str, ...] = ()
    ) -> tuple[str, ...]:
        value = t.get(key, _MISSING)
        if value is _MISSING:
            return default
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.expect(_join(path, key), "an array of strings", value)
            return default
        return tuple(value)

    def instructions(self, t: Mapping[str, object], path: str) -> str | None:
        text = self.string(t, "instructions", path, what="a non-empty string")
        source = self.file(t, "instructions_file", path)
        if text is not None and "instructions_file" in t:
            self.fail(_join(path, "instructions_file"), "give instructions or instructions_file, not both")
            return text
        if source is None or not Path(source).is_file():
            return text
        try:
            content = Path(source).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            self.fail(_join(path, "instructions_file"), f"cannot read {source!r}: {exc}")
            return None
        if not content:
            self.fail(_join(path, "instructions_file"), f"{source!r} is empty")
            return None
        return content


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def parse_address(value: str, default_port: int) -> Address:
    """ "HOST:PORT", "HOST", "[V6]:PORT" → (host, port); ValueError saying what was expected."""
    host, sep, port = value.rpartition(":")
    if (
        not sep
        or (value.startswith("[") and not host.endswith("]"))
        or (":" in host and not host.startswith("["))
    ):
        host, port = value, str(default_port)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f'expected "HOST:PORT" with a port from 1 to 65535; got {json.dumps(value)}')
    return host, int(port)


def parse_port_range(value: str | int) -> tuple[int, int | None]:
    """ "LOW-HIGH" or LOW → (low, high | None); ValueError saying what was expected."""
    if isinstance(value, int):
        low, high = value, None
    else:
        m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", value)
        if m is None:
            raise ValueError(
                f'expected "LOW-HIGH" (e.g. "10000-20000") or a first port; got {json.dumps(value)}'
            )
        low, high = int(m.group(1)), int(m.group(2))
    if not 1024 <= low <= 65534 or (high is not None and not low < high <= 65535):
        raise ValueError(f"expected ports from 1024 to 65535 with LOW < HIGH; got {value}")
    return low, high


def parse_transfer_target(spec: str) -> tuple[str, str]:
    """ "NAME=sip:URI" → (name, uri), as `--transfer-target` takes it."""
    name, sep, uri = spec.partition("=")
    if not sep or not name or not uri.startswith(("sip:", "sips:", "tel:")):
        raise ValueError(f"expected NAME=sip:URI; got {json.dumps(spec)}")
    return name, uri


def _check_sip_uri(v: str) -> str | None:
    return (
        None
        if re.fullmatch(r"sips?:[^\s@]+@[^\s@]+", v)
        else f'expected "sip:USER@HOST[:PORT]"; got {_describe(v)}'
    )


def _check_wav(path: str) -> str | None:
    try:
        with wave.open(path, "rb") as wav:
            if (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) != (8000, 1, 2):
                return f"{path!r}: expected an 8 kHz mono 16-bit PCM WAV"
    except (OSError, EOFError, wave.Error) as exc:
        return f"{path!r}: not a readable WAV ({exc})"
    return None


def load(path: str | os.PathLike[str]) -> BridgeConfig:
    """Read and check a config file; ConfigError with every problem (file, key path, what was expected)."""
    label = os.fspath(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([f"{label}: cannot read: {exc.strerror or exc}"]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError([f"{label}: not UTF-8 text"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{label}: not valid TOML: {exc}"]) from None
    return parse(data, label=label, base=Path(path).resolve().parent)


_SECTIONS = (
    "listeners",
    "engine",
    "defaults",
    "providers",
    "trunks",
    "inbound",
    "routes",
    "rollover",
    "recovery",
    "telephony",
    "webhook",
    "logging",
    "recording",
    "drain",
    "outbound",
    "pricing",
)


def parse(data: Mapping[str, object], *, label: str = "<config>", base: Path | None = None) -> BridgeConfig:
    """Check a parsed TOML document (see `load`); relative paths resolve against `base` (default: cwd)."""
    r = _Reader(label, base or Path.cwd())
    r.keys(data, "", _SECTIONS)
    config = BridgeConfig(
        source=label,
        listeners=_listeners(r, r.table(data, "listeners", "")),
        engine=_engine(r, r.table(data, "engine", "")),
        defaults=_defaults(r, r.table(data, "defaults", "")),
        providers=_providers(r, r.table(data, "providers", "")),
        trunks=_trunks(r, r.tables(data, "trunks")),
        inbound=_inbound(r, r.table(data, "inbound", "")),
        routes=_routes(r, r.tables(data, "routes")),
        rollover=_rollover(r, r.table(data, "rollover", "")),
        recovery=_recovery(r, r.table(data, "recovery", "")),
        telephony=_telephony(r, r.table(data, "telephony", "")),
        webhook=_webhook(r, r.table(data, "webhook", "")),
        logging=_logging(r, r.table(data, "logging", "")),
        recording=Recording(_recording_dir(r, r.table(data, "recording", ""))),
        drain=_drain(r, r.table(data, "drain", "")),
        outbound=_outbound(r, r.table(data, "outbound", "")),
        pricing=_pricing(r, r.table(data, "pricing", "")),
    )
    _cross_checks(r, config)
    if r.problems:
        raise ConfigError(r.problems)
    return config


def _listeners(r: _Reader, t: dict[str, object]) -> Listeners:
    p = "listeners"
    r.keys(t, p, [f.name for f in fields(Listeners) if f.name != "tcp"])
    udp = r.address(t, "sip_udp", p, 5060, ("127.0.0.1", 5060))
    assert udp is not None
    out = Listeners(
        sip_udp=udp,
        sip_tcp=None if t.get("sip_tcp") == "off" else r.address(t, "sip_tcp", p, 5060),
        tcp=t.get("sip_tcp") != "off",
        sip_tls=r.address(t, "sip_tls", p, 5061),
        tls_cert=r.file(t, "tls_cert", p, must_exist=False),  # checked at start: `missing_files`
        tls_key=r.file(t, "tls_key", p, must_exist=False),
        tls_ca=r.file(t, "tls_ca", p),
        http=r.address(t, "http", p, 8080),
        http_token_env=r.env_name(t, "http_token_env", p, None),
        webrtc_address=r.get(
            t, "webrtc_address", p, str, "an IP address", None, _problem(parse_webrtc_address)
        ),
        stun=r.get(t, "stun", p, str, "stun:HOST[:PORT]", None, _problem(parse_stun_url)),
    )
    return out


def _engine(r: _Reader, t: dict[str, object]) -> Engine:
    p = "engine"
    r.keys(t, p, ["name", "max_calls", "rtp_ports"])
    name = r.choice(t, "name", p, list(ENGINES), DEFAULT_ENGINE)
    assert name is not None
    low, high = 4000, None
    ports = t.get("rtp_ports", _MISSING)
    if ports is not _MISSING:
        if isinstance(ports, str | int) and not isinstance(ports, bool):
            try:
                low, high = parse_port_range(ports)
            except ValueError as exc:
                r.fail(f"{p}.rtp_ports", str(exc))
        else:
            r.expect(f"{p}.rtp_ports", '"LOW-HIGH" or a first port', ports)
    max_calls = r.integer(t, "max_calls", p, lo=1)
    cap = ENGINES[name].cap
    if max_calls is not None and cap is not None and max_calls > cap:
        r.fail(
            f"{p}.max_calls", f"the {name} engine carries at most {cap} calls per process; got {max_calls}"
        )
    if high is not None and max_calls is not None and (high - low + 1) // 2 < max_calls:
        r.fail(
            f"{p}.rtp_ports",
            f"{low}-{high} has room for {(high - low + 1) // 2} calls (a port pair each), "
            f"fewer than max_calls {max_calls}",
        )
    return Engine(name=name, max_calls=max_calls, rtp_port_low=low, rtp_port_high=high)


def _defaults(r: _Reader, t: dict[str, object]) -> Defaults:
    p = "defaults"
    r.keys(
        t,
        p,
        [
            "provider",
            "instructions",
            "instructions_file",
            "greeting",
            "language",
            "voice",
            "turn_detection",
            "recording_consent",
            "recording_consent_wav",
            "no_input_timeout_s",
        ],
    )
    turns = r.choice(t, "turn_detection", p, ["server", "client"], "server")
    consent, consent_wav = _recording_consent(r, t, p)
    return Defaults(
        provider=r.choice(t, "provider", p, PROVIDER_NAMES, None),
        instructions=r.instructions(t, p),
        greeting=r.string(t, "greeting", p),
        language=r.string(t, "language", p, regex=_LANGUAGE, what='a language tag like "en" or "de-DE"'),
        voice=r.string(t, "voice", p),
        turn_detection="client" if turns == "client" else "server",
        recording_consent=consent,
        recording_consent_wav=consent_wav,
        no_input_timeout_s=r.seconds_or_off(t, "no_input_timeout_s", p, least=NO_INPUT_LEAST_S) or 0.0,
    )


def _providers(r: _Reader, t: dict[str, object]) -> tuple[ProviderConfig, ...]:
    out = []
    for name, section, p in r.named_tables(
        t, "providers", "provider", list(KINDS), {ECHO: " (echo needs no section)"}
    ):
        r.keys(section, p, ["key_env", "model", "voice", "url", "ca", "append_ms"])
        url = r.string(section, "url", p, regex=re.compile(r"wss?://\S+"), what="a ws:// or wss:// URL")
        ca = r.file(section, "ca", p)
        if ca is not None and url is not None and not url.startswith("wss://"):
            r.fail(f"{p}.ca", "applies to a wss:// url")
        out.append(
            ProviderConfig(
                name,
                r.env_name(section, "key_env", p, KINDS[name].key_variable),
                model=r.string(section, "model", p),
                voice=r.string(section, "voice", p),
                url=url,
                ca=ca,
                append_ms=_append_ms(r, section.get("append_ms", DEFAULT_APPEND_MS), f"{p}.append_ms"),
            )
        )
    return tuple(out)


PRICING_KEYS = ("audio_per_minute", "input_tokens_per_million", "output_tokens_per_million")


def _pricing(r: _Reader, t: dict[str, object]) -> tuple[tuple[str, Pricing], ...]:
    """[pricing.NAME]: a provider's rates, each a number >= 0 (currency-less; a rate not given is 0)."""
    out = []
    for name, section, p in r.named_tables(t, "pricing", "pricing", PROVIDER_NAMES):
        r.keys(section, p, PRICING_KEYS)
        rates = {
            key: r.number(section, key, p, lo=0.0, default=0.0, inclusive=True) or 0.0 for key in PRICING_KEYS
        }
        out.append((name, Pricing(**rates)))
    return tuple(out)


def _append_ms(r: _Reader, value: object, path: str) -> int:
    if isinstance(value, bool) or value not in (20, 40, 60, 80, 100):
        r.fail(path, f"expected one of 20, 40, 60, 80, 100; got {json.dumps(value)}")
        return DEFAULT_APPEND_MS
    return int(value)


def _cidr(r: _Reader, path: str, value: str) -> str | None:
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as exc:
        r.fail(
            path, f"expected a network like 192.0.2.0/24 or 2001:db8::/32; got {json.dumps(value)} ({exc})"
        )
        return None


def _codecs(r: _Reader, t: dict[str, object], p: str) -> tuple[str, ...]:
    """A trunk's `codecs`: names of sip.core.offer_answer.CODECS, in the order offered; an unknown one refuses."""
    names = r.string_list(t, "codecs", p, DEFAULT_CODECS)
    try:
        codecs = codec_list(names)
    except ValueError as exc:
        r.fail(f"{p}.codecs", str(exc))
        return DEFAULT_CODECS
    if "OPUS" in codecs and not opus_available():
        r.fail(f"{p}.codecs", "OPUS needs libopus (the system's, or PyAV's copy), which could not be loaded")
    return codecs


def _trunks(r: _Reader, items: list[dict[str, object]]) -> tuple[Trunk, ...]:
    out = []
    for i, t in enumerate(items):
        p = f"trunks[{i}]"
        r.keys(t, p, [f.name for f in fields(Trunk)])
        name = r.string(t, "name", p, regex=_ROUTE_NAME, what="a name (letters, digits, . _ -)")
        if "name" not in t:
            r.fail(f"{p}.name", "missing: every trunk has a name")
        allow = r.string_list(t, "allow", p)
        cidrs = tuple(c for j, v in enumerate(allow) if (c := _cidr(r, f"{p}.allow[{j}]", v)) is not None)
        external = r.string(t, "external_address", p, what="an IP address")
        if external is not None:
            try:
                ipaddress.ip_address(external)
            except ValueError:
                r.fail(f"{p}.external_address", f"expected an IP address; got {json.dumps(external)}")
        transport = r.choice(t, "transport", p, ["udp", "tcp", "tls"], "udp")
        srtp = r.choice(t, "srtp", p, ["off", "offer", "require"], "off")
        if srtp != "off" and transport != "tls":
            r.fail(f"{p}.srtp", f'SDES keys travel only over TLS: srtp = "{srtp}" needs transport = "tls"')
        trunk = Trunk(
            name=name or f"trunk-{i}",
            registrar=r.get(t, "registrar", p, str, '"sip:USER@HOST[:PORT]"', None, _check_sip_uri),
            auth_user=r.string(t, "auth_user", p),
            password_env=r.env_name(t, "password_env", p, DEFAULT_SIP_PASSWORD_ENV)
            or DEFAULT_SIP_PASSWORD_ENV,
            register_expires_s=r.integer(t, "register_expires_s", p, lo=60, hi=86400, default=3600) or 3600,
            register_keepalive_s=_or(
                r.number(t, "register_keepalive_s", p, lo=0.0, default=30.0, inclusive=True), 30.0
            ),
            allow=cidrs,
            inbound_auth_user=r.string(t, "inbound_auth_user", p),
            inbound_password_env=r.env_name(t, "inbound_password_env", p, DEFAULT_INBOUND_PASSWORD_ENV)
            or DEFAULT_INBOUND_PASSWORD_ENV,
            transport="tls" if transport == "tls" else "tcp" if transport == "tcp" else "udp",
            srtp="require" if srtp == "require" else "offer" if srtp == "offer" else "off",
            external_address=external,
            nat=r.boolean(t, "nat", p, False),
            rtp_source="strict"
            if r.choice(t, "rtp_source", p, SOURCE_POLICIES, "learn") == "strict"
            else "learn",
            cps=r.number(t, "cps", p, lo=0.0, default=None),
            max_calls=r.integer(t, "max_calls", p, lo=1),
            trust_identity_headers=r.boolean(t, "trust_identity_headers", p, False),
            codecs=_codecs(r, t, p),
        )
        if trunk.registrar is not None and trunk.auth_user is None and "password_env" in t:
            r.fail(f"{p}.password_env", "a password without auth_user is never used")
        out.append(trunk)
    seen: set[str] = set()
    for i, trunk in enumerate(out):
        if trunk.name in seen:
            r.fail(f"trunks[{i}].name", f"{json.dumps(trunk.name)} names an earlier trunk too")
        seen.add(trunk.name)
    return tuple(out)


def _inbound(r: _Reader, t: dict[str, object]) -> Inbound:
    p = "inbound"
    r.keys(t, p, [f.name for f in fields(Inbound)])
    return Inbound(
        drop_unknown=r.boolean(t, "drop_unknown", p, False),
        allow_any=r.boolean(t, "allow_any", p, False),
        invite_rate_per_s=r.number(t, "invite_rate_per_s", p, lo=0.0, default=None, inclusive=True),
        options_rate_per_s=r.number(t, "options_rate_per_s", p, lo=0.0, default=None, inclusive=True),
        blocked_user_agents=r.string_list(t, "blocked_user_agents", p, DEFAULT_BLOCKED_USER_AGENTS),
        server_header=r.string(t, "server_header", p, regex=HEADER_TEXT, what="printable ASCII, 1-128 chars"),
        realm=r.string(t, "realm", p, regex=HEADER_TEXT, what="printable ASCII, 1-128 chars"),
        refuse_failed_attestation=r.boolean(t, "refuse_failed_attestation", p, False),
        early_media=_early_media(r, t, p),
        sip_headers=_sip_headers(r, t, p),
    )


_HEADER_PATTERN = re.compile(r"[A-Za-z0-9!%'+.^_`|~-]+\*?")  # an RFC 3261 token, or one then "*" (a prefix)


def _sip_headers(r: _Reader, t: Mapping[str, object], p: str) -> tuple[str, ...]:
    """`sip_headers`: header names (a trailing "*" a prefix) the application sees; never a credentials field."""
    names = r.string_list(t, "sip_headers", p, DEFAULT_ALLOW)
    for name in names:
        if not _HEADER_PATTERN.fullmatch(name):
            r.fail(
                f"{p}.sip_headers",
                f"expected a SIP header name, or a prefix ending in *; got {json.dumps(name)}",
            )
        elif name.lower() in NEVER_PASSED:  # a prefix that covers one still never passes it
            r.fail(
                f"{p}.sip_headers",
                f"{json.dumps(name)} carries credentials: it never reaches the application",
            )
    return names


def _early_media(r: _Reader, t: Mapping[str, object], p: str) -> str | None:
    """`early_media`: "off", a tone of rtp.tones.RINGBACK_TONES, or an 8 kHz mono 16-bit WAV (a path);
    None when absent. A route's "off" is kept (it overrides [inbound]'s); [inbound]'s "off" is None."""
    value = r.string(t, "early_media", p, what='"off", a tone (ringback, ringback-us) or a WAV file')
    if value is None or value == "off" or value in RINGBACK_TONES:
        return value
    path = r.file(t, "early_media", p)
    if path is not None and Path(path).is_file() and (problem := _check_wav(path)) is not None:
        r.fail(f"{p}.early_media", problem)
    return path


_ROUTE_KEYS = [
    "name",
    "direction",
    "number",
    "pattern",
    "header",
    "caller",
    "attestation",
    "provider",
    "instructions",
    "instructions_file",
    "tools",
    "greeting",
    "language",
    "voice",
    "amd",
    "amd_machine",
    "amd_message",
    "amd_message_wav",
    "calling_hours",
    "timezone",
    "retry_attempts",
    "retry_on",
    "retry_delay_s",
    "disclosure",
    "early_media",
    "early_media_to_provider",
    "recording_consent",
    "recording_consent_wav",
    "no_input_timeout_s",
    "budget",
]


def _recording_consent(r: _Reader, t: dict[str, object], p: str) -> tuple[str | None, str | None]:
    """`recording_consent` (a line of text) or `recording_consent_wav` (an 8 kHz mono 16-bit WAV), not both."""
    text = r.string(t, "recording_consent", p, what="a line of text the model says first")
    if text is not None and not text.strip():
        r.fail(f"{p}.recording_consent", "expected a line of text; got an empty one")
        text = None
    path = r.file(t, "recording_consent_wav", p)
    if path is not None and Path(path).is_file() and (problem := _check_wav(path)) is not None:
        r.fail(f"{p}.recording_consent_wav", problem)
        path = None
    if text is not None and path is not None:
        r.fail(f"{p}.recording_consent", "give recording_consent (a line) or recording_consent_wav, not both")
    return text, path


def _disclosure(r: _Reader, t: dict[str, object], p: str) -> tuple[str | None, str | None]:
    """A route's `disclosure`: (a line of text, None), or (None, the path of a WAV) for a value ending in .wav."""
    value = r.string(t, "disclosure", p, what="a line of text, or a WAV file (8 kHz mono 16-bit)")
    if value is None or not value.lower().endswith(".wav"):
        return value, None
    path = r.file(t, "disclosure", p)
    if path is not None and Path(path).is_file() and (problem := _check_wav(path)) is not None:
        r.fail(f"{p}.disclosure", problem)
        return None, None
    return None, path


def _retry_on(r: _Reader, t: dict[str, object], p: str) -> frozenset[int] | None:
    """`retry_on`: "busy,no_answer" or statuses (bridge/engine/dial_retry.py), a string or an array of them."""
    value = t.get("retry_on", _MISSING)
    if value is _MISSING:
        return None
    parts = value if isinstance(value, list) else [value]
    if not parts or not all(isinstance(v, str | int) and not isinstance(v, bool) for v in parts):
        r.expect(f"{p}.retry_on", 'classes or statuses, e.g. "busy,no_answer" or [486, 408]', value)
        return None
    try:
        return parse_retry_on(",".join(str(v) for v in parts))
    except ValueError as exc:
        r.fail(f"{p}.retry_on", str(exc))
        return None


def _retry_fields(
    r: _Reader, t: dict[str, object], p: str
) -> tuple[int | None, frozenset[int] | None, float | None]:
    attempts = r.integer(t, "retry_attempts", p, lo=1, hi=MAX_ATTEMPTS)
    delay = r.number(t, "retry_delay_s", p, lo=0.0, default=None)
    if delay is not None and delay > MAX_DELAY_S:
        r.fail(f"{p}.retry_delay_s", f"at most {MAX_DELAY_S:g} s (a retry an hour later is the longest wait)")
        delay = None
    return attempts, _retry_on(r, t, p), delay


def _calling_hours(r: _Reader, t: dict[str, object], p: str, direction: str | None) -> CallingHours | None:
    """An outbound route's `calling_hours` in its `timezone` (bridge/engine/calling_hours.py), both or neither."""
    text, zone = r.string(t, "calling_hours", p), r.string(t, "timezone", p)
    if text is None and zone is None:
        return None
    if direction != "outbound":
        r.fail(
            f"{p}.calling_hours",
            "a calling window is for outbound routes: the bridge does not choose when it is called",
        )
        return None
    if text is None or zone is None:
        r.fail(
            f"{p}.{'timezone' if zone is None else 'calling_hours'}", "calling_hours and timezone go together"
        )
        return None
    try:
        return parse_calling_hours(text, zone)
    except ValueError as exc:
        r.fail(f"{p}.calling_hours", str(exc))
        return None


def _tools(r: _Reader, t: dict[str, object], p: str) -> tuple[ToolSpec, ...]:
    value = t.get("tools", _MISSING)
    if value is _MISSING:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        r.expect(f"{p}.tools", "an array of tables ({name, description, parameters})", value)
        return ()
    out: list[ToolSpec] = []
    for j, tool in enumerate(value):
        tp = f"{p}.tools[{j}]"
        r.keys(tool, tp, ["name", "description", "parameters"])
        name = r.string(
            tool, "name", tp, regex=_TOOL_NAME, what="a function name (letters, digits, _ -; at most 64)"
        )
        if "name" not in tool:
            r.fail(f"{tp}.name", "missing: every tool has a name")
        elif name in TELEPHONY_TOOLS:
            r.fail(f"{tp}.name", f"{name} is a telephony tool: switch it on in [telephony] instead")
        elif name is not None and any(s.name == name for s in out):
            r.fail(f"{tp}.name", f"{json.dumps(name)} is declared twice in this route")
        description = r.string(tool, "description", tp, default="")
        params = r.table(tool, "parameters", tp) or {"type": "object", "properties": {}}
        if params.get("type") != "object":
            r.fail(f"{tp}.parameters", 'expected a JSON schema object (type = "object")')
        if name is not None:
            out.append(ToolSpec(name, description or "", params))
    return tuple(out)


def _routes(r: _Reader, items: list[dict[str, object]]) -> tuple[Route, ...]:
    out: list[Route] = []
    for i, t in enumerate(items):
        p = f"routes[{i}]"
        r.keys(t, p, _ROUTE_KEYS)
        name = r.string(t, "name", p, regex=_ROUTE_NAME, what="a name (letters, digits, . _ -)")
        if "name" not in t:
            r.fail(f"{p}.name", "missing: every route has a name (it labels the route's metrics and logs)")
        number = r.string(t, "number", p, what="a called number (the Request-URI user)")
        pattern = r.string(t, "pattern", p, what='an Asterisk-style pattern like "_0800."')
        regex = None
        if number is not None and pattern is not None:
            r.fail(f"{p}.pattern", "give number or pattern, not both")
        if pattern is not None:
            try:
                regex = compile_pattern(pattern)
            except ValueError as exc:
                r.fail(f"{p}.pattern", f"{json.dumps(pattern)}: {exc}")
        caller = r.string(t, "caller", p, what='a caller number, or an Asterisk-style pattern like "_+4930."')
        if caller is not None and caller.startswith("_"):
            try:
                compile_pattern(caller)
            except ValueError as exc:
                r.fail(f"{p}.caller", f"{json.dumps(caller)}: {exc}")
                caller = None
        header = None
        h = r.table(t, "header", p)
        if "header" in t:
            r.keys(h, f"{p}.header", ["name", "value"])
            h_name = r.string(h, "name", f"{p}.header", regex=_HEADER_NAME, what="a SIP header name")
            h_value = r.string(h, "value", f"{p}.header")
            if h_name is None or h_value is None:
                r.fail(f"{p}.header", 'expected {name = "X-...", value = "..."}')
            else:
                header = HeaderMatch(h_name, h_value)
        direction = r.choice(t, "direction", p, DIRECTIONS, "inbound")
        if direction == "outbound" and header is not None:
            r.fail(f"{p}.header", "an outbound route has no header to match: the bridge writes the INVITE")
        if direction == "outbound" and caller is not None:
            r.fail(f"{p}.caller", "an outbound route has no caller to match: the bridge is the caller")
        amd = r.boolean(t, "amd", p, False) if "amd" in t else None
        for key in ("amd", "amd_machine", "amd_message", "amd_message_wav"):
            if direction != "outbound" and key in t:
                r.fail(
                    f"{p}.{key}",
                    "answering-machine detection is for outbound routes: an inbound call never runs it",
                )
        amd_machine, amd_message, amd_message_wav = _amd_choice(r, t, p)
        attestation = r.choice(t, "attestation", p, VERSTATS, None)
        if direction == "outbound" and attestation is not None:
            r.fail(f"{p}.attestation", "an outbound route has no caller attestation to match")
        hours = _calling_hours(r, t, p, direction)
        retry_attempts, retry_on, retry_delay = _retry_fields(r, t, p)
        disclosure, disclosure_wav = _disclosure(r, t, p)
        consent, consent_wav = _recording_consent(r, t, p)
        if direction != "outbound" and (retry_attempts, retry_on, retry_delay) != (None, None, None):
            r.fail(
                f"{p}.retry_attempts",
                "retries are for outbound routes: the bridge does not call a caller back",
            )
        early = _early_media(r, t, p)
        if direction == "outbound" and early is not None:
            r.fail(f"{p}.early_media", "an outbound route hears the callee's early media: it plays none")
        to_provider = (
            r.boolean(t, "early_media_to_provider", p, False) if "early_media_to_provider" in t else None
        )
        if direction != "outbound" and to_provider is not None:
            r.fail(
                f"{p}.early_media_to_provider",
                "the far end's early media is an outbound call's: an inbound call plays its own (early_media)",
            )
        route = Route(
            name=name or f"route-{i}",
            direction="outbound" if direction == "outbound" else "inbound",
            number=number,
            pattern=pattern,
            header=header,
            caller=caller,
            attestation=next((v for v in VERSTATS if v == attestation), None),
            provider=r.choice(t, "provider", p, PROVIDER_NAMES, None),
            instructions=r.instructions(t, p),
            tools=_tools(r, t, p),
            greeting=r.string(t, "greeting", p),
            language=r.string(t, "language", p, regex=_LANGUAGE, what='a language tag like "en" or "de-DE"'),
            voice=r.string(t, "voice", p),
            amd=amd,
            amd_machine=amd_machine,
            amd_message=amd_message,
            amd_message_wav=amd_message_wav,
            calling_hours=hours,
            retry_attempts=retry_attempts,
            retry_on=retry_on,
            retry_delay_s=retry_delay,
            disclosure=disclosure,
            disclosure_wav=disclosure_wav,
            early_media=early,
            early_media_to_provider=to_provider,
            recording_consent=consent,
            recording_consent_wav=consent_wav,
            no_input_timeout_s=r.seconds_or_off(t, "no_input_timeout_s", p, least=NO_INPUT_LEAST_S),
            budget=r.number(t, "budget", p, lo=0.0, default=None),
            _regex=regex,
        )
        if any(o.name == route.name for o in out):
            r.fail(f"{p}.name", f"{json.dumps(route.name)} names an earlier route too")
        for j, earlier in enumerate(out):
            if earlier.catch_all and earlier.direction == route.direction:
                r.fail(p, f"never matches: routes[{j}] ({earlier.name}) matches every call before it")
                break
        out.append(route)
    return tuple(out)


def _rollover(r: _Reader, t: dict[str, object]) -> Rollover:
    p = "rollover"
    r.keys(t, p, [f.name for f in fields(Rollover)])
    return Rollover(
        enabled=r.boolean(t, "enabled", p, True),
        # a provider's cap is its own (minutes); a short one is a test's or a bench's fake, where rollovers are
        # wanted every few seconds: the ages below are checked against it (rollover_options)
        session_cap_ms=r.integer(t, "session_cap_ms", p, lo=1000),
        after_ms=r.integer(t, "after_ms", p, lo=1),
        deadline_ms=r.integer(t, "deadline_ms", p, lo=1),
        hard_stop_ms=r.integer(t, "hard_stop_ms", p, lo=1),
        overlap_ms=r.integer(t, "overlap_ms", p, lo=0),
    )


def _recovery(r: _Reader, t: dict[str, object]) -> Recovery:
    p = "recovery"
    r.keys(t, p, [f.name for f in fields(Recovery)])
    message = r.file(t, "failure_message", p)
    if message is not None and Path(message).is_file():
        problem = _check_wav(message)
        if problem is not None:
            r.fail(f"{p}.failure_message", problem)
    return Recovery(
        reservoir_bytes=r.integer(t, "reservoir_bytes", p, lo=160),
        residence_ms=r.integer(t, "residence_ms", p, lo=20),
        failure_message=message,
    )


def _telephony(r: _Reader, t: dict[str, object]) -> Telephony:
    p = "telephony"
    r.keys(t, p, [f.name for f in fields(Telephony)])
    targets = []
    for name, uri in r.table(t, "transfer_targets", p).items():
        if not isinstance(uri, str) or not uri.startswith(("sip:", "sips:", "tel:")):
            r.expect(f"{p}.transfer_targets.{name}", "a sip:, sips: or tel: URI", uri)
        else:
            targets.append((name, uri))
    return Telephony(
        end_call_tool=r.boolean(t, "end_call_tool", p, False),
        send_dtmf_tool=r.boolean(t, "send_dtmf_tool", p, False),
        dtmf_to_model=r.boolean(t, "dtmf_to_model", p, False),
        recording_tools=r.boolean(t, "recording_tools", p, False),
        transfer_targets=tuple(targets),
        warm_transfer_ring_s=r.number(t, "warm_transfer_ring_s", p, lo=1.0, default=None, inclusive=True),
        hold_music=_wav_file(r, t, "hold_music", p),
        max_call_duration_s=r.seconds_or_off(t, "max_call_duration_s", p),
        rtp_timeout_s=r.seconds_or_off(t, "rtp_timeout_s", p),
        hold_timeout_s=r.seconds_or_off(t, "hold_timeout_s", p),
        session_expires_s=_session_expires(r, t, p),
    )


def _wav_file(r: _Reader, t: dict[str, object], key: str, p: str) -> str | None:
    """A WAV the bridge plays (8 kHz mono 16-bit), checked when the configuration is read."""
    path = r.file(t, key, p)
    if path is not None and Path(path).is_file() and (problem := _check_wav(path)) is not None:
        r.fail(f"{p}.{key}", problem)
    return path


def _session_expires(r: _Reader, t: dict[str, object], p: str) -> int:
    value = r.integer(t, "session_expires_s", p, lo=0, default=1800) or 0
    if 0 < value < 90:
        r.expect(f"{p}.session_expires_s", "0 or an integer >= 90 (RFC 4028 Min-SE)", value)
        return 1800
    return value


def _webhook(r: _Reader, t: dict[str, object]) -> Webhook:
    p = "webhook"
    r.keys(t, p, [f.name for f in fields(Webhook)])
    url = r.string(t, "url", p, regex=re.compile(r"https?://\S+"), what="an http:// or https:// URL")
    ca = r.file(t, "ca", p)  # (only with an https:// url: `deployment_problems`, which sees the command line)
    return Webhook(url=url, timeout_s=r.number(t, "timeout_s", p, lo=0.0, default=10.0) or 10.0, ca=ca)


def _logging(r: _Reader, t: dict[str, object]) -> Logging:
    p = "logging"
    r.keys(t, p, [f.name for f in fields(Logging)])
    level = r.choice(t, "level", p, ["debug", "info", "warning", "error"], "info")
    fmt = r.choice(t, "format", p, ["text", "json"], "text")
    cdr = r.file(t, "cdr", p, must_exist=False)
    if cdr is not None and not Path(cdr).parent.is_dir():
        r.fail(f"{p}.cdr", f"the directory of {cdr!r} does not exist")
    return Logging(
        level="debug"
        if level == "debug"
        else "warning"
        if level == "warning"
        else "error"
        if level == "error"
        else "info",
        format="json" if fmt == "json" else "text",
        cdr=cdr,
    )


def _recording_dir(r: _Reader, t: dict[str, object]) -> str | None:
    r.keys(t, "recording", ["dir"])
    return r.file(t, "dir", "recording", directory=True)


def _drain(r: _Reader, t: dict[str, object]) -> Drain:
    r.keys(t, "drain", ["timeout_s"])
    return Drain(
        timeout_s=_or(r.number(t, "timeout_s", "drain", lo=0.0, default=300.0, inclusive=True), 300.0)
    )


def _cross_checks(r: _Reader, c: BridgeConfig) -> None:
    """What no single key can say: turn detection against the providers that can do it, rollover ages."""
    if c.defaults.turn_detection == "client" and c.defaults.provider is not None:
        # (without a provider here, `--provider` may name one: bridge.cli.ops.server_config checks the merged one)
        used = {c.defaults.provider, *(rt.provider for rt in c.routes if rt.provider)}
        for name in sorted(used):
            kind = KINDS["openai-live" if name == ECHO else name]
            if not kind.client_commits():
                r.fail(
                    "defaults.turn_detection",
                    f'"client" needs providers that can switch turn detection off '
                    f"(openai-realtime, xai); {name} cannot",
                )
    if c.rollover.enabled:
        for name in sorted(
            {c.defaults.provider or "openai-live", *(rt.provider for rt in c.routes if rt.provider)}
        ):
            try:
                c.rollover_options(name)
            except ValueError as exc:
                r.fail("rollover", f"for {name}: {exc}")


# --- call limits: the defaults ------------------------------------------------------------------------------------


def parse_seconds_or_off(value: object, least: float = 1.0) -> float:
    """A limit in seconds as the file and the command line give it: a number >= `least`, or 0 / "off" → 0.0
    (switched off); ValueError saying what was expected."""
    what = f'a number of seconds >= {least:g}, or 0 or "off" (no limit)'
    if isinstance(value, str):
        if value.strip().lower() == "off":
            return 0.0
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"expected {what}; got {_describe(value)}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected {what}; got {_describe(value)}")
    if value != 0 and not value >= least:
        raise ValueError(f"expected {what}; got {value:g}")
    return float(value)


@dataclass(frozen=True, slots=True)
class CallLimits:
    """The limits every call of a configuration gets (None: none), as `call_limits` resolves them."""

    max_call_duration_s: float | None
    rtp_timeout_s: float | None
    hold_timeout_s: float | None

    def describe(self) -> str:
        def one(value: float | None) -> str:
            return "off" if value is None else f"{value:g} s"

        return (
            f"max call duration {one(self.max_call_duration_s)}, RTP timeout {one(self.rtp_timeout_s)}, "
            f"on hold {one(self.hold_timeout_s)}"
        )


# Engines that end calls on these limits (rtp/media.py `CallMedia`, driven by sip/native/agent.py); pjsua2 has none of them and refuses them
LIMITING_ENGINES = frozenset({"native"})


def call_limits(config: BridgeConfig) -> CallLimits:
    """[telephony]'s limits with the defaults filled in (module docstring, "Defaults"): a key not given is the
    default on an engine that can end calls on it, none on one that cannot; 0 ("off") is none."""
    t = config.telephony
    limiting = config.engine.name in LIMITING_ENGINES

    def resolve(value: float | None, default: float) -> float | None:
        if value is None:
            return default if limiting else None
        return value or None

    return CallLimits(
        resolve(t.max_call_duration_s, DEFAULT_MAX_CALL_DURATION_S),
        resolve(t.rtp_timeout_s, DEFAULT_RTP_TIMEOUT_S),
        # every engine keeps the hold limit (rtp/limits.py; pjsua2 from its poll loop)
        DEFAULT_HOLD_TIMEOUT_S if t.hold_timeout_s is None else (t.hold_timeout_s or None),
    )


# --- what the file and the command line together must satisfy -------------------------------------------------


def deployment_problems(config: BridgeConfig, *, inbound: bool = True) -> list[str]:
    """What the merged configuration (the file with the command line over it) asks for that cannot be honoured,
    one line per problem naming the key (and its flag). `inbound` False: `call`, which answers no calls (a TLS
    trunk needs no TLS listener to be called out to). Every key is acted on: what is not possible refuses."""
    out: list[str] = []
    lis, engine = config.listeners, config.engine
    if lis.sip_tls is not None and (lis.tls_cert is None or lis.tls_key is None):
        out.append(
            "listeners.sip_tls: needs listeners.tls_cert and listeners.tls_key "
            "(--tls needs --cert FILE and --key FILE)"
        )
    if lis.sip_tls is None and (lis.tls_cert is not None or lis.tls_key is not None):
        out.append("listeners.tls_cert/tls_key: apply to listeners.sip_tls (--cert/--key apply to --tls)")
    if config.webhook.ca is not None and not (config.webhook.url or "").startswith("https://"):
        out.append("webhook.ca: --webhook-ca applies to --webhook with an https:// URL (webhook.url)")
    if config.inbound.drop_unknown and not any(t.allow for t in config.trunks):
        out.append("inbound.drop_unknown: applies to trunks[].allow (--drop-unknown applies to --allow)")
    native = engine.name == "native"
    if lis.sip_tcp is not None and (not native or lis.sip_tcp != lis.sip_udp):
        out.append(
            f"listeners.sip_tcp: {_addr(lis.sip_tcp)}: the native engine answers SIP over TCP on "
            f"listeners.sip_udp's address ({_addr(lis.sip_udp)}) and the {engine.name} engine on UDP only"
            if not native
            else f"listeners.sip_tcp: {_addr(lis.sip_tcp)}: the native engine answers SIP over TCP on "
            f'listeners.sip_udp\'s address ({_addr(lis.sip_udp)}): give that one, or "off"'
        )
    high = engine.rtp_port_high
    if high is not None:
        room = (high - engine.rtp_port_low + 1) // 2
        calls = engine.max_calls or ENGINES[engine.name].default_max_calls
        if not native:
            out.append(
                f"engine.rtp_ports: an upper bound ({high}) is not supported on the {engine.name} engine"
            )
        elif room < calls:
            out.append(
                f"engine.rtp_ports: {engine.rtp_port_low}-{high} has room for {room} calls (a port pair each), "
                f"fewer than max_calls {calls}"
            )
    for i, trunk in enumerate(config.trunks):
        p = f"trunks[{i}]"
        if trunk.srtp != "off" and trunk.transport != "tls":
            out.append(
                f'{p}.srtp: SDES keys travel only over TLS: srtp = "{trunk.srtp}" needs transport = "tls"'
            )
        if trunk.transport != "udp" and not native:
            out.append(
                f'{p}.transport: "{trunk.transport}" is not supported on the {engine.name} engine (UDP only)'
            )
        elif trunk.transport == "tls" and lis.sip_tls is None and inbound:
            out.append(
                f'{p}.transport: "tls" needs a TLS listener: listeners.sip_tls (--tls) with its certificate'
            )
        elif trunk.transport == "tcp" and not lis.tcp and inbound:
            out.append(
                f'{p}.transport: "tcp" needs SIP over TCP, which listeners.sip_tcp = "off" switched off'
            )
    if not native and config.inbound.blocked_user_agents != DEFAULT_BLOCKED_USER_AGENTS:
        out.append(f"inbound.blocked_user_agents: the {engine.name} engine has no inbound policy to apply it")
    if engine.name not in LIMITING_ENGINES:
        t = config.telephony
        for key, value in (
            ("max_call_duration_s", t.max_call_duration_s),
            ("rtp_timeout_s", t.rtp_timeout_s),
        ):
            if value:
                out.append(
                    f"telephony.{key}: the {engine.name} engine cannot end calls on it (use the native engine, "
                    'or 0 / "off")'
                )
    out.extend(_consent_problems(config))
    return out


def _consent_problems(config: BridgeConfig) -> list[str]:
    """A recording consent (bridge/server/recording.py) with recording off announces a recording that never
    starts; a recorded one cannot follow a disclosure the model says (the disclosure comes first, and the
    bridge plays its recordings before the model speaks)."""
    d, out = config.defaults, []
    default = d.recording_consent or d.recording_consent_wav
    if default and config.recording.dir is None:
        out.append(
            "defaults.recording_consent: recording is off: give recording.dir (--record DIR), or no consent"
        )
    for i, r in enumerate(config.routes):
        own = r.recording_consent is not None or r.recording_consent_wav is not None
        if own and config.recording.dir is None:
            out.append(
                f"routes[{i}].recording_consent: recording is off: give recording.dir (--record DIR), or no "
                "consent"
            )
        wav = r.recording_consent_wav if own else d.recording_consent_wav
        if wav is not None and r.disclosure is not None:
            out.append(
                f"routes[{i}].recording_consent_wav: a recorded consent cannot follow the disclosure the model "
                "says (the disclosure comes first): give the disclosure as a WAV, or the consent as a line"
            )
    return out


def _addr(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def missing_files(config: BridgeConfig) -> list[str]:
    """Files the configuration names that `serve` needs at start but `load` does not insist on (the file may be
    checked on another machine than the one it runs on): the TLS listener's certificate and key."""
    lis = config.listeners
    return [
        f"listeners.{key}: no file at {path!r}"
        for key, path in (("tls_cert", lis.tls_cert), ("tls_key", lis.tls_key))
        if path is not None and not Path(path).is_file()
    ]


# --- the options table: every `serve` option, its flag and its file key -------------------------------------------


class SecondsOrOff(click.ParamType[float, Any]):
    """A limit in seconds on the command line: a number >= `least`, or 0 / "off" (→ 0.0: no limit)."""

    name = "seconds"

    def __init__(self, least: float = 1.0) -> None:
        self.least = least

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            return parse_seconds_or_off(value, self.least)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


FileValues = Callable[[Any], Mapping[str, object]]


@dataclass(frozen=True, slots=True)
class Option:
    """One row of the table. `key` is the file key the flag sets: "section.key", "trunks[].key" (the one trunk,
    or a trunk made for the command line) or "providers.<provider>.key" (the provider chosen). `file_values`
    turns the flag's value (as click parsed it) into the keys of that table as the file would hold them; the
    file's own reader then checks and converts them, so a flag and its key cannot mean different things.
    `default` is shown in --help only: what applies when neither gives the key is the schema's default.
    `example`/`needs` are one value of the flag (argv after it) and the flags it needs to have an effect:
    tests/unit/bridge/test_config_options.py proves with them, row by row, that flag and key build the same server."""

    name: str  # the click parameter name (serve's keyword argument)
    flags: tuple[str, ...]
    key: str
    help: str
    type: Any = None  # a click type (None: a string)
    default: object = None
    show_default: bool = False
    is_flag: bool = False
    multiple: bool = False
    metavar: str | None = None
    file_values: FileValues | None = None  # None: {last part of key: value}
    fields: tuple[str, ...] = ()  # the schema fields the key sets (default: its last part)
    example: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    other: tuple[str, ...] = ()  # a second value, for a row whose needs alone are refused (compared instead)

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def table(self) -> str:
        return self.key.split(".", 1)[0].removesuffix("[]")

    @property
    def file_key(self) -> str:
        return self.key.rsplit(".", 1)[-1]

    def values(self, value: object) -> Mapping[str, object]:
        """The file's keys (of this row's table) for the flag's value; ValueError for a value it cannot be."""
        if self.file_values is not None:
            return self.file_values(value)
        if isinstance(value, tuple):
            value = list(value)
        return {self.file_key: value}

    def click_option(self) -> click.Option:
        kwargs: dict[str, Any] = {"help": self.help, "metavar": self.metavar}
        if self.is_flag:
            kwargs["is_flag"] = True
        else:
            kwargs.update(type=self.type, default=self.default, show_default=self.show_default)
            kwargs["multiple"] = self.multiple
        return click.Option([*self.flags, self.name], **kwargs)


_SRTP_NAMES = {
    "off": "off",
    "offer": "offer",
    "optional": "offer",
    "require": "require",
    "required": "require",
}
_HOST_PORT = "HOST:PORT"


def _srtp_values(value: object) -> Mapping[str, object]:
    srtp = _SRTP_NAMES[str(value)]
    # SDES keys travel only over TLS (sip.native.tls.sdes_policy): SRTP from the command line makes its trunk TLS
    return {"srtp": srtp} if srtp == "off" else {"srtp": srtp, "transport": "tls"}


def _url_or_nothing(value: object) -> Mapping[str, object]:
    return {"url": value} if value else {}  # --provider-url "": the provider's own endpoint


def _transfer_targets(value: object) -> Mapping[str, object]:
    items = value if isinstance(value, tuple | list) else (value,)
    return {"transfer_targets": dict(parse_transfer_target(str(v)) for v in items)}


def _engines_help() -> str:
    return (
        "SIP engine. "
        + "; ".join(
            f"{name}: {spec.limits}" + (f" (needs parlora-bridge[{spec.extra}])" if spec.extra else "")
            for name, spec in ENGINES.items()
        )
        + "."
    )


_LIMIT_HELP = " 0 or off: no limit. Default: {default:g} s on the native engine (the pjsua2 engine cannot)."

OPTIONS: tuple[Option, ...] = (
    # [listeners]
    Option("sip_addr", ("--sip",), "listeners.sip_udp", "UDP address to answer SIP on.",
           default="127.0.0.1:5060", show_default=True, metavar=_HOST_PORT, example=("127.0.0.1:5098",)),
    Option("sip_tcp", ("--sip-tcp",), "listeners.sip_tcp",
           "SIP over TCP: the native engine answers it on --sip's address (the default); off: not at all.",
           metavar="HOST:PORT|off", file_values=lambda v: {"sip_tcp": v}, fields=("sip_tcp", "tcp"),
           example=("off",)),
    Option("tls", ("--tls",), "listeners.sip_tls",
           "Also answer SIP over TLS here (TLS 1.2/1.3; needs --cert and --key); Contact sips:/transport=tls.",
           metavar=_HOST_PORT, example=("127.0.0.1:5097",), needs=("--cert", "@cert", "--key", "@key"),
           other=("127.0.0.1:5096",)),
    Option("cert", ("--cert",), "listeners.tls_cert", "TLS certificate (PEM).",
           type=click.Path(exists=True, dir_okay=False), example=("@cert",),
           needs=("--tls", "127.0.0.1:5097", "--key", "@key"), other=("@wav",)),
    Option("tls_key", ("--key",), "listeners.tls_key", "TLS private key (PEM).",
           type=click.Path(exists=True, dir_okay=False), example=("@key",),
           needs=("--tls", "127.0.0.1:5097", "--cert", "@cert"), other=("@wav",)),
    Option("tls_ca", ("--tls-ca",), "listeners.tls_ca",
           "CA certificate(s) that outbound TLS verifies the peer against (default: the system's).",
           type=click.Path(exists=True, dir_okay=False), example=("@cert",)),
    Option("http_addr", ("--http",), "listeners.http",
           "HOST:PORT for the JSON status endpoint (GET /calls), the console at / and the browser channel "
           "(POST /talk).", metavar=_HOST_PORT, example=("127.0.0.1:8099",)),
    Option("http_token_env", ("--http-token-env",), "listeners.http_token_env",
           "Environment variable holding the bearer token the HTTP listener requires (needed when --http is "
           "not on loopback).", metavar="NAME", example=("PARLORA_TEST_TOKEN",),
           needs=("--http", "127.0.0.1:8099", "@env", "PARLORA_TEST_TOKEN=t0k3n-t0k3n")),
    Option("webrtc_address", ("--webrtc-address",), "listeners.webrtc_address",
           "The Talk button's WebRTC (ICE) address: an address of this host the browser can reach. Default: "
           "the --http address (every interface address when it is 0.0.0.0 or ::).", metavar="ADDR",
           example=("127.0.0.1",), needs=("--http", "127.0.0.1:8099")),
    Option("stun", ("--stun",), "listeners.stun",
           "A STUN server (stun:HOST[:PORT]) for the Talk button, the bridge's and the page's, for a browser "
           "behind NAT. Default: none (ICE sends nothing but to the browser).", metavar="URL",
           example=("stun:stun.example.net:3478",), needs=("--http", "127.0.0.1:8099")),
    # [engine]
    Option("engine", ("--engine",), "engine.name", _engines_help(), type=click.Choice(list(ENGINES)),
           default=DEFAULT_ENGINE, show_default=True, example=("pjsua2",),
           needs=("--max-call-duration", "off", "--rtp-timeout", "off", "--hold-timeout", "off")),
    Option("max_calls", ("--max-calls",), "engine.max_calls",
           "Concurrent calls; beyond them an INVITE is refused. Default: the engine's own ("
           + ", ".join(f"{name} {spec.default_max_calls}" for name, spec in ENGINES.items()) + ").",
           type=click.IntRange(min=1), example=("7",)),
    Option("rtp_port", ("--rtp-port",), "engine.rtp_ports",
           "First local RTP port (each call takes a pair; the engine's own pool size from there).",
           type=int, default=4000, show_default=True, fields=("rtp_port_low", "rtp_port_high"),
           example=("20000",)),
    Option("rtp_ports", ("--rtp-ports",), "engine.rtp_ports",
           "The RTP port range LOW-HIGH (each call takes a pair; room for max calls is checked at start).",
           metavar="LOW-HIGH", fields=("rtp_port_low", "rtp_port_high"), example=("30000-30999",)),
    # [defaults]
    Option("provider", ("--provider",), "defaults.provider",
           "Realtime provider. Default: openai-live when OPENAI_API_KEY is set, else echo (a local GPT-Live "
           "fake that speaks each caller utterance back).", type=click.Choice(list(PROVIDER_NAMES)),
           example=("openai-realtime",), needs=("@env", "OPENAI_API_KEY=sk-test")),
    Option("instructions", ("--instructions",), "defaults.instructions", "Instructions for the model.",
           example=("Be brief.",)),
    Option("turn_detection", ("--turn-detection",), "defaults.turn_detection",
           "Who ends the caller's turns: the provider's own detection (server), or the bridge, which switches "
           "the provider's off and commits each turn itself (client; openai-realtime and xai only).",
           type=click.Choice(["server", "client"]), default="server", show_default=True,
           example=("client",), needs=("--provider", "xai", "@env", "XAI_API_KEY=xai-test")),
    Option("recording_consent", ("--recording-consent",), "defaults.recording_consent",
           "With --record: a recording consent line the model says first (after a disclosure); each call's "
           "recording starts only once it was heard whole, and not at all when a barge-in, a provider recovery "
           "or a hang-up cut it. A route's recording_consent or recording_consent_wav wins.", metavar="TEXT",
           example=("This call is recorded.",), needs=("--record", "@dir")),
    Option("recording_consent_wav", ("--recording-consent-wav",), "defaults.recording_consent_wav",
           "With --record: the recording consent as a recording the bridge plays first (8 kHz mono 16-bit WAV; "
           "after a recorded disclosure; barge-in does not stop it); each call's recording starts where its "
           "last frame left.", type=click.Path(exists=True, dir_okay=False), example=("@wav",),
           needs=("--record", "@dir")),
    Option("no_input_timeout", ("--no-input-timeout",), "defaults.no_input_timeout_s",
           "When the caller has said nothing for S seconds while it was theirs to speak (not while the model "
           "speaks, on hold, during a repair or a tool call), the model checks in with them; after a second "
           f"such silence it says goodbye and the call ends. At least {NO_INPUT_LEAST_S:g} s; a route's "
           "no_input_timeout_s overrides it. 0 or off: never (the default).", type=SecondsOrOff(NO_INPUT_LEAST_S),
           metavar="S|off", example=("20",)),
    # [providers.NAME] of the provider chosen
    Option("provider_url", ("--provider-url",), "providers.<provider>.url",
           "WebSocket URL of the provider (e.g. a fake-provider).", file_values=_url_or_nothing,
           example=("ws://127.0.0.1:9/x",), needs=("--provider", "xai", "@env", "XAI_API_KEY=xai-test")),
    Option("provider_ca", ("--provider-ca",), "providers.<provider>.ca",
           "CA certificate(s) to trust for a wss:// provider URL (e.g. the Gemini fake's self-signed "
           "certificate).", type=click.Path(exists=True, dir_okay=False), example=("@cert",),
           needs=("--provider", "gemini-live", "@env", "GEMINI_API_KEY=g-test")),
    Option("provider_append_ms", ("--provider-append-ms",), "providers.<provider>.append_ms",
           "Caller audio per append sent to the provider. 20 sends every caller frame at once (lowest latency; "
           "the most CPU: at 300 calls the provider path is most of the bridge's cost); 40 joins two frames "
           "(the provider hears the caller up to 20 ms later, for 20-40 % less CPU per frame); 100 halves the "
           "cost of 20 but the provider hears the caller up to 80 ms later.",
           type=click.Choice([str(ms) for ms in APPEND_MS_CHOICES]), default=str(DEFAULT_APPEND_MS),
           show_default=True, file_values=lambda v: {"append_ms": int(v)}, example=("100",),
           needs=("--provider", "xai", "@env", "XAI_API_KEY=xai-test")),
    # [[trunks]]
    Option("allow", ("--allow",), "trunks[].allow",
           "Only these sources may call (repeatable, IPv4/IPv6); others get 403 (see --drop-unknown).",
           multiple=True, metavar="CIDR", example=("10.0.0.0/8",)),
    Option("inbound_auth", ("--inbound-auth",), "trunks[].inbound_auth_user",
           "Challenge inbound calls with digest auth (401) for USER; the password is in "
           f"{DEFAULT_INBOUND_PASSWORD_ENV}.", metavar="USER", example=("carrier",),
           needs=("@env", f"{DEFAULT_INBOUND_PASSWORD_ENV}=pw-in")),
    Option("register", ("--register",), "trunks[].registrar",
           "Register this address-of-record (repeatable): refreshed before expiry, retried with backoff, "
           f"un-registered on shutdown; digest password in {DEFAULT_SIP_PASSWORD_ENV}. State: GET /registrations.",
           multiple=True, metavar="sip:USER@HOST[:PORT]", example=("sip:b@127.0.0.1:5999",)),
    Option("auth_user", ("--auth-user",), "trunks[].auth_user",
           "Digest user for --register (default: USER) and for calls placed that the trunk challenges.",
           metavar="NAME", example=("acct",), needs=("@env", f"{DEFAULT_SIP_PASSWORD_ENV}=pw-1")),
    Option("keepalive", ("--keepalive",), "trunks[].register_keepalive_s",
           "While registered, an OPTIONS to each registrar every S seconds (0: off); 3 unanswered in a row "
           "register again at once. Counters: GET /registrations.", type=click.FloatRange(min=0),
           default=30.0, show_default=True, metavar="S", example=("12",),
           needs=("--register", "sip:b@127.0.0.1:5999")),
    Option("srtp", ("--srtp",), "trunks[].srtp",
           "SDES-SRTP (AES_CM_128_HMAC_SHA1_80/_32); keys only over TLS, so a trunk with SRTP is a TLS trunk: "
           "'offer' (or 'optional') answers SRTP when offered and offers it on calls placed over TLS, 'require' "
           "(or 'required') refuses (488) a call that offers no SRTP, and any call not over TLS unless another "
           "trunk takes it.", type=click.Choice(list(_SRTP_NAMES)), default="off", show_default=True,
           file_values=_srtp_values, fields=("srtp", "transport"), example=("require",),
           needs=("--tls", "127.0.0.1:5097", "--cert", "@cert", "--key", "@key")),
    Option("external_address", ("--external-address",), "trunks[].external_address",
           "NAT: the address peers reach this bridge at (Contact, Via sent-by, SDP c=/o=).", metavar="IP",
           example=("203.0.113.9",)),
    Option("nat", ("--nat",), "trunks[].nat",
           "NAT mode: symmetric RTP (send to where the caller's RTP comes from) and in-dialog requests to the "
           "address the INVITE came from.", is_flag=True, example=()),
    Option("rtp_source", ("--rtp-source",), "trunks[].rtp_source",
           "Without --nat, whose RTP a call takes: learn (the SDP's address, or else the first source sending "
           "4 packets in sequence, then only that one: Asterisk's strictrtp) or strict (only the SDP's "
           "address).", type=click.Choice(SOURCE_POLICIES), default="learn", show_default=True,
           example=("strict",)),
    Option("trust_identity_headers", ("--trust-identity-headers",), "trunks[].trust_identity_headers",
           "This trunk sets P-Asserted-Identity and Diversion itself (a carrier, an SBC): the caller ID is the "
           "first P-Asserted-Identity's number, diverted_from the first Diversion's (without it: From's number, "
           "the headers passed on as claims).", is_flag=True, example=()),
    Option("codec", ("--codec",), "trunks[].codecs",
           "An audio codec calls offer and accept, in order of preference (repeatable; default PCMU then "
           "PCMA): a carrier that fails on anything but G.711 gets only what is listed. Known: "
           f"{', '.join(CODECS)}; another name refuses to start.", multiple=True, metavar="NAME",
           example=("PCMA",)),
    # [inbound]
    Option("sip_header", ("--sip-header",), "inbound.sip_headers",
           "An inbound SIP header the application sees (identity, webhook, call record, CDR); a trailing * is "
           "a prefix; repeatable, replaces the default: X-*, P-Asserted-Identity, Diversion, History-Info. At "
           "most 32 fields, each value cut at 1,024 characters, control characters dropped; Authorization "
           "never.", multiple=True, metavar="NAME", example=("X-Customer-Id",)),
    Option("drop_unknown", ("--drop-unknown",), "inbound.drop_unknown",
           "Send nothing at all to a source outside --allow.", is_flag=True, needs=("--allow", "10.0.0.0/8")),
    Option("refuse_failed_attestation", ("--refuse-failed-attestation",), "inbound.refuse_failed_attestation",
           "Refuse an inbound call whose carrier says its caller ID failed STIR/SHAKEN verification "
           "(verstat=TN-Validation-Failed) with 608 Rejected (RFC 8688).", is_flag=True),
    Option("allow_any", ("--allow-any",), "inbound.allow_any",
           "Start off loopback with no --allow and no --inbound-auth: anyone who reaches the port can open "
           "paid provider sessions (warned loudly).", is_flag=True),
    Option("invite_rate", ("--invite-rate",), "inbound.invite_rate_per_s",
           "INVITEs per second from one source before 503 with Retry-After (burst 10; 0: no limit). Default: 5 "
           "off loopback, no limit on a loopback --sip.", type=click.FloatRange(min=0), metavar="N",
           example=("2.5",)),
    Option("options_rate", ("--options-rate",), "inbound.options_rate_per_s",
           "Out-of-dialog OPTIONS per second from one source before they are dropped unanswered (burst 20; 0: "
           "no limit). Default: 10 off loopback, no limit on a loopback --sip.", type=click.FloatRange(min=0),
           metavar="N", example=("0",)),
    Option("server_header", ("--server-header",), "inbound.server_header",
           "The product name sent as Server / User-Agent. Default: none at all (a scanner learns nothing).",
           metavar="TEXT", example=("Acme Voice",)),
    Option("realm", ("--realm",), "inbound.realm",
           "The inbound digest realm. Default: the address the bridge advertises (no product name).",
           metavar="TEXT", example=("acme",)),
    # [rollover]
    Option("session_cap_ms", ("--session-cap-ms",), "rollover.session_cap_ms",
           "How long the provider lets one connection last (default: the provider's: OpenAI 60 min, xAI 30 min, "
           "Gemini 10 min). The rollover ages are 55/60, 58/60 and 59.5/60 of it unless given below.",
           type=int, metavar="MS", example=("1200000",)),
    Option("rollover_after_ms", ("--rollover-after-ms",), "rollover.after_ms",
           "Connection age after which the caller's first end of speech opens the next connection.",
           type=int, metavar="MS", example=("3000000",)),
    Option("rollover_deadline_ms", ("--rollover-deadline-ms",), "rollover.deadline_ms",
           "Connection age at which the next connection opens whatever is being said.", type=int,
           metavar="MS", example=("3400000",)),
    Option("rollover_hard_stop_ms", ("--rollover-hard-stop-ms",), "rollover.hard_stop_ms",
           "Connection age by which the next connection must have opened, or the call ends with a goodbye.",
           type=int, metavar="MS", example=("3550000",)),
    Option("rollover_overlap_ms", ("--rollover-overlap-ms",), "rollover.overlap_ms",
           "Least time both connections hear the caller (default 3000).", type=int, metavar="MS",
           example=("5000",)),
    Option("no_rollover", ("--no-rollover",), "rollover.enabled",
           "Never open a next connection: the call ends at the cap.", is_flag=True,
           file_values=lambda v: {"enabled": not v}),
    # [recovery]
    Option("reservoir_bytes", ("--reservoir-bytes",), "recovery.reservoir_bytes",
           "Reservoir capacity in bytes of the provider's output format (default: the provider's own).",
           type=int, example=("32000",)),
    Option("residence_ms", ("--residence-ms",), "recovery.residence_ms",
           "Reservoir residence deadline (default: the provider's).", type=int, example=("2500",)),
    Option("failure_message", ("--failure-message",), "recovery.failure_message",
           "WAV (8 kHz mono 16-bit) the caller hears when a session fails, before the BYE (default: three "
           "short beeps).", type=click.Path(exists=True, dir_okay=False), example=("@wav",)),
    # [telephony]
    Option("end_call_tool", ("--end-call-tool",), "telephony.end_call_tool",
           "Offer the model `end_call` (a goodbye, then BYE).", is_flag=True),
    Option("transfer_targets", ("--transfer-target",), "telephony.transfer_targets",
           "Offer the model `transfer_call` to this destination (SIP REFER; repeatable).", multiple=True,
           metavar="NAME=sip:URI", file_values=_transfer_targets, example=("desk=sip:desk@pbx.example.com",)),
    Option("warm_transfer_ring_s", ("--warm-transfer-ring",), "telephony.warm_transfer_ring_s",
           "Let the model's `transfer_call` be warm (mode warm: the caller on hold, the target dialled and "
           "briefed by a second session, joined when the human keys 1) ringing the target at most S seconds. "
           "Default: cold transfers only.", type=click.FloatRange(min=1.0), metavar="S", example=("30",)),
    Option("hold_music", ("--hold-music",), "telephony.hold_music",
           "WAV (8 kHz mono 16-bit, looped) a caller hears while a warm transfer dials and briefs the target "
           "(default: silence).", type=click.Path(exists=True, dir_okay=False), example=("@wav",)),
    Option("send_dtmf_tool", ("--send-dtmf-tool",), "telephony.send_dtmf_tool",
           "Offer the model `send_dtmf` (RFC 4733 digits).", is_flag=True),
    Option("dtmf_to_model", ("--dtmf-to-model",), "telephony.dtmf_to_model",
           "Tell the model which keys the caller presses.", is_flag=True),
    Option("recording_tools", ("--recording-tools",), "telephony.recording_tools",
           "Offer the model `pause_recording` and `resume_recording` (the `--record` WAV).", is_flag=True),
    Option("max_call_duration", ("--max-call-duration",), "telephony.max_call_duration_s",
           "End every call after S seconds: the model says a short goodbye, then BYE."
           + _LIMIT_HELP.format(default=DEFAULT_MAX_CALL_DURATION_S), type=SecondsOrOff(), metavar="S|off",
           example=("120",)),
    Option("rtp_timeout", ("--rtp-timeout",), "telephony.rtp_timeout_s",
           "End a call (BYE) when the caller sent no RTP for S seconds while not on hold, so a lost BYE cannot "
           "keep a call and its provider connection open." + _LIMIT_HELP.format(default=DEFAULT_RTP_TIMEOUT_S),
           type=SecondsOrOff(), metavar="S|off", example=("20",)),
    Option("hold_timeout", ("--hold-timeout",), "telephony.hold_timeout_s",
           "End a call (BYE) that has been on hold for S seconds (no RTP is expected while held)."
           + f" 0 or off: no limit. Default: {DEFAULT_HOLD_TIMEOUT_S:g} s.", type=SecondsOrOff(),
           metavar="S|off",
           example=("600",)),
    Option("session_expires", ("--session-expires",), "telephony.session_expires_s",
           "RFC 4028 session timer asked of every caller and offered on calls placed, in seconds (at least 90); "
           "0: none asked (a peer's request is still honoured).", type=click.IntRange(min=0), default=1800,
           show_default=True, metavar="S", example=("900",)),
    # [webhook]
    Option("webhook_url", ("--webhook",), "webhook.url",
           "POST each tool call / delegation to this http(s) URL and give its answer to the model. Requests "
           f"are signed with the shared secret in the environment variable {SECRET_ENV} (required).",
           metavar="URL", example=("http://127.0.0.1:9/jobs",), needs=("@env", f"{SECRET_ENV}=s3cret-s3cret")),
    Option("webhook_timeout", ("--webhook-timeout",), "webhook.timeout_s",
           "The application's time to answer one webhook request (connection attempts included).", type=float,
           default=10.0, show_default=True, metavar="SECONDS", example=("3",),
           needs=("--webhook", "http://127.0.0.1:9/jobs", "@env", f"{SECRET_ENV}=s3cret-s3cret")),
    Option("webhook_ca", ("--webhook-ca",), "webhook.ca",
           "CA certificate(s) to trust for an https:// --webhook URL (default: the system's).",
           type=click.Path(exists=True, dir_okay=False), metavar="FILE", example=("@cert",),
           needs=("--webhook", "https://127.0.0.1:9/jobs", "@env", f"{SECRET_ENV}=s3cret-s3cret")),
    # [logging], [recording], [drain]
    Option("log_level", ("--log-level",), "logging.level", "",
           type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True,
           example=("debug",)),
    Option("log_format", ("--log-format",), "logging.format",
           "json: one object per line (time, level, logger, message, event, call_id); secrets redacted.",
           type=click.Choice(["text", "json"]), default="text", show_default=True, example=("json",)),
    Option("cdr", ("--cdr",), "logging.cdr",
           "Append one JSON line per finished call (the call record, bridge/server/records.py) to FILE.",
           type=click.Path(dir_okay=False, writable=True), metavar="FILE", example=("@dir/calls.jsonl",)),
    Option("record", ("--record",), "recording.dir",
           "Record every call as a stereo WAV in DIR: left the caller, right what was sent to the carrier.",
           type=click.Path(file_okay=False, exists=True, writable=True), metavar="DIR", example=("@dir",)),
    Option("drain_timeout", ("--drain-timeout",), "drain.timeout_s",
           "SIGTERM or POST /drain: refuse new calls (503), let live calls finish for up to S seconds, then a "
           "goodbye from the model and BYE for the rest, and exit; a second SIGTERM or SIGINT ends at once.",
           type=click.FloatRange(min=0), default=DEFAULT_DRAIN_S, show_default=True, metavar="S",
           example=("0",)),
    # [pricing.NAME] of the provider chosen
    Option("price_audio", ("--price-audio-per-minute",), "pricing.<provider>.audio_per_minute",
           "The provider's price of a minute of audio (currency-less; recoveries' and rollovers' replay "
           "included): the call record's and /metrics' price, and what a route's budget is checked against.",
           type=click.FloatRange(min=0), metavar="PRICE", example=("0.06",), needs=("--provider", "echo")),
    Option("price_input_tokens", ("--price-input-tokens",), "pricing.<provider>.input_tokens_per_million",
           "The provider's price of a million input tokens (currency-less).",
           type=click.FloatRange(min=0), metavar="PRICE", example=("4",), needs=("--provider", "echo")),
    Option("price_output_tokens", ("--price-output-tokens",), "pricing.<provider>.output_tokens_per_million",
           "The provider's price of a million output tokens (currency-less).",
           type=click.FloatRange(min=0), metavar="PRICE", example=("16",), needs=("--provider", "echo")),
    # [outbound]
    Option("amd", ("--amd",), "outbound.amd",
           "Answering-machine detection on calls placed: the model's first words wait for the verdict (human, "
           "machine, beep, silence, unknown; at most 4 s after the answer), a machine's until its beep. Native "
           "engine only.", is_flag=True),
    Option("retry_attempts", ("--retry-attempts",), "outbound.retry_attempts",
           "Attempts of each call placed, the first included (1: never retried). A busy or unanswered call "
           "(--retry-on) is placed again after --retry-delay, each further wait doubled (at most 1 h); calling "
           "hours, the do-not-call hook and the trunk's queue are checked again for each.",
           type=click.IntRange(1, MAX_ATTEMPTS), default=1, show_default=True, metavar="N", example=("3",)),
    Option("retry_on", ("--retry-on",), "outbound.retry_on",
           "What a retry follows: busy (486, 600), no_answer (408, 480), unavailable (500, 502-504), or those "
           "statuses, comma-separated. A decline (603), a wrong number or a cancel is never retried.",
           default="busy,no_answer", show_default=True, metavar="LIST", example=("busy",),
           needs=("--retry-attempts", "2")),
    Option("retry_delay", ("--retry-delay",), "outbound.retry_delay_s",
           "Seconds before the first retry of a call placed; each further retry waits twice as long (at most "
           "3600).",
           type=click.FloatRange(min=0, min_open=True, max=MAX_DELAY_S), default=300.0, show_default=True,
           metavar="S", example=("60",), needs=("--retry-attempts", "2")),
    Option("amd_machine", ("--amd-machine",), "outbound.amd_machine",
           "With --amd, what a call answered by a mailbox does: talk (the model's greeting after the beep), "
           "message (the --amd-message or --amd-message-wav after the beep, then BYE) or hang_up (BYE at the "
           "verdict; the model never speaks). A person always gets talk; the application may answer the "
           "verdict otherwise (Application.amd_action, or the webhook's answer to the amd verdict event).",
           type=click.Choice(list(AMD_ACTIONS)), default=_AMD_POLICY.machine, show_default=True,
           example=("hang_up",)),
    Option("amd_message", ("--amd-message",), "outbound.amd_message",
           "The message left on a mailbox (--amd-machine message): the model is told to say this text after "
           "the beep; the call ends once it has played.", metavar="TEXT",
           example=("This is Acme. Please call us back on 555 0100.",)),
    Option("amd_message_wav", ("--amd-message-wav",), "outbound.amd_message_wav",
           "The message left on a mailbox as a recording the bridge plays after the beep, then BYE (8 kHz mono "
           "16-bit WAV; the model never speaks). Wins over --amd-message.",
           type=click.Path(exists=True, dir_okay=False), example=("@wav",)),
    Option("amd_total_ms", ("--amd-total-ms",), "outbound.amd_total_ms",
           "The AMD verdict comes at the latest this long after the answer (unknown when no rule decided): "
           "the longest a person's first words wait.", type=click.IntRange(min=1000, max=30_000),
           default=_AMD.total_ms, show_default=True, metavar="MS", example=("5000",)),
    Option("amd_machine_greeting_ms", ("--amd-machine-greeting-ms",), "outbound.amd_machine_greeting_ms",
           "A greeting that runs this long without a pause is a mailbox's (a person's \"hello?\" is 0.4-0.8 s, "
           "\"yes, hello, who is this?\" about 1.5 s).",
           type=click.IntRange(min=_AMD.human_greeting_ms + 100, max=30_000), default=_AMD.machine_greeting_ms,
           show_default=True, metavar="MS", example=("3000",)),
    Option("amd_beep_wait_ms", ("--amd-beep-wait-ms",), "outbound.amd_beep_wait_ms",
           "After a mailbox verdict, its beep is waited for at most this long (a greeting that ends in silence "
           "without one starts the message sooner).", type=click.IntRange(min=1000, max=120_000),
           default=_AMD.beep_wait_ms, show_default=True, metavar="MS", example=("20000",)),
    Option("amd_decide_ms", ("--amd-decide-ms",), "outbound.amd_decide_ms",
           "The application's answer to the AMD verdict is waited for at most this long; then the route's "
           "choice applies (0: the route's at once, the application is not asked).",
           type=click.IntRange(min=0, max=10_000), default=_AMD_POLICY.decide_ms, show_default=True,
           metavar="MS", example=("1000",)),
    Option("early_media_to_provider", ("--early-media-to-provider",), "outbound.early_media_to_provider",
           "Calls placed: the far end's early media (a 183 or 180 with SDP before the answer: an IVR, an "
           "announcement) goes to the model too. Without it the model hears nothing before the answer; the "
           "recording, the call record and answering-machine detection get it either way. Native engine only.",
           is_flag=True),
    Option("early_media", ("--early-media",), "inbound.early_media",
           "Calls answered: 183 Session Progress with the SDP answer while the provider connects, and the "
           "caller hears ringback (425 Hz 1 s on 4 s off, ETSI), ringback-us (440+480 Hz 2 s on 4 s off) or a "
           "WAV (8 kHz mono 16-bit, played once) until the 200 OK. Reliable (PRACK) when the caller requires "
           "100rel. Native engine only.",
           default="off", show_default=True, metavar="off|ringback|ringback-us|WAV", example=("ringback",)),
)  # fmt: skip

# `serve`'s click parameter names → their row; an option without a row is an error (`apply_options`)
CLI_OPTIONS: Mapping[str, Option] = MappingProxyType({o.name: o for o in OPTIONS})
_NOT_CONFIG = frozenset({"config"})  # `serve --config FILE` itself


def click_options(names: Sequence[str] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator giving a click command the table's options (`names`, or every row), in table order."""
    rows = [o for o in OPTIONS if names is None or o.name in names]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        params = getattr(command, "__click_params__", [])
        params.extend(row.click_option() for row in reversed(rows))
        command.__click_params__ = params  # type: ignore[attr-defined]
        return command

    return decorate


def options_reference() -> str:
    """The table as docs/configuration.md lists it (a Markdown table, one row per option)."""

    def kind(o: Option) -> str:
        t = o.type
        if o.is_flag:
            out = "switch"
        elif isinstance(t, click.Choice):
            out = " \\| ".join(str(c) for c in t.choices)
        elif isinstance(t, SecondsOrOff):
            out = "seconds \\| off"
        elif isinstance(t, click.Path):
            out = "directory" if not t.file_okay else "file"
        elif isinstance(t, click.IntRange | click.FloatRange) or t in (int, float):
            out = "integer" if isinstance(t, click.IntRange) or t is int else "number"
            low = getattr(t, "min", None)
            out += f" >= {low}" if low is not None else ""
        else:
            out = (o.metavar or "text").replace("|", "\\|")
        return out + " (repeatable)" if o.multiple else out

    lines = ["| flag | file key | value | default | what it does |", "|---|---|---|---|---|"]
    for o in OPTIONS:
        default = "" if o.default is None or o.is_flag else f"`{o.default}`"
        flags = ", ".join(f"`{f}`" for f in o.flags)
        what = " ".join(o.help.split()).replace("|", "\\|")
        lines.append(f"| {flags} | `{o.key}` | {kind(o)} | {default} | {what} |")
    return "\n".join(lines) + "\n"


def given_options(ctx: object) -> dict[str, object]:
    """The `serve` options the user gave on the command line or through click's environment variables, not
    click's defaults: `ctx` is the click.Context (`click.get_current_context()`)."""
    from click.core import ParameterSource

    assert isinstance(ctx, click.Context)
    given = {}
    for name, value in ctx.params.items():
        source = ctx.get_parameter_source(name)
        if name not in _NOT_CONFIG and source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            given[name] = value
    return given


def apply_options(config: BridgeConfig, given: Mapping[str, object]) -> BridgeConfig:
    """`config` with the command line's options laid over it (each one given wins over the file's key). Each
    value becomes its row's file keys and goes through the file's own reader, so it is checked and converted
    as the file's would be. ConfigError ("command line: --option: ...") for a value the file would have
    refused, or for an option the table does not know."""
    unknown = sorted(set(given) - set(CLI_OPTIONS))
    if unknown:
        raise ConfigError(
            [f"command line: --{n.replace('_', '-')}: no configuration key for this option (bridge.cli.config.OPTIONS)"
             for n in unknown]
        )  # fmt: skip
    problems: list[str] = []
    sections: dict[str, dict[str, Any]] = {}
    providers: dict[str, Any] = {}
    pricing: dict[str, Any] = {}
    trunk: dict[str, Any] = {}
    registrars: tuple[str, ...] | None = None
    for name, value in given.items():
        row = CLI_OPTIONS[name]
        if value is None or value == () or value is False:
            continue
        r = _Reader(f"command line: {row.flag}", Path.cwd(), paths=False)
        try:
            doc = dict(row.values(value))
        except ValueError as exc:
            problems.append(f"command line: {row.flag}: {exc}")
            continue
        if not doc:
            continue
        if row.table == "trunks":
            if name == "register":
                for uri in _strs(value):
                    _trunks(r, [{"name": "cli", "registrar": uri}])
                registrars = _strs(value)
            else:
                parsed = _trunks(r, [{"name": "cli", **doc}])[0]
                trunk.update(_set_fields(row, parsed))
        elif row.table == "providers":
            parsed_p = _providers(r, {"openai-realtime": doc})
            if parsed_p:
                providers.update(_set_fields(row, parsed_p[0]))
        elif row.table == "pricing":
            for _, rates in _pricing(r, {ECHO: doc}):
                pricing.update(_set_fields(row, rates))
        else:
            section = _SECTION_READERS[row.table](r, doc)
            sections.setdefault(row.table, {}).update(_set_fields(row, section))
        problems += r.problems
    if problems:
        raise ConfigError(problems)
    out = config
    for section, values in sections.items():
        if section == "recording":
            out = replace(out, recording=Recording(values["dir"]))
        else:
            out = replace(out, **{section: replace(getattr(out, section), **values)})
    out = _apply_providers(out, providers, problems)
    out = _apply_pricing(out, pricing)
    out = _apply_trunks(out, trunk, registrars, problems)
    if problems:
        raise ConfigError(problems)
    return out


def _set_fields(row: Option, parsed: object) -> dict[str, Any]:
    """The schema fields `row`'s key sets, from the dataclass the reader made of the row's keys."""
    if isinstance(parsed, str | type(None)):  # [recording] dir: the reader returns the value itself
        return {"dir": parsed}
    names = row.fields or (row.file_key,)
    return {n: getattr(parsed, n) for n in names}


def _problem(parse: Callable[[str], str]) -> Callable[[str], str | None]:
    """A reader's check from a parser that raises ValueError with the reason."""

    def check(value: str) -> str | None:
        try:
            parse(value)
        except ValueError as exc:
            return str(exc)
        return None

    return check


def _amd_choice(r: _Reader, t: dict[str, object], p: str) -> tuple[AmdAction | None, str | None, str | None]:
    """`amd_machine`, `amd_message` and `amd_message_wav` of [outbound] or an outbound route (None: not given)."""
    machine = r.choice(t, "amd_machine", p, AMD_ACTIONS, None)
    message = r.string(t, "amd_message", p, what="the message's text")
    wav = r.file(t, "amd_message_wav", p)
    if wav is not None and Path(wav).is_file() and (problem := _check_wav(wav)) is not None:
        r.fail(f"{p}.amd_message_wav", problem)
    return next((a for a in AMD_ACTIONS if a == machine), None), message, wav


def _outbound(r: _Reader, t: dict[str, object]) -> Outbound:
    p = "outbound"
    r.keys(t, p, [f.name for f in fields(Outbound)])
    machine, message, wav = _amd_choice(r, t, p)
    attempts, retry_on, delay = _retry_fields(r, t, p)
    d = Outbound()

    def ms(key: str, lo: int, hi: int, default: int) -> int:
        value = r.integer(t, key, p, lo=lo, hi=hi, default=default)
        return default if value is None else value

    return Outbound(
        amd=r.boolean(t, "amd", p, False),
        amd_machine=machine or d.amd_machine,
        amd_message=message,
        amd_message_wav=wav,
        amd_total_ms=ms("amd_total_ms", 1000, 30_000, d.amd_total_ms),
        # a greeting longer than a person's ("yes, hello, who is this?": human_greeting_ms) is a machine's
        amd_machine_greeting_ms=ms("amd_machine_greeting_ms", _AMD.human_greeting_ms + 100, 30_000,
                                   d.amd_machine_greeting_ms),
        amd_beep_wait_ms=ms("amd_beep_wait_ms", 1000, 120_000, d.amd_beep_wait_ms),
        amd_decide_ms=ms("amd_decide_ms", 0, 10_000, d.amd_decide_ms),
        retry_attempts=d.retry_attempts if attempts is None else attempts,
        retry_on=d.retry_on if retry_on is None else retry_on,
        retry_delay_s=d.retry_delay_s if delay is None else delay,
        early_media_to_provider=r.boolean(t, "early_media_to_provider", p, False),
    )  # fmt: skip


def _recording(r: _Reader, t: dict[str, object]) -> str | None:
    return _recording_dir(r, t)


_SECTION_READERS: Mapping[str, Callable[[_Reader, dict[str, object]], Any]] = {
    "listeners": _listeners,
    "engine": _engine,
    "defaults": _defaults,
    "inbound": _inbound,
    "rollover": _rollover,
    "recovery": _recovery,
    "telephony": _telephony,
    "webhook": _webhook,
    "logging": _logging,
    "recording": _recording,
    "drain": _drain,
    "outbound": _outbound,
}


def _strs(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, tuple | list) else (value,)
    return tuple(str(v) for v in items)


def _apply_providers(config: BridgeConfig, values: dict[str, Any], problems: list[str]) -> BridgeConfig:
    """--provider-url / --provider-ca / --provider-append-ms apply to the provider the command line or
    [defaults] chose; --provider-append-ms alone also to the default one (echo, or openai-live when its key
    is set: both take it)."""
    if not values:
        return config
    names = [config.defaults.provider] if config.defaults.provider is not None else []
    if config.defaults.provider in (None, ECHO):
        if not set(values) <= {"append_ms"}:
            problems.append(
                f"command line: --provider-url/--provider-ca: need --provider (or [defaults] provider) "
                f"naming one of {', '.join(KINDS)}"
            )
            return config
        names = names or [ECHO, "openai-live"]
    if "ca" in values and names != ["gemini-live"]:
        problems.append("command line: --provider-ca: applies to --provider gemini-live")
    updated = tuple(replace(config.provider(name), **values) for name in names)
    others = tuple(p for p in config.providers if p.name not in names)
    return replace(config, providers=(*others, *updated))


def _apply_pricing(config: BridgeConfig, values: dict[str, Any]) -> BridgeConfig:
    """--price-* apply to the provider the command line or [defaults] chose (without one: to echo and to
    openai-live, `serve`'s default either way), over the file's rates for it."""
    if not values:
        return config
    names = [config.defaults.provider] if config.defaults.provider is not None else [ECHO, "openai-live"]
    kept = dict(config.pricing)
    for name in names:
        kept[name] = replace(kept.get(name, Pricing()), **values)
    return replace(config, pricing=tuple(kept.items()))


def _apply_trunks(
    config: BridgeConfig, values: dict[str, Any], registrars: tuple[str, ...] | None, problems: list[str]
) -> BridgeConfig:
    """Trunk options on the command line: with no trunk in the file they make one (one per --register); with
    exactly one they override its fields; with several they are refused (say which trunk: edit the file)."""
    if not values and registrars is None:
        return config
    if len(config.trunks) > 1:
        given = sorted({*values, *(["registrar"] if registrars is not None else [])})
        flags = {o.fields[0] if o.fields else o.file_key: o.flag for o in OPTIONS if o.table == "trunks"}
        problems.append(
            "command line: "
            + ", ".join(flags.get(k, k) for k in given)
            + f": the file has {len(config.trunks)} trunks ({', '.join(t.name for t in config.trunks)});"
            " set these in the file, per trunk"
        )
        return config
    base = config.trunks[0] if config.trunks else Trunk(name="cli")
    if registrars is None:
        return replace(config, trunks=(replace(base, **values),))
    if config.trunks and len(registrars) > 1:
        problems.append("command line: --register: given more than once over a file with a trunk")
        return config
    made = tuple(
        replace(base, name=base.name if len(registrars) == 1 else f"{base.name}-{i}", registrar=uri, **values)
        for i, uri in enumerate(registrars)
    )
    return replace(config, trunks=made)
