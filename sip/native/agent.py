"""The native SIP engine: the sans-I/O user agent (`sip.core.ua`) and RTP streams (`rtp.stream`) behind thin asyncio
shells, one process-wide media clock, every call a `CallLeg`. `serve --engine native`.

Shells and who owns what:
- `sip.native.transport.SipTransports`: UDP and TCP sockets (IPv4 or IPv6, one address); every message goes into
  `UserAgent.receive` / `receive_message` with the source, the transport name and `now`, and every `Transmit`
  the core pulls out goes back through it. ONE `DeadlineTimer` is re-armed after every input at the soonest
  of the core's `next_deadline()` and the transfer trackers' deadlines: never a timer per transaction.
- `sip.native.leg`: every call's `NativeLeg` (the `CallLeg`) and its media shell on the process-wide media
  clock (`rtp.clock.MediaClockShell`), with its RTP/RTCP socket pair (`rtp.endpoint.RtpSocketPair`) taken
  from one `PortPool` (even ports from `EngineConfig.rtp_port` on) when the INVITE arrives.
- `sip.native.trunking`: the registrations (resolved once at start, logged when they change, reported) and the
  inbound policy's status; `sip.native.dialling`: what a call we place needs besides the core.

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
import time
from collections import Counter, deque
from collections.abc import Callable

from rtp.clock import MEDIA_PHASES, MediaClockShell
from rtp.endpoint import PortPool, PortsExhausted, RtpSocketPair
from rtp.speedups import MEDIA_PATH
from sip.core import ua as core
from sip.core.app_headers import HeaderPolicy
from sip.core.framing import StreamFramer
from sip.core.identity import call_identity
from sip.core.native_plan import build_policy, describe_policy
from sip.core.offer_answer import LocalMedia
from sip.core.policy import InboundPolicy
from sip.core.transaction import TimerConfig
from sip.core.trunks import Trunk
from sip.engine import EngineConfig, EngineFeatures, EngineStartError, OnCall
from sip.leg import DtmfReceived, MediaHeld, MediaResumed
from sip.native.dialling import (
    dial_credentials,
    dial_route,
    outbound_identity,
    outbound_outcome,
    resolve_target,
)
from sip.native.early import start_outbound
from sip.native.leg import NativeLeg, media_address
from sip.native.tls import client_context, server_context
from sip.native.transport import DeadlineTimer, Inbound, SipTransports, TransportRef
from sip.native.trunking import RegistrationLog, policy_status, registrations_status, resolve_registrations

log = logging.getLogger("parlora.sip")

DEFAULT_MAX_CALLS = 200
STOP_GRACE_S = 2.0  # how long stop() waits for the answers to its BYEs and final responses
TCP_LINGER_S = 0.2  # then how long TCP connections stay open for the peers to finish
_MAX_FLUSH_ROUNDS = 16
Clock = Callable[[], int]


def _printable(text: str, limit: int = 200) -> str:
    """Peer input for a log line: control characters escaped, bounded."""
    out = text[:limit].encode("unicode_escape").decode("ascii") if not text.isprintable() else text[:limit]
    return out + ("..." if len(text) > limit else "")


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
        self._registration_log = RegistrationLog()
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
        self._header_policy = HeaderPolicy(allow=config.sip_headers)
        # what a call of no trunk gets (and calls we place): the engine's own policy, as a nameless trunk
        self.global_policy = Trunk(
            "",
            allow=config.allow,
            inbound_auth=config.inbound_auth,
            srtp=config.srtp,
            nat=config.nat,
            rtp_source=config.rtp_source,
            external_address=config.external_address,
            codecs=config.codecs,
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
            registrations, registrar_addresses = await resolve_registrations(
                config, loop, host, port, self.rng
            )
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
                codecs=config.codecs,  # a trunk's own list replaces it for its requests (sip.core.incoming)
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
        uri, transport, srtp = dial_route(target, self.config.srtp)
        if transport == "tls" and self._transports is not None and self._transports.tls_client is None:
            self._transports.tls_client = client_context(None)  # the system's CAs (--tls-ca: its own)
        loop = asyncio.get_running_loop()
        destination = await resolve_target(loop, uri, transport)
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
        credentials = dial_credentials(self.config, uri, auth_user, password)
        now = self.clock()
        session_id = self.rng.getrandbits(31)
        ours = self.config.external_address or media_address(sockets.host, destination[0])
        local = LocalMedia(
            address=ours,
            port=sockets.port,
            session_id=session_id,
            username="parlora",
            srtp=srtp,
            codecs=self.global_policy.codecs,
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
        identity = outbound_identity(
            call, target, from_uri or f"sip:{ua.config.user}@{ua.config.host}", destination
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
        return registrations_status(ua, self.clock()) if ua is not None else []

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
        return {
            "engine": "native",
            "media_path": MEDIA_PATH,  # rtp.speedups: "compiled" (rtp/_speedups.c) or "pure"
            "listening": f"{self.local[0]}:{self.local[1]}" if self.local is not None else None,
            "draining": self._draining,
            "active_calls": len(self._legs),
            "calls_rejected": self.calls_rejected,
            "registrations": self.registrations_status(),
            "outbound": list(self.outbound_results),
            "limit_hangups": dict(self.limit_hangups),
            "one_way_audio": dict(self.one_way_audio),
            "policy": policy_status(self.config, self.policy, stats, self.trunk_calls),
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
            self._registration_log.changes(ua, now)
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
            log.info("%s: %d %s", leg.call, event.status, _printable(event.reason))
            if event.early_media is not None:
                leg.early_media += 1
                start_outbound(leg, event.early_media, event.status, now)  # sip/native/early.py
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
            elif event.media is not None:
                leg._start_media(event.media, now)  # the answer after early media (sip/native/early.py)
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
            header_policy=self._header_policy,
            trust_identity_headers=trunk is not None and trunk.trust_identity_headers,
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
            self.outbound_results.append(outbound_outcome(leg, status, reason, now))
        self._legs.pop(leg.call, None)
        self._transferring.discard(leg)
        leg._end(reason, status, by_remote, now)
