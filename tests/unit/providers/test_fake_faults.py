"""Fault specs and schedules (providers/fakes/faults.py), and runtime injection through the shared fake shell
(providers/fakes/server.py) on loopback, with the GPT-Live fake as the connection core."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote

import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from providers.fakes.faults import Fault, FaultKind, FaultSchedule, parse_fault
from providers.fakes.openai_live import serve
from rtp.units import NS_PER_MS as MS
from rtp.units import NS_PER_S as S

AUTH = {"Authorization": "Bearer sk-test"}
START = json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}})


# -- parsing ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "fault", "text"),
    [
        ("burst:4", Fault(FaultKind.BURST, 4.0), "burst:4"),
        ("burst:1.5", Fault(FaultKind.BURST, 1.5), "burst:1.5"),
        ("2/stall:3000@1500", Fault(FaultKind.STALL, 3000.0, 1500, 2), "2/stall:3000@1500"),
        ("half_open", Fault(FaultKind.HALF_OPEN), "half_open"),
        ("  close ", Fault(FaultKind.CLOSE), "close"),
        ("3/abrupt_close@10", Fault(FaultKind.ABRUPT_CLOSE, None, 10, 3), "3/abrupt_close@10"),
        ("garbage_json@0", Fault(FaultKind.GARBAGE_JSON), "garbage_json"),
        ("invalid_audio", Fault(FaultKind.INVALID_AUDIO), "invalid_audio"),
        ("duplicate_tool_call", Fault(FaultKind.DUPLICATE_TOOL_CALL), "duplicate_tool_call"),
        ("slow_handshake:2500", Fault(FaultKind.SLOW_HANDSHAKE, 2500.0), "slow_handshake:2500"),
        ("1/refuse", Fault(FaultKind.REFUSE, connection=1), "1/refuse"),
    ],
)
def test_specs_parse_and_print_back(spec: str, fault: Fault, text: str) -> None:
    assert parse_fault(spec) == fault
    assert str(fault) == text
    assert parse_fault(text) == fault


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "bad fault spec"),
        ("Close", "bad fault spec"),
        ("/close", "bad fault spec"),
        ("close@-5", "bad fault spec"),
        ("stall:abc", "bad fault spec"),
        ("bogus", "unknown fault 'bogus'"),
        ("burst", "fault burst needs a value"),
        ("stall@100", "fault stall needs a value"),
        ("slow_handshake", "fault slow_handshake needs a value"),
        ("burst:0", "burst factor must be positive"),
    ],
)
def test_bad_specs_say_why(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fault(spec)


def test_a_fault_applies_to_its_connection_or_to_all() -> None:
    assert Fault(FaultKind.CLOSE).applies_to(1) and Fault(FaultKind.CLOSE).applies_to(7)
    assert Fault(FaultKind.CLOSE, connection=2).applies_to(2)
    assert not Fault(FaultKind.CLOSE, connection=2).applies_to(1)


# -- scheduling ---------------------------------------------------------------------------------------------


def test_schedule_fires_each_fault_once_in_time_order_from_the_session_start() -> None:
    close, burst = parse_fault("close@1000"), parse_fault("burst:2@500")
    schedule = FaultSchedule([close, burst], connection=1, start=10 * S)
    assert schedule.next_deadline() == 10 * S + 500 * MS
    assert schedule.due(10 * S + 499 * MS) == []
    assert schedule.due(10 * S + 500 * MS) == [burst]
    assert schedule.due(10 * S + 500 * MS) == []
    assert schedule.next_deadline() == 11 * S
    assert schedule.due(20 * S) == [close]
    assert schedule.fired == [burst, close] and schedule.next_deadline() is None


def test_schedule_ignores_faults_for_other_connections() -> None:
    schedule = FaultSchedule([parse_fault("2/close"), parse_fault("1/garbage_json")], connection=1, start=0)
    assert schedule.due(S) == [parse_fault("1/garbage_json")]
    schedule.add(parse_fault("3/half_open"), S)
    assert schedule.next_deadline() is None


def test_runtime_faults_count_from_now() -> None:
    schedule = FaultSchedule([], connection=1, start=0)
    schedule.add(parse_fault("invalid_audio@300"), 5 * S)
    assert schedule.next_deadline() == 5 * S + 300 * MS


def test_one_shot_faults_fire_while_lasting_ones_stay_active() -> None:
    schedule = FaultSchedule(
        [parse_fault("close"), parse_fault("half_open"), parse_fault("duplicate_tool_call")], 1, 0
    )
    assert len(schedule.due(0)) == 3
    assert schedule.active(FaultKind.CLOSE, S) is None
    assert schedule.active(FaultKind.HALF_OPEN, 100 * S) == parse_fault("half_open")
    assert schedule.active(FaultKind.DUPLICATE_TOOL_CALL, 100 * S) is not None


def test_a_stall_lasts_its_value_and_its_end_is_a_deadline() -> None:
    stall = parse_fault("stall:200@100")
    schedule = FaultSchedule([stall], connection=1, start=0)
    assert schedule.active(FaultKind.STALL, 99 * MS) is None
    assert schedule.active(FaultKind.STALL, 100 * MS) == stall
    assert schedule.stall_ends() == schedule.next_deadline() == 300 * MS
    assert schedule.active(FaultKind.STALL, 300 * MS - 1) == stall
    assert schedule.active(FaultKind.STALL, 300 * MS) is None
    assert schedule.stall_ends() is None and schedule.next_deadline() is None


def test_speed_is_the_burst_factor_once_it_fired() -> None:
    schedule = FaultSchedule([parse_fault("burst:3@50")], connection=1, start=0)
    assert schedule.speed(49 * MS) == 1.0
    assert schedule.speed(50 * MS) == 3.0


# -- runtime injection through the shell, on loopback ------------------------------------------------------


async def started(url: str) -> ClientConnection:
    ws = await connect(url, additional_headers=AUTH)
    await ws.send(START)
    assert json.loads(await ws.recv())["type"] == "session.started"
    return ws


async def next_event(ws: ClientConnection) -> dict[str, Any]:
    event = json.loads(await ws.recv())
    assert isinstance(event, dict)
    return event


async def ends_with_expiry(ws: ClientConnection) -> None:
    """The `close` fault on GPT-Live: session.closed (expired), then close 1000."""
    closed = await next_event(ws)
    assert (closed["type"], closed["reason"]) == ("session.closed", "expired")
    with pytest.raises(websockets.ConnectionClosedOK):
        await ws.recv()
    assert ws.close_code == 1000


async def http_get(port: int, target: str) -> tuple[int, str]:
    """A plain HTTP/1.1 GET on the fake's port: (status, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    headers = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
    length = int({k.strip().lower(): v for k, v in headers.items()}[b"content-length"])
    body = await reader.readexactly(length)
    writer.close()
    return int(head.split(b" ", 2)[1]), body.decode()


