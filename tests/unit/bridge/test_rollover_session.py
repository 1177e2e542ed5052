"""RO1-RO9 through the session coordinator: the rollover controller's actions become commands for the shell,
caller audio reaches every listening connection, one connection speaks, each utterance is emitted once."""

from __future__ import annotations

from dataclasses import replace

from bridge.engine.connections import connection_id
from bridge.engine.coordinator import (
    ApproveRollover,
    CloseTransport,
    CommitInput,
    EndSession,
    OpenRollover,
    Transcript,
)
from bridge.engine.delegations import DeliverResult, DispatchJob, SendContext
from providers.events import (
    AudioReceived,
    InputTranscript,
    ProviderEvent,
    SessionClosed,
    ToolCallRequested,
)
from rtp.audio import PCMU_8K
from tests.support.rollover_session import SCALED, ClientCommitCall, RolloverCall
from tests.support.session_engine import GPT_LIVE_CAPS, MS, REALTIME, TICK, pcmu_tone


def test_ro9_five_rollovers_keep_one_speaker_and_emit_each_utterance_once() -> None:
    call = RolloverCall()
    for _ in range(20):  # 50 s of conversation, caps at 8 s
        call.turn()
    opened = [c.token for c in call.commands if isinstance(c, OpenRollover)]
    closed = [c.token for c in call.commands if isinstance(c, CloseTransport)]
    assert len(opened) >= 5 and not [c for c in call.commands if isinstance(c, EndSession)]
    assert closed == sorted(closed) and set(closed) <= {1, *opened}
    finals = [n for n in call.notices if isinstance(n, Transcript) and n.role == "caller" and n.final]
    assert [n.text for n in finals] == [f"utterance {i}" for i in range(1, 21)]  # each one exactly once
    assert call.core.status(call.now)["rollover"]["rollovers"] >= 5
    assert all(seeded.snapshot.caller_text for seeded in call.commands if isinstance(seeded, OpenRollover))


def test_ro8_only_the_connection_holding_the_floor_is_played() -> None:
    call = RolloverCall()
    opening = call.talk_until_a_rollover_opens()
    assert call.core.token == 1 and opening.token in call.open  # the next one listens, the first one speaks
    before = call.playout.depth
    call.core.provider_event(AudioReceived(opening.token, pcmu_tone(500), PCMU_8K, "listener_item"), call.now)
    assert call.playout.depth == before and call.core.rollover.listener_audio_bytes == 4_000  # never played
    call.core.provider_event(AudioReceived(1, pcmu_tone(500), PCMU_8K, "speaker_item"), call.now)
    assert call.playout.depth > before  # the speaker's audio is


def test_ro6_a_refused_approval_ends_the_call_with_a_goodbye_at_the_hard_stop() -> None:
    call = RolloverCall()
    original = call._carry_out

    def refuse() -> None:
        for command in call.core.commands():
            if isinstance(command, ApproveRollover):
                call.core.rollover_approved(command.rollover_id, False, None, call.now)
            call.commands.append(command)
        call.notices += call.core.notices()

    call._carry_out = refuse  # type: ignore[method-assign]
    for _ in range(4):
        call.turn()
    call._carry_out = original  # type: ignore[method-assign]
    call.step(False, 100)
    ended = [c for c in call.commands if isinstance(c, EndSession)]
    assert ended and ended[0].goodbye and not ended[0].failed and "approve_refused" in ended[0].reason
    assert not [c for c in call.commands if isinstance(c, OpenRollover)]
    assert call.now >= 7_000 * MS


def test_ro1_an_announced_expiry_sooner_than_the_cap_drives_the_rollover_early() -> None:
    call = RolloverCall()
    call.core.connection_expires(1, 3_000, call.now)  # GPT-Live's expires_at: 3 s left, far below the 8 s cap
    call.turn(talk_ms=1_000, pause_ms=600)
    assert [c for c in call.commands if isinstance(c, OpenRollover)]  # opened at the first end of speech
    late = RolloverCall()
    late.core.connection_expires(1, 7_900, late.now)  # about the cap: the configured ages stand
    late.turn(talk_ms=1_000, pause_ms=600)
    assert not [c for c in late.commands if isinstance(c, OpenRollover)]


def test_ro8_the_next_connection_resumes_by_handle_only_where_the_provider_honours_one_beside_the_open_one() -> (
    None
):
    """Gemini rejects a resumption handle while the connection that issued it is open, which a
    rollover's next connection always is; asking anyway cost a refused handshake and a reseeded one, and the
    campaign lost two calls to RO6's hard stop. The next connection is reseeded at once (RO8) unless the
    provider resumes beside an open connection; a recovery's replacement still resumes (the old one is gone)."""
    from providers.events import ResumptionUpdated

    resumable = replace(REALTIME, resumption=True)  # Gemini's: resumption, not while the old one is open
    for caps, handle in ((resumable, None), (replace(resumable, resumption_while_open=True), "handle-1")):
        call = RolloverCall(capabilities=caps)
        call.core.provider_event(ResumptionUpdated(1, "handle-1", True), 0)
        opening = call.talk_until_a_rollover_opens()
        assert (
            opening.resume_handle == handle and opening.snapshot.caller_text
        )  # seeded with the caller's text


