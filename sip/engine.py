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
from typing import Protocol

from sip.leg import CallLeg

OnCall = Callable[[CallLeg], None]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What every engine is told. `max_calls` None means the engine's default (`EngineSpec.default_max_calls`);
    above the engine's own cap it is clamped (and the engine logs that)."""

    host: str = "127.0.0.1"
    port: int = 5060
    rtp_port: int = 4000  # first local RTP port; each call takes the next free pair
    max_calls: int | None = None
    user_agent: str = "parlora-bridge"  # User-Agent / Server header
    # A transfer with no report (REFER response or NOTIFY) for this long ends with a final 408 (sip/transfer.py).
    transfer_timeout_s: float = 30.0
    retry_after_s: int = 30  # Retry-After on a 503 while draining or full


class EngineError(RuntimeError):
    """A SIP engine could not be built or started."""


class EngineUnavailable(EngineError):
    """The engine named is unknown, or its module (or an optional dependency of it) cannot be imported."""


class EngineStartError(EngineError):
    """The engine could not start listening (bad address, port in use, ...)."""


class SipEngine(Protocol):
    """A running SIP user agent that answers incoming calls as `CallLeg`s (see the module docstring)."""

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
            "sip.pjsua2_agent:Pjsua2UserAgent",
            extra="pjsua2",
            default_max_calls=4,
            limits="4 calls per process, compiled into the pjsua2-python wheel (PJSUA_MAX_CALLS)",
            cap=4,
        ),
        "native": EngineSpec(
            "sip.native:NativeUserAgent",
            extra=None,
            default_max_calls=200,
            limits="no cap of its own: --max-calls (default 200), then 503 with Retry-After",
        ),  # noqa: E501
    }
)
DEFAULT_ENGINE = "native"  # DESIGN §11: native by default, pjsua2 the optional extra (parlora-bridge[pjsua2])


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
