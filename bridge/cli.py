"""The `parlora-bridge` command: `serve` answers calls; `fake-provider` runs a provider fake on its own."""

from __future__ import annotations

import asyncio
import copy
import faulthandler
import functools
import logging
import os
import signal
import ssl
import sys
import tempfile
import wave
from collections.abc import Callable, Coroutine, Mapping
from importlib import import_module
from typing import Any, Literal, NoReturn, TypeVar

import click

from bridge.api import ECHO_LOCAL_KEY, Application, LiveCall, Server, ServerConfig, outbound_outcome
from bridge.config import HEADER_TEXT
from bridge.console import parse_stun_url, parse_webrtc_address
from bridge.delegations import JobRequest
from bridge.doctor import doctor_command
from bridge.heap import HeapTrim, freeze_start_up_heap, malloc_trim, tune_malloc
from bridge.jsonlog import use_json_logs
from bridge.ops import DEFAULT_DRAIN_S, call_server, config_group, serve_file
from bridge.providers import KINDS, MissingKey, api_key
from bridge.records import CallEnded, CallRecord, CallStarted, UncertainWork, Utterance
from bridge.rollover import RolloverOptions
from bridge.telephony import TelephonyOptions
from bridge.webhook import SECRET_ENV, WebhookClient, WebhookConfig, webhook_handler
from providers.batching import APPEND_MS_CHOICES, DEFAULT_APPEND_MS
from providers.fakes.faults import Fault, parse_fault
from providers.fakes.script import Script, load_script
from providers.limits import LimitOverrides
from rtp.latch import SOURCE_POLICIES
from sip.engine import DEFAULT_ENGINE, ENGINES, EngineError
from sip.policy import parse_networks
from sip.uri import parse_uri

log = logging.getLogger("parlora")


def _host_port(value: str, default_port: int) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        return value, default_port
    if not port.isdigit() or not host:
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _checked(parse: Callable[[str], str], value: str | None) -> str | None:
    """A click callback's check: `parse`'s ValueError is a usage error naming the option."""
    try:
        return None if value is None else parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _http_token(http_addr: str | None, env_name: str | None) -> str | None:
    """The HTTP listener's bearer token: from `env_name`; a listener off loopback must have one."""
    token = os.environ.get(env_name) if env_name else None
    if env_name and not token:
        raise click.UsageError(f"--http-token-env {env_name}: that variable is not set or empty")
    host = _host_port(http_addr, 8080)[0] if http_addr else "127.0.0.1"
    if token is None and host not in ("127.0.0.1", "::1", "localhost"):
        raise click.UsageError(f"--http {http_addr} is off loopback: give --http-token-env NAME")
    return token


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # websockets logs request headers at DEBUG, Authorization included: keep API keys out of every log.
    logging.getLogger("websockets").setLevel(max(logging.INFO, logging.getLogger().level))


INBOUND_PASSWORD_ENV = "PARLORA_INBOUND_PASSWORD"  # issue 14: --inbound-auth's password
SIP_PASSWORD_ENV = "PARLORA_SIP_PASSWORD"  # issue 14: --register's digest password


@click.group()
@click.version_option(package_name="parlora-bridge")
def main() -> None:
    """parlora-bridge: phone calls to realtime speech-to-speech AI."""


_PROVIDERS = ["echo", *KINDS]
_FAKES = {  # protocol: (module, options class module, options class)
    "openai-live": ("providers.fakes.openai_live", "providers.fakes.openai_live", "LiveFakeOptions"),
    "openai-realtime": (
        "providers.fakes.openai_realtime",
        "providers.fakes.realtime_family",
        "RealtimeFakeOptions",
    ),
    "gemini-live": ("providers.fakes.gemini_live", "providers.fakes.gemini_live", "GeminiFakeOptions"),
    "xai": ("providers.fakes.xai", "providers.fakes.realtime_family", "RealtimeFakeOptions"),
}


