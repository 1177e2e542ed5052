"""What the user agent's router (`sip.core.ua.UserAgent`) and its per-call objects (`sip.core.call.Call`, the dialog of one
call; `sip.core.outbound.OutboundCall`, a call we place until its answer) share, sans-I/O.

`UaContext` is the one place they write through: the transaction layer (what goes out), the `Scheduler` that
holds every per-call object's own deadline (the router asks it for the soonest), the counters (`stats`), the
event queue the application drains, the random source, and how we name ourselves (Via with a fresh branch,
Contact, tags, the optional Server / User-Agent field). The header helpers below read what peers send and never
raise for a bad value unless they say so.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from sip.core.dialog import Dialog
from sip.core.headers import parse_name_addr
from sip.core.message import Message, Request, Response, make_response
from sip.core.offer_answer import LocalMedia, NegotiatedMedia
from sip.core.sdp import SdpError, SessionDescription, parse_sdp
from sip.core.transaction import ClientTransaction, Retransmit2xx, Scheduler, ServerTransaction
from sip.core.transaction_layer import TransactionLayer
from sip.core.uaevents import UaConfig, UaEvent

ALLOWED = ("INVITE", "ACK", "CANCEL", "BYE", "OPTIONS", "INFO", "UPDATE", "REFER", "NOTIFY", "PRACK")
ALLOW = ", ".join(ALLOWED)
# Methods other RFCs define that this UA does not do: 405 (anything else is 501).
KNOWN_NOT_ALLOWED = frozenset({"REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE"})
SUPPORTED_OPTIONS = ("timer",)
SUPPORTED = ", ".join(SUPPORTED_OPTIONS)
DTMF_TYPES = ("application/dtmf-relay", "application/dtmf")
DTMF_SIGNALS = {str(i): str(i) for i in range(10)} | {"*": "*", "#": "#", "10": "*", "11": "#"}
DTMF_SIGNALS |= {c: c for c in "ABCD"} | {str(12 + i): c for i, c in enumerate("ABCD")}


class TransactionOwner(Protocol):
    """What sent a client transaction and takes its responses (None: it timed out, Timer B/F)."""

    def on_response(self, tx: ClientTransaction, response: Response | None, now: int) -> None: ...


class AckWaiter(Protocol):
    """The call a 2xx retransmitter belongs to, told when its ACK never came (RFC 3261 §13.3.1.4). The per-call
    objects are named here only by what the router asks of them, so this module imports neither of theirs."""

    def on_ack_timeout(self, retransmitter: Retransmit2xx, now: int) -> None: ...


class EarlyAnswering(Protocol):
    """A ringing call's early answer (`sip.core.prack.EarlyAnswer`), as the router and the call's PRACK use it."""

    def ring(self, now: int) -> bool: ...

    def early(self, offer: SessionDescription, local: LocalMedia, now: int) -> NegotiatedMedia | None: ...

    def answer(self, local: LocalMedia, now: int) -> bool: ...

    def stop(self) -> None: ...

    def on_prack(self, request: Request, transport: str, destination: tuple[str, int], now: int) -> None: ...


class UaContext:
    """The shared services of one user agent (see the module docstring). `owners` says which object (a call, an
    outbound call, the registrations) sent each client transaction still routed; `acks_awaited` which call each 2xx retransmitter belongs to.
    `call_ended` and `outbound_settled` are the router's: a call that ended, an outbound call that got its
    final response (its `call` is the answered call, or None), each said once."""

    __slots__ = (
        "config",
        "layer",
        "sched",
        "stats",
        "events",
        "rng",
        "owners",
        "acks_awaited",
        "call_ended",
        "outbound_settled",
        "early_answers",
    )

    def __init__(
        self,
        config: UaConfig,
        layer: TransactionLayer,
        rng: random.Random,
        stats: Counter[str],
        *,
        call_ended: Callable[[Any], None],  # given the `sip.core.call.Call` that ended
        outbound_settled: Callable[[Any], None],  # given the `sip.core.outbound.OutboundCall` answered
    ) -> None:
        self.config = config
        self.layer = layer
        self.sched = Scheduler()  # the per-call objects' own deadlines (calls, outbound calls)
        self.stats = stats
        self.events: list[UaEvent] = []
        self.rng = rng
        self.owners: dict[ClientTransaction, TransactionOwner] = {}
        self.acks_awaited: dict[Retransmit2xx, AckWaiter] = {}
        self.call_ended = call_ended
        self.outbound_settled = outbound_settled
        self.early_answers: dict[str, EarlyAnswering] = {}  # ringing calls' early answers (sip.core.prack)

    def via(self, transport: str, host: str | None = None) -> str:
        sent_by = self.host_port(transport, host)
        return f"SIP/2.0/{transport.upper()} {sent_by};branch=z9hG4bK{self.rng.getrandbits(64):016x};rport"

    def host_port(self, transport: str = "udp", host: str | None = None) -> str:
        host = host or self.config.host
        host = f"[{host}]" if ":" in host else host
        tls_port = self.config.tls_port
        port = tls_port if transport.lower() == "tls" and tls_port is not None else self.config.port
        return f"{host}:{port}"

    def local_uri(self, transport: str = "udp", host: str | None = None) -> str:
        suffix = "" if transport == "udp" else f";transport={transport}"
        return f"sip:{self.config.user}@{self.host_port(transport, host)}{suffix}"

    def product(self, name: str) -> tuple[tuple[str, str], ...]:
        """The Server (or User-Agent) field naming our product, or none: by default we say nothing a scanner
        could fingerprint (`UaConfig.user_agent`)."""
        return ((name, self.config.user_agent),) if self.config.user_agent is not None else ()

    def options_headers(self, transport: str) -> tuple[tuple[str, str], ...]:
        """What a 200 to OPTIONS says we do (in a dialog or out of one)."""
        return (
            ("Allow", ALLOW),
            ("Accept", "application/sdp"),
            ("Supported", SUPPORTED),
            ("Contact", f"<{self.local_uri(transport)}>"),
        )

    def new_tag(self) -> str:
        return f"{self.rng.getrandbits(64):016x}"

    def respond(
        self,
        tx: ServerTransaction,
        request: Request,
        status: int,
        reason: str | None = None,
        *,
        now: int,
        headers: tuple[tuple[str, str], ...] = (),
        to_tag: str | None = None,
        body: bytes = b"",
    ) -> None:
        extra = headers + self.product("Server")
        response = make_response(request, status, reason, to_tag=to_tag, headers=extra, body=body)
        self.layer.respond(tx, response, now)

    def reply(
        self,
        request: Request,
        status: int,
        transport: str,
        destination: tuple[str, int],
        now: int,
        *,
        reason: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        to_tag: str | None = None,
        body: bytes = b"",
    ) -> ServerTransaction:
        """Answer `request` in a new server transaction (so retransmissions get the same answer)."""
        tx: ServerTransaction
        if request.method == "INVITE":
            tx = self.layer.server_invite(request, destination, transport, now, trying=False)
        else:
            tx = self.layer.server_non_invite(request, destination, transport, now)
        if to_tag is None and status >= 200 and status != 100 and not tag_of(request.headers.get("To")):
            to_tag = self.new_tag()
        self.respond(tx, request, status, reason, headers=headers, now=now, to_tag=to_tag, body=body)
        return tx

    def refuse(
        self,
        request: Request,
        status: int,
        transport: str,
        destination: tuple[str, int],
        now: int,
        counter: str,
        headers: tuple[tuple[str, str], ...] = (),
        reason: str | None = None,
    ) -> int:
        """`reply` with an error status, counted in `stats[counter]`; the status."""
        self.stats[counter] += 1
        self.reply(request, status, transport, destination, now, reason=reason, headers=headers)
        return status


def next_hop(
    dialog: Dialog, fallback: tuple[str, int], transport: str, *, to_fallback: bool
) -> tuple[tuple[str, int], str]:
    """Where an in-dialog request goes, and over what: §8.1.2 (`Dialog.next_hop`), but to `fallback` (where
    the dialog's INVITE came from, or went to) over `transport` when `to_fallback` (NAT: `send_to_source`, or
    a peer without Contact) and there is no route set, or when the dialog names no SIP host."""
    if to_fallback and not dialog.route_set:
        return fallback, transport
    destination, hop_transport = dialog.next_hop()
    if not destination[0]:
        return fallback, transport
    return destination, hop_transport.lower()


# --- reading what peers send ---


def has_option(message: Message, header: str, option: str) -> bool:
    return any(v.strip().lower() == option for v in message.headers.get_all(header))


def tag_of(value: str | None) -> str:
    if not value:
        return ""
    try:
        return parse_name_addr(value).tag or ""
    except ValueError:
        return ""


def parse_sdp_or_none(body: bytes) -> SessionDescription | None:
    try:
        return parse_sdp(body)
    except (SdpError, ValueError):
        return None


def media_key(media: NegotiatedMedia) -> tuple[object, ...]:
    """What the media shell acts on: a change in any of these is a `MediaUpdated`."""
    return (
        media.codec,
        media.payload_type,
        media.telephone_event,
        media.remote_address,
        media.remote_port,
        media.direction,
    )


def content_type(message: Message) -> str:
    return (message.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()


def parse_sipfrag(body: bytes) -> tuple[int, str] | None:
    """The status line of a message/sipfrag body (RFC 3420): "SIP/2.0 180 Ringing" → (180, "Ringing")."""
    line = body.split(b"\n", 1)[0].strip().decode("utf-8", "replace")
    parts = line.split(" ", 2)
    if len(parts) < 2 or parts[0].upper() != "SIP/2.0" or not parts[1].isdigit() or len(parts[1]) != 3:
        return None
    status = int(parts[1])
    if not 100 <= status <= 699:
        return None
    return status, parts[2].strip() if len(parts) > 2 else ""


def parse_dtmf_info(content_type: str, body: bytes) -> tuple[str, int] | None:
    """(digit, duration ms) of an INFO body: application/dtmf-relay ("Signal=5\\r\\nDuration=160") or
    application/dtmf ("5"); None when no DTMF digit is in it."""
    text = body.decode("utf-8", "replace")
    if content_type == "application/dtmf":
        signal, duration = text.strip(), 160
    else:
        signal, duration = "", 160
        for line in text.splitlines():
            name, _, value = line.partition("=")
            key = name.strip().lower()
            if key == "signal":
                signal = value.strip()
            elif key == "duration" and value.strip().isdigit():
                duration = int(value.strip())
    digit = DTMF_SIGNALS.get(signal.upper())
    return (digit, duration) if digit is not None else None
