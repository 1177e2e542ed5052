"""SE1–SE7: the session engine's rules on virtual time (no sockets, no sleeps).

The coordinator is driven with a real `Playout` as its carrier channel; the test plays the media clock by
pulling one frame per 20 ms tick, as pjmedia's clock thread does.
"""

from __future__ import annotations

import pytest

from bridge.engine.coordinator import (
    BargedIn,
    ConditionDetected,
    Transcript,
    Truncate,
    TurnEnded,
)
from bridge.engine.cushion import CARRIER_LEAD_FRAMES, AdaptiveCushion
from bridge.engine.reservoir import GenerationReservoir, OutputOverflow, OutputStale
from bridge.engine.timeline import Timeline
from providers.base import Capabilities
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputInterrupted,
    SpeechStarted,
    SpeechStopped,
    UsageUpdated,
)
from providers.limits import (
    GEMINI_LIVE,
    GPT_LIVE,
    OPENAI_REALTIME,
    UNDECLARED,
    XAI,
    AudioLimits,
    LimitOverrides,
    merge_limits,
)
from providers.openai_live import LiveConfig, OpenAILiveAdapter
from rtp.audio import PCM16_24K, PCMU_8K
from rtp.g711 import ulaw_decode, ulaw_encode
from rtp.playout import OutboundFrame
from tests.support.session_engine import GPT_LIVE_CAPS, MS, TICK, Call, pcmu_tone, speech_frame

# --- SE1 ---------------------------------------------------------------------------------------------------


def test_se1_provider_defaults_follow_design_in_bytes_of_the_received_format() -> None:
    assert GPT_LIVE.for_format(PCMU_8K) == AudioLimits(16_000, 3_000)
    assert GPT_LIVE.for_format(PCM16_24K) == AudioLimits(96_000, 3_000)
    assert GEMINI_LIVE.for_format(PCM16_24K) == AudioLimits(480_000, 11_000)
    assert XAI.for_format(PCMU_8K) == AudioLimits(160_000, 21_000)
    assert OPENAI_REALTIME.for_format(PCMU_8K) == AudioLimits(160_000, 21_000)
    assert UNDECLARED.for_format(PCMU_8K) == AudioLimits(5_600, 750)


def test_se1_explicit_limits_win_per_field() -> None:
    defaults = GPT_LIVE.for_format(PCMU_8K)
    assert merge_limits(defaults, None) == defaults
    assert merge_limits(defaults, LimitOverrides(capacity_bytes=8_000)) == AudioLimits(8_000, 3_000)
    assert merge_limits(defaults, LimitOverrides(residence_ms=1_000)) == AudioLimits(16_000, 1_000)
    assert merge_limits(defaults, LimitOverrides(4_000, 500)) == AudioLimits(4_000, 500)


def test_se1_an_adapter_used_directly_must_be_given_limits() -> None:
    with pytest.raises(ValueError, match="needs explicit AudioLimits"):
        OpenAILiveAdapter("sk-test", LiveConfig(), limits=None)
    with pytest.raises(ValueError, match="positive"):
        AudioLimits(0, 100)


# --- SE2 ---------------------------------------------------------------------------------------------------


def test_se2_overflow_is_detected_counted_and_the_reservoir_never_exceeds_capacity() -> None:
    call = Call(limits=AudioLimits(8_000, 3_000))  # 1 s of PCMU
    call.provider(AudioReceived(1, pcmu_tone(800), PCMU_8K))
    call.provider(AudioReceived(1, pcmu_tone(400), PCMU_8K))  # would make 1.2 s minus the 2 framed
    overflows = [n.condition for n in call.notices if isinstance(n, ConditionDetected)]
    assert overflows == [OutputOverflow(3_200, 6_400 - 2 * 160, 8_000)]  # two frames had moved to the cushion
    assert call.core.output.reservoir.depth_bytes <= 8_000
    assert call.core.output.reservoir.overflows == 1
    assert call.core.status(call.now)["reservoir"]["overflows"] == 1
    assert (
        call.core.status(call.now)["output_recovery"]["cause"] == "output_overflow"
    )  # and the repair begins


