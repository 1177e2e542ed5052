"""RFC 3261 §17 transactions, sans-I/O: the layer that holds every transaction of one UA. No I/O, no clock.

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

The machines are sip.core.client_transaction (§17.1) and sip.core.server_transaction (§17.2); the timers, the
events, matching (§17.1.3, §17.2.3) and the choices RFC 3261 leaves open are in sip.core.transaction.
"""

from __future__ import annotations

from sip.core.client_transaction import ClientInviteTransaction, ClientNonInviteTransaction
from sip.core.message import Request, Response
from sip.core.server_transaction import ServerInviteTransaction, ServerNonInviteTransaction
from sip.core.transaction import (
    ClientTransaction,
    Outbox,
    Retransmit2xx,
    Scheduler,
    ServerTransaction,
    State,
    Timed,
    TimerConfig,
    Transaction,
    TransactionEvent,
    TransactionKey,
    Transmit,
    client_key,
    server_key,
)

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
        self._out = Outbox()

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
