"""HR1–HR13 on virtual time: the coordinator's recovery rules, and the shell opening one replacement.

HR6, HR9 and HR10 (command records, held backend results, delegations during resumption) drive the job ledger
(bridge/engine/delegations.py) through a recovery.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

from bridge.engine.commands import Reseeded
from bridge.engine.coordinator import (
    AudioDiscontinuity,
    CloseTransport,
    EndSession,
    OpenReplacement,
    SendAudio,
    Transcript,
)
from bridge.engine.delegations import (
    CommandsUnknown,
    DelegationOptions,
    DeliverResult,
    DispatchJob,
    JobChanged,
    SendContext,
)
from bridge.engine.recovery import RECOVERY_NOTICE, RecoverySnapshot, seeded_settings
from bridge.server.session import CallSession
from providers.base import ResumptionRejected, SessionSettings
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputTranscript,
    ProviderError,
    ResponseDone,
    SessionClosed,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    UsageUpdated,
)
from providers.limits import AudioLimits
from rtp.audio import PCMU_8K
from sip.leg import CallEnded
from tests.support import virtual_time
from tests.support.recovery import GEMINI, answer, commands_of, recovery_notices, repaired
from tests.support.session import FakeLeg, FakeProvider
from tests.support.session_engine import GPT_LIVE_CAPS, MS, TICK, Call, pcmu_tone, speech_frame

event_loop_policy = virtual_time.policy_fixture()  # the shell tests run on virtual time

GPT_LIVE_LIMITS = AudioLimits(16_000, 3_000)


def overflowing_call() -> Call:
    """A call whose provider just burst 2.5 s into a 2 s reservoir."""
    call = Call(limits=GPT_LIVE_LIMITS)
    call.provider(AudioReceived(1, pcmu_tone(1_000), PCMU_8K, "item_a"))
    call.tick(count=5)
    call.provider(AudioReceived(1, pcmu_tone(1_500), PCMU_8K, "item_a"))  # 2.5 s waiting > 2 s capacity
    return call


def test_hr1_overflow_and_staleness_are_recoverable_and_invalid_audio_is_fatal() -> None:
    call = overflowing_call()
    assert recovery_notices(call) == ["reconnecting"] and not call.core.ending.ended
    stale = Call(limits=AudioLimits(16_000, 1_000))
    stale.provider(AudioReceived(1, pcmu_tone(800), PCMU_8K))
    stale.advance(1_100)  # nothing plays it (on hold): it goes stale
    assert recovery_notices(stale) == ["reconnecting"] and stale.core.recovery.active.cause == "output_stale"  # type: ignore[union-attr]
    fatal = Call()
    fatal.provider(ProviderError(1, "invalid_audio", "output audio is not valid base64", fatal=True))
    assert [c for c in fatal.commands if isinstance(c, EndSession)] == [
        EndSession("protocol error invalid_audio: output audio is not valid base64", True)
    ]
    assert fatal.core.recovery.active is None


def test_hr2_the_old_transport_is_quarantined_with_a_new_monotonic_token() -> None:
    call = overflowing_call()
    opens = [c for c in call.commands if isinstance(c, OpenReplacement)]
    assert [(o.token, o.cause) for o in opens] == [(2, "output_overflow")]
    assert CloseTransport("conn-1") in call.commands
    [dropped] = [n for n in call.notices if isinstance(n, AudioDiscontinuity) and n.direction == "output"]
    assert dropped.cause == "output_overflow" and dropped.amount > 0
    sent = len(call.sent)
    call.provider(AudioReceived(1, pcmu_tone(500), PCMU_8K, "item_a"))  # late output of the old transport
    call.provider(SpeechStarted(1))
    call.tick(count=20)
    assert (
        len(call.sent) == sent and call.core.connections.stale_events == 2 and not call.core.barge.suppressed
    )


def test_hr3_the_clear_goes_through_the_barrier_and_suppression_stays() -> None:
    call = Call(limits=GPT_LIVE_LIMITS)
    call.provider(AudioReceived(1, pcmu_tone(1_000), PCMU_8K))
    call.provider(InputTranscript(1, "I want to change my booking", final=True))
    call.provider(SpeechStarted(1))  # the caller is speaking
    epoch = call.core.output.barrier.epoch
    call.core.recovery.begin(
        "output_stale", call.now, call.core.timeline.ms(call.now)
    )  # the condition itself is tested in HR1
    call.tick()
    assert call.core.output.barrier.epoch == epoch + 1 and call.core.barge.suppressed
    [open_] = [c for c in call.commands if isinstance(c, OpenReplacement)]
    assert open_.snapshot == RecoverySnapshot(("I want to change my booking",))


def test_hr4_transmitted_audio_is_outside_the_clear_scope() -> None:
    call = overflowing_call()
    transmitted = [e.offset_ms for e in call.playout.ledger.entries("item_a")]
    assert transmitted == [0, 20, 40, 60, 80]  # what left before the overflow stays in the ledger
    assert (
        call.playout.depth == 0 and call.core.output.reservoir.depth_bytes == 0
    )  # everything unplayed is gone


def test_hr5_one_worker_a_deadline_and_a_dead_replacement_is_fatal() -> None:
    call = overflowing_call()
    call.provider(AudioReceived(2, pcmu_tone(3_000), PCMU_8K))  # not ready yet: inert
    call.core.recovery.begin(
        "output_overflow", call.now, call.core.timeline.ms(call.now)
    )  # a second overflow during recovery
    assert len([c for c in call.commands + call.core.commands() if isinstance(c, OpenReplacement)]) == 1
    assert call.core.recovery.stats.ignored == 1
    deadline = call.core.next_deadline()
    assert deadline is not None and deadline <= call.now + 5_000 * MS
    call.advance(5_001)
    assert recovery_notices(call)[-1] == "failed"
    assert [c for c in call.commands if isinstance(c, EndSession)][0].reason.startswith(
        "output recovery did not complete"
    )
    dead = overflowing_call()
    dead.core.replacement_failed(2, "HTTP 503", dead.now)
    dead.provider(SessionStarted(2, "late", None))  # a dead replacement answering later revives nothing
    assert dead.core.ending.ended and recovery_notices(dead) == ["reconnecting", "failed"]


def test_hr5_the_replacement_takes_over_when_ready() -> None:
    call = overflowing_call()
    call.tick(count=3)
    call.provider(SessionStarted(2, "sess_2", None))
    assert recovery_notices(call) == ["reconnecting", "awaiting_user"]
    call.provider(AudioReceived(2, pcmu_tone(200), PCMU_8K, "item_b"))
    call.tick(count=12)
    assert [f.item_id for f in call.sent if f.item_id == "item_b"] == ["item_b"] * 10


def test_hr7_the_replacement_is_seeded_without_assistant_captions() -> None:
    original = SessionSettings(
        instructions="You book rooms.", history=tuple(("user", f"m{i}") for i in range(30))
    )
    call = Call()
    call.provider(InputTranscript(1, "Two nights from Friday", final=True))
    call.provider(OutputTranscript(1, "Sure, two nights from Friday.", final=True))
    call.core.recovery.begin("output_overflow", call.now, call.core.timeline.ms(call.now))
    call.tick()
    [open_] = [c for c in call.commands if isinstance(c, OpenReplacement)]
    seeded = seeded_settings(original, open_.snapshot, notice=True)
    assert seeded.instructions == f"You book rooms.\n\n{RECOVERY_NOTICE}"
    assert len(seeded.history) == 21 and seeded.history[-1] == ("user", "Two nights from Friday")
    assert all("Sure, two nights" not in text for _, text in seeded.history)
    assert seeded_settings(original, open_.snapshot, notice=False).instructions == "You book rooms."


def test_hr8_caller_audio_during_the_outage_is_discarded_and_counted_once() -> None:
    call = overflowing_call()
    before = call.core.frames_in
    call.commands.clear()
    call.tick(speech_frame(), count=25)  # the caller keeps talking for 500 ms
    assert call.core.frames_in == before + 25
    call.provider(SessionStarted(2, "sess_2", None))
    [discarded] = [n for n in call.notices if isinstance(n, AudioDiscontinuity) and n.direction == "input"]
    assert (discarded.amount, discarded.cause) == (25, "voice_transport_recovery")
    assert call.core.status(call.now)["recoveries"]["discarded_frames"] == 25
    call.core.caller_frame(speech_frame(), call.now + TICK)
    assert any(isinstance(c, SendAudio) for c in call.core.commands())  # the caller is heard again


def test_hr11_captions_start_a_fresh_grouping_epoch_on_the_session_timeline() -> None:
    call = Call()
    call.tick(count=50)
    call.core.timeline.connection_started(1, 0)
    call.provider(OutputTranscript(1, "Your total is", start_ms=900))
    call.core.recovery.begin("output_overflow", call.now, call.core.timeline.ms(call.now))
    call.tick(count=50)  # 1 s later the replacement's clock starts at 0
    call.provider(SessionStarted(2, "sess_2", None))
    call.provider(OutputTranscript(2, "Sorry, there was a brief audio problem", start_ms=100))
    [old, new] = [n for n in call.notices if isinstance(n, Transcript)]
    assert (old.caption_epoch, new.caption_epoch) == (0, 1)
    assert old.at_ms == 900 and new.at_ms == 2_000 + 100


def test_hr12_usage_from_an_interrupted_transport_counts_and_complete_stays_false() -> None:
    call = Call()
    call.provider(UsageUpdated(1, audio_seconds=15.0))
    call.provider(SessionClosed(1, "connection closed (code 1006)", False))  # lost: recovery, not hang-up
    assert recovery_notices(call) == ["reconnecting"] and not call.core.ending.ended
    call.provider(SessionStarted(2, "sess_2", None))
    call.provider(UsageUpdated(2, audio_seconds=4.0))
    call.provider(SessionClosed(2, "close_requested", True, 6.0))  # the replacement closes gracefully
    usage = call.core.status(call.now)["usage"]
    assert usage["audio_seconds"] == 21.0 and usage["complete"] is False


def test_hr13_status_shows_reconnecting_then_awaiting_user_then_nothing() -> None:
    call = overflowing_call()
    stages = [call.core.status(call.now)["output_recovery"]]
    call.provider(SessionStarted(2, "sess_2", None))
    stages.append(call.core.status(call.now)["output_recovery"])
    call.provider(SpeechStarted(2))
    call.provider(SpeechStopped(2))  # fresh caller speech on the replacement
    stages.append(call.core.status(call.now)["output_recovery"])
    assert [s and s["stage"] for s in stages] == ["reconnecting", "awaiting_user", None]
    assert stages[0] == {"token": 2, "cause": "output_overflow", "started_at": 100, "stage": "reconnecting"}
    status = call.core.status(call.now)
    assert status["state"] == "ready"  # the session stayed ready while the voice path was repaired
    assert (
        status["recoveries"]["by_cause"] == {"output_overflow": 1} and status["recoveries"]["completed"] == 1
    )


# --- the shell: one replacement connection, and closing during a recovery ---


class ReplacementProvider(FakeProvider):
    def __init__(self, token: int, refuse: bool = False, hang: bool = False) -> None:
        super().__init__(refuse=refuse)
        self.token = token
        self.hang = hang

    async def connect(self) -> SessionStarted:
        if self.hang:
            await asyncio.sleep(3600)
        return (
            await super().connect()
            if self.token == 1
            else SessionStarted(self.token, f"sess_{self.token}", None)
        )


async def test_hr5_the_shell_opens_one_replacement_and_the_call_stays_up() -> None:
    leg, first = FakeLeg(), ReplacementProvider(1)
    opened: list[tuple[int, SessionSettings]] = []

    def reconnect(token: int, settings: SessionSettings) -> ReplacementProvider:
        opened.append((token, settings))
        return ReplacementProvider(token)

    session = CallSession(
        leg,
        first,
        clock=virtual_time.loop_clock(),
        reconnect=reconnect,
        settings=SessionSettings(instructions="Be kind."),
    )
    task = asyncio.create_task(session.run())
    first.queue.put_nowait(SessionClosed(1, "connection closed (code 1006)", False))
    for _ in range(100):
        await asyncio.sleep(0)
        if (
            session.coordinator
            and session.coordinator.recovery.active
            and session.coordinator.token == 2
            and session.status()["output_recovery"]["stage"] == "awaiting_user"
        ):
            break
    assert [t for t, _ in opened] == [2] and RECOVERY_NOTICE in opened[0][1].instructions  # type: ignore[operator]
    assert leg.hangups == [] and first.closed
    leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))
    summary = await asyncio.wait_for(task, 5)
    assert summary.ended_by == "caller"


async def test_a_replaced_connection_is_freed_while_the_call_goes_on() -> None:
    """Once the first connection is replaced and closed, the session holds nothing of it. It used to
    keep the first adapter (its shell, core and socket buffers) to the call's end: one closed connection a
    call, in a live bridge's census."""
    leg, first = FakeLeg(), ReplacementProvider(1)
    session = CallSession(
        leg, first, clock=virtual_time.loop_clock(), reconnect=lambda token, _: ReplacementProvider(token)
    )
    task = asyncio.create_task(session.run())
    for _ in range(50):
        await asyncio.sleep(0)
    first.queue.put_nowait(SessionClosed(1, "connection closed (code 1006)", False))
    gone, first = weakref.ref(first), None  # type: ignore[assignment]
    for _ in range(100):
        await asyncio.sleep(0)
        if session.coordinator and session.coordinator.token == 2 and 1 not in session.providers:
            break
    await asyncio.sleep(2)  # the close task (1 s at most) has ended
    gc.collect()
    assert session.coordinator is not None and session.coordinator.token == 2 and leg.hangups == []
    assert gone() is None, gc.get_referrers(gone())
    leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))
    assert (await asyncio.wait_for(task, 5)).ended_by == "caller"


