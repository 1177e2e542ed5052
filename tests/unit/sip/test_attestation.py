"""Caller-ID attestation (sip/core/attestation.py): verstat and the Identity header's PASSporT read from an INVITE,
carried into the call record, and the policy that refuses a failed attestation with 608."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import pytest

from bridge.cli.config import ConfigError, load, select_route
from bridge.server.api import Application, CallRefused, CallSetup, Server, ServerConfig
from bridge.server.records import CallInfo, CallStarted
from sip.core.attestation import MAX_IDENTITY, Attestation, attestation_of, parse_identity, uri_verstat
from sip.core.identity import call_identity
from sip.leg import CallIdentity


def _b64(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def _passport(payload: object, header: object | None = None) -> str:
    """An RFC 8224 Identity value: a SHAKEN PASSporT with a dummy signature (never verified)."""
    header = header or {
        "alg": "ES256",
        "typ": "passport",
        "ppt": "shaken",
        "x5u": "https://cert.example/c.pem",
    }
    sig = base64.urlsafe_b64encode(b"\x00" * 64).decode().rstrip("=")
    return f"{_b64(header)}.{_b64(payload)}.{sig};info=<https://cert.example/c.pem>;alg=ES256;ppt=shaken"


SHAKEN = {
    "attest": "A",
    "dest": {"tn": ["15557654321"]},
    "iat": 1765100000,
    "orig": {"tn": "15551234567"},
    "origid": "123e4567-e89b-12d3-a456-426655440000",
}


# --- verstat ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("<sip:+15551234567@carrier;user=phone;verstat=TN-Validation-Passed>;tag=1", "passed"),
        ('"Bob" <sip:+15551234567@carrier;verstat=TN-Validation-Failed;user=phone>', "failed"),
        ("<sip:+15551234567@carrier;user=phone;VERSTAT=no-tn-validation>", "none"),
        ("<tel:+15551234567;verstat=TN-Validation-Passed>", "passed"),
        ("sip:+15551234567@carrier;verstat=TN-Validation-Failed", "failed"),
        ("<sip:+15551234567@carrier;user=phone>;verstat=TN-Validation-Passed", "absent"),  # a header param
        ("<sip:+15551234567@carrier;verstat=Something-Else>", "absent"),
        ("<sip:+15551234567@carrier>", "absent"),
        ("", "absent"),
    ],
)
def test_each_verstat_form_is_read_from_the_uri(value: str, expected: str) -> None:
    assert uri_verstat(value) == expected


def test_p_asserted_identity_wins_over_from() -> None:
    headers = (
        ("From", "<sip:+15551234567@carrier;verstat=TN-Validation-Passed>;tag=a"),
        (
            "P-Asserted-Identity",
            "<sip:+15551234567@carrier;user=phone>, <tel:+15551234567;verstat=TN-Validation-Failed>",
        ),
    )
    assert attestation_of("sip:+15551234567@carrier", headers).verstat == "failed"
    assert attestation_of("sip:x@carrier", headers[:1]).verstat == "passed"
    # no From header among the fields: the engine's From URI
    assert attestation_of("sip:x@carrier;verstat=No-TN-Validation", ()).verstat == "none"


# --- the Identity header --------------------------------------------------------------------------------------------


def test_a_shaken_passport_is_decoded_without_verification() -> None:
    got = attestation_of("sip:+15551234567@carrier", (("Identity", _passport(SHAKEN)),))
    assert got == Attestation(
        verstat="absent",
        level="A",
        orig_tn="15551234567",
        dest_tn="15557654321",
        origid="123e4567-e89b-12d3-a456-426655440000",
        iat=1765100000,
        signed=True,
        verified=False,
    )


def test_the_compact_form_and_verstat_together() -> None:
    headers = (
        ("f", "<sip:+15551234567@carrier;verstat=TN-Validation-Passed>;tag=9"),
        ("y", _passport({**SHAKEN, "attest": "C"})),
    )
    got = attestation_of("", headers)
    assert (got.verstat, got.level, got.signed, got.verified) == ("passed", "C", True, False)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("not-a-jwt;info=<x>", "identity_not_jws"),
        ("a.b", "identity_not_jws"),
        ("!!!.???.sig;info=<x>", "identity_bad_base64"),
        (f"{_b64('x')[:-2]}@@.{_b64({})}.sig", "identity_bad_base64"),
        (f"{base64.urlsafe_b64encode(b'{nope').decode()}.{_b64({})}.sig", "identity_bad_json"),
        (f"{_b64({'alg': 'ES256'})}.{_b64([1, 2])}.sig", "identity_not_jws"),
        (
            f"{_b64({'alg': 'ES256'})}.{base64.urlsafe_b64encode(b'[' * 5000).decode()}.sig",
            "identity_bad_json",
        ),
    ],
)
def test_garbage_gives_no_level_and_a_reason(value: str, reason: str) -> None:
    got = parse_identity(value)
    assert (got.level, got.signed, got.reason) == (None, True, reason)


def test_hostile_claims_are_dropped_or_cut() -> None:
    payload = {"attest": "Z", "orig": {"tn": 5}, "dest": "nope", "iat": True, "origid": "u" * 1000}
    got = parse_identity(_passport(payload))
    assert (got.level, got.orig_tn, got.dest_tn, got.iat, got.reason) == (None, None, None, None, "")
    assert got.origid == "u" * 64


def test_an_oversize_identity_header_is_ignored() -> None:
    padded = _passport({**SHAKEN, "pad": "x" * MAX_IDENTITY})
    got = attestation_of("sip:a@b;verstat=TN-Validation-Passed", (("Identity", padded),))
    assert (got.verstat, got.level, got.orig_tn, got.signed, got.reason) == (
        "passed",
        None,
        None,
        True,
        "identity_oversize",
    )


# --- the record -----------------------------------------------------------------------------------------------------


def _inbound(headers: tuple[tuple[str, str], ...]) -> CallIdentity:
    return call_identity(
        "call-1",
        request_uri="sip:4930100@127.0.0.1",
        from_uri="sip:+15551234567@carrier",
        to_uri="sip:4930100@127.0.0.1",
        sip_call_id="abc",
        source="127.0.0.1:5062",
        headers=headers,
    )


def test_the_attestation_is_in_the_call_record_and_call_started() -> None:
    identity = _inbound(
        (
            ("From", "<sip:+15551234567@carrier;user=phone;verstat=TN-Validation-Passed>;tag=1"),
            ("Identity", _passport(SHAKEN)),
        )
    )
    info = CallInfo.of(identity, route="reception", provider="echo")
    assert (info.attestation.verstat, info.attestation.level) == ("passed", "A")
    started = CallStarted(info, 0.0).to_json()
    assert started["call"]["attestation"] == {
        "verstat": "passed",
        "level": "A",
        "orig_tn": "15551234567",
        "dest_tn": "15557654321",
        "origid": "123e4567-e89b-12d3-a456-426655440000",
        "iat": 1765100000,
        "signed": True,
        "verified": False,
        "reason": "",
    }
    unsigned = CallInfo.of(_inbound(()), route=None, provider="echo").to_json()["attestation"]
    assert (unsigned["verstat"], unsigned["signed"]) == ("absent", False)


# --- the policy -----------------------------------------------------------------------------------------------------


class _Leg:
    def __init__(self, identity: CallIdentity) -> None:
        self.identity = identity
        self.hung: list[int | None] = []

    def hangup(self, reason: str, status: int | None = None) -> None:
        self.hung.append(status)


class _Recorder(Application):
    def __init__(self) -> None:
        self.setups = 0

    async def setup(self, call: CallIdentity) -> CallSetup:
        self.setups += 1
        raise CallRefused(404, "stop here")


FAILED = (("P-Asserted-Identity", "<sip:+15551234567@carrier;user=phone;verstat=TN-Validation-Failed>"),)
PASSED = (("P-Asserted-Identity", "<sip:+15551234567@carrier;user=phone;verstat=TN-Validation-Passed>"),)


def _call(config: ServerConfig, headers: tuple[tuple[str, str], ...]) -> tuple[list[int | None], int, float]:
    """The statuses the leg was hung up with, the application's setups, the `attestation_failed` refusals."""
    app, leg = _Recorder(), _Leg(_inbound(headers))
    server = Server(app, config)
    asyncio.run(server._run_call(leg))  # type: ignore[arg-type]
    metrics = server.observer.metrics.registry
    refusals = metrics.get_sample_value("parlora_refusals_total", {"reason": "attestation_failed"}) or 0.0
    return leg.hung, app.setups, refusals


