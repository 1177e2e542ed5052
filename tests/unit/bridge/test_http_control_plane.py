"""DESIGN §15: the control plane refuses browser contexts, even on loopback without a token.

A page of another origin can make the browser send `POST /calls` (a call through the trunk with its password),
`POST /drain` or a hang-up, though it can never read the answer: every state-changing route refuses a foreign
`Origin`, a cross-site or same-site `Sec-Fetch-Site`, and anything but a JSON body; the token is taken from a
header or the console's cookie, never from the URL, and never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bridge.server.console import ConsoleFeed, ConsoleHooks
from bridge.server.http import SESSION_COOKIE, StatusServer, loopback_host, own_origin

CALL = json.dumps({"to": "sip:900123@trunk.example"}).encode()


async def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One request on a fresh connection: status, headers (lower-case names) and the JSON body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    is_json = headers.get("content-type") == "application/json"
    return int(lines[0].split()[1]), headers, json.loads(body) if body and is_json else {}


def post(path: str, headers: dict[str, str], body: bytes = b"", host: str = "127.0.0.1:8080") -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def get(path: str, headers: dict[str, str] | None = None, host: str = "127.0.0.1:8080") -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


JSON = {"Content-Type": "application/json"}


class Bridge:
    """A StatusServer with every control route wired to recorders."""

    def __init__(self) -> None:
        self.dialled: list[str] = []
        self.drained: list[int] = []
        self.hung: list[str] = []
        self.talked: list[str] = []
        self.registry = CollectorRegistry()

    async def dial(self, to: str, origin: str | None, trunk: str | None, route: str | None) -> str:
        self.dialled.append(to)
        return f"call-{len(self.dialled)}"

    def drain(self) -> dict[str, Any]:
        self.drained.append(1)
        return {"draining": True}

    def hangup(self, call_id: str) -> bool:
        self.hung.append(call_id)
        return True

    async def talk(self, sdp: str, source: str) -> tuple[str, str]:
        self.talked.append(sdp)
        return "web-1", "v=0 answer"

    async def start(self, token: str | None = None) -> StatusServer:
        calls = {"call-1": lambda: {"call_id": "call-1", "from": "sip:+4930123@example"}}
        hooks = ConsoleHooks(ConsoleFeed(), self.hangup, self.talk)
        server = StatusServer(
            lambda: calls,
            console=hooks,
            token=token,
            dial=self.dial,
            drain=self.drain,
            registry=self.registry,
        )
        return await server.start("127.0.0.1", 0)

    def nothing_happened(self) -> bool:
        return not (self.dialled or self.drained or self.hung or self.talked)

    def refused_metric(self) -> str:
        return generate_latest(self.registry).decode()


def offer() -> bytes:
    return json.dumps({"type": "offer", "sdp": "v=0 offer"}).encode()


async def test_a_page_of_another_origin_places_no_call_drains_nothing_hangs_up_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bridge = Bridge()
    server = await bridge.start()  # loopback, no token: the usual set-up
    evil = {"Origin": "http://127.0.0.1:9999", **JSON}  # a page on another port is another origin
    try:
        with caplog.at_level(logging.WARNING, logger="parlora.http"):
            for path, body in (
                ("/calls", CALL),
                ("/drain", b""),
                ("/calls/call-1/hangup", b""),
                ("/talk", offer()),
            ):
                status, headers, answer = await exchange(server.port, post(path, evil, body))
                assert status == 403 and "another origin" in answer["error"], (path, answer)
                assert "access-control-allow-origin" not in headers
            status, _, _ = await exchange(server.port, post("/calls", {"Origin": "null", **JSON}, CALL))
            assert status == 403  # a sandboxed frame, a file:// page, a data: URL
        assert bridge.nothing_happened()
        refusals = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) == 5 and "'http://127.0.0.1:9999'" in refusals[0].getMessage()
        assert server.refused == {"foreign_origin": 5}
        assert 'parlora_http_refused_total{reason="foreign_origin"} 5.0' in bridge.refused_metric()
    finally:
        await server.close()


async def test_sec_fetch_site_cross_site_and_same_site_are_refused() -> None:
    bridge = Bridge()
    server = await bridge.start()
    try:
        for site in ("cross-site", "same-site"):
            status, _, answer = await exchange(
                server.port, post("/calls", {"Sec-Fetch-Site": site, **JSON}, CALL)
            )
            assert status == 403, (site, answer)
        assert bridge.dialled == [] and server.refused == {"cross_site_fetch": 2}
        for site in ("same-origin", "none"):  # the console's own page; a typed URL or bookmark
            status, _, _ = await exchange(server.port, post("/calls", {"Sec-Fetch-Site": site, **JSON}, CALL))
            assert status == 202, site
        assert len(bridge.dialled) == 2
    finally:
        await server.close()


async def test_a_body_that_is_not_json_is_refused() -> None:
    bridge = Bridge()
    server = await bridge.start()
    try:
        # what a cross-site form or a `no-cors` fetch can send without a preflight, JSON inside or not
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            status, _, answer = await exchange(server.port, post("/calls", {"Content-Type": ctype}, CALL))
            assert status == 415 and "application/json" in answer["error"], ctype
            status, _, _ = await exchange(server.port, post("/talk", {"Content-Type": ctype}, offer()))
            assert status == 415, ctype
        status, _, _ = await exchange(server.port, post("/calls", {}, CALL))
        assert status == 415
        assert bridge.nothing_happened()
        # body-less routes: a bare POST is what a no-cors fetch sends; the JSON type or an Authorization
        # header (both need a preflight cross-site) lets a script or curl through
        for path in ("/drain", "/calls/call-1/hangup"):
            status, _, _ = await exchange(server.port, post(path, {}))
            assert status == 415, path
            status, _, _ = await exchange(server.port, post(path, {"Content-Type": "text/plain"}))
            assert status == 415, path
        assert bridge.nothing_happened() and server.refused == {"content_type": 11}
        status, _, _ = await exchange(server.port, post("/drain", JSON))
        assert status == 202 and bridge.drained == [1]
        status, _, _ = await exchange(
            server.port, post("/calls/call-1/hangup", {"Authorization": "Bearer x"})
        )
        assert status == 202 and bridge.hung == ["call-1"]
        status, _, _ = await exchange(
            server.port, post("/calls", {"Content-Type": "application/json; charset=utf-8"}, CALL)
        )
        assert status == 202 and bridge.dialled == ["sip:900123@trunk.example"]
    finally:
        await server.close()


async def test_the_token_is_never_taken_from_the_url_nor_logged(caplog: pytest.LogCaptureFixture) -> None:
    bridge = Bridge()
    server = await bridge.start(token="s3cret-URL-token")
    try:
        with caplog.at_level(logging.DEBUG):
            for raw in (
                post("/calls?token=s3cret-URL-token", JSON, CALL),
                post("/drain?token=s3cret-URL-token", JSON),
                get("/calls?token=s3cret-URL-token"),
                get("/events?token=s3cret-URL-token"),
                get("/?token=s3cret-URL-token"),
            ):
                status, _, answer = await exchange(server.port, raw)
                assert status == 400 and "Authorization: Bearer" in answer["error"], raw
        assert bridge.nothing_happened() and server.refused == {"token_in_url": 5}
        assert "s3cret-URL-token" not in caplog.text and "token=" not in caplog.text
        assert caplog.text.count("(token_in_url)") == 5  # one line per request
        status, _, _ = await exchange(server.port, get("/calls?token=", {}))
        assert status == 400  # even empty: it says where the token goes
    finally:
        await server.close()


async def test_same_origin_json_with_the_header_token_works() -> None:
    bridge = Bridge()
    server = await bridge.start(token="t0ken")
    own = {"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin", **JSON}
    try:
        status, _, _ = await exchange(server.port, post("/calls", own, CALL))
        assert status == 401 and bridge.dialled == []
        status, _, answer = await exchange(
            server.port, post("/calls", {**own, "Authorization": "Bearer t0ken"}, CALL)
        )
        assert status == 202 and answer == {"call": "call-1", "to": "sip:900123@trunk.example"}
        status, _, _ = await exchange(server.port, post("/drain", {"Authorization": "Bearer t0ken"}))
        assert status == 202 and bridge.drained == [1]
        status, _, _ = await exchange(
            server.port,
            post("/calls", {**own, "Authorization": "Bearer t0ken", "Origin": "http://evil.example"}, CALL),
        )
        assert status == 403 and len(bridge.dialled) == 1  # the token does not make a foreign page welcome
    finally:
        await server.close()


async def test_the_console_signs_in_for_an_http_only_same_site_strict_cookie() -> None:
    bridge = Bridge()
    server = await bridge.start(token="t0ken")
    own = {"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin", **JSON}
    try:
        status, _, _ = await exchange(server.port, post("/session", own, b'{"token": "wrong"}'))
        assert status == 401
        status, _, _ = await exchange(
            server.port, post("/session", {"Origin": "http://127.0.0.1:9999", **JSON}, b'{"token": "t0ken"}')
        )
        assert status == 403  # no sign-in on behalf of another page either
        status, headers, _ = await exchange(server.port, post("/session", own, b'{"token": "t0ken"}'))
        cookie = headers["set-cookie"]
        assert status == 200 and cookie.startswith(SESSION_COOKIE + "=")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "t0ken" not in cookie
        jar = {"Cookie": cookie.split(";", 1)[0]}
        status, _, body = await exchange(server.port, get("/calls", jar))
        assert status == 200 and body["calls"][0]["call_id"] == "call-1"
        status, _, _ = await exchange(server.port, post("/calls/call-1/hangup", {**own, **jar}))
        assert status == 202 and bridge.hung == ["call-1"]
        status, _, _ = await exchange(server.port, get("/calls", {"Cookie": f"{SESSION_COOKIE}=forged"}))
        assert status == 401
        # same-site pages (another port of 127.0.0.1) do carry SameSite=Strict cookies: refused all the same
        status, _, _ = await exchange(
            server.port,
            post(
                "/calls",
                {"Origin": "http://127.0.0.1:9999", "Sec-Fetch-Site": "same-site", **jar, **JSON},
                CALL,
            ),
        )
        assert status == 403 and bridge.dialled == []
    finally:
        await server.close()


async def test_without_a_token_a_browser_must_name_a_loopback_host() -> None:
    """DNS rebinding: evil.example resolves to 127.0.0.1, and its page is same-origin with the listener."""
    bridge = Bridge()
    server = await bridge.start()
    rebound = {"Origin": "http://evil.example:8080", "Sec-Fetch-Site": "same-origin", **JSON}
    try:
        status, _, _ = await exchange(server.port, post("/calls", rebound, CALL, host="evil.example:8080"))
        assert status == 403 and bridge.dialled == []
        status, _, _ = await exchange(
            server.port, get("/calls", {"Sec-Fetch-Site": "same-origin"}, host="evil.example:8080")
        )
        assert status == 403  # the call list (callers' numbers) is not read that way either
        assert server.refused == {"foreign_host": 2}
        for host in ("localhost:8080", "[::1]:8080", "127.0.0.1:8080"):
            status, _, _ = await exchange(
                server.port, get("/calls", {"Sec-Fetch-Site": "same-origin"}, host=host)
            )
            assert status == 200, host
        status, _, _ = await exchange(server.port, get("/calls", host="evil.example:8080"))
        assert status == 200  # not a browser (curl, a script): no Origin, no Sec-Fetch-Site
    finally:
        await server.close()


async def test_no_answer_invites_another_origin_in() -> None:
    bridge = Bridge()
    server = await bridge.start()
    try:
        for raw in (
            get("/calls", {"Origin": "http://evil.example"}),
            get("/"),
            b"OPTIONS /calls HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\n"
            b"Access-Control-Request-Method: POST\r\n\r\n",
        ):
            status, headers, _ = await exchange(server.port, raw)
            assert not any(name.startswith("access-control-") for name in headers), raw
            assert headers["cross-origin-resource-policy"] == "same-origin"
            assert headers["x-content-type-options"] == "nosniff"
        assert status == 405  # the preflight is never granted
    finally:
        await server.close()


def test_own_origin_and_loopback_host() -> None:
    assert own_origin("http://127.0.0.1:8080", "127.0.0.1:8080")
    assert own_origin("http://localhost", "localhost:80") and own_origin("https://h.example", "h.example:443")
    assert not own_origin("http://127.0.0.1:9999", "127.0.0.1:8080")
    assert not own_origin("http://127.0.0.1", "127.0.0.1:8080")
    assert not own_origin("null", "127.0.0.1:8080") and not own_origin("file://", "127.0.0.1:8080")
    assert not own_origin("http://127.0.0.1:8080", None)
    assert loopback_host("127.0.0.2:80") and loopback_host("[::1]") and loopback_host("app.localhost:1")
    assert not loopback_host("evil.example:8080") and not loopback_host("") and not loopback_host(None)
    assert loopback_host("10.0.0.5:8080", "10.0.0.5") and not loopback_host("10.0.0.5", "0.0.0.0")
