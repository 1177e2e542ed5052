"""SIP over TLS (RFC 3261 §26.2, RFC 5630, RFC 5922) with the stdlib `ssl` module: contexts, a listener that
frames TLS streams with the TCP shell's own connection class, Contact/Via for TLS, and where SDES keys may go.

Contexts (TLS 1.2 and 1.3 only; OpenSSL's defaults for ciphers, no compression, no renegotiation):
- `server_context(cert_file, key_file, ca_file=None, verify_clients=False)`: `serve --tls HOST:PORT --cert
  FILE --key FILE`. With `verify_clients` (mutual TLS towards a trunk that presents a certificate) the
  client certificate is checked against `ca_file`.
- `client_context(ca_file=None, cert_file=None, key_file=None)`: outbound TLS (`--tls-ca FILE`, else the
  system store) verifying the peer's certificate and its name (RFC 5922 §7: the SIP domain against the
  subjectAltName; `ssl` does that with `check_hostname`, so connect with ``server_hostname=<domain>``).
  A client certificate is presented when `cert_file` is given.
  Both raise `TlsConfigError` (a ValueError naming the file) for a file that cannot be used.

Listener: `await TlsListener.start(transports, host, port, context)` accepts TLS connections for a
`sip.native.transport.SipTransports`, each one the TCP shell's `_TcpConnection` (framing with the parser's
StreamFramer, CRLF keep-alive pongs, closing on a framing error: unchanged) under asyncio's TLS layer, its ref
of kind "tls" so the core sees the transport as "tls" (Via ``SIP/2.0/TLS``, §26.2.1 checks). The connections
join the transports' own table, so `SipTransports.stats()` and `close()` cover them; `TlsListener.close()`
closes the listening socket. `SipTransports.send` sends over kind "tls" as over TCP (reusing the peer's
connection, else opening one with `SipTransports.tls_client`); `TlsListener.send(data, destination)` writes a
message only to an open TLS connection with that peer.

Addresses: `tls_contact` and `tls_via` build our Contact and Via for TLS; `contact_for(request_uri, ...)`
gives a ``sips:`` Contact when the request was for a ``sips:`` URI (RFC 3261 §12.1.1: it MUST then be sips)
and ``sip:...;transport=tls`` otherwise (RFC 5630 §3.1.3 deprecates transport=tls with sips, so it is never
combined with it).

SDES keys travel in the SDP in clear text, so they only go over TLS: `sdes_policy(policy, transport)` is the
SRTP policy to use for a call that came (or goes) over `transport`: itself over TLS, "off" for "optional"
elsewhere, and None for "required" elsewhere (refuse the call: 488).
"""

from __future__ import annotations

import asyncio
import ssl

from sip.core.sdes import SECURE_TRANSPORTS, sdes_policy
from sip.native.transport import Address, SipTransports, TransportRef, _TcpConnection, family_of

__all__ = [
    "SECURE_TRANSPORTS",
    "TlsConfigError",
    "TlsListener",
    "client_context",
    "contact_for",
    "sdes_policy",
    "server_context",
    "tls_contact",
    "tls_via",
]

_MIN, _MAX = ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3


