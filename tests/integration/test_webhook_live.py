"""DL4 on a live call: `serve --webhook` POSTs each job once to an application, however often it is delivered.

The OpenAI Realtime fake runs as its own process with a script that calls `lookup_order` before answering every
caller utterance, and the `duplicate_tool_call` fault: every function call arrives twice. The application is a
small HTTP server in this test process on 127.0.0.1; it checks each request's signature with the shared secret
and answers a distinct output. baresip says two sentences. Afterwards: each job was POSTed exactly once, every
request was signed, and the fake's record of client frames shows the model got each answer as the
`function_call_output` of its call.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
import wave
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import peers

SECRET = "whsec-live-test-never-logged"
SCRIPT = {
    "turns": [],
    "then": {"tool_call": {"name": "lookup_order", "arguments": {"order_id": "42"}}, "reply": "echo"},
}
RATE = 8000


class Application(ThreadingHTTPServer):
    """Records every request and answers each with a distinct output."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[
            tuple[dict[str, str], bytes, bool, float]
        ] = []  # headers, body, signature ok, when
        self.events: list[tuple[dict[str, str], dict, bool]] = []  # events: headers, body, signature ok
        self.lock = threading.Lock()

    def answer(self, headers: dict[str, str], body: bytes) -> bytes:
        timestamp = headers.get("x-parlora-timestamp", "")
        expected = (
            "sha256=" + hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
        )
        valid = hmac.compare_digest(headers.get("x-parlora-signature", ""), expected)
        if "x-parlora-event" in headers:  # the call's events come to the same URL
            with self.lock:
                self.events.append((headers, json.loads(body), valid))
            return b"{}"
        with self.lock:
            self.requests.append((headers, body, valid, time.time()))
            ticket = len(self.requests)
        job = json.loads(body)
        return json.dumps(
            {
                "output": {
                    "order_id": job["arguments"]["order_id"],
                    "status": "shipped",
                    "ticket": f"T-{ticket}",
                }
            }
        ).encode()


class _Handler(BaseHTTPRequestHandler):
    server: Application

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


def _two_sentences(tmp_path: Path) -> Path:
    first = peers.make_utterance(
        tmp_path / "u1.wav", "Where is my order number forty two?", lead_silence_s=0.5, tail_silence_s=0.0
    )
    second = peers.make_utterance(
        tmp_path / "u2.wav", "And when will it arrive, please?", lead_silence_s=0.0, tail_silence_s=0.0
    )
    # The pause holds the first answer (the tool call, the webhook's answer, then the echo the fake sends 4x faster
    # than real time); after the second sentence, its job is POSTed and answered within about a second.
    gap = np.zeros(3 * RATE, dtype=np.int16)
    samples = np.concatenate(
        [first.samples[: first.end], gap, second.speech, np.zeros(3 * RATE, dtype=np.int16)]
    )
    path = tmp_path / "call.wav"
    peers.write_wav(path, samples, RATE)
    return path


