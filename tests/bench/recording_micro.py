"""Micro-benchmark of `--record`'s cost per 20 ms frame: ns per frame, best of 5 runs.

    .venv/bin/python tests/bench/recording_micro.py [--n 20000] [--json]

One "frame" is what a talking call does every 20 ms on the session's side: a caller frame into the session
core, 20 ms of provider PCMU into it (framed and queued for the carrier), and the media clock's take and
`transmitted` (the ledger). It runs three ways:
- `off`: the leg as the channel, no tap (the path without `--record`);
- `on`: the same with the recording's tee as the channel and the caller tap, as `CallSession` wires them;
- `step`: the recording's once-a-second work (`CallRecording.take`: matching the ledger, placing both
  channels, interleaving), measured per frame it handles, off the per-frame path.
The file write itself runs in a worker thread and is not on the loop either. CPU time of this process.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.engine.coordinator import SessionCoordinator
from bridge.server.recording import CallRecording
from providers.base import Capabilities
from providers.events import AudioReceived, SessionStarted
from providers.limits import OPENAI_REALTIME
from rtp.audio import PCMU_8K
from rtp.units import NS_PER_MS as MS
from sip.leg import PlayoutLeg

TICK = 20 * MS
CAPS = Capabilities(server_vad=True, speech_end_events=True, timed_captions=True, truncate=True)
CALLER = bytes(range(256)) + bytes(64)  # 320 bytes of "speech"
PCMU = bytes((i * 7) & 0x7F for i in range(160))


def _call(record: bool) -> Callable[[int], tuple[int, int]]:
    """A talking call: `run(n)` does n frames (the recording's step once per 50, as WavWriter does) and returns
    (ns on the per-frame path, ns in the step)."""
    leg = PlayoutLeg()
    rec = CallRecording() if record else None
    channel = leg if rec is None else rec.channel(leg, 0)
    core = SessionCoordinator(
        limits=OPENAI_REALTIME.for_format(PCMU_8K),
        output_format=PCMU_8K,
        capabilities=CAPS,
        channel=channel,
        now=0,
    )
    core.provider_event(SessionStarted(1, "sess", None), 0)
    playout = leg.playout
    state = {"now": 0}

    def run(n: int) -> tuple[int, int]:
        now, per_frame, step = state["now"], 0, 0
        for _ in range(n // 50):
            t0 = time.process_time_ns()
            for _ in range(50):
                now += TICK
                if rec is not None:
                    rec.caller(CALLER, now)  # CallSession._handle's tap
                core.caller_frame(CALLER, now)
                core.provider_event(AudioReceived(1, PCMU, PCMU_8K, "item-1"), now)
                frame = playout.take()
                if frame is not None:
                    playout.transmitted(frame, now)
                core.commands()
                core.notices()
            t1 = time.process_time_ns()
            if rec is not None:
                rec.take(now)
            per_frame, step = per_frame + t1 - t0, step + time.process_time_ns() - t1
        state["now"] = now
        return per_frame, step

    return run


def best(record: bool, n: int, runs: int = 5) -> tuple[float, float]:
    """(ns per frame on the per-frame path, ns per frame in the step), each the best of `runs`."""
    frame_ns = step_ns = math.inf
    for _ in range(runs):
        run = _call(record)
        run(200)  # warm-up
        per_frame, step = run(n)
        frame_ns, step_ns = min(frame_ns, per_frame / n), min(step_ns, step / n)
    return frame_ns, step_ns


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20_000, help="frames per run")
    parser.add_argument("--quick", action="store_true", help="2,000 frames per run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n = 2_000 if args.quick else args.n
    off = on = step = math.inf
    for _ in range(3):  # alternated, so load from elsewhere hits both alike
        off = min(off, best(False, n)[0])
        on_frame, on_step = best(True, n)
        on, step = min(on, on_frame), min(step, on_step)
    result = {
        "frames": n,
        "per_frame_ns_off": round(off),
        "per_frame_ns_on": round(on),
        "per_frame_added_ns": round(on - off),
        "step_ns_per_frame": round(step),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"per frame, --record off: {off:8.0f} ns")
    print(f"per frame, --record on:  {on:8.0f} ns  (+{on - off:.0f} ns on the per-frame path)")
    print(f"recording step (off the per-frame path, once a second): {step:.0f} ns per frame handled")


if __name__ == "__main__":
    main()
