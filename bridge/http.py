"""`serve --http HOST:PORT`: the calls' status as JSON (`GET /calls`, `GET /calls/{id}`) and the console.

h11 parses and frames HTTP/1.1 (sans-I/O, as this project's cores are); asyncio streams move the bytes. With
`ConsoleHooks` (bridge/console.py) it also serves the console page at `/`, its live feed `GET /events`
(Server-Sent Events), `POST /calls/{id}/hangup` and the browser channel's `POST /talk` (offer SDP in, answer
out). `POST /drain` starts the graceful drain (bridge/drain.py), as SIGTERM does. With a token, every route but the page's static files needs `Authorization: Bearer TOKEN` (or
`?token=TOKEN`, since an EventSource cannot set headers); without one it is meant for loopback only.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11

from bridge.console import ConsoleHooks, static_file

log = logging.getLogger("parlora.http")

_MAX_REQUEST_BYTES = 16 * 1024
_READ_TIMEOUT_S = 10.0
_MAX_BODY_BYTES = 64 * 1024  # an SDP offer is a few kB
_SSE_KEEPALIVE_S = 15.0

StatusSource = Callable[[], Mapping[str, Callable[[], dict[str, Any]]]]


def route(
    path: str,
    calls: Mapping[str, Callable[[], dict[str, Any]]],
    sip: Callable[[], dict[str, Any]] | None = None,
) -> tuple[int, Any]:
    """The status code and JSON body for a GET of `path`."""
    path = path.split("?", 1)[0].rstrip("/") or "/"
    if path == "/sip" and sip is not None:  # issue 14: listener, inbound policy and its refusal counters
        return 200, sip()
    if path == "/registrations" and sip is not None:  # issue 14: state, expiry and last error of each binding
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
        dial: Callable[[str, str | None], Awaitable[str]] | None = None,
        extra: Callable[[str], tuple[int, bytes, str] | None] | None = None,
        drain: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self._source = source
        self._sip = sip  # GET /sip (issue 14)
        self._dial = dial  # POST /calls {"to": ..., "from": ...} (issue 14)
        self._extra = extra  # issue 15: GET /metrics, /healthz, /readyz (bridge/observe.py): path -> answer
        self._drain = drain  # issue 15: POST /drain (bridge/drain.py http_drain)
        self._console = console
        self._token = token
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> StatusServer:
        self._server = await asyncio.start_server(self._client, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

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
                        if self._console is not None and await self._console_answer(
                            conn, writer, request, bytes(body)
                        ):
                            break
                        if (
                            request.method == b"POST"
                            and self._drain is not None
                            and _path(request) == "/drain"
                        ):
                            await self._start_drain(conn, writer, request)  # issue 15
                            break
                        if (
                            self._dial is not None
                            and request.method == b"POST"
                            and urlsplit(request.target.decode("ascii", "replace")).path == "/calls"
                        ):
                            await self._place_call(conn, writer, request, bytes(body))  # issue 14
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
            await self._send(conn, writer, extra[0], extra[1], content_type=extra[2])  # issue 15
            return
        status, body = route(request.target.decode("ascii", "replace"), self._source(), self._sip)
        await self._send(conn, writer, status, body)

    async def _start_drain(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request
    ) -> None:
        """POST /drain: 202 with the live calls' count; the token applies as to every control route."""
        assert self._drain is not None
        if not self._authorised(request):
            await self._send(conn, writer, 401, {"error": "missing or wrong bearer token"})
            return
        await self._send(conn, writer, 202, self._drain())

    async def _place_call(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> None:
        """POST /calls {"to": "sip:USER@HOST", "from": optional}: 202 with the call id (issue 14)."""
        assert self._dial is not None
        if not self._authorised(request):
            await self._send(conn, writer, 401, {"error": "missing or wrong bearer token"})
            return
        try:
            spec = json.loads(body or b"{}")
            to = spec.get("to") if isinstance(spec, dict) else None
            origin = spec.get("from") if isinstance(spec, dict) else None
            if not isinstance(to, str) or not (origin is None or isinstance(origin, str)):
                raise ValueError('expected {"to": "sip:USER@HOST[:PORT]", "from": "sip:..." (optional)}')
            call_id = await self._dial(to, origin)
        except (ValueError, RuntimeError, OSError) as exc:
            await self._send(conn, writer, 400, {"error": str(exc)})
            return
        await self._send(conn, writer, 202, {"call": call_id, "to": to})

    def _authorised(self, request: h11.Request) -> bool:
        if self._token is None:
            return True
        offered = ""
        for name, value in request.headers:
            if name == b"authorization" and value.startswith(b"Bearer "):
                offered = value[7:].decode("ascii", "replace")
        if not offered:
            offered = (
                parse_qs(urlsplit(request.target.decode("ascii", "replace")).query).get("token") or [""]
            )[0]
        return hmac.compare_digest(offered.encode(), self._token.encode())

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
        if not self._authorised(request):
            await self._send(conn, writer, 401, {"error": "missing or wrong bearer token"})
            return True
        if method == b"GET" and path == "/events":
            await self._stream(conn, writer)
            return True
        if method == b"POST" and path.startswith("/calls/") and path.endswith("/hangup"):
            call_id = path[len("/calls/") : -len("/hangup")]
            found = self._console.hangup(call_id)
            await self._send(
                conn,
                writer,
                202 if found else 404,
                {"hangup": call_id} if found else {"error": "no such call"},
            )
            return True
        if method == b"POST" and path == "/talk":
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
    ) -> None:
        payload = body if isinstance(body, bytes) else json.dumps(body, indent=1).encode()
        headers = [
            ("content-type", content_type),
            ("content-length", str(len(payload))),
            ("connection", "close"),
        ]
        try:
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
            writer.write(conn.send(h11.Data(data=payload)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
        except h11.LocalProtocolError:
            pass
