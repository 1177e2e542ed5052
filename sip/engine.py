"""The seam between the bridge and a SIP engine: one typed protocol, one registry of engines.

`bridge` builds its engine only through `create_engine(name, config, on_call)` and sees calls only as
`sip.leg.CallLeg`s handed to `on_call`; it never imports an engine module. Each engine is one registry entry,
"name" → `EngineSpec("module:attribute", ...)`, imported lazily, so an engine whose optional dependencies are
not installed costs nothing until it is chosen, and then fails with `EngineUnavailable` naming the extra to
install (e.g. `pip install 'parlora-bridge[pjsua2]'`).

An engine (`SipEngine`) is built from an `EngineConfig` and `on_call`, and:
- `await start()` listens, or raises `EngineStartError` (bad address, port in use, ...). Once it listens it
  logs "listening on udp HOST:PORT" at INFO (tests and the bench wait for that line).
- calls `on_call(leg)` on the asyncio loop that ran `start()`, once per incoming INVITE it accepts; the leg is
  ringing (180) until `leg.answer()`.
- `await stop()` hangs up every call (each leg's events end with `CallEnded`) and releases its sockets and
  threads; False if it did not stop in time.
- `drain()`: from then on new calls are refused with 503 (and Retry-After), while live calls go on until
  they end; a load balancer probing with OPTIONS sees 503 too and sends new calls elsewhere (DESIGN §11).
  An engine that cannot do all of that says what it cannot in `drain()`'s log line and its docstring.
- `max_calls` (in force, after the engine's own cap), `active_calls` and `draining` for status and admission.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Protocol, TypeGuard

from sip.core.app_headers import DEFAULT_ALLOW
from sip.core.auth import Credentials, DigestServer
from sip.core.policy import DEFAULT_SCANNERS, BindCheck, InboundPolicy, PolicyConfig, check_bind
from sip.core.trunks import Trunk
from sip.leg import CallLeg

OnCall = Callable[[CallLeg], None]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What every engine is told. `max_calls` None means the engine's default (`EngineSpec.default_max_calls`);
    above the engine's own cap it is clamped (and the engine logs that)."""

    host: str = "127.0.0.1"
    port: int = 5060
    rtp_port: int = 4000  # first local RTP port; each call takes the next free pair
    rtp_port_high: int | None = None  # the range's last port (None: the engine's own pool size from rtp_port)
    tcp: bool = True  # the native engine: SIP over TCP on (host, port) too
    max_calls: int | None = None
    # The Server / User-Agent field (None: none at all) and the digest realm of inbound authentication (None:
    # `digest_realm`'s default). Both say nothing about the product by default: a scanner (svmap, svwar)
    # fingerprints what a server names itself, and a product name tells it which exploits and defaults to try.
    server_header: str | None = None
    realm: str | None = None
    # A transfer with no report (REFER response or NOTIFY) for this long ends with a final 408 (sip/core/transfer.py).
    transfer_timeout_s: float = 30.0
    retry_after_s: int = 30  # Retry-After on a 503 while draining or full
    # Inbound policy (sip/core/policy.py), asked about every out-of-dialog request before anything else:
    allow: tuple[str, ...] = ()  # CIDR allowlist (empty: every source); outside it → 403, or dropped
    drop_unknown: bool = False  # a source outside the allowlist gets no answer at all
    inbound_auth: tuple[str, str] | None = None  # (user, password): inbound requests must pass a digest
    # per-source INVITE token bucket → 503 with Retry-After; 0: no limit; None: 5/s off loopback, none on a
    # loopback bind (every source is local there: tests and the bench place hundreds of calls from one address)
    invite_rate_per_s: float | None = None
    invite_burst: int = 10
    # per-source out-of-dialog OPTIONS beyond this are dropped silently (under a flood an answer costs as much
    # as a 200); 0: no limit; None: 10/s (burst 20) off loopback, none on a loopback bind
    options_rate_per_s: float | None = None
    options_burst: int = 20
    # Registration (sip/core/register.py): one binding per address-of-record sip:USER@HOST[:PORT]
    register: tuple[str, ...] = ()
    auth_user: str | None = None  # digest user for REGISTER (default: the AoR's user)
    register_password: str | None = None  # never logged
    register_expires_s: int = 3600
    scanner_user_agents: tuple[str, ...] = (
        DEFAULT_SCANNERS  # sip/core/policy.py's blocklist (dropped, unanswered)
    )
    register_keepalive_s: float | None = 30.0  # OPTIONS to each registrar this often while registered
    # NAT: the address peers reach us at (Contact, Via sent-by, SDP c=/o=), None: the bound one
    external_address: str | None = None
    # NAT mode: symmetric RTP (rtp/latch.py latches each call to the first valid packet's source; we send there) and
    # in-dialog requests to the address the INVITE came from (a caller behind NAT with a private Contact)
    nat: bool = False
    # Without NAT mode, whose RTP a call takes (rtp/latch.py): "learn" the caller's source (Asterisk's strictrtp
    # with learning: the signalled address, or the first source sending 4 packets in sequence) or "strict"
    rtp_source: Literal["learn", "strict"] = "learn"
    # The inbound headers the application sees (sip/core/app_headers.py): names, a trailing "*" a prefix
    sip_headers: tuple[str, ...] = DEFAULT_ALLOW
    # TLS (sip/native/tls.py) and SRTP (SDES, rtp/srtp.py): a TLS listener at tls (host, port) with
    # cert/tls_key; tls_ca for outbound TLS; srtp "off" | "optional" | "required" (keys only over TLS)
    tls: tuple[str, int] | None = None
    cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    srtp: Literal["off", "optional", "required"] = "off"
    # The audio codecs a call of no trunk (and a call placed) offers and accepts, in our order; a trunk has its own
    # (sip.core.offer_answer.CODECS, sip/core/trunks.py)
    codecs: tuple[str, ...] = ("PCMU", "PCMA")
    # Call limits: BYE after this long (None: no limit); BYE when no caller RTP came for this long
    # (None: never; a call on hold is exempt), so a lost BYE cannot leave a call and its provider open
    max_call_duration_s: float | None = None
    rtp_timeout_s: float | None = None
    # The RTP timeout is suspended while the caller sends nothing by its SDP (on hold); a call that stays so
    # longer than this is ended with BYE (None: never). Session timers (RFC 4028): the interval asked for on
    # calls answered and offered on calls placed; 0: none asked for (a peer's request is still honoured).
    hold_timeout_s: float | None = 7200.0
    session_expires_s: int = 1800
    # Trunks as identities (sip/core/trunks.py): each inbound request is matched to its trunk, whose allowlist,
    # inbound digest, SRTP, NAT, RTP source and external address apply to it and its call alone (the fields
    # above are the global policy, for requests of no trunk); each trunk with a registrar keeps its own
    # binding with its own credentials, beside the `register` AoRs above
    trunks: tuple[Trunk, ...] = ()


