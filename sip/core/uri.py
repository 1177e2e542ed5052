"""SIP, SIPS and tel URIs (RFC 3261 §19.1 and §25.1, RFC 3966): parse, hold, print. No I/O.

`parse_uri(text)` returns a `SipUri` or raises `ValueError`; `str(uri)` prints it back so that
`parse_uri(str(uri)) == uri` for every URI `parse_uri` accepts.

What is stored, and how:
- `scheme` is lower-cased ("sip", "sips" or "tel"); any other scheme is a `ValueError` (the caller answers a
  request for one with 416, RFC 3261 §8.2.2.1; `uri_scheme` tells the scheme of any absolute URI).
- `user`, `password`, parameter names and values and header names and values are stored *unescaped*
  (RFC 3261 §19.1.2: ``sip:%75ser@host`` has the user ``user``; ``%00`` is a NUL character, RFC 4475 escnull).
  `__str__` escapes again whatever the grammar does not allow unescaped, so the printed form may differ in
  spelling from the parsed text (``%75`` comes back as ``u``) but never in meaning.
- `host` has no brackets: an IPv6 reference ``[2001:db8::1]`` is stored as ``2001:db8::1`` and `__str__` puts
  the brackets back. Host names keep their case (compare them with `str.lower`).
- For a tel URI, `user` holds the telephone number (with its visual separators), `host` is "" and `port` is
  None; ``tel:`` URIs have parameters but no headers.
- `params` keep their order and spelling; a flag parameter (``;lr``) has the value None. `param(name)` looks one
  up case-insensitively.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

__all__ = ["SipUri", "parse_uri", "uri_scheme"]

# RFC 3261 §25.1 character classes.
_ALPHANUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_MARK = "-_.!~*'()"
_UNRESERVED = _ALPHANUM + _MARK
_USER_SAFE = frozenset(_UNRESERVED + "&=+$,;?/")  # user = 1*( unreserved / escaped / user-unreserved )
# Being liberal in what we accept: many phones and gateways send "#" unescaped in the user part (*67#...).
_USER_ACCEPTED = _USER_SAFE | {"#"}
_PASSWORD_SAFE = frozenset(_UNRESERVED + "&=+$,")
_PARAM_SAFE = frozenset(_UNRESERVED + "[]/:&+$")  # paramchar = param-unreserved / unreserved / escaped
_HEADER_SAFE = frozenset(_UNRESERVED + "[]/?:+$")  # hnv-unreserved / unreserved / escaped
_TEL_NUMBER_SAFE = frozenset("0123456789abcdefABCDEF*#+-.()pPwW")  # RFC 3966 digits, separators, pause
# hostname (§25.1), also allowing "_" as in SRV-style names, which some real hosts use
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?"
_HOSTNAME_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_HEX = "0123456789abcdefABCDEF"


def uri_scheme(text: str) -> str | None:
    """The lower-cased scheme of an absolute URI (``"sip"``, ``"tel"``, ``"im"``, ...), or None if it has none."""
    match = _SCHEME_RE.match(text)
    return match.group(1).lower() if match else None


@dataclass(frozen=True, slots=True)
class SipUri:
    """A sip:, sips: or tel: URI with its parts unescaped (see the module docstring)."""

    scheme: str
    user: str | None = None
    password: str | None = None
    host: str = ""
    port: int | None = None
    params: tuple[tuple[str, str | None], ...] = field(default=())
    headers: tuple[tuple[str, str], ...] = field(default=())

    def param(self, name: str) -> str | None:
        """Value of a URI parameter, case-insensitively; "" for a flag parameter, None if absent."""
        lowered = name.lower()
        for key, value in self.params:
            if key.lower() == lowered:
                return "" if value is None else value
        return None

    def has_param(self, name: str) -> bool:
        """Whether the URI has this parameter (with or without a value)."""
        lowered = name.lower()
        return any(key.lower() == lowered for key, _ in self.params)

    @property
    def transport(self) -> str | None:
        """The ``transport`` parameter, lower-cased, or None."""
        value = self.param("transport")
        return value.lower() if value else None

    @property
    def is_phone(self) -> bool:
        """True for a tel: URI or a SIP URI with ``user=phone`` (RFC 3261 §19.1.1): the user is a number."""
        return self.scheme == "tel" or (self.param("user") or "").lower() == "phone"

    @property
    def host_port(self) -> str:
        """``host[:port]`` as it appears in the URI (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def with_params(self, *params: tuple[str, str | None]) -> SipUri:
        """A copy with these parameters set (replacing ones of the same name, case-insensitively)."""
        names = {name.lower() for name, _ in params}
        kept = tuple(p for p in self.params if p[0].lower() not in names)
        return SipUri(
            self.scheme, self.user, self.password, self.host, self.port, kept + params, self.headers
        )

    def __str__(self) -> str:
        if self.scheme == "tel":
            text = "tel:" + _escape(self.user or "", _TEL_NUMBER_SAFE)
        else:
            text = self.scheme + ":"
            if self.user is not None:
                text += _escape(self.user, _USER_SAFE)
                if self.password is not None:
                    text += ":" + _escape(self.password, _PASSWORD_SAFE)
                text += "@"
            text += self.host_port
        for name, value in self.params:
            text += ";" + _escape(name, _PARAM_SAFE)
            if value is not None:
                text += "=" + _escape(value, _PARAM_SAFE)
        if self.headers:
            text += "?" + "&".join(
                _escape(name, _HEADER_SAFE) + "=" + _escape(value, _HEADER_SAFE)
                for name, value in self.headers
            )
        return text


def parse_uri(text: str) -> SipUri:
    """Parse a sip:, sips: or tel: URI (RFC 3261 §19.1, §25.1; RFC 3966). Raises ValueError if it is not one."""
    scheme = uri_scheme(text)
    if scheme is None:
        raise ValueError(f"not an absolute URI: {text!r}")
    rest = text[len(scheme) + 1 :]
    if scheme == "tel":
        return _parse_tel(rest)
    if scheme not in ("sip", "sips"):
        raise ValueError(f"unsupported URI scheme {scheme!r}")
    if not rest:
        raise ValueError("empty SIP URI")
    user: str | None = None
    password: str | None = None
    at = rest.find("@")
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1 :]
        colon = userinfo.find(":")
        if colon >= 0:
            user = _unescape(userinfo[:colon], _USER_ACCEPTED, "user")
            password = _unescape(userinfo[colon + 1 :], _PASSWORD_SAFE, "password")
        else:
            user = _unescape(userinfo, _USER_ACCEPTED, "user")
        if not user:
            raise ValueError("empty user part before '@'")
    header_text: str | None = None
    question = rest.find("?")
    if question >= 0:
        rest, header_text = rest[:question], rest[question + 1 :]
    semicolon = rest.find(";")
    if semicolon >= 0:
        hostport, param_text = rest[:semicolon], rest[semicolon + 1 :]
        params = _parse_params(param_text)
    else:
        hostport, params = rest, ()
    host, port = _parse_hostport(hostport)
    headers = _parse_headers(header_text) if header_text is not None else ()
    return SipUri(scheme, user, password, host, port, params, headers)


