"""SE7 over HTTP: `GET /calls` and `GET /calls/{id}` answer JSON from the live sessions."""

import asyncio
import json

from bridge.server.http import StatusServer, route


async def http(port: int, request: bytes) -> tuple[int, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def calls() -> dict:
    return {"call-1": lambda: {"call_id": "call-1", "state": "ready", "output_recovery": None}}


async def test_se7_status_as_json_over_http() -> None:
    server = await StatusServer(calls).start("127.0.0.1", 0)
    try:
        status, body = await http(server.port, b"GET /calls HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200 and body == {
            "calls": [{"call_id": "call-1", "state": "ready", "output_recovery": None}]
        }
        status, body = await http(server.port, b"GET /calls/call-1 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200 and body["state"] == "ready"
        status, body = await http(server.port, b"GET /calls/nope HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 404 and body == {"error": "no such call"}
        status, _ = await http(server.port, b"POST /calls HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert status == 405
        status, body = await http(server.port, b"GARBAGE\r\n\r\n")
        assert status == 400 and "error" in body
    finally:
        await server.close()


def test_routes() -> None:
    assert route("/calls/", calls())[0] == 200
    assert route("/calls?x=1", calls())[0] == 200
    assert route("/", calls())[0] == 404


async def test_post_drain_needs_the_token_and_answers_202() -> None:
    asked: list[int] = []

    def drain() -> dict:
        asked.append(1)
        return {"draining": True, "live_calls": 2, "already": len(asked) > 1}

    server = await StatusServer(calls, token="t0ken-abc", drain=drain).start("127.0.0.1", 0)
    post = b"POST /drain HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
    try:
        status, _ = await http(server.port, post + b"\r\n")
        assert status == 401 and asked == []
        status, body = await http(server.port, post + b"Authorization: Bearer t0ken-abc\r\n\r\n")
        assert status == 202 and body == {"draining": True, "live_calls": 2, "already": False}
        status, _ = await http(server.port, b"GET /drain HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 404 and asked == [1]  # only POST drains
    finally:
        await server.close()
    server = await StatusServer(calls).start("127.0.0.1", 0)  # no drain hook: POST /drain is not a route
    try:
        status, _ = await http(server.port, post + b"\r\n")
        assert status == 405
    finally:
        await server.close()
