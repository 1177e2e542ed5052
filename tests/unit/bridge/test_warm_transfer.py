"""The warm transfer's state machine (bridge/engine/warm_transfer.py) on virtual time: every outcome, once; and the
join by REFER with Replaces: sent when both sides can, its success, refusal, failed NOTIFY and timeout (the relay
then), the caller hanging up meanwhile, the target's BYE of the leg it replaced."""

from __future__ import annotations

import pytest

from bridge.engine.warm_transfer import (
    ACCEPTED,
    BUSY,
    CALLER_HUNG_UP,
    DECLINED,
    FAILED,
    JOIN_RELAY,
    JOIN_REPLACES,
    NO_ANSWER,
    NO_DECISION,
    REFUSED,
    REPLACED,
    SESSION_ENDED,
    BriefingSpoken,
    BriefTarget,
    CallerHungUp,
    DialTarget,
    DropTarget,
    HangUpCaller,
    HoldCaller,
    JoinLegs,
    Outcome,
    ReferCaller,
    ReferProgress,
    ReleaseCaller,
    SendTargetDigits,
    SessionEnded,
    TargetDigit,
    TargetHungUp,
    TargetProgress,
    WarmAction,
    WarmOptions,
    WarmState,
    WarmTransfer,
    briefing,
)
from rtp.units import NS_PER_MS

MS = NS_PER_MS
TARGET = "sip:agent@pbx.example"


def started(digits: str = "") -> tuple[WarmTransfer, list[WarmAction]]:
    transfer = WarmTransfer(
        TARGET, "brief", 0, WarmOptions(ring_timeout_ms=20_000, accept_timeout_ms=30_000), digits
    )
    return transfer, transfer.start()


def outcomes(actions: list[WarmAction]) -> list[str]:
    return [a.result.outcome for a in actions if isinstance(a, Outcome)]


def answered(transfer: WarmTransfer, now: int = 3_000 * MS) -> list[WarmAction]:
    assert transfer.handle(TargetProgress(180), 1_000 * MS) == []
    assert transfer.state is WarmState.RINGING
    return transfer.handle(TargetProgress(200), now)


def test_start_holds_the_caller_and_dials_with_the_ring_timeout() -> None:
    transfer, actions = started()
    assert actions == [HoldCaller(), DialTarget(TARGET, 20_000)]
    assert transfer.state is WarmState.DIALING and transfer.active
    assert transfer.next_deadline() == 20_000 * MS


def test_accepted_after_the_briefing_joins_the_legs_and_reports_once() -> None:
    transfer, _ = started(digits="123")
    actions = answered(transfer)
    assert actions == [SendTargetDigits("123"), BriefTarget("brief")]
    assert transfer.state is WarmState.BRIEFING and transfer.next_deadline() == 33_000 * MS
    assert transfer.handle(TargetDigit("5"), 4_000 * MS) == []  # other keys are not a decision
    transfer.handle(BriefingSpoken(), 8_000 * MS)
    assert transfer.state.value == "awaiting"
    actions = transfer.handle(TargetDigit("1"), 9_000 * MS)
    assert actions[0] == JoinLegs() and outcomes(actions) == [ACCEPTED]
    result = transfer.result
    assert result is not None and result.transferred and result.status == 200 and result.elapsed_ms == 9_000
    assert not transfer.active and transfer.next_deadline() is None
    assert transfer.handle(TargetDigit("1"), 10_000 * MS) == []  # reported once
    assert transfer.handle_timer(60_000 * MS) == []


def test_acceptance_may_cut_the_briefing_short() -> None:
    transfer, _ = started()
    answered(transfer)
    assert outcomes(transfer.handle(TargetDigit("1"), 3_500 * MS)) == [ACCEPTED]


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(486, BUSY), (600, BUSY), (603, DECLINED), (480, NO_ANSWER), (404, FAILED), (0, FAILED)],
)
def test_a_final_failure_is_undone_with_its_typed_reason_and_status(status: int, outcome: str) -> None:
    transfer, _ = started()
    actions = transfer.handle(TargetProgress(status, "nope"), 2_000 * MS)
    assert actions[0] == ReleaseCaller()  # the target leg is already over: no CANCEL
    assert outcomes(actions) == [outcome]
    assert (
        transfer.result is not None and transfer.result.status == status and not transfer.result.transferred
    )
    assert transfer.state is WarmState.UNDONE and transfer.handle(TargetProgress(200), 3_000 * MS) == []


