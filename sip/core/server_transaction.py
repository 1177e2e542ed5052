"""RFC 3261 §17.2 server transactions, sans-I/O: the INVITE machine (§17.2.1, with RFC 6026's Accepted state and
its Timer L) and the non-INVITE one (§17.2.2). No I/O, no clock.

`TransactionLayer.server_invite` / `server_non_invite` (sip.core.transaction_layer) create and start them; the
transaction user answers through `TransactionLayer.respond`, and `TransactionLayer.absorb` hands them the
retransmissions and ACKs that are theirs. What they share with the client side (the timers, the `Outbox`, the
events) is sip.core.transaction.

Choices (RFC 3261 leaves them open):
- 100 Trying is sent by the INVITE server transaction at once, not after 200 ms: the TU needs no timer per
  call, and a retransmitted INVITE is answered with the 100 from the start.
- A non-INVITE server transaction the TU has not answered within 64·T1 is ended silently (not in RFC 3261,
  which expects the TU to answer; by then the client's Timer F has ended its side). The TU answers every
  non-INVITE request at once, so only a fault in it can leave one unanswered, and such a transaction had no
  deadline: it stayed for ever.
"""

from __future__ import annotations

from sip.core.message import Request, Response, make_response
from sip.core.transaction import (
    Outbox,
    ServerTransaction,
    State,
    TimerConfig,
    TransactionKey,
    TransactionTimeout,
    header_tag,
)


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
        out: Outbox,
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
        self.to_tag = header_tag(response.headers.get("To")) or self.to_tag
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
            if self.key[0] == "2543" and self.to_tag and header_tag(request.headers.get("To")) != self.to_tag:
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
