"""The user-agent core: every call of one process, sans-I/O (RFC 3261 §8, §12-§15; RFC 3264, 3311, 3515, 4028,
3581). Bytes and `now` in; datagrams, call events and deadlines out. It reads no clock and does no I/O.

The loop a shell runs (sip/native.py):

    ua = UserAgent(UaConfig(host=..., port=...))
    ua.receive(datagram, source, "udp", now)      # or receive_message() for what a StreamFramer returned
    ua.answer(call, local_media, now)            # commands, from the application
    for t in ua.transmits(): send t.data to t.destination over t.transport
    for e in ua.events(): ...                    # IncomingCall, CallConfirmed, CallEnded, ...
    arm one timer at ua.next_deadline(); when it fires: ua.handle_timer(now)

`transmits()` and `events()` drain; call them after every input. Transports are named by lower-case strings
("udp", "tcp", "tls"); a `Transmit` names the transport it must leave by and, for a response, the address the
request came from (stream shells send it back over that connection, §18.2.2).

What the core answers by itself (the application sees only call events):
- a new INVITE: 100 Trying at once (by its transaction), `IncomingCall`; then the application's `ring`,
  `answer` (200 with the SDP answer, or with our offer when the INVITE had none: the answer comes in the ACK;
  `CallAnswered`, then `CallConfirmed` at the ACK) or `reject`. The core has no ring timeout: the application
  answers, rejects or hangs up every call it is given. Each call's events end with exactly one `CallEnded`
  or `CallCancelled`. 503 with Retry-After while draining or at `max_calls`; 482 for a merged request (§8.2.2.2).
  An INVITE that can never be answered gets 488 at once, before any 180, and never becomes an `IncomingCall`
  (nothing is paid for it: no provider connection, no RTP port): its offer fails `sip.sdp.check_offer` against
  `UaConfig.codecs`/`srtp`/`crypto_suites` (one reason phrase per cause, with a Warning, RFC 3261 §20.43:
  `sip.sdp.OFFER_REFUSALS`), or SRTP is required and the INVITE came over a transport that may not carry
  keys ("SRTP Required Over TLS", with or without SDP). An INVITE without SDP (late offer) rings as before.
- the 2xx is retransmitted until the ACK (§13.3.1.4); no ACK within 64·T1 → BYE and `CallEnded(408)`.
- CANCEL → 200, and 487 to the INVITE if no final response was sent (`CallCancelled`); else only 200. 481 when
  it matches nothing.
- BYE → 200 (`CallEnded(by_remote=True)`); `bye()` sends ours (after the ACK if the 200 is still unacknowledged).
- re-INVITE and UPDATE: answered at once (no 100) from the call's local media; a=sendonly / inactive / c=0.0.0.0 →
  `CallHeld`, back → `CallResumed`, any other new SDP → `MediaUpdated`; 488 when the new offer has nothing in
  common; 491 when our own re-INVITE/UPDATE is in progress (glare, §14.2; ours is retried after 0-2 s, as the
  UA that does not own the Call-ID); 500 with Retry-After when an earlier INVITE has no final response yet.
- session timers (RFC 4028): a Session-Expires below our Min-SE → 422 with Min-SE; otherwise the caller's
  interval and refresher are accepted. When the caller asks for none we ask for `UaConfig.session_expires_s`
  (§9): with refresher=uac (and Require: timer) when it supports "timer", else refresher=uas (§9: a UAC without
  the extension cannot refresh, so we do: a caller that vanished never answers our refresh, and the call ends).
  We refresh at half the interval (UPDATE when the caller allows it, else re-INVITE with our unchanged SDP); an
  interval that passes unrefreshed (less min(32 s, interval/3), §10) → BYE, `SessionExpired`, `CallEnded`; a
  refresh answered 408/481 → BYE (408) and `CallEnded`. With `session_expires_s` 0 we ask for no timer.
- OPTIONS out of a dialog → 200 with Allow/Accept/Supported, 503 (Retry-After) while draining; in a dialog
  always 200 (a live call's keep-alive must not fail because we drain).
- INFO application/dtmf-relay (or application/dtmf) → 200 and `DtmfReceived`; other INFO bodies → 415.
- REFER from the peer → 403 (a caller must not make the bridge dial out). NOTIFY for our REFER's implicit
  subscription → 200 and `ReferNotify` (the sipfrag's status); other NOTIFYs → 481 or 489.
- Methods: we allow INVITE ACK CANCEL BYE OPTIONS INFO UPDATE REFER NOTIFY. A method of RFC 3261 or a standard
  extension that we do not do (REGISTER, SUBSCRIBE, PUBLISH, MESSAGE, PRACK) → 405 with Allow; a method no RFC
  we know defines → 501 with Allow (§8.2.1: 405 is for methods the UAS recognises).
- Checks, in this order: Max-Forwards 0 → 483 (the project's rule; RFC 4475 "zeromf" would have an endpoint
  process it); method (405/501); the checks of `sip.message.check_request` (416, 400 bare branch, 420 with
  Unsupported, 415 with Accept); then the method's own. A message the parser refused with a partial request
  gets the parser's status and reason (400 "Bad CSeq header", 513, 505); one it refused without → dropped
  and counted. An unparseable datagram, a stray response, an unmatched ACK are counted in `stats` and dropped.
- Server / User-Agent: none unless `UaConfig.user_agent` names a product (a scanner such as svmap reads it to
  pick its exploits; by default we name nothing).
- Via: a request's top Via gets `received` and, when it asked with `rport`, `rport` filled (§18.2.1, RFC 3581);
  the responses go to the source address when it asked for rport (or over a stream), else to the source IP and
  the Via's port (§18.2.2).

Counters (`stats`, a Counter; every drop and refusal has one): calls, keepalives, unparseable,
malformed_<status>, retransmissions_absorbed, retransmissions_late, ack_unmatched, ack_duplicate, ack_without_answer, ack_timeout,
responses_unmatched, max_forwards_zero, method_405, method_501, refused_<status> (check_request), merged_482,
invite_503_draining, invite_503_max_calls, options_503_draining, session_interval_422, bad_sdp_400,
malformed_400, invite_488, offer_488_<cause> (sip.sdp.OfferCause), reoffer_488, glare_491, reinvite_500, cseq_out_of_order_500, no_dialog,
cancel_481, cancel_too_late, refer_refused, refer_unsubscribed, notify_481, notify_489, notify_bad_sipfrag, info_bad_dtmf,
session_expired, timer_b, timer_f, timer_h, transactions_evicted, internal_errors.

Inbound policy (issue 14): `UserAgent(policy=sip.policy.InboundPolicy(...))` is asked about every request
without a To tag except ACK, before any check of the core's own: `Refuse` and `Challenge` are answered
statelessly (§8.2.7; no transaction, so a flood of refused requests costs no state), `Drop` sends nothing;
only `Accept` lets the request on (so a refused INVITE never becomes an `IncomingCall`). Without a policy,
everything is accepted, as before. Counters: policy_dropped, policy_challenged, policy_<status>.
The trunk the policy matched an INVITE to (`Accept.trunk`, sip/trunks.py) is the call's: `IncomingCall.trunk`,
its `external_address` in the call's Contact and in the Via of its in-dialog requests, its `nat` in place of
`UaConfig.send_to_source` for them. A call of no trunk keeps `UaConfig`'s.

Calls we place (UAC, §8.1, §9.1, §13.2, §22): `dial(target, local_media, now, credentials=...)` sends an
INVITE with our offer and returns the call id. A 1xx above 100 → `CallProgress` (early media when it carries
an SDP answer); the 2xx → ACK (again for each retransmitted 2xx) and `CallConfirmed`: from then on the call
is like an answered inbound one (BYE either way, re-INVITE/UPDATE, INFO, REFER, session timers from the 2xx's
Session-Expires). The INVITE offers a session timer (RFC 4028 §7.1: Supported: timer, Session-Expires
`session_expires_s`, Min-SE `min_se_s`; none with 0); a 422 → the INVITE again with the 422's Min-SE as
both (§7.4, at most twice); a 2xx with refresher=uac (or none named) makes us the refresher, refresher=uas
the callee; a 2xx without Session-Expires means no timer (§7.2). A non-2xx final → `CallEnded(status_code=that status, by_remote=True)`; 401/407 → the
INVITE again with credentials (`sip.auth.DigestClient`), and `CallEnded(401/407, "bad credentials")` when
they are refused; Timer B → `CallEnded(408)`; `ring_timeout_s` → CANCEL and `CallEnded(408, "no answer ...")`;
`cancel()` (or `bye()` before the answer) → CANCEL once a 1xx came, `CallEnded(487, by_remote=False)` at the
487 (or 64·T1 later). A 2xx that crosses our CANCEL, or a second 2xx from a fork, is ACKed and BYEd.
Counters: calls_out, calls_out_answered, calls_out_failed, call_progress, early_media, cancel_sent,
ring_timeout, auth_refused, outbound_2xx_bye, answer_without_sdp, malformed_2xx.

Registrations (RFC 3261 §10): `add_registration(sip.register.Registration(...), now)` carries its REGISTERs
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
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from sip.auth import AuthAnswer, Credentials, DigestClient
from sip.dialog import Dialog, DialogId
from sip.message import (
    MAX_MESSAGE_SIZE,
    Headers,
    Message,
    ParseError,
    Request,
    Response,
    check_request,
    make_response,
    parse,
    parse_cseq,
    parse_name_addr,
    parse_via,
    serialize,
)
from sip.policy import Accept, Challenge, Decision, Drop, Refuse
from sip.register import Registration, RegistrationStatus
from sip.sdp import (
    DEFAULT_CRYPTO_SUITES,
    OFFER_REFUSALS,
    LocalMedia,
    NegotiatedMedia,
    OfferRefusal,
    SdpError,
    SessionDescription,
    SrtpPolicy,
    accept_answer,
    check_offer,
    parse_sdp,
    sdes_policy,
    serialize_sdp,
)
from sip.sdp import answer as sdp_answer
from sip.sdp import offer as sdp_offer
from sip.transaction import (
    DEFAULT_MAX_LINGERING,
    AckTimeout,
    ClientTransaction,
    ResponseReceived,
    Retransmit2xx,
    Scheduler,
    ServerInviteTransaction,
    ServerTransaction,
    Timed,
    TimerConfig,
    TransactionLayer,
    TransactionTimeout,
    Transmit,
    is_reliable,
    server_key,
)
from sip.trunks import Trunk
from sip.uri import parse_uri

log = logging.getLogger("parlora.sip.ua")

__all__ = [
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
    "ReferResponse",
    "RequestPolicy",
    "SessionExpired",
    "Transmit",
    "UaConfig",
    "UaEvent",
    "UserAgent",
]

ALLOWED = ("INVITE", "ACK", "CANCEL", "BYE", "OPTIONS", "INFO", "UPDATE", "REFER", "NOTIFY")
ALLOW = ", ".join(ALLOWED)
# Methods other RFCs define that this UA does not do: 405 (anything else is 501).
KNOWN_NOT_ALLOWED = frozenset({"REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE", "PRACK"})
SUPPORTED_OPTIONS = ("timer",)
SUPPORTED = ", ".join(SUPPORTED_OPTIONS)
DTMF_TYPES = ("application/dtmf-relay", "application/dtmf")
_SECOND = 1_000_000_000
_DTMF_SIGNALS = {str(i): str(i) for i in range(10)} | {"*": "*", "#": "#", "10": "*", "11": "#"}
_DTMF_SIGNALS |= {c: c for c in "ABCD"} | {str(12 + i): c for i, c in enumerate("ABCD")}


# --- configuration, events ---


@dataclass(frozen=True, slots=True)
class UaConfig:
    """How this UA presents itself and what it accepts.

    `host`/`port`: the address written into our Via and Contact (the advertised address behind NAT).
    `max_calls`: calls in progress (ringing or up) beyond which a new INVITE gets 503 with `retry_after_s`.
    `session_expires_s`: the session interval (RFC 4028) we ask for when the caller asks for none (as UAS)
    and offer on the calls we place (as UAC); 0: we never ask for a session timer (one the peer asks for is
    still honoured: we say `Supported: timer`). `min_se_s`: the smallest interval we accept (§5: at least 90).
    `codecs`, `srtp`, `crypto_suites`: what the application's `LocalMedia` will accept (its codecs, the
    configured SRTP policy before `sip.sdp.sdes_policy` applies the call's transport, its suites): a new
    INVITE's offer is checked against them when it arrives (`sip.sdp.check_offer`), so an offer that can
    never be answered gets 488 before any 180 and never becomes an `IncomingCall`.
    `send_to_source`: send in-dialog requests to the address the INVITE came from instead of the route set /
    remote target (a caller behind NAT with a private Contact); off by default (RFC 3261 behaviour).
    `max_lingering_transactions`: server transactions kept after their final response only to absorb
    retransmissions, beyond which the oldest is forgotten (`sip.transaction.TransactionLayer`; counted in
    `stats["transactions_evicted"]`).
    """

    host: str = "127.0.0.1"
    port: int = 5060
    user: str = "bridge"
    user_agent: str | None = None  # the Server / User-Agent field; None: none at all (nothing to fingerprint)
    max_calls: int = 200
    retry_after_s: int = 30
    timers: TimerConfig = field(default_factory=TimerConfig)
    max_message_size: int = MAX_MESSAGE_SIZE
    session_expires_s: int = 1800
    min_se_s: int = 90
    send_to_source: bool = False
    tls_port: int | None = None  # our TLS listener's port (issue 14): Via and Contact of TLS requests/dialogs
    codecs: tuple[str, ...] = ("PCMU", "PCMA")
    srtp: SrtpPolicy = "off"
    crypto_suites: tuple[str, ...] = DEFAULT_CRYPTO_SUITES
    max_lingering_transactions: int = DEFAULT_MAX_LINGERING


@dataclass(frozen=True, slots=True)
class IncomingCall:
    """A new INVITE; the call rings (100 sent) until `ring`/`answer`/`reject`. `offer` is the SDP offer, or
    None when the INVITE had none (then `answer` sends an offer and the ACK brings the answer)."""

    call: str
    sip_call_id: str
    request_uri: str
    from_uri: str
    from_display: str | None
    to_uri: str
    source: tuple[str, int]
    transport: str
    headers: tuple[tuple[str, str], ...]
    offer: SessionDescription | None
    auth_user: str | None = None  # the user the inbound policy's digest check authenticated (issue 14)
    trunk: Trunk | None = None  # the trunk the policy matched the INVITE to (sip/trunks.py), None: none


@dataclass(frozen=True, slots=True)
class CallAnswered:
    """`answer()` sent the 200. `local` is the SDP in it; `media` what was agreed, or None when the 200
    carried our offer (the INVITE had none): then `CallConfirmed` brings it with the ACK's answer."""

    call: str
    local: SessionDescription
    media: NegotiatedMedia | None