def test_dl4_each_job_is_posted_once_signed_and_its_answer_reaches_the_model(
    start_fake, start_bridge, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    app = Application()
    thread = threading.Thread(target=app.serve_forever, name="webhook-app", daemon=True)
    thread.start()
    try:
        fake = start_fake("openai-realtime", "--script", str(script), "--fault", "duplicate_tool_call")
        url = f"http://127.0.0.1:{app.server_address[1]}/parlora/jobs"
        bridge = start_bridge(
            *fake.bridge_args("openai-realtime"),
            "--webhook",
            url,
            "--webhook-timeout",
            "5",
            env={"OPENAI_API_KEY": "sk-test", "PARLORA_WEBHOOK_SECRET": SECRET},
        )
        bridge.wait_for(r"application webhook: POST http://127\.0\.0\.1:\d+/parlora/jobs \(timeout 5 s\)")
        with peers.BaresipCaller(tmp_path / "baresip", _two_sentences(tmp_path)) as caller:
            result = caller.run(bridge.sip_port, timeout=60)
        bridge.wait_for(r"call call-1 ended after .* by caller")
    finally:
        app.shutdown()
        app.server_close()
        thread.join(timeout=5)
    log = bridge.log
    assert result.established, log[-3000:]

    # The bridge: two jobs, each delivered twice by the fake and dispatched once.
    dispatched = re.findall(
        r"call call-1 (job-\d+) \(lookup_order\) running at \d+ ms: dispatched to the "
        r"application \(call (\S+)\)",
        log,
    )
    redelivered = re.findall(r"(job-\d+) \(lookup_order\) \w+ at \d+ ms: call (\S+) delivered again", log)
    assert len(dispatched) >= 2, log[-3000:]
    assert sorted(dispatched) == sorted(set(redelivered)), log[-3000:]  # every job's call came twice

    # The application: one POST per job, each signed with the secret and carrying the call's identity.
    bodies = [json.loads(body) for _, body, _, _ in app.requests]
    assert sorted(b["job_id"] for b in bodies) == sorted(job for job, _ in dispatched)
    keys = Counter(headers["idempotency-key"] for headers, _, _, _ in app.requests)
    assert len(keys) == len(dispatched) and set(keys.values()) == {1}
    assert all(re.fullmatch(r"[0-9a-f]{16}/call-1/job-\d+", key) for key in keys)
    for headers, _, valid, received_at in app.requests:
        assert valid, headers
        assert abs(int(headers["x-parlora-timestamp"]) - received_at) <= 5
        assert headers["content-type"] == "application/json" and headers["user-agent"].startswith(
            "parlora-bridge"
        )
    for body in bodies:
        assert (
            body["name"] == "lookup_order"
            and body["arguments"] == {"order_id": "42"}
            and body["kind"] == "function"
        )
        assert body["call"]["call_id"] == "call-1" and "sip:caller@127.0.0.1" in body["call"]["from"]
        assert body["call"]["called"] == "bridge" and body["supersedes"] is None

    # The model: each job's answer came back as the function_call_output of its call, once.
    outputs = []
    for line in fake.record.read_text().splitlines():
        frame = json.loads(line).get("frame") or {}
        item = frame.get("item") or {}
        if frame.get("type") == "conversation.item.create" and item.get("type") == "function_call_output":
            outputs.append((item["call_id"], json.loads(item["output"])))
    by_call = dict(dispatched)  # job id -> provider call id
    expected = sorted((by_call[b["job_id"]], f"T-{n}") for n, b in enumerate(bodies, 1))
    assert sorted((call_id, output["ticket"]) for call_id, output in outputs) == expected, outputs
    assert all(
        output == {"order_id": "42", "status": "shipped", "ticket": output["ticket"]} for _, output in outputs
    )

    print(
        f"{len(dispatched)} jobs, each delivered twice by the fake, POSTed once each; "
        f"answers {[o['ticket'] for _, o in outputs]} reached the model"
    )
    assert SECRET not in log and SECRET not in fake.proc.stdout + fake.proc.stderr


def test_issue15_events_cdr_and_recording_of_a_live_call(start_bridge, tmp_path: Path) -> None:
    """serve (the echo provider) with --webhook, --cdr and --record; SIPp says one sentence and hangs up
    after 6 s. The application gets call_started, the caller's and the echo's utterances and call_ended with
    the record; the CDR has that record as its one line; the WAV's right channel is what the ledger sent."""
    app = Application()
    thread = threading.Thread(target=app.serve_forever, name="webhook-app", daemon=True)
    thread.start()
    cdr, records = tmp_path / "cdr.jsonl", tmp_path / "rec"
    records.mkdir()
    workdir = tmp_path / "sipp"
    peers.make_utterance(
        workdir / "speech.wav",
        "Where is my order number forty two, please?",
        lead_silence_s=0.3,
        tail_silence_s=5.0,
        ulaw=True,
    )
    try:
        url = f"http://127.0.0.1:{app.server_address[1]}/events"
        bridge = start_bridge(
            "--webhook",
            url,
            "--cdr",
            str(cdr),
            "--record",
            str(records),
            env={"PARLORA_WEBHOOK_SECRET": SECRET},
        )
        result = peers.run_sipp(
            "uac_stream", bridge.sip_port, extra_args=["-d", "6000"], workdir=workdir, timeout=30
        )
        bridge.wait_for(r"call call-1 ended after .* by caller", 15)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(b["event"] == "call_ended" for _, b, _ in app.events):
            time.sleep(0.05)
    finally:
        app.shutdown()
        app.server_close()
        thread.join(timeout=5)
    assert result.returncode == 0, result.screen[-2000:]
    events = [body for _, body, _ in app.events]
    assert all(valid for _, _, valid in app.events)
    names = [e["event"] for e in events]
    assert names[0] == "call_started" and names[-1] == "call_ended" and names.count("call_ended") == 1, names
    assert events[0]["call"]["call_id"] == "call-1" and events[0]["call"]["called"] == "bridge"
    utterances = [e for e in events if e["event"] == "utterance"]
    caller = [u for u in utterances if u["role"] == "caller"]
    assistant = [u for u in utterances if u["role"] == "assistant"]
    assert caller and assistant, utterances
    assert [u["seq"] for u in utterances] == list(range(1, len(utterances) + 1))
    said = caller[0]
    assert said["text"] and 0 <= said["start_ms"] < said["end_ms"] < 6000, said  # the sentence, ~1.5 s
    echo = assistant[0]
    assert echo["start_ms"] >= said["end_ms"] - 100 and echo["end_ms"] > echo["start_ms"], (said, echo)
    assert echo["heard_ms"] >= 500 and echo["interrupted"] is False, echo  # the echo of ~1 s of speech
    record = events[-1]["record"]
    assert record["ended_by"] == "caller" and record["sip_status"] == 200 and 5.5 < record["duration_s"] < 9
    assert record["connections"] == {"count": 1, "ids": ["conn-1"]} and record["recoveries"]["count"] == 0
    assert record["rollovers"]["count"] == 0 and record["provider"] == "echo"
    assert record["qos"]["frames_in"] > 200 and "complete" in record["usage"]
    assert record["utterances"] == len(utterances)
    # The CDR: one line, the same record.
    lines = cdr.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == record
    # The recording: stereo, 8 kHz 16-bit; the right channel carries what was transmitted, frame for frame.
    wav_path = Path(record["recording"])
    assert wav_path.parent == records
    with wave.open(str(wav_path), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (2, 2, RATE)
        stereo = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, 2)
    frames = len(stereo) // 160
    left = stereo[: frames * 160, 0].reshape(frames, 160)
    right = stereo[: frames * 160, 1].reshape(frames, 160)
    sent = record["frames_out"]
    assert sent > 25 and abs(frames - record["duration_s"] * 50) <= 25, (frames, record["duration_s"])
    voiced = int((np.abs(right).max(axis=1) > 0).sum())
    assert voiced <= sent + 1 and voiced >= 25, (voiced, sent)  # nothing but what the ledger sent
    assert voiced >= 0.7 * sent, (voiced, sent)  # the echo of speech: mostly not digital silence
    # The ledger's span (the assistant utterance's start and end are its first and last frames) is where the
    # WAV's right channel carries audio, and it is as long as the frames the ledger says were sent (± 1).
    begin, end = echo["start_ms"] // 20, echo["end_ms"] // 20
    assert abs((end - begin) - sent) <= 1, (begin, end, sent)
    first, last = np.flatnonzero(np.abs(right).max(axis=1) > 0)[[0, -1]]
    assert begin - 1 <= first and last <= end + 1, (first, last, begin, end)
    assert (np.abs(left).max(axis=1) > 100).sum() >= 40  # the caller's sentence on the left
    print(
        f"events {names}; record frames_out {sent}; wav {frames} frames, right voiced {voiced} ({first}-{last})"
    )
