"""The disclosure gate: a route's AI disclosure is the first audio of the call, and the call record says whether it
reached the carrier (sans-I/O: every call takes `now`, monotonic ns).

Callers and regulators require it (47 CFR 64.1200, state bot-disclosure laws, EU AI Act Art. 50). A route's
`disclosure` is either

- a recording (a WAV, 8 kHz mono 16-bit): the bridge plays it itself, through the playout, as item
  `disclosure`, so the carrier ledger (rtp/ledger.py) times every frame of it. It is `delivered` only when the
  ledger shows every frame of it handed to the carrier; until then no audio of the model plays — the line's
  output is held as while it rings (bridge/engine/reservoir.py `Line`): what the model says meanwhile waits in the
  reservoir (beyond its capacity: dropped, counted and reported as an output discontinuity with cause
  `disclosure`), and speakable updates (the route's greeting) and results wait too. The caller's words still
  reach the model. A barge-in during it cuts nothing of it (the model has nothing playing to cut), nor does a
  hold or a provider recovery clear it: the ledger says what left, whenever it left. A session's final message (the failure tone, a goodbye) clears it. When the call ends before the last frame
  left it is `partial` (some of it left) or `not_delivered` (none), with the reason: the call ended (the caller
  hung up), it was never answered, the session ended.
- a line of text: the model is told to say it, word for word, before anything else (its instructions, and the
  first thing it is asked to say: bridge/server/greeting.py), and the call record checks it against what was
  transmitted: `delivered` only when the first assistant utterance the ledger timed was not cut by a barge-in and
  its transcript contains the line (compared without case, punctuation and repeated spaces). A model cannot be
  made to say an exact sentence; a route that must prove the words uses a recording.

When: an inbound call's disclosure plays as the session starts (before the provider's first words); a placed
call's at the callee's answer — after answering-machine detection's release when AMD is on (a person's
`human` verdict, or a mailbox's beep, so the message left on it begins with the disclosure).

The recording consent (a route's `recording_consent` / `recording_consent_wav`: "this call is recorded") is the
same mechanism, a second announcement (`what` "consent" in its `DisclosureResult`): a recording plays as item
`consent` right after the disclosure's (the disclosure first: the caller learns who is speaking before what is
kept), both held ahead of the model, and is `delivered` only when the ledger shows its last frame sent; a line
of text joins the disclosure's line in the model's first words (disclosure, then consent) and the call record
checks the first utterance for each. The recording (bridge/server/recording.py) starts only on a `delivered`
consent, at the moment its last frame's audio ended on the wire (`ended_ms`). A barge-in cuts nothing of a
recording (it plays whole, so it counts), but cuts a line of text (not delivered: no recording this call).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from bridge.engine.commands import AudioDiscontinuity, DisclosureResult, Outbox, Outcome
from bridge.engine.reservoir import Line, OutputPath
from bridge.engine.timeline import Timeline
from rtp.audio import FRAME_MS
from rtp.ledger import ItemProgress
from rtp.units import NS_PER_MS

DISCLOSURE_ITEM = "disclosure"
CONSENT_ITEM = "consent"  # the recording consent's recording (module docstring)
ANNOUNCEMENT_ITEMS = (DISCLOSURE_ITEM, CONSENT_ITEM)  # the bridge's own audio, no utterance of the model's
TICK_NS = FRAME_MS * NS_PER_MS


@dataclass(frozen=True, slots=True)
class Disclosure:
    """A route's disclosure: a recording (`audio`, 8 kHz PCM16 mono) or a line for the model (`text`)."""

    audio: bytes | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        if (self.audio is None) == (self.text is None):
            raise ValueError("a disclosure is a recording or a line of text, exactly one of them")
        if self.audio is not None and (not self.audio or len(self.audio) % 2):
            raise ValueError(
                "a disclosure recording is 8 kHz 16-bit PCM: a whole number of samples, not none"
            )
        if self.text is not None and not self.text.strip():
            raise ValueError("a disclosure line is not empty")

    @property
    def kind(self) -> Literal["audio", "text"]:
        return "audio" if self.audio is not None else "text"


class DisclosureGate:
    """A recorded disclosure's state: `waiting` (the line is not up yet), `playing` (queued for the carrier),
    `done` (`result` says how it ended)."""

    def __init__(
        self,
        disclosure: Disclosure,
        item: str = DISCLOSURE_ITEM,
        what: Literal["disclosure", "consent"] = "disclosure",
    ) -> None:
        if disclosure.audio is None:
            raise ValueError("the gate plays a recording; a line of text is checked by the call record")
        self.audio = disclosure.audio
        self.item, self.what = item, what
        self.state: Literal["waiting", "playing", "done"] = "waiting"
        self.frames = 0  # frames queued for the carrier
        self.result: DisclosureResult | None = None
        self._checked = 0

    @property
    def holding(self) -> bool:
        """The model's audio may not play yet."""
        return self.state != "done"

    def start(self, frames: int, now: int) -> None:
        """The recording went to the playout as `frames` frames of item DISCLOSURE_ITEM."""
        self.state, self.frames, self._checked = "playing", frames, now

    def check(self, progress: ItemProgress | None, now: int, at_ms: int) -> DisclosureResult | None:
        """While it plays: delivered once the ledger shows every frame of it transmitted, else None."""
        self._checked = now
        if self.state != "playing" or progress is None or progress.frames < self.frames:
            return None
        return self._done("delivered", "every frame reached the carrier", progress, at_ms)

    def ended(self, progress: ItemProgress | None, reason: str, at_ms: int) -> DisclosureResult | None:
        """The call or the session ended (`reason`): partial or not delivered, unless it was (None: told before)."""
        if self.state == "done":
            return None
        if self.state == "playing" and progress is not None and progress.frames >= self.frames:
            return self._done("delivered", "every frame reached the carrier", progress, at_ms)
        left = progress.frames if progress is not None and self.state == "playing" else 0
        return self._done("partial" if left else "not_delivered", reason, progress, at_ms)

    def next_deadline(self) -> int | None:
        """While it plays: the ledger is read again a frame later (a call whose caller sends no RTP has no
        media tick to read it on)."""
        return self._checked + TICK_NS if self.state == "playing" else None

    def _done(
        self, outcome: Outcome, reason: str, progress: ItemProgress | None, at_ms: int
    ) -> DisclosureResult:
        self.state = "done"
        sent = progress.frames * FRAME_MS if progress is not None else 0
        self.result = DisclosureResult(
            outcome, "audio", reason, sent, self.frames * FRAME_MS, at_ms, self.what
        )
        return self.result

    def stamp_end(self, ended_ms: int) -> DisclosureResult | None:
        """A delivered recording's end on the wire (session ms), put in its result."""
        if self.result is not None and self.result.outcome == "delivered":
            self.result = replace(self.result, ended_ms=ended_ms)
        return self.result


