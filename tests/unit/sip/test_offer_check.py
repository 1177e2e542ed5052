"""An INVITE whose offer can never be answered is refused at once, sans-I/O: 488 with the cause's reason
phrase and Warning, no 180, no `IncomingCall` (so the application, and the provider it would connect, never
hear of it); `sip.core.offer_answer.check_offer` agrees with `answer` on every kind of offer."""

from __future__ import annotations

import base64

import pytest

from sip.core.message import Response
from sip.core.offer_answer import OFFER_REFUSALS, LocalMedia, OfferCause, answer, check_offer
from sip.core.sdp import parse_sdp
from sip.core.ua import IncomingCall
from tests.support.sip_ua import LOCAL, MS, Caller, new_ua, offer_sdp, statuses

KEY = base64.b64encode(bytes(range(30))).decode()
HEAD = "v=0\r\no=alice 1 1 IN IP4 192.0.2.10\r\ns=-\r\nc=IN IP4 192.0.2.10\r\nt=0 0\r\n"
PCMU = "a=rtpmap:0 PCMU/8000\r\n"

# (name, SDP body, transport, the UA's --srtp policy, the cause it must be refused for)
UNANSWERABLE: list[tuple[str, str, str, str, OfferCause]] = [
    ("g729_only", HEAD + "m=audio 4000 RTP/AVP 18\r\na=rtpmap:18 G729/8000\r\n", "udp", "off", "codec"),
    (
        "savp_over_udp_srtp_off",
        HEAD + f"m=audio 4000 RTP/SAVP 0\r\n{PCMU}a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{KEY}\r\n",
        "udp",
        "off",
        "srtp_off",
    ),  # fmt: skip
    (
        "savp_over_udp_srtp_optional",
        HEAD + f"m=audio 4000 RTP/SAVP 0\r\n{PCMU}a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{KEY}\r\n",
        "udp",
        "optional",
        "srtp_needs_tls",
    ),  # fmt: skip
    ("video_only", HEAD + "m=video 4002 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n", "udp", "off", "no_audio"),
    ("audio_port_zero", HEAD + f"m=audio 0 RTP/AVP 0\r\n{PCMU}", "udp", "off", "no_audio"),
    ("no_m_line", HEAD, "udp", "off", "no_media"),
    (
        "tls_without_crypto_srtp_required",
        HEAD + f"m=audio 4000 RTP/AVP 0\r\n{PCMU}",
        "tls",
        "required",
        "srtp_required",
    ),  # fmt: skip
    (
        "savp_unsupported_suites_only",
        HEAD + f"m=audio 4000 RTP/SAVP 0\r\n{PCMU}a=crypto:1 F8_128_HMAC_SHA1_80 inline:{KEY}\r\n",
        "tls",
        "optional",
        "crypto",
    ),  # fmt: skip
    ("dtls_profile", HEAD + f"m=audio 4000 UDP/TLS/RTP/SAVPF 0\r\n{PCMU}", "udp", "off", "profile"),
    (
        "host_name_address",
        HEAD.replace("c=IN IP4 192.0.2.10", "c=IN IP4 pbx.example.com") + f"m=audio 4000 RTP/AVP 0\r\n{PCMU}",
        "udp",
        "off",
        "address",
    ),  # fmt: skip
    # a second audio stream that only lacks a codec got further than a SAVP one: the codec is the cause
    (
        "savp_then_g729",
        HEAD + f"m=audio 4000 RTP/SAVP 0\r\n{PCMU}m=audio 4002 RTP/AVP 18\r\n",
        "udp",
        "off",
        "codec",
    ),  # fmt: skip
]


@pytest.mark.parametrize(
    ("name", "body", "transport", "srtp", "cause"), UNANSWERABLE, ids=[u[0] for u in UNANSWERABLE]
)
def test_an_unanswerable_offer_gets_488_with_its_reason_before_any_180_and_never_reaches_the_application(
    name: str, body: str, transport: str, srtp: str, cause: OfferCause
) -> None:
    caller = Caller(new_ua(srtp=srtp), transport=transport)
    out = caller.invite(0, body=body)
    refusal = OFFER_REFUSALS[cause]
    assert statuses(out) == [488]  # no 100, no 180: the answer is final at once
    (final,) = out
    assert isinstance(final, Response) and final.reason == refusal.reason
    assert final.headers.get("Warning") == f'{refusal.warning} 198.51.100.1:5060 "{refusal.text}"'
    assert caller.take_events() == []  # no IncomingCall: the application never hears of it
    assert caller.ua.stats[f"offer_488_{cause}"] == 1 and caller.ua.active_calls == 0
    # a retransmission of the INVITE gets the same 488 from its transaction, still no call
    again = caller.invite(100 * MS, body=body)
    assert statuses(again) == [488] and caller.take_events() == []
    assert caller.ua.stats[f"offer_488_{cause}"] == 1


def test_every_refusal_has_its_own_reason_phrase() -> None:
    reasons = [r.reason for r in OFFER_REFUSALS.values()]
    assert len(set(reasons)) == len(reasons)


def test_srtp_required_over_udp_is_refused_before_the_180_with_or_without_an_offer() -> None:
    for body in (offer_sdp(), ""):
        caller = Caller(new_ua(srtp="required"))
        out = caller.invite(0, body=body)
        assert statuses(out) == [488] and out[0].reason == "SRTP Required Over TLS"  # type: ignore[union-attr]
        assert caller.take_events() == [] and caller.ua.stats["offer_488_tls_required"] == 1


@pytest.mark.parametrize("direction", ["a=inactive\r\n", "a=sendonly\r\n", "a=recvonly\r\n"])
def test_an_offer_that_starts_on_hold_is_answerable(direction: str) -> None:
    caller = Caller(new_ua())
    out = caller.invite(0, body=offer_sdp(direction))
    assert statuses(out) == [100]
    (incoming,) = caller.take_events()
    assert isinstance(incoming, IncomingCall)
    assert caller.ua.answer(incoming.call, LOCAL, 0)


def test_a_late_offer_still_rings_and_is_answered() -> None:
    caller = Caller(new_ua())
    assert statuses(caller.invite(0, body="")) == [100]
    (incoming,) = caller.take_events()
    assert isinstance(incoming, IncomingCall) and incoming.offer is None
    caller.ua.ring(incoming.call, 0)
    assert statuses(caller.collect()) == [180]


@pytest.mark.parametrize(
    ("name", "body", "transport", "srtp", "cause"), UNANSWERABLE, ids=[u[0] for u in UNANSWERABLE]
)
def test_check_offer_agrees_with_answer(
    name: str, body: str, transport: str, srtp: str, cause: OfferCause
) -> None:
    offer = parse_sdp(body)
    policy = "off" if srtp == "optional" and transport == "udp" else srtp
    local = LocalMedia("198.51.100.1", 30000, session_id=1, srtp=policy)  # type: ignore[arg-type]
    assert answer(offer, local) is None
    assert check_offer(offer, srtp=local.srtp) is not None
    for good in (
        offer_sdp(),
        offer_sdp("a=inactive\r\n"),
        HEAD + "m=video 4002 RTP/AVP 96\r\nm=audio 4000 RTP/AVP 8\r\n",
    ):
        assert check_offer(parse_sdp(good)) is None and answer(parse_sdp(good), LOCAL) is not None
