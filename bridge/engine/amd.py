"""Answering-machine detection (AMD) on the callee's first seconds of an outbound call.

Sans-I/O: the shell feeds the callee's 8 kHz 16-bit mono PCM, one 20 ms frame at a time (`frame(pcm, now)`,
`now` in monotonic ns, when the frame was received: the end of its 20 ms of audio), tells the answer
(`answered(now)`) and runs `handle_timer(now)` at `next_deadline()`. Out comes exactly one `AmdVerdict` —
`human`, `machine`, `beep`, `silence` or `unknown` — within `total_ms` of the answer, and after a `machine`
verdict exactly one of `AmdBeep` (the mailbox's tone has ended: leave the message now) or `AmdNoBeep` (the
greeting ended without one, or none came within `beep_wait_ms`).

**Timers start at the answer, never at early media** (a long ring with a 183 announcement must not use up the
budget: AMD timers armed before the answer are a common complaint of AMD users, whatever the vendor). Frames
before `answered` start nothing and are not analysed; they are only counted as evidence, flagged as such
(`early_media_ms`, `early_voiced_ms` in the verdict: audio above `min_voice_dbfs` heard before the answer,
e.g. an IVR or an announcement).

The rules (after the cadence rules of Asterisk's `app_amd`, the long-standing open reference, with the beep as
an event of its own, as hosted AMDs report a message's end):

- **Voice.** A frame is voiced when its level is above both `min_voice_dbfs` and an adaptive noise floor +
  `voice_margin_db`. The floor follows quiet frames down at once and up by `floor_rise_db_per_s`. A voiced
  stretch counts as speech only once its level has moved by `speech_swing_db` (syllables rise and fall by
  10-30 dB; a steady noise moves by 1-2 dB between 20 ms frames): a stretch that stays level for
  `steady_noise_ms` is a noise, whose level becomes the floor. Tonal frames (below) never move the floor and
  never start a word, but continue one under way (a vowel can be as pure as a tone).
- **Words and the greeting.** Voiced stretches separated by `word_gap_ms` or more of non-voice are words; the
  greeting runs from the first word's start to the last word's end.
- **human**: a greeting of at most `human_greeting_ms` followed by `after_greeting_silence_ms` of silence (a
  person says "hello?" and waits). A greeting between `human_greeting_ms` and `machine_greeting_ms` followed
  by `after_long_greeting_silence_ms` of silence is a person too ("yes, hello, who is this?"): a recorded
  greeting rarely pauses that long in its first seconds.
- **machine**: a greeting that reaches `machine_greeting_ms`, or `machine_words` words (a recorded greeting
  runs on with short pauses; a person stops and waits for an answer).
- **beep**: a tone (one Goertzel bin of `beep_frequencies_hz` holds `beep_tonality` of the frame's energy, the
  frequency steady within `beep_drift_hz` and the level within `beep_level_step_db` from frame to frame) of at
  least `beep_min_ms`, reported when it ends (the mailbox records from then on). A tone before any other
  verdict is the verdict `beep` (a mailbox with no greeting, or one shorter than the cadence rules need);
  after a `machine` verdict it is an `AmdBeep` event. Dual tones (ringback 440+480 Hz, 400+450 Hz) split their
  energy and are not a beep.
- **silence**: no voice at all for `initial_silence_ms` after the answer (frames or none: a peer that sends
  nothing during silence, RFC 3389-style, is timed by the clock). A voiced stretch under way at that moment is
  given the time to prove itself a word or a noise (at most `steady_noise_ms`).
- **unknown**: none of the above by `total_ms` after the answer.

Where the rules are silent, the choice is the one that costs the caller least: a greeting of middling length
followed by a real pause is a person (talking over a mailbox costs a message; a person hung up on, or given a
recorded message, costs the call). Frames of any length but one 20 ms frame (odd, empty, other packet times)
are counted in `frames_ignored` and ignored: the media layer delivers 20 ms frames.

**After the verdict: the application's choice** (`AmdChoice`, sans-I/O on the same `now`): `talk` (the model is
released: its held first words go), `message` (a message is left: the model is told to say the route's text,
or the bridge plays its recording, then the call is hung up once it has played) or `hang_up` (BYE, the model
never speaks and nothing more is funded). A person (`human`), `silence` and `unknown` get `talk`; a mailbox
(`machine`, `beep`) gets its route's `AmdPolicy.machine`. The application may answer the verdict with another
action within `AmdPolicy.decide_ms` (a late answer is ignored: the route's choice has been made). `hang_up`
starts as soon as it is chosen; `talk` and `message` to a mailbox start when its greeting is over: at the beep
(`AmdBeep`), when the greeting ended in silence or no beep came within `beep_wait_ms` (`AmdNoBeep`), at once
after a `beep` verdict (the tone has ended). Where the rules are silent: a person is never hung up on or given
a recording by the route's default (a wrong `human` verdict costs a message, a wrong `machine` the call), and
an application's `message` with no message configured keeps the route's choice (it cannot be left).

Cost: a level (one dot product) per frame, and the Goertzel bank — all bins evaluated at once as one matrix
product on a Hann-windowed frame — only on frames above `min_voice_dbfs`. bridge/engine/vad.py's detector is not
reused as such: its threshold is fixed and its level comes from `audioop` (gone in Python 3.13); its rule (a
level threshold with a hangover) is the base of the voice rule here. Measured (tests/bench/amd.py): about 4 µs
a quiet frame and 11 µs a voiced or tonal one, and only until the last event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from rtp.audio import FRAME_MS, FRAME_SAMPLES, PCM16_FRAME_BYTES, SAMPLE_RATE
from rtp.units import NS_PER_MS

VerdictKind = Literal["human", "machine", "beep", "silence", "unknown"]
AmdAction = Literal["talk", "message", "hang_up"]
AMD_ACTIONS: tuple[AmdAction, ...] = ("talk", "message", "hang_up")
MACHINE_VERDICTS: frozenset[str] = frozenset({"machine", "beep"})  # a mailbox: its route's choice applies

_FULL_SCALE_ENERGY = 32768.0 * 32768.0 * FRAME_SAMPLES
# a tone whose frames stopped (a peer silent between packets) has ended
_TONE_END_NS = 3 * FRAME_MS * NS_PER_MS


def _default_beep_frequencies() -> tuple[int, ...]:
    # 400-2,000 Hz every 50 Hz (the Hann window's main lobe is ±100 Hz at 160 samples, so a tone between two
    # bins loses at most 1.4 dB), plus 440 Hz, the most common beep besides 1 kHz.
    return tuple(sorted({*range(400, 2001, 50), 440}))


@dataclass(frozen=True, slots=True)
class AmdOptions:
    """The detector's parameters; the defaults were tuned on tests/bench/amd.py's corpus (its README)."""

    #: verdict at the latest this long after the answer (`unknown` when no rule decided): 4 s, against the
    #: 5 s of app_amd's total_analysis_time; a person who hears nothing for longer says "hello?" again.
    total_ms: int = 4000
    #: no voice this long after the answer: `silence` (app_amd's initial_silence, 2,500 ms).
    initial_silence_ms: int = 2500
    #: a greeting at most this long, then `after_greeting_silence_ms` of silence: `human` (app_amd's
    #: greeting, 1,500 ms: "hello?" is 0.4-0.8 s, "yes, hello, who is this?" about 1.5 s).
    human_greeting_ms: int = 1500
    after_greeting_silence_ms: int = 800
    #: a greeting between `human_greeting_ms` and `machine_greeting_ms` needs this much silence to be human.
    after_long_greeting_silence_ms: int = 1000
    #: a greeting that reaches this length is a `machine` (recorded greetings run 5-30 s).
    machine_greeting_ms: int = 2500
    #: this many words (voiced stretches) before a pause of `after_greeting_silence_ms`: `machine`.
    machine_words: int = 5
    #: non-voice that separates two words (shorter gaps are inside a word); app_amd's between_words_silence
    #: is 50 ms, too short for speech synthesis whose stops are 60-90 ms.
    word_gap_ms: int = 100
    #: a voiced stretch shorter than this is a click, not a word (app_amd's min_word_length, 100 ms).
    min_word_ms: int = 100
    #: voice is above both this level and the noise floor + `voice_margin_db` (-45 dBFS is well under
    #: telephone speech, -10 to -30 dBFS, and above a quiet line, -55 to -70).
    min_voice_dbfs: float = -45.0
    voice_margin_db: float = 10.0
    #: the floor before the first frame (a quiet line), and how fast it follows a line that gets noisier
    #: (a slow rise: a floor that chased every syllable's tail would cut words short).
    floor_start_dbfs: float = -65.0
    floor_rise_db_per_s: float = 3.0
    #: a voiced stretch is speech once its level has moved this much; level this long without: a noise.
    speech_swing_db: float = 6.0
    steady_noise_ms: int = 300
    #: beep: the share of the frame's (windowed) energy in one Goertzel bin (a pure tone: 0.72-1.0; noise,
    #: dual tones and most speech: under 0.5, though a pure vowel reaches 0.9: `beep_level_step_db`), for at
    #: least `beep_min_ms` of consecutive frames whose frequency moves by at most `beep_drift_hz`.
    beep_tonality: float = 0.65
    beep_min_ms: int = 140
    beep_drift_hz: int = 60
    #: a beep's level is flat (±0.1 dB from frame to frame, µ-law included); a tonal vowel's moves by 4-15 dB
    #: (espeak-ng's high female voices at slow speeds put 80-95 % of a vowel's energy in its 400 Hz
    #: fundamental). The first step is free: the first frame may hold only part of the tone.
    beep_level_step_db: float = 2.0
    beep_frequencies_hz: tuple[int, ...] = field(default_factory=_default_beep_frequencies)
    #: after `machine`, how long to wait for the beep; a greeting followed by this much silence and no tone
    #: ends with `AmdNoBeep`.
    beep_wait_ms: int = 30_000
    message_end_silence_ms: int = 2000

    def __post_init__(self) -> None:
        durations = {
            name: getattr(self, name)
            for name in (
                "total_ms",
                "initial_silence_ms",
                "human_greeting_ms",
                "after_greeting_silence_ms",
                "after_long_greeting_silence_ms",
                "machine_greeting_ms",
                "word_gap_ms",
                "beep_min_ms",
                "beep_wait_ms",
                "message_end_silence_ms",
            )
        }
        bad = [f"{name}={value}" for name, value in durations.items() if value <= 0]
        if self.machine_words < 1:
            bad.append(f"machine_words={self.machine_words}")
        if not self.beep_frequencies_hz or not all(
            0 < hz < SAMPLE_RATE // 2 for hz in self.beep_frequencies_hz
        ):
            bad.append(f"beep_frequencies_hz={self.beep_frequencies_hz}")
        if bad:
            raise ValueError("AMD options out of range: " + ", ".join(bad))


@dataclass(frozen=True, slots=True)
class AmdVerdict:
    """Who answered. Durations in ms; `greeting_ms` is the first word's start to the last word's end."""

    kind: VerdictKind
    at_ns: int
    reason: str
    since_answer_ms: int
    initial_silence_ms: int  # the answer to the first word (the whole wait when there was none)
    greeting_ms: int
    speech_ms: int  # voiced time in words
    words: int
    trailing_silence_ms: int  # the last word's end to the verdict
    tone_ms: int  # the tone of a `beep` verdict
    tone_hz: int
    early_media_ms: int  # audio before the answer: evidence only, never timed
    early_voiced_ms: int


@dataclass(frozen=True, slots=True)
class AmdBeep:
    """After a `machine` verdict: the mailbox's tone ended at `at_ns`; the message may start now."""

    at_ns: int
    reason: str
    since_answer_ms: int
    tone_ms: int
    tone_hz: int


