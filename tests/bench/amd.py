"""Answering-machine detection (bridge/engine/amd.py) on a corpus made here, at run time: accuracy per class (a
confusion matrix), time to verdict from the answer, the beep after a machine verdict, and the detector's
cost per frame.

    .venv/bin/python tests/bench/amd.py --quick     # 2 voices x 2 speeds, 135 calls, ~10 s
    .venv/bin/python tests/bench/amd.py             # 6 voices x 3 speeds x 2 levels, 1,046 calls, ~2.5 min
    .venv/bin/python tests/bench/amd.py --keep DIR  # keep the generated audio (8 kHz PCM16 .raw) in DIR
    .venv/bin/python tests/bench/amd.py --quick --set machine_greeting_ms=2200 --wrong   # try other options

The corpus is synthesised into a temporary directory and deleted (no audio is committed): espeak-ng speaks
recorded-style greetings of several lengths and human answers ("hello?", "yes, hello, who is this?") in
several voices and speeds; sox makes the tones (the common beeps 440, 850, 1,000 and 1,400 Hz), noise and
silence. Every recording is resampled to 8 kHz, band-limited to 300-3,400 Hz, put at a telephone level,
laid on a quiet line noise and passed through G.711 µ-law and back, as a carrier would deliver it. Some
calls get early media (a ringback or an announcement before the answer) to check that it decides nothing.

Each call is fed to the detector on virtual time, one 20 ms frame per 20 ms, with `handle_timer` run at
every deadline that falls between frames, as the shell does. The classes and what each should give:

| class | audio after the answer | expected |
| --- | --- | --- |
| human | 0.2-1.2 s of line, a short answer, then the line | human |
| machine | 0.1-0.6 s of line, a greeting of 2.5-9 s, then the line | machine, then AmdNoBeep |
| machine+beep | the same greeting, 0.2-0.8 s, a beep of 0.2-0.8 s | machine, then AmdBeep at the beep's end |
| short+beep | a greeting under 1.5 s ("leave a message"), 0.3 s, a beep | beep |
| beep | 0.2-1.5 s of line, a beep alone | beep |
| silence | digital silence or a quiet line (-70 to -60 dBFS) | silence |
| noise | steady white, pink or brown noise at -50 to -30 dBFS | silence (nobody spoke) |

It writes `tests/bench/results/amd-quick.json` or `amd-full.json` (or `--output`).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.engine.amd import AmdBeep, AmdNoBeep, AmdOptions, AmdVerdict, AnsweringMachineDetector
from rtp.g711 import ulaw_decode, ulaw_encode
from rtp.units import NS_PER_MS as MS
from tests.bench.stats import percentile

RATE = 8000
FRAME = 160
MACHINE_TEXTS = [
    "Hi, you've reached John. Leave a message.",
    "Hi, you've reached John Smith. I can't take your call right now, please leave a message after the tone.",
    "Hello, this is Maria. Sorry I missed your call. "
    "Please leave your name and number and I will call you back.",
    "You have reached the voicemail of five five five, zero one two three. The person you are calling is not "
    "available. Please leave a message after the tone.",
    "Thank you for calling Acme Dental. Our office is currently closed. Our hours are Monday to Friday, "
    "nine to five.",
    "The subscriber you have dialled is not available. Please leave a message after the beep.",
    "Hey, it's Sam. I'm away from the phone, leave me a message.",
]
SHORT_MACHINE_TEXTS = ["Leave a message.", "Please leave a message.", "Sam here, leave a message."]
HUMAN_TEXTS = [
    "Hello?",
    "Hello.",
    "Yes?",
    "Hi.",
    "Hello, who is this?",
    "Yes, hello, who is this?",
    "Hi, this is Anna.",
    "Speaking.",
    "Hello, Smith residence.",
    "Good morning, Mark speaking.",
]
BEEP_HZ = [440, 850, 1000, 1400]
QUICK_VOICES = ["en-us", "en-gb+f3"]
FULL_VOICES = ["en-us", "en-gb", "en-us+f3", "en-gb+f3", "en-gb-scotland", "en-029+m4"]
QUICK_SPEEDS = [150, 185]
FULL_SPEEDS = [140, 170, 200]


@dataclass
class Call:
    cls: str
    expected: str
    audio: np.ndarray  # int16, 8 kHz, after the answer
    early: np.ndarray  # before the answer
    beep_end_ms: int | None  # where the beep of a machine+beep or short+beep call ends, from the answer
    label: str


class Synth:
    def __init__(self, workdir: Path, rng: random.Random) -> None:
        self.dir = workdir
        self.rng = rng
        self.n = 0

    def _path(self, ext: str) -> Path:
        self.n += 1
        return self.dir / f"c{self.n:05d}.{ext}"

    def speech(self, text: str, voice: str, speed: int) -> np.ndarray:
        wav = self._path("wav")
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(wav), text], check=True)
        return self._to_8k(wav, trim=True)

    def sox_synth(self, seconds: float, *effect: str) -> np.ndarray:
        raw = self._path("raw")
        subprocess.run(
            [
                "sox",
                "-n",
                "-r",
                str(RATE),
                "-b",
                "16",
                "-c",
                "1",
                "-e",
                "signed",
                str(raw),
                "synth",
                f"{seconds:.3f}",
            ]
            + list(effect),
            check=True,
        )
        return np.fromfile(raw, dtype="<i2").astype(np.float64)

    def _to_8k(self, wav: Path, trim: bool) -> np.ndarray:
        raw = self._path("raw")
        effects = ["sinc", "300-3400"]
        if trim:  # espeak-ng pads its output with silence at both ends
            effects = [
                "silence",
                "1",
                "0.02",
                "0.3%",
                "reverse",
                "silence",
                "1",
                "0.02",
                "0.3%",
                "reverse",
            ] + effects
        subprocess.run(
            ["sox", str(wav), "-r", str(RATE), "-b", "16", "-c", "1", "-e", "signed", str(raw)] + effects,
            check=True,
        )
        return np.fromfile(raw, dtype="<i2").astype(np.float64)


def at_level(x: np.ndarray, dbfs: float) -> np.ndarray:
    """Scale to an RMS of `dbfs` over the samples above -50 dB of the peak (the active level of speech)."""
    if not len(x) or not np.any(x):
        return x
    active = x[np.abs(x) > np.abs(x).max() * 10 ** (-50 / 20)]
    rms = float(np.sqrt(np.mean(active**2)))
    return x * (32768 * 10 ** (dbfs / 20) / rms)


def tone(hz: int, seconds: float, dbfs: float) -> np.ndarray:
    n = np.arange(int(seconds * RATE))
    x = np.sin(2 * np.pi * hz * n / RATE)
    ramp = min(len(n), 40)  # 5 ms ramps, as a tone generator has
    x[:ramp] *= np.linspace(0, 1, ramp)
    x[len(x) - ramp :] *= np.linspace(1, 0, ramp)
    return at_level(x, dbfs)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE))


def line(synth: Synth, samples: int, dbfs: float) -> np.ndarray:
    """A quiet line: pink noise at `dbfs`, `samples` long."""
    x = at_level(synth.sox_synth(samples / RATE + 0.01, "pinknoise", "sinc", "300-3400"), dbfs)
    return np.resize(x, samples)


def carrier(x: np.ndarray) -> np.ndarray:
    """Clip to 16 bits and pass through G.711 µ-law, as a carrier delivers it."""
    pcm = np.clip(np.round(x), -32768, 32767).astype("<i2").tobytes()
    return np.frombuffer(ulaw_decode(ulaw_encode(pcm)), dtype="<i2").copy()


def build_corpus(synth: Synth, rng: random.Random, quick: bool) -> list[Call]:
    voices = QUICK_VOICES if quick else FULL_VOICES
    speeds = QUICK_SPEEDS if quick else FULL_SPEEDS
    levels = [-20.0] if quick else [-16.0, -28.0]
    calls: list[Call] = []

    def lined(parts: list[np.ndarray], tail: float) -> np.ndarray:
        body = np.concatenate(parts + [silence(tail)])
        noise_db = rng.uniform(-68, -55)
        return body + line(synth, len(body), noise_db)

    def early() -> np.ndarray:
        roll = rng.random()
        if roll < 0.6:
            return np.zeros(0, dtype=np.int16)
        if roll < 0.85:  # a US ringback: 440 + 480 Hz, 2 s on, 4 s off (the tail of it)
            n = np.arange(int(rng.uniform(1, 4) * RATE))
            x = np.sin(2 * np.pi * 440 * n / RATE) + np.sin(2 * np.pi * 480 * n / RATE)
            return carrier(at_level(x, -20))
        return carrier(at_level(synth.speech("Please hold while we connect your call.", "en-us", 170), -20))

    for voice in voices:
        for speed in speeds:
            for level in levels:
                for text in HUMAN_TEXTS:
                    x = at_level(synth.speech(text, voice, speed), level + rng.uniform(-3, 3))
                    audio = lined([silence(rng.uniform(0.2, 1.2)), x], 5.0)
                    calls.append(
                        Call("human", "human", carrier(audio), early(), None, f"{voice}/{speed}: {text}")
                    )
                for i, text in enumerate(MACHINE_TEXTS):
                    x = at_level(synth.speech(text, voice, speed), level + rng.uniform(-3, 3))
                    lead = silence(rng.uniform(0.1, 0.6))
                    calls.append(
                        Call(
                            "machine",
                            "machine",
                            carrier(lined([lead, x], 3.0)),
                            early(),
                            None,
                            f"{voice}/{speed}: {text}",
                        )
                    )
                    hz = BEEP_HZ[(i + speed) % len(BEEP_HZ)]
                    gap = silence(rng.uniform(0.2, 0.8))
                    beep = tone(hz, rng.uniform(0.2, 0.8), level + rng.uniform(-4, 2))
                    audio = lined([lead, x, gap, beep], 3.0)
                    beep_end = (len(lead) + len(x) + len(gap) + len(beep)) * 1000 // RATE
                    calls.append(
                        Call(
                            "machine+beep",
                            "machine",
                            carrier(audio),
                            early(),
                            beep_end,
                            f"{voice}/{speed}: {text} + {hz} Hz",
                        )
                    )
                for text in SHORT_MACHINE_TEXTS:
                    x = at_level(synth.speech(text, voice, speed), level)
                    hz = rng.choice(BEEP_HZ)
                    audio = lined([silence(0.3), x, silence(0.3), tone(hz, 0.5, level)], 3.0)
                    calls.append(
                        Call(
                            "short+beep",
                            "beep",
                            carrier(audio),
                            early(),
                            (int(0.6 * RATE) + len(x) + int(0.5 * RATE)) * 1000 // RATE,
                            f"{voice}/{speed}: {text} + {hz} Hz",
                        )
                    )
    beeps = [(hz, dur) for hz in BEEP_HZ + [400, 600, 1100, 2000] for dur in (0.2, 0.4, 1.0)]
    for hz, dur in beeps if not quick else beeps[::2]:
        level = rng.uniform(-28, -12)
        audio = lined([silence(rng.uniform(0.2, 1.5)), tone(hz, dur, level)], 5.0)
        calls.append(
            Call("beep", "beep", carrier(audio), early(), None, f"{hz} Hz {dur} s at {level:.0f} dBFS")
        )
    for i in range(6 if quick else 20):
        if i % 2:
            audio = silence(6.0)
            label = "digital silence"
        else:
            db = rng.uniform(-70, -60)
            audio = line(synth, 6 * RATE, db)
            label = f"line at {db:.0f} dBFS"
        calls.append(Call("silence", "silence", carrier(audio), early(), None, label))
    for i in range(9 if quick else 30):
        color = ["whitenoise", "pinknoise", "brownnoise"][i % 3]
        db = rng.uniform(-50, -30)
        audio = at_level(synth.sox_synth(6.0, color, "sinc", "300-3400"), db)
        calls.append(Call("noise", "silence", carrier(audio), early(), None, f"{color} at {db:.0f} dBFS"))
    return calls


def frames(x: np.ndarray) -> list[bytes]:
    pcm = x.astype("<i2").tobytes()
    return [pcm[i : i + 2 * FRAME] for i in range(0, len(pcm) - 2 * FRAME + 1, 2 * FRAME)]


@dataclass
class Outcome:
    verdict: AmdVerdict
    after: AmdBeep | AmdNoBeep | None
    frame_ns: float  # CPU per analysed frame
    n_frames: int


def run_call(call: Call, options: AmdOptions) -> Outcome:
    det = AnsweringMachineDetector(options)
    t0 = 1_000_000_000
    now = t0
    for f in frames(call.early):  # early media: decides nothing, starts no timer
        assert det.frame(f, now) is None
        now += 20 * MS
    answered = now
    det.answered(answered)
    verdict: AmdVerdict | None = None
    after: AmdBeep | AmdNoBeep | None = None
    spent = 0
    n = 0
    tail = frames(np.zeros(FRAME * 50 * 40, dtype=np.int16) + 1)  # the line after the recording, up to 40 s
    for f in frames(call.audio) + tail:
        now += 20 * MS  # a frame is received when its 20 ms of audio are complete
        deadline = det.next_deadline()
        while deadline is not None and deadline <= now:
            event = det.handle_timer(deadline)
            verdict, after = _note(event, verdict, after)
            deadline = det.next_deadline()
        if det.done:
            break
        c = time.perf_counter_ns()
        event = det.frame(f, now)
        spent += time.perf_counter_ns() - c
        n += 1
        verdict, after = _note(event, verdict, after)
    assert verdict is not None, call.label
    return Outcome(verdict, after, spent / max(n, 1), n)


def _note(
    event: object, verdict: AmdVerdict | None, after: AmdBeep | AmdNoBeep | None
) -> tuple[AmdVerdict | None, AmdBeep | AmdNoBeep | None]:
    if isinstance(event, AmdVerdict):
        assert verdict is None, "two verdicts"
        return event, after
    if isinstance(event, AmdBeep | AmdNoBeep):
        assert verdict is not None and verdict.kind == "machine" and after is None
        return verdict, event
    return verdict, after


def usable(call: Call, out: Outcome) -> bool:
    """The application does the right thing with it: talks to a person; leaves its message after a beep (the
    verdict `beep`, or `machine` then AmdBeep) or, with no beep, after a greeting; leaves a silent line."""
    kind = out.verdict.kind
    if call.beep_end_ms is not None:
        return kind == "beep" or (kind == "machine" and isinstance(out.after, AmdBeep))
    if call.expected == "machine":
        return kind == "machine" and not isinstance(out.after, AmdBeep)
    return kind == call.expected


def evaluate(calls: list[Call], options: AmdOptions) -> dict[str, Any]:
    kinds = ["human", "machine", "beep", "silence", "unknown"]
    matrix: dict[str, Counter[str]] = defaultdict(Counter)
    ttv: dict[str, list[float]] = defaultdict(list)
    all_ttv: list[float] = []
    beep_errors: list[float] = []
    beeps_found = beeps_missed = false_beeps = 0
    frame_ns: list[float] = []
    wrong: list[str] = []
    usable_calls: Counter[str] = Counter()
    for call in calls:
        out = run_call(call, options)
        v = out.verdict
        matrix[call.cls][v.kind] += 1
        if usable(call, out):
            usable_calls[call.cls] += 1
        frame_ns.append(out.frame_ns)
        if v.kind == call.expected:
            ttv[call.cls].append(v.since_answer_ms)
        all_ttv.append(v.since_answer_ms)
        if v.kind != call.expected:
            wrong.append(f"{call.cls} -> {v.kind} ({v.reason}): {call.label}")
        if v.kind == "machine":
            if call.beep_end_ms is not None:
                if isinstance(out.after, AmdBeep):
                    beeps_found += 1
                    beep_errors.append(out.after.since_answer_ms - call.beep_end_ms)
                else:
                    beeps_missed += 1
            elif isinstance(out.after, AmdBeep):
                false_beeps += 1
    classes = sorted(
        matrix,
        key=lambda c: ["human", "machine", "machine+beep", "short+beep", "beep", "silence", "noise"].index(c),
    )
    expected = {c.cls: c.expected for c in calls}
    per_class = {}
    for cls in classes:
        total = sum(matrix[cls].values())
        per_class[cls] = {
            "calls": total,
            "expected": expected[cls],
            "accuracy_pct": round(100 * matrix[cls][expected[cls]] / total, 1),
            "usable_pct": round(100 * usable_calls[cls] / total, 1),
            "verdicts": {k: matrix[cls][k] for k in kinds},
            "ttv_p50_ms": _ms(percentile(ttv[cls], 50)),
            "ttv_p99_ms": _ms(percentile(ttv[cls], 99)),
        }
    correct = sum(matrix[c][expected[c]] for c in classes)
    return {
        "calls": len(calls),
        "accuracy_pct": round(100 * correct / len(calls), 1),
        "usable_pct": round(100 * sum(usable_calls.values()) / len(calls), 1),
        "classes": per_class,
        "ttv_all_p50_ms": _ms(percentile(all_ttv, 50)),
        "ttv_all_p99_ms": _ms(percentile(all_ttv, 99)),
        "ttv_all_max_ms": max(all_ttv),
        "beep_after_machine": {
            "found": beeps_found,
            "missed": beeps_missed,
            "false_on_greetings_without_beep": false_beeps,
            "lateness_after_tone_end_p50_ms": _ms(percentile(beep_errors, 50)),
            "lateness_after_tone_end_p99_ms": _ms(percentile(beep_errors, 99)),
        },
        "frame_us_p50": round((percentile(frame_ns, 50) or 0) / 1000, 2),
        "frame_us_p99": round((percentile(frame_ns, 99) or 0) / 1000, 2),
        "wrong": wrong,
    }


def frame_cost_us(options: AmdOptions, repeat: int = 5) -> dict[str, float]:
    """CPU per `frame` call, best of `repeat` runs of 2,000 frames: a quiet line (the level only), speech-like
    noise and a tone (the level and the Goertzel bank)."""
    rng = np.random.default_rng(7)
    n = np.arange(FRAME * 2000)
    signals = {
        "quiet": rng.standard_normal(len(n)) * 20,
        "voiced": rng.standard_normal(len(n)) * 3000 * (0.1 + np.sin(np.pi * 4 * n / RATE) ** 2),
        "tone": 8000 * np.sin(2 * np.pi * 1000 * n / RATE),
    }
    out = {}
    for name, x in signals.items():
        fs = frames(x)
        best = float("inf")
        for _ in range(repeat):
            det = AnsweringMachineDetector(options)
            det.answered(0)
            start = time.process_time_ns()
            for i, f in enumerate(fs):
                det._analyse(f, i * 20 * MS)  # the per-frame work without the verdict ending it
            best = min(best, (time.process_time_ns() - start) / len(fs))
        out[name] = round(best / 1000, 2)
    return out


def _ms(value: float | None) -> int | None:
    return None if value is None else round(value)


def table(result: dict[str, Any]) -> str:
    kinds = ["human", "machine", "beep", "silence", "unknown"]
    lines = [
        "| class (expected) | calls | " + " | ".join(kinds) + " | accuracy | usable | TTV p50 / p99 ms |",
        "|---" * (len(kinds) + 5) + "|",
    ]
    for cls, row in result["classes"].items():
        cells = " | ".join(str(row["verdicts"][k]) for k in kinds)
        lines.append(
            f"| {cls} ({row['expected']}) | {row['calls']} | {cells} | {row['accuracy_pct']} % | "
            f"{row['usable_pct']} % | {row['ttv_p50_ms']} / {row['ttv_p99_ms']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 voices x 2 speeds at one level")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None, help="keep the generated audio in this folder")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--wrong", action="store_true", help="list every call with a wrong verdict")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="an AmdOptions field (repeatable)"
    )
    args = parser.parse_args()
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            print(f"{tool} is needed (bash tests/run.sh installs it)", file=sys.stderr)
            return 2
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="amd-corpus-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        calls = build_corpus(Synth(workdir, rng), rng, args.quick)
        built = time.monotonic() - started
        options = AmdOptions(
            **{k: float(v) if "." in v else int(v) for k, v in (a.split("=", 1) for a in args.set)}
        )
        result = evaluate(calls, options)
        result["frame_cost_us"] = frame_cost_us(options)
    result = {
        "profile": "quick" if args.quick else "full",
        "seed": args.seed,
        "corpus_seconds": round(built, 1),
        "options": {k: getattr(options, k) for k in options.__dataclass_fields__},
        **result,
    }
    print(table(result))
    print(
        f"\n{result['calls']} calls, accuracy {result['accuracy_pct']} % (usable {result['usable_pct']} %); "
        f"time to verdict p50 {result['ttv_all_p50_ms']} / p99 {result['ttv_all_p99_ms']} ms; "
        f"beep after machine: {result['beep_after_machine']}; "
        f"{result['frame_us_p50']} µs a frame (p50 of the calls' means, p99 {result['frame_us_p99']}); "
        f"CPU per frame, best of 5: {result['frame_cost_us']} µs"
    )
    if args.wrong:
        print("\n".join(result["wrong"]))
    out = args.output or Path(__file__).parent / "results" / f"amd-{result['profile']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
