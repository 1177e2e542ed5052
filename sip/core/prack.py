"""Reliable provisional responses (RFC 3262, "100rel"), sans-I/O: both sides, for the per-call objects.

As UAC (`PrackSender`, owned by `sip.core.outbound.OutboundCall`), §4: a 1xx to our INVITE that says
`Require: 100rel` and carries an `RSeq` is acknowledged with a PRACK in the early dialog the 1xx made (its To
tag; the route set its Record-Route reversed, the remote target its Contact), `RAck: <RSeq> <CSeq> INVITE`.
The first reliable 1xx of an early dialog sets its sequence; a later one is taken only with the next RSeq
(one higher): a retransmission (the same RSeq or lower) is discarded without a second PRACK (our PRACK's own
transaction retransmits it, §17.1.2), and one that skips ahead is neither acknowledged nor passed on (§4:
"MUST NOT be processed further"; the UAS retransmits it after the missing one). The PRACK's CSeq comes out
of the early dialog's; the dialog the 2xx confirms continues from there (`continue_seq`), so our first BYE
never reuses the PRACK's number. A 1xx that says `Require: 100rel` without a readable `RSeq` is taken as an
unreliable one (counted `prack_bad_rseq`): refusing the call over it would cost the caller more.

As UAS (`ReliableProvisionals`, owned by `sip.core.call.Call`), §3: when the INVITE requires 100rel, every
provisional above 100 goes reliably: `Require: 100rel` and `RSeq` (the first a random number from 1 to
2**31 - 1, then one higher each), sent through the INVITE's transaction and retransmitted at T1, doubling up
to T2 as a 2xx is (§13.3.1.4's retransmitter), until the PRACK that names it (`RAck` with its RSeq, the
INVITE's CSeq number and method) → 200 to the PRACK. One reliable provisional is outstanding at a time
(§3: "MUST NOT send a second reliable provisional response until the first is acknowledged"): a later one
waits in order. A PRACK that names none outstanding → 481 (§3). No PRACK within 64·T1 → the owner rejects
the INVITE with a 5xx (§3 "SHOULD"): 504 here, the peer (or the network to it) did not answer in time. A
2xx that answers an offer or answer carried in an unacknowledged reliable provisional waits for its PRACK
(§3: the final response "MUST NOT" be sent until then): `holds_answer`. An INVITE that only says
`Supported: 100rel` gets unreliable provisionals (the option is ours to take, and unreliable is what every
peer handles).

100rel is about the provisional responses of an INVITE: a Require: 100rel in any other request names
nothing this UA can do there (420, as before).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sip.core.dialog import Dialog
from sip.core.headers import parse_cseq
from sip.core.message import Message, Request, Response, serialize
from sip.core.server_transaction import ServerInviteTransaction
from sip.core.transaction import Retransmit2xx
from sip.core.transaction_layer import TransactionLayer

OPTION = "100rel"
MAX_RSEQ = 2**31 - 1


def lists_option(message: Message, header: str, option: str = OPTION) -> bool:
    """Whether `header` (Require, Supported; comma lists over several lines) names `option`."""
    return any(tag.strip().lower() == option for v in message.headers.get_all(header) for tag in v.split(","))


def rseq_of(response: Response) -> int | None:
    """The RSeq of a reliable provisional (§7.1: 1 to 2**31 - 1), or None when it is absent or unreadable."""
    value = (response.headers.get("RSeq") or "").strip()
    if not value.isdigit() or len(value) > 10:
        return None
    number = int(value)
    return number if 1 <= number <= MAX_RSEQ else None


def rack_of(request: Request) -> tuple[int, int, str] | None:
    """A PRACK's RAck (§7.2: "RSeq CSeq-number Method"), or None when unreadable."""
    parts = (request.headers.get("RAck") or "").split()
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or len(parts[0]) > 10:
        return None
    if len(parts[1]) > 10:
        return None
    return int(parts[0]), int(parts[1]), parts[2].upper()


# --- UAC (§4) ---


@dataclass(slots=True)
class _EarlyDialog:
    dialog: Dialog
    rseq: int  # the last in-order RSeq taken


