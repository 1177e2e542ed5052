"""The browser channel (DESIGN §12, seed 000): a WebRTC call from the console page, run as a `CallLeg`.

Signalling is one offer/answer POST (`POST /talk` on the HTTP listener). ICE host candidates are gathered on
the addresses the channel is given: the HTTP listener's own address (the address the page was served from;
127.0.0.1 by default), all of the host's interface addresses when the listener is on a wildcard (aioice's own
choice: every address but loopback and IPv6 link-local), or `--webrtc-address` (a multi-homed host, a reverse
proxy in front of a loopback listener, a container). A STUN server is used only when configured (`--stun`):
then aiortc adds a server-reflexive candidate (a browser behind NAT reaches the bridge's public mapping) and
the page's RTCPeerConnection is given the same server (`GET /talk`); otherwise no packet leaves for anyone
but the browser. When every candidate is on loopback, the offer's other candidates are dropped and only
checks from this host are answered. The page itself needs a secure context for its microphone: served from
loopback, or over HTTPS (a TLS proxy in front of the listener; then `--webrtc-address` names the address the
browser reaches). The leg speaks the call-leg contract (sip/leg.py), so `Server._on_call` runs it through the
same session engine as a SIP call.

- Inbound: the browser's microphone (Opus or PCMU) is decoded by aiortc, resampled by PyAV to 8 kHz mono
  PCM16 and cut into 20 ms frames (`FrameReceived`).
- Outbound: the session enqueues 20 ms frames into the leg's `Playout`; `BrowserCushion` (the sans-I/O core
  below) holds an adaptive cushion of 120-200 ms (`bridge.engine.cushion.AdaptiveCushion`) before it starts a
  talkspurt, and the outbound track pulls one frame per 20 ms. A frame is *transmitted* when it is handed to
  aiortc's track (the encoder and the browser's transport), so that is what the ledger records and what
  `clear` cannot retract (HR4: the browser's clear scope); barge-in truncates there.
"""

from __future__ import annotations

import asyncio
import contextvars
import fractions
import ipaddress
import itertools
import logging
import re
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aioice.ice
import av
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcrtpsender import RTCRtpSender

from bridge.engine.cushion import AdaptiveCushion
from rtp.audio import FRAME_MS
from rtp.playout import OutboundFrame, Playout
from sip.leg import (
    CallEnded,
    CallIdentity,
    FrameReceived,
    LegEvent,
    LegFeatures,
    MediaStarted,
    PlayoutLeg,
    TransferProgress,
)

log = logging.getLogger("parlora.browser")

FRAME_BYTES = 320  # 20 ms of 8 kHz PCM16
FRAME_NS = FRAME_MS * 1_000_000
_MAX_OFFER_BYTES = 64 * 1024
_DTMF = re.compile(r"[0-9*#A-Da-d]{1,32}")


# --- the sans-I/O cushion core ---


