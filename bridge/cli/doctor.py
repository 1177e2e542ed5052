"""`parlora-bridge doctor`: can `serve` run here, with this configuration? One line per check.

Checks, in order (each line `ok`, `warn` or `FAIL`, the check's name and what was found):

- **config**: the file loads (every problem on its own line, as `config check` prints them);
- **ports**: the SIP address is free for UDP and TCP, the HTTP listener's for TCP, the first RTP port pair for UDP;
- **call limits**: what ends a call (maximum duration, RTP timeout, hold limit: the defaults filled in) and
  session timers, and every key `serve` would refuse to start with (bridge.cli.config.deployment_problems);
- **keys**: every environment variable the configuration needs (provider keys of the default provider and of
  each route's, trunk passwords, the HTTP token, the webhook secret) is set — by name only: a value is never
  printed, and every line is scrubbed of the values of the keys it read, whatever an error message said;
- **provider NAME**: its endpoint resolves (DNS), accepts a TCP connection, completes a TLS handshake (wss://,
  with the configured CA), and — when its key is set — a real session starts: the adapter connects, the
  provider confirms the session (auth accepted), and it is closed at once. The echo provider needs none of it;
- **registrar AOR**: each trunk's registrar answers a SIP OPTIONS over UDP (any response: it is there);
- **engine**: the SIP engine can be loaded, its limits (from `sip.engine.ENGINES`), and the process's open-file
  limit against what `max_calls` calls need, and the media path the native engine runs (rtp.speedups: compiled
  or pure).

The exit status is 1 when any check failed, else 0 (warnings do not fail). Everything here is a shell: sockets
and the adapters, each wait bounded by `timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import ssl
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import click

from bridge.cli.config import (
    CLI_OPTIONS,
    ECHO,
    LIMITING_ENGINES,
    BridgeConfig,
    ConfigError,
    apply_options,
    call_limits,
    click_options,
    deployment_problems,
    environment_problems,
    given_options,
    load,
)
from bridge.server.jsonlog import secret_values
from bridge.server.providers import KINDS, ProviderChoice
from providers.base import ProviderUnavailable, SessionSettings
from rtp.speedups import MEDIA_PATH
from sip.core.uri import parse_uri
from sip.engine import ENGINES, EngineError, load_engine

Status = Literal["ok", "warn", "fail"]
# serve's options doctor takes (as serve spells and applies them)
_AS_SERVE = (
    "sip_addr", "sip_tcp", "tls", "cert", "tls_key", "http_addr", "rtp_port", "rtp_ports", "engine", "max_calls",
    "provider", "provider_url", "provider_ca", "register", "srtp", "max_call_duration", "rtp_timeout",
    "hold_timeout",
)  # fmt: skip
DEFAULT_TIMEOUT_S = 5.0
FDS_PER_CALL = 4  # an RTP and an RTCP socket, the provider's WebSocket, a spare for a recovery's replacement
FDS_BASE = 64  # listeners, the loop, logs

DEFAULT_ENDPOINTS: Mapping[str, str] = {
    "openai-live": "wss://api.openai.com/v1/live/sessions",
    "openai-realtime": "wss://api.openai.com/v1/realtime",
    "xai": "wss://api.x.ai/v1/realtime",
    "gemini-live": "wss://generativelanguage.googleapis.com/",
}


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    status: Status
    detail: str

    def line(self) -> str:
        return f"{'FAIL' if self.status == 'fail' else self.status:<4} {self.check}: {self.detail}"


def scrub(text: str, secret_values: Iterable[str]) -> str:
    for value in secret_values:
        if value:
            text = text.replace(value, "***")
    return text


# --- config, ports, keys, engine (no network) ---------------------------------------------------------------


def check_config(source: str | None, problems: Iterable[str], config: BridgeConfig | None) -> list[Finding]:
    if source is None:
        return [Finding("config", "ok", "no file: the command line's options and the defaults")]
    listed = [Finding("config", "fail", p) for p in problems]
    if listed or config is None:
        return listed
    return [
        Finding("config", "ok", f"{source}: valid ({len(config.routes)} routes, {len(config.trunks)} trunks)")
    ]


def _bind(kind: int, host: str, port: int) -> str | None:
    """None when (host, port) can be bound for `kind` (SOCK_DGRAM / SOCK_STREAM), else why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=kind)
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc}"
    family, _, _, _, address = infos[0]
    with socket.socket(family, kind) as sock:
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's servers do
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def check_ports(config: BridgeConfig) -> list[Finding]:
    lis, engine = config.listeners, config.engine
    wanted: list[tuple[str, int, str, int]] = []  # (what, kind, host, port)
    host, port = lis.sip_udp
    wanted.append(("sip udp", socket.SOCK_DGRAM, host, port))
    if lis.tcp:
        wanted.append(("sip tcp", socket.SOCK_STREAM, host, port))
    if lis.sip_tls is not None:
        wanted.append(("sip tls", socket.SOCK_STREAM, *lis.sip_tls))
    if lis.http is not None:
        wanted.append(("http", socket.SOCK_STREAM, *lis.http))
    rtp_host = host if host not in ("", "0.0.0.0", "::") else "0.0.0.0"
    for p in (engine.rtp_port_low, engine.rtp_port_low + 1):
        wanted.append(("rtp", socket.SOCK_DGRAM, rtp_host, p))
    out = []
    for what, kind, h, p in wanted:
        why = _bind(kind, h, p)
        out.append(Finding(f"port {what}", "ok" if why is None else "fail", f"{h}:{p} {why or 'free'}"))
    return out


