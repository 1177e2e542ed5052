"""Early media against SIPp on loopback (native engine; sip/native/early.py, bridge/engine/early_media.py):

- a call placed to a callee that sends a reliable 183 with SDP (PRACKed, RFC 3262 §4), plays an announcement
  as early media, then answers 486: `call` reports it busy *after early media heard*, not as a plain failure,
  and the announcement reached the provider only because the route (here the command line) asked for it;
- a slow answer: a 180 with SDP and ringback for 4 s, then 200: nothing timed out during the ring, and the
  machine detector's verdict is timed from the answer (its timers do not start at the 180);
- a call answered with early media: SIPp as a caller that requires 100rel gets a reliable 180, then a reliable
  183 with the SDP answer, and the ringback tone (425 Hz) reaches its RTP socket while the bridge may not
  answer yet (SIPp holds back its PRACK); the 200 then carries the same SDP.
Each call lasts a few seconds; the audio is made here (sox), never committed."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import peers

from rtp.g711 import ulaw_decode
from tests.support.trunk_edge import _call, _callee


def _tone(path: Path, seconds: float, spec: list[str]) -> Path:
    wav = path.with_suffix(".wav")
    subprocess.run(
        [
            "sox",
            "-n",
            "-r",
            "8000",
            "-c",
            "1",
            "-b",
            "16",
            str(wav),
            "synth",
            str(seconds),
            *spec,
            "vol",
            "0.3",
        ],
        check=True,
        timeout=30,
    )
    return peers.make_ulaw(wav, path)


def _finish(call: peers.ManagedProcess, callee: peers.ManagedProcess, status: int) -> None:
    """`call` exits with `status` and the SIPp callee ends its scenario; both are stopped whatever happens."""
    try:
        assert call.wait(40) == status, call.stderr[-3000:]
        assert callee.wait(10) is not None
    finally:
        call.stop()
        callee.stop(term_timeout=3.0)


def test_an_announcement_then_486_is_busy_after_early_media_and_the_183_is_pracked(
    start_fake, tmp_path: Path
) -> None:
    _tone(tmp_path / "announcement.ul", 2.5, ["sine", "950-1800"])  # an SIT-like sweep, then the "message"
    fake = start_fake()
    callee, port, logs = _callee("uas_early_486", tmp_path, "-set", "ann_ms", "2000")
    call = _call(
        tmp_path,
        f"sip:callee@127.0.0.1:{port}",
        *fake.bridge_args("openai-live"),
        "--early-media-to-provider",
        env={"OPENAI_API_KEY": "sk-test"},
    )
    _finish(call, callee, 1)
    text = logs.read_text(errors="replace")
    assert re.search(r"PRACKED\s*1 1 INVITE", text) and "BUSY" in text, text[-2000:]
    printed = re.search(
        r"call-1: call to sip:callee@127\.0\.0\.1:\d+: busy after early media heard for (\d+) ms "
        r"\(SIP 486: 486 Busy Here\)",
        call.stdout,
    )
    assert printed, call.stdout
    assert 1500 <= int(printed.group(1)) <= 6000
    assert "call-1: early media (183)" in call.stderr, call.stderr[-3000:]
    log = call.stderr
    assert re.search(r"call call-1 early media for \d+ ms, then 486 Busy Here", log), log[-4000:]
    assert re.search(r"486 Busy Here; early media heard for \d+\.\d s\)", log), log[-4000:]
    # the announcement reached the provider (asked for), though the call was never answered
    appends = [line for line in fake.record.read_text().splitlines() if "input_audio" in line]
    assert len(appends) > 20, len(appends)


def test_a_slow_180_with_ringback_times_nothing_out_and_amd_starts_at_the_answer(tmp_path: Path) -> None:
    _tone(tmp_path / "ringback.ul", 3.0, ["sine", "425"])
    callee, port, logs = _callee(
        "uas_slow_180", tmp_path, "-set", "ring_ms", "4000", "-set", "talk_ms", "3500"
    )
    call = _call(tmp_path, f"sip:callee@127.0.0.1:{port}", "--amd")
    _finish(call, callee, 0)
    text = logs.read_text(errors="replace")
    assert "RINGING" in text and "ANSWERED" in text and "HUNGUP" in text, text[-2000:]
    assert re.search(r"call-1: call to sip:callee@127\.0\.0\.1:\d+: answered \(SIP 200", call.stdout), (
        call.stdout
    )
    assert "call-1: early media (180)" in call.stderr, call.stderr[-3000:]
    ring = re.search(r"call call-1 early media for (\d+) ms, then answered", call.stderr)
    assert ring and 3500 <= int(ring.group(1)) <= 6000, call.stderr[-3000:]
    # the callee sends nothing after its answer: "silence", timed from the answer (2.5 s), not from the 180
    # 4 s earlier (which would have given the verdict at once, at the answer)
    verdict = re.search(r"call-1: AMD (\w+) after (\d+) ms", call.stdout)
    assert verdict, call.stdout
    assert verdict.group(1) == "silence" and 2400 <= int(verdict.group(2)) <= 3500, verdict.group(0)


def _listen() -> tuple[socket.socket, list[tuple[float, bytes]], threading.Event]:
    """A UDP socket standing for the caller's RTP port: every datagram with its arrival time."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", peers.free_rtp_port()))
    sock.settimeout(0.2)
    got: list[tuple[float, bytes]] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                data = sock.recv(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            got.append((time.monotonic(), data))

    threading.Thread(target=run, name="rtp-listener", daemon=True).start()
    return sock, got, stop


def test_a_caller_gets_a_reliable_183_and_ringback_before_the_200_which_has_the_same_sdp(
    start_bridge, tmp_path: Path
) -> None:
    bridge = start_bridge("--early-media", "ringback")
    sock, got, stop = _listen()
    try:
        run = peers.run_sipp(
            "uac_early_media",
            bridge.sip_port,
            workdir=tmp_path / "uac",
            timeout=25,
            trace_msg=True,
            extra_args=["-set", "rtp_port", str(sock.getsockname()[1]), "-set", "wait_ms", "1500"],
        )
    finally:
        stop.set()
        time.sleep(0.3)
        sock.close()
    logs = (run.workdir / "sipp_logs.log").read_text(errors="replace")
    assert "EARLY" in logs and "ANSWERED" in logs and "CLOSED" in logs, logs[-2000:]
    messages = (run.workdir / "sipp_messages.log").read_text(errors="replace")
    ringing = re.search(r"SIP/2\.0 180 Ringing\r?\n(?:.+\r?\n)*?RSeq: (\d+)", messages)
    early = re.search(r"SIP/2\.0 183 Session Progress\r?\n(?:.+\r?\n)*?RSeq: (\d+)", messages)
    assert ringing and early and int(early.group(1)) == int(ringing.group(1)) + 1, messages[-4000:]
    sdp: dict[str, str] = {}  # the o= line of the INVITE's responses with SDP, by status
    for block in re.split(r"^-{20,}.*$", messages, flags=re.M):
        status = re.search(r"^SIP/2\.0 (\d{3}) ", block, re.M)
        origin = re.search(r"^o=.*$", block, re.M)
        if status and origin and re.search(r"^CSeq: 1 INVITE", block, re.M):
            sdp[status.group(1)] = origin.group(0).strip()
    assert "183" in sdp and sdp.get("200") == sdp["183"], sdp  # one answer, in the 183 and the 200
    # the ringback: RTP PCMU whose payload is a 425 Hz tone, a second of it while the PRACK was held back
    loud = []
    for _, data in got:
        pcm = np.frombuffer(ulaw_decode(data[12:]), dtype="<i2").astype(np.float64)
        if len(pcm) == 160 and np.sqrt(np.mean(pcm**2)) > 1000:
            loud.append(pcm)
    assert len(loud) >= 40, (len(got), len(loud))
    samples = np.concatenate(loud[:40])
    spectrum = np.abs(np.fft.rfft(samples))
    peak_hz = np.argmax(spectrum) * 8000 / len(samples)
    assert 400 <= peak_hz <= 450, peak_hz