@main.command()
@click.option(
    "--sip", "sip_addr", default="127.0.0.1:5060", show_default=True, help="UDP address to answer SIP on."
)
@click.option(
    "--rtp-port", default=4000, show_default=True, help="First local RTP port (each call takes a pair)."
)
@click.option(
    "--provider",
    type=click.Choice(_PROVIDERS),
    default=None,
    help="Realtime provider. Default: openai-live when OPENAI_API_KEY is set, else echo (a local GPT-Live fake "
    "that speaks each caller utterance back).",
)
@click.option("--provider-url", default=None, help="WebSocket URL of the provider (e.g. a fake-provider).")
@click.option(
    "--provider-ca",
    default=None,
    help="CA certificate(s) to trust for a wss:// provider URL (e.g. the "
    "Gemini fake's self-signed certificate).",
)
@click.option("--instructions", default=None, help="Instructions for the model.")
@click.option(
    "--engine",
    type=click.Choice(list(ENGINES)),
    default=DEFAULT_ENGINE,
    show_default=True,
    help="SIP engine. "
    + "; ".join(
        f"{name}: {spec.limits}" + (f" (needs parlora-bridge[{spec.extra}])" if spec.extra else "")
        for name, spec in ENGINES.items()
    )
    + ".",
)
@click.option(
    "--max-calls",
    type=click.IntRange(min=1),
    default=None,
    help="Concurrent calls; beyond them an INVITE is refused. Default: the engine's own ("
    + ", ".join(f"{name} {spec.default_max_calls}" for name, spec in ENGINES.items())
    + ").",
)
@click.option(
    "--http",
    "http_addr",
    default=None,
    help="HOST:PORT for the JSON status endpoint (GET /calls), "
    "the console at / and the browser channel (POST /talk).",
)
@click.option(
    "--http-token-env",
    default=None,
    metavar="NAME",
    help="Environment variable holding the bearer "
    "token the HTTP listener requires (needed when --http is not on loopback).",
)
@click.option(
    "--webrtc-address",
    default=None,
    metavar="ADDR",
    callback=lambda ctx, param, value: _checked(parse_webrtc_address, value),
    help="The Talk button's WebRTC (ICE) address: an address of this host the browser can reach. "
    "Default: the --http address (every interface address when it is 0.0.0.0 or ::).",
)
@click.option(
    "--stun",
    default=None,
    metavar="URL",
    callback=lambda ctx, param, value: _checked(parse_stun_url, value),
    help="A STUN server (stun:HOST[:PORT]) for the Talk button, the bridge's and the page's, for a browser "
    "behind NAT. Default: none (ICE sends nothing but to the browser).",
)
@click.option(
    "--reservoir-bytes",
    type=int,
    default=None,
    help="Reservoir capacity in bytes of the provider's output format (default: the provider's own).",
)
@click.option(
    "--residence-ms", type=int, default=None, help="Reservoir residence deadline (default: the provider's)."
)
@click.option(
    "--failure-message",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="WAV (8 kHz mono 16-bit) the caller hears when a session fails, before the BYE "
    "(default: three short beeps).",
)
# --- DL4: the application's HTTP webhook (bridge/webhook.py has the contract) ---
@click.option(
    "--webhook",
    "webhook_url",
    default=None,
    metavar="URL",
    help="POST each tool call / delegation to this http(s) URL and give its answer to the model. "
    f"Requests are signed with the shared secret in the environment variable {SECRET_ENV} (required).",
)
@click.option(
    "--webhook-timeout",
    type=float,
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="The application's time to answer one webhook request (connection attempts included).",
)
@click.option(
    "--webhook-ca",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    metavar="FILE",
    help="CA certificate(s) to trust for an https:// --webhook URL (default: the system's).",
)
# --- end DL4 ---
@click.option(
    "--session-cap-ms",
    type=int,
    default=None,
    metavar="MS",
    help="How long the provider lets one connection last (default: the provider's: OpenAI 60 min, xAI "
    "30 min, Gemini 10 min). The rollover ages are 55/60, 58/60 and 59.5/60 of it unless given below.",
)
@click.option(
    "--rollover-after-ms",
    type=int,
    default=None,
    metavar="MS",
    help="Connection age after which the caller's first end of speech opens the next connection.",
)
@click.option(
    "--rollover-deadline-ms",
    type=int,
    default=None,
    metavar="MS",
    help="Connection age at which the next connection opens whatever is being said.",
)
@click.option(
    "--rollover-hard-stop-ms",
    type=int,
    default=None,
    metavar="MS",
    help="Connection age by which the next connection must have opened, or the call ends with a goodbye.",
)
@click.option(
    "--rollover-overlap-ms",
    type=int,
    default=None,
    metavar="MS",
    help="Least time both connections hear the caller (default 3000).",
)
@click.option("--no-rollover", is_flag=True, help="Never open a next connection: the call ends at the cap.")
@click.option(
    "--turn-detection",
    type=click.Choice(["server", "client"]),
    default="server",
    show_default=True,
    help="Who ends the caller's turns: the provider's own detection (server), or the bridge, which "
    "switches the provider's off and commits each turn itself (client; openai-realtime and xai only).",
)
@click.option("--end-call-tool", is_flag=True, help="Offer the model `end_call` (a goodbye, then BYE).")
@click.option(
    "--transfer-target",
    "transfer_targets",
    multiple=True,
    metavar="NAME=sip:URI",
    help="Offer the model `transfer_call` to this destination (SIP REFER; repeatable).",
)
@click.option("--send-dtmf-tool", is_flag=True, help="Offer the model `send_dtmf` (RFC 4733 digits).")
@click.option("--dtmf-to-model", is_flag=True, help="Tell the model which keys the caller presses.")
# --- issue 13: the provider path's cost ---
@click.option(
    "--provider-append-ms",
    type=click.Choice([str(ms) for ms in APPEND_MS_CHOICES]),
    default="20",
    show_default=True,
    help="Caller audio per append sent to the provider. 20 sends every caller "
    "frame at once (lowest latency; the most CPU: at 300 calls the provider path is most of the "
    "bridge's cost); 100 halves that cost but the provider hears the caller up to 80 ms later.",
)
# --- end issue 13 ---
# --- issue 14: the trunk edge (sip/policy.py) ---
@click.option(
    "--allow",
    "allow",
    multiple=True,
    metavar="CIDR",
    help="Only these sources may call (repeatable, IPv4/IPv6); others get 403 (see --drop-unknown).",
)
@click.option("--drop-unknown", is_flag=True, help="Send nothing at all to a source outside --allow.")
@click.option(
    "--invite-rate",
    type=click.FloatRange(min=0),
    default=None,
    metavar="N",
    help="INVITEs per second from one source before 503 with Retry-After (burst 10; 0: no limit). "
    "Default: 5 off loopback, no limit on a loopback --sip.",
)
@click.option(
    "--options-rate",
    type=click.FloatRange(min=0),
    default=None,
    metavar="N",
    help="Out-of-dialog OPTIONS per second from one source before they are dropped unanswered (burst 20; "
    "0: no limit). Default: 10 off loopback, no limit on a loopback --sip.",
)
@click.option(
    "--server-header",
    default=None,
    metavar="TEXT",
    help="Name this product in the Server / User-Agent field of SIP messages. Default: no such field "
    "(a scanner learns nothing to fingerprint).",
)
@click.option(
    "--realm",
    default=None,
    metavar="TEXT",
    help="The realm of --inbound-auth's digest challenges. Default: the advertised address (--external-address, "
    "else the --sip host; 'sip' on a wildcard bind).",
)
@click.option(
    "--inbound-auth",
    default=None,
    metavar="USER",
    help="Challenge inbound calls with digest auth (401) for USER; the password is in "
    "PARLORA_INBOUND_PASSWORD.",
)
@click.option(
    "--allow-any",
    is_flag=True,
    help="Start off loopback with no --allow and no --inbound-auth: anyone "
    "who reaches the port can open paid provider sessions (warned loudly).",
)
@click.option(
    "--register",
    "register",
    multiple=True,
    metavar="sip:USER@HOST[:PORT]",
    help="Register this address-of-record (repeatable): refreshed before expiry, retried with backoff, "
    "un-registered on shutdown; digest password in PARLORA_SIP_PASSWORD. State: GET /registrations.",
)
@click.option("--auth-user", default=None, metavar="NAME", help="Digest user for --register (default: USER).")
@click.option(
    "--keepalive",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="S",
    help="While registered, an OPTIONS to each registrar every S seconds (0: off); 3 unanswered in a row "
    "register again at once. Counters: GET /registrations.",
)
@click.option(
    "--external-address",
    default=None,
    metavar="IP",
    help="NAT: the address peers reach this bridge at (Contact, Via sent-by, SDP c=/o=).",
)
@click.option(
    "--nat",
    is_flag=True,
    help="NAT mode: symmetric RTP (send to where the caller's RTP comes from) "
    "and in-dialog requests to the address the INVITE came from.",
)
@click.option(
    "--rtp-source",
    type=click.Choice(SOURCE_POLICIES),
    default="learn",
    show_default=True,
    help="Without --nat, whose RTP a call takes: learn (the SDP's address, or else the first source sending 4 "
    "packets in sequence, then only that one: Asterisk's strictrtp) or strict (only the SDP's address).",
)
@click.option(
    "--tls",
    "tls",
    default=None,
    metavar="HOST:PORT",
    help="Also answer SIP over TLS here (TLS 1.2/1.3; needs --cert and --key); Contact sips:/transport=tls.",
)
@click.option(
    "--cert", default=None, type=click.Path(exists=True, dir_okay=False), help="TLS certificate (PEM)."
)
@click.option(
    "--key",
    "tls_key",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="TLS private key (PEM).",
)
@click.option(
    "--tls-ca",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="CA certificate(s) that outbound TLS verifies the peer against (default: the system's).",
)
@click.option(
    "--srtp",
    type=click.Choice(["off", "offer", "require", "optional", "required"]),
    default="off",
    show_default=True,
    help="SDES-SRTP (AES_CM_128_HMAC_SHA1_80/_32); keys only over TLS: 'offer' (or 'optional') answers SRTP "
    "when offered and offers it on calls placed over TLS, 'require' (or 'required') refuses (488) a call "
    "that is not over TLS or offers no SRTP, and places none that is not over TLS.",
)
@click.option(
    "--max-call-duration",
    type=click.FloatRange(min=1),
    default=None,
    metavar="S",
    help="End every call after S seconds: the model says a short goodbye, then BYE.",
)
@click.option(
    "--rtp-timeout",
    type=click.FloatRange(min=1),
    default=None,
    metavar="S",
    help="End a call (BYE) when the caller sent no RTP for S seconds (not while on hold), so a lost BYE "
    "cannot keep a call and its provider connection open.",
)
@click.option(
    "--hold-timeout",
    type=click.FloatRange(min=0),
    default=7200.0,
    show_default=True,
    metavar="S",
    help="End a call (BYE) that the caller has held for S seconds in one stretch (the RTP timeout is suspended "
    "while held); 0: never.",
)
@click.option(
    "--session-expires",
    type=click.IntRange(min=0),
    default=1800,
    show_default=True,
    metavar="S",
    help="RFC 4028 session interval asked of callers and offered on calls placed (at least 90); a session not "
    "refreshed in time ends with BYE; 0: ask for none (a peer's own request is still honoured).",
)
# --- end issue 14 ---
@click.option(
    "--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]), show_default=True
)
@click.option(
    "--config",
    "config",
    default=None,
    metavar="FILE",
    help="TOML configuration (deploy/example.toml); options given on the command line override it.",
)  # issue 15 (bridge/ops.py)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object per line (time, level, logger, message, event, call_id); secrets redacted.",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULT_DRAIN_S,
    show_default=True,
    metavar="S",
    help="SIGTERM or POST /drain: refuse new calls (503), let live calls finish for up to S seconds, then "
    "a goodbye from the model and BYE for the rest, and exit; a second SIGTERM or SIGINT ends at once.",
)
@click.option(
    "--cdr",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    metavar="FILE",
    help="Append one JSON line per finished call (the call record, bridge/records.py) to FILE.",
)  # issue 15
@click.option(
    "--record",
    type=click.Path(file_okay=False, exists=True, writable=True),
    default=None,
    metavar="DIR",
    help="Record every call as a stereo WAV in DIR: left the caller, right what was sent to the carrier.",
)  # issue 15
def serve(
    sip_addr: str,
    rtp_port: int,
    provider: str | None,
    provider_url: str | None,
    provider_ca: str | None,
    instructions: str | None,
    engine: str,
    max_calls: int | None,
    http_addr: str | None,
    http_token_env: str | None,
    webrtc_address: str | None,
    stun: str | None,
    reservoir_bytes: int | None,
    residence_ms: int | None,
    failure_message: str | None,
    webhook_url: str | None,  # DL4
    webhook_timeout: float,  # DL4
    webhook_ca: str | None,  # DL4
    session_cap_ms: int | None,
    rollover_after_ms: int | None,
    rollover_deadline_ms: int | None,
    rollover_hard_stop_ms: int | None,
    rollover_overlap_ms: int | None,
    no_rollover: bool,
    turn_detection: str,
    end_call_tool: bool,
    transfer_targets: tuple[str, ...],
    send_dtmf_tool: bool,
    dtmf_to_model: bool,
    provider_append_ms: str,  # issue 13
    allow: tuple[str, ...],  # issue 14
    drop_unknown: bool,  # issue 14
    invite_rate: float | None,  # issue 14
    options_rate: float | None,  # issue 17
    server_header: str | None,
    realm: str | None,
    inbound_auth: str | None,  # issue 14
    allow_any: bool,  # issue 14
    register: tuple[str, ...],  # issue 14
    auth_user: str | None,  # issue 14
    keepalive: float,  # issue 14
    external_address: str | None,  # issue 14
    nat: bool,  # issue 14
    rtp_source: str,
    tls: str | None,  # issue 14
    cert: str | None,  # issue 14
    tls_key: str | None,  # issue 14
    tls_ca: str | None,  # issue 14
    srtp: str,  # issue 14
    max_call_duration: float | None,  # issue 14
    rtp_timeout: float | None,  # issue 14
    hold_timeout: float,
    session_expires: int,
    log_level: str,
    config: str | None,  # issue 15
    log_format: str,  # issue 15
    drain_timeout: float,  # issue 15
    cdr: str | None,  # issue 15
    record: str | None,  # issue 15
) -> None:
    """Answer SIP calls and bridge each one to a realtime provider."""
    options = dict(locals())  # every option by name, for the helpers `call` shares with serve (issue 14)
    if config is not None:  # issue 15: the file, with the options given here over it (bridge/ops.py)
        sys.exit(
            serve_file(
                config,
                setup_logging=_setup_logging,
                webhook_application=WebhookApplication,
                run=lambda server: _run_server(server, os.environ.get(EVENT_LOOP_ENV, "auto")),
            )
        )
    _setup_logging(log_level)
    if log_format == "json":  # issue 15
        use_json_logs()
    provider_fields, application = _provider_fields(options)  # DL4: a --webhook is the application
    # --- issue 14: registration (the rest of the trunk edge is shared with `call`: _trunk_fields) ---
    for aor in register:
        if not aor.startswith(("sip:", "sips:")) or "@" not in aor:
            raise click.UsageError(f"--register expects sip:USER@HOST[:PORT], got {aor!r}")
    if auth_user is not None and not register:
        raise click.UsageError("--auth-user applies to --register")
    if (webrtc_address is not None or stun is not None) and not http_addr:
        raise click.UsageError("--webrtc-address and --stun apply to the console's Talk button: give --http")
    # --- end issue 14 ---
    server_config = ServerConfig(
        **provider_fields,
        **_trunk_fields(options),  # issue 14
        sip=_host_port(sip_addr, 5060),
        rtp_port=rtp_port,
        max_calls=max_calls,
        engine=engine,
        http=_host_port(http_addr, 8080) if http_addr else None,
        http_token=_http_token(http_addr, http_token_env),
        webrtc_address=webrtc_address,
        stun=(stun,) if stun else (),
        register=register,  # issue 14
        register_keepalive_s=keepalive or None,  # issue 14
        drain_timeout_s=drain_timeout,  # issue 15
        cdr=cdr,  # issue 15
        record_dir=record,  # issue 15
    )
    sys.exit(
        _run_server(Server(application, server_config), os.environ.get(EVENT_LOOP_ENV, "auto"))
    )  # issue 13


