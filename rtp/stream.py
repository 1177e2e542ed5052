"""One call's media core: RTP and RTCP in, 20 ms frames and digits out; frames in, RTP datagrams out.

Sans-I/O. The call's media core (rtp.media `CallMedia`, which adds SRTP, the Playout, the limits and the
one-way-audio window) drives a stream so, for the engine's shell that owns the sockets and the media clock:

    on every datagram:      event = stream.receive(data, source, now)   # None, a DtmfDigit or RtcpReceived
                            (a second socket for RTCP, without rtcp-mux: stream.receive_rtcp(...))
    on every clock slot:    frame = stream.pull_frame(now)               # PlayoutFrame | None -> FrameReceived
                            if stream.wants_audio(now): out = playout.pull(now) ...  # else leave it queued
                            dgram = stream.next_packet(payload_or_None, now)       # memoryview | None
                            sendto(dgram, stream.destination); then the ledger records the frame
    for skipped slots:      stream.skip(slots)   # outbound time moves on; nothing is sent for them
                            (inbound: stream.jitter.skip(slots, now), then one owed frame a tick from
                            jitter.pop_backlog, or the caller's audio reaches the session that many frames
                            later until the jitter buffer sheds the excess, one frame a second)
    at next_deadline():     for item in stream.handle_timer(now): bytes -> send to rtcp_destination,
                                                                   DtmfDigit -> DtmfReceived
    at hang-up:             stream.goodbye(now) -> the RTCP BYE datagram

Outbound continuity: the SSRC never changes; the sequence number grows by one per packet sent and the
timestamp by 160 per slot (960 for Opus, whose RTP clock is 48000 Hz: rtp.opus) (sent, DTMF-replaced, or skipped), so silence, barge-in clears and playback epochs
(rtp.playout) never show as a discontinuity. The payload handed to `next_packet` (one 20 ms frame per slot)
goes on the wire as it is (PCMU from the provider byte for byte); None sends the codec's idle pattern, so RTP
never stops. The marker bit is set on the first packet and on the first packet after skipped slots.

Inbound: each datagram is parsed (rtp.packet), checked against the source policy (rtp.latch), counted in
the receiver statistics (rtp.rtcp, A.1/A.3/A.8), then filed in the jitter buffer (audio), given to the
RFC 4733 receiver (the negotiated telephone-event PT), counted as comfort noise (PT 13) or dropped. Every
drop has its reason counted in `drops` (indexed by `Drop`); nothing raises.

One-way audio: `arrival_problem()` says why no usable packet has arrived (None once one has): SRTP that failed
authentication, a source refused or never learned (rtp.latch), payload types not negotiated, malformed
datagrams, or nothing at all; the shell asks once, ARRIVAL_WINDOW_MS (4 s) after the media started (or
resumed from a hold the call began in), logs its one line and sets `one_way_audio`, which `qos()` carries into
the status and the call record. 4 s: well past a normal start (a phone's RTP starts with the answer, and
learning takes 4 packets), short enough that the line is there while the caller still waits to be heard.
Comfort noise counts as usable; a phone that suppresses silence without sending comfort noise and stays
silent for the first 4 s is marked `no_rtp`, which is what the bridge saw.

`next_packet` returns a view of the stream's own send buffer: valid until the next `next_packet` call
(asyncio's `sendto` copies whatever it cannot send at once, so handing it the view is safe).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from rtp.audio import FRAME_MS, FRAME_SAMPLES
from rtp.dtmf import DtmfDigit, DtmfReceiver, DtmfSender
from rtp.g722 import G722, WIDE_RATE, G722Decoder
from rtp.jitter import JitterBuffer, PlayoutFrame, fast_alaw_decode, fast_ulaw_decode
from rtp.latch import Address, SourceLatch, SourcePolicy
from rtp.opus import OPUS_CLOCK, OpusDecoder
from rtp.packet import Drop, RtpPacket, is_rtcp
from rtp.plc import Concealer
from rtp.rtcp import Goodbye, QoS, RtcpPacket, RtcpSession
from rtp.speedups import pack_into, parse  # rtp.packet's, compiled where built

__all__ = [
    "StreamConfig",
    "RtcpReceived",
    "RtpStream",
    "OneWayAudio",
    "ONE_WAY_CAUSES",
    "ARRIVAL_WINDOW_MS",
    "PCMU",
    "PCMA",
    "G722",
    "COMFORT_NOISE",
    "stream_codec",
]

PCMU, PCMA, COMFORT_NOISE = 0, 8, 13
# a 20 ms frame of silence in each codec (G.722: what its encoder gives for silence once settled; Opus: the
# 3-byte silent CELT frame; rtp.media encodes G.722's and Opus's idle slots instead of sending these)
_IDLE = {
    "PCMU": b"\xff" * FRAME_SAMPLES,
    "PCMA": b"\xd5" * FRAME_SAMPLES,
    "G722": b"\xfa" * FRAME_SAMPLES,
    "OPUS": b"\xf8\xff\xfe",
}
_BY_PT = {PCMU: "PCMU", PCMA: "PCMA", G722: "G722"}
_WIDE_CODECS = frozenset(("G722", "OPUS"))  # run at a 16 kHz stream's `media_rate` (rtp.g722, rtp.opus)


def stream_codec(config: StreamConfig) -> str:
    """The stream's codec: `config.codec`, or by its static payload type; ValueError for one we do not run."""
    codec = config.codec or _BY_PT.get(config.payload_type)
    if codec not in _IDLE or (codec == "OPUS") != (config.clock_rate == OPUS_CLOCK):
        raise ValueError("payload_type must be 0 (PCMU), 8 (PCMA) or 9 (G722), or codec OPUS at 48000 Hz")
    return codec


