"""Early media on a call the bridge placed: the far end's audio before its answer, sans-I/O.

A 183 Session Progress (or a 180) with SDP starts the far end's media before the 200 OK: ringback, an IVR
prompt, an announcement ("the number you dialled is not in service"). The session shell
(bridge/server/session.py) tells this window when it starts (`started`, the leg's `EarlyMediaStarted`) and
how it ends (`ended`: the answer, or a final failure). Each is an `EarlyMedia` notice for the call's events,
record and CDR (bridge/server/records.py) and the log; the frames themselves go to the recording (`--record`: the
left channel from `at_ms` for `duration_ms`, on the same timeline) and to the answering-machine detector as
evidence that starts none of its timers (bridge/engine/amd.py: they start at the answer).

Where they do not go: the provider. Early media is a network's or a PBX's audio, not the callee, and a
model that heard "please hold" would answer it; unless the route asks (`early_media_to_provider`, off by
default: an application that wants the model to read an IVR's menu before the answer), the frames stop at
the recording and the detector (`to_provider` False: the shell's frame path pays one flag test).

A call that fails after early media (an announcement, then 404 or 486) is reported as such: the `ended`
notice carries the final status and reason, and `failure_note` is what the call's end reason adds
("early media heard for 3.2 s"), so the record, the CDR and `call` never show it as a plain failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rtp.units import NS_PER_MS


@dataclass(frozen=True, slots=True)
class EarlyMedia:
    """Notice: the far end's early media on a call the bridge placed. `phase` "started" (`status` the
    provisional that brought it, 183 or 180) or "ended" (`status` 200 for the answer, else the final failure,
    with its reason in `outcome`). `at_ms` on the session's timeline (from the session's start: the
    recording's too); `duration_ms` how long it lasted (0 when it starts)."""

    phase: Literal["started", "ended"]
    status: int
    at_ms: int
    duration_ms: int
    outcome: str  # "answered", the failure ("486 Busy Here"), or "" when it starts
    to_provider: bool  # the route gave it to the model too


class EarlyMediaWindow:
    """One call's early media: at most one start and one end (see the module docstring)."""

    __slots__ = ("to_provider", "_origin_ns", "_start_ns", "_start_ms", "_end", "status")

    def __init__(self, origin_ns: int, *, to_provider: bool = False) -> None:
        self.to_provider = to_provider
        self._origin_ns = origin_ns  # the session's start: at_ms counts from here
        self._start_ns: int | None = None
        self._start_ms = 0
        self._end: EarlyMedia | None = None
        self.status = 0

    @property
    def open(self) -> bool:
        """Early media is flowing: started, not yet answered or failed."""
        return self._start_ns is not None and self._end is None

    def _ms(self, ns: int) -> int:
        return max(0, (ns - self._origin_ns) // NS_PER_MS)

    def started(self, status: int, at_ns: int) -> EarlyMedia | None:
        """The leg's `EarlyMediaStarted` (`at_ns` when it started, on the session's clock); None if it had."""
        if self._start_ns is not None:
            return None
        self._start_ns, self.status = at_ns, status
        self._start_ms = self._ms(at_ns)
        return EarlyMedia("started", status, self._start_ms, 0, "", self.to_provider)

    def ended(self, status: int, reason: str, now: int) -> EarlyMedia | None:
        """The answer (`status` 200) or the final failure: the notice, once; None when none was open."""
        if not self.open or self._start_ns is None:
            return None
        # the engines' reasons may carry the status already ("486 Busy Here"): said once
        failure = reason if reason.startswith(f"{status} ") else f"{status} {reason}".strip()
        outcome = "answered" if 200 <= status < 300 else failure
        duration = max(0, (now - self._start_ns) // NS_PER_MS)
        self._end = EarlyMedia("ended", status, self._ms(now), duration, outcome, self.to_provider)
        return self._end

    @property
    def failure_note(self) -> str | None:
        """For a call that failed after early media: what its end reason adds; None otherwise."""
        end = self._end
        if end is None or 200 <= end.status < 300:
            return None
        return f"early media heard for {end.duration_ms / 1000:.1f} s"
