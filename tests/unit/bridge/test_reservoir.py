"""SE2, SE3 and DESIGN §5 on the output path itself: item boundaries, one quiet rule, the drain, the final
message and the clear."""

from __future__ import annotations

from bridge.engine.reservoir import FRAME_LATE_NS, TICK_NS, OutputPath
from providers.limits import AudioLimits
from rtp.audio import PCMU_8K
from rtp.playout import Playout
from sip.leg import PlayoutLeg
from tests.support.session_engine import MS, pcmu_tone


def path() -> tuple[OutputPath, Playout]:
    playout = Playout()
    return OutputPath(
        AudioLimits(16_000, 3_000), PCMU_8K, PlayoutLeg(playout), lead_frames=2, item_quiet_ms=300
    ), playout


def test_se3_unnamed_output_items_end_after_a_quiet_pause() -> None:
    out, _ = path()
    assert out.push(pcmu_tone(100), None, 0) == (True, None)  # the first audio begins item out-1
    assert out.push(pcmu_tone(100), None, 299 * MS) == (False, None)  # a short pause: the same item
    assert out.push(pcmu_tone(100), None, 600 * MS) == (True, None)  # 300 ms quiet: a new one
    assert out.reservoir.item_ids()[-1] == "out-2"


def test_se3_drained_means_played_and_quiet_and_the_timer_runs_only_while_busy() -> None:
    out, playout = path()
    out.push(pcmu_tone(60), "item_a", 0)
    assert out.busy and out.next_deadline() == TICK_NS
    now = 0
    while playout.depth or out.busy:
        now += TICK_NS
        playout.pull(now)
        out.tick(now)
    assert not out.drained(now)  # played, but the item is not over yet
    assert out.drained(now + 300 * MS) and out.next_deadline() is None


def test_se4_the_final_message_replaces_all_output_through_the_barrier() -> None:
    out, playout = path()
    out.push(pcmu_tone(1_000), "item_a", 0)
    ms = out.play_final_message(bytes(320) * 10)
    assert ms == 200 and out.reservoir.depth_bytes == 0 and out.barrier.epoch == 1
    frames = [playout.pull(i * TICK_NS) for i in range(12)]
    assert [f.item_id for f in frames if f] == ["final-message"] * 10


def test_se2_a_clear_reports_every_interrupted_item() -> None:
    out, _ = path()
    out.push(pcmu_tone(200), "item_a", 0)
    out.push(pcmu_tone(200), "item_b", 0)
    cleared_ms, items = out.clear()
    assert items == ["item_a", "item_b"] and cleared_ms == 400


def test_se3_the_cushion_timer_waits_for_a_late_caller_frame_and_keeps_a_hold_fed() -> None:
    """While caller frames come every 20 ms they top the cushion up, so the timer is due only once the
    next one is `FRAME_LATE_NS` late (it raced the frame and woke the session's loop for every frame when it was
    due a tick after the last one); when frames stop (a hold), it tops up every 20 ms and nothing underruns."""
    out, playout = path()
    out.push(pcmu_tone(2_000), "item_a", 0)
    now = 0
    for _ in range(10):  # caller frames drive the cushion: the timer never falls due between two of them
        now += TICK_NS
        playout.pull(now)
        out.tick(now)
        assert out.next_deadline() == now + TICK_NS + FRAME_LATE_NS
    deadline, fed_at, pulled, last = out.next_deadline(), [], 0, now
    for step in range(1, 41):  # the frames stop: 40 media ticks, each 1 ms after its grid point (the slack)
        t = last + step * TICK_NS + MS
        while deadline is not None and deadline <= t:  # only the timer tops the cushion up now
            out.feed(deadline)
            fed_at.append(deadline)
            deadline = out.next_deadline()
        pulled += playout.pull(t) is not None
    assert fed_at[0] == last + TICK_NS + FRAME_LATE_NS
    assert {b - a for a, b in zip(fed_at, fed_at[1:], strict=False)} == {TICK_NS}  # then every 20 ms
    assert pulled == 40  # no underrun: each media tick found a frame
