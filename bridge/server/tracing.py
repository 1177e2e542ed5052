"""OpenTelemetry spans of each assistant turn: an optional extra (`pip install parlora-bridge[otel]`).

With the `opentelemetry-api` package installed, each timed turn (bridge/server/records.py `TurnLatency`, the
times of bridge/engine/latency.py) becomes a span `turn` from the caller's speech end on the wire to the
turn's first frame handed to the carrier, with two children: `provider` (the speech end to the provider's
first audio) and `bridge` (that first audio to its first frame out). A turn with no speech end (a greeting)
starts at its first audio and has no `provider` child; one whose audio never left ends there and has no
`bridge` child. Attributes: `parlora.call_id`, `parlora.turn.kind` (conversation, recovery, rollover) and,
when known, `parlora.turn.provider_ms`, `parlora.turn.bridge_ms`, `parlora.turn.wait_ms`,
`parlora.turn.truncated_ms` (on barge-in).

The spans are made once the turn's utterance is complete (a few per call, never on the media path), with
their real start and end times: the call's start (unix time, `CallStarted.started_at`) plus the session ms.
They go to whatever tracer provider the process has: one the application installs, or the SDK's exporter set
up from the standard `OTEL_*` variables by `opentelemetry-instrument parlora-bridge serve ...`. With no
exporter configured the API's default provider makes no-op spans; without the package, nothing is made.
"""

from __future__ import annotations

from typing import Any

from bridge.server.records import AppEvent, CallEnded, CallStarted, TurnLatency, Utterance

TRACER_NAME = "parlora-bridge"
MAX_CALLS = 10_000  # bounded: calls whose start is kept (each is forgotten at its end; this catches leaks)


def default_tracer() -> Any | None:
    """The process's tracer (a no-op one unless an exporter is configured); None without the package."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace.get_tracer(TRACER_NAME)


class TurnSpans:
    """Each call's timed turns as spans (the module docstring); fed the call's events in order."""

    def __init__(self, tracer: Any | None = None) -> None:
        self._tracer = tracer if tracer is not None else default_tracer()
        self._started: dict[str, int] = {}  # call id -> its session's start, unix ns

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def event(self, event: AppEvent) -> None:
        if self._tracer is None:
            return
        if isinstance(event, CallStarted):
            started = self._started
            started[event.call.call_id] = int(event.started_at * 1e9)
            while len(started) > MAX_CALLS:
                del started[next(iter(started))]
        elif isinstance(event, CallEnded):
            self._started.pop(event.record.call.call_id, None)
        elif isinstance(event, Utterance) and event.latency is not None:
            start = self._started.get(event.call_id)
            if start is not None:
                self._turn(event.call_id, event.latency, start)

    def _turn(self, call_id: str, turn: TurnLatency, origin_ns: int) -> None:
        from opentelemetry import trace

        def at(ms: int) -> int:
            return origin_ns + ms * 1_000_000

        tracer = self._tracer
        assert tracer is not None
        attributes: dict[str, str | int] = {"parlora.call_id": call_id, "parlora.turn.kind": turn.kind}
        for name in ("provider_ms", "bridge_ms", "wait_ms", "truncated_ms"):
            value = getattr(turn, name)
            if value is not None:
                attributes[f"parlora.turn.{name}"] = value
        first_audio, first_frame, speech_end = turn.first_audio_ms, turn.first_frame_ms, turn.speech_end_ms
        span = tracer.start_span(
            "turn", start_time=at(first_audio if speech_end is None else speech_end), attributes=attributes
        )
        context = trace.set_span_in_context(span)
        if speech_end is not None:
            tracer.start_span("provider", context=context, start_time=at(speech_end)).end(at(first_audio))
        if first_frame is not None:
            tracer.start_span("bridge", context=context, start_time=at(first_audio)).end(at(first_frame))
        span.end(at(first_audio if first_frame is None else first_frame))
