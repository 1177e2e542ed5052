"""The SIP user agent on pjsua2: answers calls and exposes each one as a `CallLeg`.

Threading (shared/reference/pjsua2.md §1 and its pitfalls table):
- One Python thread, the *pjsua thread*, creates the library (`threadCnt=0`, `mainThreadOnly=True`), polls
  `libHandleEvents` and owns every pjsua2 object: all SIP callbacks run there, and every `Call` and
  `AudioMediaPort` is created and dropped there (pitfall 6: the last reference dropped on an unregistered
  thread aborts the process).
- pjmedia's clock thread calls each call's port every 20 ms. Those callbacks do a ctypes copy, a deque
  operation and a `call_soon_threadsafe`, nothing else: a slow callback stalls every call in the process.
- The asyncio loop (the session engine) never calls pjsua2. It talks to the pjsua thread through a command
  queue, and receives frames and leg events through `call_soon_threadsafe`.

Limits of the PyPI wheel (pjsua2-python 2.15.1.post1), surfaced rather than hidden: it is compiled with
PJSUA_MAX_CALLS=4, so pjsua itself answers a 5th concurrent INVITE with 486 Busy Here (we log that with the
reason), and it bundles OpenSSL 1.0.2k, so SIP-TLS and SRTP on this engine belong behind a trusted boundary.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import itertools
import logging
import queue
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pjsua2 as pj

from rtp import probe as _probe
from rtp.audio import PCM16_FRAME_BYTES
from rtp.ledger import CarrierLedger
from rtp.playout import ClearResult, OutboundFrame, Playout
from sip.leg import (
    CallEnded,
    CallIdentity,
    DtmfReceived,
    FrameReceived,
    LegEvent,
    MediaHeld,
    MediaResumed,
    MediaStarted,
    TransferProgress,
)

log = logging.getLogger("parlora.sip")

WHEEL_MAX_CALLS = 4  # PJSUA_MAX_CALLS compiled into the pjsua2-python wheel
_POLL_MS = 10
DTMF_DIGITS = frozenset("0123456789*#ABCD")
MAX_DTMF_DIGITS = 32  # pjmedia's stream queues at most 32 outgoing digits (PJ_ETOOMANY beyond)
PJMEDIA_RTP_EREMNORFC2833 = 220107  # pjmedia: "Remote does not support RFC 2833" (measured on the wheel)
_TRANSFER_TARGET = re.compile(r"^(?:sips?|tel):[^\s<>\"]+$", re.IGNORECASE)
_VOID_PTR = ctypes.POINTER(ctypes.c_void_p)


@dataclass(frozen=True, slots=True)
class UserAgentConfig:
    """Where to listen and how many calls to take. `max_calls` above the engine's limit is clamped."""

    host: str = "127.0.0.1"
    port: int = 5060
    rtp_port: int = 4000  # first RTP port; each call uses the next free pair
    max_calls: int = WHEEL_MAX_CALLS
    user_agent: str = "parlora-bridge"
    pjsip_log_level: int = 2  # pjsip's own log lines routed into logging at DEBUG (warnings at WARNING)
    # A transfer with no report (REFER response or NOTIFY) for this long ends with a final 408. 30 s is just
    # under the REFER's own UDP timeout (Timer F, 32 s), so an unanswered REFER reports 408, not pjsua's 500.
    transfer_timeout_s: float = 30.0


class UserAgentError(RuntimeError):
    """The SIP engine could not start (bad address, port in use, ...)."""


def _vector_begin(vector: pj.ByteVector) -> int:
    """Address of a std::vector<uint8_t>'s data ({begin, end, cap} layout): 2 µs instead of 130 µs for
    `bytes(vector)`, which iterates the SWIG proxy element by element."""
    return int(ctypes.cast(int(vector.this), _VOID_PTR)[0] or 0)


def _frame_bytes(frame: pj.MediaFrame) -> bytes:
    begin, end = ctypes.cast(int(frame.buf.this), _VOID_PTR)[0:2]
    return ctypes.string_at(begin, end - begin) if begin else b""


