"""RO1–RO9 on virtual time: the rollover controller's rules, driven with plain integers (no sleeps, no I/O).

Instants are monotonic nanoseconds from 0, and the session timeline starts at 0, so `t // MS` is session ms.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable

import pytest

from bridge.engine.commands import (
    ApproveRollover,
    AuthorizeConnection,
    CloseTransport,
    CommitInput,
    EmitInterim,
    EmitUtterance,
    EndSession,
    OpenRollover,
    StartInput,
    StopInput,
    TakeFloor,
)
from bridge.engine.rollover import RolloverController, RolloverOptions
from rtp.units import NS_PER_MS as MS

S = 1_000 * MS
OPTS = RolloverOptions()
AFTER, DEADLINE, HARD = OPTS.after_ms * MS, OPTS.deadline_ms * MS, OPTS.hard_stop_ms * MS
CAP_MS = 3_600_000


def confirmed(options: RolloverOptions | None = None) -> RolloverController:
    ctl = RolloverController("conn-1", options)
    ctl.connection_confirmed("conn-1", 0)
    assert ctl.actions() == []
    return ctl


def allow(ctl: RolloverController, now: int = AFTER) -> list[object]:
    """rollover-1 asked at `now`, approved and authorised at once; returns the actions of authorisation."""
    ctl.handle_timer(now)
    assert ctl.actions() == [ApproveRollover("rollover-1", "conn-1", "conn-2")]
    ctl.approve_answered("rollover-1", True, None, now)
    assert ctl.actions() == [AuthorizeConnection("conn-2")]
    ctl.authorize_answered("conn-2", True, now)
    return ctl.actions()


def utterance(ctl: RolloverController, ids: tuple[str, ...], start: int, end: int) -> None:
    for cid in ids:
        ctl.speech_started(cid, start // MS, start)
    for cid in ids:
        ctl.speech_stopped(cid, end // MS, end)


def in_overlap() -> tuple[RolloverController, int]:
    """conn-2 opened at the caller's end of speech after after_ms and confirmed at the returned instant."""
    ctl = confirmed()
    assert allow(ctl) == []
    utterance(ctl, ("conn-1",), AFTER + 1 * S, AFTER + 3 * S)
    assert ctl.actions() == [OpenRollover("conn-2")]
    t = AFTER + 3 * S + 400 * MS
    ctl.connection_confirmed("conn-2", t)
    assert ctl.actions() == [StartInput("conn-2")]
    return ctl, t


def test_ro1_first_end_of_speech_after_after_ms_opens_the_next_connection() -> None:
    ctl = confirmed()
    utterance(ctl, ("conn-1",), AFTER - 9 * S, AFTER - 5 * S)  # before after_ms: not a trigger
    assert ctl.actions() == [] and ctl.next_deadline() == AFTER
    ctl.handle_timer(AFTER - 1)
    assert ctl.actions() == []
    assert allow(ctl) == []  # allowed, but the caller has not ended an utterance since after_ms
    assert ctl.status()["stage"] == "armed" and ctl.next_deadline() == DEADLINE
    ctl.speech_started("conn-1", 0, AFTER + 2 * S)
    assert ctl.actions() == []
    ctl.speech_stopped("conn-1", 0, AFTER + 6 * S)
    assert ctl.actions() == [OpenRollover("conn-2")]
    assert ctl.status()["stage"] == "opening" and ctl.audio_targets() == ("conn-1",)


def test_ro1_end_of_speech_while_approval_was_pending_opens_once_authorised() -> None:
    ctl = confirmed()
    ctl.handle_timer(AFTER)
    assert ctl.actions() == [ApproveRollover("rollover-1", "conn-1", "conn-2")]
    utterance(ctl, ("conn-1",), AFTER + 1 * S, AFTER + 3 * S)
    ctl.approve_answered("rollover-1", True, None, AFTER + 4 * S)
    assert ctl.actions() == [AuthorizeConnection("conn-2")]
    ctl.authorize_answered("conn-2", True, AFTER + 5 * S)
    assert ctl.actions() == [OpenRollover("conn-2")]
    # the same, but the caller is speaking again when authorisation comes: wait for that utterance's end
    ctl = confirmed()
    ctl.handle_timer(AFTER)
    utterance(ctl, ("conn-1",), AFTER + 1 * S, AFTER + 3 * S)
    ctl.speech_started("conn-1", 0, AFTER + 4 * S)
    ctl.approve_answered("rollover-1", True, None, AFTER + 5 * S)
    ctl.authorize_answered("conn-2", True, AFTER + 5 * S)
    assert ctl.actions() == [ApproveRollover("rollover-1", "conn-1", "conn-2"), AuthorizeConnection("conn-2")]
    ctl.speech_stopped("conn-1", 0, AFTER + 7 * S)
    assert ctl.actions() == [OpenRollover("conn-2")]


