"""What the server reports to Prometheus and the probes: `/metrics`, `/healthz`, `/readyz`.

`CallObserver` turns what the server already knows — a call's start and `CallSummary`, its refusal, the
session's notices (recoveries, rollovers, discontinuities, jobs), each assistant turn's times (`events`,
from the call's events) and, at the end of a call, the leg's RTP
counters (`sip.leg.QosSource`, where the leg declares `LegFeatures.qos`) — into `BridgeMetrics` updates.
Nothing here runs per media frame: notices are a few per call, the RTP figures are taken once, at the end of
the call. `http_extra` answers the three extra GET paths of the HTTP listener (bridge/server/http.py).

SIP responses: `sip_responses_sent_total` counts the final response each call got from the bridge's side (200
for an answered call, the refusal status otherwise, 503 when the provider was unavailable before answering)
and, at each scrape, the engine's own refusals (`sip.engine.EngineCounters.stats()`: the native engine's
counters named with a status, e.g. `invite_503_draining`, `method_405`, `policy_403`). The same scrape turns
the engine's refusal counters and its inbound policy's (`GET /sip`) into `refusals_total{reason}` (draining,
max_calls, no_common_codec, unanswerable_offer; not_allowed, rate_limited, options_rate_limited,
blocked_user_agent, auth_failed, auth_banned), its digest failures and bans (sip/core/guard.py) into
`sip_auth_failures_total` and `sip_bans_total{scope}`, the SIP it could not take into
`sip_messages_rejected_total{reason}`, what it holds now (`sip.engine.EngineHeld.counts()`) into
`engine_held{resource}`, and its registrations (`GET /sip`'s list) into `registrations{trunk,state}`. Each
report is read only where the engine declares it (`sip.engine.EngineFeatures`). Counters move by the delta
since the last scrape, so a scrape every few seconds costs nothing per call.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import get_args

from bridge.engine.commands import AudioDiscontinuity, RecoveryChanged, RolloverChanged
from bridge.engine.delegations import JobChanged
from bridge.server.heap import figures as heap_figures
from bridge.server.metrics import (
    CONTENT_TYPE,
    BridgeMetrics,
    CallOutcome,
    DiscontinuityCause,
    JobOutcome,
    RecoveryCause,
    RefusalReason,
    RegistrationState,
    RolloverOutcome,
)
from bridge.server.records import AppEvent, CallEnded, CallRecord, TurnLatency, Utterance
from bridge.server.session import CallSummary
from bridge.server.tracing import TurnSpans
from rtp.clock import LATE_CAUSES
from sip.engine import SipEngine, offers_counters, offers_held, offers_status
from sip.leg import CallLeg, offers_qos

DEFAULT_ROUTE = "default"  # the route label of a call no config route chose
PROVIDER_UNAVAILABLE = "provider unavailable"

_RECOVERY_CAUSES: dict[str, RecoveryCause] = {cause: cause for cause in get_args(RecoveryCause)}
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
    "cut_off": "unknown",  # S8: still running when the session ended
}

HttpAnswer = tuple[int, bytes, str]  # status, body, content type
# glibc's heap figures are walked at most this often by a scrape (bridge/server/heap.py `figures`: a walk holds
# the loop, and so every call's RTP, for tens of ms on a fragmented heap); `/metrics?heap=walk` walks at once
HEAP_WALK_EVERY_NS = 60_000_000_000
JOBS_TIMED = 64  # bounded: a call's jobs timed at once, at most (a pending job is one of DL2's few)

# The engine's counter names (sip/core/ua.py `stats`, sip/core/policy.py) -> the refusal reason they count.
_ENGINE_REFUSALS: dict[str, RefusalReason] = {
    "invite_503_draining": "draining",
    "options_503_draining": "draining",
    "invite_503_max_calls": "max_calls",
    "invite_488": "no_common_codec",
    "offer_488_codec": "no_common_codec",
}
# sip/core/ua.py's offer_488_<cause>: an INVITE refused before the 180 because no answer could accept its offer
_OFFER_REFUSED = "offer_488_"
# The inbound policy's refusals come from its own counters, one per reason (the engine's policy_403,
# policy_dropped and policy_503 count the same refusals by their answer: reading both would count twice)
_POLICY_REFUSALS: dict[str, RefusalReason] = {
    "scanner": "blocked_user_agent",
    "not_allowed": "not_allowed",
    "rate_limited": "rate_limited",
    "options_rate_limited": "options_rate_limited",
    "auth_failed": "auth_failed",
    "auth_ban_dropped": "auth_banned",
    "auth_backoff_dropped": "auth_banned",
    "auth_user_banned_dropped": "auth_banned",
}
_SIP_REJECTED = re.compile(r"^(unparseable|malformed_\d{3}|internal_errors)$")
_STATUS_IN_NAME = re.compile(r"(?:^|_)([1-6]\d\d)(?:_|$)")
_REGISTRATION_STATES: dict[str, RegistrationState] = {
    "idle": "unregistered",
    "unregistered": "unregistered",
    "unregistering": "registering",
    "registering": "registering",
    "registered": "registered",
    "failed": "failed",
}


class _Deltas:
    """Monotonic counters read whole at each scrape -> what they grew by since the last one."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def grown(self, now: Mapping[str, int]) -> dict[str, int]:
        out = {}
        for name, value in now.items():
            before = self._last.get(name, 0)
            if value > before:
                out[name] = value - before
            self._last[name] = value
        return out


