"""Harness moved unchanged from tests/integration/test_kamailio.py: ANSWERED, Kamailio, NATIVE, RECIPE, REPO, _calls, _kamailio_config, kamailio."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import peers
import pytest

REPO = Path(__file__).resolve().parents[2]


RECIPE = REPO / "deploy" / "kamailio" / "kamailio.cfg"


NATIVE = ("--engine", "native", "--provider", "echo")


ANSWERED = re.compile(r"^(\S+) sips?:[^@\s]*@?127\.0\.0\.1:(\d+)\S* RR=(.*)$")


def _kamailio_config(text: str, values: dict[str, str]) -> str:
    """The recipe with each `#!substdef "!NAME!value!g"` line's value replaced; each must exist once."""
    for name, value in values.items():
        text, n = re.subn(
            rf'^#!substdef "!{name}![^!\n]*!g"$', f'#!substdef "!{name}!{value}!g"', text, flags=re.MULTILINE
        )
        assert n == 1, f"deploy/kamailio/kamailio.cfg has no single substdef line for {name}"
    return text


class Kamailio:
    """kamailio in the foreground (-DD, logging to stderr) with its own runtime dir, PID file and control
    socket; `stop()` signals the PID from its PID file (the process we started) and waits for it."""

    def __init__(
        self, workdir: Path, destinations: list[tuple[int, str]], template: str | None = None
    ) -> None:
        self.dir = workdir
        workdir.mkdir(parents=True)
        self.port = peers.free_udp_port(also_tcp=True)
        self.ctl = workdir / "kamailio_ctl"
        self.pidfile = workdir / "kamailio.pid"
        ds_list = workdir / "dispatcher.list"
        ds_list.write_text(
            "".join(f"1 sip:127.0.0.1:{port} 0 0 duid={duid};maxload=50\n" for port, duid in destinations)
        )
        config = workdir / "kamailio.cfg"
        config.write_text(
            _kamailio_config(
                RECIPE.read_text() if template is None else template,
                {
                    "LB_ADDR": "127.0.0.1",
                    "LB_PORT": str(self.port),
                    "DS_LIST_FILE": str(ds_list),
                    "CTL_SOCKET": f"unix:{self.ctl}",
                    "DS_PING_INTERVAL": "1",
                    "FR_TIMER_MS": "1000",
                },
            )
        )
        check = peers.ManagedProcess(["kamailio", "-c", "-f", config, "-Y", workdir], name="kamailio-check")
        try:
            assert check.wait(20) == 0, check.stderr[-3000:]  # the generated config is valid
        finally:
            check.stop()
        self.proc = peers.ManagedProcess(
            [
                "kamailio",
                "-f",
                config,
                "-P",
                self.pidfile,
                "-Y",
                workdir,
                "-w",
                workdir,
                "-DD",
                "-E",
                "-m",
                "32",
                "-M",
                "4",
            ],
            cwd=workdir,
            name="kamailio",
        )
        self.pid = 0
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.proc.running():
            if self.pidfile.exists() and self.pidfile.read_text().strip() and self.ctl.exists():
                self.pid = int(self.pidfile.read_text())
                break
            time.sleep(0.1)
        if self.pid != self.proc.pid:
            self.proc.stop()
            raise AssertionError(f"PID file {self.pid} vs started {self.proc.pid}:\n{self.log[-3000:]}")

    @property
    def log(self) -> str:
        return self.proc.stderr

    def states(self) -> dict[int, str]:
        """Port -> dispatcher state letters (FLAGS: AP active and probed, IP inactive, TP trying, ...)."""
        out = peers._run_bounded(["kamcmd", "-s", f"unix:{self.ctl}", "dispatcher.list"], 10).stdout
        return {
            int(port): flags for port, flags in re.findall(r"URI: sip:127\.0\.0\.1:(\d+)\s+FLAGS: (\w+)", out)
        }

    def wait_state(self, port: int, letter: str, timeout: float) -> float:
        """Seconds until destination `port`'s state starts with `letter` (polled, bounded)."""
        start = time.monotonic()
        while True:
            if self.states().get(port, "").startswith(letter):
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise TimeoutError(
                    f"{port} not {letter} within {timeout} s: {self.states()}\n{self.log[-2000:]}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        if self.pid and self.proc.running():
            os.kill(self.pid, signal.SIGTERM)
            self.proc.wait(10)
        self.proc.stop()  # reaps it (and only its own process group, should a child linger)


@pytest.fixture
def kamailio(tmp_path: Path) -> Iterator[list[Kamailio]]:
    if shutil.which("kamailio") is None or shutil.which("kamcmd") is None:
        pytest.fail("kamailio missing (Debian package kamailio; bash tests/run.sh installs it)")
    started: list[Kamailio] = []
    yield started
    for k in started:
        k.stop()


def _calls(proxy: Kamailio, workdir: Path, calls: int, hold_ms: int) -> tuple[Counter[int], list[str]]:
    """`calls` calls at once through the proxy; (answering bridge port -> count, Record-Route values)."""
    result = peers.run_sipp(
        "uac_via_proxy",
        proxy.port,
        calls=calls,
        rate=50,
        workdir=workdir,
        timeout=hold_ms / 1000 + 25,
        trace_msg=True,
        extra_args=["-d", str(hold_ms)],
    )
    detail = (
        f"SIPp rc={result.returncode}\n{result.errors[-1500:]}\n{result.logs}\nkamailio:\n{proxy.log[-3000:]}"
    )
    assert (result.count("ANSWERED"), result.count("CLOSED"), result.count("REJECTED")) == (
        calls,
        calls,
        0,
    ), detail
    assert result.returncode == 0, detail
    by_bridge: Counter[int] = Counter()
    routes = []
    for line in result.log_events["ANSWERED"]:
        m = ANSWERED.match(line)
        assert m, line
        by_bridge[int(m.group(2))] += 1
        routes.append(m.group(3))
    return by_bridge, routes
