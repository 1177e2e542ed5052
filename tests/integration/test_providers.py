"""One real SIP call through `serve` per provider protocol, each against its fake running as a process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import peers

KEYS = {"openai-live": "OPENAI_API_KEY", "openai-realtime": "OPENAI_API_KEY", "gemini-live": "GEMINI_API_KEY",
        "xai": "XAI_API_KEY"}


@pytest.mark.parametrize("protocol", ["openai-live", "openai-realtime", "gemini-live", "xai"])
def test_a_sip_call_is_echoed_through_each_providers_fake(protocol, start_fake, start_bridge, utterance,
                                                          tmp_path: Path) -> None:
    fake = start_fake(protocol)
    secret = f"key-for-{protocol}-never-logged"
    bridge = start_bridge(*fake.bridge_args(protocol), env={KEYS[protocol]: secret})
    with peers.BaresipCaller(tmp_path / "baresip", utterance.path) as caller:
        result = caller.run(bridge.sip_port, timeout=40)
    assert result.established, bridge.log[-3000:]
    peak, lag = peers.normalized_xcorr(utterance.speech, result.received)
    print(f"{protocol}: echo correlation {peak:.4f}, heard {1000 * (lag - utterance.end) / 8000:.0f} ms after "
          "the utterance ended")
    assert peak >= 0.9 and lag > utterance.end, bridge.log[-4000:]
    assert re.search(r"call call-1 ended after .* by caller", bridge.wait_for(r"call call-1 ended after .*").group(0))
    assert secret not in bridge.log and secret not in fake.proc.stdout + fake.proc.stderr
