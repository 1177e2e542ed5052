"""Opus (RFC 6716) at the call's edge: decoded by libopus itself (ctypes), encoded through PyAV's libopus.

On the wire (RFC 7587): a dynamic payload type, rtpmap "opus/48000/2" whatever is sent (the /2 is fixed, the
stream may be mono), the RTP clock at 48000 Hz: the timestamp advances 960 per 20 ms frame. Packets are of
any size, so the jitter buffer (rtp.jitter) files one packet per 20 ms slot of the 48 kHz clock and never cuts
or pads a payload.

The leg's media rate: an Opus stream of the native engine runs at 16 kHz, as G.722's does (rtp.stream
`StreamConfig.media_rate`, rtp.g722): libopus decodes straight to 16 kHz mono (it resamples and mixes down
itself) and hands the session 640-byte frames, and the encoder runs at 16 kHz (libopus codes it wideband, up
to 8 kHz) and takes a 640-byte frame as it is and a 320-byte one (a G.711 provider's voice, a closing message,
hold music) through G.722's interpolator (rtp.g722 `WideView`). Our SDP says so (fmtp maxplaybackrate=16000;
sprop-maxcapturerate=16000, RFC 7587 §6.1): a peer may spare its bits above 8 kHz (Opus's super-wide and full
bands), which nothing in the bridge would hear. At 8 kHz (the default of `OpusDecoder`/`OpusEncoder`; an
engine that mixes at 8 kHz) both ends run at 8 kHz (narrowband) as they always did.

Loss: the frames played for a missing slot are rtp.plc's, as for G.711; the decoder itself runs its own PLC
for every packet it missed before it decodes the next (`OpusDecoder` says why that is not optional). A packet of
more than 20 ms (a peer that ignores our ptime) gives its first 20 ms; the rest is not played (`long_packets`)
and the jitter buffer conceals the slot it would have filled. RFC 4733 digits need telephone-event at the audio
clock (48000 here), which the bridge does not run: an Opus call has no DTMF (sip.core.offer_answer drops
telephone-event beside it).

The encoder is fed every slot we send audio, silence included, as rtp.g722's is. Cost (tests/bench/rtp_micro.py
on a loaded 2-CPU host, so an upper bound): decode about 10 µs a frame (one libopus call), encode about 170 µs
(PyAV's libopus at its default complexity) at 8 kHz. At 16 kHz the encode took 1.7 times the 8 kHz one side by
side (200 frames of a two-tone signal, same host), the decode no longer; an 8 kHz frame then adds the
interpolator's pass (rtp.g722).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path

import av

from rtp.audio import PCM16_FRAME_BYTES
from rtp.g722 import WIDE_RATE, WideView

__all__ = ["OPUS_CLOCK", "OPUS_PT", "OpusDecoder", "OpusEncoder", "available"]

OPUS_CLOCK = 48000
OPUS_PT = 111  # the dynamic payload type of our offers (an answer takes the offerer's)
_SILENCE_8K = bytes(PCM16_FRAME_BYTES)
_BITRATE = 16000  # narrowband speech: libopus's NB mode is transparent for a phone call well below this
_WIDE_BITRATE = 20000  # wideband speech: the top of RFC 7587 §3.1.1's 16-20 kb/s for WB speech


@functools.cache
def _load_libopus() -> ctypes.CDLL | None:
    """libopus itself: the system's, else the copy PyAV's wheel carries (av.libs); None if neither loads.
    Looked for once, when the first Opus call (or the configuration check) needs it: `find_library` runs
    ldconfig."""
    candidates = [ctypes.util.find_library("opus")]
    candidates += [str(p) for p in sorted((Path(av.__file__).parent.parent / "av.libs").glob("libopus*.so*"))]
    for name in candidates:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.opus_decoder_create.restype = ctypes.c_void_p
        lib.opus_decoder_create.argtypes = [ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        lib.opus_decode.restype = ctypes.c_int
        lib.opus_decode.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int32,
            ctypes.POINTER(ctypes.c_int16),
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
        return lib
    return None


_MAX_FRAMES = 6  # 120 ms: Opus's longest packet
_MAX_CONCEALED = 5  # a longer gap (a new source, a resync) is not bridged frame by frame


def available() -> bool:
    """Whether libopus could be loaded (sip.core.offer_answer refuses OPUS in a codec list otherwise)."""
    return _load_libopus() is not None


class OpusDecoder:
    """One stream's Opus decoder (libopus through ctypes, at `rate` mono, 8000 or 16000: libopus resamples and
    mixes down itself). `decoder(payload)` takes what rtp.stream files for Opus: the packet's RTP sequence
    number (2 bytes, big-endian) then its payload, and gives the PCM16 of its first 20 ms at `rate` (320 bytes
    at 8 kHz, 640 at 16 kHz). Never raises on peer input: a packet libopus refuses decodes to silence (`errors`).

    Why libopus itself, not PyAV: libopus is to be told of a lost packet (its PLC, `opus_decode` with no
    data) before it decodes the next one, and FFmpeg's API has no call for that (an empty packet ends the
    stream). So a gap in the sequence numbers (a packet lost, or skipped by the jitter buffer's shrink, ceiling
    or resync) runs the PLC once per missing packet, at most `_MAX_CONCEALED` times, before the packet that
    came. Measured (3 losses in 60 packets, RMS distance from the lossless decode): a 200-2200 Hz sweep 9,500
    with the PLC against 20,600 without (SILK's long-term predictor runs away on so periodic a signal either
    way: the next 300 ms came out at 6 times the level); a voice-like signal 177 against 138, alike.
    """

    __slots__ = (
        "_buffer",
        "_bytes",
        "_last_in",
        "_last_out",
        "_lib",
        "_next_seq",
        "_samples",
        "_silence",
        "_state",
        "errors",
        "long_packets",
        "plc",
    )

    def __init__(self, rate: int = 8000) -> None:
        lib = _load_libopus()
        if lib is None:
            raise RuntimeError("libopus is not available")
        self._lib = lib
        error = ctypes.c_int(0)
        self._state = lib.opus_decoder_create(rate, 1, ctypes.byref(error))
        if not self._state or error.value != 0:
            raise RuntimeError(f"opus_decoder_create failed ({error.value})")
        self._samples = rate // 50  # a 20 ms frame: 160 samples at 8 kHz, 320 at 16 kHz
        self._bytes = 2 * self._samples
        self._silence = _SILENCE_8K if rate == 8000 else bytes(self._bytes)
        self._buffer = (ctypes.c_int16 * (_MAX_FRAMES * self._samples))()
        self._next_seq = -1
        self._last_in: bytes | None = None
        self._last_out = self._silence
        self.errors = 0
        self.long_packets = 0
        self.plc = 0  # frames the decoder concealed for packets it never saw

    def __del__(self) -> None:
        if getattr(self, "_state", None):
            self._lib.opus_decoder_destroy(self._state)
            self._state = None

    def __call__(self, sequenced: bytes) -> bytes:
        if sequenced is self._last_in:  # the same packet asked again (rtp.jitter's shrink test): decoded once
            return self._last_out
        lib, samples = self._lib, self._samples
        seq = int.from_bytes(sequenced[:2], "big")
        if self._next_seq >= 0:
            missing = (seq - self._next_seq) & 0xFFFF
            for _ in range(min(missing, _MAX_CONCEALED) if missing < 0x8000 else 0):
                lib.opus_decode(self._state, None, 0, self._buffer, samples, 0)
                self.plc += 1
        self._next_seq = (seq + 1) & 0xFFFF
        payload = sequenced[2:]
        n = (
            lib.opus_decode(self._state, payload, len(payload), self._buffer, _MAX_FRAMES * samples, 0)
            if payload
            else -1
        )
        if n >= samples:
            out = ctypes.string_at(self._buffer, self._bytes)
            if n > samples:
                self.long_packets += 1
        else:
            self.errors += 1
            out = self._silence
        self._last_in, self._last_out = sequenced, out
        return out


class OpusEncoder:
    """One stream's Opus encoder: `encoder(pcm)` is the Opus packet of one 20 ms frame of 8 kHz PCM16 (320
    bytes; a short one is padded with silence). At `rate` 16000 libopus runs at 16 kHz: a 640-byte frame is
    encoded as it is, a 320-byte one brought up to 16 kHz first (rtp.g722 `WideView`, G.722's interpolator)."""

    __slots__ = ("_context", "_frame", "_pts", "_samples", "_wide")

    silence = _SILENCE_8K  # what to encode in a slot with nothing to say (rtp.g722's docstring says why)

    def __init__(self, rate: int = 8000) -> None:
        context = av.CodecContext.create("libopus", "w")
        context.sample_rate = rate
        context.layout = "mono"
        context.format = "s16"
        context.bit_rate = _BITRATE if rate == 8000 else _WIDE_BITRATE
        context.options = {"application": "voip", "frame_duration": "20"}
        context.open()
        self._context = context
        self._samples = rate // 50
        self._frame = av.AudioFrame(format="s16", layout="mono", samples=self._samples)
        self._frame.sample_rate = rate
        self._wide = WideView() if rate == WIDE_RATE else None
        self._pts = 0

    def __call__(self, pcm: bytes) -> bytes:
        if self._wide is not None:
            pcm = self._wide(pcm)
        elif len(pcm) != PCM16_FRAME_BYTES:
            pcm = (pcm + _SILENCE_8K)[:PCM16_FRAME_BYTES]
        frame = self._frame
        frame.planes[0].update(pcm)
        frame.pts = self._pts
        self._pts += self._samples
        packets = self._context.encode(frame)
        return bytes(packets[0]) if len(packets) == 1 else b"".join(bytes(p) for p in packets)
