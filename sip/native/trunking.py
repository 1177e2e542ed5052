"""The trunk edge of the native engine, beside its SIP loop (sip.native.agent): the registrations (RFC 3261 §10)
resolved once at start, logged when they change and reported, and the inbound policy's status. The plan
itself (which bindings, which policy, which rates) is sip/core/native_plan.py; the trunks sip/core/trunks.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict

from sip.core import ua as core
from sip.core.native_plan import invite_rate, options_rate, registration_plan
from sip.core.policy import InboundPolicy
from sip.core.register import Registration
from sip.core.uri import parse_uri
from sip.engine import EngineConfig
from sip.native.leg import media_address

log = logging.getLogger("parlora.sip")


async def resolve_registrations(
    config: EngineConfig, loop: asyncio.AbstractEventLoop, host: str, port: int, rng: random.Random
) -> tuple[list[Registration], dict[str, tuple[str, ...]]]:
    """One `Registration` per binding of `registration_plan` (RFC 3261 §10), each registrar's name
    resolved once here; and, per trunk, the addresses its registrar resolved to (its calls come from
    there: sip/core/trunks.py)."""
    out: list[Registration] = []
    addresses: dict[str, tuple[str, ...]] = {}
    for binding in registration_plan(config):
        uri = parse_uri(binding.aor)
        default_port = 5061 if uri.scheme == "sips" else 5060
        infos = await loop.getaddrinfo(uri.host.strip("[]"), uri.port or default_port, type=socket.SOCK_DGRAM)
        if not infos:
            raise ValueError(f"cannot resolve {uri.host}")
        destination = (str(infos[0][4][0]), int(infos[0][4][1]))
        ours = binding.external_address or media_address(host, destination[0])
        out.append(
            binding.registration(
                destination,
                ours,
                port,
                config.server_header,
                random.Random(rng.getrandbits(64)),
            )
        )
        if binding.trunk is not None:
            found = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
            addresses[binding.trunk] = addresses.get(binding.trunk, ()) + found
    return out, addresses


def registrations_status(ua: core.UserAgent, now: int) -> list[dict[str, object]]:
    """GET /registrations: state, expiry and last error of each binding."""
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
                round(max(0, st.next_attempt_at - now) / 1e9, 1) if st.next_attempt_at is not None else None
            ),
            "keepalive": asdict(st.keepalive) if st.keepalive is not None else None,
        }
        for st in ua.registrations(now)
    ]


class RegistrationLog:
    """One log line per change of a registration's state (and why, when it failed)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, str | None, int, str | None]] = {}

    def changes(self, ua: core.UserAgent, now: int) -> None:
        """Log what changed since the last call."""
        for st in ua.registrations(now):
            alive = st.keepalive.state if st.keepalive is not None else None
            key = (st.state, st.last_error, st.failures, alive)
            seen = self._seen.get(st.aor)
            if seen == key:
                continue
            self._seen[st.aor] = key
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


def policy_status(
    config: EngineConfig, policy: InboundPolicy | None, stats: Mapping[str, int], trunk_calls: Counter[str]
) -> dict[str, object]:
    """The `policy` part of the engine's `sip_status()`: the inbound policy, its refusal counters, and each
    trunk's identity with the calls it brought."""
    return {
        "allow": list(config.allow),
        "drop_unknown": config.drop_unknown,
        "inbound_auth": config.inbound_auth is not None,
        "invite_rate_per_s": invite_rate(config),
        "options_rate_per_s": options_rate(config),
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
                "calls": trunk_calls[t.name],
            }
            for t in config.trunks
        ],
    }
