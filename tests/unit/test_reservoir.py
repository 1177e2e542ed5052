"""SE2, SE3 and DESIGN §5 on the output path itself: item boundaries, one quiet rule, the drain, the final
message and the clear."""

from __future__ import annotations

from test_session_engine import MS, pcmu_tone

from bridge.reservoir import TICK_NS, OutputPath
from providers.limits import AudioLimits
from rtp.audio import PCMU_8K
from rtp.playout import Playout


def path() -> tuple[OutputPath, Playout]:
    playout = Playout()
    return OutputPath(AudioLimits(16_000, 3_000), PCMU_8K, playout, lead_frames=2, item_quiet_ms=300), playout


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
