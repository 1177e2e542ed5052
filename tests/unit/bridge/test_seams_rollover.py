"""S1 and S3 where the rollover meets recovery and barge-in, on virtual time through the session coordinator.

S1: every caller utterance reaches the application exactly once, or lies inside a reported input
`audio_discontinuity`. S3: only the floor's audio reaches the channel, none of a cleared epoch. Each test
drives `RolloverCall` (a provider per connection whose server VAD follows what it was sent) into the seam.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from bridge.engine.commands import CommitInput, EmitUtterance, OpenRollover
from bridge.engine.coordinator import AudioDiscontinuity, BargedIn, OpenReplacement, Transcript
from bridge.engine.rollover import Handover, RolloverOptions, RolloverStats
from providers.events import (
    AudioReceived,
    InputTranscript,
    InputTranscriptFailed,
    ProviderEvent,
    SessionClosed,
    SpeechStarted,
    SpeechStopped,
)
from rtp.audio import PCMU_8K
from tests.support.rollover_session import SCALED, ClientCommitCall, RolloverCall
from tests.support.session_engine import GPT_LIVE_CAPS, MS, TICK, Call, pcmu_tone, speech_frame

LONG = replace(SCALED, transcript_wait_ms=2_000, hard_stop_ms=14_000, cap_ms=16_000)


def finals(call: RolloverCall) -> list[str]:
    return [n.text for n in call.notices if isinstance(n, Transcript) and n.role == "caller" and n.final]


def heard(call: RolloverCall) -> list[str]:
    return [f"utterance {i}" for i in range(1, call.utterance + 1)]


def barge_ins(call: RolloverCall) -> list[BargedIn]:
    return [n for n in call.notices if isinstance(n, BargedIn)]


def stage(call: RolloverCall) -> str:
    return str(call.core.status(call.now)["rollover"]["stage"])


def filtered(call: RolloverCall, drop: Callable[[ProviderEvent], ProviderEvent | None]) -> Callable[[], None]:
    """Route the providers' events through `drop` (None: the event never comes); returns the undo."""
    original = call.core.provider_event

    def through(event: ProviderEvent, now: int) -> None:
        if (kept := drop(event)) is not None:
            original(kept, now)

    call.core.provider_event = through  # type: ignore[method-assign]
    return lambda: setattr(call.core, "provider_event", original)


def without_the_old_ones_text(call: RolloverCall) -> Callable[[], None]:
    return filtered(call, lambda e: None if isinstance(e, InputTranscript) and e.token == 1 else e)


def shared_utterance_awaiting_the_old_text(call: RolloverCall) -> int:
    """A rollover opens; after a pause (longer than the match slack: the old one's text of the utterance before
    comes after the opening) the caller says an utterance both connections hear; only the new one's text of it
    comes (it waits for the old one's, RO3). Returns the next connection's token."""
    opening = call.talk_until_a_rollover_opens()
    call.step(False, 30)
    undo = without_the_old_ones_text(call)
    call.utterance += 1
    call.step(True, 40)
    call.step(False)
    undo()
    assert call.core.rollover.controller is not None and call.core.rollover.controller._texts.waiting()
    return opening.token


# --- a recovery during a rollover: the next connection's texts are emitted, not quarantined ---------------


def test_s1_ro3_a_recovery_in_the_drain_emits_the_next_connections_text_held_for_the_old_ones() -> None:
    call = RolloverCall(replace(LONG, overlap_ms=1_000))
    shared_utterance_awaiting_the_old_text(call)
    assert stage(call) == "draining" and call.core.token == 1
    call.step(False, 5)  # the next connection alone hears the caller
    call.core.provider_event(SessionClosed(1, "connection_lost", finalized=False), call.now)  # the floor dies
    call._carry_out()
    assert [c for c in call.commands if isinstance(c, OpenReplacement)]  # a recovery (HR5)
    assert finals(call) == heard(call)  # the last one from the healthy next connection, once
    [alone] = [n for n in call.notices if isinstance(n, AudioDiscontinuity) and n.direction == "input"]
    assert alone.amount == 5 and alone.cause == "rollover_next_lost"  # quarantined with what it alone heard
    call.step(False, 200)
    assert finals(call) == heard(call)


