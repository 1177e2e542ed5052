"""One configuration (DESIGN §3.7): every row of bridge.cli.config.OPTIONS, flag and file key alike, reaches what
`serve` runs, and both through one path. Row by row (generated from the table: a new row is covered, or fails
here until it has an example): `serve FLAG VALUE` and `serve --config F` where F holds the row's key give the
same server (its ServerConfig, the application's webhook, the logging), and both differ from `serve` without
either, so a key or a flag wired on one path only, or on none, fails."""

from __future__ import annotations

import dataclasses
import json
import ssl
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from bridge.cli import commands as cli
from bridge.cli import ops
from bridge.cli.config import CLI_OPTIONS, OPTIONS, Option
from bridge.cli.ops import RoutedApplication
from bridge.server.api import Server
from providers.fakes.gemini_live import ensure_cert

PROVIDER_KEYS = ("OPENAI_API_KEY", "XAI_API_KEY", "GEMINI_API_KEY", "PARLORA_WEBHOOK_SECRET")

# Every flag `serve` had before the table (tests, README and docs use them): each still works.
FLAGS_BEFORE_THE_TABLE = """
--sip --rtp-port --provider --provider-url --provider-ca --instructions --engine --max-calls --http
--http-token-env --reservoir-bytes --residence-ms --failure-message --webhook --webhook-timeout --webhook-ca
--session-cap-ms --rollover-after-ms --rollover-deadline-ms --rollover-hard-stop-ms --rollover-overlap-ms
--no-rollover --turn-detection --end-call-tool --transfer-target --send-dtmf-tool --dtmf-to-model
--provider-append-ms --allow --drop-unknown --invite-rate --options-rate --inbound-auth --allow-any --register
--auth-user --keepalive --external-address --nat --rtp-source --tls --cert --key --tls-ca --srtp
--max-call-duration --rtp-timeout --log-level --config --log-format --drain-timeout --cdr --record
""".split()


