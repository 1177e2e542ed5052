"""What the server reports to Prometheus and the probes (issue 15): `/metrics`, `/healthz`, `/readyz`.

`CallObserver` turns what the server already knows — a call's start and `CallSummary`, its refusal, the
session's notices (recoveries, rollovers, discontinuities, jobs) and, at the end of a call, the leg's RTP
counters (`QosSource`) — into `BridgeMetrics` updates. Nothing here runs per media frame: notices are a few per
call, the RTP figures are taken once, at the end of the call. `http_extra` answers the three extra GET paths of
the HTTP listener (bridge/http.py).

SIP responses: the engine's own per-response counters are not reachable without editing engine files, so
`sip_responses_sent_total` counts the final response each call got from the bridge's side (200 for an answered
call, the refusal status otherwise, 503 when the provider was unavailable before answering).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import get_args

from bridge.commands import AudioDiscontinuity, RecoveryChanged, RolloverChanged
from bridge.delegations import JobChanged
from bridge.metrics import (
    CONTENT_TYPE,
    BridgeMetrics,
    CallOutcome,
    DiscontinuityCause,
    JobOutcome,
    RecoveryCause,
    RolloverOutcome,
)
from bridge.session import CallSummary
from sip.leg import QosSource

DEFAULT_ROUTE = "default"  # the route label of a call no config route chose
PROVIDER_UNAVAILABLE = "provider unavailable"

_RECOVERY_CAUSES: frozenset[str] = frozenset(get_args(RecoveryCause))
_DISCONTINUITY_CAUSES: frozenset[str] = frozenset(get_args(DiscontinuityCause))
_ROLLOVER_OUTCOMES: dict[str, RolloverOutcome] = {
    "closed": "completed",
    "failed": "failed",
    "refused": "refused",
}
_JOB_OUTCOMES: dict[str, JobOutcome] = {
    "delivered": "completed",
    "refused": "refused",
    "cancelled": "unknown",
    "superseded": "unknown",
    "not_dispatched": "refused",
}

HttpAnswer = tuple[int, bytes, str]  # status, body, content type


class CallObserver:
    """The metrics side of the server: one per `Server`, fed from its call handling."""

    def __init__(self, metrics: BridgeMetrics | None = None) -> None:
        self.metrics = metrics if metrics is not None else BridgeMetrics()
        self._job_started_ms: dict[tuple[str, str], int] = {}

    # --- calls ---

    def call_refused(self, route: str | None, status: int) -> None:
        self.metrics.sip_response_sent(status)
        self.metrics.call_refused(route or DEFAULT_ROUTE)
        if status == 404:
            self.metrics.refused("no_route")

    def call_started(self, route: str | None) -> None:
        self.metrics.call_started(route or DEFAULT_ROUTE)

    def call_ended(self, route: str | None, summary: CallSummary | None, leg: object) -> None:
        """The call `call_started` counted is over: its outcome, its final response and its RTP counters."""
        outcome: CallOutcome = "completed"
        if summary is None:
            outcome = "failed"
        elif summary.reason.startswith(PROVIDER_UNAVAILABLE):
            outcome = "failed"
            self.metrics.sip_response_sent(503)
        else:
            self.metrics.sip_response_sent(200)
        self.metrics.call_ended(route or DEFAULT_ROUTE, outcome)
        if isinstance(leg, QosSource):
            qos = leg.qos()
            if qos is not None:
                self.metrics.rtp(
                    received=max(qos.packets_in, 0),
                    sent=max(qos.packets_out, 0),
                    lost=max(qos.packets_lost, 0),
                    late=max(qos.late_packets, 0),
                    concealed=max(qos.frames_concealed, 0),
                )
                self.metrics.jitter([qos.jitter_ms / 1000.0])
        if summary is not None:
            for key in [k for k in self._job_started_ms if k[0] == summary.call_id]:
                del self._job_started_ms[key]

    # --- the session's notices (a few per call) ---

    def notice(self, call_id: str, notice: object) -> None:
        if isinstance(notice, RecoveryChanged):
            if notice.stage in ("done", "failed", "interrupted") and notice.cause in _RECOVERY_CAUSES:
                self.metrics.recovery(
                    notice.cause,  # type: ignore[arg-type]  # checked against RecoveryCause just above
                    "recovered" if notice.stage == "done" else "failed",
                    notice.elapsed_ms / 1000.0,
                )
        elif isinstance(notice, RolloverChanged):
            outcome = _ROLLOVER_OUTCOMES.get(notice.what)
            if outcome is not None:
                self.metrics.rollover(outcome)
        elif isinstance(notice, AudioDiscontinuity):
            if notice.cause in _DISCONTINUITY_CAUSES:
                direction = "out" if notice.direction == "output" else "in"
                self.metrics.discontinuity(direction, notice.cause)  # type: ignore[arg-type]  # checked above
        elif isinstance(notice, JobChanged):
            key = (call_id, notice.job_id)
            if notice.state == "running":
                self._job_started_ms.setdefault(key, notice.at_ms)
            elif (job_outcome := _JOB_OUTCOMES.get(notice.state)) is not None:
                started = self._job_started_ms.pop(key, notice.at_ms)
                self.metrics.job(job_outcome, max(notice.at_ms - started, 0) / 1000.0)

    def tee(self, other: Callable[[str, object], None] | None) -> Callable[[str, object], None]:
        """A notice sink that feeds this observer and then `other` (e.g. the console feed)."""

        def sink(call_id: str, notice: object) -> None:
            self.notice(call_id, notice)
            if other is not None:
                other(call_id, notice)

        return sink

    # --- the HTTP listener's extra paths ---

    def http_extra(self, ready: Callable[[], tuple[bool, str]]) -> Callable[[str], HttpAnswer | None]:
        """`GET /metrics`, `/healthz` (alive) and `/readyz` (`ready()`: listening, not draining, ...)."""

        def answer(path: str) -> HttpAnswer | None:
            path = path.split("?", 1)[0].rstrip("/")
            if path == "/metrics":
                return 200, self.metrics.render(), CONTENT_TYPE
            if path == "/healthz":
                return 200, b'{"alive": true}', "application/json"
            if path == "/readyz":
                ok, why = ready()
                return (
                    200 if ok else 503,
                    json.dumps({"ready": ok, "reason": why}).encode(),
                    "application/json",
                )
            return None

        return answer