class BrowserCushion:
    """The adaptive playback cushion in front of the browser's transport.

    `delivered(now, n)` notes that the session handed the playout `n` frames (it measures delivery jitter, as
    RFC 3550's interarrival estimator does); `pull(now)` is the outbound track's 20 ms tick. While idle the
    cushion *buffers*: a talkspurt starts once the queue holds `target_ms` (twice the jitter, within the
    120 ms floor and the 200 ms ceiling) or the first queued frame has waited `target_ms` (a short item is not
    held forever). Then one frame leaves per tick and is recorded in the ledger (`Playout.pull`); an empty
    queue mid-talkspurt counts an underrun and goes back to buffering. Everything still queued is clearable.
    """

    def __init__(self, playout: Playout, cushion: AdaptiveCushion | None = None) -> None:
        self.playout = playout
        self.cushion = cushion or AdaptiveCushion()
        self.jitter_ms = 0.0
        self.underruns = 0
        self.playing = False
        self._last_delivery: int | None = None
        self._last_frames = 0
        self._waiting_since: int | None = None

    @property
    def target_ms(self) -> int:
        return self.cushion.target_ms(self.jitter_ms)

    def delivered(self, now: int, frames: int) -> None:
        if frames <= 0:
            return
        if self._last_delivery is not None:
            gap_ms = (now - self._last_delivery) / 1e6
            expected_ms = self._last_frames * FRAME_MS
            if gap_ms < 1000:  # a pause between items is not jitter
                self.jitter_ms += (abs(gap_ms - expected_ms) - self.jitter_ms) / 16
        self._last_delivery, self._last_frames = now, frames
        if self._waiting_since is None and not self.playing:
            self._waiting_since = now

    def pull(self, now: int) -> OutboundFrame | None:
        """The frame to hand to the browser's transport this tick, or None (silence)."""
        depth_ms = self.playout.depth * FRAME_MS
        if not self.playing:
            if depth_ms == 0:
                self._waiting_since = None
                return None
            if self._waiting_since is None:
                self._waiting_since = now
            if depth_ms < self.target_ms and now - self._waiting_since < self.target_ms * 1_000_000:
                return None
            self.playing = True
        frame = self.playout.pull(now)  # recorded in the ledger: transmitted, out of clear scope (HR4)
        if frame is None:
            self.playing = False
            self._waiting_since = None
            self.underruns += 1
        return frame

    def next_deadline(self) -> int | None:
        """The cushion is driven by the track's own 20 ms tick; it arms no timer of its own."""
        return None


# --- SDP checks (peer input never raises out of here as anything but ValueError with a reason) ---


def check_offer(sdp: str) -> str:
    """The offer, validated: ValueError with a reason for a malformed one."""
    if len(sdp) > _MAX_OFFER_BYTES:
        raise ValueError("offer too large")
    if not sdp.startswith("v=0"):
        raise ValueError("offer is not an SDP session description (no v=0)")
    if "\nm=audio " not in sdp.replace("\r\n", "\n"):
        raise ValueError("offer has no audio m-line")
    if "a=ice-ufrag:" not in sdp or "a=fingerprint:" not in sdp:
        raise ValueError("offer lacks ICE credentials or a DTLS fingerprint")
    return sdp


def loopback_candidates(sdp: str) -> str:
    """The offer with every ICE candidate that is not on loopback removed (the channel is loopback-only). When
    none is left, its end-of-candidates goes too: aioice drops a component the peer gave no candidate for
    and then gathers nothing for it, so the answer would have no candidate at all."""
    lines = sdp.replace("\r\n", "\n").split("\n")
    kept = [ln for ln in lines if not ln.startswith("a=candidate:") or " 127.0.0.1 " in ln or " ::1 " in ln]
    if not any(ln.startswith("a=candidate:") for ln in kept):
        kept = [ln for ln in kept if not ln.startswith("a=end-of-candidates")]
    return "\r\n".join(kept)


def negotiated_codec(answer_sdp: str) -> str:
    """The first audio codec of an answer, as "opus/48000" or "PCMU/8000"."""
    payloads: list[str] = []
    for line in answer_sdp.replace("\r\n", "\n").split("\n"):
        if line.startswith("m=audio "):
            payloads = line.split()[3:]
        elif payloads and line.startswith(f"a=rtpmap:{payloads[0]} "):
            return "/".join(line.split(" ", 1)[1].split("/")[:2])
    return "unknown"


# --- the shell: aiortc ---


