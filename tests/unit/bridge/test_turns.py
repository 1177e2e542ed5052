"""SE5 (input side): the caller's turns, local VAD merged with provider speech events, keyed by declared
capabilities — never by `answer_within_ms`, which is only the silent-provider watchdog."""

from __future__ import annotations

from bridge.engine.turns import CallerStarted, CallerStopped, TurnTracker
from bridge.engine.vad import VadOptions
from providers.base import Capabilities
from providers.events import SpeechStarted, SpeechStopped
from tests.support.session_engine import TICK, speech_frame

GPT_LIVE = Capabilities(server_vad=False, speech_end_events=False, timed_captions=True, truncate=False)
GEMINI = Capabilities(server_vad=True, speech_end_events=False, timed_captions=False, truncate=False)
REALTIME = Capabilities(
    server_vad=True, speech_end_events=True, timed_captions=True, truncate=True, client_commits=True
)


def run(tracker: TurnTracker, frames: list[bytes]) -> list[object]:
    changes = [tracker.frame(pcm, i * TICK, i * 20) for i, pcm in enumerate(frames)]
    return [c for c in changes if c is not None]


SPEECH = [speech_frame()] * 10 + [bytes(320)] * 20


def test_se5_without_server_vad_the_local_detector_barges_in_and_ends_the_turn() -> None:
    assert run(TurnTracker(GPT_LIVE, VadOptions()), SPEECH) == [
        CallerStarted("local_vad", None, barge=True),
        CallerStopped("local_vad"),
    ]


def test_se5_without_speech_end_events_the_local_detector_ends_the_turn_but_does_not_barge_in() -> None:
    tracker = TurnTracker(GEMINI, VadOptions())
    assert run(tracker, SPEECH) == [CallerStarted("local_vad", None, barge=False), CallerStopped("local_vad")]
    assert tracker.provider(SpeechStarted(1, 120)) == CallerStarted("provider", 120, barge=True)
    assert tracker.local_turn == (
        40,
        480,
    )  # detected after the 60 ms attack, over after the hangover (RO3 span)


def test_se5_answer_within_ms_does_not_decide_who_reports_turns() -> None:
    watched = Capabilities(
        server_vad=True, speech_end_events=True, timed_captions=True, truncate=True, answer_within_ms=6_000
    )
    tracker = TurnTracker(watched, VadOptions())
    assert run(tracker, SPEECH) == [] and not tracker.speaking  # the provider reports both ends: no local VAD
    assert tracker.provider(SpeechStopped(1)) == CallerStopped("provider")


def test_ro5_with_turn_detection_off_the_local_detector_owns_both_ends() -> None:
    tracker = TurnTracker(REALTIME, VadOptions(), client_turns=True)
    assert run(tracker, SPEECH) == [CallerStarted("local_vad", None, barge=True), CallerStopped("local_vad")]
    assert tracker.provider(SpeechStarted(1)) is None  # (a stray provider start is not a second source)
