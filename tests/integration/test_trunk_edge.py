"""The trunk edge on `serve` (native engine), with real peers on loopback.

- A caller from 127.0.0.2 with `--allow 127.0.0.1/32` gets 403 (SIPp's uac_busy logs REJECTED ... 403); the
  fake provider records no connection and the bridge logs no session; `GET /sip` counts the refusal. The same
  scenario from 127.0.0.1 is answered (the control: the provider then sees the call).
- `serve` bound off loopback with no policy refuses to start (it exits before binding anything).
- Registration at a SIPp registrar (digest verified by `verifyauth`, un-REGISTER on stop; a wrong password
  reported) and the OPTIONS keepalive towards it (`--keepalive 1`, counters in `GET /registrations`).
- Outbound: `POST /calls` and `parlora-bridge call` to SIPp callees: a 401 challenge answered, the provider
  connection open while the callee rings, RTP both ways; a busy callee → the 486 printed and exit status 1.
- Call limits: `--rtp-timeout` BYEs a silent call; `--max-call-duration` asks the model for a goodbye, then BYE.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import peers
import pytest
from conftest import BRIDGE, _clean_env

from tests.support.trunk_edge import SCENARIOS, _call, _callee, _frames, _get, _post, _wait_json


@pytest.mark.skipif(not peers.second_loopback_usable(), reason="127.0.0.2 is not usable")
def test_a_caller_outside_the_allowlist_gets_403_and_no_provider_session(
    start_fake, start_bridge, tmp_path: Path
) -> None:
    fake = start_fake()
    http_port = peers.free_udp_port(also_tcp=True)
    bridge = start_bridge(
        *fake.bridge_args("openai-live"),
        "--allow",
        "127.0.0.1/32",
        "--http",
        f"127.0.0.1:{http_port}",
        env={"OPENAI_API_KEY": "sk-test"},
    )
    bridge.wait_for(r"inbound policy: allow 127\.0\.0\.1/32; others 403")
    refused = peers.run_sipp(
        "uac_busy",
        bridge.sip_port,
        workdir=tmp_path / "outsider",
        timeout=25,
        trace_msg=True,
        extra_args=["-i", "127.0.0.2", "-mi", "127.0.0.2"],
    )
    logs = (refused.workdir / "sipp_logs.log").read_text(errors="replace")
    assert "REJECTED" in logs and " 403" in logs, logs[-2000:]
    messages = (refused.workdir / "sipp_messages.log").read_text(errors="replace")
    assert "SIP/2.0 180" not in messages  # refused before anything else: not even ringing
    status = _get(http_port, "/sip")
    policy = status["policy"]
    assert isinstance(policy, dict)
    assert policy["counters"] == {"not_allowed": 1} and policy["refused_403"] == 1, status
    assert _get(http_port, "/calls")["calls"] == []
    assert _frames(fake.record) == 0  # the provider never heard of it
    assert "session" not in bridge.log.split("inbound policy:", 1)[1].lower(), bridge.log[-3000:]

    # the control: the same call from an allowed source is answered, and the provider sees it
    allowed = peers.run_sipp(
        "uac_busy",
        bridge.sip_port,
        workdir=tmp_path / "insider",
        timeout=25,
        extra_args=["-set", "hold_ms", "1500"],
    )
    logs = (allowed.workdir / "sipp_logs.log").read_text(errors="replace")
    # a call answered but not closed: SIPp's errors say what came instead of the 200, the bridge log why
    why = f"{logs[-2000:]}\nSIPp rc={allowed.returncode}: {allowed.errors[-2000:]}\nbridge: {bridge.log[-3000:]}"
    assert "ANSWERED" in logs and "CLOSED" in logs, why
    assert _frames(fake.record) > 0


def test_serve_off_loopback_with_no_policy_refuses_to_start(tmp_path: Path) -> None:
    port = peers.free_udp_port()
    argv = [*BRIDGE, "serve", "--sip", f"0.0.0.0:{port}", "--log-level", "info"]
    # refused before any socket is bound (sip.engine.check_listen runs first in Server.start)
    done = subprocess.run(argv, cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "refusing to listen on 0.0.0.0" in done.stderr and "--allow-any" in done.stderr
    assert "listening on udp" not in done.stderr


def test_serve_registers_with_digest_at_a_sipp_registrar_and_unregisters_on_shutdown(
    start_bridge, tmp_path: Path
) -> None:
    registrar_port = peers.free_udp_port()
    logs = tmp_path / "registrar.log"
    sipp = peers.ManagedProcess(
        [
            "sipp",
            "-sf",
            str(SCENARIOS / "uas_register_auth.xml"),
            "-i",
            "127.0.0.1",
            "-p",
            str(registrar_port),
            "-m",
            "1",
            "-set",
            "pw",
            "pw-1001",
            "-nostdin",
            "-trace_logs",
            "-log_file",
            str(logs),
            "-timeout",
            "40s",
        ],
        cwd=tmp_path,
        name="sipp-registrar",
    )
    try:
        http_port = peers.free_udp_port(also_tcp=True)
        aor = f"sip:1001@127.0.0.1:{registrar_port}"
        bridge = start_bridge(
            "--register", aor, "--http", f"127.0.0.1:{http_port}", env={"PARLORA_SIP_PASSWORD": "pw-1001"}
        )
        bridge.wait_for(rf"registered {aor} \(expires in 60 s\)", timeout=15)
        registrations = _get(http_port, "/registrations")["registrations"]
        assert isinstance(registrations, list) and len(registrations) == 1
        assert registrations[0]["state"] == "registered" and registrations[0]["granted_expires_s"] == 60
        assert registrations[0]["last_error"] is None
        assert "pw-1001" not in bridge.log  # the password is never logged
        assert bridge.stop() == 0
        assert sipp.wait(15) is not None, "the registrar did not see the un-REGISTER"
    finally:
        sipp.stop(term_timeout=3.0)
    text = logs.read_text(errors="replace")
    assert "REGISTERED" in text and "BADAUTH" not in text, text
    assert "UNREGISTERED 0" in text, text


def test_serve_keeps_a_registration_alive_with_options_a_sipp_registrar_answers(
    start_bridge, tmp_path: Path
) -> None:
    registrar_port = peers.free_udp_port()
    logs = tmp_path / "registrar.log"
    sipp = peers.ManagedProcess(
        [
            "sipp", "-sf", str(SCENARIOS / "uas_register_options.xml"), "-i", "127.0.0.1", "-p",
            str(registrar_port), "-m", "1", "-nostdin", "-trace_logs", "-log_file", str(logs), "-trace_msg",
            "-message_file", str(tmp_path / "registrar-messages.log"), "-timeout", "30s",
        ],
        cwd=tmp_path,
        name="sipp-registrar",
    )  # fmt: skip
    try:
        http_port = peers.free_udp_port(also_tcp=True)
        aor = f"sip:1001@127.0.0.1:{registrar_port}"
        bridge = start_bridge("--register", aor, "--keepalive", "1", "--http", f"127.0.0.1:{http_port}")
        bridge.wait_for(rf"registered {aor} \(expires in 60 s\)", timeout=15)
        bridge.wait_for(rf"registrar of {aor} answers OPTIONS \(200\)", timeout=10)
        body = _wait_json(
            http_port, "/registrations", lambda b: b["registrations"][0]["keepalive"]["answered"] >= 2
        )
        [registration] = body["registrations"]  # type: ignore[misc]
        keepalive = registration["keepalive"]
        assert keepalive["state"] == "ok" and keepalive["interval_s"] == 1.0 and keepalive["answered"] >= 2
        assert keepalive["failures"] == 0 and keepalive["last_status"] == 200
        assert registration["state"] == "registered"
        assert bridge.stop() == 0
        assert sipp.wait(15) is not None, "the registrar did not see the un-REGISTER"
    finally:
        sipp.stop(term_timeout=3.0)
    text = logs.read_text(errors="replace")
    assert text.count("OPTIONS") >= 2 and "UNREGISTERED" in text, text


def test_serve_with_a_wrong_sip_password_reports_the_failure(start_bridge, tmp_path: Path) -> None:
    registrar_port = peers.free_udp_port()
    logs = tmp_path / "registrar.log"
    sipp = peers.ManagedProcess(
        [
            "sipp",
            "-sf",
            str(SCENARIOS / "uas_register_auth.xml"),
            "-i",
            "127.0.0.1",
            "-p",
            str(registrar_port),
            "-m",
            "1",
            "-set",
            "pw",
            "pw-1001",
            "-nostdin",
            "-trace_logs",
            "-log_file",
            str(logs),
            "-timeout",
            "30s",
        ],
        cwd=tmp_path,
        name="sipp-registrar",
    )
    try:
        http_port = peers.free_udp_port(also_tcp=True)
        aor = f"sip:1001@127.0.0.1:{registrar_port}"
        bridge = start_bridge(
            "--register", aor, "--http", f"127.0.0.1:{http_port}", env={"PARLORA_SIP_PASSWORD": "wrong"}
        )
        bridge.wait_for(rf"registration {aor} failed \(403 Forbidden", timeout=15)
        registrations = _get(http_port, "/registrations")["registrations"]
        assert isinstance(registrations, list) and registrations[0]["state"] == "failed"
        assert registrations[0]["last_status"] == 403
        assert sipp.wait(15) is not None, "the registrar's one call did not end"
    finally:
        sipp.stop(term_timeout=3.0)
    assert "BADAUTH" in logs.read_text(errors="replace")


def test_post_calls_places_a_call_that_a_sipp_callee_answers_and_hears_the_provider(
    start_fake, start_bridge, tmp_path: Path
) -> None:
    fake = start_fake()
    callee, port, logs = _callee("uas_answer_bye", tmp_path, "-rtp_echo", "-set", "talk_ms", "4000")
    try:
        http_port = peers.free_udp_port(also_tcp=True)
        bridge = start_bridge(
            *fake.bridge_args("openai-live"),
            "--http",
            f"127.0.0.1:{http_port}",
            env={"OPENAI_API_KEY": "sk-test"},
        )
        status, body = _post(http_port, "/calls", {"to": f"sip:callee@127.0.0.1:{port}"})
        assert status == 202, body
        call = body["call"]
        assert callee.wait(30) is not None, "the callee's call did not finish"
        sip = _wait_json(http_port, "/sip", lambda b: b["outbound"])
        assert sip["outbound"] and sip["outbound"][0]["outcome"] == "answered", sip  # type: ignore[index]
        assert sip["outbound"][0]["call"] == call  # type: ignore[index]
    finally:
        callee.stop(term_timeout=3.0)
    text = logs.read_text(errors="replace")
    assert "ANSWERED" in text and "HUNGUP" in text, text
    assert _frames(fake.record) > 0  # the provider heard the callee (SIPp echoed the bridge's RTP)
    bridge.wait_for(rf"{call} media: PCMU/8000", timeout=5)


def test_post_calls_to_a_busy_callee_reports_486(start_bridge, tmp_path: Path) -> None:
    callee, port, logs = _callee("uas_busy_486", tmp_path)
    try:
        http_port = peers.free_udp_port(also_tcp=True)
        bridge = start_bridge("--http", f"127.0.0.1:{http_port}")
        status, body = _post(http_port, "/calls", {"to": f"sip:callee@127.0.0.1:{port}"})
        assert status == 202, body
        assert callee.wait(20) is not None
        sip = _wait_json(http_port, "/sip", lambda b: b["outbound"])
        outbound = sip["outbound"]
        assert (
            isinstance(outbound, list) and outbound[0]["outcome"] == "busy" and outbound[0]["status"] == 486
        )
        bridge.wait_for(r"outbound call to sip:callee@127\.0\.0\.1:\d+ busy \(486", timeout=5)
        assert _post(http_port, "/calls", {"to": "not a uri"})[0] == 400
    finally:
        callee.stop(term_timeout=3.0)
    assert "BUSY" in logs.read_text(errors="replace")


def test_rtp_timeout_ends_a_call_whose_caller_went_silent(start_bridge, tmp_path: Path) -> None:
    bridge = start_bridge("--rtp-timeout", "2", "--http", f"127.0.0.1:{peers.free_udp_port(also_tcp=True)}")
    started = time.monotonic()
    # SIPp's uac_wait_bye sends no RTP and waits for the bridge's BYE (a caller whose BYE was lost)
    result = peers.run_sipp(
        "uac_wait_bye", bridge.sip_port, workdir=tmp_path / "sipp", timeout=30, trace_msg=True
    )
    assert result.returncode == 0, (result.workdir / "sipp_messages.log").read_text(errors="replace")[-3000:]
    assert time.monotonic() - started >= 2.0
    bridge.wait_for(r"call-1: no RTP from the caller for 2 s \(--rtp-timeout\); BYE", timeout=5)
    bridge.wait_for(r"call call-1 ended", timeout=10)


def test_max_call_duration_says_goodbye_then_ends_the_call(start_fake, start_bridge, tmp_path: Path) -> None:
    # the Realtime fake answers a spoken update with audio (the GPT-Live echo only answers caller speech)
    fake = start_fake("openai-realtime")
    bridge = start_bridge(
        *fake.bridge_args("openai-realtime"), "--max-call-duration", "2", env={"OPENAI_API_KEY": "sk-test"}
    )
    started = time.monotonic()
    result = peers.run_sipp(
        "uac_wait_bye", bridge.sip_port, workdir=tmp_path / "sipp", timeout=30, trace_msg=True
    )
    took = time.monotonic() - started
    assert result.returncode == 0, (result.workdir / "sipp_messages.log").read_text(errors="replace")[-3000:]
    # the engine hands the limit to the session (a goodbye from the model, then BYE), not a BYE at once
    bridge.wait_for(r"call-1: the call reached --max-call-duration \(2 s\); goodbye, then BYE", timeout=5)
    ended = bridge.wait_for(
        r"call call-1 ended after [\d.]+ s by bridge \(the call reached --max-call-duration \(2 s\)\): "
        r"frames in \d+, out (\d+)",
        timeout=10,
    )
    assert int(ended.group(1)) > 0  # the goodbye the model spoke left before the BYE
    assert "no BYE 12 s after the goodbye" not in bridge.log  # the session's BYE, not the engine's backstop
    print(f"BYE after {took:.1f} s")


# `parlora-bridge call`: one outbound call from the command line.


def _log_time(log: str, pattern: str) -> float:
    """The wall-clock time (s) of the bridge's first log line matching `pattern` (its asctime, local time)."""
    match = re.search(rf"^(\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{{3}}) .*{pattern}", log, re.MULTILINE)
    assert match, f"no log line {pattern!r}"
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(match.group(2)) / 1000


