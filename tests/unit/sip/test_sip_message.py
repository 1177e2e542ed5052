"""sip.core.message, sip.core.headers and sip.core.framing: Headers, parse, serialize, StreamFramer, the header value
helpers, make_response, check_request."""

from __future__ import annotations

import dataclasses

import pytest

from sip.core.framing import StreamFramer, is_keepalive
from sip.core.headers import Headers, NameAddr, Via, parse_cseq, parse_name_addr, parse_via
from sip.core.message import (
    MAX_MESSAGE_SIZE,
    ParseError,
    Request,
    Response,
    check_request,
    make_response,
    parse,
    reason_phrase,
    serialize,
)


def _msg(*lines: str, body: str = "") -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


def _invite(*extra: str, body: str = "", content_length: bool = True, **override: str) -> bytes:
    """An INVITE with the usual headers; `override` replaces one (``Call_ID="x"``; ``"-"`` removes it)."""
    return _build_invite(extra, body, content_length, override)


def _build_invite(extra: tuple[str, ...], body: str, content_length: bool, override: dict[str, str]) -> bytes:
    headers = {
        "Via": "SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK776asdhds",
        "Max-Forwards": "70",
        "To": "Bob <sip:bob@example.com>",
        "From": "Alice <sip:alice@example.org>;tag=1928301774",
        "Call-ID": "a84b4c76e66710@pc33.example.org",
        "CSeq": "314159 INVITE",
    }
    headers.update({k.replace("_", "-"): v for k, v in override.items()})
    lines = [f"{k}: {v}" for k, v in headers.items() if v != "-"]
    lines.extend(extra)
    if content_length:
        lines.append(f"Content-Length: {len(body.encode())}")
    return _msg("INVITE sip:bob@example.com SIP/2.0", *lines, body=body)


def _parse_error(data: bytes) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse(data)
    return info.value


# --- Headers ---------------------------------------------------------------------------------------------------


COMPACT = {
    "i": "Call-ID",
    "m": "Contact",
    "f": "From",
    "t": "To",
    "v": "Via",
    "l": "Content-Length",
    "c": "Content-Type",
    "e": "Content-Encoding",
    "s": "Subject",
    "k": "Supported",
    "o": "Event",
    "r": "Refer-To",
    "b": "Referred-By",
    "u": "Allow-Events",
    "x": "Session-Expires",
    "a": "Accept-Contact",
    "j": "Reject-Contact",
    "d": "Request-Disposition",
    "y": "Identity",
    "n": "Identity-Info",
}


@pytest.mark.parametrize(("short", "canonical"), sorted(COMPACT.items()))
def test_compact_forms_expand_to_canonical_names(short: str, canonical: str) -> None:
    for spelling in (short, short.upper()):
        headers = Headers([(spelling, "value")])
        assert headers.items() == ((canonical, "value"),)
        assert headers.get(canonical) == "value"
        assert headers.get(canonical.lower()) == "value"
        assert headers.get(short) == "value"  # looking up by the compact form works too
        assert canonical in headers and short in headers


def test_names_are_case_insensitive_and_known_names_canonical() -> None:
    headers = Headers(
        [("call-id", "x"), ("CSEQ", "1 INVITE"), ("www-authenticate", "Digest realm=a"), ("X-Odd", "1")]
    )
    assert [name for name, _ in headers.items()] == ["Call-ID", "CSeq", "WWW-Authenticate", "X-Odd"]
    assert headers.get("CALL-ID") == "x" and headers.get("x-odd") == "1"
    assert headers.get("Missing") is None and "Missing" not in headers
    assert 3 not in headers


def test_get_all_splits_list_headers_outside_quotes_and_angle_brackets() -> None:
    headers = Headers(
        [
            ("Contact", '"Doe, John" <sip:j@a.example;p=a,b>;q=0.5, <sip:k@b.example>'),
            ("Contact", "sip:l@c.example"),
            ("Via", "SIP/2.0/UDP a;branch=z9hG4bK1, SIP/2.0/TCP b;branch=z9hG4bK2"),
            ("Allow", "INVITE, ACK,,BYE"),
        ]
    )
    assert headers.get_all("Contact") == (
        '"Doe, John" <sip:j@a.example;p=a,b>;q=0.5',
        "<sip:k@b.example>",
        "sip:l@c.example",
    )
    assert headers.get_all("v") == ("SIP/2.0/UDP a;branch=z9hG4bK1", "SIP/2.0/TCP b;branch=z9hG4bK2")
    assert headers.get_all("Allow") == ("INVITE", "ACK", "BYE")  # empty elements dropped
    assert headers.get("Contact") == '"Doe, John" <sip:j@a.example;p=a,b>;q=0.5, <sip:k@b.example>'


