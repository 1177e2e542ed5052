"""A trunk's codec list (sip.core.offer_answer.CODECS; `codecs` of `[[trunks]]`, `--codec`): what its calls
offer and accept, in our order. The default is G.711, PCMU then PCMA, as before; a carrier that fails when
anything but A-law is offered gets a trunk with `codecs = ["PCMA"]`; a name the bridge cannot run refuses to
start. On the native engine, on loopback: a PBX on 127.0.0.2 with only PCMA, another on 127.0.0.3 with the
default.

No sleep is an assertion: every wait is for a datagram, bounded by a timeout."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.cli.config import ConfigError, load
from bridge.cli.ops import server_config
from bridge.server.api import _engine_config
from sip.core.offer_answer import OFFER_REFUSALS
from sip.core.trunks import Trunk
from sip.engine import EngineConfig
from sip.leg import CallLeg
from tests.support.native_shell import can_bind
from tests.support.native_trunk import WAIT_S, Peer, engine_factory

__all__ = ["engine_factory"]  # the fixture, from the shared harness

CONFIG = """
[defaults]
provider = "echo"
[[trunks]]
name = "a-law-carrier"
allow = ["127.0.0.2/32"]
codecs = ["pcma"]
{more}
"""

SECOND = """
[[trunks]]
name = "office-pbx"
allow = ["127.0.0.3/32"]
"""


def _engine(tmp_path: Path, text: str) -> EngineConfig:
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    return _engine_config(server_config(load(path), {}))


def test_a_trunks_codecs_reach_the_engine_in_upper_case_and_one_trunk_is_the_global_policy(
    tmp_path: Path,
) -> None:
    one = _engine(tmp_path, CONFIG.format(more=""))
    assert one.trunks[0].codecs == ("PCMA",) and one.codecs == ("PCMA",)
    two = _engine(tmp_path, CONFIG.format(more=SECOND))
    assert [t.codecs for t in two.trunks] == [("PCMA",), ("PCMU", "PCMA")]
    assert two.codecs == ("PCMU", "PCMA")  # a request of neither trunk: the default, not one trunk's list


@pytest.mark.parametrize("codecs", ['["G729"]', "[]", '["PCMU", "opus/48000"]'])
def test_a_codec_the_bridge_cannot_run_refuses_to_start(tmp_path: Path, codecs: str) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(CONFIG.format(more="").replace('["pcma"]', codecs))
    with pytest.raises(ConfigError) as refused:
        server_config(load(path), {})
    assert any("bridge.toml: trunks[0].codecs: " in p for p in refused.value.problems), refused.value


def test_opus_without_libopus_refuses_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(CONFIG.format(more="").replace('["pcma"]', '["opus", "PCMU"]'))
    assert _engine(tmp_path, path.read_text()).codecs == ("OPUS", "PCMU")
    monkeypatch.setattr("rtp.opus._load_libopus", lambda: None)
    with pytest.raises(ConfigError) as refused:
        server_config(load(path), {})
    assert any("trunks[0].codecs: OPUS needs libopus" in p for p in refused.value.problems), refused.value


def test_pjsua2_refuses_a_codec_list_it_cannot_honour(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(CONFIG.format(more='[engine]\nname = "pjsua2"\n'))
    with pytest.raises(ConfigError) as refused:
        server_config(load(path), {})
    assert any("pjsua2 engine negotiates its own codecs" in p for p in refused.value.problems)


# --- on the native engine ---

HEAD = "v=0\r\no=- 1 1 IN IP4 {host}\r\ns=-\r\nc=IN IP4 {host}\r\nt=0 0\r\n"
BOTH = "m=audio 40000 RTP/AVP 0 8 101\r\na=rtpmap:101 telephone-event/8000\r\n"
PCMU_ONLY = "m=audio 40000 RTP/AVP 0\r\n"
G729_ONLY = "m=audio 40000 RTP/AVP 18\r\na=rtpmap:18 G729/8000\r\n"


def _invite(port: int, source: tuple[str, int], n: int, media: str) -> bytes:
    host, sport = source
    body = HEAD.format(host=host) + media
    return (
        f"INVITE sip:bridge@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {host}:{sport};branch=z9hG4bK-codec-{n}\r\n"
        f"From: <sip:caller@{host}>;tag=f{n}\r\nTo: <sip:bridge@127.0.0.1>\r\n"
        f"Call-ID: codec-{n}@{host}\r\nCSeq: 1 INVITE\r\nMax-Forwards: 70\r\n"
        f"Contact: <sip:caller@{host}:{sport}>\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


def _m_line(text: str) -> str:
    return next(line for line in text.split("\r\n") if line.startswith("m=audio"))


needs_loopback = pytest.mark.skipif(
    not (can_bind("127.0.0.2") and can_bind("127.0.0.3")), reason="127.0.0.2-3 are not usable"
)


@needs_loopback
async def test_the_a_law_trunk_answers_pcma_where_the_pbx_takes_pcmu_and_refuses_pcmu_or_g729_alone(
    engine_factory,
) -> None:  # type: ignore[no-untyped-def]
    trunks = (
        Trunk("a-law-carrier", allow=("127.0.0.2/32",), codecs=("PCMA",)),
        Trunk("office-pbx", allow=("127.0.0.3/32",)),
    )
    agent, calls = await engine_factory(trunks=trunks)
    port = agent.local[1]
    carrier, pbx = Peer("127.0.0.2"), Peer("127.0.0.3")
    for n, (media, cause) in enumerate(((PCMU_ONLY, "codec"), (G729_ONLY, "codec")), 1):
        carrier.sock.sendto(_invite(port, carrier.address, n, media), agent.local)
        refused = await carrier.final()  # 488 before any 180, as for G.729 alone on the default list
        assert refused is not None and refused.startswith(b"SIP/2.0 488"), refused
        assert f"SIP/2.0 488 {OFFER_REFUSALS[cause].reason}".encode() in refused
    assert calls == []

    carrier.sock.sendto(_invite(port, carrier.address, 3, BOTH), agent.local)
    pbx.sock.sendto(_invite(port, pbx.address, 4, BOTH), agent.local)
    for peer, trunk, formats in ((carrier, "a-law-carrier", "8 101"), (pbx, "office-pbx", "0 101")):
        leg = next(leg for leg in await _calls(calls, 2) if leg.identity.trunk == trunk)
        leg.answer()
        ok = await peer.final()
        assert ok is not None and ok.startswith(b"SIP/2.0 200"), ok
        assert _m_line(ok.decode()).endswith(f"RTP/AVP {formats}"), ok  # the offer's order, our list


@needs_loopback
async def test_a_call_placed_offers_only_the_engines_list(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, _ = await engine_factory(codecs=("PCMA",))
    callee = Peer("127.0.0.2")
    leg = await agent.dial(f"sip:callee@127.0.0.2:{callee.address[1]}")
    data = await callee.recv()
    assert data is not None and data.startswith(b"INVITE "), data
    text = data.decode()
    assert _m_line(text).endswith("RTP/AVP 8 101") and "a=rtpmap:8 PCMA/8000" in text, text
    assert "PCMU" not in text
    leg.hangup("test over")


async def _calls(calls: list[CallLeg], n: int) -> list[CallLeg]:
    async with asyncio.timeout(WAIT_S):
        while len(calls) < n:
            await asyncio.sleep(0.01)
    return calls


G722_FIRST = "m=audio 40000 RTP/AVP 9 0\r\n"
OPUS_FIRST = "m=audio 40000 RTP/AVP 107 0\r\na=rtpmap:107 opus/48000/2\r\n"


@needs_loopback
async def test_the_incoming_calls_identity_carries_the_media_rate_its_answer_will_run_at(
    engine_factory,
) -> None:  # type: ignore[no-untyped-def]
    """Known from the offer when the INVITE arrives (the session connects its provider before it answers):
    16000 for an answer of G.722 or Opus, 8000 for G.711."""
    agent, calls = await engine_factory(
        trunks=(Trunk("wide-pbx", allow=("127.0.0.3/32",), codecs=("G722", "OPUS", "PCMU")),)
    )
    pbx = Peer("127.0.0.3")
    for n, media in enumerate((G722_FIRST, OPUS_FIRST, PCMU_ONLY), 1):
        pbx.sock.sendto(_invite(agent.local[1], pbx.address, n, media), agent.local)
    legs = await _calls(calls, 3)
    rates = {leg.identity.sip_call_id.split("@")[0]: leg.identity.media_rate for leg in legs}
    assert rates == {"codec-1": 16000, "codec-2": 16000, "codec-3": 8000}
    for leg in legs:
        leg.hangup("test over", 486)
