"""SDP (RFC 4566) and the offer/answer model (RFC 3264) for one audio stream of G.711. No I/O, no clock.

Descriptions:
- `parse_sdp(data) -> SessionDescription` (bytes or str; raises `SdpError`, a ValueError, naming the line at
  fault); `serialize_sdp(description) -> bytes` (also `str(description)`). `parse_sdp(serialize_sdp(d)) == d`.
  Optional lines a parser need not understand (i, u, e, p, b, r, z, k) are kept in `extra`, grouped in the
  order RFC 4566 §5 gives them, so the printed form is always in RFC order.
- `SessionDescription` holds `origin` (`Origin`), `session_name`, a session-level `connection`
  (`Connection`), `times`, session `attributes` and the `media` (`MediaDescription`, one per m= line).
  `MediaDescription.codecs()` maps payload types to `Codec` (rtpmap, or the static RFC 3551 table),
  `.direction` is the effective ``sendrecv``/``sendonly``/``recvonly``/``inactive`` (media-level attribute,
  else session-level, else sendrecv).

Offer/answer, audio only, codecs PCMU (PT 0), PCMA (PT 8) and telephone-event/8000 (dynamic PT), ptime 20:
- `LocalMedia`: what this side offers or accepts (RTP address and port, codecs in preference order,
  telephone-event PT for our offers, the direction we want: "sendonly" or "inactive" when *we* hold).
- `offer(local, previous=None) -> SessionDescription`: for an INVITE that came without SDP (the answer then
  arrives in the ACK) and for our re-INVITEs.
- `answer(offer, local, previous=None) -> Answer | None`: `Answer.description` is our answer, for the 200;
  `Answer.media` (`NegotiatedMedia`) what was agreed. The codec is the first one *in the offer's order* that
  we support (RFC 3264 §6.1); telephone-event keeps the offer's PT; the direction mirrors the offer's
  (sendonly → recvonly: the caller holds us; recvonly → sendonly; inactive → inactive), combined with ours;
  ``c=0.0.0.0`` (RFC 2543 hold, RFC 3264 §8.4) means the offerer receives nothing. Every other m= line
  (video, a second audio stream, RTP/SAVP unless SRTP is on, any non-RTP profile) is rejected with port 0 in
  its place (§6). None means no audio stream could be accepted: answer the INVITE 488 (or the re-INVITE 488 and keep
  the old session).
- `check_offer(offer, codecs=..., srtp=..., crypto_suites=...) -> OfferRefusal | None`: whether `answer` with
  such a `LocalMedia` would accept the offer, decided before any RTP port or address exists (sip.core.ua asks it
  when an INVITE arrives, before the 180). `answer` accepts exactly the streams it passes (one function,
  `_stream_problem`, decides both). An `OfferRefusal` names one cause of `OFFER_REFUSALS`, each with its 488
  reason phrase and Warning (RFC 3261 §20.43): no m= line (304), no audio stream with a port (304: video
  only, T.38 only, every audio port 0), a profile that is not RTP/AVP or RTP/SAVP(F) (302: DTLS
  UDP/TLS/RTP/SAVPF, RTP/AVPF), RTP/SAVP with SRTP off (302), RTP/SAVP over a transport that may not carry
  keys (302, sip.core.ua names it), SRTP required and an RTP/AVP offer (302), a=crypto lines none of which we
  can run (306: unknown suite, MKI, bad key), a c= that is no IP address (301), no PCMU/PCMA (305: G.729
  only). A stream offered sendonly, recvonly or inactive (or c=0.0.0.0) is answerable: a call may start on
  hold (a PBX parking it, RFC 3725 third-party call control), and the hold limit (rtp.limits) bounds it.
  `sdes_policy(policy, transport)` is the SRTP policy for a call's signalling transport (keys only over TLS).
- `negotiate(local_sdp, remote_sdp) -> NegotiatedMedia | None`: what was agreed (codec and PT to send, the
  telephone-event PT, where to send, our direction, the remote's hold state), whichever side offered.
  `accept_answer(our_offer, their_answer)` is the same after checking that the answer (from the ACK, or a
  200 to our re-INVITE) has one m= line per offered one; None means the answer is unusable.
- `hold_state(remote) -> Direction`: the remote side's stream direction with RFC 2543 hold folded in (a
  c= of 0.0.0.0 or ``::`` means it does not receive); `is_held(remote)` is True for sendonly and inactive, i.e.
  the remote put us on hold.
- Origin version (RFC 3264 §8): `offer` and `answer` take the description we sent last (`previous`); the o=
  line keeps its session id, and its version goes up by one exactly when the content changed.
- SRTP with SDES keys (RFC 3711, RFC 4568): `LocalMedia.srtp` is the policy, "off" (the default: an
  RTP/SAVP stream is rejected with port 0 and a=crypto in an RTP/AVP offer is ignored, as before), "optional"
  (answer what is offered: RTP/SAVP or RTP/SAVPF with a usable a=crypto is answered with SRTP, an RTP/AVP
  offer that carries a=crypto too (the "best effort" SRTP of baresip's ``mediaenc=srtp``), plain RTP/AVP in
  plain; our offers are RTP/AVP with a=crypto) or "required" (an offer without a usable a=crypto gets None,
  i.e. 488; our offers are RTP/SAVP). The answer takes the first a=crypto line *in the offer's order* whose
  suite is in `LocalMedia.crypto_suites` and whose parameters we can honour (one key, no MKI, no session
  parameter but the WSH hint: pylibsrtp has no MKI and no key derivation rate; lifetimes are accepted and not
  enforced, libsrtp keeps its own 2^48 limit), with its tag and suite and OUR key (RFC 4568 §6.1, §7.1.2),
  drawn from `LocalMedia.key_source`. Re-offers and re-answers (a `previous` description with a key for the
  same suite) keep our key, so a hold/resume re-INVITE does not re-key our direction; a peer's new key is
  simply the new `NegotiatedMedia.srtp.remote_key`. `NegotiatedMedia.srtp` (`SrtpKeys`) is what was agreed:
  suite, tag, the key we send with and the key we receive with, or None for plain RTP. `parse_crypto` and
  `CryptoAttribute` read and write one ``a=crypto`` value; `MediaDescription.crypto()` lists them.
  Keys must only travel over TLS (sip.native.tls.sdes_policy gives the policy for a call's transport).
- Short names used by the INVITE session: `parse(data)` is `parse_sdp` returning None instead of raising,
  `serialize` is `serialize_sdp`, `is_hold` is `is_held`.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

__all__ = [
    "Answer",
    "Codec",
    "Connection",
    "CryptoAttribute",
    "CryptoKey",
    "DEFAULT_CRYPTO_SUITES",
    "Direction",
    "LocalMedia",
    "MediaDescription",
    "NegotiatedMedia",
    "OFFER_REFUSALS",
    "OfferCause",
    "OfferRefusal",
    "Origin",
    "SECURE_TRANSPORTS",
    "SdpError",
    "SRTP_KEY_LENGTHS",
    "SessionDescription",
    "SrtpKeys",
    "SrtpPolicy",
    "accept_answer",
    "answer",
    "check_offer",
    "hold_state",
    "is_held",
    "is_hold",
    "negotiate",
    "offer",
    "parse",
    "parse_crypto",
    "parse_sdp",
    "sdes_policy",
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
_SUPPORTED = frozenset({"PCMU", "PCMA"})
_STATIC_PT = {"PCMU": 0, "PCMA": 8}
_HOLD_ADDRESSES = frozenset({"0.0.0.0", "::"})
SrtpPolicy = Literal["off", "optional", "required"]
# master key || master salt length per suite (RFC 4568 §6.2, RFC 7714 §14.2); rtp.srtp.SUITES agrees (tested)
SRTP_KEY_LENGTHS: dict[str, int] = {
    "AES_CM_128_HMAC_SHA1_80": 30,
    "AES_CM_128_HMAC_SHA1_32": 30,
    "AEAD_AES_128_GCM": 28,
    "AEAD_AES_256_GCM": 44,
}
DEFAULT_CRYPTO_SUITES = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")
_PLAIN_PROTO = "RTP/AVP"
# SAVPF tolerated: answered as offered, no feedback used
_SECURE_PROTOS = frozenset({"RTP/SAVP", "RTP/SAVPF"})
_AUDIO_PROTOS = _SECURE_PROTOS | {_PLAIN_PROTO}
SECURE_TRANSPORTS = frozenset({"tls", "wss"})  # where SDES keys may travel (RFC 4568 §8.3)
_HINT_PARAMS = ("WSH=",)  # RFC 4568 §6.3.6 window size hint: a hint, safe to ignore
_MAX_TAG = 999_999_999  # RFC 4568 §9.1: 1*9DIGIT


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


@dataclass(frozen=True, slots=True)
class CryptoKey:
    """One ``inline:`` key parameter: master key || salt, and the optional lifetime and MKI:length."""

    key_salt: bytes
    lifetime: int | None = None  # in packets (``2^20`` or decimal)
    mki: tuple[int, int] | None = None  # (value, length in bytes)

    def __str__(self) -> str:
        text = "inline:" + base64.b64encode(self.key_salt).decode("ascii")
        if self.lifetime is not None:
            power = self.lifetime.bit_length() - 1
            text += f"|2^{power}" if self.lifetime == 1 << power else f"|{self.lifetime}"
        if self.mki is not None:
            text += f"|{self.mki[0]}:{self.mki[1]}"
        return text


@dataclass(frozen=True, slots=True)
class CryptoAttribute:
    """``a=crypto:<tag> <crypto-suite> <key-params> [<session-params>]`` (RFC 4568 §9.1)."""

    tag: int
    suite: str
    keys: tuple[CryptoKey, ...]
    session_params: tuple[str, ...] = ()

    @property
    def key(self) -> bytes:
        """The (first) master key || salt."""
        return self.keys[0].key_salt

    @property
    def usable(self) -> bool:
        """A suite we know with one key of the right length, no MKI and no session parameter we would have to
        honour (only the WSH hint): what rtp.srtp (pylibsrtp) can run."""
        return (
            self.suite in SRTP_KEY_LENGTHS
            and len(self.keys) == 1
            and self.keys[0].mki is None
            and len(self.keys[0].key_salt) == SRTP_KEY_LENGTHS[self.suite]
            and all(p.startswith(_HINT_PARAMS) for p in self.session_params)
        )

    def __str__(self) -> str:
        keys = ";".join(str(k) for k in self.keys)
        params = "".join(f" {p}" for p in self.session_params)
        return f"{self.tag} {self.suite} {keys}{params}"


def _b64(text: str) -> bytes | None:
    if not text or not text.isascii():
        return None
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def _crypto_key(text: str) -> CryptoKey | None:
    method, colon, info = text.partition(":")
    if method.lower() != "inline" or not colon:
        return None
    pieces = info.split("|")
    if len(pieces) > 3:
        return None
    key = _b64(pieces[0])
    if key is None:
        return None
    lifetime: int | None = None
    mki: tuple[int, int] | None = None
    for piece in pieces[1:]:
        if ":" in piece:  # MKI:length (RFC 4568 §6.1); lifetime, when present, comes first
            value_text, _, length_text = piece.partition(":")
            value, length = _number(value_text, 38), _number(length_text, 3)
            if mki is not None or value is None or length is None or not 1 <= length <= 128:
                return None
            mki = (value, length)
        else:
            if lifetime is not None or mki is not None:
                return None
            if piece.startswith("2^"):
                power = _number(piece[2:], 2)
                lifetime = 1 << power if power is not None and power <= 64 else None
            else:
                lifetime = _number(piece, 20)
            if not lifetime:  # absent, malformed, or 0 (a key for no packet at all)
                return None
    return CryptoKey(key, lifetime, mki)


def parse_crypto(value: str) -> CryptoAttribute | None:
    """One ``a=crypto`` value, or None when it is malformed (such a line is ignored, RFC 4568 §7.1.1: the
    answerer skips what it does not understand). A suite we do not know parses; `usable` says False."""
    pieces = value.split()
    if len(pieces) < 3:
        return None
    tag = _number(pieces[0], 9)
    suite = pieces[1]
    if tag is None or tag > _MAX_TAG or not suite.isascii() or not suite.replace("_", "").isalnum():
        return None
    keys: list[CryptoKey] = []
    for text in pieces[2].split(";"):
        key = _crypto_key(text)
        if key is None:
            return None
        keys.append(key)
    return CryptoAttribute(tag, suite, tuple(keys), tuple(pieces[3:]))


@dataclass(frozen=True, slots=True)
class SrtpKeys:
    """What SDES agreed for one stream: the suite and a=crypto tag, the master key || salt we protect with
    (the one our SDP carried) and the one we unprotect with (the peer's)."""

    suite: str
    tag: int
    local_key: bytes = field(repr=False)
    remote_key: bytes = field(repr=False)


Attribute = tuple[str, str | None]


def _number(text: str, max_digits: int) -> int | None:
    """The value of 1 to `max_digits` ASCII digits, else None (no int() of a 5000-digit or a '²' string)."""
    if not 0 < len(text) <= max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)


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
            pt, clock = _number(pt_text, 3), _number(parts[1], 10) if len(parts) > 1 else None
            if pt is None or clock is None:
                continue
            channels = (_number(parts[2], 3) or 1) if len(parts) > 2 else 1
            mapped.setdefault(pt, Codec(pt, parts[0], clock, channels))
        out: dict[int, Codec] = {}
        for fmt in self.formats:
            pt = _number(fmt, 3)
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
        return self.proto.upper() in _SECURE_PROTOS

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


