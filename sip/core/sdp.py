"""SDP (RFC 4566): the session description, parsed and serialised, and the hold state it tells (RFC 3264 §8.4).
No I/O, no clock.

- `parse_sdp(data) -> SessionDescription` (bytes or str; raises `SdpError`, a ValueError, naming the line at
  fault); `serialize_sdp(description) -> bytes` (also `str(description)`). `parse_sdp(serialize_sdp(d)) == d`.
  Optional lines a parser need not understand (i, u, e, p, b, r, z, k) are kept in `extra`, grouped in the
  order RFC 4566 §5 gives them, so the printed form is always in RFC order.
- `SessionDescription` holds `origin` (`Origin`), `session_name`, a session-level `connection`
  (`Connection`), `times`, session `attributes` and the `media` (`MediaDescription`, one per m= line).
  `MediaDescription.codecs()` maps payload types to `Codec` (rtpmap, or the static RFC 3551 table),
  `.direction` is the effective ``sendrecv``/``sendonly``/``recvonly``/``inactive`` (media-level attribute,
  else session-level, else sendrecv), `.crypto()` lists its ``a=crypto`` lines (sip.core.sdes).
- `hold_state(remote) -> Direction`: the remote side's stream direction with RFC 2543 hold folded in (a
  c= of 0.0.0.0 or ``::`` means it does not receive); `is_held(remote)` is True for sendonly and inactive, i.e.
  the remote put us on hold.
- Short names used by the INVITE session: `parse(data)` is `parse_sdp` returning None instead of raising,
  `serialize` is `serialize_sdp`, `is_hold` is `is_held`.

The offer/answer model on these descriptions (RFC 3264) is sip.core.offer_answer; SDES keys are sip.core.sdes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sip.core.headers import bounded_int
from sip.core.sdes import CryptoAttribute, parse_crypto

__all__ = [
    "Codec",
    "Connection",
    "Direction",
    "MediaDescription",
    "Origin",
    "SdpError",
    "SessionDescription",
    "hold_state",
    "is_held",
    "is_hold",
    "parse",
    "parse_sdp",
    "serialize",
    "serialize_sdp",
]

Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
_DIRECTIONS: tuple[Direction, ...] = ("sendrecv", "sendonly", "recvonly", "inactive")
_MAX_SDP = 65_535
_SESSION_EXTRA_ORDER = "iuepbrzk"  # where each optional session line goes (RFC 4566 §5)
_MEDIA_EXTRA_ORDER = "ibk"
_KNOWN_TYPES = frozenset("vosiuepcbtrzkam")
_STATIC: dict[int, tuple[str, int]] = {  # RFC 3551 §6, the audio ones
    0: ("PCMU", 8000),
    3: ("GSM", 8000),
    4: ("G723", 8000),
    5: ("DVI4", 8000),
    6: ("DVI4", 16000),
    7: ("LPC", 8000),
    8: ("PCMA", 8000),
    9: ("G722", 8000),
    10: ("L16", 44100),
    11: ("L16", 44100),
    12: ("QCELP", 8000),
    13: ("CN", 8000),
    14: ("MPA", 90000),
    15: ("G728", 8000),
    16: ("DVI4", 11025),
    17: ("DVI4", 22050),
    18: ("G729", 8000),
}
_HOLD_ADDRESSES = frozenset({"0.0.0.0", "::"})
# the RTP profiles of an audio stream we take: RTP/AVP (RFC 3551), RTP/SAVP (RFC 3711), RTP/SAVPF (RFC 5124)
PLAIN_PROTO = "RTP/AVP"
# SAVPF tolerated: answered as offered, no feedback used
SECURE_PROTOS = frozenset({"RTP/SAVP", "RTP/SAVPF"})
AUDIO_PROTOS = SECURE_PROTOS | {PLAIN_PROTO}


class SdpError(ValueError):
    """A session description that cannot be used; the message names the line at fault."""


# --- the description ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Origin:
    """``o=<username> <sess-id> <sess-version> IN <IP4|IP6> <address>``."""

    username: str
    session_id: int
    version: int
    address: str
    addrtype: str = "IP4"
    nettype: str = "IN"

    def __str__(self) -> str:
        return (
            f"{self.username} {self.session_id} {self.version} {self.nettype} {self.addrtype} {self.address}"
        )


@dataclass(frozen=True, slots=True)
class Connection:
    """``c=IN <IP4|IP6> <address>`` (`address` may carry a multicast ``/ttl``)."""

    address: str
    addrtype: str = "IP4"
    nettype: str = "IN"

    @property
    def is_hold(self) -> bool:
        """True for 0.0.0.0 (or ``::``): the RFC 2543 way of saying "send me nothing"."""
        return self.address in _HOLD_ADDRESSES

    def __str__(self) -> str:
        return f"{self.nettype} {self.addrtype} {self.address}"


@dataclass(frozen=True, slots=True)
class Codec:
    """One payload type's mapping: ``a=rtpmap:<pt> <name>/<clock>[/<channels>]`` or the static table."""

    payload_type: int
    name: str
    clock_rate: int
    channels: int = 1


