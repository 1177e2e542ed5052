"""bridge/cli/config.py: the config file's schema and errors, route selection, the environment check and the
command line's overrides; deploy/example.toml loads and is what its comments say."""

from __future__ import annotations

import wave
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bridge.cli import config as cfg
from bridge.cli.config import ConfigError, Route, apply_options, compile_pattern, load, select_route
from providers.limits import LimitOverrides

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "example.toml"


def _write(tmp_path: Path, text: str, name: str = "bridge.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _problems(tmp_path: Path, text: str) -> tuple[str, ...]:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(path)
    return info.value.problems


# --- the example file ---


def test_example_config_loads_with_every_section() -> None:
    c = load(EXAMPLE)
    assert c.listeners.sip_udp == ("0.0.0.0", 5060) and c.listeners.http == ("127.0.0.1", 8080)
    assert (c.engine.name, c.engine.max_calls, c.engine.rtp_port_low, c.engine.rtp_port_high) == (
        "native",
        200,
        10000,
        10999,
    )
    assert [r.name for r in c.routes] == ["support-de", "support", "sales", "everything-else"]
    support = c.routes[0]
    assert support.instructions is not None and support.instructions.startswith("You answer the support line")
    assert [t.name for t in support.tools] == ["lookup_order"]
    assert support.tools[0].parameters["required"] == ["order"]
    assert [t.name for t in c.trunks] == ["office-pbx", "carrier"]
    assert c.trunks[1].allow == ("198.51.100.0/24", "2001:db8::/32") and c.trunks[1].srtp == "require"
    assert c.provider("openai-realtime").model == "gpt-realtime"
    assert c.telephony_options().transfer_targets == {"team": "sip:team@pbx.example.com"}
    rollover = c.rollover_options("gemini-live")
    assert rollover is not None and rollover.cap_ms == 10 * 60_000 and rollover.overlap_ms == 3000
    assert c.limit_overrides() == LimitOverrides(None, 3000)


def test_example_config_routes_calls_as_its_comments_say() -> None:
    routes = load(EXAMPLE).routes
    assert select_route(routes, "+49301234567", [("x-line", " support")]).name == "support-de"  # type: ignore[union-attr]
    assert select_route(routes, "+49301234567").name == "everything-else"  # type: ignore[union-attr]
    assert select_route(routes, "08001234").name == "support"  # type: ignore[union-attr]
    assert select_route(routes, "0800").name == "everything-else"  # type: ignore[union-attr]  # "." needs one
    assert select_route(routes, "+493012345678").name == "sales"  # type: ignore[union-attr]


def test_example_config_environment_problems_name_variables_never_values() -> None:
    c = load(EXAMPLE)
    problems = cfg.environment_problems(c, {})
    assert {p.variable for p in problems} == {
        "OPENAI_API_KEY",
        "GEMINI_API_KEY",
        "PARLORA_SIP_PASSWORD",
        "PARLORA_CARRIER_PASSWORD",
        "PARLORA_HTTP_TOKEN",
        "PARLORA_WEBHOOK_SECRET",
    }
    assert (
        str(problems[0])
        == "providers.openai-realtime.key_env: environment variable OPENAI_API_KEY is not set"
    )
    full = {p.variable: "sk-secret-value" for p in problems}
    assert cfg.environment_problems(c, full) == ()
    assert cfg.environment_problems(c, {**full, "GEMINI_API_KEY": ""})[0].variable == "GEMINI_API_KEY"


# --- errors: file, key path, what was expected ---


def test_bad_route_provider_names_file_path_and_choices(tmp_path: Path) -> None:
    text = "".join(f'[[routes]]\nname = "r{i}"\nnumber = "{i}"\n' for i in range(2))
    problems = _problems(tmp_path, text + '[[routes]]\nname = "r2"\nprovider = "gpt"\n')
    assert problems == (
        f"{tmp_path / 'bridge.toml'}: routes[2].provider: expected one of openai-live, "
        'openai-realtime, gemini-live, xai, echo; got "gpt"',
    )


def test_unknown_keys_are_errors_with_a_suggestion(tmp_path: Path) -> None:
    problems = _problems(tmp_path, '[defaults]\ninstruction = "hi"\n[engines]\nname = "native"\n')
    assert any('defaults.instruction: unknown key (did you mean "instructions"?)' in p for p in problems)
    assert any('engines: unknown key (did you mean "engine"?)' in p for p in problems)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        '[engine]\nname = "sofia"\nmax_calls = 0\nrtp_ports = "9-8"\n'
        '[listeners]\nhttp = "localhost:99999"\n[logging]\nlevel = 3\n',
    )
    paths = [p.split(": ")[1] for p in problems]
    assert paths == ["listeners.http", "engine.name", "engine.rtp_ports", "engine.max_calls", "logging.level"]
    assert 'expected one of pjsua2, native; got "sofia"' in problems[1]
    assert "expected an integer >= 1; got 0" in problems[3]
    assert "got 3" in problems[4]


