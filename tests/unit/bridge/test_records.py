"""The call's events and record (bridge/server/records.py) on virtual time, against a real carrier ledger.

The ledger is filled the way the media clock fills it (one entry per 20 ms frame handed to the carrier); the
builder is fed the notices the coordinator makes. Nothing here sleeps.
"""

from __future__ import annotations

import json

from bridge.engine.commands import BargedIn, RecoveryChanged, RolloverChanged, Transcript
from bridge.engine.usage import UsageMeter
from bridge.server.records import MAX_TEXT_CHARS, CallInfo, Utterance
from providers.events import SessionClosed, UsageUpdated
from rtp.ledger import CarrierLedger
from tests.support.records import INFO, MS, T0, builder, outcome


def transmit(ledger: CarrierLedger, item: str, from_ms: int, frames: int, *, epoch: int = 0) -> None:
    """`frames` frames of `item` handed to the carrier every 20 ms from session time `from_ms`."""
    start = ledger.transmitted_ms(item)
    for i in range(frames):
        ledger.record(item, start + 20 * i, epoch, T0 + (from_ms + 20 * i) * MS)


def at(ms: int) -> int:
    return T0 + ms * MS


def test_call_started_names_the_call() -> None:
    event = builder(CarrierLedger()).started()
    body = event.to_json()
    assert body["event"] == "call_started" and body["call"]["call_id"] == "call-1"
    assert body["call"]["called"] == "bot" and body["started_at"] == 1_700_000_000.0


def test_a_caller_utterance_has_its_text_start_and_end() -> None:
    b = builder(CarrierLedger())
    assert b.notice(Transcript("caller", "hel", 900, False), at(1000)) == []  # interim text is not one
    [u] = b.notice(Transcript("caller", " Where is my order? ", 900, True, 0, 2400), at(3400))
    assert isinstance(u, Utterance)
    assert (u.role, u.text, u.start_ms, u.end_ms, u.seq) == ("caller", "Where is my order?", 900, 2400, 1)
    assert u.to_json() == {
        "event": "utterance",
        "call_id": "call-1",
        "seq": 1,
        "role": "caller",
        "text": "Where is my order?",
        "start_ms": 900,
        "end_ms": 2400,
    }


def test_a_caller_text_past_the_bound_reaches_the_application_cut_and_the_cut_counted() -> None:
    b = builder(CarrierLedger())
    huge = "x" * (64 * 1024)  # a corrupt frame once carried 64 KiB as one caller transcript
    [u] = b.notice(Transcript("caller", f" {huge} ", 900, True, 0, 2400), at(3400))
    assert isinstance(u, Utterance)
    assert u.text == huge[:MAX_TEXT_CHARS]
    assert u.to_json()["text_cut_chars"] == len(huge) - MAX_TEXT_CHARS
    assert len(json.dumps(u.to_json())) < MAX_TEXT_CHARS + 400


def test_an_assistant_reply_streamed_past_the_bound_is_cut_and_counted() -> None:
    ledger = CarrierLedger()
    b = builder(ledger, quiet_ms=600)
    for i in range(100):  # 100 fragments of 1,000 characters: 100,000 in all
        b.notice(Transcript("assistant", "y" * 1_000, 1000 + i, False), at(1000 + i))
    [u] = b.handle_timer(at(1099 + 600))
    assert isinstance(u, Utterance)
    assert u.text == "y" * MAX_TEXT_CHARS
    assert u.text_cut_chars == 100_000 - MAX_TEXT_CHARS


def test_an_assistant_utterance_is_timed_by_the_ledger_and_closes_when_its_audio_is_over() -> None:
    ledger = CarrierLedger()
    b = builder(ledger, quiet_ms=600)
    assert b.notice(Transcript("assistant", "It shipped ", 3000, False), at(3010)) == []
    transmit(ledger, "out-1", 3040, 40)  # 800 ms of it left, from 3040 to 3840 ms
    b.notice(Transcript("assistant", "yesterday.", 3300, False), at(3300))
    deadline = b.next_deadline()
    assert deadline is not None
    assert b.handle_timer(at(3500)) == []  # still being transmitted: not over yet
    deadline = b.next_deadline()
    assert deadline == at(3820) + 600 * MS  # the last frame left at 3820 ms (and ends at 3840)
    assert b.handle_timer(deadline - 1) == []
    [u] = b.handle_timer(deadline)
    assert isinstance(u, Utterance)
    assert (u.role, u.text, u.start_ms, u.end_ms, u.heard_ms) == (
        "assistant",
        "It shipped yesterday.",
        3040,
        3840,
        800,
    )
    assert not u.interrupted and u.to_json()["cut"] is None and u.to_json()["interrupted"] is False
    assert b.next_deadline() is None


