"""Trunks as identities (sip/core/trunks.py), sans-I/O: the matcher, the inbound policy per trunk, and the UA core
giving a call its trunk's address and NAT mode. The trunks come from a configuration file like
deploy/example.toml (a carrier known by its CIDR and a digest user, requiring SRTP behind an external address;
an office PBX known by its CIDR, without credentials) through `bridge.cli.ops.server_config`, the path `serve
--config` takes: before trunks were identities that path merged the allowlists and challenged every source
with the carrier's user."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.cli.config import ConfigError, load
from bridge.cli.ops import server_config
from bridge.server.api import _engine_config
from rtp.units import NS_PER_S as S
from sip.core.auth import AuthAnswer, Credentials, DigestClient
from sip.core.headers import Headers
from sip.core.message import Request, Response, make_response, parse, serialize
from sip.core.native_plan import build_policy
from sip.core.offer_answer import LocalMedia
from sip.core.policy import Accept, Challenge, Refuse
from sip.core.trunks import Trunk, TrunkTable, match
from sip.core.ua import IncomingCall, UaConfig, UserAgent
from sip.engine import EngineConfig, check_listen
from tests.support.sip_policy import run

PBX = ("10.20.0.5", 5060)
CARRIER = ("203.0.113.9", 5060)
STRANGER = ("198.18.0.1", 5060)
ENV = {"PARLORA_CARRIER_PASSWORD": "carrier-secret"}

EXAMPLE = """
[listeners]
sip_udp = "0.0.0.0:5060"
sip_tls = "0.0.0.0:5061"
tls_cert = "bridge.pem"
tls_key = "bridge.key"
[defaults]
provider = "echo"
[[trunks]]
name = "office-pbx"
allow = ["10.0.0.0/8"]
[[trunks]]
name = "carrier"
allow = ["203.0.113.0/24"]
inbound_auth_user = "carrier-in"
inbound_password_env = "PARLORA_CARRIER_PASSWORD"
transport = "tls"
srtp = "require"
external_address = "198.51.100.7"
nat = true
"""

SDP = (
    "v=0\r\no=- 1 1 IN IP4 {host}\r\ns=-\r\nc=IN IP4 {host}\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
)


def invite(source: tuple[str, int], n: int = 1, extra: tuple[str, ...] = ()) -> bytes:
    host, port = source
    body = SDP.format(host=host)
    lines = [
        "INVITE sip:+4930123@bridge.example SIP/2.0",
        f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bK-tr-{n};rport",
        "Max-Forwards: 70",
        f"From: <sip:caller@{host}>;tag=f{n}",
        "To: <sip:+4930123@bridge.example>",
        f"Call-ID: tr-{n}@{host}",
        "CSeq: 1 INVITE",
        f"Contact: <sip:caller@{host}:{port}>",
        *extra,
        "Content-Type: application/sdp",
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


def _with_tls_files(tmp_path: Path) -> Path:
    """Where the example's copy goes, beside the certificate and key its TLS listener names (checked at start)."""
    (tmp_path / "bridge.pem").write_text("cert")
    (tmp_path / "bridge.key").write_text("key")
    return tmp_path / "bridge.toml"


def request(data: bytes) -> Request:
    message = parse(data)
    assert isinstance(message, Request)
    return message


@pytest.fixture
def engine_config(tmp_path: Path) -> EngineConfig:
    """The example's trunks as `serve --config` hands them to the engine."""
    path = _with_tls_files(tmp_path)
    path.write_text(EXAMPLE)
    return _engine_config(server_config(load(path), ENV))


@pytest.fixture
def plain_carrier_config(tmp_path: Path) -> EngineConfig:
    """The example's trunks with the carrier's SRTP off: a plain offer over UDP from it is answerable, so its
    INVITE reaches the digest check (an SRTP-requiring trunk's plain offer is refused with 488 at arrival)."""
    path = _with_tls_files(tmp_path)
    path.write_text(EXAMPLE.replace('transport = "tls"\nsrtp = "require"\n', ""))
    return _engine_config(server_config(load(path), ENV))


def ua_of(config: EngineConfig) -> UserAgent:
    return UserAgent(UaConfig(host="192.0.2.1", port=5060), policy=build_policy(config))


