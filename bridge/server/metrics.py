"""Prometheus metrics (`GET /metrics` on the HTTP listener): what the bridge counts, with prometheus-client.

`BridgeMetrics` owns its own `CollectorRegistry` (never the process-global one, so two servers in one process,
or a test, do not mix their numbers) and has one small typed method per fact; `render()` is the text
exposition format and `CONTENT_TYPE` its HTTP Content-Type. Label values come from closed sets (outcomes,
causes, states as `Literal`s; SIP codes 100-699), route, provider and trunk names from the configuration,
so no label grows with traffic (no call ids, no numbers, no addresses).

The media path never calls in here per packet: prometheus-client takes a lock on every update. The RTP and
pacing figures are added as batches — deltas of the per-call counters the `rtp` cores keep anyway, from the
session's periodic stats tick or at the end of a call — and the histograms take a batch of samples at a time.

Metric names (all prefixed `parlora_`; counters end in `_total` in the exposition):

    calls_active{route}                          calls in progress
    calls_total{route,outcome}                   finished calls by outcome
    sip_responses_sent_total{code}               final and provisional responses the bridge sent
    refusals_total{reason}                       calls / requests refused before any provider connection
    dials_total{trunk,outcome}                   dials placed by the bridge: started, queued, refused_queue_full,
                                                 refused_queue_timeout (a trunk's limits: bridge/engine/dial_limits.py),
                                                 refused_calling_hours, refused_do_not_call, refused_application
    dial_retries_total{after}                    dials placed again after an attempt that was busy, no_answer or
                                                 unavailable (bridge/engine/dial_retry.py)
    identity_ignored_total{reason}               inbound Identity headers (STIR/SHAKEN) that gave nothing:
                                                 sip/core/attestation.py IGNORED_REASONS (oversize, bad base64, ...)
    rtp_packets_total{direction}                 RTP packets received (in) and sent (out)
    rtp_packets_lost_total, rtp_packets_late_total, rtp_frames_concealed_total
    rtp_jitter_seconds                           the caller stream's interarrival jitter (RFC 3550), sampled
    one_way_audio_total{cause}                   calls that received no usable RTP a few seconds into the media
                                                 (rtp/stream.py ONE_WAY_CAUSES), counted at the call's end
    pacing_lateness_seconds                      how late the media clock's ticks came after their deadlines
                                                 (fed by an engine that reports lateness samples: none yet)
    pacing_ticks_total{outcome}                  the media clock's 20 ms slots: served, skipped, late
    pacing_max_lateness_seconds                  the media clock's worst lateness since start
    media_clock_late_ticks_total{cause}          its phase ticks later than 5 ms by what held them:
                                                 own, gc, loop, unscheduled (rtp/clock.py's docstring)
    loop_lag_seconds                             how late the event loop's lag probe fired (every 20 ms, calls
                                                 or not: bridge/server/looplag.py), read at each scrape
    loop_lag_late_total                          lag probes later than 5 ms
    loop_lag_max_seconds                         the probe's worst lateness since start
    provider_connect_seconds{provider}           WebSocket open to session confirmed
    recoveries_total{cause,outcome}, recovery_duration_seconds{cause}   HR1-HR5
    rollovers_total{outcome}                     RO1-RO9
    audio_discontinuities_total{direction,cause} HR2, HR8
    jobs_total{outcome}, job_duration_seconds    delegations and tool calls
    turn_provider_seconds{kind}                  per assistant turn: the caller's speech end on the wire to the
                                                 provider's first audio (bridge/engine/latency.py); kind:
                                                 conversation, recovery (a replacement's first words), rollover
    turn_bridge_seconds{kind}                    the first audio's arrival to its first frame handed to the carrier
    turn_wait_seconds{kind}                      the caller's speech end to that first frame: what the caller waited
    provider_audio_seconds_total{provider,part}  provider audio by part: conversation, recovery or rollover replay
    provider_tokens_total{provider,part,direction}  provider tokens (input, output) by part
    call_price_total{provider}                   the finished calls' price at the [pricing.NAME] rates
                                                 (currency-less; bridge/engine/usage.py), counted at each call's end
    registrations{trunk,state}                   1 for each trunk's current state, 0 for the others
    sip_auth_failures_total                      inbound digest checks failed (wrong response, unknown user,
                                                 forged nonce, replay), every method together (sip/core/guard.py)
    sip_bans_total{scope}                        digest bans begun: a source ("source") or a user guessed from
                                                 many sources ("user"); their requests are dropped unanswered
    sip_messages_rejected_total{reason}          SIP input the engine could not take: unparseable (dropped),
                                                 malformed_NNN (answered NNN), internal_error (dropped)
    engine_held{resource}                        what the engine holds now: calls, transactions, RTP ports,
                                                 media channels, TCP connections, tasks (read at each scrape)
    heap{figure}                                 the process heap (bridge/server/heap.py): python_blocks (the
                                                 interpreter's allocated blocks) at each scrape; glibc's
                                                 malloc_in_use, malloc_free, malloc_mmapped (bytes) walked at
                                                 most once a minute, or at once for /metrics?heap=walk
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from bridge.server.looplag import LAG_BOUNDS_US, LagMeter
from rtp.clock import LATE_CAUSES, LATENESS_BOUNDS_US
from rtp.stream import ONE_WAY_CAUSES
from sip.core.attestation import IgnoredReason

# The classic text format every Prometheus version scrapes; every name here is a legacy-valid one, so the body
# is the same as the 1.0.0 text format's.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
PREFIX = "parlora"

CallOutcome = Literal["completed", "failed", "refused", "cancelled", "busy", "no_answer"]
RefusalReason = Literal[
    "not_allowed",  # source outside every trunk's allowlist (403 or dropped)
    "auth_failed",  # inbound digest challenge not met
    "auth_banned",  # dropped unchecked: a banned or backing-off source, a user guarded against it (sip/core/guard.py)
    "rate_limited",  # per-source INVITE rate (503)
    "options_rate_limited",  # per-source out-of-dialog OPTIONS rate (dropped unanswered)
    "blocked_user_agent",  # a known scanner
    "max_calls",  # at --max-calls (503)
    "draining",  # SIGTERM / POST /drain (503)
    "no_route",  # no route for the called number (404)
    "attestation_failed",  # the carrier's verstat said the caller ID failed STIR/SHAKEN (608, an option)
    "unauthorized",  # the application's authorize hook said no
    "no_common_codec",  # 488: an offer without PCMU/PCMA (before the 180, or at the answer)
    "unanswerable_offer",  # 488 before the 180: any other offer no answer could accept (sip.core.sdp.OfferCause)
]
Direction = Literal["in", "out"]
# The causes bridge/engine/recovery.py and the coordinator begin a recovery with; "other" for one added later.
RecoveryCause = Literal["output_overflow", "output_stale", "transport_lost", "provider_silent", "other"]
RecoveryOutcome = Literal["recovered", "failed"]
RolloverOutcome = Literal["completed", "refused", "failed"]
# "rollover_next_lost": what a rollover's next connection alone heard, lost or quarantined with it (S1).
DiscontinuityCause = Literal[
    "output_overflow",
    "output_stale",
    "voice_transport_recovery",
    "recovery_unheard",
    "rollover",
    "rollover_next_lost",
    "ringing",
    "card_collection",  # caller audio withheld while card digits were keyed in (bridge/engine/card.py)
]
JobOutcome = Literal["completed", "failed", "timeout", "refused", "unknown"]
BanScope = Literal["source", "user"]
RegistrationState = Literal["unregistered", "registering", "registered", "failed"]
REGISTRATION_STATES: tuple[RegistrationState, ...] = ("unregistered", "registering", "registered", "failed")

# Bucket edges in seconds, chosen around what each figure is judged against.
JITTER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2)  # a 20 ms frame; 120 ms bad
PACING_BUCKETS = tuple(us / 1e6 for us in LATENESS_BOUNDS_US)  # the media clock's own buckets (rtp/clock.py)
CONNECT_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
RECOVERY_BUCKETS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0)  # HR5: within 5 s or fatal
JOB_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A turn's shares: the bridge's is a frame or two (20-60 ms), a provider's 300 ms-1.5 s; 5 s is a stall.
TURN_BUCKETS = (0.02, 0.04, 0.06, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
TurnKind = Literal["conversation", "recovery", "rollover"]


class CountedHistogram(Collector):
    """A histogram kept as plain counts and rendered at a scrape, for figures that arrive as bucket counts:
    `add(value, count)` is `count` observations of `value` in one step (`observe` one). Its exposition is a
    prometheus-client Histogram's without `_created`."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...]) -> None:
        self._name, self._doc, self._bounds = name, documentation, bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self.add(value, 1)

    def add(self, value: float, count: int) -> None:
        if count > 0:
            self._counts[bisect_left(self._bounds, value)] += (
                count  # a bound's own value is in its bucket (le)
            )
            self._sum += value * count

    def collect(self) -> Iterable[Metric]:
        yield HistogramMetricFamily(
            self._name, self._doc, buckets=_cumulative(self._bounds, self._counts), sum_value=self._sum
        )