async def test_inject_applies_to_open_connections() -> None:
    async with asyncio.timeout(5), await serve() as server:
        ws = await started(server.url)
        server.inject(parse_fault("close"))
        await ends_with_expiry(ws)
        assert server.connections[0].faults == ["close"]


async def test_inject_for_a_connection_not_yet_open_waits_for_it() -> None:
    async with asyncio.timeout(5), await serve() as server:
        server.inject(parse_fault("2/close"))
        first = await started(server.url)
        await first.send(json.dumps({"type": "session.close"}))
        assert (await next_event(first))["reason"] == "close_requested"  # the fault skipped connection 1
        await first.close()
        second = await started(server.url)
        await ends_with_expiry(second)
        assert [c.faults for c in server.connections] == [[], ["2/close"]]


async def test_fault_endpoint_injects_valid_specs_and_rejects_bad_ones() -> None:
    async with asyncio.timeout(5), await serve() as server:
        ws = await started(server.url)
        assert await http_get(server.port, "/_fault?spec=bogus") == (
            400,
            "unknown fault 'bogus' (known: " + ", ".join(k.value for k in FaultKind) + ")\n",
        )
        status, body = await http_get(server.port, "/_fault?spec=" + quote("burst"))
        assert (status, body) == (400, "fault burst needs a value, e.g. burst:4\n")
        assert (await http_get(server.port, "/_fault"))[0] == 400
        assert server.connections[0].faults == []
        assert await http_get(server.port, "/_connections") == (200, '{"open": [1]}\n')
        assert await http_get(server.port, "/_fault?spec=" + quote("1/close")) == (200, "ok\n")
        await ends_with_expiry(ws)
        assert server.connections[0].faults == ["1/close"]


async def test_refuse_answers_503_to_the_nth_connection_only() -> None:
    async with asyncio.timeout(5), await serve(faults=[parse_fault("2/refuse")]) as server:
        first = await started(server.url)
        with pytest.raises(websockets.InvalidStatus) as info:
            await connect(server.url, additional_headers=AUTH)
        assert info.value.response.status_code == 503
        third = await started(server.url)
        await first.close()
        await third.close()
        assert [c.index for c in server.connections] == [0, 1, 2]
        assert server.connections[1].faults == ["refuse"]


async def test_refuse_through_the_fault_endpoint_applies_to_later_connections() -> None:
    async with asyncio.timeout(5), await serve() as server:
        assert await http_get(server.port, "/_fault?spec=refuse") == (200, "ok\n")
        for _ in range(2):
            with pytest.raises(websockets.InvalidStatus) as info:
                await connect(server.url, additional_headers=AUTH)
            assert info.value.response.status_code == 503
        assert [c.faults for c in server.connections] == [["refuse"], ["refuse"]]


async def test_abrupt_close_drops_the_connection_without_a_close_frame() -> None:
    async with asyncio.timeout(5), await serve() as server:
        ws = await started(server.url)
        assert await http_get(server.port, "/_fault?spec=abrupt_close") == (200, "ok\n")
        with pytest.raises(websockets.ConnectionClosedError):
            await ws.recv()
        assert ws.protocol.close_rcvd is None and ws.close_code == 1006
        assert server.connections[0].faults == ["abrupt_close"]


async def test_a_long_running_fake_keeps_only_the_open_connections_records_and_still_counts_them() -> None:
    """`keep_records = False` (serve's embedded echo, `fake-provider`): a finished connection's record goes (a
    fake that answers for weeks must not grow by one a call), and fault specs still count every connection."""
    faults = [parse_fault("3/refuse"), parse_fault("4/close")]
    async with asyncio.timeout(5), await serve(faults=faults) as server:
        server.keep_records = False
        for index in range(2):
            ws = await started(server.url)
            assert server.connections[-1].index == index  # an open connection's record is there
            await ws.close()
        with pytest.raises(websockets.InvalidStatus) as info:  # the third: refused, and not recorded
            await connect(server.url, additional_headers=AUTH)
        assert info.value.response.status_code == 503
        fourth = await started(server.url)
        assert server.connections[-1].index == 3
        await ends_with_expiry(fourth)  # the fault for connection 4 reached the fourth
    assert server.connections == []  # closed: every handler has ended, and none left its record
