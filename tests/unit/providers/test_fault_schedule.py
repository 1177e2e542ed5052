"""Asking whether a lasting fault is active never swallows a one-shot fault that is also due."""

from providers.fakes.faults import FaultKind, FaultSchedule, parse_fault
from rtp.units import NS_PER_MS as MS


def test_active_does_not_swallow_one_shot_faults_and_due_reports_each_fault_once() -> None:
    schedule = FaultSchedule(
        [parse_fault("garbage_json@100"), parse_fault("stall:500@100")], connection=1, start=0
    )
    assert schedule.active(FaultKind.STALL, 200 * MS) is not None
    assert sorted(f.kind.value for f in schedule.due(200 * MS)) == ["garbage_json", "stall"]
    assert schedule.due(300 * MS) == []
    assert schedule.active(FaultKind.STALL, 600 * MS) is None  # a stall lasts VALUE ms


def test_an_ended_stall_is_no_longer_a_deadline_once_its_time_has_passed() -> None:
    schedule = FaultSchedule([parse_fault("stall:500@100")], connection=1, start=0)
    schedule.due(100 * MS)
    assert schedule.next_deadline() == 600 * MS  # the dump is due when the stall ends
    schedule.due(600 * MS)  # the core's timer at the stall's end, with nothing held back to dump
    assert schedule.next_deadline() is None  # (a stuck past deadline made the fake's shell spin)
