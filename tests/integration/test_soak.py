"""Soak: 200 faults of random kinds over a run of four live calls, one per provider, each calling a tool on every
turn. No call may be lost (none of the kinds used is fatal by rule) and no tool call may be dispatched twice.

Each provider's fake runs as its own process with a script that calls `lookup_order` before answering every
caller utterance; SIPp streams looping speech into one `serve` per provider. An injector picks a random
provider, asks its fake which connections are open (`GET /_connections`) and injects a random fault into one
of them (`GET /_fault?spec=N/KIND`). Kinds: output bursts (overflow), held-back output, abrupt closes,
half-open sockets, duplicated tool calls and unparseable frames. The seed is printed; set PARLORA_SOAK_SEED to
replay a run.
"""

from __future__ import annotations

import json
import os
import random
import re
import ssl
import statistics
import time
import urllib.request
from collections import Counter

import peers
import pytest

FAULTS = 200
PACE_S = 0.25  # one fault every 0.25 s: about one a second for each provider's call
KINDS = [
    ("burst:40", 25),
    ("stall:1500", 15),
    ("abrupt_close", 25),
    ("duplicate_tool_call", 20),
    ("garbage_json", 10),
    ("half_open", 5),
]
PROTOCOLS = {
    "openai-live": ("OPENAI_API_KEY", []),
    "openai-realtime": ("OPENAI_API_KEY", ["--reservoir-bytes", "16000"]),
    "gemini-live": ("GEMINI_API_KEY", ["--reservoir-bytes", "96000"]),
    "xai": ("XAI_API_KEY", ["--reservoir-bytes", "16000"]),
}
SCRIPT = {
    "turns": [],
    "then": {"tool_call": {"name": "lookup_order", "arguments": {"order_id": "42"}}, "reply": "echo"},
}
DISPATCHED = re.compile(
    r"call (call-\d+) (job-\d+) \((\w+)\) running at \d+ ms: dispatched to the "
    r"application \(call (\S+)\)"
)


def _get(url: str, context: ssl.SSLContext | None) -> str:
    with urllib.request.urlopen(url, timeout=5, context=context) as response:
        return response.read().decode()


def _percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))])


