"""Harness moved unchanged from tests/unit/bridge/test_amd.py: FRAME, RATE, _amp, _pcm, noise, quiet, speech, tone."""

from __future__ import annotations

import math

import numpy as np

RATE = 8000


FRAME = 160


def _pcm(x: np.ndarray) -> list[bytes]:
    pcm = np.clip(np.round(x), -32768, 32767).astype("<i2").tobytes()
    return [pcm[i : i + 2 * FRAME] for i in range(0, len(pcm), 2 * FRAME)]


def _amp(dbfs: float) -> float:
    return 32768 * 10 ** (dbfs / 20)


def tone(ms: int, hz: float, dbfs: float = -15.0) -> list[bytes]:
    n = np.arange(ms * RATE // 1000)
    return _pcm(_amp(dbfs) * math.sqrt(2) * np.sin(2 * np.pi * hz * n / RATE))


def speech(ms: int, dbfs: float = -20.0, seed: int = 1) -> list[bytes]:
    """Noise with a 4 Hz syllable envelope: its level rises and falls by 20 dB four times a second."""
    rng = np.random.default_rng(seed)
    n = np.arange(ms * RATE // 1000)
    envelope = 0.1 + 0.9 * np.sin(np.pi * 4 * n / RATE) ** 2
    return _pcm(_amp(dbfs) * 1.4 * envelope * rng.standard_normal(len(n)))


def noise(ms: int, dbfs: float, seed: int = 2) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return _pcm(_amp(dbfs) * rng.standard_normal(ms * RATE // 1000))


def quiet(ms: int) -> list[bytes]:
    return noise(ms, -66.0, seed=3)
