"""The same real-peer cases on every SIP engine: pjsua2 (pjproject 2.15.1, tests/integration/pjsua2_caller.py)
and baresip 1.0.0 call `parlora-bridge serve --engine NAME` on loopback.

For each engine of conftest's `bridge_engine` (ids `[native]`, `[pjsua2]`; marked `contract`):
- echo heard: the caller's recording holds its own utterance, eighth by eighth, in order, after it spoke it;
- hold and resume: a re-INVITE with sendonly, then sendrecv, both answered 200; the session sees MediaHeld and
  MediaResumed; the utterance spoken after the resume is echoed (the media path came back);
- DTMF to the bridge: RFC 4733 digits from the caller reach the session ("caller pressed D"), once each, in order;
- BYE from the caller (end of the call) and from the bridge: the model calls `end_call` (a scripted turn of the
  GPT-Live fake, `--end-call-tool`), the bridge plays the goodbye, then sends BYE, which the caller answers.

baresip also calls the native engine offering one codec alone: G.722, Opus, and A-law (on both media paths,
conftest's `bridge_media_path`), and hears its echo.

Every wait is bounded and waits for an event (a log line, a process exit); each test stays under about 20 s.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import peers
import pytest
from conftest import NATIVE_ALSO_PURE

from rtp.audio import FRAME_SAMPLES
from rtp.g711 import ulaw_decode

MIN_CORRELATION = 0.9
BARESIP_CODECS = {  # audio_codecs
    "PCMU": "PCMU/8000/1",
    "PCMA": "PCMA/8000/1",
    "G722": "G722/16000/1",
    "OPUS": "opus/48000/2",
}
# Opus codes what is heard, not the waveform: an echo through it twice each way matched the speech 0.75-0.92
# an eighth (measured, native engine), against 0.99 and more through G.711 and G.722
ECHO_FLOOR = {"OPUS": 0.7}
DIGITS = "159#"


@pytest.fixture
def engine(bridge_engine: str) -> str:
    """The engine under test: conftest's `bridge_engine` (every engine, ids `[native]`, `[pjsua2]`, marked
    `contract`), which `start_bridge` passes to `serve --engine` itself."""
    return bridge_engine


@pytest.fixture(scope="module")
def late_utterance(tmp_path_factory: pytest.TempPathFactory) -> peers.Utterance:
    """The utterance after 2.5 s of silence: the hold (0.3 s) and the resume (1.3 s) come before it."""
    path = tmp_path_factory.mktemp("engine-peers") / "late.wav"
    return peers.make_utterance(
        path, "Hello bridge, please say this sentence back to me", lead_silence_s=2.5, tail_silence_s=4.0
    )


@pytest.fixture(scope="module")
def short_tone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four seconds of a quiet 300 Hz tone: audio to send while the caller presses keys."""
    t = np.arange(4 * peers.SAMPLE_RATE) / peers.SAMPLE_RATE
    return peers.write_wav(
        tmp_path_factory.mktemp("engine-peers-tone") / "tone.wav",
        (1000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16),
    )


def _serve(start_bridge, engine: str, *args: str, env: dict[str, str] | None = None):
    bridge = start_bridge(*args, env=env)  # start_bridge adds `--engine` for `bridge_engine`
    bridge.wait_for(rf"engine {engine}\b", timeout=5)  # and it is the engine this case is about
    return bridge


# Jitter-buffer adjustments one echoed utterance may show, by engine. Measured beside two CPU hogs (`yes`),
# 5 runs of the echo and hold cases: native at most 1 (2 in one CI run); pjsua2, whose pjmedia clock thread
# waits for the GIL, 3 once after its re-INVITEs (2 in a CI run).
SLIPS = {"native": 2, "pjsua2": 3}
SLIP_MAX = 5 * FRAME_SAMPLES  # one adjustment's bound: a 100 ms stall of the host (40 ms seen in CI)
STEADY = 4  # samples: two pieces this close to their spacing are in step (the correlation's own spread)


