"""Early media on the native engine: a call's media before its 200 OK (`sip.native.agent.NativeLeg`).

Outbound (a call we placed): a 1xx with an SDP answer (183 Session Progress, or a 180 that carries one) starts
the call's RTP stream at once (`start_outbound`): the far end's announcement, ringback or IVR is received,
decoded and handed on as caller frames after an `EarlyMediaStarted` leg event; the session decides where they
go (bridge/server/session.py: the recording and the machine detector, never the provider unless the route
asks). The call limits (--max-call-duration, --rtp-timeout) and the one-way-audio watch start at the answer,
not here: a long ring is not a silent call, and a far end that sends no early media is not a fault. What we
send meanwhile is the codec's idle pattern (a NAT or SBC on the way may need our RTP before it forwards the
far end's). The 2xx's SDP (normally the same answer again) updates the stream; then `MediaStarted`, as for
any answer (`answered`).

Inbound (a call we answer, `NativeLeg.play_early_media`): 183 Session Progress with our SDP answer (reliable
when the INVITE requires 100rel: sip/core/prack.py) and the media starts, the caller hearing a ringback tone
(`rtp.tones.RINGBACK_TONES`, repeated in its cadence) or an announcement (played once: an announcement heard
twice sounds like a fault; then the idle pattern) from an `EarlyPlayout` of its own — never the session's
playout, never the carrier ledger, so nothing the session accounts for is touched. At the answer (the 200
carries the same SDP) the media core takes the leg's own playout: the session's first frame follows in the
same stream, the same SSRC and sequence, without a gap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rtp.media import CallMedia
from rtp.playout import OutboundFrame, Playout
from rtp.tones import pcm_frames, ringback_frames
from sip.core.offer_answer import LocalMedia, NegotiatedMedia
from sip.core.ua import UserAgent
from sip.core.uabase import media_key
from sip.leg import EarlyMediaStarted, LegEvent

log = logging.getLogger("parlora.sip")

EARLY_ITEM = (
    "early-media"  # the item id of the frames an EarlyPlayout hands out (never in a session's ledger)
)


class _Media(Protocol):
    """What this module uses of a leg's media shell (`sip.native.agent._CallMedia`)."""

    @property
    def core(self) -> CallMedia: ...

    def update(self, negotiated: NegotiatedMedia) -> None: ...


class _Engine(Protocol):
    """What this module uses of the engine (`sip.native.agent.NativeUserAgent`)."""

    @property
    def clock(self) -> Callable[[], int]: ...

    @property
    def ua(self) -> UserAgent: ...

    def flush(self, now: int) -> None: ...


class EarlyLeg(Protocol):
    """What this module uses of a `sip.native.agent.NativeLeg` (named here, so that the agent imports this
    module and not the other way round)."""

    call: str
    early_state: EarlyState | None
    playout: Playout

    @property
    def agent(self) -> _Engine: ...

    @property
    def media(self) -> _Media | None: ...

    @property
    def outbound(self) -> bool: ...

    @property
    def answered(self) -> bool: ...

    @property
    def ended(self) -> bool: ...

    def local_media(self) -> LocalMedia: ...

    def open_media(self, negotiated: NegotiatedMedia, now: int) -> None: ...

    def media_answered(self, negotiated: NegotiatedMedia, now: int) -> None: ...

    def _post(self, event: LegEvent) -> None: ...


@dataclass(slots=True)
class EarlyState:
    """A leg's early media: when it started, what was agreed then, whether the answer has come since."""

    at_ns: int
    negotiated: NegotiatedMedia
    answered_at: int | None = None


