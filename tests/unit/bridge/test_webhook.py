"""DL4: the HTTP webhook client against a small application server run by the test on 127.0.0.1.

The server parses requests with h11 and answers as each test tells it; it counts connections and requests, so
"never sent twice" is counted, not presumed. Connection-level retries are driven through the client's `sleep`
seam: the test's sleep does not wait, it records the backoff and may make the port start listening.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from bridge.engine.delegations import JobRequest
from bridge.server.webhook import (
    INSTANCE_ID,
    SECRET_ENV,
    WebhookClient,
    WebhookConfig,
    interpret_answer,
    request_body,
    webhook_handler,
)
from sip.leg import CallIdentity
from tests.support.webhook import ENV, SECRET, Answer, App, Received, json_answer

IDENTITY = CallIdentity(
    call_id="call-7",
    sip_call_id="abc@127.0.0.1",
    from_uri="sip:alice@127.0.0.1",
    to_uri="sip:sales@127.0.0.1",
    request_user="sales",
    source="127.0.0.1:5070",
)
JOB = JobRequest("job-3", "lookup_order", '{"order_id": "42", "rush": true}', "function", 5120)


def raw_answer(
    status: int, content_type: str | None, payload: bytes
) -> Callable[[Received], Awaitable[Answer]]:
    async def answer(_: Received) -> Answer:
        return status, [("content-type", content_type)] if content_type else [], payload

    return answer


def config(port: int, path: str = "/jobs?token=abc", **overrides: object) -> WebhookConfig:
    timeout_s = overrides.pop("timeout_s", 5.0)
    return WebhookConfig.from_options(
        f"http://127.0.0.1:{port}{path}", timeout_s=timeout_s, environ=ENV, **overrides
    )


@pytest.fixture
async def apps():
    started: list[App] = []

    def make(answer: Callable[[Received], Awaitable[Answer | None]]) -> App:
        app = App(answer)
        started.append(app)
        return app

    yield make
    for app in started:
        await app.close()


@pytest.fixture(autouse=True)
def _no_secret_in_logs(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    yield
    assert SECRET not in caplog.text
    assert "token=abc" not in caplog.text  # the URL's query string may carry a token: never logged


class Sleeps:
    """The backoff seam: records each wait (and does not wait); `on_first` runs at the first one."""

    def __init__(self, on_first: Callable[[], Awaitable[None]] | None = None) -> None:
        self.waits: list[float] = []
        self._on_first = on_first

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if len(self.waits) == 1 and self._on_first is not None:
            await self._on_first()


def bound_not_listening() -> socket.socket:
    """A TCP port on 127.0.0.1 that refuses connections until `listen()` is called on it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


# --- the request ---


async def test_dl4_signature_idempotency_key_headers_and_body(apps) -> None:
    app = apps(json_answer({"output": "order 42 shipped"}))
    port = await app.start()
    client = WebhookClient(config(port), wall=lambda: 1_700_000_000.7)
    result = await client.deliver(JOB, IDENTITY)
    assert result.output == "order 42 shipped" and result.problem is None and result.status == 200
    assert (result.attempts, result.sent, app.connections, len(app.requests)) == (1, True, 1, 1)
    got = app.requests[0]
    assert got.method == "POST" and got.target == "/jobs?token=abc"
    headers = got.headers
    assert headers["content-type"] == "application/json"
    assert headers["idempotency-key"] == f"{INSTANCE_ID}/call-7/job-3"
    assert len(INSTANCE_ID) == 16 and int(INSTANCE_ID, 16) >= 0
    assert headers["user-agent"].startswith("parlora-bridge")
    assert headers["host"] == f"127.0.0.1:{port}"
    assert headers["x-parlora-timestamp"] == "1700000000"
    # The application's check: HMAC-SHA256 over "<timestamp>.<raw body>" with the shared secret.
    expected = hmac.new(SECRET.encode(), b"1700000000." + got.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["x-parlora-signature"], f"sha256={expected}")
    wrong = hmac.new(b"another secret", b"1700000000." + got.body, hashlib.sha256).hexdigest()
    assert headers["x-parlora-signature"] != f"sha256={wrong}"
    assert json.loads(got.body) == {
        "job_id": "job-3",
        "name": "lookup_order",
        "arguments": {"order_id": "42", "rush": True},
        "kind": "function",
        "call": {
            "call_id": "call-7",
            "from": "sip:alice@127.0.0.1",
            "to": "sip:sales@127.0.0.1",
            "called": "sales",
            "caller": "",  # an identity built by hand: no INVITE, so no caller number and no headers
            "sip_headers": [],
        },
        "requested_at_ms": 5120,
        "supersedes": None,
    }


