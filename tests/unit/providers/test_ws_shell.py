"""The provider WebSocket shell (providers/ws_shell.py): websockets' sans-I/O client protocol in an
asyncio.Protocol, against an independent peer on loopback (websockets' sans-I/O *server* protocol over asyncio
streams, which the test drives frame by frame: it can fragment, stay silent, or close with any code); and its
keepalive core on virtual time."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from websockets.frames import OP_CLOSE, OP_PING, OP_TEXT, Close, Frame
from websockets.http11 import Request
from websockets.server import ServerProtocol

import providers.ws_shell as ws_shell
from providers.base import ProviderUnavailable, SessionSettings
from providers.events import OutputTranscript, ProviderEvent, SessionClosed, SessionStarted
from providers.ws_shell import MAX_PENDING_AUDIO, Keepalive, KeepaliveAction, WebSocketShell
from rtp.units import NS_PER_S as S

log = logging.getLogger("test_ws_shell")


class Core:
    """A client core: says "hello" first; "started" starts the session; every other text is a transcript."""

    def __init__(self) -> None:
        self.token = 7
        self.closed = False
        self.received: list[str | bytes] = []
        self._out = ["hello"]

    def receive_text(self, text: str | bytes) -> list[ProviderEvent]:
        self.received.append(text)
        if text == "started":
            return [SessionStarted(self.token, "s-1")]
        return [OutputTranscript(self.token, text if isinstance(text, str) else text.decode())]

    def frames_to_send(self) -> list[str]:
        out, self._out = self._out, []
        return out

    def queue(self, frame: str) -> None:
        self._out.append(frame)

    def close_frames(self) -> list[str]:
        return ["goodbye"]


@dataclass
class Peer:
    """The server side of one connection, on the test's terms."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    proto: ServerProtocol
    request: Request | None = None
    frames: list[Frame] = field(default_factory=list)
    answer_pings: bool = True

    def write(self) -> None:
        for data in self.proto.data_to_send():
            if data:
                self.writer.write(data)
            elif self.writer.can_write_eof():
                self.writer.write_eof()

    async def read(self) -> bool:
        """Read once; False at EOF. Pongs go out only while `answer_pings`."""
        data = await self.reader.read(65536)
        if not data:
            self.proto.receive_eof()
            self.write()
            return False
        self.proto.receive_data(data)
        for event in self.proto.events_received():
            if isinstance(event, Request):
                self.request = event
            elif isinstance(event, Frame):
                self.frames.append(event)
        if self.answer_pings:
            self.write()
        else:
            self.proto.data_to_send()  # a peer whose network vanished: nothing it would say arrives
        return True

    async def until(self, done: Callable[[], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not done():
                if not await self.read():
                    return

    def texts(self) -> list[str]:
        return [bytes(f.data).decode() for f in self.frames if f.opcode is OP_TEXT]

    def send_text(self, text: str | bytes, *, fin: bool = True) -> None:
        self.proto.send_text(text.encode() if isinstance(text, str) else text, fin=fin)
        self.write()


@pytest.fixture(autouse=True)
def short_close_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer here never ends TCP by itself after a close: do not wait the full second for it."""
    monkeypatch.setattr(ws_shell, "CLOSE_TIMEOUT_S", 0.1)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, asyncio.Queue[Peer]]]:
    peers: asyncio.Queue[Peer] = asyncio.Queue()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        select = lambda _, offered: offered[0] if offered else None  # noqa: E731 - accept what is offered
        peer = Peer(reader, writer, ServerProtocol(select_subprotocol=select))
        await peer.until(lambda: peer.request is not None)
        assert peer.request is not None
        if peer.request.path.startswith("/refuse"):
            peer.proto.send_response(peer.proto.reject(503, "busy"))
        else:
            peer.proto.send_response(peer.proto.accept(peer.request))
        peer.write()
        await peers.put(peer)

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    yield f"ws://127.0.0.1:{port}", peers
    srv.close()


async def opened(
    url: str, peers: asyncio.Queue[Peer], **options: object
) -> tuple[WebSocketShell, Core, Peer]:
    """A shell whose session has started: the peer has read "hello" and answered "started"."""
    core = Core()
    headers = {"Authorization": "Bearer sk-secret"}
    shell = WebSocketShell(core, url + "/v1", headers, log=log, **options)  # type: ignore[arg-type]
    connecting = asyncio.create_task(shell.connect())
    peer = await asyncio.wait_for(peers.get(), 5)
    await peer.until(lambda: peer.texts() == ["hello"])
    peer.send_text("started")
    started = await asyncio.wait_for(connecting, 5)
    assert started == SessionStarted(7, "s-1")
    return shell, core, peer


async def next_events(shell: WebSocketShell, until: Callable[[ProviderEvent], bool]) -> list[ProviderEvent]:
    seen: list[ProviderEvent] = []
    async with asyncio.timeout(5):
        async for event in shell.events():
            seen.append(event)
            if until(event):
                break
    return seen


async def test_the_handshake_carries_the_adapters_headers_and_subprotocol(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    shell, _, peer = await opened(*server, subprotocols=["realtime"])
    assert peer.request is not None and peer.request.path == "/v1"
    assert peer.request.headers["Authorization"] == "Bearer sk-secret"
    assert peer.request.headers["Sec-WebSocket-Protocol"] == "realtime"
    assert "Sec-WebSocket-Extensions" not in peer.request.headers  # no permessage-deflate unless asked
    await shell.close(timeout=1)


async def test_a_refusal_names_the_status_and_never_the_key(server: tuple[str, asyncio.Queue[Peer]]) -> None:
    url, _ = server
    shell = WebSocketShell(Core(), url + "/refuse", {"Authorization": "Bearer sk-secret"}, log=log)
    with pytest.raises(ProviderUnavailable, match="HTTP 503") as info:
        await shell.connect()
    assert "sk-secret" not in str(info.value)


async def test_no_session_within_the_connect_timeout_is_provider_unavailable(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    url, _ = server  # the peer accepts the upgrade but never says "started"
    shell = WebSocketShell(Core(), url + "/v1", {}, log=log, connect_timeout=0.2)
    with pytest.raises(ProviderUnavailable, match="no session from .* within 0.2 s"):
        await shell.connect()


async def test_a_fragmented_message_reaches_the_core_whole_and_once(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    shell, core, peer = await opened(*server)
    peer.send_text("part ", fin=False)
    peer.proto.send_continuation(b"one", fin=True)
    peer.write()
    events = await next_events(shell, lambda e: isinstance(e, OutputTranscript))
    assert events == [OutputTranscript(7, "part one")] and core.received[-1] == "part one"
    await shell.close(timeout=1)


async def test_frames_leave_in_the_order_they_were_given(server: tuple[str, asyncio.Queue[Peer]]) -> None:
    shell, core, peer = await opened(*server)
    shell.send_audio_frame("a1")
    core.queue("commit")
    shell.flush()
    shell.send_audio_frame("a2")
    await peer.until(lambda: len(peer.texts()) >= 4)
    assert peer.texts() == ["hello", "a1", "commit", "a2"] and shell.frames_sent == 3
    await shell.close(timeout=1)


async def test_under_back_pressure_the_oldest_audio_is_dropped_and_control_frames_never(
    server: tuple[str, asyncio.Queue[Peer]], caplog: pytest.LogCaptureFixture
) -> None:
    shell, core, peer = await opened(*server)
    caplog.set_level(logging.WARNING)
    shell.pause_writing()  # what the transport says when its buffer is over the high-water mark
    core.queue("control")
    shell.flush()
    for i in range(MAX_PENDING_AUDIO + 5):
        shell.send_audio_frame(f"a{i}")
    assert shell.audio_dropped == 5
    # said once, when it begins (not only when the socket ends, which a finalised close never reaches)
    assert [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()] == [
        "caller audio frames dropped: the socket cannot keep up (counted)"
    ]
    await asyncio.sleep(0)  # a loop iteration: nothing may leave while paused
    shell.resume_writing()
    await peer.until(lambda: len(peer.texts()) >= 2 + MAX_PENDING_AUDIO)
    assert peer.texts() == ["hello", "control", *(f"a{i}" for i in range(5, MAX_PENDING_AUDIO + 5))]
    await shell.close(timeout=1)


async def test_the_peers_close_code_and_reason_end_the_events(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    shell, _, peer = await opened(*server)
    peer.proto.send_close(4001, "session over")
    peer.write()
    reading = asyncio.create_task(peer.until(lambda: any(f.opcode is OP_CLOSE for f in peer.frames)))
    events = await next_events(shell, lambda e: isinstance(e, SessionClosed))
    await reading
    assert events == [SessionClosed(7, "connection closed (code 4001, session over)", False, close_code=4001)]
    await shell.close(timeout=1)


async def test_invalid_utf8_fails_the_connection_with_1007(server: tuple[str, asyncio.Queue[Peer]]) -> None:
    shell, core, peer = await opened(*server)
    peer.send_text(b"\xff\xfe")
    await peer.until(lambda: any(f.opcode is OP_CLOSE for f in peer.frames))
    [close] = [Close.parse(bytes(f.data)) for f in peer.frames if f.opcode is OP_CLOSE]
    assert close.code == 1007 and core.received == ["started"]
    peer.write()  # the echo of the close; then the server ends TCP
    peer.writer.close()
    [closed] = await next_events(shell, lambda e: isinstance(e, SessionClosed))
    # A failing endpoint reads nothing more (RFC 6455 §7.1.7), the echo included: no close code was received.
    assert isinstance(closed, SessionClosed) and closed.close_code == 1006 and not closed.finalized


async def test_pongs_keep_the_connection_and_one_timer_runs_it(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    shell, _, peer = await opened(*server, ping_interval=0.02, ping_timeout=0.05)
    loop = asyncio.get_running_loop()
    await peer.until(lambda: sum(f.opcode is OP_PING for f in peer.frames) >= 4)
    mine = [h for h in getattr(loop, "_scheduled", []) if getattr(h._callback, "__self__", None) is shell]
    assert len([h for h in mine if not h.cancelled()]) <= 1  # the one re-armed timer, never one per deadline
    assert not [f for f in peer.frames if f.opcode is OP_CLOSE]
    await shell.close(timeout=1)


async def test_a_silent_peer_is_found_by_the_keepalive_and_dropped(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    shell, _, peer = await opened(*server, ping_interval=0.05, ping_timeout=0.05)
    peer.answer_pings = False  # half-open: pings go unanswered, nothing closes
    reading = asyncio.create_task(peer.until(lambda: any(f.opcode is OP_CLOSE for f in peer.frames)))
    [closed] = await next_events(shell, lambda e: isinstance(e, SessionClosed))
    await reading
    [close] = [Close.parse(bytes(f.data)) for f in peer.frames if f.opcode is OP_CLOSE]
    assert (close.code, close.reason) == (1011, "keepalive ping timeout")  # asked politely first...
    # ...then dropped: no close came back
    assert isinstance(closed, SessionClosed) and closed.close_code == 1006


async def test_close_says_goodbye_then_completes_the_close_handshake(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    shell, _, peer = await opened(*server)
    closing = asyncio.create_task(shell.close(timeout=2))
    await peer.until(lambda: any(f.opcode is OP_CLOSE for f in peer.frames))
    peer.write()  # the echo of the close frame; the server then ends TCP
    peer.writer.close()
    await asyncio.wait_for(closing, 2)
    assert peer.texts() == ["hello", "goodbye"]
    [closed] = await next_events(shell, lambda e: isinstance(e, SessionClosed))
    assert isinstance(closed, SessionClosed) and closed.close_code == 1000


# -- the keepalive core, on virtual time ------------------------------------------------------------------------


def test_keepalive_pings_each_interval_while_pongs_come() -> None:
    k = Keepalive(3.0, 3.0, 1.0)
    k.start(0)
    assert k.next_deadline() == 3 * S and k.handle_timer(3 * S - 1) is None
    assert k.handle_timer(3 * S) is KeepaliveAction.PING and k.next_deadline() == 6 * S  # the pong's deadline
    k.pong(k.payload, 3 * S + 10)
    # the next ping is an interval after the last one was sent
    assert k.next_deadline() == 6 * S and k.handle_timer(6 * S) is KeepaliveAction.PING


def test_keepalive_ignores_a_pong_for_another_ping_and_fails_then_aborts() -> None:
    k = Keepalive(3.0, 3.0, 1.0)
    k.start(0)
    assert k.handle_timer(3 * S) is KeepaliveAction.PING
    k.pong(b"not ours", 4 * S)
    assert k.handle_timer(6 * S) is KeepaliveAction.FAIL  # the half-open case: 3 s + 3 s of silence
    assert k.next_deadline() == 7 * S and k.handle_timer(6 * S + 1) is None
    assert k.handle_timer(7 * S) is KeepaliveAction.ABORT  # 1 s for the close handshake


def test_a_late_pong_sends_the_next_ping_at_once_and_closing_stops_pings() -> None:
    k = Keepalive(20.0, 60.0, 1.0)  # Gemini's: its pongs may take 30 s
    k.start(0)
    assert k.handle_timer(20 * S) is KeepaliveAction.PING
    k.pong(k.payload, 50 * S)
    assert k.next_deadline() == 50 * S
    k.closing(51 * S)
    assert k.next_deadline() == 52 * S and k.handle_timer(51 * S) is None


def test_without_a_ping_timeout_pings_never_wait_and_without_an_interval_there_are_none() -> None:
    k = Keepalive(1.0, None, 1.0)
    k.start(0)
    assert [k.handle_timer(n * S) for n in (1, 2)] == [KeepaliveAction.PING] * 2 and k.pong_due is None
    idle = Keepalive(None, None, 1.0)
    idle.start(0)
    assert idle.next_deadline() is None


# -- caller audio per append (serve --provider-append-ms) -----------------------------------------------------


def test_the_batcher_passes_20_ms_frames_through_and_gathers_larger_appends() -> None:
    from providers.batching import AppendBatcher

    with pytest.raises(ValueError, match="append_ms"):
        AppendBatcher(30, 8)
    assert AppendBatcher(20, 8).add(b"\xff" * 160) == b"\xff" * 160
    batch = AppendBatcher(100, 8)
    outs = [batch.add(bytes([i]) * 160) for i in range(5)]
    assert outs[:4] == [None] * 4 and outs[4] == b"".join(bytes([i]) * 160 for i in range(5))
    assert batch.add(b"\x07" * 160) is None and batch.take() == b"\x07" * 160 and batch.take() == b""


def test_with_100_ms_appends_a_commit_still_follows_all_of_its_audio() -> None:
    import base64
    import json

    from providers.openai_live import LiveConfig, OpenAILiveAdapter
    from providers.openai_realtime import OpenAIRealtimeAdapter
    from rtp.audio import PCMU_8K

    settings = SessionSettings(turn_detection="client")
    limits = OpenAIRealtimeAdapter.audio_limits(PCMU_8K)
    adapter = OpenAIRealtimeAdapter("k", settings, limits=limits, url="ws://127.0.0.1:9", append_ms=100)
    sent: list[str] = []
    adapter.shell.send_audio_frame = sent.append  # type: ignore[method-assign,assignment]
    adapter.shell.flush = lambda: sent.extend(adapter.core.frames_to_send())  # type: ignore[method-assign]
    for _ in range(7):
        adapter.send_audio(b"\x00\x01" * 160)  # 20 ms of 8 kHz PCM16
    assert len(sent) == 1 and len(base64.b64decode(json.loads(sent[0])["audio"])) == 800  # 100 ms of PCMU
    adapter.commit_input()
    types = [json.loads(f)["type"] for f in sent]
    assert types == [
        "input_audio_buffer.append",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "response.create",
    ]
    assert len(base64.b64decode(json.loads(sent[1])["audio"])) == 320  # the 40 ms held back goes first
    live = OpenAILiveAdapter("k", LiveConfig(), limits=OpenAILiveAdapter.audio_limits(PCMU_8K), append_ms=20)
    assert live._batch is None  # the default: every caller frame is its own append, as before


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536])
def test_text_frames_are_framed_byte_for_byte_as_websockets_frames_them(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import secrets

    from providers.ws_shell import text_frame

    monkeypatch.setattr(secrets, "token_bytes", lambda n: b"\x01\x02\x03\x04")  # websockets' mask source
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    expected = Frame(OP_TEXT, payload).serialize(mask=True, extensions=[])
    assert text_frame(payload, b"\x01\x02\x03\x04") == expected


async def test_long_frames_and_many_in_one_iteration_arrive_intact(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    shell, _, peer = await opened(*server)
    texts = ["x" * 70_000, "y" * 200, *(f"a{i}" for i in range(50))]
    for text in texts:
        shell.send_audio_frame(text)
    await peer.until(lambda: len(peer.texts()) >= 1 + len(texts))
    assert peer.texts() == ["hello", *texts] and shell.frames_sent == len(texts)
    await shell.close(timeout=1)


async def test_a_caller_frame_with_nothing_ahead_of_it_is_written_in_the_call_that_sends_it(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    """Inbound latency: the frame waits for no loop iteration; behind a queued control frame it
    keeps its place and leaves with it."""
    shell, core, peer = await opened(*server)
    transport = shell._transport
    assert transport is not None
    writes: list[bytes] = []
    real_write = transport.write

    def write(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        real_write(data)

    transport.write = write  # type: ignore[method-assign]
    shell.send_audio_frame("a1")
    assert shell.frames_sent == 1 and len(writes) == 1 and len(writes[0]) == 2 + 4 + 2  # header, mask, "a1"
    core.queue("commit")
    shell.flush()
    shell.send_audio_frame("a2")  # behind the commit: queued, not written yet
    assert shell.frames_sent == 1 and len(writes) == 1
    await peer.until(lambda: len(peer.texts()) >= 4)
    assert peer.texts() == ["hello", "a1", "commit", "a2"] and shell.frames_sent == 3
    await shell.close(timeout=1)


async def test_deliver_to_hands_each_event_over_in_the_sockets_callback_and_the_end_once(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    """With a sink, `events()` is not read. A message received before goes first; each later one
    reaches the sink in the protocol's `data_received` (outside any task: nothing woke for it); the socket's
    end is one SessionClosed, the same as `events()` ends with."""
    shell, core, peer = await opened(*server)
    peer.send_text("before")
    for _ in range(500):  # bounded: until the shell has received it (queued, not yet parsed)
        if shell._messages:
            break
        await asyncio.sleep(0.001)
    seen: list[tuple[ProviderEvent, bool]] = []
    shell.deliver_to(lambda e: seen.append((e, asyncio.current_task() is None)))
    assert seen == [(OutputTranscript(7, "before"), False)]  # delivered in deliver_to, from the test's task
    peer.send_text("one")
    peer.send_text("two")
    peer.proto.send_close(4001, "session over")
    peer.write()
    reading = asyncio.create_task(peer.until(lambda: any(f.opcode is OP_CLOSE for f in peer.frames)))
    async with asyncio.timeout(5):
        while not any(isinstance(e, SessionClosed) for e, _ in seen):
            await asyncio.sleep(0.001)
    await reading
    await shell.close(timeout=1)
    closed = SessionClosed(7, "connection closed (code 4001, session over)", False, close_code=4001)
    assert seen[1:] == [
        (OutputTranscript(7, "one"), True),
        (OutputTranscript(7, "two"), True),
        (closed, True),
    ]


async def test_a_closed_connection_is_freed_by_reference_counting_though_its_sink_holds_its_owner(
    server: tuple[str, asyncio.Queue[Peer]],
) -> None:
    """Gemini's sink is a closure over its adapter, which holds the shell, so the shell was a cycle:
    each closed connection (its TLS objects and resampler too) waited for a full collection, tens of MB of C
    heap at 100 calls. Now the sink goes with the end, and the transport with the connection: with the
    collector off, nothing of the shell outlives the last reference to its owner."""
    shell, _, peer = await opened(*server)
    owner = Owner(shell)  # as gemini_live's adapter: it holds the shell, and the shell's sink holds it
    seen = owner.seen
    gc.disable()
    try:
        shell.deliver_to(owner.labelled)
        peer.proto.send_close(4001, "session over")
        peer.write()
        async with asyncio.timeout(5):
            while not any(isinstance(e, SessionClosed) for e in seen):
                await asyncio.sleep(0.001)
        await shell.close(timeout=1)
        for _ in range(5):  # the loop's own connection_lost callbacks
            await asyncio.sleep(0)
        gone = weakref.ref(shell)
        del shell, owner
        assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]
    finally:
        gc.enable()


@dataclass
class Owner:
    shell: WebSocketShell
    seen: list[ProviderEvent] = field(default_factory=list)

    def labelled(self, event: ProviderEvent) -> None:
        self.seen.append(event)


# Whole units to the protocol, the provider's data frames taken by the shell.


class _Transport:
    """What the shell writes, and nothing else (the tests below feed `data_received` themselves)."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _connected() -> tuple[WebSocketShell, ServerProtocol, _Transport]:
    """A shell whose request went out to an in-memory websockets server protocol (its real handshake)."""
    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    shell = WebSocketShell(Core(), "ws://127.0.0.1:9/x", {}, log=log)
    shell._loop = asyncio.get_running_loop()
    shell._lost = shell._loop.create_future()
    shell._proto = ClientProtocol(parse_uri(shell.url), max_size=ws_shell.MAX_MESSAGE_BYTES)
    transport = _Transport()
    shell.connection_made(transport)  # type: ignore[arg-type]
    server = ServerProtocol()
    server.receive_data(bytes(transport.written))
    (request,) = server.events_received()
    assert isinstance(request, Request)
    server.send_response(server.accept(request))
    transport.written.clear()
    return shell, server, transport


def _server_frames(server: ServerProtocol) -> bytes:
    return b"".join(server.data_to_send())


def _closes(server: ServerProtocol, written: bytearray) -> list[int]:
    server.receive_data(bytes(written))
    return [
        Close.parse(e.data).code
        for e in server.events_received()
        if isinstance(e, Frame) and e.opcode is OP_CLOSE
    ]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
async def test_frames_split_anywhere_arrive_whole_in_order_with_pings_and_fragments_by_the_protocol(
    chunk: int,
) -> None:
    """The upgrade response and the frames behind it in one stream, cut into `chunk`-byte reads: text and binary
    messages (the data frames the shell takes), a ping between them (the protocol's: answered), a fragmented
    text (the protocol's: whole, once), a 70,000-byte message, in order."""
    shell, server, transport = _connected()
    stream = _server_frames(server)  # the 101
    server.send_text(b"first")
    server.send_binary(b"\x00\x01bin")
    server.send_ping(b"p1")
    server.send_text(b"frag", fin=False)
    server.send_continuation(b"mented", fin=True)
    server.send_text(b"x" * 70_000)
    server.send_text("caf\u00e9".encode())
    stream += _server_frames(server)
    for at in range(0, len(stream), chunk):
        shell.data_received(stream[at : at + chunk])
    assert list(shell._messages) == ["first", b"\x00\x01bin", "fragmented", "x" * 70_000, "caf\u00e9"]
    assert shell._buffer == b"" and shell._split
    server.receive_data(bytes(transport.written))
    pongs = [e for e in server.events_received() if isinstance(e, Frame) and e.opcode.name == "PONG"]
    assert [bytes(p.data) for p in pongs] == [b"p1"]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (bytes([0x81, 0x82]) + b"\x01\x02\x03\x04" + b"hi", 1002),  # a masked server frame: a protocol error
        (
            bytes([0x81, 127]) + (1 << 40).to_bytes(8, "big"),
            1009,
        ),  # over the size limit, seen from its header
        (bytes([0x81, 2]) + b"\xff\xfe", 1007),  # invalid UTF-8 in a text frame the shell takes itself
    ],
)
async def test_a_frame_the_shell_does_not_take_fails_the_connection_as_websockets_does(
    frame: bytes, code: int
) -> None:
    shell, server, transport = _connected()
    server.send_text(b"before")
    shell.data_received(_server_frames(server) + frame + b"\x81\x05after")
    assert list(shell._messages) == ["before"]  # nothing behind the bad frame is taken
    assert _closes(server, transport.written) == [code] and not shell._split
