"""What follows an AMD verdict (bridge/engine/amd.py `AmdChoice`, `carry_out`) on virtual time: which action —
talk, message, hang_up — by the route's choice or the application's answer within `decide_ms`, and when it
starts: a mailbox's talk or message at its beep (or none), a hang-up at once, a person's talk at once."""

from __future__ import annotations

import pytest

from bridge.engine.amd import (
    MESSAGE_NOTE,
    AmdAction,
    AmdBeep,
    AmdChoice,
    AmdNoBeep,
    AmdPlan,
    AmdPolicy,
    AmdStart,
    AmdVerdict,
    VerdictKind,
    carry_out,
)
from rtp.units import NS_PER_MS

MS = NS_PER_MS


def verdict(kind: VerdictKind, at_ms: int) -> AmdVerdict:
    return AmdVerdict(kind, at_ms * MS, "test", at_ms, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def beep(at_ms: int) -> AmdBeep:
    return AmdBeep(at_ms * MS, "test", at_ms, 300, 1000)


def run_timer(choice: AmdChoice, until_ms: int) -> AmdStart | None:
    """The shell's timer: `handle_timer` at each deadline up to `until_ms`."""
    while (due := choice.next_deadline()) is not None and due <= until_ms * MS:
        if (start := choice.handle_timer(due)) is not None:
            return start
    return None


@pytest.mark.parametrize("kind", ["human", "silence", "unknown"])
def test_a_person_gets_talk_at_the_verdict_once_the_application_answered(kind: VerdictKind) -> None:
    choice = AmdChoice(AmdPolicy(machine="hang_up"), can_message=True)  # the route's choice is for mailboxes
    assert choice.event(verdict(kind, 1000), 1000 * MS) is None  # the application is asked first
    start = choice.answer(None, 1030 * MS)
    assert start == AmdStart("talk", kind, "route", 1030 * MS, 1030)


def test_the_applications_answer_within_decide_ms_chooses_and_a_late_one_is_ignored() -> None:
    choice = AmdChoice(AmdPolicy(decide_ms=500))
    choice.event(verdict("human", 1000), 1000 * MS)
    start = choice.answer("hang_up", 1400 * MS)
    assert start is not None and (start.action, start.by) == ("hang_up", "application")

    late = AmdChoice(AmdPolicy(decide_ms=500))
    late.event(verdict("human", 1000), 1000 * MS)
    start = run_timer(late, 2000)
    assert start == AmdStart("talk", "human", "route", 1500 * MS, 1500)  # the bound: the route's choice
    assert late.answer("hang_up", 1600 * MS) is None and late.late == 1 and late.started == start


@pytest.mark.parametrize("action", ["talk", "message"])
def test_a_mailboxs_talk_or_message_starts_at_its_beep_not_at_the_verdict(action: AmdAction) -> None:
    choice = AmdChoice(AmdPolicy(machine=action), can_message=True)
    choice.event(verdict("machine", 2600), 2600 * MS)
    assert choice.answer(None, 2620 * MS) is None  # chosen, but the greeting is still running
    assert choice.chosen == action and choice.started is None
    assert run_timer(choice, 30_000) is None  # no timer of its own: the detector's beep (or none) decides
    start = choice.event(beep(5200), 5200 * MS)
    assert start == AmdStart(action, "machine", "route", 5200 * MS, 5200)


def test_a_mailbox_with_no_beep_gets_its_message_when_the_greeting_ended_in_silence() -> None:
    choice = AmdChoice(AmdPolicy(machine="message"), can_message=True)
    choice.event(verdict("machine", 2600), 2600 * MS)
    choice.answer(None, 2610 * MS)
    start = choice.event(AmdNoBeep(7000 * MS, "silence", 7000), 7000 * MS)
    assert start is not None and (start.action, start.since_answer_ms) == ("message", 7000)


def test_a_hang_up_starts_as_soon_as_it_is_chosen_without_waiting_for_the_beep() -> None:
    choice = AmdChoice(AmdPolicy(machine="hang_up"))
    choice.event(verdict("machine", 2600), 2600 * MS)
    start = run_timer(choice, 5000)  # the application never answers: the route's, at the bound
    assert start == AmdStart("hang_up", "machine", "route", 3100 * MS, 3100)
    assert choice.event(beep(5200), 5200 * MS) is None  # one action, once


def test_the_application_may_hang_up_on_a_mailbox_whose_route_says_talk() -> None:
    choice = AmdChoice(AmdPolicy(machine="talk"))
    choice.event(verdict("machine", 2600), 2600 * MS)
    start = choice.answer("hang_up", 2700 * MS)
    assert start is not None and (start.action, start.by, start.at_ns) == (
        "hang_up",
        "application",
        2700 * MS,
    )


def test_a_beep_verdict_is_a_mailbox_whose_tone_has_ended_its_message_goes_at_once() -> None:
    choice = AmdChoice(AmdPolicy(machine="message"), can_message=True)
    choice.event(verdict("beep", 900), 900 * MS)
    start = choice.answer(None, 910 * MS)
    assert start is not None and (start.action, start.verdict) == ("message", "beep")


def test_a_message_that_cannot_be_left_keeps_the_routes_choice() -> None:
    choice = AmdChoice(AmdPolicy(machine="hang_up"), can_message=False)
    choice.event(verdict("machine", 2600), 2600 * MS)
    start = choice.answer("message", 2700 * MS)  # nothing configured to say: not a message
    assert start is not None and (start.action, start.by) == ("hang_up", "route")
    assert AmdChoice(AmdPolicy(machine="message")).default("machine") == "talk"  # none to leave: talk
    choice = AmdChoice(AmdPolicy())
    choice.event(verdict("human", 1000), 1000 * MS)
    start = choice.answer("shout", 1010 * MS)  # not an action
    assert start is not None and (start.action, start.by) == ("talk", "route")


def test_decide_ms_zero_takes_the_routes_choice_at_the_verdict() -> None:
    choice = AmdChoice(AmdPolicy(machine="hang_up", decide_ms=0))
    start = choice.event(verdict("machine", 2600), 2600 * MS)
    assert start is not None and start.action == "hang_up" and start.at_ns == 2600 * MS


def test_the_policy_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="AMD machine action"):
        AmdPolicy(machine="voicemail")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="decide_ms"):
        AmdPolicy(decide_ms=-1)


