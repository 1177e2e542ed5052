"""Where the browser channel's ICE listens (bridge/server/browser.py): on the HTTP listener's address, on
`webrtc_address` when given, with the configured STUN server and no other; and what the page is told.

The server's HTTP listener is started on a loopback address other than 127.0.0.1 and a real aiortc client
posts its offer to `POST /talk`; the answer's candidates are read back. A STUN server of the test's own (a
UDP socket answering Binding requests with an address of its choosing) proves the configured server is asked
and its answer becomes a server-reflexive candidate.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aioice.ice
import pytest
from aioice import stun
from aiortc import RTCPeerConnection

from bridge.server.api import Application, Server, ServerConfig
from bridge.server.browser import BrowserChannel, ice_hosts_for, loopback_candidates
from bridge.server.console import parse_stun_url, parse_webrtc_address
from sip.engine import EngineStartError

CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ udp \d+ (\S+) (\d+) typ (\w+)", re.MULTILINE)
MAPPED = ("203.0.113.9", 40_000)  # what the test's STUN server says the bridge's mapping is


def _request(url: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json"} if body is not None else {}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def _offer() -> tuple[RTCPeerConnection, str]:
    client = RTCPeerConnection()
    client.addTransceiver("audio", direction="sendrecv")
    await client.setLocalDescription(await client.createOffer())
    return client, client.localDescription.sdp


async def _answer_candidates(config: ServerConfig) -> tuple[list[tuple[str, str, str]], dict[str, Any]]:
    """(host, port, type) of each candidate in the answer to a client's offer, and what `GET /talk` says."""
    server = Server(Application(), config)
    server._on_call = lambda leg, **_: None  # type: ignore[method-assign]  # no session: no provider dialled
    assert config.http is not None
    await server._start_http(config.http)
    client, offer = await _offer()
    try:
        assert server._status is not None
        base = f"http://{config.http[0]}:{server._status.port}"
        body = json.dumps({"type": "offer", "sdp": offer}).encode()
        status, answer = await asyncio.to_thread(_request, f"{base}/talk", body)
        assert status == 200, answer
        conf_status, conf = await asyncio.to_thread(_request, f"{base}/talk")
        return CANDIDATE.findall(answer["sdp"]), {"status": conf_status, **conf}
    finally:
        await client.close()
        await server._close_helpers()


async def test_ice_is_on_the_http_listeners_address_not_127_0_0_1() -> None:
    candidates, conf = await _answer_candidates(ServerConfig(http=("127.0.0.2", 0)))
    assert candidates and {host for host, _, _ in candidates} == {"127.0.0.2"}, candidates
    assert conf == {"status": 200, "iceServers": []}  # no STUN unless configured: the page asks no one either


async def test_a_wildcard_listener_gathers_on_every_interface_address_as_aioice_chooses() -> None:
    server = Server(Application(), ServerConfig(http=("0.0.0.0", 0)))
    server._on_call = lambda leg, **_: None  # type: ignore[method-assign]
    await server._start_http(("0.0.0.0", 0))
    expected = set(aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True))  # nothing set: aioice's own
    client, offer = await _offer()
    try:
        if not expected:
            pytest.skip("this machine has no interface address but loopback")
        assert server._status is not None
        body = json.dumps({"type": "offer", "sdp": offer}).encode()
        status, answer = await asyncio.to_thread(
            _request, f"http://127.0.0.1:{server._status.port}/talk", body
        )
        assert status == 200, answer
        hosts = {host for host, _, _ in CANDIDATE.findall(answer["sdp"])}
        assert hosts == expected and "127.0.0.1" not in hosts, (hosts, expected)
    finally:
        await client.close()
        await server._close_helpers()