def test_s1_ro3_a_recovery_in_the_overlap_emits_the_next_connections_text_held_for_the_old_ones() -> None:
    call = RolloverCall(replace(LONG, overlap_ms=4_000))
    shared_utterance_awaiting_the_old_text(call)
    assert stage(call) == "overlap"
    call.core.provider_event(AudioReceived(1, bytes(170_000), PCMU_8K, "flood"), call.now)  # output_overflow
    call._carry_out()
    assert [c for c in call.commands if isinstance(c, OpenReplacement) and c.cause == "output_overflow"]
    assert finals(call) == heard(call)
    replacement = next(c for c in call.commands if isinstance(c, OpenReplacement))
    assert replacement.snapshot.caller_text[-1] == heard(call)[-1]  # the replacement is seeded with it (HR7)


def test_s1_ro3_a_recovery_after_the_floor_moved_emits_its_text_held_for_the_old_ones() -> None:
    call = RolloverCall(replace(LONG, overlap_ms=1_000))
    new = shared_utterance_awaiting_the_old_text(call)
    for _ in range(200):
        if call.core.token == new:
            break
        call.step(False)
    assert call.core.token == new and call.core.connections.listeners == {1}  # the old one owes its text
    call.core.provider_event(SessionClosed(new, "connection_lost", finalized=False), call.now)
    call._carry_out()
    assert finals(call) == heard(call)


# --- the next connection lost while it alone hears the caller ----------------------------------------------


def test_s1_the_next_connection_lost_while_it_alone_hears_the_caller_is_an_input_discontinuity() -> None:
    """After the old connection stopped hearing the caller and before the floor moved, the next one is lost:
    what only it heard is reported (HR8 style), and the old connection hears the caller again at once."""
    call = RolloverCall(LONG)
    new = call.talk_until_a_rollover_opens().token
    call.utterance += 1
    call.step(True, 40)
    call.step(False)  # the shared utterance ends: the old one stops hearing the caller and drains (RO2)
    assert stage(call) == "draining" and call.core.connections.audio_targets == (new,)
    old_frames, new_frames = call.audio[1], call.audio[new]
    undo = filtered(call, lambda e: None if isinstance(e, SpeechStarted) and e.token == new else e)
    call.utterance += 1
    call.step(False, 5)
    call.step(True, 8)  # the caller begins again; the next one's VAD has not said so yet
    undo()
    alone = call.audio[new] - new_frames
    assert call.audio[1] == old_frames and alone == 13
    call.core.provider_event(SessionClosed(new, "connection_lost", finalized=False), call.now)
    call._carry_out()
    [lost] = [n for n in call.notices if isinstance(n, AudioDiscontinuity) and n.direction == "input"]
    assert lost.amount == alone and lost.cause == "rollover_next_lost" and lost.at_ms == call.now // 1_000_000
    assert call.core.connections.audio_targets == (1,)  # the old connection hears the caller again
    call.step(True, 30)
    assert call.audio[1] == old_frames + 30  # the rest of the utterance
    call.step(False, 5)
    assert finals(call) == heard(call)  # from the old one


def test_s1_ro5_the_next_connection_lost_after_the_switch_is_an_input_discontinuity() -> None:
    """Client commits (RO5): the switch hands the caller's audio to the next connection in one batch; lost before
    it takes the floor, what it alone heard is reported and the old connection hears the caller again."""
    call = ClientCommitCall()
    for _ in range(20):
        call.utterance += 1
        call.step(True, 50)
        for _ in range(30):
            call.step(False)
            if call.core.connections.audio_targets == (2,):
                break
        if call.core.connections.audio_targets == (2,):
            break
    assert call.core.connections.audio_targets == (2,) and call.core.token == 1  # switched, not handed over
    call.step(False, 7)
    call.core.provider_event(SessionClosed(2, "connection_lost", finalized=False), call.now)
    call._carry_out()
    [lost] = [n for n in call.notices if isinstance(n, AudioDiscontinuity) and n.direction == "input"]
    assert lost.amount == 7 and lost.cause == "rollover_next_lost"  # the frames since the switch
    assert call.core.connections.audio_targets == (1,)