class Pjsua2Leg:
    """One call as the asyncio side sees it (implements `sip.leg.CallLeg`).

    Created on the pjsua thread, used from the asyncio loop; only `_post` crosses from other threads.
    """

    def __init__(self, agent: Pjsua2UserAgent, key: int, identity: CallIdentity) -> None:
        self._agent = agent
        self._key = key
        self._identity = identity
        self.playout = Playout(CarrierLedger())
        self._queue: asyncio.Queue[LegEvent] = asyncio.Queue()
        self._ended = False
        self.hangup_requested = False
        self.hangup_reason = ""
        self.frames_in = 0  # counted on the clock thread
        self.frames_out = 0

    @property
    def identity(self) -> CallIdentity:
        return self._identity

    @property
    def ledger(self) -> CarrierLedger:
        return self.playout.ledger

    @property
    def depth(self) -> int:
        return self.playout.depth

    async def events(self) -> AsyncIterator[LegEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, CallEnded):
                return

    def enqueue(self, frames: list[OutboundFrame]) -> None:
        self.playout.enqueue(frames)

    def clear(self, epoch: int) -> ClearResult:
        return self.playout.clear(epoch)

    def answer(self) -> None:
        self._agent._command(("answer", self._key, "", 200))

    def hangup(self, reason: str = "normal clearing", status: int = 503) -> None:
        if not self.hangup_requested:
            self.hangup_requested = True
            self.hangup_reason = reason
            self._agent._command(("hangup", self._key, reason, status))

    def transfer(self, target: str) -> None:
        """Blind transfer (REFER). Raises ValueError for a malformed target, before anything is sent; every
        other outcome, including failures, arrives as `TransferProgress` events (see `sip.leg.CallLeg`)."""
        self._agent._command(("transfer", self._key, validate_transfer_target(target), 0))

    def send_dtmf(self, digits: str) -> None:
        """RFC 4733 telephone-events to the caller. Raises ValueError (nothing sent) unless `digits` is 1 to 32
        of 0-9 * # A-D; a/b/c/d are taken as A-D."""
        self._agent._command(("dtmf", self._key, validate_dtmf_digits(digits), 0))

    def _post(self, event: LegEvent) -> None:
        """Hand an event to the asyncio loop (any thread)."""
        try:
            self._agent.loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # loop closed during shutdown: nobody is listening any more
            pass


def validate_dtmf_digits(digits: str) -> str:
    """The digits to send, upper-cased; ValueError (with the offending characters) if any is not a DTMF key."""
    if not isinstance(digits, str) or not digits:
        raise ValueError("send_dtmf needs at least one digit (0-9, *, #, A-D)")
    normalized = digits.upper()
    bad = sorted({ch for ch in normalized if ch not in DTMF_DIGITS})
    if bad:
        raise ValueError(f"send_dtmf: {', '.join(map(repr, bad))} not DTMF digits: only 0-9, *, #, A-D are allowed")
    if len(normalized) > MAX_DTMF_DIGITS:
        raise ValueError(f"send_dtmf: {len(normalized)} digits, at most {MAX_DTMF_DIGITS} per call")
    return normalized


def validate_transfer_target(target: str) -> str:
    """A bare sip:/sips:/tel: URI (angle brackets allowed); ValueError for anything else, e.g. a name, a
    number without a scheme, or text with whitespace or CR/LF that would corrupt the Refer-To header."""
    uri = target.strip() if isinstance(target, str) else ""
    if uri.startswith("<") and uri.endswith(">"):
        uri = uri[1:-1]
    if not _TRANSFER_TARGET.match(uri):
        raise ValueError(f"transfer target {target!r} is not a sip:, sips: or tel: URI")
    return uri


