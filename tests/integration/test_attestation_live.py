"""Caller-ID attestation on `serve` (native engine) with SIPp on loopback: a carrier's INVITE with
verstat=TN-Validation-Failed is refused with 608 under --refuse-failed-attestation, before any provider or
call, and counted in /metrics; one with TN-Validation-Passed and a SHAKEN Identity header (a PASSporT with a
dummy signature) is answered and its CDR line carries the attestation read from the wire."""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.request
from pathlib import Path

import peers


def _b64(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


IDENTITY = (
    _b64({"alg": "ES256", "typ": "passport", "ppt": "shaken", "x5u": "https://cert.example/c.pem"})
    + "."
    + _b64({"attest": "B", "orig": {"tn": "15551234567"}, "dest": {"tn": ["4930100"]}, "iat": 1765100000,
            "origid": "123e4567-e89b-12d3-a456-426655440000"})
    + "."
    + base64.urlsafe_b64encode(b"\x01" * 64).decode().rstrip("=")
    + ";info=<https://cert.example/c.pem>;alg=ES256;ppt=shaken"
)  # fmt: skip


def test_failed_attestation_gets_608_and_a_passed_one_reaches_the_cdr(start_bridge, tmp_path: Path) -> None:
    http_port = peers.free_udp_port(also_tcp=True)
    cdr = tmp_path / "cdr.jsonl"
    bridge = start_bridge(
        "--refuse-failed-attestation", "--cdr", str(cdr), "--http", f"127.0.0.1:{http_port}"
    )
    failed = peers.run_sipp(
        "uac_attested",
        bridge.sip_port,
        workdir=tmp_path / "failed",
        timeout=25,
        trace_msg=True,
        extra_args=["-set", "verstat", "TN-Validation-Failed", "-set", "identity", IDENTITY],
    )
    logs = (failed.workdir / "sipp_logs.log").read_text(errors="replace")
    assert re.search(r"^REFUSED \S+ SIP/2\.0 608 ", logs, re.M), logs[-2000:]
    assert "ANSWERED" not in logs, logs[-2000:]
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as answer:
        metrics = answer.read().decode()
    assert 'parlora_refusals_total{reason="attestation_failed"} 1.0' in metrics, metrics

    passed = peers.run_sipp(
        "uac_attested",
        bridge.sip_port,
        workdir=tmp_path / "passed",
        timeout=25,
        extra_args=["-set", "verstat", "TN-Validation-Passed", "-set", "identity", IDENTITY],
    )
    logs = (passed.workdir / "sipp_logs.log").read_text(errors="replace")
    assert "ANSWERED" in logs and "CLOSED" in logs, logs[-2000:]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (cdr.exists() and len(cdr.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    # the refused call never started: a refusal row (no call record), then the passed call's record
    refused, line = cdr.read_text().splitlines()
    assert {k: json.loads(refused).get(k) for k in ("kind", "reason", "sip_status")} == {
        "kind": "call_refused",
        "reason": "attestation_failed",
        "sip_status": 608,
    }, refused
    attestation = json.loads(line)["call"]["attestation"]
    assert attestation == {
        "verstat": "passed",
        "level": "B",
        "orig_tn": "15551234567",
        "dest_tn": "4930100",
        "origid": "123e4567-e89b-12d3-a456-426655440000",
        "iat": 1765100000,
        "signed": True,
        "verified": False,
        "reason": "",
    }