def _usable_connection(description: SessionDescription, media: MediaDescription) -> Connection | None:
    """The peer's connection for an m= line if RTP can be sent there: an IP address of its address type. A
    host name is not (RFC 4566 allows one): the media path sends with `sendto` on every 20 ms slot and never
    resolves names, and a name there made it look one up on every slot (the hostile-input bench: `c=IN IP4
    1<27.0.0.2` from a mutated offer was taken)."""
    connection = description.connection_for(media)
    if connection is None:
        return None
    try:
        address = ipaddress.ip_address(connection.address)
    except ValueError:
        return None
    return connection if address.version == (6 if connection.addrtype == "IP6" else 4) else None


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
            start, stop = (_number(p, 20) for p in pieces) if len(pieces) == 2 else (None, None)
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
    session, revision = _number(session_id, 40), _number(version, 40)
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
    port = _number(port_part, 5)
    if port is None or port > 65535:
        raise _line_error(number, line, "bad port")
    port_count: int | None = None
    if slash:
        port_count = _number(count_text, 5)
        if port_count is None or port_count < 1:
            raise _line_error(number, line, "bad port count")
    if proto.upper().startswith("RTP/"):
        for fmt in formats:
            pt = _number(fmt, 3)
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


# --- offer / answer -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LocalMedia:
    """This side of the media session.

    `codecs` are the ones we accept (a subset of PCMU, PCMA), in the order we offer them; `telephone_event` is
    the payload type we offer for RFC 4733 events (None: do not offer or accept them); `direction` is what we
    want ("sendonly" or "inactive" when we hold the call); `session_id` is our o= session id (pick it once per
    dialog, e.g. from a random or the NTP time).

    SRTP (see the module docstring): `srtp` the policy, `crypto_suites` what we offer and accept in our order
    of preference, `key_source(n)` n random bytes for our keys (os.urandom; tests inject their own)."""

    address: str
    port: int
    session_id: int
    codecs: tuple[str, ...] = ("PCMU", "PCMA")
    telephone_event: int | None = 101
    ptime: int = 20
    direction: Direction = "sendrecv"
    username: str = "-"
    session_name: str = "parlora"
    srtp: SrtpPolicy = "off"
    crypto_suites: tuple[str, ...] = DEFAULT_CRYPTO_SUITES
    key_source: Callable[[int], bytes] = field(default=os.urandom, compare=False, repr=False)

    @property
    def addrtype(self) -> str:
        """IP6 for an IPv6 address, else IP4."""
        return "IP6" if ":" in self.address else "IP4"


