"""The process-wide media clock shell: ONE timer for every call, on absolute deadlines t0 + n·20 ms.

DESIGN §3.2: the bridge is the media clock. A timer per call would cost a heap entry and a wake-up per call
per frame (the prototype measured +14 points of a core at 300 calls); one timer walking every active channel
costs one wake-up per 20 ms. The pacing decisions (which slots are due, how many are caught up after a stall,
how many are skipped) are the core's, `rtp.pacer.MediaClock`; this shell only arms `loop.call_at` at the
core's `next_deadline()` and hands each tick to every channel:

    channel.on_slots(now, due, skipped)   # skip `skipped` slots (RTP timestamps advance), then serve `due`

A channel serves a slot by taking the next frame from its Playout, sending it with `sendto`, recording it in
the carrier ledger once `sendto` has returned, and pulling one inbound frame from its jitter buffer
(`sip.native.leg`). A channel that raises is logged and removed; the others go on.

Inbound RTP is read here too, in the tick, not by a loop reader per socket (one poll a phase instead of a loop
wake-up a packet): a channel that has an RTP socket (`ReadingChannel`) is registered in its phase's
`select.epoll`, and just before a phase's slots are served one `poll(0)` finds whose datagrams are waiting,
each of those channels reads one (`read_rtp`, stamped with the time the kernel received it, so arrival times
do not depend on when they are read), and the poll is repeated until nothing is waiting (at most `READ_ROUNDS`
datagrams a channel a tick). A loop reader woke the loop and ran a callback for every packet, 50 a second per
call, on cold caches; here a phase's packets cost two system calls besides their reads, and the stream's state
is warm for the slot that follows.

Outbound RTP leaves in one call a phase too: a channel that takes the clock's `SendBatch` (`BatchingChannel`,
rtp.endpoint) queues its slot's datagram there instead of sending it, and once every channel of the phase was
served the batch sends them all (rtp.speedups `send_batch`) and settles each call's carrier ledger. A channel
driven directly (not by this clock) sends its own.

The clock starts with its first channel and stops with the last, so an idle process has no timer at all.

Phases (inbound latency): with `phases=G` the period is cut into G evenly spaced phases, phase k's
slot n due at t0 + k·period/G + n·period, and each channel joins the phase that has the fewest channels. A
frame's way from the jitter buffer to the provider's socket takes a few loop iterations (the session's
queues), and in each of them every channel served at the same instant does its share first: with one phase
the last of 300 calls waits for the other 299 at every step (measured: 6.7 ms median, 10.5 ms p99 at 100
calls). G phases cut that queue G-fold. Each channel is still served once per period on absolute deadlines
(its own phase's), so its RTP interval is unchanged; the cost is up to G wake-ups per period instead of one,
and still ONE loop timer at any time (armed at the soonest phase), never a timer per call.

Late ticks get a cause, so that a late packet can be traced to what held the clock. A tick later than
`late_threshold_ns` (5 ms) is split into what held it, and counted under the cause that held it longest
(`late_ticks_<cause>` in `stats()`):

- `own`: the clock's previous run was still serving channels at this tick's deadline (its wall time, less what
  a collection and the kernel took of it, scaled to the part past the deadline);
- `gc`: a collection of the cyclic garbage collector overlapped the wait (`gc.callbacks` stamp every
  collection's start and stop on the clock; its generation is counted too);
- `unscheduled`: the process consumed less CPU time over the wait than wall time passed, beyond what the loop
  may have idled before the timer was due: the kernel did not run us (host saturation). A lower bound: time
  the loop idled before the deadline cannot be told from time it was preempted then;
- `loop`: the rest, less the timer's slack: something else held the loop (another callback, or a thread of
  ours holding the GIL: its CPU time is the process's).

The cost stays per tick, never per channel: one CPU-time read (`time.process_time_ns`, a system call of
about 0.5 µs) and one clock read per run, a second CPU-time read only after a run of 1 ms or more, and a
Python call (a clock and a CPU-time read) on each collection's start and stop. An on-time tick allocates nothing of its own; the split is
worked out only for a late one, and at most one summary line a minute is logged.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import select
import sys
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from rtp.audio import FRAME_MS
from rtp.endpoint import SendBatch
from rtp.pacer import MediaClock

log = logging.getLogger("parlora.rtp.clock")

FRAME_NS = FRAME_MS * 1_000_000
TIMER_SLACK_NS = 1_000_000  # the loop timer is armed this long after a deadline (uvloop: whole ms; see _arm)
MEDIA_PHASES = 10  # what the native engine runs: phases 2 ms apart (tests/bench/README.md)
Clock = Callable[[], int]
RtpReader = Callable[[int, int], bool]
"""Reads one waiting datagram at `now` (the second: the wall clock's ns then, for the kernel's receive time);
False when none was waiting."""
# How late a tick came after its deadline, counted per tick (every channel of the phase is served by it):
# upper bounds in µs, the last bucket open. `stats()` gives `lateness_bucket_<µs>` (ticks late by more than
# the bound before and at most this one; not cumulative) and `lateness_bucket_inf`.
LATENESS_BOUNDS_US = (200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 40_000)
_LATENESS_BOUNDS_NS = tuple(us * 1_000 for us in LATENESS_BOUNDS_US)
# Late-tick causes, in the order of the shell's per-cause lists; `stats()` names them.
LATE_CAUSES = ("own", "gc", "loop", "unscheduled")
_OWN, _GC, _LOOP, _UNSCHEDULED = range(4)
LATE_THRESHOLD_NS = 5_000_000  # a phase tick later than this is late and gets a cause
SEVERE_THRESHOLD_NS = 20_000_000  # ... and later than this (a whole period) is counted apart as well
CPU_SPLIT_MIN_NS = 1_000_000  # a run at least this long reads the CPU clock at its end too (else: all on CPU)
SUMMARY_EVERY_NS = 60_000_000_000  # at most one summary line of the late ticks a minute
_NEVER = 1 << 62  # a mark past every deadline
READ_ROUNDS = 32  # datagrams a channel reads at most per tick (1,600 a second: a flood waits in the kernel)


class GcWatch:
    """Stamps the cyclic collector's collections (a `gc.callbacks` entry) on the shell's clock: their wall
    time in total and per generation, the longest per generation and the CPU time of that one (a collection
    the kernel preempted is long on the wall, short on the CPU), the highest generation since `gen_max` was
    reset, how long collections ran past `mark` (the clock's next deadline) since `after_mark_ns` was reset,
    and the heap's size at the latest full collection (`sys.getallocatedblocks()`: pymalloc's blocks in use,
    about one per object; read at a generation-2 collection's end only)."""

    __slots__ = (
        "_clock",
        "_cpu",
        "_started",
        "_started_cpu",
        "mark",
        "total_ns",
        "after_mark_ns",
        "gen_max",
        "count",
        "ns",
        "max_ns",
        "max_cpu_ns",
        "heap_blocks",
    )

    def __init__(self, clock: Clock, cpu_clock: Clock = time.process_time_ns) -> None:
        self._clock = clock
        self._cpu = cpu_clock
        self._started = self._started_cpu = 0
        self.mark = _NEVER
        self.total_ns = 0
        self.after_mark_ns = 0
        self.gen_max = -1
        self.count = [0, 0, 0]
        self.ns = [0, 0, 0]
        self.max_ns = [0, 0, 0]
        self.max_cpu_ns = [0, 0, 0]  # the CPU time of the longest (on the wall) collection per generation
        self.heap_blocks = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = self._clock()
        if phase == "start":
            self._started = now
            self._started_cpu = self._cpu()
            return
        start = self._started
        gen = info.get("generation", 0)
        gen = gen if 0 <= gen <= 2 else 2
        took = now - start
        self.total_ns += took
        self.count[gen] += 1
        self.ns[gen] += took
        if took > self.max_ns[gen]:
            self.max_ns[gen] = took
            self.max_cpu_ns[gen] = self._cpu() - self._started_cpu
        if gen > self.gen_max:
            self.gen_max = gen
        if gen == 2:
            self.heap_blocks = sys.getallocatedblocks()
        mark = self.mark
        if now > mark:
            self.after_mark_ns += now - (start if start > mark else mark)


class MediaChannel(Protocol):
    def on_slots(self, now: int, due: int, skipped: int) -> None:
        """Skip `skipped` slots, then serve `due` slots (normally 0 and 1) at `now`."""
        ...


@runtime_checkable
class ReadingChannel(MediaChannel, Protocol):
    """A channel whose inbound RTP the clock reads in its tick (a socket it polls, instead of a loop reader)."""

    def rtp_reader(self) -> tuple[int, RtpReader]:
        """The RTP socket's descriptor (registered with the clock while the channel is on it) and what reads one
        of its datagrams."""
        ...


@runtime_checkable
class BatchingChannel(MediaChannel, Protocol):
    """A channel that sends its slots' RTP through the clock's `SendBatch` while it is on the clock."""

    def join_batch(self, batch: SendBatch | None) -> None:
        """Queue the last due slot's datagram on `batch` from now on (None: send it at once, as before)."""
        ...


class MediaClockShell:
    """One `loop.call_at` timer for all channels, driven by one `rtp.pacer.MediaClock` core per phase."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        clock: Clock,
        *,
        period_ns: int = FRAME_NS,
        max_catch_up: int = 2,
        phases: int = 1,
        timer_slack_ns: int = TIMER_SLACK_NS,
        cpu_clock: Clock = time.process_time_ns,
        late_threshold_ns: int = LATE_THRESHOLD_NS,
        severe_threshold_ns: int = SEVERE_THRESHOLD_NS,
        watch_gc: bool = True,
        wall_clock: Clock = time.time_ns,
    ) -> None:
        if phases < 1 or period_ns // phases < 1:
            raise ValueError("phases must be at least 1 and at most period_ns")
        self._loop = loop
        self._clock = clock
        self.period_ns = period_ns
        self.max_catch_up = max_catch_up
        self.phases = phases
        self.timer_slack_ns = timer_slack_ns
        self.early_wakeups = 0  # the timer fired before any phase was due (re-armed, never served early)
        self._groups: list[dict[int, MediaChannel]] = [{} for _ in range(phases)]
        self._phase_of: dict[int, int] = {}  # id(channel) -> its phase
        self._cores: list[MediaClock | None] = [None] * phases  # None: the phase has no channel
        self._wall = wall_clock
        self._polls: list[select.epoll | None] = [None] * phases  # each phase's RTP sockets (ReadingChannel)
        self._readers: dict[int, tuple[int, RtpReader]] = {}  # by descriptor: (id(channel), its reader)
        self._reading: dict[int, int] = {}  # id(channel) -> the descriptor it was registered with
        self.rtp_reads = 0  # datagrams read in ticks (`read_rtp` returned True)
        self.sends = SendBatch(clock)  # the phase's outbound RTP, flushed after its channels were served
        self._t0: int | None = None  # phase k's slots at t0 + k * period / phases + n * period
        self._handle: asyncio.TimerHandle | None = None
        self._handle_at: int | None = None
        self.channel_errors = 0
        self.wakeups = 0
        # figures of phase cores that stopped (a phase whose last channel left), kept for stats()
        self._gone = [0, 0, 0, 0]  # slots served, slots skipped, late ticks, max lateness ns
        self._lateness = [0] * (len(LATENESS_BOUNDS_US) + 1)  # ticks per lateness bucket
        self._next_due: int | None = None  # the soonest phase deadline (kept by add, run_due and _retire)
        self._changes = 0  # phases started or retired (run_due re-reads the soonest deadline after one)
        # late-tick attribution (the module's docstring)
        self._cpu = cpu_clock
        self.late_threshold_ns = late_threshold_ns
        self.severe_threshold_ns = severe_threshold_ns
        self.gc_watch = GcWatch(clock, cpu_clock)
        self._watch_gc = watch_gc  # False: tests feed `gc_watch` themselves
        self._run_start = self._run_end = 0  # the latest run_due's wall clock at its start and end ...
        self._run_cpu0 = self._run_cpu1 = 0  # ... the CPU clock then (cpu1 estimated after a short run) ...
        self._run_gc_ns = 0  # ... the collectors' time within it, the channels it served, its first phase
        self._run_channels = 0
        self._run_phase = -1
        self._late = [0, 0, 0, 0]  # phase ticks late by more than late_threshold_ns, per cause (LATE_CAUSES)
        self._severe = [0, 0, 0, 0]  # ... of them, later than severe_threshold_ns
        self._late_max_ns = [0, 0, 0, 0]  # the worst lateness per cause
        self._late_spent_ns = [0, 0, 0, 0]  # the late time each cause explains, over every late run
        self._late_gc_gen = [0, 0, 0]  # gc-caused late ticks by the highest generation collected then
        self._own_worst = [0, 0, -1]  # the worst own-caused tick's previous run: wall ns, channels, phase
        self._summary_at = -SUMMARY_EVERY_NS  # when the latest summary line was logged

    @property
    def running(self) -> bool:
        return self._t0 is not None

    @property
    def channels(self) -> int:
        return len(self._phase_of)

    @property
    def core(self) -> MediaClock | None:
        """The core of the first phase that has channels (with one phase: the core)."""
        return next((c for c in self._cores if c is not None), None)

    def phase_of(self, channel: MediaChannel) -> int | None:
        return self._phase_of.get(id(channel))

    def phase_sizes(self) -> list[int]:
        return [len(g) for g in self._groups]

    def next_deadline(self) -> int | None:
        due = [c.next_deadline() for c in self._cores if c is not None]
        return min(due) if due else None

    def add(self, channel: MediaChannel) -> None:
        """Serve `channel` from its phase's next slot on, in the phase with the fewest channels (the clock
        starts with its first channel; a phase's first slot is at most one period away)."""
        key = id(channel)
        if key in self._phase_of:
            return
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
            self._run_start = self._run_end = now  # the first tick's wait is measured from here
            self._run_cpu0 = self._run_cpu1 = self._cpu()
            self._run_gc_ns = 0
            self.gc_watch.mark = _NEVER
            if self._watch_gc and self.gc_watch not in gc.callbacks:
                gc.callbacks.append(self.gc_watch)
        sizes = [len(g) for g in self._groups]
        phase = sizes.index(min(sizes))
        self._groups[phase][key] = channel
        self._phase_of[key] = phase
        if isinstance(channel, ReadingChannel):
            self._register(phase, channel)
        if isinstance(channel, BatchingChannel):
            channel.join_batch(self.sends)
        if self._cores[phase] is None:
            anchor = self._t0 + phase * (self.period_ns // self.phases)
            anchor += (
                (now - anchor) // self.period_ns
            ) * self.period_ns  # the phase's last slot at or before now
            core = MediaClock(anchor, period_ns=self.period_ns, max_catch_up=self.max_catch_up)
            core.tick(now)  # that slot is now or past: the first frame goes out at the next one
            self._cores[phase] = core
            self._changes += 1
            due = core.next_deadline()
            if self._next_due is None or due < self._next_due:
                self._next_due = self.gc_watch.mark = due
        self._arm()

    def remove(self, channel: MediaChannel) -> None:
        """Serve `channel` no more (before its socket closes: its descriptor is unregistered here)."""
        phase = self._phase_of.pop(id(channel), None)
        if phase is None:
            return
        if isinstance(channel, BatchingChannel):
            channel.join_batch(None)
        self._unregister(phase, id(channel))
        group = self._groups[phase]
        group.pop(id(channel), None)
        if not group:
            self._retire(phase)
        if not self._phase_of:
            self.stop()

    def _register(self, phase: int, channel: ReadingChannel) -> None:
        fd, reader = channel.rtp_reader()
        poll = self._polls[phase]
        if poll is None:
            poll = self._polls[phase] = select.epoll()
        try:
            poll.register(fd, select.EPOLLIN)
        except FileExistsError:  # (a descriptor number reused: the closed socket left the set by itself)
            poll.modify(fd, select.EPOLLIN)
        self._readers[fd] = (id(channel), reader)
        self._reading[id(channel)] = fd

    def _unregister(self, phase: int, key: int) -> None:
        fd = self._reading.pop(key, None)
        if fd is None:
            return
        if (entry := self._readers.get(fd)) is not None and entry[0] == key:
            del self._readers[fd]
        poll = self._polls[phase]
        if poll is not None:
            try:
                poll.unregister(fd)
            except (OSError, ValueError):  # closed already: the kernel took it out of the set
                pass

    def _read(self, poll: select.epoll, now: int) -> None:
        """Every datagram waiting for the phase's channels, one a channel a round (the module's docstring)."""
        readers, wall, reads = self._readers, self._wall(), 0
        for _ in range(READ_ROUNDS):
            ready = poll.poll(0)
            if not ready:
                break
            for fd, _events in ready:
                entry = readers.get(fd)
                if entry is not None and entry[1](now, wall):
                    reads += 1
        self.rtp_reads += reads

    def _retire(self, phase: int) -> None:
        poll = self._polls[phase]
        if poll is not None:
            poll.close()  # (its channels are gone: a phase with none keeps no descriptor)
            self._polls[phase] = None
        core = self._cores[phase]
        if core is not None:
            gone = self._gone
            gone[0] += core.slots_served
            gone[1] += core.slots_skipped
            gone[2] += core.late_ticks
            gone[3] = max(gone[3], core.max_lateness_ns)
        self._cores[phase] = None
        self._changes += 1
        self._next_due = self.next_deadline()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._handle_at = None
        for phase in range(self.phases):
            self._retire(phase)
        for group in self._groups:
            for channel in group.values():
                if isinstance(channel, BatchingChannel):
                    channel.join_batch(None)
            group.clear()
        self._phase_of.clear()
        self._readers.clear()
        self._reading.clear()
        self._t0 = None
        self._next_due = None
        if self.gc_watch in gc.callbacks:
            gc.callbacks.remove(self.gc_watch)

    def stats(self) -> dict[str, int]:
        cores = [c for c in self._cores if c is not None]
        gone = self._gone
        return {
            "channels": len(self._phase_of),
            "phases": self.phases,
            "phases_active": len(cores),
            "timers": 1 if self._handle is not None else 0,
            "wakeups": self.wakeups,
            "early_wakeups": self.early_wakeups,
            "slots_served": gone[0] + sum(c.slots_served for c in cores),
            "slots_skipped": gone[1] + sum(c.slots_skipped for c in cores),
            "late_ticks": gone[2] + sum(c.late_ticks for c in cores),
            "max_lateness_us": max([gone[3], *(c.max_lateness_ns for c in cores)]) // 1000,
            "channel_errors": self.channel_errors,
            "rtp_reads": self.rtp_reads,
            **{f"lateness_bucket_{us}": n for us, n in zip(LATENESS_BOUNDS_US, self._lateness, strict=False)},
            "lateness_bucket_inf": self._lateness[-1],
            **self.late_stats(),
        }

    def late_stats(self) -> dict[str, int]:
        """The late ticks' causes: `late_ticks_<cause>` (phase ticks later than the threshold),
        `late_ticks_20ms_<cause>` (of them, later than the severe threshold), `late_max_us_<cause>`,
        `late_spent_ms_<cause>` (the late time each cause explains, summed over every late run, whichever
        cause won), `late_ticks_gc_gen<N>` (gc-caused ticks by the highest generation collected), the
        own-caused worst tick's previous run (`late_own_worst_run_us`; `_channels`, every channel it served:
        a catch-up run after a stall serves every phase at once; `_phase`, the first it served) and the
        collections the clock saw (`gc_collections_gen<N>`, `gc_ms_gen<N>`, `gc_max_us_gen<N>` and that one's
        CPU time `gc_max_cpu_us_gen<N>`, `gc_heap_blocks_at_gen2`: the heap at the latest full collection)."""
        out = {"late_threshold_us": self.late_threshold_ns // 1000}
        for i, cause in enumerate(LATE_CAUSES):
            out[f"late_ticks_{cause}"] = self._late[i]
            out[f"late_ticks_20ms_{cause}"] = self._severe[i]
            out[f"late_max_us_{cause}"] = self._late_max_ns[i] // 1000
            out[f"late_spent_ms_{cause}"] = self._late_spent_ns[i] // 1_000_000
        watch = self.gc_watch
        for gen in range(3):
            out[f"late_ticks_gc_gen{gen}"] = self._late_gc_gen[gen]
            out[f"gc_collections_gen{gen}"] = watch.count[gen]
            out[f"gc_ms_gen{gen}"] = watch.ns[gen] // 1_000_000
            out[f"gc_max_us_gen{gen}"] = watch.max_ns[gen] // 1000
            out[f"gc_max_cpu_us_gen{gen}"] = watch.max_cpu_ns[gen] // 1000
        out["gc_heap_blocks_at_gen2"] = watch.heap_blocks
        out["late_own_worst_run_us"] = self._own_worst[0] // 1000
        out["late_own_worst_channels"] = self._own_worst[1]
        out["late_own_worst_phase"] = self._own_worst[2]
        return out

    def _arm(self) -> None:
        """Keep the one loop timer at the soonest phase deadline."""
        due = self._next_due
        if due is None:
            return
        if self._handle is not None:
            if self._handle_at is not None and self._handle_at <= due:
                return
            self._handle.cancel()
        # uvloop's timers count whole milliseconds: armed for the deadline itself, the timer fires up to ~1 ms
        # early, and every re-arm for the sub-millisecond rest fires at once again (measured: 22 wake-ups per
        # slot, 9,600 a second with 10 phases). The slack puts the wake-up just after the deadline instead.
        delay = (max(0, due - self._clock()) + self.timer_slack_ns) / 1e9
        self._handle_at = due
        self._handle = self._loop.call_at(self._loop.time() + delay, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._handle_at = None
        self.wakeups += 1
        if self.run_due(self._clock()) == 0:
            self.early_wakeups += 1
        if self._phase_of:
            self._arm()

    def run_due(self, now: int) -> int:
        """Serve every phase that is due at `now`; returns the slots served (summed over the phases). The timer
        calls this; tests call it on virtual time."""
        cpu = self._cpu()
        watch = self.gc_watch
        gc_total = watch.total_ns
        gc_waited = watch.after_mark_ns  # collections past this tick's deadline, before this run
        gc_gen = watch.gen_max  # the highest generation collected since the previous run began
        watch.gen_max = -1
        changes = self._changes
        served = late = severe = worst = channels = 0
        first_phase = -1
        soonest: int | None = None
        for phase, core in enumerate(self._cores):
            if core is None:
                continue
            tick = core.tick(now)
            if tick.due == 0:  # not due yet (or woke early against the injected clock: the loop's is coarser)
                due = core.next_deadline()
                if soonest is None or due < soonest:
                    soonest = due
                continue
            served += tick.due
            lateness = core.last_lateness_ns
            self._lateness[bisect_left(_LATENESS_BOUNDS_NS, lateness)] += 1
            if lateness > self.late_threshold_ns:
                late += 1
                severe += lateness > self.severe_threshold_ns
                worst = lateness if lateness > worst else worst
            if first_phase < 0:
                first_phase = phase
            group = self._groups[phase]
            channels += len(group)
            poll = self._polls[phase]
            if poll is not None:
                try:
                    self._read(poll, now)
                except Exception:  # a reader that raises must not stop the clock: its slots are still served
                    self.channel_errors += 1
                    log.exception("reading a media channel's RTP failed")
            for key, channel in list(group.items()):
                try:
                    channel.on_slots(now, tick.due, tick.skipped)
                except Exception:
                    self.channel_errors += 1
                    log.exception("media channel failed; removed from the clock")
                    if group.pop(key, None) is not None:
                        self._phase_of.pop(key, None)
                        self._unregister(phase, key)
                        if isinstance(channel, BatchingChannel):
                            channel.join_batch(None)
            if self.sends.owners:
                try:
                    self.sends.flush()
                except Exception:  # the calls were settled (what did not leave: unsent); the clock goes on
                    self.channel_errors += 1
                    log.exception("sending the media clock's RTP failed")
            if not group:
                self._retire(phase)
            else:
                due = core.next_deadline()
                if soonest is None or due < soonest:
                    soonest = due
        if self._changes != changes:  # a channel added or removed one during the run: read them all again
            soonest = self.next_deadline()
        if late:
            self._attribute(now, worst, cpu, gc_waited, gc_gen, late, severe)
        end = self._clock()
        self._run_start = now
        self._run_end = end
        self._run_cpu0 = cpu
        self._run_cpu1 = self._cpu() if end - now >= CPU_SPLIT_MIN_NS else cpu + (end - now)
        self._run_gc_ns = watch.total_ns - gc_total
        self._run_channels = channels
        self._run_phase = first_phase
        self._next_due = soonest
        watch.mark = soonest if soonest is not None else _NEVER
        watch.after_mark_ns = 0
        if not self._phase_of and self._t0 is not None:
            self.stop()
        return served

    def _attribute(
        self, now: int, lateness: int, cpu: int, gc_waited: int, gc_gen: int, late: int, severe: int
    ) -> None:
        """Split a late run's lateness (of its most late phase, deadline `now - lateness`) into causes and
        count its `late` (and `severe`) phase ticks under the one that took most (the module's docstring).
        `cpu` is the CPU clock at this run's start; `gc_waited` the collections' time past the deadline
        since the previous run ended, `gc_gen` the highest generation collected since it began."""
        deadline = now - lateness
        spent = [0, 0, 0, 0]
        # the previous run's part past the deadline: its wall time split into the kernel's (not on CPU),
        # the collector's and its own, in proportion
        overrun = min(max(self._run_end - deadline, 0), lateness)
        wall = self._run_end - self._run_start
        if overrun > 0 and wall > 0:
            off_cpu = min(max(wall - (self._run_cpu1 - self._run_cpu0), 0), wall)
            collecting = min(self._run_gc_ns, wall - off_cpu)
            spent[_UNSCHEDULED] = off_cpu * overrun // wall
            spent[_GC] = collecting * overrun // wall
            spent[_OWN] = overrun - spent[_UNSCHEDULED] - spent[_GC]
        # the wait after it: the kernel's part is the wall time not on CPU beyond what the loop may have
        # idled before the timer was due; then the collector's; the timer's slack; the rest held the loop
        waited = lateness - overrun
        if waited > 0:
            idle = max(deadline + self.timer_slack_ns - self._run_end, 0)
            off_cpu = (now - self._run_end) - (cpu - self._run_cpu1) - idle
            unscheduled = min(max(off_cpu, 0), waited)
            collecting = min(gc_waited, waited - unscheduled)
            rest = waited - unscheduled - collecting
            spent[_UNSCHEDULED] += unscheduled
            spent[_GC] += collecting
            spent[_LOOP] += rest - min(self.timer_slack_ns, rest)
        cause = _OWN
        for i in (_GC, _LOOP, _UNSCHEDULED):
            if spent[i] > spent[cause]:
                cause = i
        self._late[cause] += late
        self._severe[cause] += severe
        if lateness > self._late_max_ns[cause]:
            self._late_max_ns[cause] = lateness
            if cause == _OWN:
                self._own_worst[:] = [wall, self._run_channels, self._run_phase]
        for i in range(4):
            self._late_spent_ns[i] += spent[i]
        if cause == _GC:
            self._late_gc_gen[max(gc_gen, 0)] += late
        if now - self._summary_at >= SUMMARY_EVERY_NS:
            self._summary_at = now
            log.info(
                "media clock: %d phase ticks late by over %d ms since it started (own %d, gc %d, loop %d, "
                "unscheduled %d); this one %.1f ms late, by %s (own %.1f, gc %.1f, loop %.1f, unscheduled %.1f ms)",
                sum(self._late),
                self.late_threshold_ns // 1_000_000,
                *self._late,
                lateness / 1e6,
                LATE_CAUSES[cause],
                *(x / 1e6 for x in spent),
            )
