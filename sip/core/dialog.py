"""RFC 3261 §12 dialogs, sans-I/O: the id, both CSeq counters, the route set and the remote target.

A `Dialog` is built by the UAS from the INVITE it answers (`Dialog.uas`) or by the UAC from its request and
the response that created the dialog (`Dialog.uac`). Then:
- `check_request(request)` on every in-dialog request from the peer: None, or 500 when its CSeq is lower than
  the last one (§12.2.2, "out of order"); it also takes a new remote target from a target refresh
  (re-INVITE, UPDATE: §12.2.2, RFC 3311).
- `new_request(method, via=...)` builds our next request (§12.2.1.1): Request-URI and Route from the route
  set (loose routing, or strict routing when the first route has no `lr`), From/To with both tags, Call-ID,
  the next local CSeq, Contact. `ack(...)` builds the ACK for a 2xx (same CSeq number as the INVITE).
- `next_hop()` says where to send it (§8.1.2: the first route, else the remote target; RFC 3263's DNS is
  the shell's, so the host may be a name).

Nothing here reads a clock or does I/O. Values are kept as the header text they came in (name-addr with
parameters); the parser vets them before a dialog is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from sip.core.headers import Headers, parse_cseq, parse_name_addr
from sip.core.message import Request, Response
from sip.core.uri import SipUri, parse_uri

TARGET_REFRESH = frozenset({"INVITE", "UPDATE"})  # the methods whose Contact replaces the remote target


@dataclass(frozen=True, slots=True)
class DialogId:
    """§12: Call-ID plus the local and remote tags (the UAS's local tag is its To tag)."""

    call_id: str
    local_tag: str
    remote_tag: str


def with_tag(value: str, tag: str) -> str:
    """A From/To header value with `;tag=` appended (the value had none)."""
    return f"{value};tag={tag}"


def contact_uri(value: str) -> str:
    """The URI of a Contact/Route/Record-Route value (`<uri>;params`, `"name" <uri>`, or a bare URI)."""
    return str(parse_name_addr(value).uri)


def _uri_of(value: str) -> SipUri | None:
    try:
        return parse_uri(contact_uri(value))
    except Exception:  # a route we cannot read cannot be followed
        return None


def default_port(uri: SipUri, transport: str) -> int:
    return 5061 if uri.scheme == "sips" or transport.upper() == "TLS" else 5060


class Dialog:
    """One dialog's state (§12.1, §12.2). Mutable: CSeq counters and the remote target change."""

    __slots__ = (
        "id",
        "local_uri",
        "remote_uri",
        "local_seq",
        "remote_seq",
        "remote_target",
        "route_set",
        "local_contact",
        "transport",
        "secure",
        "is_uac",
    )

    def __init__(
        self,
        *,
        id: DialogId,
        local_uri: str,
        remote_uri: str,
        local_seq: int,
        remote_seq: int | None,
        remote_target: str,
        route_set: tuple[str, ...],
        local_contact: str,
        transport: str,
        secure: bool = False,
        is_uac: bool = False,
    ) -> None:
        self.id = id
        self.local_uri = local_uri  # our From (as UAC) / To (as UAS) value, with our tag
        self.remote_uri = remote_uri  # theirs, with their tag
        self.local_seq = local_seq
        self.remote_seq = remote_seq
        self.remote_target = remote_target
        self.route_set = route_set
        self.local_contact = local_contact
        self.transport = transport
        self.secure = secure
        self.is_uac = is_uac

    @classmethod
    def uas(
        cls,
        request: Request,
        *,
        local_tag: str,
        local_contact: str,
        transport: str,
        local_seq: int = 1,
    ) -> Dialog:
        """§12.1.1: the dialog a UAS creates by answering `request` (an INVITE) with a 1xx or 2xx carrying
        `local_tag`. The route set is the Record-Route as received; the remote target the request's Contact.
        `local_seq` is where our own CSeq numbers start (the RFC leaves it to us; 1 here)."""
        h = request.headers
        remote = h.get("From") or ""
        contact = h.get("Contact")
        number, _ = parse_cseq(h.get("CSeq") or "")
        return cls(
            id=DialogId(h.get("Call-ID") or "", local_tag, parse_name_addr(remote).tag or ""),
            local_uri=with_tag(h.get("To") or "", local_tag),
            remote_uri=remote,
            local_seq=local_seq - 1,  # new_request pre-increments
            remote_seq=number,
            remote_target=contact_uri(contact) if contact else contact_uri(remote),  # no Contact: From's URI
            route_set=tuple(h.get_all("Record-Route")),
            local_contact=local_contact,
            transport=transport,
            secure=str(request.uri).lower().startswith("sips:"),
            is_uac=False,
        )

    @classmethod
    def uac(cls, request: Request, response: Response, *, local_contact: str, transport: str) -> Dialog:
        """§12.1.2: the dialog our `request` created with `response` (1xx with a tag, or 2xx). The route set
        is the response's Record-Route reversed; the remote target its Contact."""
        req, resp = request.headers, response.headers
        local = req.get("From") or ""
        remote = resp.get("To") or ""
        contact = resp.get("Contact")
        number, _ = parse_cseq(req.get("CSeq") or "")
        return cls(
            id=DialogId(
                req.get("Call-ID") or "", parse_name_addr(local).tag or "", parse_name_addr(remote).tag or ""
            ),
            local_uri=local,
            remote_uri=remote,
            local_seq=number,
            remote_seq=None,
            remote_target=contact_uri(contact) if contact else str(request.uri),
            route_set=tuple(reversed(resp.get_all("Record-Route"))),
            local_contact=local_contact,
            transport=transport,
            secure=str(request.uri).lower().startswith("sips:"),
            is_uac=True,
        )

    # --- peer requests (§12.2.2) ---

    def check_request(self, request: Request) -> int | None:
        """None when `request` may proceed in this dialog; 500 when its CSeq is out of order. ACK and CANCEL
        carry the CSeq of the request they belong to and are not checked."""
        if request.method in ("ACK", "CANCEL"):
            return None
        try:
            number, _ = parse_cseq(request.headers.get("CSeq") or "")
        except Exception:  # the parser vets CSeq; treat an unreadable one as out of order
            return 500
        if self.remote_seq is not None and number < self.remote_seq:
            return 500
        self.remote_seq = number
        if request.method in TARGET_REFRESH:
            self.refresh_target(request)
        return None

    def refresh_target(self, message: Request | Response) -> None:
        """Take the Contact of a target refresh request or of its 2xx as the new remote target."""
        contact = message.headers.get("Contact")
        if contact:
            try:
                self.remote_target = contact_uri(contact)
            except Exception:  # keep the old target rather than lose the dialog
                pass

    # --- our requests (§12.2.1.1) ---

    def _request_uri_and_routes(self) -> tuple[str, list[str]]:
        routes = list(self.route_set)
        if not routes:
            return self.remote_target, []
        first = _uri_of(routes[0])
        if first is None or first.has_param("lr"):
            return self.remote_target, routes
        # strict routing (RFC 2543 proxies): the first route becomes the Request-URI, the remote target the
        # last Route; the URI loses its headers (§12.2.1.1)
        strict = SipUri(first.scheme, first.user, first.password, first.host, first.port, first.params, ())
        return str(strict), routes[1:] + [f"<{self.remote_target}>"]

    def new_request(
        self,
        method: str,
        *,
        via: str,
        headers: tuple[tuple[str, str], ...] = (),
        body: bytes = b"",
        content_type: str | None = None,
    ) -> Request:
        """Our next in-dialog request: a fresh CSeq (not for ACK/CANCEL, which reuse one) and `via` (with a
        new branch, built by the caller) on top."""
        if method not in ("ACK", "CANCEL"):
            self.local_seq += 1
        return self._build(
            method, self.local_seq, via=via, headers=headers, body=body, content_type=content_type
        )

    def ack(
        self, invite_cseq: int, *, via: str, body: bytes = b"", content_type: str | None = None
    ) -> Request:
        """The ACK for a 2xx to our INVITE with CSeq `invite_cseq` (§13.2.2.4): a request of its own."""
        return self._build("ACK", invite_cseq, via=via, headers=(), body=body, content_type=content_type)

    def _build(
        self,
        method: str,
        cseq: int,
        *,
        via: str,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        content_type: str | None,
    ) -> Request:
        uri, routes = self._request_uri_and_routes()
        items: list[tuple[str, str]] = [
            ("Via", via),
            ("Max-Forwards", "70"),
            ("From", self.local_uri),
            ("To", self.remote_uri),
            ("Call-ID", self.id.call_id),
            ("CSeq", f"{cseq} {method}"),
        ]
        items.extend(("Route", route) for route in routes)
        if method not in ("ACK", "CANCEL", "BYE"):
            items.append(("Contact", self.local_contact))
        items.extend(headers)
        if body and content_type:
            items.append(("Content-Type", content_type))
        items.append(("Content-Length", str(len(body))))
        return Request(method, uri, Headers(tuple(items)), body)

    def next_hop(self) -> tuple[tuple[str, int], str]:
        """((host, port), transport) for our next request (§8.1.2 / RFC 3263 without DNS): the first route if
        there is one, else the remote target; the URI's `maddr`, `transport` and port, else the dialog's
        transport (lower-case) and the scheme's default port. ("", 0) when neither is a SIP URI."""
        hop = _uri_of(self.route_set[0]) if self.route_set else None
        if hop is None:
            try:
                hop = parse_uri(self.remote_target)
            except ValueError:
                hop = None
        if hop is None or hop.scheme == "tel":
            return ("", 0), self.transport
        transport = (hop.transport or ("tls" if hop.scheme == "sips" else self.transport)).lower()
        host = hop.param("maddr") or hop.host
        return (host, hop.port or default_port(hop, transport)), transport
