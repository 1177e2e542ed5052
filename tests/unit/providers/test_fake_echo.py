"""The echo model on virtual time: detection by energy with hangover, bit-exact utterance spans."""

from __future__ import annotations

import math

import numpy as np
import pytest

from providers.fakes.echo import (
    EchoEvent,
    EchoModel,
    EchoOptions,
    UtteranceDetected,
    UtteranceStarted,
)
from rtp.g711 import ulaw_decode, ulaw_encode
from rtp.units import NS_PER_MS as MS

RATE = 8000


def tone(ms: int, rate: int = RATE, freq: float = 1000.0, amp: float = 0.3) -> np.ndarray:
    t = np.arange(rate * ms // 1000) / rate
    return amp * np.sin(2 * np.pi * freq * t)


def quiet(ms: int, rate: int = RATE, seed: int = 0) -> np.ndarray:
    """Low noise (about -66 dBFS), well under the -40 dBFS threshold but not digital zero."""
    return np.random.default_rng(seed).normal(0.0, 0.0005, rate * ms // 1000)


def pcm16(signal: np.ndarray) -> bytes:
    return (np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes()


def ulaw(*parts: np.ndarray) -> bytes:
    return ulaw_encode(pcm16(np.concatenate(parts)))


class Driver:
    """Feeds 20 ms µ-law frames at real time on a virtual clock."""

    def __init__(self, model: EchoModel) -> None:
        self.model = model
        self.now = 0
        self.events: list[EchoEvent] = []

    def _drain(self) -> None:
        while (ev := self.model.next_event()) is not None:
            self.events.append(ev)

    def advance(self, until: int) -> None:
        self.now = max(self.now, until)

    def feed(self, audio: bytes, frame_bytes: int = 160, frame_ms: int = 20) -> None:
        for i in range(0, len(audio), frame_bytes):
            raw = audio[i : i + frame_bytes]
            self.model.receive_audio(raw, ulaw_decode(raw), self.now)
            self._drain()
            self.advance(self.now + frame_ms * MS)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


def test_one_tone_burst_is_detected_once_and_echoed_bit_exactly() -> None:
    audio = ulaw(quiet(500), tone(800), quiet(1200, seed=1))
    d = Driver(EchoModel(RATE, 1))
    d.feed(audio)
    d.advance(10_000 * MS)

    [det] = d.of(UtteranceDetected)
    u = det.utterance
    assert (u.voiced_start, u.voiced_end) == (500 * 8, 1300 * 8)
    assert (u.start_ms, u.end_ms) == (440, 1360)
    assert u.voiced_samples == 800 * 8
    assert u.audio == audio[440 * 8 : 1360 * 8]
    # Detected in the frame that completes 400 ms of hangover (1680..1700 ms), not earlier.
    assert det.at == 1680 * MS


@pytest.mark.parametrize(("blip_ms", "detected"), [(100, False), (120, True)])
def test_blips_shorter_than_min_utterance_are_ignored(blip_ms: int, detected: bool) -> None:
    d = Driver(EchoModel(RATE, 1))
    d.feed(ulaw(quiet(300), tone(blip_ms), quiet(1000, seed=3)))
    assert len(d.of(UtteranceDetected)) == int(detected)


def test_min_utterance_counts_voiced_audio_only() -> None:
    # Two 60 ms blips 200 ms apart merge into one utterance (gap < hangover) with 120 ms voiced.
    d = Driver(EchoModel(RATE, 1))
    d.feed(ulaw(quiet(300), tone(60), quiet(200, seed=4), tone(60), quiet(1000, seed=5)))
    [det] = d.of(UtteranceDetected)
    assert det.utterance.voiced_samples == 120 * 8
    assert (det.utterance.voiced_start, det.utterance.voiced_end) == (300 * 8, 620 * 8)


@pytest.mark.parametrize(("gap_ms", "count"), [(380, 1), (400, 2)])
def test_hangover_joins_short_gaps_and_splits_long_ones(gap_ms: int, count: int) -> None:
    d = Driver(EchoModel(RATE, 1))
    d.feed(ulaw(quiet(200), tone(300), quiet(gap_ms, seed=6), tone(300), quiet(1000, seed=7)))
    dets = d.of(UtteranceDetected)
    assert len(dets) == count
    if count == 2:
        assert dets[0].at == (500 + 400 - 20) * MS  # frame ending at last voiced end + hangover
        assert dets[1].utterance.voiced_start == (500 + gap_ms) * 8


def test_hangover_option_is_respected() -> None:
    d = Driver(EchoModel(RATE, 1, EchoOptions(hangover_ms=200)))
    d.feed(ulaw(quiet(200), tone(300), quiet(220, seed=8), tone(300), quiet(600, seed=9)))
    assert len(d.of(UtteranceDetected)) == 2


def test_pcm16_input_echoes_its_own_bytes() -> None:
    rate = 16000
    audio = pcm16(np.concatenate([quiet(300, rate), tone(500, rate), quiet(800, rate, seed=12)]))
    model = EchoModel(rate, 2)
    for i in range(0, len(audio), 640):
        model.receive_audio(audio[i : i + 640], audio[i : i + 640], i * MS // 32)
    events = []
    while (ev := model.next_event()) is not None:
        events.append(ev)
    [det] = [e for e in events if isinstance(e, UtteranceDetected)]
    assert (det.utterance.start_ms, det.utterance.end_ms) == (240, 860)
    assert det.utterance.audio == audio[240 * 32 : 860 * 32]


def test_memory_stays_bounded_in_silence_and_utterances_are_capped() -> None:
    model = EchoModel(RATE, 1, EchoOptions(max_utterance_ms=2000))
    d = Driver(model)
    d.feed(ulaw(quiet(10_000, seed=13)))
    assert model.retained_bytes <= 60 * 8 + 20 * 16  # pad of raw plus under one window of PCM
    d.feed(ulaw(tone(5000)))
    lengths = [e.utterance.voiced_samples for e in d.of(UtteranceDetected)]
    assert lengths and lengths[0] == 2000 * 8  # forced end at the cap, while the tone goes on
    assert model.retained_bytes <= (2000 + 2 * 60) * 8 + 20 * 16


def test_an_onset_needs_a_run_of_voiced_windows_and_is_reported_at_once() -> None:
    """Gemini's VAD (`onset_ms`, `report_onsets`): a lone voiced window begins nothing; a run of two begins an
    utterance, reported at once even when it then ends too short to be detected (the next one takes its
    index); `end_utterance` ends one now, its pre-roll the `pad_ms` before the run."""
    model = EchoModel(RATE, 1, EchoOptions(onset_ms=40, report_onsets=True))
    d = Driver(model)
    d.feed(ulaw(quiet(200), tone(20), quiet(600, seed=1)))
    assert d.events == []
    d.feed(ulaw(tone(60), quiet(600, seed=2)))  # begins, but 60 ms is under min_utterance_ms
    assert [type(e) for e in d.events] == [UtteranceStarted] and d.events[0].index == 1
    d.events.clear()
    d.feed(ulaw(quiet(100, seed=3), tone(300)))
    [started] = d.events
    assert isinstance(started, UtteranceStarted) and (started.index, started.voiced_start_ms) == (1, 1580)
    model.end_utterance(d.now)
    [det] = list(iter(model.next_event, None))
    assert isinstance(det, UtteranceDetected) and det.utterance.index == 1
    u = det.utterance
    assert (u.voiced_start, u.start, u.end) == (1580 * 8, 1520 * 8, 1880 * 8)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        EchoOptions(chunk_ms=0)
    with pytest.raises(ValueError):
        EchoOptions(pad_ms=-1)
    with pytest.raises(ValueError):
        EchoModel(RATE, 1).receive_audio(b"\x00", b"\x00", 0)


# -40 dBFS (the default), and a threshold whose 20 ms sum of squares is 2**25 + 0.5, where float32 steps by 4.
@pytest.mark.parametrize("threshold_dbfs", [-40.0, 20 * math.log10(math.sqrt((2**25 + 0.5) / 160) / 32768)])
def test_window_energy_is_exact_in_whole_frames_and_in_pieces(threshold_dbfs: float) -> None:
    """A whole 20 ms frame takes the one-window path, pieces the general one: both decide `voiced` as the exact
    integer sum of squares does, also for windows within a hair of the threshold."""
    options = EchoOptions(threshold_dbfs=threshold_dbfs)
    threshold = (32768.0 * 10 ** (options.threshold_dbfs / 20)) ** 2
    rng = np.random.default_rng(7)
    windows = []
    for _ in range(400):
        x = rng.integers(-400, 401, 160)
        target = threshold * rng.uniform(0.999, 1.001)
        scaled = np.round(x * np.sqrt(target / max(1.0, float(np.mean(x.astype(np.float64) ** 2)))))
        windows.append(scaled.clip(-32768, 32767).astype("<i2"))
    # And windows whose integer sums of squares are the threshold's neighbours (sum / 160 just below and just
    # above it), where a sum in less than double precision (float32's step is 2 there) would misjudge.
    limit = threshold * 160
    for target in (math.floor(limit), math.floor(limit) - 1, math.ceil(limit), math.ceil(limit) + 1):
        windows.append(_window_with_sum_of_squares(target))
    # And where a 20 ms rms (audioop's, floored) steps past floor(sqrt(threshold)) on either side.
    for k in (math.isqrt(int(threshold)), math.isqrt(int(threshold)) + 1):
        for target in (k * k * 160 - 1, k * k * 160, k * k * 160 + 1):
            windows.append(_window_with_sum_of_squares(target))
    expected = [int(np.dot(w.astype(np.int64), w.astype(np.int64))) / 160 > threshold for w in windows]
    assert 0 < sum(expected) < len(expected)  # both sides of the threshold are exercised

    def decisions(piece_samples: int) -> list[bool]:
        model = EchoModel(RATE, 2, options)
        seen: list[bool] = []
        analyse = model._analyse_window

        def spy(voiced: bool, now: int) -> None:
            seen.append(voiced)
            analyse(voiced, now)

        model._analyse_window = spy  # type: ignore[method-assign]
        audio = b"".join(w.tobytes() for w in windows)
        step = 2 * piece_samples
        for i in range(0, len(audio), step):
            model.receive_audio(audio[i : i + step], audio[i : i + step], 0)
        return seen

    assert decisions(160) == expected  # whole windows
    assert decisions(70) == expected  # pieces: the general path


def _window_with_sum_of_squares(target: int, n: int = 160) -> np.ndarray:
    """n int16 samples whose squares sum to `target` exactly (n - 2 of them equal, two found by search)."""
    for base in range(int(math.isqrt(target // n)), 0, -1):
        rest = target - (n - 2) * base * base
        for a in range(math.isqrt(rest), -1, -1):
            b = math.isqrt(rest - a * a)
            if b * b == rest - a * a and max(a, b) < 32768:
                return np.array([base] * (n - 2) + [a, b], dtype="<i2")
    raise AssertionError(f"no window for {target}")
