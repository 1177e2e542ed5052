"""Harness moved unchanged from tests/unit/sip/test_native_trunk.py: Peer, Registrar, SDP, WAIT_S, _to_of, engine_factory, invite."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest

from sip.core.auth import AuthOk, Credentials, DigestServer
from sip.core.message import Request, make_response, parse, serialize
from sip.engine import EngineConfig
from sip.leg import CallLeg
from sip.native.agent import NativeUserAgent

WAIT_S = 3.0


SDP = (
    "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
)


def invite(port: int, source: tuple[str, int], n: int, user_agent: str = "test", extra: str = "") -> bytes:
    host, sport = source
    return (
        f"INVITE sip:bridge@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {host}:{sport};branch=z9hG4bK-t14-{n}\r\n"
        f"From: <sip:caller@{host}>;tag=f{n}\r\nTo: <sip:bridge@127.0.0.1>\r\n"
        f"Call-ID: t14-{n}@{host}\r\nCSeq: 1 INVITE\r\nMax-Forwards: 70\r\n"
        f"Contact: <sip:caller@{host}:{sport}>\r\nUser-Agent: {user_agent}\r\n{extra}"
        f"Content-Type: application/sdp\r\nContent-Length: {len(SDP)}\r\n\r\n{SDP}"
    ).encode()


class Peer:
    """A UDP socket on one loopback address that sends requests and collects the answers."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()

    async def recv(self, timeout: float = WAIT_S) -> bytes | None:
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.sock_recv(self.sock, 65535), timeout)
        except TimeoutError:
            return None

    async def final(self, timeout: float = WAIT_S) -> bytes | None:
        """The first final (>= 200) response, skipping 100/180."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while (left := end - loop.time()) > 0:
            data = await self.recv(left)
            if data is None:
                return None
            if not data.startswith((b"SIP/2.0 1",)):
                return data
        return None


@pytest.fixture
async def engine_factory() -> AsyncIterator[object]:
    started: list[NativeUserAgent] = []
    calls: list[CallLeg] = []

    async def start(**fields: object) -> tuple[NativeUserAgent, list[CallLeg]]:
        config = EngineConfig(host="127.0.0.1", port=0, rtp_port=42000 + 200 * len(started), **fields)  # type: ignore[arg-type]
        agent = NativeUserAgent(config, calls.append, tcp=False)
        await agent.start()
        started.append(agent)
        return agent, calls

    yield start
    for agent in started:
        for leg in calls:
            leg.hangup("test over")
        await agent.stop()


def _to_of(response: bytes) -> str:
    for line in response.decode().split("\r\n"):
        if line.lower().startswith(("to:", "t:")):
            return line
    raise AssertionError("no To header")


class Registrar:
    """A UDP registrar on loopback that challenges with digest (sip.core.auth.DigestServer) and verifies."""

    def __init__(self, user: str, password: str) -> None:
        self.peer = Peer("127.0.0.1")
        self.server = DigestServer("parlora-test", [Credentials(user, password)])
        self.seen: list[Request] = []

    async def answer_one(self) -> Request:
        data = await self.peer.recv()
        assert data is not None, "no REGISTER came"
        request = parse(data)
        assert isinstance(request, Request) and request.method == "REGISTER", data
        self.seen.append(request)
        source = (request.headers.get("Via") or "").split()[1].split(";")[0]
        host, _, port = source.rpartition(":")
        now = time.monotonic_ns()
        verdict = self.server.verify(
            "REGISTER", request.uri, request.headers.get_fields("Authorization"), now
        )
        if isinstance(verdict, AuthOk):
            expires = request.headers.get("Expires") or "3600"
            contact = request.headers.get("Contact") or ""
            response = make_response(request, 200, headers=(("Contact", contact), ("Expires", expires)))
        else:
            response = make_response(request, 401, headers=self.server.challenge(now))
        self.peer.sock.sendto(serialize(response), (host, int(port)))
        return request