def test_get_all_splits_with_escaped_quotes_inside_quoted_strings() -> None:
    headers = Headers([("Route", r'"a\", b" <sip:x@y>, <sip:z@w>')])
    assert headers.get_all("Route") == (r'"a\", b" <sip:x@y>', "<sip:z@w>")


@pytest.mark.parametrize(
    "name",
    [
        "WWW-Authenticate",
        "Authorization",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Date",
        "From",
        "X-Custom",
    ],
)
def test_get_all_never_splits_non_list_headers(name: str) -> None:
    value = 'Digest realm="a, b", nonce="n", qop="auth,auth-int"'
    headers = Headers([(name, value), (name, "second, field")])
    assert headers.get_all(name) == (value, "second, field")


def test_with_header_replaced_without_are_copies() -> None:
    base = Headers([("Via", "v1"), ("To", "t"), ("Via", "v2")])
    added = base.with_header("v", "v3")
    assert added.get_all("Via") == ("v1", "v2", "v3") and base.get_all("Via") == ("v1", "v2")
    replaced = base.replaced("via", "only")
    assert replaced.items() == (("Via", "only"), ("To", "t"))
    appended = base.replaced("Call-ID", "c")
    assert appended.items()[-1] == ("Call-ID", "c")
    assert base.without("VIA").items() == (("To", "t"),)
    assert base.without("Nope") == base
    assert base == Headers([("v", "v1"), ("t", "t"), ("v", "v2")]) and hash(base) == hash(
        Headers(base.items())
    )
    assert len(base) == 3 and list(base) == list(base.items())


def test_headers_refuse_injection_and_bad_names() -> None:
    with pytest.raises(ValueError):
        Headers([("Subject", "hi\r\nVia: evil")])
    with pytest.raises(ValueError):
        Headers([("Subject", "line\nbreak")])
    with pytest.raises(ValueError):
        Headers([("Bad Name", "x")])
    with pytest.raises(ValueError):
        Headers([("", "x")])
    with pytest.raises(ValueError):
        Headers().with_header("Sub:ject", "x")


def test_headers_are_immutable() -> None:
    headers = Headers([("To", "x")])
    with pytest.raises(AttributeError):
        headers.extra = 1  # type: ignore[attr-defined]
    request = Request("OPTIONS", "sip:a@b", headers)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.method = "BYE"  # type: ignore[misc]


# --- parse -----------------------------------------------------------------------------------------------------


def test_parse_a_plain_invite_with_body() -> None:
    message = parse(_invite("Content-Type: application/sdp", body="v=0\r\n"))
    assert isinstance(message, Request)
    assert (message.method, message.uri, message.body) == ("INVITE", "sip:bob@example.com", b"v=0\r\n")
    assert message.headers.get("Call-ID") == "a84b4c76e66710@pc33.example.org"
    assert parse_cseq(message.headers.get("CSeq") or "") == (314159, "INVITE")
    assert "Content-Length" not in message.headers  # framing only; serialize writes it from the body


def test_parse_unfolds_continuation_lines_and_strips_lws() -> None:
    data = _msg(
        "OPTIONS sip:a@example.com SIP/2.0",
        "Via: SIP/2.0/UDP\r\n  192.0.2.1;branch=z9hG4bK1",
        "To:\t<sip:a@example.com>",
        "From   :  <sip:b@example.com>\r\n\t;tag=1",
        "Call-ID: c1",
        "CSeq: 1\r\n  OPTIONS",
        "Subject: one\r\n two\r\n\tthree   ",
        "Content-Length: 0",
    )
    message = parse(data)
    assert message.headers.get("Subject") == "one two three"
    assert message.headers.get("From") == "<sip:b@example.com> ;tag=1"
    assert parse_via(message.headers.get("Via") or "").host == "192.0.2.1"
    assert parse_name_addr(message.headers.get("From") or "").tag == "1"


def test_parse_keeps_repeated_and_comma_separated_headers_in_order() -> None:
    message = parse(
        _invite(
            "Route: <sip:p1.example.com;lr>, <sip:p2.example.com;lr>",
            "Route: <sip:p3.example.com;lr>",
            "Record-Route: <sip:rr.example.com;lr>",
        )
    )
    assert message.headers.get_all("Route") == (
        "<sip:p1.example.com;lr>",
        "<sip:p2.example.com;lr>",
        "<sip:p3.example.com;lr>",
    )


def test_parse_skips_crlf_before_the_start_line() -> None:
    message = parse(b"\r\n\r\n" + _invite())
    assert isinstance(message, Request) and message.method == "INVITE"


def test_content_length_missing_on_udp_means_the_rest_of_the_datagram() -> None:
    message = parse(_invite(content_length=False, body="v=0\r\no=x\r\n"))
    assert message.body == b"v=0\r\no=x\r\n"


