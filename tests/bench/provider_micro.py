"""Provider-path micro-benchmark: what one provider WebSocket costs the bridge process, per call.

N fake sessions run through the real GPT-Live adapter (`providers.openai_live.OpenAILiveAdapter`) against the
echo fake in its own process (`parlora-bridge fake-provider`): every session sends 20 ms of caller audio on one
process-wide tick on absolute deadlines (1 s of tone, 1 s of silence, staggered per session) and reads the
fake's echo of each tone back. Only the bench process's CPU is counted (getrusage, user + system, over a
steady-state window after every session is up); the fake's is its own.

Each variant runs in a fresh worker process, so that the loop, the JSON module and the shell are chosen
before anything is imported or connected:
- shell: `new` (providers/ws_shell.py: websockets' sans-I/O protocol in an asyncio.Protocol) or `old`
  (tests/bench/legacy_ws_shell.py: the websockets asyncio API the bridge used before);
- json: `orjson` or `stdlib` (the adapters' JSON as it was: json.dumps / json.loads);
- loop: `uvloop` or `asyncio`;
- append: caller audio per append, 20 (every frame) or 100 ms;
- malloc: `default` or `tuned` (bridge.server.heap.tune_malloc: glibc's mmap threshold above the loop's 256 KiB
  receive buffer); gc: `freeze` runs gc.freeze() once the sessions are up.

    .venv/bin/python tests/bench/provider_micro.py                   # the whole table, 50 and 200 sessions
    .venv/bin/python tests/bench/provider_micro.py --sessions 50 --seconds 10 --variants after,before

Not a pass/fail test: numbers on a shared 2-core machine move by a few tenths of a point between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import resource
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

FRAME_MS = 20
RATE = 8000
PATTERN_FRAMES = 100  # 2 s: 1 s of tone, 1 s of silence


@dataclass(frozen=True)
class Variant:
    name: str
    shell: str = "new"
    json: str = "orjson"
    loop: str = "uvloop"
    append_ms: int = 20
    malloc: str = "default"
    gc: str = "none"

    def args(self) -> list[str]:
        return [
            "--shell",
            self.shell,
            "--json",
            self.json,
            "--loop",
            self.loop,
            "--append-ms",
            str(self.append_ms),
            "--malloc",
            self.malloc,
            "--gc",
            self.gc,
        ]


VARIANTS = {
    v.name: v
    for v in (
        Variant("before", shell="old", json="stdlib", loop="asyncio"),  # the old shell, stdlib JSON, asyncio
        Variant("new-shell", json="stdlib", loop="asyncio"),  # + the sans-I/O shell
        Variant("+orjson", loop="asyncio"),  # + orjson
        Variant("+malloc", loop="asyncio", malloc="tuned"),  # + mallopt (matters on the stdlib loop only)
        Variant("after", malloc="tuned", gc="freeze"),  # + uvloop + gc.freeze: what `serve` runs by default
        # the old shell with everything else
        Variant("old-shell@best", shell="old", malloc="tuned", gc="freeze"),
        Variant("after@100ms", malloc="tuned", gc="freeze", append_ms=100),  # --provider-append-ms 100
    )
}


# -- the worker: one variant, one process ------------------------------------------------------------------------


def _frames() -> list[bytes]:
    import numpy as np

    n = RATE * FRAME_MS // 1000
    t = np.arange(n * PATTERN_FRAMES // 2) / RATE
    tone = (0.3 * 32767 * np.sin(2 * math.pi * 440 * t)).astype("<i2").tobytes()
    silence = bytes(len(tone))
    both = tone + silence
    step = 2 * n
    return [both[i : i + step] for i in range(0, len(both), step)]


def _use_stdlib_json() -> None:
    """The adapters' JSON before orjson: json.dumps for every frame (audio appends too), json.loads."""
    import base64

    import providers.openai_live as live

    class StdJson:
        @staticmethod
        def dumps(obj: Any) -> bytes:
            return json.dumps(obj, separators=(",", ":")).encode()

        loads = staticmethod(json.loads)

    def append_audio(self: live.LiveClientProtocol, audio: bytes) -> str:
        return json.dumps(
            {"type": "session.input_audio.append", "audio": base64.b64encode(audio).decode("ascii")},
            separators=(",", ":"),
        )

    live.orjson = StdJson  # type: ignore[attr-defined,assignment]
    live.LiveClientProtocol.append_audio = append_audio  # type: ignore[method-assign]