def test_a_failed_attestation_is_refused_with_608_when_the_option_is_on() -> None:
    on = ServerConfig(refuse_failed_attestation=True)
    assert _call(on, FAILED) == ([608], 0, 1.0)  # never reaches the application
    assert _call(on, PASSED) == ([404], 1, 0.0)
    assert _call(on, ()) == ([404], 1, 0.0)  # unsigned calls are not refused


def test_a_failed_attestation_passes_when_the_option_is_off() -> None:
    assert _call(ServerConfig(), FAILED) == ([404], 1, 0.0)


def test_an_oversize_identity_header_is_counted() -> None:
    padded = _passport({**SHAKEN, "pad": "x" * MAX_IDENTITY})
    leg = _Leg(_inbound((*PASSED, ("Identity", padded))))
    server = Server(_Recorder(), ServerConfig())
    asyncio.run(server._run_call(leg))  # type: ignore[arg-type]
    registry = server.observer.metrics.registry
    assert registry.get_sample_value("parlora_identity_ignored_total", {"reason": "identity_oversize"}) == 1.0


# --- routes -----------------------------------------------------------------------------------------------------


ROUTES = """
[[routes]]
name = "screening"
attestation = "failed"
instructions = "Ask who is calling before anything else."

[[routes]]
name = "reception"
"""


def test_an_inbound_route_may_match_on_the_attestation(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(ROUTES)
    routes = load(path).routes
    chosen = [select_route(routes, "4930100", h) for h in (FAILED, PASSED, ())]
    assert [r.name if r is not None else None for r in chosen] == ["screening", "reception", "reception"]
    path.write_text(ROUTES.replace('"failed"', '"bogus"'))
    with pytest.raises(ConfigError, match=r"routes\[0\]\.attestation: expected one of passed, failed, none"):
        load(path)
    path.write_text('[[routes]]\nname = "out"\ndirection = "outbound"\nattestation = "passed"\n')
    with pytest.raises(ConfigError, match="outbound route has no caller attestation"):
        load(path)
