"""What the commands' processes share (bridge/cli/commands.py, bridge/cli/fake.py): the log set-up, a
HOST:PORT option, and the event loop `serve` and `fake-provider` run on. No module of the bridge's here:
`fake-provider` starts without importing `serve`'s."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

EVENT_LOOP_ENV = "PARLORA_EVENT_LOOP"  # auto (uvloop when installed) | uvloop | asyncio
T = TypeVar("T")


def host_port(value: str, default_port: int) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        return value, default_port
    if not port.isdigit() or not host:
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # websockets logs request headers at DEBUG, Authorization included: keep API keys out of every log.
    logging.getLogger("websockets").setLevel(max(logging.INFO, logging.getLogger().level))


def run_on_loop(main: Coroutine[Any, Any, T], event_loop: str) -> T:
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
