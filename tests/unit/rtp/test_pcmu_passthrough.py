"""PCMU passthrough is bit-exact (DESIGN §5): the provider's µ-law is a PCMU call's RTP payload as it came.

µ-law → PCM16 → µ-law is not the identity (0x7F, the negative zero, decodes to 0 and comes back as 0xFF), so
the output path carries the provider's bytes beside the PCM (`OutboundFrame.pcmu`) and the native engine sends
those.
"""

from __future__ import annotations

from bridge.engine.framing import ItemFramer
from bridge.engine.reservoir import OutputPath
from providers.limits import AudioLimits
from rtp.audio import PCM16_8K, PCMU_8K
from rtp.g711 import ulaw_decode, ulaw_encode
from rtp.ledger import CarrierLedger
from rtp.playout import Playout
from sip.leg import PlayoutLeg
from tests.support.native_shell import VirtualClock, _call_media

RTP_HEADER = 12
AWKWARD = bytes([0x7F, 0xFF, 0x00, 0x80, 0x7E]) * 32  # 160 bytes: 20 ms of µ-law


def test_the_round_trip_is_not_the_identity_for_0x7f() -> None:
    assert ulaw_encode(ulaw_decode(b"\x7f")) == b"\xff"  # why the bytes must travel as they came


def test_framed_pcmu_keeps_the_providers_bytes_across_uneven_pulls_and_the_padded_end() -> None:
    framer = ItemFramer()
    framer.start("item-1", 1, pcmu=True)
    audio = AWKWARD * 2 + AWKWARD[:50]  # 2 frames and a bit
    frames = framer.add(ulaw_decode(audio[:70]), audio[:70])  # arrives in pieces that are not frames
    frames += framer.add(ulaw_decode(audio[70:]), audio[70:])
    frames += framer.finish()
    assert [f.pcmu for f in frames] == [AWKWARD, AWKWARD, AWKWARD[:50] + b"\xff" * 110]
    assert all(f.pcm == ulaw_decode(f.pcmu or b"") for f in frames)


def test_a_closing_message_or_pcm_output_carries_no_pcmu() -> None:
    framer = ItemFramer()
    framer.start("final-message", 1)
    assert [f.pcmu for f in framer.add(bytes(640)) + framer.finish()] == [None, None]
    playout = Playout()
    out = OutputPath(
        AudioLimits(96_000, 3_000), PCM16_8K, PlayoutLeg(playout), lead_frames=2, item_quiet_ms=300
    )
    out.push(bytes(16 * 40), "item-1", 0)
    assert playout.depth == 2 and [f.pcmu for f in (playout.take(), playout.take()) if f] == [None, None]


def test_0x7f_from_the_provider_is_the_native_rtp_payload_byte_for_byte() -> None:
    clock = VirtualClock()
    media, leg = _call_media(clock)  # a PCMU call on the native engine (sip/native/leg.py _CallMedia)
    leg.playout = Playout(CarrierLedger())
    media.core.playout = leg.playout
    out = OutputPath(
        AudioLimits(16_000, 3_000), PCMU_8K, PlayoutLeg(leg.playout), lead_frames=2, item_quiet_ms=300
    )
    out.push(AWKWARD + AWKWARD[::-1], "item-1", clock.now)  # the provider's 40 ms of µ-law
    for _ in range(2):
        media.on_slots(clock.now, 1, 0)
        clock.now += 20_000_000
    payloads = [packet[RTP_HEADER:] for _, packet in leg.sockets.sent]
    assert payloads == [AWKWARD, AWKWARD[::-1]]  # 0x7F stays 0x7F (re-encoding would make it 0xFF)
