"""The registrations a user agent carries (RFC 3261 §10, `sip.core.register`), sans-I/O: their REGISTERs (and a
registrar keep-alive's OPTIONS) leave in the user agent's client transactions, and the router
(`sip.core.ua.UserAgent`) hands each response or timeout back here, as it does for its calls' transactions. Their
deadlines are part of the user agent's `next_deadline`. Counters: register_timeout, keepalive_timeout."""

from __future__ import annotations

from sip.core.message import Response
from sip.core.register import Registration, RegistrationStatus
from sip.core.transaction import ClientTransaction
from sip.core.uabase import UaContext


class Registrations:
    """Every registration of one user agent and the transactions they wait on."""

    __slots__ = ("_ctx", "_all", "_tx")

    def __init__(self, ctx: UaContext) -> None:
        self._ctx = ctx
        self._all: list[Registration] = []
        self._tx: dict[ClientTransaction, Registration] = {}

    def add(self, registration: Registration, now: int) -> None:
        self._all.append(registration)
        registration.start(now)
        self._pump(registration, now)

    def status(self, now: int) -> list[RegistrationStatus]:
        return [r.status(now) for r in self._all]

    def stop_all(self, now: int) -> int:
        """REGISTER with Expires: 0 for every binding; how many went out."""
        sent = 0
        for registration in self._all:
            if registration.stop(now):
                sent += 1
            self._pump(registration, now)
        return sent

    @property
    def done(self) -> bool:
        return all(r.done for r in self._all)

    def next_deadline(self) -> int | None:
        return min((d for d in (r.next_deadline() for r in self._all) if d is not None), default=None)

    def handle_timer(self, now: int) -> None:
        for registration in self._all:
            deadline = registration.next_deadline()
            if deadline is not None and deadline <= now:
                registration.handle_timer(now)
                self._pump(registration, now)

    def on_response(self, tx: ClientTransaction, response: Response | None, now: int) -> None:
        """A response to one of their requests (None: it timed out)."""
        registration = self._tx.get(tx)
        if registration is None:
            return
        if response is None:
            self._forget(tx)
            method = tx.request.method  # REGISTER, or the registrar keepalive's OPTIONS
            self._ctx.stats["register_timeout" if method == "REGISTER" else "keepalive_timeout"] += 1
            registration.request_failed(now, "timeout", method=method)
        elif response.status >= 200:
            self._forget(tx)
            registration.receive_response(response, now)
        self._pump(registration, now)

    def _forget(self, tx: ClientTransaction) -> None:
        del self._tx[tx]
        self._ctx.owners.pop(tx, None)

    def _pump(self, registration: Registration, now: int) -> None:
        for out in registration.requests():
            tx = self._ctx.layer.send_request(out.request, out.destination, out.transport.lower(), now)
            self._tx[tx] = registration
            self._ctx.owners[tx] = self
