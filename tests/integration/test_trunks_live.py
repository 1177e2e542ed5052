"""Trunks as identities, live: `serve --config` with two trunks, callers from three loopback addresses.

The office PBX (127.0.0.2, no credentials; SIPp, tests/integration/scenarios/uac_auth.xml) is answered without
a challenge; the carrier (127.0.0.3, an inbound digest user) is challenged with 401: pjsua2 answers with the
carrier's user and is answered, SIPp from that address is challenged too; a source of neither trunk
(127.0.0.4) is refused with 403. Each call's record and log line name its trunk. Before trunks were
identities the carrier's digest challenged every source, the PBX included."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import peers
import pytest

CONFIG = """
[defaults]
provider = "echo"
[logging]
cdr = "calls.jsonl"
[[trunks]]
name = "office-pbx"
allow = ["127.0.0.2/32"]
[[trunks]]
name = "carrier"
allow = ["127.0.0.3/32"]
inbound_auth_user = "carrier-in"
inbound_password_env = "TEST_CARRIER_PASSWORD"
"""


def _policy(http_port: int) -> dict[str, Any]:
    """The inbound policy's counters (GET /sip)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/sip", timeout=5) as answer:
        policy: dict[str, Any] = json.loads(answer.read())["policy"]
        return policy


def _from(address: str) -> list[str]:
    return ["-i", address, "-mi", address]


@pytest.mark.skipif(
    not all(peers.can_bind(f"127.0.0.{n}") for n in (2, 3, 4)), reason="127.0.0.2-4 are not usable"
)
def test_the_pbx_is_answered_unchallenged_and_the_carrier_is_challenged(start_bridge, tmp_path: Path) -> None:
    config = tmp_path / "bridge.toml"
    config.write_text(CONFIG)
    http_port = peers.free_udp_port(also_tcp=True)
    bridge = start_bridge(
        "--config", str(config), "--http", f"127.0.0.1:{http_port}", env={"TEST_CARRIER_PASSWORD": "carrier-secret-1"}
    )  # fmt: skip
    bridge.wait_for(r"inbound policy: ")

    pbx = peers.run_sipp(
        "uac_auth", bridge.sip_port, workdir=tmp_path / "pbx", timeout=30, trace_msg=True,
        extra_args=_from("127.0.0.2"),
    )  # fmt: skip
    assert pbx.logs and [line.split()[0] for line in pbx.logs] == ["UNCHALLENGED", "CLOSED"], pbx.logs
    messages = (pbx.workdir / "sipp_messages.log").read_text(errors="replace")
    assert "SIP/2.0 401" not in messages and "WWW-Authenticate" not in messages
    assert _policy(http_port)["challenged"] == 0
    bridge.wait_for(r"call-1: from 127\.0\.0\.2:\d+ on trunk office-pbx")
    assert "trunk carrier: from 127.0.0.3/32, digest user 'carrier-in'" in bridge.log

    # SIPp 3.6 answers only the first challenge, SHA-256 here (RFC 8760), which it cannot: pjsua2 calls as the
    # carrier, answering the challenge with the carrier's user
    carrier = peers.run_pjsua2_caller(
        f"sip:bridge@127.0.0.1:{bridge.sip_port}", tmp_path / "carrier",
        args=["--bind", "127.0.0.3", "--duration", "1", "--auth-user", "carrier-in", "--auth-password", "carrier-secret-1"],
    )  # fmt: skip
    summary = carrier.summary
    assert summary.get("invite_status") == 200 and summary.get("answered"), (summary, carrier.stderr[-2000:])
    policy = _policy(http_port)  # challenged first, then answered with the carrier's credentials
    assert policy["challenged"] == 1 and policy["counters"] == {"auth_missing": 1, "auth_ok": 1}, policy
    bridge.wait_for(r"call-2: from 127\.0\.0\.3:\d+ on trunk carrier")

    sipp = peers.run_sipp(  # SIPp from the carrier's address: challenged (it stops there, see above)
        "uac_auth", bridge.sip_port, workdir=tmp_path / "sipp-carrier", timeout=30, trace_msg=True,
        extra_args=[*_from("127.0.0.3"), "-au", "carrier-in", "-ap", "carrier-secret-1"],
    )  # fmt: skip
    messages = (sipp.workdir / "sipp_messages.log").read_text(errors="replace")
    assert "SIP/2.0 401 Unauthorized" in messages and 'realm="127.0.0.1"' in messages, messages[-2000:]
    assert [line.split()[0] for line in sipp.logs] == ["CHALLENGED"], sipp.logs

    stranger = peers.run_sipp(
        "uac_busy", bridge.sip_port, workdir=tmp_path / "stranger", timeout=30, extra_args=_from("127.0.0.4")
    )
    assert [line.split()[-1] for line in stranger.logs] == ["403"], stranger.logs

    bridge.wait_for(r"call call-2 ended after")
    records = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert sorted(r["call"]["trunk"] for r in records) == ["carrier", "office-pbx"], records
    trunks = {t["name"]: t for t in _policy(http_port)["trunks"]}
    assert (trunks["office-pbx"]["calls"], trunks["carrier"]["calls"]) == (1, 1), trunks
    assert trunks["carrier"]["inbound_user"] == "carrier-in" and "carrier-secret-1" not in json.dumps(trunks)
