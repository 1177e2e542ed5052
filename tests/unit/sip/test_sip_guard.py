"""The digest guesser's brake (sip/core/guard.py) behind the inbound policy and the user agent, on virtual time:
failures counted per source and per user across methods, back-off, ban and its expiry, unserved methods
refused before the digest, nothing named in Server or the realm by default, bounded memory."""

from __future__ import annotations

import logging
import random

import pytest

from rtp.units import NS_PER_S as S
from sip.core.auth import Credentials, DigestServer, digest
from sip.core.guard import AuthGuard, GuardConfig
from sip.core.message import Request, Response, parse
from sip.core.native_plan import build_policy
from sip.core.policy import SERVED_METHODS, Accept, Challenge, Drop, InboundPolicy
from sip.core.register import Registration, RegistrationConfig
from sip.core.ua import ALLOWED, UaConfig, UserAgent
from sip.engine import EngineConfig, digest_realm

GUESSER = ("198.51.100.66", 5070)
OTHER = ("198.51.100.67", 5070)
URI = "sip:+15551234@bridge.example"
PASSWORD = "1234"


def server() -> DigestServer:
    return DigestServer("bridge.example", [Credentials("alice", PASSWORD)], secret=b"s" * 32)


def authorization(srv: DigestServer, method: str, password: str, now: int, user: str = "alice") -> str:
    nonce = srv.new_nonce(now)
    response = digest(
        algorithm="MD5",
        username=user,
        realm=srv.realm,
        password=password,
        nonce=nonce,
        method=method,
        uri=URI,
        qop="auth",
        nc="00000001",
        cnonce="c0ffee",
    )
    return (
        f'Authorization: Digest username="{user}", realm="{srv.realm}", nonce="{nonce}", uri="{URI}", '
        f'response="{response}", algorithm=MD5, qop=auth, nc=00000001, cnonce="c0ffee"'
    )


