"""Fault injection for the provider fakes: what a real provider does when it misbehaves.

A fault is chosen per connection, by option (`--fault` on `parlora-bridge fake-provider`, or the fake's
options) or at runtime (`FakeServer.inject`, or `GET /_fault?spec=...` on the fake's port). Spec syntax:

    [N/]KIND[:VALUE][@AFTER_MS]

`N` limits the fault to the N-th connection (1-based; default: every connection), `VALUE` is the kind's
parameter, `AFTER_MS` delays it from the start of the connection's session (or from injection, at runtime).

Kinds and what the fakes must do:
- `burst:FACTOR`      send output FACTOR times faster than real time (a paced provider suddenly bursting)
- `stall:MS`          send no output for MS, then dump everything that was due at once
- `half_open`         send nothing more at all; keep the socket open (no close frame, no FIN)
- `close`             the provider's real session end: OpenAI `session_expired` error then close 1001;
                      GPT-Live `session.closed` (reason `expired`); Gemini `goAway` then 1011; xAI its cap
- `abrupt_close`      drop the TCP connection without a close frame
- `garbage_json`      send one frame that is not JSON
- `invalid_audio`     send one audio chunk whose payload is not valid base64
- `duplicate_tool_call` deliver every tool call / delegation twice
- `slow_handshake:MS` answer the session start MS late
- `refuse`            refuse the WebSocket upgrade (HTTP 503)

The schedule is sans-I/O: the fake's core asks it with `now`, and it returns its next deadline.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

_NS_PER_MS = 1_000_000


class FaultKind(enum.Enum):
    BURST = "burst"
    STALL = "stall"
    HALF_OPEN = "half_open"
    CLOSE = "close"
    ABRUPT_CLOSE = "abrupt_close"
    GARBAGE_JSON = "garbage_json"
    INVALID_AUDIO = "invalid_audio"
    DUPLICATE_TOOL_CALL = "duplicate_tool_call"
    SLOW_HANDSHAKE = "slow_handshake"
    REFUSE = "refuse"


# Kinds that take effect once, at their time; the others are states that last (for STALL: VALUE ms).
ONE_SHOT = frozenset(
    {FaultKind.CLOSE, FaultKind.ABRUPT_CLOSE, FaultKind.GARBAGE_JSON, FaultKind.INVALID_AUDIO}
)
_NEEDS_VALUE = frozenset({FaultKind.BURST, FaultKind.STALL, FaultKind.SLOW_HANDSHAKE})
_SPEC = re.compile(r"^(?:(?P<conn>\d+)/)?(?P<kind>[a-z_]+)(?::(?P<value>[0-9.]+))?(?:@(?P<after>\d+))?$")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: FaultKind
    value: float | None = None
    after_ms: int = 0
    connection: int | None = None  # 1-based connection index, None for every connection

    def applies_to(self, connection: int) -> bool:
        return self.connection is None or self.connection == connection

    def __str__(self) -> str:
        text = self.kind.value
        if self.value is not None:
            text += f":{int(self.value)}" if self.value.is_integer() else f":{self.value}"
        if self.after_ms:
            text += f"@{self.after_ms}"
        return f"{self.connection}/{text}" if self.connection is not None else text


def parse_fault(spec: str) -> Fault:
    """A Fault from its spec string; ValueError with the reason otherwise."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise ValueError(f"bad fault spec {spec!r}: expected [N/]KIND[:VALUE][@AFTER_MS]")
    try:
        kind = FaultKind(match["kind"])
    except ValueError:
        known = ", ".join(k.value for k in FaultKind)
        raise ValueError(f"unknown fault {match['kind']!r} (known: {known})") from None
    try:
        value = float(match["value"]) if match["value"] else None
    except ValueError:
        raise ValueError(f"bad fault value {match['value']!r} in {spec!r}: expected a number") from None
    if kind in _NEEDS_VALUE and value is None:
        raise ValueError(
            f"fault {kind.value} needs a value, e.g. {kind.value}:{4 if kind is FaultKind.BURST else 3000}"
        )
    if kind is FaultKind.BURST and value is not None and value <= 0:
        raise ValueError("burst factor must be positive")
    return Fault(kind, value, int(match["after"] or 0), int(match["conn"]) if match["conn"] else None)


class FaultSchedule:
    """The faults of one connection on its own clock (`start` = when its session started, in ns)."""

    def __init__(self, faults: list[Fault], connection: int, start: int) -> None:
        self.connection = connection
        self._start = start
        self._pending: list[tuple[int, Fault]] = []  # (due time, fault)
        self._states: dict[FaultKind, tuple[int, Fault]] = {}  # active lasting faults, with their start
        self.fired: list[Fault] = []
        self._unreported: list[
            Fault
        ] = []  # lasting faults that `active()` switched on before `due()` said so
        for fault in faults:
            self.add(fault, start, from_start=True)

    def add(self, fault: Fault, now: int, *, from_start: bool = False) -> None:
        """Schedule a fault; at runtime its AFTER_MS counts from `now`."""
        if not fault.applies_to(self.connection):
            return
        base = self._start if from_start else now
        self._pending.append((base + fault.after_ms * _NS_PER_MS, fault))
        self._pending.sort(key=lambda item: item[0])

    def due(self, now: int) -> list[Fault]:
        """Faults whose time has come (each returned once); lasting ones become active states."""
        fired, self._unreported = self._unreported, []
        while self._pending and self._pending[0][0] <= now:
            at, fault = self._pending.pop(0)
            if fault.kind not in ONE_SHOT:
                self._states[fault.kind] = (at, fault)
            self.fired.append(fault)
            fired.append(fault)
        self.active(
            FaultKind.STALL, now
        )  # a stall that has ended is dropped, so its end is no longer a deadline
        return fired

    def active(self, kind: FaultKind, now: int) -> Fault | None:
        """The lasting fault of `kind` in force at `now` (a stall ends VALUE ms after it began). One-shot
        faults that are due stay pending for `due()`: asking about a state never swallows them."""
        self._promote_states(now)
        entry = self._states.get(kind)
        if entry is None:
            return None
        at, fault = entry
        if kind is FaultKind.STALL and fault.value is not None and now >= at + int(fault.value * _NS_PER_MS):
            del self._states[kind]
            return None
        return fault

    def _promote_states(self, now: int) -> None:
        keep = []
        for at, fault in self._pending:
            if at <= now and fault.kind not in ONE_SHOT:
                self._states[fault.kind] = (at, fault)
                self.fired.append(fault)
                self._unreported.append(fault)
            else:
                keep.append((at, fault))
        self._pending = keep

    def stall_ends(self) -> int | None:
        """When the current stall ends (the dump is due then), if one is active."""
        entry = self._states.get(FaultKind.STALL)
        if entry is None or entry[1].value is None:
            return None
        return entry[0] + int(entry[1].value * _NS_PER_MS)

    def next_deadline(self) -> int | None:
        deadlines = [self._pending[0][0]] if self._pending else []
        stall_end = self.stall_ends()
        if stall_end is not None:
            deadlines.append(stall_end)
        return min(deadlines) if deadlines else None

    def speed(self, now: int) -> float:
        """How many times faster than real time output should go now (1.0 without a burst fault)."""
        burst = self.active(FaultKind.BURST, now)
        return burst.value if burst is not None and burst.value else 1.0