def test_arguments_that_are_not_a_json_object_are_sent_as_the_raw_text() -> None:
    for raw in ('{"order_id": 4', "[1, 2]", ""):
        job = JobRequest("job-1", "f", raw, "delegation", 10, supersedes="job-0")
        body = json.loads(request_body(job, IDENTITY))
        assert body["arguments"] == raw and body["kind"] == "delegation" and body["supersedes"] == "job-0"


# --- the answer ---


@pytest.mark.parametrize(
    ("answer", "output"),
    [
        (json_answer({"output": "plain string"}), "plain string"),
        (
            json_answer({"output": {"status": "shipped", "eta_days": 2}}),
            '{"status": "shipped", "eta_days": 2}',
        ),
        (json_answer({"output": 42}), "42"),
        (json_answer({"output": None}), "null"),
        (
            raw_answer(200, "text/plain; charset=utf-8", "Order 42 shipped — ça va".encode()),
            "Order 42 shipped — ça va",
        ),
        (raw_answer(201, None, b"created"), "created"),
        (raw_answer(200, "application/problem+json", b'{"output": "via +json"}'), "via +json"),
        (raw_answer(204, None, b""), ""),
    ],
)
async def test_a_2xx_answer_is_the_output(apps, answer, output) -> None:
    app = apps(answer)
    result = await WebhookClient(config(await app.start())).deliver(JOB, IDENTITY)
    assert result.output == output and result.problem is None and len(app.requests) == 1


@pytest.mark.parametrize("payload", [b'{"result": "x"}', b"[1, 2]", b"not json"])
async def test_a_json_answer_without_output_is_an_error_for_the_model(apps, payload) -> None:
    app = apps(raw_answer(200, "application/json", payload))
    result = await WebhookClient(config(await app.start())).deliver(JOB, IDENTITY)
    assert "error" in json.loads(result.output) and result.problem is not None and len(app.requests) == 1


@pytest.mark.parametrize("status", [500, 503, 404, 302])
async def test_dl4_an_error_status_is_an_error_output_and_never_retried(apps, status, caplog) -> None:
    app = apps(json_answer({"error": "internal stack trace"}, status=status))
    sleeps = Sleeps()
    result = await WebhookClient(config(await app.start()), sleep=sleeps).deliver(JOB, IDENTITY)
    error = json.loads(result.output)["error"]
    assert f"HTTP {status}" in error and "stack trace" not in error
    assert (result.status, result.attempts, result.sent) == (status, 1, True)
    assert (app.connections, len(app.requests), sleeps.waits) == (1, 1, [])
    assert f"HTTP {status}" in caplog.text  # one log line says what happened


async def test_dl4_a_read_timeout_is_an_error_output_and_the_request_is_not_sent_again(apps) -> None:
    release = asyncio.Event()

    async def never(_: Received) -> Answer:
        await release.wait()  # the application is still working when the bridge gives up
        return 200, [], b"too late"

    app = apps(never)
    sleeps = Sleeps()
    try:
        result = await WebhookClient(config(await app.start(), timeout_s=0.3), sleep=sleeps).deliver(
            JOB, IDENTITY
        )
    finally:
        release.set()
    error = json.loads(result.output)["error"]
    assert "did not answer within 0.3 s" in error and "may or may not" in error
    assert (result.attempts, result.sent, result.status) == (1, True, None)
    assert (app.connections, len(app.requests), sleeps.waits) == (1, 1, [])


async def test_a_reset_after_the_request_was_sent_is_not_retried(apps) -> None:
    async def reset(_: Received) -> None:
        return None

    app = apps(reset)
    sleeps = Sleeps()
    result = await WebhookClient(config(await app.start()), sleep=sleeps).deliver(JOB, IDENTITY)
    assert "failed after the request was sent" in json.loads(result.output)["error"]
    assert (result.attempts, result.sent, app.connections, len(app.requests), sleeps.waits) == (
        1,
        True,
        1,
        1,
        [],
    )


async def test_dl4_connection_refused_is_retried_until_the_application_listens(apps) -> None:
    sock = bound_not_listening()
    port = sock.getsockname()[1]
    app = apps(json_answer({"output": "ok after a retry"}))

    async def start_listening() -> None:  # after the first attempt was refused
        sock.listen()
        await app.start(sock=sock)

    sleeps = Sleeps(on_first=start_listening)
    result = await WebhookClient(config(port), sleep=sleeps).deliver(JOB, IDENTITY)
    assert result.output == "ok after a retry" and result.problem is None
    assert (result.attempts, sleeps.waits, app.connections, len(app.requests)) == (2, [0.25], 1, 1)


