"""Secrets: a whole run's logs, call record, status JSON and /metrics contain none of the secrets it was
given — the provider's API key, the SIP registration password, the webhook's signing secret, the HTTP token.

One `serve` at debug level (the most it ever writes) registers at a challenging SIPp registrar (digest with
the password), takes one SIPp call to the OpenAI Realtime fake whose script calls `lookup_order` on every turn,
POSTs each job to a small signed-webhook application in this process, writes a CDR, and is read over HTTP
with its bearer token (/calls, /calls/{id}, /metrics, /registrations, /healthz). Each secret is checked to
have been used (the registration succeeded, the webhook saw a valid signature, the token was required), so
the test cannot pass by never touching them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import peers
import pytest

SECRETS = {
    "OPENAI_API_KEY": "sk-live-9f3c1d7e2b-never-in-a-log",
    "PARLORA_SIP_PASSWORD": "sip-pw-4e8a2c-never-in-a-log",
    "PARLORA_WEBHOOK_SECRET": "whsec-7b1f9d-never-in-a-log",
    "PARLORA_HTTP_TOKEN": "tok-2c6e0a-never-in-a-log",
}
SCRIPT = {
    "turns": [],
    "then": {"tool_call": {"name": "lookup_order", "arguments": {"order_id": "42"}}, "reply": "echo"},
}
SCENARIOS = Path(__file__).parent / "scenarios"


class _App(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.signed: list[bool] = []  # one per job POST: was its signature right
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    server: _App

    def do_POST(self) -> None:  # http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        stamp = self.headers.get("X-Parlora-Timestamp", "")
        key = SECRETS["PARLORA_WEBHOOK_SECRET"].encode()
        expected = "sha256=" + hmac.new(key, f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
        payload = b"{}"
        if "X-Parlora-Event" not in self.headers:  # a job, not one of the call's events
            with self.server.lock:
                self.server.signed.append(
                    hmac.compare_digest(self.headers.get("X-Parlora-Signature", ""), expected)
                )
            payload = json.dumps({"output": {"order_id": "42", "status": "shipped"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _get(port: int, path: str, token: str | None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # loopback only
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _leaks(text: str) -> list[str]:
    """The names of the secrets whose value (or a recognisable half of it) appears in `text`."""
    return [name for name, value in SECRETS.items() if value in text or value[: len(value) // 2] in text]


@pytest.mark.timeout(90)
def test_a_whole_run_writes_no_api_key_sip_password_webhook_secret_or_token(
    start_fake: Any, start_bridge: Any, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    fake = start_fake("openai-realtime", "--script", str(script))
    app = _App()
    threading.Thread(target=app.serve_forever, daemon=True).start()
    registrar_port = peers.free_udp_port()
    registrar = peers.ManagedProcess(
        ["sipp", "-sf", str(SCENARIOS / "uas_register_auth.xml"), "-i", "127.0.0.1", "-p", str(registrar_port),
         "-m", "1", "-set", "pw", SECRETS["PARLORA_SIP_PASSWORD"], "-nostdin", "-timeout", "60s"],
        cwd=tmp_path, name="sipp-registrar",
    )  # fmt: skip
    http_port = peers.free_udp_port(also_tcp=True)
    cdr = tmp_path / "cdr.jsonl"
    aor = f"sip:1001@127.0.0.1:{registrar_port}"
    speech = peers.make_utterance(
        tmp_path / "speech.wav", "Where is my order number forty two", tail_silence_s=2.5, ulaw=True
    )
    assert speech.ulaw_path is not None  # ulaw=True
    (tmp_path / "caller").mkdir()
    (tmp_path / "caller" / "speech.ul").write_bytes(speech.ulaw_path.read_bytes())  # uac_stream's audio
    try:
        bridge = start_bridge(
            *fake.bridge_args("openai-realtime"),
            "--register", aor,
            "--http", f"127.0.0.1:{http_port}", "--http-token-env", "PARLORA_HTTP_TOKEN",
            "--webhook", f"http://127.0.0.1:{app.server_address[1]}/jobs",
            "--cdr", str(cdr),
            "--log-level", "debug",
            env=dict(SECRETS),
        )  # fmt: skip
        bridge.wait_for(rf"registered {aor} ", timeout=15)  # the password was used, and right
        callers: list[peers.SippResult] = []
        calling = threading.Thread(
            target=lambda: callers.append(
                peers.run_sipp(
                    "uac_stream",
                    bridge.sip_port,
                    workdir=tmp_path / "caller",
                    extra_args=["-d", "7000"],
                    timeout=30,
                )
            ),
            daemon=True,
        )
        calling.start()
        token = SECRETS["PARLORA_HTTP_TOKEN"]
        bridge.wait_for(r"call call-1 job-1 \(lookup_order\) running", timeout=20)
        bodies = {"/calls/call-1": _get(http_port, "/calls/call-1", token)}  # the live call's status
        calling.join(40)
        bridge.wait_for(r"call call-1 ended after", timeout=15)
        assert _get(http_port, "/calls", None)[0] == 401  # the token is needed (and so was given)
        for path in ("/calls", "/metrics", "/registrations", "/healthz"):
            bodies[path] = _get(http_port, path, token)
        assert all(status == 200 for status, _ in bodies.values()), {p: s for p, (s, _) in bodies.items()}
        assert bridge.stop() == 0
    finally:
        registrar.stop(term_timeout=3.0)
        app.shutdown()
    assert app.signed and all(app.signed), app.signed  # the webhook secret signed every job
    assert "dispatched to the application" in bridge.log, bridge.log[-3000:]
    written = {
        "bridge log (stderr)": bridge.log,
        "bridge stdout": bridge.proc.stdout,
        "cdr": cdr.read_text() if cdr.exists() else "",
        "caller's view": callers[0].screen if callers else "",
        **{f"GET {path}": body for path, (_, body) in bodies.items()},
    }
    assert written["cdr"], "no call record was written"
    leaks = {where: _leaks(text) for where, text in written.items() if _leaks(text)}
    assert not leaks, leaks
