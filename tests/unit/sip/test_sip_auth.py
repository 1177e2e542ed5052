"""Digest authentication (sip.core.auth): known answers from RFC 2617 and RFC 7616, parsing, the client's nc,
cnonce, stale and give-up rules, and the server's stateless nonces, expiry and replay table."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtp.units import NS_PER_S as S
from sip.core.auth import (
    AuthAnswer,
    AuthFailed,
    AuthMissing,
    AuthOk,
    AuthRefused,
    AuthStale,
    Credentials,
    DigestClient,
    DigestServer,
    digest,
    parse_authorization,
    parse_challenge,
    parse_challenges,
)
from sip.core.headers import Headers
from sip.core.message import Response

URI = "sip:pbx.example.com"


def challenge_response(*fields: str, status: int = 401) -> Response:
    name = "Proxy-Authenticate" if status == 407 else "WWW-Authenticate"
    return Response(status, "Unauthorized", Headers([(name, f) for f in fields]))


# --- known answers ---


def test_rfc2617_section_3_5_example() -> None:
    # RFC 2617 §3.5: Mufasa / "Circle Of Life", qop=auth, MD5
    assert (
        digest(
            algorithm="MD5",
            username="Mufasa",
            realm="testrealm@host.com",
            password="Circle Of Life",
            nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
            method="GET",
            uri="/dir/index.html",
            qop="auth",
            nc="00000001",
            cnonce="0a4f113b",
        )
        == "6629fae49393a05397450978507c4ef1"
    )


def rfc7616(algorithm: str, *, qop: str | None = "auth") -> str:
    """RFC 7616 §3.9.1's inputs (Mufasa / "Circle of Life")."""
    return digest(
        algorithm=algorithm,
        username="Mufasa",
        realm="http-auth@example.org",
        password="Circle of Life",
        nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v",
        method="GET",
        uri="/dir/index.html",
        qop=qop,
        nc="00000001" if qop else None,
        cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ" if qop else None,
    )


def test_rfc7616_section_3_9_1_sha256_and_md5() -> None:
    assert rfc7616("SHA-256") == "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"
    assert rfc7616("MD5") == "8ca523f5e9506fed4657c9700eebdbec"


def test_sess_and_no_qop_variants_differ_and_are_deterministic() -> None:
    plain, sess = rfc7616("MD5"), rfc7616("MD5-sess")
    assert sess != plain and sess == rfc7616("MD5-SESS")
    assert rfc7616("MD5", qop=None) not in (plain, sess)
    assert len(rfc7616("SHA-256-sess")) == 64 and rfc7616("SHA-256-sess") != rfc7616("SHA-256")
    with pytest.raises(ValueError):
        rfc7616("SHA-512-256")


# --- parsing ---


def test_parse_challenge_quoted_commas_case_and_escapes() -> None:
    ch = parse_challenge(
        'digest REALM="a, \\"b\\"", Nonce="n1", QOP="auth,auth-int", Algorithm=sha-256, '
        'opaque="o", stale=TRUE'
    )
    assert ch.realm == 'a, "b"' and ch.nonce == "n1" and ch.algorithm == "SHA-256"
    assert ch.qop == ("auth", "auth-int") and ch.opaque == "o" and ch.stale


def test_several_challenges_in_one_field_and_unknown_schemes_skipped() -> None:
    found = parse_challenges(
        'Basic realm="x", Digest realm="r", nonce="1", algorithm=SHA-512-256, '
        'Digest realm="r", nonce="2", algorithm=MD5, Bearer abc=='
    )
    assert [(c.nonce, c.algorithm) for c in found] == [("2", "MD5")]


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "Digest realm=",
        'Digest realm="unterminated',
        'Digest realm="a", realm="b", nonce="n"',
        'Digest realm="a" nonce="n"',
        "realm=x",
    ],
)
def test_malformed_challenges_raise_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_challenge(bad)


