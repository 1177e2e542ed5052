"""An INVITE whose offer no answer could accept costs nothing, on `serve` (native engine) with SIPp on
loopback: a G.729-only offer and an RTP/SAVP offer over UDP each get 488 with their own reason phrase, no 180
on the wire, no provider connection (the fake provider records nothing), no call, and the refusals in
`/metrics`. The control: a PCMU offer to the same bridge is answered and reaches the provider."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import peers

from tests.support.trunk_edge import _frames


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return answer.read().decode()


def test_unanswerable_offers_get_488_before_any_180_and_no_provider_connection(
    start_fake, start_bridge, tmp_path: Path
) -> None:
    fake = start_fake()
    http_port = peers.free_udp_port(also_tcp=True)
    bridge = start_bridge(
        *fake.bridge_args("openai-live"),
        "--http",
        f"127.0.0.1:{http_port}",
        env={"OPENAI_API_KEY": "sk-test"},
    )
    for kind, reason in (("g729", "No Common Codec"), ("savp", "SRTP Not Supported")):
        run = peers.run_sipp(
            "uac_unanswerable_offer",
            bridge.sip_port,
            workdir=tmp_path / kind,
            timeout=25,
            trace_msg=True,
            extra_args=["-set", "kind", kind],
        )
        logs = (run.workdir / "sipp_logs.log").read_text(errors="replace")
        assert re.search(rf"^REFUSED \S+ SIP/2\.0 488 {reason}$", logs, re.M), logs[-2000:]
        assert "RANG" not in logs and "ANSWERED" not in logs, logs[-2000:]
        messages = (run.workdir / "sipp_messages.log").read_text(errors="replace")
        assert "SIP/2.0 180" not in messages and "SIP/2.0 488" in messages
        assert re.search(r"^Warning: 30[25] ", messages, re.M), messages[-3000:]
    assert _frames(fake.record) == 0  # the provider never heard of either call
    metrics = _metrics(http_port)
    assert 'parlora_refusals_total{reason="no_common_codec"} 1.0' in metrics, metrics
    assert 'parlora_refusals_total{reason="unanswerable_offer"} 1.0' in metrics, metrics
    assert 'parlora_sip_responses_sent_total{code="488"} 2.0' in metrics
    assert "session" not in bridge.log.split("listening on udp", 1)[1].lower(), bridge.log[-3000:]

    # the control: an offer with PCMU is answered, and the provider sees the call
    answered = peers.run_sipp(
        "uac_busy",
        bridge.sip_port,
        workdir=tmp_path / "pcmu",
        timeout=25,
        extra_args=["-set", "hold_ms", "1500"],
    )
    logs = (answered.workdir / "sipp_logs.log").read_text(errors="replace")
    assert "ANSWERED" in logs and "CLOSED" in logs, logs[-2000:]
    assert _frames(fake.record) > 0
