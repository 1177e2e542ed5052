"""Harness moved unchanged from tests/unit/bridge/test_webhook.py: Answer, App, ENV, Received, SECRET, json_answer."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h11

from bridge.server.webhook import SECRET_ENV

SECRET = "s3cret-webhook-key-never-logged"


ENV = {SECRET_ENV: SECRET}


@dataclass
class Received:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


Answer = tuple[int, list[tuple[str, str]], bytes]


@dataclass
class App:
    """The application: `answer(request)` returns (status, headers, body), or None to close without answering."""

    answer: Callable[[Received], Awaitable[Answer | None]]
    requests: list[Received] = field(default_factory=list)
    connections: int = 0
    server: asyncio.Server | None = None

    async def start(
        self, sock: socket.socket | None = None, ssl_context: ssl.SSLContext | None = None
    ) -> int:
        if sock is not None:
            self.server = await asyncio.start_server(self._client, sock=sock, ssl=ssl_context)
        else:
            self.server = await asyncio.start_server(self._client, "127.0.0.1", 0, ssl=ssl_context)
        return self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        body = b""
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    return
            assert request is not None
            received = Received(
                request.method.decode(),
                request.target.decode(),
                {k.decode(): v.decode() for k, v in request.headers},
                body,
            )
            self.requests.append(received)
            answer = await self.answer(received)
            if answer is None:
                writer.transport.abort()  # a reset after the request was read
                return
            status, headers, payload = answer
            headers = [*headers, ("content-length", str(len(payload))), ("connection", "close")]
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
            writer.write(conn.send(h11.Data(data=payload)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
        finally:
            writer.close()


def json_answer(value: object, status: int = 200) -> Callable[[Received], Awaitable[Answer]]:
    async def answer(_: Received) -> Answer:
        return status, [("content-type", "application/json")], json.dumps(value).encode()

    return answer