def _parse_tel(rest: str) -> SipUri:
    number, _, param_text = rest.partition(";")
    if not number or any(ch not in _TEL_NUMBER_SAFE for ch in number):
        raise ValueError(f"bad telephone number {number!r}")
    if "?" in param_text:
        raise ValueError("a tel: URI has no headers")
    params = _parse_params(param_text) if param_text or rest.endswith(";") else ()
    return SipUri("tel", number, None, "", None, params, ())


def _parse_params(text: str) -> tuple[tuple[str, str | None], ...]:
    params: list[tuple[str, str | None]] = []
    for part in text.split(";"):
        name, eq, value = part.partition("=")
        if not name:
            raise ValueError("empty URI parameter")
        key = _unescape(name, _PARAM_SAFE, "parameter name")
        params.append((key, _unescape(value, _PARAM_SAFE, "parameter value") if eq else None))
    return tuple(params)


def _parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    headers: list[tuple[str, str]] = []
    for part in text.split("&"):
        name, eq, value = part.partition("=")
        if not name or not eq:
            raise ValueError(f"bad URI header {part!r}")
        headers.append(
            (_unescape(name, _HEADER_SAFE, "header name"), _unescape(value, _HEADER_SAFE, "header"))
        )
    return tuple(headers)


def _parse_hostport(text: str) -> tuple[str, int | None]:
    port: int | None = None
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError("unterminated IPv6 reference")
        host, tail = text[1:close], text[close + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"bad IPv6 reference {host!r}") from None
        if tail:
            if not tail.startswith(":"):
                raise ValueError(f"junk after IPv6 reference: {tail!r}")
            port = _parse_port(tail[1:])
        return host, port
    host, colon, port_text = text.partition(":")
    if colon:
        port = _parse_port(port_text)
    if not host or not _HOSTNAME_RE.fullmatch(host):
        raise ValueError(f"bad host {host!r}")
    return host, port


def _parse_port(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 5 or int(text) > 65535:
        raise ValueError(f"bad port {text!r}")
    return int(text)


def _unescape(text: str, safe: frozenset[str], what: str) -> str:
    """Undo %HH escapes (RFC 3261 §25.1 ``escaped``); any other character must be in `safe`."""
    if "%" not in text:
        for ch in text:
            if ch not in safe:
                raise ValueError(f"character {ch!r} not allowed in URI {what}")
        return text
    out = bytearray()
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "%":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or pair[0] not in _HEX or pair[1] not in _HEX:
                raise ValueError(f"bad escape %{pair} in URI {what}")
            out.append(int(pair, 16))
            i += 3
            continue
        if ch not in safe:
            raise ValueError(f"character {ch!r} not allowed in URI {what}")
        out.append(ord(ch))
        i += 1
    # surrogateescape keeps escapes of non-UTF-8 octets (e.g. %FF) so that printing restores them.
    return out.decode("utf-8", "surrogateescape")


def _escape(text: str, safe: frozenset[str]) -> str:
    if all(ch in safe for ch in text):
        return text
    out: list[str] = []
    for ch in text:
        if ch in safe:
            out.append(ch)
        else:
            out.extend(f"%{byte:02X}" for byte in ch.encode("utf-8", "surrogateescape"))
    return "".join(out)