class EngineError(RuntimeError):
    """A SIP engine could not be built or started."""


class EngineUnavailable(EngineError):
    """The engine named is unknown, or its module (or an optional dependency of it) cannot be imported."""


class EngineStartError(EngineError):
    """The engine could not start listening (bad address, port in use, ...)."""


@dataclass(frozen=True, slots=True)
class EngineFeatures:
    """What an engine offers beyond `SipEngine`, declared by its class instead of tested with isinstance (as
    `providers.base.Capabilities` declares what a provider protocol offers). All off by default; an engine
    that declares one has the methods of its protocol below, and the bridge asks the declaration (`offers_*`).

    `status`: it reports its listener and inbound-policy counters for `GET /sip` (`SipStatus`).
    `counters`: its core counts what it refused and dropped, for `/metrics` (`EngineCounters`).
    `held`: it counts what it holds right now, for `/metrics` (`EngineHeld`).
    `dial`: it places calls (`Dialer`).
    """

    status: bool = False
    counters: bool = False
    held: bool = False
    dial: bool = False


class SipEngine(Protocol):
    """A running SIP user agent that answers incoming calls as `CallLeg`s (see the module docstring)."""

    @property
    def features(self) -> EngineFeatures:
        """What the engine offers beyond this contract (`EngineFeatures`)."""
        ...

    @property
    def max_calls(self) -> int:
        """Concurrent calls in force: the configured number, clamped to the engine's own cap."""
        ...

    @property
    def active_calls(self) -> int:
        """Calls handed to `on_call` and not yet ended."""
        ...

    @property
    def draining(self) -> bool: ...

    async def start(self) -> None:
        """Listen; raises EngineStartError if the engine cannot."""
        ...

    async def stop(self) -> bool:
        """Hang up every call and stop; True when it stopped cleanly within its own deadline."""
        ...

    def drain(self) -> None:
        """Stop accepting new calls (503 to INVITEs and OPTIONS) while live calls finish; idempotent."""
        ...


