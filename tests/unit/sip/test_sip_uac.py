"""Calls the UserAgent places (UAC, RFC 3261 §8.1, §9.1, §13.2, §22): INVITE, provisional responses and early
media, 2xx → ACK, failures, CANCEL, digest retries, timeouts; on virtual time, no sockets."""

from __future__ import annotations

import random

from rtp.units import NS_PER_MS as MS
from sip.core.auth import AuthOk, Credentials, DigestServer
from sip.core.headers import Headers, parse_via
from sip.core.message import Request, Response, serialize
from sip.core.offer_answer import LocalMedia
from sip.core.ua import CallConfirmed, CallEnded, CallProgress, UaConfig, UserAgent
from tests.support.sip_uac import ANSWER_SDP, LOCAL, TARGET, Callee

S = 1000 * MS


def start(**kwargs: object) -> tuple[Callee, str, Request]:
    ua = UserAgent(UaConfig(host="192.0.2.1", port=5060), rng=random.Random(4))
    callee = Callee(ua)
    call = ua.dial(TARGET, LOCAL, 0, **kwargs)  # type: ignore[arg-type]
    (invite,) = callee.collect()
    assert isinstance(invite, Request)
    return callee, call, invite


def test_invite_shape() -> None:
    callee, call, invite = start()
    assert invite.method == "INVITE" and invite.uri == TARGET
    h = invite.headers
    assert callee.sent[0][0] == ("trunk.example.com", 5060)
    assert parse_via(h.get("Via") or "").branch.startswith("z9hG4bK")  # type: ignore[union-attr]
    assert ";tag=" in (h.get("From") or "") and ";tag=" not in (h.get("To") or "")
    assert h.get("CSeq") == "1 INVITE" and h.get("Contact") == "<sip:bridge@192.0.2.1:5060>"
    assert "timer" in h.get_all("Supported") and h.get("Content-Type") == "application/sdp"
    assert b"m=audio 30000 RTP/AVP 0 8 101" in invite.body
    assert callee.ua.active_calls == 1 and call in callee.ua.call_ids()


def test_ringing_early_media_answer_ack_and_bye_from_callee() -> None:
    callee, call, invite = start()
    callee.reply(invite, 100, 10 * MS)
    callee.reply(invite, 180, 20 * MS)
    callee.reply(invite, 183, 30 * MS, body=ANSWER_SDP)
    progress = [e for e in callee.events if isinstance(e, CallProgress)]
    assert [(p.status, p.early_media is not None) for p in progress] == [(180, False), (183, True)]
    assert progress[1].early_media is not None and progress[1].early_media.remote_port == 42000
    sent = callee.answer(invite, 1 * S)
    (ack,) = sent
    assert isinstance(ack, Request) and ack.method == "ACK" and ack.uri == "sip:callee@198.51.100.21:5070"
    assert callee.sent[-1][0] == ("198.51.100.21", 5070)  # to the 2xx's Contact
    assert ack.headers.get("CSeq") == "1 ACK" and ";tag=callee1" in (ack.headers.get("To") or "")
    (confirmed,) = [e for e in callee.events if isinstance(e, CallConfirmed)]
    assert confirmed.call == call and confirmed.media is not None and confirmed.media.codec == "PCMU"
    # the 2xx again (our ACK was lost): the same ACK again, no new event
    again = callee.answer(invite, 1500 * MS)
    assert [serialize(m) for m in again] == [serialize(ack)]
    assert len([e for e in callee.events if isinstance(e, CallConfirmed)]) == 1
    # a BYE from the callee ends the call
    bye = Request(
        "BYE",
        "sip:bridge@192.0.2.1:5060",
        Headers(
            [
                ("Via", "SIP/2.0/UDP 198.51.100.21:5070;branch=z9hG4bKbye1"),
                ("From", (ack.headers.get("To") or "")),
                ("To", (ack.headers.get("From") or "")),
                ("Call-ID", ack.headers.get("Call-ID") or ""),
                ("CSeq", "1 BYE"),
                ("Max-Forwards", "70"),
            ]
        ),
    )
    callee.ua.receive(serialize(bye), ("198.51.100.21", 5070), "udp", 5 * S)
    (ok,) = callee.collect()
    assert isinstance(ok, Response) and ok.status == 200
    assert callee.ended() == [CallEnded(call, "remote hangup", 200, True)]
    assert callee.ua.active_calls == 0


def test_our_bye_goes_in_the_dialog() -> None:
    callee, call, invite = start()
    callee.answer(invite, S)
    assert callee.ua.bye(call, 2 * S)
    (bye,) = callee.collect()
    assert isinstance(bye, Request) and bye.method == "BYE" and bye.headers.get("CSeq") == "2 BYE"
    assert bye.uri == "sip:callee@198.51.100.21:5070"
    assert callee.ended() == [CallEnded(call, "normal clearing", 200, False)]