def _assert_heard(
    engine: str, speech: np.ndarray, received: np.ndarray, floor: float = MIN_CORRELATION
) -> list[int]:
    """`speech` is heard in `received`, eighth by eighth and in order, apart from at most `SLIPS` jitter-buffer
    adjustments (a jitter buffer on the way grows or shrinks its depth under load: the audio after it moves by
    up to `SLIP_MAX`, and the eighth it falls in correlates poorly). Each spoiled eighth still lies where a
    neighbour puts it; the in-step eighths' spacing moves only at slips, by at most `SLIP_MAX`. Returns the
    lags."""
    assert received.size, "the caller recorded nothing"
    pieces = peers.heard_in_pieces(speech, received, pieces=8)
    print(f"heard by eighths: {[(round(p, 3), lag) for p, lag in pieces]}")
    lags, n = [lag for _, lag in pieces], len(speech) // 8
    heard = [i for i, (peak, _) in enumerate(pieces) if peak >= floor]
    slips = SLIPS[engine]
    assert len(heard) >= 8 - slips, pieces
    steps = [lags[j] - lags[i] - (j - i) * n for i, j in itertools.pairwise(heard)]
    assert all(abs(step) <= SLIP_MAX for step in steps), (steps, pieces)
    assert sum(abs(step) > STEADY for step in steps) <= slips, (steps, pieces)
    for i in set(range(8)) - set(heard):  # a spoiled eighth: in line with a neighbour, not somewhere else
        near = [lags[j] + (i - j) * n for j in (i - 1, i + 1) if 0 <= j < 8]
        assert any(abs(lags[i] - at) <= SLIP_MAX for at in near), pieces
    assert lags == sorted(lags), pieces
    return lags


def _assert_echo(
    engine: str,
    speech: np.ndarray,
    received: np.ndarray,
    offset: int,
    spoken_end: int,
    floor: float = MIN_CORRELATION,
) -> None:
    """The caller hears `speech` (`_assert_heard`) in `received`, which starts `offset` samples into the
    caller's file, after it finished saying it (file sample `spoken_end`)."""
    lags = _assert_heard(engine, speech, received, floor)
    assert lags[0] + offset > spoken_end, "the echo must come after the utterance, not during it"


def _pjsua2_ok(result: peers.Pjsua2CallResult) -> dict[str, object]:
    summary = result.summary
    assert summary, f"no summary (rc={result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert "Assertion" not in result.stderr, result.stderr[-3000:]  # a pjsua2 abort at exit (pitfall 3)
    assert summary["callback_errors"] == [], summary
    return summary


def _pressed(log: str, call_id: str = "call-1") -> list[str]:
    return re.findall(rf"call {call_id} caller pressed (\S)", log)


def _end_call_fake(start_fake, tmp_path: Path):
    """An OpenAI Realtime fake whose model answers the caller's first utterance by calling `end_call`."""
    script = tmp_path / "end_call.json"
    script.write_text(
        json.dumps(
            {
                "turns": [
                    {"tool_call": {"name": "end_call", "arguments": {}}, "reply": "tone", "duration_ms": 600}
                ]
            }
        )
    )
    return start_fake("openai-realtime", "--script", str(script))


# --- pjsua2 as the caller ---


def test_pjsua2_caller_hears_its_echo_and_hangs_up(
    engine: str, start_bridge, utterance, tmp_path: Path
) -> None:
    bridge = _serve(start_bridge, engine, "--provider", "echo")
    seconds = utterance.duration_s + 0.5
    result = peers.run_pjsua2_caller(
        bridge.sip_port,
        tmp_path / "pjsua2",
        play=utterance.path,
        args=["--duration", f"{seconds:g}"],
        timeout=seconds + 15,
    )
    summary = _pjsua2_ok(result)
    assert (summary["invite_status"], summary["hangup_by"], summary["bye_status"]) == (200, "caller", 200), (
        summary
    )
    assert result.returncode == 0, summary
    _assert_echo(engine, utterance.speech, result.received, result.offset_samples, utterance.end)
    bridge.wait_for(r"call call-1 ended after [\d.]+ s by caller")