Attribute = tuple[str, str | None]


def _attr(attributes: tuple[Attribute, ...], name: str) -> str | None:
    for key, value in attributes:
        if key == name:
            return "" if value is None else value
    return None


def _direction(attributes: tuple[Attribute, ...]) -> Direction | None:
    for key, value in attributes:
        if value is None:
            for direction in _DIRECTIONS:
                if key == direction:
                    return direction
    return None


@dataclass(frozen=True, slots=True)
class MediaDescription:
    """One ``m=`` section: ``m=<media> <port>[/<count>] <proto> <fmt> ...`` and its lines."""

    media: str
    port: int
    proto: str
    formats: tuple[str, ...]
    connection: Connection | None = None
    attributes: tuple[Attribute, ...] = field(default=())
    port_count: int | None = None
    extra: tuple[tuple[str, str], ...] = field(default=())  # i=, b=, k= lines, in that order

    def attribute(self, name: str) -> str | None:
        """The first ``a=<name>[:value]``'s value ("" for a flag), or None."""
        return _attr(self.attributes, name)

    def attribute_values(self, name: str) -> tuple[str, ...]:
        """Every value of ``a=<name>:...`` (rtpmap, fmtp, crypto, ...)."""
        return tuple(value for key, value in self.attributes if key == name and value is not None)

    @property
    def is_rtp(self) -> bool:
        """True for an RTP profile (``RTP/AVP``, ``RTP/SAVP``, ...), whose formats are payload types."""
        return self.proto.upper().startswith("RTP/")

    def codecs(self) -> dict[int, Codec]:
        """Payload type → codec for every format of this (RTP) m= line, from rtpmap or the static table.
        A dynamic payload type without rtpmap is left out."""
        if not self.is_rtp:
            return {}
        mapped: dict[int, Codec] = {}
        for value in self.attribute_values("rtpmap"):
            pt_text, _, encoding = value.partition(" ")
            parts = encoding.strip().split("/")
            pt, clock = bounded_int(pt_text, 3), bounded_int(parts[1], 10) if len(parts) > 1 else None
            if pt is None or clock is None:
                continue
            channels = (bounded_int(parts[2], 3) or 1) if len(parts) > 2 else 1
            mapped.setdefault(pt, Codec(pt, parts[0], clock, channels))
        out: dict[int, Codec] = {}
        for fmt in self.formats:
            pt = bounded_int(fmt, 3)
            if pt is None:
                continue
            if pt in mapped:
                out[pt] = mapped[pt]
            elif pt in _STATIC:
                name, clock = _STATIC[pt]
                out[pt] = Codec(pt, name, clock)
        return out

    def crypto(self) -> tuple[CryptoAttribute, ...]:
        """Every well-formed ``a=crypto`` line, in order (malformed ones are left out)."""
        found = (parse_crypto(value) for value in self.attribute_values("crypto"))
        return tuple(c for c in found if c is not None)

    @property
    def is_secure(self) -> bool:
        """True for the SRTP profiles RTP/SAVP and RTP/SAVPF."""
        return self.proto.upper() in SECURE_PROTOS

    def fmtp(self, payload_type: int) -> str | None:
        """The ``a=fmtp:<pt> ...`` parameters for this payload type, or None."""
        prefix = f"{payload_type} "
        for value in self.attribute_values("fmtp"):
            if value.startswith(prefix):
                return value[len(prefix) :].strip()
        return None

    @property
    def ptime(self) -> int | None:
        """``a=ptime`` in ms, or None."""
        value = self.attribute("ptime")
        try:
            return round(float(value)) if value else None
        except ValueError:
            return None

    @property
    def direction(self) -> Direction | None:
        """This m= line's direction attribute, or None (then the session's applies)."""
        return _direction(self.attributes)


