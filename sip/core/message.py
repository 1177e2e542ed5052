"""SIP messages (RFC 3261 §7, §20, §25): parse, frame, hold and serialise. No I/O, no clock.

The public surface:
- `Headers`: an immutable, ordered header list with case-insensitive names; compact forms (``i``, ``m``, ``v``,
  ...) become canonical names on the way in. `get` returns the first field whole, `get_all` every field, split
  at top-level commas for list headers (Via, Contact, Route, Allow, ...), never for the others
  (WWW-Authenticate, Authorization, Date, From, ... and any header this module does not know).
- `Request`, `Response` (frozen dataclasses) and `Message = Request | Response`.
- `parse(data)` for one datagram: returns a message or raises `ParseError`, never anything else. A
  `ParseError` carries the status the request deserves (400, 505 bad version, 513 too large), a reason naming
  the header at fault ("Bad CSeq header") and, for a request whose Via, From, To, Call-ID and CSeq could be
  read, the request as far as it was parsed (`partial`) so that the caller can answer it (never answer an
  ACK). With no `partial` the datagram is just dropped and counted.
- `StreamFramer` for TCP/TLS (§18.3): bytes in, messages (or errors) out, framed by Content-Length.
  `is_keepalive(datagram)` tells a CRLF keep-alive on UDP from a message.
- `serialize(message)`: the wire form; Content-Length is always computed from the body (a parsed message
  holds no Content-Length header: it is framing, and the body is the truth).
- Header value helpers: `Via`/`parse_via`, `NameAddr`/`parse_name_addr`, `parse_cseq`, `make_response`
  (§8.2.6), and `check_request` (the application-level checks of §8.2 that a parser cannot make: 405, 416,
  420, 415, 406, malformed branch), which returns a `Rejection` or None.

Header values are stored as received after unfolding (a CRLF followed by white space becomes one space, §7.3.1)
and stripping; the helpers tolerate the LWS the grammar allows around ``/``, ``;``, ``=`` and ``:``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from sip.core.uri import SipUri, parse_uri, uri_scheme

__all__ = [
    "KNOWN_METHODS",
    "MAX_MESSAGE_SIZE",
    "Headers",
    "Message",
    "NameAddr",
    "ParseError",
    "Rejection",
    "Request",
    "Response",
    "StreamFramer",
    "Via",
    "check_request",
    "is_keepalive",
    "make_response",
    "parse",
    "parse_cseq",
    "parse_name_addr",
    "parse_via",
    "reason_phrase",
    "serialize",
]

MAX_MESSAGE_SIZE = 65_535

# RFC 3261 §7.3.3 and the extensions' compact forms.
_COMPACT = {
    "i": "Call-ID",
    "m": "Contact",
    "f": "From",
    "t": "To",
    "v": "Via",
    "l": "Content-Length",
    "c": "Content-Type",
    "e": "Content-Encoding",
    "s": "Subject",
    "k": "Supported",
    "o": "Event",
    "r": "Refer-To",
    "b": "Referred-By",
    "u": "Allow-Events",
    "x": "Session-Expires",
    "a": "Accept-Contact",
    "j": "Reject-Contact",
    "d": "Request-Disposition",
    "y": "Identity",
    "n": "Identity-Info",
}
_KNOWN = (
    "Accept Accept-Contact Accept-Encoding Accept-Language Alert-Info Allow Allow-Events Authentication-Info "
    "Authorization Call-ID Call-Info Contact Content-Disposition Content-Encoding Content-Language "
    "Content-Length Content-Type CSeq Date Diversion Error-Info Event Expires From History-Info Identity "
    "Identity-Info In-Reply-To Max-Forwards Min-Expires Min-SE MIME-Version Organization P-Asserted-Identity "
    "P-Preferred-Identity Path Priority Privacy Proxy-Authenticate Proxy-Authorization Proxy-Require RAck "
    "Reason Record-Route Refer-To Referred-By Reject-Contact Replaces Reply-To Request-Disposition Require "
    "Retry-After Route RSeq Security-Client Security-Server Security-Verify Server Service-Route "
    "Session-Expires Subject Subscription-State Supported Timestamp To Unsupported User-Agent Via Warning "
    "WWW-Authenticate"
).split()
_CANONICAL = {name.lower(): name for name in _KNOWN} | {k: v for k, v in _COMPACT.items()}
# Headers whose grammar is a comma-separated list (RFC 3261 §7.3.1: only these may be split or combined).
_LIST_HEADERS = frozenset(
    name.lower()
    for name in (
        "Accept Accept-Contact Accept-Encoding Accept-Language Alert-Info Allow Allow-Events Call-Info Contact "
        "Content-Encoding Content-Language Diversion Error-Info History-Info In-Reply-To P-Asserted-Identity "
        "P-Preferred-Identity Path Proxy-Require Reason Record-Route Reject-Contact Request-Disposition Require "
        "Route Security-Client Security-Server Security-Verify Service-Route Supported Unsupported Via Warning"
    ).split()
)

_TOKEN_CHARS = "A-Za-z0-9.!%*_+`'~-"
_TOKEN_RE = re.compile(f"[{_TOKEN_CHARS}]+")
_TOKEN_SET = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~")
# CTLs other than HT are allowed in a header section only as a quoted-pair (``\\`` then the CTL, RFC 4475
# intmeth); a CR or LF in a value could start a new header line, so `Headers` refuses those.
_BAD_CTL_RE = re.compile(r"(?<!\\)[\x00-\x08\x0a-\x1f\x7f]")
_LINE_BREAK_RE = re.compile(r"[\r\n]")
_BAD_LINE_RE = re.compile(r"(?<!\\)[\x00-\x08\x0a-\x1f\x7f]|[\r\n\udc80-\udcff]")  # + undecodable bytes
_BAD_START_RE = re.compile(r"[\x00-\x1f\x7f\udc80-\udcff]")
_URI_BAD_RE = re.compile(r'[\x00- <>"\x7f-\U0010ffff]')  # never in a URI (escape them)
_CSEQ_RE = re.compile(rf"\s*([0-9]+)\s+([{_TOKEN_CHARS}]+)\s*")
# Call-ID = word [ "@" word ]; word = 1*(alphanum / "-" / "." / "!" / "%" / "*" / "_" / "+" / "`" / "'" / "~" /
# "(" / ")" / "<" / ">" / ":" / "\" / DQUOTE / "/" / "[" / "]" / "?" / "{" / "}")
_WORD = r"[A-Za-z0-9\-.!%*_+`'~()<>:\\\"/\[\]?{}]+"
_CALL_ID_RE = re.compile(f"{_WORD}(?:@{_WORD})?")
# rfc1123-date = wkday "," SP date1 SP time SP "GMT" (RFC 3261 §20.17)
_DATE_RE = re.compile(
    r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-9]{2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [0-9]{4} "
    r"[0-9]{2}:[0-9]{2}:[0-9]{2} GMT"
)
_VERSION_RE = re.compile(r"SIP/[0-9]+\.[0-9]+", re.IGNORECASE)
_MAX_CSEQ = 2**31  # §8.1.1.5: the sequence number MUST be less than 2**31

REASONS: dict[int, str] = {
    100: "Trying",
    180: "Ringing",
    181: "Call Is Being Forwarded",
    182: "Queued",
    183: "Session Progress",
    199: "Early Dialog Terminated",
    200: "OK",
    202: "Accepted",
    204: "No Notification",
    300: "Multiple Choices",
    301: "Moved Permanently",
    302: "Moved Temporarily",
    305: "Use Proxy",
    380: "Alternative Service",
    400: "Bad Request",
    401: "Unauthorized",
    402: "Payment Required",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    410: "Gone",
    413: "Request Entity Too Large",
    414: "Request-URI Too Long",
    415: "Unsupported Media Type",
    416: "Unsupported URI Scheme",
    420: "Bad Extension",
    421: "Extension Required",
    422: "Session Interval Too Small",
    423: "Interval Too Brief",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    482: "Loop Detected",
    483: "Too Many Hops",
    484: "Address Incomplete",
    485: "Ambiguous",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    489: "Bad Event",
    491: "Request Pending",
    493: "Undecipherable",
    500: "Server Internal Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Server Time-out",
    505: "Version Not Supported",
    513: "Message Too Large",
    580: "Precondition Failure",
    600: "Busy Everywhere",
    603: "Decline",
    604: "Does Not Exist Anywhere",
    606: "Not Acceptable",
}
_CLASS_REASONS = {
    1: "Trying",
    2: "OK",
    3: "Redirect",
    4: "Client Error",
    5: "Server Error",
    6: "Global Failure",
}


def _number(text: str, max_digits: int) -> int | None:
    """The value of 1 to `max_digits` ASCII digits, else None (no int() of a 5000-digit or a '²' string)."""
    if not 0 < len(text) <= max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def reason_phrase(status: int) -> str:
    """The usual reason phrase for a status code (RFC 3261 §21 and extensions), or one for its class."""
    return REASONS.get(status) or _CLASS_REASONS.get(status // 100, "Unknown")


def canonical_name(name: str) -> str:
    """The canonical spelling of a header name: compact forms expanded, known names spelled as in the RFCs,
    unknown names kept as given."""
    return _CANONICAL.get(name.lower(), name)


# --- Headers ------------------------------------------------------------------------------------------------


class Headers:
    """An immutable, ordered list of header fields with case-insensitive names.

    Names are stored canonically (`canonical_name`: ``v`` → ``Via``, ``call-id`` → ``Call-ID``); values as
    given, without surrounding white space (as `parse` reads them back). Construction checks that names are
    tokens and that values hold no CR or LF (so a value can never inject a header line) and no other control
    character except as a quoted-pair (so that whatever can be built can be parsed), raising ValueError.
    """

    __slots__ = ("_items", "_index")

    _items: tuple[tuple[str, str], ...]
    _index: dict[str, tuple[int, ...]]

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        normalised: list[tuple[str, str]] = []
        index: dict[str, list[int]] = {}
        for name, value in items:
            if not name or not _TOKEN_RE.fullmatch(name):
                raise ValueError(f"bad header name {name!r}")
            if _LINE_BREAK_RE.search(value) or _BAD_CTL_RE.search(value):
                raise ValueError(f"CR, LF or a control character in the value of header {name!r}")
            canonical = canonical_name(name)
            index.setdefault(canonical.lower(), []).append(len(normalised))
            normalised.append((canonical, value.strip(" \t")))
        self._items = tuple(normalised)
        self._index = {key: tuple(positions) for key, positions in index.items()}

    @classmethod
    def _trusted(cls, items: list[tuple[str, str]]) -> Headers:
        """Build from items already checked and canonical (the parser's fast path)."""
        headers = cls.__new__(cls)
        index: dict[str, list[int]] = {}
        for position, (name, _) in enumerate(items):
            index.setdefault(name.lower(), []).append(position)
        headers._items = tuple(items)
        headers._index = {key: tuple(positions) for key, positions in index.items()}
        return headers

    def _key(self, name: str) -> str:
        return canonical_name(name).lower()

    def get(self, name: str) -> str | None:
        """The first field of this name, whole (not split at commas), or None."""
        positions = self._index.get(self._key(name))
        return self._items[positions[0]][1] if positions else None

    def get_fields(self, name: str) -> tuple[str, ...]:
        """Every field of this name as it appeared (one entry per header line), never split."""
        return tuple(self._items[i][1] for i in self._index.get(self._key(name), ()))

    def get_all(self, name: str) -> tuple[str, ...]:
        """Every value of this name in order. For list headers (Via, Contact, Route, Allow, Supported, ...)
        each field is split at top-level commas (outside quotes and ``<...>``) and empty elements are dropped;
        other headers (WWW-Authenticate, Authorization, Date, From, unknown ones, ...) are never split."""
        key = self._key(name)
        fields = (self._items[i][1] for i in self._index.get(key, ()))
        if key not in _LIST_HEADERS:
            return tuple(fields)
        return tuple(element for value in fields for element in split_list(value) if element)

    def items(self) -> tuple[tuple[str, str], ...]:
        """Every (name, value) field in order."""
        return self._items

    def with_header(self, name: str, value: str) -> Headers:
        """A copy with this field appended."""
        return Headers((*self._items, (name, value)))

    def replaced(self, name: str, value: str) -> Headers:
        """A copy in which every field of this name is replaced by one field with this value, at the place of
        the first one (appended if there was none)."""
        key = self._key(name)
        if key not in self._index:
            return self.with_header(name, value)
        out: list[tuple[str, str]] = []
        done = False
        for item in self._items:
            if item[0].lower() == key:
                if not done:
                    out.append((item[0], value))
                    done = True
            else:
                out.append(item)
        return Headers(out)

    def without(self, name: str) -> Headers:
        """A copy without any field of this name."""
        key = self._key(name)
        if key not in self._index:
            return self
        return Headers._trusted([item for item in self._items if item[0].lower() != key])

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._key(name) in self._index

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Headers) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"Headers({list(self._items)!r})"


