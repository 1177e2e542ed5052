"""The native SIP engine: the sans-I/O user agent (`sip.ua`) and RTP streams (`rtp.stream`) behind thin asyncio
shells, one process-wide media clock, every call a `CallLeg`. `serve --engine native`.

Shells and who owns what:
- `sip.transport.SipTransports`: UDP and TCP sockets (IPv4 or IPv6, one address); every message goes into
  `UserAgent.receive` / `receive_message` with the source, the transport name and `now`, and every `Transmit`
  the core pulls out goes back through it. ONE `DeadlineTimer` is re-armed after every input at the soonest
  of the core's `next_deadline()` and the transfer trackers' deadlines: never a timer per transaction.
- `rtp.endpoint.RtpSocketPair`: one RTP/RTCP socket pair per call, taken from a `PortPool` (even ports from
  `EngineConfig.rtp_port` on) when the INVITE arrives, so the SDP answer names it. Datagrams go into the
  call's `RtpStream`.
- `rtp.clock.MediaClockShell`: ONE timer for every call on absolute deadlines (the `rtp.pacer` core). Each
  slot, every answered call (`_CallMedia.on_slots`) pulls one inbound frame from its jitter buffer
  (`FrameReceived`), takes one frame from its Playout (`Playout.take`: epochs, clear) and sends it with
  `sendto`; only once `sendto` has returned is the frame recorded in the carrier ledger (`Playout.transmitted`,
  with the time it returned; a failed send is counted, never recorded) (DESIGN §3.2, §11, HR4).

Call flow: INVITE → 100 (the core) and 180 at once → `on_call(leg)` → `leg.answer()` sends the 200 with the SDP
answer and starts the media (`MediaStarted`). BYE either way, CANCEL → 487, re-INVITE hold/resume →
`MediaHeld`/`MediaResumed`, INFO or RFC 4733 digits → `DtmfReceived`, REFER via `sip.transfer`. The last
event of every leg is `CallEnded` with the frame counts. `stop()` BYEs every live call, waits briefly for the
answers, and closes every socket, timer and task; `counts()` proves they are back to zero.

Everything runs on the one asyncio loop that ran `start()`: the session's `enqueue`/`clear` and the media
clock's `take`/`transmitted` never run at the same time, so the Playout's lock is never contended.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import AsyncIterator, Callable

from rtp.clock import MediaClockShell
from rtp.dtmf import DtmfDigit
from rtp.endpoint import PortPool, PortsExhausted, RtpSocketPair
from rtp.g711 import alaw_encode, ulaw_encode
from rtp.ledger import CarrierLedger
from rtp.playout import Playout
from rtp.rtcp import QoS
from rtp.stream import PCMU, RtpStream, StreamConfig
from sip import sdp
from sip import ua as core
from sip.engine import EngineConfig, EngineStartError, OnCall
from sip.identity import call_identity
from sip.leg import (
    CallEnded,
    CallIdentity,
    DtmfReceived,
    FrameReceived,
    LegEvent,
    MediaHeld,
    MediaResumed,
    MediaStarted,
    PlayoutLeg,
    TransferProgress,
)
from sip.message import StreamFramer
from sip.telephony import validate_dtmf_digits, validate_transfer_target
from sip.transaction import TimerConfig
from sip.transfer import DialogStage, EndTransferredCall, SendRefer, TransferOutput, TransferTracker
from sip.transport import DeadlineTimer, Inbound, SipTransports, TransportRef

log = logging.getLogger("parlora.sip")

DEFAULT_MAX_CALLS = 200
STOP_GRACE_S = 2.0  # how long stop() waits for the answers to its BYEs and final responses
TCP_LINGER_S = 0.2  # then how long TCP connections stay open for the peers to finish
_MAX_FLUSH_ROUNDS = 16
Clock = Callable[[], int]


class _CallMedia:
    """One answered call's media: its RTP stream core, its socket pair and its Playout, served by the clock."""

    def __init__(self, leg: NativeLeg, stream: RtpStream, negotiated: sdp.NegotiatedMedia) -> None:
        self._leg = leg
        self.stream = stream
        self._sockets = leg.sockets
        self._playout = leg.playout
        self._clock = leg.agent.clock
        self._encode = ulaw_encode if negotiated.payload_type == PCMU else alaw_encode
        self.sends = negotiated.sends
        self.receives = negotiated.receives
        self.held = negotiated.held
        self.telephone_event = negotiated.telephone_event is not None
        self.codec = negotiated.codec
        self.frames_out = 0
        self.frames_in = 0
        self.frames_unsent = 0  # taken from the Playout but sendto failed: never in the ledger

    def update(self, negotiated: sdp.NegotiatedMedia) -> None:
        """A re-INVITE/UPDATE changed the stream: direction, hold, remote address."""
        self.sends = negotiated.sends
        self.receives = negotiated.receives
        self.held = negotiated.held
        self.stream.signal((negotiated.remote_address, negotiated.remote_port))

    def on_slots(self, now: int, due: int, skipped: int) -> None:
        stream = self.stream
        if skipped:
            stream.skip(skipped)
        for _ in range(due):
            frame = stream.pull_frame(now)
            if frame is not None and not self.held and self.receives:
                self.frames_in += 1
                self._leg._post(FrameReceived(frame.pcm, frame.seq, frame.arrival_ns))
            if not self.sends:  # on hold (we are recvonly / inactive): RTP time goes on, nothing is sent
                stream.skip(1)
                continue
            out = self._playout.take() if stream.wants_audio(now) else None
            datagram = stream.next_packet(self._encode(out.pcm) if out is not None else None, now)
            destination = stream.destination
            if (
                datagram is not None
                and destination is not None
                and self._sockets.send_rtp(datagram, destination)
            ):
                if out is not None:
                    # handed to the kernel: transmitted, at the time sendto returned (DESIGN §11, HR4)
                    self._playout.transmitted(out, self._clock())
                    self.frames_out += 1
            elif out is not None:
                self.frames_unsent += 1
        deadline = stream.next_deadline()
        if deadline is not None and deadline <= now:
            self._leg._stream_timer(now)

    def on_rtp(self, data: bytes, source: tuple[str, int], now: int) -> None:
        stream = self.stream
        event = stream.receive(data, source, now)
        if isinstance(event, DtmfDigit):
            self._leg._post(DtmfReceived(event.digit))
            deadline = stream.next_deadline()
            if deadline is not None and deadline <= now:  # a second digit ended by the same packet: now
                self._leg._stream_timer(now)

    def on_rtcp(self, data: bytes, source: tuple[str, int], now: int) -> None:
        self.stream.receive_rtcp(data, source, now)