def test_content_length_smaller_than_the_body_truncates() -> None:
    data = _invite(body="abc").replace(b"Content-Length: 3", b"Content-Length: 2")
    assert parse(data).body == b"ab"


def test_content_length_larger_than_the_body_is_a_400_that_can_be_answered() -> None:
    error = _parse_error(_invite(body="abc").replace(b"Content-Length: 3", b"Content-Length: 30"))
    assert error.status == 400 and "Content-Length" in error.reason
    assert error.partial is not None and error.partial.method == "INVITE" and error.partial.body == b""


@pytest.mark.parametrize("value", ["-1", "abc", "1e3", "", "٣"])
def test_bad_content_length_is_a_400(value: str) -> None:
    error = _parse_error(_invite(f"Content-Length: {value}", content_length=False))
    assert error.status == 400 and error.reason.startswith("Bad Content-Length")


def test_two_content_lengths_are_a_400() -> None:
    error = _parse_error(_invite("l: 0"))
    assert (error.status, error.reason) == (400, "Multiple Content-Length headers")


@pytest.mark.parametrize("name", ["Via", "From", "To", "Call-ID", "CSeq"])
def test_each_mandatory_header_missing_is_a_400_naming_it_and_unanswerable(name: str) -> None:
    error = _parse_error(_build_invite((), "", True, {name: "-"}))
    assert (error.status, error.reason) == (400, f"Missing {name} header")
    assert error.partial is None  # no response can be built: drop and count


def test_max_forwards_missing_is_tolerated() -> None:
    message = parse(_invite(Max_Forwards="-"))
    assert "Max-Forwards" not in message.headers


@pytest.mark.parametrize("value", ["256", "x", "-1", "1 2"])
def test_bad_max_forwards_is_a_400_with_partial(value: str) -> None:
    error = _parse_error(_invite(Max_Forwards=value))
    assert (error.status, error.reason) == (400, "Bad Max-Forwards header")
    assert error.partial is not None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("From", "Alice sip:alice@example.org"),
        ("To", '"Bob <sip:bob@example.com>'),
        ("Call-ID", "has space"),
        ("Via", "SIP/2.0/UDP"),
        ("Via", "SIP/2.0/UDP host;;branch=z9hG4bK1"),
    ],
)
def test_malformed_mandatory_header_is_a_400_naming_it(name: str, value: str) -> None:
    error = _parse_error(_build_invite((), "", True, {name: value}))
    assert (error.status, error.reason) == (400, f"Bad {name} header")
    assert error.partial is None


def test_a_via_of_another_sip_version_is_a_400_that_can_be_answered() -> None:
    error = _parse_error(_invite(Via="SIP/3.0/UDP host;branch=z9hG4bK1"))
    assert (error.status, error.reason) == (400, "Bad Via header: not SIP/2.0")
    assert error.partial is not None
    assert parse_via("SIP/3.0/UDP host;branch=z9hG4bK1").host == "host"


@pytest.mark.parametrize("value", ["x INVITE", "1", "1 INV ITE", "2147483648 INVITE", "-1 INVITE"])
def test_bad_cseq_is_a_400(value: str) -> None:
    error = _parse_error(_invite(CSeq=value))
    assert error.status == 400 and error.reason.startswith("Bad CSeq header")


def test_cseq_method_must_match_the_request_method_and_is_answerable() -> None:
    error = _parse_error(_invite(CSeq="1 BYE"))
    assert (error.status, error.reason) == (400, "Bad CSeq header: method does not match the Request-Line")
    assert error.partial is not None and error.partial.method == "INVITE"
    response = make_response(error.partial, error.status, error.reason)
    assert response.headers.get("CSeq") == "1 BYE"


def test_a_second_from_is_a_400_that_can_still_be_answered() -> None:
    error = _parse_error(_invite("From: <sip:mallory@example.net>;tag=2"))
    assert (error.status, error.reason) == (400, "Multiple From headers")
    assert error.partial is not None


def test_too_large_is_513_with_partial() -> None:
    data = _invite(body="x" * 100)
    with pytest.raises(ParseError) as info:
        parse(data, max_size=len(data) - 1)
    assert info.value.status == 513 and info.value.partial is not None
    assert isinstance(parse(data, max_size=len(data)), Request)


def test_default_max_size_is_65535() -> None:
    assert MAX_MESSAGE_SIZE == 65_535
    body = "x" * 70_000
    with pytest.raises(ParseError) as info:
        parse(_invite(body=body))
    assert info.value.status == 513


