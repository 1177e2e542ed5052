"""Harness moved unchanged from tests/integration/test_trunk_edge.py: SCENARIOS, _call, _callee, _frames, _get, _post, _wait_json."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import peers
from conftest import BRIDGE, _clean_env


def _get(port: int, path: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        body: dict[str, object] = json.loads(answer.read())
        return body


def _frames(record: Path) -> int:
    return len(record.read_text().splitlines()) if record.exists() else 0


SCENARIOS = Path(__file__).resolve().parents[1] / "integration" / "scenarios"


def _post(port: int, path: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _callee(scenario: str, tmp_path: Path, *extra: str) -> tuple[peers.ManagedProcess, int, Path]:
    port = peers.free_udp_port()
    media = peers.free_rtp_port()
    logs = tmp_path / f"{scenario}.log"
    proc = peers.ManagedProcess(
        [
            "sipp",
            "-sf",
            str(SCENARIOS / f"{scenario}.xml"),
            "-i",
            "127.0.0.1",
            "-mi",
            "127.0.0.1",
            "-p",
            str(port),
            "-mp",
            str(media),
            "-m",
            "1",
            "-nostdin",
            "-trace_logs",
            "-log_file",
            str(logs),
            "-trace_msg",
            "-message_file",
            str(tmp_path / f"{scenario}-messages.log"),
            "-timeout",
            "40s",
            *extra,
        ],
        cwd=tmp_path,
        name=f"sipp-{scenario}",
    )
    return proc, port, logs


def _wait_json(port: int, path: str, predicate, timeout: float = 15.0) -> dict[str, object]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        body = _get(port, path)
        if predicate(body) or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def _call(tmp_path: Path, target: str, *args: str, env: dict[str, str] | None = None) -> peers.ManagedProcess:
    argv = [*BRIDGE, "call", target, "--rtp-port", str(peers.free_rtp_port()), *args, "--log-level", "info"]
    return peers.ManagedProcess(argv, cwd=tmp_path, env=_clean_env(env), name="parlora-bridge-call")
