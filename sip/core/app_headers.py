"""The inbound SIP headers an application sees, and the caller ID it may trust; sans-I/O, pure, never raises.

Allowlist: an INVITE's header fields reach the application (`CallIdentity.sip_headers`, the webhook's `call`,
the call record and the CDR) only when their name is on the allowlist, `[inbound] sip_headers` (`--sip-header`).
The default, `DEFAULT_ALLOW`, is what call-flow builders and carriers put there for the far end: every `X-*`
header (customer id, queue, language), P-Asserted-Identity (RFC 3325), Diversion (RFC 5806) and History-Info
(RFC 7044). A name ending in `*` is a prefix (case-insensitive, as SIP header names are); any other is the
whole name. Authorization and Proxy-Authorization are never passed, whatever the allowlist says: they carry
credentials (the configuration refuses them too), and nothing here is logged.

Bounds (peer input, whatever it says): at most `MAX_HEADERS` (32) fields, the first ones in the INVITE's order;
the rest are dropped and counted (`dropped`). A value is cleaned, then cut at `MAX_VALUE` (1,024) characters and
counted (`cut`): a carrier's longest real values (History-Info chains, PAI pairs) stay well under it, while a
hostile kilobyte-per-field INVITE cannot fill every record and webhook. A name longer than `MAX_NAME` (64) is
dropped and counted. Cleaning: the parser has already unfolded continuation lines (RFC 3261 §7.3.1), so no CR or
LF remains; all the same, a tab or a CR/LF becomes one space, and any other character that is not printable
(C0/C1 controls, DEL, Unicode line and paragraph separators, bidirectional overrides) is dropped, so a value
cannot forge a line of a log, a CDR reader or a template.

Trust: P-Asserted-Identity and Diversion are only as true as the network that wrote them: anyone who reaches
the port can write either. So they change the call's caller ID only on a trunk marked
`trust_identity_headers` (`--trust-identity-headers`), a carrier or an SBC that strips and sets them
(RFC 3325 §2's trust domain). There, `caller` is the first P-Asserted-Identity's number (its user part, or a
tel: URI's number) and `diverted_from` the first Diversion's (the number the caller dialled before the call
was forwarded to us). Elsewhere (an untrusted trunk, no trunk at all) `caller` is From's number and
`diverted_from` is "": the headers still reach the application, in `sip_headers`, as claims, and
`identity_trusted` says which rule gave `caller`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sip.core.headers import parse_name_addr

__all__ = [
    "DEFAULT_ALLOW",
    "DEFAULT_POLICY",
    "MAX_HEADERS",
    "MAX_NAME",
    "MAX_VALUE",
    "NEVER_PASSED",
    "AppHeaders",
    "HeaderPolicy",
    "allowed",
    "clean_value",
    "number_of",
    "select_headers",
    "trusted_caller",
]

Headers = tuple[tuple[str, str], ...]

DEFAULT_ALLOW: tuple[str, ...] = ("X-*", "P-Asserted-Identity", "Diversion", "History-Info")
MAX_HEADERS = 32
MAX_VALUE = 1024
MAX_NAME = 64
NEVER_PASSED = frozenset({"authorization", "proxy-authorization"})


@dataclass(frozen=True, slots=True)
class HeaderPolicy:
    """Which inbound headers the application sees, and how many and how long (module docstring)."""

    allow: tuple[str, ...] = DEFAULT_ALLOW
    max_headers: int = MAX_HEADERS
    max_value: int = MAX_VALUE


DEFAULT_POLICY = HeaderPolicy()


@dataclass(frozen=True, slots=True)
class AppHeaders:
    headers: Headers = ()
    dropped: int = 0  # allowlisted fields past max_headers, or with a name over MAX_NAME
    cut: int = 0  # values cut at max_value


def allowed(name: str, allow: tuple[str, ...]) -> bool:
    """Whether header `name` is on `allow` (a trailing `*` is a prefix), credentials never."""
    lowered = name.lower()
    if lowered in NEVER_PASSED:
        return False
    for entry in allow:
        pattern = entry.lower()
        if pattern.endswith("*"):
            if lowered.startswith(pattern[:-1]):
                return True
        elif lowered == pattern:
            return True
    return False


def clean_value(value: str) -> str:
    """`value` with tabs, CR and LF as one space each and every other non-printable character dropped."""
    if value.isprintable():
        return value.strip()
    out = []
    for ch in value.replace("\r\n", "\n"):
        if ch in "\t\r\n":
            out.append(" ")
        elif ch.isprintable():
            out.append(ch)
    return "".join(out).strip()


def select_headers(headers: Headers, policy: HeaderPolicy = DEFAULT_POLICY) -> AppHeaders:
    """The allowlisted fields of `headers`, in order, cleaned and bounded (module docstring)."""
    kept: list[tuple[str, str]] = []
    dropped = cut = 0
    for name, value in headers:
        if not allowed(name, policy.allow):
            continue
        if len(kept) >= policy.max_headers or len(name) > MAX_NAME:
            dropped += 1
            continue
        text = clean_value(value)
        if len(text) > policy.max_value:
            text = text[: policy.max_value]
            cut += 1
        kept.append((name, text))
    return AppHeaders(tuple(kept), dropped, cut)


def number_of(value: str, user_of: Callable[[str], str]) -> str:
    """The number (by `user_of`, sip.core.identity.request_user: a sip:/sips: URI's user part, a tel: URI's
    number) of a name-addr or addr-spec field value such as From's, P-Asserted-Identity's or Diversion's; the
    first of a comma-separated list; "" when there is none."""
    uri = ""
    for text in (value, value.split(",", 1)[0]):
        try:
            uri = parse_name_addr(text).uri
            break
        except ValueError:
            continue
    return clean_value(user_of(uri))[:MAX_NAME]


def trusted_caller(
    from_uri: str, headers: Headers, *, trusted: bool, user_of: Callable[[str], str]
) -> tuple[str, str]:
    """(`caller`, `diverted_from`) by the trust rule of the module docstring."""
    own = number_of(from_uri, user_of)
    if not trusted:
        return own, ""

    def first(name: str) -> str:
        return next((number_of(v, user_of) for k, v in headers if k.lower() == name), "")

    return first("p-asserted-identity") or own, first("diversion")
