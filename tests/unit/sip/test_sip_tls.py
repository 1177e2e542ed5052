"""sip.native.tls: TLS 1.2/1.3 contexts, a loopback TLS listener carrying SIP through the parser, refusals (TLS 1.1, a
certificate we do not trust, a wrong name), Contact/Via for TLS, and where SDES keys may go."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sip.core.framing import StreamFramer
from sip.core.message import ParseError, Request, Response, make_response, parse, serialize
from sip.core.uri import parse_uri
from sip.native.tls import (
    TlsConfigError,
    TlsListener,
    client_context,
    contact_for,
    sdes_policy,
    server_context,
    tls_contact,
    tls_via,
)
from sip.native.transport import Address, Inbound, SipTransports, TransportRef

WAIT_S = 5.0
OPTIONS = (
    b"OPTIONS sips:bridge@localhost SIP/2.0\r\n"
    b"Via: SIP/2.0/TLS 127.0.0.1:5999;branch=z9hG4bK-tls-1;rport\r\n"
    b"Max-Forwards: 70\r\n"
    b"From: <sips:probe@localhost>;tag=a1\r\n"
    b"To: <sips:bridge@localhost>\r\n"
    b"Call-ID: tls-options-1@127.0.0.1\r\n"
    b"CSeq: 1 OPTIONS\r\n"
    b"Content-Length: 0\r\n\r\n"
)


@dataclass
class Pki:
    cert: str
    key: str
    other_ca: str  # a certificate that did not sign the server's: verification must fail


def _self_signed(path: Path, name: str) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = path / f"{name}.crt", path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    path = tmp_path_factory.mktemp("pki")
    cert, key = _self_signed(path, "localhost")
    other, _ = _self_signed(path, "impostor.example")
    return Pki(cert, key, other)


@dataclass
class Inbox:
    items: list[tuple[Inbound, Address, TransportRef]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, item: Inbound, source: Address, ref: TransportRef, now: int) -> None:
        self.items.append((item, source, ref))
        self.changed.set()

    async def wait(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.items) < count:
                self.changed.clear()
                await self.changed.wait()


@dataclass
class Server:
    transports: SipTransports
    listener: TlsListener
    inbox: Inbox


@pytest.fixture
async def server(pki: Pki) -> AsyncIterator[Server]:
    inbox = Inbox()
    loop = asyncio.get_running_loop()
    transports = SipTransports(loop, inbox, StreamFramer, lambda: 0)
    listener = await TlsListener.start(transports, "127.0.0.1", 0, server_context(pki.cert, pki.key))
    yield Server(transports, listener, inbox)
    await listener.close()
    await transports.close()
    assert transports.stats()["tcp_connections"] == 0


# --- contexts ---------------------------------------------------------------------------------------------------


def test_contexts_are_tls12_and_13_only(pki: Pki) -> None:
    srv = server_context(pki.cert, pki.key)
    cli = client_context(pki.cert)
    for context in (srv, cli):
        assert context.minimum_version is ssl.TLSVersion.TLSv1_2
        assert context.maximum_version is ssl.TLSVersion.TLSv1_3
        assert context.options & ssl.OP_NO_COMPRESSION
    assert cli.verify_mode is ssl.CERT_REQUIRED and cli.check_hostname
    assert srv.verify_mode is ssl.CERT_NONE
    mutual = server_context(pki.cert, pki.key, pki.cert, verify_clients=True)
    assert mutual.verify_mode is ssl.CERT_REQUIRED


def test_client_context_uses_the_system_store_without_a_ca() -> None:
    context = client_context()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname


def test_unusable_files_name_themselves(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError, match="not found"):
        server_context(str(tmp_path / "missing.crt"), pki.key)
    with pytest.raises(TlsConfigError, match="cannot use"):
        server_context(pki.other_ca, pki.key)  # a certificate that does not match the key
    with pytest.raises(TlsConfigError, match="CA file not found"):
        client_context(str(tmp_path / "missing-ca.pem"))
    with pytest.raises(TlsConfigError, match="needs a CA"):
        server_context(pki.cert, pki.key, verify_clients=True)


# --- a loopback TLS connection ------------------------------------------------------------------------------------


async def test_options_over_tls_reaches_the_parser_and_the_answer_goes_back(server: Server, pki: Pki) -> None:
    host, port = server.listener.local
    reader, writer = await asyncio.open_connection(
        host, port, ssl=client_context(pki.cert), server_hostname="localhost"
    )
    try:
        tls = writer.get_extra_info("ssl_object")
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        writer.write(OPTIONS[:40])  # in two pieces: the framer joins them
        await writer.drain()
        writer.write(OPTIONS[40:])
        await server.inbox.wait(1)
        item, source, ref = server.inbox.items[0]
        assert isinstance(item, Request) and not isinstance(item, ParseError)
        assert item.method == "OPTIONS" and parse_uri(item.uri).scheme == "sips"
        assert ref.kind == "tls" and ref.connection > 0 and ref.local == server.listener.local
        assert source == writer.get_extra_info("sockname")[:2]
        assert server.transports.stats()["tcp_connections"] == 1
        answer = serialize(make_response(item, 200, to_tag="b2"))
        assert server.listener.send(answer, source)
        got = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        response = parse(got)
        assert isinstance(response, Response) and response.status == 200
        assert response.headers.get("Call-ID") == "tls-options-1@127.0.0.1"
        assert not server.listener.send(answer, ("127.0.0.1", 1))  # no connection with that peer
        writer.write(b"\r\n\r\n")  # an RFC 5626 keep-alive ping: one CRLF back
        assert await asyncio.wait_for(reader.readexactly(2), WAIT_S) == b"\r\n"
    finally:
        writer.close()
        await writer.wait_closed()


async def test_tls11_client_is_refused(server: Server) -> None:
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.check_hostname = False
    old.verify_mode = ssl.CERT_NONE
    old.set_ciphers(
        "DEFAULT:@SECLEVEL=0"
    )  # let this client speak TLS 1.1 at all, so the refusal is the server's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.1 is deprecated: that is the point
        old.minimum_version = ssl.TLSVersion.TLSv1_1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    host, port = server.listener.local
    with pytest.raises((ssl.SSLError, ConnectionResetError)) as caught:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=old), WAIT_S)
        writer.close()
    assert "version" in str(caught.value).lower() or isinstance(caught.value, ConnectionResetError)
    assert server.inbox.items == []


async def test_tls12_client_is_accepted(server: Server, pki: Pki) -> None:
    tls12 = client_context(pki.cert)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    host, port = server.listener.local
    _, writer = await asyncio.open_connection(host, port, ssl=tls12, server_hostname="localhost")
    assert writer.get_extra_info("ssl_object").version() == "TLSv1.2"
    writer.write(OPTIONS)
    await server.inbox.wait(1)
    writer.close()
    await writer.wait_closed()


async def test_untrusted_certificate_is_refused_by_the_client(server: Server, pki: Pki) -> None:
    host, port = server.listener.local
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        await asyncio.wait_for(
            asyncio.open_connection(
                host, port, ssl=client_context(pki.other_ca), server_hostname="localhost"
            ),
            WAIT_S,
        )


async def test_wrong_name_is_refused_by_the_client(server: Server, pki: Pki) -> None:
    host, port = server.listener.local
    with pytest.raises(ssl.SSLCertVerificationError, match="[Hh]ostname mismatch"):
        await asyncio.wait_for(
            asyncio.open_connection(
                host, port, ssl=client_context(pki.cert), server_hostname="sip.carrier.example"
            ),
            WAIT_S,
        )


# --- addresses and SDES policy ------------------------------------------------------------------------------------


def test_contact_and_via() -> None:
    assert tls_contact("bridge", "192.0.2.1", 5061) == "<sips:bridge@192.0.2.1:5061>"
    assert tls_contact("bridge", "::1", 5061, sips=False) == "<sip:bridge@[::1]:5061;transport=tls>"
    assert contact_for("sips:+15551234@bridge.example", "bridge", "h", 5061) == "<sips:bridge@h:5061>"
    assert contact_for("sip:+15551234@bridge.example;transport=tls", "bridge", "h", 5061) == (
        "<sip:bridge@h:5061;transport=tls>"
    )
    for text in (tls_contact("b", "h", 5061), tls_contact("b", "h", 5061, sips=False)):
        uri = parse_uri(text.strip("<>"))
        assert uri.host == "h" and uri.port == 5061
    assert tls_via("h", 5061, "z9hG4bK1") == "SIP/2.0/TLS h:5061;branch=z9hG4bK1;rport"
    with pytest.raises(ValueError):
        tls_via("h", 5061, "1")


def test_sdes_keys_only_over_tls() -> None:
    assert sdes_policy("required", "TLS") == "required"
    assert sdes_policy("optional", "tls") == "optional"
    assert sdes_policy("optional", "udp") == "off"
    assert sdes_policy("off", "tcp") == "off"
    assert sdes_policy("required", "udp") is None  # refuse: keys would cross in clear
