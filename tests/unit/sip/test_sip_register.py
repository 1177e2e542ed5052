"""The registration client (sip.core.register) on virtual time: register, refresh before expiry, digest challenge,
bad credentials, the backoff schedule, 423, un-register; and carried by the UserAgent's transactions."""

from __future__ import annotations

import random

import pytest

from rtp.units import NS_PER_S as S
from sip.core.auth import AuthOk, Credentials, DigestServer
from sip.core.message import Request, Response, make_response, parse, serialize
from sip.core.register import Registration, RegistrationConfig
from sip.core.ua import UaConfig, UserAgent

AOR = "sip:1001@pbx.example.com"
CONFIG = RegistrationConfig(aor=AOR, contact="sip:1001@203.0.113.5:5060", via_host="203.0.113.5")


class FixedRandom(random.Random):
    """random() always `value` (the jitter factor becomes 1 - jitter·value); bits from a seeded source."""

    def __init__(self, value: float) -> None:
        super().__init__(1)
        self.value = value

    def random(self) -> float:
        return self.value


def one(reg: Registration) -> Request:
    (out,) = reg.requests()
    return out.request


def ok(request: Request, expires: int | None = None, extra: tuple[tuple[str, str], ...] = ()) -> Response:
    contact = request.headers.get("Contact") or ""
    if expires is not None:
        contact = contact.split(";", 1)[0] + f";expires={expires}"
    return make_response(request, 200, to_tag="reg1", headers=(("Contact", contact), *extra))


def test_register_request_shape_and_registered_status() -> None:
    reg = Registration(CONFIG, rng=random.Random(1))
    reg.start(0)
    (out,) = reg.requests()
    r = out.request
    assert out.destination == ("pbx.example.com", 5060) and out.transport == "udp"
    assert r.method == "REGISTER" and r.uri == "sip:pbx.example.com"
    assert r.headers.get("To") == f"<{AOR}>" and (r.headers.get("From") or "").startswith(f"<{AOR}>;tag=")
    assert r.headers.get("Contact") == "<sip:1001@203.0.113.5:5060>;expires=3600"
    assert r.headers.get("Expires") == "3600" and r.headers.get("CSeq") == "1 REGISTER"
    assert "branch=z9hG4bK" in (r.headers.get("Via") or "")
    assert parse(serialize(r)) == r  # well-formed on the wire
    assert reg.status(0).state == "registering"
    reg.receive_response(ok(r, expires=600), 1 * S)
    st = reg.status(1 * S)
    assert st.state == "registered" and st.expires_at == 601 * S and st.granted_expires_s == 600
    assert st.last_error is None


def test_refresh_at_half_the_granted_expiry_and_same_call_id() -> None:
    reg = Registration(CONFIG, rng=random.Random(1))
    reg.start(0)
    first = one(reg)
    reg.receive_response(ok(first, expires=120), 0)
    assert reg.next_deadline() == 60 * S
    reg.handle_timer(59 * S)
    assert reg.requests() == []
    reg.handle_timer(60 * S)
    refresh = one(reg)
    assert refresh.headers.get("Call-ID") == first.headers.get("Call-ID")
    assert refresh.headers.get("CSeq") == "2 REGISTER"
    assert refresh.headers.get("Via") != first.headers.get("Via")
    assert reg.status(60 * S).state == "registered"  # the binding is still live while refreshing
    reg.receive_response(ok(refresh, expires=120), 61 * S)
    assert reg.status(61 * S).expires_at == 181 * S and reg.next_deadline() == 121 * S


def test_short_expiry_keeps_a_margin_and_expires_header_is_used() -> None:
    reg = Registration(CONFIG, rng=random.Random(1))
    reg.start(0)
    r = one(reg)
    # no expires on our Contact: the Expires header counts
    response = make_response(
        r, 200, to_tag="x", headers=(("Contact", "<sip:other@192.0.2.1>;expires=999"), ("Expires", "14"))
    )
    reg.receive_response(response, 0)
    assert reg.status(0).granted_expires_s == 14
    assert reg.next_deadline() == 4 * S  # min(7 s, 14 - 10 s margin)