async def test_hr5_closing_during_a_recovery_finishes_within_its_deadline() -> None:
    leg, first = FakeLeg(), ReplacementProvider(1)
    session = CallSession(
        leg,
        first,
        clock=virtual_time.loop_clock(),
        reconnect=lambda token, settings: ReplacementProvider(token, hang=True),
    )
    task = asyncio.create_task(session.run())
    first.queue.put_nowait(SessionClosed(1, "connection closed (code 1006)", False))
    for _ in range(50):
        await asyncio.sleep(0)
    leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))  # the caller hangs up while reconnecting
    summary = await asyncio.wait_for(task, 3)  # the hanging replacement worker is cancelled, not awaited
    assert summary.ended_by == "caller"


# --- HR6, HR9, HR10: the job ledger through a recovery (bridge/engine/delegations.py) ---------------------------------


def jobs_in(call: Call, state: str) -> list[str]:
    return [n.job_id for n in call.notices if isinstance(n, JobChanged) and n.state == state]


def test_hr6_a_command_interrupted_before_acknowledgement_is_unknown_and_not_replayed() -> None:
    call = Call()
    call.provider(ToolCallRequested(1, "call_a", "lookup_order", '{"order_id": "42"}'))
    call.provider(ToolCallRequested(1, "call_b", "book_slot", "{}"))
    [first, second] = [c.request for c in commands_of(call, DispatchJob)]
    answer(call, first.job_id, '{"status": "shipped"}')
    call.provider(ResponseDone(1, "resp_1"))  # the provider took the first answer in
    answer(call, second.job_id, '{"booked": "10:00"}')
    assert [(c.token, c.call_id) for c in commands_of(call, DeliverResult)] == [(1, "call_a"), (1, "call_b")]
    repaired(call)  # the connection is lost before it acknowledged the second answer
    [unknown] = [n for n in call.notices if isinstance(n, CommandsUnknown)]
    assert unknown.token == 1 and [(r.job_id, r.state) for r in unknown.records] == [
        (second.job_id, "unknown")
    ]
    call.provider(SpeechStarted(2, 100))
    call.provider(SpeechStopped(2, 900))
    call.provider(ResponseDone(2, "resp_2"))
    call.advance(5_000)
    assert commands_of(call, DeliverResult) == [] and commands_of(call, SendContext) == []  # never replayed
    assert call.core.status(call.now)["delegations"]["unknown_commands"] == 1
    # New application context may be admitted during a reconnect, within the limit on command records.
    limited = Call(delegations=DelegationOptions(max_command_records=2))
    repaired(limited)
    assert [limited.core.push_update(f"update {i}", speak=True, now=limited.now) for i in range(3)] == [
        True,
        True,
        False,
    ]