class PrackSender:
    """The reliable provisionals of one INVITE we sent, by early dialog (To tag)."""

    __slots__ = ("early", "cseq")

    def __init__(self) -> None:
        self.early: dict[str, _EarlyDialog] = {}
        self.cseq = 0  # the INVITE's CSeq number they answer (a challenged INVITE's new one starts afresh)

    def take(
        self, invite: Request, response: Response, remote_tag: str, *, local_contact: str, transport: str
    ) -> tuple[bool, Dialog | None, int]:
        """A 1xx (above 100) to `invite`: (pass it on to the application, the early dialog to send a PRACK
        in or None, the RSeq to acknowledge). Unreliable ones pass with no PRACK."""
        if not lists_option(response, "Require") or not remote_tag:
            return True, None, 0
        rseq = rseq_of(response)
        if rseq is None:
            return True, None, -1  # -1: a reliable 1xx without a readable RSeq (counted by the caller)
        number, _ = parse_cseq(invite.headers.get("CSeq") or "1 INVITE")
        if number != self.cseq:
            self.early.clear()
            self.cseq = number
        known = self.early.get(remote_tag)
        if known is None:
            try:
                dialog = Dialog.uac(invite, response, local_contact=local_contact, transport=transport)
            except ValueError:
                return True, None, -1
            self.early[remote_tag] = _EarlyDialog(dialog, rseq)
            return True, dialog, rseq
        if rseq != known.rseq + 1:
            return False, None, 0  # a retransmission, or one ahead of a missing one (§4)
        known.rseq = rseq
        known.dialog.refresh_target(response)
        return True, known.dialog, rseq

    def prack(self, dialog: Dialog, rseq: int, *, via: str, headers: tuple[tuple[str, str], ...]) -> Request:
        """The PRACK for `rseq` in `dialog` (§7.2: RAck names the RSeq and the INVITE's CSeq)."""
        return dialog.new_request(
            "PRACK", via=via, headers=(("RAck", f"{rseq} {self.cseq} INVITE"), *headers)
        )

    def continue_seq(self, remote_tag: str, dialog: Dialog) -> None:
        """The dialog a 2xx confirmed goes on from the early dialog's CSeq (its PRACKs used the numbers)."""
        known = self.early.get(remote_tag)
        if known is not None:
            dialog.local_seq = max(dialog.local_seq, known.dialog.local_seq)


# --- UAS (§3) ---


class ReliableProvisionals:
    """The reliable provisionals of one INVITE we answer (module docstring). `send` and `on_prack` return
    what the owner acts on; its `on_ack_timeout` (the `sip.core.uabase.AckWaiter` of the retransmitter) is
    called at 64·T1 without a PRACK, and it calls `timed_out` (the owner then rejects the INVITE)."""

    __slots__ = ("rseq", "outstanding", "has_sdp", "queue", "retransmitter", "cseq")

    def __init__(self, invite: Request, rng: random.Random) -> None:
        self.rseq = rng.randint(1, MAX_RSEQ - 2**16)  # the next RSeq (§3: random; room left to count up)
        self.outstanding: int | None = None  # the RSeq sent and not yet PRACKed
        self.has_sdp = False  # the outstanding one carries an offer or answer
        self.queue: list[Response] = []  # later provisionals, waiting for the PRACK of the outstanding one
        self.retransmitter: Retransmit2xx | None = None
        self.cseq, _ = parse_cseq(invite.headers.get("CSeq") or "1 INVITE")

    @staticmethod
    def required(invite: Request) -> bool:
        """The INVITE requires reliable provisionals (Supported alone lets us choose: unreliable)."""
        return lists_option(invite, "Require")

    @property
    def holds_answer(self) -> bool:
        """A 2xx must wait: the outstanding reliable provisional carries SDP (§3), or one is queued."""
        return self.outstanding is not None and (self.has_sdp or any(r.body for r in self.queue))

    def send(
        self, layer: TransactionLayer, tx: ServerInviteTransaction, response: Response, now: int
    ) -> Retransmit2xx | None:
        """Send `response` (a 1xx above 100) reliably, or queue it behind the outstanding one. The new
        retransmitter (for the owner to register as its AckWaiter), or None."""
        if self.outstanding is not None:
            self.queue.append(response)
            return None
        return self._send(layer, tx, response, now)

    def _send(
        self, layer: TransactionLayer, tx: ServerInviteTransaction, response: Response, now: int
    ) -> Retransmit2xx:
        rseq, self.rseq = self.rseq, self.rseq + 1
        headers = response.headers.with_header("Require", OPTION).with_header("RSeq", str(rseq))
        reliable = Response(response.status, response.reason, headers, response.body)
        layer.respond(tx, reliable, now)
        self.outstanding, self.has_sdp = rseq, bool(response.body)
        data = tx.response_data or serialize(reliable)
        self.retransmitter = layer.retransmit_2xx(data, tx.destination, tx.transport, now)
        return self.retransmitter

    def acknowledge(self, request: Request, layer: TransactionLayer) -> bool:
        """A PRACK: whether it names the outstanding provisional (then its retransmission stops: 200 to the
        PRACK; else 481)."""
        rack = rack_of(request)
        if rack is None or self.outstanding is None or rack != (self.outstanding, self.cseq, "INVITE"):
            return False
        self.stop(layer)
        self.outstanding, self.has_sdp = None, False
        return True

    def send_next(
        self, layer: TransactionLayer, tx: ServerInviteTransaction, now: int
    ) -> Retransmit2xx | None:
        """After a PRACK: the next queued provisional goes out (its retransmitter), unless the INVITE has its
        final response by now."""
        if self.outstanding is not None or not self.queue:
            return None
        if tx.final_sent:
            self.queue.clear()
            return None
        return self._send(layer, tx, self.queue.pop(0), now)

    def stop(self, layer: TransactionLayer) -> None:
        """No more retransmissions (PRACKed, or the INVITE got its final response)."""
        if self.retransmitter is not None:
            layer.stop_2xx(self.retransmitter)
            self.retransmitter = None
