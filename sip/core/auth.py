"""HTTP digest authentication for SIP (RFC 3261 §22, RFC 2617, RFC 7616 with RFC 8760's SIP algorithms),
client and server side, sans-I/O: no clock reads, no I/O; randomness is injected.

Parsing (never raises anything but ValueError, and bounds its input):
- `parse_challenges(value)`: every challenge of one WWW-Authenticate / Proxy-Authenticate field (a field may
  hold several, comma-separated: ``Digest realm="a", nonce="b", Basic realm="c"``); `parse_challenge` the
  first Digest one. Parameter names are case-insensitive, values are tokens or quoted strings (``\\"``
  escapes), duplicates are refused.
- `parse_authorization(value)`: an Authorization / Proxy-Authorization field.

Computing: `digest(...)` is the response of RFC 2617 §3.2.2.1 / RFC 7616 §3.4.1 for MD5, SHA-256 (RFC 8760
names SHA-512-256 too; hashlib's support for it varies, so it is left out) and their "-sess" variants, with
qop auth, auth-int, or none (RFC 2069 servers).

Client (`DigestClient`): given a 401/407 to a request, `respond(...)` returns the header(s) to add to the
retried request (`AuthAnswer`) or why it must not retry (`AuthRefused`, e.g. "bad credentials"). It keeps the
last challenge per realm, so that `authorization(...)` can answer pre-emptively (RFC 3261 §22.3: the next
REGISTER refresh carries credentials with nc+1), counts nc per nonce, picks a fresh cnonce each time, and on
stale=true retries with the new nonce without asking for credentials again. Give-up rule (one retry per
challenge): a challenge that repeats the nonce we just answered, without stale=true, means the
credentials were refused; so does a second consecutive non-stale challenge after an answered one (servers
such as Asterisk issue a new nonce with every 401), so a wrong password costs at most two round trips.

Server (`DigestServer`): `challenge(now)` issues WWW-Authenticate (or Proxy-Authenticate) fields, one per
algorithm, most preferred first. The nonce needs no server state: it is base64url(issue time ‖ random ‖
HMAC-SHA-256(secret, issue time ‖ random ‖ realm)[:16]), so `verify` checks that we made it (constant time)
and how old it is (older than `nonce_ttl_s` → stale=true, RFC 2617 §3.2.1). `now` is the injected monotonic
clock, so nonces die with the process (a restart also gets a new secret unless one is passed in). Replays:
qop is required and nc must grow per nonce, recorded in a bounded table (`max_nonces` entries, least recently
used evicted); a nonce issued at or before the newest evicted one is answered stale=true, so an evicted
nonce cannot be replayed. Every comparison of a secret-derived value uses `hmac.compare_digest`.

Secrets: passwords live only in `Credentials` (and `DigestServer`'s table), whose repr/str mask them; no
object keeps an HA1 beyond one computation, and nothing here logs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import random
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rtp.units import NS_PER_S
from sip.core.message import Response

__all__ = [
    "ALGORITHMS",
    "AuthAnswer",
    "AuthFailed",
    "AuthMissing",
    "AuthOk",
    "AuthRefused",
    "AuthStale",
    "Authorization",
    "Challenge",
    "Credentials",
    "DigestClient",
    "DigestServer",
    "MAX_FIELD",
    "digest",
    "parse_authorization",
    "parse_challenge",
    "parse_challenges",
]

MAX_FIELD = 8192  # longest challenge or Authorization field we read (peer input is bounded)
_HASHES: dict[str, Callable[[bytes], hashlib._Hash]] = {
    "SHA-256": hashlib.sha256,
    "SHA-256-SESS": hashlib.sha256,
    "MD5": hashlib.md5,
    "MD5-SESS": hashlib.md5,
}
ALGORITHMS = tuple(_HASHES)
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~")
# token68 (RFC 7235) adds "/" and "=" (trailing); some servers send bare nonces with them
_VALUE_CHARS = _TOKEN_CHARS | frozenset("/=:@")
_TOKEN68_CHARS = _TOKEN_CHARS | frozenset("/")


def _canonical_algorithm(name: str | None) -> str:
    algorithm = (name or "MD5").strip().upper()
    if algorithm not in _HASHES:
        raise ValueError(f"unsupported digest algorithm {name!r}")
    return algorithm


# --- parsing ----------------------------------------------------------------------------------------------


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def _token(text: str, i: int, chars: frozenset[str] = _TOKEN_CHARS) -> tuple[str, int]:
    start = i
    while i < len(text) and text[i] in chars:
        i += 1
    return text[start:i], i


def _quoted(text: str, i: int) -> tuple[str, int]:
    """A quoted string starting at text[i] == '"': (unescaped content, index after the closing quote)."""
    out: list[str] = []
    i += 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text):
                break
            out.append(text[i + 1])
            i += 2
        elif ch == '"':
            return "".join(out), i + 1
        else:
            out.append(ch)
            i += 1
    raise ValueError("unterminated quoted string")


def _parse_items(text: str) -> list[tuple[str, dict[str, str]]]:
    """Scheme-led groups of auth-params: ``Digest a=1, b="2", Basic c=3`` → [("digest", {...}), ...]."""
    if len(text) > MAX_FIELD:
        raise ValueError("authentication field too long")
    groups: list[tuple[str, dict[str, str]]] = []
    i = _skip_ws(text, 0)
    params: dict[str, str] | None = None
    while i < len(text):
        name, j = _token(text, i)
        if not name:
            raise ValueError(f"expected a token at {i}")
        k = _skip_ws(text, j)
        if k < len(text) and text[k] == "=" and params is not None:
            k = _skip_ws(text, k + 1)
            if k < len(text) and text[k] == '"':
                value, k = _quoted(text, k)
            else:
                value, k = _token(text, k, _VALUE_CHARS)
                if not value:
                    raise ValueError(f"empty value of {name!r}")
            key = name.lower()
            if key in params:
                raise ValueError(f"duplicate parameter {name!r}")
            params[key] = value
            i = k
        else:  # a new scheme, perhaps with token68 credentials (``Basic dXNlcg==``)
            params = {}
            groups.append((name.lower(), params))
            i = k
            base, after = _token(text, i, _TOKEN68_CHARS)
            padding = _token68_padding(text, after) if base else -1
            if padding >= 0:
                params[""] = text[i : after + padding]
                i = after + padding
            elif i < len(text) and text[i] != ",":
                continue  # its first parameter follows after white space
        i = _skip_ws(text, i)
        if i < len(text):
            if text[i] != ",":
                raise ValueError(f"expected ',' at {i}")
            i = _skip_ws(text, i + 1)
    if not groups:
        raise ValueError("no authentication scheme")
    return groups


def _token68_padding(text: str, k: int) -> int:
    """How many '=' follow at text[k] when only they (and white space) lead to the next ',' or the end (then
    the run before k is token68 credentials, RFC 7235, not a parameter name); -1 otherwise."""
    end = text.find(",", k)
    rest = (text[k:] if end < 0 else text[k:end]).rstrip(" \t")
    return len(rest) if set(rest) <= {"="} else -1


@dataclass(frozen=True, slots=True)
class Challenge:
    """One Digest challenge (RFC 7616 §3.3). `algorithm` is canonical upper case ("MD5", "SHA-256-SESS");
    `qop` the offered options, lower case (empty: an RFC 2069 server); `proxy` when it came in
    Proxy-Authenticate (answer with Proxy-Authorization)."""

    realm: str
    nonce: str
    algorithm: str = "MD5"
    qop: tuple[str, ...] = ()
    opaque: str | None = None
    stale: bool = False
    userhash: bool = False
    proxy: bool = False


def _challenge_from(params: dict[str, str], proxy: bool) -> Challenge:
    realm = params.get("realm")
    nonce = params.get("nonce")
    if realm is None or nonce is None:
        raise ValueError("digest challenge without realm or nonce")
    qop = tuple(q.strip().lower() for q in params.get("qop", "").split(",") if q.strip())
    return Challenge(
        realm=realm,
        nonce=nonce,
        algorithm=_canonical_algorithm(params.get("algorithm")),
        qop=qop,
        opaque=params.get("opaque"),
        stale=params.get("stale", "").strip().lower() == "true",
        userhash=params.get("userhash", "").strip().lower() == "true",
        proxy=proxy,
    )


def parse_challenges(value: str, *, proxy: bool = False) -> list[Challenge]:
    """Every Digest challenge in one header field with an algorithm we support (others are skipped);
    ValueError when the field is malformed."""
    out: list[Challenge] = []
    for scheme, params in _parse_items(value):
        if scheme != "digest":
            continue
        try:
            out.append(_challenge_from(params, proxy))
        except ValueError:
            if "realm" not in params or "nonce" not in params:
                raise
            # an algorithm we do not know (SHA-512-256, ...): the server may offer another
    return out


def parse_challenge(value: str, *, proxy: bool = False) -> Challenge:
    """The first usable Digest challenge of a field (ValueError when there is none)."""
    challenges = parse_challenges(value, proxy=proxy)
    if not challenges:
        raise ValueError("no usable Digest challenge")
    return challenges[0]


def challenges_of(response: Response) -> list[Challenge]:
    """The usable Digest challenges of a 401 (WWW-Authenticate) or 407 (Proxy-Authenticate); malformed fields
    are skipped."""
    proxy = response.status == 407
    name = "Proxy-Authenticate" if proxy else "WWW-Authenticate"
    out: list[Challenge] = []
    for value in response.headers.get_fields(name):
        try:
            out.extend(parse_challenges(value, proxy=proxy))
        except ValueError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class Authorization:
    """A Digest Authorization / Proxy-Authorization (RFC 7616 §3.4). `nc` is the 8-hex-digit text as sent."""

    username: str
    realm: str
    nonce: str
    uri: str
    response: str
    algorithm: str = "MD5"
    qop: str | None = None
    nc: str | None = None
    cnonce: str | None = None
    opaque: str | None = None
    userhash: bool = False


def parse_authorization(value: str) -> Authorization:
    """A Digest Authorization field; ValueError when it is not one, is malformed or lacks a required part."""
    groups = _parse_items(value)
    if len(groups) != 1 or groups[0][0] != "digest":
        raise ValueError("not a single Digest credentials field")
    p = groups[0][1]
    missing = [name for name in ("username", "realm", "nonce", "uri", "response") if name not in p]
    if missing:
        raise ValueError(f"Authorization lacks {', '.join(missing)}")
    qop = p.get("qop")
    qop = qop.strip().lower() if qop is not None else None
    if qop is not None and ("nc" not in p or "cnonce" not in p):
        raise ValueError("qop without nc or cnonce")
    nc = p.get("nc")
    if nc is not None and (len(nc) != 8 or any(ch not in "0123456789abcdefABCDEF" for ch in nc)):
        raise ValueError("bad nc")
    return Authorization(
        username=p["username"],
        realm=p["realm"],
        nonce=p["nonce"],
        uri=p["uri"],
        response=p["response"].lower(),
        algorithm=_canonical_algorithm(p.get("algorithm")),
        qop=qop,
        nc=nc,
        cnonce=p.get("cnonce"),
        opaque=p.get("opaque"),
        userhash=p.get("userhash", "").strip().lower() == "true",
    )


# --- computing --------------------------------------------------------------------------------------------


def _h(algorithm: str, data: str | bytes) -> str:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return _HASHES[algorithm](raw).hexdigest()


def digest(
    *,
    algorithm: str,
    username: str,
    realm: str,
    password: str,
    nonce: str,
    method: str,
    uri: str,
    qop: str | None = None,
    nc: str | None = None,
    cnonce: str | None = None,
    body: bytes = b"",
) -> str:
    """The request-digest (RFC 2617 §3.2.2.1, RFC 7616 §3.4.1): KD(H(A1), nonce:nc:cnonce:qop:H(A2)), or
    KD(H(A1), nonce:H(A2)) without qop. `username` is what goes into A1 (the plain name, also with userhash)."""
    algorithm = _canonical_algorithm(algorithm)
    ha1 = _h(algorithm, f"{username}:{realm}:{password}")
    if algorithm.endswith("-SESS"):
        ha1 = _h(algorithm, f"{ha1}:{nonce}:{cnonce or ''}")
    a2 = f"{method}:{uri}"
    if qop == "auth-int":
        a2 += ":" + _h(algorithm, body)
    ha2 = _h(algorithm, a2)
    if qop:
        return _h(algorithm, f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")
    return _h(algorithm, f"{ha1}:{nonce}:{ha2}")


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --- credentials ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Credentials:
    """A digest username and password; `realm` None answers any realm. repr/str never show the password."""

    username: str
    password: str = field(repr=False)
    realm: str | None = None

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password='***', realm={self.realm!r})"

    __str__ = __repr__


# --- client side ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuthAnswer:
    """Headers to add to the retried request (one per challenged realm), replacing any earlier ones."""

    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class AuthRefused:
    """Do not retry: `reason` says why ("bad credentials", "no credentials for realm ...", ...)."""

    reason: str


class _RealmState:
    __slots__ = ("challenge", "nc", "answered_nonce", "rejections")

    def __init__(self, challenge: Challenge) -> None:
        self.challenge = challenge
        self.nc = 0
        self.answered_nonce: str | None = None  # the nonce of our last answer for this realm
        self.rejections = 0  # consecutive non-stale challenges after an answer


class DigestClient:
    """Answers 401/407 challenges for one set of credentials (see the module docstring)."""

    __slots__ = ("_credentials", "_rng", "_realms")

    MAX_REJECTIONS = 2

    def __init__(self, credentials: Credentials, *, rng: random.Random | None = None) -> None:
        self._credentials = credentials
        self._rng = rng or random.SystemRandom()
        self._realms: dict[tuple[bool, str], _RealmState] = {}

    def __repr__(self) -> str:
        return f"DigestClient({self._credentials!r}, realms={sorted(r for _, r in self._realms)!r})"

    __str__ = __repr__

    @property
    def username(self) -> str:
        return self._credentials.username

    def respond(
        self, response: Response, method: str, uri: str, body: bytes = b""
    ) -> AuthAnswer | AuthRefused:
        """What to do about a 401/407 to our `method` request for `uri` (the Request-URI)."""
        challenges = challenges_of(response)
        if not challenges:
            return AuthRefused(f"{response.status} without a usable Digest challenge")
        best: dict[tuple[bool, str], Challenge] = {}
        for ch in challenges:  # per realm, the strongest algorithm offered
            key = (ch.proxy, ch.realm)
            if key not in best or ALGORITHMS.index(ch.algorithm) < ALGORITHMS.index(best[key].algorithm):
                best[key] = ch
        headers: list[tuple[str, str]] = []
        for key, ch in best.items():
            if self._credentials.realm is not None and self._credentials.realm != ch.realm:
                return AuthRefused(f"no credentials for realm {ch.realm!r}")
            state = self._realms.get(key)
            if state is not None and state.answered_nonce is not None and not ch.stale:
                state.rejections += 1
                if state.answered_nonce == ch.nonce or state.rejections >= self.MAX_REJECTIONS:
                    return AuthRefused("bad credentials")
            elif state is not None and ch.stale:
                state.rejections = 0
            if state is None or state.challenge.nonce != ch.nonce:
                rejections = state.rejections if state is not None else 0
                state = _RealmState(ch)
                state.rejections = rejections
                self._realms[key] = state
            else:
                state.challenge = ch
            headers.append(self._answer(state, method, uri, body))
        return AuthAnswer(tuple(headers))

    def authorization(self, method: str, uri: str, body: bytes = b"") -> AuthAnswer | None:
        """Pre-emptive credentials for the realms challenged before (nc+1), or None when none was."""
        if not self._realms:
            return None
        return AuthAnswer(tuple(self._answer(s, method, uri, body) for s in self._realms.values()))

    def accepted(self) -> None:
        """The request we answered succeeded: the rejection count starts again."""
        for state in self._realms.values():
            state.rejections = 0
            state.answered_nonce = None

    def forget(self) -> None:
        self._realms.clear()

    def _answer(self, state: _RealmState, method: str, uri: str, body: bytes) -> tuple[str, str]:
        ch = state.challenge
        qop: str | None = None
        if "auth" in ch.qop:
            qop = "auth"
        elif "auth-int" in ch.qop:
            qop = "auth-int"
        nc: str | None = None
        cnonce: str | None = None
        if qop is not None or ch.algorithm.endswith("-SESS"):
            cnonce = f"{self._rng.getrandbits(64):016x}"
        if qop is not None:
            state.nc += 1
            nc = f"{state.nc:08x}"
        user = self._credentials.username
        value = digest(
            algorithm=ch.algorithm,
            username=user,
            realm=ch.realm,
            password=self._credentials.password,
            nonce=ch.nonce,
            method=method,
            uri=uri,
            qop=qop,
            nc=nc,
            cnonce=cnonce,
            body=body,
        )
        shown = _h(ch.algorithm, f"{user}:{ch.realm}") if ch.userhash else user
        parts = [
            f"username={_quote(shown)}",
            f"realm={_quote(ch.realm)}",
            f"nonce={_quote(ch.nonce)}",
            f"uri={_quote(uri)}",
            f"response={_quote(value)}",
            f"algorithm={ch.algorithm}",
        ]
        if cnonce is not None:
            parts.append(f"cnonce={_quote(cnonce)}")
        if ch.opaque is not None:
            parts.append(f"opaque={_quote(ch.opaque)}")
        if qop is not None:
            parts.append(f"qop={qop}")
            parts.append(f"nc={nc}")
        if ch.userhash:
            parts.append("userhash=true")
        state.answered_nonce = ch.nonce
        return ("Proxy-Authorization" if ch.proxy else "Authorization"), "Digest " + ", ".join(parts)


# --- server side ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuthOk:
    username: str


@dataclass(frozen=True, slots=True)
class AuthMissing:
    """No credentials for our realm: challenge."""


@dataclass(frozen=True, slots=True)
class AuthStale:
    """Right credentials on an expired (or forgotten) nonce: challenge with stale=true."""


@dataclass(frozen=True, slots=True)
class AuthFailed:
    """Wrong or malformed credentials, or a replay: challenge afresh (and count it)."""

    reason: str


AuthVerdict = AuthOk | AuthMissing | AuthStale | AuthFailed
_NONCE_RAW = 8 + 8 + 16  # issue time, random, MAC


class DigestServer:
    """Challenges and verifies digest credentials for one realm (see the module docstring).

    `users` maps usernames to passwords. `proxy` True uses 407 / Proxy-Authenticate / Proxy-Authorization,
    else 401 / WWW-Authenticate / Authorization. `algorithms` are offered in this order (RFC 8760 §2.4: one
    challenge per algorithm, most preferred first; MD5 last for old peers)."""

    __slots__ = (
        "realm",
        "proxy",
        "algorithms",
        "nonce_ttl",
        "_users",
        "_secret",
        "_random",
        "_seen",
        "_max",
        "_evicted_ts",
    )

    def __init__(
        self,
        realm: str,
        users: Iterable[Credentials],
        *,
        secret: bytes | None = None,
        proxy: bool = False,
        algorithms: tuple[str, ...] = ("SHA-256", "MD5"),
        nonce_ttl_s: int = 300,
        max_nonces: int = 4096,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.realm = realm
        self.proxy = proxy
        self.algorithms = tuple(_canonical_algorithm(a) for a in algorithms)
        if not self.algorithms:
            raise ValueError("DigestServer needs at least one algorithm")
        self.nonce_ttl = nonce_ttl_s * NS_PER_S
        self._users = {c.username: c.password for c in users}
        self._random = random_bytes
        self._secret = secret if secret is not None else random_bytes(32)
        self._seen: OrderedDict[str, int] = OrderedDict()  # nonce → highest nc accepted
        self._max = max_nonces
        self._evicted_ts: int | None = None  # issue time of the newest nonce evicted from `_seen`

    def __repr__(self) -> str:
        return f"DigestServer(realm={self.realm!r}, users={sorted(self._users)!r}, proxy={self.proxy})"

    __str__ = __repr__

    def add_user(self, credentials: Credentials) -> None:
        """One more user (sip.core.policy: every trunk's inbound user shares the server's nonces, so a challenge
        sent before the request's trunk was known can be answered with that trunk's credentials)."""
        self._users[credentials.username] = credentials.password

    @property
    def status(self) -> int:
        return 407 if self.proxy else 401

    @property
    def challenge_header(self) -> str:
        return "Proxy-Authenticate" if self.proxy else "WWW-Authenticate"

    @property
    def credentials_header(self) -> str:
        return "Proxy-Authorization" if self.proxy else "Authorization"

    def _mac(self, head: bytes) -> bytes:
        return hmac.new(self._secret, head + self.realm.encode("utf-8"), hashlib.sha256).digest()[:16]

    def new_nonce(self, now: int) -> str:
        head = struct.pack(">q", now) + self._random(8)
        return base64.urlsafe_b64encode(head + self._mac(head)).decode("ascii")

    def _nonce_time(self, nonce: str) -> int | None:
        """The issue time of a nonce we made, or None (not ours, tampered, malformed)."""
        try:
            raw = base64.urlsafe_b64decode(nonce.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            return None
        if len(raw) != _NONCE_RAW:
            return None
        head, mac = raw[:16], raw[16:]
        if not hmac.compare_digest(mac, self._mac(head)):
            return None
        issued: int = struct.unpack(">q", head[:8])[0]
        return issued

    def challenge(self, now: int, *, stale: bool = False) -> tuple[tuple[str, str], ...]:
        """The challenge fields for a 401/407 (one nonce, one field per algorithm)."""
        nonce = self.new_nonce(now)
        fields = []
        for algorithm in self.algorithms:
            value = f'Digest realm={_quote(self.realm)}, nonce="{nonce}", algorithm={algorithm}, qop="auth"'
            if stale:
                value += ", stale=TRUE"
            fields.append((self.challenge_header, value))
        return tuple(fields)

    def verify(
        self, method: str, uri: str, headers: Iterable[str], now: int, body: bytes = b""
    ) -> AuthVerdict:
        """Check the credentials fields (`headers`: the values of `credentials_header`) of a `method` request
        for Request-URI `uri`. Never raises."""
        mine: Authorization | None = None
        for value in headers:
            try:
                parsed = parse_authorization(value)
            except ValueError:
                continue
            if parsed.realm == self.realm:
                mine = parsed
                break
        if mine is None:
            return AuthMissing()
        return self._check(mine, method, uri, now, body)

    def _check(self, a: Authorization, method: str, uri: str, now: int, body: bytes) -> AuthVerdict:
        if a.algorithm not in self.algorithms:
            return AuthFailed("algorithm not offered")
        if a.qop not in ("auth", "auth-int") or a.nc is None or a.cnonce is None:
            return AuthFailed("qop required")
        if a.uri.strip() != uri.strip():
            return AuthFailed("uri does not match the Request-URI")
        issued = self._nonce_time(a.nonce)
        if issued is None:
            return AuthFailed("not our nonce")
        name = self._username(a)
        password = self._users.get(name) if name is not None else None
        if name is None or password is None:
            return AuthFailed("unknown user")
        expected = digest(
            algorithm=a.algorithm,
            username=name,
            realm=self.realm,
            password=password,
            nonce=a.nonce,
            method=method,
            uri=a.uri,
            qop=a.qop,
            nc=a.nc,
            cnonce=a.cnonce,
            body=body,
        )
        if not hmac.compare_digest(expected.encode("ascii"), a.response.encode("utf-8", "replace")):
            return AuthFailed("wrong response")
        if issued > now or now - issued > self.nonce_ttl:
            return AuthStale()
        nc = int(a.nc, 16)
        last = self._seen.get(a.nonce)
        if last is None and self._evicted_ts is not None and issued <= self._evicted_ts:
            return AuthStale()  # we may have forgotten this nonce's nc: make the peer take a new one
        if last is not None and nc <= last:
            return AuthFailed("replayed nc")
        self._seen[a.nonce] = nc
        self._seen.move_to_end(a.nonce)
        while len(self._seen) > self._max:
            old, _ = self._seen.popitem(last=False)
            ts = self._nonce_time(old)
            if ts is not None and (self._evicted_ts is None or ts > self._evicted_ts):
                self._evicted_ts = ts
        return AuthOk(name)

    def _username(self, a: Authorization) -> str | None:
        if not a.userhash:
            return a.username
        for name in self._users:
            if hmac.compare_digest(_h(a.algorithm, f"{name}:{self.realm}"), a.username.lower()):
                return name
        return None
