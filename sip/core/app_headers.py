"""The SIP headers an application sees (inbound) and sets (outbound), and the caller ID it may trust; sans-I/O,
pure. Peer input never raises; the application's own headers are refused with `HeaderRefused` (a ValueError).

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

Outbound (`check_app_headers`): the headers the application sets on the BYE (`LiveCall.hang_up`), on the REFER
of a cold transfer (`LiveCall.transfer`) and on the INVITE of a call it places (`Server.dial`, `POST /calls`).
Each becomes one line of a request the bridge sends to a trunk, so each is checked where the application
passes it, and a bad one is refused (`HeaderRefused`, naming the header and showing at most
`SHOWN_VALUE` characters of the bad value, escaped), never dropped or repaired:
- the name is an RFC 3261 §25.1 token (letters, digits and `-.!%*_+`'~`: no colon, space, CR or LF) of at most
  `MAX_NAME` (64) characters, and not one the stack owns, in any case (`STACK_OWNED`): the dialog's and the
  transaction's (Via, From, To, Call-ID, CSeq, Contact, Max-Forwards, Route, Record-Route), the body's
  (Content-*, MIME-Version), the credentials' (Authorization, Proxy-Authorization, the challenges,
  Authentication-Info), the extensions the stack negotiates (Supported, Require, Proxy-Require, Unsupported,
  Allow, Allow-Events, Session-Expires, Min-SE, RSeq, RAck, Security-*), the REFER's and its subscription's
  (Refer-To, Referred-By, Refer-Sub, Replaces, Join, Target-Dialog, Event, Subscription-State, Expires) and
  the product it names (User-Agent, Server). A second copy of any of these would break the dialog, the
  transaction or the transfer, or claim what the stack does not do. Names of one or two characters are
  refused too: the compact forms are one letter (§7.3.3; `f` is From), `To` is owned and `X-` alone names
  nothing. Everything else may be set: X-* (the private headers PBXs and call-flow builders read),
  P-Asserted-Identity, Identity, Diversion, History-Info, Privacy, Reason (RFC 3326, the cause on a BYE),
  User-to-User (RFC 7433, on the REFER and the BYE), ...;
- the value has no CR, LF, NUL or other control character (tab is allowed; C0, DEL, C1, Unicode line and
  paragraph separators and format characters such as bidirectional overrides are not), so it cannot start
  a header or the body of its own (injection) nor fold onto a continuation line; it is UTF-8 on the wire
  (§25.1 TEXT-UTF8), leading and trailing blanks are trimmed (§7.3.1: they are not part of the value);
- bounded: at most `MAX_SET_HEADERS` (16) headers, `MAX_SET_VALUE` (1,024) bytes a value (an Identity
  PASSporT is a few hundred; the inbound bound is the same) and `MAX_SET_TOTAL` (2,048) bytes in all,
  counted as written (name, ": ", value, CRLF): a UDP request must stay near the path MTU (§18.1.1), and
  what the application adds should not be most of it.
They go in the order given, after the stack's own headers. A CANCEL and an ACK carry none: a CANCEL copies the
INVITE's Request-URI, Call-ID, To, From and CSeq number (RFC 3261 §9.1) and the ACK for a non-2xx is its
transaction's (§17.1.1.3); a call not answered yet is ended by its final response or a CANCEL, not a BYE, so
`hang_up`'s headers are sent only on a BYE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sip.core.headers import TOKEN_RE, parse_name_addr

__all__ = [
    "DEFAULT_ALLOW",
    "DEFAULT_POLICY",
    "MAX_HEADERS",
    "MAX_NAME",
    "MAX_VALUE",
    "MAX_SET_HEADERS",
    "MAX_SET_TOTAL",
    "MAX_SET_VALUE",
    "NEVER_PASSED",
    "STACK_OWNED",
    "AppHeaders",
    "HeaderPolicy",
    "HeaderRefused",
    "allowed",
    "check_app_headers",
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
# outbound: what the application may set (module docstring)
MAX_SET_HEADERS = 16
MAX_SET_VALUE = 1024  # bytes of UTF-8
MAX_SET_TOTAL = 2048  # bytes as written: name, ": ", value, CRLF, summed
SHOWN_VALUE = 24  # characters of a refused value quoted in the error
STACK_OWNED = frozenset(
    name.lower()
    for name in (
        "Via",
        "From",
        "To",
        "Call-ID",
        "CSeq",
        "Contact",
        "Max-Forwards",
        "Route",
        "Record-Route",
        "MIME-Version",
        "Authorization",
        "Proxy-Authorization",
        "WWW-Authenticate",
        "Proxy-Authenticate",
        "Authentication-Info",
        "Proxy-Authentication-Info",
        "Supported",
        "Require",
        "Proxy-Require",
        "Unsupported",
        "Allow",
        "Allow-Events",
        "Session-Expires",
        "Min-SE",
        "RSeq",
        "RAck",
        "Refer-To",
        "Referred-By",
        "Refer-Sub",
        "Replaces",
        "Join",
        "Target-Dialog",
        "Event",
        "Subscription-State",
        "Expires",
        "User-Agent",
        "Server",
    )
)
# the body's (Content-Type, Content-Length, ...) and RFC 3329's (Security-Client, -Server, -Verify)
OWNED_PREFIXES = ("content-", "security-")


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


class HeaderRefused(ValueError):
    """A header the application asked to set breaks a rule of the module docstring; `name` is its name
    (bounded). Nothing was sent."""

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        super().__init__(f"header {name!r}: {why}" if name else f"headers: {why}")


def _shown(value: str) -> str:
    """A bounded, escaped prefix of a refused value (safe to log: repr escapes CR, LF and controls)."""
    return repr(value[:SHOWN_VALUE]) + ("..." if len(value) > SHOWN_VALUE else "")


def _value_ok(value: str) -> bool:
    return value.isprintable() or all(ch == "\t" or ch.isprintable() for ch in value)


def check_app_headers(headers: object) -> tuple[tuple[str, str], ...]:
    """The headers the application sets on a request, as (name, value) pairs in order, values trimmed;
    `HeaderRefused` (a ValueError) for the first that breaks a rule of the module docstring, or for too many
    or too long in all. Takes a mapping or a sequence of (name, value) pairs."""
    if isinstance(headers, Mapping):
        pairs: list[tuple[object, ...]] = list(headers.items())
    elif isinstance(headers, (list, tuple)):
        pairs = [tuple(p) if isinstance(p, (list, tuple)) else (p,) for p in headers]
    else:
        raise HeaderRefused("", "a mapping of name to value, or (name, value) pairs")
    if len(pairs) > MAX_SET_HEADERS:
        raise HeaderRefused("", f"at most {MAX_SET_HEADERS}, got {len(pairs)}")
    out: list[tuple[str, str]] = []
    total = 0
    for pair in pairs:
        if len(pair) != 2 or not isinstance(pair[0], str) or not isinstance(pair[1], str):
            raise HeaderRefused("", "each is a name and a value, both strings")
        name, value = pair[0][: MAX_NAME + 1], pair[1]
        if len(name) > MAX_NAME or not TOKEN_RE.fullmatch(name):
            raise HeaderRefused(
                name[:MAX_NAME], f"the name is not a token (RFC 3261 §25.1) of 1 to {MAX_NAME} characters"
            )
        lowered = name.lower()
        if len(name) < 3 or lowered in STACK_OWNED or lowered.startswith(OWNED_PREFIXES):
            raise HeaderRefused(
                name, "may not be set: the SIP stack owns it (a compact form, or one it writes)"
            )
        if not _value_ok(value):
            raise HeaderRefused(
                name, f"CR, LF, NUL and control characters are not allowed in a value ({_shown(value)})"
            )
        value = value.strip(" \t")
        size = len(value.encode())
        if size > MAX_SET_VALUE:
            raise HeaderRefused(name, f"the value is over {MAX_SET_VALUE} bytes ({size}: {_shown(value)})")
        total += len(name) + 2 + size + 2
        if total > MAX_SET_TOTAL:
            raise HeaderRefused(name, f"the headers are over {MAX_SET_TOTAL} bytes in all")
        out.append((name, value))
    return tuple(out)
