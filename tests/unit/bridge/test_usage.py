"""HR12: observed usage adds up every transport, interrupted ones too; `complete` stays false once any
transport ended without finalising."""

from __future__ import annotations

from bridge.engine.usage import UsageMeter
from providers.events import SessionClosed, UsageUpdated


def test_hr12_each_transport_s_latest_audio_counts_and_increments_add_up() -> None:
    meter = UsageMeter()
    meter.observe(UsageUpdated(1, audio_seconds=10.0))
    meter.observe(UsageUpdated(1, audio_seconds=12.0))  # cumulative: the latest, not the sum
    meter.observe(UsageUpdated(2, audio_seconds=1.0, input_tokens=5, cumulative=False))
    meter.observe(UsageUpdated(2, audio_seconds=2.0, input_tokens=7, cumulative=False))
    assert meter.status() == {
        "audio_seconds": 15.0,
        "input_tokens": 12,
        "output_tokens": 0,
        "complete": False,
    }


def test_hr12_complete_stays_false_once_a_transport_ended_unfinalised() -> None:
    meter = UsageMeter()
    meter.observe(SessionClosed(1, "lost", False, 4.0))
    meter.observe(SessionClosed(2, "close_requested", True, 6.0))
    assert meter.totals.audio_seconds == 10.0 and meter.totals.complete is False
    clean = UsageMeter()
    clean.observe(SessionClosed(1, "close_requested", True, 3.0))
    assert clean.totals.complete is True
