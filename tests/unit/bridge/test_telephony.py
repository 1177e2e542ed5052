"""DL6: the telephony tools are carried out on the call leg, never dispatched to the application, and the
caller's key presses reach the application and (when enabled) the model."""

from __future__ import annotations

import asyncio
import json

import pytest

from bridge.engine.coordinator import CoordinatorOptions
from bridge.engine.delegations import DeliverResult
from bridge.engine.no_input import NO_INPUT_REASON, NoInputOptions
from bridge.engine.telephony import TelephonyOptions, TransferInProgress, tool_specs
from bridge.server.api import LiveCall
from bridge.server.session import CallSession, CallSummary
from providers.events import AudioReceived, SessionClosed, ToolCallRequested
from rtp.audio import PCMU_8K
from sip.leg import CallEnded, DtmfReceived, TransferProgress
from tests.support import virtual_time
from tests.support.delegations import ToolProvider
from tests.support.session import FakeLeg

event_loop_policy = virtual_time.policy_fixture()  # the shell tests run on virtual time

OPTIONS = TelephonyOptions(
    end_call=True,
    transfer_targets={"sales": "sip:sales@127.0.0.1:5090"},
    send_dtmf=True,
    dtmf_to_model=True,
    goodbye_timeout_ms=2_000,
)


class TelephonyLeg(FakeLeg):
    def __init__(self) -> None:
        super().__init__()
        self.transfers: list[str] = []
        self.digits: list[str] = []

    def hangup(self, reason: str = "normal clearing", status: int = 503) -> None:
        self.played_at_hangup = self.ledger.frames_transmitted
        super().hangup(reason, status)

    def transfer(self, target: str) -> None:
        self.transfers.append(target)

    def send_dtmf(self, digits: str) -> None:
        if not digits or set(digits) - set("0123456789*#ABCD"):
            raise ValueError(f"not DTMF digits: {digits!r}")
        self.digits.append(digits)


class TextProvider(ToolProvider):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[tuple[str, bool]] = []

    def send_text(self, text: str, *, speak: bool = False) -> None:
        self.texts.append((text, speak))


async def until(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0)


async def play_out(leg: FakeLeg, task: asyncio.Task[CallSummary]) -> None:
    for tick in range(50):  # the media clock plays it out, one frame per 20 ms (bounded)
        if task.done():
            break
        leg.playout.pull(tick * 20_000_000)
        await asyncio.sleep(0.02)


def test_dl6_the_tools_are_offered_only_when_enabled() -> None:
    assert tool_specs(TelephonyOptions()) == ()
    specs = {s.name: s for s in tool_specs(OPTIONS)}
    assert set(specs) == {"end_call", "transfer_call", "send_dtmf"}
    assert specs["transfer_call"].parameters["properties"]["destination"]["enum"] == ["sales"]


async def test_dl6_transfer_call_sends_refer_and_reports_the_transferee_s_answer() -> None:
    leg, provider = TelephonyLeg(), TextProvider()
    ran: list[object] = []

    async def application(job: object) -> str:
        ran.append(job)
        return "{}"

    task = asyncio.create_task(
        CallSession(
            leg, provider, clock=virtual_time.loop_clock(), job_handler=application, telephony_options=OPTIONS
        ).run()
    )
    provider.queue.put_nowait(ToolCallRequested(1, "call_t", "transfer_call", '{"destination": "sales"}'))
    await until(lambda: leg.transfers)
    assert leg.transfers == ["sip:sales@127.0.0.1:5090"] and not provider.results
    leg.queue.put_nowait(TransferProgress("sip:sales@127.0.0.1:5090", 100, "Trying", False))
    leg.queue.put_nowait(TransferProgress("sip:sales@127.0.0.1:5090", 486, "Busy Here", True))
    await asyncio.wait_for(provider.answered.wait(), 5)
    assert [(c, json.loads(o)) for c, o in provider.results] == [
        ("call_t", {"transferred": False, "status": 486, "reason": "Busy Here"})
    ]
    provider.queue.put_nowait(ToolCallRequested(1, "call_d", "send_dtmf", '{"digits": "12#"}'))
    provider.queue.put_nowait(ToolCallRequested(1, "call_x", "send_dtmf", '{"digits": "12x"}'))
    await until(lambda: len(provider.results) == 3)
    assert leg.digits == ["12#"] and "error" in json.loads(provider.results[2][1]) and ran == []
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)