def test_a_long_reply_keeps_every_item_when_the_ledgers_entries_have_moved_on() -> None:
    ledger = CarrierLedger(max_entries=20)  # entries are bounded (GC), the per-item summary is not
    b = builder(ledger, quiet_ms=600)
    b.notice(Transcript("assistant", "A long answer, ", 1000, False), at(1000))
    transmit(ledger, "out-1", 1020, 100)  # 2 s of it, then 2 s of the next item, with no text between
    transmit(ledger, "out-2", 3020, 100)
    assert {e.item_id for e in ledger.entries()} == {"out-2"}  # out-1's entries are gone
    [u] = b.handle_timer(at(5020 + 600))
    assert isinstance(u, Utterance)
    assert (u.start_ms, u.end_ms, u.heard_ms) == (1020, 5020, 4000)


def test_barge_in_cut_point_is_what_the_ledger_had_transmitted_when_the_caller_cut_in() -> None:
    ledger = CarrierLedger()
    b = builder(ledger)
    b.notice(Transcript("assistant", "Your order number forty two was shipped on", 2000, False), at(2000))
    transmit(ledger, "out-1", 2020, 31)  # 620 ms left (2020 .. 2640 ms)
    cut_at = at(2650)
    heard = (("out-1", ledger.transmitted_ms("out-1")),)  # bridge/engine/barrier.py reads this at the cut
    notice = BargedIn(2650, "local_vad", 1400, heard, -10.0)
    # The next reply's frames leave before the builder gets to the notice: they are not part of the cut one.
    transmit(ledger, "out-2", 3500, 10)
    [u] = b.notice(notice, cut_at)
    assert isinstance(u, Utterance) and u.interrupted and u.cut is not None
    assert u.cut.at_ms == 2650 and u.cut.source == "local_vad"
    assert u.cut.items == (("out-1", 620),)  # the point it was cut at, in the item
    assert (u.start_ms, u.end_ms, u.heard_ms) == (2020, 2640, 620)
    body = u.to_json()
    assert body["interrupted"] is True and body["cut"] == {
        "at_ms": 2650,
        "source": "local_vad",
        "items": [["out-1", 620]],
    }
    # The next reply is an utterance of its own, with only its own frames.
    b.notice(Transcript("assistant", "Sorry, go on.", 3490, False), at(3490))
    [after] = b.handle_timer(at(3700 + 600))
    assert isinstance(after, Utterance)
    assert (after.start_ms, after.end_ms, after.heard_ms, after.interrupted) == (3500, 3700, 200, False)
    assert b.barge_ins == 1


def test_a_barge_in_while_nothing_was_playing_cuts_nothing() -> None:
    ledger = CarrierLedger()
    b = builder(ledger)
    b.notice(Transcript("assistant", "Hello.", 100, False), at(100))
    transmit(ledger, "out-1", 120, 10)
    assert b.notice(BargedIn(2000, "provider", 0, ()), at(2000)) == []  # its audio was long over
    [u] = b.handle_timer(at(2000))
    assert isinstance(u, Utterance) and not u.interrupted and u.heard_ms == 200


def test_a_final_assistant_transcript_replaces_its_deltas_and_a_new_reply_opens_a_new_utterance() -> None:
    ledger = CarrierLedger()
    b = builder(ledger)
    b.notice(Transcript("assistant", "Hel", 100, False), at(100))
    transmit(ledger, "item_a", 100, 5)
    b.notice(Transcript("assistant", "Hello there.", 100, True), at(300))
    [first] = b.notice(Transcript("assistant", "Anything", 400, False), at(400))
    assert isinstance(first, Utterance) and first.text == "Hello there." and first.heard_ms == 100
    transmit(ledger, "item_b", 420, 5)
    events, record = b.finish(outcome(), at(600))
    assert [e.text for e in events if isinstance(e, Utterance)] == ["Anything"]
    assert record.utterances == 2