def split_list(value: str) -> list[str]:
    """Split a header value at commas outside quoted strings and ``<...>``; elements are stripped, and empty
    ones are kept (so that a caller can reject ``a,,b`` where the grammar forbids it)."""
    if "," not in value:
        return [value.strip()]
    parts: list[str] = []
    start = 0
    quoted = False
    escaped = False
    angle = 0
    for position, ch in enumerate(value):
        if quoted:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "<":
            angle += 1
        elif ch == ">":
            angle = max(0, angle - 1)
        elif ch == "," and angle == 0:
            parts.append(value[start:position].strip())
            start = position + 1
    parts.append(value[start:].strip())
    return parts


# --- messages -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """A SIP request. `uri` is the Request-URI as text (any scheme; `sip.core.uri.parse_uri` reads sip/sips/tel)."""

    method: str
    uri: str
    headers: Headers
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Response:
    """A SIP response."""

    status: int
    reason: str
    headers: Headers
    body: bytes = b""


Message = Request | Response


class ParseError(Exception):
    """A message that cannot be accepted: `status` (400; 505 bad version; 513 too large), `reason` (names the
    header at fault), and `partial`: the request as far as it was parsed when Via, From, To, Call-ID and CSeq
    are usable (answer it with `make_response(error.partial, error.status, error.reason)`, unless it is an
    ACK), else None (a response, or a request that cannot be answered: drop it and count it).

    A Request-URI of a scheme other than sip/sips/tel is syntactically valid (RFC 4475 unkscm, novelsc), so it
    is not a ParseError: `check_request` answers it 416."""

    def __init__(self, status: int, reason: str, partial: Request | None = None) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.partial = partial

    def __repr__(self) -> str:
        return f"ParseError({self.status}, {self.reason!r}, partial={'yes' if self.partial else 'no'})"


