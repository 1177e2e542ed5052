"""`serve --config bridge.toml`: the typed configuration file, its checks, route selection and CLI overrides.

The file (read with `tomllib`) has these sections; every key is optional unless marked, and deploy/example.toml
shows each one with a comment:

    [listeners]   sip_udp, sip_tcp, sip_tls ("HOST:PORT"), tls_cert, tls_key, tls_ca, http, http_token_env,
                  webrtc_address, stun ("stun:HOST[:PORT]")
    [engine]      name (native | pjsua2), max_calls, rtp_ports ("LOW-HIGH", or the first port as a number)
    [defaults]    provider, instructions | instructions_file, greeting, language, voice, turn_detection
    [providers.NAME]  (NAME one of openai-live, openai-realtime, gemini-live, xai) key_env, model, voice, url, ca
    [[trunks]]    name*, registrar, auth_user, password_env, register_expires_s, register_keepalive_s,
                  allow (CIDRs), inbound_auth_user, inbound_password_env, transport, srtp, external_address, nat,
                  rtp_source (learn | strict)
    [inbound]     drop_unknown, allow_any, invite_rate_per_s, options_rate_per_s, blocked_user_agents,
                  server_header, realm
    [[routes]]    name*, direction (inbound | outbound), number | pattern, header = {name, value}, provider,
                  instructions | instructions_file, tools = [{name, description, parameters}], greeting,
                  language, voice
    [rollover]    enabled, session_cap_ms, after_ms, deadline_ms, hard_stop_ms, overlap_ms
    [recovery]    reservoir_bytes, residence_ms, failure_message (a WAV, 8 kHz mono 16-bit)
    [telephony]   end_call_tool, send_dtmf_tool, dtmf_to_model, transfer_targets = {NAME = "sip:URI"},
                  max_call_duration_s, rtp_timeout_s
    [webhook]     url, timeout_s, ca              (the signing secret is always in $PARLORA_WEBHOOK_SECRET)
    [logging]     level, format (text | json), cdr (a file: one JSON line per finished call)
    [recording]   dir (a stereo WAV per call)
    [drain]       timeout_s

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
it must be the last route without a header, or the routes after it could never match). `number` is compared
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

Command-line options: every `serve` option stays and overrides the file. `given_options(ctx)` picks the
options the user actually gave (not click's defaults) and `apply_options(config, given)` lays them over the
loaded file, so `serve` does `apply_options(load(path) if path else BridgeConfig(), given_options(ctx))`.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import tomllib
import wave
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from bridge.console import parse_stun_url, parse_webrtc_address
from bridge.providers import KINDS
from bridge.rollover import RolloverOptions
from bridge.telephony import TelephonyOptions
from bridge.webhook import SECRET_ENV
from providers.base import ToolSpec
from providers.limits import LimitOverrides
from rtp.latch import SOURCE_POLICIES, SourcePolicy
from sip.engine import DEFAULT_ENGINE, ENGINES

ECHO = "echo"
PROVIDER_NAMES: tuple[str, ...] = (*KINDS, ECHO)
TELEPHONY_TOOLS = frozenset({"end_call", "transfer_call", "send_dtmf"})
DEFAULT_SIP_PASSWORD_ENV = "PARLORA_SIP_PASSWORD"  # issue 14's name for the registration password
DEFAULT_INBOUND_PASSWORD_ENV = "PARLORA_INBOUND_PASSWORD"  # as `serve --inbound-auth` (bridge/cli.py)
DEFAULT_BLOCKED_USER_AGENTS = ("friendly-scanner", "sipvicious", "sipcli", "sip-scan", "VaxSIPUserAgent")

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
    sip_tcp: Address | None = None
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
    append_ms: int = 20  # caller audio per append to the provider (20, 40, 60, 80 or 100)


@dataclass(frozen=True, slots=True)
class Defaults:
    """What a call gets where its route says nothing (and every call when there are no routes)."""

    provider: str | None = None  # None: openai-live when $OPENAI_API_KEY is set, else echo (as `serve`)
    instructions: str | None = None  # the text, read from instructions_file when that was given
    greeting: str | None = None
    language: str | None = None
    voice: str | None = None
    turn_detection: TurnDetection = "server"


@dataclass(frozen=True, slots=True)
class Trunk:
    name: str
    registrar: str | None = None  # sip:USER@HOST[:PORT] to register to
    auth_user: str | None = None
    password_env: str = DEFAULT_SIP_PASSWORD_ENV
    register_expires_s: int = 3600
    register_keepalive_s: float = 30.0  # OPTIONS to the registrar this often while registered (issue 14)
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
    provider: str | None = None  # None: [defaults] provider
    instructions: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    greeting: str | None = None
    language: str | None = None
    voice: str | None = None
    _regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def matches(self, called: str, headers: Sequence[tuple[str, str]]) -> bool:
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
        return True

    @property
    def catch_all(self) -> bool:
        return self.number is None and self.pattern is None and self.header is None


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
    transfer_targets: tuple[tuple[str, str], ...] = ()  # (name the model uses, SIP URI)
    max_call_duration_s: int | None = None
    rtp_timeout_s: int | None = None
    hold_timeout_s: float = 7200  # 0: no hold limit
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
    timeout_s: float = 300.0  # bridge.ops.DEFAULT_DRAIN_S, `serve --drain-timeout`'s default


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
) -> Route | None:
    """The first route (file order) of `direction` matching the called (for an outbound call: the dialled)
    number and SIP headers; None when none does. A route of the other direction never matches."""
    for route in routes:
        if route.direction == direction and route.matches(called, headers):
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

    def __init__(self, label: str, base: Path) -> None:
        self.label = label
        self.base = base
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{self.label}: {path}: {message}")

    def expect(self, path: str, expected: str, value: object) -> None:
        self.fail(path, f"expected {expected}; got {_describe(value)}")

    def keys(self, table: Mapping[str, object], path: str, allowed: Sequence[str]) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                self.fail(_join(path, key), f"unknown key{hint}; expected one of {', '.join(allowed)}")

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
        self, t: Mapping[str, object], key: str, path: str, *, lo: float, default: float | None
    ) -> float | None:
        def check(v: float) -> str | None:
            return None if v > lo else f"expected a number > {lo:g}; got {v:g}"

        return self.get(t, key, path, float, f"a number > {lo:g}", default, check)

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
    )
    _cross_checks(r, config)
    if r.problems:
        raise ConfigError(r.problems)
    return config


def _listeners(r: _Reader, t: dict[str, object]) -> Listeners:
    p = "listeners"
    r.keys(t, p, [f.name for f in fields(Listeners)])
    udp = r.address(t, "sip_udp", p, 5060, ("127.0.0.1", 5060))
    assert udp is not None
    out = Listeners(
        sip_udp=udp,
        sip_tcp=r.address(t, "sip_tcp", p, 5060),
        sip_tls=r.address(t, "sip_tls", p, 5061),
        tls_cert=r.file(t, "tls_cert", p),
        tls_key=r.file(t, "tls_key", p),
        tls_ca=r.file(t, "tls_ca", p),
        http=r.address(t, "http", p, 8080),
        http_token_env=r.env_name(t, "http_token_env", p, None),
        webrtc_address=r.get(
            t, "webrtc_address", p, str, "an IP address", None, _problem(parse_webrtc_address)
        ),
        stun=r.get(t, "stun", p, str, "stun:HOST[:PORT]", None, _problem(parse_stun_url)),
    )
    if "sip_tls" in t and ("tls_cert" not in t or "tls_key" not in t):
        r.fail(f"{p}.sip_tls", "needs listeners.tls_cert and listeners.tls_key")
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
        ["provider", "instructions", "instructions_file", "greeting", "language", "voice", "turn_detection"],
    )
    turns = r.choice(t, "turn_detection", p, ["server", "client"], "server")
    return Defaults(
        provider=r.choice(t, "provider", p, PROVIDER_NAMES, None),
        instructions=r.instructions(t, p),
        greeting=r.string(t, "greeting", p),
        language=r.string(t, "language", p, regex=_LANGUAGE, what='a language tag like "en" or "de-DE"'),
        voice=r.string(t, "voice", p),
        turn_detection="client" if turns == "client" else "server",
    )


def _providers(r: _Reader, t: dict[str, object]) -> tuple[ProviderConfig, ...]:
    out = []
    for name, section in t.items():
        p = f"providers.{name}"
        if name not in KINDS:
            hint = " (echo needs no section)" if name == ECHO else ""
            r.fail(
                p,
                f"expected a provider section named one of {', '.join(KINDS)}{hint}; got {json.dumps(name)}",
            )
            continue
        if not isinstance(section, dict):
            r.expect(p, "a table", section)
            continue
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
                append_ms=_append_ms(r, section.get("append_ms", 20), f"{p}.append_ms"),
            )
        )
    return tuple(out)


def _append_ms(r: _Reader, value: object, path: str) -> int:
    if isinstance(value, bool) or value not in (20, 40, 60, 80, 100):
        r.fail(path, f"expected one of 20, 40, 60, 80, 100; got {json.dumps(value)}")
        return 20
    return int(value)


def _cidr(r: _Reader, path: str, value: str) -> str | None:
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as exc:
        r.fail(
            path, f"expected a network like 192.0.2.0/24 or 2001:db8::/32; got {json.dumps(value)} ({exc})"
        )
        return None


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
            register_keepalive_s=r.number(t, "register_keepalive_s", p, lo=0.0, default=30.0) or 30.0,
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
        invite_rate_per_s=r.number(t, "invite_rate_per_s", p, lo=0.0, default=None),
        options_rate_per_s=r.number(t, "options_rate_per_s", p, lo=0.0, default=None),
        blocked_user_agents=r.string_list(t, "blocked_user_agents", p, DEFAULT_BLOCKED_USER_AGENTS),
        server_header=r.string(t, "server_header", p, regex=HEADER_TEXT, what="printable ASCII, 1-128 chars"),
        realm=r.string(t, "realm", p, regex=HEADER_TEXT, what="printable ASCII, 1-128 chars"),
    )


_ROUTE_KEYS = [
    "name",
    "direction",
    "number",
    "pattern",
    "header",
    "provider",
    "instructions",
    "instructions_file",
    "tools",
    "greeting",
    "language",
    "voice",
]


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
        route = Route(
            name=name or f"route-{i}",
            direction="outbound" if direction == "outbound" else "inbound",
            number=number,
            pattern=pattern,
            header=header,
            provider=r.choice(t, "provider", p, PROVIDER_NAMES, None),
            instructions=r.instructions(t, p),
            tools=_tools(r, t, p),
            greeting=r.string(t, "greeting", p),
            language=r.string(t, "language", p, regex=_LANGUAGE, what='a language tag like "en" or "de-DE"'),
            voice=r.string(t, "voice", p),
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
        session_cap_ms=r.integer(t, "session_cap_ms", p, lo=60_000),
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
        transfer_targets=tuple(targets),
        max_call_duration_s=r.integer(t, "max_call_duration_s", p, lo=1),
        rtp_timeout_s=r.integer(t, "rtp_timeout_s", p, lo=1),
        hold_timeout_s=r.integer(t, "hold_timeout_s", p, lo=0, default=7200) or 0,
        session_expires_s=_session_expires(r, t, p),
    )


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
    ca = r.file(t, "ca", p)
    if ca is not None and (url is None or not url.startswith("https://")):
        r.fail(f"{p}.ca", "applies to an https:// url")
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
    return Drain(timeout_s=r.number(t, "timeout_s", "drain", lo=0.0, default=300.0) or 300.0)


def _cross_checks(r: _Reader, c: BridgeConfig) -> None:
    """What no single key can say: turn detection against the providers that can do it, rollover ages."""
    if c.defaults.turn_detection == "client":
        used = {c.defaults.provider or "openai-live", *(rt.provider for rt in c.routes if rt.provider)}
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


# --- command-line overrides --------------------------------------------------------------------------------------

# `serve`'s click parameter names → what they set. Options of issues 14 and 15 that `serve` does not have yet
# are listed under the names their wiring should give them; an unknown name is an error, so a rename shows.
CLI_OPTIONS: Mapping[str, str] = {
    "sip_addr": "listeners.sip_udp",
    "sip_tcp": "listeners.sip_tcp",
    "tls": "listeners.sip_tls",
    "cert": "listeners.tls_cert",
    "tls_key": "listeners.tls_key",
    "tls_ca": "listeners.tls_ca",
    "http_addr": "listeners.http",
    "http_token_env": "listeners.http_token_env",
    "webrtc_address": "listeners.webrtc_address",
    "stun": "listeners.stun",
    "engine": "engine.name",
    "max_calls": "engine.max_calls",
    "rtp_port": "engine.rtp_port_low",
    "rtp_ports": "engine.rtp_ports",
    "provider": "defaults.provider",
    "instructions": "defaults.instructions",
    "turn_detection": "defaults.turn_detection",
    "provider_url": "providers.<provider>.url",
    "provider_ca": "providers.<provider>.ca",
    "provider_append_ms": "providers.<provider>.append_ms",
    "register": "trunks[].registrar",
    "auth_user": "trunks[].auth_user",
    "keepalive": "trunks[].register_keepalive_s",
    "allow": "trunks[].allow",
    "inbound_auth": "trunks[].inbound_auth_user",
    "srtp": "trunks[].srtp",
    "external_address": "trunks[].external_address",
    "nat": "trunks[].nat",
    "rtp_source": "trunks[].rtp_source",
    "invite_rate": "inbound.invite_rate_per_s",
    "options_rate": "inbound.options_rate_per_s",
    "drop_unknown": "inbound.drop_unknown",
    "server_header": "inbound.server_header",
    "realm": "inbound.realm",
    "allow_any": "inbound.allow_any",
    "session_cap_ms": "rollover.session_cap_ms",
    "rollover_after_ms": "rollover.after_ms",
    "rollover_deadline_ms": "rollover.deadline_ms",
    "rollover_hard_stop_ms": "rollover.hard_stop_ms",
    "rollover_overlap_ms": "rollover.overlap_ms",
    "no_rollover": "rollover.enabled",
    "reservoir_bytes": "recovery.reservoir_bytes",
    "residence_ms": "recovery.residence_ms",
    "failure_message": "recovery.failure_message",
    "end_call_tool": "telephony.end_call_tool",
    "send_dtmf_tool": "telephony.send_dtmf_tool",
    "dtmf_to_model": "telephony.dtmf_to_model",
    "transfer_targets": "telephony.transfer_targets",
    "max_call_duration": "telephony.max_call_duration_s",
    "rtp_timeout": "telephony.rtp_timeout_s",
    "hold_timeout": "telephony.hold_timeout_s",
    "session_expires": "telephony.session_expires_s",
    "webhook_url": "webhook.url",
    "webhook_timeout": "webhook.timeout_s",
    "webhook_ca": "webhook.ca",
    "log_level": "logging.level",
    "log_format": "logging.format",
    "cdr": "logging.cdr",
    "record": "recording.dir",
    "drain_timeout": "drain.timeout_s",
}
_NOT_CONFIG = frozenset({"config"})  # `serve --config FILE` itself


def given_options(ctx: object) -> dict[str, object]:
    """The `serve` options the user gave on the command line or through click's environment variables, not
    click's defaults: `ctx` is the click.Context (`click.get_current_context()`)."""
    import click
    from click.core import ParameterSource

    assert isinstance(ctx, click.Context)
    given = {}
    for name, value in ctx.params.items():
        source = ctx.get_parameter_source(name)
        if name not in _NOT_CONFIG and source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            given[name] = value
    return given


