"""RFC 3261 §17 transactions, sans-I/O: what the four state machines share, and the timers. No I/O, no clock.

- `TimerConfig`: T1, T2 and T4 (Table 4) and the timeouts derived from them; `Timed` and `Scheduler`: one
  deadline per object, every object of a UA in one heap (transactions, the 2xx retransmitter, calls).
- `Transaction`, `ClientTransaction` and `ServerTransaction`: the key, the state, the named timers (several may
  run; `deadline` is the soonest) and the `Outbox` the machines write to. The machines themselves are in
  sip.core.client_transaction (§17.1) and sip.core.server_transaction (§17.2); the layer that holds them, and
  that the transaction user drives, is sip.core.transaction_layer.
- `Retransmit2xx`: the 2xx retransmission that RFC 3261 gives the UAS core (§13.3.1.4), on the same scheduler.
- What comes out: `Transmit` (one message for the shell to send) and the events for the transaction user,
  `ResponseReceived`, `TransactionTimeout` and `AckTimeout`.

Choices (RFC 3261 leaves them open):
- INVITE transactions use RFC 6026's "Accepted" state after a 2xx (Timer L server side, Timer M client side,
  both 64·T1): retransmitted INVITEs are absorbed while the UAS core resends the 2xx, and a retransmitted 2xx
  reaches the UAC core so that it sends its ACK again.
- Timer C is a proxy timer and is not implemented. Timer B/F/H still run on reliable transports (they are
  timeouts, not retransmissions); A, E and G (retransmissions) run only on unreliable ones, and D, I, J, K
  are zero on reliable ones (§17.1.1.2, §17.1.2.2, §17.2.1, §17.2.2).
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
from sip.core.headers import parse_cseq, parse_name_addr, parse_via
from sip.core.message import Request, Response, serialize

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


def top_via(message: Request | Response) -> str | None:
    """The first Via value of a message, or None."""
    vias = message.headers.get_all("Via")
    return vias[0] if vias else None


def header_tag(value: str | None) -> str:
    """The tag parameter of a From or To value, "" when it has none or cannot be read."""
    if value is None:
        return ""
    try:
        return parse_name_addr(value).tag or ""
    except Exception:  # a malformed From/To only makes the key worse, never an error
        return ""


def server_key(request: Request, method: str | None = None) -> TransactionKey | None:
    """The §17.2.3 key of a request (None without a usable Via or CSeq). `method` overrides the CSeq method:
    ACK is matched as "INVITE"; pass "INVITE" for a CANCEL to find the transaction it cancels (§9.2)."""
    via_value = top_via(request)
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
        header_tag(request.headers.get("From")),
        request.headers.get("Call-ID") or "",
        str(number),
        " ".join(via_value.split()),
        kind,
    )


def client_key(message: Request | Response) -> TransactionKey | None:
    """§17.1.3: the branch of the top Via and the CSeq method (a response carries our request's Via)."""
    via_value = top_via(message)
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


class Outbox:
    """What the transactions of one layer have to send and to report, until the layer drains it."""

    __slots__ = ("transmits", "events")

    def __init__(self) -> None:
        self.transmits: list[Transmit] = []
        self.events: list[TransactionEvent] = []


# --- what the machines share ---


class Transaction(Timed):
    """Common state: key, where it sends, and named timers (several may run; `deadline` is the soonest)."""

    __slots__ = ("key", "destination", "transport", "reliable", "state", "timers", "_cfg", "_out", "_timers")

    def __init__(
        self,
        key: TransactionKey,
        destination: tuple[str, int],
        transport: str,
        cfg: TimerConfig,
        out: Outbox,
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
        out: Outbox,
    ) -> None:
        super().__init__(key, destination, transport, cfg, out)
        self.request = request
        self.data = serialize(request)
        self._interval = cfg.t1

    def receive(self, response: Response, now: int) -> None:
        raise NotImplementedError


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
        out: Outbox,
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
        out: Outbox,
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
