"""Calling windows of outbound routes (bridge/engine/calling_hours.py): read in the callee's time zone, across a
daylight-saving change; a dial outside one is refused before anything is sent, with when it opens."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bridge.cli.config import ConfigError, load
from bridge.cli.ops import RoutedApplication, dialled_user
from bridge.engine.calling_hours import OutsideCallingHours, parse_calling_hours
from bridge.server.api import Application, Server, ServerConfig
from bridge.server.http import StatusServer
from tests.support.dial_safety import _Dialer, _post

WEEKDAYS = parse_calling_hours("mon-fri 09:00-20:00, sat 10:00-14:00", "America/Chicago")


def chicago(*args: int) -> datetime:
    from zoneinfo import ZoneInfo

    return datetime(*args, tzinfo=ZoneInfo("America/Chicago"))  # type: ignore[misc]


def test_a_window_is_read_on_the_callees_clock() -> None:
    assert WEEKDAYS.allows(chicago(2026, 12, 7, 9, 0))  # a Monday, 9:00 in Chicago
    assert not WEEKDAYS.allows(chicago(2026, 12, 7, 8, 59))
    assert not WEEKDAYS.allows(chicago(2026, 12, 7, 20, 0))  # the end is not in it
    assert WEEKDAYS.allows(chicago(2026, 12, 12, 13, 59)) and not WEEKDAYS.allows(
        chicago(2026, 12, 12, 14, 0)
    )
    assert not WEEKDAYS.allows(chicago(2026, 12, 13, 12, 0))  # Sunday
    # 15:30 UTC is 9:30 in Chicago in winter (UTC-6)
    assert WEEKDAYS.allows(datetime(2026, 12, 7, 15, 30, tzinfo=UTC))
    assert not WEEKDAYS.allows(datetime(2026, 12, 7, 14, 30, tzinfo=UTC))


def test_the_window_moves_with_daylight_saving_time() -> None:
    hours = parse_calling_hours("08:00-21:00", "America/Chicago")
    # 13:30 UTC: 7:30 on 6 March (CST, UTC-6), 8:30 on 9 March (CDT, UTC-5, after the change on the 8th)
    assert not hours.allows(datetime(2026, 3, 6, 13, 30, tzinfo=UTC))
    assert hours.allows(datetime(2026, 3, 9, 13, 30, tzinfo=UTC))


def test_it_opens_next_at_the_start_of_the_next_span_that_day_or_after() -> None:
    assert WEEKDAYS.opens_after(chicago(2026, 12, 7, 6, 0)) == chicago(2026, 12, 7, 9, 0)
    assert WEEKDAYS.opens_after(chicago(2026, 12, 11, 21, 0)) == chicago(2026, 12, 12, 10, 0)  # Fri night
    assert WEEKDAYS.opens_after(chicago(2026, 12, 12, 15, 0)) == chicago(2026, 12, 14, 9, 0)  # Sat afternoon
    assert parse_calling_hours("fri-mon 10:00-12:00", "UTC").opens_after(
        datetime(2026, 12, 8, 0, 0, tzinfo=UTC)  # a Tuesday: the wrapped range opens on Friday
    ) == datetime(2026, 12, 11, 10, 0, tzinfo=UTC)


def test_a_window_that_cannot_be_read_is_refused_with_what_is_wrong() -> None:
    for text, zone, says in (
        ("9-17", "UTC", "expected"),
        ("mon-fry 09:00-17:00", "UTC", "'fry' is not a day"),
        ("20:00-08:00", "UTC", "past midnight"),
        ("09:00-24:30", "UTC", "not a time of day"),
        ("09:00-17:00", "Mars/Olympus", "unknown time zone"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_calling_hours(text, zone)


def _config(tmp_path: Path, route: str) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(route)
    return path


def test_the_file_gives_an_outbound_route_its_window_and_refuses_one_on_an_inbound_route(
    tmp_path: Path,
) -> None:
    path = _config(
        tmp_path,
        '[[routes]]\nname = "reminders"\ndirection = "outbound"\npattern = "_+1."\n'
        'calling_hours = "mon-fri 09:00-20:00"\ntimezone = "America/Chicago"\n',
    )
    (route,) = load(path).routes
    assert route.calling_hours == parse_calling_hours("mon-fri 09:00-20:00", "America/Chicago")
    for bad, where in (
        ('name = "in"\ncalling_hours = "09:00-17:00"\ntimezone = "UTC"\n', "outbound routes"),
        ('name = "out"\ndirection = "outbound"\ncalling_hours = "09:00-17:00"\n', "go together"),
        ('name = "out"\ndirection = "outbound"\ncalling_hours = "9 to 5"\ntimezone = "UTC"\n', "expected"),
    ):
        with pytest.raises(ConfigError, match=where):
            load(_config(tmp_path, "[[routes]]\n" + bad))


def test_a_dial_outside_its_routes_window_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    config = load(
        _config(
            tmp_path,
            '[[routes]]\nname = "reminders"\ndirection = "outbound"\npattern = "_+1."\n'
            'calling_hours = "mon-fri 09:00-20:00"\ntimezone = "America/Chicago"\n',
        )
    )
    clock = [chicago(2026, 12, 7, 21, 30)]  # a Monday evening in Chicago
    app = RoutedApplication(Application(), config, now=lambda: clock[0])

    async def go() -> None:
        server = Server(app, ServerConfig())
        dialer = _Dialer()
        server._agent = dialer  # type: ignore[assignment]
        server._on_call = lambda leg, **_: None  # type: ignore[method-assign]
        with pytest.raises(OutsideCallingHours) as refused:
            await server.dial("sip:+13125550100@127.0.0.1")
        assert refused.value.opens == chicago(2026, 12, 8, 9, 0)
        with pytest.raises(OutsideCallingHours):
            await server.dial("sip:+13125550100@127.0.0.1", route="reminders")
        http = await StatusServer(lambda: {}, dial=server._dial_from_http).start("127.0.0.1", 0)
        try:
            status, answer = await _post(http.port, {"to": "+13125550100"}, {})
            assert status == 403 and answer["opens"] == "2026-12-08T09:00-06:00"
            assert "reminders" in answer["error"]
        finally:
            await http.close()
        assert dialer.asked == []  # nothing was sent
        assert await server.dial("sip:+4930123456@127.0.0.1") == "out-1"  # no route: no window
        clock[0] = chicago(2026, 12, 8, 9, 0)
        assert await server.dial("sip:+13125550100@127.0.0.1") == "out-2"

    asyncio.run(go())


def test_the_dialled_user_is_a_bare_number_or_the_uris_user_part() -> None:
    assert dialled_user("+13125550100") == "+13125550100"
    assert dialled_user("sip:+13125550100@carrier.example;user=phone") == "+13125550100"
    assert dialled_user("tel:+13125550100") == "+13125550100"