@dataclass(frozen=True, slots=True)
class SessionDescription:
    """A whole session description (RFC 4566 §5)."""

    origin: Origin
    session_name: str = "-"
    connection: Connection | None = None
    times: tuple[tuple[int, int], ...] = ((0, 0),)
    attributes: tuple[Attribute, ...] = field(default=())
    media: tuple[MediaDescription, ...] = field(default=())
    extra: tuple[tuple[str, str], ...] = field(default=())  # i u e p b r z k lines, in RFC order

    def attribute(self, name: str) -> str | None:
        """The first session-level ``a=<name>[:value]``'s value ("" for a flag), or None."""
        return _attr(self.attributes, name)

    def connection_for(self, media: MediaDescription) -> Connection | None:
        """The connection that applies to an m= line: its own, else the session's."""
        return media.connection or self.connection

    def direction_of(self, media: MediaDescription) -> Direction:
        """The effective direction of an m= line: its attribute, else the session's, else sendrecv."""
        return media.direction or _direction(self.attributes) or "sendrecv"

    def __str__(self) -> str:
        return serialize_sdp(self).decode("utf-8")


def _line_error(number: int, line: str, why: str) -> SdpError:
    shown = line if len(line) <= 60 else line[:57] + "..."
    return SdpError(f"bad SDP line {number} ({shown!r}): {why}")


def parse_sdp(data: bytes | str) -> SessionDescription:
    """Parse a session description. Lines end in CRLF or LF; blank lines are skipped. Raises `SdpError`."""
    if isinstance(data, bytes):
        if len(data) > _MAX_SDP:
            raise SdpError("SDP too large")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SdpError("SDP is not UTF-8") from None
    else:
        text = data
    lines = [(n, line.removesuffix("\r")) for n, line in enumerate(text.split("\n"), 1)]
    lines = [(n, line) for n, line in lines if line]
    if not lines or lines[0][1] != "v=0":
        raise SdpError("SDP must start with v=0")
    origin: Origin | None = None
    session_name: str | None = None
    connection: Connection | None = None
    times: list[tuple[int, int]] = []
    attributes: list[Attribute] = []
    extra: list[tuple[str, str]] = []
    media: list[MediaDescription] = []
    current: dict[str, object] | None = None  # the m= section being read

    def finish() -> None:
        if current is not None:
            media.append(_build_media(current))

    for number, line in lines[1:]:
        if len(line) < 2 or line[1] != "=" or line[0] not in _KNOWN_TYPES:
            raise _line_error(number, line, "not <letter>=<value> with a known type letter")
        kind, value = line[0], line[2:]
        if any(ch in value for ch in "\x00\r"):
            raise _line_error(number, line, "control character")
        if kind == "m":
            finish()
            current = _parse_m(number, line, value)
            continue
        if current is not None:
            if kind == "c":
                if current["connection"] is not None:
                    raise _line_error(number, line, "second c= in one media section")
                current["connection"] = _parse_c(number, line, value)
            elif kind == "a":
                attrs = current["attributes"]
                assert isinstance(attrs, list)
                attrs.append(_parse_a(number, line, value))
            elif kind in _MEDIA_EXTRA_ORDER:
                more = current["extra"]
                assert isinstance(more, list)
                more.append((kind, value))
            else:
                raise _line_error(number, line, "not allowed in a media section")
            continue
        if kind == "v":
            raise _line_error(number, line, "second v= line")
        if kind == "o":
            if origin is not None:
                raise _line_error(number, line, "second o= line")
            origin = _parse_o(number, line, value)
        elif kind == "s":
            if session_name is not None:
                raise _line_error(number, line, "second s= line")
            session_name = value
        elif kind == "c":
            if connection is not None:
                raise _line_error(number, line, "second session-level c= line")
            connection = _parse_c(number, line, value)
        elif kind == "t":
            pieces = value.split()
            start, stop = (bounded_int(p, 20) for p in pieces) if len(pieces) == 2 else (None, None)
            if start is None or stop is None:
                raise _line_error(number, line, "t= needs two integers")
            times.append((start, stop))
        elif kind == "a":
            attributes.append(_parse_a(number, line, value))
        else:
            extra.append((kind, value))
    finish()
    if origin is None:
        raise SdpError("SDP has no o= line")
    for index, section in enumerate(media, 1):
        if section.port != 0 and section.connection is None and connection is None:
            raise SdpError(f"SDP media section {index} ({section.media}) has no c= line, nor has the session")
    extra.sort(key=lambda item: _SESSION_EXTRA_ORDER.index(item[0]))
    return SessionDescription(
        origin=origin,
        session_name="-" if session_name is None else session_name,
        connection=connection,
        times=tuple(times) or ((0, 0),),
        attributes=tuple(attributes),
        media=tuple(media),
        extra=tuple(extra),
    )


