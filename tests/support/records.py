"""Harness moved unchanged from tests/unit/bridge/test_records.py: INFO, MS, T0, builder, outcome."""

from __future__ import annotations

from bridge.server.records import CallInfo, CallOutcome, RecordBuilder
from rtp.ledger import CarrierLedger
from rtp.units import NS_PER_MS as MS

T0 = 5_000 * MS  # the session's start on the monotonic clock


INFO = CallInfo(
    "call-1", "abc@127.0.0.1", "<sip:alice@127.0.0.1>", "<sip:bot@127.0.0.1>", "bot", "x", None, "echo"
)


def builder(ledger: CarrierLedger, **kw: int) -> RecordBuilder:
    return RecordBuilder(INFO, ledger=ledger, start_ns=T0, started_at=1_700_000_000.0, **kw)


def outcome(status: dict[str, object] | None = None) -> CallOutcome:
    return CallOutcome(12.5, "caller", "200 OK", 200, status or {}, 600, 150)
