"""What a caller hears before the answer (sip/native/early.py, rtp/tones.py): the ringback tones' frequency
and cadence, repeated; an announcement played once; neither ever in a carrier ledger."""

from __future__ import annotations

import numpy as np
import pytest

from rtp.tones import RINGBACK_TONES, ringback_frames
from sip.native.early import EARLY_ITEM, early_playout


def peak_hz(frames: list[bytes]) -> float:
    samples = np.frombuffer(b"".join(frames), dtype="<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.argmax(spectrum) * 8000 / len(samples))


def test_ringback_is_425_hz_one_second_on_four_off_and_repeats_from_its_start() -> None:
    cycle = ringback_frames("ringback")
    assert len(cycle) == 250  # 5 s of 20 ms frames
    on = [f for f in cycle[:50] if f is not None]
    assert len(on) == 50 and all(len(f) == 320 for f in on) and all(f is None for f in cycle[50:])
    assert abs(peak_hz(on) - 425) < 10
    level = np.sqrt(np.mean(np.frombuffer(b"".join(on), dtype="<i2").astype(np.float64) ** 2))
    assert -21 < 20 * np.log10(level / 32768) < -17  # a call-progress tone's level, about -19 dBFS RMS
    playout = early_playout("ringback")
    taken = [playout.take() for _ in range(260)]
    first = taken[0]
    assert first is not None and first.item_id == EARLY_ITEM and first.pcm == cycle[0]
    assert taken[60] is None and taken[250] is first  # the off part, then the cycle again


def test_ringback_us_is_two_tones_two_seconds_on_four_off() -> None:
    cycle = ringback_frames("ringback-us")
    assert len(cycle) == 300 and sum(f is not None for f in cycle) == 100
    samples = np.frombuffer(b"".join(f for f in cycle if f is not None), dtype="<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples))
    top = sorted(np.argsort(spectrum)[-2:] * 8000 / len(samples))
    assert abs(top[0] - 440) < 5 and abs(top[1] - 480) < 5
    with pytest.raises(KeyError):
        ringback_frames("ringback-mars")
    assert set(RINGBACK_TONES) == {"ringback", "ringback-us"}


def test_an_announcement_plays_once_padded_and_nothing_enters_a_ledger() -> None:
    playout = early_playout(b"\x01\x00" * 500)  # 62.5 ms: three whole frames and a part
    taken = [playout.take() for _ in range(6)]
    frames = [f for f in taken if f is not None]
    assert len(frames) == 4 and taken[4:] == [None, None]
    assert frames[-1].pcm == b"\x01\x00" * 20 + bytes(280)  # the last one padded with silence
    assert [f.offset_ms for f in frames] == [0, 20, 40, 60]
    for frame in frames:
        playout.transmitted(frame, 0)
    assert playout.ledger.frames_transmitted == 0
