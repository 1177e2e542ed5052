"""Symmetric RTP source policy: the signalled address, NAT latching, re-latching on a new SSRC after silence."""

from rtp.latch import SourceLatch

MS = 1_000_000
SDP = ("192.0.2.10", 4000)
NATTED = ("198.51.100.7", 31000)
OTHER = ("203.0.113.9", 5000)


def test_without_nat_only_the_signalled_address_is_accepted() -> None:
    latch = SourceLatch(SDP, nat=False)
    assert latch.accept(SDP, 1, 0)
    assert not latch.accept(NATTED, 1, MS)
    assert not latch.accept((SDP[0], SDP[1] + 2), 1, 2 * MS)  # same host, other port
    assert latch.refused == 2 and latch.destination == SDP
    # not even after a long silence and a new SSRC
    assert not latch.accept(OTHER, 2, 10_000 * MS)


def test_nat_mode_latches_to_the_first_source_and_sends_there() -> None:
    latch = SourceLatch(SDP, nat=True)
    assert latch.destination == SDP  # nothing received yet: the SDP address
    assert latch.accept(NATTED, 7, 0)
    assert latch.latched == NATTED and latch.destination == NATTED
    assert latch.accept(NATTED, 7, 20 * MS)
    assert not latch.accept(OTHER, 8, 40 * MS)  # a live stream is not taken over
    assert not latch.accept(SDP, 7, 60 * MS)
    assert latch.refused == 2


def test_nat_mode_relatches_only_on_a_new_ssrc_after_silence() -> None:
    latch = SourceLatch(SDP, nat=True, relatch_after_ms=1000)
    latch.accept(NATTED, 7, 0)
    assert not latch.accept(OTHER, 7, 5_000 * MS)  # same SSRC from elsewhere: refused even after silence
    assert not latch.accept(OTHER, 8, 999 * MS)  # new SSRC but the latched source was heard < 1 s ago
    assert latch.accept(OTHER, 8, 1_000 * MS)  # new SSRC, 1 s of silence: a new media server
    assert latch.latched == OTHER and latch.relatches == 1
    assert not latch.accept(NATTED, 7, 1_010 * MS)


def test_resignalling_starts_over() -> None:
    latch = SourceLatch(SDP, nat=False)
    latch.accept(SDP, 1, 0)
    latch.signal(OTHER)
    assert not latch.accept(SDP, 1, MS) and latch.accept(OTHER, 1, 2 * MS) and latch.destination == OTHER


def test_rtcp_is_taken_from_the_media_host() -> None:
    latch = SourceLatch(SDP, nat=True)
    latch.accept(NATTED, 1, 0)
    assert latch.accept_rtcp((NATTED[0], NATTED[1] + 1))
    assert not latch.accept_rtcp(OTHER)
