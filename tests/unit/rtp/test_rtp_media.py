"""One call's media core (rtp/media.py `CallMedia`) on virtual time, without sockets: the road the native engine's
media shell takes every slot (frames in, datagrams out, the ledger after the send, the next deadline), and the
call limits' goodbye grace and backstop BYE (rtp/limits.py) as that core's deadline."""

from __future__ import annotations

import pytest

from rtp.dtmf import DtmfDigit
from rtp.g711 import alaw_encode
from rtp.jitter import fast_alaw_decode, fast_ulaw_decode
from rtp.limits import NEVER, CallLimits
from rtp.media import CallMedia, LimitReached
from rtp.packet import Drop, build, parse
from rtp.playout import OutboundFrame, Playout
from rtp.stream import PCMA, RtpStream, StreamConfig
from rtp.units import NS_PER_MS as MS
from rtp.units import NS_PER_S as S
from tests.support.media_paths import media_path

__all__ = ["media_path"]  # the fixture, from the shared harness

pytestmark = pytest.mark.usefixtures("media_path")  # on each media path (rtp.speedups)

CALLER = ("192.0.2.2", 4000)


def _media(payload_type: int = 0) -> CallMedia:
    stream = RtpStream(
        StreamConfig(
            ssrc=7, initial_seq=100, initial_timestamp=0, cname="t", remote=CALLER, payload_type=payload_type
        ),
        lambda: 0.5,
    )
    return CallMedia(stream, Playout())


def _frame(k: int, pcmu: bytes | None = None) -> OutboundFrame:
    return OutboundFrame(bytes([k]) * 320, 1, "item", 20 * k, pcmu)


def test_a_slot_hands_the_caller_frame_on_and_sends_the_playout_frame_which_the_ledger_gets_after_the_send() -> (
    None
):
    media = _media()
    voice = bytes(range(160))
    media.receive(build(0, True, 1, 0, 0xA, voice), CALLER, 0)
    media.playout.enqueue([_frame(0, pcmu=b"\x7f" * 160)])
    now = 20 * MS
    frame = media.pull_frame(now)
    assert frame is not None and frame.pcm == fast_ulaw_decode(voice) and media.frames_in == 1
    datagram = media.pull_datagram(now)
    assert datagram is not None and media.to == CALLER and media.out is not None
    packet = parse(bytes(datagram))
    assert not isinstance(packet, int) and packet.payload == b"\x7f" * 160  # PCMU passthrough, bit-exact
    assert media.playout.ledger.frames_transmitted == 0  # not before sendto returned
    media.sent(now + 40_000)
    assert media.playout.ledger.entries("item")[0].transmitted_ns == now + 40_000 and media.frames_out == 1
    assert media.out is None


def test_a_failed_send_is_counted_never_recorded_and_silence_carries_no_frame() -> None:
    media = _media(PCMA)
    media.playout.enqueue([_frame(1)])
    assert media.pull_datagram(0) is not None and media.out is not None
    media.unsent()
    assert media.frames_unsent == 1 and media.playout.ledger.frames_transmitted == 0
    silence = media.pull_datagram(20 * MS)  # nothing queued: the codec's idle pattern, no frame with it
    assert silence is not None and media.out is None and bytes(silence)[12:] == b"\xd5" * 160


def test_on_hold_the_caller_frame_is_not_handed_on_and_nothing_is_sent_but_rtp_time_goes_on() -> None:
    media = _media()
    media.receive(build(0, True, 1, 0, 0xA, bytes(160)), CALLER, 0)
    media.update(10 * MS, sends=False, receives=False, held=True, remote=CALLER)
    media.playout.enqueue([_frame(2)])
    assert media.pull_frame(20 * MS) is None and media.pull_datagram(20 * MS) is None
    assert media.playout.depth == 1 and media.frames_in == 0
    media.update(30 * MS, sends=True, receives=True, held=False, remote=CALLER)
    datagram = media.pull_datagram(40 * MS)
    assert datagram is not None
    packet = parse(bytes(datagram))
    assert not isinstance(packet, int) and packet.timestamp == 160  # the held slot's 160 samples went by


def test_a_late_clock_s_skipped_slots_are_owed_and_paid_one_a_tick() -> None:
    media = _media()
    for k in range(6):
        media.receive(build(0, k == 0, k, 160 * k, 0xA, bytes([k + 1]) * 160), CALLER, k * 20 * MS)
    media.pull_frame(0)
    media.skip(3, 70 * MS)
    assert media.owing
    paid = 0
    for tick in range(1, 6):
        now = 70 * MS + tick * 20 * MS
        media.pull_frame(now)
        if media.owing and media.pull_backlog(now) is not None:
            paid += 1
    assert paid == 3 and not media.owing and media.stream.jitter.frames_backlog == 3


