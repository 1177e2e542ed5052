"""What the user agent (`sip.core.ua`) is configured with and what it reports: `UaConfig` and the call events
(`UaEvent`). Plain frozen values shared by the router and its per-call objects (`sip.core.call`, `sip.core.outbound`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sip.core.message import MAX_MESSAGE_SIZE
from sip.core.offer_answer import NegotiatedMedia
from sip.core.sdes import DEFAULT_CRYPTO_SUITES, SrtpPolicy
from sip.core.sdp import SessionDescription
from sip.core.transaction import TimerConfig
from sip.core.transaction_layer import DEFAULT_MAX_LINGERING
from sip.core.trunks import Trunk


@dataclass(frozen=True, slots=True)
class UaConfig:
    """How this UA presents itself and what it accepts.

    `host`/`port`: the address written into our Via and Contact (the advertised address behind NAT).
    `max_calls`: calls in progress (ringing or up) beyond which a new INVITE gets 503 with `retry_after_s`.
    `session_expires_s`: the session interval (RFC 4028) we ask for when the caller asks for none (as UAS)
    and offer on the calls we place (as UAC); 0: we never ask for a session timer (one the peer asks for is
    still honoured: we say `Supported: timer`). `min_se_s`: the smallest interval we accept (§5: at least 90).
    `codecs`, `srtp`, `crypto_suites`: what the application's `LocalMedia` will accept (its codecs, the
    configured SRTP policy before `sip.core.sdes.sdes_policy` applies the call's transport, its suites): a new
    INVITE's offer is checked against them when it arrives (`sip.core.offer_answer.check_offer`), so an offer that can
    never be answered gets 488 before any 180 and never becomes an `IncomingCall`.
    `send_to_source`: send in-dialog requests to the address the INVITE came from instead of the route set /
    remote target (a caller behind NAT with a private Contact); off by default (RFC 3261 behaviour).
    `max_lingering_transactions`: server transactions kept after their final response only to absorb
    retransmissions, beyond which the oldest is forgotten (`sip.core.transaction_layer.TransactionLayer`; counted in
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
    tls_port: int | None = None  # our TLS listener's port: Via and Contact of TLS requests/dialogs
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
    auth_user: str | None = None  # the user the inbound policy's digest check authenticated
    trunk: Trunk | None = None  # the trunk the policy matched the INVITE to (sip/core/trunks.py), None: none


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
    `sip.core.transfer.TransferTracker.refer_response`."""

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
