"""The `parlora-bridge` command: `serve` answers calls; `fake-provider` runs a provider fake on its own."""

from __future__ import annotations

import asyncio
import copy
import faulthandler
import functools
import logging
import os
import signal
import sys
from dataclasses import replace
from typing import Any

import click

from bridge.cli.config import (
    CLI_OPTIONS,
    DEFAULT_SIP_PASSWORD_ENV,
    BridgeConfig,
    ConfigError,
    apply_options,
    click_options,
    given_options,
)
from bridge.cli.doctor import doctor_command
from bridge.cli.fake import fake_provider
from bridge.cli.ops import RoutedApplication, build, config_group, serve_config, server_config
from bridge.cli.process import EVENT_LOOP_ENV
from bridge.cli.process import host_port as _host_port
from bridge.cli.process import run_on_loop as _run_on_loop
from bridge.cli.process import setup_logging as _setup_logging
from bridge.engine.amd import AMD_ACTIONS, AmdAction, AmdVerdict
from bridge.engine.delegations import JobRequest
from bridge.server.api import Application, LiveCall, Server, outbound_outcome
from bridge.server.heap import HeapTrim, freeze_start_up_heap, malloc_trim, tune_malloc
from bridge.server.jsonlog import use_json_logs
from bridge.server.looplag import LoopLagMonitor
from bridge.server.records import (
    AmdResult,
    CallEnded,
    CallRecord,
    CallStarted,
    EarlyMediaReport,
    UncertainWork,
    Utterance,
)
from bridge.server.webhook import WebhookClient, WebhookConfig, webhook_handler
from sip.core.uri import parse_uri
from sip.engine import ENGINES, EngineError

log = logging.getLogger("parlora")


def _http_token(http_addr: str | None, env_name: str | None) -> str | None:
    """The HTTP listener's bearer token for --http and --http-token-env, as `serve` takes it (through
    bridge.cli.ops.server_config): from the variable named; a listener off loopback must have one."""
    given = {"http_addr": http_addr, "http_token_env": env_name}
    try:
        return server_config(apply_options(BridgeConfig(), given), os.environ).http_token
    except ConfigError as exc:
        raise click.UsageError("; ".join(exc.problems)) from None


SIP_PASSWORD_ENV = DEFAULT_SIP_PASSWORD_ENV  # --register's and --auth-user's digest password


@click.group()
@click.version_option(package_name="parlora-bridge")
def main() -> None:
    """parlora-bridge: phone calls to realtime speech-to-speech AI."""


@main.command()
@click.option(
    "--config",
    "config",
    default=None,
    metavar="FILE",
    help="TOML configuration (deploy/example.toml); options given on the command line override its keys.",
)
@click_options()  # every other option: one row each of bridge.cli.config.OPTIONS (flag, file key, type, help)
def serve(config: str | None, **_options: Any) -> None:
    """Answer SIP calls and bridge each one to a realtime provider."""
    sys.exit(
        serve_config(  # the file (or none) with the options given here over it: one path (bridge/cli/ops.py)
            config,
            given_options(click.get_current_context()),
            setup_logging=_setup_logging,
            webhook_application=WebhookApplication,
            run=lambda server: _run_server(server, os.environ.get(EVENT_LOOP_ENV, "auto")),
        )
    )