class _Bad(Exception):
    """Internal: the first fault found, turned into a ParseError once `partial` is known."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def serialize(message: Message) -> bytes:
    """The wire form: start line, the header fields in order (any Content-Length dropped), a Content-Length
    computed from the body, an empty line and the body."""
    if isinstance(message, Request):
        start = f"{message.method} {message.uri} SIP/2.0"
    else:
        start = f"SIP/2.0 {message.status} {message.reason}"
    if _LINE_BREAK_RE.search(start):
        raise ValueError(f"CR or LF in the start line {start!r}")
    lines = [start]
    lines.extend(f"{name}: {value}" for name, value in message.headers.items() if name != "Content-Length")
    lines.append(f"Content-Length: {len(message.body)}")
    lines.append("")
    lines.append("")
    return "\r\n".join(lines).encode("utf-8") + message.body


def is_keepalive(data: bytes) -> bool:
    """True for a datagram of nothing but CR and LF (a NAT keep-alive such as RFC 5626's CRLF): not a message,
    and not an error to count."""
    return bool(data) and not data.strip(b"\r\n")


def parse(data: bytes, *, max_size: int = MAX_MESSAGE_SIZE) -> Message:
    """Parse one SIP message from a datagram (or a framed stream message). Raises only `ParseError`.

    RFC 3261 §7 and §25: CRLFs before the start line are skipped (§7.5); header lines are unfolded; names are
    case-insensitive and compact forms expanded; Content-Length, when present, must be a single number no larger
    than the body, and a longer body is truncated to it (RFC 4475 dblreq); when absent the body is the rest of
    the datagram (§18.3); the returned headers never hold Content-Length (`serialize` computes it, so
    `parse(serialize(m)) == m`). Via, From, To, Call-ID and CSeq must be present and well formed (§8.1.1), From, To,
    Call-ID, CSeq, Max-Forwards and Content-Length at most once (RFC 4475 multi01, mcl01), and the CSeq method
    must be the request's (RFC 4475 mismatch01/02). Max-Forwards may be missing.
    """
    start = 0
    while data.startswith(b"\r\n", start):
        start += 2
    end = data.find(b"\r\n\r\n", start)
    if end < 0:  # no empty line: a 400, but read the headers so that it can be answered
        head_bytes, body = data[start:].removesuffix(b"\r\n"), b""
        missing_blank = True
    else:
        head_bytes, body = data[start:end], data[end + 4 :]
        missing_blank = False
    # Bytes that are not UTF-8 become lone surrogates, which _split_head refuses line by line.
    head = head_bytes.decode("utf-8", "surrogateescape")
    try:
        start_line, items, fault = _split_head(head)
    except _Bad as bad:
        raise ParseError(bad.status, bad.reason) from None
    first: _Bad | None = _Bad(513, "Message Too Large") if len(data) > max_size else None
    is_request = not start_line[:4].upper().startswith("SIP/")
    method = uri = ""
    status, reason = 0, ""
    try:
        if is_request:
            method, uri = _parse_request_line(start_line)
        else:
            status, reason = _parse_status_line(start_line)
    except _Bad as bad:
        first = first or bad
        if is_request:
            pieces = start_line.split()
            if len(pieces) >= 2 and _TOKEN_RE.fullmatch(pieces[0]):
                method, uri = pieces[0], pieces[1]
    # Content-Length is framing, not content: it is checked here and left out of the headers (the body is the
    # truth, and `serialize` writes the length anew).
    lengths = [value for name, value in items if name == "Content-Length"]
    headers = Headers._trusted([item for item in items if item[0] != "Content-Length"] if lengths else items)
    first = first or fault
    if first is None:
        try:
            _check_core(headers, method if is_request else None)
            body = _check_rest(headers, body, lengths)
        except _Bad as bad:
            first = bad
    if first is None and missing_blank:
        first = _Bad(400, "No empty line after the header section")
    if first is not None:
        partial = (
            Request(method, uri, headers, b"") if is_request and method and _answerable(headers) else None
        )
        raise ParseError(first.status, first.reason, partial)
    if is_request:
        return Request(method, uri, headers, body)
    return Response(status, reason, headers, body)


def _split_head(head: str) -> tuple[str, list[tuple[str, str]], _Bad | None]:
    """Start line, the unfolded (canonical name, stripped value) pairs, and the first fault. A line at fault
    (no colon, a bad name, a control character, bytes that are not UTF-8) is left out, so that the others can
    still answer the message; only an empty start line is fatal."""
    lines = head.split("\r\n")
    start_line = lines[0]
    if not start_line or _BAD_START_RE.search(start_line):
        raise _Bad(400, "Bad start line")
    fault: _Bad | None = None
    fields: list[list[str]] = []
    skipping = False  # the continuation lines of a field left out are left out too
    for line in lines[1:]:
        bad = _line_fault(line)
        if line[:1] in (" ", "\t"):
            if skipping:
                continue
            if bad is not None or not fields:
                fault = fault or bad or _Bad(400, "Continuation line before the first header")
                if fields:
                    fields.pop()
                    skipping = True
                continue
            fields[-1].append(line.strip())
            continue
        skipping = False
        colon = line.find(":")
        name = line[:colon].rstrip(" \t") if colon > 0 else ""
        if bad is None and not _TOKEN_RE.fullmatch(name):
            bad = _Bad(400, "Malformed header line")
        if bad is not None:
            fault = fault or bad
            skipping = True
            continue
        fields.append([name, line[colon + 1 :].strip()])
    items: list[tuple[str, str]] = []
    for parts in fields:
        name = canonical_name(parts[0])
        value = " ".join(part for part in parts[1:] if part) if len(parts) > 2 else parts[1]
        items.append((name, value))
    return start_line, items, fault


def _line_fault(line: str) -> _Bad | None:
    if not _BAD_LINE_RE.search(line):
        return None
    if any("\udc80" <= ch <= "\udcff" for ch in line):
        return _Bad(400, "Header section is not UTF-8")
    return _Bad(400, "Control character in the header section")


def _parse_request_line(line: str) -> tuple[str, str]:
    # Request-Line = Method SP Request-URI SP SIP-Version: exactly one SP each, none at the end (RFC 4475
    # lwsstart, trws), no LWS in the URI (lwsruri), no <> (ltgtruri).
    pieces = line.split(" ")
    if len(pieces) != 3 or not all(pieces):
        raise _Bad(400, "Bad Request-Line")
    method, uri, version = pieces
    if not _TOKEN_RE.fullmatch(method):
        raise _Bad(400, "Bad method in Request-Line")
    if version.upper() != "SIP/2.0":
        if _VERSION_RE.fullmatch(version):
            raise _Bad(505, "Version Not Supported")
        raise _Bad(400, "Bad Request-Line")
    _check_request_uri(uri)
    return method, uri


def _check_request_uri(uri: str) -> None:
    scheme = uri_scheme(uri)
    if scheme is None or "\t" in uri or "<" in uri or ">" in uri or '"' in uri:
        raise _Bad(400, "Bad Request-URI")
    if scheme in ("sip", "sips", "tel"):
        try:
            parsed = parse_uri(uri)
        except ValueError:
            raise _Bad(400, "Bad Request-URI") from None
        if parsed.headers:  # RFC 3261 §19.1.1 table 1: no headers in a Request-URI (RFC 4475 escruri)
            raise _Bad(400, "Bad Request-URI: headers not allowed")
    elif not all(32 < ord(ch) < 127 for ch in uri):
        raise _Bad(400, "Bad Request-URI")


def _parse_status_line(line: str) -> tuple[int, str]:
    version, _, rest = line.partition(" ")
    code, _, reason = rest.partition(" ")
    if version.upper() != "SIP/2.0":
        if _VERSION_RE.fullmatch(version):
            raise _Bad(505, "Version Not Supported")
        raise _Bad(400, "Bad Status-Line")
    number = _number(code, 3)
    if len(code) != 3 or number is None or not 100 <= number <= 699:
        raise _Bad(400, "Bad status code")
    return number, reason


def _single(headers: Headers, name: str, *, required: bool = True) -> str | None:
    values = headers.get_fields(name)
    if len(values) > 1:
        raise _Bad(400, f"Multiple {name} headers")
    if not values:
        if required:
            raise _Bad(400, f"Missing {name} header")
        return None
    return values[0]


def _answerable(headers: Headers) -> bool:
    """Whether a response can be built for these headers (§8.2.6): the first Via, From, To, Call-ID and CSeq
    are well formed. (A second From, say, is still a 400, but one that can be sent.)"""
    via, from_, to, call_id, cseq = (headers.get(name) for name in ("Via", "From", "To", "Call-ID", "CSeq"))
    if via is None or from_ is None or to is None or call_id is None or cseq is None:
        return False
    try:
        parse_via(split_list(via)[0])
        parse_name_addr(from_)
        parse_name_addr(to)
    except ValueError:
        return False
    # An overlarge CSeq number (RFC 4475 scalar02) is still copied into the 400 as it came.
    return _CALL_ID_RE.fullmatch(call_id) is not None and _CSEQ_RE.fullmatch(cseq) is not None


_VIA_2_0_RE = re.compile(r"\s*SIP\s*/\s*2\.0\s*/", re.IGNORECASE)


def _check_core(headers: Headers, method: str | None) -> None:
    """§8.1.1 / §8.2: the headers every request and response needs to be answered or matched."""
    vias = headers.get_fields("Via")
    if not vias:
        raise _Bad(400, "Missing Via header")
    for field_value in vias:
        for element in split_list(field_value):
            try:
                parse_via(element)
            except ValueError:
                raise _Bad(400, "Bad Via header") from None
            if not _VIA_2_0_RE.match(element):
                raise _Bad(400, "Bad Via header: not SIP/2.0")
    for name in ("From", "To"):
        value = _single(headers, name)
        assert value is not None
        try:
            parse_name_addr(value)
        except ValueError:
            raise _Bad(400, f"Bad {name} header") from None
    call_id = _single(headers, "Call-ID")
    assert call_id is not None
    if not _CALL_ID_RE.fullmatch(call_id):
        raise _Bad(400, "Bad Call-ID header")
    cseq = _single(headers, "CSeq")
    assert cseq is not None
    try:
        _, cseq_method = parse_cseq(cseq)
    except ValueError:
        raise _Bad(400, "Bad CSeq header") from None
    if method is not None and cseq_method != method:
        raise _Bad(400, "Bad CSeq header: method does not match the Request-Line")


def _check_rest(headers: Headers, body: bytes, lengths: list[str]) -> bytes:
    """The remaining header checks; returns the body cut to Content-Length (`lengths`: its fields)."""
    max_forwards = _single(headers, "Max-Forwards", required=False)
    hops = None if max_forwards is None else _number(max_forwards, 10)
    if max_forwards is not None and (hops is None or hops > 255):
        raise _Bad(400, "Bad Max-Forwards header")
    for value in headers.get_all("Contact"):
        if value == "*":
            continue
        try:
            parse_name_addr(value)
        except ValueError:
            raise _Bad(400, "Bad Contact header") from None
    for name in ("Route", "Record-Route"):
        for value in headers.get_all(name):
            try:
                parse_name_addr(value)
            except ValueError:
                raise _Bad(400, f"Bad {name} header") from None
    date = _single(headers, "Date", required=False)
    if date is not None and not _DATE_RE.fullmatch(date):
        raise _Bad(400, "Bad Date header")  # RFC 4475 baddate: the zone must be GMT
    if not lengths:
        return body
    if len(lengths) > 1:
        raise _Bad(400, "Multiple Content-Length headers")
    length = _number(lengths[0], 10)
    if length is None:
        raise _Bad(400, "Bad Content-Length header")
    if length > len(body):
        raise _Bad(400, "Bad Content-Length header: larger than the body")
    return body[:length]


# --- framing for streams (§18.3) -------------------------------------------------------------------------------


class StreamFramer:
    """Frames SIP messages on a byte stream (TCP, TLS; RFC 3261 §18.3) by Content-Length, which is mandatory.

    `feed(data)` returns the messages (or `ParseError`s) completed by these bytes. CRLFs between messages are
    skipped; each double CRLF among them is a keep-alive ping (RFC 5626 §3.5.1) that the shell should answer
    with a single CRLF: `take_pings()` returns how many arrived since the last call. A header section longer
    than `max_size` (513), or a missing or unusable Content-Length (400), cannot be framed: the error is
    returned, `must_close` becomes True and every later byte is ignored; close the connection. An error in a
    message that *was* framed (say a bad CSeq) leaves the stream usable.
    """

    __slots__ = ("_buffer", "_max_size", "_closed", "_pings", "_crlfs", "_need", "_scanned")

    def __init__(self, *, max_size: int = MAX_MESSAGE_SIZE) -> None:
        self._buffer = bytearray()
        self._max_size = max_size
        self._closed = False
        self._pings = 0
        self._crlfs = 0  # CR LF pairs seen in a row between messages
        self._need = 0  # length of the message being received, once its header section is complete
        self._scanned = 0  # how far the search for the end of the header section got

    @property
    def must_close(self) -> bool:
        """True once the stream cannot be framed any more (the caller should close the connection)."""
        return self._closed

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a message."""
        return len(self._buffer)

    def take_pings(self) -> int:
        """How many double-CRLF keep-alives arrived since the last call."""
        pings, self._pings = self._pings, 0
        return pings

    def feed(self, data: bytes) -> list[Message | ParseError]:
        """Add bytes from the stream; return what they completed, in order."""
        if self._closed:
            return []
        buffer = self._buffer
        buffer += data
        out: list[Message | ParseError] = []
        while buffer:
            if not self._need:
                if not self._skip_crlfs():  # nothing left, or a lone CR waiting for its LF
                    break
                end = buffer.find(b"\r\n\r\n", max(0, self._scanned - 3))
                if end < 0:
                    self._scanned = len(buffer)
                    if len(buffer) > self._max_size:
                        out.append(self._fail(513, "Message Too Large"))
                    break
                self._scanned = self._crlfs = 0
                length = _stream_content_length(bytes(buffer[:end]))
                if isinstance(length, ParseError):
                    out.append(self._fail(length.status, length.reason))
                    break
                self._need = end + 4 + length
                if self._need > self._max_size:
                    out.append(self._fail(513, "Message Too Large"))
                    break
            if len(buffer) < self._need:
                break
            frame = bytes(buffer[: self._need])
            del buffer[: self._need]
            self._need = 0
            try:
                out.append(parse(frame, max_size=self._max_size))
            except ParseError as error:
                out.append(error)
        return out

    def _skip_crlfs(self) -> bool:
        """Drop the CRLFs before a message, counting double-CRLF pings; True if a message seems to start."""
        buffer = self._buffer
        while buffer[:2] == b"\r\n":
            del buffer[:2]
            self._crlfs += 1
            if self._crlfs == 2:
                self._pings += 1
                self._crlfs = 0
        return bool(buffer) and buffer != b"\r"

    def _fail(self, status: int, reason: str, partial: Request | None = None) -> ParseError:
        self._closed = True
        self._buffer.clear()
        return ParseError(status, reason, partial)


def _stream_content_length(head: bytes) -> int | ParseError:
    """Content-Length from a header section, or the error that makes the stream unframeable. The scan is
    loose on purpose: a message with some other bad header is still framed, so that `parse` can answer it."""
    values: list[str] = []
    for line in head.decode("utf-8", "replace").replace("\r\n ", " ").replace("\r\n\t", " ").split("\r\n"):
        name, colon, value = line.partition(":")
        if colon and name.strip().lower() in ("content-length", "l"):
            values.append(value.strip())
    if not values:
        return ParseError(400, "Missing Content-Length header (mandatory on streams)")
    length = _number(values[0], 10) if len(values) == 1 else None
    if length is None:
        return ParseError(400, "Bad Content-Length header")
    return length


# --- header value helpers -------------------------------------------------------------------------------------


Params = tuple[tuple[str, str | None], ...]


def _param(params: Params, name: str) -> str | None:
    lowered = name.lower()
    for key, value in params:
        if key.lower() == lowered:
            return "" if value is None else value
    return None


def _format_params(params: Params) -> str:
    return "".join(f";{name}" if value is None else f";{name}={value}" for name, value in params)


def _parse_params(text: str) -> Params:
    """``*( SEMI generic-param )`` with SWS around ``;`` and ``=``; values are tokens, hosts or quoted strings
    (kept with their quotes). `text` starts at the first ``;`` or is empty."""
    params: list[tuple[str, str | None]] = []
    position, n = 0, len(text)
    while position < n:
        position = _skip_ws(text, position)
        if position >= n:
            break
        if text[position] != ";":
            raise ValueError(f"expected ';' in parameters: {text!r}")
        position = _skip_ws(text, position + 1)
        start = position
        while position < n and text[position] in _TOKEN_SET:
            position += 1
        name = text[start:position]
        if not name:
            raise ValueError(f"empty parameter in {text!r}")
        position = _skip_ws(text, position)
        value: str | None = None
        if position < n and text[position] == "=":
            position = _skip_ws(text, position + 1)
            if position < n and text[position] == '"':
                end = _end_of_quoted(text, position)
                value = text[position:end]
                position = end
            else:
                start = position
                while position < n and (text[position] in _TOKEN_SET or text[position] in "[]:"):
                    position += 1
                value = text[start:position]
                if not value:
                    raise ValueError(f"empty value of parameter {name!r}")
        params.append((name, value))
    return tuple(params)


def _skip_ws(text: str, position: int) -> int:
    n = len(text)
    while position < n and text[position] in " \t":
        position += 1
    return position


def _end_of_quoted(text: str, position: int) -> int:
    """Index just after the quoted string that starts at `position` (a DQUOTE); ValueError if unterminated."""
    i, n = position + 1, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            if i + 1 >= n or text[i + 1] in "\r\n":
                raise ValueError("bad quoted-pair")
            i += 2
            continue
        if ch == '"':
            return i + 1
        i += 1
    raise ValueError("unterminated quoted string")


def _unquote(quoted: str) -> str:
    inner = quoted[1:-1]
    if "\\" not in inner:
        return inner
    return re.sub(r"\\(.)", r"\1", inner, flags=re.DOTALL)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True, slots=True)