@dataclass(frozen=True, slots=True)
class NegotiatedMedia:
    """The outcome of an offer/answer exchange for the audio stream.

    `codec` and `payload_type` are what we send (and expect) as audio; `telephone_event` the PT for RFC 4733
    events (None if not agreed); `remote_address`/`remote_port` where to send RTP; `remote_ptime` the peer's
    a=ptime (None if absent); `direction` what *we* do on this stream; `remote_direction` the peer's stream
    direction with RFC 2543 hold folded in (`hold_state`); `srtp` the SDES keys when the stream is SRTP
    (None: plain RTP)."""

    codec: str
    payload_type: int
    telephone_event: int | None
    remote_address: str
    remote_port: int
    direction: Direction
    remote_direction: Direction
    remote_ptime: int | None = None
    clock_rate: int = 8000
    srtp: SrtpKeys | None = None

    @property
    def secure(self) -> bool:
        """True when the stream is SRTP (`srtp` holds the keys)."""
        return self.srtp is not None

    @property
    def sends(self) -> bool:
        """Whether we may send audio (our direction is sendrecv or sendonly)."""
        return self.direction in ("sendrecv", "sendonly")

    @property
    def receives(self) -> bool:
        """Whether we expect audio (our direction is sendrecv or recvonly)."""
        return self.direction in ("sendrecv", "recvonly")

    @property
    def held(self) -> bool:
        """True when the peer put us on hold (its stream is sendonly or inactive)."""
        return self.remote_direction in ("sendonly", "inactive")


