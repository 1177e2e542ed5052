"""SE6 and HR11 on the captions: one emission per transcript, a fresh grouping epoch after a repair, and
GPT-Live's fragments grouped into one utterance per connection."""

from __future__ import annotations

from bridge.engine.commands import Outbox, Transcript
from bridge.engine.timeline import Captions, Timeline
from providers.events import InputTranscript
from rtp.units import NS_PER_MS as MS


def test_hr11_fragments_group_per_connection_and_a_new_epoch_never_merges_old_ones() -> None:
    out, timeline = Outbox(), Timeline(0)
    timeline.connection_started(1, 0)
    captions = Captions(out, close_ms=1_000, fragments=True)
    assert captions.fragment(InputTranscript(1, "two ", start_ms=100, end_ms=300), timeline, 0, speaking=True)
    assert captions.fragment(
        InputTranscript(1, "nights", start_ms=300, end_ms=700), timeline, 0, speaking=True
    )
    assert not captions.fragment(InputTranscript(1, "final", final=True), timeline, 0, speaking=True)
    captions.turn_over(800 * MS)
    assert not captions.due(1_799 * MS) and captions.due(1_800 * MS)
    assert captions.close() == [(1, "two nights", 100, 700)]
    captions.caller("two nights", 100, True)
    captions.new_epoch()
    captions.assistant("Sure.", 900, True)
    assert out.notices == [
        Transcript("caller", "two nights", 100, True, 0),
        Transcript("assistant", "Sure.", 900, True, 1),
    ]
    assert captions.recent_caller_text() == ("two nights",)


def feed(timeline: Timeline, start_ms: int, frames: int, *, every_ms: int = 20) -> int:
    """`frames` caller frames forwarded from session time `start_ms`, one each `every_ms`; returns the end."""
    for n in range(frames):
        timeline.fed((start_ms + n * every_ms) * MS)
    return start_ms + frames * every_ms


def test_hr11_after_a_hold_provider_times_map_through_the_audio_the_connection_heard() -> None:
    """A provider counts the caller audio it was sent. 5 s of audio, a 10 s hold (no frames), 5 s
    more: its 7,000 ms is 2 s after the resume, at 17,000 ms of the session (it was stamped 7,000 before)."""
    timeline = Timeline(0)
    timeline.connection_started(1, 0)
    feed(timeline, 20, 250)  # frames at 20 .. 5,000 ms
    feed(timeline, 15_020, 250)  # the hold ends at 15 s
    assert timeline.rebase(1, 3_000, 0) == 3_020
    assert timeline.rebase(1, 7_000, 0) == 17_020
    assert timeline.span(1, 4_900, 5_100, 0) == (4_920, 15_120)  # a span across the hold


def test_hr11_frames_handled_late_then_in_a_burst_move_nothing() -> None:
    """A stall of the session's loop (300 ms) and the burst that follows it lose no audio: the times map as if
    the frames had come on time, and no stretch is left behind."""
    timeline = Timeline(0)
    timeline.connection_started(1, 0)
    end = feed(timeline, 20, 100)  # to 2,000 ms
    for _ in range(16):  # the frames of 2,020 .. 2,320 ms all handled at 2,320 ms
        timeline.fed(2_320 * MS)
    feed(timeline, end + 320, 100)
    assert timeline.rebase(1, 4_000, 0) == 4_020
    assert len(timeline._marks) == 1


def test_hr11_frames_never_forwarded_shift_the_later_times_by_what_is_missing() -> None:
    """400 ms of frames shed (or discarded by HR8) leave a stretch: later times are 400 ms later than the audio
    position says, earlier ones are unchanged."""
    timeline = Timeline(0)
    timeline.connection_started(1, 0)
    end = feed(timeline, 20, 100)
    feed(timeline, end + 400, 100)
    assert timeline.rebase(1, 1_000, 0) == 1_020
    assert timeline.rebase(1, 3_000, 0) == 3_420


def test_hr11_a_connection_started_mid_call_counts_from_its_own_first_audio() -> None:
    """A rollover's connection confirmed at 10,020 ms, after a 1 s gap earlier in the call: its 0 is then; the
    gap before it does not move it, a gap after it moves both connections alike."""
    timeline = Timeline(0)
    timeline.connection_started(1, 0)
    feed(timeline, 20, 200)  # 20 .. 4,000 ms: audio 0 .. 4,000
    feed(timeline, 5_020, 250)  # 5,020 .. 10,000 ms after a 1 s gap: audio 4,000 .. 9,000
    timeline.connection_started(2, 10_020 * MS)
    assert timeline.rebase(2, 0, 10_020 * MS) == 10_020  # no audio on to it yet: the instant it started
    feed(timeline, 10_020, 100)  # 10,020 .. 12,000 ms: its audio 0 .. 2,000
    assert timeline.rebase(2, 1_000, 0) == 11_020
    assert timeline.rebase(1, 9_500, 0) == 10_520  # the first connection's audio 9,500 is the same instant
    feed(timeline, 14_020, 100)  # 2 s missing: 14,020 .. 16,000 ms
    assert timeline.rebase(2, 3_000, 0) == 15_020
    assert timeline.rebase(1, 12_000, 0) == 15_020
    assert timeline.rebase(1, 3_000, 0) == 3_020  # before the first gap: unchanged


