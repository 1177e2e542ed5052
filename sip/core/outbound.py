"""A call we place (UAC, RFC 3261 §8.1, §9.1, §13.2, §22), sans-I/O, from `UserAgent.dial` until its final
response: the INVITE, its digest retries, its CANCEL and the 2xx (or 2xxs: a fork) that answer it. Every input
takes `now`; its own `deadline` (the ringing timeout, the give-up after a CANCEL) sits in the router's
scheduler, which calls `fire(now)`. The router routes the responses of its transactions to `on_response`.

- The INVITE offers a session timer (RFC 4028 §7.1: Supported: timer, Session-Expires `session_expires_s`,
  Min-SE `min_se_s`; none with 0); a 422 → the INVITE again with the 422's Min-SE as both (§7.4, at most
  twice); a 2xx with refresher=uac (or none named) makes us the refresher, refresher=uas the callee; a 2xx
  without Session-Expires means no timer (§7.2).
- A 1xx above 100 → `CallProgress` (early media when it carries an SDP answer, a 180 as much as a 183); the
  2xx → ACK (again for each retransmitted 2xx) and `CallConfirmed`: from then on the call is a
  `sip.core.call.Call` like an answered inbound one (BYE either way, re-INVITE/UPDATE, INFO, REFER, session
  timers from the 2xx's Session-Expires).
- Reliable provisionals (RFC 3262): the INVITE says `Supported: 100rel`; a 1xx with `Require: 100rel` and an
  RSeq gets its PRACK in its early dialog (`sip.core.prack.PrackSender`: the order rules, the retransmissions
  discarded); the PRACK's 200 is counted (`prack_200`), any other final (`prack_failed`) changes nothing: the
  INVITE's own final response decides the call.
- A non-2xx final → `CallEnded(status_code=that status, by_remote=True)`; 401/407 → the INVITE again with
  credentials (`sip.core.auth.DigestClient`, a new branch and CSeq, the same Call-ID and From tag), and
  `CallEnded(401/407, "bad credentials")` when they are refused (at most three tries); Timer B →
  `CallEnded(408)`; the ringing timeout → CANCEL and `CallEnded(408, "no answer ...")`; `cancel()` → CANCEL
  once a 1xx came (§9.1: not before), `CallEnded(487, by_remote=False)` at the 487 (or 64·T1 later).
- A 2xx that crosses our CANCEL, or a second 2xx from a fork, is ACKed and BYEd (§13.2.2.4).

When it has its final outcome it tells the router once (`UaContext.outbound_settled`): `call` is then the
answered `Call`, or None. It stays the owner of its transactions after that, so a 2xx retransmitted (or forked)
later is still ACKed.

Headers the application sets on the INVITE (`check_headers`, applied by `place`): the one validator of
`sip.core.app_headers.check_app_headers` (a token name the stack does not own, no CR, LF, NUL or control
character in a value, at most 16 headers, 1,024 bytes a value, 2,048 in all), refused with a ValueError, never
silently dropped; they go in the order given, after the UA's own headers and before Content-Type. A CANCEL
of this INVITE carries none of them (§9.1: it copies only the INVITE's Request-URI, Call-ID, To, From and
CSeq number), nor does the ACK of a non-2xx (§17.1.1.3, the transaction's own).
"""

from __future__ import annotations

from rtp.units import NS_PER_S
from sip.core.app_headers import check_app_headers
from sip.core.auth import AuthAnswer, Credentials, DigestClient
from sip.core.call import Call, Stage
from sip.core.dialog import Dialog
from sip.core.headers import Headers, parse_cseq
from sip.core.message import Request, Response, serialize
from sip.core.offer_answer import LocalMedia, NegotiatedMedia, accept_answer
from sip.core.offer_answer import offer as sdp_offer
from sip.core.prack import OPTION as RELIABLE_PROVISIONALS
from sip.core.prack import PrackSender
from sip.core.sdp import SessionDescription, serialize_sdp
from sip.core.sessiontimer import min_se, offered_timer, session_expires, session_expires_or_none
from sip.core.transaction import ClientTransaction, Timed
from sip.core.uabase import ALLOW, SUPPORTED, UaContext, content_type, next_hop, parse_sdp_or_none, tag_of
from sip.core.uaevents import CallConfirmed, CallEnded, CallProgress
from sip.core.uri import parse_uri