def test_hr9_a_result_is_held_until_fresh_speech_and_a_correction_supersedes_it() -> None:
    call = Call()
    call.provider(ToolCallRequested(1, "call_a", "lookup_order", '{"order_id": "42"}'))
    [job] = [c.request for c in commands_of(call, DispatchJob)]
    repaired(call)
    assert answer(call, job.job_id, '{"status": "shipped"}')  # backend work stays intact
    assert call.core.push_update("Your parcel left the depot.", speak=True, now=call.now)
    call._drain()
    call.provider(SpeechStarted(2, 200))  # "no, order forty-three"
    call.tick(count=10)
    call.provider(SpeechStopped(2, 1_400))
    assert commands_of(call, DeliverResult) == [] and commands_of(call, SendContext) == []  # still held
    call.provider(ToolCallRequested(2, "call_c", "lookup_order", '{"order_id": "43"}'))  # the correction
    [correction] = [c.request for c in commands_of(call, DispatchJob)]
    assert correction.supersedes == job.job_id and jobs_in(call, "superseded") == [job.job_id]
    call.provider(ResponseDone(2, "resp_2"))  # the fresh speech has been interpreted: the hold ends
    assert commands_of(call, DeliverResult) == []  # the superseded result is never announced
    assert [c.text for c in commands_of(call, SendContext)] == ["Your parcel left the depot."]
    answer(call, correction.job_id, '{"status": "processing"}')
    assert [(c.token, c.call_id) for c in commands_of(call, DeliverResult)] == [(2, "call_c")]
    assert not answer(call, job.job_id, '{"status": "late"}')


