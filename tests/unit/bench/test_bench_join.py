"""The fault campaign's join (tests/bench/campaign_join.py) on small synthetic inputs: each loop the caller spoke
is one case, jobs are counted per caller request through the fakes' notes, and connections are traced by the
provider's session id. No processes, no clocks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import campaign_join as cj

ROOT = Path(__file__).resolve().parents[3]
LOOP, SPEECH = 5_000, 3_000
T0 = 1_000.0  # unix s: the session timeline's 0


def said(k: int, jitter: int = 0) -> int:
    """Where the caller's k-th sentence ended on the session timeline (phase 3,500 ms)."""
    return 3_500 + k * LOOP + jitter


def utterance(k: int, seq: int, jitter: int = 0) -> dict[str, Any]:
    return {"seq": seq, "role": "caller", "text": f"[said {seq}]", "start_ms": None,
            "end_ms": said(k, jitter), "t": T0 + said(k, jitter) / 1000 + 0.4}  # fmt: skip


def view(
    utterances: list[dict[str, Any]], jobs: list[dict[str, Any]] = (), end_ms: int = 40_000
) -> cj.CallView:  # type: ignore[assignment]
    return cj.CallView("call-1", "openai-realtime", T0, end_ms, utterances, list(jobs))


def note(kind: str, at_ms: int, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "unix": T0 + at_ms / 1000, **fields}


def test_each_loop_the_caller_spoke_is_one_case() -> None:
    """Loops 0..6 are counted (7 ends after the call's end less the settling time): once, twice without a
    report (duplicated), twice across a reported input discontinuity, lost inside one, and lost unexplained."""
    emitted = [
        utterance(0, 1, -120),
        utterance(1, 2, 80),
        utterance(1, 3, 300),  # the same sentence again: RO3
        utterance(2, 4, -200),
        utterance(2, 5, 150),
        utterance(5, 6, 40),
        utterance(6, 7, -60),
        utterance(7, 8),  # said after 37,500 ms: not counted
    ]
    gaps = [(12_000, 12_400, "voice_transport_recovery"), (16_000, 17_000, "voice_transport_recovery")]
    # a report that ended before loop 4's sentence began does not explain losing it
    gaps.append((said(4) - SPEECH - 900, said(4) - SPEECH - 100, "voice_transport_recovery"))
    classes, jobs, flagged = cj.join_call(
        view(emitted), {}, gaps, {}, loop_ms=LOOP, speech_ms=SPEECH, first_ms=100
    )
    assert classes == {
        "once": 3,
        "duplicated": 1,
        "split_by_discontinuity": 1,
        "lost_in_discontinuity": 1,
        "lost_unexplained": 1,
    }
    told = {f["utterance"]: (f["kind"], f["explained"]) for f in flagged if not f["kind"].startswith("tool")}
    assert told == {
        1: ("duplicated", False),
        2: ("split_by_discontinuity", True),
        3: ("lost_in_discontinuity", True),
        4: ("lost_unexplained", False),
    }
    dup = next(f for f in flagged if f["kind"] == "duplicated")
    assert [e["seq"] for e in dup["emitted"]] == [2, 3] and dup["call"] == "call-1"
    assert abs(dup["at_ms"] - said(1)) <= 300  # the phase is the median of what was heard, jitter and all
    # loops 0, 5 and 6 came once and asked for nothing, 1 twice; 2 was cut by a reported discontinuity; 3 and 4
    # never came: every request is in one class
    assert jobs == {"tool_not_run": 4, "tool_split_by_discontinuity": 1, "tool_for_lost_utterance": 2}
    tools = {f["utterance"]: f["kind"] for f in flagged if f["kind"].startswith("tool")}
    assert tools == {0: "tool_not_run", 1: "tool_not_run", 2: "tool_split_by_discontinuity", 5: "tool_not_run",
                     6: "tool_not_run"}  # fmt: skip


def test_a_call_that_ended_early_counts_only_what_it_could_hear() -> None:
    """Before the first connection (speech begun earlier) and after the end, nothing is expected."""
    classes, _, flagged = cj.join_call(
        view([utterance(2, 1)], end_ms=said(3) + 1_000), {}, [], {}, loop_ms=LOOP, speech_ms=SPEECH,
        first_ms=said(1) - SPEECH + 1,
    )  # fmt: skip
    assert classes == {"once": 1}  # loop 1 began 1 ms before the connection; loop 3 ended 1 s before the end
    assert flagged == [{**flagged[0], "kind": "tool_not_run"}]