def test_the_ring_timeout_cancels_the_target_and_releases_the_caller() -> None:
    transfer, _ = started()
    transfer.handle(TargetProgress(180), 1_000 * MS)
    assert transfer.handle_timer(19_999 * MS) == []
    actions = transfer.handle_timer(20_000 * MS)
    assert actions[:2] == [DropTarget(False, "no answer in time"), ReleaseCaller()]
    assert outcomes(actions) == [NO_ANSWER] and transfer.result is not None and transfer.result.status == 180


def test_no_decision_in_time_hangs_up_the_target() -> None:
    transfer, _ = started()
    answered(transfer)
    actions = transfer.handle_timer(33_000 * MS)
    assert actions[:2] == [DropTarget(True, "no decision in time"), ReleaseCaller()]
    assert outcomes(actions) == [NO_DECISION]


@pytest.mark.parametrize("keyed", [False, True])
def test_the_human_refusing_releases_the_caller(keyed: bool) -> None:
    transfer, _ = started()
    answered(transfer)
    if keyed:
        actions = transfer.handle(TargetDigit("2"), 5_000 * MS)
        assert actions[0] == DropTarget(True, "the target refused (keyed)")
    else:
        actions = transfer.handle(TargetHungUp(), 5_000 * MS)
        assert actions[0] == ReleaseCaller()  # it hung up itself: no BYE is sent
    assert ReleaseCaller() in actions and outcomes(actions) == [REFUSED]


@pytest.mark.parametrize("when", ["dialing", "ringing", "briefing"])
def test_the_caller_hanging_up_first_ends_the_target_leg_and_nothing_is_released(when: str) -> None:
    transfer, _ = started()
    if when != "dialing":
        transfer.handle(TargetProgress(180), 1_000 * MS)
    if when == "briefing":
        transfer.handle(TargetProgress(200), 2_000 * MS)
    actions = transfer.handle(CallerHungUp(), 4_000 * MS)
    assert actions[0] == DropTarget(when == "briefing", "the caller hung up first")
    assert ReleaseCaller() not in actions and outcomes(actions) == [CALLER_HUNG_UP]


def test_the_session_ending_otherwise_undoes_the_transfer() -> None:
    transfer, _ = started()
    transfer.handle(TargetProgress(180), 1_000 * MS)
    actions = transfer.handle(SessionEnded("the application ended the call"), 2_000 * MS)
    assert actions[0] == DropTarget(False, "the application ended the call")
    assert outcomes(actions) == [SESSION_ENDED]


def test_once_joined_a_hang_up_of_either_side_ends_the_other_once() -> None:
    transfer, _ = started()
    answered(transfer)
    transfer.handle(TargetDigit("1"), 5_000 * MS)
    assert transfer.handle(TargetHungUp(), 9_000 * MS) == [HangUpCaller("the transfer target hung up")]
    assert transfer.handle(CallerHungUp(), 9_100 * MS) == []
    other, _ = started()
    answered(other)
    other.handle(TargetDigit("1"), 5_000 * MS)
    assert other.handle(CallerHungUp(), 9_000 * MS) == [DropTarget(True, "the caller hung up")]
    assert other.handle(TargetHungUp(), 9_100 * MS) == []


def test_every_path_reports_exactly_one_outcome() -> None:
    """Whatever comes after the outcome (late responses, keys, hang-ups, the timer), none is reported again."""
    late: list[object] = [
        TargetProgress(200),
        TargetProgress(486),
        TargetDigit("1"),
        TargetDigit("2"),
        BriefingSpoken(),
        TargetHungUp(),
        CallerHungUp(),
        SessionEnded("x"),
    ]
    for first in late:
        transfer, _ = started()
        seen = outcomes(transfer.handle(first, 1_000 * MS))  # type: ignore[arg-type]
        seen += outcomes(transfer.handle_timer(40_000 * MS))
        for event in late:
            seen += outcomes(transfer.handle(event, 50_000 * MS))  # type: ignore[arg-type]
        seen += outcomes(transfer.handle_timer(200_000 * MS))
        assert len(seen) == 1, (first, seen)


def test_the_briefing_is_the_brief_or_a_bounded_summary_of_the_utterances() -> None:
    assert briefing("Customer 42 wants a refund", []).endswith(
        "What to tell them: Customer 42 wants a refund"
    )
    said = [("caller", f"line {n}") for n in range(20)] + [("assistant", " ")]
    text = briefing(None, said, limit=3)
    assert "caller: line 19" in text and "line 16" not in text and text.count("caller:") == 2
    assert "a caller is waiting" in briefing(None, [])


