"""The session's notices as log lines: one formatter per notice type, in one table (aesthetics.md §1.8).

A shell concern: the cores state facts (bridge/engine/commands.py), this module says them. Caller words are logged
at DEBUG only; each caller utterance is counted once at INFO (RO3).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from bridge.engine.commands import (
    AudioDiscontinuity,
    BargedIn,
    ConditionDetected,
    DisclosureResult,
    NoInputTimeout,
    RecoveryChanged,
    Reseeded,
    RolloverChanged,
    Transcript,
    TurnEnded,
)
from bridge.engine.delegations import CommandsUnknown, JobChanged, WorkUncertain
from bridge.engine.reservoir import OutputOverflow
from providers.events import ProviderError

log = logging.getLogger("parlora.session")

Lines = list[tuple[int, str, tuple[Any, ...]]]


def _condition(n: ConditionDetected) -> Lines:
    name = "output_overflow" if isinstance(n.condition, OutputOverflow) else "output_stale"
    return [(logging.WARNING, "%s at %d ms: %s", (name, n.at_ms, n.condition))]


def _barged_in(n: BargedIn) -> Lines:
    reaction = "n/a" if n.last_frame_ms is None else f"{n.last_frame_ms:+.1f} ms"
    return [
        (
            logging.INFO if n.cleared_ms else logging.DEBUG,
            "barge-in (%s) at %d ms: cleared %d ms of output; heard %s; last assistant frame left %s from the event",
            (n.source, n.at_ms, n.cleared_ms, list(n.heard) or "nothing interrupted", reaction),
        )
    ]


def _transcript(n: Transcript) -> Lines:
    lines: Lines = []
    if n.role == "caller" and n.final:  # each caller utterance once (RO3); its words at DEBUG
        lines.append((logging.INFO, "caller utterance at %d ms (%d characters)", (n.at_ms, len(n.text))))
    lines.append((logging.DEBUG, "%s (%d ms): %s", (n.role, n.at_ms, n.text)))
    return lines


def _provider_error(n: ProviderError) -> Lines:
    return [] if n.fatal else [(logging.WARNING, "provider error %s: %s", (n.code, n.message))]


def _job(n: JobChanged) -> Lines:
    return [(logging.INFO, "%s (%s) %s at %d ms: %s", (n.job_id, n.name, n.state, n.at_ms, n.detail))]


def _unknown(n: CommandsUnknown) -> Lines:
    return [
        (
            logging.WARNING,
            "command %d (%s%s) on lost connection %d: unknown, not replayed",
            (r.command_id, r.what, f" of {r.job_id}" if r.job_id else "", n.token),
        )
        for r in n.records
    ]


def _uncertain(n: WorkUncertain) -> Lines:
    """S8: each piece of uncertain work once, with its request's id and tool (never its arguments: the
    application gets those in the event)."""
    return [
        (
            logging.WARNING,
            "uncertain work (%s) at %d ms: %s %s: %s",
            (n.cause, n.at_ms, i.job_id or "update", i.name, i.detail),
        )
        for i in n.items
    ]


def _discontinuity(n: AudioDiscontinuity) -> Lines:
    unit = "bytes of provider audio" if n.direction == "output" else "caller frames"
    return [
        (
            logging.WARNING,
            "audio_discontinuity %s: %d %s dropped (%s) at %d ms",
            (n.direction, n.amount, unit, n.cause, n.at_ms),
        )
    ]


def _rollover(n: RolloverChanged) -> Lines:
    return [(logging.WARNING, "rollover %s: %s (%s) at %d ms", (n.what, n.connection_id, n.detail, n.at_ms))]


def _recovery(n: RecoveryChanged) -> Lines:
    return [
        (
            logging.ERROR if n.stage == "failed" else logging.WARNING,
            "output_recovery %s: token %d, cause %s, %d ms since the condition",
            (n.stage, n.token, n.cause, n.elapsed_ms),
        )
    ]


FORMATTERS: dict[type, Callable[[Any], Lines]] = {
    ConditionDetected: _condition,
    BargedIn: _barged_in,
    TurnEnded: lambda n: [(logging.DEBUG, "caller turn ended at %d ms", (n.at_ms,))],
    Transcript: _transcript,
    ProviderError: _provider_error,
    JobChanged: _job,
    CommandsUnknown: _unknown,
    WorkUncertain: _uncertain,
    AudioDiscontinuity: _discontinuity,
    RolloverChanged: _rollover,
    RecoveryChanged: _recovery,
    DisclosureResult: lambda n: [
        (
            logging.INFO if n.outcome == "delivered" else logging.WARNING,
            "%s %s: %d of %s ms sent (%s)",
            (n.what, n.outcome, n.transmitted_ms, n.length_ms, n.reason),
        )
    ],
    NoInputTimeout: lambda n: [
        (
            logging.INFO,
            "no input: the caller was silent for %d ms; the model was asked for a %s%s",
            (
                n.silent_ms,
                "check-in" if n.stage == "prompt" else "goodbye (then BYE)",
                "" if n.sent else " (not sent)",
            ),
        )
    ],
    Reseeded: lambda n: [
        (
            logging.WARNING,
            "resumption handle refused on token %d (%s): opened again, reseeded",
            (n.token, n.purpose),
        )
    ],
}


def log_notice(call_id: str, notice: object) -> None:
    formatter = FORMATTERS.get(type(notice))
    for level, text, args in formatter(notice) if formatter is not None else []:
        if log.isEnabledFor(level):
            log.log(level, "call %s " + text, call_id, *args)
