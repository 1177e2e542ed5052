"""Self-check of the harness's analysis helpers (pure numpy, no peers, fast)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

try:  # tests/integration as a package
    from . import peers
except ImportError:  # rootdir-relative import (no __init__.py)
    import peers

RNG_SEED = 1234


def _noise(n: int, seed: int = RNG_SEED) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n)


def test_xcorr_finds_known_positive_lag_in_longer_signal() -> None:
    ref = _noise(2000)
    sig = np.zeros(10_000)
    sig[3217 : 3217 + ref.size] = 0.3 * ref
    sig += 0.01 * _noise(sig.size, seed=7)
    peak, lag = peers.normalized_xcorr(ref, sig)
    assert lag == 3217
    assert 0.99 <= peak <= 1.0


def test_xcorr_negative_lag_when_signal_starts_inside_reference() -> None:
    ref = _noise(4000)
    peak, lag = peers.normalized_xcorr(ref, ref[500:])
    assert lag == -500
    # Normalised by the whole reference: a partial overlap scores ~sqrt(3500/4000).
    assert peak == pytest.approx(np.sqrt(3500 / 4000), abs=0.01)


def test_xcorr_keeps_sign_and_accepts_int16() -> None:
    ref = (8000 * _noise(1500)).clip(-32768, 32767).astype(np.int16)
    sig = np.concatenate([np.zeros(321, np.int16), -ref, np.zeros(100, np.int16)])
    peak, lag = peers.normalized_xcorr(ref, sig)
    assert lag == 321
    assert peak == pytest.approx(-1.0, abs=1e-3)


def test_xcorr_is_bounded_and_low_for_unrelated_signals() -> None:
    peak, _ = peers.normalized_xcorr(_noise(2000, 1), _noise(8000, 2))
    assert -1.0 <= peak <= 1.0
    assert abs(peak) < 0.2


def test_xcorr_lag_window_restricts_search() -> None:
    ref = _noise(800)
    sig = np.zeros(6000)
    sig[1000:1800] = ref
    sig[4000:4800] = 0.5 * ref
    assert peers.normalized_xcorr(ref, sig)[1] in (1000, 4000)  # both exact copies
    peak, lag = peers.normalized_xcorr(ref, sig, min_lag=2000)
    assert lag == 4000 and peak == pytest.approx(1.0, abs=1e-6)
    assert peers.normalized_xcorr(ref, sig, max_lag=2000)[1] == 1000


def test_xcorr_ignores_silent_windows() -> None:
    ref = _noise(400)
    sig = np.zeros(5000)
    sig[2500:2900] = ref
    peak, lag = peers.normalized_xcorr(ref, sig)
    assert (lag, round(peak, 6)) == (2500, 1.0)


def test_first_onset_of_tone_after_silence() -> None:
    n0, window = 1234, 160
    t = np.arange(4000)
    tone = 0.1 * np.sin(2 * np.pi * 440 * t / 8000)  # about -23 dBFS RMS
    x = np.concatenate([np.zeros(n0), tone])
    onset = peers.first_onset(x, threshold_dbfs=-40.0, window=window)
    assert onset is not None and n0 - window < onset <= n0
    assert peers.first_onset(x, threshold_dbfs=-10.0) is None
    assert peers.first_onset(np.zeros(5000, np.int16)) is None
    assert peers.first_onset(np.zeros(10)) is None  # shorter than one window


def test_first_onset_scales_int16_to_dbfs() -> None:
    x = np.zeros(3000, np.int16)
    x[2000:] = 330  # ~ -40 dBFS DC
    assert peers.first_onset(x, threshold_dbfs=-45.0) is not None
    assert peers.first_onset(x, threshold_dbfs=-35.0) is None


def test_rms_dbfs() -> None:
    t = np.arange(8000)
    assert peers.rms_dbfs(np.sin(2 * np.pi * 1000 * t / 8000 + 0.1)) == pytest.approx(-3.01, abs=0.01)
    assert peers.rms_dbfs(np.zeros(10)) == float("-inf")


def test_wav_roundtrip_and_unfinalised_header(tmp_path) -> None:
    a = (1000 * _noise(999)).astype(np.int16)
    p = peers.write_wav(tmp_path / "a.wav", a)
    rate, b = peers.read_wav(p)
    assert rate == 8000 and b.dtype == np.int16 and np.array_equal(a, b)

    raw = bytearray(p.read_bytes())
    data_at = raw.index(b"data")
    raw[data_at + 4 : data_at + 8] = struct.pack("<I", 0)  # writer killed before finalising
    (tmp_path / "b.wav").write_bytes(bytes(raw))
    assert np.array_equal(peers.read_wav(tmp_path / "b.wav")[1], a)


def test_read_wav_extensible_format(tmp_path) -> None:
    a = np.arange(-50, 50, dtype=np.int16)
    fmt = struct.pack(
        "<HHIIHHHHIH14s",
        0xFFFE,
        1,
        8000,
        16000,
        2,
        16,
        22,
        16,
        4,
        1,
        b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71",
    )
    data = a.astype("<i2").tobytes()
    body = (
        b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    )
    (tmp_path / "x.wav").write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    rate, b = peers.read_wav(tmp_path / "x.wav")
    assert rate == 8000 and np.array_equal(a, b)


def test_rtp_continuity_reads_sequence_timestamps_and_sources() -> None:
    """A clean stream, one that skipped two slots after a stall, one with a lost packet and one restarted."""
    clean = [((65534 + i) % 65536, (2**32 - 320 + 160 * i) % 2**32, 7) for i in range(6)]  # both wrap
    assert peers.rtp_continuity(clean) == peers.RtpContinuity(6, 1, 0, 0, 0)
    skipped = [(i, 160 * i + (320 if i >= 3 else 0), 7) for i in range(6)]
    assert peers.rtp_continuity(skipped) == peers.RtpContinuity(6, 1, 0, 0, 2)
    lost = [(i, 160 * i, 7) for i in (0, 1, 3, 4)]
    assert peers.rtp_continuity(lost) == peers.RtpContinuity(4, 1, 1, 0, 1)
    restarted = [(i, 160 * i, 7) for i in range(3)] + [(900, 55, 8), (901, 215, 8)]
    result = peers.rtp_continuity(restarted)
    assert (result.ssrcs, result.seq_breaks, result.odd_steps) == (2, 1, 1)