def test_hr9_a_held_result_without_correction_becomes_a_session_update_on_the_new_connection() -> None:
    call = Call()
    call.provider(ToolCallRequested(1, "call_a", "lookup_order", '{"order_id": "42"}'))
    [job] = [c.request for c in commands_of(call, DispatchJob)]
    repaired(call)
    answer(call, job.job_id, '{"status": "shipped"}')
    call.provider(SpeechStarted(2, 200))
    call.provider(SpeechStopped(2, 800))
    assert commands_of(call, SendContext) == []
    call.advance(
        DelegationOptions().results_hold_ms + 20
    )  # the model never reacted: the fallback ends the hold
    [update] = commands_of(call, SendContext)
    assert update.token == 2 and job.job_id in update.text and "shipped" in update.text and update.speak


def test_hr10_delegations_before_the_fresh_caller_interval_are_not_dispatched() -> None:
    call = Call(
        caps=GPT_LIVE_CAPS, limits=GPT_LIVE_LIMITS, delegations=DelegationOptions(max_pending_delegations=2)
    )
    repaired(call)
    call.provider(ToolCallRequested(2, "del_1", "check_balance", "{}", kind="delegation", at_ms=0))
    call.provider(ToolCallRequested(2, "del_2", "check_balance", "{}", kind="delegation", at_ms=5))
    call.provider(ToolCallRequested(2, "del_3", "check_balance", "{}", kind="delegation", at_ms=10))
    assert commands_of(call, DispatchJob) == []  # waiting for the first fresh caller interval
    assert len(jobs_in(call, "held")) == 2
    [refusal] = commands_of(call, DeliverResult)  # the third is over max_pending_delegations
    assert refusal.call_id == "del_3" and "refused" in refusal.output
    call.tick(speech_frame(), count=10)  # the caller speaks again: the local VAD opens the fresh interval
    stale = commands_of(call, DeliverResult)
    assert sorted(c.call_id for c in stale) == ["del_1", "del_2"] and all(
        "not run" in c.output for c in stale
    )
    assert commands_of(call, DispatchJob) == []
    started = call.core.delegations.fresh_start_ms
    assert started is not None
    origin = call.core.timeline.rebase(2, 0, call.now)
    call.provider(
        ToolCallRequested(2, "del_4", "check_balance", "{}", kind="delegation", at_ms=started - origin + 40)
    )
    [fresh] = [
        c.request for c in commands_of(call, DispatchJob)
    ]  # stamped inside the fresh interval: new work
    assert fresh.requested_at_ms >= started
    assert call.core.status(call.now)["delegations"]["not_dispatched"] == 2