@dataclass(frozen=True, slots=True)
class AmdNoBeep:
    """After a `machine` verdict: no tone came (the greeting ended in silence, or the wait ran out)."""

    at_ns: int
    reason: str
    since_answer_ms: int


AmdEvent = AmdVerdict | AmdBeep | AmdNoBeep


class _Bank:
    """The Goertzel bins of `frequencies` on a Hann-windowed 20 ms frame, as one (160 x 2K) matrix."""

    def __init__(self, frequencies: tuple[int, ...]) -> None:
        n = np.arange(FRAME_SAMPLES)
        self.frequencies = frequencies
        self.window = (0.5 - 0.5 * np.cos(2 * np.pi * n / FRAME_SAMPLES)).astype(np.float32)
        omega = 2 * np.pi * np.asarray(frequencies, dtype=np.float64)[None, :] * n[:, None] / SAMPLE_RATE
        self.matrix = np.concatenate([np.cos(omega), np.sin(omega)], axis=1).astype(np.float32)
        self.k = len(frequencies)
        self._samples = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        self._windowed = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        self._parts = np.zeros(2 * self.k, dtype=np.float32)
        self._power = np.zeros(self.k, dtype=np.float32)
        self._cos, self._sin = self._parts[: self.k], self._parts[self.k :]
        self._norm = 1.0
        # calibrate: a pure tone on a bin has tonality 1
        tone = 10000 * np.sin(2 * np.pi * 1000 * n / SAMPLE_RATE)
        self._norm = 1.0 / self.tonality_of(tone.astype("<i2").tobytes())[0]

    def energy(self, pcm: bytes) -> float:
        """The frame's energy (sum of squares); keeps the samples for `tonality`."""
        samples = self._samples
        np.copyto(samples, np.frombuffer(pcm, dtype="<i2"), casting="unsafe")
        return float(samples @ samples)

    def tonality(self) -> tuple[float, int]:
        """(share of the windowed energy in the strongest bin, its frequency) of the last `energy` frame."""
        windowed = np.multiply(self._samples, self.window, out=self._windowed)
        total = float(windowed @ windowed)
        if total <= 0.0:
            return 0.0, 0
        parts = np.matmul(windowed, self.matrix, out=self._parts)  # no allocation per frame
        np.multiply(parts, parts, out=parts)
        power = np.add(self._cos, self._sin, out=self._power)
        best = int(power.argmax())
        return float(power[best]) * self._norm / total, self.frequencies[best]

    def tonality_of(self, pcm: bytes) -> tuple[float, int]:
        self.energy(pcm)
        return self.tonality()