def test_pjsua2_caller_holds_and_resumes(engine: str, start_bridge, late_utterance, tmp_path: Path) -> None:
    bridge = _serve(start_bridge, engine, "--provider", "echo")
    seconds = late_utterance.duration_s + 1.0
    result = peers.run_pjsua2_caller(
        bridge.sip_port,
        tmp_path / "pjsua2",
        play=late_utterance.path,
        timeout=seconds + 15,
        args=["--duration", f"{seconds:g}", "--hold-at", "0.3", "--hold-for", "1.0"],
    )
    summary = _pjsua2_ok(result)
    assert result.returncode == 0, summary
    hold, resume = summary["hold"], summary["resume"]
    assert isinstance(hold, dict) and isinstance(resume, dict), summary
    # each re-INVITE answered 200; pjsua's own media state follows (sendonly answered recvonly -> local hold)
    assert (hold["status"], hold["media"]) == (200, "local_hold"), summary
    assert (resume["status"], resume["media"]) == (200, "active"), summary
    assert [m for m, s in summary["client_transactions"]].count("INVITE") == 3, summary  # type: ignore[union-attr]
    log = bridge.wait_for(r"call call-1 ended after") and bridge.log
    held, resumed = log.find("call call-1 media: MediaHeld"), log.find("call call-1 media: MediaResumed")
    assert 0 < held < resumed, log[-3000:]
    # spoken after the resume, and echoed: the media path is back both ways (pjmedia's jitter buffer on the
    # pjsua2 engine may slip a frame after the re-INVITEs, which `_assert_heard` allows)
    _assert_echo(engine, late_utterance.speech, result.received, result.offset_samples, late_utterance.end)


def test_pjsua2_caller_dtmf_reaches_the_session(
    engine: str, start_bridge, short_tone: Path, tmp_path: Path
) -> None:
    bridge = _serve(start_bridge, engine, "--provider", "echo")
    result = peers.run_pjsua2_caller(
        bridge.sip_port,
        tmp_path / "pjsua2",
        play=short_tone,
        timeout=20,
        args=["--duration", "3", "--dtmf", DIGITS, "--dtmf-at", "0.5"],
    )
    summary = _pjsua2_ok(result)
    assert result.returncode == 0 and summary["dtmf_sent"] == DIGITS, summary
    bridge.wait_for(r"call call-1 ended after")
    assert _pressed(bridge.log) == list(DIGITS), bridge.log[-3000:]


def test_pjsua2_caller_gets_the_bridges_bye_after_end_call(
    engine: str, start_bridge, start_fake, utterance, tmp_path: Path
) -> None:
    fake = _end_call_fake(start_fake, tmp_path)
    bridge = _serve(
        start_bridge,
        engine,
        *fake.bridge_args("openai-realtime"),
        "--end-call-tool",
        env={"OPENAI_API_KEY": "sk-test"},
    )
    result = peers.run_pjsua2_caller(
        bridge.sip_port,
        tmp_path / "pjsua2",
        play=utterance.path,
        timeout=25,
        args=["--duration", "15", "--wait-bye"],
    )
    summary = _pjsua2_ok(result)
    assert (summary["invite_status"], summary["hangup_by"], summary["error"]) == (200, "remote", None), (
        summary
    )
    assert result.returncode == 0
    bridge.wait_for(r"call call-1 ended after [\d.]+ s by \w+ \(the model ended the call")


# --- baresip as the caller ---


def test_baresip_hears_its_echo_and_hangs_up(engine: str, start_bridge, utterance, tmp_path: Path) -> None:
    _baresip_echo(engine, "PCMU", start_bridge, utterance, tmp_path)


@pytest.mark.parametrize("codec", ["G722", "OPUS"])
def test_baresip_offering_one_wideband_codec_hears_its_echo(
    codec: str, start_bridge, utterance, tmp_path: Path
) -> None:
    """baresip offers only that codec (spandsp's G.722 against the bridge's FFmpeg one, rtp/g722.py; its libopus
    against the bridge's, rtp/opus.py), the bridge lists it (`--codec`; the native engine's: pjsua2 refuses a
    codec list at start); the echo crosses both ends' codecs twice (G.722's 16 kHz frames reach the echo
    provider, a G.711 one, as their 8 kHz view; Opus's 16 kHz ones too, rtp/opus.py)."""
    _baresip_echo("native", codec, start_bridge, utterance, tmp_path)


