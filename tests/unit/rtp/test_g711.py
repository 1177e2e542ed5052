"""G.711 must be bit-exact: the bridge passes provider PCMU to the caller unchanged through decode/encode."""

import math
import struct
import warnings

import pytest

from rtp.g711 import alaw_decode, alaw_encode, table_codecs, ulaw_decode, ulaw_encode

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # CPython's C module (Sun g711.c); from 3.13 on the audioop-lts package of the same code

ALL_SAMPLES = struct.pack("<65536h", *range(-32768, 32768))
ALL_CODES = bytes(range(256))


# The tables built from the algorithm: on 3.13 they hold audioop-lts to the answers 3.11's audioop gives.
TABLES = table_codecs()


def test_ulaw_encode_matches_reference_for_every_sample() -> None:
    assert TABLES["ulaw_encode"](ALL_SAMPLES) == audioop.lin2ulaw(ALL_SAMPLES, 2)
    assert ulaw_encode(ALL_SAMPLES) == TABLES["ulaw_encode"](ALL_SAMPLES)


def test_alaw_encode_matches_reference_for_every_sample() -> None:
    assert TABLES["alaw_encode"](ALL_SAMPLES) == audioop.lin2alaw(ALL_SAMPLES, 2)
    assert alaw_encode(ALL_SAMPLES) == TABLES["alaw_encode"](ALL_SAMPLES)


def test_decode_matches_reference_for_every_code() -> None:
    assert TABLES["ulaw_decode"](ALL_CODES) == audioop.ulaw2lin(ALL_CODES, 2) == ulaw_decode(ALL_CODES)
    assert TABLES["alaw_decode"](ALL_CODES) == audioop.alaw2lin(ALL_CODES, 2) == alaw_decode(ALL_CODES)


@pytest.mark.parametrize(
    ("code", "value"),
    [(0x00, -32124), (0x80, 32124), (0xFF, 0), (0x7F, 0), (0x7E, -8), (0xFE, 8)],
)
def test_ulaw_reference_vectors(code: int, value: int) -> None:
    assert struct.unpack("<h", ulaw_decode(bytes([code])))[0] == value


@pytest.mark.parametrize(
    ("code", "value"),
    [(0xD5, 8), (0x55, -8), (0xAA, 32256), (0x2A, -32256)],
)
def test_alaw_reference_vectors(code: int, value: int) -> None:
    assert struct.unpack("<h", alaw_decode(bytes([code])))[0] == value


def test_ulaw_round_trip_is_identity_except_negative_zero() -> None:
    """Decode then encode returns every code, except 0x7F (-0), which re-encodes as 0xFF (+0)."""
    again = ulaw_encode(ulaw_decode(ALL_CODES))
    differ = [c for c in range(256) if again[c] != c]
    assert differ == [0x7F]


def test_alaw_round_trip_is_identity() -> None:
    assert alaw_encode(alaw_decode(ALL_CODES)) == ALL_CODES


def test_silence_encodes_to_the_standard_idle_codes() -> None:
    assert ulaw_encode(bytes(320)) == b"\xff" * 160
    assert alaw_encode(bytes(320)) == b"\xd5" * 160


@pytest.mark.parametrize("name", ["ulaw_encode", "alaw_encode"])
def test_odd_pcm_length_is_a_clear_error(name: str) -> None:
    for encode in ({"ulaw_encode": ulaw_encode, "alaw_encode": alaw_encode}[name], TABLES[name]):
        with pytest.raises(ValueError, match="even byte count"):
            encode(b"\x00\x01\x02")


def test_rms_is_the_floored_root_mean_square() -> None:
    """The frame level (bridge/engine/vad.py, the echo fake) is audioop.rms: on 3.13 the audioop-lts package's."""
    frames = [bytes(320), struct.pack("<160h", *([-32768] * 160)), struct.pack("<160h", *([32767] * 160))]
    frames += [ALL_SAMPLES[i : i + 320] for i in range(0, len(ALL_SAMPLES), 320 * 37)]
    frames += [struct.pack("<160h", *([k] * 159 + [k + 1])) for k in (1, 181, 1036, 23170)]
    for frame in frames:
        samples = struct.unpack(f"<{len(frame) // 2}h", frame)
        assert audioop.rms(frame, 2) == math.isqrt(sum(s * s for s in samples) // len(samples))
