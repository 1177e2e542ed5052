"""The native SIP engine (`serve --engine native`, sip/native/agent.py) against real peers on loopback.

- `serve --engine native` with the embedded echo provider: a SIPp caller streams an utterance and hears it
  back (read off the wire with tshark); BYE from the caller, BYE from the bridge (SIGTERM); CANCEL before the
  answer → 487; OPTIONS → 200; two calls at once; hold and resume by re-INVITE.
- The engine in this process (no session, an echo of the caller's own frames): after SIPp's calls every
  count the engine keeps (calls, RTP ports and sockets, media channels, timers, TCP connections, tasks, SIP
  transactions) is back to zero, and each frame the ledger holds left through `sendto`.
- Leg-level telephony through `leg_driver.py --engine native`: caller DTMF from SIPp's RFC 4733 pcaps, DTMF
  out as RFC 4733, and a blind transfer by REFER.

Every wait is bounded and waits for an event (a log line, SIPp's exit, a count), never for a fixed time.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import peers
import pytest

from rtp.g711 import ulaw_decode
from rtp.playout import OutboundFrame
from rtp.units import NS_PER_MS as MS
from sip.core.transaction import TimerConfig
from sip.engine import EngineConfig, create_engine
from sip.leg import CallEnded, CallLeg, FrameReceived, MediaStarted
from sip.native.agent import NativeUserAgent
from sip.native.leg import NativeLeg
from tests.support.native_engine import _wait_until
from tests.support.telephony_sip import TARGET, LegDriver

NATIVE = ("--engine", "native")


def _media_port(bridge, call_id: str = "call-1") -> int:
    """The local RTP port of a call, from the engine's media line."""
    match = bridge.wait_for(rf"{call_id} media: PCMU/8000 to \S+ from 127\.0\.0\.1:(\d+)")
    return int(match.group(1))


def _first_rtp_port(bridge) -> int:
    return bridge.rtp_port + (bridge.rtp_port % 2)  # the engine's port pool starts on an even port


def _stream_call(bridge, workdir: Path, ulaw: Path, seconds: float, calls: int = 1) -> peers.SippResult:
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(ulaw, workdir / "speech.ul")  # uac_stream streams ./speech.ul
    return peers.run_sipp(
        "uac_stream",
        bridge.sip_port,
        calls=calls,
        rate=20,
        workdir=workdir,
        timeout=seconds + 30,
        trace_msg=True,
        extra_args=["-d", str(int(seconds * 1000))],
    )


def _sipp_ok(result: peers.SippResult) -> None:
    assert result.returncode == 0, (
        f"SIPp rc={result.returncode}\n{result.errors[-2000:]}\n{result.screen[-1500:]}\n"
        f"{(result.workdir / 'sipp_messages.log').read_text(errors='replace')[-4000:]}"
    )


@pytest.fixture(scope="module")
def utterance_ul(tmp_path_factory: pytest.TempPathFactory) -> tuple[peers.Utterance, Path]:
    path = tmp_path_factory.mktemp("native-audio") / "utterance.wav"
    utterance = peers.make_utterance(
        path, "Hello bridge, please say this sentence back to me", tail_silence_s=4.0
    )
    return utterance, peers.make_ulaw(path)


# --- serve --engine native ---