def test_call_answers_a_401_challenge_rings_with_the_provider_open_and_the_callee_hears_it(
    start_fake, tmp_path: Path
) -> None:
    fake = start_fake()
    callee, port, logs = _callee(
        "uas_invite_auth", tmp_path, "-rtp_echo", "-set", "pw", "pw-1001", "-set", "ring_ms", "2000",
        "-set", "talk_ms", "3000",
    )  # fmt: skip
    call = _call(
        tmp_path,
        f"sip:1001@127.0.0.1:{port}",
        *fake.bridge_args("openai-live"),
        "--auth-user",
        "1001",
        env={"PARLORA_SIP_PASSWORD": "pw-1001", "OPENAI_API_KEY": "sk-test"},
    )
    try:
        assert call.wait(30) == 0, call.stderr[-3000:]
        assert callee.wait(10) is not None
    finally:
        call.stop()
        callee.stop(term_timeout=3.0)
    text = logs.read_text(errors="replace")
    assert "ANSWERED" in text and "HUNGUP" in text and "BADAUTH" not in text, text
    messages = (tmp_path / "uas_invite_auth-messages.log").read_text(errors="replace")
    assert re.search(r'Authorization: Digest username="1001", realm="sipp\.test"', messages), messages[-3000:]
    assert "pw-1001" not in call.stderr + call.stdout  # the password is never logged
    # the provider connection opened while the callee rang (for 2 s), not after the answer: the first words
    # are not late. (The fake's opened_ns is CLOCK_MONOTONIC, the bridge's log line the wall clock: both are
    # this machine's clocks, compared through this process's offset between them.)
    [opened] = [
        json.loads(line)["opened_ns"] for line in Path(f"{fake.record}.connections").read_text().splitlines()
    ]
    opened_wall = (opened + time.time_ns() - time.monotonic_ns()) / 1e9
    ringing, answered = (_log_time(call.stderr, rf"call-1: {what}") for what in ("180 Ringing", "answered"))
    assert ringing - 0.1 < opened_wall < answered - 1.0, (ringing, opened_wall, answered)
    assert re.search(r"call-1: call to sip:1001@127\.0\.0\.1:\d+: answered \(SIP 200", call.stdout), (
        call.stdout
    )
    # RTP came back: SIPp echoed the bridge's RTP, and the provider heard it (seconds of caller audio)
    appends = [line for line in fake.record.read_text().splitlines() if "input_audio" in line]
    assert len(appends) > 50, len(appends)