def test_baresip_offering_pcma_alone_hears_its_echo(
    start_bridge, utterance, tmp_path: Path, bridge_media_path: str
) -> None:
    """baresip offers A-law alone (the native engine's second default codec): the echo crosses the bridge's
    A-law decoder, one of the frame decoders rtp.speedups swaps, on each media path."""
    _baresip_echo("native", "PCMA", start_bridge, utterance, tmp_path)


@pytest.mark.parametrize("codec", ["G722", "OPUS"])
def test_baresip_offering_g722_hears_its_6khz_back_through_gemini_at_16khz(
    codec: str, start_bridge, start_fake, tmp_path: Path
) -> None:
    """baresip offers G.722 only (or Opus only) and says a 1 kHz + 6 kHz chord; the native engine runs the leg
    at 16 kHz (rtp/g722.py, rtp/opus.py), so the chord reaches the Gemini fake at its own 16 kHz and its 24 kHz
    echo comes back to the codec framed at 16 kHz: the 6 kHz half (above the 4 kHz an 8 kHz frame carries,
    filtered out there) is in what baresip decoded (its dump: 16 kHz for G.722, Opus's 48 kHz stereo)."""
    rate = 16000
    t = np.arange(int(0.8 * rate)) / rate
    chord = 6000 * np.sin(2 * np.pi * 1000 * t) + 6000 * np.sin(2 * np.pi * 6000 * t)
    wav = peers.write_wav(
        tmp_path / "chord.wav", np.concatenate([np.zeros(rate // 2), chord, np.zeros(3 * rate)]), rate
    )
    fake = start_fake("gemini-live")
    bridge = _serve(
        start_bridge,
        "native",
        *fake.bridge_args("gemini-live"),
        "--codec",
        codec,
        env={"GEMINI_API_KEY": "k"},
    )
    with peers.BaresipCaller(tmp_path / "baresip", wav, codecs=BARESIP_CODECS[codec]) as caller:
        result = caller.run(bridge.sip_port, timeout=20)
    assert result.established and result.end_of_file and result.received_path, result.stdout[-2000:]
    bridge.wait_for(rf"media: {codec}/{48000 if codec == 'OPUS' else 8000}")
    dump_rate, received = peers.read_wav(result.received_path)
    assert dump_rate == (48000 if codec == "OPUS" else rate)
    rate = dump_rate
    x = (received if received.ndim == 1 else received[:, 0]).astype(np.float64)
    loud = np.flatnonzero(np.abs(x) > 3000)
    assert loud.size > 0.4 * rate, "no echo of the chord came back"
    echo = x[loud[0] + rate // 10 : loud[-1] - rate // 10]
    power = np.abs(np.fft.rfft(echo * np.hanning(len(echo)))) ** 2
    hz = np.fft.rfftfreq(len(echo), 1 / rate)
    low, high = power[np.abs(hz - 1000) < 100].sum(), power[np.abs(hz - 6000) < 100].sum()
    assert high > 0.3 * low, high / low  # the 6 kHz half came back (at 8 kHz frames: under 0.001)


def _baresip_echo(engine: str, codec: str, start_bridge, utterance, tmp_path: Path) -> None:
    """A call from baresip offering `codec` alone to the echo provider: it hears its own speech back."""
    bridge = _serve(
        start_bridge, engine, "--provider", "echo", *(("--codec", codec) if codec != "PCMU" else ())
    )
    with peers.BaresipCaller(tmp_path / "baresip", utterance.path, codecs=BARESIP_CODECS[codec]) as caller:
        result = caller.run(bridge.sip_port, timeout=20)
    assert result.established and result.end_of_file and result.hangup_by == "caller", result.stdout[-2000:]
    bridge.wait_for(rf"media: {codec}/{48000 if codec == 'OPUS' else 8000}")  # as the bridge logged it
    # dec.wav is packet-indexed from the first packet received, within a frame of when the file started
    floor = ECHO_FLOOR.get(codec, MIN_CORRELATION)
    _assert_echo(engine, utterance.speech, result.received, 0, utterance.end, floor)
    bridge.wait_for(r"call call-1 ended after [\d.]+ s by caller")


def test_baresip_holds_and_resumes(
    engine: str, start_bridge, capture, late_utterance, tmp_path: Path
) -> None:
    bridge = _serve(start_bridge, engine, "--provider", "echo")
    # baresip restarts its sndfile dumps at each re-INVITE (one file per second of start): read the echo off the
    # wire instead, from the bridge's first RTP port (pjsua2 takes --rtp-port, native the even port from it)
    first = bridge.rtp_port
    cap = capture(f"udp and src host 127.0.0.1 and src portrange {first}-{first + 1}")
    with peers.BaresipCaller(tmp_path / "baresip", late_utterance.path, sip_trace=True) as caller:
        caller.start(bridge.sip_port)
        peers.baresip_established(caller)
        peers.baresip_hold(caller)
        bridge.wait_for(r"call call-1 media: MediaHeld")
        peers.baresip_resume(caller)
        bridge.wait_for(r"call call-1 media: MediaResumed")
        result = caller.wait(timeout=20)
    assert result.established and result.hangup_by == "caller", result.stdout[-2000:]
    finals = [c for c in peers.sip_trace_responses(result.stdout, "INVITE") if c >= 200]
    assert finals == [200, 200, 200], finals  # the call, the hold, the resume
    bridge.wait_for(r"call call-1 ended after [\d.]+ s by caller")
    cap.stop()
    payloads = max((cap.rtp_payloads(port) for port in (first, first + 1)), key=len)
    wire = np.frombuffer(ulaw_decode(b"".join(payloads)), dtype="<i2")
    assert wire.size, "no RTP from the bridge on the wire"
    # spoken after the resume and echoed: the media path came back both ways
    _assert_heard(engine, late_utterance.speech, wire, floor=0.99)  # PCMU on the wire: exact where in step


@NATIVE_ALSO_PURE
def test_baresip_dtmf_reaches_the_session(
    engine: str, start_bridge, short_tone: Path, tmp_path: Path, bridge_media_path: str
) -> None:
    bridge = _serve(start_bridge, engine, "--provider", "echo")
    with peers.BaresipCaller(tmp_path / "baresip", short_tone) as caller:
        caller.start(bridge.sip_port)
        peers.baresip_established(caller)
        peers.baresip_dtmf(caller, DIGITS)
        bridge.wait_for(rf"call call-1 caller pressed {re.escape(DIGITS[-1])}")
        result = caller.wait(timeout=15)
    assert result.established, result.stdout[-2000:]
    bridge.wait_for(r"call call-1 ended after")
    assert _pressed(bridge.log) == list(DIGITS), bridge.log[-3000:]


def test_baresip_gets_the_bridges_bye_after_end_call(
    engine: str, start_bridge, start_fake, utterance, tmp_path: Path
) -> None:
    fake = _end_call_fake(start_fake, tmp_path)
    bridge = _serve(
        start_bridge,
        engine,
        *fake.bridge_args("openai-realtime"),
        "--end-call-tool",
        env={"OPENAI_API_KEY": "sk-test"},
    )
    long_wav = tmp_path / "long.wav"  # the file must outlast the goodbye, or baresip hangs up first
    peers.write_wav(long_wav, np.concatenate([utterance.samples, np.zeros(8 * peers.SAMPLE_RATE, np.int16)]))
    with peers.BaresipCaller(tmp_path / "baresip", long_wav) as caller:
        result = caller.run(bridge.sip_port, timeout=20)
    assert result.established and result.hangup_by == "remote" and not result.end_of_file, result.stdout[
        -2000:
    ]
    bridge.wait_for(r"call call-1 ended after [\d.]+ s by \w+ \(the model ended the call")
