"""The process's heap around the loop: glibc malloc tuned at start, the start-up heap frozen
for the cyclic collector, and the C heap's free pages given back to the system once a minute.

Why the trim. A call's provider traffic is a churn of 1–4 KiB blocks (JSON messages, base64 audio, socket
reads) that glibc serves from its heap, among longer-lived ones. Free chunks between live ones are not
returned by the trim threshold, which only cuts the top of the heap, so RSS keeps the heap's high-water mark.
Measured on a live bridge (100 calls, the fault campaign's long form, minute 7): glibc's heap held 88.7 MB
of which 44.6 MB was free, and one `malloc_trim(0)` took 3.3 ms and cut RSS from 168.6 to 143.9 MB. A trim
once a minute costs ~0.006 % of a core and one media tick a few milliseconds late in 3,000.

No I/O here beyond the one timer of `HeapTrim` (a shell); where glibc is missing (musl, macOS) every part is
a no-op that says so.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from functools import cache
from importlib import import_module

log = logging.getLogger("parlora.heap")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
MMAP_THRESHOLD_BYTES = 1 << 20  # above the stdlib loop's 256 KiB receive buffer
TRIM_THRESHOLD_BYTES = 4 << 20
TRIM_INTERVAL_S = 60.0

# Modules a call imports on first use. Imported before the freeze, their functions and classes (~4,600
# objects, PyAV's most of them) are not walked again by every full collection.
PRELOAD = (
    "uvloop",
    "rtp.resample",
    "providers.openai_live",
    "providers.openai_realtime",
    "providers.gemini_live",
    "providers.xai",
)


@cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt, libc.malloc_trim  # noqa: B018 (both or neither: musl has neither)
    except (OSError, AttributeError):
        return None
    return libc


def tune_malloc() -> bool:
    """What `MALLOC_MMAP_THRESHOLD_=1048576 MALLOC_TRIM_THRESHOLD_=4194304` in the environment would do, set
    from inside with glibc's `mallopt` (no re-exec): the stdlib loop's socket transports read into a fresh
    256 KiB buffer and shrink it, which glibc serves with mmap + munmap on every read unless its threshold
    is above that. An operator's own MALLOC_MMAP_THRESHOLD_ wins. False where there is no glibc `mallopt`."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or (libc := _glibc()) is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


def freeze_start_up_heap(also: tuple[str, ...] = ()) -> int:
    """Import what a call would import later (PRELOAD, and the modules `also` names), collect, then
    `gc.freeze()`: modules, classes and configuration live as long as the process, so no full collection walks
    them again. The number of objects frozen."""
    for name in (*PRELOAD, *also):
        try:
            import_module(name)
        except ImportError:  # an optional extra not installed (uvloop): it is never imported later either
            pass
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def malloc_trim() -> Callable[[], bool] | None:
    """glibc's `malloc_trim(0)`: free pages anywhere in the heap back to the system, True if any were. None
    where there is no glibc."""
    libc = _glibc()
    if libc is None:
        return None
    trim = libc.malloc_trim
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: bool(trim(0))


class HeapTrim:
    """Calls `trim` every `interval_s` on the running loop (one timer, re-armed), and keeps what it cost:
    `trims`, `released` (trims that gave pages back) and `max_ms` (the longest, wall clock)."""

    def __init__(self, trim: Callable[[], bool], interval_s: float = TRIM_INTERVAL_S) -> None:
        self._trim, self._interval_s = trim, interval_s
        self._timer: asyncio.TimerHandle | None = None
        self.trims = self.released = 0
        self.max_ms = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = loop.call_later(self._interval_s, self._fire, loop)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        begun = time.perf_counter()
        released = self._trim()
        took_ms = (time.perf_counter() - begun) * 1000
        self.trims += 1
        self.released += released
        if took_ms > self.max_ms:
            self.max_ms = took_ms
            log.debug("heap trim took %.1f ms (the longest so far; %d trims)", took_ms, self.trims)
        self.start(loop)


class _MallInfo2(ctypes.Structure):  # glibc >= 2.33 <malloc.h> struct mallinfo2
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks")
        + ("uordblks", "fordblks", "keepcost")
    ]


@cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    libc = _glibc()
    mallinfo2 = getattr(libc, "mallinfo2", None) if libc is not None else None
    if mallinfo2 is not None:
        mallinfo2.restype = _MallInfo2
    return mallinfo2


def figures(walk: bool = True) -> dict[str, int]:
    """The heap now, for /metrics: glibc's bytes in use, free inside its heap (what fragmentation keeps) and
    mmapped; and the interpreter's allocated blocks (objects and buffers, whatever their size). What grows
    with a leak is `malloc_in_use` and `python_blocks`; `malloc_free` grows with fragmentation and is what
    the trim gives back. glibc's part is missing without glibc >= 2.33, and with `walk=False`: `mallinfo2`
    walks every free chunk of every arena under the arena's lock, 22-56 ms with 74 MB free in 30,000 chunks
    (measured here), and a thread does not help: the loop's next malloc waits for the same lock."""
    out = {"python_blocks": sys.getallocatedblocks()}
    if walk and (mallinfo2 := _mallinfo2()) is not None:
        info = mallinfo2()
        out |= {"malloc_in_use": info.uordblks, "malloc_free": info.fordblks, "malloc_mmapped": info.hblkhd}
    return out