def test_s1_the_next_connection_lost_while_both_hear_reports_no_discontinuity() -> None:
    call = RolloverCall(LONG)
    new = call.talk_until_a_rollover_opens().token
    call.step(True, 10)
    assert stage(call) == "overlap"
    call.core.provider_event(SessionClosed(new, "connection_lost", finalized=False), call.now)
    call._carry_out()
    assert not [n for n in call.notices if isinstance(n, AudioDiscontinuity)]  # the floor heard it all


# --- barge-in during the hand-over (Realtime, xAI, Gemini: the server VAD of the connection hearing) -------


def test_s3_a_listeners_speech_start_in_the_hand_over_is_a_barge_in_and_its_answer_plays_whole() -> None:
    call = RolloverCall(replace(LONG, drain_ms=10_000))
    new = call.talk_until_a_rollover_opens().token
    call.utterance += 1
    call.step(True, 40)
    call.step(False)
    assert stage(call) == "draining" and call.core.connections.audio_targets == (new,)
    call.core.provider_event(AudioReceived(1, pcmu_tone(4_000), PCMU_8K, "old_answer"), call.now)
    call.step(False, 10)  # the old answer plays; the floor stays with the old one until it is over (RO8)
    assert call.core.token == 1 and call.playout.ledger.transmitted_ms("old_answer") > 0
    before = len(barge_ins(call))
    call.utterance += 1
    call.step(True, 30)  # the caller talks over it: only the next connection hears them
    [barge] = barge_ins(call)[before:]
    played = call.playout.ledger.transmitted_ms("old_answer")
    assert barge.source == "provider" and dict(barge.heard)["old_answer"] == played < 1_000
    assert call.core.token == new  # the caller interrupted the old one: the floor moves to the one hearing
    call.step(False)  # the caller's turn ends: the next connection answers it
    for _ in range(10):  # its answer arrives in pieces while the old one's late audio is never played
        call.core.provider_event(AudioReceived(new, pcmu_tone(100), PCMU_8K, "new_answer"), call.now)
        call.core.provider_event(AudioReceived(1, pcmu_tone(100), PCMU_8K, "old_answer"), call.now)
        call.step(False, 2)
    call.step(False, 100)
    assert call.playout.ledger.transmitted_ms("old_answer") == played
    entries = call.playout.ledger.entries("new_answer")
    assert entries[0].offset_ms == 0 and call.playout.ledger.transmitted_ms("new_answer") == 1_000
    assert finals(call) == heard(call)


def test_s3_a_listeners_speech_start_while_the_floor_hears_too_is_not_a_second_barge_in() -> None:
    call = RolloverCall(replace(LONG, overlap_ms=2_000))
    new = call.talk_until_a_rollover_opens().token
    call.core.provider_event(AudioReceived(1, pcmu_tone(2_000), PCMU_8K, "old_answer"), call.now)
    call.step(False, 5)
    before = len(barge_ins(call))
    call.step(True, 5)  # the overlap: both hear the caller; the floor's own start is the barge-in
    assert stage(call) == "overlap" and call.core.token == 1
    [barge] = barge_ins(call)[before:]
    assert dict(barge.heard)["old_answer"] > 0 and new in call.open


