"""Micro-benchmark of the native engine's per-frame media cores (rtp/): ns per operation, best of 5 runs.

    .venv/bin/python tests/bench/rtp_micro.py [--n 100000]

What runs 50 times a second per call at 300 calls (15,000 times a second per direction) is measured here:
RTP parse, RTP pack_into, a jitter-buffer push + pop (with G.711 decode), the stream's whole inbound path
(receive + pull_frame; also with a learned source, rtp/latch.py) and outbound path (next_packet), the source
latch's per-packet check, G.722's and Opus's decode and encode per frame (rtp/g722.py, rtp/opus.py), the receiver statistics update, and one call's whole media slot as the native engine
runs it (sip/native/leg.py's media shell over the rtp cores: a caller datagram in, the slot's frame handed on, an
assistant frame taken from the Playout, sent, and recorded in the carrier ledger; the socket is a stand-in). PLC concealment
runs only on loss and is measured per concealed frame. Figures are CPU time of this process; run on an idle
machine. `--json` prints one JSON object instead of the table; `--wall` times with `time.perf_counter_ns`
instead of the process's CPU time. The media path (rtp.speedups: the compiled twins where built) is the one the
import chose; PARLORA_PURE_MEDIA=1 measures the pure one (tests/bench/README.md, "Compiled media path").
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rtp.g711 import ulaw_encode
from rtp.g722 import G722Decoder, G722Encoder
from rtp.jitter import JitterBuffer, fast_ulaw_decode
from rtp.latch import SourceLatch
from rtp.opus import OpusDecoder, OpusEncoder
from rtp.packet import build
from rtp.plc import Concealer
from rtp.rtcp import ReceiverStats
from rtp.speedups import MEDIA_PATH, pack_into, parse
from rtp.stream import RtpStream, StreamConfig
from rtp.units import NS_PER_MS as MS

ADDR = ("127.0.0.1", 40000)
CLOCK = time.process_time_ns  # --wall: time.perf_counter_ns


def best(fn: Callable[[int], None], n: int, runs: int = 5) -> float:
    """ns per iteration of `fn(n)` (which loops n times), best of `runs`."""
    out = math.inf
    for _ in range(runs):
        t0 = CLOCK()
        fn(n)
        out = min(out, (CLOCK() - t0) / n)
    return out


def speech(k: int) -> bytes:
    s = [int(6000 * math.sin(2 * math.pi * 180 * (160 * k + i) / 8000)) for i in range(160)]
    return ulaw_encode(struct.pack("<160h", *s))


class _Sockets:
    """The send side of rtp.endpoint.RtpSocketPair: every send succeeds at once."""

    rtp_fileno = -1
    on_rtp: object = None

    def send_rtp(self, data: object, destination: object) -> bool:
        return True

    def send_rtcp(self, data: object, destination: object) -> bool:
        return True


class _Leg:
    """What the native engine's media shell uses of its NativeLeg; caller frames go nowhere."""

    def __init__(self) -> None:
        from collections import Counter

        from rtp.ledger import CarrierLedger
        from rtp.playout import Playout

        self.call = "bench"
        self.sockets = _Sockets()
        self.playout = Playout(CarrierLedger())
        self.now = 0
        self.agent = SimpleNamespace(clock=lambda: self.now, one_way_audio=Counter(), limit_hangups=Counter())

    def _post(self, event: object) -> None:
        pass

    def _stream_timer(self, now: int) -> None:
        pass