def providers_in_use(config: BridgeConfig, environ: Mapping[str, str]) -> list[str]:
    names = [config.default_provider(environ)] + [r.provider for r in config.routes if r.provider]
    return list(dict.fromkeys(names))


def check_keys(config: BridgeConfig, environ: Mapping[str, str]) -> list[Finding]:
    missing = {p.variable: p.path for p in environment_problems(config, environ)}
    out = []
    for name in providers_in_use(config, environ):
        env = config.provider(name).key_env
        if name == ECHO or env is None:
            continue
        out.append(
            Finding(f"key {name}", "fail", f"${env} is not set")
            if env in missing
            else Finding(f"key {name}", "ok", f"${env} is set (not shown)")
        )
    provider_vars = {config.provider(n).key_env for n in providers_in_use(config, environ)}
    for variable, path in missing.items():
        if variable not in provider_vars:
            out.append(Finding(f"secret {path}", "fail", f"${variable} is not set"))
    return out


def check_limits(config: BridgeConfig) -> list[Finding]:
    """The call limits every call gets (bridge.cli.config.call_limits: the defaults filled in) and what the
    configuration asks for that `serve` would refuse (bridge.cli.config.deployment_problems)."""
    out = [Finding("config", "fail", p) for p in deployment_problems(config)]
    limits = call_limits(config)
    unlimited = limits.max_call_duration_s is None and limits.rtp_timeout_s is None
    if config.engine.name not in LIMITING_ENGINES:
        detail = (
            f"{limits.describe()} (the {config.engine.name} engine cannot end calls on the duration or the RTP "
            "timeout)"
        )
        out.append(Finding("call limits", "warn", detail))
    else:
        out.append(Finding("call limits", "warn" if unlimited else "ok", limits.describe()))
    expires = config.telephony.session_expires_s
    out.append(
        Finding(
            "session timers",
            "ok" if expires else "warn",
            f"RFC 4028 {expires} s asked of every caller and offered on calls placed (the bridge refreshes "
            "when the caller cannot)"
            if expires
            else "RFC 4028 off: none asked (a caller's own request is still honoured)",
        )
    )
    return out


# rtp.speedups: which of the native engine's per-packet functions run (either answers the same, bit for bit)
_MEDIA_PATHS = {
    "compiled": "compiled (rtp/_speedups.c)",
    "pure": "pure Python (the extension is not built, or PARLORA_PURE_MEDIA=1)",
}