def test_bad_version_is_505_with_partial() -> None:
    error = _parse_error(_invite().replace(b"SIP/2.0\r\n", b"SIP/7.0\r\n", 1))
    assert error.status == 505 and error.partial is not None
    assert make_response(error.partial, 505).reason == "Version Not Supported"


@pytest.mark.parametrize(
    "line",
    [
        "INVITE  sip:bob@example.com SIP/2.0",
        "INVITE sip:bob@example.com SIP/2.0 ",
        "INVITE <sip:bob@example.com> SIP/2.0",
        "INVITE sip:bob@example.com; lr SIP/2.0",
        "INVITE sip:bob@example.com",
        "INVITE sip:bob@example.com?Route=%3Csip:x%3E SIP/2.0",
        "INVITE bob@example.com SIP/2.0",
        "INV(ITE sip:bob@example.com SIP/2.0",
        "INVITE sip:bob@example.com HTTP/1.1",
    ],
)
def test_bad_request_lines_are_400(line: str) -> None:
    error = _parse_error(_invite().replace(b"INVITE sip:bob@example.com SIP/2.0", line.encode(), 1))
    assert error.status == 400


def test_unknown_request_uri_scheme_parses_and_is_left_to_the_application() -> None:
    data = _invite().replace(b"INVITE sip:bob@example.com", b"INVITE urn:service:sos", 1)
    message = parse(data)
    assert isinstance(message, Request) and message.uri == "urn:service:sos"
    rejection = check_request(message)
    assert rejection is not None and rejection.status == 416


def test_parse_a_response() -> None:
    data = _msg(
        "SIP/2.0 180 Ringing",
        "Via: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1;received=198.51.100.7",
        "From: <sip:a@example.com>;tag=1",
        "To: <sip:b@example.com>;tag=2",
        "Call-ID: c",
        "CSeq: 1 INVITE",
        "Content-Length: 0",
    )
    message = parse(data)
    assert isinstance(message, Response) and (message.status, message.reason) == (180, "Ringing")


@pytest.mark.parametrize("line", ["SIP/2.0 99 Low", "SIP/2.0 700 High", "SIP/2.0 2000 OK", "SIP/2.0 abc OK"])
def test_bad_status_codes_are_errors_without_partial(line: str) -> None:
    data = _msg(
        line,
        "Via: SIP/2.0/UDP h;branch=z9hG4bK1",
        "From: <sip:a@b>;tag=1",
        "To: <sip:c@d>",
        "Call-ID: c",
        "CSeq: 1 INVITE",
    )
    error = _parse_error(data)
    assert error.status == 400 and error.partial is None


def test_response_errors_never_have_a_partial() -> None:
    data = _msg(
        "SIP/2.0 200 OK",
        "Via: SIP/2.0/UDP h;branch=z9hG4bK1",
        "From: <sip:a@b>;tag=1",
        "Call-ID: c",
        "CSeq: 1 INVITE",
    )
    error = _parse_error(data)
    assert error.reason == "Missing To header" and error.partial is None


def test_empty_reason_phrase_and_utf8_reason() -> None:
    base = [
        "Via: SIP/2.0/UDP h;branch=z9hG4bK1",
        "From: <sip:a@b>;tag=1",
        "To: <sip:c@d>",
        "Call-ID: c",
        "CSeq: 1 INVITE",
    ]
    assert parse(_msg("SIP/2.0 100 ", *base)).reason == ""  # type: ignore[union-attr]
    assert parse(_msg("SIP/2.0 200 Très bien", *base)).reason == "Très bien"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\r\n\r\n",
        b"garbage",
        b"INVITE sip:a@b SIP/2.0\r\nVia SIP/2.0/UDP h\r\n\r\n",
        b"INVITE sip:a@b SIP/2.0\r\n continuation first\r\n\r\n",
        b"INVITE sip:a@b SIP/2.0\r\nBad Name: x\r\n\r\n",
        b"INVITE sip:a@b SIP/2.0\r\nTo: \xff\xfe\r\n\r\n",
        b"INVITE sip:a@b SIP/2.0\r\nTo: a\x00b\r\n\r\n",
        b"INVITE sip:a@b SIP/2.0\r\nTo: a\nFrom: b\r\n\r\n",
    ],
)
def test_garbage_is_a_parse_error(data: bytes) -> None:
    error = _parse_error(data)
    assert error.status == 400 and error.partial is None


def test_missing_empty_line_is_a_400_that_can_be_answered() -> None:
    data = _invite().removesuffix(b"\r\n")
    error = _parse_error(data)
    assert error.status == 400 and "empty line" in error.reason and error.partial is not None


