"""Payment-card mode's collector (bridge/engine/card.py) on virtual time: every way a collection ends."""

from __future__ import annotations

import json

import pytest

from bridge.engine.card import CARD_CAUSE, CardCollector, CardOptions, CardResult, model_answer
from rtp.units import NS_PER_MS as MS

PAN = "4929512345678907"
T0 = 1_000 * MS


def collector(**kw: object) -> CardCollector:
    return CardCollector(CardOptions(**kw), T0, 1_000, "model")  # type: ignore[arg-type]


def key_in(card: CardCollector, keys: str, *, every_ms: int = 300) -> CardResult | None:
    result = None
    for i, key in enumerate(keys):
        result = card.digit(key, T0 + (i + 1) * every_ms * MS, 1_000 + (i + 1) * every_ms) or result
    return result


def test_the_terminator_ends_a_long_enough_entry_as_collected() -> None:
    card = collector()
    assert key_in(card, PAN[:-1]) is None
    result = key_in(card, PAN[-1] + "#")
    assert result is not None and result.outcome == "collected"
    assert result.digits == PAN
    assert (result.started_ms, result.by) == (1_000, "model")
    assert card.next_deadline() is None  # over: no timer


def test_max_digits_end_it_without_the_terminator() -> None:
    card = collector(min_digits=3, max_digits=4)
    result = key_in(card, "1234")
    assert result is not None and (result.outcome, result.digits) == ("collected", "1234")
    assert card.digit("5", T0 + 9_000 * MS, 10_000) is None  # later keys change nothing


def test_the_terminator_before_min_digits_is_invalid_and_hands_over_no_digit() -> None:
    result = key_in(collector(), "4929#")
    assert result is not None and (result.outcome, result.digits) == ("invalid", "")


def test_star_and_letters_are_never_collected() -> None:
    result = key_in(collector(min_digits=3, max_digits=5), "1*2A3D#")
    assert result is not None and (result.outcome, result.digits) == ("collected", "123")


def test_the_digit_timeout_with_enough_digits_collects_them() -> None:
    card = collector(min_digits=3, digit_timeout_ms=5_000)
    key_in(card, "1234")  # the last at +1.2 s
    due = card.next_deadline()
    assert due == T0 + (1_200 + 5_000) * MS
    assert card.handle_timer(due - 1, 7_199) is None
    result = card.handle_timer(due, 7_200)
    assert result is not None and (result.outcome, result.digits, result.ended_ms) == (
        "collected",
        "1234",
        7_200,
    )


def test_the_digit_timeout_with_too_few_digits_is_a_timeout() -> None:
    card = collector(digit_timeout_ms=5_000)
    key_in(card, "49")
    due = card.next_deadline()
    assert due is not None
    result = card.handle_timer(due, 6_600)
    assert result is not None and (result.outcome, result.digits) == ("timeout", "")


def test_no_key_at_all_times_out_after_the_digit_timeout() -> None:
    card = collector(digit_timeout_ms=4_000)
    assert card.next_deadline() == T0 + 4_000 * MS
    result = card.handle_timer(T0 + 4_000 * MS, 5_000)
    assert result is not None and result.outcome == "timeout"


def test_the_overall_timeout_ends_an_entry_still_being_keyed() -> None:
    card = collector(min_digits=3, digit_timeout_ms=2_000, timeout_ms=3_000)
    key_in(card, "12345678", every_ms=350)  # the last at +2.8 s: the digit timeout would be +4.8 s
    assert card.next_deadline() == T0 + 3_000 * MS
    result = card.handle_timer(T0 + 3_000 * MS, 4_000)
    assert result is not None and (result.outcome, result.digits) == ("timeout", "")


@pytest.mark.parametrize("outcome", ["cancelled", "hangup"])
def test_cancel_and_hang_up_end_it_once_with_no_digit(outcome: str) -> None:
    card = collector()
    key_in(card, PAN[:8])
    result = card.end(outcome, 5_000)  # type: ignore[arg-type]
    assert result is not None and (result.outcome, result.digits) == (outcome, "")
    assert card.end("cancelled", 6_000) is None
    assert card.handle_timer(T0 + 10**12, 99_999) is None


def test_the_withheld_frames_are_one_input_discontinuity_at_the_end() -> None:
    card = collector()
    card.withheld = 250
    assert card.discontinuity() is None  # still collecting
    key_in(card, PAN + "#")
    gap = card.discontinuity()
    assert gap is not None
    assert (gap.direction, gap.amount, gap.cause, gap.at_ms) == ("input", 250, CARD_CAUSE, 1_000 + 17 * 300)


def test_neither_the_repr_nor_the_notice_nor_the_models_answer_show_a_digit() -> None:
    card = collector()
    result = key_in(card, PAN + "#")
    assert result is not None and result.digits == PAN
    notice = card.notice
    assert notice is not None and notice.outcome == "collected"
    for text in (repr(result), str(result), repr(notice), model_answer(result), repr(card.discontinuity())):
        assert PAN not in text and PAN[:4] not in text and PAN[-4:] not in text
    assert json.loads(model_answer(result)) == {"outcome": "collected"}


def test_a_shape_that_cannot_be_honoured_is_refused() -> None:
    with pytest.raises(ValueError):
        CardOptions(min_digits=5, max_digits=4)
    with pytest.raises(ValueError):
        CardOptions(terminator="5")
    with pytest.raises(ValueError):
        CardOptions(timeout_ms=0)
