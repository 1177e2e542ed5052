"""Seams S2 and S6 (DESIGN §14) through the session coordinator on virtual time, with the rollover suite's call.

S2: one caller request dispatches at most one job, whichever connection asks for it and when — a response a
connection began while it was a listener (an answer to an utterance the previous connection heard too) is
never dispatched; its calls are answered "handled by the previous connection" and kept in the ledger.
S6: after the caller hung up (or the session ended), nothing is opened, authorised or funded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from bridge.engine.coordinator import (
    ApproveRollover,
    AuthorizeConnection,
    CloseTransport,
    CommitInput,
    EndSession,
    OpenReplacement,
    OpenRollover,
    RolloverChanged,
)
from bridge.engine.delegations import DeliverResult, DispatchJob, JobChanged
from providers.events import (
    AudioReceived,
    InputTranscript,
    ProviderError,
    ProviderEvent,
    ResponseDone,
    SessionClosed,
    SessionStarted,
    SpeechStarted,
    ToolCallRequested,
)
from rtp.audio import PCMU_8K
from tests.support.rollover_session import SCALED, RolloverCall
from tests.support.session_engine import GPT_LIVE_CAPS, REALTIME, TICK, pcmu_tone

BOOK = ("book_table", '{"party": 4, "time": "19:30"}')


def dispatched(call: RolloverCall) -> list[str]:
    return [c.request.job_id for c in call.commands if isinstance(c, DispatchJob)]


def answers(call: RolloverCall, call_id: str) -> list[DeliverResult]:
    return [c for c in call.commands if isinstance(c, DeliverResult) and c.call_id == call_id]


def ask(call: RolloverCall, token: int, call_id: str) -> None:
    """Connection `token` asks for the table (Realtime: the call comes at the end of its response)."""
    call.core.provider_event(ToolCallRequested(token, call_id, *BOOK), call.now)
    call._carry_out()


def done(call: RolloverCall, token: int) -> None:
    call.core.provider_event(ResponseDone(token), call.now)
    call._carry_out()


@contextmanager
def the_old_connections_text_withheld(call: RolloverCall) -> Iterator[None]:
    """Connection 1's caller text does not come meanwhile: the next one's text waits for it (RO3)."""
    heard = call.core.provider_event

    def heard_but_text(event: ProviderEvent, now: int) -> None:
        if event.token != 1 or not isinstance(event, InputTranscript):
            heard(event, now)

    call.core.provider_event = heard_but_text  # type: ignore[method-assign]
    try:
        yield
    finally:
        call.core.provider_event = heard  # type: ignore[method-assign]


def shared_request_answered_by_both(call: RolloverCall, *, hard_stop: bool, talking_on: bool = False) -> int:
    """The caller asks for a table while both connections hear them; the old one's reply is a tool call whose
    `ResponseDone` moves the floor; then the next connection's own call for the same request arrives (its
    response began while it was a listener). Returns the next connection's token. `talking_on`: the caller
    does not stop (the old one's hard-stop commit took the first part of the sentence)."""
    opening = call.talk_until_a_rollover_opens()
    call.utterance += 1
    if hard_stop:  # RO2: the caller talks through the hard stop; the old one's buffer is committed
        while not any(isinstance(c, CommitInput) for c in call.commands):
            call.step(True)
        call.step(True, 10)
    else:
        call.step(True, 50)
    call.step(talking_on)  # both connections' end of speech (or more of it): each answers the request
    assert call.core.token == 1 and opening.token in call.core.connections.listeners
    ask(call, 1, "call_old")
    done(call, 1)  # the old one's reply ends in the tool call: it has nothing left to play
    assert call.core.token == opening.token  # the floor moved (RO8)
    ask(call, opening.token, "call_new")  # the next connection's call for the same request
    done(call, opening.token)
    return opening.token


def test_s2_a_request_both_connections_heard_dispatches_one_job_when_the_old_ones_tool_turn_moves_the_floor() -> (
    None
):
    call = RolloverCall()
    new = shared_request_answered_by_both(call, hard_stop=False)
    assert dispatched(call) == ["job-1"]  # the old connection's call only
    [answer] = answers(call, "call_new")
    assert answer.token == new and "previous connection" in json.loads(answer.output)["error"]
    # a redelivery of the call is answered the same, from the ledger, never dispatched
    ask(call, new, "call_new")
    assert (
        dispatched(call) == ["job-1"] and [a.output for a in answers(call, "call_new")] == [answer.output] * 2
    )
    jobs = call.core.status(call.now)["delegations"]
    assert jobs["dispatched"] == 1 and jobs["jobs"].get("handled_before") == 1


def test_s2_a_request_both_connections_heard_dispatches_one_job_after_the_hard_stop_commit() -> None:
    call = RolloverCall()
    new = shared_request_answered_by_both(call, hard_stop=True)
    assert dispatched(call) == ["job-1"]
    [answer] = answers(call, "call_new")
    assert answer.token == new and "previous connection" in answer.output


def test_s2_the_tail_a_replacement_hears_of_the_shared_request_dispatches_no_second_job() -> None:
    """The caller talks through the old connection's hard stop, whose commit of the first part of the sentence
    is answered with a tool call: one job. The floor moves to the next connection, which is lost while the
    same sentence goes on; the replacement, ready mid-sentence, reports a speech start at its first frame,
    hears the tail and asks for the tool again. A tail is not a fresh turn (HR10, HR13: bridge/engine/recovery.py):
    its call is held, then not run and the model told to ask again at the caller's next turn (HR7) — the
    caller's one request dispatched one job."""
    call = RolloverCall()
    new = shared_request_answered_by_both(call, hard_stop=True, talking_on=True)
    assert dispatched(call) == ["job-1"]
    call.step(True, 5)  # the sentence goes on
    call.core.provider_event(SessionClosed(new, "connection lost", finalized=False), call.now)
    call._carry_out()
    [replacement] = [c for c in call.commands if isinstance(c, OpenReplacement)]
    call.step(True, 10)  # discarded while the replacement connects (HR8)
    call.open = {replacement.token}
    call.core.provider_event(SessionStarted(replacement.token, "sess_r"), call.now)
    call._carry_out()
    call.step(True, 10)  # its speech start at its first frame, then the tail
    call.step(False)  # its end of speech
    ask(call, replacement.token, "call_tail")
    assert dispatched(call) == ["job-1"] and not answers(call, "call_tail")  # held (HR10)
    call.step(False, 25)
    call.turn()  # the caller's next, fresh turn: the tail's call is not run, the model is told to ask again
    [stale] = answers(call, "call_tail")
    assert stale.token == replacement.token and "not run" in stale.output
    assert dispatched(call) == ["job-1"]


def test_s2_the_next_connections_calls_are_work_again_from_the_callers_first_utterance_after_the_old_one_stopped_hearing() -> (
    None
):
    call = RolloverCall()
    new = shared_request_answered_by_both(call, hard_stop=False)
    call.turn()  # the caller's next request: only the new connection heard it
    ask(call, new, "call_next")
    assert len(dispatched(call)) == 2 and not answers(call, "call_next")  # (job-2: the shared request's echo)


def test_s2_a_response_under_way_when_the_caller_speaks_again_still_answers_the_shared_request() -> None:
    """The next connection's response to the shared request is still streaming when the caller starts a new
    utterance (the local detector, or a provider's speech start, can come first): its call, arriving after that
    start but before the response ends, is not new work; the response's end settles it."""
    call = RolloverCall()
    opening = call.talk_until_a_rollover_opens()
    call.utterance += 1
    call.step(True, 50)
    call.step(False)
    ask(call, 1, "call_old")
    done(call, 1)
    new = opening.token
    assert call.core.token == new
    call.core.provider_event(AudioReceived(new, pcmu_tone(200), PCMU_8K, "resp_shared"), call.now)
    call.step(False, 5)
    call.core.provider_event(SpeechStarted(new, None, "u-fresh"), call.now)  # the caller speaks again
    call._carry_out()
    ask(call, new, "call_late")  # the shared response's call, late
    done(call, new)
    assert dispatched(call) == ["job-1"] and "previous connection" in answers(call, "call_late")[0].output


def test_s2_an_utterance_the_old_connection_never_heard_as_one_is_the_next_ones_work() -> None:
    """The caller began just before the old connection stopped hearing, too briefly for its detector to report
    it: the old one never commits or answers it. The next connection reports the start afterwards, stamped a
    moment before the stop (Realtime's audio_start_ms): by when it was reported it is its own work."""
    call = RolloverCall(replace(SCALED, overlap_ms=2_000))
    opening = call.talk_until_a_rollover_opens()
    call.step(False, 35)
    new, heard = opening.token, call.core.provider_event

    def starts_unreported(event: ProviderEvent, now: int) -> None:
        if not isinstance(event, SpeechStarted):
            heard(event, now)

    call.core.provider_event = starts_unreported  # type: ignore[method-assign]
    call.utterance += 1
    while call.core.connections.audio_targets != (new,):  # the old one stops hearing at the overlap's end
        call.step(True)
    call.core.provider_event = heard  # type: ignore[method-assign]
    stopped_ms = call.core.timeline.ms(call.now)
    origin = call.core.timeline._origins[new][0]
    call.step(True, 5)
    call.core.provider_event(SpeechStarted(new, stopped_ms - 200 - origin, "u-late"), call.now)
    call.step(True, 20)
    call.step(False)
    ask(call, new, "call_own")
    assert dispatched(call) and not answers(call, "call_own")


def test_s2_a_listeners_tool_call_is_answered_handled_by_the_previous_connection_and_never_played() -> None:
    call = RolloverCall()
    opening = call.talk_until_a_rollover_opens()
    depth = call.playout.depth
    ask(call, opening.token, "call_listener")
    [answer] = answers(call, "call_listener")  # answered, not left unanswered
    assert answer.token == opening.token and "previous connection" in answer.output
    assert not dispatched(call)
    # what the listener says in reply is never played
    call.core.provider_event(AudioReceived(opening.token, pcmu_tone(300), PCMU_8K, "reply"), call.now)
    assert call.playout.depth == depth
    changed = [n for n in call.notices if isinstance(n, JobChanged) and n.state == "handled_before"]
    assert len(changed) == 1


def test_s2_the_old_connections_call_after_it_handed_the_floor_over_is_the_one_job() -> None:
    """The old connection's audio was all played, so the floor moved before its call came (Realtime sends a
    function call after the audio of its response) while it listens on for its text (RO3): the old one heard
    the request and asks for it — one job, its result for the floor; the next connection's call is the echo."""
    call = RolloverCall(replace(SCALED, overlap_ms=2_000))
    opening = call.talk_until_a_rollover_opens()
    call.step(False, 35)  # (a pause longer than match_slack_ms: the next utterance is another one, RO3)
    with the_old_connections_text_withheld(call):
        call.utterance += 1
        call.step(True, 50)
        call.step(False)
    call.core.provider_event(AudioReceived(1, pcmu_tone(200), PCMU_8K, "resp_old"), call.now)
    call.step(False, 30)  # played out: the old connection holds no items, the floor moves
    assert call.core.token == opening.token and 1 in call.core.connections.listeners
    ask(call, 1, "call_old")
    ask(call, opening.token, "call_new")
    assert len(dispatched(call)) == 1 and not answers(call, "call_old")
    assert "previous connection" in answers(call, "call_new")[0].output


def test_s2_a_recovery_during_the_overlap_leaves_the_replacements_calls_to_hr10() -> None:
    """A recovery quarantines the rollover's connections; the replacement's calls follow HR10 (held until the
    caller's fresh interval), not the rollover's rule: the caller's fresh request dispatches."""
    call = RolloverCall()
    opening = call.talk_until_a_rollover_opens()
    call.core.provider_event(SessionClosed(1, "connection_lost", finalized=False), call.now)
    call._carry_out()
    [replacement] = [c for c in call.commands if isinstance(c, OpenReplacement)]
    assert replacement.token not in (1, opening.token)
    call.open = {replacement.token}
    call.core.provider_event(SessionStarted(replacement.token, "sess_r"), call.now)
    call._carry_out()
    call.turn()
    ask(call, replacement.token, "call_after_repair")
    assert len(dispatched(call)) == 1 and not answers(call, "call_after_repair")


def test_s2_a_second_rollover_keeps_the_rule_for_its_own_next_connection() -> None:
    call = RolloverCall()
    shared_request_answered_by_both(call, hard_stop=False)
    for _ in range(20):
        call.turn()
        if call.core.status(call.now)["rollover"]["rollovers"] >= 1 and any(
            isinstance(c, OpenRollover) and c.token > 2 for c in call.commands
        ):
            break
    [second] = [c for c in call.commands if isinstance(c, OpenRollover) and c.token > 2][:1]
    ask(call, second.token, "call_second_listener")
    assert "previous connection" in answers(call, "call_second_listener")[0].output
    assert dispatched(call) == ["job-1"]


def test_s2_gpt_live_delegations_stamped_before_the_fresh_utterance_are_not_new_work() -> None:
    """GPT-Live names when it delegated (`at_ms`): a delegation of the next connection stamped before the
    caller's first utterance after the old one stopped hearing is an answer to a shared one."""
    call = RolloverCall(capabilities=GPT_LIVE_CAPS)
    opening = call.talk_until_a_rollover_opens()
    for _ in range(200):
        if call.core.token == opening.token:
            break
        call.step(False)
    assert call.core.token == opening.token
    stamped = call.core.timeline.ms(call.now) - 100
    call.turn()  # the caller's fresh request (the local detector)
    origin = call.core.timeline._origins[opening.token][0]
    call.core.provider_event(
        ToolCallRequested(opening.token, "d_old", "lookup", "{}", "delegation", at_ms=stamped - origin),
        call.now,
    )
    call.core.provider_event(
        ToolCallRequested(opening.token, "d_new", "lookup", "{}", "delegation", at_ms=None), call.now
    )
    call._carry_out()
    assert "previous connection" in answers(call, "d_old")[0].output
    assert len(dispatched(call)) == 1 and not answers(call, "d_new")


# --- S6: after the caller hung up, nothing is opened, authorised or funded ---------------------------------


class HeldAnswers(RolloverCall):
    """The application's approve and authorise answers are held: the test gives them (`approve`, `authorize`:
    the core's own methods)."""

    def __init__(self) -> None:
        super().__init__()
        self.approve, self.authorize = self.core.rollover_approved, self.core.connection_authorized
        self.core.rollover_approved = lambda *answer: None  # type: ignore[method-assign]
        self.core.connection_authorized = lambda *answer: None  # type: ignore[method-assign]


FUNDING = (ApproveRollover, AuthorizeConnection, OpenRollover, OpenReplacement)


def funding_after(call: RolloverCall, mark: int) -> list[object]:
    return [c for c in call.commands[mark:] if isinstance(c, FUNDING)]


def until_asked(call: RolloverCall) -> ApproveRollover:
    for _ in range(10):
        call.turn(talk_ms=1_000, pause_ms=200)
        if asked := [c for c in call.commands if isinstance(c, ApproveRollover)]:
            return asked[0]
    raise AssertionError("no approve question")


def test_s6_an_approval_answered_after_the_hang_up_authorises_and_opens_nothing() -> None:
    call = HeldAnswers()
    asked = until_asked(call)
    call.core.call_ended(call.now)
    mark = len(call.commands)
    call.approve(asked.rollover_id, True, None, call.now)
    call._carry_out()
    call.step(False, 200)  # the close window: the deadline and hard stop pass
    assert funding_after(call, mark) == []
    assert call.core.rollover.stats.late_answers == 1
    # nor is a rollover refused, nor the session ended again, for a call that is over
    assert not [c for c in call.commands[mark:] if isinstance(c, EndSession)]
    assert not [n for n in call.notices if isinstance(n, RolloverChanged) and n.what == "refused"]


def test_s6_an_authorisation_answered_after_the_hang_up_opens_nothing() -> None:
    call = HeldAnswers()
    asked = until_asked(call)
    call.approve(asked.rollover_id, True, None, call.now)
    call._carry_out()
    [authorize] = [c for c in call.commands if isinstance(c, AuthorizeConnection)]
    call.core.call_ended(call.now)
    mark = len(call.commands)
    call.authorize(authorize.connection_id, True, call.now)
    call._carry_out()
    call.step(False, 200)
    assert funding_after(call, mark) == []
    assert call.core.rollover.stats.late_answers == 1


def test_s6_after_the_sessions_own_end_session_answers_open_nothing() -> None:
    call = HeldAnswers()
    asked = until_asked(call)
    call.core.provider_event(ProviderError(1, "invalid_audio", "odd PCM16 length", fatal=True), call.now)
    call._carry_out()
    assert [c for c in call.commands if isinstance(c, EndSession)]
    mark = len(call.commands)
    call.approve(asked.rollover_id, True, None, call.now)
    call._carry_out()
    call.step(False, 200)
    assert funding_after(call, mark) == []


def test_s6_a_listener_open_at_the_hang_up_is_closed() -> None:
    call = RolloverCall()
    opening = call.talk_until_a_rollover_opens()
    call.core.call_ended(call.now)
    call._carry_out()
    assert CloseTransport(opening.connection_id, "call_ended") in call.commands
    assert opening.token not in call.core.connections.listeners
    mark = len(call.commands)
    call.step(False, 300)
    assert funding_after(call, mark) == []
    assert any(isinstance(n, RolloverChanged) and n.what == "abandoned" for n in call.notices)


def test_s6_no_replacement_is_opened_after_the_hang_up() -> None:
    """A recovery under way when the caller hangs up: the provider's refusal of the resumption handle (which
    would reopen the replacement, reseeded) opens nothing, nor does a later condition or lost connection."""
    call = RolloverCall()
    call.turn()
    call.core.provider_event(SessionClosed(1, "connection_lost", finalized=False), call.now)
    call._carry_out()
    [replacement] = [c for c in call.commands if isinstance(c, OpenReplacement)]
    call.core.call_ended(call.now)
    mark = len(call.commands)
    call.core.resumption_rejected(replacement.token, call.now)
    call._carry_out()
    call.now += 10 * TICK
    call.core.handle_timer(call.now)
    call._carry_out()
    assert funding_after(call, mark) == []
    assert call.core.recovery.reconnecting  # the recovery was under way, and stays without a new connection


def test_s2_the_old_connections_call_after_its_audio_is_the_one_job_even_with_no_text_to_wait_for() -> None:
    """Realtime sends a function call after the audio of the same response. The old connection's audio is
    played and its text has come, so the floor moves; it is kept open until its ResponseDone, so its call for
    the caller's request still comes and is the one job (closed at the floor's move, its call was lost, and the
    next connection's call, an echo of the shared request, was answered "handled": nobody ran it)."""
    call = RolloverCall(replace(SCALED, overlap_ms=2_000), replace(REALTIME, response_events=True))
    opening = call.talk_until_a_rollover_opens()
    call.step(False, 35)
    call.utterance += 1
    call.step(True, 50)
    call.step(False)
    call.core.provider_event(AudioReceived(1, pcmu_tone(200), PCMU_8K, "resp_old"), call.now)
    call.step(False, 30)  # played out: the floor moves
    assert call.core.token == opening.token
    assert 1 in call.core.connections.listeners  # not closed: its response has not ended
    ask(call, 1, "call_old")
    done(call, 1)
    ask(call, opening.token, "call_new")
    assert len(dispatched(call)) == 1 and not answers(call, "call_old")
    assert any(isinstance(c, CloseTransport) and c.connection_id == "conn-1" for c in call.commands)
