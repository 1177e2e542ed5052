"""The jitter buffer on virtual time: reordering, duplicates, late packets, loss concealment, wrap-around,
SSRC changes and the 20-200 ms depth bounds."""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable

import pytest

from rtp.g711 import ulaw_decode, ulaw_encode
from rtp.jitter import FrameKind, JitterBuffer, PlayoutFrame
from rtp.packet import Drop
from rtp.plc import SILENCE_FRAME
from rtp.units import NS_PER_MS as MS
from tests.support.media_paths import media_path

__all__ = ["media_path"]  # the fixture, from the shared harness

pytestmark = pytest.mark.usefixtures("media_path")  # on each media path (rtp.speedups)

SSRC = 0x1234


def payload(k: int) -> bytes:
    return bytes([20 + k % 200]) * 160


def sine(k: int, hz: float = 220.0) -> bytes:
    """Frame k of a continuous sine, µ-law."""
    samples = [int(8000 * math.sin(2 * math.pi * hz * (160 * k + n) / 8000)) for n in range(160)]
    return ulaw_encode(struct.pack("<160h", *samples))


def run(
    jb: JitterBuffer,
    arrivals: dict[int, list[int]],
    ticks: int,
    *,
    phase: int = 10 * MS,
    seq0: int = 1000,
    ts0: int = 5000,
    body: Callable[[int], bytes] = payload,
) -> tuple[list[PlayoutFrame | None], list[Drop | None]]:
    """Feed packets k (arrival times in ns, several for duplicates) and pop at phase + n*20 ms."""
    events: list[tuple[int, int, int]] = []  # (time, order, k); ticks sort after packets at equal time
    for k, times in arrivals.items():
        for t in times:
            events.append((t, 0, k))
    for n in range(ticks):
        events.append((phase + n * 20 * MS, 1, n))
    events.sort()
    frames: list[PlayoutFrame | None] = []
    drops: list[Drop | None] = []
    for t, kind, k in events:
        if kind == 0:
            drops.append(jb.push((seq0 + k) & 0xFFFF, (ts0 + 160 * k) & 0xFFFFFFFF, SSRC, body(k), t))
        else:
            frames.append(jb.pop(t))
    return frames, drops


def steady(count: int, offset: int = 3 * MS) -> dict[int, list[int]]:
    return {k: [k * 20 * MS + offset] for k in range(count)}


def test_in_order_packets_play_one_per_tick_at_the_20_ms_floor() -> None:
    jb = JitterBuffer()
    frames, drops = run(jb, steady(10), 10)
    assert all(d is None for d in drops)
    assert [f.pcm for f in frames if f] == [ulaw_decode(payload(k)) for k in range(10)]
    assert all(f is not None and f.kind is FrameKind.AUDIO for f in frames)
    assert [f.seq for f in frames if f] == list(range(1, 11))
    assert [f.arrival_ns for f in frames if f] == [k * 20 * MS + 3 * MS for k in range(10)]
    assert jb.target_ms == 20


def test_nothing_comes_out_before_the_first_packet() -> None:
    jb = JitterBuffer()
    assert jb.pop(0) is None and jb.depth_ms == 0


def test_reordered_packets_within_the_window_play_in_order() -> None:
    jb = JitterBuffer()
    arr = steady(8)
    arr[3], arr[4] = [4 * 20 * MS + 1 * MS], [4 * 20 * MS + 2 * MS]  # 4 overtakes 3, both before 3's tick
    arr[3] = [3 * 20 * MS + 9 * MS]
    arr[4] = [3 * 20 * MS + 4 * MS]
    frames, drops = run(jb, arr, 8)
    assert all(d is None for d in drops)
    assert [f.pcm for f in frames if f] == [ulaw_decode(payload(k)) for k in range(8)]


def test_duplicates_are_dropped_and_counted_whether_buffered_or_played() -> None:
    jb = JitterBuffer()
    arr = steady(6)
    arr[2] = [2 * 20 * MS + 3 * MS, 2 * 20 * MS + 4 * MS]  # copy while buffered
    arr[3] = [3 * 20 * MS + 3 * MS, 5 * 20 * MS + 5 * MS]  # copy after it played
    frames, drops = run(jb, arr, 6)
    assert drops.count(Drop.DUPLICATE) == 2 and jb.duplicates == 2
    assert [f.pcm for f in frames if f] == [ulaw_decode(payload(k)) for k in range(6)]


def same_audio(frame: PlayoutFrame | None, k: int) -> bool:
    """Frame k's audio; the first 10 ms may be cross-faded in after a concealed frame."""
    return (
        frame is not None
        and frame.kind is FrameKind.AUDIO
        and frame.pcm[160:] == ulaw_decode(payload(k))[160:]
    )