def test_a_secret_pasted_into_key_env_is_refused_and_not_echoed(tmp_path: Path) -> None:
    secret = "sk-proj-abcdef0123456789"
    problems = _problems(tmp_path, f'[providers.openai-live]\nkey_env = "{secret}"\n')
    assert len(problems) == 1 and "providers.openai-live.key_env" in problems[0]
    assert "NAME of an environment variable" in problems[0] and secret not in problems[0]


def test_a_provider_section_of_an_unknown_name_or_not_a_table_is_refused(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "[providers.echo]\n[providers.gpt]\n[providers]\nxai = 3\n")
    assert [p.split(": ")[1] for p in problems] == ["providers.echo", "providers.gpt", "providers.xai"]
    assert "expected a provider section named one of" in problems[0]
    assert (
        problems[0].endswith('(echo needs no section); got "echo"') and "needs no section" not in problems[1]
    )
    assert "expected a table; got 3" in problems[2]


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    assert "not valid TOML" in _problems(tmp_path, "[routes\n")[0]
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "absent.toml")


def test_types_are_checked(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        'routes = "all"\n[telephony]\nend_call_tool = "yes"\n[[trunks]]\nname = "t"\nallow = "10.0.0.0/8"\n',
    )
    assert any('routes: expected an array of tables ([[routes]]); got "all"' in p for p in problems)
    assert any('telephony.end_call_tool: expected true or false; got "yes"' in p for p in problems)
    assert any('trunks[0].allow: expected an array of strings; got "10.0.0.0/8"' in p for p in problems)


def test_route_checks(tmp_path: Path) -> None:
    (tmp_path / "empty.md").write_text("  \n")
    problems = _problems(
        tmp_path,
        """
[[routes]]
name = "a"
number = "1"
pattern = "_1."
[[routes]]
name = "b"
pattern = "_12.3"
instructions = "x"
instructions_file = "missing.md"
[[routes]]
name = "c"
instructions_file = "empty.md"
tools = [{ name = "end_call" }, { name = "t", parameters = { type = "array" } }]
[[routes]]
name = "c"
header = { name = "X Bad" , value = "v" }
[[routes]]
number = "5"
""",
    )
    text = "\n".join(problems)
    assert "routes[0].pattern: give number or pattern, not both" in text
    assert "routes[1].pattern: \"_12.3\": '.' at position 3: only as the last character" in text
    assert "routes[1].instructions_file: expected an existing file" in text
    assert "routes[1].instructions_file: give instructions or instructions_file, not both" in text
    assert "routes[2].instructions_file:" in text and "is empty" in text
    assert "routes[2].tools[0].name: end_call is a telephony tool" in text
    assert 'routes[2].tools[1].parameters: expected a JSON schema object (type = "object")' in text
    assert 'routes[3].name: "c" names an earlier route too' in text
    assert 'routes[3].header.name: expected a SIP header name; got "X Bad"' in text
    assert "routes[4].name: missing" in text


def test_a_catch_all_before_other_routes_is_an_error(tmp_path: Path) -> None:
    problems = _problems(tmp_path, '[[routes]]\nname = "all"\n[[routes]]\nname = "late"\nnumber = "1"\n')
    assert problems == (
        f"{tmp_path / 'bridge.toml'}: routes[1]: never matches: routes[0] (all) matches every call before it",
    )


