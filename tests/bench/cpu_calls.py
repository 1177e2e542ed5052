"""CPU and memory of `parlora-bridge serve` while N SIPp calls stream speech through it (not part of CI).

    .venv/bin/python tests/bench/cpu_calls.py [--calls 4] [--seconds 15] [--embedded]

The provider is the GPT-Live echo fake, in its own process by default (so its CPU is not counted) or embedded
(`--embedded`, as `serve` runs with no key). CPU is utime+stime of the bridge process over a steady window,
in percent of one core; RSS at the end of the window.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
import peers  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--embedded", action="store_true", help="run the echo fake inside serve")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="parlora-bench-"))
    utt = peers.make_utterance(work / "speech.wav", "The quick brown fox jumps over the lazy dog. " * 2,
                               tail_silence_s=1.0, ulaw=True)
    (work / "speech.ul").write_bytes(utt.ulaw_path.read_bytes())  # the scenario streams ./speech.ul
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")} | {"OPENAI_API_KEY": "sk-bench"}
    bridge_argv = [sys.executable, "-m", "bridge", "serve", "--sip", f"127.0.0.1:{peers.free_udp_port()}",
                   "--rtp-port", str(peers._free_udp_port_pair())]
    procs: list[peers.ManagedProcess] = []
    try:
        if not args.embedded:
            port = peers.free_udp_port(also_tcp=True)
            fake = peers.ManagedProcess([sys.executable, "-m", "bridge", "fake-provider", "--listen", f"127.0.0.1:{port}"],
                                        env=env, name="fake")
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
        sipp = peers.ManagedProcess(
            ["sipp", "-sf", str(peers.SCENARIOS / "uac_stream.xml"), "-s", "bridge", f"127.0.0.1:{sip_port}",
             "-i", "127.0.0.1", "-mi", "127.0.0.1", "-p", str(peers.free_udp_port()), "-m", str(args.calls),
             "-l", str(args.calls), "-r", "10", "-d", str(duration_ms), "-nostdin"],
            cwd=work, name="sipp")
        procs.append(sipp)
        time.sleep(3.0)  # calls set up
        c0, t0 = cpu_seconds(bridge.pid), time.monotonic()
        time.sleep(args.seconds)
        c1, t1 = cpu_seconds(bridge.pid), time.monotonic()
        rss = rss_mb(bridge.pid)
        pct = 100 * (c1 - c0) / (t1 - t0)
        where = "embedded fake counted" if args.embedded else "fake in its own process"
        print(f"{args.calls} calls, {where}: serve used {pct:.1f} % of one core ({pct / args.calls:.2f} % per call), "
              f"RSS {rss:.0f} MB")
    finally:
        for proc in reversed(procs):
            proc.stop()


if __name__ == "__main__":
    main()
