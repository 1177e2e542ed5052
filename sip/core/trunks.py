"""Trunks as identities, sans-I/O: which trunk an inbound request came from, and that trunk's policy.

A `Trunk` is one `[[trunks]]` of the configuration as a SIP engine needs it: who it is (its `allow` CIDRs, its
inbound digest user, its registrar), what its calls get (SRTP mode, NAT mode, RTP source policy, the external
address written into Contact, Via and SDP, the codecs offered and accepted) and how we register with it (registrar AoR, credentials, expiry,
keep-alive). Its fields are its own: a trunk without `external_address` advertises the bound address, one
without `srtp` gets plain RTP, whatever another trunk says.

`TrunkTable(trunks).match(source, request)` names the trunk of an out-of-dialog request; the first rule that
gives an answer decides:
1. the source address against every trunk's `allow` CIDRs: the longest prefix wins (a /32 for one SBC beats
   its carrier's /24, as a router would choose), the earlier trunk on a tie;
2. the source address against the addresses a trunk's registrar resolved to (the shell resolves them once,
   at start, and hands them in as `registrar_addresses`): a registrar sends us the calls for the binding we
   keep there;
3. the username of a Digest Authorization / Proxy-Authorization field that is a trunk's inbound digest user.
The Request-URI and To are not used: anyone can write any URI, while the source address (through the
allowlist) and the digest user (through its password) are checked before the request goes on.

None means no trunk: the request gets the global policy (the engine's own `allow`, `inbound_auth`, `srtp`,
`nat`, `rtp_source`, `external_address`), see `sip.core.policy.InboundPolicy`. Matching never raises on peer
input: an address or an Authorization field that cannot be read matches nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sip.core.auth import parse_authorization
from sip.core.message import Request

__all__ = ["Trunk", "TrunkTable", "host_address", "match", "parse_networks"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_CREDENTIALS_HEADERS = ("Authorization", "Proxy-Authorization")


@dataclass(frozen=True, slots=True)
class Trunk:
    """One trunk's identity and policy (see the module docstring). Passwords never appear in repr."""

    name: str
    allow: tuple[str, ...] = ()  # CIDRs (or bare addresses) its requests come from
    inbound_auth: tuple[str, str] | None = None  # (user, password) its requests must pass a digest with
    srtp: Literal["off", "optional", "required"] = "off"  # SDES-SRTP for its calls (keys only over TLS)
    nat: bool = False  # symmetric RTP and in-dialog requests to the INVITE's source, for its calls
    rtp_source: Literal["learn", "strict"] = "learn"  # without NAT mode: rtp/latch.py's source policy
    external_address: str | None = None  # the address its peers reach us at (Contact, Via, SDP c=/o=)
    registrar: str | None = None  # sip:USER@HOST[:PORT] we keep a binding at (RFC 3261 §10)
    auth_user: str | None = None  # digest user of our REGISTER (default: the AoR's user)
    register_password: str | None = None
    register_expires_s: int = 3600
    register_keepalive_s: float | None = 30.0  # OPTIONS to the registrar this often while registered
    # P-Asserted-Identity and Diversion of its INVITEs give the caller ID (sip/core/app_headers.py)
    trust_identity_headers: bool = False
    # the audio codecs its calls offer and accept, in our order (sip.core.offer_answer.CODECS)
    codecs: tuple[str, ...] = ("PCMU", "PCMA")

    def __repr__(self) -> str:
        user = self.inbound_auth[0] if self.inbound_auth is not None else None
        return (
            f"Trunk({self.name!r}, allow={self.allow!r}, inbound_user={user!r}, registrar={self.registrar!r})"
        )

    __str__ = __repr__

    @property
    def inbound_user(self) -> str | None:
        return self.inbound_auth[0] if self.inbound_auth is not None else None

    def policy_key(self) -> tuple[object, ...]:
        """Everything an inbound request or call of this trunk gets: two trunks with equal keys are treated
        alike."""
        return (
            self.allow,
            self.inbound_auth,
            self.srtp,
            self.nat,
            self.rtp_source,
            self.external_address,
            self.codecs,
        )


