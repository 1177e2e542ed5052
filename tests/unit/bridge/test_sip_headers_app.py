"""Inbound SIP headers and the trusted caller ID at the application (sip/core/app_headers.py): the call record,
the CDR line, the webhook's call_started and job bodies, the configuration (`[inbound] sip_headers`,
`trunks[].trust_identity_headers`, a route's `caller`) and pjsua2's refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.cli.config import ConfigError, load, select_route
from bridge.cli.ops import server_config, trunk_policies
from bridge.engine.delegations import JobRequest
from bridge.server.records import CallInfo, CallStarted, RecordBuilder
from bridge.server.webhook import event_body, request_body
from rtp.ledger import CarrierLedger
from sip.core.app_headers import DEFAULT_ALLOW
from sip.core.identity import call_identity
from sip.leg import CallIdentity
from tests.support.records import T0, outcome

HEADERS = (
    ("X-Customer-Id", "c-42"),
    ("P-Asserted-Identity", "<sip:+4930222@carrier.example>"),
    ("Diversion", "<sip:+4930333@carrier.example>;reason=no-answer"),
    ("Subject", "unlisted"),
    ("X-Bad", "a\x00b\x1bc"),
)


def _identity(trusted: bool) -> CallIdentity:
    return call_identity(
        "call-7",
        request_uri="sip:+4930999@bridge",
        from_uri="sip:+4930111@carrier.example",
        to_uri="sip:+4930999@bridge",
        sip_call_id="x@carrier",
        source="198.51.100.7:5060",
        headers=HEADERS,
        trunk="carrier",
        trust_identity_headers=trusted,
    )


def test_the_record_and_the_cdr_line_carry_the_allowlisted_headers_and_the_trusted_caller() -> None:
    info = CallInfo.of(_identity(True), route=None, provider="echo")
    builder = RecordBuilder(info, ledger=CarrierLedger(), start_ns=T0, started_at=1_700_000_000.0)
    _, record = builder.finish(outcome(), T0 + 1_000_000_000)
    call = json.loads(record.cdr_line())["call"]
    assert call["sip_headers"] == [
        ["X-Customer-Id", "c-42"],
        ["P-Asserted-Identity", "<sip:+4930222@carrier.example>"],
        ["Diversion", "<sip:+4930333@carrier.example>;reason=no-answer"],
        ["X-Bad", "abc"],
    ]
    assert (call["caller"], call["diverted_from"], call["identity_trusted"]) == ("+4930222", "+4930333", True)
    assert (call["sip_headers_dropped"], call["sip_headers_cut"]) == (0, 0)


def test_an_untrusted_trunk_s_record_keeps_from_as_the_caller() -> None:
    call = CallInfo.of(_identity(False), route=None, provider="echo").to_json()
    assert (call["caller"], call["diverted_from"], call["identity_trusted"]) == ("+4930111", "", False)
    assert ["P-Asserted-Identity", "<sip:+4930222@carrier.example>"] in call["sip_headers"]


def test_the_webhook_s_call_started_and_job_bodies_carry_them() -> None:
    identity = _identity(True)
    name, body = event_body(CallStarted(CallInfo.of(identity, route=None, provider="echo"), 1.0))
    started = json.loads(body)["call"]
    assert name == "call_started" and started["sip_headers"][0] == ["X-Customer-Id", "c-42"]
    assert started["caller"] == "+4930222"
    job = json.loads(request_body(JobRequest("job-1", "lookup", "{}", "function", 10), identity))
    assert job["call"]["caller"] == "+4930222"
    assert ["X-Customer-Id", "c-42"] in job["call"]["sip_headers"]
    assert all(name != "Subject" for name, _ in job["call"]["sip_headers"])


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    return path


def test_the_file_configures_the_allowlist_and_the_trunk_s_trust(tmp_path: Path) -> None:
    config = load(
        _write(
            tmp_path,
            '[inbound]\nsip_headers = ["X-Customer-*", "History-Info"]\n'
            '[[trunks]]\nname = "carrier"\nallow = ["198.51.100.0/24"]\ntrust_identity_headers = true\n'
            '[[trunks]]\nname = "pbx"\nallow = ["192.0.2.0/24"]\n',
        )
    )
    assert config.inbound.sip_headers == ("X-Customer-*", "History-Info")
    assert [t.trust_identity_headers for t in trunk_policies(config, {})] == [True, False]
    assert server_config(config, {}).sip_headers == ("X-Customer-*", "History-Info")
    assert load(_write(tmp_path, "")).inbound.sip_headers == DEFAULT_ALLOW


def test_an_allowlist_of_credentials_or_not_a_header_name_is_refused(tmp_path: Path) -> None:
    for bad in ('"Authorization"', '"X-*-*"', '"X Y"'):
        with pytest.raises(ConfigError) as info:
            load(_write(tmp_path, f"[inbound]\nsip_headers = [{bad}]\n"))
        assert any("inbound.sip_headers" in p for p in info.value.problems)


def test_pjsua2_refuses_the_options_it_cannot_honour(tmp_path: Path) -> None:
    for text in (
        '[inbound]\nsip_headers = ["X-*"]\n',
        '[[trunks]]\nname = "c"\nallow = ["198.51.100.0/24"]\ntrust_identity_headers = true\n',
    ):
        config = load(_write(tmp_path, '[engine]\nname = "pjsua2"\n' + text))
        with pytest.raises(ConfigError, match="trust_identity_headers: the pjsua2 engine"):
            server_config(config, {})


def test_a_route_selects_on_the_trusted_caller_number(tmp_path: Path) -> None:
    config = load(
        _write(
            tmp_path,
            '[[routes]]\nname = "vip"\ncaller = "_+4930222"\n'
            '[[routes]]\nname = "berlin"\ncaller = "_+4930."\n'
            '[[routes]]\nname = "rest"\n',
        )
    )
    trusted, untrusted = _identity(True), _identity(False)
    pick = [
        select_route(config.routes, i.request_user, i.headers, "inbound", i.caller)
        for i in (trusted, untrusted)
    ]
    assert [r.name if r else None for r in pick] == ["vip", "berlin"]
    with pytest.raises(ConfigError, match="caller"):
        load(_write(tmp_path, '[[routes]]\nname = "o"\ndirection = "outbound"\ncaller = "1"\n'))