def test_trunk_checks(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """
[[trunks]]
name = "t"
registrar = "pbx.example.com"
allow = ["192.0.2.1/24", "nonsense"]
srtp = "require"
external_address = "my-host"
[[trunks]]
name = "t"
""",
    )
    text = "\n".join(problems)
    assert 'trunks[0].registrar: expected "sip:USER@HOST[:PORT]"; got "pbx.example.com"' in text
    assert "trunks[0].allow[0]: expected a network like 192.0.2.0/24" in text and "host bits set" in text
    assert "trunks[0].allow[1]:" in text
    assert "trunks[0].srtp: SDES keys travel only over TLS" in text
    assert 'trunks[0].external_address: expected an IP address; got "my-host"' in text
    assert 'trunks[1].name: "t" names an earlier trunk too' in text


def test_cross_checks_turn_detection_and_rollover(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        '[defaults]\nprovider = "gemini-live"\nturn_detection = "client"\n'
        "[rollover]\nafter_ms = 500000\ndeadline_ms = 400000\n",
    )
    text = "\n".join(problems)
    assert 'defaults.turn_detection: "client" needs providers that can switch turn detection off' in text
    assert "rollover: for gemini-live: rollover ages must satisfy" in text


def test_failure_message_must_be_8k_mono_pcm(tmp_path: Path) -> None:
    with wave.open(str(tmp_path / "loud.wav"), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0" * 64)
    problems = _problems(tmp_path, '[recovery]\nfailure_message = "loud.wav"\n')
    assert "recovery.failure_message:" in problems[0] and "8 kHz mono 16-bit" in problems[0]


def test_an_empty_file_is_the_command_lines_defaults(tmp_path: Path) -> None:
    c = load(_write(tmp_path, ""))
    assert c.listeners == cfg.Listeners() and c.engine == cfg.Engine() and c.routes == ()
    assert c.default_provider({}) == "echo" and c.default_provider({"OPENAI_API_KEY": "k"}) == "openai-live"
    assert cfg.environment_problems(c, {}) == ()  # echo needs no key


def test_only_keys_in_use_are_needed(tmp_path: Path) -> None:
    c = load(
        _write(
            tmp_path,
            '[defaults]\nprovider = "echo"\n[providers.xai]\nkey_env = "MY_XAI"\n'
            '[[routes]]\nname = "r"\nnumber = "1"\nprovider = "gemini-live"\n',
        )
    )
    assert [(p.path, p.variable) for p in cfg.environment_problems(c, {})] == [
        ("providers.gemini-live (default key variable)", "GEMINI_API_KEY")
    ]


# --- route selection ---


def _route(name: str, **kw: object) -> Route:
    pattern = kw.get("pattern")
    regex = compile_pattern(pattern) if isinstance(pattern, str) else None
    return Route(name=name, _regex=regex, **kw)  # type: ignore[arg-type]


def test_select_route_first_match_wins_and_headers_narrow() -> None:
    header = cfg.HeaderMatch("X-Tenant", "acme")
    routes = [
        _route("acme", pattern="_1XX", header=header),
        _route("exact", number="100"),
        _route("ext", pattern="_[1-3]XX"),
        _route("rest"),
    ]
    assert select_route(routes, "100", [("x-tenant", "acme")]).name == "acme"  # type: ignore[union-attr]
    assert select_route(routes, "100", [("X-Tenant", "other")]).name == "exact"  # type: ignore[union-attr]
    assert select_route(routes, "301").name == "ext"  # type: ignore[union-attr]
    assert select_route(routes, "401").name == "rest"  # type: ignore[union-attr]
    assert select_route(routes[:3], "401") is None
    assert select_route([], "1") is None


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("_NXX", ["200", "999"], ["100", "20", "2000"]),
        ("_ZX", ["10", "99"], ["01", "1"]),
        ("_+49.", ["+491", "+4930123"], ["+49", "0049"]),
        ("_0800!", ["0800", "08001"], ["080"]),
        ("_[137]x#", ["10#", "79#"], ["20#", "10"]),
        ("_*[0-2]X", ["*05", "*29"], ["*35", "05"]),
    ],
)
def test_patterns(pattern: str, yes: list[str], no: list[str]) -> None:
    regex = compile_pattern(pattern)
    assert [bool(regex.fullmatch(n)) for n in yes] == [True] * len(yes)
    assert [bool(regex.fullmatch(n)) for n in no] == [False] * len(no)


