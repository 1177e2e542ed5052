"""Outbound calls under `serve --config FILE`, live: `POST /calls` to a SIPp callee whose number an inbound route
also matches. The call gets the outbound route's instructions and greeting (the GPT-Live fake records the
`session.start` and the greeting's commentary), goes out on the trunk whose `allow` network holds the callee's
address, and that trunk's own credentials answer the callee's 401 (SIPp's verifyauth); naming an inbound route
is a 400 and places nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import peers

from tests.support.trunk_edge import _call, _callee, _post, _wait_json

CONFIG = """
[listeners]
sip_udp = "127.0.0.1:9"          # overridden by the test's --sip
[defaults]
provider = "openai-live"
instructions = "default words"
[providers.openai-live]
key_env = "TEST_LIVE_KEY"
url = "{url}"
[[trunks]]
name = "carrier"
registrar = "sip:acct@127.0.0.3:9"   # a carrier that never answers
auth_user = "acct"
password_env = "CARRIER_PASSWORD"
[[trunks]]
name = "loopback-pbx"
allow = ["127.0.0.1/32"]
auth_user = "1001"
password_env = "PBX_PASSWORD"
[[routes]]
name = "reception"
number = "1001"
instructions = "inbound reception words"
greeting = "Say: reception, good morning."
[[routes]]
name = "reminders"
direction = "outbound"
number = "1001"
instructions = "outbound reminder words"
greeting = "Say: this is your appointment reminder."
"""


def _client_frames(record: Path, kind: str) -> list[dict[str, object]]:
    frames = []
    for line in record.read_text().splitlines():
        entry = json.loads(line)
        frame = entry.get("frame", entry)
        if isinstance(frame, dict) and frame.get("type") == kind:
            frames.append(frame)
    return frames


def test_post_calls_under_a_config_uses_the_outbound_route_and_the_trunks_credentials(
    start_fake, start_bridge, tmp_path: Path
) -> None:
    fake = start_fake("openai-live")
    config = tmp_path / "bridge.toml"
    config.write_text(CONFIG.format(url=fake.url))
    callee, port, logs = _callee(
        "uas_invite_auth", tmp_path, "-rtp_echo", "-set", "pw", "pw-1001", "-set", "talk_ms", "3000"
    )
    try:
        http_port = peers.free_udp_port(also_tcp=True)
        bridge = start_bridge(
            "--config",
            str(config),
            "--http",
            f"127.0.0.1:{http_port}",
            env={
                "TEST_LIVE_KEY": "sk-live-test",
                "CARRIER_PASSWORD": "carrier-pw",
                "PBX_PASSWORD": "pw-1001",
            },
        )
        status, body = _post(http_port, "/calls", {"to": f"sip:1001@127.0.0.1:{port}", "route": "reception"})
        assert status == 400 and "inbound route" in str(body["error"]), body  # nothing placed
        status, body = _post(http_port, "/calls", {"to": f"sip:1001@127.0.0.1:{port}"})
        assert status == 202, body
        call = body["call"]
        assert callee.wait(30) is not None, "the callee's call did not finish"
        sip = _wait_json(http_port, "/sip", lambda b: b["outbound"])
        assert sip["outbound"][0]["outcome"] == "answered", sip  # type: ignore[index]
        bridge.wait_for(rf"call {call}: route reminders", timeout=5)
        bridge.wait_for(rf"call {call}: to sip:1001@127\.0\.0\.1:\d+ via trunk loopback-pbx", timeout=5)
        bridge.wait_for(rf"call {call}: greeting asked of the model", timeout=10)
    finally:
        callee.stop(term_timeout=3.0)
    text = logs.read_text(errors="replace")
    # the loopback trunk's password answered the challenge, not the carrier's
    assert "ANSWERED" in text and "BADAUTH" not in text, text
    messages = (tmp_path / "uas_invite_auth-messages.log").read_text(errors="replace")
    assert re.search(r'Authorization: Digest username="1001", realm="sipp\.test"', messages), messages[-3000:]
    [start] = _client_frames(fake.record, "session.start")
    session = start["session"]
    assert isinstance(session, dict) and session["instructions"] == "outbound reminder words", session
    greetings = [str(f) for f in _client_frames(fake.record, "session.commentary.append")]
    assert any("this is your appointment reminder" in g for g in greetings), greetings
    assert not any("reception" in g for g in greetings), greetings
    assert "pw-1001" not in bridge.log and "carrier-pw" not in bridge.log


def test_call_with_a_config_file_places_the_call_on_the_outbound_route(start_fake, tmp_path: Path) -> None:
    fake = start_fake("openai-live")
    config = tmp_path / "bridge.toml"
    config.write_text(CONFIG.format(url=fake.url))
    callee, port, logs = _callee(
        "uas_invite_auth", tmp_path, "-rtp_echo", "-set", "pw", "pw-1001", "-set", "talk_ms", "2000"
    )
    env = {"TEST_LIVE_KEY": "sk-live-test", "CARRIER_PASSWORD": "carrier-pw", "PBX_PASSWORD": "pw-1001"}
    call = _call(tmp_path, f"sip:1001@127.0.0.1:{port}", "--config", str(config), env=env)
    try:
        assert call.wait(30) == 0, call.stderr[-3000:]
        assert callee.wait(10) is not None
    finally:
        call.stop()
        callee.stop(term_timeout=3.0)
    assert "ANSWERED" in logs.read_text(errors="replace")
    assert re.search(r"call-1: route reminders", call.stderr), call.stderr[-3000:]
    assert re.search(r"call-1: to sip:1001@127\.0\.0\.1:\d+ via trunk loopback-pbx", call.stderr)
    [start] = _client_frames(fake.record, "session.start")
    assert start["session"]["instructions"] == "outbound reminder words"  # type: ignore[index]
