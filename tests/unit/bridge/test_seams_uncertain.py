"""S8: work whose outcome became uncertain is told to the application with what was requested.

Commands a lost connection never acknowledged (HR6) and jobs cut off by the end of the session (after the
grace its handler gets to answer) become one `WorkUncertain` notice of the job ledger (bridge/engine/delegations.py),
driven here on virtual time; the shell carries it to the application's event (`Application.work_uncertain`),
the call record and its CDR line (bridge/server/records.py) and the webhook (bridge/server/webhook.py), tested as the
existing tests of each shell do.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from bridge.engine.commands import CloseTransport
from bridge.engine.delegations import (
    CUT_OFF_DETAIL,
    MAX_TOLD_CHARS,
    DelegationOptions,
    DeliverResult,
    DispatchJob,
    JobChanged,
    JobRequest,
    SendContext,
    UncertainItem,
    WorkUncertain,
)
from bridge.server.api import Application, _to
from bridge.server.recording import CallReporter, CdrWriter
from bridge.server.records import (
    AppEvent,
    CallEnded,
    CallInfo,
    CallOutcome,
    CallStarted,
    RecordBuilder,
    UncertainWork,
)
from bridge.server.session import JobHandler
from bridge.server.webhook import INSTANCE_ID, WebhookConfig
from providers.events import AudioReceived, ResponseDone, SessionClosed, ToolCallRequested
from rtp.audio import PCMU_8K
from rtp.ledger import CarrierLedger
from sip.leg import CallEnded as LegEnded
from tests.support import virtual_time
from tests.support.recovery import commands_of, repaired
from tests.support.rollover_session import SCALED, RolloverCall
from tests.support.session import FakeLeg, FakeProvider, session
from tests.support.session_engine import MS, REALTIME, Call, pcmu_tone
from tests.support.webhook import ENV, SECRET, App, json_answer

event_loop_policy = virtual_time.policy_fixture()  # the shell tests run on virtual time

BOOK = '{"day": "friday", "time": "19:00"}'


def uncertain(call: Call) -> list[WorkUncertain]:
    return [n for n in call.notices if isinstance(n, WorkUncertain)]


def booked(call: Call) -> JobRequest:
    """The model asks for a booking; the job goes to the application's handler."""
    call.provider(ToolCallRequested(1, "call_a", "book_table", BOOK))
    [dispatch] = commands_of(call, DispatchJob)
    return dispatch.request


def hang_up(call: Call) -> None:
    """The caller's BYE; the provider answers the close request with its final usage at once."""
    call.core.call_ended(call.now)
    call._drain()
    call.provider(SessionClosed(1, "close_requested", True, 3.0))


# --- the core, on virtual time ---


def test_s8_a_job_running_at_hang_up_is_told_cut_off_with_its_request_after_the_grace() -> None:
    call = Call()
    job = booked(call)
    hang_up(call)
    assert not call.core.finished(call.now)  # the handler still has its grace
    call.advance(1_999)
    assert uncertain(call) == [] and not call.core.finished(call.now)
    call.advance(1)  # the grace (2 s) is over
    [told] = uncertain(call)
    assert (told.cause, told.at_ms) == ("session_ended", call.core.timeline.ms(call.now))
    assert told.items == (
        UncertainItem(
            job.job_id, "book_table", "function", BOOK, False, job.requested_at_ms, "cut_off", CUT_OFF_DETAIL
        ),
    )
    assert [n.state for n in call.notices if isinstance(n, JobChanged)][-1] == "cut_off"
    assert call.core.finished(call.now)
    assert not call.core.job_answered(job.job_id, '{"booked": true}', call.now)  # too late: not delivered
    call._drain()
    assert commands_of(call, DeliverResult) == []
    assert call.core.status(call.now)["delegations"]["uncertain"] == 1


def test_s8_a_job_answered_within_the_grace_is_delivered_and_not_told_uncertain() -> None:
    call = Call()
    job = booked(call)
    hang_up(call)
    call.advance(1_500)
    assert call.core.job_answered(job.job_id, '{"booked": true}', call.now)
    call._drain()
    assert [(c.call_id, c.output) for c in commands_of(call, DeliverResult)] == [
        ("call_a", '{"booked": true}')
    ]
    assert call.core.finished(call.now)  # nothing is left to wait for: the session stops at once
    call.advance(5_000)
    assert uncertain(call) == []
    assert [n.state for n in call.notices if isinstance(n, JobChanged)][-1] == "delivered"
    assert call.core.status(call.now)["delegations"]["uncertain"] == 0


