"""One real SIP call through `serve` per provider protocol, each against its fake running as a process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import peers
import pytest

from rtp.g711 import ulaw_decode

KEYS = {
    "openai-live": "OPENAI_API_KEY",
    "openai-realtime": "OPENAI_API_KEY",
    "gemini-live": "GEMINI_API_KEY",
    "xai": "XAI_API_KEY",
}


@pytest.mark.parametrize("protocol", ["openai-live", "openai-realtime", "gemini-live", "xai"])
def test_a_sip_call_is_echoed_through_each_providers_fake(
    protocol, start_fake, start_bridge, capture, utterance, tmp_path: Path
) -> None:
    fake = start_fake(protocol)
    secret = f"key-for-{protocol}-never-logged"
    bridge = start_bridge(*fake.bridge_args(protocol), env={KEYS[protocol]: secret})
    cap = capture(f"udp and src host 127.0.0.1 and src port {bridge.rtp_port}")
    with peers.BaresipCaller(tmp_path / "baresip", utterance.path) as caller:
        result = caller.run(bridge.sip_port, timeout=40)
    assert result.established, bridge.log[-3000:]
    bridge.wait_for(r"call call-1 ended after .* by caller")
    cap.stop()
    # What the bridge put on the wire, and what the caller recorded: every eighth of the utterance, in order,
    # after it ended. (Pieces, not one whole: pjmedia's adaptive jitter buffer may shift the caller's audio by
    # 10 ms now and then, and the echo model faithfully repeats the shift.)
    wire = np.frombuffer(ulaw_decode(b"".join(cap.rtp_payloads(bridge.rtp_port))), dtype="<i2")
    on_wire = peers.heard_in_pieces(utterance.speech, wire, pieces=8)
    heard = peers.heard_in_pieces(utterance.speech, result.received, pieces=8)
    slips = [
        round(1000 * (b[1] - a[1] - len(utterance.speech) // 8) / 8000)
        for a, b in zip(on_wire, on_wire[1:], strict=False)
    ]
    print(
        f"{protocol}: echo on the wire by eighths {[round(p, 3) for p, _ in on_wire]} (slips {slips} ms); "
        f"in the caller's recording {[round(p, 3) for p, _ in heard]}; first heard "
        f"{1000 * (heard[0][1] - utterance.end) / 8000:.0f} ms after the utterance ended"
    )
    threshold = 0.99 if protocol != "gemini-live" else 0.95  # Gemini resamples 8 -> 16 -> 24 -> 8 kHz
    # A 10 ms shift spoils the one eighth it falls in, not the others.
    assert sum(peak >= threshold for peak, _ in on_wire) >= 6 and min(p for p, _ in on_wire) >= 0.7, (
        bridge.log[-3000:]
    )
    assert all(abs(slip) <= 20 for slip in slips)  # nothing lost or repeated beyond a jitter-buffer nudge
    assert sum(peak >= 0.9 for peak, _ in heard) >= 6 and min(p for p, _ in heard) >= 0.7, str(
        result.received_path
    )
    lags = [lag for _, lag in heard]
    assert lags == sorted(lags) and lags[0] > utterance.end
    assert secret not in bridge.log and secret not in fake.proc.stdout + fake.proc.stderr
