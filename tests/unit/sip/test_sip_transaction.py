"""RFC 3261 §17 transactions on virtual time: every timer, retransmission schedules on UDP and none on TCP,
ACK for non-2xx, Timer H, the §13.3.1.4 2xx retransmission, matching (RFC 3261 and RFC 2543), floods."""

from __future__ import annotations

from rtp.units import NS_PER_MS as MS
from sip.core.message import Request, Response, make_response, parse
from sip.core.server_transaction import ServerInviteTransaction
from sip.core.transaction import (
    AckTimeout,
    ResponseReceived,
    Scheduler,
    State,
    Timed,
    TimerConfig,
    Transaction,
    TransactionTimeout,
    Transmit,
)
from sip.core.transaction_layer import TransactionLayer

S = 1000 * MS
PEER = ("192.0.2.10", 5060)


def request(
    method: str = "INVITE",
    branch: str = "z9hG4bKabc",
    *,
    to_tag: str = "",
    cseq: int = 1,
    via_host: str = "192.0.2.10:5060",
    cseq_method: str | None = None,
) -> Request:
    to = "<sip:bob@example.com>" + (f";tag={to_tag}" if to_tag else "")
    text = (
        f"{method} sip:bob@example.com SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {via_host};branch={branch}\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:alice@example.com>;tag=from1\r\n"
        f"To: {to}\r\n"
        "Call-ID: call-1@example.com\r\n"
        f"CSeq: {cseq} {cseq_method or method}\r\n"
        "Content-Length: 0\r\n\r\n"
    )
    message = parse(text.encode())
    assert isinstance(message, Request)
    return message


def run(layer: TransactionLayer, until: int, start: int = 0) -> list[tuple[int, Transmit]]:
    """Fire every timer up to `until`; the transmissions with the time they left (bounded loop)."""
    sent = [(start, t) for t in layer.transmits()]
    for _ in range(10_000):
        deadline = layer.next_deadline()
        if deadline is None or deadline > until:
            return sent
        layer.handle_timer(deadline)
        sent.extend((deadline, t) for t in layer.transmits())
    raise AssertionError("timer loop did not settle")


def state(tx: Transaction) -> State:
    """The state, read through a call (mypy narrows `tx.state` after a first comparison)."""
    return tx.state


def times(sent: list[tuple[int, Transmit]]) -> list[float]:
    return [round(t / S, 3) for t, _ in sent]


# --- the scheduler ---


class _Obj(Timed):
    def __init__(self) -> None:
        super().__init__()
        self.fired: list[int] = []

    def fire(self, now: int) -> None:
        self.fired.append(now)


def test_scheduler_rearm_replaces_the_old_deadline_and_disarm_removes_it() -> None:
    sched = Scheduler()
    a, b = _Obj(), _Obj()
    a.deadline, b.deadline = 10, 20
    sched.update(a)
    sched.update(b)
    a.deadline = 30
    sched.update(a)  # the entry at 10 is stale now
    assert sched.next_deadline() == 20
    b.deadline = None
    sched.update(b)
    assert sched.next_deadline() == 30
    assert sched.pop_due(29) == []
    assert sched.pop_due(30) == [a]
    assert sched.next_deadline() is None


# --- client INVITE (§17.1.1) ---


def test_timer_a_doubles_on_udp_until_timer_b_times_out_at_64_t1() -> None:
    layer = TransactionLayer()
    tx = layer.send_request(request(), PEER, "udp", 0)
    sent = run(layer, 40 * S)
    assert times(sent) == [0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5]  # Timer A: T1, 2T1, 4T1, ... (no T2 cap)
    events = layer.events()
    assert events == [TransactionTimeout(tx, "B")]
    assert state(tx) is State.TERMINATED and len(layer) == 0


def test_no_retransmission_over_tcp_but_timer_b_still_fires() -> None:
    layer = TransactionLayer()
    tx = layer.send_request(request(), PEER, "tcp", 0)
    sent = run(layer, 40 * S)
    assert times(sent) == [0]
    assert layer.events() == [TransactionTimeout(tx, "B")]
    assert layer.next_deadline() is None


