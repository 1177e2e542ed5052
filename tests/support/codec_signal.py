"""Signals through a codec, for the codec tests (tests/unit/rtp/test_g722.py, test_opus.py): 8 kHz PCM16 cut
into 20 ms frames, decoded frames back into one signal, the lag and correlation at which a decoded signal matches
its reference, and the packets an RTP stream sent."""

from __future__ import annotations

import numpy as np

from rtp.packet import RtpPacket, build, parse

SAMPLES_PER_FRAME = 160  # 20 ms at 8000 Hz


def frames(signal: np.ndarray) -> list[bytes]:
    return [signal[i : i + SAMPLES_PER_FRAME].tobytes() for i in range(0, len(signal), SAMPLES_PER_FRAME)]


def tone(hz: float, frames: int, rate: int, level: float = 8000.0) -> np.ndarray:
    """`frames` x 20 ms of a sine at `rate` (PCM16 samples)."""
    t = np.arange(rate // 50 * frames) / rate
    return np.asarray(level * np.sin(2 * np.pi * hz * t), dtype="<i2")


def split(signal: np.ndarray, samples: int) -> list[bytes]:
    """`signal` cut into frames of `samples` (160 at 8 kHz, 320 at 16 kHz)."""
    return [signal[i : i + samples].tobytes() for i in range(0, len(signal), samples)]


def band_share(pcm: bytes, rate: int, lo: float, hi: float) -> float:
    """The share of the signal's energy between `lo` and `hi` Hz."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    power = np.abs(np.fft.rfft(x * np.hanning(len(x)))) ** 2
    hz = np.fft.rfftfreq(len(x), 1 / rate)
    return float(power[(hz >= lo) & (hz <= hi)].sum() / power.sum())


def pcm(decoded: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(decoded), dtype="<i2").astype(np.float64)


def best(reference: np.ndarray, decoded: np.ndarray, max_lag: int) -> tuple[int, float]:
    """The lag (samples) at which `decoded` matches `reference` best, and the correlation there."""
    n = len(decoded) - max_lag
    scores = [float(np.corrcoef(reference[:n], decoded[lag : lag + n])[0, 1]) for lag in range(max_lag)]
    lag = int(np.argmax(scores))
    return lag, scores[lag]


def sent(view: memoryview | bytes | None) -> RtpPacket:
    """The RTP packet a stream handed to the socket."""
    assert view is not None
    packet = parse(bytes(view))
    assert isinstance(packet, RtpPacket)
    return packet


def wire(packet: RtpPacket) -> bytes:
    return build(packet.pt, packet.marker, packet.seq, packet.timestamp, packet.ssrc, packet.payload)
