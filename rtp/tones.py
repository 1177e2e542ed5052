"""Call-progress tones a caller hears before the answer (early media, sip/native/early.py), as 20 ms frames of
8 kHz PCM16.

`RINGBACK_TONES` (the names a route's `early_media` takes):
- `ringback`: 425 Hz, 1 s on, 4 s off — the ringing tone of ETSI TR 101 041 / ITU-T E.180 Supplement 2 that
  most of Europe uses (the bridge's default: a caller anywhere recognises it as "ringing");
- `ringback-us`: 440 + 480 Hz, 2 s on, 4 s off — North America's (ANSI T1.401, the "precise tone plan").
The level is about -19 dBFS RMS per tone (a sine at G.711's 0 dBm0 is about -3 dBFS RMS, so -16 dBm0: within
the -13 to -19 dBm0 call-progress tones are sent at). The cycle starts on its "on" part, so a caller whose call is answered within a second hears one
ring, not silence. Frames are made once per tone and shared by every call (they are immutable bytes).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from rtp.audio import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE

# name → (frequencies in Hz, on ms, off ms)
RINGBACK_TONES: dict[str, tuple[tuple[int, ...], int, int]] = {
    "ringback": ((425,), 1000, 4000),
    "ringback-us": ((440, 480), 2000, 4000),
}
TONE_AMPLITUDE = 5000  # per frequency, of 32767: -16 dBFS peak, -19 dBFS RMS


@cache
def ringback_frames(name: str) -> tuple[bytes | None, ...]:
    """One cycle of the tone `name`, 20 ms a frame: PCM16 for the "on" part, None (send nothing but the codec's
    idle pattern) for the "off" part. KeyError for a name not in `RINGBACK_TONES`."""
    frequencies, on_ms, off_ms = RINGBACK_TONES[name]
    n = np.arange(on_ms * SAMPLE_RATE // 1000)
    wave = np.sum([np.sin(2 * np.pi * f * n / SAMPLE_RATE) for f in frequencies], axis=0)
    pcm = (TONE_AMPLITUDE * wave).astype("<i2").tobytes()
    size = FRAME_SAMPLES * 2
    on = tuple(pcm[i : i + size] for i in range(0, len(pcm), size))
    return on + (None,) * (off_ms // FRAME_MS)


def pcm_frames(pcm: bytes) -> tuple[bytes, ...]:
    """8 kHz mono PCM16 as 20 ms frames, the last one padded with silence."""
    size = FRAME_SAMPLES * 2
    frames = [pcm[i : i + size] for i in range(0, len(pcm) - len(pcm) % 2, size)]
    if frames and len(frames[-1]) < size:
        frames[-1] = frames[-1] + bytes(size - len(frames[-1]))
    return tuple(frames)