def test_native_answers_a_sipp_call_and_the_caller_hears_its_echo(
    start_bridge, capture, utterance_ul, tmp_path: Path
) -> None:
    utterance, ulaw = utterance_ul
    bridge = start_bridge(*NATIVE, "--provider", "echo")
    first = _first_rtp_port(bridge)
    cap = capture(f"udp and src host 127.0.0.1 and src portrange {first}-{first + 9}")
    seconds = len(utterance.samples) / 8000 + 1.0
    result = _stream_call(bridge, tmp_path / "sipp", ulaw, seconds)
    _sipp_ok(result)
    assert (result.count("ANSWERED"), result.count("CLOSED")) == (1, 1)
    port = _media_port(bridge)
    assert port % 2 == 0 and port >= first
    bridge.wait_for(r"call call-1 ended after [\d.]+ s by caller \(200 ")  # the caller's BYE ended it
    cap.stop()
    wire = np.frombuffer(ulaw_decode(b"".join(cap.rtp_payloads(port))), dtype="<i2")
    # the bridge sent 20 ms packets all call long (silence around the echo): about one per 20 ms of the call
    assert len(wire) >= 0.8 * seconds * 8000
    pieces = peers.heard_in_pieces(utterance.speech, wire, pieces=8)
    print(
        f"echo on the wire by eighths: {[(round(p, 3), lag) for p, lag in pieces]}; utterance ended at "
        f"{utterance.end}"
    )
    assert sum(peak >= 0.99 for peak, _ in pieces) >= 7 and min(p for p, _ in pieces) >= 0.7, bridge.log[
        -3000:
    ]
    lags = [lag for _, lag in pieces]
    assert lags == sorted(lags) and lags[0] > utterance.end  # heard in order, after the caller finished
    frames_in, frames_out = map(
        int, re.search(r"call call-1 ended after .*: frames in (\d+), out (\d+)", bridge.log).groups()
    )
    assert frames_in >= len(utterance.samples) // 160 - 5 and frames_out >= len(utterance.speech) // 160


def test_native_pcmu_from_the_provider_is_the_callers_rtp_payload_byte_for_byte(
    start_fake, start_bridge, capture, utterance, tmp_path: Path, bridge_media_path: str
) -> None:
    """What the provider sent (the echo fake speaks back exactly what it was sent) is the RTP payload the
    caller received, byte for byte: no resampling, no level change, no transcoding on the way out."""
    fake, url, record = start_fake()
    bridge = start_bridge(
        *NATIVE, "--provider", "openai-live", "--provider-url", url, env={"OPENAI_API_KEY": "sk-test"}
    )
    first = _first_rtp_port(bridge)
    cap = capture(f"udp and src host 127.0.0.1 and src portrange {first}-{first + 9}")
    with peers.BaresipCaller(tmp_path / "baresip", utterance.path) as caller:
        result = caller.run(bridge.sip_port, timeout=40)
    assert result.established
    bridge.wait_for(r"call call-1 ended after")
    cap.stop()
    payload = b"".join(cap.rtp_payloads(_media_port(bridge)))
    frames = [json.loads(line)["frame"] for line in record.read_text().splitlines()]
    provider_sent = b"".join(
        base64.b64decode(f["audio"]["base64"]) for f in frames if f["type"] == "session.input_audio.append"
    )
    voiced = payload.strip(b"\xff")  # µ-law silence around the echo
    assert len(voiced) >= 0.95 * len(utterance.speech)
    assert voiced in provider_sent


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_native_bye_from_the_bridge_on_sigterm_and_everything_released(
    start_bridge, tmp_path: Path, transport: str
) -> None:
    bridge = start_bridge(*NATIVE, "--provider", "echo", "--drain-timeout", "0")  # no drain: hang up at once
    extra = ["-t", "t1"] if transport == "tcp" else []
    with ThreadPoolExecutor(max_workers=1) as pool:
        run = pool.submit(
            peers.run_sipp,
            "uac_wait_bye",
            bridge.sip_port,
            workdir=tmp_path / "sipp",
            timeout=40,
            trace_msg=True,
            extra_args=extra,
        )
        bridge.wait_for(r"call call-1 media: PCMU/8000")
        assert bridge.stop() == 0
        result = run.result(timeout=60)
    _sipp_ok(result)  # it got our BYE (and answered it)
    assert result.count("BYE_RECEIVED") == 1
    assert re.search(r"call call-1 ended after .* by bridge \(bridge shutting down\)", bridge.log)
    stopped = re.search(r"native engine stopped: (.*)", bridge.log)
    assert stopped, bridge.log[-3000:]
    counts = dict((k, int(v)) for k, v in re.findall(r"(\w+) (\d+)", stopped.group(1)))
    assert {
        k: counts[k]
        for k in (
            "calls",
            "core_calls",
            "rtp_ports",
            "media_channels",
            "media_timers",
            "sip_timers",
            "sip_sockets",
            "tcp_connections",
            "tasks",
        )
    } == dict.fromkeys(
        (
            "calls",
            "core_calls",
            "rtp_ports",
            "media_channels",
            "media_timers",
            "sip_timers",
            "sip_sockets",
            "tcp_connections",
            "tasks",
        ),
        0,
    )


