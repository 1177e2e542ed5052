"""The application's SIP headers through the Python API (bridge/server/api.py `LiveCall`): `hang_up(headers=)`
puts them on the leg's BYE, `transfer(target, headers=)` on its REFER (the `TransferCall` command); a bad one
is a ValueError naming it where the application calls, nothing reaches the leg; a leg that cannot carry them
(`LegFeatures.sip_headers` off: the browser) refuses them, while a hang-up or transfer without headers goes on
as before. The model's `transfer_call` sets none."""

from __future__ import annotations

from typing import ClassVar

import pytest

from bridge.engine.commands import TransferCall
from bridge.server.api import LiveCall
from bridge.server.session import CallSession
from sip.core.app_headers import HeaderRefused
from sip.leg import LegFeatures
from tests.support.session import FakeLeg, FakeProvider

Pairs = tuple[tuple[str, str], ...]


class HeaderLeg(FakeLeg):
    """A leg that declares `LegFeatures.sip_headers` and records what it was asked to send."""

    features: ClassVar[LegFeatures] = LegFeatures(sip_headers=True)

    def __init__(self) -> None:
        super().__init__()
        self.bye_headers: list[Pairs] = []
        self.transfers: list[tuple[str, Pairs]] = []

    def hangup(self, reason: str = "normal clearing", status: int = 503, headers: Pairs = ()) -> None:
        self.bye_headers.append(headers)
        super().hangup(reason, status)

    def transfer(self, target: str, headers: Pairs = ()) -> None:
        self.transfers.append((target, headers))


class PlainLeg(FakeLeg):
    """A leg without the feature (the browser's): `hangup` and `transfer` take no headers."""

    def __init__(self) -> None:
        super().__init__()
        self.transfers: list[str] = []

    def transfer(self, target: str) -> None:
        self.transfers.append(target)


def _session(leg: FakeLeg) -> CallSession:
    return CallSession(leg, FakeProvider(), clock=lambda: 0)  # type: ignore[arg-type]  # the fake's protocol


def _live(leg: FakeLeg) -> LiveCall:
    return LiveCall(leg.identity, _session(leg))


def test_hang_up_puts_the_checked_headers_on_the_bye() -> None:
    leg = HeaderLeg()
    _live(leg).hang_up("resolved", headers={"X-Result": " resolved ", "Reason": "Q.850;cause=16"})
    assert leg.hangups == ["resolved"]
    assert leg.bye_headers == [(("X-Result", "resolved"), ("Reason", "Q.850;cause=16"))]


def test_transfer_puts_the_checked_headers_on_the_refer() -> None:
    leg = HeaderLeg()
    _live(leg).transfer("sip:agent@example.com", headers=[("X-Queue", "billing")])
    assert leg.transfers == [("sip:agent@example.com", (("X-Queue", "billing"),))]


def test_a_bad_header_is_a_value_error_naming_it_and_nothing_reaches_the_leg() -> None:
    leg = HeaderLeg()
    live = _live(leg)
    with pytest.raises(HeaderRefused, match="'X-A'.*CR, LF") as caught:
        live.hang_up("x", headers={"X-A": "1\r\nVia: SIP/2.0/UDP evil"})
    assert isinstance(caught.value, ValueError) and caught.value.name == "X-A"
    with pytest.raises(ValueError, match="'Refer-To'.*may not be set"):
        live.transfer("sip:agent@example.com", headers={"Refer-To": "<sip:evil@x>"})
    with pytest.raises(ValueError, match="at most 16"):
        live.hang_up("x", headers={f"X-{i}": "1" for i in range(17)})
    with pytest.raises(ValueError):
        live.transfer("http://not-sip", headers={"X-A": "1"})  # the target is checked as well
    assert leg.hangups == [] and leg.bye_headers == [] and leg.transfers == []


def test_a_leg_that_cannot_carry_headers_refuses_them_and_works_without() -> None:
    leg = PlainLeg()
    live = _live(leg)
    with pytest.raises(ValueError, match="cannot carry SIP headers"):
        live.hang_up("x", headers={"X-A": "1"})
    with pytest.raises(ValueError, match="cannot carry SIP headers"):
        live.transfer("sip:agent@example.com", headers={"X-A": "1"})
    assert leg.hangups == [] and leg.transfers == []
    live.transfer("sip:agent@example.com")
    live.hang_up("done")
    assert leg.transfers == ["sip:agent@example.com"] and leg.hangups == ["done"]


def test_the_models_transfer_command_carries_no_headers() -> None:
    assert TransferCall("sip:agent@example.com").headers == ()
    leg = HeaderLeg()
    _session(leg)._transfer(TransferCall("sip:agent@example.com"))
    assert leg.transfers == [("sip:agent@example.com", ())]