def test_underrun_holds_the_cursor_so_a_late_packet_still_plays() -> None:
    jb = JitterBuffer()
    arr = steady(12)
    arr[4] = [4 * 20 * MS + 15 * MS]  # after its tick (4*20+10), and nothing newer is here: underrun
    frames, drops = run(jb, arr, 13)
    assert frames[4] is not None and frames[4].kind is FrameKind.CONCEALED
    assert all(same_audio(frames[k + 1], k) for k in range(4, 12))  # every packet plays, one tick later
    assert Drop.LATE not in drops and jb.underruns == 1 and jb.lost == 0


def test_real_loss_after_an_underrun_does_not_leave_the_delay_raised() -> None:
    jb = JitterBuffer()
    arr = steady(12)
    del arr[4]
    frames, _ = run(jb, arr, 12)
    assert frames[4] is not None and frames[4].kind is FrameKind.CONCEALED  # underrun: held
    assert all(same_audio(frames[k], k) for k in range(5, 12))  # 5 plays on its own tick again
    assert jb.lost == 1 and jb.frames_concealed == 1


def test_packet_arriving_after_its_slot_was_concealed_is_counted_late() -> None:
    jb = JitterBuffer()
    arr = steady(10)
    arr[4] = [6 * 20 * MS + 1 * MS]  # 5 arrives first; at 4's tick 5 is buffered: 4 is concealed
    frames, drops = run(jb, arr, 10)
    assert frames[4] is not None and frames[4].kind is FrameKind.CONCEALED
    assert drops.count(Drop.LATE) == 1 and jb.late == 1
    audio = [f for f in frames[5:] if f is not None and f.kind is FrameKind.AUDIO]
    assert [f.pcm[160:] for f in audio] == [ulaw_decode(payload(k))[160:] for k in range(5, 5 + len(audio))]
    assert len(audio) >= 4  # 5, 6, 7, 8 at least: after the late packet one tick was held to grow the buffer
    assert jb.target_ms > 20


def test_single_loss_is_concealed_from_the_pitch_history_and_the_next_frame_cross_fades() -> None:
    jb = JitterBuffer()
    arr = steady(10)
    del arr[5]
    frames, _ = run(jb, arr, 10, body=sine)
    f5 = frames[5]
    assert f5 is not None and f5.kind is FrameKind.CONCEALED
    samples = struct.unpack("<160h", f5.pcm)
    assert max(abs(s) for s in samples) > 4000  # a continued sine, not silence
    # concealment continues the waveform: compare with the true frame 5 (same 220 Hz phase)
    true5 = struct.unpack("<160h", ulaw_decode(sine(5)))
    err = sum((a - b) ** 2 for a, b in zip(samples[:40], true5[:40], strict=True)) / 40
    assert err < 2000**2
    f6 = frames[6]
    assert f6 is not None and f6.kind is FrameKind.AUDIO and f6.pcm != ulaw_decode(sine(6))  # cross-faded
    assert f6.pcm[200:] == ulaw_decode(sine(6))[200:]  # only the first few ms are touched
    assert jb.frames_concealed == 1


def test_consecutive_losses_attenuate_to_silence_after_60_ms() -> None:
    jb = JitterBuffer()
    arr = {k: [k * 20 * MS + 3 * MS] for k in list(range(5)) + list(range(10, 14))}
    frames, _ = run(jb, arr, 14, body=sine)
    peaks = []
    for f in frames[5:10]:
        assert f is not None
        peaks.append(max(abs(s) for s in struct.unpack("<160h", f.pcm)))
    # 5 lost frames; first 10 ms at full level, then -20 % per 10 ms: silent from 60 ms
    assert peaks[0] > 7000 and peaks[1] < peaks[0] and peaks[2] < peaks[1]
    assert peaks[1] <= 0.81 * 8200 and peaks[2] <= 0.41 * 8200  # level 0.8 at 20 ms, 0.4 at 40 ms
    assert peaks[3] == 0 and peaks[4] == 0
    assert frames[8] is not None and frames[8].kind is FrameKind.SILENCE and frames[8].pcm == SILENCE_FRAME


def test_sequence_and_timestamp_wrap_around() -> None:
    jb = JitterBuffer()
    frames, drops = run(jb, steady(30), 30, seq0=65520, ts0=2**32 - 160 * 10)
    assert all(d is None for d in drops)
    assert [f.pcm for f in frames if f] == [ulaw_decode(payload(k)) for k in range(30)]
    assert jb.frames_concealed == 0 and jb.resyncs == 0