def test_the_next_deadline_is_the_soonest_of_the_limits_the_arrival_window_and_rtcp() -> None:
    media = _media()
    media.set_limits(0, 3600.0, 30.0)
    assert media.next_deadline() == 30 * S  # the RTP timeout: no RTCP before the first packet either way
    media.watch_arrival(0)
    assert media.next_deadline() == 4 * S  # the one-way-audio window
    (problem,) = media.handle_timer(4 * S)
    assert not isinstance(problem, (bytes, DtmfDigit, LimitReached)) and problem.cause == "no_rtp"
    assert media.next_deadline() == 30 * S
    assert media.handle_timer(30 * S) == [LimitReached("rtp_timeout")]
    assert media.next_deadline() == NEVER


def test_the_backstop_byes_the_goodbye_s_grace_after_the_maximum_duration_once() -> None:
    limits = CallLimits(0, max_call_duration_s=60, rtp_timeout_s=30, goodbye_grace_s=6)
    assert limits.check(60 * S, last_rtp=59 * S) == "max_call_duration"
    assert limits.deadline == 66 * S  # the goodbye's grace, then the BYE all the same
    assert limits.check(65 * S, last_rtp=59 * S) is None
    assert limits.check(66 * S, last_rtp=59 * S) == "backstop"
    assert limits.deadline == NEVER and limits.check(100 * S, last_rtp=59 * S) is None
    at_once = CallLimits(
        0, max_call_duration_s=60
    )  # no goodbye asked for: the BYE at the limit, nothing after
    assert at_once.check(60 * S, last_rtp=0) == "max_call_duration" and at_once.deadline == NEVER


def test_the_media_core_reports_the_backstop_on_its_own_clock_after_a_goodbye_set_later() -> None:
    media = _media()
    media.set_limits(0, 60.0, None)
    media.limits.goodbye(2.5)  # the session asked to say goodbye itself after the media started
    assert media.handle_timer(60 * S) == [LimitReached("max_call_duration")]
    assert media.next_deadline() == 62_500 * MS
    assert media.handle_timer(62 * S) == []
    assert media.handle_timer(62_500 * MS) == [LimitReached("backstop")]
    assert media.next_deadline() == NEVER


def test_a_new_codec_in_the_calls_clock_is_sent_and_decoded_from_the_next_slot_on_the_same_source() -> None:
    # A re-INVITE answered PCMA to a PCMU call (sip.core.call): the next datagram is PCMA of the same frame the
    # provider sent as µ-law, on the same SSRC, the sequence and timestamp going on; the caller's PCMA decodes
    # and their old PCMU no longer does.
    media = _media()
    media.receive(build(0, True, 1, 0, 0xA, bytes(range(160))), CALLER, 0)
    media.playout.enqueue([_frame(3, pcmu=b"\x7f" * 160), _frame(4, pcmu=b"\x7f" * 160)])
    assert media.pull_frame(20 * MS) is not None
    before = parse(bytes(media.pull_datagram(20 * MS) or b""))
    media.sent(20 * MS)
    media.recodec(PCMA, None, 101)
    after = parse(bytes(media.pull_datagram(40 * MS) or b""))
    assert not isinstance(before, int) and not isinstance(after, int)
    assert (before.pt, before.payload) == (0, b"\x7f" * 160)
    assert after.pt == PCMA and after.payload == alaw_encode(bytes([4]) * 320)
    assert (after.ssrc, after.seq, after.timestamp) == (before.ssrc, before.seq + 1, before.timestamp + 160)
    media.sent(40 * MS)
    resets = media.stream.jitter.resets
    media.receive(
        build(0, False, 2, 160, 0xA, bytes(range(160))), CALLER, 40 * MS
    )  # the old codec, in flight
    assert media.stream.drops[Drop.UNKNOWN_PT] == 1
    voice = bytes(range(255, 95, -1))
    media.receive(build(PCMA, False, 3, 320, 0xA, voice), CALLER, 60 * MS)
    frame = media.pull_frame(80 * MS)
    assert frame is not None and frame.pcm == fast_alaw_decode(voice) and media.stream.jitter.resets == resets


def test_a_codec_change_of_the_rtp_clock_is_refused_and_changes_nothing() -> None:
    media = _media()
    with pytest.raises(ValueError):
        media.recodec(111, "OPUS", None)
    with pytest.raises(ValueError):
        media.recodec(18, None, 101)  # G.729: not a codec the stream runs
    assert (media.stream.codec, media.stream.config.payload_type) == ("PCMU", 0)