@dataclass(frozen=True, slots=True)
class Answer:
    """What `answer` returns: `description` is the SDP to send, `media` what was agreed."""

    description: SessionDescription
    media: NegotiatedMedia


def _split_direction(direction: Direction) -> tuple[bool, bool]:
    return direction in ("sendrecv", "sendonly"), direction in ("sendrecv", "recvonly")


def _join_direction(sends: bool, receives: bool) -> Direction:
    if sends and receives:
        return "sendrecv"
    if sends:
        return "sendonly"
    if receives:
        return "recvonly"
    return "inactive"


def _stream_state(description: SessionDescription, media: MediaDescription) -> Direction:
    if media.port == 0:
        return "inactive"
    sends, receives = _split_direction(description.direction_of(media))
    connection = description.connection_for(media)
    if connection is not None and connection.is_hold:
        receives = False
    return _join_direction(sends, receives)


def _first_audio(description: SessionDescription) -> MediaDescription | None:
    for section in description.media:
        if section.media == "audio" and section.port != 0 and section.proto.upper() in _AUDIO_PROTOS:
            return section
    return None


def hold_state(remote: SessionDescription) -> Direction:
    """The direction of the remote side's audio stream, as the remote sees it: its a= direction (media level,
    else session level, else sendrecv), with "does not receive" when its address is 0.0.0.0 or ``::`` (RFC
    2543 hold) and "inactive" when it has no audio stream or the stream's port is 0."""
    section = _first_audio(remote)
    if section is None:
        return "inactive"
    return _stream_state(remote, section)


