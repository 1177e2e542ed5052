"""`parlora-bridge doctor` against the local fakes and a bridge on loopback (no outside network):
one line per check, exit 1 on a failure, keys named and never printed."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import peers
from conftest import BRIDGE, _clean_env

KEY = "sk-doctor-4d1e9b7a-never-printed"


def _doctor(*args: str, env: dict[str, str] | None = None, cwd: Path) -> tuple[int, list[str]]:
    done = subprocess.run(
        [*BRIDGE, "doctor", "--timeout", "3", *args],
        cwd=cwd,
        env=_clean_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert KEY not in done.stdout + done.stderr
    return done.returncode, done.stdout.splitlines()


def _free_sip() -> list[str]:
    port = peers.free_udp_port(also_tcp=True)
    return ["--sip", f"127.0.0.1:{port}", "--rtp-port", str(peers.free_rtp_port())]


def _line(lines: list[str], check: str) -> str:
    found = [line for line in lines if line.split(maxsplit=1)[-1].startswith(check + ":")]
    assert len(found) == 1, (check, lines)
    return found[0]


def test_doctor_passes_against_a_reachable_fake_with_a_key(start_fake, tmp_path: Path) -> None:
    fake = start_fake("openai-realtime")
    rc, lines = _doctor(
        *_free_sip(), *fake.bridge_args("openai-realtime"), env={"OPENAI_API_KEY": KEY}, cwd=tmp_path
    )
    assert rc == 0, lines
    assert _line(lines, "key openai-realtime").endswith("$OPENAI_API_KEY is set (not shown)")
    assert _line(lines, "provider openai-realtime dns").startswith("ok")
    assert _line(lines, "provider openai-realtime tcp").startswith("ok")
    assert _line(lines, "provider openai-realtime auth").startswith(
        "ok   provider openai-realtime auth: key accepted"
    )
    assert _line(lines, "engine native").startswith("ok") and _line(lines, "port sip udp").startswith("ok")


def test_doctor_checks_the_tls_handshake_with_the_configured_ca(start_fake, tmp_path: Path) -> None:
    fake = start_fake("gemini-live")
    rc, lines = _doctor(
        *_free_sip(), *fake.bridge_args("gemini-live"), env={"GEMINI_API_KEY": KEY}, cwd=tmp_path
    )
    assert rc == 0, lines
    assert "certificate verified for localhost" in _line(lines, "provider gemini-live tls")
    assert _line(lines, "provider gemini-live auth").startswith("ok")
    # Without the fake's CA the same endpoint fails the handshake: the check can fail.
    url = fake.bridge_args("gemini-live")[3]
    rc, lines = _doctor(
        *_free_sip(),
        "--provider",
        "gemini-live",
        "--provider-url",
        url,
        env={"GEMINI_API_KEY": KEY},
        cwd=tmp_path,
    )
    assert rc == 1 and _line(lines, "provider gemini-live tls").startswith("FAIL"), lines


def test_doctor_fails_on_a_refused_session_a_missing_key_a_busy_port_and_a_silent_registrar(
    start_fake, tmp_path: Path
) -> None:
    refusing = start_fake("openai-realtime", "--fault", "refuse")
    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy.bind(("127.0.0.1", 0))
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        rc, lines = _doctor(
            "--sip",
            f"127.0.0.1:{busy.getsockname()[1]}",
            *refusing.bridge_args("openai-realtime"),
            "--register",
            f"sip:bridge@127.0.0.1:{silent.getsockname()[1]}",
            env={"OPENAI_API_KEY": KEY},
            cwd=tmp_path,
        )
        assert rc == 1, lines
        assert _line(lines, "port sip udp").startswith("FAIL")
        assert _line(lines, "provider openai-realtime tcp").startswith("ok")
        assert _line(lines, "provider openai-realtime auth").startswith("FAIL")
        assert "no answer to OPTIONS" in _line(
            lines, f"registrar sip:bridge@127.0.0.1:{silent.getsockname()[1]}"
        )
        assert _line(lines, "secret trunks[0].password_env").endswith("$PARLORA_SIP_PASSWORD is not set")
        rc, lines = _doctor(*_free_sip(), *refusing.bridge_args("openai-realtime"), cwd=tmp_path)
        assert rc == 1 and _line(lines, "key openai-realtime").startswith("FAIL"), lines
        assert _line(lines, "provider openai-realtime auth").startswith("warn")  # not tried without a key
    finally:
        busy.close()
        silent.close()


def test_doctor_probes_a_registrar_that_answers(start_bridge, tmp_path: Path) -> None:
    registrar = start_bridge("--provider", "echo")  # a SIP UA on loopback answers OPTIONS with 200
    rc, lines = _doctor(
        *_free_sip(),
        "--register",
        f"sip:bridge@127.0.0.1:{registrar.sip_port}",
        env={"PARLORA_SIP_PASSWORD": "pw-not-needed"},
        cwd=tmp_path,
    )
    assert rc == 0, lines
    assert _line(lines, f"registrar sip:bridge@127.0.0.1:{registrar.sip_port}").endswith(
        "answered OPTIONS: 200 OK"
    )


def test_doctor_reports_a_bad_config_file_with_its_key_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[defaults]\nprovider = "gpt"\n[listners]\n')
    rc, lines = _doctor("--config", str(bad), cwd=tmp_path)
    assert rc == 1
    assert all(line.startswith("FAIL config:") for line in lines) and len(lines) == 2, lines
    assert any("defaults.provider" in line for line in lines) and any("listners" in line for line in lines)
    good = tmp_path / "good.toml"
    port = peers.free_udp_port(also_tcp=True)
    good.write_text(f'[listeners]\nsip_udp = "127.0.0.1:{port}"\n[defaults]\nprovider = "echo"\n')
    rc, lines = _doctor("--config", str(good), "--rtp-port", str(peers.free_rtp_port()), cwd=tmp_path)
    assert rc == 0, lines
    assert _line(lines, "config").endswith("valid (0 routes, 0 trunks)")
    assert _line(lines, "port sip udp") == f"ok   port sip udp: 127.0.0.1:{port} free"