def test_call_to_a_busy_callee_prints_486_and_exits_non_zero(tmp_path: Path) -> None:
    callee, port, logs = _callee("uas_busy_486", tmp_path)
    call = _call(tmp_path, f"sip:callee@127.0.0.1:{port}")
    try:
        assert call.wait(30) == 1, call.stderr[-3000:]
        assert callee.wait(10) is not None
    finally:
        call.stop()
        callee.stop(term_timeout=3.0)
    assert re.search(
        r"call-1: call to sip:callee@127\.0\.0\.1:\d+: busy \(SIP 486: 486 Busy Here\)", call.stdout
    )
    assert "BUSY" in logs.read_text(errors="replace")


def test_call_with_a_bad_target_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [*BRIDGE, "call", "tel:+15550001"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "expected sip:NUMBER@HOST[:PORT]" in done.stderr, done.stderr


def test_amd_holds_the_greeting_of_a_call_to_a_voicemail_until_its_beep(
    start_fake, start_bridge, tmp_path: Path
) -> None:
    # A recorded greeting (espeak-ng, several sentences) then a 1 kHz beep, made here, never committed.
    words = tmp_path / "words.wav"
    peers.make_utterance(
        words,
        "Hello, you have reached the voicemail of Alex Morgan. I cannot take your call right now. "
        "Please leave your name, your number and a short message after the tone, and I will call you back.",
        lead_silence_s=0.3,
        tail_silence_s=0.5,
    )
    beep = tmp_path / "beep.wav"
    subprocess.run(["sox", "-n", "-r", "8000", "-c", "1", "-b", "16", str(beep), "synth", "0.4", "sine", "1000",
                    "vol", "0.3"], check=True, timeout=30)  # fmt: skip
    greeting = tmp_path / "greeting.wav"
    subprocess.run(["sox", str(words), str(beep), str(greeting), "pad", "0", "2"], check=True, timeout=30)
    peers.make_ulaw(greeting, tmp_path / "greeting.ul")
    fake = start_fake()
    callee, port, logs = _callee("uas_voicemail", tmp_path, "-set", "talk_ms", "14000")
    try:
        http_port = peers.free_udp_port(also_tcp=True)
        bridge = start_bridge(
            *fake.bridge_args("openai-live"),
            "--http",
            f"127.0.0.1:{http_port}",
            "--amd",
            env={"OPENAI_API_KEY": "sk-test"},
        )
        status, body = _post(http_port, "/calls", {"to": f"sip:callee@127.0.0.1:{port}"})
        assert status == 202, body
        call = body["call"]
        bridge.wait_for(rf"{call} AMD verdict machine after \d+ ms", timeout=20)
        bridge.wait_for(rf"{call} AMD AmdBeep after \d+ ms", timeout=20)
        assert callee.wait(30) is not None, "the callee's call did not finish"
    finally:
        callee.stop(term_timeout=3.0)
    assert "ANSWERED" in logs.read_text(errors="replace")
