"""RFC 4733: one digit per event however many end packets arrive, lost ends, no trust in the marker bit,
and the exact packet sequence the sender puts on the wire."""

from __future__ import annotations

import struct

import pytest

from rtp.dtmf import DtmfDigit, DtmfReceiver, DtmfSender, event_code
from rtp.packet import Drop
from rtp.units import NS_PER_MS as MS


def ev(code: int, end: bool, duration: int, volume: int = 10) -> bytes:
    return struct.pack("!BBH", code, (0x80 if end else 0) | volume, duration)


def press(rx: DtmfReceiver, code: int, ts: int, t0: int, ends: int = 3) -> list[DtmfDigit]:
    """A 160 ms event: updates every 50 ms, then `ends` end packets."""
    got: list[DtmfDigit] = []
    for i, dur in enumerate((400, 800, 1200)):
        r = rx.receive(ts, ev(code, False, dur), t0 + i * 50 * MS)
        assert not isinstance(r, Drop)
        got += r
    for j in range(ends):
        r = rx.receive(ts, ev(code, True, 1280), t0 + (150 + 20 * j) * MS)
        assert not isinstance(r, Drop)
        got += r
    return got


def test_three_end_packets_give_one_digit() -> None:
    rx = DtmfReceiver()
    got = press(rx, 5, ts=16000, t0=0)
    assert got == [DtmfDigit("5", 160, 16000, "end")]
    assert rx.ignored == 2 and rx.next_deadline() is None


def test_same_digit_twice_is_two_events_by_timestamp() -> None:
    rx = DtmfReceiver()
    got = press(rx, 1, 1000, 0) + press(rx, 1, 1000 + 8 * 400, 400 * MS)
    assert [d.digit for d in got] == ["1", "1"]


def test_marker_bit_is_not_needed_and_a_lost_first_packet_loses_nothing() -> None:
    rx = DtmfReceiver()
    # no packet here has the marker (the receiver never sees it anyway); the first update is lost
    got: list[DtmfDigit] = []
    for dur, t in ((800, 50), (1200, 100)):
        r = rx.receive(4000, ev(11, False, dur), t * MS)
        assert not isinstance(r, Drop)
        got += r
    r = rx.receive(4000, ev(11, True, 1280), 150 * MS)
    assert not isinstance(r, Drop)
    got += r
    assert got == [DtmfDigit("#", 160, 4000, "end")]


def test_lost_end_is_ended_by_the_next_event() -> None:
    rx = DtmfReceiver()
    got = press(rx, 2, 8000, 0, ends=0)
    assert got == []
    got = press(rx, 3, 8000 + 2400, 300 * MS)
    assert got == [DtmfDigit("2", 150, 8000, "next"), DtmfDigit("3", 160, 10400, "end")]


def test_lost_end_is_ended_by_timeout() -> None:
    rx = DtmfReceiver(end_timeout_ms=400)
    press(rx, 9, 100, 0, ends=0)
    deadline = rx.next_deadline()
    assert deadline == 100 * MS + 400 * MS  # last update at 100 ms
    assert rx.handle_timer(deadline - 1) is None
    assert rx.handle_timer(deadline) == DtmfDigit("9", 150, 100, "timeout")
    # a straggling end packet of the same event is not a second digit
    assert rx.receive(100, ev(9, True, 1280), deadline + MS) == ()


def test_new_event_ending_at_once_also_reports_the_old_one() -> None:
    rx = DtmfReceiver()
    press(rx, 4, 0, 0, ends=0)
    r = rx.receive(5000, ev(6, True, 800), 500 * MS)  # only the end packets of the next digit came
    assert r == (DtmfDigit("4", 150, 0, "next"), DtmfDigit("6", 100, 5000, "end"))


def test_stale_packets_and_non_digit_events_are_ignored_and_bad_payloads_dropped() -> None:
    rx = DtmfReceiver()
    press(rx, 7, 10000, 0)
    assert rx.receive(9000, ev(1, False, 400), 400 * MS) == ()  # older than the last event
    assert rx.receive(20000, ev(16, False, 400), 500 * MS) == ()  # flash: not a digit
    assert rx.receive(30000, b"\x01\x02\x03", 600 * MS) is Drop.BAD_DTMF
    assert rx.receive(30000, b"", 600 * MS) is Drop.BAD_DTMF


def test_timestamp_wrap_between_events() -> None:
    rx = DtmfReceiver()
    a = press(rx, 1, 2**32 - 800, 0)
    b = press(rx, 2, 1600, 300 * MS)  # after the wrap: newer, not stale
    assert [d.digit for d in a + b] == ["1", "2"]


def run_sender(tx: DtmfSender, ticks: int, ts0: int = 1000) -> list[tuple[int, bool, int, int, bool, int]]:
    """(tick, marker, timestamp, event, end, duration) of every packet over `ticks` 20 ms ticks."""
    out = []
    for n in range(ticks):
        p = tx.poll(n * 20 * MS, ts0 + 160 * n)
        if p is not None:
            code, flags, dur = struct.unpack("!BBH", p.payload)
            assert flags & 0x3F == 10  # volume -10 dBm0
            out.append((n, p.marker, p.timestamp, code, bool(flags & 0x80), dur))
    return out


def test_sender_sequence_is_exact() -> None:
    tx = DtmfSender()
    tx.queue("1#")
    got = run_sender(tx, 30)
    assert got == [
        # digit 1 at tick 0 (0 ms): updates due at 0, 50, 100, 150 ms -> ticks 0, 3, 5, 8
        (0, True, 1000, 1, False, 400),
        (3, False, 1000, 1, False, 800),
        (5, False, 1000, 1, False, 1200),
        (8, False, 1000, 1, True, 1280),
        (9, False, 1000, 1, True, 1280),
        (10, False, 1000, 1, True, 1280),
        # 100 ms pause after the 160 ms tone: the next starts at 260 ms, tick 13, with its own timestamp
        (13, True, 1000 + 13 * 160, 11, False, 400),
        (16, False, 3080, 11, False, 800),
        (18, False, 3080, 11, False, 1200),
        (21, False, 3080, 11, True, 1280),
        (22, False, 3080, 11, True, 1280),
        (23, False, 3080, 11, True, 1280),
    ]
    assert not tx.pending and tx.digits_sent == 2


def test_sender_replaces_audio_only_during_an_event() -> None:
    tx = DtmfSender()
    tx.queue("5")
    flags = []
    for n in range(14):
        flags.append(tx.busy(n * 20 * MS))
        tx.poll(n * 20 * MS, 160 * n)
    # ticks 0..10 belong to the event (updates, the gaps between them, the three end packets)
    assert flags == [True] * 11 + [False] * 3
    assert not tx.in_event


def test_sender_validates_digits_and_takes_lowercase() -> None:
    tx = DtmfSender()
    with pytest.raises(ValueError):
        tx.queue("12x")
    assert not tx.pending  # nothing queued from a refused string
    tx.queue("a")
    assert run_sender(tx, 1)[0][3] == 12
    assert event_code("*") == 10 and event_code("D") == 15
