"""What refuses a request before the user agent (`sip.core.ua.UserAgent`) routes it, sans-I/O and stateless: pure
checks of the request (and the configuration, the trunk), each giving a `Refusal` (status, counter, headers,
reason) for the router to send, or nothing.

- `precheck`, on every request but ACK, in this order: Max-Forwards 0 → 483 (the project's rule; RFC 4475
  "zeromf" would have an endpoint process it); method (405 for a method of RFC 3261 or a standard extension
  that we do not do, 501 for one no RFC we know defines, §8.2.1; both with Allow); the checks of
  `sip.core.message.check_request` (416, 400 bare branch, 420 with Unsupported, 415 with Accept). An INVITE may
  require 100rel (`sip.core.prack`); no other request may.
- `vet_invite`, on a new INVITE the router did not refuse for its own state (a merged request, draining,
  `max_calls`): Session-Expires/Min-SE unreadable → 400, below our Min-SE → 422 with Min-SE (RFC 4028); an SDP
  body we cannot read → 400; an offer that can never be answered → 488 with a Warning (`offer_refusal`);
  From or To unreadable → 400. Nothing is paid for an INVITE refused here: no 180, no call, no RTP port.
"""

from __future__ import annotations

from dataclasses import dataclass

from sip.core.headers import NameAddr, parse_name_addr
from sip.core.message import Request, check_request
from sip.core.offer_answer import OFFER_REFUSALS, OfferRefusal, check_offer
from sip.core.prack import OPTION as RELIABLE_PROVISIONALS
from sip.core.sdes import sdes_policy
from sip.core.sdp import SessionDescription
from sip.core.sessiontimer import min_se, session_expires
from sip.core.trunks import Trunk
from sip.core.uabase import (
    ALLOW,
    ALLOWED,
    DTMF_TYPES,
    KNOWN_NOT_ALLOWED,
    SUPPORTED_OPTIONS,
    parse_sdp_or_none,
)
from sip.core.uaevents import UaConfig


@dataclass(frozen=True, slots=True)
class Refusal:
    """The final response that refuses a request, and the counter (`UserAgent.stats`) it adds one to."""

    status: int
    counter: str
    headers: tuple[tuple[str, str], ...] = ()
    reason: str | None = None
    offer: OfferRefusal | None = None  # a 488's cause (for the log line)


@dataclass(frozen=True, slots=True)
class VettedInvite:
    """A new INVITE that may ring: its offer (None: none, a late offer) and its From and To."""

    offer: SessionDescription | None
    from_value: NameAddr
    to_value: NameAddr


def precheck(request: Request) -> Refusal | None:
    """The generic checks of any request but ACK (see the module docstring)."""
    method = request.method
    mf = request.headers.get("Max-Forwards")
    if mf is not None and mf.strip().isdigit() and int(mf) == 0:
        return Refusal(483, "max_forwards_zero")
    if method not in ALLOWED:
        status = 405 if method in KNOWN_NOT_ALLOWED else 501
        return Refusal(status, f"method_{status}", (("Allow", ALLOW),))
    accepted: tuple[str, ...]
    if method in ("INVITE", "UPDATE"):
        accepted = ("application/sdp",)
    elif method == "INFO":
        accepted = DTMF_TYPES
    elif method == "NOTIFY":
        accepted = ("message/sipfrag",)
    else:
        accepted = ("application/sdp", "message/sipfrag", *DTMF_TYPES)
    # 100rel is about an INVITE's provisional responses (RFC 3262 §3, sip.core.prack): nothing elsewhere
    supported = (*SUPPORTED_OPTIONS, RELIABLE_PROVISIONALS) if method == "INVITE" else SUPPORTED_OPTIONS
    rejection = check_request(request, supported_options=supported, accepted_types=accepted)
    if rejection is not None:
        return Refusal(rejection.status, f"refused_{rejection.status}", rejection.headers, rejection.reason)
    return None


def vet_invite(
    request: Request, config: UaConfig, transport: str, trunk: Trunk | None, sent_by: str
) -> VettedInvite | Refusal:
    """A new INVITE's own checks (see the module docstring); `sent_by` is our host:port for a 488's Warning."""
    try:
        expires, _ = session_expires(request)
        min_se(request)
    except ValueError as exc:
        return Refusal(400, "malformed_400", reason=str(exc))
    if expires is not None and expires < config.min_se_s:
        return Refusal(422, "session_interval_422", (("Min-SE", str(config.min_se_s)),))
    offer: SessionDescription | None = None
    if request.body:
        offer = parse_sdp_or_none(request.body)
        if offer is None:
            return Refusal(400, "bad_sdp_400", reason="Bad SDP body")
    refusal = offer_refusal(config, offer, transport, trunk)
    if refusal is not None:
        warning = (("Warning", refusal.warning_header(sent_by)),)
        return Refusal(488, f"offer_488_{refusal.cause}", warning, refusal.reason, refusal)
    try:
        from_value = parse_name_addr(request.headers.get("From") or "")
        to_value = parse_name_addr(request.headers.get("To") or "")
    except ValueError:
        return Refusal(400, "malformed_400", reason="Bad From or To header")
    return VettedInvite(offer, from_value, to_value)


def offer_refusal(
    config: UaConfig, offer: SessionDescription | None, transport: str, trunk: Trunk | None
) -> OfferRefusal | None:
    """Why a new INVITE can never be answered (SRTP required, by its trunk or else `UaConfig.srtp`, over a
    transport that may not carry keys, or an offer `answer` would refuse), or None. An INVITE without SDP is
    checked when the ACK brings the answer (RFC 3264 gives no way to refuse there: `CallConfirmed(media=None)`,
    and the shell hangs up)."""
    srtp = trunk.srtp if trunk is not None else config.srtp
    policy = sdes_policy(srtp, transport)
    if policy is None:
        return OFFER_REFUSALS["tls_required"]
    if offer is None:
        return None
    codecs = trunk.codecs if trunk is not None else config.codecs
    refusal = check_offer(offer, codecs=codecs, srtp=policy, crypto_suites=config.crypto_suites)
    if refusal is not None and refusal.cause == "srtp_off" and srtp != "off":
        return OFFER_REFUSALS["srtp_needs_tls"]  # SRTP is on, but not over this transport
    return refusal
