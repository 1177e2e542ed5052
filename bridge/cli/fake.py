"""`parlora-bridge fake-provider`: a provider fake on its own, for tests and for trying the bridge without a key.

Its own module, apart from `serve`'s (bridge/cli/commands.py adds it to the command group): `python -m bridge
fake-provider` (bridge/__main__.py) imports this alone, not the bridge's modules, and is listening in half the
time (0.45 s of CPU instead of 1.0 s, measured on 7 December 2026; the live tests start one for most calls)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import tempfile
from importlib import import_module

import click

from bridge.cli.process import EVENT_LOOP_ENV, host_port, run_on_loop, setup_logging
from providers.fakes.faults import Fault, parse_fault
from providers.fakes.script import Script, load_script

log = logging.getLogger("parlora")

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


@click.command("fake-provider")
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
    setup_logging(log_level)
    host, port = host_port(listen, 8765)
    try:
        parsed = [parse_fault(spec) for spec in faults]
        script = load_script(script_path) if script_path else None
    except (ValueError, KeyError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    if handle_ttl_ms is not None and protocol != "gemini-live":
        raise click.UsageError("--handle-ttl-ms applies to --protocol gemini-live")
    run_on_loop(  # uvloop, as serve runs on (the bench's echo fake serves up to 300 calls)
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
