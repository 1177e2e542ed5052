"""The engine seam (sip/engine.py): the registry, its errors, a fake engine through it, and `bridge` never
importing an engine module."""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest
from click.testing import CliRunner

import sip.engine as engine_mod
from sip.engine import (
    DEFAULT_ENGINE,
    ENGINES,
    EngineConfig,
    EngineFactory,
    EngineFeatures,
    EngineSpec,
    EngineStartError,
    EngineUnavailable,
    OnCall,
    SipEngine,
    create_engine,
    engine_spec,
    load_engine,
)
from sip.leg import CallIdentity, CallLeg, LegFeatures

ROOT = Path(__file__).resolve().parents[3]


class FakeEngine:
    """An engine as the protocol asks: built from (config, on_call), hands legs to on_call, drains."""

    features = EngineFeatures()  # nothing beyond the protocol
    instances: list[FakeEngine] = []

    def __init__(self, config: EngineConfig, on_call: OnCall) -> None:
        self.config = config
        self.on_call = on_call
        self.started = False
        self.stopped = False
        self._draining = False
        self._active = 0
        self.refused: list[int] = []
        FakeEngine.instances.append(self)

    @property
    def max_calls(self) -> int:
        return self.config.max_calls if self.config.max_calls is not None else 2

    @property
    def active_calls(self) -> int:
        return self._active

    @property
    def draining(self) -> bool:
        return self._draining

    async def start(self) -> None:
        if self.config.port == 1:
            raise EngineStartError("port 1: permission denied")
        self.started = True

    async def stop(self) -> bool:
        self.stopped = True
        return True

    def drain(self) -> None:
        self._draining = True

    def invite(self, leg: CallLeg) -> int:
        """An incoming INVITE: the status the fake would answer before the session answers 200."""
        if self._draining or self._active >= self.max_calls:
            self.refused.append(503)
            return 503
        self._active += 1
        self.on_call(leg)
        return 180


class _Leg:
    identity = CallIdentity("call-1", "abc@h", "sip:a@h", "sip:b@h", "b", "127.0.0.1:5080")


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    module = types.ModuleType("fake_engine_for_tests")
    module.FakeEngine = FakeEngine  # type: ignore[attr-defined]
    module.not_callable = 42  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_engine_for_tests", module)
    registry = dict(ENGINES) | {
        "fake": EngineSpec(
            "fake_engine_for_tests:FakeEngine", extra=None, default_max_calls=2, limits="none"
        ),
        "absent": EngineSpec("sip.no_such_engine:Engine", extra=None, default_max_calls=1, limits="none"),
        "needs-extra": EngineSpec(
            "fake_engine_needing_extra:Engine", extra="wonder", default_max_calls=1, limits="none"
        ),
        "bad-target": EngineSpec("fake_engine_for_tests", extra=None, default_max_calls=1, limits="none"),
        "no-attr": EngineSpec(
            "fake_engine_for_tests:Missing", extra=None, default_max_calls=1, limits="none"
        ),
        "not-callable": EngineSpec(
            "fake_engine_for_tests:not_callable", extra=None, default_max_calls=1, limits="none"
        ),
    }
    monkeypatch.setattr(engine_mod, "ENGINES", MappingProxyType(registry))
    FakeEngine.instances.clear()
    yield
    FakeEngine.instances.clear()


# --- the registry -------------------------------------------------------------------------------------------


def test_pjsua2_is_registered_lazily_with_its_extra_and_cap() -> None:
    spec = engine_spec("pjsua2")
    assert spec.target == "sip.pjsua2.agent:Pjsua2UserAgent"
    assert spec.extra == "pjsua2"
    assert spec.default_max_calls == spec.cap == 4
    assert DEFAULT_ENGINE in ENGINES