class AnsweringMachineDetector:
    def __init__(self, options: AmdOptions | None = None) -> None:
        self.options = o = options or AmdOptions()
        self._bank = _Bank(o.beep_frequencies_hz)
        self._floor_rise = o.floor_rise_db_per_s * FRAME_MS / 1000
        self.frames_ignored = 0
        self.verdict: AmdVerdict | None = None
        self.done = False  # no event will come any more
        self._answered: int | None = None
        self._early_ms = 0
        self._early_voiced_ms = 0
        self._floor = o.floor_start_dbfs
        # the voiced stretch under way (pending until its level swings: then a word)
        self._run_start = 0
        self._run_frames = 0
        self._run_min = 0.0
        self._run_max = 0.0
        self._run_is_speech = False
        self._gap_frames = 0  # non-voice frames since the last voiced frame
        # the greeting
        self._first_word: int | None = None
        self._last_voice_end = 0
        self._words = 0
        self._speech_ms = 0
        # the tone under way
        self._tone_frames = 0
        self._tone_hz = 0
        self._tone_level = 0.0
        self._tone_sum_hz = 0
        self._tone_last = 0
        self._beep_deadline: int | None = None

    # ---------------------------------------------------------------- inputs

    def answered(self, now: int) -> None:
        """The 200 OK: the clock starts now (a second call changes nothing)."""
        if self._answered is None and not self.done:
            self._answered = now

    def frame(self, pcm: bytes, now: int) -> AmdEvent | None:
        if self.done:
            return None
        if len(pcm) != PCM16_FRAME_BYTES:
            self.frames_ignored += 1
            return None
        answered = self._answered
        if answered is None:
            self._early_ms += FRAME_MS
            if self._level(self._bank.energy(pcm)) > self.options.min_voice_dbfs:
                self._early_voiced_ms += FRAME_MS
            return None
        due = self.handle_timer(now)
        if due is not None or self.done:
            return due
        return self._analyse(pcm, now)

    def next_deadline(self) -> int | None:
        if self.done or self._answered is None:
            return None
        o = self.options
        tone_end = self._tone_last + _TONE_END_NS if self._tone_frames * FRAME_MS >= o.beep_min_ms else None
        if self.verdict is not None:  # machine: waiting for the beep
            deadline = self._beep_deadline
            if tone_end is not None:
                return _earlier(deadline, tone_end)
            if self._words_done():
                deadline = _earlier(deadline, self._last_voice_end + o.message_end_silence_ms * NS_PER_MS)
            return deadline
        deadline = self._answered + o.total_ms * NS_PER_MS
        if tone_end is not None:  # a tone under way decides when it ends
            return min(deadline, tone_end)
        if self._first_word is None:
            return min(deadline, self._silence_deadline())
        if self._words_done():
            return min(deadline, self._last_voice_end + self._human_silence_ms() * NS_PER_MS)
        return deadline

    def handle_timer(self, now: int) -> AmdEvent | None:
        """Decides what time alone decides: the budget, the silences, a tone whose frames stopped."""
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return None
        o = self.options
        if self._tone_frames * FRAME_MS >= o.beep_min_ms:
            return self._tone_ended(now)  # its frames stopped, or the budget ran out during it
        if self.verdict is not None:
            return self._end(AmdNoBeep(now, self._no_beep_reason(now), self._since(now)))
        assert self._answered is not None
        if self._first_word is None and now >= self._silence_deadline():
            return self._decide("silence", now, f"no voice for {o.initial_silence_ms} ms after the answer")
        if self._first_word is not None and self._words_done():
            silence = self._silence_ms(now)
            if silence >= self._human_silence_ms():
                return self._decide(
                    "human", now, f"a greeting of {self._greeting_ms()} ms, then {silence} ms of silence"
                )
        if now >= self._answered + o.total_ms * NS_PER_MS:
            return self._decide("unknown", now, f"no rule decided within {o.total_ms} ms of the answer")
        return None

    # ---------------------------------------------------------------- analysis

    def _analyse(self, pcm: bytes, now: int) -> AmdEvent | None:
        o = self.options
        level = self._level(self._bank.energy(pcm))
        if level > o.min_voice_dbfs:
            tonality, hz = self._bank.tonality()
            if tonality >= o.beep_tonality:
                event = None
                if self._tone_frames and (
                    abs(hz - self._tone_hz) > o.beep_drift_hz
                    or (self._tone_frames > 1 and abs(level - self._tone_level) > o.beep_level_step_db)
                ):  # another tone, or not a steady one
                    event = self._tone_ended(now) if self._tone_frames * FRAME_MS >= o.beep_min_ms else None
                    self._tone_frames = self._tone_sum_hz = 0
                if not self.done:
                    self._tone_frames += 1
                    self._tone_hz = hz
                    self._tone_level = level
                    self._tone_sum_hz += hz
                    self._tone_last = now
                    # a tonal frame continues a word under way (a sung vowel), never starts one
                    voiced = self._run_frames > 0 and self._gap_frames == 0 and self._is_voice(level)
                    event = self._voice(voiced, level, now, tonal=True)
                return event
        if self._tone_frames:
            if self._tone_frames * FRAME_MS >= o.beep_min_ms:
                return self._tone_ended(now)
            self._tone_frames = 0
            self._tone_sum_hz = 0
        return self._voice(self._is_voice(level), level, now, tonal=False)

    def _is_voice(self, level: float) -> bool:
        return level > self.options.min_voice_dbfs and level > self._floor + self.options.voice_margin_db

    def _voice(self, voiced: bool, level: float, now: int, *, tonal: bool) -> AmdEvent | None:
        o = self.options
        if voiced:
            if self._run_frames == 0:
                self._run_start = now - FRAME_MS * NS_PER_MS  # the frame's first sample
                self._run_min = self._run_max = level
                self._run_is_speech = False
            else:
                self._run_min = min(self._run_min, level)
                self._run_max = max(self._run_max, level)
            self._run_frames += 1
            self._gap_frames = 0
            if not self._run_is_speech:
                if (
                    self._run_max - self._run_min >= o.speech_swing_db
                    and self._run_frames * FRAME_MS >= o.min_word_ms
                ):
                    self._run_is_speech = True
                    self._word_started(self._run_start)
                elif self._run_frames * FRAME_MS >= o.steady_noise_ms:
                    self._floor = self._run_max  # a steady noise: its level is the floor from now on
                    self._run_frames = 0
                    return None
            if self._run_is_speech:
                self._speech_ms += FRAME_MS
                self._last_voice_end = now
                return self._cadence(now)
            return None
        if not tonal:
            self._floor = min(level, self._floor + self._floor_rise)
        self._gap_frames += 1
        if self._run_frames and self._gap_frames * FRAME_MS >= o.word_gap_ms:
            self._run_frames = 0
        return None

    def _word_started(self, start: int) -> None:
        if self._first_word is None:
            self._first_word = start
        self._words += 1
        # the pending frames of the stretch were voice too
        self._speech_ms += (self._run_frames - 1) * FRAME_MS

    def _cadence(self, now: int) -> AmdEvent | None:
        o = self.options
        if self.verdict is not None:
            return None
        greeting = self._greeting_ms()
        if greeting >= o.machine_greeting_ms:
            return self._decide("machine", now, f"a greeting of {greeting} ms without a pause")
        if self._words >= o.machine_words:
            return self._decide("machine", now, f"{self._words} words without a pause")
        return None

    def _tone_ended(self, now: int) -> AmdEvent:
        ms = self._tone_frames * FRAME_MS
        hz = round(self._tone_sum_hz / self._tone_frames)
        self._tone_frames = 0
        self._tone_sum_hz = 0
        if self.verdict is not None:
            return self._end(
                AmdBeep(now, f"a {hz} Hz tone of {ms} ms after the greeting", self._since(now), ms, hz)
            )
        return self._decide("beep", now, f"a {hz} Hz tone of {ms} ms", tone_ms=ms, tone_hz=hz)

    # ---------------------------------------------------------------- helpers

    def _decide(
        self, kind: VerdictKind, now: int, reason: str, tone_ms: int = 0, tone_hz: int = 0
    ) -> AmdVerdict:
        assert self._answered is not None
        first = self._first_word
        verdict = AmdVerdict(
            kind=kind,
            at_ns=now,
            reason=reason,
            since_answer_ms=self._since(now),
            initial_silence_ms=(first - self._answered) // NS_PER_MS
            if first is not None
            else self._since(now),
            greeting_ms=self._greeting_ms(),
            speech_ms=self._speech_ms,
            words=self._words,
            trailing_silence_ms=self._silence_ms(now) if first is not None else 0,
            tone_ms=tone_ms,
            tone_hz=tone_hz,
            early_media_ms=self._early_ms,
            early_voiced_ms=self._early_voiced_ms,
        )
        self.verdict = verdict
        if kind == "machine":
            self._beep_deadline = now + self.options.beep_wait_ms * NS_PER_MS
        else:
            self.done = True
        return verdict

    def _end(self, event: AmdBeep | AmdNoBeep) -> AmdBeep | AmdNoBeep:
        self.done = True
        return event

    def _no_beep_reason(self, now: int) -> str:
        if self._beep_deadline is not None and now >= self._beep_deadline:
            return f"no tone within {self.options.beep_wait_ms} ms of the verdict"
        return f"the greeting ended in {self._silence_ms(now)} ms of silence without a tone"

    def _silence_deadline(self) -> int:
        """The initial silence's end; a voiced stretch under way then is given the time to prove a word."""
        assert self._answered is not None
        o = self.options
        deadline = self._answered + o.initial_silence_ms * NS_PER_MS
        if self._run_frames and self._gap_frames == 0:
            wait = max(o.min_word_ms, o.steady_noise_ms) + FRAME_MS
            deadline = max(deadline, self._run_start + wait * NS_PER_MS)
        return deadline

    def _words_done(self) -> bool:
        """No word under way: the last voiced stretch has ended."""
        return not (self._run_frames and self._gap_frames == 0)

    def _human_silence_ms(self) -> int:
        o = self.options
        if self._greeting_ms() <= o.human_greeting_ms:
            return o.after_greeting_silence_ms
        return o.after_long_greeting_silence_ms

    def _greeting_ms(self) -> int:
        if self._first_word is None:
            return 0
        return max(0, (self._last_voice_end - self._first_word) // NS_PER_MS)

    def _silence_ms(self, now: int) -> int:
        return max(0, (now - self._last_voice_end) // NS_PER_MS)

    def _since(self, now: int) -> int:
        assert self._answered is not None
        return (now - self._answered) // NS_PER_MS

    @staticmethod
    def _level(energy: float) -> float:
        return 10 * math.log10(energy / _FULL_SCALE_ENERGY) if energy > 0 else -math.inf


def _earlier(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


# ---------------------------------------------------------------------------------------------------- the choice


@dataclass(frozen=True, slots=True)
class AmdPolicy:
    """What a call does after the verdict (module docstring): the route's choice for a mailbox, and how long the
    application's answer to the verdict is waited for."""

    #: a mailbox (`machine`, `beep`): `talk` (the model's greeting after the beep, as to a person), `message`
    #: (the route's message after the beep, then BYE) or `hang_up` (BYE at the verdict).
    machine: AmdAction = "talk"
    #: the application's answer to the verdict, waited for at most this long after it (a person who said
    #: "hello?" has waited 0.8 s already; an answer on a LAN takes tens of ms).
    decide_ms: int = 500

    def __post_init__(self) -> None:
        if self.machine not in AMD_ACTIONS:
            raise ValueError(f"AMD machine action {self.machine!r}: expected one of {', '.join(AMD_ACTIONS)}")
        if self.decide_ms < 0:
            raise ValueError(f"AMD decide_ms={self.decide_ms}: expected 0 or more")


@dataclass(frozen=True, slots=True)
class AmdStart:
    """The chosen action starts now (`by`: the route's default, or the application's answer)."""

    action: AmdAction
    verdict: VerdictKind
    by: Literal["route", "application"]
    at_ns: int
    since_answer_ms: int


class AmdChoice:
    """After the detector's verdict: which action, and when it starts (module docstring). Feed it the detector's
    events (`event`), the application's answer (`answer`) and its timer (`handle_timer` at `next_deadline`);
    out comes at most one `AmdStart`. `can_message`: a message is configured (else `message` cannot be left)."""

    __slots__ = ("policy", "can_message", "verdict", "chosen", "by", "started", "late", "_due", "_cue")

    def __init__(self, policy: AmdPolicy | None = None, *, can_message: bool = False) -> None:
        self.policy = policy or AmdPolicy()
        self.can_message = can_message
        self.verdict: AmdVerdict | None = None
        self.chosen: AmdAction | None = None
        self.by: Literal["route", "application"] = "route"
        self.started: AmdStart | None = None
        self.late = 0  # the application's answers that came after the choice was made
        self._due: int | None = None  # the application's answer is waited for until then
        self._cue = False  # the mailbox's greeting is over (its beep, or none)

    def default(self, kind: VerdictKind) -> AmdAction:
        """The route's action for a verdict: its `machine` choice for a mailbox, `talk` for anyone else."""
        if kind not in MACHINE_VERDICTS or (self.policy.machine == "message" and not self.can_message):
            return "talk"
        return self.policy.machine

    def event(self, event: AmdEvent, now: int) -> AmdStart | None:
        if isinstance(event, AmdVerdict):
            if self.verdict is not None:
                return None
            self.verdict = event
            self._cue = event.kind != "machine"  # only a machine's greeting may still be running
            self._due = now + self.policy.decide_ms * NS_PER_MS
        else:
            self._cue = True
        return self._decided(now) if self._due is not None and now >= self._due else self._go(now)

    def answer(self, action: str | None, now: int) -> AmdStart | None:
        """The application's answer to the verdict: an action, or None for the route's. Ignored once the
        choice was made (counted in `late`), or when it names no action this call can take."""
        if self.verdict is None or self.chosen is not None:
            self.late += 1
            return None
        chosen = next((a for a in AMD_ACTIONS if a == action), None)
        if chosen is not None and (chosen != "message" or self.can_message):
            self.chosen, self.by = chosen, "application"
        else:
            self.chosen = self.default(self.verdict.kind)
        self._due = None
        return self._go(now)

    def next_deadline(self) -> int | None:
        return self._due if self.chosen is None else None

    def handle_timer(self, now: int) -> AmdStart | None:
        if self._due is None or now < self._due or self.chosen is not None:
            return None
        return self._decided(now)

    def _decided(self, now: int) -> AmdStart | None:
        assert self.verdict is not None
        if self.chosen is None:  # no answer in time: the route's choice
            self.chosen = self.default(self.verdict.kind)
            self._due = None
        return self._go(now)

    def _go(self, now: int) -> AmdStart | None:
        chosen, verdict = self.chosen, self.verdict
        if chosen is None or verdict is None or self.started is not None:
            return None
        if chosen != "hang_up" and not self._cue:
            return None  # a mailbox's greeting is still running: its beep (or none) starts it
        since = verdict.since_answer_ms + (now - verdict.at_ns) // NS_PER_MS
        self.started = AmdStart(chosen, verdict.kind, self.by, now, since)
        return self.started


#: what the model is told when it is to leave the message (`message` with a text): the text is the route's
MESSAGE_NOTE = (
    "You have reached an answering machine and its beep has sounded: you are recording a voicemail. Say this "
    "message now, as it is, and nothing else: {text}"
)
#: a message the model speaks is given this long to have played before the BYE (end_call's goodbye has 10 s)
MESSAGE_WITHIN_MS = 60_000


@dataclass(frozen=True, slots=True)
class AmdPlan:
    """An outbound call's machine detection and what follows it: the detector's options, the route's choice,
    the greeting the model says on `talk`, and the message (a text the model is told to say, or PCM16 8 kHz
    mono audio the bridge plays: the audio when both are given)."""

    options: AmdOptions = field(default_factory=AmdOptions)
    policy: AmdPolicy = field(default_factory=AmdPolicy)
    greeting: str | None = None
    message: str | None = None
    message_audio: bytes | None = None

    @property
    def can_message(self) -> bool:
        return bool(self.message_audio) or bool(self.message and self.message.strip())


class AmdTarget(Protocol):
    """The session core as the choice drives it (bridge/engine/coordinator.py `SessionCoordinator`)."""

    def answered(self, now: int) -> None: ...

    def push_update(self, text: str, *, speak: bool, now: int) -> bool: ...

    def end(self, reason: str, now: int, *, message: bytes | None = None) -> None: ...

    def end_after_speech(self, reason: str, now: int, within_ms: int) -> None: ...


def carry_out(core: AmdTarget, start: AmdStart, plan: AmdPlan, now: int) -> None:
    """The chosen action on the session core: `talk` releases the model (what it holds goes: S7's ringing line
    is answered) and asks for the greeting; `message` plays the recording then BYE, or releases the model with
    the message to say and ends the call once it has played; `hang_up` ends the call at once, the model never
    released (S6: nothing is opened, authorised or funded after)."""
    if start.action == "hang_up":
        core.end(f"AMD {start.verdict}: hung up ({start.by}'s choice)", now)
    elif start.action == "message" and plan.message_audio:
        core.end(
            f"AMD {start.verdict}: message played ({start.by}'s choice)", now, message=plan.message_audio
        )
    elif start.action == "message" and plan.message:
        core.answered(now)
        core.push_update(MESSAGE_NOTE.format(text=plan.message.strip()), speak=True, now=now)
        core.end_after_speech(
            f"AMD {start.verdict}: message left ({start.by}'s choice)", now, MESSAGE_WITHIN_MS
        )
    else:
        core.answered(now)
        if plan.greeting:
            core.push_update(plan.greeting, speak=True, now=now)
