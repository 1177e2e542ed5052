"""The carrier ledger records exactly what the media clock took; the barrier keeps cleared frames out."""

from rtp.ledger import CarrierLedger
from rtp.playout import OutboundFrame, Playout
from rtp.units import NS_PER_MS as MS


def frames(item: str, count: int, epoch: int = 0, first_offset: int = 0) -> list[OutboundFrame]:
    return [OutboundFrame(bytes([i]) * 320, epoch, item, first_offset + 20 * i) for i in range(count)]


def test_ledger_records_each_pulled_frame_with_item_offset_epoch_and_time() -> None:
    playout = Playout()
    playout.enqueue(frames("a", 3, epoch=2))
    pulled = [playout.pull(now_ns=t * 20 * MS) for t in range(4)]
    assert [f.offset_ms for f in pulled[:3] if f] == [0, 20, 40]
    assert pulled[3] is None  # nothing queued: the tick is silence, and silence is not in the ledger
    entries = playout.ledger.entries("a")
    assert [(e.offset_ms, e.epoch, e.transmitted_ns) for e in entries] == [
        (0, 2, 0),
        (20, 2, 20 * MS),
        (40, 2, 40 * MS),
    ]
    progress = playout.ledger.progress("a")
    assert progress is not None and progress.frames == 3 and progress.transmitted_ms == 60
    assert playout.ledger.frames_transmitted == 3


def test_transmitted_ms_is_what_left_not_what_was_queued() -> None:
    playout = Playout()
    playout.enqueue(frames("a", 10))
    for t in range(4):
        playout.pull(t)
    assert playout.ledger.transmitted_ms("a") == 80
    assert playout.ledger.transmitted_ms("never") == 0
    assert playout.depth == 6


def test_clear_drops_older_epochs_and_reports_transmitted_position() -> None:
    playout = Playout()
    playout.enqueue(frames("a", 10, epoch=0))
    for t in range(3):
        playout.pull(t)
    result = playout.clear(1)
    assert result.dropped_frames == 7 and result.dropped_ms == 140
    assert result.transmitted_ms == {"a": 60}
    assert playout.pull(10) is None


def test_frames_below_the_barrier_are_never_transmitted_even_if_enqueued_late() -> None:
    playout = Playout()
    playout.clear(3)
    playout.enqueue(frames("old", 2, epoch=2) + frames("new", 1, epoch=3))
    first = playout.pull(0)
    assert first is not None and first.item_id == "new"
    assert playout.pull(1) is None
    assert playout.frames_dropped == 2
    assert [e.item_id for e in playout.ledger.entries()] == ["new"]


def test_clear_keeps_frames_of_the_current_epoch() -> None:
    playout = Playout()
    playout.enqueue(frames("a", 2, epoch=0) + frames("b", 2, epoch=1))
    result = playout.clear(1)
    assert result.dropped_frames == 2
    assert [playout.pull(t).item_id for t in range(2)] == ["b", "b"]  # type: ignore[union-attr]


def test_ledger_is_bounded_but_item_progress_survives() -> None:
    ledger = CarrierLedger(max_entries=5, max_items=2)
    for i in range(8):
        ledger.record("a", 20 * i, 0, i)
    assert len(ledger.entries()) == 5
    assert ledger.transmitted_ms("a") == 160
    ledger.record("b", 0, 0, 9)
    ledger.record("c", 0, 0, 10)  # the oldest item summary goes when there are too many
    assert ledger.progress("a") is None and ledger.transmitted_ms("c") == 20
    last = ledger.last()
    assert last is not None and last.item_id == "c"


def test_take_leaves_the_ledger_alone_until_the_frame_is_reported_transmitted() -> None:
    # The native engine: take the frame, send it, record it at the time sendto returned (or never, if it failed).
    playout = Playout()
    playout.enqueue(frames("a", 3, epoch=1))
    first = playout.take()
    assert first is not None and first.offset_ms == 0 and playout.depth == 2
    assert (
        playout.ledger.frames_transmitted == 0 and playout.ledger.transmitted_ms("a") == 0
    )  # taken, not sent
    playout.transmitted(first, 5 * MS)
    assert [(e.offset_ms, e.epoch, e.transmitted_ns) for e in playout.ledger.entries("a")] == [(0, 1, 5 * MS)]
    lost = playout.take()  # its send failed: never reported
    assert lost is not None and playout.ledger.transmitted_ms("a") == 20
    result = playout.clear(2)
    assert (result.dropped_frames, result.transmitted_ms) == (1, {"a": 20})  # what left, not what was taken
    assert playout.take() is None


def test_pull_still_records_at_the_request_as_pjsua2_needs() -> None:
    playout = Playout()
    playout.enqueue(frames("a", 1))
    frame = playout.pull(7 * MS)
    assert frame is not None and playout.ledger.entries("a")[0].transmitted_ns == 7 * MS


def test_a_full_collection_does_not_walk_the_ledgers_entries() -> None:
    """Measured: 100 calls kept 50,000 entries; as objects the collector tracks, every full collection walked
    them while the media clock waited. Plain tuples of atoms are untracked after their first collection."""
    import gc

    from rtp.ledger import LedgerEntry

    ledger = CarrierLedger()
    for n in range(600):
        ledger.record(f"item-{n // 100}", (n % 100) * 20, 1, n)
    gc.collect()
    assert len(ledger._entries) == 500 and not any(gc.is_tracked(e) for e in ledger._entries)
    assert ledger.last() == LedgerEntry("item-5", 1980, 1, 599)
    assert ledger.entries("item-1") == [LedgerEntry("item-1", k * 20, 1, 100 + k) for k in range(100)]
    assert ledger.entries_after(596) == [LedgerEntry("item-5", 1940 + k * 20, 1, 597 + k) for k in range(3)]
    assert ledger.entries_after(599) == [] and len(ledger.entries_after(0)) == 500
