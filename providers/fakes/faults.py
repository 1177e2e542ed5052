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
- `mutate[:N]`        corrupt the next N outgoing frames (default 1) by the mutations of `MUTATIONS` in
                      turn, from the first (`mutate_frame`; a new one replaces one pending): truncated JSON,
                      an unknown event name, not an object, nesting deeper than any parser takes, an error
                      event with a huge code and message, huge strings (an id-like leaf keeps its value after
                      the huge string, so two corrupted frames never share an item id), a lone surrogate
                      escape, every leaf of the wrong type. Only the last, on an audio frame, makes it invalid audio (HR1:
                      fatal), so `mutate:7` is survivable; the others are unparseable or unknown events
                      (protocol errors the session survives), an error event, or valid (if noisy) audio

The schedule is sans-I/O: the fake's core asks it with `now`, and it returns its next deadline.
"""

from __future__ import annotations

import enum
import json
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rtp.units import NS_PER_MS


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
    MUTATE = "mutate"


# Kinds that take effect once, at their time; the others are states that last (for STALL: VALUE ms).
ONE_SHOT = frozenset(
    {
        FaultKind.CLOSE,
        FaultKind.ABRUPT_CLOSE,
        FaultKind.GARBAGE_JSON,
        FaultKind.INVALID_AUDIO,
        FaultKind.MUTATE,
    }
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
        # lasting faults that `active()` switched on before `due()` said so
        self._unreported: list[Fault] = []
        for fault in faults:
            self.add(fault, start, from_start=True)

    def add(self, fault: Fault, now: int, *, from_start: bool = False) -> None:
        """Schedule a fault; at runtime its AFTER_MS counts from `now`."""
        if not fault.applies_to(self.connection):
            return
        base = self._start if from_start else now
        self._pending.append((base + fault.after_ms * NS_PER_MS, fault))
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
        self.active(FaultKind.STALL, now)  # a stall that has ended is dropped: its end is no deadline now
        return fired

    def active(self, kind: FaultKind, now: int) -> Fault | None:
        """The lasting fault of `kind` in force at `now` (a stall ends VALUE ms after it began). One-shot
        faults that are due stay pending for `due()`: asking about a state never swallows them."""
        self._promote_states(now)
        if kind is FaultKind.STALL and (end := self.stall_ends()) is not None and now >= end:
            del self._states[kind]
        entry = self._states.get(kind)
        return entry[1] if entry is not None else None

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
        return entry[0] + int(entry[1].value * NS_PER_MS)

    def next_deadline(self) -> int | None:
        if not self._pending and not self._states:  # no fault at all: the common case, asked every frame
            return None
        first = self._pending[0][0] if self._pending else None
        return min((t for t in (first, self.stall_ends()) if t is not None), default=None)

    def speed(self, now: int, normal: float = 1.0) -> float:
        """How many times faster than real time output should go now (`normal` without a burst fault)."""
        burst = self.active(FaultKind.BURST, now)
        return burst.value if burst is not None and burst.value else normal

    def stalled(self, now: int) -> bool:
        """A stall holds the output at `now`."""
        return self.active(FaultKind.STALL, now) is not None


# --- `mutate`: corrupted copies of real outgoing frames -----------------------------------------------------

# In the order a `mutate` fault's frames take them (each fault starts from the first, replacing one pending):
# the survivable ones first, so that `mutate:7` never makes audio undecodable and `mutate:8` may (wrong types
# in an audio delta).
MUTATIONS = (
    "truncated",
    "unknown_type",
    "not_an_object",
    "deep_nesting",
    "as_error",
    "huge_strings",
    "lone_surrogate",
    "wrong_types",
)
HUGE_CHARS = 65_536  # a huge string: 64 Ki characters (a multiple of 4: in an audio field, still base64)
# left alone by huge_strings and wrong_types, so the event still reaches its handler
_KEEP = frozenset({"type"})


@lru_cache(maxsize=len(MUTATIONS))
def huge_string(n: int = 0) -> str:
    """The deterministic 64 Ki-character string the n-th huge mutation carries (letters and digits, so it is
    valid base64 too): a test looks for it in a log to prove that no frame was logged whole."""
    rng = random.Random(0x5EED0000 + n)
    return "".join(rng.choices(string.ascii_letters + string.digits, k=HUGE_CHARS))


def mutate_frame(frame: str, n: int) -> str:
    """`frame` (one outgoing JSON text frame) corrupted by mutation `MUTATIONS[n % len(MUTATIONS)]`."""
    kind = MUTATIONS[n % len(MUTATIONS)]
    if kind == "truncated":
        return frame[: max(1, len(frame) // 2)]
    if kind == "deep_nesting":
        return "[" * 100_000 + "]" * 100_000
    try:
        event: Any = json.loads(frame)
    except ValueError:
        return frame[: max(1, len(frame) // 2)]
    out: Any
    if kind == "unknown_type":
        out = event if isinstance(event, dict) else {"value": event}
        out = {**out, "type": f"parlora.hostile.unknown_{n}"} if "type" in out else {f"hostile{n}": out}
    elif kind == "not_an_object":
        out = [event, n, None]
    elif kind == "as_error":
        huge = huge_string(n)
        out = {"type": "error", "error": {"type": "server_error", "code": huge[:4096], "message": huge}}
    elif kind == "huge_strings":
        out = _leaves(event, lambda key, v: _huge(n, key, v))
    elif kind == "lone_surrogate":
        # a lone surrogate (U+D800) in every string: json.dumps writes it as the escape \ud800, valid JSON
        # that no UTF-8 text can carry once decoded
        out = _leaves(event, _with_surrogate)
    else:  # wrong_types
        out = _leaves(event, _wrong_type)
    return json.dumps(out, separators=(",", ":"))


def _id_like(key: str | None) -> bool:
    """A member that names something (an item, event, response, call, delegation, session or handle), in any
    vendor's spelling: `id`, `ids`, `*_id` (OpenAI family), `*Id` and `newHandle` (Gemini)."""
    return key is not None and (
        key in ("id", "ids", "newHandle") or key.endswith("_id") or key.endswith("Id")
    )


