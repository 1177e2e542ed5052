"""The pjsua2 leg checks transfer targets and DTMF digits itself, before anything reaches the pjsua thread."""

from typing import TYPE_CHECKING

import pytest

from sip.core.telephony import validate_dtmf_digits, validate_transfer_target
from sip.leg import CallIdentity

if TYPE_CHECKING:
    from sip.pjsua2.agent import Pjsua2Leg


class _Agent:
    """Records the commands a leg hands to the pjsua thread."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, int, str, int]] = []
        self.headers: list[tuple[tuple[str, str], ...]] = []  # the application's, with each command

    def _command(self, command: tuple[str, int, str, int], headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.commands.append(command)
        self.headers.append(headers)


def _leg() -> tuple["Pjsua2Leg", _Agent]:
    # The leg's tests need the optional extra, which has no wheel past CPython 3.12; the validators' do not.
    pytest.importorskip("pjsua2")
    from sip.pjsua2.agent import Pjsua2Leg

    agent = _Agent()
    identity = CallIdentity(
        "call-1", "abc@127.0.0.1", "sip:a@127.0.0.1", "sip:b@127.0.0.1", "b", "127.0.0.1:5080"
    )
    return Pjsua2Leg(agent, 7, identity), agent  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "digits, sent",
    [("12#", "12#"), ("0123456789*#ABCD", "0123456789*#ABCD"), ("abcd", "ABCD"), ("9" * 32, "9" * 32)],
)
def test_valid_digits_are_queued_for_the_pjsua_thread(digits: str, sent: str) -> None:
    leg, agent = _leg()
    leg.send_dtmf(digits)
    assert agent.commands == [("dtmf", 7, sent, 0)]


@pytest.mark.parametrize(
    "digits, message",
    [
        ("", "at least one digit"),
        ("12x", "'X' not DTMF digits"),
        ("1 2", "' ' not DTMF digits"),
        ("E", "'E' not DTMF digits"),
        ("R", "'R' not DTMF digits"),  # pjmedia knows R (flash), RFC 4733 DTMF does not
        ("١", "not DTMF digits"),  # an Arabic-Indic one: not ASCII
        ("1" * 33, "at most 32"),
        (None, "at least one digit"),
    ],
)
def test_invalid_digits_raise_value_error_and_nothing_is_sent(digits: str, message: str) -> None:
    leg, agent = _leg()
    with pytest.raises(ValueError, match=message):
        leg.send_dtmf(digits)
    assert agent.commands == []


@pytest.mark.parametrize(
    "target, sent",
    [
        ("sip:agent@127.0.0.1:5999", "sip:agent@127.0.0.1:5999"),
        ("<sip:agent@pbx.example;transport=udp>", "sip:agent@pbx.example;transport=udp"),
        ("sips:desk@pbx.example", "sips:desk@pbx.example"),
        ("tel:+15551234", "tel:+15551234"),
        ("  SIP:ops@127.0.0.1  ", "SIP:ops@127.0.0.1"),
    ],
)
def test_transfer_targets_are_queued_as_bare_uris(target: str, sent: str) -> None:
    leg, agent = _leg()
    leg.transfer(target)
    assert agent.commands == [("transfer", 7, sent, 0)]


@pytest.mark.parametrize(
    "target",
    [
        "",
        "front desk",
        "15551234",
        "http://pbx.example/agent",
        "sip:",
        "sip:a b@pbx.example",
        "sip:a@pbx.example\r\nX-Injected: 1",
        "<sip:a@pbx.example",
        '"Desk" <sip:desk@pbx.example>',
        None,
    ],
)
def test_malformed_transfer_targets_raise_value_error_and_nothing_is_sent(target: str) -> None:
    leg, agent = _leg()
    with pytest.raises(ValueError, match="not a sip:, sips: or tel: URI"):
        leg.transfer(target)
    assert agent.commands == []


def test_validators_are_usable_on_their_own() -> None:
    assert validate_dtmf_digits("1a") == "1A"
    assert validate_transfer_target("<tel:+15551234>") == "tel:+15551234"


def test_the_applications_headers_are_queued_with_the_transfer_and_the_hangup() -> None:
    leg, agent = _leg()
    assert leg.features.sip_headers  # sip.leg.HeaderedLeg on pjsua2 too
    leg.transfer("sip:agent@127.0.0.1:5999", (("X-Queue", " billing "),))
    leg.hangup("done", 200, (("Reason", "Q.850;cause=16"),))
    assert agent.commands == [("transfer", 7, "sip:agent@127.0.0.1:5999", 0), ("hangup", 7, "done", 200)]
    assert agent.headers == [(("X-Queue", "billing"),), (("Reason", "Q.850;cause=16"),)]


def test_a_bad_header_raises_and_nothing_is_queued() -> None:
    leg, agent = _leg()
    with pytest.raises(ValueError, match="CR, LF"):
        leg.transfer("sip:agent@127.0.0.1:5999", (("X-Queue", "1\r\nVia: evil"),))
    with pytest.raises(ValueError, match="may not be set"):
        leg.hangup("done", 200, (("Refer-To", "<sip:evil@x>"),))
    assert agent.commands == [] and not leg.hangup_requested


def test_the_headers_ride_the_requests_sip_tx_option() -> None:
    pj = pytest.importorskip("pjsua2")
    from sip.pjsua2.agent import tx_headers

    op = pj.CallOpParam()
    tx_headers(op, (("X-Queue", "billing"), ("Reason", "Q.850;cause=16")))
    sent = [(h.hName, h.hValue) for h in op.txOption.headers]
    assert sent == [("X-Queue", "billing"), ("Reason", "Q.850;cause=16")]
