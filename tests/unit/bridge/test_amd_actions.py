"""What an outbound call does after its AMD verdict, in the session shell on virtual time (bridge/server/session.py
`AmdGate`, bridge/engine/amd.py `AmdChoice`): talk, a message after the beep then BYE (the model's words or a
recording), or a hang-up at the verdict; the application's answer to the verdict; the callee's audio withheld
from the model until the action starts; the action in the record, the CDR line and what `call` prints; a
call's choice over the server's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from bridge.engine.amd import MESSAGE_NOTE, AmdAction, AmdPlan, AmdPolicy, AmdVerdict
from bridge.server.api import CallSetup, ServerConfig, _amd_plan, amd_line
from bridge.server.records import RECORD_NOTICES, AmdResult
from rtp.ledger import CarrierLedger
from sip.leg import CallEnded, FrameReceived, MediaStarted
from tests.support import virtual_time
from tests.support.amd import quiet, speech, tone
from tests.support.records import builder, outcome
from tests.support.seams_hold import DialledFakeLeg, TextProvider, wait_for
from tests.support.session import FakeLeg, session

event_loop_policy = virtual_time.policy_fixture()

GREETING = "Greet the callee."
MESSAGE = "This is Acme: your order is ready. Please call us back."
Hook = Callable[[AmdVerdict, AmdAction], Awaitable[str | None]]


async def play(leg: FakeLeg, frames: list[bytes]) -> None:
    """The callee's frames, one every 20 ms as the media tick brings them (none once the call is over)."""
    for i, pcm in enumerate(frames):
        if leg.hangups:
            return
        leg.queue.put_nowait(FrameReceived(pcm, i, i))
        await asyncio.sleep(0.02)


class Call:
    def __init__(self, plan: AmdPlan, hook: Hook | None = None) -> None:
        self.leg, self.provider, self.notices = DialledFakeLeg(), TextProvider(), []
        self.session = session(
            self.leg,
            self.provider,
            amd=plan,
            amd_hook=hook,
            notice_sink=lambda _id, n: self.notices.append(n),
        )

    async def answered(self) -> Call:
        self.task: asyncio.Task[object] = asyncio.create_task(self.session.run())  # type: ignore[arg-type]
        await wait_for(lambda: self.session.coordinator is not None)
        self.leg.queue.put_nowait(MediaStarted("PCMU/8000"))  # the callee answered
        await asyncio.sleep(0.01)
        return self

    def kinds(self) -> list[str]:
        return [n.kind for n in self.notices if isinstance(n, AmdVerdict)]

    async def end(self) -> None:
        if not self.leg.hangups:
            self.leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))
        await asyncio.wait_for(self.task, 5)


MAILBOX = speech(3000)  # a recorded greeting that runs on: `machine` after 2.5 s
BEEP = quiet(200) + tone(300, 1000) + quiet(100)  # the beep has ended with the last frame
HELLO = speech(500) + quiet(900)  # "hello?", then the wait of a person: `human`


async def test_a_mailbox_hung_up_on_is_hung_up_at_the_verdict_and_the_model_never_hears_or_speaks() -> None:
    call = await Call(AmdPlan(policy=AmdPolicy(machine="hang_up"), greeting=GREETING)).answered()
    await play(call.leg, MAILBOX)
    assert call.kinds() == ["machine"]
    assert call.leg.hangups == ["AMD machine: hung up (route's choice)"]  # at the verdict, not at a beep
    await asyncio.wait_for(call.task, 5)
    summary = call.task.result()
    assert summary.ended_by == "bridge"  # type: ignore[attr-defined]
    assert call.provider.texts == [] and call.provider.sent == []  # no greeting, no callee audio
    assert call.session.amd_action is not None and call.session.amd_action.action == "hang_up"


async def test_a_mailboxs_recording_plays_after_its_beep_then_bye() -> None:
    recording = b"".join(tone(1000, 600, dbfs=-12.0))
    call = await Call(
        AmdPlan(policy=AmdPolicy(machine="message"), greeting=GREETING, message_audio=recording)
    ).answered()
    await play(call.leg, MAILBOX)
    assert call.kinds() == ["machine"] and call.leg.hangups == [] and call.leg.playout.depth == 0
    await play(call.leg, BEEP[:-5])
    assert call.leg.playout.depth == 0  # the tone is still on: the mailbox records only after it
    await play(call.leg, BEEP[-5:])
    frames = [call.leg.playout.pull(0) for _ in range(call.leg.playout.depth)]
    assert b"".join(f.pcm for f in frames if f is not None)[: len(recording)] == recording
    assert call.leg.hangups == []  # the recording plays first (1 s)
    await asyncio.sleep(1.2)
    assert call.leg.hangups == ["AMD machine: message played (route's choice)"]
    await asyncio.wait_for(call.task, 5)
    assert call.provider.texts == [] and call.provider.sent == []  # the model was never released