class _MediaPort(pj.AudioMediaPort):
    """The call's audio port. Both callbacks run on pjmedia's clock thread and must stay in microseconds."""

    def __init__(self, leg: Pjsua2Leg) -> None:
        super().__init__()
        self._leg = leg
        self._playout = leg.playout
        self._seq = 0

    def onFrameRequested(self, frame: pj.MediaFrame) -> None:  # noqa: N802 (pjsua2 name)
        try:
            now = time.monotonic_ns()
            out = self._playout.pull(now)
            if out is None:
                return  # type stays NONE: pjmedia sends silence, the RTP stream never stops
            if _probe.ENABLED:  # benchmark instrumentation (PARLORA_PROBE); one test when off
                _probe.media_out(self._leg.identity.call_id, now, out.pcm)
            buf = frame.buf
            buf.resize(PCM16_FRAME_BYTES)
            ctypes.memmove(_vector_begin(buf), out.pcm, PCM16_FRAME_BYTES)
            frame.type = pj.PJMEDIA_FRAME_TYPE_AUDIO
            frame.size = PCM16_FRAME_BYTES
            self._leg.frames_out += 1
        except Exception:  # pitfall 4: never let an exception reach SWIG's director
            log.exception("onFrameRequested failed")

    def onFrameReceived(self, frame: pj.MediaFrame) -> None:  # noqa: N802
        try:
            if frame.size != PCM16_FRAME_BYTES:
                return  # size 0 / type NONE during hold
            self._seq += 1
            self._leg.frames_in += 1
            pcm, now = _frame_bytes(frame), time.monotonic_ns()
            self._leg._post(FrameReceived(pcm, self._seq, now))
            if _probe.ENABLED:  # benchmark instrumentation (PARLORA_PROBE); one test when off
                _probe.media_in(self._leg.identity.call_id, now, pcm)
        except Exception:
            log.exception("onFrameReceived failed")


