"""Warm transfer, live (bridge/engine/warm_transfer.py, bridge/server/warm.py): an application embedding the
bridge (tests/integration/api_app.py, the echo provider) asks for a warm transfer of each of two SIPp callers
1 s into its call, at once. One target, a SIPp UAS, answers, hears the briefing, keys 1 (RFC 4733) and talks
(echoing the RTP it gets) before hanging up: the bridge relays media between the legs both ways and, when the
target hangs up, ends the caller's leg. The other answers and hangs up without a key: refused, the caller is
back with the model and hangs up itself. The application and the call records get the typed outcomes.

At the same time, on the same server, pjsua2 as caller and target (tests/integration/pjsua2_warm.py, a tone each):
pjsua2's INVITE says `Supported: replaces` and allows REFER, so on the human's 1 the bridge sends the caller a
REFER whose Refer-To replaces the target's dialog (RFC 5589 §7); pjsua follows it with an INVITE with Replaces to
the target, which takes it and ends its leg with the bridge; the bridge ends the caller's leg. The two pjsua2
peers are then in one call with each other (one Call-ID, each hearing the other's tone) that the bridge never
sees, and the outcome says `join: replaces`; the SIPp caller (no Replaces) got the relay."""

from __future__ import annotations

import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import peers
import pytest

from tests.support.trunk_edge import _callee

APP = Path(__file__).with_name("api_app.py")
PJ_WARM = Path(__file__).with_name("pjsua2_warm.py")


def _pjsua2(role: str, *args: str) -> peers.ManagedProcess:
    return peers.ManagedProcess([sys.executable, str(PJ_WARM), role, *args], name=f"pjsua2-{role}")


def _summary(proc: peers.ManagedProcess) -> dict[str, Any]:
    proc.wait_for(r'^\{"role"', 10)  # (the reader thread may be behind the exit)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"role"')]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary: dict[str, Any] = lines[-1]
    return summary


def _pjsua2_call(sip_port: int) -> dict[str, Any]:
    """The pjsua2 caller's call (the bridge's number pjwarm), hung up 4 s after its first answer."""
    with _pjsua2("caller", f"sip:pjwarm@127.0.0.1:{sip_port}", "--tone", "1000", "--duration", "4") as caller:
        caller.wait(30)
        return _summary(caller)