class NativeLeg(PlayoutLeg):
    """One incoming call on the native engine (implements `sip.leg.CallLeg`). Lives on the asyncio loop."""

    def __init__(
        self,
        agent: NativeUserAgent,
        call: str,
        identity: CallIdentity,
        incoming: core.IncomingCall,
        sockets: RtpSocketPair,
    ) -> None:
        super().__init__(Playout(CarrierLedger()))
        self.agent = agent
        self.call = call
        self._identity = identity
        self.offer = incoming.offer
        self.transport = incoming.transport
        self.sockets = sockets
        self.media_address = media_address(sockets.host, incoming.source[0])
        self.media: _CallMedia | None = None
        self.transfer_tracker = TransferTracker(int(agent.config.transfer_timeout_s * 1e9))
        self._queue: asyncio.Queue[LegEvent] = asyncio.Queue()
        self.answered = False
        self.confirmed = False
        self.ended = False
        self.hangup_requested = False
        self.hangup_reason = ""
        self._session_id = agent.rng.getrandbits(31)

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
        """200 OK with the SDP answer (the call rang with 180 since the INVITE)."""
        if self.ended or self.answered:
            return
        agent = self.agent
        now = agent.clock()
        local = sdp.LocalMedia(
            address=self.media_address, port=self.sockets.port, session_id=self._session_id, username="parlora"
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
        if self.answered:
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
        for digit in digits:
            self.agent.ua.send_info_dtmf(self.call, digit, now)
        self.agent.flush(now)

    # --- status ---

    def qos(self) -> QoS | None:
        """RTCP figures for `status()["qos"]` (None before the media started)."""
        return self.media.stream.qos() if self.media is not None else None

    def media_counters(self) -> dict[str, int]:
        media = self.media
        if media is None:
            return {}
        return {**media.stream.counters(), "frames_unsent": media.frames_unsent}

    # --- engine side ---

    def _post(self, event: LegEvent) -> None:
        self._queue.put_nowait(event)

    def _start_media(self, negotiated: sdp.NegotiatedMedia, now: int) -> None:
        if self.media is not None:
            return
        agent = self.agent
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
            ),
            rng.random,
        )
        self.media = _CallMedia(self, stream, negotiated)
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

    def _stream_timer(self, now: int) -> None:
        media = self.media
        if media is None:
            return
        for item in media.stream.handle_timer(now):
            if isinstance(item, DtmfDigit):
                self._post(DtmfReceived(item.digit))
            else:
                destination = media.stream.rtcp_destination
                if destination is not None:
                    self.sockets.send_rtcp(item, destination)

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

    def _on_media_change(self, negotiated: sdp.NegotiatedMedia, event: LegEvent | None) -> None:
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
            destination = media.stream.rtcp_destination
            if destination is not None:
                self.sockets.send_rtcp(media.stream.goodbye(now), destination)  # RFC 3550 §6.6
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
        self.calls_rejected = 0
        self.rtp_before_answer = 0

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
        if self._tcp:
            try:
                await transports.listen_tcp(host, port)
                tcp_note = " and tcp"
            except OSError as exc:
                log.warning("no SIP over TCP: cannot listen on tcp %s:%d: %s", host, port, exc)
        try:
            self._pool = PortPool(config.rtp_port, min(65535, config.rtp_port + 2 * self._rtp_ports))
        except ValueError as exc:
            await transports.close()
            raise EngineStartError(str(exc)) from exc
        self._transports = transports
        self.local = (host, port)
        self._ua = core.UserAgent(
            core.UaConfig(
                host=host,
                port=port,
                user_agent=config.user_agent,
                max_calls=self._max_calls,
                retry_after_s=config.retry_after_s,
                timers=self._timers,
            ),
            rng=random.Random(self.rng.getrandbits(64)),
        )
        self._timer = DeadlineTimer(loop, self.clock, self._on_timer)
        self._media_clock = MediaClockShell(loop, self.clock)
        log.info(
            "listening on udp %s:%d%s (engine native, at most %d calls per process, RTP ports %d-%d)",
            host,
            port,
            tcp_note,
            self._max_calls,
            self._pool.first,
            self._pool.last,
        )

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
        while self._received < expected or (self._ua is not None and self._ua.call_ids()):
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
        elif isinstance(event, core.CallConfirmed):
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
            # pjsua2's wording (sip/pjsua2_agent.py), so one grep finds it on either engine
            log.warning("%s: refused the caller's REFER to %s with 403", leg.call, _printable(event.refer_to))
        elif isinstance(event, core.SessionExpired):
            log.warning("%s: the session timer expired without a refresh (RFC 4028); BYE sent", leg.call)

    def _incoming(self, event: core.IncomingCall, now: int) -> None:
        ua = self.ua
        if self._stopping:
            ua.reject(event.call, 503, now, headers=(("Retry-After", str(self.config.retry_after_s)),))
            return
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
        )
        leg = NativeLeg(self, event.call, identity, event, sockets)
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
        self._legs.pop(leg.call, None)
        self._transferring.discard(leg)
        leg._end(reason, status, by_remote, now)
