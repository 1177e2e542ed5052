"""Early media of a call the bridge placed, in the session shell on virtual time (bridge/engine/early_media.py,
bridge/server/session.py): the far end's audio before the answer is recorded and offered to the machine
detector as evidence, never given to the model unless the route asks, starts none of the detector's timers,
and a failure after it is reported as such."""

from __future__ import annotations

import asyncio
import json

from bridge.engine.amd import AmdOptions, AmdVerdict
from bridge.engine.early_media import EarlyMedia, EarlyMediaWindow
from bridge.server.api import CallSetup, ServerConfig, _play_early_media
from bridge.server.records import RECORD_NOTICES, EarlyMediaReport
from bridge.server.webhook import event_key
from rtp.ledger import CarrierLedger
from rtp.units import NS_PER_MS as MS
from sip.leg import CallEnded, EarlyMediaStarted, FrameReceived, LegFeatures, MediaStarted
from tests.support import virtual_time
from tests.support.amd import quiet, speech
from tests.support.records import builder, outcome
from tests.support.seams_hold import DialledFakeLeg, TextProvider, wait_for
from tests.support.session import FakeLeg, session

event_loop_policy = virtual_time.policy_fixture()


class Tap:
    """--record's view of the caller side (bridge/server/session.py `MediaTap`)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def channel(self, leg: object, start_ns: int) -> object:
        return leg

    def caller(self, pcm: bytes, now: int) -> None:
        self.frames.append(pcm)


async def play(leg: FakeLeg, frames: list[bytes]) -> None:
    for i, pcm in enumerate(frames):
        leg.queue.put_nowait(FrameReceived(pcm, i, i))
        await asyncio.sleep(0.02)


async def ringing_call(
    **kwargs: object,
) -> tuple[DialledFakeLeg, TextProvider, object, asyncio.Task[object], list[object], Tap]:
    leg, provider, notices, tap = DialledFakeLeg(), TextProvider(), [], Tap()
    call = session(leg, provider, notice_sink=lambda _id, n: notices.append(n), media_tap=tap, **kwargs)
    task: asyncio.Task[object] = asyncio.create_task(call.run())  # type: ignore[arg-type]
    await wait_for(lambda: call.coordinator is not None)
    assert call.push_update("Greet the callee.")
    clock = virtual_time.loop_clock()
    leg.queue.put_nowait(EarlyMediaStarted("PCMU/8000", 183, clock()))  # a 183 with SDP
    await asyncio.sleep(0.01)
    return leg, provider, call, task, notices, tap


async def test_early_media_is_recorded_and_evidence_but_never_reaches_the_model() -> None:
    leg, provider, call, task, notices, tap = await ringing_call(amd=AmdOptions())
    await play(leg, speech(2000))  # "the person you are calling ..." before any answer
    assert len(tap.frames) == 100  # the recording has it
    assert provider.sent == [] and provider.texts == []  # the model heard nothing, said nothing
    detector = call._amd_gate.detector  # type: ignore[attr-defined]
    assert detector.next_deadline() is None  # no timer of the detector runs before the answer
    await asyncio.sleep(6.0)  # a slow ring: nothing times out
    assert [n for n in notices if isinstance(n, AmdVerdict)] == [] and provider.texts == []
    leg.queue.put_nowait(MediaStarted("PCMU/8000"))  # the answer, 8 s after the 183
    await asyncio.sleep(0.01)
    await play(leg, speech(500) + quiet(900))  # "hello?" and a pause
    (verdict,) = [n for n in notices if isinstance(n, AmdVerdict)]
    assert verdict.kind == "human" and verdict.since_answer_ms < 1600  # timed from the answer, not the 183
    assert verdict.early_media_ms == 2000 and verdict.early_voiced_ms > 0  # the evidence, flagged as early
    await play(leg, quiet(200))
    assert provider.sent != [] and provider.texts == ["Greet the callee."]  # from the release on: the callee
    (started, ended) = [n for n in notices if isinstance(n, EarlyMedia)]
    assert (started.phase, started.status, ended.phase, ended.outcome) == (
        "started",
        183,
        "ended",
        "answered",
    )
    assert 8000 <= ended.duration_ms <= 8100
    leg.queue.put_nowait(CallEnded("bye", 200, True, 0, 0))
    summary = await asyncio.wait_for(task, 5)
    assert "early media" not in summary.reason  # type: ignore[attr-defined]


async def test_a_failure_after_early_media_is_reported_as_such_in_events_record_and_cdr() -> None:
    leg, provider, call, task, notices, _tap = await ringing_call()
    await play(leg, speech(3000))  # "the number you dialled is not in service"
    leg.queue.put_nowait(CallEnded("Busy Here", 486, True, 0, 0))
    summary = await asyncio.wait_for(task, 5)
    assert provider.sent == []
    assert summary.reason == "486 Busy Here; early media heard for 3.0 s"  # type: ignore[attr-defined]
    early = [n for n in notices if isinstance(n, EarlyMedia)]
    assert [(n.phase, n.status, n.outcome) for n in early] == [
        ("started", 183, ""),
        ("ended", 486, "486 Busy Here"),
    ]
    assert 3000 <= early[1].duration_ms <= 3100
    records = builder(CarrierLedger())
    events = [e for n in notices if isinstance(n, RECORD_NOTICES) for e in records.notice(n, 0)]
    reports = [e for e in events if isinstance(e, EarlyMediaReport)]
    assert [event_key(e) for e in reports] == ["early_media-started", "early_media-ended"]
    assert reports[1].to_json()["event"] == "early_media" and reports[1].to_json()["status"] == 486
    _, record = records.finish(outcome(), 0)
    cdr = json.loads(record.cdr_line())["early_media"]
    assert cdr["outcome"] == "486 Busy Here" and cdr["status"] == 486 and 3000 <= cdr["duration_ms"] <= 3100
    assert abs(cdr["start_ms"] - early[0].at_ms) <= 1 and cdr["to_provider"] is False
    assert "early_media" not in builder(CarrierLedger()).finish(outcome(), 0)[1].to_json()  # none: no key


async def test_the_route_may_give_early_media_to_the_model() -> None:
    leg, provider, call, task, notices, _tap = await ringing_call(early_media_to_provider=True)
    await play(leg, speech(1000))  # an IVR's menu, read by the model before the answer
    assert len(provider.sent) >= 45 and provider.texts == []  # heard; the greeting still waits for the answer
    assert [n.to_provider for n in notices if isinstance(n, EarlyMedia)] == [True]
    leg.queue.put_nowait(CallEnded("bye", 487, False, 0, 0))
    await asyncio.wait_for(task, 5)


def test_the_window_reports_once_and_only_what_started() -> None:
    window = EarlyMediaWindow(1_000 * MS)
    assert window.ended(486, "Busy Here", 2_000 * MS) is None and window.failure_note is None  # none started
    assert window.started(183, 1_500 * MS) == EarlyMedia("started", 183, 500, 0, "", False)
    assert window.started(180, 1_600 * MS) is None and window.open
    assert window.ended(404, "Not Found", 4_000 * MS) == EarlyMedia(
        "ended", 404, 3000, 2500, "404 Not Found", False
    )
    assert window.ended(404, "404 Not Found", 5_000 * MS) is None and not window.open
    assert window.failure_note == "early media heard for 2.5 s"


class EarlyMediaFakeLeg(FakeLeg):
    features = LegFeatures(early_media=True)

    def __init__(self) -> None:
        super().__init__()
        self.played: list[str | bytes] = []

    def play_early_media(self, audio: str | bytes) -> bool:
        self.played.append(audio)
        return True


def test_an_inbound_call_plays_its_routes_early_media_else_the_servers_and_off_is_off() -> None:
    leg = EarlyMediaFakeLeg()
    _play_early_media(leg, CallSetup(), ServerConfig())  # off by default
    _play_early_media(leg, CallSetup(), ServerConfig(early_media="off"))
    assert leg.played == []
    _play_early_media(leg, CallSetup(), ServerConfig(early_media="ringback"))
    _play_early_media(
        leg, CallSetup(early_media="off"), ServerConfig(early_media="ringback")
    )  # the route's off
    _play_early_media(leg, CallSetup(early_media=b"\x01\x00"), ServerConfig(early_media="ringback"))
    assert leg.played == ["ringback", b"\x01\x00"]
    plain = FakeLeg()  # a leg that cannot: nothing, and no error
    _play_early_media(plain, CallSetup(), ServerConfig(early_media="ringback"))


def test_a_reason_that_carries_its_status_is_not_given_it_twice() -> None:
    window = EarlyMediaWindow(0)
    window.started(183, 0)
    ended = window.ended(486, "486 Busy Here", 1_000 * MS)
    assert ended is not None and ended.outcome == "486 Busy Here"
