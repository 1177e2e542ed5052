"""Fault campaign: N concurrent SIPp calls through ONE `serve` (native engine), the four providers' fakes mixed,
a tool call on every turn, every fault kind the fakes inject, and rollovers. Run by hand (full form) or in CI
(`--quick`, from tests/integration/test_reliability_quick.py).

    .venv/bin/python tests/bench/fault_campaign.py            # 100 calls, 1,000 faults, rollovers every ~30 s
    .venv/bin/python tests/bench/fault_campaign.py --quick    # 8 calls, 100 faults: about a minute
    .venv/bin/python tests/bench/fault_campaign.py --calls 20 --faults 300 --seed 7 --keep
    .venv/bin/python tests/bench/fault_campaign.py --rejoin /tmp/parlora-campaign-7 --base r.json --output r2.json

One fake per protocol (openai-live, openai-realtime, gemini-live over TLS, xai), each its own process with a
script that calls `lookup_order` before answering every caller utterance. One `serve --config` routes the
called numbers 1001-1004 to them (bridge/cli/config.py routes). Four SIPp processes (one per number) stream a
looping utterance. An injector picks a fake (weighted by its calls), asks it which connections are open
(`GET /_connections`) and injects a fault into one (`GET /_fault?spec=N/KIND`); `refuse` and `slow_handshake`
target the next connection the fake will accept, and an `abrupt_close` of an open one follows so that the next
connection is most likely a recovery's replacement. tshark records the bridge's RTP both ways, so that the
largest gap any caller saw can be measured and a sentence SIPp sent short is not taken for one the bridge
lost. The seed is printed; `--seed` replays the choice of faults (not the timing).

Prints one JSON object (and writes it to --output): `calls_lost` (each lost call with its end reason and the
rule that made it fatal, `unexplained` when none does), `tool_runs_duplicated` (must be 0), recovery
p50/p99/max, `rtp_gap_max_ms`, `utterances` (each loop each caller spoke, told: received once, twice, lost inside
a reported discontinuity or lost unexplained), `tool_requests` (jobs per caller request) and `flagged` (every
case but `once`, traced to its call, connection and faults: tests/bench/campaign_join.py), fault counts, the
load. The application is a webhook here (each job and each event the bridge POSTs is kept), and the fakes
keep notes of what each connection heard and answered (`fake-provider --notes`). The bridge's log, the notes,
the application's events and the injections are kept in `--logs` (default: the temporary directory's
`parlora-campaign-SEED`); `--rejoin DIR` starts nothing and joins such a directory again (with `--base` the
run's own JSON, whose other figures it keeps). tests/bench/README.md says what each figure means. Exit status 0 when nothing was
lost without a rule, no tool ran twice and no case is unexplained, 1 otherwise.
"""

from __future__ import annotations

import argparse
import http.server
import itertools
import json
import os
import random
import re
import shutil
import ssl
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
for _p in (BENCH.parent / "integration", BENCH, ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import campaign_join  # noqa: E402
import conftest  # noqa: E402  (BRIDGE, _clean_env, Fake: the integration fixtures' own pieces)
import peers  # noqa: E402
import stats  # noqa: E402
from compare import parse_pin  # noqa: E402  (run.py's --pin, the same meaning here)
from report import run_in_scratch  # noqa: E402
from run import cpu_list, parse_bridge_env, pinned  # noqa: E402

LATE_CAUSES = ("own", "gc", "loop", "unscheduled")  # rtp/clock.py's, as /metrics labels them

# protocol -> (called number its route matches, the key variable serve needs for it)
PROVIDERS: dict[str, tuple[str, str]] = {
    "openai-live": ("1001", "OPENAI_API_KEY"),
    "openai-realtime": ("1002", "OPENAI_API_KEY"),
    "gemini-live": ("1003", "GEMINI_API_KEY"),
    "xai": ("1004", "XAI_API_KEY"),
}
# (spec, weight). Every kind of providers/fakes/faults.py. `close`, `invalid_audio` and `refuse` are fatal by
# rule when they hit (the provider's final close, HR1, HR5): rare, so that the other figures have calls to
# measure. NEXT kinds go to the fake's next connection.
KINDS: tuple[tuple[str, int], ...] = (
    ("burst:40", 20),
    ("stall:1500", 12),
    ("abrupt_close", 18),
    ("half_open", 5),
    ("garbage_json", 10),
    ("duplicate_tool_call", 20),
    ("slow_handshake:1500", 6),
    ("mutate:7", 6),
    ("close", 1),
    ("invalid_audio", 1),
    ("refuse", 1),
)
# A fault goes to a connection seen open at least this long (its handshake, slow_handshake included, is over):
# a fault on a replacement still in its handshake is a dead replacement, fatal by HR5, and would make every
# survivable kind look fatal.
MIN_AGE_S = 2.5
TICKS = os.sysconf("SC_CLK_TCK")
# The fatal kinds and the end reasons they cause; a call lost with any other reason was lost to a survivable
# fault (or to no fault at all), which the quick form forbids.
FATAL_KIND_REASONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"refused the connection: HTTP 503"), "refuse"),
    (re.compile(r"^protocol error invalid_audio"), "invalid_audio"),
    (re.compile(r"^provider session closed"), "close"),
    # The provider's cap close (OpenAI session_expired, Gemini goAway then 1011) with no next connection open
    # ends the call at once (RO6: the hard stop is now, nobody could answer). Attributed to `close`.
    (re.compile(r"^rollover not possible: (ended_without_notice|approve_timeout)"), "close"),  # 0 ms or a few
)
NEXT_KINDS = frozenset({"slow_handshake", "refuse"})
# RO6 ends a call whose next connection has not opened by the hard stop. A fault that kills the next connection
# (a survivable kind: abrupt_close, half_open) so near the hard stop that its retry cannot open in time ends the
# call by that rule: a --quick run here lost a call whose next connection was closed 134 ms before its hard stop
# (the retry also drew slow_handshake). Opening takes up to slow_handshake's 1.5 s plus about a second on a loaded bridge;
# a loss by RO6 less than this long after a next connection failed is attributed to `late_next_loss`.
NEXT_OPEN_MS = 2_500
RO6_STAGES = ("approve_timeout", "authorize_timeout", "next_not_open")  # a retry's stage at the hard stop
# Each fatal fault that hits ends one call, and a campaign whose calls are all dead has nowhere to put the rest
# of its faults (a CI run once lost 7 of its 8 calls by the 83rd fault and injected no more). So at most a
# quarter of the calls (at least one) get a fatal kind; once that many were injected, the draw is re-made among
# the survivable kinds.
FATAL_KINDS = frozenset({"close", "invalid_audio", "refuse"})
# A tool call per caller utterance, never for a text input (`tools_answer_callers`): the application's result or
# a rollover's context given as text is spoken to, not asked about again, so that each job answers a caller
# request (without it the Realtime-family fakes asked for the tool again on every context message).
SCRIPT = {
    "turns": [],
    "then": {"tool_call": {"name": "lookup_order", "arguments": {"order_id": "42"}}, "reply": "echo"},
    "tools_answer_callers": True,
}
LEAD_S, TAIL_S = 0.3, 2.0  # the sentence's silences in its loop (the caller speaks between them)
WEBHOOK_SECRET = "campaign-secret"
# Long enough (about 3.5 s) that its echo overflows GPT-Live's 2 s reservoir when the fake bursts; no comma, so
# that one loop is one caller utterance.
SENTENCE = "Where is my order number forty two and when will it arrive at my house please"