def test_busy_is_a_failure_with_the_status() -> None:
    callee, call, invite = start()
    callee.reply(invite, 180, 10 * MS)
    sent = callee.reply(invite, 486, 2 * S)
    assert [m.method for m in sent if isinstance(m, Request)] == ["ACK"]  # the transaction ACKs a non-2xx
    assert callee.ended() == [CallEnded(call, "486 Busy Here", 486, True)]
    assert callee.ua.active_calls == 0 and not callee.ua.bye(call, 3 * S)


def test_cancel_a_ringing_call() -> None:
    callee, call, invite = start()
    callee.reply(invite, 180, 10 * MS)
    assert callee.ua.cancel(call, 1 * S)
    (cancel,) = callee.collect()
    assert isinstance(cancel, Request) and cancel.method == "CANCEL" and cancel.uri == invite.uri
    assert cancel.headers.get("Via") == invite.headers.get("Via") and cancel.headers.get("CSeq") == "1 CANCEL"
    assert cancel.headers.get("To") == invite.headers.get("To")
    callee.reply(cancel, 200, 1100 * MS)
    assert callee.ended() == []
    sent = callee.reply(invite, 487, 1200 * MS)
    assert [m.method for m in sent if isinstance(m, Request)] == ["ACK"]
    assert callee.ended() == [CallEnded(call, "cancelled", 487, False)]
    assert not callee.ua.cancel(call, 2 * S)


def test_cancel_before_any_provisional_waits_for_one() -> None:
    callee, call, invite = start()
    assert callee.ua.bye(call, 5 * MS)  # bye() on an unanswered outbound call cancels it
    assert callee.collect() == []  # §9.1: no CANCEL before a provisional response
    sent = callee.reply(invite, 180, 50 * MS)
    assert [m.method for m in sent if isinstance(m, Request)] == ["CANCEL"]


def test_answer_crossing_our_cancel_is_acked_and_hung_up() -> None:
    callee, call, invite = start()
    callee.reply(invite, 180, 10 * MS)
    callee.ua.cancel(call, 1 * S)
    callee.collect()
    sent = callee.answer(invite, 1100 * MS)
    assert [m.method for m in sent if isinstance(m, Request)] == ["ACK", "BYE"]
    assert callee.ended() == [CallEnded(call, "cancelled", 487, False)]
    assert not [e for e in callee.events if isinstance(e, CallConfirmed)]


def test_401_is_answered_with_credentials_once() -> None:
    server = DigestServer("trunk", [Credentials("acct", "pw")], secret=b"t" * 32)
    callee, call, invite = start(credentials=Credentials("acct", "pw"))
    sent = callee.reply(invite, 401, 50 * MS, headers=server.challenge(0))
    ack, retry = sent
    assert isinstance(ack, Request) and ack.method == "ACK"
    assert isinstance(retry, Request) and retry.method == "INVITE"
    assert retry.headers.get("CSeq") == "2 INVITE" and retry.headers.get("Call-ID") == invite.headers.get(
        "Call-ID"
    )
    assert retry.headers.get("From") == invite.headers.get("From")
    assert retry.headers.get("Via") != invite.headers.get("Via") and retry.body == invite.body
    verdict = server.verify(
        "INVITE", retry.uri, retry.headers.get_fields("Authorization"), 60 * MS, retry.body
    )
    assert verdict == AuthOk("acct")
    callee.reply(retry, 180, 100 * MS)
    callee.answer(retry, S)
    (confirmed,) = [e for e in callee.events if isinstance(e, CallConfirmed)]
    assert confirmed.call == call and callee.ended() == []


def test_407_uses_proxy_authorization() -> None:
    server = DigestServer("proxy", [Credentials("acct", "pw")], secret=b"t" * 32, proxy=True)
    callee, _, invite = start(credentials=Credentials("acct", "pw"))
    sent = callee.reply(invite, 407, 50 * MS, headers=server.challenge(0))
    retry = sent[-1]
    assert isinstance(retry, Request) and "Authorization" not in retry.headers
    fields = retry.headers.get_fields("Proxy-Authorization")
    assert server.verify("INVITE", retry.uri, fields, 60 * MS, retry.body) == AuthOk("acct")