def _provider_fields(o: Mapping[str, Any]) -> tuple[dict[str, Any], Application]:
    """The provider half of a `ServerConfig` from serve's options (shared by `serve` and `call`): the provider
    and its key, limits, rollover, turn detection and telephony tools; and the application (the --webhook's,
    DL4, or the default). click.UsageError for options that do not fit together."""
    provider = o["provider"]
    if provider is None:
        provider = "openai-live" if os.environ.get("OPENAI_API_KEY") else "echo"
    embedded_echo = provider == "echo"
    kind = KINDS["openai-live" if embedded_echo else provider]
    try:
        key = ECHO_LOCAL_KEY if embedded_echo else api_key(kind)
    except MissingKey as exc:
        raise click.UsageError(str(exc)) from None
    overrides = None
    if o["reservoir_bytes"] is not None or o["residence_ms"] is not None:
        overrides = LimitOverrides(o["reservoir_bytes"], o["residence_ms"])
    extra: tuple[tuple[str, object], ...] = ()
    if o["provider_ca"] is not None:
        if kind.name != "gemini-live":
            raise click.UsageError("--provider-ca applies to --provider gemini-live")
        extra = (("ssl_context", ssl.create_default_context(cafile=o["provider_ca"])),)
    if int(o["provider_append_ms"]) != DEFAULT_APPEND_MS:  # issue 13
        extra += (("append_ms", int(o["provider_append_ms"])),)
    # --- DL4: the application's HTTP webhook ---
    webhook = None
    if o["webhook_url"] is not None:
        try:
            webhook = WebhookConfig.from_options(
                o["webhook_url"], timeout_s=o["webhook_timeout"], ca_file=o["webhook_ca"]
            )
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        log.info("application webhook: POST %s (timeout %g s)", webhook.display_url, webhook.timeout_s)
    elif o["webhook_ca"] is not None:
        raise click.UsageError("--webhook-ca applies to --webhook")
    # --- end DL4 ---
    client_turns = o["turn_detection"] == "client"
    if client_turns and not kind.client_commits():
        raise click.UsageError(
            f"--turn-detection client needs a provider that can switch its turn detection off "
            f"(openai-realtime, xai); {provider} cannot"
        )
    rollover = None
    if not o["no_rollover"]:
        given = {
            "after_ms": o["rollover_after_ms"],
            "deadline_ms": o["rollover_deadline_ms"],
            "hard_stop_ms": o["rollover_hard_stop_ms"],
            "overlap_ms": o["rollover_overlap_ms"],
        }
        try:
            rollover = RolloverOptions.for_cap(
                o["session_cap_ms"] or kind.session_cap_ms,
                **{k: v for k, v in given.items() if v is not None},
            )
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    targets = {}
    for spec in o["transfer_targets"]:
        name, sep, uri = spec.partition("=")
        if not sep or not name or not uri.startswith(("sip:", "sips:", "tel:")):
            raise click.UsageError(f"--transfer-target expects NAME=sip:URI, got {spec!r}")
        targets[name] = uri
    fields: dict[str, Any] = {
        "provider": provider,
        "key": key,
        "provider_url": o["provider_url"],
        "provider_options": extra,
        "turn_detection": "client" if client_turns else "server",
        "instructions": o["instructions"],
        "limits": overrides,
        "failure_message": _read_message(o["failure_message"]) if o["failure_message"] else None,
        "rollover": rollover,
        "telephony": TelephonyOptions(
            end_call=o["end_call_tool"],
            transfer_targets=targets,
            send_dtmf=o["send_dtmf_tool"],
            dtmf_to_model=o["dtmf_to_model"],
        ),
    }
    application = WebhookApplication(webhook) if webhook is not None else Application()  # DL4
    return fields, application


