"""AMD's choice on live calls: `serve --amd` places a call through `POST /calls` to a SIPp callee that plays a
recording made here (espeak-ng speech, a generated 1 kHz tone; never committed).

- A voicemail (a long greeting, then a beep) with `--amd-machine message --amd-message-wav`: the verdict
  `machine`, the beep, then the message (a 600 Hz tone, told apart from the beep) transmitted after the beep
  ended — read from the call's `--record` WAV, left the callee, right what the bridge sent — and the bridge's
  BYE (the callee waits for it); the CDR line has the verdict, the beep and the action.
- A person ("Hello?", then silence) with `--amd-machine hang_up`: the verdict `human`, the action `talk` (a
  person is never hung up on by the route's choice) and the callee's own BYE ends the call.

Asserted by content and order, not by timing.
"""

from __future__ import annotations

import json
import subprocess
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import peers

from tests.support.trunk_edge import _callee, _post


def _tone(path: Path, hz: int, seconds: float) -> Path:
    subprocess.run(["sox", "-n", "-r", "8000", "-c", "1", "-b", "16", str(path), "synth", str(seconds), "sine",
                    str(hz), "vol", "0.3"], check=True, timeout=30)  # fmt: skip
    return path


def _cdr(path: Path, timeout: float = 15.0) -> dict[str, object]:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if path.exists() and (lines := path.read_text().splitlines()):
            return json.loads(lines[-1])  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError(f"no CDR line in {path}")


def _tonal_frames(samples: np.ndarray, hz: int) -> list[int]:
    """The 20 ms frames (indexes) where `hz` holds most of the energy."""
    frames = samples[: len(samples) // 160 * 160].reshape(-1, 160).astype(np.float64)
    spectrum = np.abs(np.fft.rfft(frames * np.hanning(160), axis=1)) ** 2  # 50 Hz bins
    k = hz // 50
    share = spectrum[:, k - 1 : k + 2].sum(axis=1) / np.maximum(spectrum.sum(axis=1), 1e-9)
    loud = spectrum.sum(axis=1) > 1e6
    return [int(i) for i in np.flatnonzero((share > 0.6) & loud)]


def _start(start_fake, start_bridge, tmp_path: Path, *args: str) -> tuple[Any, int]:
    fake = start_fake()
    http_port = peers.free_udp_port(also_tcp=True)
    bridge = start_bridge(
        *fake.bridge_args("openai-live"),
        "--http",
        f"127.0.0.1:{http_port}",
        "--amd",
        "--cdr",
        str(tmp_path / "cdr.jsonl"),
        *args,
        env={"OPENAI_API_KEY": "sk-test"},
    )
    return bridge, http_port


def test_a_voicemail_gets_the_recorded_message_after_its_beep_then_the_bridges_bye(
    start_fake, start_bridge, tmp_path: Path
) -> None:
    words = tmp_path / "words.wav"
    peers.make_utterance(
        words,
        "Hello, you have reached the voicemail of Alex Morgan. I cannot take your call right now. "
        "Please leave your name, your number and a short message after the tone.",
        lead_silence_s=0.3,
        tail_silence_s=0.5,
    )
    beep = _tone(tmp_path / "beep.wav", 1000, 0.4)
    greeting = tmp_path / "greeting.wav"
    subprocess.run(["sox", str(words), str(beep), str(greeting), "pad", "0", "6"], check=True, timeout=30)
    peers.make_ulaw(greeting, tmp_path / "greeting.ul")
    message = _tone(tmp_path / "message.wav", 600, 1.5)
    record = tmp_path / "record"
    record.mkdir()
    callee, port, logs = _callee("uas_voicemail_bye", tmp_path)
    try:
        bridge, http_port = _start(start_fake, start_bridge, tmp_path, "--amd-machine", "message",
                                   "--amd-message-wav", str(message), "--record", str(record))  # fmt: skip
        status, body = _post(http_port, "/calls", {"to": f"sip:callee@127.0.0.1:{port}"})
        assert status == 202, body
        call = body["call"]
        bridge.wait_for(rf"{call} AMD verdict machine after \d+ ms", timeout=20)
        bridge.wait_for(rf"{call} AMD AmdBeep after \d+ ms", timeout=20)
        bridge.wait_for(rf"{call} AMD action message after \d+ ms \(the route's", timeout=5)
        assert callee.wait(30) is not None, "the callee's call did not finish"
        log = bridge.log
        # in this order: the verdict, the beep, the message (the recording's start), then the BYE
        marks = [f"{call} AMD verdict machine", f"{call} AMD AmdBeep", f"{call} AMD action message"]
        assert [log.index(m) for m in marks] == sorted(log.index(m) for m in marks)
    finally:
        callee.stop(term_timeout=3.0)
    assert "BYE_RECEIVED" in logs.read_text(errors="replace")  # the bridge hung up, after the message
    cdr = _cdr(tmp_path / "cdr.jsonl")
    amd = cdr["amd"]
    assert isinstance(amd, list) and [(a["kind"], a["verdict"]) for a in amd] == [
        ("verdict", "machine"),
        ("beep", "machine"),
    ]
    action = cdr["amd_action"]
    assert isinstance(action, dict) and (action["action"], action["by"], action["verdict"]) == (
        "message",
        "route",
        "machine",
    )
    assert action["since_answer_ms"] >= amd[1]["since_answer_ms"] - 1  # at the beep's end, not before
    assert cdr["ended_by"] == "bridge"
    (wav_path,) = record.glob("*.wav")
    with wave.open(str(wav_path), "rb") as wav:
        stereo = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, 2)
    beep_frames = _tonal_frames(stereo[:, 0], 1000)  # the callee's beep, as it reached the bridge
    message_frames = _tonal_frames(stereo[:, 1], 600)  # what the bridge sent
    assert len(beep_frames) >= 10, "the beep is not in the recording's left channel"
    assert len(message_frames) >= 60, "the message (1.5 s) was not transmitted"
    # after the beep (the two channels are placed by when a frame reached the session and when one left: the
    # callee's lags by the jitter buffer, measured 60 ms, so the beep's last frames may sit beside the message's
    # first), and after the greeting: nothing at all was sent before it
    assert message_frames[0] >= beep_frames[-1] - 5
    assert np.abs(stereo[: message_frames[0] * 160, 1]).max(initial=0) < 64  # nothing was sent before it