def test_contact_route_and_date_are_checked() -> None:
    assert _parse_error(_invite("Contact: sip:a@b?Route=x")).reason == "Bad Contact header"
    assert _parse_error(_invite("Route: <sip:a@b")).reason == "Bad Route header"
    assert _parse_error(_invite("Date: Fri, 01 Jan 2010 16:00:00 EST")).reason == "Bad Date header"
    ok = parse(_invite("Contact: *", "Date: Sat, 13 Nov 2010 23:29:00 GMT", "Record-Route: <sip:p;lr>"))
    assert ok.headers.get("Contact") == "*"


def test_quoted_pair_control_characters_are_allowed_in_quoted_strings() -> None:
    message = parse(_invite(To='"BEL:\\\x07" <sip:bob@example.com>'))
    assert parse_name_addr(message.headers.get("To") or "").display == "BEL:\x07"


# --- serialize -------------------------------------------------------------------------------------------------


def test_serialize_round_trips_and_computes_content_length() -> None:
    original = parse(_invite("Content-Type: application/sdp", body="v=0\r\n"))
    wire = serialize(original)
    assert wire.startswith(b"INVITE sip:bob@example.com SIP/2.0\r\nVia: ")
    assert wire.endswith(b"Content-Length: 5\r\n\r\nv=0\r\n")
    assert parse(wire) == original


def test_serialize_ignores_a_stale_content_length() -> None:
    request = Request("BYE", "sip:a@b", Headers([("Content-Length", "999"), ("l", "7")]), b"hello")
    wire = serialize(request)
    assert wire.count(b"Content-Length") == 1 and b"Content-Length: 5\r\n\r\nhello" in wire


def test_serialize_response() -> None:
    response = Response(486, "Busy Here", Headers([("Call-ID", "x")]))
    assert serialize(response) == b"SIP/2.0 486 Busy Here\r\nCall-ID: x\r\nContent-Length: 0\r\n\r\n"


# --- header helpers --------------------------------------------------------------------------------------------


def test_parse_via_fields_and_params() -> None:
    via = parse_via(
        "SIP / 2.0 / udp  pc33.example.com : 5066 ; branch = z9hG4bK776 ;rport;received=192.0.2.9"
    )
    assert (via.transport, via.host, via.port) == ("UDP", "pc33.example.com", 5066)
    assert via.branch == "z9hG4bK776" and via.received == "192.0.2.9"
    assert via.wants_rport and via.rport is None
    assert str(via) == "SIP/2.0/UDP pc33.example.com:5066;branch=z9hG4bK776;rport;received=192.0.2.9"
    filled = via.with_params(("rport", "5066"), ("received", "198.51.100.1"))
    assert filled.rport == 5066 and filled.received == "198.51.100.1" and filled.branch == via.branch
    assert parse_via(str(filled)) == filled


def test_parse_via_ipv6_and_no_port() -> None:
    via = parse_via("SIP/2.0/TCP [2001:db8::9]:5070;branch=z9hG4bKa")
    assert (via.host, via.port, via.sent_by) == ("2001:db8::9", 5070, "[2001:db8::9]:5070")
    assert parse_via(str(via)) == via
    assert parse_via("SIP/2.0/TLS host;branch=x").port is None
    assert parse_via('SIP/2.0/UDP h;branch=x;comment="a b;c"').param("comment") == '"a b;c"'


@pytest.mark.parametrize(
    "value",
    [
        "",
        "SIP/2.0/UDP",
        "SIP/2.0 host",
        "SIP/2.0/UDP host;",
        "SIP/2.0/UDP host;;",
        "SIP/2.0/UDP host;branch=",
        "SIP/2.0/UDP host:99999",
        "SIP/2.0/UDP [nothex]",
        "SIP/2.0/UDP host junk",
        "HTTP/2.0/UDP host",
        "SIP/2.0/UDP .host",
    ],
)
def test_parse_via_rejects(value: str) -> None:
    with pytest.raises(ValueError):
        parse_via(value)


def test_parse_name_addr_forms() -> None:
    full = parse_name_addr('"Doe, \\"J\\"" <sip:j@example.com;transport=tcp>;tag=abc;expires=60')
    assert full == NameAddr(
        'Doe, "J"', "sip:j@example.com;transport=tcp", (("tag", "abc"), ("expires", "60"))
    )
    assert full.tag == "abc" and full.param("EXPIRES") == "60"
    assert full.sip_uri.transport == "tcp"
    assert parse_name_addr(str(full)) == full
    token = parse_name_addr("Bob  Smith<sip:bob@example.com>")
    assert token.display == "Bob Smith" and token.uri == "sip:bob@example.com"
    bare = parse_name_addr("<sip:x@example.com>")
    assert bare.display is None and bare.params == ()