class _Call(pj.Call):
    def __init__(self, agent: Pjsua2UserAgent, account: pj.Account, pj_call_id: int) -> None:
        super().__init__(account, pj_call_id)
        self._agent = agent
        self.key = pj_call_id
        self.leg: Pjsua2Leg | None = None
        self.port: _MediaPort | None = None
        self.media_format = pj.MediaFormatAudio()
        self.media_format.init(pj.PJMEDIA_FORMAT_PCM, 8000, 1, 20000, 16)
        self.held = False
        # Blind transfer in progress
        self.xfer_target: str | None = None
        self.xfer_deferred = False  # asked for while the ACK was outstanding
        self.xfer_deadline = 0.0
        self.xfer_expired: str | None = None  # gave up waiting on this one; a late 2xx still ends the call

    def onCallState(self, prm: pj.OnCallStateParam) -> None:  # noqa: N802
        try:
            ci = self.getInfo()
            if ci.state == pj.PJSIP_INV_STATE_DISCONNECTED:
                self._agent._on_disconnected(self, ci.lastReason, ci.lastStatusCode)
            elif ci.state == pj.PJSIP_INV_STATE_CONFIRMED and self.xfer_deferred:
                self._send_refer()
        except Exception:
            log.exception("onCallState failed")

    def onCallMediaState(self, prm: pj.OnCallMediaStateParam) -> None:  # noqa: N802
        try:
            ci = self.getInfo()  # keep ci alive: getInfo().media would dangle (pitfall 5)
            for mi in ci.media:
                if mi.type != pj.PJMEDIA_TYPE_AUDIO or self.leg is None:
                    continue
                if mi.status == pj.PJSUA_CALL_MEDIA_ACTIVE:
                    self._connect(mi.index)
                elif mi.status == pj.PJSUA_CALL_MEDIA_REMOTE_HOLD and not self.held:
                    self.held = True
                    self.leg._post(MediaHeld())
        except Exception:
            log.exception("onCallMediaState failed")

    def _connect(self, media_index: int) -> None:
        assert self.leg is not None
        audio = self.getAudioMedia(media_index)
        first = self.port is None
        if first:
            self.port = _MediaPort(self.leg)
            self.port.createPort(f"call{self.key}", self.media_format)
        assert self.port is not None
        audio.startTransmit(self.port)  # idempotent on re-INVITE (pitfall 10)
        self.port.startTransmit(audio)
        if first:
            codec = self.getStreamInfo(media_index).codecName
            self.leg._post(MediaStarted(f"{codec}/8000"))
        elif self.held:
            self.held = False
            self.leg._post(MediaResumed())

    def onDtmfDigit(self, prm: pj.OnDtmfDigitParam) -> None:  # noqa: N802
        try:
            if self.leg is not None:
                self.leg._post(DtmfReceived(prm.digit))
        except Exception:
            log.exception("onDtmfDigit failed")

    # --- blind transfer (REFER, RFC 3515) and outgoing DTMF; all on the pjsua thread ---

    def start_transfer(self, target: str) -> None:
        leg = self.leg
        assert leg is not None
        # pjsua's status callback does not say which REFER it reports on, so one subscription at a time,
        # including one we stopped waiting for (its late reports still come).
        busy = self.xfer_target or self.xfer_expired
        if busy is not None:
            leg._post(TransferProgress(target, 491, f"a transfer to {busy} is still in progress", True))
            return
        state = self.getInfo().state
        if state not in (pj.PJSIP_INV_STATE_CONNECTING, pj.PJSIP_INV_STATE_CONFIRMED):
            leg._post(TransferProgress(target, 500, "REFER not sent: the call is not answered", True))
            return
        self.xfer_target = target
        self.xfer_expired = None
        self.xfer_deadline = time.monotonic() + self._agent.config.transfer_timeout_s
        if state == pj.PJSIP_INV_STATE_CONFIRMED:
            self._send_refer()
        else:  # 200 sent, ACK not yet in: a REFER now would cross it; onCallState sends it at CONFIRMED
            self.xfer_deferred = True
            log.info("%s: blind transfer to %s waits for the ACK", leg.identity.call_id, target)

    def _send_refer(self) -> None:
        assert self.leg is not None and self.xfer_target is not None
        self.xfer_deferred = False
        target = self.xfer_target
        try:
            self.xfer(target, pj.CallOpParam())
        except pj.Error as exc:
            log.warning("%s: REFER to %s not sent: %s", self.leg.identity.call_id, target, exc.info())
            self.xfer_target = None
            self.leg._post(TransferProgress(target, 500, f"REFER not sent: {exc.reason}", True))
            return
        log.info("%s: blind transfer to %s (REFER sent)", self.leg.identity.call_id, target)

    def onCallTransferStatus(self, prm: pj.OnCallTransferStatusParam) -> None:  # noqa: N802
        """pjsua reports, in order: (100, "Accepted") when the REFER got its 2xx, then each NOTIFY's sipfrag
        status, with finalNotify on the one that terminates the subscription; or the REFER's error response
        (finalNotify set); or 500 when the subscription ended without a message (timer, transport).

        `prm.cont` only tells pjsua whether to keep reporting this subscription; it never ends the call (the
        pjsua *application* hangs up itself on 2xx). So we set cont=False once the outcome is known, and end
        the call ourselves after a 2xx: a transferor leaves once the transferee reached the target."""
        try:
            leg = self.leg
            code, reason = int(prm.statusCode), str(prm.reason)
            target = self.xfer_target
            if leg is None or target is None:  # no transfer of ours in progress
                late = self.xfer_expired
                if leg is None or late is None:
                    prm.cont = False
                elif prm.finalNotify or code >= 200:  # the outcome of one we gave up on (408 already reported)
                    prm.cont = False
                    self.xfer_expired = None
                    if 200 <= code < 300:
                        log.warning("%s: transfer to %s succeeded after we stopped waiting; ending the call",
                                    leg.identity.call_id, late)
                        leg.hangup(f"transferred to {late}", 200)
                return
            # A final sipfrag status is the transfer's outcome even if the subscription is still active
            # (pjsua then unsubscribes by itself).
            final = bool(prm.finalNotify) or code >= 200
            log.info("%s: transfer to %s: %d %s%s", leg.identity.call_id, target, code, reason,
                     " (final)" if final else "")
            leg._post(TransferProgress(target, code, reason, final))
            if not final:
                self.xfer_deadline = time.monotonic() + self._agent.config.transfer_timeout_s
                return
            self.xfer_target = None
            prm.cont = False
            if 200 <= code < 300:
                leg.hangup(f"transferred to {target}", 200)  # BYE, sent from the command queue after this callback
        except Exception:
            log.exception("onCallTransferStatus failed")

    def expire_transfer(self, now: float) -> None:
        if self.xfer_target is None or now < self.xfer_deadline or self.leg is None:
            return
        target, self.xfer_target, self.xfer_expired = self.xfer_target, None, self.xfer_target
        timeout = self._agent.config.transfer_timeout_s
        log.warning("%s: transfer to %s: no report for %g s, giving up", self.leg.identity.call_id, target, timeout)
        self.leg._post(TransferProgress(target, 408, f"no answer to the transfer within {timeout:g} s", True))

    def onCallTransferRequest(self, prm: pj.OnCallTransferRequestParam) -> None:  # noqa: N802
        """The caller sent us a REFER. pjsua would accept it and dial `dstUri` from this bridge (toll fraud
        by any caller): refuse it."""
        try:
            prm.statusCode = pj.PJSIP_SC_FORBIDDEN
            call_id = self.leg.identity.call_id if self.leg is not None else self.key
            log.warning("%s: refused the caller's REFER to %s with 403", call_id, prm.dstUri)
        except Exception:
            log.exception("onCallTransferRequest failed")

    def send_digits(self, digits: str) -> None:
        """RFC 4733 telephone-events on the call's stream; SIP INFO if the caller did not negotiate them."""
        prm = pj.CallSendDtmfParam()  # duration 160 ms per digit (PJSUA_CALL_SEND_DTMF_DURATION_DEFAULT)
        prm.method = pj.PJSUA_DTMF_METHOD_RFC2833
        prm.digits = digits
        try:
            self.sendDtmf(prm)
        except pj.Error as exc:
            if exc.status != PJMEDIA_RTP_EREMNORFC2833:
                raise
            log.warning("%s: the caller negotiated no telephone-event; sending DTMF %s as SIP INFO",
                        self.leg.identity.call_id if self.leg is not None else self.key, digits)
            prm.method = pj.PJSUA_DTMF_METHOD_SIP_INFO
            self.sendDtmf(prm)


