"""DESIGN principle 3 and RO7: the connection registry allocates every token, names every connection, and
keeps stale transports inert."""

from __future__ import annotations

from bridge.engine.connections import Connections, Role, connection_id, token_of


def test_ro7_connection_ids_are_derived_from_tokens_allocated_in_one_place() -> None:
    reg = Connections(1)
    assert [reg.allocate(), reg.allocate_id(), reg.allocate()] == [2, "conn-3", 4]  # monotonic, never reused
    assert connection_id(7) == "conn-7" and token_of("conn-7") == 7
    assert token_of("elsewhere-7") == -1 and token_of("conn-") == -1


def test_principle3_stale_tokens_are_counted_and_listeners_are_not_the_floor() -> None:
    reg = Connections(1)
    reg.add_listener(reg.allocate())
    assert [reg.classify(t) for t in (1, 2, 9)] == [Role.FLOOR, Role.LISTENER, Role.STALE]
    assert reg.stale_events == 1
    reg.start_input(2)
    assert reg.audio_targets == (1, 2)
    assert reg.take_floor(2) and reg.floor == 2 and reg.listeners == {1}  # the old one may finish (RO3)
    reg.stop_input(1)
    reg.drop(1)
    assert reg.audio_targets == (2,) and reg.classify(1) is Role.STALE
    assert not reg.take_floor(9)  # an unknown token never takes the floor


def test_hr2_a_recovery_quarantines_the_floor_and_every_listener() -> None:
    reg = Connections(1)
    reg.add_listener(reg.allocate())
    reg.start_input(2)
    token, closed = reg.replace_floor()
    assert token == 3 and closed == [1, 2] and reg.audio_targets == (3,)
    assert reg.classify(1) is Role.STALE and reg.classify(2) is Role.STALE


def test_hr7_only_the_floor_s_latest_resumable_handle_is_kept() -> None:
    reg = Connections(1)
    reg.resumption_updated(1, "a", True)
    reg.resumption_updated(1, "b", False)  # not resumable now: the last good one stays
    reg.resumption_updated(2, "c", True)  # not the floor
    assert reg.resume_handle == "a" and reg.status()["resumable"] is True


def test_ro8_handing_over_while_the_floor_stopped_hearing_the_caller_and_a_listener_hears_them() -> None:
    c = Connections(1)
    assert not c.handing_over
    c.add_listener(2)
    c.start_input(2)
    assert not c.handing_over  # both hear the caller (the overlap)
    c.stop_input(1)
    assert c.handing_over  # the old one finishes its items; the new one hears the caller
    assert c.take_floor(2) and not c.handing_over
    c.stop_input(2)
    assert not c.handing_over  # nobody hears the caller (a refused rollover's end): no hand-over