def test_hr5_a_provider_silent_after_the_caller_spoke_is_presumed_half_open_when_pings_cannot_tell() -> None:
    answered = Call(caps=GEMINI)
    answered.tick(speech_frame(), count=50)
    answered.tick(count=25)  # the caller stopped; the provider answers within the limit
    answered.provider(InputTranscript(1, "hello", final=True))
    answered.advance(10_000)
    assert recovery_notices(answered) == []
    silent = Call(caps=GEMINI)
    silent.tick(speech_frame(), count=50)
    silent.tick(count=25)
    silent.tick(speech_frame(), count=50)  # the caller talks on: a later turn does not postpone the watchdog
    silent.tick(count=25)
    silent.advance(3_000)
    assert recovery_notices(silent) == []
    silent.advance(
        1_500
    )  # 6 s after the end of the first turn (hangover included), nothing from the provider
    assert recovery_notices(silent) == ["reconnecting"]
    assert silent.core.status(silent.now)["output_recovery"]["cause"] == "provider_silent"
    assert any(isinstance(c, OpenReplacement) and c.token == 2 for c in silent.commands)


def test_hr5_the_tail_of_a_turn_a_replacement_heard_does_not_arm_the_silence_watchdog() -> None:
    """The fault campaign's cascade: a replacement that came up while the caller was speaking heard only the
    end of that turn (HR8). Armed by it, the watchdog fired 6 s later, about when the provider answered the
    next whole turn, and replaced the replacement the same way: one recovery a turn for the rest of the call,
    and the caller never heard an answer. The first fresh turn arms it as any turn does."""
    call = Call(caps=GEMINI)
    call.tick(speech_frame(), count=50)
    call.tick(count=25)  # the caller stopped; nothing comes back
    call.advance(6_000)
    assert recovery_notices(call) == ["reconnecting"]
    call.tick(speech_frame(), count=20)  # the caller's next turn begins while no connection hears it
    call.provider(SessionStarted(2, "sess_2", None))
    call.tick(speech_frame(), count=30)  # the replacement hears the rest of it
    call.tick(count=25)
    call.advance(6_500)
    assert recovery_notices(call) == ["reconnecting", "awaiting_user"]  # no answer owed for a tail
    call.tick(speech_frame(), count=50)  # a fresh turn: the repair is complete, the watchdog armed
    call.tick(count=25)
    assert recovery_notices(call)[-1] == "done"
    call.provider(InputTranscript(2, "hello", final=True))  # the replacement answers it
    call.advance(10_000)
    assert recovery_notices(call)[-1] == "done"
    call.tick(speech_frame(), count=50)  # and a replacement that is itself silent is still found
    call.tick(count=25)
    call.advance(6_500)
    assert recovery_notices(call)[-2:] == ["done", "reconnecting"]
    assert call.core.status(call.now)["output_recovery"]["cause"] == "provider_silent"