@pytest.fixture(scope="module")
def materials(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What the examples' @-names stand for: a certificate (also a CA file), its key, a WAV, a directory."""
    base = tmp_path_factory.mktemp("materials")
    cert, key, _ = ensure_cert(None, None, str(base))
    wav = base / "failed.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * 800)
    return {"@cert": cert, "@key": key, "@wav": str(wav), "@dir": str(base)}


def _expand(tokens: tuple[str, ...], materials: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and environment of a row's example/needs: @-names replaced, "@env NAME=VALUE" into the env."""
    argv: list[str] = []
    env: dict[str, str] = {}
    items = iter(tokens)
    for token in items:
        if token == "@env":
            name, _, value = next(items).partition("=")
            env[name] = value
            continue
        for name, path in materials.items():
            if token.startswith(name):
                token = path + token[len(name) :]
        argv.append(token)
    return argv, env


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def _file_text(row: Option, argv: list[str], needs: list[str]) -> str:
    """The config file setting the row's key to what its flag's value means (`Option.values`, as click parses
    the value), under the table the key names."""
    param = row.click_option()
    raw: Any = True if row.is_flag else (tuple(argv) if row.multiple else argv[0])
    with click.Context(click.Command("serve")) as ctx:
        value = param.type_cast_value(ctx, raw)
    lines = [f"{k} = {_toml(v)}" for k, v in row.values(value).items()]
    table = row.key.split(".", 1)[0]
    if row.name == "register":  # a trunk per registrar
        return "".join(f'[[trunks]]\nname = "cli"\nregistrar = {_toml(v)}\n' for v in value)
    if table == "trunks[]":
        head = '[[trunks]]\nname = "cli"'  # the trunk the command line makes has this name
    elif table in ("providers", "pricing"):  # the provider chosen's table
        head = f"[{table}.{needs[needs.index('--provider') + 1]}]"
    else:
        head = f"[{table}]"
    return "\n".join([head, *lines]) + "\n"


def _normal(value: object) -> object:
    """What serve runs, comparable: an SSL context by the CA certificates it loaded."""
    if isinstance(value, ssl.SSLContext):
        return ("ssl", tuple(sorted(str(c.get("serialNumber")) for c in value.get_ca_certs())))
    if isinstance(value, tuple):
        return tuple(_normal(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple((f.name, _normal(getattr(value, f.name))) for f in dataclasses.fields(value)),
        )
    return value


@pytest.fixture
def serve_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Run `serve ARGV` (nothing is started): what it would run, normalised, or the refusal's output."""
    for name in PROVIDER_KEYS:
        monkeypatch.delenv(name, raising=False)
    servers: list[Server] = []
    logging_set: list[tuple[str, str]] = []
    monkeypatch.setattr(cli, "_run_server", lambda server, loop: servers.append(server) or 0)
    monkeypatch.setattr(cli, "_setup_logging", lambda level: logging_set.append(("level", level)))
    monkeypatch.setattr(ops, "use_json_logs", lambda: logging_set.append(("format", "json")))

    def run(argv: list[str], env: dict[str, str]) -> object:
        servers.clear()
        logging_set.clear()
        result = CliRunner().invoke(cli.main, ["serve", *argv], env=env)
        if result.exit_code == 2 and not servers:
            return ("refused", result.output)
        assert result.exit_code == 0 and servers, f"serve {argv}: {result.output}"
        (server,) = servers
        app = server.application
        assert isinstance(app, RoutedApplication)
        webhook = getattr(app._inner, "_config", None)
        ctx = webhook.ssl_context if webhook is not None else None
        return _normal((server.config, webhook, ctx, tuple(logging_set)))

    yield run


def test_every_row_has_an_example_and_every_serve_option_a_row() -> None:
    names = {p.name for p in cli.serve.params} - {"config"}
    assert names == set(CLI_OPTIONS), names ^ set(CLI_OPTIONS)
    assert [o.name for o in OPTIONS if not o.example and not o.is_flag] == []
    assert len({o.name for o in OPTIONS}) == len(OPTIONS)


def test_every_flag_spelling_from_before_the_table_still_works() -> None:
    spelled = {flag for p in cli.serve.params for flag in p.opts}
    assert set(FLAGS_BEFORE_THE_TABLE) <= spelled, set(FLAGS_BEFORE_THE_TABLE) - spelled


@pytest.mark.parametrize("row", OPTIONS, ids=[o.flag for o in OPTIONS])
def test_flag_and_file_key_give_the_same_server(
    row: Option, serve_runs: Any, materials: dict[str, str], tmp_path: Path
) -> None:
    example, _ = _expand(row.example, materials)
    needs, env = _expand(row.needs, materials)
    baseline = serve_runs(needs, env)
    if (
        baseline[0] == "refused"
    ):  # a row its needs need (--cert beside --tls and --key): another value instead
        assert row.other, f"{row.flag}: its needs alone are refused and it has no other value: {baseline}"
        baseline = serve_runs([*needs, row.flag, *_expand(row.other, materials)[0]], env)
        assert baseline[0] != "refused", baseline  # type: ignore[index]
    by_flag = serve_runs([*needs, row.flag, *example], env)
    config = tmp_path / "bridge.toml"
    config.write_text(_file_text(row, example, needs))
    by_file = serve_runs(["--config", str(config), *needs], env)
    assert by_flag[0] != "refused", by_flag  # type: ignore[index]
    assert by_flag == by_file, f"{row.flag} and {row.key} differ:\n{config.read_text()}"
    assert by_flag != baseline, f"{row.flag} / {row.key} changes nothing serve runs"


def test_the_manual_lists_every_option_as_the_table_says() -> None:
    from bridge.cli.config import options_reference

    manual = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    start = manual.index("<!-- generated from bridge.cli.config.OPTIONS")
    table = manual[manual.index("\n", start) + 1 : manual.index("<!-- end of the generated table -->")]
    assert table == options_reference(), (
        "docs/configuration.md is stale; its table is now:\n" + options_reference()
    )
