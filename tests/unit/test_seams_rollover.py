"""S1 and S3 where the rollover meets recovery and barge-in, on virtual time through the session coordinator.

S1: every caller utterance reaches the application exactly once, or lies inside a reported input
`audio_discontinuity`. S3: only the floor's audio reaches the channel, none of a cleared epoch. Each test
drives `RolloverCall` (a provider per connection whose server VAD follows what it was sent) into the seam.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from test_rollover_session import SCALED, RolloverCall

from bridge.coordinator import Transcript
from providers.events import (
    InputTranscript,
    InputTranscriptFailed,
    ProviderEvent,
)

LONG = replace(SCALED, transcript_wait_ms=2_000, hard_stop_ms=14_000, cap_ms=16_000)


def finals(call: RolloverCall) -> list[str]:
    return [n.text for n in call.notices if isinstance(n, Transcript) and n.role == "caller" and n.final]


def heard(call: RolloverCall) -> list[str]:
    return [f"utterance {i}" for i in range(1, call.utterance + 1)]


def stage(call: RolloverCall) -> str:
    return str(call.core.status(call.now)["rollover"]["stage"])


def filtered(call: RolloverCall, drop: Callable[[ProviderEvent], ProviderEvent | None]) -> Callable[[], None]:
    """Route the providers' events through `drop` (None: the event never comes); returns the undo."""
    original = call.core.provider_event

    def through(event: ProviderEvent, now: int) -> None:
        if (kept := drop(event)) is not None:
            original(kept, now)

    call.core.provider_event = through  # type: ignore[method-assign]
    return lambda: setattr(call.core, "provider_event", original)


# --- RO3 matching: one utterance, one match ----------------------------------------------------------------


def test_ro3_s1_two_utterances_closer_than_the_slack_stay_two_when_the_old_text_of_the_second_fails() -> None:
    call = RolloverCall(replace(LONG, overlap_ms=6_000))
    call.talk_until_a_rollover_opens()

    def second_fails(e: ProviderEvent) -> ProviderEvent | None:
        if isinstance(e, InputTranscript) and e.token == 1 and e.text == f"utterance {second}":
            return InputTranscriptFailed(1, e.item_id, "transcription failed")
        return e

    second = call.utterance + 2
    undo = filtered(call, second_fails)
    call.turn(talk_ms=1_000, pause_ms=300)  # 300 ms apart: closer than match_slack_ms (500)
    call.turn(talk_ms=1_000, pause_ms=300)
    undo()
    assert stage(call) == "overlap"
    call.step(False, 100)
    assert finals(call) == heard(call)  # the second from the next connection (RO3), not taken for the first


def test_ro3_s1_two_close_utterances_whose_new_texts_came_first_are_each_matched_once() -> None:
    """The new connection's texts of both wait; the old one's text of the first must settle the first only."""
    call = RolloverCall(replace(LONG, overlap_ms=6_000))
    new = call.talk_until_a_rollover_opens().token
    held: list[tuple[ProviderEvent, int]] = []

    def old_text_later(e: ProviderEvent) -> ProviderEvent | None:
        if isinstance(e, InputTranscript) and e.token == 1:
            held.append((e, call.now))
            return None
        return e

    undo = filtered(call, old_text_later)
    call.turn(talk_ms=1_000, pause_ms=300)
    call.turn(talk_ms=1_000, pause_ms=300)
    undo()
    first, second = held
    call.core.provider_event(first[0], call.now)
    assert isinstance(second[0], InputTranscript)
    call.core.provider_event(InputTranscriptFailed(1, second[0].item_id, "failed"), call.now)
    call._carry_out()
    assert finals(call) == heard(call) and new in call.open


def test_ro3_s1_an_utterance_over_before_the_next_one_heard_is_never_matched_to_its_first() -> None:
    """The next connection opens at the caller's end of speech and the old one's text of that utterance comes
    just after: it is the old one's alone. The caller's next utterance, 200 ms later, heard by both, is not a
    duplicate of it when the old one's text of the next fails."""
    call = RolloverCall()
    call.talk_until_a_rollover_opens()

    def next_fails(e: ProviderEvent) -> ProviderEvent | None:
        if isinstance(e, InputTranscript) and e.token == 1:
            return InputTranscriptFailed(1, e.item_id, "transcription failed")
        return e

    undo = filtered(call, next_fails)
    call.utterance += 1
    call.step(True, 40)
    call.step(False)
    undo()
    call.step(False, 100)
    assert finals(call) == heard(call)
