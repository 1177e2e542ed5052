"""The fault campaign's join (pure: text and dicts in, figures out): what each caller said, what each provider
connection heard and answered (the fakes' notes), and what the application received (the webhook's events and
jobs), told case by case.

The caller (SIPp) loops one sentence: every `loop_ms` it says it once, so utterance k of a call ends about
`loop_ms` after utterance k-1 on the call's session timeline. Where each one ended is read from the audio the
fakes received: each utterance a fake heard ends when the fake took it (its note's time, the fakes' clock mapped
onto the session timeline through the application's `call_started` time), and the whole sentences among them
(a quarter to one sentence of audio, taken 3/4 loop or more after the connection's previous one) are the call's
`Grid`: numbered in order, each loop's end where its own whole sentences were taken, else the median of its
neighbours' (a SIPp stream late or starved by its host stretches the caller's loops, and a host stall has the
fakes take a sentence a second late: the grid follows instead of shifting k, which one phase per call did).
With too few heard, the application's own times stand in. Each utterance a fake heard is the audio its
connection received since the one before it, so it belongs to the first k whose sentence had not ended
(`COMMIT_SLACK_MS` before) when the fake took it: a buffer RO2's hard stop or the floor's move committed holds
the start of the sentence under way (or only the pause before it), a tail heard after a repair ends with its
sentence. Each application utterance belongs to the k of the fake's utterance with its transcript nearest in time
(to when the application received it, or to the end the bridge gave it) within 0.8 loop; a text no fake gave is
a transcript `mutate` corrupted: that of the heard utterance whose text it ends with (a corrupted caption the
bridge joined to the next one's), else of the nearest whose transcript frame it hit (else the k whose sentence
its own span overlaps most, or by its end time). An application utterance more than 1.5 s from when the fake
heard it is also listed as `stamped_off` (HR11: the bridge rebased it wrong; counted apart, not a loss). Every
k the caller spoke while the call could hear it (wholly after its first connection was up, and at least
`settle_ms` before the call ended; with a capture, only when 90 % of its RTP packets reached the bridge's port:
a starved SIPp sends short, `not_on_the_wire`) is one case:

- `once`: the application received it exactly once (S1);
- `split_by_discontinuity`: more than once, and a reported input `audio_discontinuity` (HR8) overlaps it: the
  caller's audio was cut, and each side was heard on its own;
- `duplicated`: more than once with no such report (RO3, S1: unexplained);
- `lost_in_discontinuity`: never, inside a reported input discontinuity (HR8);
- `lost_to_corrupt_frame`: never, and the fake that heard it sent its transcript corrupted (the `mutate` fault;
  the bridge reports each such frame as a provider error `invalid_event`): the text never arrived;
- `lost_unexplained`: never, and nothing reported (S1: unexplained).

Jobs are counted per caller request (S2): each job the application received is traced (the log's provider
call id of the job) to the fake's tool call, the utterance that tool call answered and so its k; a k with two
jobs or more is `tool_duplicated` (unexplained), a job a fake made for a text input (the application's context,
which the campaign's script never answers with a tool) is `tool_for_context` (unexplained), and a request
heard with no job is `tool_not_run` (listed, not failed: HR9/HR10 and a lost connection may withhold it), or
`tool_split_by_discontinuity` when a reported input discontinuity cut it (HR8: the part heard after a repair is
the tail of a request the lost connection began, never a new one, so its tool call is withheld), and a request
never heard at all is `tool_for_lost_utterance` (its utterance is listed with its own class). Every request is
in exactly one of these.
Every flagged case is listed with its call, provider, the connections that heard it, its time, the nearest
rollover and recovery, the faults that fired on the call's connections from 10 s before it to 5 s after, and
the connections that closed within 5 s of it.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CONNECTION = re.compile(r"call (call-\d+) conn-(\d+) provider session (\S+) started at (-?\d+) ms")
INPUT_GAP = re.compile(
    r"call (call-\d+) audio_discontinuity input: (\d+) caller frames dropped \((\w+)\) at (\d+) ms"
)
DISPATCHED = re.compile(
    r"call (call-\d+) (job-\d+) \((\w+)\) running at \d+ ms: dispatched to the application \(call (\S+)\)"
)
ROLLOVER = re.compile(r"call (call-\d+) rollover (\w+): (\S+) \(.*\) at (\d+) ms")
RECOVERY = re.compile(
    r"call (call-\d+) audio_discontinuity output: \d+ bytes of provider audio dropped \((\w+)\) at (\d+) ms"
)
JOB = re.compile(r"call (call-\d+) (job-\d+) \((\w+)\) (\w+) at (\d+) ms: (.*)")
FRAME_MS = 20
TEXT_REACH = 0.8  # a transcript names the fake's utterance with that text heard within this many loops of it
COMMIT_SLACK_MS = 1_000  # a whole sentence is taken up to this long after the end the grid gives it (the
# grid is the median of when the fakes took whole sentences; the pause after a sentence is 2.3 s)
STAMP_MS = 1_500  # an application utterance this far from when the fake heard it is `stamped_off` (HR11)
ON_THE_WIRE = 0.9  # a sentence counts as said when this share of its packets reached the bridge's port
NEAR_MS = 5_000  # closes this near a case, and faults up to this long after it, are listed with it
BEFORE_MS = 10_000  # faults up to this long before a case are listed with it (a half-open connection is found
# out only when something is due from it: seconds later)
EXPLAINED = ("once", "split_by_discontinuity", "lost_in_discontinuity", "lost_to_corrupt_frame")
TRANSCRIPT_FRAMES = (
    "transcription",
    "input_transcript",
    "inputTranscription",
)  # a fake's caller-transcript frames
UNEXPLAINED = ("duplicated", "lost_unexplained")
# each flagged case's rule: the one that explains it, or (unexplained kinds) the one it breaks
RULES = {
    "split_by_discontinuity": "HR8: a reported input discontinuity cut the sentence, each side heard on its own",
    "lost_in_discontinuity": "HR8: inside a reported input discontinuity",
    "lost_to_corrupt_frame": "mutate fault: its transcript frame was corrupted (provider error invalid_event)",
    "stamped_off": "HR11: stamped over 1.5 s from when the fake took it (listed; the sentence did arrive)",
    "tool_not_run": "HR9/HR10/S2: heard once, no job (held, withheld or handled by the previous connection)",
    "tool_split_by_discontinuity": "HR8/HR10: the tail a replacement heard after a repair is no new request",
    "duplicated": "S1/RO3 broken: received twice with no reported discontinuity",
    "lost_unexplained": "S1 broken: never received, nothing reported",
    "tool_duplicated": "S2 broken: one caller request, two jobs or more",
    "tool_for_context": "S2 broken: a job for a text input (the script never asks on one)",
}


@dataclass(frozen=True)
class BridgeConn:
    call: str
    token: int
    session: str  # the provider's session id ("-": none given)
    at_ms: int  # session timeline


@dataclass
class FakeConn:
    """One connection as a fake noted it."""

    protocol: str
    conn: int
    session: str | None = None
    opened: float | None = None  # unix s
    started: float | None = None  # unix s, when the session was named
    heard: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    closed: tuple[float, Any] | None = None  # (unix s, close code) when the fake saw it end
    corrupted: list[float] = field(
        default_factory=list
    )  # unix s of each caller-transcript frame `mutate` hit

    @property
    def key(self) -> str:
        return f"{self.protocol}#{self.conn}"


@dataclass
class BridgeLog:
    connections: list[BridgeConn] = field(default_factory=list)
    input_gaps: dict[str, list[tuple[int, int, str]]] = field(default_factory=lambda: defaultdict(list))
    jobs: dict[tuple[str, str], str] = field(default_factory=dict)  # (call, job) -> provider call id
    # call -> (session ms, "rollover STAGE conn-N" or "recovery CAUSE"), in log order
    marks: dict[str, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))
    # call -> job -> [first seen (session ms), its last state, that state's detail]
    job_states: dict[str, dict[str, list[Any]]] = field(default_factory=lambda: defaultdict(dict))


def read_bridge_log(lines: Iterable[str]) -> BridgeLog:
    out = BridgeLog()
    for line in lines:
        if m := CONNECTION.search(line):
            out.connections.append(BridgeConn(m.group(1), int(m.group(2)), m.group(3), int(m.group(4))))
        elif m := INPUT_GAP.search(line):
            at, frames = int(m.group(4)), int(m.group(2))
            out.input_gaps[m.group(1)].append((at - frames * FRAME_MS, at, m.group(3)))
        elif m := ROLLOVER.search(line):
            out.marks[m.group(1)].append((int(m.group(4)), f"rollover {m.group(2)} {m.group(3)}"))
        elif m := RECOVERY.search(line):
            if m.group(2) != "rollover":
                out.marks[m.group(1)].append((int(m.group(3)), f"recovery {m.group(2)}"))
        if m := DISPATCHED.search(line):
            out.jobs[(m.group(1), m.group(2))] = m.group(4)
        if m := JOB.search(line):
            state = out.job_states[m.group(1)].setdefault(m.group(2), [int(m.group(5)), "", ""])
            state[1:] = [m.group(4), m.group(6)]
    return out


def read_notes(protocol: str, notes: Iterable[Mapping[str, Any]]) -> dict[int, FakeConn]:
    """A fake's notes (providers/fakes/server.py) by connection."""
    conns: dict[int, FakeConn] = {}
    for n in notes:
        c = conns.setdefault(int(n["conn"]), FakeConn(protocol, int(n["conn"])))
        if n.get("session"):
            c.session = str(n["session"])
        kind = n.get("kind")
        if kind == "open":
            c.opened = float(n["unix"])
        elif kind == "session" and c.started is None:
            c.started = float(n["unix"])
        elif kind == "heard":
            c.heard.append(dict(n))
        elif kind == "tool_call":
            c.tool_calls.append(dict(n))
        elif kind == "fault":
            c.faults.append(dict(n))
        elif kind == "mutated" and any(t in str(n.get("of")) for t in TRANSCRIPT_FRAMES):
            c.corrupted.append(float(n["unix"]))
        elif kind == "closed":
            c.closed = (float(n["unix"]), n.get("code"))
    return conns