def test_hr5_a_replacement_lost_before_the_caller_spoke_again_is_replaced_in_turn() -> None:
    call = Call()
    repaired(call)  # token 2 is up, the caller has not spoken yet
    call.provider(SessionClosed(2, "connection lost", False))
    assert recovery_notices(call)[-3:] == ["awaiting_user", "interrupted", "reconnecting"]
    assert [c.token for c in call.commands if isinstance(c, OpenReplacement)] == [2, 3]
    assert [c.token for c in call.commands if isinstance(c, CloseTransport)] == [1, 2]
    call.provider(SessionStarted(3, "sess_3", None))
    call.provider(SpeechStarted(3, 100))
    call.provider(SpeechStopped(3, 900))
    assert recovery_notices(call)[-2:] == ["awaiting_user", "done"]
    assert call.core.status(call.now)["recoveries"]["interrupted"] == 1 and not call.core.ending.ended


def test_hr13_a_turn_that_began_before_the_repair_does_not_complete_it() -> None:
    call = Call(caps=GPT_LIVE_CAPS, limits=GPT_LIVE_LIMITS)
    call.tick(speech_frame(), count=10)  # the caller is speaking when the connection drops
    call.provider(SessionClosed(1, "connection lost", False))
    call.provider(SessionStarted(2, "sess_2", None))
    call.tick(speech_frame(), count=10)
    call.tick(count=25)  # that turn ends on the replacement: it is not fresh speech
    assert recovery_notices(call) == ["reconnecting", "awaiting_user"]
    call.tick(speech_frame(), count=10)
    call.tick(count=25)
    assert recovery_notices(call) == ["reconnecting", "awaiting_user", "done"]


def tail_after_a_repair(call: Call, *, reported_before: bool) -> None:
    """The caller is speaking when the connection drops (`reported_before`: its server VAD had reported the
    start) and still speaks when the replacement is ready; the replacement reports a speech start of its own at
    the first audio it hears (Realtime's audio_start_ms 0), transcribes the tail and asks for a tool."""
    if reported_before:
        call.provider(SpeechStarted(1, 40))
    call.tick(speech_frame(), count=10)
    call.provider(SessionClosed(1, "connection lost", False))
    call.tick(speech_frame(), count=3)  # discarded while the replacement connects (HR8)
    call.provider(SessionStarted(2, "sess_2", None))
    call.tick(speech_frame())  # its first frame
    call.provider(SpeechStarted(2, 0))
    call.tick(speech_frame(), count=10)
    call.provider(SpeechStopped(2, 220))
    call.provider(ToolCallRequested(2, "call_tail", "lookup_order", '{"order_id": "4"}'))