@dataclass(frozen=True, slots=True)
class CallConfirmed:
    """The ACK for our 200 arrived: the call is up. `media` is the session's agreed media (from our answer,
    or from the answer the ACK carried to our offer); None when we offered and the ACK brought no usable
    answer (RFC 3264 allows no rejection there: hang up)."""

    call: str
    media: NegotiatedMedia | None


@dataclass(frozen=True, slots=True)
class CallCancelled:
    """The caller cancelled before we answered (200 to the CANCEL, 487 to the INVITE sent). Like `CallEnded`
    it is the call's last event: no `CallEnded` follows."""

    call: str


@dataclass(frozen=True, slots=True)
class CallEnded:
    """The call is over: `by_remote` when the caller (or the network) ended it. `status_code` is 200 for a BYE,
    the final response we sent for an unanswered call, 408 for no ACK or an expired session."""

    call: str
    reason: str
    status_code: int
    by_remote: bool


@dataclass(frozen=True, slots=True)
class CallHeld:
    """A re-INVITE/UPDATE put the call on hold (sendonly, inactive, or c=0.0.0.0); `remote` is its SDP."""

    call: str
    media: NegotiatedMedia


@dataclass(frozen=True, slots=True)
class CallResumed:
    """A re-INVITE/UPDATE took the call off hold."""

    call: str
    media: NegotiatedMedia


@dataclass(frozen=True, slots=True)
class MediaUpdated:
    """The caller changed its SDP (address, port, codec) without a hold change: what is agreed now."""

    call: str
    media: NegotiatedMedia


@dataclass(frozen=True, slots=True)
class DtmfReceived:
    """A digit from an INFO (application/dtmf-relay or application/dtmf)."""

    call: str
    digit: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class ReferResponse:
    """The final response to our REFER (408 when it got none). `refer_sub` False when a 2xx said
    "Refer-Sub: false" (RFC 4488: no subscription, so no NOTIFY will come). Feed it to
    `sip.transfer.TransferTracker.refer_response`."""

    call: str
    status_code: int
    reason: str
    refer_sub: bool


@dataclass(frozen=True, slots=True)
class ReferNotify:
    """A NOTIFY of our REFER's subscription: the sipfrag's status line (RFC 3515 §2.4.5) and whether its
    Subscription-State ended the subscription. status_code 0: no readable sipfrag (then `terminated` means
    the subscription ended without a final report). Feed it to `TransferTracker.notify`."""

    call: str
    status_code: int
    reason: str
    terminated: bool


@dataclass(frozen=True, slots=True)
class ReferRefused:
    """The caller sent a REFER in the call's dialog and we refused it with 403 (we never dial for a caller:
    toll fraud). `refer_to` is its Refer-To value as it came (peer input: for a log line, not to act on)."""

    call: str
    refer_to: str


@dataclass(frozen=True, slots=True)
class SessionExpired:
    """The session interval passed without a refresh (RFC 4028 §10): a BYE went out; `CallEnded` follows."""

    call: str


@dataclass(frozen=True, slots=True)
class CallProgress:
    """A provisional response (180, 183, ...) to a call we placed (`UserAgent.dial`). `early_media` is what
    an SDP answer in it agreed (early media; None without one)."""

    call: str
    status: int
    reason: str
    early_media: NegotiatedMedia | None


UaEvent = (
    IncomingCall
    | CallProgress
    | CallAnswered
    | CallConfirmed
    | CallCancelled
    | CallEnded
    | CallHeld
    | CallResumed
    | MediaUpdated
    | DtmfReceived
    | ReferResponse
    | ReferNotify
    | ReferRefused
    | SessionExpired
)


# --- per-call state ---


class _Stage(Enum):
    RINGING = "ringing"  # INVITE received, no final response
    ANSWERED = "answered"  # 2xx sent, ACK not in
    CONFIRMED = "confirmed"
    ENDING = "ending"  # ended for the application; a BYE waits for the ACK (§15.1.1)
    ENDED = "ended"


class _Call(Timed):
    """One call (its INVITE dialog). Its `deadline` is the soonest of its session timer and glare retry."""

    def __init__(
        self,
        call_id: str,
        invite: Request,
        ist: ServerInviteTransaction | None,
        dialog: Dialog,
        source: tuple[str, int],
        transport: str,
        response_destination: tuple[str, int],
    ) -> None:
        super().__init__()
        self.id = call_id
        self.invite = invite
        self.ist = ist
        self.dialog = dialog
        self.source = source
        self.transport = transport
        self.response_destination = response_destination
        self.stage = _Stage.RINGING
        self.host: str | None = None  # the address in our Contact and Via for this call (None: UaConfig.host)
        self.send_to_source = False  # in-dialog requests to `source` (its trunk's NAT mode, or UaConfig's)
        self.no_contact = invite.headers.get("Contact") is None  # a broken peer: send to where it came from
        self.peer_allow = frozenset(m.strip().upper() for m in invite.headers.get_all("Allow"))
        self.peer_supports_timer = _has_option(invite, "Supported", "timer") or _has_option(
            invite, "Require", "timer"
        )
        # media
        self.offer: SessionDescription | None = None  # the peer's offer waiting for our answer
        self.local_media: LocalMedia | None = None
        self.local_sdp: SessionDescription | None = None  # what we sent last (o= version, refreshes)
        self.remote_body = b""  # the peer's last SDP body, to tell a refresh from a change
        self.media: NegotiatedMedia | None = None
        self.held = False
        self.offer_in_2xx = False  # our 2xx carried the offer (`local_sdp`): the ACK carries the answer
        # 2xx reliability (§13.3.1.4)
        self.retransmitter: Retransmit2xx | None = None
        self.ack_cseq = 0  # CSeq of the INVITE whose 2xx awaits its ACK
        # our own requests
        self.our_offer: ClientTransaction | None = None  # our re-INVITE/UPDATE in progress (glare)
        self.our_acks: dict[ClientTransaction, bytes] = {}
        self.retry_at: int | None = None
        self.bye_pending: str | None = None  # reason of a bye() that waits for the ACK
        self.bye_after_info: str | None = None  # reason of a bye() that waits for the queued INFO digits
        self.info_queue: list[tuple[str, int]] = []
        self.info_tx: ClientTransaction | None = None
        self.refer_active = False  # our REFER's subscription may NOTIFY
        # session timer (RFC 4028)
        self.interval_s: int | None = None
        self.we_refresh = False
        self.refresh_at: int | None = None  # we send a refresh then
        self.expire_at: int | None = None  # the peer's refresh must have come by then

    @property
    def server_tx(self) -> ServerInviteTransaction:
        """The INVITE server transaction of a call we answer (calls we placed have none: never RINGING)."""
        assert self.ist is not None, "an outbound call has no INVITE server transaction"
        return self.ist

    def rearm(self) -> None:
        times = [t for t in (self.refresh_at, self.expire_at, self.retry_at) if t is not None]
        self.deadline = min(times) if times else None

    def fire(self, now: int) -> None:  # the UserAgent dispatches call timers itself
        raise AssertionError("call timers are dispatched by UserAgent.handle_timer")


def _has_option(message: Message, header: str, option: str) -> bool:
    return any(v.strip().lower() == option for v in message.headers.get_all(header))


def _tag_of(value: str | None) -> str:
    if not value:
        return ""
    try:
        return parse_name_addr(value).tag or ""
    except ValueError:
        return ""


def _parse_sdp(body: bytes) -> SessionDescription | None:
    try:
        return parse_sdp(body)
    except (SdpError, ValueError):
        return None


