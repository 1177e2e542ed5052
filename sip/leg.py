"""The call-leg contract: everything `bridge` may know about, and do with, one phone call.

`bridge` sees a call only through `CallLeg`, so the session engine runs unchanged on any SIP engine (pjsua2
today, a native asyncio engine later). Inbound audio arrives as 20 ms frames of 8 kHz PCM16 with their arrival
time; leg events say what happened to the call. Outbound audio goes through the leg's `Playout` (epochs,
barrier, carrier ledger), which the engine's media clock drains: `PlayoutLeg` implements that half of the
contract once for every engine. Engines are built through `sip.engine`; the SIP rules they share live in
`sip.core.identity`, `sip.core.telephony` and `sip.core.transfer`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, TypeGuard

from rtp.ledger import CarrierLedger
from rtp.playout import ClearResult, OutboundFrame, Playout
from rtp.rtcp import QoS


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """Who called whom, from where, as the INVITE said."""

    call_id: str  # this bridge's id for the call, unique in the process
    sip_call_id: str
    from_uri: str
    to_uri: str
    request_user: str  # user part of the Request-URI: the number that was called
    source: str  # "host:port" the INVITE came from
    headers: tuple[tuple[str, str], ...] = field(default=())
    # "outbound" for a call this bridge placed (`Dialer.dial`), set by the engine and never read from the
    # peer's headers, so a caller cannot claim it and be routed as an outbound call.
    direction: Literal["inbound", "outbound"] = "inbound"
    trunk: str | None = None  # the trunk the INVITE was matched to (sip/core/trunks.py); None: none
    # What the application sees (sip/core/app_headers.py): the allowlisted headers, cleaned and bounded, how
    # many were dropped past the count bound and how many values were cut; the caller's number (P-Asserted-
    # Identity's on a trunk trusted with it, else From's), the number a forwarded call was first dialled to
    # (Diversion's, trusted trunks only) and which rule gave `caller`.
    sip_headers: tuple[tuple[str, str], ...] = field(default=())
    headers_dropped: int = 0
    headers_cut: int = 0
    caller: str = ""
    diverted_from: str = ""
    identity_trusted: bool = False
    # The media rate the answer will run at (`MediaStarted.rate`), known from the INVITE's offer before the
    # session connects its provider (the offer decides the answer's codec, RFC 3264): 16000 when the native
    # engine will answer G.722 or Opus, else 8000 (a provider then negotiates its format for it).
    media_rate: int = 8000

    def header(self, name: str) -> str | None:
        """First value of a SIP header, case-insensitively."""
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)


# --- inbound: frames and leg events (past-tense facts) ---


@dataclass(frozen=True, slots=True)
class FrameReceived:
    """20 ms of the caller's audio, PCM16LE at the leg's media rate: 8 kHz (320 bytes), or 16 kHz (640 bytes)
    on a G.722 or Opus call of the native engine (`MediaStarted.rate`). The length says the rate."""

    pcm: bytes
    seq: int
    arrival_ns: int


@dataclass(frozen=True, slots=True)
class MediaStarted:
    """Media is flowing; `codec` is the negotiated payload (e.g. "PCMU/8000"); `rate` the PCM rate of the
    leg's 20 ms frames both ways (8000, or 16000 for G.722 and Opus on the native engine: rtp.g722, rtp.opus):
    the caller's frames come at it, and the frames played to the leg may be at it (an 8 kHz frame plays too)."""

    codec: str
    rate: int = 8000


@dataclass(frozen=True, slots=True)
class EarlyMediaStarted:
    """A call the bridge placed: the far end's media before its answer (a 183 Session Progress, or a 180, with
    an SDP answer: ringback, an announcement, an IVR). The frames from here until `MediaStarted` (the answer)
    or `CallEnded` (a failure: "the number you dialled ...", then 404 or 486) are early media. `status` is the
    provisional that brought it; `at_ns` when it started, on the engine's monotonic clock."""

    codec: str
    status: int
    at_ns: int


@dataclass(frozen=True, slots=True)
class MediaHeld:
    """The caller put the call on hold (no audio to play out until resumed)."""


@dataclass(frozen=True, slots=True)
class MediaResumed:
    """The caller took the call off hold."""


@dataclass(frozen=True, slots=True)
class DtmfReceived:
    """A digit from the caller (RFC 4733 telephone-event)."""

    digit: str