@pytest.fixture
def silent_provider() -> Iterator[int]:
    """A TCP port that accepts connections (the kernel's backlog) and never answers: a provider whose
    WebSocket handshake hangs, so the session never answers the call."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_native_cancel_before_the_answer_gets_487(start_bridge, silent_provider: int, tmp_path: Path) -> None:
    bridge = start_bridge(
        *NATIVE,
        "--provider",
        "openai-live",
        "--provider-url",
        f"ws://127.0.0.1:{silent_provider}",
        env={"OPENAI_API_KEY": "sk-test"},
    )
    result = peers.run_sipp(
        "uac_cancel", bridge.sip_port, workdir=tmp_path / "sipp", timeout=30, trace_msg=True
    )
    _sipp_ok(result)  # 180, then 200 to its CANCEL and 487 to its INVITE, which it ACKed
    assert [result.count(e) for e in ("RINGING", "CANCEL_OK", "TERMINATED")] == [1, 1, 1]
    messages = (result.workdir / "sipp_messages.log").read_text(errors="replace")
    assert (
        "SIP/2.0 487 Request Terminated" in messages
        and "SIP/2.0 200 OK" not in messages.split("CANCEL", 1)[0]
    )


def test_native_options_gets_200_with_allow(start_bridge, tmp_path: Path) -> None:
    bridge = start_bridge(*NATIVE, "--provider", "echo")
    result = peers.run_sipp(
        "uac_options", bridge.sip_port, workdir=tmp_path / "sipp", timeout=20, trace_msg=True
    )
    _sipp_ok(result)
    assert result.log_events["OPTIONS_ANSWERED"] == ["200"]
    messages = (result.workdir / "sipp_messages.log").read_text(errors="replace")
    allow = re.search(r"^Allow: (.*)$", messages, re.MULTILINE)
    assert allow and {"INVITE", "ACK", "CANCEL", "BYE", "OPTIONS"} <= {
        m.strip() for m in allow.group(1).split(",")
    }


def test_native_two_calls_at_once(start_bridge, utterance_ul, tmp_path: Path) -> None:
    utterance, ulaw = utterance_ul
    bridge = start_bridge(*NATIVE, "--provider", "echo")
    result = _stream_call(bridge, tmp_path / "sipp", ulaw, 4.0, calls=2)
    _sipp_ok(result)
    assert (result.count("ANSWERED"), result.count("CLOSED")) == (2, 2)
    ports = {_media_port(bridge, "call-1"), _media_port(bridge, "call-2")}
    assert len(ports) == 2  # a socket pair each
    for call in ("call-1", "call-2"):
        match = bridge.wait_for(rf"call {call} ended after ([\d.]+) s by caller .*: frames in (\d+)")
        assert float(match.group(1)) >= 3.5 and int(match.group(2)) >= 150  # both streamed the whole time
    ended = [re.search(rf"call {c} ended after", bridge.log) for c in ("call-1", "call-2")]
    started = [re.search(rf"call {c} started", bridge.log) for c in ("call-1", "call-2")]
    assert started[1] and ended[0] and started[1].start() < ended[0].start()  # they overlapped


def test_native_hold_and_resume_by_reinvite(
    start_bridge, utterance_ul, tmp_path: Path, bridge_media_path: str
) -> None:
    _, ulaw = utterance_ul
    bridge = start_bridge(*NATIVE, "--provider", "echo")
    workdir = tmp_path / "sipp"
    workdir.mkdir()
    shutil.copy(ulaw, workdir / "speech.ul")
    result = peers.run_sipp("uac_hold_resume", bridge.sip_port, workdir=workdir, timeout=40, trace_msg=True)
    _sipp_ok(result)
    # RFC 3264 §8.4: our answer to sendonly is recvonly; to sendrecv again, sendrecv
    assert result.log_events["HOLD_ANSWER"] == ["recvonly"] and result.log_events["RESUME_ANSWER"] == [
        "sendrecv"
    ]
    bridge.wait_for(r"call call-1 ended after .* by caller")
    log = bridge.log
    held, resumed = (
        log.find("call-1: the caller put the call on hold"),
        log.find("call-1: the caller took the call off"),
    )
    assert 0 < held < resumed, log[-3000:]
    assert "MediaHeld" in log[held:resumed] and "MediaResumed" in log[resumed:]  # the session saw both events


def _hold_resume(start_bridge, utterance_ul, tmp_path: Path, *options: str):  # type: ignore[no-untyped-def]
    """SIPp's uac_hold_resume (1.5 s of speech, a 1.5 s hold without RTP, 1.5 s more) against `serve` with
    `options`: the bridge, SIPp's result and the messages it traced."""
    _, ulaw = utterance_ul
    bridge = start_bridge(*NATIVE, "--provider", "echo", *options)
    workdir = tmp_path / "sipp"
    workdir.mkdir()
    shutil.copy(ulaw, workdir / "speech.ul")
    result = peers.run_sipp("uac_hold_resume", bridge.sip_port, workdir=workdir, timeout=40, trace_msg=True)
    return bridge, result, (workdir / "sipp_messages.log").read_text(errors="replace")


