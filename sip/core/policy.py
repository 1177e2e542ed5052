"""Inbound policy (the toll-fraud defences), sans-I/O: what happens to an out-of-dialog request before
anything else does. `sip.core.ua.UserAgent(policy=InboundPolicy(...))` asks it about every request without a To
tag except ACK, before its own checks, so a refused source never causes an `IncomingCall` (hence never a
provider connection or an application callback) and learns nothing about us.

The checks, in order (the first that refuses decides; each refusal is counted in `counters`):
1. User-Agent blocklist (`scanner_*`): a case-insensitive substring of User-Agent (friendly-scanner,
   sipvicious, sipcli, VaxSIPUserAgent, ...) → dropped silently by default (`scanner_action`): an answer only
   tells the scanner that someone listens.
2. CIDR allowlist (`allow`, IPv4 and IPv6; an IPv4-mapped IPv6 source is checked as IPv4): a source outside
   it → 403 Forbidden, or dropped with `drop_unknown`. An empty allowlist allows every source.
3. Per-source INVITE rate (a token bucket per source IP on `now`: `invite_burst` tokens, refilled at
   `invite_rate_per_s`) → 503 with Retry-After (the seconds until a token is back). The table of sources is
   bounded (`max_sources`, least recently seen evicted).
   Out-of-dialog OPTIONS have a bucket of their own (`options_rate_per_s`, `options_burst`): beyond it they
   are dropped silently, because under a flood an answer of any kind costs as much as a 200; a
   load balancer's probe, a few a minute, never comes near it.
4. A method the bridge does not serve (not in `served`, the methods `sip.core.ua` answers: REGISTER, SUBSCRIBE,
   MESSAGE, PUBLISH, anything unknown) is let through to the user agent, which refuses it (405 or 501 with
   Allow) before any digest check: the answer is the same whatever credentials it carries, so it never tells
   a right password from a wrong one.
5. Inbound digest (`auth`, a `sip.core.auth.DigestServer`) for INVITE and every other served method except OPTIONS
   (a load balancer's probe), CANCEL and ACK (RFC 3261 §22.1: they cannot be challenged): no or wrong
   credentials → a challenge; right credentials on an old nonce → a challenge with stale=true. Each check is
   guarded (`guard`, a `sip.core.guard.AuthGuard`): failures are counted per source and per user across methods;
   a source backing off, or a user guarded against it, is dropped before its credentials are looked at; a
   banned source is dropped silently before check 2, whatever its method (see sip/core/guard.py). We challenge
   with 401 / WWW-Authenticate by default: the bridge is the user agent that answers, not a proxy (§22.3);
   pass `DigestServer(..., proxy=True)` for 407 when a PBX expects proxy authentication.
The allowlist and digest combine with AND: when both are set, a source must be allowed and authenticate.

Trunks (`trunks`, sip/core/trunks.py): after the User-Agent check each request is matched to its trunk (source
address, registrar address, then digest user) and that trunk's allowlist and inbound digest replace the global
ones in checks 2 and 4 (the rate limits stay per source, whatever the trunk): a trunk without inbound
credentials is never challenged, one with them is challenged for its own user alone (another user's right
password is a wrong one here). A request that matches no trunk gets the global policy (`allow`, `auth`), and
beyond it:
- when any trunk has an allowlist, it is refused as a source outside every allowlist (403, or dropped with
  `drop_unknown`): the trunks' allowlists together are the global one, as a merged allowlist was;
- except when some trunk is known by its digest user alone (no allowlist): then an unmatched request is
  challenged, since that trunk's calls come from anywhere and name their user only in the answer. The
  digest server is shared (one realm, one nonce secret), so the answer to that challenge verifies against
  the trunk it names.
`Accept.trunk` names the matched trunk; the UA gives it to the call (its SRTP, NAT, RTP source and external
address).

A decision is a frozen dataclass: `Accept`, `Refuse(status, reason, headers)`, `Drop(reason)` or
`Challenge(status, headers)`. `check_bind(host, config, allow_any)` says whether `serve` may start.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Literal

from rtp.units import NS_PER_S
from sip.core.auth import AuthMissing, AuthOk, AuthStale, Credentials, DigestServer, parse_authorization
from sip.core.guard import AuthGuard
from sip.core.message import Request
from sip.core.trunks import Trunk, TrunkTable, host_address, parse_networks

__all__ = [
    "DEFAULT_SCANNERS",
    "Accept",
    "BindCheck",
    "Challenge",
    "Decision",
    "Drop",
    "InboundPolicy",
    "PolicyConfig",
    "SERVED_METHODS",
    "Refuse",
    "check_bind",
    "parse_networks",
]

DEFAULT_SCANNERS = (
    "friendly-scanner",
    "sipvicious",
    "sipcli",
    "vaxsipuseragent",
    "sip-scan",
    "sundayddr",
    "pplsip",
)
_UNCHALLENGED = frozenset({"ACK", "CANCEL", "OPTIONS"})
# The methods sip.core.ua answers (its ALLOWED; a unit test keeps the two equal): the others are refused by the user
# agent (405/501) before any digest check.
SERVED_METHODS = frozenset(
    {"INVITE", "ACK", "CANCEL", "BYE", "OPTIONS", "INFO", "UPDATE", "REFER", "NOTIFY", "PRACK"}
)


@dataclass(frozen=True, slots=True)
class Accept:
    """Go ahead. `username` is the authenticated user when digest was checked; `trunk` the trunk the request
    came from (None: it matched none and passed the global policy)."""

    username: str | None = None
    trunk: Trunk | None = None


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer with this final response (statelessly) and do nothing else."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Drop:
    """Send nothing at all."""

    reason: str


@dataclass(frozen=True, slots=True)
class Challenge:
    """Answer 401 or 407 with these challenge headers."""

    status: int
    headers: tuple[tuple[str, str], ...]
    stale: bool = False


Decision = Accept | Refuse | Drop | Challenge


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    allow: tuple[str, ...] = ()
    drop_unknown: bool = False
    invite_rate_per_s: float = 5.0
    invite_burst: int = 10
    options_rate_per_s: float = 0.0  # 0: no limit
    options_burst: int = 20
    max_sources: int = 10_000
    scanner_user_agents: tuple[str, ...] = DEFAULT_SCANNERS
    scanner_action: Literal["drop", "403"] = "drop"


def _host_key(host: str) -> str:
    """A source's key in the guard: its address, normalised (IPv4-mapped IPv6 as IPv4), else the text."""
    address = host_address(host)
    return str(address) if address is not None else host[:64]