def test_parse_authorization_requires_parts() -> None:
    a = parse_authorization(
        'Digest username="u", realm="r", nonce="n", uri="sip:x", response="ABC", qop=auth, nc=00000001, '
        'cnonce="c", algorithm=SHA-256'
    )
    assert a.response == "abc" and a.nc == "00000001" and a.algorithm == "SHA-256"
    with pytest.raises(ValueError):
        parse_authorization('Digest username="u", realm="r", nonce="n", uri="sip:x"')
    with pytest.raises(ValueError):
        parse_authorization('Digest username="u", realm="r", nonce="n", uri="x", response="a", qop=auth')
    with pytest.raises(ValueError):
        parse_authorization(
            'Digest username="u", realm="r", nonce="n", uri="x", response="a", qop=auth, nc=1, cnonce="c"'
        )


_text = st.text(
    alphabet=st.sampled_from(list('Digest realm="nonce,=\\ \t qop auth-int SHA-256 aZ09/+')), max_size=120
)


@settings(max_examples=300, deadline=None)
@given(_text)
def test_property_challenge_parser_raises_only_value_error(value: str) -> None:
    try:
        parse_challenges(value)
    except ValueError:
        pass


@settings(max_examples=300, deadline=None)
@given(_text | st.text(max_size=200))
def test_property_authorization_parser_raises_only_value_error(value: str) -> None:
    try:
        parse_authorization(value)
    except ValueError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=30), st.text(max_size=30))
def test_property_quoted_values_round_trip(realm: str, nonce: str) -> None:
    quoted = realm.replace("\\", "\\\\").replace('"', '\\"')
    if "\r" in realm or "\n" in realm:
        return
    ch = parse_challenge(
        f'Digest realm="{quoted}", nonce="{nonce.replace(chr(92), "").replace(chr(34), "")}"'
    )
    assert ch.realm == realm


# --- client ---


def test_client_answers_a_challenge_the_server_accepts() -> None:
    server = DigestServer("pbx", [Credentials("1001", "s3cret")], secret=b"k" * 32)
    client = DigestClient(Credentials("1001", "s3cret"), rng=random.Random(1))
    answer = client.respond(challenge_response(*(v for _, v in server.challenge(0))), "REGISTER", URI)
    assert isinstance(answer, AuthAnswer)
    ((name, value),) = answer.headers
    assert name == "Authorization" and "algorithm=SHA-256" in value  # the strongest offered
    assert server.verify("REGISTER", URI, [value], 1 * S) == AuthOk("1001")


def test_client_uses_proxy_authorization_for_407() -> None:
    client = DigestClient(Credentials("u", "p"), rng=random.Random(1))
    answer = client.respond(
        challenge_response('Digest realm="r", nonce="n", qop="auth"', status=407), "INVITE", URI
    )
    assert isinstance(answer, AuthAnswer) and answer.headers[0][0] == "Proxy-Authorization"


def test_nc_counts_per_nonce_and_cnonce_is_fresh() -> None:
    client = DigestClient(Credentials("u", "p"), rng=random.Random(7))
    first = client.respond(challenge_response('Digest realm="r", nonce="n1", qop="auth"'), "REGISTER", URI)
    assert isinstance(first, AuthAnswer)
    client.accepted()
    second = client.authorization("REGISTER", URI)
    assert second is not None
    a1, a2 = (parse_authorization(x.headers[0][1]) for x in (first, second))
    assert (a1.nc, a2.nc) == ("00000001", "00000002") and a1.cnonce != a2.cnonce
    third = client.respond(
        challenge_response('Digest realm="r", nonce="n2", qop="auth", stale=true'), "REGISTER", URI
    )
    assert isinstance(third, AuthAnswer)
    a3 = parse_authorization(third.headers[0][1])
    assert a3.nonce == "n2" and a3.nc == "00000001"


def test_same_nonce_again_not_stale_is_bad_credentials() -> None:
    client = DigestClient(Credentials("u", "wrong"), rng=random.Random(1))
    ch = challenge_response('Digest realm="r", nonce="n1", qop="auth"')
    assert isinstance(client.respond(ch, "REGISTER", URI), AuthAnswer)
    assert client.respond(ch, "REGISTER", URI) == AuthRefused("bad credentials")