# --- the join by REFER with Replaces (RFC 5589 §7) ---
REFER_TO = "sip:human@10.0.0.9:5070?Replaces=abc%401.2.3.4%3Bto-tag%3Dtheirs%3Bfrom-tag%3Dours"
OPTIONS = WarmOptions(
    ring_timeout_ms=20_000, accept_timeout_ms=30_000, join_timeout_ms=8_000, replaced_wait_ms=3_000
)


def joins(actions: list[WarmAction]) -> list[tuple[str, str]]:
    return [(a.result.outcome, a.result.join) for a in actions if isinstance(a, Outcome)]


def accepted(
    *, caller_replaces: bool = True, refer_to: str = REFER_TO
) -> tuple[WarmTransfer, list[WarmAction]]:
    """Answered at 2 s (the target's engine giving `refer_to`), keyed 1 at 5 s."""
    transfer = WarmTransfer("sip:human@pbx", "brief", 0, OPTIONS, caller_replaces=caller_replaces)
    transfer.start()
    assert transfer.handle(TargetProgress(200, refer_to=refer_to), 2_000 * MS) == [BriefTarget("brief")]
    return transfer, transfer.handle(TargetDigit("1"), 5_000 * MS)


def test_acceptance_sends_the_caller_a_refer_with_replaces_and_waits_for_its_outcome() -> None:
    transfer, actions = accepted()
    assert actions == [ReferCaller(REFER_TO)]  # no outcome yet, the caller stays held, nothing relayed
    assert transfer.state is WarmState.JOINING and transfer.active and transfer.answered
    assert transfer.next_deadline() == 13_000 * MS  # join_timeout_ms from the acceptance
    assert transfer.handle(ReferProgress(100, "Accepted", False), 5_100 * MS) == []
    assert transfer.handle(ReferProgress(180, "Ringing", False), 5_200 * MS) == []
    assert transfer.handle(TargetDigit("2"), 5_300 * MS) == []  # the decision is made: keys change nothing
    assert transfer.state is WarmState.JOINING


@pytest.mark.parametrize(("caller_replaces", "refer_to"), [(False, REFER_TO), (True, "")])
def test_without_both_sides_able_the_acceptance_relays_as_before(
    caller_replaces: bool, refer_to: str
) -> None:
    transfer, actions = accepted(caller_replaces=caller_replaces, refer_to=refer_to)
    assert actions[0] == JoinLegs() and joins(actions) == [(ACCEPTED, JOIN_RELAY)]
    assert transfer.result is not None and transfer.result.join == JOIN_RELAY


@pytest.mark.parametrize("target_bye_first", [False, True])
def test_a_2xx_sipfrag_joins_by_replaces_and_the_targets_bye_is_the_normal_end(
    target_bye_first: bool,
) -> None:
    transfer, _ = accepted()
    if target_bye_first:  # the target ends the replaced leg before the caller's NOTIFY reaches the bridge
        assert transfer.handle(TargetHungUp(), 5_400 * MS) == []
        assert transfer.state is WarmState.JOINING
    actions = transfer.handle(ReferProgress(200, "OK", True), 5_500 * MS)
    result = transfer.result
    assert result is not None and result.transferred and result.elapsed_ms == 5_500
    assert actions == [HangUpCaller(REPLACED), Outcome(result)]  # the bridge's legs end, not the call
    assert joins(actions) == [(ACCEPTED, JOIN_REPLACES)]
    assert transfer.state is WarmState.JOINED and not transfer.active
    assert ReleaseCaller() not in actions and JoinLegs() not in actions
    # the caller's leg is ended by the transfer machinery: its end asks nothing more of the bridge
    assert transfer.handle(CallerHungUp(), 5_600 * MS) == []
    if target_bye_first:
        assert transfer.next_deadline() is None and not transfer.lingering
    else:
        assert transfer.lingering and transfer.next_deadline() == 8_500 * MS
        assert transfer.handle(TargetHungUp(), 6_000 * MS) == []  # not a refusal, no HangUpCaller
        assert transfer.next_deadline() is None and transfer.handle_timer(9_000 * MS) == []


