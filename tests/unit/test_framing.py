"""Provider audio of any chunk size becomes exact 20 ms frames, tagged with item and offset."""

from bridge.framing import OutputFramer
from rtp.audio import PCM16_24K, PCMA_8K, PCMU_8K
from rtp.g711 import alaw_decode, ulaw_decode

import pytest

MS = 1_000_000


def test_pcmu_chunks_of_any_size_are_cut_into_exact_frames_and_decoded_bit_exactly() -> None:
    framer = OutputFramer(PCMU_8K)
    audio = bytes(range(256)) * 5  # 1280 bytes = 160 ms
    out = []
    for start in range(0, len(audio), 100):  # 12.5 ms chunks
        out += framer.push(audio[start : start + 100], now_ns=start * MS // 8, epoch=0)
    assert len(out) == 8
    assert b"".join(f.pcm for f in out) == ulaw_decode(audio)
    assert [f.offset_ms for f in out] == [0, 20, 40, 60, 80, 100, 120, 140]
    assert {f.item_id for f in out} == {"out-1"}


def test_a_pause_ends_the_item_and_pads_its_remainder_with_silence() -> None:
    framer = OutputFramer(PCMU_8K, quiet_ms=300)
    assert framer.push(b"\x00" * 200, now_ns=0, epoch=0) != []  # 1 frame + 40 bytes left
    assert framer.next_deadline() == 300 * MS
    assert framer.handle_timer(299 * MS) == []
    tail = framer.handle_timer(300 * MS)
    assert len(tail) == 1 and tail[0].offset_ms == 20
    assert tail[0].pcm == ulaw_decode(b"\x00" * 40 + b"\xff" * 120)
    assert framer.item_id is None and framer.next_deadline() is None
    nxt = framer.push(b"\x00" * 160, now_ns=400 * MS, epoch=0)
    assert nxt[0].item_id == "out-2" and nxt[0].offset_ms == 0


def test_provider_item_ids_and_epochs_start_new_items() -> None:
    framer = OutputFramer(PCMA_8K)
    a = framer.push(b"\xd5" * 160, 0, 0, item_id="item_a")
    b = framer.push(b"\xd5" * 160, 1, 0, item_id="item_b")
    c = framer.push(b"\xd5" * 160, 2, 1, item_id="item_b")
    assert [(f.item_id, f.epoch, f.offset_ms) for f in a + b + c] == [("item_a", 0, 0), ("item_b", 0, 0), ("item_b", 1, 0)]
    assert a[0].pcm == alaw_decode(b"\xd5" * 160)


def test_discard_forgets_the_remainder() -> None:
    framer = OutputFramer(PCMU_8K)
    framer.push(b"\x00" * 170, 0, 0)
    assert framer.discard() == 10
    assert framer.handle_timer(10**12) == []


def test_formats_without_a_conversion_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="no framing"):
        OutputFramer(PCM16_24K)
