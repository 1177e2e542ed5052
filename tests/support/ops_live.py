"""Harness moved unchanged from tests/integration/test_ops_live.py: _stream_in_background."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import peers


def _stream_in_background(
    pool: concurrent.futures.ThreadPoolExecutor, bridge, utterance, workdir: Path, seconds: float
) -> concurrent.futures.Future[peers.SippResult]:
    workdir.mkdir()
    peers.make_ulaw(utterance.path, workdir / "speech.ul")
    return pool.submit(
        peers.run_sipp,
        "uac_stream",
        bridge.sip_port,
        workdir=workdir,
        timeout=seconds + 30,
        extra_args=["-d", str(int(seconds * 1000))],
    )