def test_s3_ro8_the_tail_of_an_answer_the_next_one_began_as_a_listener_is_not_played_after_it_takes_the_floor() -> (
    None
):
    """Both connections answer the utterance they shared; the old one's is played. The next one's answer, begun
    while it listened (dropped), must not be played in half once it holds the floor: it repeats the old one's."""
    call = RolloverCall(LONG)
    new = call.talk_until_a_rollover_opens().token
    call.utterance += 1
    call.step(True, 40)
    call.step(False)
    assert stage(call) == "draining"
    call.core.provider_event(AudioReceived(1, pcmu_tone(600), PCMU_8K, "old_answer"), call.now)
    call.core.provider_event(AudioReceived(new, pcmu_tone(300), PCMU_8K, "twin_answer"), call.now)
    for _ in range(200):
        if call.core.token == new:
            break
        call.step(False)
    assert call.core.token == new and call.playout.ledger.transmitted_ms("old_answer") == 600
    call.core.provider_event(AudioReceived(new, pcmu_tone(300), PCMU_8K, "twin_answer"), call.now)  # its tail
    call.step(False, 30)
    assert call.playout.ledger.transmitted_ms("twin_answer") == 0
    call.turn()  # the next utterance: its answer is the new floor's own, played whole
    call.core.provider_event(AudioReceived(new, pcmu_tone(400), PCMU_8K, "next_answer"), call.now)
    call.step(False, 40)
    assert call.playout.ledger.transmitted_ms("next_answer") == 400


# --- RO3 matching: one utterance, one match ----------------------------------------------------------------


def test_ro3_s1_two_utterances_closer_than_the_slack_stay_two_when_the_old_text_of_the_second_fails() -> None:
    call = RolloverCall(replace(LONG, overlap_ms=6_000))
    call.talk_until_a_rollover_opens()

    def second_fails(e: ProviderEvent) -> ProviderEvent | None:
        if isinstance(e, InputTranscript) and e.token == 1 and e.text == f"utterance {second}":
            return InputTranscriptFailed(1, e.item_id, "transcription failed")
        return e

    second = call.utterance + 2
    undo = filtered(call, second_fails)
    call.turn(talk_ms=1_000, pause_ms=300)  # 300 ms apart: closer than match_slack_ms (500)
    call.turn(talk_ms=1_000, pause_ms=300)
    undo()
    assert stage(call) == "overlap"
    call.step(False, 100)
    assert finals(call) == heard(call)  # the second from the next connection (RO3), not taken for the first


def test_ro3_s1_two_close_utterances_whose_new_texts_came_first_are_each_matched_once() -> None:
    """The new connection's texts of both wait; the old one's text of the first must settle the first only."""
    call = RolloverCall(replace(LONG, overlap_ms=6_000))
    new = call.talk_until_a_rollover_opens().token
    held: list[tuple[ProviderEvent, int]] = []

    def old_text_later(e: ProviderEvent) -> ProviderEvent | None:
        if isinstance(e, InputTranscript) and e.token == 1:
            held.append((e, call.now))
            return None
        return e

    undo = filtered(call, old_text_later)
    call.turn(talk_ms=1_000, pause_ms=300)
    call.turn(talk_ms=1_000, pause_ms=300)
    undo()
    first, second = held
    call.core.provider_event(first[0], call.now)
    assert isinstance(second[0], InputTranscript)
    call.core.provider_event(InputTranscriptFailed(1, second[0].item_id, "failed"), call.now)
    call._carry_out()
    assert finals(call) == heard(call) and new in call.open


def test_ro3_s1_an_utterance_over_before_the_next_one_heard_is_never_matched_to_its_first() -> None:
    """The next connection opens at the caller's end of speech and the old one's text of that utterance comes
    just after: it is the old one's alone. The caller's next utterance, 200 ms later, heard by both, is not a
    duplicate of it when the old one's text of the next fails."""
    call = RolloverCall()
    call.talk_until_a_rollover_opens()

    def next_fails(e: ProviderEvent) -> ProviderEvent | None:
        if isinstance(e, InputTranscript) and e.token == 1:
            return InputTranscriptFailed(1, e.item_id, "transcription failed")
        return e

    undo = filtered(call, next_fails)
    call.utterance += 1
    call.step(True, 40)
    call.step(False)
    undo()
    call.step(False, 100)
    assert finals(call) == heard(call)