def test_addr_spec_params_belong_to_the_header() -> None:
    # §20.10: in "sip:alice@atlanta.com;tag=1" the tag is a From parameter, not a URI parameter.
    spec = parse_name_addr("sip:alice@atlanta.com;tag=1;transport=tcp")
    assert spec.uri == "sip:alice@atlanta.com" and spec.tag == "1" and spec.param("transport") == "tcp"
    assert spec.display is None
    assert str(spec) == "<sip:alice@atlanta.com>;tag=1;transport=tcp"


def test_name_addr_with_other_schemes() -> None:
    assert parse_name_addr("<http://www.example.com>;tag=3").uri == "http://www.example.com"
    assert parse_name_addr("isbn:2983792873").uri == "isbn:2983792873"
    assert parse_name_addr("<tel:+1-212-555-0100>").sip_uri.user == "+1-212-555-0100"
    with pytest.raises(ValueError):
        _ = parse_name_addr("<http://x>").sip_uri


@pytest.mark.parametrize(
    "value",
    [
        "",
        "Bell, Alexander <sip:a@example.com>",
        '"unterminated <sip:a@example.com>',
        "< sip:a@example.com >",
        "<sip:a@example.com",
        "sip:a@example.com?Route=x",
        "no-scheme@example.com",
        "<sip:a@exa mple.com>",
        "<sip:a@example.com>;",
        "<sip:a@example.com>;tag=",
        '"quoted" sip:a@example.com',
        "<sip:a@@>",
    ],
)
def test_parse_name_addr_rejects(value: str) -> None:
    with pytest.raises(ValueError):
        parse_name_addr(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1 INVITE", (1, "INVITE")), ("  0009 \t ACK ", (9, "ACK")), ("2147483647 BYE", (2**31 - 1, "BYE"))],
)
def test_parse_cseq(value: str, expected: tuple[int, str]) -> None:
    assert parse_cseq(value) == expected


@pytest.mark.parametrize(
    "value", ["", "INVITE", "1", "2147483648 INVITE", "1 IN VITE", "one INVITE", "1 INVITE;x"]
)
def test_parse_cseq_rejects(value: str) -> None:
    with pytest.raises(ValueError):
        parse_cseq(value)


# --- make_response ---------------------------------------------------------------------------------------------


def _request() -> Request:
    message = parse(
        _invite(
            "Via: SIP/2.0/UDP proxy.example.com;branch=z9hG4bKp2",
            "Timestamp: 54",
            "Contact: <sip:alice@192.0.2.1>",
            Via="SIP/2.0/UDP proxy1.example.com;branch=z9hG4bKp1, SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKa",
        )
    )
    assert isinstance(message, Request)
    return message


def test_make_response_copies_via_from_to_call_id_cseq() -> None:
    request = _request()
    response = make_response(request, 486)
    assert (response.status, response.reason) == (486, "Busy Here")
    assert response.headers.get_fields("Via") == request.headers.get_fields("Via")
    assert response.headers.get_all("Via")[0].startswith("SIP/2.0/UDP proxy1")
    for name in ("From", "To", "Call-ID", "CSeq"):
        assert response.headers.get(name) == request.headers.get(name)
    assert "Contact" not in response.headers and "Timestamp" not in response.headers
    assert "Max-Forwards" not in response.headers


def test_make_response_adds_the_to_tag_once() -> None:
    request = _request()
    tagged = make_response(request, 200, to_tag="as83kd9bs")
    assert parse_name_addr(tagged.headers.get("To") or "").tag == "as83kd9bs"
    already = Request(
        request.method, request.uri, request.headers.replaced("To", "<sip:bob@example.com>;tag=old")
    )
    assert parse_name_addr(make_response(already, 200, to_tag="new").headers.get("To") or "").tag == "old"
    assert make_response(request, 100, to_tag=None).headers.get("To") == request.headers.get("To")


def test_make_response_extras_body_reason_and_timestamp() -> None:
    request = _request()
    response = make_response(
        request, 200, "Fine", to_tag="t", headers=[("Content-Type", "application/sdp")], body=b"v=0\r\n"
    )
    assert response.reason == "Fine" and response.body == b"v=0\r\n"
    assert response.headers.items()[-1] == ("Content-Type", "application/sdp")
    assert make_response(request, 100).headers.get("Timestamp") == "54"
    wire = serialize(response)
    assert parse(wire) == response


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (100, "Trying"),
        (180, "Ringing"),
        (200, "OK"),
        (481, "Call/Transaction Does Not Exist"),
        (487, "Request Terminated"),
        (488, "Not Acceptable Here"),
        (491, "Request Pending"),
        (513, "Message Too Large"),
        (599, "Server Error"),
        (499, "Client Error"),
    ],
)
def test_reason_phrases(status: int, reason: str) -> None:
    assert reason_phrase(status) == reason


# --- StreamFramer ----------------------------------------------------------------------------------------------


