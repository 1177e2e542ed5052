"""The REFER outcome machine (sip/core/transfer.py) on virtual time: what `CallLeg.transfer` promises.

Exactly one final `TransferProgress` per transfer, before the call ends; 491 while another is in progress;
500 when the REFER is not sent; 408 after the timeout with no report, the call staying up; 487 when the call
ends first; a 2xx outcome (even a late one) ends the call.
"""

from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtp.units import NS_PER_S as S
from sip.core.transfer import (
    DEFAULT_TRANSFER_TIMEOUT_NS,
    DialogStage,
    EndTransferredCall,
    SendRefer,
    TransferOutput,
    TransferTracker,
)
from sip.leg import TransferProgress

TARGET = "sip:desk@127.0.0.1:5999"
OTHER = "sip:ops@127.0.0.1:5999"


def _progress(outputs: list[TransferOutput]) -> list[tuple[int, bool]]:
    return [(o.status_code, o.final) for o in outputs if isinstance(o, TransferProgress)]


def test_the_default_timeout_is_30_s_under_timer_f() -> None:
    assert DEFAULT_TRANSFER_TIMEOUT_NS == 30 * S
    assert TransferTracker().timeout_ns == 30 * S


def test_accepted_transfer_reports_each_notify_then_the_call_ends_on_a_final_200() -> None:
    t = TransferTracker(30 * S)
    assert t.start(TARGET, 0, DialogStage.CONFIRMED) == [SendRefer(TARGET)]
    assert t.pending and t.target == TARGET and t.next_deadline() == 30 * S
    assert t.report(100, "Accepted", 1 * S, final=False) == [TransferProgress(TARGET, 100, "Accepted", False)]
    assert t.next_deadline() == 31 * S  # each report restarts the timeout
    assert t.notify(180, "Ringing", 2 * S, terminated=False) == [
        TransferProgress(TARGET, 180, "Ringing", False)
    ]
    out = t.notify(200, "OK", 3 * S, terminated=True)
    assert out == [
        TransferProgress(TARGET, 200, "OK", True),
        EndTransferredCall(TARGET, f"transferred to {TARGET}"),
    ]
    assert not t.pending and t.target is None and t.next_deadline() is None


def test_a_final_2xx_sipfrag_is_the_outcome_even_if_the_subscription_goes_on() -> None:
    t = TransferTracker()
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    out = t.notify(200, "OK", 1 * S, terminated=False)
    assert _progress(out) == [(200, True)]
    assert isinstance(out[-1], EndTransferredCall)


def test_refused_refer_is_one_final_report_and_the_call_stays_up() -> None:
    t = TransferTracker()
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    out = t.refer_response(603, "Decline", 1 * S)
    assert out == [TransferProgress(TARGET, 603, "Decline", True)]  # no EndTransferredCall: the call stays
    assert not t.pending


def test_final_failure_sipfrag_keeps_the_call() -> None:
    t = TransferTracker()
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    t.refer_response(202, "Accepted", 1 * S)
    out = t.notify(486, "Busy Here", 2 * S, terminated=True)
    assert out == [TransferProgress(TARGET, 486, "Busy Here", True)]


def test_refer_response_2xx_opens_the_subscription_and_1xx_is_no_report() -> None:
    t = TransferTracker(10 * S)
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    assert t.refer_response(100, "Trying", 5 * S) == []
    assert t.next_deadline() == 10 * S  # a 1xx does not count as a report
    assert t.refer_response(202, "Accepted", 6 * S) == [TransferProgress(TARGET, 100, "Accepted", False)]
    assert t.next_deadline() == 16 * S


def test_refer_sub_false_2xx_is_the_outcome() -> None:
    t = TransferTracker()
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    out = t.refer_response(200, "OK", 1 * S, refer_sub=False)
    assert out == [
        TransferProgress(TARGET, 200, "OK", True),
        EndTransferredCall(TARGET, f"transferred to {TARGET}"),
    ]


def test_a_transfer_asked_for_before_the_ack_waits_for_it() -> None:
    t = TransferTracker()
    assert t.start(TARGET, 0, DialogStage.AWAITING_ACK) == []
    assert t.waiting_for_ack and t.pending
    assert t.confirmed(1 * S) == [SendRefer(TARGET)]
    assert not t.waiting_for_ack
    assert t.confirmed(2 * S) == []  # a second CONFIRMED sends nothing


def test_not_answered_is_a_final_500_and_nothing_is_sent() -> None:
    t = TransferTracker()
    assert t.start(TARGET, 0, DialogStage.NOT_ANSWERED) == [
        TransferProgress(TARGET, 500, "REFER not sent: the call is not answered", True)
    ]
    assert not t.pending and t.next_deadline() is None


def test_refer_that_could_not_be_sent_is_a_final_500() -> None:
    t = TransferTracker()
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    assert t.refer_failed("Invalid operation", 1) == [
        TransferProgress(TARGET, 500, "REFER not sent: Invalid operation", True)
    ]
    assert not t.pending
    assert t.refer_failed("again", 2) == []


def test_a_second_transfer_while_one_is_in_progress_is_491() -> None:
    t = TransferTracker()
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    assert t.start(OTHER, 1 * S, DialogStage.CONFIRMED) == [
        TransferProgress(OTHER, 491, f"a transfer to {TARGET} is still in progress", True)
    ]
    assert t.target == TARGET  # the first one is untouched


def test_no_report_within_the_timeout_is_a_final_408_and_the_call_stays_up() -> None:
    t = TransferTracker(2 * S)
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    assert t.handle_timer(2 * S - 1) == []
    assert t.handle_timer(2 * S) == [
        TransferProgress(TARGET, 408, "no answer to the transfer within 2 s", True)
    ]
    assert t.next_deadline() is None and t.target is None
    assert t.handle_timer(10 * S) == []  # one final report only