def test_an_application_utterance_belongs_to_the_loop_the_fake_heard_its_transcript_in() -> None:
    """The bridge stamped loop 2's transcript (conn-1 heard it at loop 2's end) 3.5 s early, in loop 1's time:
    it is loop 2's, loop 1 was lost, and the stamp is listed (HR11) but is not itself a loss."""
    conn = cj.FakeConn("xai", 3, "sess_a")
    conn.heard = [
        note("heard", said(k) + 80, item=f"i{k}", text=f"[utterance {k + 1}, 3.0 s]") for k in range(5)
    ]
    emitted = [utterance(k, k + 1) | {"text": f"[utterance {k + 1}, 3.0 s]"} for k in (0, 3, 4)]
    emitted.append(utterance(2, 3, jitter=-3_500) | {"text": "[utterance 3, 3.0 s]"})
    classes, _, flagged = cj.join_call(
        view(emitted, end_ms=said(4) + 3_000), {1: conn}, [], {}, loop_ms=LOOP, speech_ms=SPEECH, first_ms=0
    )
    assert classes == {"once": 4, "lost_unexplained": 1, "stamped_off": 1}
    [lost] = [f for f in flagged if f["kind"] == "lost_unexplained"]
    [stamp] = [f for f in flagged if f["kind"] == "stamped_off"]
    assert lost["utterance"] == 1 and lost["heard_by"][0]["text"] == "[utterance 2, 3.0 s]"
    assert stamp["utterance"] == 2 and stamp["off_ms"] == -3_580 and not stamp["explained"]


def test_a_buffer_committed_before_the_sentence_ended_belongs_to_that_sentence() -> None:
    """RO2's hard stop commits the old connection's buffer mid-sentence: 1.6 s ending in loop 2's start,
    committed 2.6 s before loop 2 ended (nearer loop 1's end). It is loop 2's request: with the next
    connection's whole loop 2 that is two jobs for one request, and loop 1 keeps its one."""
    old, new = cj.FakeConn("xai", 1, "a"), cj.FakeConn("xai", 2, "b")
    old.heard = [note("heard", said(k), item=f"o{k}", text=f"[o {k}]", audio_ms=SPEECH) for k in (0, 1)]
    old.heard.append(note("heard", said(2) - 2_600, item="o2", text="[o 2]", audio_ms=1_600))
    new.heard = [note("heard", said(k), item=f"n{k}", text=f"[n {k}]", audio_ms=SPEECH) for k in (2, 3)]
    old.tool_calls = [
        note("tool_call", said(k) + 50, call_id=f"co{k}", input="audio", **{"for": f"o{k}"}) for k in (1, 2)
    ]
    new.tool_calls = [note("tool_call", said(2) + 50, call_id="cn2", input="audio", **{"for": "n2"})]
    emitted = [utterance(0, 1) | {"text": "[o 0]"}, utterance(1, 2) | {"text": "[o 1]"}]
    emitted += [
        utterance(2, 3) | {"text": "[o 2]", "end_ms": said(2) - 2_400},
        utterance(3, 4) | {"text": "[n 3]"},
    ]
    jobs = [{"job_id": "job-1"}, {"job_id": "job-2"}, {"job_id": "job-3"}]
    classes, counted, flagged = cj.join_call(
        view(emitted, jobs, end_ms=said(3) + 3_000), {1: old, 2: new}, [],
        {"job-1": "co1", "job-2": "co2", "job-3": "cn2"}, loop_ms=LOOP, speech_ms=SPEECH, first_ms=0,
    )  # fmt: skip
    assert classes == {
        "once": 4
    }  # the commit is loop 2's one transcript (the next connection's was not sent)
    assert counted == {"tool_once": 1, "tool_duplicated": 1, "tool_not_run": 2}
    [dup] = [f for f in flagged if f["kind"] == "tool_duplicated"]
    assert dup["utterance"] == 2 and dup["asked_on"] == {"job-2": "conn-1", "job-3": "conn-2"}