def message(method: str, n: int, *extra: str, source: tuple[str, int] = GUESSER) -> bytes:
    host, port = source
    lines = [
        f"{method} {URI} SIP/2.0",
        f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bKg{n};rport",
        "Max-Forwards: 70",
        "From: <sip:alice@bridge.example>;tag=f1",
        "To: <sip:+15551234@bridge.example>",
        f"Call-ID: guess-{n}@example.com",
        f"CSeq: {n} {method}",
        f"Contact: <sip:alice@{host}:{port}>",
        *extra,
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def request(data: bytes) -> Request:
    parsed = parse(data)
    assert isinstance(parsed, Request)
    return parsed


def guess(policy: InboundPolicy, method: str, n: int, password: str, now: int, **kw: object) -> object:
    assert policy.auth is not None
    line = authorization(policy.auth, method, password, now, **kw)  # type: ignore[arg-type]
    return policy.decide(request(message(method, n, line)), GUESSER, now)


def answers(ua: UserAgent, data: bytes, source: tuple[str, int], now: int) -> list[Response]:
    ua.receive(data, source, "udp", now)
    sent = [parse(t.data) for t in ua.transmits()]
    ua.events()
    return [m for m in sent if isinstance(m, Response)]


# --- counting across methods, back-off, ban ---


def test_wrong_passwords_across_methods_accumulate_into_one_ban() -> None:
    policy = InboundPolicy(auth=server())
    t = 0
    for n, method in enumerate(("INVITE", "BYE", "INFO", "UPDATE", "NOTIFY")):
        assert isinstance(guess(policy, method, n, f"wrong{n}", t), Challenge), method
        t += 10 * S  # past every back-off, inside the 60 s window
    assert policy.counters["auth_failed"] == 5 and policy.counters["auth_bans_source"] == 1
    # banned: every request of that source is dropped unanswered, whatever its method, credentials or none
    assert policy.decide(request(message("OPTIONS", 9)), GUESSER, t) == Drop("source banned")
    assert guess(policy, "INVITE", 10, PASSWORD, t) == Drop("source banned")
    assert policy.decide(request(message("INVITE", 11)), OTHER, t) != Drop("source banned")


def test_ban_after_n_failures_not_before_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    policy = InboundPolicy(auth=server())
    caplog.set_level(logging.INFO, logger="parlora.sip")
    for n in range(4):
        assert isinstance(guess(policy, "INVITE", n, f"no{n}", n * 10 * S), Challenge)
    assert policy.counters["auth_bans_source"] == 0 and not policy.guard.banned(GUESSER[0], 40 * S)
    assert isinstance(guess(policy, "INVITE", 4, "no4", 40 * S), Challenge)
    assert policy.guard.banned(GUESSER[0], 40 * S)
    bans = [r.getMessage() for r in caplog.records if "banned" in r.getMessage()]
    assert len(bans) == 1
    assert GUESSER[0] in bans[0] and "'alice'" in bans[0] and "5 failures" in bans[0]
    assert "no4" not in bans[0] and "response" not in bans[0] and "nonce" not in bans[0]
    for n in range(5, 9):  # dropped requests start no further ban and log nothing
        assert guess(policy, "INVITE", n, f"no{n}", 41 * S) == Drop("source banned")
    assert len([r for r in caplog.records if "banned" in r.getMessage()]) == 1


def test_failures_outside_the_window_do_not_ban() -> None:
    policy = InboundPolicy(auth=server())
    for n in range(12):  # one wrong password every 20 s: never 5 within 60 s
        assert isinstance(guess(policy, "INVITE", n, "typo", n * 20 * S), Challenge)
    assert policy.counters["auth_bans_source"] == 0


def test_ban_expires_and_the_next_one_doubles() -> None:
    policy = InboundPolicy(auth=server())
    t = 0
    for n in range(5):
        guess(policy, "INVITE", n, "x", t)
        t += 10 * S
    banned_at = t - 10 * S
    assert guess(policy, "INVITE", 20, PASSWORD, banned_at + 599 * S) == Drop("source banned")
    t = banned_at + 600 * S
    assert guess(policy, "INVITE", 21, PASSWORD, t) == Accept("alice")  # 10 min later: served again
    for n in range(5):
        t += 10 * S
        guess(policy, "INVITE", 30 + n, "y", t)
    assert policy.counters["auth_bans_source"] == 2
    assert guess(policy, "INVITE", 40, PASSWORD, t + 1199 * S) == Drop("source banned")  # 20 min now
    assert guess(policy, "INVITE", 41, PASSWORD, t + 1200 * S) == Accept("alice")


def test_a_right_password_during_the_back_off_is_not_checked() -> None:
    policy = InboundPolicy(auth=server())
    assert isinstance(guess(policy, "INVITE", 1, "a", 0), Challenge)
    assert isinstance(guess(policy, "INVITE", 2, "b", 0), Challenge)  # 2nd failure: wait 1 s
    # the right password within the wait is dropped unchecked, exactly as a wrong one: no answer tells them apart
    assert guess(policy, "INVITE", 3, PASSWORD, S // 2) == Drop("digest backoff")
    assert guess(policy, "INVITE", 4, "c", S // 2) == Drop("digest backoff")
    assert policy.counters["auth_ok"] == 0 and policy.counters["auth_failed"] == 2
    assert guess(policy, "INVITE", 5, PASSWORD, S) == Accept("alice")  # the phone's retransmission gets in


def test_back_off_doubles_so_a_guesser_gets_five_guesses_then_the_ban() -> None:
    policy = InboundPolicy(auth=server())
    checked, t = [], 0
    while t < 60 * S:  # a guesser sending one wrong password every 10 ms for a minute (INFO: no rate limit)
        decision = guess(policy, "INFO", t // S, f"g{t}", t)
        if isinstance(decision, Challenge):
            checked.append(t)
        t += 10 * S // 1000
    assert len(checked) == 5
    assert [round((b - a) / S, 2) for a, b in zip(checked, checked[1:], strict=False)] == [
        0.01,
        1.0,
        2.0,
        4.0,
    ]


def test_a_distributed_guesser_guards_the_user_but_not_against_its_own_trunk() -> None:
    policy = InboundPolicy(auth=server())
    trunk = ("203.0.113.7", 5060)
    line = authorization(policy.auth, "INVITE", PASSWORD, 0)  # type: ignore[arg-type]
    assert policy.decide(request(message("INVITE", 1, line, source=trunk)), trunk, 0) == Accept("alice")
    for n in range(20):  # 20 sources, one wrong guess each: none of them reaches a per-source limit
        source = (f"198.51.100.{n + 1}", 5060)
        line = authorization(policy.auth, "INVITE", f"w{n}", S)  # type: ignore[arg-type]
        assert isinstance(
            policy.decide(request(message("INVITE", n, line, source=source)), source, S), Challenge
        )
    assert policy.counters["auth_bans_user"] == 1 and policy.counters["auth_bans_source"] == 0
    fresh = ("198.51.100.200", 5060)
    line = authorization(policy.auth, "INVITE", PASSWORD, 2 * S)  # type: ignore[arg-type]
    assert policy.decide(request(message("INVITE", 50, line, source=fresh)), fresh, 2 * S) == Drop(
        "digest user banned"
    )
    line = authorization(policy.auth, "INVITE", PASSWORD, 2 * S)  # type: ignore[arg-type]
    assert policy.decide(request(message("INVITE", 51, line, source=trunk)), trunk, 2 * S) == Accept("alice")


def test_memory_is_bounded_under_many_sources_and_a_ban_survives_the_flood() -> None:
    guard = AuthGuard(GuardConfig(max_entries=1000))
    for _ in range(5):
        guard.failed("198.51.100.66", "alice", 0)
    assert guard.banned("198.51.100.66", S)
    for i in range(50_000):  # spoofed sources, one failure each, many users
        guard.failed(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", f"u{i}", S + i)
    assert guard.entries() <= 4 * 1000
    assert guard.banned("198.51.100.66", 2 * S)  # bans are a table of their own: not pushed out
    # and entries expire: a day later the tables are swept as they are met
    late = 200_000 * S
    for i in range(1000):
        guard.failed(f"192.0.2.{i % 250}", None, late + i)
    assert guard.entries() <= 1000 + 250


def test_policy_and_user_agent_serve_the_same_methods() -> None:
    assert frozenset(ALLOWED) == SERVED_METHODS


# --- unserved methods, before the digest ---


@pytest.mark.parametrize("method", ["REGISTER", "SUBSCRIBE", "MESSAGE", "PUBLISH"])
def test_an_unserved_method_gets_the_same_answer_with_right_or_wrong_credentials(method: str) -> None:
    srv = server()
    ua = UserAgent(UaConfig(), rng=random.Random(1), policy=InboundPolicy(auth=srv))
    right = answers(ua, message(method, 1, authorization(srv, method, PASSWORD, 0)), GUESSER, 0)
    wrong = answers(ua, message(method, 2, authorization(srv, method, "guess", 0)), GUESSER, 0)
    none = answers(ua, message(method, 3), GUESSER, 0)
    shapes = [
        [(r.status, r.headers.get("Allow"), r.headers.get("WWW-Authenticate")) for r in a]
        for a in (right, wrong, none)
    ]
    assert shapes[0] == shapes[1] == shapes[2] == [(405, ", ".join(ALLOWED), None)]
    assert ua.policy is not None and ua.policy.counters["auth_failed"] == 0  # never a digest verdict


# --- what the bridge names itself ---


def test_no_server_header_by_default_and_none_in_a_register() -> None:
    ua = UserAgent(UaConfig(), rng=random.Random(1))
    options = answers(ua, message("OPTIONS", 1), GUESSER, 0)
    refused = answers(ua, message("SUBSCRIBE", 2), GUESSER, 0)
    for response in options + refused:
        assert response.headers.get("Server") is None and response.headers.get("User-Agent") is None
    reg = Registration(
        RegistrationConfig(aor="sip:1001@pbx.example", contact="sip:1001@192.0.2.1", via_host="192.0.2.1")
    )
    reg.start(0)
    (out,) = reg.requests()
    assert out.request.headers.get("User-Agent") is None
    named = UserAgent(UaConfig(user_agent="Acme SBC"), rng=random.Random(1))
    (ok,) = answers(named, message("OPTIONS", 1), GUESSER, 0)
    assert ok.headers.get("Server") == "Acme SBC"


def test_realm_is_configurable_and_names_no_product_by_default() -> None:
    auth = ("alice", PASSWORD)
    assert digest_realm(EngineConfig(host="192.0.2.10", inbound_auth=auth)) == "192.0.2.10"
    assert digest_realm(EngineConfig(host="0.0.0.0", external_address="203.0.113.1")) == "203.0.113.1"
    assert digest_realm(EngineConfig(host="0.0.0.0")) == "sip"
    policy = build_policy(EngineConfig(host="0.0.0.0", inbound_auth=auth, realm="voice.example"))
    assert policy.auth is not None and policy.auth.realm == "voice.example"
    default = build_policy(EngineConfig(host="127.0.0.1", inbound_auth=auth))
    assert default.auth is not None
    fields = default.auth.challenge(0)
    assert all("parlora" not in value.lower() for _, value in fields)
    assert all('realm="127.0.0.1"' in value for _, value in fields)