async def test_a_mailboxs_spoken_message_is_the_routes_text_after_the_beep_then_bye() -> None:
    plan = AmdPlan(policy=AmdPolicy(machine="message"), greeting=GREETING, message=MESSAGE)
    call = await Call(plan).answered()
    await play(call.leg, MAILBOX + BEEP[:-5])
    assert call.provider.texts == []  # the greeting is not asked for; the message waits for the beep
    await play(call.leg, BEEP[-5:])
    assert call.provider.texts == [MESSAGE_NOTE.format(text=MESSAGE)]  # the message, not the greeting
    await asyncio.sleep(10.0)
    assert call.leg.hangups == []  # the model says it (it is given up to 60 s: a message, not a goodbye)
    await asyncio.sleep(51.0)
    assert call.leg.hangups == ["AMD machine: message left (route's choice)"]
    await asyncio.wait_for(call.task, 5)


async def test_a_mailbox_the_route_talks_to_gets_the_greeting_after_its_beep() -> None:
    call = await Call(AmdPlan(greeting=GREETING)).answered()
    await play(call.leg, MAILBOX + BEEP[:-5])
    assert call.provider.texts == []
    await play(call.leg, BEEP[-5:])
    assert call.provider.texts == [GREETING] and call.leg.hangups == []
    await call.end()


async def test_the_callees_audio_before_the_action_never_reaches_the_model() -> None:
    call = await Call(AmdPlan(greeting=GREETING)).answered()
    await play(call.leg, HELLO[:-10])
    assert call.kinds() == [] and call.provider.sent == []  # "hello?" and the wait: withheld
    await play(call.leg, HELLO[-10:])
    assert call.kinds() == ["human"] and call.provider.texts == [GREETING]
    await play(call.leg, quiet(200))
    assert len(call.provider.sent) >= 5  # from the release on, the callee is heard
    await call.end()


async def test_the_applications_answer_chooses_for_a_person_too() -> None:
    asked: list[tuple[str, str]] = []

    async def hang_up(verdict: AmdVerdict, default: AmdAction) -> str | None:
        asked.append((verdict.kind, default))
        return "hang_up"

    call = await Call(AmdPlan(greeting=GREETING), hang_up).answered()
    await play(call.leg, HELLO + quiet(100))
    assert asked == [("human", "talk")]
    assert call.leg.hangups == ["AMD human: hung up (application's choice)"] and call.provider.texts == []
    await asyncio.wait_for(call.task, 5)


async def test_a_slow_application_gets_decide_ms_then_the_routes_choice() -> None:
    async def slow(verdict: AmdVerdict, default: AmdAction) -> str | None:
        await asyncio.sleep(2.0)
        return "hang_up"

    call = await Call(AmdPlan(greeting=GREETING, policy=AmdPolicy(decide_ms=500)), slow).answered()
    await play(call.leg, HELLO)
    assert call.kinds() == ["human"] and call.provider.texts == []  # waiting for the application
    await asyncio.sleep(0.6)
    assert call.provider.texts == [GREETING]  # the route's: talk
    await asyncio.sleep(2.0)
    assert call.leg.hangups == []  # its late hang-up is ignored
    action = call.session.amd_action
    assert action is not None and (action.action, action.by) == ("talk", "route")
    await call.end()


async def test_the_action_is_in_the_record_the_cdr_and_the_line_call_prints() -> None:
    call = await Call(AmdPlan(policy=AmdPolicy(machine="hang_up"))).answered()
    await play(call.leg, MAILBOX)
    await asyncio.wait_for(call.task, 5)
    records = builder(CarrierLedger())
    events = [e for n in call.notices if isinstance(n, RECORD_NOTICES) for e in records.notice(n, 0)]
    assert [(e.kind, e.verdict) for e in events if isinstance(e, AmdResult)] == [("verdict", "machine")]
    cdr = json.loads(records.finish(outcome(), 0)[1].cdr_line())
    assert cdr["amd_action"]["action"] == "hang_up" and cdr["amd_action"]["by"] == "route"
    line = amd_line(call.session.amd_events, call.session.amd_action)
    assert line.startswith("AMD machine after ") and "; hang_up after " in line and "route's choice" in line


def test_the_calls_setup_chooses_over_the_servers_and_its_message_replaces_the_servers() -> None:
    config = ServerConfig(amd=True, amd_machine="hang_up", amd_message_audio=b"\0\0" * 160, amd_decide_ms=250)
    plan = _amd_plan(CallSetup(greeting="Hi"), config)
    assert (plan.policy, plan.greeting, plan.message, plan.message_audio) == (
        AmdPolicy("hang_up", 250),
        "Hi",
        None,
        b"\0\0" * 160,
    )
    plan = _amd_plan(CallSetup(amd_machine="message", amd_message="Call back."), config)
    assert (plan.policy.machine, plan.message, plan.message_audio) == ("message", "Call back.", None)
