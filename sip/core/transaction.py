"""RFC 3261 §17 transactions, sans-I/O: the four state machines, timers A-M on an injected clock, matching.

The transaction user (the UA core, `sip.core.ua`) drives one `TransactionLayer`:

- peer requests: `layer.absorb(request, now)` first. It is True when a transaction took the request (a
  retransmission answered with the last response, an ACK for a non-2xx final): the TU does nothing more.
  Otherwise the TU creates a server transaction (`server_invite` / `server_non_invite`) and answers through
  it with `tx.respond(response, now)`; an ACK for a 2xx is never absorbed (it is the TU's, §13.3.1.4).
- peer responses: `layer.receive_response(response, now)` (False: no client transaction matched; drop it).
- TU requests: `layer.send_request(request, destination, transport, now)` returns the client transaction.
- 2xx reliability, which RFC 3261 gives the UAS core (§13.3.1.4): `layer.retransmit_2xx(...)` keeps sending a
  2xx (T1 doubling to T2) until `stop()`, or reports `AckTimeout` after 64·T1.
- time: `layer.next_deadline()` and `layer.handle_timer(now)`.
- output, pulled: `layer.transmits()` (datagrams, frozen `Transmit`) and `layer.events()` (`ResponseReceived`,
  `TransactionTimeout`, `AckTimeout`). Both drain.

Choices (RFC 3261 leaves them open):
- 100 Trying is sent by the INVITE server transaction at once, not after 200 ms: the TU needs no timer per
  call, and a retransmitted INVITE is answered with the 100 from the start.
- INVITE transactions use RFC 6026's "Accepted" state after a 2xx (Timer L server side, Timer M client side,
  both 64·T1): retransmitted INVITEs are absorbed while the UAS core resends the 2xx, and a retransmitted 2xx
  reaches the UAC core so that it sends its ACK again.
- Timer C is a proxy timer and is not implemented. Timer B/F/H still run on reliable transports (they are
  timeouts, not retransmissions); A, E and G (retransmissions) run only on unreliable ones, and D, I, J, K
  are zero on reliable ones (§17.1.1.2, §17.1.2.2, §17.2.1, §17.2.2).
- A non-INVITE server transaction the TU has not answered within 64·T1 is ended silently (not in RFC 3261,
  which expects the TU to answer; by then the client's Timer F has ended its side). The TU answers every
  non-INVITE request at once, so only a fault in it can leave one unanswered, and such a transaction had no
  deadline: it stayed for ever.
- The 2xx retransmission of §13.3.1.4 runs on every transport, as the RFC says ("independent of whatever
  transport protocols are used"): a hop further on may be UDP.
- Matching (§17.1.3, §17.2.3): by the top Via's branch and sent-by and the CSeq method (ACK matches the
  INVITE, CANCEL has its own transaction) when the branch starts with the magic cookie "z9hG4bK"; otherwise
  (RFC 2543 peers) by Request-URI, From tag, Call-ID, CSeq number and top Via, and an ACK must also carry the
  To tag of the response it acknowledges.

All times are int nanoseconds from the caller's monotonic clock; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from enum import Enum

from rtp.units import NS_PER_MS
from sip.core.headers import Headers, parse_cseq, parse_name_addr, parse_via
from sip.core.message import Request, Response, make_response, serialize

MAGIC_COOKIE = "z9hG4bK"  # RFC 3261 §8.1.1.7
RELIABLE_TRANSPORTS = frozenset({"TCP", "TLS", "SCTP", "WS", "WSS"})


def is_reliable(transport: str) -> bool:
    """True for the stream transports (no retransmissions, zero wait timers)."""
    return transport.upper() in RELIABLE_TRANSPORTS


@dataclass(frozen=True, slots=True)
class TimerConfig:
    """RFC 3261 §17.1.1.1 / Table 4 base values, in nanoseconds (defaults: T1 500 ms, T2 4 s, T4 5 s)."""

    t1: int = 500 * NS_PER_MS
    t2: int = 4000 * NS_PER_MS
    t4: int = 5000 * NS_PER_MS

    @property
    def timeout(self) -> int:
        """64·T1: Timers B, F, H, J, L, M and the 2xx-without-ACK give-up (§13.3.1.4)."""
        return 64 * self.t1

    @property
    def timer_d(self) -> int:
        """Timer D on unreliable transports: "at least 32 s" (§17.1.1.2)."""
        return max(32_000 * NS_PER_MS, self.timeout)


@dataclass(frozen=True, slots=True)
class Transmit:
    """One message for the shell to send: a UDP datagram, or bytes for the stream to `destination`.

    `destination` is (host, port) as the core resolved it from Via, Route or Contact; host may be a name for
    the shell to resolve. For a stream transport the shell should prefer the connection the peer opened from
    that address (responses go back the way the request came, §18.2.2)."""

    data: bytes
    destination: tuple[str, int]
    transport: str


class Timed:
    """Something with one deadline, fired by a `Scheduler` (transactions, the 2xx retransmitter, calls)."""

    __slots__ = ("deadline", "_sched_seq", "_sched_when")

    def __init__(self) -> None:
        self.deadline: int | None = None
        self._sched_seq = -1  # the seq of its live heap entry (-1: none)
        self._sched_when: int | None = None  # the time of that entry

    def fire(self, now: int) -> None:
        raise NotImplementedError


class Scheduler:
    """Deadlines of many `Timed` objects in one heap with lazy deletion: O(log n) per change, and
    `next_deadline()` is the heap's top (one process, hundreds of calls, no timer per call).

    A re-armed or disarmed object leaves its old entry behind (stale). Stale entries are never more than the
    live ones: when they would be, the heap is rebuilt from the live entries alone (O(n), amortised O(1) per
    change). So an object that ended early (a transaction ACKed long before its Timer H, one evicted from a
    full table) is not held by the heap until its old deadline, and a heap with nothing armed is empty."""

    __slots__ = ("_heap", "_seq", "_live")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Timed]] = []
        self._seq = itertools.count()
        self._live = 0  # objects armed (each has exactly one live entry)

    def update(self, obj: Timed) -> None:
        """(Re)arm `obj` at `obj.deadline` (None: disarm). Call after every change of the deadline; a call
        with the deadline unchanged pushes nothing (a retransmission flood does not grow the heap)."""
        if obj.deadline is not None and obj._sched_seq != -1 and obj._sched_when == obj.deadline:
            return
        was_armed = obj._sched_seq != -1
        if obj.deadline is not None:
            seq = next(self._seq)
            obj._sched_seq = seq
            obj._sched_when = obj.deadline
            heapq.heappush(self._heap, (obj.deadline, seq, obj))
            self._live += not was_armed
        else:
            obj._sched_seq = -1
            obj._sched_when = None
            self._live -= was_armed
        if len(self._heap) > 2 * self._live:
            self._compact()

    def _compact(self) -> None:
        heap: list[tuple[int, int, Timed]] = []
        for entry in self._heap:
            if self._is_live(entry):
                heap.append(entry)
            else:
                self._drop(entry)
        heapq.heapify(heap)
        self._heap = heap
        self._live = len(heap)

    @staticmethod
    def _is_live(entry: tuple[int, int, Timed]) -> bool:
        when, seq, obj = entry
        return obj._sched_seq == seq and obj.deadline == when

    def _drop(self, entry: tuple[int, int, Timed]) -> None:
        """A popped entry: if it was its object's live one (its deadline changed without `update`), the
        object counts as disarmed (the next `update` arms it again)."""
        obj = entry[2]
        if obj._sched_seq == entry[1]:
            obj._sched_seq = -1
            obj._sched_when = None
            self._live -= 1

    def next_deadline(self) -> int | None:
        heap = self._heap
        while heap:
            if self._is_live(heap[0]):
                return heap[0][0]
            self._drop(heapq.heappop(heap))
        return None

    def pop_due(self, now: int) -> list[Timed]:
        """The objects due at `now`, each once, disarmed (the caller fires them and re-arms them)."""
        due: list[Timed] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if self._is_live(entry):
                due.append(entry[2])
            self._drop(entry)
        return due

    def __len__(self) -> int:
        """Entries in the heap, stale ones included (at most twice the armed objects)."""
        return len(self._heap)


# --- matching keys (§17.1.3, §17.2.3) ---

TransactionKey = tuple[str, ...]


def _top_via(message: Request | Response) -> str | None:
    vias = message.headers.get_all("Via")
    return vias[0] if vias else None


def _tag(value: str | None) -> str:
    if value is None:
        return ""
    try:
        return parse_name_addr(value).tag or ""
    except Exception:  # a malformed From/To only makes the key worse, never an error
        return ""


def server_key(request: Request, method: str | None = None) -> TransactionKey | None:
    """The §17.2.3 key of a request (None without a usable Via or CSeq). `method` overrides the CSeq method:
    ACK is matched as "INVITE"; pass "INVITE" for a CANCEL to find the transaction it cancels (§9.2)."""
    via_value = _top_via(request)
    cseq_value = request.headers.get("CSeq")
    if via_value is None or cseq_value is None:
        return None
    try:
        via = parse_via(via_value)
        number, cseq_method = parse_cseq(cseq_value)
    except Exception:  # unmatchable, the TU treats it as new (and the parser vetted it)
        return None
    kind = method or ("INVITE" if cseq_method == "ACK" else cseq_method)
    branch = via.branch or ""
    if branch.startswith(MAGIC_COOKIE):
        sent_by = f"{via.host.lower()}:{via.port or ''}"
        return ("3261", branch, sent_by, kind)
    # RFC 2543 fallback: no usable branch. The To tag is left out so an ACK (which has ours) finds the
    # INVITE; `ServerInviteTransaction.to_tag` is compared separately.
    return (
        "2543",
        str(request.uri),
        _tag(request.headers.get("From")),
        request.headers.get("Call-ID") or "",
        str(number),
        " ".join(via_value.split()),
        kind,
    )


def client_key(message: Request | Response) -> TransactionKey | None:
    """§17.1.3: the branch of the top Via and the CSeq method (a response carries our request's Via)."""
    via_value = _top_via(message)
    cseq_value = message.headers.get("CSeq")
    if via_value is None or cseq_value is None:
        return None
    try:
        branch = parse_via(via_value).branch
        _, method = parse_cseq(cseq_value)
    except Exception:
        return None
    if not branch:
        return None
    return (branch, "INVITE" if method == "ACK" else method)


# --- events for the transaction user ---


class State(Enum):
    CALLING = "calling"
    TRYING = "trying"
    PROCEEDING = "proceeding"
    ACCEPTED = "accepted"  # RFC 6026
    COMPLETED = "completed"
    CONFIRMED = "confirmed"
    TERMINATED = "terminated"


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A response for a client transaction: each provisional, the final, and (INVITE) every 2xx."""

    transaction: ClientTransaction
    response: Response


@dataclass(frozen=True, slots=True)
class TransactionTimeout:
    """Timer B or F (a client request got no final response), or H (no ACK for our non-2xx final)."""

    transaction: Transaction
    timer: str


@dataclass(frozen=True, slots=True)
class AckTimeout:
    """64·T1 passed with no ACK for a 2xx (§13.3.1.4): the UAS core should send BYE."""

    retransmitter: Retransmit2xx


TransactionEvent = ResponseReceived | TransactionTimeout | AckTimeout


class _Outbox:
    __slots__ = ("transmits", "events")

    def __init__(self) -> None:
        self.transmits: list[Transmit] = []
        self.events: list[TransactionEvent] = []


# --- the four state machines ---


class Transaction(Timed):
    """Common state: key, where it sends, and named timers (several may run; `deadline` is the soonest)."""

    __slots__ = ("key", "destination", "transport", "reliable", "state", "timers", "_cfg", "_out", "_timers")

    def __init__(
        self,
        key: TransactionKey,
        destination: tuple[str, int],
        transport: str,
        cfg: TimerConfig,
        out: _Outbox,
    ) -> None:
        super().__init__()
        self.key = key
        self.destination = destination
        self.transport = transport
        self.reliable = is_reliable(transport)
        self.state = State.TRYING
        self._cfg = cfg
        self._out = out
        self._timers: dict[str, int] = {}

    @property
    def terminated(self) -> bool:
        return self.state is State.TERMINATED

    def timer(self, name: str) -> int | None:
        """When timer `name` ("A".."M", or "unanswered") fires, or None if it is not running."""
        return self._timers.get(name)

    def _set(self, name: str, when: int) -> None:
        self._timers[name] = when
        self.deadline = min(self._timers.values())

    def _clear(self, *names: str) -> None:
        for name in names:
            self._timers.pop(name, None)
        self.deadline = min(self._timers.values()) if self._timers else None

    def _send(self, data: bytes) -> None:
        self._out.transmits.append(Transmit(data, self.destination, self.transport))

    def _terminate(self) -> None:
        self.state = State.TERMINATED
        self._timers.clear()
        self.deadline = None

    def fire(self, now: int) -> None:
        for name, when in sorted(self._timers.items(), key=lambda item: item[1]):
            if when <= now and name in self._timers and not self.terminated:
                self._timers.pop(name)
                self._on_timer(name, now)
        self.deadline = min(self._timers.values()) if self._timers else None

    def _on_timer(self, name: str, now: int) -> None:
        raise NotImplementedError


class ClientTransaction(Transaction):
    """Base of the client transactions: the request and its serialised bytes (for retransmission)."""

    __slots__ = ("request", "data", "_interval")

    def __init__(
        self,
        key: TransactionKey,
        request: Request,
        destination: tuple[str, int],
        transport: str,
        cfg: TimerConfig,
        out: _Outbox,
    ) -> None:
        super().__init__(key, destination, transport, cfg, out)
        self.request = request
        self.data = serialize(request)
        self._interval = cfg.t1

    def receive(self, response: Response, now: int) -> None:
        raise NotImplementedError


class ClientInviteTransaction(ClientTransaction):
    """§17.1.1 (with RFC 6026): Calling → Proceeding → Accepted | Completed → Terminated."""

    __slots__ = ("ack",)

    def __init__(
        self,
        key: TransactionKey,
        request: Request,
        destination: tuple[str, int],
        transport: str,
        cfg: TimerConfig,
        out: _Outbox,
    ) -> None:
        super().__init__(key, request, destination, transport, cfg, out)
        self.ack: bytes | None = None  # the ACK of a non-2xx final, resent for each retransmission of it

    def start(self, now: int) -> None:
        self.state = State.CALLING
        self._send(self.data)
        if not self.reliable:
            self._set("A", now + self._interval)
        self._set("B", now + self._cfg.timeout)

    def receive(self, response: Response, now: int) -> None:
        status = response.status
        if self.state in (State.CALLING, State.PROCEEDING):
            if status < 200:
                self.state = State.PROCEEDING
                self._clear("A", "B")  # §17.1.1.2: no timeout in Proceeding (Timer C is a proxy's)
            elif status < 300:
                self.state = State.ACCEPTED
                self._clear("A", "B")
                self._set("M", now + self._cfg.timeout)
            else:
                self.state = State.COMPLETED
                self._clear("A", "B")
                self.ack = serialize(self._build_ack(response))
                self._send(self.ack)
                if self.reliable:
                    self._terminate()
                else:
                    self._set("D", now + self._cfg.timer_d)
            self._out.events.append(ResponseReceived(self, response))
        elif self.state is State.ACCEPTED:
            if 200 <= status < 300:  # a retransmitted (or forked) 2xx: the TU ACKs it again
                self._out.events.append(ResponseReceived(self, response))
        elif self.state is State.COMPLETED and status >= 300 and self.ack is not None:
            self._send(self.ack)  # §17.1.1.2: retransmitted final → ACK again, not reported

    def _build_ack(self, response: Response) -> Request:
        """§17.1.1.3: the ACK for a non-2xx final, in this transaction (same branch)."""
        req = self.request.headers
        headers: list[tuple[str, str]] = []
        via = _top_via(self.request)
        if via is not None:
            headers.append(("Via", via))
        headers.append(("Max-Forwards", "70"))
        for name in ("From",):
            value = req.get(name)
            if value is not None:
                headers.append((name, value))
        to = response.headers.get("To") or req.get("To")
        if to is not None:
            headers.append(("To", to))
        call_id = req.get("Call-ID")
        if call_id is not None:
            headers.append(("Call-ID", call_id))
        number, _ = parse_cseq(req.get("CSeq") or "1 INVITE")
        headers.append(("CSeq", f"{number} ACK"))
        for route in req.get_all("Route"):
            headers.append(("Route", route))
        headers.append(("Content-Length", "0"))
        return Request("ACK", self.request.uri, _headers(headers), b"")

    def _on_timer(self, name: str, now: int) -> None:
        if name == "A" and self.state is State.CALLING:
            self._send(self.data)
            self._interval *= 2  # Timer A doubles without the T2 cap (§17.1.1.2)
            self._set("A", now + self._interval)
        elif name == "B" and self.state is State.CALLING:
            self._terminate()
            self._out.events.append(TransactionTimeout(self, "B"))
        elif name in ("D", "M"):
            self._terminate()


class ClientNonInviteTransaction(ClientTransaction):
    """§17.1.2: Trying → Proceeding → Completed → Terminated."""

    __slots__ = ()

    def start(self, now: int) -> None:
        self.state = State.TRYING
        self._send(self.data)
        if not self.reliable:
            self._set("E", now + self._interval)
        self._set("F", now + self._cfg.timeout)

    def receive(self, response: Response, now: int) -> None:
        if self.state not in (State.TRYING, State.PROCEEDING):
            return  # Completed: retransmissions of the final are absorbed
        if response.status < 200:
            self.state = State.PROCEEDING
        else:
            self.state = State.COMPLETED
            self._clear("E", "F")
            if self.reliable:
                self._terminate()
            else:
                self._set("K", now + self._cfg.t4)
        self._out.events.append(ResponseReceived(self, response))

    def _on_timer(self, name: str, now: int) -> None:
        if name == "E" and self.state in (State.TRYING, State.PROCEEDING):
            self._send(self.data)
            if self.state is State.TRYING:
                self._interval = min(2 * self._interval, self._cfg.t2)
            else:
                self._interval = self._cfg.t2
            self._set("E", now + self._interval)
        elif name == "F" and self.state in (State.TRYING, State.PROCEEDING):
            self._terminate()
            self._out.events.append(TransactionTimeout(self, "F"))
        elif name == "K":
            self._terminate()


class ServerTransaction(Transaction):
    """Base of the server transactions: the request until the final response, then only that response's bytes.

    Once the final response is sent the transaction only absorbs retransmissions (answering them with the
    same bytes) and ACKs, until Timer J, H or I (64·T1 or T4 over UDP, §17.2.1, §17.2.2). It drops the parsed
    request and response then: measured through the UA, a Completed OPTIONS transaction held ~6 KB with
    them (their header lists and strings) and ~1.3 KB without; a flood keeps thousands in this state."""

    __slots__ = ("_request", "status", "response_data", "_interval")

    def __init__(
        self,
        key: TransactionKey,
        request: Request,
        destination: tuple[str, int],
        transport: str,
        cfg: TimerConfig,
        out: _Outbox,
    ) -> None:
        super().__init__(key, destination, transport, cfg, out)
        self._request: Request | None = request
        self.status: int | None = None  # of the last response sent
        self.response_data: bytes | None = None
        self._interval = cfg.t1

    @property
    def request(self) -> Request:
        """The request, while the transaction may still answer it (RuntimeError after its final response)."""
        if self._request is None:
            raise RuntimeError("a server transaction keeps its request only until its final response")
        return self._request

    @property
    def final_sent(self) -> bool:
        return self.status is not None and self.status >= 200

    def _store_and_send(self, response: Response) -> None:
        self.status = response.status
        self.response_data = serialize(response)
        if response.status >= 200:
            self._request = None
        self._send(self.response_data)

    def respond(self, response: Response, now: int) -> bool:
        """Send `response` from the TU; False (nothing sent) if a final response was already sent."""
        raise NotImplementedError

    def retransmission(self, request: Request, now: int) -> bool:
        """A request that matched this transaction; True when it is absorbed (not for the TU)."""
        raise NotImplementedError


class ServerInviteTransaction(ServerTransaction):
    """§17.2.1 (with RFC 6026): Proceeding → Accepted | Completed → Confirmed → Terminated."""

    __slots__ = ("to_tag",)

    def __init__(
        self,
        key: TransactionKey,
        request: Request,
        destination: tuple[str, int],
        transport: str,
        cfg: TimerConfig,
        out: _Outbox,
    ) -> None:
        super().__init__(key, request, destination, transport, cfg, out)
        self.to_tag: str | None = None  # the tag of our responses (RFC 2543 ACK matching)

    def start(self, now: int, *, trying: bool = True) -> None:
        self.state = State.PROCEEDING
        if trying:
            self._store_and_send(make_response(self.request, 100))  # at once; see the module docstring

    def respond(self, response: Response, now: int) -> bool:
        if self.state is not State.PROCEEDING:
            return False
        self.to_tag = _tag(response.headers.get("To")) or self.to_tag
        self._store_and_send(response)
        status = response.status
        if status < 200:
            return True
        if status < 300:
            self.state = State.ACCEPTED
            self._set("L", now + self._cfg.timeout)
        else:
            self.state = State.COMPLETED
            if not self.reliable:
                self._set("G", now + self._interval)
            self._set("H", now + self._cfg.timeout)
        return True

    def retransmission(self, request: Request, now: int) -> bool:
        if request.method == "ACK":
            if self.key[0] == "2543" and self.to_tag and _tag(request.headers.get("To")) != self.to_tag:
                return False
            if self.state is State.COMPLETED:
                self.state = State.CONFIRMED
                self._clear("G", "H")
                if self.reliable:
                    self._terminate()
                else:
                    self._set("I", now + self._cfg.t4)
                return True
            if self.state is State.CONFIRMED:
                return True
            return False  # an ACK for a 2xx is the TU's (§13.3.1.4, RFC 6026 §8.6)
        if self.state in (State.PROCEEDING, State.COMPLETED) and self.response_data is not None:
            self._send(self.response_data)
        return True  # Accepted: absorbed, the UAS core retransmits the 2xx itself

    def _on_timer(self, name: str, now: int) -> None:
        if name == "G" and self.state is State.COMPLETED and self.response_data is not None:
            self._send(self.response_data)
            self._interval = min(2 * self._interval, self._cfg.t2)
            self._set("G", now + self._interval)
        elif name == "H" and self.state is State.COMPLETED:
            self._terminate()
            self._out.events.append(TransactionTimeout(self, "H"))
        elif name in ("I", "L"):
            self._terminate()


class ServerNonInviteTransaction(ServerTransaction):
    """§17.2.2: Trying → Proceeding → Completed → Terminated."""

    __slots__ = ()

    def start(self, now: int) -> None:
        self.state = State.TRYING
        self._set("unanswered", now + self._cfg.timeout)  # see the module docstring

    def respond(self, response: Response, now: int) -> bool:
        if self.state not in (State.TRYING, State.PROCEEDING):
            return False
        self._store_and_send(response)
        if response.status < 200:
            self.state = State.PROCEEDING
            return True
        self.state = State.COMPLETED
        self._clear("unanswered")
        if self.reliable:
            self._terminate()
        else:
            self._set("J", now + self._cfg.timeout)
        return True

    def retransmission(self, request: Request, now: int) -> bool:
        if self.response_data is not None:
            self._send(self.response_data)
        return True

    def _on_timer(self, name: str, now: int) -> None:
        if name == "J" or (name == "unanswered" and self.state in (State.TRYING, State.PROCEEDING)):
            self._terminate()


class Retransmit2xx(Timed):
    """The UAS core's 2xx retransmission until the ACK (§13.3.1.4): interval T1, doubling to T2; after 64·T1
    `AckTimeout`. `stop()` when the ACK (or a BYE, or the dialog's end) arrives."""

    __slots__ = ("data", "destination", "transport", "started", "_interval", "_give_up", "_cfg", "_out")

    def __init__(
        self,
        data: bytes,
        destination: tuple[str, int],
        transport: str,
        now: int,
        cfg: TimerConfig,
        out: _Outbox,
    ) -> None:
        super().__init__()
        self.data = data
        self.destination = destination
        self.transport = transport
        self.started = now
        self._cfg = cfg
        self._out = out
        self._interval = cfg.t1
        self._give_up = now + cfg.timeout
        self.deadline = now + self._interval

    @property
    def active(self) -> bool:
        return self.deadline is not None

    def stop(self) -> None:
        self.deadline = None

    def fire(self, now: int) -> None:
        if self.deadline is None:
            return
        if now >= self._give_up:
            self.deadline = None
            self._out.events.append(AckTimeout(self))
            return
        self._out.transmits.append(Transmit(self.data, self.destination, self.transport))
        self._interval = min(2 * self._interval, self._cfg.t2)
        self.deadline = min(now + self._interval, self._give_up)


def _headers(items: list[tuple[str, str]]) -> Headers:
    return Headers(items)


# --- the layer ---


DEFAULT_MAX_LINGERING = 4096
"""Server transactions kept after their final response only to absorb retransmissions, before the oldest is
forgotten. Each lingers 64·T1 (32 s) over UDP, so this is 128 requests a second sustained (a bridge's own
traffic at 300 calls, keep-alives, BYEs, session refreshes, DTMF by INFO, is tens a second) and ~5.5 MB at
most (~1.3 KB each, measured through the UA). What a flood costs stays there after it: the interpreter
returns an arena of its small-object heap only when every block in it is free, and whatever the process
allocates during the flood that outlives it (a counter's new key, a buffer that grew) pins the arenas the
flood's transactions were in. Measured in one process: 8,192 flooded OPTIONS took +10.9 MB and gave it all back
once ended; with one lasting object allocated every 500 requests, +8.2 MB stayed."""

_LINGERING = (State.COMPLETED, State.CONFIRMED)


class TransactionLayer:
    """All transactions of one UA (see the module docstring for the loop).

    Under a flood the server transactions that have sent their final response and only answer retransmissions
    (non-INVITE Completed; INVITE Completed or Confirmed after a non-2xx, absorbing the ACK) are bounded by
    `max_lingering`: beyond it the oldest of them is ended at once and counted in `evicted`. It was the nearest to its own end; a retransmission of
    its request is then taken as a new request (an OPTIONS answered again, an INVITE refused again), which is
    what a stateless UAS does (§8.2.7). Transactions still waiting for the TU's answer, and 2xx-answered
    INVITEs (Accepted, which belong to calls, bounded by `max_calls`), are never evicted."""

    __slots__ = ("timers", "max_lingering", "evicted", "_server", "_client", "_lingering", "_sched", "_out")

    def __init__(
        self, timers: TimerConfig | None = None, *, max_lingering: int = DEFAULT_MAX_LINGERING
    ) -> None:
        if max_lingering < 1:
            raise ValueError("max_lingering must be at least 1")
        self.timers = timers or TimerConfig()
        self.max_lingering = max_lingering
        self.evicted = 0
        self._server: dict[TransactionKey, ServerTransaction] = {}
        self._client: dict[TransactionKey, ClientTransaction] = {}
        # the lingering server transactions, oldest first (all wait the same 64·T1, or T4 once ACKed)
        self._lingering: dict[ServerTransaction, None] = {}
        self._sched = Scheduler()
        self._out = _Outbox()

    def __len__(self) -> int:
        """Live transactions (server + client)."""
        return len(self._server) + len(self._client)

    # output

    def transmits(self) -> list[Transmit]:
        out, self._out.transmits = self._out.transmits, []
        return out

    def events(self) -> list[TransactionEvent]:
        out, self._out.events = self._out.events, []
        return out

    # time

    def next_deadline(self) -> int | None:
        return self._sched.next_deadline()

    def handle_timer(self, now: int) -> None:
        for obj in self._sched.pop_due(now):
            obj.fire(now)
            self._settle(obj)

    @property
    def lingering(self) -> int:
        """Server transactions that sent their final response and only absorb retransmissions now."""
        return len(self._lingering)

    def _settle(self, obj: Timed) -> None:
        if isinstance(obj, Transaction) and obj.terminated:
            table: dict[TransactionKey, ServerTransaction] | dict[TransactionKey, ClientTransaction]
            table = self._server if isinstance(obj, ServerTransaction) else self._client
            if table.get(obj.key) is obj:
                del table[obj.key]
            if isinstance(obj, ServerTransaction):
                self._lingering.pop(obj, None)
            obj.deadline = None
        elif isinstance(obj, ServerTransaction) and obj.state in _LINGERING and obj not in self._lingering:
            self._lingering[obj] = None
            if len(self._lingering) > self.max_lingering:
                self._evict_oldest()
        self._sched.update(obj)

    def _evict_oldest(self) -> None:
        oldest = next(iter(self._lingering))
        del self._lingering[oldest]
        oldest._terminate()
        if self._server.get(oldest.key) is oldest:
            del self._server[oldest.key]
        self._sched.update(oldest)
        self.evicted += 1

    # server side

    def match(self, request: Request) -> ServerTransaction | None:
        key = server_key(request)
        return self._server.get(key) if key is not None else None

    def absorb(self, request: Request, now: int) -> bool:
        """True when a server transaction took `request` (retransmission, ACK for a non-2xx final)."""
        tx = self.match(request)
        if tx is None:
            return False
        taken = tx.retransmission(request, now)
        self._settle(tx)
        return taken

    def invite_for_cancel(self, cancel: Request) -> ServerInviteTransaction | None:
        """The INVITE server transaction a CANCEL cancels (§9.2), or None (→ 481)."""
        key = server_key(cancel, "INVITE")
        tx = self._server.get(key) if key is not None else None
        return tx if isinstance(tx, ServerInviteTransaction) else None

    def server_invite(
        self, request: Request, destination: tuple[str, int], transport: str, now: int, *, trying: bool = True
    ) -> ServerInviteTransaction:
        """A new INVITE server transaction; it sends 100 Trying now (unless `trying` is False: the TU answers
        with a final response at once)."""
        key = server_key(request) or ("none", str(id(request)))
        tx = ServerInviteTransaction(key, request, destination, transport, self.timers, self._out)
        tx.start(now, trying=trying)
        self._server[key] = tx
        self._sched.update(tx)
        return tx

    def server_non_invite(
        self, request: Request, destination: tuple[str, int], transport: str, now: int
    ) -> ServerNonInviteTransaction:
        key = server_key(request) or ("none", str(id(request)))
        tx = ServerNonInviteTransaction(key, request, destination, transport, self.timers, self._out)
        tx.start(now)
        self._server[key] = tx
        self._sched.update(tx)
        return tx

    def respond(self, tx: ServerTransaction, response: Response, now: int) -> bool:
        """`tx.respond` plus timer bookkeeping (use this rather than calling the transaction directly)."""
        sent = tx.respond(response, now)
        self._settle(tx)
        return sent

    def retransmit_2xx(
        self, data: bytes, destination: tuple[str, int], transport: str, now: int
    ) -> Retransmit2xx:
        """Start the §13.3.1.4 retransmission of a 2xx already sent once (through its transaction)."""
        r = Retransmit2xx(data, destination, transport, now, self.timers, self._out)
        self._sched.update(r)
        return r

    def stop_2xx(self, retransmitter: Retransmit2xx) -> None:
        retransmitter.stop()
        self._sched.update(retransmitter)

    # client side

    def send_request(
        self, request: Request, destination: tuple[str, int], transport: str, now: int
    ) -> ClientTransaction:
        """Send `request` (its top Via must carry a fresh branch) in a new client transaction. An ACK has no
        transaction: send it with `send_stateless`."""
        key = client_key(request) or ("none", str(id(request)))
        tx: ClientInviteTransaction | ClientNonInviteTransaction
        if request.method == "INVITE":
            tx = ClientInviteTransaction(key, request, destination, transport, self.timers, self._out)
        else:
            tx = ClientNonInviteTransaction(key, request, destination, transport, self.timers, self._out)
        tx.start(now)
        self._client[key] = tx
        self._settle(tx)
        return tx

    def send_stateless(self, data: bytes, destination: tuple[str, int], transport: str) -> None:
        """Bytes outside any transaction (a 2xx ACK, a response to a request we keep no state for)."""
        self._out.transmits.append(Transmit(data, destination, transport))

    def receive_response(self, response: Response, now: int) -> bool:
        key = client_key(response)
        tx = self._client.get(key) if key is not None else None
        if tx is None:
            return False
        tx.receive(response, now)
        self._settle(tx)
        return True