class Via:
    """One via-parm (RFC 3261 §20.42): ``SIP/2.0/<transport> host[:port];params``. `host` has no brackets
    (IPv6); `transport` is upper-cased; `params` keep order and spelling (flag parameters have value None)."""

    transport: str
    host: str
    port: int | None = None
    params: Params = field(default=())

    def param(self, name: str) -> str | None:
        """A parameter's value, case-insensitively; "" for a flag, None if absent."""
        return _param(self.params, name)

    @property
    def branch(self) -> str | None:
        """The branch parameter (the transaction id when it starts with ``z9hG4bK``, §8.1.1.7)."""
        return _param(self.params, "branch")

    @property
    def received(self) -> str | None:
        """The ``received`` parameter (§18.2.1), or None."""
        return _param(self.params, "received")

    @property
    def rport(self) -> int | None:
        """The filled-in ``rport`` value (RFC 3581 §4), or None if absent or empty."""
        value = _param(self.params, "rport")
        return _number(value, 5) if value else None

    @property
    def wants_rport(self) -> bool:
        """True if the Via carries an ``rport`` parameter (RFC 3581 §3: the client asks for it)."""
        return _param(self.params, "rport") is not None

    @property
    def sent_by(self) -> str:
        """``host[:port]`` as it appears in the Via (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def with_params(self, *params: tuple[str, str | None]) -> Via:
        """A copy with these parameters set (replacing ones of the same name), e.g. received and rport."""
        names = {name.lower() for name, _ in params}
        kept = tuple(p for p in self.params if p[0].lower() not in names)
        return Via(self.transport, self.host, self.port, kept + params)

    def __str__(self) -> str:
        return f"SIP/2.0/{self.transport} {self.sent_by}{_format_params(self.params)}"


_VIA_HEAD_RE = re.compile(
    rf"\s*([{_TOKEN_CHARS}]+)\s*/\s*([{_TOKEN_CHARS}]+)\s*/\s*([{_TOKEN_CHARS}]+)\s+"
    r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?:\s*:\s*([0-9]{1,5}))?"
)


_VIA_VERSION_RE = re.compile(r"[0-9]+\.[0-9]+")


def parse_via(value: str) -> Via:
    """Parse one via-parm (not a list; split with `Headers.get_all` first). Raises ValueError.

    Any ``SIP/<n>.<m>`` is accepted here so that a request with a foreign version can still be answered 505
    along its Via (RFC 4475 badvers); `parse` refuses a message whose Vias are not SIP/2.0."""
    match = _VIA_HEAD_RE.match(value)
    if not match:
        raise ValueError(f"bad Via: {value!r}")
    protocol, version, transport, host, port_text = match.groups()
    if protocol.upper() != "SIP" or not _VIA_VERSION_RE.fullmatch(version):
        raise ValueError(f"bad Via protocol {protocol}/{version}")
    if host.startswith("["):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError("bad IPv6 reference in Via") from None
    elif host[0] in ".-" or host[-1] == "-" or ".." in host:
        raise ValueError(f"bad Via host {host!r}")
    port = int(port_text) if port_text else None
    if port is not None and port > 65535:
        raise ValueError("bad Via port")
    params = _parse_params(value[match.end() :])
    return Via(transport.upper(), host, port, params)


@dataclass(frozen=True, slots=True)
class NameAddr:
    """From, To, Contact, Route, Record-Route, Refer-To, ...: ``[display] <uri>;params`` (RFC 3261 §20.10).

    `display` is unquoted (None when absent); `uri` is the URI text (any scheme); `params` are the header
    parameters (tag, expires, q, ...), with quoted values kept in their quotes. `__str__` always prints the
    name-addr form with angle brackets, which is always allowed."""

    display: str | None
    uri: str
    params: Params = field(default=())

    def param(self, name: str) -> str | None:
        """A header parameter's value, case-insensitively; "" for a flag, None if absent."""
        return _param(self.params, name)

    @property
    def tag(self) -> str | None:
        """The tag parameter (§19.3), or None."""
        return _param(self.params, "tag")

    @property
    def sip_uri(self) -> SipUri:
        """The URI parsed as sip:/sips:/tel: (ValueError for other schemes)."""
        return parse_uri(self.uri)

    def with_params(self, *params: tuple[str, str | None]) -> NameAddr:
        """A copy with these parameters set (replacing ones of the same name), e.g. a tag."""
        names = {name.lower() for name, _ in params}
        kept = tuple(p for p in self.params if p[0].lower() not in names)
        return NameAddr(self.display, self.uri, kept + params)

    def __str__(self) -> str:
        display = "" if self.display is None else _quote(self.display) + " "
        return f"{display}<{self.uri}>{_format_params(self.params)}"


