"""The offer/answer model (RFC 3264) for one audio stream of G.711, with SDES-keyed SRTP (RFC 4568). No I/O, no
clock.

Audio only, codecs PCMU (PT 0), PCMA (PT 8), G722 (PT 9, rtpmap G722/8000: rtp.g722), opus (dynamic PT, rtpmap
opus/48000/2, no telephone-event beside it: rtp.opus) (`CODECS`; `LocalMedia.codecs` the ones a call offers and accepts, a
trunk's list, by default `DEFAULT_CODECS`) and telephone-event/8000 (dynamic PT), ptime 20, on the descriptions
of sip.core.sdp:
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
- `negotiate(local_sdp, remote_sdp) -> NegotiatedMedia | None`: what was agreed (codec and PT to send, the
  telephone-event PT, where to send, our direction, the remote's hold state), whichever side offered.
  `accept_answer(our_offer, their_answer)` is the same after checking that the answer (from the ACK, or a
  200 to our re-INVITE) has one m= line per offered one; None means the answer is unusable.
- Origin version (RFC 3264 §8): `offer` and `answer` take the description we sent last (`previous`); the o=
  line keeps its session id, and its version goes up by one exactly when the content changed.
- SRTP with SDES keys (RFC 3711, RFC 4568; the attribute and the policy are sip.core.sdes): `LocalMedia.srtp`
  is the policy, "off" (the default: an RTP/SAVP stream is rejected with port 0 and a=crypto in an RTP/AVP
  offer is ignored, as before), "optional" (answer what is offered: RTP/SAVP or RTP/SAVPF with a usable
  a=crypto is answered with SRTP, an RTP/AVP offer that carries a=crypto too (the "best effort" SRTP of
  baresip's ``mediaenc=srtp``), plain RTP/AVP in plain; our offers are RTP/AVP with a=crypto) or "required"
  (an offer without a usable a=crypto gets None, i.e. 488; our offers are RTP/SAVP). The answer takes the
  first a=crypto line *in the offer's order* whose suite is in `LocalMedia.crypto_suites` and that is
  `usable`, with its tag and suite and OUR key (RFC 4568 §6.1, §7.1.2), drawn from `LocalMedia.key_source`.
  Re-offers and re-answers (a `previous` description with a key for the same suite) keep our key, so a
  hold/resume re-INVITE does not re-key our direction; a peer's new key is simply the new
  `NegotiatedMedia.srtp.remote_key`. `NegotiatedMedia.srtp` (`SrtpKeys`) is what was agreed, or None for
  plain RTP. Keys must only travel over TLS (sip.native.tls.sdes_policy gives the policy for a call's
  transport).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from sip.core.sdes import (
    DEFAULT_CRYPTO_SUITES,
    SRTP_KEY_LENGTHS,
    CryptoAttribute,
    CryptoKey,
    SrtpKeys,
    SrtpPolicy,
)
from sip.core.sdp import (
    AUDIO_PROTOS,
    PLAIN_PROTO,
    SECURE_PROTOS,
    Attribute,
    Codec,
    Connection,
    Direction,
    MediaDescription,
    Origin,
    SessionDescription,
    first_audio,
    join_direction,
    split_direction,
    stream_state,
)

__all__ = [
    "CODECS",
    "DEFAULT_CODECS",
    "OFFER_REFUSALS",
    "Answer",
    "LocalMedia",
    "NegotiatedMedia",
    "OfferCause",
    "OfferRefusal",
    "accept_answer",
    "answer",
    "check_offer",
    "codec_list",
    "negotiate",
    "offer",
]

# The audio codecs we run, by rtpmap name: (payload type of our offers, rtpmap clock rate, rtpmap channels)
# (RFC 3551 table 4). G722's rtpmap clock is 8000 although it samples at 16 kHz (RFC 3551 §4.5.2), and it runs
# on its static PT only (every G.722 phone sends 9). Opus is "opus/48000/2" whatever is sent (RFC 7587 §7),
# at a dynamic PT (an answer takes the offerer's), with our wideband limits (16 kHz) in its fmtp (rtp.opus).
CODECS: dict[str, tuple[int, int, int]] = {
    "PCMU": (0, 8000, 1),
    "PCMA": (8, 8000, 1),
    "G722": (9, 8000, 1),
    "OPUS": (111, 48000, 2),
}
_RTPMAP_NAME = {"OPUS": "opus"}  # how the rtpmap spells it (names are case-insensitive; peers are not)
_OPUS_FMTP = "maxplaybackrate=16000; sprop-maxcapturerate=16000"
DEFAULT_CODECS = ("PCMU", "PCMA")
_SUPPORTED = frozenset(CODECS)


def codec_list(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """`names` as a `LocalMedia.codecs` (upper case, in order, each once); ValueError for an empty list or a
    name that is not one of `CODECS` (a configuration that cannot be honoured refuses to start)."""
    out = tuple(dict.fromkeys(name.upper() for name in names))
    unknown = [name for name in out if name not in _SUPPORTED]
    if unknown:
        raise ValueError(f"unknown codec {unknown[0]!r}: expected some of {', '.join(CODECS)}")
    if not out:
        raise ValueError(f"no codec: expected some of {', '.join(CODECS)}")
    return out


@dataclass(frozen=True, slots=True)
class LocalMedia:
    """This side of the media session.

    `codecs` are the ones we accept (names of `CODECS`), in the order we offer them (a trunk's list: what we
    offer is what we accept); `telephone_event` is
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


def _telephone_event(section: MediaDescription) -> int | None:
    for pt, codec in section.codecs().items():
        if codec.name.lower() == "telephone-event" and codec.clock_rate == 8000:
            return pt
    return None