def _trunk_fields(o: Mapping[str, Any]) -> dict[str, Any]:
    """Issue 14's trunk edge of a `ServerConfig` from serve's options (shared by `serve` and `call`): who may
    call, digest credentials, NAT, TLS, SRTP and call limits. click.UsageError for options that do not fit."""
    try:
        parse_networks(o["allow"])
    except ValueError as exc:
        raise click.UsageError(f"--allow: {exc}") from None
    inbound = None
    if o["inbound_auth"] is not None:
        password = os.environ.get(INBOUND_PASSWORD_ENV)
        if not password:
            raise click.UsageError(
                f"--inbound-auth {o['inbound_auth']}: set the password in {INBOUND_PASSWORD_ENV}"
            )
        inbound = (o["inbound_auth"], password)
    if o["drop_unknown"] and not o["allow"]:
        raise click.UsageError("--drop-unknown applies to --allow")
    tls, cert, tls_key, srtp = o["tls"], o["cert"], o["tls_key"], o["srtp"]
    if tls and (cert is None or tls_key is None):
        raise click.UsageError("--tls needs --cert FILE and --key FILE")
    if (cert or tls_key) and not tls:
        raise click.UsageError("--cert/--key apply to --tls")
    if 0 < o["session_expires"] < 90:
        raise click.UsageError(
            f"--session-expires {o['session_expires']}: at least 90 (RFC 4028 Min-SE), or 0"
        )
    if srtp != "off" and not tls:
        log.warning("--srtp %s without --tls: SDES keys only go over TLS, so no call will be SRTP", srtp)
    external_address = o["external_address"]
    if external_address is not None:
        try:
            parse_networks([external_address])
        except ValueError:
            raise click.UsageError(
                f"--external-address expects an IP address, got {external_address!r}"
            ) from None
    for flag, text in (("--server-header", o["server_header"]), ("--realm", o["realm"])):
        if text is not None and not HEADER_TEXT.fullmatch(text):
            raise click.UsageError(f"{flag} expects printable ASCII, 1-128 characters")
    return {
        "server_header": o["server_header"],
        "realm": o["realm"],
        "allow": o["allow"],
        "drop_unknown": o["drop_unknown"],
        "inbound_auth": inbound,
        "allow_any": o["allow_any"],
        "invite_rate_per_s": o["invite_rate"],
        "options_rate_per_s": o["options_rate"],
        "auth_user": o["auth_user"],
        "register_password": os.environ.get(SIP_PASSWORD_ENV) or None,
        "external_address": external_address,
        "nat": o["nat"],
        "rtp_source": o["rtp_source"],
        "tls": _host_port(tls, 5061) if tls else None,
        "cert": cert,
        "tls_key": tls_key,
        "tls_ca": o["tls_ca"],
        "srtp": _SRTP_POLICY[srtp],
        "max_call_duration_s": o["max_call_duration"],
        "rtp_timeout_s": o["rtp_timeout"],
        "hold_timeout_s": o["hold_timeout"] or None,
        "session_expires_s": o["session_expires"],
    }


