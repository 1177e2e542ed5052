"""One call's INVITE dialog, sans-I/O: the object the user agent's router (`sip.core.ua.UserAgent`) hands every
request, response and timer of that dialog to. It reads no clock: every input takes `now`; its own `deadline`
(the session timer's refresh or expiry, a glare retry) sits in the router's scheduler, which calls `fire(now)`.

A `Call` is made by the router for a new INVITE (RINGING) or by `sip.core.outbound.OutboundCall` for the 2xx to an
INVITE we sent (CONFIRMED at once). What it does (RFC 3261 §12-§15; RFC 3264, 3311, 3515, 4028):
- answer: `ring` (180), `answer` (200 with the SDP answer, or with our offer when the INVITE had none: the
  answer comes in the ACK; `CallAnswered`, then `CallConfirmed` at the ACK) or `reject`.
- the 2xx is retransmitted until the ACK (§13.3.1.4); no ACK within 64·T1 → BYE and `CallEnded(408)`.
- BYE → 200 (`CallEnded(by_remote=True)`); `bye()` sends ours (after the ACK if the 200 is still unacknowledged,
  and after the INFO digits still queued: the CallLeg contract sends every digit asked for first).
- re-INVITE and UPDATE: answered at once (no 100) from the call's local media; a=sendonly / inactive / c=0.0.0.0 →
  `CallHeld`, back → `CallResumed`, any other new SDP → `MediaUpdated` (a new codec too, within the call's RTP
  clock: the media shell re-codes in place); 488 when the new offer has nothing in common in that clock; 491 when our own re-INVITE/UPDATE is in progress (glare, §14.2; ours is retried after 0-2 s, as the
  UA that does not own the Call-ID); 500 with Retry-After when an earlier INVITE has no final response yet.
- session timers (RFC 4028, the rules in `sip.core.sessiontimer`): an interval that passes unrefreshed → BYE,
  `SessionExpired`, `CallEnded(408)`; we refresh (UPDATE when the peer allows it, else re-INVITE with our
  unchanged SDP) when we are the refresher; a refresh answered 408/481 → BYE (408) and `CallEnded`.
- OPTIONS in the dialog → 200 (a live call's keep-alive must not fail because we drain).
- INFO application/dtmf-relay (or application/dtmf) → 200 and `DtmfReceived` (no digit in it → 400); ours go
  out one INFO at a time (`send_info_dtmf`).
- REFER from the peer → 403 and `ReferRefused` (a caller must not make the bridge dial out); our `refer` →
  `ReferResponse`; NOTIFY for its implicit subscription → 200 and `ReferNotify` (the sipfrag's status); other
  NOTIFYs → 481 or 489.
- a 481 to one of our requests (not BYE, not the un-SUBSCRIBE) means the peer lost the dialog: `CallEnded(481)`.

Inputs: `IN_DIALOG`, the method table the router dispatches a peer's in-dialog request through (after the
dialog's CSeq check); `on_ack`; `on_response` (our requests'); `on_ack_timeout`; `fire`. When the call ends it
tells the router once (`UaContext.call_ended`), which forgets its routes.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import ClassVar

from rtp.units import NS_PER_S
from sip.core.app_headers import Headers as AppHeaders
from sip.core.dialog import Dialog
from sip.core.headers import parse_cseq
from sip.core.message import Request, Response, make_response, serialize
from sip.core.offer_answer import LocalMedia, NegotiatedMedia, accept_answer
from sip.core.offer_answer import answer as sdp_answer
from sip.core.offer_answer import offer as sdp_offer
from sip.core.prack import on_prack  # a ringing call's PRACK goes to its early answer (RFC 3262 §3)
from sip.core.sdp import SessionDescription, serialize_sdp
from sip.core.server_transaction import ServerInviteTransaction
from sip.core.sessiontimer import answer_timer, check_refresh, min_se, session_expires, timer_deadlines
from sip.core.transaction import ClientTransaction, Retransmit2xx, Timed
from sip.core.uabase import (
    ALLOW,
    DTMF_SIGNALS,
    SUPPORTED,
    UaContext,
    content_type,
    media_key,
    next_hop,
    parse_dtmf_info,
    parse_sdp_or_none,
    parse_sipfrag,
)
from sip.core.uaevents import (
    CallAnswered,
    CallCancelled,
    CallConfirmed,
    CallEnded,
    CallHeld,
    CallResumed,
    DtmfReceived,
    MediaUpdated,
    ReferNotify,
    ReferRefused,
    ReferResponse,
    SessionExpired,
)


class Stage(Enum):
    RINGING = "ringing"  # INVITE received, no final response
    ANSWERED = "answered"  # 2xx sent, ACK not in
    CONFIRMED = "confirmed"
    ENDING = "ending"  # ended for the application; a BYE waits for the ACK (§15.1.1)
    ENDED = "ended"


Handler = Callable[["Call", Request, str, tuple[str, int], int], None]


class Call(Timed):
    """One call (its INVITE dialog). Its `deadline` is the soonest of its session timer and glare retry."""

    IN_DIALOG: ClassVar[dict[str, Handler]]  # method → handler of a peer's in-dialog request (end of class)

    def __init__(
        self,
        ctx: UaContext,
        call_id: str,
        invite: Request,
        ist: ServerInviteTransaction | None,
        dialog: Dialog,
        source: tuple[str, int],
        transport: str,
    ) -> None:
        super().__init__()
        self._ctx = ctx
        self.id = call_id
        self.invite = invite
        self.ist = ist
        self.dialog = dialog
        self.source = source
        self.transport = transport
        self.stage = Stage.RINGING
        self.host: str | None = None  # the address in our Contact and Via for this call (None: UaConfig.host)
        self.send_to_source = False  # in-dialog requests to `source` (its trunk's NAT mode, or UaConfig's)
        self.no_contact = invite.headers.get("Contact") is None  # a broken peer: send to where it came from
        self.peer_allow = frozenset(m.strip().upper() for m in invite.headers.get_all("Allow"))
        # media
        self.offer: SessionDescription | None = None  # the peer's offer waiting for our answer
        self.local_media: LocalMedia | None = None
        self.local_sdp: SessionDescription | None = None  # what we sent last (o= version, refreshes)
        self.remote_body = b""  # the peer's last SDP body, to tell a refresh from a change
        self.media: NegotiatedMedia | None = None
        self.held = False
        self.offer_in_2xx = False  # our 2xx carried the offer (`local_sdp`): the ACK carries the answer
        # 2xx reliability (§13.3.1.4)
        self.retransmitter: Retransmit2xx | None = None
        self.ack_cseq = 0  # CSeq of the INVITE whose 2xx awaits its ACK
        # our own requests
        self.our_offer: ClientTransaction | None = None  # our re-INVITE/UPDATE in progress (glare)
        self.our_acks: dict[ClientTransaction, bytes] = {}
        self.pending: dict[ClientTransaction, str] = {}  # our requests in progress → their purpose
        self.retry_at: int | None = None
        self.bye_pending: str | None = None  # reason of a bye() that waits for the ACK
        self.bye_after_info: str | None = None  # reason of a bye() that waits for the queued INFO digits
        self.bye_headers: AppHeaders = ()  # the application's, on our BYE (sip.core.app_headers)
        self.info_queue: list[tuple[str, int]] = []
        self.info_tx: ClientTransaction | None = None
        self.refer_active = False  # our REFER's subscription may NOTIFY
        # session timer (RFC 4028)
        self.interval_s: int | None = None
        self.we_refresh = False
        self.refresh_at: int | None = None  # we send a refresh then
        self.expire_at: int | None = None  # the peer's refresh must have come by then

    @property
    def server_tx(self) -> ServerInviteTransaction:
        """The INVITE server transaction of a call we answer (calls we placed have none: never RINGING)."""
        assert self.ist is not None, "an outbound call has no INVITE server transaction"
        return self.ist

    def rearm(self) -> None:
        times = [t for t in (self.refresh_at, self.expire_at, self.retry_at) if t is not None]
        self.deadline = min(times) if times else None
        self._ctx.sched.update(self)

    @property
    def live(self) -> bool:
        """Ringing or up (what `UaConfig.max_calls` counts)."""
        return self.stage in (Stage.RINGING, Stage.ANSWERED, Stage.CONFIRMED)

    # --- commands ---

    def ring(self, now: int) -> bool:
        """180 Ringing (with our To tag and Contact)."""
        if self.stage is not Stage.RINGING:
            return False
        self._ctx.respond(
            self.server_tx,
            self.invite,
            180,
            headers=self._establishing_headers(),
            now=now,
            to_tag=self.dialog.id.local_tag,
        )
        return True

    def answer(self, local: LocalMedia, now: int) -> bool:
        """200 OK with our SDP: the answer to the INVITE's offer, or our offer when it had none
        (`CallAnswered` follows). False when the call is not ringing any more, or when the offer has nothing
        in common with `local` (then 488 went out and `CallEnded(488)` follows)."""
        if self.stage is not Stage.RINGING:
            return False
        if self.offer is not None:
            result = sdp_answer(self.offer, local)
            if result is None:
                self._ctx.stats["invite_488"] += 1
                self._ctx.respond(
                    self.server_tx,
                    self.invite,
                    488,
                    now=now,
                    to_tag=self.dialog.id.local_tag,
                    headers=(("Warning", '304 - "no common media format"'),),
                )
                self._end("no common media format", 488, by_remote=False)
                return False
            local_sdp, self.media, self.held = result.description, result.media, result.media.held
            self.offer = None
        else:
            local_sdp = sdp_offer(local)
            self.offer_in_2xx = True
        self.local_media = local
        self.local_sdp = local_sdp
        headers = self._establishing_headers() + self._session_timer_response(self.invite)
        response = make_response(
            self.invite,
            200,
            to_tag=self.dialog.id.local_tag,
            headers=headers + (("Content-Type", "application/sdp"),),
            body=serialize_sdp(local_sdp),
        )
        self._send_2xx(self.server_tx, response, now)
        self.stage = Stage.ANSWERED
        self._ctx.events.append(CallAnswered(self.id, local_sdp, self.media))
        return True

    def reject(
        self,
        status: int,
        now: int,
        *,
        reason: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> bool:
        """A final error response (300-699) to the ringing INVITE, e.g. 486, 603, 503 with Retry-After."""
        if not 300 <= status <= 699:
            raise ValueError(f"reject needs a status of 300 to 699, got {status}")
        if self.stage is not Stage.RINGING:
            return False
        self._ctx.respond(
            self.server_tx,
            self.invite,
            status,
            reason,
            headers=headers,
            now=now,
            to_tag=self.dialog.id.local_tag,
        )
        self._end(reason or f"rejected with {status}", status, by_remote=False)
        return True

    def bye(self, now: int, reason: str = "normal clearing", headers: AppHeaders = ()) -> bool:
        """End the call: BYE when answered (after the ACK if it has not come yet, §15.1.1) with `headers`
        (sip.core.app_headers, checked); a ringing call gets 480. `CallEnded(by_remote=False)` follows at once."""
        self.bye_headers = headers if self.stage in (Stage.ANSWERED, Stage.CONFIRMED) else self.bye_headers
        if self.stage is Stage.RINGING:
            return self.reject(480, now, reason="Temporarily Unavailable")
        if self.stage is Stage.ANSWERED:
            if self.info_queue:  # digits wait for the ACK, and the BYE follows the last of them
                self.bye_after_info = reason
            else:
                self.bye_pending = reason
            self.stage = Stage.ENDING
            self._ctx.events.append(CallEnded(self.id, reason, 200, by_remote=False))
            return True
        if self.stage is not Stage.CONFIRMED:
            return False
        if self.info_tx is not None:
            # INFO digits are still going out (one in flight, maybe more queued): the CallLeg contract sends
            # every digit asked for before the BYE, so the BYE follows the last INFO's final response.
            self.bye_after_info = reason
            self.stage = Stage.ENDING
            self._ctx.events.append(CallEnded(self.id, reason, 200, by_remote=False))
            return True
        self._send_bye(now)
        self._end(reason, 200, by_remote=False)
        return True

    def refer(self, target: str, now: int, extra: AppHeaders = ()) -> bool:
        """Send a REFER (RFC 3515) with Refer-To `target` (a validated sip:/sips:/tel: URI), then `extra` (checked).
        False when it cannot be sent (the call is not confirmed). Outcomes: `ReferResponse` and `ReferNotify`."""
        if self.stage is not Stage.CONFIRMED:
            return False
        refer_to = target if target.startswith("<") else f"<{target}>"
        headers = (("Refer-To", refer_to), ("Referred-By", f"<{self._ctx.local_uri(host=self.host)}>"))
        self.refer_active = False
        self._send_in_dialog("REFER", now, headers=headers + extra, purpose="REFER")
        return True

    def send_info_dtmf(self, digit: str, now: int, duration_ms: int = 160) -> bool:
        """One digit as INFO application/dtmf-relay; digits queue behind an INFO still in progress."""
        if self.stage not in (Stage.ANSWERED, Stage.CONFIRMED):
            return False
        if digit.upper() not in DTMF_SIGNALS.values():
            raise ValueError(f"not a DTMF digit: {digit!r}")
        self.info_queue.append((digit.upper(), duration_ms))  # while the ACK is not in, they wait for it
        if self.info_tx is None and self.stage is Stage.CONFIRMED:
            self._next_info(now)
        return True

    # --- requests from the peer ---

    def on_ack(self, request: Request, now: int) -> None:
        """An ACK in this dialog: the end of our 2xx's retransmissions (§13.3.1.4), maybe with the answer."""
        try:
            number, _ = parse_cseq(request.headers.get("CSeq") or "")
        except ValueError:
            number = -1
        if self.retransmitter is None or number != self.ack_cseq:
            # an ACK we already had (the peer resends it for each retransmitted 2xx) or for nothing of ours
            self._ctx.stats["ack_duplicate" if 0 < number <= self.ack_cseq else "ack_unmatched"] += 1
            return
        self._stop_2xx()
        if self.offer_in_2xx:  # the ACK carries the answer to the offer in our 2xx (RFC 3264)
            self.offer_in_2xx = False
            theirs = parse_sdp_or_none(request.body) if request.body else None
            media = accept_answer(self.local_sdp, theirs) if theirs is not None and self.local_sdp else None
            if media is None:
                self._ctx.stats["ack_without_answer"] += 1
            if self.stage is Stage.CONFIRMED and media is not None:
                self._take_media(media, request.body)
            elif media is not None:
                self.media, self.held, self.remote_body = media, media.held, request.body
        if self.stage is Stage.ANSWERED:
            self.stage = Stage.CONFIRMED
            self._ctx.events.append(CallConfirmed(self.id, self.media))
            self.start_session_timer(now)
            if self.info_queue and self.info_tx is None:  # digits asked for before the ACK came (§13.3.1.4)
                self._next_info(now)
        elif self.stage is Stage.ENDING and self.bye_pending is not None:
            self._send_bye(now)
            self._end(self.bye_pending, 200, by_remote=False, event=False)
        elif self.stage is Stage.ENDING and self.bye_after_info is not None and self.info_tx is None:
            self._next_info(now)

    def on_bye(self, request: Request, transport: str, destination: tuple[str, int], now: int) -> None:
        self._ctx.reply(request, 200, transport, destination, now)
        if self.stage is Stage.RINGING:  # a BYE on the early dialog (§15.1.2)
            self._ctx.respond(self.server_tx, self.invite, 487, now=now, to_tag=self.dialog.id.local_tag)
        was_ending = self.stage is Stage.ENDING
        self._end("remote hangup", 200, by_remote=True, event=not was_ending)

    def on_reinvite(self, request: Request, transport: str, destination: tuple[str, int], now: int) -> None:
        tx = self._ctx.layer.server_invite(request, destination, transport, now, trying=False)  # answered now
        if self._glare(reinvite=True):  # §14.2
            self._ctx.stats["glare_491"] += 1
            self._ctx.respond(tx, request, 491, now=now)
            return
        if self.stage is Stage.RINGING or self.retransmitter is not None:
            self._ctx.respond(
                tx, request, 500, now=now, headers=(("Retry-After", str(self._ctx.rng.randint(1, 10))),)
            )
            self._ctx.stats["reinvite_500"] += 1
            return
        status = self._check_refresh(request)
        if status:
            headers = (("Min-SE", str(self._ctx.config.min_se_s)),) if status == 422 else ()
            self._ctx.respond(tx, request, status, now=now, headers=headers)
            return
        body, sdp_headers, status = self._answer_offer(request)
        if status:
            self._ctx.respond(tx, request, status, now=now)
            return
        self._accept_refresh(request, now)
        response = make_response(
            request,
            200,
            headers=self._contact_headers() + self._session_timer_response(request) + sdp_headers,
            body=body,
        )
        self._send_2xx(tx, response, now)

    def on_update(self, request: Request, transport: str, destination: tuple[str, int], now: int) -> None:
        tx = self._ctx.layer.server_non_invite(request, destination, transport, now)
        if request.body and self._glare(reinvite=False):  # RFC 3311 §5.2
            self._ctx.stats["glare_491"] += 1
            self._ctx.respond(tx, request, 491, now=now)
            return
        status = self._check_refresh(request)
        if status:
            headers = (("Min-SE", str(self._ctx.config.min_se_s)),) if status == 422 else ()
            self._ctx.respond(tx, request, status, now=now, headers=headers)
            return
        body: bytes = b""
        sdp_headers: tuple[tuple[str, str], ...] = ()
        status = 0
        if request.body:
            if self.local_media is None:
                self._ctx.respond(tx, request, 500, now=now, headers=(("Retry-After", "1"),))
                return
            body, sdp_headers, status = self._answer_offer(request)
        if status:
            self._ctx.respond(tx, request, status, now=now)
            return
        self._accept_refresh(request, now)
        extra = self._contact_headers() + self._session_timer_response(request) + sdp_headers
        self._ctx.respond(tx, request, 200, now=now, headers=extra, body=body)

    def on_options(self, request: Request, transport: str, destination: tuple[str, int], now: int) -> None:
        self._ctx.reply(
            request, 200, transport, destination, now, headers=self._ctx.options_headers(transport)
        )

    def on_refer(self, request: Request, transport: str, destination: tuple[str, int], now: int) -> None:
        self._ctx.stats["refer_refused"] += 1
        self._ctx.reply(request, 403, transport, destination, now, reason="Forbidden (REFER not accepted)")
        self._ctx.events.append(ReferRefused(self.id, request.headers.get("Refer-To") or ""))

    def cancelled(self) -> None:
        """The peer's CANCEL reached the ringing INVITE (the router sent 200 and 487)."""
        self._ctx.events.append(CallCancelled(self.id))
        self._end("cancelled", 487, by_remote=True, event=False)

    def _glare(self, *, reinvite: bool) -> bool:
        """Whether a peer re-INVITE (or UPDATE with an offer) crosses a request of ours: our re-INVITE in
        progress, or our UPDATE if it carries an offer (a bare refresh UPDATE offers nothing)."""
        ours = self.our_offer
        if ours is None:
            return False
        return bool(ours.request.body) or (reinvite and ours.request.method == "INVITE")

    def _answer_offer(self, request: Request) -> tuple[bytes, tuple[tuple[str, str], ...], int]:
        """(body, headers, 0) of our answer to a re-INVITE/UPDATE, or (b"", (), status) to refuse it. A request
        without SDP gets our current SDP as an offer (its ACK brings the answer)."""
        if self.local_media is None or self.local_sdp is None:
            return b"", (), 500
        sdp_type = (("Content-Type", "application/sdp"),)
        if not request.body:
            if request.method == "INVITE":  # we offer (unchanged); the ACK answers
                self.offer_in_2xx = True
                return serialize_sdp(self.local_sdp), sdp_type, 0
            return b"", (), 0
        offer = parse_sdp_or_none(request.body)
        if offer is None:
            return b"", (), 400
        if request.body == self.remote_body:  # a refresh with the same SDP: the same answer, no event
            return serialize_sdp(self.local_sdp), sdp_type, 0
        # The media shell changes codecs within the call's RTP clock only (rtp.stream `recodec`)
        clock = self.media.clock_rate if self.media is not None else None
        result = sdp_answer(offer, self.local_media, previous=self.local_sdp, clock_rate=clock)
        if result is None:
            self._ctx.stats["reoffer_488"] += 1
            return b"", (), 488  # the old session goes on (RFC 3264 §8)
        self.local_sdp = result.description
        self._take_media(result.media, request.body)
        return serialize_sdp(result.description), sdp_type, 0

    def _take_media(self, media: NegotiatedMedia, body: bytes) -> None:
        """A new offer/answer in the confirmed call: hold, resume, or some other change."""
        before, self.media, self.remote_body = self.media, media, body
        if media.held and not self.held:
            self.held = True
            self._ctx.events.append(CallHeld(self.id, media))
        elif self.held and not media.held:
            self.held = False
            self._ctx.events.append(CallResumed(self.id, media))
        elif not self.held and (before is None or media_key(before) != media_key(media)):
            self._ctx.events.append(MediaUpdated(self.id, media))
        # held and still held (sendonly → inactive, say): no event; `CallResumed` will carry the media

    def on_info(self, request: Request, transport: str, destination: tuple[str, int], now: int) -> None:
        if not request.body:
            self._ctx.reply(request, 200, transport, destination, now)  # an INFO keep-alive
            return
        dtmf = parse_dtmf_info(content_type(request), request.body)
        if dtmf is None:
            self._ctx.stats["info_bad_dtmf"] += 1
            self._ctx.reply(request, 400, transport, destination, now, reason="Bad DTMF body")
            return
        self._ctx.reply(request, 200, transport, destination, now)
        self._ctx.events.append(DtmfReceived(self.id, dtmf[0], dtmf[1]))

    def on_notify(self, request: Request, transport: str, destination: tuple[str, int], now: int) -> None:
        event = (request.headers.get("Event") or "").split(";", 1)[0].strip().lower()
        if event != "refer":
            self._ctx.refuse(request, 489, transport, destination, now, "notify_489")
            return
        if not self.refer_active:
            self._ctx.refuse(request, 481, transport, destination, now, "notify_481")
            return
        state = (request.headers.get("Subscription-State") or "").split(";", 1)[0].strip().lower()
        terminated = state == "terminated"
        frag = parse_sipfrag(request.body) if request.body else None
        if request.body and frag is None:
            why = "Bad message/sipfrag body"
            self._ctx.refuse(request, 400, transport, destination, now, "notify_bad_sipfrag", reason=why)
            if not terminated:
                return
        else:
            self._ctx.reply(request, 200, transport, destination, now)
        if terminated:
            self.refer_active = False
        status, reason = frag if frag is not None else (0, "")
        if status >= 200 and not terminated and self.stage is Stage.CONFIRMED:
            # A final sipfrag in a NOTIFY that keeps the subscription (RFC 3515 §2.4.5 allows it): the outcome is
            # known, so end the implicit subscription as pjsua does, with a SUBSCRIBE Expires: 0 in the REFER's
            # dialog for the same Event (its id too). The notifier's last NOTIFY (terminated) is still answered 200.
            self._ctx.stats["refer_unsubscribed"] += 1
            self._send_in_dialog(
                "SUBSCRIBE",
                now,
                headers=(
                    ("Event", request.headers.get("Event") or "refer"),
                    ("Expires", "0"),
                    ("Accept", "message/sipfrag"),
                    *self._contact_headers(),
                ),
                purpose="SUBSCRIBE",
            )
        self._ctx.events.append(ReferNotify(self.id, status, reason, terminated))

    # --- session timers (RFC 4028) ---

    def _check_refresh(self, request: Request) -> int:
        status = check_refresh(request, self._ctx.config.min_se_s)
        if status == 422:
            self._ctx.stats["session_interval_422"] += 1
        return status

    def _session_timer_response(self, request: Request) -> tuple[tuple[str, str], ...]:
        """Choose the interval and refresher for `request`'s 2xx (RFC 4028 §9) and return its headers."""
        config = self._ctx.config
        self.interval_s, self.we_refresh, headers = answer_timer(
            request,
            self.interval_s,
            self.we_refresh,
            asked_s=config.session_expires_s,
            min_se_s=config.min_se_s,
        )
        return headers

    def _accept_refresh(self, request: Request, now: int) -> None:
        """A peer re-INVITE/UPDATE we answer 2xx refreshes the session (timers restart from `now`)."""
        if self.stage is Stage.CONFIRMED:
            self.start_session_timer(now)

    def start_session_timer(self, now: int) -> None:
        self.refresh_at, self.expire_at = timer_deadlines(now, self.interval_s, self.we_refresh)
        self.rearm()

    def fire(self, now: int) -> None:
        """This call's deadline: the session timer's refresh or expiry, or a glare retry (RFC 4028, §14.1)."""
        if self.stage is not Stage.CONFIRMED:
            self.refresh_at = self.expire_at = self.retry_at = None
            self.rearm()
            return
        if self.expire_at is not None and now >= self.expire_at:
            self.expire_at = None
            self._ctx.stats["session_expired"] += 1
            self._send_bye(now)
            self._ctx.events.append(SessionExpired(self.id))
            self._end("session expired", 408, by_remote=True)
            return
        if (self.refresh_at is not None and now >= self.refresh_at) or (
            self.retry_at is not None and now >= self.retry_at
        ):
            self.refresh_at = self.retry_at = None
            self._send_refresh(now)
        self.rearm()

    def _send_refresh(self, now: int) -> None:
        if self.our_offer is not None or self.interval_s is None:
            return
        # earlier refreshes' 2xx can no longer repeat
        for old in [tx for tx in self.our_acks if tx.terminated]:
            del self.our_acks[old]
            self._untrack(old)
        headers = (
            ("Session-Expires", f"{self.interval_s};refresher=uac"),
            ("Min-SE", str(self._ctx.config.min_se_s)),
            ("Supported", SUPPORTED),
        )
        if "UPDATE" in self.peer_allow:
            self.our_offer = self._send_in_dialog("UPDATE", now, headers=headers, purpose="UPDATE")
        else:
            body = serialize_sdp(self.local_sdp) if self.local_sdp is not None else b""
            self.our_offer = self._send_in_dialog(
                "INVITE",
                now,
                headers=headers,
                body=body,
                content_type="application/sdp" if body else None,
                purpose="INVITE",
            )
        # until the answer: the session must not expire on our side (we are the refresher)
        self.expire_at = now + self.interval_s * NS_PER_S
        self.rearm()

    # --- our requests ---

    def _send_in_dialog(
        self,
        method: str,
        now: int,
        *,
        headers: tuple[tuple[str, str], ...] = (),
        body: bytes = b"",
        content_type: str | None = None,
        purpose: str,
    ) -> ClientTransaction:
        destination, transport = self._next_hop()
        via = self._ctx.via(transport, self.host)
        request = self.dialog.new_request(
            method,
            via=via,
            headers=headers + self._ctx.product("User-Agent"),
            body=body,
            content_type=content_type,
        )
        tx = self._ctx.layer.send_request(request, destination, transport, now)
        self.pending[tx] = purpose
        self._ctx.owners[tx] = self
        return tx

    def _send_bye(self, now: int) -> None:
        self._send_in_dialog("BYE", now, headers=self.bye_headers, purpose="BYE")

    def _next_info(self, now: int) -> None:
        sending = self.stage is Stage.CONFIRMED or (
            self.stage is Stage.ENDING and self.bye_after_info is not None
        )
        if not self.info_queue or not sending:
            self.info_tx = None
            # the last digit is out: now the BYE
            if self.stage is Stage.ENDING and self.bye_after_info is not None:
                reason, self.bye_after_info = self.bye_after_info, None
                self._send_bye(now)
                self._end(reason, 200, by_remote=False, event=False)
            return
        digit, duration = self.info_queue.pop(0)
        body = f"Signal={digit}\r\nDuration={duration}\r\n".encode()
        self.info_tx = self._send_in_dialog(
            "INFO", now, body=body, content_type="application/dtmf-relay", purpose="INFO"
        )

    def _next_hop(self) -> tuple[tuple[str, int], str]:
        to_source = self.send_to_source or self.no_contact
        return next_hop(self.dialog, self.source, self.transport, to_fallback=to_source)

    def _contact_headers(self) -> tuple[tuple[str, str], ...]:
        return (("Contact", self.dialog.local_contact), ("Allow", ALLOW))

    def _establishing_headers(self) -> tuple[tuple[str, str], ...]:
        """Contact and Allow, and the INVITE's Record-Route fields as they came, in order: a response that
        establishes the dialog (our 180 and 200) copies them (RFC 3261 §12.1.1), so the caller's ACK, BYE
        and re-INVITEs cross every proxy that record-routed."""
        routes = tuple(("Record-Route", value) for value in self.invite.headers.get_fields("Record-Route"))
        return self._contact_headers() + routes

    def on_response(self, tx: ClientTransaction, response: Response | None, now: int) -> None:
        """A response to one of our in-dialog requests (None: Timer B/F fired, taken as 408)."""
        purpose = self.pending.get(tx)
        if purpose is None:
            return
        status = response.status if response is not None else 408
        reason = response.reason if response is not None else "Request Timeout"
        if status < 200:
            return
        if purpose == "INVITE" and response is not None and status < 300:
            first = tx not in self.our_acks
            self._ack_2xx(tx, response, now)  # every 2xx, retransmissions too (§13.2.2.4)
            if not first:
                return
            # the entry stays while the transaction (Accepted, Timer M) may pass on retransmitted 2xx
        else:
            self._untrack(tx)
        if purpose == "REFER":
            refer_sub = (
                (response.headers.get("Refer-Sub") or "true").strip().lower() != "false" if response else True
            )
            if 200 <= status < 300 and refer_sub:
                self.refer_active = True
            self._ctx.events.append(ReferResponse(self.id, status, reason, refer_sub))
        elif purpose == "INFO":
            if self.info_tx is tx:
                if self.bye_after_info is not None and status in (408, 481):
                    self.info_queue.clear()  # the peer is gone or not answering: the BYE goes now, not after more
                self._next_info(now)
        elif purpose in ("INVITE", "UPDATE"):
            self._on_refresh_response(tx, response, status, now)
            return
        if status == 481 and purpose not in ("BYE", "SUBSCRIBE") and self.stage is Stage.CONFIRMED:
            # §12.2.1.2: the peer no longer knows the dialog (a 408 to a REFER or INFO is only that
            # request's timeout: the transfer contract keeps the call up; a 481 to our un-SUBSCRIBE only
            # says the subscription is already gone, RFC 6665 §4.1.2.2)
            self._end("the caller's side lost the dialog (481)", 481, by_remote=True)

    def _ack_2xx(self, tx: ClientTransaction, response: Response, now: int) -> None:
        data = self.our_acks.get(tx)
        if data is None:
            number, _ = parse_cseq(tx.request.headers.get("CSeq") or "")
            self.dialog.refresh_target(response)
            destination, transport = self._next_hop()
            data = serialize(self.dialog.ack(number, via=self._ctx.via(transport, self.host)))
            self.our_acks[tx] = data
        destination, transport = self._next_hop()
        self._ctx.layer.send_stateless(data, destination, transport)

    def _on_refresh_response(
        self, tx: ClientTransaction, response: Response | None, status: int, now: int
    ) -> None:
        if self.our_offer is not tx:
            return
        self.our_offer = None
        if self.stage is not Stage.CONFIRMED:
            return
        if 200 <= status < 300 and response is not None:
            try:
                expires, refresher = session_expires(response)
            except ValueError:
                expires, refresher = None, None
            if expires is not None:
                self.interval_s = expires
                self.we_refresh = refresher != "uas"
            self.start_session_timer(now)
            return
        if status == 491:  # glare: we do not own the Call-ID, so retry after 0-2 s (§14.1)
            self.retry_at = now + self._ctx.rng.randrange(0, 2 * NS_PER_S)
        elif status == 422 and response is not None:
            try:
                self.interval_s = max(self.interval_s or 0, min_se(response) or 0)
            except ValueError:
                pass
            self.retry_at = now
        elif status in (405, 501) and tx.request.method == "UPDATE":
            self.peer_allow = self.peer_allow - {"UPDATE"}
            self.retry_at = now
        elif status in (408, 481):  # the dialog is gone (RFC 4028 §10, RFC 3261 §12.2.1.2)
            if status == 408:
                self._send_bye(now)
            self._end("session refresh failed", status, by_remote=True)
            return
        self.rearm()

    def on_ack_timeout(self, retransmitter: Retransmit2xx, now: int) -> None:
        """64·T1 without the ACK for our 2xx (§13.3.1.4): BYE and the call is over."""
        if self.retransmitter is not retransmitter:
            return
        self.retransmitter = None
        self._ctx.stats["ack_timeout"] += 1
        if self.stage is Stage.ENDED:
            return
        self._send_bye_now(now)
        ended = self.stage is Stage.ENDING
        self._end("no ACK for the 200 OK", 408, by_remote=True, event=not ended)

    def _send_bye_now(self, now: int) -> None:
        self.stage = Stage.CONFIRMED  # the dialog is confirmed for sending (§13.3.1.4: BYE after no ACK)
        self._send_bye(now)

    # --- call bookkeeping ---

    def _send_2xx(self, tx: ServerInviteTransaction, response: Response, now: int) -> None:
        if self._ctx.config.user_agent is not None:
            response = Response(
                response.status,
                response.reason,
                response.headers.with_header("Server", self._ctx.config.user_agent),
                response.body,
            )
        self._ctx.layer.respond(tx, response, now)
        data = tx.response_data or serialize(response)
        if self.retransmitter is not None:
            self._stop_2xx()
        r = self._ctx.layer.retransmit_2xx(data, tx.destination, tx.transport, now)
        self.retransmitter = r
        # the INVITE's CSeq (the request is gone)
        self.ack_cseq, _ = parse_cseq(response.headers.get("CSeq") or "")
        self._ctx.acks_awaited[r] = self

    def _stop_2xx(self) -> None:
        r = self.retransmitter
        if r is not None:
            self._ctx.layer.stop_2xx(r)
            self._ctx.acks_awaited.pop(r, None)
            self.retransmitter = None

    def _end(self, reason: str, status: int, *, by_remote: bool, event: bool = True) -> None:
        """The call is over: forget it (its transactions live on until their timers end)."""
        if self.stage is Stage.ENDED:
            return
        self.stage = Stage.ENDED
        self._stop_2xx()
        self.refresh_at = self.expire_at = self.retry_at = None
        self.rearm()
        self.info_queue.clear()
        for tx in [tx for tx in self.pending if tx.request.method != "BYE"]:
            self._untrack(tx)
        self._ctx.call_ended(self)
        if event:
            self._ctx.events.append(CallEnded(self.id, reason, status, by_remote))

    def _untrack(self, tx: ClientTransaction) -> None:
        self.pending.pop(tx, None)
        self._ctx.owners.pop(tx, None)


Call.IN_DIALOG = {
    "BYE": Call.on_bye,
    "INVITE": Call.on_reinvite,
    "UPDATE": Call.on_update,
    "OPTIONS": Call.on_options,
    "INFO": Call.on_info,
    "REFER": Call.on_refer,
    "NOTIFY": Call.on_notify,
    "PRACK": on_prack,
}
