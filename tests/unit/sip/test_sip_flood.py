"""What a request flood leaves behind in the SIP core, on virtual time: the transaction table and the timer
heap are empty once the RFC 3261 timers have run out, the table stays bounded while the flood goes on, and
each request the core keeps for its retransmissions costs little (the response's bytes, not the parsed
request). tests/bench/flood.py measures the same on a live `serve` (RSS beside the counts)."""

from __future__ import annotations

import gc
import tracemalloc

from rtp.units import NS_PER_MS as MS
from sip.core.message import Request, make_response, parse
from sip.core.transaction import Scheduler, ServerTransaction, State
from sip.core.transaction_layer import TransactionLayer
from sip.core.ua import UaConfig, UserAgent

S = 1000 * MS
T1 = 500 * MS
SOURCE = ("192.0.2.10", 5060)


def request(
    method: str, i: int, *, via_host: str = "192.0.2.10:5060", cseq_method: str | None = None
) -> Request:
    text = (
        f"{method} sip:bridge@192.0.2.1 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {via_host};branch=z9hG4bKflood{i}\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:flood@192.0.2.10>;tag=f{i}\r\n"
        f"To: <sip:bridge@192.0.2.1>{';tag=ours' if method == 'ACK' else ''}\r\n"
        f"Call-ID: flood-{i}@192.0.2.10\r\n"
        f"CSeq: 1 {cseq_method or method}\r\n"
        "Content-Length: 0\r\n\r\n"
    )
    message = parse(text.encode())
    assert isinstance(message, Request)
    return message


