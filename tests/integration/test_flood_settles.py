"""After a request flood the native engine holds no transaction once the RFC 3261 timers have run out.

The engine runs in this process with short timers (T1 20 ms: Timers J and H end 1.28 s after the answer);
a few loopback sources send out-of-dialog OPTIONS, INVITEs they never ACK (beyond `max_calls` each gets 503
and waits for its ACK until Timer H; each call answered waits for its ACK, then the engine's BYE goes
unanswered until Timer F) and garbage. The flood must have made the engine hold state, and the state must be
gone after it: the transaction count is back to 0 and nothing else is held. tests/bench/flood.py measures
the same on a live `serve` with RFC timers, with RSS.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import peers
import pytest

from rtp.units import NS_PER_MS as MS
from sip.core.transaction import TimerConfig
from sip.engine import EngineConfig
from sip.leg import CallLeg
from sip.native.agent import NativeUserAgent
from tests.support.native_engine import _wait_until

pytestmark = pytest.mark.serial  # it floods

SOURCES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def _request(method: str, target: tuple[str, int], source: tuple[str, int], i: int, body: str = "") -> bytes:
    lines = [
        f"{method} sip:bridge@{target[0]}:{target[1]} SIP/2.0",
        f"Via: SIP/2.0/UDP {source[0]}:{source[1]};branch=z9hG4bKsettle{method[:2]}{i};rport",
        "Max-Forwards: 70",
        f"From: <sip:flood@{source[0]}>;tag=s{i}",
        f"To: <sip:bridge@{target[0]}>",
        f"Call-ID: settle-{method}-{i}@{source[0]}",
        f"CSeq: 1 {method}",
        f"Contact: <sip:flood@{source[0]}:{source[1]}>",
    ]
    if body:
        lines.append("Content-Type: application/sdp")
    lines.append(f"Content-Length: {len(body.encode())}")
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


def _flood(target: tuple[str, int], n: int) -> None:
    """n OPTIONS, n/10 INVITEs and n/10 garbage datagrams, round-robin over the sources, paced at ~2,000/s
    so the engine's socket buffer is not what decides the count."""
    socks = []
    for host in SOURCES:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host, 0))
        socks.append(sock)
    sdp = (
        "v=0\r\no=f 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 40000 RTP/AVP 0\r\n"
    )
    makers: list[Callable[[int, tuple[str, int]], bytes]] = [
        lambda i, src: _request("OPTIONS", target, src, i),
        lambda i, src: _request("INVITE", target, src, i, sdp) if i % 10 == 0 else b"\x00garbage" * (i % 40),
    ]
    try:
        start = time.monotonic()
        for i in range(n):
            sock = socks[i % len(socks)]
            for make in makers:
                data = make(i, sock.getsockname())
                if data:
                    sock.sendto(data, target)
            if i % 20 == 19:
                time.sleep(max(0.0, start + i / 2000 - time.monotonic()))  # pacing, not a check
    finally:
        for sock in socks:
            sock.close()


async def test_after_a_flood_the_engine_holds_no_transaction_once_the_timers_ran_out() -> None:
    sip_port = peers.free_udp_port()
    answered: list[CallLeg] = []

    def on_call(leg: CallLeg) -> None:
        answered.append(leg)
        leg.answer()  # and the flooder never ACKs it

    engine = NativeUserAgent(
        EngineConfig(host="127.0.0.1", port=sip_port, rtp_port=peers._free_udp_port_pair() & ~1, max_calls=1),
        on_call,
        timers=TimerConfig(t1=20 * MS, t2=160 * MS, t4=200 * MS),
    )
    await engine.start()
    try:
        assert engine.counts()["transactions"] == 0
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, engine.counts()["transactions"])
                await asyncio.sleep(0.01)  # sampling, not a check

        watcher = asyncio.get_running_loop().create_task(watch())
        await asyncio.to_thread(_flood, ("127.0.0.1", sip_port), 3000)
        assert await _wait_until(lambda: engine.counts()["transactions"] == 0, 20), engine.counts()
        watcher.cancel()
        # the flood made the engine hold state (3,000 OPTIONS for 1.28 s each): how many at once depends on how
        # fast the sender thread and the engine share the interpreter (462 on a clean clone under coverage)
        assert peak > 100
        assert engine.stats().get("invite_503_max_calls", 0) > 0 and answered

        def idle() -> bool:  # only the UDP and TCP listeners are left
            return {k: v for k, v in engine.counts().items() if v and k != "calls_rejected"} == {
                "sip_sockets": 2
            }

        assert await _wait_until(idle, 15), engine.counts()
    finally:
        await engine.stop()