def parse_name_addr(value: str) -> NameAddr:
    """Parse ``name-addr`` or ``addr-spec`` followed by header parameters. In the addr-spec form everything
    after the first ``;`` is a header parameter (§20.10), and a URI with ``?`` or ``,`` must be in ``<>``
    (RFC 4475 regbadct). Raises ValueError."""
    text = value.strip()
    if not text:
        raise ValueError("empty name-addr")
    display: str | None = None
    position = 0
    if text[0] == '"':
        end = _end_of_quoted(text, 0)
        display = _unquote(text[:end])
        position = _skip_ws(text, end)
        if position >= len(text) or text[position] != "<":
            raise ValueError("quoted display name without <uri>")
    angle = text.find("<", position)
    if angle >= 0 and (display is not None or _looks_like_display(text[:angle])):
        if display is None:
            words = text[:angle].split()
            if words and not all(all(_display_char(ch) for ch in word) for word in words):
                raise ValueError("bad display name (quote it)")  # RFC 4475 baddn: an unquoted comma
            display = " ".join(words) if words else None
        close = text.find(">", angle)
        if close < 0:
            raise ValueError("missing '>'")
        uri = text[angle + 1 : close]
        rest = text[close + 1 :]
    else:
        end = 0
        while end < len(text) and text[end] not in "; \t":
            end += 1
        uri, rest = text[:end], text[end:]
        if "?" in uri or "," in uri or "<" in uri or ">" in uri:
            raise ValueError("an addr-spec with '?' or ',' must be enclosed in <>")
    _check_addr_uri(uri)
    return NameAddr(display, uri, _parse_params(rest))


