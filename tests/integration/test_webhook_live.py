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
        self.lock = threading.Lock()

    def answer(self, headers: dict[str, str], body: bytes) -> bytes:
        timestamp = headers.get("x-parlora-timestamp", "")
        expected = (
            "sha256=" + hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
        )
        valid = hmac.compare_digest(headers.get("x-parlora-signature", ""), expected)
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

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        payload = self.server.answer({k.lower(): v for k, v in self.headers.items()}, body)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def _two_sentences(tmp_path: Path) -> Path:
    first = peers.make_utterance(
        tmp_path / "u1.wav", "Where is my order number forty two?", lead_silence_s=0.5, tail_silence_s=0.0
    )
    second = peers.make_utterance(
        tmp_path / "u2.wav", "And when will it arrive, please?", lead_silence_s=0.0, tail_silence_s=0.0
    )
    gap = np.zeros(4 * RATE, dtype=np.int16)
    samples = np.concatenate(
        [first.samples[: first.end], gap, second.speech, np.zeros(5 * RATE, dtype=np.int16)]
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
