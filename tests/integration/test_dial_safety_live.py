"""Dialling safety, live: `POST /calls` sent twice with one `Idempotency-Key` (a client retrying after a lost
answer) places one call, and the application's headers are on its INVITE. The callee is a UDP socket of the
test's: every INVITE on it is counted by Call-ID (a retransmission keeps its Call-ID, a second call would not)."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import peers


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _invites(sock: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            data = sock.recv(65535)
        except BlockingIOError:
            return out
        if data.startswith(b"INVITE"):
            out.append(data)


def test_a_retried_post_calls_with_one_key_places_one_call_with_its_headers(
    start_bridge,
) -> None:
    http_port = peers.free_udp_port(also_tcp=True)
    callee = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    callee.bind(("127.0.0.1", 0))
    callee.setblocking(False)
    try:
        target = f"sip:900123@127.0.0.1:{callee.getsockname()[1]}"
        start_bridge("--http", f"127.0.0.1:{http_port}")
        base = f"http://127.0.0.1:{http_port}"
        body = {"to": target, "headers": {"X-Campaign": "spring-7", "X-Account": "42"}}
        first = _post(base + "/calls", body, {"Idempotency-Key": "order-17-attempt"})
        again = _post(base + "/calls", body, {"Idempotency-Key": "order-17-attempt"})
        other = _post(base + "/calls", {"to": target}, {"Idempotency-Key": "order-17-attempt"})
        evil = _post(base + "/calls", {"to": target, "headers": {"X-A": "1\r\nVia: SIP/2.0/UDP evil"}}, {})
        time.sleep(1.5)  # an INVITE retransmission (T1 = 500 ms) or a second call would be here by now
        invites = _invites(callee)
        with urllib.request.urlopen(base + "/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
    finally:
        callee.close()
    assert first[0] == 202 and again == (200, first[1]), (first, again)
    assert other[0] == 422 and evil[0] == 400, (other, evil)
    call_ids = {re.search(rb"\r\nCall-ID: ([^\r]+)", invite).group(1) for invite in invites}  # type: ignore[union-attr]
    assert len(call_ids) == 1, invites  # one call
    assert b"\r\nX-Campaign: spring-7\r\nX-Account: 42\r\n" in invites[0], invites[0][:800]
    assert b"evil" not in b"".join(invites)
    assert "parlora_idempotent_replays_total 1.0" in metrics
