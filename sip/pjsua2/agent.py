"""The pjsua2 SIP engine (`serve --engine pjsua2`): answers calls and exposes each one as a `CallLeg`.

Registered in `sip.engine` as "pjsua2" and built only through it; it needs the optional extra
`parlora-bridge[pjsua2]` (the pjsua2-python wheel). The SIP rules it shares with the other engine are not
here: call identity is `sip.core.identity`, DTMF and REFER-target checks `sip.core.telephony`, the REFER outcome
machine `sip.core.transfer` (this module feeds it pjsua's callbacks and `now`), the outbound playout `PlayoutLeg`.

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
`drain()` does what pjsua2 lets it: new INVITEs get 503 with Retry-After, but pjsua answers out-of-dialog
OPTIONS itself (200), which the Python API cannot change, so a load balancer that probes with OPTIONS keeps
seeing this bridge as up while it drains (take it out of the dispatcher set instead).

An offer no answer could accept never reaches `onIncomingCall`: pjsua negotiates the offer against its codecs
(PCMU and PCMA only, set in `_run`) before it calls the application, and answers 488 itself, with no 180 and so
no provider connection (measured with SIPp: a G.729-only offer gets "488 Not Acceptable Here" with "Warning:
399 ... PJMEDIA_SDPNEG_NOANSCODEC", RTP/SAVP over UDP a bare 488). Its reason phrase is pjsip's one for every
cause, not the native engine's one per cause (sip.core.offer_answer.OFFER_REFUSALS): the Python API has no hook before it.
Session timers are pjsip's own (`_account_config`); --hold-timeout is kept from this thread's poll loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import itertools
import logging
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator

import pjsua2 as pj  # type: ignore[import-untyped, import-not-found, unused-ignore]

from rtp import probe as _probe
from rtp.audio import PCM16_FRAME_BYTES
from sip.core.app_headers import check_app_headers
from sip.core.identity import call_identity, parse_head
from sip.core.telephony import validate_dtmf_digits, validate_transfer_target
from sip.core.transfer import DialogStage, EndTransferredCall, SendRefer, TransferOutput, TransferTracker
from sip.engine import ENGINES, EngineConfig, EngineFeatures, EngineStartError, OnCall
from sip.leg import (
    CallEnded,
    CallIdentity,
    DtmfReceived,
    FrameReceived,
    LegEvent,
    LegFeatures,
    MediaHeld,
    MediaResumed,
    MediaStarted,
    PlayoutLeg,
    TransferProgress,
)

log = logging.getLogger("parlora.sip")

WHEEL_MAX_CALLS = 4  # PJSUA_MAX_CALLS compiled into the pjsua2-python wheel
# The registry states the cap without importing this module (serve --help, the bench): keep them equal.
assert ENGINES["pjsua2"].cap == ENGINES["pjsua2"].default_max_calls == WHEEL_MAX_CALLS
_POLL_MS = 10
PJMEDIA_RTP_EREMNORFC2833 = 220107  # pjmedia: "Remote does not support RFC 2833" (measured on the wheel)
_VOID_PTR = ctypes.POINTER(ctypes.c_void_p)
Command = tuple[str, int, str, int]  # for the pjsua thread: verb, call key, reason/target/digits, status
Headers = tuple[tuple[str, str], ...]  # the application's, with a hangup or a transfer (sip.leg.HeaderedLeg)


def _vector_begin(vector: pj.ByteVector) -> int:
    """Address of a std::vector<uint8_t>'s data ({begin, end, cap} layout): 2 µs instead of 130 µs for
    `bytes(vector)`, which iterates the SWIG proxy element by element."""
    return int(ctypes.cast(int(vector.this), _VOID_PTR)[0] or 0)


def tx_headers(op: pj.CallOpParam, headers: tuple[tuple[str, str], ...]) -> None:
    """The application's headers (checked: sip.core.app_headers) on the request `op` sends (its SipTxOption)."""
    for name, value in headers:
        header = pj.SipHeader()
        header.hName, header.hValue = name, value
        op.txOption.headers.append(header)


def _frame_bytes(frame: pj.MediaFrame) -> bytes:
    begin, end = ctypes.cast(int(frame.buf.this), _VOID_PTR)[0:2]
    return ctypes.string_at(begin, end - begin) if begin else b""