class DisclosureRoom:
    """A route's recorded announcements in one session — the disclosure, then the recording consent: held from
    the start, played at the answer (in that order, back to back), read from the ledger while they play, each
    told when it reached the carrier or when the call ended first; the model is heard once both are over.
    Without a recording (none, or lines of text) every call here is a no-op."""

    def __init__(
        self,
        gate: DisclosureGate | None,
        output: OutputPath,
        line: Line,
        out: Outbox,
        timeline: Timeline,
        now: int,
        consent: DisclosureGate | None = None,
    ) -> None:
        self.gate, self._output, self._line, self._out, self._timeline = gate, output, line, out, timeline
        self.consent = consent
        self._gates = tuple(g for g in (gate, consent) if g is not None)  # the order they play in
        if self._gates:
            line.disclose(now)  # the model's output waits for them from the start

    def answered(self, now: int) -> bool:
        """The line is up (an inbound session's start, a placed call's answer): the recordings go to the
        playout ahead of anything of the model's. True when they began."""
        waiting = [g for g in self._gates if g.state == "waiting"]
        for gate in waiting:
            gate.start(self._output.play_disclosure(gate.audio, gate.item), now)
        return bool(waiting)

    def check(self, now: int) -> None:
        """While they play (the coordinator asks while `Line.disclosing`): each is told once the ledger shows
        all of it sent; once all are, the model is heard, and what it said beyond the reservoir's capacity
        meanwhile is an output discontinuity."""
        ledger = self._output.channel.ledger
        for gate in self._gates:
            if gate.state == "playing":
                progress = ledger.progress(gate.item)
                if gate.check(progress, now, self._timeline.ms(now)) is not None:
                    self._tell(gate, progress)
        if not self._gates or any(g.state != "done" for g in self._gates):
            return
        self._output.protected = False
        if dropped := self._line.disclosed(now):
            self._out.notices.append(
                AudioDiscontinuity("output", dropped, "disclosure", self._timeline.ms(now))
            )

    def over(self, reason: str, now: int) -> None:
        """The call or the session ends: a recording that has not reached the carrier is partial or not
        delivered, and a goodbye is not held behind it."""
        pending = [g for g in self._gates if g.state != "done"]
        for gate in pending:
            progress = self._output.channel.ledger.progress(gate.item)
            if gate.ended(progress, reason, self._timeline.ms(now)) is not None:
                self._tell(gate, progress)
        if pending:
            self._output.protected = False
            self._line.disclosed(now)

    def _tell(self, gate: DisclosureGate, progress: ItemProgress | None) -> None:
        """A gate's result as a notice; a delivered one says when its last frame's audio ended on the wire."""
        result = gate.result
        if progress is not None:
            result = gate.stamp_end(self._timeline.ms(progress.last_ns) + FRAME_MS)
        if result is not None:
            self._out.notices.append(result)

    def leg_ended(self, now: int) -> None:
        """The call leg is gone: the callee hung up, or a placed call was never answered."""
        self.over("the call was never answered" if self._line.unanswered else "the call ended", now)

    def next_deadline(self) -> int | None:
        return min((d for g in self._gates if (d := g.next_deadline()) is not None), default=None)


_WORDS = re.compile(r"[^\w]+")


def said(line: str, transcript: str) -> bool:
    """Whether `transcript` contains `line`, compared without case, punctuation and repeated spaces."""
    want = " ".join(_WORDS.sub(" ", line.casefold()).split())
    have = " ".join(_WORDS.sub(" ", transcript.casefold()).split())
    return bool(want) and f" {want} " in f" {have} "


def text_result(line: str, transcript: str | None, cut: bool, heard_ms: int, at_ms: int) -> DisclosureResult:
    """A line of text's outcome from the first assistant utterance (None: the model said nothing that left)."""
    if transcript is None or heard_ms <= 0:
        return DisclosureResult(
            "not_delivered", "text", "the model said nothing the carrier took", 0, None, at_ms
        )
    if not said(line, transcript):
        reason = "the first thing the model said was not the disclosure"
        return DisclosureResult("not_delivered", "text", reason, heard_ms, None, at_ms)
    if cut:
        return DisclosureResult("partial", "text", "a barge-in cut it", heard_ms, None, at_ms)
    return DisclosureResult("delivered", "text", "the first utterance said it in full", heard_ms, None, at_ms)


def disclosure_instruction(line: str) -> str:
    """What the model's instructions say of a line of text."""
    return (
        f'Before anything else on this call, your first words are exactly: "{line}" '
        "Say it word for word, then go on."
    )