def test_se2_stale_output_is_detected_once_when_nothing_plays_it() -> None:
    call = Call(limits=AudioLimits(16_000, 3_000))
    call.provider(AudioReceived(1, pcmu_tone(1_000), PCMU_8K))
    call.advance(2_900)  # the call is on hold: the media clock does not run
    assert not [n for n in call.notices if isinstance(n, ConditionDetected)]
    deadline = call.core.next_deadline()
    assert deadline is not None and deadline <= 3_000 * MS + 1
    call.advance(200)
    stale = [n.condition for n in call.notices if isinstance(n, ConditionDetected)]
    assert len(stale) == 1 and isinstance(stale[0], OutputStale) and stale[0].age_ms > 3_000
    call.advance(1_000)
    assert call.core.output.reservoir.stales == 1  # reported once per episode


def test_se2_reservoir_pull_never_spans_items_and_keeps_bytes() -> None:
    reservoir = GenerationReservoir(AudioLimits(1_000, 1_000), PCMU_8K)
    reservoir.push(b"a" * 100, 0, "x")
    reservoir.push(b"b" * 100, 0, "y")
    assert reservoir.pull(160) == (b"a" * 100, "x")
    assert reservoir.pull(160) == (b"b" * 100, "y")
    assert reservoir.depth_bytes == 0


# --- SE3 ---------------------------------------------------------------------------------------------------


def test_se3_the_carrier_cushion_is_at_most_two_frames_and_the_first_frame_has_no_wait() -> None:
    call = Call()
    audio = pcmu_tone(1_000)
    call.provider(AudioReceived(1, audio, PCMU_8K))
    assert call.playout.depth == CARRIER_LEAD_FRAMES  # the rest waits in the reservoir, not the channel
    first = call.playout.pull(call.now)  # the very instant it arrived
    assert first is not None and first.pcm == ulaw_decode(audio[:160])
    call.tick(count=60)
    assert (
        max(call.core.status(call.now)["playback"]["cushion_frames"], call.playout.depth)
        <= CARRIER_LEAD_FRAMES
    )


def test_se3_pcmu_passes_through_bit_exact_and_without_rate_change() -> None:
    call = Call()
    audio = pcmu_tone(2_000, amplitude=12_000, freq=1234.0)
    for start in range(0, len(audio), 720):  # arbitrary chunk sizes, as providers send
        call.provider(AudioReceived(1, audio[start : start + 720], PCMU_8K))
        call.tick(count=4)
    call.tick(count=100)
    played = b"".join(f.pcm for f in call.sent)
    assert len(played) == 2 * len(audio)  # same number of samples: no rate change, nothing added
    assert ulaw_encode(played) == audio  # the caller's PCMU is the provider's PCMU, byte for byte


def test_se3_adaptive_cushion_for_browser_channels() -> None:
    cushion = AdaptiveCushion()
    assert (cushion.floor_ms, cushion.ceiling_ms) == (120, 200)
    assert cushion.target_ms(10) == 120
    assert cushion.target_ms(80) == 160
    assert cushion.target_ms(500) == 200


# --- SE4 ---------------------------------------------------------------------------------------------------


def test_se4_cleared_frames_never_transmitted() -> None:
    call = Call()
    call.provider(AudioReceived(1, pcmu_tone(2_000), PCMU_8K, item_id="item_a"))
    call.tick(count=10)
    call.provider(SpeechStarted(1, 1000, "item_u1"))
    assert call.core.output.barrier.epoch == 1 and call.core.output.barrier.settled
    before = len(call.sent)
    call.tick(count=50)
    assert len(call.sent) == before  # nothing of epoch 0 left the bridge after the clear
    assert all(f.epoch == 0 for f in call.sent)
    stale = OutboundFrame(bytes(320), 0, "item_a", 999)
    call.playout.enqueue([stale])  # a late frame of the old epoch is refused outright
    assert call.playout.pull(call.now) is None


def test_se4_new_output_after_the_clear_carries_the_new_epoch() -> None:
    call = Call()
    call.provider(AudioReceived(1, pcmu_tone(500), PCMU_8K, item_id="item_a"))
    call.provider(SpeechStarted(1))
    call.provider(SpeechStopped(1))
    call.provider(AudioReceived(1, pcmu_tone(200), PCMU_8K, item_id="item_b"))
    call.tick(count=20)
    assert {(f.item_id, f.epoch) for f in call.sent} == {("item_b", 1)}


