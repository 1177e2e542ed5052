"""Harness moved unchanged from tests/unit/sip/test_dial_safety.py: _Dialer, _post, _server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bridge.server.api import Application, Server, ServerConfig
from sip.core.identity import call_identity
from sip.engine import EngineFeatures


class _Dialer:
    """A native-engine stand-in: counts its dials; `gate` holds each dial until it is set."""

    features = EngineFeatures(dial=True)

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def dial(self, target: str, **kwargs: Any) -> Any:
        self.asked.append({"target": target, **kwargs})
        await self.gate.wait()
        call_id = f"out-{len(self.asked)}"

        class Leg:
            identity = call_identity(
                call_id,
                request_uri=target,
                from_uri="sip:bridge@127.0.0.1",
                to_uri=target,
                sip_call_id=call_id,
                source="127.0.0.1:5099",
                direction="outbound",
            )

        return Leg()

    def drain(self) -> None:
        pass


def _server() -> tuple[Server, _Dialer]:
    server = Server(Application(), ServerConfig())
    dialer = _Dialer()
    server._agent = dialer  # type: ignore[assignment]
    server._on_call = lambda leg, route=None, lead_frames=None: None  # type: ignore[method-assign]
    return server, dialer


async def _post(port: int, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(
        f"POST /calls HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{head}"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    answer = await reader.read()
    writer.close()
    status = int(answer.split(b" ", 2)[1])
    return status, json.loads(answer.split(b"\r\n\r\n", 1)[1])
