"""`serve --tls --srtp required` with baresip over SIP/TLS and SDES-SRTP (`mediaenc=srtp-mand`):
the call is set up over TLS, the media is SRTP both ways (baresip with srtp-mand neither sends nor accepts
plain RTP), the bridge's RTP on the wire is not the plain PCMU that baresip decodes from it, and the caller
hears the echo. A plain RTP/AVP offer under `--srtp required` is refused 488. Outbound the same way:
`parlora-bridge call ...;transport=tls --srtp require|offer` to baresip listening on TLS and answering at once
(`srtp-mand` wants RTP/SAVP, best-effort `srtp` takes our RTP/AVP offer with a=crypto): the INVITE carries
SDES keys over TLS, baresip hears the echo of its own speech decrypted, the bridge's payloads are not PCMU.

Bounded: every wait has a timeout; baresip and the bridge are stopped by PID."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import peers
import pytest
from conftest import BRIDGE, _clean_env

from rtp.g711 import ulaw_decode
from tests.support.tls_srtp_peer import _baresip, make_pki

CALL_TIMEOUT_S = 40.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return make_pki(tmp_path_factory.mktemp("serve-tls-pki"))


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> peers.Utterance:
    path = tmp_path_factory.mktemp("serve-tls-audio") / "utterance.wav"
    return peers.make_utterance(path, "Hello bridge, please say this sentence back to me", tail_silence_s=4.0)


def test_serve_tls_srtp_required_baresip_hears_the_echo(
    start_bridge, capture, pki, speech, tmp_path: Path, bridge_media_path: str
) -> None:
    cert, key = pki
    tls_port = peers.free_udp_port(also_tcp=True)
    bridge = start_bridge(
        "--provider",
        "echo",
        "--tls",
        f"127.0.0.1:{tls_port}",
        "--cert",
        cert,
        "--key",
        key,
        "--srtp",
        "required",
    )
    bridge.wait_for(rf"and tls 127\.0\.0\.1:{tls_port}")
    first = bridge.rtp_port
    cap = capture(f"udp and src host 127.0.0.1 and src portrange {first}-{first + 9}")
    bs = _baresip(tmp_path, speech.path, cert, "srtp-mand")
    result = bs.run(f"sip:bridge@127.0.0.1:{tls_port};transport=tls", timeout=CALL_TIMEOUT_S)
    trace = result.stdout + result.stderr
    assert result.established, trace[-4000:] + bridge.log[-3000:]
    assert "RTP/SAVP" in trace and "a=crypto:" in trace
    assert "SIP/2.0/TLS" in trace
    bridge.wait_for(r"call call-1 ended", timeout=20)
    cap.stop()
    heard = result.received
    assert len(heard) > 8000, "baresip decoded nothing of our SRTP"
    pieces = peers.heard_in_pieces(speech.speech, heard, pieces=4)
    assert max(p for p, _ in pieces) > 0.6, (pieces, bridge.log[-3000:])  # the echo was heard
    wire = b"".join(cap.rtp_payloads(first))
    assert len(wire) > 8000, "no RTP from the bridge on the wire"
    as_pcmu = np.frombuffer(ulaw_decode(wire), dtype="<i2")
    # read as plain PCMU, the SRTP payload is noise: it does not carry the utterance
    wire_pieces = peers.heard_in_pieces(speech.speech, as_pcmu, pieces=4)
    assert max(p for p, _ in wire_pieces) < 0.3, wire_pieces


def test_serve_srtp_required_refuses_a_plain_offer_with_488(
    start_bridge, pki, speech, tmp_path: Path
) -> None:
    cert, key = pki
    tls_port = peers.free_udp_port(also_tcp=True)
    start_bridge(
        "--provider",
        "echo",
        "--tls",
        f"127.0.0.1:{tls_port}",
        "--cert",
        cert,
        "--key",
        key,
        "--srtp",
        "required",
    )
    bs = _baresip(tmp_path, speech.path, cert, "none")
    result = bs.run(f"sip:bridge@127.0.0.1:{tls_port};transport=tls", timeout=CALL_TIMEOUT_S)
    assert not result.established
    assert result.close_reason is not None and "488" in result.close_reason, result.close_reason


# Outbound SRTP: `parlora-bridge call` to baresip over TLS.


@pytest.fixture(scope="module")
def short_speech(tmp_path_factory: pytest.TempPathFactory) -> peers.Utterance:
    path = tmp_path_factory.mktemp("call-tls-audio") / "utterance.wav"
    return peers.make_utterance(path, "Hello bridge, say this back to me", tail_silence_s=2.5)


class BaresipCallee(peers.BaresipCaller):
    """baresip as the callee: listens (UDP/TCP on `sip_port`, TLS on the next port, `sip_certificate`),
    answers at once (`answermode=auto`) with SDES-SRTP only (`mediaenc=srtp-mand`), plays its WAV and hangs
    up when the WAV ends; `received` is what it decoded of our SRTP."""

    def listen(self, start_timeout: float = 10.0) -> int:
        port = peers.free_udp_port(also_tcp=True, tcp_extra=(1,))
        self._write_config(port)
        self.proc = peers.ManagedProcess(
            [self.executable, "-f", str(self.confdir), "-s"],
            cwd=self.workdir,
            stdin_pipe=True,
            name="baresip",
        )
        self.proc.wait_for(r"baresip is ready", timeout=start_timeout)
        self.sip_port = port
        self._t0 = time.monotonic()
        return port + 1


@pytest.mark.parametrize(
    ("policy", "mediaenc"),
    [("require", "srtp-mand"), ("offer", "srtp")],  # RTP/SAVP offer; RTP/AVP + a=crypto (best effort)
)
def test_call_over_tls_offers_srtp_and_baresip_hears_the_echo(
    policy: str, mediaenc: str, pki, short_speech, capture, tmp_path: Path
) -> None:
    speech = short_speech
    cert, key = pki
    both = tmp_path / "baresip-cert.pem"
    both.write_text(Path(cert).read_text() + Path(key).read_text())
    callee = BaresipCallee(
        tmp_path / "bs",
        speech.path,
        user="callee",
        account_params=f"answermode=auto;mediaenc={mediaenc}",
        extra_config={"sip_certificate": str(both), "sip_cafile": cert, "module": "srtp.so"},
    )
    tls_port = callee.listen()
    rtp_port = peers.free_rtp_port()
    ours_tls = peers.free_udp_port(also_tcp=True)
    cap = capture(f"udp and src host 127.0.0.1 and src port {rtp_port}")
    call = peers.ManagedProcess(
        [*BRIDGE, "call", f"sip:callee@127.0.0.1:{tls_port};transport=tls", "--srtp", policy,
         "--tls", f"127.0.0.1:{ours_tls}", "--cert", cert, "--key", key, "--tls-ca", cert,
         "--rtp-port", str(rtp_port), "--log-level", "info"],
        cwd=tmp_path,
        env=_clean_env(),
        name="parlora-bridge-call",
    )  # fmt: skip
    try:
        assert call.wait(CALL_TIMEOUT_S) == 0, call.stderr[-3000:]
        result = callee.wait(10)
    finally:
        call.stop()
        callee.stop()
        cap.stop()
    trace = result.stdout + result.stderr
    assert result.established, trace[-4000:] + call.stderr[-3000:]
    assert "SIP/2.0/TLS" in trace and "a=crypto:" in trace  # our INVITE over TLS carried the SDES keys
    assert re.search(r"answered \(SIP 200", call.stdout), call.stdout
    heard = result.received
    assert len(heard) > 8000, "baresip decoded nothing of our SRTP"
    pieces = peers.heard_in_pieces(speech.speech, heard, pieces=4)
    assert max(p for p, _ in pieces) > 0.6, (pieces, call.stderr[-3000:])  # the echo came back, decrypted
    wire = b"".join(cap.rtp_payloads(rtp_port))
    assert len(wire) > 8000, "no RTP from the bridge on the wire"
    as_pcmu = np.frombuffer(ulaw_decode(wire), dtype="<i2")
    assert max(p for p, _ in peers.heard_in_pieces(speech.speech, as_pcmu, pieces=4)) < 0.3  # SRTP, not PCMU