class EarlyPlayout(Playout):
    """What the caller hears before the answer: `frames` in turn (None: nothing this slot, the idle pattern),
    from the start again when `repeat`. Its own (empty) ledger: `transmitted` records nothing."""

    def __init__(self, frames: tuple[bytes | None, ...], *, repeat: bool) -> None:
        super().__init__()
        self._frames = tuple(
            OutboundFrame(pcm, 0, EARLY_ITEM, i * 20) if pcm is not None else None
            for i, pcm in enumerate(frames)
        )
        self._repeat = repeat
        self._next = 0

    def take(self) -> OutboundFrame | None:
        frames, i = self._frames, self._next
        if i >= len(frames):
            if not self._repeat or not frames:
                return None
            i = 0
        self._next = i + 1
        return frames[i]

    def pull(self, now_ns: int) -> OutboundFrame | None:
        return self.take()

    def transmitted(self, frame: OutboundFrame, now_ns: int) -> None:
        pass  # early media is nobody's item: nothing to account


def early_playout(audio: str | bytes) -> EarlyPlayout:
    """A tone by name (KeyError for an unknown one) or 8 kHz mono PCM16 (played once)."""
    if isinstance(audio, str):
        return EarlyPlayout(ringback_frames(audio), repeat=True)
    return EarlyPlayout(pcm_frames(audio), repeat=False)


def start_outbound(leg: EarlyLeg, negotiated: NegotiatedMedia, status: int, now: int) -> None:
    """A call we placed got a 1xx with an SDP answer: its media starts now, as early media (once)."""
    if leg.media is not None or leg.ended:
        return
    leg.open_media(negotiated, now)
    leg.early_state = EarlyState(now, negotiated)
    log.info(
        "%s: early media (%d): %s/%d from %s:%d",
        leg.call,
        status,
        negotiated.codec,
        negotiated.clock_rate,
        negotiated.remote_address,
        negotiated.remote_port,
    )
    leg._post(EarlyMediaStarted(f"{negotiated.codec}/{negotiated.clock_rate}", status, now))


def start_inbound(leg: EarlyLeg, audio: str | bytes) -> bool:
    """183 with our SDP answer and `audio` to the caller until the answer (`NativeLeg.play_early_media`)."""
    if leg.outbound or leg.answered or leg.ended or leg.media is not None:
        return False
    playout = early_playout(audio)  # KeyError for a tone we do not have: before anything is sent
    agent = leg.agent
    now = agent.clock()
    negotiated = agent.ua.early(leg.call, leg.local_media(), now)
    agent.flush(now)
    if negotiated is None:
        log.info("%s: no early media (no offer to answer in a 183, or the call is not ringing)", leg.call)
        return False
    leg.open_media(negotiated, now)
    assert leg.media is not None
    leg.media.core.playout = playout
    leg.media.core.mute_input(True)  # the caller is heard from the answer on (no backlog for the session)
    leg.early_state = EarlyState(now, negotiated)
    log.info(
        "%s: 183 with early media (%s) to the caller", leg.call, audio if isinstance(audio, str) else "WAV"
    )
    return True


def answered(leg: EarlyLeg, negotiated: NegotiatedMedia, now: int) -> None:
    """The answer of a call whose media started early: the 2xx's SDP, the leg's own playout, and what every
    answered call gets (the limits, the arrival watch, `MediaStarted`). Nothing for a call already answered."""
    media, state = leg.media, leg.early_state
    if media is None or state is None or state.answered_at is not None:
        return
    state.answered_at = now
    media.core.playout = leg.playout
    media.core.mute_input(False)
    if media_key(negotiated) != media_key(
        state.negotiated
    ):  # the 2xx changed the answer (RFC 3264 allows it)
        media.update(negotiated)
    leg.media_answered(negotiated, now)


def early_outcome(leg: EarlyLeg, now: int) -> dict[str, int]:
    """What `GET /sip`'s "outbound" entry says of a call's early media: nothing without any; else how long it
    lasted (`early_media_ms`, until the answer, or until the final response of a call that failed after it:
    "the number you dialled ..." then 404 is reported as heard, not as a plain failure)."""
    state = leg.early_state
    if state is None:
        return {}
    end = state.answered_at if state.answered_at is not None else now
    return {"early_media_ms": max(0, end - state.at_ns) // 1_000_000}