def test_a_sentence_whose_transcript_frame_was_corrupted_is_lost_to_that_fault() -> None:
    """The fake heard loops 1 and 2; the `mutate` fault corrupted loop 1's transcript frame as it left (a
    mutated note at the same instant): lost to the fault. Loop 2's transcript left intact and never reached
    the application: unexplained."""
    conn = cj.read_notes("xai", [
        {"conn": 0, "session": "s", "kind": "heard", "unix": T0 + said(1) / 1000, "item": "a", "text": "[a]"},
        {"conn": 0, "session": "s", "kind": "mutated", "unix": T0 + said(1) / 1000, "of": "conversation.item.input_audio_transcription.completed"},
        {"conn": 0, "session": "s", "kind": "heard", "unix": T0 + said(2) / 1000, "item": "b", "text": "[b]"},
        {"conn": 0, "session": "s", "kind": "mutated", "unix": T0 + said(2) / 1000, "of": "response.output_audio.delta"},
    ])[0]  # fmt: skip
    emitted = [utterance(k, k + 1) for k in (0, 3, 4)]
    classes, _, flagged = cj.join_call(
        view(emitted, end_ms=said(4) + 3_000), {1: conn}, [], {}, loop_ms=LOOP, speech_ms=SPEECH, first_ms=0
    )
    assert classes == {"once": 3, "lost_to_corrupt_frame": 1, "lost_unexplained": 1}
    assert {f["utterance"]: f["kind"] for f in flagged if f["kind"].startswith("lost")} == {
        1: "lost_to_corrupt_frame",
        2: "lost_unexplained",
    }


