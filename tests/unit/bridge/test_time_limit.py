"""--max-call-duration goes through the goodbye: where the engine enforces the limit (a leg that
declares `sip.leg.LegFeatures.time_limit`), the server asks the model for a goodbye and ends the call once it
has been played, the CallEnding mechanism of end_call, with the limit as the reason; the engine's own BYE is
only the backstop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from bridge.engine.commands import HangUp
from bridge.engine.telephony import TIME_LIMIT_NOTE, TelephonyOptions, time_limit_grace_s
from bridge.server.api import _goodbye_at_time_limit
from providers.events import AudioReceived
from rtp.audio import PCMU_8K
from sip.leg import LegFeatures, PlayoutLeg, offers_time_limit
from tests.support.session_engine import Call, pcmu_tone

REASON = "the call reached --max-call-duration (60 s)"


@dataclass
class LimitLeg:
    features: ClassVar[LegFeatures] = LegFeatures(time_limit=True)
    handler: Callable[[str], object] | None = None
    grace_s: float = 0.0

    def on_time_limit(self, handler: Callable[[str], object], grace_s: float) -> None:
        self.handler, self.grace_s = handler, grace_s


@dataclass
class StubCall:
    live: bool = True
    goodbyes: list[tuple[str, str]] = field(default_factory=list)
    hangups: list[str] = field(default_factory=list)

    def say_goodbye(self, note: str, reason: str) -> bool:
        self.goodbyes.append((note, reason))
        return self.live

    def hang_up(self, reason: str = "") -> None:
        self.hangups.append(reason)


def test_the_leg_is_told_to_ask_for_a_goodbye_with_the_goodbye_timeout_as_grace() -> None:
    leg, call = LimitLeg(), StubCall()
    assert offers_time_limit(leg)
    options = TelephonyOptions(goodbye_timeout_ms=4_000)
    _goodbye_at_time_limit(leg, call, options)  # type: ignore[arg-type]
    assert leg.grace_s == time_limit_grace_s(options) == 6.0
    assert leg.handler is not None
    leg.handler(REASON)
    assert call.goodbyes == [(TIME_LIMIT_NOTE, REASON)] and call.hangups == []


def test_a_call_that_cannot_say_goodbye_any_more_is_hung_up_at_once() -> None:
    leg, call = LimitLeg(), StubCall(live=False)
    _goodbye_at_time_limit(leg, call, TelephonyOptions())  # type: ignore[arg-type]
    assert leg.handler is not None
    leg.handler(REASON)
    assert call.hangups == [REASON]


def test_a_leg_without_the_hook_is_left_alone() -> None:
    call = StubCall()
    _goodbye_at_time_limit(PlayoutLeg(), call, TelephonyOptions())  # type: ignore[arg-type]
    assert call.goodbyes == [] and call.hangups == []


def test_a_leg_that_does_not_declare_the_time_limit_is_not_asked_even_with_the_method() -> None:
    """`sip.leg.LegFeatures.time_limit` decides, not the presence of `on_time_limit`."""

    @dataclass
    class UndeclaredLeg(LimitLeg):
        features: ClassVar[LegFeatures] = LegFeatures()

    leg = UndeclaredLeg()
    _goodbye_at_time_limit(leg, StubCall(), TelephonyOptions())  # type: ignore[arg-type]
    assert leg.handler is None


def test_the_goodbye_is_played_before_the_bye_which_names_the_limit() -> None:
    # the core path LiveCall.say_goodbye takes: a spoken update, then CallEnding.end_after_goodbye(reason)
    call = Call(telephony=TelephonyOptions(goodbye_timeout_ms=2_000))
    assert call.core.push_update(TIME_LIMIT_NOTE, speak=True, now=call.now)
    call.core.ending.end_after_goodbye(call.now, REASON)
    call.provider(AudioReceived(1, pcmu_tone(300), PCMU_8K))  # the goodbye
    call.tick(count=10)
    assert not [c for c in call.commands if isinstance(c, HangUp)]  # not while it plays
    call.tick(count=30)
    assert [c for c in call.commands if isinstance(c, HangUp)] == [HangUp(REASON)]
    assert call.core.ending.by_bridge  # the record's ended_by: "bridge"
    assert len(call.sent) == 15  # every goodbye frame left before the BYE
