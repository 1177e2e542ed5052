"""SE6 and HR11 on the captions: one emission per transcript, a fresh grouping epoch after a repair, and
GPT-Live's fragments grouped into one utterance per connection."""

from __future__ import annotations

from bridge.commands import Outbox, Transcript
from bridge.timeline import Captions, Timeline
from providers.events import InputTranscript

MS = 1_000_000


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
