"""sip.core.sdes and sip.core.offer_answer with SRTP: RFC 4568 a=crypto parse/serialise and SDES offer/answer (RTP/SAVP, RTP/SAVPF, best-effort
RTP/AVP + a=crypto), the off / optional / required policy."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sip.core.offer_answer import LocalMedia, accept_answer, answer, negotiate, offer
from sip.core.sdes import (
    DEFAULT_CRYPTO_SUITES,
    SRTP_KEY_LENGTHS,
    CryptoAttribute,
    CryptoKey,
    SrtpPolicy,
    parse_crypto,
)
from sip.core.sdp import MediaDescription, SessionDescription, parse_sdp, serialize_sdp

THEIR_80 = bytes(range(30))
THEIR_32 = bytes(range(100, 130))
B64_80 = base64.b64encode(THEIR_80).decode()
B64_32 = base64.b64encode(THEIR_32).decode()


def counting_keys() -> Callable[[int], bytes]:
    """A key source that hands out distinct, predictable keys: 0x01..., 0x02..., ..."""
    counter = itertools.count(1)
    return lambda n: bytes([next(counter)]) * n


def local(
    srtp: SrtpPolicy = "optional",
    crypto_suites: tuple[str, ...] = DEFAULT_CRYPTO_SUITES,
    key_source: Callable[[int], bytes] | None = None,
) -> LocalMedia:
    return LocalMedia(
        "192.0.2.10",
        40000,
        session_id=77,
        srtp=srtp,
        crypto_suites=crypto_suites,
        key_source=key_source or counting_keys(),
    )


def remote(proto: str = "RTP/SAVP", *crypto: str, port: int = 30000) -> SessionDescription:
    lines = [
        "v=0",
        "o=carrier 1000 1 IN IP4 198.51.100.5",
        "s=call",
        "c=IN IP4 198.51.100.5",
        "t=0 0",
        f"m=audio {port} {proto} 0 8 101",
        "a=rtpmap:101 telephone-event/8000",
        *(f"a=crypto:{c}" for c in crypto),
    ]
    return parse_sdp(("\r\n".join(lines) + "\r\n").encode())


def audio(description: SessionDescription) -> MediaDescription:
    return description.media[0]


# --- a=crypto ---------------------------------------------------------------------------------------------------


def test_parse_crypto_plain_line() -> None:
    c = parse_crypto(f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}")
    assert c == CryptoAttribute(1, "AES_CM_128_HMAC_SHA1_80", (CryptoKey(THEIR_80),))
    assert c.key == THEIR_80 and c.usable


def test_parse_crypto_lifetime_mki_and_session_params() -> None:
    c = parse_crypto(f"7 AES_CM_128_HMAC_SHA1_32 inline:{B64_32}|2^20|1:4 KDR=1 WSH=64")
    assert c is not None
    assert (c.tag, c.suite, c.keys[0].lifetime, c.keys[0].mki) == (
        7,
        "AES_CM_128_HMAC_SHA1_32",
        1 << 20,
        (1, 4),
    )
    assert c.session_params == ("KDR=1", "WSH=64")
    assert not c.usable  # an MKI and a key derivation rate: pylibsrtp can do neither
    decimal = parse_crypto(f"2 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}|1048576")
    assert decimal is not None and decimal.usable  # a lifetime is tolerated
    assert decimal.keys[0].lifetime == 1 << 20


@pytest.mark.parametrize(
    "value",
    [
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}",
        f"2 AES_CM_128_HMAC_SHA1_32 inline:{B64_32}|2^31",
        f"3 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}|2^20|1:4;inline:{B64_32}|2^20|2:4",
        f"9 AES_CM_128_HMAC_SHA1_80 inline:{B64_80} WSH=128",
        f"4 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}|1000",
    ],
)
def test_crypto_round_trips(value: str) -> None:
    c = parse_crypto(value)
    assert c is not None
    assert str(c) == value
    assert parse_crypto(str(c)) == c


@pytest.mark.parametrize(
    "value",
    [
        "",
        "1 AES_CM_128_HMAC_SHA1_80",
        f"x AES_CM_128_HMAC_SHA1_80 inline:{B64_80}",
        f"1234567890 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}",  # tag is 1*9DIGIT
        f"1 AES_CM_128_HMAC_SHA1_80 uri:{B64_80}",
        "1 AES_CM_128_HMAC_SHA1_80 inline:not*base64!",
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}|2^99",
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}|1:4|2^20",  # lifetime after MKI
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}|1:0",
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}|0",
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}|a|b|c",
        f"1 AES-CM inline:{B64_80}",
    ],
)
def test_malformed_crypto_is_none(value: str) -> None:
    assert parse_crypto(value) is None


def test_usable_needs_a_known_suite_and_the_right_key_length() -> None:
    assert not parse_crypto(f"1 F8_128_HMAC_SHA1_80 inline:{B64_80}").usable  # type: ignore[union-attr]
    short = base64.b64encode(bytes(29)).decode()
    assert not parse_crypto(f"1 AES_CM_128_HMAC_SHA1_80 inline:{short}").usable  # type: ignore[union-attr]
    gcm = base64.b64encode(bytes(28)).decode()
    assert parse_crypto(f"1 AEAD_AES_128_GCM inline:{gcm}").usable  # type: ignore[union-attr]


@given(st.text(max_size=200))
def test_parse_crypto_never_raises(text: str) -> None:
    result = parse_crypto(text)
    assert result is None or isinstance(result, CryptoAttribute)


def test_malformed_crypto_lines_do_not_break_the_description() -> None:
    description = remote("RTP/SAVP", "garbage", f"5 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}")
    assert [c.tag for c in audio(description).crypto()] == [5]


def test_key_lengths_agree_with_rtp_srtp() -> None:
    from rtp.srtp import SUITES

    assert {name: s.key_salt_length for name, s in SUITES.items()} == SRTP_KEY_LENGTHS


# --- answering --------------------------------------------------------------------------------------------------


def test_savp_offer_answered_with_first_supported_suite_in_offer_order() -> None:
    offered = remote(
        "RTP/SAVP",
        f"1 F8_128_HMAC_SHA1_80 inline:{B64_80}",
        f"2 AES_CM_128_HMAC_SHA1_32 inline:{B64_32}",
        f"3 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}",
    )
    result = answer(offered, local())
    assert result is not None
    section = audio(result.description)
    assert section.proto == "RTP/SAVP"
    (line,) = section.crypto()
    assert (line.tag, line.suite) == (2, "AES_CM_128_HMAC_SHA1_32")  # the offer's order, not ours
    assert line.key == b"\x01" * 30  # our own key from the injected source, never theirs
    assert result.media.srtp is not None and result.media.secure
    assert (result.media.srtp.suite, result.media.srtp.tag) == ("AES_CM_128_HMAC_SHA1_32", 2)
    assert result.media.srtp.local_key == b"\x01" * 30
    assert result.media.srtp.remote_key == THEIR_32
    assert parse_sdp(serialize_sdp(result.description)) == result.description


def test_our_suite_list_limits_the_choice() -> None:
    offered = remote(
        "RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_32 inline:{B64_32}", f"2 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"
    )
    result = answer(offered, local(crypto_suites=("AES_CM_128_HMAC_SHA1_80",)))
    assert result is not None and result.media.srtp is not None
    assert (result.media.srtp.tag, result.media.srtp.remote_key) == (2, THEIR_80)


def test_unusable_lines_are_skipped_and_none_left_means_no_stream() -> None:
    mki_only = remote("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}|2^20|1:4")
    assert answer(mki_only, local()) is None  # -> 488
    kdr = remote(
        "RTP/SAVP",
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80} KDR=2",
        f"2 AES_CM_128_HMAC_SHA1_80 inline:{B64_80} WSH=64",
    )
    result = answer(kdr, local())
    assert result is not None and result.media.srtp is not None and result.media.srtp.tag == 2


def test_savpf_is_tolerated() -> None:
    result = answer(remote("RTP/SAVPF", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"), local())
    assert result is not None
    assert audio(result.description).proto == "RTP/SAVPF" and result.media.secure


def test_gcm_when_we_list_it() -> None:
    gcm_key = bytes(range(28))
    gcm = f"1 AEAD_AES_128_GCM inline:{base64.b64encode(gcm_key).decode()}"
    assert answer(remote("RTP/SAVP", gcm), local()) is None  # not in the default suites
    result = answer(remote("RTP/SAVP", gcm), local(crypto_suites=("AEAD_AES_128_GCM",)))
    assert result is not None and result.media.srtp is not None
    assert result.media.srtp.remote_key == gcm_key and len(result.media.srtp.local_key) == 28


def test_off_rejects_savp_and_ignores_crypto_in_avp() -> None:
    assert answer(remote("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"), local("off")) is None
    result = answer(remote("RTP/AVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"), local("off"))
    assert result is not None
    assert audio(result.description).crypto() == () and not result.media.secure
    assert LocalMedia("h", 1, 1).srtp == "off"  # the default is today's behaviour


def test_optional_answers_what_is_offered() -> None:
    plain = answer(remote("RTP/AVP"), local("optional"))
    assert plain is not None and not plain.media.secure and audio(plain.description).proto == "RTP/AVP"
    best_effort = answer(remote("RTP/AVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"), local("optional"))
    assert best_effort is not None and best_effort.media.secure  # baresip's mediaenc=srtp
    assert audio(best_effort.description).proto == "RTP/AVP"


def test_required_refuses_plain_rtp() -> None:
    assert answer(remote("RTP/AVP"), local("required")) is None  # -> 488
    result = answer(remote("RTP/AVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"), local("required"))
    assert result is not None and result.media.secure
    result = answer(remote("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"), local("required"))
    assert result is not None and result.media.secure


def test_fresh_key_per_call() -> None:
    offered = remote("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}")
    ours = local()
    first, second = answer(offered, ours), answer(offered, ours)
    assert first is not None and second is not None
    assert first.media.srtp is not None and second.media.srtp is not None
    assert first.media.srtp.local_key != second.media.srtp.local_key


def test_reanswer_keeps_our_key_and_takes_their_new_one() -> None:
    ours = local()
    first = answer(remote("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"), ours)
    assert first is not None and first.media.srtp is not None
    same = answer(remote("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"), ours, first.description)
    assert same is not None and same.description == first.description  # o= version unchanged too
    new_key = bytes(range(50, 80))
    rekey = remote("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(new_key).decode()}")
    again = answer(rekey, ours, first.description)
    assert again is not None and again.media.srtp is not None
    assert again.media.srtp.local_key == first.media.srtp.local_key
    assert again.media.srtp.remote_key == new_key


def test_bad_key_source_is_our_bug() -> None:
    with pytest.raises(ValueError, match="key_source"):
        answer(
            remote("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"), local(key_source=lambda n: b"x")
        )


# --- offering, and reading the answer ---------------------------------------------------------------------------


def test_offers_per_policy() -> None:
    plain = offer(local("off"))
    assert audio(plain).proto == "RTP/AVP" and audio(plain).crypto() == ()
    best_effort = offer(local("optional"))
    assert audio(best_effort).proto == "RTP/AVP"
    lines = audio(best_effort).crypto()
    assert [(c.tag, c.suite) for c in lines] == [
        (1, "AES_CM_128_HMAC_SHA1_80"),
        (2, "AES_CM_128_HMAC_SHA1_32"),
    ]
    assert lines[0].key != lines[1].key  # one key per line
    assert audio(offer(local("required"))).proto == "RTP/SAVP"
    with pytest.raises(ValueError, match="crypto_suites"):
        offer(local(crypto_suites=("F8_128_HMAC_SHA1_80",)))


def test_reoffer_keeps_our_keys() -> None:
    ours = local("required")
    first = offer(ours)
    assert offer(ours, first) == first  # nothing changed: same keys, same o= version


def test_accept_answer_matches_the_tag() -> None:
    ours = offer(local("required"))
    our_32 = audio(ours).crypto()[1]
    their = remote("RTP/SAVP", f"2 AES_CM_128_HMAC_SHA1_32 inline:{B64_32}")
    media = accept_answer(ours, their)
    assert media is not None and media.srtp is not None
    assert (media.srtp.tag, media.srtp.local_key, media.srtp.remote_key) == (2, our_32.key, THEIR_32)
    wrong_tag = remote("RTP/SAVP", f"9 AES_CM_128_HMAC_SHA1_32 inline:{B64_32}")
    assert accept_answer(ours, wrong_tag) is None
    wrong_suite = remote("RTP/SAVP", f"2 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}")
    assert accept_answer(ours, wrong_suite) is None
    assert accept_answer(ours, remote("RTP/SAVP")) is None


def test_best_effort_offer_falls_back_to_plain_when_declined() -> None:
    ours = offer(local("optional"))
    media = accept_answer(ours, remote("RTP/AVP"))
    assert media is not None and not media.secure
    secured = accept_answer(ours, remote("RTP/AVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_80}"))
    assert secured is not None and secured.srtp is not None and secured.srtp.remote_key == THEIR_80


def test_both_sides_agree_on_the_keys() -> None:
    """The answerer's negotiate and the offerer's accept_answer see the same keys, mirrored."""
    alice = local("required", key_source=lambda n: b"\xaa" * n)
    bob = local("required", key_source=lambda n: b"\xbb" * n)
    their_offer = offer(alice)
    result = answer(their_offer, bob)
    assert result is not None and result.media.srtp is not None
    alice_view = negotiate(their_offer, result.description)
    assert alice_view is not None and alice_view.srtp is not None
    assert alice_view.srtp.local_key == result.media.srtp.remote_key == b"\xaa" * 30
    assert alice_view.srtp.remote_key == result.media.srtp.local_key == b"\xbb" * 30