def answer_header(challenge: Response, user: str, password: str) -> str:
    answer = DigestClient(Credentials(user, password)).respond(
        challenge, "INVITE", "sip:+4930123@bridge.example"
    )
    assert isinstance(answer, AuthAnswer)
    ((name, value),) = answer.headers
    return f"{name}: {value}"


# --- the matcher ---

TRUNKS = (
    Trunk("office-pbx", allow=("10.0.0.0/8",)),
    Trunk("carrier", allow=("203.0.113.0/24",), inbound_auth=("carrier-in", "pw"), srtp="required"),
    Trunk("sbc", allow=("203.0.113.9/32",)),
    Trunk("roaming", inbound_auth=("roamer", "pw2")),
    Trunk("pbx2", registrar="sip:bridge@pbx2.example.com"),
)


def test_the_source_address_names_the_trunk_and_the_longest_prefix_wins() -> None:
    table = TrunkTable(TRUNKS)
    assert table.match(PBX, request(invite(PBX))) is TRUNKS[0]
    assert table.match(("203.0.113.10", 5060), request(invite(CARRIER))) is TRUNKS[1]
    assert table.match(CARRIER, request(invite(CARRIER))) is TRUNKS[2]  # the /32 beats the carrier's /24
    assert table.match("::ffff:10.1.1.1", request(invite(PBX))) is TRUNKS[0]  # an IPv4-mapped source
    assert match(TRUNKS, STRANGER, request(invite(STRANGER))) is None
    assert table.match("not-an-address", request(invite(STRANGER))) is None


def test_then_the_registrars_address_then_the_digest_user() -> None:
    table = TrunkTable(TRUNKS, {"pbx2": ("192.0.2.44",)})
    assert table.match(("192.0.2.44", 5060), request(invite(STRANGER))) is TRUNKS[4]
    roaming = 'Authorization: Digest username="roamer", realm="r", nonce="n", uri="sip:x", response="00"'
    assert table.match(STRANGER, request(invite(STRANGER, extra=(roaming,)))) is TRUNKS[3]
    proxy = roaming.replace("Authorization", "Proxy-Authorization").replace("roamer", "carrier-in")
    assert table.match(STRANGER, request(invite(STRANGER, extra=(proxy,)))) is TRUNKS[1]
    # the source still comes first: the PBX's address with the carrier's user is the PBX
    assert table.match(PBX, request(invite(PBX, extra=(proxy,)))) is TRUNKS[0]
    unknown = roaming.replace("roamer", "nobody")
    broken = "Authorization: Digest username"
    assert table.match(STRANGER, request(invite(STRANGER, extra=(unknown, broken)))) is None


def test_two_trunks_with_one_inbound_user_are_refused() -> None:
    with pytest.raises(ValueError, match="same inbound digest user 'u'"):
        TrunkTable((Trunk("a", inbound_auth=("u", "1")), Trunk("b", inbound_auth=("u", "2"))))


def test_a_trunks_password_never_shows() -> None:
    assert "pw" not in repr(TRUNKS[1]) and "carrier-in" in repr(TRUNKS[1])


# --- the policy and the UA core, from the configuration file ---


def test_serve_config_hands_each_trunk_to_the_engine_without_merging(engine_config: EngineConfig) -> None:
    pbx, carrier = engine_config.trunks
    assert pbx == Trunk("office-pbx", allow=("10.0.0.0/8",))
    assert carrier.inbound_auth == ("carrier-in", "carrier-secret") and carrier.srtp == "required"
    assert carrier.external_address == "198.51.100.7" and carrier.nat
    # nothing of one trunk is the global policy (the flags' fields) any more
    assert engine_config.inbound_auth is None and engine_config.allow == ()
    assert engine_config.external_address is None and not engine_config.nat