def test_stale_true_retries_without_giving_up_and_new_nonces_are_bounded() -> None:
    client = DigestClient(Credentials("u", "p"), rng=random.Random(1))
    assert isinstance(
        client.respond(challenge_response('Digest realm="r", nonce="a"'), "INVITE", URI), AuthAnswer
    )
    stale = challenge_response('Digest realm="r", nonce="b", stale=true')
    assert isinstance(client.respond(stale, "INVITE", URI), AuthAnswer)
    # a server that sends a fresh nonce with every refusal (Asterisk): the second refusal gives up
    assert isinstance(
        client.respond(challenge_response('Digest realm="r", nonce="c"'), "INVITE", URI), AuthAnswer
    )
    assert client.respond(challenge_response('Digest realm="r", nonce="d"'), "INVITE", URI) == AuthRefused(
        "bad credentials"
    )


def test_no_qop_server_gets_an_rfc2069_answer() -> None:
    client = DigestClient(Credentials("Mufasa", "Circle Of Life"), rng=random.Random(1))
    answer = client.respond(
        challenge_response('Digest realm="testrealm@host.com", nonce="abc"'), "INVITE", URI
    )
    assert isinstance(answer, AuthAnswer)
    a = parse_authorization(answer.headers[0][1])
    assert a.qop is None and a.nc is None
    expected = digest(
        algorithm="MD5",
        username="Mufasa",
        realm="testrealm@host.com",
        password="Circle Of Life",
        nonce="abc",
        method="INVITE",
        uri=URI,
    )
    assert a.response == expected


def test_credentials_for_another_realm_are_not_sent() -> None:
    client = DigestClient(Credentials("u", "p", realm="mine"), rng=random.Random(1))
    result = client.respond(challenge_response('Digest realm="theirs", nonce="n"'), "INVITE", URI)
    assert isinstance(result, AuthRefused) and "theirs" in result.reason


def test_no_object_shows_a_password_or_ha1() -> None:
    password = "hunter2-Secret"
    creds = Credentials("alice", password)
    client = DigestClient(creds, rng=random.Random(1))
    client.respond(challenge_response('Digest realm="r", nonce="n", qop="auth"'), "INVITE", URI)
    server = DigestServer("r", [creds], secret=b"x" * 32)
    ha1 = hashlib.md5(f"alice:r:{password}".encode()).hexdigest()
    for obj in (creds, client, server):
        for text in (repr(obj), str(obj)):
            assert password not in text and ha1 not in text


# --- server ---


def test_server_stateless_nonce_expires_to_stale() -> None:
    server = DigestServer("r", [Credentials("u", "p")], secret=b"s" * 32, nonce_ttl_s=60)
    client = DigestClient(Credentials("u", "p"), rng=random.Random(3))
    answer = client.respond(challenge_response(server.challenge(0)[0][1]), "INVITE", URI)
    assert isinstance(answer, AuthAnswer)
    assert server.verify("INVITE", URI, [answer.headers[0][1]], 61 * S) == AuthStale()
    assert any("stale=TRUE" in v for _, v in server.challenge(61 * S, stale=True))


def test_server_refuses_wrong_password_tampered_nonce_and_replay() -> None:
    server = DigestServer("r", [Credentials("u", "p")], secret=b"s" * 32)
    good = DigestClient(Credentials("u", "p"), rng=random.Random(3))
    bad = DigestClient(Credentials("u", "nope"), rng=random.Random(3))
    ch = challenge_response(server.challenge(0)[0][1])
    wrong = bad.respond(ch, "INVITE", URI)
    right = good.respond(ch, "INVITE", URI)
    assert isinstance(wrong, AuthAnswer) and isinstance(right, AuthAnswer)
    assert server.verify("INVITE", URI, [wrong.headers[0][1]], S) == AuthFailed("wrong response")
    value = right.headers[0][1]
    assert server.verify("INVITE", URI, [value], S) == AuthOk("u")
    assert server.verify("INVITE", URI, [value], 2 * S) == AuthFailed("replayed nc")  # the same nc again
    other = DigestServer("r", [Credentials("u", "p")], secret=b"t" * 32)
    assert other.verify("INVITE", URI, [value], S) == AuthFailed("not our nonce")
    assert server.verify("INVITE", "sip:other", [value], S) == AuthFailed(
        "uri does not match the Request-URI"
    )
    assert server.verify("INVITE", URI, [], S) == AuthMissing()


