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

As UAS (`ReliableProvisionals`, in a ringing call's `EarlyAnswer`), §3: when the INVITE requires 100rel, every
provisional above 100 goes reliably: `Require: 100rel` and `RSeq` (the first a random number from 1 to
2**31 - 1, then one higher each), sent through the INVITE's transaction and retransmitted at T1, doubling up
to T2 as a 2xx is (§13.3.1.4's retransmitter), until the PRACK that names it (`RAck` with its RSeq, the
INVITE's CSeq number and method) → 200 to the PRACK. One reliable provisional is outstanding at a time
(§3: "MUST NOT send a second reliable provisional response until the first is acknowledged"): a later one
waits in order. A PRACK that names none outstanding → 481 (§3). No PRACK within 64·T1 → `EarlyAnswer` rejects
the INVITE with a 5xx (§3 "SHOULD"): 504 here, the peer (or the network to it) did not answer in time. A
2xx that answers an offer or answer carried in an unacknowledged reliable provisional waits for its PRACK
(§3: the final response "MUST NOT" be sent until then): `holds_answer`. An INVITE that only says
`Supported: 100rel` gets unreliable provisionals (the option is ours to take, and unreliable is what every
peer handles).

100rel is about the provisional responses of an INVITE: a Require: 100rel in any other request names
nothing this UA can do there (420, as before).

`EarlyAnswer`: what the router (`sip.core.ua.UserAgent`) keeps beside a ringing `sip.core.call.Call` whose
INVITE requires 100rel or that sends early media (`UaContext.early_answers`, until the call ends): its
reliable 180, its 183 Session Progress with the SDP answer (early media, RFC 3261 §13.3.1.1), and the 200
that must carry the same answer (RFC 3264 §5: one answer; with SDES keys, the same keys: the random bytes the
183's answer drew are drawn again for the 200's). `on_prack` is the call's PRACK handler (`Call.IN_DIALOG`).
An INVITE without an offer gets no 183 (our offer would need its answer in a PRACK: not done; it rings on).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from sip.core.dialog import Dialog
from sip.core.headers import parse_cseq
from sip.core.message import Message, Request, Response, make_response, serialize
from sip.core.offer_answer import LocalMedia, NegotiatedMedia
from sip.core.offer_answer import answer as sdp_answer
from sip.core.sdp import SessionDescription, serialize_sdp
from sip.core.server_transaction import ServerInviteTransaction
from sip.core.transaction import Retransmit2xx
from sip.core.transaction_layer import TransactionLayer
from sip.core.uabase import ALLOW, UaContext

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
    """The reliable provisionals of one INVITE we answer (module docstring), for their owner (`EarlyAnswer`):
    `send`, `acknowledge` and `send_next` return what it acts on; it is the `sip.core.uabase.AckWaiter` of
    their retransmitter, told at 64·T1 without a PRACK (then it rejects the INVITE)."""

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


class _Ringing(Protocol):
    """What `EarlyAnswer` reads of its `sip.core.call.Call` (named here: call.py imports this module)."""

    id: str
    invite: Request
    dialog: Dialog

    @property
    def server_tx(self) -> ServerInviteTransaction: ...

    def reject(
        self, status: int, now: int, *, reason: str | None = None, headers: tuple[tuple[str, str], ...] = ()
    ) -> bool: ...

    def answer(self, local: LocalMedia, now: int) -> bool: ...


class EarlyAnswer:
    """A ringing call's reliable provisionals, its 183 and its answer after them (module docstring)."""

    def __init__(self, ctx: UaContext, call: _Ringing) -> None:
        self._ctx, self._call, self._invite, self._tx = ctx, call, call.invite, call.server_tx
        self._to_tag, self._contact = call.dialog.id.local_tag, call.dialog.local_contact
        self.reliable = (
            ReliableProvisionals(call.invite, ctx.rng) if ReliableProvisionals.required(call.invite) else None
        )
        self.media: NegotiatedMedia | None = None  # what the 183 agreed
        self._keys: list[bytes] = []  # the random bytes the 183's answer drew (SDES keys)
        self.held: LocalMedia | None = None  # an answer waiting for a PRACK

    def _headers(self, sdp: bool) -> tuple[tuple[str, str], ...]:
        """Contact, Allow and the INVITE's Record-Route (RFC 3261 §12.1.1), as the call's own 180 and 200."""
        routes = tuple(("Record-Route", v) for v in self._invite.headers.get_fields("Record-Route"))
        typed = (("Content-Type", "application/sdp"),) if sdp else ()
        return (("Contact", self._contact), ("Allow", ALLOW), *routes, *typed, *self._ctx.product("Server"))

    def _send(self, status: int, body: bytes, now: int) -> None:
        response = make_response(
            self._invite, status, to_tag=self._to_tag, headers=self._headers(bool(body)), body=body
        )
        if self.reliable is None:
            self._ctx.layer.respond(self._tx, response, now)
        elif (retransmitter := self.reliable.send(self._ctx.layer, self._tx, response, now)) is not None:
            self._ctx.acks_awaited[retransmitter] = self

    def ring(self, now: int) -> bool:
        """180 Ringing, reliably, when the INVITE requires it (else False: the call's own 180 is the one)."""
        if self.reliable is not None:
            self._send(180, b"", now)
        return self.reliable is not None

    def early(self, offer: SessionDescription, local: LocalMedia, now: int) -> NegotiatedMedia | None:
        """183 Session Progress with our answer to `offer`; what it agreed (None: nothing in common, nothing
        sent). Once: a second call gives the same media."""
        if self.media is not None:
            return self.media
        draw = local.key_source

        def recorded(n: int) -> bytes:
            self._keys.append(draw(n))
            return self._keys[-1]

        result = sdp_answer(offer, replace(local, key_source=recorded))
        if result is None:
            return None
        self.media = result.media
        self._send(183, serialize_sdp(result.description), now)
        self._ctx.stats["early_media_sent"] += 1
        return result.media

    def answer(self, local: LocalMedia, now: int) -> bool:
        """Answer the call with `local` (`Call.answer`): at once, or, when its 2xx must wait for a PRACK, at the
        PRACK (RFC 3262 §3; True meanwhile). `local` draws the 183's key bytes again, so the 200 carries the
        183's answer."""
        if self.reliable is not None and self.reliable.holds_answer:
            self.held = local
            return True
        self.stop()
        if self._keys:
            again: Iterator[bytes] = iter(list(self._keys))
            draw = local.key_source
            local = replace(local, key_source=lambda n: next(again, b"") or draw(n))
        return self._call.answer(local, now)

    def on_prack(self, request: Request, transport: str, destination: tuple[str, int], now: int) -> None:
        """A PRACK in the call's dialog: 200 when it names the reliable provisional outstanding (the next
        queued one goes out, and an answer that waited for it now), else 481."""
        tx = self._ctx.layer.server_non_invite(request, destination, transport, now)
        reliable = self.reliable if not self._tx.final_sent else None
        outstanding = reliable.retransmitter if reliable is not None else None
        matched = reliable is not None and reliable.acknowledge(request, self._ctx.layer)
        if matched and outstanding is not None:
            self._ctx.acks_awaited.pop(outstanding, None)
        self._ctx.stats["prack_received" if matched else "prack_481"] += 1
        self._ctx.respond(tx, request, 200 if matched else 481, now=now)
        if not matched or reliable is None:
            return
        if (retransmitter := reliable.send_next(self._ctx.layer, self._tx, now)) is not None:
            self._ctx.acks_awaited[retransmitter] = self
        held = self.held
        if held is not None and not reliable.holds_answer:
            self.held = None
            self.answer(held, now)

    def on_ack_timeout(self, retransmitter: Retransmit2xx, now: int) -> None:
        """No PRACK within 64·T1 (§3): the INVITE is refused with 504."""
        if self.reliable is None or self.reliable.retransmitter is not retransmitter:
            return
        self.reliable.retransmitter = None
        self._ctx.stats["prack_timeout"] += 1
        self._call.reject(504, now, reason="No PRACK")

    def stop(self) -> None:
        """No more retransmissions (the final response goes out, or the call ended)."""
        if self.reliable is not None and (r := self.reliable.retransmitter) is not None:
            self._ctx.acks_awaited.pop(r, None)
            self.reliable.stop(self._ctx.layer)


class _InDialog(Protocol):
    """What `on_prack` reads of the `sip.core.call.Call` it is given."""

    id: str
    _ctx: UaContext


def on_prack(
    call: _InDialog, request: Request, transport: str, destination: tuple[str, int], now: int
) -> None:
    """`Call.IN_DIALOG`'s PRACK: to the call's early answer; a call without one gets 481 (§3: nothing to
    acknowledge)."""
    early = call._ctx.early_answers.get(call.id)
    if early is not None:
        early.on_prack(request, transport, destination, now)
    else:
        call._ctx.refuse(request, 481, transport, destination, now, "prack_481")
