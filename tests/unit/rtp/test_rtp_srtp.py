"""rtp.srtp: SRTP/SRTCP through pylibsrtp; failures counted, never raised; re-keying; SDES keys from sip.core.offer_answer."""

from __future__ import annotations

import base64
import struct

import pytest

from rtp.packet import build, parse
from rtp.srtp import SUITES, SrtpContext, SrtpError, suite
from sip.core.offer_answer import LocalMedia, answer, offer

A = bytes(range(1, 45))  # long enough for every suite; sliced per suite
B = bytes(range(101, 145))
RR = struct.pack("!BBHI", 0x80, 201, 1, 0xCAFE)  # an empty receiver report


def pair(name: str) -> tuple[SrtpContext, SrtpContext]:
    n = SUITES[name].key_salt_length
    return SrtpContext(name, A[:n], B[:n]), SrtpContext(name, B[:n], A[:n])


def rtp(seq: int, payload: bytes = bytes(range(160))) -> bytes:
    return build(0, seq == 0, seq, seq * 160, 0xCAFE, payload)


@pytest.mark.parametrize("name", list(SUITES))
def test_round_trip_and_the_payload_is_not_in_clear(name: str) -> None:
    alice, bob = pair(name)
    packet = rtp(1)
    wire = alice.protect(packet)
    assert len(wire) == len(packet) + SUITES[name].tag_length
    assert wire[:12] == packet[:12]  # the header is authenticated, not encrypted
    assert packet[12:] not in wire  # the payload is
    assert bob.unprotect(wire) == packet
    back = bob.protect(rtp(7))
    assert alice.unprotect(back) == rtp(7)
    assert (alice.packets_protected, bob.packets_unprotected, alice.packets_unprotected) == (1, 1, 1)


@pytest.mark.parametrize("name", list(SUITES))
def test_rtcp_round_trip(name: str) -> None:
    alice, bob = pair(name)
    wire = alice.protect_rtcp(RR)
    assert len(wire) > len(RR) and wire != RR
    assert bob.unprotect_rtcp(wire) == RR
    assert (alice.rtcp_protected, bob.rtcp_unprotected) == (1, 1)
    assert bob.unprotect_rtcp(wire) is None and bob.replays == 1  # SRTCP has its own replay index


@pytest.mark.parametrize("name", list(SUITES))
def test_tampered_packet_is_dropped_and_counted(name: str) -> None:
    alice, bob = pair(name)
    for seq, index in enumerate((12, 40, -1), 10):  # payload start, middle, tag
        wire = bytearray(alice.protect(rtp(seq)))
        wire[index] ^= 0x01
        assert bob.unprotect(bytes(wire)) is None
    assert bob.auth_failures == 3 and bob.packets_unprotected == 0
    tampered_rtcp = bytearray(alice.protect_rtcp(RR))
    tampered_rtcp[-1] ^= 0x80
    assert bob.unprotect_rtcp(bytes(tampered_rtcp)) is None
    assert bob.auth_failures == 4


def test_wrong_key_is_an_auth_failure() -> None:
    alice, _ = pair("AES_CM_128_HMAC_SHA1_80")
    stranger = SrtpContext("AES_CM_128_HMAC_SHA1_80", bytes(30), bytes(30))
    assert stranger.unprotect(alice.protect(rtp(1))) is None
    assert stranger.auth_failures == 1


def test_replay_is_dropped_and_counted() -> None:
    alice, bob = pair("AES_CM_128_HMAC_SHA1_80")
    first = alice.protect(rtp(1))
    assert bob.unprotect(first) == rtp(1)
    assert bob.unprotect(first) is None
    assert (bob.replays, bob.auth_failures) == (1, 0)
    for seq in range(2, 300):  # the 128-packet window moves past seq 1
        bob.unprotect(alice.protect(rtp(seq)))
    assert bob.unprotect(first) is None and bob.replays == 2


def test_garbage_never_raises() -> None:
    _, bob = pair("AES_CM_128_HMAC_SHA1_80")
    for junk in (b"", b"\x80", bytes(11), bytes(12), b"\x80" * 30, bytes(3000), memoryview(bytes(40))):
        assert bob.unprotect(junk) is None
        assert bob.unprotect_rtcp(junk) is None
    assert bob.packets_unprotected == 0 and bob.auth_failures + bob.errors + bob.replays == 14