async def _worker(args: argparse.Namespace) -> dict[str, Any]:
    import logging

    from providers.events import AudioReceived, SessionClosed
    from providers.openai_live import LiveConfig, OpenAILiveAdapter
    from rtp.audio import PCMU_8K

    if args.json == "stdlib":
        _use_stdlib_json()
    log = logging.getLogger("bench")
    limits = OpenAILiveAdapter.audio_limits(PCMU_8K)
    adapters = [
        OpenAILiveAdapter(
            "sk-test",
            LiveConfig(),
            limits=limits,
            url=args.url,
            token=i + 1,
            append_ms=args.append_ms,
            connect_timeout=30.0,
        )
        for i in range(args.sessions)
    ]
    if args.shell == "old":
        from legacy_ws_shell import WebSocketShell as LegacyShell

        for a in adapters:
            legacy = LegacyShell(
                a.core, a.url, {"Authorization": "Bearer sk-test"}, log=log, connect_timeout=30.0
            )
            a.shell = legacy  # type: ignore[assignment]
    for i in range(0, len(adapters), 25):
        await asyncio.gather(*(a.connect() for a in adapters[i : i + 25]))
    received = [0] * len(adapters)
    closed = 0

    async def consume(i: int, adapter: OpenAILiveAdapter) -> None:
        nonlocal closed
        async for event in adapter.events():
            if isinstance(event, AudioReceived):
                received[i] += len(event.audio)
            elif isinstance(event, SessionClosed):
                closed += 1

    consumers = [asyncio.create_task(consume(i, a)) for i, a in enumerate(adapters)]
    frames = _frames()
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + args.warmup + args.seconds
    sent = 0

    async def tick() -> None:
        nonlocal sent
        t0, n = loop.time(), 0
        while loop.time() < stop_at:
            for i, a in enumerate(adapters):
                a.send_audio(frames[(n + 7 * i) % PATTERN_FRAMES])
            sent += len(adapters)
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * FRAME_MS / 1000 - loop.time()))  # absolute deadlines

    ticker = asyncio.create_task(tick())
    if args.gc == "freeze":
        gc.collect()
        gc.freeze()
    await asyncio.sleep(args.warmup)
    r0, w0, got0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic(), sum(received)
    sent0 = sent
    await asyncio.sleep(args.seconds)
    r1, w1, got1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic(), sum(received)
    sent1, closed_early = sent, closed
    await ticker
    await asyncio.gather(*(a.close(timeout=2.0) for a in adapters))
    for c in consumers:
        c.cancel()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    wall = w1 - w0
    n = len(adapters)
    return {
        "sessions": n,
        "cpu_pct_per_session": round(100 * cpu / wall / n, 4),
        "cpu_pct_total": round(100 * cpu / wall, 1),
        "user_share": round((r1.ru_utime - r0.ru_utime) / cpu, 2) if cpu else None,
        "frames_sent_per_s": round((sent1 - sent0) / wall),
        "echo_kbps_per_session": round(8 * (got1 - got0) / wall / n / 1000, 1),  # PCMU: 64 while echoing
        "closed_early": closed_early,  # sessions that ended before the window did (should be 0)
        "dropped": sum(a.shell.audio_dropped for a in adapters),
    }


def worker_main(args: argparse.Namespace) -> None:
    if args.malloc == "tuned":
        from bridge.server.heap import tune_malloc

        assert tune_malloc(), "mallopt unavailable"
    if args.loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            result = runner.run(_worker(args))
    else:
        result = asyncio.run(_worker(args))
    print(json.dumps(result), flush=True)


# -- the driver: the fake, then each variant --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_fake(port: int, protocol: str = "openai-live") -> subprocess.Popen[bytes]:
    """`parlora-bridge fake-provider` of `protocol` on 127.0.0.1:`port`, once it accepts connections."""
    fake = subprocess.Popen(
        [sys.executable, "-m", "bridge", "fake-provider", "--protocol", protocol]
        + ["--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return fake
        except OSError:
            time.sleep(0.2)
    fake.kill()
    raise RuntimeError("the fake provider did not start")


def driver_main(args: argparse.Namespace) -> None:
    names = args.variants.split(",") if args.variants else list(VARIANTS)
    sizes = [int(s) for s in str(args.sessions).split(",")]
    rows = []
    for size in sizes:
        for name in names:
            port = free_port()
            fake = start_fake(port)  # a fresh fake per run: no leftovers from the last one
            try:
                cmd = [
                    sys.executable,
                    __file__,
                    "--worker",
                    "--url",
                    f"ws://127.0.0.1:{port}/v1/live/sessions",
                    "--sessions",
                    str(size),
                    "--seconds",
                    str(args.seconds),
                    "--warmup",
                    str(args.warmup),
                    *VARIANTS[name].args(),
                ]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + 180)
            finally:
                fake.terminate()
                fake.wait(10)
            if out.returncode != 0:
                print(f"{name} @ {size}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            row = {"variant": name, **vars(VARIANTS[name]), **json.loads(out.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(
        "| sessions | variant | shell | json | loop | append ms | malloc | gc | CPU % of a core per session "
        "| CPU % total | echo kbit/s per session |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['sessions']} | {r['variant']} | {r['shell']} | {r['json']} | {r['loop']} | {r['append_ms']} "
            f"| {r['malloc']} | {r['gc']} | {r['cpu_pct_per_session']:.3f} | {r['cpu_pct_total']} "
            f"| {r['echo_kbps_per_session']} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument(
        "--sessions", default="50,200", help="concurrent sessions (comma-separated for several runs)"
    )
    p.add_argument("--seconds", type=float, default=20.0, help="measured window per run")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds after connecting before measuring")
    p.add_argument(
        "--variants", default=None, help=f"comma-separated, of {', '.join(VARIANTS)} (default all)"
    )
    p.add_argument("--shell", choices=["new", "old"], default="new")
    p.add_argument("--json", choices=["orjson", "stdlib"], default="orjson")
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    p.add_argument("--append-ms", type=int, default=20)
    p.add_argument("--malloc", choices=["default", "tuned"], default="default")
    p.add_argument("--gc", choices=["none", "freeze"], default="none")
    args = p.parse_args()
    if args.worker:
        args.sessions = int(args.sessions)
        worker_main(args)
    else:
        driver_main(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
