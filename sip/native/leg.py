"""One call on the native engine: `NativeLeg`, the `sip.leg.CallLeg` the session sees, and `_CallMedia`, its
media shell. `sip.native.agent.NativeUserAgent` makes the legs and routes the core's call events to them.

- `rtp.endpoint.RtpSocketPair`: one RTP/RTCP socket pair per call, taken from the engine's `PortPool` when the
  INVITE arrives, so the SDP answer names it (`media_address`: the bound address, or the one the kernel routes
  to the peer from). Datagrams go into the call's `RtpStream`: RTP read by the media clock in the call's tick,
  before its slots (`_CallMedia.read_rtp`, stamped with the kernel's receive time; what came before the
  answer is read and counted as the media starts), RTCP by a loop reader.
- `rtp.clock.MediaClockShell`: ONE timer for every call on absolute deadlines (the `rtp.pacer` core), the
  calls spread over `MEDIA_PHASES` phases 2 ms apart (inbound latency: a frame waits at most 2 ms for its phase). Each tick, every answered
  call's `_CallMedia.on_slots` drives its media core (`rtp.media.CallMedia`, sans-I/O: the stream, SRTP, the
  Playout, the call limits): per slot it pulls the caller's frame (`FrameReceived`, handed to the session's
  frame sink in the tick when it set one: `sip.leg.FrameSinkLeg`) and the slot's datagram, sends it with
  `sendto`, and only once `sendto` has returned tells the core, which records the frame in the carrier ledger
  (a failed send is counted, never recorded) (DESIGN §3.2, §11, HR4); a late clock's skipped slots are paid one
  frame a tick; at the core's deadline, RTCP, lost digit ends, the call limits (rtp/limits.py: the BYE, or the
  goodbye and its backstop BYE) and the one-way-audio line. On the clock, a tick's last due slot does not send
  its datagram itself: it queues it on the clock's `rtp.endpoint.SendBatch`, which sends every call's of the
  phase in one call and then records each sent frame in its ledger (`unsent` for a refused one).

A leg reaches its engine only through `LegEngine` (the SIP core, the one flush, the media clock, the counters).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Protocol

from rtp import probe as _probe
from rtp.clock import MediaClockShell
from rtp.dtmf import DtmfDigit
from rtp.endpoint import RtpSocketPair, SendBatch
from rtp.g722 import WIDE_RATE
from rtp.ledger import CarrierLedger
from rtp.media import CallMedia, LimitReached
from rtp.playout import Playout
from rtp.rtcp import QoS
from rtp.srtp import SrtpContext
from rtp.stream import ARRIVAL_WINDOW_MS, OneWayAudio, RtpStream, StreamConfig
from sip.core import ua as core
from sip.core.app_headers import check_app_headers
from sip.core.offer_answer import LocalMedia, NegotiatedMedia
from sip.core.offer_answer import answer as sdp_answer
from sip.core.replaces import accepts_replaces, replaces_refer_to
from sip.core.sdes import SrtpPolicy, sdes_policy
from sip.core.telephony import validate_dtmf_digits, validate_transfer_target
from sip.core.transfer import DialogStage, EndTransferredCall, SendRefer, TransferOutput, TransferTracker
from sip.core.trunks import Trunk
from sip.engine import EngineConfig
from sip.leg import (
    CallEnded,
    CallIdentity,
    DtmfReceived,
    FrameReceived,
    FrameSink,
    LegEvent,
    LegFeatures,
    MediaStarted,
    PlayoutLeg,
    TransferProgress,
)
from sip.native.early import EarlyState, start_inbound
from sip.native.early import answered as early_answered

log = logging.getLogger("parlora.sip")


def _media_rate(codec: str) -> int:
    """The PCM rate a call of `codec` runs at inside: G.722 and Opus at 16 kHz (rtp.g722, rtp.opus), else 8 kHz."""
    return WIDE_RATE if codec in ("G722", "OPUS") else 8000


EARLY_READ_MAX = 64  # datagrams that came before the answer, read and counted as the media starts


class LegEngine(Protocol):
    """What a leg asks of the engine that made it (`sip.native.agent.NativeUserAgent`)."""

    config: EngineConfig
    clock: Callable[[], int]
    rng: random.Random
    global_policy: Trunk  # what a call of no trunk gets
    wallclock_offset_ns: int
    rtp_before_answer: int
    limit_hangups: Counter[str]
    one_way_audio: Counter[str]

    @property
    def ua(self) -> core.UserAgent: ...

    @property
    def media_clock(self) -> MediaClockShell: ...

    def flush(self, now: int) -> None: ...

    def track_transfer(self, leg: NativeLeg) -> None: ...


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
        # the media clock's send batch and the RTP socket it sends from, while the clock serves this call
        self._batch: tuple[SendBatch, socket.socket] | None = None
        leg.sockets.on_rtp = self.on_rtp  # the clock reads 50 datagrams a second per call: straight here

    # the core's figures, read by the leg's status and its CallEnded
    frames_in = property(lambda self: self.core.frames_in)
    frames_out = property(lambda self: self.core.frames_out)
    frames_unsent = property(lambda self: self.core.frames_unsent)
    receives = property(lambda self: self.core.receives)
    held = property(lambda self: self.core.held)
    last_rtp = property(lambda self: self.core.last_rtp)

    def update(self, negotiated: NegotiatedMedia) -> None:
        """A re-INVITE/UPDATE changed the stream: direction, hold, remote address, codec, SRTP keys."""
        self.core.update(
            self._clock(),
            sends=negotiated.sends,
            receives=negotiated.receives,
            held=negotiated.held,
            remote=(negotiated.remote_address, negotiated.remote_port),
        )
        stream = self.stream
        if (negotiated.payload_type, negotiated.telephone_event) != (
            stream.config.payload_type,
            stream.config.dtmf_payload_type,
        ) or negotiated.codec != stream.codec:
            # a new codec in the same clock (the SIP core refuses a re-offer that changes the clock with 488)
            self.core.recodec(negotiated.payload_type, negotiated.codec, negotiated.telephone_event)
            self.codec = negotiated.codec
            self.telephone_event = negotiated.telephone_event is not None
            log.info("%s media: now %s/%d", self._leg.call, negotiated.codec, negotiated.clock_rate)
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

    def join_batch(self, batch: SendBatch | None) -> None:
        """The media clock's send batch (rtp.clock `BatchingChannel`): an IPv4 call queues its tick's last
        datagram there; an IPv6 one (or one off the clock: None) sends each itself."""
        sock = getattr(self._sockets, "batch_socket", None)  # (a test's stand-in sockets have none)
        self._batch = (batch, sock) if batch is not None and sock is not None else None

    @property
    def call_id(self) -> str:
        return self._leg.identity.call_id

    def unsent(self) -> None:
        """The batch's sendto of this call's datagram was refused: counted, never in the ledger."""
        self._sockets.send_errors += 1
        self.core.unsent()

    def on_slots(self, now: int, due: int, skipped: int) -> None:
        """The media clock's tick (rtp.clock): each due slot hands the caller's frame on, then sends ours (the
        last one through the clock's batch, when the call is in one)."""
        core = self.core
        if skipped:
            core.skip(skipped, now)
        batch = self._batch
        for slot in range(due):
            frame = core.pull_frame(now)
            if frame is not None:
                self._leg._post(FrameReceived(frame.pcm, frame.seq, frame.arrival_ns))
                if _probe.ENABLED:  # benchmark instrumentation (PARLORA_PROBE); one test when off
                    _probe.media_in(self._leg.identity.call_id, now, frame.pcm)
            datagram = core.pull_datagram(now)
            if datagram is not None:
                if batch is not None and slot == due - 1:  # (a view of the stream's buffer: the last slot's)
                    batch[0].add(batch[1], datagram, core.to, self)
                elif self._sockets.send_rtp(datagram, core.to):
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

    features = LegFeatures(
        frame_sink=True,
        dialled=True,
        qos=True,
        time_limit=True,
        early_media=True,
        sip_headers=True,
        replaces=True,
    )

    def __init__(
        self,
        agent: LegEngine,
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
        self.early_media = 0  # outbound: 1xx with an SDP answer (early media: sip/native/early.py)
        self.early_state: EarlyState | None = None  # media started before the answer (either direction)
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
        if self.offer is not None:  # the offer decides the answer's codec (RFC 3264): its rate is known now
            local = replace(self.local_media(), key_source=bytes)  # (a prediction: no keys drawn)
            if (predicted := sdp_answer(self.offer, local)) is not None:
                self._identity = replace(identity, media_rate=_media_rate(predicted.media.codec))

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
        if agent.ua.answer(self.call, self.local_media(), now):  # CallAnswered follows, with what was agreed
            self.answered = True
        agent.flush(now)

    def local_media(self) -> LocalMedia:
        """What our SDP answer offers of this call's media (the 183's and the 200's alike)."""
        return LocalMedia(
            address=self.media_address,
            port=self.sockets.port,
            session_id=self._session_id,
            username="parlora",
            srtp=self.srtp_policy,
            codecs=self.policy.codecs,
        )

    def play_early_media(self, audio: str | bytes) -> bool:
        """`sip.leg.EarlyMediaLeg`: 183 with the SDP answer and `audio` until the answer (sip/native/early.py)."""
        return start_inbound(self, audio)

    def hangup(
        self, reason: str = "normal clearing", status: int = 503, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """A BYE once answered, with the application's `headers` (`sip.leg.HeaderedLeg`: ValueError for a bad
        one, nothing sent), else the final response `status` (with Retry-After for a 503)."""
        headers = check_app_headers(headers)
        if self.hangup_requested or self.ended:
            return
        self.hangup_requested = True
        self.hangup_reason = reason
        agent = self.agent
        now = agent.clock()
        if (
            self.answered or self.outbound
        ):  # an outbound call not yet answered: CANCEL (sip.core.ua's bye does it)
            agent.ua.bye(self.call, now, reason, headers)
        else:
            code = status if 300 <= status <= 699 else 480
            headers = (("Retry-After", str(agent.config.retry_after_s)),) if code == 503 else ()
            agent.ua.reject(self.call, code, now, reason=_reason_phrase(reason), headers=headers)
        agent.flush(now)

    def transfer(self, target: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Blind transfer (REFER) per `CallLeg.transfer`, the REFER with the application's `headers`
        (`sip.leg.HeaderedLeg`): ValueError for a malformed target or header, nothing sent."""
        uri = validate_transfer_target(target)
        headers = check_app_headers(headers)
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
        self._transfer_outputs(self.transfer_tracker.start(uri, now, stage, headers), now)
        self.agent.track_transfer(self)  # its timeout is on the engine's one timer
        self.agent.flush(now)

    def accepts_replaces(self) -> bool:
        """`sip.leg.ReplacesLeg`: this inbound call's INVITE declared Replaces and allows REFER."""
        c = None if self.outbound else self.agent.ua.call_of(self.call)
        return c is not None and accepts_replaces(c.invite)

    def replaces_refer_to(self) -> str:
        """`sip.leg.ReplacesLeg`: the Refer-To that replaces this call's dialog at its far end ("" if none)."""
        c = self.agent.ua.call_of(self.call)
        if c is None or self.ended:
            return ""
        try:
            return replaces_refer_to(c.dialog)
        except ValueError:  # a remote target we cannot name (a tel: contact): no Replaces
            return ""

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
            early_answered(
                self, negotiated, now
            )  # the answer of media that started early (sip/native/early.py)
            return
        self.open_media(negotiated, now)
        self.media_answered(negotiated, now)

    def open_media(self, negotiated: NegotiatedMedia, now: int) -> None:
        """The call's RTP stream and its place on the media clock (at the answer, or before it: early media)."""
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
                codec=negotiated.codec,
                clock_rate=negotiated.clock_rate,
                media_rate=_media_rate(negotiated.codec),
                dtmf_payload_type=negotiated.telephone_event,
                wallclock_offset_ns=agent.wallclock_offset_ns,
                nat=self.policy.nat,  # symmetric RTP: latch to the first valid packet's source
                source_policy=self.policy.rtp_source,  # else learn the caller's source (rtp/latch.py)
            ),
            rng.random,
        )
        self.media = _CallMedia(self, stream, negotiated)
        agent.media_clock.add(self.media)

    def media_answered(self, negotiated: NegotiatedMedia, now: int) -> None:
        """The answer: the call limits and the arrival watch start, `MediaStarted`."""
        assert self.media is not None
        config = self.agent.config
        self.media.set_limits(
            now,
            config.max_call_duration_s,
            config.rtp_timeout_s,
            config.hold_timeout_s,
            self._time_limit_grace_s if self._time_limit is not None else None,
        )
        if self.media.receives and not self.media.held:
            self.media.watch_arrival(now)
        log.info(
            "%s media: %s/%d to %s:%d from %s:%d",
            self.call,
            negotiated.codec,
            negotiated.clock_rate,
            negotiated.remote_address,
            negotiated.remote_port,
            self.sockets.host,
            self.sockets.port,
        )
        self._post(MediaStarted(f"{negotiated.codec}/{negotiated.clock_rate}", self.media.stream.media_rate))

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
                if self.agent.ua.refer(self.call, out.target, now, out.headers):
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


def _reason_phrase(reason: str) -> str:
    """A reason text usable in a status line (no CR/LF, bounded)."""
    text = " ".join(reason.split())[:80]
    return text or "Service Unavailable"