async def test_one_transfer_at_a_time_the_application_s_outcome_never_answers_the_model_s_job() -> None:
    # RFC 3515: one REFER at a time per dialog; a leg's TransferProgress does not say which REFER it answers
    leg, provider = TelephonyLeg(), TextProvider()
    session = CallSession(leg, provider, clock=virtual_time.loop_clock(), telephony_options=OPTIONS)
    live, task = LiveCall(leg.identity, session), asyncio.create_task(session.run())
    provider.queue.put_nowait(ToolCallRequested(1, "call_t", "transfer_call", '{"destination": "sales"}'))
    await until(lambda: leg.transfers)
    with pytest.raises(TransferInProgress, match="already in progress"):
        live.transfer("sip:agent@127.0.0.1:5070")  # the model's transfer is still waiting for its answer
    assert leg.transfers == ["sip:sales@127.0.0.1:5090"] and not provider.results  # no second REFER
    leg.queue.put_nowait(TransferProgress("sip:sales@127.0.0.1:5090", 486, "Busy Here", True))
    await asyncio.wait_for(provider.answered.wait(), 5)
    assert [(c, json.loads(o)) for c, o in provider.results] == [
        ("call_t", {"transferred": False, "status": 486, "reason": "Busy Here"})
    ]
    live.transfer("sip:agent@127.0.0.1:5070")  # the application's, now that none is in progress
    provider.queue.put_nowait(ToolCallRequested(1, "call_u", "transfer_call", '{"destination": "sales"}'))
    await until(lambda: len(provider.results) == 2)
    assert json.loads(provider.results[1][1]) == {
        "transferred": False,
        "error": "a transfer is already in progress",
    }
    leg.queue.put_nowait(
        TransferProgress("sip:agent@127.0.0.1:5070", 603, "Decline", True)
    )  # the application's
    provider.queue.put_nowait(ToolCallRequested(1, "call_v", "transfer_call", '{"destination": "sales"}'))
    await until(lambda: len(leg.transfers) == 3)  # the model's, once the application's outcome came
    assert leg.transfers[1:] == ["sip:agent@127.0.0.1:5070", "sip:sales@127.0.0.1:5090"]
    assert len(provider.results) == 2  # the application's outcome answered no job of the model's
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)


async def test_dl6_end_call_lets_the_goodbye_play_then_hangs_up() -> None:
    leg, provider = TelephonyLeg(), TextProvider()
    task = asyncio.create_task(
        CallSession(leg, provider, clock=virtual_time.loop_clock(), telephony_options=OPTIONS).run()
    )
    provider.queue.put_nowait(ToolCallRequested(1, "call_e", "end_call", "{}"))
    await asyncio.wait_for(provider.answered.wait(), 5)
    provider.queue.put_nowait(AudioReceived(1, bytes(range(256)) * 4, PCMU_8K))  # the goodbye (128 ms)
    await until(lambda: leg.playout.depth > 0)
    assert leg.hangups == []  # not while the goodbye waits to be played
    await play_out(leg, task)
    summary = await asyncio.wait_for(task, 5)
    assert leg.hangups and "end_call" in leg.hangups[0] and summary.ended_by == "provider"
    assert leg.played_at_hangup == 7  # the whole goodbye (1024 bytes = 128 ms = 7 frames) left before the BYE


async def test_a_goodbye_the_bridge_s_policy_asked_for_is_put_down_to_the_bridge_not_the_model() -> None:
    # the no-input timeout's goodbye (the budget's, the time limit's and the drain's take the same path:
    # CallEnding.end_after_goodbye with their reason); the model's own end_call stays "provider" (above)
    leg, provider = TelephonyLeg(), TextProvider()
    options = CoordinatorOptions(no_input=NoInputOptions(timeout_ms=5_000))
    session = CallSession(
        leg, provider, clock=virtual_time.loop_clock(), options=options, telephony_options=OPTIONS
    )
    summary = await asyncio.wait_for(session.run(), 60)  # a check-in, a goodbye nobody said, the BYE
    assert leg.hangups == [NO_INPUT_REASON]
    assert (summary.ended_by, summary.reason) == ("bridge", NO_INPUT_REASON)


