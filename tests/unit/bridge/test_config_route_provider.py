"""A provider per config route: `serve --config` gives each route's provider its own plan (key from
the variable the file names, URL, rollover scaled from that provider's cap) and each call the plan of its route
(bridge/cli/ops.py, bridge/server/plans.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import commands as cli
from bridge.cli.config import ConfigError, load
from bridge.cli.ops import RoutedApplication, server_config
from bridge.server.api import Application, Server, ServerConfig
from bridge.server.plans import ECHO_LOCAL_KEY, ProviderEndpoint, ProviderPlans
from sip.leg import CallIdentity

ROUTED = """
[defaults]
provider = "echo"
[providers.xai]
key_env = "TEST_XAI_KEY"
url = "ws://127.0.0.1:9/xai"
[providers.gemini-live]
key_env = "TEST_GEMINI_KEY"
[[routes]]
name = "grok"
number = "100"
provider = "xai"
[[routes]]
name = "gemini"
number = "200"
provider = "gemini-live"
[[routes]]
name = "echo-too"
number = "300"
provider = "echo"
[[routes]]
name = "rest"
"""

ENV = {"TEST_XAI_KEY": "xai-key-0123456789", "TEST_GEMINI_KEY": "gem-key-0123456789"}


def _identity(called: str) -> CallIdentity:
    return CallIdentity("call-1", "abc@h", "sip:a@h", f"sip:{called}@h", called, "127.0.0.1:5")


def _config(tmp_path: Path) -> ServerConfig:
    path = tmp_path / "bridge.toml"
    path.write_text(ROUTED)
    return server_config(load(path), ENV)


def test_route_providers_get_their_own_key_url_and_rollover(tmp_path: Path) -> None:
    sc = _config(tmp_path)
    assert sc.provider == "echo"
    by_name = {ep.name: ep for ep in sc.route_providers}
    assert set(by_name) == {"xai", "gemini-live"}  # echo is the default: no plan of its own
    assert (by_name["xai"].key, by_name["xai"].url) == (ENV["TEST_XAI_KEY"], "ws://127.0.0.1:9/xai")
    assert by_name["gemini-live"].key == ENV["TEST_GEMINI_KEY"]
    plans = ProviderPlans(sc)
    xai, xai_rollover = plans.for_call("xai")
    gemini, gemini_rollover = plans.for_call("gemini-live")
    default, _ = plans.for_call(None)
    assert (xai.kind.name, xai.key, xai.url) == ("xai", ENV["TEST_XAI_KEY"], "ws://127.0.0.1:9/xai")
    assert (gemini.kind.name, gemini.url) == ("gemini-live", None)
    assert (default.kind.name, default.key) == ("openai-live", ECHO_LOCAL_KEY)  # echo: the embedded fake
    assert plans.for_call("echo") == plans.default and plans.for_call("unknown") == plans.default
    # Rollover scales from each provider's own cap (xAI 30 min, Gemini's connection lifetime).
    assert xai_rollover is not None and gemini_rollover is not None
    assert xai_rollover.hard_stop_ms != gemini_rollover.hard_stop_ms


def test_the_embedded_fake_serves_every_echo_plan(tmp_path: Path) -> None:
    sc = ServerConfig(
        provider="xai",
        key="k-xai-123",
        route_providers=(ProviderEndpoint("echo", ECHO_LOCAL_KEY),),
    )
    plans = ProviderPlans(sc)
    assert plans.embedded
    plans.embed("ws://127.0.0.1:4711/v1/live")
    assert plans.for_call("echo")[0].url == "ws://127.0.0.1:4711/v1/live"
    assert plans.default[0].url is None  # the default is xai at its own endpoint
    assert not ProviderPlans(ServerConfig(provider="xai", key="k")).embedded


def test_a_route_provider_without_its_key_refuses_the_start(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(ROUTED)
    result = CliRunner().invoke(
        cli.main, ["serve", "--config", str(path)], env={"TEST_XAI_KEY": "x" * 12, "TEST_GEMINI_KEY": ""}
    )
    assert result.exit_code == 2
    assert "TEST_GEMINI_KEY" in result.output and "x" * 12 not in result.output


def test_a_route_provider_that_cannot_do_client_turns_refuses_the_start(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(ROUTED.replace('provider = "echo"\n', 'provider = "xai"\nturn_detection = "client"\n', 1))
    with pytest.raises(ConfigError, match="gemini-live"):
        server_config(load(path), ENV)


def test_each_call_gets_its_routes_provider(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(ROUTED)
    app = RoutedApplication(Application(), load(path))

    async def providers() -> list[str | None]:
        return [(await app.setup(_identity(n))).provider for n in ("100", "200", "300", "999")]

    assert asyncio.run(providers()) == ["xai", "gemini-live", "echo", None]


def test_serve_builds_a_server_with_the_route_providers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    servers: list[Server] = []

    def fake_run(server: Server, event_loop: str) -> int:
        servers.append(server)
        return 0

    monkeypatch.setattr(cli, "_run_server", fake_run)
    path = tmp_path / "bridge.toml"
    path.write_text(ROUTED)
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(path)], env=ENV)
    assert result.exit_code == 0, result.output
    (server,) = servers
    assert [ep.name for ep in server.config.route_providers] == ["xai", "gemini-live"]
