"""sip.core.uri: SIP, SIPS and tel URIs (RFC 3261 §19.1, §25.1; RFC 3966; RFC 4475 esc01, escnull, semiuri, intmeth)."""

from __future__ import annotations

import pytest

from sip.core.uri import SipUri, parse_uri, uri_scheme


def test_plain_sip_uri() -> None:
    uri = parse_uri("sip:alice@atlanta.com")
    assert uri == SipUri("sip", "alice", None, "atlanta.com")
    assert str(uri) == "sip:alice@atlanta.com"


def test_all_parts() -> None:
    text = (
        "sips:alice:secretword@gateway.example.com:5061;transport=tcp;lr?subject=project%20x&priority=urgent"
    )
    uri = parse_uri(text)
    assert (uri.scheme, uri.user, uri.password, uri.host, uri.port) == (
        "sips",
        "alice",
        "secretword",
        "gateway.example.com",
        5061,
    )
    assert uri.params == (("transport", "tcp"), ("lr", None))
    assert uri.headers == (("subject", "project x"), ("priority", "urgent"))
    assert uri.transport == "tcp" and uri.param("LR") == "" and uri.param("maddr") is None
    assert uri.has_param("lr") and not uri.has_param("maddr")
    assert str(uri) == text
    assert parse_uri(str(uri)) == uri


def test_host_only_and_ipv4() -> None:
    assert parse_uri("sip:registrar.biloxi.com") == SipUri("sip", None, None, "registrar.biloxi.com")
    uri = parse_uri("sip:192.0.2.4:5060")
    assert (uri.user, uri.host, uri.port, uri.host_port) == (None, "192.0.2.4", 5060, "192.0.2.4:5060")


def test_ipv6_reference() -> None:
    uri = parse_uri("sip:bob@[2001:db8::10]:5070;transport=udp")
    assert (uri.host, uri.port, uri.host_port) == ("2001:db8::10", 5070, "[2001:db8::10]:5070")
    assert str(uri) == "sip:bob@[2001:db8::10]:5070;transport=udp"
    assert parse_uri("sip:[::1]").host == "::1"


def test_scheme_is_case_insensitive() -> None:
    uri = parse_uri("SIP:Bob@Example.COM")
    assert uri.scheme == "sip" and uri.host == "Example.COM" and uri.user == "Bob"
    assert str(uri) == "sip:Bob@Example.COM"


def test_escaped_user_is_unescaped_and_re_escaped_esc01() -> None:
    uri = parse_uri("sip:sips%3Auser%40example.com@example.net")
    assert uri.user == "sips:user@example.com" and uri.host == "example.net"
    assert str(uri) == "sip:sips%3Auser%40example.com@example.net"
    assert parse_uri("sip:%75se%72@example.com").user == "user"
    assert str(parse_uri("sip:%75se%72@example.com")) == "sip:user@example.com"
    assert parse_uri("sip:I%20have%20spaces@example.net").user == "I have spaces"


def test_escaped_params_esc01() -> None:
    uri = parse_uri("sip:cal%6Cer@host5.example.net;%6C%72;n%61me=v%61lue%25%34%31")
    assert uri.user == "caller" and uri.params == (("lr", None), ("name", "value%41"))
    assert parse_uri(str(uri)) == uri and str(uri) == "sip:caller@host5.example.net;lr;name=value%2541"


def test_escaped_nulls_escnull() -> None:
    uri = parse_uri("sip:null-%00-null@example.com")
    assert uri.user == "null-\x00-null"
    assert str(uri) == "sip:null-%00-null@example.com"
    assert parse_uri("sip:%00%00@host5.example.com").user == "\x00\x00"


def test_non_utf8_escapes_survive_a_round_trip() -> None:
    uri = parse_uri("sip:%FF%FE@example.com")
    assert str(uri) == "sip:%FF%FE@example.com" and parse_uri(str(uri)) == uri