# --- issue 14: `call`, one outbound call through the native engine ---
# serve's options that `call` takes as they are (the same click.Option objects: one definition each)
_CALL_SHARED = frozenset(
    {
        "provider", "provider_url", "provider_ca", "instructions", "reservoir_bytes", "residence_ms",
        "failure_message", "webhook_url", "webhook_timeout", "webhook_ca", "session_cap_ms",
        "rollover_after_ms", "rollover_deadline_ms", "rollover_hard_stop_ms", "rollover_overlap_ms",
        "no_rollover", "turn_detection", "end_call_tool", "transfer_targets", "send_dtmf_tool",
        "dtmf_to_model", "provider_append_ms", "rtp_port", "allow", "drop_unknown", "invite_rate",
        "options_rate", "server_header", "realm",
        "inbound_auth", "allow_any", "external_address", "nat", "rtp_source", "tls", "cert", "tls_key", "tls_ca", "srtp",
        "max_call_duration", "rtp_timeout", "hold_timeout", "session_expires", "log_level", "log_format",
    }
)  # fmt: skip
# serve's options that `call` takes with its own default and words
_CALL_RESTATED = {
    "sip_addr": ("127.0.0.1:0", "UDP (and TCP) address for our SIP (port 0: any free port)."),
    "auth_user": (None, f"Digest user when the trunk challenges (401/407); password in {SIP_PASSWORD_ENV}."),
}