def wire(method: str, i: int) -> bytes:
    return (
        f"{method} sip:bridge@192.0.2.1 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bKwire{i};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:flood@192.0.2.10>;tag=f{i}\r\n"
        "To: <sip:bridge@192.0.2.1>\r\n"
        f"Call-ID: wire-{i}@192.0.2.10\r\n"
        f"CSeq: 1 {method}\r\n"
        "User-Agent: flood\r\n"
        "Accept: application/sdp\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


def run(layer: TransactionLayer, until: int) -> None:
    for _ in range(100_000):
        deadline = layer.next_deadline()
        if deadline is None or deadline > until:
            return
        layer.handle_timer(deadline)
        layer.transmits()
        layer.events()
    raise AssertionError("timer loop did not settle")


def dead_entries(sched: Scheduler) -> int:
    """Heap entries that still hold a transaction that has ended."""
    return sum(1 for _, _, obj in sched._heap if isinstance(obj, ServerTransaction) and obj.terminated)


def live_entries(sched: Scheduler) -> int:
    """Heap entries that are their object's current deadline."""
    return sum(1 for when, seq, obj in sched._heap if obj._sched_seq == seq and obj.deadline == when)


def test_after_a_flood_the_table_is_empty_and_the_timer_heap_holds_no_dead_transaction() -> None:
    """OPTIONS over UDP answered 200 (Timer J, 64·T1) from 0 s, then INVITEs over TCP answered 486 and ACKed
    at once from 20 s (no Timer I on a reliable transport: each ends at its ACK, its Timer H, due at 52 s,
    cleared), and a trunk's keep-alive OPTIONS every second throughout. Past Timer J of the flood (32 s) the
    flood's transactions have all ended: the table holds the keep-alives' alone, and no heap entry still
    holds an ended transaction (the cleared Timer H entries, behind the keep-alives' live ones, held every
    ACKed INVITE transaction until 52 s)."""
    layer = TransactionLayer()
    n = 2000
    flood: list[ServerTransaction] = []
    keepalives: list[ServerTransaction] = []

    def keepalive(second: int) -> None:
        req = request("OPTIONS", 100_000 + second, via_host="198.51.100.7:5060")
        tx = layer.server_non_invite(req, SOURCE, "udp", second * S)
        layer.respond(tx, make_response(req, 200, to_tag="ours"), second * S)
        keepalives.append(tx)

    for i in range(n):
        now = i * MS
        req = request("OPTIONS", i)
        tx = layer.server_non_invite(req, SOURCE, "udp", now)
        layer.respond(tx, make_response(req, 200, to_tag="ours"), now)
        flood.append(tx)
    for second in range(1, 20):
        run(layer, second * S)
        keepalive(second)
    for i in range(n):
        now = 20 * S + i * MS
        req = request("INVITE", i)
        tx = layer.server_invite(req, SOURCE, "tcp", now, trying=False)
        layer.respond(tx, make_response(req, 486, to_tag="ours"), now)
        assert layer.absorb(request("ACK", i, cseq_method="ACK"), now)
        assert tx.terminated
        flood.append(tx)
    layer.transmits()
    for second in range(23, 36):  # past the last flood OPTIONS' Timer J
        run(layer, second * S)
        keepalive(second)
    assert all(tx.terminated for tx in flood)
    assert len(layer) == sum(1 for tx in keepalives if not tx.terminated) == 29  # 32, those of 1-3 s ended
    assert dead_entries(layer._sched) == 0
    run(layer, 35 * S + 64 * T1)
    assert len(layer) == 0 and len(layer._sched) == 0 and layer.next_deadline() is None


def test_the_timer_heap_never_holds_more_stale_entries_than_live_ones() -> None:
    """While the flood goes on, transactions ACKed early leave their cleared Timer H behind; the heap keeps
    at most as many of those as it has armed deadlines."""
    layer = TransactionLayer()
    for i in range(3000):
        now = i * MS
        req = request("INVITE", i)
        tx = layer.server_invite(req, SOURCE, "tcp", now, trying=False)  # reliable: ACK ends it at once
        layer.respond(tx, make_response(req, 486, to_tag="ours"), now)
        layer.absorb(request("ACK", i, cseq_method="ACK"), now)
        assert tx.terminated
        assert len(layer._sched) <= 2 * live_entries(layer._sched)
    assert len(layer) == 0 and len(layer._sched) == 0


def test_the_table_stays_bounded_under_a_flood_oldest_first_and_counted() -> None:
    layer = TransactionLayer(max_lingering=100)
    n = 1000
    for i in range(n):
        now = i * MS
        req = request("OPTIONS", i, via_host=f"192.0.2.{10 + i % 4}:5060")  # a few sources
        tx = layer.server_non_invite(req, SOURCE, "udp", now)
        layer.respond(tx, make_response(req, 200, to_tag="ours"), now)
        assert len(layer) <= 100 and layer.lingering <= 100
        assert len(layer._sched) <= 2 * 100
    assert layer.evicted == n - 100
    layer.transmits()
    newest = request("OPTIONS", n - 1, via_host=f"192.0.2.{10 + (n - 1) % 4}:5060")
    assert layer.absorb(newest, n * MS) and len(layer.transmits()) == 1  # still answered from the table
    assert layer.match(request("OPTIONS", 0)) is None  # the oldest was forgotten
    run(layer, n * MS + 64 * T1)
    assert len(layer) == 0 and len(layer._sched) == 0


def test_transactions_waiting_for_the_answer_and_accepted_invites_are_never_evicted() -> None:
    layer = TransactionLayer(max_lingering=10)
    waiting = layer.server_non_invite(request("BYE", 10_000), SOURCE, "udp", 0)
    call = request("INVITE", 10_001)
    accepted = layer.server_invite(call, SOURCE, "udp", 0)
    layer.respond(accepted, make_response(call, 200, to_tag="ours"), 0)
    for i in range(100):
        req = request("OPTIONS", i)
        tx = layer.server_non_invite(req, SOURCE, "udp", i * MS)
        layer.respond(tx, make_response(req, 200, to_tag="ours"), i * MS)
    assert layer.evicted == 90
    assert not waiting.terminated and layer.match(request("BYE", 10_000)) is waiting
    assert accepted.state is State.ACCEPTED and layer.match(call) is accepted


def test_the_ua_counts_what_its_full_table_forgot_and_its_timers_end_the_rest() -> None:
    ua = UserAgent(UaConfig(host="192.0.2.1", max_lingering_transactions=50))
    for i in range(500):
        ua.receive(wire("OPTIONS", i), SOURCE, "udp", i * MS)
        assert len(ua.transmits()) == 1
        assert ua.transactions <= 50
    assert ua.stats["transactions_evicted"] == 450
    for _ in range(100):
        deadline = ua.next_deadline()
        if deadline is None:
            break
        ua.handle_timer(deadline)
    assert ua.transactions == 0 and ua.next_deadline() is None and len(ua._layer._sched) == 0


def test_a_request_kept_for_its_retransmissions_costs_its_response_bytes_not_its_parse() -> None:
    """Measured through the UA (parse, Via stamping, the 200 with Allow/Accept/Supported/Contact): a
    Completed OPTIONS transaction held ~6.0 KB with the parsed request and response, ~1.3 KB without."""
    ua = UserAgent(UaConfig(host="192.0.2.1"))
    n = 1000
    data = [wire("OPTIONS", i) for i in range(n)]
    ua.receive(wire("OPTIONS", n), SOURCE, "udp", 0)  # caches and counters in place before measuring
    ua.transmits()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, datagram in enumerate(data):
            ua.receive(datagram, SOURCE, "udp", i * MS)
            ua.transmits()
        gc.collect()
        per_transaction = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert ua.transactions == n + 1
    assert per_transaction < 2000, per_transaction


def test_a_request_the_tu_never_answers_is_forgotten_after_64_t1() -> None:
    """Only a fault in the TU leaves a request unanswered; its transaction had no deadline and stayed for
    ever. After 64·T1 (the client's Timer F has ended its side) it is gone; an answered one is unaffected."""
    layer = TransactionLayer()
    forgotten = layer.server_non_invite(request("UPDATE", 1), SOURCE, "udp", 0)
    provisional = layer.server_non_invite(request("BYE", 2), SOURCE, "udp", 0)
    layer.respond(provisional, make_response(provisional.request, 100), 0)
    answered_late = layer.server_non_invite(request("INFO", 3), SOURCE, "udp", 0)
    layer.respond(answered_late, make_response(answered_late.request, 200, to_tag="ours"), 31 * S)
    layer.transmits()
    run(layer, 64 * T1)
    assert forgotten.terminated and provisional.terminated and not answered_late.terminated
    assert len(layer) == 1 and layer.transmits() == []  # ended silently
    run(layer, 31 * S + 64 * T1)
    assert len(layer) == 0 and len(layer._sched) == 0