def _decoder(codec: str, media_rate: int = 8000) -> Callable[[bytes], bytes]:
    """A fresh decoder of `codec` (G.722's and Opus's keep state from frame to frame); G.722 and Opus at 16 kHz
    when the stream's `media_rate` is (rtp.g722, rtp.opus)."""
    if codec == "PCMU":
        return fast_ulaw_decode
    if codec == "PCMA":
        return fast_alaw_decode
    wide = media_rate == WIDE_RATE
    return G722Decoder(wide=wide) if codec == "G722" else OpusDecoder(WIDE_RATE if wide else 8000)


def frame_rate(codec: str, media_rate: int) -> int:
    """The PCM rate of the frames a stream of `codec` hands the session: 16000 for G.722 and Opus where the
    stream's `media_rate` is 16000, else 8000 (G.711, and every codec of an 8 kHz stream)."""
    return WIDE_RATE if codec in _WIDE_CODECS and media_rate == WIDE_RATE else 8000


_MAX_PAYLOAD = 1200


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """What SDP negotiated and the shell chose. `ssrc`, `initial_seq` and `initial_timestamp` should be
    random (RFC 3550 §5.1); the shell draws them (the core reads no randomness or clock itself)."""

    ssrc: int
    initial_seq: int
    initial_timestamp: int
    cname: str
    remote: Address | None  # the peer's signalled RTP address
    remote_rtcp: Address | None = None  # a=rtcp, else RTP port + 1 (or the RTP address with rtcp-mux)
    payload_type: int = PCMU  # 0 PCMU, 8 PCMA or 9 G722 (rtp.g722): what we send and what we decode
    codec: str | None = None  # None: by payload_type; "OPUS" (rtp.opus) for its dynamic one, at clock 48000
    clock_rate: int = 8000  # the RTP clock: 8000 (G.722 too, RFC 3551 §4.5.2), Opus 48000 (RFC 7587)
    # the session frames' PCM rate where the codec's is wider (`frame_rate`): 16000 runs G.722 at 16 kHz both
    # ways (rtp.g722); 8000 for an engine whose session takes 8 kHz frames only
    media_rate: int = 8000
    dtmf_payload_type: int | None = 101  # telephone-event/8000, None if not negotiated
    rtcp_mux: bool = False
    nat: bool = False
    source_policy: SourcePolicy = "learn"  # rtp.latch: learn the caller's source, or only the signalled one
    jitter_min_ms: int = 20
    jitter_max_ms: int = 200
    wallclock_offset_ns: int = 0  # time.time_ns() - time.monotonic_ns(), for NTP timestamps in SR
    dtmf_duration_ms: int = 160
    dtmf_gap_ms: int = 100


ARRIVAL_WINDOW_MS = 4000  # media start (or resume) to the one-way-audio diagnosis when nothing usable came
ONE_WAY_CAUSES = ("srtp_auth", "source_refused", "payload_type", "malformed", "no_rtp")