@pytest.mark.timeout(60)
def test_warm_transfer_accepted_relays_both_ways_refused_gives_the_caller_back(tmp_path: Path) -> None:
    accepting, refusing = tmp_path / "accept", tmp_path / "refuse"
    for workdir in (accepting, refusing):
        workdir.mkdir()
        peers.make_utterance(workdir / "speech.wav", "I would like a refund.", tail_silence_s=1.0, ulaw=True)
    human, human_port, human_log = _callee(
        "uas_warm_accept", accepting, "-rtp_echo", "-set", "brief_ms", "1500", "-set", "talk_ms", "2500"
    )
    busy, busy_port, busy_log = _callee("uas_answer_bye", refusing, "-set", "talk_ms", "1500")
    sip_port, rtp_port = peers.free_udp_port(), peers.free_rtp_port()
    uri, other = f"sip:human@127.0.0.1:{human_port}", f"sip:busy@127.0.0.1:{busy_port}"
    pj_port = peers.free_udp_port()
    pj_target = _pjsua2("target", "--sip-port", str(pj_port), "--tone", "600", "--key-at", "1.0")
    argv = [sys.executable, str(APP), "--sip", f"127.0.0.1:{sip_port}", "--rtp-port", str(rtp_port)]
    warm = ["--warm-to", f"accept={uri}", "--warm-to", f"refuse={other}"]
    warm += ["--warm-to", f"pjwarm=sip:target@127.0.0.1:{pj_port}"]
    with (
        human,
        busy,
        pj_target,
        peers.ManagedProcess([*argv, "--provider", "echo", *warm], name="api-app") as app,
    ):
        app.wait_for(r"listening on udp", 20)
        pj_target.wait_for(r"listening", 10)
        with ThreadPoolExecutor(3) as pool:
            pj_called = pool.submit(_pjsua2_call, sip_port)
            accepted = pool.submit(
                peers.run_sipp, "uac_talk_wait_bye", sip_port, service="accept", workdir=accepting, timeout=30
            )
            refused = pool.submit(
                peers.run_sipp, "uac_stream", sip_port, service="refuse", extra_args=["-d", "6000"],
                workdir=refusing, timeout=30,
            )  # fmt: skip
            accepted_result, refused_result, pj_caller = (
                accepted.result(),
                refused.result(),
                pj_called.result(),
            )
        for _ in range(200):  # the calls' ends reach the application
            if app.stdout.count('"event": "ended"') >= 3:
                break
            time.sleep(0.1)
        human.wait(timeout=10)
        busy.wait(timeout=10)
        pj_target.wait(timeout=10)
        pj_callee = _summary(pj_target)
        events, log = (
            [json.loads(line) for line in app.stdout.splitlines() if line.startswith("{")],
            app.stderr,
        )
    assert accepted_result.returncode == 0, accepted_result.screen[-2000:]
    assert (
        accepted_result.count("BYE_RECEIVED") == 1
    )  # the bridge ended the caller's leg after the target's BYE
    assert refused_result.returncode == 0, refused_result.screen[-2000:]  # the refused caller hung up itself
    said = human_log.read_text()
    assert "ANSWERED" in said and "KEYED" in said and "HUNGUP" in said, said[-2000:]
    assert "HUNGUP" in busy_log.read_text()
    outcomes = {e["called"]: e for e in events if e["event"] == "warm_transfer"}
    assert outcomes["accept"]["outcome"] == "accepted" and outcomes["accept"]["status"] == 200, outcomes
    assert outcomes["refuse"]["outcome"] == "refused" and outcomes["refuse"]["status"] == 200, outcomes
    assert outcomes["accept"]["join"] == "relay" and outcomes["refuse"]["join"] == "", (
        outcomes
    )  # SIPp: no Replaces
    relay = re.findall(r"warm transfer relay ended: (\d+) frames to the target, (\d+) to the caller", log)
    assert len(relay) == 1, log[-3000:]
    # 2.5 s joined: the caller's stream reached the target, and the target's echo of it the caller
    to_target, to_caller = map(int, relay[0])
    assert to_target >= 50 and to_caller >= 50, (to_target, to_caller)
    records = {e["record"]["call"]["called"]: e["record"] for e in events if e["event"] == "call_ended"}
    assert [t["outcome"] for t in records["accept"]["transfers"]] == ["accepted"], records["accept"]
    assert records["accept"]["ended_by"] == "bridge"
    assert records["accept"]["transfers"][0]["join"] == "relay"
    assert [t["outcome"] for t in records["refuse"]["transfers"]] == ["refused"], records["refuse"]
    assert records["refuse"]["ended_by"] == "caller"  # the refused transfer left the caller's call up
    # On hold from 1 s until the refusal (the target hung up 1.5 s after its answer): the model was not heard
    # meanwhile, and is heard after (the echo of what the caller said)
    call_id = records["refuse"]["call"]["call_id"]
    starts = [
        e["utterance"]["start_ms"]
        for e in events
        if e["event"] == "utterance"
        and e["utterance"]["call_id"] == call_id
        and e["utterance"]["role"] == "assistant"
    ]
    assert starts and all(not 1_000 <= start < 2_400 for start in starts) and max(starts) >= 2_400, starts
    # pjsua2: joined by REFER with Replaces, the two peers then talk directly and the bridge's legs are gone
    assert outcomes["pjwarm"]["outcome"] == "accepted" and outcomes["pjwarm"]["join"] == "replaces", outcomes
    assert [t["join"] for t in records["pjwarm"]["transfers"]] == ["replaces"], records["pjwarm"]
    assert records["pjwarm"]["ended_by"] == "bridge", records["pjwarm"]  # its BYE after the NOTIFY's 200
    assert pj_caller["error"] is None and pj_callee["error"] is None, (pj_caller, pj_callee)
    (to_bridge, direct), (from_bridge, replaced_by) = pj_caller["calls"], pj_callee["calls"]
    assert "pjwarm@" in to_bridge["remote"] and to_bridge["ended_by"] == "remote", (
        to_bridge
    )  # the bridge's BYE
    assert from_bridge["ended_by"] == "replaced", from_bridge  # the target ended its leg with the bridge
    refer_to = pj_caller["transfer"]["refer_to"]
    assert "?Replaces=" + from_bridge["call_id"].replace("@", "%40") + "%3Bto-tag%3D" in refer_to, refer_to
    # one dialog between the two peers, which the bridge never saw, each hearing the other's tone
    assert direct["call_id"] == replaced_by["call_id"] and direct["call_id"] not in log
    assert direct["confirmed"] and "target@" in direct["remote"] and "caller@" in replaced_by["remote"]
    assert direct["tone_frames"]["600"] >= 25 and replaced_by["tone_frames"]["1000"] >= 25, (
        direct,
        replaced_by,
    )
    assert direct["ended_by"] == "us" and replaced_by["ended_by"] == "remote"
