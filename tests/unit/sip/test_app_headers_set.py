"""The headers the application sets (sip/core/app_headers.py `check_app_headers`): every injection shape and
every bound refused with a `HeaderRefused` naming the header, never dropped; whatever is accepted is one header
line each on the wire and parses back equal; the dialog's BYE and REFER and the outbound INVITE carry them,
the CANCEL and a ringing call's final response do not (RFC 3261 §9.1). On virtual time, no sockets."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sip.core.app_headers import (
    MAX_SET_HEADERS,
    MAX_SET_TOTAL,
    MAX_SET_VALUE,
    STACK_OWNED,
    HeaderRefused,
    check_app_headers,
)
from sip.core.message import Message, Request, Response, serialize
from sip.core.transfer import DialogStage, SendRefer, TransferTracker
from sip.core.ua import IncomingCall, UaConfig, UserAgent
from tests.support.sip_ua import LOCAL, MS, Caller, S, _to_tag, answered_call, new_ua
from tests.support.sip_uac import LOCAL as UAC_LOCAL
from tests.support.sip_uac import TARGET, Callee

GIVEN = (("X-Result", "resolved"), ("Reason", 'Q.850;cause=16;text="Normal call clearing"'))


def _requests(msgs: list[Message], method: str) -> list[Request]:
    return [m for m in msgs if isinstance(m, Request) and m.method == method]


def _refused(headers: object) -> HeaderRefused:
    with pytest.raises(HeaderRefused) as caught:
        check_app_headers(headers)
    assert isinstance(caught.value, ValueError)
    return caught.value


# --- the validator ---------------------------------------------------------------------------------------------


def test_each_injection_shape_in_a_value_is_refused_naming_the_header_with_a_bounded_escaped_prefix() -> None:
    for value in (
        "1\r\nVia: SIP/2.0/UDP evil.example",  # CRLF: a header of the caller's choosing
        "1\nX-B: 2",  # LF alone
        "1\rX-B: 2",  # CR alone
        "1\r\n continued",  # folding (§7.3.1): a continuation line
        "nul\0",
        "esc\x1b[2J",
        "del\x7f",
        "c1\x85",  # NEL, a C1 control
        "line\u2028separator",
        "bidi\u202eoverride",
        "\r\n\r\nINVITE sip:x@evil SIP/2.0" + "x" * 500,  # a body and a second message, and long
    ):
        refused = _refused({"X-Note": value})
        text = str(refused)
        assert refused.name == "X-Note" and "'X-Note'" in text and "CR, LF, NUL" in text
        assert "\r" not in text and "\n" not in text and "\0" not in text  # the error is one safe line
        assert len(text) < 200  # a bounded prefix of the value, never all of it
        assert repr(value[:8])[1:-1] in text  # its first characters, escaped


def test_a_name_that_is_not_a_token_is_refused() -> None:
    for name in ("X-A:B", "X A", "X-A\r\nVia", "X-A\n", "", "X-\u00e9", "X-A;b", "X-" + "a" * 63):
        refused = _refused([(name, "1")])
        assert "token (RFC 3261 §25.1)" in str(refused)
        assert "\r" not in str(refused) and "\n" not in str(refused)
    assert _refused([("X-A", 1)]).name == ""  # a value that is not a string
    assert "both strings" in str(_refused([("X-A",)]))
    assert "a mapping" in str(_refused("X-A: 1"))


def test_a_name_the_stack_owns_is_refused_in_any_case() -> None:
    owned = [*STACK_OWNED, "Content-Type", "content-length", "Content-Disposition", "Security-Verify"]
    assert {
        "via",
        "from",
        "to",
        "call-id",
        "cseq",
        "contact",
        "max-forwards",
        "route",
        "record-route",
    } <= STACK_OWNED
    assert {
        "refer-to",
        "referred-by",
        "replaces",
        "authorization",
        "proxy-authorization",
        "rseq",
        "rack",
    } <= (STACK_OWNED)
    assert {
        "www-authenticate",
        "proxy-authenticate",
        "session-expires",
        "min-se",
        "supported",
        "require",
    } <= (STACK_OWNED)
    assert {"allow", "event", "subscription-state", "expires"} <= STACK_OWNED
    for name in owned:
        for spelling in (name, name.upper(), name.title(), name.lower()):
            refused = _refused({spelling: "x"})
            assert refused.name == spelling and "may not be set" in str(refused)
    for compact in ("f", "t", "i", "m", "v", "l", "c", "r", "b", "X-"):  # §7.3.3, and a bare prefix
        assert "may not be set" in str(_refused({compact: "x"}))


def test_the_bounds_in_count_value_and_total() -> None:
    assert len(check_app_headers({f"X-{i}": "1" for i in range(MAX_SET_HEADERS)})) == MAX_SET_HEADERS
    assert f"at most {MAX_SET_HEADERS}" in str(_refused({f"X-{i}": "1" for i in range(MAX_SET_HEADERS + 1)}))
    assert check_app_headers({"X-A": "v" * MAX_SET_VALUE})[0][1] == "v" * MAX_SET_VALUE
    assert f"over {MAX_SET_VALUE} bytes" in str(_refused({"X-A": "v" * (MAX_SET_VALUE + 1)}))
    # bytes of UTF-8, not characters: 513 two-byte characters are over
    assert _refused({"X-A": "\u00e9" * (MAX_SET_VALUE // 2 + 1)}).name == "X-A"
    # the total: name, ": ", value and CRLF of each, summed
    line = MAX_SET_TOTAL // 4 - len("X-0: \r\n")
    assert len(check_app_headers([(f"X-{i}", "v" * line) for i in range(4)])) == 4  # exactly the bound
    refused = _refused([(f"X-{i}", "v" * line) for i in range(3)] + [("X-3", "v" * (line + 1))])
    assert refused.name == "X-3" and f"over {MAX_SET_TOTAL} bytes in all" in str(refused)


def test_what_the_application_may_set_passes_in_order_trimmed() -> None:
    given_ = [
        ("X-Customer-Id", "  c-42\t"),
        ("reason", "Q.850;cause=16"),
        ("User-to-User", "56a390f3d2b7310023a2;encoding=hex;purpose=call"),
        ("P-Asserted-Identity", "<sip:+4930123@carrier.example>"),
        ("X-Note", "Grüße\tand tabs inside"),
        ("X-Empty", ""),
    ]
    assert check_app_headers(given_) == (
        ("X-Customer-Id", "c-42"),
        ("reason", "Q.850;cause=16"),
        ("User-to-User", "56a390f3d2b7310023a2;encoding=hex;purpose=call"),
        ("P-Asserted-Identity", "<sip:+4930123@carrier.example>"),
        ("X-Note", "Grüße\tand tabs inside"),
        ("X-Empty", ""),
    )
    assert check_app_headers({"X-A": "1"}) == check_app_headers([("X-A", "1")]) == (("X-A", "1"),)
    assert check_app_headers(()) == ()


_TOKEN_CHARS = "abcXYZ019-.!%*_+`'~"
_NAMES = st.one_of(
    st.text(_TOKEN_CHARS, min_size=1, max_size=10).map("X-".__add__),  # mostly names it accepts
    st.text(_TOKEN_CHARS, min_size=1, max_size=10).map("X-".__add__),
    st.text(_TOKEN_CHARS + ": \t\r\n\0\u00e9", min_size=1, max_size=10).map("X-".__add__),
    st.sampled_from(["Via", "cseq", "f", "Reason", "User-to-User", "Content-Type"]),
    st.text(max_size=8),  # anything at all
)
_PRINTABLE = st.characters(blacklist_categories=("Cc", "Cs", "Cf", "Zl", "Zp", "Co", "Cn"))
_VALUES = st.one_of(
    st.text(_PRINTABLE, max_size=40),
    st.text(st.one_of(_PRINTABLE, st.sampled_from(" \t")), max_size=40),
    st.text(" \tabc;=<>:@\u00e9\r\n\0\u2028\x1b", max_size=40),
    st.text(max_size=40),  # anything at all
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=4))
def test_whatever_is_accepted_is_one_line_each_on_the_bye_and_parses_back_equal(
    pairs: list[tuple[str, str]],
) -> None:
    try:
        accepted = check_app_headers(pairs)
    except HeaderRefused:
        return
    plain, bye = _bye(()), _bye(accepted)
    stack = {name.lower() for name, _ in plain.headers.items()}
    ours = [(n.lower(), v) for n, v in bye.headers.items() if n.lower() not in stack]
    assert ours == [(n.lower(), v) for n, v in accepted]  # parsed back equal, in order
    lines = [serialize(m).split(b"\r\n\r\n", 1)[0].count(b"\r\n") for m in (plain, bye)]
    assert lines[1] == lines[0] + len(accepted)  # exactly one line each


def _bye(headers: tuple[tuple[str, str], ...]) -> Request:
    caller, call = answered_call()
    caller.take_events()
    assert caller.ua.bye(call, 2 * S, "done", headers)
    (bye,) = _requests(caller.collect(), "BYE")
    return bye


# --- the requests that carry them --------------------------------------------------------------------------------


def test_our_bye_carries_the_applications_headers_after_the_stacks_own() -> None:
    bye = _bye(GIVEN)
    items = list(bye.headers.items())
    assert [i for i in items if i[0] in ("X-Result", "Reason")] == list(GIVEN)
    assert [n for n, _ in items].count("Via") == 1 and bye.headers.get("CSeq") == "1 BYE"
    assert b'\r\nX-Result: resolved\r\nReason: Q.850;cause=16;text="Normal call clearing"\r\n' in serialize(
        bye
    )


def test_a_bye_that_waits_for_the_ack_carries_them_when_it_goes() -> None:
    caller = Caller(new_ua())
    caller.invite(0)
    (incoming,) = [e for e in caller.take_events() if isinstance(e, IncomingCall)]
    caller.ua.answer(incoming.call, LOCAL, 0)
    ok = caller.collect()[-1]
    assert caller.ua.bye(incoming.call, 10 * MS, "done", GIVEN)
    assert _requests(caller.collect(), "BYE") == []  # §15.1.1: not before the ACK
    caller.to_tag = _to_tag(ok)
    (bye,) = _requests(caller.ack(300 * MS), "BYE")
    assert bye.headers.get("X-Result") == "resolved" and bye.headers.get("Reason") == GIVEN[1][1]


def test_a_ringing_call_ended_with_headers_gets_its_480_without_them() -> None:
    caller = Caller(new_ua())
    caller.invite(0)
    (incoming,) = [e for e in caller.take_events() if isinstance(e, IncomingCall)]
    assert caller.ua.bye(incoming.call, 10 * MS, "done", GIVEN)
    (final,) = [m for m in caller.collect() if isinstance(m, Response) and m.status >= 300]
    assert final.status == 480 and final.headers.get("X-Result") is None


def test_the_refer_carries_them_after_refer_to_and_referred_by() -> None:
    caller, call = answered_call()
    caller.take_events()
    headers = (("X-Queue", "billing"), ("User-to-User", "c0ffee;encoding=hex"))
    assert caller.ua.refer(call, "sip:agent@example.com", 2 * S, headers)
    (refer,) = _requests(caller.collect(), "REFER")
    names = [n for n, _ in refer.headers.items()]
    assert names.count("Refer-To") == 1 and refer.headers.get("Refer-To") == "<sip:agent@example.com>"
    assert names.index("Referred-By") < names.index("X-Queue") < names.index("User-to-User")
    assert (
        refer.headers.get("X-Queue") == "billing"
        and refer.headers.get("User-to-User") == "c0ffee;encoding=hex"
    )


def test_a_refer_that_waits_for_the_ack_keeps_its_headers() -> None:
    tracker = TransferTracker()
    headers = (("X-Queue", "billing"),)
    assert tracker.start("sip:agent@example.com", 0, DialogStage.AWAITING_ACK, headers) == []
    assert tracker.confirmed(1 * S) == [SendRefer("sip:agent@example.com", headers)]
    assert TransferTracker().start("sip:b@x", 0, DialogStage.CONFIRMED, headers) == [
        SendRefer("sip:b@x", headers)
    ]


def test_the_outbound_invite_carries_them_and_its_cancel_and_ack_do_not() -> None:
    ua = UserAgent(UaConfig(host="192.0.2.1", port=5060), rng=random.Random(4))
    callee = Callee(ua)
    call = ua.dial(TARGET, UAC_LOCAL, 0, headers=(("X-Campaign", "spring-7"), ("Reason", "SIP;cause=200")))
    (invite,) = callee.collect()
    assert isinstance(invite, Request) and invite.headers.get("X-Campaign") == "spring-7"
    callee.reply(invite, 180, 10 * MS)
    assert ua.bye(call, 1 * S, "done", GIVEN)  # not answered: a CANCEL (§9.1), no application headers
    (cancel,) = callee.collect()
    assert isinstance(cancel, Request) and cancel.method == "CANCEL"
    assert all(cancel.headers.get(n) is None for n in ("X-Campaign", "Reason", "X-Result"))
    callee.reply(cancel, 200, 1100 * MS)
    (ack,) = _requests(callee.reply(invite, 487, 1200 * MS), "ACK")
    assert ack.headers.get("X-Campaign") is None and ack.headers.get("Reason") is None
    with pytest.raises(HeaderRefused, match="may not be set"):
        ua.dial(TARGET, UAC_LOCAL, 2 * S, headers=(("Session-Expires", "90"),))  # the core refuses it too
    assert callee.collect() == []
