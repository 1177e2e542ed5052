"""S7 on virtual time: hold and ringing are not media conditions.

On hold the carrier takes no frames and brings none; an outbound call's line takes none until the callee
answers. Before S7 the reservoir filled meanwhile and `output_overflow`/`output_stale` (or the silence
watchdog) started a paid recovery whose replacement greeted the returning caller with "there was an audio
problem, please repeat"; an outbound greeting was spoken into the ringing line. The coordinator is driven as
in tests/support/session_engine.py (`Call`: a real Playout, the media clock played by the test; `advance`: time passes
with no media clock, as on hold or while ringing); the last tests drive the shell with the leg's events.
"""

from __future__ import annotations

import asyncio

import pytest

from bridge.engine.commands import (
    AudioDiscontinuity,
    BargedIn,
    CancelResponse,
    ConditionDetected,
    EndSession,
    OpenReplacement,
    RecoveryChanged,
    Truncate,
)
from bridge.engine.delegations import DeliverResult, DispatchJob, SendContext
from bridge.engine.reservoir import GenerationReservoir, OutputStale
from providers.base import Capabilities
from providers.events import (
    AudioReceived,
    SessionClosed,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
)
from providers.limits import GEMINI_LIVE, GPT_LIVE, OPENAI_REALTIME, AudioLimits, LimitProfile
from rtp.audio import PCMU_8K
from rtp.g711 import ulaw_decode
from sip.leg import CallEnded, MediaHeld, MediaResumed, MediaStarted
from tests.support import virtual_time
from tests.support.recovery import GEMINI, answer, commands_of, recovery_notices
from tests.support.rollover_session import RolloverCall
from tests.support.seams_hold import DialledFakeLeg, TextProvider, wait_for
from tests.support.session import FakeLeg, FakeProvider, session
from tests.support.session_engine import GPT_LIVE_CAPS, MS, REALTIME, TICK, Call, pcmu_tone, speech_frame

event_loop_policy = virtual_time.policy_fixture()  # the shell tests run on virtual time

# (provider, its capabilities, its limits profile, the item id its audio names: GPT-Live and Gemini name none)
PROFILES = [
    pytest.param(GPT_LIVE_CAPS, GPT_LIVE, None, id="gpt_live"),
    pytest.param(GEMINI, GEMINI_LIVE, None, id="gemini"),
    pytest.param(REALTIME, OPENAI_REALTIME, "item_a", id="realtime"),
]


def speaking_call(caps: Capabilities, profile: LimitProfile, item: str | None) -> Call:
    """The assistant is 200 ms into a 1.5 s answer: ten frames left for the caller, the rest still waits."""
    call = Call(caps=caps, limits=profile.for_format(PCMU_8K))
    call.provider(AudioReceived(1, pcmu_tone(1_500), PCMU_8K, item))
    call.tick(count=10)
    return call


def hold(call: Call) -> None:
    """The leg's MediaHeld (the shell calls the core the same way)."""
    call.core.hold(call.now)
    call._drain()


def resume(call: Call) -> None:
    call.core.resume(call.now)
    call._drain()


def no_recovery(call: Call) -> bool:
    return (
        recovery_notices(call) == []
        and not [n for n in call.notices if isinstance(n, ConditionDetected)]
        and not [c for c in call.commands if isinstance(c, OpenReplacement)]
        and call.core.status(call.now)["output_recovery"] is None
        and not call.core.ending.ended
    )


@pytest.mark.parametrize(("caps", "profile", "item"), PROFILES)
def test_s7_hold_while_the_assistant_speaks_starts_no_recovery_stops_at_what_was_heard_and_resumes_without_an_apology(
    caps: Capabilities, profile: LimitProfile, item: str | None
) -> None:
    call = speaking_call(caps, profile, item)
    heard_ms = call.playout.ledger.transmitted_ms(item or "out-1")
    assert heard_ms == 200
    hold(call)
    assert call.core.status(call.now)["line"] == "held"
    # The assistant stops at what the caller heard, as a barge-in does: told to the provider where it can be.
    [cut] = [n for n in call.notices if isinstance(n, BargedIn)]
    assert cut.source == "hold" and cut.heard == ((item or "out-1", 200),) and cut.cleared_ms > 0
    assert commands_of(call, CancelResponse) == [CancelResponse(1)]
    assert commands_of(call, Truncate) == ([Truncate(item, 200)] if caps.truncate else [])
    assert call.playout.depth == 0 and call.core.output.reservoir.depth_bytes == 0
    # Held for a minute: the provider finishes its answer in one burst beyond the capacity, then goes on at
    # its own pace (GPT-Live's), and no media clock runs. Before S7: an overflow, then staleness, a recovery.
    burst = profile.capacity_ms + 2_000
    call.provider(AudioReceived(1, pcmu_tone(burst), PCMU_8K, item))
    for _ in range(600):
        call.advance(100)
        call.provider(AudioReceived(1, pcmu_tone(100), PCMU_8K, "item_b" if item else None))
    assert no_recovery(call)
    assert call.core.hold_dropped_bytes == (burst + 60_000) * 8  # not stored: dropped and counted
    assert call.core.output.reservoir.overflows == 0 and call.core.output.reservoir.stales == 0
    resume(call)
    assert call.core.status(call.now)["line"] == "up"
    # What the caller never heard is truncated at 0 ms where the provider takes truncations.
    assert commands_of(call, Truncate) == ([Truncate("item_b", 0)] if caps.truncate else [])
    sent = len(call.sent)
    call.tick(count=50)
    assert len(call.sent) == sent  # nothing of the cut answer plays after the hold
    # The conversation goes on on the same connection: no replacement, no notice, no apology.
    answer_audio = pcmu_tone(400, freq=600)
    call.provider(AudioReceived(1, answer_audio, PCMU_8K, "item_c" if item else None))
    call.tick(count=25)
    assert b"".join(f.pcm for f in call.sent[sent:]) == ulaw_decode(answer_audio)
    assert no_recovery(call) and call.core.token == 1