def test_ro3_s1_an_untimed_old_text_of_an_utterance_under_way_is_matched_not_taken_as_over() -> None:
    """Gemini's captions carry no times: the old connection's text of the utterance committed at the hard stop
    in mid-speech (RO2) takes the caller's turn under way, whose end is not known yet (start = end). It is not
    an utterance over before the next connection heard anything: the next one's text of the same utterance
    matches it and is not emitted a second time (a live Gemini RO2 call emitted it twice)."""
    emitted: list[object] = []
    hand = Handover("conn-1", "conn-2", RolloverOptions(), RolloverStats(), emitted.append)
    hand.shared_from_ms = 4_000  # the next connection opened at the deadline, in mid-utterance
    hand.old_result(2_605, 2_605, "the old connection's text of the long one")
    hand.new_shared(2_605, 7_000, "the next connection's text of it", 0, old_closed=False)
    for pending in list(hand.pending):  # the old one closes: whatever still waits would be emitted now
        hand.fallback(pending)
    assert [a.text for a in emitted if isinstance(a, EmitUtterance)] == [
        "the old connection's text of the long one"
    ]


# --- S1 at a recovery outside any rollover: nothing the caller said disappears silently ---------------------


def _input_gaps(call: Call, cause: str) -> list[AudioDiscontinuity]:
    return [
        n
        for n in call.notices
        if isinstance(n, AudioDiscontinuity) and n.direction == "input" and n.cause == cause
    ]


def _caller_finals(call: Call) -> list[str]:
    return [n.text for n in call.notices if isinstance(n, Transcript) and n.role == "caller" and n.final]


def test_s1_gpt_live_caption_fragments_received_before_a_fault_are_emitted_not_dropped() -> None:
    """GPT-Live's caller captions come as timed fragments, grouped until the caller's turn is over (plus
    `caption_close_ms`). A recovery inside that window quarantined the floor, and its fragments — the caller's
    words, already received — were never emitted (the bench traced such sentences: heard, transcribed, lost)."""
    call = Call(GPT_LIVE_CAPS)
    call.tick(speech_frame(), 40)  # the caller speaks (the local detector hears it)
    call.provider(InputTranscript(1, "book a table ", None, start_ms=20, end_ms=500))
    call.provider(InputTranscript(1, "for four", None, start_ms=500, end_ms=800))
    call.tick(count=30)  # the turn is over; the fragments wait caption_close_ms
    assert _caller_finals(call) == []
    call.provider(SessionClosed(1, "connection_lost", finalized=False))  # the floor is lost
    assert _caller_finals(call) == ["book a table for four"]
    assert _input_gaps(call, "recovery_unheard") == []  # the text accounts for the turn


def test_s1_a_caller_turn_whose_text_had_not_come_when_the_floor_was_lost_is_reported() -> None:
    """Realtime: the caller's turn ended (speech started and stopped) and its transcript was in flight when
    the floor connection was lost; its events are inert from then on (HR2). The turn is reported as an input
    discontinuity that covers it (before: lost with no trace)."""
    call = Call()
    call.tick(count=10)
    turn_from = call.core.timeline.ms(call.now)
    call.provider(SpeechStarted(1, None, "item_a"))
    call.tick(speech_frame(), 60)
    call.provider(SpeechStopped(1, None, "item_a"))
    call.tick(count=10)
    call.provider(SessionClosed(1, "connection_lost", finalized=False))
    [gap] = _input_gaps(call, "recovery_unheard")
    assert gap.at_ms - gap.amount * 20 <= turn_from and gap.at_ms == call.core.timeline.ms(call.now)