def _cumulative(bounds: Iterable[float], counts: Iterable[int]) -> list[tuple[str, float]]:
    total, rows = 0, list[tuple[str, float]]()
    for bound, count in zip((*bounds, None), counts, strict=True):
        total += count
        rows.append(("+Inf" if bound is None else str(floatToGoString(bound)), total))  # type: ignore[no-untyped-call]
    return rows


class LoopLagCollector(Collector):
    """The event loop's lag probe (bridge/server/looplag.py `LagMeter`), read whole at each scrape: its bucket
    counts are exact, so nothing is observed per probe. Empty (zero counts) until `meter` is set."""

    def __init__(self) -> None:
        self.meter: LagMeter | None = None

    def collect(self) -> Iterable[Metric]:
        m = self.meter
        buckets, total_ns, late, worst_ns = (
            (m.buckets, m.sum_ns, m.late, m.max_ns)
            if m is not None
            else ([0] * (len(LAG_BOUNDS_US) + 1), 0, 0, 0)
        )
        yield HistogramMetricFamily(
            f"{PREFIX}_loop_lag_seconds",
            "How late the event loop's lag probe (every 20 ms) fired after its deadline.",
            buckets=_cumulative((us / 1e6 for us in LAG_BOUNDS_US), buckets),
            sum_value=total_ns / 1e9,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_loop_lag_late", "Lag probes that fired more than 5 ms late.", value=late
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_loop_lag_max_seconds",
            "The lag probe's worst lateness since start.",
            value=worst_ns / 1e9,
        )


