r"""`serve --webhook URL`: the application answers tool calls and delegations over HTTP (DESIGN §8, DL4).

For applications not written in Python. Each job the session dispatches (a tool call, or a GPT-Live delegation;
the job ledger in bridge/engine/delegations.py makes sure a job is dispatched once, however often the provider
delivers its call) becomes exactly one HTTP POST to the configured URL. The application's answer becomes the
job's output for the model.

The contract
============

Request — one `POST <URL>` per job, HTTP/1.1, a new connection each time (`Connection: close`).

Body (`Content-Type: application/json`; compact JSON, non-ASCII characters as \u escapes, so the body is ASCII):

    {"job_id": "job-3",                     # the job's id, unique within the call
     "name": "lookup_order",                # the tool (or delegation) the model asked for
     "arguments": {"order_id": "42"},       # the model's arguments: the JSON object parsed from the model's
                                            #   arguments text; when that text is not a JSON object, the raw
                                            #   text as a string
     "kind": "function",                    # "function" (a tool call) or "delegation" (GPT-Live)
     "call": {"call_id": "call-1",          # the bridge's id for the call (unique within one bridge process)
              "from": "\"Alice\" <sip:alice@example.com>",  # the INVITE's From and To as the SIP engine
              "to": "<sip:sales@example.com>",              #   reports them (name-addr: display name if
                                                            #   any, URI in angle brackets; no tag)
              "called": "sales",                # the user part of the Request-URI: the number that was called
              "caller": "alice",                # the caller's number: P-Asserted-Identity's on a trusted trunk,
                                                #   else From's (sip/core/app_headers.py)
              "sip_headers": [["X-Customer-Id", "c-42"]]},  # the allowlisted inbound headers, bounded
     "requested_at_ms": 5120,               # when the model asked, in ms on the call's session timeline (not a
                                            #   wall clock)
     "supersedes": null}                    # the job_id (same call) this job corrects, or null

Headers:

    Content-Type: application/json
    Idempotency-Key: <bridge instance id>/<call_id>/<job_id>     e.g. 5f0c9a2e41d7b3c8/call-1/job-3
    X-Parlora-Timestamp: <unix time in whole seconds when the request was signed>
    X-Parlora-Signature: sha256=<lowercase hex HMAC-SHA256>
    User-Agent: parlora-bridge/<version>

The idempotency key is globally unique: job ids count from job-1 in every call and call ids from call-1 in every
process, so the key starts with a random 64-bit id (16 hex digits) drawn once per bridge process. The bridge
never sends one key twice (see the retry rule); an application that sees a key again (from a proxy in
between) must treat it as the same job.

Signature — HMAC-SHA256, keyed with the shared secret (the UTF-8 bytes of the `PARLORA_WEBHOOK_SECRET`
environment variable), over exactly these bytes:

    <X-Parlora-Timestamp value, ASCII digits> "." <the raw request body bytes>

i.e. `hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()`. The application should
recompute it over the body bytes as received (before parsing), compare with `hmac.compare_digest`, and reject
timestamps far from its own clock (say more than 5 minutes) to make a captured request useless later.

Answer — the application has `--webhook-timeout` seconds (default 10) for the whole exchange, counted from
the first connection attempt to the end of its answer:

* `2xx` with `Content-Type: application/json` (or any `+json` type) and a JSON object body with an `"output"`
  member: the output. A string is given to the model as is; any other JSON value (object, array, number,
  true/false/null) is serialised to JSON text for the model. A JSON answer that is not such an object is an
  error (below).
* `2xx` with any other content type (or none): the body, decoded as UTF-8, is the output as is (an empty body
  gives an empty output).
* Anything else — a `3xx` (redirects are not followed), `4xx` or `5xx` status, no answer within the timeout, a
  connection closed before the answer was complete, an answer larger than 1 MiB — is an error. The model gets
  `{"error": "..."}` saying what happened (never the application's error body), the bridge logs one warning
  line, and the call goes on. To give the model a business error ("no such order"), answer `2xx` with it as the
  output.

Retries — only when the request cannot have reached the application: the TCP connection (DNS resolution
included) or the TLS handshake failed or timed out. Those are tried again, 3 attempts in all, after waits of
0.25 s and 0.75 s (each attempt may take at most 2 s to connect), all within the overall timeout. Once the first
byte of the request has been written, the bridge NEVER sends it again — not after a read timeout, a reset or
close after sending, nor for any HTTP status (a 503 included): the application may have acted on it. The model
is told that the outcome is unknown, and the application reconciles.

Events — the same URL also gets one POST per event of each call, in order, one at a time per
call: `call_started`, each `utterance` (caller or assistant), each `work_uncertain` and `call_ended` with the
call record. They are signed, timed out and retried exactly as jobs; their body has an `"event"` member (a
job's never does) and they carry the header `X-Parlora-Event: <event>`; the Idempotency-Key ends in
`call_started`, `utterance-<seq>`, `work_uncertain-<seq>` or `call_ended`. The answer is only logged (any 2xx
is fine), but for one: an outbound call's AMD verdict (`{"event": "amd", "kind": "verdict", "verdict": "machine",
...}`, key `amd-verdict`) is POSTed the moment it is made, not queued behind the call's other events, and an
answer whose output (as a job's: a text/plain body, or JSON `{"output": ...}`) is `talk`, `message` or `hang_up`
chooses what the call does next (bridge/engine/amd.py); any other answer, or none within `--amd-decide-ms`,
keeps the route's choice (`amd_machine`). The mailbox's `beep` / `no_beep` follow in order. Bodies
(bridge/server/records.py):

    {"event": "call_started", "call": {"call_id", "sip_call_id", "from", "to", "called", "source", "route",
     "provider", "trunk", "attestation": {"verstat", "level", "orig_tn", "dest_tn", "origid", "iat",
     "signed", "verified", "reason"}, "caller", "diverted_from", "identity_trusted",
     "sip_headers": [["X-Customer-Id", "c-42"], ...], "sip_headers_dropped", "sip_headers_cut"},
     "started_at": <unix s>}                # sip_headers, caller: sip/core/app_headers.py
    {"event": "utterance", "call_id": "call-1", "seq": 2, "role": "assistant", "text": "...",
     "start_ms": 5120, "end_ms": 7480,      # session timeline; the assistant's from the carrier ledger
     "heard_ms": 2360,                      # assistant: audio of it transmitted to the caller
     "interrupted": true, "cut": {"at_ms": 7490, "source": "local_vad", "items": [["out-2", 2360]]}}
    {"event": "work_uncertain", "call_id": "call-1", "seq": 1,   # S8: work whose outcome became uncertain
     "cause": "session_ended",              # or "connection_lost" / "connection_closed" (a recovery, a
                                            #   rollover: results and updates it never acknowledged)
     "at_ms": 9120,
     "items": [{"job_id": "job-3", "name": "book_table", "kind": "function",   # an update: job_id null,
                "arguments": {"day": "friday"},   # name and kind "update", its text as "arguments"
                "arguments_truncated": false,     # arguments are cut at 1,000 characters
                "requested_at_ms": 5120,
                "outcome": "cut_off",             # "unknown": sent, never acknowledged (never sent again);
                                                  # "cut_off": still running when the session ended, after a
                                                  #   2 s grace (its POST was abandoned: it may have acted);
                                                  # "not_delivered": answered, never given to the model
                "detail": "cut off: still running when the session ended"}]}
    {"event": "early_media", "call_id": "call-1",    # a call placed: the far end's audio before its answer
     "phase": "ended",                      # "started" (at the 183/180) or "ended"
     "status": 486, "outcome": "486 Busy Here",   # 200 and "answered", or the failure after early media
     "at_ms": 4210, "duration_ms": 3890,    # session timeline; how long it lasted
     "to_provider": false}                  # the route gave it to the model too
    {"event": "call_ended", "call_id": "call-1", "record": {...}}   # the --cdr line's object; its
                                                                    #   "uncertain" lists the same items

The secret comes only from the environment (`PARLORA_WEBHOOK_SECRET`, required with `--webhook`), never from a
command-line value, and is never logged. The URL may be `http://` or `https://`; for https the system's CA
certificates are trusted, or those of `--webhook-ca FILE`. Credentials in the URL (`user:pass@`) are refused.
Log lines name the URL without its query string, which may carry a token.

The client is asyncio streams + h11 (sans-I/O HTTP/1.1, already used by the status endpoint): no new dependency.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from urllib.parse import urlsplit

import h11

from bridge.engine.delegations import JobRequest
from bridge.server.records import (
    AmdResult,
    AppEvent,
    CallStarted,
    EarlyMediaReport,
    UncertainWork,
    Utterance,
    arguments_json,
)
from bridge.server.session import JobHandler
from sip.leg import CallIdentity

log = logging.getLogger("parlora.webhook")

SECRET_ENV = "PARLORA_WEBHOOK_SECRET"
DEFAULT_TIMEOUT_S = 10.0
CONNECT_ATTEMPTS = 3
CONNECT_BACKOFF_S = (0.25, 0.75)  # the waits before the 2nd and the 3rd connection attempt
CONNECT_TIMEOUT_S = 2.0  # one connection attempt (TCP + TLS handshake), at most
MAX_ANSWER_BYTES = 1 << 20

INSTANCE_ID = secrets.token_hex(8)
"""This bridge process's random id: the first part of every Idempotency-Key it sends."""


