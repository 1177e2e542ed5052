"""RFC 3261 §12 dialogs: ids, CSeq both ways, the route set (UAS as received, UAC reversed), the remote target,
loose and strict routing of our requests, the next hop, out-of-order CSeq → 500."""

from __future__ import annotations

from sip.core.dialog import Dialog, DialogId
from sip.core.message import Request, Response, parse

INVITE = (
    b"INVITE sip:bridge@198.51.100.1 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bK1\r\n"
    b"Record-Route: <sip:p1.example.com;lr>, <sip:p2.example.com:5080;lr>\r\n"
    b"Record-Route: <sip:p3.example.com;lr;transport=tcp>\r\n"
    b'From: "Alice" <sip:alice@example.com>;tag=alice1\r\n'
    b"To: <sip:bridge@198.51.100.1>\r\n"
    b"Call-ID: dlg-1@example.com\r\n"
    b"CSeq: 10 INVITE\r\n"
    b"Contact: <sip:alice@192.0.2.10:5062>\r\n"
    b"Max-Forwards: 70\r\n"
    b"Content-Length: 0\r\n\r\n"
)
VIA = "SIP/2.0/UDP 198.51.100.1:5060;branch=z9hG4bKour"


def _request(data: bytes) -> Request:
    message = parse(data)
    assert isinstance(message, Request)
    return message


def uas(data: bytes = INVITE) -> Dialog:
    return Dialog.uas(
        _request(data), local_tag="bridge1", local_contact="<sip:bridge@198.51.100.1>", transport="udp"
    )


def test_uas_dialog_id_uris_and_cseq() -> None:
    d = uas()
    assert d.id == DialogId("dlg-1@example.com", "bridge1", "alice1")
    assert d.local_uri == "<sip:bridge@198.51.100.1>;tag=bridge1"
    assert d.remote_uri == '"Alice" <sip:alice@example.com>;tag=alice1'
    assert d.remote_seq == 10
    assert d.remote_target == "sip:alice@192.0.2.10:5062"


def test_uas_route_set_is_record_route_as_received_and_requests_loose_route() -> None:
    d = uas()
    assert d.route_set == (
        "<sip:p1.example.com;lr>",
        "<sip:p2.example.com:5080;lr>",
        "<sip:p3.example.com;lr;transport=tcp>",
    )
    bye = d.new_request("BYE", via=VIA)
    assert bye.uri == "sip:alice@192.0.2.10:5062"  # loose routing: the remote target
    assert bye.headers.get_all("Route") == d.route_set
    assert bye.headers.get("From") == d.local_uri and bye.headers.get("To") == d.remote_uri
    assert bye.headers.get("CSeq") == "1 BYE"
    assert d.new_request("INFO", via=VIA).headers.get("CSeq") == "2 INFO"
    assert d.next_hop() == (("p1.example.com", 5060), "udp")


def test_uac_route_set_is_reversed_and_the_target_is_the_2xx_contact() -> None:
    req = _request(
        INVITE.replace(
            b"Record-Route: <sip:p1.example.com;lr>, <sip:p2.example.com:5080;lr>\r\n"
            b"Record-Route: <sip:p3.example.com;lr;transport=tcp>\r\n",
            b"",
        )
    )
    resp = parse(
        b"SIP/2.0 200 OK\r\n"
        b"Via: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bK1\r\n"
        b"Record-Route: <sip:p1.example.com;lr>, <sip:p2.example.com;lr>\r\n"
        b'From: "Alice" <sip:alice@example.com>;tag=alice1\r\n'
        b"To: <sip:bridge@198.51.100.1>;tag=b9\r\n"
        b"Call-ID: dlg-1@example.com\r\nCSeq: 10 INVITE\r\n"
        b"Contact: <sip:bob@203.0.113.5;transport=tcp>\r\nContent-Length: 0\r\n\r\n"
    )
    assert isinstance(resp, Response)
    d = Dialog.uac(req, resp, local_contact="<sip:alice@192.0.2.10>", transport="udp")
    assert d.id == DialogId("dlg-1@example.com", "alice1", "b9")
    assert d.route_set == ("<sip:p2.example.com;lr>", "<sip:p1.example.com;lr>")
    assert d.local_seq == 10 and d.remote_seq is None
    assert d.new_request("BYE", via=VIA).headers.get("CSeq") == "11 BYE"
    ack = d.ack(10, via=VIA)
    assert ack.headers.get("CSeq") == "10 ACK" and d.local_seq == 11


