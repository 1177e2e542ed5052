"""Micro-benchmark of the native engine's media tick: process CPU µs per call and 20 ms tick, N calls.

    .venv/bin/python tests/bench/tick_micro.py [--calls 100 300] [--ticks 500] [--rounds 3]
    PARLORA_PURE_MEDIA=1 .venv/bin/python tests/bench/tick_micro.py      # the pure path

N calls as the native engine runs them (sip/native/leg.py `_CallMedia` over a real `rtp.endpoint.RtpSocketPair`
on loopback, served by one `rtp.clock.MediaClockShell` on virtual time, one phase): before each tick every call
gets one caller datagram (a loopback `sendto` from a second socket) and one assistant frame in its Playout;
then the clock's `run_due` reads the datagrams, hands each caller frame on (to nowhere) and sends each call's
RTP to a sink socket on loopback, recording it in the carrier ledger. Only `run_due` is timed, with
`time.process_time_ns` (the CPU time of this process: the other processes of a shared machine do not count,
the kernel's work for our system calls does); the feeding and the sink's draining are outside it. Best of
`--rounds` runs of `--ticks` ticks, the calls sending their RTP through the clock's send batch
(rtp.endpoint `SendBatch`) and each its own (`sendto` per call, as before the batch) in alternate ticks of
each run (a tree without the batch: per call only).
`--no-inbound` leaves the caller side out (the send side alone).
The media path is the one rtp.speedups chose at import (PARLORA_PURE_MEDIA=1: the pure one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rtp.clock import MediaClockShell
from rtp.endpoint import PortPool, RtpSocketPair
from rtp.g711 import ulaw_encode
from rtp.ledger import CarrierLedger
from rtp.packet import build
from rtp.playout import OutboundFrame, Playout
from rtp.speedups import MEDIA_PATH
from rtp.stream import PCMU, RtpStream, StreamConfig
from sip.core.offer_answer import NegotiatedMedia
from sip.native.leg import _CallMedia

HOST = "127.0.0.1"


class _Leg:
    """What the media shell uses of its NativeLeg; caller frames go nowhere."""

    def __init__(self, sockets: RtpSocketPair, now: list[int]) -> None:
        self.call = "bench"
        self.sockets = sockets
        self.playout = Playout(CarrierLedger())
        self.agent = SimpleNamespace(clock=lambda: now[0], one_way_audio=Counter(), limit_hangups=Counter())
        self.identity = SimpleNamespace(call_id="bench")

    def _post(self, event: object) -> None:
        pass


def run(calls: int, ticks: int, inbound: bool, modes: tuple[bool, ...]) -> dict[bool, tuple[float, float]]:
    """CPU µs per call and tick of `run_due` over `ticks` ticks of `calls` calls, for each mode of `modes`
    (True: each call's RTP through the clock's send batch; False: each call sends its own, as before the
    batch), the modes taking turns tick by tick: the same sockets, caches and load for each. Also the user
    part of it (getrusage: the rest is the kernel's, the system calls')."""
    loop = asyncio.new_event_loop()
    now = [10**12]
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind((HOST, 0))
    sink.setblocking(False)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    feeder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    feeder.bind((HOST, 0))
    to = sink.getsockname()
    shell = MediaClockShell(loop, lambda: now[0], phases=1, watch_gc=False)
    pool = PortPool(30000, 30000 + 4 * calls + 400)
    legs: list[tuple[_Leg, _CallMedia]] = []
    for k in range(calls):
        pair = RtpSocketPair.open(loop, HOST, pool, lambda *a: None, lambda *a: None, lambda: now[0])
        leg = _Leg(pair, now)
        negotiated = NegotiatedMedia("PCMU", PCMU, 101, to[0], to[1], "sendrecv", "sendrecv")
        stream = RtpStream(
            StreamConfig(ssrc=k, initial_seq=1, initial_timestamp=0, cname="b", remote=to), rand=lambda: 0.5
        )
        media = _CallMedia(leg, stream, negotiated)  # type: ignore[arg-type]
        media.set_limits(now[0], 3600.0, 30.0, 7200.0)
        shell.add(media)
        legs.append((leg, media))
    pcmu = ulaw_encode(bytes(320))
    frames = [OutboundFrame(bytes(320), 1, "item", 20 * t, pcmu) for t in range(ticks)]
    ports = [(HOST, leg.sockets.port) for leg, _ in legs]
    payload = bytes(range(160))
    spent = dict.fromkeys(modes, 0)
    user = dict.fromkeys(modes, 0.0)
    core = shell.core
    assert core is not None
    for t in range(ticks):
        batched = modes[t % len(modes)]
        if hasattr(_CallMedia, "join_batch"):
            for _, media in legs:
                media.join_batch(shell.sends if batched else None)
        if inbound:
            dgram = build(0, False, t & 0xFFFF, 160 * t, 0xA, payload)
            for port in ports:
                feeder.sendto(dgram, port)
        for leg, _ in legs:
            leg.playout.enqueue((frames[t],))
        now[0] = core.next_deadline()
        u0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        c0 = time.process_time_ns()
        shell.run_due(now[0])
        spent[batched] += time.process_time_ns() - c0
        user[batched] += resource.getrusage(resource.RUSAGE_SELF).ru_utime - u0
        try:
            while True:
                sink.recv(2048)
        except BlockingIOError:
            pass
    sent = sum(media.frames_out for _, media in legs)
    assert sent >= calls * (ticks - 2), (sent, calls * ticks)
    for leg, media in legs:
        shell.remove(media)
        leg.sockets.close()
    sink.close()
    feeder.close()
    loop.close()
    per = calls * (ticks // len(modes))
    return {mode: (ns / 1000 / per, user[mode] * 1e6 / per) for mode, ns in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, nargs="+", default=[100, 300])
    ap.add_argument("--ticks", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-inbound", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    names = {False: "per call", True: "batched"}
    modes = (False, True) if hasattr(_CallMedia, "join_batch") else (False,)
    out: dict[str, dict[int, tuple[float, float]]] = {names[mode]: {} for mode in modes}
    for _ in range(args.rounds):
        for n in args.calls:
            for mode, took in run(n, args.ticks, not args.no_inbound, modes).items():
                out[names[mode]][n] = min(out[names[mode]].get(n, (float("inf"), 0.0)), took)
    if args.json:
        print(json.dumps({"path": MEDIA_PATH, "us_per_call_tick": out}))
        return
    side = "send side only" if args.no_inbound else "read + slot + send"
    for mode, by in out.items():
        for n, (us, user) in by.items():
            print(
                f"{MEDIA_PATH:>8} {mode:>8} {n:4d} calls ({side}): {us:6.2f} µs CPU per call and tick"
                f" (user {user:5.2f})"
            )


if __name__ == "__main__":
    main()
