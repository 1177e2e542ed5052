"""The user-agent core: every call of one process, sans-I/O (RFC 3261 §8, §12-§15; RFC 3264, 3311, 3515, 4028,
3581). Bytes and `now` in; datagrams, call events and deadlines out. It reads no clock and does no I/O.

The loop a shell runs (sip/native/agent.py):

    ua = UserAgent(UaConfig(host=..., port=...))
    ua.receive(datagram, source, "udp", now)      # or receive_message() for what a StreamFramer returned
    ua.answer(call, local_media, now)            # commands, from the application
    for t in ua.transmits(): send t.data to t.destination over t.transport
    for e in ua.events(): ...                    # IncomingCall, CallConfirmed, CallEnded, ...
    arm one timer at ua.next_deadline(); when it fires: ua.handle_timer(now)

`transmits()` and `events()` drain; call them after every input. Transports are named by lower-case strings
("udp", "tcp", "tls"); a `Transmit` names the transport it must leave by and, for a response, the address the
request came from (stream shells send it back over that connection, §18.2.2).

The shape: `UserAgent` is a router. It admits a request (the inbound policy, the generic checks), stamps its
Via, and routes it by Call-ID and dialog: an ACK and an in-dialog request to the `sip.core.call.Call` of that dialog
(through the method table `Call.IN_DIALOG`, after the dialog's CSeq check), an out-of-dialog request through
its own table `OUT_OF_DIALOG` (INVITE, OPTIONS, REFER; anything else 481), a CANCEL to the INVITE transaction
it cancels. Responses and timeouts of our client transactions go to the object that sent them (a `Call`, a
`sip.core.outbound.OutboundCall`, a registration); a 2xx retransmitter's ACK timeout to its call. Every per-call
object keeps its own deadline in one scheduler: `next_deadline` is the soonest of those, the transactions' and
the registrations'. What a call does once it exists is in `sip.core.call` (answer, 2xx retransmission, ACK,
re-INVITE/UPDATE and glare, INFO, NOTIFY, BYE, session timers) and `sip.core.outbound` (the calls we place).

What the router answers by itself (the application sees only call events):
- a new INVITE: 100 Trying at once (by its transaction), `IncomingCall`; then the application's `ring`,
  `answer` or `reject` (`sip.core.call`). The core has no ring timeout: the application answers, rejects or hangs
  up every call it is given. Each call's events end with exactly one `CallEnded` or `CallCancelled`. 503 with
  Retry-After while draining or at `max_calls`; 482 for a merged request (§8.2.2.2).
  An INVITE that can never be answered gets 488 at once, before any 180, and never becomes an `IncomingCall`
  (nothing is paid for it: no provider connection, no RTP port): its offer fails `sip.core.offer_answer.check_offer` against
  `UaConfig.codecs`/`srtp`/`crypto_suites` (one reason phrase per cause, with a Warning, RFC 3261 §20.43:
  `sip.core.offer_answer.OFFER_REFUSALS`), or SRTP is required and the INVITE came over a transport that may not carry
  keys ("SRTP Required Over TLS", with or without SDP). An INVITE without SDP (late offer) rings as before.
- CANCEL → 200, and 487 to the INVITE if no final response was sent (`CallCancelled`); else only 200. 481 when
  it matches nothing.
- OPTIONS out of a dialog → 200 with Allow/Accept/Supported, 503 (Retry-After) while draining; in a dialog
  always 200 (a live call's keep-alive must not fail because we drain).
- INFO of a type other than application/dtmf-relay or application/dtmf → 415.
- REFER out of a dialog → 403 (a caller must not make the bridge dial out); in a dialog too (`sip.core.call`).
- Methods: we allow INVITE ACK CANCEL BYE OPTIONS INFO UPDATE REFER NOTIFY. The generic checks of every request
  (483, 405/501 with Allow, 416, 400, 420, 415) and a new INVITE's own (400, 422, 488) are `sip.core.incoming`'s, in
  its order; then the method's own. A message the parser refused with a partial request gets the parser's
  status and reason (400 "Bad CSeq header", 513, 505); one it refused without → dropped and counted. An
  unparseable datagram, a stray response, an unmatched ACK are counted in `stats` and dropped.
- Server / User-Agent: none unless `UaConfig.user_agent` names a product (a scanner such as svmap reads it to
  pick its exploits; by default we name nothing).
- Via: a request's top Via gets `received` and, when it asked with `rport`, `rport` filled (§18.2.1, RFC 3581);
  the responses go to the source address when it asked for rport (or over a stream), else to the source IP and
  the Via's port (§18.2.2).

Counters (`stats`, a Counter; every drop and refusal has one): calls, keepalives, unparseable,
malformed_<status>, retransmissions_absorbed, retransmissions_late, ack_unmatched, ack_duplicate, ack_without_answer, ack_timeout,
responses_unmatched, max_forwards_zero, method_405, method_501, refused_<status> (check_request), merged_482,
invite_503_draining, invite_503_max_calls, options_503_draining, session_interval_422, bad_sdp_400,
malformed_400, invite_488, offer_488_<cause> (sip.core.offer_answer.OfferCause), reoffer_488, glare_491, reinvite_500, cseq_out_of_order_500, no_dialog,
cancel_481, cancel_too_late, refer_refused, refer_unsubscribed, notify_481, notify_489, notify_bad_sipfrag, info_bad_dtmf,
session_expired, timer_b, timer_f, timer_h, transactions_evicted, internal_errors.

Inbound policy: `UserAgent(policy=sip.core.policy.InboundPolicy(...))` is asked about every request
without a To tag except ACK, before any check of the core's own: `Refuse` and `Challenge` are answered
statelessly (§8.2.7; no transaction, so a flood of refused requests costs no state), `Drop` sends nothing;
only `Accept` lets the request on (so a refused INVITE never becomes an `IncomingCall`). Without a policy,
everything is accepted, as before. Counters: policy_dropped, policy_challenged, policy_<status>.
The trunk the policy matched an INVITE to (`Accept.trunk`, sip/core/trunks.py) is the call's: `IncomingCall.trunk`,
its `external_address` in the call's Contact and in the Via of its in-dialog requests, its `nat` in place of
`UaConfig.send_to_source` for them. A call of no trunk keeps `UaConfig`'s.

Calls we place: `dial(target, local_media, now, credentials=...)` sends an INVITE with our offer and returns
the call id; `sip.core.outbound` says what follows (`CallProgress`, `CallConfirmed`, digest retries, CANCEL, forks).
Counters: calls_out, calls_out_answered, calls_out_failed, call_progress, early_media, cancel_sent,
ring_timeout, auth_refused, outbound_2xx_bye, answer_without_sdp, malformed_2xx, prack_* (sip.core.prack).

Registrations (RFC 3261 §10): `add_registration(sip.core.register.Registration(...), now)` carries its REGISTERs
in this UA's client transactions (its timers join `next_deadline`); `registrations(now)` is their status;
`unregister_all(now)` on shutdown (then wait for `registrations_done`). Counter: register_timeout.

Peer input never raises out of `receive`/`receive_message`/`handle_timer`: a fault in the core itself is
counted in `stats["internal_errors"]` and logged, and the message is dropped. Commands raise only for misuse
(a status out of range); a command for a call that has ended returns False.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable
from typing import ClassVar, Protocol

from sip.core.app_headers import Headers as AppHeaders
from sip.core.auth import Credentials
from sip.core.call import Call, Stage
from sip.core.dialog import Dialog, DialogId
from sip.core.headers import parse_via
from sip.core.incoming import Refusal, precheck, vet_invite
from sip.core.message import Message, ParseError, Request, Response, make_response, parse, serialize
from sip.core.offer_answer import LocalMedia, NegotiatedMedia
from sip.core.outbound import OutboundCall
from sip.core.policy import Accept, Challenge, Decision, Drop, Refuse
from sip.core.prack import EarlyAnswer, ReliableProvisionals
from sip.core.register import Registration, RegistrationStatus
from sip.core.registrations import Registrations
from sip.core.server_transaction import ServerInviteTransaction
from sip.core.transaction import (
    AckTimeout,
    ClientTransaction,
    ResponseReceived,
    TransactionTimeout,
    Transmit,
    is_reliable,
    server_key,
)
from sip.core.transaction_layer import TransactionLayer
from sip.core.uabase import ALLOW, ALLOWED, EarlyAnswering, UaContext, parse_dtmf_info, parse_sipfrag, tag_of
from sip.core.uaevents import (
    CallAnswered,
    CallCancelled,
    CallConfirmed,
    CallEnded,
    CallHeld,
    CallProgress,
    CallResumed,
    DtmfReceived,
    IncomingCall,
    MediaUpdated,
    ReferNotify,
    ReferRefused,
    ReferResponse,
    SessionExpired,
    UaConfig,
    UaEvent,
)

log = logging.getLogger("parlora.sip.ua")

__all__ = [
    "ALLOWED",
    "CallAnswered",
    "CallCancelled",
    "CallConfirmed",
    "CallEnded",
    "CallHeld",
    "CallProgress",
    "CallResumed",
    "DtmfReceived",
    "IncomingCall",
    "MediaUpdated",
    "ReferNotify",
    "ReferRefused",
    "ReferResponse",
    "RequestPolicy",
    "SessionExpired",
    "Transmit",
    "UaConfig",
    "UaEvent",
    "UserAgent",
    "parse_dtmf_info",
    "parse_sipfrag",
]


class RequestPolicy(Protocol):
    """What decides on an out-of-dialog request before the core does anything with it (`sip.core.policy`)."""

    def decide(self, request: Request, source: tuple[str, int], now: int) -> Decision: ...


# an out-of-dialog request's handler: (request, source, transport, where responses go, now, the policy's Accept)
Handler = Callable[["UserAgent", Request, tuple[str, int], str, tuple[str, int], int, Accept | None], None]


class UserAgent:
    """All calls of one process: the router (see the module docstring)."""

    # method → handler of a request without a To tag (filled in at the end of the module)
    OUT_OF_DIALOG: ClassVar[dict[str, Handler]]

    def __init__(
        self,
        config: UaConfig | None = None,
        *,
        rng: random.Random | None = None,
        policy: RequestPolicy | None = None,
    ) -> None:
        self.config = config or UaConfig()
        self.policy = policy  # None: every source is accepted (sip.core.policy builds one)
        self._layer = TransactionLayer(
            self.config.timers, max_lingering=self.config.max_lingering_transactions
        )
        self.stats: Counter[str] = Counter()
        self._ctx = UaContext(
            self.config,
            self._layer,
            rng or random.SystemRandom(),
            self.stats,
            call_ended=self._forget,
            outbound_settled=self._settle,
        )
        self._evictions_logged = (0, -1)  # (evicted count, when) at the last log line about them
        self._counter = 0
        self.draining = False
        # the routes: our call id → call; dialog → call; INVITE server transaction → call (for CANCEL);
        # (Call-ID, From tag, CSeq) → call, for 482 (§8.2.2.2); calls we place until their final response
        self._calls: dict[str, Call] = {}
        self._dialogs: dict[DialogId, Call] = {}
        self._by_ist: dict[ServerInviteTransaction, Call] = {}
        self._initial: dict[tuple[str, str, str], Call] = {}
        self._outbound: dict[str, OutboundCall] = {}
        self._registrations = Registrations(self._ctx)  # the registrations we carry (add_registration)

    # --- output ---

    def transmits(self) -> list[Transmit]:
        """What to send, in order (drains)."""
        return self._layer.transmits()

    def events(self) -> list[UaEvent]:
        """What happened to calls, in order (drains)."""
        out, self._ctx.events = self._ctx.events, []
        return out

    def next_deadline(self) -> int | None:
        """The soonest of the transactions' deadlines, the per-call objects' own and the registrations'."""
        layer = self._layer.next_deadline()
        calls = self._ctx.sched.next_deadline()
        registrations = self._registrations.next_deadline()
        return min((t for t in (layer, calls, registrations) if t is not None), default=None)

    @property
    def active_calls(self) -> int:
        """Calls ringing or up (what `max_calls` limits), the ones we placed included."""
        return len(self._outbound) + sum(1 for c in self._calls.values() if c.live)

    @property
    def transactions(self) -> int:
        """Live transactions (for tests and `status`)."""
        return len(self._layer)

    def call_ids(self) -> list[str]:
        return list(self._calls) + [c for c in self._outbound if c not in self._calls]

    def call_of(self, call: str) -> Call | None:  # the dialog object, once there is one (read only)
        return self._calls.get(call)

    # --- input ---

    def receive(self, data: bytes, source: tuple[str, int], transport: str, now: int) -> None:
        """One datagram (or one message a stream shell framed). Never raises."""
        if len(data) <= 4 and not data.strip(b"\r\n"):
            self.stats["keepalives"] += 1  # RFC 5626 CRLF keep-alive
            return
        try:
            message: Message | ParseError = parse(data, max_size=self.config.max_message_size)
        except ParseError as error:
            message = error
        self.receive_message(message, source, transport, now)

    def receive_message(
        self, message: Message | ParseError, source: tuple[str, int], transport: str, now: int
    ) -> None:
        """A message (or the parser's error) from `StreamFramer.feed`. Never raises."""
        transport = transport.lower()
        try:
            if isinstance(message, ParseError):
                self._on_parse_error(message, source, transport, now)
            elif isinstance(message, Request):
                self._on_request(message, source, transport, now)
            else:
                self._on_response(message, now)
            self._after_layer(now)
        except Exception:  # peer input never raises out of the core
            self.stats["internal_errors"] += 1
            log.exception("SIP core failed on a message from %s:%s", *source)

    def handle_timer(self, now: int) -> None:
        """Fire every timer due at `now`: the transactions', then each per-call object's own. Never raises."""
        try:
            self._layer.handle_timer(now)
            self._after_layer(now)
            for obj in self._ctx.sched.pop_due(now):
                obj.fire(now)
                self._ctx.sched.update(obj)
            self._registrations.handle_timer(now)
            self._after_layer(now)
        except Exception:
            self.stats["internal_errors"] += 1
            log.exception("SIP core failed in handle_timer")

    # --- commands (each for one call: the router finds it, the call acts) ---

    def drain(self, on: bool = True) -> None:
        """Refuse new calls and out-of-dialog OPTIONS with 503 (or accept them again)."""
        self.draining = on

    def ring(self, call: str, now: int) -> bool:
        """180 Ringing (with our To tag and Contact; reliable when the INVITE requires 100rel)."""
        c = self._calls.get(call)
        if c is not None and c.stage is Stage.RINGING and ReliableProvisionals.required(c.invite):
            return self._early_answer(c).ring(now)
        return c is not None and c.ring(now)

    def early(self, call: str, local: LocalMedia, now: int) -> NegotiatedMedia | None:
        """183 with our SDP answer (`sip.core.prack.EarlyAnswer`): what was agreed, or None: no 183 went out."""
        c = self._calls.get(call)
        if c is None or c.stage is not Stage.RINGING or c.offer is None:
            return None
        return self._early_answer(c).early(c.offer, local, now)

    def _early_answer(self, c: Call) -> EarlyAnswering:  # made at its first need, kept until the call ends
        answers = self._ctx.early_answers
        if c.id not in answers:
            answers[c.id] = EarlyAnswer(self._ctx, c)
        return answers[c.id]

    def answer(self, call: str, local: LocalMedia, now: int) -> bool:
        """200 OK with our SDP: the answer to the INVITE's offer, or our offer when it had none
        (`CallAnswered` follows). False when the call is not ringing any more, or when the offer has nothing
        in common with `local` (then 488 went out and `CallEnded(488)` follows)."""
        c = self._calls.get(call)
        if c is not None and c.stage is Stage.RINGING and (early := self._ctx.early_answers.get(call)):
            return early.answer(local, now)  # the 183's answer again, maybe after a PRACK (RFC 3262 §3)
        return c is not None and c.answer(local, now)

    def reject(
        self,
        call: str,
        status: int,
        now: int,
        *,
        reason: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> bool:
        """A final error response (300-699) to the ringing INVITE, e.g. 486, 603, 503 with Retry-After."""
        if not 300 <= status <= 699:
            raise ValueError(f"reject needs a status of 300 to 699, got {status}")
        c = self._calls.get(call)
        return c is not None and c.reject(status, now, reason=reason, headers=headers)

    def bye(self, call: str, now: int, reason: str = "normal clearing", headers: AppHeaders = ()) -> bool:
        """End the call: BYE when answered (after the ACK if it has not come yet, §15.1.1), with the application's
        `headers` (sip.core.app_headers `check_app_headers`, checked by the caller); a ringing call gets 480; a
        call we placed that has no final response is cancelled (the CANCEL carries no `headers`: RFC 3261 §9.1).
        `CallEnded(by_remote=False)` follows."""
        if call in self._outbound:
            return self.cancel(call, now, reason)
        c = self._calls.get(call)
        return c is not None and c.bye(now, reason, headers)

    def refer(self, call: str, target: str, now: int, headers: AppHeaders = ()) -> bool:
        """Send a REFER (RFC 3515) with Refer-To `target` (a validated sip:/sips:/tel: URI) and the application's
        `headers` (checked). False when it cannot be sent (the call is not confirmed). Outcomes come as
        `ReferResponse` and `ReferNotify`."""
        c = self._calls.get(call)
        return c is not None and c.refer(target, now, headers)

    def send_info_dtmf(self, call: str, digit: str, now: int, duration_ms: int = 160) -> bool:
        """One digit as INFO application/dtmf-relay; digits queue behind an INFO still in progress."""
        c = self._calls.get(call)
        if c is None or not c.send_info_dtmf(digit, now, duration_ms):
            return False
        self._after_layer(now)
        return True

    def dial(
        self,
        target: str,
        local: LocalMedia,
        now: int,
        *,
        from_uri: str | None = None,
        display: str | None = None,
        credentials: Credentials | None = None,
        destination: tuple[str, int] | None = None,
        transport: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        ring_timeout_s: float | None = None,
    ) -> str:
        """Place a call (`sip.core.outbound.OutboundCall.place` says how); returns its call id."""
        owners = self._ctx.owners
        for old in [tx for tx, o in owners.items() if tx.terminated and isinstance(o, OutboundCall)]:
            del owners[old]
        call = f"call-{self._counter + 1}"
        o = OutboundCall.place(
            self._ctx,
            call,
            target,
            local,
            now,
            from_uri=from_uri,
            display=display,
            credentials=credentials,
            destination=destination,
            transport=transport,
            headers=headers,
            ring_timeout_s=ring_timeout_s,
        )
        self._counter += 1
        self._outbound[call] = o
        return call

    def cancel(self, call: str, now: int, reason: str = "cancelled") -> bool:
        """CANCEL a call we placed that has no final response yet (§9.1: sent once a 1xx came). Its
        `CallEnded(487, by_remote=False)` follows with the 487 (or 64·T1 later without one)."""
        o = self._outbound.get(call)
        if o is None or not o.cancel(now, reason):
            return False
        self._after_layer(now)
        return True

    # --- registrations (RFC 3261 §10, sip.core.register; carried by sip.core.registrations) ---

    def add_registration(self, registration: Registration, now: int) -> None:
        """Carry `registration` over this UA's transactions: its REGISTERs go out now and as it asks, its
        responses and timeouts come back to it, its timers are part of `next_deadline`."""
        self._registrations.add(registration, now)

    def registrations(self, now: int) -> list[RegistrationStatus]:
        """The status of every registration (for `GET /registrations` or the status endpoint)."""
        return self._registrations.status(now)

    def unregister_all(self, now: int) -> int:
        """Shutdown: REGISTER with Expires: 0 for every binding; how many went out (wait until
        `registrations_done`, or a grace period, before closing the sockets)."""
        return self._registrations.stop_all(now)

    @property
    def registrations_done(self) -> bool:
        return self._registrations.done

    # --- requests: admit, stamp, route ---

    def _on_request(self, request: Request, source: tuple[str, int], transport: str, now: int) -> None:
        request, destination = self._stamp_via(request, source, transport)
        if self._layer.absorb(request, now):
            self.stats["retransmissions_absorbed"] += 1
            return
        method = request.method
        if method == "ACK":
            self._on_ack(request, now)
            return
        to_tag = tag_of(request.headers.get("To"))
        admitted: Accept | None = None
        if self.policy is not None and not to_tag:
            admitted = self._admit(request, source, transport, destination, now)
            if admitted is None:
                return
        if self._precheck(request, transport, destination, now):
            return
        if method == "CANCEL":
            self._on_cancel(request, destination, transport, now)
        elif to_tag:
            self._in_dialog(request, to_tag, transport, destination, now)
        elif method in self.OUT_OF_DIALOG:
            self.OUT_OF_DIALOG[method](self, request, source, transport, destination, now, admitted)
        else:
            self.stats["no_dialog"] += 1
            self._ctx.reply(request, 481, transport, destination, now)

    def _admit(
        self,
        request: Request,
        source: tuple[str, int],
        transport: str,
        destination: tuple[str, int],
        now: int,
    ) -> Accept | None:
        """Ask the inbound policy about an out-of-dialog request before anything else: its
        `Accept`, or None when it was refused (answered or dropped here). Refusals and challenges are
        answered statelessly (§8.2.7): a flood of refused requests costs no transaction; a retransmission is
        simply decided again."""
        assert self.policy is not None
        decision = self.policy.decide(request, source, now)
        if isinstance(decision, Accept):
            return decision
        if isinstance(decision, Drop):
            self.stats["policy_dropped"] += 1
            return None
        if request.method == "CANCEL":  # nothing to say to it (RFC 3261 §22.1: never challenged)
            decision = decision if isinstance(decision, Refuse) else Refuse(403, "Forbidden")
        if isinstance(decision, Challenge):
            self.stats["policy_challenged"] += 1
            status, reason, headers = decision.status, None, decision.headers
        else:
            self.stats[f"policy_{decision.status}"] += 1
            status, reason, headers = decision.status, decision.reason, decision.headers
        try:
            response = make_response(
                request,
                status,
                reason,
                to_tag=self._ctx.new_tag(),
                headers=headers + self._ctx.product("Server"),
            )
        except ValueError:
            return None
        self._layer.send_stateless(serialize(response), destination, transport)
        return None

    def _precheck(self, request: Request, transport: str, destination: tuple[str, int], now: int) -> int:
        """Answer a request that fails a generic check (`sip.core.incoming.precheck`); the status sent, or 0."""
        refusal = precheck(request)
        return self._refuse(request, refusal, transport, destination, now) if refusal is not None else 0

    def _refuse(
        self, request: Request, refusal: Refusal, transport: str, destination: tuple[str, int], now: int
    ) -> int:
        status, counter, headers, reason = refusal.status, refusal.counter, refusal.headers, refusal.reason
        return self._ctx.refuse(request, status, transport, destination, now, counter, headers, reason)

    def _on_parse_error(self, error: ParseError, source: tuple[str, int], transport: str, now: int) -> None:
        partial = error.partial
        if partial is None or partial.method == "ACK":
            self.stats["unparseable"] += 1
            return
        self.stats[f"malformed_{error.status}"] += 1
        try:
            request, destination = self._stamp_via(partial, source, transport)
            response = make_response(
                request,
                error.status,
                error.reason,
                to_tag=self._ctx.new_tag() if not tag_of(request.headers.get("To")) else None,
            )
        except ValueError:
            self.stats["unparseable"] += 1
            return
        self._layer.send_stateless(serialize(response), destination, transport)

    def _stamp_via(
        self, request: Request, source: tuple[str, int], transport: str
    ) -> tuple[Request, tuple[str, int]]:
        """§18.2.1 / RFC 3581: `received` (and `rport` when asked) on the top Via; where responses go."""
        vias = request.headers.get_all("Via")
        try:
            top = parse_via(vias[0])
        except (IndexError, ValueError):  # the parser vets the Via; without one there is nowhere to answer
            return request, source
        params: list[tuple[str, str | None]] = [("received", source[0])]
        if top.wants_rport:
            params.append(("rport", str(source[1])))
        stamped = top.with_params(*params)
        headers = request.headers.replaced("Via", ", ".join([str(stamped), *vias[1:]]))
        request = Request(request.method, request.uri, headers, request.body)
        if top.wants_rport or is_reliable(transport):
            return request, source
        return request, (source[0], top.port or 5060)

    def _on_options(
        self,
        request: Request,
        source: tuple[str, int],
        transport: str,
        destination: tuple[str, int],
        now: int,
        admitted: Accept | None,
    ) -> None:
        if self.draining:
            self._ctx.refuse(
                request,
                503,
                transport,
                destination,
                now,
                "options_503_draining",
                (("Retry-After", str(self.config.retry_after_s)),),
            )
            return
        self._ctx.reply(
            request, 200, transport, destination, now, headers=self._ctx.options_headers(transport)
        )

    def _on_refer(
        self,
        request: Request,
        source: tuple[str, int],
        transport: str,
        destination: tuple[str, int],
        now: int,
        admitted: Accept | None,
    ) -> None:
        self.stats["refer_refused"] += 1
        self._ctx.reply(request, 403, transport, destination, now, reason="Forbidden (REFER not accepted)")

    # --- a new INVITE ---

    def _on_invite(
        self,
        request: Request,
        source: tuple[str, int],
        transport: str,
        destination: tuple[str, int],
        now: int,
        admitted: Accept | None,
    ) -> None:
        auth_user, trunk = (admitted.username, admitted.trunk) if admitted is not None else (None, None)
        h = request.headers
        call_id = h.get("Call-ID") or ""
        from_tag = tag_of(h.get("From"))
        cseq = h.get("CSeq") or ""
        merged = self._initial.get((call_id, from_tag, cseq))
        if merged is not None and merged.stage is not Stage.ENDED:
            if server_key(request) == merged.server_tx.key:  # a late retransmission (its transaction is gone)
                self.stats["retransmissions_late"] += 1
                return
            # another branch: a fork
            self._ctx.refuse(request, 482, transport, destination, now, "merged_482")
            return
        retry = (("Retry-After", str(self.config.retry_after_s)),)
        if self.draining:
            self._ctx.refuse(
                request, 503, transport, destination, now, "invite_503_draining", retry, "Draining"
            )
            return
        if self.active_calls >= self.config.max_calls:
            self._ctx.refuse(
                request, 503, transport, destination, now, "invite_503_max_calls", retry, "Too Many Calls"
            )
            return
        vetted = vet_invite(request, self.config, transport, trunk, self._ctx.host_port(transport))
        if isinstance(vetted, Refusal):
            self._refuse(request, vetted, transport, destination, now)
            if vetted.offer is not None:  # nothing is paid for a call that can never be answered
                log.warning(
                    "refused an INVITE from %s:%d%s with 488 %s (%s)",
                    source[0],
                    source[1],
                    f" (trunk {trunk.name})" if trunk is not None else "",
                    vetted.offer.reason,
                    vetted.offer.text,
                )
            return
        local_tag = self._ctx.new_tag()
        host = trunk.external_address if trunk is not None else None  # the trunk's address, else ours
        try:
            dialog = Dialog.uas(
                request,
                local_tag=local_tag,
                local_contact=f"<{self._ctx.local_uri(transport, host)}>",
                transport=transport,
            )
        except ValueError:
            self._ctx.refuse(
                request, 400, transport, destination, now, "malformed_400", reason="Bad Contact header"
            )
            return
        self._counter += 1
        call = f"call-{self._counter}"
        ist = self._layer.server_invite(request, destination, transport, now)
        c = Call(self._ctx, call, request, ist, dialog, source, transport)
        c.host = host
        c.send_to_source = trunk.nat if trunk is not None else self.config.send_to_source
        c.offer = vetted.offer
        c.remote_body = request.body
        self._calls[call] = c
        self._dialogs[dialog.id] = c
        self._by_ist[ist] = c
        self._initial[(call_id, from_tag, cseq)] = c
        self.stats["calls"] += 1
        self._ctx.events.append(
            IncomingCall(
                call=call,
                sip_call_id=call_id,
                request_uri=request.uri,
                from_uri=vetted.from_value.uri,
                from_display=vetted.from_value.display,
                to_uri=vetted.to_value.uri,
                source=source,
                transport=transport,
                headers=h.items(),
                offer=vetted.offer,
                auth_user=auth_user,
                trunk=trunk,
            )
        )

    def _on_cancel(self, request: Request, destination: tuple[str, int], transport: str, now: int) -> None:
        ist = self._layer.invite_for_cancel(request)
        if ist is None:
            self.stats["cancel_481"] += 1
            self._ctx.reply(request, 481, transport, destination, now)
            return
        c = self._by_ist.get(ist)
        to_tag = c.dialog.id.local_tag if c is not None else (ist.to_tag or self._ctx.new_tag())
        # with the INVITE's To tag (§9.2)
        self._ctx.reply(request, 200, transport, destination, now, to_tag=to_tag)
        if ist.final_sent:
            self.stats["cancel_too_late"] += 1
            return
        self._ctx.respond(ist, ist.request, 487, now=now, to_tag=to_tag)
        if c is not None:
            c.cancelled()

    # --- in-dialog requests ---

    def _in_dialog(
        self, request: Request, to_tag: str, transport: str, destination: tuple[str, int], now: int
    ) -> None:
        """Route a request with a To tag to its dialog's call, through the call's method table."""
        h = request.headers
        c = self._dialogs.get(DialogId(h.get("Call-ID") or "", to_tag, tag_of(h.get("From"))))
        if c is None or c.stage is Stage.ENDED:
            self.stats["no_dialog"] += 1
            self._ctx.reply(request, 481, transport, destination, now)
            return
        status = c.dialog.check_request(request)  # §12.2.2
        if status is not None:
            counter = "cseq_out_of_order_500"
            self._ctx.refuse(
                request, status, transport, destination, now, counter, reason="CSeq out of order"
            )
            return
        handler = Call.IN_DIALOG.get(request.method)
        if handler is not None:
            handler(c, request, transport, destination, now)
        else:  # pragma: no cover - _precheck let only ALLOWED through
            self._ctx.reply(request, 405, transport, destination, now, headers=(("Allow", ALLOW),))

    def _on_ack(self, request: Request, now: int) -> None:
        h = request.headers
        c = self._dialogs.get(DialogId(h.get("Call-ID") or "", tag_of(h.get("To")), tag_of(h.get("From"))))
        if c is None:
            self.stats["ack_unmatched"] += 1
            return
        c.on_ack(request, now)

    # --- what our transactions report: routed to the object that sent them ---

    def _on_response(self, response: Response, now: int) -> None:
        if not self._layer.receive_response(response, now):
            self.stats["responses_unmatched"] += 1

    def _after_layer(self, now: int) -> None:
        """Act on what the transaction layer reported (responses, timeouts, evictions)."""
        if self._layer.evicted != self.stats["transactions_evicted"]:
            self._note_evictions(now)
        for event in self._layer.events():
            if isinstance(event, ResponseReceived):
                owner = self._ctx.owners.get(event.transaction)
                if owner is not None:
                    owner.on_response(event.transaction, event.response, now)
            elif isinstance(event, TransactionTimeout):
                tx = event.transaction
                if not isinstance(tx, ClientTransaction):
                    self.stats["timer_h"] += 1  # our non-2xx final was never ACKed
                    continue
                owner = self._ctx.owners.get(tx)
                if not isinstance(owner, Registrations):  # they count their own timeouts
                    self.stats[f"timer_{event.timer.lower()}"] += 1
                if owner is not None:
                    owner.on_response(tx, None, now)
            elif isinstance(event, AckTimeout):
                c = self._ctx.acks_awaited.pop(event.retransmitter, None)
                if c is not None:
                    c.on_ack_timeout(event.retransmitter, now)

    def _note_evictions(self, now: int) -> None:
        """Count the transactions the full table forgot; one log line a minute at most while it goes on."""
        evicted = self._layer.evicted
        self.stats["transactions_evicted"] = evicted
        logged, at = self._evictions_logged
        if at < 0 or now - at >= 60 * 1_000_000_000:
            log.warning(
                "SIP transaction table full (%d answered requests kept for their retransmissions): the "
                "oldest forgotten, %d since the last line (a request flood?)",
                self._layer.lingering,
                evicted - logged,
            )
            self._evictions_logged = (evicted, now)

    # --- the per-call objects tell the router ---

    def _forget(self, c: Call) -> None:
        """`c` ended: its routes go (its transactions live on until their timers end)."""
        self._calls.pop(c.id, None)
        self._dialogs.pop(c.dialog.id, None)
        if c.ist is not None:
            self._by_ist.pop(c.ist, None)
        key = (c.dialog.id.call_id, c.dialog.id.remote_tag, c.invite.headers.get("CSeq") or "")
        if self._initial.get(key) is c:
            del self._initial[key]
        if (early := self._ctx.early_answers.pop(c.id, None)) is not None:
            early.stop()

    def _settle(self, o: OutboundCall) -> None:
        """`o` has its final response: its call (if answered) is routed like any other from now on."""
        self._outbound.pop(o.id, None)
        if o.call is not None:
            self._calls[o.id] = o.call
            self._dialogs[o.call.dialog.id] = o.call


UserAgent.OUT_OF_DIALOG = {
    "INVITE": UserAgent._on_invite,
    "OPTIONS": UserAgent._on_options,
    "REFER": UserAgent._on_refer,
}