def test_registry_spec_matches_the_pjsua2_engine_itself() -> None:
    pytest.importorskip("pjsua2")
    from sip.pjsua2.agent import WHEEL_MAX_CALLS, Pjsua2UserAgent

    factory: EngineFactory = (
        Pjsua2UserAgent  # statically: the class is an EngineFactory (mypy checks this line)
    )
    assert load_engine("pjsua2") is factory
    assert ENGINES["pjsua2"].default_max_calls == WHEEL_MAX_CALLS


def test_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(EngineUnavailable, match=r"unknown SIP engine 'sipx'; known engines: .*pjsua2"):
        load_engine("sipx")


def test_a_fake_engine_is_built_through_the_registry(fake_registry: None) -> None:
    legs: list[CallLeg] = []
    engine: SipEngine = create_engine("fake", EngineConfig(port=5999, max_calls=1), legs.append)
    assert isinstance(engine, FakeEngine) and engine.config.port == 5999
    assert engine.max_calls == 1 and engine.active_calls == 0 and not engine.draining


def test_a_missing_optional_dependency_names_the_extra(
    fake_registry: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fake_engine_needing_extra.py").write_text(
        "import wonder_sdk_not_installed\nEngine = object\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        EngineUnavailable,
        match=r"needs the optional dependency 'wonder_sdk_not_installed'.*"
        r"pip install 'parlora-bridge\[wonder\]'",
    ) as info:
        load_engine("needs-extra")
    assert isinstance(info.value.__cause__, ImportError)
    monkeypatch.delitem(sys.modules, "fake_engine_needing_extra", raising=False)


def test_pjsua2_without_its_wheel_names_the_pjsua2_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pjsua2", None)  # `import pjsua2` now fails as if it were not installed
    monkeypatch.delitem(sys.modules, "sip.pjsua2.agent", raising=False)
    with pytest.raises(EngineUnavailable, match=r"pip install 'parlora-bridge\[pjsua2\]'"):
        load_engine("pjsua2")


def test_an_engine_module_missing_from_the_installation_says_so(fake_registry: None) -> None:
    with pytest.raises(
        EngineUnavailable,
        match=r"'absent' is not part of this installation \(no module "
        r"sip.no_such_engine\)",
    ):
        load_engine("absent")


@pytest.mark.parametrize(
    "name, message",
    [
        ("bad-target", "is not 'module:attribute'"),
        ("no-attr", "has no engine factory 'Missing'"),
        ("not-callable", "has no engine factory 'not_callable'"),
    ],
)
def test_malformed_registry_entries_are_engine_unavailable(
    fake_registry: None, name: str, message: str
) -> None:
    with pytest.raises(EngineUnavailable, match=message):
        load_engine(name)


# --- the fake engine through the protocol --------------------------------------------------------------------


async def test_fake_engine_hands_calls_to_on_call_and_refuses_503_once_draining(fake_registry: None) -> None:
    legs: list[CallLeg] = []
    engine = create_engine("fake", EngineConfig(max_calls=None), legs.append)
    assert isinstance(engine, FakeEngine)
    await engine.start()
    assert engine.max_calls == 2  # None: the engine's default
    assert engine.invite(_Leg()) == 180 and engine.active_calls == 1 and len(legs) == 1  # type: ignore[arg-type]
    engine.drain()
    engine.drain()  # idempotent
    assert engine.draining
    assert engine.invite(_Leg()) == 503  # type: ignore[arg-type]
    assert engine.active_calls == 1 and len(legs) == 1  # the live call goes on
    assert await engine.stop()


def test_engine_config_defaults_are_the_documented_ones() -> None:
    config = EngineConfig()
    assert (config.host, config.port, config.rtp_port, config.max_calls) == ("127.0.0.1", 5060, 4000, None)
    assert config.transfer_timeout_s == 30.0 and config.retry_after_s > 0
    with pytest.raises(AttributeError):
        config.port = 1  # type: ignore[misc]  # frozen


# --- bridge builds its engine through the registry only -----------------------------------------------------