def test_s1_a_floor_silent_before_the_fault_is_reported_from_its_last_sign_of_life() -> None:
    """A half-open or stalled connection sends nothing; without a local detector nobody knows whether the
    caller spoke into it. The audio sent since its last event is reported when it is found dead."""
    call = Call()
    call.tick(count=10)
    call.provider(AudioReceived(1, pcmu_tone(100), PCMU_8K, "resp"))
    last = call.core.timeline.ms(call.now)
    call.tick(count=150)  # 3 s of nothing from the provider
    call.provider(SessionClosed(1, "connection_lost", finalized=False))
    [gap] = _input_gaps(call, "recovery_unheard")
    assert gap.at_ms - gap.amount * 20 == last


def test_s1_nothing_is_reported_when_every_turn_was_told_and_the_floor_was_alive() -> None:
    call = Call()
    call.provider(SpeechStarted(1, None, "item_a"))
    call.tick(speech_frame(), 40)
    call.provider(SpeechStopped(1, None, "item_a"))
    call.provider(InputTranscript(1, "hello", "item_a", final=True))
    call.provider(AudioReceived(1, pcmu_tone(100), PCMU_8K, "resp"))
    call.tick(count=10)
    call.provider(SessionClosed(1, "connection_lost", finalized=False))
    assert _caller_finals(call) == ["hello"] and _input_gaps(call, "recovery_unheard") == []


def test_s1_ro3_an_old_texts_final_without_its_speech_stop_closes_its_span_and_matches_the_new_one() -> None:
    """The old connection's speech stop (and commit) is lost to a corrupted frame, its final text comes: the
    provider committed the utterance, which is over. Its span ends there (not at its start: it then matched
    nothing, and the new connection's text of the same words, heard 2 s later from its opening in mid-speech,
    was emitted too), and that is its end of speech: no hard-stop commit of the silence after it (RO2)."""
    call = RolloverCall(LONG)
    for _ in range(3):
        call.turn(talk_ms=1_000, pause_ms=200)  # no end of speech after after_ms: it opens at deadline_ms
    undo = filtered(call, lambda e: None if isinstance(e, SpeechStopped) and e.token == 1 else e)
    call.utterance += 1
    call.step(True, (8_000 * MS - call.now) // TICK)  # the caller talks through deadline_ms (6 s)
    [opening] = [c for c in call.commands if isinstance(c, OpenRollover)]
    spans = call.core.rollover._utterances[opening.token].values()
    assert spans and min(start for start, _ in spans) >= 6_000  # it heard from its opening, in mid-speech
    call.step(False)  # both final texts come; only the new one's speech stop
    undo()
    call.step(False, (15_000 * MS - call.now) // TICK)  # past the hard stop (14 s)
    assert not [c for c in call.commands if isinstance(c, CommitInput) and c.token == 1]
    assert finals(call) == heard(call)  # each utterance once (S1)


def test_ro2_an_old_texts_failure_without_its_speech_stop_is_its_end_of_speech() -> None:
    """The same lost speech stop, and the old connection's transcription of the utterance fails: the provider
    committed it all the same, so no hard-stop commit of the silence after it; the new one's text stands (RO3)."""
    call = RolloverCall(LONG)
    for _ in range(3):
        call.turn(talk_ms=1_000, pause_ms=200)

    def stop_lost_text_failed(e: ProviderEvent) -> ProviderEvent | None:
        if isinstance(e, SpeechStopped) and e.token == 1:
            return None
        if isinstance(e, InputTranscript) and e.token == 1:
            return InputTranscriptFailed(1, e.item_id, "transcription failed")
        return e

    undo = filtered(call, stop_lost_text_failed)
    call.utterance += 1
    call.step(True, (8_000 * MS - call.now) // TICK)
    call.step(False)
    undo()
    call.step(False, (15_000 * MS - call.now) // TICK)
    assert not [c for c in call.commands if isinstance(c, CommitInput) and c.token == 1]
    assert finals(call) == heard(call)
