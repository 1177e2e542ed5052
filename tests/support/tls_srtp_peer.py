"""Harness moved unchanged from tests/integration/test_tls_srtp_peer.py: LOOPBACK, _baresip, make_pki."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import peers
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LOOPBACK = peers.LOOPBACK


def make_pki(path: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "parlora-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOOPBACK))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = path / "uas.crt", path / "uas.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_path), str(key_path)


def _baresip(tmp_path: Path, wav: Path, cert: str, mediaenc: str) -> peers.BaresipCaller:
    return peers.BaresipCaller(
        tmp_path / "bs",
        wav,
        account_params=f"mediaenc={mediaenc}",
        extra_config={"sip_cafile": cert, "module": "srtp.so"},
        sip_trace=True,
    )