async def test_server_builds_its_engine_from_server_config_through_the_registry(fake_registry: None) -> None:
    from bridge.server.api import Application, Server, ServerConfig

    server = Server(
        Application(), ServerConfig(engine="fake", sip=("127.0.0.1", 5999), rtp_port=41000, max_calls=3)
    )
    await server.start()
    try:
        (engine,) = FakeEngine.instances
        assert engine.started
        assert (engine.config.host, engine.config.port, engine.config.rtp_port, engine.config.max_calls) == (
            "127.0.0.1",
            5999,
            41000,
            3,
        )
        server.drain()
        assert engine.draining
    finally:
        assert await server.stop()
    assert engine.stopped


async def test_server_start_fails_with_engine_unavailable_before_starting_anything(
    fake_registry: None,
) -> None:
    from bridge.server.api import Application, Server, ServerConfig

    server = Server(Application(), ServerConfig(engine="absent", http=("127.0.0.1", 0)))
    with pytest.raises(EngineUnavailable):
        await server.start()
    assert server._status is None and server._fake is None  # no helper was left running


async def test_server_run_logs_the_engine_error_and_exits_2(
    fake_registry: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bridge.server.api import Application, Server, ServerConfig

    server = Server(Application(), ServerConfig(engine="fake", sip=("127.0.0.1", 1)))
    with caplog.at_level(logging.ERROR, logger="parlora"):
        assert await asyncio.wait_for(server.run(), 10) == 2
    assert "cannot start the SIP engine fake on 127.0.0.1:1: port 1: permission denied" in caplog.text


def _engine_modules() -> set[str]:
    return {spec.target.partition(":")[0] for spec in ENGINES.values()} | {
        "pjsua2",
        "sip.native",
        "sip.pjsua2",
    }


def _engine_imports(paths: list[Path]) -> list[str]:
    """Every import (statement, `import_module` or `__import__` of a literal) of an engine module."""
    engines = _engine_modules()
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:  # the module, or a submodule of it
                names = (
                    [node.module]
                    if any(node.module == m or node.module.startswith(f"{m}.") for m in engines)
                    else [f"{node.module}.{a.name}" for a in node.names]
                )
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", ""))
                in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names = [str(node.args[0].value)]
            found += [
                f"{path.name}:{getattr(node, 'lineno', 0)} {n}"
                for n in names
                if any(n == m or n.startswith(f"{m}.") for m in engines)
            ]
    return found


def test_the_import_scan_finds_engine_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import sip.leg\nfrom sip import pjsua2\nimport pjsua2 as pj\n"
        "from sip.native.agent import NativeUserAgent\nimportlib.import_module('sip.pjsua2.agent')\n"
    )
    assert _engine_imports([sample]) == [
        "sample.py:2 sip.pjsua2",
        "sample.py:3 pjsua2",
        "sample.py:4 sip.native.agent",
        "sample.py:5 sip.pjsua2.agent",
    ]


def test_no_module_in_bridge_imports_an_engine_module() -> None:
    paths = sorted((ROOT / "bridge").glob("**/*.py"))
    assert len(paths) > 10
    assert _engine_imports(paths) == []