def is_held(remote: SessionDescription) -> bool:
    """True when the remote put us on hold: its stream is sendonly or inactive (or 0.0.0.0)."""
    return hold_state(remote) in ("sendonly", "inactive")


def _telephone_event(section: MediaDescription) -> int | None:
    for pt, codec in section.codecs().items():
        if codec.name.lower() == "telephone-event" and codec.clock_rate == 8000:
            return pt
    return None


def _choose(section: MediaDescription, supported: tuple[str, ...]) -> Codec | None:
    """The first codec of the m= line's format order that we support (RFC 3264 §6.1)."""
    wanted = {name.upper() for name in supported} & _SUPPORTED
    for codec in section.codecs().values():
        if codec.name.upper() in wanted and codec.clock_rate == 8000 and codec.channels == 1:
            return codec
    return None


def _audio_section(
    local: LocalMedia,
    codecs: tuple[Codec, ...],
    event_pt: int | None,
    event_fmtp: str,
    direction: Direction,
    proto: str = _PLAIN_PROTO,
    crypto: tuple[CryptoAttribute, ...] = (),
) -> MediaDescription:
    formats = [str(codec.payload_type) for codec in codecs]
    attributes: list[Attribute] = [("rtpmap", f"{c.payload_type} {c.name}/{c.clock_rate}") for c in codecs]
    if event_pt is not None:
        formats.append(str(event_pt))
        attributes.append(("rtpmap", f"{event_pt} telephone-event/8000"))
        attributes.append(("fmtp", f"{event_pt} {event_fmtp}"))
    attributes.append(("ptime", str(local.ptime)))
    attributes.append((direction, None))
    attributes.extend(("crypto", str(c)) for c in crypto)
    return MediaDescription("audio", local.port, proto, tuple(formats), None, tuple(attributes))


def _previous_keys(previous: SessionDescription | None) -> dict[str, bytes]:
    """Our keys per suite in the description we sent last (kept across re-offers and re-answers)."""
    if previous is None:
        return {}
    section = _first_audio(previous)
    return {c.suite: c.key for c in section.crypto() if c.usable} if section is not None else {}


def _our_key(local: LocalMedia, suite: str, kept: dict[str, bytes]) -> bytes:
    key = kept.get(suite)
    if key is not None:
        return key
    length = SRTP_KEY_LENGTHS[suite]
    key = bytes(local.key_source(length))
    if len(key) != length:
        raise ValueError(f"LocalMedia.key_source returned {len(key)} bytes, not {length}")
    return key


def _our_suites(local: LocalMedia) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s for s in local.crypto_suites if s in SRTP_KEY_LENGTHS))


def _stamp(
    local: LocalMedia, media: tuple[MediaDescription, ...], previous: SessionDescription | None
) -> SessionDescription:
    """Build our description; o= version: previous one if nothing changed, else previous + 1 (RFC 3264 §8)."""
    origin = Origin(local.username, local.session_id, 0, local.address, local.addrtype)
    description = SessionDescription(
        origin=origin,
        session_name=local.session_name,
        connection=Connection(local.address, local.addrtype),
        media=media,
    )
    if previous is None:
        return description
    unchanged = replace(previous, origin=replace(previous.origin, version=0)) == description
    version = previous.origin.version if unchanged else previous.origin.version + 1
    return replace(
        description, origin=replace(origin, session_id=previous.origin.session_id, version=version)
    )


