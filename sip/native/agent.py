"""The native SIP engine: the sans-I/O user agent (`sip.core.ua`) and RTP streams (`rtp.stream`) behind thin asyncio
shells, one process-wide media clock, every call a `CallLeg`. `serve --engine native`.

Shells and who owns what:
- `sip.native.transport.SipTransports`: UDP and TCP sockets (IPv4 or IPv6, one address); every message goes into
  `UserAgent.receive` / `receive_message` with the source, the transport name and `now`, and every `Transmit`
  the core pulls out goes back through it. ONE `DeadlineTimer` is re-armed after every input at the soonest
  of the core's `next_deadline()` and the transfer trackers' deadlines: never a timer per transaction.
- `rtp.endpoint.RtpSocketPair`: one RTP/RTCP socket pair per call, taken from a `PortPool` (even ports from
  `EngineConfig.rtp_port` on) when the INVITE arrives, so the SDP answer names it. Datagrams go into the
  call's `RtpStream`: RTP read by the media clock in the call's tick, before its slots (`_CallMedia.read_rtp`,
  stamped with the kernel's receive time; what came before the answer is read and counted as the media
  starts), RTCP by a loop reader.
- `rtp.clock.MediaClockShell`: ONE timer for every call on absolute deadlines (the `rtp.pacer` core), the
  calls spread over `MEDIA_PHASES` phases 2 ms apart (inbound latency: a frame waits at most 2 ms for its phase). Each tick, every answered
  call's `_CallMedia.on_slots` drives its media core (`rtp.media.CallMedia`, sans-I/O: the stream, SRTP, the
  Playout, the call limits): per slot it pulls the caller's frame (`FrameReceived`, handed to the session's
  frame sink in the tick when it set one: `sip.leg.FrameSinkLeg`) and the slot's datagram, sends it with
  `sendto`, and only once `sendto` has returned tells the core, which records the frame in the carrier ledger
  (a failed send is counted, never recorded) (DESIGN §3.2, §11, HR4); a late clock's skipped slots are paid one
  frame a tick; at the core's deadline, RTCP, lost digit ends, the call limits (rtp/limits.py: the BYE, or the
  goodbye and its backstop BYE) and the one-way-audio line.

Call flow: INVITE → 100 (the core) and 180 at once → `on_call(leg)` → `leg.answer()` sends the 200 with the SDP
answer and starts the media (`MediaStarted`). BYE either way, CANCEL → 487, re-INVITE hold/resume →
`MediaHeld`/`MediaResumed`, INFO or RFC 4733 digits → `DtmfReceived`, REFER via `sip.core.transfer`. The last
event of every leg is `CallEnded` with the frame counts. `stop()` BYEs every live call, waits briefly for the
answers, and closes every socket, timer and task; `counts()` proves they are back to zero.

Everything runs on the one asyncio loop that ran `start()`: the session's `enqueue`/`clear` and the media
clock's `take`/`transmitted` never run at the same time, so the Playout's lock is never contended.

Trunks (`EngineConfig.trunks`, sip/core/trunks.py): the inbound policy matches each request to its trunk (the
registrars' addresses, resolved once at start, count as their trunks' sources); an inbound call takes its
trunk's SRTP mode, NAT mode, RTP source policy and external address (`NativeLeg.policy`), a call of no trunk
the engine's own. Every trunk with a registrar keeps its binding with its own credentials, expiry and keep-alive
(`registration_plan`); calls we place use the engine's own policy.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict

from rtp import probe as _probe
from rtp.clock import MEDIA_PHASES, MediaClockShell
from rtp.dtmf import DtmfDigit
from rtp.endpoint import PortPool, PortsExhausted, RtpSocketPair
from rtp.ledger import CarrierLedger
from rtp.media import CallMedia, LimitReached
from rtp.playout import Playout
from rtp.rtcp import QoS
from rtp.srtp import SrtpContext
from rtp.stream import ARRIVAL_WINDOW_MS, OneWayAudio, RtpStream, StreamConfig
from sip.core import ua as core
from sip.core.auth import Credentials
from sip.core.framing import StreamFramer
from sip.core.identity import call_identity
from sip.core.native_plan import build_policy, describe_policy, invite_rate, options_rate, registration_plan
from sip.core.offer_answer import LocalMedia, NegotiatedMedia
from sip.core.policy import InboundPolicy
from sip.core.register import Registration
from sip.core.sdes import SrtpPolicy
from sip.core.telephony import validate_dtmf_digits, validate_transfer_target
from sip.core.transaction import TimerConfig
from sip.core.transfer import DialogStage, EndTransferredCall, SendRefer, TransferOutput, TransferTracker
from sip.core.trunks import Trunk
from sip.core.uri import parse_uri
from sip.engine import EngineConfig, EngineFeatures, EngineStartError, OnCall
from sip.leg import (
    CallEnded,
    CallIdentity,
    DtmfReceived,
    FrameReceived,
    FrameSink,
    LegEvent,
    LegFeatures,
    MediaHeld,
    MediaResumed,
    MediaStarted,
    PlayoutLeg,
    TransferProgress,
)
from sip.native.tls import client_context, sdes_policy, server_context
from sip.native.transport import DeadlineTimer, Inbound, SipTransports, TransportRef

log = logging.getLogger("parlora.sip")

DEFAULT_MAX_CALLS = 200
EARLY_READ_MAX = 64  # datagrams that came before the answer, read and counted as the media starts
STOP_GRACE_S = 2.0  # how long stop() waits for the answers to its BYEs and final responses
TCP_LINGER_S = 0.2  # then how long TCP connections stay open for the peers to finish
_MAX_FLUSH_ROUNDS = 16
Clock = Callable[[], int]


class _CallMedia:
    """One answered call's media shell: its core (rtp.media `CallMedia`: stream, SRTP, Playout, limits) driven by
    the media clock and the call's socket pair; caller frames and digits to the leg, datagrams to the sockets."""

    def __init__(self, leg: NativeLeg, stream: RtpStream, negotiated: NegotiatedMedia) -> None:
        self._leg = leg
        self._sockets = leg.sockets
        self._clock = leg.agent.clock
        self.telephone_event = negotiated.telephone_event is not None
        self.codec = negotiated.codec
        keys = negotiated.srtp  # SDES agreed: every packet either way is SRTP/SRTCP
        self.core = CallMedia(
            stream,
            leg.playout,
            srtp=SrtpContext(keys.suite, keys.local_key, keys.remote_key) if keys is not None else None,
            sends=negotiated.sends,
            receives=negotiated.receives,
            held=negotiated.held,
        )
        self.stream = stream
        self.srtp = self.core.srtp
        leg.sockets.on_rtp = self.on_rtp  # the clock reads 50 datagrams a second per call: straight here

    # the core's figures, read by the leg's status and its CallEnded
    frames_in = property(lambda self: self.core.frames_in)
    frames_out = property(lambda self: self.core.frames_out)
    frames_unsent = property(lambda self: self.core.frames_unsent)
    receives = property(lambda self: self.core.receives)
    held = property(lambda self: self.core.held)
    last_rtp = property(lambda self: self.core.last_rtp)

    def update(self, negotiated: NegotiatedMedia) -> None:
        """A re-INVITE/UPDATE changed the stream: direction, hold, remote address, SRTP keys."""
        self.core.update(
            self._clock(),
            sends=negotiated.sends,
            receives=negotiated.receives,
            held=negotiated.held,
            remote=(negotiated.remote_address, negotiated.remote_port),
        )
        keys = negotiated.srtp
        if self.srtp is not None and keys is not None:  # a re-key on re-INVITE
            self.srtp.rekey(suite_name=keys.suite, local_key=keys.local_key, remote_key=keys.remote_key)

    def set_limits(self, now: int, *limits: float | None) -> None:
        """--max-call-duration, --rtp-timeout, --hold-timeout and the goodbye's grace from `now` (rtp/limits.py)."""
        self.core.set_limits(now, *limits)

    def watch_arrival(self, now: int) -> None:
        self.core.watch_arrival(now)

    def rtp_reader(self) -> tuple[int, Callable[[int, int], bool]]:
        """The clock reads this call's RTP in its tick, before the slots (rtp.clock `ReadingChannel`): after a
        stall too, so the slots it catches up find the packets that came meanwhile."""
        return self._sockets.rtp_fileno, self._sockets.read_rtp

    def on_slots(self, now: int, due: int, skipped: int) -> None:
        """The media clock's tick (rtp.clock): each due slot hands the caller's frame on, then sends ours."""
        core = self.core
        if skipped:
            core.skip(skipped, now)
        for _ in range(due):
            frame = core.pull_frame(now)
            if frame is not None:
                self._leg._post(FrameReceived(frame.pcm, frame.seq, frame.arrival_ns))
                if _probe.ENABLED:  # benchmark instrumentation (PARLORA_PROBE); one test when off
                    _probe.media_in(self._leg.identity.call_id, now, frame.pcm)
            datagram = core.pull_datagram(now)
            if datagram is not None:
                if self._sockets.send_rtp(datagram, core.to):
                    out = core.out
                    if out is not None:  # handed to the kernel: transmitted when sendto returned
                        sent_ns = self._clock()
                        core.sent(sent_ns)
                        if _probe.ENABLED:
                            _probe.media_out(self._leg.identity.call_id, sent_ns, out.pcm)
                else:
                    core.unsent()
        if core.owing and due:  # a late clock's skipped slots: their frames, one more a tick
            frame = core.pull_backlog(now)
            if frame is not None:
                self._leg._post(FrameReceived(frame.pcm, frame.seq, frame.arrival_ns))
        deadline = core.stream.next_deadline()  # next_deadline() asked without its frame (rtp.media)
        if now >= core.wake_at or (deadline is not None and deadline <= now):
            self.on_timer(now)

    def on_timer(self, now: int) -> None:
        """The core's deadline: RTCP out, digits whose end was lost, a limit, the one-way-audio diagnosis."""
        leg = self._leg
        for item in self.core.handle_timer(now):
            if type(item) is bytes:
                destination = self.stream.rtcp_destination
                if destination is not None:
                    self._sockets.send_rtcp(item, destination)
            elif isinstance(item, DtmfDigit):
                leg._post(DtmfReceived(item.digit))
            elif isinstance(item, LimitReached):
                if item.action != "backstop":
                    leg.agent.limit_hangups[item.action] += 1
                # the BYE from the loop, not from the clock's iteration over the calls
                asyncio.get_running_loop().call_soon(leg._limit_reached, item.action)
            elif isinstance(item, OneWayAudio):
                leg.agent.one_way_audio[item.cause] += 1
                log.warning(
                    "%s: one-way audio (%s): no usable RTP from the caller %g s after the media started: %s",
                    leg.call,
                    item.cause,
                    ARRIVAL_WINDOW_MS / 1000,
                    item.detail,
                )

    def on_rtp(self, data: bytes, source: tuple[str, int], now: int) -> None:
        digit = self.core.receive(data, source, now)
        if digit is not None:
            self._leg._post(DtmfReceived(digit.digit))
            if self.core.next_deadline() <= now:  # a second digit ended by the same packet: now
                self.on_timer(now)

    def on_rtcp(self, data: bytes, source: tuple[str, int], now: int) -> None:
        self.core.receive_rtcp(data, source, now)

    def goodbye(self, now: int) -> None:
        """The RTCP BYE as the call ends (RFC 3550 §6.6)."""
        destination = self.stream.rtcp_destination
        if destination is not None:
            self._sockets.send_rtcp(self.core.goodbye(now), destination)