async def test_connection_attempts_are_bounded(caplog) -> None:
    sock = bound_not_listening()  # refuses every attempt
    try:
        sleeps = Sleeps()
        result = await WebhookClient(config(sock.getsockname()[1]), sleep=sleeps).deliver(JOB, IDENTITY)
    finally:
        sock.close()
    assert json.loads(result.output) == {
        "error": "the application could not be reached; the request was not made"
    }
    assert (result.attempts, result.sent, sleeps.waits) == (3, False, [0.25, 0.75])
    assert "after 3 attempt(s)" in caplog.text and "ConnectionRefusedError" in caplog.text


async def test_connection_attempts_stop_at_the_deadline() -> None:
    sock = bound_not_listening()
    try:
        sleeps = Sleeps()
        # The first wait (0.25 s) would end after the 0.2 s deadline: no second attempt.
        result = await WebhookClient(config(sock.getsockname()[1], timeout_s=0.2), sleep=sleeps).deliver(
            JOB, IDENTITY
        )
    finally:
        sock.close()
    assert (result.attempts, result.sent, sleeps.waits) == (1, False, [])


async def test_an_interim_1xx_and_a_body_delimited_by_close_are_read() -> None:
    seen: list[bytes] = []

    async def raw(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        seen.append(head + await reader.readexactly(length))
        writer.write(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(raw, "127.0.0.1", 0)
    try:
        result = await WebhookClient(config(server.sockets[0].getsockname()[1])).deliver(JOB, IDENTITY)
    finally:
        server.close()
        await server.wait_closed()
    assert result.output == "until close" and result.status == 200 and len(seen) == 1
    assert seen[0].startswith(b"POST /jobs?token=abc HTTP/1.1\r\n")


async def test_an_oversized_answer_is_an_error(apps) -> None:
    app = apps(raw_answer(200, "text/plain", b"x" * 2048))
    result = await WebhookClient(config(await app.start(), max_answer_bytes=1024)).deliver(JOB, IDENTITY)
    assert "too large" in json.loads(result.output)["error"] and len(app.requests) == 1


async def test_https_with_a_private_ca(apps, tmp_path: Path) -> None:
    from providers.fakes.gemini_live import ensure_cert

    cert, key, _ = ensure_cert(None, None, str(tmp_path))
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    app = apps(json_answer({"output": "over tls"}))
    port = await app.start(ssl_context=server_context)
    cfg = WebhookConfig.from_options(f"https://localhost:{port}/hook", ca_file=cert, environ=ENV)
    assert cfg.display_url == f"https://localhost:{port}/hook"
    result = await WebhookClient(cfg).deliver(JOB, IDENTITY)
    assert result.output == "over tls" and app.requests[0].headers["host"] == f"localhost:{port}"
    # Without the CA, the handshake fails before anything is sent: retried (bounded), then an error.
    untrusted = WebhookConfig.from_options(f"https://localhost:{port}/hook", environ=ENV)
    sleeps = Sleeps()
    result = await WebhookClient(untrusted, sleep=sleeps).deliver(JOB, IDENTITY)
    assert (result.attempts, result.sent, len(app.requests)) == (3, False, 1)


async def test_the_per_call_handler_returns_the_output(apps) -> None:
    app = apps(json_answer({"output": {"found": True}}))
    handler = webhook_handler(config(await app.start()), IDENTITY)
    assert await handler(JOB) == '{"found": true}'
    assert json.loads(app.requests[0].body)["call"]["call_id"] == "call-7"


# --- configuration ---


def test_configuration_is_validated_and_keeps_the_secret_out_of_sight() -> None:
    cfg = WebhookConfig.from_options("https://app.example:8443/hook?key=k", environ=ENV)
    assert (cfg.host, cfg.port, cfg.target, cfg.timeout_s) == ("app.example", 8443, "/hook?key=k", 10.0)
    assert cfg.display_url == "https://app.example:8443/hook"
    assert SECRET not in repr(cfg) and cfg.secret == SECRET.encode()
    assert WebhookConfig.from_options("http://[::1]/", environ=ENV).host_header == "[::1]"
    bad = [
        ("http://127.0.0.1/", {}, {}, SECRET_ENV),  # no secret in the environment
        ("http://127.0.0.1/", {SECRET_ENV: ""}, {}, SECRET_ENV),
        ("ftp://127.0.0.1/", ENV, {}, "http"),
        ("http://user:pw@127.0.0.1/", ENV, {}, "credentials"),
        ("http:///path", ENV, {}, "no host"),
        ("http://127.0.0.1:99999/", ENV, {}, "port"),
        ("http://127.0.0.1/caf\u00e9", ENV, {}, "ASCII"),
        ("http://127.0.0.1/a b", ENV, {}, "ASCII"),
        ("http://127.0.0.1/", ENV, {"ca_file": "/nonexistent"}, "https"),
        ("https://127.0.0.1/", ENV, {"ca_file": "/nonexistent"}, "--webhook-ca"),
        ("http://127.0.0.1/", ENV, {"timeout_s": 0}, "positive"),
    ]
    for url, environ, kwargs, words in bad:
        with pytest.raises(ValueError, match=words):
            WebhookConfig.from_options(url, environ=environ, **kwargs)


def test_interpret_answer_never_passes_an_error_body_to_the_model() -> None:
    output, problem = interpret_answer(422, "application/json", b'{"output": "looks fine"}')
    assert problem == "the application answered HTTP 422" and "looks fine" not in output


def test_serve_refuses_a_webhook_without_its_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from bridge.cli.commands import main

    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    runner = CliRunner()
    result = runner.invoke(main, ["serve", "--webhook", "http://127.0.0.1:9/jobs"])
    assert result.exit_code == 2 and SECRET_ENV in result.output
    ca = tmp_path / "ca.pem"
    ca.write_text("not used")
    result = runner.invoke(main, ["serve", "--webhook-ca", str(ca)])
    assert result.exit_code == 2 and "--webhook-ca applies to --webhook" in result.output
    result = runner.invoke(
        main,
        ["serve", "--webhook", "http://127.0.0.1:9/jobs", "--webhook-ca", str(ca)],
        env={SECRET_ENV: SECRET},
    )
    assert result.exit_code == 2 and "https" in result.output and SECRET not in result.output
    assert SECRET_ENV in runner.invoke(main, ["serve", "--help"]).output


# The call's events.


async def test_events_are_posted_signed_with_their_name_and_a_key_per_event(apps) -> None:
    from bridge.server.records import (
        CallEnded,
        CallInfo,
        CallRecord,
        CallStarted,
        Cut,
        UsageRecord,
        Utterance,
    )

    app = apps(json_answer({"ok": True}))
    port = await app.start()
    client = WebhookClient(config(port), wall=lambda: 1_700_000_000.0)
    info = CallInfo(
        "call-7", "abc@127.0.0.1", "sip:alice@127.0.0.1", "sip:sales@127.0.0.1", "sales", "x", None, "echo"
    )
    cut = Cut(7490, "local_vad", (("out-2", 2360),))
    record = CallRecord(
        info,
        1.0,
        9.5,
        "caller",
        "200 OK",
        200,
        ("conn-1",),
        (),
        (),
        {},
        UsageRecord(1.0, 0, 0, True),
        1,
        2,
        3,
        1,
    )
    events = [
        CallStarted(info, 1.0),
        Utterance("call-7", 2, "assistant", "It shipped", 5120, 7480, 2360, cut),
        CallEnded(record),
    ]
    results = [await client.deliver_event(event, "call-7") for event in events]
    assert all(r.status == 200 and r.problem is None and r.attempts == 1 for r in results)
    assert [r.headers["x-parlora-event"] for r in app.requests] == ["call_started", "utterance", "call_ended"]
    keys = [r.headers["idempotency-key"] for r in app.requests]
    assert keys == [f"{INSTANCE_ID}/call-7/{k}" for k in ("call_started", "utterance-2", "call_ended")]
    for got in app.requests:
        expected = hmac.new(SECRET.encode(), b"1700000000." + got.body, hashlib.sha256).hexdigest()
        assert got.headers["x-parlora-signature"] == f"sha256={expected}"
    bodies = [json.loads(r.body) for r in app.requests]
    assert bodies[0]["call"]["called"] == "sales" and "job_id" not in bodies[0]
    assert bodies[1]["cut"] == {"at_ms": 7490, "source": "local_vad", "items": [["out-2", 2360]]}
    assert bodies[1]["interrupted"] is True and bodies[1]["heard_ms"] == 2360
    assert bodies[2]["record"]["usage"]["complete"] is True and bodies[2]["record"]["sip_status"] == 200
