"""The layers of DESIGN §2 and §3, read from the source with `ast` (nothing is imported).

- The sans-I/O cores import no asyncio, socket, threading, time, selectors or subprocess (§3.1): every module
  of bridge/engine/, sip/ (but its engines' packages, sip/native/ and sip/pjsua2/), rtp/ and providers/, except
  the shells named below and modules named as shells (`*_shell`, an `asyncio` package), so a new core module
  is covered the day it is written.
- Dependencies flow one way (§2): `bridge` uses `sip`, `rtp`, `providers`; `sip` and `rtp` never import
  `bridge` or `providers`; `rtp` never imports `sip`; `providers` uses only `rtp`'s audio primitives; `bridge`
  never imports a SIP engine (§11), nor does `sip.core`; `bridge`'s layers are engine, server and cli, lowest
  first, and no import runs back up (a room imports no server module, the server no cli module).
- No import circle among the modules of bridge/, sip/, rtp/ and providers/.

Every import counts: module level, inside functions, and under `TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("bridge", "sip", "rtp", "providers")
IO = frozenset({"asyncio", "socket", "threading", "time", "selectors", "subprocess"})

# The bridge's layers, lowest first (DESIGN §2): the sans-I/O session rooms, the asyncio server around them,
# the command line on top. A layer imports only its own and the ones below it.
BRIDGE_LAYERS = ("bridge.engine", "bridge.server", "bridge.cli")
# Rooms the layer rules must see (a rename is made here too, or the rules would silently cover less).
BRIDGE_ROOMS = frozenset(
    f"bridge.engine.{name}"
    for name in (
        "coordinator",
        "rooms",
        "caller",
        "reservoir",
        "barrier",
        "turns",
        "recovery",
        "connections",
        "rollover",
        "delegations",
        "telephony",
        "timeline",
        "usage",
        "status",
        "commands",
        "vad",
        "framing",
        "cushion",
    )
)
# Shells: the only modules of sip/ and rtp/ that may touch sockets, threads, the clock or the event loop.
# The engines' packages: the only SIP modules that may touch sockets, threads, the clock or the event loop.
SIP_SHELL_PACKAGES = ("sip.native", "sip.pjsua2")
SIP_SHELLS = frozenset(
    {
        "sip.native.agent",
        "sip.native.leg",
        "sip.native.dialling",
        "sip.native.trunking",
        "sip.pjsua2.agent",
        "sip.native.tls",
        "sip.native.transport",
    }
)
RTP_SHELLS = frozenset(
    {
        "rtp.clock",  # the process-wide media clock's timer
        "rtp.endpoint",  # the per-call socket pair
        "rtp.probe",  # the benchmark's latency probe
        "rtp.playout",  # a lock: pjmedia's clock thread pulls frames
    }
)
# The adapters hold their protocol core and its asyncio shell in one module; the fakes are test peers (servers).
PROVIDER_SHELLS = frozenset({"providers.ws_shell", "providers.gemini_live", "providers.realtime_family"})
PROVIDER_SHELL_PACKAGES = ("providers.fakes",)
# audio formats, G.711, resampling, the units of time
PROVIDERS_MAY_USE_RTP = ("rtp.audio", "rtp.g711", "rtp.resample", "rtp.units")


def modules(root: Path = ROOT) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module `name` imports anywhere in its source: project modules by their own name (`from bridge
    import x` is bridge.x when that is a module), others by their top-level name."""

    def resolve(dotted: str) -> str:
        while dotted not in known and "." in dotted:
            dotted = dotted.rpartition(".")[0]
        return dotted

    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(resolve(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            out.update(resolve(f"{base}.{alias.name}") for alias in node.names)
    out.discard(name)
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


@functools.cache
def project() -> dict[str, set[str]]:
    return graph()


def core(name: str) -> bool:
    """A sans-I/O core: not a named shell, nor a module that says it is one (`*_shell`, an `asyncio` package)."""
    top = name.split(".")[0]
    if name.endswith("_shell") or ".asyncio" in name:
        return False
    if top == "bridge":
        return under(name, "bridge.engine")
    if top == "sip":
        return not under(name, *SIP_SHELL_PACKAGES)
    if top == "rtp":
        return name not in RTP_SHELLS
    return name not in PROVIDER_SHELLS and not name.startswith(PROVIDER_SHELL_PACKAGES)


def under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _above(m: str, dep: str) -> bool:
    """`dep` is in a higher bridge layer than `m` (an import running back up)."""
    rank = {layer: i for i, layer in enumerate(BRIDGE_LAYERS)}
    mine = next((rank[x] for x in BRIDGE_LAYERS if under(m, x)), None)
    theirs = next((rank[x] for x in BRIDGE_LAYERS if under(dep, x)), None)
    return mine is not None and theirs is not None and theirs > mine


def io_in_cores(g: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{m} imports {dep}" for m, deps in g.items() if core(m) for dep in deps if dep.split(".")[0] in IO
    )


def arrows_back(g: dict[str, set[str]]) -> list[str]:
    wrong: list[str] = []
    for m, deps in g.items():
        for dep in deps:
            if (
                (under(m, "sip", "rtp", "providers") and under(dep, "bridge"))
                or (under(m, "sip", "rtp") and under(dep, "providers"))
                or (under(m, "rtp", "providers") and under(dep, "sip"))
                or (under(m, "providers") and under(dep, "rtp") and not under(dep, *PROVIDERS_MAY_USE_RTP))
                or (under(m, "bridge") and under(dep, *SIP_SHELL_PACKAGES))
                or (under(m, "sip.core") and under(dep, *SIP_SHELL_PACKAGES))
                or _above(m, dep)
            ):
                wrong.append(f"{m} imports {dep}")
    return sorted(wrong)


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in g:
        if start in index:
            continue
        work = [(start, iter(sorted(g[start] & g.keys())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, rest = work[-1]
            for nxt in rest:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(g[nxt] & g.keys()))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def test_the_named_modules_exist() -> None:
    """A renamed room or shell is renamed here too, or the rules would silently cover nothing."""
    known = modules()
    named = BRIDGE_ROOMS | SIP_SHELLS | RTP_SHELLS | PROVIDER_SHELLS
    assert sorted(n for n in named if n not in known) == []
    assert {
        "sip.core.message",
        "sip.core.headers",
        "sip.core.framing",
        "sip.core.transaction",
        "sip.core.client_transaction",
        "sip.core.server_transaction",
        "sip.core.transaction_layer",
        "sip.core.dialog",
        "sip.core.ua",
        "sip.core.sdp",
        "sip.core.sdes",
        "sip.core.offer_answer",
        "sip.core.auth",
    } <= {m for m in known if core(m)}
    assert {"rtp.jitter", "rtp.packet", "providers.events"} <= {m for m in known if core(m)}


def test_sans_io_cores_import_no_io() -> None:
    assert io_in_cores(project()) == []


def test_dependencies_flow_one_way() -> None:
    assert arrows_back(project()) == []


def test_no_import_circle() -> None:
    assert circles(project()) == []


def test_the_checks_see_a_violation() -> None:
    """Each check reports what it is written to find (a planted graph)."""
    planted = {
        "bridge.engine.barrier": {"time", "bridge.engine.commands", "bridge.server.session"},
        "bridge.engine.commands": {"bridge.engine.barrier"},
        "bridge.server.session": {"asyncio"},
        "rtp.jitter": {"sip.core.message"},
        "sip.core.message": set(),
        "providers.events": {"rtp.jitter", "rtp.audio"},
        "rtp.audio": set(),
        "bridge.server.api": {"bridge.cli.config", "bridge.engine.commands"},
        "bridge.cli.config": {"sip.native.agent", "bridge.server.api"},
        "sip.core.ua": {"sip.native.transport", "sip.core.message"},
    }
    assert io_in_cores(planted) == ["bridge.engine.barrier imports time"]
    assert arrows_back(planted) == [
        "bridge.cli.config imports sip.native.agent",
        "bridge.engine.barrier imports bridge.server.session",
        "bridge.server.api imports bridge.cli.config",
        "providers.events imports rtp.jitter",
        "rtp.jitter imports sip.core.message",
        "sip.core.ua imports sip.native.transport",
    ]
    assert circles(planted) == [
        ["bridge.cli.config", "bridge.server.api"],
        ["bridge.engine.barrier", "bridge.engine.commands"],
    ]
