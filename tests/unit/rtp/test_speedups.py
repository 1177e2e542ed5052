"""The optional compiled media path (rtp.speedups, rtp/_speedups.c): its build is optional, a missing
extension or PARLORA_PURE_MEDIA=1 gives the pure path, and which path runs is reported (doctor, GET /sip)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from rtp import packet, speedups
from tests.support.native_trunk import engine_factory

__all__ = ["engine_factory"]  # the fixture, from the shared harness

ROOT = Path(__file__).resolve().parents[3]
_PROBE = "import rtp.speedups as s, rtp.stream as t; print(s.MEDIA_PATH, s.COMPILED, t.parse is s.pure.parse)"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PARLORA_PURE_MEDIA", "PARLORA_BUILD_SPEEDUPS")}
    return {**env, **extra}


def test_a_failed_compile_installs_nothing_and_the_import_falls_back_to_pure(tmp_path: Path) -> None:
    # CC=false: every compile fails; the extension is optional, so the build still succeeds without it
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "rtp", tmp_path / "rtp", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    built = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--build-temp", str(tmp_path / "tmp")],
        cwd=tmp_path,
        env=_env(CC="false"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    assert not list((tmp_path / "rtp").glob("_speedups*.so"))
    # -S: no site, so no .pth of an editable install of this checkout, whose finder would hand over the
    # checkout's built extension for `rtp._speedups`; the dependencies come from site-packages on the path
    ran = subprocess.run(
        [sys.executable, "-S", "-c", _PROBE],
        cwd=tmp_path,
        env=_env(PYTHONPATH=os.pathsep.join([str(tmp_path), sysconfig.get_paths()["purelib"]])),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.stdout.split() == ["pure", "False", "True"], ran.stderr
    # the same build made an error on purpose: the compile was really tried, and really failed
    strict = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--build-temp", str(tmp_path / "tmp")],
        cwd=tmp_path,
        env=_env(CC="false", PARLORA_BUILD_SPEEDUPS="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert strict.returncode != 0


def test_the_environment_forces_the_pure_path() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=ROOT,
        env=_env(PYTHONPATH=str(ROOT), PARLORA_PURE_MEDIA="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.stdout.split() == ["pure", "False", "True"], ran.stderr


def _compiler() -> str | None:
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    return shutil.which(cc[0]) if cc else None


@pytest.mark.skipif(_compiler() is None, reason="no C compiler here: the pure path is the one expected")
def test_the_built_extension_is_the_path_in_use() -> None:
    # with a compiler, pip install -e . builds the extension, and it runs
    if os.environ.get("PARLORA_PURE_MEDIA", "") not in ("", "0"):
        assert speedups.MEDIA_PATH == "pure" and speedups.parse is packet.parse
        return
    assert speedups.compiled is not None, (
        "rtp/_speedups.c is not built: pip install -e . (or setup.py build_ext)"
    )
    assert speedups.COMPILED and speedups.MEDIA_PATH == "compiled"
    assert speedups.parse is speedups.compiled.parse and speedups.parse is not packet.parse


def test_doctor_reports_the_media_path() -> None:
    from bridge.cli.config import BridgeConfig
    from bridge.cli.doctor import check_engine

    found = {f.check: f for f in check_engine(BridgeConfig())}
    assert found["media path"].status == "ok"
    assert found["media path"].detail.startswith("compiled" if speedups.COMPILED else "pure Python")


async def test_get_sip_reports_the_media_path(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, _calls = await engine_factory()
    assert agent.sip_status()["media_path"] == speedups.MEDIA_PATH