async def test_an_application_s_goodbye_ends_the_call_once_heard_on_the_session_s_clock() -> None:
    # LiveCall.say_goodbye (the drain's and the time limit's way, or the application's own) runs the core on
    # the session's clock: on the monotonic clock its goodbye's deadlines were nowhere near virtual time
    leg, provider = TelephonyLeg(), TextProvider()
    session = CallSession(leg, provider, clock=virtual_time.loop_clock(), telephony_options=OPTIONS)
    live, task = LiveCall(leg.identity, session), asyncio.create_task(session.run())
    await until(lambda: session.coordinator is not None)
    assert live.say_goodbye("Say goodbye: the office is closing.", "closing time")
    await until(lambda: provider.texts == [("Say goodbye: the office is closing.", True)])
    provider.queue.put_nowait(AudioReceived(1, bytes(range(256)) * 4, PCMU_8K))  # the goodbye (128 ms)
    await until(lambda: leg.playout.depth > 0)
    assert leg.hangups == []  # not while the goodbye waits to be played
    await play_out(leg, task)
    summary = await asyncio.wait_for(task, 5)
    assert leg.hangups == ["closing time"] and leg.played_at_hangup == 7  # the whole goodbye, then the BYE
    assert (summary.ended_by, summary.reason) == ("bridge", "closing time")  # not the model's end_call


async def test_dl6_the_caller_s_keys_reach_the_application_and_the_model() -> None:
    leg, provider = TelephonyLeg(), TextProvider()
    pressed: list[str] = []

    async def on_dtmf(digit: str) -> None:
        pressed.append(digit)

    task = asyncio.create_task(
        CallSession(
            leg, provider, clock=virtual_time.loop_clock(), telephony_options=OPTIONS, dtmf_handler=on_dtmf
        ).run()
    )
    for digit in "42#":
        leg.queue.put_nowait(DtmfReceived(digit))
    await until(lambda: len(pressed) == 3 and len(provider.texts) == 3)
    assert pressed == ["4", "2", "#"]
    assert provider.texts[0] == ("The caller pressed the key 4 on their keypad.", False)
    leg.queue.put_nowait(CallEnded("Normal call clearing", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)


# --- one mechanism for "the caller hears the goodbye, then BYE": core deadlines, on virtual time -------------


def test_dl6_a_failed_session_plays_the_closing_message_then_hangs_up_on_a_core_deadline() -> None:
    from bridge.engine.commands import EndSession, HangUp
    from tests.support.session_engine import Call

    message = bytes(320) * 25  # 500 ms
    call = Call(closing_message=message)
    call.core.replacement_failed(2, "x", call.now)  # (no recovery: nothing happens)
    call.provider(SessionClosed(1, "connection lost", False))
    call.core.replacement_failed(2, "HTTP 503", call.now)
    call._drain()
    assert [c for c in call.commands if isinstance(c, EndSession)] == [
        EndSession("the replacement connection failed: HTTP 503", True)
    ]
    assert not [c for c in call.commands if isinstance(c, HangUp)]  # not while the message plays
    assert call.core.next_deadline() == call.now + 600 * 1_000_000  # its 500 ms and 100 ms of margin
    call.tick(count=29)
    assert not [c for c in call.commands if isinstance(c, HangUp)]
    call.tick(count=1)
    assert [c for c in call.commands if isinstance(c, HangUp)] == [
        HangUp("the replacement connection failed: HTTP 503")
    ]
    assert [f.item_id for f in call.sent] == ["final-message"] * 25  # the caller heard all of it first


def test_dl6_end_call_waits_for_the_goodbye_to_be_played_then_hangs_up() -> None:
    from bridge.engine.commands import HangUp
    from tests.support.session_engine import Call, pcmu_tone

    call = Call(telephony=OPTIONS)
    call.provider(ToolCallRequested(1, "call_e", "end_call", "{}"))
    answered = [c for c in call.commands if isinstance(c, DeliverResult)]
    assert len(answered) == 1 and "goodbye" in answered[0].output
    call.provider(AudioReceived(1, pcmu_tone(300), PCMU_8K))  # the goodbye
    call.tick(count=10)
    assert not [c for c in call.commands if isinstance(c, HangUp)]
    call.tick(count=30)  # played, and the item is over (300 ms quiet)
    [hangup] = [c for c in call.commands if isinstance(c, HangUp)]
    assert "end_call" in hangup.reason and len(call.sent) == 15  # every goodbye frame left before the BYE
    silent = Call(telephony=OPTIONS)  # a model that says nothing: the timeout ends the call
    silent.provider(ToolCallRequested(1, "call_e", "end_call", "{}"))
    silent.advance(1_990)
    assert not [c for c in silent.commands if isinstance(c, HangUp)]
    silent.advance(20)
    assert [c for c in silent.commands if isinstance(c, HangUp)]