def test_importing_bridge_api_and_cli_does_not_import_pjsua2() -> None:
    code = (
        "import sys, bridge, bridge.server.api, bridge.cli.commands\n"
        "bad = sorted(m for m in sys.modules if m == 'pjsua2' or m.startswith(('pjsua2.', 'sip.pjsua2')))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_serve_help_gives_the_engines_and_their_max_calls_defaults() -> None:
    from bridge.cli.commands import main

    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # click wraps the help
    assert f"--engine [{'|'.join(ENGINES)}]" in text and f"[default: {DEFAULT_ENGINE}]" in text
    defaults = ", ".join(f"{name} {spec.default_max_calls}" for name, spec in ENGINES.items())
    assert f"Default: the engine's own ({defaults})" in text
    assert "pjsua2 4" in defaults and "needs parlora-bridge[pjsua2]" in text


def test_serve_engine_pjsua2_without_the_extra_fails_at_start_with_the_install_command() -> None:
    # The extra stays installed: the child process makes `import pjsua2` fail as if it were not.
    code = (
        "import sys\n"
        "sys.modules['pjsua2'] = None\n"
        "from bridge.cli.commands import main\n"
        "main(['serve', '--engine', 'pjsua2', '--provider', 'echo', '--sip', '127.0.0.1:9', '--log-level', "
        "'error'])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot start the SIP engine pjsua2" in done.stderr
    assert "pip install 'parlora-bridge[pjsua2]'" in done.stderr
    assert "Traceback" not in done.stderr


# --- the pjsua2 engine's own view of max_calls (no library started) --------------------------------------------


def test_pjsua2_max_calls_defaults_to_the_wheel_cap_and_clamps_above_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("pjsua2")
    from sip.pjsua2.agent import Pjsua2UserAgent

    def on_call(leg: CallLeg) -> None:
        raise AssertionError("no call expected")

    default = Pjsua2UserAgent(EngineConfig(), on_call)
    assert default.max_calls == 4 and default.active_calls == 0 and not default.draining
    assert Pjsua2UserAgent(EngineConfig(max_calls=2), on_call).max_calls == 2
    with caplog.at_level(logging.WARNING, logger="parlora.sip"):
        assert Pjsua2UserAgent(EngineConfig(max_calls=10), on_call).max_calls == 4
    assert "at most 4 calls per process" in caplog.text
    with pytest.raises(ValueError, match="at least 1"):
        Pjsua2UserAgent(EngineConfig(max_calls=0), on_call)


def test_native_is_the_default_engine_and_needs_no_extra() -> None:
    # DESIGN §11: `pip install -e .` is enough for the default; pjsua2 is the optional extra.
    assert DEFAULT_ENGINE == "native"
    assert ENGINES[DEFAULT_ENGINE].extra is None and ENGINES[DEFAULT_ENGINE].cap is None
    assert load_engine(DEFAULT_ENGINE).__name__ == "NativeUserAgent"  # type: ignore[attr-defined]


# What each declared feature promises: the members of its protocol (sip/leg.py, sip/engine.py).
_LEG_MEMBERS = {
    "frame_sink": ("set_frame_sink",),
    "dialled": ("outbound",),
    "qos": ("qos", "media_counters"),
    "time_limit": ("on_time_limit",),
    "cushion": ("cushion_frames",),
}
_ENGINE_MEMBERS = {"status": ("sip_status",), "counters": ("stats",), "held": ("counts",), "dial": ("dial",)}


def _has(cls: type, name: str) -> bool:
    """A method or property of the class, or an attribute its `__init__` sets (NativeLeg's `outbound`)."""
    return hasattr(cls, name) or name in cls.__init__.__code__.co_names


def _legs_and_engines() -> list[type]:
    from bridge.server.browser import BrowserLeg
    from sip.native.agent import NativeUserAgent
    from sip.native.leg import NativeLeg

    classes: list[type] = [NativeLeg, NativeUserAgent, BrowserLeg]
    try:
        from sip.pjsua2.agent import Pjsua2Leg, Pjsua2UserAgent
    except ImportError:  # the optional extra is not installed
        return classes
    return [*classes, Pjsua2Leg, Pjsua2UserAgent]


@pytest.mark.parametrize("cls", _legs_and_engines(), ids=lambda cls: cls.__name__)
def test_every_leg_and_engine_declares_exactly_what_it_has(cls: type) -> None:
    """The bridge asks `LegFeatures` / `EngineFeatures`, never the object: a feature an engine's class has
    and does not declare is never used, and one it declares and lacks fails mid-call."""
    features = cls.features  # type: ignore[attr-defined]
    members = _LEG_MEMBERS if isinstance(features, LegFeatures) else _ENGINE_MEMBERS
    assert isinstance(features, LegFeatures | EngineFeatures)
    for feature, names in members.items():
        assert getattr(features, feature) == all(_has(cls, n) for n in names), (cls.__name__, feature)