def _username(fields: tuple[str, ...]) -> str | None:
    """The username of the first Digest credentials field, or None (the guard's per-user key)."""
    for value in fields:
        try:
            return parse_authorization(value).username
        except ValueError:
            continue
    return None


class _Bucket:
    __slots__ = ("tokens", "at")

    def __init__(self, tokens: float, at: int) -> None:
        self.tokens = tokens
        self.at = at


class _Limit:
    __slots__ = ("rate", "burst", "buckets")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.buckets: OrderedDict[str, _Bucket] = OrderedDict()  # least recently seen first


class InboundPolicy:
    """See the module docstring. `decide` never raises; `counters` counts every refusal by reason."""

    def __init__(
        self,
        config: PolicyConfig | None = None,
        *,
        auth: DigestServer | None = None,
        trunks: TrunkTable | tuple[Trunk, ...] = (),
        realm: str = "sip",
        guard: AuthGuard | None = None,
        served: frozenset[str] = SERVED_METHODS,
    ) -> None:
        """`auth`: the global digest (None: none); `trunks`: the trunks requests are matched to. Every trunk's
        inbound user is added to `auth` (or to a server of `realm` made for them), so that one server's
        nonces answer every challenge. ValueError for a bad network or a digest user two trunks share.
        `guard` counts digest failures (sip/core/guard.py); `served`: the methods the user agent answers."""
        self.config = config or PolicyConfig()
        self.auth = auth
        self.guard = guard if guard is not None else AuthGuard()
        self.served = served
        self.trunks = trunks if isinstance(trunks, TrunkTable) else TrunkTable(trunks)
        self._digest = auth
        for trunk in self.trunks.trunks:
            if trunk.inbound_auth is None:
                continue
            if self._digest is None:
                self._digest = DigestServer(realm, [])
            self._digest.add_user(Credentials(*trunk.inbound_auth))
        # an unmatched request is challenged (not refused) when a trunk is known by its digest user alone
        self._digest_only = any(t.inbound_auth is not None and not t.allow for t in self.trunks.trunks)
        self.networks = parse_networks(self.config.allow)
        self._scanners = tuple(s.lower() for s in self.config.scanner_user_agents if s)
        c = self.config
        self._limits = {  # per method: its token buckets by source, the rate and the burst
            "INVITE": _Limit(c.invite_rate_per_s, c.invite_burst),
            "OPTIONS": _Limit(c.options_rate_per_s, c.options_burst),
        }
        self.counters: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"InboundPolicy(allow={self.config.allow!r}, auth={self.auth!r})"

    @property
    def enforcing(self) -> bool:
        """Whether anything restricts who may call (an allowlist or digest)."""
        if self.networks or self.auth is not None:
            return True
        return any(t.allow or t.inbound_auth is not None for t in self.trunks.trunks)

    def allowed(self, host: str) -> bool:
        """Whether the global allowlist lets `host` in (with trunks: whether an unmatched request from `host`
        would pass it)."""
        if not self.networks:
            return not (self.trunks.networks and not self._digest_only)
        address = host_address(host)
        if address is None:
            return False
        return any(address.version == n.version and address in n for n in self.networks)

    def decide(self, request: Request, source: tuple[str, int], now: int) -> Decision:
        try:
            return self._decide(request, source, now)
        except Exception:  # peer input never raises; refuse rather than let it through
            self.counters["internal_error"] += 1
            return Drop("policy error")

    def _decide(self, request: Request, source: tuple[str, int], now: int) -> Decision:
        method = request.method
        agent = (request.headers.get("User-Agent") or "").lower()
        if agent and any(s in agent for s in self._scanners):
            self.counters["scanner"] += 1
            if self.config.scanner_action == "403":
                return Refuse(403, "Forbidden")
            return Drop("scanner User-Agent")
        host = _host_key(source[0])
        if self.guard.banned(host, now):
            self.counters["auth_ban_dropped"] += 1
            return Drop("source banned")
        trunk = self.trunks.match(source, request) if self.trunks else None
        if not (self.trunks.allows(trunk, source[0]) if trunk is not None else self.allowed(source[0])):
            self.counters["not_allowed"] += 1
            if self.config.drop_unknown:
                return Drop("source not allowed")
            return Refuse(403, "Forbidden")
        limit = self._limits.get(method)
        wait = self._take_token(limit, source[0], now) if limit is not None else None
        if wait is not None and method == "OPTIONS":
            self.counters["options_rate_limited"] += 1
            return Drop("OPTIONS rate limited")
        if wait is not None:
            self.counters["rate_limited"] += 1
            return Refuse(503, "Service Unavailable (rate limited)", (("Retry-After", str(wait)),))
        auth = self._digest
        if trunk is not None:
            wanted = trunk.inbound_user  # its own user alone; None: the trunk is not challenged
        else:
            challenged = self.auth is not None or self._digest_only
            wanted = "" if challenged else None  # "": any user that is not a trunk's (the global one)
        if auth is None or wanted is None or method in _UNCHALLENGED or method not in self.served:
            return Accept(trunk=trunk)  # an unserved method: the user agent's 405/501, never a digest verdict
        fields = request.headers.get_fields(auth.credentials_header)
        user = _username(fields)
        hold = self.guard.hold(host, user, now)
        if hold is not None:
            self.counters[f"auth_{hold}_dropped" if hold != "banned" else "auth_ban_dropped"] += 1
            return Drop(f"digest {hold.replace('_', ' ')}")
        verdict = auth.verify(method, request.uri, fields, now, request.body)
        if isinstance(verdict, AuthOk) and verdict.username == (wanted or verdict.username):
            self.counters["auth_ok"] += 1
            self.guard.succeeded(host, verdict.username, now)
            return Accept(verdict.username, trunk)
        if isinstance(verdict, AuthStale):
            self.counters["auth_stale"] += 1
            return Challenge(auth.status, auth.challenge(now, stale=True), stale=True)
        if isinstance(verdict, AuthMissing):
            self.counters["auth_missing"] += 1
        else:
            self.counters["auth_failed"] += 1
            self.guard.failed(host, user, now)
            for scope, n in self.guard.bans.items():  # bans begun, by scope (the metrics read them)
                self.counters[f"auth_bans_{scope}"] = n
        return Challenge(auth.status, auth.challenge(now))

    def _take_token(self, limit: _Limit, host: str, now: int) -> int | None:
        """Take one token from `host`'s bucket of `limit`; None when there was one, else the seconds until
        there is."""
        rate, burst, buckets = limit.rate, float(max(1, limit.burst)), limit.buckets
        if rate <= 0:
            return None  # no rate limit
        bucket = buckets.get(host)
        if bucket is None:
            bucket = _Bucket(burst, now)
            buckets[host] = bucket
            while len(buckets) > self.config.max_sources:
                buckets.popitem(last=False)
        else:
            buckets.move_to_end(host)
            elapsed = max(0, now - bucket.at) / NS_PER_S
            bucket.tokens = min(burst, bucket.tokens + elapsed * rate)
            bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - bucket.tokens) / rate))