@dataclass(frozen=True, slots=True)
class TransferProgress:
    """What the transfer target answered, as the REFER's NOTIFY reported it (RFC 3515 sipfrag).

    `status_code` is the sipfrag's status (100 trying, 180 ringing, 200 answered, 4xx-6xx failed); 100 with
    reason "Accepted" when the REFER got its 202; the REFER's final response when it was refused; or one the
    engine sets itself: 408 (no report in time), 487 (call ended first), 491 (a transfer already in progress),
    500 (REFER not sent, or the subscription ended without a final NOTIFY). `final` marks the last report of
    this transfer: exactly one per `transfer()`, and 2xx there means transferred."""

    target: str
    status_code: int
    reason: str
    final: bool


@dataclass(frozen=True, slots=True)
class CallEnded:
    """The call is over. `by_remote` is true when the caller (or the network) hung up."""

    reason: str
    status_code: int
    by_remote: bool
    frames_in: int
    frames_out: int


LegEvent = (
    FrameReceived
    | EarlyMediaStarted
    | MediaStarted
    | MediaHeld
    | MediaResumed
    | DtmfReceived
    | TransferProgress
    | CallEnded
)


class CallLeg(Protocol):
    """One incoming call as the session engine sees it: ringing until `answer()`, then talking."""

    @property
    def identity(self) -> CallIdentity: ...

    @property
    def features(self) -> LegFeatures:
        """What the leg offers beyond this contract (`LegFeatures`, below)."""
        ...

    @property
    def ledger(self) -> CarrierLedger:
        """Which frames of which item have left, and when."""
        ...

    @property
    def depth(self) -> int:
        """Frames queued for the caller and not yet transmitted (the carrier's playback cushion)."""
        ...

    def events(self) -> AsyncIterator[LegEvent]:
        """Inbound frames and leg events in order; ends after `CallEnded`."""
        ...

    def enqueue(self, frames: list[OutboundFrame]) -> None:
        """Queue audio for the caller behind what is already queued."""
        ...

    def clear(self, epoch: int) -> ClearResult:
        """Drop every queued frame older than `epoch`; transmitted frames are out of scope (HR4).

        The clear is confirmed synchronously: when it returns, no frame older than `epoch` can be transmitted
        any more, and the result's `transmitted_ms` is final for each item it names. `bridge.engine.barrier`'s
        playback-epoch barrier relies on this (it never waits for a confirmation); `PlayoutLeg` provides it
        over `rtp.playout.Playout`, whose lock orders the clear against the media clock's pull."""
        ...

    def answer(self) -> None:
        """Send the 200 OK: the call is ringing (180) until the session is ready to talk."""
        ...

    def hangup(self, reason: str = "normal clearing", status: int = 503) -> None:
        """End the call: a BYE once answered, else a final response with `status` (503: no provider)."""
        ...

    def transfer(self, target: str) -> None:
        """Blind transfer (RFC 3515): send the caller a REFER with Refer-To `target`, a sip:, sips: or tel: URI.

        Raises ValueError, before anything is sent, if `target` is not such a URI. Every other outcome comes as
        `TransferProgress` events, exactly one of them `final`, always before `CallEnded` (none at all if the
        call had already ended):
        - REFER accepted (202): (100, "Accepted"), then one event per NOTIFY sipfrag (100 Trying, 180 Ringing).
        - Final sipfrag 2xx (or a 2xx to the REFER with "Refer-Sub: false"): transferred. The leg then hangs up
          by itself (BYE), so `CallEnded(by_remote=False, reason="transferred to <target>")` follows (or
          by_remote=True if the transferee hung up first).
        - Final sipfrag 3xx-6xx, or the REFER refused (403, 405, 501, 603, ...): that code; the call stays up.
        - 408: no REFER response or NOTIFY within the engine's transfer timeout; the call stays up (but if
          the transferee still reports success later, the leg hangs up then).
        - 491: another transfer of this call is still in progress; 487: the call ended before the outcome was
          known; 500: REFER not sent (call not answered yet, engine error) or the subscription ended without
          a final NOTIFY.
        """
        ...

    def send_dtmf(self, digits: str) -> None:
        """Send `digits` to the caller as RFC 4733 telephone-events on the call's RTP, 160 ms each, queued
        behind any still being sent (as SIP INFO if the caller negotiated no telephone-event).

        Raises ValueError, before anything is sent, unless `digits` is 1 to 32 of 0-9, *, #, A-D (a-d are
        taken as A-D). Nothing confirms delivery: there is no leg event for it."""
        ...


FrameSink = Callable[[FrameReceived], None]
"""Takes one caller frame inside the engine's media tick (see `FrameSinkLeg`)."""


