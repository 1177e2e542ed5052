"""The shared fake shell (providers/fakes/server.py) on loopback, with a scripted connection core, so that each
test sees what the shell itself does: close codes as a real client sees them, half-open sockets, refused
upgrades, records and lifetimes, the one timer, the keepalive, and stopping."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import connect
from websockets.http11 import Request

from providers.fakes import server as shell
from providers.fakes.faults import Fault, parse_fault
from providers.fakes.server import (
    ClientFrameRecord,
    CloseRequest,
    ConnectionContext,
    ConnectionRecord,
    FakeServer,
    server_text_frame,
)
from rtp.units import NS_PER_MS as MS


class ScriptedCore:
    """A core that does what each text message says: `echo TEXT`, `close CODE REASON`, `abrupt`, `hang`,
    `after MS` (a deadline; its timer sends `tick`), `raise`."""

    def __init__(self, ctx: ConnectionContext) -> None:
        self.record = ConnectionRecord(ctx.index)
        self.last_frame: ClientFrameRecord | None = None
        self.half_open = False
        self.received: list[str | bytes] = []
        self.timers: list[tuple[int, int]] = []  # (deadline, now) of each handle_timer
        self.lost: list[int | None] = []
        self.faults: list[Fault] = list(ctx.faults)
        self._out: list[str] = []
        self._close: CloseRequest | None = None
        self._deadline: int | None = None

    def receive_message(self, data: str | bytes, now: int) -> None:
        self.received.append(data)
        text = data if isinstance(data, str) else data.decode()
        self.last_frame = ClientFrameRecord(now, {"text": text})
        self.record.client_frames.append(self.last_frame)
        command, _, arg = text.partition(" ")
        if command == "echo":
            self._out.append(arg)
        elif command == "close":
            code, _, reason = arg.partition(" ")
            self._close = CloseRequest(int(code), reason)
            self.record.close_code = int(code)
        elif command == "abrupt":
            self._out.append("going")
            self._close = CloseRequest(1006, abrupt=True)
        elif command == "hang":
            self._out.append("last words")
            self.half_open = True
        elif command == "after":
            self._deadline = now + int(arg) * MS
        elif command == "raise":
            raise RuntimeError("a bug in the core")

    def handle_timer(self, now: int) -> None:
        assert self._deadline is not None
        self.timers.append((self._deadline, now))
        self._deadline = None
        self._out.append("tick")

    def connection_lost(self, code: int | None, now: int | None = None) -> None:
        self.lost.append(code)
        self.record.close_code = code

    def inject(self, fault: Fault, now: int) -> None:
        self.faults.append(fault)
        self._out.append(f"fault {fault}")

    def frames_to_send(self) -> list[str]:
        out, self._out = self._out, []
        self.record.server_frames += len(out)
        return out

    def close_to_send(self) -> CloseRequest | None:
        request, self._close = self._close, None
        return request

    def next_deadline(self) -> int | None:
        return self._deadline

    def recorded(self, frame: dict[str, Any]) -> dict[str, Any]:
        return frame


def _authorize(request: Request) -> HTTPStatus | None:
    return None if request.headers.get("Authorization") == "Bearer ok" else HTTPStatus.UNAUTHORIZED


AUTH = {"Authorization": "Bearer ok"}


async def scripted(
    record_path: Path | None = None, faults: tuple[Fault, ...] = ()
) -> tuple[FakeServer, list[ScriptedCore]]:
    cores: list[ScriptedCore] = []

    def factory(ctx: ConnectionContext) -> ScriptedCore:
        cores.append(ScriptedCore(ctx))
        return cores[-1]

    fake = FakeServer(
        "scripted",
        factory,
        path="/ws",
        accepts_path=lambda path: path == "/ws",
        authorize=_authorize,
        faults=faults,
        record_path=None if record_path is None else str(record_path),
    )
    return await fake.start("127.0.0.1", 0), cores


async def raw_upgrade(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket client that does nothing on its own (no pong, no close reply): the upgrade, by hand."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        (
            f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            "Authorization: Bearer ok\r\n\r\n"
        ).encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 "), head
    return reader, writer


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One unmasked server frame: (opcode, payload)."""
    first, second = await reader.readexactly(2)
    n = second & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    return first & 0x0F, await reader.readexactly(n)


