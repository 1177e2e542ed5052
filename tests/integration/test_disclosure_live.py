"""The AI disclosure, live: a route's `disclosure` WAV is the first audio the caller's RTP carries (baresip calls
the bridge; tshark captures what the bridge sends), every byte of it, before anything of the model's, and the
bridge logs it delivered once the carrier ledger shows it all sent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import peers

from rtp.g711 import ulaw_encode

RATE = 8000


def test_the_disclosure_wav_is_the_first_audio_the_caller_receives(
    start_bridge, capture, tmp_path: Path
) -> None:
    t = np.arange(int(0.6 * RATE)) / RATE
    tone = (8000 * np.cos(2 * np.pi * 1000 * t)).astype(
        np.int16
    )  # (a cosine: its first sample is not silence)
    peers.write_wav(tmp_path / "disclosure.wav", tone)
    config = tmp_path / "bridge.toml"
    config.write_text('[[routes]]\nname = "everyone"\ndisclosure = "disclosure.wav"\n')
    caller_wav = peers.write_wav(tmp_path / "caller.wav", np.zeros(3 * RATE, dtype=np.int16))  # 3 s, silent
    bridge = start_bridge("--config", str(config), "--provider", "echo")
    cap = capture(f"udp and src host 127.0.0.1 and src port {bridge.rtp_port}")
    with peers.BaresipCaller(tmp_path / "baresip", caller_wav) as caller:
        result = caller.run(bridge.sip_port, timeout=30)
    assert result.established
    bridge.wait_for(r"disclosure delivered: 600 of 600 ms sent")
    cap.stop()
    payload = b"".join(cap.rtp_payloads(bridge.rtp_port))
    expected = ulaw_encode(tone.astype("<i2").tobytes())
    assert expected in payload, payload[:400].hex()
    before = payload[: payload.index(expected)]
    assert before.strip(b"\xff") == b"", before.hex()  # nothing but µ-law silence came before it