# `call`: one outbound call through the native engine.
# serve's options that `call` takes as they are (the same click.Option objects: one definition each)
_CALL_SHARED = frozenset(
    {
        "provider", "provider_url", "provider_ca", "instructions", "reservoir_bytes", "residence_ms",
        "failure_message", "webhook_url", "webhook_timeout", "webhook_ca", "session_cap_ms",
        "rollover_after_ms", "rollover_deadline_ms", "rollover_hard_stop_ms", "rollover_overlap_ms",
        "no_rollover", "turn_detection", "end_call_tool", "transfer_targets", "send_dtmf_tool",
        "dtmf_to_model", "provider_append_ms", "rtp_port", "rtp_ports", "allow", "drop_unknown",
        "invite_rate", "options_rate", "inbound_auth", "allow_any", "external_address", "nat", "rtp_source",
        "tls", "cert", "tls_key", "tls_ca", "srtp", "max_call_duration", "rtp_timeout", "hold_timeout",
        "session_expires", "server_header", "realm", "log_level", "log_format", "amd", "amd_machine",
        "amd_message", "amd_message_wav", "amd_total_ms", "amd_machine_greeting_ms", "amd_beep_wait_ms",
        "amd_decide_ms", "early_media_to_provider",
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
    to dial at the trunk's registrar (bridge/server/dialing.py)."""
    try:
        uri = parse_uri(target) if config_file is None or ":" in target else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="TARGET") from None
    if uri is not None and (uri.scheme not in ("sip", "sips") or not uri.user):
        raise click.BadParameter(f"expected sip:NUMBER@HOST[:PORT], got {target!r}", param_hint="TARGET")
    given = {k: v for k, v in given_options(click.get_current_context()).items() if k in CLI_OPTIONS}
    given.pop("sip_addr", None)  # call's own default and meaning (port 0: any free port)
    try:  # the one path `serve` takes too (bridge/cli/ops.py), with the file's providers, routes and trunks
        built = build(config_file, given, os.environ, inbound=False)
    except ConfigError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        sys.exit(2)
    _setup_logging(built.config.logging.level)
    if built.config.logging.format == "json":
        use_json_logs()
    # One call: no listener of the file's (a `serve` of the same file may hold them), no registration (it
    # would move the trunk's binding away from that `serve`), the one slot for the call placed (an INVITE
    # that reaches us meanwhile gets 503), the native engine (pjsua2 places no calls).
    config = replace(
        built.server,
        sip=_host_port(options["sip_addr"], 5060),
        http=None,
        register=(),
        trunks=tuple(replace(t, registrar=None) for t in built.server.trunks),
        max_calls=1,
        engine="native",
        browser_channel=False,
    )
    application = WebhookApplication(built.webhook) if built.webhook is not None else Application()
    server = Server(RoutedApplication(application, built.config), config)
    placing = functools.partial(place_call, server, target, from_uri=from_uri, ring_timeout_s=ring_timeout)
    if trunk is not None or route is not None:
        placing = functools.partial(placing, trunk=trunk, route=route)
    sys.exit(asyncio.run(placing()))


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
        amd = server.amd_line(call_id)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await server.stop()
    if outcome is None:
        click.echo(f"{call_id}: call to {target}: no outcome recorded")
        return 1
    early = outcome.get(
        "early_media_ms"
    )  # sip/native/early.py: a failure after early media is not a plain one
    heard = (
        f" after early media heard for {early} ms"
        if early is not None and outcome["outcome"] != "answered"
        else ""
    )
    click.echo(
        f"{call_id}: call to {target}: {outcome['outcome']}{heard} (SIP {outcome['status']}: {outcome['reason']})"
    )
    if amd is not None:  # --amd
        click.echo(f"{call_id}: {amd}")
    return 0 if outcome["outcome"] == "answered" else 1


def _run_server(server: Server, event_loop: str) -> int:
    """The server on uvloop when installed (PARLORA_EVENT_LOOP=asyncio: the stdlib loop; =uvloop: uvloop or an
    error), with malloc tuned, the start-up heap frozen and the C heap trimmed once a minute (bridge/server/heap.py).
    A fatal signal (a crash in a C extension: pjsua2, PyAV) prints every thread's Python stack to stderr first."""
    faulthandler.enable()
    tune_malloc()
    # The collector's thresholds stay CPython's (700, 10, 10). Measured with the fault campaign's quick form at 16
    # calls (tests/bench/README.md "The media clock protected"): no full collection while calls ran, with either
    # (700, 10, 10) or (700, 10, 100); generation 0 and 1 pauses p99 6.4 vs 5.4 ms, max 6.4 vs 5.4 ms of CPU on a
    # saturated host: within run-to-run noise, so nothing to gain here at that load.
    # The SIP engine's module and the browser channel's aiortc imported here, not on the loop, where they held it
    # 110 and 372-391 ms of CPU at start (tests/bench/slow_callbacks.py); frozen with the rest.
    spec = ENGINES.get(server.config.engine)
    engine = (spec.target.partition(":")[0],) if spec is not None else ()
    browser = (
        ("bridge.server.browser",) if server.config.http is not None and server.config.browser_channel else ()
    )
    freeze_start_up_heap(engine + browser)
    return _run_on_loop(_serving(server), event_loop)


async def _serving(server: Server) -> int:
    trim = malloc_trim()
    heap = None if trim is None else HeapTrim(trim)
    if heap is not None:
        heap.start(asyncio.get_running_loop())
    lag = LoopLagMonitor()  # the loop's lag on /metrics (bridge/server/looplag.py)
    server.observer.metrics.loop_lag.meter = lag.meter
    lag.start(asyncio.get_running_loop())
    try:
        return await server.run()
    finally:
        lag.stop()
        if heap is not None:
            heap.stop()


class WebhookApplication(Application):
    """`serve --webhook`: every job is POSTed to the application (DL4, bridge/server/webhook.py)."""

    def __init__(self, config: WebhookConfig) -> None:
        self._config = config

    async def job(self, call: LiveCall, job: JobRequest) -> str:
        return await webhook_handler(self._config, call.info)(job)

    # The call's events, POSTed to the same URL (bridge/server/webhook.py "Events")
    async def call_started(self, call: LiveCall, event: CallStarted) -> None:
        await WebhookClient(self._config).deliver_event(event, call.call_id)

    async def utterance(self, call: LiveCall, utterance: Utterance) -> None:
        await WebhookClient(self._config).deliver_event(utterance, call.call_id)

    async def work_uncertain(self, call: LiveCall, event: UncertainWork) -> None:  # S8
        await WebhookClient(self._config).deliver_event(event, call.call_id)

    async def amd_result(self, call: LiveCall, event: AmdResult) -> None:
        if event.kind != "verdict":  # (the verdict is POSTed by amd_action, when it is made)
            await WebhookClient(self._config).deliver_event(event, call.call_id)

    async def amd_action(self, call: LiveCall, verdict: AmdVerdict, default: AmdAction) -> AmdAction | None:
        """The verdict's event, POSTed when it is made (not queued behind the call's other events: its answer
        decides what follows): an output of "talk", "message" or "hang_up" chooses; any other keeps the route's
        choice (bridge/server/webhook.py "Events")."""
        event = AmdResult(call.call_id, "verdict", verdict.kind, verdict.reason, verdict.since_answer_ms)
        result = await WebhookClient(self._config).deliver_event(event, call.call_id)
        answer = result.output.strip() if result.problem is None else ""
        return next((a for a in AMD_ACTIONS if a == answer), None)

    async def early_media(self, call: LiveCall, event: EarlyMediaReport) -> None:
        await WebhookClient(self._config).deliver_event(event, call.call_id)

    async def call_ended(self, call: LiveCall, record: CallRecord) -> None:
        await WebhookClient(self._config).deliver_event(CallEnded(record), call.call_id)


main.add_command(config_group)  # `parlora-bridge config check FILE` (bridge/cli/ops.py)
main.add_command(doctor_command)  # `parlora-bridge doctor` (bridge/cli/doctor.py)
main.add_command(fake_provider)  # `parlora-bridge fake-provider` (bridge/cli/fake.py)
