"""Warm transfer, live (bridge/engine/warm_transfer.py, bridge/server/warm.py): an application embedding the
bridge (tests/integration/api_app.py, the echo provider) asks for a warm transfer of a SIPp caller 1 s into the
call; the target is a SIPp UAS that answers, hears the briefing, keys 1 (RFC 4733) and talks (echoing the RTP it
gets) before hanging up. The bridge relays media between the legs both ways and, when the target hangs up,
ends the caller's leg; the application gets the typed outcome."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import peers
import pytest

from tests.support.trunk_edge import _callee

APP = Path(__file__).with_name("api_app.py")


@pytest.mark.timeout(60)
def test_warm_transfer_accepted_relays_both_ways_and_ends_with_the_target(tmp_path: Path) -> None:
    workdir = tmp_path / "sipp"
    workdir.mkdir()
    peers.make_utterance(
        workdir / "speech.wav", "I would like a refund, please.", tail_silence_s=1.0, ulaw=True
    )
    target, target_port, target_log = _callee(
        "uas_warm_accept", tmp_path, "-rtp_echo", "-set", "brief_ms", "1500", "-set", "talk_ms", "2500"
    )
    sip_port, rtp_port = peers.free_udp_port(), peers.free_rtp_port()
    uri = f"sip:human@127.0.0.1:{target_port}"
    argv = [sys.executable, str(APP), "--sip", f"127.0.0.1:{sip_port}", "--rtp-port", str(rtp_port)]
    with target, peers.ManagedProcess([*argv, "--provider", "echo", "--warm-to", uri], name="api-app") as app:
        app.wait_for(r"listening on udp", 20)
        result = peers.run_sipp("uac_talk_wait_bye", sip_port, workdir=workdir, timeout=30)
        app.wait_for(r'"event": "ended"', 20)
        target.wait(timeout=10)
        events, log = (
            [json.loads(line) for line in app.stdout.splitlines() if line.startswith("{")],
            app.stderr,
        )
    assert result.returncode == 0, result.screen[-2000:]
    assert result.count("BYE_RECEIVED") == 1  # the bridge ended the caller's leg after the target hung up
    said = target_log.read_text()
    assert "ANSWERED" in said and "KEYED" in said and "HUNGUP" in said, said[-2000:]
    [outcome] = [e for e in events if e["event"] == "warm_transfer"]
    assert outcome["outcome"] == "accepted" and outcome["status"] == 200, outcome
    relay = re.search(r"warm transfer relay ended: (\d+) frames to the target, (\d+) to the caller", log)
    assert relay is not None, log[-3000:]
    # 2.5 s of the call joined: the caller's stream reached the target, and the target's echo of it the caller
    to_target, to_caller = int(relay.group(1)), int(relay.group(2))
    assert to_target >= 50 and to_caller >= 50, (to_target, to_caller)
    [ended] = [e for e in events if e["event"] == "ended"]
    assert ended["by"] == "bridge", ended
    [record] = [e["record"] for e in events if e["event"] == "call_ended"]
    [transfer] = record["transfers"]
    assert transfer["outcome"] == "accepted" and transfer["status"] == 200 and transfer["target"] == uri, (
        record
    )
