"""Calls we place on the native engine, beside the core's INVITE (sip/core/outbound.py): what
`NativeUserAgent.dial` (sip.native.agent) needs before and after it. The target's transport and the call's
SRTP policy (SDES keys only over TLS, as inbound), the next hop resolved once, the digest credentials, the
call's identity, and the record of how it ended (`sip_status()["outbound"]`).
"""

from __future__ import annotations

import asyncio
import logging
import socket

from sip.core.auth import Credentials
from sip.core.identity import call_identity
from sip.core.sdes import SrtpPolicy, sdes_policy
from sip.core.uri import SipUri, parse_uri
from sip.engine import EngineConfig
from sip.leg import CallIdentity
from sip.native.early import early_outcome
from sip.native.leg import NativeLeg

log = logging.getLogger("parlora.sip")

# how a call we placed ended, by its final status (any other status: "failed")
_OUTCOMES = {486: "busy", 600: "busy", 408: "no answer", 487: "cancelled"}


def dial_route(target: str, srtp: SrtpPolicy) -> tuple[SipUri, str, SrtpPolicy]:
    """The target's URI, the transport sip.core.ua's dial chooses for it, and the call's SRTP policy. ValueError
    for a target that is no sip:/sips: URI, or for a transport that cannot carry the keys `srtp` requires."""
    uri = parse_uri(target)
    if uri.scheme not in ("sip", "sips"):
        raise ValueError(f"expected a sip: URI, got {target!r}")
    # the transport as sip.core.ua's dial chooses it; SDES keys only over TLS (as inbound)
    transport = (uri.transport or ("tls" if uri.scheme == "sips" else "udp")).lower()
    policy = sdes_policy(srtp, transport)
    if policy is None:
        raise ValueError(
            f"--srtp require: a call over {transport} cannot carry SRTP keys (SDES only over TLS); "
            "call a sips: URI or one with ;transport=tls"
        )
    return uri, transport, policy


async def resolve_target(loop: asyncio.AbstractEventLoop, uri: SipUri, transport: str) -> tuple[str, int]:
    """The address the INVITE goes to (the first the resolver gives); ValueError if there is none."""
    port = uri.port or (5061 if transport == "tls" else 5060)
    infos = await loop.getaddrinfo(uri.host.strip("[]"), port, type=socket.SOCK_DGRAM)
    if not infos:
        raise ValueError(f"cannot resolve {uri.host}")
    return (str(infos[0][4][0]), int(infos[0][4][1]))


def dial_credentials(
    config: EngineConfig, uri: SipUri, auth_user: str | None, password: str | None
) -> Credentials | None:
    """What answers a 401/407: `auth_user`/`password`, by default the registration's; `password=""`: none."""
    password = password if password is not None else config.register_password
    credentials = None
    if password:  # "": the caller says this call has no credentials (not even the registration's)
        credentials = Credentials(auth_user or config.auth_user or (uri.user or "parlora"), password)
    return credentials


def outbound_identity(call: str, target: str, from_uri: str, destination: tuple[str, int]) -> CallIdentity:
    """The identity of a call we place, as the session sees it (X-Direction: outbound)."""
    host = f"[{destination[0]}]" if ":" in destination[0] else destination[0]
    return call_identity(
        call,
        request_uri=target,
        from_uri=from_uri,
        to_uri=target,
        sip_call_id=call,
        source=f"{host}:{destination[1]}",
        headers=(("X-Direction", "outbound"),),
        direction="outbound",
    )


def outbound_outcome(leg: NativeLeg, status: int, reason: str, now: int) -> dict[str, object]:
    """How a call we placed ended, for `sip_status()["outbound"]` (with its early media: sip/native/early.py);
    one log line when it was not answered."""
    outcome = "answered" if leg.answered else _OUTCOMES.get(status, "failed")
    early = early_outcome(leg, now)
    if not leg.answered:
        log.info(
            "%s: outbound call to %s %s (%d %s)%s",
            leg.call,
            leg.identity.to_uri,
            outcome,
            status,
            reason,
            f" after early media ({early['early_media_ms']} ms)" if early else "",
        )
    return {
        "call": leg.call,
        "to": leg.identity.to_uri,
        "outcome": outcome,
        "status": status,
        "reason": reason,
        **early,
    }