def _choose(section: MediaDescription, supported: tuple[str, ...]) -> Codec | None:
    """The first codec of the m= line's format order that we support (RFC 3264 §6.1)."""
    wanted = {name.upper() for name in supported}
    for codec in section.codecs().values():
        if codec.name.upper() in wanted and _runnable(codec):
            return codec
    return None


def _runnable(codec: Codec) -> bool:
    """A codec of `CODECS` at its rtpmap clock rate and channels (G722 at its static PT only)."""
    name = codec.name.upper()
    known = CODECS.get(name)
    if known is None or codec.clock_rate != known[1] or codec.channels != known[2]:
        return False
    return name != "G722" or codec.payload_type == known[0]


def _rtpmap(codec: Codec) -> str:
    channels = f"/{codec.channels}" if codec.channels != 1 else ""
    return f"{codec.payload_type} {codec.name}/{codec.clock_rate}{channels}"


def _audio_section(
    local: LocalMedia,
    codecs: tuple[Codec, ...],
    event_pt: int | None,
    event_fmtp: str,
    direction: Direction,
    proto: str = PLAIN_PROTO,
    crypto: tuple[CryptoAttribute, ...] = (),
) -> MediaDescription:
    formats = [str(codec.payload_type) for codec in codecs]
    attributes: list[Attribute] = [("rtpmap", _rtpmap(c)) for c in codecs]
    attributes += [("fmtp", f"{c.payload_type} {_OPUS_FMTP}") for c in codecs if c.name.upper() == "OPUS"]
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
    section = first_audio(previous)
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
        Codec(CODECS[n][0], _RTPMAP_NAME.get(n, n), CODECS[n][1], CODECS[n][2])
        for n in (name.upper() for name in local.codecs)
        if n in _SUPPORTED
    )
    if not codecs:
        raise ValueError(f"LocalMedia.codecs has none of {', '.join(CODECS)}")
    proto = PLAIN_PROTO
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
        proto = "RTP/SAVP" if local.srtp == "required" else PLAIN_PROTO  # optional: RTP/AVP + a=crypto
    section = _audio_section(local, codecs, local.telephone_event, "0-16", local.direction, proto, crypto)
    return _stamp(local, (section,), previous)


def answer(
    offer: SessionDescription,
    local: LocalMedia,
    previous: SessionDescription | None = None,
    clock_rate: int | None = None,
) -> Answer | None:
    """Our answer to an offer (RFC 3264 §6), or None when no audio stream is acceptable (→ 488).

    One m= line per offered m= line, in the same order; the first acceptable audio stream (RTP/AVP, or with
    SRTP on RTP/SAVP(F) with a usable a=crypto; port not 0, a usable c=, a codec in common) is accepted and all
    others are rejected with port 0. With `local.srtp` "required" a stream without a usable a=crypto is not
    acceptable. `previous` is the
    last description we sent in this dialog (for the o= version). `clock_rate`: only our codecs of that RTP
    clock (a re-offer in a call whose media cannot change its clock: the native engine's)."""
    if clock_rate is not None:
        local = replace(local, codecs=tuple(c for c in local.codecs if CODECS[c.upper()][1] == clock_rate))
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
        OfferRefusal(
            "codec", "No Common Codec", 305, "no codec we accept (PCMU, PCMA, G722, opus) in the audio stream"
        ),
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
    if proto not in AUDIO_PROTOS:
        return 1, "profile"
    if srtp == "off" and proto in SECURE_PROTOS:
        return 2, "srtp_off"
    if srtp != "off":
        wanted = set(dict.fromkeys(s for s in crypto_suites if s in SRTP_KEY_LENGTHS))
        if not any(c.usable and c.suite in wanted for c in offered.crypto()):
            if proto in SECURE_PROTOS:
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
    # RFC 4733 events run at the audio clock: telephone-event/8000 only beside an 8000 Hz codec (not Opus)
    events = local.telephone_event is not None and codec.clock_rate == 8000
    event_pt = _telephone_event(offered) if events else None
    event_fmtp = (offered.fmtp(event_pt) or "0-16") if event_pt is not None else ""
    remote_sends, remote_receives = split_direction(stream_state(offer, offered))
    local_sends, local_receives = split_direction(local.direction)
    direction = join_direction(local_sends and remote_receives, local_receives and remote_sends)
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
        if ours.proto.upper() not in AUDIO_PROTOS or theirs.proto.upper() not in AUDIO_PROTOS:
            continue
        keys = _agreed_keys(ours, theirs)
        if keys is None and (ours.is_secure or theirs.is_secure):
            continue  # an SRTP stream without agreed keys is unusable
        connection = _usable_connection(remote, theirs)
        if connection is None:
            continue
        listed = {codec.name.upper() for codec in ours.codecs().values() if _runnable(codec)}
        codec = next((c for c in theirs.codecs().values() if c.name.upper() in listed and _runnable(c)), None)
        if codec is None:
            return None
        remote_direction = stream_state(remote, theirs)
        remote_sends, remote_receives = split_direction(remote_direction)
        local_sends, local_receives = split_direction(local.direction_of(ours))
        both = _telephone_event(ours) is not None and codec.clock_rate == 8000  # not beside Opus
        event_pt = _telephone_event(theirs) if both else None
        return NegotiatedMedia(
            codec=codec.name.upper(),
            payload_type=codec.payload_type,
            telephone_event=event_pt,
            remote_address=connection.address,
            remote_port=theirs.port,
            direction=join_direction(local_sends and remote_receives, local_receives and remote_sends),
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
