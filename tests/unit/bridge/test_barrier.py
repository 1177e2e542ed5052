"""SE4, SE5 (output side) and HR4 on the barge-in part: what was transmitted is out of the clear's scope and
is what the provider is told the caller heard."""

from __future__ import annotations

from bridge.engine.barrier import BargeIn
from bridge.engine.commands import Truncate, TurnEnded
from bridge.engine.reservoir import TICK_NS, OutputPath
from providers.limits import AudioLimits
from rtp.audio import PCMU_8K
from rtp.playout import Playout
from sip.leg import PlayoutLeg
from tests.support.session_engine import pcmu_tone


def test_hr4_barge_in_truncates_to_the_ledger_and_suppresses_until_the_turn_ends() -> None:
    playout = Playout()
    out = OutputPath(
        AudioLimits(16_000, 3_000), PCMU_8K, PlayoutLeg(playout), lead_frames=2, item_quiet_ms=300
    )
    barge = BargeIn(out, truncate=True)
    out.push(pcmu_tone(1_000), "item_a", 0)
    for i in range(1, 6):  # five frames leave
        playout.pull(i * TICK_NS)
        out.tick(i * TICK_NS)
    notice, truncates = barge.interrupt(5 * TICK_NS, 100, "provider")
    assert truncates == [Truncate("item_a", 100)] and notice.heard == (("item_a", 100),)
    assert notice.cleared_ms == 900 and out.barrier.settled and barge.suppressed
    assert barge.drop(b"x" * 160) and barge.suppressed_bytes == 160
    assert barge.turn_over(200) == TurnEnded(200) and barge.turn_over(300) is None
    assert not barge.drop(b"x") and barge.status()["barge_ins"] == 1
    quiet = BargeIn(out, truncate=False)
    assert quiet.interrupt(6 * TICK_NS, 120, "local_vad")[1] == []  # a provider that cannot take a truncate