def test_server_text_frames_are_websockets_own() -> None:
    from websockets.frames import OP_TEXT, Frame

    for n in (0, 125, 126, 65535, 65536):
        payload = b"x" * n
        assert server_text_frame(payload) == Frame(OP_TEXT, payload).serialize(mask=False, extensions=[])


async def test_a_close_request_reaches_the_client_with_its_code_and_reason(tmp_path: Path) -> None:
    record = tmp_path / "scripted.jsonl"
    fake, cores = await scripted(record)
    async with asyncio.timeout(5), fake:
        ws = await connect(fake.url, additional_headers=AUTH)
        await ws.send("echo hello")
        assert await ws.recv() == "hello"
        await ws.send("close 1011 the model crashed")
        with pytest.raises(websockets.ConnectionClosedError):
            await ws.recv()
        assert ws.protocol.close_rcvd is not None
        assert (ws.protocol.close_rcvd.code, ws.protocol.close_rcvd.reason) == (1011, "the model crashed")
        await ws.wait_closed()
        while not cores[0].lost:
            await asyncio.sleep(0.01)
    assert cores[0].lost == [1011]  # the client echoed the code: the handshake completed
    [line] = [json.loads(s) for s in Path(f"{record}.connections").read_text().splitlines()]
    assert line["conn"] == 0 and line["close_code"] == 1011 and line["closed_ns"] > line["opened_ns"]
    frames = [json.loads(s) for s in record.read_text().splitlines()]
    assert [f["frame"]["text"] for f in frames] == ["echo hello", "close 1011 the model crashed"]


async def test_an_abrupt_close_sends_what_came_before_then_no_close_frame() -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        ws = await connect(fake.url, additional_headers=AUTH)
        await ws.send("abrupt")
        assert await ws.recv() == "going"
        with pytest.raises(websockets.ConnectionClosedError):
            await ws.recv()
        assert ws.protocol.close_rcvd is None and ws.close_code == 1006
        while not cores[0].lost:
            await asyncio.sleep(0.01)
        assert cores[0].lost == [1006]


async def test_a_half_open_connection_leaves_pings_unanswered_and_reads_nothing_more() -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        ws = await connect(fake.url, additional_headers=AUTH, ping_interval=None)
        other = await connect(fake.url, additional_headers=AUTH, ping_interval=None)
        await ws.send("hang")
        assert await ws.recv() == "last words"  # what the core had pulled before it went half-open
        pong = await ws.ping()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(pong), 0.5)
        await ws.send("echo anyone?")
        await asyncio.sleep(0.1)
        assert cores[0].received == ["hang"]  # nothing more was read
        fake.inject(parse_fault("garbage_json"))  # the open one hears of it; the half-open one says nothing
        assert await other.recv() == "fault garbage_json"
        assert (await other.ping()) is not None
        status, body = await http_get(fake.port, "/_connections")
        assert (status, json.loads(body)) == (200, {"open": [2]})
        await other.close()
    # Stopping drops the half-open socket at once (no close handshake is possible); its record is finished.
    assert cores[0].lost == [1006] and cores[0].record.closed_ns is not None
    await asyncio.wait_for(ws.wait_closed(), 2)
    assert ws.close_code == 1006 and ws.protocol.close_rcvd is None


async def test_a_half_open_connection_is_dropped_after_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell, "HALF_OPEN_LIMIT_S", 0.2)
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        ws = await connect(fake.url, additional_headers=AUTH, ping_interval=None)
        await ws.send("hang")
        assert await ws.recv() == "last words"
        with pytest.raises(websockets.ConnectionClosedError):
            await ws.recv()
        assert ws.protocol.close_rcvd is None  # dropped, not closed: the network is still gone
        assert cores[0].lost == [1006]


@pytest.mark.parametrize(
    ("path", "headers", "status", "body"),
    [
        ("/ws", {}, 401, "Unauthorized\n"),
        ("/ws", {"Authorization": "Bearer no"}, 401, "Unauthorized\n"),
        ("/elsewhere", AUTH, 404, "Not Found\n"),
    ],
)
async def test_a_refused_upgrade_is_an_http_answer_and_no_connection(
    path: str, headers: dict[str, str], status: int, body: str
) -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        with pytest.raises(websockets.InvalidStatus) as info:
            await connect(f"ws://127.0.0.1:{fake.port}{path}", additional_headers=headers)
        response = info.value.response
        assert (response.status_code, response.body) == (status, body.encode())
        assert response.headers["Connection"] == "close" and response.headers["Server"] == shell.SERVER_HEADER
        assert fake.connections == [] and cores == []
        ws = await connect(fake.url, additional_headers=AUTH)  # the next upgrade is the first connection
        await ws.close()
        assert [c.record.index for c in cores] == [0]


