"""The call's policies, live, on one bridge serving three calls at once (tests/integration/api_app.py embedding
it, over one scripted provider fake), one call per policy:

- `card`: baresip says three sentences; the model answers them with its tools `pause_recording`,
  `resume_recording` and `collect_card` (bridge/engine/card.py); the caller keys in a card number (RFC 4733).
  The application alone gets the digits; they are nowhere else: not in what the provider received (with
  `dtmf_to_model` on, which would tell it every other key), not in the bridge's debug log, the CDR or /metrics.
  The recording has a gap for each pause — the model's (the caller's second sentence fell in it) and the card
  collection's — silent on both channels, as long as the pause was, marked by cue points as the CDR says.
- `quiet`: a SIPp caller that says nothing, with a no-input timeout of 5 s (bridge/engine/no_input.py): the
  model is prompted once to check in, then told to say goodbye; the caller hears both, and the bridge sends BYE
  with the reason in the record.
- `budget`: the model speaks first; the response's tokens, priced by the provider's rates, reach the route's
  budget (bridge/engine/usage.py): a goodbye, then the bridge's BYE, reason "budget".
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import numpy as np
import peers
import pytest

from bridge.engine.no_input import GOODBYE, NO_INPUT_REASON, PROMPT
from bridge.engine.usage import BUDGET_NOTE

APP = Path(__file__).with_name("api_app.py")
RATE = 8000
CARD = "371449635398"  # the first 12 digits of a test card number (the fewest a card collection takes)
SCRIPT = {
    "turns": [
        {"tool_call": {"name": "pause_recording"}, "reply": "tone", "duration_ms": 400},
        {"tool_call": {"name": "resume_recording"}, "reply": "tone", "duration_ms": 400},
        {"tool_call": {"name": "collect_card"}, "reply": "tone", "duration_ms": 400},
    ],
    "then": {"reply": "tone", "duration_ms": 600},
    "tools_answer_callers": True,  # the no-input prompt, the goodbyes and the greeting get a tone, no tool
}
SENTENCES = ("Stop the recording", "Record me again", "I pay by card")
_LOGGED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _caller_wav(workdir: Path) -> tuple[Path, int]:
    """The card caller's audio: the three sentences 2 s apart, then silence while keys are pressed. Returns
    the WAV and the second sentence's length in samples (said while the recording is paused)."""
    gap = np.zeros(int(1.2 * RATE), dtype=np.int16)
    parts, second = [np.zeros(int(0.3 * RATE), dtype=np.int16)], 0
    for i, text in enumerate(SENTENCES):
        said = peers.make_utterance(workdir / f"u{i}.wav", text, lead_silence_s=0.0, tail_silence_s=0.0)
        parts += [said.speech, gap]
        second = said.speech.size if i == 1 else second
    parts.append(np.zeros(20 * RATE, dtype=np.int16))  # hung up before its end
    return peers.write_wav(workdir / "caller.wav", np.concatenate(parts)), second


def _assistant(events: list[dict], call_id: str) -> list[dict]:
    """The call's assistant utterances, as the application got them."""
    return [
        e["utterance"]
        for e in events
        if e["event"] == "utterance" and e["call_id"] == call_id and e["utterance"]["role"] == "assistant"
    ]


def _logged_at(log: str, pattern: str) -> float:
    """The wall time (s) of the first log line matching `pattern`."""
    for line in log.splitlines():
        if re.search(pattern, line) and (stamp := _LOGGED.match(line)):
            return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"no log line matches {pattern!r}")