def offer(local: LocalMedia, previous: SessionDescription | None = None) -> SessionDescription:
    """Our offer: one audio stream with our codecs in order, telephone-event, ptime and our direction; with
    SRTP on, one a=crypto line per suite of `local.crypto_suites` (tags 1, 2, ...), each with its own key.
    `previous` is the last description we sent in this dialog (for the o= version, and our keys)."""
    codecs = tuple(
        Codec(_STATIC_PT[name.upper()], name.upper(), 8000)
        for name in local.codecs
        if name.upper() in _SUPPORTED
    )
    if not codecs:
        raise ValueError("LocalMedia.codecs has none of PCMU, PCMA")
    proto = _PLAIN_PROTO
    crypto: tuple[CryptoAttribute, ...] = ()
    if local.srtp != "off":
        suites = _our_suites(local)
        if not suites:
            raise ValueError("LocalMedia.crypto_suites has no suite we support")
        kept = _previous_keys(previous)
        crypto = tuple(
            CryptoAttribute(tag, suite, (CryptoKey(_our_key(local, suite, kept)),))
            for tag, suite in enumerate(suites, 1)
        )
        proto = "RTP/SAVP" if local.srtp == "required" else _PLAIN_PROTO  # optional: RTP/AVP + a=crypto
    section = _audio_section(local, codecs, local.telephone_event, "0-16", local.direction, proto, crypto)
    return _stamp(local, (section,), previous)


def answer(
    offer: SessionDescription, local: LocalMedia, previous: SessionDescription | None = None
) -> Answer | None:
    """Our answer to an offer (RFC 3264 §6), or None when no audio stream is acceptable (→ 488).

    One m= line per offered m= line, in the same order; the first acceptable audio stream (RTP/AVP, or with
    SRTP on RTP/SAVP(F) with a usable a=crypto; port not 0, a usable c=, a codec in common) is accepted and all
    others are rejected with port 0. With `local.srtp` "required" a stream without a usable a=crypto is not
    acceptable. `previous` is the
    last description we sent in this dialog (for the o= version)."""
    sections: list[MediaDescription] = []
    accepted_one = False
    for offered in offer.media:
        if not accepted_one and offered.media == "audio" and offered.port != 0:
            accepted = _accept_offered(offer, offered, local, previous)
            if accepted is not None:
                sections.append(accepted)
                accepted_one = True
                continue
        sections.append(MediaDescription(offered.media, 0, offered.proto, offered.formats[:1]))
    if not accepted_one:
        return None
    description = _stamp(local, tuple(sections), previous)
    media = negotiate(description, offer)
    assert media is not None  # the accepted stream has a codec both sides list
    return Answer(description, media)


OfferCause = Literal[
    "no_media",
    "no_audio",
    "profile",
    "srtp_off",
    "srtp_needs_tls",
    "tls_required",
    "srtp_required",
    "crypto",
    "address",
    "codec",
]


@dataclass(frozen=True, slots=True)
class OfferRefusal:
    """Why an initial offer cannot be answered: the 488's reason phrase, and its Warning (RFC 3261 §20.43:
    `warning` the warn-code, `text` the warn-text)."""

    cause: OfferCause
    reason: str
    warning: int
    text: str

    def warning_header(self, agent: str) -> str:
        """The Warning header value: ``<code> <agent> "<text>"`` (§20.43; `agent` our host or "-")."""
        return f'{self.warning} {agent} "{self.text}"'


