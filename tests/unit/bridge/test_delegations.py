"""DL1 and DL2: the job ledger on its own, and through the coordinator across a recovery."""

from __future__ import annotations

import asyncio
import json

from bridge.engine.delegations import (
    DelegationOptions,
    Delegations,
    DeliverResult,
    DispatchJob,
    JobChanged,
    JobRequest,
    SendContext,
    seed_facts,
)
from bridge.server.session import CallSession
from providers.events import (
    ResponseDone,
    SessionClosed,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
)
from sip.leg import CallEnded
from tests.support import virtual_time
from tests.support.delegations import ToolProvider
from tests.support.session import FakeLeg
from tests.support.session_engine import Call

event_loop_policy = virtual_time.policy_fixture()  # the shell tests run on virtual time


def test_dl1_a_redelivered_call_is_answered_from_the_ledger_and_never_dispatched_again() -> None:
    ledger = Delegations()
    ledger.call_requested(1, "call_a", "lookup_order", '{"order_id": "42"}', "function", 100)
    ledger.call_requested(1, "call_a", "lookup_order", '{"order_id": "42"}', "function", 140)  # while running
    [dispatch] = ledger.commands()
    assert isinstance(dispatch, DispatchJob) and dispatch.request.job_id == "job-1"
    assert ledger.job_answered("job-1", '{"status": "shipped"}', 1, 300)
    assert ledger.commands() == [DeliverResult(1, "call_a", "lookup_order", '{"status": "shipped"}')]
    ledger.call_requested(
        1, "call_a", "lookup_order", '{"order_id": "42"}', "function", 400
    )  # after the answer
    assert ledger.commands() == [DeliverResult(1, "call_a", "lookup_order", '{"status": "shipped"}')]
    ledger.call_requested(1, "call_b", "lookup_order", '{"order_id": "42"}', "function", 500)  # a new call id
    [second] = ledger.commands()
    assert isinstance(second, DispatchJob) and second.request.job_id == "job-2"
    assert ledger.stats.dispatched == 2 and ledger.stats.redeliveries == 2
    # Revisions: a later answer for the same job is revision 2 and is delivered again.
    assert (
        ledger.job_answered("job-1", '{"status": "delivered"}', 1, 600) and ledger.jobs["job-1"].revision == 2
    )


def test_dl1_the_ledger_survives_a_recovery_and_answers_a_redelivery_on_the_new_connection() -> None:
    call = Call()
    call.provider(ToolCallRequested(1, "call_a", "lookup_order", '{"order_id": "42"}'))
    [job] = [c.request for c in call.commands if isinstance(c, DispatchJob)]
    call.core.job_answered(job.job_id, '{"status": "shipped"}', call.now)
    call.provider(ResponseDone(1, "resp_1"))
    call.provider(SessionClosed(1, "connection lost", False))
    call.provider(SessionStarted(2, "sess_2", None))
    call.provider(
        ToolCallRequested(2, "call_a", "lookup_order", '{"order_id": "42"}')
    )  # resumed, delivered again
    call.provider(SpeechStarted(2, 100))
    call.provider(SpeechStopped(2, 700))
    assert len([c for c in call.commands if isinstance(c, DispatchJob)]) == 1
    answers = [(c.token, c.call_id, c.output) for c in call.commands if isinstance(c, DeliverResult)]
    assert answers == [(1, "call_a", '{"status": "shipped"}'), (2, "call_a", '{"status": "shipped"}')]
    assert call.core.status(call.now)["delegations"]["redeliveries"] == 1
    # The verified result is part of what a further replacement is seeded with (HR7).
    assert any("shipped" in fact for fact in seed_facts(call.core.delegations))