def _display_char(ch: str) -> bool:
    """A character of an unquoted display name: a token character (§25.1) or, being liberal in what we
    accept from carriers, a non-ASCII letter or a parenthesis (``Jürgen (Büro) <sip:...>``)."""
    return ch in _TOKEN_SET or ch in "()" or (ord(ch) > 127 and ch.isprintable())


def _looks_like_display(prefix: str) -> bool:
    """True if the text before ``<`` can be a (possibly empty) display name and not part of a URI."""
    return ":" not in prefix or prefix.strip() == ""


def _check_addr_uri(uri: str) -> None:
    scheme = uri_scheme(uri)
    if scheme is None or _URI_BAD_RE.search(uri):
        raise ValueError(f"bad URI {uri!r}")
    if scheme in ("sip", "sips", "tel"):
        parse_uri(uri)


def parse_cseq(value: str) -> tuple[int, str]:
    """``CSeq: <number> <method>`` → (number, method); the number must be below 2**31 (§8.1.1.5)."""
    match = _CSEQ_RE.fullmatch(value)
    if not match:
        raise ValueError(f"bad CSeq {value!r}")
    number = _number(match.group(1), 12)
    if number is None or number >= _MAX_CSEQ:
        raise ValueError("CSeq number too large")
    return number, match.group(2)