class CallObserver:
    """The metrics side of the server: one per `Server`, fed from its call handling."""

    def __init__(
        self, metrics: BridgeMetrics | None = None, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self.metrics = metrics if metrics is not None else BridgeMetrics()
        self._clock = clock
        self._heap_walked_at: int | None = None
        self._job_started_ms: dict[str, dict[str, int]] = {}  # call id -> job id -> when it began to run
        self._engine = _Deltas()
        self._policy = _Deltas()
        self.spans = TurnSpans()  # each turn as spans (the optional OpenTelemetry extra)

    # --- calls ---

    def call_refused(self, route: str | None, status: int) -> None:
        self.metrics.sip_response_sent(status)
        self.metrics.call_refused(route or DEFAULT_ROUTE)
        if status == 404:
            self.metrics.refused("no_route")
        elif status == 608:
            self.metrics.refused("attestation_failed")

    def call_started(self, route: str | None) -> None:
        self.metrics.call_started(route or DEFAULT_ROUTE)

    def call_ended(self, route: str | None, summary: CallSummary | None, leg: CallLeg) -> None:
        """The call `call_started` counted is over: its outcome, its final response and its RTP counters."""
        outcome: CallOutcome = "completed"
        if summary is None:
            outcome = "failed"
        elif summary.reason.startswith(PROVIDER_UNAVAILABLE):
            outcome = "failed"
            self.metrics.sip_response_sent(503)
        elif summary.ended_by == "caller" and summary.reason.startswith("487 "):
            outcome = "cancelled"  # CANCEL before the answer: 487 to the INVITE, never a 200
            self.metrics.sip_response_sent(487)
        else:
            self.metrics.sip_response_sent(200)
        self.metrics.call_ended(route or DEFAULT_ROUTE, outcome)
        if offers_qos(leg):
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
                if qos.one_way_audio is not None:  # rtp/stream.py: no usable caller RTP, and why
                    self.metrics.one_way_audio(qos.one_way_audio)
        # Bounded: the call's jobs still timed are forgotten with it, whether or not it had a summary.
        self._job_started_ms.pop(summary.call_id if summary is not None else leg.identity.call_id, None)

    # --- the session's notices (a few per call) ---

    def notice(self, call_id: str, notice: object) -> None:
        if isinstance(notice, RecoveryChanged):
            if notice.stage in ("done", "failed", "interrupted"):
                self.metrics.recovery(
                    _RECOVERY_CAUSES.get(notice.cause, "other"),
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
            self._job(call_id, notice)

    def _job(self, call_id: str, notice: JobChanged) -> None:
        """A job's run time, from `running` to its outcome; at most JOBS_TIMED of a call at once (the oldest
        is dropped: its outcome is then counted with no duration)."""
        timed = self._job_started_ms.get(call_id)
        if notice.state == "running":
            if timed is None:
                timed = self._job_started_ms[call_id] = {}
            timed.setdefault(notice.job_id, notice.at_ms)
            while len(timed) > JOBS_TIMED:
                del timed[next(iter(timed))]
        elif (job_outcome := _JOB_OUTCOMES.get(notice.state)) is not None:
            started = timed.pop(notice.job_id, notice.at_ms) if timed is not None else notice.at_ms
            self.metrics.job(job_outcome, max(notice.at_ms - started, 0) / 1000.0)

    def turn(self, latency: TurnLatency) -> None:
        """An assistant turn's times (bridge/server/records.py `TurnLatency`): each share observed once."""
        shares = {"provider": latency.provider_ms, "bridge": latency.bridge_ms, "wait": latency.wait_ms}
        self.metrics.turn(latency.kind, {k: None if v is None else v / 1000.0 for k, v in shares.items()})

    def cost(self, record: CallRecord) -> None:
        """A finished call's usage split and price (its record's `cost`), once: the record comes once."""
        cost = record.cost
        parts, price = (cost.get("parts"), cost.get("price")) if cost is not None else (None, None)
        if isinstance(parts, Mapping) and isinstance(price, int | float):
            self.metrics.call_cost(record.call.provider, parts, float(price))

    def events(self, deliver: Callable[[AppEvent], Awaitable[None]]) -> Callable[[AppEvent], Awaitable[None]]:
        """A call's events to `deliver`, each assistant turn's times and the call's cost observed first (once:
        each event is delivered once)."""

        async def observed(event: AppEvent) -> None:
            self.spans.event(event)  # OpenTelemetry, where the extra is installed (bridge/server/tracing.py)
            if isinstance(event, Utterance) and event.latency is not None:
                self.turn(event.latency)
            elif isinstance(event, CallEnded):
                self.cost(event.record)
            await deliver(event)

        return observed

    def tee(self, other: Callable[[str, object], None] | None) -> Callable[[str, object], None]:
        """A notice sink that feeds this observer and then `other` (e.g. the console feed)."""

        def sink(call_id: str, notice: object) -> None:
            self.notice(call_id, notice)
            if other is not None:
                other(call_id, notice)

        return sink

    # --- what the engine counts itself, read at each scrape ---

    def scrape(self, engine: SipEngine | None, *, heap_walk: bool = False) -> None:
        """Bring the engine's refusal counters, responses by code and registrations into the metrics; the heap's
        glibc figures only when `heap_walk` or the last walk is `HEAP_WALK_EVERY_NS` old (their gauges keep the
        last walk's values in between)."""
        if offers_counters(engine):
            stats = engine.stats()
            grown_all = self._engine.grown(stats)
            self.metrics.pacing_ticks(
                served=grown_all.get("clock_slots_served", 0),
                skipped=grown_all.get("clock_slots_skipped", 0),
                late=grown_all.get("clock_late_ticks", 0),
            )
            self.metrics.pacing_buckets(
                {
                    (int(name.rsplit("_", 1)[1]) / 1e6 if not name.endswith("_inf") else None): grown
                    for name, grown in grown_all.items()
                    if name.startswith("clock_lateness_bucket_")
                }
            )
            # the late ticks by what held them (rtp/clock.py)
            self.metrics.media_clock_late({c: grown_all.get(f"clock_late_ticks_{c}", 0) for c in LATE_CAUSES})
            if "clock_max_lateness_us" in stats:
                self.metrics.pacing_max_lateness(stats["clock_max_lateness_us"] / 1e6)
            for name, grown in grown_all.items():
                if (reason := _ENGINE_REFUSALS.get(name)) is not None:
                    self.metrics.refused(reason, grown)
                elif name.startswith(_OFFER_REFUSED):
                    self.metrics.refused("unanswerable_offer", grown)
                if not name.startswith("clock_") and (m := _STATUS_IN_NAME.search(name)) is not None:  # sent
                    self.metrics.sip_response_sent(int(m.group(1)), grown)
                if _SIP_REJECTED.match(name):
                    self.metrics.sip_rejected("internal_error" if name == "internal_errors" else name, grown)
        if offers_held(engine):
            self.metrics.engine_held(engine.counts())
        now = self._clock()
        walk = heap_walk or self._heap_walked_at is None or now - self._heap_walked_at >= HEAP_WALK_EVERY_NS
        if walk:
            self._heap_walked_at = now
        self.metrics.heap(heap_figures(walk))  # a leak against fragmentation
        if offers_status(engine):
            status = engine.sip_status()
            policy = status.get("policy")
            counters = policy.get("counters") if isinstance(policy, dict) else None
            if isinstance(counters, dict):
                grown_policy = self._policy.grown({str(k): int(v) for k, v in counters.items()})
                for name, grown in grown_policy.items():
                    if (reason := _POLICY_REFUSALS.get(name)) is not None:
                        self.metrics.refused(reason, grown)
                    if name == "auth_failed":
                        self.metrics.auth_failures(grown)
                    elif name == "auth_bans_source":
                        self.metrics.bans("source", grown)
                    elif name == "auth_bans_user":
                        self.metrics.bans("user", grown)
            registrations = status.get("registrations")
            for reg in registrations if isinstance(registrations, list) else []:
                if isinstance(reg, dict) and (state := _REGISTRATION_STATES.get(str(reg.get("state")))):
                    self.metrics.registration(str(reg.get("aor")), state)

    # --- the HTTP listener's extra paths ---

    async def _rendered(self) -> HttpAnswer:
        return 200, await self.metrics.render_in_pieces(), CONTENT_TYPE

    def http_extra(
        self,
        ready: Callable[[], tuple[bool, str]],
        engine: Callable[[], SipEngine | None] = lambda: None,
        *,
        in_pieces: bool = False,
    ) -> Callable[[str], HttpAnswer | Awaitable[HttpAnswer] | None]:
        """`GET /metrics` (after a `scrape` of `engine()`; `?heap=walk`: glibc's heap figures walked now),
        `/healthz` (alive) and `/readyz` (`ready()`: listening, not draining, registered where configured).
        `in_pieces` (the server's): the /metrics answer is awaited, its exposition rendered a collector at a time
        with the loop let through between them."""

        def answer(target: str) -> HttpAnswer | Awaitable[HttpAnswer] | None:
            path, _, query = target.partition("?")
            path = path.rstrip("/")
            if path == "/metrics":
                self.scrape(engine(), heap_walk="heap=walk" in query.split("&"))
                return self._rendered() if in_pieces else (200, self.metrics.render(), CONTENT_TYPE)
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
