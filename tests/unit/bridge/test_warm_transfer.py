"""The warm transfer's state machine (bridge/engine/warm_transfer.py) on virtual time: every outcome, once."""

from __future__ import annotations

import pytest

from bridge.engine.warm_transfer import (
    ACCEPTED,
    BUSY,
    CALLER_HUNG_UP,
    DECLINED,
    FAILED,
    NO_ANSWER,
    NO_DECISION,
    REFUSED,
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