# --- RO5: client commits (turn detection off), through the coordinator on virtual time ---------------------


def test_ro5_client_commits_switch_at_the_first_flush_after_after_ms_and_never_overlap() -> None:
    call = ClientCommitCall()
    for _ in range(6):
        call.turn()
    [opened] = [c for c in call.commands if isinstance(c, OpenRollover)][
        :1
    ]  # passive, opened once authorised
    assert opened.token == 2
    assert all(len(targets) == 1 for targets in call.receiving)  # the connections never overlap (RO5)
    switch = next(i for i, targets in enumerate(call.receiving) if targets == (2,))
    assert all(targets == (1,) for targets in call.receiving[:switch])
    first_flush = min(t for t in call.commit_times[1] if t >= 4_000 * MS)  # the first flush after after_ms
    assert call.frame_times[switch - 1] <= first_flush < call.frame_times[switch]
    assert max(call.commit_times[1]) == first_flush  # the old one's last turn was committed, then it stopped
    assert call.core.token == 2 and CloseTransport("conn-1", "rollover") in call.commands
    finals = [n.text for n in call.notices if isinstance(n, Transcript) and n.role == "caller" and n.final]
    assert finals == [f"utterance {i}" for i in range(1, call.utterance + 1)]  # each once, none lost


def test_ro5_client_commits_without_a_flush_commit_and_switch_at_deadline_ms() -> None:
    call = ClientCommitCall()
    call.turn()
    call.step(True, (6_000 * MS - call.now) // TICK + 10)  # the caller talks through after_ms and deadline_ms
    commits = [c.token for c in call.commands if isinstance(c, CommitInput)]
    assert commits == [1, 1]  # the first turn's, then the deadline's commit of the old connection
    assert call.receiving[-1] == (2,) and all(len(targets) == 1 for targets in call.receiving)


def test_ro8_a_tool_call_pending_across_a_rollover_is_answered_once_on_the_new_connection() -> None:
    call = RolloverCall()
    call.core.provider_event(ToolCallRequested(1, "call_r", "lookup_order", '{"order_id": "42"}'), call.now)
    call._carry_out()
    [job] = [c.request for c in call.commands if isinstance(c, DispatchJob)]
    while call.core.token == 1:  # the application is slow: the call rolls over meanwhile
        call.turn()
    new = call.core.token
    call.core.provider_event(
        ToolCallRequested(1, "call_r", "lookup_order", "{}"), call.now
    )  # the old one: inert
    assert call.core.job_answered(job.job_id, '{"status": "shipped"}', call.now)
    call._carry_out()
    for _ in range(3):
        call.turn()
    answers = [
        c
        for c in call.commands
        if isinstance(c, (DeliverResult, SendContext))
        and "shipped" in (c.output if isinstance(c, DeliverResult) else c.text)
    ]
    assert len(answers) == 1 and answers[0].token == new  # once, on the connection that holds the floor
    assert (
        isinstance(answers[0], SendContext) and job.job_id in answers[0].text
    )  # the old call id is gone there
    assert len([c for c in call.commands if isinstance(c, DispatchJob)]) == 1  # never dispatched twice


def test_hr11_an_utterance_under_way_when_the_next_connection_fails_keeps_its_session_time() -> None:
    """The fault campaign's utterance "at 0 ms": the rolling-in connection is lost while the caller speaks on
    the floor; the floor's utterance must still be stamped where it began on the session timeline."""
    call = RolloverCall()
    opening = call.talk_until_a_rollover_opens()
    call.utterance += 1
    began_ms = (call.now + TICK) // MS  # the first frame of this utterance
    call.step(True, 10)  # both connections' VAD heard the caller begin
    call.core.provider_event(SessionClosed(opening.token, "connection_lost", finalized=False), call.now)
    call._carry_out()
    call.step(True, 20)
    call.step(False, 10)  # the floor's end of speech and its transcript (no times: the item's speech events)
    assert call.core.token == 1
    [last] = [
        n for n in call.notices if isinstance(n, Transcript) and n.text == f"utterance {call.utterance}"
    ]
    assert last.final and last.at_ms == began_ms and last.end_ms == began_ms + 600


def test_hr11_a_transcript_of_an_utterance_never_timed_is_stamped_when_it_came_never_at_0() -> None:
    call = RolloverCall()
    call.turn()
    call.core.provider_event(InputTranscript(1, "untimed", "item_no_speech_events", final=True), call.now)
    call._carry_out()
    [untimed] = [n for n in call.notices if isinstance(n, Transcript) and n.text == "untimed"]
    assert untimed.at_ms == call.now // MS > 0  # unknown times become "now" (HR11, as Timeline.rebase)


def test_ro3_the_old_connection_lost_while_its_text_is_awaited_lets_the_new_ones_text_stand() -> None:
    """The old connection handed the floor over and is lost before its text of an utterance both heard comes:
    the new connection's text is emitted (RO3 "never arrives"), not dropped with a restarted rollover."""
    call = RolloverCall(
        replace(SCALED, overlap_ms=2_000, transcript_wait_ms=2_000, hard_stop_ms=14_000, cap_ms=16_000)
    )

    def opened() -> bool:
        return any(isinstance(c, OpenRollover) for c in call.commands)

    for _ in range(10):  # turns of 1 s of speech and 1 s of silence, stopped at the frame the next one opens
        call.utterance += 1
        call.step(True, 50)
        for _ in range(50):
            call.step(False)
            if opened():
                break
        if opened():
            break
    assert opened()
    call.step(False, 40)
    heard = call.core.provider_event

    def without_the_old_ones_text(event: ProviderEvent, now: int) -> None:
        if not (isinstance(event, InputTranscript) and event.token == 1):
            heard(event, now)

    call.core.provider_event = without_the_old_ones_text  # type: ignore[method-assign]
    call.utterance += 1
    call.step(True, 50)  # both connections hear it; only the new one's text comes
    call.step(False)
    call.core.provider_event = heard  # type: ignore[method-assign]
    for _ in range(100):
        if call.core.token != 1:
            break
        call.step(False)
    assert call.core.token != 1 and call.core.connections.listeners == {1}  # the old one waits for its text
    call.core.provider_event(SessionClosed(1, "connection_lost", finalized=False), call.now)
    call._carry_out()
    finals = [n.text for n in call.notices if isinstance(n, Transcript) and n.role == "caller" and n.final]
    assert finals == [f"utterance {i}" for i in range(1, call.utterance + 1)]  # the last one, from the new
    call.step(False, 150)
    finals = [n.text for n in call.notices if isinstance(n, Transcript) and n.role == "caller" and n.final]
    assert finals == [f"utterance {i}" for i in range(1, call.utterance + 1)]  # once
    assert CloseTransport(connection_id(1), "rollover") in call.commands


def test_plain_caller_frames_reuse_the_rooms_deadlines_and_the_deadline_is_never_stale() -> None:
    """A caller frame that changed no turn and made no room act moves only the output's deadline, so
    `next_deadline` keeps the other rooms' soonest one; any other input, or a frame after which a room acted,
    reads them again. Checked against every room read afresh after every input of a call with turns the local
    detector finds (GPT-Live: a caller frame ends a turn), rollovers and the provider's announced end."""
    call = RolloverCall(capabilities=GPT_LIVE_CAPS)
    core = call.core
    reads = 0
    rooms_deadline = core.rollover.next_deadline

    def counted() -> int | None:
        nonlocal reads
        reads += 1
        return rooms_deadline()

    core.rollover.next_deadline = counted  # type: ignore[method-assign]
    call.step(False, 50)  # a second of silence: plain frames
    assert reads == 1 and core.next_deadline() == 4_000 * MS  # RO1's after_ms, read once

    def fresh() -> int | None:
        times = [
            core.output.next_deadline(),
            core.recovery.next_deadline(),
            core.timeline.instant(core.delegations.deadline_ms()),
            core.ending.next_deadline(),
            rooms_deadline(),
            core.captions.next_deadline(),
        ]
        return min((t for t in times if t is not None), default=None)

    step = call.step
    checked = 0

    def checked_step(speech: bool, count: int = 1) -> None:
        nonlocal checked
        for _ in range(count):
            step(speech)
            assert core.next_deadline() == fresh()
            checked += 1

    call.step = checked_step  # type: ignore[method-assign]
    for i in range(12):
        call.turn()
        if i == 3:
            core.connection_expires(core.token, 3_000, call.now)  # the provider announces the end
            assert core.next_deadline() == fresh()
    assert checked == 12 * 125 and len([c for c in call.commands if isinstance(c, OpenRollover)]) >= 3
    assert reads < checked // 2  # most frames reused the rooms' deadline


def test_ro9_the_calls_rollover_counts_and_ids_go_on_across_a_failed_next_connection() -> None:
    """A failed next connection (as a recovery) starts a new controller for the floor; the status's count of
    completed rollovers and the ids the approve hook sees are the call's, not restarted at 0 and rollover-1
    (a late answer to the first rollover-1 must not be taken for a second one's)."""
    call = RolloverCall()
    for _ in range(10):
        call.turn()
        if call.core.status(call.now)["rollover"]["rollovers"] >= 1:
            break
    assert call.core.status(call.now)["rollover"]["rollovers"] == 1
    call.commands.clear()
    opening = call.talk_until_a_rollover_opens()
    call.core.provider_event(SessionClosed(opening.token, "connection_lost", finalized=False), call.now)
    call._carry_out()
    assert call.core.status(call.now)["rollover"]["rollovers"] == 1  # one completed, one failed
    for _ in range(10):
        call.turn()
        if call.core.status(call.now)["rollover"]["rollovers"] >= 2:
            break
    ids = [c.rollover_id for c in call.commands if isinstance(c, ApproveRollover)]
    assert ids[:2] == ["rollover-2", "rollover-3"] and len(set(ids)) == len(ids)
    assert call.core.status(call.now)["rollover"]["rollovers"] == 2
