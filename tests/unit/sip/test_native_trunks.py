"""Trunks as identities on the native engine, on loopback: two trunks from one configuration file (through
`bridge.cli.ops.server_config`, as `serve --config` builds them), a PBX on 127.0.0.2 and a carrier on 127.0.0.3.
Each call gets its own trunk's digest, SRTP mode and external address, never the other's; each trunk with a
registrar registers with its own credentials.

No sleep is an assertion: every wait is for a datagram or an event, bounded by a timeout."""

from __future__ import annotations

import asyncio
import random
from dataclasses import fields
from pathlib import Path

import pytest

from bridge.cli.config import load
from bridge.cli.ops import server_config
from bridge.server.api import _engine_config
from sip.core.auth import AuthAnswer, AuthOk, Credentials, DigestClient, DigestServer
from sip.core.message import Response, make_response, parse
from sip.core.native_plan import registration_plan
from sip.core.trunks import Trunk
from sip.engine import EngineConfig
from sip.leg import CallLeg
from tests.support.native_shell import can_bind
from tests.support.native_trunk import WAIT_S, Peer, Registrar, _to_of, engine_factory, invite

__all__ = ["engine_factory"]  # the fixture, from the shared harness, as in test_native_trunk

pytestmark = pytest.mark.skipif(
    not (can_bind("127.0.0.2") and can_bind("127.0.0.3") and can_bind("127.0.0.4")),
    reason="127.0.0.2-4 are not usable",
)

TWO_TRUNKS = """
[defaults]
provider = "echo"
[[trunks]]
name = "office-pbx"
allow = ["127.0.0.2/32"]
[[trunks]]
name = "carrier"
allow = ["127.0.0.3/32"]
inbound_auth_user = "carrier-in"
inbound_password_env = "CARRIER_PW"
external_address = "203.0.113.7"
"""


def _engine_fields(tmp_path: Path, text: str, env: dict[str, str]) -> dict[str, object]:
    """What `serve --config` tells the engine about trunks, as engine_factory's keyword arguments."""
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    ec = _engine_config(server_config(load(path), env))
    keys = {"trunks", "allow", "inbound_auth", "register", "auth_user", "register_password"}
    keys |= {"register_expires_s", "external_address", "nat", "rtp_source", "srtp"}
    return {f.name: getattr(ec, f.name) for f in fields(ec) if f.name in keys}


async def _leg(calls: list[CallLeg], n: int) -> CallLeg:
    async with asyncio.timeout(WAIT_S):
        while len(calls) < n:
            await asyncio.sleep(0.01)
    return calls[n - 1]


async def _answered(calls: list[CallLeg], n: int, peer: Peer, trunk: str) -> str:
    """The `n`th call, which must be `trunk`'s, answered: the 200's text."""
    leg = await _leg(calls, n)
    assert leg.identity.trunk == trunk
    leg.answer()
    ok = await peer.final()
    assert ok is not None and ok.startswith(b"SIP/2.0 200"), ok
    return ok.decode()