def test_semicolons_in_the_user_part_semiuri() -> None:
    uri = parse_uri("sip:user;par=u%40example.net@example.com")
    assert uri.user == "user;par=u@example.net" and uri.host == "example.com" and uri.params == ()


def test_wide_range_of_user_and_password_characters_intmeth() -> None:
    text = "sip:1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*:&it+has=1,weird!*pas$wo~d_too.(doesn't-it)@example.com"
    uri = parse_uri(text)
    assert uri.user == "1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*"
    assert uri.password == "&it+has=1,weird!*pas$wo~d_too.(doesn't-it)"
    assert uri.host == "example.com" and str(uri) == text


def test_user_phone() -> None:
    uri = parse_uri("sip:+1-212-555-1212:1234@gateway.com;user=phone")
    assert uri.is_phone and uri.user == "+1-212-555-1212" and uri.password == "1234"
    assert not parse_uri("sip:alice@example.com").is_phone


def test_unescaped_hash_in_the_user_part_is_accepted_and_printed_escaped() -> None:
    uri = parse_uri("sip:*67#5551234@carrier.example.com")
    assert uri.user == "*67#5551234" and str(uri) == "sip:*67%235551234@carrier.example.com"
    assert parse_uri(str(uri)) == uri


def test_tel_uri() -> None:
    uri = parse_uri("tel:+1-201-555-0123;phone-context=example.com")
    assert (uri.scheme, uri.user, uri.host, uri.port) == ("tel", "+1-201-555-0123", "", None)
    assert uri.params == (("phone-context", "example.com"),) and uri.is_phone
    assert str(uri) == "tel:+1-201-555-0123;phone-context=example.com"
    assert parse_uri("tel:7042;phone-context=+1-201").user == "7042"


def test_with_params_replaces_case_insensitively() -> None:
    uri = parse_uri("sip:a@b;Transport=udp;lr")
    assert uri.with_params(("transport", "tcp")).params == (("lr", None), ("transport", "tcp"))


def test_uri_scheme() -> None:
    assert uri_scheme("SIP:a@b") == "sip"
    assert uri_scheme("nobodyknowsthisscheme:totallyopaquecontent") == "nobodyknowsthisscheme"
    assert uri_scheme("soap.beep://192.0.2.103:3002") == "soap.beep"
    assert uri_scheme("no scheme") is None and uri_scheme("1abc:x") is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "alice@example.com",
        "sip:",
        "sip:alice@",
        "sip:@example.com",
        "sip:alice@exa mple.com",
        "sip:alice@example.com:99999",
        "sip:alice@example.com:port",
        "sip:alice@[2001:db8::1",
        "sip:alice@[not-ipv6]",
        "sip:alice@[2001:db8::1]x",
        "sip:al%4@example.com",
        "sip:al%zz@example.com",
        "sip:al<ice@example.com",
        "sip:alice@example.com;",
        "sip:alice@example.com;=x",
        "sip:alice@example.com?",
        "sip:alice@example.com?novalue",
        "sip:alice@-bad-.com",
        "sip:alice@a..b",
        "sip:ålice@example.com",
        "http://example.com",
        "nobodyknowsthisscheme:totallyopaquecontent",
        "tel:",
        "tel:+1 212",
        "tel:+1;x=1?h=1",
    ],
)
def test_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_uri(text)


@pytest.mark.parametrize(
    "text",
    [
        "sip:alice@atlanta.com;maddr=239.255.255.1;ttl=15",
        "sip:alice@atlanta.com?subject=project%20x",
        "sips:1212@gateway.com",
        "sip:atlanta.com;method=REGISTER?to=alice%40atlanta.com",
        "sip:alice;day=tuesday@atlanta.com",
        "sip:services.example.com;lr;unknownwith=value;unknown-no-value",
        "sip:host.example.com.",
        "sip:_sip._udp.example.com",
    ],
)
def test_rfc_examples_round_trip(text: str) -> None:
    uri = parse_uri(text)
    assert str(uri) == text and parse_uri(str(uri)) == uri