class _StunServer(asyncio.DatagramProtocol):
    """Answers every Binding request with MAPPED; keeps the source of each."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        request = stun.parse_message(data)
        self.asked.append(addr)
        response = stun.Message(
            message_method=stun.Method.BINDING,
            message_class=stun.Class.RESPONSE,
            transaction_id=request.transaction_id,
        )
        response.attributes["XOR-MAPPED-ADDRESS"] = MAPPED
        self.transport.sendto(bytes(response), addr)


@pytest.fixture
async def stun_server() -> AsyncIterator[tuple[_StunServer, int]]:
    transport, protocol = await asyncio.get_running_loop().create_datagram_endpoint(
        _StunServer, local_addr=("127.0.0.1", 0)
    )
    yield protocol, transport.get_extra_info("sockname")[1]
    transport.close()


async def test_webrtc_address_and_stun_reach_aiortc_and_the_page(
    stun_server: tuple[_StunServer, int],
) -> None:
    server, port = stun_server
    url = f"stun:127.0.0.1:{port}"
    candidates, conf = await _answer_candidates(
        ServerConfig(http=("127.0.0.1", 0), webrtc_address="127.0.0.3", stun=(url,))
    )
    hosts = {(host, kind) for host, _, kind in candidates}
    assert ("127.0.0.3", "host") in hosts and ("127.0.0.1", "host") not in hosts, candidates
    assert (MAPPED[0], "srflx") in hosts, candidates  # the STUN server was asked, its answer is a candidate
    assert server.asked and {addr[0] for addr in server.asked} == {"127.0.0.3"}
    assert conf == {
        "status": 200,
        "iceServers": [{"urls": [url]}],
    }  # the page's RTCPeerConnection gets the same server


async def test_no_stun_server_means_aiortc_asks_none() -> None:
    """aiortc's own default RTCConfiguration names a public STUN server: the channel never leaves it empty."""
    channel = BrowserChannel(lambda leg: None)
    assert channel.configuration().iceServers == []
    configured = BrowserChannel(lambda leg: None, ice_servers=("stun:stun.example.net:3478",))
    (server,) = configured.configuration().iceServers or []
    assert server.urls == ["stun:stun.example.net:3478"]


async def test_a_webrtc_address_that_is_not_this_hosts_refuses_to_start() -> None:
    server = Server(Application(), ServerConfig(http=("127.0.0.1", 0), webrtc_address="198.51.100.1"))
    with pytest.raises(EngineStartError, match=r"198\.51\.100\.1: not an address of this host"):
        await server._start_http(("127.0.0.1", 0))
    assert server._status is None and server._browser is None  # nothing left listening


def test_a_wildcard_listener_gathers_on_every_interface_address() -> None:
    assert ice_hosts_for(["0.0.0.0"]) is None and ice_hosts_for(["::", "0.0.0.0"]) is None
    assert ice_hosts_for(["127.0.0.1", "::1", "127.0.0.1"]) == ("127.0.0.1", "::1")
    assert ice_hosts_for(["192.0.2.1"]) == ("192.0.2.1",)


def test_an_offer_with_no_loopback_candidate_still_gets_an_answer_with_ours() -> None:
    offer = "v=0\r\na=candidate:2 1 udp 2122194687 192.0.2.7 50001 typ host\r\na=end-of-candidates\r\n"
    kept = loopback_candidates(offer)  # no end-of-candidates left: aioice would gather nothing
    assert "192.0.2.7" not in kept and "end-of-candidates" not in kept and kept.startswith("v=0")


def test_stun_urls_and_webrtc_addresses_are_checked() -> None:
    assert parse_stun_url("stun:stun.example.net") == "stun:stun.example.net"
    assert parse_stun_url("stun:192.0.2.1:3478") == "stun:192.0.2.1:3478"
    for bad in ("stuns:stun.example.net", "turn:x", "stun:[2001:db8::1]:3478", "stun:", "stun:x:99999", "x"):
        with pytest.raises(ValueError, match="stun:HOST"):
            parse_stun_url(bad)
    assert parse_webrtc_address("192.0.2.1") == "192.0.2.1"
    assert parse_webrtc_address("fd00::0002") == "fd00::2"
    for bad in ("0.0.0.0", "::", "bridge.example", "224.0.0.1"):
        with pytest.raises(ValueError, match="address of this host"):
            parse_webrtc_address(bad)