@main.command("call")
@click.argument("target", metavar="sip:NUMBER@HOST[:PORT]")
@click.option(
    "--from",
    "from_uri",
    default=None,
    metavar="sip:URI",
    help="Our identity in From (trunks often want the account's; default sip:bridge@OUR-ADDRESS).",
)
@click.option(
    "--ring-timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    metavar="S",
    help="Give up (CANCEL, reported as no answer) when the callee has not answered after S seconds.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML configuration (as serve's): the call gets its outbound route, trunk and provider from it.",
)
@click.option("--trunk", default=None, metavar="NAME", help="Call through this [[trunks]] entry of --config.")
@click.option("--route", default=None, metavar="NAME", help="Give the call this outbound route of --config.")
def call_command(
    target: str,
    from_uri: str | None,
    ring_timeout: float,
    config_file: str | None,
    trunk: str | None,
    route: str | None,
    **options: Any,
) -> None:
    """Place one call to TARGET on the native engine and bridge it to the provider, as `serve` bridges the
    calls it answers. The provider connection opens while the callee rings. Exits 0 once an answered call
    has ended; 1 when it was busy, not answered or failed (the SIP status is printed); 2 when it could not
    be placed at all. SIGINT/SIGTERM hangs up (CANCEL while it rings). With --config, TARGET may be a number
    to dial at the trunk's registrar (bridge/dialing.py)."""
    _setup_logging(options["log_level"])
    if options["log_format"] == "json":
        use_json_logs()
    try:
        uri = parse_uri(target) if config_file is None or ":" in target else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="TARGET") from None
    if uri is not None and (uri.scheme not in ("sip", "sips") or not uri.user):
        raise click.BadParameter(f"expected sip:NUMBER@HOST[:PORT], got {target!r}", param_hint="TARGET")

    def run(server: Server) -> NoReturn:
        placing = functools.partial(
            place_call, server, target, from_uri=from_uri, ring_timeout_s=ring_timeout
        )
        if trunk is not None or route is not None:
            placing = functools.partial(placing, trunk=trunk, route=route)
        sys.exit(asyncio.run(placing()))

    if config_file is not None:  # the file's providers, outbound routes and trunks (bridge/ops.py)
        sip = _host_port(options["sip_addr"], 5060)
        run(
            call_server(
                config_file, sip, setup_logging=_setup_logging, webhook_application=WebhookApplication
            )
        )
    provider_fields, application = _provider_fields(options)
    config = ServerConfig(
        **provider_fields,
        **_trunk_fields(options),
        sip=_host_port(options["sip_addr"], 5060),
        rtp_port=options["rtp_port"],
        max_calls=1,  # the call placed takes the one slot: an INVITE that reaches us meanwhile gets 503
        engine="native",  # the pjsua2 engine places no calls
        browser_channel=False,
    )
    run(Server(application, config))


