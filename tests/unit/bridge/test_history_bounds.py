"""Memory flat for weeks: what one call keeps stays bounded however long the call lasts.

A long call on virtual time (tests/support/long_call.py: a turn every 10 s with a tool call, a rollover every
30 s, a recovery now and then) and each piece of per-call history it exercises: the job ledger, the call
record's connections, recoveries and rollovers, the timeline's clock origins, the usage meter's transports,
the metrics observer's job timers, the rollover chain. Each stays under its bound while the totals that status,
metrics and the CDR report stay exact; inside the ledger's window a redelivered call is still answered from the
ledger and never run twice (DL1). tests/bench/history_growth.py measures the same call with tracemalloc.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from bridge.engine.delegations import DelegationOptions, Delegations, DeliverResult, DispatchJob, JobChanged
from bridge.engine.timeline import ORIGINS_KEPT, Timeline
from bridge.engine.usage import TRANSPORTS_KEPT, UsageMeter
from bridge.server.observe import JOBS_TIMED, CallObserver
from bridge.server.records import CLAIMED_ITEMS, KEPT, OPENING, CallOutcome
from bridge.server.session import _Tasks
from providers.events import SessionClosed, UsageUpdated
from rtp.ledger import CarrierLedger
from sip.leg import CallIdentity, LegFeatures
from tests.support.long_call import CALL_ID, MS, LongCall

OPTIONS = DelegationOptions()


def long_call(minutes: float = 20) -> LongCall:
    call = LongCall(rollover_s=15, turn_s=4)
    call.run(minutes, recover_every=30)
    return call


CALL = long_call()  # one busy 20-minute call (300 turns, ~75 rollovers, 10 recoveries), shared by the tests


def jobs_total(status: dict[str, object]) -> int:
    jobs = status["jobs"]
    assert isinstance(jobs, dict)
    return sum(jobs.values())


def job(d: Delegations, n: int, at_ms: int) -> list[object]:
    """Call `c<n>` is asked for, answered and taken in; what the ledger told the provider and the application."""
    d.call_requested(1, f"c{n}", "lookup", "{}", "function", at_ms)
    out: list[object] = [*d.commands()]
    for dispatch in out:
        if isinstance(dispatch, DispatchJob):
            d.job_answered(dispatch.request.job_id, "{}", 1, at_ms + 10)
    d.taken_in(1, at_ms + 20)
    return [*out, *d.commands()]


def test_dl1_a_long_calls_job_ledger_keeps_a_window_and_the_totals() -> None:
    d = CALL.core.delegations
    assert CALL.turns == CALL.dispatched == 300  # one job per turn, each run once
    assert len(d.jobs) <= OPTIONS.keep_finished + OPTIONS.max_pending_delegations
    assert len(d._by_call) <= len(d.jobs) + CALL.redelivered  # each kept job's call ids only
    status = d.status()
    assert jobs_total(status) == CALL.dispatched  # the totals stay exact
    assert status["jobs_forgotten"] == CALL.dispatched - len(d.jobs) > 0


def test_dl1_a_redelivery_inside_the_window_is_answered_from_the_ledger_never_run_twice() -> None:
    assert CALL.recoveries == CALL.redelivered == 10
    assert CALL.redispatched == 0 and CALL.answered_from_ledger == CALL.redelivered
    call = LongCall(rollover_s=15, turn_s=4)
    call.run(5, recover_every=30)
    old = f"call_{call.calls - 40}"  # 40 jobs (over 2.5 minutes) ago, across rollovers and a recovery
    answered = call.answered_from_ledger
    call.redeliver(call.core.token, old)
    assert call.redispatched == 0 and call.answered_from_ledger == answered + 1


def test_dl1_the_window_is_64_finished_jobs_or_three_minutes_and_never_more_than_256() -> None:
    assert (OPTIONS.keep_finished, OPTIONS.keep_finished_ms, OPTIONS.max_finished) == (64, 180_000, 256)
    d = Delegations()
    for n in range(150):  # a job a second: 150 s is inside the 3-minute window
        job(d, n, n * 1000)
    assert len(d.jobs) == 150  # all of them: younger than 3 minutes
    assert [type(c) for c in job(d, 0, 150_000)] == [DeliverResult]  # the first one, again: from the ledger
    for n in range(150, 1_500):
        job(d, n, n * 1000)
    assert len(d.jobs) == 180  # the last 3 minutes of them
    fast = Delegations()
    for n in range(2_000):  # ten a second: the count bound holds whatever the age
        job(fast, n, n * 100)
    assert len(fast.jobs) == OPTIONS.max_finished and len(fast._by_call) == OPTIONS.max_finished
    slow = Delegations()
    for n in range(100):  # one a minute: the last 64 are kept, however old
        job(slow, n, n * 60_000)
    assert len(slow.jobs) == OPTIONS.keep_finished
    assert [type(c) for c in job(slow, 36, 100 * 60_000)] == [DeliverResult]  # the oldest kept: the ledger's
    assert [type(c) for c in job(slow, 35, 100 * 60_000)] == [DispatchJob, DeliverResult]  # forgotten: new
    assert jobs_total(slow.status()) == 101


def test_dl1_a_pending_job_is_never_forgotten_however_many_finish_after_it() -> None:
    d = Delegations(DelegationOptions(keep_finished=4, keep_finished_ms=0, max_finished=8))
    d.call_requested(1, "slow", "lookup", "{}", "function", 0)  # the application takes its time
    d.commands()
    for n in range(100):
        job(d, n, 1_000 + n)
    assert "job-1" in d.jobs and len(d.jobs) == 1 + 4
    d.call_requested(2, "slow", "lookup", "{}", "function", 2_000)  # redelivered while it runs
    assert not [c for c in d.commands() if isinstance(c, DispatchJob)] and d.stats.dispatched == 101
    assert d.job_answered("job-1", '{"late": true}', 2, 3_000)  # answered at last, and delivered
    assert DeliverResult(2, "slow", "lookup", '{"late": true}') in d.commands()


def test_the_call_record_lists_a_bounded_tail_and_counts_every_connection_recovery_and_rollover() -> None:
    builder = CALL.builder
    history = builder.history
    assert len(history.connections) <= KEPT and len(history.rollovers) <= KEPT
    assert len(history.recoveries) <= KEPT and len(history.opening) <= OPENING
    assert len(builder._claimed) <= CLAIMED_ITEMS
    opened = CALL.rollovers_opened + CALL.recoveries
    assert history.connections_total == 1 + opened > KEPT
    assert history.rollovers_completed > KEPT and history.recoveries_total == CALL.recoveries
    _, record = builder.finish(
        CallOutcome(2700.0, "caller", "bye", 200, CALL.core.status(CALL.now), CALL.core.frames_in, 0),
        CALL.now,
    )
    body = json.loads(record.cdr_line())
    assert body["connections"]["count"] == 1 + opened and len(body["connections"]["ids"]) == KEPT
    assert body["connections"]["omitted"] == 1 + opened - KEPT
    assert f"conn-{CALL.core.token}" in body["connections"]["ids"][-2:]  # the newest are the ones kept
    assert (
        body["rollovers"]["count"] == history.rollovers_completed and len(body["rollovers"]["items"]) == KEPT
    )
    assert body["recoveries"]["count"] == CALL.recoveries and "omitted" not in body["recoveries"]


def test_a_short_calls_record_is_unchanged_by_the_bounds() -> None:
    call = LongCall()
    call.run(1.5)  # about three rollovers
    _, record = call.builder.finish(CallOutcome(90.0, "caller", "bye", 200, {}, 0, 0), call.now)
    body = record.to_json()
    assert "omitted" not in body["connections"] and "omitted" not in body["rollovers"]
    assert body["connections"]["count"] == len(body["connections"]["ids"]) == 1 + call.rollovers_opened


def test_hr11_the_timeline_keeps_the_origins_of_the_connections_in_use_only() -> None:
    assert len(CALL.core.timeline._origins) <= ORIGINS_KEPT
    timeline = Timeline(0)
    timeline.connection_started(1, 5_000 * MS)  # the floor, in use all along
    for token in range(2, 200):
        timeline.connection_started(token, token * 1_000 * MS)
        assert timeline.rebase(1, 100, token * 1_000 * MS) == 5_100  # its origin is kept: it is used
    assert len(timeline._origins) == ORIGINS_KEPT
    assert timeline.rebase(2, 100, 300_000 * MS) == 300_000  # long gone: "now", as for an unknown token


def test_hr12_usage_folds_old_transports_and_the_totals_stay_exact() -> None:
    assert len(CALL.core.usage._audio_by_token) <= TRANSPORTS_KEPT
    meter = UsageMeter()
    for token in range(1, 101):
        meter.observe(UsageUpdated(token, 2.0, 10, 10, cumulative=True))
        meter.observe(UsageUpdated(token, 3.0, 10, 10, cumulative=True))  # its latest counts
        meter.observe(SessionClosed(token, "closed", True, 3.0))
    assert len(meter._audio_by_token) == TRANSPORTS_KEPT and meter.totals.audio_seconds == 300.0
    meter.observe(UsageUpdated(1, 9.0))  # a late report of a folded transport: not counted twice
    assert meter.totals.audio_seconds == 300.0 and meter.late_reports == 1 and meter.totals.complete


class _Leg:
    features = LegFeatures()
    identity = CallIdentity("call-9", "sip-9", "sip:a@x", "sip:b@y", "1001", "127.0.0.1:5060")


class _OtherLeg(_Leg):
    identity = CallIdentity("call-8", "sip-8", "sip:a@x", "sip:b@y", "1001", "127.0.0.1:5060")


def test_the_metrics_observer_forgets_a_calls_job_timers_with_the_call() -> None:
    observer = CallObserver()
    for n in range(500):  # jobs that run and never reach an outcome the observer times
        observer.notice("call-9", JobChanged(f"job-{n}", "lookup", "running", "", n))
    assert len(observer._job_started_ms["call-9"]) == JOBS_TIMED
    observer.call_ended(None, None, _OtherLeg())  # no summary, another call's leg: not this call's timers
    assert "call-9" in observer._job_started_ms
    observer.call_ended(None, None, _Leg())  # the session failed (no summary): its leg says which call
    assert not observer._job_started_ms
    assert not CALL.observer._job_started_ms.get(CALL_ID)  # the long call's finished jobs are not kept


def test_ro9_the_rollover_chain_keeps_the_live_connections_only() -> None:
    call = LongCall(rollover_s=15)
    call.run(5, recover_every=1_000)  # no recovery restarts the controller: ~20 rollovers
    controller = call.core.rollover.controller
    assert controller is not None and controller.stats.rollovers >= 15
    assert len(controller._conns) <= 2  # the floor, and the next one while a rollover is under way
    assert call.core.state == "ready" and not call.core.ending.ended  # RO9: the call goes on


def test_a_sessions_finished_tasks_are_forgotten_and_a_failure_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def job(fail: bool) -> None:
        await asyncio.sleep(0)
        if fail:
            raise RuntimeError("backend down")

    async def run() -> tuple[int, int, bool]:
        tasks = _Tasks()
        for i in range(1_000):  # a long call's jobs, hooks and closes, each under its own name
            tasks.spawn(f"job-{i}", job(fail=i == 7), f"call-1-job-{i}")
        tasks.spawn("pump", asyncio.sleep(3600), "call-1-pump")
        spawned = len(tasks)
        for _ in range(5):  # bounded: a few loop iterations run the jobs and their done callbacks
            await asyncio.sleep(0)
        tasks.spawn("close-1", asyncio.sleep(3600), "call-1-close-1")
        first = tasks["close-1"]
        tasks.spawn("close-1", asyncio.sleep(3600), "call-1-close-1-retry")  # a name reused (a retried close)
        first.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
        live_kept = (
            tasks["close-1"].get_name() == "call-1-close-1-retry" and "pump" in tasks and len(tasks) == 2
        )
        for task in list(tasks.values()):
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await asyncio.sleep(0)
        return spawned, len(tasks), live_kept

    with caplog.at_level(logging.WARNING, logger="parlora.session"):
        spawned, left, live_kept = asyncio.run(run())
    assert spawned == 1_001 and live_kept and left == 0
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1 and "call-1-job-7" in failed[0] and "backend down" in failed[0]


def test_the_carrier_ledger_keeps_ten_seconds_of_entries_and_every_items_progress() -> None:
    ledger = CarrierLedger()
    for i in range(3_000):  # a minute of assistant audio in 30 items of 2 s
        ledger.record(f"out-{i // 100}", (i % 100) * 20, 1, i * 20 * MS)
    assert len(ledger.entries()) == 500  # what a full collection walks per call
    assert ledger.frames_transmitted == 3_000
    assert ledger.transmitted_ms("out-0") == 2_000 and ledger.items_between(0, 60_000 * MS)[0] == "out-0"