@pytest.mark.parametrize("bad", ["123", "_", "_1.2", "_[]", "_[5-1]", "_[1-]", "_12a", "_1?"])
def test_bad_patterns_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        compile_pattern(bad)


@given(st.text(alphabet="0123456789", min_size=1, max_size=12))
def test_an_x_per_digit_matches_exactly_that_many_digits(number: str) -> None:
    assert compile_pattern("_" + "X" * len(number)).fullmatch(number)
    assert not compile_pattern("_" + "X" * (len(number) + 1)).fullmatch(number)
    assert compile_pattern("_" + number[0] + "!").fullmatch(number)


# --- command-line overrides ---


def test_cli_options_override_the_file(tmp_path: Path) -> None:
    c = load(EXAMPLE)
    out = apply_options(
        c,
        {
            "sip_addr": "127.0.0.1:5099",
            "max_calls": 50,
            "provider": "xai",
            "provider_url": "ws://127.0.0.1:9/x",
            "no_rollover": True,
            "transfer_targets": ("desk=sip:desk@pbx",),
            "log_level": "debug",
            "rtp_port": 20000,
        },
    )
    assert out.listeners.sip_udp == ("127.0.0.1", 5099) and out.listeners.http == c.listeners.http
    assert out.engine.max_calls == 50 and out.engine.rtp_port_low == 20000 and out.engine.name == "native"
    assert out.defaults.provider == "xai" and out.provider("xai").url == "ws://127.0.0.1:9/x"
    assert out.defaults.instructions == c.defaults.instructions  # not given: the file's stays
    assert out.rollover_options("xai") is None
    assert out.telephony.transfer_targets == (("desk", "sip:desk@pbx"),) and out.telephony.end_call_tool
    assert out.logging.level == "debug" and out.routes == c.routes
    assert apply_options(c, {}) == c


def test_cli_override_errors_name_the_option() -> None:
    with pytest.raises(ConfigError) as info:
        apply_options(cfg.BridgeConfig(), {"transfer_targets": ("desk",), "sip_addr": "host:x"})
    assert set(info.value.problems) == {
        'command line: --transfer-target: expected NAME=sip:URI; got "desk"',
        'command line: --sip: expected "HOST:PORT" with a port from 1 to 65535; got "host:x"',
    }
    with pytest.raises(ConfigError, match="--frobnicate: no configuration key"):
        apply_options(cfg.BridgeConfig(), {"frobnicate": 1})
    with pytest.raises(ConfigError, match="--provider-url/--provider-ca: need --provider"):
        apply_options(cfg.BridgeConfig(), {"provider_url": "ws://x"})


def test_cli_trunk_options(tmp_path: Path) -> None:
    none = apply_options(
        cfg.BridgeConfig(),
        {"register": ("sip:a@pbx", "sip:b@pbx"), "auth_user": "u", "allow": ("10.0.0.0/8",)},
    )
    assert [(t.name, t.registrar, t.auth_user, t.allow) for t in none.trunks] == [
        ("cli-0", "sip:a@pbx", "u", ("10.0.0.0/8",)),
        ("cli-1", "sip:b@pbx", "u", ("10.0.0.0/8",)),
    ]
    one = load(
        _write(tmp_path, '[[trunks]]\nname = "pbx"\nregistrar = "sip:x@pbx"\nallow = ["192.0.2.0/24"]\n')
    )
    over = apply_options(one, {"allow": ("10.1.0.0/16",), "srtp": "offer"})
    assert [(t.name, t.registrar, t.allow, t.srtp, t.transport) for t in over.trunks] == [
        ("pbx", "sip:x@pbx", ("10.1.0.0/16",), "offer", "tls")
    ]
    with pytest.raises(ConfigError, match="the file has 2 trunks"):
        apply_options(load(EXAMPLE), {"auth_user": "u"})
    with pytest.raises(ConfigError, match="--allow"):
        apply_options(cfg.BridgeConfig(), {"allow": ("10.0.0.1/8",)})
    with pytest.raises(ConfigError, match="--external-address"):
        apply_options(cfg.BridgeConfig(), {"external_address": "my-host"})
    nat = apply_options(cfg.BridgeConfig(), {"external_address": "203.0.113.9", "rtp_ports": "30000-30999"})
    assert nat.trunks[0].external_address == "203.0.113.9"
    assert (nat.engine.rtp_port_low, nat.engine.rtp_port_high) == (30000, 30999)


