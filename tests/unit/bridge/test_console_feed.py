"""The console's event feed (bridge/server/console.py) and its HTTP routes (bridge/server/http.py with ConsoleHooks)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bridge.engine.commands import BargedIn, RecoveryChanged, RolloverChanged, Transcript, TurnEnded
from bridge.server.console import ConsoleFeed, ConsoleHooks, FeedEvent, collect, static_file
from bridge.server.http import StatusServer


def status(
    state: str = "ready", recovery: dict[str, Any] | None = None, frames: int = 0, duration: int = 0
) -> dict[str, Any]:
    return {
        "call_id": "call-1",
        "from": "sip:alice@x",
        "called": "sales",
        "provider": "openai-live",
        "state": state,
        "duration_ms": duration,
        "output_recovery": recovery,
        "rollover": {
            "stage": "steady",
            "current": "conn-1",
            "next": None,
            "rollovers": 0,
            "refusal": None,
            "ages_ms": {"conn-1": duration},
        },
        "reservoir": {"depth_ms": 40},
        "qos": {"frames_in": frames},
    }


def drain(feed_sub: Any) -> list[tuple[FeedEvent, int]]:
    out = []
    while (item := feed_sub.take()) is not None:
        out.append(item)
    return out


def test_snapshot_publishes_new_changed_and_gone_calls() -> None:
    feed = ConsoleFeed()
    sub = feed.subscribe()
    feed.snapshot({"call-1": status(frames=1)})
    feed.snapshot({"call-1": status(frames=1)})  # unchanged: nothing
    feed.snapshot({"call-1": status(frames=2)})  # a counter moved: a full snapshot re-sends it
    feed.snapshot({})
    events = [e for e, _ in drain(sub)]
    assert [(e.kind, e.call_id) for e in events] == [
        ("call", "call-1"),
        ("call", "call-1"),
        ("gone", "call-1"),
    ]
    assert events[0].data["called"] == "sales" and events[0].data["reservoir_ms"] == 40
    assert events[1].data["qos"] == {"frames_in": 2}
    assert [e.seq for e in events] == sorted({e.seq for e in events})  # ids rise


def test_a_fast_snapshot_sends_stage_changes_only() -> None:
    feed = ConsoleFeed()
    feed.snapshot({"call-1": status()})
    sub = feed.subscribe()
    drain(sub)  # the priming copy
    feed.snapshot({"call-1": status(frames=9, duration=5000)}, full=False)  # counters and ages: not sent
    assert drain(sub) == []
    reconnecting = {"token": 2, "cause": "transport_lost", "started_at": 100, "stage": "reconnecting"}
    feed.snapshot({"call-1": status(recovery=reconnecting, frames=10)}, full=False)
    ((event, _),) = drain(sub)
    assert event.data["output_recovery"]["stage"] == "reconnecting"


def test_a_new_subscriber_is_primed_with_the_live_calls() -> None:
    feed = ConsoleFeed()
    feed.snapshot({"call-1": status(), "call-2": status("connecting")})
    sub = feed.subscribe()
    assert sorted(e.call_id for e, _ in drain(sub)) == ["call-1", "call-2"]


def test_a_slow_subscriber_loses_the_oldest_and_is_told_how_many() -> None:
    feed = ConsoleFeed(queue_len=3)
    slow, fast = feed.subscribe(), feed.subscribe(maxlen=100)
    for n in range(10):
        feed.publish("caption", "call-1", {"text": str(n)})  # never blocks
    got = drain(slow)
    assert [e.data["text"] for e, _ in got] == ["7", "8", "9"]
    assert slow.dropped == 7 and [d for _, d in got] == [7, 0, 0]  # reported once, with the next event
    assert json.loads(got[0][0].sse(got[0][1]).decode().split("data: ", 1)[1])["dropped"] == 7
    assert len(drain(fast)) == 10 and fast.dropped == 0
    feed.unsubscribe(slow)
    feed.publish("caption", "call-1", {"text": "x"})
    assert drain(slow) == [] and feed.subscribers == 1


def test_notices_become_events_and_others_are_ignored() -> None:
    feed = ConsoleFeed()
    sub = feed.subscribe()
    feed.notice("call-1", Transcript("assistant", "We open at nine.", 1200, True, 1))
    feed.notice("call-1", BargedIn(2000, "local_vad", 180, (("item-3", 640),)))
    feed.notice("call-1", RecoveryChanged(2, "output_overflow", "reconnecting", 0))
    feed.notice("call-1", RolloverChanged("opening", "conn-2", "", 3000))
    feed.notice("call-1", TurnEnded(2500))
    events = [e for e, _ in drain(sub)]
    assert [e.kind for e in events] == ["caption", "barge_in", "recovery", "rollover"]
    assert events[0].data == {
        "role": "assistant",
        "text": "We open at nine.",
        "at_ms": 1200,
        "final": True,
        "epoch": 1,
    }
    assert events[1].data["heard"] == [["item-3", 640]] and events[1].data["cleared_ms"] == 180
    assert events[2].data["stage"] == "reconnecting"


def test_sse_framing() -> None:
    text = FeedEvent(7, "gone", "call-1", {}).sse().decode()
    assert text == 'id: 7\nevent: gone\ndata: {"call_id":"call-1"}\n\n'


def test_collect_skips_a_status_that_fails() -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("tearing down")

    assert collect({"a": lambda: {"state": "ready"}, "b": broken}) == {"a": {"state": "ready"}}


def test_static_files_are_package_data() -> None:
    page = static_file("/")
    assert page is not None and b"/console.js" in page[0] and page[1].startswith("text/html")
    assert static_file("/console.js") is not None and static_file("/console.css") is not None
    assert static_file("/../pyproject.toml") is None


# --- over HTTP (loopback) ---


async def request(port: int, raw: bytes, *, read_all: bool = True) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read() if read_all else reader.readuntil(b"\n\n\n"), 5)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_console_routes_hangup_talk_and_token() -> None:
    feed = ConsoleFeed()
    hung: list[str] = []

    def hangup(call_id: str) -> bool:
        hung.append(call_id)
        return call_id == "call-1"

    async def talk(sdp: str, source: str) -> tuple[str, str]:
        if not sdp.startswith("v=0"):
            raise ValueError("offer is not an SDP session description (no v=0)")
        return "web-1", "v=0 answer"

    server = await StatusServer(lambda: {}, console=ConsoleHooks(feed, hangup, talk), token="tok").start(
        "127.0.0.1", 0
    )
    auth = b"Authorization: Bearer tok\r\n"
    try:
        code, body = await request(server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert code == 200 and b"parlora-bridge console" in body  # static: no token needed
        code, _ = await request(server.port, b"GET /calls HTTP/1.1\r\nHost: x\r\n\r\n")
        assert code == 401
        code, _ = await request(
            server.port, b"POST /calls/call-1/hangup HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        )
        assert code == 401 and hung == []
        code, _ = await request(
            server.port,
            b"POST /calls/call-1/hangup HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 0\r\n\r\n",
        )
        assert code == 202 and hung == ["call-1"]
        code, _ = await request(
            server.port, b"POST /calls/nope/hangup?token=tok HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        )
        assert code == 400 and hung == ["call-1"]  # never a token from the URL
        code, _ = await request(
            server.port,
            b"POST /calls/nope/hangup HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 0\r\n\r\n",
        )
        assert code == 404
        auth += b"Content-Type: application/json\r\n"  # POST /talk takes a JSON body only
        offer = json.dumps({"type": "offer", "sdp": "v=0 offer"}).encode()
        code, body = await request(
            server.port,
            b"POST /talk HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: %d\r\n\r\n" % len(offer) + offer,
        )
        assert code == 200 and json.loads(body) == {"type": "answer", "sdp": "v=0 answer", "call_id": "web-1"}
        for bad in (
            b"{",
            b'{"type": "answer", "sdp": "v=0"}',
            json.dumps({"type": "offer", "sdp": "x"}).encode(),
        ):
            code, body = await request(
                server.port,
                b"POST /talk HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: %d\r\n\r\n" % len(bad) + bad,
            )
            assert code == 400 and json.loads(body)["error"], bad
        big = b"x" * (70 * 1024)
        code, _ = await request(
            server.port,
            b"POST /talk HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: %d\r\n\r\n" % len(big) + big,
        )
        assert code == 413
    finally:
        await server.close()


async def test_events_stream_live_updates() -> None:
    feed = ConsoleFeed()
    feed.snapshot({"call-1": status()})
    server = await StatusServer(lambda: {}, console=ConsoleHooks(feed, lambda _: False)).start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b" 200 " in head and b"text/event-stream" in head
        seen = b""
        async with asyncio.timeout(5):
            while b"event: call\n" not in seen:  # the priming copy of the live call
                seen += await reader.read(4096)
            assert feed.subscribers == 1
            feed.publish("gone", "call-1", {})
            while b"event: gone\n" not in seen:
                seen += await reader.read(4096)
        writer.close()
        await writer.wait_closed()
        async with asyncio.timeout(5):
            while feed.subscribers:  # the stream notices the browser left when it next writes
                feed.publish("caption", "call-1", {"text": "x"})
                await asyncio.sleep(0.01)
    finally:
        await server.close()


def test_the_http_token_is_required_off_loopback(monkeypatch: Any) -> None:
    import click
    import pytest

    from bridge.cli.commands import _http_token

    assert _http_token("127.0.0.1:8080", None) is None and _http_token(None, None) is None
    with pytest.raises(click.UsageError, match="off loopback"):
        _http_token("0.0.0.0:8080", None)
    monkeypatch.delenv("PARLORA_TOKEN_X", raising=False)
    with pytest.raises(click.UsageError, match="not set"):
        _http_token("0.0.0.0:8080", "PARLORA_TOKEN_X")
    monkeypatch.setenv("PARLORA_TOKEN_X", "t0k")
    assert _http_token("0.0.0.0:8080", "PARLORA_TOKEN_X") == "t0k"
