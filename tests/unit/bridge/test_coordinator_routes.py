"""The coordinator's table of the floor's provider events (bridge/engine/coordinator.py `_FLOOR`, looked up with
`type(event)`): every event type of the vocabulary either has its handler there or is, by decision, only
watched by the rooms every floor event reaches anyway (usage, HR12; the rollover's `observe`, RO1-RO3). A new
event type added to `providers.events.ProviderEvent` fails here until it is given one or the other."""

from __future__ import annotations

import typing

from bridge.engine.coordinator import SessionCoordinator
from providers import events as ev

WATCHED_ONLY = frozenset(
    {
        ev.UsageUpdated,  # counted from any connection before the floor is asked (HR12)
        ev.InputTranscriptFailed,  # the rollover's RO3 matching (`RolloverLink.observe`)
        ev.SessionExpiring,  # the rollover's announced end (`RolloverLink.observe`)
    }
)


def test_every_provider_event_type_has_a_floor_handler_or_is_only_watched() -> None:
    vocabulary = set(typing.get_args(ev.ProviderEvent))
    handled = set(SessionCoordinator._FLOOR)
    assert handled | WATCHED_ONLY == vocabulary
    assert not handled & WATCHED_ONLY