@dataclass(frozen=True, slots=True)
class BindCheck:
    """`ok` False: refuse to start, `error` says why; `warning`: start, but say this loudly."""

    ok: bool
    error: str | None = None
    warning: str | None = None


def _is_loopback(host: str) -> bool:
    if host.strip().lower() in ("localhost", "localhost."):
        return True
    address = host_address(host)
    return address is not None and address.is_loopback


def check_bind(host: str, policy: InboundPolicy | None, *, allow_any: bool = False) -> BindCheck:
    """Whether `serve` may listen on `host` with `policy`: loopback always; any other address (0.0.0.0, ::
    and names included) only with an allowlist or inbound digest, or with `allow_any` (then with a warning)."""
    if _is_loopback(host) or (policy is not None and policy.enforcing):
        return BindCheck(True)
    if allow_any:
        return BindCheck(
            True,
            warning=(
                f"listening on {host} with no allowlist and no inbound authentication (--allow-any): any host "
                "that reaches this port can place calls and open paid provider sessions"
            ),
        )
    return BindCheck(
        False,
        error=(
            f"refusing to listen on {host} with no inbound policy: anyone who reaches the port could open paid "
            "provider sessions. Give --allow CIDR and/or --inbound-auth USER, or --allow-any to accept the risk"
        ),
    )
