"""Harness moved unchanged from tests/unit/sip/test_sip_uac.py: ANSWER_SDP, Callee, LOCAL, TARGET, TRUNK."""

from __future__ import annotations

from dataclasses import dataclass, field

from sip.core.message import Message, Request, make_response, parse, serialize
from sip.core.offer_answer import LocalMedia
from sip.core.ua import CallEnded, UaEvent, UserAgent

TRUNK = ("198.51.100.20", 5060)


TARGET = "sip:+15550001@trunk.example.com"


LOCAL = LocalMedia(address="192.0.2.1", port=30000, session_id=77)


ANSWER_SDP = (
    "v=0\r\no=callee 5 5 IN IP4 198.51.100.20\r\ns=-\r\nc=IN IP4 198.51.100.20\r\nt=0 0\r\n"
    "m=audio 42000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
    "a=fmtp:101 0-16\r\na=sendrecv\r\n"
)


@dataclass
class Callee:
    """The far end: reads what the UA sent, answers it."""

    ua: UserAgent
    events: list[UaEvent] = field(default_factory=list)
    sent: list[tuple[tuple[str, int], Message]] = field(default_factory=list)
    tag: str = "callee1"

    def collect(self) -> list[Message]:
        out = [(t.destination, parse(t.data)) for t in self.ua.transmits()]
        self.sent.extend(out)
        self.events.extend(self.ua.events())
        return [m for _, m in out]

    def requests(self, method: str) -> list[Request]:
        return [m for _, m in self.sent if isinstance(m, Request) and m.method == method]

    def reply(
        self,
        request: Request,
        status: int,
        now: int,
        *,
        headers: tuple[tuple[str, str], ...] = (),
        body: str = "",
        tag: str | None = None,
    ) -> list[Message]:
        extra = headers
        if body:
            extra += (("Content-Type", "application/sdp"),)
        to_tag = None if status == 100 else (tag or self.tag)
        response = make_response(request, status, to_tag=to_tag, headers=extra, body=body.encode())
        self.ua.receive(serialize(response), TRUNK, "udp", now)
        return self.collect()

    def answer(
        self, request: Request, now: int, *, headers: tuple[tuple[str, str], ...] = ()
    ) -> list[Message]:
        contact = (
            ("Contact", "<sip:callee@198.51.100.21:5070>"),
            ("Allow", "INVITE, ACK, BYE, CANCEL, UPDATE"),
        )
        return self.reply(request, 200, now, headers=contact + headers, body=ANSWER_SDP)

    def advance(self, until: int) -> list[tuple[int, Message]]:
        out: list[tuple[int, Message]] = []
        for _ in range(10_000):
            deadline = self.ua.next_deadline()
            if deadline is None or deadline > until:
                return out
            self.ua.handle_timer(deadline)
            out.extend((deadline, m) for m in self.collect())
        raise AssertionError("timers did not settle")

    def ended(self) -> list[CallEnded]:
        return [e for e in self.events if isinstance(e, CallEnded)]