for _param in serve.params:
    if _param.name in _CALL_SHARED:
        call_command.params.append(_param)
    elif _param.name in _CALL_RESTATED:
        _restated = copy.copy(_param)
        _restated.default, _restated.help = _CALL_RESTATED[_param.name]
        call_command.params.append(_restated)


async def place_call(
    server: Server,
    target: str,
    *,
    from_uri: str | None,
    ring_timeout_s: float,
    trunk: str | None = None,
    route: str | None = None,
) -> int:
    """`call`'s run: start the server, dial, wait for the call's session to finish, stop; the exit status (see
    `call_command`). The outcome is printed on stdout: "answered" or "busy"/"no answer"/"failed"/"cancelled"
    with the SIP status and reason."""
    try:
        await server.start()
    except EngineError as exc:
        log.error("cannot start the SIP engine on %s:%d: %s", *server.config.sip, exc)
        return 2
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupted.set)
    try:
        server.calls_changed.clear()
        try:
            call_id = await server.dial(
                target, from_uri=from_uri, ring_timeout_s=ring_timeout_s, trunk=trunk, route=route
            )
        except (ValueError, OSError, RuntimeError) as exc:  # EngineError is a RuntimeError
            log.error("cannot call %s: %s", target, exc)
            return 2
        ended = asyncio.create_task(server.calls_changed.wait())
        stop = asyncio.create_task(interrupted.wait())
        await asyncio.wait({ended, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not ended.done():  # SIGINT/SIGTERM: hang up (CANCEL while ringing) and let the session finish
            live = server.calls.get(call_id)
            if live is not None:
                live.hang_up("interrupted (call)")
            await asyncio.wait({ended}, timeout=10.0)
        for task in (ended, stop):
            task.cancel()
        outcome = outbound_outcome(server, call_id)  # (the engine's record: read before it stops)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await server.stop()
    if outcome is None:
        click.echo(f"{call_id}: call to {target}: no outcome recorded")
        return 1
    click.echo(
        f"{call_id}: call to {target}: {outcome['outcome']} (SIP {outcome['status']}: {outcome['reason']})"
    )
    return 0 if outcome["outcome"] == "answered" else 1


# --- end issue 14 ---


# --- issue 13: the process around the loop ---
EVENT_LOOP_ENV = "PARLORA_EVENT_LOOP"  # auto (uvloop when installed) | uvloop | asyncio
T = TypeVar("T")


def _run_server(server: Server, event_loop: str) -> int:
    """The server on uvloop when installed (PARLORA_EVENT_LOOP=asyncio: the stdlib loop; =uvloop: uvloop or an
    error), with malloc tuned, the start-up heap frozen and the C heap trimmed once a minute (bridge/heap.py).
    A fatal signal (a crash in a C extension: pjsua2, PyAV) prints every thread's Python stack to stderr first."""
    faulthandler.enable()
    tune_malloc()
    freeze_start_up_heap()
    return _run_on_loop(_serving(server), event_loop)


def _run_on_loop(main: Coroutine[Any, Any, T], event_loop: str) -> T:
    """`main` on uvloop when installed, or as PARLORA_EVENT_LOOP says (`serve` and `fake-provider` alike)."""
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise click.UsageError(f"{EVENT_LOOP_ENV}=uvloop: uvloop is not installed") from None
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(main)
    return asyncio.run(main)


async def _serving(server: Server) -> int:
    trim = malloc_trim()
    heap = None if trim is None else HeapTrim(trim)
    if heap is not None:
        heap.start(asyncio.get_running_loop())
    try:
        return await server.run()
    finally:
        if heap is not None:
            heap.stop()


# --- end issue 13 ---


class WebhookApplication(Application):
    """`serve --webhook`: every job is POSTed to the application (DL4, bridge/webhook.py)."""

    def __init__(self, config: WebhookConfig) -> None:
        self._config = config

    async def job(self, call: LiveCall, job: JobRequest) -> str:
        return await webhook_handler(self._config, call.info)(job)

    # issue 15: the call's events, POSTed to the same URL (bridge/webhook.py "Events")
    async def call_started(self, call: LiveCall, event: CallStarted) -> None:
        await WebhookClient(self._config).deliver_event(event, call.call_id)

    async def utterance(self, call: LiveCall, utterance: Utterance) -> None:
        await WebhookClient(self._config).deliver_event(utterance, call.call_id)

    async def work_uncertain(self, call: LiveCall, event: UncertainWork) -> None:  # S8
        await WebhookClient(self._config).deliver_event(event, call.call_id)

    async def call_ended(self, call: LiveCall, record: CallRecord) -> None:
        await WebhookClient(self._config).deliver_event(CallEnded(record), call.call_id)


def _read_message(path: str) -> bytes:
    with wave.open(path, "rb") as wav:
        if (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) != (8000, 1, 2):
            raise click.BadParameter(f"{path}: needs 8 kHz mono 16-bit PCM", param_hint="--failure-message")
        return wav.readframes(wav.getnframes())


main.add_command(config_group)  # issue 15: `parlora-bridge config check FILE` (bridge/ops.py)
main.add_command(doctor_command)  # issue 15: `parlora-bridge doctor` (bridge/doctor.py)


@main.command("fake-provider")
@click.option("--protocol", type=click.Choice(list(_FAKES)), default="openai-live", show_default=True)
@click.option(
    "--listen", default="127.0.0.1:8765", show_default=True, help="HOST:PORT to listen on (loopback)."
)
@click.option(
    "--record", "record_path", default=None, help="Append every client frame to this JSON-lines file."
)
@click.option(
    "--fault",
    "faults",
    multiple=True,
    help="Inject a fault: [N/]KIND[:VALUE][@AFTER_MS] (repeatable; "
    "see providers/fakes/faults.py). At runtime: GET /_fault?spec=... on the same port.",
)
@click.option(
    "--notes",
    "notes_path",
    default=None,
    metavar="FILE",
    help="Append what each connection heard and answered (its session id, the caller utterances it transcribed, "
    "its replies and tool calls, the faults that fired) to this JSON-lines file (providers/fakes/server.py).",
)
@click.option("--script", "script_path", default=None, help="JSON script of the fake model's answers.")
@click.option(
    "--session-ms",
    type=int,
    default=None,
    metavar="MS",
    help="How long one connection lasts before the fake ends it the way the provider does (default: the "
    "provider's; Gemini: the connection lifetime, with goAway a quarter of it before).",
)
@click.option(
    "--handle-ttl-ms",
    type=int,
    default=None,
    metavar="MS",
    help="gemini-live: how long a session resumption handle stays valid after its session ended "
    "(default: the service's 2 h).",
)
@click.option("--cert", default=None, help="TLS certificate (gemini-live; generated when absent).")
@click.option("--key", "key_path", default=None, help="TLS private key (gemini-live; generated when absent).")
@click.option(
    "--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]), show_default=True
)
def fake_provider(
    protocol: str,
    listen: str,
    record_path: str | None,
    faults: tuple[str, ...],
    notes_path: str | None,
    script_path: str | None,
    session_ms: int | None,
    handle_ttl_ms: int | None,
    cert: str | None,
    key_path: str | None,
    log_level: str,
) -> None:
    """Run a provider fake on its own, for tests and for trying the bridge without a key."""
    _setup_logging(log_level)
    host, port = _host_port(listen, 8765)
    try:
        parsed = [parse_fault(spec) for spec in faults]
        script = load_script(script_path) if script_path else None
    except (ValueError, KeyError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    if handle_ttl_ms is not None and protocol != "gemini-live":
        raise click.UsageError("--handle-ttl-ms applies to --protocol gemini-live")
    _run_on_loop(  # uvloop, as serve runs on (issue 13: the bench's echo fake serves up to 300 calls)
        _fake_provider(
            protocol,
            host,
            port,
            record_path,
            parsed,
            script,
            cert,
            key_path,
            session_ms,
            handle_ttl_ms,
            notes_path,
        ),
        os.environ.get(EVENT_LOOP_ENV, "auto"),
    )


async def _fake_provider(
    protocol: str,
    host: str,
    port: int,
    record_path: str | None,
    faults: list[Fault],
    script: Script | None,
    cert: str | None,
    key_path: str | None,
    session_ms: int | None = None,
    handle_ttl_ms: int | None = None,
    notes_path: str | None = None,
) -> None:
    module_name, options_module, options_class = _FAKES[protocol]
    module = import_module(module_name)
    # A standalone fake may run for hours: it writes client frames to --record, never keeps them in memory.
    lengths: dict[str, int] = {}
    if session_ms is not None:
        lengths = (
            {"connection_lifetime_ms": session_ms, "go_away_ms": session_ms // 4}
            if protocol == "gemini-live"
            else {"session_length_ms": session_ms}
        )
    if handle_ttl_ms is not None:
        lengths["handle_ttl_ms"] = handle_ttl_ms
    named: dict[str, bool] = {"name_sessions": True} if notes_path and protocol == "gemini-live" else {}
    options = getattr(import_module(options_module), options_class)(
        record_client_frames=False, **lengths, **named
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    kwargs: dict[str, object] = {"record_path": record_path, "faults": faults, "options": options}
    if script is not None:
        kwargs["script"] = script
    if protocol == "gemini-live":
        cert_path, key_file, generated = module.ensure_cert(
            cert, key_path, tempfile.mkdtemp(prefix="parlora-tls-")
        )
        if generated:
            print(f"generated a self-signed TLS pair: cert {cert_path} key {key_file}", flush=True)
        kwargs.update(cert=cert_path, key=key_file)
    server = await module.serve(host, port, **kwargs)
    server.keep_records = False  # lifetimes go to --record's .connections file; memory keeps the open ones
    if notes_path is not None:
        server.keep_notes(notes_path)
    log.info("fake provider %s listening on %s", protocol, server.url)
    await stop.wait()
    await server.close()


# --srtp as issue 14 names it (off, offer, require) and as sip/sdp.py does (optional, required).
_SRTP_POLICY: dict[str, Literal["off", "optional", "required"]] = {
    "off": "off",
    "offer": "optional",
    "optional": "optional",
    "require": "required",
    "required": "required",
}