def check_engine(config: BridgeConfig) -> list[Finding]:
    name = config.engine.name
    spec = ENGINES[name]
    out = []
    try:
        load_engine(name)
    except EngineError as exc:
        hint = f" (pip install 'parlora-bridge[{spec.extra}]')" if spec.extra else ""
        return [Finding(f"engine {name}", "fail", f"{exc}{hint}")]
    calls = config.engine.max_calls or spec.default_max_calls
    if spec.cap is not None and calls > spec.cap:
        out.append(Finding(f"engine {name}", "fail", f"max_calls {calls} above its cap of {spec.cap}"))
    else:
        out.append(Finding(f"engine {name}", "ok", f"{spec.limits}; max_calls {calls}"))
    out.append(Finding("media path", "ok", _MEDIA_PATHS[MEDIA_PATH]))
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError):
        return out
    need = calls * FDS_PER_CALL + FDS_BASE
    if soft != resource.RLIM_INFINITY and soft < need:
        out.append(
            Finding(
                "open files", "fail", f"limit {soft} < {need} for {calls} calls (raise it: ulimit -n {need})"
            )
        )
    else:
        out.append(Finding("open files", "ok", f"limit {soft} (>= {need} for {calls} calls)"))
    return out


# --- the provider's endpoint ---------------------------------------------------------------------------------


async def check_provider(
    name: str, config: BridgeConfig, environ: Mapping[str, str], timeout_s: float
) -> list[Finding]:
    check = f"provider {name}"
    if name == ECHO and config.provider(ECHO).url is None:
        return [Finding(check, "ok", "echo: the embedded fake on loopback (no network, no key)")]
    pc = config.provider(name)
    kind = KINDS["openai-live" if name == ECHO else name]
    url = pc.url or DEFAULT_ENDPOINTS[kind.name]
    parts = urlsplit(url)
    host, tls = parts.hostname or "", parts.scheme == "wss"
    port = parts.port or (443 if tls else 80)
    out = []
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError) as exc:
        return [Finding(f"{check} dns", "fail", f"{host}: {exc or 'timed out'}")]
    addresses = sorted({str(i[4][0]) for i in infos})
    out.append(Finding(f"{check} dns", "ok", f"{host} -> {', '.join(addresses)}"))
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
        writer.close()
    except (OSError, TimeoutError) as exc:
        return [*out, Finding(f"{check} tcp", "fail", f"{host}:{port}: {exc or 'timed out'}")]
    out.append(Finding(f"{check} tcp", "ok", f"{host}:{port} accepts connections"))
    context: ssl.SSLContext | None = None
    if tls:
        context = ssl.create_default_context(cafile=pc.ca) if pc.ca else ssl.create_default_context()
        try:
            async with asyncio.timeout(timeout_s):
                _, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=host)
            tls_object = writer.get_extra_info("ssl_object")
            version = tls_object.version() if tls_object is not None else "?"
            writer.close()
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            return [*out, Finding(f"{check} tls", "fail", f"{host}:{port}: {exc or 'timed out'}")]
        out.append(Finding(f"{check} tls", "ok", f"{version}, certificate verified for {host}"))
    key = environ.get(pc.key_env, "") if pc.key_env else ""
    if name == ECHO:
        key = "echo-local"
    if not key:
        out.append(Finding(f"{check} auth", "warn", f"not tried: ${pc.key_env} is not set"))
        return out
    extra = (("ssl_context", context),) if context is not None and pc.ca else ()
    adapter = ProviderChoice(kind, key, pc.url, SessionSettings(), None, extra).connect(token=1)
    try:
        async with asyncio.timeout(timeout_s):
            started = await adapter.connect()
    except (ProviderUnavailable, OSError, TimeoutError) as exc:
        detail = scrub(str(exc) or "no session within the timeout", [key])
        out.append(Finding(f"{check} auth", "fail", f"no session: {detail}"))
    else:
        out.append(
            Finding(
                f"{check} auth",
                "ok",
                f"key accepted, session {started.session_id} started"
                if started.session_id
                else "key accepted, session started",
            )
        )
    finally:
        with contextlib.suppress(Exception):
            await adapter.close(timeout=min(timeout_s, 2.0))
    return out


# --- the registrar ---------------------------------------------------------------------------------------------