class TlsConfigError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names it and says why."""


def _harden(context: ssl.SSLContext) -> ssl.SSLContext:
    context.minimum_version = _MIN
    context.maximum_version = _MAX
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    return context


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str | None) -> None:
    try:
        context.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as exc:
        raise TlsConfigError(f"TLS certificate or key file not found: {exc.filename}") from exc
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"cannot use TLS certificate {cert_file} with key {key_file}: {exc}") from exc


def _load_ca(context: ssl.SSLContext, ca_file: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except FileNotFoundError as exc:
        raise TlsConfigError(f"TLS CA file not found: {ca_file}") from exc
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"cannot use TLS CA file {ca_file}: {exc}") from exc


def server_context(
    cert_file: str, key_file: str, ca_file: str | None = None, *, verify_clients: bool = False
) -> ssl.SSLContext:
    """The context of our TLS listener (`--cert`, `--key`); see the module docstring."""
    context = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    _load_chain(context, cert_file, key_file)
    if verify_clients:
        if ca_file is None:
            raise TlsConfigError("verifying TLS clients needs a CA file")
        _load_ca(context, ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    ca_file: str | None = None, *, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """The context of our outbound TLS connections (`--tls-ca`, else the system store); the peer's
    certificate and name are always verified."""
    context = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))  # CERT_REQUIRED and check_hostname
    if ca_file is not None:
        _load_ca(context, ca_file)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert_file is not None:
        _load_chain(context, cert_file, key_file)
    return context


class TlsListener:
    """A TLS listening socket feeding a `SipTransports` (see the module docstring)."""

    def __init__(self, transports: SipTransports, server: asyncio.Server, local: Address) -> None:
        self._transports = transports
        self._server = server
        self.local = local
        self.ref = TransportRef("tls", local)

    @classmethod
    async def start(
        cls, transports: SipTransports, host: str, port: int, context: ssl.SSLContext
    ) -> TlsListener:
        """Listen for TLS on host:port (0: any free port; `local` has the real one). OSError if the
        address cannot be bound."""
        loop = asyncio.get_running_loop()
        holder: list[Address] = [(host, port)]
        ids = transports._ids  # one id space with the TCP connections: refs stay unique

        def factory() -> _TcpConnection:
            conn = _TcpConnection(transports, holder[0], next(ids))
            conn.ref = TransportRef("tls", holder[0], conn.ref.connection)
            return conn

        server = await loop.create_server(
            factory,
            host,
            port,
            family=family_of(host),
            reuse_address=True,
            ssl=context,
            ssl_handshake_timeout=10.0,
        )
        local = (str(server.sockets[0].getsockname()[0]), int(server.sockets[0].getsockname()[1]))
        holder[0] = local
        return cls(transports, server, local)

    def connection_to(self, destination: Address) -> _TcpConnection | None:
        """The open TLS connection with `destination`, if there is one."""
        known = self._transports._by_peer.get(destination)
        conn = self._transports._connections.get(known) if known is not None else None
        if conn is None or conn.closed or conn.ref.kind != "tls":
            return None
        return conn

    def send(self, data: bytes, destination: Address) -> bool:
        """Write one message on the TLS connection with `destination` (the one its request came on, §18.2.2);
        False when there is none (a TLS client connection of ours is `SipTransports.send`'s job)."""
        conn = self.connection_to(destination)
        if conn is None:
            self._transports.send_errors += 1
            return False
        conn.write(data)
        self._transports.messages_out += 1
        return True

    async def close(self) -> None:
        """Stop listening (the accepted connections close with `SipTransports.close()`)."""
        self._server.close()
        await self._server.wait_closed()


# --- our addresses over TLS ---------------------------------------------------------------------------------


def _host_port(host: str, port: int) -> str:
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{host}:{port}"


def tls_contact(user: str, host: str, port: int, *, sips: bool = True) -> str:
    """Our Contact over TLS: ``<sips:user@host:port>``, or ``<sip:user@host:port;transport=tls>``."""
    if sips:
        return f"<sips:{user}@{_host_port(host, port)}>"
    return f"<sip:{user}@{_host_port(host, port)};transport=tls>"


def contact_for(request_uri: str, user: str, host: str, port: int) -> str:
    """The Contact for a dialog a request over TLS creates: sips when the request URI was sips (§12.1.1)."""
    return tls_contact(user, host, port, sips=request_uri.strip().lower().startswith("sips:"))


def tls_via(host: str, port: int, branch: str) -> str:
    """Our Via for a request sent over TLS (§18.1.1, §26.2.1): ``SIP/2.0/TLS host:port;branch=...;rport``."""
    if not branch.startswith("z9hG4bK"):
        raise ValueError("an RFC 3261 branch starts with z9hG4bK")
    return f"SIP/2.0/TLS {_host_port(host, port)};branch={branch};rport"
