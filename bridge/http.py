"""`serve --http HOST:PORT`: the calls' status as JSON (`GET /calls`, `GET /calls/{id}`).

h11 parses and frames HTTP/1.1 (sans-I/O, as this project's cores are); asyncio streams move the bytes. The
endpoint is read-only and meant for operators on a trusted network: it has no authentication.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import h11

log = logging.getLogger("parlora.http")

_MAX_REQUEST_BYTES = 16 * 1024
_READ_TIMEOUT_S = 10.0

StatusSource = Callable[[], Mapping[str, Callable[[], dict[str, Any]]]]


def route(path: str, calls: Mapping[str, Callable[[], dict[str, Any]]]) -> tuple[int, Any]:
    """The status code and JSON body for a GET of `path`."""
    path = path.split("?", 1)[0].rstrip("/") or "/"
    if path == "/calls":
        return 200, {"calls": [status() for status in calls.values()]}
    if path.startswith("/calls/"):
        status = calls.get(path[len("/calls/") :])
        if status is not None:
            return 200, status()
        return 404, {"error": "no such call"}
    return 404, {"error": "not found", "paths": ["/calls", "/calls/{id}"]}


class StatusServer:
    """A small HTTP/1.1 server answering from `source()`: call id -> status function."""

    def __init__(self, source: StatusSource) -> None:
        self._source = source
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
            async with asyncio.timeout(_READ_TIMEOUT_S):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(4096)
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        await self._answer(conn, writer, event)
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
        status, body = route(request.target.decode("ascii", "replace"), self._source())
        await self._send(conn, writer, status, body)

    @staticmethod
    async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, status: int, body: Any) -> None:
        payload = json.dumps(body, indent=1).encode()
        headers = [("content-type", "application/json"), ("content-length", str(len(payload))), ("connection", "close")]
        try:
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
            writer.write(conn.send(h11.Data(data=payload)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
        except h11.LocalProtocolError:
            pass
