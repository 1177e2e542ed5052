"""The answering-machine detector (bridge/engine/amd.py) on virtual time with synthetic signals: speech-like noise
bursts with a syllable cadence, tones, silence and noise."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine.amd import AmdBeep, AmdEvent, AmdNoBeep, AmdOptions, AmdVerdict, AnsweringMachineDetector
from rtp.units import NS_PER_MS as MS
from tests.support.amd import RATE, _amp, _pcm, noise, quiet, speech, tone

T0 = 5_000_000_000


def dual_tone(ms: int, a: float, b: float, dbfs: float = -15.0) -> list[bytes]:
    n = np.arange(ms * RATE // 1000)
    return _pcm(_amp(dbfs) * (np.sin(2 * np.pi * a * n / RATE) + np.sin(2 * np.pi * b * n / RATE)))


class Run:
    """Feeds frames every 20 ms from the answer, running the timer at each deadline as the shell does."""

    def __init__(self, options: AmdOptions | None = None, early: list[bytes] | None = None) -> None:
        self.det = AnsweringMachineDetector(options)
        self.now = T0
        self.events: list[AmdEvent] = []
        for f in early or []:
            assert self.det.frame(f, self.now) is None
            assert self.det.next_deadline() is None
            self.now += 20 * MS
        self.answered = self.now
        self.det.answered(self.now)

    def timers(self, until: int) -> None:
        deadline = self.det.next_deadline()
        while deadline is not None and deadline <= until:
            event = self.det.handle_timer(deadline)
            if event is not None:
                self.events.append(event)
            deadline = self.det.next_deadline()

    def feed(self, frames: list[bytes]) -> Run:
        """Each frame is received when its 20 ms of audio are complete."""
        for f in frames:
            self.now += 20 * MS
            self.timers(self.now)
            event = self.det.frame(f, self.now)
            if event is not None:
                self.events.append(event)
        return self

    def idle(self, ms: int) -> Run:
        """No frames (a peer that sends nothing in silence): only the clock."""
        self.now += ms * MS
        self.timers(self.now)
        return self

    @property
    def verdict(self) -> AmdVerdict:
        verdicts = [e for e in self.events if isinstance(e, AmdVerdict)]
        assert len(verdicts) == 1, self.events
        return verdicts[0]

    def ms(self, event: AmdEvent) -> float:
        return (event.at_ns - self.answered) / MS


def test_a_short_hello_then_silence_is_human_well_before_the_budget() -> None:
    run = Run().feed(quiet(300) + speech(600) + quiet(3000))
    v = run.verdict
    assert v.kind == "human"
    assert v.words == 1
    assert 500 <= v.greeting_ms <= 640
    assert 300 <= v.initial_silence_ms <= 340
    # 300 ms of line, 600 of speech, the 800 ms after-greeting silence: not the 4 s budget
    assert 1680 <= run.ms(v) <= 1760
    assert run.det.done
    assert len(run.events) == 1


def test_a_medium_greeting_needs_the_longer_silence_to_be_human() -> None:
    run = Run().feed(quiet(200) + speech(2000) + quiet(3000))
    v = run.verdict
    assert v.kind == "human"
    assert v.trailing_silence_ms == 1000
    assert 3150 <= run.ms(v) <= 3250


def test_a_long_greeting_is_a_machine_when_it_reaches_the_machine_length() -> None:
    run = Run().feed(quiet(100) + speech(6000))
    v = run.verdict
    assert v.kind == "machine"
    assert v.greeting_ms == 2500
    assert 2550 <= run.ms(v) <= 2650
    assert "2500 ms" in v.reason
    assert not run.det.done  # listening for the beep


def test_many_words_with_short_gaps_are_a_machine_before_the_machine_length() -> None:
    word = speech(240)
    run = Run().feed(quiet(200) + (word + quiet(200)) * 8)
    v = run.verdict
    assert v.kind == "machine"
    assert v.words == 5
    assert v.greeting_ms < 2500
    assert "5 words" in v.reason


def test_no_voice_is_silence_at_the_initial_silence_budget() -> None:
    run = Run().feed(quiet(5000))
    v = run.verdict
    assert v.kind == "silence"
    assert run.ms(v) == 2500
    assert v.words == 0


def test_a_word_starting_just_before_the_initial_silence_ends_is_heard() -> None:
    # its first 100 ms straddle the 2,500 ms mark: not yet a word when the initial silence ends
    run = Run().feed(quiet(2440) + speech(600) + quiet(3000))
    v = run.verdict
    assert v.kind == "human"
    assert 2440 <= v.initial_silence_ms <= 2460


def test_silence_is_decided_by_the_clock_when_no_frames_come() -> None:
    run = Run().idle(10_000)
    assert run.verdict.kind == "silence"
    assert run.ms(run.verdict) == 2500


def test_a_steady_noise_is_not_a_voice() -> None:
    run = Run().feed(noise(5000, -35.0))
    assert run.verdict.kind == "silence"


def test_a_hello_over_a_steady_noise_is_human() -> None:
    # the noise's level becomes the floor, so the silence after the hello is heard as silence
    line = noise(6000, -38.0)
    hello = [
        (np.frombuffer(a, "<i2").astype(float) + np.frombuffer(b, "<i2")).astype("<i2").tobytes()
        for a, b in zip(line[25:55], speech(600, -18.0), strict=True)
    ]
    run = Run().feed(line[:25] + hello + line[55:])
    v = run.verdict
    assert v.kind == "human"
    assert v.words == 1
    assert 1880 <= run.ms(v) <= 1960  # 500 ms of noise, 600 of hello, 800 of silence


def test_a_dual_ringback_tone_is_not_a_beep() -> None:
    run = Run().feed((dual_tone(1000, 440, 480) + quiet(2000)) * 2)
    assert run.verdict.kind == "silence"


@pytest.mark.parametrize("hz", [440, 850, 1000, 1400, 400, 2000, 1025])
def test_a_tone_alone_is_a_beep_reported_when_it_ends(hz: int) -> None:
    run = Run().feed(quiet(400) + tone(500, hz) + quiet(3000))
    v = run.verdict
    assert v.kind == "beep"
    assert abs(v.tone_hz - hz) <= 30
    assert v.tone_ms == 500
    assert run.ms(v) == 920  # the first frame after the tone, received at its end


def test_a_tone_that_changes_frequency_ends_there() -> None:
    # a two-tone beep: the first tone is a beep of its own, reported when the second starts
    run = Run().feed(quiet(400) + tone(300, 1000) + tone(300, 1400) + quiet(3000))
    v = run.verdict
    assert v.kind == "beep"
    assert abs(v.tone_hz - 1000) <= 30
    assert v.tone_ms == 300
    assert run.ms(v) == 720


def test_a_tone_shorter_than_the_beep_minimum_is_no_beep() -> None:
    run = Run().feed(quiet(400) + tone(100, 1000) + quiet(3000))
    assert run.verdict.kind != "beep"


def test_a_tone_whose_frames_stop_ends_by_the_clock() -> None:
    run = Run().feed(quiet(400) + tone(300, 1000)).idle(1000)
    v = run.verdict
    assert v.kind == "beep"
    assert run.ms(v) == 400 + 300 + 60  # the last tone frame, then three frame times with none


def test_after_a_machine_verdict_the_beep_is_its_own_event() -> None:
    run = Run().feed(quiet(200) + speech(4000) + quiet(500) + tone(400, 850) + quiet(3000))
    assert [type(e) for e in run.events] == [AmdVerdict, AmdBeep]
    assert run.verdict.kind == "machine"
    beep = run.events[1]
    assert isinstance(beep, AmdBeep)
    assert abs(beep.tone_hz - 850) <= 30
    assert beep.tone_ms == 400
    assert run.ms(beep) == 200 + 4000 + 500 + 400 + 20
    assert run.det.done


def test_a_machine_verdict_reached_during_a_tone_that_continues_the_greeting_is_reported() -> None:
    # no gap between the greeting and the tone: the tone's frames continue the greeting past the machine
    # length, then end as a beep
    run = Run().feed(quiet(200) + speech(2400) + tone(600, 1000) + quiet(3000))
    assert [type(e) for e in run.events] == [AmdVerdict, AmdBeep]
    assert run.verdict.kind == "machine"
    assert run.ms(run.verdict) < 200 + 2400 + 600


def test_a_greeting_ending_without_a_tone_ends_with_no_beep() -> None:
    run = Run().feed(quiet(200) + speech(4000) + quiet(5000))
    assert [type(e) for e in run.events] == [AmdVerdict, AmdNoBeep]
    end = run.events[1]
    assert 200 + 4000 + 2000 - 60 <= run.ms(end) <= 200 + 4000 + 2000 + 20
    assert "silence" in end.reason


def test_the_beep_wait_is_bounded() -> None:
    run = Run(AmdOptions(beep_wait_ms=3000)).feed(quiet(200) + speech(8000))
    assert [type(e) for e in run.events] == [AmdVerdict, AmdNoBeep]
    assert run.ms(run.events[1]) - run.ms(run.events[0]) == 3000


def test_no_rule_by_the_budget_is_unknown_at_the_budget() -> None:
    run = Run().feed(quiet(2400) + speech(3000))
    v = run.verdict
    assert v.kind == "unknown"
    assert run.ms(v) == 4000


def test_early_media_never_starts_a_timer_and_is_kept_as_flagged_evidence() -> None:
    # 10 s of announcement before the answer: were its frames timed, the budget would be spent at the answer
    run = Run(early=speech(10_000) + tone(600, 1000))
    assert run.det.handle_timer(run.answered - 1) is None
    run.feed(quiet(5000))
    v = run.verdict
    assert v.kind == "silence"
    assert run.ms(v) == 2500
    assert v.early_media_ms == 10_600
    assert v.early_voiced_ms > 5000


def test_a_timer_before_the_answer_decides_nothing() -> None:
    det = AnsweringMachineDetector()
    for now in (0, T0, T0 + 60_000 * MS):
        assert det.handle_timer(now) is None
        assert det.next_deadline() is None
    det.answered(T0)
    assert det.next_deadline() == T0 + 2500 * MS


def test_odd_and_empty_frames_are_counted_and_ignored() -> None:
    det = AnsweringMachineDetector()
    det.answered(T0)
    for i, f in enumerate([b"", b"\x01", bytes(319), bytes(321), bytes(640)]):
        assert det.frame(f, T0 + i * 20 * MS) is None
    assert det.frames_ignored == 5
    assert det.verdict is None


def test_frames_after_the_last_event_are_ignored() -> None:
    run = Run().feed(quiet(3000))
    assert run.verdict.kind == "silence"
    run.feed(speech(3000) + tone(500, 1000))
    assert len(run.events) == 1


# the property: any frame sequence, any early media, any gaps in the frames


_segment = st.tuples(
    st.sampled_from(["quiet", "speech", "tone", "noise", "digital", "bytes", "odd", "gap"]),
    st.integers(min_value=1, max_value=120),  # frames
    st.integers(min_value=0, max_value=2**31),
)


def _frames_of(kind: str, count: int, seed: int) -> list[bytes | None]:
    ms = count * 20
    rng = random.Random(seed)
    if kind == "quiet":
        return list(quiet(ms))
    if kind == "speech":
        return list(speech(ms, rng.uniform(-45, -5), seed))
    if kind == "tone":
        return list(tone(ms, rng.uniform(300, 2100), rng.uniform(-45, -3)))
    if kind == "noise":
        return list(noise(ms, rng.uniform(-60, -10), seed))
    if kind == "digital":
        return [bytes(320)] * count
    if kind == "bytes":
        return [rng.randbytes(320) for _ in range(count)]
    if kind == "odd":
        return [rng.randbytes(rng.choice([0, 1, 159, 321, 480])) for _ in range(count)]
    return [None] * count  # a gap: no frames, only time


@settings(max_examples=150, deadline=None)
@given(
    early=st.integers(min_value=0, max_value=300),
    segments=st.lists(_segment, max_size=12),
    total_ms=st.sampled_from([1000, 2000, 4000, 6000]),
)
def test_any_frames_give_exactly_one_verdict_within_the_budget(
    early: int, segments: list[tuple[str, int, int]], total_ms: int
) -> None:
    options = AmdOptions(total_ms=total_ms, initial_silence_ms=min(2500, total_ms))
    run = Run(options, early=speech(early * 20) if early else None)
    budget_end = run.answered + total_ms * MS
    for kind, count, seed in segments:
        for f in _frames_of(kind, count, seed):
            if f is None:
                run.idle(20)
            else:
                run.feed([f])
    run.idle(60_000)  # whatever came, the clock ends it
    v = run.verdict
    assert run.answered <= v.at_ns <= budget_end + 20 * MS
    assert run.events[0] is v
    after = run.events[1:]
    if v.kind == "machine":
        assert len(after) == 1 and isinstance(after[0], AmdBeep | AmdNoBeep)
        assert after[0].at_ns >= v.at_ns
    else:
        assert after == []
    assert run.det.done
    assert run.det.next_deadline() is None


@pytest.mark.parametrize(
    "bad",
    [
        {"total_ms": 0},
        {"beep_frequencies_hz": ()},
        {"beep_frequencies_hz": (1000, 4000)},
        {"machine_words": 0},
    ],
)
def test_options_out_of_range_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="AMD options out of range"):
        AmdOptions(**bad)  # type: ignore[arg-type]
