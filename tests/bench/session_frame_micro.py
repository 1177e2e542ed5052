"""Caller-frame micro-benchmark: the CPU time and the Python calls of one caller frame, per provider, from the
session's frame sink (bridge/server/session.py `CallerFrames`, where the leg's media tick hands each frame) to
the bytes on the provider's socket.

N real `CallSession`s, each with a frame-sink leg (the native leg's way in) and the real adapter of one protocol,
connected over loopback to that protocol's fake (`parlora-bridge fake-provider`, its own process; Gemini's
over TLS, as its fake takes only wss, the others in the clear). Every 20 ms
each session gets one caller frame (1 s of tone, 1 s of silence, staggered); the sink call is timed with the
thread's CPU clock (time.thread_time_ns: other processes on the shared cores do not count, and nothing but the
frame's own work runs inside the call: the coordinator, the carry-out, the adapter's encoding, the WebSocket
frame and the `send` system call). Figures are per call per frame: the median of the per-second means. The
Python calls are counted with sys.setprofile (calls of Python and of C functions) over a separate window.

    PYTHONPATH=. .venv/bin/python tests/bench/session_frame_micro.py                 # every protocol
    PYTHONPATH=. .venv/bin/python tests/bench/session_frame_micro.py --protocols xai --sessions 10

Not a pass/fail test: on a shared 2-core machine one run's figures move by 10-20 %; compare medians of runs
interleaved with the tree being compared. The thread's CPU includes the kernel's side of the `send` (on loopback
that is the receiving side's TCP work too), which is where a WebSocket write's cost mostly is.

Caller frames in pairs (`Capabilities.append_frames` 2, bridge/server/session.py `ProviderLinks`), 20 sessions
per protocol, the median of three interleaved runs each (this machine, shared, 2026-12):

| protocol | µs per caller frame: one append per frame -> per two | Python calls per frame | WS frames per frame |
|---|---|---|---|
| openai-live | 82.9 -> 66.5 | 62.5 -> 56.4 | 1 -> 0.5 |
| openai-realtime | 70.3 -> 49.0 | 55.3 -> 48.8 | 1 -> 0.5 |
| xai | 70.5 -> 52.0 | 55.5 -> 48.8 | 1 -> 0.5 |
| gemini-live (TLS) | 220.3 -> 137.7 | 82.6 -> 63.8 | 1 -> 0.5 |
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from provider_micro import free_port, start_fake  # noqa: E402  (the bench's directory, just put on the path)

FRAME_MS = 20
RATE = 8000
PATTERN_FRAMES = 100  # 2 s: 1 s of tone, 1 s of silence
PROTOCOLS = ("openai-live", "openai-realtime", "xai", "gemini-live")


def _frames() -> list[bytes]:
    n = RATE * FRAME_MS // 1000
    tone = b"".join(
        int(0.3 * 32767 * math.sin(2 * math.pi * 440 * i / RATE)).to_bytes(2, "little", signed=True)
        for i in range(n * PATTERN_FRAMES // 2)
    )
    both = tone + bytes(len(tone))
    step = 2 * n
    return [both[i : i + step] for i in range(0, len(both), step)]


def _adapter(protocol: str, url: str, token: int) -> Any:
    from providers.base import SessionSettings
    from rtp.audio import PCMU_8K

    if protocol == "openai-live":
        from providers.openai_live import LiveConfig, OpenAILiveAdapter

        return OpenAILiveAdapter(
            "k", LiveConfig(), limits=OpenAILiveAdapter.audio_limits(PCMU_8K), url=url, token=token
        )
    if protocol == "gemini-live":
        import ssl

        from providers.gemini_live import GeminiLiveAdapter

        context = ssl.create_default_context()  # the fake's self-signed pair (Gemini's fake speaks only wss)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        limits = GeminiLiveAdapter.audio_limits(PCMU_8K)
        url = url.replace("ws://", "wss://")
        return GeminiLiveAdapter(
            "k", SessionSettings(), limits=limits, url=url, token=token, ssl_context=context
        )
    if protocol == "xai":
        from providers.xai import XAIAdapter as Realtime
    else:
        from providers.openai_realtime import OpenAIRealtimeAdapter as Realtime  # type: ignore[assignment]
    return Realtime("k", SessionSettings(), limits=Realtime.audio_limits(PCMU_8K), url=url, token=token)


async def _worker(args: argparse.Namespace) -> dict[str, Any]:
    from bridge.server.session import CallSession
    from sip.leg import FrameReceived, FrameSink, LegFeatures
    from tests.support.session import FakeLeg

    class SinkLeg(FakeLeg):
        features = LegFeatures(frame_sink=True)

        def __init__(self) -> None:
            super().__init__()
            self.sink: FrameSink | None = None

        def set_frame_sink(self, sink: FrameSink | None) -> None:
            self.sink = sink

    legs = [SinkLeg() for _ in range(args.sessions)]
    sessions = [CallSession(leg, _adapter(args.protocol, args.url, 1)) for leg in legs]
    tasks = [asyncio.create_task(s.run()) for s in sessions]
    for _ in range(3000):
        if all(leg.sink is not None for leg in legs):
            break
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError("the sessions did not start")
    frames = _frames()
    loop = asyncio.get_running_loop()
    per_second: list[float] = []
    calls: list[float] = []
    cpu = 0
    count = 0
    t0 = loop.time()
    n = 0
    total = int((args.warmup + args.seconds) * 1000 / FRAME_MS)
    profile_from = total - 50  # the last second: Python calls counted
    counter = [0]

    def profiler(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            counter[0] += 1

    clock = time.thread_time_ns
    while n < total:
        sinks = [leg.sink for leg in legs]
        profiling = n >= profile_from
        if profiling:
            counter[0] = 0
            sys.setprofile(profiler)
        for i, sink in enumerate(sinks):
            assert sink is not None
            frame = FrameReceived(frames[(n + 7 * i) % PATTERN_FRAMES], n, n * 160)
            if profiling:
                sink(frame)
                continue
            c0 = clock()
            sink(frame)
            cpu += clock() - c0
        if profiling:
            sys.setprofile(None)
            calls.append((counter[0] - 2 * len(sinks)) / len(sinks))  # (less the profiler's own: setprofile)
        else:
            count += len(sinks)
        n += 1
        if n % 50 == 0 and n * FRAME_MS / 1000 > args.warmup and count:
            per_second.append(cpu / count / 1000)
        if n % 50 == 0:
            cpu = count = 0
        await asyncio.sleep(max(0.0, t0 + n * FRAME_MS / 1000 - loop.time()))  # absolute deadlines
    dropped = sum(getattr(s.providers[1].shell, "audio_dropped", 0) for s in sessions if 1 in s.providers)
    sent = sum(getattr(s.providers[1].shell, "frames_sent", 0) for s in sessions if 1 in s.providers)
    for leg in legs:
        leg.hangup("bench over")
    await asyncio.wait(tasks, timeout=10)
    return {
        "protocol": args.protocol,
        "sessions": args.sessions,
        "us_per_frame_median": round(statistics.median(per_second), 2),
        "us_per_frame_seconds": [round(x, 2) for x in per_second],
        "python_calls_per_frame": round(statistics.median(calls), 1),
        "ws_frames_per_caller_frame": round(sent / (args.sessions * total), 3),
        "dropped": dropped,
    }


def worker_main(args: argparse.Namespace) -> None:
    import logging

    logging.disable(logging.WARNING)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(_worker(args))
    print(json.dumps(result), flush=True)


def driver_main(args: argparse.Namespace) -> None:
    results = []
    for protocol in args.protocols.split(","):
        port = free_port()
        fake = start_fake(port, protocol)
        try:
            out = subprocess.run(
                [sys.executable, __file__, "--worker", "--protocol", protocol]
                + ["--url", f"ws://127.0.0.1:{port}", "--sessions", str(args.sessions)]
                + ["--seconds", str(args.seconds), "--warmup", str(args.warmup)],
                capture_output=True,
                text=True,
                check=True,
                env=dict(os.environ, PYTHONPATH=str(ROOT)),
            )
        finally:
            fake.terminate()
            fake.wait(10)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(result)
        print(json.dumps(result), flush=True)
    print(
        "| protocol | sessions | µs per caller frame (median) | Python calls per frame | WS frames per frame |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['protocol']} | {r['sessions']} | {r['us_per_frame_median']} | {r['python_calls_per_frame']} "
            f"| {r['ws_frames_per_caller_frame']} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--protocol", default="openai-live", help=argparse.SUPPRESS)
    p.add_argument("--url", default="", help=argparse.SUPPRESS)
    p.add_argument("--protocols", default=",".join(PROTOCOLS))
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    args = p.parse_args()
    (worker_main if args.worker else driver_main)(args)


if __name__ == "__main__":
    main()
