"""`serve --config FILE` and `config check FILE` (bridge/cli/ops.py): the file with the command line over it becomes
the server's ServerConfig; a bad file exits 2 with file, key path and what was expected; routes give each call
its instructions and greeting, and a call no route matches is refused with 404."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import commands as cli
from bridge.cli.config import load
from bridge.cli.ops import RoutedApplication
from bridge.engine.commands import AudioDiscontinuity, RecoveryChanged, RolloverChanged
from bridge.engine.delegations import JobChanged
from bridge.server import greeting
from bridge.server.api import Application, CallRefused, CallSetup, Server
from bridge.server.drain import drain
from bridge.server.jsonlog import JsonFormatter, secret_values
from bridge.server.observe import CallObserver
from bridge.server.session import CallSummary
from sip.leg import CallIdentity, PlayoutLeg
from tests.support.serve_capture import capture_servers

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "example.toml"

GOOD = """
[listeners]
sip_udp = "127.0.0.1:5070"
[engine]
rtp_ports = 12000
[defaults]
provider = "echo"
instructions = "default words"
greeting = "Say: hello from the defaults."
[[routes]]
name = "sales"
number = "100"
instructions = "sales words"
greeting = "Say: sales, good day."
[[routes]]
name = "support"
pattern = "_2XX"
header = { name = "X-Line", value = "support" }
instructions = "support words"
"""


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    return path


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Server]:
    """The Server `serve` would run, instead of running it."""
    return capture_servers(monkeypatch)


def test_serve_config_builds_the_server_from_the_file(tmp_path: Path, captured: list[Server]) -> None:
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(_file(tmp_path, GOOD))])
    assert result.exit_code == 0, result.output
    (server,) = captured
    c = server.config
    assert (c.provider, c.sip, c.rtp_port, c.instructions) == (
        "echo",
        ("127.0.0.1", 5070),
        12000,
        "default words",
    )
    assert isinstance(server.application, RoutedApplication)


def test_serve_command_line_options_override_the_file(tmp_path: Path, captured: list[Server]) -> None:
    args = [
        "serve",
        "--config",
        str(_file(tmp_path, GOOD)),
        "--sip",
        "127.0.0.1:5099",
        "--instructions",
        "cli",
    ]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    c = captured[0].config
    assert c.sip == ("127.0.0.1", 5099) and c.instructions == "cli"
    assert c.rtp_port == 12000  # not given on the command line: the file's, not click's default 4000


def test_serve_bad_file_exits_2_with_file_key_path_and_expectation(
    tmp_path: Path, captured: list[Server]
) -> None:
    path = _file(tmp_path, GOOD.replace('name = "sales"', 'name = "sales"\nprovider = "gpt"'))
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(path)])
    assert result.exit_code == 2 and not captured
    assert f"{path}: routes[0].provider: expected one of" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an exception escaping serve


def test_serve_unknown_key_is_refused(tmp_path: Path, captured: list[Server]) -> None:
    result = CliRunner().invoke(
        cli.main, ["serve", "--config", str(_file(tmp_path, GOOD + "\n[logging]\nlevl = 1\n"))]
    )
    assert result.exit_code == 2 and not captured
    assert "logging.levl" in result.output


def test_serve_refuses_a_missing_key_variable_by_name(
    tmp_path: Path, captured: list[Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XAI_TEST_KEY", raising=False)
    text = (
        GOOD.replace('provider = "echo"', 'provider = "xai"')
        + '\n[providers.xai]\nkey_env = "XAI_TEST_KEY"\n'
    )
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(_file(tmp_path, text))])
    assert result.exit_code == 2 and not captured
    assert "XAI_TEST_KEY is not set" in result.output
    monkeypatch.setenv("XAI_TEST_KEY", "sk-secret-value-123")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(_file(tmp_path, text))])
    assert result.exit_code == 0, result.output
    assert captured[0].config.key == "sk-secret-value-123"
    assert "sk-secret-value-123" not in result.output


def test_config_check_ok_with_env_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    result = CliRunner().invoke(cli.main, ["config", "check", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "warning:" in result.output and "GEMINI_API_KEY is not set" in result.output
    assert "ok (4 routes, 2 trunks)" in result.output


def test_config_check_bad_file_exits_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli.main, ["config", "check", str(_file(tmp_path, "[engine]\nmax_calls = 'x'\n"))]
    )
    assert result.exit_code == 1
    assert "engine.max_calls" in result.output and "Traceback" not in result.output


# --- routes -----------------------------------------------------------------------------------------------


def _identity(called: str, headers: tuple[tuple[str, str], ...] = ()) -> CallIdentity:
    return CallIdentity("c1", "sip-c1", "sip:a@x", f"sip:{called}@y", called, "127.0.0.1:5000", headers)


def _setup(app: Application, identity: CallIdentity) -> CallSetup:
    return asyncio.run(app.setup(identity))


def test_route_gives_instructions_and_greeting(tmp_path: Path) -> None:
    app = RoutedApplication(Application(), load(_file(tmp_path, GOOD)))
    sales = _setup(app, _identity("100"))
    assert (sales.instructions, sales.greeting, sales.route) == (
        "sales words",
        "Say: sales, good day.",
        "sales",
    )
    support = _setup(app, _identity("234", (("x-line", "support"),)))
    assert support.instructions == "support words" and support.route == "support"
    assert support.greeting == "Say: hello from the defaults."  # the route has none: [defaults]


def test_no_route_matching_is_refused_with_404(tmp_path: Path) -> None:
    app = RoutedApplication(Application(), load(_file(tmp_path, GOOD)))
    with pytest.raises(CallRefused) as info:
        _setup(app, _identity("234"))  # the pattern matches but the header is missing
    assert info.value.status == 404


def test_without_routes_every_call_gets_the_defaults(tmp_path: Path) -> None:
    text = GOOD.split("[[routes]]")[0]
    setup = _setup(RoutedApplication(Application(), load(_file(tmp_path, text))), _identity("999"))
    assert (setup.instructions, setup.greeting, setup.route) == (
        "default words",
        "Say: hello from the defaults.",
        None,
    )


class _Call:
    call_id = "call-9"

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.pushed: list[str] = []

    def push_update(self, text: str, *, speak: bool = True) -> bool:
        if self.refusals:
            self.refusals -= 1
            return False
        self.pushed.append(text)
        return True


def test_greeting_is_pushed_once_the_session_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(greeting, "GREETING_POLL_S", 0.0)
    call = _Call(refusals=3)
    assert asyncio.run(greeting.greet(call, "Say: hi")) is True
    assert call.pushed == ["Say: hi"]


def test_greeting_gives_up_when_the_call_never_comes_up() -> None:
    call = _Call(refusals=10**9)
    assert asyncio.run(greeting.greet(call, "Say: hi", wait_s=0.0)) is False
    assert call.pushed == []


# --- metrics from the server's call handling (bridge/server/observe.py) ----------------------------------------------


def _value(observer: CallObserver, name: str, **labels: str) -> float:
    value = observer.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_observer_counts_calls_refusals_and_notices() -> None:
    obs = CallObserver()
    obs.call_refused(None, 404)
    obs.call_started("sales")
    assert _value(obs, "parlora_calls_active", route="sales") == 1
    sink_seen: list[object] = []
    sink = obs.tee(lambda cid, n: sink_seen.append(n))
    sink("call-1", RecoveryChanged(2, "transport_lost", "done", 850))
    sink("call-1", RolloverChanged("closed", "call-1/conn-1", "", 10))
    sink("call-1", AudioDiscontinuity("output", 320, "output_overflow", 20))
    sink("call-1", JobChanged("job-1", "lookup", "running", "", 1000))
    sink("call-1", JobChanged("job-1", "lookup", "delivered", "", 1500))
    summary = CallSummary("call-1", 3.0, 150, 140, "caller", "200 OK", None)
    obs.call_ended("sales", summary, PlayoutLeg())  # a leg that declares nothing
    assert len(sink_seen) == 5  # the console still sees every notice
    assert _value(obs, "parlora_calls_active", route="sales") == 0
    assert _value(obs, "parlora_calls_total", route="sales", outcome="completed") == 1
    assert _value(obs, "parlora_calls_total", route="default", outcome="refused") == 1
    assert _value(obs, "parlora_sip_responses_sent_total", code="404") == 1
    assert _value(obs, "parlora_sip_responses_sent_total", code="200") == 1
    assert _value(obs, "parlora_refusals_total", reason="no_route") == 1
    assert _value(obs, "parlora_recoveries_total", cause="transport_lost", outcome="recovered") == 1
    assert _value(obs, "parlora_recovery_duration_seconds_sum", cause="transport_lost") == 0.85
    assert _value(obs, "parlora_rollovers_total", outcome="completed") == 1
    assert _value(obs, "parlora_audio_discontinuities_total", direction="out", cause="output_overflow") == 1
    assert _value(obs, "parlora_jobs_total", outcome="completed") == 1
    assert _value(obs, "parlora_job_duration_seconds_sum") == 0.5


def test_provider_unavailable_is_a_failed_call_answered_503() -> None:
    obs = CallObserver()
    obs.call_started(None)
    obs.call_ended(
        None, CallSummary("c", 0.1, 0, 0, "bridge", "provider unavailable: refused", None), PlayoutLeg()
    )
    assert _value(obs, "parlora_calls_total", route="default", outcome="failed") == 1
    assert _value(obs, "parlora_sip_responses_sent_total", code="503") == 1


def test_http_extra_paths() -> None:
    obs = CallObserver()
    state = {"ready": (True, "listening")}
    answer = obs.http_extra(lambda: state["ready"])
    assert answer("/healthz") == (200, b'{"alive": true}', "application/json")
    assert answer("/readyz") == (200, b'{"ready": true, "reason": "listening"}', "application/json")
    state["ready"] = (False, "draining")
    assert answer("/readyz") == (503, b'{"ready": false, "reason": "draining"}', "application/json")
    metrics = answer("/metrics?x=1")
    assert metrics is not None and metrics[0] == 200 and b"parlora_calls_active" in metrics[1]
    assert answer("/calls") is None  # the status routes answer those


def test_drain_timeout_from_the_command_line_over_the_file(tmp_path: Path, captured: list[Server]) -> None:
    path = _file(tmp_path, GOOD + "\n[drain]\ntimeout_s = 120\n")
    assert CliRunner().invoke(cli.main, ["serve", "--config", str(path)]).exit_code == 0
    assert (
        CliRunner().invoke(cli.main, ["serve", "--config", str(path), "--drain-timeout", "5"]).exit_code == 0
    )
    assert [s.config.drain_timeout_s for s in captured] == [120.0, 5.0]


# --- JSON logs (bridge/server/jsonlog.py) ---------------------------------------------------------------------------


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("parlora", logging.INFO, __file__, 1, msg, args, None)


def test_json_log_line_has_the_fields_and_the_call_id() -> None:
    line = json.loads(JsonFormatter().format(_record("call %s: route %s", "call-7", "sales")))
    assert line["message"] == "call call-7: route sales" and line["call_id"] == "call-7"
    assert (line["level"], line["logger"], line["event"]) == ("info", "parlora", "call %s: route %s")
    assert line["time"].endswith("+00:00")
    assert "call_id" not in json.loads(JsonFormatter().format(_record("listening on udp %s", "x")))


def test_json_log_redacts_secret_environment_values() -> None:
    secrets = secret_values(
        {"OPENAI_API_KEY": "sk-abc123456", "PARLORA_SIP_PASSWORD": "pw-99", "HOME": "/root"}
    )
    assert set(secrets) == {"sk-abc123456", "pw-99"}
    text = JsonFormatter(secrets).format(_record("header Authorization: Bearer %s", "sk-abc123456"))
    assert "sk-abc123456" not in text and "Bearer ***" in json.loads(text)["message"]


# --- drain (bridge/server/drain.py) ------------------------------------------------------------------------------------


class _Server:
    def __init__(self, calls: int) -> None:
        self.calls, self.drained = calls, False

    def drain(self) -> None:
        self.drained = True

    def live_calls(self) -> int:
        return self.calls


class _Signals:  # ShutdownSignals without the process's signal handlers
    def __init__(self) -> None:
        self.requested, self.now, self.changed = asyncio.Event(), asyncio.Event(), asyncio.Event()


def test_drain_waits_for_the_live_calls_to_end() -> None:
    async def scenario() -> tuple[str, bool]:
        server, signals, changed = _Server(2), _Signals(), asyncio.Event()
        waiting = asyncio.create_task(drain(server, signals, 30.0, changed))  # type: ignore[arg-type]
        for _ in range(2):
            await asyncio.sleep(0)
            server.calls -= 1
            changed.set()
        return await asyncio.wait_for(waiting, 5), server.drained

    assert asyncio.run(scenario()) == ("calls finished", True)


def test_drain_ends_on_a_second_signal_and_at_once_with_timeout_0() -> None:
    async def scenario() -> tuple[str, str]:
        server, signals, changed = _Server(1), _Signals(), asyncio.Event()
        waiting = asyncio.create_task(drain(server, signals, 30.0, changed))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        signals.now.set()
        signals.changed.set()
        second = await asyncio.wait_for(waiting, 5)
        at_once = await drain(_Server(1), _Signals(), 0.0, asyncio.Event())  # type: ignore[arg-type]
        return second, at_once

    assert asyncio.run(scenario()) == ("second signal", "at once")


def test_drain_gives_up_at_the_timeout() -> None:
    result = asyncio.run(drain(_Server(1), _Signals(), 0.01, asyncio.Event()))  # type: ignore[arg-type]
    assert result == "drain timeout"


def test_trunk_edge_options_over_the_file_reach_the_server(tmp_path: Path, captured: list[Server]) -> None:
    args = ["serve", "--config", str(_file(tmp_path, GOOD)), "--nat", "--allow", "127.0.0.0/8"]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    assert captured[0].config.nat is True and captured[0].config.allow == ("127.0.0.0/8",)


def test_cdr_recording_and_keepalive_from_the_file_reach_the_server(tmp_path: Path) -> None:
    from bridge.cli.ops import server_config

    (tmp_path / "wav").mkdir()
    text = GOOD + '[logging]\ncdr = "calls.jsonl"\n[recording]\ndir = "wav"\n'
    text += '[[trunks]]\nname = "pbx"\nregistrar = "sip:b@127.0.0.1:5090"\nregister_keepalive_s = 12\n'
    config = load(_file(tmp_path, text))
    sc = server_config(config, {"PARLORA_SIP_PASSWORD": "pw-1234"})
    assert Path(sc.cdr or "").name == "calls.jsonl" and Path(sc.record_dir or "").name == "wav"
    assert sc.register_keepalive_s == 12


def test_the_routed_application_passes_every_application_callback_on() -> None:
    # A callback it does not override would go to the base class's no-op: under `serve --config`, the webhook
    # or the Python application would silently miss it (the call's events did, once).
    callbacks = {
        name
        for name, value in vars(Application).items()
        if inspect.iscoroutinefunction(value) and not name.startswith("_")
    }
    assert callbacks and callbacks <= set(vars(RoutedApplication)), callbacks - set(vars(RoutedApplication))


@pytest.mark.parametrize(
    ("flag", "key", "field"),
    [("--server-header", "server_header", "server_header"), ("--realm", "realm", "realm")],
)
def test_server_header_and_realm_by_flag_or_file_key_reach_the_engine(
    tmp_path: Path, captured: list[Server], flag: str, key: str, field: str
) -> None:
    from bridge.server.api import _engine_config

    result = CliRunner().invoke(cli.main, ["serve", "--sip", "127.0.0.1:5070", flag, "Acme Voice"])
    assert result.exit_code == 0, result.output
    by_flag = _engine_config(captured[0].config)
    text = GOOD + f'[inbound]\n{key} = "Acme Voice"\n'
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(_file(tmp_path, text))])
    assert result.exit_code == 0, result.output
    by_file = _engine_config(captured[1].config)
    assert getattr(by_flag, field) == getattr(by_file, field) == "Acme Voice"
    result = CliRunner().invoke(cli.main, ["serve", flag, "bad\r\nInjected: 1"])
    assert result.exit_code == 2 and "printable ASCII" in result.output


def test_server_header_and_realm_name_nothing_by_default(captured: list[Server]) -> None:
    from bridge.server.api import _engine_config

    result = CliRunner().invoke(cli.main, ["serve", "--sip", "127.0.0.1:5070"])
    assert result.exit_code == 0, result.output
    engine = _engine_config(captured[0].config)
    assert engine.server_header is None and engine.realm is None


def test_hold_limit_and_session_timer_from_flag_file_and_default_reach_the_engine(
    tmp_path: Path, captured: list[Server]
) -> None:
    from bridge.server.api import _engine_config

    path = _file(tmp_path, GOOD + "\n[telephony]\nhold_timeout_s = 600\nsession_expires_s = 900\n")
    runs = [
        ["serve", "--provider", "echo"],  # the defaults
        ["serve", "--provider", "echo", "--hold-timeout", "600", "--session-expires", "900"],
        ["serve", "--config", str(path)],
        ["serve", "--config", str(path), "--hold-timeout", "0", "--session-expires", "0"],
    ]
    for args in runs:
        result = CliRunner().invoke(cli.main, args)
        assert result.exit_code == 0, result.output
    engines = [_engine_config(s.config) for s in captured]
    assert [(e.hold_timeout_s, e.session_expires_s) for e in engines] == [
        (7200.0, 1800),
        (600.0, 900),
        (600, 900),
        (None, 0),
    ]
    bad = CliRunner().invoke(cli.main, ["serve", "--provider", "echo", "--session-expires", "30"])
    assert bad.exit_code == 2 and "--session-expires: expected 0 or an integer >= 90" in bad.output


def test_webrtc_address_and_stun_by_flag_and_by_file_key_give_the_same_server(
    tmp_path: Path, captured: list[Server]
) -> None:
    keys = 'http = "127.0.0.1:8080"\nwebrtc_address = "192.0.2.1"\nstun = "stun:stun.example.net:3478"\n'
    path = _file(tmp_path, GOOD.replace('sip_udp = "127.0.0.1:5070"', 'sip_udp = "127.0.0.1:5070"\n' + keys))
    flags = [
        "--http",
        "127.0.0.1:8080",
        "--webrtc-address",
        "192.0.2.1",
        "--stun",
        "stun:stun.example.net:3478",
    ]
    assert CliRunner().invoke(cli.main, ["serve", "--config", str(path)]).exit_code == 0
    plain = _file(tmp_path, GOOD)
    assert CliRunner().invoke(cli.main, ["serve", "--config", str(plain), *flags]).exit_code == 0
    assert CliRunner().invoke(cli.main, ["serve", "--provider", "echo", *flags]).exit_code == 0
    assert [(s.config.webrtc_address, s.config.stun) for s in captured] == [
        ("192.0.2.1", ("stun:stun.example.net:3478",))
    ] * 3
    assert (
        CliRunner().invoke(cli.main, ["serve", "--provider", "echo", "--http", "127.0.0.1:8080"]).exit_code
        == 0
    )
    assert (captured[-1].config.webrtc_address, captured[-1].config.stun) == (None, ())  # no STUN by default


def test_webrtc_address_and_stun_that_cannot_be_honoured_refuse_to_start(
    tmp_path: Path, captured: list[Server]
) -> None:
    for flag, value in (("--webrtc-address", "0.0.0.0"), ("--stun", "stuns:stun.example.net")):
        result = CliRunner().invoke(cli.main, ["serve", "--provider", "echo", flag, value])
        assert result.exit_code == 2 and flag in result.output, result.output
        path = _file(tmp_path, GOOD)
        result = CliRunner().invoke(cli.main, ["serve", "--config", str(path), flag, value])
        assert result.exit_code == 2 and flag in result.output, result.output
    bad = _file(
        tmp_path, GOOD.replace('sip_udp = "127.0.0.1:5070"', 'sip_udp = "127.0.0.1:5070"\nstun = "turn:x"')
    )
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(bad)])
    assert result.exit_code == 2 and f"{bad}: listeners.stun: expected stun:HOST[:PORT]" in result.output
    # without the HTTP listener there is no Talk button for them to apply to
    unused = _file(
        tmp_path, GOOD.replace('sip_udp = "127.0.0.1:5070"', 'sip_udp = "127.0.0.1:5070"\nstun = "stun:x"')
    )
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(unused)])
    assert (
        result.exit_code == 2
        and "listeners.webrtc_address, stun: apply to the console's Talk button" in result.output
    )
    result = CliRunner().invoke(cli.main, ["serve", "--provider", "echo", "--stun", "stun:x"])
    assert (
        result.exit_code == 2
        and "listeners.webrtc_address, stun: apply to the console's Talk button: set listeners.http"
        in result.output
    )
    assert not captured


# --- every key acted on; what cannot be honoured refuses to start; the defaults -------------------------------


def _serve(args: list[str], captured: list[Server], env: dict[str, str] | None = None) -> tuple[int, str]:
    captured.clear()
    result = CliRunner().invoke(cli.main, ["serve", *args], env=env)
    return result.exit_code, result.output


def test_calls_are_bounded_by_default_and_each_limit_switches_off(captured: list[Server]) -> None:
    assert _serve([], captured)[0] == 0
    c = captured[0].config
    assert (c.max_call_duration_s, c.rtp_timeout_s, c.hold_timeout_s) == (14400.0, 60.0, 7200.0)
    off = ["--max-call-duration", "off", "--rtp-timeout", "0", "--hold-timeout", "off"]
    assert _serve(off, captured)[0] == 0
    c = captured[0].config
    assert (c.max_call_duration_s, c.rtp_timeout_s, c.hold_timeout_s) == (None, None, None)
    status, output = _serve(["--rtp-timeout", "0.5"], captured)
    assert status == 2 and 'or 0 or "off"' in output


def test_the_pjsua2_engine_has_no_limits_by_default_and_refuses_one_given(
    tmp_path: Path, captured: list[Server]
) -> None:
    assert _serve(["--engine", "pjsua2"], captured)[0] == 0
    c = captured[0].config
    assert (c.max_call_duration_s, c.rtp_timeout_s, c.hold_timeout_s) == (
        None,
        None,
        7200.0,
    )  # it keeps holds
    status, output = _serve(["--engine", "pjsua2", "--rtp-timeout", "30"], captured)
    assert status == 2 and not captured
    assert "telephony.rtp_timeout_s: the pjsua2 engine cannot end calls on it" in output
    path = _file(
        tmp_path, '[engine]\nname = "pjsua2"\nrtp_ports = "20000-20099"\n[listeners]\nsip_tcp = "off"\n'
    )
    status, output = _serve(["--config", str(path)], captured)
    assert status == 2 and "engine.rtp_ports: an upper bound (20099) is not supported on the pjsua2" in output


def _example(tmp_path: Path) -> Path:
    """deploy/example.toml with its TLS files present (its relative paths, next to the copy)."""
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "support.md").write_text("You answer the support line.")
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "bridge.pem").write_text("cert")
    (tmp_path / "tls" / "bridge.key").write_text("key")
    path = tmp_path / "example.toml"
    path.write_text(EXAMPLE.read_text())
    return path


EXAMPLE_ENV = {
    "OPENAI_API_KEY": "sk-1",
    "GEMINI_API_KEY": "g-1",
    "PARLORA_SIP_PASSWORD": "pw-1",
    "PARLORA_CARRIER_PASSWORD": "pw-2",
    "PARLORA_HTTP_TOKEN": "tok-1",
    "PARLORA_WEBHOOK_SECRET": "whsec-123456",
}


def test_the_example_gets_tls_srtp_and_its_limits(tmp_path: Path, captured: list[Server]) -> None:
    # before: a warning, and plain SIP and RTP on the carrier trunk that asks for TLS and SRTP
    status, output = _serve(["--config", str(_example(tmp_path))], captured, EXAMPLE_ENV)
    assert status == 0, output
    c = captured[0].config
    assert c.tls == ("0.0.0.0", 5061) and Path(c.cert or "").name == "bridge.pem"
    assert Path(c.tls_key or "").name == "bridge.key" and c.sip_tcp
    # SRTP required on the carrier's calls (over TLS); the office PBX's stay plain (sip/core/trunks.py)
    assert {t.name: t.srtp for t in c.trunks} == {"office-pbx": "off", "carrier": "required"}
    assert c.srtp == "off"  # what matches neither trunk is refused by their allowlists anyway
    assert (c.max_call_duration_s, c.rtp_timeout_s, c.hold_timeout_s) == (7200.0, 30.0, 3600.0)
    assert (c.rtp_port, c.rtp_port_high) == (10000, 10999)


def test_srtp_require_alone_refuses_calls_not_over_tls(tmp_path: Path, captured: list[Server]) -> None:
    from providers.fakes.gemini_live import ensure_cert

    cert, key, _ = ensure_cert(None, None, str(tmp_path))
    args = ["--tls", "127.0.0.1:5061", "--cert", cert, "--key", key, "--srtp", "require"]
    assert _serve(args, captured)[0] == 0
    assert captured[0].config.srtp == "required"  # the command line's one trunk is the global policy


def test_what_cannot_be_honoured_refuses_to_start_naming_the_key(
    tmp_path: Path, captured: list[Server]
) -> None:
    example = _example(tmp_path)
    text = example.read_text()
    no_tls = text.replace('sip_tls = "0.0.0.0:5061"', "").replace('tls_cert = "tls/bridge.pem"', "")
    no_tls = no_tls.replace('tls_key = "tls/bridge.key"', "")
    example.write_text(no_tls)
    status, output = _serve(["--config", str(example)], captured, EXAMPLE_ENV)
    assert status == 2 and not captured
    assert 'trunks[1].transport: "tls" needs a TLS listener: listeners.sip_tls' in output
    # a certificate file named but absent: refused at start (config check only warns: another machine)
    example.write_text(text)
    (tmp_path / "tls" / "bridge.key").unlink()
    status, output = _serve(["--config", str(example)], captured, EXAMPLE_ENV)
    assert status == 2 and "listeners.tls_key: no file at" in output
    checked = CliRunner().invoke(cli.main, ["config", "check", str(example)], env=EXAMPLE_ENV)
    assert checked.exit_code == 0 and "warning:" in checked.output and "listeners.tls_key" in checked.output
    # TCP answers on the UDP address; another one cannot be honoured
    status, output = _serve(
        ["--config", str(_file(tmp_path, '[listeners]\nsip_tcp = "127.0.0.1:5099"\n'))], captured
    )
    assert (
        status == 2 and "listeners.sip_tcp: 127.0.0.1:5099: the native engine answers SIP over TCP" in output
    )
    status, output = _serve(["--sip-tcp", "off"], captured)
    assert status == 0 and captured[0].config.sip_tcp is False
    # SRTP from the command line makes a TLS trunk, which needs the TLS listener
    status, output = _serve(["--srtp", "offer"], captured)
    assert status == 2 and 'trunks[0].transport: "tls" needs a TLS listener' in output
    # the RTP range has room for max_calls
    status, output = _serve(["--rtp-ports", "20000-20009", "--max-calls", "10"], captured)
    assert status == 2 and "engine.rtp_ports: 20000-20009 has room for 5 calls" in output
    assert _serve(["--rtp-ports", "20000-20019", "--max-calls", "10"], captured)[0] == 0
    assert (captured[0].config.rtp_port, captured[0].config.rtp_port_high) == (20000, 20019)


def test_doctor_shows_the_call_limits() -> None:
    from bridge.cli.config import BridgeConfig, Engine, Telephony
    from bridge.cli.doctor import check_limits

    found = {f.check: f for f in check_limits(BridgeConfig())}
    assert found["call limits"].status == "ok"
    assert found["call limits"].detail == "max call duration 14400 s, RTP timeout 60 s, on hold 7200 s"
    assert "RFC 4028" in found["session timers"].detail
    off = BridgeConfig(telephony=Telephony(max_call_duration_s=0.0, rtp_timeout_s=0.0, hold_timeout_s=0.0))
    found = {f.check: f for f in check_limits(off)}
    assert found["call limits"].status == "warn" and found["call limits"].detail.count("off") == 3
    pjsua2 = {f.check: f for f in check_limits(BridgeConfig(engine=Engine(name="pjsua2")))}
    assert "cannot end calls" in pjsua2["call limits"].detail


def test_the_scanner_blocklist_and_the_registration_interval_reach_the_engine(
    tmp_path: Path, captured: list[Server]
) -> None:
    # two more keys the file took and nothing applied (the engine kept its own list and 3600 s)
    from bridge.server.api import _engine_config
    from sip.core.native_plan import build_policy

    text = '[inbound]\nblocked_user_agents = ["evil-dialer"]\n'
    text += '[[trunks]]\nname = "pbx"\nregistrar = "sip:b@127.0.0.1:5090"\nregister_expires_s = 120\n'
    status, output = _serve(["--config", str(_file(tmp_path, text))], captured)
    assert status == 0, output
    engine = _engine_config(captured[0].config)
    assert engine.register_expires_s == 120 and engine.scanner_user_agents == ("evil-dialer",)
    assert build_policy(engine).config.scanner_user_agents == ("evil-dialer",)
    status, output = _serve(
        ["--config", str(_file(tmp_path, text + '[engine]\nname = "pjsua2"\n'))], captured
    )
    assert status == 2 and "inbound.blocked_user_agents: the pjsua2 engine has no inbound policy" in output


def test_a_providers_model_and_voice_reach_its_sessions(tmp_path: Path, captured: list[Server]) -> None:
    # [providers.NAME] model and voice were read and never used: each provider's sessions now ask for them
    from bridge.server.api import call_settings
    from bridge.server.plans import ProviderPlans
    from providers.base import SessionSettings

    text = (
        '[defaults]\nprovider = "xai"\n[providers.xai]\nkey_env = "X_KEY"\nmodel = "grok-voice-2"\nvoice = "Ara"\n'
        '[providers.openai-realtime]\nkey_env = "O_KEY"\nvoice = "marin"\n'
        '[[routes]]\nname = "sales"\nnumber = "1"\nprovider = "openai-realtime"\n[[routes]]\nname = "rest"\n'
    )
    status, output = _serve(
        ["--config", str(_file(tmp_path, text))], captured, {"X_KEY": "x-1", "O_KEY": "o-1"}
    )
    assert status == 0, output
    plans = ProviderPlans(captured[0].config)
    default, routed = plans.for_call(None)[0].settings, plans.for_call("openai-realtime")[0].settings
    assert (default.model, default.voice) == ("grok-voice-2", "Ara")
    assert (routed.model, routed.voice) == (None, "marin")
    mine = call_settings(SessionSettings(voice="cedar"), routed)  # a route's or the application's voice wins
    assert (mine.voice, mine.model) == ("cedar", None)
    assert call_settings(SessionSettings(), default).model == "grok-voice-2"


def test_provider_append_ms_alone_applies_to_the_default_provider(captured: list[Server]) -> None:
    assert _serve(["--provider-append-ms", "100"], captured)[0] == 0
    assert dict(captured[0].config.provider_options)["append_ms"] == 100  # echo
    assert _serve(["--provider-append-ms", "60"], captured, {"OPENAI_API_KEY": "sk-9"})[0] == 0
    assert captured[0].config.provider == "openai-live"
    assert dict(captured[0].config.provider_options)["append_ms"] == 60


def test_amd_is_off_by_default_on_by_flag_or_file_and_refused_on_pjsua2(
    tmp_path: Path, captured: list[Server]
) -> None:
    assert _serve([], captured)[0] == 0 and captured[0].config.amd is False
    captured.clear()
    assert _serve(["--amd"], captured)[0] == 0 and captured[0].config.amd is True
    captured.clear()
    path = _file(tmp_path, "[outbound]\namd = true\n")
    assert _serve(["--config", str(path)], captured)[0] == 0 and captured[0].config.amd is True
    captured.clear()
    status, output = _serve(["--engine", "pjsua2", "--amd"], captured)
    assert status == 2 and not captured
    assert "outbound.amd: the pjsua2 engine places no calls" in output


def test_an_outbound_route_turns_amd_on_or_off_and_an_inbound_one_cannot(
    tmp_path: Path, captured: list[Server]
) -> None:
    routes = (
        '[[routes]]\nname = "mailboxes"\ndirection = "outbound"\nnumber = "555"\namd = true\n'
        '[[routes]]\nname = "people"\ndirection = "outbound"\nnumber = "556"\namd = false\n'
        '[[routes]]\nname = "rest"\ndirection = "outbound"\n'
    )
    app = RoutedApplication(Application(), load(_file(tmp_path, "[outbound]\namd = true\n" + routes)))
    amd = [asyncio.run(app.setup_outbound(_identity(n), None)).amd for n in ("555", "556", "777")]
    assert amd == [True, False, None]  # None: the server's [outbound] amd
    status, output = _serve(["--engine", "pjsua2", "--config", str(_file(tmp_path, routes))], captured)
    assert status == 2 and "outbound.amd: the pjsua2 engine places no calls" in output
    inbound = '[[routes]]\nname = "desk"\nnumber = "100"\namd = true\n'
    status, output = _serve(["--config", str(_file(tmp_path, inbound))], captured)
    assert status == 2 and "routes[0].amd: answering-machine detection is for outbound routes" in output