class _FirstReply(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        if data.startswith(b"SIP/2.0 ") and not self.reply.done():
            self.reply.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.reply.done():
            self.reply.set_exception(exc)


def options_request(target: str, local: tuple[str, int], tag: str) -> bytes:
    host, port = local
    return (
        f"OPTIONS {target} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bK-doctor-{tag};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:doctor@{host}>;tag={tag}\r\n"
        f"To: <{target}>\r\n"
        f"Call-ID: doctor-{tag}@{host}\r\n"
        "CSeq: 1 OPTIONS\r\n"
        "User-Agent: parlora-bridge doctor\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


async def check_registrar(aor: str, timeout_s: float) -> Finding:
    """An OPTIONS to the registrar of `aor` over UDP (retransmitted as RFC 3261 timer E would, bounded)."""
    check = f"registrar {aor}"
    try:
        uri = parse_uri(aor)
    except ValueError as exc:
        return Finding(check, "fail", f"not a SIP URI: {exc}")
    port = uri.port or 5060
    target = f"sip:{uri.host}:{port}"
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(uri.host.strip("[]"), port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        return Finding(check, "fail", f"{uri.host}: {exc}")
    family, _, _, _, address = infos[0]
    transport, protocol = await loop.create_datagram_endpoint(_FirstReply, family=family)
    try:
        local = transport.get_extra_info("sockname")
        request = options_request(target, (str(local[0]), int(local[1])), secrets.token_hex(6))
        interval, deadline = 0.5, loop.time() + timeout_s
        while True:
            transport.sendto(request, address)
            wait = min(interval, deadline - loop.time())
            if wait <= 0:
                return Finding(check, "fail", f"no answer to OPTIONS from {target} within {timeout_s:g} s")
            try:
                reply = await asyncio.wait_for(asyncio.shield(protocol.reply), wait)
            except TimeoutError:
                interval = min(interval * 2, 4.0)
                continue
            except OSError as exc:
                return Finding(check, "fail", f"{target}: {exc.strerror or exc}")
            status = reply.split(b"\r\n", 1)[0].decode("utf-8", "replace")[len("SIP/2.0 ") :]
            level: Status = "warn" if status.startswith("5") else "ok"
            return Finding(check, level, f"{target} answered OPTIONS: {status}")
    finally:
        transport.close()


# --- all of it -------------------------------------------------------------------------------------------------


async def run_checks(
    config: BridgeConfig,
    environ: Mapping[str, str] | None = None,
    *,
    problems: Iterable[str] = (),
    loaded: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Finding]:
    """Every check for `config` (`problems`: the file's, when it did not load; then only they are reported)."""
    env = os.environ if environ is None else environ
    findings = check_config(config.source, problems, config if loaded else None)
    if not loaded:
        return findings
    findings += check_ports(config)
    findings += check_limits(config)
    findings += check_keys(config, env)
    for name in providers_in_use(config, env):
        findings += await check_provider(name, config, env, timeout_s)
    for trunk in config.trunks:
        if trunk.registrar is not None:
            findings.append(await check_registrar(trunk.registrar, timeout_s))
    findings += check_engine(config)
    return findings


def report(findings: Iterable[Finding], secret_values: Iterable[str]) -> tuple[list[str], int]:
    """The lines to print (scrubbed of every secret value) and the exit status."""
    values = [v for v in secret_values if len(v) >= 4]
    found = list(findings)
    lines = [scrub(f.line(), values) for f in found]
    return lines, 1 if any(f.status == "fail" for f in found) else 0


# --- the command -------------------------------------------------------------------------------------------------


@click.command("doctor")
@click.option(
    "--config", "config_path", default=None, metavar="FILE", help="The configuration `serve` would use."
)
@click_options(
    _AS_SERVE
)  # the rows of serve's options table (bridge.cli.config.OPTIONS): same flags and keys
@click.option(
    "--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT_S, show_default=True
)
def doctor_command(config_path: str | None, timeout_s: float, **_: object) -> None:
    """Check that `serve` can run here: ports, keys (by name), provider reachable, registrar, config, engine.

    One line per check; exit status 1 when any check failed. Options as `serve`'s override the file."""
    ctx = click.get_current_context()
    given = {k: v for k, v in given_options(ctx).items() if k in CLI_OPTIONS}
    problems: list[str] = []
    config = BridgeConfig(source=config_path)
    try:
        config = apply_options(load(config_path) if config_path else BridgeConfig(), given)
    except ConfigError as exc:
        problems = list(exc.problems)
    findings = asyncio.run(
        run_checks(config, os.environ, problems=problems, loaded=not problems, timeout_s=timeout_s)
    )
    lines, status = report(findings, secret_values(os.environ))
    for line in lines:
        click.echo(line)
    sys.exit(status)
