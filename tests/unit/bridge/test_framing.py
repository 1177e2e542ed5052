"""Received audio becomes exact 20 ms carrier frames, tagged with item and offset."""

import pytest

from bridge.engine.framing import CarrierConverter, ItemFramer
from rtp.audio import PCM16_8K, PCMA_8K, PCMU_8K, AudioFormat, Encoding
from rtp.g711 import alaw_decode, ulaw_decode


def test_g711_converts_with_the_standard_tables() -> None:
    audio = bytes(range(256))
    assert CarrierConverter(PCMU_8K).convert(audio) == ulaw_decode(audio)
    assert CarrierConverter(PCMA_8K).convert(audio) == alaw_decode(audio)
    assert CarrierConverter(PCM16_8K).convert(b"\x01\x02") == b"\x01\x02"
    assert CarrierConverter(PCMU_8K).frame_bytes == 160
    assert CarrierConverter(PCM16_8K).frame_bytes == 320


def test_unknown_formats_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="no conversion"):
        CarrierConverter(AudioFormat(Encoding.PCMU, 16000))


def test_item_framer_cuts_exact_frames_and_numbers_them_within_the_item() -> None:
    framer = ItemFramer()
    framer.start("item_a", epoch=3)
    frames = framer.add(bytes(500)) + framer.add(bytes(500))  # 1000 bytes: 3 frames + 40 bytes
    assert [(f.item_id, f.epoch, f.offset_ms) for f in frames] == [
        ("item_a", 3, 0),
        ("item_a", 3, 20),
        ("item_a", 3, 40),
    ]
    assert framer.pending_bytes == 40
    [tail] = framer.finish()
    assert tail.offset_ms == 60 and tail.pcm == bytes(320)  # padded with silence
    assert framer.item_id is None


def test_discard_forgets_the_partial_frame() -> None:
    framer = ItemFramer()
    framer.start("x", 0)
    framer.add(bytes(100))
    framer.discard()
    assert framer.pending_bytes == 0 and framer.item_id is None