@pytest.mark.timeout(360)
def test_soak_200_faults_over_four_calls_loses_no_call_and_dispatches_no_tool_twice(
    start_fake, start_bridge, tmp_path
) -> None:
    seed = int(os.environ.get("PARLORA_SOAK_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    speech = peers.make_utterance(
        tmp_path / "speech.wav",
        "Where is my order number forty two, please?",
        lead_silence_s=0.3,
        tail_silence_s=1.5,
        ulaw=True,
    )
    (tmp_path / "speech.ul").write_bytes(speech.ulaw_path.read_bytes())
    duration_ms = int((FAULTS * PACE_S * 1.5 + 15) * 1000)  # room for attempts that find no open connection
    runs = {}
    for protocol, (key, options) in PROTOCOLS.items():
        fake = start_fake(protocol, "--script", str(script))
        bridge = start_bridge(*fake.bridge_args(protocol), *options, env={key: "sk-test"})
        context = ssl.create_default_context(cafile=fake.cert) if fake.cert else None
        scheme, _, authority = fake.url.split("/", 3)[:3]
        control = scheme.replace("ws", "http", 1) + "//" + authority  # the fake's own HTTP port
        runs[protocol] = (fake, bridge, context, control)
    callers = []
    for protocol, (_, bridge, _, _) in runs.items():
        callers.append(
            peers.ManagedProcess(
                [
                    "sipp",
                    "-sf",
                    str(peers.SCENARIOS / "uac_stream.xml"),
                    "-s",
                    "bridge",
                    f"127.0.0.1:{bridge.sip_port}",
                    "-i",
                    "127.0.0.1",
                    "-mi",
                    "127.0.0.1",
                    "-p",
                    str(peers.free_udp_port()),
                    "-m",
                    "1",
                    "-l",
                    "1",
                    "-d",
                    str(duration_ms),
                    "-nostdin",
                ],
                cwd=tmp_path,
                name=f"sipp-{protocol}",
            )
        )
    try:
        for _, bridge, _, _ in runs.values():
            bridge.wait_for(r"call call-1 started", 20)
        injected: Counter[str] = Counter()
        history: list[str] = []
        started = time.monotonic()
        for attempt in range(
            2 * FAULTS
        ):  # a provider between a lost connection and its replacement is skipped
            if sum(injected.values()) == FAULTS:
                break
            time.sleep(max(0.0, started + attempt * PACE_S - time.monotonic()))  # pacing, not a check
            protocol = rng.choice(list(runs))
            _, _, context, control = runs[protocol]
            t0 = time.monotonic()
            try:
                open_now = json.loads(_get(f"{control}/_connections", context))["open"]
            except Exception as exc:
                print("DBG", round(time.monotonic() - started, 2), protocol, "ERR", exc, flush=True)
                continue
            print(
                "DBG",
                round(time.monotonic() - started, 2),
                protocol,
                round(time.monotonic() - t0, 3),
                open_now,
                flush=True,
            )
            if not open_now:
                continue
            kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
            spec = f"{rng.choice(open_now)}/{kind}"
            assert _get(f"{control}/_fault?spec={spec}", context) == "ok\n"
            injected[f"{protocol} {kind.split(':')[0]}"] += 1
            history.append(f"{time.time():.3f} {protocol} {spec} open={open_now}")
        assert sum(injected.values()) == FAULTS, "\n".join(
            f"{p}: {r[1].log[-1500:]}" for p, r in runs.items()
        )
        for caller in callers:
            caller.wait(timeout=duration_ms / 1000 + 30)
        for _, bridge, _, _ in runs.values():
            bridge.wait_for(r"call call-1 ended after", 15)
    finally:
        for caller in callers:
            caller.stop()
        (tmp_path / "faults.txt").write_text("\n".join(history))
        for protocol, (fake, bridge, _, _) in runs.items():  # kept for a failure's post-mortem
            (tmp_path / f"bridge-{protocol}.log").write_text(bridge.log)
            (tmp_path / f"fake-{protocol}.log").write_text(fake.proc.stdout + fake.proc.stderr)
    print(f"\nsoak seed {seed}: {sum(injected.values())} faults injected: {dict(sorted(injected.items()))}")
    for protocol, (_, bridge, _, _) in runs.items():
        log = bridge.log
        ended = re.search(r"call call-1 ended after [\d.]+ s by (\w+) \(([^)]*)\)", log)
        assert ended and ended.group(1) == "caller", f"{protocol}: {log[-3000:]}"  # the call was not lost
        dispatched = Counter(call_id for _, _, _, call_id in DISPATCHED.findall(log))
        duplicated = [call_id for call_id, n in dispatched.items() if n > 1]
        assert not duplicated, f"{protocol}: tool calls dispatched twice: {duplicated}"
        redelivered = len(re.findall(r"delivered again: answered from the ledger", log))
        ready = [
            int(ms)
            for ms in re.findall(r"output_recovery awaiting_user: token \d+, cause \w+, (\d+) ms", log)
        ]
        causes = Counter(re.findall(r"output_recovery reconnecting: token \d+, cause (\w+)", log))
        failed = re.findall(r"output_recovery failed", log)
        assert not failed, f"{protocol}: {log[-3000:]}"
        assert dispatched and ready, f"{protocol}: no tool ran or no recovery happened: {log[-3000:]}"
        print(
            f"{protocol}: {len(ready)} recoveries {dict(causes)}; replacement ready after the condition p50 "
            f"{statistics.median(ready):.0f} ms, p99 {_percentile(ready, 0.99):.0f} ms, max {max(ready)} ms; "
            f"{sum(dispatched.values())} tool calls dispatched once each, {redelivered} redeliveries answered "
            f"from the ledger"
        )
        assert max(ready) <= 5_000