class NativeLeg(PlayoutLeg):
    """One incoming call on the native engine (implements `sip.leg.CallLeg`). Lives on the asyncio loop."""

    features = LegFeatures(frame_sink=True, dialled=True, qos=True, time_limit=True)

    def __init__(
        self,
        agent: NativeUserAgent,
        call: str,
        identity: CallIdentity,
        incoming: core.IncomingCall | None,
        sockets: RtpSocketPair,
        *,
        peer: tuple[str, int] | None = None,
        transport: str = "udp",
        policy: Trunk | None = None,
    ) -> None:
        super().__init__(Playout(CarrierLedger()))
        self.agent = agent
        self.call = call
        self._identity = identity
        # an outbound call (`NativeUserAgent.dial`) has no IncomingCall: `peer` is where it goes
        self.outbound = incoming is None
        self.offer = incoming.offer if incoming is not None else None
        self.transport = incoming.transport if incoming is not None else transport
        source = incoming.source if incoming is not None else (peer or ("127.0.0.1", 0))
        self.sockets = sockets
        # what this call gets: its trunk's policy, or the engine's own (sip/core/trunks.py)
        self.policy = policy if policy is not None else agent.global_policy
        # SDES keys only over TLS (sip.native.tls.sdes_policy): "off" elsewhere unless required (then refused earlier)
        self.srtp_policy: SrtpPolicy = sdes_policy(self.policy.srtp, self.transport) or "off"
        self.progress: list[int] = []  # outbound: the 1xx statuses seen (180, 183)
        self.early_media = 0  # outbound: 1xx with an SDP answer (early media, played to nobody: counted)
        # behind NAT the SDP names the external address, else the one the RTP socket is bound to
        self.media_address = self.policy.external_address or media_address(sockets.host, source[0])
        self.media: _CallMedia | None = None
        self.transfer_tracker = TransferTracker(int(agent.config.transfer_timeout_s * 1e9))
        self._queue: asyncio.Queue[LegEvent] = asyncio.Queue()
        self._sink: FrameSink | None = None  # sip.leg.FrameSinkLeg: caller frames without the queue
        self.answered = False
        self.confirmed = False
        self.ended = False
        self.hangup_requested = False
        self.hangup_reason = ""
        self._session_id = agent.rng.getrandbits(31)
        # --max-call-duration: who says goodbye first; the BYE that follows if nobody does is the
        # limits core's backstop (rtp/limits.py)
        self._time_limit: Callable[[str], object] | None = None
        self._time_limit_grace_s = 0.0

    # --- CallLeg ---

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
        """200 OK with the SDP answer (the call rang with 180 since the INVITE). An outbound call is answered
        by the callee: nothing to do (its MediaStarted comes with the 2xx)."""
        if self.ended or self.answered or self.outbound:
            return
        agent = self.agent
        now = agent.clock()
        local = LocalMedia(
            address=self.media_address,
            port=self.sockets.port,
            session_id=self._session_id,
            username="parlora",
            srtp=self.srtp_policy,
        )
        if agent.ua.answer(self.call, local, now):  # CallAnswered follows, with what was agreed
            self.answered = True
        agent.flush(now)

    def hangup(self, reason: str = "normal clearing", status: int = 503) -> None:
        """A BYE once answered, else the final response `status` (with Retry-After for a 503)."""
        if self.hangup_requested or self.ended:
            return
        self.hangup_requested = True
        self.hangup_reason = reason
        agent = self.agent
        now = agent.clock()
        if (
            self.answered or self.outbound
        ):  # an outbound call not yet answered: CANCEL (sip.core.ua's bye does it)
            agent.ua.bye(self.call, now, reason)
        else:
            code = status if 300 <= status <= 699 else 480
            headers = (("Retry-After", str(agent.config.retry_after_s)),) if code == 503 else ()
            agent.ua.reject(self.call, code, now, reason=_reason_phrase(reason), headers=headers)
        agent.flush(now)

    def transfer(self, target: str) -> None:
        """Blind transfer (REFER) per `CallLeg.transfer`: ValueError for a malformed target, nothing sent."""
        uri = validate_transfer_target(target)
        if self.ended:
            return
        now = self.agent.clock()
        stage = (
            DialogStage.CONFIRMED
            if self.confirmed
            else DialogStage.AWAITING_ACK
            if self.answered
            else DialogStage.NOT_ANSWERED
        )
        if stage is DialogStage.AWAITING_ACK:
            log.info("%s: blind transfer to %s waits for the ACK", self.call, uri)
        self._transfer_outputs(self.transfer_tracker.start(uri, now, stage), now)
        self.agent.track_transfer(self)  # its timeout is on the engine's one timer
        self.agent.flush(now)

    def send_dtmf(self, digits: str) -> None:
        """RFC 4733 events on the call's RTP (SIP INFO without a negotiated telephone-event)."""
        digits = validate_dtmf_digits(digits)
        media = self.media
        if self.ended or media is None:
            log.warning("%s: DTMF %s not sent: the call has no media", self.call, digits)
            return
        if media.telephone_event:
            media.stream.send_dtmf(digits)
            return
        log.warning(
            "%s: the caller negotiated no telephone-event; sending DTMF %s as SIP INFO", self.call, digits
        )
        now = self.agent.clock()
        if not all([self.agent.ua.send_info_dtmf(self.call, digit, now) for digit in digits]):
            log.warning("%s: DTMF %s not sent as SIP INFO: the dialog is ending", self.call, digits)
        self.agent.flush(now)

    def set_frame_sink(self, sink: FrameSink | None) -> None:
        """`sip.leg.FrameSinkLeg`: caller frames go to `sink` from the media tick (None: back to events())."""
        self._sink = sink

    # --- status ---

    def qos(self) -> QoS | None:
        """RTCP figures for `status()["qos"]` (None before the media started)."""
        return self.media.stream.qos() if self.media is not None else None

    def media_counters(self) -> dict[str, int]:
        media = self.media
        if media is None:
            return {}
        srtp = media.srtp.counters() if media.srtp is not None else {}
        return {**media.stream.counters(), **srtp, "frames_unsent": media.frames_unsent}

    # --- engine side ---

    def _post(self, event: LegEvent) -> None:
        """Into events(); a caller frame to the frame sink instead, if one is set and no earlier event waits."""
        sink = self._sink
        if sink is not None and type(event) is FrameReceived and self._queue.empty():
            sink(event)
        else:
            self._queue.put_nowait(event)

    def _start_media(self, negotiated: NegotiatedMedia, now: int) -> None:
        if self.media is not None:
            return
        agent = self.agent
        wall = time.time_ns()  # RTP that came before the answer: read (and counted) before the stream exists
        for _ in range(EARLY_READ_MAX):
            if not self.sockets.read_rtp(now, wall):
                break
        rng = agent.rng
        stream = RtpStream(
            StreamConfig(
                ssrc=rng.getrandbits(32),
                initial_seq=rng.getrandbits(16),
                initial_timestamp=rng.getrandbits(32),
                cname=f"parlora-{self.call}@{self.sockets.host}",
                remote=(negotiated.remote_address, negotiated.remote_port),
                payload_type=negotiated.payload_type,
                dtmf_payload_type=negotiated.telephone_event,
                wallclock_offset_ns=agent.wallclock_offset_ns,
                nat=self.policy.nat,  # symmetric RTP: latch to the first valid packet's source
                source_policy=self.policy.rtp_source,  # else learn the caller's source (rtp/latch.py)
            ),
            rng.random,
        )
        self.media = _CallMedia(self, stream, negotiated)
        config = agent.config
        self.media.set_limits(
            now,
            config.max_call_duration_s,
            config.rtp_timeout_s,
            config.hold_timeout_s,
            self._time_limit_grace_s if self._time_limit is not None else None,
        )
        if self.media.receives and not self.media.held:
            self.media.watch_arrival(now)
        agent.media_clock.add(self.media)
        log.info(
            "%s media: %s/8000 to %s:%d from %s:%d",
            self.call,
            negotiated.codec,
            negotiated.remote_address,
            negotiated.remote_port,
            self.sockets.host,
            self.sockets.port,
        )
        self._post(MediaStarted(f"{negotiated.codec}/8000"))

    def _on_rtp(self, data: bytes, source: tuple[str, int], now: int) -> None:
        media = self.media
        if media is not None:
            media.on_rtp(data, source, now)
        else:
            self.agent.rtp_before_answer += 1  # early RTP: no stream yet (nothing negotiated)

    def _on_rtcp(self, data: bytes, source: tuple[str, int], now: int) -> None:
        if self.media is not None:
            self.media.on_rtcp(data, source, now)

    def on_time_limit(self, handler: Callable[[str], object], grace_s: float) -> None:
        """--max-call-duration (`sip.leg.TimeLimitedLeg`): at the limit, `handler(reason)`
        instead of a BYE at once (the session lets the model say goodbye, then hangs up); if the call is still
        up `grace_s` later, the BYE goes out all the same (the backstop, rtp/limits.py)."""
        self._time_limit, self._time_limit_grace_s = handler, grace_s
        if self.media is not None:
            self.media.core.limits.goodbye(grace_s)

    def _limit_reached(self, why: str) -> None:
        """A limit of rtp/limits.py: BYE, or the goodbye first; "backstop": no BYE came after the goodbye."""
        config = self.agent.config
        if self.ended or self.hangup_requested:
            return
        if why == "backstop":
            grace = self._time_limit_grace_s
            log.warning("%s: no BYE %g s after the goodbye was asked for; BYE", self.call, grace)
            self.hangup(f"the call reached --max-call-duration ({config.max_call_duration_s:g} s)")
            return
        if why == "max_call_duration":
            reason = f"the call reached --max-call-duration ({config.max_call_duration_s:g} s)"
            if self._time_limit is not None:
                grace = self._time_limit_grace_s
                log.warning("%s: %s; goodbye, then BYE (at the latest in %g s)", self.call, reason, grace)
                try:
                    self._time_limit(reason)
                except Exception:  # the session's failure must not keep the call up: the backstop BYEs
                    log.exception("%s: the goodbye at --max-call-duration failed", self.call)
                return
        elif why == "hold_timeout":
            reason = f"the call was on hold for {config.hold_timeout_s:g} s (--hold-timeout)"
        else:
            reason = f"no RTP from the caller for {config.rtp_timeout_s:g} s (--rtp-timeout)"
        log.warning("%s: %s; BYE", self.call, reason)
        self.hangup(reason)

    def _transfer_outputs(self, outputs: list[TransferOutput], now: int) -> None:
        for out in outputs:
            if isinstance(out, TransferProgress):
                self._post(out)
            elif isinstance(out, SendRefer):
                if self.agent.ua.refer(self.call, out.target, now):
                    log.info("%s: blind transfer to %s (REFER sent)", self.call, out.target)
                else:
                    self._transfer_outputs(
                        self.transfer_tracker.refer_failed("the dialog is not confirmed", now), now
                    )
            elif isinstance(out, EndTransferredCall):
                self.hangup(out.reason, 200)

    def _on_media_change(self, negotiated: NegotiatedMedia, event: LegEvent | None) -> None:
        if self.media is not None:
            self.media.update(negotiated)
        if event is not None:
            self._post(event)

    def _end(self, reason: str, status: int, by_remote: bool, now: int) -> None:
        """The call is over: the transfer's last word, CallEnded with the counts, then the media is released."""
        if self.ended:
            return
        self.ended = True
        self._transfer_outputs(self.transfer_tracker.call_ended(now), now)
        media = self.media
        frames_in = media.frames_in if media is not None else 0
        frames_out = media.frames_out if media is not None else 0
        by_us = self.hangup_requested
        self._post(
            CallEnded(
                reason=self.hangup_reason if by_us else reason,
                status_code=status,
                by_remote=by_remote and not by_us,
                frames_in=frames_in,
                frames_out=frames_out,
            )
        )
        self._release(now)

    def _release(self, now: int) -> None:
        media = self.media
        if media is not None:
            self.agent.media_clock.remove(media)
            media.goodbye(now)
        self.sockets.close()