# The end reasons a rule declares fatal (bridge/engine/coordinator.py, bridge/engine/recovery.py, bridge/engine/rollover.py).
FATAL_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^protocol error"), "HR1: invalid provider audio is a fatal protocol error"),
    (re.compile(r"^the replacement connection failed"), "HR5: a dead replacement connection is fatal"),
    (re.compile(r"^output recovery did not complete"), "HR5: recovery must complete within 5 s"),
    (re.compile(r"^rollover not possible|^rollover_refused"), "RO6: no next connection by hard_stop_ms"),
    (re.compile(r"^provider session closed"), "the provider's final close ends the session (finalized)"),
    (re.compile(r"^provider unavailable"), "the first connection could not open: the caller gets 503"),
)

_STARTED = re.compile(r"call (call-\d+) started: from \S+ to <?sips?:(\w+)@")
_ENDED = re.compile(r"call (call-\d+) ended after ([\d.]+) s by (\w+) \(([^)]*)\)(?:: frames in (\d+))?")
_DISPATCHED = re.compile(
    r"call (call-\d+) (job-\d+) \((\w+)\) running at \d+ ms: dispatched to the application \(call (\S+)\)"
)
_RECOVERY = re.compile(r"call (call-\d+) output_recovery (\w+): token \d+, cause (\w+), (\d+) ms since")
_ROLLOVER = re.compile(r"call (call-\d+) rollover (\w+): (\S+) \((.*)\) at (\d+) ms")
_EXPIRED = re.compile(r"call (call-\d+) provider error session_expired")
_LEDGER = re.compile(r"call (call-\d+) .*delivered again: answered from the ledger")


@dataclass(frozen=True)
class Plan:
    calls: int
    faults: int
    pace_s: float  # one fault every pace_s
    session_cap_ms: int
    rollover_after_ms: int
    rollover_deadline_ms: int
    rollover_hard_stop_ms: int
    seed: int
    capture: bool = True
    hold_s: float | None = None  # the long run: every call held this long (else worked out from the faults)
    pin: tuple[str, str] | None = None  # --pin: (the bridge's CPUs, the peers' CPUs) for taskset -c
    bridge_nice: int | None = None  # --bridge-nice: the bridge under `nice -n N` (negative: needs root)
    bridge_env: tuple[tuple[str, str], ...] = ()  # --bridge-env NAME=VALUE: more environment for the bridge
    record: bool = False  # --record: every call recorded (serve --record), so its writes load the loop too

    @property
    def call_ms(self) -> int:  # every call outlives the fault window by 10 s
        if self.hold_s is not None:
            return int(self.hold_s * 1000)
        return int((self.faults * self.pace_s * 1.5 + 10) * 1000)

    @property
    def sample_s(self) -> float:  # about 30 samples of the bridge over a run, at least 5 s apart
        return max(5.0, self.call_ms / 1000 / 30)


QUICK: dict[str, float] = {
    "calls": 8,
    "faults": 100,
    "pace_s": 0.3,
    "cap": 15_000,
    "after": 6_000,
    "deadline": 9_000,
    "stop": 14_000,
}
# The long run: 100 calls held for 30 minutes with faults every 2 s and rollovers every ~30 s; no
# capture (100 calls x 50 packets/s x 30 min is 9 million packets): the media clock's own lateness histogram,
# scraped from /metrics at each sample, gives the p99 over time instead.
LONG: dict[str, float] = {
    "calls": 100,
    "faults": 800,
    "pace_s": 2.0,
    "cap": 36_000,
    "after": 30_000,
    "deadline": 32_000,
    "stop": 35_000,
    "hold_s": 1800.0,
}
FULL: dict[str, float] = {
    "calls": 100,
    "faults": 1000,
    "pace_s": 0.2,
    "cap": 36_000,
    "after": 30_000,
    "deadline": 32_000,
    "stop": 35_000,
}


# --- analysis (pure: a log's text in, figures out) -------------------------------------------------------------


def fatal_rule(reason: str) -> str | None:
    """The rule that declares a call ending with `reason` fatal, or None (then the loss is unexplained)."""
    for rx, rule in FATAL_RULES:
        if rx.search(reason):
            return rule
    return None


def fatal_kind(reason: str) -> str | None:
    """The fatal fault kind that ends a call with `reason`, or None."""
    for rx, kind in FATAL_KIND_REASONS:
        if rx.search(reason):
            return kind
    return None


def late_next(f: LogFigures, call: str, reason: str) -> str | None:
    """`late_next_loss` when RO6 ended the call (`reason`) for want of a next connection less than NEXT_OPEN_MS
    after one failed: its retry had no time to be approved, authorised or opened (the refusal names the stage
    the retry had reached: bridge/engine/rollover.py `_ASKING`), else None."""
    failed, refused = f.next_failed_at.get(call), f.refused_at.get(call)
    if failed is None or refused is None or not reason.endswith(RO6_STAGES):
        return None
    return "late_next_loss" if 0 <= refused - failed < NEXT_OPEN_MS else None


def percentile(values: Sequence[float], q: float) -> float | None:
    return stats.percentile(values, q)


@dataclass
class LogFigures:
    calls: dict[str, str] = field(default_factory=dict)  # call id -> called number
    ended: dict[str, tuple[str, str]] = field(default_factory=dict)  # call id -> (ended by, reason)
    dispatched: Counter[tuple[str, str]] = field(default_factory=Counter)  # (call, provider call id) -> runs
    reconnect_ms: list[int] = field(default_factory=list)  # condition -> replacement ready (awaiting_user)
    repaired_ms: list[int] = field(
        default_factory=list
    )  # condition -> caller spoke on the replacement (done)
    recovery_causes: Counter[str] = field(default_factory=Counter)
    recoveries_failed: int = 0
    rollovers: Counter[str] = field(default_factory=Counter)
    ledger_answers: int = 0
    expired: set[str] = field(default_factory=set)  # calls whose provider said its session hit its cap
    next_failed_at: dict[str, int] = field(
        default_factory=dict
    )  # call -> its last next connection failed (ms)
    refused_at: dict[str, int] = field(default_factory=dict)  # call -> its rollover refused (RO6, ms)
    ended_ms: dict[str, int] = field(default_factory=dict)  # call -> when it ended on its session timeline
    frames_in_share: dict[str, float] = field(default_factory=dict)  # call -> caller frames taken / sent


def read_log(lines: Iterable[str]) -> LogFigures:
    f = LogFigures()
    for line in lines:
        if m := _STARTED.search(line):
            f.calls[m.group(1)] = m.group(2)
        elif m := _ENDED.search(line):
            f.ended[m.group(1)] = (m.group(3), m.group(4))
            f.ended_ms[m.group(1)] = round(float(m.group(2)) * 1000)
            if m.group(5) is not None and float(m.group(2)) > 0:  # 50 caller frames a second were sent
                f.frames_in_share[m.group(1)] = int(m.group(5)) / (float(m.group(2)) * 50)
        elif m := _DISPATCHED.search(line):
            f.dispatched[(m.group(1), m.group(4))] += 1
        elif m := _RECOVERY.search(line):
            stage, cause, ms = m.group(2), m.group(3), int(m.group(4))
            if stage == "reconnecting":
                f.recovery_causes[cause] += 1
            elif stage == "awaiting_user":
                f.reconnect_ms.append(ms)
            elif stage == "done":
                f.repaired_ms.append(ms)
            elif stage == "failed":
                f.recoveries_failed += 1
        elif m := _ROLLOVER.search(line):
            call, stage, at = m.group(1), m.group(2), int(m.group(5))
            f.rollovers[stage] += 1
            if stage == "failed":  # lost, or it could not open
                f.next_failed_at[call] = at
            elif stage == "refused":
                f.refused_at[call] = at
        elif m := _EXPIRED.search(line):
            f.expired.add(m.group(1))
        elif _LEDGER.search(line):
            f.ledger_answers += 1
    return f