# One reason phrase per cause (the table in the module docstring of sip/core/ua.py says when each applies).
OFFER_REFUSALS: dict[OfferCause, OfferRefusal] = {
    r.cause: r
    for r in (
        OfferRefusal("no_media", "No Media Offered", 304, "the offer has no m= line"),
        OfferRefusal("no_audio", "No Audio Stream Offered", 304, "no audio stream with a port in the offer"),
        OfferRefusal(
            "profile", "Media Profile Not Supported", 302, "audio needs RTP/AVP, or RTP/SAVP over TLS"
        ),
        OfferRefusal(
            "srtp_off", "SRTP Not Supported", 302, "RTP/SAVP offered; this bridge runs plain RTP/AVP"
        ),
        OfferRefusal("srtp_needs_tls", "SRTP Needs SIP Over TLS", 302, "RTP/SAVP keys travel only over TLS"),
        OfferRefusal("tls_required", "SRTP Required Over TLS", 302, "SRTP is required: call over SIP TLS"),
        OfferRefusal("srtp_required", "SRTP Required", 302, "SRTP is required: offer RTP/SAVP with a=crypto"),
        OfferRefusal("crypto", "No Usable Crypto Suite", 306, "no a=crypto line with a suite and key we run"),
        OfferRefusal("address", "Unusable Media Address", 301, "the audio c= is no IP address of its type"),
        OfferRefusal("codec", "No Common Codec", 305, "no PCMU or PCMA (8000 Hz, mono) in the audio stream"),
    )
}


def check_offer(
    offer: SessionDescription,
    *,
    codecs: tuple[str, ...] = ("PCMU", "PCMA"),
    srtp: SrtpPolicy = "off",
    crypto_suites: tuple[str, ...] = DEFAULT_CRYPTO_SUITES,
) -> OfferRefusal | None:
    """None when `answer` with a `LocalMedia` of these `codecs`, `srtp` and `crypto_suites` accepts `offer`;
    else why not. With several audio streams refused for different reasons, the one that got furthest
    through the checks (profile, SRTP, address, codec) names the cause, the first of them on a tie. A stream
    that is sendonly, recvonly or inactive is answerable (a call may start on hold)."""
    if not offer.media:
        return OFFER_REFUSALS["no_media"]
    best: tuple[int, OfferCause] | None = None
    for offered in offer.media:
        if offered.media != "audio" or offered.port == 0:
            continue
        problem = _stream_problem(offer, offered, codecs, srtp, crypto_suites)
        if problem is None:
            return None
        if best is None or problem[0] > best[0]:
            best = problem
    return OFFER_REFUSALS[best[1] if best is not None else "no_audio"]


def sdes_policy(policy: SrtpPolicy, transport: str) -> SrtpPolicy | None:
    """The SRTP policy for one call's signalling transport (SDES keys only over TLS): `policy` over TLS (or
    WSS); elsewhere "off" for "off" and "optional", None for "required" (the call must be refused, 488)."""
    if transport.lower() in SECURE_TRANSPORTS:
        return policy
    return None if policy == "required" else "off"


def _choose_crypto(offered: MediaDescription, local: LocalMedia) -> CryptoAttribute | None:
    """The first a=crypto line in the offer's order that we can run with a suite we accept (RFC 4568 §7.1.1)."""
    wanted = set(_our_suites(local))
    return next((c for c in offered.crypto() if c.usable and c.suite in wanted), None)


def _stream_problem(
    offer: SessionDescription,
    offered: MediaDescription,
    codecs: tuple[str, ...],
    srtp: SrtpPolicy,
    crypto_suites: tuple[str, ...],
) -> tuple[int, OfferCause] | None:
    """Why an offered audio m= line (port not 0) cannot be accepted, with how far it got through the checks
    (1 profile, 2 SRTP, 3 address, 4 codec), or None when it can. `answer` accepts exactly the lines this
    passes, so `check_offer` and `answer` never disagree."""
    proto = offered.proto.upper()
    if proto not in _AUDIO_PROTOS:
        return 1, "profile"
    if srtp == "off" and proto in _SECURE_PROTOS:
        return 2, "srtp_off"
    if srtp != "off":
        wanted = set(dict.fromkeys(s for s in crypto_suites if s in SRTP_KEY_LENGTHS))
        if not any(c.usable and c.suite in wanted for c in offered.crypto()):
            if proto in _SECURE_PROTOS:
                return 2, "crypto"  # SRTP offered and none of its lines is one we can run
            if srtp == "required":  # RTP/AVP ("best effort" a=crypto lines are answered only if usable)
                return 2, "crypto" if offered.attribute_values("crypto") else "srtp_required"
    if _usable_connection(offer, offered) is None:
        return 3, "address"
    if _choose(offered, codecs) is None:
        return 4, "codec"
    return None


