"""Inbound policy (sip.core.policy) alone and in front of the UserAgent: allowlist, drop, scanners, rate limit,
digest challenge, counters, and the bind check for `serve`."""

from __future__ import annotations

import random

import pytest

from rtp.units import NS_PER_S as S
from sip.core.auth import AuthAnswer, Credentials, DigestClient, DigestServer
from sip.core.headers import Headers
from sip.core.message import Request, Response, parse
from sip.core.policy import (
    Accept,
    BindCheck,
    Challenge,
    Drop,
    InboundPolicy,
    PolicyConfig,
    Refuse,
    check_bind,
    parse_networks,
)
from sip.core.ua import IncomingCall, UaConfig, UserAgent
from tests.support.sip_policy import run

TRUNK = ("203.0.113.7", 5060)
STRANGER = ("198.51.100.99", 5060)


def invite(
    branch: str = "z9hG4bKp1", *, agent: str = "Trunk/1.0", extra: tuple[str, ...] = (), cseq: int = 1
) -> bytes:
    lines = [
        "INVITE sip:+15551234@bridge.example SIP/2.0",
        f"Via: SIP/2.0/UDP 203.0.113.7:5060;branch={branch};rport",
        "Max-Forwards: 70",
        "From: <sip:alice@example.com>;tag=a1",
        "To: <sip:+15551234@bridge.example>",
        "Call-ID: pol-1@example.com",
        f"CSeq: {cseq} INVITE",
        "Contact: <sip:alice@203.0.113.7:5060>",
        f"User-Agent: {agent}",
        *extra,
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def request(data: bytes) -> Request:
    message = parse(data)
    assert isinstance(message, Request)
    return message


# --- the policy alone ---


def test_allowlist_ipv4_ipv6_and_mapped_addresses() -> None:
    policy = InboundPolicy(PolicyConfig(allow=("203.0.113.0/24", "2001:db8::/32")))
    assert policy.allowed("203.0.113.7") and policy.allowed("::ffff:203.0.113.8")
    assert (
        policy.allowed("2001:db8::5")
        and policy.allowed("[2001:db8::6]")
        and policy.allowed("2001:db8::7%eth0")
    )
    assert (
        not policy.allowed("198.51.100.1")
        and not policy.allowed("2001:db9::1")
        and not policy.allowed("bogus")
    )
    assert policy.decide(request(invite()), STRANGER, 0) == Refuse(403, "Forbidden")
    assert policy.decide(request(invite()), TRUNK, 0) == Accept()
    assert policy.counters["not_allowed"] == 1
    with pytest.raises(ValueError, match="not an IP network"):
        parse_networks(["10.0.0.0/33"])


def test_drop_unknown_and_scanner_user_agents() -> None:
    policy = InboundPolicy(PolicyConfig(allow=("203.0.113.0/24",), drop_unknown=True))
    assert isinstance(policy.decide(request(invite()), STRANGER, 0), Drop)
    for agent in ("friendly-scanner", "SIPVicious 0.3", "sipcli/v1.8", "VaxSIPUserAgent/3.1"):
        assert isinstance(policy.decide(request(invite(agent=agent)), TRUNK, 0), Drop)
    assert policy.counters == {"not_allowed": 1, "scanner": 4}
    loud = InboundPolicy(PolicyConfig(scanner_action="403"))
    assert loud.decide(request(invite(agent="friendly-scanner")), TRUNK, 0) == Refuse(403, "Forbidden")


def test_rate_limit_is_a_token_bucket_per_source() -> None:
    policy = InboundPolicy(PolicyConfig(invite_rate_per_s=1.0, invite_burst=3))
    decisions = [policy.decide(request(invite(f"z9hG4bK{i}")), TRUNK, 0) for i in range(4)]
    assert decisions[:3] == [Accept()] * 3
    assert decisions[3] == Refuse(503, "Service Unavailable (rate limited)", (("Retry-After", "1"),))
    assert policy.decide(request(invite()), STRANGER, 0) == Accept()  # another source has its own bucket
    assert policy.decide(request(invite()), TRUNK, S) == Accept()  # one token back after 1 s
    assert isinstance(policy.decide(request(invite()), TRUNK, S), Refuse)
    assert policy.counters["rate_limited"] == 2


def test_rate_table_is_bounded() -> None:
    policy = InboundPolicy(PolicyConfig(max_sources=10))
    for i in range(50):
        policy.decide(request(invite()), (f"192.0.2.{i}", 5060), 0)
    assert len(policy._limits["INVITE"].buckets) == 10


def options(branch: str = "z9hG4bKopt") -> bytes:
    return invite(branch).replace(b"INVITE sip", b"OPTIONS sip").replace(b"1 INVITE", b"1 OPTIONS")


def test_an_options_flood_from_one_source_is_dropped_beyond_its_own_bucket() -> None:
    policy = InboundPolicy(PolicyConfig(options_rate_per_s=2.0, options_burst=4, invite_burst=1))
    decisions = [policy.decide(request(options(f"z9hG4bK{i}")), TRUNK, 0) for i in range(10)]
    assert decisions[:4] == [Accept()] * 4 and decisions[4:] == [Drop("OPTIONS rate limited")] * 6
    assert policy.counters["options_rate_limited"] == 6
    assert policy.decide(request(options()), STRANGER, 0) == Accept()  # another source has its own bucket
    assert policy.decide(request(invite()), TRUNK, 0) == Accept()  # INVITE tokens are not OPTIONS tokens
    assert policy.decide(request(options()), TRUNK, S // 2) == Accept()  # 2/s: one back after 0.5 s
    assert policy.decide(request(options()), TRUNK, S // 2) == Drop("OPTIONS rate limited")
    assert policy.counters["rate_limited"] == 0  # the INVITE limit's counter is untouched


def test_digest_challenge_then_accept_and_stale() -> None:
    server = DigestServer("bridge", [Credentials("pbx", "pw")], secret=b"s" * 32, nonce_ttl_s=30)
    policy = InboundPolicy(auth=server)
    first = policy.decide(request(invite()), TRUNK, 0)
    assert isinstance(first, Challenge) and first.status == 401
    client = DigestClient(Credentials("pbx", "pw"), rng=random.Random(1))
    answer = client.respond(
        Response(401, "Unauthorized", Headers(first.headers)), "INVITE", "sip:+15551234@bridge.example"
    )
    assert isinstance(answer, AuthAnswer)
    auth_line = f"{answer.headers[0][0]}: {answer.headers[0][1]}"
    assert policy.decide(request(invite(extra=(auth_line,), cseq=2)), TRUNK, S) == Accept("pbx")
    late = policy.decide(request(invite(extra=(auth_line,), cseq=3)), TRUNK, 40 * S)
    assert isinstance(late, Challenge) and late.stale
    # OPTIONS (a balancer's probe) and CANCEL are never challenged
    options = request(invite().replace(b"INVITE sip", b"OPTIONS sip").replace(b"1 INVITE", b"1 OPTIONS"))
    assert policy.decide(options, TRUNK, 0) == Accept()
    assert policy.counters["auth_missing"] == 1 and policy.counters["auth_ok"] == 1
    assert policy.counters["auth_stale"] == 1


# --- in front of the user agent ---


def test_refused_source_gets_403_and_no_call_event() -> None:
    ua = UserAgent(
        UaConfig(), rng=random.Random(1), policy=InboundPolicy(PolicyConfig(allow=("203.0.113.0/24",)))
    )
    responses, events = run(ua, invite(), STRANGER)
    assert [r.status for r in responses] == [403] and events == []
    assert ua.transactions == 0  # answered statelessly: a flood costs no state
    assert ua.stats["policy_403"] == 1 and ua.stats["calls"] == 0
    responses, events = run(ua, invite("z9hG4bKp2"), TRUNK)
    assert [r.status for r in responses] == [100] and isinstance(events[0], IncomingCall)


def test_dropped_source_gets_nothing_at_all() -> None:
    ua = UserAgent(
        UaConfig(),
        rng=random.Random(1),
        policy=InboundPolicy(PolicyConfig(allow=("203.0.113.0/24",), drop_unknown=True)),
    )
    assert run(ua, invite(), STRANGER) == ([], [])
    # a scanner's OPTIONS too, before any 405/200 could tell it we exist
    probe = (
        invite(agent="friendly-scanner")
        .replace(b"INVITE sip", b"OPTIONS sip")
        .replace(b"1 INVITE", b"1 OPTIONS")
    )
    assert run(ua, probe, TRUNK) == ([], [])
    assert ua.stats["policy_dropped"] == 2


def test_rate_limited_invite_gets_503_with_retry_after() -> None:
    ua = UserAgent(
        UaConfig(),
        rng=random.Random(1),
        policy=InboundPolicy(PolicyConfig(invite_rate_per_s=0.5, invite_burst=1)),
    )
    run(ua, invite("z9hG4bKa"), TRUNK)
    responses, events = run(ua, invite("z9hG4bKb").replace(b"pol-1@", b"pol-2@"), TRUNK)
    assert [(r.status, r.headers.get("Retry-After")) for r in responses] == [(503, "2")] and events == []


def test_inbound_auth_through_the_user_agent() -> None:
    server = DigestServer("bridge", [Credentials("pbx", "pw")], secret=b"s" * 32)
    ua = UserAgent(UaConfig(), rng=random.Random(1), policy=InboundPolicy(auth=server))
    responses, events = run(ua, invite(), TRUNK)
    (challenge,) = responses
    assert challenge.status == 401 and events == [] and (challenge.headers.get("To") or "").count("tag=") == 1
    client = DigestClient(Credentials("pbx", "pw"), rng=random.Random(2))
    answer = client.respond(challenge, "INVITE", "sip:+15551234@bridge.example")
    assert isinstance(answer, AuthAnswer)
    line = f"{answer.headers[0][0]}: {answer.headers[0][1]}"
    responses, events = run(ua, invite("z9hG4bKp2", extra=(line,), cseq=2), TRUNK, S)
    assert [r.status for r in responses] == [100] and isinstance(events[0], IncomingCall)
    assert events[0].auth_user == "pbx"
    wrong = DigestClient(Credentials("pbx", "guess"), rng=random.Random(3)).respond(
        challenge, "INVITE", "sip:+15551234@bridge.example"
    )
    assert isinstance(wrong, AuthAnswer)
    bad_line = f"{wrong.headers[0][0]}: {wrong.headers[0][1]}"
    responses, events = run(
        ua, invite("z9hG4bKp3", extra=(bad_line,), cseq=3).replace(b"pol-1@", b"pol-3@"), TRUNK, S
    )
    assert [r.status for r in responses] == [401] and events == []
    assert ua.stats["policy_challenged"] == 2


def test_in_dialog_requests_are_not_policed() -> None:
    policy = InboundPolicy(PolicyConfig(allow=("203.0.113.0/24",)))
    ua = UserAgent(UaConfig(), rng=random.Random(1), policy=policy)
    bye = invite().replace(b"INVITE sip", b"BYE sip").replace(b"1 INVITE", b"2 BYE")
    bye = bye.replace(b"To: <sip:+15551234@bridge.example>", b"To: <sip:+15551234@bridge.example>;tag=x")
    responses, _ = run(ua, bye, STRANGER)
    assert [r.status for r in responses] == [481] and policy.counters["not_allowed"] == 0


def test_no_policy_keeps_accepting_everyone() -> None:
    ua = UserAgent(UaConfig(), rng=random.Random(1))
    responses, events = run(ua, invite(agent="friendly-scanner"), STRANGER)
    assert [r.status for r in responses] == [100] and isinstance(events[0], IncomingCall)


# --- serve's bind check ---


def test_check_bind() -> None:
    open_policy = InboundPolicy()
    assert check_bind("127.0.0.1", open_policy) == BindCheck(True)
    assert check_bind("::1", None) == BindCheck(True) and check_bind("localhost", None).ok
    refused = check_bind("0.0.0.0", open_policy)
    assert not refused.ok and refused.error and "--allow-any" in refused.error
    assert not check_bind("203.0.113.5", None).ok and not check_bind("::", None).ok
    warned = check_bind("0.0.0.0", open_policy, allow_any=True)
    assert warned.ok and warned.warning
    assert check_bind("0.0.0.0", InboundPolicy(PolicyConfig(allow=("10.0.0.0/8",)))) == BindCheck(True)
    server = DigestServer("r", [Credentials("u", "p")])
    assert check_bind("0.0.0.0", InboundPolicy(auth=server)) == BindCheck(True)