def test_s7_the_silence_watchdog_does_not_fire_while_held_and_is_armed_again_after_the_resume() -> None:
    call = Call(caps=GEMINI, limits=GEMINI_LIVE.for_format(PCMU_8K))
    call.tick(speech_frame(), count=50)
    call.tick(count=25)  # the caller stopped ("hold on, let me check"): the watchdog is armed
    hold(call)
    call.advance(30_000)  # the provider owes no answer to a line that hears nothing
    assert no_recovery(call)
    resume(call)
    call.tick(speech_frame(), count=50)
    call.tick(count=25)
    call.advance(6_500)  # a provider silent after a turn after the resume is still found
    assert recovery_notices(call) == ["reconnecting"]
    assert call.core.status(call.now)["output_recovery"]["cause"] == "provider_silent"


def test_s7_a_result_answered_during_the_hold_is_delivered_after_the_resume() -> None:
    call = Call()
    call.provider(ToolCallRequested(1, "call_1", "find_booking", '{"ref": "AB12"}'))
    [dispatch] = commands_of(call, DispatchJob)
    hold(call)
    assert answer(call, dispatch.request.job_id, '{"status": "found"}')
    assert commands_of(call, DeliverResult) == []  # spoken into the hold, nobody would hear it
    assert call.core.push_update("Your taxi is booked.", speak=True, now=call.now)
    call._drain()
    assert commands_of(call, SendContext) == []
    call.advance(20_000)
    resume(call)
    assert commands_of(call, DeliverResult) == [
        DeliverResult(1, "call_1", "find_booking", '{"status": "found"}')
    ]
    assert commands_of(call, SendContext) == [SendContext(1, "Your taxi is booked.", True)]
    assert no_recovery(call)


def test_s7_a_recovery_under_way_when_the_hold_begins_finishes_or_fails_within_its_budget() -> None:
    repaired = Call()
    repaired.provider(SessionClosed(1, "connection lost", False))  # a fault of its own, before the hold
    hold(repaired)
    repaired.advance(1_000)
    repaired.provider(SessionStarted(2, "sess_2", None))
    repaired.advance(60_000)  # the replacement is up; the caller is still holding
    assert recovery_notices(repaired) == ["reconnecting", "awaiting_user"] and not repaired.core.ending.ended
    resume(repaired)
    repaired.provider(SpeechStarted(2, 100))
    repaired.provider(SpeechStopped(2, 900))
    assert recovery_notices(repaired) == ["reconnecting", "awaiting_user", "done"]
    failed = Call()
    failed.provider(SessionClosed(1, "connection lost", False))
    hold(failed)
    failed.advance(5_000)  # HR5: the hold does not stretch the budget
    assert recovery_notices(failed) == ["reconnecting", "failed"]
    assert [c.failed for c in failed.commands if isinstance(c, EndSession)] == [True]


def test_s7_a_hang_up_while_held_ends_the_session_without_a_recovery() -> None:
    call = speaking_call(REALTIME, OPENAI_REALTIME, "item_a")
    hold(call)
    call.core.call_ended(call.now)
    call.advance(5_000)
    assert call.core.finished(call.now) and no_recovery(call)


def test_s7_rollovers_during_the_hold_hand_the_floor_over_without_a_recovery() -> None:
    call = RolloverCall()  # connections capped at 8 s
    call.talk_until_a_rollover_opens()
    call.core.provider_event(AudioReceived(1, pcmu_tone(5_000), PCMU_8K, "item_old"), call.now)
    call.step(False, 10)  # 200 ms of the old connection's answer heard
    call.core.hold(call.now)
    call._carry_out()
    assert commands_of(call, CancelResponse) == [CancelResponse(1)]
    assert commands_of(call, Truncate) == [Truncate("item_old", 200)]
    for _ in range(1_000):  # 20 s on hold: no media clock, no caller frames; the rollover timeline goes on
        call.now += TICK
        if (due := call.core.next_deadline()) is not None and due <= call.now:
            call.core.handle_timer(call.now)
        call._carry_out()
    floor = call.core.token
    assert floor != 1 and call.open == {floor}  # the old connection drained (its output was cut) and closed
    assert not [n for n in call.notices if isinstance(n, RecoveryChanged)]
    assert not [c for c in call.commands if isinstance(c, OpenReplacement)]
    call.core.resume(call.now)
    call._carry_out()
    assert commands_of(call, Truncate) == []  # (the old connection's items are not the new floor's)
    call.core.provider_event(AudioReceived(floor, pcmu_tone(400), PCMU_8K, "item_new"), call.now)
    call.step(False, 30)
    assert (
        call.playout.ledger.transmitted_ms("item_new") == 400
        and call.playout.ledger.transmitted_ms("item_old") == 200
    )