def test_an_invite_from_the_pbx_is_not_challenged_and_its_call_is_the_pbxs(
    engine_config: EngineConfig,
) -> None:
    ua = ua_of(engine_config)
    responses, events = run(ua, invite(PBX), PBX)
    assert [r.status for r in responses] == [100]
    (call,) = [e for e in events if isinstance(e, IncomingCall)]
    assert call.trunk is not None and call.trunk.name == "office-pbx" and call.auth_user is None
    assert call.trunk.srtp == "off"  # plain RTP for it, whatever the carrier requires
    assert ua.answer(call.call, LocalMedia(address="192.0.2.1", port=4000, session_id=1), S)
    ok = [parse(t.data) for t in ua.transmits()][-1]
    assert isinstance(ok, Response) and ok.status == 200
    contact = ok.headers.get("Contact") or ""
    assert "192.0.2.1" in contact and "198.51.100.7" not in contact  # not the carrier's external address


def test_an_invite_from_the_carrier_is_challenged_for_the_carriers_user(
    plain_carrier_config: EngineConfig,
) -> None:
    ua = ua_of(plain_carrier_config)
    responses, events = run(ua, invite(CARRIER), CARRIER)
    assert [r.status for r in responses] == [401] and events == []
    challenge = responses[0]
    auth = answer_header(challenge, "carrier-in", "carrier-secret")
    responses, events = run(ua, invite(CARRIER, 2, extra=(auth,)), CARRIER, S)
    assert [r.status for r in responses] == [100]
    (call,) = [e for e in events if isinstance(e, IncomingCall)]
    assert call.trunk is not None and call.trunk.name == "carrier" and call.auth_user == "carrier-in"
    assert ua.answer(call.call, LocalMedia(address="198.51.100.7", port=4000, session_id=1), 2 * S)
    ok = [parse(t.data) for t in ua.transmits()][-1]
    assert isinstance(ok, Response) and "198.51.100.7" in (ok.headers.get("Contact") or "")


def test_a_source_of_neither_trunk_is_refused_as_outside_every_allowlist(engine_config: EngineConfig) -> None:
    ua = ua_of(engine_config)
    responses, events = run(ua, invite(STRANGER), STRANGER)
    assert [r.status for r in responses] == [403] and events == []
    # even with the carrier's right credentials: the carrier's allowlist is the carrier's
    challenge = run(ua, invite(CARRIER, 2), CARRIER)[0][0]
    auth = answer_header(challenge, "carrier-in", "carrier-secret")
    responses, events = run(ua, invite(STRANGER, 3, extra=(auth,)), STRANGER, S)
    assert [r.status for r in responses] == [403] and events == []


def test_another_users_right_password_is_a_wrong_one_for_this_trunk() -> None:
    trunks = (
        Trunk("a", allow=("203.0.113.0/24",), inbound_auth=("user-a", "pw-a")),
        Trunk("b", inbound_auth=("user-b", "pw-b")),
    )
    policy = build_policy(EngineConfig(trunks=trunks))
    first = policy.decide(request(invite(CARRIER)), CARRIER, 0)
    assert isinstance(first, Challenge)
    challenge = make_response(request(invite(CARRIER)), first.status, headers=first.headers)
    with_b = answer_header(challenge, "user-b", "pw-b")
    again = policy.decide(request(invite(CARRIER, 2, extra=(with_b,))), CARRIER, S)
    assert isinstance(again, Challenge)  # user-b's right password, but this source is trunk a's
    with_a = answer_header(
        make_response(request(invite(CARRIER)), 401, headers=again.headers), "user-a", "pw-a"
    )
    decided = policy.decide(request(invite(CARRIER, 3, extra=(with_a,))), CARRIER, S)
    assert decided == Accept("user-a", trunks[0])


def test_a_trunk_known_by_its_user_alone_is_challenged_from_anywhere_and_matched_by_the_answer() -> None:
    trunks = (
        Trunk("pbx", allow=("10.0.0.0/8",)),
        Trunk("roaming", inbound_auth=("roamer", "pw-r")),
    )
    policy = build_policy(EngineConfig(trunks=trunks))
    first = policy.decide(request(invite(STRANGER)), STRANGER, 0)
    assert isinstance(first, Challenge)  # not 403: the roaming trunk's calls come from anywhere
    challenge = make_response(request(invite(STRANGER)), first.status, headers=first.headers)
    auth = answer_header(challenge, "roamer", "pw-r")
    decided = policy.decide(request(invite(STRANGER, 2, extra=(auth,))), STRANGER, S)
    assert decided == Accept("roamer", trunks[1])
    assert policy.decide(request(invite(PBX)), PBX, 0) == Accept(None, trunks[0])