def apply_options(config: BridgeConfig, given: Mapping[str, object]) -> BridgeConfig:
    """`config` with the command line's options laid over it (each one given wins over the file). Values
    arrive as click parsed them. ConfigError ("command line: --option: ...") for a value the file would have
    refused, or for an option this function does not know."""
    problems: list[str] = []
    unknown = sorted(set(given) - set(CLI_OPTIONS))
    if unknown:
        raise ConfigError(
            [
                f"command line: {_flag(n)}: no configuration key for this option (bridge.config.CLI_OPTIONS)"
                for n in unknown
            ]
        )
    sections: dict[str, dict[str, Any]] = {}

    def put(section: str, key: str, value: object) -> None:
        sections.setdefault(section, {})[key] = value

    for name, value in given.items():
        if value is None or value == ():
            continue
        try:
            _apply_one(name, value, put)
        except ValueError as exc:
            problems.append(f"command line: {_flag(name)}: {exc}")
    if problems:
        raise ConfigError(problems)
    out = config
    for section, values in sections.items():
        if section in ("providers", "trunks"):
            continue
        out = replace(out, **{section: replace(getattr(out, section), **values)})
    out = _apply_providers(out, sections.get("providers", {}), problems)
    out = _apply_trunks(out, sections.get("trunks", {}), problems)
    if problems:
        raise ConfigError(problems)
    return out


