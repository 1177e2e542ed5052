"""CPU and memory of `parlora-bridge serve` while N SIPp calls stream speech through it (not part of CI).

    .venv/bin/python tests/bench/cpu_calls.py [--calls 4] [--seconds 15] [--embedded]

The provider is the GPT-Live echo fake, in its own process by default (so its CPU is not counted) or embedded
(`--embedded`, as `serve` runs with no key). CPU is utime+stime of the bridge process over a steady window,
in percent of one core; RSS at the end of the window.

tests/bench/run.py measures this and more (RTP timing, latencies, barge-in, recovery) per load step; this
script stays for the embedded-fake case. Both use the benchmark's caller scenario (tests/bench/uac_bench.xml).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "integration"))
sys.path.insert(0, str(BENCH))
import peers  # noqa: E402
import stats  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    return stats.proc_stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), TICKS)


def rss_mb(pid: int) -> float:
    return stats.proc_status_rss_mb(Path(f"/proc/{pid}/status").read_text()) or 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--embedded", action="store_true", help="run the echo fake inside serve")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="parlora-bench-"))
    utt = peers.make_utterance(
        work / "speech.wav",
        "The quick brown fox jumps over the lazy dog. " * 2,
        tail_silence_s=1.0,
        ulaw=True,
    )
    (work / "speech.ul").write_bytes(utt.ulaw_path.read_bytes())  # the scenario streams ./speech.ul
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")} | {"OPENAI_API_KEY": "sk-bench"}
    bridge_argv = [
        sys.executable,
        "-m",
        "bridge",
        "serve",
        "--sip",
        f"127.0.0.1:{peers.free_udp_port()}",
        "--rtp-port",
        str(peers._free_udp_port_pair()),
    ]
    procs: list[peers.ManagedProcess] = []
    try:
        if not args.embedded:
            port = peers.free_udp_port(also_tcp=True)
            fake = peers.ManagedProcess(
                [sys.executable, "-m", "bridge", "fake-provider", "--listen", f"127.0.0.1:{port}"],
                env=env,
                name="fake",
            )
            procs.append(fake)
            url = fake.wait_for(r"listening on (ws://\S+)", 20).group(1)
            bridge_argv += ["--provider", "openai-live", "--provider-url", url]
        else:
            bridge_argv += ["--provider", "echo"]
        sip_port = int(bridge_argv[bridge_argv.index("--sip") + 1].rsplit(":", 1)[1])
        bridge = peers.ManagedProcess(bridge_argv, env=env, name="bridge")
        procs.append(bridge)
        bridge.wait_for(r"listening on udp", 20)
        duration_ms = int((args.seconds + 8) * 1000)
        scenario = work / "uac_bench.xml"  # the benchmark's caller: loops ./speech.ul for duration_ms
        scenario.write_text((BENCH / "uac_bench.xml").read_text().replace("__CALL_MS__", str(duration_ms)))
        sipp = peers.ManagedProcess(
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
                "-m",
                str(args.calls),
                "-l",
                str(args.calls),
                "-r",
                "10",
                "-nostdin",
            ],
            cwd=work,
            name="sipp",
        )
        procs.append(sipp)
        time.sleep(3.0)  # calls set up
        c0, t0 = cpu_seconds(bridge.pid), time.monotonic()
        time.sleep(args.seconds)
        c1, t1 = cpu_seconds(bridge.pid), time.monotonic()
        rss = rss_mb(bridge.pid)
        pct = 100 * (c1 - c0) / (t1 - t0)
        where = "embedded fake counted" if args.embedded else "fake in its own process"
        print(
            f"{args.calls} calls, {where}: serve used {pct:.1f} % of one core ({pct / args.calls:.2f} % per call), "
            f"RSS {rss:.0f} MB"
        )
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
