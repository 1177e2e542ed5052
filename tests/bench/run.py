"""The benchmark of `parlora-bridge serve`: one command, run by hand, not part of CI.

    .venv/bin/python tests/bench/run.py [--engine NAME] [--quick] [--steps 1,2,3,4] [--seconds S] [--no-probe] [--keep]
        [--paths compiled,pure] [--pin auto --pin off]

`--engine` (default pjsua2) is a name in sip/engine.py's registry, passed to `serve --engine`; every step of
the JSON says which engine it measured. For each load step of N concurrent calls (--quick: 1 and 4; default:
1, 2, 3, 4 — the pjsua2 wheel is compiled with PJSUA_MAX_CALLS=4, so 4 is the most one process takes) it
starts, all on 127.0.0.1 and each tracked by PID: the GPT-Live echo fake (`parlora-bridge fake-provider`,
its own process), `parlora-bridge serve` pointed at it (with PARLORA_PROBE set: rtp/probe.py), tshark on the
bridge's RTP ports and SIPp placing N calls that loop a spoken µ-law file (a short question, a pause into
whose echo a longer sentence barges in, a pause into whose echo the loop barges in again). After a warm-up it measures a window of
--seconds, then makes the fake burst (`burst:10` on every open connection) so that every call overflows and
recovers, then stops everything and computes the figures below from /proc, the capture, the probe, the log
and GET /calls/{id}. tests/bench/README.md says what each figure means and how it is measured.

Prints a Markdown table and writes tests/bench/results/latest.json (one object per step; null where a figure
could not be measured, with the reason in "notes"). `--paths compiled,pure` runs each step on both media paths
of the native engine and `--pin` (repeatable, `off` for unpinned) on each pin setting, and prints the figures of
each step side by side (tests/bench/compare.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.pop("PARLORA_PROBE", None)  # the probe is switched on for the bridge process only

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
sys.path.insert(0, str(BENCH.parent / "integration"))
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

import compare  # noqa: E402
import numpy as np  # noqa: E402
import peers  # noqa: E402
import stats  # noqa: E402

from rtp.g711 import ulaw_decode  # noqa: E402
from rtp.probe import CHUNK_HEADER  # noqa: E402
from rtp.speedups import PURE_ENV  # noqa: E402
from sip.engine import DEFAULT_ENGINE, ENGINES, EngineSpec  # noqa: E402  (the registry only: no engine import)

PY = sys.executable
TICKS = os.sysconf("SC_CLK_TCK")
FAULT = "burst:10"
# CPU (% of one core) used besides the bridge in the window above which a note warns
OTHER_CPU_WARN_PCT = 40.0
RESULTS = BENCH / "results" / "latest.json"
KEYS = (
    "engine",
    "calls",
    "cpu_pct_per_call",
    "rss_mb_per_call",
    "rtp_interval_p50_ms",
    "rtp_interval_p99_ms",
    "added_latency_in_p99_ms",
    "added_latency_out_p99_ms",
    "barge_in_ms_p99",
    "recovery_ms_p99",
)


@dataclass(frozen=True)
class Config:
    steps: tuple[int, ...]
    window_s: float
    engine: str = DEFAULT_ENGINE
    warmup_s: float = 3.0
    idle_s: float = 3.0
    recovery_budget_s: float = 25.0
    probe: bool = True
    pin: tuple[str, str] | None = None  # (the bridge's CPUs, the peers' CPUs) for taskset -c, e.g. ("1", "0")
    profile: bool = False  # run the bridge under cProfile (bridge.prof in the step's directory)
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the bridge (e.g. MALLOC_MMAP_THRESHOLD_)
    gc_freeze_after_s: float | None = None  # gc.collect() + gc.freeze() this long after the bridge started
    serve_args: tuple[str, ...] = ()  # extra options of `serve` (e.g. --provider-append-ms 100)
    media_path: str | None = (
        None  # "compiled" or "pure" (rtp.speedups; PARLORA_PURE_MEDIA), None: the bridge's choice
    )


# --- processes and small I/O ---------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    return stats.proc_stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), TICKS)


def host_busy() -> float:
    return stats.host_cpu_busy_seconds(Path("/proc/stat").read_text(), TICKS)


def rss_mb(pid: int) -> float:
    return stats.proc_status_rss_mb(Path(f"/proc/{pid}/status").read_text()) or 0.0


def http_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # loopback only
        return json.loads(response.read())


def wait_count(proc: peers.ManagedProcess, pattern: str, count: int, timeout: float) -> int:
    """Wait (bounded) until `count` output lines match `pattern`; returns how many did."""
    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout
    seen = 0
    while True:
        seen = sum(1 for line in proc.lines if rx.search(line.text))
        if seen >= count or time.monotonic() >= deadline or not proc.running():
            return seen
        time.sleep(0.1)


def pinned(argv: list[str], cpus: str | None) -> list[str]:
    """`argv` under `taskset -c cpus` (taskset execs it: the PID stays the process's own)."""
    return ["taskset", "-c", cpus, *argv] if cpus else argv


def parse_bridge_env(items: list[str], parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """`--bridge-env NAME=VALUE` options as pairs; anything else is a usage error."""
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--bridge-env takes NAME=VALUE, not {item!r}")
        pairs.append((name, value))
    return pairs


def cpu_list(cpus: str) -> set[int]:
    """The CPUs of a `taskset -c` list ("0", "0-2", "0,3-4"), for `os.sched_setaffinity`."""
    out: set[int] = set()
    for part in cpus.split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "PARLORA_PROBE"}
    return env | {"OPENAI_API_KEY": "sk-bench", "PYTHONUNBUFFERED": "1"}


def make_audio(work: Path) -> tuple[Path, float]:
    """The caller's loop: question (1.5 s), 1.2 s pause (its echo starts), a longer sentence (2.6 s) that barges
    into that echo, 1.2 s pause (its echo starts; the loop's next question barges into it). Returns the µ-law
    file SIPp streams (./speech.ul in its working directory) and the loop's length in seconds."""
    a = peers.make_utterance(
        work / "a.wav", "Tell me about the weather tomorrow.", lead_silence_s=0, tail_silence_s=0
    )
    b = peers.make_utterance(
        work / "b.wav",
        "No wait, I meant the weather in Lyon on Saturday.",
        lead_silence_s=0,
        tail_silence_s=0,
    )
    rate = peers.SAMPLE_RATE
    pause = np.zeros(int(1.2 * rate), dtype=np.int16)
    samples = np.concatenate([np.zeros(int(0.3 * rate), dtype=np.int16), a.speech, pause, b.speech, pause])
    wav = peers.write_wav(work / "loop.wav", samples)
    ul = peers.make_ulaw(wav, work / "speech.ul")
    return ul, len(samples) / rate


# --- one step ---------------------------------------------------------------------------------------------------


def run_step(calls: int, cfg: Config, speech_ul: Path, work: Path) -> dict[str, Any]:
    step = work / f"calls-{calls}"
    step.mkdir(parents=True)
    shutil.copy(speech_ul, step / "speech.ul")
    probe_dir = step / "probe"
    notes: list[str] = []
    procs: list[peers.ManagedProcess] = []
    raw: dict[str, Any] = {"notes": notes}
    env = clean_env()
    bridge_cpus, peer_cpus = cfg.pin if cfg.pin is not None else (None, None)
    raw["load_avg"] = [round(x, 2) for x in os.getloadavg()]  # the machine's load as the step starts
    call_ms = int(1000 * (cfg.warmup_s + cfg.window_s + cfg.recovery_budget_s + 10))
    try:
        fake_port = peers.free_udp_port(also_tcp=True)
        fake = peers.ManagedProcess(
            pinned([PY, "-m", "bridge", "fake-provider", "--listen", f"127.0.0.1:{fake_port}"], peer_cpus),
            cwd=step,
            env=env,
            name="fake-provider",
        )
        procs.append(fake)
        url = fake.wait_for(r"listening on (ws://\S+)", 30).group(1)

        sip_port = peers.free_udp_port()
        rtp_port = peers._free_udp_port_pair()
        http_port = peers.free_udp_port(also_tcp=True)
        bridge_env = env | ({"PARLORA_PROBE": str(probe_dir)} if cfg.probe else {}) | dict(cfg.env)
        if cfg.media_path is not None:  # rtp.speedups reads it at import: "1" the pure path, "" the compiled
            bridge_env[PURE_ENV] = "1" if cfg.media_path == "pure" else ""
        spec = ENGINES[cfg.engine]
        more = ["--max-calls", str(calls)] if calls > spec.default_max_calls else []
        profiler = ["-m", "cProfile", "-o", str(step / "bridge.prof")] if cfg.profile else []
        # tests/bench/launch.py runs `python -m bridge ...`, timing the garbage collector (and freezing it)
        launcher = [str(BENCH / "launch.py"), "--gc-stats", str(step / "gc.json")]
        if cfg.gc_freeze_after_s is not None:
            launcher += ["--gc-freeze-after", str(cfg.gc_freeze_after_s)]
        bridge = peers.ManagedProcess(
            pinned(
                [
                    PY,
                    *profiler,
                    *launcher,
                    "--",
                    "serve",
                    "--engine",
                    cfg.engine,
                    *more,
                    "--sip",
                    f"127.0.0.1:{sip_port}",
                    "--rtp-port",
                    str(rtp_port),
                    "--provider",
                    "openai-live",
                    "--provider-url",
                    url,
                    "--http",
                    f"127.0.0.1:{http_port}",
                    "--log-level",
                    "info",
                    "--drain-timeout",  # the step ends with SIGTERM: every call gets its BYE at once
                    "0",
                    *cfg.serve_args,
                ],
                bridge_cpus,
            ),
            cwd=step,
            env=bridge_env,
            name="parlora-bridge",
        )
        procs.append(bridge)
        bridge.wait_for(r"listening on udp", 30)
        calls_url = f"http://127.0.0.1:{http_port}/calls"
        http_json(calls_url)
        try:  # the path the bridge runs, as it says (pjsua2 has none: pjmedia carries its RTP)
            raw["media_path"] = http_json(f"http://127.0.0.1:{http_port}/sip").get("media_path")
        except OSError:  # the analysis notes it when a path was asked for
            raw["media_path"] = None

        # Idle baseline: the process listening, no call.
        c0, m0 = cpu_seconds(bridge.pid), time.monotonic()
        time.sleep(cfg.idle_s)
        raw["cpu_idle_pct"] = stats.cpu_percent(c0, cpu_seconds(bridge.pid), time.monotonic() - m0)
        raw["rss_idle_mb"] = rss_mb(bridge.pid)

        pcap = step / "rtp.pcap"
        capture = peers.ManagedProcess(
            pinned(
                [
                    "tshark",
                    "-i",
                    "lo",
                    "-f",
                    f"udp portrange {rtp_port}-{rtp_port + 2 * calls + 40}",
                    "-F",
                    "pcap",
                    "-w",
                    str(pcap),
                ],
                peer_cpus,
            ),
            cwd=step,
            name="tshark",
        )
        procs.append(capture)
        capture.wait_for(r"Capturing on", 20)

        rate = max(10, calls // 10)  # calls per second: 300 calls are up in 10 s
        scenario = step / "uac_bench.xml"
        scenario.write_text((BENCH / "uac_bench.xml").read_text().replace("__CALL_MS__", str(call_ms)))
        messages = step / "sipp_messages.log"
        sipp = peers.ManagedProcess(
            pinned(
                [
                    "sipp",
                    "-sf",
                    str(scenario),
                    "-s",
                    "bridge",
                    f"127.0.0.1:{sip_port}",
                    "-i",
                    "127.0.0.1",
                    "-mi",
                    "127.0.0.1",
                    "-p",
                    str(peers.free_udp_port()),
                    "-mp",
                    str(peers._free_udp_port_pair()),
                    "-m",
                    str(calls),
                    "-l",
                    str(calls),
                    "-r",
                    str(rate),
                    "-nostdin",
                    "-timeout",
                    f"{call_ms // 1000 + 30}s",
                    "-trace_msg",
                    "-message_file",
                    str(messages),
                    "-trace_logs",
                    "-log_file",
                    str(step / "sipp_logs.log"),
                    "-trace_err",
                    "-error_file",
                    str(step / "sipp_errors.log"),
                ],
                peer_cpus,
            ),
            cwd=step,
            name="sipp",
        )
        procs.append(sipp)
        answered = wait_count(bridge, r"call \S+ media:", calls, 30 + 2 * calls / rate)
        raw["calls_answered"] = answered
        if answered < calls:
            notes.append(f"only {answered} of {calls} calls were answered")

        time.sleep(cfg.warmup_s)  # pacing of the benchmark, not an assertion
        offset = time.time() - time.monotonic()  # capture times are wall clock, the probe's monotonic
        w0 = time.monotonic()
        cw0, hw0 = cpu_seconds(bridge.pid), host_busy()
        peers_cw0 = {p.name: cpu_seconds(p.pid) for p in procs if p is not bridge and p.running()}
        rss_samples = []
        while (left := w0 + cfg.window_s - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            rss_samples.append(rss_mb(bridge.pid))
        w1 = time.monotonic()
        cw1, hw1 = cpu_seconds(bridge.pid), host_busy()
        # the benchmark's own peers (each its own process): where the rest of the machine's CPU went
        raw["peer_cpu_pct"] = {
            p.name: round(stats.cpu_percent(peers_cw0[p.name], cpu_seconds(p.pid), w1 - w0), 1)
            for p in procs
            if p.name in peers_cw0 and p.running()
        }
        raw["host_busy_pct"] = stats.cpu_percent(hw0, hw1, w1 - w0)
        raw.update(
            window=(w0, w1),
            offset=offset,
            cpu_window_pct=stats.cpu_percent(cw0, cw1, w1 - w0),
            rss_end_mb=rss_mb(bridge.pid),
            rss_max_mb=max(rss_samples, default=None),
        )
        raw["status_window"] = http_json(calls_url).get("calls", [])

        # Recovery: every open provider connection bursts; each call overflows its reservoir and recovers.
        t_fault = time.monotonic()
        raw["t_fault"] = t_fault
        log_mark = bridge.line_count()
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{fake_port}/_fault?spec={FAULT}", timeout=2.0
            ) as r:
                r.read()
        except Exception as exc:  # reported, not fatal
            notes.append(f"could not inject {FAULT}: {exc}")
        last: dict[str, dict[str, Any]] = {}
        deadline = t_fault + cfg.recovery_budget_s
        while time.monotonic() < deadline and bridge.running():
            for status in http_json(calls_url).get("calls", []):
                last[status["call_id"]] = status
            rec = [s.get("recoveries", {}) for s in last.values()]
            if len(rec) >= answered and all(r.get("completed", 0) + r.get("failed", 0) >= 1 for r in rec):
                break
            time.sleep(0.5)
        raw["status_recovery"] = list(last.values())
        raw["recovery_log"] = [ln.text for ln in bridge.lines[log_mark:]]
    finally:
        for proc in (p for p in procs if p.name == "parlora-bridge"):
            if proc.running():
                raw["cpu_total_s"] = cpu_seconds(proc.pid)  # the bridge's CPU over its life, for the GC share
            proc.stop(term_timeout=20.0)  # SIGTERM: BYE to every call, then exit (the probe dumps at exit)
        for proc in (p for p in procs if p.name == "sipp"):
            proc.wait(10.0)
        for proc in reversed(procs):
            proc.stop(term_timeout=5.0)
    raw["bridge_log"] = [(ln.t, ln.text) for ln in bridge.lines]
    raw["bridge_rc"] = bridge.returncode
    sipp_log = step / "sipp_logs.log"
    raw["sipp_completed"] = (
        sum(
            1
            for line in sipp_log.read_text(errors="replace").splitlines()
            if line.startswith(("BYE_RECEIVED", "CLOSED"))
        )
        if sipp_log.exists()
        else None
    )
    (step / "bridge.log").write_text("\n".join(t for _, t in raw["bridge_log"]) + "\n")
    return analyse(calls, cfg, raw, step, pcap, messages, probe_dir, rtp_port)


# --- analysis ---------------------------------------------------------------------------------------------------


def analyse(
    calls: int,
    cfg: Config,
    raw: dict[str, Any],
    step: Path,
    pcap: Path,
    messages: Path,
    probe_dir: Path,
    rtp_port: int,
) -> dict[str, Any]:
    notes: list[str] = raw["notes"]
    w0, w1 = raw["window"]
    off = raw["offset"]
    t_fault = raw["t_fault"]
    out: dict[str, Any] = {"engine": cfg.engine, "calls": calls}
    out["load_avg"] = raw.get("load_avg")  # 1, 5, 15 min load averages as the step started (uptime)
    out["pinned"] = None if cfg.pin is None else {"bridge": cfg.pin[0], "peers": cfg.pin[1]}
    out["media_path"] = raw.get("media_path")  # what GET /sip said the bridge ran
    out["media_path_asked"] = cfg.media_path
    if cfg.media_path is not None and raw.get("media_path") != cfg.media_path:
        notes.append(f"media path: asked for {cfg.media_path}, the bridge ran {raw.get('media_path')}")

    # CPU and memory of the bridge process.
    answered = raw.get("calls_answered") or 0
    out["cpu_pct_per_call"] = round(raw["cpu_window_pct"] / answered, 2) if answered else None
    # a call failed unless SIPp saw it through to its end (our BYE answered, or its own BYE answered)
    completed = raw.get("sipp_completed")
    out["calls_failed"] = None if completed is None else calls - completed
    if completed is None:
        notes.append("calls failed: no SIPp log")
    out["cpu_pct_per_call_above_idle"] = (
        round((raw["cpu_window_pct"] - raw["cpu_idle_pct"]) / answered, 2) if answered else None
    )
    out["rss_mb_per_call"] = (
        round((raw["rss_end_mb"] - raw["rss_idle_mb"]) / answered, 2) if answered else None
    )
    out.update(
        cpu_pct_total=round(raw["cpu_window_pct"], 2),
        cpu_pct_idle=round(raw["cpu_idle_pct"], 2),
        rss_mb=round(raw["rss_end_mb"], 1),
        rss_idle_mb=round(raw["rss_idle_mb"], 1),
        rss_max_mb=None if raw["rss_max_mb"] is None else round(raw["rss_max_mb"], 1),
    )

    # Everything else the machine did meanwhile: the fake, SIPp, tshark and this runner take a few percent;
    # much more means other work disturbed the figures.
    others = raw["host_busy_pct"] - raw["cpu_window_pct"]
    out["other_cpu_pct"] = round(others, 1)
    out["peer_cpu_pct"] = raw.get("peer_cpu_pct", {})  # fake-provider, sipp, tshark: % of one core each
    if others > OTHER_CPU_WARN_PCT:
        notes.append(
            f"the machine was busy: {others:.0f} % of a core besides the bridge during the window "
            f"(the benchmark's own peers take a few %); CPU, RTP and latency figures are disturbed"
        )

    # Outbound RTP at the caller, from the capture.
    packets: list[stats.Packet] = []
    try:
        packets = stats.read_pcap(pcap)
    except (OSError, ValueError) as exc:
        notes.append(f"no capture: {exc}")
    answered_ports, _ = stats.sdp_audio_ports(
        messages.read_text(errors="replace") if messages.exists() else ""
    )
    bridge_ports = set(answered_ports)
    if not bridge_ports:
        bridge_ports = {rtp_port + 2 * i for i in range(calls)}
        notes.append("no SDP answers in the SIPp message log: assumed the bridge's RTP ports from --rtp-port")
    per_stream = stats.rtp_intervals_ms(packets, bridge_ports, w0 + off, w1 + off)
    gaps = [g for v in per_stream.values() for g in v]
    rtp = stats.summary(gaps, 2)
    out.update(
        rtp_interval_p50_ms=rtp["p50"],
        rtp_interval_p99_ms=rtp["p99"],
        rtp_interval_max_ms=rtp["max"],
        rtp_interval_outside_2ms_pct=(
            None if not gaps else round(stats.share_outside(gaps, 20.0, 2.0) or 0.0, 2)
        ),
        rtp_streams=len(per_stream),
        rtp_intervals=rtp["n"],
    )
    if not gaps:
        notes.append("RTP interval: no bridge RTP packets in the capture window")

    # Bridge-added latency, from the probe.
    out.update(
        added_latency_in_p50_ms=None,
        added_latency_in_p99_ms=None,
        added_latency_out_p50_ms=None,
        added_latency_out_p99_ms=None,
        added_latency_out_first_p50_ms=None,
        added_latency_out_first_p99_ms=None,
    )
    probe_files = sorted(probe_dir.glob("probe-*.json")) if cfg.probe else []
    if not cfg.probe:
        notes.append("latency: --no-probe")
    elif not probe_files:
        notes.append(
            f"latency: the bridge wrote no probe file (exit code {raw['bridge_rc']}; it dumps at a clean exit)"
        )
    else:
        probe = json.loads(probe_files[-1].read_text())
        wire: dict[str, dict[str, tuple[list[int], list[int]]]] | None = None
        if not any(points["media_in"][0] or points["media_out"][0] for points in probe["points"].values()):
            # an engine without probe hooks at its media edge (native): its media points off the wire
            ports = stats.native_media_ports(text for _, text in raw["bridge_log"])
            wire = stats.wire_points(packets, ports, off, ulaw_decode)
            notes.append(
                "latency: no probe records at the engine's media edge; media_in / media_out are the RTP packets on "
                "the wire (capture): latency in includes the jitter buffer, latency out the send path"
            )
            out["latency_points"] = "wire"
            notes.append(
                "latency out, first frame: not measured on the wire (an echoed digital silence cannot be told "
                "from the filler the engine sends without a frame)"
            )
        else:
            out["latency_points"] = "media port"
        chunk_file = probe_files[-1].with_suffix(".chunks")
        chunks = stats.read_chunks(chunk_file, CHUNK_HEADER)
        t0, t1 = int(w0 * 1e9), int(w1 * 1e9)
        lat_in: list[float] = []
        lat_out: list[float] = []
        lat_first: list[float] = []
        unpaired_in = unpaired_out = 0
        for call, points in probe["points"].items():
            if wire is not None:
                points = points | wire.get(call, {"media_in": ([], []), "media_out": ([], [])})
            got, miss = stats.match_forward(tuple(points["media_in"]), tuple(points["ws_sent"]), t0=t0, t1=t1)
            lat_in += got
            unpaired_in += miss
            if call in probe["calls"]:
                fmt = probe["formats"].get(call)
                if fmt != "audio/pcmu@8000":
                    notes.append(f"latency out: {call} received {fmt}, only PCMU is followed")
                    continue
                mine = [c for c in chunks.get(probe["calls"].index(call), []) if t0 - 10**10 <= c[0] <= t1]
                got, miss = stats.match_chunks_to_frames(
                    mine, tuple(points["media_out"]), ulaw_decode, t0=t0, t1=t1
                )
                lat_out += got
                unpaired_out += miss
                if wire is None:  # on the wire an echoed digital silence looks like the engine's filler
                    lat_first += stats.first_frame_latencies(
                        [t for t, _ in mine], points["media_out"][0], t0=t0, t1=t1
                    )
        s_in, s_out, s_first = (
            stats.summary(lat_in, 2),
            stats.summary(lat_out, 1),
            stats.summary(lat_first, 1),
        )
        out.update(
            added_latency_in_p50_ms=s_in["p50"],
            added_latency_in_p99_ms=s_in["p99"],
            added_latency_in_max_ms=s_in["max"],
            added_latency_in_n=s_in["n"],
            added_latency_in_unpaired=unpaired_in,
            added_latency_out_p50_ms=s_out["p50"],
            added_latency_out_p99_ms=s_out["p99"],
            added_latency_out_max_ms=s_out["max"],
            added_latency_out_n=s_out["n"],
            added_latency_out_unpaired=unpaired_out,
            added_latency_out_first_p50_ms=s_first["p50"],
            added_latency_out_first_p99_ms=s_first["p99"],
            added_latency_out_first_n=s_first["n"],
        )
        if not lat_in:
            notes.append("latency in: no caller frame could be followed to the WebSocket")
        if not lat_out:
            notes.append("latency out: no provider audio could be followed to a transmitted frame")

    # Barge-in: the bridge's own figure (log) and the caller's view (capture), before the fault.
    before_fault = [text for t, text in raw["bridge_log"] if t < t_fault]
    barge = stats.barge_in_reactions(before_fault)
    s_barge = stats.summary(barge, 1)
    wire_barge: list[float] = []
    for port in sorted(bridge_ports):
        wire_barge += stats.wire_barge_ins(packets, port, w0 + off - cfg.warmup_s, t_fault + off)
    s_wire = stats.summary(wire_barge, 1)
    out.update(
        barge_in_ms_p50=s_wire["p50"],
        barge_in_ms_p99=s_wire["p99"],
        barge_in_ms_max=s_wire["max"],
        barge_in_n=s_wire["n"],
        barge_in_event_ms_p50=s_barge["p50"],
        barge_in_event_ms_p99=s_barge["p99"],
        barge_in_event_n=s_barge["n"],
    )
    if not wire_barge:
        notes.append("barge-in: no caller speech onset over assistant audio found in the capture")
    if not barge:
        notes.append(
            "barge-in: no 'barge-in ... last assistant frame left X ms' line in the log before the fault"
        )

    # Recovery under the injected overflow: GET /calls/{id} while the calls were up, else the log.
    durations: list[float] = []
    reconnect: list[float] = []
    for status in raw.get("status_recovery", []):
        rec = status.get("recoveries", {})
        durations += rec.get("durations_ms", [])
        reconnect += rec.get("reconnect_ms", [])
    stages = stats.recovery_stages(raw.get("recovery_log", []))
    source = "status"
    if not durations and stages.get("done"):
        durations, source = [float(x) for x in stages["done"]], "log"
    if not reconnect:
        reconnect = [float(x) for x in stages.get("awaiting_user", [])]
    s_rec, s_con = stats.summary(durations, 0), stats.summary(reconnect, 0)
    out.update(
        recovery_ms_p50=s_rec["p50"],
        recovery_ms_p99=s_rec["p99"],
        recovery_n=s_rec["n"],
        recovery_reconnect_ms_p50=s_con["p50"],
        recovery_reconnect_ms_p99=s_con["p99"],
        recovery_causes=sorted(
            {c for s in raw.get("status_recovery", []) for c in s.get("recoveries", {}).get("by_cause", {})}
        ),
        recovery_source=source if durations else None,
    )
    failed = sum(s.get("recoveries", {}).get("failed", 0) for s in raw.get("status_recovery", []))
    if failed:
        notes.append(f"recovery: {failed} failed")
    if len(durations) < answered:
        notes.append(
            f"recovery: {len(durations)} of {answered} calls completed one within {cfg.recovery_budget_s:g} s "
            f"of {FAULT} (a call recovers only after an echo long enough to overflow, then its caller's "
            f"next turn)"
        )

    # The garbage collector over the bridge's life (tests/bench/launch.py), against the bridge's CPU then.
    gc_file = step / "gc.json"
    if gc_file.exists():
        gc_stats = json.loads(gc_file.read_text())
        gc_s = sum(gc_stats["seconds"])
        out["gc"] = gc_stats
        cpu_total = raw.get("cpu_total_s")
        out["gc_pct_of_bridge_cpu"] = round(100 * gc_s / cpu_total, 1) if cpu_total else None
    else:
        out["gc"] = out["gc_pct_of_bridge_cpu"] = None
        notes.append("gc: the bridge wrote no gc.json (it writes it at a clean exit)")

    # Session QoS at the end of the window.
    qos = [s.get("qos", {}) for s in raw.get("status_window", [])]
    out["underruns"] = sum(q.get("underruns", 0) for q in qos)
    out["notes"] = notes
    return out


# --- output -----------------------------------------------------------------------------------------------------


def fmt(value: Any, unit: str = "") -> str:
    return "—" if value is None else f"{value:g}{unit}"


def label(r: dict[str, Any]) -> str:
    """The engine, with the media path and pin setting when the run compared them."""
    extra = [r["media_path_asked"]] if r.get("media_path_asked") else []
    extra += [compare.pin_label(compare.pin_of(r.get("pinned")))] if r.get("pins_compared") else []
    return f"{r.get('engine')} ({', '.join(extra)})" if extra else str(r.get("engine"))


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| engine | calls (failed) | CPU %/call | RSS MB/call (total) | RTP interval p50 / p99 / max ms (outside 20±2) "
        "| added latency in p50 / p99 ms "
        "| added latency out p50 / p99 ms (first frame p50 / p99) | barge-in p50 / p99 ms (from the event p50 / p99) "
        "| recovery p50 / p99 ms (reconnect p50 / p99) |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {label(r)} | {r.get('calls')} ({fmt(r.get('calls_failed'))}) | {fmt(r.get('cpu_pct_per_call'))} "
            f"| {fmt(r.get('rss_mb_per_call'))} ({fmt(r.get('rss_mb'))}) "
            f"| {fmt(r.get('rtp_interval_p50_ms'))} / {fmt(r.get('rtp_interval_p99_ms'))} / {fmt(r.get('rtp_interval_max_ms'))} "
            f"({fmt(r.get('rtp_interval_outside_2ms_pct'), ' %')}) "
            f"| {fmt(r.get('added_latency_in_p50_ms'))} / {fmt(r.get('added_latency_in_p99_ms'))} "
            f"| {fmt(r.get('added_latency_out_p50_ms'))} / {fmt(r.get('added_latency_out_p99_ms'))} "
            f"({fmt(r.get('added_latency_out_first_p50_ms'))} / {fmt(r.get('added_latency_out_first_p99_ms'))}) "
            f"| {fmt(r.get('barge_in_ms_p50'))} / {fmt(r.get('barge_in_ms_p99'))} "
            f"({fmt(r.get('barge_in_event_ms_p50'))} / {fmt(r.get('barge_in_event_ms_p99'))}) "
            f"| {fmt(r.get('recovery_ms_p50'))} / {fmt(r.get('recovery_ms_p99'))} "
            f"({fmt(r.get('recovery_reconnect_ms_p50'))} / {fmt(r.get('recovery_reconnect_ms_p99'))}) |"
        )
    return "\n".join(lines)


def engine_limit(spec: EngineSpec) -> str:
    return spec.limits


DEFAULT_STEPS = {  # (quick, full) per engine; pjsua2 takes 4 calls per process at most
    "pjsua2": ((1, 4), (1, 2, 3, 4)),
    "native": ((1, 4), (1, 4, 50, 100, 200, 300)),
}


def default_steps(engine: str, quick: bool) -> tuple[int, ...]:
    quick_steps, full_steps = DEFAULT_STEPS.get(engine, ((1, 4), (1, 2, 3, 4)))
    return quick_steps if quick else full_steps


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--engine",
        default=DEFAULT_ENGINE,
        choices=sorted(ENGINES),
        help=f"SIP engine of the bridge under test (default {DEFAULT_ENGINE})",
    )
    parser.add_argument(
        "--engines",
        default=None,
        help="comma-separated engines measured one after the other, e.g. pjsua2,native (overrides --engine)",
    )
    parser.add_argument("--quick", action="store_true", help="steps 1 and 4, 20 s windows (under 10 minutes)")
    parser.add_argument(
        "--steps",
        default=None,
        help="comma-separated call counts (default: pjsua2 1,2,3,4; native 1,4,50,100,200,300; --quick 1,4)",
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="measuring window per step (default 20 quick, 40)"
    )
    parser.add_argument(
        "--no-probe", action="store_true", help="run the bridge without PARLORA_PROBE (no latencies)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the working directory (logs, capture, probe)"
    )
    parser.add_argument(
        "--pin",
        action="append",
        default=[],
        help="pin with taskset: auto (the bridge on the last CPU, SIPp, tshark and the fake on the others) "
        "or BRIDGE:PEERS CPU lists, e.g. 1:0; repeatable, `off` unpinned: each step runs on each setting",
    )
    parser.add_argument(
        "--paths",
        default=None,
        help="media paths of the native engine each step runs on, side by side: compiled,pure "
        "(PARLORA_PURE_MEDIA=1 in the bridge's environment for pure; default the bridge's own choice)",
    )
    parser.add_argument(
        "--gc-freeze",
        type=float,
        default=None,
        metavar="S",
        help="gc.collect() and gc.freeze() in the bridge S seconds after it started (before the calls)",
    )
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for `serve` (repeatable), e.g. --serve-arg=--provider-append-ms --serve-arg=100",
    )
    parser.add_argument(
        "--profile", action="store_true", help="run the bridge under cProfile (bridge.prof; use with --keep)"
    )
    parser.add_argument(
        "--bridge-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the bridge process, e.g. MALLOC_MMAP_THRESHOLD_=131072 (repeatable)",
    )
    parser.add_argument(
        "--output", type=Path, default=RESULTS, help=f"JSON results (default {RESULTS.relative_to(ROOT)})"
    )
    args = parser.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()] if args.engines else [args.engine]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}; known: {', '.join(sorted(ENGINES))}")
    plan: list[tuple[str, tuple[int, ...]]] = []
    for engine in engines:
        steps = (
            tuple(int(s) for s in args.steps.split(",")) if args.steps else default_steps(engine, args.quick)
        )
        spec = ENGINES[engine]
        if any(n < 1 or (spec.cap is not None and n > spec.cap) for n in steps):
            parser.error(f"each step must be 1..{spec.cap or 'N'}: engine {engine}: {engine_limit(spec)}")
        plan.append((engine, steps))
    try:
        pins = compare.parse_pins(args.pin, os.cpu_count() or 1) if args.pin else (None,)
        paths: tuple[str | None, ...] = compare.parse_paths(args.paths) if args.paths else (None,)
    except ValueError as exc:
        parser.error(str(exc))
    if args.paths and engines != ["native"]:
        parser.error("--paths compares the native engine's media paths: use it with --engine native")
    pin = pins[0]  # the top level's `pinned`: the first setting
    bridge_env = parse_bridge_env(args.bridge_env, parser)
    tools = ("sipp", "tshark", "sox", "espeak-ng") + (("taskset",) if any(pins) else ())
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        print(f"missing tools: {', '.join(missing)} (bash tests/run.sh installs them)", file=sys.stderr)
        return 2
    window_s = args.seconds or (20.0 if args.quick else 40.0)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="parlora-bench-"))
    for engine, steps in plan:
        print(
            f"engine {engine}: {engine_limit(ENGINES[engine])}; steps {', '.join(map(str, steps))}; {window_s:g} s "
            f"window; working directory {work}",
            flush=True,
        )
    rows: list[dict[str, Any]] = []
    loop_s = 0.0
    try:
        speech, loop_s = make_audio(work)
        for engine, steps, pin_i, n, path in (
            (e, e_steps, i, n, path)
            for e, e_steps in plan
            for i in range(len(pins))
            for n in e_steps
            for path in paths
        ):
            cfg = Config(
                steps=steps,
                window_s=window_s,
                probe=not args.no_probe,
                engine=engine,
                pin=pins[pin_i],
                profile=args.profile,
                env=tuple(bridge_env),
                gc_freeze_after_s=args.gc_freeze,
                serve_args=tuple(args.serve_arg),
                media_path=path,
            )
            # one directory per engine, pin setting and path (as before with neither compared)
            run_work = work / engine / (f"pin-{pin_i}" if len(pins) > 1 else "") / (path or "")
            run_work.mkdir(parents=True, exist_ok=True)
            t = time.monotonic()
            what = ", ".join(
                [
                    f"{n} call(s)",
                    *([path] if path else []),
                    *([compare.pin_label(cfg.pin)] if len(pins) > 1 else []),
                ]
            )
            print(f"step: {engine}, {what}...", flush=True)
            try:
                row = run_step(n, cfg, speech, run_work)
            except Exception as exc:  # one failed step still reports the others
                row = {k: None for k in KEYS} | {
                    "engine": engine,
                    "calls": n,
                    "media_path_asked": path,
                    "pinned": None if cfg.pin is None else {"bridge": cfg.pin[0], "peers": cfg.pin[1]},
                    "notes": [f"step failed: {exc!r}"],
                }
            rows.append(row | {"pins_compared": len(pins) > 1})
            print(f"  done in {time.monotonic() - t:.0f} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - started
    print()
    print(table(rows))
    print()
    if args.paths:
        print(compare.side_by_side(rows, [p for p in paths if p]))
        print()
    for r in rows:
        for note in r.get("notes", []):
            print(f"- {label(r)}, {r['calls']} call(s): {note}")
    print(
        f"\nwall time {wall:.0f} s; results in {args.output}"
        + (f"; artefacts in {work}" if args.keep else "")
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "engine": ",".join(engines),
                "engines": engines,
                # None: no compiled-in cap; with several engines, the first one's (each step says its engine)
                "engine_max_calls_per_process": ENGINES[engines[0]].cap,
                "engine_caps": {e: ENGINES[e].cap for e in engines},
                "mode": "quick" if args.quick else "full",
                "window_s": window_s,
                "caller_loop_s": round(loop_s, 2),
                "fault": FAULT,
                "probe": not args.no_probe,
                "pinned": None if pin is None else {"bridge": pin[0], "peers": pin[1]},
                "pins": [None if p is None else {"bridge": p[0], "peers": p[1]} for p in pins],
                "media_paths": [p for p in paths if p],  # empty: the bridge's own choice
                "bridge_env": dict(bridge_env),
                "profile": args.profile,
                "gc_freeze_after_s": args.gc_freeze,
                "serve_args": list(args.serve_arg),
                "load_avg_end": [round(x, 2) for x in os.getloadavg()],
                "wall_s": round(wall, 1),
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "steps": rows,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
