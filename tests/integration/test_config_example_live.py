"""`parlora-bridge serve --config deploy/example.toml` runs as a deployment does: the example, copied with
loopback addresses and ports (its TLS certificate made here, its providers the embedded echo, its registrar
and webhook on loopback), starts, and each section does what its comments say:

- [listeners]: SIP over UDP, TCP and TLS (a TLS OPTIONS is answered over the handshake);
- [engine]: the RTP port range's both bounds (the start line names them) and max_calls;
- [[trunks]] as identities: the carrier (from its own address, 127.0.0.3 here), `transport = "tls"`,
  `srtp = "require"`: its INVITEs are digest-challenged for its user, and one over TLS that offers no SRTP
  (plain RTP/AVP, no a=crypto) gets 488; the office PBX (127.0.0.1) is not challenged and its call over UDP
  stays plain;
- [inbound] + the trunks' allowlists: a source outside them gets 403;
- [[routes]]: the called number picks the route (sales, support);
- [telephony]: the limits are applied (the start line), a call is ended at `max_call_duration_s` (set small);
- [logging] format = "json": every log line is a JSON object.
Before, the TLS listener, SRTP and the limits of the file were warned about and ignored."""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import sys
import time
from pathlib import Path

import peers
import pytest

from providers.fakes.gemini_live import ensure_cert
from sip.core.auth import AuthAnswer, Credentials, DigestClient
from sip.core.message import Request, Response, parse

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "example.toml"
BRIDGE = [sys.executable, "-m", "bridge"]
CARRIER = ("carrier-in", "carrier-pw-5c1e")
WAIT_S = 10.0