def make_response(
    request: Request,
    status: int,
    reason: str | None = None,
    *,
    to_tag: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes = b"",
) -> Response:
    """A response to `request` (§8.2.6): copies every Via (in order), From, To (adding `to_tag` if To has no
    tag yet), Call-ID and CSeq, then `headers`; a 100 also copies Timestamp (§8.2.6.1). `reason` defaults to
    the usual phrase."""
    copied: list[tuple[str, str]] = [("Via", value) for value in request.headers.get_fields("Via")]
    from_value = request.headers.get("From")
    if from_value is not None:
        copied.append(("From", from_value))
    to_value = request.headers.get("To")
    if to_value is not None:
        if to_tag is not None:
            to_value = _with_tag(to_value, to_tag)
        copied.append(("To", to_value))
    for name in ("Call-ID", "CSeq"):
        value = request.headers.get(name)
        if value is not None:
            copied.append((name, value))
    if status == 100:
        timestamp = request.headers.get("Timestamp")
        if timestamp is not None:
            copied.append(("Timestamp", timestamp))
    copied.extend(headers)
    return Response(status, reason if reason is not None else reason_phrase(status), Headers(copied), body)


def _with_tag(to_value: str, tag: str) -> str:
    try:
        parsed = parse_name_addr(to_value)
    except ValueError:
        return to_value if ";tag=" in to_value.lower() else f"{to_value};tag={tag}"
    if parsed.tag:
        return to_value
    return f"{to_value};tag={tag}"


