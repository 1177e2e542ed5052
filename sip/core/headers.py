"""SIP header fields (RFC 3261 §7.3, §20, §25): their names, the `Headers` list and the grammar of the header
values the stack reads. No I/O, no clock.

- `Headers`: an immutable, ordered header list with case-insensitive names; compact forms (``i``, ``m``, ``v``,
  ...) become canonical names on the way in (`canonical_name`). `get` returns the first field whole, `get_all`
  every field, split at top-level commas (`split_list`) for list headers (Via, Contact, Route, Allow, ...), never
  for the others (WWW-Authenticate, Authorization, Date, From, ... and any header this module does not know).
- Header values: `Via`/`parse_via` (§20.42), `NameAddr`/`parse_name_addr` (§20.10: From, To, Contact, Route,
  Record-Route, Refer-To, ...) and `parse_cseq` (§20.16).
- The pieces of the §25 grammar that the message parser (sip.core.message) shares: `TOKEN_RE`, `CSEQ_RE` and
  `LINE_BREAK_RE`; and `bounded_int`, the reader of a peer's digits that the stream framer (sip.core.framing)
  and the SDP modules (sip.core.sdp, sip.core.sdes) use too.

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
    "Headers",
    "NameAddr",
    "Via",
    "canonical_name",
    "parse_cseq",
    "parse_name_addr",
    "parse_via",
    "split_list",
]

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
TOKEN_RE = re.compile(f"[{_TOKEN_CHARS}]+")
_TOKEN_SET = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~")
# CTLs other than HT are allowed in a header section only as a quoted-pair (``\\`` then the CTL, RFC 4475
# intmeth); a CR or LF in a value could start a new header line, so `Headers` refuses those.
_BAD_CTL_RE = re.compile(r"(?<!\\)[\x00-\x08\x0a-\x1f\x7f]")
LINE_BREAK_RE = re.compile(r"[\r\n]")
_URI_BAD_RE = re.compile(r'[\x00- <>"\x7f-\U0010ffff]')  # never in a URI (escape them)
CSEQ_RE = re.compile(rf"\s*([0-9]+)\s+([{_TOKEN_CHARS}]+)\s*")
_MAX_CSEQ = 2**31  # §8.1.1.5: the sequence number MUST be less than 2**31


def bounded_int(text: str, max_digits: int) -> int | None:
    """The value of 1 to `max_digits` ASCII digits, else None (no int() of a 5000-digit or a '²' string)."""
    if not 0 < len(text) <= max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)


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
            if not name or not TOKEN_RE.fullmatch(name):
                raise ValueError(f"bad header name {name!r}")
            if LINE_BREAK_RE.search(value) or _BAD_CTL_RE.search(value):
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
        return bounded_int(value, 5) if value else None

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
    match = CSEQ_RE.fullmatch(value)
    if not match:
        raise ValueError(f"bad CSeq {value!r}")
    number = bounded_int(match.group(1), 12)
    if number is None or number >= _MAX_CSEQ:
        raise ValueError("CSeq number too large")
    return number, match.group(2)