def call_slot_loop(inbound: list[bytes]) -> Callable[[int], None]:
    """One call's media slot through the native engine's shell (sip/native/leg.py `_CallMedia`), with an assistant
    frame queued each slot (the Playout's enqueue is counted too) and a caller datagram read before it."""
    from rtp.playout import OutboundFrame
    from rtp.stream import PCMU
    from sip.core.offer_answer import NegotiatedMedia
    from sip.native.leg import _CallMedia

    frames = [OutboundFrame(bytes(320), 1, "item", 20 * k, ulaw_encode(bytes(320))) for k in range(1000)]

    def loop(count: int) -> None:
        leg = _Leg()
        negotiated = NegotiatedMedia("PCMU", PCMU, 101, ADDR[0], ADDR[1], "sendrecv", "sendrecv")
        stream = RtpStream(
            StreamConfig(ssrc=0xB, initial_seq=1, initial_timestamp=0, cname="b", remote=ADDR),
            rand=lambda: 0.5,
        )
        media = _CallMedia(leg, stream, negotiated)  # type: ignore[arg-type]
        media.set_limits(0, 3600.0, 30.0, 7200.0)
        enqueue = leg.playout.enqueue
        for i in range(count):
            now = i * 20 * MS
            leg.now = now
            media.on_rtp(inbound[i], ADDR, now)
            enqueue((frames[i % 1000],))
            media.on_slots(now + 10 * MS, 1, 0)

    return loop