class Pjsua2Leg(PlayoutLeg):
    """One call as the asyncio side sees it (implements `sip.leg.CallLeg`; its playout is `PlayoutLeg`'s,
    pulled by `_MediaPort.onFrameRequested` on pjmedia's clock thread).

    Created on the pjsua thread, used from the asyncio loop; only `_post` crosses from other threads.
    """

    # caller frames come as events, pjmedia runs the RTP; the application's headers ride pjsua's SipTxOption
    features = LegFeatures(sip_headers=True)

    def __init__(self, agent: Pjsua2UserAgent, key: int, identity: CallIdentity) -> None:
        super().__init__()
        self._agent = agent
        self._key = key
        self._identity = identity
        self._queue: asyncio.Queue[LegEvent] = asyncio.Queue()
        self._ended = False
        self.hangup_requested = False
        self.hangup_reason = ""
        self.frames_in = 0  # counted on the clock thread
        self.frames_out = 0

    @property
    def identity(self) -> CallIdentity:
        return self._identity

    async def events(self) -> AsyncIterator[LegEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, CallEnded):
                return

    def answer(self) -> None:
        self._agent._command(("answer", self._key, "", 200))

    def hangup(
        self, reason: str = "normal clearing", status: int = 503, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """A BYE once answered, with the application's `headers` (`sip.leg.HeaderedLeg`: ValueError for a bad
        one, nothing sent), else the final response `status`."""
        headers = check_app_headers(headers)
        if not self.hangup_requested:
            self.hangup_requested = True
            self.hangup_reason = reason
            self._agent._command(("hangup", self._key, reason, status), headers)

    def transfer(self, target: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Blind transfer (REFER) with the application's `headers`. Raises ValueError for a malformed target or
        header, before anything is sent; every other outcome, including failures, arrives as
        `TransferProgress` events (see `sip.leg.CallLeg`)."""
        target = validate_transfer_target(target)
        self._agent._command(("transfer", self._key, target, 0), check_app_headers(headers))

    def send_dtmf(self, digits: str) -> None:
        """RFC 4733 telephone-events to the caller. Raises ValueError (nothing sent) unless `digits` is 1 to 32
        of 0-9 * # A-D; a/b/c/d are taken as A-D."""
        self._agent._command(("dtmf", self._key, validate_dtmf_digits(digits), 0))

    def _post(self, event: LegEvent) -> None:
        """Hand an event to the asyncio loop (any thread)."""
        loop = self._agent.loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # loop closed during shutdown: nobody is listening any more
            pass


class _MediaPort(pj.AudioMediaPort):  # type: ignore[misc]  # pjsua2 ships no type stubs: its classes are Any
    """The call's audio port. Both callbacks run on pjmedia's clock thread and must stay in microseconds."""

    def __init__(self, leg: Pjsua2Leg) -> None:
        super().__init__()
        self._leg = leg
        self._playout = leg.playout
        self._seq = 0

    def onFrameRequested(self, frame: pj.MediaFrame) -> None:  # pjsua2 name
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

    def onFrameReceived(self, frame: pj.MediaFrame) -> None:
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


class _Call(pj.Call):  # type: ignore[misc]
    def __init__(self, agent: Pjsua2UserAgent, account: pj.Account, pj_call_id: int) -> None:
        super().__init__(account, pj_call_id)
        self._agent = agent
        self.key = pj_call_id
        self.leg: Pjsua2Leg | None = None
        self.port: _MediaPort | None = None
        self.media_format = pj.MediaFormatAudio()
        self.media_format.init(pj.PJMEDIA_FORMAT_PCM, 8000, 1, 20000, 16)
        self.held = False
        self.held_since = 0  # monotonic ns of the caller's hold (rtp/limits.py's hold limit), when `held`
        self.transfer = TransferTracker(int(agent.config.transfer_timeout_s * 1e9))  # blind transfer rules

    def release(self) -> None:
        """The port's and the Call's C++ objects, destroyed now (at DISCONNECTED, where pjsua2 allows it) with their
        Python objects held. Dropped, a port's attributes were cleared while its destructor waited (GIL released) for
        a clock thread callback in flight: it ran on the half-freed object, SIGSEGV. `~Call` acts on a reusable slot."""
        if self.port is not None and self.port.this.own():
            pj.AudioMediaPort.__swig_destroy__(self.port)  # SWIG's delete: disowns, then the C++ destructor
        if self.this.own():
            pj.Call.__swig_destroy__(self)

    def onCallState(self, prm: pj.OnCallStateParam) -> None:
        try:
            ci = self.getInfo()
            if ci.state == pj.PJSIP_INV_STATE_DISCONNECTED:
                self._agent._on_disconnected(self, ci.lastReason, ci.lastStatusCode)
            elif ci.state == pj.PJSIP_INV_STATE_CONFIRMED and self.transfer.waiting_for_ack:
                self._apply(self.transfer.confirmed(time.monotonic_ns()))
        except Exception:
            log.exception("onCallState failed")

    def onCallMediaState(self, prm: pj.OnCallMediaStateParam) -> None:
        try:
            ci = self.getInfo()  # keep ci alive: getInfo().media would dangle (pitfall 5)
            for mi in ci.media:
                if mi.type != pj.PJMEDIA_TYPE_AUDIO or self.leg is None:
                    continue
                if mi.status == pj.PJSUA_CALL_MEDIA_ACTIVE:
                    self._connect(mi.index)
                elif mi.status == pj.PJSUA_CALL_MEDIA_REMOTE_HOLD and not self.held:
                    self.held = True
                    self.held_since = time.monotonic_ns()
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

    def onDtmfDigit(self, prm: pj.OnDtmfDigitParam) -> None:
        try:
            if self.leg is not None:
                self.leg._post(DtmfReceived(prm.digit))
        except Exception:
            log.exception("onDtmfDigit failed")

    # --- blind transfer (REFER, RFC 3515) and outgoing DTMF; all on the pjsua thread ---

    def start_transfer(self, target: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        assert self.leg is not None
        state = self.getInfo().state
        # 200 sent, ACK not yet in (CONNECTING): a REFER now would cross it; onCallState sends it at CONFIRMED.
        stage = (
            DialogStage.CONFIRMED
            if state == pj.PJSIP_INV_STATE_CONFIRMED
            else DialogStage.AWAITING_ACK
            if state == pj.PJSIP_INV_STATE_CONNECTING
            else DialogStage.NOT_ANSWERED
        )
        self._apply(self.transfer.start(target, time.monotonic_ns(), stage, headers))
        if self.transfer.waiting_for_ack:
            log.info("%s: blind transfer to %s waits for the ACK", self.leg.identity.call_id, target)

    def expire_transfer(self, now: int) -> None:
        deadline = self.transfer.next_deadline()
        if deadline is not None and now >= deadline:
            self._apply(self.transfer.handle_timer(now))

    def _apply(self, outputs: list[TransferOutput]) -> None:
        """Carry out what the transfer tracker decided, in order (pjsua thread)."""
        leg = self.leg
        if leg is None:
            return
        for out in outputs:
            if isinstance(out, TransferProgress):
                log.info(
                    "%s: transfer to %s: %d %s%s",
                    leg.identity.call_id,
                    out.target,
                    out.status_code,
                    out.reason,
                    " (final)" if out.final else "",
                )
                leg._post(out)
            elif isinstance(out, SendRefer):
                self._send_refer(out.target, out.headers)
            elif isinstance(out, EndTransferredCall):
                log.info("%s: %s: ending the call", leg.identity.call_id, out.reason)
                leg.hangup(out.reason, 200)  # BYE, sent from the command queue after this callback

    def _send_refer(self, target: str, headers: tuple[tuple[str, str], ...]) -> None:
        assert self.leg is not None
        op = pj.CallOpParam()
        tx_headers(op, headers)
        try:
            self.xfer(target, op)
        except pj.Error as exc:
            log.warning("%s: REFER to %s not sent: %s", self.leg.identity.call_id, target, exc.info())
            self._apply(self.transfer.refer_failed(str(exc.reason), time.monotonic_ns()))
            return
        log.info("%s: blind transfer to %s (REFER sent)", self.leg.identity.call_id, target)

    def onCallTransferStatus(self, prm: pj.OnCallTransferStatusParam) -> None:
        """pjsua reports, in order: (100, "Accepted") when the REFER got its 2xx, then each NOTIFY's sipfrag
        status, with finalNotify on the one that terminates the subscription; or the REFER's error response
        (finalNotify set); or 500 when the subscription ended without a message (timer, transport).

        `prm.cont` only tells pjsua whether to keep reporting this subscription; it never ends the call (the
        pjsua *application* hangs up itself on 2xx). So it stays true while the tracker still awaits an
        outcome, and the tracker decides when a 2xx ends the call: a transferor leaves once the transferee
        reached the target."""
        try:
            if self.leg is None:
                prm.cont = False
                return
            outputs = self.transfer.report(
                int(prm.statusCode), str(prm.reason), time.monotonic_ns(), final=bool(prm.finalNotify)
            )
            prm.cont = self.transfer.pending
            self._apply(outputs)
        except Exception:
            log.exception("onCallTransferStatus failed")

    def onCallTransferRequest(self, prm: pj.OnCallTransferRequestParam) -> None:
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
            log.warning(
                "%s: the caller negotiated no telephone-event; sending DTMF %s as SIP INFO",
                self.leg.identity.call_id if self.leg is not None else self.key,
                digits,
            )
            prm.method = pj.PJSUA_DTMF_METHOD_SIP_INFO
            self.sendDtmf(prm)


class _Account(pj.Account):  # type: ignore[misc]
    def __init__(self, agent: Pjsua2UserAgent) -> None:
        super().__init__()
        self._agent = agent

    def onIncomingCall(self, prm: pj.OnIncomingCallParam) -> None:
        try:
            self._agent._on_incoming(self, prm)
        except Exception:
            log.exception("onIncomingCall failed")


class _LogWriter(pj.LogWriter):  # type: ignore[misc]
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


def unsupported_options(config: EngineConfig) -> list[str]:
    """The options (as `serve` spells them) in `config` that this engine cannot honour: the trunk edge
    (inbound policy, registration, NAT, TLS, SRTP, call limits) is built on the native engine only, and an
    option silently ignored would leave an operator believing a trunk is protected, registered or encrypted
    when it is not. Placing calls is refused where it is asked for (`Server.dial`: no `Dialer` here)."""
    given = {
        "--allow": bool(config.allow),
        "--drop-unknown": config.drop_unknown,
        "--inbound-auth": config.inbound_auth is not None,
        "--realm": config.realm is not None,
        "--invite-rate": config.invite_rate_per_s is not None,
        "--options-rate": config.options_rate_per_s is not None,
        "--register": bool(config.register),
        "--external-address": config.external_address is not None,
        "--nat": config.nat,
        "--rtp-source strict": config.rtp_source == "strict",  # pjmedia takes its own source choices
        "--tls": config.tls is not None,
        "--tls-ca": config.tls_ca is not None,
        "--srtp": config.srtp != "off",
        "--max-call-duration": config.max_call_duration_s is not None,
        "--rtp-timeout": config.rtp_timeout_s is not None,
        "--rtp-ports": config.rtp_port_high is not None,
    }
    for (
        t
    ) in config.trunks:  # a trunk's policy (sip/core/trunks.py): pjsua2 has no per-request policy to apply it
        given |= {
            f"trunks[{t.name}].allow": bool(t.allow),
            f"trunks[{t.name}].inbound_auth_user": t.inbound_auth is not None,
            f"trunks[{t.name}].registrar": t.registrar is not None,
            f"trunks[{t.name}].external_address": t.external_address is not None,
            f"trunks[{t.name}].nat": t.nat,
            f"trunks[{t.name}].rtp_source strict": t.rtp_source == "strict",
            f"trunks[{t.name}].srtp": t.srtp != "off",
        }
    return [option for option, asked in given.items() if asked]


class Pjsua2UserAgent:
    """Runs pjsua2 on its own thread and hands each incoming call to `on_call` on the asyncio loop that ran
    `start()` (implements `sip.engine.SipEngine`; built through `sip.engine.create_engine("pjsua2", ...)`)."""

    features = EngineFeatures()  # none: no GET /sip report, no refusal counters, no placing calls

    def __init__(self, config: EngineConfig, on_call: OnCall, *, pjsip_log_level: int = 2) -> None:
        """`pjsip_log_level`: pjsip's own log lines go to `logging` at DEBUG (level 1, errors, at WARNING).
        EngineStartError when `config` asks for what this engine cannot do (`unsupported_options`)."""
        refused = unsupported_options(config)
        if refused:
            raise EngineStartError(
                f"{', '.join(refused)}: not supported on the pjsua2 engine (the trunk edge is the native "
                "engine's: use --engine native)"
            )
        wanted = WHEEL_MAX_CALLS if config.max_calls is None else config.max_calls
        if wanted < 1:
            raise ValueError(f"max_calls must be at least 1, got {wanted}")
        if wanted > WHEEL_MAX_CALLS:
            log.warning(
                "max_calls %d: the pjsua2 engine takes at most %d calls per process (the wheel is compiled "
                "with PJSUA_MAX_CALLS=%d); using %d",
                wanted,
                WHEEL_MAX_CALLS,
                WHEEL_MAX_CALLS,
                WHEEL_MAX_CALLS,
            )
        self.config = config
        self.pjsip_log_level = pjsip_log_level
        self.loop: asyncio.AbstractEventLoop | None = None  # set by start(); legs post their events to it
        self._on_call = on_call
        self._draining = False  # written on the loop, read on the pjsua thread (a bool: atomic)
        self._active = 0  # calls handed to on_call and not yet disconnected; written on the pjsua thread only
        self._commands: queue.SimpleQueue[tuple[Command, Headers]] = queue.SimpleQueue()
        self._calls: dict[int, _Call] = {}
        self._dead: list[_Call] = []
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pjsua", daemon=True)
        self._max_calls = min(wanted, WHEEL_MAX_CALLS)
        self.calls_rejected = 0
        self.calls_answered = 0
        self.limit_hangups: Counter[str] = Counter()  # calls ended by --hold-timeout

    # --- asyncio side (sip.engine.SipEngine) ---

    @property
    def max_calls(self) -> int:
        return self._max_calls

    @property
    def active_calls(self) -> int:
        # A counter kept on the pjsua thread: walking `_calls` from here could drop a Call's last reference on
        # this unregistered thread (pitfall 6: abort).
        return self._active

    @property
    def draining(self) -> bool:
        return self._draining

    async def start(self, timeout: float = 10.0) -> None:
        """Start the engine; returns once it listens, raises EngineStartError if it cannot. pjsua's start
        blocks (its thread creates the library and binds), so it runs in the loop's executor."""
        loop = asyncio.get_running_loop()
        self.loop = loop
        await loop.run_in_executor(None, self._start_blocking, timeout)

    async def stop(self, timeout: float = 10.0) -> bool:
        """Hang up every call, shut pjsua down cleanly, and wait for the thread; False if it hung."""
        if not self._thread.is_alive():
            return True
        return await asyncio.get_running_loop().run_in_executor(None, self._stop_blocking, timeout)

    def drain(self) -> None:
        """New INVITEs get 503 with Retry-After from now on; live calls go on. pjsua answers out-of-dialog
        OPTIONS itself (200) and pjsua2 cannot change that: an OPTIONS-probing load balancer is not told."""
        if self._draining:
            return
        self._draining = True
        log.warning(
            "draining: new INVITEs get 503 (Retry-After %d s) while %d call(s) finish; the pjsua2 engine "
            "still answers OPTIONS with 200 (pjsua does that itself), so take this bridge out of the load "
            "balancer's set as well",
            self.config.retry_after_s,
            self.active_calls,
        )

    def _start_blocking(self, timeout: float) -> None:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise EngineStartError("the pjsua2 engine did not start in time")
        if self._error is not None:
            raise EngineStartError(str(self._error)) from self._error

    def _stop_blocking(self, timeout: float) -> bool:
        self._stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _command(self, command: Command, headers: Headers = ()) -> None:
        self._commands.put((command, headers))

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
        cfg.uaConfig.userAgent = self.config.server_header or ""  # empty: pjsua sends no User-Agent
        cfg.logConfig.writer = writer
        cfg.logConfig.level = self.pjsip_log_level
        cfg.logConfig.consoleLevel = self.pjsip_log_level
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
        # RFC 4028 by pjsip's own session timer (the wheel's AccountConfig leaves it inactive): offered and
        # honoured with our interval; 0 turns it off altogether (pjsip has no "honour but never ask" mode)
        timers = acfg.callConfig
        if self.config.session_expires_s:
            timers.timerUse = pj.PJSUA_SIP_TIMER_OPTIONAL
            timers.timerSessExpiresSec = max(self.config.session_expires_s, 90)
            timers.timerMinSESec = 90
        else:
            timers.timerUse = pj.PJSUA_SIP_TIMER_INACTIVE
        return acfg

    def _on_incoming(self, account: _Account, prm: pj.OnIncomingCallParam) -> None:
        call = _Call(self, account, prm.callId)
        self._calls[call.key] = call  # keep a reference, or ~Call answers 603 (pitfall 1)
        op = pj.CallOpParam()
        if self._draining:
            self.calls_rejected += 1
            log.info("draining: refused an INVITE with 503 (%d call(s) still up)", len(self._calls) - 1)
            op.statusCode = pj.PJSIP_SC_SERVICE_UNAVAILABLE
            op.reason = "Draining"
            retry = pj.SipHeader()
            retry.hName, retry.hValue = "Retry-After", str(self.config.retry_after_s)
            op.txOption.headers.append(retry)
            call.answer(op)
            return
        if len(self._calls) > self._max_calls:
            self.calls_rejected += 1
            log.warning(
                "rejected an INVITE with 486 Busy Here: %d calls are up and the limit is %d",
                len(self._calls) - 1,
                self._max_calls,
            )
            op.statusCode = pj.PJSIP_SC_BUSY_HERE
            call.answer(op)
            return
        rdata = prm.rdata
        request_uri, headers = parse_head(rdata.wholeMsg)
        ci = call.getInfo()
        identity = call_identity(
            f"call-{next(self._ids)}",
            request_uri=request_uri,
            from_uri=ci.remoteUri,
            to_uri=ci.localUri,
            sip_call_id=ci.callIdString,
            source=rdata.srcAddress,
            headers=headers,
        )
        call.leg = Pjsua2Leg(self, call.key, identity)
        op.statusCode = pj.PJSIP_SC_RINGING  # 200 follows once the session has its provider (leg.answer)
        call.answer(op)
        leg = call.leg
        self._active += 1
        assert self.loop is not None  # set by start() before the thread runs
        self.loop.call_soon_threadsafe(self._on_call, leg)

    def _on_disconnected(self, call: _Call, reason: str, status: int) -> None:
        self._calls.pop(call.key, None)
        self._dead.append(call)  # dropped after this callback returns, still on this thread
        leg = call.leg
        if leg is not None:
            self._active -= 1
            call._apply(call.transfer.call_ended(time.monotonic_ns()))  # a final report before CallEnded
            leg._post(
                CallEnded(
                    reason=leg.hangup_reason if leg.hangup_requested else reason,
                    status_code=status,
                    by_remote=not leg.hangup_requested,
                    frames_in=leg.frames_in,
                    frames_out=leg.frames_out,
                )
            )
        call.release()  # the C++ objects now; the Python shell is dropped after this callback

    def _run_commands(self) -> None:
        while True:
            try:
                (verb, key, reason, status), headers = self._commands.get_nowait()
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
                    if call.getInfo().state in (pj.PJSIP_INV_STATE_CONNECTING, pj.PJSIP_INV_STATE_CONFIRMED):
                        tx_headers(op, headers)  # on the BYE, never on a final response (sip.leg.HeaderedLeg)
                    call.hangup(op)
                elif verb == "transfer":
                    call.start_transfer(reason, headers)
                elif verb == "dtmf":
                    call.send_digits(reason)
            except pj.Error as exc:
                log.warning("%s of %s failed: %s", verb, key, exc.info())

    def _expire_transfers(self) -> None:
        # A method, not inline in _run: a loop variable there would keep a Call alive until libDestroy (pitfall 3).
        now = time.monotonic_ns()
        hold_ns = int(self.config.hold_timeout_s * 1e9) if self.config.hold_timeout_s else None
        for call in self._calls.values():
            call.expire_transfer(now)
            if hold_ns is not None and call.held and now - call.held_since >= hold_ns:
                self._end_held(call)

    def _end_held(self, call: _Call) -> None:
        """--hold-timeout (rtp/limits.py's rule): a call the caller held this long in one stretch gets a BYE."""
        leg = call.leg
        call.held = False  # asked once
        if leg is None or leg.hangup_requested:
            return
        leg.hangup_requested = True
        leg.hangup_reason = f"the call was on hold for {self.config.hold_timeout_s:g} s (--hold-timeout)"
        self.limit_hangups["hold_timeout"] += 1
        log.warning("%s: %s; BYE", leg.identity.call_id, leg.hangup_reason)
        op = pj.CallOpParam()
        op.statusCode = pj.PJSIP_SC_OK
        try:
            call.hangup(op)
        except pj.Error as exc:
            log.warning("BYE of a call held too long failed: %s", exc.info())

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
        for call in self._calls.values():
            call.release()  # while the clock thread runs; a released shell may outlive libDestroy (pitfall 3)
        self._calls.clear()
        self._dead.clear()
        # A traceback kept by SWIG's PyErr_Print can hold a Call alive (pitfall 4).
        sys.last_type = sys.last_value = sys.last_traceback = None
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
