"""Inbound headers on `serve` (native engine) with SIPp on loopback: an INVITE with X-Customer-Id,
P-Asserted-Identity and an unlisted Subject, from a trunk marked --trust-identity-headers, is answered and its
CDR line carries the two allowlisted headers (not Subject) and P-Asserted-Identity's number as the caller."""

from __future__ import annotations

import json
import time
from pathlib import Path

import peers


def test_allowlisted_headers_and_the_trusted_caller_reach_the_cdr(start_bridge, tmp_path: Path) -> None:
    cdr = tmp_path / "cdr.jsonl"
    bridge = start_bridge("--allow", "127.0.0.1/32", "--trust-identity-headers", "--cdr", str(cdr))
    run = peers.run_sipp("uac_headers", bridge.sip_port, workdir=tmp_path / "sipp", timeout=25)
    logs = (run.workdir / "sipp_logs.log").read_text(errors="replace")
    assert "ANSWERED" in logs and "CLOSED" in logs, logs[-2000:]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (cdr.exists() and cdr.read_text().strip()):
        time.sleep(0.05)
    [line] = cdr.read_text().splitlines()
    call = json.loads(line)["call"]
    assert call["sip_headers"] == [
        ["X-Customer-Id", "c-42"],
        ["P-Asserted-Identity", '"Bob" <sip:+4930222@carrier.example>'],
    ], call
    assert "unlisted-secret" not in line
    assert (call["caller"], call["identity_trusted"], call["trunk"]) == ("+4930222", True, "cli"), call
