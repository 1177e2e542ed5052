"""The AI disclosure, live: a route's `disclosure` WAV is the first audio the caller's RTP carries (baresip calls
the bridge; tshark captures what the bridge sends), every byte of it, before anything of the model's, and the
bridge logs it delivered once the carrier ledger shows it all sent. The same route asks for a recording consent
(`recording_consent_wav`, with `--record`): it follows the disclosure on the wire, and the call's WAV begins
where it ended — none of the announcement in it — as the CDR's `consent` says."""

from __future__ import annotations

import json
import time
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
    consent = (6000 * np.cos(2 * np.pi * 600 * t[: int(0.4 * RATE)])).astype(np.int16)  # 0.4 s
    peers.write_wav(tmp_path / "consent.wav", consent)
    config.write_text(
        '[[routes]]\nname = "everyone"\ndisclosure = "disclosure.wav"\nrecording_consent_wav = "consent.wav"\n'
    )
    caller_wav = peers.write_wav(tmp_path / "caller.wav", np.zeros(3 * RATE, dtype=np.int16))  # 3 s, silent
    record, cdr = tmp_path / "record", tmp_path / "cdr.jsonl"
    record.mkdir()
    bridge = start_bridge(
        "--config", str(config), "--provider", "echo", "--record", str(record), "--cdr", str(cdr)
    )
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
    # the recording consent: right after it on the wire, then the recording from where it ended
    bridge.wait_for(r"consent delivered: 400 of 400 ms sent")
    assert expected + ulaw_encode(consent.astype("<i2").tobytes()) in payload
    give_up = time.monotonic() + 15
    while not (cdr.exists() and cdr.read_text().strip()) and time.monotonic() < give_up:
        time.sleep(0.1)
    stamp = json.loads(cdr.read_text().splitlines()[0])
    assert stamp["consent"]["announced"] and stamp["consent"]["how"] == "wav", stamp["consent"]
    assert stamp["consent"]["recording_start_ms"] == stamp["consent"]["ended_ms"] >= 1_000  # after both
    rate, stereo = peers.read_wav(stamp["recording"])
    assert rate == RATE and stereo.shape[1] == 2
    right = stereo[:, 1].astype("<i2").tobytes()
    assert consent.tobytes()[:640] not in right and tone.tobytes()[:640] not in right  # neither is recorded
    assert len(stereo) / RATE <= stamp["duration_s"] - stamp["consent"]["ended_ms"] / 1000 + 0.1
