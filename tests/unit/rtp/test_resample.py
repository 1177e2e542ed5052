"""The PyAV-backed resampler: frequency, level, chunking and length accounting."""

import time

import numpy as np
import pytest

from rtp.resample import Resampler


def tone(rate: int, ms: int, freq: float = 1000.0, amplitude: float = 10000.0) -> bytes:
    t = np.arange(rate * ms // 1000) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes()


def samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    k = int(np.argmax(spectrum))
    # Parabolic interpolation around the peak bin for sub-bin accuracy.
    a, b, c = np.log(spectrum[k - 1 : k + 2] + 1e-12)
    return (k + 0.5 * (a - c) / (a - 2 * b + c)) * rate / len(x)


def rms_db(x: np.ndarray) -> float:
    return 20 * np.log10(np.sqrt(np.mean(x**2)))


def run_chunked(r: Resampler, pcm: bytes, chunk: int) -> bytes:
    out = b"".join(r.process(pcm[i : i + chunk]) for i in range(0, len(pcm), chunk))
    return out + r.flush()


@pytest.mark.parametrize(("in_rate", "out_rate"), [(8000, 16000), (24000, 8000), (16000, 24000)])
def test_a_tone_keeps_its_frequency_and_level(in_rate: int, out_rate: int) -> None:
    pcm = tone(in_rate, 1000)
    out = samples(run_chunked(Resampler(in_rate, out_rate), pcm, in_rate // 50 * 2))
    steady = out[out_rate // 10 : -out_rate // 10]  # skip the filter's edges
    assert abs(peak_hz(steady, out_rate) - 1000.0) < 3.0
    assert abs(rms_db(steady) - rms_db(samples(pcm))) < 1.0


def test_chunked_processing_equals_one_shot() -> None:
    pcm = tone(8000, 2000, freq=700) + tone(8000, 500, freq=1900)
    one_shot = samples(run_chunked(Resampler(8000, 16000), pcm, len(pcm)))
    chunked = samples(run_chunked(Resampler(8000, 16000), pcm, 320))
    odd = samples(run_chunked(Resampler(8000, 16000), pcm, 77))  # odd byte counts carry over
    assert len(one_shot) == len(chunked) == len(odd)
    assert np.max(np.abs(one_shot - chunked)) <= 2
    assert np.max(np.abs(one_shot - odd)) <= 2


@pytest.mark.parametrize(("in_rate", "out_rate"), [(8000, 16000), (24000, 8000)])
def test_lengths_add_up_over_ten_seconds_of_frames(in_rate: int, out_rate: int) -> None:
    r = Resampler(in_rate, out_rate)
    frame = tone(in_rate, 20)
    total = 0
    for n in range(1, 501):
        total += len(r.process(frame)) // 2
        expected = n * len(frame) // 2 * out_rate // in_rate
        assert expected - 40 <= total <= expected  # only the filter delay is ever outstanding
    total += len(r.flush()) // 2
    assert abs(total - 10 * out_rate) <= 2


def test_flush_and_reset_leave_it_ready_for_a_new_stream() -> None:
    r = Resampler(8000, 16000)
    first = run_chunked(r, tone(8000, 200), 320)
    second = run_chunked(r, tone(8000, 200), 320)
    assert first == second
    r.process(tone(8000, 100))
    r.reset()
    assert run_chunked(r, tone(8000, 200), 320) == first


def test_equal_rates_pass_through_and_bad_rates_are_refused() -> None:
    pcm = tone(16000, 20)
    r = Resampler(16000, 16000)
    assert r.process(pcm[:5]) + r.process(pcm[5:]) == pcm
    with pytest.raises(ValueError):
        Resampler(0, 8000)


def test_per_frame_cost_is_small() -> None:
    r = Resampler(24000, 8000)
    frame = tone(24000, 20)
    r.process(frame)
    start = time.perf_counter()
    for _ in range(200):
        r.process(frame)
    per_frame = (time.perf_counter() - start) / 200
    assert per_frame < 500e-6  # generous for loaded CI machines; measured about 30 µs
