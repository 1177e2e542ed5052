"""`parlora-bridge call`: serve's provider and trunk options, the same click.Option objects, build
the server the call is placed through (native engine, one call slot, the digest user and password)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from bridge.cli import commands as cli
from bridge.server.api import Server


@pytest.fixture
def placed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Server, str, dict[str, Any]]]:
    calls: list[tuple[Server, str, dict[str, Any]]] = []

    async def fake_place(server: Server, target: str, **kwargs: Any) -> int:
        calls.append((server, target, kwargs))
        return 0

    monkeypatch.setattr(cli, "place_call", fake_place)
    return calls


def test_call_shares_serves_option_objects() -> None:
    serve_params = {p.name: p for p in cli.serve.params}
    call_params = {p.name: p for p in cli.call_command.params}
    for name in ("provider", "instructions", "webhook_url", "srtp", "tls", "max_call_duration", "rtp_port"):
        assert call_params[name] is serve_params[name]  # one definition, not a copy
    # restated with call's own default and words: any free port, the digest user for challenges
    assert (
        call_params["sip_addr"].default == "127.0.0.1:0" and serve_params["sip_addr"].default != "127.0.0.1:0"
    )
    assert "401/407" in (call_params["auth_user"].help or "")
    assert "register" not in call_params and "http_addr" not in call_params  # serve's own


def test_call_builds_the_server_from_the_shared_options(
    placed: list[tuple[Server, str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARLORA_SIP_PASSWORD", "pw-acct")
    args = [
        "call",
        "sip:+15550001@127.0.0.1:5999",
        "--auth-user",
        "acct",
        "--from",
        "sip:acct@trunk.example",
        "--ring-timeout",
        "12",
        "--instructions",
        "Confirm the order.",
        "--srtp",
        "offer",
        "--max-call-duration",
        "120",
        "--end-call-tool",
    ]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    [(server, target, kwargs)] = placed
    c = server.config
    assert target == "sip:+15550001@127.0.0.1:5999"
    assert kwargs == {"from_uri": "sip:acct@trunk.example", "ring_timeout_s": 12.0}
    assert (c.engine, c.max_calls, c.sip, c.provider) == ("native", 1, ("127.0.0.1", 0), "echo")
    assert (c.auth_user, c.register_password, c.register) == ("acct", "pw-acct", ())
    assert c.instructions == "Confirm the order." and c.telephony.end_call
    assert c.srtp == "optional" and c.max_call_duration_s == 120.0


def test_call_refuses_a_target_that_is_not_a_sip_uri(
    placed: list[tuple[Server, str, dict[str, Any]]],
) -> None:
    for target in ("tel:+15550001", "sip:trunk.example.com", "not a uri"):
        result = CliRunner().invoke(cli.main, ["call", target])
        assert result.exit_code == 2 and "TARGET" in result.output, result.output
    assert placed == []


def test_call_refuses_options_that_do_not_fit_as_serve_does(
    placed: list[tuple[Server, str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XAI_API_KEY", raising=False)
    result = CliRunner().invoke(cli.main, ["call", "sip:1@127.0.0.1", "--tls", "127.0.0.1:5061"])
    assert result.exit_code == 2 and "--tls needs --cert FILE and --key FILE" in result.output
    result = CliRunner().invoke(cli.main, ["call", "sip:1@127.0.0.1", "--provider", "xai"])
    assert result.exit_code == 2 and "XAI_API_KEY" in result.output
    assert placed == []


CONFIG = """
[listeners]
sip_udp = "127.0.0.1:5060"        # serve's: a running serve holds it, call listens where --sip says
http = "127.0.0.1:8080"
[defaults]
provider = "echo"
[[trunks]]
name = "carrier"
registrar = "sip:acct@sip.carrier.example"
auth_user = "acct"
password_env = "CARRIER_PW"
[[routes]]
name = "reminders"
direction = "outbound"
greeting = "Say: a reminder."
"""


def test_call_with_a_config_file_takes_its_trunks_and_routes_but_not_its_listeners(
    placed: list[tuple[Server, str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(CONFIG)
    monkeypatch.setenv("CARRIER_PW", "pw-carrier")
    args = ["call", "+4930555", "--config", str(path), "--trunk", "carrier", "--route", "reminders"]
    result = CliRunner().invoke(cli.main, [*args, "--rtp-port", "14000"])
    assert result.exit_code == 0, result.output
    [(server, target, kwargs)] = placed
    c = server.config
    assert target == "+4930555" and kwargs["trunk"] == "carrier" and kwargs["route"] == "reminders"
    assert (c.sip, c.http, c.register, c.max_calls, c.engine) == (("127.0.0.1", 0), None, (), 1, "native")
    assert c.rtp_port == 14000  # the command line over the file, as for serve
    [trunk] = c.dial_trunks
    assert (trunk.name, trunk.credentials) == ("carrier", ("acct", "pw-carrier"))
    server.application.check_outbound(target, "reminders")  # the file's outbound route is known