def test_the_audio_map_stays_bounded() -> None:
    """A call with a gap every second keeps only the newest `MARKS_KEPT` stretches."""
    from bridge.engine.timeline import MARKS_KEPT

    timeline = Timeline(0)
    timeline.connection_started(1, 0)
    end = 0
    for _ in range(1_000):
        end = feed(timeline, end + 500, 25)
    assert len(timeline._marks) == MARKS_KEPT
    assert timeline.rebase(1, timeline.fed_ms - 20, 0) == end - 20


def test_hr11_a_long_utterance_after_caller_audio_came_short_keeps_its_start() -> None:
    """Found by the fault campaign (seed 756114676, call-42): the caller's audio reached the connection at half
    rate for half a minute, so a new stretch began every ~100 ms of lag, and a long utterance's start was older
    than the newest `MARKS_KEPT` of them. It was rebased through the connection's start, 6 s early, and logged
    before the utterance logged before it. Its start stays within a stretch's step of the truth, and later audio
    never maps earlier than earlier audio."""
    from bridge.engine.timeline import GAP_MS, MARKS_KEPT

    timeline = Timeline(0)
    timeline.connection_started(1, 0)
    heard_at: dict[int, int] = {}  # audio position -> session ms of its frame
    for n in range(750):  # a frame every 40 ms for 30 s: half the caller's audio never came
        heard_at[timeline.fed_ms] = 20 + n * 40
        timeline.fed((20 + n * 40) * MS)
    assert len(timeline._marks) <= MARKS_KEPT
    for position in (0, 2_000, 5_000, 9_000, 14_000):
        assert abs(timeline.rebase(1, position, 0) - heard_at[position]) <= 500, position
    times = [timeline.rebase(1, p, 0) for p in range(0, timeline.fed_ms, 20)]
    assert times == sorted(times)
    last = timeline.fed_ms - 20  # within its stretch, as ever: the stretch's lowest offset, GAP_MS at most
    assert 0 <= heard_at[last] - timeline.rebase(1, last, 0) <= GAP_MS


def test_hr11_a_hold_stays_exact_when_the_audio_map_is_thinned() -> None:
    """The stretches merged to stay within `MARKS_KEPT` are the cheap ones (small steps, old): a 10 s hold
    early in the call is still mapped exactly after 200 small gaps."""
    timeline = Timeline(0)
    timeline.connection_started(1, 0)
    end = feed(timeline, 20, 250)  # 5 s of audio
    end = feed(timeline, end + 10_000, 250)  # a 10 s hold, then 5 s more
    for _ in range(200):  # then 200 gaps of 200 ms
        end = feed(timeline, end + 200, 25)
    assert timeline.rebase(1, 3_000, 0) == 3_020
    assert timeline.rebase(1, 7_000, 0) == 17_020


def test_s1_a_late_fragment_of_one_turn_is_not_grouped_with_the_next_turn() -> None:
    """A provider's caption of a turn's last words can arrive after the next turn began; the groups close
    together, one per turn (each fragment belongs to the turn whose end comes after its start)."""
    out, timeline = Outbox(), Timeline(0)
    timeline.connection_started(1, 0)
    captions = Captions(out, close_ms=1_000, fragments=True)
    captions.fragment(InputTranscript(1, "two ", start_ms=100, end_ms=300), timeline, 0, speaking=True)
    captions.turn_over(800 * MS, 800)
    captions.fragment(InputTranscript(1, "nights", start_ms=300, end_ms=500), timeline, 0, speaking=False)
    captions.fragment(InputTranscript(1, "please", start_ms=900, end_ms=1_100), timeline, 0, speaking=True)
    captions.turn_over(1_300 * MS, 1_300)
    assert captions.close() == [(1, "two nights", 100, 500), (1, "please", 900, 1_100)]


def test_hr11_an_utterance_whose_end_nothing_reported_is_told_with_no_end_not_a_span_of_no_length() -> None:
    """Gemini's old connection's untimed text of a turn under way at a rollover's hard stop takes the turn's
    start as its end too (RO2 matching needs that): the application is told the end is not known. A campaign
    saw 46 such utterances stamped as ending where they began, 1.5 to 4.5 s before the caller stopped."""
    out = Outbox()
    captions = Captions(out, close_ms=1_000, fragments=False)
    captions.caller("the old connection's text of the long one", 2_605, True, 2_605)
    captions.caller("a timed one", 8_000, True, 9_500)
    assert out.notices == [
        Transcript("caller", "the old connection's text of the long one", 2_605, True, 0, None),
        Transcript("caller", "a timed one", 8_000, True, 0, 9_500),
    ]
    assert captions.told_to_ms == 9_500
