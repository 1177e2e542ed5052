"""Dialling safety: one Idempotency-Key, one call (bridge/server/idempotency.py, `Server.dial(key=)`, `POST /calls`),
and the application's headers on the outbound INVITE, checked against injection (sip/core/outbound.py
`check_headers`)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from bridge.server.http import StatusServer
from bridge.server.idempotency import DialKeys, KeyReused, check_key
from rtp.units import NS_PER_S as SECOND
from sip.core.message import Request, serialize
from sip.core.outbound import check_headers
from sip.core.ua import UaConfig, UserAgent
from tests.support.dial_safety import _post, _server
from tests.support.sip_uac import LOCAL as UAC_LOCAL
from tests.support.sip_uac import TARGET, Callee

# --- one key, one call ----------------------------------------------------------------------------------------


def test_a_repeated_key_returns_the_first_call_and_dials_once() -> None:
    async def go() -> None:
        server, dialer = _server()
        first = await server.dial("sip:alice@127.0.0.1", key="order-17")
        again = await server.dial("sip:alice@127.0.0.1", key="order-17")
        other = await server.dial("sip:alice@127.0.0.1", key="order-18")
        assert first == again == "out-1" and other == "out-2"
        assert len(dialer.asked) == 2
        assert b"parlora_idempotent_replays_total 1.0" in server.observer.metrics.render()

    asyncio.run(go())


def test_a_repeat_while_the_first_dial_is_in_flight_waits_for_it_and_gets_the_same_call() -> None:
    async def go() -> None:
        server, dialer = _server()
        dialer.gate.clear()
        first = asyncio.create_task(server.dial("sip:alice@127.0.0.1", key="k"))
        second = asyncio.create_task(server.dial("sip:alice@127.0.0.1", key="k"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not second.done()  # it waits for the first's result
        dialer.gate.set()
        assert await first == await second == "out-1"
        assert len(dialer.asked) == 1

    asyncio.run(go())


def test_a_key_with_another_request_is_refused_and_places_nothing() -> None:
    async def go() -> None:
        server, dialer = _server()
        await server.dial("sip:alice@127.0.0.1", key="k")
        with pytest.raises(KeyReused, match="different request"):
            await server.dial("sip:bob@127.0.0.1", key="k")
        with pytest.raises(KeyReused):
            await server.dial("sip:alice@127.0.0.1", key="k", headers={"X-Campaign": "7"})
        assert len(dialer.asked) == 1

    asyncio.run(go())


def test_a_failed_first_dial_frees_its_key_and_its_waiters_get_the_error() -> None:
    async def go() -> None:
        keys, calls = DialKeys(), []
        gate = asyncio.Event()

        async def failing() -> str:
            calls.append(1)
            await gate.wait()
            raise ValueError("no such number")

        async def placing() -> str:
            calls.append(1)
            return "call-9"

        first = asyncio.create_task(keys.once("k", "a", 0, failing))
        waiter = asyncio.create_task(keys.once("k", "a", 0, placing))
        await asyncio.sleep(0)
        gate.set()
        for task in (first, waiter):
            with pytest.raises(ValueError, match="no such number"):
                await task
        assert len(calls) == 1 and len(keys) == 0
        assert (await keys.once("k", "a", 1, placing)).call_id == "call-9"  # nothing was placed: a retry may

    asyncio.run(go())


def test_keys_are_forgotten_after_their_time_and_beyond_their_count() -> None:
    async def go() -> None:
        keys, placed = DialKeys(ttl_s=60, max_keys=2), []

        async def place() -> str:
            placed.append(1)
            return f"call-{len(placed)}"

        assert (await keys.once("a", 1, 0, place)).call_id == "call-1"
        assert (await keys.once("a", 1, 59 * SECOND, place)).replayed
        assert (await keys.once("a", 1, 60 * SECOND, place)).call_id == "call-2"  # expired: a new call
        await keys.once("b", 1, 61 * SECOND, place)
        await keys.once("a", 1, 61 * SECOND, place)  # a used last: b is the least recently used
        await keys.once("c", 1, 62 * SECOND, place)
        assert len(keys) == 2
        assert (await keys.once("a", 1, 63 * SECOND, place)).replayed
        assert not (await keys.once("b", 1, 63 * SECOND, place)).replayed

    asyncio.run(go())


def test_a_key_is_1_to_255_printable_ascii_characters() -> None:
    assert check_key("a" * 255) == "a" * 255
    for bad in ("", "a" * 256, "tab\there", "line\r\nX-Evil: 1", "caf\u00e9", "nul\0"):
        with pytest.raises(ValueError, match="printable ASCII"):
            check_key(bad)


# --- POST /calls ------------------------------------------------------------------------------------------------


def test_post_calls_with_a_repeated_key_answers_200_with_the_first_calls_body() -> None:
    async def go() -> None:
        server, dialer = _server()
        http = await StatusServer(lambda: {}, dial=server._dial_from_http).start("127.0.0.1", 0)
        try:
            body = {"to": "sip:alice@127.0.0.1", "headers": {"X-Campaign": "7"}}
            first = await _post(http.port, body, {"Idempotency-Key": "retry-me"})
            again = await _post(http.port, body, {"Idempotency-Key": "retry-me"})
            assert first == (202, {"call": "out-1", "to": "sip:alice@127.0.0.1"})
            assert again == (200, first[1])
            assert len(dialer.asked) == 1 and dialer.asked[0]["headers"] == (("X-Campaign", "7"),)
            status, answer = await _post(
                http.port, {"to": "sip:bob@127.0.0.1"}, {"Idempotency-Key": "retry-me"}
            )
            assert status == 422 and "different request" in answer["error"]
            status, answer = await _post(http.port, body, {"Idempotency-Key": "x" * 256})
            assert status == 400 and "printable ASCII" in answer["error"]
            evil = {"to": "sip:alice@127.0.0.1", "headers": {"X-A": "1\r\nVia: SIP/2.0/UDP evil"}}
            status, answer = await _post(http.port, evil, {})
            assert status == 400 and "CR, LF" in answer["error"]
            status, answer = await _post(http.port, {"to": "sip:a@127.0.0.1", "headers": {"Via": "x"}}, {})
            assert status == 400 and "may not be set" in answer["error"]
            assert len(dialer.asked) == 1  # nothing refused was dialled
        finally:
            await http.close()

    asyncio.run(go())


# --- headers on the INVITE --------------------------------------------------------------------------------------


def _invite(headers: Any) -> Request:
    ua = UserAgent(UaConfig(host="192.0.2.1", port=5060), rng=random.Random(4))
    callee = Callee(ua)
    ua.dial(TARGET, UAC_LOCAL, 0, headers=headers)
    (invite,) = callee.collect()
    assert isinstance(invite, Request)
    return invite


def test_the_invite_carries_the_applications_headers_in_order_before_its_body() -> None:
    given = (
        ("X-Campaign", "spring-7"),
        ("P-Asserted-Identity", "<sip:+4930123@carrier.example>"),
        ("Identity", "eyJhbGciOiJFUzI1NiJ9.e30.sig;info=<https://cert.example/x.pem>;alg=ES256;ppt=shaken"),
        ("X-Account", "42"),
    )
    invite = _invite(given)
    items = list(invite.headers.items())
    at = items.index(given[0])
    assert items[at : at + len(given)] == list(given)  # in the order given
    assert items[at + len(given)][0] == "Content-Type"  # after the UA's own headers, before the body's
    assert [name for name, _ in items].count("Via") == 1
    wire = serialize(invite)
    assert b"\r\nX-Campaign: spring-7\r\nP-Asserted-Identity: <sip:+4930123@carrier.example>\r\n" in wire


def test_header_injection_and_the_uas_own_headers_are_refused_never_dropped() -> None:
    for bad, why in (
        ({"X-A": "1\r\nVia: SIP/2.0/UDP evil"}, "CR, LF"),
        ({"X-A": "1\nX-B: 2"}, "CR, LF"),
        ({"X-A": "nul\0"}, "CR, LF"),
        ({"X-A\r\nVia": "1"}, "token"),
        ({"X A": "1"}, "token"),
        ({"": "1"}, "token"),
        ({"X-A": "v" * 1025}, "over 1024"),
        ({f"X-{i}": "1" for i in range(17)}, "at most 16"),
    ):
        with pytest.raises(ValueError, match=why):
            check_headers(bad)
    for owned in (
        "Via",
        "From",
        "To",
        "Call-ID",
        "CSeq",
        "Contact",
        "Max-Forwards",
        "Content-Type",
        "Content-Length",
        "Route",
        "Record-Route",
        "Authorization",
        "Proxy-Authorization",
        "Require",
        "f",
        "X-",
    ):
        with pytest.raises(ValueError, match="may not be set"):
            check_headers({owned: "x"})
        with pytest.raises(ValueError, match="may not be set"):
            _invite(((owned, "x"),))  # the SIP core refuses it too: nothing is sent
    assert (
        check_headers({"X-A": "v" * 1024, "diversion": "<sip:1@x>;reason=unconditional"})[1][0] == "diversion"
    )