def test_with_a_capture_a_sentence_whose_audio_never_reached_the_bridge_was_not_said() -> None:
    """SIPp starved of CPU sends short: loop 3 brought 80 % of its packets (under 90 %), loop 4 all of them,
    and neither reached the application: 3 was not said to the bridge, 4 was lost."""
    packets = [T0 + t / 1000 for t in range(0, 40_000, 20)]
    start3 = said(3) - SPEECH
    packets = [t for t in packets if not start3 <= (t - T0) * 1000 < start3 + SPEECH // 5]
    emitted = [utterance(k, k + 1) for k in (0, 1, 2, 5, 6)]
    v = cj.CallView("call-1", "xai", T0, 40_000, emitted, [], caller_packets=packets)
    classes, _, flagged = cj.join_call(v, {}, [], {}, loop_ms=LOOP, speech_ms=SPEECH, first_ms=100)
    assert classes == {"once": 5, "lost_unexplained": 1, "not_on_the_wire": 1}
    assert [f["utterance"] for f in flagged if f["kind"] == "lost_unexplained"] == [4]


def test_jobs_are_counted_per_caller_request_through_the_notes_not_by_time() -> None:
    """A rollover: the old and the next connection both heard loop 1 and both asked for the tool; the bridge
    dispatched both (job-1, job-2): one request, two runs. job-2 was stamped 3 s later (in loop 2's time):
    the notes, not the time, say which request it answers. A tool call the fake made for a text input is
    a re-request on context; loop 2 heard once with no job is listed with the bridge's held job."""
    old, new = cj.FakeConn("xai", 4, "sess_a"), cj.FakeConn("xai", 5, "sess_b")
    old.heard = [note("heard", said(1) + 100, item="item_1", text="[utterance 1, 3.0 s]"),
                 note("heard", said(2) + 100, item="item_2", text="[utterance 2, 3.0 s]")]  # fmt: skip
    old.tool_calls = [note("tool_call", said(1) + 150, call_id="call_A", input="audio", **{"for": "item_1"})]
    new.heard = [note("heard", said(1) + 120, item="item_9", text="[utterance 1, 2.1 s]")]
    new.tool_calls = [
        note("tool_call", said(1) + 140, call_id="call_B", input="audio", **{"for": "item_9"}),
        note("tool_call", said(3) - 2_000, call_id="call_C", input="text", **{"for": "item_10"}),
    ]
    new.faults = [note("fault", said(1) - 1_000, spec="6/abrupt_close")]
    jobs = [
        {"job_id": "job-1", "requested_at_ms": said(1) + 200},
        {"job_id": "job-2", "requested_at_ms": said(1) + 3_000},
        {"job_id": "job-3", "requested_at_ms": said(3) - 1_900},
    ]
    emitted = [utterance(k, k + 1) for k in range(6)]
    held = {"job-4": [said(2) + 200, "not_dispatched", "requested before the caller's fresh interval"]}
    marks = [(said(1) - 500, "rollover floor conn-2"), (said(1) + 4_000, "recovery transport_lost")]
    _, counted, flagged = cj.join_call(
        view(emitted, jobs), {1: old, 2: new}, [], {"job-1": "call_A", "job-2": "call_B", "job-3": "call_C"},
        marks, {"call-1": held}["call-1"], loop_ms=LOOP, speech_ms=SPEECH, first_ms=0,
    )  # fmt: skip
    assert counted["tool_duplicated"] == 1 and counted["tool_for_context"] == 1
    assert counted["tool_not_run"] == 5 and counted["tool_once"] == 0  # loops 0, 2, 3, 4, 5: no job ran
    dup = next(f for f in flagged if f["kind"] == "tool_duplicated")
    assert dup["utterance"] == 1 and dup["jobs"] == ["job-1", "job-2"] and not dup["explained"]
    assert dup["asked_on"] == {"job-1": "conn-1", "job-2": "conn-2"}  # the old and the next connection
    assert [h["conn"] for h in dup["heard_by"]] == ["conn-1", "conn-2"]
    assert dup["faults"] == [
        {"conn": "conn-2", "fake": "xai#5", "spec": "6/abrupt_close", "at_ms": said(1) - 1_000}
    ]
    # the loop's end is where the fakes heard it (100 ms after it was said here)
    assert dup["at_ms"] == said(1) + 100
    assert dup["nearest_rollover"] == {"ms": -600, "what": "rollover floor conn-2"}
    assert dup["nearest_recovery"] == {"ms": 3_900, "what": "recovery transport_lost"}
    context = next(f for f in flagged if f["kind"] == "tool_for_context")
    assert context["job"] == "job-3" and context["tool_call"] == "call_C"
    loop2 = next(f for f in flagged if f["kind"] == "tool_not_run" and f["utterance"] == 2)
    assert loop2["bridge_jobs"] == [{"job": "job-4", "requested_ms": said(2) + 200, "state": "not_dispatched",
                                     "detail": "requested before the caller's fresh interval"}]  # fmt: skip


def test_connections_are_traced_by_session_id_and_a_resumed_session_in_order() -> None:
    """Realtime-family ids name one connection; a Gemini session resumed on a second connection keeps its id,
    so the bridge's connections of that id pair with the fake's in the order they started."""
    fakes = {
        "xai": cj.read_notes("xai", [
            {"conn": 0, "session": "sess_a", "kind": "session", "unix": 10.0},
            {"conn": 1, "session": "sess_b", "kind": "session", "unix": 11.0},
        ]),
        "gemini-live": cj.read_notes("gemini-live", [
            {"conn": 7, "session": "S", "kind": "session", "unix": 30.0},
            {"conn": 3, "session": "S", "kind": "session", "unix": 20.0},
            {"conn": 9, "session": "T", "kind": "session", "unix": 20.5},
        ]),
    }  # fmt: skip
    bridge = [
        cj.BridgeConn("call-1", 1, "sess_b", 0),
        cj.BridgeConn("call-2", 1, "sess_a", 0),
        cj.BridgeConn("call-3", 2, "S", 9_000),
        cj.BridgeConn("call-3", 1, "S", 0),
        cj.BridgeConn("call-4", 1, "-", 0),  # no id given: not traced
    ]
    provider = {"call-1": "xai", "call-2": "xai", "call-3": "gemini-live", "call-4": "gemini-live"}
    traced = {key: c.key for key, c in cj.attribute(bridge, fakes, provider).items()}
    assert traced == {
        ("call-1", 1): "xai#1",
        ("call-2", 1): "xai#0",
        ("call-3", 1): "gemini-live#3",
        ("call-3", 2): "gemini-live#7",
    }


def test_the_bridge_log_is_read_as_the_session_writes_it() -> None:
    """The connection line is the one bridge/server/session.py logs (its format string, filled in)."""
    fmt = "call %s conn-%d provider session %s started at %d ms"
    assert f'"{fmt}"' in (ROOT / "bridge" / "server" / "session.py").read_text()
    lines = [
        "INFO parlora.session: " + fmt % ("call-7", 3, "sess_x", 12_345),
        "WARNING parlora.session: call call-7 audio_discontinuity input: 75 caller frames dropped "
        "(voice_transport_recovery) at 27762 ms",
        "WARNING parlora.session: call call-7 audio_discontinuity output: 16000 bytes of provider audio dropped "
        "(output_overflow) at 42177 ms",
        "WARNING parlora.session: call call-7 rollover floor: conn-4 (seeded) at 50000 ms",
        "INFO parlora.session: call call-7 job-5 (lookup_order) running at 42121 ms: dispatched to the "
        "application (call del_4f)",
        "INFO parlora.session: call call-7 job-5 (lookup_order) delivered at 42122 ms: revision 1 sent",
    ]
    log = cj.read_bridge_log(lines)
    assert log.connections == [cj.BridgeConn("call-7", 3, "sess_x", 12_345)]
    assert log.input_gaps["call-7"] == [(27_762 - 75 * 20, 27_762, "voice_transport_recovery")]
    assert log.marks["call-7"] == [(42_177, "recovery output_overflow"), (50_000, "rollover floor conn-4")]
    assert log.jobs == {("call-7", "job-5"): "del_4f"}
    assert log.job_states["call-7"] == {"job-5": [42_121, "delivered", "revision 1 sent"]}


def test_join_sums_the_calls_and_counts_what_is_unexplained() -> None:
    log = cj.read_bridge_log(["call call-1 conn-1 provider session sess_a started at 0 ms"])
    fakes = {"openai-realtime": cj.read_notes("openai-realtime", [
        {"conn": 0, "session": "sess_a", "kind": "open", "unix": T0},
        {"conn": 0, "session": "sess_a", "kind": "heard", "unix": T0 + said(1) / 1000, "item": "i", "text": "x"},
    ])}  # fmt: skip
    r = cj.join([view([utterance(0, 1), utterance(2, 2), utterance(2, 3)])], log, fakes, loop_ms=LOOP,
                speech_ms=SPEECH)  # fmt: skip
    u = r["utterances"]
    assert (u["spoken"], u["once"], u["duplicated"], u["lost_unexplained"]) == (7, 1, 1, 5)
    assert (u["connections_logged"], u["connections_traced"]) == (1, 1)
    assert r["unexplained"] == 6
    lost1 = next(f for f in r["flagged"] if f["utterance"] == 1 and f["kind"] == "lost_unexplained")
    assert lost1["heard_by"] == [{"conn": "conn-1", "fake": "openai-realtime#0", "session": "sess_a",
                                  "text": "x", "at_ms": said(1)}]  # fmt: skip


# call-96 of the long run on 887d30b (xAI, loop 6,277 ms, sentence 3,977 ms), its session times: the old
# connection (conn-36) heard the caller's sentences whole, then, when the floor moved to the next connection
# (conn-37) 2.1 s after its last one, the first 1.9 s of audio since it (the pause and the next sentence's
# start). RO3: that text stands for the next sentence, whose whole text from conn-37 was not emitted, and S2:
# conn-37's tool call for it was answered "handled by the previous connection" (job-213), never dispatched.
CALL_96_LOOP, CALL_96_SPEECH = 6_277, 3_977
CALL_96_OLD = [(1_091_084, 733), (1_097_597, 4_286), (1_103_609, 4_106), (1_110_023, 4_026), (1_116_323, 3_986),
               (1_122_793, 3_686), (1_124_922, 1_920)]  # fmt: skip
CALL_96_NEW = [(1_129_315, 3_906), (1_135_714, 3_346), (1_141_380, 4_186)]
# (seq, text, start_ms, end_ms, when the application received it) of the caller's utterances
CALL_96_EMITTED = [
    (459, "[utterance 2, 4.3 s]", 1_092_615, 1_097_550, 1_097_870),
    (461, "[utterance 3, 4.1 s]", 1_098_913, 1_103_601, 1_103_930),
    (463, "[utterance 4, 4.0 s]", 1_105_139, 1_110_023, 1_110_364),
    (465, "[utterance 5, 4.0 s]", 1_111_480, 1_116_284, 1_116_686),
    (467, "[utterance 6, 3.7 s]", 1_117_795, 1_122_755, 1_123_063),
    (469, "[utterance 7, 1.9 s]", 1_124_069, 1_124_898, 1_125_173),
    (472, "[utterance 2, 3.3 s]", 1_130_367, 1_135_639, 1_135_970),
]


def call_96_connections() -> dict[int, cj.FakeConn]:
    conns = {36: cj.FakeConn("xai", 857, "s36"), 37: cj.FakeConn("xai", 881, "s37")}
    for token, heard in ((36, CALL_96_OLD), (37, CALL_96_NEW)):
        for n, (at, audio) in enumerate(heard, 1):
            text = f"[utterance {n}, {audio / 1000:.1f} s]"
            conns[token].heard.append(note("heard", at, item=f"i{token}_{n}", n=n, text=text, audio_ms=audio))
            conns[token].tool_calls.append(
                note("tool_call", at, call_id=f"c{token}_{n}", input="audio", **{"for": f"i{token}_{n}"})
            )
    return conns


def test_what_a_connection_took_after_a_sentence_belongs_to_the_next_one() -> None:
    """The old connection's last utterance is the 1.9 s it received after it had taken sentence k whole (the
    audio since its previous utterance): it is sentence k+1's, which the application received once (that text)
    and whose request ran once (job-212). One phase for the call put its span, which ends 60 ms before where
    that phase had k+1 begin, into sentence k: k "duplicated" with two jobs, k+1 "lost"."""
    emitted = [
        {"seq": seq, "role": "caller", "text": text, "start_ms": start, "end_ms": end, "t": T0 + got / 1000}
        for seq, text, start, end, got in CALL_96_EMITTED
    ]
    jobs = [{"job_id": f"job-{n}"} for n in (207, 208, 209, 210, 211, 212, 214)]
    calls = {f"job-{n}": f"c36_{i}" for n, i in zip((207, 208, 209, 210, 211, 212), range(2, 8), strict=True)}
    held = {"job-213": [1_129_389, "handled_before", "the previous connection handled this request (S2)"]}
    classes, counted, flagged = cj.join_call(
        view(emitted, jobs, end_ms=1_140_500), call_96_connections(), [], calls | {"job-214": "c37_2"}, [],
        held, loop_ms=CALL_96_LOOP, speech_ms=CALL_96_SPEECH, first_ms=1_089_885,
    )  # fmt: skip
    assert classes == {"once": 7}
    assert counted == {"tool_once": 7}
    assert flagged == []


def test_a_transcript_stamped_at_its_speech_start_is_found_by_when_it_came() -> None:
    """call-40 of the same run (openai-realtime): `mutate` corrupted conn-38's speech stop for its utterance 4,
    so the bridge stamped that text at its speech start (start = end = 1,186,175 ms), 5.1 s before the fake
    took it, but it reached the application 0.4 s after the fake took it. It is that sentence's, once (and
    listed as stamped off, HR11); by its stamp alone it fell beyond the text's reach and into the sentence
    before: that one "duplicated", its own "lost"."""
    conn = cj.FakeConn("openai-realtime", 864, "s38")
    for n, (at, audio) in enumerate(
        [(1_172_708, 2_680), (1_178_639, 3_120), (1_185_046, 3_020), (1_191_305, 3_020), (1_197_539, 2_960),
         (1_202_012, 2_040)], 1,
    ):  # fmt: skip
        conn.heard.append(note("heard", at, item=f"i{n}", n=n, text=f"[utterance {n}, {audio / 1000:.1f} s]"))
        conn.heard[-1]["audio_ms"] = audio
    emitted = [
        {"seq": seq, "role": "caller", "text": text, "start_ms": start, "end_ms": end, "t": T0 + got / 1000}
        for seq, text, start, end, got in [
            (390, "[utterance 2, 3.1 s]", 1_173_756, 1_178_657, 1_178_993),
            (392, "[utterance 3, 3.0 s]", 1_179_913, 1_184_997, 1_185_399),
            (394, "[utterance 4, 3.0 s]", 1_186_175, 1_186_175, 1_191_743),
            (397, "[utterance 5, 3.0 s]", 1_192_247, 1_197_498, 1_197_855),
        ]
    ]
    classes, _, flagged = cj.join_call(
        view(emitted, end_ms=1_200_500), {38: conn}, [], {}, loop_ms=CALL_96_LOOP, speech_ms=CALL_96_SPEECH,
        first_ms=1_174_000,
    )  # fmt: skip
    assert classes == {"once": 4, "stamped_off": 1}
    [stamp] = [f for f in flagged if f["kind"] == "stamped_off"]
    assert stamp["emitted"][0]["seq"] == 394 and stamp["off_ms"] == 1_186_175 - 1_191_305


def test_a_stream_that_falls_behind_keeps_its_numbering() -> None:
    """SIPp starved by its host sends each loop 40 ms late: over 200 loops the sentences end 8 s after where
    one phase for the call puts them. Each sentence was heard and received once: 200 cases, all once (with
    one phase, those of either end of the call fell a loop off: duplicated beside lost)."""
    conn = cj.FakeConn("xai", 1, "s")
    emitted = []
    for k in range(200):
        at = said(0) + k * (LOOP + 40)
        conn.heard.append(note("heard", at, item=f"i{k}", text=f"[u {k}]", audio_ms=SPEECH))
        emitted.append({"seq": k, "role": "caller", "text": f"[u {k}]", "start_ms": at - SPEECH, "end_ms": at,
                        "t": T0 + at / 1000 + 0.3})  # fmt: skip
    classes, _, _ = cj.join_call(
        view(emitted, end_ms=said(0) + 199 * (LOOP + 40) + 3_000), {1: conn}, [], {}, loop_ms=LOOP,
        speech_ms=SPEECH, first_ms=0,
    )  # fmt: skip
    assert classes == {"once": 200}


def test_a_corrupted_caption_joined_to_the_next_text_is_that_text() -> None:
    """call-58 of the same run (Gemini): `mutate` corrupted the caption chunks of conn-36's utterance 6 (a
    64 Ki-character string among them) so its text never ended; the bridge joined its next text, the 1.7 s the
    old connection took when the floor moved, to it: the application received the garbage ending in
    "[utterance 7, 1.7 s]" once, for the next sentence, whose whole text from conn-37 stood down (RO3).
    Sentence 6 is lost to the corrupt frame. Not found by its text, it was put by its stamp (1.6 s before the
    fake took it) into sentence 6: that one "once", the next "lost"."""
    old, new = cj.FakeConn("gemini-live", 1334, "S36"), cj.FakeConn("gemini-live", 1370, "S37")
    for conn, first, heard in (
        (old, 3, [(1_090_789, 3_560), (1_096_946, 3_680), (1_103_340, 3_760), (1_109_760, 3_620), (1_113_360, 1_720)]),
        (new, 2, [(1_116_107, 3_720), (1_122_321, 3_480)]),
    ):  # fmt: skip
        for n, (at, audio) in enumerate(heard, first):
            text = f"[utterance {n}, {audio / 1000:.1f} s]"
            conn.heard.append(note("heard", at, item=str(n), n=n, text=text, audio_ms=audio))
    old.corrupted = [T0 + 1_109_760 / 1000]  # its inputTranscription frames of utterance 6
    emitted = [
        {"seq": seq, "role": "caller", "text": text, "start_ms": start, "end_ms": end, "t": T0 + got / 1000}
        for seq, text, start, end, got in [
            (502, "[utterance 3, 3.6 s]", 1_086_595, 1_090_492, 1_091_032),
            (504, "[utterance 4, 3.7 s]", 1_092_815, 1_096_721, 1_097_110),
            (506, "[utterance 5, 3.8 s]", 1_099_226, 1_103_116, 1_103_592),
            (509, "jfuHmTdAhLNpzm8t" * 4_096 + "[utterance 7, 1.7 s]", 1_111_739, 1_111_739, 1_113_567),
            (514, "[utterance 3, 3.5 s]", 1_118_013, 1_122_035, 1_122_669),
        ]
    ]
    classes, _, flagged = cj.join_call(
        view(emitted, end_ms=1_125_500), {36: old, 37: new}, [], {}, loop_ms=CALL_96_LOOP,
        speech_ms=CALL_96_SPEECH, first_ms=1_085_000,
    )  # fmt: skip
    assert classes == {"once": 5, "lost_to_corrupt_frame": 1, "stamped_off": 1}
    [lost] = [f for f in flagged if f["kind"] == "lost_to_corrupt_frame"]
    assert [h["text"] for h in lost["heard_by"]] == ["[utterance 6, 3.6 s]"]
