"""Session timers offered and asked for (RFC 4028), sans-I/O on virtual time: as UAS when the caller says
nothing (with and without its support of "timer"), as UAC on the calls we place (the offer, a 422, who
refreshes), the refresh at half the interval by the refresher and the BYE when a session is not refreshed."""

from __future__ import annotations

import random

from sip.core.message import Request, Response
from sip.core.ua import CallEnded, SessionExpired, UaConfig, UserAgent
from tests.support.sip_ua import MS, Caller, S, answered_call, distinct, new_ua, offer_sdp
from tests.support.sip_uac import LOCAL as UAC_LOCAL
from tests.support.sip_uac import TARGET, Callee


def _ok(caller: Caller) -> Response:
    return [m for m in caller.sent if isinstance(m, Response) and m.status == 200][0]


# --- as UAS: the caller asked for no timer ---


def test_a_caller_that_supports_timers_is_asked_to_refresh_and_ends_unrefreshed() -> None:
    caller, call = answered_call(new_ua(session_expires_s=300), extra=("Supported: timer",))
    ok = _ok(caller)
    assert ok.headers.get("Session-Expires") == "300;refresher=uac" and ok.headers.get("Require") == "timer"
    caller.take_events()
    sent = caller.advance(1 * S + 267 * S)
    assert distinct(sent, "INVITE") == [] and distinct(sent, "BYE") == []  # the caller refreshes, not we
    sent = caller.advance(1 * S + 268 * S)
    assert [t for t, _ in distinct(sent, "BYE")] == [269 * S]  # 300 - min(32, 100) after the ACK
    assert caller.take_events() == [
        SessionExpired(call),
        CallEnded(call, "session expired", 408, by_remote=True),
    ]


def test_a_caller_without_timer_support_gets_a_session_timer_we_refresh() -> None:
    caller, call = answered_call(new_ua(session_expires_s=1800))  # no Supported: timer, no Allow: UPDATE
    ok = _ok(caller)
    assert ok.headers.get("Session-Expires") == "1800;refresher=uas"  # §9: the UAS refreshes
    assert ok.headers.get("Require") is None  # the caller does not support it: nothing required of it
    caller.take_events()
    sent = caller.advance(1 * S + 900 * S)
    ((when, refresh),) = distinct(sent, "INVITE")  # a re-INVITE (no UPDATE in the caller's Allow)
    assert when == 1 * S + 900 * S and refresh.headers.get("Session-Expires") == "1800;refresher=uac"
    assert refresh.body  # our unchanged SDP
    # the caller is gone: the refresh is never answered (Timer B, 64·T1) → BYE, the call ends
    sent = caller.advance(1 * S + 900 * S + 33 * S)
    assert len(distinct(sent, "BYE")) == 1
    assert caller.take_events() == [CallEnded(call, "session refresh failed", 408, by_remote=True)]


def test_a_refresh_the_caller_answers_keeps_the_call_and_the_next_one_follows() -> None:
    caller, call = answered_call(new_ua(session_expires_s=120))
    sent = caller.advance(1 * S + 60 * S)
    ((_, refresh),) = distinct(sent, "INVITE")
    caller.respond(refresh, 200, "OK", 61 * S, body=offer_sdp(version=2))
    caller.take_events()
    sent = caller.advance(61 * S + 60 * S)
    assert [t for t, _ in distinct(sent, "INVITE")] == [121 * S]  # half the interval after the 2xx
    assert not any(isinstance(e, CallEnded) for e in caller.take_events())


def test_no_timer_is_asked_for_with_session_expires_0_but_a_callers_is_honoured() -> None:
    caller, _call = answered_call(new_ua(session_expires_s=0), extra=("Supported: timer",))
    assert _ok(caller).headers.get("Session-Expires") is None
    assert caller.advance(10_000 * S) == []  # nothing refreshes, nothing expires
    caller, _call = answered_call(
        new_ua(session_expires_s=0), extra=("Supported: timer", "Session-Expires: 600;refresher=uac")
    )
    assert _ok(caller).headers.get("Session-Expires") == "600;refresher=uac"


# --- as UAC: the calls we place ---


def _dial(**config: object) -> tuple[Callee, str, Request]:
    ua = UserAgent(UaConfig(host="192.0.2.1", port=5060, **config), rng=random.Random(4))  # type: ignore[arg-type]
    callee = Callee(ua)
    call = ua.dial(TARGET, UAC_LOCAL, 0)
    (invite,) = callee.collect()
    assert isinstance(invite, Request)
    return callee, call, invite


def test_our_invite_offers_a_session_timer() -> None:
    _callee, _call, invite = _dial()
    assert "timer" in invite.headers.get_all("Supported")
    assert invite.headers.get("Session-Expires") == "1800" and invite.headers.get("Min-SE") == "90"
    _callee, _call, invite = _dial(session_expires_s=0)
    assert invite.headers.get("Session-Expires") is None and invite.headers.get("Min-SE") is None


def test_a_422_makes_us_offer_the_callees_minimum() -> None:
    callee, _call, invite = _dial(session_expires_s=600)
    callee.reply(invite, 422, 10 * MS, headers=(("Min-SE", "1200"),))
    again = callee.requests("INVITE")[-1]
    assert again is not invite and again.headers.get("CSeq") == "2 INVITE"
    assert again.headers.get("Session-Expires") == "1200" and again.headers.get("Min-SE") == "1200"
    assert callee.ended() == []


def test_the_callee_as_refresher_and_an_unrefreshed_session_ends_with_bye() -> None:
    callee, call, invite = _dial(session_expires_s=1800)
    assert invite.headers.get("Session-Expires") == "1800"  # offered: the callee chose who refreshes
    callee.answer(invite, 1 * S, headers=(("Session-Expires", "1800;refresher=uas"),))
    sent = callee.advance(1 * S + 1767 * S)
    assert [m for _, m in sent if isinstance(m, Request) and m.method != "ACK"] == []  # we do not refresh
    sent = callee.advance(1 * S + 1768 * S)  # 1800 - min(32, 600) after the 2xx
    assert [m.method for _, m in sent if isinstance(m, Request)] == ["BYE"]
    assert SessionExpired(call) in callee.events
    assert callee.ended() == [CallEnded(call, "session expired", 408, by_remote=True)]


def test_we_refresh_at_half_the_interval_when_the_2xx_names_us() -> None:
    callee, _call, invite = _dial(session_expires_s=1800)
    assert invite.headers.get("Session-Expires") == "1800"
    callee.answer(invite, 1 * S, headers=(("Session-Expires", "1800;refresher=uac"), ("Require", "timer")))
    sent = callee.advance(1 * S + 900 * S)
    assert [(t, m.method) for t, m in sent if isinstance(m, Request)] == [(901 * S, "UPDATE")]