def test_s8_the_grace_never_outlasts_the_session_s_close_window() -> None:
    call = Call(delegations=DelegationOptions(end_grace_ms=10_000))  # the close window is 2 s
    booked(call)
    call.core.call_ended(call.now)  # the provider never confirms the close
    call._drain()
    call.advance(2_000)
    assert [i.outcome for i in uncertain(call)[0].items] == ["cut_off"]
    assert call.core.finished(call.now)


def test_s8_a_session_without_uncertain_work_ends_as_before_and_tells_nothing() -> None:
    call = Call()
    hang_up(call)
    assert call.core.finished(call.now) and uncertain(call) == []


def test_s8_commands_unacknowledged_when_their_connection_was_lost_are_told_with_their_request() -> None:
    call = Call()
    call.provider(ToolCallRequested(1, "call_a", "lookup_order", '{"order_id": "42"}'))
    call.provider(ToolCallRequested(1, "call_b", "book_table", BOOK))
    [first, second] = [c.request for c in commands_of(call, DispatchJob)]
    call.core.job_answered(first.job_id, '{"status": "shipped"}', call.now)
    call.provider(ResponseDone(1, "resp_1"))  # the provider took the first answer in
    call.core.job_answered(second.job_id, '{"booked": true}', call.now)
    call.core.push_update("Your table is confirmed by the restaurant.", speak=True, now=call.now)
    call._drain()
    assert len(commands_of(call, SendContext)) == 1
    repaired(call)  # the connection is lost before it acknowledged the second answer and the update
    [told] = uncertain(call)
    assert (told.cause, told.token) == ("connection_lost", 1)
    assert [(i.job_id, i.name, i.kind, i.arguments, i.outcome) for i in told.items] == [
        (second.job_id, "book_table", "function", BOOK, "unknown"),
        (None, "update", "update", "Your table is confirmed by the restaurant.", "unknown"),
    ]
    assert all("sent, never acknowledged" in i.detail for i in told.items)
    assert told.items[0].requested_at_ms == second.requested_at_ms


def result_sent_on_the_first_connection(call: RolloverCall) -> JobRequest:
    """After a turn, connection 1 asks for a lookup, the application answers, the result goes to connection 1."""
    call.turn()
    call.core.provider_event(ToolCallRequested(1, "call_r", "lookup_order", '{"order_id": "42"}'), call.now)
    call._carry_out()
    [job] = [c.request for c in call.commands if isinstance(c, DispatchJob)]
    assert call.core.job_answered(job.job_id, '{"status": "shipped"}', call.now)
    call._carry_out()
    return job


def test_s8_a_result_a_rollover_s_old_connection_never_took_in_is_told_unknown_and_frees_its_record() -> None:
    call = RolloverCall()
    job = result_sent_on_the_first_connection(call)
    assert [c.token for c in call.commands if isinstance(c, DeliverResult)] == [1]  # never acknowledged
    while not any(isinstance(c, CloseTransport) and c.token == 1 for c in call.commands):
        call.turn()  # the call rolls over; the old connection closes
    [told] = [n for n in call.notices if isinstance(n, WorkUncertain)]
    assert (told.cause, told.token) == ("connection_closed", 1)
    assert [(i.job_id, i.name, i.outcome) for i in told.items] == [(job.job_id, "lookup_order", "unknown")]
    assert call.core.delegations.records == []  # the record slot is free again (DL2)


def test_s8_hr6_a_rollover_s_old_connection_that_took_in_its_result_after_the_floor_moved_is_not_told() -> (
    None
):
    """The old connection, listening on after the floor moved (its response not ended), ends that response:
    it took in the result it was sent, which is then not reported unknown when it closes."""
    call = RolloverCall(replace(SCALED, overlap_ms=2_000), replace(REALTIME, response_events=True))
    result_sent_on_the_first_connection(call)
    call.talk_until_a_rollover_opens()
    call.step(False, 35)
    call.turn(talk_ms=1_000, pause_ms=20)
    call.core.provider_event(AudioReceived(1, pcmu_tone(200), PCMU_8K, "resp_old"), call.now)
    call.step(False, 30)  # its answer played: the floor moves, its response is still under way
    assert 1 in call.core.connections.listeners and call.core.delegations.records
    call.core.provider_event(ResponseDone(1), call.now)
    call._carry_out()
    assert any(isinstance(c, CloseTransport) and c.token == 1 for c in call.commands)
    assert not [n for n in call.notices if isinstance(n, WorkUncertain)]
    assert call.core.delegations.records == []


