"""Call identity comes from the INVITE: the called number and the headers an application routes on.

`sip.core.identity` is engine-neutral: pjsua2 hands it the INVITE's text (`parse_head`), the native engine its
parsed Request-URI and headers (`call_identity`). The first three tests moved here from test_sip_invite.py
(the pjsua2 module's `_parse_invite`) and keep their names.
"""

import pytest

from sip.core.identity import call_identity, parse_head, request_user
from sip.leg import CallIdentity

INVITE = (
    "INVITE sip:+15551234@bridge.example:5060;transport=udp SIP/2.0\r\n"
    "Via: SIP/2.0/UDP 127.0.0.1:5080;branch=z9hG4bK1\r\n"
    "From: <sip:caller@127.0.0.1>;tag=1\r\n"
    "To: <sip:+15551234@bridge.example>\r\n"
    "X-Customer: acme\r\n"
    " corp\r\n"
    "Call-ID: abc@127.0.0.1\r\n"
    "\r\n"
    "v=0\r\nX-Not-A-Header: body\r\n"
)


def _parse_invite(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What the pjsua2 engine does with `rdata.wholeMsg`: the called user and the header fields."""
    uri, headers = parse_head(text)
    return request_user(uri), headers


def test_request_user_and_headers_are_parsed_with_folding() -> None:
    user, headers = _parse_invite(INVITE)
    assert user == "+15551234"
    names = [name for name, _ in headers]
    assert names == ["Via", "From", "To", "X-Customer", "Call-ID"]
    assert dict(headers)["X-Customer"] == "acme corp"


def test_request_uri_without_user_and_garbage_do_not_raise() -> None:
    assert _parse_invite("INVITE sip:127.0.0.1 SIP/2.0\r\n\r\n") == ("", ())
    assert _parse_invite("") == ("", ())
    assert _parse_invite("\x00\x01 garbage") == ("", ())


def test_identity_header_lookup_is_case_insensitive() -> None:
    _, headers = _parse_invite(INVITE)
    identity = CallIdentity("call-1", "abc", "f", "t", "+15551234", "127.0.0.1:5080", headers)
    assert identity.header("x-customer") == "acme corp"
    assert identity.header("P-Asserted-Identity") is None


def test_parse_head_gives_the_request_uri_and_stops_at_a_bare_lf_blank_line() -> None:
    uri, headers = parse_head(
        "INVITE sips:desk@pbx.example SIP/2.0\nTo: <sips:desk@pbx.example>\n\nX-Body: 1\n"
    )
    assert uri == "sips:desk@pbx.example"
    assert headers == (("To", "<sips:desk@pbx.example>"),)


@pytest.mark.parametrize(
    "line", ["INVITE sip:a@h", "INVITE sip:a@h HTTP/1.1", "sip:a@h SIP/2.0", "INVITE  SIP/2.0"]
)
def test_a_malformed_request_line_gives_no_request_uri(line: str) -> None:
    assert parse_head(f"{line}\r\nTo: x\r\n\r\n") == ("", (("To", "x"),))


@pytest.mark.parametrize(
    "uri, user",
    [
        ("sip:+15551234@bridge.example:5060;transport=udp", "+15551234"),
        ("SIP:Alice@example.com", "Alice"),
        ("sips:desk@pbx.example", "desk"),
        ("sip:alice:secret@example.com", "alice"),  # a password in the userinfo is not part of the user
        ("sip:%2B15551234@example.com", "+15551234"),  # escaped characters decoded (RFC 3261 §19.1.2)
        ("sip:+1555;npdi@example.com", "+1555;npdi"),  # ";" is a user-unreserved character before the "@"
        ("tel:+1-555-1234;phone-context=example.com", "+1-555-1234"),
        ("TEL:911", "911"),
        ("sip:example.com", ""),
        ("sip:example.com;user=phone", ""),
        ("http://alice@example.com", ""),
        ("alice@example.com", ""),
        ("", ""),
    ],
)
def test_request_user_of_sip_sips_and_tel_uris(uri: str, user: str) -> None:
    assert request_user(uri) == user


def test_call_identity_is_a_pure_function_of_the_invites_parts() -> None:
    headers = (("X-Customer", "acme"), ("P-Asserted-Identity", "<sip:+15550000@carrier>"))
    identity = call_identity(
        "call-7",
        request_uri="sip:+15551234@bridge.example",
        from_uri="<sip:caller@h>;tag=1",
        to_uri="<sip:+15551234@bridge.example>",
        sip_call_id="abc@h",
        source="192.0.2.1:5060",
        headers=headers,
    )
    assert identity == CallIdentity(
        "call-7",
        "abc@h",
        "<sip:caller@h>;tag=1",
        "<sip:+15551234@bridge.example>",
        "+15551234",
        "192.0.2.1:5060",
        headers,
        sip_headers=headers,  # both on the default allowlist (sip/core/app_headers.py)
        caller="caller",  # From's user: no trunk trusts the P-Asserted-Identity
    )
    assert identity.header("p-asserted-identity") == "<sip:+15550000@carrier>"