def test_second_challenge_with_the_same_nonce_fails_the_call() -> None:
    challenge = (("WWW-Authenticate", 'Digest realm="trunk", nonce="n1", qop="auth"'),)
    callee, call, invite = start(credentials=Credentials("acct", "wrong"))
    retry = callee.reply(invite, 401, 50 * MS, headers=challenge)[-1]
    assert isinstance(retry, Request)
    sent = callee.reply(retry, 401, 100 * MS, headers=challenge)
    assert [m.method for m in sent if isinstance(m, Request)] == ["ACK"]  # no third INVITE
    assert callee.ended() == [CallEnded(call, "bad credentials", 401, True)]
    assert callee.ua.stats["auth_refused"] == 1


def test_challenge_without_credentials_fails() -> None:
    callee, call, invite = start()
    callee.reply(invite, 401, 50 * MS, headers=(("WWW-Authenticate", 'Digest realm="t", nonce="n"'),))
    (ended,) = callee.ended()
    assert ended.status_code == 401 and "no credentials" in ended.reason


def test_no_response_at_all_is_timer_b() -> None:
    callee, call, _ = start()
    sent = callee.advance(40 * S)
    retransmits = [t for t, m in sent if isinstance(m, Request) and m.method == "INVITE"]
    assert [t // MS for t in retransmits] == [500, 1500, 3500, 7500, 15500, 31500]
    assert callee.ended() == [CallEnded(call, "no response (timeout)", 408, True)]
    assert callee.ua.stats["timer_b"] == 1 and callee.ua.active_calls == 0


def test_ringing_timeout_cancels_and_reports_no_answer() -> None:
    callee, call, invite = start(ring_timeout_s=30)
    callee.reply(invite, 180, 100 * MS)
    sent = callee.advance(30 * S)
    cancels = [(t, m) for t, m in sent if isinstance(m, Request) and m.method == "CANCEL"]
    assert [t for t, _ in cancels] == [30 * S]
    cancel = cancels[0][1]
    assert isinstance(cancel, Request)
    callee.reply(cancel, 200, 30100 * MS)
    callee.reply(invite, 487, 30200 * MS)
    assert callee.ended() == [CallEnded(call, "no answer (ringing timeout)", 408, False)]
    assert callee.ua.stats["ring_timeout"] == 1


def test_cancel_without_a_final_gives_up_after_64_t1() -> None:
    callee, call, invite = start()
    callee.reply(invite, 180, 100 * MS)
    callee.ua.cancel(call, S)
    callee.collect()
    callee.advance(S + 32 * S - 1)
    assert callee.ended() == []
    callee.advance(S + 32 * S)
    assert callee.ended() == [CallEnded(call, "cancelled", 487, False)]


def test_session_timer_from_the_2xx_makes_us_refresh() -> None:
    callee, call, invite = start()
    callee.answer(invite, S, headers=(("Session-Expires", "120;refresher=uac"), ("Require", "timer")))
    sent = callee.advance(62 * S)
    updates = {
        m.headers.get("CSeq"): t for t, m in reversed(sent) if isinstance(m, Request) and m.method == "UPDATE"
    }
    assert updates == {"2 UPDATE": 61 * S}  # half of 120 s after the 2xx (the callee allows UPDATE)
    assert callee.ended() == []


def test_inbound_calls_still_work_beside_outbound_ones() -> None:
    callee, call, invite = start()
    data = (
        b"INVITE sip:bridge@192.0.2.1 SIP/2.0\r\nVia: SIP/2.0/UDP 203.0.113.9:5060;branch=z9hG4bKin1\r\n"
        b"Max-Forwards: 70\r\nFrom: <sip:x@example.com>;tag=f\r\nTo: <sip:bridge@192.0.2.1>\r\n"
        b"Call-ID: in-1\r\nCSeq: 1 INVITE\r\nContact: <sip:x@203.0.113.9>\r\nContent-Length: 0\r\n\r\n"
    )
    callee.ua.receive(data, ("203.0.113.9", 5060), "udp", S)
    callee.collect()
    assert callee.ua.active_calls == 2 and len(callee.ua.call_ids()) == 2


def test_ringing_timeout_before_any_provisional_ends_at_once_and_cancels_a_late_180() -> None:
    callee, call, invite = start(ring_timeout_s=0.2)
    callee.advance(200 * MS)
    assert callee.ended() == [CallEnded(call, "no answer (ringing timeout)", 408, False)]
    assert callee.requests("CANCEL") == []  # §9.1: not before a provisional response
    sent = callee.reply(invite, 180, 300 * MS)
    assert [m.method for m in sent if isinstance(m, Request)] == ["CANCEL"]
    assert len(callee.ended()) == 1


def test_a_second_2xx_from_a_fork_is_acked_and_hung_up() -> None:
    callee, call, invite = start()
    callee.answer(invite, S)
    sent = callee.reply(
        invite,
        200,
        1100 * MS,
        tag="fork2",
        headers=(("Contact", "<sip:other@198.51.100.30>"),),
        body=ANSWER_SDP,
    )
    methods = [(m.method, m.uri) for m in sent if isinstance(m, Request)]
    assert methods == [("ACK", "sip:other@198.51.100.30"), ("BYE", "sip:other@198.51.100.30")]
    assert len([e for e in callee.events if isinstance(e, CallConfirmed)]) == 1 and callee.ended() == []


def test_407_from_a_proxy_then_the_callee_answers_and_a_repeated_challenge_fails_with_407() -> None:
    # A trunk's proxy challenges (407); the retry carries Proxy-Authorization, the callee answers
    server = DigestServer("proxy.example", [Credentials("acct", "pw")], secret=b"p" * 32, proxy=True)
    callee, call, invite = start(credentials=Credentials("acct", "pw"))
    ack, retry = callee.reply(invite, 407, 50 * MS, headers=server.challenge(0))
    assert isinstance(ack, Request) and ack.method == "ACK" and ack.headers.get("CSeq") == "1 ACK"
    assert isinstance(retry, Request) and retry.headers.get("CSeq") == "2 INVITE"
    fields = retry.headers.get_fields("Proxy-Authorization")
    assert server.verify("INVITE", retry.uri, fields, 60 * MS, retry.body) == AuthOk("acct")
    callee.reply(retry, 180, 100 * MS)
    callee.answer(retry, S)
    assert [e.call for e in callee.events if isinstance(e, CallConfirmed)] == [call]
    # the same nonce challenged again: the credentials are refused, the call fails with the proxy's status
    refused, _, again = start(credentials=Credentials("acct", "wrong"))
    challenge = server.challenge(0)
    retry = refused.reply(again, 407, 50 * MS, headers=challenge)[-1]
    assert isinstance(retry, Request)
    refused.reply(retry, 407, 60 * MS, headers=challenge)
    [ended] = refused.ended()
    assert ended.status_code == 407 and refused.ua.stats["auth_refused"] == 1


SRTP_ANSWER = ANSWER_SDP.replace("RTP/AVP 0 101", "RTP/SAVP 0 101") + (
    "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz\r\n"
)


def test_an_outbound_srtp_offer_carries_sdes_keys_and_the_answer_agrees_them() -> None:
    # `call --srtp offer` over TLS (the shell only asks for SRTP on a TLS call: sip.native.tls.sdes_policy)
    local = LocalMedia(address="192.0.2.1", port=30000, session_id=77, srtp="optional")
    ua = UserAgent(UaConfig(host="192.0.2.1", port=5060, tls_port=5061), rng=random.Random(4))
    callee = Callee(ua)
    call = ua.dial("sips:+15550001@trunk.example.com", local, 0)
    (invite,) = callee.collect()
    assert isinstance(invite, Request)
    assert callee.sent[0][0] == ("trunk.example.com", 5061) and "SIP/2.0/TLS" in (
        invite.headers.get("Via") or ""
    )
    body = invite.body.decode()
    assert "m=audio 30000 RTP/AVP " in body  # offer: best effort, plain RTP/AVP with a=crypto lines
    assert "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" in body
    assert "a=crypto:2 AES_CM_128_HMAC_SHA1_32 inline:" in body
    callee.reply(invite, 180, 10 * MS)
    callee.reply(
        invite,
        200,
        S,
        headers=(("Contact", "<sip:callee@198.51.100.21:5071;transport=tls>"),),
        body=SRTP_ANSWER,
    )
    (confirmed,) = [e for e in callee.events if isinstance(e, CallConfirmed)]
    assert confirmed.call == call and confirmed.media is not None and confirmed.media.srtp is not None
    keys = confirmed.media.srtp
    assert keys.suite == "AES_CM_128_HMAC_SHA1_80" and keys.tag == 1
    assert keys.local_key != keys.remote_key and len(keys.local_key) == len(keys.remote_key) == 30


def test_srtp_required_offers_rtp_savp_and_a_plain_answer_leaves_no_media() -> None:
    local = LocalMedia(address="192.0.2.1", port=30000, session_id=77, srtp="required")
    ua = UserAgent(UaConfig(host="192.0.2.1", port=5060), rng=random.Random(4))
    callee = Callee(ua)
    ua.dial("sips:+15550001@trunk.example.com", local, 0)
    (invite,) = callee.collect()
    assert isinstance(invite, Request) and b"m=audio 30000 RTP/SAVP " in invite.body
    callee.answer(invite, S)  # a plain RTP/AVP answer: nothing usable was agreed
    (confirmed,) = [e for e in callee.events if isinstance(e, CallConfirmed)]
    assert confirmed.media is None  # (the native shell hangs such a call up: "no usable SDP answer")
