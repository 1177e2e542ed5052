"""`parlora-bridge doctor`'s offline pieces (bridge/cli/doctor.py): lines, exit status, scrubbing, ports,
keys by name, the OPTIONS probe's request. The network checks run against the fakes in
tests/integration/test_doctor.py."""

from __future__ import annotations

import socket

from bridge.cli.config import BridgeConfig, Defaults, Listeners, ProviderConfig, Trunk
from bridge.cli.doctor import Finding, check_keys, check_ports, options_request, report


def test_report_prints_one_line_per_check_fails_on_any_failure_and_scrubs_secrets() -> None:
    findings = [
        Finding("port sip udp", "ok", "127.0.0.1:5060 free"),
        Finding("provider xai auth", "fail", "no session: bad key sk-live-abcdef"),
        Finding("provider xai auth", "warn", "not tried"),
    ]
    lines, status = report(findings, ["sk-live-abcdef", "ab"])  # too short a value is not scrubbed
    assert status == 1
    assert lines == [
        "ok   port sip udp: 127.0.0.1:5060 free",
        "FAIL provider xai auth: no session: bad key ***",
        "warn provider xai auth: not tried",
    ]
    assert report(findings[:1] + findings[2:], [])[1] == 0  # a warning does not fail


def test_a_port_in_use_fails_and_a_free_one_passes() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        config = BridgeConfig(listeners=Listeners(sip_udp=("127.0.0.1", port)))
        by_check = {f.check: f for f in check_ports(config)}
    assert by_check["port sip udp"].status == "fail"
    assert by_check["port sip tcp"].status == "ok"  # UDP taken, TCP free on the same number


def test_keys_are_named_never_shown() -> None:
    config = BridgeConfig(
        defaults=Defaults(provider="xai"),
        providers=(ProviderConfig("xai", "MY_XAI_KEY"),),
        trunks=(Trunk("pbx", registrar="sip:b@pbx", password_env="PBX_PW"),),
    )
    found = {f.check: f for f in check_keys(config, {"MY_XAI_KEY": "xai-secret-value"})}
    assert (found["key xai"].status, found["key xai"].detail) == ("ok", "$MY_XAI_KEY is set (not shown)")
    assert found["secret trunks[0].password_env"].status == "fail"
    assert all("xai-secret-value" not in f.detail for f in found.values())


def test_the_options_probe_is_a_well_formed_request() -> None:
    raw = options_request("sip:pbx.example.com:5060", ("127.0.0.1", 40000), "a1b2c3")
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "OPTIONS sip:pbx.example.com:5060 SIP/2.0" and body == b""
    headers = {k: v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert headers["Via"].startswith("SIP/2.0/UDP 127.0.0.1:40000;branch=z9hG4bK")
    assert headers["CSeq"] == "1 OPTIONS" and headers["Content-Length"] == "0"
    assert {"From", "To", "Call-ID", "Max-Forwards"} <= headers.keys()