# --- application-level checks (§8.2) --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rejection:
    """What `check_request` found: the status and reason to answer with and the headers the answer needs
    (Allow for 405, Unsupported for 420, Accept for 415 and 406)."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...] = ()


_DEFAULT_SCHEMES = frozenset({"sip", "sips", "tel"})
# RFC 3261 and the extensions that define methods (3262, 3265, 3311, 3428, 3515, 3903, 6086).
KNOWN_METHODS = frozenset(
    "INVITE ACK BYE CANCEL OPTIONS REGISTER PRACK SUBSCRIBE NOTIFY PUBLISH INFO REFER MESSAGE UPDATE".split()
)


def check_request(
    request: Request,
    *,
    allowed_methods: Iterable[str] | None = None,
    supported_schemes: Iterable[str] = _DEFAULT_SCHEMES,
    supported_options: Iterable[str] = (),
    accepted_types: Iterable[str] = ("application/sdp",),
    reject_zero_max_forwards: bool = False,
) -> Rejection | None:
    """The UAS checks of RFC 3261 §8.2 that a well-formed request can still fail, in the RFC's order:
    method (405 with Allow for a known method, 501 for an unknown one, when `allowed_methods` is given), Request-URI scheme (416), a Via branch that is
    the bare magic cookie (400, RFC 4475 badbranch), Require (420 with Unsupported; never for ACK or CANCEL),
    the body's Content-Type (415 with Accept) and, for an INVITE, an Accept that excludes SDP (406). None means
    "go ahead". Max-Forwards 0 is not a UAS error (RFC 4475 §3.3.11 zeromf: an endpoint processes the request);
    a proxy answers 483, and so does this check with `reject_zero_max_forwards` (the user agent's rule,
    sip/core/ua.py)."""
    method = request.method
    if allowed_methods is not None:
        allowed = tuple(allowed_methods)
        if method not in allowed:
            # §8.2.1: 405 for a method we know but do not take; §21.5.2: 501 for one we do not know.
            status = 405 if method in KNOWN_METHODS else 501
            return Rejection(status, reason_phrase(status), (("Allow", ", ".join(allowed)),))
    if (
        reject_zero_max_forwards
        and method != "ACK"
        and (request.headers.get("Max-Forwards") or "").strip() == "0"
    ):
        return Rejection(483, reason_phrase(483))
    if uri_scheme(request.uri) not in set(supported_schemes):
        return Rejection(416, reason_phrase(416))
    for value in request.headers.get_all("Via")[:1]:
        try:
            branch = parse_via(value).branch
        except ValueError:
            return Rejection(400, "Bad Via header")
        if branch == "z9hG4bK":
            return Rejection(400, "Bad Via header: branch has no transaction id")
    if method not in ("ACK", "CANCEL"):
        supported = {option.lower() for option in supported_options}
        unsupported = [
            option for option in request.headers.get_all("Require") if option.strip().lower() not in supported
        ]
        if unsupported:
            return Rejection(420, reason_phrase(420), (("Unsupported", ", ".join(unsupported)),))
    types = tuple(accepted_types)
    lowered_types = {t.lower() for t in types}
    if request.body:
        content_type = (request.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        encoding = request.headers.get("Content-Encoding")
        if content_type not in lowered_types or (encoding and encoding.strip().lower() != "identity"):
            return Rejection(415, reason_phrase(415), (("Accept", ", ".join(types)),))
    if method == "INVITE" and "Accept" in request.headers:
        ranges = [v.split(";", 1)[0].strip().lower() for v in request.headers.get_all("Accept")]
        if ranges and not any(r in ("application/sdp", "application/*", "*/*") for r in ranges):
            return Rejection(406, reason_phrase(406), (("Accept", ", ".join(types)),))
    return None
