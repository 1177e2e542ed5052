"""SIP messages (RFC 3261 §7, §8.2, §25): parse, hold and serialise a request or a response. No I/O, no clock.

The public surface:
- `Request`, `Response` (frozen dataclasses, their `Headers` from sip.core.headers) and
  `Message = Request | Response`.
- `parse(data)` for one datagram (or one message framed off a stream by sip.core.framing): returns a message
  or raises `ParseError`, never anything else. A `ParseError` carries the status the request deserves (400,
  505 bad version, 513 too large), a reason naming the header at fault ("Bad CSeq header") and, for a request
  whose Via, From, To, Call-ID and CSeq could be read, the request as far as it was parsed (`partial`) so that
  the caller can answer it (never answer an ACK). With no `partial` the datagram is just dropped and counted.
- `serialize(message)`: the wire form; Content-Length is always computed from the body (a parsed message
  holds no Content-Length header: it is framing, and the body is the truth).
- `make_response` (§8.2.6), `reason_phrase`, and `check_request` (the application-level checks of §8.2 that a
  parser cannot make: 405, 416, 420, 415, 406, malformed branch), which returns a `Rejection` or None.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sip.core.headers import (
    CSEQ_RE,
    LINE_BREAK_RE,
    TOKEN_RE,
    Headers,
    bounded_int,
    canonical_name,
    parse_cseq,
    parse_name_addr,
    parse_via,
    split_list,
)
from sip.core.uri import parse_uri, uri_scheme

__all__ = [
    "KNOWN_METHODS",
    "MAX_MESSAGE_SIZE",
    "Message",
    "ParseError",
    "Rejection",
    "Request",
    "Response",
    "check_request",
    "make_response",
    "parse",
    "reason_phrase",
    "serialize",
]

MAX_MESSAGE_SIZE = 65_535

# A header line at fault: a CTL other than HT outside a quoted-pair (RFC 4475 intmeth), a CR or LF, or bytes
# that are not UTF-8.
_BAD_LINE_RE = re.compile(r"(?<!\\)[\x00-\x08\x0a-\x1f\x7f]|[\r\n\udc80-\udcff]")
_BAD_START_RE = re.compile(r"[\x00-\x1f\x7f\udc80-\udcff]")
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


def reason_phrase(status: int) -> str:
    """The usual reason phrase for a status code (RFC 3261 §21 and extensions), or one for its class."""
    return REASONS.get(status) or _CLASS_REASONS.get(status // 100, "Unknown")


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
    if LINE_BREAK_RE.search(start):
        raise ValueError(f"CR or LF in the start line {start!r}")
    lines = [start]
    lines.extend(f"{name}: {value}" for name, value in message.headers.items() if name != "Content-Length")
    lines.append(f"Content-Length: {len(message.body)}")
    lines.append("")
    lines.append("")
    return "\r\n".join(lines).encode("utf-8") + message.body


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
            if len(pieces) >= 2 and TOKEN_RE.fullmatch(pieces[0]):
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
        if bad is None and not TOKEN_RE.fullmatch(name):
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
    if not TOKEN_RE.fullmatch(method):
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
    number = bounded_int(code, 3)
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
    return _CALL_ID_RE.fullmatch(call_id) is not None and CSEQ_RE.fullmatch(cseq) is not None


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
    hops = None if max_forwards is None else bounded_int(max_forwards, 10)
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
    length = bounded_int(lengths[0], 10)
    if length is None:
        raise _Bad(400, "Bad Content-Length header")
    if length > len(body):
        raise _Bad(400, "Bad Content-Length header: larger than the body")
    return body[:length]


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