def test_a_reply_still_playing_when_the_next_one_begins_is_heard_whole_and_closes_first() -> None:
    """A provider streams faster than real time: a greeting's text and audio are all in, and the goodbye asked
    right after it (a budget's) begins, while the greeting's frames still leave. The greeting is an utterance
    of all its 400 ms, not of the 60 ms that had left when the goodbye's text came; then the goodbye."""
    ledger = CarrierLedger()
    b = builder(ledger, quiet_ms=600)
    b.notice(Transcript("assistant", "Hello, how can I help?", 100, True), at(100))
    transmit(ledger, "greeting", 100, 3)  # 100, 120, 140 ms have left
    assert b.notice(Transcript("assistant", "Goodbye.", 150, True), at(150)) == []  # it still plays
    transmit(ledger, "greeting", 160, 17)  # the rest of it: to 500 ms
    transmit(ledger, "goodbye", 500, 20)  # then the goodbye: to 900 ms
    assert b.next_deadline() == at(480 + 600)  # the greeting's last frame, then the quiet rule
    assert b.handle_timer(at(1000)) == []
    timed = [(1080, 880 + 600), (1480, None)]  # each closes at its deadline: the next one's is then due
    texts = ["Hello, how can I help?", "Goodbye."]
    for seq, ((close_ms, next_ms), text) in enumerate(zip(timed, texts, strict=True), 1):
        [u] = b.handle_timer(at(close_ms))
        assert isinstance(u, Utterance) and (u.seq, u.text, u.heard_ms) == (seq, text, 400)
        assert (u.start_ms, u.end_ms) == ((100, 500) if seq == 1 else (500, 900))
        assert b.next_deadline() == (None if next_ms is None else at(next_ms))


def test_a_barge_in_cuts_a_reply_still_playing_and_the_one_after_it_in_order() -> None:
    ledger = CarrierLedger()
    b = builder(ledger, quiet_ms=600)
    b.notice(Transcript("assistant", "First.", 100, True), at(100))
    transmit(ledger, "one", 100, 5)  # 100 .. 200 ms
    assert b.notice(Transcript("assistant", "Second.", 190, False), at(190)) == []
    transmit(ledger, "one", 200, 5)  # to 300 ms, where the caller cuts in
    heard = (("one", ledger.transmitted_ms("one")),)
    events = b.notice(BargedIn(300, "local_vad", 400, heard, -10.0), at(300))
    assert [(u.seq, u.text, u.heard_ms, u.interrupted) for u in events if isinstance(u, Utterance)] == [
        (1, "First.", 200, True),
        (2, "Second.", 0, True),
    ]
    events, record = b.finish(outcome(), at(400))
    assert not [e for e in events if isinstance(e, Utterance)] and record.utterances == 2


def test_a_recovery_and_a_rollover_are_counted_with_the_connections_used() -> None:
    b = builder(CarrierLedger())
    b.notice(RecoveryChanged(2, "transport_lost", "reconnecting", 0), at(1000))
    b.notice(RecoveryChanged(2, "transport_lost", "awaiting_user", 400), at(1400))
    b.notice(RecoveryChanged(2, "transport_lost", "done", 2100), at(3100))
    b.notice(RolloverChanged("opening", "conn-3", "token 3", 9000), at(9000))
    b.notice(RolloverChanged("floor", "conn-3", "token 3", 9800), at(9800))
    b.notice(RolloverChanged("closed", "conn-2", "rolled over", 10500), at(10500))
    b.notice(RolloverChanged("opening", "conn-4", "token 4", 20000), at(20000))  # the call ends first
    _, record = b.finish(outcome(), at(21000))
    assert record.connections == ("conn-1", "conn-2", "conn-3", "conn-4")
    [recovery] = record.recoveries
    assert (recovery.connection_id, recovery.cause, recovery.outcome, recovery.duration_ms) == (
        "conn-2",
        "transport_lost",
        "recovered",
        2100,
    )
    assert [(r.connection_id, r.outcome) for r in record.rollovers] == [
        ("conn-3", "completed"),
        ("conn-4", "unfinished"),
    ]
    body = json.loads(record.cdr_line())
    assert body["connections"] == {"count": 4, "ids": ["conn-1", "conn-2", "conn-3", "conn-4"]}
    assert body["recoveries"]["count"] == 1 and body["recoveries"]["items"][0]["outcome"] == "recovered"
    assert body["rollovers"]["count"] == 1  # completed ones


