"""The `parlora-bridge` command: `serve` answers calls; `fake-provider` runs a provider fake on its own."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass

import click

from bridge.session import CallSession
from providers.openai_live import LiveConfig, OpenAILiveAdapter
from sip.pjsua2_agent import Pjsua2Leg, Pjsua2UserAgent, UserAgentConfig, UserAgentError

log = logging.getLogger("parlora")

ECHO_LOCAL_KEY = "echo-local"  # the embedded fake accepts any bearer token; this one is not a secret


def _host_port(value: str, default_port: int) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        return value, default_port
    if not port.isdigit() or not host:
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # websockets logs request headers at DEBUG, Authorization included: keep API keys out of every log.
    logging.getLogger("websockets").setLevel(max(logging.INFO, logging.getLogger().level))


@click.group()
@click.version_option(package_name="parlora-bridge")
def main() -> None:
    """parlora-bridge: phone calls to realtime speech-to-speech AI."""


@dataclass(frozen=True)
class _ServeOptions:
    sip: tuple[str, int]
    rtp_port: int
    provider: str
    provider_url: str | None
    api_key: str
    instructions: str | None
    max_calls: int


@main.command()
@click.option("--sip", "sip_addr", default="127.0.0.1:5060", show_default=True, help="UDP address to answer SIP on.")
@click.option("--rtp-port", default=4000, show_default=True, help="First local RTP port (each call takes a pair).")
@click.option(
    "--provider",
    type=click.Choice(["echo", "openai-live"]),
    default=None,
    help="Realtime provider. Default: openai-live when OPENAI_API_KEY is set, else echo (a local GPT-Live fake "
    "that speaks each caller utterance back).",
)
@click.option("--provider-url", default=None, help="WebSocket URL of the provider (e.g. a fake-provider).")
@click.option("--instructions", default=None, help="Instructions for the model.")
@click.option("--max-calls", default=4, show_default=True, help="Concurrent calls (this pjsua2 wheel allows 4).")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]), show_default=True)
def serve(
    sip_addr: str,
    rtp_port: int,
    provider: str | None,
    provider_url: str | None,
    instructions: str | None,
    max_calls: int,
    log_level: str,
) -> None:
    """Answer SIP calls and bridge each one to a realtime provider."""
    _setup_logging(log_level)
    key = os.environ.get("OPENAI_API_KEY", "")
    if provider is None:
        provider = "openai-live" if key else "echo"
    if provider == "openai-live" and not key:
        raise click.UsageError("--provider openai-live needs an API key in the environment variable OPENAI_API_KEY")
    options = _ServeOptions(
        sip=_host_port(sip_addr, 5060),
        rtp_port=rtp_port,
        provider=provider,
        provider_url=provider_url,
        api_key=key if provider == "openai-live" else ECHO_LOCAL_KEY,
        instructions=instructions,
        max_calls=max_calls,
    )
    sys.exit(asyncio.run(_serve(options)))


async def _serve(options: _ServeOptions) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    fake = None
    url = options.provider_url
    if options.provider == "echo" and url is None:
        from providers.fakes import openai_live as live_fake

        logging.getLogger("providers.fakes").setLevel(logging.WARNING)  # one connection per call: no chatter
        fake = await live_fake.serve("127.0.0.1", 0)
        url = fake.url
        log.info("provider: echo (embedded GPT-Live fake at %s)", url)
    else:
        log.info("provider: %s at %s", options.provider, url or "the default endpoint")

    sessions: set[asyncio.Task[object]] = set()

    def on_call(leg: Pjsua2Leg) -> None:
        config = LiveConfig(instructions=options.instructions)
        limits = OpenAILiveAdapter.audio_limits(config.audio_format)
        adapter = OpenAILiveAdapter(options.api_key, config, limits=limits, url=url)
        task: asyncio.Task[object] = asyncio.create_task(CallSession(leg, adapter).run(), name=leg.identity.call_id)
        sessions.add(task)
        task.add_done_callback(sessions.discard)

    agent = Pjsua2UserAgent(
        UserAgentConfig(host=options.sip[0], port=options.sip[1], rtp_port=options.rtp_port, max_calls=options.max_calls),
        loop,
        on_call,
    )
    try:
        await loop.run_in_executor(None, agent.start)
    except UserAgentError as exc:
        log.error("cannot start the SIP user agent on %s:%d: %s", *options.sip, exc)
        if fake is not None:
            await fake.close()
        return 2
    await stop.wait()
    log.info("stopping")
    clean = await loop.run_in_executor(None, agent.stop)  # hangs up every call; sessions see CallEnded
    if sessions:
        await asyncio.wait(set(sessions), timeout=5.0)
    for task in sessions:
        task.cancel()
    if fake is not None:
        await fake.close()
    if not clean:
        log.error("the SIP engine did not stop in time")
        return 1
    log.info("stopped")
    return 0


@main.command("fake-provider")
@click.option("--protocol", type=click.Choice(["openai-live"]), default="openai-live", show_default=True)
@click.option("--listen", default="127.0.0.1:8765", show_default=True, help="HOST:PORT to listen on (loopback).")
@click.option("--record", "record_path", default=None, help="Append every client frame to this JSON-lines file.")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]), show_default=True)
def fake_provider(protocol: str, listen: str, record_path: str | None, log_level: str) -> None:
    """Run a provider fake on its own, for tests and for trying the bridge without a key."""
    _setup_logging(log_level)
    host, port = _host_port(listen, 8765)
    asyncio.run(_fake_provider(host, port, record_path))


async def _fake_provider(host: str, port: int, record_path: str | None) -> None:
    from providers.fakes import openai_live as live_fake

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    server = await live_fake.serve(host, port, record_path=record_path)
    log.info("fake provider openai-live listening on %s", server.url)
    await stop.wait()
    await server.close()