def test_without_trunks_the_global_policy_is_as_before() -> None:
    policy = build_policy(EngineConfig(allow=("10.0.0.0/8",), inbound_auth=("u", "p")))
    assert policy.decide(request(invite(STRANGER)), STRANGER, 0) == Refuse(403, "Forbidden")
    assert isinstance(policy.decide(request(invite(PBX)), PBX, 0), Challenge)


def test_pjsua2_with_two_trunks_of_different_policies_refuses_to_start(tmp_path: Path) -> None:
    path = _with_tls_files(tmp_path)
    path.write_text(EXAMPLE + '[engine]\nname = "pjsua2"\n')
    with pytest.raises(ConfigError) as refused:
        server_config(load(path), ENV)
    (problem,) = [p for p in refused.value.problems if "engine.name:" in p]  # beside the TLS trunk's own
    assert "engine.name: pjsua2 cannot tell one trunk's requests from another's" in problem
    assert "office-pbx, carrier" in problem


def _bye_destination(ua: UserAgent, data: bytes, source: tuple[str, int], now: int) -> tuple[str, int]:
    """Where our BYE of the call `data` (from `source`, already admitted) goes."""
    ua.receive(data, source, "udp", now)
    (call,) = [e for e in ua.events() if isinstance(e, IncomingCall)]
    assert ua.answer(call.call, LocalMedia(address="192.0.2.1", port=4000, session_id=1), now)
    ok = [parse(t.data) for t in ua.transmits()][-1]
    assert isinstance(ok, Response) and ok.status == 200
    invite_request = request(data)
    kept = [
        (k, v)
        for k, v in invite_request.headers.items()
        if k.lower() not in ("content-type", "content-length")
    ]
    headers = Headers(kept).replaced("To", ok.headers.get("To") or "").replaced("CSeq", "1 ACK")
    ack = Request("ACK", invite_request.uri, headers.with_header("Content-Length", "0"), b"")
    ua.receive(serialize(ack), source, "udp", now)
    assert ua.bye(call.call, now + S)
    (bye,) = [t for t in ua.transmits() if t.data.startswith(b"BYE ")]
    return bye.destination


def test_the_carriers_nat_mode_sends_its_in_dialog_requests_to_the_source_and_the_pbxs_to_its_contact(
    plain_carrier_config: EngineConfig,
) -> None:
    ua = ua_of(plain_carrier_config)
    private = "Contact: <sip:caller@10.99.0.1:5070>"  # behind NAT: a Contact nobody can reach
    pbx_invite = invite(PBX, 1).replace(f"Contact: <sip:caller@{PBX[0]}:{PBX[1]}>".encode(), private.encode())
    assert _bye_destination(ua, pbx_invite, PBX, 0) == ("10.99.0.1", 5070)  # the PBX's trunk has no NAT mode
    challenge = run(ua, invite(CARRIER, 2), CARRIER, S)[0][0]
    auth = answer_header(challenge, "carrier-in", "carrier-secret")
    carrier_invite = invite(CARRIER, 3, extra=(auth,))
    carrier_invite = carrier_invite.replace(
        f"Contact: <sip:caller@{CARRIER[0]}:{CARRIER[1]}>".encode(), private.encode()
    )
    assert _bye_destination(ua, carrier_invite, CARRIER, 2 * S) == CARRIER  # the carrier's does


def test_two_trunks_with_one_inbound_user_refuse_to_start(tmp_path: Path) -> None:
    path = _with_tls_files(tmp_path)
    path.write_text(EXAMPLE + '[[trunks]]\nname = "twin"\ninbound_auth_user = "carrier-in"\n')
    with pytest.raises(ConfigError, match="trunks 'carrier' and 'twin' have the same inbound digest user"):
        server_config(load(path), {**ENV, "PARLORA_INBOUND_PASSWORD": "x"})
    check = check_listen(
        EngineConfig(trunks=(Trunk("a", inbound_auth=("u", "1")), Trunk("b", inbound_auth=("u", "2"))))
    )
    assert not check.ok and "same inbound digest user" in (check.error or "")
