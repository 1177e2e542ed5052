"""Audio formats and the telephone frame: 8 kHz, 20 ms, 160 samples.

These value types are shared by every room: `sip` hands 8 kHz PCM16 frames in and out (16 kHz on a G.722 or
Opus leg of the native engine, 640 bytes a frame: rtp.g722, rtp.opus), `providers` declare the formats they send and receive, and
`bridge` converts between them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

SAMPLE_RATE = 8000
FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 160
PCM16_FRAME_BYTES = FRAME_SAMPLES * 2  # 320


class Encoding(enum.Enum):
    """Wire encodings, named as the providers name them."""

    PCMU = "audio/pcmu"
    PCMA = "audio/pcma"
    PCM16 = "audio/pcm"


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """An encoding at a sample rate, mono. G.711 is one byte per sample, PCM16 two."""

    encoding: Encoding
    rate: int

    @property
    def bytes_per_ms(self) -> int:
        width = 2 if self.encoding is Encoding.PCM16 else 1
        return width * self.rate // 1000

    @property
    def sample_width(self) -> int:
        return 2 if self.encoding is Encoding.PCM16 else 1

    def duration_ms(self, nbytes: int) -> float:
        return nbytes / self.bytes_per_ms

    def __str__(self) -> str:
        return f"{self.encoding.value}@{self.rate}"


PCMU_8K = AudioFormat(Encoding.PCMU, 8000)
PCMA_8K = AudioFormat(Encoding.PCMA, 8000)
PCM16_8K = AudioFormat(Encoding.PCM16, 8000)
PCM16_16K = AudioFormat(Encoding.PCM16, 16000)
PCM16_24K = AudioFormat(Encoding.PCM16, 24000)