def _user_agent() -> str:
    try:
        return f"parlora-bridge/{metadata.version('parlora-bridge')}"
    except metadata.PackageNotFoundError:
        return "parlora-bridge"


USER_AGENT = _user_agent()


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Where and how jobs are POSTed. Build it with `from_options`, which validates everything up front."""

    url: str = field(repr=False)  # its query string may carry a token: see `display_url`
    host: str
    port: int
    target: str = field(repr=False)  # path and query, as sent in the request line
    secret: bytes = field(repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)  # https only
    instance_id: str = INSTANCE_ID
    connect_attempts: int = CONNECT_ATTEMPTS
    connect_backoff_s: tuple[float, ...] = CONNECT_BACKOFF_S
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    max_answer_bytes: int = MAX_ANSWER_BYTES

    @classmethod
    def from_options(
        cls,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        ca_file: str | None = None,
        environ: Mapping[str, str] | None = None,
        **overrides: object,
    ) -> WebhookConfig:
        """The configuration for `--webhook URL`; ValueError (never naming the secret) when it is unusable."""
        environ = os.environ if environ is None else environ
        if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
            raise ValueError(
                "--webhook: the URL must be printable ASCII without spaces (percent-encode the path, "
                "punycode the host)"
            )
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"--webhook needs an http:// or https:// URL, got scheme {parts.scheme!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                f"--webhook: credentials in the URL are not supported (requests are signed with {SECRET_ENV})"
            )
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"--webhook: bad port: {exc}") from None
        if not parts.hostname:
            raise ValueError("--webhook: the URL has no host")
        if not timeout_s > 0:
            raise ValueError("--webhook-timeout must be positive")
        context = None
        if parts.scheme == "https":
            try:
                context = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--webhook-ca {ca_file}: {exc}") from None
        elif ca_file is not None:
            raise ValueError("--webhook-ca applies to an https:// webhook URL")
        secret = environ.get(SECRET_ENV, "")
        if not secret:
            raise ValueError(f"--webhook needs the shared secret in the environment variable {SECRET_ENV}")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default_port = 443 if parts.scheme == "https" else 80
        return cls(
            url=url,
            host=parts.hostname,
            port=port or default_port,
            target=target,
            secret=secret.encode("utf-8"),
            timeout_s=float(timeout_s),
            ssl_context=context,
            **overrides,  # type: ignore[arg-type]
        )

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.ssl_context is not None else 80) else f"{host}:{self.port}"

    @property
    def display_url(self) -> str:
        """The URL for log lines: without its query string, which may carry a token."""
        return f"{self.scheme}://{self.host_header}{self.target.split('?', 1)[0]}"


# --- the request: pure functions ---


def request_body(request: JobRequest, identity: CallIdentity) -> bytes:
    """The JSON body for one job (see the module docstring)."""
    body = {
        "job_id": request.job_id,
        "name": request.name,
        "arguments": arguments_json(request.arguments),
        "kind": request.kind,
        "call": {
            "call_id": identity.call_id,
            "from": identity.from_uri,
            "to": identity.to_uri,
            "called": identity.request_user,
            "caller": identity.caller,
            "sip_headers": [[name, value] for name, value in identity.sip_headers],
        },
        "requested_at_ms": request.requested_at_ms,
        "supersedes": request.supersedes,
    }
    return json.dumps(body, separators=(",", ":")).encode(
        "ascii"
    )  # non-ASCII as \u escapes: plain bytes to sign


def idempotency_key(instance_id: str, call_id: str, job_id: str) -> str:
    return f"{instance_id}/{call_id}/{job_id}"


def event_body(event: AppEvent) -> tuple[str, bytes]:
    """An event's name and JSON body (ASCII, as a job's: see the module docstring)."""
    body = event.to_json()
    return str(body["event"]), json.dumps(body, separators=(",", ":")).encode("ascii")


def event_key(event: AppEvent) -> str:
    """The last part of an event's Idempotency-Key: `call_started`, `utterance-<seq>`, `work_uncertain-<seq>`,
    `amd-<kind>` (`amd-verdict`, `amd-beep`, `amd-no_beep`), `early_media-<phase>` (`early_media-started`,
    `early_media-ended`), `call_ended`."""
    if isinstance(event, AmdResult):
        return f"amd-{event.kind}"
    if isinstance(event, EarlyMediaReport):
        return f"early_media-{event.phase}"
    if isinstance(event, Utterance):
        return f"utterance-{event.seq}"
    if isinstance(event, UncertainWork):
        return f"work_uncertain-{event.seq}"
    return "call_started" if isinstance(event, CallStarted) else "call_ended"


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The `X-Parlora-Signature` value: HMAC-SHA256 over `<timestamp>.<body>`."""
    digest = hmac.new(secret, f"{timestamp}.".encode("ascii") + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def error_output(message: str) -> str:
    return json.dumps({"error": message})


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def interpret_answer(status: int, content_type: str, body: bytes) -> tuple[str, str | None]:
    """The model's output for an application answer, and what was wrong with it (None when it was an answer)."""
    if not 200 <= status < 300:
        problem = f"the application answered HTTP {status}"
        return error_output(f"{problem}; the request may or may not have been carried out"), problem
    if not _is_json(content_type):
        return body.decode("utf-8", errors="replace"), None
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if not isinstance(value, dict) or "output" not in value:
        problem = 'the application answered JSON that is not an object with an "output" member'
        return error_output(
            "the application's answer was not understood; the request may or may not have been carried out"
        ), problem
    output = value["output"]
    return (output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)), None


