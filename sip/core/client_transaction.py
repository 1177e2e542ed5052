"""RFC 3261 §17.1 client transactions, sans-I/O: the INVITE machine (§17.1.1, with RFC 6026's Accepted state and
its Timer M) and the non-INVITE one (§17.1.2). No I/O, no clock.

`TransactionLayer.send_request` (sip.core.transaction_layer) creates and starts them; responses reach them through
`TransactionLayer.receive_response`. What they share with the server side (the timers, the `Outbox`, the
events) is sip.core.transaction.

- Timer A doubles without the T2 cap (§17.1.1.2); Timer E doubles up to T2 while Trying and stays at T2 once
  Proceeding (§17.1.2.2).
- The ACK for a non-2xx final response is built and sent inside the transaction (§17.1.1.3, same branch), and
  sent again for each retransmission of that response; an ACK for a 2xx is the transaction user's.
"""

from __future__ import annotations

from sip.core.headers import Headers, parse_cseq
from sip.core.message import Request, Response, serialize
from sip.core.transaction import (
    ClientTransaction,
    Outbox,
    ResponseReceived,
    State,
    TimerConfig,
    TransactionKey,
    TransactionTimeout,
    top_via,
)


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
        out: Outbox,
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
        via = top_via(self.request)
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


def _headers(items: list[tuple[str, str]]) -> Headers:
    return Headers(items)
