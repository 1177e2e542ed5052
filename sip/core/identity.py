"""A call's identity from its INVITE: the called number and the headers an application routes on.

Pure functions, shared by every SIP engine. An engine that parses SIP itself hands `call_identity` the
Request-URI, From, To, Call-ID, the source address and the header fields it parsed; one that only exposes
the INVITE's text (pjsua2's `rdata.wholeMsg`) gets the Request-URI and the header fields from `parse_head`.
Peer input never raises here: what cannot be read becomes "" or no header.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import unquote

from sip.core.app_headers import DEFAULT_POLICY, AppHeaders, HeaderPolicy, select_headers, trusted_caller
from sip.leg import CallIdentity

Headers = tuple[tuple[str, str], ...]


def request_user(request_uri: str) -> str:
    """The user part of a sip:/sips: URI (RFC 3261 §19.1: the userinfo before "@", without a password,
    %-escapes decoded), or the number of a tel: URI (RFC 3966, before any parameter); "" when there is none."""
    scheme, sep, rest = request_uri.strip().partition(":")
    if not sep:
        return ""
    scheme = scheme.lower()
    if scheme == "tel":
        return unquote(rest.split(";", 1)[0].strip())
    if scheme not in ("sip", "sips") or "@" not in rest:
        return ""
    userinfo = rest.split("@", 1)[0]
    return unquote(userinfo.split(":", 1)[0])


def parse_head(message: str) -> tuple[str, Headers]:
    """The Request-URI and the header fields (unfolded, in order) of a SIP request's text.

    Stops at the blank line before the body; a request line that is not `METHOD URI SIP/2.0` gives "" for the
    URI, and a line without a colon is skipped."""
    head = message.split("\r\n\r\n", 1)[0].split("\n\n", 1)[0]
    lines = head.replace("\r\n", "\n").split("\n")
    parts = lines[0].split() if lines else []
    uri = parts[1] if len(parts) == 3 and parts[2].upper().startswith("SIP/") else ""
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and headers:  # folded continuation (RFC 3261 §7.3.1)
            name, value = headers[-1]
            headers[-1] = (name, f"{value} {line.strip()}")
        elif ":" in line:
            name, value = line.split(":", 1)
            headers.append((name.strip(), value.strip()))
    return uri, tuple(headers)


def call_identity(
    call_id: str,
    *,
    request_uri: str,
    from_uri: str,
    to_uri: str,
    sip_call_id: str,
    source: str,
    headers: Headers = (),
    direction: Literal["inbound", "outbound"] = "inbound",
    trunk: str | None = None,
    header_policy: HeaderPolicy = DEFAULT_POLICY,
    trust_identity_headers: bool = False,
) -> CallIdentity:
    """The `CallIdentity` of an incoming INVITE; `call_id` is the engine's id for the call (unique in the
    process), `source` the "host:port" the INVITE came from, `trunk` the name of the trunk it matched.
    `header_policy` picks what the application sees of `headers`, `trust_identity_headers` (the trunk's) whether
    P-Asserted-Identity and Diversion give the caller ID (sip/core/app_headers.py)."""
    app = select_headers(headers, header_policy) if direction == "inbound" else AppHeaders()
    trusted = trust_identity_headers and direction == "inbound"
    caller, diverted_from = trusted_caller(from_uri, headers, trusted=trusted, user_of=request_user)
    return CallIdentity(
        call_id=call_id,
        sip_call_id=sip_call_id,
        from_uri=from_uri,
        to_uri=to_uri,
        request_user=request_user(request_uri),
        source=source,
        headers=headers,
        direction=direction,
        trunk=trunk,
        sip_headers=app.headers,
        headers_dropped=app.dropped,
        headers_cut=app.cut,
        caller=caller,
        diverted_from=diverted_from,
        identity_trusted=trusted,
    )