def test_t1_is_configurable_and_scales_every_timer() -> None:
    layer = TransactionLayer(TimerConfig(t1=100 * MS, t2=400 * MS, t4=500 * MS))
    tx = layer.send_request(request(), PEER, "udp", 0)
    sent = run(layer, 10 * S)
    assert times(sent) == [0, 0.1, 0.3, 0.7, 1.5, 3.1, 6.3]
    assert layer.events() == [TransactionTimeout(tx, "B")]  # fired at 6.4 s
    assert state(tx) is State.TERMINATED


def test_provisional_stops_timer_a_and_a_non_2xx_final_is_acked_in_the_transaction() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.send_request(req, PEER, "udp", 0)
    layer.transmits()
    assert layer.receive_response(make_response(req, 180, to_tag="t1"), 100 * MS)
    assert [type(e) for e in layer.events()] == [ResponseReceived]
    assert state(tx) is State.PROCEEDING and tx.timer("A") is None and tx.timer("B") is None
    busy = make_response(req, 486, to_tag="t1")
    assert layer.receive_response(busy, 2 * S)
    (ack,) = layer.transmits()
    ack_msg = parse(ack.data)
    assert isinstance(ack_msg, Request) and ack_msg.method == "ACK"
    assert ack_msg.headers.get("Via") == req.headers.get("Via")  # same branch: same transaction
    assert ack_msg.headers.get("To") == "<sip:bob@example.com>;tag=t1"
    assert ack_msg.headers.get("CSeq") == "1 ACK"
    assert [e.response.status for e in layer.events() if isinstance(e, ResponseReceived)] == [486]
    assert state(tx) is State.COMPLETED
    # a retransmitted final: ACK again, not reported again
    assert layer.receive_response(busy, 3 * S)
    assert [parse(t.data).method for t in layer.transmits()] == ["ACK"]  # type: ignore[union-attr]
    assert layer.events() == []
    # Timer D: 32 s on UDP
    assert tx.timer("D") == 2 * S + 32 * S
    run(layer, 34 * S)
    assert state(tx) is State.TERMINATED and len(layer) == 0


def test_non_2xx_over_tcp_acks_and_terminates_at_once() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.send_request(req, PEER, "tcp", 0)
    layer.transmits()
    layer.receive_response(make_response(req, 603, to_tag="t"), S)
    assert len(layer.transmits()) == 1  # the ACK
    assert state(tx) is State.TERMINATED and len(layer) == 0  # Timer D = 0


def test_2xx_goes_to_accepted_and_its_retransmissions_reach_the_tu_until_timer_m() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.send_request(req, PEER, "udp", 0)
    ok = make_response(req, 200, to_tag="t")
    layer.receive_response(ok, S)
    layer.receive_response(ok, 2 * S)
    assert [e.response.status for e in layer.events() if isinstance(e, ResponseReceived)] == [200, 200]
    assert state(tx) is State.ACCEPTED
    assert layer.transmits()[1:] == []  # the core sends no ACK for a 2xx: the TU does (§13.2.2.4)
    run(layer, S + 32 * S)
    assert state(tx) is State.TERMINATED


# --- client non-INVITE (§17.1.2) ---