def test_a_person_who_says_hello_gets_the_model_and_is_not_hung_up_on(
    start_fake, start_bridge, tmp_path: Path
) -> None:
    hello = tmp_path / "hello.wav"
    peers.make_utterance(hello, "Hello?", lead_silence_s=0.3, tail_silence_s=6.0)
    peers.make_ulaw(hello, tmp_path / "greeting.ul")
    callee, port, logs = _callee("uas_voicemail", tmp_path, "-set", "talk_ms", "6000")
    try:
        bridge, http_port = _start(start_fake, start_bridge, tmp_path, "--amd-machine", "hang_up")
        status, body = _post(http_port, "/calls", {"to": f"sip:callee@127.0.0.1:{port}"})
        assert status == 202, body
        call = body["call"]
        bridge.wait_for(rf"{call} AMD verdict human after \d+ ms", timeout=20)
        bridge.wait_for(rf"{call} AMD action talk after \d+ ms \(the route's", timeout=5)
        assert callee.wait(30) is not None, "the callee's call did not finish"
    finally:
        callee.stop(term_timeout=3.0)
    assert "HUNGUP" in logs.read_text(errors="replace")  # the callee's own BYE, answered
    cdr = _cdr(tmp_path / "cdr.jsonl")
    amd = cdr["amd"]
    assert isinstance(amd, list) and [(a["kind"], a["verdict"]) for a in amd] == [("verdict", "human")]
    action = cdr["amd_action"]
    assert isinstance(action, dict) and (action["action"], action["by"]) == ("talk", "route")
    assert cdr["ended_by"] == "caller"