def test_s7_the_outbound_greeting_waits_for_the_answer_and_ringing_starts_no_recovery() -> None:
    call = Call(caps=GPT_LIVE_CAPS, limits=GPT_LIVE.for_format(PCMU_8K))
    call.core.ring(call.now)
    assert call.core.status(call.now)["line"] == "ringing"
    assert call.core.push_update("Greet the callee.", speak=True, now=call.now)  # the provider is up
    call._drain()
    assert commands_of(call, SendContext) == []  # before S7: spoken into the ringing line
    spoken = pcmu_tone(3_000)  # a model that speaks unprompted: more than GPT-Live's 2 s capacity
    for at in range(0, len(spoken), 800):  # GPT-Live paces it: 100 ms at a time
        call.provider(AudioReceived(1, spoken[at : at + 800], PCMU_8K))
    call.advance(20_000)  # the phone rings on, nothing plays (no media clock); residence is 3 s
    assert no_recovery(call) and call.sent == []
    call.core.answered(call.now)
    call._drain()
    assert commands_of(call, SendContext) == [SendContext(1, "Greet the callee.", True)]
    [dropped] = [n for n in call.notices if isinstance(n, AudioDiscontinuity)]
    assert (dropped.direction, dropped.cause, dropped.amount) == ("output", "ringing", 8_000)
    call.tick(count=100)
    assert b"".join(f.pcm for f in call.sent) == ulaw_decode(spoken[:16_000])  # from its start, once
    assert no_recovery(call)


def test_s7_the_reservoir_s_residence_clocks_stop_while_paused_and_filling_it_is_no_overflow() -> None:
    reservoir = GenerationReservoir(AudioLimits(16_000, 3_000), PCMU_8K)
    reservoir.push(b"\xff" * 800, 0, "a")
    reservoir.pause(1_000 * MS)  # held 1 s after the audio came
    assert reservoir.check(60_000 * MS) is None and reservoir.next_deadline() is None
    assert reservoir.oldest_age_ms(60_000 * MS) == 1_000
    assert reservoir.push(b"\xff" * 16_000, 60_000 * MS, "a") is None  # beyond the capacity: dropped
    assert reservoir.overflows == 0 and reservoir.paused_dropped_bytes == 16_000
    assert reservoir.resume(61_000 * MS) == 16_000
    assert reservoir.oldest_age_ms(61_000 * MS) == 1_000  # its age goes on from where it stopped
    assert reservoir.check(63_000 * MS) is None
    stale = reservoir.check(63_001 * MS)
    assert isinstance(stale, OutputStale) and stale.age_ms == 3_001


# --- the shell: the leg's media events reach the core -------------------------------------------------------


async def test_s7_the_shell_holds_and_resumes_the_call_on_the_leg_s_media_events() -> None:
    leg, provider = FakeLeg(), FakeProvider()
    call = session(leg, provider)
    task = asyncio.create_task(call.run())
    leg.queue.put_nowait(MediaStarted("PCMU/8000"))
    await wait_for(lambda: call.coordinator is not None)
    leg.queue.put_nowait(MediaHeld())  # the engine stops taking frames: nothing pulls the playout here
    provider.queue.put_nowait(AudioReceived(1, pcmu_tone(2_500), PCMU_8K, "item_a"))  # > 2 s capacity
    await asyncio.sleep(30)
    core = call.coordinator
    assert core is not None and core.on_hold and leg.hangups == []
    assert call.status()["recoveries"]["by_cause"] == {} and call.status()["output_recovery"] is None
    leg.queue.put_nowait(MediaResumed())
    await wait_for(lambda: not core.on_hold)
    assert call.status()["line"] == "up"
    leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))
    assert (await asyncio.wait_for(task, 5)).ended_by == "caller"


async def test_s7_the_shell_holds_an_outbound_greeting_until_the_callee_answers() -> None:
    leg, provider = DialledFakeLeg(), TextProvider()
    call = session(leg, provider)
    task = asyncio.create_task(call.run())
    await wait_for(lambda: call.coordinator is not None)
    assert call.push_update("Greet the callee.")
    await asyncio.sleep(TICK * 50 / 1e9)
    assert provider.texts == [] and call.status()["line"] == "ringing"
    leg.queue.put_nowait(MediaStarted("PCMU/8000"))  # the callee answered
    await wait_for(lambda: provider.texts != [])
    assert provider.texts == ["Greet the callee."] and call.status()["line"] == "up"
    leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))
    assert (await asyncio.wait_for(task, 5)).ended_by == "caller"