def side_by_side(n: int, rounds: int) -> dict[str, dict[str, float]]:
    """The functions rtp.speedups replaces, and the paths they sit on, on each media path in one process:
    the paths alternate round by round (`rounds` of n iterations each) and the best round of each counts,
    so that load from other processes (a shared machine) weighs on both alike."""
    from tests.support.media_paths import IMPLS, use

    payloads = [speech(k) for k in range(50)]
    dgrams = [build(0, False, k & 0xFFFF, 160 * k, 0xA, payloads[k % 50]) for k in range(1000)]
    inbound = [build(0, False, k & 0xFFFF, (160 * k) & 0xFFFFFFFF, 0xA, payloads[k % 50]) for k in range(n)]
    config = StreamConfig(ssrc=0xB, initial_seq=1, initial_timestamp=0, cname="b", remote=ADDR)

    def rows() -> dict[str, Callable[[int], None]]:
        import rtp.stream

        parse_, pack_, decode = rtp.stream.parse, rtp.stream.pack_into, rtp.stream.fast_ulaw_decode
        buf, payload = bytearray(1212), payloads[0]

        def parse_loop(count: int) -> None:
            for i in range(count):
                parse_(dgrams[i % 1000])

        def pack_loop(count: int) -> None:
            for i in range(count):
                pack_(buf, 0, False, i, 160 * i, 0xA, payload)

        def decode_loop(count: int) -> None:
            for i in range(count):
                decode(payloads[i % 50])

        def jitter_loop(count: int) -> None:
            jb = JitterBuffer()
            for i in range(count):
                jb.push(i & 0xFFFF, (160 * i) & 0xFFFFFFFF, 0xA, payloads[i % 50], i * 20 * MS)
                jb.pop(i * 20 * MS + 10 * MS)

        def inbound_loop(count: int) -> None:
            s = RtpStream(config, rand=lambda: 0.5)
            for i in range(count):
                s.receive(inbound[i], ADDR, i * 20 * MS)
                s.pull_frame(i * 20 * MS + 10 * MS)

        def outbound_loop(count: int) -> None:
            s = RtpStream(config, rand=lambda: 0.5)
            for i in range(count):
                s.next_packet(payload, i * 20 * MS)

        def read_loop(count: int) -> None:  # a loopback sendto, then the media clock's read of it
            sink: list[object] = []
            pair.on_rtp = lambda data, source, arrival: sink.append(data)
            target = ("127.0.0.1", pair.port)
            read, wall = pair.read_rtp, time.time_ns()
            for i in range(count):
                sender.sendto(dgrams[i % 1000], target)
                read(i, wall)
                sink.clear()

        return {
            "rtp parse (per packet)": parse_loop,
            "rtp pack_into (per packet)": pack_loop,
            "G.711 frame decode (per frame)": decode_loop,
            "jitter push + pop (incl. decode)": jitter_loop,
            "stream inbound: receive + pull_frame": inbound_loop,
            "stream outbound: next_packet": outbound_loop,
            "call media slot (per call and slot)": call_slot_loop(inbound),
            "sendto + read_rtp (per datagram)": read_loop,
        }

    import asyncio
    import socket

    from rtp.endpoint import PortPool, RtpSocketPair

    loop = asyncio.new_event_loop()
    pair = RtpSocketPair.open(loop, "127.0.0.1", PortPool(47000, 47400), print, print, time.monotonic_ns)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    out: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for name, impl in IMPLS.items():
            pair._recv = impl.recv_stamped  # rtp.endpoint: the compiled read, or None for the pure one
            with use(impl):
                for row, fn in rows().items():
                    took = best(fn, n, runs=1)
                    out.setdefault(row, {})[name] = min(out.get(row, {}).get(name, math.inf), took)
    sender.close()
    pair.close()
    loop.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--wall", action="store_true")
    ap.add_argument("--paths", type=int, default=0, metavar="ROUNDS", help="pure against compiled, in rounds")
    args = ap.parse_args()
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter_ns
    if args.paths:
        table = side_by_side(args.n, args.paths)
        if args.json:
            print(json.dumps(table, indent=1))
            return
        clock = "wall time" if args.wall else "process CPU time"
        print(
            f"python {sys.version.split()[0]}, n={args.n}, best of {args.paths} alternating rounds ({clock}), ns"
        )
        print(f"  {'':<40} {'pure':>9} {'compiled':>9} {'saved':>9}")
        for row, by in table.items():
            pure, comp = by.get("pure", math.nan), by.get("compiled", math.nan)
            print(f"  {row:<40} {pure:9.0f} {comp:9.0f} {pure - comp:9.0f}")
        return
    n, as_json = args.n, args.json
    payloads = [speech(k) for k in range(50)]
    dgrams = [build(0, False, k & 0xFFFF, 160 * k, 0xA, payloads[k % 50]) for k in range(1000)]
    results: dict[str, float] = {}

    def parse_loop(count: int) -> None:
        for i in range(count):
            parse(dgrams[i % 1000])

    results["rtp parse (12-byte header, 160 B payload)"] = best(parse_loop, n)

    buf = bytearray(1212)
    payload = payloads[0]

    def build_loop(count: int) -> None:
        for i in range(count):
            pack_into(buf, 0, False, i, 160 * i, 0xA, payload)

    results["rtp pack_into (reused buffer)"] = best(build_loop, n)

    def jitter_loop(count: int) -> None:
        jb = JitterBuffer()
        for i in range(count):
            jb.push(i & 0xFFFF, (160 * i) & 0xFFFFFFFF, 0xA, payloads[i % 50], i * 20 * MS)
            jb.pop(i * 20 * MS + 10 * MS)

    results["jitter push + pop (incl. G.711 decode)"] = best(jitter_loop, n)

    def stats_loop(count: int) -> None:
        st = ReceiverStats()
        for i in range(count):
            st.update(i & 0xFFFF, (160 * i) & 0xFFFFFFFF, i * 20 * MS, 160)

    results["rtcp receiver stats update (A.1 + A.8)"] = best(stats_loop, n)

    def cfg() -> StreamConfig:
        return StreamConfig(ssrc=0xB, initial_seq=1, initial_timestamp=0, cname="b", remote=ADDR)

    # one datagram per frame, sequence and timestamp always moving forward (no resyncs)
    inbound = [build(0, False, k & 0xFFFF, (160 * k) & 0xFFFFFFFF, 0xA, payloads[k % 50]) for k in range(n)]

    def inbound_loop_fresh(count: int) -> None:
        s = RtpStream(cfg(), rand=lambda: 0.5)
        for i in range(count):
            s.receive(inbound[i], ADDR, i * 20 * MS)
            s.pull_frame(i * 20 * MS + 10 * MS)

    results["stream inbound: receive + pull_frame"] = best(inbound_loop_fresh, n)

    def latch_loop(count: int) -> None:
        latch = SourceLatch(ADDR)
        latch.accept(ADDR, 0xA, 0)  # the signalled source: latched at once
        source = (ADDR[0], ADDR[1])  # an equal tuple, not the same object (as recvmsg gives it)
        for i in range(count):
            latch.accept(source, 0xA, i)

    results["latch accept, the latched source (per packet)"] = best(latch_loop, n)

    def inbound_loop_learned(count: int) -> None:
        # the SDP names another address than the packets come from (a softphone's LAN address, RTP from
        # loopback): the source is learned after 4 packets, then the same path (without learning: all dropped)
        s = RtpStream(replace(cfg(), remote=("192.0.2.2", 40000)), rand=lambda: 0.5)
        for i in range(count):
            s.receive(inbound[i], ADDR, i * 20 * MS)
            s.pull_frame(i * 20 * MS + 10 * MS)

    results["stream inbound, source learned (SDP names another address)"] = best(inbound_loop_learned, n)

    def outbound_loop(count: int) -> None:
        s = RtpStream(cfg(), rand=lambda: 0.5)
        for i in range(count):
            s.next_packet(payload, i * 20 * MS)

    results["stream outbound: next_packet"] = best(outbound_loop, n)

    results["call media slot: datagram in, frame on, frame out + ledger"] = best(call_slot_loop(inbound), n)

    def conceal_loop(count: int) -> None:
        c = Concealer()
        pcm = [fast_ulaw_decode(p) for p in payloads[:4]]
        for i in range(count):
            c.good(pcm[i % 4])
            c.good(pcm[(i + 1) % 4])
            c.good(pcm[(i + 2) % 4])
            c.conceal()

    results["plc: one isolated loss (pitch search + synth + cross-fade in)"] = best(
        conceal_loop, max(1, n // 20)
    )

    def g722_decode_loop(count: int) -> None:
        decoder = G722Decoder()
        for i in range(count):
            decoder(wide[i % 4])  # four distinct objects: never the decoder's repeat shortcut

    def g722_encode_loop(count: int) -> None:
        encoder, pcm = G722Encoder(), [fast_ulaw_decode(p) for p in payloads[:4]]
        for i in range(count):
            encoder(pcm[i % 4])

    def opus_decode_loop(count: int) -> None:
        decoder = OpusDecoder()
        for i in range(count):
            decoder(opus[i % 4])

    def opus_encode_loop(count: int) -> None:
        encoder, pcm = OpusEncoder(), [fast_ulaw_decode(p) for p in payloads[:4]]
        for i in range(count):
            encoder(pcm[i % 4])

    opus_encoder = OpusEncoder()
    opus = [i.to_bytes(2, "big") + opus_encoder(fast_ulaw_decode(p)) for i, p in enumerate(payloads[:4])]
    results["opus (rtp/opus.py): decode to 8 kHz, per frame"] = best(opus_decode_loop, max(1, n // 20))
    results["opus (rtp/opus.py): encode 8 kHz, per frame"] = best(opus_encode_loop, max(1, n // 20))
    wide = [G722Encoder()(fast_ulaw_decode(p)) for p in payloads[:4]]
    results["g722 (rtp/g722.py): decode + 16 -> 8 kHz, per frame"] = best(g722_decode_loop, max(1, n // 20))
    results["g722 (rtp/g722.py): 8 -> 16 kHz + encode, per frame"] = best(g722_encode_loop, max(1, n // 20))

    per_call = (
        results["stream inbound: receive + pull_frame"] + results["stream outbound: next_packet"]
    ) * 50
    results["=> per call, both directions, % of one core"] = per_call / 1e9 * 100
    if as_json:
        print(json.dumps({"media_path": MEDIA_PATH, **results}, indent=1))
        return
    clock = "wall time" if args.wall else "process CPU time"
    print(f"python {sys.version.split()[0]}, media path {MEDIA_PATH}, n={n}, best of 5 ({clock})")
    for name, value in results.items():
        unit = "%" if name.startswith("=>") else "ns"
        print(f"  {name:<66} {value:10.4f} {unit}" if unit == "%" else f"  {name:<66} {value:10.0f} {unit}")


if __name__ == "__main__":
    main()