def host_address(host: str) -> Address | None:
    """`host` as an IP address (an IPv4-mapped IPv6 one as IPv4, a zone id dropped), None when it is not one."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0].strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_networks(cidrs: tuple[str, ...] | list[str]) -> tuple[Network, ...]:
    """`--allow` values as networks (a bare address is a /32 or /128); ValueError names a bad one."""
    out: list[Network] = []
    for text in cidrs:
        try:
            out.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"not an IP network: {text!r} ({exc})") from None
    return tuple(out)


def _digest_users(request: Request) -> list[str]:
    users: list[str] = []
    for name in _CREDENTIALS_HEADERS:
        for value in request.headers.get_fields(name):
            try:
                users.append(parse_authorization(value).username)
            except ValueError:
                continue
    return users


class TrunkTable:
    """The trunks an engine knows, compiled for matching (see the module docstring). ValueError at
    construction for an allowlist entry that is not a network or two trunks with one inbound digest user."""

    def __init__(
        self, trunks: tuple[Trunk, ...] = (), registrar_addresses: Mapping[str, tuple[str, ...]] | None = None
    ) -> None:
        self.trunks = trunks
        self._by_network: list[tuple[Network, int, Trunk]] = []  # longest prefix first, then file order
        for order, trunk in enumerate(trunks):
            for network in parse_networks(trunk.allow):
                self._by_network.append((network, order, trunk))
        self._by_network.sort(key=lambda entry: (-entry[0].prefixlen, entry[1]))
        self._by_registrar: dict[Address, Trunk] = {}
        by_name = {t.name: t for t in trunks}
        for name, addresses in (registrar_addresses or {}).items():
            named = by_name.get(name)
            for text in addresses:
                address = host_address(text)
                if named is not None and address is not None:
                    self._by_registrar.setdefault(address, named)
        self._by_user: dict[str, Trunk] = {}
        for trunk in trunks:
            user = trunk.inbound_user
            if user is None:
                continue
            if user in self._by_user:
                raise ValueError(
                    f"trunks {self._by_user[user].name!r} and {trunk.name!r} have the same inbound digest "
                    f"user {user!r}: a request could not be told apart"
                )
            self._by_user[user] = trunk

    def __bool__(self) -> bool:
        return bool(self.trunks)

    @property
    def networks(self) -> tuple[Network, ...]:
        """Every trunk's allowlist, together."""
        return tuple(network for network, _, _ in self._by_network)

    def allows(self, trunk: Trunk, host: str) -> bool:
        """Whether `trunk`'s allowlist lets `host` in (an empty allowlist lets every source in)."""
        if not trunk.allow:
            return True
        address = host_address(host)
        if address is None:
            return False
        return any(
            t is trunk and address.version == n.version and address in n for n, _, t in self._by_network
        )

    def match(self, source: tuple[str, int] | str, request: Request) -> Trunk | None:
        """The trunk `request` from `source` ("host" or (host, port)) came from, or None. Never raises."""
        host = source if isinstance(source, str) else source[0]
        address = host_address(host)
        if address is not None:
            for network, _, trunk in self._by_network:
                if address.version == network.version and address in network:
                    return trunk
            by_registrar = self._by_registrar.get(address)
            if by_registrar is not None:
                return by_registrar
        if self._by_user:
            try:
                users = _digest_users(request)
            except Exception:  # peer input never raises
                users = []
            for user in users:
                by_user = self._by_user.get(user)
                if by_user is not None:
                    return by_user
        return None


def match(trunks: tuple[Trunk, ...], source: tuple[str, int] | str, request: Request) -> Trunk | None:
    """`TrunkTable(trunks).match(source, request)` for a one-off question (an engine keeps its table)."""
    return TrunkTable(trunks).match(source, request)