def test_a_replaced_leg_the_target_keeps_is_ended_after_the_bounded_wait() -> None:
    transfer, _ = accepted()
    transfer.handle(ReferProgress(200, "OK", True), 5_500 * MS)
    assert transfer.handle_timer(8_499 * MS) == []
    assert transfer.handle_timer(8_500 * MS) == [
        DropTarget(True, "the replaced leg was not ended by the target")
    ]
    assert transfer.next_deadline() is None and transfer.handle_timer(20_000 * MS) == []
    assert transfer.handle(TargetHungUp(), 9_000 * MS) == []


@pytest.mark.parametrize(
    ("report", "why"),
    [
        (ReferProgress(405, "Method Not Allowed", True), "405 Method Not Allowed"),  # REFER refused
        (ReferProgress(501, "Not Implemented", True), "501 Not Implemented"),
        (ReferProgress(403, "Forbidden", True), "403 Forbidden"),
        (ReferProgress(481, "Call Does Not Exist", True), "481 Call Does Not Exist"),  # a failed sipfrag
        (ReferProgress(503, "Service Unavailable", True), "503 Service Unavailable"),
        (ReferProgress(408, "no answer to the transfer within 30 s", True), "408"),  # the engine's timeout
    ],
)
def test_a_refused_refer_or_a_failed_notify_falls_back_to_the_relay(report: ReferProgress, why: str) -> None:
    transfer, _ = accepted()
    transfer.handle(ReferProgress(100, "Accepted", False), 5_100 * MS)
    actions = transfer.handle(report, 6_000 * MS)
    assert actions[0] == JoinLegs() and joins(actions) == [(ACCEPTED, JOIN_RELAY)]
    assert not any(isinstance(a, (DropTarget, ReleaseCaller)) for a in actions)  # nobody is let go
    assert transfer.result is not None and why in transfer.result.reason
    assert transfer.state is WarmState.JOINED and not transfer.lingering
    # joined by relay from then: either side's hang-up ends the other
    assert transfer.handle(TargetHungUp(), 9_000 * MS) == [HangUpCaller("the transfer target hung up")]


def test_no_refer_outcome_in_time_falls_back_to_the_relay() -> None:
    transfer, _ = accepted()
    assert transfer.handle_timer(12_999 * MS) == []
    actions = transfer.handle_timer(13_000 * MS)
    assert actions[0] == JoinLegs() and joins(actions) == [(ACCEPTED, JOIN_RELAY)]
    assert transfer.result is not None and "no REFER outcome within 8000 ms" in transfer.result.reason
    # the REFER's late report changes nothing: the outcome was given once
    assert transfer.handle(ReferProgress(200, "OK", True), 14_000 * MS) == []


def test_a_failed_refer_after_the_target_left_gives_the_caller_back() -> None:
    transfer, _ = accepted()
    transfer.handle(TargetHungUp(), 5_400 * MS)  # (not a replace after all)
    actions = transfer.handle(ReferProgress(603, "Decline", True), 5_500 * MS)
    assert actions[0] == ReleaseCaller() and joins(actions) == [(FAILED, "")]
    assert not any(isinstance(a, (DropTarget, JoinLegs)) for a in actions)  # its leg is gone already


def test_the_caller_hanging_up_during_the_refer_ends_the_target_leg() -> None:
    transfer, _ = accepted()
    actions = transfer.handle(CallerHungUp(), 5_300 * MS)
    assert actions[0] == DropTarget(True, "the caller hung up during the join")
    assert ReleaseCaller() not in actions and joins(actions) == [(CALLER_HUNG_UP, "")]
    # the REFER's 487 (the tracker's last word as the call ends) and the timer: nothing more
    assert transfer.handle(ReferProgress(487, "the call ended", True), 5_301 * MS) == []
    assert transfer.next_deadline() is None and transfer.handle_timer(20_000 * MS) == []


def test_the_session_ending_during_the_refer_undoes_the_transfer() -> None:
    transfer, _ = accepted()
    actions = transfer.handle(SessionEnded("the application ended the call"), 6_000 * MS)
    assert actions[:2] == [DropTarget(True, "the application ended the call"), ReleaseCaller()]
    assert joins(actions) == [(SESSION_ENDED, "")]


def test_a_refer_report_with_no_join_under_way_is_ignored() -> None:
    transfer = WarmTransfer("sip:human@pbx", "brief", 0, OPTIONS, caller_replaces=True)
    transfer.start()
    assert transfer.handle(ReferProgress(200, "OK", True), 1_000 * MS) == []
    assert transfer.state is WarmState.DIALING