def test_hr13_a_server_vad_replacement_s_own_start_of_a_turn_under_way_is_not_fresh_work() -> None:
    """The server-VAD twin of the local detector's case: a turn that began before the repair, whose tail the
    replacement reports as a speech start of its own at its first frame, neither opens the fresh caller interval
    (HR10: its call is held, then not run, and the model is told to ask again, HR7) nor completes the repair."""
    for reported_before in (True, False):
        call = Call()
        tail_after_a_repair(call, reported_before=reported_before)
        assert not commands_of(call, DispatchJob) and not commands_of(call, DeliverResult)  # held (HR10)
        assert recovery_notices(call) == ["reconnecting", "awaiting_user"]  # the tail is not fresh speech
        call.tick(count=25)
        call.provider(SpeechStarted(2))  # the caller's fresh turn
        [stale] = commands_of(call, DeliverResult)
        assert stale.call_id == "call_tail" and "not run" in stale.output
        assert not commands_of(call, DispatchJob)
        call.tick(speech_frame(), count=10)
        call.provider(SpeechStopped(2))
        assert recovery_notices(call) == ["reconnecting", "awaiting_user", "done"]
        call.provider(ToolCallRequested(2, "call_fresh", "lookup_order", '{"order_id": "4"}'))
        assert [c.request.name for c in commands_of(call, DispatchJob)] == ["lookup_order"]  # fresh work


def test_hr13_an_unstamped_speech_start_of_the_replacement_in_a_turn_the_local_detector_still_hears_is_not_fresh() -> (
    None
):
    """Gemini: its speech start has no time, and the local detector (which ends its turns) hears every frame:
    the replacement's start inside the turn under way at its ready instant is the tail's, not fresh work."""
    call = Call(caps=GEMINI)
    call.tick(speech_frame(), count=10)  # the local detector's turn begins
    call.provider(SpeechStarted(1))
    call.provider(SessionClosed(1, "connection lost", False))
    call.tick(speech_frame(), count=3)
    call.provider(SessionStarted(2, "sess_2", None))
    call.tick(speech_frame(), count=8)
    call.provider(SpeechStarted(2))  # reported well after its first audio: no time of its own
    call.tick(speech_frame(), count=5)
    call.tick(count=25)  # the local detector ends the turn
    call.provider(ToolCallRequested(2, "call_tail", "lookup_order", '{"order_id": "4"}'))
    assert not commands_of(call, DispatchJob) and not commands_of(call, DeliverResult)  # held (HR10)
    assert recovery_notices(call) == ["reconnecting", "awaiting_user"]
    call.tick(speech_frame(), count=10)  # the caller's fresh turn
    [stale] = commands_of(call, DeliverResult)
    assert stale.call_id == "call_tail" and "not run" in stale.output


def test_hr13_a_turn_left_open_by_the_lost_connection_does_not_hold_back_the_callers_fresh_turn() -> None:
    """The caller fell silent while the replacement connected (the lost connection never reported that end).
    Their next start is fresh when the replacement stamps it well after its first audio (it heard silence
    first), or, with no time of its own, once the replacement has said something (its notice, HR7)."""
    for stamped in (True, False):
        call = Call()
        call.provider(SpeechStarted(1, 40))
        call.tick(speech_frame(), count=10)
        call.provider(SessionClosed(1, "connection lost", False))
        call.tick(count=10)
        call.provider(SessionStarted(2, "sess_2", None))
        call.tick(count=5)
        if not stamped:
            call.provider(AudioReceived(2, pcmu_tone(300), PCMU_8K, "notice"))  # "there was an audio problem"
        call.tick(count=25)
        call.provider(SpeechStarted(2, 560 if stamped else None))
        call.tick(speech_frame(), count=10)
        call.provider(SpeechStopped(2))
        assert recovery_notices(call) == ["reconnecting", "awaiting_user", "done"]
        call.provider(ToolCallRequested(2, "call_fresh", "lookup_order", '{"order_id": "4"}'))
        assert len(commands_of(call, DispatchJob)) == 1


def test_hr9_a_call_made_in_the_fresh_interval_is_answered_at_once() -> None:
    call = Call()
    repaired(call)
    call.provider(SpeechStarted(2, 100))
    call.tick(count=50)
    call.provider(SpeechStopped(2, 900))
    call.provider(
        ToolCallRequested(2, "call_n", "lookup_order", '{"order_id": "43"}')
    )  # the model's reaction
    [job] = [c.request for c in commands_of(call, DispatchJob)]
    answer(call, job.job_id, '{"status": "processing"}')
    assert [(c.token, c.call_id) for c in commands_of(call, DeliverResult)] == [(2, "call_n")]  # not held


# --- resumption (Gemini sessionResumption): the replacement continues by the latest resumable handle -------


