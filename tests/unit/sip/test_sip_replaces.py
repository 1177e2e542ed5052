"""REFER with Replaces, the pure parts (sip/core/replaces.py): which callers can be asked, and the Refer-To that
names the target's dialog (RFC 3891 §3, §5; RFC 3261 §19.1.1 escaping), parsed back to the same ids."""

from __future__ import annotations

import random

import pytest

from sip.core.dialog import Dialog, DialogId
from sip.core.message import Request, Response, parse
from sip.core.replaces import accepts_replaces, parse_replaces, replaces_refer_to
from sip.core.ua import UaConfig, UserAgent
from tests.support.sip_ua import S, answered_call
from tests.support.sip_uac import LOCAL, TARGET, Callee


def invite(*extra: str) -> Request:
    lines = [
        "INVITE sip:bridge@127.0.0.1 SIP/2.0",
        "Via: SIP/2.0/UDP 127.0.0.1:5062;branch=z9hG4bK-1",
        "From: <sip:caller@127.0.0.1>;tag=c1",
        "To: <sip:bridge@127.0.0.1>",
        "Call-ID: inbound-1",
        "CSeq: 1 INVITE",
        "Contact: <sip:caller@127.0.0.1:5062>",
        *extra,
        "Content-Length: 0",
    ]
    message = parse(("\r\n".join(lines) + "\r\n\r\n").encode())
    assert isinstance(message, Request)
    return message


@pytest.mark.parametrize(
    ("headers", "accepts"),
    [
        (("Supported: replaces",), True),  # no Allow: not a refusal (the choice in the module's docstring)
        (("Supported: timer, Replaces, 100rel", "Allow: INVITE, ACK, BYE, REFER, NOTIFY"), True),
        (("k: replaces", "Allow: INVITE", "Allow: refer"), True),  # compact form, Allow over two lines
        (("Require: replaces",), True),
        (("Supported: replaces", "Allow: INVITE, ACK, CANCEL, BYE, NOTIFY"), False),  # no REFER allowed
        (("Supported: timer, 100rel", "Allow: INVITE, REFER"), False),  # REFER, but no Replaces
        ((), False),
        (("Supported: replaces-not",), False),
    ],
)
def test_a_caller_is_asked_only_when_it_declared_replaces_and_takes_refer(
    headers: tuple[str, ...], accepts: bool
) -> None:
    assert accepts_replaces(invite(*headers)) is accepts


def placed_dialog(call_id: str, contact: str) -> Dialog:
    """The dialog of a call we placed: our From tag `ours`, the target's To tag `theirs`."""
    request = parse(
        (
            "INVITE sip:human@pbx.example SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1;branch=z9hG4bK-2\r\n"
            f"From: <sip:bridge@10.0.0.1>;tag=ours\r\nTo: <sip:human@pbx.example>\r\nCall-ID: {call_id}\r\n"
            "CSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
        ).encode()
    )
    response = parse(
        (
            "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 10.0.0.1;branch=z9hG4bK-2\r\n"
            f"From: <sip:bridge@10.0.0.1>;tag=ours\r\nTo: <sip:human@pbx.example>;tag=theirs\r\n"
            f"Call-ID: {call_id}\r\nCSeq: 1 INVITE\r\nContact: {contact}\r\nContent-Length: 0\r\n\r\n"
        ).encode()
    )
    assert isinstance(request, Request) and isinstance(response, Response)
    return Dialog.uac(request, response, local_contact="<sip:bridge@10.0.0.1>", transport="udp")


def test_the_refer_to_names_the_targets_dialog_escaped_and_parses_back() -> None:
    dialog = placed_dialog("a84b4c76e66710@pc33.example", "<sip:human@10.0.0.9:5070;transport=udp;ob>")
    refer_to = replaces_refer_to(dialog)
    assert refer_to == (
        "sip:human@10.0.0.9:5070;transport=udp;ob"
        "?Replaces=a84b4c76e66710%40pc33.example%3Bto-tag%3Dtheirs%3Bfrom-tag%3Dours"
    )
    assert " " not in refer_to and ";to-tag" not in refer_to and "@pc33" not in refer_to  # nothing unescaped
    # the target matches to-tag to its local tag (its own To tag) and from-tag to ours (RFC 3891 §3)
    assert parse_replaces(refer_to) == (
        "sip:human@10.0.0.9:5070;transport=udp;ob",
        DialogId("a84b4c76e66710@pc33.example", "theirs", "ours"),
    )
    assert parse_replaces(f"<{refer_to}>") == parse_replaces(refer_to)


def test_a_contact_with_headers_of_its_own_keeps_only_the_replaces() -> None:
    refer_to = replaces_refer_to(placed_dialog("a%b<c>@h", "<sip:human@10.0.0.9?Subject=hi>"))
    assert refer_to == "sip:human@10.0.0.9?Replaces=a%25b%3Cc%3E%40h%3Bto-tag%3Dtheirs%3Bfrom-tag%3Dours"
    assert parse_replaces(refer_to) == ("sip:human@10.0.0.9", DialogId("a%b<c>@h", "theirs", "ours"))


def test_a_tel_remote_target_has_no_refer_to() -> None:
    with pytest.raises(ValueError, match="not a sip: or sips: URI"):
        replaces_refer_to(placed_dialog("c1", "<tel:+15551234567>"))


@pytest.mark.parametrize(
    "text",
    [
        "sip:human@10.0.0.9",
        "sip:human@10.0.0.9?Replaces=abc%3Bto-tag%3Dx",  # no from-tag
        "sip:human@10.0.0.9?Replaces=%3Bto-tag%3Dx%3Bfrom-tag%3Dy",  # no Call-ID
        "not a uri",
    ],
)
def test_a_refer_to_without_a_whole_replaces_parses_to_none(text: str) -> None:
    assert parse_replaces(text) is None


def test_the_ua_hands_out_the_caller_s_invite_and_the_placed_call_s_dialog() -> None:
    """What the native leg reads (sip/native/leg.py `accepts_replaces`, `replaces_refer_to`): `UserAgent.call_of`."""
    caller, call = answered_call(extra=("Supported: replaces", "Allow: INVITE, ACK, BYE, REFER, NOTIFY"))
    inbound = caller.ua.call_of(call)
    assert inbound is not None and accepts_replaces(inbound.invite)
    plain, other = answered_call()
    assert (c := plain.ua.call_of(other)) is not None and not accepts_replaces(c.invite)

    ua = UserAgent(UaConfig(host="192.0.2.1", port=5060), rng=random.Random(4))
    callee = Callee(ua)
    placed = ua.dial(TARGET, LOCAL, 0)
    (invite,) = callee.collect()
    assert isinstance(invite, Request) and ua.call_of(placed) is None  # no dialog before the answer
    callee.answer(invite, 1 * S)
    answered = ua.call_of(placed)
    assert answered is not None
    ours = (invite.headers.get("From") or "").split(";tag=", 1)[1]
    assert parse_replaces(replaces_refer_to(answered.dialog)) == (
        "sip:callee@198.51.100.21:5070",  # the 2xx's Contact
        DialogId(invite.headers.get("Call-ID") or "", "callee1", ours),
    )