def _flag(name: str) -> str:
    return {
        "sip_addr": "--sip",
        "http_addr": "--http",
        "webhook_url": "--webhook",
        "transfer_targets": "--transfer-target",
        "tls_key": "--key",
    }.get(name, "--" + name.replace("_", "-"))


def _problem(parse: Callable[[str], str]) -> Callable[[str], str | None]:
    """A reader's check from a parser that raises ValueError with the reason."""

    def check(value: str) -> str | None:
        try:
            parse(value)
        except ValueError as exc:
            return str(exc)
        return None

    return check


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string; got {_describe(value)}")
    return value


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected an integer; got {_describe(value)}")
    return value


def _strs(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, tuple | list) else (value,)
    return tuple(_str(v) for v in items)


def _apply_one(name: str, value: object, put: Callable[[str, str, object], None]) -> None:
    target = CLI_OPTIONS[name].split(".")
    section, key = target[0].removesuffix("[]"), target[-1]
    if name in ("sip_addr", "sip_tcp", "tls", "http_addr"):
        put(section, key, parse_address(_str(value), {"tls": 5061, "http_addr": 8080}.get(name, 5060)))
    elif name == "rtp_port":
        low, _ = parse_port_range(_int(value))
        put("engine", "rtp_port_low", low)
    elif name == "rtp_ports":
        low, high = parse_port_range(_str(value))
        put("engine", "rtp_port_low", low)
        put("engine", "rtp_port_high", high)
    elif name == "session_expires":
        if 0 < _int(value) < 90:
            raise ValueError(f"expected 0 or an integer >= 90 (RFC 4028 Min-SE); got {_describe(value)}")
        put(section, key, value)
    elif name == "engine":
        if _str(value) not in ENGINES:
            raise ValueError(f"expected one of {', '.join(ENGINES)}; got {_describe(value)}")
        put(section, key, value)
    elif name == "provider":
        if _str(value) not in PROVIDER_NAMES:
            raise ValueError(f"expected one of {', '.join(PROVIDER_NAMES)}; got {_describe(value)}")
        put(section, key, value)
    elif name == "http_token_env":
        if not _ENV_NAME.fullmatch(_str(value)):
            raise ValueError("expected the NAME of an environment variable; the value is not shown")
        put(section, key, value)
    elif name == "webrtc_address":
        put(section, key, parse_webrtc_address(_str(value)))
    elif name == "stun":
        put(section, key, parse_stun_url(_str(value)))
    elif name == "no_rollover":
        if value is True:
            put("rollover", "enabled", False)
    elif name == "transfer_targets":
        put(section, key, tuple(parse_transfer_target(s) for s in _strs(value)))
    elif name == "failure_message":
        problem = _check_wav(_str(value))
        if problem is not None:
            raise ValueError(problem)
        put(section, key, value)
    elif name in ("register", "allow"):
        items = _strs(value)
        if name == "allow":
            for v in items:
                ipaddress.ip_network(v, strict=True)
        else:
            for v in items:
                problem = _check_sip_uri(v)
                if problem:
                    raise ValueError(problem)
        put("trunks", key, items)
    elif name in ("server_header", "realm"):
        if not HEADER_TEXT.fullmatch(_str(value)):
            raise ValueError(f"expected printable ASCII, 1-128 chars; got {_describe(value)}")
        put(section, key, value)
    elif name == "external_address":
        ipaddress.ip_address(_str(value))
        put("trunks", key, value)
    elif section in ("providers", "trunks"):
        put(section, key, value)
    else:
        put(section, key, value)


