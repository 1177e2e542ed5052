"""Reliable provisional responses (RFC 3262, sip/core/prack.py) on virtual time: the PRACKs of a call we place
(§4) and the reliable 180/183 of a call we answer (§3)."""

from __future__ import annotations

import base64
import itertools
import random
from dataclasses import replace

from rtp.units import NS_PER_MS as MS
from sip.core.message import Request, Response, make_response, serialize
from sip.core.ua import (
    CallAnswered,
    CallConfirmed,
    CallEnded,
    CallProgress,
    IncomingCall,
    UaConfig,
    UserAgent,
)
from tests.support.sip_ua import LOCAL as UAS_LOCAL
from tests.support.sip_ua import Caller, _to_tag, new_ua, offer_sdp, statuses
from tests.support.sip_uac import ANSWER_SDP, LOCAL, TARGET, TRUNK, Callee

S = 1000 * MS
CONTACT = ("Contact", "<sip:callee@198.51.100.21:5070>")


def start() -> tuple[Callee, str, Request]:
    ua = UserAgent(UaConfig(host="192.0.2.1", port=5060), rng=random.Random(4))
    callee = Callee(ua)
    call = ua.dial(TARGET, LOCAL, 0)
    (invite,) = callee.collect()
    assert isinstance(invite, Request)
    return callee, call, invite


def reliable(rseq: int) -> tuple[tuple[str, str], ...]:
    return (
        CONTACT,
        ("Require", "100rel"),
        ("RSeq", str(rseq)),
        ("Record-Route", "<sip:proxy.example.com;lr>"),
    )


def progress(callee: Callee) -> list[CallProgress]:
    return [e for e in callee.events if isinstance(e, CallProgress)]


def test_the_invite_offers_100rel() -> None:
    _callee, _call, invite = start()
    assert "100rel" in invite.headers.get_all("Supported")
    assert "timer" in invite.headers.get_all("Supported")


def test_a_reliable_183_is_pracked_once_in_order_and_the_dialog_goes_on_from_its_cseq() -> None:
    callee, call, invite = start()
    (prack,) = callee.reply(invite, 183, 100 * MS, headers=reliable(7), body=ANSWER_SDP)
    assert isinstance(prack, Request) and prack.method == "PRACK"
    assert prack.uri == "sip:callee@198.51.100.21:5070"  # the early dialog's remote target (§12.1.2)
    assert prack.headers.get("RAck") == "7 1 INVITE" and prack.headers.get("CSeq") == "2 PRACK"
    assert prack.headers.get("Route") == "<sip:proxy.example.com;lr>"
    assert ";tag=callee1" in (prack.headers.get("To") or "")
    assert callee.sent[-1][0] == ("proxy.example.com", 5060)
    (early,) = progress(callee)
    assert early.status == 183 and early.early_media is not None and early.early_media.remote_port == 42000
    # the UAS retransmits it (our PRACK was on its way): discarded, no second PRACK, no second event
    assert callee.reply(invite, 183, 600 * MS, headers=reliable(7), body=ANSWER_SDP) == []
    # one that skips ahead of a missing one is neither PRACKed nor passed on (§4)
    assert callee.reply(invite, 180, 700 * MS, headers=reliable(9)) == []
    assert len(progress(callee)) == 1
    # the 200 to our PRACK is counted; the next in order gets its own PRACK
    callee.ua.receive(serialize(make_response(prack, 200)), TRUNK, "udp", 800 * MS)
    assert callee.ua.stats["prack_200"] == 1
    (second,) = callee.reply(invite, 180, 900 * MS, headers=reliable(8))
    assert isinstance(second, Request) and second.headers.get("RAck") == "8 1 INVITE"
    assert second.headers.get("CSeq") == "3 PRACK"
    assert [p.status for p in progress(callee)] == [183, 180]
    callee.collect()
    (ack,) = callee.answer(invite, 2 * S)
    assert isinstance(ack, Request) and ack.headers.get("CSeq") == "1 ACK"
    assert any(isinstance(e, CallConfirmed) and e.call == call for e in callee.events)
    assert callee.ua.bye(call, 3 * S)
    (bye,) = callee.collect()
    assert isinstance(bye, Request) and bye.method == "BYE"
    assert bye.headers.get("CSeq") == "4 BYE"  # after the PRACKs' 2 and 3, never one of theirs again