@pytest.mark.timeout(90)
def test_card_mode_recording_pause_no_input_and_budget_on_one_bridge(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    (tmp_path / "card").mkdir()
    wav, second_len = _caller_wav(tmp_path / "card")
    # The fake and the application start side by side (each imports the bridge: seconds on a busy machine).
    fake_port, fake_record = peers.free_udp_port(also_tcp=True), tmp_path / "fake.jsonl"
    fake_url = f"ws://127.0.0.1:{fake_port}/v1/realtime"
    fake = peers.ManagedProcess(
        [sys.executable, "-m", "bridge", "fake-provider", "--protocol", "openai-realtime"]
        + ["--listen", f"127.0.0.1:{fake_port}", "--record", str(fake_record), "--script", str(script)],
        name="fake-provider",
    )
    record, cdr = tmp_path / "record", tmp_path / "cdr.jsonl"
    record.mkdir()
    sip_port, rtp_port = peers.free_udp_port(), peers.free_rtp_port()
    http_port = peers.free_udp_port(also_tcp=True)
    argv = [sys.executable, str(APP), "--sip", f"127.0.0.1:{sip_port}", "--rtp-port", str(rtp_port)]
    argv += ["--provider", "openai-realtime", "--provider-url", fake_url, "--http", str(http_port)]
    argv += ["--card", "--recording-tools", "--dtmf-to-model", "--record", str(record), "--cdr", str(cdr)]
    argv += ["--price-input-tokens", "1000", "--price-output-tokens", "1000", "--budget", "budget=0.01"]
    argv += ["--greet", "budget", "--no-input", "quiet=5", "--log-level", "debug"]
    with fake, peers.ManagedProcess(argv, name="api-app") as app, ThreadPoolExecutor(2) as pool:
        assert fake.wait_for(r"listening on (ws\S+)", 20).group(1) == fake_url
        app.wait_for(r"listening on udp", 20)
        silent = {
            name: pool.submit(
                peers.run_sipp, "uac_wait_bye", sip_port, service=name, workdir=tmp_path / name, timeout=40
            )
            for name in ("quiet", "budget")
        }
        with peers.BaresipCaller(tmp_path / "card", wav) as caller:
            caller.start(f"sip:card@127.0.0.1:{sip_port}")
            app.wait_for(r"card collection started \(model\)", 30)
            peers.baresip_dtmf(caller, CARD + "#")
            app.wait_for(r'"event": "card"', 15)
            app.wait_for(r"recording resumed \(card\)", 5)  # the collection is over: hang up
            caller.hangup()
            heard = caller.wait(10)
        sipp = {name: future.result() for name, future in silent.items()}
        give_up = time.monotonic() + 20  # each call's end, and its CDR line
        while time.monotonic() < give_up and not (
            app.stdout.count('"event": "ended"') == 3
            and cdr.exists()
            and len(cdr.read_text().splitlines()) == 3
        ):
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        log = app.stderr
        events = [json.loads(line) for line in app.stdout.splitlines() if line.startswith("{")]
    assert heard.established, heard.stderr[-2000:]
    records = {r["call"]["called"]: r for r in map(json.loads, cdr.read_text().splitlines())}
    assert set(records) == {"card", "quiet", "budget"}, records
    parsed: dict[int, list[dict]] = {}  # what the provider received, by connection
    for entry in map(json.loads, fake_record.read_text().splitlines()):
        parsed.setdefault(entry["conn"], []).append({"t_ns": entry["t_ns"], **(entry.get("frame") or {})})
    frames = {c: [json.dumps(f) for f in fs] for c, fs in parsed.items()}
    conn = {
        called: next(c for c, fs in frames.items() if any(f"the {called} line" in f for f in fs))
        for called in records
    }
    print({called: (r["ended_by"], r["reason"], r["duration_s"]) for called, r in records.items()})

    # The card: the application got the digits, the model the outcome only, nothing else any digit.
    cards = [e for e in events if e["event"] == "card"]
    assert [(e["outcome"], e["digits"], e["by"]) for e in cards] == [("collected", CARD, "model")], cards
    assert not [e for e in events if e["event"] == "dtmf"], events  # no key reached the application's dtmf
    outputs = [
        json.loads(f["item"]["output"])
        for f in parsed[conn["card"]]
        if (f.get("item") or {}).get("type") == "function_call_output"
    ]
    assert outputs == [
        {"recording": True, "paused": True, "changed": True},  # pause_recording
        {"recording": True, "paused": False, "changed": True},  # resume_recording
        {"outcome": "collected"},  # collect_card
    ], outputs
    for where, text in (("provider", fake_record.read_text()), ("log", log), ("cdr", cdr.read_text())):
        assert CARD not in text and CARD[:8] not in text, where
    assert CARD not in metrics and CARD[:8] not in metrics and "parlora_" in metrics
    assert not any("pressed the key" in f for f in frames[conn["card"]])  # dtmf_to_model: no key to the model
    pressed = re.findall(r".*caller pressed.*", log)  # the log's line for each key outside a collection
    assert not pressed, pressed
    collected = re.search(r"card collection collected \(model\) after (\d+) ms", log)
    assert collected is not None, log[-3000:]
    card_ms = int(collected.group(1))
    # The caller's audio was withheld from the provider while the keys were pressed: one input discontinuity.
    dropped = re.search(r"audio_discontinuity input: (\d+) caller frames dropped \(card_collection\)", log)
    assert dropped is not None and abs(20 * int(dropped.group(1)) - card_ms) <= 100, (dropped, card_ms)
    appends = [f["t_ns"] for f in parsed[conn["card"]] if f.get("type") == "input_audio_buffer.append"]
    assert np.diff(appends).max() >= (card_ms - 100) * 1_000_000  # not one frame in the collection
    card = records["card"]
    assert [(c["outcome"], c["by"]) for c in card["card_collections"]] == [("collected", "model")], card

    # The recording's pauses: the model's and the card collection's, each a silent gap of its length, cued.
    gaps = card["recording_gaps"]
    assert [g["by"] for g in gaps] == ["model", "card"], gaps
    lengths = [g["end_ms"] - g["start_ms"] for g in gaps]
    paused = _logged_at(log, r"recording resumed \(model\)") - _logged_at(log, r"recording paused \(model\)")
    assert abs(lengths[0] - 1000 * paused) <= 40 and abs(lengths[1] - card_ms) <= 40, (lengths, paused)
    assert lengths[0] >= 1000 * second_len // RATE  # the second sentence was said in it
    rate, stereo = peers.read_wav(card["recording"])
    assert rate == RATE
    expected = []
    for g in gaps:
        expected += [
            (g["start_ms"] * 8, f"recording paused ({g['by']})"),
            (g["end_ms"] * 8, "recording resumed"),
        ]
    cues = peers.wav_cues(card["recording"])
    assert [label for _, label in cues] == [label for _, label in expected], cues
    assert all(abs(at - want) <= 8 for (at, _), (want, _) in zip(cues, expected, strict=True)), (cues, gaps)
    for g in gaps:
        assert not stereo[g["start_ms"] * 8 + 160 : g["end_ms"] * 8 - 160].any(), g  # silence, both channels
    caller_side = stereo[:, 0]
    before = caller_side[: gaps[0]["start_ms"] * 8]
    between = caller_side[gaps[0]["end_ms"] * 8 : gaps[1]["start_ms"] * 8]
    assert peers.rms_dbfs(before) > -40 and peers.rms_dbfs(between) > -40  # the first and third sentences

    # No input: prompted once, then the goodbye, heard, then the bridge's BYE.
    quiet = records["quiet"]
    assert sipp["quiet"].returncode == 0 and sipp["quiet"].count("BYE_RECEIVED") == 1, sipp["quiet"].screen
    assert (quiet["ended_by"], quiet["reason"]) == ("bridge", NO_INPUT_REASON), quiet
    said = [json.dumps(PROMPT)[1:-1], json.dumps(GOODBYE)[1:-1]]
    assert [sum(text in f for f in frames[conn["quiet"]]) for text in said] == [1, 1], frames[conn["quiet"]]
    answers = _assistant(events, quiet["call"]["call_id"])
    assert [u["heard_ms"] for u in answers] == [400, 400], answers  # the check-in and the goodbye, whole
    assert quiet["duration_s"] >= 10  # two timeouts of 5 s

    # The budget: the greeting's tokens priced past it, a goodbye, the bridge's BYE.
    budget = records["budget"]
    assert sipp["budget"].returncode == 0 and sipp["budget"].count("BYE_RECEIVED") == 1, sipp["budget"].screen
    assert (budget["ended_by"], budget["reason"]) == ("bridge", "budget"), budget
    assert sum(json.dumps(BUDGET_NOTE)[1:-1] in f for f in frames[conn["budget"]]) == 1
    assert budget["cost"]["price"] >= 0.01, budget["cost"]
    answers = _assistant(events, budget["call"]["call_id"])
    assert [u["heard_ms"] for u in answers] == [400, 400], answers  # the greeting and the goodbye, whole