def test_ro1_deadline_reached_while_the_caller_speaks_opens_anyway() -> None:
    ctl = confirmed()
    ctl.speech_started("conn-1", 0, AFTER - 1 * S)  # a very long utterance
    assert allow(ctl) == [] and ctl.next_deadline() == DEADLINE
    ctl.handle_timer(DEADLINE - 1)
    assert ctl.actions() == []
    ctl.handle_timer(DEADLINE)
    assert ctl.actions() == [OpenRollover("conn-2")]
    ctl.connection_confirmed("conn-2", DEADLINE + 1 * S)
    assert ctl.actions() == [StartInput("conn-2")]
    assert ctl.audio_targets() == ("conn-1", "conn-2")
    ctl.handle_timer(DEADLINE + 10 * S)  # overlap long done, but the caller is still speaking
    assert ctl.actions() == []
    ctl.speech_stopped("conn-1", 0, DEADLINE + 20 * S)
    assert ctl.actions() == [StopInput("conn-1")]
    # conn-2 heard only the end of that utterance: its text matches the old one's by the end time (RO3)
    ctl.transcript(
        "conn-2", (DEADLINE + 1 * S) // MS, (DEADLINE + 20 * S) // MS, "...ing", True, DEADLINE + 21 * S
    )
    ctl.transcript(
        "conn-1",
        (AFTER - 1 * S) // MS,
        (DEADLINE + 20 * S) // MS + 120,
        "long thing",
        True,
        DEADLINE + 22 * S,
    )
    assert ctl.actions() == [
        EmitUtterance("conn-1", (AFTER - 1 * S) // MS, (DEADLINE + 20 * S) // MS + 120, "long thing")
    ]
    ctl.handle_timer(DEADLINE + 40 * S)  # past the wait: conn-2's partial text is never emitted
    assert [a for a in ctl.actions() if isinstance(a, EmitUtterance)] == []
    assert ctl.stats.duplicates_dropped == 1 and ctl.stats.fallbacks == 0


def test_ro1_go_away_moves_the_schedule_into_the_time_left() -> None:
    opts = RolloverOptions.for_cap(600_000)  # a Gemini-like 10-minute connection
    ctl = confirmed(opts)
    assert ctl.next_deadline() == 550_000 * MS
    now = 240 * S
    ctl.session_expiring("conn-1", 60_000, now)  # goAway: the cap is now + 60 s
    assert ctl.actions() == [ApproveRollover("rollover-1", "conn-1", "conn-2")]
    ctl.approve_answered("rollover-1", True, None, now)
    ctl.authorize_answered("conn-2", True, now)
    assert ctl.actions() == [AuthorizeConnection("conn-2")]
    ctl.speech_started("conn-1", 0, now + 1 * S)  # the caller talks through the whole minute
    assert ctl.next_deadline() == now + 36 * S  # 60 % of the time left
    ctl.handle_timer(now + 36 * S)
    assert ctl.actions() == [OpenRollover("conn-2")]
    ctl.connection_confirmed("conn-2", now + 37 * S)
    assert ctl.actions() == [StartInput("conn-2")]
    assert ctl.next_deadline() == now + 54 * S  # hard stop at 90 %
    ctl.handle_timer(now + 54 * S)
    assert ctl.actions() == [CommitInput("conn-1"), StopInput("conn-1")]
    ctl.handle_timer(now + 57 * S)  # the old one never finished: the floor moves before its cap
    assert ctl.actions() == [TakeFloor("conn-2"), CloseTransport("conn-1", "rollover")]
    ctl.session_expiring("conn-1", 1, now + 58 * S)  # closed: ignored, nothing raised
    assert ctl.actions() == [] and ctl.stats.ignored == 1


def test_ro6_a_session_ended_with_no_time_left_ends_the_call_saying_so_not_approve_timeout() -> None:
    ctl = confirmed(RolloverOptions.for_cap(600_000))
    now = 240 * S
    ctl.session_expiring("conn-1", 0, now)  # the provider ended it without notice (a cap close)
    actions = ctl.actions()
    assert ApproveRollover("rollover-1", "conn-1", "conn-2") in actions  # asked all the same...
    assert EndSession("ended_without_notice", goodbye=True) in actions  # ...but nobody had time to answer
    assert ctl.stats.refusals == {"ended_without_notice": 1}


def test_ro2_both_hear_the_caller_for_overlap_ms_then_the_old_drains_and_closes() -> None:
    ctl, t = in_overlap()
    assert ctl.audio_targets() == ("conn-1", "conn-2") and ctl.speaker() == "conn-1"
    assert ctl.status()["stage"] == "overlap" and ctl.next_deadline() == t + 3_000 * MS
    ctl.handle_timer(t + 2_999 * MS)
    assert ctl.actions() == []
    ctl.handle_timer(t + 3_000 * MS)  # the caller is between utterances
    assert ctl.actions() == [StopInput("conn-1")]
    assert ctl.audio_targets() == ("conn-2",) and ctl.speaker() == "conn-1"  # still answering
    assert ctl.status()["stage"] == "draining"
    ctl.items_finished("conn-1", t + 5 * S)
    assert ctl.actions() == [TakeFloor("conn-2"), CloseTransport("conn-1", "rollover")]
    status = ctl.status()
    assert status["stage"] == "steady" and status["current"] == "conn-2" and status["rollovers"] == 1
    assert status["ages_ms"] == {"conn-2": 5_000}


def test_ro2_the_old_keeps_hearing_the_caller_until_it_is_between_utterances() -> None:
    ctl, t = in_overlap()
    ctl.speech_started("conn-1", 0, t + 1 * S)
    ctl.speech_started("conn-2", 0, t + 1 * S)
    ctl.handle_timer(t + 3 * S)
    assert ctl.actions() == [] and ctl.audio_targets() == ("conn-1", "conn-2")
    ctl.speech_stopped("conn-2", 0, t + 6 * S)  # the new one's VAD does not decide
    assert ctl.actions() == []
    ctl.speech_stopped("conn-1", 0, t + 6 * S + 100 * MS)
    assert ctl.actions() == [StopInput("conn-1")]


def test_ro2_at_hard_stop_the_old_buffer_is_committed_and_it_still_closes_before_the_cap() -> None:
    ctl = confirmed()
    ctl.speech_started("conn-1", 0, DEADLINE - 1 * S)
    assert allow(ctl, DEADLINE) == [OpenRollover("conn-2")]  # allowed only at the deadline
    ctl.connection_confirmed("conn-2", HARD - 1 * S)  # a slow open: the overlap cannot complete
    assert ctl.actions() == [StartInput("conn-2")] and ctl.next_deadline() == HARD
    ctl.handle_timer(HARD)
    assert ctl.actions() == [CommitInput("conn-1"), StopInput("conn-1")]
    close_by = (OPTS.hard_stop_ms + CAP_MS) // 2 * MS
    assert ctl.next_deadline() == close_by  # drain_ms (30 s) would pass the cap; close-by comes first
    ctl.handle_timer(close_by)
    assert ctl.actions() == [TakeFloor("conn-2"), CloseTransport("conn-1", "rollover")]
    assert close_by // MS < CAP_MS


def test_ro2_events_from_unknown_or_closed_connections_are_ignored_and_duplicates_are_harmless() -> None:
    ctl, t = in_overlap()
    ctl.connection_confirmed("conn-2", t + 100 * MS)  # duplicate
    ctl.speech_stopped("conn-1", 0, t + 200 * MS)  # no speech in progress
    ctl.approve_answered("rollover-1", True, None, t + 300 * MS)  # settled long ago
    ctl.authorize_answered("conn-2", True, t + 300 * MS)
    assert ctl.actions() == [] and ctl.stats.late_answers == 2
    ctl.handle_timer(t + 3 * S)
    ctl.items_finished("conn-1", t + 4 * S)
    ctl.items_finished("conn-1", t + 4 * S)
    assert ctl.actions() == [StopInput("conn-1"), TakeFloor("conn-2"), CloseTransport("conn-1", "rollover")]
    before = ctl.stats.ignored
    ctl.speech_started("conn-1", 0, t + 5 * S)
    ctl.transcript("conn-1", 0, 1, "ghost", True, t + 5 * S)
    ctl.transcript_failed("conn-9", 0, 1, t + 5 * S)
    ctl.items_finished("conn-9", t + 5 * S)
    ctl.connection_confirmed("nobody", t + 5 * S)
    assert ctl.actions() == [] and ctl.stats.ignored == before + 5
    assert ctl.audio_targets() == ("conn-2",) and ctl.speaker() == "conn-2"


def shared_utterance(t: int) -> tuple[int, int]:
    """An utterance both connections heard, early in the overlap (which ends at t + 3 s)."""
    return (t + 200 * MS) // MS, (t + 1_500 * MS) // MS


def test_ro3_an_utterance_both_transcribed_is_emitted_once_from_the_old_connection() -> None:
    ctl, t = in_overlap()
    s, e = shared_utterance(t)
    ctl.transcript("conn-2", s + 80, e - 60, "hello there", True, t + 2 * S)  # the new one is faster
    assert ctl.actions() == []
    ctl.transcript("conn-1", s, e, "Hello there.", True, t + 2_200 * MS)
    assert ctl.actions() == [EmitUtterance("conn-1", s, e, "Hello there.")]
    ctl.handle_timer(t + 60 * S)
    ctl.transcript("conn-1", s, e, "Hello there.", True, t + 61 * S)  # a duplicate delivery (closed by now)
    assert [a for a in ctl.actions() if isinstance(a, EmitUtterance)] == []
    # the other order: the old one first, the new one's text is dropped
    ctl, t = in_overlap()
    s, e = shared_utterance(t)
    ctl.transcript("conn-1", s, e, "Yes.", True, t + 2 * S)
    ctl.transcript("conn-2", s - 300, e + 400, "yes", True, t + 2_100 * MS)
    assert ctl.actions() == [EmitUtterance("conn-1", s, e, "Yes.")] and ctl.stats.duplicates_dropped == 1


@pytest.mark.parametrize("how", ["failed", "empty"])
def test_ro3_old_transcription_failing_or_empty_emits_the_new_ones(how: str) -> None:
    ctl, t = in_overlap()
    s, e = shared_utterance(t)
    ctl.transcript("conn-2", s + 50, e + 20, "my account number", True, t + 2 * S)
    assert ctl.actions() == []
    if how == "failed":
        ctl.transcript_failed("conn-1", s, e, t + 2_500 * MS)
    else:
        ctl.transcript("conn-1", s, e, "  ", True, t + 2_500 * MS)
    assert ctl.actions() == [EmitUtterance("conn-2", s + 50, e + 20, "my account number")]
    ctl.transcript(
        "conn-1", s, e + 10, "My account number.", True, t + 2_900 * MS
    )  # a retry: already emitted
    assert ctl.actions() == [] and ctl.stats.fallbacks == 1


def test_ro3_old_failure_first_then_the_new_ones_is_emitted_at_once() -> None:
    ctl, t = in_overlap()
    s, e = shared_utterance(t)
    ctl.transcript_failed("conn-1", s, e, t + 2 * S)
    ctl.transcript("conn-2", s, e, "ok", True, t + 2_200 * MS)
    assert ctl.actions() == [EmitUtterance("conn-2", s, e, "ok")]


def test_ro3_old_transcription_never_arriving_emits_the_new_one_after_a_bounded_wait() -> None:
    ctl, t = in_overlap()
    s, e = shared_utterance(t)
    ctl.transcript("conn-2", s, e, "cancel it", True, t + 2_800 * MS)
    assert ctl.next_deadline() == t + 3 * S  # the overlap's end comes first
    ctl.handle_timer(t + 3 * S)
    assert ctl.actions() == [StopInput("conn-1")]
    ctl.items_finished("conn-1", t + 4 * S)  # floor moves; the old one stays open for its text
    assert ctl.actions() == [TakeFloor("conn-2")]
    assert ctl.next_deadline() == t + 2_800 * MS + OPTS.transcript_wait_ms * MS
    ctl.handle_timer(t + 7_800 * MS)
    assert ctl.actions() == [EmitUtterance("conn-2", s, e, "cancel it"), CloseTransport("conn-1", "rollover")]
    ctl.transcript("conn-1", s, e, "Cancel it.", True, t + 9 * S)  # too late: closed, ignored
    assert ctl.actions() == [] and ctl.stats.ignored == 1


def test_ro3_old_transcription_arriving_after_the_wait_is_not_emitted_again() -> None:
    ctl, t = in_overlap()
    s, e = shared_utterance(t)
    ctl.speech_started("conn-1", 0, t + 1 * S)  # the old one is still hearing the caller
    ctl.transcript("conn-2", s, e, "cancel it", True, t + 2_800 * MS)
    ctl.handle_timer(t + 7_800 * MS)
    assert ctl.actions() == [EmitUtterance("conn-2", s, e, "cancel it")]
    ctl.transcript("conn-1", s, e, "Cancel it.", True, t + 9 * S)
    assert ctl.actions() == [] and ctl.stats.duplicates_dropped == 1


def test_ro4_new_interim_text_for_utterances_begun_on_the_old_one_is_not_emitted() -> None:
    ctl, t = in_overlap()
    s, e = shared_utterance(t)
    ctl.transcript("conn-2", s, e, "hel", False, t + 1_500 * MS)
    assert ctl.actions() == [] and ctl.stats.interim_suppressed == 1
    ctl.transcript("conn-1", s, e, "hell", False, t + 1_600 * MS)
    assert ctl.actions() == [EmitInterim("conn-1", s, e, "hell")]
    ctl.handle_timer(t + 3 * S)
    assert ctl.actions() == [StopInput("conn-1")]
    stop_ms = (t + 3 * S) // MS
    ctl.transcript("conn-2", s, e, "hello th", False, t + 3_100 * MS)  # began before the old one stopped
    assert ctl.actions() == []
    ctl.transcript("conn-2", stop_ms + 900, stop_ms + 1_200, "new", False, t + 4_200 * MS)
    assert ctl.actions() == [EmitInterim("conn-2", stop_ms + 900, stop_ms + 1_200, "new")]
    ctl.transcript("conn-2", stop_ms + 900, stop_ms + 1_900, "new words", True, t + 5 * S)
    assert ctl.actions() == [EmitUtterance("conn-2", stop_ms + 900, stop_ms + 1_900, "new words")]


def client_armed() -> RolloverController:
    ctl = confirmed(RolloverOptions(client_commits=True))
    ctl.flush(AFTER - 1 * S)  # before after_ms: an ordinary commit
    assert ctl.actions() == []
    assert allow(ctl) == [OpenRollover("conn-2")]  # opened passively at once
    ctl.flush(AFTER + 500 * MS)  # not confirmed yet: no switch
    ctl.connection_confirmed("conn-2", AFTER + 1 * S)
    assert ctl.actions() == [] and ctl.audio_targets() == ("conn-1",) and ctl.status()["stage"] == "armed"
    return ctl


def test_ro5_client_commits_switch_at_the_first_flush_after_after_ms_without_overlap() -> None:
    ctl = client_armed()
    ctl.speech_started("conn-1", 0, AFTER + 5 * S)  # client-side VAD events do not trigger anything
    ctl.speech_stopped("conn-1", 0, AFTER + 8 * S)
    assert ctl.actions() == []
    ctl.flush(AFTER + 8 * S)
    assert ctl.actions() == [StopInput("conn-1"), StartInput("conn-2")]  # one batch: no overlap, no gap
    assert ctl.audio_targets() == ("conn-2",) and ctl.speaker() == "conn-1"  # answering the flushed turn
    ctl.items_finished("conn-1", AFTER + 11 * S)
    assert ctl.actions() == [TakeFloor("conn-2"), CloseTransport("conn-1", "rollover")]


def test_ro5_client_commits_deadline_commits_and_switches() -> None:
    ctl = client_armed()
    assert ctl.next_deadline() == DEADLINE
    ctl.handle_timer(DEADLINE)
    assert ctl.actions() == [CommitInput("conn-1"), StopInput("conn-1"), StartInput("conn-2")]
    assert ctl.audio_targets() == ("conn-2",)


def refused_at_hard_stop(reason: str, answer: Callable[[RolloverController], None]) -> RolloverController:
    ctl = confirmed()
    ctl.handle_timer(AFTER)
    assert ctl.actions() == [ApproveRollover("rollover-1", "conn-1", "conn-2")]
    answer(ctl)
    utterance(ctl, ("conn-1",), DEADLINE, DEADLINE + 2 * S)  # the current one carries on as usual
    assert [a for a in ctl.actions() if isinstance(a, (AuthorizeConnection, OpenRollover))] == []
    assert ctl.status()["stage"] == "refused" and ctl.status()["refusal"] == reason
    assert ctl.next_deadline() == HARD
    utterance(ctl, ("conn-1",), HARD - 5 * S, HARD - 1 * S)  # it is answering when the hard stop comes
    ctl.handle_timer(HARD)
    assert ctl.actions() == [StopInput("conn-1")] and ctl.audio_targets() == ()
    ctl.items_finished("conn-1", HARD + 4 * S)
    assert ctl.actions() == [EndSession(reason, goodbye=True), CloseTransport("conn-1", reason)]
    assert ctl.status()["stage"] == "ended" and ctl.next_deadline() is None
    return ctl


def test_ro6_approve_false_is_a_refusal_that_keeps_the_connection_until_hard_stop() -> None:
    refused_at_hard_stop(
        "approve_refused", lambda c: c.approve_answered("rollover-1", False, None, AFTER + S)
    )


def test_ro6_approve_raising_is_a_refusal() -> None:
    refused_at_hard_stop(
        "approve_error", lambda c: c.approve_answered("rollover-1", None, "RuntimeError('no')", AFTER + S)
    )


def test_ro6_no_approve_answer_by_hard_stop_is_a_refusal_and_a_late_answer_opens_nothing() -> None:
    ctl = confirmed()
    ctl.handle_timer(AFTER)
    ctl.actions()
    assert ctl.status()["stage"] == "approving" and ctl.next_deadline() == HARD
    ctl.handle_timer(HARD)  # not busy: nothing left to finish
    assert ctl.actions() == [
        StopInput("conn-1"),
        EndSession("approve_timeout", goodbye=True),
        CloseTransport("conn-1", "approve_timeout"),
    ]
    ctl.approve_answered("rollover-1", True, None, HARD + 1 * S)
    ctl.authorize_answered("conn-2", True, HARD + 2 * S)
    assert ctl.actions() == [] and ctl.stats.late_answers == 2 and ctl.next_deadline() is None


def test_ro6_next_connection_not_open_by_hard_stop_ends_the_session() -> None:
    ctl = confirmed()
    ctl.speech_started("conn-1", 0, AFTER)
    allow(ctl)
    ctl.handle_timer(DEADLINE)
    assert ctl.actions() == [OpenRollover("conn-2")]
    ctl.handle_timer(HARD)  # conn-2 never confirmed; conn-1 still in speech but not answering
    assert ctl.actions() == [
        CloseTransport("conn-2", "next_not_open"),
        StopInput("conn-1"),
        EndSession("next_not_open", goodbye=True),
        CloseTransport("conn-1", "next_not_open"),
    ]
    ctl.connection_confirmed("conn-2", HARD + 1 * S)
    assert ctl.actions() == [] and ctl.stats.ignored == 1


def test_ro6_a_refused_connection_that_never_finishes_still_ends_before_its_cap() -> None:
    ctl = confirmed()
    ctl.handle_timer(AFTER)
    ctl.approve_answered("rollover-1", False, None, AFTER)
    ctl.items_pending("conn-1", HARD - 1 * S)
    ctl.handle_timer(HARD)
    ctl.actions()
    ends = (OPTS.hard_stop_ms + CAP_MS) // 2 * MS
    assert ctl.next_deadline() == ends
    ctl.handle_timer(ends)
    assert ctl.actions() == [
        EndSession("approve_refused", goodbye=True),
        CloseTransport("conn-1", "approve_refused"),
    ]


def test_ro7_connections_are_authorised_by_string_id_and_a_refusal_opens_nothing() -> None:
    ctl = confirmed()
    ctl.handle_timer(AFTER)
    ctl.approve_answered("rollover-1", True, None, AFTER)
    assert ctl.actions() == [ApproveRollover("rollover-1", "conn-1", "conn-2"), AuthorizeConnection("conn-2")]
    ctl.authorize_answered("conn-3", True, AFTER + 1)  # not the one asked about
    assert ctl.status()["stage"] == "authorizing" and ctl.stats.late_answers == 1
    ctl.authorize_answered("conn-2", False, AFTER + 2)
    utterance(ctl, ("conn-1",), AFTER + 1 * S, AFTER + 2 * S)
    ctl.handle_timer(DEADLINE)
    assert ctl.actions() == [] and ctl.status()["refusal"] == "authorize_refused"
    ctl.items_finished("conn-1", HARD - 1)
    ctl.handle_timer(HARD)
    assert ctl.actions() == [
        StopInput("conn-1"),
        EndSession("authorize_refused", goodbye=True),
        CloseTransport("conn-1", "authorize_refused"),
    ]


def test_ro7_ids_follow_the_first_connection_id() -> None:
    ctl = RolloverController("call-7f3a")
    ctl.connection_confirmed("call-7f3a", 0)
    ctl.handle_timer(AFTER)
    assert ctl.actions() == [ApproveRollover("rollover-1", "call-7f3a", "call-7f3a-2")]


def test_ro8_one_speaker_and_the_floor_moves_only_after_the_old_stopped_and_finished() -> None:
    ctl, t = in_overlap()
    assert ctl.speaker() == "conn-1"
    utterance(ctl, ("conn-1", "conn-2"), t + 1 * S, t + 2 * S)  # both answer in their heads; one speaks
    ctl.handle_timer(t + 3 * S)
    assert ctl.actions() == [StopInput("conn-1")]
    ctl.items_finished("conn-2", t + 4 * S)  # the new one's readiness does not move the floor
    assert ctl.actions() == [] and ctl.speaker() == "conn-1"
    ctl.items_pending("conn-1", t + 4 * S)
    ctl.items_finished("conn-1", t + 6 * S)
    assert ctl.actions() == [TakeFloor("conn-2"), CloseTransport("conn-1", "rollover")]
    assert ctl.speaker() == "conn-2"


class Call:
    """A caller who talks 4 s of every 6 s, providers that answer each utterance in 2 s, a prompt host."""

    def __init__(self, options: RolloverOptions | None = None) -> None:
        self.ctl = RolloverController("conn-1", options)
        self.queue: list[tuple[int, int, Callable[[int], None]]] = []
        self.seq = 0
        self.confirmed: dict[str, int] = {}
        self.closed: dict[str, int] = {}
        self.floors: list[str] = []
        self.emitted: list[str] = []
        self.spoken: list[str] = []
        self.log: list[tuple[int, object]] = []
        self.later(0, lambda now: self.confirm("conn-1", now))
        self.later(0, lambda now: self.speak(0, now))

    def later(self, at: int, fn: Callable[[int], None]) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (at, self.seq, fn))

    def confirm(self, cid: str, now: int) -> None:
        self.confirmed.setdefault(cid, now)
        self.ctl.connection_confirmed(cid, now)

    def speak(self, k: int, now: int) -> None:
        heard = set(self.ctl.audio_targets())
        for cid in heard:
            self.ctl.speech_started(cid, now // MS, now)
        self.later(now + 4 * S, lambda t: self.stop(k, now, heard, t))
        self.later(now + 6 * S, lambda t: self.speak(k + 1, t))

    def stop(self, k: int, began: int, heard: set[str], now: int) -> None:
        text = f"u{k}"
        self.spoken.append(text)
        receiving = set(self.ctl.audio_targets())
        for cid in heard & receiving:
            self.ctl.speech_stopped(cid, now // MS, now)
            self.later(now + 2 * S, lambda t, c=cid: self.ctl.items_finished(c, t))
        for cid in heard | receiving:
            self.later(
                now + 300 * MS, lambda t, c=cid: self.ctl.transcript(c, began // MS, now // MS, text, True, t)
            )

    def react(self, now: int) -> None:
        for action in self.ctl.actions():
            self.log.append((now, action))
            match action:
                case ApproveRollover(rollover_id=rid):
                    self.later(now + 200 * MS, lambda t, r=rid: self.ctl.approve_answered(r, True, None, t))
                case AuthorizeConnection(connection_id=cid):
                    self.later(now + 100 * MS, lambda t, c=cid: self.ctl.authorize_answered(c, True, t))
                case OpenRollover(connection_id=cid):
                    self.later(now + 400 * MS, lambda t, c=cid: self.confirm(c, t))
                case CloseTransport(connection_id=cid):
                    self.closed[cid] = now
                case TakeFloor(connection_id=cid):
                    self.floors.append(cid)
                case EmitUtterance(text=text):
                    self.emitted.append(text)
                case EndSession():
                    pytest.fail(f"the call ended: {action}")

    def run(self, until: int) -> None:
        for _ in range(200_000):
            timer = self.ctl.next_deadline()
            event = self.queue[0][0] if self.queue else None
            now = min(t for t in (timer, event) if t is not None)
            if now > until:
                return
            if timer is not None and timer == now and (event is None or timer <= event):
                self.ctl.handle_timer(now)
                assert self.ctl.next_deadline() is None or self.ctl.next_deadline() > now  # progress
            else:
                heapq.heappop(self.queue)[2](now)
            self.react(now)
            assert 1 <= len(self.ctl.audio_targets()) <= 2 and self.ctl.speaker() not in self.closed
        pytest.fail("the simulation did not reach its end")


def test_ro9_a_three_hour_call_rolls_over_three_times_each_before_the_cap() -> None:
    call = Call()
    three_hours = 3 * 3_600 * S
    call.run(three_hours)
    assert call.ctl.stats.rollovers == 3 and call.floors == ["conn-2", "conn-3", "conn-4"]
    assert sorted(call.closed) == ["conn-1", "conn-2", "conn-3"] and call.ctl.speaker() == "conn-4"
    for cid, closed_at in call.closed.items():
        age_ms = (closed_at - call.confirmed[cid]) // MS
        assert OPTS.after_ms < age_ms < CAP_MS, (cid, age_ms)
    # every utterance reached the application exactly once, though the overlaps transcribed some twice
    heard = [u for u in call.spoken if int(u[1:]) * 6 * S + 4_300 * MS <= three_hours]
    assert Counter(call.emitted) == Counter(heard) and call.ctl.stats.duplicates_dropped >= 3
    requests = [a for _, a in call.log if isinstance(a, ApproveRollover)]
    assert [r.rollover_id for r in requests] == ["rollover-1", "rollover-2", "rollover-3"]
    assert [a.connection_id for _, a in call.log if isinstance(a, AuthorizeConnection)] == [
        "conn-2",
        "conn-3",
        "conn-4",
    ]
    starts = {a.connection_id: t for t, a in call.log if isinstance(a, StartInput)}
    stops = {a.connection_id: t for t, a in call.log if isinstance(a, StopInput)}
    floors = {a.connection_id: t for t, a in call.log if isinstance(a, TakeFloor)}
    for old, new in (("conn-1", "conn-2"), ("conn-2", "conn-3"), ("conn-3", "conn-4")):
        assert stops[old] - starts[new] >= OPTS.overlap_ms * MS  # RO2: both heard the caller long enough
        assert floors[new] >= stops[old]  # RO8


def test_ro9_options_scale_from_the_provider_cap() -> None:
    assert RolloverOptions.for_cap(3_600_000) == RolloverOptions()
    xai = RolloverOptions.for_cap(7_200_000)  # xAI configured to 120 minutes
    assert (xai.after_ms, xai.deadline_ms, xai.hard_stop_ms) == (6_600_000, 6_960_000, 7_140_000)
    gemini = RolloverOptions.for_cap(600_000, client_commits=True)
    assert (gemini.after_ms, gemini.hard_stop_ms, gemini.overlap_ms, gemini.client_commits) == (
        550_000,
        595_000,
        3_000,
        True,
    )
    with pytest.raises(ValueError):
        RolloverOptions(after_ms=3_500_000, deadline_ms=3_480_000)
    with pytest.raises(ValueError):
        RolloverOptions(hard_stop_ms=3_600_000)


@pytest.mark.parametrize("old_first", [True, False])
def test_ro3_an_utterance_cut_by_the_hard_stop_commit_is_emitted_once(old_first: bool) -> None:
    ctl = confirmed()
    ctl.speech_started(
        "conn-1", 0, DEADLINE - 1 * S
    )  # the caller talks through the deadline and the hard stop
    assert allow(ctl, DEADLINE) == [OpenRollover("conn-2")]
    ctl.connection_confirmed("conn-2", HARD - 1 * S)
    ctl.speech_started("conn-2", 0, HARD - 900 * MS)  # the new one hears the rest of the utterance
    ctl.handle_timer(HARD)
    assert ctl.actions() == [StartInput("conn-2"), CommitInput("conn-1"), StopInput("conn-1")]  # RO2
    old = (
        "conn-1",
        (DEADLINE - 1 * S) // MS,
        HARD // MS,
        "I would like to change",
    )  # committed mid-utterance
    new = ("conn-2", (HARD - 900 * MS) // MS, (HARD + 2 * S) // MS, "change my booking please")
    for cid, start, end, text in (old, new) if old_first else (new, old):
        ctl.transcript(cid, start, end, text, True, HARD + 3 * S)
    emitted = [a for a in ctl.actions() if isinstance(a, EmitUtterance)]
    assert emitted == [EmitUtterance(*old)] and ctl.stats.duplicates_dropped == 1  # once, from the old one


def test_ro3_a_shared_utterance_still_unsettled_when_the_next_rollover_opens_is_emitted_once() -> None:
    """The fault campaign's duplicate: the old connection emitted an utterance both heard, the new one's text of
    it was late, and the next rollover opened first (the new one is old enough at once): not emitted again."""
    o = RolloverOptions(
        after_ms=6_000, deadline_ms=9_000, overlap_ms=3_000, hard_stop_ms=14_000, cap_ms=15_000
    )
    ctl = confirmed(o)
    assert allow(ctl, 6 * S) == []
    utterance(ctl, ("conn-1",), 6_200 * MS, 7 * S)
    assert ctl.actions() == [OpenRollover("conn-2")]
    ctl.connection_confirmed("conn-2", 7_100 * MS)
    assert ctl.actions() == [StartInput("conn-2")]
    utterance(ctl, ("conn-1", "conn-2"), 7_500 * MS, 9 * S)
    ctl.transcript("conn-1", 7_500, 9_000, "Order forty-two.", True, 9_300 * MS)
    assert ctl.actions() == [EmitUtterance("conn-1", 7_500, 9_000, "Order forty-two.")]
    ctl.handle_timer(10_100 * MS)
    ctl.items_finished("conn-1", 10_200 * MS)
    assert ctl.actions() == [StopInput("conn-1"), TakeFloor("conn-2"), CloseTransport("conn-1", "rollover")]
    ctl.handle_timer(13_100 * MS)  # conn-2 is older than after_ms: the next rollover
    assert ctl.actions() == [ApproveRollover("rollover-2", "conn-2", "conn-3")]
    ctl.approve_answered("rollover-2", True, None, 13_100 * MS)
    ctl.authorize_answered("conn-3", True, 13_100 * MS)
    ctl.speech_stopped("conn-2", 13_150, 13_150 * MS)
    assert ctl.actions() == [AuthorizeConnection("conn-3"), OpenRollover("conn-3")]
    ctl.transcript("conn-2", 7_520, 9_010, "order forty two", True, 13_200 * MS)  # the late text
    assert ctl.actions() == [] and ctl.stats.duplicates_dropped == 1
    ctl.transcript("conn-2", 11_000, 12_500, "And the invoice.", True, 13_300 * MS)  # its own utterance
    assert ctl.actions() == [EmitUtterance("conn-2", 11_000, 12_500, "And the invoice.")]