async def test_the_pbx_is_not_challenged_and_neither_call_takes_the_others_address(
    engine_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(**_engine_fields(tmp_path, TWO_TRUNKS, {"CARRIER_PW": "c-secret"}))
    port = agent.local[1]
    pbx = Peer("127.0.0.2")
    pbx.sock.sendto(invite(port, pbx.address, 1), agent.local)
    ringing = await pbx.recv()
    while ringing is not None and ringing.startswith(b"SIP/2.0 100"):
        ringing = await pbx.recv()
    # no 401: the PBX has no credentials
    assert ringing is not None and ringing.startswith(b"SIP/2.0 180"), ringing
    text = await _answered(calls, 1, pbx, "office-pbx")
    assert "203.0.113.7" not in text, text  # the carrier's external address is the carrier's
    assert "c=IN IP4 127.0.0.1" in text and "RTP/AVP" in text

    carrier = Peer("127.0.0.3")
    carrier.sock.sendto(invite(port, carrier.address, 2), agent.local)
    challenge = await carrier.final()
    assert challenge is not None and challenge.startswith(b"SIP/2.0 401"), challenge
    response = parse(challenge)
    assert isinstance(response, Response)
    ack = (
        f"ACK sip:bridge@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {carrier.address[0]}:{carrier.address[1]};branch=z9hG4bK-t14-2\r\n"
        f"From: <sip:caller@127.0.0.3>;tag=f2\r\n{_to_of(challenge)}\r\n"
        "Call-ID: t14-2@127.0.0.3\r\nCSeq: 1 ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
    carrier.sock.sendto(ack.encode(), agent.local)
    answer = DigestClient(Credentials("carrier-in", "c-secret")).respond(
        response, "INVITE", f"sip:bridge@127.0.0.1:{port}"
    )
    assert isinstance(answer, AuthAnswer)
    extra = "".join(f"{name}: {value}\r\n" for name, value in answer.headers)
    carrier.sock.sendto(invite(port, carrier.address, 3, extra=extra), agent.local)
    text = await _answered(calls, 2, carrier, "carrier")
    contact = next(line for line in text.split("\r\n") if line.lower().startswith(("contact:", "m:")))
    assert "203.0.113.7" in contact and "c=IN IP4 203.0.113.7" in text, text

    stranger = Peer("127.0.0.4")  # neither trunk's: outside every allowlist, refused as before
    stranger.sock.sendto(invite(port, stranger.address, 4), agent.local)
    refused = await stranger.final()
    assert refused is not None and refused.startswith(b"SIP/2.0 403"), refused
    assert len(calls) == 2
    trunks = agent.sip_status()["policy"]["trunks"]  # type: ignore[index]
    assert [(t["name"], t["calls"]) for t in trunks] == [("office-pbx", 1), ("carrier", 1)], trunks
    assert "c-secret" not in repr(agent.sip_status())


async def test_a_trunk_requiring_srtp_refuses_a_plain_call_while_the_pbx_gets_plain_rtp(
    engine_factory,
) -> None:  # type: ignore[no-untyped-def]
    trunks = (
        Trunk("office-pbx", allow=("127.0.0.2/32",)),
        Trunk("carrier", allow=("127.0.0.3/32",), srtp="required"),
    )
    agent, calls = await engine_factory(trunks=trunks)
    port = agent.local[1]
    carrier = Peer("127.0.0.3")
    carrier.sock.sendto(invite(port, carrier.address, 1), agent.local)
    refused = await carrier.final()  # over UDP the SDES keys cannot travel: 488, and no call
    assert refused is not None and refused.startswith(b"SIP/2.0 488"), refused
    pbx = Peer("127.0.0.2")
    pbx.sock.sendto(invite(port, pbx.address, 2), agent.local)
    text = await _answered(calls, 1, pbx, "office-pbx")
    assert "RTP/AVP" in text and "a=crypto" not in text


# --- registrations: each trunk's own credentials ---

TWO_REGISTRARS = """
[defaults]
provider = "echo"
[[trunks]]
name = "pbx-a"
registrar = "sip:1001@127.0.0.1:{a}"
auth_user = "user-a"
password_env = "PW_A"
register_expires_s = 120
[[trunks]]
name = "pbx-b"
registrar = "sip:2002@127.0.0.1:{b}"
auth_user = "user-b"
password_env = "PW_B"
register_expires_s = 300
"""


async def test_two_trunks_register_each_with_its_own_credentials(engine_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b = Registrar("user-a", "pw-a"), Registrar("user-b", "pw-b")
    text = TWO_REGISTRARS.format(a=a.peer.address[1], b=b.peer.address[1])
    fields = _engine_fields(tmp_path, text, {"PW_A": "pw-a", "PW_B": "pw-b"})
    agent, _ = await engine_factory(**fields)
    for registrar in (a, b):
        await registrar.answer_one()  # the first REGISTER: 401
        second = await registrar.answer_one()  # with the credentials: 200
        assert second.headers.get_fields("Authorization")
    users = [
        (r.seen[1].headers.get("Authorization") or "").split('username="')[1].split('"')[0] for r in (a, b)
    ]
    assert users == ["user-a", "user-b"]  # each trunk's own user (not the first trunk's for both)
    assert (a.seen[1].headers.get("Expires"), b.seen[1].headers.get("Expires")) == ("120", "300")
    async with asyncio.timeout(WAIT_S):
        while [r["state"] for r in agent.registrations_status()] != ["registered", "registered"]:
            await asyncio.sleep(0.01)
    assert [r["aor"] for r in agent.registrations_status()] == [
        f"sip:1001@127.0.0.1:{a.peer.address[1]}",
        f"sip:2002@127.0.0.1:{b.peer.address[1]}",
    ]


def test_the_registration_plan_gives_each_trunk_its_credentials_and_drives_two_cores() -> None:
    trunks = (
        Trunk("a", registrar="sip:1001@192.0.2.10", auth_user="user-a", register_password="pw-a"),
        Trunk("b", registrar="sip:2002@192.0.2.20", register_password="pw-b", external_address="203.0.113.7"),
        Trunk("c"),  # no registrar: no binding
    )
    plan = registration_plan(EngineConfig(trunks=trunks))
    assert [(p.aor, p.trunk) for p in plan] == [("sip:1001@192.0.2.10", "a"), ("sip:2002@192.0.2.20", "b")]
    servers = {
        "a": DigestServer("r", [Credentials("user-a", "pw-a")]),
        "b": DigestServer("r", [Credentials("2002", "pw-b")]),
    }
    for binding in plan:
        assert binding.trunk is not None
        reg = binding.registration(
            ("192.0.2.1", 5060), binding.external_address or "192.0.2.1", 5060, "ua", random.Random(1)
        )
        server = servers[binding.trunk]
        reg.start(0)
        (out,) = reg.requests()
        reg.receive_response(make_response(out.request, 401, headers=server.challenge(0)), 1)
        (retry,) = reg.requests()
        verdict = server.verify(
            "REGISTER", retry.request.uri, retry.request.headers.get_fields("Authorization"), 2
        )
        assert isinstance(verdict, AuthOk), (binding.trunk, verdict)
        contact = retry.request.headers.get("Contact") or ""
        assert ("203.0.113.7" in contact) == (binding.trunk == "b"), contact


async def test_a_call_from_a_trunks_registrar_is_that_trunks(
    engine_factory, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    registrar = Registrar("1001", "pw-1001")  # on 127.0.0.1: the calls for our binding come from there
    trunks = (
        Trunk("office-pbx", allow=("127.0.0.2/32",)),
        Trunk(
            "hosted-pbx",
            registrar=f"sip:1001@127.0.0.1:{registrar.peer.address[1]}",
            register_password="pw-1001",
            srtp="required",  # its calls need SRTP: one over UDP is refused, the PBX's is not
        ),
    )
    agent, calls = await engine_factory(trunks=trunks)
    await registrar.answer_one()
    await registrar.answer_one()
    caller = Peer("127.0.0.1")  # the registrar's address
    caller.sock.sendto(invite(agent.local[1], caller.address, 1), agent.local)
    refused = await caller.final()
    assert refused is not None and refused.startswith(b"SIP/2.0 488"), refused
    assert "(trunk hosted-pbx) with 488 SRTP Required Over TLS" in caplog.text
    pbx = Peer("127.0.0.2")
    pbx.sock.sendto(invite(agent.local[1], pbx.address, 2), agent.local)
    await _answered(calls, 1, pbx, "office-pbx")
