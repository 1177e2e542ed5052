"""One answered call's media, sans-I/O: the slot loop the native engine runs 50 times a second per call.

`CallMedia` owns the call's `RtpStream` (rtp.stream), its SRTP context (rtp.srtp), the Playout the session fills
(rtp.playout), the call's limits (rtp.limits) and the one-way-audio window. It reads no clock and touches no
socket: datagrams and `now` in; frames, datagrams and the next deadline out, each pulled by the shell
(sip/native/agent.py `_CallMedia`, which owns the socket pair and the session's queue):

    on an RTP datagram:   digit = media.receive(data, source, now)     # SRTP, the stream; DtmfDigit | None
    on an RTCP datagram:  media.receive_rtcp(data, source, now)
    on a clock tick:      if skipped: media.skip(skipped, now)         # rtp.clock: a late wake-up's slots
                          for each due slot:
                              frame = media.pull_frame(now)            # the caller's frame, for the session
                              datagram = media.pull_datagram(now)      # this slot's RTP (None: nothing to send)
                              if datagram is not None:
                                  if sendto(datagram, media.to):      # then, only if media.out is a frame:
                                      media.sent(clock())             #   the carrier ledger, at the time
                                  else: media.unsent()                #   sendto returned; a failed send: counted
                          if media.owing:                              # once a tick: a skipped slot's frame
                              frame = media.pull_backlog(now)
                          if now >= media.wake_at or media.stream.next_deadline() <= now:  # (not None)
                              for item in media.handle_timer(now): ...  # bytes: RTCP (protected) to
                                                                        # media.stream.rtcp_destination;
                                                                        # DtmfDigit; LimitReached; OneWayAudio

Inbound: the slot's frame comes out of `RtpStream.pull_frame` every slot, and is handed on only while the caller
sends by its SDP (not held, not recvonly). A late clock's skipped slots are owed (rtp.jitter `skip`): one more
frame a tick until they are paid, so the provider hears every word. Outbound: while we send by the SDP, each slot
takes one frame from the Playout (none while an RFC 4733 event is being sent), a PCMU call sends the provider's
own µ-law as it came (bit-exact, DESIGN §5), a G.722 call (rtp.g722) encodes every slot's frame, silence in an
idle one (its encoder must follow what the peer decodes), and the frame enters the carrier ledger only once
`sendto` returned (DESIGN §3.2, §11, HR4); on hold (we are recvonly / inactive) RTP time goes on and nothing is sent.

The limits (rtp.limits) and the one-way-audio window (rtp.stream `arrival_problem`, ARRIVAL_WINDOW_MS after the
media started or resumed) are deadlines in `next_deadline()`, beside the stream's RTCP and DTMF ones: one
call and one comparison a tick. The slot path allocates nothing of its own (the jitter buffer's frame and
SRTP's output aside), logs nothing and takes no lock but the Playout's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rtp.audio import PCM16_FRAME_BYTES
from rtp.dtmf import DtmfDigit
from rtp.g711 import alaw_encode, ulaw_encode
from rtp.g722 import G722Encoder
from rtp.jitter import PlayoutFrame
from rtp.latch import Address
from rtp.limits import NEVER, Action, CallLimits
from rtp.opus import OpusEncoder
from rtp.playout import OutboundFrame, Playout
from rtp.resample import NarrowView
from rtp.srtp import SrtpContext
from rtp.stream import ARRIVAL_WINDOW_MS, OneWayAudio, RtpStream
from rtp.units import NS_PER_MS

__all__ = ["CallMedia", "LimitReached", "TimerItem"]


@dataclass(frozen=True, slots=True)
class LimitReached:
    """A call limit was reached (rtp.limits): the shell hangs up, asks for the goodbye, or sends the backstop."""

    action: Action


TimerItem = bytes | DtmfDigit | LimitReached | OneWayAudio


class _Narrowed:
    """An 8 kHz encoder that also takes a 16 kHz frame (640 bytes), through its 8 kHz view."""

    __slots__ = ("_encode", "_view")

    def __init__(self, encode: Callable[[bytes], bytes]) -> None:
        self._encode, self._view = encode, NarrowView()

    def __call__(self, pcm: bytes) -> bytes:
        return self._encode(pcm if len(pcm) == PCM16_FRAME_BYTES else self._view(pcm))


class CallMedia:
    """One call's media core; see the module docstring. `sends` / `receives` / `held` are the SDP's direction
    from our side (we send, the caller sends, the caller holds the call)."""

    __slots__ = (
        "_arrival_at",
        "_encode",
        "_idle",
        "_listening",
        "_passthrough",
        "frames_in",
        "frames_out",
        "frames_unsent",
        "held",
        "last_rtp",
        "limits",
        "out",
        "owing",
        "playout",
        "receives",
        "sends",
        "srtp",
        "stream",
        "to",
        "wake_at",
    )

    def __init__(
        self,
        stream: RtpStream,
        playout: Playout,
        *,
        srtp: SrtpContext | None = None,
        sends: bool = True,
        receives: bool = True,
        held: bool = False,
    ) -> None:
        self.stream = stream
        self.playout = playout
        self.srtp = srtp
        self._encoder_of(stream.codec)
        self.sends, self.receives, self.held = sends, receives, held
        self._listening = receives and not held
        self.frames_in = 0
        self.frames_out = 0
        self.frames_unsent = (
            0  # taken from the Playout but not sent (sendto failed, no address): not in the ledger
        )
        self.out: OutboundFrame | None = (
            None  # the frame in the datagram last pulled, until sent() / unsent()
        )
        self.to: Address = ("", 0)  # where that datagram goes (set with it)
        self.last_rtp = 0  # when the stream last took a caller packet (the RTP timeout counts from it)
        self.limits = CallLimits(0)  # none until set_limits
        self.owing = False  # frames of slots a late clock skipped may be owed (`pull_backlog` then has work)
        self._arrival_at = NEVER
        self.wake_at = NEVER  # the soonest of the limits' and the arrival window's deadlines

    # --- set-up and changes ---

    def set_limits(
        self,
        now: int,
        max_call_duration_s: float | None,
        rtp_timeout_s: float | None,
        hold_timeout_s: float | None = None,
        goodbye_grace_s: float | None = None,
    ) -> None:
        """The call's limits from `now`, the media start (which counts as a caller packet; a call whose caller
        sends nothing by its SDP is held from the start)."""
        self.last_rtp = now
        self.limits = CallLimits(
            now,
            max_call_duration_s=max_call_duration_s,
            rtp_timeout_s=rtp_timeout_s,
            hold_timeout_s=hold_timeout_s,
            silent=not self._listening,
            goodbye_grace_s=goodbye_grace_s,
        )
        self._rewake()

    def watch_arrival(self, now: int) -> None:
        """Check, ARRIVAL_WINDOW_MS from `now`, that usable RTP came (unless it has, or the call was judged)."""
        stream = self.stream
        if stream.packets_in == 0 and stream.one_way_audio is None:
            self._arrival_at = now + ARRIVAL_WINDOW_MS * NS_PER_MS
            self._rewake()

    def _encoder_of(self, codec: str) -> None:
        self._passthrough = codec == "PCMU"
        rate = self.stream.media_rate  # Opus at 16 kHz on a 16 kHz stream (rtp.opus)
        encoder = G722Encoder() if codec == "G722" else OpusEncoder(rate) if codec == "OPUS" else None
        self._encode: Callable[[bytes], bytes] = (
            encoder if encoder is not None else ulaw_encode if self._passthrough else alaw_encode
        )
        if codec != "G722" and rate == 8000:
            # an 8 kHz codec takes the 8 kHz view of a 16 kHz frame (a G.722 leg's relayed by a warm transfer,
            # a 16 kHz session re-offered to G.711); an 8 kHz frame passes as it is (one length test)
            self._encode = _Narrowed(self._encode)
        # G.722 and Opus encode silence in a slot with nothing to say (its encoder's state must follow every frame
        # the peer decodes: rtp.g722); G.711 sends the stream's idle pattern
        self._idle = encoder.silence if encoder is not None else None

    def recodec(self, payload_type: int, codec: str | None, dtmf_payload_type: int | None) -> None:
        """A re-INVITE's answer changed the codec (same RTP clock: `RtpStream.recodec`): the next slot sends the
        new one, with a fresh encoder."""
        self.stream.recodec(payload_type, codec, dtmf_payload_type)
        self._encoder_of(self.stream.codec)

    def update(self, now: int, *, sends: bool, receives: bool, held: bool, remote: Address | None) -> None:
        """A re-INVITE/UPDATE changed the stream: direction, hold, remote address. The hold limit starts with a
        hold, the RTP timeout again from a resume, and the arrival window too when nothing usable came yet."""
        self.sends, self.receives, self.held = sends, receives, held
        self._listening = receives and not held
        self.stream.signal(remote, now=now)
        if self._listening and self._arrival_at == NEVER:
            self.watch_arrival(now)  # resumed before any usable RTP came: the window starts again
        self.limits.media_changed(now, not self._listening)
        self._rewake()

    def mute_input(self, muted: bool) -> None:
        """Before the answer of a call we play early media to (sip/native/early.py): the caller's frames are
        pulled and dropped, not handed on, so the session hears the call from its answer and never a backlog."""
        self._listening = not muted and self.receives and not self.held

    # --- inbound datagrams ---

    def receive(self, data: bytes, source: Address, now: int) -> DtmfDigit | None:
        """One datagram of the RTP socket (SRTP unprotected first: a failed tag is counted there and dropped).
        Only a packet the stream took counts for the RTP timeout: datagrams from another source, or malformed
        ones, do not keep a dead call alive."""
        srtp = self.srtp
        if srtp is not None:
            plain = srtp.unprotect(data)
            if plain is None:
                return None
            data = plain
        stream = self.stream
        taken = stream.packets_in
        event = stream.receive(data, source, now)
        if stream.packets_in != taken:
            self.last_rtp = now
        return event if type(event) is DtmfDigit else None

    def receive_rtcp(self, data: bytes, source: Address, now: int) -> None:
        """One datagram of the RTCP socket (SRTCP unprotected first)."""
        srtp = self.srtp
        if srtp is not None:
            plain = srtp.unprotect_rtcp(data)
            if plain is None:
                return
            data = plain
        self.stream.receive_rtcp(data, source, now)

    # --- the slot ---

    def skip(self, slots: int, now: int) -> None:
        """A late clock skipped `slots`: RTP time moves on; their inbound frames are owed (`pull_backlog`)."""
        stream = self.stream
        stream.skip(slots)
        stream.jitter.skip(slots, now)
        self.owing = stream.jitter.owed > 0

    def pull_frame(self, now: int) -> PlayoutFrame | None:
        """This slot's caller frame (rtp.stream `pull_frame`, called every slot), or None: none yet, or the
        caller does not send by its SDP (the frame is taken all the same, so the buffer stays in step)."""
        frame = self.stream.pull_frame(now)
        if frame is None or not self._listening:
            return None
        self.frames_in += 1
        return frame

    def pull_backlog(self, now: int) -> PlayoutFrame | None:
        """After a tick's slots: one frame of a slot a late clock skipped, while any is owed (`owing` says
        whether to ask: one attribute test a tick)."""
        if not self._listening:
            return None
        jitter = self.stream.jitter
        frame = jitter.pop_backlog(now)
        self.owing = jitter.owed > 0
        if frame is not None:
            self.frames_in += 1
        return frame

    def pull_datagram(self, now: int) -> bytes | memoryview | None:
        """This slot's RTP datagram for `to` (SRTP when agreed), carrying the Playout's next frame (`out`), the
        codec's idle pattern, or a DTMF event; None when this slot sends nothing (on hold, between a DTMF event's
        updates, no address yet). A view of the stream's buffer: valid until the next call."""
        stream = self.stream
        if not self.sends:  # on hold (we are recvonly / inactive): RTP time goes on, nothing is sent
            stream.skip(1)
            return None
        wants = stream.wants_audio(now)
        out = self.playout.take() if wants else None
        payload = None
        if out is not None:  # a PCMU call sends the provider's own µ-law as it came (bit-exact)
            pcmu = out.pcmu if self._passthrough else None
            payload = pcmu if pcmu is not None else self._encode(out.pcm)
        elif self._idle is not None and wants:
            payload = self._encode(self._idle)
        packet = stream.next_packet(payload, now)
        to = stream.destination
        if packet is None or to is None:
            if out is not None:
                self.frames_unsent += 1
            return None
        self.out = out
        self.to = to
        srtp = self.srtp
        return srtp.protect(packet) if srtp is not None else packet

    def sent(self, now: int) -> None:
        """The datagram last pulled was handed to the kernel at `now` (when sendto returned): its frame is
        transmitted, into the carrier ledger (DESIGN §11, HR4)."""
        out = self.out
        if out is not None:
            self.out = None
            self.playout.transmitted(out, now)
            self.frames_out += 1

    def unsent(self) -> None:
        """The datagram last pulled did not leave (sendto failed): its frame is counted, never in the ledger."""
        if self.out is not None:
            self.out = None
            self.frames_unsent += 1

    # --- deadlines ---

    def next_deadline(self) -> int:
        """The soonest of the call's limits, the one-way-audio window, the RTCP report and a DTMF timeout (NEVER
        when none is armed). A tick asks it as `now >= wake_at` or the stream's own `next_deadline()`: measured,
        this method's one more Python frame cost the whole slot 5 % in tests/bench/rtp_micro.py."""
        wake = self.wake_at
        stream = self.stream.next_deadline()
        return stream if stream is not None and stream < wake else wake

    def handle_timer(self, now: int) -> list[TimerItem]:
        """What is due at `now`: the one-way-audio diagnosis (once), a limit reached, digits whose end packets
        were lost, an RTCP report (SRTCP when agreed)."""
        out: list[TimerItem] = []
        if now >= self._arrival_at:
            problem = self._arrival(now)
            if problem is not None:
                out.append(problem)
        if now >= self.limits.deadline:
            action = self.limits.check(now, self.last_rtp)
            if action is not None:
                out.append(LimitReached(action))
        self._rewake()
        stream = self.stream
        due = stream.next_deadline()
        if due is not None and due <= now:
            for item in stream.handle_timer(now):
                out.append(self._rtcp_out(item) if type(item) is bytes else item)
        return out

    def _rewake(self) -> None:
        arrival, limit = self._arrival_at, self.limits.deadline
        self.wake_at = arrival if arrival < limit else limit

    def goodbye(self, now: int) -> bytes:
        """The RTCP BYE to send as the call ends (RFC 3550 §6.6)."""
        return self._rtcp_out(self.stream.goodbye(now))

    def _rtcp_out(self, data: bytes) -> bytes:
        return self.srtp.protect_rtcp(data) if self.srtp is not None else data

    def _arrival(self, now: int) -> OneWayAudio | None:
        """The window is over: nothing to say if usable RTP came or the caller is not meant to send (on hold:
        the window starts again on resume); else why not, marked on the stream for its figures."""
        self._arrival_at = NEVER
        if not self._listening:
            return None
        srtp = self.srtp
        problem = self.stream.arrival_problem(srtp.auth_failures if srtp is not None else 0)
        if problem is not None:
            self.stream.one_way_audio = problem
        return problem