def _example(tmp_path: Path, sip: int, tls: int, http: int, rtp: int, dead: int) -> Path:
    """The example with loopback addresses and ports, its relative files next to the copy."""
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "support.md").write_text("You answer the support line.")
    cert, key, _ = ensure_cert(None, None, str(tmp_path))
    text = EXAMPLE.read_text()
    for old, new in (
        ('sip_udp = "0.0.0.0:5060"', f'sip_udp = "127.0.0.1:{sip}"'),
        ('sip_tcp = "0.0.0.0:5060"', f'sip_tcp = "127.0.0.1:{sip}"'),
        ('sip_tls = "0.0.0.0:5061"', f'sip_tls = "127.0.0.1:{tls}"'),
        ('tls_cert = "tls/bridge.pem"', f"tls_cert = {json.dumps(cert)}"),
        ('tls_key = "tls/bridge.key"', f"tls_key = {json.dumps(key)}"),
        ('http = "127.0.0.1:8080"', f'http = "127.0.0.1:{http}"'),
        ("max_calls = 200", "max_calls = 4"),
        ('rtp_ports = "10000-10999"', f'rtp_ports = "{rtp}-{rtp + 7}"'),
        ('provider = "openai-realtime"', 'provider = "echo"'),  # no provider off this machine
        ('provider = "gemini-live"', 'provider = "echo"'),
        ("pbx.example.com:5060", f"127.0.0.1:{dead}"),  # a registrar that never answers
        ('allow = ["192.0.2.0/24"]', 'allow = ["127.0.0.1/32"]'),  # the office PBX
        ('allow = ["198.51.100.0/24", "2001:db8::/32"]', 'allow = ["127.0.0.3/32"]'),  # the carrier
        ('url = "https://app.example.com/parlora"', f'url = "http://127.0.0.1:{dead}/parlora"'),
        ("max_call_duration_s = 7200", "max_call_duration_s = 2"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    return path


def _ports() -> tuple[int, int, int, int, int]:
    sip = peers.free_udp_port(also_tcp=True)
    tls = peers.free_udp_port(also_tcp=True)
    http = peers.free_udp_port(also_tcp=True)
    rtp = peers.free_rtp_port()
    return sip, tls, http, rtp, peers.free_udp_port()


class Channel:
    """One SIP peer over UDP or over a TLS connection: sends text, reads whole messages."""

    def __init__(self, sock: socket.socket, bridge: tuple[str, int], transport: str) -> None:
        self.sock, self.bridge, self.transport = sock, bridge, transport
        self.local = sock.getsockname()
        self.buffer = b""
        sock.settimeout(WAIT_S)

    def send(self, text: str) -> None:
        data = text.replace("\n", "\r\n").encode()
        if self.transport == "UDP":
            self.sock.sendto(data, self.bridge)
        else:
            self.sock.sendall(data)

    def receive(self) -> Response | object:
        if self.transport == "UDP":
            return parse(self.sock.recv(65535))
        while True:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if sep:
                match = re.search(rb"(?im)^(?:content-length|l)\s*:\s*(\d+)", head)
                length = int(match.group(1)) if match else 0
                if len(rest) >= length:
                    self.buffer = rest[length:]
                    return parse(head + sep + rest[:length])
            chunk = self.sock.recv(65535)
            assert chunk, "the bridge closed the TLS connection"
            self.buffer += chunk

    def final(self) -> Response:
        """The first final response (skipping 1xx); requests from the bridge are answered 200 on the way."""
        while True:
            message = self.receive()
            if isinstance(message, Response):
                if message.status >= 200:
                    return message
            else:
                raise AssertionError(f"a request while waiting for a final response: {message}")


SDP_PLAIN = "v=0\no=- 1 1 IN IP4 127.0.0.1\ns=-\nc=IN IP4 127.0.0.1\nt=0 0\nm=audio {port} RTP/AVP 0\na=rtpmap:0 PCMU/8000\n"


def _request(
    ch: Channel, method: str, uri: str, call_id: str, cseq: int, branch: str, *, to_tag: str = "",
    body: str = "", extra: str = "",
) -> str:  # fmt: skip
    host, port = ch.local[0], ch.local[1]
    scheme = "sips" if ch.transport == "TLS" else "sip"
    content = "Content-Type: application/sdp\n" if body else ""
    return (
        f"{method} {uri} SIP/2.0\nVia: SIP/2.0/{ch.transport} {host}:{port};branch=z9hG4bK-{branch}\n"
        f"Max-Forwards: 70\nFrom: <sip:carrier@{host}>;tag=ex-{call_id}\nTo: <{uri}>{to_tag}\n"
        f"Call-ID: {call_id}\nCSeq: {cseq} {method}\nContact: <{scheme}:carrier@{host}:{port}>\n{extra}"
        f"{content}Content-Length: {len(body.replace(chr(10), chr(13) + chr(10)).encode())}\n\n{body}"
    )


def _to_tag(response: Response) -> str:
    value = response.headers.get("To") or ""
    match = re.search(r";\s*tag=([^;>\s]+)", value)
    return f";tag={match.group(1)}" if match else ""


def _invite(
    ch: Channel, number: str, call_id: str, *, headers: str = "", challenged: bool = False
) -> tuple[Response, str, str]:
    """INVITE `number` with a plain RTP/AVP offer; `challenged`: the INVITE must be digest-challenged, and the
    carrier's account answers it. The final response to the (authorised) INVITE, its branch and the URI."""
    scheme = "sips" if ch.transport == "TLS" else "sip"
    uri = f"{scheme}:{number}@127.0.0.1:{ch.bridge[1]}"
    body = SDP_PLAIN.format(port=peers.free_udp_port())
    ch.send(_request(ch, "INVITE", uri, call_id, 1, f"{call_id}-1", body=body, extra=headers))
    first = ch.final()
    if not challenged:
        return first, f"{call_id}-1", uri
    assert first.status == 401, first  # the carrier trunk's inbound_auth_user, for its own requests
    ch.send(_request(ch, "ACK", uri, call_id, 1, f"{call_id}-1", to_tag=_to_tag(first)))
    answer = DigestClient(Credentials(*CARRIER)).respond(first, "INVITE", uri)
    assert isinstance(answer, AuthAnswer)
    auth = "".join(f"{name}: {value}\n" for name, value in answer.headers)
    ch.send(_request(ch, "INVITE", uri, call_id, 2, f"{call_id}-2", body=body, extra=headers + auth))
    return ch.final(), f"{call_id}-2", uri


def test_the_example_file_runs_as_a_deployment(tmp_path: Path) -> None:
    sip, tls, http, rtp, dead = _ports()
    config = _example(tmp_path, sip, tls, http, rtp, dead)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(
        PYTHONUNBUFFERED="1",
        PARLORA_SIP_PASSWORD="office-pw-1",
        PARLORA_CARRIER_PASSWORD=CARRIER[1],
        PARLORA_HTTP_TOKEN="http-token-1234",
        PARLORA_WEBHOOK_SECRET="whsec-example-1234",
    )
    bridge = peers.ManagedProcess(
        [*BRIDGE, "serve", "--config", config], cwd=tmp_path, env=env, name="bridge"
    )
    try:
        started = bridge.wait_for(
            rf"listening on udp 127\.0\.0\.1:{sip} and tcp and tls 127\.0\.0\.1:{tls}", 30
        )
        assert started is not None
        # [engine] and [telephony]: the range's both bounds, max_calls, the limits of the file
        bridge.wait_for(rf"at most 4 calls per process, RTP ports {rtp}-{rtp + 7}\)", 5)
        bridge.wait_for(r"call limits: max call duration 2 s, RTP timeout 30 s, on hold 3600 s", 5)

        # [listeners] sip_tls: a TLS handshake with the certificate of the file, and OPTIONS answered over it
        context = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
        raw = socket.create_connection(("127.0.0.1", tls), timeout=WAIT_S, source_address=("127.0.0.3", 0))
        with context.wrap_socket(raw, server_hostname="localhost") as tls_sock:
            assert tls_sock.version() in ("TLSv1.2", "TLSv1.3")
            ch = Channel(tls_sock, ("127.0.0.1", tls), "TLS")
            ch.send(_request(ch, "OPTIONS", f"sips:bridge@127.0.0.1:{tls}", "ex-opt", 1, "opt-1"))
            assert ch.final().status == 200
            # the carrier trunk: transport tls, srtp require: an offer without a=crypto is refused
            final, branch, uri = _invite(ch, "+493012345678", "ex-tls-plain", challenged=True)
            assert final.status == 488, final
            ch.send(_request(ch, "ACK", uri, "ex-tls-plain", 2, branch, to_tag=_to_tag(final)))

        # the office PBX over UDP: not challenged (it has no credentials), a plain call is taken, and the route
        # follows the number
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        with udp:
            ch = Channel(udp, ("127.0.0.1", sip), "UDP")
            final, branch, uri = _invite(ch, "+493012345678", "ex-udp-sales")
            assert final.status == 200, final
            ch.send(_request(ch, "ACK", uri, "ex-udp-sales", 1, f"ack-{branch}", to_tag=_to_tag(final)))
            bridge.wait_for(r"route sales", 5)
            # [telephony] max_call_duration_s (2 s here): the goodbye asked of the model, then the bridge's BYE
            began = time.monotonic()
            udp.settimeout(20.0)  # the echo model says no goodbye: the BYE comes at the backstop (12 s)
            bye = ch.receive()
            while isinstance(bye, Response):  # (retransmitted 200s until our ACK landed)
                bye = ch.receive()
            assert isinstance(bye, Request) and bye.method == "BYE", bye
            assert time.monotonic() - began >= 1.0
            bridge.wait_for(r"the call reached --max-call-duration \(2 s\)", 5)
            ch.send(f"SIP/2.0 200 OK\n{_echo_headers(bye)}Content-Length: 0\n\n")
            final, branch, uri = _invite(ch, "08001234", "ex-udp-support")
            assert final.status == 200, final
            bridge.wait_for(r"route support\b", 5)
            ch.send(_request(ch, "ACK", uri, "ex-udp-support", 1, f"ack-{branch}", to_tag=_to_tag(final)))
            ch.send(_request(ch, "BYE", uri, "ex-udp-support", 3, "bye-support", to_tag=_to_tag(final)))

        # [inbound] + the trunks' allowlists: a source outside them gets 403 (drop_unknown = false)
        outsider = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        outsider.bind(("127.0.0.2", 0))
        with outsider:
            ch = Channel(outsider, ("127.0.0.1", sip), "UDP")
            uri = f"sip:+493012345678@127.0.0.1:{sip}"
            body = SDP_PLAIN.format(port=40000)
            ch.send(_request(ch, "INVITE", uri, "ex-outsider", 1, "out-1", body=body))
            assert ch.final().status == 403

        # [logging] format = "json": every line the bridge wrote is a JSON object
        lines = [line for line in bridge.stderr.splitlines() if line.strip()]
        assert lines and all(json.loads(line)["message"] for line in lines), lines[:5]
    finally:
        rc = bridge.stop(term_timeout=15.0)
    assert rc == 0, bridge.stderr[-3000:]


def _echo_headers(request: Request) -> str:
    """The headers a response copies from `request` (RFC 3261 §8.2.6.2)."""
    return "".join(
        f"{name}: {value}\n"
        for name in ("Via", "From", "To", "Call-ID", "CSeq")
        for value in request.headers.get_all(name)
    )


pytestmark = pytest.mark.integration