def figures(f: LogFigures, *, answered: int, expected: int) -> dict[str, Any]:
    lost = []
    for call, number in sorted(f.calls.items(), key=lambda kv: int(kv[0].split("-")[1])):
        by, reason = f.ended.get(call, ("nobody", "no end line: the call never ended"))
        if by != "caller":
            lost.append(
                {
                    "call": call,
                    "number": number,
                    "ended_by": by,
                    "reason": reason,
                    "rule": fatal_rule(reason),
                    "fatal_kind": fatal_kind(reason)
                    or ("close" if call in f.expired else None)
                    or late_next(f, call, reason),
                }
            )
    duplicated = sorted(f"{call} {tool_call}" for (call, tool_call), n in f.dispatched.items() if n > 1)

    def summary(values: list[int]) -> dict[str, float | None]:
        return {
            "p50": percentile(values, 50),
            "p99": percentile(values, 99),
            "max": float(max(values)) if values else None,
            "count": len(values),
        }

    return {
        "calls_expected": expected,
        "calls_answered": answered,
        "calls_started": len(f.calls),
        "calls_not_answered": max(0, expected - answered),
        "calls_lost": lost,
        "calls_lost_unexplained": sum(1 for c in lost if c["rule"] is None) + max(0, expected - answered),
        "calls_lost_to_survivable_faults": sum(1 for c in lost if c["fatal_kind"] is None),
        "tool_runs": sum(f.dispatched.values()),
        "tool_runs_duplicated": len(duplicated),
        "tool_runs_duplicated_list": duplicated,
        "ledger_answers": f.ledger_answers,
        "recoveries": dict(f.recovery_causes),
        "recoveries_failed": f.recoveries_failed,
        "recovery_reconnect_ms": summary(f.reconnect_ms),
        "recovery_repaired_ms": summary(f.repaired_ms),
        "rollovers": dict(f.rollovers),
        # an overloaded host: the bridge took in less of the callers' audio than they sent (the kernel dropped
        # it from full receive buffers, or the session shed it); its sentences are lost before any seam
        "caller_frames_taken": {
            "min_share": round(min(f.frames_in_share.values()), 3) if f.frames_in_share else None,
            "calls_under_90pct": sum(1 for v in f.frames_in_share.values() if v < 0.9),
        },
    }


def application_views(events: Sequence[dict[str, Any]], f: LogFigures) -> list[campaign_join.CallView]:
    """Each call as the application saw it (the webhook's POSTs, `t` when each came), with its end from the
    log."""
    started: dict[str, tuple[float, str]] = {}
    heard: dict[str, list[dict[str, Any]]] = defaultdict(list)
    jobs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        body = e["body"]
        if body.get("event") == "call_started":
            started[body["call"]["call_id"]] = (float(body["started_at"]), str(body["call"]["provider"]))
        elif body.get("event") == "utterance" and body.get("role") == "caller":
            heard[body["call_id"]].append(body | {"t": e["t"]})
        elif "job_id" in body:
            jobs[body["call"]["call_id"]].append(body)
    return [
        campaign_join.CallView(call, provider, at, f.ended_ms.get(call, 0), heard[call], jobs[call])
        for call, (at, provider) in sorted(started.items(), key=lambda kv: int(kv[0].split("-")[1]))
    ]


def cases(
    lines: Sequence[str],
    f: LogFigures,
    events: Sequence[dict[str, Any]],
    work: Path,
    loop_ms: int,
    speech_ms: int,
    wire: dict[str, list[float]] | None = None,
) -> dict[str, Any]:
    """The campaign's `utterances`, `tool_requests`, `unexplained` and `flagged` (tests/bench/campaign_join.py)
    from the bridge's log, the application's events and the fakes' notes in `work`."""
    fakes = {}
    for protocol in PROVIDERS:
        path = work / f"fake-{protocol}.notes.jsonl"
        text = path.read_text() if path.exists() else ""
        notes = [json.loads(line) for line in text.splitlines() if line.strip()]
        fakes[protocol] = campaign_join.read_notes(protocol, notes)
    views = application_views(events, f)
    if wire is not None:  # the capture says what the callers' RTP brought to the bridge
        views = [replace(v, caller_packets=wire.get(v.call, [])) for v in views]
    return campaign_join.join(
        views,
        campaign_join.read_bridge_log(lines),
        fakes,
        loop_ms=loop_ms,
        speech_ms=speech_ms,
    )


def result_ok(result: dict[str, Any]) -> bool:
    """Nothing lost without a rule or to a survivable fault, no tool run twice, nothing unexplained."""
    return all(
        result.get(k, 1) == 0
        for k in (
            "calls_lost_unexplained",
            "calls_lost_to_survivable_faults",
            "tool_runs_duplicated",
            "unexplained",
        )
    )


BULK_KINDS = (
    "tool_not_run",
    "tool_split_by_discontinuity",
)  # requests withheld by rule: thousands a long run


def trim_flagged(result: dict[str, Any]) -> dict[str, Any]:
    """The result with `flagged` cut to the sentences' cases and the requests of the unexplained kinds (each
    with its rule), and every kind counted in `flagged_by_kind`: a long run withholds thousands of requests by
    rule (HR8, HR10, S2), each listed by a run that is not trimmed."""
    flagged = result.get("flagged", [])
    return result | {
        "flagged_by_kind": dict(Counter(f["kind"] for f in flagged)),
        "flagged": [f for f in flagged if f["kind"] not in BULK_KINDS],
        "note": f"flagged lists every case but {', '.join(BULK_KINDS)}; all are counted by kind",
    }


def loop_of(logs: Path) -> int:
    """The caller's loop (ms) of a kept run: its `speech.ul` (kept since `--rejoin` exists), else the sentence
    made again as the run made it (espeak-ng and sox give the same length)."""
    kept = logs / "speech.ul"
    if kept.exists():
        return len(kept.read_bytes()) // 8
    with tempfile.TemporaryDirectory(prefix="parlora-rejoin-") as tmp:
        speech = peers.make_utterance(
            Path(tmp) / "speech.wav", SENTENCE, lead_silence_s=LEAD_S, tail_silence_s=TAIL_S, ulaw=True
        )
        assert speech.ulaw_path is not None  # ulaw=True
        return len(speech.ulaw_path.read_bytes()) // 8


