"""`serve --http HOST:PORT`: the calls' status as JSON (`GET /calls`, `GET /calls/{id}`) and the console.

h11 parses and frames HTTP/1.1 (sans-I/O, as this project's cores are); asyncio streams move the bytes. With
`ConsoleHooks` (bridge/server/console.py) it also serves the console page at `/`, its live feed `GET /events`
(Server-Sent Events), `POST /calls/{id}/hangup` and the browser channel's `POST /talk` (offer SDP in, answer
out) with `GET /talk` (the page's RTCConfiguration: the STUN servers, behind the token as every console read).
`POST /drain` starts the graceful drain (bridge/server/drain.py), as SIGTERM does; `POST /calls` places a call.

The control plane and the browser (DESIGN §15). The listener is usually on loopback without a token, where
any web page the operator opens could otherwise reach it: a cross-site `fetch()` or form post is sent by the
browser even though the page cannot read the answer, and one `POST /calls` is a call to a premium number
through the trunk with its password. So, token or not:

- Every state-changing route (`POST /calls`, `POST /drain`, `POST /calls/{id}/hangup`, `POST /talk`,
  `POST /session`; no other method than GET and HEAD is served) refuses a browser context with 403: an
  `Origin` that is not this server's own (scheme aside, its host and port must be the `Host` header's;
  `Origin: null` is foreign), or `Sec-Fetch-Site` other than `same-origin` or `none`. `same-site` is refused
  too: a page on another port of the same host (127.0.0.1:9999 against 127.0.0.1:8080) is same-site, and
  that is exactly the neighbour to keep out (cookies are not port-bound either). `X-Forwarded-Host` is not
  trusted: a reverse proxy must pass the browser's `Host` on.
- A route that reads a body (`POST /calls`, `/talk`, `/session`) takes only `Content-Type: application/json`;
  a body-less one (`/drain`, hang-up) takes `Content-Type: application/json` or an `Authorization` header.
  Either is a header a cross-site page cannot send without a CORS preflight, which this server never grants
  (OPTIONS answers 405; no `Access-Control-*` header is ever sent). Otherwise 415: a form post
  (`text/plain`, `application/x-www-form-urlencoded`, `multipart/form-data`) or a bare `no-cors` POST.
- Without a token, a browser request (one carrying `Origin` or `Sec-Fetch-Site`) must name a loopback host
  (`localhost`, 127.0.0.0/8, ::1) or the listener's own address in `Host`, else 403: DNS rebinding makes an
  attacker's name resolve to 127.0.0.1 and its page same-origin with us.
- Reads (`GET /calls`, `/events`, `/sip`, ...) are not refused for being cross-site: a cross-origin page can
  make the browser send them but not read the answer (no CORS header), and every answer says
  `Cross-Origin-Resource-Policy: same-origin` and `X-Content-Type-Options: nosniff`, so it cannot be pulled
  in as a script or image either.

Each refusal is one log line (method, path without its query, the Origin cut to 80 characters) and a count in
`parlora_http_refused_total{reason}` (`foreign_origin`, `cross_site_fetch`, `content_type`, `foreign_host`,
`token_in_url`).

The token (`--http-token-env`) travels in a header, never in a URL, where logs, history and the Referer keep
it: `Authorization: Bearer TOKEN`, or, for the console page (an EventSource cannot set headers), a cookie the
page gets from `POST /session {"token": ...}`: `HttpOnly; SameSite=Strict`, holding an HMAC of the token
rather than the token. A request whose query string has a `token` parameter gets 400 saying where to put it,
and neither its query nor the token is logged. With a token, every route but the page's static files needs
it; without one the listener is meant for loopback only (bridge/cli/commands.py refuses otherwise).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import h11
from prometheus_client import CollectorRegistry, Counter

from bridge.engine.calling_hours import OutsideCallingHours
from bridge.server.console import ConsoleHooks, static_file
from bridge.server.dial_queue import DialRefused
from bridge.server.dial_series import DoNotCall
from bridge.server.idempotency import Dialled, KeyReused, check_key

ExtraAnswer = tuple[int, bytes, str]  # GET /metrics, /healthz, /readyz: status, body, content type

log = logging.getLogger("parlora.http")

_MAX_REQUEST_BYTES = 16 * 1024
_READ_TIMEOUT_S = 10.0
_MAX_BODY_BYTES = 64 * 1024  # an SDP offer is a few kB
_SSE_KEEPALIVE_S = 15.0
_LOG_CHARS = 80  # of an Origin or a path in a refusal's log line

StatusSource = Callable[[], Mapping[str, Callable[[], dict[str, Any]]]]

SESSION_COOKIE = "parlora_console"
_SESSION_LABEL = b"parlora-bridge console session"
TOKEN_IN_URL = (
    "the token is never taken from the URL (logs and browser history keep URLs): send it as "
    "'Authorization: Bearer TOKEN', or sign in on the console page (POST /session)"
)
# Sent with every answer: no page of another origin may embed or sniff what this server says.
_ISOLATION = [("cross-origin-resource-policy", "same-origin"), ("x-content-type-options", "nosniff")]

RefusalReason = Literal["foreign_origin", "cross_site_fetch", "content_type", "foreign_host", "token_in_url"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the control plane will not act on: its status, metric label and the error it is told."""

    status: int
    reason: RefusalReason
    error: str