def media_address(bound: str, peer: str) -> str:
    """The address to put in our SDP: the one the RTP socket is bound to, or, when that is the wildcard
    (0.0.0.0 / ::, which in SDP would mean hold), the local address the kernel routes to `peer` from (a
    connected UDP socket sends nothing). Behind NAT an advertised address is still needed (EngineConfig has
    none yet)."""
    if bound not in ("0.0.0.0", "::"):
        return bound
    family = socket.AF_INET6 if ":" in peer else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((peer, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return bound


def _printable(text: str, limit: int = 200) -> str:
    """Peer input for a log line: control characters escaped, bounded."""
    out = text[:limit].encode("unicode_escape").decode("ascii") if not text.isprintable() else text[:limit]
    return out + ("..." if len(text) > limit else "")


def _reason_phrase(reason: str) -> str:
    """A reason text usable in a status line (no CR/LF, bounded)."""
    text = " ".join(reason.split())[:80]
    return text or "Service Unavailable"


class NativeUserAgent:
    """The native SIP engine (implements `sip.engine.SipEngine`); see the module docstring."""

    features = EngineFeatures(status=True, counters=True, held=True, dial=True)

    def __init__(
        self,
        config: EngineConfig,
        on_call: OnCall,
        *,
        clock: Clock = time.monotonic_ns,
        timers: TimerConfig | None = None,
        rtp_ports: int | None = None,
        tcp: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._on_call = on_call
        self.clock = clock
        self._timers = timers or TimerConfig()
        self._max_calls = config.max_calls if config.max_calls is not None else DEFAULT_MAX_CALLS
        self._rtp_ports = rtp_ports or max(2 * self._max_calls + 32, 64)
        self._tcp = tcp
        self.rng = rng or random.Random()
        self.wallclock_offset_ns = time.time_ns() - time.monotonic_ns()
        self._ua: core.UserAgent | None = None
        self._transports: SipTransports | None = None
        self._timer: DeadlineTimer | None = None
        self._media_clock: MediaClockShell | None = None
        self._pool: PortPool | None = None
        self._legs: dict[str, NativeLeg] = {}
        self._transferring: set[NativeLeg] = set()
        self._draining = False
        self._stopping = False
        self._flushing = False
        self._dirty = False
        self._received = 0
        self._activity: asyncio.Event | None = None
        self._rejected_seen = 0
        self.local: tuple[str, int] | None = None
        self.policy: InboundPolicy | None = None  # built by start() from the config
        self._reg_seen: dict[str, tuple[str, str | None, int, str | None]] = {}
        self.tls_port: int | None = None  # the TLS listener's port once started
        self.limit_hangups: Counter[str] = Counter()  # calls ended by max_call_duration / rtp_timeout
        self.one_way_audio: Counter[str] = Counter()  # calls with no usable caller RTP, by cause (rtp.stream)
        self.outbound_results: deque[dict[str, object]] = deque(
            maxlen=50
        )  # the last outbound calls' outcomes
        self.calls_rejected = 0
        self.rtp_before_answer = 0
        self._registering = bool(config.register) or any(t.registrar for t in config.trunks)
        self.trunk_calls: Counter[str] = Counter()  # inbound calls by the trunk they came in on
        # what a call of no trunk gets (and calls we place): the engine's own policy, as a nameless trunk
        self.global_policy = Trunk(
            "",
            allow=config.allow,
            inbound_auth=config.inbound_auth,
            srtp=config.srtp,
            nat=config.nat,
            rtp_source=config.rtp_source,
            external_address=config.external_address,
        )

    # --- SipEngine ---

    @property
    def max_calls(self) -> int:
        return self._max_calls

    @property
    def active_calls(self) -> int:
        return len(self._legs)

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def ua(self) -> core.UserAgent:
        assert self._ua is not None, "the engine is not started"
        return self._ua

    @property
    def media_clock(self) -> MediaClockShell:
        assert self._media_clock is not None, "the engine is not started"
        return self._media_clock

    async def start(self) -> None:
        """Listen on UDP (and TCP on the same port); EngineStartError if the address cannot be bound."""
        loop = asyncio.get_running_loop()
        config = self.config
        self._activity = asyncio.Event()
        transports = SipTransports(loop, self._receive, StreamFramer, self.clock)
        try:
            udp = await transports.listen_udp(config.host, config.port)
        except OSError as exc:
            await transports.close()
            raise EngineStartError(f"cannot listen on udp {config.host}:{config.port}: {exc}") from exc
        host, port = udp.local
        tcp_note = ""
        if self._tcp and config.tcp:
            try:
                await transports.listen_tcp(host, port)
                tcp_note = " and tcp"
            except OSError as exc:
                log.warning("no SIP over TCP: cannot listen on tcp %s:%d: %s", host, port, exc)
        tls_port: int | None = None
        if config.tls is not None:
            try:
                if config.cert is None or config.tls_key is None:
                    raise ValueError("--tls needs --cert FILE and --key FILE")
                context = server_context(config.cert, config.tls_key)
                tls_ref = await transports.listen_tls(config.tls[0], config.tls[1], context)
                tls_port = tls_ref.local[1]
                tcp_note += f" and tls {tls_ref.local[0]}:{tls_port}"
            except (OSError, ValueError) as exc:
                await transports.close()
                raise EngineStartError(
                    f"cannot listen on tls {config.tls[0]}:{config.tls[1]}: {exc}"
                ) from exc
        if config.tls is not None or config.tls_ca is not None:
            try:
                transports.tls_client = client_context(config.tls_ca)
            except ValueError as exc:
                await transports.close()
                raise EngineStartError(f"--tls-ca: {exc}") from exc
        self.tls_port = tls_port
        try:
            last = config.rtp_port_high  # a pair (p, p + 1) each, both within the range
            self._pool = PortPool(
                config.rtp_port,
                last if last is not None else min(65535, config.rtp_port + 2 * self._rtp_ports),
            )
        except ValueError as exc:
            await transports.close()
            raise EngineStartError(str(exc)) from exc
        self._transports = transports
        self.local = (host, port)
        try:
            registrations, registrar_addresses = await self._registrations(loop, host, port)
        except (OSError, ValueError) as exc:
            await transports.close()
            self._transports = None
            raise EngineStartError(f"--register: {exc}") from exc
        self.policy = build_policy(config, registrar_addresses)
        self._ua = core.UserAgent(
            policy=self.policy,
            config=core.UaConfig(
                host=config.external_address or host,  # Via sent-by and Contact (behind NAT: the public one)
                port=port,
                send_to_source=config.nat,
                tls_port=tls_port,
                user_agent=config.server_header,
                max_calls=self._max_calls,
                retry_after_s=config.retry_after_s,
                timers=self._timers,
                srtp=config.srtp,  # an offer no answer could accept gets 488 before the 180 (sip.core.offer_answer.check_offer)
                session_expires_s=config.session_expires_s,
            ),
            rng=random.Random(self.rng.getrandbits(64)),
        )
        self._timer = DeadlineTimer(loop, self.clock, self._on_timer)
        # phases: each call's slot 2 ms from the next call's, for inbound latency
        self._media_clock = MediaClockShell(loop, self.clock, phases=MEDIA_PHASES)
        log.info("inbound policy: %s", describe_policy(config))
        log.info(
            "listening on udp %s:%d%s (engine native, at most %d calls per process, RTP ports %d-%d)",
            host,
            port,
            tcp_note,
            self._max_calls,
            self._pool.first,
            self._pool.last,
        )
        now = self.clock()
        for registration in registrations:
            log.info("registering %s at %s:%d", registration.config.aor, *registration.destination)
            self._ua.add_registration(registration, now)
        if registrations:
            self.flush(now)

    async def _registrations(
        self, loop: asyncio.AbstractEventLoop, host: str, port: int
    ) -> tuple[list[Registration], dict[str, tuple[str, ...]]]:
        """One `Registration` per binding of `registration_plan` (RFC 3261 §10), each registrar's name
        resolved once here; and, per trunk, the addresses its registrar resolved to (its calls come from
        there: sip/core/trunks.py)."""
        out: list[Registration] = []
        addresses: dict[str, tuple[str, ...]] = {}
        for binding in registration_plan(self.config):
            uri = parse_uri(binding.aor)
            default_port = 5061 if uri.scheme == "sips" else 5060
            infos = await loop.getaddrinfo(
                uri.host.strip("[]"), uri.port or default_port, type=socket.SOCK_DGRAM
            )
            if not infos:
                raise ValueError(f"cannot resolve {uri.host}")
            destination = (str(infos[0][4][0]), int(infos[0][4][1]))
            ours = binding.external_address or media_address(host, destination[0])
            out.append(
                binding.registration(
                    destination,
                    ours,
                    port,
                    self.config.server_header,
                    random.Random(self.rng.getrandbits(64)),
                )
            )
            if binding.trunk is not None:
                found = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
                addresses[binding.trunk] = addresses.get(binding.trunk, ()) + found
        return out, addresses

    async def dial(
        self,
        target: str,
        *,
        from_uri: str | None = None,
        ring_timeout_s: float | None = 60.0,
        auth_user: str | None = None,
        password: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> NativeLeg:
        """Place a call: INVITE with our offer to `target` (sip:USER@HOST[:PORT]); the leg's events
        are those of an inbound call (MediaStarted once the callee answered, CallEnded with the SIP status when
        it was busy (486), not answered (408 after `ring_timeout_s`) or failed). 401/407 are answered with
        `auth_user`/`password` (default: the registration credentials; `password=""`: none). ValueError for a bad target;
        EngineStartError-free: PortsExhausted/OSError when no RTP port is free."""
        if self._stopping or self._draining:
            raise RuntimeError("the engine is draining: no new calls")
        ua = self.ua
        uri = parse_uri(target)
        if uri.scheme not in ("sip", "sips"):
            raise ValueError(f"expected a sip: URI, got {target!r}")
        # the transport as sip.core.ua's dial chooses it; SDES keys only over TLS (as inbound)
        transport = (uri.transport or ("tls" if uri.scheme == "sips" else "udp")).lower()
        srtp = sdes_policy(self.config.srtp, transport)
        if srtp is None:
            raise ValueError(
                f"--srtp require: a call over {transport} cannot carry SRTP keys (SDES only over TLS); "
                "call a sips: URI or one with ;transport=tls"
            )
        if transport == "tls" and self._transports is not None and self._transports.tls_client is None:
            self._transports.tls_client = client_context(None)  # the system's CAs (--tls-ca: its own)
        loop = asyncio.get_running_loop()
        port = uri.port or (5061 if transport == "tls" else 5060)
        infos = await loop.getaddrinfo(uri.host.strip("[]"), port, type=socket.SOCK_DGRAM)
        if not infos:
            raise ValueError(f"cannot resolve {uri.host}")
        destination = (str(infos[0][4][0]), int(infos[0][4][1]))
        holder: list[NativeLeg] = []
        assert self._pool is not None
        sockets = RtpSocketPair.open(
            loop,
            self.config.host,
            self._pool,
            lambda data, source, t: holder[0]._on_rtp(data, source, t),
            lambda data, source, t: holder[0]._on_rtcp(data, source, t),
            self.clock,
        )
        password = password if password is not None else self.config.register_password
        credentials = None
        if password:  # "": the caller says this call has no credentials (not even the registration's)
            credentials = Credentials(auth_user or self.config.auth_user or (uri.user or "parlora"), password)
        now = self.clock()
        session_id = self.rng.getrandbits(31)
        ours = self.config.external_address or media_address(sockets.host, destination[0])
        local = LocalMedia(
            address=ours, port=sockets.port, session_id=session_id, username="parlora", srtp=srtp
        )
        try:
            call = ua.dial(
                target,
                local,
                now,
                from_uri=from_uri,
                credentials=credentials,
                destination=destination,
                headers=headers,
                ring_timeout_s=ring_timeout_s,
            )
        except Exception:
            sockets.close()
            raise
        host = f"[{destination[0]}]" if ":" in destination[0] else destination[0]
        identity = call_identity(
            call,
            request_uri=target,
            from_uri=from_uri or f"sip:{ua.config.user}@{ua.config.host}",
            to_uri=target,
            sip_call_id=call,
            source=f"{host}:{destination[1]}",
            headers=(("X-Direction", "outbound"),),
            direction="outbound",
        )
        leg = NativeLeg(self, call, identity, None, sockets, peer=destination, transport=transport)
        leg._session_id = session_id
        holder.append(leg)
        self._legs[call] = leg
        log.info("%s: calling %s (INVITE to %s:%d)", call, target, *destination)
        self.flush(now)
        return leg

    def registrations_status(self) -> list[dict[str, object]]:
        """GET /registrations: state, expiry and last error of each binding."""
        ua = self._ua
        if ua is None:
            return []
        now = self.clock()
        return [
            {
                "aor": st.aor,
                "state": st.state,
                "expires_in_s": round(st.expires_in_s, 1) if st.expires_in_s is not None else None,
                "granted_expires_s": st.granted_expires_s,
                "last_status": st.last_status,
                "last_error": st.last_error,
                "failures": st.failures,
                "next_attempt_in_s": (
                    round(max(0, st.next_attempt_at - now) / 1e9, 1)
                    if st.next_attempt_at is not None
                    else None
                ),
                "keepalive": asdict(st.keepalive) if st.keepalive is not None else None,
            }
            for st in ua.registrations(now)
        ]

    def _log_registrations(self, ua: core.UserAgent, now: int) -> None:
        """One log line per change of a registration's state (and why, when it failed)."""
        for st in ua.registrations(now):
            alive = st.keepalive.state if st.keepalive is not None else None
            key = (st.state, st.last_error, st.failures, alive)
            seen = self._reg_seen.get(st.aor)
            if seen == key:
                continue
            self._reg_seen[st.aor] = key
            if st.keepalive is not None and alive != (seen[3] if seen else None) and alive != "idle":
                if alive == "unreachable":
                    log.warning(
                        "registrar of %s stopped answering OPTIONS (%d in a row): registering again",
                        st.aor,
                        st.keepalive.consecutive_failures,
                    )
                else:
                    log.info("registrar of %s answers OPTIONS (%s)", st.aor, st.keepalive.last_status)
            if seen is not None and seen[:3] == key[:3]:
                continue  # only the keepalive changed
            if st.state == "failed":
                log.warning(
                    "registration %s failed (%s, %d in a row); retrying in %.0f s",
                    st.aor,
                    st.last_error,
                    st.failures,
                    max(0, (st.next_attempt_at or now) - now) / 1e9,
                )
            elif st.state == "registered":
                log.info("registered %s (expires in %s s)", st.aor, st.granted_expires_s)
            else:
                log.info("registration %s: %s", st.aor, st.state)

    def drain(self) -> None:
        if self._draining:
            return
        self._draining = True
        if self._ua is not None:
            self._ua.drain()
        log.info(
            "draining: new calls and OPTIONS get 503 (Retry-After %d s); %d live call(s) go on",
            self.config.retry_after_s,
            len(self._legs),
        )

    async def stop(self) -> bool:
        """BYE every answered call (a final 503 to the ringing ones), wait up to STOP_GRACE_S for the answers,
        then close every socket and timer. True when everything was released."""
        if self._ua is None or self._stopping:
            return True
        self._stopping = True
        self._draining = True
        self._ua.drain()
        legs = list(self._legs.values())
        if legs:
            log.info("shutting down: hanging up %d call(s)", len(legs))
        unregistering = self._ua.unregister_all(self.clock())  # REGISTER Expires: 0 (RFC 3261 §10.2.2)
        if unregistering:
            log.info("un-registering %d binding(s)", unregistering)
            self.flush(self.clock())
        # Calls whose leg has ended but whose core call is still finishing (INFO digits before the BYE, a BYE
        # that waits for the ACK) get the same grace: their BYE goes out before the sockets close.
        finishing = sum(1 for call in self._ua.call_ids() if call not in self._legs)
        # one answer each: the 200 to our BYE, the ACK to our 503
        expected = self._received + len(legs) + finishing
        for leg in legs:
            leg.hangup("bridge shutting down")
        await self._wait_for_answers(expected)
        if legs and self._transports is not None and self._transports.stats()["tcp_connections"]:
            # A peer that just answered our BYE over TCP is still finishing its side of the call: closing the
            # connection under it makes it fail the call (SIPp does). Give it a moment.
            await asyncio.sleep(TCP_LINGER_S)
        for leg in list(self._legs.values()):  # whatever the core did not end by itself
            leg._end("bridge shutting down", 503, False, self.clock())
        self._legs.clear()
        if self._timer is not None:
            self._timer.cancel()
        self.media_clock.stop()
        if self._transports is not None:
            await self._transports.close()
        counts = self.counts()
        log.info("native engine stopped: %s", ", ".join(f"{k} {v}" for k, v in counts.items()))
        self._ua = None
        return (
            counts["calls"] == 0
            and counts["rtp_ports"] == 0
            and counts["sip_sockets"] == 0
            and counts["tasks"] == 0
        )

    async def _wait_for_answers(self, expected: int) -> None:
        activity = self._activity
        assert activity is not None
        deadline = asyncio.get_running_loop().time() + STOP_GRACE_S
        while self._received < expected or (
            self._ua is not None and (self._ua.call_ids() or not self._ua.registrations_done)
        ):
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                log.info(
                    "stop: %d answer(s) to our BYEs/responses did not come in %g s (%d call(s) unfinished)",
                    max(0, expected - self._received),
                    STOP_GRACE_S,
                    len(self._ua.call_ids()) if self._ua is not None else 0,
                )
                return
            activity.clear()
            try:
                await asyncio.wait_for(activity.wait(), remaining)
            except TimeoutError:
                pass

    # --- counts (tests, status) ---

    def counts(self) -> dict[str, int]:
        """What the engine holds right now; all zero (but transactions, which end on their own RFC 3261
        timers) once every call has ended and after `stop()`."""
        transports = self._transports.stats() if self._transports is not None else {}
        media = self._media_clock.stats() if self._media_clock is not None else {}
        return {
            "calls": len(self._legs),
            "core_calls": len(self._ua.call_ids()) if self._ua is not None else 0,
            "transactions": self._ua.transactions if self._ua is not None else 0,
            "rtp_ports": self._pool.in_use if self._pool is not None else 0,
            "media_channels": media.get("channels", 0),
            "media_timers": media.get("timers", 0),
            "sip_timers": 1 if self._timer is not None and self._timer.armed else 0,
            "sip_sockets": transports.get("udp_sockets", 0) + transports.get("tcp_servers", 0),
            "tcp_connections": transports.get("tcp_connections", 0),
            "tasks": transports.get("tasks", 0),
            "calls_rejected": self.calls_rejected,
        }

    def stats(self) -> dict[str, int]:
        """The core's counters (parse errors, 503s, retransmissions absorbed, ...) and the shells'."""
        out = dict(self._ua.stats) if self._ua is not None else {}
        if self._transports is not None:
            out.update({f"transport_{k}": v for k, v in self._transports.stats().items()})
        if self._media_clock is not None:
            out.update({f"clock_{k}": v for k, v in self._media_clock.stats().items()})
        out["rtp_before_answer"] = self.rtp_before_answer
        return out

    def sip_status(self) -> dict[str, object]:
        """The `sip` section of the status (GET /sip): listener, inbound policy and its refusal counters, what
        the engine holds now (`held`: calls, transactions, RTP ports, tasks, ...) and every counter of the
        core and its shells (`counters`: parse errors, retransmissions absorbed, timers fired, ...)."""
        ua = self._ua
        stats = ua.stats if ua is not None else {}
        policy = self.policy
        return {
            "engine": "native",
            "listening": f"{self.local[0]}:{self.local[1]}" if self.local is not None else None,
            "draining": self._draining,
            "active_calls": len(self._legs),
            "calls_rejected": self.calls_rejected,
            "registrations": self.registrations_status(),
            "outbound": list(self.outbound_results),
            "limit_hangups": dict(self.limit_hangups),
            "one_way_audio": dict(self.one_way_audio),
            "policy": {
                "allow": list(self.config.allow),
                "drop_unknown": self.config.drop_unknown,
                "inbound_auth": self.config.inbound_auth is not None,
                "invite_rate_per_s": invite_rate(self.config),
                "options_rate_per_s": options_rate(self.config),
                "counters": dict(policy.counters) if policy is not None else {},
                "dropped": stats.get("policy_dropped", 0),
                "challenged": stats.get("policy_challenged", 0),
                "refused_403": stats.get("policy_403", 0),
                "refused_503": stats.get("policy_503", 0),
                "trunks": [  # each trunk's identity and the calls it brought (sip/core/trunks.py); no password
                    {
                        "name": t.name,
                        "allow": list(t.allow),
                        "inbound_user": t.inbound_user,
                        "registrar": t.registrar,
                        "srtp": t.srtp,
                        "nat": t.nat,
                        "external_address": t.external_address,
                        "calls": self.trunk_calls[t.name],
                    }
                    for t in self.config.trunks
                ],
            },
            "held": self.counts(),
            "counters": self.stats(),
        }

    def track_transfer(self, leg: NativeLeg) -> None:
        """Keep `leg`'s transfer timeout on the one timer while its tracker has a deadline."""
        if not leg.ended:
            self._transferring.add(leg)

    def leg(self, call_id: str) -> NativeLeg | None:
        return self._legs.get(call_id)

    # --- the SIP shell loop: input, then flush ---

    def _receive(self, item: Inbound, source: tuple[str, int], ref: TransportRef, now: int) -> None:
        ua = self._ua
        if ua is None:
            return
        self._received += 1
        if isinstance(item, bytes):
            ua.receive(item, source, ref.kind, now)
        else:
            ua.receive_message(item, source, ref.kind, now)
        self.flush(now)
        if self._activity is not None:
            self._activity.set()

    def _on_timer(self, now: int) -> None:
        ua = self._ua
        if ua is None:
            return
        ua.handle_timer(now)
        for leg in list(self._transferring):
            leg._transfer_outputs(leg.transfer_tracker.handle_timer(now), now)
        self.flush(now)

    def flush(self, now: int) -> None:
        """Send what the core wants sent, act on its events, re-arm the one timer (every entry point ends
        here; re-entrant calls from leg commands made while acting on events just mark more work)."""
        if self._flushing:
            self._dirty = True
            return
        ua = self._ua
        transports = self._transports
        if ua is None or transports is None:
            return
        self._flushing = True
        try:
            for _ in range(_MAX_FLUSH_ROUNDS):
                self._dirty = False
                for tx in ua.transmits():
                    transports.send(tx.data, tx.destination, tx.transport)
                events = ua.events()
                for event in events:
                    try:
                        self._on_event(event, now)
                    except Exception:  # a shell bug must not lose the other events
                        log.exception("native engine failed on %s", event)
                if not events and not self._dirty:
                    break
            for tx in ua.transmits():
                transports.send(tx.data, tx.destination, tx.transport)
        finally:
            self._flushing = False
        self._check_rejections(ua)
        if self._registering:
            self._log_registrations(ua, now)
        self._arm(ua)

    def _arm(self, ua: core.UserAgent) -> None:
        deadline = ua.next_deadline()
        done = [
            leg for leg in self._transferring if leg.ended or leg.transfer_tracker.next_deadline() is None
        ]
        for leg in done:
            self._transferring.discard(leg)
        for leg in self._transferring:
            d = leg.transfer_tracker.next_deadline()
            if d is not None and (deadline is None or d < deadline):
                deadline = d
        assert self._timer is not None
        self._timer.arm(deadline)

    def _check_rejections(self, ua: core.UserAgent) -> None:
        rejected = ua.stats["invite_503_max_calls"] + ua.stats["invite_503_draining"]
        if rejected != self._rejected_seen:
            newly = rejected - self._rejected_seen
            self._rejected_seen = rejected
            self.calls_rejected += newly
            why = (
                "the engine is draining"
                if self._draining
                else f"{ua.active_calls} calls are up and the limit is {self._max_calls}"
            )
            log.warning(
                "rejected %d INVITE(s) with 503 Service Unavailable (Retry-After %d s): %s",
                newly,
                self.config.retry_after_s,
                why,
            )

    # --- call events from the core ---

    def _on_event(self, event: core.UaEvent, now: int) -> None:
        if isinstance(event, core.IncomingCall):
            self._incoming(event, now)
            return
        leg = self._legs.get(event.call)
        if leg is None:
            return
        if isinstance(event, core.CallAnswered):
            if event.media is not None:  # else our 200 carried the offer: the ACK brings the answer
                leg._start_media(event.media, now)
        elif isinstance(event, core.CallProgress):  # a call we placed rings
            leg.progress.append(event.status)
            if event.early_media is not None:
                leg.early_media += 1  # early media is played to nobody, but counted
            log.info("%s: %d %s", leg.call, event.status, _printable(event.reason))
        elif isinstance(event, core.CallConfirmed):
            if leg.outbound and not leg.answered:
                leg.answered = True
                log.info("%s: answered", leg.call)
            leg.confirmed = True
            if leg.media is None:
                if event.media is None:
                    log.warning("%s: the ACK brought no usable SDP answer to our offer; hanging up", leg.call)
                    leg.hangup("no usable SDP answer in the ACK")
                    return
                leg._start_media(event.media, now)
            leg._transfer_outputs(leg.transfer_tracker.confirmed(now), now)
        elif isinstance(event, core.CallEnded):
            self._end(leg, event.reason, event.status_code, event.by_remote, now)
        elif isinstance(event, core.CallCancelled):
            self._end(leg, "cancelled", 487, True, now)
        elif isinstance(event, core.CallHeld):
            log.info("%s: the caller put the call on hold", leg.call)
            leg._on_media_change(event.media, MediaHeld())
        elif isinstance(event, core.CallResumed):
            log.info("%s: the caller took the call off hold", leg.call)
            leg._on_media_change(event.media, MediaResumed())
        elif isinstance(event, core.MediaUpdated):
            leg._on_media_change(event.media, None)
        elif isinstance(event, core.DtmfReceived):
            leg._post(DtmfReceived(event.digit))
        elif isinstance(event, core.ReferResponse):
            self._transferring.add(leg)
            leg._transfer_outputs(
                leg.transfer_tracker.refer_response(
                    event.status_code, event.reason, now, refer_sub=event.refer_sub
                ),
                now,
            )
        elif isinstance(event, core.ReferNotify):
            self._transferring.add(leg)
            tracker = leg.transfer_tracker
            if event.status_code:
                outputs = tracker.notify(event.status_code, event.reason, now, terminated=event.terminated)
            else:
                outputs = tracker.subscription_ended(now) if event.terminated else []
            leg._transfer_outputs(outputs, now)
        elif isinstance(event, core.ReferRefused):
            # pjsua2's wording (sip/pjsua2/agent.py), so one grep finds it on either engine
            log.warning("%s: refused the caller's REFER to %s with 403", leg.call, _printable(event.refer_to))
        elif isinstance(event, core.SessionExpired):
            log.warning("%s: the session timer expired without a refresh (RFC 4028); BYE sent", leg.call)

    def _incoming(self, event: core.IncomingCall, now: int) -> None:
        ua = self.ua
        if self._stopping:
            ua.reject(event.call, 503, now, headers=(("Retry-After", str(self.config.retry_after_s)),))
            return
        trunk = event.trunk
        policy = trunk if trunk is not None else self.global_policy
        loop = asyncio.get_running_loop()
        holder: list[NativeLeg] = []
        assert self._pool is not None
        try:
            sockets = RtpSocketPair.open(
                loop,
                self.config.host,
                self._pool,
                lambda data, source, t: holder[0]._on_rtp(data, source, t),
                lambda data, source, t: holder[0]._on_rtcp(data, source, t),
                self.clock,
            )
        except (PortsExhausted, OSError) as exc:
            self.calls_rejected += 1
            log.warning("rejected an INVITE with 503: no RTP port for it (%s)", exc)
            ua.reject(
                event.call,
                503,
                now,
                reason="No Media Port",
                headers=(("Retry-After", str(self.config.retry_after_s)),),
            )
            return
        source = event.source
        host = f"[{source[0]}]" if ":" in source[0] else source[0]
        identity = call_identity(
            event.call,
            request_uri=event.request_uri,
            from_uri=event.from_uri,
            to_uri=event.to_uri,
            sip_call_id=event.sip_call_id,
            source=f"{host}:{source[1]}",
            headers=event.headers,
            trunk=trunk.name if trunk is not None else None,
        )
        if trunk is not None:
            self.trunk_calls[trunk.name] += 1
            log.info("%s: from %s:%d on trunk %s", event.call, source[0], source[1], trunk.name)
        leg = NativeLeg(self, event.call, identity, event, sockets, policy=policy)
        holder.append(leg)
        self._legs[event.call] = leg
        ua.ring(event.call, now)  # 180 at once: the session answers once its provider is connected
        loop.call_soon(self._hand_over, leg)

    def _hand_over(self, leg: NativeLeg) -> None:
        # A call cancelled before this runs is handed over all the same: its events end with CallEnded at once.
        try:
            self._on_call(leg)
        except Exception:
            log.exception("on_call failed for %s; rejecting it", leg.call)
            leg.hangup("the bridge could not take the call", 500)

    def _end(self, leg: NativeLeg, reason: str, status: int, by_remote: bool, now: int) -> None:
        if leg.outbound and not leg.ended:
            outcome = (
                "answered"
                if leg.answered
                else {486: "busy", 600: "busy", 408: "no answer", 487: "cancelled"}.get(status, "failed")
            )
            self.outbound_results.append(
                {
                    "call": leg.call,
                    "to": leg.identity.to_uri,
                    "outcome": outcome,
                    "status": status,
                    "reason": reason,
                }
            )
            if not leg.answered:
                log.info(
                    "%s: outbound call to %s %s (%d %s)",
                    leg.call,
                    leg.identity.to_uri,
                    outcome,
                    status,
                    reason,
                )
        self._legs.pop(leg.call, None)
        self._transferring.discard(leg)
        leg._end(reason, status, by_remote, now)
