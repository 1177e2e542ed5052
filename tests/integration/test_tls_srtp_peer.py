"""baresip over SIP/TLS with SDES-SRTP (``mediaenc=srtp-mand``) against a tiny TLS+SRTP echo UAS assembled here
from the sans-I/O cores: sip.core.ua's UserAgent, sip.native.tls's listener (the TCP shell's connection class under TLS),
sip.core.offer_answer's SDES offer/answer (policy "required") and rtp.srtp (pylibsrtp).

What it proves, on loopback: baresip calls ``sip:bridge@127.0.0.1:PORT;transport=tls`` (our certificate: a
self-signed pair made here, given to it as ``sip_cafile``; measured: baresip 1.0.0 completes the handshake even
with a CA that did not sign it, so it does not verify the server; our own client side does, see
tests/unit/sip/test_sip_tls.py); the INVITE, ACK and BYE arrive over TLS and are answered over it; the SDP answer carries our own key for the first suite in baresip's order; every RTP packet on the wire is
SRTP (it authenticates with baresip's key, and its payload is not the plain PCMU that comes out of it); our
echo, re-protected with our key, is decrypted by baresip and heard (the utterance correlates in its recording).
A plain RTP/AVP offer is refused 488 by the same UAS ("required").

Bounded: every wait has a timeout; baresip is stopped by PID.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import peers
import pytest

from rtp.packet import build, is_rtcp, parse
from rtp.srtp import SrtpContext
from sip.core import ua as core
from sip.core.framing import StreamFramer
from sip.core.offer_answer import LocalMedia, NegotiatedMedia
from sip.core.sdes import SrtpPolicy
from sip.native.tls import TlsListener, sdes_policy, server_context
from sip.native.transport import DeadlineTimer, Inbound, SipTransports, TransportRef
from tests.support.tls_srtp_peer import LOOPBACK, _baresip, make_pki

CALL_TIMEOUT_S = 40.0


@dataclass
class CallMedia:
    """One call's SRTP echo: what came in, what went out."""

    sock: socket.socket
    srtp: SrtpContext | None = None
    remote: tuple[str, int] | None = None
    ssrc: int = 0x5EC0DE
    seq: int = 1000
    ts: int = 0
    packets_in: int = 0
    rtcp_in: int = 0
    plain_like: int = 0  # datagrams whose payload on the wire equals the decrypted payload (must stay 0)
    payloads: list[bytes] = field(default_factory=list)


class TlsSrtpEchoUas:
    """A UAS on the cores: TLS listener → UserAgent → answer with SDES (policy `srtp`) → SRTP echo."""

    def __init__(self, cert: str, key: str, srtp: SrtpPolicy = "required") -> None:
        self._cert, self._key, self._srtp = cert, key, srtp
        self.clock = time.monotonic_ns
        self.events: list[core.UaEvent] = []
        self.transports_seen: list[str] = []
        self.media: dict[str, CallMedia] = {}
        self.negotiated: dict[str, NegotiatedMedia] = {}
        self.ended = asyncio.Event()
        self.ending_status: int | None = None

    async def start(self) -> int:
        self.loop = asyncio.get_running_loop()
        self.transports = SipTransports(self.loop, self._receive, StreamFramer, self.clock)
        self.listener = await TlsListener.start(
            self.transports, LOOPBACK, 0, server_context(self._cert, self._key)
        )
        port = self.listener.local[1]
        # the core checks each offer against the SRTP policy when the INVITE arrives (sip.core.offer_answer.check_offer)
        config = core.UaConfig(host=LOOPBACK, port=port, srtp=self._srtp)
        self.ua = core.UserAgent(config, rng=random.Random(7))
        self.timer = DeadlineTimer(self.loop, self.clock, self._on_timer)
        return port

    async def stop(self) -> None:
        self.timer.cancel()
        for media in self.media.values():
            self._close_media(media)
        await self.listener.close()
        await self.transports.close()

    # --- SIP ---

    def _receive(self, item: Inbound, source: tuple[str, int], ref: TransportRef, now: int) -> None:
        self.transports_seen.append(ref.kind)
        if isinstance(item, bytes):
            self.ua.receive(item, source, ref.kind, now)
        else:
            self.ua.receive_message(item, source, ref.kind, now)
        self._flush(now)

    def _on_timer(self, now: int) -> None:
        self.ua.handle_timer(now)
        self._flush(now)

    def _flush(self, now: int) -> None:
        for _ in range(16):
            for tx in self.ua.transmits():
                if tx.transport == "tls":
                    self.listener.send(tx.data, tx.destination)
                else:
                    self.transports.send(tx.data, tx.destination, tx.transport)
            if (
                self.ending_status is None
                and any(n.startswith("offer_488_") and v for n, v in self.ua.stats.items())
            ):  # the core refused the INVITE with 488 before it became a call (sip.core.offer_answer.check_offer)
                self.ending_status = 488
                self.ended.set()
            events = self.ua.events()
            if not events:
                break
            for event in events:
                self.events.append(event)
                self._on_event(event, now)
        self.timer.arm(self.ua.next_deadline())

    def _on_event(self, event: core.UaEvent, now: int) -> None:
        if isinstance(event, core.IncomingCall):
            policy = sdes_policy(self._srtp, event.transport)  # SDES keys only over TLS
            if policy is None:
                self.ua.reject(event.call, 488, now, reason="SRTP requires TLS")
                return
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((LOOPBACK, 0))
            sock.setblocking(False)
            media = CallMedia(sock)
            self.media[event.call] = media
            self.loop.add_reader(sock.fileno(), self._on_rtp, media)
            local = LocalMedia(LOOPBACK, sock.getsockname()[1], session_id=4711, srtp=policy)
            self.ua.answer(event.call, local, now)
        elif isinstance(event, core.CallAnswered) and event.media is not None:
            media = self.media[event.call]
            self.negotiated[event.call] = event.media
            keys = event.media.srtp
            if keys is not None:
                media.srtp = SrtpContext(keys.suite, keys.local_key, keys.remote_key)
            media.remote = (event.media.remote_address, event.media.remote_port)
        elif isinstance(event, core.CallEnded | core.CallCancelled):
            self.ending_status = event.status_code if isinstance(event, core.CallEnded) else 487
            found = self.media.get(event.call)
            if found is not None:
                self._close_media(found)
            self.ended.set()

    # --- media: SRTP in, the same audio back under our key and SSRC ---

    def _on_rtp(self, media: CallMedia) -> None:
        try:
            data, source = media.sock.recvfrom(2048)
        except (BlockingIOError, InterruptedError):
            return
        if media.srtp is None:
            return
        if is_rtcp(data):
            if media.srtp.unprotect_rtcp(data) is not None:
                media.rtcp_in += 1
            return
        plain = media.srtp.unprotect(data)
        if plain is None:
            return  # counted by the context
        packet = parse(plain)
        if isinstance(packet, int) or packet.pt != 0:
            return
        media.packets_in += 1
        if data[12 : 12 + len(packet.payload)] == packet.payload:
            media.plain_like += 1
        media.payloads.append(packet.payload)
        media.remote = source  # symmetric RTP
        out = build(0, media.seq == 1000, media.seq, media.ts, media.ssrc, packet.payload)
        media.seq += 1
        media.ts += len(packet.payload)
        media.sock.sendto(media.srtp.protect(out), source)

    def _close_media(self, media: CallMedia) -> None:
        if media.sock.fileno() >= 0:
            self.loop.remove_reader(media.sock.fileno())
            media.sock.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return make_pki(tmp_path_factory.mktemp("tls-pki"))