def _headers(request: h11.Request, name: bytes) -> list[str]:
    return [value.decode("latin-1") for key, value in request.headers if key == name]


def _header(request: h11.Request, name: bytes) -> str | None:
    values = _headers(request, name)
    return values[0] if values else None


def _authority(value: str, scheme: str) -> str:
    """host[:port], lower-case, without the scheme's default port."""
    value = value.strip().lower()
    default = ":443" if scheme == "https" else ":80"
    return value[: -len(default)] if value.endswith(default) else value


def own_origin(origin: str, host: str | None) -> bool:
    """Whether a browser's `Origin` is this server's: its host and port are the `Host` header's ("null", any
    other scheme than http(s), or a path, are not)."""
    parts = urlsplit(origin.strip())
    if host is None or parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
        return False
    return _authority(parts.netloc, parts.scheme) == _authority(host, parts.scheme)


def browser_refusal(request: h11.Request, *, takes_body: bool) -> Refusal | None:
    """Why a state-changing request may have been sent by a page of another origin, or None (the rules are
    the module's docstring's)."""
    host = _header(request, b"host")
    for origin in _headers(request, b"origin"):
        if not own_origin(origin, host):
            return Refusal(403, "foreign_origin", "refused: a request from a page of another origin")
    for site in _headers(request, b"sec-fetch-site"):
        if site.strip().lower() not in ("same-origin", "none"):
            return Refusal(403, "cross_site_fetch", "refused: a request from a page of another origin")
    media = (_header(request, b"content-type") or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and (takes_body or _header(request, b"authorization") is None):
        wanted = "Content-Type: application/json" + ("" if takes_body else " (or an Authorization header)")
        return Refusal(415, "content_type", f"refused: send {wanted}")
    return None


def loopback_host(host: str | None, bound: str | None = None) -> bool:
    """Whether a `Host` header names this machine's loopback (localhost, 127.0.0.0/8, ::1) or `bound`, the
    listener's own specific address."""
    name = (host or "").strip().lower()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if not name:
        return False
    if name == "localhost" or name.endswith(".localhost"):
        return True
    if bound and bound.strip("[]").lower() == name and name not in ("0.0.0.0", "::"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _token_in_url(request: h11.Request) -> bool:
    query = urlsplit(request.target.decode("ascii", "replace")).query
    return "token" in parse_qs(query, keep_blank_values=True)


def _cookie(request: h11.Request, name: str) -> str | None:
    for header in _headers(request, b"cookie"):
        for pair in header.split(";"):
            key, _, value = pair.strip().partition("=")
            if key == name:
                return value.strip()
    return None


def route(
    path: str,
    calls: Mapping[str, Callable[[], dict[str, Any]]],
    sip: Callable[[], dict[str, Any]] | None = None,
) -> tuple[int, Any]:
    """The status code and JSON body for a GET of `path`."""
    path = path.split("?", 1)[0].rstrip("/") or "/"
    if path == "/sip" and sip is not None:  # listener, inbound policy and its refusal counters
        return 200, sip()
    if path == "/registrations" and sip is not None:  # state, expiry and last error of each binding
        return 200, {"registrations": sip().get("registrations", [])}
    if path == "/calls":
        return 200, {"calls": [status() for status in calls.values()]}
    if path.startswith("/calls/"):
        status = calls.get(path[len("/calls/") :])
        if status is not None:
            return 200, status()
        return 404, {"error": "no such call"}
    return 404, {"error": "not found", "paths": ["/calls", "/calls/{id}"]}


def _path(request: h11.Request) -> str:
    return urlsplit(request.target.decode("ascii", "replace")).path.rstrip("/") or "/"


class StatusServer:
    """A small HTTP/1.1 server answering from `source()`: call id -> status function."""

    def __init__(
        self,
        source: StatusSource,
        *,
        console: ConsoleHooks | None = None,
        token: str | None = None,
        sip: Callable[[], dict[str, Any]] | None = None,
        dial: Callable[..., Awaitable[str | Dialled]] | None = None,
        extra: Callable[[str], ExtraAnswer | Awaitable[ExtraAnswer] | None] | None = None,
        drain: Callable[[], dict[str, Any]] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._source = source
        self._sip = sip  # GET /sip
        # POST /calls {"to", "from", "trunk", "route", "headers"}: (to, from, trunk, route, key=, headers=)
        self._dial = dial
        self._extra = extra  # GET /metrics, /healthz, /readyz (bridge/server/observe.py): path -> answer
        self._drain = drain  # POST /drain (bridge/server/drain.py http_drain)
        self._console = console
        self._token = token
        self._server: asyncio.Server | None = None
        self._host: str | None = None
        self.port = 0
        self.refused: dict[str, int] = {}  # reason -> count, as the metric says
        self._refused_metric = Counter(
            "parlora_http_refused",
            "HTTP requests the control plane refused: browser contexts, non-JSON bodies, tokens in URLs.",
            ["reason"],
            registry=registry if registry is not None else CollectorRegistry(),
        )

    async def start(self, host: str, port: int) -> StatusServer:
        self._host = host
        self._server = await asyncio.start_server(self._client, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def addresses(self) -> tuple[str, ...]:
        """The addresses the listener's sockets are bound to (a name like `localhost` may give two)."""
        if self._server is None:
            return ()
        return tuple(str(sock.getsockname()[0]) for sock in self._server.sockets)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_REQUEST_BYTES)
        try:
            async with asyncio.timeout(_READ_TIMEOUT_S) as deadline:
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(4096)
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        request = event
                        body = bytearray()
                        while not isinstance(event := conn.next_event(), h11.EndOfMessage):
                            if event is h11.NEED_DATA:
                                conn.receive_data(await reader.read(4096))
                            elif isinstance(event, h11.Data):
                                body += event.data
                                if len(body) > _MAX_BODY_BYTES:
                                    await self._send(conn, writer, 413, {"error": "request body too large"})
                                    return
                            elif isinstance(event, h11.ConnectionClosed):
                                return
                        deadline.reschedule(None)  # read in full; an event stream lasts as long as the page
                        if (refusal := self._gate(request)) is not None:
                            await self._refuse(conn, writer, request, refusal)
                            break
                        if self._console is not None and await self._console_answer(
                            conn, writer, request, bytes(body)
                        ):
                            break
                        if (
                            request.method == b"POST"
                            and self._drain is not None
                            and _path(request) == "/drain"
                        ):
                            await self._start_drain(conn, writer, request)
                            break
                        if (
                            self._dial is not None
                            and request.method == b"POST"
                            and urlsplit(request.target.decode("ascii", "replace")).path == "/calls"
                        ):
                            await self._place_call(conn, writer, request, bytes(body))
                            break
                        await self._answer(conn, writer, request)
                        break
                    if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)) or event is h11.PAUSED:
                        break
        except h11.RemoteProtocolError as exc:
            await self._send(conn, writer, exc.error_status_hint, {"error": str(exc)})
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request) -> None:
        if request.method not in (b"GET", b"HEAD"):
            await self._send(conn, writer, 405, {"error": "only GET"})
            return
        if self._extra is not None and (extra := self._extra(request.target.decode("ascii", "replace"))):
            if not isinstance(extra, tuple):  # /metrics renders in pieces, the loop let through between them
                extra = await extra
            await self._send(conn, writer, extra[0], extra[1], content_type=extra[2])  # /metrics and probes
            return
        status, body = route(request.target.decode("ascii", "replace"), self._source(), self._sip)
        await self._send(conn, writer, status, body)

    def _gate(self, request: h11.Request) -> Refusal | None:
        """What every request passes first: no token in its URL; and, without a token, a browser's request
        names a loopback host (DNS rebinding)."""
        if _token_in_url(request):
            return Refusal(400, "token_in_url", TOKEN_IN_URL)
        browser = _header(request, b"origin") is not None or _header(request, b"sec-fetch-site") is not None
        if self._token is None and browser and not loopback_host(_header(request, b"host"), self._host):
            return Refusal(
                403,
                "foreign_host",
                "refused: without a token this listener answers browsers only at a loopback address "
                "(http://127.0.0.1:PORT/); give it a token (--http-token-env) to use another name",
            )
        return None

    async def _control(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, *, takes_body: bool
    ) -> bool:
        """A state-changing route's checks: the token, then no browser context; False once refused."""
        if not self._authorised(request):
            await self._send(conn, writer, 401, {"error": "missing or wrong bearer token"})
            return False
        if (refusal := browser_refusal(request, takes_body=takes_body)) is not None:
            await self._refuse(conn, writer, request, refusal)
            return False
        return True

    async def _refuse(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, refusal: Refusal
    ) -> None:
        """One log line (never the query string: it may hold a token) and one count per refused request."""
        self.refused[refusal.reason] = self.refused.get(refusal.reason, 0) + 1
        self._refused_metric.labels(reason=refusal.reason).inc()
        origin = _header(request, b"origin")
        log.warning(
            "http: refused %s %s (%s), origin %s, fetch site %s",
            request.method.decode("ascii", "replace")[:10],
            repr(_path(request)[:_LOG_CHARS]),
            refusal.reason,
            "none" if origin is None else repr(origin[:_LOG_CHARS]),
            repr((_header(request, b"sec-fetch-site") or "none")[:20]),
        )
        await self._send(conn, writer, refusal.status, {"error": refusal.error})

    async def _start_drain(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request
    ) -> None:
        """POST /drain: 202 with the live calls' count; the token applies as to every control route."""
        assert self._drain is not None
        if await self._control(conn, writer, request, takes_body=False):
            await self._send(conn, writer, 202, self._drain())

    async def _place_call(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> None:
        """POST /calls {"to": "sip:USER@HOST", "from", "trunk", "route", "headers": optional}: 202 with the call
        id. `trunk` names the [[trunks]] entry it goes out on, `route` an outbound route (bridge/server/dialing.py,
        bridge/cli/config.py); an unknown one is a 400 and nothing is sent. `headers` ({"X-Campaign": "7"}) go on
        the INVITE (sip/core/outbound.py `check_headers`: a refused one is a 400, nothing is sent).

        `Idempotency-Key: KEY` (bridge/server/idempotency.py): a repeat of the request gets the first call's answer
        with 200 instead of 202 and places nothing; the key with a different request is 422; a key that is not
        1-255 printable ASCII characters is 400."""
        assert self._dial is not None
        if not await self._control(conn, writer, request, takes_body=True):
            return
        try:
            keys = _headers(request, b"idempotency-key")
            if len(keys) > 1:
                raise ValueError("one Idempotency-Key header, not several")
            key = check_key(keys[0]) if keys else None
            spec = json.loads(body or b"{}")
            if not isinstance(spec, dict):
                spec = {}
            to, origin, trunk, route = (spec.get(k) for k in ("to", "from", "trunk", "route"))
            headers = spec.get("headers") or {}
            if not isinstance(to, str) or not all(
                v is None or isinstance(v, str) for v in (origin, trunk, route)
            ):
                raise ValueError(
                    'expected {"to": "sip:USER@HOST[:PORT]", "from": "sip:...", "trunk": NAME, "route": NAME,'
                    ' "headers": {NAME: VALUE}} (all but to optional)'
                )
            if not isinstance(headers, dict):
                raise ValueError('"headers": an object of header name to value')
            extra: dict[str, Any] = {}
            if key is not None:
                extra["key"] = key
            if headers:
                extra["headers"] = headers
            dialled = await self._dial(to, origin, trunk, route, **extra)
        except KeyReused as exc:
            await self._send(conn, writer, 422, {"error": str(exc)})
            return
        except (
            OutsideCallingHours
        ) as exc:  # nothing was sent: the route's window (bridge/engine/calling_hours.py)
            opens = exc.opens.isoformat(timespec="minutes") if exc.opens is not None else None
            await self._send(conn, writer, 403, {"error": str(exc), "opens": opens})
            return
        except DoNotCall as exc:  # nothing was sent: the application's do-not-call hook
            await self._send(conn, writer, 403, {"error": str(exc), "reason": "do_not_call"})
            return
        except DialRefused as exc:  # nothing was sent: the trunk's limits (bridge/engine/dial_limits.py)
            await self._send(conn, writer, 503, {"error": str(exc), "reason": exc.refused.reason})
            return
        except (ValueError, RuntimeError, OSError) as exc:
            await self._send(conn, writer, 400, {"error": str(exc)})
            return
        if isinstance(dialled, Dialled):
            status = 200 if dialled.replayed else 202
            call_id = dialled.call_id
        else:
            status, call_id = 202, dialled
        await self._send(conn, writer, status, {"call": call_id, "to": to})

    def _authorised(self, request: h11.Request) -> bool:
        """The token in `Authorization: Bearer`, or the console's session cookie; never from the URL."""
        if self._token is None:
            return True
        for value in _headers(request, b"authorization"):
            if value.startswith("Bearer "):
                return hmac.compare_digest(value[7:].encode("latin-1"), self._token.encode())
        cookie = _cookie(request, SESSION_COOKIE)
        return cookie is not None and hmac.compare_digest(cookie.encode("latin-1"), self._session().encode())

    def _session(self) -> str:
        """The console cookie's value: an HMAC of the token (the cookie jar never holds the token itself)."""
        assert self._token is not None
        return hmac.new(self._token.encode(), _SESSION_LABEL, hashlib.sha256).hexdigest()

    async def _sign_in(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> None:
        """POST /session {"token": "..."}: the console's sign-in; 200 with the session cookie, 401 if wrong."""
        if (refusal := browser_refusal(request, takes_body=True)) is not None:
            await self._refuse(conn, writer, request, refusal)
            return
        if self._token is None:
            await self._send(conn, writer, 200, {"signed_in": True, "token_required": False})
            return
        try:
            offered = json.loads(body).get("token")
        except (ValueError, AttributeError):
            offered = None
        if not isinstance(offered, str) or not hmac.compare_digest(offered.encode(), self._token.encode()):
            log.warning("http: console sign-in with a missing or wrong token")
            await self._send(conn, writer, 401, {"error": "wrong token"})
            return
        cookie = f"{SESSION_COOKIE}={self._session()}; Path=/; HttpOnly; SameSite=Strict"
        await self._send(conn, writer, 200, {"signed_in": True}, extra_headers=[("set-cookie", cookie)])

    async def _console_answer(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> bool:
        """The console's routes; False when `request` is none of them (then `route` answers it)."""
        assert self._console is not None
        path = urlsplit(request.target.decode("ascii", "replace")).path
        method = request.method
        if method in (b"GET", b"HEAD") and (page := static_file(path)) is not None:
            await self._send(conn, writer, 200, page[0], content_type=page[1])
            return True
        if method == b"POST" and path == "/session":
            await self._sign_in(conn, writer, request, body)
            return True
        if not self._authorised(request):
            await self._send(conn, writer, 401, {"error": "missing or wrong bearer token"})
            return True
        if method == b"GET" and path == "/events":
            await self._stream(conn, writer)
            return True
        if method == b"POST" and path.startswith("/calls/") and path.endswith("/hangup"):
            if not await self._control(conn, writer, request, takes_body=False):
                return True
            call_id = path[len("/calls/") : -len("/hangup")]
            found = self._console.hangup(call_id)
            await self._send(
                conn,
                writer,
                202 if found else 404,
                {"hangup": call_id} if found else {"error": "no such call"},
            )
            return True
        if method == b"GET" and path == "/talk":
            if self._console.talk is None:
                await self._send(conn, writer, 404, {"error": "the browser channel is off"})
                return True
            await self._send(conn, writer, 200, self._console.rtc_configuration())
            return True
        if method == b"POST" and path == "/talk":
            if not await self._control(conn, writer, request, takes_body=True):
                return True
            if self._console.talk is None:
                await self._send(conn, writer, 404, {"error": "the browser channel is off"})
                return True
            try:
                offer = json.loads(body)
                if (
                    not isinstance(offer, dict)
                    or offer.get("type") != "offer"
                    or not isinstance(offer.get("sdp"), str)
                ):
                    raise ValueError('expected {"type": "offer", "sdp": "..."}')
                peer = writer.get_extra_info("peername")
                call_id, sdp = await self._console.talk(
                    offer["sdp"], f"{peer[0]}:{peer[1]}" if peer else "browser"
                )
            except ValueError as exc:  # json.JSONDecodeError is a ValueError too
                await self._send(conn, writer, 400, {"error": str(exc)})
                return True
            await self._send(conn, writer, 200, {"type": "answer", "sdp": sdp, "call_id": call_id})
            return True
        return False

    async def _stream(self, conn: h11.Connection, writer: asyncio.StreamWriter) -> None:
        """`GET /events`: Server-Sent Events from the feed until the browser goes away."""
        assert self._console is not None
        feed = self._console.feed
        wake = asyncio.Event()
        sub = feed.subscribe(wake=wake)
        headers = [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-store"),
            ("connection", "close"),
            *_ISOLATION,
        ]
        try:
            writer.write(conn.send(h11.Response(status_code=200, headers=headers)))
            writer.write(conn.send(h11.Data(data=b"retry: 1000\n\n")))
            await writer.drain()
            while True:
                while (item := sub.take()) is not None:
                    writer.write(conn.send(h11.Data(data=item[0].sse(item[1]))))
                await writer.drain()
                wake.clear()
                try:
                    async with asyncio.timeout(_SSE_KEEPALIVE_S):
                        await wake.wait()
                except TimeoutError:
                    writer.write(conn.send(h11.Data(data=b": keepalive\n\n")))
        except (ConnectionError, h11.LocalProtocolError):
            pass
        finally:
            feed.unsubscribe(sub)

    @staticmethod
    async def _send(
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        status: int,
        body: Any,
        content_type: str = "application/json",
        extra_headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        payload = body if isinstance(body, bytes) else json.dumps(body, indent=1).encode()
        headers = [
            ("content-type", content_type),
            ("content-length", str(len(payload))),
            ("connection", "close"),
            *_ISOLATION,
            *extra_headers,
        ]
        try:
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
            writer.write(conn.send(h11.Data(data=payload)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
        except h11.LocalProtocolError:
            pass
