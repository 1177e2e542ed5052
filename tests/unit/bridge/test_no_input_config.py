"""The no-input timeout's configuration: `--no-input-timeout` / `[defaults] no_input_timeout_s` for every call, a
route's `no_input_timeout_s` for its own; off by default; too short a timeout refuses to start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.cli.config import ConfigError, load
from bridge.cli.ops import RoutedApplication
from bridge.engine.no_input import NoInputOptions
from bridge.server.api import Application, CallSetup, Server, ServerConfig, _no_input
from sip.leg import CallIdentity
from tests.support.serve_capture import capture_servers, config_file, serve


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Server]:
    return capture_servers(monkeypatch)


def identity(called: str) -> CallIdentity:
    return CallIdentity("c1", "sip-c1", "sip:a@x", f"sip:{called}@y", called, "127.0.0.1:5000", (), "inbound")


def test_off_by_default_on_by_flag_or_file(tmp_path: Path, captured: list[Server]) -> None:
    assert serve([], captured)[0] == 0
    assert captured[0].config.no_input_timeout_s == 0.0
    assert _no_input(CallSetup(), captured[0].config) is None  # no surprise hang-up
    assert serve(["--no-input-timeout", "20"], captured)[0] == 0
    assert captured[0].config.no_input_timeout_s == 20.0
    path = config_file(tmp_path, "[defaults]\nno_input_timeout_s = 12.5\n")
    assert serve(["--config", str(path)], captured)[0] == 0
    assert captured[0].config.no_input_timeout_s == 12.5
    assert _no_input(CallSetup(), captured[0].config) == NoInputOptions(12_500)
    assert serve(["--config", str(path), "--no-input-timeout", "off"], captured)[0] == 0  # the flag wins
    assert captured[0].config.no_input_timeout_s == 0.0


def test_a_timeout_under_five_seconds_is_refused(tmp_path: Path, captured: list[Server]) -> None:
    status, output = serve(["--no-input-timeout", "3"], captured)
    assert status == 2 and "--no-input-timeout" in output and "seconds >= 5" in output and not captured
    with pytest.raises(
        ConfigError, match=r"routes\[0\]\.no_input_timeout_s: expected a number of seconds >= 5"
    ):
        load(config_file(tmp_path, '[[routes]]\nname = "a"\nno_input_timeout_s = 2\n'))
    with pytest.raises(ConfigError, match=r"defaults\.no_input_timeout_s: expected"):
        load(config_file(tmp_path, '[defaults]\nno_input_timeout_s = "soon"\n'))


def test_a_route_sets_its_own_or_switches_it_off(tmp_path: Path) -> None:
    text = (
        "[defaults]\nno_input_timeout_s = 30\n"
        '[[routes]]\nname = "desk"\nnumber = "100"\nno_input_timeout_s = 8\n'
        '[[routes]]\nname = "care"\nnumber = "101"\nno_input_timeout_s = "off"\n'
        '[[routes]]\nname = "rest"\n'
    )
    config = load(config_file(tmp_path, text))
    app = RoutedApplication(Application(), config)
    setups = [asyncio.run(app.setup(identity(n))) for n in ("100", "101", "102")]
    assert [s.no_input_timeout_s for s in setups] == [8.0, 0.0, None]
    server = ServerConfig(no_input_timeout_s=config.defaults.no_input_timeout_s)
    assert [_no_input(s, server) for s in setups] == [NoInputOptions(8_000), None, NoInputOptions(30_000)]


def test_the_server_gives_each_call_its_setups_timeout_over_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Server._run_call builds the call's session core with the timeout of its setup (its route's), else the
    server's (`[defaults]`, `--no-input-timeout`)."""
    from bridge.server import api

    built: list[object] = []

    class Built(Exception):
        pass

    def session(*args: object, **kwargs: object) -> object:
        built.append(kwargs["options"])
        raise Built

    class Routed(Application):
        async def setup(self, call: CallIdentity) -> CallSetup:
            return CallSetup(no_input_timeout_s=8.0 if call.request_user == "100" else None)

    class Leg:
        def __init__(self, identity: CallIdentity) -> None:
            self.identity = identity

    monkeypatch.setattr(api, "CallSession", session)

    async def run() -> None:
        server = Server(Routed(), ServerConfig(no_input_timeout_s=20.0))
        for called in ("100", "101"):
            with pytest.raises(Built):
                await server._run_call(Leg(identity(called)))  # type: ignore[arg-type]

    asyncio.run(run())
    assert [o.no_input for o in built] == [NoInputOptions(8_000), NoInputOptions(20_000)]  # type: ignore[attr-defined]