@dataclass(frozen=True, slots=True)
class LegFeatures:
    """What a leg offers beyond `CallLeg`, declared by its class instead of tested with isinstance (as
    `providers.base.Capabilities` declares what a provider protocol offers). All off by default; a leg that
    declares one has the methods of its protocol below, and the bridge asks the declaration (`offers_*`).

    `frame_sink`: caller frames can go to a synchronous sink from the engine's media tick (`FrameSinkLeg`).
    `dialled`: the engine places calls, and `outbound` says whether this one was placed (`DialledLeg`).
    `qos`: the engine runs the RTP stream and reports its RTCP figures and counters (`QosSource`).
    `time_limit`: the engine enforces --max-call-duration and lets the session say goodbye (`TimeLimitedLeg`).
    `cushion`: the channel keeps its own playback cushion, read on every top-up (`CushionedChannel`).
    `early_media`: the engine plays early media to a caller before the answer (`EarlyMediaLeg`), and reports the
    far end's early media on the calls it places (`EarlyMediaStarted`).
    `sip_headers`: the application's SIP headers go on the leg's BYE and REFER (`HeaderedLeg`); a channel that
    is not SIP (the browser) cannot carry them.
    `replaces`: the engine can tell whether the caller's side takes a REFER with Replaces, and give the Refer-To
    that replaces a call it placed (`ReplacesLeg`: the warm transfer's join, sip/core/replaces.py).
    """

    frame_sink: bool = False
    dialled: bool = False
    qos: bool = False
    time_limit: bool = False
    cushion: bool = False
    early_media: bool = False
    sip_headers: bool = False
    replaces: bool = False


class Featured(Protocol):
    """A leg, or a channel over one (bridge/server/recording.py's tee), as far as its declaration goes."""

    @property
    def features(self) -> LegFeatures: ...


class FrameSinkLeg(Protocol):
    """`LegFeatures.frame_sink`: a leg whose engine runs the media clock itself (the native engine): caller
    frames go straight to a synchronous sink from the media tick instead of through `events()` (fewer loop
    hops per frame). Legs without it (pjsua2, the browser, test fakes) deliver every frame as a
    `FrameReceived` event.

    - With a sink set, a frame is handed to it only while no leg event is queued in `events()`; otherwise it
      is queued behind them as a `FrameReceived`, so a frame never overtakes an earlier event (CallEnded,
      MediaHeld, ...). The sink keeps that order on its side too (it queues while its own inbox is not empty).
    - The sink must not raise: it runs inside the tick that serves every call's media. It may not block.
    - `set_frame_sink(None)` goes back to events; frames already handed to the sink are not repeated."""

    def set_frame_sink(self, sink: FrameSink | None) -> None: ...


class DialledLeg(Protocol):
    """`LegFeatures.dialled`: a leg whose engine places calls (the native engine's `dial`): `outbound` is
    true for a call the bridge placed. Such a call rings until the callee answers, which its `MediaStarted`
    reports (`CallLeg.answer` does nothing for it); a leg without this feature was answered by `answer()`."""

    @property
    def outbound(self) -> bool: ...


class EarlyMediaLeg(Protocol):
    """`LegFeatures.early_media`: before `answer()`, a 183 Session Progress with the SDP answer, and `audio` to the
    caller until the answer (which carries the same SDP): a tone name of `rtp.tones.RINGBACK_TONES` (repeated
    in its cadence), or 8 kHz mono PCM16 (an announcement, played once). False when it cannot be sent (the
    call is not ringing, or its INVITE had no offer: the call rings on as before)."""

    def play_early_media(self, audio: str | bytes) -> bool: ...


class HeaderedLeg(Protocol):
    """`LegFeatures.sip_headers`: `hangup` and `transfer` take the application's `headers`, (name, value) pairs
    checked by `sip.core.app_headers.check_app_headers` (the leg checks them again: ValueError, nothing sent).
    They go on the BYE, and on the REFER (sent at once, or when the ACK comes); a call not answered yet ends
    by a final response or a CANCEL, which carry none (RFC 3261 §9.1)."""

    def hangup(
        self, reason: str = "normal clearing", status: int = 503, headers: tuple[tuple[str, str], ...] = ()
    ) -> None: ...

    def transfer(self, target: str, headers: tuple[tuple[str, str], ...] = ()) -> None: ...


class QosSource(Protocol):
    """`LegFeatures.qos`: a leg whose engine runs the RTP stream itself (the native engine): RTCP figures and
    the stream's counters for `status()["qos"]`."""

    def qos(self) -> QoS | None:
        """Jitter, loss, RTT and packet counts (None before the media started)."""
        ...

    def media_counters(self) -> dict[str, int]:
        """The stream's drop reasons and counts ({} before the media started)."""
        ...