def _code_label(code: int) -> str:
    return str(code) if 100 <= code <= 699 else "other"


class BridgeMetrics:
    """Every metric of one bridge process, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._calls_active = Gauge(f"{PREFIX}_calls_active", "Calls in progress.", ["route"], registry=r)
        self._calls = Counter(
            f"{PREFIX}_calls", "Finished calls by outcome.", ["route", "outcome"], registry=r
        )
        self._sip_responses = Counter(
            f"{PREFIX}_sip_responses_sent", "SIP responses sent, by status code.", ["code"], registry=r
        )
        self._refusals = Counter(
            f"{PREFIX}_refusals",
            "Calls and requests refused before any provider connection, by reason.",
            ["reason"],
            registry=r,
        )
        self._identity_ignored = Counter(
            f"{PREFIX}_identity_ignored",
            "Inbound Identity headers (STIR/SHAKEN) that could not be read, by reason.",
            ["reason"],
            registry=r,
        )
        self._rtp_packets = Counter(
            f"{PREFIX}_rtp_packets", "RTP packets received (in) and sent (out).", ["direction"], registry=r
        )
        self._rtp_lost = Counter(
            f"{PREFIX}_rtp_packets_lost", "Caller RTP packets never received (sequence gaps).", registry=r
        )
        self._rtp_late = Counter(
            f"{PREFIX}_rtp_packets_late",
            "Caller RTP packets that arrived after their playout time and were dropped.",
            registry=r,
        )
        self._rtp_concealed = Counter(
            f"{PREFIX}_rtp_frames_concealed",
            "Caller frames synthesised by G.711 loss concealment.",
            registry=r,
        )
        self._one_way = Counter(
            f"{PREFIX}_one_way_audio",
            "Calls that received no usable RTP from the caller a few seconds into the media, by cause.",
            ["cause"],
            registry=r,
        )
        self._jitter = Histogram(
            f"{PREFIX}_rtp_jitter_seconds",
            "Interarrival jitter of the caller's RTP (RFC 3550), sampled per call.",
            buckets=JITTER_BUCKETS,
            registry=r,
        )
        self._pacing = CountedHistogram(
            f"{PREFIX}_pacing_lateness_seconds",
            "How late the media clock's ticks (each serves every call of its phase) came after their absolute deadlines.",
            PACING_BUCKETS,
        )
        r.register(self._pacing)
        self._pacing_ticks = Counter(
            f"{PREFIX}_pacing_ticks",
            "The media clock's 20 ms slots: served, skipped (a whole period missed), late (served late).",
            ["outcome"],
            registry=r,
        )
        self._pacing_max = Gauge(
            f"{PREFIX}_pacing_max_lateness_seconds",
            "The media clock's worst lateness since start.",
            registry=r,
        )
        self._clock_late = Counter(
            f"{PREFIX}_media_clock_late_ticks",
            "The media clock's phase ticks later than 5 ms, by what held them: own (its previous run), gc (a "
            "collection), loop (another callback), unscheduled (the kernel did not run the process).",
            ["cause"],
            registry=r,
        )
        self._connect = Histogram(
            f"{PREFIX}_provider_connect_seconds",
            "Provider connection opened to session configuration confirmed.",
            ["provider"],
            buckets=CONNECT_BUCKETS,
            registry=r,
        )
        self._recoveries = Counter(
            f"{PREFIX}_recoveries",
            "Output recoveries (HR1-HR5) by cause and outcome.",
            ["cause", "outcome"],
            registry=r,
        )
        self._recovery_duration = Histogram(
            f"{PREFIX}_recovery_duration_seconds",
            "Recovery start to the replacement connection taking over.",
            ["cause"],
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self._rollovers = Counter(
            f"{PREFIX}_rollovers", "Connection rollovers (RO1-RO9) by outcome.", ["outcome"], registry=r
        )
        self._discontinuities = Counter(
            f"{PREFIX}_audio_discontinuities",
            "Audio discontinuities (HR2, HR8) by direction and cause.",
            ["direction", "cause"],
            registry=r,
        )
        self._jobs = Counter(
            f"{PREFIX}_jobs", "Delegations and tool calls by outcome.", ["outcome"], registry=r
        )
        self._job_duration = Histogram(
            f"{PREFIX}_job_duration_seconds",
            "Job dispatch to the application's answer.",
            buckets=JOB_BUCKETS,
            registry=r,
        )
        self._turn = {
            share: Histogram(
                f"{PREFIX}_turn_{share}_seconds",
                help_text,
                ["kind"],
                buckets=TURN_BUCKETS,
                registry=r,
            )
            for share, help_text in (
                ("provider", "Per turn: the caller's speech end to the provider's first audio."),
                ("bridge", "Per turn: the provider's first audio to its first frame handed to the carrier."),
                ("wait", "Per turn: the caller's speech end to the first frame handed to the carrier."),
            )
        }
        self._usage_seconds = Counter(
            f"{PREFIX}_provider_audio_seconds",
            "Provider audio seconds by part (conversation, recovery or rollover replay), at each call's end.",
            ["provider", "part"],
            registry=r,
        )
        self._usage_tokens = Counter(
            f"{PREFIX}_provider_tokens",
            "Provider tokens by part and direction, at each call's end.",
            ["provider", "part", "direction"],
            registry=r,
        )
        self._price = Counter(
            f"{PREFIX}_call_price", "Finished calls' price at the configured rates.", ["provider"], registry=r
        )
        self._auth_failures = Counter(
            f"{PREFIX}_sip_auth_failures",
            "Inbound digest checks that failed (wrong response, unknown user, forged nonce, replay), all methods.",
            registry=r,
        )
        self._bans = Counter(
            f"{PREFIX}_sip_bans",
            "Digest bans begun, by scope: a source, or a user guessed from many sources.",
            ["scope"],
            registry=r,
        )
        self._dials = Counter(
            f"{PREFIX}_dials",
            "Dials by what a trunk's limits made of them (bridge/engine/dial_limits.py): started, queued, "
            "refused_queue_full, refused_queue_timeout.",
            ["trunk", "outcome"],
            registry=r,
        )
        self._dial_retries = Counter(
            f"{PREFIX}_dial_retries",
            "Dials placed again by their retry policy (bridge/engine/dial_retry.py), by the outcome of the attempt "
            "before: busy, no_answer, unavailable.",
            ["after"],
            registry=r,
        )
        self._idempotent_replays = Counter(
            f"{PREFIX}_idempotent_replays",
            "Dials answered with an earlier call for a repeated Idempotency-Key (no second call placed).",
            registry=r,
        )
        self._sip_rejected = Counter(
            f"{PREFIX}_sip_messages_rejected",
            "SIP messages the engine could not take (unparseable, malformed_NNN, internal_error).",
            ["reason"],
            registry=r,
        )
        self._engine_held = Gauge(
            f"{PREFIX}_engine_held",
            "What the SIP/RTP engine holds right now (calls, transactions, RTP ports, tasks, ...).",
            ["resource"],
            registry=r,
        )
        self._heap = Gauge(
            f"{PREFIX}_heap",
            "The process heap: glibc malloc_in_use, malloc_free (kept by fragmentation), malloc_mmapped "
            "(bytes), and python_blocks (the interpreter's allocated blocks).",
            ["figure"],
            registry=r,
        )
        self._registrations = Gauge(
            f"{PREFIX}_registrations",
            "1 for each trunk's current registration state.",
            ["trunk", "state"],
            registry=r,
        )
        self.loop_lag = LoopLagCollector()  # set its `meter` to the running probe's
        r.register(self.loop_lag)

    # --- calls and signalling ---

    def call_started(self, route: str) -> None:
        self._calls_active.labels(route=route).inc()

    def call_ended(self, route: str, outcome: CallOutcome) -> None:
        """A call that `call_started` counted is over (its active gauge goes down)."""
        self._calls_active.labels(route=route).dec()
        self._calls.labels(route=route, outcome=outcome).inc()

    def call_refused(self, route: str, outcome: CallOutcome = "refused") -> None:
        """A call that never started (no `call_started`), e.g. a 486 or a failed setup."""
        self._calls.labels(route=route, outcome=outcome).inc()

    def sip_response_sent(self, code: int, count: int = 1) -> None:
        self._sip_responses.labels(code=_code_label(code)).inc(count)

    def refused(self, reason: RefusalReason, count: int = 1) -> None:
        self._refusals.labels(reason=reason).inc(count)

    def identity_ignored(self, reason: IgnoredReason) -> None:
        self._identity_ignored.labels(reason=reason).inc()

    def auth_failures(self, count: int = 1) -> None:
        self._auth_failures.inc(count)

    def bans(self, scope: BanScope, count: int = 1) -> None:
        self._bans.labels(scope=scope).inc(count)

    def dial(self, trunk: str | None, outcome: str) -> None:
        self._dials.labels(trunk=trunk or "", outcome=outcome).inc()

    def dial_retry(self, after: str) -> None:
        self._dial_retries.labels(after=after).inc()

    def idempotent_replay(self) -> None:
        self._idempotent_replays.inc()

    def sip_rejected(self, reason: str, count: int = 1) -> None:
        """`reason` is the engine's counter name: `unparseable`, `malformed_NNN` or `internal_error`."""
        self._sip_rejected.labels(reason=reason).inc(count)

    def engine_held(self, held: Mapping[str, int]) -> None:
        """The engine's counts of what it holds now (each series set, not added to)."""
        for resource, count in held.items():
            self._engine_held.labels(resource=resource).set(count)

    def heap(self, figures: Mapping[str, int]) -> None:
        for figure, value in figures.items():
            self._heap.labels(figure=figure).set(value)

    # --- media: batches, never per packet ---

    def rtp(
        self, *, received: int = 0, sent: int = 0, lost: int = 0, late: int = 0, concealed: int = 0
    ) -> None:
        """Add the RTP counters' deltas since the last call (ValueError on a negative delta)."""
        for value in (received, sent, lost, late, concealed):
            if value < 0:
                raise ValueError("RTP counter deltas cannot be negative")
        if received:
            self._rtp_packets.labels(direction="in").inc(received)
        if sent:
            self._rtp_packets.labels(direction="out").inc(sent)
        if lost:
            self._rtp_lost.inc(lost)
        if late:
            self._rtp_late.inc(late)
        if concealed:
            self._rtp_concealed.inc(concealed)

    def one_way_audio(self, cause: str) -> None:
        """A call that received no usable RTP (a cause outside rtp.stream.ONE_WAY_CAUSES counts as "other")."""
        self._one_way.labels(cause=cause if cause in ONE_WAY_CAUSES else "other").inc()

    def jitter(self, samples_s: Iterable[float]) -> None:
        for value in samples_s:
            self._jitter.observe(value)

    def pacing(self, lateness_s: Iterable[float]) -> None:
        for value in lateness_s:
            self._pacing.observe(max(0.0, value))

    def pacing_buckets(self, ticks: Mapping[float | None, int]) -> None:
        """The media clock's new ticks per lateness bucket (its upper bound in s; None: over the last). Each is
        counted at its bucket's bound, so `_bucket` counts are exact and `_sum` is an upper bound. One addition
        per bucket: observing each tick took 18 ms of the loop for a 15 s scrape interval's 7,500 ticks."""
        for bound, count in ticks.items():
            value = bound if bound is not None else 2 * PACING_BUCKETS[-1]
            self._pacing.add(value, count)

    def pacing_ticks(self, *, served: int = 0, skipped: int = 0, late: int = 0) -> None:
        """Add the media clock's slot counters' deltas (from the engine's counters, at a scrape)."""
        for outcome, value in (("served", served), ("skipped", skipped), ("late", late)):
            if value > 0:
                self._pacing_ticks.labels(outcome=outcome).inc(value)

    def pacing_max_lateness(self, seconds: float) -> None:
        self._pacing_max.set(max(0.0, seconds))

    def media_clock_late(self, ticks: Mapping[str, int]) -> None:
        """Add the media clock's late ticks by cause (deltas; causes outside `rtp.clock.LATE_CAUSES` ignored)."""
        for cause, count in ticks.items():
            if count > 0 and cause in LATE_CAUSES:
                self._clock_late.labels(cause=cause).inc(count)

    # --- provider connections ---

    def provider_connected(self, provider: str, seconds: float) -> None:
        self._connect.labels(provider=provider).observe(seconds)

    def recovery(self, cause: RecoveryCause, outcome: RecoveryOutcome, seconds: float) -> None:
        self._recoveries.labels(cause=cause, outcome=outcome).inc()
        self._recovery_duration.labels(cause=cause).observe(seconds)

    def rollover(self, outcome: RolloverOutcome) -> None:
        self._rollovers.labels(outcome=outcome).inc()

    def discontinuity(self, direction: Direction, cause: DiscontinuityCause) -> None:
        self._discontinuities.labels(direction=direction, cause=cause).inc()

    # --- the application ---

    def job(self, outcome: JobOutcome, seconds: float) -> None:
        self._jobs.labels(outcome=outcome).inc()
        self._job_duration.observe(seconds)

    def turn(self, kind: TurnKind, shares: Mapping[str, float | None]) -> None:
        """One assistant turn's shares in seconds ("provider", "bridge", "wait"; None: not known), once a turn."""
        for share, seconds in shares.items():
            histogram = self._turn.get(share)
            if histogram is not None and seconds is not None:
                histogram.labels(kind=kind).observe(max(seconds, 0.0))

    def call_cost(self, provider: str, parts: Mapping[str, Mapping[str, float]], price: float) -> None:
        """A finished call's usage by part ("conversation", "recovery", "rollover") and its price."""
        for part, share in parts.items():
            if part not in ("conversation", "recovery", "rollover"):
                continue
            self._usage_seconds.labels(provider=provider, part=part).inc(
                max(share.get("audio_seconds", 0), 0)
            )
            for direction in ("input", "output"):
                tokens = max(share.get(f"{direction}_tokens", 0), 0)
                self._usage_tokens.labels(provider=provider, part=part, direction=direction).inc(tokens)
        self._price.labels(provider=provider).inc(max(price, 0.0))

    # --- trunks ---

    def registration(self, trunk: str, state: RegistrationState) -> None:
        """`trunk` is now in `state`: its series for `state` is 1, for the other states 0."""
        for each in REGISTRATION_STATES:
            self._registrations.labels(trunk=trunk, state=each).set(1 if each == state else 0)

    # --- exposition ---

    def render(self) -> bytes:
        """The Prometheus text exposition format (version 0.0.4) of every metric."""
        return generate_latest(self.registry)

    async def render_in_pieces(self) -> bytes:
        """`render()`, one collector's families at a time, the loop let through between them: in one piece
        a scrape held the loop 5-14 ms of CPU at 16 calls on a busy host (tests/bench/slow_callbacks.py)."""
        parts = []
        for family in self.registry.collect():
            parts.append(generate_latest(_Families(family)))
            await asyncio.sleep(0)
        return b"".join(parts)


class _Families:
    """What `generate_latest` reads of a registry: `collect()`, here of one family."""

    def __init__(self, *families: Metric) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return iter(self._families)