class SipStatus(Protocol):
    """`EngineFeatures.status`: an engine that reports its listener and inbound-policy counters for the status
    (`GET /sip`)."""

    def sip_status(self) -> dict[str, object]: ...


class Dialer(Protocol):
    """`EngineFeatures.dial`: an engine that places calls: the leg's events are an inbound call's once
    answered, or end with `CallEnded(status_code=...)` (486 busy, 408 no answer, ...). 401/407 are answered
    with `auth_user` and `password`; `password=None` means the registration's credentials, `password=""` none
    at all. `headers`: the application's on the INVITE (`sip.core.outbound.check_headers`; ValueError, nothing
    sent). The leg's `identity.direction` is "outbound"."""

    async def dial(
        self,
        target: str,
        *,
        from_uri: str | None = None,
        ring_timeout_s: float | None = 60.0,
        auth_user: str | None = None,
        password: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> CallLeg: ...


class EngineCounters(Protocol):
    """`EngineFeatures.counters`: an engine whose core keeps counters of what it refused and dropped (the
    native engine's `stats()`)."""

    def stats(self) -> dict[str, int]: ...


class EngineHeld(Protocol):
    """`EngineFeatures.held`: an engine that counts what it holds right now (the native engine's
    `counts()`)."""

    def counts(self) -> dict[str, int]: ...


def offers_status(engine: SipEngine | None) -> TypeGuard[SipStatus]:
    """The engine declares `EngineFeatures.status` (None: no engine running)."""
    return engine is not None and engine.features.status


def offers_counters(engine: SipEngine | None) -> TypeGuard[EngineCounters]:
    """The engine declares `EngineFeatures.counters` (None: no engine running)."""
    return engine is not None and engine.features.counters


def offers_held(engine: SipEngine | None) -> TypeGuard[EngineHeld]:
    """The engine declares `EngineFeatures.held` (None: no engine running)."""
    return engine is not None and engine.features.held


def offers_dial(engine: SipEngine | None) -> TypeGuard[Dialer]:
    """The engine declares `EngineFeatures.dial` (None: no engine running)."""
    return engine is not None and engine.features.dial


class EngineFactory(Protocol):
    """What a registry entry names: a class (or function) that builds the engine."""

    def __call__(self, config: EngineConfig, on_call: OnCall) -> SipEngine: ...


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One registry entry. `target` is "module:attribute" of the `EngineFactory`; `extra` the optional
    dependency group (`pip install 'parlora-bridge[<extra>]'`) it needs, None if none; `default_max_calls`,
    `cap` and `limits` are read without importing the engine (for `serve --help`, `--max-calls`, the bench)."""

    target: str
    extra: str | None
    default_max_calls: int  # what `max_calls=None` means
    limits: str  # one line: what caps this engine, for help text and logs
    cap: int | None = None  # calls per process the engine can never exceed (compiled in), None if none


ENGINES: Mapping[str, EngineSpec] = MappingProxyType(
    {
        "pjsua2": EngineSpec(
            "sip.pjsua2.agent:Pjsua2UserAgent",
            extra="pjsua2",
            default_max_calls=4,
            limits="4 calls per process, compiled into the pjsua2-python wheel (PJSUA_MAX_CALLS)",
            cap=4,
        ),
        "native": EngineSpec(
            "sip.native.agent:NativeUserAgent",
            extra=None,
            default_max_calls=200,
            limits="no cap of its own: --max-calls (default 200), then 503 with Retry-After",
        ),
    }
)
DEFAULT_ENGINE = "native"  # DESIGN §11: native by default, pjsua2 the optional extra (parlora-bridge[pjsua2])


def check_listen(config: EngineConfig, *, allow_any: bool = False) -> BindCheck:
    """Whether an engine may listen on `config.host` with the inbound policy `config` gives
    (`sip.core.policy.check_bind`): loopback always; any other address only with `allow` and/or `inbound_auth`, or
    with `allow_any` (then `warning` says so, to be logged loudly)."""
    auth = None
    if config.inbound_auth is not None:
        auth = DigestServer(digest_realm(config), [Credentials(*config.inbound_auth)])
    try:
        policy = InboundPolicy(PolicyConfig(allow=config.allow), auth=auth, trunks=config.trunks)
    except ValueError as exc:  # a trunk's network, or an inbound user two trunks share
        return BindCheck(False, error=f"trunks: {exc}")
    return check_bind(config.host, policy, allow_any=allow_any)


def digest_realm(config: EngineConfig) -> str:
    """The realm inbound digest challenges name: `config.realm`, else the address the bridge advertises
    (`external_address`, else the bound host) as RFC 3261 §22.1 suggests (a realm names the protection space,
    typically the host; it tells a scanner nothing it did not know to reach us), else, on a wildcard bind,
    the neutral "sip". Peers' credentials answer any realm unless their configuration pins one."""
    if config.realm:
        return config.realm
    host = config.external_address or config.host
    return "sip" if host in ("", "0.0.0.0", "::", "[::]") else host


def engine_spec(name: str) -> EngineSpec:
    """The registry entry for `name`; EngineUnavailable naming the known engines if there is none."""
    spec = ENGINES.get(name)
    if spec is None:
        raise EngineUnavailable(f"unknown SIP engine {name!r}; known engines: {', '.join(sorted(ENGINES))}")
    return spec


def install_hint(spec: EngineSpec) -> str:
    return f"pip install 'parlora-bridge[{spec.extra}]'" if spec.extra else "reinstall parlora-bridge"


def load_engine(name: str) -> EngineFactory:
    """Import the engine `name` (first use only: importlib caches it) and return its factory."""
    spec = engine_spec(name)
    module_name, sep, attribute = spec.target.partition(":")
    if not sep or not module_name or not attribute:
        raise EngineUnavailable(
            f"SIP engine {name!r}: registry target {spec.target!r} is not 'module:attribute'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = exc.name or "?"
        if missing == module_name or module_name.startswith(f"{missing}."):
            raise EngineUnavailable(
                f"SIP engine {name!r} is not part of this installation (no module {module_name})"
            ) from exc
        raise EngineUnavailable(
            f"SIP engine {name!r} needs the optional dependency {missing!r}, which is not "
            f"installed: {install_hint(spec)}  ({exc})"
        ) from exc
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise EngineUnavailable(f"SIP engine {name!r}: {module_name} has no engine factory {attribute!r}")
    engine_factory: EngineFactory = factory
    return engine_factory


def create_engine(name: str, config: EngineConfig, on_call: OnCall) -> SipEngine:
    """Build (not start) the engine `name`."""
    return load_engine(name)(config, on_call)