class TimeLimitedLeg(Protocol):
    """`LegFeatures.time_limit`: a leg whose engine enforces --max-call-duration and lets the session say
    goodbye first (the native engine's `NativeLeg`): at the limit the engine calls `handler(reason)` instead
    of sending BYE, the session asks the model for a goodbye and hangs up once it has been played
    (`CallEnding`, as for end_call), and the engine sends the BYE itself if the call is still up `grace_s`
    later."""

    def on_time_limit(self, handler: Callable[[str], object], grace_s: float) -> None: ...


class CushionedChannel(Protocol):
    """`LegFeatures.cushion`: a channel that keeps its own playback cushion (the browser's adaptive
    120-200 ms, DESIGN §5): how many 20 ms frames the session may keep queued there now. Read on every top-up,
    so the cushion can follow the channel's jitter. A channel without it (the RTP carrier) gets the pacer's
    lead (bridge/engine/cushion.py `CARRIER_LEAD_FRAMES`)."""

    @property
    def cushion_frames(self) -> int: ...


class ReplacesLeg(Protocol):
    """`LegFeatures.replaces`: attended transfer by REFER with Replaces (RFC 5589 §7, RFC 3891).

    `accepts_replaces()`: the caller's INVITE declared Replaces and allows REFER (sip/core/replaces.py
    `accepts_replaces`). `replaces_refer_to()`: for a confirmed call, the Refer-To (its far end's contact with a
    Replaces header naming this dialog) that makes a transferee replace it; "" when there is none."""

    def accepts_replaces(self) -> bool: ...

    def replaces_refer_to(self) -> str: ...


def offers_replaces(leg: Featured) -> TypeGuard[ReplacesLeg]:
    """The leg declares `LegFeatures.replaces`."""
    return leg.features.replaces


def offers_frame_sink(leg: Featured) -> TypeGuard[FrameSinkLeg]:
    """The leg declares `LegFeatures.frame_sink`."""
    return leg.features.frame_sink


def offers_dialled(leg: Featured) -> TypeGuard[DialledLeg]:
    """The leg declares `LegFeatures.dialled`."""
    return leg.features.dialled


def offers_early_media(leg: Featured) -> TypeGuard[EarlyMediaLeg]:
    """The leg declares `LegFeatures.early_media`."""
    return leg.features.early_media


def offers_sip_headers(leg: Featured) -> TypeGuard[HeaderedLeg]:
    """The leg declares `LegFeatures.sip_headers`."""
    return leg.features.sip_headers


def offers_qos(leg: Featured) -> TypeGuard[QosSource]:
    """The leg declares `LegFeatures.qos`."""
    return leg.features.qos


def offers_time_limit(leg: Featured) -> TypeGuard[TimeLimitedLeg]:
    """The leg declares `LegFeatures.time_limit`."""
    return leg.features.time_limit


def offers_cushion(leg: Featured) -> TypeGuard[CushionedChannel]:
    """The channel declares `LegFeatures.cushion`."""
    return leg.features.cushion


class PlayoutLeg:
    """The outbound half of `CallLeg` over one `rtp.playout.Playout`: `ledger`, `depth`, `enqueue`, `clear`.

    Every engine's leg (and a test's fake leg) inherits it, so the playout rules live in one place: the
    engine's media clock calls `self.playout.pull(now)` once per 20 ms tick, and whatever that returns is
    transmitted (recorded in the ledger). `clear` is confirmed synchronously (see `CallLeg.clear`). It
    declares no `LegFeatures`; each engine's leg declares its own."""

    features: ClassVar[LegFeatures] = LegFeatures()

    def __init__(self, playout: Playout | None = None) -> None:
        self.playout = playout if playout is not None else Playout(CarrierLedger())

    @property
    def ledger(self) -> CarrierLedger:
        """Which frames of which item have left, and when."""
        return self.playout.ledger

    @property
    def depth(self) -> int:
        """Frames queued for the caller and not yet transmitted."""
        return self.playout.depth

    def enqueue(self, frames: list[OutboundFrame]) -> None:
        """Queue audio for the caller behind what is already queued."""
        self.playout.enqueue(frames)

    def clear(self, epoch: int) -> ClearResult:
        """Drop every queued frame older than `epoch` (HR4: transmitted frames are out of scope)."""
        return self.playout.clear(epoch)