def test_challenge_then_authenticated_retry_verified_by_a_real_digest_server() -> None:
    server = DigestServer("pbx", [Credentials("1001", "pw")], secret=b"k" * 32)
    reg = Registration(CONFIG, credentials=Credentials("1001", "pw"), rng=random.Random(2))
    reg.start(0)
    r1 = one(reg)
    assert "Authorization" not in r1.headers
    reg.receive_response(make_response(r1, 401, to_tag="a", headers=server.challenge(0)), S)
    r2 = one(reg)
    assert r2.headers.get("CSeq") == "2 REGISTER" and r2.headers.get("Call-ID") == r1.headers.get("Call-ID")
    assert server.verify("REGISTER", r2.uri, r2.headers.get_fields("Authorization"), S) == AuthOk("1001")
    reg.receive_response(ok(r2, expires=300), 2 * S)
    assert reg.status(2 * S).state == "registered"
    # the refresh carries credentials pre-emptively, with nc 2
    reg.handle_timer(reg.next_deadline() or 0)
    r3 = one(reg)
    assert "nc=00000002" in (r3.headers.get("Authorization") or "")
    assert server.verify("REGISTER", r3.uri, r3.headers.get_fields("Authorization"), 152 * S) == AuthOk(
        "1001"
    )


def test_second_401_with_the_same_nonce_is_bad_credentials_then_backoff() -> None:
    reg = Registration(CONFIG, credentials=Credentials("1001", "wrong"), rng=FixedRandom(0.0))
    reg.start(0)
    challenge = (("WWW-Authenticate", 'Digest realm="pbx", nonce="n1", qop="auth"'),)
    r1 = one(reg)
    reg.receive_response(make_response(r1, 401, to_tag="a", headers=challenge), S)
    r2 = one(reg)
    reg.receive_response(make_response(r2, 401, to_tag="a", headers=challenge), 2 * S)
    assert reg.requests() == []
    st = reg.status(2 * S)
    assert st.state == "failed" and st.last_error == "bad credentials" and st.last_status == 401
    assert st.next_attempt_at == 4 * S  # backoff_initial 2 s, jitter factor 1


def test_stale_nonce_retries_without_failing() -> None:
    reg = Registration(CONFIG, credentials=Credentials("1001", "pw"), rng=random.Random(2))
    reg.start(0)
    r1 = one(reg)
    reg.receive_response(
        make_response(r1, 401, to_tag="a", headers=(("WWW-Authenticate", 'Digest realm="pbx", nonce="n1"'),)),
        0,
    )
    r2 = one(reg)
    stale = (("WWW-Authenticate", 'Digest realm="pbx", nonce="n2", stale=true'),)
    reg.receive_response(make_response(r2, 401, to_tag="a", headers=stale), 0)
    r3 = one(reg)
    assert 'nonce="n2"' in (r3.headers.get("Authorization") or "") and reg.status(0).state == "registering"


def test_401_without_credentials_fails_with_a_reason() -> None:
    reg = Registration(CONFIG, rng=random.Random(1))
    reg.start(0)
    r = one(reg)
    reg.receive_response(
        make_response(r, 401, to_tag="a", headers=(("WWW-Authenticate", 'Digest realm="p", nonce="n"'),)), 0
    )
    assert reg.status(0).state == "failed" and "no credentials" in (reg.status(0).last_error or "")


