"""The limits that end a call nobody ends (rtp/limits.py), on virtual time: the hold limit, and the RTP
inactivity timeout suspended while held and counted again from the resume; then the same through the native
engine's media shell (`_CallMedia`), which compares its deadline once per slot."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from rtp.limits import NEVER, CallLimits
from rtp.units import NS_PER_S as S
from sip.core.offer_answer import NegotiatedMedia
from tests.support.native_shell import VirtualClock, _call_media


def test_a_call_held_longer_than_the_hold_limit_is_ended() -> None:
    limits = CallLimits(0, rtp_timeout_s=30, hold_timeout_s=7200)
    limits.media_changed(10 * S, silent=True)
    assert limits.deadline == 7210 * S  # the RTP timeout is suspended: only the hold limit is armed
    assert limits.check(7209 * S, last_rtp=0) is None
    assert limits.check(7210 * S, last_rtp=0) == "hold_timeout"
    assert limits.deadline == NEVER and limits.check(8000 * S, last_rtp=0) is None  # reported once


def test_the_rtp_timeout_counts_again_from_the_resume_never_the_silence_of_the_hold() -> None:
    limits = CallLimits(0, rtp_timeout_s=30, hold_timeout_s=7200)
    assert limits.check(20 * S, last_rtp=5 * S) is None and limits.deadline == 35 * S
    limits.media_changed(10 * S, silent=True)
    assert limits.check(100 * S, last_rtp=5 * S) is None  # held: no RTP expected
    limits.media_changed(200 * S, silent=False)  # resumed 195 s after the caller's last packet
    assert limits.deadline == 230 * S
    assert limits.check(200 * S + 20_000_000, last_rtp=5 * S) is None  # not ended at the resume
    assert limits.check(229 * S, last_rtp=5 * S) is None
    assert limits.check(230 * S, last_rtp=5 * S) == "rtp_timeout"  # the timeout works again after it


def test_a_packet_after_the_resume_keeps_the_call_and_a_second_hold_starts_its_own_stretch() -> None:
    limits = CallLimits(0, rtp_timeout_s=30, hold_timeout_s=100)
    limits.media_changed(10 * S, silent=True)
    limits.media_changed(90 * S, silent=False)
    assert limits.check(120 * S, last_rtp=115 * S) is None and limits.deadline == 145 * S
    limits.media_changed(130 * S, silent=True)
    assert limits.deadline == 230 * S  # 100 s from this hold, not from the first one
    assert limits.check(230 * S, last_rtp=115 * S) == "hold_timeout"


def test_a_call_that_starts_held_is_held_from_the_start_and_no_limit_is_no_deadline() -> None:
    limits = CallLimits(0, rtp_timeout_s=30, hold_timeout_s=60, silent=True)
    assert limits.held and limits.deadline == 60 * S
    off = CallLimits(0, rtp_timeout_s=30, hold_timeout_s=0, silent=True)
    assert off.deadline == NEVER and off.check(10**6 * S, last_rtp=0) is None
    capped = CallLimits(0, max_call_duration_s=3600, hold_timeout_s=7200, silent=True)
    assert capped.deadline == 3600 * S and capped.check(3600 * S, last_rtp=0) == "max_call_duration"


# --- through the native engine's media shell ---

HELD = NegotiatedMedia("PCMU", 0, 101, "127.0.0.1", 40000, "recvonly", "sendonly")
RESUMED = NegotiatedMedia("PCMU", 0, 101, "127.0.0.1", 40000, "sendrecv", "sendrecv")


def _media() -> tuple[Any, VirtualClock, list[str]]:
    clock = VirtualClock()
    media, leg = _call_media(clock)
    reached: list[str] = []
    leg.agent.limit_hangups = Counter()
    leg.agent.one_way_audio = Counter()
    leg.call = "call-1"
    leg._limit_reached = reached.append
    return media, clock, reached


async def _slot(media: Any, clock: VirtualClock, at: int) -> None:
    clock.now = at
    media.on_slots(at, 1, 0)
    await asyncio.sleep(0)  # the BYE is asked for from the loop


async def test_the_media_shell_does_not_end_a_call_at_its_resume_and_times_it_out_after() -> None:
    media, clock, reached = _media()
    t0 = clock.now
    media.set_limits(t0, None, 5.0)
    clock.now = t0 + 1 * S
    media.update(HELD)
    await _slot(media, clock, t0 + 60 * S)
    clock.now = t0 + 60 * S
    media.update(RESUMED)
    await _slot(media, clock, t0 + 60 * S + 20_000_000)
    assert reached == []  # the old shell said "no RTP for 59 s" the moment the caller came back
    await _slot(media, clock, t0 + 65 * S + 20_000_000)
    assert reached == ["rtp_timeout"]


async def test_the_media_shell_ends_a_call_held_past_the_hold_limit() -> None:
    media, clock, reached = _media()
    t0 = clock.now
    media.set_limits(t0, None, 5.0, 100.0)
    clock.now = t0 + 1 * S
    media.update(HELD)
    await _slot(media, clock, t0 + 100 * S)
    assert reached == []
    await _slot(media, clock, t0 + 101 * S)
    assert reached == ["hold_timeout"] and media._leg.agent.limit_hangups == {"hold_timeout": 1}


async def test_the_media_shell_asks_for_the_backstop_bye_on_the_engine_s_clock_the_goodbye_s_grace_later() -> (
    None
):
    media, clock, reached = _media()
    t0 = clock.now
    media.set_limits(t0, 60.0, None, None, 2.0)  # the session says the goodbye itself, 2 s of grace
    await _slot(media, clock, t0 + 60 * S)
    assert reached == ["max_call_duration"]
    await _slot(media, clock, t0 + 62 * S - 20_000_000)
    assert reached == ["max_call_duration"]
    await _slot(media, clock, t0 + 62 * S)
    assert reached == ["max_call_duration", "backstop"]
    assert media._leg.agent.limit_hangups == {"max_call_duration": 1}  # the backstop is no second limit