def test_s8_an_answer_held_for_the_caller_when_the_call_ends_is_told_not_delivered() -> None:
    call = Call()
    job = booked(call)
    repaired(call)  # HR9: results wait until the caller has spoken again
    assert call.core.job_answered(job.job_id, '{"booked": true}', call.now)
    call._drain()
    assert commands_of(call, DeliverResult) == [] and commands_of(call, SendContext) == []
    call.core.call_ended(call.now)  # the caller hangs up without speaking again
    call._drain()
    call.provider(SessionClosed(call.core.token, "close_requested", True, 3.0))
    [told] = uncertain(call)
    assert [(i.job_id, i.outcome) for i in told.items] == [(job.job_id, "not_delivered")]
    assert call.core.finished(call.now)


def test_s8_the_request_told_is_bounded() -> None:
    call = Call()
    call.provider(ToolCallRequested(1, "call_a", "note", json.dumps({"text": "x" * 5_000})))
    hang_up(call)
    call.advance(2_000)
    [item] = uncertain(call)[0].items
    assert len(item.arguments) == MAX_TOLD_CHARS and item.truncated


def test_s8_no_new_work_is_dispatched_after_the_session_ended() -> None:
    call = Call()
    hang_up(call)
    assert call.core.finished(call.now)
    call.provider(ToolCallRequested(1, "call_late", "book_table", BOOK))  # (a last event before the close)
    assert commands_of(call, DispatchJob) == []


# --- the shell: the application's handler, on the session's virtual clock ---


