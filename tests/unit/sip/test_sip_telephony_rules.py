"""sip/core/telephony.py on its own (no engine): which DTMF digits and REFER targets a leg accepts.

tests/unit/sip/test_sip_telephony.py checks the same rules through the pjsua2 leg (nothing queued on a bad one)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sip.core.telephony import DTMF_DIGITS, MAX_DTMF_DIGITS, validate_dtmf_digits, validate_transfer_target


def test_dtmf_digits_are_the_sixteen_rfc_4733_keys() -> None:
    assert sorted(DTMF_DIGITS) == sorted("0123456789*#ABCD")
    assert MAX_DTMF_DIGITS == 32


@given(st.text(alphabet="0123456789*#ABCDabcd", min_size=1, max_size=MAX_DTMF_DIGITS))
def test_any_run_of_dtmf_keys_is_accepted_upper_cased(digits: str) -> None:
    assert validate_dtmf_digits(digits) == digits.upper()


@given(st.text(min_size=1, max_size=8).filter(lambda s: any(c.upper() not in DTMF_DIGITS for c in s)))
def test_anything_else_is_a_value_error(digits: str) -> None:
    with pytest.raises(ValueError, match="not DTMF digits"):
        validate_dtmf_digits(digits)


def test_too_many_or_no_digits_are_value_errors() -> None:
    with pytest.raises(ValueError, match="at most 32"):
        validate_dtmf_digits("1" * 33)
    with pytest.raises(ValueError, match="at least one digit"):
        validate_dtmf_digits("")


@pytest.mark.parametrize(
    "target, uri",
    [
        ("sip:agent@127.0.0.1:5999", "sip:agent@127.0.0.1:5999"),
        ("<sips:desk@pbx.example>", "sips:desk@pbx.example"),
        (" tel:+15551234 ", "tel:+15551234"),
    ],
)
def test_transfer_targets_are_bare_uris(target: str, uri: str) -> None:
    assert validate_transfer_target(target) == uri


@pytest.mark.parametrize("target", ["", "desk", "mailto:a@b", "sip:a@b\r\nX: 1", "sip:a@b>", "<sip:a b@c>"])
def test_other_transfer_targets_are_value_errors(target: str) -> None:
    with pytest.raises(ValueError, match="is not a sip:, sips: or tel: URI"):
        validate_transfer_target(target)