check_headers = check_app_headers  # the name `dial` and the API have always imported


class OutboundCall(Timed):
    """A call we placed (`dial`) until its final response: the INVITE in progress and how to retry or cancel
    it. Its `deadline` is the soonest of the ringing timeout and the give-up after a CANCEL (§9.1)."""

    def __init__(
        self,
        ctx: UaContext,
        call_id: str,
        invite: Request,
        local: LocalMedia,
        local_sdp: SessionDescription,
        destination: tuple[str, int],
        transport: str,
        auth: DigestClient | None,
    ) -> None:
        super().__init__()
        self._ctx = ctx
        self.id = call_id
        self.invite = invite  # the INVITE now in progress (a challenge replaces it)
        self.tx: ClientTransaction | None = None
        self.local = local
        self.local_sdp = local_sdp
        self.destination = destination
        self.transport = transport
        self.auth = auth
        self.auth_tries = 0
        self.timer_retries = 0  # INVITEs sent again for a 422 (RFC 4028 §7.4)
        self.provisional = False  # a 1xx came: a CANCEL may go out (§9.1)
        self.cancel_reason: str | None = None  # set when we cancel (or the ringing timeout did)
        self.cancel_status = 487
        self.cancel_sent = False
        self.ring_at: int | None = None
        self.give_up_at: int | None = None
        self.early: NegotiatedMedia | None = None
        self.prack = PrackSender()  # reliable provisionals (RFC 3262 §4)
        self.call: Call | None = None  # the call its 2xx made
        # remote tag → the ACK of that 2xx and where it went (sent again for each retransmission of the 2xx)
        self.ack: dict[str, tuple[bytes, tuple[str, int], str]] = {}
        self.ended = False

    def rearm(self) -> None:
        times = [t for t in (self.ring_at, self.give_up_at) if t is not None]
        self.deadline = min(times) if times else None
        self._ctx.sched.update(self)

    @classmethod
    def place(
        cls,
        ctx: UaContext,
        call: str,
        target: str,
        local: LocalMedia,
        now: int,
        *,
        from_uri: str | None = None,
        display: str | None = None,
        credentials: Credentials | None = None,
        destination: tuple[str, int] | None = None,
        transport: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        ring_timeout_s: float | None = None,
    ) -> OutboundCall:
        """Place a call to `target` (a sip:/sips: URI) with our SDP offer from `local`, known as `call`.

        Events: `CallProgress` for each 1xx above 100 (with early media when a 183 carries an answer), then
        `CallConfirmed(media)` once a 2xx came and our ACK went out (the call is up, as an answered inbound
        call is), or `CallEnded(status_code=the final status)` for a failure: 486 busy, 408 when nothing
        answered (Timer B) or `ring_timeout_s` passed (then we CANCEL), 487 after `cancel`, 401/407
        "bad credentials" when a challenge could not be answered. 401/407 with `credentials` → the INVITE is
        sent again with them (a new CSeq, `sip.core.auth.DigestClient`). `destination` overrides where the INVITE
        goes (an outbound proxy; default the target's host and port, a name for the shell to resolve);
        `from_uri` is our identity (default sip:USER@HOST of the config; trunks often want the account)."""
        uri = parse_uri(target)  # ValueError for a bad target: a misuse
        headers = check_headers(headers)  # ValueError: nothing is sent
        if uri.scheme not in ("sip", "sips"):
            raise ValueError(f"dial needs a sip: or sips: URI, got {target!r}")
        tp = (transport or uri.transport or ("tls" if uri.scheme == "sips" else "udp")).lower()
        if destination is None:
            destination = (uri.param("maddr") or uri.host, uri.port or (5061 if tp == "tls" else 5060))
        offer_sdp = sdp_offer(local)
        ours = from_uri or f"sip:{ctx.config.user}@{ctx.host_port()}"
        name = f'"{display}" ' if display else ""
        items: list[tuple[str, str]] = [
            ("Via", ctx.via(tp)),
            ("Max-Forwards", "70"),
            ("From", f"{name}<{ours}>;tag={ctx.new_tag()}"),
            ("To", f"<{target}>"),
            ("Call-ID", f"{ctx.rng.getrandbits(96):024x}@{ctx.config.host}"),
            ("CSeq", "1 INVITE"),
            ("Contact", f"<{ctx.local_uri(tp)}>"),
            ("Allow", ALLOW),
            ("Supported", f"{SUPPORTED}, {RELIABLE_PROVISIONALS}"),  # we PRACK (RFC 3262 §4)
            *offered_timer(ctx.config.session_expires_s, ctx.config.min_se_s),
            *ctx.product("User-Agent"),
            *headers,
            ("Content-Type", "application/sdp"),
        ]
        invite = Request("INVITE", target, Headers(items), serialize_sdp(offer_sdp))
        auth = DigestClient(credentials, rng=ctx.rng) if credentials is not None else None
        o = cls(ctx, call, invite, local, offer_sdp, destination, tp, auth)
        if ring_timeout_s is not None:
            o.ring_at = now + int(ring_timeout_s * NS_PER_S)
        ctx.stats["calls_out"] += 1
        o._send_invite(now)
        o.rearm()
        return o

    def cancel(self, now: int, reason: str = "cancelled") -> bool:
        """CANCEL a call we placed that has no final response yet (§9.1: sent once a 1xx came). Its
        `CallEnded(487, by_remote=False)` follows with the 487 (or 64·T1 later without one)."""
        if self.ended or self.cancel_reason is not None:
            return False
        self.cancel_reason = reason
        self._cancel_if_possible(now)
        return True

    def on_response(self, tx: ClientTransaction, response: Response | None, now: int) -> None:
        """A response to our INVITE or CANCEL (None: its Timer B/F fired). The CANCEL's decides nothing: the
        INVITE's 487 or 2xx does."""
        if response is None:
            if tx.request.method == "INVITE" and tx is self.tx and not self.ended and self.call is None:
                if self.cancel_reason is not None:
                    self._outbound_end(self.cancel_reason, self.cancel_status, by_remote=False)
                else:
                    self._outbound_end("no response (timeout)", 408, by_remote=True)
        elif tx.request.method == "INVITE":
            self._outbound_response(tx, response, now)
        elif tx.request.method == "PRACK" and response.status >= 200:
            self._ctx.stats["prack_200" if response.status < 300 else "prack_failed"] += 1

    def _send_invite(self, now: int) -> None:
        tx = self._ctx.layer.send_request(self.invite, self.destination, self.transport, now)
        self.tx = tx
        self._ctx.owners[tx] = self

    def _cancel_if_possible(self, now: int) -> None:
        """§9.1: a CANCEL for the INVITE in progress once a provisional response came (not before)."""
        if self.cancel_sent or not self.provisional or self.tx is None or self.call is not None:
            return
        invite = self.tx.request
        h = invite.headers
        items: list[tuple[str, str]] = [("Via", h.get_fields("Via")[0]), ("Max-Forwards", "70")]
        for name in ("From", "To", "Call-ID"):
            items.append((name, h.get(name) or ""))
        number, _ = parse_cseq(h.get("CSeq") or "1 INVITE")
        items.append(("CSeq", f"{number} CANCEL"))
        items.extend(("Route", route) for route in h.get_fields("Route"))
        items.extend(self._ctx.product("User-Agent"))
        cancel = Request("CANCEL", invite.uri, Headers(items))
        tx = self._ctx.layer.send_request(cancel, self.destination, self.transport, now)
        self._ctx.owners[tx] = self
        self.cancel_sent = True
        # §9.1: no final 64·T1 after the CANCEL → over
        self.give_up_at = now + self._ctx.config.timers.timeout
        self.rearm()
        self._ctx.stats["cancel_sent"] += 1

    def fire(self, now: int) -> None:
        """Its deadline: the ringing timeout (CANCEL, or the end when nothing answered) or the give-up."""
        if self.ended or self.call is not None:
            self.ring_at = self.give_up_at = None
            self.rearm()
            return
        if self.give_up_at is not None and now >= self.give_up_at:
            self.give_up_at = None
            self._outbound_end(self.cancel_reason or "cancelled", self.cancel_status, by_remote=False)
            return
        if self.ring_at is not None and now >= self.ring_at:
            self.ring_at = None
            if self.cancel_reason is None:
                self._ctx.stats["ring_timeout"] += 1
                self.cancel_reason, self.cancel_status = "no answer (ringing timeout)", 408
                if self.provisional:
                    self._cancel_if_possible(now)
                else:  # nothing answered at all: no CANCEL may go out; the call is over for us
                    self._outbound_end(self.cancel_reason, 408, by_remote=False)
        self.rearm()

    def _outbound_response(self, tx: ClientTransaction, response: Response, now: int) -> None:
        status = response.status
        if 200 <= status < 300:
            self._outbound_2xx(tx, response, now)
            return
        if tx is not self.tx or self.call is not None:
            return  # an earlier (challenged) INVITE's response, or one after the answer
        if self.ended:  # over for the application (the ringing timeout came before any 1xx): CANCEL it now
            if status > 100 and status < 200 and self.cancel_reason is not None:
                self.provisional = True
                self._cancel_if_possible(now)
            return
        if status < 200:
            if status == 100:
                return
            self.provisional = True
            if not self._prack(tx.request, response, now):
                return  # a reliable 1xx seen already, or one out of order (RFC 3262 §4)
            early: NegotiatedMedia | None = None
            if response.body and content_type(response) == "application/sdp":
                theirs = parse_sdp_or_none(response.body)
                early = accept_answer(self.local_sdp, theirs) if theirs is not None else None
                if early is not None:
                    self.early = early
            self._ctx.stats["early_media" if early is not None else "call_progress"] += 1
            self._ctx.events.append(CallProgress(self.id, status, response.reason, early))
            if self.cancel_reason is not None:
                self._cancel_if_possible(now)
            return
        if status == 422 and self.cancel_reason is None and self.timer_retries < 2:  # RFC 4028 §7.4
            try:
                wanted = min_se(response)
            except ValueError:
                wanted = None
            expires, _ = session_expires_or_none(self.invite)
            if wanted is not None and expires is not None and wanted > expires:
                self.timer_retries += 1
                self._resend_invite(now, offered_timer(wanted, self._ctx.config.min_se_s, min_se=wanted))
                return
        if status in (401, 407) and self.cancel_reason is None:
            if self.auth is None:
                self._outbound_end(f"{response.reason} (no credentials)", status, by_remote=True)
                return
            answer = self.auth.respond(response, "INVITE", self.invite.uri, self.invite.body)
            if not isinstance(answer, AuthAnswer) or self.auth_tries >= 3:
                reason = answer.reason if not isinstance(answer, AuthAnswer) else "bad credentials"
                self._ctx.stats["auth_refused"] += 1
                self._outbound_end(reason, status, by_remote=True)
                return
            self.auth_tries += 1
            self._retry_invite(answer, now)
            return
        if self.cancel_reason is not None:
            self._outbound_end(self.cancel_reason, self.cancel_status, by_remote=False)
        else:
            self._outbound_end(f"{status} {response.reason}".strip(), status, by_remote=True)

    def _prack(self, invite: Request, response: Response, now: int) -> bool:
        """PRACK a reliable 1xx (RFC 3262 §4); whether the 1xx is new (to pass on to the application)."""
        remote_tag = tag_of(response.headers.get("To"))
        local_contact = f"<{self._ctx.local_uri(self.transport)}>"
        new, dialog, rseq = self.prack.take(
            invite, response, remote_tag, local_contact=local_contact, transport=self.transport
        )
        if rseq < 0:
            self._ctx.stats["prack_bad_rseq"] += 1
        if dialog is None or rseq <= 0:
            return new
        to_source = self._ctx.config.send_to_source
        destination, transport = next_hop(dialog, self.destination, self.transport, to_fallback=to_source)
        prack = self.prack.prack(
            dialog, rseq, via=self._ctx.via(transport), headers=self._ctx.product("User-Agent")
        )
        tx = self._ctx.layer.send_request(prack, destination, transport, now)
        self._ctx.owners[tx] = self
        self._ctx.stats["prack_sent"] += 1
        return new

    def _retry_invite(self, answer: AuthAnswer, now: int) -> None:
        """The INVITE again with credentials: a new branch and CSeq, the same Call-ID and From tag (§22.2)."""
        headers = self.invite.headers.without("Authorization").without("Proxy-Authorization")
        self.invite = Request("INVITE", self.invite.uri, headers, self.invite.body)
        self._resend_invite(now, answer.headers, replace=False)

    def _resend_invite(self, now: int, fields: tuple[tuple[str, str], ...], *, replace: bool = True) -> None:
        """The INVITE again with `fields` (replacing those of the same name, or added): a new branch and CSeq,
        the same Call-ID and From tag (§22.2, RFC 4028 §7.4)."""
        old = self.invite
        number, _ = parse_cseq(old.headers.get("CSeq") or "1 INVITE")
        headers = old.headers.replaced("Via", self._ctx.via(self.transport)).replaced(
            "CSeq", f"{number + 1} INVITE"
        )
        for name, value in fields:
            headers = headers.replaced(name, value) if replace else headers.with_header(name, value)
        self.invite = Request("INVITE", old.uri, headers, old.body)
        self.provisional = False
        self._send_invite(now)

    def _outbound_2xx(self, tx: ClientTransaction, response: Response, now: int) -> None:
        remote_tag = tag_of(response.headers.get("To"))
        sent = self.ack.get(remote_tag)
        if sent is not None:  # a retransmitted 2xx: the same ACK again, the same way (§13.2.2.4)
            self._ctx.layer.send_stateless(*sent)
            return
        try:
            dialog = Dialog.uac(
                tx.request,
                response,
                local_contact=f"<{self._ctx.local_uri(self.transport)}>",
                transport=self.transport,
            )
        except ValueError:
            self._ctx.stats["malformed_2xx"] += 1
            return
        number, _ = parse_cseq(tx.request.headers.get("CSeq") or "1 INVITE")
        self.prack.continue_seq(remote_tag, dialog)  # after the PRACKs of its early dialog (RFC 3262 §4)
        to_source = self._ctx.config.send_to_source
        destination, transport = next_hop(dialog, self.destination, self.transport, to_fallback=to_source)
        data = serialize(dialog.ack(number, via=self._ctx.via(transport)))
        self.ack[remote_tag] = (data, destination, transport)
        self._ctx.layer.send_stateless(data, destination, transport)
        if self.call is not None or self.ended or self.cancel_reason is not None:
            # a second dialog (a fork) or an answer that crossed our CANCEL: ACK it, then BYE it (§13.2.2.4)
            self._ctx.stats["outbound_2xx_bye"] += 1
            bye = dialog.new_request(
                "BYE", via=self._ctx.via(transport), headers=self._ctx.product("User-Agent")
            )
            self._ctx.layer.send_request(bye, destination, transport, now)
            if not self.ended and self.call is None:
                self._outbound_end(self.cancel_reason or "cancelled", self.cancel_status, by_remote=False)
            return
        c = Call(self._ctx, self.id, tx.request, None, dialog, self.destination, self.transport)
        c.send_to_source = self._ctx.config.send_to_source
        c.stage = Stage.CONFIRMED
        c.no_contact = response.headers.get("Contact") is None
        c.peer_allow = frozenset(m.strip().upper() for m in response.headers.get_all("Allow"))
        c.local_media, c.local_sdp = self.local, self.local_sdp
        theirs = parse_sdp_or_none(response.body) if response.body else None
        media = accept_answer(self.local_sdp, theirs) if theirs is not None else self.early
        if media is None:
            self._ctx.stats["answer_without_sdp"] += 1
        c.media, c.held, c.remote_body = media, bool(media and media.held), response.body
        try:
            expires, refresher = session_expires(response)
        except ValueError:
            expires, refresher = None, None
        if expires is not None:  # RFC 4028 §7.2: the 2xx names the refresher; we refresh unless it is the UAS
            c.interval_s = max(expires, self._ctx.config.min_se_s)
            c.we_refresh = refresher != "uas"
        self.call = c
        self.ring_at = self.give_up_at = None
        self.rearm()
        self._ctx.outbound_settled(self)  # the router keeps `c` from now on
        self._ctx.stats["calls_out_answered"] += 1
        self._ctx.events.append(CallConfirmed(self.id, media))
        c.start_session_timer(now)

    def _outbound_end(self, reason: str, status: int, *, by_remote: bool) -> None:
        if self.ended:
            return
        self.ended = True
        self.ring_at = self.give_up_at = None
        self.rearm()
        self._ctx.outbound_settled(self)
        self._ctx.stats["calls_out_failed"] += 1
        self._ctx.events.append(CallEnded(self.id, reason, status, by_remote))