def _tone_wav(path: Path, seconds: float = 3.0) -> np.ndarray:
    """A warbling tone (not periodic at 20 ms, so the correlation lag is unambiguous), then silence."""
    t = np.arange(int(seconds * 8000)) / 8000
    tone = 0.4 * np.sin(2 * np.pi * (400 + 300 * np.sin(2 * np.pi * 1.3 * t)) * t)
    samples = (np.concatenate([tone, np.zeros(8000)]) * 32767).astype(np.int16)
    peers.write_wav(path, samples)
    return samples


async def test_baresip_tls_srtp_echo(tmp_path: Path, pki: tuple[str, str]) -> None:
    cert, key = pki
    wav = tmp_path / "tone.wav"
    samples = _tone_wav(wav)
    uas = TlsSrtpEchoUas(cert, key, "required")
    port = await uas.start()
    try:
        bs = _baresip(tmp_path, wav, cert, "srtp-mand")
        target = f"sip:bridge@{LOOPBACK}:{port};transport=tls"
        result = await asyncio.to_thread(bs.run, target, timeout=CALL_TIMEOUT_S)
        async with asyncio.timeout(10):
            await uas.ended.wait()
    finally:
        await uas.stop()
    trace = result.stdout + result.stderr
    assert result.established, trace[-4000:]
    assert set(uas.transports_seen) == {"tls"}  # INVITE, ACK, BYE: all over TLS
    (call,) = uas.negotiated
    negotiated = uas.negotiated[call]
    assert negotiated.srtp is not None and negotiated.srtp.suite.startswith("AES_CM_128_HMAC_SHA1_")
    assert "RTP/SAVP" in trace and "a=crypto:" in trace
    (media,) = uas.media.values()
    assert media.srtp is not None
    assert media.packets_in >= 100, media.srtp.counters()  # 3 s of tone at 50 packets/s, authenticated
    assert media.plain_like == 0  # nothing on the wire was the plain PCMU payload
    assert media.srtp.auth_failures == 0 and media.srtp.errors == 0
    sent = b"".join(media.payloads)
    assert sent.count(bytes([0xFF])) < len(sent)  # real audio, not idle PCMU
    heard = result.received
    assert len(heard) > 8000, "baresip decoded nothing of our SRTP echo"
    peak, _lag = peers.normalized_xcorr(samples[:16000], heard)
    assert peak > 0.8, f"the echo was not heard (correlation {peak:.2f})"
    print(
        f"suite {negotiated.srtp.suite} tag {negotiated.srtp.tag}; {media.packets_in} SRTP packets in, "
        f"{media.rtcp_in} SRTCP; echo correlation {peak:.3f}; {media.srtp.counters()}"
    )


async def test_plain_rtp_offer_is_refused_when_srtp_is_required(tmp_path: Path, pki: tuple[str, str]) -> None:
    cert, key = pki
    wav = tmp_path / "tone.wav"
    _tone_wav(wav, 1.0)
    uas = TlsSrtpEchoUas(cert, key, "required")
    port = await uas.start()
    try:
        bs = _baresip(tmp_path, wav, cert, "none")  # no mediaenc: RTP/AVP without a=crypto
        target = f"sip:bridge@{LOOPBACK}:{port};transport=tls"
        result = await asyncio.to_thread(bs.run, target, timeout=CALL_TIMEOUT_S)
        async with asyncio.timeout(10):
            await uas.ended.wait()
    finally:
        await uas.stop()
    assert not result.established
    assert uas.ending_status == 488
    assert result.close_reason is not None and "488" in result.close_reason
