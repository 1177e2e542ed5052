"""G.722 and Opus in offer/answer (sip/core/offer_answer.py, RFC 3264): G.722 at static PT 9 with rtpmap
"G722/8000" although it samples at 16 kHz (RFC 3551 §4.5.2); Opus at a dynamic PT as "opus/48000/2" with our
16 kHz limits in its fmtp (RFC 7587), without telephone-event beside it; each chosen in the offerer's order
among the codecs the call accepts; never by default (G.711 only, as before), never at another PT, clock rate
or channel count."""

from __future__ import annotations

from dataclasses import replace

from sip.core.offer_answer import LocalMedia, answer, check_offer, negotiate, offer
from sip.core.sdp import parse_sdp

WIDE = LocalMedia("192.0.2.10", 40000, 4242, codecs=("G722", "PCMU", "PCMA"))


def _offer(formats: str, *extra: str) -> str:
    lines = ["v=0", "o=- 1 1 IN IP4 h", "s=-", "c=IN IP4 198.51.100.5", "t=0 0"]
    lines += [f"m=audio 30000 RTP/AVP {formats}", *extra]
    return "\r\n".join(lines) + "\r\n"


def test_our_offer_lists_g722_as_pt_9_with_an_8000_clock_in_our_order() -> None:
    (audio,) = offer(WIDE).media
    assert audio.formats == ("9", "0", "8", "101")
    assert audio.attribute_values("rtpmap")[0] == "9 G722/8000"
    only_wide = offer(replace(WIDE, codecs=("G722",), telephone_event=None)).media[0]
    assert only_wide.formats == ("9",)


def test_the_answer_takes_the_offerers_order_and_g722_at_its_static_pt() -> None:
    event = "a=rtpmap:101 telephone-event/8000"
    first = answer(parse_sdp(_offer("9 0 8 101", "a=rtpmap:9 G722/8000", event)), WIDE)
    assert first is not None and (first.media.codec, first.media.payload_type) == ("G722", 9)
    assert first.media.clock_rate == 8000
    assert first.description.media[0].formats == ("9", "101")
    assert first.description.media[0].attribute_values("rtpmap")[0] == "9 G722/8000"
    second = answer(parse_sdp(_offer("0 9")), WIDE)  # PT 9 without rtpmap: RFC 3551's static table
    assert second is not None and second.media.codec == "PCMU"


def test_a_g722_only_offer_is_refused_by_default_and_answered_where_the_trunk_lists_it() -> None:
    g722_only = parse_sdp(_offer("9", "a=rtpmap:9 G722/8000"))
    default = LocalMedia("192.0.2.10", 40000, 4242)
    assert answer(g722_only, default) is None
    refusal = check_offer(g722_only)
    assert refusal is not None and refusal.cause == "codec"
    assert check_offer(g722_only, codecs=("G722",)) is None
    assert answer(g722_only, replace(default, codecs=("G722",))) is not None


def test_g722_at_a_dynamic_pt_or_a_16000_clock_is_not_g722() -> None:
    dynamic = parse_sdp(_offer("96", "a=rtpmap:96 G722/8000"))
    sixteen = parse_sdp(_offer("9", "a=rtpmap:9 G722/16000"))
    assert answer(dynamic, WIDE) is None and answer(sixteen, WIDE) is None
    assert check_offer(dynamic, codecs=("G722",)) is not None


def test_negotiate_reads_g722_from_the_peers_answer_to_our_offer() -> None:
    ours = offer(WIDE)
    theirs = parse_sdp(_offer("9 101", "a=rtpmap:9 G722/8000", "a=rtpmap:101 telephone-event/8000"))
    media = negotiate(ours, theirs)
    assert media is not None and (media.codec, media.payload_type, media.telephone_event) == ("G722", 9, 101)


OPUS = LocalMedia("192.0.2.10", 40000, 4242, codecs=("OPUS", "PCMU"))
OPUS_MAP = "a=rtpmap:107 opus/48000/2"
EVENT = "a=rtpmap:101 telephone-event/8000"


def test_our_opus_offer_is_a_dynamic_pt_at_48000_2_with_narrowband_limits() -> None:
    (audio,) = offer(OPUS).media
    assert audio.formats == ("111", "0", "101")
    assert audio.attribute_values("rtpmap")[:2] == ("111 opus/48000/2", "0 PCMU/8000")
    assert audio.fmtp(111) == "maxplaybackrate=16000; sprop-maxcapturerate=16000"


def test_the_answer_takes_the_offerers_opus_pt_and_drops_telephone_event_beside_it() -> None:
    result = answer(parse_sdp(_offer("107 0 101", OPUS_MAP, EVENT)), OPUS)
    assert result is not None
    media = result.media
    assert (media.codec, media.payload_type, media.clock_rate, media.telephone_event) == (
        "OPUS",
        107,
        48000,
        None,
    )
    audio = result.description.media[0]
    assert audio.formats == ("107",) and audio.attribute_values("rtpmap") == ("107 opus/48000/2",)
    assert audio.fmtp(107) == "maxplaybackrate=16000; sprop-maxcapturerate=16000"
    pcmu_first = answer(parse_sdp(_offer("0 107 101", OPUS_MAP, EVENT)), OPUS)
    assert pcmu_first is not None and (pcmu_first.media.codec, pcmu_first.media.telephone_event) == (
        "PCMU",
        101,
    )


def test_opus_that_is_not_48000_2_is_not_opus_and_the_default_list_refuses_it() -> None:
    for rtpmap in ("a=rtpmap:107 opus/48000", "a=rtpmap:107 opus/16000/2"):
        assert answer(parse_sdp(_offer("107", rtpmap)), OPUS) is None
    only_opus = parse_sdp(_offer("107", OPUS_MAP))
    refusal = check_offer(only_opus)
    assert refusal is not None and refusal.cause == "codec"
    assert check_offer(only_opus, codecs=("OPUS",)) is None


def test_negotiate_reads_opus_from_the_peers_answer_without_telephone_event() -> None:
    media = negotiate(offer(OPUS), parse_sdp(_offer("111 101", "a=rtpmap:111 opus/48000/2", EVENT)))
    assert media is not None and (media.codec, media.payload_type, media.clock_rate) == ("OPUS", 111, 48000)
    assert media.telephone_event is None
