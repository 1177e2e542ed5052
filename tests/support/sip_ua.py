"""Harness moved unchanged from tests/unit/sip/test_sip_ua.py: CALLER, Caller, LOCAL, MS, OFFER, S, _to_tag, answered_call, distinct, new_ua, offer_sdp, sip, statuses."""

from __future__ import annotations

from dataclasses import dataclass, field

from rtp.units import NS_PER_MS as MS
from sip.core.message import Message, Request, Response, parse
from sip.core.offer_answer import LocalMedia
from sip.core.ua import (
    IncomingCall,
    UaConfig,
    UaEvent,
    UserAgent,
)

S = 1000 * MS


CALLER = ("192.0.2.10", 5062)


LOCAL = LocalMedia(address="198.51.100.1", port=30000, session_id=4242)


OFFER = (
    "v=0\r\n"
    "o=alice 1 1 IN IP4 192.0.2.10\r\n"
    "s=-\r\n"
    "c=IN IP4 192.0.2.10\r\n"
    "t=0 0\r\n"
    "m=audio 40000 RTP/AVP 0 8 101\r\n"
    "a=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:8 PCMA/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\n"
    "a=fmtp:101 0-16\r\n"
    "a=ptime:20\r\n"
    "{direction}"
)


def offer_sdp(direction: str = "a=sendrecv\r\n", version: int = 1, address: str = "192.0.2.10") -> str:
    body = OFFER.format(direction=direction).replace("o=alice 1 1", f"o=alice 1 {version}")
    return body.replace("c=IN IP4 192.0.2.10", f"c=IN IP4 {address}")


def sip(start: str, headers: list[str], body: str = "", content_type: str = "application/sdp") -> bytes:
    lines = [start, *headers]
    if body:
        lines.append(f"Content-Type: {content_type}")
    lines.append(f"Content-Length: {len(body.encode())}")
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