def _media_key(media: NegotiatedMedia) -> tuple[object, ...]:
    """What the media shell acts on: a change in any of these is a `MediaUpdated`."""
    return (
        media.codec,
        media.payload_type,
        media.telephone_event,
        media.remote_address,
        media.remote_port,
        media.direction,
    )


def _content_type(message: Message) -> str:
    return (message.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()


def _session_expires(message: Message) -> tuple[int | None, str | None]:
    """(delta-seconds, refresher) of Session-Expires (RFC 4028 §4), or (None, None); ValueError if bad."""
    value = message.headers.get("Session-Expires")
    if value is None:
        return None, None
    number, _, params = value.partition(";")
    if not number.strip().isdigit():
        raise ValueError("bad Session-Expires")
    refresher: str | None = None
    for param in params.split(";"):
        name, _, val = param.partition("=")
        if name.strip().lower() == "refresher":
            refresher = val.strip().lower()
            if refresher not in ("uac", "uas"):
                raise ValueError("bad Session-Expires refresher")
    return int(number.strip()), refresher


def _session_expires_or_none(message: Message) -> tuple[int | None, str | None]:
    try:
        return _session_expires(message)
    except ValueError:
        return None, None


def _min_se(message: Message) -> int | None:
    value = message.headers.get("Min-SE")
    if value is None:
        return None
    number = value.split(";", 1)[0].strip()
    if not number.isdigit():
        raise ValueError("bad Min-SE")
    return int(number)


def parse_sipfrag(body: bytes) -> tuple[int, str] | None:
    """The status line of a message/sipfrag body (RFC 3420): "SIP/2.0 180 Ringing" → (180, "Ringing")."""
    line = body.split(b"\n", 1)[0].strip().decode("utf-8", "replace")
    parts = line.split(" ", 2)
    if len(parts) < 2 or parts[0].upper() != "SIP/2.0" or not parts[1].isdigit() or len(parts[1]) != 3:
        return None
    status = int(parts[1])
    if not 100 <= status <= 699:
        return None
    return status, parts[2].strip() if len(parts) > 2 else ""


def parse_dtmf_info(content_type: str, body: bytes) -> tuple[str, int] | None:
    """(digit, duration ms) of an INFO body: application/dtmf-relay ("Signal=5\\r\\nDuration=160") or
    application/dtmf ("5"); None when no DTMF digit is in it."""
    text = body.decode("utf-8", "replace")
    if content_type == "application/dtmf":
        signal, duration = text.strip(), 160
    else:
        signal, duration = "", 160
        for line in text.splitlines():
            name, _, value = line.partition("=")
            key = name.strip().lower()
            if key == "signal":
                signal = value.strip()
            elif key == "duration" and value.strip().isdigit():
                duration = int(value.strip())
    digit = _DTMF_SIGNALS.get(signal.upper())
    return (digit, duration) if digit is not None else None


class RequestPolicy(Protocol):
    """What decides on an out-of-dialog request before the core does anything with it (`sip.policy`)."""

    def decide(self, request: Request, source: tuple[str, int], now: int) -> Decision: ...


class _Outbound(Timed):
    """A call we placed (`dial`) until its final response: the INVITE in progress and how to retry or cancel
    it. Its `deadline` is the soonest of the ringing timeout and the give-up after a CANCEL (§9.1)."""

    def __init__(
        self,
        call_id: str,
        invite: Request,
        local: LocalMedia,
        local_sdp: SessionDescription,
        destination: tuple[str, int],
        transport: str,
        auth: DigestClient | None,
    ) -> None:
        super().__init__()
        self.id = call_id
        self.invite = invite  # the INVITE now in progress (a challenge replaces it)
        self.tx: ClientTransaction | None = None
        self.local = local
        self.local_sdp = local_sdp
        self.destination = destination
        self.transport = transport
        self.auth = auth
        self.auth_tries = 0
        self.timer_retries = 0  # INVITEs sent again for a 422 (RFC 4028 §7.4)
        self.provisional = False  # a 1xx came: a CANCEL may go out (§9.1)
        self.cancel_reason: str | None = None  # set when we cancel (or the ringing timeout did)
        self.cancel_status = 487
        self.cancel_sent = False
        self.ring_at: int | None = None
        self.give_up_at: int | None = None
        self.early: NegotiatedMedia | None = None
        self.call: _Call | None = None  # the call its 2xx made
        # remote tag → the ACK of that 2xx and where it went (sent again for each retransmission of the 2xx)
        self.ack: dict[str, tuple[bytes, tuple[str, int], str]] = {}
        self.ended = False

    def rearm(self) -> None:
        times = [t for t in (self.ring_at, self.give_up_at) if t is not None]
        self.deadline = min(times) if times else None

    def fire(self, now: int) -> None:  # the UserAgent dispatches these timers itself
        raise AssertionError("outbound call timers are dispatched by UserAgent.handle_timer")


# --- the user agent ---


class UserAgent:
    """All calls of one process (see the module docstring)."""

    def __init__(
        self,
        config: UaConfig | None = None,
        *,
        rng: random.Random | None = None,
        policy: RequestPolicy | None = None,
    ) -> None:
        self.config = config or UaConfig()
        self.policy = policy  # None: every source is accepted (sip.policy builds one)
        self._rng = rng or random.SystemRandom()
        self._layer = TransactionLayer(
            self.config.timers, max_lingering=self.config.max_lingering_transactions
        )
        self._evictions_logged = (0, -1)  # (evicted count, when) at the last log line about them
        self._sched = Scheduler()
        self._events: list[UaEvent] = []
        self._calls: dict[str, _Call] = {}
        self._dialogs: dict[DialogId, _Call] = {}
        self._by_ist: dict[ServerInviteTransaction, _Call] = {}
        self._by_retransmitter: dict[Retransmit2xx, _Call] = {}
        self._pending: dict[ClientTransaction, tuple[_Call, str]] = {}
        self._initial: dict[tuple[str, str, str], _Call] = {}  # (Call-ID, From tag, CSeq) → call, for 482
        self._counter = 0
        self.draining = False
        self.stats: Counter[str] = Counter()
        # calls we place (dial) until their final response, and their INVITE/CANCEL transactions
        self._outbound: dict[str, _Outbound] = {}
        self._out_tx: dict[ClientTransaction, _Outbound] = {}
        # registrations we carry (add_registration) and their REGISTER transactions
        self._registrations: list[Registration] = []
        self._reg_tx: dict[ClientTransaction, Registration] = {}

    # --- output ---

    def transmits(self) -> list[Transmit]:
        """What to send, in order (drains)."""
        return self._layer.transmits()

    def events(self) -> list[UaEvent]:
        """What happened to calls, in order (drains)."""
        out, self._events = self._events, []
        return out

    def next_deadline(self) -> int | None:
        layer = self._layer.next_deadline()
        calls = self._sched.next_deadline()
        times = [t for t in (layer, calls) if t is not None]
        times.extend(d for d in (r.next_deadline() for r in self._registrations) if d is not None)
        return min(times) if times else None

    @property
    def active_calls(self) -> int:
        """Calls ringing or up (what `max_calls` limits), the ones we placed included."""
        return len(self._outbound) + sum(
            1 for c in self._calls.values() if c.stage in (_Stage.RINGING, _Stage.ANSWERED, _Stage.CONFIRMED)
        )

    @property
    def transactions(self) -> int:
        """Live transactions (for tests and `status`)."""
        return len(self._layer)

    def call_ids(self) -> list[str]:
        return list(self._calls) + [c for c in self._outbound if c not in self._calls]

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
        """Fire every timer due at `now`. Never raises."""
        try:
            self._layer.handle_timer(now)
            self._after_layer(now)
            for obj in self._sched.pop_due(now):
                if isinstance(obj, _Call):
                    self._call_timer(obj, now)
                    self._sched.update(obj)
                elif isinstance(obj, _Outbound):
                    self._outbound_timer(obj, now)
                    self._sched.update(obj)
            for registration in self._registrations:
                deadline = registration.next_deadline()
                if deadline is not None and deadline <= now:
                    registration.handle_timer(now)
                    self._pump_registration(registration, now)
            self._after_layer(now)
        except Exception:
            self.stats["internal_errors"] += 1
            log.exception("SIP core failed in handle_timer")

    # --- commands ---

    def drain(self, on: bool = True) -> None:
        """Refuse new calls and out-of-dialog OPTIONS with 503 (or accept them again)."""
        self.draining = on

    def ring(self, call: str, now: int) -> bool:
        """180 Ringing (with our To tag and Contact)."""
        c = self._calls.get(call)
        if c is None or c.stage is not _Stage.RINGING:
            return False
        self._respond(
            c.server_tx,
            c.invite,
            180,
            headers=self._establishing_headers(c),
            now=now,
            to_tag=c.dialog.id.local_tag,
        )
        return True

    def answer(self, call: str, local: LocalMedia, now: int) -> bool:
        """200 OK with our SDP: the answer to the INVITE's offer, or our offer when it had none
        (`CallAnswered` follows). False when the call is not ringing any more, or when the offer has nothing
        in common with `local` (then 488 went out and `CallEnded(488)` follows)."""
        c = self._calls.get(call)
        if c is None or c.stage is not _Stage.RINGING:
            return False
        if c.offer is not None:
            result = sdp_answer(c.offer, local)
            if result is None:
                self.stats["invite_488"] += 1
                self._respond(
                    c.server_tx,
                    c.invite,
                    488,
                    now=now,
                    to_tag=c.dialog.id.local_tag,
                    headers=(("Warning", '304 - "no common media format"'),),
                )
                self._end(c, "no common media format", 488, by_remote=False)
                return False
            local_sdp, c.media, c.held = result.description, result.media, result.media.held
            c.offer = None
        else:
            local_sdp = sdp_offer(local)
            c.offer_in_2xx = True
        c.local_media = local
        c.local_sdp = local_sdp
        headers = self._establishing_headers(c) + self._session_timer_response(c, c.invite)
        response = make_response(
            c.invite,
            200,
            to_tag=c.dialog.id.local_tag,
            headers=headers + (("Content-Type", "application/sdp"),),
            body=serialize_sdp(local_sdp),
        )
        self._send_2xx(c, c.server_tx, response, now)
        c.stage = _Stage.ANSWERED
        self._events.append(CallAnswered(c.id, local_sdp, c.media))
        return True

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
        if c is None or c.stage is not _Stage.RINGING:
            return False
        self._respond(
            c.server_tx, c.invite, status, reason, headers=headers, now=now, to_tag=c.dialog.id.local_tag
        )
        self._end(c, reason or f"rejected with {status}", status, by_remote=False)
        return True

    def bye(self, call: str, now: int, reason: str = "normal clearing") -> bool:
        """End the call: BYE when answered (after the ACK if it has not come yet, §15.1.1); a ringing call gets
        480. `CallEnded(by_remote=False)` follows at once."""
        if call in self._outbound:  # a call we placed that has no final response: CANCEL it
            return self.cancel(call, now, reason)
        c = self._calls.get(call)
        if c is None:
            return False
        if c.stage is _Stage.RINGING:
            return self.reject(call, 480, now, reason="Temporarily Unavailable")
        if c.stage is _Stage.ANSWERED:
            if c.info_queue:  # digits wait for the ACK, and the BYE follows the last of them
                c.bye_after_info = reason
            else:
                c.bye_pending = reason
            c.stage = _Stage.ENDING
            self._events.append(CallEnded(c.id, reason, 200, by_remote=False))
            return True
        if c.stage is not _Stage.CONFIRMED:
            return False
        if c.info_tx is not None:
            # INFO digits are still going out (one in flight, maybe more queued): the CallLeg contract sends
            # every digit asked for before the BYE, so the BYE follows the last INFO's final response.
            c.bye_after_info = reason
            c.stage = _Stage.ENDING
            self._events.append(CallEnded(c.id, reason, 200, by_remote=False))
            return True
        self._send_bye(c, now)
        self._end(c, reason, 200, by_remote=False)
        return True

    def refer(self, call: str, target: str, now: int) -> bool:
        """Send a REFER (RFC 3515) with Refer-To `target` (a validated sip:/sips:/tel: URI). False when it
        cannot be sent (the call is not confirmed). Outcomes come as `ReferResponse` and `ReferNotify`."""
        c = self._calls.get(call)
        if c is None or c.stage is not _Stage.CONFIRMED:
            return False
        refer_to = target if target.startswith("<") else f"<{target}>"
        headers = (("Refer-To", refer_to), ("Referred-By", f"<{self._local_uri(host=c.host)}>"))
        c.refer_active = False
        self._send_in_dialog(c, "REFER", now, headers=headers, purpose="REFER")
        return True

    def send_info_dtmf(self, call: str, digit: str, now: int, duration_ms: int = 160) -> bool:
        """One digit as INFO application/dtmf-relay; digits queue behind an INFO still in progress."""
        c = self._calls.get(call)
        if c is None or c.stage not in (_Stage.ANSWERED, _Stage.CONFIRMED):
            return False
        if digit.upper() not in _DTMF_SIGNALS.values():
            raise ValueError(f"not a DTMF digit: {digit!r}")
        c.info_queue.append((digit.upper(), duration_ms))  # while the ACK is not in, they wait for it
        if c.info_tx is None and c.stage is _Stage.CONFIRMED:
            self._next_info(c, now)
        self._after_layer(now)
        return True

    # --- calls we place (UAC, §8.1, §13.2) ---

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
        """Place a call to `target` (a sip:/sips: URI) with our SDP offer from `local`; returns the call id.

        Events: `CallProgress` for each 1xx above 100 (with early media when a 183 carries an answer), then
        `CallConfirmed(media)` once a 2xx came and our ACK went out (the call is up, as an answered inbound
        call is), or `CallEnded(status_code=the final status)` for a failure: 486 busy, 408 when nothing
        answered (Timer B) or `ring_timeout_s` passed (then we CANCEL), 487 after `cancel`, 401/407
        "bad credentials" when a challenge could not be answered. 401/407 with `credentials` → the INVITE is
        sent again with them (a new CSeq, `sip.auth.DigestClient`). `destination` overrides where the INVITE
        goes (an outbound proxy; default the target's host and port, a name for the shell to resolve);
        `from_uri` is our identity (default sip:USER@HOST of the config; trunks often want the account)."""
        uri = parse_uri(target)  # ValueError for a bad target: a misuse
        if uri.scheme not in ("sip", "sips"):
            raise ValueError(f"dial needs a sip: or sips: URI, got {target!r}")
        tp = (transport or uri.transport or ("tls" if uri.scheme == "sips" else "udp")).lower()
        if destination is None:
            destination = (uri.param("maddr") or uri.host, uri.port or (5061 if tp == "tls" else 5060))
        for old in [tx for tx in self._out_tx if tx.terminated]:
            del self._out_tx[old]
        self._counter += 1
        call = f"call-{self._counter}"
        offer_sdp = sdp_offer(local)
        ours = from_uri or f"sip:{self.config.user}@{self._host_port()}"
        name = f'"{display}" ' if display else ""
        items: list[tuple[str, str]] = [
            ("Via", self._via(tp)),
            ("Max-Forwards", "70"),
            ("From", f"{name}<{ours}>;tag={self._new_tag()}"),
            ("To", f"<{target}>"),
            ("Call-ID", f"{self._rng.getrandbits(96):024x}@{self.config.host}"),
            ("CSeq", "1 INVITE"),
            ("Contact", f"<{self._local_uri(tp)}>"),
            ("Allow", ALLOW),
            ("Supported", SUPPORTED),
            *self._offered_timer(self.config.session_expires_s),
            *self._product("User-Agent"),
            *headers,
            ("Content-Type", "application/sdp"),
        ]
        invite = Request("INVITE", target, Headers(items), serialize_sdp(offer_sdp))
        auth = DigestClient(credentials, rng=self._rng) if credentials is not None else None
        o = _Outbound(call, invite, local, offer_sdp, destination, tp, auth)
        if ring_timeout_s is not None:
            o.ring_at = now + int(ring_timeout_s * _SECOND)
        self._outbound[call] = o
        self.stats["calls_out"] += 1
        self._send_invite(o, now)
        o.rearm()
        self._sched.update(o)
        return call

    def cancel(self, call: str, now: int, reason: str = "cancelled") -> bool:
        """CANCEL a call we placed that has no final response yet (§9.1: sent once a 1xx came). Its
        `CallEnded(487, by_remote=False)` follows with the 487 (or 64·T1 later without one)."""
        o = self._outbound.get(call)
        if o is None or o.ended or o.cancel_reason is not None:
            return False
        o.cancel_reason = reason
        self._cancel_if_possible(o, now)
        self._after_layer(now)
        return True

    # --- registrations (RFC 3261 §10, sip.register) ---

    def add_registration(self, registration: Registration, now: int) -> None:
        """Carry `registration` over this UA's transactions: its REGISTERs go out now and as it asks, its
        responses and timeouts come back to it, its timers are part of `next_deadline`."""
        self._registrations.append(registration)
        registration.start(now)
        self._pump_registration(registration, now)

    def registrations(self, now: int) -> list[RegistrationStatus]:
        """The status of every registration (for `GET /registrations` or the status endpoint)."""
        return [r.status(now) for r in self._registrations]

    def unregister_all(self, now: int) -> int:
        """Shutdown: REGISTER with Expires: 0 for every binding; how many went out (wait until
        `registrations_done`, or a grace period, before closing the sockets)."""
        sent = 0
        for registration in self._registrations:
            if registration.stop(now):
                sent += 1
            self._pump_registration(registration, now)
        return sent

    @property
    def registrations_done(self) -> bool:
        return all(r.done for r in self._registrations)

    def _pump_registration(self, registration: Registration, now: int) -> None:
        for out in registration.requests():
            tx = self._layer.send_request(out.request, out.destination, out.transport.lower(), now)
            self._reg_tx[tx] = registration

    # --- requests ---

    def _on_request(self, request: Request, source: tuple[str, int], transport: str, now: int) -> None:
        request, destination = self._stamp_via(request, source, transport)
        if self._layer.absorb(request, now):
            self.stats["retransmissions_absorbed"] += 1
            return
        method = request.method
        if method == "ACK":
            self._on_ack(request, now)
            return
        auth_user: str | None = None
        trunk: Trunk | None = None
        if self.policy is not None and not _tag_of(request.headers.get("To")):
            admitted = self._admit(request, source, transport, destination, now)
            if admitted is None:
                return
            auth_user, trunk = admitted.username, admitted.trunk
        status = self._precheck(request, source, transport, destination, now)
        if status:
            return
        if method == "CANCEL":
            self._on_cancel(request, destination, transport, now)
            return
        to_tag = _tag_of(request.headers.get("To"))
        if to_tag:
            self._in_dialog(request, to_tag, source, transport, destination, now)
            return
        if method == "INVITE":
            self._on_invite(request, source, transport, destination, now, auth_user=auth_user, trunk=trunk)
        elif method == "OPTIONS":
            self._on_options(request, transport, destination, now, in_dialog=False)
        elif method == "REFER":
            self.stats["refer_refused"] += 1
            self._reply(request, 403, transport, destination, now, reason="Forbidden (REFER not accepted)")
        else:
            self.stats["no_dialog"] += 1
            self._reply(request, 481, transport, destination, now)

    def _admit(
        self,
        request: Request,
        source: tuple[str, int],
        transport: str,
        destination: tuple[str, int],
        now: int,
    ) -> Accept | None:
        """Ask the inbound policy about an out-of-dialog request before anything else (issue 14): its
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
                to_tag=self._new_tag(),
                headers=headers + self._product("Server"),
            )
        except ValueError:
            return None
        self._layer.send_stateless(serialize(response), destination, transport)
        return None

    def _precheck(
        self,
        request: Request,
        source: tuple[str, int],
        transport: str,
        destination: tuple[str, int],
        now: int,
    ) -> int:
        """Answer a request that fails a generic check; the status sent, or 0."""
        method = request.method
        mf = request.headers.get("Max-Forwards")
        if mf is not None and mf.strip().isdigit() and int(mf) == 0:
            return self._refuse(request, 483, transport, destination, now, "max_forwards_zero")
        if method not in ALLOWED:
            status = 405 if method in KNOWN_NOT_ALLOWED else 501
            return self._refuse(
                request, status, transport, destination, now, f"method_{status}", (("Allow", ALLOW),)
            )
        accepted: tuple[str, ...]
        if method in ("INVITE", "UPDATE"):
            accepted = ("application/sdp",)
        elif method == "INFO":
            accepted = DTMF_TYPES
        elif method == "NOTIFY":
            accepted = ("message/sipfrag",)
        else:
            accepted = ("application/sdp", "message/sipfrag", *DTMF_TYPES)
        rejection = check_request(request, supported_options=SUPPORTED_OPTIONS, accepted_types=accepted)
        if rejection is not None:
            return self._refuse(
                request,
                rejection.status,
                transport,
                destination,
                now,
                f"refused_{rejection.status}",
                rejection.headers,
                rejection.reason,
            )
        return 0

    def _refuse(
        self,
        request: Request,
        status: int,
        transport: str,
        destination: tuple[str, int],
        now: int,
        counter: str,
        headers: tuple[tuple[str, str], ...] = (),
        reason: str | None = None,
    ) -> int:
        self.stats[counter] += 1
        self._reply(request, status, transport, destination, now, reason=reason, headers=headers)
        return status

    def _reply(
        self,
        request: Request,
        status: int,
        transport: str,
        destination: tuple[str, int],
        now: int,
        *,
        reason: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        to_tag: str | None = None,
        body: bytes = b"",
    ) -> ServerTransaction:
        """Answer `request` in a new server transaction (so retransmissions get the same answer)."""
        tx: ServerTransaction
        if request.method == "INVITE":
            tx = self._layer.server_invite(request, destination, transport, now, trying=False)
        else:
            tx = self._layer.server_non_invite(request, destination, transport, now)
        if to_tag is None and status >= 200 and status != 100 and not _tag_of(request.headers.get("To")):
            to_tag = self._new_tag()
        self._respond(tx, request, status, reason, headers=headers, now=now, to_tag=to_tag, body=body)
        return tx

    def _respond(
        self,
        tx: ServerTransaction,
        request: Request,
        status: int,
        reason: str | None = None,
        *,
        now: int,
        headers: tuple[tuple[str, str], ...] = (),
        to_tag: str | None = None,
        body: bytes = b"",
    ) -> None:
        extra = headers + self._product("Server")
        response = make_response(request, status, reason, to_tag=to_tag, headers=extra, body=body)
        self._layer.respond(tx, response, now)

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
                to_tag=self._new_tag() if not _tag_of(request.headers.get("To")) else None,
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
        self, request: Request, transport: str, destination: tuple[str, int], now: int, *, in_dialog: bool
    ) -> None:
        if self.draining and not in_dialog:
            self._refuse(
                request,
                503,
                transport,
                destination,
                now,
                "options_503_draining",
                (("Retry-After", str(self.config.retry_after_s)),),
            )
            return
        headers = (
            ("Allow", ALLOW),
            ("Accept", "application/sdp"),
            ("Supported", SUPPORTED),
            ("Contact", f"<{self._local_uri(transport)}>"),
        )
        self._reply(request, 200, transport, destination, now, headers=headers)

    # --- a new INVITE ---

    def _on_invite(
        self,
        request: Request,
        source: tuple[str, int],
        transport: str,
        destination: tuple[str, int],
        now: int,
        *,
        auth_user: str | None = None,
        trunk: Trunk | None = None,
    ) -> None:
        h = request.headers
        call_id = h.get("Call-ID") or ""
        from_tag = _tag_of(h.get("From"))
        cseq = h.get("CSeq") or ""
        merged = self._initial.get((call_id, from_tag, cseq))
        if merged is not None and merged.stage is not _Stage.ENDED:
            if server_key(request) == merged.server_tx.key:  # a late retransmission (its transaction is gone)
                self.stats["retransmissions_late"] += 1
                return
            self._refuse(request, 482, transport, destination, now, "merged_482")  # another branch: a fork
            return
        retry = (("Retry-After", str(self.config.retry_after_s)),)
        if self.draining:
            self._refuse(request, 503, transport, destination, now, "invite_503_draining", retry, "Draining")
            return
        if self.active_calls >= self.config.max_calls:
            self._refuse(
                request, 503, transport, destination, now, "invite_503_max_calls", retry, "Too Many Calls"
            )
            return
        try:
            expires, _ = _session_expires(request)
            _min_se(request)
        except ValueError as exc:
            self._refuse(request, 400, transport, destination, now, "malformed_400", reason=str(exc))
            return
        if expires is not None and expires < self.config.min_se_s:
            self._refuse(
                request,
                422,
                transport,
                destination,
                now,
                "session_interval_422",
                (("Min-SE", str(self.config.min_se_s)),),
            )
            return
        offer: SessionDescription | None = None
        if request.body:
            offer = _parse_sdp(request.body)
            if offer is None:
                self._refuse(request, 400, transport, destination, now, "bad_sdp_400", reason="Bad SDP body")
                return
        refusal = self._offer_refusal(offer, transport, trunk)
        if refusal is not None:  # nothing is paid for a call that can never be answered: no 180, no call
            self._refuse(
                request,
                488,
                transport,
                destination,
                now,
                f"offer_488_{refusal.cause}",
                (("Warning", refusal.warning_header(self._host_port(transport))),),
                refusal.reason,
            )
            log.warning(
                "refused an INVITE from %s:%d%s with 488 %s (%s)",
                source[0],
                source[1],
                f" (trunk {trunk.name})" if trunk is not None else "",
                refusal.reason,
                refusal.text,
            )
            return
        try:
            from_value = parse_name_addr(h.get("From") or "")
            to_value = parse_name_addr(h.get("To") or "")
        except ValueError:
            self._refuse(
                request, 400, transport, destination, now, "malformed_400", reason="Bad From or To header"
            )
            return
        local_tag = self._new_tag()
        host = trunk.external_address if trunk is not None else None  # the trunk's address, else ours
        try:
            dialog = Dialog.uas(
                request,
                local_tag=local_tag,
                local_contact=f"<{self._local_uri(transport, host)}>",
                transport=transport,
            )
        except ValueError:
            self._refuse(
                request, 400, transport, destination, now, "malformed_400", reason="Bad Contact header"
            )
            return
        self._counter += 1
        call = f"call-{self._counter}"
        ist = self._layer.server_invite(request, destination, transport, now)
        c = _Call(call, request, ist, dialog, source, transport, destination)
        c.host = host
        c.send_to_source = trunk.nat if trunk is not None else self.config.send_to_source
        c.offer = offer
        c.remote_body = request.body
        self._calls[call] = c
        self._dialogs[dialog.id] = c
        self._by_ist[ist] = c
        self._initial[(call_id, from_tag, cseq)] = c
        self.stats["calls"] += 1
        self._events.append(
            IncomingCall(
                call=call,
                sip_call_id=call_id,
                request_uri=request.uri,
                from_uri=from_value.uri,
                from_display=from_value.display,
                to_uri=to_value.uri,
                source=source,
                transport=transport,
                headers=h.items(),
                offer=offer,
                auth_user=auth_user,
                trunk=trunk,
            )
        )

    def _offer_refusal(
        self, offer: SessionDescription | None, transport: str, trunk: Trunk | None
    ) -> OfferRefusal | None:
        """Why a new INVITE can never be answered (SRTP required, by its trunk or else `UaConfig.srtp`, over a
        transport that may not carry keys, or an offer `answer` would refuse), or None. An INVITE without SDP is checked when the ACK brings the
        answer (RFC 3264 gives no way to refuse there: `CallConfirmed(media=None)`, and the shell hangs up)."""
        config = self.config
        srtp = trunk.srtp if trunk is not None else config.srtp
        policy = sdes_policy(srtp, transport)
        if policy is None:
            return OFFER_REFUSALS["tls_required"]
        if offer is None:
            return None
        refusal = check_offer(offer, codecs=config.codecs, srtp=policy, crypto_suites=config.crypto_suites)
        if refusal is not None and refusal.cause == "srtp_off" and srtp != "off":
            return OFFER_REFUSALS["srtp_needs_tls"]  # SRTP is on, but not over this transport
        return refusal

    def _on_cancel(self, request: Request, destination: tuple[str, int], transport: str, now: int) -> None:
        ist = self._layer.invite_for_cancel(request)
        if ist is None:
            self.stats["cancel_481"] += 1
            self._reply(request, 481, transport, destination, now)
            return
        c = self._by_ist.get(ist)
        to_tag = c.dialog.id.local_tag if c is not None else (ist.to_tag or self._new_tag())
        self._reply(request, 200, transport, destination, now, to_tag=to_tag)  # the INVITE's To tag (§9.2)
        if ist.final_sent:
            self.stats["cancel_too_late"] += 1
            return
        self._respond(ist, ist.request, 487, now=now, to_tag=to_tag)
        if c is None:
            return
        if c.ist is ist:
            self._events.append(CallCancelled(c.id))
            self._end(c, "cancelled", 487, by_remote=True, event=False)

    # --- in-dialog requests ---

    def _in_dialog(
        self,
        request: Request,
        to_tag: str,
        source: tuple[str, int],
        transport: str,
        destination: tuple[str, int],
        now: int,
    ) -> None:
        h = request.headers
        key = DialogId(h.get("Call-ID") or "", to_tag, _tag_of(h.get("From")))
        c = self._dialogs.get(key)
        method = request.method
        if c is None or c.stage is _Stage.ENDED:
            self.stats["no_dialog"] += 1
            self._reply(request, 481, transport, destination, now)
            return
        status = c.dialog.check_request(request)
        if status is not None:
            self._refuse(
                request,
                status,
                transport,
                destination,
                now,
                "cseq_out_of_order_500",
                reason="CSeq out of order",
            )
            return
        if method == "BYE":
            self._on_bye(c, request, transport, destination, now)
        elif method == "INVITE":
            self._on_reinvite(c, request, transport, destination, now)
        elif method == "UPDATE":
            self._on_update(c, request, transport, destination, now)
        elif method == "OPTIONS":
            self._on_options(request, transport, destination, now, in_dialog=True)
        elif method == "INFO":
            self._on_info(c, request, transport, destination, now)
        elif method == "REFER":
            self.stats["refer_refused"] += 1
            self._reply(request, 403, transport, destination, now, reason="Forbidden (REFER not accepted)")
            self._events.append(ReferRefused(c.id, request.headers.get("Refer-To") or ""))
        elif method == "NOTIFY":
            self._on_notify(c, request, transport, destination, now)
        else:  # pragma: no cover - _precheck let only ALLOWED through
            self._reply(request, 405, transport, destination, now, headers=(("Allow", ALLOW),))

    def _on_ack(self, request: Request, now: int) -> None:
        h = request.headers
        key = DialogId(h.get("Call-ID") or "", _tag_of(h.get("To")), _tag_of(h.get("From")))
        c = self._dialogs.get(key)
        if c is None:
            self.stats["ack_unmatched"] += 1
            return
        try:
            number, _ = parse_cseq(h.get("CSeq") or "")
        except ValueError:
            number = -1
        if c.retransmitter is None or number != c.ack_cseq:
            # an ACK we already had (the peer resends it for each retransmitted 2xx) or for nothing of ours
            self.stats["ack_duplicate" if 0 < number <= c.ack_cseq else "ack_unmatched"] += 1
            return
        self._stop_2xx(c)
        if c.offer_in_2xx:  # the ACK carries the answer to the offer in our 2xx (RFC 3264)
            c.offer_in_2xx = False
            theirs = _parse_sdp(request.body) if request.body else None
            media = accept_answer(c.local_sdp, theirs) if theirs is not None and c.local_sdp else None
            if media is None:
                self.stats["ack_without_answer"] += 1
            if c.stage is _Stage.CONFIRMED and media is not None:
                self._take_media(c, media, request.body)
            elif media is not None:
                c.media, c.held, c.remote_body = media, media.held, request.body
        if c.stage is _Stage.ANSWERED:
            c.stage = _Stage.CONFIRMED
            self._events.append(CallConfirmed(c.id, c.media))
            self._start_session_timer(c, now)
            if c.info_queue and c.info_tx is None:  # digits asked for before the ACK came (§13.3.1.4)
                self._next_info(c, now)
        elif c.stage is _Stage.ENDING and c.bye_pending is not None:
            self._send_bye(c, now)
            self._end(c, c.bye_pending, 200, by_remote=False, event=False)
        elif c.stage is _Stage.ENDING and c.bye_after_info is not None and c.info_tx is None:
            self._next_info(c, now)

    def _on_bye(
        self, c: _Call, request: Request, transport: str, destination: tuple[str, int], now: int
    ) -> None:
        self._reply(request, 200, transport, destination, now)
        if c.stage is _Stage.RINGING:  # a BYE on the early dialog (§15.1.2)
            self._respond(c.server_tx, c.invite, 487, now=now, to_tag=c.dialog.id.local_tag)
        was_ending = c.stage is _Stage.ENDING
        self._end(c, "remote hangup", 200, by_remote=True, event=not was_ending)

    def _on_reinvite(
        self, c: _Call, request: Request, transport: str, destination: tuple[str, int], now: int
    ) -> None:
        tx = self._layer.server_invite(request, destination, transport, now, trying=False)  # answered now
        if self._glare(c, reinvite=True):  # §14.2
            self.stats["glare_491"] += 1
            self._respond(tx, request, 491, now=now)
            return
        if c.stage is _Stage.RINGING or c.retransmitter is not None:
            self._respond(
                tx, request, 500, now=now, headers=(("Retry-After", str(self._rng.randint(1, 10))),)
            )
            self.stats["reinvite_500"] += 1
            return
        status = self._check_refresh(request)
        if status:
            headers = (("Min-SE", str(self.config.min_se_s)),) if status == 422 else ()
            self._respond(tx, request, status, now=now, headers=headers)
            return
        body, sdp_headers, status = self._answer_offer(c, request)
        if status:
            self._respond(tx, request, status, now=now)
            return
        self._accept_refresh(c, request, now)
        response = make_response(
            request,
            200,
            headers=self._contact_headers(c) + self._session_timer_response(c, request) + sdp_headers,
            body=body,
        )
        self._send_2xx(c, tx, response, now)

    def _on_update(
        self, c: _Call, request: Request, transport: str, destination: tuple[str, int], now: int
    ) -> None:
        tx = self._layer.server_non_invite(request, destination, transport, now)
        if request.body and self._glare(c, reinvite=False):  # RFC 3311 §5.2
            self.stats["glare_491"] += 1
            self._respond(tx, request, 491, now=now)
            return
        status = self._check_refresh(request)
        if status:
            headers = (("Min-SE", str(self.config.min_se_s)),) if status == 422 else ()
            self._respond(tx, request, status, now=now, headers=headers)
            return
        body: bytes = b""
        sdp_headers: tuple[tuple[str, str], ...] = ()
        status = 0
        if request.body:
            if c.local_media is None:
                self._respond(tx, request, 500, now=now, headers=(("Retry-After", "1"),))
                return
            body, sdp_headers, status = self._answer_offer(c, request)
        if status:
            self._respond(tx, request, status, now=now)
            return
        self._accept_refresh(c, request, now)
        extra = self._contact_headers(c) + self._session_timer_response(c, request) + sdp_headers
        self._respond(tx, request, 200, now=now, headers=extra, body=body)

    @staticmethod
    def _glare(c: _Call, *, reinvite: bool) -> bool:
        """Whether a peer re-INVITE (or UPDATE with an offer) crosses a request of ours: our re-INVITE in
        progress, or our UPDATE if it carries an offer (a bare refresh UPDATE offers nothing)."""
        ours = c.our_offer
        if ours is None:
            return False
        return bool(ours.request.body) or (reinvite and ours.request.method == "INVITE")

    def _answer_offer(self, c: _Call, request: Request) -> tuple[bytes, tuple[tuple[str, str], ...], int]:
        """(body, headers, 0) of our answer to a re-INVITE/UPDATE, or (b"", (), status) to refuse it. A request
        without SDP gets our current SDP as an offer (its ACK brings the answer)."""
        if c.local_media is None or c.local_sdp is None:
            return b"", (), 500
        sdp_type = (("Content-Type", "application/sdp"),)
        if not request.body:
            if request.method == "INVITE":  # we offer (unchanged); the ACK answers
                c.offer_in_2xx = True
                return serialize_sdp(c.local_sdp), sdp_type, 0
            return b"", (), 0
        offer = _parse_sdp(request.body)
        if offer is None:
            return b"", (), 400
        if request.body == c.remote_body:  # a refresh with the same SDP: the same answer, no event
            return serialize_sdp(c.local_sdp), sdp_type, 0
        result = sdp_answer(offer, c.local_media, previous=c.local_sdp)
        if result is None:
            self.stats["reoffer_488"] += 1
            return b"", (), 488  # the old session goes on (RFC 3264 §8)
        c.local_sdp = result.description
        self._take_media(c, result.media, request.body)
        return serialize_sdp(result.description), sdp_type, 0

    def _take_media(self, c: _Call, media: NegotiatedMedia, body: bytes) -> None:
        """A new offer/answer in the confirmed call: hold, resume, or some other change."""
        before, c.media, c.remote_body = c.media, media, body
        if media.held and not c.held:
            c.held = True
            self._events.append(CallHeld(c.id, media))
        elif c.held and not media.held:
            c.held = False
            self._events.append(CallResumed(c.id, media))
        elif not c.held and (before is None or _media_key(before) != _media_key(media)):
            self._events.append(MediaUpdated(c.id, media))
        # held and still held (sendonly → inactive, say): no event; `CallResumed` will carry the media

    def _on_info(
        self, c: _Call, request: Request, transport: str, destination: tuple[str, int], now: int
    ) -> None:
        if not request.body:
            self._reply(request, 200, transport, destination, now)  # an INFO keep-alive
            return
        dtmf = parse_dtmf_info(_content_type(request), request.body)
        if dtmf is None:
            self.stats["info_bad_dtmf"] += 1
            self._reply(request, 400, transport, destination, now, reason="Bad DTMF body")
            return
        self._reply(request, 200, transport, destination, now)
        self._events.append(DtmfReceived(c.id, dtmf[0], dtmf[1]))

    def _on_notify(
        self, c: _Call, request: Request, transport: str, destination: tuple[str, int], now: int
    ) -> None:
        event = (request.headers.get("Event") or "").split(";", 1)[0].strip().lower()
        if event != "refer":
            self._refuse(request, 489, transport, destination, now, "notify_489")
            return
        if not c.refer_active:
            self._refuse(request, 481, transport, destination, now, "notify_481")
            return
        state = (request.headers.get("Subscription-State") or "").split(";", 1)[0].strip().lower()
        terminated = state == "terminated"
        frag = parse_sipfrag(request.body) if request.body else None
        if request.body and frag is None:
            self._refuse(
                request,
                400,
                transport,
                destination,
                now,
                "notify_bad_sipfrag",
                reason="Bad message/sipfrag body",
            )
            if not terminated:
                return
        else:
            self._reply(request, 200, transport, destination, now)
        if terminated:
            c.refer_active = False
        status, reason = frag if frag is not None else (0, "")
        if status >= 200 and not terminated and c.stage is _Stage.CONFIRMED:
            # A final sipfrag in a NOTIFY that keeps the subscription (RFC 3515 §2.4.5 allows it): the outcome is
            # known, so end the implicit subscription as pjsua does, with a SUBSCRIBE Expires: 0 in the REFER's
            # dialog for the same Event (its id too). The notifier's last NOTIFY (terminated) is still answered 200.
            self.stats["refer_unsubscribed"] += 1
            self._send_in_dialog(
                c,
                "SUBSCRIBE",
                now,
                headers=(
                    ("Event", request.headers.get("Event") or "refer"),
                    ("Expires", "0"),
                    ("Accept", "message/sipfrag"),
                    *self._contact_headers(c),
                ),
                purpose="SUBSCRIBE",
            )
        self._events.append(ReferNotify(c.id, status, reason, terminated))

    # --- session timers (RFC 4028) ---

    def _check_refresh(self, request: Request) -> int:
        try:
            expires, _ = _session_expires(request)
            _min_se(request)
        except ValueError:
            return 400
        if expires is not None and expires < self.config.min_se_s:
            self.stats["session_interval_422"] += 1
            return 422
        return 0

    def _session_timer_response(self, c: _Call, request: Request) -> tuple[tuple[str, str], ...]:
        """Choose the interval and refresher for `request`'s 2xx (RFC 4028 §9) and return its headers."""
        expires, refresher = _session_expires(request)
        supports = _has_option(request, "Supported", "timer") or _has_option(request, "Require", "timer")
        if expires is None:
            if c.interval_s is not None:  # a refresh without Session-Expires: keep the session's timer
                expires = c.interval_s
                refresher = "uas" if c.we_refresh else "uac"
                if not supports:
                    refresher = "uas"
            elif self.config.session_expires_s > 0:  # we ask for one; refresher below: uac if it can, else us
                expires = max(self.config.session_expires_s, _min_se(request) or 0, self.config.min_se_s)
            else:
                return (("Supported", SUPPORTED),)
        if refresher is None:
            refresher = "uac" if supports else "uas"
        c.interval_s = expires
        c.we_refresh = refresher == "uas"
        headers: list[tuple[str, str]] = [
            ("Supported", SUPPORTED),
            ("Session-Expires", f"{expires};refresher={refresher}"),
        ]
        if supports:
            headers.append(("Require", "timer"))
        return tuple(headers)

    def _accept_refresh(self, c: _Call, request: Request, now: int) -> None:
        """A peer re-INVITE/UPDATE we answer 2xx refreshes the session (timers restart from `now`)."""
        if c.stage is _Stage.CONFIRMED:
            self._start_session_timer(c, now)

    def _start_session_timer(self, c: _Call, now: int) -> None:
        c.refresh_at = c.expire_at = None
        if c.interval_s is not None:
            interval = c.interval_s * _SECOND
            if c.we_refresh:
                c.refresh_at = now + interval // 2
            else:
                c.expire_at = now + interval - min(32 * _SECOND, interval // 3)
        c.rearm()
        self._sched.update(c)

    def _call_timer(self, c: _Call, now: int) -> None:
        if c.stage is not _Stage.CONFIRMED:
            c.refresh_at = c.expire_at = c.retry_at = None
            c.rearm()
            return
        if c.expire_at is not None and now >= c.expire_at:
            c.expire_at = None
            self.stats["session_expired"] += 1
            self._send_bye(c, now)
            self._events.append(SessionExpired(c.id))
            self._end(c, "session expired", 408, by_remote=True)
            return
        if (c.refresh_at is not None and now >= c.refresh_at) or (
            c.retry_at is not None and now >= c.retry_at
        ):
            c.refresh_at = c.retry_at = None
            self._send_refresh(c, now)
        c.rearm()

    def _send_refresh(self, c: _Call, now: int) -> None:
        if c.our_offer is not None or c.interval_s is None:
            return
        for old in [tx for tx in c.our_acks if tx.terminated]:  # earlier refreshes' 2xx can no longer repeat
            del c.our_acks[old]
            self._pending.pop(old, None)
        headers = (
            ("Session-Expires", f"{c.interval_s};refresher=uac"),
            ("Min-SE", str(self.config.min_se_s)),
            ("Supported", SUPPORTED),
        )
        if "UPDATE" in c.peer_allow:
            c.our_offer = self._send_in_dialog(c, "UPDATE", now, headers=headers, purpose="UPDATE")
        else:
            body = serialize_sdp(c.local_sdp) if c.local_sdp is not None else b""
            c.our_offer = self._send_in_dialog(
                c,
                "INVITE",
                now,
                headers=headers,
                body=body,
                content_type="application/sdp" if body else None,
                purpose="INVITE",
            )
        # until the answer: the session must not expire on our side (we are the refresher)
        c.expire_at = now + c.interval_s * _SECOND
        c.rearm()

    # --- our requests ---

    def _send_in_dialog(
        self,
        c: _Call,
        method: str,
        now: int,
        *,
        headers: tuple[tuple[str, str], ...] = (),
        body: bytes = b"",
        content_type: str | None = None,
        purpose: str,
    ) -> ClientTransaction:
        destination, transport = self._next_hop(c)
        via = self._via(transport, c.host)
        request = c.dialog.new_request(
            method,
            via=via,
            headers=headers + self._product("User-Agent"),
            body=body,
            content_type=content_type,
        )
        tx = self._layer.send_request(request, destination, transport, now)
        self._pending[tx] = (c, purpose)
        return tx

    def _send_bye(self, c: _Call, now: int) -> None:
        self._send_in_dialog(c, "BYE", now, purpose="BYE")

    def _next_info(self, c: _Call, now: int) -> None:
        sending = c.stage is _Stage.CONFIRMED or (c.stage is _Stage.ENDING and c.bye_after_info is not None)
        if not c.info_queue or not sending:
            c.info_tx = None
            if (
                c.stage is _Stage.ENDING and c.bye_after_info is not None
            ):  # the last digit is out: now the BYE
                reason, c.bye_after_info = c.bye_after_info, None
                self._send_bye(c, now)
                self._end(c, reason, 200, by_remote=False, event=False)
            return
        digit, duration = c.info_queue.pop(0)
        body = f"Signal={digit}\r\nDuration={duration}\r\n".encode()
        c.info_tx = self._send_in_dialog(
            c, "INFO", now, body=body, content_type="application/dtmf-relay", purpose="INFO"
        )

    def _next_hop(self, c: _Call) -> tuple[tuple[str, int], str]:
        if (c.send_to_source or c.no_contact) and not c.dialog.route_set:
            return c.source, c.transport
        destination, transport = c.dialog.next_hop()
        if not destination[0]:
            return c.source, c.transport
        return destination, transport.lower()

    def _via(self, transport: str, host: str | None = None) -> str:
        sent_by = self._host_port(transport, host)
        return f"SIP/2.0/{transport.upper()} {sent_by};branch=z9hG4bK{self._rng.getrandbits(64):016x};rport"

    def _host_port(self, transport: str = "udp", host: str | None = None) -> str:
        host = host or self.config.host
        host = f"[{host}]" if ":" in host else host
        tls_port = self.config.tls_port
        port = tls_port if transport.lower() == "tls" and tls_port is not None else self.config.port
        return f"{host}:{port}"

    def _local_uri(self, transport: str = "udp", host: str | None = None) -> str:
        suffix = "" if transport == "udp" else f";transport={transport}"
        return f"sip:{self.config.user}@{self._host_port(transport, host)}{suffix}"

    def _contact_headers(self, c: _Call) -> tuple[tuple[str, str], ...]:
        return (("Contact", c.dialog.local_contact), ("Allow", ALLOW))

    def _establishing_headers(self, c: _Call) -> tuple[tuple[str, str], ...]:
        """Contact and Allow, and the INVITE's Record-Route fields as they came, in order: a response that
        establishes the dialog (our 180 and 200) copies them (RFC 3261 §12.1.1), so the caller's ACK, BYE
        and re-INVITEs cross every proxy that record-routed (issue 14)."""
        routes = tuple(("Record-Route", value) for value in c.invite.headers.get_fields("Record-Route"))
        return self._contact_headers(c) + routes

    def _product(self, name: str) -> tuple[tuple[str, str], ...]:
        """The Server (or User-Agent) field naming our product, or none: by default we say nothing a scanner
        could fingerprint (`UaConfig.user_agent`)."""
        return ((name, self.config.user_agent),) if self.config.user_agent is not None else ()

    def _new_tag(self) -> str:
        return f"{self._rng.getrandbits(64):016x}"

    # --- responses to our requests ---

    def _on_response(self, response: Response, now: int) -> None:
        if not self._layer.receive_response(response, now):
            self.stats["responses_unmatched"] += 1

    def _after_layer(self, now: int) -> None:
        """Act on what the transaction layer reported (responses, timeouts, evictions)."""
        if self._layer.evicted != self.stats["transactions_evicted"]:
            self._note_evictions(now)
        for event in self._layer.events():
            if isinstance(event, (ResponseReceived, TransactionTimeout)) and self._route_own(event, now):
                continue
            if isinstance(event, ResponseReceived):
                self._on_client_response(event.transaction, event.response, now)
            elif isinstance(event, TransactionTimeout):
                if isinstance(event.transaction, ClientTransaction):
                    self.stats[f"timer_{event.timer.lower()}"] += 1
                    self._on_client_response(event.transaction, None, now)
                else:
                    self.stats["timer_h"] += 1  # our non-2xx final was never ACKed
            elif isinstance(event, AckTimeout):
                self._on_ack_timeout(event.retransmitter, now)

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

    def _on_client_response(self, tx: ClientTransaction, response: Response | None, now: int) -> None:
        """A final response to one of our requests (None: Timer B/F fired, taken as 408)."""
        entry = self._pending.get(tx)
        if entry is None:
            return
        c, purpose = entry
        status = response.status if response is not None else 408
        reason = response.reason if response is not None else "Request Timeout"
        if status < 200:
            return
        if purpose == "INVITE" and response is not None and status < 300:
            first = tx not in c.our_acks
            self._ack_2xx(c, tx, response, now)  # every 2xx, retransmissions too (§13.2.2.4)
            if not first:
                return
            # the entry stays while the transaction (Accepted, Timer M) may pass on retransmitted 2xx
        else:
            del self._pending[tx]
        if purpose == "REFER":
            refer_sub = (
                (response.headers.get("Refer-Sub") or "true").strip().lower() != "false" if response else True
            )
            if 200 <= status < 300 and refer_sub:
                c.refer_active = True
            self._events.append(ReferResponse(c.id, status, reason, refer_sub))
        elif purpose == "INFO":
            if c.info_tx is tx:
                if c.bye_after_info is not None and status in (408, 481):
                    c.info_queue.clear()  # the peer is gone or not answering: the BYE goes now, not after more
                self._next_info(c, now)
        elif purpose in ("INVITE", "UPDATE"):
            self._on_refresh_response(c, tx, response, status, now)
            return
        if status == 481 and purpose not in ("BYE", "SUBSCRIBE") and c.stage is _Stage.CONFIRMED:
            # §12.2.1.2: the peer no longer knows the dialog (a 408 to a REFER or INFO is only that
            # request's timeout: the transfer contract keeps the call up; a 481 to our un-SUBSCRIBE only
            # says the subscription is already gone, RFC 6665 §4.1.2.2)
            self._end(c, "the caller's side lost the dialog (481)", 481, by_remote=True)

    def _ack_2xx(self, c: _Call, tx: ClientTransaction, response: Response, now: int) -> None:
        data = c.our_acks.get(tx)
        if data is None:
            number, _ = parse_cseq(tx.request.headers.get("CSeq") or "")
            c.dialog.refresh_target(response)
            destination, transport = self._next_hop(c)
            data = serialize(c.dialog.ack(number, via=self._via(transport, c.host)))
            c.our_acks[tx] = data
        destination, transport = self._next_hop(c)
        self._layer.send_stateless(data, destination, transport)

    def _on_refresh_response(
        self, c: _Call, tx: ClientTransaction, response: Response | None, status: int, now: int
    ) -> None:
        if c.our_offer is not tx:
            return
        c.our_offer = None
        if c.stage is not _Stage.CONFIRMED:
            return
        if 200 <= status < 300 and response is not None:
            try:
                expires, refresher = _session_expires(response)
            except ValueError:
                expires, refresher = None, None
            if expires is not None:
                c.interval_s = expires
                c.we_refresh = refresher != "uas"
            self._start_session_timer(c, now)
            return
        if status == 491:  # glare: we do not own the Call-ID, so retry after 0-2 s (§14.1)
            c.retry_at = now + self._rng.randrange(0, 2 * _SECOND)
        elif status == 422 and response is not None:
            try:
                c.interval_s = max(c.interval_s or 0, _min_se(response) or 0)
            except ValueError:
                pass
            c.retry_at = now
        elif status in (405, 501) and tx.request.method == "UPDATE":
            c.peer_allow = c.peer_allow - {"UPDATE"}
            c.retry_at = now
        elif status in (408, 481):  # the dialog is gone (RFC 4028 §10, RFC 3261 §12.2.1.2)
            if status == 408:
                self._send_bye(c, now)
            self._end(c, "session refresh failed", status, by_remote=True)
            return
        c.rearm()
        self._sched.update(c)

    def _on_ack_timeout(self, retransmitter: Retransmit2xx, now: int) -> None:
        c = self._by_retransmitter.pop(retransmitter, None)
        if c is None or c.retransmitter is not retransmitter:
            return
        c.retransmitter = None
        self.stats["ack_timeout"] += 1
        if c.stage is _Stage.ENDED:
            return
        self._send_bye_now(c, now)
        ended = c.stage is _Stage.ENDING
        self._end(c, "no ACK for the 200 OK", 408, by_remote=True, event=not ended)

    def _send_bye_now(self, c: _Call, now: int) -> None:
        c.stage = _Stage.CONFIRMED  # the dialog is confirmed for sending (§13.3.1.4: BYE after no ACK)
        self._send_bye(c, now)

    # --- call bookkeeping ---

    def _send_2xx(self, c: _Call, tx: ServerInviteTransaction, response: Response, now: int) -> None:
        if self.config.user_agent is not None:
            response = Response(
                response.status,
                response.reason,
                response.headers.with_header("Server", self.config.user_agent),
                response.body,
            )
        self._layer.respond(tx, response, now)
        data = tx.response_data or serialize(response)
        if c.retransmitter is not None:
            self._stop_2xx(c)
        r = self._layer.retransmit_2xx(data, tx.destination, tx.transport, now)
        c.retransmitter = r
        c.ack_cseq, _ = parse_cseq(response.headers.get("CSeq") or "")  # the INVITE's (the request is gone)
        self._by_retransmitter[r] = c

    def _stop_2xx(self, c: _Call) -> None:
        r = c.retransmitter
        if r is not None:
            self._layer.stop_2xx(r)
            self._by_retransmitter.pop(r, None)
            c.retransmitter = None

    def _end(self, c: _Call, reason: str, status: int, *, by_remote: bool, event: bool = True) -> None:
        """The call is over: forget it (its transactions live on until their timers end)."""
        if c.stage is _Stage.ENDED:
            return
        c.stage = _Stage.ENDED
        self._stop_2xx(c)
        c.refresh_at = c.expire_at = c.retry_at = None
        c.rearm()
        self._sched.update(c)
        c.info_queue.clear()
        self._calls.pop(c.id, None)
        self._dialogs.pop(c.dialog.id, None)
        if c.ist is not None:
            self._by_ist.pop(c.ist, None)
        key = (c.dialog.id.call_id, c.dialog.id.remote_tag, c.invite.headers.get("CSeq") or "")
        if self._initial.get(key) is c:
            del self._initial[key]
        for tx in [
            tx for tx, (owner, _) in self._pending.items() if owner is c and tx.request.method != "BYE"
        ]:
            del self._pending[tx]
        if event:
            self._events.append(CallEnded(c.id, reason, status, by_remote))

    # --- calls we place: responses and timers ---

    def _route_own(self, event: ResponseReceived | TransactionTimeout, now: int) -> bool:
        """Hand a transaction event to the registration or outbound call that owns it; False if neither."""
        tx = event.transaction
        if not isinstance(tx, ClientTransaction):
            return False
        registration = self._reg_tx.get(tx)
        if registration is not None:
            if isinstance(event, TransactionTimeout):
                del self._reg_tx[tx]
                method = tx.request.method  # REGISTER, or the registrar keepalive's OPTIONS (issue 14)
                self.stats["register_timeout" if method == "REGISTER" else "keepalive_timeout"] += 1
                registration.request_failed(now, "timeout", method=method)
            elif event.response.status >= 200:
                del self._reg_tx[tx]
                registration.receive_response(event.response, now)
            self._pump_registration(registration, now)
            return True
        o = self._out_tx.get(tx)
        if o is None:
            return False
        if isinstance(event, TransactionTimeout):
            self.stats[f"timer_{event.timer.lower()}"] += 1
            if tx.request.method == "INVITE" and tx is o.tx and not o.ended and o.call is None:
                if o.cancel_reason is not None:
                    self._outbound_end(o, o.cancel_reason, o.cancel_status, by_remote=False)
                else:
                    self._outbound_end(o, "no response (timeout)", 408, by_remote=True)
            return True
        if tx.request.method == "INVITE":
            self._outbound_response(o, tx, event.response, now)
        return True  # a response to our CANCEL: nothing to do (the INVITE's 487 or 2xx decides)

    def _send_invite(self, o: _Outbound, now: int) -> None:
        tx = self._layer.send_request(o.invite, o.destination, o.transport, now)
        o.tx = tx
        self._out_tx[tx] = o

    def _cancel_if_possible(self, o: _Outbound, now: int) -> None:
        """§9.1: a CANCEL for the INVITE in progress once a provisional response came (not before)."""
        if o.cancel_sent or not o.provisional or o.tx is None or o.call is not None:
            return
        invite = o.tx.request
        h = invite.headers
        items: list[tuple[str, str]] = [("Via", h.get_fields("Via")[0]), ("Max-Forwards", "70")]
        for name in ("From", "To", "Call-ID"):
            items.append((name, h.get(name) or ""))
        number, _ = parse_cseq(h.get("CSeq") or "1 INVITE")
        items.append(("CSeq", f"{number} CANCEL"))
        items.extend(("Route", route) for route in h.get_fields("Route"))
        items.extend(self._product("User-Agent"))
        cancel = Request("CANCEL", invite.uri, Headers(items))
        tx = self._layer.send_request(cancel, o.destination, o.transport, now)
        self._out_tx[tx] = o
        o.cancel_sent = True
        o.give_up_at = now + self.config.timers.timeout  # §9.1: no final 64·T1 after the CANCEL → over
        o.rearm()
        self._sched.update(o)
        self.stats["cancel_sent"] += 1

    def _outbound_timer(self, o: _Outbound, now: int) -> None:
        if o.ended or o.call is not None:
            o.ring_at = o.give_up_at = None
            o.rearm()
            return
        if o.give_up_at is not None and now >= o.give_up_at:
            o.give_up_at = None
            self._outbound_end(o, o.cancel_reason or "cancelled", o.cancel_status, by_remote=False)
            return
        if o.ring_at is not None and now >= o.ring_at:
            o.ring_at = None
            if o.cancel_reason is None:
                self.stats["ring_timeout"] += 1
                o.cancel_reason, o.cancel_status = "no answer (ringing timeout)", 408
                if o.provisional:
                    self._cancel_if_possible(o, now)
                else:  # nothing answered at all: no CANCEL may go out; the call is over for us
                    self._outbound_end(o, o.cancel_reason, 408, by_remote=False)
        o.rearm()

    def _outbound_response(self, o: _Outbound, tx: ClientTransaction, response: Response, now: int) -> None:
        status = response.status
        if 200 <= status < 300:
            self._outbound_2xx(o, tx, response, now)
            return
        if tx is not o.tx or o.call is not None:
            return  # an earlier (challenged) INVITE's response, or one after the answer
        if o.ended:  # over for the application (the ringing timeout came before any 1xx): CANCEL it now
            if status > 100 and status < 200 and o.cancel_reason is not None:
                o.provisional = True
                self._cancel_if_possible(o, now)
            return
        if status < 200:
            if status == 100:
                return
            o.provisional = True
            early: NegotiatedMedia | None = None
            if response.body and _content_type(response) == "application/sdp":
                theirs = _parse_sdp(response.body)
                early = accept_answer(o.local_sdp, theirs) if theirs is not None else None
                if early is not None:
                    o.early = early
            self.stats["early_media" if early is not None else "call_progress"] += 1
            self._events.append(CallProgress(o.id, status, response.reason, early))
            if o.cancel_reason is not None:
                self._cancel_if_possible(o, now)
            return
        if status == 422 and o.cancel_reason is None and o.timer_retries < 2:  # RFC 4028 §7.4
            try:
                wanted = _min_se(response)
            except ValueError:
                wanted = None
            expires, _ = _session_expires_or_none(o.invite)
            if wanted is not None and expires is not None and wanted > expires:
                o.timer_retries += 1
                self._resend_invite(o, now, self._offered_timer(wanted, min_se=wanted))
                return
        if status in (401, 407) and o.cancel_reason is None:
            if o.auth is None:
                self._outbound_end(o, f"{response.reason} (no credentials)", status, by_remote=True)
                return
            answer = o.auth.respond(response, "INVITE", o.invite.uri, o.invite.body)
            if not isinstance(answer, AuthAnswer) or o.auth_tries >= 3:
                reason = answer.reason if not isinstance(answer, AuthAnswer) else "bad credentials"
                self.stats["auth_refused"] += 1
                self._outbound_end(o, reason, status, by_remote=True)
                return
            o.auth_tries += 1
            self._retry_invite(o, answer, now)
            return
        if o.cancel_reason is not None:
            self._outbound_end(o, o.cancel_reason, o.cancel_status, by_remote=False)
        else:
            self._outbound_end(o, f"{status} {response.reason}".strip(), status, by_remote=True)

    def _retry_invite(self, o: _Outbound, answer: AuthAnswer, now: int) -> None:
        """The INVITE again with credentials: a new branch and CSeq, the same Call-ID and From tag (§22.2)."""
        headers = o.invite.headers.without("Authorization").without("Proxy-Authorization")
        o.invite = Request("INVITE", o.invite.uri, headers, o.invite.body)
        self._resend_invite(o, now, answer.headers, replace=False)

    def _resend_invite(
        self, o: _Outbound, now: int, fields: tuple[tuple[str, str], ...], *, replace: bool = True
    ) -> None:
        """The INVITE again with `fields` (replacing those of the same name, or added): a new branch and CSeq,
        the same Call-ID and From tag (§22.2, RFC 4028 §7.4)."""
        old = o.invite
        number, _ = parse_cseq(old.headers.get("CSeq") or "1 INVITE")
        headers = old.headers.replaced("Via", self._via(o.transport)).replaced("CSeq", f"{number + 1} INVITE")
        for name, value in fields:
            headers = headers.replaced(name, value) if replace else headers.with_header(name, value)
        o.invite = Request("INVITE", old.uri, headers, old.body)
        o.provisional = False
        self._send_invite(o, now)

    def _offered_timer(self, interval_s: int, *, min_se: int | None = None) -> tuple[tuple[str, str], ...]:
        """Session-Expires and Min-SE of an INVITE we place (RFC 4028 §7.1; after a 422 its Min-SE is ours,
        §7.4); none for an interval of 0."""
        if interval_s <= 0:
            return ()
        floor = max(min_se or 0, self.config.min_se_s)
        return (("Session-Expires", str(max(interval_s, floor))), ("Min-SE", str(floor)))

    def _outbound_2xx(self, o: _Outbound, tx: ClientTransaction, response: Response, now: int) -> None:
        remote_tag = _tag_of(response.headers.get("To"))
        sent = o.ack.get(remote_tag)
        if sent is not None:  # a retransmitted 2xx: the same ACK again, the same way (§13.2.2.4)
            self._layer.send_stateless(*sent)
            return
        try:
            dialog = Dialog.uac(
                tx.request, response, local_contact=f"<{self._local_uri(o.transport)}>", transport=o.transport
            )
        except ValueError:
            self.stats["malformed_2xx"] += 1
            return
        number, _ = parse_cseq(tx.request.headers.get("CSeq") or "1 INVITE")
        destination, transport = self._dialog_hop(dialog, o)
        data = serialize(dialog.ack(number, via=self._via(transport)))
        o.ack[remote_tag] = (data, destination, transport)
        self._layer.send_stateless(data, destination, transport)
        if o.call is not None or o.ended or o.cancel_reason is not None:
            # a second dialog (a fork) or an answer that crossed our CANCEL: ACK it, then BYE it (§13.2.2.4)
            self.stats["outbound_2xx_bye"] += 1
            bye = dialog.new_request("BYE", via=self._via(transport), headers=self._product("User-Agent"))
            self._layer.send_request(bye, destination, transport, now)
            if not o.ended and o.call is None:
                self._outbound_end(o, o.cancel_reason or "cancelled", o.cancel_status, by_remote=False)
            return
        c = _Call(o.id, tx.request, None, dialog, o.destination, o.transport, o.destination)
        c.send_to_source = self.config.send_to_source
        c.stage = _Stage.CONFIRMED
        c.no_contact = response.headers.get("Contact") is None
        c.peer_allow = frozenset(m.strip().upper() for m in response.headers.get_all("Allow"))
        c.peer_supports_timer = _has_option(response, "Supported", "timer") or _has_option(
            response, "Require", "timer"
        )
        c.local_media, c.local_sdp = o.local, o.local_sdp
        theirs = _parse_sdp(response.body) if response.body else None
        media = accept_answer(o.local_sdp, theirs) if theirs is not None else o.early
        if media is None:
            self.stats["answer_without_sdp"] += 1
        c.media, c.held, c.remote_body = media, bool(media and media.held), response.body
        try:
            expires, refresher = _session_expires(response)
        except ValueError:
            expires, refresher = None, None
        if expires is not None:  # RFC 4028 §7.2: the 2xx names the refresher; we refresh unless it is the UAS
            c.interval_s = max(expires, self.config.min_se_s)
            c.we_refresh = refresher != "uas"
        o.call = c
        o.ring_at = o.give_up_at = None
        o.rearm()
        self._sched.update(o)
        self._outbound.pop(o.id, None)
        self._calls[o.id] = c
        self._dialogs[dialog.id] = c
        self.stats["calls_out_answered"] += 1
        self._events.append(CallConfirmed(o.id, media))
        self._start_session_timer(c, now)

    def _dialog_hop(self, dialog: Dialog, o: _Outbound) -> tuple[tuple[str, int], str]:
        if self.config.send_to_source and not dialog.route_set:
            return o.destination, o.transport
        destination, transport = dialog.next_hop()
        if not destination[0]:
            return o.destination, o.transport
        return destination, transport.lower()

    def _outbound_end(self, o: _Outbound, reason: str, status: int, *, by_remote: bool) -> None:
        if o.ended:
            return
        o.ended = True
        o.ring_at = o.give_up_at = None
        o.rearm()
        self._sched.update(o)
        self._outbound.pop(o.id, None)
        self.stats["calls_out_failed"] += 1
        self._events.append(CallEnded(o.id, reason, status, by_remote))