def test_ssrc_change_resets_and_the_new_source_plays_at_once() -> None:
    jb = JitterBuffer()
    for k in range(5):
        jb.push(100 + k, 1000 + 160 * k, SSRC, payload(k), k * 20 * MS)
        assert jb.pop(k * 20 * MS + 10 * MS) is not None
    # new SSRC, unrelated seq/timestamp: no resync storm, no late drops
    for k in range(5, 10):
        assert jb.push(7 + k, 999_999 + 160 * k, 0xABCD, payload(k), k * 20 * MS) is None
        f = jb.pop(k * 20 * MS + 10 * MS)
        assert f is not None and f.kind is FrameKind.AUDIO and f.pcm == ulaw_decode(payload(k))
    assert jb.resets == 1 and jb.late == 0


def test_timestamp_jump_resyncs_instead_of_waiting_or_dropping() -> None:
    jb = JitterBuffer()
    for k in range(5):
        jb.push(k, 160 * k, SSRC, payload(k), k * 20 * MS)
        jb.pop(k * 20 * MS + 10 * MS)
    jb.push(5, 160 * 5 + 8000 * 30, SSRC, payload(5), 100 * MS)  # +30 s of timestamp
    f = jb.pop(110 * MS)
    assert f is not None and f.pcm == ulaw_decode(payload(5)) and jb.resyncs == 1


def test_silence_suppression_gap_plays_silence_not_concealment() -> None:
    jb = JitterBuffer()
    arr = steady(5)
    # talkspurt 2 starts 4 slots later with the next sequence number (no loss): seq continues, ts jumps
    for k in range(5):
        jb.push(k, 160 * k, SSRC, payload(k), arr[k][0])
        jb.pop(k * 20 * MS + 10 * MS)
    jb.push(5, 160 * 9, SSRC, payload(9), 9 * 20 * MS + 3 * MS)
    jb.push(6, 160 * 10, SSRC, payload(10), 10 * 20 * MS + 3 * MS)
    out = [jb.pop(k * 20 * MS + 10 * MS) for k in range(5, 11)]
    assert out[-1] is not None and out[-1].pcm == ulaw_decode(payload(10))
    assert jb.frames_concealed <= 1  # underrun before the new packets came
    assert jb.late == 0