@pytest.mark.parametrize(
    "jitter_draw, expected",
    [(0.0, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]), (1.0, [1, 2, 4, 8, 16, 32, 64, 128, 150, 150])],
)
def test_backoff_schedule_is_exponential_bounded_and_jittered(
    jitter_draw: float, expected: list[int]
) -> None:
    reg = Registration(CONFIG, rng=FixedRandom(jitter_draw))
    reg.start(0)
    now = 0
    delays = []
    for _ in range(len(expected)):
        r = one(reg)
        reg.receive_response(make_response(r, 503, to_tag="a"), now)
        st = reg.status(now)
        assert st.state == "failed" and st.last_error == "503 Service Unavailable"
        deadline = reg.next_deadline()
        assert deadline is not None
        delays.append((deadline - now) // S)
        now = deadline
        reg.handle_timer(now)
    assert delays == expected
    assert reg.status(now).failures == len(expected)


def test_timeout_fails_and_a_later_success_resets_the_backoff() -> None:
    reg = Registration(CONFIG, rng=FixedRandom(0.0))
    reg.start(0)
    one(reg)
    reg.request_failed(32 * S)
    st = reg.status(32 * S)
    assert st.state == "failed" and "timeout" in (st.last_error or "") and st.next_attempt_at == 34 * S
    reg.handle_timer(34 * S)
    r = one(reg)
    assert reg.status(34 * S).state == "registering"
    reg.receive_response(ok(r, expires=60), 35 * S)
    st = reg.status(35 * S)
    assert st.state == "registered" and st.failures == 0 and st.last_error is None


def test_retry_after_is_honoured() -> None:
    reg = Registration(CONFIG, rng=FixedRandom(0.0))
    reg.start(0)
    r = one(reg)
    reg.receive_response(make_response(r, 503, to_tag="a", headers=(("Retry-After", "120"),)), 0)
    assert reg.next_deadline() == 120 * S


def test_423_retries_at_once_with_min_expires() -> None:
    config = RegistrationConfig(aor=AOR, contact=CONFIG.contact, via_host=CONFIG.via_host, expires_s=60)
    reg = Registration(config, rng=random.Random(1))
    reg.start(0)
    r1 = one(reg)
    reg.receive_response(make_response(r1, 423, to_tag="a", headers=(("Min-Expires", "900"),)), 0)
    r2 = one(reg)
    assert r2.headers.get("Expires") == "900" and (r2.headers.get("Contact") or "").endswith(";expires=900")
    reg.receive_response(ok(r2, expires=900), S)
    assert reg.status(S).state == "registered"
    # a 423 without a usable Min-Expires is a failure
    reg2 = Registration(CONFIG, rng=random.Random(1))
    reg2.start(0)
    reg2.receive_response(make_response(one(reg2), 423, to_tag="a"), 0)
    assert reg2.status(0).state == "failed" and "423" in (reg2.status(0).last_error or "")


def test_unregister_on_stop_and_without_binding() -> None:
    reg = Registration(CONFIG, rng=random.Random(1))
    reg.start(0)
    r = one(reg)
    reg.receive_response(ok(r, expires=600), 0)
    assert reg.stop(5 * S)
    u = one(reg)
    assert u.headers.get("Expires") == "0" and (u.headers.get("Contact") or "").endswith(";expires=0")
    assert reg.status(5 * S).state == "unregistering" and reg.next_deadline() is None
    reg.receive_response(ok(u, expires=0), 6 * S)
    assert reg.done and reg.status(6 * S).state == "unregistered" and reg.status(6 * S).expires_at is None
    never = Registration(CONFIG, rng=random.Random(1))
    assert not never.stop(0) and never.done and never.requests() == []


def test_late_response_to_an_older_register_is_ignored() -> None:
    reg = Registration(CONFIG, rng=random.Random(1))
    reg.start(0)
    r1 = one(reg)
    reg.stop(0)  # in flight: un-register anyway
    u = one(reg)
    reg.receive_response(ok(r1, expires=600), S)  # CSeq 1: not the outstanding one
    assert reg.status(S).state == "unregistering"
    reg.receive_response(ok(u), S)
    assert reg.done


def test_registration_carried_by_the_user_agent() -> None:
    server = DigestServer("pbx", [Credentials("1001", "pw")], secret=b"k" * 32)
    ua = UserAgent(UaConfig(host="203.0.113.5"), rng=random.Random(5))
    reg = Registration(CONFIG, credentials=Credentials("1001", "pw"), rng=random.Random(6))
    ua.add_registration(reg, 0)
    (t1,) = ua.transmits()
    assert t1.destination == ("pbx.example.com", 5060)
    r1 = parse(t1.data)
    assert isinstance(r1, Request)
    challenge = make_response(r1, 401, to_tag="a", headers=server.challenge(0))
    ua.receive(serialize(challenge), ("192.0.2.50", 5060), "udp", S)
    (t2,) = ua.transmits()
    r2 = parse(t2.data)
    assert isinstance(r2, Request)
    assert server.verify("REGISTER", r2.uri, r2.headers.get_fields("Authorization"), S) == AuthOk("1001")
    ua.receive(serialize(ok(r2, expires=100)), ("192.0.2.50", 5060), "udp", 2 * S)
    (status,) = ua.registrations(2 * S)
    assert status.state == "registered"
    # the refresh comes from the UA's own timer loop, at half the expiry
    now = 2 * S
    sent: list[tuple[int, Request]] = []
    for _ in range(100):
        deadline = ua.next_deadline()
        if deadline is None or deadline > 60 * S:
            break
        now = deadline
        ua.handle_timer(now)
        sent += [(now, m) for m in (parse(t.data) for t in ua.transmits()) if isinstance(m, Request)]
    assert sent and sent[0][0] == 52 * S and sent[0][1].method == "REGISTER"  # 2 s + 100 s / 2
    # a refresh that gets no answer: Timer F → failed with a reason, retried later
    for _ in range(200):
        deadline = ua.next_deadline()
        if deadline is None or deadline > 200 * S:
            break
        ua.handle_timer(deadline)
        ua.transmits()
        if ua.registrations(deadline)[0].state == "failed":
            break
    st = ua.registrations(deadline or 0)[0]
    assert st.state == "failed" and "timeout" in (st.last_error or "")
    assert ua.stats["register_timeout"] == 1
    ua.unregister_all(deadline or 0)
    (t3,) = ua.transmits()[-1:]
    u = parse(t3.data)
    assert isinstance(u, Request) and u.headers.get("Expires") == "0"


def test_no_password_in_the_registration_or_its_status() -> None:
    password = "Very-Secret-42"
    reg = Registration(CONFIG, credentials=Credentials("1001", password), rng=random.Random(1))
    reg.start(0)
    r = one(reg)
    reg.receive_response(
        make_response(r, 401, to_tag="a", headers=(("WWW-Authenticate", 'Digest realm="pbx", nonce="n"'),)), 0
    )
    retry = one(reg)
    for text in (repr(reg), str(reg), repr(reg.status(0)), repr(retry)):
        assert password not in text


# The registrar keepalive: OPTIONS while registered, on virtual time.

KEEPALIVE = RegistrationConfig(
    aor=AOR, contact="sip:1001@203.0.113.5:5060", via_host="203.0.113.5", keepalive_s=20, keepalive_failures=3
)


def _registered(config: RegistrationConfig = KEEPALIVE, expires: int = 3600) -> Registration:
    reg = Registration(config, rng=random.Random(3))
    reg.start(0)
    reg.receive_response(ok(one(reg), expires=expires), 0)
    return reg


def test_keepalive_is_off_unless_asked_for() -> None:
    reg = Registration(CONFIG, rng=random.Random(1))
    reg.start(0)
    reg.receive_response(ok(one(reg), expires=3600), 0)
    assert reg.keepalive is None and reg.status(0).keepalive is None
    assert reg.next_deadline() == 1800 * S  # only the refresh


def test_keepalive_sends_options_to_the_registrar_every_interval_while_registered() -> None:
    reg = _registered()
    idle = reg.status(0).keepalive
    assert reg.next_deadline() == 20 * S and idle is not None and idle.state == "idle"
    reg.handle_timer(19 * S)
    assert reg.requests() == []
    reg.handle_timer(20 * S)
    (out,) = reg.requests()
    probe = out.request
    assert probe.method == "OPTIONS" and probe.uri == "sip:pbx.example.com"
    assert out.destination == ("pbx.example.com", 5060) and out.transport == "udp"
    assert (probe.headers.get("From") or "").startswith(f"<{AOR}>;tag=")
    # one Call-ID for all this registration sends, one growing CSeq (REGISTER was 1)
    assert probe.headers.get("CSeq") == "2 OPTIONS"
    assert probe.headers.get("Call-ID") == reg.call_id
    assert parse(serialize(probe)) == probe
    assert reg.next_deadline() == 1800 * S  # one probe at a time: the next is armed by this one's outcome
    reg.receive_response(make_response(probe, 200, to_tag="r"), 20 * S + 35_000_000)
    st = reg.status(21 * S).keepalive
    assert st is not None and (st.state, st.sent, st.answered, st.last_status, st.last_rtt_ms) == (
        "ok",
        1,
        1,
        200,
        35.0,
    )
    assert reg.next_deadline() == 40 * S + 35_000_000
    reg.handle_timer(40 * S + 35_000_000)
    (second,) = reg.requests()
    assert second.request.headers.get("CSeq") == "3 OPTIONS"
    # a registrar that does not do OPTIONS still answers: 405 says it is there
    reg.receive_response(make_response(second.request, 405, to_tag="r"), 41 * S)
    st = reg.status(41 * S).keepalive
    assert st is not None and st.state == "ok" and st.last_status == 405 and st.failures == 0
    assert reg.state == "registered" and reg.status(41 * S).last_error is None  # REGISTER state untouched


def test_unanswered_keepalives_are_counted_and_the_third_registers_again_at_once() -> None:
    reg = _registered()
    now = 0
    for n in (1, 2, 3):
        now = reg.next_deadline() or 0
        reg.handle_timer(now)
        (probe,) = reg.requests()
        assert probe.request.method == "OPTIONS"
        now += 32 * S  # Timer F
        reg.request_failed(now, "timeout", method="OPTIONS")
        st = reg.status(now).keepalive
        assert st is not None and st.failures == st.consecutive_failures == n
        if n < 3:
            assert st.state == "idle" and reg.requests() == []
    assert st is not None and st.state == "unreachable" and st.last_error == "no answer to OPTIONS (timeout)"
    (again,) = reg.requests()  # a lost NAT binding or a restarted registrar: REGISTER at once
    assert again.request.method == "REGISTER" and again.request.headers.get("CSeq") == "5 REGISTER"
    reg.receive_response(ok(again.request, expires=3600), now + S)
    assert reg.state == "registered"
    now = reg.next_deadline() or 0
    reg.handle_timer(now)
    (probe,) = reg.requests()
    reg.receive_response(make_response(probe.request, 200, to_tag="r"), now)
    st = reg.status(now).keepalive
    assert st is not None and st.state == "ok" and st.consecutive_failures == 0 and st.failures == 3


def test_no_keepalive_while_failed_or_after_stop() -> None:
    reg = Registration(KEEPALIVE, rng=random.Random(3))
    reg.start(0)
    reg.receive_response(make_response(one(reg), 403, to_tag="r"), 0)
    assert reg.state == "failed" and reg.next_deadline() == reg.status(0).next_attempt_at  # the retry only
    reg = _registered()
    assert reg.stop(S)
    assert [o.request.method for o in reg.requests()] == ["REGISTER"] and reg.next_deadline() is None


def test_keepalive_carried_by_the_user_agent_timer_f_counts_a_failure() -> None:
    ua = UserAgent(UaConfig(host="203.0.113.5"), rng=random.Random(5))
    reg = Registration(KEEPALIVE, rng=random.Random(6))
    ua.add_registration(reg, 0)
    (t1,) = ua.transmits()
    r1 = parse(t1.data)
    assert isinstance(r1, Request)
    ua.receive(serialize(ok(r1, expires=3600)), ("192.0.2.50", 5060), "udp", S)
    sent: list[tuple[int, Request]] = []
    now = S
    for _ in range(200):  # the UA's timer loop: the probe, its retransmissions, then Timer F
        deadline = ua.next_deadline()
        if deadline is None or deadline > 60 * S:
            break
        now = deadline
        ua.handle_timer(now)
        sent += [(now, m) for m in (parse(t.data) for t in ua.transmits()) if isinstance(m, Request)]
    assert sent[0][0] == 21 * S and sent[0][1].method == "OPTIONS"
    assert {m.headers.get("CSeq") for _, m in sent} == {"2 OPTIONS"}  # retransmissions of the one probe
    assert ua.stats["keepalive_timeout"] == 1 and ua.stats["register_timeout"] == 0
    (st,) = ua.registrations(now)
    assert st.state == "registered" and st.keepalive is not None and st.keepalive.failures == 1
