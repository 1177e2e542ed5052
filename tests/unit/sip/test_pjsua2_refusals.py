"""On `--engine pjsua2`: every trunk-edge option that engine cannot honour is refused at start with
"not supported on the pjsua2 engine", never silently ignored (an operator would believe a trunk registered,
protected or encrypted when it is not); placing a call on it is refused the same way."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest

pytest.importorskip("pjsua2")  # the optional extra (parlora-bridge[pjsua2]); the suite installs it

from bridge.server.api import Application, Server, ServerConfig
from sip.engine import EngineConfig, EngineStartError
from sip.pjsua2.agent import Pjsua2UserAgent, unsupported_options

REFUSED = [
    ({"allow": ("10.0.0.0/8",)}, "--allow"),
    ({"drop_unknown": True}, "--drop-unknown"),
    ({"inbound_auth": ("bridge", "pw")}, "--inbound-auth"),
    ({"invite_rate_per_s": 2.0}, "--invite-rate"),
    ({"register": ("sip:1001@127.0.0.1:5999",)}, "--register"),
    ({"external_address": "203.0.113.7"}, "--external-address"),
    ({"nat": True}, "--nat"),
    ({"tls": ("127.0.0.1", 5061), "cert": "c.pem", "tls_key": "k.pem"}, "--tls"),
    ({"tls_ca": "ca.pem"}, "--tls-ca"),
    ({"srtp": "required"}, "--srtp"),
    ({"max_call_duration_s": 60.0}, "--max-call-duration"),
    ({"rtp_timeout_s": 30.0}, "--rtp-timeout"),
    ({"rtp_port_high": 4999}, "--rtp-ports"),
]


def test_a_plain_configuration_is_accepted() -> None:
    assert unsupported_options(EngineConfig()) == []
    # what serve always passes (the SIP password comes from the environment whether used or not)
    assert unsupported_options(EngineConfig(register_password="pw", max_calls=2)) == []


@pytest.mark.parametrize(("fields", "option"), REFUSED, ids=[option for _, option in REFUSED])
def test_each_trunk_edge_option_is_refused_at_construction(fields: dict[str, object], option: str) -> None:
    config = EngineConfig(**fields)  # type: ignore[arg-type]
    assert unsupported_options(config) == [option]
    with pytest.raises(EngineStartError, match=rf"^{option}: not supported on the pjsua2 engine"):
        Pjsua2UserAgent(config, lambda leg: None)


def test_several_are_named_together() -> None:
    config = EngineConfig(register=("sip:1@h",), srtp="optional", nat=True)
    assert unsupported_options(config) == ["--register", "--nat", "--srtp"]


def test_serve_on_pjsua2_with_register_exits_2_saying_why(caplog: pytest.LogCaptureFixture) -> None:
    config = ServerConfig(engine="pjsua2", sip=("127.0.0.1", 0), register=("sip:1001@127.0.0.1:5999",))
    server = Server(Application(), config)
    with caplog.at_level(logging.ERROR, logger="parlora"):
        assert asyncio.run(server.run()) == 2
    assert "--register: not supported on the pjsua2 engine" in caplog.text
    assert server.live_calls() == 0


_DIAL_ON_PJSUA2 = """
import asyncio
from bridge.server.api import Application, Server, ServerConfig

async def main() -> str:
    async with Server(Application(), ServerConfig(engine="pjsua2", sip=("127.0.0.1", 0))) as server:
        try:
            await server.dial("sip:callee@127.0.0.1:5999")
        except Exception as exc:
            return str(exc)
    return "placed"

print(asyncio.run(main()))
"""


def test_dial_on_pjsua2_is_refused_with_the_same_words() -> None:
    # In a process of its own: pjsua2 polls with select(), which cannot take a descriptor above 1023, and the
    # whole suite's process may hold that many by the time this runs (PJ_ETOOBIG at transport creation).
    done = subprocess.run(
        [sys.executable, "-c", _DIAL_ON_PJSUA2], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "placing calls is not supported on the pjsua2 engine"


def test_a_trunks_policy_is_refused_naming_the_trunk() -> None:
    from sip.core.trunks import Trunk

    plain = Trunk("pbx")
    carrier = Trunk("carrier", allow=("203.0.113.0/24",), inbound_auth=("in", "pw"), srtp="required")
    assert unsupported_options(EngineConfig(trunks=(plain,))) == []
    refused = unsupported_options(EngineConfig(trunks=(plain, carrier)))
    assert refused == ["trunks[carrier].allow", "trunks[carrier].inbound_auth_user", "trunks[carrier].srtp"]