def test_a_recovery_still_running_at_the_end_is_unfinished() -> None:
    b = builder(CarrierLedger())
    b.notice(RecoveryChanged(2, "output_stale", "reconnecting", 0), at(1000))
    _, record = b.finish(outcome(), at(1500))
    assert [(r.outcome, r.duration_ms) for r in record.recoveries] == [("unfinished", None)]


def _usage_status(*closes: SessionClosed) -> dict[str, object]:
    meter = UsageMeter()
    meter.observe(UsageUpdated(1, audio_seconds=4.0, input_tokens=10, output_tokens=20, cumulative=True))
    for close in closes:
        meter.observe(close)
    return {"usage": meter.status(), "qos": {"frames_in": 600, "underruns": 0}}


def test_usage_complete_only_when_every_connection_finalised_its_usage() -> None:
    lost = _usage_status(
        SessionClosed(1, "lost", finalized=False, audio_seconds=4.0),
        SessionClosed(2, "bye", finalized=True, audio_seconds=3.0),
    )
    _, record = builder(CarrierLedger()).finish(outcome(lost), at(1000))
    assert record.usage.complete is False and record.usage.audio_seconds == 7.0  # HR12: still counted
    clean = _usage_status(SessionClosed(1, "bye", finalized=True, audio_seconds=4.0))
    _, record = builder(CarrierLedger()).finish(outcome(clean), at(1000))
    assert record.usage.complete is True
    body = json.loads(record.cdr_line())
    assert body["usage"] == {"audio_seconds": 4.0, "input_tokens": 10, "output_tokens": 20, "complete": True}
    assert body["qos"] == {"frames_in": 600, "underruns": 0}


def test_the_record_has_duration_who_hung_up_why_and_the_sip_status() -> None:
    events, record = builder(CarrierLedger()).finish(outcome(), at(12_500))
    assert events == []
    body = record.to_json()
    assert (body["duration_s"], body["ended_by"], body["reason"], body["sip_status"]) == (
        12.5,
        "caller",
        "200 OK",
        200,
    )
    assert body["provider"] == "echo" and body["frames_in"] == 600 and body["frames_out"] == 150
    assert body["cost"] is None  # no session status: nothing was priced
    assert body["latency"] == {  # no assistant turn was timed
        "turns": 0,
        "provider_ms": {"p50": None, "max": None},
        "bridge_ms": {"p50": None, "max": None},
        "wait_ms": {"p50": None, "max": None},
        "items": [],
    }
    line = record.cdr_line()
    assert "\n" not in line and json.loads(line)["call"]["call_id"] == "call-1"


def test_the_coordinator_s_caller_transcript_carries_its_end_on_the_session_timeline() -> None:
    from bridge.engine.coordinator import SessionCoordinator
    from providers.base import Capabilities
    from providers.events import InputTranscript, SessionStarted
    from providers.limits import OPENAI_REALTIME
    from rtp.audio import PCMU_8K
    from rtp.playout import Playout
    from sip.leg import PlayoutLeg

    caps = Capabilities(server_vad=True, speech_end_events=True, timed_captions=True, truncate=True)
    core = SessionCoordinator(
        limits=OPENAI_REALTIME.for_format(PCMU_8K),
        output_format=PCMU_8K,
        capabilities=caps,
        channel=PlayoutLeg(Playout()),
        now=0,
    )
    core.provider_event(SessionStarted(1, "sess", None), 2_000 * MS)  # this connection's clock starts at 2 s
    core.notices()
    core.provider_event(InputTranscript(1, "Hello", start_ms=300, end_ms=1_100, final=True), 4_000 * MS)
    core.provider_event(InputTranscript(1, "Again", final=True), 6_000 * MS)  # no times given
    said = [n for n in core.notices() if isinstance(n, Transcript)]
    assert [(n.text, n.at_ms, n.end_ms) for n in said] == [("Hello", 2_300, 3_100), ("Again", 6_000, None)]


def test_the_call_record_names_the_trunk_the_call_came_in_on() -> None:
    from sip.core.identity import call_identity

    identity = call_identity(
        "call-9",
        request_uri="sip:100@bridge",
        from_uri="sip:a@pbx",
        to_uri="sip:100@bridge",
        sip_call_id="x@pbx",
        source="10.0.0.5:5060",
        trunk="office-pbx",
    )
    info = CallInfo.of(identity, route=None, provider="echo")
    assert info.to_json()["trunk"] == "office-pbx"
    assert json.loads(json.dumps(INFO.to_json()))["trunk"] is None  # a call of no trunk says so