def test_given_options_keeps_what_the_user_typed_not_clicks_defaults() -> None:
    seen: dict[str, object] = {}

    @click.command()
    @click.option("--config", default=None)
    @click.option("--sip", "sip_addr", default="127.0.0.1:5060")
    @click.option("--max-calls", type=int, default=None)
    @click.option("--webhook-timeout", type=float, default=10.0)
    @click.option("--end-call-tool", is_flag=True)
    def serve(**_: object) -> None:
        seen.update(cfg.given_options(click.get_current_context()))

    result = CliRunner().invoke(serve, ["--config", "x.toml", "--max-calls", "7", "--end-call-tool"])
    assert result.exit_code == 0, result.output
    assert seen == {"max_calls": 7, "end_call_tool": True}
    assert apply_options(cfg.BridgeConfig(), seen).engine.max_calls == 7


def test_every_cli_option_of_serve_has_a_configuration_key() -> None:
    from bridge.cli.commands import serve

    names = {p.name for p in serve.params} - {"config"}
    assert names <= set(cfg.CLI_OPTIONS), sorted(names - set(cfg.CLI_OPTIONS))


# --- the deploy/ recipes: docker-compose.yml and the Asterisk and Kamailio files it and the README name ---

REPO = EXAMPLE.parents[1]


def _ini_sections(path: Path) -> list[tuple[str, dict[str, str]]]:
    """Asterisk's .conf: [name] sections (a name may repeat, one per type) of key=value lines."""
    sections: list[tuple[str, dict[str, str]]] = []
    for raw in path.read_text().splitlines():
        line = raw.split(";", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            sections.append((line[1:-1], {}))
        elif "=" in line and sections:
            key, _, value = line.partition("=")
            sections[-1][1][key.strip().rstrip(">").strip()] = value.strip()
    return sections


def test_compose_file_mounts_what_exists_and_asterisk_dials_the_bridge() -> None:
    import ipaddress
    import re

    import yaml  # PyYAML: test-only

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"asterisk", "bridge", "fake-provider"}
    assert services["asterisk"]["image"].startswith("andrius/asterisk")
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith("./") and (REPO / source).is_file(), (name, volume)
        if "build" in service:
            dockerfile = REPO / service["build"]["context"] / service["build"]["dockerfile"]
            copied = re.findall(r"^COPY (.+) \S+$", dockerfile.read_text(), re.MULTILINE)
            assert copied and all((REPO / src).exists() for line in copied for src in line.split()), copied
    subnet = ipaddress.ip_network(compose["networks"]["pbx"]["ipam"]["config"][0]["subnet"])
    ip = {name: s["networks"]["pbx"]["ipv4_address"] for name, s in services.items()}
    assert all(ipaddress.ip_address(a) in subnet for a in ip.values()) and len(set(ip.values())) == 3

    command = services["bridge"]["command"]
    sip = command[command.index("--sip") + 1]
    bridge_port = int(sip.rpartition(":")[2])
    fake_url = re.fullmatch(
        r"\$\{PARLORA_PROVIDER_URL-(ws://[\d.]+:\d+)\}", command[command.index("--provider-url") + 1]
    )
    assert fake_url is not None
    fake_command = services["fake-provider"]["command"]
    fake_port = fake_command[fake_command.index("--listen") + 1].rpartition(":")[2]
    assert fake_url.group(1) == f"ws://{ip['fake-provider']}:{fake_port}"
    assert command[command.index("--webrtc-address") + 1] == ip["bridge"]  # the Talk button's WebRTC address

    pjsip = _ini_sections(REPO / "deploy" / "asterisk" / "pjsip.conf")
    by_type = {(name, keys.get("type")): keys for name, keys in pjsip}
    assert by_type[("parlora-bridge", "aor")]["contact"] == f"sip:{ip['bridge']}:{bridge_port}"
    assert by_type[("parlora-bridge", "identify")]["match"] == ip["bridge"]
    softphone = by_type[("1001", "endpoint")]
    assert by_type[(softphone["auth"], "auth")]["username"] == "1001"

    dialplan = _ini_sections(REPO / "deploy" / "asterisk" / "extensions.conf")
    contexts = {name for name, _ in dialplan}
    assert softphone["context"] in contexts and by_type[("parlora-bridge", "endpoint")]["context"] in contexts
    dials = re.findall(
        r"Dial\(PJSIP/[^@,)]+@([\w-]+)", (REPO / "deploy" / "asterisk" / "extensions.conf").read_text()
    )
    assert dials and set(dials) == {"parlora-bridge"}
    endpoints = {name for name, keys in pjsip if keys.get("type") == "endpoint"}
    assert set(dials) <= endpoints

    rtp = dict(_ini_sections(REPO / "deploy" / "asterisk" / "rtp.conf"))["general"]
    published = [p for p in services["asterisk"]["ports"] if p.endswith("/udp") and "-" in p]
    assert published == [f"127.0.0.1:{rtp['rtpstart']}-{rtp['rtpend']}:{rtp['rtpstart']}-{rtp['rtpend']}/udp"]