class _Account(pj.Account):
    def __init__(self, agent: Pjsua2UserAgent) -> None:
        super().__init__()
        self._agent = agent

    def onIncomingCall(self, prm: pj.OnIncomingCallParam) -> None:  # noqa: N802
        try:
            self._agent._on_incoming(self, prm)
        except Exception:
            log.exception("onIncomingCall failed")


class _LogWriter(pj.LogWriter):
    """pjsip's log into `logging`; also the only sign of a 5th INVITE that pjsua rejected on its own."""

    def __init__(self, agent: Pjsua2UserAgent) -> None:
        super().__init__()
        self._agent = agent

    def write(self, entry: pj.LogEntry) -> None:
        try:
            msg = entry.msg.rstrip()
            if "too many calls" in msg:
                self._agent.calls_rejected += 1
                log.warning(
                    "rejected an INVITE with 486 Busy Here: %d calls are up and this pjsua2 wheel is "
                    "compiled with PJSUA_MAX_CALLS=%d (4 calls per process)",
                    len(self._agent._calls),
                    WHEEL_MAX_CALLS,
                )
            elif entry.level <= 1:
                log.warning("pjsip: %s", msg)
            else:
                log.debug("pjsip: %s", msg)
        except Exception:
            pass


_REQUEST_LINE = re.compile(r"^INVITE\s+(?:sips?|tel):(?:([^@;>\s]+)@)?", re.IGNORECASE)