def _parse_o(number: int, line: str, value: str) -> Origin:
    pieces = value.split(" ")
    if len(pieces) != 6 or not all(pieces):
        raise _line_error(number, line, "o= needs six fields")
    username, session_id, version, nettype, addrtype, address = pieces
    session, revision = bounded_int(session_id, 40), bounded_int(version, 40)
    if session is None or revision is None:
        raise _line_error(number, line, "o= session id and version must be numbers")
    return Origin(username, session, revision, address, addrtype, nettype)


def _parse_c(number: int, line: str, value: str) -> Connection:
    pieces = value.split(" ")
    if len(pieces) != 3 or not all(pieces):
        raise _line_error(number, line, "c= needs <nettype> <addrtype> <address>")
    nettype, addrtype, address = pieces
    if nettype != "IN" or addrtype not in ("IP4", "IP6"):
        raise _line_error(number, line, "c= must be IN IP4 or IN IP6")
    return Connection(address, addrtype, nettype)


def _parse_a(number: int, line: str, value: str) -> Attribute:
    name, colon, attr_value = value.partition(":")
    if not name or any(ch in name for ch in " \t"):
        raise _line_error(number, line, "a= needs <name>[:<value>]")
    return (name, attr_value if colon else None)


def _parse_m(number: int, line: str, value: str) -> dict[str, object]:
    pieces = value.split(" ")
    if len(pieces) < 4 or not all(pieces):
        raise _line_error(number, line, "m= needs <media> <port> <proto> <fmt> ...")
    media, port_text, proto = pieces[:3]
    formats = tuple(pieces[3:])
    port_part, slash, count_text = port_text.partition("/")
    port = bounded_int(port_part, 5)
    if port is None or port > 65535:
        raise _line_error(number, line, "bad port")
    port_count: int | None = None
    if slash:
        port_count = bounded_int(count_text, 5)
        if port_count is None or port_count < 1:
            raise _line_error(number, line, "bad port count")
    if proto.upper().startswith("RTP/"):
        for fmt in formats:
            pt = bounded_int(fmt, 3)
            if pt is None or pt > 127:
                raise _line_error(number, line, f"RTP payload type {fmt!r} is not 0-127")
    return {
        "media": media,
        "port": port,
        "port_count": port_count,
        "proto": proto,
        "formats": formats,
        "connection": None,
        "attributes": [],
        "extra": [],
    }


def _build_media(current: dict[str, object]) -> MediaDescription:
    media, port, proto, formats = current["media"], current["port"], current["proto"], current["formats"]
    connection, attributes, extra = current["connection"], current["attributes"], current["extra"]
    port_count = current["port_count"]
    assert isinstance(media, str) and isinstance(port, int) and isinstance(proto, str)
    assert isinstance(formats, tuple) and isinstance(attributes, list) and isinstance(extra, list)
    assert connection is None or isinstance(connection, Connection)
    assert port_count is None or isinstance(port_count, int)
    extra.sort(key=lambda item: _MEDIA_EXTRA_ORDER.index(item[0]))
    return MediaDescription(
        media, port, proto, formats, connection, tuple(attributes), port_count, tuple(extra)
    )