@dataclass(frozen=True, slots=True)
class OneWayAudio:
    """Why a call received no usable RTP (`RtpStream.arrival_problem`): `cause` is one of ONE_WAY_CAUSES (a
    closed set: a metric label), `detail` the sentence for the call's one log line (addresses, payload types,
    counts)."""

    cause: str
    detail: str


@dataclass(frozen=True, slots=True)
class RtcpReceived:
    """An RTCP datagram was read (the figures are in `qos()`); `bye` when the peer said goodbye."""

    packets: tuple[RtcpPacket, ...]
    bye: Goodbye | None


class RtpStream:
    """The media core of one call (one RTP session, one remote source, G.711 or G.722 with an 8 kHz RTP clock)."""

    pull_frame: Callable[[int], PlayoutFrame | None]
    """`pull_frame(now)`: this slot's inbound frame (None until the caller's first packet), once per clock slot.
    The jitter buffer's `pop` itself, with no call in between (rtp.media `CallMedia.pull_frame` runs it 50 times
    a second per call)."""

    def __init__(self, config: StreamConfig, rand: Callable[[], float]) -> None:
        codec = stream_codec(config)
        self.codec = codec
        self.config = config
        self._pt = config.payload_type
        self._dtmf_pt = config.dtmf_payload_type if config.dtmf_payload_type is not None else -1
        self._mux = config.rtcp_mux
        self._ssrc = config.ssrc
        self._seq = config.initial_seq & 0xFFFF
        self._ts = config.initial_timestamp & 0xFFFFFFFF
        self._marker = True
        self._step = config.clock_rate // (1000 // FRAME_MS)  # timestamp units a 20 ms frame: 160, Opus 960
        self._silence = _IDLE[codec]
        self._buf = bytearray(12 + _MAX_PAYLOAD)
        self._view = memoryview(self._buf)
        self._last_n = 12 + FRAME_SAMPLES
        self._last_view = self._view[: self._last_n]
        self.latch = SourceLatch(config.remote, config.nat, policy=config.source_policy)
        self.media_rate = frame_rate(codec, config.media_rate)  # the decoded frames' PCM rate
        self.jitter = JitterBuffer(
            _decoder(codec, config.media_rate),
            min_ms=config.jitter_min_ms,
            max_ms=config.jitter_max_ms,
            silence_byte=self._silence[0],
            frame_ts=self._step,
            sliced=codec != "OPUS",
            plc=Concealer(self.media_rate // 8000),
        )
        self.pull_frame = self.jitter.pop
        # Opus's decoder needs each packet's sequence number (rtp.opus: its PLC runs for the packets it missed)
        self._push = self._push_sequenced if codec == "OPUS" else self.jitter.push
        self.rtcp = RtcpSession(
            config.ssrc,
            config.cname,
            rand,
            wallclock_offset_ns=config.wallclock_offset_ns,
            clock_rate=config.clock_rate,
        )
        self._stats = self.rtcp.receiver
        self.dtmf_in = DtmfReceiver()
        self.dtmf_out = DtmfSender(duration_ms=config.dtmf_duration_ms, gap_ms=config.dtmf_gap_ms)
        self._remote_rtcp = config.remote_rtcp
        self._rtcp_source: Address | None = None
        self._in_ssrc = -1
        self.drops = [0] * len(Drop)
        self.packets_in = 0
        self.comfort_noise = 0
        self.ssrc_changes = 0
        self.packets_out = 0
        self.dtmf_packets_out = 0
        self.slots_skipped = 0
        self._started = False
        self._pending_digits: list[DtmfDigit] = []
        self._pending_at = 0
        self.unknown_pt = -1  # the last payload type dropped as not negotiated (for the diagnosis)
        self.one_way_audio: OneWayAudio | None = None  # set by the shell when its arrival check found nothing

    def recodec(self, payload_type: int, codec: str | None, dtmf_payload_type: int | None) -> None:
        """A re-INVITE's answer changed the codec, in the same RTP clock: send and decode the new one from the
        next packet. The SSRC, sequence numbers and timestamps go on (RFC 3550 §5.1: a payload type change
        within a source); the jitter buffer drops what it held of the old codec. ValueError for a codec this
        stream cannot run or a change of the RTP clock (the SIP core refuses those re-offers with 488)."""
        config = replace(
            self.config, payload_type=payload_type, codec=codec, dtmf_payload_type=dtmf_payload_type
        )
        new = stream_codec(config)
        if new == "OPUS" or self.codec == "OPUS":
            raise ValueError("a codec change to or from Opus changes the RTP clock")
        self.config = config
        self.codec = new
        self._pt = payload_type
        self._dtmf_pt = dtmf_payload_type if dtmf_payload_type is not None else -1
        self._silence = _IDLE[new]
        rate = frame_rate(new, config.media_rate)  # G.722 <-> G.711 on a 16 kHz stream: the frames' rate too
        plc = Concealer(rate // 8000) if rate != self.media_rate else None
        self.media_rate = rate
        self.jitter.recodec(_decoder(new, config.media_rate), self._silence[0], plc)

    # --- addresses ---

    @property
    def destination(self) -> Address | None:
        """Where RTP goes: the latched source (symmetric RTP) or the signalled address."""
        return self.latch.destination

    @property
    def rtcp_destination(self) -> Address | None:
        if self._mux:
            return self.latch.destination
        if self._rtcp_source is not None:
            return self._rtcp_source
        if self._remote_rtcp is not None:
            return self._remote_rtcp
        dest = self.latch.destination
        return (dest[0], dest[1] + 1) if dest is not None else None

    def signal(
        self, remote: Address | None, remote_rtcp: Address | None = None, now: int | None = None
    ) -> None:
        """The peer's SDP named an address (re-INVITE, UPDATE): the latch re-learns as rtp.latch says."""
        self.latch.signal(remote, now)
        self._remote_rtcp = remote_rtcp
        self._rtcp_source = None

    # --- inbound ---

    def receive(self, data: bytes, source: Address, now: int) -> DtmfDigit | RtcpReceived | None:
        """One datagram from the RTP socket. Audio goes to the jitter buffer (frames come out of
        `pull_frame`); a digit whose event ended, or the RTCP read (rtcp-mux), is returned."""
        if self._mux and is_rtcp(data):
            return self.receive_rtcp(data, source, now)
        p = parse(data)
        if isinstance(p, Drop):
            self.drops[p] += 1
            return None
        if not self.latch.accept(source, p.ssrc, now, p.seq):
            self.drops[Drop.WRONG_SOURCE] += 1
            return None
        pt = p.pt
        if p.ssrc != self._in_ssrc:
            # A packet the call cannot use never switches its source: one of a payload type not
            # negotiated, or a telephone-event of a malformed length, is dropped before the receiver
            # statistics and the digit receiver are reset for a new SSRC.
            if pt != self._pt and pt != self._dtmf_pt and pt != COMFORT_NOISE:
                self.drops[Drop.UNKNOWN_PT] += 1
                self.unknown_pt = pt
                return None
            if pt == self._dtmf_pt and (len(p.payload) < 4 or len(p.payload) % 4):
                self.drops[Drop.BAD_DTMF] += 1
                return None
            self._new_source(p.ssrc)
            if not self._started:
                self._start(now)
        self.packets_in += 1
        self._stats.update(p.seq, p.timestamp, now, len(p.payload), pt == self._pt)
        if pt == self._pt:
            dropped = self._push(p.seq, p.timestamp, p.ssrc, p.payload, now)
            if dropped is not None:
                self.drops[dropped] += 1
            return None
        if pt == self._dtmf_pt:
            return self._dtmf(p, now)
        if pt == COMFORT_NOISE:
            self.comfort_noise += 1  # RFC 3389 comfort noise: the jitter buffer plays silence meanwhile
            return None
        self.drops[Drop.UNKNOWN_PT] += 1
        self.unknown_pt = pt
        return None

    def _push_sequenced(self, seq: int, timestamp: int, ssrc: int, payload: bytes, now: int) -> Drop | None:
        return self.jitter.push(seq, timestamp, ssrc, seq.to_bytes(2, "big") + payload, now)

    def _new_source(self, ssrc: int) -> None:
        if self._in_ssrc != -1:
            self.ssrc_changes += 1
        self._in_ssrc = ssrc
        self._stats.reset(ssrc)
        self.dtmf_in.reset()

    def _dtmf(self, p: RtpPacket, now: int) -> DtmfDigit | None:
        digits = self.dtmf_in.receive(p.timestamp, p.payload, now)
        if isinstance(digits, Drop):
            self.drops[digits] += 1
            return None
        if not digits:
            return None
        if len(digits) > 1:  # rare: a new event's end also ended an old one; the second waits for the timer,
            # which is due at once: next_deadline() comes forward to `now` (never later than a digit already waiting)
            if not self._pending_digits:
                self._pending_at = now
            self._pending_digits.extend(digits[1:])
        return digits[0]

    def receive_rtcp(self, data: bytes, source: Address, now: int) -> RtcpReceived | None:
        """One datagram from the RTCP socket (or demultiplexed from the RTP one)."""
        if not self.latch.accept_rtcp(source):
            self.drops[Drop.WRONG_SOURCE] += 1
            return None
        packets = self.rtcp.receive(data, now)
        if isinstance(packets, Drop):
            self.drops[packets] += 1
            return None
        if not self._mux:
            self._rtcp_source = source
        bye = next((p for p in packets if isinstance(p, Goodbye)), None)
        return RtcpReceived(tuple(packets), bye)

    def _start(self, now: int) -> None:
        """First packet either way: the RTCP schedule begins."""
        self._started = True
        self.rtcp.start(now)

    # --- outbound ---

    def wants_audio(self, now: int) -> bool:
        """False while a DTMF event is being sent: leave the next audio frame queued for after it."""
        return not self.dtmf_out.busy(now)

    def send_dtmf(self, digits: str) -> None:
        """Queue RFC 4733 digits (ValueError if none negotiated or a digit is not 0-9*#A-D)."""
        if self._dtmf_pt < 0:
            raise ValueError("the peer negotiated no telephone-event payload type")
        self.dtmf_out.queue(digits)

    def skip(self, slots: int) -> None:
        """The media clock skipped `slots` (late wake-up): advance the timestamp, mark the next packet."""
        if slots > 0:
            self._ts = (self._ts + slots * self._step) & 0xFFFFFFFF
            self._marker = True
            self.slots_skipped += slots

    def next_packet(self, payload: bytes | None, now: int) -> memoryview | None:
        """The datagram for this clock slot: `payload` (sent as is) or, for None, the codec's silence; a
        DTMF packet instead while digits are being sent; None when this slot sends nothing (between a
        DTMF event's updates). ValueError if the payload exceeds 1200 bytes."""
        ts = self._ts
        self._ts = (ts + self._step) & 0xFFFFFFFF
        if not self._started:
            self._start(now)
        dtmf = self.dtmf_out
        if dtmf.pending:
            event = dtmf.poll(now, ts)
            if event is not None:
                self.dtmf_packets_out += 1
                return self._send(self._dtmf_pt, event.marker, event.timestamp, event.payload, now, ts)
            if dtmf.in_event:
                return None
        if payload is None:
            payload = self._silence
        elif len(payload) > _MAX_PAYLOAD:
            raise ValueError(f"RTP payload of {len(payload)} bytes exceeds {_MAX_PAYLOAD}")
        marker = self._marker
        self._marker = False
        return self._send(self._pt, marker, ts, payload, now, ts)

    def _send(self, pt: int, marker: bool, ts: int, payload: bytes, now: int, media_ts: int) -> memoryview:
        n = pack_into(self._buf, pt, marker, self._seq, ts, self._ssrc, payload)
        self._seq = (self._seq + 1) & 0xFFFF
        self.packets_out += 1
        self.rtcp.on_rtp_sent(media_ts, len(payload), now)  # the slot's media time (a DTMF event's is older)
        if n != self._last_n:
            self._last_n = n
            self._last_view = self._view[:n]
        return self._last_view

    # --- timers ---

    def next_deadline(self) -> int | None:
        """The earliest of the RTCP report time and a DTMF end timeout (now, if a digit is waiting)."""
        if self._pending_digits:
            return self._pending_at
        a = self.rtcp.next_deadline()
        b = self.dtmf_in.next_deadline()
        if a is None:
            return b
        return a if b is None or a < b else b

    def handle_timer(self, now: int) -> list[bytes | DtmfDigit]:
        """What is due at `now`: an RTCP report datagram, a digit whose end packets were lost."""
        out: list[bytes | DtmfDigit] = []
        if self._pending_digits:
            out.extend(self._pending_digits)
            self._pending_digits.clear()
        digit = self.dtmf_in.handle_timer(now)
        if digit is not None:
            out.append(digit)
        report = self.rtcp.handle_timer(now)
        if report is not None:
            out.append(report)
        return out

    def goodbye(self, now: int, reason: str | None = None) -> bytes:
        """The RTCP BYE compound to send when the call ends."""
        return self.rtcp.build_goodbye(now, reason)

    # --- the one-way-audio diagnosis ---

    def arrival_problem(self, srtp_auth_failures: int = 0) -> OneWayAudio | None:
        """None once a usable packet (audio, digit or comfort noise from a source taken) has arrived; else
        why none did, the likeliest cause first: SRTP that failed authentication, a source refused (or one
        that never completed its probation run), payload types not negotiated, malformed datagrams, nothing.
        The shell asks once, a few seconds (ARRIVAL_WINDOW_MS) after the media started."""
        if self.packets_in:
            return None
        latch, drops = self.latch, self.drops
        signalled = _show(latch.signalled)
        if srtp_auth_failures:
            return OneWayAudio(
                "srtp_auth",
                f"{srtp_auth_failures} SRTP packets failed authentication (keys from the SDES exchange)",
            )
        if latch.refused or latch.probation_drops:
            source = latch.refused_from or latch.candidate
            if latch.nat:
                why = "NAT mode takes one source at a time"
            elif not latch.learn:
                why = "--rtp-source strict takes only the signalled address"
            elif latch.latched is not None:
                why = f"the call is latched to {_show(latch.latched)}"
            else:
                why = (
                    f"it never sent {latch.probation} packets in sequence with one SSRC "
                    f"({latch.probation_drops} tried)"
                )
            return OneWayAudio(
                "source_refused",
                f"RTP from {_show(source)} refused ({drops[Drop.WRONG_SOURCE]} packets) while the SDP named "
                f"{signalled}: {why}",
            )
        if drops[Drop.UNKNOWN_PT] or drops[Drop.BAD_DTMF]:
            return OneWayAudio(
                "payload_type",
                f"{drops[Drop.UNKNOWN_PT] + drops[Drop.BAD_DTMF]} packets of payload type {self.unknown_pt}, "
                f"not the negotiated {self._pt}"
                + (f" or telephone-event {self._dtmf_pt}" if self._dtmf_pt >= 0 else ""),
            )
        malformed = sum(drops[d] for d in _MALFORMED)
        if malformed:
            return OneWayAudio("malformed", f"{malformed} datagrams were not valid RTP")
        return OneWayAudio("no_rtp", f"no RTP arrived at all (the SDP named {signalled})")

    # --- figures ---

    def qos(self) -> QoS:
        """`status()["qos"]`: RTCP figures plus the jitter buffer's late packets, concealment and depth."""
        jb = self.jitter
        oneway = self.one_way_audio
        return replace(
            self.rtcp.qos(),
            late_packets=jb.late,
            frames_concealed=jb.frames_concealed,
            buffer_ms=jb.depth_ms,
            one_way_audio=oneway.cause if oneway is not None else None,
        )

    def counters(self) -> dict[str, int]:
        """Every drop reason and the stream's own counts, for status and metrics."""
        jb = self.jitter
        out = {f"drop_{d.name.lower()}": self.drops[d] for d in Drop}
        out["drop_overflow"] = jb.overflows  # discarded inside the buffer (ceiling, resync), not at push
        out.update(
            packets_in=self.packets_in,
            packets_out=self.packets_out,
            dtmf_packets_out=self.dtmf_packets_out,
            comfort_noise=self.comfort_noise,
            ssrc_changes=self.ssrc_changes,
            slots_skipped=self.slots_skipped,
            frames_played=jb.frames_played,
            frames_concealed=jb.frames_concealed,
            frames_silence=jb.frames_silence,
            frames_dropped_shrink=jb.frames_dropped_shrink,
            frames_backlog=jb.frames_backlog,
            jitter_underruns=jb.underruns,
            jitter_resyncs=jb.resyncs,
            jitter_depth_ms=jb.depth_ms,
            jitter_target_ms=jb.target_ms,
            source_relatches=self.latch.relatches,
            source_learned=self.latch.learned,
            source_probation_drops=self.latch.probation_drops,
            source_refused=self.latch.refused,
        )
        return out


_MALFORMED = (
    Drop.TOO_SHORT,
    Drop.BAD_VERSION,
    Drop.BAD_CSRC,
    Drop.BAD_EXTENSION,
    Drop.BAD_PADDING,
    Drop.EMPTY_PAYLOAD,
)


def _show(address: Address | None) -> str:
    return f"{address[0]}:{address[1]}" if address is not None else "no address"
