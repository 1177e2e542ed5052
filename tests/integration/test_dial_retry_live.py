"""Dial retries, live: `POST /calls` to a SIPp callee that is busy (486) twice, with `--retry-attempts 2
--retry-delay 1`: the bridge calls again a second later, then stops; the CDR has each attempt's call record
(`dial`: its number, busy, the next attempt or the end) and the series' end."""

from __future__ import annotations

import json
import time
from pathlib import Path

import peers

from tests.support.trunk_edge import _callee, _post


def test_a_busy_callee_is_called_again_once_and_the_cdr_has_each_attempt(
    start_bridge, tmp_path: Path
) -> None:
    callee, port, logs = _callee("uas_busy_486", tmp_path, "-m", "2")  # two calls, then SIPp exits
    cdr = tmp_path / "calls.jsonl"
    try:
        http_port = peers.free_udp_port(also_tcp=True)
        bridge = start_bridge(
            "--http",
            f"127.0.0.1:{http_port}",
            "--cdr",
            str(cdr),
            "--retry-attempts",
            "2",
            "--retry-delay",
            "1",
        )
        began = time.monotonic()
        status, body = _post(http_port, "/calls", {"to": f"sip:callee@127.0.0.1:{port}"})
        assert status == 202, body
        bridge.wait_for(r"dial \S+: busy after 2 attempt\(s\)", timeout=30)
        took = time.monotonic() - began
        assert callee.wait(10) is not None
    finally:
        callee.stop(term_timeout=3.0)
    assert logs.read_text(errors="replace").count("BUSY") == 2
    assert took >= 1.0  # the retry waited its delay
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(cdr.read_text().splitlines() if cdr.exists() else []) < 3:
        time.sleep(0.1)
    rows = [json.loads(line) for line in cdr.read_text().splitlines()]
    calls = [r["dial"] for r in rows if "dial" in r]
    assert [(c["attempt"], c["outcome"]) for c in calls] == [(1, "busy"), (2, "busy")], rows
    assert "next_attempt_in_s" in calls[0] and calls[1]["final"]["outcome"] == "busy"
    [series] = [r for r in rows if r.get("kind") == "dial_series"]
    assert series["series"] == body["call"] and [a["sip_status"] for a in series["attempts"]] == [486, 486]
