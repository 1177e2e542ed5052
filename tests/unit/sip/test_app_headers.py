"""The inbound headers an application sees and the caller ID it may trust (sip/core/app_headers.py): the
allowlist (default and configured), the bounds, the cleaning of hostile values and the trust rule for
P-Asserted-Identity and Diversion, through `call_identity` as the engines build it."""

from __future__ import annotations

from sip.core.app_headers import (
    DEFAULT_ALLOW,
    MAX_HEADERS,
    MAX_VALUE,
    HeaderPolicy,
    clean_value,
    select_headers,
)
from sip.core.identity import call_identity, parse_head
from sip.leg import CallIdentity

INVITE_HEADERS = (
    ("Via", "SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK1"),
    ("From", "<sip:+4930111@carrier.example>;tag=1"),
    ("To", "<sip:+4930999@bridge.example>"),
    ("X-Customer-Id", "c-42"),
    ("P-Asserted-Identity", '"Bob" <sip:+4930222@carrier.example>'),
    ("Diversion", "<sip:+4930333@carrier.example>;reason=unconditional"),
    ("History-Info", "<sip:+4930333@carrier.example>;index=1"),
    ("X-Queue", "billing"),
    ("Subject", "not for the application"),
    ("Authorization", 'Digest username="u", response="secret"'),
)


def _identity(headers: tuple[tuple[str, str], ...], **kw: object) -> CallIdentity:
    return call_identity(
        "call-1",
        request_uri="sip:+4930999@bridge.example",
        from_uri="sip:+4930111@carrier.example",
        to_uri="sip:+4930999@bridge.example",
        sip_call_id="abc",
        source="192.0.2.1:5060",
        headers=headers,
        **kw,  # type: ignore[arg-type]
    )


def test_the_default_allowlist_passes_x_headers_pai_diversion_history_info_in_order() -> None:
    identity = _identity(INVITE_HEADERS)
    assert DEFAULT_ALLOW == ("X-*", "P-Asserted-Identity", "Diversion", "History-Info")
    assert [name for name, _ in identity.sip_headers] == [
        "X-Customer-Id",
        "P-Asserted-Identity",
        "Diversion",
        "History-Info",
        "X-Queue",
    ]
    assert identity.header("Subject") == "not for the application"  # routes still see every header
    assert (identity.headers_dropped, identity.headers_cut) == (0, 0)


def test_a_configured_allowlist_replaces_the_default_and_matches_case_insensitively() -> None:
    identity = _identity(INVITE_HEADERS, header_policy=HeaderPolicy(allow=("x-customer-*", "subject")))
    assert identity.sip_headers == (("X-Customer-Id", "c-42"), ("Subject", "not for the application"))


def test_credentials_never_pass_whatever_the_allowlist_says() -> None:
    policy = HeaderPolicy(allow=("Authorization", "Proxy-Authorization", "A*", "P*"))
    kept = select_headers(INVITE_HEADERS + (("Proxy-Authorization", "Digest x"),), policy).headers
    assert [name for name, _ in kept] == ["P-Asserted-Identity"]


def test_an_outbound_call_passes_no_headers_of_its_own() -> None:
    identity = _identity((("X-Direction", "outbound"),), direction="outbound")
    assert identity.sip_headers == ()


def test_count_bound_keeps_the_first_fields_and_counts_the_rest() -> None:
    many = tuple((f"X-H{i}", str(i)) for i in range(MAX_HEADERS + 8))
    identity = _identity(many)
    assert MAX_HEADERS == 32
    assert len(identity.sip_headers) == 32
    assert identity.sip_headers[-1] == ("X-H31", "31")
    assert identity.headers_dropped == 8


def test_value_bound_cuts_and_counts_and_a_long_name_is_dropped() -> None:
    identity = _identity(
        (("X-Big", "a" * (MAX_VALUE + 500)), ("X-Fits", "b" * MAX_VALUE), ("X-" + "n" * 80, "v"))
    )
    assert MAX_VALUE == 1024
    assert identity.sip_headers == (("X-Big", "a" * 1024), ("X-Fits", "b" * 1024))
    assert (identity.headers_cut, identity.headers_dropped) == (1, 1)


def test_hostile_values_lose_line_breaks_controls_and_invisible_characters() -> None:
    hostile = "c-42\r\nX-Admin: 1\x00\x1b[31m\x7f\x85\u2028\u202e\tend"
    identity = _identity((("X-Customer-Id", hostile),))
    value = identity.sip_headers[0][1]
    assert value == "c-42 X-Admin: 1[31m end"
    assert all(ch.isprintable() for ch in value)
    assert clean_value("  plain  ") == "plain"


def test_a_folded_header_reaches_the_application_as_one_line() -> None:
    uri, headers = parse_head(
        "INVITE sip:1@b SIP/2.0\r\nX-Note: first\r\n  second\r\n\tthird\r\nFrom: <sip:a@b>\r\n\r\n"
    )
    identity = _identity(headers)
    assert identity.sip_headers == (("X-Note", "first second third"),)


def test_pai_and_diversion_give_the_caller_id_only_on_a_trusted_trunk() -> None:
    untrusted = _identity(INVITE_HEADERS, trunk="carrier")
    assert (untrusted.caller, untrusted.diverted_from, untrusted.identity_trusted) == ("+4930111", "", False)
    assert untrusted.header("P-Asserted-Identity") is not None  # still a claim the application can read
    trusted = _identity(INVITE_HEADERS, trunk="carrier", trust_identity_headers=True)
    assert (trusted.caller, trusted.diverted_from, trusted.identity_trusted) == ("+4930222", "+4930333", True)


def test_a_trusted_trunk_without_pai_keeps_from_and_reads_a_tel_uri_and_a_list() -> None:
    no_pai = _identity((("From", "<sip:+4930111@x>"),), trust_identity_headers=True)
    assert (no_pai.caller, no_pai.diverted_from) == ("+4930111", "")
    pair = _identity(
        (("P-Asserted-Identity", "<tel:+4930444>, <sip:+4930555@carrier.example>"),),
        trust_identity_headers=True,
    )
    assert pair.caller == "+4930444"
    garbage = _identity((("P-Asserted-Identity", '"unterminated <'),), trust_identity_headers=True)
    assert garbage.caller == "+4930111"  # unreadable: never raises, From's number stays