def test_nc_must_grow_and_the_table_is_bounded() -> None:
    server = DigestServer("r", [Credentials("u", "p")], secret=b"s" * 32, max_nonces=2)
    clients = []
    for i in range(3):
        c = DigestClient(Credentials("u", "p"), rng=random.Random(i))
        a = c.respond(challenge_response(server.challenge(i * S)[0][1]), "INVITE", URI)
        assert isinstance(a, AuthAnswer)
        assert server.verify("INVITE", URI, [a.headers[0][1]], 10 * S) == AuthOk("u")
        clients.append(c)
    assert len(server._seen) == 2
    # the first nonce was evicted: its next use gets stale=true (a new nonce), never a replayable accept
    nxt = clients[0].authorization("INVITE", URI)
    assert nxt is not None
    assert server.verify("INVITE", URI, [nxt.headers[0][1]], 11 * S) == AuthStale()
    # the newest still counts: nc 2 is accepted, nc 2 again is not
    nxt2 = clients[2].authorization("INVITE", URI)
    assert nxt2 is not None
    assert server.verify("INVITE", URI, [nxt2.headers[0][1]], 11 * S) == AuthOk("u")
    assert server.verify("INVITE", URI, [nxt2.headers[0][1]], 11 * S) == AuthFailed("replayed nc")


def test_server_requires_qop_and_checks_md5_too() -> None:
    server = DigestServer("r", [Credentials("u", "p")], secret=b"s" * 32, algorithms=("MD5",))
    nonce = server.new_nonce(0)
    no_qop = (
        f'Digest username="u", realm="r", nonce="{nonce}", uri="{URI}", '
        f'response="{digest(algorithm="MD5", username="u", realm="r", password="p", nonce=nonce, method="INVITE", uri=URI)}"'
    )
    assert server.verify("INVITE", URI, [no_qop], S) == AuthFailed("qop required")
    client = DigestClient(Credentials("u", "p"), rng=random.Random(1))
    a = client.respond(challenge_response(server.challenge(0)[0][1]), "INVITE", URI)
    assert isinstance(a, AuthAnswer) and "algorithm=MD5" in a.headers[0][1]
    assert server.verify("INVITE", URI, [a.headers[0][1]], S) == AuthOk("u")
    assert [h for h, _ in DigestServer("r", [], proxy=True).challenge(0)] == ["Proxy-Authenticate"] * 2


def test_userhash_is_verified() -> None:
    server = DigestServer("r", [Credentials("u", "p")], secret=b"s" * 32)
    client = DigestClient(Credentials("u", "p"), rng=random.Random(1))
    field = server.challenge(0)[0][1] + ", userhash=true"
    a = client.respond(challenge_response(field), "INVITE", URI)
    assert isinstance(a, AuthAnswer) and 'username="u"' not in a.headers[0][1]
    assert server.verify("INVITE", URI, [a.headers[0][1]], S) == AuthOk("u")


def test_server_verify_never_raises_on_garbage() -> None:
    server = DigestServer("r", [Credentials("u", "p")], secret=b"s" * 32)
    for junk in [
        "",
        "Digest",
        'Digest realm="r"',
        'Digest username="u", realm="r", nonce="@@", uri="x", response="y", qop=auth, nc=00000001, cnonce="c"',
    ]:
        assert isinstance(server.verify("INVITE", URI, [junk], S), AuthMissing | AuthFailed)