class ToolProvider(FakeProvider):
    """Asks for a booking as the session starts; records the results it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.results: list[tuple[str, str]] = []
        self.queue.put_nowait(ToolCallRequested(1, "call_a", "book_table", BOOK))

    def send_tool_result(self, call_id: str, name: str, output: str) -> None:
        self.results.append((call_id, output))


async def hung_up_while(handler: JobHandler) -> tuple[ToolProvider, list[object], float]:
    """A call whose model asks for a booking; the caller hangs up once `handler` has begun. Returns the
    provider, the session's notices and how long (s) the session ran on after the BYE."""
    leg, provider, clock = FakeLeg(), ToolProvider(), virtual_time.loop_clock()
    started = asyncio.Event()
    notices: list[object] = []

    async def begun(request: JobRequest) -> str:
        started.set()
        return await handler(request)

    sink = notices.append
    run = session(leg, provider, job_handler=begun, notice_sink=lambda _, n: sink(n)).run()
    task = asyncio.create_task(run)
    await asyncio.wait_for(started.wait(), 5)
    bye = clock()
    leg.queue.put_nowait(LegEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(task, 10)
    return provider, notices, (clock() - bye) / 1e9


async def test_s8_a_handler_still_running_at_hang_up_gets_the_grace_then_is_cut_off_and_told() -> None:
    cancelled: list[str] = []

    async def handler(request: JobRequest) -> str:
        try:
            await asyncio.sleep(3_600)
        except asyncio.CancelledError:
            cancelled.append(request.job_id)
            raise
        return "never"

    provider, notices, after_bye = await hung_up_while(handler)
    assert round(after_bye, 1) == 2.0 and cancelled == ["job-1"]  # the grace (2 s), then cancelled
    [told] = [n for n in notices if isinstance(n, WorkUncertain)]
    assert [(i.job_id, i.name, i.arguments, i.outcome) for i in told.items] == [
        ("job-1", "book_table", BOOK, "cut_off")
    ]
    assert provider.results == []


async def test_s8_a_handler_answering_within_the_grace_is_delivered_and_the_session_ends_then() -> None:
    async def handler(request: JobRequest) -> str:
        await asyncio.sleep(0.5)  # still at work when the caller hangs up
        return '{"booked": true}'

    provider, notices, after_bye = await hung_up_while(handler)
    assert provider.results == [("call_a", '{"booked": true}')]
    assert not any(isinstance(n, WorkUncertain) for n in notices)
    assert after_bye < 0.6  # the answer ended the wait, not the whole grace


# --- what the application is told: the event, the record, the CDR, the webhook ---

INFO = CallInfo(
    "call-7", "abc@127.0.0.1", "sip:alice@127.0.0.1", "sip:bot@127.0.0.1", "bot", "x", None, "echo"
)
CUT = WorkUncertain(
    "session_ended",
    (UncertainItem("job-2", "book_table", "function", BOOK, False, 5_120, "cut_off", CUT_OFF_DETAIL),),
    9_000,
)


class _Now:
    ns = 5_000 * MS

    def __call__(self) -> int:
        return self.ns


async def test_s8_the_event_the_call_record_and_the_cdr_line_carry_the_request(tmp_path: Path) -> None:
    seen: list[AppEvent] = []

    async def deliver(event: AppEvent) -> None:
        seen.append(event)

    builder = RecordBuilder(INFO, ledger=CarrierLedger(), start_ns=_Now.ns, started_at=1.0)
    reporter = CallReporter(builder, deliver, cdr=CdrWriter(tmp_path / "cdr.jsonl"), clock=_Now())
    reporter.start()
    reporter.notice("call-7", CUT)
    record = await reporter.finish(CallOutcome(9.5, "caller", "200 OK", 200, {}, 450, 0))
    assert [type(e) for e in seen] == [CallStarted, UncertainWork, CallEnded]
    event = seen[1]
    assert isinstance(event, UncertainWork)
    item = {
        "job_id": "job-2",
        "name": "book_table",
        "kind": "function",
        "arguments": {"day": "friday", "time": "19:00"},
        "arguments_truncated": False,
        "requested_at_ms": 5_120,
        "outcome": "cut_off",
        "detail": CUT_OFF_DETAIL,
    }
    assert event.to_json() == {
        "event": "work_uncertain",
        "call_id": "call-7",
        "seq": 1,
        "cause": "session_ended",
        "at_ms": 9_000,
        "items": [item],
    }
    expected = {"count": 1, "items": [{"cause": "session_ended", "at_ms": 9_000, **item}]}
    assert record.to_json()["uncertain"] == expected
    [line] = (tmp_path / "cdr.jsonl").read_text().splitlines()
    assert json.loads(line)["uncertain"] == expected


async def test_s8_the_python_application_is_told_by_work_uncertain() -> None:
    told: list[UncertainWork] = []

    class Shop(Application):
        async def work_uncertain(self, call: Any, event: UncertainWork) -> None:
            told.append(event)

    event = UncertainWork("call-7", 1, CUT.cause, CUT.at_ms, CUT.items)
    await _to(Shop(), [object()])(event)  # type: ignore[list-item]  # (the handler ignores the call here)
    assert told == [event]


async def test_s8_the_webhook_posts_work_uncertain_signed_with_its_own_key() -> None:
    from bridge.cli.commands import WebhookApplication

    app = App(json_answer({"ok": True}))
    port = await app.start()
    try:
        config = WebhookConfig.from_options(f"http://127.0.0.1:{port}/events", timeout_s=5.0, environ=ENV)
        call = type("Call", (), {"call_id": "call-7"})()
        event = UncertainWork("call-7", 1, CUT.cause, CUT.at_ms, CUT.items)
        await WebhookApplication(config).work_uncertain(call, event)  # type: ignore[arg-type]
    finally:
        await app.close()
    [got] = app.requests
    assert got.headers["x-parlora-event"] == "work_uncertain"
    assert got.headers["idempotency-key"] == f"{INSTANCE_ID}/call-7/work_uncertain-1"
    timestamp = got.headers["x-parlora-timestamp"]
    digest = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + got.body, hashlib.sha256).hexdigest()
    assert got.headers["x-parlora-signature"] == f"sha256={digest}"
    body = json.loads(got.body)
    assert body["event"] == "work_uncertain" and body["items"][0]["job_id"] == "job-2"
    assert body["items"][0]["arguments"] == {"day": "friday", "time": "19:00"}
