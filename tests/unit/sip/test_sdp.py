"""sip.core.sdp and sip.core.offer_answer: RFC 4566 parse/serialise and RFC 3264 offer/answer for PCMU, PCMA and telephone-event."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sip.core import sdp
from sip.core.offer_answer import LocalMedia, NegotiatedMedia, accept_answer, answer, negotiate, offer
from sip.core.sdp import (
    Codec,
    Connection,
    MediaDescription,
    Origin,
    SdpError,
    SessionDescription,
    hold_state,
    is_held,
    parse_sdp,
    serialize_sdp,
)

LOCAL = LocalMedia("192.0.2.10", 40000, session_id=4242)


def _sdp(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n").encode()


def _offer(
    formats: str = "0 8 101",
    *attributes: str,
    address: str = "198.51.100.5",
    port: int = 30000,
    media: tuple[str, ...] = (),
    session: tuple[str, ...] = (),
) -> SessionDescription:
    lines = [
        "v=0",
        "o=carrier 1000 1 IN IP4 198.51.100.5",
        "s=call",
        f"c=IN IP4 {address}",
        "t=0 0",
        *session,
        *media,
        f"m=audio {port} RTP/AVP {formats}",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:8 PCMA/8000",
        "a=rtpmap:101 telephone-event/8000",
        "a=fmtp:101 0-15",
        *attributes,
    ]
    return parse_sdp(_sdp(*lines))


def _audio(description: SessionDescription) -> MediaDescription:
    return next(m for m in description.media if m.media == "audio" and m.port != 0)


# --- parse / serialise ----------------------------------------------------------------------------------------


def test_parse_a_typical_offer() -> None:
    description = parse_sdp(
        _sdp(
            "v=0",
            "o=- 1997 1998 IN IP4 203.0.113.7",
            "s=Asterisk",
            "c=IN IP4 203.0.113.7",
            "b=AS:64",
            "t=0 0",
            "a=tool:x",
            "m=audio 17000 RTP/AVP 9 0 8 96",
            "a=rtpmap:96 telephone-event/8000",
            "a=fmtp:96 0-16",
            "a=ptime:20",
            "a=maxptime:150",
            "a=sendrecv",
        )
    )
    assert description.origin == Origin("-", 1997, 1998, "203.0.113.7")
    assert description.session_name == "Asterisk" and description.connection == Connection("203.0.113.7")
    assert description.times == ((0, 0),) and description.attribute("tool") == "x"
    (audio,) = description.media
    assert (audio.media, audio.port, audio.proto, audio.formats) == (
        "audio",
        17000,
        "RTP/AVP",
        ("9", "0", "8", "96"),
    )
    assert audio.codecs() == {
        9: Codec(9, "G722", 8000),
        0: Codec(0, "PCMU", 8000),
        8: Codec(8, "PCMA", 8000),
        96: Codec(96, "telephone-event", 8000),
    }
    assert audio.fmtp(96) == "0-16" and audio.fmtp(0) is None
    assert audio.ptime == 20 and audio.direction == "sendrecv" and audio.attribute("maxptime") == "150"
    assert description.extra == (("b", "AS:64"),)
    assert parse_sdp(serialize_sdp(description)) == description


def test_serialise_is_in_rfc_order_with_crlf() -> None:
    text = "v=0\no=a 1 2 IN IP4 h\ns=x\nt=0 0\nb=CT:1\ni=info\nm=audio 1 RTP/AVP 0\na=x\nb=AS:1\nc=IN IP4 h\n"
    description = parse_sdp(text)
    assert serialize_sdp(description) == (
        b"v=0\r\no=a 1 2 IN IP4 h\r\ns=x\r\ni=info\r\nb=CT:1\r\nt=0 0\r\n"
        b"m=audio 1 RTP/AVP 0\r\nc=IN IP4 h\r\nb=AS:1\r\na=x\r\n"
    )
    assert str(description) == serialize_sdp(description).decode()
    assert parse_sdp(serialize_sdp(description)) == description


def test_port_count_multicast_ttl_ipv6_and_non_rtp() -> None:
    description = parse_sdp(
        _sdp(
            "v=0",
            "o=- 1 1 IN IP6 2001:db8::1",
            "s=-",
            "c=IN IP6 2001:db8::1",
            "t=0 0",
            "m=audio 5000/2 RTP/AVP 0",
            "c=IN IP4 224.2.1.1/127",
            "m=application 9 TCP/BFCP *",
        )
    )
    audio, application = description.media
    assert audio.port_count == 2 and audio.connection == Connection("224.2.1.1/127")
    assert application.formats == ("*",) and application.codecs() == {}
    assert description.connection_for(application) == Connection("2001:db8::1", "IP6")
    assert parse_sdp(serialize_sdp(description)) == description


def test_lf_line_ends_and_blank_lines_are_tolerated() -> None:
    description = parse_sdp("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 h\nt=0 0\n\nm=audio 1 RTP/AVP 0\n\n\n")
    assert description.media[0].port == 1


def test_missing_s_and_t_default() -> None:
    description = parse_sdp(_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio 1 RTP/AVP 0"))
    assert description.session_name == "-" and description.times == ((0, 0),)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "v=0"),
        (b"o=- 1 1 IN IP4 h\r\n", "v=0"),
        (b"v=1\r\n", "v=0"),
        (_sdp("v=0", "s=-"), "no o="),
        (_sdp("v=0", "o=- 1 IN IP4 h"), "six fields"),
        (_sdp("v=0", "o=- x 1 IN IP4 h"), "numbers"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "o=- 1 1 IN IP4 h"), "second o="),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "v=0"), "second v="),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "s=-", "s=-"), "second s="),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4"), "c= needs"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=ATM NSAP h"), "IN IP4"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "c=IN IP4 h"), "second session-level c="),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "t=now"), "t= needs"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "x=unknown"), "known type letter"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "garbage"), "known type letter"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio"), "m= needs"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio x RTP/AVP 0"), "bad port"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio 70000 RTP/AVP 0"), "bad port"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio 1/0 RTP/AVP 0"), "port count"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio 1 RTP/AVP 128"), "0-127"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio 1 RTP/AVP PCMU"), "0-127"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "m=audio 1 RTP/AVP 0"), "no c= line"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio 1 RTP/AVP 0", "t=0 0"), "media section"),
        (_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio 1 RTP/AVP 0", "a= bad"), "a= needs"),
        (
            _sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio 1 RTP/AVP 0", "c=IN IP4 h", "c=IN IP4 h"),
            "second c=",
        ),
        (b"v=0\r\no=- 1 1 IN IP4 \xff\r\n", "UTF-8"),
        (b"v=0\r\no=- 1 1 IN IP4 h\r\ns=a\x00b\r\n", "control"),
        (b"v=0\r\n" + b"a=x\r\n" * 20000, "too large"),
    ],
)
def test_bad_sdp_is_a_clear_value_error(data: bytes, fragment: str) -> None:
    with pytest.raises(SdpError, match=fragment) as info:
        parse_sdp(data)
    assert isinstance(info.value, ValueError)
    assert sdp.parse(data) is None


def test_port_zero_media_needs_no_connection() -> None:
    description = parse_sdp(_sdp("v=0", "o=- 1 1 IN IP4 h", "s=-", "t=0 0", "m=video 0 RTP/AVP 31"))
    assert description.media[0].port == 0


def test_short_names() -> None:
    description = _offer()
    assert sdp.parse(serialize_sdp(description)) == description
    assert sdp.serialize(description) == serialize_sdp(description)
    assert sdp.is_hold(description) is is_held(description)


# --- offer ----------------------------------------------------------------------------------------------------


def test_offer_lists_our_codecs_telephone_event_ptime_and_direction() -> None:
    ours = offer(LOCAL)
    assert ours.origin == Origin("-", 4242, 0, "192.0.2.10")
    assert ours.connection == Connection("192.0.2.10")
    (audio,) = ours.media
    assert (audio.port, audio.proto, audio.formats) == (40000, "RTP/AVP", ("0", "8", "101"))
    assert audio.attribute_values("rtpmap") == ("0 PCMU/8000", "8 PCMA/8000", "101 telephone-event/8000")
    assert audio.fmtp(101) == "0-16" and audio.ptime == 20 and audio.direction == "sendrecv"
    assert parse_sdp(serialize_sdp(ours)) == ours


def test_offer_respects_local_codecs_ipv6_and_no_telephone_event() -> None:
    local = LocalMedia("2001:db8::10", 40002, 7, codecs=("PCMA",), telephone_event=None)
    ours = offer(local)
    assert ours.connection == Connection("2001:db8::10", "IP6") and ours.origin.addrtype == "IP6"
    assert ours.media[0].formats == ("8",)
    with pytest.raises(ValueError):
        offer(replace(LOCAL, codecs=("G729",)))


def test_origin_version_increments_only_on_change() -> None:
    first = offer(LOCAL)
    same = offer(LOCAL, previous=first)
    assert same == first and same.origin.version == 0
    held = offer(replace(LOCAL, direction="sendonly"), previous=same)
    assert held.origin.version == 1 and held.origin.session_id == 4242
    assert held.media[0].direction == "sendonly"
    resumed = offer(LOCAL, previous=held)
    assert resumed.origin.version == 2
    assert offer(LOCAL, previous=resumed).origin.version == 2


# --- answer ---------------------------------------------------------------------------------------------------


def test_answer_picks_the_first_supported_codec_in_the_offers_order() -> None:
    result = answer(_offer("8 0 101"), LOCAL)
    assert result is not None
    audio = _audio(result.description)
    assert audio.formats == ("8", "101") and audio.codecs()[8].name == "PCMA"
    assert result.media == NegotiatedMedia(
        codec="PCMA",
        payload_type=8,
        telephone_event=101,
        remote_address="198.51.100.5",
        remote_port=30000,
        direction="sendrecv",
        remote_direction="sendrecv",
    )
    assert result.description.connection == Connection("192.0.2.10") and audio.port == 40000
    assert audio.ptime == 20 and audio.direction == "sendrecv"


def test_answer_skips_codecs_we_do_not_support_and_local_preferences_limit() -> None:
    result = answer(_offer("18 9 0 8 101", "a=rtpmap:18 G729/8000"), LOCAL)
    assert result is not None and result.media.codec == "PCMU"
    only_pcma = answer(_offer("0 8 101"), replace(LOCAL, codecs=("PCMA",)))
    assert only_pcma is not None and only_pcma.media.codec == "PCMA"


def test_answer_keeps_the_offers_telephone_event_pt_and_fmtp() -> None:
    description = parse_sdp(
        _sdp(
            "v=0",
            "o=- 1 1 IN IP4 h",
            "s=-",
            "c=IN IP4 198.51.100.5",
            "t=0 0",
            "m=audio 30000 RTP/AVP 0 96",
            "a=rtpmap:96 telephone-event/8000",
            "a=fmtp:96 0-15",
        )
    )
    result = answer(description, LOCAL)
    assert result is not None and result.media.telephone_event == 96
    audio = _audio(result.description)
    assert audio.formats == ("0", "96") and audio.fmtp(96) == "0-15"
    assert "96 telephone-event/8000" in audio.attribute_values("rtpmap")


def test_answer_without_telephone_event_when_not_offered_or_not_wanted() -> None:
    no_te = answer(_offer("0"), LOCAL)
    assert (
        no_te is not None
        and no_te.media.telephone_event is None
        and _audio(no_te.description).formats == ("0",)
    )
    not_wanted = answer(_offer("0 101"), replace(LOCAL, telephone_event=None))
    assert not_wanted is not None and _audio(not_wanted.description).formats == ("0",)


def test_dynamic_pt_for_pcmu_and_wrong_clock_rates() -> None:
    dynamic = parse_sdp(
        _sdp(
            "v=0",
            "o=- 1 1 IN IP4 h",
            "c=IN IP4 192.0.2.1",
            "m=audio 1 RTP/AVP 97 98",
            "a=rtpmap:97 PCMU/16000",
            "a=rtpmap:98 pcmu/8000",
        )
    )
    result = answer(dynamic, LOCAL)
    assert result is not None and (result.media.codec, result.media.payload_type) == ("PCMU", 98)
    stereo = parse_sdp(
        _sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=audio 1 RTP/AVP 97", "a=rtpmap:97 PCMA/8000/2")
    )
    assert answer(stereo, LOCAL) is None


def test_no_common_codec_is_none_for_488() -> None:
    assert answer(_offer("18 9 101"), LOCAL) is None


def test_video_only_or_no_media_is_none() -> None:
    video = parse_sdp(_sdp("v=0", "o=- 1 1 IN IP4 h", "c=IN IP4 h", "m=video 5000 RTP/AVP 31"))
    assert answer(video, LOCAL) is None
    assert answer(parse_sdp(_sdp("v=0", "o=- 1 1 IN IP4 h", "s=-")), LOCAL) is None


def test_srtp_audio_is_rejected() -> None:
    srtp = parse_sdp(
        _sdp(
            "v=0",
            "o=- 1 1 IN IP4 h",
            "c=IN IP4 h",
            "m=audio 5000 RTP/SAVP 0",
            "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:x",
        )
    )
    assert answer(srtp, LOCAL) is None


def test_other_m_lines_are_rejected_with_port_zero_in_the_same_order() -> None:
    description = _offer(
        "0 101",
        media=("m=video 5002 RTP/AVP 31 34", "a=rtpmap:31 H261/90000", "m=audio 0 RTP/AVP 8"),
    )
    assert [m.media for m in description.media] == ["video", "audio", "audio"]
    description = replace(
        description, media=description.media + (MediaDescription("audio", 6000, "RTP/AVP", ("0",)),)
    )
    result = answer(description, LOCAL)
    assert result is not None
    lines = [(m.media, m.port, m.proto, m.formats) for m in result.description.media]
    assert lines == [
        ("video", 0, "RTP/AVP", ("31",)),
        ("audio", 0, "RTP/AVP", ("8",)),  # was already disabled
        ("audio", 40000, "RTP/AVP", ("0", "101")),  # the first usable audio stream
        ("audio", 0, "RTP/AVP", ("0",)),  # a second audio stream
    ]
    assert result.description.media[0].attributes == ()
    assert result.media.remote_port == 30000
    assert parse_sdp(serialize_sdp(result.description)) == result.description


@pytest.mark.parametrize(
    ("attribute", "ours", "remote"),
    [
        ("a=sendrecv", "sendrecv", "sendrecv"),
        ("a=sendonly", "recvonly", "sendonly"),  # the caller holds us
        ("a=recvonly", "sendonly", "recvonly"),
        ("a=inactive", "inactive", "inactive"),
    ],
)
def test_answer_mirrors_the_direction(attribute: str, ours: str, remote: str) -> None:
    result = answer(_offer("0 101", attribute), LOCAL)
    assert result is not None
    assert _audio(result.description).direction == ours
    assert (result.media.direction, result.media.remote_direction) == (ours, remote)
    assert result.media.held is (remote in ("sendonly", "inactive"))


def test_session_level_direction_and_media_level_override() -> None:
    session = answer(_offer("0", session=("a=sendonly",)), LOCAL)
    assert session is not None and session.media.direction == "recvonly"
    overridden = answer(_offer("0", "a=sendrecv", session=("a=inactive",)), LOCAL)
    assert overridden is not None and overridden.media.direction == "sendrecv"


@pytest.mark.parametrize(
    ("attribute", "ours", "remote"),
    [
        ("a=sendrecv", "recvonly", "sendonly"),
        ("a=sendonly", "recvonly", "sendonly"),
        ("a=recvonly", "inactive", "inactive"),
    ],
)
def test_rfc2543_hold_with_zero_address(attribute: str, ours: str, remote: str) -> None:
    result = answer(_offer("0", attribute, address="0.0.0.0"), LOCAL)
    assert result is not None
    assert (result.media.direction, result.media.remote_direction) == (ours, remote)
    assert result.media.held and not result.media.sends


def test_our_own_hold_limits_the_answer() -> None:
    result = answer(_offer("0"), replace(LOCAL, direction="sendonly"))
    assert result is not None and result.media.direction == "sendonly" and result.media.sends
    assert not result.media.receives
    both = answer(_offer("0", "a=sendonly"), replace(LOCAL, direction="sendonly"))
    assert both is not None and both.media.direction == "inactive"


def test_reinvite_answers_bump_the_version_only_on_change() -> None:
    first = answer(_offer("0 101"), LOCAL)
    assert first is not None
    refresh = answer(_offer("0 101"), LOCAL, previous=first.description)
    assert refresh is not None and refresh.description.origin.version == 0
    hold = answer(_offer("0 101", "a=sendonly"), LOCAL, previous=refresh.description)
    assert hold is not None and hold.description.origin.version == 1
    resume = answer(_offer("0 101", "a=sendrecv"), LOCAL, previous=hold.description)
    assert resume is not None and resume.description.origin.version == 2


# --- hold state -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attributes", "address", "state"),
    [
        ((), "198.51.100.5", "sendrecv"),
        (("a=sendonly",), "198.51.100.5", "sendonly"),
        (("a=recvonly",), "198.51.100.5", "recvonly"),
        (("a=inactive",), "198.51.100.5", "inactive"),
        ((), "0.0.0.0", "sendonly"),
        (("a=recvonly",), "0.0.0.0", "inactive"),
    ],
)
def test_hold_state(attributes: tuple[str, ...], address: str, state: str) -> None:
    description = _offer("0", *attributes, address=address)
    assert hold_state(description) == state
    assert is_held(description) is (state in ("sendonly", "inactive"))


def test_hold_state_of_a_disabled_or_missing_stream_and_ipv6_zero() -> None:
    assert hold_state(_offer("0", port=0)) == "inactive"
    assert hold_state(parse_sdp(_sdp("v=0", "o=- 1 1 IN IP4 h"))) == "inactive"
    six = parse_sdp(_sdp("v=0", "o=- 1 1 IN IP6 ::1", "c=IN IP6 ::", "m=audio 1 RTP/AVP 0"))
    assert hold_state(six) == "sendonly"


def test_hold_then_resume_sequence() -> None:
    states = [is_held(_offer("0", a)) for a in ("a=sendrecv", "a=sendonly", "a=inactive", "a=sendrecv")]
    assert states == [False, True, True, False]


# --- we offer: INVITE without SDP, answer in the ACK ----------------------------------------------------------


def _their_answer(*lines: str, formats: str = "8 101", port: int = 31000) -> SessionDescription:
    return parse_sdp(
        _sdp(
            "v=0",
            "o=carrier 5 5 IN IP4 198.51.100.9",
            "s=-",
            "c=IN IP4 198.51.100.9",
            "t=0 0",
            f"m=audio {port} RTP/AVP {formats}",
            "a=rtpmap:101 telephone-event/8000",
            *lines,
        )
    )


def test_no_sdp_in_invite_we_offer_and_read_the_answer() -> None:
    ours = offer(LOCAL)
    media = accept_answer(ours, _their_answer())
    assert media == NegotiatedMedia(
        codec="PCMA",
        payload_type=8,
        telephone_event=101,
        remote_address="198.51.100.9",
        remote_port=31000,
        direction="sendrecv",
        remote_direction="sendrecv",
    )


def test_the_answers_telephone_event_pt_is_used_towards_it() -> None:
    answer_sdp = parse_sdp(
        _sdp(
            "v=0",
            "o=- 5 5 IN IP4 h",
            "c=IN IP4 192.0.2.1",
            "m=audio 31000 RTP/AVP 0 100",
            "a=rtpmap:100 telephone-event/8000",
        )
    )
    media = accept_answer(offer(LOCAL), answer_sdp)
    assert media is not None and media.telephone_event == 100 and media.codec == "PCMU"


def test_unusable_answers() -> None:
    ours = offer(LOCAL)
    assert accept_answer(ours, _their_answer(port=0)) is None  # audio rejected
    assert accept_answer(ours, _their_answer(formats="18")) is None  # a codec we did not offer
    two = replace(_their_answer(), media=_their_answer().media * 2)
    assert accept_answer(ours, two) is None  # m= lines do not match


def test_answer_direction_limits_ours() -> None:
    media = accept_answer(offer(LOCAL), _their_answer("a=recvonly"))
    assert media is not None and media.direction == "sendonly" and not media.held
    assert media.sends and not media.receives


def test_negotiate_is_symmetric_in_roles() -> None:
    their_offer = _offer("8 0 101")
    result = answer(their_offer, LOCAL)
    assert result is not None
    assert negotiate(result.description, their_offer) == result.media
    assert negotiate(offer(LOCAL), _their_answer(formats="0")) is not None
    assert negotiate(offer(LOCAL), parse_sdp(_sdp("v=0", "o=- 1 1 IN IP4 h"))) is None


@pytest.mark.parametrize(
    "line",
    [
        "o=- " + "9" * 5000 + " 1 IN IP4 h",
        "t=" + "9" * 5000 + " 0",
        "m=audio " + "9" * 5000 + " RTP/AVP 0",
        "m=audio 1 RTP/AVP " + "9" * 5000,
        "m=audio 1/² RTP/AVP 0",
        "m=audio 1 RTP/AVP ²",
    ],
)
def test_huge_and_odd_numbers_are_sdp_errors(line: str) -> None:
    origin = line if line.startswith("o=") else "o=- 1 1 IN IP4 h"
    rest = [] if line.startswith("o=") else [line]
    with pytest.raises(SdpError):
        parse_sdp(_sdp("v=0", origin, "c=IN IP4 h", *rest))


def test_odd_rtpmap_numbers_are_ignored_not_fatal() -> None:
    description = parse_sdp(
        _sdp(
            "v=0",
            "o=- 1 1 IN IP4 h",
            "c=IN IP4 192.0.2.1",
            "m=audio 1 RTP/AVP 0 96",
            "a=rtpmap:96 PCMA/²",
            "a=rtpmap:²",
        )
    )
    assert list(description.media[0].codecs()) == [0]
    result = answer(description, LOCAL)
    assert result is not None and result.media.codec == "PCMU"