# --- the exchange ---


@dataclass(frozen=True, slots=True)
class WebhookResult:
    """How one job's POST went: the output for the model, and what the log and the tests want to know."""

    output: str
    attempts: int  # connection attempts made
    sent: bool  # the request was (at least partly) written: it was never sent again
    status: int | None = None  # the application's HTTP status
    problem: str | None = None  # None when the application answered 2xx with a usable body
    elapsed_ms: int = 0


class _AnswerTooLarge(Exception):
    pass


class WebhookClient:
    """POSTs jobs to the application. `sleep` and `clock` are seams for the tests (the backoff waits)."""

    def __init__(
        self,
        config: WebhookConfig,
        *,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._sleep = sleep
        self._clock = clock
        self._wall = wall

    async def deliver(self, request: JobRequest, identity: CallIdentity) -> WebhookResult:
        """One job, one POST (connection attempts retried only before anything was sent). Never raises, except
        CancelledError when the call ends while it runs."""
        key = idempotency_key(self.config.instance_id, identity.call_id, request.job_id)
        tag = f"call {identity.call_id} {request.job_id} ({request.name})"
        return await self._post(request_body(request, identity), key, tag)

    async def deliver_event(self, event: AppEvent, call_id: str) -> WebhookResult:
        """One of the call's events, one POST, on the same rules as a job (its answer is only
        logged). Never raises, except CancelledError."""
        name, body = event_body(event)
        key = idempotency_key(self.config.instance_id, call_id, event_key(event))
        return await self._post(body, key, f"call {call_id} event {name}", event=name)

    async def _post(self, body: bytes, key: str, tag: str, *, event: str | None = None) -> WebhookResult:
        cfg = self.config
        started = self._clock()
        deadline = started + cfg.timeout_s

        def result(
            output: str, attempts: int, sent: bool, status: int | None = None, problem: str | None = None
        ) -> WebhookResult:
            return WebhookResult(
                output, attempts, sent, status, problem, int(1000 * (self._clock() - started))
            )

        attempts = 0
        while True:
            attempts += 1
            remaining = deadline - self._clock()
            try:
                async with asyncio.timeout(max(0.0, min(cfg.connect_timeout_s, remaining))):
                    reader, writer = await asyncio.open_connection(
                        cfg.host,
                        cfg.port,
                        ssl=cfg.ssl_context,
                        server_hostname=cfg.host if cfg.ssl_context is not None else None,
                    )
                break
            except (OSError, ssl.SSLError) as exc:  # TimeoutError included: a connect timeout
                reason = _describe(exc)
            backoff = cfg.connect_backoff_s
            wait = backoff[min(attempts, len(backoff)) - 1] if backoff else 0.0
            if attempts >= cfg.connect_attempts or self._clock() + wait >= deadline:
                problem = f"could not connect to {cfg.display_url} after {attempts} attempt(s): {reason}"
                log.warning("%s: webhook failed: %s; the request was not sent", tag, problem)
                return result(
                    error_output("the application could not be reached; the request was not made"),
                    attempts,
                    False,
                    problem=problem,
                )
            log.info(
                "%s: webhook connection attempt %d failed (%s); trying again in %.2f s",
                tag,
                attempts,
                reason,
                wait,
            )
            await self._sleep(wait)

        # From here on the request may reach the application: whatever happens, it is never sent again.
        timestamp = int(self._wall())
        headers = [
            ("Host", cfg.host_header),
            ("User-Agent", USER_AGENT),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Accept", "application/json, text/plain;q=0.9, */*;q=0.1"),
            ("Idempotency-Key", key),
            ("X-Parlora-Timestamp", str(timestamp)),
            ("X-Parlora-Signature", signature(cfg.secret, timestamp, body)),
            ("Connection", "close"),
        ]
        if event is not None:
            headers.insert(-1, ("X-Parlora-Event", event))
        try:
            async with asyncio.timeout(max(0.0, deadline - self._clock())):
                status, content_type, answer = await _exchange(reader, writer, cfg, headers, body)
        except TimeoutError:
            problem = f"no complete answer within {cfg.timeout_s:g} s"
            log.warning("%s: webhook failed: %s; not retried (the application may have acted)", tag, problem)
            return result(
                error_output(
                    f"the application did not answer within {cfg.timeout_s:g} s; the request may "
                    "or may not have been carried out"
                ),
                attempts,
                True,
                problem=problem,
            )
        except _AnswerTooLarge:
            problem = f"answer larger than {cfg.max_answer_bytes} bytes"
            log.warning("%s: webhook failed: %s; not retried", tag, problem)
            return result(
                error_output(
                    "the application's answer was too large; the request may or may not have been carried out"
                ),
                attempts,
                True,
                problem=problem,
            )
        except (OSError, ssl.SSLError, h11.ProtocolError) as exc:
            problem = f"the connection failed after the request was sent: {_describe(exc)}"
            log.warning("%s: webhook failed: %s; not retried (the application may have acted)", tag, problem)
            return result(
                error_output(
                    "the connection to the application failed after the request was sent; the "
                    "request may or may not have been carried out"
                ),
                attempts,
                True,
                problem=problem,
            )
        finally:
            writer.close()
        if event is None:
            output, wrong = interpret_answer(status, content_type, answer)
        elif 200 <= status < 300:  # an event's answer is only logged (any 2xx will do); its output is read
            wrong = None  # as a job's, for the one event whose answer chooses: an AMD verdict's
            output = interpret_answer(status, content_type, answer)[0]
        else:
            output, wrong = "", f"the application answered HTTP {status}"
        if wrong is None:
            log.info(
                "%s: webhook answered %d in %d ms (%d bytes)",
                tag,
                status,
                int(1000 * (self._clock() - started)),
                len(answer),
            )
        else:
            log.warning("%s: webhook failed: %s; not retried", tag, wrong)
        return result(output, attempts, True, status, wrong)


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    cfg: WebhookConfig,
    headers: list[tuple[str, str]],
    body: bytes,
) -> tuple[int, str, bytes]:
    """Send the request, read the answer: (status, content type, body)."""
    conn = h11.Connection(h11.CLIENT)
    writer.write(conn.send(h11.Request(method="POST", target=cfg.target, headers=headers)))
    writer.write(conn.send(h11.Data(data=body)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()
    status: int | None = None
    content_type = ""
    chunks: list[bytes] = []
    size = 0
    eof = False
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            if eof:  # h11's words for this are about its own states
                raise ConnectionResetError(
                    "the connection was closed before the answer was complete"
                ) from None
            raise
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            eof = not data
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            content_type = next((v.decode("latin-1") for k, v in event.headers if k == b"content-type"), "")
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > cfg.max_answer_bytes:
                raise _AnswerTooLarge
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            assert status is not None
            return status, content_type, b"".join(chunks)
        elif isinstance(event, h11.ConnectionClosed):
            raise ConnectionResetError("the connection was closed before the answer was complete")
        # h11.InformationalResponse (1xx): keep reading


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- what cli.py wires into each CallSession ---


def webhook_handler(
    config: WebhookConfig, identity: CallIdentity, *, client: WebhookClient | None = None
) -> JobHandler:
    """The job handler for one call: each job it is given is POSTed once to the application."""
    client = client or WebhookClient(config)

    async def handle(request: JobRequest) -> str:
        return (await client.deliver(request, identity)).output

    return handle