async def test_a_plain_get_on_the_websocket_path_is_told_to_upgrade() -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        reader, writer = await asyncio.open_connection("127.0.0.1", fake.port)
        writer.write(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ok\r\n\r\n")
        answer = await reader.read()  # the whole answer, then the server ends the connection
        writer.close()
        assert answer.startswith(b"HTTP/1.1 426 Upgrade Required\r\n")
        assert cores == [] and fake.connections == []


async def test_two_connections_keep_their_own_records_and_lifetimes(tmp_path: Path) -> None:
    record = tmp_path / "two.jsonl"
    fake, cores = await scripted(record)
    async with asyncio.timeout(5), fake:
        first = await connect(fake.url, additional_headers=AUTH)
        second = await connect(fake.url, additional_headers=AUTH)
        await first.send("echo one")
        await second.send("echo two")
        await second.send("echo again")
        assert (await first.recv(), await second.recv(), await second.recv()) == ("one", "two", "again")
        assert [c.index for c in fake.connections] == [0, 1]
        await second.close()
        await first.close()
    assert [len(c.client_frames) for c in fake.connections] == [1, 2]
    assert [c.server_frames for c in fake.connections] == [1, 2]
    assert all(c.close_code == 1000 for c in fake.connections)
    lines = [json.loads(s) for s in Path(f"{record}.connections").read_text().splitlines()]
    assert [line["conn"] for line in lines] == [1, 0]  # in the order they ended
    first_life, second_life = lines[1], lines[0]
    assert (
        first_life["opened_ns"]
        < second_life["opened_ns"]
        < second_life["closed_ns"]
        < first_life["closed_ns"]
    )
    frames = [json.loads(s) for s in record.read_text().splitlines()]
    assert sorted((f["conn"], f["frame"]["text"]) for f in frames) == [
        (0, "echo one"),
        (1, "echo again"),
        (1, "echo two"),
    ]


async def test_the_core_deadline_runs_on_the_timer_never_early() -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        ws = await connect(fake.url, additional_headers=AUTH)
        await ws.send("after 80")
        await ws.send("echo meanwhile")  # a message does not fire the deadline
        assert await ws.recv() == "meanwhile"
        assert await ws.recv() == "tick"
        [(deadline, now)] = cores[0].timers
        assert now >= deadline
        await ws.close()


async def test_a_runtime_fault_reaches_the_right_connection_now_or_when_it_opens() -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        first = await connect(fake.url, additional_headers=AUTH)
        fake.inject(parse_fault("1/burst:2"))
        assert await first.recv() == "fault 1/burst:2"
        fake.inject(parse_fault("2/stall:100"))  # no second connection yet: it waits for it
        second = await connect(fake.url, additional_headers=AUTH)
        await second.send("echo hi")
        assert await second.recv() == "hi"
        assert [str(f) for f in cores[1].faults] == ["2/stall:100"]  # given at creation, not injected
        assert [str(f) for f in cores[0].faults] == ["1/burst:2"]
        await first.close()
        await second.close()


async def test_stopping_closes_open_connections_with_1001_and_finishes_their_records(tmp_path: Path) -> None:
    record = tmp_path / "stop.jsonl"
    fake, cores = await scripted(record)
    fake.keep_records = False
    async with asyncio.timeout(5):
        ws = await connect(fake.url, additional_headers=AUTH)
        await ws.send("echo up")
        assert await ws.recv() == "up"
        await fake.close()
        assert cores[0].lost == [1001] and fake.connections == []  # ended before close() returned
        [line] = [json.loads(s) for s in Path(f"{record}.connections").read_text().splitlines()]
        assert line["close_code"] == 1001
        with pytest.raises(websockets.ConnectionClosedOK):
            await ws.recv()
        assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 1001


async def test_the_keepalive_fails_a_client_that_never_answers_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell, "PING_INTERVAL_S", 0.1)
    monkeypatch.setattr(shell, "PING_TIMEOUT_S", 0.1)
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        reader, writer = await raw_upgrade(fake.port)
        opcode, payload = await read_frame(reader)
        assert opcode == 0x9  # a ping, about 0.1 s after the connection opened
        opcode, payload = await read_frame(reader)
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1011
        assert payload[2:] == b"keepalive ping timeout"
        assert await reader.read() == b""  # and the server ends the TCP connection
        writer.close()
        while not cores[0].lost:
            await asyncio.sleep(0.01)
        assert cores[0].lost == [1006]  # no close frame ever came back


