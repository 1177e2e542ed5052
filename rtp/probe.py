"""Process-wide latency probe for the benchmark (`tests/bench/run.py`); off unless `PARLORA_PROBE` is set.

`PARLORA_PROBE=DIR` (read once, at import) switches it on: the hooks below then note, per call, *when* a
20 ms frame or a provider audio chunk passed a point of the bridge and a key for *what* it carried (a CRC-32
of its 8 kHz PCM16 samples), so that the benchmark can follow the same audio from one point to the next by
its content and compute the time it spent in between:

- `media_in`:   a caller frame handed to the bridge by the media port (pjmedia clock thread);
- `ws_sent`:    caller audio written to the provider's WebSocket (asyncio thread);
- `ws_received`: a provider audio chunk read from the WebSocket (asyncio thread; the raw chunk is appended
  to `DIR/probe-PID.chunks`, so nothing grows in memory but two small arrays per point and call);
- `media_out`:  an assistant frame handed to the carrier (pjmedia clock thread; the ledger's transmit time).

Times are `time.monotonic_ns()` (CLOCK_MONOTONIC: the same clock in every process on the machine). At exit
the process writes `DIR/probe-PID.json`. Calls are keyed by the bridge's call id: the media port knows it,
and the WebSocket shell takes it from the name of the asyncio task that opened the connection (the session
task is named after its call).

When the variable is unset `ENABLED` is False, no hook is ever called (each call site tests `ENABLED`
first), and nothing else happens. `rtp` imports nothing from `sip`, `providers` or `bridge`.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import re
import struct
import threading
import zlib
from array import array

DIR = os.environ.get("PARLORA_PROBE") or None
ENABLED = DIR is not None

POINTS = ("media_in", "ws_sent", "ws_received", "media_out")
CHUNK_HEADER = struct.Struct("<qHI")  # monotonic ns, call index, chunk length; then the chunk's bytes

_records: dict[str, dict[str, tuple[array[int], array[int]]]] = {}  # call -> point -> (times ns, keys)
_calls: list[str] = []  # call index (in the chunk file) -> call id
_formats: dict[str, str] = {}  # call -> the provider's output format, as str(AudioFormat)
_lock = threading.Lock()
_chunk_fd: int | None = None
_AUDIO_FIELD = re.compile(r'"(?:audio|delta)"\s*:\s*"([A-Za-z0-9+/=]*)"')
_TASK_SUFFIX = re.compile(r"-provider-\d+$")


def key(pcm: bytes) -> int:
    """The content key of some PCM16 audio."""
    return zlib.crc32(pcm)


def _series(call: str, point: str) -> tuple[array[int], array[int]]:
    per_call = _records.get(call)
    if per_call is None:
        with _lock:
            per_call = _records.setdefault(call, {p: (array("q"), array("L")) for p in POINTS})
    return per_call[point]


def _note(call: str, point: str, t_ns: int, k: int) -> None:
    times, keys = _series(call, point)
    times.append(t_ns)  # appends are atomic under the GIL: the two threads touch different points
    keys.append(k)


def media_in(call: str, t_ns: int, pcm: bytes) -> None:
    """A caller frame (PCM16) arrived from the media port."""
    _note(call, "media_in", t_ns, zlib.crc32(pcm))


def media_out(call: str, t_ns: int, pcm: bytes) -> None:
    """An assistant frame (PCM16) was handed to the carrier."""
    _note(call, "media_out", t_ns, zlib.crc32(pcm))


def current_call() -> str | None:
    """The call id of the running asyncio task ("call-3" for "call-3" and "call-3-provider-2")."""
    import asyncio

    try:
        task = asyncio.current_task()
    except RuntimeError:
        return None
    return _TASK_SUFFIX.sub("", task.get_name()) if task is not None else None


def ws_sent(call: str | None, t_ns: int, frame: str) -> None:
    """A caller-audio frame (JSON text with a base64 G.711 µ-law payload) was written to the socket: each 20 ms
    of it noted as one frame, so that an append of several caller frames (`--provider-append-ms` above 20)
    is still followed frame by frame from `media_in`."""
    match = _AUDIO_FIELD.search(frame)
    if call is None or match is None:
        return
    from rtp.g711 import ulaw_decode

    try:
        ulaw = base64.b64decode(match.group(1))
    except ValueError:
        return
    for at in range(0, len(ulaw), 160):  # 20 ms of 8 kHz G.711
        _note(call, "ws_sent", t_ns, zlib.crc32(ulaw_decode(ulaw[at : at + 160])))


def ws_received(call: str | None, t_ns: int, audio: bytes, fmt: object) -> None:
    """A provider audio chunk (in the provider's output format) was read from the socket."""
    global _chunk_fd
    if call is None:
        return
    with _lock:
        if call not in _formats:
            _formats[call] = str(fmt)
            _calls.append(call)
        index = _calls.index(call)
        if _chunk_fd is None:
            assert DIR is not None
            os.makedirs(DIR, exist_ok=True)
            _chunk_fd = os.open(
                os.path.join(DIR, f"probe-{os.getpid()}.chunks"),
                os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                0o644,
            )
        os.write(_chunk_fd, CHUNK_HEADER.pack(t_ns, index, len(audio)) + audio)
    _note(call, "ws_received", t_ns, len(audio))


def dump() -> str | None:
    """Write `DIR/probe-PID.json` (also at exit); returns its path."""
    if DIR is None:
        return None
    os.makedirs(DIR, exist_ok=True)
    with _lock:
        body = {
            "pid": os.getpid(),
            "calls": list(_calls),
            "formats": dict(_formats),
            "points": {
                call: {p: [list(t), list(k)] for p, (t, k) in points.items()}
                for call, points in _records.items()
            },
        }
    path = os.path.join(DIR, f"probe-{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
    os.replace(tmp, path)
    return path


if ENABLED:
    atexit.register(dump)