def test_timer_e_doubles_to_t2_and_timer_f_times_out() -> None:
    layer = TransactionLayer()
    tx = layer.send_request(request("BYE", cseq=2), PEER, "udp", 0)
    sent = run(layer, 40 * S)
    assert times(sent) == [0, 0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert layer.events() == [TransactionTimeout(tx, "F")]


def test_timer_e_runs_at_t2_in_proceeding_and_timer_k_reaps_after_the_final() -> None:
    layer = TransactionLayer()
    req = request("BYE", cseq=2)
    tx = layer.send_request(req, PEER, "udp", 0)
    layer.transmits()
    layer.receive_response(make_response(req, 100), 10 * MS)
    assert state(tx) is State.PROCEEDING
    sent = run(layer, 10 * S)
    assert times(sent) == [0.5, 4.5, 8.5]  # E pending from Trying, then every T2
    layer.receive_response(make_response(req, 200), 10 * S)
    assert [e.response.status for e in layer.events() if isinstance(e, ResponseReceived)] == [100, 200]
    layer.receive_response(make_response(req, 200), 11 * S)  # retransmission: absorbed
    assert layer.events() == [] and layer.transmits() == []
    assert tx.timer("K") == 15 * S  # T4
    run(layer, 16 * S)
    assert state(tx) is State.TERMINATED


def test_non_invite_client_over_tcp_has_no_timer_e_and_no_timer_k() -> None:
    layer = TransactionLayer()
    req = request("OPTIONS")
    tx = layer.send_request(req, PEER, "tcp", 0)
    assert tx.timer("E") is None and tx.timer("F") == 32 * S
    layer.receive_response(make_response(req, 200), S)
    assert state(tx) is State.TERMINATED


# --- server INVITE (§17.2.1) ---


def test_server_invite_sends_100_at_once_and_answers_retransmissions_with_the_last_response() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.server_invite(req, PEER, "udp", 0)
    (trying,) = layer.transmits()
    assert parse(trying.data).status == 100  # type: ignore[union-attr]
    assert layer.absorb(req, 100 * MS)
    assert parse(layer.transmits()[0].data).status == 100  # type: ignore[union-attr]
    layer.respond(tx, make_response(req, 180, to_tag="t"), 200 * MS)
    layer.transmits()
    assert layer.absorb(req, 300 * MS)
    assert parse(layer.transmits()[0].data).status == 180  # type: ignore[union-attr]


def test_timer_g_retransmits_a_non_2xx_until_timer_h_without_ack() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.server_invite(req, PEER, "udp", 0)
    layer.respond(tx, make_response(req, 486, to_tag="t"), 0)
    sent = run(layer, 40 * S)
    assert times(sent) == [0, 0, 0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]  # 100, 486, then G
    assert layer.events() == [TransactionTimeout(tx, "H")]
    assert state(tx) is State.TERMINATED and len(layer) == 0


def test_ack_confirms_stops_timer_g_and_timer_i_reaps() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.server_invite(req, PEER, "udp", 0)
    layer.respond(tx, make_response(req, 486, to_tag="t"), 0)
    layer.transmits()
    ack = request("ACK", to_tag="t", cseq_method="ACK")
    assert layer.absorb(ack, 600 * MS)
    assert state(tx) is State.CONFIRMED and tx.timer("G") is None and tx.timer("H") is None
    assert layer.absorb(ack, 700 * MS)  # a retransmitted ACK is absorbed too
    assert tx.timer("I") == 5600 * MS
    assert run(layer, 10 * S) == []
    assert state(tx) is State.TERMINATED and layer.events() == []


def test_server_invite_over_tcp_no_timer_g_and_ack_terminates_at_once() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.server_invite(req, PEER, "tcp", 0)
    layer.respond(tx, make_response(req, 404, to_tag="t"), 0)
    assert tx.timer("G") is None and tx.timer("H") == 32 * S
    layer.absorb(request("ACK", to_tag="t", cseq_method="ACK"), S)
    assert state(tx) is State.TERMINATED and len(layer) == 0


def test_timer_h_fires_over_tcp_when_no_ack_comes() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.server_invite(req, PEER, "tcp", 0)
    layer.respond(tx, make_response(req, 404, to_tag="t"), 0)
    layer.transmits()
    assert run(layer, 40 * S) == []
    assert layer.events() == [TransactionTimeout(tx, "H")]


def test_2xx_moves_to_accepted_absorbs_invite_retransmissions_and_leaves_the_ack_to_the_tu() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.server_invite(req, PEER, "udp", 0)
    assert layer.respond(tx, make_response(req, 200, to_tag="t"), 0)
    layer.transmits()
    assert state(tx) is State.ACCEPTED
    assert layer.absorb(req, S) and layer.transmits() == []  # the UAS core retransmits the 2xx, not the tx
    assert not layer.absorb(request("ACK", branch="z9hG4bKother", to_tag="t", cseq_method="ACK"), S)
    assert not layer.respond(tx, make_response(req, 500), S)  # one final response only
    run(layer, 33 * S)
    assert state(tx) is State.TERMINATED  # Timer L


def test_cancel_finds_the_invite_it_cancels_and_has_its_own_transaction() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.server_invite(req, PEER, "udp", 0)
    cancel = request("CANCEL")
    assert layer.invite_for_cancel(cancel) is tx
    assert layer.match(cancel) is None  # CANCEL is a transaction of its own (§9.2)
    assert layer.invite_for_cancel(request("CANCEL", branch="z9hG4bKnope")) is None


def test_flood_of_invite_retransmissions_costs_one_transaction() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.server_invite(req, PEER, "udp", 0)
    layer.respond(tx, make_response(req, 180, to_tag="t"), 0)
    layer.transmits()
    for i in range(1000):
        assert layer.absorb(req, i * MS)
    assert len(layer) == 1
    answers = layer.transmits()
    assert len(answers) == 1000 and {t.data for t in answers} == {tx.response_data}


def test_rfc_2543_requests_match_without_a_magic_cookie_branch() -> None:
    layer = TransactionLayer()
    req = request(branch="old2543branch")
    tx = layer.server_invite(req, PEER, "udp", 0)
    assert layer.match(request(branch="old2543branch")) is tx
    layer.respond(tx, make_response(req, 486, to_tag="ours"), 0)
    assert not layer.absorb(request("ACK", branch="old2543branch", to_tag="theirs", cseq_method="ACK"), S)
    assert layer.absorb(request("ACK", branch="old2543branch", to_tag="ours", cseq_method="ACK"), S)
    assert state(tx) is State.CONFIRMED
    other = request(branch="old2543branch", via_host="192.0.2.99:5060")
    assert layer.match(other) is None  # the top Via differs


def test_the_same_branch_from_another_sent_by_is_another_transaction() -> None:
    layer = TransactionLayer()
    tx = layer.server_invite(request(), PEER, "udp", 0)
    assert layer.match(request(via_host="192.0.2.77:5060")) is None
    assert layer.match(request()) is tx


# --- non-INVITE server (§17.2.2) ---


def test_non_invite_server_timer_j_on_udp_and_none_on_tcp() -> None:
    layer = TransactionLayer()
    req = request("BYE", cseq=2, to_tag="t")
    tx = layer.server_non_invite(req, PEER, "udp", 0)
    assert layer.absorb(req, 0) and layer.transmits() == []  # Trying: nothing to repeat yet
    layer.respond(tx, make_response(req, 200), 0)
    layer.transmits()
    assert layer.absorb(req, S) and len(layer.transmits()) == 1
    assert tx.timer("J") == 32 * S
    run(layer, 33 * S)
    assert state(tx) is State.TERMINATED
    tcp = layer.server_non_invite(request("BYE", "z9hG4bKtcp", cseq=3), PEER, "tcp", 0)
    layer.respond(tcp, make_response(tcp.request, 200), 0)
    assert state(tcp) is State.TERMINATED and len(layer) == 0


# --- 2xx reliability (§13.3.1.4) ---


def test_2xx_is_retransmitted_t1_doubling_to_t2_until_ack_timeout_at_64_t1() -> None:
    layer = TransactionLayer()
    r = layer.retransmit_2xx(b"SIP/2.0 200 OK\r\n\r\n", PEER, "udp", 0)
    sent = run(layer, 40 * S)
    assert times(sent) == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert layer.events() == [AckTimeout(r)]


def test_2xx_retransmission_stops_at_the_ack_and_runs_on_tcp_too() -> None:
    layer = TransactionLayer()
    r = layer.retransmit_2xx(b"x", PEER, "tcp", 0)
    sent = run(layer, 2 * S)
    assert times(sent) == [0.5, 1.5]  # §13.3.1.4: independent of the transport
    layer.stop_2xx(r)
    assert run(layer, 40 * S) == [] and layer.events() == []
    assert not r.active


def test_server_invite_transaction_type() -> None:
    layer = TransactionLayer()
    tx = layer.server_invite(request(), PEER, "udp", 0, trying=False)
    assert isinstance(tx, ServerInviteTransaction) and layer.transmits() == []


def test_a_response_for_no_transaction_is_not_matched() -> None:
    layer = TransactionLayer()
    stray = parse(
        b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKzzz\r\nFrom: <sip:a@b>;tag=1\r\n"
        b"To: <sip:c@d>;tag=2\r\nCall-ID: x\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n"
    )
    assert isinstance(stray, Response)
    assert not layer.receive_response(stray, 0)


def test_a_retransmission_flood_does_not_grow_the_timer_heap() -> None:
    layer = TransactionLayer()
    req = request()
    tx = layer.server_invite(req, PEER, "udp", 0)
    layer.respond(tx, make_response(req, 486, to_tag="t"), 0)
    before = len(layer._sched)
    for i in range(500):
        layer.absorb(req, i * MS)  # each answered with the 486; Timer G/H unchanged
    assert len(layer._sched) == before