def test_native_rtp_timeout_counts_again_from_the_resume(start_bridge, utterance_ul, tmp_path: Path) -> None:
    """--rtp-timeout 1 and a 1.5 s hold with no RTP: the call is not ended when the caller comes back (the
    silence of the hold does not count), and goes on until the caller's BYE; the 200 asked for a session
    timer that the bridge refreshes (SIPp does not support timers)."""
    bridge, result, messages = _hold_resume(start_bridge, utterance_ul, tmp_path, "--rtp-timeout", "1")
    _sipp_ok(result)
    assert result.count("CLOSED") == 1
    bridge.wait_for(r"call call-1 ended after .* by caller")
    assert "--rtp-timeout" not in bridge.log, bridge.log[-3000:]
    assert "Session-Expires: 1800;refresher=uas" in messages


def test_native_hold_timeout_ends_a_held_call_with_bye(start_bridge, utterance_ul, tmp_path: Path) -> None:
    bridge, result, messages = _hold_resume(start_bridge, utterance_ul, tmp_path, "--hold-timeout", "1")
    assert result.log_events["HOLD_ANSWER"] == ["recvonly"]
    bridge.wait_for(r"call-1: the call was on hold for 1 s \(--hold-timeout\); BYE")
    assert re.search(r"^BYE sip:", messages, re.M), messages[-3000:]  # ours, while SIPp held the call
    assert "RESUME_ANSWER" not in result.log_events


def test_native_call_over_tcp(start_bridge, utterance_ul, tmp_path: Path) -> None:
    """SIPp over TCP (-t t1): the responses come back over its connection, and our BYE reaches it."""
    _, ulaw = utterance_ul
    bridge = start_bridge(*NATIVE, "--provider", "echo")
    workdir = tmp_path / "sipp"
    workdir.mkdir()
    shutil.copy(ulaw, workdir / "speech.ul")
    result = peers.run_sipp(
        "uac_stream",
        bridge.sip_port,
        workdir=workdir,
        timeout=30,
        trace_msg=True,
        extra_args=["-t", "t1", "-d", "2000"],
    )
    _sipp_ok(result)
    assert (result.count("ANSWERED"), result.count("CLOSED")) == (1, 1)
    messages = (workdir / "sipp_messages.log").read_text(errors="replace")
    assert "TCP message received" in messages and "SIP/2.0/TCP" in messages
    bridge.wait_for(r"call call-1 ended after .* by caller \(200 ")