class Core:
    """What `carry_out` drives, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def answered(self, now: int) -> None:
        self.calls.append(("answered",))

    def push_update(self, text: str, *, speak: bool, now: int) -> bool:
        self.calls.append(("update", text, speak))
        return True

    def end(self, reason: str, now: int, *, message: bytes | None = None) -> None:
        self.calls.append(("end", message))

    def end_after_speech(self, reason: str, now: int, within_ms: int) -> None:
        self.calls.append(("end_after_speech", within_ms))


def test_each_action_on_the_core() -> None:
    def run(action: AmdAction, plan: AmdPlan) -> list[tuple[object, ...]]:
        core = Core()
        carry_out(core, AmdStart(action, "machine", "route", 0, 0), plan, 0)
        return core.calls

    plan = AmdPlan(greeting="Hello!", message="Call us back.")
    assert run("talk", plan) == [("answered",), ("update", "Hello!", True)]
    note = MESSAGE_NOTE.format(text="Call us back.")
    assert run("message", plan) == [("answered",), ("update", note, True), ("end_after_speech", 60_000)]
    # a recording: played by the bridge, then BYE; the model is never released
    assert run("message", AmdPlan(message="x", message_audio=b"\1\0" * 800)) == [("end", b"\1\0" * 800)]
    assert run("hang_up", plan) == [("end", None)]
    assert run("talk", AmdPlan()) == [("answered",)]  # no greeting: the model is released, nothing asked