def pop_depths(
    jb: JitterBuffer, arrivals: dict[int, list[int]], ticks: int, first_tick: int = 0
) -> tuple[list[int], list[int]]:
    """Like run(), recording the depth after every pop and each audio frame's delay (pop minus arrival)."""
    events = sorted(
        [(t, 0, k) for k, ts in arrivals.items() for t in ts]
        + [(10 * MS + n * 20 * MS, 1, n) for n in range(first_tick, first_tick + ticks)]
    )
    depths, delays = [], []
    for t, kind, k in events:
        if kind == 0:
            jb.push(k & 0xFFFF, 160 * k, SSRC, payload(k), t)
        else:
            f = jb.pop(t)
            depths.append(jb.depth_ms)
            if f is not None and f.kind is FrameKind.AUDIO:
                delays.append((t - f.arrival_ns) // MS)
    return depths, delays


def test_depth_grows_with_the_jitter_it_observes() -> None:
    jb = JitterBuffer()
    # 8 packets delivered together every 160 ms: 140 ms of transit spread
    burst = {k: [(k // 8 + 1) * 160 * MS] for k in range(600)}
    depths, _ = pop_depths(jb, {k: v for k, v in burst.items() if k < 200}, 200)
    assert jb.target_ms == 160  # one frame plus the 140 ms spread, rounded
    assert max(depths) <= 200
    late, concealed = jb.late, jb.frames_concealed
    # once adapted, the bursts play out without gaps
    depths, delays = pop_depths(jb, {k: v for k, v in burst.items() if k >= 200}, 390, first_tick=200)
    assert jb.late == late and jb.frames_concealed == concealed
    assert len(delays) == 390 and max(delays) <= 200


def test_depth_never_exceeds_the_200_ms_ceiling() -> None:
    jb = JitterBuffer()
    arr = {k: [(k // 14 + 1) * 280 * MS] for k in range(420)}  # 260 ms of spread
    depths, _ = pop_depths(jb, arr, 420)
    assert jb.target_ms == 200
    assert max(depths) <= 200
    assert jb.overflows > 0  # what does not fit under the ceiling is discarded


def test_depth_grows_under_jitter_then_returns_to_the_floor_when_it_ends() -> None:
    jb = JitterBuffer()
    arr = {}
    for k in range(350):  # 2 s of +-30 ms jitter, then 5 s clean
        jit = (k * 37 % 7 - 3) * 10 * MS if k < 100 else 0
        arr[k] = [k * 20 * MS + 40 * MS + jit]
    depths, delays = pop_depths(jb, arr, 345)
    assert max(delays[:100]) >= 40  # it held frames back to ride out the jitter
    assert jb.late == 0
    assert jb.target_ms == 20
    assert max(delays[-100:]) <= 20  # back to under one frame of added delay on a clean network
    assert min(depths) >= 0


def test_depth_bounds_are_validated() -> None:
    with pytest.raises(ValueError):
        JitterBuffer(min_ms=10)
    with pytest.raises(ValueError):
        JitterBuffer(max_ms=400)


def test_table_decoders_are_bit_exact_with_rtp_g711() -> None:
    from rtp.g711 import alaw_decode
    from rtp.jitter import fast_alaw_decode, fast_ulaw_decode

    every = bytes(range(256))
    assert fast_ulaw_decode(every) == ulaw_decode(every)
    assert fast_alaw_decode(every) == alaw_decode(every)
    assert fast_ulaw_decode(every[::-1] * 3) == ulaw_decode(every[::-1] * 3)


def test_silence_suppression_gap_does_not_add_delay() -> None:
    jb = JitterBuffer()
    frames, _ = run(jb, steady(5), 5)
    # the sender stops for 200 ms (10 slots) and resumes with the next sequence number
    for k in range(5, 15):
        assert jb.pop(k * 20 * MS + 10 * MS) is not None  # concealment fading to silence meanwhile
    for k in range(15, 20):
        jb.push(1000 + k - 10, 5000 + 160 * k, SSRC, payload(k), k * 20 * MS + 3 * MS)
        f = jb.pop(k * 20 * MS + 10 * MS)
        assert (
            f is not None and f.kind is FrameKind.AUDIO and f.arrival_ns == k * 20 * MS + 3 * MS
        )  # 7 ms later
    assert jb.lost == 0 and jb.late == 0


def test_shrinking_drops_quiet_frames_rather_than_speech() -> None:
    jb = JitterBuffer()
    # loud (first half), and every frame's second half different
    loud = [b"\x20" * 80 + bytes([0x10 + k % 100]) * 40 + bytes([0x90 + k // 100]) * 40 for k in range(400)]
    quiet = b"\xff" * 160

    def body(k: int) -> bytes:
        return quiet if k % 10 == 7 else loud[k]

    # the first 4 packets arrive together (a 60 ms head start), then steady: the delay is 3 frames too many
    arr = {k: [max(k, 3) * 20 * MS + 3 * MS] for k in range(400)}
    frames, _ = run(jb, arr, 400, body=body)
    assert jb.frames_dropped_shrink >= 2
    played = [f.pcm for f in frames if f is not None and f.kind is FrameKind.AUDIO]
    decoded_quiet = ulaw_decode(quiet)
    tails = {p[160:] for p in played}
    assert len({ulaw_decode(x)[160:] for x in loud}) == 400
    dropped_loud = sum(1 for k in range(390) if k % 10 != 7 and ulaw_decode(loud[k])[160:] not in tails)
    assert dropped_loud == 0
    assert played.count(decoded_quiet) < sum(1 for k in range(400) if k % 10 == 7)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lossy_jittery_network_invariants(seed: int) -> None:
    """2 % loss, 1 % duplicates, exponential jitter (mean 8 ms, so some reordering): every pop gives a frame,
    audio comes out in order and at most ~200 ms late, and every packet is accounted for."""
    rng = random.Random(seed)
    arr: dict[int, list[int]] = {}
    for k in range(1500):
        if rng.random() < 0.02:
            continue
        t = k * 20 * MS + int(rng.expovariate(1 / 8) * MS)
        arr[k] = [t] if rng.random() > 0.01 else [t, t + int(rng.uniform(0, 80) * MS)]
    jb = JitterBuffer()
    frames, drops = run(jb, arr, 1500)
    first = next(i for i, f in enumerate(frames) if f is not None)
    assert all(f is not None for f in frames[first:])
    ids = {ulaw_decode(payload(k))[160:]: k % 200 for k in range(200)}
    order = [ids[f.pcm[160:]] for f in frames if f is not None and f.kind is FrameKind.AUDIO]
    steps = [(b - a) % 200 for a, b in zip(order, order[1:], strict=False)]
    assert all(0 < s < 20 for s in steps)  # always forward, never a reordered or repeated frame
    delays = [
        (10 * MS + i * 20 * MS) - f.arrival_ns
        for i, f in enumerate(frames)
        if f and f.kind is FrameKind.AUDIO
    ]
    assert max(delays) <= 220 * MS and min(delays) >= 0
    buffered = sum(1 for p in jb._payload if p is not None)
    unique = len(arr)
    accounted = jb.frames_played + jb.late + jb.overflows + buffered
    assert accounted <= unique <= accounted + jb.frames_dropped_shrink
    assert drops.count(Drop.DUPLICATE) == jb.duplicates == sum(len(v) - 1 for v in arr.values())
    assert 20 <= jb.target_ms <= 200


def late_clock(
    jb: JitterBuffer, *, deliver_backlog: bool, stall_slots: int = 9
) -> tuple[int, int, list[int]]:
    """Packets arrive every 20 ms for 12 s; the process stalls for `stall_slots` slots from slot 100, as a
    full collection does: nothing runs, the packets wait in the socket, and when it wakes the media clock
    serves its newest 2 slots (rtp.pacer's catch-up) and skips the rest *before* the loop reads the packets
    (timers run before I/O). Returns (packets pushed, audio frames played, depth after each later tick)."""
    stall_end = 100 + stall_slots  # the first slot the clock serves again, late
    wake = 10 * MS + stall_end * 20 * MS + 1 * MS
    pushed = played = 0
    depths: list[int] = []

    def serve(t: int, due: int, skipped: int = 0) -> None:
        nonlocal played
        if deliver_backlog:
            jb.skip(skipped, t)
        for _ in range(due):
            f = jb.pop(t)
            played += f is not None and f.kind is FrameKind.AUDIO
        if deliver_backlog and (f := jb.pop_backlog(t)) is not None:
            played += f.kind is FrameKind.AUDIO

    for n in range(600):
        arrival = n * 20 * MS + 3 * MS
        if 100 <= n < stall_end:  # the packets of the stall are read after the late tick
            continue
        if n == stall_end:
            serve(
                wake, 2, stall_slots - 1
            )  # slots 100 .. stall_end - 2 skipped; stall_end - 1 and stall_end served
            for k in range(100, stall_end + 1):
                jb.push(k, 160 * k, SSRC, payload(k), wake + MS)
                pushed += 1
        else:
            jb.push(n, 160 * n, SSRC, payload(n), arrival)
            pushed += 1
            serve(10 * MS + n * 20 * MS, 1)
        if n > stall_end:
            depths.append(jb.depth_ms)
    return pushed, played, depths


def test_a_backlog_a_late_clock_left_is_delivered_not_dropped() -> None:
    """The frames of the 8 slots a late clock skipped all reach the session, one extra a tick (a frame
    early is harmless for a provider's socket), and the delay is back at the floor 8 ticks later. What is lost
    is at most the two slots caught up at the wake-up: their packets were not read yet, so they were concealed
    and held the cursor (as before), and those two frames of delay are taken back by the shrink or the ceiling."""
    jb = JitterBuffer()
    pushed, played, depths = late_clock(jb, deliver_backlog=True)
    buffered = sum(1 for p in jb._payload if p is not None)
    assert jb.frames_backlog == 8
    assert pushed - played - buffered == jb.frames_dropped_shrink + jb.overflows <= jb.frames_concealed == 2
    assert depths[8] == 20 and max(depths[8:]) <= 40

    old = JitterBuffer()  # without it the backlog is taken out of the caller's words later
    pushed, played, _ = late_clock(old, deliver_backlog=False)
    assert pushed - played - sum(1 for p in old._payload if p is not None) >= 8


def test_every_slot_gives_the_session_a_frame_served_or_skipped() -> None:
    """Skipped slots whose packets never come (the caller's side lost them) are still owed a frame each, the
    concealment their own pop would have given; none in the late tick itself; at most the 200 ms ceiling's;
    nothing before the stream's first packet."""
    jb = JitterBuffer()
    jb.skip(5, 0)
    assert jb.pop_backlog(MS) is None  # not started: nothing owed
    run(jb, steady(20), 20)
    late = 10 * MS + 25 * 20 * MS
    assert jb.pop(late) is not None  # the late tick serves its slot, and skips 4
    jb.skip(4, late)
    assert jb.pop_backlog(late) is None  # not in the late tick: the stall's packets are not read yet
    frames = []
    for n in range(1, 10):  # the sender went quiet: every later tick's pop and owed pop still give a frame
        t = late + n * 20 * MS
        frames += [jb.pop(t), jb.pop_backlog(t)]
    assert sum(f is not None for f in frames) == 9 + 4 and jb.frames_backlog == 4
    jb.skip(1_000, late + 10 * 20 * MS)
    assert jb.owed == 10