def test_framer_frames_two_messages_in_one_chunk() -> None:
    one, two = _invite(body="abc"), _invite(body="defg")
    framer = StreamFramer()
    out = framer.feed(one + two)
    assert [m.body for m in out if isinstance(m, Request)] == [b"abc", b"defg"]
    assert framer.buffered == 0 and not framer.must_close


def test_framer_byte_at_a_time() -> None:
    data = _invite(body="hello") + b"\r\n\r\n" + _invite(body="x")
    framer = StreamFramer()
    out: list[object] = []
    for i in range(len(data)):
        out.extend(framer.feed(data[i : i + 1]))
    assert [m.body for m in out if isinstance(m, Request)] == [b"hello", b"x"]
    assert framer.take_pings() == 1 and framer.take_pings() == 0


def test_framer_counts_keepalive_pings() -> None:
    framer = StreamFramer()
    assert framer.feed(b"\r\n\r\n\r\n\r\n") == []
    assert framer.take_pings() == 2
    assert framer.feed(b"\r\n") == [] and framer.take_pings() == 0  # a pong, not a ping


def test_framer_waits_for_the_body() -> None:
    data = _invite(body="0123456789")
    framer = StreamFramer()
    assert framer.feed(data[:-4]) == []
    out = framer.feed(data[-4:])
    assert len(out) == 1 and isinstance(out[0], Request) and out[0].body == b"0123456789"


def test_framer_requires_content_length_and_then_closes() -> None:
    framer = StreamFramer()
    out = framer.feed(_invite(content_length=False) + _invite())
    assert len(out) == 1 and isinstance(out[0], ParseError) and out[0].status == 400
    assert "Content-Length" in out[0].reason and framer.must_close
    assert framer.feed(_invite()) == []


def test_framer_bounds_the_header_section() -> None:
    framer = StreamFramer(max_size=1000)
    out = framer.feed(b"INVITE sip:a@b SIP/2.0\r\nX: " + b"a" * 2000)
    assert len(out) == 1 and isinstance(out[0], ParseError) and out[0].status == 513
    assert framer.must_close and framer.buffered == 0


def test_framer_refuses_an_overlong_body_announcement() -> None:
    framer = StreamFramer(max_size=1000)
    out = framer.feed(
        _invite(content_length=False, body="").removesuffix(b"\r\n\r\n") + b"\r\nl: 5000\r\n\r\n"
    )
    assert len(out) == 1 and isinstance(out[0], ParseError) and out[0].status == 513 and framer.must_close


def test_framer_keeps_going_after_a_framed_bad_message() -> None:
    framer = StreamFramer()
    out = framer.feed(_invite(CSeq="1 BYE") + _invite())
    assert isinstance(out[0], ParseError) and out[0].partial is not None
    assert isinstance(out[1], Request) and not framer.must_close


# --- check_request ---------------------------------------------------------------------------------------------


ALLOWED = ("INVITE", "ACK", "BYE", "CANCEL", "OPTIONS")


def _checked(data: bytes, **kwargs: object) -> tuple[int, str, tuple[tuple[str, str], ...]] | None:
    message = parse(data)
    assert isinstance(message, Request)
    rejection = check_request(message, allowed_methods=ALLOWED, **kwargs)  # type: ignore[arg-type]
    return None if rejection is None else (rejection.status, rejection.reason, rejection.headers)


def test_check_request_accepts_a_normal_invite() -> None:
    assert (
        _checked(
            _invite("Content-Type: application/sdp", "Require: timer", body="v=0\r\n"),
            supported_options=("timer",),
        )
        is None
    )


def test_check_request_405_501_416_420_415_406() -> None:
    register = _invite(CSeq="1 REGISTER").replace(b"INVITE sip:", b"REGISTER sip:", 1)
    assert _checked(register) == (405, "Method Not Allowed", (("Allow", ", ".join(ALLOWED)),))
    odd = _invite(CSeq="1 FROB").replace(b"INVITE sip:", b"FROB sip:", 1)
    assert _checked(odd) is not None and _checked(odd)[0] == 501  # type: ignore[index]
    assert _checked(_invite().replace(b"INVITE sip:bob@example.com", b"INVITE im:bob@example.com"))[0] == 416  # type: ignore[index]
    assert _checked(_invite("Require: foo, 100rel"), supported_options=("100rel",)) == (
        420,
        "Bad Extension",
        (("Unsupported", "foo"),),
    )
    assert _checked(_invite("Content-Type: text/plain", body="hi"))[0] == 415  # type: ignore[index]
    assert _checked(_invite("Content-Type: application/sdp", "Content-Encoding: gzip", body="x"))[0] == 415  # type: ignore[index]
    assert _checked(_invite("Accept: text/html"))[0] == 406  # type: ignore[index]
    assert _checked(_invite("Accept: application/*")) is None


