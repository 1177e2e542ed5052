"""Hard-limit recovery on a live call: the provider misbehaves, the call stays up, the voice comes back.

GPT-Live's fake, as its own process, is given a fault on its first connection only; the replacement
connection (the second) behaves. The caller says one sentence (whose answer triggers the fault), waits, then
says another: its echo must reach the caller through the replacement.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import peers

RATE = 8000


def _call_audio(tmp_path: Path) -> tuple[Path, peers.Utterance, int]:
    first = peers.make_utterance(tmp_path / "u1.wav", "Tell me about the weather in Paris tomorrow morning please.",
                                 lead_silence_s=0.5, tail_silence_s=0.0)
    second = peers.make_utterance(tmp_path / "u2.wav", "Hello again, can you hear me now?", lead_silence_s=0.0,
                                  tail_silence_s=0.0)
    gap = np.zeros(4 * RATE, dtype=np.int16)
    samples = np.concatenate([first.samples[: first.end], gap, second.speech, np.zeros(5 * RATE, dtype=np.int16)])
    path = tmp_path / "call.wav"
    peers.write_wav(path, samples, RATE)
    return path, second, first.end + gap.size


@pytest.mark.parametrize(("fault", "cause"), [("1/burst:8", "output_overflow"), ("1/abrupt_close@3000", "transport_lost")])
def test_gpt_live_recovers_and_the_call_never_drops(fault, cause, start_fake, start_bridge, capture, tmp_path) -> None:
    wav, second, second_start = _call_audio(tmp_path)
    fake = start_fake("openai-live", "--fault", fault)
    bridge = start_bridge(*fake.bridge_args("openai-live"), env={"OPENAI_API_KEY": "sk-test"})
    cap = capture(f"udp and src host 127.0.0.1 and src port {bridge.rtp_port}")
    with peers.BaresipCaller(tmp_path / "baresip", wav) as caller:
        result = caller.run(bridge.sip_port, timeout=40)
    bridge.wait_for(r"call call-1 ended after")
    cap.stop()
    log = bridge.log
    assert result.established and result.hangup_by == "caller"  # the bridge never sent BYE
    stages = re.findall(rf"output_recovery (\w+): token 2, cause {cause}, (\d+) ms", log)
    assert [s for s, _ in stages] == ["reconnecting", "awaiting_user", "done"], log[-3000:]
    inputs = re.findall(r"audio_discontinuity input: (\d+) caller frames dropped \(voice_transport_recovery\)", log)
    assert len(inputs) == 1  # counted once
    times = cap.packet_times(bridge.rtp_port)
    largest_gap_ms = 1000 * float(np.max(np.diff(times)))
    pieces = peers.heard_in_pieces(second.speech, result.received, pieces=4)
    print(f"{fault}: replacement ready {stages[1][1]} ms after the condition, voice path repaired "
          f"{stages[2][1]} ms after it (the caller spoke again); {inputs[0]} caller frames discarded; largest RTP "
          f"gap at the caller {largest_gap_ms:.1f} ms; recovered echo {[round(p, 3) for p, _ in pieces]}")
    assert largest_gap_ms <= 60  # the caller's RTP never stopped
    assert int(stages[1][1]) <= 5_000
    assert sum(p >= 0.9 for p, _ in pieces) >= 3 and pieces[0][1] > second_start  # the recovered voice arrives
