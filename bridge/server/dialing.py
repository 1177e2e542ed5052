"""Outbound calls: which trunk carries a call the bridge places, and with which credentials.

A call placed with `Server.dial` (`POST /calls`, `parlora-bridge call`) goes out through one trunk of the
configuration, chosen by `choose_trunk`:

1. the trunk the request names (`trunk` in the `POST /calls` body, `call --trunk`); a name that is not a
   trunk's refuses the call before anything is sent;
2. else the trunk whose registrar's host is the target's host, or whose `allow` networks hold the target's
   address (a carrier's SBC is usually both the registrar and an allowed source);
3. else, for a bare number only, the first trunk with a registrar (the account calls go out on);
4. else the trunk with no address of its own (neither registrar nor `allow`: the command line's `--auth-user`
   is one), whose credentials were given for whatever it calls;
5. else none: the call goes direct to the target's host, with no credentials at all. A URI whose host is no
   trunk's never gets an addressed trunk's digest answer: a host that challenged it could guess the password offline
   from the response (RFC 3261 §22.4 leaves the realm check to the UAC; we check the host).

The chosen trunk's digest user and password answer the 401/407 of the INVITE (RFC 3261 §22.2: the native
engine's UAC answers one challenge per request, sip/core/auth.py); its registered address of record is the call's
From when the request gives none, since a carrier accepts calls from its account's identity. A target without
a scheme (`+4930123456`) is the trunk's number: it is dialled at the trunk's registrar host (`sip:NUMBER@HOST`),
and needs a trunk with a registrar.

`choose_trunk` takes any sequence of objects with a `name`, a `registrar` and `allow` networks (the file's
`bridge.cli.config.Trunk`, or `DialTrunk`, which adds the password the environment holds): the rule is one function
whoever keeps the trunks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from bridge.engine.dial_limits import TrunkLimits
from sip.core.uri import parse_uri


class TrunkAddress(Protocol):
    """What the trunk choice reads of a trunk."""

    @property
    def name(self) -> str: ...

    @property
    def registrar(self) -> str | None: ...

    @property
    def allow(self) -> tuple[str, ...]: ...


T = TypeVar("T", bound=TrunkAddress)


@dataclass(frozen=True, slots=True)
class DialTrunk:
    """A trunk as an outbound call uses it: where it is, and the credentials that answer its challenges."""

    name: str
    registrar: str | None = None  # sip:USER@HOST[:PORT]: its host is the trunk's, USER@HOST its identity
    allow: tuple[str, ...] = ()  # CIDRs: the trunk's own addresses
    auth_user: str | None = None  # digest user (default: the registrar's user)
    password: str | None = field(default=None, repr=False)  # never logged
    limits: TrunkLimits = (
        TrunkLimits()
    )  # calls per second and at once through it (bridge/engine/dial_limits.py)

    @property
    def credentials(self) -> tuple[str | None, str]:
        """(digest user, password) for the INVITE's 401/407; (None, "") when the trunk has no password: its
        challenges go unanswered, never with another trunk's credentials (`Dialer.dial`'s `password=""`)."""
        if not self.password:
            return None, ""
        user = self.auth_user or (_user(self.registrar) if self.registrar else None)
        return user, self.password

    @property
    def identity(self) -> str | None:
        """The address of record it registers (the From of the calls it carries), or None."""
        if self.registrar is None:
            return None
        uri = parse_uri(self.registrar)
        return f"{uri.scheme}:{uri.user}@{uri.host}" if uri.user else None


def _user(uri: str) -> str | None:
    return parse_uri(uri).user


def _host(uri: str) -> str:
    return parse_uri(uri).host.strip("[]").lower()


def _inside(host: str, networks: tuple[str, ...]) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(cidr, strict=False) for cidr in networks)


def choose_trunk(trunks: Sequence[T], target: str, name: str | None = None) -> T | None:
    """The trunk an outbound call to `target` goes out on (module docstring: by `name`, by the target's host,
    the first with a registrar for a bare number, or None for a direct call). ValueError when `name` is no trunk's."""
    if name is not None:
        named = next((t for t in trunks if t.name == name), None)
        if named is None:
            have = ", ".join(t.name for t in trunks) or "none"
            raise ValueError(f"trunk {name!r}: no trunk has that name (trunks: {have})")
        return named
    host = _host(target) if ":" in target else ""
    if host:
        for trunk in trunks:
            if trunk.registrar is not None and _host(trunk.registrar) == host:
                return trunk
        for trunk in trunks:
            if _inside(host, trunk.allow):
                return trunk
        # a trunk with no address of its own (the command line's --auth-user) answers whoever it calls
        return next((t for t in trunks if t.registrar is None and not t.allow), None)
    return next((t for t in trunks if t.registrar is not None), None)


def dial_target(target: str, trunk: TrunkAddress | None) -> str:
    """The URI to call: `target` itself, or a bare number (no scheme) at the trunk's registrar host
    (`sip:NUMBER@HOST[:PORT]`). ValueError for a bare number with no trunk that has a registrar."""
    if ":" in target:
        return target
    if trunk is None or trunk.registrar is None:
        raise ValueError(
            f"{target!r} is a number, not a sip: URI: name a trunk with a registrar to dial it through"
        )
    uri = parse_uri(trunk.registrar)
    where = f"{uri.host}:{uri.port}" if uri.port else uri.host
    transport = uri.param("transport")
    return f"{uri.scheme}:{target}@{where}" + (f";transport={transport}" if transport else "")