# --- SE5 ---------------------------------------------------------------------------------------------------


def test_se5_barge_in_truncates_to_what_the_carrier_ledger_says_was_sent() -> None:
    call = Call()
    call.provider(AudioReceived(1, pcmu_tone(3_000), PCMU_8K, item_id="item_a"))
    call.tick(count=37)  # 37 frames = 740 ms have left
    call.provider(SpeechStarted(1, 5_000, "item_u2"))
    assert call.commands == [Truncate("item_a", 740)]
    assert call.playout.ledger.transmitted_ms("item_a") == 740
    [barge] = [n for n in call.notices if isinstance(n, BargedIn)]
    assert barge.source == "provider" and barge.heard == (("item_a", 740),) and barge.cleared_ms > 2_000
    assert barge.last_frame_ms == 0  # the frame of this very tick was the last to leave
    assert call.core.barge.suppressed


def test_se5_output_is_suppressed_until_the_callers_turn_ends() -> None:
    call = Call()
    call.provider(SpeechStarted(1))
    call.provider(
        AudioReceived(1, pcmu_tone(500), PCMU_8K, item_id="item_old")
    )  # late output of the old turn
    call.tick(count=30)
    assert call.sent == [] and call.core.barge.suppressed_bytes == 4_000
    call.provider(SpeechStopped(1))
    assert any(isinstance(n, TurnEnded) for n in call.notices)
    call.provider(AudioReceived(1, pcmu_tone(100), PCMU_8K, item_id="item_new"))
    call.tick(count=10)
    assert [f.item_id for f in call.sent] == ["item_new"] * 5


def test_se5_interrupted_providers_get_no_truncate_when_they_cannot_take_one() -> None:
    call = Call(
        caps=Capabilities(server_vad=True, speech_end_events=True, timed_captions=True, truncate=False)
    )
    call.provider(AudioReceived(1, pcmu_tone(1_000), PCMU_8K))
    call.tick(count=5)
    call.provider(OutputInterrupted(1))
    assert call.commands == [] and call.core.barge.suppressed
    assert call.core.output.barrier.epoch == 1


def test_se5_local_vad_barges_in_for_providers_without_speech_events() -> None:
    call = Call(caps=GPT_LIVE_CAPS)
    call.provider(AudioReceived(1, pcmu_tone(2_000), PCMU_8K))
    call.tick(count=10)
    assert not call.core.barge.suppressed
    speech_started_at = call.now
    call.tick(speech_frame(), count=3)  # 60 ms of caller speech: the attack
    assert call.core.barge.suppressed
    [barge] = [n for n in call.notices if isinstance(n, BargedIn)]
    assert barge.source == "local_vad" and barge.heard == (
        ("out-1", 13 * 20),
    )  # 10 ticks + the 3-frame attack
    transmitted_after = [f for f in call.sent if f.epoch == 0]
    last_ns = call.playout.ledger.last().transmitted_ns  # type: ignore[union-attr]
    assert last_ns - (speech_started_at + 3 * TICK) <= 2 * TICK  # within two frames of the detection
    call.tick(bytes(320), count=20)  # 400 ms of silence: past the 300 ms hangover
    assert not call.core.barge.suppressed
    assert len(transmitted_after) == len(call.sent)


# --- SE6 ---------------------------------------------------------------------------------------------------


def test_se6_provider_times_are_rebased_onto_the_session_timeline() -> None:
    timeline = Timeline(start_ns=1_000 * MS)
    timeline.connection_started(1, 1_500 * MS)  # the first connection's clock starts 500 ms into the session
    assert timeline.rebase(1, 2_000, 0) == 2_500
    timeline.connection_started(2, 61_000 * MS)  # a replacement connection starts its own clock at 0
    assert timeline.rebase(2, 300, 0) == 60_300
    assert timeline.rebase(1, 2_100, 0) == 2_600  # the old one still maps where it did
    assert timeline.rebase(3, 100, 5_000 * MS) == 4_000  # unknown connection: stamped "now"
    assert timeline.ms(2_000 * MS) == 1_000