# --- the engine in this process: counts back to zero ---


async def test_native_engine_counts_go_back_to_zero_after_calls(utterance_ul, tmp_path: Path) -> None:
    """Two SIPp calls (UDP) against the engine in this process, each leg echoing the caller's frames: the
    ledger holds exactly what was sent, RTCP reports went out, and every count goes back to zero, transactions
    included (short RFC 3261 timers: T1 = 20 ms)."""
    utterance, ulaw = utterance_ul
    sip_port = peers.free_udp_port()
    rtp_port = peers._free_udp_port_pair() & ~1
    legs: list[CallLeg] = []
    tasks: set[asyncio.Task[None]] = set()
    echoed: dict[str, int] = {}

    async def echo(leg: CallLeg) -> None:
        call = leg.identity.call_id
        n = 0
        async for event in leg.events():
            if isinstance(event, FrameReceived):
                leg.enqueue([OutboundFrame(event.pcm, 1, "echo", n * 20)])
                n += 1
            elif isinstance(event, (MediaStarted, CallEnded)):
                echoed[call] = n
        echoed[call] = n

    def on_call(leg: CallLeg) -> None:
        legs.append(leg)
        leg.answer()
        task = asyncio.get_running_loop().create_task(echo(leg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    engine = NativeUserAgent(
        EngineConfig(host="127.0.0.1", port=sip_port, rtp_port=rtp_port),
        on_call,
        timers=TimerConfig(t1=20 * MS, t2=160 * MS, t4=200 * MS),
    )
    await engine.start()
    try:
        workdir = tmp_path / "sipp"
        workdir.mkdir()
        shutil.copy(ulaw, workdir / "speech.ul")
        result = await asyncio.to_thread(
            peers.run_sipp,
            "uac_stream",
            sip_port,
            calls=2,
            rate=20,
            workdir=workdir,
            timeout=40,
            extra_args=["-d", "4500"],
        )
        _sipp_ok(result)
        assert len(legs) == 2 and await _wait_until(lambda: not tasks, 10)
        for leg in legs:
            # the echo went out, and the ledger holds exactly what left through sendto
            assert leg.ledger.frames_transmitted > 50 and engine.leg(leg.identity.call_id) is None
            assert isinstance(leg, NativeLeg) and leg.media is not None
            # every echoed frame that was sent is in the ledger; the other packets were silence between them
            assert leg.ledger.frames_transmitted == leg.media.frames_out < leg.media.stream.packets_out
            # RTCP: a report went out within the first 3.75 s (RFC 3550 §6.3.1), and qos() has the inbound figures
            qos = leg.qos()
            assert leg.media.stream.rtcp.reports_sent >= 1 and qos is not None and qos.packets_in > 150

        def idle() -> bool:  # only the UDP and TCP listeners are left, until stop()
            return {k: v for k, v in engine.counts().items() if v} == {"sip_sockets": 2}

        assert await _wait_until(idle, 15), engine.counts()
    finally:
        clean = await engine.stop()
    assert clean and not any(engine.counts().values()), engine.counts()


async def test_native_engine_is_in_the_registry_and_refuses_beyond_max_calls(tmp_path: Path) -> None:
    """`create_engine("native", ...)` builds it; with max_calls 1 a second concurrent INVITE gets 503 with
    Retry-After and is counted."""
    sip_port = peers.free_udp_port()
    rtp_port = peers._free_udp_port_pair() & ~1
    held: list[CallLeg] = []

    def on_call(leg: CallLeg) -> None:
        held.append(leg)
        leg.answer()

    engine = create_engine(
        "native", EngineConfig(host="127.0.0.1", port=sip_port, rtp_port=rtp_port, max_calls=1), on_call
    )
    assert isinstance(engine, NativeUserAgent) and engine.max_calls == 1
    await engine.start()
    try:
        # the first call is answered and held 3 s; the second, 20 ms later, is refused at once
        result = await asyncio.to_thread(
            peers.run_sipp,
            "uac_busy",
            sip_port,
            calls=2,
            rate=50,
            workdir=tmp_path / "sipp",
            timeout=20,
            trace_msg=True,
        )
        _sipp_ok(result)
        assert result.count("ANSWERED") == 1 and result.log_events["REJECTED"][0].split()[-1] == "503"
        messages = (result.workdir / "sipp_messages.log").read_text(errors="replace")
        assert "SIP/2.0 503" in messages and re.search(r"^Retry-After: 30", messages, re.MULTILINE)
        assert engine.counts()["calls_rejected"] >= 1
    finally:
        assert await engine.stop()


# --- leg-level telephony: leg_driver.py --engine native ---


@pytest.fixture
def native_driver(tmp_path: Path) -> Iterator[Callable[..., LegDriver]]:
    started: list[LegDriver] = []

    def start(*extra: str) -> LegDriver:
        driver = LegDriver(tmp_path, *NATIVE, *extra)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        rc = driver.stop()
        assert rc == 0, f"leg driver exited with {rc}:\n{driver.proc.stderr[-3000:]}"
        assert driver.events("stopped") == [{"event": "stopped", "clean": True}]


def _sipp_thread(
    scenario: str, port: int, workdir: Path, pool: ThreadPoolExecutor
) -> Future[peers.SippResult]:
    return pool.submit(peers.run_sipp, scenario, port, workdir=workdir, timeout=45, trace_msg=True)


def test_native_caller_dtmf_from_sipp_pcaps_arrives_as_dtmf_received(native_driver, tmp_path: Path) -> None:
    driver = native_driver()
    with ThreadPoolExecutor(max_workers=1) as pool:
        run = _sipp_thread("uac_dtmf_rx", driver.sip_port, tmp_path / "sipp", pool)
        driver.wait_event("DtmfReceived", timeout=20, count=4)
        call_id = driver.events("call")[0]["call_id"]
        driver.send(f"hangup {call_id}")
        driver.wait_event("CallEnded", timeout=15)
        _sipp_ok(run.result(timeout=60))
    # each pcap is one key press (start, updates, three end packets, one RTP timestamp): one digit each
    assert [e["digit"] for e in driver.events("DtmfReceived")] == ["1", "9", "*", "#"]


def test_native_send_dtmf_goes_out_as_rfc4733_telephone_events(native_driver, tmp_path: Path) -> None:
    driver = native_driver()
    first = driver.rtp_port + driver.rtp_port % 2
    tshark = peers.ManagedProcess(
        [
            "tshark",
            "-i",
            "lo",
            "-l",
            "-f",
            f"udp src port {first}",
            "-d",
            f"udp.port=={first},rtp",
            "-Y",
            "rtpevent",
            "-T",
            "fields",
            "-e",
            "rtpevent.event_id",
            "-e",
            "rtpevent.end_of_event",
            "-e",
            "rtp.timestamp",
            "-e",
            "rtp.p_type",
        ],
        name="tshark",
    )
    try:
        tshark.wait_for(r"Capturing on", timeout=15)
        with ThreadPoolExecutor(max_workers=1) as pool:
            run = _sipp_thread("uac_wait_bye", driver.sip_port, tmp_path / "sipp", pool)
            call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
            driver.send(f"dtmf {call_id} 12x")  # refused before anything is sent
            assert "'X' not DTMF digits" in driver.wait_event("error", timeout=10)["error"]
            driver.send(f"dtmf {call_id} 12#")
            tshark.wait_for(r"^11\t(1|True)\t", timeout=15, stream="stdout")  # the end packet of '#'
            driver.send(f"hangup {call_id}")
            driver.wait_event("CallEnded", timeout=15)
            result = run.result(timeout=60)
    finally:
        tshark.stop(term_timeout=5.0)
    _sipp_ok(result)
    assert result.count("INFO_DIGIT") == 0
    events = []
    for line in (ln.text for ln in tshark.lines if ln.stream == "stdout"):
        fields = line.split("\t")
        if len(fields) == 4 and fields[0].isdigit():
            events.append((int(fields[0]), fields[1] in ("1", "True"), int(fields[2]), int(fields[3])))
    assert {pt for *_, pt in events} == {101}
    digits: dict[int, list[tuple[int, bool]]] = {}  # one telephone-event per RTP timestamp, in order
    for event_id, end, ts, _ in events:
        digits.setdefault(ts, []).append((event_id, end))
    assert [{"0123456789*#ABCD"[e] for e, _ in packets} for packets in digits.values()] == [
        {"1"},
        {"2"},
        {"#"},
    ]
    assert all(sum(end for _, end in packets) == 3 for packets in digits.values()), (
        digits
    )  # three end packets


def test_native_send_dtmf_falls_back_to_sip_info_without_telephone_event(
    native_driver, tmp_path: Path
) -> None:
    driver = native_driver()
    with ThreadPoolExecutor(max_workers=1) as pool:
        run = _sipp_thread("uac_no_telephone_event", driver.sip_port, tmp_path / "sipp", pool)
        call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
        driver.send(f"dtmf {call_id} 12#")
        driver.wait_event("sent", timeout=10)
        driver.send(f"hangup {call_id}")
        driver.wait_event("CallEnded", timeout=15)
        result = run.result(timeout=60)
    _sipp_ok(result)
    assert [line.split("=")[-1].strip() for line in result.log_events["INFO_DIGIT"]] == ["1", "2", "#"]


def test_native_blind_transfer_reports_notify_progress_then_hangs_up(native_driver, tmp_path: Path) -> None:
    driver = native_driver()
    with ThreadPoolExecutor(max_workers=1) as pool:
        run = _sipp_thread("uac_refer_notify", driver.sip_port, tmp_path / "sipp", pool)
        call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
        driver.send(f"transfer {call_id} {TARGET}")
        ended = driver.wait_event("CallEnded", timeout=20)
        result = run.result(timeout=60)
    _sipp_ok(result)  # it got the REFER, its NOTIFYs were answered 200, then it got our BYE
    assert [v.strip().strip("<>") for v in result.log_events["REFER_TO"]] == [
        TARGET
    ]  # name-addr or addr-spec
    assert result.count("BYE_RECEIVED") == 1
    progress = [(e["status_code"], e["reason"], e["final"]) for e in driver.events("TransferProgress")]
    assert progress == [(100, "Accepted", False), (100, "Trying", False), (200, "OK", True)]
    assert ended["by_remote"] is False and ended["reason"] == f"transferred to {TARGET}"


def test_native_unanswered_refer_times_out_as_final_408_and_the_call_stays_up(
    native_driver, tmp_path: Path
) -> None:
    driver = native_driver("--transfer-timeout", "2")
    with ThreadPoolExecutor(max_workers=1) as pool:
        run = _sipp_thread("uac_refer_silent", driver.sip_port, tmp_path / "sipp", pool)
        call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
        driver.send(f"transfer {call_id} {TARGET}")
        final = driver.wait_event("TransferProgress", timeout=15, where=lambda e: e["final"])
        assert (final["status_code"], final["final"]) == (408, True)
        assert driver.events("CallEnded") == []
        driver.send(
            f"transfer {call_id} {TARGET}"
        )  # the REFER may still be answered: a second one is refused
        again = driver.wait_event("TransferProgress", timeout=10, count=2)
        assert (again["status_code"], again["final"]) == (491, True)
        driver.send(f"hangup {call_id}")
        ended = driver.wait_event("CallEnded", timeout=15)
        _sipp_ok(run.result(timeout=60))
    assert ended["by_remote"] is False


def test_native_refuses_the_callers_refer_with_403(native_driver, tmp_path: Path) -> None:
    driver = native_driver()
    with ThreadPoolExecutor(max_workers=1) as pool:
        result = _sipp_thread("uac_send_refer", driver.sip_port, tmp_path / "sipp", pool).result(timeout=60)
    _sipp_ok(result)  # it required a 403 to its REFER
    assert result.count("REFER_REFUSED") == 1
    assert driver.wait_event("CallEnded", timeout=15)["by_remote"] is True


@pytest.mark.skipif(not peers.can_bind("::1"), reason="no IPv6 loopback")
async def test_native_engine_answers_options_over_ipv6_udp_and_tcp() -> None:
    engine = NativeUserAgent(
        EngineConfig(host="::1", port=0, rtp_port=peers._free_udp_port_pair() & ~1), lambda leg: None
    )
    await engine.start()
    assert engine.local is not None
    port = engine.local[1]
    request = (
        f"OPTIONS sip:bridge@[::1]:{port} SIP/2.0\r\nVia: SIP/2.0/{{t}} [::1]:{{p}};branch=z9hG4bK-v6{{t}};rport\r\n"
        "From: <sip:probe@[::1]>;tag=1\r\nTo: <sip:bridge@[::1]>\r\nCall-ID: v6-{t}\r\n"
        "CSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
    loop = asyncio.get_running_loop()
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as udp:
            udp.bind(("::1", 0))
            udp.setblocking(False)
            udp.sendto(request.format(t="UDP", p=udp.getsockname()[1]).encode(), ("::1", port))
            answer = await asyncio.wait_for(loop.sock_recv(udp, 4096), 5)
        assert answer.startswith(b"SIP/2.0 200 ") and b"Call-ID: v6-UDP" in answer
        reader, writer = await asyncio.open_connection("::1", port)
        writer.write(request.format(t="TCP", p=writer.get_extra_info("sockname")[1]).encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
        assert head.startswith(b"SIP/2.0 200 ") and b"Call-ID: v6-TCP" in head
    finally:
        assert await engine.stop()


async def test_native_engine_drain_refuses_invites_and_options_with_503() -> None:
    """DESIGN §11: a draining engine answers new INVITEs and out-of-dialog OPTIONS 503 with Retry-After (so
    a load balancer's probe sends calls elsewhere), and counts the refused INVITEs."""
    engine = NativeUserAgent(
        EngineConfig(host="127.0.0.1", port=0, rtp_port=peers._free_udp_port_pair() & ~1), lambda leg: None
    )
    await engine.start()
    assert engine.local is not None
    port = engine.local[1]
    loop = asyncio.get_running_loop()

    def request(method: str, n: int, local: int) -> bytes:
        body = (
            (
                "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
                "m=audio 9 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
            )
            if method == "INVITE"
            else ""
        )
        extra = "Contact: <sip:probe@127.0.0.1>\r\nContent-Type: application/sdp\r\n" if body else ""
        return (
            f"{method} sip:bridge@127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{local};branch=z9hG4bK-drain{n};rport\r\n"
            f"From: <sip:probe@127.0.0.1>;tag={n}\r\nTo: <sip:bridge@127.0.0.1>\r\nCall-ID: drain-{n}\r\n"
            f"CSeq: 1 {method}\r\nMax-Forwards: 70\r\n{extra}Content-Length: {len(body)}\r\n\r\n{body}"
        ).encode()

    try:
        assert not engine.draining
        engine.drain()
        assert engine.draining
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            peer.setblocking(False)
            local = peer.getsockname()[1]
            answers = []
            for n, method in enumerate(("OPTIONS", "INVITE")):
                peer.sendto(request(method, n, local), ("127.0.0.1", port))
                while True:  # skip the INVITE's 100 Trying
                    answer = await asyncio.wait_for(loop.sock_recv(peer, 4096), 5)
                    if not answer.startswith(b"SIP/2.0 100 "):
                        break
                answers.append(answer)
        for answer in answers:
            assert answer.startswith(b"SIP/2.0 503 ") and b"\r\nRetry-After: 30" in answer, answer
        assert engine.counts()["calls_rejected"] == 1 and engine.active_calls == 0
    finally:
        assert await engine.stop()
