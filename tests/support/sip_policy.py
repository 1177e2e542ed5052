"""Harness moved unchanged from tests/unit/sip/test_sip_policy.py: run."""

from __future__ import annotations

from sip.core.message import Response, parse
from sip.core.ua import UserAgent


def run(
    ua: UserAgent, data: bytes, source: tuple[str, int], now: int = 0
) -> tuple[list[Response], list[object]]:
    ua.receive(data, source, "udp", now)
    sent = [parse(t.data) for t in ua.transmits()]
    return [m for m in sent if isinstance(m, Response)], list(ua.events())
