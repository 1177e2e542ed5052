"""pjsua2 (pjproject 2.15.1) as a warm transfer's caller or target, each in its own process:

    .venv/bin/python tests/integration/pjsua2_warm.py caller sip:pjwarm@127.0.0.1:5090 --tone 1000 --duration 8
    .venv/bin/python tests/integration/pjsua2_warm.py target --sip-port 5070 --tone 600 --key 1 --key-at 1.0

- caller: calls the URI and sends its tone. A REFER (RFC 3515) is followed by pjsua itself (its INVITE carries
  the Refer-To's Replaces header, RFC 3891) on a new call object; pjsua reports the outcome to the referrer by
  NOTIFY. The caller hangs up whatever call it is in `--duration` s after its first call was answered.
- target: answers every INVITE with 200 and sends its tone; `--key-at` s after the first answer it keys
  `--key` (RFC 4733). An INVITE with Replaces is answered by pjsua itself, which ends the replaced call (BYE);
  the new call gets a Call object here (`onCallReplaced`). It hangs up nothing: it waits for the far end's BYE
  and stops `--linger` s after its last call ended.

Every call is recorded; the last line on stdout is a JSON summary: `calls`, one per call object in order
({"remote": remote URI, "call_id", "confirmed", "end_status", "ended_by": "us" | "remote" | "replaced" (pjsua
ended it for the call that replaced it) | null, "frames_received", "tone_frames": {Hz: frames where that tone
dominates}}); "transfer": the Refer-To of the REFER the caller followed; "error" (null if none).
The tones are told apart with a Goertzel filter at `--listen` frequencies (the two peers' tones).

pjsua2 pitfalls (shared/reference/pjsua2.md §7) as in pjsua2_caller.py: `threadCnt=0` + `mainThreadOnly`, the
media ports' callbacks only copy bytes, every object kept referenced until the end and dropped before
`libDestroy()`.
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import math
import sys
import threading
import time
from typing import Any

import pjsua2 as pj
from pjsua2_caller import FRAME_BYTES, RATE, frame_bytes, free_udp_port, start_endpoint


def goertzel(samples: array.array[int], hz: float) -> float:
    k = 2 * math.cos(2 * math.pi * hz / RATE)
    s1 = s2 = 0.0
    for x in samples:
        s1, s2 = x + k * s1 - s2, s1
    return s1 * s1 + s2 * s2 - k * s1 * s2


class Tone(pj.AudioMediaPort):  # type: ignore[misc]
    """Sends a sine, records what it is given (clock thread: bytes copied only)."""

    def __init__(self, hz: float) -> None:
        super().__init__()
        n = RATE  # one second, looped (an integer number of periods for whole-Hz tones)
        self.source = array.array("h", (int(6000 * math.sin(2 * math.pi * hz * i / RATE)) for i in range(n)))
        self.source_bytes = self.source.tobytes()
        self.pos = 0
        self.rx: list[bytes] = []
        self.lock = threading.Lock()

    def onFrameRequested(self, frame: Any) -> None:
        try:
            chunk = self.source_bytes[self.pos : self.pos + FRAME_BYTES]
            self.pos = (self.pos + FRAME_BYTES) % len(self.source_bytes)
            frame.type = pj.PJMEDIA_FRAME_TYPE_AUDIO
            frame.buf = pj.ByteVector(chunk)
            frame.size = FRAME_BYTES
        except Exception as exc:
            print(f"onFrameRequested: {exc!r}", file=sys.stderr)

    def onFrameReceived(self, frame: Any) -> None:
        try:
            data = frame_bytes(frame) if frame.size else b""
            if len(data) == FRAME_BYTES:
                with self.lock:
                    if len(self.rx) < 3000:  # 60 s at most
                        self.rx.append(data)
        except Exception as exc:
            print(f"onFrameReceived: {exc!r}", file=sys.stderr)


class Peer(pj.Call):  # type: ignore[misc]
    def __init__(self, app: App, call_id: int = pj.PJSUA_INVALID_ID) -> None:
        super().__init__(app.acc, call_id)
        self.app = app
        app.calls.append(self)
        self.port: Tone | None = None
        self.remote = ""
        self.call_id = ""
        self.confirmed_at: float | None = None
        self.ended = False
        self.end_status: int | None = None
        self.hung_up = False
        self.replaced = False  # the target's: an INVITE with Replaces took this call's place
        self.errors: list[str] = []

    def onCallState(self, prm: Any) -> None:
        try:
            ci = self.getInfo()
            self.remote, self.call_id = ci.remoteUri, ci.callIdString
            if ci.state == pj.PJSIP_INV_STATE_CONFIRMED and self.confirmed_at is None:
                self.confirmed_at = time.monotonic()
            if ci.state == pj.PJSIP_INV_STATE_DISCONNECTED:
                self.ended, self.end_status = True, ci.lastStatusCode
                self.app.last_end = time.monotonic()
        except Exception as exc:
            self.errors.append(f"onCallState: {exc!r}")

    def onCallMediaState(self, prm: Any) -> None:
        try:
            ci = self.getInfo()
            for mi in ci.media:
                if mi.type == pj.PJMEDIA_TYPE_AUDIO and mi.status == pj.PJSUA_CALL_MEDIA_ACTIVE:
                    am = self.getAudioMedia(mi.index)
                    if self.port is None:
                        fmt = pj.MediaFormatAudio()
                        fmt.init(pj.PJMEDIA_FORMAT_PCM, RATE, 1, 20000, 16)
                        self.port = Tone(self.app.tone)
                        self.port.createPort(f"tone{len(self.app.calls)}", fmt)
                    am.startTransmit(self.port)
                    self.port.startTransmit(am)
        except Exception as exc:
            self.errors.append(f"onCallMediaState: {exc!r}")

    def onCallTransferRequest(self, prm: Any) -> None:  # the caller: follow the REFER on a new call object
        try:
            self.app.transfer["refer_to"] = prm.dstUri
            prm.newCall = Peer(self.app)
        except Exception as exc:
            self.errors.append(f"onCallTransferRequest: {exc!r}")

    def onCallReplaced(self, prm: Any) -> None:  # the target: the call that replaced this one
        try:
            self.replaced = True
            prm.newCall = Peer(self.app, prm.newCallId)
        except Exception as exc:
            self.errors.append(f"onCallReplaced: {exc!r}")

    def summary(self, listen: list[float]) -> dict[str, Any]:
        frames: list[bytes] = []
        if self.port is not None:
            with self.port.lock:
                frames = list(self.port.rx)
        tones = dict.fromkeys((f"{hz:g}" for hz in listen), 0)
        for data in frames:
            samples = array.array("h", data)
            if sum(x * x for x in samples) < len(samples) * 200**2:
                continue  # silence
            powers = {f"{hz:g}": goertzel(samples, hz) for hz in listen}
            best = max(powers, key=lambda h: powers[h])
            tones[best] += 1
        return {
            "remote": self.remote,
            "call_id": self.call_id,
            "confirmed": self.confirmed_at is not None,
            "end_status": self.end_status,
            "ended_by": (
                "us" if self.hung_up else "replaced" if self.replaced else "remote" if self.ended else None
            ),
            "frames_received": len(frames),
            "tone_frames": tones,
            "errors": self.errors,
        }


class Account(pj.Account):  # type: ignore[misc]
    def __init__(self, app: App) -> None:
        super().__init__()
        self.app = app

    def onIncomingCall(self, prm: Any) -> None:  # the target: answer every call
        try:
            call = Peer(self.app, prm.callId)
            answer = pj.CallOpParam()
            answer.statusCode = 200
            call.answer(answer)
        except Exception as exc:
            self.app.errors.append(f"onIncomingCall: {exc!r}")


class App:
    def __init__(self, tone: float) -> None:
        self.tone = tone
        self.calls: list[Peer] = []
        self.errors: list[str] = []
        self.transfer: dict[str, Any] = {}
        self.last_end: float | None = None
        self.acc: Account


def run(ep: Any, app: App, args: argparse.Namespace, summary: dict[str, Any]) -> None:
    """The calls, until the role is done; every Call it touched is only in `app.calls` when it returns."""
    deadline = time.monotonic() + args.timeout
    keyed = False
    if args.role == "caller":
        Peer(app).makeCall(args.uri, pj.CallOpParam(True))
    while time.monotonic() < deadline:
        ep.libHandleEvents(10)
        first = app.calls[0] if app.calls else None
        if first is None or first.confirmed_at is None:
            continue
        t = time.monotonic() - first.confirmed_at
        live = [c for c in app.calls if not c.ended]
        if args.role == "target":
            if not keyed and t >= args.key_at:
                keyed = True
                first.dialDtmf(args.key)
            if not live and app.last_end is not None and time.monotonic() - app.last_end >= args.linger:
                break
        elif t >= args.duration:
            for call in live:
                if call.confirmed_at is not None and not call.hung_up:
                    call.hung_up = True
                    call.hangup(pj.CallOpParam(True))
            if not live:
                break
    else:
        summary["error"] = f"timed out after {args.timeout:g} s"
    end = time.monotonic() + 2.0
    while time.monotonic() < end and any(not c.ended for c in app.calls):
        ep.libHandleEvents(10)
    summary["calls"] = [c.summary(args.listen) for c in app.calls]
    summary["transfer"] = app.transfer
    summary["errors"] = app.errors


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("role", choices=("caller", "target"))
    parser.add_argument("uri", nargs="?", default="", help="the caller's: the SIP URI to call")
    parser.add_argument("--sip-port", type=int, default=0)
    parser.add_argument("--tone", type=float, default=1000.0, help="the sine this peer sends (Hz)")
    parser.add_argument("--listen", type=float, nargs="*", default=[600.0, 1000.0], help="tones told apart")
    parser.add_argument(
        "--duration", type=float, default=8.0, help="caller: hang up this long after the answer"
    )
    parser.add_argument("--key", default="1", help="target: the digit keyed after its first answer")
    parser.add_argument("--key-at", type=float, default=1.0)
    parser.add_argument(
        "--linger", type=float, default=1.0, help="target: stop this long after its last call"
    )
    parser.add_argument("--timeout", type=float, default=25.0)
    args = parser.parse_args()
    if args.role == "caller" and not args.uri:
        parser.error("the caller needs a URI")
    app = App(args.tone)
    summary: dict[str, Any] = {"role": args.role, "error": None}
    ep, sip_port = start_endpoint(
        f"pjsua2-warm-{args.role} (parlora-bridge tests)", args.sip_port, "127.0.0.1"
    )
    acfg = pj.AccountConfig()
    acfg.idUri = f"sip:{args.role}@127.0.0.1:{sip_port}"
    acfg.mediaConfig.transportConfig.port = free_udp_port() & ~1
    acfg.mediaConfig.transportConfig.boundAddress = "127.0.0.1"
    app.acc = Account(app)
    app.acc.create(acfg)
    print(json.dumps({"listening": sip_port}), flush=True)
    try:
        run(ep, app, args, summary)
    except pj.Error as exc:
        summary["error"] = f"pjsua2: {exc.info()}"
    finally:
        while app.calls:  # (no loop variable left holding a Call past libDestroy)
            app.calls.pop().port = None
        sys.last_type = sys.last_value = sys.last_traceback = None
        gc.collect()
        for _ in range(5):
            ep.libHandleEvents(10)
        app.acc.shutdown()
        del app.acc
        gc.collect()
        ep.libDestroy()
    print(json.dumps(summary), flush=True)
    return 0 if summary["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