def rejoin(logs: Path, base: dict[str, Any] | None = None, loop_ms: int | None = None) -> dict[str, Any]:
    """The figures of a kept run (`--logs`) worked out again from its files, nothing started: the lost calls,
    recoveries, rollovers and tool runs from the bridge's log, and the join (`utterances`, `tool_requests`,
    `unexplained`, `flagged`) of the log, the application's events and the fakes' notes. `base`: the run's own
    JSON, whose other figures (plan, faults injected, samples over time, metrics) are kept as they were."""
    lines = (logs / "bridge.log").read_text(encoding="utf-8", errors="replace").splitlines()
    f = read_log(lines)
    events = [
        json.loads(line)
        for line in (logs / "application.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    ports = stats.native_media_ports(lines)
    answered = len(ports)  # the first `call-N media:` line of each call: answered
    loop = loop_ms if loop_ms is not None else loop_of(logs)
    speech_ms = campaign_join.speech_span_ms(int(LEAD_S * 1000), loop, int(TAIL_S * 1000))
    pcap = logs / "rtp.pcap"
    wire = caller_packets(stats.read_pcap(pcap), ports) if pcap.exists() else None
    result = dict(base or {})
    if base is not None:  # what the run's own join said, beside this one
        result["joined_before"] = {
            k: base[k] for k in ("utterances", "tool_requests", "unexplained") if k in base
        }
    expected = int(result.get("plan", {}).get("calls") or len(f.calls))
    result.update(figures(f, answered=answered, expected=expected))
    result.update(cases(lines, f, events, logs, loop, speech_ms, wire))
    result["rejoined"] = {"logs": str(logs), "loop_ms": loop, "speech_ms": speech_ms}
    result["ok"] = result_ok(result)
    return result


def caller_packets(packets: Iterable[stats.Packet], ports: dict[int, str]) -> dict[str, list[float]]:
    """When each of the caller's RTP packets reached each call's port (capture time, unix s), sorted."""
    out: dict[str, list[float]] = defaultdict(list)
    for p in packets:
        if p.dport in ports:
            out[ports[p.dport]].append(p.t)
    for times in out.values():
        times.sort()
    return dict(out)


def udp_rcvbuf_errors() -> int | None:
    """The host's UDP datagrams dropped for a full receive buffer so far (/proc/net/snmp), None if unknown."""
    try:
        head, values = [
            line.split()
            for line in Path("/proc/net/snmp").read_text().splitlines()
            if line.startswith("Udp:")
        ][:2]
        return int(values[head.index("RcvbufErrors")])
    except (OSError, ValueError, IndexError):
        return None


def keep_logs(work: Path, logs: Path) -> None:
    """The files a flagged case is traced in: the bridge's log, the fakes' notes, the application's events and
    the injections."""
    logs.mkdir(parents=True, exist_ok=True)
    for path in work.iterdir():
        if path.name in ("bridge.log", "faults.txt", "application.jsonl", "speech.ul") or path.name.endswith(
            ".notes.jsonl"
        ):
            shutil.copy2(path, logs / path.name)


@dataclass(frozen=True)
class Sample:
    at_s: float  # since the last call was answered
    rss_mb: float
    fds: int
    cpu_s: float  # the bridge's utime + stime so far
    load: float  # the machine's 1-minute load average (other work on the machine shows here)
    held: dict[str, float]  # parlora_engine_held by resource
    lateness: dict[float, float]  # parlora_pacing_lateness_seconds cumulative bucket counts by upper bound
    late: dict[str, float] = field(default_factory=dict)  # parlora_media_clock_late_ticks_total by cause
    clock: dict[str, int] = field(default_factory=dict)  # GET /sip's clock_late_* and clock_gc_* counters
    # outside views of scheduling: the bridge's main thread's run-queue wait so far (/proc/PID/schedstat, ns),
    # and per CPU the jiffies busy, stolen by the hypervisor and in all (/proc/stat)
    runq_wait_ns: int = 0
    cpus: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    heap: dict[str, float] = field(default_factory=dict)  # parlora_heap by figure (bridge/server/heap.py)


def read_schedstat_wait_ns(text: str) -> int:
    """/proc/PID/schedstat: "run_ns wait_ns timeslices"; the time spent runnable on a run queue, not running."""
    return int(text.split()[1])


def read_cpu_jiffies(text: str) -> dict[str, tuple[int, int, int]]:
    """/proc/stat's per-CPU lines -> {"cpu0": (busy, steal, total)} jiffies (busy: all but idle, iowait, steal)."""
    out = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu" and len(fields) >= 8:
            v = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            out[name] = (v[0] + v[1] + v[2] + v[5] + v[6], v[7], sum(v))
    return out


def parse_sample(
    at_s: float, rss_mb: float, fds: int, cpu_s: float, load: float, metrics: str, sip: str = "{}"
) -> Sample:
    """One sample of the bridge: its RSS, open fds, three metrics families read from `metrics` text and the
    media clock's late-tick and collector counters from `sip` (GET /sip's JSON)."""
    held: dict[str, float] = {}
    lateness: dict[float, float] = {}
    late: dict[str, float] = {}
    heap: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name == "parlora_engine_held":
                held[s.labels["resource"]] = s.value
            elif s.name == "parlora_pacing_lateness_seconds_bucket":
                lateness[float(s.labels["le"])] = s.value
            elif s.name == "parlora_media_clock_late_ticks_total":
                late[s.labels["cause"]] = s.value
            elif s.name == "parlora_heap":
                heap[s.labels["figure"]] = s.value
    return Sample(
        round(at_s, 1),
        round(rss_mb, 2),
        fds,
        cpu_s,
        round(load, 2),
        held,
        lateness,
        late,
        clock_counters(sip),
        heap=heap,
    )


def clock_counters(sip: str) -> dict[str, int]:
    """The media clock's late-tick and collector counters (`clock_late_*`, `clock_gc_*`, prefix dropped) in
    GET /sip's JSON (its `counters`); {} when there are none."""
    try:
        counters = json.loads(sip).get("counters", {})
    except (ValueError, AttributeError):
        return {}
    if not isinstance(counters, dict):
        return {}
    return {
        k.removeprefix("clock_"): int(v)
        for k, v in counters.items()
        if k.startswith(("clock_late_", "clock_gc_")) and isinstance(v, int)
    }


def late_figures(before: Sample | None, after: Sample) -> dict[str, Any]:
    """The media clock's late ticks between two samples (or since start): by cause (over 5 ms, and over 20 ms),
    the late time each cause explains, gc-caused ticks by generation and the collections the clock saw."""
    b = before.clock if before is not None else {}
    a = after.clock

    def grown(name: str) -> int:
        return a.get(name, 0) - b.get(name, 0)

    return {
        "by_cause": {c: grown(f"late_ticks_{c}") for c in LATE_CAUSES},
        "over_20ms_by_cause": {c: grown(f"late_ticks_20ms_{c}") for c in LATE_CAUSES},
        "spent_ms_by_cause": {c: grown(f"late_spent_ms_{c}") for c in LATE_CAUSES},
        "gc_caused_by_gen": [grown(f"late_ticks_gc_gen{g}") for g in range(3)],
        "gc_collections_by_gen": [grown(f"gc_collections_gen{g}") for g in range(3)],
        "gc_ms_by_gen": [grown(f"gc_ms_gen{g}") for g in range(3)],
    }


def _p99_bound_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The upper bound (ms) of the bucket holding the 99th percentile of the ticks between two samples."""
    bounds = sorted(after)
    deltas = [after[b] - before.get(b, 0.0) for b in bounds]  # cumulative counts, so deltas are cumulative
    total = deltas[-1] if deltas else 0.0
    if total <= 0:
        return None
    for bound, count in zip(bounds, deltas, strict=True):
        if count >= 0.99 * total:
            return round(bound * 1000, 2) if bound != float("inf") else float("inf")
    return None


def _per_hour(samples: Sequence[Sample], ys: Sequence[float]) -> float | None:
    """The least-squares slope of `ys` (one per sample) per hour of the samples' `at_s`."""
    if len(samples) < 2:
        return None
    xs = [s.at_s / 3600 for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var, 2) if var else None


def sample_figures(samples: Sequence[Sample]) -> dict[str, Any]:
    """Over time: RSS growth per hour (a least-squares slope over the samples after the first fifth of the
    run, so start-up allocation does not count), open fds, what the engine holds, and the media clock's
    lateness p99 in each interval between samples."""
    if len(samples) < 2:
        return {"samples": len(samples)}
    settled = samples[len(samples) // 5 :]
    slope = _per_hour(settled, [s.rss_mb for s in settled])
    in_use = [s.heap.get("malloc_in_use", 0) / 1e6 for s in settled]
    blocks = [s.heap.get("python_blocks", 0) / 1e3 for s in settled]
    pairs = list(itertools.pairwise(samples))
    p99 = [_p99_bound_ms(a.lateness, b.lateness) for a, b in pairs]
    cpu = [round(100 * (b.cpu_s - a.cpu_s) / (b.at_s - a.at_s), 1) for a, b in pairs if b.at_s > a.at_s]
    return {
        "samples": len(samples),
        "sample_every_s": round(samples[1].at_s - samples[0].at_s, 1),
        "rss_mb_first_last": [samples[0].rss_mb, samples[-1].rss_mb],
        "rss_growth_mb_per_hour": slope,
        # the curve, not only its slope: a bound filling levels off, a leak does not
        "rss_mb_by_sample": [s.rss_mb for s in samples],
        # live data apart from fragmentation (bridge/server/heap.py): a leak grows the first two, a
        # fragmenting heap the third (which the bridge's trim once a minute gives back)
        "heap_by_sample": {
            "malloc_in_use_mb": [round(s.heap.get("malloc_in_use", 0) / 1e6, 2) for s in samples],
            "python_blocks_k": [round(s.heap.get("python_blocks", 0) / 1e3, 1) for s in samples],
            "malloc_free_mb": [round(s.heap.get("malloc_free", 0) / 1e6, 2) for s in samples],
        },
        "malloc_in_use_growth_mb_per_hour": _per_hour(settled, in_use),
        "python_blocks_growth_k_per_hour": _per_hour(settled, blocks),
        "fds_first_last": [samples[0].fds, samples[-1].fds],
        "held_first_last": [samples[0].held, samples[-1].held],
        "pacing_p99_ms_by_interval": p99,
        "pacing_p99_ms_worst_interval": max((v for v in p99 if v is not None), default=None),
        "bridge_cpu_pct_by_interval": cpu,  # of one core (100 = a whole core)
        "host_load_by_sample": [s.load for s in samples],
        # the media clock's late ticks by cause in each interval (beside its pacing p99)
        "late_by_cause_by_interval": [
            {c: int(b.late.get(c, 0) - a.late.get(c, 0)) for c in LATE_CAUSES} for a, b in pairs
        ],
        "late_detail_by_interval": [late_figures(a, b) for a, b in pairs],
        # the kernel's view: the bridge's main thread's run-queue wait (ms a second: runnable, not running) and
        # each CPU's busy and stolen share (% of its time) in each interval
        "bridge_runq_wait_ms_per_s_by_interval": [
            round((b.runq_wait_ns - a.runq_wait_ns) / 1e6 / (b.at_s - a.at_s), 1)
            for a, b in pairs
            if b.at_s > a.at_s
        ],
        "cpu_busy_steal_pct_by_interval": [cpu_shares(a, b) for a, b in pairs],
    }


def cpu_shares(a: Sample, b: Sample) -> dict[str, list[float]]:
    """Per CPU, [busy %, steal %] of its time between two samples."""
    out = {}
    for name, (busy, steal, total) in b.cpus.items():
        busy0, steal0, total0 = a.cpus.get(name, (0, 0, 0))
        span = total - total0
        if span > 0:
            out[name] = [round(100 * (busy - busy0) / span, 1), round(100 * (steal - steal0) / span, 1)]
    return out


def rtp_gap_figures(packets: Sequence[stats.Packet] | None, ports: dict[int, str]) -> dict[str, Any]:
    """The largest interval between two RTP packets of one stream the bridge sent to a caller (one stream per
    call's local port and SSRC; the stream's first packet to its last)."""
    if packets is None or not ports:
        return {"rtp_gap_max_ms": None, "rtp_gap_note": "no capture"}
    per_stream = stats.rtp_intervals_ms(packets, set(ports), 0.0, float("inf"))
    by_call: dict[str, float] = {}
    for (port, _ssrc), values in per_stream.items():
        if values:
            call = ports[port]
            by_call[call] = max(by_call.get(call, 0.0), max(values))
    worst = max(by_call.items(), key=lambda kv: kv[1]) if by_call else None
    pooled = [v for values in per_stream.values() for v in values]
    return {
        "rtp_gap_max_ms": round(worst[1], 1) if worst else None,
        "rtp_gap_worst_call": worst[0] if worst else None,
        "rtp_interval_p99_ms": round(percentile(pooled, 99) or 0.0, 1) if pooled else None,
        "rtp_streams": len(per_stream),
        "rtp_ssrc_changes": len(per_stream) - len({p for p, _ in per_stream}),
    } | rtp_continuity_figures(packets, set(ports))


def rtp_continuity_figures(packets: Sequence[stats.Packet], bridge_ports: set[int]) -> dict[str, Any]:
    """What the headers of the RTP the bridge sent to the callers say, with no arrival gap (peers.rtp_continuity,
    per stream: local port and SSRC, PCMU/PCMA at 8 kHz): `rtp_seq_breaks` and `rtp_odd_steps` over every
    stream; `rtp_skipped_run_max_ms`, the longest run of slots one timestamp step gave up (the media clock
    skips the slots of a stall: rtp/pacer.py); `rtp_clock_behind_max_ms`, the most a stream's timestamps fell
    behind the capture's span (a stream that stopped and went on where it stopped, which no step shows)."""
    headers: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    first_last: dict[tuple[int, int], list[float]] = {}
    for p in packets:
        rtp = stats.parse_rtp(p.payload) if p.sport in bridge_ports else None
        if rtp is None or rtp.pt >= 96:  # telephone-event: not the audio clock
            continue
        key = (p.sport, rtp.ssrc)
        headers[key].append((rtp.seq, rtp.ts, rtp.ssrc))
        first_last.setdefault(key, [p.t, p.t])[1] = p.t
    if not headers:
        return {"rtp_seq_breaks": None, "rtp_odd_steps": None}
    breaks = odd = 0
    skipped_run = behind = 0.0
    for key, stream in headers.items():
        c = peers.rtp_continuity(stream)
        breaks += c.seq_breaks
        odd += c.odd_steps
        steps = [(t1 - t0) % (1 << 32) for (_, t0, _), (_, t1, _) in itertools.pairwise(stream)]
        skipped_run = max(skipped_run, (max(steps, default=160) - 160) / 8)
        span_ts_ms = ((stream[-1][1] - stream[0][1]) % (1 << 32)) / 8 + 20  # the last packet's frame included
        span_wall_ms = 1000 * (first_last[key][1] - first_last[key][0]) + 20
        behind = max(behind, span_wall_ms - span_ts_ms)
    return {
        "rtp_seq_breaks": breaks,
        "rtp_odd_steps": odd,
        "rtp_skipped_run_max_ms": round(skipped_run, 1),
        "rtp_clock_behind_max_ms": round(behind, 1),
    }


# --- the run --------------------------------------------------------------------------------------------------


def _get(url: str, context: ssl.SSLContext | None, timeout: float = 3.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout, context=context) as response:  # loopback only
        body: bytes = response.read()
        return body.decode()


@dataclass
class FakeRun:
    protocol: str
    fake: conftest.Fake
    control: str  # the fake's own HTTP base URL (/_connections, /_fault)
    context: ssl.SSLContext | None
    calls: int
    highest: int = 0  # the highest connection index seen open
    first_seen: dict[int, float] = field(default_factory=dict)  # connection index -> when first seen open


class Application:
    """The application, as the bridge's webhook (bridge/server/webhook.py): every POST kept (`t` when it came, unix s,
    and its JSON body) and written to `path` as a line; a job is answered at once."""

    def __init__(self, path: Path) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")  # closed by stop()
        app = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    data = json.loads(body)
                except ValueError:
                    data = {"raw": body.decode("utf-8", "replace")}
                app.keep({"t": round(time.time(), 4), "body": data})
                answer = b'{"output": "Order 42 ships tomorrow."}' if "job_id" in data else b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def keep(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)
            self._file.write(json.dumps(event, separators=(",", ":")) + "\n")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        with self._lock:
            self._file.close()


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the bridge and the fakes: this tree's code first (`python -m bridge` with the
    repository root on PYTHONPATH, whatever is installed in the interpreter's environment)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return conftest._clean_env({"PYTHONPATH": path} | (extra or {}))


def spawn_fake(protocol: str, work: Path, script: Path, cpus: str | None = None) -> peers.ManagedProcess:
    port = peers.free_udp_port(also_tcp=True)
    argv = [*conftest.BRIDGE, "fake-provider", "--protocol", protocol, "--listen", f"127.0.0.1:{port}"]
    argv += ["--script", str(script), "--notes", str(work / f"fake-{protocol}.notes.jsonl")]
    return peers.ManagedProcess(pinned(argv, cpus), cwd=work, env=child_env(), name=f"fake-{protocol}")


def fake_ready(protocol: str, proc: peers.ManagedProcess, work: Path) -> FakeRun:
    match = proc.wait_for(r"listening on (wss?://\S+)", timeout=30)
    cert = re.search(r"generated a self-signed TLS pair: cert (\S+)", proc.stdout + proc.stderr)
    url = match.group(1).replace("127.0.0.1", "localhost") if cert else match.group(1)
    fake = conftest.Fake(proc, url, work / f"fake-{protocol}.notes.jsonl", cert.group(1) if cert else None)
    context = ssl.create_default_context(cafile=fake.cert) if fake.cert else None
    scheme, _, authority = url.split("/", 3)[:3]
    return FakeRun(protocol, fake, scheme.replace("ws", "http", 1) + "//" + authority, context, 0)


def write_config(
    work: Path, plan: Plan, fakes: dict[str, FakeRun], sip: int, http: int, rtp: int, webhook: str
) -> Path:
    lines = [
        "[listeners]",
        f'sip_udp = "127.0.0.1:{sip}"',
        f'http = "127.0.0.1:{http}"',
        "[engine]",
        'name = "native"',
        f"max_calls = {plan.calls + 10}",
        f'rtp_ports = "{rtp}-{rtp + 4 * plan.calls + 40}"',
        "[defaults]",
        'provider = "openai-live"',
        'instructions = "You answer order questions. Look the order up first."',
        "[webhook]",
        f'url = "{webhook}"',
    ]
    for protocol, run in fakes.items():
        lines += [
            f"[providers.{protocol}]",
            f'key_env = "{PROVIDERS[protocol][1]}"',
            f'url = "{run.fake.url}"',
        ]
        if run.fake.cert:
            lines.append(f'ca = "{run.fake.cert}"')
    for protocol, (number, _) in PROVIDERS.items():
        lines += ["[[routes]]", f'name = "{protocol}"', f'number = "{number}"', f'provider = "{protocol}"']
    path = work / "bridge.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def start_sipp(
    work: Path, number: str, calls: int, sip_port: int, call_ms: int, tag: str, cpus: str | None = None
) -> peers.ManagedProcess:
    argv = [
        "sipp", "-sf", str(peers.SCENARIOS / "uac_stream.xml"), "-s", number, f"127.0.0.1:{sip_port}",
        "-i", "127.0.0.1", "-mi", "127.0.0.1", "-p", str(peers.free_udp_port()),
        "-mp", str(peers._free_udp_port_pair()), "-m", str(calls), "-l", str(calls), "-r", "10",
        "-d", str(call_ms), "-nostdin", "-timeout", f"{call_ms // 1000 + 60}s",
        "-trace_logs", "-log_file", str(work / f"sipp-{tag}.log"),
    ]  # fmt: skip
    return peers.ManagedProcess(pinned(argv, cpus), cwd=work, name=f"sipp-{tag}")


def inject_faults(plan: Plan, fakes: dict[str, FakeRun], deadline: float, history: list[str]) -> Counter[str]:
    """Inject plan.faults faults at plan.pace_s, each into an open connection of a fake picked by its calls."""
    rng = random.Random(plan.seed)
    names = [p for p, r in fakes.items() if r.calls]
    weights = [fakes[p].calls for p in names]
    injected: Counter[str] = Counter()
    fatal_left = max(1, plan.calls // 4)
    survivable = [(k, w) for k, w in KINDS if k.split(":")[0] not in FATAL_KINDS]
    next_at = time.monotonic()
    for _attempt in range(20 * plan.faults):  # an attempt that finds no connection to hit retries 50 ms later
        if sum(injected.values()) >= plan.faults or time.monotonic() > deadline:
            break
        time.sleep(max(0.0, next_at - time.monotonic()))  # pacing, not a check
        next_at = time.monotonic() + 0.05
        run = fakes[rng.choices(names, weights)[0]]
        try:
            open_now = json.loads(_get(f"{run.control}/_connections", run.context))["open"]
        except (OSError, ValueError) as exc:
            history.append(f"{time.time():.3f} {run.protocol} _connections failed: {exc!r}")
            continue
        now = time.monotonic()
        for index in open_now:
            run.first_seen.setdefault(index, now)
        run.highest = max(run.highest, *open_now) if open_now else run.highest
        open_now = [i for i in open_now if now - run.first_seen[i] >= MIN_AGE_S]
        if not open_now:
            continue
        kinds = KINDS if fatal_left > 0 else survivable
        kind = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        name = kind.split(":")[0]
        fatal_left -= name in FATAL_KINDS
        victim = rng.choice(open_now)
        specs = (
            [f"{run.highest + 1}/{kind}", f"{victim}/abrupt_close"]
            if name in NEXT_KINDS
            else [f"{victim}/{kind}"]
        )
        query = "&".join(f"spec={s}" for s in specs)
        try:
            answer = _get(f"{run.control}/_fault?{query}", run.context)
        except OSError as exc:
            history.append(f"{time.time():.3f} {run.protocol} _fault failed: {exc!r}")
            continue
        if answer != "ok\n":
            raise RuntimeError(f"{run.protocol} refused fault {specs}: {answer!r}")
        injected[name] += 1
        next_at += plan.pace_s - 0.05
        history.append(f"{time.time():.3f} {run.protocol} {' '.join(specs)} open={open_now}")
    return injected


def metrics_totals(text: str, names: Sequence[str]) -> dict[str, float]:
    """Sums of the samples of each named metric in a Prometheus text exposition (labels summed over)."""
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        for name in names:
            if line.startswith(name + "{") or line.startswith(name + " "):
                totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def run(plan: Plan, work: Path, logs: Path | None = None) -> dict[str, Any]:
    procs: list[peers.ManagedProcess] = []
    history: list[str] = []
    samples: list[Sample] = []
    result: dict[str, Any] = {"seed": plan.seed, "plan": plan.__dict__ | {"call_ms": plan.call_ms}}
    result["load_before"] = [round(x, 2) for x in os.getloadavg()]
    drops_before = udp_rcvbuf_errors()
    bridge_cpus, peer_cpus = plan.pin if plan.pin is not None else (None, None)
    result["pinned"] = None if plan.pin is None else {"bridge": bridge_cpus, "peers": peer_cpus}
    if peer_cpus is not None:  # the harness (injector, sampler, analysis) is a peer too
        os.sched_setaffinity(0, cpu_list(peer_cpus))
    t_start = time.monotonic()
    bridge: peers.ManagedProcess | None = None
    app: Application | None = None
    try:
        script = work / "script.json"
        script.write_text(json.dumps(SCRIPT))
        speech = peers.make_utterance(
            work / "speech.wav", SENTENCE, lead_silence_s=LEAD_S, tail_silence_s=TAIL_S, ulaw=True
        )
        assert speech.ulaw_path is not None  # ulaw=True
        audio = speech.ulaw_path.read_bytes()
        (work / "speech.ul").write_bytes(audio)
        loop_ms = len(audio) // 8  # µ-law at 8 kHz: 8 bytes a millisecond
        spawned = {p: spawn_fake(p, work, script, peer_cpus) for p in PROVIDERS}  # all four start at once
        procs += spawned.values()
        fakes = {p: fake_ready(p, proc, work) for p, proc in spawned.items()}
        share = [plan.calls // 4 + (i < plan.calls % 4) for i in range(4)]
        for run_, n in zip(fakes.values(), share, strict=True):
            run_.calls = n
        sip, http, rtp = peers.free_udp_port(), peers.free_udp_port(also_tcp=True), peers.free_rtp_port()
        app = Application(work / "application.jsonl")
        config = write_config(work, plan, fakes, sip, http, rtp, app.url)
        keys = {key: "sk-campaign" for _, key in PROVIDERS.values()}
        env = child_env(keys | {"PARLORA_WEBHOOK_SECRET": WEBHOOK_SECRET} | dict(plan.bridge_env))
        argv = [
            *conftest.BRIDGE,
            "serve",
            "--config",
            str(config),
            "--drain-timeout",
            "0",
            "--log-level",
            "info",
            # SIPp's callers answer no re-INVITE or UPDATE: the bridge's session refresh at half the default
            # 1,800 s would meet a 408 and end every call at minute 15 of the long run (RFC 4028 §10, as a real
            # call should end); the campaign is about the conversation, the session-timer tests are elsewhere
            "--session-expires",
            "0",
        ]
        # rollover ages on the command line: the file takes no cap under a minute (bridge/cli/config.py)
        argv += [
            "--session-cap-ms",
            str(plan.session_cap_ms),
            "--rollover-after-ms",
            str(plan.rollover_after_ms),
        ]
        argv += ["--rollover-deadline-ms", str(plan.rollover_deadline_ms)]
        argv += ["--rollover-hard-stop-ms", str(plan.rollover_hard_stop_ms)]
        if plan.record:
            (work / "recordings").mkdir(exist_ok=True)
            argv += ["--record", str(work / "recordings")]
        argv = pinned(argv, bridge_cpus)
        if plan.bridge_nice is not None:  # nice execs the rest: the PID stays the bridge's
            argv = ["nice", "-n", str(plan.bridge_nice), *argv]
        bridge = peers.ManagedProcess(argv, cwd=work, env=env, name="parlora-bridge")
        procs.append(bridge)
        bridge.wait_for(conftest.READY.pattern, timeout=30)
        if plan.capture:
            capture = peers.ManagedProcess(
                pinned(
                    [
                        "tshark",
                        "-i",
                        "lo",
                        "-f",
                        f"udp portrange {rtp}-{rtp + 4 * plan.calls + 40}",
                        "-F",
                        "pcap",
                        "-w",
                        str(work / "rtp.pcap"),
                    ],
                    peer_cpus,
                ),
                cwd=work,
                name="tshark",
            )
            procs.append(capture)
            capture.wait_for(r"Capturing on", 20)
        callers = []
        for (protocol, (number, _)), n in zip(PROVIDERS.items(), share, strict=True):
            if n:
                callers.append(start_sipp(work, number, n, sip, plan.call_ms, protocol, peer_cpus))
        procs += callers
        answered = _wait_count(bridge, r"call \S+ media:", plan.calls, 20 + plan.calls / 10)
        fault_deadline = time.monotonic() + plan.call_ms / 1000 - 10
        sampler = threading.Thread(
            target=sample_bridge, args=(bridge, http, plan.sample_s, fault_deadline, samples), daemon=True
        )
        sampler.start()
        injected = inject_faults(plan, fakes, fault_deadline, history)
        sampler.join(plan.sample_s + 5)
        result["faults_injected"] = sum(injected.values())
        result["faults_by_kind"] = dict(sorted(injected.items()))
        for caller in callers:
            caller.wait(timeout=max(1.0, plan.call_ms / 1000 - (time.monotonic() - t_start) + 40))
        _wait_count(bridge, r"call \S+ ended after", answered, 20)
        metrics = _get(f"http://127.0.0.1:{http}/metrics", None)
        (work / "metrics.txt").write_text(metrics)
        final = parse_sample(0.0, 0.0, 0, 0.0, 0.0, metrics, _get(f"http://127.0.0.1:{http}/sip", None))
        result["late_ticks"] = late_figures(None, final) | {  # the whole run's, by cause
            "max_us_by_cause": {c: final.clock.get(f"late_max_us_{c}", 0) for c in LATE_CAUSES},
            "gc_max_us_by_gen": [final.clock.get(f"gc_max_us_gen{g}", 0) for g in range(3)],
            "gc_max_cpu_us_by_gen": [final.clock.get(f"gc_max_cpu_us_gen{g}", 0) for g in range(3)],
            "gc_heap_blocks_at_gen2": final.clock.get("gc_heap_blocks_at_gen2", 0),
            "own_worst": {
                k: final.clock.get(f"late_own_worst_{k}", 0) for k in ("run_us", "channels", "phase")
            },
            "threshold_us": final.clock.get("late_threshold_us"),
        }
        result["metrics"] = metrics_totals(
            metrics,
            [
                "parlora_recoveries_total",
                "parlora_rollovers_total",
                "parlora_jobs_total",
                "parlora_calls_total",
            ],
        )
        if plan.capture:
            capture.stop(term_timeout=5.0)
        drops = udp_rcvbuf_errors()
        result["udp_rcvbuf_errors"] = None if drops is None or drops_before is None else drops - drops_before
        lines = [ln.text for ln in bridge.lines]
        log_figures = read_log(lines)
        result.update(figures(log_figures, answered=answered, expected=plan.calls))
        ports, pcap = stats.native_media_ports(lines), work / "rtp.pcap"
        packets = stats.read_pcap(pcap) if plan.capture and pcap.exists() else None
        speech_ms = campaign_join.speech_span_ms(int(LEAD_S * 1000), loop_ms, int(TAIL_S * 1000))
        wire = None if packets is None else caller_packets(packets, ports)
        result.update(cases(lines, log_figures, app.events, work, loop_ms, speech_ms, wire))
        result.update(rtp_gap_figures(packets, ports))
        result["over_time"] = sample_figures(samples)
    finally:
        for proc in reversed(procs):
            proc.stop(term_timeout=10.0 if proc is bridge else 3.0)
        (work / "faults.txt").write_text("\n".join(history) + "\n")
        if app is not None:
            app.stop()
        if bridge is not None:
            (work / "bridge.log").write_text(bridge.stderr)
        if logs is not None:
            keep_logs(work, logs)
            result["logs"] = str(logs)
    result["seconds"] = round(time.monotonic() - t_start, 1)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["ok"] = result_ok(result)
    return result


def sample_bridge(
    bridge: peers.ManagedProcess, http: int, every_s: float, until: float, out: list[Sample]
) -> None:
    """Every `every_s` until `until` (monotonic), a Sample of the bridge (a thread beside the injector)."""
    start = time.monotonic()
    for i in range(int((until - start) / every_s) + 2):  # bounded by the window
        now = time.monotonic()
        if now > until or not bridge.running():
            return
        try:
            rss = stats.proc_status_rss_mb(Path(f"/proc/{bridge.pid}/status").read_text()) or 0.0
            fds = len(os.listdir(f"/proc/{bridge.pid}/fd"))
            cpu = stats.proc_stat_cpu_seconds(Path(f"/proc/{bridge.pid}/stat").read_text(), TICKS)
            # ?heap=walk: glibc's heap figures of this sample (a plain scrape walks at most once a minute)
            metrics = _get(f"http://127.0.0.1:{http}/metrics?heap=walk", None)
            sip = _get(f"http://127.0.0.1:{http}/sip", None)
            sample = parse_sample(now - start, rss, fds, cpu, os.getloadavg()[0], metrics, sip)
            wait = read_schedstat_wait_ns(Path(f"/proc/{bridge.pid}/schedstat").read_text())
            out.append(
                replace(sample, runq_wait_ns=wait, cpus=read_cpu_jiffies(Path("/proc/stat").read_text()))
            )
        except (OSError, ValueError):
            pass  # the bridge went away between the check and the read; the loop's check says so next
        time.sleep(max(0.0, start + (i + 1) * every_s - time.monotonic()))  # pacing, not a check


def _wait_count(proc: peers.ManagedProcess, pattern: str, count: int, timeout: float) -> int:
    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while True:
        seen = sum(1 for line in proc.lines if rx.search(line.text))
        if seen >= count or time.monotonic() >= deadline or not proc.running():
            return seen
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 calls, 100 faults (CI)")
    parser.add_argument("--calls", type=int)
    parser.add_argument("--faults", type=int)
    parser.add_argument("--pace", type=float, help="seconds between faults")
    parser.add_argument("--session-cap-ms", type=int)
    parser.add_argument(
        "--seed", type=int, default=int(os.environ.get("PARLORA_CAMPAIGN_SEED", random.randrange(1 << 30)))
    )
    parser.add_argument("--no-capture", action="store_true", help="no tshark (no RTP gap figure)")
    parser.add_argument(
        "--long", action="store_true", help="the long run: 100 calls held 30 min, 800 faults, no capture"
    )
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, pcap, faults)")
    parser.add_argument(
        "--pin",
        default=None,
        help="pin with taskset, as run.py's --pin: auto (the bridge on the last CPU; the fakes, SIPp, tshark and "
        "this harness on the others) or BRIDGE:PEERS CPU lists, e.g. 1:0",
    )
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    parser.add_argument(
        "--logs",
        type=Path,
        default=None,
        help="keep the bridge's log, the fakes' notes, the application's events and faults.txt here (default: "
        "the temporary directory's parlora-campaign-SEED)",
    )
    parser.add_argument(
        "--bridge-nice",
        type=int,
        default=None,
        metavar="N",
        help="run the bridge under nice -n N (e.g. -10, as root: does a higher CPU share cut its late ticks?)",
    )
    parser.add_argument(
        "--bridge-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="more environment for the bridge (repeatable), e.g. PYTHONPATH=DIR for a sitecustomize.py that "
        "sets gc thresholds",
    )
    parser.add_argument(
        "--record", action="store_true", help="record every call (serve --record into the working directory)"
    )
    parser.add_argument(
        "--rejoin",
        type=Path,
        default=None,
        metavar="DIR",
        help="start nothing: join the kept logs in DIR (a run's --logs) again and print the figures",
    )
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --rejoin: the run's own JSON, whose other figures (plan, samples, metrics) are kept",
    )
    parser.add_argument(
        "--loop-ms", type=int, default=None, help="with --rejoin: the caller's loop (default: DIR/speech.ul)"
    )
    parser.add_argument(
        "--trim-flagged",
        action="store_true",
        help="list in `flagged` every case but the requests withheld by rule (all counted in `flagged_by_kind`)",
    )
    args = parser.parse_args(argv)
    if args.rejoin is not None:
        base = json.loads(args.base.read_text()) if args.base is not None else None
        result = rejoin(args.rejoin, base, args.loop_ms)
        if args.trim_flagged:
            result = trim_flagged(result)
        text = json.dumps(result, indent=2, sort_keys=True)
        print(text)
        if args.output:
            args.output.write_text(text + "\n")
        return 0 if result["ok"] else 1
    bridge_env = parse_bridge_env(args.bridge_env, parser)
    try:
        pin = parse_pin(args.pin, os.cpu_count() or 1) if args.pin else None
    except ValueError as exc:
        parser.error(str(exc))
    d = LONG if args.long else QUICK if args.quick else FULL
    cap = int(args.session_cap_ms or d["cap"])
    scale = cap / d["cap"]
    plan = Plan(
        calls=args.calls or int(d["calls"]),
        faults=args.faults if args.faults is not None else int(d["faults"]),
        pace_s=args.pace or d["pace_s"],
        session_cap_ms=cap,
        rollover_after_ms=int(d["after"] * scale),
        rollover_deadline_ms=int(d["deadline"] * scale),
        rollover_hard_stop_ms=int(d["stop"] * scale),
        seed=args.seed,
        capture=not (args.no_capture or args.long),
        hold_s=d.get("hold_s"),
        pin=pin,
        bridge_nice=args.bridge_nice,
        bridge_env=tuple(bridge_env),
        record=args.record,
    )
    print(
        f"fault campaign seed {plan.seed}: {plan.calls} calls, {plan.faults} faults",
        file=sys.stderr,
        flush=True,
    )
    logs = args.logs or Path(tempfile.gettempdir()) / f"parlora-campaign-{plan.seed}"

    def run_it(work: Path) -> dict[str, Any]:
        result = run(plan, work, logs)
        return trim_flagged(result) if args.trim_flagged else result

    return run_in_scratch(run_it, "parlora-campaign-", keep=args.keep, output=args.output)


if __name__ == "__main__":
    sys.exit(main())
