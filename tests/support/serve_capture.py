"""The Server `serve` would run, captured instead of run (for tests of what the command line builds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import commands as cli
from bridge.server.api import Server


def capture_servers(monkeypatch: pytest.MonkeyPatch) -> list[Server]:
    """Every Server `serve` builds from now on, appended here; `serve` returns 0 without running it."""
    servers: list[Server] = []

    def fake_run(server: Server, event_loop: str) -> int:
        servers.append(server)
        return 0

    monkeypatch.setattr(cli, "_run_server", fake_run)
    return servers


def serve(args: list[str], captured: list[Server]) -> tuple[int, str]:
    """`parlora-bridge serve ARGS` with the servers captured: its exit code and output."""
    captured.clear()
    result = CliRunner().invoke(cli.main, ["serve", *args])
    return result.exit_code, result.output


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    return path
