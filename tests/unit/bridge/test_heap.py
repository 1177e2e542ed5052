"""bridge/server/heap.py: the C heap trimmed once a minute, and the start-up heap frozen with what a call imports."""

from __future__ import annotations

import asyncio
import gc
import os
import sys

import pytest

from bridge.server.heap import PRELOAD, HeapTrim, freeze_start_up_heap, malloc_trim
from tests.support import virtual_time

event_loop_policy = virtual_time.policy_fixture()

glibc = pytest.mark.skipif(malloc_trim() is None, reason="no glibc malloc_trim here")


async def test_the_heap_is_trimmed_once_an_interval_until_stopped() -> None:
    loop, times = asyncio.get_running_loop(), []

    def trim() -> bool:
        times.append(loop.time())
        return len(times) % 2 == 1

    heap = HeapTrim(trim, interval_s=60.0)
    begun = loop.time()
    heap.start(loop)
    await asyncio.sleep(185)  # virtual seconds
    heap.stop()
    await asyncio.sleep(300)
    assert [round(t - begun) for t in times] == [60, 120, 180]  # and none after stop()
    assert heap.trims == 3 and heap.released == 2 and heap.max_ms >= 0.0


def _rss_kib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


@glibc
def test_malloc_trim_gives_back_the_free_pages_between_live_blocks() -> None:
    """The pattern the trim is for: glibc blocks freed between long-lived ones stay resident until trimmed
    (the trim threshold only cuts the heap's top)."""
    trim = malloc_trim()
    assert trim is not None
    blocks = [bytes(2_000) + bytes([i % 251]) for i in range(20_000)]  # ~40 MB, each above pymalloc's 512 B
    kept = blocks[::20]  # one block in twenty lives on, pinning the heap below its top
    del blocks
    before = _rss_kib()
    trim()
    after = _rss_kib()
    # much of the ~38 MB freed between the kept blocks comes back (24 MB on this machine)
    assert before - after > 12_000, (before, after)
    assert len(kept) == 1_000


def test_the_start_up_heap_is_frozen_with_the_modules_a_call_imports_later() -> None:
    try:
        frozen = freeze_start_up_heap()
        assert frozen == gc.get_freeze_count() > 10_000
        assert "rtp.resample" in PRELOAD and "rtp.resample" in sys.modules  # PyAV: its classes are frozen
        assert all(m in sys.modules for m in PRELOAD if m != "uvloop")
    finally:
        gc.unfreeze()


def test_the_freeze_imports_the_modules_it_is_also_given_first() -> None:
    """serve imports the browser channel's aiortc before the loop runs (it held the loop ~0.4 s at start)."""
    try:
        freeze_start_up_heap(("bridge.server.browser", "no.such.module"))  # an optional extra may be missing
        assert "bridge.server.browser" in sys.modules
    finally:
        gc.unfreeze()