def _accept_offered(
    offer: SessionDescription,
    offered: MediaDescription,
    local: LocalMedia,
    previous: SessionDescription | None,
) -> MediaDescription | None:
    if _stream_problem(offer, offered, local.codecs, local.srtp, local.crypto_suites) is not None:
        return None
    chosen = _choose_crypto(offered, local) if local.srtp != "off" else None
    crypto: tuple[CryptoAttribute, ...] = ()
    if chosen is not None:
        key = _our_key(local, chosen.suite, _previous_keys(previous))
        crypto = (CryptoAttribute(chosen.tag, chosen.suite, (CryptoKey(key),)),)
    codec = _choose(offered, local.codecs)
    assert codec is not None  # _stream_problem checked it
    event_pt = _telephone_event(offered) if local.telephone_event is not None else None
    event_fmtp = (offered.fmtp(event_pt) or "0-16") if event_pt is not None else ""
    remote_sends, remote_receives = _split_direction(_stream_state(offer, offered))
    local_sends, local_receives = _split_direction(local.direction)
    direction = _join_direction(local_sends and remote_receives, local_receives and remote_sends)
    return _audio_section(local, (codec,), event_pt, event_fmtp, direction, offered.proto, crypto)


def accept_answer(our_offer: SessionDescription, their_answer: SessionDescription) -> NegotiatedMedia | None:
    """Read the answer to our offer (from the ACK, or a 200 to our re-INVITE; RFC 3264 §6-7): None if it does
    not have as many m= lines as the offer, or `negotiate` finds nothing."""
    if len(their_answer.media) != len(our_offer.media):
        return None
    return negotiate(our_offer, their_answer)


def negotiate(local: SessionDescription, remote: SessionDescription) -> NegotiatedMedia | None:
    """What an offer/answer exchange agreed for audio, from our description and theirs (either may be the
    offer): the first audio stream that both leave open (RTP/AVP, or RTP/SAVP(F) with a=crypto lines of the
    same tag and suite on both sides, the SDES keys then in `srtp`; port not 0), the first codec in the
    *remote's* format order that our description also lists (so with our answer, the codec we chose; with
    their answer, theirs), the remote's payload types (what it expects to receive), telephone-event if both
    list it, and our direction: what our description says, limited by what the remote's allows. None if no
    such stream or codec exists."""
    for ours, theirs in zip(local.media, remote.media, strict=False):
        if ours.media != "audio" or theirs.media != "audio" or ours.port == 0 or theirs.port == 0:
            continue
        if ours.proto.upper() not in _AUDIO_PROTOS or theirs.proto.upper() not in _AUDIO_PROTOS:
            continue
        keys = _agreed_keys(ours, theirs)
        if keys is None and (ours.is_secure or theirs.is_secure):
            continue  # an SRTP stream without agreed keys is unusable
        connection = _usable_connection(remote, theirs)
        if connection is None:
            continue
        listed = {codec.name.upper() for codec in ours.codecs().values() if codec.clock_rate == 8000}
        codec = next(
            (
                c
                for c in theirs.codecs().values()
                if c.name.upper() in listed & _SUPPORTED and c.clock_rate == 8000 and c.channels == 1
            ),
            None,
        )
        if codec is None:
            return None
        remote_direction = _stream_state(remote, theirs)
        remote_sends, remote_receives = _split_direction(remote_direction)
        local_sends, local_receives = _split_direction(local.direction_of(ours))
        event_pt = _telephone_event(theirs) if _telephone_event(ours) is not None else None
        return NegotiatedMedia(
            codec=codec.name.upper(),
            payload_type=codec.payload_type,
            telephone_event=event_pt,
            remote_address=connection.address,
            remote_port=theirs.port,
            direction=_join_direction(local_sends and remote_receives, local_receives and remote_sends),
            remote_direction=remote_direction,
            remote_ptime=theirs.ptime,
            clock_rate=codec.clock_rate,
            srtp=keys,
        )
    return None


def _agreed_keys(ours: MediaDescription, theirs: MediaDescription) -> SrtpKeys | None:
    """The SDES keys of the crypto line both sides list with the same tag and suite (RFC 4568 §7.1.2: the
    answer's one line names the chosen offer line by tag), the remote's order first; None if there is none."""
    mine = [c for c in ours.crypto() if c.usable]
    if not mine:
        return None
    for their in theirs.crypto():
        if not their.usable:
            continue
        for my in mine:
            if my.tag == their.tag and my.suite == their.suite:
                return SrtpKeys(my.suite, my.tag, my.key, their.key)
    return None


# Short names, as the INVITE session uses them.


def parse(data: bytes | str) -> SessionDescription | None:
    """`parse_sdp` for callers that only need to know whether the SDP is usable: None instead of SdpError."""
    try:
        return parse_sdp(data)
    except SdpError:
        return None


serialize = serialize_sdp
is_hold = is_held