async def test_invalid_utf8_fails_the_connection_with_1007() -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        reader, writer = await raw_upgrade(fake.port)
        mask = b"\x00\x00\x00\x00"
        writer.write(bytes([0x81, 0x80 | 2]) + mask + b"\xff\xfe")  # a text frame that is not UTF-8
        opcode, payload = await read_frame(reader)
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1007
        writer.close()
        assert cores[0].received == []


async def test_a_core_that_raises_is_logged_and_fails_its_connection_with_1011(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        ws = await connect(fake.url, additional_headers=AUTH)
        with caplog.at_level(logging.ERROR, logger="providers.fakes.scripted.websockets"):
            await ws.send("raise")
            with pytest.raises(websockets.ConnectionClosedError):
                await ws.recv()
        assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 1011
        assert "connection handler failed" in caplog.text and "a bug in the core" in caplog.text


async def http_get(port: int, target: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


def masked(opcode: int, payload: bytes, fin: bool = True, mask: bytes = b"\x01\x02\x03\x04") -> bytes:
    """One client frame, masked as RFC 6455 requires."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def test_frames_split_anywhere_and_fragments_reach_the_core_whole() -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        reader, writer = await raw_upgrade(fake.port)
        big = "echo " + "x" * 70_000  # a 64-bit length
        small = (
            masked(0x1, b"echo one")
            + masked(0x9, b"are you there")  # a ping between messages
            + masked(0x1, b"echo t", fin=False)  # a fragmented message, a pong in the middle
            + masked(0xA, b"unsolicited")
            + masked(0x0, b"w", fin=False)
            + masked(0x0, b"o", fin=True)
            + masked(0x2, b"echo binary")
            + masked(0x1, "echo é".encode())
        )
        large = masked(0x1, big.encode()) + masked(0x1, b"echo " + b"y" * 300)  # 64- and 16-bit lengths
        # One byte a read for the small frames (every frame and header is cut everywhere), then 1000 at a time.
        for piece in [small[i : i + 1] for i in range(len(small))] + [
            large[i : i + 1000] for i in range(0, len(large), 1000)
        ]:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0)
        got = [await read_frame(reader) for _ in range(7)]
        assert got[0] == (0x1, b"one")
        assert got[1] == (0xA, b"are you there")  # the pong
        assert [payload.decode() for _, payload in got[2:]] == ["two", "binary", "é", big[5:], "y" * 300]
        assert cores[0].received[:4] == ["echo one", "echo two", b"echo binary", "echo é"]
        writer.write(masked(0x8, struct.pack("!H", 1000)))
        assert await read_frame(reader) == (0x8, struct.pack("!H", 1000))
        assert await reader.read() == b""
        writer.close()


async def test_frames_in_the_same_write_as_the_upgrade_request_are_read() -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        reader, writer = await asyncio.open_connection("127.0.0.1", fake.port)
        writer.write(
            (
                f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{fake.port}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer ok\r\n\r\n"
            ).encode()
            + masked(0x1, b"echo early")
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 ")
        assert await read_frame(reader) == (0x1, b"early")
        writer.close()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (bytes([0x81, 0x05]) + b"hello", 1002),  # not masked
        (masked(0x1, b"x" * 10)[:1] + bytes([0x80 | 127]) + struct.pack("!Q", 2**40), 1009),  # too big
        (bytes([0xC1]) + masked(0x1, b"echo rsv")[1:], 1002),  # a reserved bit without an extension
        (masked(0x0, b"echo nothing to continue"), 1002),
        (masked(0x1, b"echo part", fin=False) + masked(0x1, b"echo interloper"), 1002),
    ],
)
async def test_frames_the_protocol_refuses_fail_the_connection(frame: bytes, code: int) -> None:
    fake, cores = await scripted()
    async with asyncio.timeout(5), fake:
        reader, writer = await raw_upgrade(fake.port)
        writer.write(masked(0x1, b"echo first") + frame + masked(0x1, b"echo after"))
        assert await read_frame(reader) == (0x1, b"first")
        opcode, payload = await read_frame(reader)
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == code
        assert await reader.read() == b""  # nothing after it was taken: the server ended the connection
        writer.close()
        assert cores[0].received == ["echo first"]