def test_memoryview_from_the_stream_buffer_is_accepted() -> None:
    alice, bob = pair("AES_CM_128_HMAC_SHA1_32")
    buffer = bytearray(rtp(5))
    wire = alice.protect(memoryview(buffer))
    assert bob.unprotect(wire) == bytes(buffer)


def test_misuse_raises() -> None:
    with pytest.raises(SrtpError, match="unsupported"):
        suite("F8_128_HMAC_SHA1_80")
    with pytest.raises(SrtpError, match="30-byte"):
        SrtpContext("AES_CM_128_HMAC_SHA1_80", bytes(29), bytes(30))
    alice, _ = pair("AES_CM_128_HMAC_SHA1_80")
    with pytest.raises(SrtpError):
        alice.protect(bytes(1490))  # longer than the binding's buffer with the tag


def test_rekey_remote_only_keeps_the_outbound_context() -> None:
    alice, bob = pair("AES_CM_128_HMAC_SHA1_80")
    assert bob.unprotect(alice.protect(rtp(1))) is not None
    new_alice = SrtpContext("AES_CM_128_HMAC_SHA1_80", bytes(range(60, 90)), B[:30])
    assert bob.rekey(remote_key=bytes(range(60, 90)))
    assert not bob.rekey(remote_key=bytes(range(60, 90)))  # nothing changed
    assert bob.unprotect(alice.protect(rtp(2))) is None  # the old key no longer verifies
    assert bob.unprotect(new_alice.protect(rtp(3))) == rtp(3)
    assert alice.unprotect(bob.protect(rtp(4))) == rtp(4)  # our direction untouched
    assert bob.rekeys == 1


def test_rekey_suite_change() -> None:
    alice, bob = pair("AES_CM_128_HMAC_SHA1_80")
    assert bob.rekey(suite_name="AES_CM_128_HMAC_SHA1_32")
    alice32 = SrtpContext("AES_CM_128_HMAC_SHA1_32", A[:30], B[:30])
    assert len(alice32.protect(rtp(1))) == 172 + 4
    assert bob.unprotect(alice32.protect(rtp(2))) == rtp(2)
    with pytest.raises(SrtpError):
        bob.rekey(suite_name="AEAD_AES_128_GCM")  # a 30-byte key does not fit: nothing changed
    assert bob.suite.name == "AES_CM_128_HMAC_SHA1_32"


def test_counters_names() -> None:
    _, bob = pair("AES_CM_128_HMAC_SHA1_80")
    bob.unprotect(b"junk")
    counters = bob.counters()
    assert counters["srtp_errors"] + counters["srtp_auth_failures"] == 1
    assert set(counters) >= {"srtp_auth_failures", "srtp_replays", "srtp_packets_unprotected"}


def test_keys_from_an_sdes_exchange_interoperate() -> None:
    """sip.core.offer_answer's offer/answer feeds rtp.srtp on both sides; RTP parses after the round trip."""
    caller = LocalMedia("192.0.2.1", 4000, 1, srtp="required")
    bridge = LocalMedia("192.0.2.2", 5000, 2, srtp="required")
    their_offer = offer(caller)
    result = answer(their_offer, bridge)
    assert result is not None and result.media.srtp is not None
    keys = result.media.srtp
    ours = SrtpContext(keys.suite, keys.local_key, keys.remote_key)
    offer_line = next(c for c in their_offer.media[0].crypto() if c.tag == keys.tag)
    answer_key = result.description.media[0].crypto()[0].key
    assert base64.b64encode(answer_key) and answer_key == keys.local_key
    theirs = SrtpContext(keys.suite, offer_line.key, answer_key)
    packet = rtp(42)
    got = theirs.unprotect(ours.protect(packet))
    assert got is not None
    parsed = parse(got)
    assert not isinstance(parsed, int) and parsed.seq == 42
    assert ours.unprotect(theirs.protect(rtp(43))) == rtp(43)