def test_kamailio_dispatcher_list_names_unique_bridges_with_a_maxload() -> None:
    lines = [
        ln.split()
        for ln in (REPO / "deploy" / "kamailio" / "dispatcher.list").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines and all(len(parts) == 5 and parts[0] == "1" for parts in lines)
    attrs = [dict(kv.split("=") for kv in parts[4].split(";")) for parts in lines]
    assert len({a["duid"] for a in attrs}) == len(lines) == len({parts[1] for parts in lines})
    assert all(int(a["maxload"]) > 0 for a in attrs)
    cfg_text = (REPO / "deploy" / "kamailio" / "kamailio.cfg").read_text()
    assert 'ds_select_dst("1", "10")' in cfg_text and "record_route()" in cfg_text


def test_compose_bridge_command_passes_serves_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compose file's `serve` command, with its environment's defaults, is accepted by `serve` and by the
    engine's start check (off loopback: an allowlist, and the HTTP listener's token)."""
    import re

    import yaml  # PyYAML: test-only

    from bridge.cli import commands as cli
    from bridge.server import api
    from sip.engine import check_listen

    service = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["bridge"]

    def default(text: str) -> str:  # ${NAME-default} / ${NAME:-default}: compose's substitution, unset NAME
        return re.sub(r"\$\{[A-Z_]+:?-([^}]*)\}", r"\1", text)

    argv = [default(str(arg)) for arg in service["command"]]
    env = {k: default(str(v)) for k, v in service["environment"].items()}
    servers: list[api.Server] = []

    def fake_run(server: api.Server, event_loop: str) -> int:
        servers.append(server)
        return 0

    monkeypatch.setattr(cli, "_run_server", fake_run)
    result = CliRunner().invoke(cli.main, argv, env=env)
    assert result.exit_code == 0, result.output
    (server,) = servers
    assert check_listen(api._engine_config(server.config)).ok
    assert server.config.http_token == env["PARLORA_HTTP_TOKEN"]
    grace = int(str(service["stop_grace_period"]).rstrip("s"))
    assert server.config.drain_timeout_s < grace  # the drain ends before compose kills the container


def test_docker_compose_config_accepts_the_compose_file() -> None:
    """`docker-compose config` (the Debian package; it needs no container engine) parses and validates the
    file against the compose schema; a typo in a key or a bad interpolation fails here."""
    import shutil
    import subprocess

    import yaml

    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (tests/run.sh installs it)")
    done = subprocess.run(
        [exe, "-f", str(REPO / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    resolved = yaml.safe_load(done.stdout)
    assert {"asterisk", "bridge"} <= set(resolved["services"]), resolved["services"].keys()
