"""`--log-format json` (bridge/server/jsonlog.py): each call's SIP Call-ID and route ride along its lines."""

from __future__ import annotations

import json
import logging

from bridge.server.jsonlog import CallContext, JsonFormatter


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("parlora", logging.INFO, __file__, 1, msg, args, None)


def test_a_known_call_carries_its_sip_call_id_then_its_route_and_is_forgotten_at_the_end() -> None:
    calls = CallContext()
    fmt = JsonFormatter(calls=calls)
    calls.open("call-3", "a84b4c76e66710@pc33.example.com")
    first = json.loads(fmt.format(_record("call %s started", "call-3")))
    calls.route("call-3", "sales")
    routed = json.loads(fmt.format(_record("call %s: route %s", "call-3", "sales")))
    other = json.loads(fmt.format(_record("call %s started", "call-4")))
    calls.close("call-3")
    after = json.loads(fmt.format(_record("call %s late line", "call-3")))
    assert first["sip_call_id"] == "a84b4c76e66710@pc33.example.com" and "route" not in first
    assert (routed["sip_call_id"], routed["route"]) == ("a84b4c76e66710@pc33.example.com", "sales")
    assert "sip_call_id" not in other and "route" not in other
    assert "sip_call_id" not in after and len(calls) == 0


def test_a_route_for_an_unknown_call_is_not_kept() -> None:
    calls = CallContext()
    calls.route("call-9", "sales")
    assert len(calls) == 0 and calls.get("call-9") == {}


def test_a_secret_in_the_sip_call_id_is_redacted_too() -> None:
    calls = CallContext()
    calls.open("call-1", "sk-live-secret-123@host")
    text = JsonFormatter(["sk-live-secret-123"], calls=calls).format(_record("call %s started", "call-1"))
    assert "sk-live-secret-123" not in text and json.loads(text)["sip_call_id"] == "***@host"


def test_the_sip_engines_lines_name_the_call_too() -> None:
    calls = CallContext()
    calls.open("call-12", "x@y")
    line = json.loads(JsonFormatter(calls=calls).format(_record("%s media: %s", "call-12", "PCMU/8000")))
    assert (line["call_id"], line["sip_call_id"]) == ("call-12", "x@y")
    assert "call_id" not in json.loads(JsonFormatter(calls=calls).format(_record("callback %s", "x")))
