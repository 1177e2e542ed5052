"""The rollover and resumption contracts on live calls: `serve` with SIPp callers against each provider's
fake as its own process, every connection age time-scaled to seconds.

- RO2: at the hard stop the old connection's buffer is committed (Realtime `input_audio_buffer.commit`, Gemini
  `audioStreamEnd`), and the utterance the caller was still speaking is transcribed by the old connection and
  emitted once.
- RO5: with `--turn-detection client` (Realtime, xAI) the provider's VAD is off, the bridge commits each turn, a
  rollover switches at a flush: no caller audio goes to two connections, and every utterance is emitted once.
- A tool call still pending when its connection rolls over is answered once, on the new connection.
- Gemini: a recovery resumes with the latest valid `sessionResumption` handle; with an expired one it reseeds.

The caller's audio is a 1 kHz tone (continuous, so no detector finds a pause in it) between silences. The fakes
transcribe utterance N of their session as "[utterance N, D s]": which connection transcribed an emitted
utterance shows in its number. The bridge runs at DEBUG so that its log names what each utterance said.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import peers
import pytest

RATE = 8000
KEYS = {"openai-realtime": "OPENAI_API_KEY", "gemini-live": "GEMINI_API_KEY", "xai": "XAI_API_KEY"}


# -- helpers --------------------------------------------------------------------------------------------------


def _tone_call(tmp_path: Path, segments: list[tuple[float, bool]]) -> float:
    """Write the SIPp scenario's ./speech.ul: (seconds, tone?) segments, tone at -13 dBFS; returns its length."""
    parts = []
    for seconds, on in segments:
        n = int(seconds * RATE)
        t = np.arange(n) / RATE
        parts.append((0.3 * np.sin(2 * np.pi * 1000 * t) if on else np.zeros(n)) * 32767)
    samples = np.concatenate(parts).astype(np.int16)
    peers.write_wav(tmp_path / "speech.wav", samples, RATE)
    assert peers.make_ulaw(tmp_path / "speech.wav") == tmp_path / "speech.ul"
    return len(samples) / RATE


def _sipp_call(tmp_path: Path, bridge: Any, seconds: float) -> None:
    """One SIPp call streaming ./speech.ul for `seconds`, then BYE from the caller."""
    with peers.ManagedProcess(
        [
            "sipp",
            "-sf",
            str(peers.SCENARIOS / "uac_stream.xml"),
            "-s",
            "bridge",
            f"127.0.0.1:{bridge.sip_port}",
            "-i",
            "127.0.0.1",
            "-mi",
            "127.0.0.1",
            "-p",
            str(peers.free_udp_port()),
            "-m",
            "1",
            "-l",
            "1",
            "-d",
            str(int(seconds * 1000)),
            "-nostdin",
        ],
        cwd=tmp_path,
        name="sipp",
    ) as sipp:
        sipp.wait(timeout=seconds + 30)
    bridge.wait_for(r"call call-1 ended after", 15)


def _frames(fake: Any) -> list[tuple[int, int, dict[str, Any]]]:
    """(connection, monotonic ns, frame) of every client frame the fake recorded."""
    out = []
    for line in fake.record.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("frame") is not None:
            out.append((entry["conn"], entry["t_ns"], entry["frame"]))
    return out


