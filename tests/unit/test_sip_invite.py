"""Call identity comes from the INVITE text: the called number and the headers an application routes on."""

from sip.leg import CallIdentity
from sip.pjsua2_agent import _parse_invite

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