def test_se6_transcripts_are_stamped_on_the_session_timeline() -> None:
    call = Call()
    call.tick(count=50)  # 1 s into the session
    call.core.timeline.connection_started(1, 200 * MS)
    call.provider(InputTranscript(1, "hello", start_ms=300, final=True))
    [text] = [n for n in call.notices if isinstance(n, Transcript)]
    assert (text.role, text.at_ms, text.final) == ("caller", 500, True)


def test_se6_hr11_a_transcript_after_a_hold_is_stamped_where_the_caller_said_it() -> None:
    """The provider's times count the audio it heard. 5 s of frames, a 10 s hold with no media,
    then 2 s more: what it stamps 5,500 ms is half a second after the resume, at 15,520 ms of the session."""
    call = Call()
    call.tick(count=250)
    call.advance(10_000)
    call.tick(count=100)
    call.provider(InputTranscript(1, "after the hold", start_ms=5_500, final=True))
    [text] = [n for n in call.notices if isinstance(n, Transcript)]
    assert text.at_ms == 15_520


def test_se6_events_of_another_transport_are_inert() -> None:
    call = Call()
    call.provider(AudioReceived(2, pcmu_tone(500), PCMU_8K))
    call.provider(SpeechStarted(2))
    call.tick(count=5)
    assert call.sent == [] and not call.core.barge.suppressed and call.core.connections.stale_events == 2


# --- SE7 ---------------------------------------------------------------------------------------------------


def test_se7_status_reports_state_limits_reservoir_playback_and_usage() -> None:
    call = Call(limits=AudioLimits(16_000, 3_000))
    call.provider(AudioReceived(1, pcmu_tone(1_000), PCMU_8K))
    call.tick(count=10)
    call.provider(UsageUpdated(1, audio_seconds=15.0))
    status = call.core.status(call.now)
    assert status["state"] == "ready" and status["output_recovery"] is None
    assert status["limits"] == {"capacity_bytes": 16_000, "residence_ms": 3_000, "format": "audio/pcmu@8000"}
    assert status["reservoir"]["depth_ms"] == 1_000 - 10 * 20 - 2 * 20  # played, and two in the cushion
    assert status["reservoir"]["oldest_age_ms"] == 200
    assert status["playback"]["frames_transmitted"] == 10 and status["playback"]["epoch"] == 0
    assert status["usage"] == {
        "audio_seconds": 15.0,
        "input_tokens": 0,
        "output_tokens": 0,
        "complete": False,
    }
    assert status["qos"]["frames_in"] == 10


def test_se7_underruns_count_media_ticks_that_found_nothing_mid_item() -> None:
    call = Call()
    call.provider(AudioReceived(1, pcmu_tone(60), PCMU_8K))  # 3 frames, then the provider is late
    call.tick(count=6)
    assert call.core.status(call.now)["qos"]["underruns"] == 3
    call.tick(count=20)  # 300 ms without audio: the item is over, silence is no longer a gap
    assert call.core.output.underruns == 11 and call.core.output.framer.item_id is None  # ticks at 80..280 ms
    call.tick(count=5)
    assert call.core.output.underruns == call.core.status(call.now)["qos"]["underruns"]
    before = call.core.output.underruns
    call.tick(count=5)
    assert call.core.output.underruns == before  # between items nothing is counted


def test_se5_vad_level_and_attack_hangover() -> None:
    from bridge.engine.vad import VadOptions, VoiceActivityDetector, VoiceStarted, VoiceStopped, frame_dbfs

    assert frame_dbfs(bytes(320)) == float("-inf")
    assert abs(frame_dbfs(speech_frame(16384)) - (-6.0 - 3.01)) < 0.2  # a half-scale sine: -9 dBFS
    vad = VoiceActivityDetector(VadOptions(threshold_dbfs=-38.0, attack_ms=60, hangover_ms=300))
    changes = [vad.frame(speech_frame(), t * TICK) for t in range(3)]
    assert changes[:2] == [None, None] and changes[2] == VoiceStarted(0)  # the attack: three voiced frames
    quiet = [vad.frame(bytes(320), (3 + t) * TICK) for t in range(15)]
    assert quiet.index(VoiceStopped(17 * TICK)) == 14  # stopped after 300 ms without a voiced frame