def _apply_providers(config: BridgeConfig, values: dict[str, Any], problems: list[str]) -> BridgeConfig:
    """--provider-url / --provider-ca apply to the provider the command line or [defaults] chose."""
    if not values:
        return config
    name = config.defaults.provider
    if name is None or name == ECHO:
        problems.append(
            f"command line: --provider-url/--provider-ca: need --provider (or [defaults] provider) "
            f"naming one of {', '.join(KINDS)}"
        )
        return config
    current = config.provider(name)
    updated = replace(current, **values)
    if updated.ca is not None and name != "gemini-live" and "ca" in values:
        problems.append("command line: --provider-ca: applies to --provider gemini-live")
    others = tuple(p for p in config.providers if p.name != name)
    return replace(config, providers=(*others, updated))


def _apply_trunks(config: BridgeConfig, values: dict[str, Any], problems: list[str]) -> BridgeConfig:
    """Trunk options on the command line: with no trunk in the file they make one (one per --register); with
    exactly one they override its fields; with several they are refused (say which trunk: edit the file)."""
    if not values:
        return config
    if len(config.trunks) > 1:
        problems.append(
            "command line: "
            + ", ".join(_flag(k) for k in sorted(values))
            + f": the file has {len(config.trunks)} trunks ({', '.join(t.name for t in config.trunks)});"
            " set these in the file, per trunk"
        )
        return config
    base = config.trunks[0] if config.trunks else Trunk(name="cli")
    registrars = values.pop("registrar", None)
    fields_: dict[str, Any] = dict(values)
    if "srtp" in fields_ and fields_["srtp"] != "off" and base.transport != "tls":
        fields_["transport"] = "tls"
    if registrars is None:
        return replace(config, trunks=(replace(base, **fields_),))
    assert isinstance(registrars, tuple)
    if config.trunks and len(registrars) > 1:
        problems.append("command line: --register: given more than once over a file with a trunk")
        return config
    made = tuple(
        replace(
            base, name=base.name if len(registrars) == 1 else f"{base.name}-{i}", registrar=uri, **fields_
        )
        for i, uri in enumerate(registrars)
    )
    return replace(config, trunks=made)
