"""A registration client (RFC 3261 §10), sans-I/O: REGISTER requests out, final responses in, on `now`.

One `Registration` keeps one binding (our Contact) at one registrar for one address-of-record:

    reg = Registration(RegistrationConfig(aor="sip:1001@pbx.example", contact="sip:1001@203.0.113.5:5060",
                                          via_host="203.0.113.5", via_port=5060),
                       credentials=Credentials("1001", password), rng=random.Random())
    reg.start(now)
    for out in reg.requests(): send out.request to out.destination over out.transport in a client transaction
    final response of that transaction → reg.receive_response(response, now)   (1xx may be passed; ignored)
    Timer F / a transport error        → reg.request_failed(now, "timeout")
    arm a timer at reg.next_deadline(); when it fires: reg.handle_timer(now)
    shutdown: reg.stop(now) (sends REGISTER with Expires: 0 when a binding may exist); `reg.done` once over.

`sip.core.ua.UserAgent.add_registration` carries all of this over the UA's transaction layer (the usual shape);
the loop above is for a shell that drives a `Registration` on its own.

Behaviour:
- Request-URI: the registrar (`registrar`, default the AoR's host and port, §10.2); To and From: the AoR (From
  with our tag); one Call-ID for every REGISTER of this registration and a CSeq that grows (§10.2);
  Contact ``<contact>;expires=N`` plus an Expires header; a new Via branch each time.
- 401/407 → the same REGISTER again with credentials (`sip.core.auth.DigestClient`: nc, cnonce, stale=true), once
  per challenge; credentials refused ("bad credentials") or no credentials → failed, retried with backoff.
  Refreshes carry the credentials pre-emptively (RFC 3261 §22.3), so a refresh needs no 401 round trip.
- 2xx → registered; the granted expiry is our Contact's ``expires`` in the 2xx (§10.2.4), else its Expires
  header, else what we asked for. The refresh goes out at half the granted expiry, and never later than
  `refresh_margin_s` before it runs out (at least 1 s after the 2xx).
- 423 Interval Too Brief → retry at once with Min-Expires (when it is larger than what we asked for;
  otherwise a failure).
- Other final responses (3xx, 4xx, 5xx, 6xx) and timeouts → failed with the reason ("403 Forbidden",
  "timeout"), retried after `backoff_initial_s`·2^(n-1) capped at `backoff_max_s`, scaled by a jitter factor in
  [1 - `backoff_jitter`, 1] drawn from the injected random source; a 503's or 500's Retry-After (when larger)
  is honoured, within the cap. A 2xx resets the count. While the old binding has not expired, a failed refresh
  keeps retrying on the same schedule (`status().expires_at` still says how long the registrar keeps us).
- `stop(now)`: REGISTER with Expires: 0 (and Contact ;expires=0) when a binding may exist → "unregistering",
  then "unregistered" at its final response or failure. No binding → "unregistered" at once.

Keepalive (`keepalive_s`): while registered, an OPTIONS to the registrar every `keepalive_s`
(`Keepalive`): any final response, even 404 or 405, says the registrar (and the NAT path to it) is alive;
`keepalive_failures` unanswered in a row make it "unreachable" and the binding is refreshed at once (a NAT
binding or a registrar that lost us); the count, last status and round trip are in `status().keepalive`.

`status(now)` gives state (registering / registered / failed / unregistering / unregistered), the binding's
expiry, the last error and the next attempt. Nothing here logs the password (credentials live only in the
`DigestClient`, whose repr masks them).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from rtp.units import NS_PER_S
from sip.core.auth import AuthAnswer, Credentials, DigestClient
from sip.core.headers import Headers, parse_name_addr
from sip.core.message import Request, Response
from sip.core.uri import parse_uri

__all__ = [
    "Keepalive",
    "KeepaliveStatus",
    "OutgoingRequest",
    "Registration",
    "RegistrationConfig",
    "RegistrationState",
    "RegistrationStatus",
]

RegistrationState = Literal["idle", "registering", "registered", "failed", "unregistering", "unregistered"]


@dataclass(frozen=True, slots=True)
class RegistrationConfig:
    """One binding. `aor`: the address-of-record (``sip:USER@HOST[:PORT]``, the `--register` value);
    `contact`: our Contact URI; `registrar`: the Request-URI (default ``sip:HOST[:PORT]`` of the AoR);
    `destination`: where to send (default the registrar's host and port; a name for the shell to resolve);
    `via_host`/`via_port`: our Via sent-by (the external address behind NAT)."""

    aor: str
    contact: str
    via_host: str
    via_port: int = 5060
    registrar: str | None = None
    destination: tuple[str, int] | None = None
    transport: str = "udp"
    expires_s: int = 3600
    refresh_margin_s: int = 10
    backoff_initial_s: float = 2.0
    backoff_max_s: float = 300.0
    backoff_jitter: float = 0.5
    user_agent: str | None = None  # the User-Agent field; None: none (we name no product by default)
    keepalive_s: float | None = None  # OPTIONS to the registrar this often while registered (None: off)
    keepalive_failures: int = 3  # unanswered in a row: "unreachable", and the binding is refreshed at once


def _product(c: RegistrationConfig) -> tuple[tuple[str, str], ...]:
    return (("User-Agent", c.user_agent),) if c.user_agent is not None else ()


@dataclass(frozen=True, slots=True)
class OutgoingRequest:
    """A request for the carrier to send in a new client transaction."""

    request: Request
    destination: tuple[str, int]
    transport: str


@dataclass(frozen=True, slots=True)
class RegistrationStatus:
    """What `status` reports. Times are the injected monotonic clock's ns; `expires_in_s` is relative."""

    aor: str
    state: RegistrationState
    expires_at: int | None
    expires_in_s: float | None
    last_error: str | None
    last_status: int | None
    failures: int
    next_attempt_at: int | None
    granted_expires_s: int | None = None
    keepalive: KeepaliveStatus | None = None


@dataclass(frozen=True, slots=True)
class KeepaliveStatus:
    """The registrar keepalive's counters: `state` "idle" (no probe answered or missed yet), "ok" (the last
    probe was answered) or "unreachable" (`consecutive_failures` reached the limit)."""

    interval_s: float
    state: Literal["idle", "ok", "unreachable"]
    sent: int
    answered: int
    failures: int
    consecutive_failures: int
    last_status: int | None
    last_rtt_ms: float | None
    last_error: str | None


class Keepalive:
    """OPTIONS pings towards a registrar, sans-I/O: `arm(now)` schedules the next one `interval`
    later, `handle_timer(now)` sends it (`requests()`), its final response (`receive_response`) or its
    timeout (`request_failed`) re-arms the next. Only one probe is out at a time."""

    def __init__(
        self,
        config: RegistrationConfig,
        registrar: str,
        destination: tuple[str, int],
        transport: str,
        rng: random.Random,
        *,
        call_id: str,
        from_tag: str,
        next_cseq: Callable[[], int],
    ) -> None:
        assert config.keepalive_s is not None and config.keepalive_s > 0
        self.interval_ns = int(config.keepalive_s * NS_PER_S)
        self._config = config
        self._registrar = registrar
        self._destination = destination
        self._transport = transport
        self._rng = rng
        # the registration's Call-ID and From tag, and CSeq numbers from its own sequence: everything one
        # registration sends is one Call-ID whose CSeq only grows (a registrar orders REGISTERs by it, §10.3)
        self._call_id = call_id
        self._from_tag = from_tag
        self._next_cseq = next_cseq
        self._next_at: int | None = None
        self._outstanding: tuple[int, int] | None = None  # (CSeq number, sent at)
        self._out: list[OutgoingRequest] = []
        self._state: Literal["idle", "ok", "unreachable"] = "idle"
        self._sent = self._answered = self._failures = self._consecutive = 0
        self._last_status: int | None = None
        self._last_rtt_ms: float | None = None
        self._last_error: str | None = None

    def arm(self, now: int) -> None:
        """The next probe `interval` from now (unless one is out: its outcome re-arms)."""
        if self._outstanding is None:
            self._next_at = now + self.interval_ns

    def disarm(self) -> None:
        """No more probes (not registered); the one out, if any, is forgotten."""
        self._next_at = None
        self._outstanding = None

    def next_deadline(self) -> int | None:
        return self._next_at

    def handle_timer(self, now: int) -> None:
        if self._next_at is None or now < self._next_at or self._outstanding is not None:
            return
        self._next_at = None
        cseq = self._next_cseq()
        c = self._config
        items = _out_of_dialog(c, self._transport, self._rng, self._from_tag, self._registrar, self._call_id)
        items += [
            ("CSeq", f"{cseq} OPTIONS"),
            ("Contact", f"<{c.contact}>"),
            ("Accept", "application/sdp"),
            *_product(c),
        ]
        self._outstanding = (cseq, now)
        self._sent += 1
        request = Request("OPTIONS", self._registrar, Headers(items))
        self._out.append(OutgoingRequest(request, self._destination, self._transport))

    def requests(self) -> list[OutgoingRequest]:
        out, self._out = self._out, []
        return out

    def receive_response(self, response: Response, now: int) -> None:
        """Any final response to the probe out: the registrar is there (a 404 or 405 is an answer too)."""
        number = (response.headers.get("CSeq") or "").split()[:1]
        if self._outstanding is None or response.status < 200 or number != [str(self._outstanding[0])]:
            return
        sent_at = self._outstanding[1]
        self._outstanding = None
        self._answered += 1
        self._consecutive = 0
        self._state = "ok"
        self._last_status = response.status
        self._last_rtt_ms = round((now - sent_at) / 1e6, 1)
        self._last_error = None
        self._next_at = now + self.interval_ns

    def request_failed(self, now: int, reason: str) -> bool:
        """The probe out got no answer (Timer F) or could not be sent; True when that made the registrar
        "unreachable" just now (`keepalive_failures` in a row)."""
        if self._outstanding is None:
            return False
        self._outstanding = None
        self._failures += 1
        self._consecutive += 1
        self._last_error = f"no answer to OPTIONS ({reason})"
        self._next_at = now + self.interval_ns
        if self._consecutive >= self._config.keepalive_failures and self._state != "unreachable":
            self._state = "unreachable"
            return True
        return False

    def status(self) -> KeepaliveStatus:
        return KeepaliveStatus(
            interval_s=self.interval_ns / NS_PER_S,
            state=self._state,
            sent=self._sent,
            answered=self._answered,
            failures=self._failures,
            consecutive_failures=self._consecutive,
            last_status=self._last_status,
            last_rtt_ms=self._last_rtt_ms,
            last_error=self._last_error,
        )


@dataclass
class _Attempt:
    request: Request
    unregister: bool
    auth_tries: int = 0
    interval_tries: int = 0


@dataclass
class _Binding:
    expires_at: int | None = None
    granted_s: int | None = None
    failures: int = 0
    last_error: str | None = None
    last_status: int | None = None
    next_at: int | None = None
    history: list[str] = field(default_factory=list)


class Registration:
    """See the module docstring."""

    MAX_AUTH_TRIES = 3  # authenticated retries of one REGISTER (stale nonces included); a loop guard

    def __init__(
        self,
        config: RegistrationConfig,
        *,
        credentials: Credentials | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._rng = rng or random.SystemRandom()
        self._auth = DigestClient(credentials, rng=self._rng) if credentials is not None else None
        aor = parse_uri(config.aor)  # ValueError for a bad --register value: a misuse, raised here
        if aor.scheme not in ("sip", "sips"):
            raise ValueError(f"a registration needs a sip: or sips: address-of-record, got {config.aor!r}")
        self._registrar = config.registrar or f"{aor.scheme}:{aor.host_port}"
        registrar = parse_uri(self._registrar)
        self._destination = config.destination or (
            registrar.param("maddr") or registrar.host,
            registrar.port or (5061 if registrar.scheme == "sips" else 5060),
        )
        self._transport = (registrar.transport or config.transport).lower()
        self._call_id = f"{self._rng.getrandbits(96):024x}@{config.via_host}"
        self._from_tag = f"{self._rng.getrandbits(64):016x}"
        self._cseq = 0
        self._expires = config.expires_s
        self._state: RegistrationState = "idle"
        self._out: list[OutgoingRequest] = []
        self._attempt: _Attempt | None = None
        self._b = _Binding()
        self._refresh_at: int | None = None
        self.keepalive: Keepalive | None = None  # OPTIONS while registered
        if config.keepalive_s:
            self.keepalive = Keepalive(
                config,
                self._registrar,
                self._destination,
                self._transport,
                random.Random(self._rng.getrandbits(64)),
                call_id=self._call_id,
                from_tag=self._from_tag,
                next_cseq=self._take_cseq,
            )

    def _take_cseq(self) -> int:
        self._cseq += 1
        return self._cseq

    def __repr__(self) -> str:
        return f"Registration({self.config.aor!r}, state={self._state!r}, auth={self._auth!r})"

    __str__ = __repr__

    # --- output ---

    @property
    def state(self) -> RegistrationState:
        return self._state

    @property
    def done(self) -> bool:
        """True once stopped and the un-REGISTER (if any) is over."""
        return self._state == "unregistered"

    @property
    def destination(self) -> tuple[str, int]:
        return self._destination

    @property
    def transport(self) -> str:
        return self._transport

    @property
    def call_id(self) -> str:
        return self._call_id

    def requests(self) -> list[OutgoingRequest]:
        """Requests to send, each in its own client transaction (drains): REGISTERs and keepalive OPTIONS."""
        out, self._out = self._out, []
        if self.keepalive is not None:
            out.extend(self.keepalive.requests())
        return out

    def next_deadline(self) -> int | None:
        if self._state in ("unregistered", "unregistering", "idle"):
            return None
        times = [] if self._attempt is not None else [self._refresh_at, self._b.next_at]
        if self.keepalive is not None and self._state == "registered":
            times.append(self.keepalive.next_deadline())
        due = [t for t in times if t is not None]
        return min(due) if due else None

    def _next_register(self) -> int | None:
        """When the next REGISTER goes out (a refresh or a retry); None while one is out or when stopped."""
        if self._attempt is not None or self._state in ("unregistered", "unregistering", "idle"):
            return None
        times = [t for t in (self._refresh_at, self._b.next_at) if t is not None]
        return min(times) if times else None

    def status(self, now: int) -> RegistrationStatus:
        b = self._b
        return RegistrationStatus(
            aor=self.config.aor,
            state=self._state,
            expires_at=b.expires_at,
            expires_in_s=max(0.0, (b.expires_at - now) / NS_PER_S) if b.expires_at is not None else None,
            last_error=b.last_error,
            last_status=b.last_status,
            failures=b.failures,
            next_attempt_at=self._next_register(),
            granted_expires_s=b.granted_s,
            keepalive=self.keepalive.status() if self.keepalive is not None else None,
        )

    # --- input ---

    def start(self, now: int) -> None:
        """Send the first REGISTER (no-op unless idle)."""
        if self._state != "idle":
            return
        self._state = "registering"
        self._send(now, unregister=False)

    def stop(self, now: int) -> bool:
        """Un-register (Expires: 0). True when a request went out (wait for `done`), False when there was no
        binding to remove (already `done`)."""
        if self._state in ("unregistering", "unregistered"):
            return self._state == "unregistering"
        had_binding = self._b.expires_at is not None and self._b.expires_at > now
        in_flight = self._attempt is not None and not self._attempt.unregister
        self._refresh_at = self._b.next_at = None
        if self.keepalive is not None:
            self.keepalive.disarm()
        if not had_binding and not in_flight:
            self._state = "unregistered"
            self._attempt = None
            return False
        self._state = "unregistering"
        self._send(now, unregister=True)
        return True

    def handle_timer(self, now: int) -> None:
        if self.keepalive is not None and self._state == "registered":
            self.keepalive.handle_timer(now)
        if self._attempt is not None or self._state not in ("registered", "failed", "registering"):
            return
        due = [t for t in (self._refresh_at, self._b.next_at) if t is not None and t <= now]
        if not due:
            return
        self._refresh_at = self._b.next_at = None
        if self._state == "failed":
            self._state = "registering"  # a refresh of a live binding stays "registered" meanwhile
        self._send(now, unregister=False)

    def receive_response(self, response: Response, now: int) -> None:
        """A response to our outstanding REGISTER or keepalive OPTIONS (others are ignored). Never raises."""
        if (response.headers.get("CSeq") or "").split()[1:2] == ["OPTIONS"]:
            if self.keepalive is not None:
                self.keepalive.receive_response(response, now)
            return
        attempt = self._attempt
        if attempt is None or response.status < 200 or not self._matches(attempt.request, response):
            return
        self._attempt = None
        status = response.status
        if attempt.unregister:
            self._b.expires_at = None
            self._b.last_status = status
            if not 200 <= status < 300:
                self._b.last_error = f"un-register: {status} {response.reason}"
            self._state = "unregistered"
            return
        if 200 <= status < 300:
            self._registered(response, now)
        elif status in (401, 407):
            self._challenged(attempt, response, now)
        elif status == 423:
            self._interval_too_brief(attempt, response, now)
        else:
            retry_after = _retry_after(response) if status in (500, 503) else None
            self._fail(f"{status} {response.reason}".strip(), now, status=status, retry_after_s=retry_after)

    def request_failed(self, now: int, reason: str = "timeout", *, method: str = "REGISTER") -> None:
        """The outstanding REGISTER (or keepalive OPTIONS: `method`) got no response (Timer F) or could not
        be sent. A registrar the keepalive finds unreachable is registered with again at once."""
        if method == "OPTIONS":
            keepalive = self.keepalive
            if keepalive is not None and keepalive.request_failed(now, reason):
                if self._state == "registered" and self._attempt is None:
                    self._refresh_at = None
                    self._send(now, unregister=False)  # a lost NAT binding or a restarted registrar
            return
        attempt = self._attempt
        if attempt is None:
            return
        self._attempt = None
        if attempt.unregister:
            self._b.expires_at = None
            self._b.last_error = f"un-register: {reason}"
            self._state = "unregistered"
            return
        self._fail(f"no response from the registrar ({reason})", now, status=408)

    # --- internals ---

    @staticmethod
    def _matches(request: Request, response: Response) -> bool:
        return (response.headers.get("CSeq") or "").split()[:1] == (
            request.headers.get("CSeq") or ""
        ).split()[:1]

    def _send(
        self, now: int, *, unregister: bool, attempt: _Attempt | None = None, auth: AuthAnswer | None = None
    ) -> None:
        expires = 0 if unregister else self._expires
        self._cseq += 1
        c = self.config
        items = _out_of_dialog(c, self._transport, self._rng, self._from_tag, c.aor, self._call_id)
        items += [
            ("CSeq", f"{self._cseq} REGISTER"),
            ("Contact", f"<{c.contact}>;expires={expires}"),
            ("Expires", str(expires)),
            *_product(c),
        ]
        if auth is not None:  # the answer to the challenge just received
            items.extend(auth.headers)
        elif self._auth is not None:  # pre-emptive credentials from the last challenge (§22.3), nc+1
            pre = self._auth.authorization("REGISTER", self._registrar)
            if pre is not None:
                items.extend(pre.headers)
        request = Request("REGISTER", self._registrar, Headers(items))
        if attempt is None:
            attempt = _Attempt(request, unregister)
        else:
            attempt.request = request
        self._attempt = attempt
        self._out.append(OutgoingRequest(request, self._destination, self._transport))

    def _resend(self, attempt: _Attempt, now: int, auth: AuthAnswer | None = None) -> None:
        self._send(now, unregister=attempt.unregister, attempt=attempt, auth=auth)

    def _registered(self, response: Response, now: int) -> None:
        granted = self._granted(response)
        if self._auth is not None:
            self._auth.accepted()
        b = self._b
        if granted <= 0:  # a registrar that dropped our binding in a 2xx: try again later
            self._fail("the registrar granted no expiry", now, status=response.status)
            return
        b.granted_s = granted
        b.expires_at = now + granted * NS_PER_S
        b.failures = 0
        b.last_error = None
        b.last_status = response.status
        b.next_at = None
        refresh_in = min(granted * NS_PER_S // 2, (granted - self.config.refresh_margin_s) * NS_PER_S)
        self._refresh_at = now + max(NS_PER_S, refresh_in)
        self._state = "registered"
        if self.keepalive is not None:
            self.keepalive.arm(now)

    def _granted(self, response: Response) -> int:
        ours = _contact_key(self.config.contact)
        header = response.headers.get("Expires")
        for value in response.headers.get_all("Contact"):
            try:
                contact = parse_name_addr(value)
            except ValueError:
                continue
            if _contact_key(str(contact.uri)) == ours:
                expires = contact.param("expires")
                if expires is not None and expires.strip().isdigit():
                    return int(expires)
        if header is not None and header.strip().isdigit():
            return int(header.strip())
        return self._expires

    def _challenged(self, attempt: _Attempt, response: Response, now: int) -> None:
        if self._auth is None:
            self._fail(
                f"{response.status} {response.reason}: no credentials configured", now, status=response.status
            )
            return
        if attempt.auth_tries >= self.MAX_AUTH_TRIES:
            self._fail("bad credentials (too many challenges)", now, status=response.status)
            return
        answer = self._auth.respond(response, "REGISTER", self._registrar)
        if not isinstance(answer, AuthAnswer):
            self._auth.forget()  # the next attempt starts without stale pre-emptive credentials
            self._fail(answer.reason, now, status=response.status)
            return
        attempt.auth_tries += 1
        self._resend(attempt, now, answer)

    def _interval_too_brief(self, attempt: _Attempt, response: Response, now: int) -> None:
        value = (response.headers.get("Min-Expires") or "").strip()
        minimum = int(value) if value.isdigit() else None
        if minimum is None or minimum <= self._expires or attempt.interval_tries >= 2:
            self._fail(f"423 Interval Too Brief (Min-Expires {value or 'missing'})", now, status=423)
            return
        self._expires = minimum
        attempt.interval_tries += 1
        self._resend(attempt, now)

    def _fail(self, reason: str, now: int, *, status: int | None, retry_after_s: int | None = None) -> None:
        b = self._b
        b.failures += 1
        b.last_error = reason
        b.last_status = status
        self._state = "failed"
        self._refresh_at = None
        if self.keepalive is not None:
            self.keepalive.disarm()  # the REGISTER retries probe the registrar meanwhile
        c = self.config
        delay = min(c.backoff_max_s, c.backoff_initial_s * 2 ** min(b.failures - 1, 32))
        delay *= 1.0 - c.backoff_jitter * self._rng.random()
        if retry_after_s is not None:
            delay = max(delay, min(float(retry_after_s), c.backoff_max_s))
        b.next_at = now + max(1, int(delay * NS_PER_S))
        if b.expires_at is not None and b.expires_at <= now:
            b.expires_at = None


def _contact_key(uri: str) -> tuple[str, str, int | None]:
    """Contacts compare by scheme, user, host and port (§10.2.4 compares URIs; registrars rewrite params)."""
    try:
        parsed = parse_uri(uri.strip().strip("<>"))
    except ValueError:
        return ("", uri, None)
    return (parsed.user or "", parsed.host.lower(), parsed.port)


def _retry_after(response: Response) -> int | None:
    value = (response.headers.get("Retry-After") or "").split(";", 1)[0].split("(", 1)[0].strip()
    return int(value) if value.isdigit() else None


def _out_of_dialog(
    c: RegistrationConfig, transport: str, rng: random.Random, from_tag: str, to: str, call_id: str
) -> list[tuple[str, str]]:
    """The first headers of a REGISTER or a keepalive OPTIONS: a fresh branch, our AOR as From, `to` as To."""
    host = f"[{c.via_host}]" if ":" in c.via_host else c.via_host
    branch = f"z9hG4bK{rng.getrandbits(64):016x}"
    return [
        ("Via", f"SIP/2.0/{transport.upper()} {host}:{c.via_port};branch={branch};rport"),
        ("Max-Forwards", "70"),
        ("From", f"<{c.aor}>;tag={from_tag}"),
        ("To", f"<{to}>"),
        ("Call-ID", call_id),
    ]