def test_hr7_a_resumable_provider_s_replacement_is_opened_with_the_latest_valid_handle() -> None:
    from providers.events import ResumptionUpdated

    call = Call(caps=GEMINI)
    call.provider(ResumptionUpdated(1, "handle-1", True))
    call.provider(ResumptionUpdated(1, "handle-2", True))
    call.provider(
        ResumptionUpdated(1, "handle-3", False)
    )  # not resumable at this point: the last good one stays
    call.provider(ResumptionUpdated(7, "stale-handle", True))  # another transport's: inert
    call.provider(InputTranscript(1, "my order number is 42", final=True))
    call.provider(SessionClosed(1, "connection closed (code 1006)", False))
    [open_] = [c for c in call.commands if isinstance(c, OpenReplacement)]
    assert open_.resume_handle == "handle-2" and open_.snapshot.caller_text == ("my order number is 42",)
    seeded = seeded_settings(
        SessionSettings(instructions="Be kind."),
        open_.snapshot,
        notice=True,
        resume_handle=open_.resume_handle,
    )
    assert seeded.resume_handle == "handle-2" and RECOVERY_NOTICE in (seeded.instructions or "")
    without = Call()  # a provider without resumption never gets a handle
    without.provider(ResumptionUpdated(1, "handle-1", True))
    without.provider(SessionClosed(1, "connection closed (code 1006)", False))
    assert [c.resume_handle for c in without.commands if isinstance(c, OpenReplacement)] == [None]


def test_hr5_a_rejected_handle_reopens_the_replacement_reseeded_within_the_same_budget() -> None:
    from providers.events import ResumptionUpdated

    call = Call(caps=GEMINI)
    call.provider(ResumptionUpdated(1, "expired", True))
    call.provider(SessionClosed(1, "connection closed (code 1006)", False))
    deadline = call.core.recovery.next_deadline()
    call.advance(400)
    call.core.resumption_rejected(2, call.now)
    call._drain()
    opens = [c for c in call.commands if isinstance(c, OpenReplacement)]
    assert [(o.token, o.resume_handle) for o in opens] == [(2, "expired"), (2, None)]
    assert recovery_notices(call) == ["reconnecting"]  # still the one recovery
    assert [n for n in call.notices if isinstance(n, Reseeded)] == [Reseeded(2, "recovery")]
    assert call.core.recovery.next_deadline() == deadline  # still the one 5 s budget (HR5)
    call.provider(SessionStarted(2, "sess_2", None))
    assert recovery_notices(call)[-1] == "awaiting_user"
    call.core.resumption_rejected(2, call.now)  # a late rejection after the repair reopens nothing
    assert [c for c in call.core.commands() if isinstance(c, OpenReplacement)] == []


class ResumingProvider(ReplacementProvider):
    """A replacement that refuses the handle it was opened with (expired), as Gemini does."""

    def __init__(self, token: int, settings: SessionSettings) -> None:
        super().__init__(token)
        self.settings = settings
        self.capabilities = GEMINI

    async def connect(self) -> SessionStarted:
        if self.settings.resume_handle is not None:
            raise ResumptionRejected("session resumption handle expired")
        return await super().connect()


async def test_hr5_the_shell_reopens_a_replacement_whose_handle_was_rejected_without_it() -> None:
    from providers.events import ResumptionUpdated

    leg, first = FakeLeg(), ReplacementProvider(1)
    first.capabilities = GEMINI  # type: ignore[misc]
    opened: list[SessionSettings] = []

    def reconnect(token: int, settings: SessionSettings) -> ResumingProvider:
        opened.append(settings)
        return ResumingProvider(token, settings)

    session = CallSession(
        leg,
        first,
        clock=virtual_time.loop_clock(),
        reconnect=reconnect,
        settings=SessionSettings(instructions="Be kind."),
    )
    task = asyncio.create_task(session.run())
    first.queue.put_nowait(ResumptionUpdated(1, "h-1", True))
    first.queue.put_nowait(SessionClosed(1, "connection closed (code 1006)", False))
    for _ in range(200):
        await asyncio.sleep(0)
        status = session.status()
        if status.get("output_recovery") and status["output_recovery"]["stage"] == "awaiting_user":
            break
    assert [s.resume_handle for s in opened] == ["h-1", None]  # once with the handle, once reseeded
    assert all(RECOVERY_NOTICE in (s.instructions or "") for s in opened) and leg.hangups == []
    leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))
    assert (await asyncio.wait_for(task, 5)).ended_by == "caller"
