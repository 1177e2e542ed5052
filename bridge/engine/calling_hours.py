"""Calling windows: when an outbound route may place calls, in the callee's time zone (pure: the caller of
`allows` passes the instant).

Telemarketing rules limit the hours a business may call (47 CFR 64.1200(c)(1): not before 8 am or after 9 pm at
the called party's location; several states and EU countries are narrower), and an operator's own policy is
often narrower still. A route's window is written as spans, each with optional days:

    "mon-fri 09:00-20:00, sat 10:00-14:00"      weekdays 9 to 8, Saturdays 10 to 2
    "08:00-21:00"                               every day

Days are `mon` … `sun`, single or as a range (`fri-mon` wraps); times are HH:MM, the end after the start (24:00
is the end of the day; a span past midnight is written as two). The window is read in the route's `timezone`
(an IANA name, e.g. `America/Chicago`: the callee's, which the operator knows from the number or the customer
record), so a daylight-saving change moves it with the local clock. A dial outside it is refused before anything
is sent (`OutsideCallingHours`, with the next instant the window opens), never queued to run later: a call
the application asked for at 22:00 is not one it wants placed at 09:00 without asking again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_SPAN = re.compile(
    r"^(?:(?P<d1>[a-z]{3})(?:-(?P<d2>[a-z]{3}))?\s+)?(?P<h1>\d{2}):(?P<m1>\d{2})-(?P<h2>\d{2}):(?P<m2>\d{2})$"
)


class OutsideCallingHours(ValueError):
    """A dial outside its route's calling window: refused before anything is sent."""

    def __init__(self, route: str, hours: CallingHours, opens: datetime | None) -> None:
        when = f"; it opens {opens.isoformat(timespec='minutes')}" if opens is not None else ""
        super().__init__(f"route {route!r} places calls only {hours.text} ({hours.timezone}){when}")
        self.route = route
        self.opens = opens


@dataclass(frozen=True, slots=True)
class CallingHours:
    """A route's calling window (module docstring): spans of (weekdays, start minute, end minute)."""

    text: str
    timezone: str
    spans: tuple[tuple[frozenset[int], int, int], ...]

    def allows(self, when: datetime) -> bool:
        """Whether instant `when` (timezone-aware) lies in the window."""
        local = when.astimezone(ZoneInfo(self.timezone))
        minute = local.hour * 60 + local.minute
        return any(local.weekday() in days and start <= minute < end for days, start, end in self.spans)

    def opens_after(self, when: datetime) -> datetime | None:
        """The first instant after `when` at which the window opens (None: it never does)."""
        zone = ZoneInfo(self.timezone)
        local = when.astimezone(zone)
        soonest: datetime | None = None
        for offset in range(8):
            day = local.date() + timedelta(days=offset)
            for days, start, _ in self.spans:
                if day.weekday() not in days:
                    continue
                at = datetime.combine(day, time(start // 60, start % 60), tzinfo=zone)
                if at > local and (soonest is None or at < soonest):
                    soonest = at
            if soonest is not None:
                return soonest
        return None


def parse_calling_hours(text: str, timezone: str) -> CallingHours:
    """`text` in `timezone` as a window; ValueError naming what is wrong."""
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {timezone!r} (an IANA name, e.g. Europe/Berlin)") from exc
    spans = []
    for part in (p.strip().lower() for p in text.split(",")):
        m = _SPAN.match(part)
        if m is None:
            raise ValueError(f"{part!r}: expected [DAY[-DAY]] HH:MM-HH:MM, e.g. mon-fri 09:00-20:00")
        days = _days(m.group("d1"), m.group("d2"), part)
        start = _minute(m.group("h1"), m.group("m1"), part)
        end = _minute(m.group("h2"), m.group("m2"), part)
        if end <= start:
            raise ValueError(
                f"{part!r}: the end must come after the start (a span past midnight is two spans)"
            )
        spans.append((days, start, end))
    return CallingHours(text, timezone, tuple(spans))


def _days(first: str | None, last: str | None, part: str) -> frozenset[int]:
    if first is None:
        return frozenset(range(7))
    for day in (first, last):
        if day is not None and day not in DAYS:
            raise ValueError(f"{part!r}: {day!r} is not a day ({', '.join(DAYS)})")
    a = DAYS.index(first)
    b = DAYS.index(last) if last is not None else a
    return frozenset((a + i) % 7 for i in range((b - a) % 7 + 1))


def _minute(hours: str, minutes: str, part: str) -> int:
    h, m = int(hours), int(minutes)
    if m > 59 or h > 24 or (h == 24 and m):
        raise ValueError(f"{part!r}: {hours}:{minutes} is not a time of day")
    return h * 60 + m