def test_unreliable_provisionals_get_no_prack() -> None:
    callee, _call, invite = start()
    assert callee.reply(invite, 180, 100 * MS, headers=(CONTACT,)) == []
    assert (
        callee.reply(invite, 183, 200 * MS, headers=(CONTACT, ("Supported", "100rel")), body=ANSWER_SDP) == []
    )
    assert [p.status for p in progress(callee)] == [180, 183]
    assert callee.ua.stats["prack_sent"] == 0


def test_a_reliable_1xx_without_a_readable_rseq_passes_as_unreliable() -> None:
    callee, _call, invite = start()
    headers = (CONTACT, ("Require", "100rel"), ("RSeq", "zero"))
    assert callee.reply(invite, 183, 100 * MS, headers=headers, body=ANSWER_SDP) == []
    assert [p.status for p in progress(callee)] == [183]
    assert callee.ua.stats["prack_bad_rseq"] == 1


def test_a_failed_prack_changes_nothing_the_invite_decides() -> None:
    callee, _call, invite = start()
    (prack,) = callee.reply(invite, 183, 100 * MS, headers=reliable(1), body=ANSWER_SDP)
    assert isinstance(prack, Request)
    callee.ua.receive(serialize(make_response(prack, 481)), TRUNK, "udp", 200 * MS)
    assert callee.ua.stats["prack_failed"] == 1 and callee.ended() == []
    busy = callee.reply(invite, 486, 300 * MS)
    assert [m.method for m in busy if isinstance(m, Request)] == ["ACK"]
    assert [(e.status_code, e.by_remote) for e in callee.ended()] == [(486, True)]
    assert not any(isinstance(m, Response) for m in busy)


# --- the calls we answer (§3) ---


def ringing(*extra: str) -> tuple[Caller, str]:
    caller = Caller(new_ua())
    caller.invite(0, extra=extra)
    (incoming,) = [e for e in caller.take_events() if isinstance(e, IncomingCall)]
    return caller, incoming.call


def rack(response: Response) -> str:
    return f"{response.headers.get('RSeq')} 1 INVITE"


def test_supported_100rel_alone_gets_an_unreliable_183_with_the_answer_and_the_same_sdp_in_the_200() -> None:
    caller, call = ringing("Supported: 100rel")
    media = caller.ua.early(call, UAS_LOCAL, 10 * MS)
    assert media is not None and media.remote_port == 40000
    (progress_183,) = caller.collect()
    assert isinstance(progress_183, Response) and progress_183.status == 183
    assert progress_183.reason == "Session Progress" and progress_183.headers.get("RSeq") is None
    assert b"m=audio 30000 RTP/AVP 0" in progress_183.body
    assert caller.ua.early(call, UAS_LOCAL, 20 * MS) == media and caller.collect() == []  # once
    assert caller.ua.answer(call, UAS_LOCAL, 1 * S)
    (ok,) = caller.collect()
    assert isinstance(ok, Response) and ok.status == 200 and ok.body == progress_183.body  # one answer
    (answered,) = [e for e in caller.take_events() if isinstance(e, CallAnswered)]
    assert answered.media == media