def test_dl2_over_the_pending_limit_the_model_gets_a_clear_refusal_and_nothing_is_lost() -> None:
    ledger = Delegations(DelegationOptions(max_pending_delegations=2, max_command_records=1))
    for i in range(3):
        ledger.call_requested(1, f"call_{i}", "book_slot", "{}", "function", i)
    commands = ledger.commands()
    assert [type(c).__name__ for c in commands] == ["DispatchJob", "DispatchJob", "DeliverResult"]
    refusal = commands[2]
    assert (
        isinstance(refusal, DeliverResult)
        and refusal.call_id == "call_2"
        and "2 delegations are already pending" in refusal.output
    )
    notices = ledger.notices()
    assert [n.state for n in notices if isinstance(n, JobChanged) and n.job_id == "job-3"] == ["refused"]
    # One command record: the second answer waits for the first to be taken in, then goes (nothing dropped).
    ledger.job_answered("job-1", "first", 1, 10)
    ledger.job_answered("job-2", "second", 1, 11)
    assert [c.output for c in ledger.commands() if isinstance(c, DeliverResult)] == ["first"]
    assert not ledger.push_update("an update", True, 1)  # over the record limit: refused to the application
    ledger.response_ended(1, 20)
    assert [c.output for c in ledger.commands() if isinstance(c, DeliverResult)] == ["second"]
    ledger.response_ended(1, 30)
    assert ledger.push_update("an update", True, 1) and ledger.commands() == [
        SendContext(1, "an update", True)
    ]


def test_ro8_results_wait_while_the_floor_is_handed_over_and_go_to_the_connection_that_takes_it() -> None:
    ledger = Delegations()
    ledger.call_requested(1, "call_1", "lookup_order", '{"order_id": "42"}', "tool", 0)
    assert ledger.response_ended(1, 5)  # connection 1 asked for a tool: it waits for the result
    ledger.commands()
    facts = seed_facts(ledger)  # what the next connection is seeded with
    assert any("lookup_order (job-1)" in f and "still running" in f and "42" in f for f in facts), facts
    ledger.floor(1, True, 10)  # connection 1 stopped hearing the caller; connection 2 hears them
    assert ledger.job_answered("job-1", "shipped", 1, 20)
    assert ledger.push_update("an update", True, 1)
    assert ledger.commands() == []  # not to the connection that is finishing
    ledger.floor(2, False, 30)  # connection 2 took the floor
    commands = ledger.commands()
    contexts = [c for c in commands if isinstance(c, SendContext)]
    assert len(contexts) == len(commands) == 2 and {c.token for c in contexts} == {2}
    assert "shipped" in contexts[0].text and "job-1" in contexts[0].text
    assert not ledger.response_ended(2, 40)  # nothing pending any more
    assert not any("still running" in f for f in seed_facts(ledger))


async def test_dl1_the_shell_runs_the_handler_once_for_a_call_delivered_twice() -> None:
    leg, provider = FakeLeg(), ToolProvider()
    runs: list[JobRequest] = []
    release = asyncio.Event()

    async def handler(job: JobRequest) -> str:
        runs.append(job)
        await release.wait()  # the duplicate arrives while the application is still working
        return json.dumps({"order": json.loads(job.arguments)["order_id"], "status": "shipped"})

    task = asyncio.create_task(
        CallSession(leg, provider, clock=virtual_time.loop_clock(), job_handler=handler).run()
    )
    provider.queue.put_nowait(ToolCallRequested(1, "call_a", "lookup_order", '{"order_id": "42"}'))
    provider.queue.put_nowait(ToolCallRequested(1, "call_a", "lookup_order", '{"order_id": "42"}'))
    async with asyncio.timeout(5):
        while not runs:
            await asyncio.sleep(0)
    release.set()
    await asyncio.wait_for(provider.answered.wait(), 5)
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)
    assert [job.job_id for job in runs] == ["job-1"]
    assert provider.results == [("call_a", '{"order": "42", "status": "shipped"}')]


async def test_dl1_a_failing_handler_answers_the_model_with_an_error_and_keeps_the_call() -> None:
    leg, provider = FakeLeg(), ToolProvider()

    async def handler(job: JobRequest) -> str:
        raise RuntimeError("database down")

    task = asyncio.create_task(
        CallSession(leg, provider, clock=virtual_time.loop_clock(), job_handler=handler).run()
    )
    provider.queue.put_nowait(ToolCallRequested(1, "call_a", "lookup_order", "{}"))
    await asyncio.wait_for(provider.answered.wait(), 5)
    assert (
        "error" in provider.results[0][1] and "database" not in provider.results[0][1] and leg.hangups == []
    )
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)
