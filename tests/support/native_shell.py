"""Harness moved unchanged from tests/unit/sip/test_native_shell.py: VirtualClock, _FakeLeg, _FakeSockets, _call_media, can_bind."""

from __future__ import annotations

import socket
from typing import Any, cast


def can_bind(host: str) -> bool:
    """A UDP socket can be bound to `host` here (::1, 127.0.0.2: not every machine has them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


class _FakeSockets:
    """RtpSocketPair's send side: `sendto` succeeds until `fail` is set; the time it returned is noted."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.fail = False
        self.sent: list[tuple[int, bytes]] = []
        self.rtp_fileno = -1

    def send_rtp(self, data: bytes | bytearray | memoryview, destination: tuple[str, int]) -> bool:
        if self.fail:
            return False
        self.clock.now += 40_000  # sendto takes 40 µs: the ledger must say when it returned
        self.sent.append((self.clock.now, bytes(data)))
        return True

    def send_rtcp(self, data: bytes, destination: tuple[str, int]) -> bool:
        return True

    def read_rtp(self, now: int, wall: int) -> bool:
        return False


class _FakeLeg:
    """What `_CallMedia` uses of a NativeLeg."""

    def __init__(self, clock: VirtualClock) -> None:
        from rtp.ledger import CarrierLedger
        from rtp.playout import Playout

        self.sockets = _FakeSockets(clock)
        self.playout = Playout(CarrierLedger())
        self.agent = type("Agent", (), {"clock": clock})()
        self.posted: list[object] = []
        self.timers: list[int] = []

    def _post(self, event: object) -> None:
        self.posted.append(event)

    def _stream_timer(self, now: int) -> None:
        self.timers.append(now)


def _call_media(clock: VirtualClock) -> tuple[Any, _FakeLeg]:
    from rtp.stream import PCMU, RtpStream, StreamConfig
    from sip.core.offer_answer import NegotiatedMedia
    from sip.native.leg import _CallMedia

    negotiated = NegotiatedMedia("PCMU", PCMU, 101, "127.0.0.1", 40000, "sendrecv", "sendrecv")
    stream = RtpStream(
        StreamConfig(ssrc=1, initial_seq=0, initial_timestamp=0, cname="t", remote=("127.0.0.1", 40000)),
        lambda: 0.5,
    )
    leg = _FakeLeg(clock)
    return _CallMedia(cast(Any, leg), stream, negotiated), leg
