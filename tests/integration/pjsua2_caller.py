"""One call placed by pjsua2 (pjproject 2.15.1, an independent, mature SIP stack) as the *caller*.

    .venv/bin/python tests/integration/pjsua2_caller.py sip:bridge@127.0.0.1:5090 --play utterance.wav \\
        --record heard.wav --duration 8 [--dtmf 12# --dtmf-at 1.0] [--hold-at 2 --hold-for 1.5] [--wait-bye]

It listens for SIP on a loopback UDP port (`--sip-port`, 0: any free one), calls the URI offering PCMU and
telephone-event (RFC 4733), and once the call is confirmed, on its own timeline (seconds since the 200 was
ACKed): sends the WAV (8 kHz mono s16; or `--tone HZ`) from a Python media port, records every 20 ms tick of
what it hears to `--record` (silence where a tick brought no audio, so the file is on wall-clock time), dials
`--dtmf` digits as RFC 4733 events at `--dtmf-at`, puts the call on hold by re-INVITE (sendonly) at
`--hold-at` and takes it off hold (sendrecv) `--hold-for` later, and hangs up (BYE) at `--duration`; with
`--wait-bye` it does not hang up but waits until `--duration` for the far end's BYE. Everything is bounded by
`--timeout`.

The last line on stdout is a JSON summary:
  invite_status (the final response to the INVITE), answered, confirmed, call_s (confirmed -> disconnected),
  hangup_by ("caller" | "remote" | null), disconnect_status / disconnect_reason, bye_status (the response to
  our BYE), hold / resume ({"status": re-INVITE final response, "media": media status after it, "at_s"}),
  dtmf_sent, frames_sent / frames_received / frames_received_audio, sent_t0_ns / received_t0_ns (monotonic
  time of the first sent and received tick: the offset between the played file and the recording),
  client_transactions ([method, final status] of every request we sent), error (null if none).
Exit status 0 when the call was answered and ended as asked, 1 otherwise, 2 on bad arguments.

pjsua2 pitfalls (shared/reference/pjsua2.md §7) respected here: `threadCnt=0` + `mainThreadOnly`, so every
SIP callback runs on the main thread, which polls `libHandleEvents`; the media port's callbacks run on
pjmedia's clock thread and only copy bytes (a ctypes read of the frame, no pjsua2 call); the Call and the port
are kept referenced until the end; `getInfo()` is kept in a local before touching `.media`; callbacks catch
their own exceptions; every pjsua2 object is dropped and `sys.last_*` cleared before `libDestroy()`.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import gc
import json
import math
import socket
import sys
import threading
import time
import wave
from typing import Any

import pjsua2 as pj

RATE = 8000
FRAME_BYTES = 320  # 20 ms of s16le at 8 kHz
TICK_NS = 20_000_000
_VP = ctypes.POINTER(ctypes.c_void_p)
MEDIA_STATUS = {
    pj.PJSUA_CALL_MEDIA_NONE: "none",
    pj.PJSUA_CALL_MEDIA_ACTIVE: "active",
    pj.PJSUA_CALL_MEDIA_LOCAL_HOLD: "local_hold",
    pj.PJSUA_CALL_MEDIA_REMOTE_HOLD: "remote_hold",
    pj.PJSUA_CALL_MEDIA_ERROR: "error",
}


def frame_bytes(frame: Any) -> bytes:
    """The frame's buffer, read through the std::vector's begin/end pointers (µs, not the 130 µs of bytes())."""
    begin, end = ctypes.cast(int(frame.buf.this), _VP)[0:2]
    return ctypes.string_at(begin, end - begin) if begin else b""


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Port(pj.AudioMediaPort):  # type: ignore[misc]
    """Sends `source` (PCM16 bytes) one frame per tick, then silence; records every tick it is given."""

    def __init__(self, source: bytes) -> None:
        super().__init__()
        self.source = source
        self.pos = 0
        self.frames_sent = 0
        self.sent_t0_ns: int | None = None
        self.rx: list[bytes] = []
        self.frames_audio = 0
        self.received_t0_ns: int | None = None
        self._last_rx_ns = 0
        self.lock = threading.Lock()

    def onFrameRequested(self, frame: Any) -> None:  # pjsua2's name; clock thread
        try:
            if self.sent_t0_ns is None:
                self.sent_t0_ns = time.monotonic_ns()
            chunk = self.source[self.pos : self.pos + FRAME_BYTES]
            self.pos += FRAME_BYTES
            if len(chunk) < FRAME_BYTES:
                chunk = chunk + bytes(FRAME_BYTES - len(chunk))
            frame.type = pj.PJMEDIA_FRAME_TYPE_AUDIO
            frame.buf = pj.ByteVector(chunk)
            frame.size = FRAME_BYTES
            self.frames_sent += 1
        except Exception as exc:  # pitfall 4: never let it reach SWIG
            print(f"onFrameRequested: {exc!r}", file=sys.stderr)

    def onFrameReceived(self, frame: Any) -> None:  # clock thread
        try:
            now = time.monotonic_ns()
            data = frame_bytes(frame) if frame.size else b""
            with self.lock:
                if self.received_t0_ns is None:
                    self.received_t0_ns = now
                elif (
                    now - self._last_rx_ns > 3 * TICK_NS // 2
                ):  # ticks with no callback: keep wall-clock time
                    missed = min(500, round((now - self._last_rx_ns) / TICK_NS) - 1)
                    self.rx.extend([bytes(FRAME_BYTES)] * missed)
                self._last_rx_ns = now
                if len(data) == FRAME_BYTES:
                    self.rx.append(data)
                    self.frames_audio += 1
                else:  # during a hold pjmedia hands size-0 frames (pitfall 10)
                    self.rx.append(bytes(FRAME_BYTES))
        except Exception as exc:
            print(f"onFrameReceived: {exc!r}", file=sys.stderr)


class Caller(pj.Call):  # type: ignore[misc]
    def __init__(self, acc: Any, source: bytes) -> None:
        super().__init__(acc)
        self.source = source
        self.port: Port | None = None
        self.state = pj.PJSIP_INV_STATE_NULL
        self.invite_status: int | None = None
        self.confirmed_ns: int | None = None
        self.disconnected_ns: int | None = None
        self.disconnect_status: int | None = None
        self.disconnect_reason: str | None = None
        self.media_status = "none"
        self.media_changes: list[str] = []
        self.tsx: list[tuple[str, int]] = []
        self.errors: list[str] = []

    def onCallState(self, prm: Any) -> None:  # main thread
        try:
            ci = self.getInfo()
            self.state = ci.state
            if (
                ci.state in (pj.PJSIP_INV_STATE_CONNECTING, pj.PJSIP_INV_STATE_CONFIRMED)
                and self.invite_status is None
            ):
                self.invite_status = ci.lastStatusCode
            if ci.state == pj.PJSIP_INV_STATE_CONFIRMED and self.confirmed_ns is None:
                self.confirmed_ns = time.monotonic_ns()
            if ci.state == pj.PJSIP_INV_STATE_DISCONNECTED:
                self.disconnected_ns = time.monotonic_ns()
                self.disconnect_status = ci.lastStatusCode
                self.disconnect_reason = ci.lastReason
                if self.invite_status is None:
                    self.invite_status = ci.lastStatusCode
        except Exception as exc:
            self.errors.append(f"onCallState: {exc!r}")

    def onCallTsxState(self, prm: Any) -> None:  # main thread
        try:
            event = prm.e.body.tsxState
            tsx = event.tsx
            final = (pj.PJSIP_TSX_STATE_COMPLETED, pj.PJSIP_TSX_STATE_TERMINATED)
            # once per transaction: when it first reaches Completed or Terminated with a final response
            if (
                tsx.role == pj.PJSIP_ROLE_UAC
                and tsx.statusCode >= 200
                and tsx.state in final
                and (event.prevState not in final)
            ):
                self.tsx.append((str(tsx.method), int(tsx.statusCode)))
        except Exception as exc:
            self.errors.append(f"onCallTsxState: {exc!r}")

    def onCallMediaState(self, prm: Any) -> None:  # main thread
        try:
            ci = self.getInfo()  # keep `ci`: getInfo().media would dangle (pitfall 5)
            for mi in ci.media:
                if mi.type != pj.PJMEDIA_TYPE_AUDIO:
                    continue
                self.media_status = MEDIA_STATUS.get(mi.status, str(mi.status))
                self.media_changes.append(self.media_status)
                if mi.status in (
                    pj.PJSUA_CALL_MEDIA_ACTIVE,
                    pj.PJSUA_CALL_MEDIA_LOCAL_HOLD,
                    pj.PJSUA_CALL_MEDIA_REMOTE_HOLD,
                ):
                    am = self.getAudioMedia(mi.index)
                    if self.port is None:
                        fmt = pj.MediaFormatAudio()
                        fmt.init(pj.PJMEDIA_FORMAT_PCM, RATE, 1, 20000, 16)
                        self.port = Port(self.source)
                        self.port.createPort("caller", fmt)
                    am.startTransmit(self.port)  # idempotent: re-done after every re-INVITE (pitfall 10)
                    self.port.startTransmit(am)
        except Exception as exc:
            self.errors.append(f"onCallMediaState: {exc!r}")


def load_source(args: argparse.Namespace) -> bytes:
    if args.play:
        with wave.open(args.play, "rb") as w:
            if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (RATE, 1, 2):
                raise SystemExit(f"{args.play}: need 8 kHz mono 16-bit PCM")
            return w.readframes(w.getnframes())
    if args.tone:
        n = int(RATE * args.tone_ms / 1000)
        return array.array(
            "h", (int(8000 * math.sin(2 * math.pi * args.tone * i / RATE)) for i in range(n))
        ).tobytes()
    return b""


def start_endpoint(user_agent: str, sip_port: int, bind: str, log_level: int = 1) -> tuple[Any, int]:
    """A started Endpoint for one test peer: every callback on the main thread (pitfall 1), no sound device,
    PCMU/8000 only at 20 ms, one UDP transport on `bind`:`sip_port` (0: a free one). Returns it and the port."""
    ep = pj.Endpoint()
    ep.libCreate()
    cfg = pj.EpConfig()
    cfg.uaConfig.threadCnt = 0
    cfg.uaConfig.mainThreadOnly = True
    cfg.uaConfig.maxCalls = 4
    cfg.uaConfig.userAgent = user_agent
    cfg.logConfig.consoleLevel = log_level
    cfg.logConfig.level = log_level
    med = cfg.medConfig
    med.clockRate = med.sndClockRate = RATE
    med.audioFramePtime = 20
    med.ptime = 20
    med.noVad = True
    med.ecTailLen = 0
    ep.libInit(cfg)
    tcfg = pj.TransportConfig()
    tcfg.port = sip_port or free_udp_port()
    tcfg.boundAddress = bind
    ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, tcfg)
    ep.libStart()
    ep.audDevManager().setNullDev()
    for codec in ep.codecEnum2():
        ep.codecSetPriority(codec.codecId, 0)
    ep.codecSetPriority("PCMU/8000", 250)
    port: int = tcfg.port
    return ep, port


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("uri", help="SIP URI to call, e.g. sip:bridge@127.0.0.1:5090")
    parser.add_argument("--sip-port", type=int, default=0, help="local UDP SIP port (0: a free one)")
    parser.add_argument("--rtp-port", type=int, default=0, help="first local RTP port (0: a free one)")
    parser.add_argument("--play", help="8 kHz mono 16-bit WAV to send")
    parser.add_argument("--tone", type=float, default=0.0, help="send a sine of this frequency instead")
    parser.add_argument("--tone-ms", type=int, default=1000)
    parser.add_argument("--record", help="WAV to record what the caller hears")
    parser.add_argument("--duration", type=float, default=5.0, help="hang up this long after the answer (s)")
    parser.add_argument("--wait-bye", action="store_true", help="never hang up: wait for the far end's BYE")
    parser.add_argument("--dtmf", default="", help="digits to dial as RFC 4733 events")
    parser.add_argument("--dtmf-at", type=float, default=0.5)
    parser.add_argument("--hold-at", type=float, default=None, help="re-INVITE sendonly at this time (s)")
    parser.add_argument("--hold-for", type=float, default=1.0, help="then sendrecv this much later (s)")
    parser.add_argument("--timeout", type=float, default=30.0, help="bound on the whole run (s)")
    parser.add_argument("--log-level", type=int, default=1, help="pjsua console log level")
    parser.add_argument("--bind", default="127.0.0.1", help="local address for SIP and RTP (a loopback one)")
    parser.add_argument("--auth-user", help="digest user to answer a 401/407 with (with --auth-password)")
    parser.add_argument("--auth-password", default="")
    args = parser.parse_args()
    if args.play and args.tone:
        parser.error("--play or --tone, not both")
    source = load_source(args)
    summary: dict[str, Any] = {"uri": args.uri, "error": None}
    t_start = time.monotonic()
    deadline = t_start + args.timeout

    ep, sip_port = start_endpoint(
        "pjsua2-caller (parlora-bridge tests)", args.sip_port, args.bind, args.log_level
    )

    acfg = pj.AccountConfig()
    acfg.idUri = f"sip:caller@{args.bind}:{sip_port}"
    if args.auth_user:
        acfg.sipConfig.authCreds.append(pj.AuthCredInfo("digest", "*", args.auth_user, 0, args.auth_password))
    acfg.mediaConfig.transportConfig.port = args.rtp_port or (free_udp_port() & ~1)
    acfg.mediaConfig.transportConfig.boundAddress = args.bind
    acc = pj.Account()
    acc.create(acfg)
    summary["sip_port"] = sip_port

    call: Caller | None = Caller(acc, source)
    assert call is not None
    port: Port | None = None
    hold: dict[str, Any] = {}
    resume: dict[str, Any] = {}
    dtmf_sent = ""
    hung_up = False
    bye_status: int | None = None
    try:
        prm = pj.CallOpParam(True)
        call.makeCall(args.uri, prm)
        phase = "calling"
        hold_sent_at: float | None = None
        mark = mark_bye = 0
        while time.monotonic() < deadline:
            ep.libHandleEvents(10)
            if call.state == pj.PJSIP_INV_STATE_DISCONNECTED:
                break
            if call.confirmed_ns is None:
                continue
            t = (time.monotonic_ns() - call.confirmed_ns) / 1e9
            if args.dtmf and not dtmf_sent and t >= args.dtmf_at:
                try:
                    call.dialDtmf(args.dtmf)  # RFC 2833/4733 in the RTP stream
                    dtmf_sent = args.dtmf
                except pj.Error as exc:
                    summary["error"] = f"dialDtmf: {exc.info()}"
                    dtmf_sent = "!"
            if args.hold_at is not None and phase == "calling" and t >= args.hold_at:
                mark = len(call.tsx)
                hold = {"at_s": round(t, 3), "status": None, "media": None}
                call.setHold(pj.CallOpParam(True))
                phase, hold_sent_at = "holding", t
            if phase == "holding":
                reinv = [s for m, s in call.tsx[mark:] if m == "INVITE"]
                if reinv:
                    hold["status"] = reinv[0]
                    phase = "held"
            if phase == "held" and hold_sent_at is not None and t >= hold_sent_at + args.hold_for:
                hold["media"] = call.media_status
                mark = len(call.tsx)
                resume = {"at_s": round(t, 3), "status": None, "media": None}
                rp = pj.CallOpParam(True)
                rp.opt.flag = pj.PJSUA_CALL_UNHOLD
                call.reinvite(rp)
                phase = "resuming"
            if phase == "resuming":
                reinv = [s for m, s in call.tsx[mark:] if m == "INVITE"]
                if reinv:
                    resume["status"] = reinv[0]
                    phase = "resumed"
            if phase == "resumed" and not resume.get("media"):
                # the media callback follows the 200 within the same poll or the next one
                if call.media_status in ("active", "remote_hold") and resume["status"] is not None:
                    resume["media"] = call.media_status
            if not args.wait_bye and not hung_up and t >= args.duration:
                hung_up = True
                mark_bye = len(call.tsx)
                call.hangup(pj.CallOpParam(True))
            if args.wait_bye and t >= args.duration:
                summary["error"] = f"no BYE from the far end within {args.duration:g} s of the answer"
                hung_up = True
                mark_bye = len(call.tsx)
                call.hangup(pj.CallOpParam(True))
                args.wait_bye = False
        else:
            summary["error"] = summary["error"] or f"timed out after {args.timeout:g} s in state {call.state}"
            if call.state != pj.PJSIP_INV_STATE_DISCONNECTED:
                hung_up = True
                mark_bye = len(call.tsx)
                call.hangup(pj.CallOpParam(True))
        # let the BYE transaction (or the far end's) complete, bounded
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            ep.libHandleEvents(10)
            if call.state == pj.PJSIP_INV_STATE_DISCONNECTED and (
                not hung_up or any(m == "BYE" for m, _ in call.tsx[mark_bye:])
            ):
                break
        if hung_up:
            byes = [s for m, s in call.tsx[mark_bye:] if m == "BYE"]
            # pjsip ends the session on the BYE's final response, and may not report the BYE's transaction after
            # that: then the status that disconnected the call is the BYE's
            bye_status = byes[0] if byes else call.disconnect_status
        if hold and hold.get("media") is None:
            hold["media"] = call.media_status
        port = call.port
        summary.update(
            invite_status=call.invite_status,
            answered=call.invite_status == 200,
            confirmed=call.confirmed_ns is not None,
            call_s=(
                round((call.disconnected_ns - call.confirmed_ns) / 1e9, 3)
                if call.confirmed_ns and call.disconnected_ns
                else None
            ),
            hangup_by=(None if call.confirmed_ns is None else ("caller" if hung_up else "remote")),
            disconnect_status=call.disconnect_status,
            disconnect_reason=call.disconnect_reason,
            bye_status=bye_status,
            hold=hold or None,
            resume=resume or None,
            media_changes=call.media_changes,
            dtmf_sent=dtmf_sent,
            client_transactions=call.tsx,
            callback_errors=call.errors,
            frames_sent=port.frames_sent if port else 0,
            frames_received=len(port.rx) if port else 0,
            frames_received_audio=port.frames_audio if port else 0,
            sent_t0_ns=port.sent_t0_ns if port else None,
            received_t0_ns=port.received_t0_ns if port else None,
        )
        if args.record:
            with wave.open(args.record, "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(RATE)
                if port is not None:
                    with port.lock:
                        w.writeframes(b"".join(port.rx))
            summary["record"] = args.record
    except pj.Error as exc:
        summary["error"] = f"pjsua2: {exc.info()}"
    finally:
        # destruction order (pitfall 3): no Call, port or account may outlive libDestroy
        port = None
        if call is not None and call.port is not None:
            call.port = None
        call = None
        sys.last_type = sys.last_value = sys.last_traceback = None
        gc.collect()
        for _ in range(5):
            ep.libHandleEvents(10)
        acc.shutdown()
        del acc
        gc.collect()
        ep.libDestroy()
    ok = bool(summary.get("answered")) and summary["error"] is None
    print(json.dumps(summary), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