def _huge(n: int, key: str | None, value: Any) -> Any:
    """The huge_strings leaf: a text is `huge_string(n)` exactly (what a test looks for in a log); an id keeps
    its value after it, so that two corrupted frames carry two ids as their originals did (the same huge id
    in two frames made one item of two)."""
    if not isinstance(value, str):
        return value
    return huge_string(n) + value if _id_like(key) else huge_string(n)


def _with_surrogate(key: str | None, value: Any) -> Any:
    return value[: len(value) // 2] + "\ud800" + value[len(value) // 2 :] if isinstance(value, str) else value


def _wrong_type(key: str | None, value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return "true"
    if isinstance(value, str):
        return 12345
    if isinstance(value, int | float):
        return str(value)
    return value


def _leaves(value: Any, change: Callable[[str | None, Any], Any], key: str | None = None) -> Any:
    """`value` with `change(key, leaf)` applied to every leaf, `key` the member it stands in (a list's items
    stand in the list's); containers kept, the `type` member left alone."""
    if isinstance(value, dict):
        return {k: v if k in _KEEP else _leaves(v, change, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_leaves(v, change, key) for v in value]
    return change(key, value)


class Mutator:
    """The `mutate` fault's state on one connection: how many of the next outgoing frames to corrupt, and
    which mutation is next. Each fault starts the cycle from its beginning and replaces one still pending, so
    `mutate:N` never goes past the N-th mutation. A fake's outbound funnel passes every frame through it."""

    __slots__ = ("left", "done")

    def __init__(self) -> None:
        self.left = 0
        self.done = 0

    def arm(self, fault: Fault) -> None:
        self.left, self.done = max(1, int(fault.value or 1)), 0

    def __call__(self, frame: str) -> str:
        if not self.left:
            return frame
        self.left -= 1
        self.done += 1
        return mutate_frame(frame, self.done - 1)