def attribute(
    bridge: Sequence[BridgeConn], fakes: Mapping[str, Mapping[int, FakeConn]], provider_of: Mapping[str, str]
) -> dict[tuple[str, int], FakeConn]:
    """Each bridge connection (call, token) -> the fake connection it was, by the provider's session id; a
    session id the fake gave several connections (a resumed session) pairs them in the order they started."""
    by_session: dict[tuple[str, str], list[FakeConn]] = defaultdict(list)
    for protocol, conns in fakes.items():
        for c in conns.values():
            if c.session:
                by_session[(protocol, c.session)].append(c)
    for group in by_session.values():
        group.sort(key=lambda c: (c.started or c.opened or 0.0, c.conn))
    out: dict[tuple[str, int], FakeConn] = {}
    seen: Counter[tuple[str, str]] = Counter()
    for b in sorted(bridge, key=lambda b: (b.call, b.at_ms, b.token)):
        key = (provider_of.get(b.call, ""), b.session)
        group = by_session.get(key, [])
        if seen[key] < len(group):
            out[(b.call, b.token)] = group[seen[key]]
        seen[key] += 1
    return out


class Grid:
    """Where each loop's sentence ended on a call's session timeline, followed along the call.

    Built from the ends of whole sentences (the fakes' `heard` times): the first ones are numbered from the
    circular median of their times, each later one by how far it lies from the loops before it (the median of
    the last `WINDOW` ends' phases), so that a stream whose loops stretch (SIPp late or starved by its host)
    keeps its numbering. A loop's end is the (lower) median of its own ends (a host stall can have the fakes take
    one sentence a second late: the loops around do not say where this one ended), else the median phase of the
    ends numbered within `WINDOW` loops of it."""

    WINDOW = 5  # loops either side whose ends set a loop's phase (a stream stretches far less in 10)

    def __init__(self, ends: Sequence[float], loop_ms: int) -> None:
        self.loop = loop_ms
        times = sorted(ends)
        head = times[: 2 * self.WINDOW + 1]
        phase = circular_median(head, loop_ms) if head else 0.0
        self.ks: list[int] = []
        self.phases: list[float] = []  # each end's `at - k * loop`, in the order of `ks` (non-decreasing)
        self.times: list[float] = []
        for at in times:
            k = round((at - phase) / loop_ms)
            self.ks.append(k)
            self.phases.append(at - k * loop_ms)
            self.times.append(at)
            recent = sorted(self.phases[-self.WINDOW :])
            phase = recent[len(recent) // 2]
        order = sorted(range(len(self.ks)), key=lambda i: (self.ks[i], self.times[i]))
        self.ks = [self.ks[i] for i in order]
        self.phases = [self.phases[i] for i in order]
        self.times = [self.times[i] for i in order]
        by_time = sorted(range(len(self.times)), key=lambda i: self.times[i])
        self._sorted_times = [self.times[i] for i in by_time]
        self._sorted_ks = [self.ks[i] for i in by_time]
        self._ends: dict[int, float] = {}

    def end(self, k: int) -> float:
        """Where loop k's sentence ended."""
        if k not in self._ends:
            self._ends[k] = self._end(k)
        return self._ends[k]

    def _end(self, k: int) -> float:
        if not self.ks:
            return float(k * self.loop)
        lo, hi = bisect_left(self.ks, k), bisect_left(self.ks, k + 1)
        if lo < hi:  # heard whole: where that was (a host stall can make it a second late, this loop alone)
            own = sorted(self.phases[lo:hi])
            return own[(len(own) - 1) // 2] + k * self.loop
        lo = bisect_left(self.ks, k - self.WINDOW)
        hi = bisect_left(self.ks, k + self.WINDOW + 1)
        if lo == hi:  # no whole sentence near: the nearest one's phase
            i = min(max(lo, 0), len(self.ks) - 1)
            if lo > 0 and (lo == len(self.ks) or k - self.ks[lo - 1] < self.ks[lo] - k):
                i = lo - 1
            return self.phases[i] + k * self.loop
        near = sorted(self.phases[lo:hi])
        return near[len(near) // 2] + k * self.loop

    def k(self, at: float) -> int:
        """The loop whose sentence ended nearest `at`."""
        if not self.ks:
            return round(at / self.loop)
        times = self._sorted_times
        j = min(bisect_left(times, at), len(times) - 1)
        if j > 0 and abs(times[j - 1] - at) < abs(times[j] - at):
            j -= 1
        guess = self._sorted_ks[j] + round((at - times[j]) / self.loop)
        return min(range(guess - 1, guess + 2), key=lambda k: abs(self.end(k) - at))


def circular_median(values: Sequence[float], period: float) -> float:
    """The value (mod period) with the least total circular distance to `values` (searched among them)."""
    if not values:
        return 0.0
    rs = [v % period for v in values]

    def cost(c: float) -> float:
        return sum(min(abs(r - c), period - abs(r - c)) for r in rs)

    return min(rs, key=cost)


def _nearest(marks: Iterable[tuple[int, str]], at: float, what: str) -> dict[str, Any] | None:
    """The mark of kind `what` ("rollover", "recovery") nearest `at`: its label and its offset from `at`."""
    best = min((m for m in marks if m[1].startswith(what)), key=lambda m: abs(m[0] - at), default=None)
    return None if best is None else {"ms": round(best[0] - at), "what": best[1]}


@dataclass(frozen=True)
class CallView:
    """What the join needs of one call."""

    call: str
    provider: str
    started_at: float  # unix s: the session timeline's 0 (the application's call_started)
    end_ms: int  # session timeline (the log's `ended after`)
    utterances: Sequence[Mapping[str, Any]]  # the application's caller utterances (webhook bodies + `t`)
    jobs: Sequence[Mapping[str, Any]]  # the application's jobs (webhook bodies)
    caller_packets: Sequence[float] | None = None  # when the caller's RTP reached the bridge (unix s, sorted)


def _anchor(u: Mapping[str, Any], started_at: float) -> float:
    """Where an application utterance ended on the session timeline: its end, else (the bridge knew no end:
    an untimed caption of a turn under way) when the application received it, else its start."""
    if isinstance(u.get("end_ms"), int | float):
        return float(u["end_ms"])
    if isinstance(u.get("t"), int | float):
        return (float(u["t"]) - started_at) * 1000.0
    return float(u["start_ms"])


def join_call(
    view: CallView,
    conns: Mapping[int, FakeConn],  # this call's connections by bridge token
    gaps: Sequence[tuple[int, int, str]],
    job_call_ids: Mapping[str, str],  # job id -> provider call id
    marks: Sequence[tuple[int, str]] = (),  # rollovers and recoveries (session ms, label)
    job_states: Mapping[str, Sequence[Any]] | None = None,  # the log's jobs: [first ms, last state, detail]
    *,
    loop_ms: int,
    speech_ms: int,
    first_ms: int | None,  # the call's first connection started (session ms)
    settle_ms: int = 2_500,
) -> tuple[Counter[str], Counter[str], list[dict[str, Any]]]:
    """One call's cases: (utterance classes, job classes, flagged entries)."""

    def session_ms(unix: float) -> float:
        return (unix - view.started_at) * 1000.0

    emitted = [(_anchor(u, view.started_at), u) for u in view.utterances]
    heard = [(session_ms(float(h["unix"])), token, c, h) for token, c in conns.items() for h in c.heard]
    # the fakes' clock is the truth of when a sentence was heard, and a whole sentence's end is a true end: at
    # least a quarter of a sentence of audio (a starved call's fake gets a fraction of the frames) and no more
    # than a sentence, taken at least 3/4 of a loop after the connection's utterance before it (what RO2's hard
    # stop commits mid-sentence holds all the audio since that one, the pause too, and what it commits a few
    # seconds after a sentence is a fragment); the application's times are the bridge's
    previous: dict[int, float] = {}
    whole = []
    most = speech_ms + (loop_ms - speech_ms) / 4  # a buffer committed by force holds the pause before, too
    for at, token, _, h in sorted(heard, key=lambda e: e[0]):
        before, audio = previous.get(token), float(h.get("audio_ms") or 0)
        if speech_ms / 4 <= audio <= most and (before is None or at - before >= 0.75 * loop_ms):
            whole.append(at)
        previous[token] = at
    ends = (
        whole if len(whole) >= 3 else [a for a, *_ in heard] if len(heard) >= 3 else [a for a, _ in emitted]
    )
    grid = Grid(ends, loop_ms)
    end_of, k_of = grid.end, grid.k

    def k_of_span(start: float, end: float) -> int:
        """The loop whose sentence the span overlaps most (an application utterance no fake's text names: its
        times are the bridge's, of the speech it was told). No overlap: the nearest end."""
        best, most = k_of(end), 0.0
        for k in range(k_of(start) - 1, k_of(end) + 2):
            overlap = min(end, end_of(k)) - max(start, end_of(k) - speech_ms)
            if overlap > most:
                best, most = k, overlap
        return best

    def k_of_commit(at: float) -> int:
        """The loop of an utterance a fake took at `at`: the first whose sentence had not ended by then (each
        is the audio its connection received since its previous one, not the sentence already taken)."""
        k = k_of(at) - 1
        for _ in range(3):  # k_of(at) is the nearest end: the first one not over is at most two on
            if end_of(k) >= at - COMMIT_SLACK_MS:
                break
            k += 1
        return k

    heard_at = [(at, token, c, h, k_of_commit(at)) for at, token, c, h in heard]
    by_text: dict[str, list[tuple[float, int]]] = defaultdict(list)
    garbled: list[tuple[float, int]] = []  # heard utterances whose transcript frame `mutate` corrupted
    for at, _, c, h, k in heard_at:
        by_text[str(h.get("text"))].append((at, k))
        if any(abs(t - float(h["unix"])) <= 0.1 for t in c.corrupted):
            garbled.append((at, k))
    by_k: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    stamped: list[tuple[int, float, float, Mapping[str, Any]]] = []
    for at, u in emitted:
        # the transcript the bridge passed on names the utterance a fake heard: the nearest one with that text,
        # to when the application received it (the transcript left the fake when it was heard) or to the end
        # the bridge gave it (a mutated frame or a wrong stamp moves the one, a held text the other)
        got_at = session_ms(float(u["t"])) if isinstance(u.get("t"), int | float) else at
        text = str(u.get("text"))
        named = by_text.get(text)
        if named is None:  # a text no fake gave: `mutate` corrupted it on its way
            # a corrupted caption the bridge kept and joined to the next one's text (Gemini's untimed chunks):
            # the utterance that text ends with; else one whose transcript frame `mutate` hit
            named = [h for t, hs in by_text.items() if text.endswith(t) for h in hs] or garbled
        match = min(named, key=lambda h: min(abs(h[0] - at), abs(h[0] - got_at)), default=None)
        if match is not None and min(abs(match[0] - at), abs(match[0] - got_at)) > TEXT_REACH * loop_ms:
            match = None  # another loop's same text (a connection not traced heard this one): by time
        start, end = u.get("start_ms"), u.get("end_ms")
        if match is not None:
            k = match[1]
        elif isinstance(start, int | float) and isinstance(end, int | float):
            k = k_of_span(float(start), float(end))
        else:
            k = k_of(at)
        by_k[k].append(u)
        if match is not None and abs(match[0] - at) > STAMP_MS:
            stamped.append((k, at, match[0], u))
    heard_k: dict[int, list[dict[str, Any]]] = defaultdict(list)
    item_k: dict[tuple[str, str], int] = {}  # (fake connection, heard item) -> k
    corrupt_k: set[int] = set()  # loops a fake heard whose transcript frame `mutate` corrupted
    for at, token, c, h, k in heard_at:
        item_k[(c.key, str(h.get("item")))] = k
        if any(abs(t - float(h["unix"])) <= 0.1 for t in c.corrupted):
            corrupt_k.add(k)
        heard_k[k].append(
            {
                "conn": f"conn-{token}",
                "fake": c.key,
                "session": c.session,
                "text": h.get("text"),
                "at_ms": round(at),
            }
        )
    faults = [(session_ms(float(f["unix"])), token, c, f) for token, c in conns.items() for f in c.faults]
    lo = (first_ms if first_ms is not None else 0) + speech_ms  # all of it said after the call could hear
    hi = view.end_ms - settle_ms
    ks = [k for k in range(k_of(lo) - 1, k_of(hi) + 2) if lo <= end_of(k) <= hi]
    classes: Counter[str] = Counter()
    if view.caller_packets is not None:  # a sentence whose audio never reached the bridge was not said to it
        wire, t0 = view.caller_packets, view.started_at

        def on_wire(k: int) -> int:
            end = t0 + end_of(k) / 1000
            return bisect_left(wire, end) - bisect_left(wire, end - speech_ms / 1000)

        said = [k for k in ks if on_wire(k) >= ON_THE_WIRE * speech_ms / FRAME_MS]
        if len(said) < len(ks):
            classes["not_on_the_wire"] = len(ks) - len(said)
        ks = said

    def context(k: int, kind: str, **more: Any) -> dict[str, Any]:
        end = end_of(k)
        return {
            "kind": kind,
            "rule": RULES.get(kind),
            "call": view.call,
            "provider": view.provider,
            "utterance": k,
            "at_ms": round(end),
            "heard_by": heard_k.get(k, []),
            "nearest_rollover": _nearest(marks, end, "rollover"),
            "nearest_recovery": _nearest(marks, end, "recovery"),
            "faults": [
                {"conn": f"conn-{token}", "fake": c.key, "spec": f.get("spec"), "at_ms": round(at)}
                for at, token, c, f in faults
                if -BEFORE_MS <= at - end <= NEAR_MS
            ],
            "closes": [
                {
                    "conn": f"conn-{token}",
                    "fake": c.key,
                    "code": c.closed[1],
                    "at_ms": round(session_ms(c.closed[0])),
                }
                for token, c in conns.items()
                if c.closed is not None and abs(session_ms(c.closed[0]) - end) <= NEAR_MS
            ],
            **more,
        }

    flagged: list[dict[str, Any]] = []
    cut_k: dict[int, list[tuple[int, int, str]]] = {}
    for k in ks:
        start, end = end_of(k) - speech_ms, end_of(k)
        cut = cut_k[k] = [g for g in gaps if g[0] < end and g[1] > start]
        got = by_k.get(k, [])
        if len(got) == 1:
            kind = "once"
        elif got:
            kind = "split_by_discontinuity" if cut else "duplicated"
        else:
            kind = "lost_in_discontinuity" if cut else "lost_unexplained"
            if kind == "lost_unexplained" and k in corrupt_k:
                kind = "lost_to_corrupt_frame"
        classes[kind] += 1
        if kind != "once":
            emitted_texts = [
                {"seq": u.get("seq"), "text": u.get("text"), "end_ms": u.get("end_ms")} for u in got
            ]
            flagged.append(
                context(
                    k,
                    kind,
                    explained=kind in EXPLAINED,
                    emitted=emitted_texts,
                    discontinuities=[list(g) for g in cut],
                )
            )

    for k, at, when, u in stamped:
        classes["stamped_off"] += 1
        flagged.append(
            context(
                k,
                "stamped_off",
                explained=False,
                emitted=[
                    {
                        "seq": u.get("seq"),
                        "text": u.get("text"),
                        "end_ms": u.get("end_ms"),
                        "start_ms": u.get("start_ms"),
                    }
                ],
                off_ms=round(at - when),
            )
        )

    # jobs per caller request
    tool_calls = {t["call_id"]: (c, t) for c in conns.values() for t in c.tool_calls}
    token_of = {c.key: token for token, c in conns.items()}
    asked_on: dict[str, str] = {}  # job -> the connection whose tool call it is
    jobs_k: dict[int, list[str]] = defaultdict(list)
    job_classes: Counter[str] = Counter()
    for job in view.jobs:
        job_id = str(job.get("job_id"))
        provider_call = job_call_ids.get(job_id)
        found = tool_calls.get(provider_call) if provider_call is not None else None
        if found is not None and found[1].get("input") == "text":
            job_classes["tool_for_context"] += 1
            k = k_of(float(job.get("requested_at_ms") or 0))
            flagged.append(
                context(k, "tool_for_context", explained=False, job=job_id, tool_call=provider_call)
            )
            continue
        k_item = item_k.get((found[0].key, str(found[1].get("for")))) if found is not None else None
        k = k_item if k_item is not None else k_of(float(job.get("requested_at_ms") or 0))
        if found is None:
            job_classes["traced_by_time"] += 1
        jobs_k[k].append(job_id)
        if found is not None:
            asked_on[job_id] = f"conn-{token_of[found[0].key]}"
    for k in ks:
        runs = jobs_k.get(k, [])
        if len(runs) > 1:
            job_classes["tool_duplicated"] += 1
            asked = {job: asked_on.get(job) for job in runs}
            flagged.append(context(k, "tool_duplicated", explained=False, jobs=runs, asked_on=asked))
        elif runs:
            job_classes["tool_once"] += 1
        else:
            got = len(by_k.get(k, []))
            kind = (
                "tool_for_lost_utterance"
                if not got
                else "tool_split_by_discontinuity"
                if cut_k[k]
                else "tool_not_run"
            )
            job_classes[kind] += 1
            held = [
                {"job": job, "requested_ms": st[0], "state": st[1], "detail": st[2]}
                for job, st in (job_states or {}).items()
                if k_of(st[0]) == k and st[1] != "delivered"
            ]
            if kind != "tool_for_lost_utterance":  # that utterance is listed already, with its class
                flagged.append(context(k, kind, explained=True, bridge_jobs=held))
    return classes, job_classes, flagged


def join(
    views: Sequence[CallView],
    log: BridgeLog,
    fakes: Mapping[str, Mapping[int, FakeConn]],
    *,
    loop_ms: int,
    speech_ms: int,
) -> dict[str, Any]:
    """Every call's cases: the campaign's `utterances`, `tool_requests` and `flagged`."""
    provider_of = {v.call: v.provider for v in views}
    attributed = attribute(log.connections, fakes, provider_of)
    first: dict[str, int] = {}
    for b in log.connections:
        first[b.call] = min(first.get(b.call, b.at_ms), b.at_ms)
    utter: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    flagged: list[dict[str, Any]] = []
    for v in views:
        conns = {token: c for (call, token), c in attributed.items() if call == v.call}
        job_ids = {job: pc for (call, job), pc in log.jobs.items() if call == v.call}
        u, j, f = join_call(
            v,
            conns,
            log.input_gaps.get(v.call, []),
            job_ids,
            log.marks.get(v.call, []),
            log.job_states.get(v.call, {}),
            loop_ms=loop_ms,
            speech_ms=speech_ms,
            first_ms=first.get(v.call),
        )
        utter += u
        jobs += j
        flagged += f
    unexplained = sum(utter[k] for k in UNEXPLAINED) + jobs["tool_duplicated"] + jobs["tool_for_context"]
    utter["spoken"] = sum(utter[k] for k in (*EXPLAINED, *UNEXPLAINED))
    return {
        "utterances": {
            "spoken": utter["spoken"],
            "not_on_the_wire": utter["not_on_the_wire"],
            **{k: utter[k] for k in (*EXPLAINED, *UNEXPLAINED, "stamped_off")},
            "connections_logged": len(log.connections),
            "connections_traced": len(attributed),
        },
        "tool_requests": {
            k: jobs[k]
            for k in (
                "tool_once",
                "tool_duplicated",
                "tool_for_context",
                "tool_not_run",
                "tool_split_by_discontinuity",
                "tool_for_lost_utterance",
                "traced_by_time",
            )
        },
        "unexplained": unexplained,
        "flagged": flagged,
    }


def speech_span_ms(lead_ms: int, loop_ms: int, tail_ms: int) -> int:
    """How long the caller speaks in one loop of its utterance (lead silence + speech + tail silence)."""
    return max(0, loop_ms - lead_ms - tail_ms)