@dataclass
class Caller:
    """The far end: builds requests, sends them into the UA, parses what the UA sent back."""

    ua: UserAgent
    addr: tuple[str, int] = CALLER
    transport: str = "udp"
    call_id: str = "call-a@192.0.2.10"
    from_tag: str = "alice1"
    to_tag: str = ""
    cseq: int = 1
    sent: list[Message] = field(default_factory=list)
    events: list[UaEvent] = field(default_factory=list)
    destinations: list[tuple[str, int]] = field(default_factory=list)

    def headers(
        self,
        method: str,
        branch: str,
        *,
        cseq: int | None = None,
        extra: tuple[str, ...] = (),
        to_tag: str | None = None,
    ) -> list[str]:
        tag = self.to_tag if to_tag is None else to_tag
        return [
            f"Via: SIP/2.0/{self.transport.upper()} {self.addr[0]}:{self.addr[1]};branch={branch};rport",
            "Max-Forwards: 70",
            f'From: "Alice" <sip:alice@example.com>;tag={self.from_tag}',
            "To: <sip:+15551234@bridge.example>" + (f";tag={tag}" if tag else ""),
            f"Call-ID: {self.call_id}",
            f"CSeq: {self.cseq if cseq is None else cseq} {method}",
            f"Contact: <sip:alice@{self.addr[0]}:{self.addr[1]}>",
            *extra,
        ]

    def send(self, data: bytes, now: int) -> list[Message]:
        self.ua.receive(data, self.addr, self.transport, now)
        return self.collect()

    def collect(self) -> list[Message]:
        out = self.ua.transmits()
        msgs = [parse(t.data) for t in out]
        self.destinations.extend(t.destination for t in out)
        self.sent.extend(msgs)
        self.events.extend(self.ua.events())
        return msgs

    def invite(
        self,
        now: int = 0,
        *,
        body: str | None = None,
        extra: tuple[str, ...] = (),
        branch: str = "z9hG4bKinv1",
    ) -> list[Message]:
        sdp_body = offer_sdp() if body is None else body
        data = sip(
            "INVITE sip:+15551234@bridge.example SIP/2.0",
            self.headers("INVITE", branch, extra=extra),
            sdp_body,
        )
        return self.send(data, now)

    def request(
        self,
        method: str,
        now: int,
        branch: str,
        *,
        body: str = "",
        content_type: str = "application/sdp",
        extra: tuple[str, ...] = (),
        cseq: int | None = None,
        to_tag: str | None = None,
    ) -> list[Message]:
        if cseq is None and method not in ("ACK", "CANCEL"):
            self.cseq += 1
        data = sip(
            f"{method} sip:bridge@198.51.100.1:5060 SIP/2.0",
            self.headers(method, branch, cseq=cseq, extra=extra, to_tag=to_tag),
            body,
            content_type,
        )
        return self.send(data, now)

    def ack(
        self, now: int, *, body: str = "", cseq: int | None = None, branch: str = "z9hG4bKack1"
    ) -> list[Message]:
        return self.request("ACK", now, branch, body=body, cseq=self.cseq if cseq is None else cseq)

    def respond(
        self,
        request: Request,
        status: int,
        reason: str,
        now: int,
        *,
        extra: tuple[str, ...] = (),
        body: str = "",
        content_type: str = "application/sdp",
    ) -> list[Message]:
        h = request.headers
        lines = [f"Via: {v}" for v in h.get_fields("Via")]
        lines += [
            f"From: {h.get('From')}",
            f"To: {h.get('To')}",
            f"Call-ID: {h.get('Call-ID')}",
            f"CSeq: {h.get('CSeq')}",
            *extra,
        ]
        return self.send(sip(f"SIP/2.0 {status} {reason}", lines, body, content_type), now)

    def advance(self, until: int) -> list[tuple[int, Message]]:
        """Run the UA's timers up to `until` (bounded); what it sent and when."""
        sent: list[tuple[int, Message]] = []
        for _ in range(10_000):
            deadline = self.ua.next_deadline()
            if deadline is None or deadline > until:
                return sent
            self.ua.handle_timer(deadline)
            sent.extend((deadline, m) for m in self.collect())
        raise AssertionError("timers did not settle")

    def take_events(self) -> list[UaEvent]:
        self.collect()
        out, self.events = self.events, []
        return out


def statuses(msgs: list[Message]) -> list[int]:
    return [m.status for m in msgs if isinstance(m, Response)]


def distinct(sent: list[tuple[int, Message]], method: str) -> list[tuple[int, Request]]:
    """Our requests of `method` with the time each was first sent (retransmissions left out)."""
    seen: dict[str | None, tuple[int, Request]] = {}
    for t, m in sent:
        if isinstance(m, Request) and m.method == method:
            seen.setdefault(m.headers.get("CSeq"), (t, m))
    return list(seen.values())


def new_ua(**config: object) -> UserAgent:
    return UserAgent(UaConfig(host="198.51.100.1", port=5060, **config))  # type: ignore[arg-type]


def answered_call(
    ua: UserAgent | None = None,
    *,
    extra: tuple[str, ...] = (),
    body: str | None = None,
    transport: str = "udp",
) -> tuple[Caller, str]:
    """INVITE → 100, answer → 200, ACK: a confirmed call at t = 1 s."""
    caller = Caller(ua or new_ua(), transport=transport)
    caller.invite(0, extra=extra, body=body)
    (incoming,) = [e for e in caller.take_events() if isinstance(e, IncomingCall)]
    assert caller.ua.answer(incoming.call, LOCAL, 100 * MS)
    ok = caller.collect()[-1]
    assert isinstance(ok, Response) and ok.status == 200
    caller.to_tag = _to_tag(ok)
    caller.ack(1 * S)
    return caller, incoming.call


def _to_tag(message: Message) -> str:
    value = message.headers.get("To") or ""
    return value.split(";tag=", 1)[1].split(";", 1)[0]
