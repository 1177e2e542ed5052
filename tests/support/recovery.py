"""Harness moved unchanged from tests/unit/bridge/test_recovery.py: GEMINI, answer, commands_of, recovery_notices, repaired."""

from __future__ import annotations

from bridge.engine.coordinator import RecoveryChanged
from providers.events import (
    SessionClosed,
    SessionStarted,
)
from providers.gemini_live import GeminiLiveAdapter
from tests.support.session_engine import Call

# Gemini's: resumption, and the silence watchdog (its pings are too slow to find a half-open socket)
GEMINI = GeminiLiveAdapter.capabilities


def recovery_notices(call: Call) -> list[str]:
    return [n.stage for n in call.notices if isinstance(n, RecoveryChanged)]


def commands_of(call: Call, kind: type) -> list:
    found = [c for c in call.commands if isinstance(c, kind)]
    call.commands = [c for c in call.commands if not isinstance(c, kind)]
    return found


def answer(call: Call, job_id: str, output: str) -> bool:
    """The application answers a job (the shell's `_JobAnswered`)."""
    accepted = call.core.job_answered(job_id, output, call.now)
    call._drain()
    return accepted


def repaired(call: Call) -> None:
    """The connection drops without a proper end, then the replacement (token 2) comes up."""
    call.provider(SessionClosed(call.core.token, "connection lost", False))
    assert recovery_notices(call)[-1] == "reconnecting"
    call.tick(count=3)
    call.provider(SessionStarted(call.core.token, "sess_2", None))
    assert call.core.status(call.now)["output_recovery"]["stage"] == "awaiting_user"
