"""The caller's no-input timeout (bridge/engine/no_input.py) on a session core, on virtual time: the clock runs only
while the caller is the one expected to speak; at the timeout the model is prompted once, at the next one it says
goodbye and the call ends once that was heard."""

from __future__ import annotations

import pytest

from bridge.engine.commands import EndSession, HangUp, NoInputTimeout, RecoveryChanged
from bridge.engine.delegations import DispatchJob, SendContext
from bridge.engine.no_input import GOODBYE, NO_INPUT_REASON, PROMPT, NoInputOptions
from providers.events import (
    AudioReceived,
    ResponseDone,
    SessionClosed,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
)
from rtp.audio import PCMU_8K
from tests.support.session_engine import GPT_LIVE_CAPS, TICK, Call, pcmu_tone, speech_frame

TIMEOUT_MS = 5_000


def call_with(timeout_ms: int | None = TIMEOUT_MS) -> Call:
    return Call(no_input=NoInputOptions(timeout_ms) if timeout_ms is not None else None)


def silence(call: Call, ms: int) -> None:
    """The caller's phone sends silence for `ms` (a frame every 20 ms)."""
    call.tick(count=ms // 20)


def idle(call: Call, ms: int) -> None:
    """`ms` pass with no caller frames (a hold, a phone that sends nothing in silence): only the core's timers."""
    for _ in range(ms // 20):
        call.now += TICK
        if (due := call.core.next_deadline()) is not None and due <= call.now:
            call.core.handle_timer(call.now)
        call._drain()


def stages(call: Call) -> list[str]:
    return [n.stage for n in call.notices if isinstance(n, NoInputTimeout)]


def spoken(call: Call) -> list[str]:
    return [c.text for c in call.commands if isinstance(c, SendContext) and c.speak]


def caller_says(call: Call, ms: int) -> None:
    """A caller utterance by the provider's speech events (the session's barge-in source)."""
    call.provider(SpeechStarted(call.core.token))
    silence(call, ms)
    call.provider(SpeechStopped(call.core.token))


def test_off_by_default_a_long_silence_prompts_nothing() -> None:
    call = call_with(None)
    silence(call, 60_000)
    idle(call, 600_000)
    assert stages(call) == [] and spoken(call) == [] and not call.core.ending.goodbye_due
    assert call.core.status(call.now)["no_input"] is None


def test_the_timeout_prompts_the_model_once_with_a_speakable_check_in() -> None:
    call = call_with()
    silence(call, TIMEOUT_MS - 40)
    assert stages(call) == []
    silence(call, 60)
    assert stages(call) == ["prompt"] and spoken(call) == [PROMPT]
    (notice,) = [n for n in call.notices if isinstance(n, NoInputTimeout)]
    assert notice.sent and TIMEOUT_MS <= notice.silent_ms < TIMEOUT_MS + 40
    assert call.core.status(call.now)["no_input"] == {
        "timeout_ms": TIMEOUT_MS,
        "stage": "prompted",
        "prompts": 1,
    }


def test_a_caller_sending_no_rtp_in_silence_is_timed_by_the_clock() -> None:
    call = call_with()
    idle(call, TIMEOUT_MS + 10)
    assert stages(call) == ["prompt"]


def test_the_clock_does_not_run_while_the_assistant_is_audible_and_restarts_when_its_audio_was_played() -> (
    None
):
    call = call_with()
    silence(call, 1_000)
    call.provider(
        AudioReceived(1, pcmu_tone(8_000), PCMU_8K, "item_a")
    )  # 8 s of speech, longer than the timeout
    silence(call, 8_000)
    assert stages(call) == []  # the caller listens: no silence of theirs
    ledger = call.playout.ledger
    assert ledger.transmitted_ms("item_a") == 8_000
    silence(call, TIMEOUT_MS - 200)  # counted from the end of the assistant's last word
    assert stages(call) == []
    silence(call, 600)
    assert stages(call) == ["prompt"]


def test_a_caller_who_sends_no_rtp_while_the_assistant_speaks_is_timed_from_the_end_of_its_audio() -> None:
    call = call_with()
    call.provider(AudioReceived(1, pcmu_tone(3_000), PCMU_8K, "item_a"))
    for _ in range(
        150
    ):  # the carrier takes the 3 s; the caller sends nothing (the output's own timer plays it)
        call.now += TICK
        frame = call.playout.pull(call.now)
        assert frame is not None
        if (due := call.core.next_deadline()) is not None and due <= call.now:
            call.core.handle_timer(call.now)
        call._drain()
    idle(call, TIMEOUT_MS - 600)
    assert stages(call) == []
    idle(call, 1_000)
    assert stages(call) == ["prompt"]


def test_hold_stops_the_clock_and_the_resumed_caller_gets_the_whole_timeout() -> None:
    call = call_with()
    silence(call, TIMEOUT_MS - 1_000)
    call.core.hold(call.now)
    idle(call, 120_000)  # two minutes on hold: no frames, no prompt
    assert stages(call) == []
    call.core.resume(call.now)
    silence(call, TIMEOUT_MS - 200)
    assert stages(call) == []  # not 1 s after the resume: the clock restarted from zero
    silence(call, 400)
    assert stages(call) == ["prompt"]


def test_an_outbound_call_ringing_and_a_recorded_disclosure_playing_are_not_the_callers_silence() -> None:
    call = call_with()
    call.core.ring(call.now)
    silence(call, 30_000)  # early media frames while it rings
    assert stages(call) == []
    call.core.answered(call.now)
    silence(call, TIMEOUT_MS - 200)
    assert stages(call) == []
    silence(call, 400)
    assert stages(call) == ["prompt"]


def test_a_recovery_stops_the_clock_until_the_caller_spoke_into_the_replacement() -> None:
    call = call_with(timeout_ms=2_000)
    silence(call, 1_000)
    call.provider(SessionClosed(1, "connection lost", False))  # HR5: a replacement is opened
    silence(call, 500)
    call.provider(SessionStarted(2, "sess_2", None))  # ready: awaiting the caller (HR13)
    silence(call, 3_000)  # 4.5 s of the caller's silence, 2 s of it after the replacement was ready
    assert stages(call) == [] and spoken(call) == []  # (a prompt now would wait for the caller: HR9)
    caller_says(call, 600)
    assert [n.stage for n in call.notices if isinstance(n, RecoveryChanged)][-1] == "done"
    call.provider(
        AudioReceived(2, pcmu_tone(1_000), PCMU_8K, "answer")
    )  # the model's answer: held results go
    call.provider(ResponseDone(2))
    silence(call, 1_000 + 1_800)
    assert stages(call) == []
    silence(call, 400)
    assert stages(call) == ["prompt"] and spoken(call) == [PROMPT]
    assert [c.token for c in call.commands if isinstance(c, SendContext)] == [2]  # to the floor


def test_a_tool_job_the_caller_waits_for_stops_the_clock() -> None:
    call = call_with()
    silence(call, 1_000)
    call.provider(ToolCallRequested(1, "call_1", "find_order"))
    (dispatch,) = [c for c in call.commands if isinstance(c, DispatchJob)]
    silence(call, 30_000)  # the application takes 30 s
    assert stages(call) == []
    call.core.job_answered(dispatch.request.job_id, '{"status": "shipped"}', call.now)
    silence(call, TIMEOUT_MS - 200)
    assert stages(call) == []
    silence(call, 400)
    assert stages(call) == ["prompt"]


def test_caller_speech_resets_the_clock() -> None:
    call = call_with()
    silence(call, TIMEOUT_MS - 500)
    caller_says(call, 2_000)  # a long utterance: no prompt while the caller speaks either
    assert stages(call) == []
    silence(call, TIMEOUT_MS - 200)
    assert stages(call) == []
    silence(call, 400)
    assert stages(call) == ["prompt"]


def test_the_local_detector_is_the_caller_speech_where_it_is_the_barge_in_source() -> None:
    call = Call(GPT_LIVE_CAPS, no_input=NoInputOptions(TIMEOUT_MS))
    silence(call, TIMEOUT_MS - 500)
    call.tick(speech_frame(), count=50)  # 1 s of the caller's voice, heard by the local detector only
    silence(call, TIMEOUT_MS - 500)
    assert stages(call) == []
    silence(call, 1_500)
    assert stages(call) == ["prompt"]


def test_prompt_once_then_a_goodbye_that_ends_the_call_once_it_was_heard() -> None:
    call = call_with()
    silence(call, TIMEOUT_MS + 20)
    assert stages(call) == ["prompt"]
    call.provider(AudioReceived(1, pcmu_tone(2_000), PCMU_8K, "check_in"))  # "are you still there?"
    silence(call, 2_000 + TIMEOUT_MS - 200)
    assert stages(call) == ["prompt"]  # one prompt per silence: the clock restarted after the check-in
    silence(call, 600)
    assert stages(call) == ["prompt", "goodbye"] and spoken(call) == [PROMPT, GOODBYE]
    assert call.core.ending.goodbye_due and not call.core.ending.ended
    call.provider(AudioReceived(1, pcmu_tone(1_500), PCMU_8K, "goodbye"))
    silence(call, 1_000)
    assert not [c for c in call.commands if isinstance(c, HangUp)]  # the goodbye is still playing
    silence(call, 1_000)
    assert call.playout.ledger.transmitted_ms("goodbye") == 1_500
    assert [c.reason for c in call.commands if isinstance(c, EndSession)] == [NO_INPUT_REASON]
    assert [c.reason for c in call.commands if isinstance(c, HangUp)] == [NO_INPUT_REASON]
    silence(call, 60_000)
    assert stages(call) == ["prompt", "goodbye"]


def test_a_goodbye_the_model_does_not_say_still_ends_the_call_after_the_goodbye_timeout() -> None:
    call = call_with()
    silence(call, 2 * TIMEOUT_MS + 100)
    assert stages(call) == ["prompt", "goodbye"]
    silence(call, 10_000)  # TelephonyOptions.goodbye_timeout_ms
    assert [c.reason for c in call.commands if isinstance(c, HangUp)] == [NO_INPUT_REASON]


def test_caller_speech_after_the_prompt_rearms_it_one_prompt_per_silence() -> None:
    call = call_with()
    silence(call, TIMEOUT_MS + 20)
    caller_says(call, 800)  # "yes, still here"
    silence(call, TIMEOUT_MS + 20)
    assert stages(call) == ["prompt", "prompt"]  # a new silence: prompted again, not hung up on
    assert not call.core.ending.goodbye_due


def test_a_hang_up_cancels_the_timer() -> None:
    call = call_with()
    silence(call, TIMEOUT_MS - 1_000)
    assert call.core.no_input.next_deadline() is not None
    call.core.call_ended(call.now)
    assert call.core.no_input.next_deadline() is None
    idle(call, 60_000)
    assert stages(call) == [] and spoken(call) == []


def test_after_the_prompt_a_hang_up_leaves_no_goodbye() -> None:
    call = call_with()
    silence(call, TIMEOUT_MS + 20)
    call.core.call_ended(call.now)
    idle(call, 60_000)
    assert stages(call) == ["prompt"] and spoken(call) == [PROMPT]


def test_another_goodbye_under_way_stops_the_clock() -> None:
    call = call_with()
    call.core.end_after_speech("drain timeout", call.now, 60_000)  # e.g. the drain's goodbye, unspoken
    silence(call, 3 * TIMEOUT_MS)
    assert stages(call) == []


@pytest.mark.parametrize("timeout_ms", [0, 999, -5])
def test_a_timeout_under_a_second_is_refused(timeout_ms: int) -> None:
    with pytest.raises(ValueError, match="at least"):
        NoInputOptions(timeout_ms)


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="not empty"):
        NoInputOptions(5_000, prompt="  ")
