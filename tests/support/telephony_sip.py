"""Harness moved unchanged from tests/integration/test_telephony_sip.py: DRIVER, LegDriver, TARGET, _clean_env."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import peers

DRIVER = Path(__file__).resolve().parents[1] / "integration" / "leg_driver.py"


TARGET = "sip:agent@127.0.0.1:5999"  # nothing listens there: SIPp plays the transferee and the NOTIFYs


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


class LegDriver:
    """`leg_driver.py` as a process: commands in, leg events (JSON lines) out."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.sip_port = peers.free_udp_port()
        self.rtp_port = peers.free_rtp_port()  # even: the first call takes exactly this port on either engine
        argv = [
            sys.executable,
            str(DRIVER),
            "--sip",
            f"127.0.0.1:{self.sip_port}",
            "--rtp-port",
            str(self.rtp_port),
            *extra,
        ]
        self.proc = peers.ManagedProcess(
            argv, cwd=workdir, env=_clean_env(), stdin_pipe=True, name="leg-driver"
        )
        self.wait_event("listening", timeout=20)

    def events(self, name: str | None = None) -> list[dict]:
        out = []
        for line in self.proc.lines:
            if line.stream == "stdout" and line.text.startswith("{"):
                event = json.loads(line.text)
                if name is None or event["event"] == name:
                    out.append(event)
        return out

    def wait_event(
        self, name: str, timeout: float, count: int = 1, where: Callable[[dict], bool] = lambda e: True
    ) -> dict:
        """The `count`-th event called `name` that satisfies `where`, waiting for it up to `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.proc.line_count()
            matching = [e for e in self.events(name) if where(e)]
            if len(matching) >= count:
                return matching[count - 1]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no {name} event #{count} within {timeout} s; events: {self.events()}\n"
                    f"{self.proc.stderr[-3000:]}"
                )
            self.proc.wait_for(r".", timeout=remaining, since=seen)  # the next line of output, whatever it is

    def send(self, command: str) -> None:
        assert self.proc.send(command + "\n"), "leg driver's stdin is closed"

    def stop(self) -> int | None:
        self.proc.send("quit\n")
        rc = self.proc.wait(15.0)
        self.proc.stop(term_timeout=5.0)
        return rc