def _parse_invite(whole_msg: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Request-URI user and header fields (unfolded, in order) of an INVITE's text."""
    head = whole_msg.split("\r\n\r\n", 1)[0].split("\n\n", 1)[0]
    lines = head.replace("\r\n", "\n").split("\n")
    match = _REQUEST_LINE.match(lines[0]) if lines else None
    user = match.group(1) or "" if match else ""
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and headers:  # folded continuation
            name, value = headers[-1]
            headers[-1] = (name, f"{value} {line.strip()}")
        elif ":" in line:
            name, value = line.split(":", 1)
            headers.append((name.strip(), value.strip()))
    return user, tuple(headers)


class Pjsua2UserAgent:
    """Runs pjsua2 on its own thread and hands each answered call to `on_call` on the asyncio loop."""

    def __init__(
        self,
        config: UserAgentConfig,
        loop: asyncio.AbstractEventLoop,
        on_call: Callable[[Pjsua2Leg], None],
    ) -> None:
        self.config = config
        self.loop = loop
        self._on_call = on_call
        self._commands: queue.SimpleQueue[tuple[str, int, str, int]] = queue.SimpleQueue()
        self._calls: dict[int, _Call] = {}
        self._dead: list[_Call] = []
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pjsua", daemon=True)
        self.max_calls = min(config.max_calls, WHEEL_MAX_CALLS)
        self.calls_rejected = 0
        self.calls_answered = 0

    # --- asyncio side ---

    def start(self, timeout: float = 10.0) -> None:
        """Start the engine; returns once it listens, raises UserAgentError if it cannot."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise UserAgentError("the SIP engine did not start in time")
        if self._error is not None:
            raise UserAgentError(str(self._error)) from self._error

    def stop(self, timeout: float = 10.0) -> bool:
        """Hang up every call, shut pjsua down cleanly, and wait for the thread; False if it hung."""
        self._stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _command(self, command: tuple[str, int, str, int]) -> None:
        self._commands.put(command)

    # --- pjsua thread ---

    def _run(self) -> None:
        ep: pj.Endpoint | None = None
        account: _Account | None = None
        writer: _LogWriter | None = None
        try:
            ep = pj.Endpoint()
            ep.libCreate()
            writer = _LogWriter(self)
            ep.libInit(self._endpoint_config(writer))
            transport = pj.TransportConfig()
            transport.port = self.config.port
            transport.boundAddress = self.config.host
            ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, transport)
            ep.libStart()
            ep.audDevManager().setNullDev()  # the null device's clock drives the conference bridge
            for codec in ep.codecEnum2():
                ep.codecSetPriority(codec.codecId, 0)
            ep.codecSetPriority("PCMU/8000", 250)
            ep.codecSetPriority("PCMA/8000", 249)
            account = _Account(self)
            account.create(self._account_config())
            log.info(
                "listening on udp %s:%d (engine pjsua2 %s, at most %d calls per process)",
                self.config.host,
                self.config.port,
                ep.libVersion().full,
                self.max_calls,
            )
        except Exception as exc:
            self._error = exc
            self._ready.set()
            self._destroy(ep, account)
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                ep.libHandleEvents(_POLL_MS)
                self._run_commands()
                self._expire_transfers()
                self._dead.clear()
            self._hangup_all(ep)
        finally:
            self._destroy(ep, account)
            del writer

    def _endpoint_config(self, writer: _LogWriter) -> pj.EpConfig:
        cfg = pj.EpConfig()
        cfg.uaConfig.threadCnt = 0
        cfg.uaConfig.mainThreadOnly = True
        cfg.uaConfig.maxCalls = WHEEL_MAX_CALLS
        cfg.uaConfig.userAgent = self.config.user_agent
        cfg.logConfig.writer = writer
        cfg.logConfig.level = self.config.pjsip_log_level
        cfg.logConfig.consoleLevel = self.config.pjsip_log_level
        cfg.logConfig.decor = 0
        media = cfg.medConfig
        media.clockRate = 8000  # 16000 (the default) resamples every 8 kHz port: double the CPU
        media.sndClockRate = 8000
        media.audioFramePtime = 20
        media.ptime = 20
        media.noVad = True  # continuous RTP: the caller never hears the stream stop
        media.ecTailLen = 0
        return cfg

    def _account_config(self) -> pj.AccountConfig:
        acfg = pj.AccountConfig()
        acfg.idUri = f"sip:bridge@{self.config.host}:{self.config.port}"
        acfg.mediaConfig.transportConfig.port = self.config.rtp_port
        acfg.mediaConfig.transportConfig.boundAddress = self.config.host
        return acfg

    def _on_incoming(self, account: _Account, prm: pj.OnIncomingCallParam) -> None:
        call = _Call(self, account, prm.callId)
        self._calls[call.key] = call  # keep a reference, or ~Call answers 603 (pitfall 1)
        op = pj.CallOpParam()
        if len(self._calls) > self.max_calls:
            self.calls_rejected += 1
            log.warning(
                "rejected an INVITE with 486 Busy Here: %d calls are up and the limit is %d",
                len(self._calls) - 1,
                self.max_calls,
            )
            op.statusCode = pj.PJSIP_SC_BUSY_HERE
            call.answer(op)
            return
        rdata = prm.rdata
        user, headers = _parse_invite(rdata.wholeMsg)
        ci = call.getInfo()
        identity = CallIdentity(
            call_id=f"call-{next(self._ids)}",
            sip_call_id=ci.callIdString,
            from_uri=ci.remoteUri,
            to_uri=ci.localUri,
            request_user=user,
            source=rdata.srcAddress,
            headers=headers,
        )
        call.leg = Pjsua2Leg(self, call.key, identity)
        op.statusCode = pj.PJSIP_SC_RINGING  # 200 follows once the session has its provider (leg.answer)
        call.answer(op)
        leg = call.leg
        self.loop.call_soon_threadsafe(self._on_call, leg)

    def _on_disconnected(self, call: _Call, reason: str, status: int) -> None:
        self._calls.pop(call.key, None)
        self._dead.append(call)  # dropped after this callback returns, still on this thread
        leg = call.leg
        if leg is not None:
            if call.xfer_target is not None:  # every transfer gets exactly one final report, before CallEnded
                leg._post(TransferProgress(call.xfer_target, 487, "the call ended before the transfer's outcome", True))
                call.xfer_target = None
            leg._post(
                CallEnded(
                    reason=leg.hangup_reason if leg.hangup_requested else reason,
                    status_code=status,
                    by_remote=not leg.hangup_requested,
                    frames_in=leg.frames_in,
                    frames_out=leg.frames_out,
                )
            )

    def _run_commands(self) -> None:
        while True:
            try:
                verb, key, reason, status = self._commands.get_nowait()
            except queue.Empty:
                return
            call = self._calls.get(key)
            if call is None:
                continue
            op = pj.CallOpParam()
            try:
                if verb == "answer":
                    op.statusCode = pj.PJSIP_SC_OK
                    call.answer(op)
                    self.calls_answered += 1
                elif verb == "hangup":
                    # Before the 200 this is a final response (status, e.g. 503); after it, a BYE.
                    op.statusCode = status
                    op.reason = reason
                    call.hangup(op)
                elif verb == "transfer":
                    call.start_transfer(reason)
                elif verb == "dtmf":
                    call.send_digits(reason)
            except pj.Error as exc:
                log.warning("%s of %s failed: %s", verb, key, exc.info())

    def _expire_transfers(self) -> None:
        # A method, not inline in _run: a loop variable there would keep a Call alive until libDestroy (pitfall 3).
        now = time.monotonic()
        for call in self._calls.values():
            if call.xfer_target is not None:
                call.expire_transfer(now)

    def _hangup_all(self, ep: pj.Endpoint) -> None:
        if self._calls:
            log.info("shutting down: hanging up %d call(s)", len(self._calls))
            for call in self._calls.values():
                if call.leg is not None and not call.leg.hangup_requested:
                    call.leg.hangup_requested = True  # the bridge ended these calls, not the callers
                    call.leg.hangup_reason = "bridge shutting down"
            ep.hangupAllCalls()
        deadline = time.monotonic() + 2.0
        while self._calls and time.monotonic() < deadline:
            ep.libHandleEvents(_POLL_MS)
        for _ in range(5):  # let the BYE transactions get their responses
            ep.libHandleEvents(_POLL_MS)

    def _destroy(self, ep: pj.Endpoint | None, account: _Account | None) -> None:
        """Every Call, port and Account must be gone before libDestroy, or pjsip asserts at exit (pitfall 3)."""
        self._calls.clear()
        self._dead.clear()
        # A traceback kept by SWIG's PyErr_Print can hold a Call alive (pitfall 4).
        sys.last_type = sys.last_value = sys.last_traceback = None  # type: ignore[assignment]
        gc.collect()
        if account is not None:
            try:
                account.shutdown()
            except Exception:
                log.exception("account shutdown failed")
            del account
        if ep is not None:
            try:
                ep.libDestroy()
            except Exception:
                log.exception("libDestroy failed")