def serialize_sdp(description: SessionDescription) -> bytes:
    """The wire form, in RFC 4566 order, CRLF line ends."""
    lines = ["v=0", f"o={description.origin}", f"s={description.session_name}"]
    extra = description.extra
    lines.extend(f"{kind}={value}" for kind, value in extra if kind in "iuep")
    if description.connection is not None:
        lines.append(f"c={description.connection}")
    lines.extend(f"b={value}" for kind, value in extra if kind == "b")
    lines.extend(f"t={start} {stop}" for start, stop in description.times)
    lines.extend(f"{kind}={value}" for kind, value in extra if kind in "rzk")
    lines.extend(_format_attribute(attribute) for attribute in description.attributes)
    for section in description.media:
        port = f"{section.port}" if section.port_count is None else f"{section.port}/{section.port_count}"
        lines.append(f"m={section.media} {port} {section.proto} {' '.join(section.formats)}")
        lines.extend(f"i={value}" for kind, value in section.extra if kind == "i")
        if section.connection is not None:
            lines.append(f"c={section.connection}")
        lines.extend(f"{kind}={value}" for kind, value in section.extra if kind in "bk")
        lines.extend(_format_attribute(attribute) for attribute in section.attributes)
    return ("\r\n".join(lines) + "\r\n").encode("utf-8")


def _format_attribute(attribute: Attribute) -> str:
    name, value = attribute
    return f"a={name}" if value is None else f"a={name}:{value}"


# --- the hold state (RFC 3264 §8.4, RFC 2543) --------------------------------------------------------------


def split_direction(direction: Direction) -> tuple[bool, bool]:
    """(sends, receives) for a direction attribute."""
    return direction in ("sendrecv", "sendonly"), direction in ("sendrecv", "recvonly")


def join_direction(sends: bool, receives: bool) -> Direction:
    """The direction attribute for (sends, receives)."""
    if sends and receives:
        return "sendrecv"
    if sends:
        return "sendonly"
    if receives:
        return "recvonly"
    return "inactive"


def stream_state(description: SessionDescription, media: MediaDescription) -> Direction:
    """An m= line's direction as its side sees it: "inactive" with port 0, not receiving at 0.0.0.0 or ``::``."""
    if media.port == 0:
        return "inactive"
    sends, receives = split_direction(description.direction_of(media))
    connection = description.connection_for(media)
    if connection is not None and connection.is_hold:
        receives = False
    return join_direction(sends, receives)


def first_audio(description: SessionDescription) -> MediaDescription | None:
    """The first audio m= line with a port and an RTP/AVP or RTP/SAVP(F) profile, or None."""
    for section in description.media:
        if section.media == "audio" and section.port != 0 and section.proto.upper() in AUDIO_PROTOS:
            return section
    return None


def hold_state(remote: SessionDescription) -> Direction:
    """The direction of the remote side's audio stream, as the remote sees it: its a= direction (media level,
    else session level, else sendrecv), with "does not receive" when its address is 0.0.0.0 or ``::`` (RFC
    2543 hold) and "inactive" when it has no audio stream or the stream's port is 0."""
    section = first_audio(remote)
    if section is None:
        return "inactive"
    return stream_state(remote, section)


def is_held(remote: SessionDescription) -> bool:
    """True when the remote put us on hold: its stream is sendonly or inactive (or 0.0.0.0)."""
    return hold_state(remote) in ("sendonly", "inactive")


# Short names, as the INVITE session uses them.


def parse(data: bytes | str) -> SessionDescription | None:
    """`parse_sdp` for callers that only need to know whether the SDP is usable: None instead of SdpError."""
    try:
        return parse_sdp(data)
    except SdpError:
        return None


serialize = serialize_sdp
is_hold = is_held