def test_after_a_408_other_transfers_wait_until_the_late_outcome_and_a_late_2xx_ends_the_call() -> None:
    t = TransferTracker(2 * S)
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    t.handle_timer(2 * S)
    assert t.pending  # the REFER left: its reports may still come
    assert _progress(t.start(OTHER, 3 * S, DialogStage.CONFIRMED)) == [(491, True)]
    assert t.notify(180, "Ringing", 4 * S, terminated=False) == []  # progress on it is not reported again
    assert t.notify(200, "OK", 5 * S, terminated=True) == [
        EndTransferredCall(TARGET, f"transferred to {TARGET}")
    ]
    assert not t.pending
    assert t.start(OTHER, 6 * S, DialogStage.CONFIRMED) == [SendRefer(OTHER)]


def test_a_late_failure_after_the_408_ends_nothing_and_frees_the_call_for_another_transfer() -> None:
    t = TransferTracker(2 * S)
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    t.handle_timer(2 * S)
    assert t.report(486, "Busy Here", 3 * S, final=True) == []
    assert not t.pending


def test_a_timeout_before_the_ack_leaves_nothing_pending_and_no_refer_goes_later() -> None:
    t = TransferTracker(2 * S)
    t.start(TARGET, 0, DialogStage.AWAITING_ACK)
    assert _progress(t.handle_timer(2 * S)) == [(408, True)]
    assert not t.pending and not t.waiting_for_ack  # that REFER never left: nothing can report on it
    assert t.confirmed(3 * S) == []
    assert t.start(OTHER, 4 * S, DialogStage.CONFIRMED) == [SendRefer(OTHER)]


def test_call_ended_first_is_a_final_487_once() -> None:
    t = TransferTracker()
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    t.report(100, "Accepted", 1, final=False)
    assert t.call_ended(2) == [
        TransferProgress(TARGET, 487, "the call ended before the transfer's outcome", True)
    ]
    assert t.call_ended(3) == [] and not t.pending and t.next_deadline() is None


def test_call_ended_with_no_transfer_reports_nothing() -> None:
    assert TransferTracker().call_ended(0) == []


def test_subscription_ended_without_a_final_notify_is_500() -> None:
    t = TransferTracker()
    t.start(TARGET, 0, DialogStage.CONFIRMED)
    t.refer_response(202, "Accepted", 1)
    assert t.subscription_ended(2) == [
        TransferProgress(TARGET, 500, "the subscription ended without a final NOTIFY", True)
    ]
    assert t.subscription_ended(3) == []


def test_reports_with_no_transfer_are_ignored() -> None:
    t = TransferTracker()
    assert t.report(200, "OK", 0, final=True) == []
    assert t.notify(180, "Ringing", 0, terminated=False) == []
    assert not t.pending


def test_a_non_positive_timeout_is_refused() -> None:
    with pytest.raises(ValueError):
        TransferTracker(0)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.sampled_from(list(DialogStage))),
        st.tuples(st.just("confirmed"), st.none()),
        st.tuples(st.just("refer_failed"), st.none()),
        st.tuples(
            st.just("report"),
            st.tuples(st.sampled_from([100, 180, 183, 200, 202, 486, 503, 603]), st.booleans()),
        ),
        st.tuples(
            st.just("refer_response"), st.tuples(st.sampled_from([100, 202, 200, 403, 405]), st.booleans())
        ),
        st.tuples(st.just("subscription_ended"), st.none()),
        st.tuples(st.just("tick"), st.integers(min_value=0, max_value=40)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_every_transfer_gets_exactly_one_final_report_and_it_is_its_last(
    ops: list[tuple[str, object]],
) -> None:
    t = TransferTracker(10 * S)
    now = 0
    started: list[str] = []
    seen: list[TransferProgress] = []
    ended_for: list[str] = []
    for i, (op, arg) in enumerate(ops):
        if op == "start":
            assert isinstance(arg, DialogStage)
            target = f"sip:t{i}@127.0.0.1"
            started.append(target)
            out = t.start(target, now, arg)
        elif op == "confirmed":
            out = t.confirmed(now)
        elif op == "refer_failed":
            out = t.refer_failed("boom", now)
        elif op == "report":
            code, final = cast(tuple[int, bool], arg)
            out = t.report(code, "r", now, final=final)
        elif op == "refer_response":
            code, sub = cast(tuple[int, bool], arg)
            out = t.refer_response(code, "r", now, refer_sub=sub)
        elif op == "subscription_ended":
            out = t.subscription_ended(now)
        else:
            assert isinstance(arg, int)
            now += arg * S // 2
            out = t.handle_timer(now)
            deadline = t.next_deadline()
            assert deadline is None or deadline > now  # a due timer has fired
        seen += [o for o in out if isinstance(o, TransferProgress)]
        ended_for += [o.target for o in out if isinstance(o, EndTransferredCall)]
    seen += [o for o in t.call_ended(now) if isinstance(o, TransferProgress)]
    for target in started:
        mine = [p for p in seen if p.target == target]
        assert [p.final for p in mine].count(True) == 1, mine
        assert mine[-1].final  # nothing after the final report
    assert not t.pending and t.next_deadline() is None
    # The call is ended by a transfer at most once per transfer, and only after a 2xx outcome: reported as
    # its final report, or arriving after the 408 that had closed it.
    assert len(ended_for) == len(set(ended_for))
    for target in ended_for:
        outcome = next(p for p in seen if p.target == target and p.final)
        assert 200 <= outcome.status_code < 300 or outcome.status_code == 408, outcome
