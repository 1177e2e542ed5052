"""Machine detection in the session shell on virtual time: an outbound call's first words wait for the
detector's verdict (bridge/server/session.py `AmdGate`), a machine's wait for its beep, a person's go at once."""

from __future__ import annotations

import asyncio
import json

from bridge.engine.amd import AmdBeep, AmdOptions, AmdVerdict
from bridge.server.api import Application, Server, ServerConfig, amd_line
from bridge.server.records import RECORD_NOTICES, AmdResult
from bridge.server.webhook import event_key
from rtp.ledger import CarrierLedger
from sip.leg import CallEnded, FrameReceived, MediaStarted
from tests.support import virtual_time
from tests.support.amd import quiet, speech, tone
from tests.support.records import builder, outcome
from tests.support.seams_hold import DialledFakeLeg, TextProvider, wait_for
from tests.support.session import FakeLeg, session

event_loop_policy = virtual_time.policy_fixture()


async def play(leg: FakeLeg, frames: list[bytes]) -> None:
    """The callee's frames, one every 20 ms as the media tick brings them."""
    for i, pcm in enumerate(frames):
        leg.queue.put_nowait(FrameReceived(pcm, i, i))
        await asyncio.sleep(0.02)


async def answered_call(
    amd: AmdOptions | None,
) -> tuple[DialledFakeLeg, TextProvider, object, asyncio.Task[object], list[object]]:
    leg, provider, notices = DialledFakeLeg(), TextProvider(), []
    call = session(leg, provider, amd=amd, notice_sink=lambda _id, n: notices.append(n))
    task: asyncio.Task[object] = asyncio.create_task(call.run())  # type: ignore[arg-type]
    await wait_for(lambda: call.coordinator is not None)
    assert call.push_update("Greet the callee.")
    leg.queue.put_nowait(MediaStarted("PCMU/8000"))  # the callee answered
    await asyncio.sleep(0.01)
    return leg, provider, call, task, notices


async def hang_up(leg: FakeLeg, task: asyncio.Task[object]) -> None:
    leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))
    await asyncio.wait_for(task, 5)


async def test_the_greeting_waits_for_a_human_verdict_and_goes_at_once() -> None:
    leg, provider, call, task, notices = await answered_call(AmdOptions())
    assert provider.texts == [] and call.status()["line"] == "ringing"  # type: ignore[attr-defined]
    await play(leg, speech(500))  # "hello?"
    assert provider.texts == []  # a greeting alone decides nothing: held
    await play(leg, quiet(600))
    assert provider.texts == []  # 600 ms of silence: not yet the 800 ms a person waits
    await play(leg, quiet(300))
    verdicts = [n for n in notices if isinstance(n, AmdVerdict)]
    assert [v.kind for v in verdicts] == ["human"] and provider.texts == ["Greet the callee."]
    assert call.amd_events == verdicts  # type: ignore[attr-defined]
    await hang_up(leg, task)


async def test_a_silent_callee_is_timed_by_the_clock_then_greeted() -> None:
    leg, provider, call, task, notices = await answered_call(AmdOptions())
    await asyncio.sleep(2.0)  # no frames at all (RFC 3389 peer): the detector's own timer decides
    assert provider.texts == []
    await asyncio.sleep(0.6)
    assert [n.kind for n in notices if isinstance(n, AmdVerdict)] == ["silence"]
    assert provider.texts == ["Greet the callee."]
    await hang_up(leg, task)


async def test_a_machine_verdict_holds_the_greeting_until_the_beep() -> None:
    leg, provider, call, task, notices = await answered_call(AmdOptions())
    await play(leg, speech(3000))  # a recorded greeting runs on
    assert [n.kind for n in notices if isinstance(n, AmdVerdict)] == ["machine"]
    assert provider.texts == []  # the message waits for the tone
    await play(leg, quiet(200) + tone(300, 1000))
    assert provider.texts == []  # the tone is still on: the mailbox records only after it
    await play(leg, quiet(100))
    assert [type(n) for n in notices if isinstance(n, AmdVerdict | AmdBeep)] == [AmdVerdict, AmdBeep]
    assert provider.texts == ["Greet the callee."]
    await hang_up(leg, task)


async def test_without_amd_the_greeting_goes_at_the_answer() -> None:
    leg, provider, call, task, notices = await answered_call(None)
    await wait_for(lambda: provider.texts != [])
    assert provider.texts == ["Greet the callee."] and call.amd_events == []  # type: ignore[attr-defined]
    await hang_up(leg, task)


async def test_an_inbound_call_never_runs_amd() -> None:
    leg, provider = FakeLeg(), TextProvider()
    call = session(leg, provider, amd=AmdOptions())
    task: asyncio.Task[object] = asyncio.create_task(call.run())  # type: ignore[arg-type]
    leg.queue.put_nowait(MediaStarted("PCMU/8000"))
    await wait_for(lambda: call.coordinator is not None)
    await play(leg, speech(3000))
    assert call.amd_events == []
    await hang_up(leg, task)


async def test_the_verdict_and_the_beep_are_application_events_and_in_the_record_and_cdr() -> None:
    leg, provider, call, task, notices = await answered_call(AmdOptions())
    await play(leg, speech(3000) + quiet(200) + tone(300, 1000) + quiet(100))
    await hang_up(leg, task)
    records = builder(CarrierLedger())
    events = [e for n in notices if isinstance(n, RECORD_NOTICES) for e in records.notice(n, 0)]
    amd = [e for e in events if isinstance(e, AmdResult)]
    assert [(e.kind, e.verdict) for e in amd] == [("verdict", "machine"), ("beep", "machine")]
    assert 2400 <= amd[0].since_answer_ms < amd[1].since_answer_ms <= 4000
    assert amd[0].to_json()["event"] == "amd" and [event_key(e) for e in amd] == ["amd-verdict", "amd-beep"]
    _, record = records.finish(outcome(), 0)
    cdr = json.loads(record.cdr_line())["amd"]
    assert [(a["kind"], a["verdict"]) for a in cdr] == [("verdict", "machine"), ("beep", "machine")]
    assert "amd" not in builder(CarrierLedger()).finish(outcome(), 0)[1].to_json()  # no AMD: no key


async def test_call_prints_the_verdict_line_kept_by_the_server_for_the_call() -> None:
    leg, provider, call, task, notices = await answered_call(AmdOptions())
    await play(leg, speech(3000) + quiet(200) + tone(300, 1000) + quiet(100))
    await hang_up(leg, task)
    line = amd_line(call.amd_events)  # type: ignore[attr-defined]
    assert line.startswith("AMD machine after ") and "; beep after " in line
    server = Server(Application(), ServerConfig())
    for i in range(70):
        server._keep_amd_line(f"call-{i}", line)
    assert server.amd_line("call-69") == line and server.amd_line("call-0") is None  # bounded