def test_check_request_does_not_apply_require_to_ack_and_cancel() -> None:
    ack = _invite("Require: foo", CSeq="314159 ACK").replace(b"INVITE sip:", b"ACK sip:", 1)
    assert _checked(ack) is None


def test_check_request_max_forwards_zero_only_when_asked() -> None:
    data = _invite(Max_Forwards="0")
    assert _checked(data) is None
    assert _checked(data, reject_zero_max_forwards=True) == (483, "Too Many Hops", ())


def test_framer_frames_a_message_with_a_bad_header_so_it_can_be_answered() -> None:
    framer = StreamFramer()
    out = framer.feed(_invite("Foobar roobar") + _invite())
    assert isinstance(out[0], ParseError) and out[0].reason == "Malformed header line"
    assert isinstance(out[1], Request) and not framer.must_close


# --- numbers that int() must not see ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {"CSeq": "9" * 5000 + " INVITE"},
        {"Max_Forwards": "9" * 5000},
        {"Max_Forwards": "²"},
        {"CSeq": "² INVITE"},
    ],
)
def test_huge_and_odd_digit_strings_are_parse_errors(extra: dict[str, str]) -> None:
    error = _parse_error(_build_invite((), "", True, extra))
    assert error.status == 400


def test_huge_content_length_on_datagram_and_stream() -> None:
    data = _invite(f"Content-Length: {'9' * 5000}", content_length=False)
    assert _parse_error(data).reason.startswith("Bad Content-Length")
    framer = StreamFramer()
    out = framer.feed(data)
    assert isinstance(out[0], ParseError) and framer.must_close
    assert Via("UDP", "h", None, (("rport", "²"),)).rport is None


def test_unquoted_display_names_may_be_non_ascii_but_not_hold_a_comma() -> None:
    assert parse_name_addr("Jürgen (Büro) <sip:j@example.de>").display == "Jürgen (Büro)"
    with pytest.raises(ValueError):
        parse_name_addr("Müller, Jürgen <sip:j@example.de>")


def test_check_request_on_a_hand_built_request_with_a_bad_via() -> None:
    request = Request("OPTIONS", "sip:a@b", Headers([("Via", "nonsense")]))
    rejection = check_request(request)
    assert rejection is not None and (rejection.status, rejection.reason) == (400, "Bad Via header")


def test_headers_strip_values_and_refuse_bare_control_characters() -> None:
    assert Headers([("Subject", "  hi \t")]).get("Subject") == "hi"
    with pytest.raises(ValueError):
        Headers([("Subject", "a\x00b")])
    quoted_pair = '"BEL:\\\x07" <sip:a@b>'
    assert Headers([("To", quoted_pair)]).get("To") == quoted_pair


def test_serialize_refuses_line_breaks_in_the_start_line() -> None:
    with pytest.raises(ValueError):
        serialize(Response(200, "OK\r\nVia: x", Headers()))
    with pytest.raises(ValueError):
        serialize(Request("OPTIONS", "sip:a@b\r\nX: y", Headers()))


@pytest.mark.parametrize(
    ("data", "expected"), [(b"\r\n", True), (b"\r\n\r\n", True), (b"", False), (b"\r\nx", False)]
)
def test_is_keepalive(data: bytes, expected: bool) -> None:
    assert is_keepalive(data) is expected


def test_parse_via_refuses_a_bad_ipv6_reference() -> None:
    with pytest.raises(ValueError):
        parse_via("SIP/2.0/UDP [1:2:3:4:5:6:7:8:9];branch=z9hG4bK1")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"Foobar roobar", "Malformed header line"),
        (b"Subject: caf\xe9", "Header section is not UTF-8"),
        (b"Subject: a\x01b", "Control character in the header section"),
        (b"Subject: ok\r\n \x01 folded", "Control character in the header section"),
        (b"Bad Name: x\r\n continued", "Malformed header line"),
    ],
)
def test_a_bad_non_essential_line_is_a_400_that_can_be_answered(line: bytes, reason: str) -> None:
    data = _invite().replace(b"Max-Forwards: 70", b"Max-Forwards: 70\r\n" + line)
    error = _parse_error(data)
    assert (error.status, error.reason) == (400, reason)
    assert error.partial is not None and "Subject" not in error.partial.headers
    assert error.partial.headers.get("Call-ID") == "a84b4c76e66710@pc33.example.org"


def test_a_bad_via_line_makes_the_request_unanswerable() -> None:
    data = _invite(Via="SIP/2.0/UDP h\x01;branch=z9hG4bK1")
    error = _parse_error(data)
    assert error.reason == "Control character in the header section" and error.partial is None