def _lifetimes(fake: Any, at_least: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The fake's connection log (`<record>.connections`), once `at_least` connections have ended."""
    path = Path(str(fake.record) + ".connections")
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    for _ in range(int(timeout / 0.05) + 1):
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= at_least or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # bounded: the fake writes a line as each connection ends
    return sorted((json.loads(line) for line in lines), key=lambda c: c["conn"])


def _utterances(log: str) -> list[tuple[int, str]]:
    """(at ms, text) of every caller utterance the bridge emitted (INFO), its text from the DEBUG line after."""
    found: list[tuple[int, str]] = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        match = re.search(r"call call-1 caller utterance at (\d+) ms", line)
        if match is None:
            continue
        text = ""
        for later in lines[i + 1 : i + 6]:
            said = re.search(rf"call call-1 caller \({match.group(1)} ms\): (.*)$", later)
            if said:
                text = said.group(1)
                break
        found.append((int(match.group(1)), text))
    return found


def _numbers(utterances: list[tuple[int, str]]) -> list[int | None]:
    """The fake's utterance number in each emitted text ("[utterance 2, 3.1 s]" -> 2)."""
    numbers: list[int | None] = []
    for _, text in utterances:
        match = re.search(r"utterance (\d+)", text)
        numbers.append(int(match.group(1)) if match else None)
    return numbers


@pytest.fixture
def debug_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLORA_TEST_LOG_LEVEL", "debug")


# -- RO2: the hard-stop commit -----------------------------------------------------------------------------------

# Connection ages (ms): after 3 s the caller's first end of speech opens the next connection, at 4 s it opens
# whatever is being said, at 6 s the old one's buffer is committed.
RO2_ROLLOVER = [
    "--session-cap-ms",
    "12000",
    "--rollover-after-ms",
    "3000",
    "--rollover-deadline-ms",
    "4000",
    "--rollover-hard-stop-ms",
    "6000",
    "--rollover-overlap-ms",
    "1000",
]
COMMITS = {
    "openai-realtime": lambda f: f.get("type") == "input_audio_buffer.commit",
    "gemini-live": lambda f: (f.get("realtimeInput") or {}).get("audioStreamEnd") is True,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", ["openai-realtime", "gemini-live"])
def test_ro2_at_the_hard_stop_the_old_buffer_is_committed_and_its_last_utterance_emitted_once(
    protocol, start_fake, start_bridge, debug_log, tmp_path: Path
) -> None:
    # A short utterance, then one that lasts across the deadline and the old connection's hard stop, and ends
    # before the next connection's own deadline (2.5 .. 7.0 s of the call).
    _tone_call(tmp_path, [(0.3, False), (1.0, True), (1.2, False), (4.5, True), (6.0, False)])
    fake = start_fake(protocol, "--session-ms", "12000")
    bridge = start_bridge(*fake.bridge_args(protocol), *RO2_ROLLOVER, env={KEYS[protocol]: "sk-test"})
    _sipp_call(tmp_path, bridge, 9.5)  # the new connection would end the long one at about 7.5 s
    log = bridge.log
    ended = re.search(r"call call-1 ended after ([\d.]+) s by (\w+)", log)
    assert ended and ended.group(2) == "caller", log[-3000:]
    lifetimes = _lifetimes(fake, 2)
    frames = _frames(fake)
    commits = [(conn, t) for conn, t, frame in frames if COMMITS[protocol](frame)]
    first = lifetimes[0]
    print(
        f"{protocol}: commits {[(c, round((t - first['opened_ns']) / 1e9, 2)) for c, t in commits]}; "
        f"utterances {_utterances(log)}; connections {[(c['conn'], c['close_code']) for c in lifetimes]}"
    )
    assert len(lifetimes) >= 2, log[-3000:]
    # The old connection got exactly one commit, at its hard stop (after the deadline, before its cap).
    old = [t for conn, t in commits if conn == 0]
    assert len(old) == 1, (commits, log[-3000:])
    assert 4.0 <= (old[0] - first["opened_ns"]) / 1e9 <= 8.0, commits
    # Emitted: the short utterance, then the long one as the old connection transcribed it (its 2nd), once;
    # the new connection's own text for the long one (its 1st, begun while the old one was open) never.
    utterances = _utterances(log)
    assert _numbers(utterances) == [1, 2], (utterances, log[-3000:])


# -- RO5: client turn detection ------------------------------------------------------------------------------------

RO5_ROLLOVER = [
    "--session-cap-ms",
    "8000",
    "--rollover-after-ms",
    "3000",
    "--rollover-deadline-ms",
    "5000",
    "--rollover-hard-stop-ms",
    "6500",
    "--rollover-overlap-ms",
    "1000",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", ["openai-realtime", "xai"])
def test_ro5_a_client_commit_rollover_never_overlaps_and_emits_each_utterance_once(
    protocol, start_fake, start_bridge, debug_log, tmp_path: Path
) -> None:
    # One 1 s utterance every 3 s; the bridge's own VAD ends each turn, the bridge commits it.
    period = 3.0
    _tone_call(tmp_path, [(0.5, False), *([(1.0, True), (2.0, False)] * 6)])
    # A turn is flushed as the next one begins (every 3 s from 3.5 s). Once a connection is past after_ms (3 s)
    # the next one opens (about 3, 6.6 and 9.6 s into the call), and the caller moves to it at the next flush:
    # at about 6.5 and 9.5 s, so 10.5 s of call is two switches between connections that heard the caller.
    spoken_s = 10.5
    fake = start_fake(protocol, "--session-ms", "8000")
    bridge = start_bridge(
        *fake.bridge_args(protocol),
        *RO5_ROLLOVER,
        "--turn-detection",
        "client",
        env={KEYS[protocol]: "sk-test"},
    )
    _sipp_call(tmp_path, bridge, spoken_s)
    log = bridge.log
    ended = re.search(r"call call-1 ended after ([\d.]+) s by (\w+)", log)
    assert ended and ended.group(2) == "caller", log[-3000:]
    frames = _frames(fake)
    updates = [(conn, frame["session"]) for conn, _, frame in frames if frame.get("type") == "session.update"]
    for conn, session in updates:  # every connection ran with its server VAD off
        td = (
            session["audio"]["input"]["turn_detection"]
            if protocol == "openai-realtime"
            else session["turn_detection"]
        )
        assert td is None, (conn, session)
    conns = sorted({conn for conn, _, _ in frames})
    audio = {
        c: [t for conn, t, f in frames if conn == c and f.get("type") == "input_audio_buffer.append"]
        for c in conns
    }
    commits = {
        c: [t for conn, t, f in frames if conn == c and f.get("type") == "input_audio_buffer.commit"]
        for c in conns
    }
    lifetimes = _lifetimes(fake, len(conns))
    utterances = _utterances(log)
    t0 = lifetimes[0]["opened_ns"]
    sockets = [
        (c["conn"], round((c["opened_ns"] - t0) / 1e9, 2), round((c["closed_ns"] - t0) / 1e9, 2))
        for c in lifetimes
    ]
    print(
        f"{protocol}: sockets (conn, open s, closed s) {sockets}; commits per connection "
        f"{[len(commits[c]) for c in conns]}; utterances {utterances}"
    )
    assert len(conns) >= 2 and len(updates) == len(conns), log[-3000:]  # it rolled over
    heard = [c for c in conns if audio[c]]  # (a connection opened as the call ended may have heard nothing)
    assert len(heard) >= 2, audio
    for a, b in zip(heard, heard[1:], strict=False):
        # RO5: no caller audio went to both connections ...
        assert max(audio[a]) < min(audio[b]), (
            a,
            b,
            round((max(audio[a]) - t0) / 1e9, 2),
            round((min(audio[b]) - t0) / 1e9, 2),
        )
        # ... and the old one's last audio was committed by the bridge (the flush the switch happened at).
        assert commits[a] and max(commits[a]) >= max(audio[a]), (
            a,
            "audio left uncommitted on the old connection",
        )
    # Every utterance once: about one per period, never two within half a period.
    emitted = [at for at, _ in utterances]
    spoken = sum(1 for k in range(6) if 0.5 + k * period < spoken_s)  # begun before the caller hung up: 4
    # the last one may be cut by the hang-up (its turn never ends), so it may be missing; none is twice
    assert spoken - 1 <= len(emitted) <= spoken, (utterances, log[-3000:])
    assert min(np.diff(emitted)) >= period * 1000 / 2, utterances
    assert None not in _numbers(utterances), utterances  # each one the text a connection transcribed


# -- a tool call pending across a rollover ---------------------------------------------------------------------------

SECRET = "whsec-contract-live"
TOOL_SCRIPT = {
    "turns": [
        {
            "tool_call": {"name": "lookup_order", "arguments": {"order_id": "42"}},
            "reply": "tone",
            "duration_ms": 600,
        }
    ],
    "then": {"reply": "echo"},
    # The next connection is given the result as text: the scripted model speaks it (a real one, seeded with
    # "lookup_order is still running: do not request it again", would too) instead of asking again.
    "tools_answer_callers": True,
}


class SlowApplication(ThreadingHTTPServer):
    """The application's webhook: answers every job after `delay_s`, with a ticket that names the request."""

    daemon_threads = True

    def __init__(self, delay_s: float) -> None:
        super().__init__(("127.0.0.1", 0), _SlowHandler)
        self.delay_s = delay_s
        self.jobs: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def answer(self, headers: dict[str, str], body: bytes) -> bytes:
        timestamp = headers.get("x-parlora-timestamp", "")
        expected = (
            "sha256=" + hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
        )
        assert hmac.compare_digest(headers.get("x-parlora-signature", ""), expected)
        if "event" in json.loads(body):  # the call's events (call_started, utterances, call_ended): not jobs
            return b"{}"
        with self.lock:
            self.jobs.append(json.loads(body))
            ticket = f"TICKET-{len(self.jobs)}"
        time.sleep(self.delay_s)  # backend work outlives the connection that asked for it
        return json.dumps({"output": {"status": "shipped", "ticket": ticket}}).encode()


class _SlowHandler(BaseHTTPRequestHandler):
    server: SlowApplication

    def do_POST(self) -> None:  # http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        payload = self.server.answer({k.lower(): v for k, v in self.headers.items()}, body)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.timeout(60)
def test_a_tool_call_pending_across_a_rollover_is_answered_once_on_the_new_connection(
    start_fake, start_bridge, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(TOOL_SCRIPT))
    # The caller asks (0.3 .. 1.3 s); the model calls lookup_order at once; the application answers 5 s later,
    # after the next connection opened (deadline 4 s) and the old one's hard stop (6 s).
    _tone_call(tmp_path, [(0.3, False), (1.0, True), (12.0, False)])
    app = SlowApplication(delay_s=5.0)
    thread = threading.Thread(target=app.serve_forever, name="webhook-app", daemon=True)
    thread.start()
    try:
        fake = start_fake("openai-realtime", "--script", str(script), "--session-ms", "12000")
        url = f"http://127.0.0.1:{app.server_address[1]}/jobs"
        bridge = start_bridge(
            *fake.bridge_args("openai-realtime"),
            *RO2_ROLLOVER,
            "--webhook",
            url,
            "--webhook-timeout",
            "8",
            env={"OPENAI_API_KEY": "sk-test", "PARLORA_WEBHOOK_SECRET": SECRET},
        )
        _sipp_call(tmp_path, bridge, 9.0)  # the answer goes out at about 6.8 s
    finally:
        app.shutdown()
        app.server_close()
        thread.join(timeout=5)
    log = bridge.log
    ended = re.search(r"call call-1 ended after ([\d.]+) s by (\w+)", log)
    assert ended and ended.group(2) == "caller", log[-3000:]
    assert [job["name"] for job in app.jobs] == ["lookup_order"], app.jobs  # dispatched once
    frames = _frames(fake)
    lifetimes = _lifetimes(fake, 2)
    calls = {conn for conn, _, f in frames if f.get("type") == "session.update"}
    first_audio = {}
    for conn, t, f in frames:
        if f.get("type") == "input_audio_buffer.append":
            first_audio.setdefault(conn, t)
    # What carries the answer: a seed (history given to a connection before it hears the caller: RO8's
    # verified results) is context, not an answer; an answer comes while the connection is in the call.
    answers = [
        (conn, t, f)
        for conn, t, f in frames
        if "TICKET-1" in json.dumps(f) and t > first_audio.get(conn, t + 1)
    ]
    seeds = [
        conn for conn, t, f in frames if "TICKET-1" in json.dumps(f) and t <= first_audio.get(conn, t + 1)
    ]
    t0 = lifetimes[0]["opened_ns"]
    sockets = [
        (c["conn"], round((c["opened_ns"] - t0) / 1e9, 2), round((c["closed_ns"] - t0) / 1e9, 2))
        for c in lifetimes
    ]
    print(
        f"sockets (conn, open s, closed s) {sockets}; answers "
        f"{[(c, round((t - t0) / 1e9, 2), f['item']) for c, t, f in answers]}; seeded on {seeds}"
    )
    assert len(calls) >= 2, log[-3000:]  # it rolled over while the job ran
    assert len(answers) == 1, (answers, log[-3000:])  # answered once
    conn, at, frame = answers[0]
    assert conn >= 1 and frame.get("type") == "conversation.item.create", answers  # on the new connection
    # ... and the new connection was asked to speak it.
    assert any(c == conn and t >= at and f.get("type") == "response.create" for c, t, f in frames), frames[
        -10:
    ]


# -- Gemini: resumption on recovery ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("expired", [False, True], ids=["valid-handle", "expired-handle"])
def test_gemini_recovery_resumes_with_the_latest_handle_or_reseeds_when_it_expired(
    expired, start_fake, start_bridge, debug_log, tmp_path: Path
) -> None:
    # Utterance 1 at 0.3 s (answered, then a resumable handle); the socket dies at 4 s; utterance 2 at 6.3 s.
    _tone_call(tmp_path, [(0.3, False), (1.0, True), (5.0, False), (1.0, True), (4.0, False)])
    ttl = ["--handle-ttl-ms", "1"] if expired else []  # 1 ms after the old socket closed: expired on arrival
    fake = start_fake("gemini-live", "--fault", "1/abrupt_close@4000", *ttl)
    bridge = start_bridge(*fake.bridge_args("gemini-live"), env={"GEMINI_API_KEY": "sk-test"})
    _sipp_call(tmp_path, bridge, 9.5)  # utterance 2 is emitted at about 7.8 s
    log = bridge.log
    ended = re.search(r"call call-1 ended after ([\d.]+) s by (\w+)", log)
    assert ended and ended.group(2) == "caller", log[-3000:]  # recovered behind the caller's back
    lifetimes = _lifetimes(fake, 3 if expired else 2)
    frames = _frames(fake)
    seeded = {
        conn for conn, _, f in frames if "clientContent" in f and not f["clientContent"].get("turnComplete")
    }
    utterances = _utterances(log)
    summary = [
        (c["conn"], c["close_code"], c["session_id"], c["resumed_handle"], c["handles"][-1:])
        for c in lifetimes
    ]
    print(
        f"connections (conn, close code, session, resumed with, last handle) {summary}; "
        f"history seeded on {sorted(seeded)}; utterances {utterances}"
    )
    first = lifetimes[0]
    assert first["handles"], first  # the fake issued resumption handles
    assert "output_recovery done" in log, log[-3000:]  # the voice came back
    if not expired:
        assert len(lifetimes) == 2, lifetimes
        second = lifetimes[1]
        # The replacement resumed the session with the latest handle the old connection was given.
        assert (
            second["resumed_handle"] == first["handles"][-1] and second["session_id"] == first["session_id"]
        )
        assert 1 not in seeded  # a resumed session has its history: nothing seeded again
        assert _numbers(utterances) == [1, 2], utterances  # the conversation went on: the session's 2nd
    else:
        refused, fresh = lifetimes[1], lifetimes[2]
        assert refused["close_code"] == 1007 and refused["resumed_handle"] is None, (
            refused
        )  # expired: refused
        assert fresh["resumed_handle"] is None and fresh["session_id"] != first["session_id"], fresh
        assert 2 in seeded  # the reseeded connection got the conversation as history (HR7)
        assert _numbers(utterances) == [1, 1], utterances  # a new session: its 1st utterance


# -- refusing client turn detection where the protocol cannot do it ---------------------------------------------------


@pytest.mark.parametrize("protocol", ["echo", "openai-live", "gemini-live"])
def test_turn_detection_client_is_refused_at_start_for_providers_without_client_commits(
    protocol, tmp_path: Path
) -> None:
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": "k", "GEMINI_API_KEY": "k"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridge",
            "serve",
            "--provider",
            protocol,
            "--turn-detection",
            "client",
            "--sip",
            f"127.0.0.1:{peers.free_udp_port()}",
        ],
        cwd=Path(__file__).parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    wanted = f"defaults.turn_detection: client needs openai-realtime or xai; a provider in use is {protocol}"
    assert done.returncode == 2 and wanted in done.stderr, done.stderr