def test_require_100rel_sends_the_180_and_183_reliably_in_order_and_the_200_after_the_prack() -> None:
    caller, call = ringing("Require: 100rel", "Supported: 100rel, timer")
    assert caller.sent and statuses(caller.sent) == [100]  # accepted (no 420)
    assert caller.ua.ring(call, 10 * MS)
    (ringing_180,) = caller.collect()
    assert isinstance(ringing_180, Response) and ringing_180.status == 180
    assert ringing_180.headers.get("Require") == "100rel" and ringing_180.headers.get("RSeq")
    first = int(ringing_180.headers.get("RSeq") or 0)
    assert caller.ua.early(call, UAS_LOCAL, 20 * MS) is not None
    assert caller.collect() == []  # §3: not before the 180 is PRACKed
    # retransmitted at T1, 2·T1 ... until the PRACK
    resent = [m for _, m in caller.advance(20 * MS + 1600 * MS)]
    assert statuses(resent) == [180, 180]  # at T1 and 3·T1 (the interval doubles)
    assert caller.ua.answer(call, UAS_LOCAL, 1700 * MS)  # the 200 waits: the 183's SDP is not PRACKed yet
    assert caller.collect() == []
    caller.to_tag = _to_tag(ringing_180)
    out = caller.request("PRACK", 1800 * MS, "z9hG4bKpr1", extra=(f"RAck: {rack(ringing_180)}",))
    assert statuses(out) == [200, 183]
    progress_183 = out[1]
    assert isinstance(progress_183, Response) and int(progress_183.headers.get("RSeq") or 0) == first + 1
    assert progress_183.headers.get("Require") == "100rel" and b"m=audio 30000" in progress_183.body
    # a PRACK naming nothing outstanding: 481, and the 200 still waits
    assert statuses(caller.request("PRACK", 1900 * MS, "z9hG4bKpr2", extra=("RAck: 999 1 INVITE",))) == [481]
    out = caller.request("PRACK", 2000 * MS, "z9hG4bKpr3", extra=(f"RAck: {rack(progress_183)}",))
    assert statuses(out) == [200, 200]
    ok = out[1]
    assert isinstance(ok, Response) and ok.headers.get("CSeq") == "1 INVITE" and ok.body == progress_183.body
    later = [m for _, m in caller.advance(2000 * MS + 4 * S)]  # only the 2xx, until the ACK (§13.3.1.4)
    assert later and statuses(later) == [200] * len(later)
    assert caller.ua.stats["prack_received"] == 2 and caller.ua.stats["prack_481"] == 1


def test_no_prack_within_64_t1_rejects_the_invite_with_504() -> None:
    caller, call = ringing("Require: 100rel")
    caller.ua.early(call, UAS_LOCAL, 0)
    caller.collect()
    caller.advance(40 * S)
    assert caller.ua.stats["prack_timeout"] == 1
    ended = [e for e in caller.take_events() if isinstance(e, CallEnded)]
    assert [(e.status_code, e.by_remote) for e in ended] == [(504, False)]
    assert 504 in statuses(caller.sent)


def test_require_100rel_elsewhere_than_an_invite_is_still_420() -> None:
    caller = Caller(new_ua())
    (refused,) = caller.request("OPTIONS", 0, "z9hG4bKo1", extra=("Require: 100rel",))
    assert isinstance(refused, Response) and refused.status == 420


def test_the_200_after_a_183_carries_the_183s_answer_srtp_keys_included() -> None:
    caller = Caller(new_ua(srtp="optional"), transport="tls")
    theirs = base64.b64encode(bytes(range(30))).decode()
    offer = (
        offer_sdp().replace("RTP/AVP", "RTP/SAVP") + f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{theirs}\r\n"
    )
    caller.invite(0, body=offer)
    (incoming,) = [e for e in caller.take_events() if isinstance(e, IncomingCall)]
    counter = itertools.count(1)  # every draw of key bytes differs: a second answer would name other keys
    local = replace(UAS_LOCAL, srtp="optional", key_source=lambda n: bytes([next(counter)]) * n)
    early = caller.ua.early(incoming.call, local, 10 * MS)
    assert early is not None and early.srtp is not None
    (progress_183,) = caller.collect()
    assert isinstance(progress_183, Response) and b"a=crypto:" in progress_183.body
    assert caller.ua.answer(incoming.call, local, 1 * S)
    (ok,) = caller.collect()
    assert isinstance(ok, Response) and ok.status == 200 and ok.body == progress_183.body
    (answered,) = [e for e in caller.take_events() if isinstance(e, CallAnswered)]
    assert answered.media is not None and answered.media.srtp == early.srtp  # the keys the media started with