class BrowserLeg(PlayoutLeg):
    """One browser call as a `CallLeg`. Built by `BrowserChannel.answer`; `attach()` wires the peer."""

    features = LegFeatures(cushion=True)  # its adaptive 120-200 ms cushion (`cushion_frames`)

    def __init__(self, identity: CallIdentity, clock: Callable[[], int] = time.monotonic_ns) -> None:
        super().__init__()
        self._identity = identity
        self._clock = clock
        self.cushion = BrowserCushion(self.playout)
        self._events: asyncio.Queue[LegEvent | None] = asyncio.Queue(maxsize=500)
        self._ended = False
        self._answered = False
        self.peer: RTCPeerConnection | None = None  # closed (and cleared) when the call ends
        self.frames_in = 0
        self.frames_out = 0
        self.dropped_in = 0

    @property
    def identity(self) -> CallIdentity:
        return self._identity

    @property
    def lead_frames(self) -> int:
        """How many frames the session may keep queued here at most: the cushion's ceiling (200 ms)."""
        return self.cushion.cushion.ceiling_ms // FRAME_MS

    @property
    def cushion_frames(self) -> int:
        """`sip.leg.CushionedChannel`: the adaptive target (120-200 ms), read on every top-up."""
        return -(-self.cushion.target_ms // FRAME_MS)

    async def events(self) -> AsyncIterator[LegEvent]:
        while True:
            event = await self._events.get()
            if event is None:
                return
            yield event
            if isinstance(event, CallEnded):
                return

    def now(self) -> int:
        return self._clock()

    def enqueue(self, frames: list[OutboundFrame]) -> None:
        self.playout.enqueue(frames)
        self.cushion.delivered(self._clock(), len(frames))

    def answer(self) -> None:
        self._answered = True  # the SDP answer went back with the POST: nothing more to send

    def hangup(self, reason: str = "normal clearing", status: int = 503) -> None:
        self._end(reason, status, by_remote=False)

    def transfer(self, target: str) -> None:
        if not re.match(r"^(sips?|tel):", target):
            raise ValueError(f"not a sip:, sips: or tel: URI: {target!r}")
        # A browser cannot be transferred: the single, final outcome says so (the call stays up).
        self._post(TransferProgress(target, 501, "browser calls cannot be transferred", True))

    def send_dtmf(self, digits: str) -> None:
        if not _DTMF.fullmatch(digits):
            raise ValueError(f"not DTMF digits: {digits!r}")
        log.info(
            "call %s: DTMF %s not sent (a browser has no telephone-event)", self._identity.call_id, digits
        )

    # shell side

    def frame_in(self, pcm: bytes) -> None:
        """A 20 ms caller frame from the microphone."""
        if self._ended:
            return
        self.frames_in += 1
        self._post(FrameReceived(pcm, self.frames_in, self._clock()))

    def media_started(self, codec: str) -> None:
        self._post(MediaStarted(codec))

    def _post(self, event: LegEvent) -> None:
        if self._ended:
            return
        try:
            self._events.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped_in += 1  # the session is not reading: a slow consumer never blocks the media

    def _end(self, reason: str, status: int, *, by_remote: bool) -> None:
        if self._ended:
            return
        self._post(CallEnded(reason, status, by_remote, self.frames_in, self.frames_out))
        self._ended = True
        if self.peer is not None:
            pc, self.peer = self.peer, None
            asyncio.get_running_loop().create_task(pc.close())

    def remote_ended(self, reason: str) -> None:
        self._end(reason, 200, by_remote=True)


class OutboundTrack(MediaStreamTrack):
    """aiortc's audio track that the bridge clocks: one 20 ms frame on absolute deadlines t0 + n·20 ms. What
    `recv` returns is handed to the browser's transport: the cushion's pull records it in the ledger."""

    kind = "audio"

    def __init__(self, leg: BrowserLeg) -> None:
        super().__init__()
        self._leg = leg
        self._n = 0
        self._t0: float | None = None
        self._silence = bytes(FRAME_BYTES)

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        if self._t0 is None:
            self._t0 = loop.time()
        wait = self._t0 + self._n * FRAME_MS / 1000 - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        frame = self._leg.cushion.pull(self._leg.now())
        if frame is not None:
            self._leg.frames_out += 1
        out = av.AudioFrame(format="s16", layout="mono", samples=FRAME_BYTES // 2)
        out.planes[0].update(self._silence if frame is None else frame.pcm)
        out.sample_rate = 8000
        out.pts = self._n * (FRAME_BYTES // 2)
        out.time_base = fractions.Fraction(1, 8000)
        self._n += 1
        return out


async def _read_inbound(leg: BrowserLeg, track: Any) -> None:
    """The microphone: aiortc's decoded frames -> 8 kHz mono PCM16 -> 20 ms frames."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=8000)
    pending = bytearray()
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            leg.remote_ended("the browser closed its microphone track")
            return
        for out in resampler.resample(frame):
            pending += bytes(out.planes[0])[: out.samples * 2]
        while len(pending) >= FRAME_BYTES:
            leg.frame_in(bytes(pending[:FRAME_BYTES]))
            del pending[:FRAME_BYTES]


# The host addresses the ICE agent of the peer connection being built gathers on (None: aioice's own choice,
# every interface address). A context variable, not a global: `BrowserChannel.answer` sets it around aiortc's
# gathering, so two channels (or any other aioice user in the process) never see each other's choice.
_ice_hosts: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "parlora_ice_hosts", default=None
)
_ice_hooks_installed = False


def _install_ice_hooks() -> None:
    """Process-wide, once: aioice gathers on `_ice_hosts` when it is set (aioice never offers 127.0.0.1 by
    itself, so a loopback channel needs this); and a connection whose every local candidate is on loopback
    answers connectivity checks from this host only: from loopback, or from one of its interface addresses.
    A browser on the bridge's host offers its interface addresses, not loopback (Chromium offers 127.0.0.1
    only with a flag), and its checks to our loopback candidate come from them: the pair is learnt from
    them (peer-reflexive, RFC 8445 §7.3.1.3) and stays on the host. A connection with a candidate off
    loopback answers every source, as ICE wants (a browser behind NAT is known by its checks' source only)."""
    global _ice_hooks_installed
    if _ice_hooks_installed:
        return
    _ice_hooks_installed = True
    own_choice = aioice.ice.get_host_addresses

    def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        hosts = _ice_hosts.get()
        if hosts is None:
            return own_choice(use_ipv4, use_ipv6)
        return [h for h in hosts if (use_ipv6 if ":" in h else use_ipv4)]

    aioice.ice.get_host_addresses = get_host_addresses
    original = aioice.ice.Connection.request_received

    def request_received(
        self: aioice.ice.Connection, message: Any, addr: tuple[str, int], protocol: Any
    ) -> None:
        local = self.local_candidates
        if (
            local
            and all(_is_loopback(c.host) for c in local)
            and not _is_loopback(addr[0])
            and addr[0].split("%")[0] not in own_choice(True, True)  # ICE checks only: a few a second
        ):
            return
        original(self, message, addr, protocol)

    setattr(aioice.ice.Connection, "request_received", request_received)  # noqa: B010 (a method, on purpose)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def ice_hosts_for(bound: Iterable[str]) -> tuple[str, ...] | None:
    """The ICE host addresses for an HTTP listener bound to `bound` (its sockets' addresses): those addresses,
    or None (every interface address, aioice's choice) when one of them is a wildcard (0.0.0.0, ::)."""
    hosts: list[str] = []
    for host in bound:
        address = ipaddress.ip_address(host.split("%")[0])
        if address.is_unspecified:
            return None
        if str(address) not in hosts:
            hosts.append(str(address))
    return tuple(hosts)


def _check_bindable(host: str) -> None:
    """ValueError unless `host` is an address of this host (aioice binds its UDP sockets to it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
    except OSError as exc:
        raise ValueError(
            f"cannot gather WebRTC candidates on {host}: not an address of this host ({exc.strerror}); "
            "behind NAT give --stun instead"
        ) from None


@dataclass(frozen=True, slots=True)
class Answer:
    call_id: str
    sdp: str


class BrowserChannel:
    """Answers WebRTC offers from the console page and hands each call to `on_call` as a `BrowserLeg`.

    `ice_hosts` are the addresses ICE gathers host candidates on (the default keeps ICE on 127.0.0.1; None:
    every interface address, for a listener on a wildcard); ValueError if one is not an address of this
    host. When all of them are on loopback the offer's other candidates are dropped. `ice_servers` are STUN
    URLs (`stun:HOST[:PORT]`) for aiortc's RTCConfiguration; none by default, so ICE sends nothing to anyone
    but the browser. A peer that never completes ICE and DTLS within `connect_timeout_s` is closed and its
    call ended."""

    def __init__(
        self,
        on_call: Callable[[BrowserLeg], None],
        *,
        ice_hosts: tuple[str, ...] | None = ("127.0.0.1",),
        ice_servers: tuple[str, ...] = (),
        connect_timeout_s: float = 10.0,
    ) -> None:
        for host in ice_hosts or ():
            _check_bindable(host)
        self._on_call = on_call
        self._hosts = ice_hosts
        self._loopback = ice_hosts is not None and all(_is_loopback(h) for h in ice_hosts)
        self._servers = ice_servers
        self._timeout = connect_timeout_s
        self._ids = itertools.count(1)
        self.legs: dict[str, BrowserLeg] = {}
        _install_ice_hooks()

    def configuration(self) -> RTCConfiguration:
        """aiortc's configuration of each peer connection: the STUN servers, and no others (aiortc's own default
        would be a public STUN server)."""
        return RTCConfiguration(iceServers=[RTCIceServer(urls=list(self._servers))] if self._servers else [])

    async def answer(self, offer_sdp: str, source: str) -> Answer:
        """The SDP answer for a browser's offer; ValueError (a 400) for a malformed offer."""
        sdp = check_offer(offer_sdp)
        if self._loopback:
            sdp = loopback_candidates(sdp)
        call_id = f"web-{next(self._ids)}"
        identity = CallIdentity(
            call_id=call_id,
            sip_call_id=call_id,
            from_uri="browser:console",
            to_uri="browser:talk",
            request_user="talk",
            source=source,
            headers=(("X-Channel", "browser"),),
        )
        leg = BrowserLeg(identity)
        pc = RTCPeerConnection(self.configuration())
        leg.peer = pc
        transceiver = pc.addTransceiver(OutboundTrack(leg), direction="sendrecv")
        codecs = [
            c
            for c in RTCRtpSender.getCapabilities("audio").codecs
            if c.mimeType in ("audio/opus", "audio/PCMU")
        ]
        transceiver.setCodecPreferences(codecs)
        tasks: set[asyncio.Task[None]] = set()

        @pc.on("track")
        def _on_track(track: Any) -> None:
            if track.kind == "audio":
                task = asyncio.get_running_loop().create_task(_read_inbound(leg, track))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        @pc.on("connectionstatechange")
        def _on_state() -> None:
            state = pc.connectionState
            if state == "connected":
                leg.media_started(negotiated_codec(pc.localDescription.sdp))
            elif state in ("failed", "closed"):
                leg.remote_ended(f"WebRTC connection {state}")
                self.legs.pop(call_id, None)

        gathering = _ice_hosts.set(self._hosts)  # aiortc gathers in setLocalDescription
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:  # aiortc's parser raises anything from ValueError to KeyError on bad SDP
            await pc.close()
            raise ValueError(f"cannot answer the offer: {exc}") from exc
        finally:
            _ice_hosts.reset(gathering)
        self.legs[call_id] = leg
        self._on_call(leg)
        asyncio.get_running_loop().create_task(self._watch(leg, pc))
        return Answer(call_id, pc.localDescription.sdp)

    async def _watch(self, leg: BrowserLeg, pc: Any) -> None:
        """Clean up a peer that never connects."""
        await asyncio.sleep(self._timeout)
        if pc.connectionState != "connected" and leg.peer is pc:
            log.warning(
                "call %s: WebRTC did not connect within %.0f s; closing", leg.identity.call_id, self._timeout
            )
            leg.remote_ended("ICE/DTLS did not complete")
            self.legs.pop(leg.identity.call_id, None)

    async def close(self) -> None:
        for leg in list(self.legs.values()):
            leg.hangup("bridge stopping")
        self.legs.clear()
