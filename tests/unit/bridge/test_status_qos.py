"""`status()["qos"]` carries the leg's RTP figures when the leg declares them (sip.leg.QosSource), and the
playback cushion follows a channel that declares its own (sip.leg.CushionedChannel)."""

from __future__ import annotations

from bridge.engine.coordinator import SessionCoordinator
from bridge.engine.status import leg_qos
from providers.base import Capabilities
from providers.events import AudioReceived, SessionStarted
from providers.limits import AudioLimits
from rtp.audio import PCMU_8K
from rtp.rtcp import QoS
from sip.leg import LegFeatures, PlayoutLeg, offers_qos

CAPS = Capabilities(server_vad=True, speech_end_events=True, timed_captions=True, truncate=True)
QOS = QoS(
    jitter_ms=3.5,
    packets_lost=2,
    loss_fraction=0.01,
    fraction_lost_last=0.0,
    rtt_ms=41.0,
    packets_in=200,
    octets_in=32_000,
    packets_out=190,
    octets_out=30_400,
    remote_jitter_ms=None,
    remote_fraction_lost=None,
    remote_cumulative_lost=None,
)


class RtpLeg(PlayoutLeg):
    """A leg whose engine runs the RTP stream (as sip/native/leg.py's NativeLeg does)."""

    features = LegFeatures(qos=True)

    def __init__(self, qos: QoS | None) -> None:
        super().__init__()
        self._qos = qos

    def qos(self) -> QoS | None:
        return self._qos

    def media_counters(self) -> dict[str, int]:
        return {"packets_in": 200, "packets_out": 190, "drop_malformed": 1}


def core(channel: object) -> SessionCoordinator:
    c = SessionCoordinator(
        limits=AudioLimits(16_000, 3_000),
        output_format=PCMU_8K,
        capabilities=CAPS,
        channel=channel,  # type: ignore[arg-type]
        now=0,
    )
    c.provider_event(SessionStarted(1, "sess", None), 0)
    return c


def test_the_native_legs_rtp_figures_are_in_status_qos() -> None:
    leg = RtpLeg(QOS)
    assert offers_qos(leg)
    qos = core(leg).status(0)["qos"]
    assert qos["rtp"]["jitter_ms"] == 3.5 and qos["rtp"]["rtt_ms"] == 41.0
    assert qos["rtp"]["packets_lost"] == 2 and qos["rtp"]["loss_fraction"] == 0.01
    assert (qos["rtp"]["packets_in"], qos["rtp"]["packets_out"]) == (200, 190)
    assert qos["media"]["drop_malformed"] == 1
    assert qos["frames_in"] == 0 and "underruns" in qos  # the session's own figures stay


def test_before_the_media_started_rtp_is_none_and_a_plain_channel_adds_nothing() -> None:
    assert core(RtpLeg(None)).status(0)["qos"]["rtp"] is None
    plain = PlayoutLeg()
    assert not offers_qos(plain) and leg_qos(plain) == {}
    assert "rtp" not in core(plain).status(0)["qos"]


def test_rtp_figures_a_leg_does_not_declare_are_not_read() -> None:
    """`sip.leg.LegFeatures.qos` decides, not the presence of `qos()`."""

    class UndeclaredLeg(RtpLeg):
        features = LegFeatures()

    assert leg_qos(UndeclaredLeg(QOS)) == {}
    assert "rtp" not in core(UndeclaredLeg(QOS)).status(0)["qos"]


class AdaptiveLeg(PlayoutLeg):
    """A channel with its own cushion (as bridge/server/browser.py's BrowserLeg)."""

    features = LegFeatures(cushion=True)

    def __init__(self) -> None:
        super().__init__()
        self.frames = 6

    @property
    def cushion_frames(self) -> int:
        return self.frames


def test_the_cushion_is_read_from_the_channel_on_every_top_up() -> None:
    leg = AdaptiveLeg()
    c = core(leg)
    c.provider_event(AudioReceived(1, bytes(160 * 20), PCMU_8K), 0)  # 400 ms
    assert leg.depth == 6  # the channel's 120 ms, not the carrier's two frames
    leg.frames = 10  # jitter grew: the cushion rises to 200 ms
    c.handle_timer(20_000_000)
    assert leg.depth == 10
    leg.frames = 2
    for _ in range(9):
        leg.playout.pull(0)
    c.handle_timer(40_000_000)
    assert leg.depth == 2  # topped up to the lower lead, never past it


def test_an_rtp_leg_keeps_the_carrier_lead() -> None:
    leg = RtpLeg(QOS)
    c = core(leg)
    c.provider_event(AudioReceived(1, bytes(160 * 20), PCMU_8K), 0)
    assert leg.depth == 2  # CARRIER_LEAD_FRAMES