def test_strict_routing_puts_the_first_route_in_the_request_uri() -> None:
    data = INVITE.replace(
        b"<sip:p1.example.com;lr>, <sip:p2.example.com:5080;lr>", b"<sip:strict.example.com>"
    )
    data = data.replace(b"Record-Route: <sip:p3.example.com;lr;transport=tcp>\r\n", b"")
    d = uas(data)
    bye = d.new_request("BYE", via=VIA)
    assert bye.uri == "sip:strict.example.com"
    assert bye.headers.get_all("Route") == ("<sip:alice@192.0.2.10:5062>",)
    assert d.next_hop() == (("strict.example.com", 5060), "udp")


def test_without_routes_the_next_hop_is_the_remote_target() -> None:
    d = uas(
        INVITE.replace(
            b"Record-Route: <sip:p1.example.com;lr>, <sip:p2.example.com:5080;lr>\r\n", b""
        ).replace(b"Record-Route: <sip:p3.example.com;lr;transport=tcp>\r\n", b"")
    )
    assert d.next_hop() == (("192.0.2.10", 5062), "udp")
    bye = d.new_request("BYE", via=VIA)
    assert bye.headers.get("Route") is None and bye.uri == "sip:alice@192.0.2.10:5062"
    d.remote_target = "sip:alice@example.org;transport=TCP"
    assert d.next_hop() == (("example.org", 5060), "tcp")
    d.remote_target = "sips:alice@example.org"
    assert d.next_hop() == (("example.org", 5061), "tls")


def test_out_of_order_cseq_is_500_and_a_higher_one_advances() -> None:
    d = uas()
    old = _request(INVITE.replace(b"CSeq: 10 INVITE", b"CSeq: 9 INVITE"))
    assert d.check_request(old) == 500
    assert d.remote_seq == 10
    bye = _request(INVITE.replace(b"INVITE sip:", b"BYE sip:").replace(b"CSeq: 10 INVITE", b"CSeq: 11 BYE"))
    assert d.check_request(bye) is None and d.remote_seq == 11
    ack = _request(INVITE.replace(b"INVITE sip:", b"ACK sip:").replace(b"CSeq: 10 INVITE", b"CSeq: 10 ACK"))
    assert d.check_request(ack) is None and d.remote_seq == 11  # ACK carries the INVITE's CSeq


def test_a_target_refresh_changes_the_remote_target_and_a_bye_does_not() -> None:
    d = uas()
    reinvite = _request(
        INVITE.replace(b"CSeq: 10 INVITE", b"CSeq: 12 INVITE").replace(
            b"<sip:alice@192.0.2.10:5062>", b"<sip:alice@192.0.2.20:5070>"
        )
    )
    assert d.check_request(reinvite) is None
    assert d.remote_target == "sip:alice@192.0.2.20:5070"
    bye = _request(INVITE.replace(b"INVITE sip:", b"BYE sip:").replace(b"CSeq: 10 INVITE", b"CSeq: 13 BYE"))
    assert d.check_request(bye) is None and d.remote_target == "sip:alice@192.0.2.20:5070"


def test_requests_carry_contact_and_bodies() -> None:
    d = uas()
    info = d.new_request(
        "INFO",
        via=VIA,
        body=b"Signal=5\r\n",
        content_type="application/dtmf-relay",
        headers=(("X-Test", "1"),),
    )
    assert info.headers.get("Contact") == "<sip:bridge@198.51.100.1>"
    assert info.headers.get("Content-Type") == "application/dtmf-relay"
    assert info.headers.get("X-Test") == "1" and info.body == b"Signal=5\r\n"
    assert d.new_request("BYE", via=VIA).headers.get("Contact") is None
