"""DESIGN §14 S1-S7: the session core's promises as properties, over every interleaving hypothesis can find.

A `RuleBasedStateMachine` drives one `SessionCoordinator` (rollover on, with the scaled ages of
tests/support/rollover_session.py) and a real `Playout` on virtual time, as `RolloverCall` does, with every
kind of step interleaved: the caller's speech and pauses, each connection's events, faults, the rollover's
questions and their answers, the application's answers and updates, hold and ringing, and hang-up. The
cases it found are kept below as plain regression tests, each failing on the promise it names.

The provider is modelled faithfully, because a false alarm here costs more than a missed hole:
- a connection hears only the caller frames the core sent it (`SendAudio`), and its clock counts them (the
  `at_ms` of its speech events is its audio position, as Realtime's `audio_start_ms`);
- its server VAD ends a segment after 200 ms of silence it heard, or at a `CommitInput`, and transcribes it
  (`<uN:a-b>` stands for the words of the frames a to b of the caller's utterance N that it heard: two texts
  of one utterance are the same words only where their frames overlap); a connection whose input stops
  in mid-segment without a commit keeps the segment open (no silence ever comes) and says nothing of it
  (GPT-Live, which captions as it hears, sends the caption of what it heard);
- its events leave in order (one WebSocket) and reach the core within `LATENCY_MS` unless a step delivers
  them sooner; a tool call answers an utterance it heard, once per connection and utterance;
- a connection the core closed (`CloseTransport`) or that died sends nothing more; a half-open one sends
  nothing at all;
- the first frame of 20 ms of assistant audio carries its producer's token and a serial number, so each
  frame the media clock pulls is traced to the event that brought it.

Invariants, named after DESIGN §14 (S8 belongs to the job ledger's own tests):
- S1 every caller utterance reaches the application (a final caller `Transcript`) at most once — no frame of
  it in two texts (an utterance cut in two by a repair's reported gap is two stretches of words, each told
  once) — checked after every step; and, at the quiet settle of `teardown`, at least once unless it lies in
  a reported input `audio_discontinuity` (HR8; its stretch is the `amount` of 20 ms frames before its
  `at_ms`: the utterance's start lies in it), or every connection that heard it lost it by a fault the bridge repaired with a
  recovery (the old floor, quarantined: HR2, the replacement asks the caller to repeat, HR7), by a failed
  transcription, by going half-open, or closed by a rollover before its speech-start reached the core (RO2 is
  judged on what the core knew).
- S2 one caller request (utterance) dispatches at most one job, whichever connection asks and when.
- S3 every frame transmitted came from the connection holding the floor when its audio arrived, and from
  audio that arrived after the latest clear of the channel (none of a cleared epoch).
- S4 a job marked superseded never has its result announced (`DeliverResult`/`SendContext`).
- S5 at most one replacement is being opened; every recovery is reconnected within 5 s or the session failed.
- S6 after the call leg ended, nothing is opened (`OpenRollover`, `OpenReplacement`), authorised or approved.
- S7 hold and ringing never start a recovery for a media condition (the hold and ring steps run only where
  the core has `hold`/`resume` and `ring`/`answered`).
- AMD (an outbound call with answering-machine detection: bridge/engine/amd.py `AmdChoice` and `carry_out`
  drive the core as the session shell's `AmdGate` does): the verdict (any kind), the application's answer,
  the mailbox's beep or its absence arrive at any moment after the answer; until the chosen action starts
  the model never speaks (no assistant frame is transmitted) and never hears the callee (no `SendAudio`);
  after a hang-up or a recorded message (`core.end`) nothing is opened, authorised or approved (S6).
- SE5 (barge-in, whatever else is going on): once the caller has spoken `BARGE_IN_MS` while some connection
  hears them, nothing the floor sent before they began is still transmitted.
- Disclosure (bridge/engine/disclosure.py; a recorded one, on the calls the machine gives one): no model audio
  reaches the channel before every frame of the disclosure was transmitted, unless the call or the session
  ended first (then the record says `partial` or `not_delivered`).
- Recording consent (bridge/engine/disclosure.py, bridge/server/recording.py; a recorded one, on the calls the
  machine gives one, with the shell's recording tap fed every caller frame): it plays after every frame of the
  disclosure and before any model audio; the recording writes nothing until the consent was delivered (a hang-up
  or the session's end first: never), its stamp is when its last frame's audio ended on the wire (the ledger),
  and no caller frame from before that point is in the recording.
- No-input (bridge/engine/no_input.py; on the calls the machine gives a timeout, whose model speaks each check-in
  and goodbye it is asked for): at most one prompt per silence — a second prompt only after caller speech that
  could have reached the core since the first (its start sent by a connection within `LATENCY_MS`), at most one
  goodbye and only after a prompt; no prompt or goodbye while held or ringing (AMD's listening included), while a
  recovery reconnects, while anything is queued for the caller or held in the reservoir (the assistant audible),
  nor after the hang-up or the session's end.
- Early media (an outbound call's far end before the answer, through the shell's frame path,
  bridge/server/session.py `CallerFrames`, to `early_media_frame` only when the route asks, drawn at the start):
  no frame of it reaches a connection (`SendAudio`) unless the route asked, none starts a caller turn, and no
  model audio (nor the disclosure) reaches the channel before the answer (S7, ringing) — the media clock runs
  while it flows.
- Card mode (a payment-card collection, bridge/engine/card.py, started, keyed into and ended as the shell does:
  bridge/server/session.py; the caller's frames take the shell's frame path, `CallerFrames`, all along): no
  caller frame reaches a connection while a collection runs (`SendAudio`), and no key the caller pressed during
  one reaches the provider (the core tells the model each key pressed outside one, `dtmf_to_model`: those are
  drawn from `*` and `#`, the card's from the digits, so a digit in any provider command is a card's); the
  withheld stretch is one reported input `audio_discontinuity`, which S1 counts as any other.
- Recording (bridge/server/recording.py, the tap on the shell's frame path and the channel): paused by the model
  and resumed at any moment, and by every card collection: nothing of either side is in the file while paused
  (silence for the gap's length), checked at `teardown`.
- Transfer (the application's, cold by REFER or warm: bridge/engine/warm_transfer.py, its actions carried out on
  the core by `caller_side` as the shell does; the target's answers drawn step by step, at any moment of a
  recovery or a rollover's overlap or drain): while the caller waits on hold music no caller frame reaches a
  connection (`SendAudio`) and no model audio is transmitted (the caller waits quietly); nothing is dialled,
  briefed or joined after the hang-up (S6); each transfer's outcome is reported exactly once and ends the
  core's `transferring`; none is left undecided when the call or the session ended; an accepted warm transfer
  hands the caller's leg to the relay, or (every other caller taking a REFER with Replaces, whose outcome is a
  step) ends it replaced (the AI leaves: the core is ended as the shell ends it, and told the leg is gone); after a
  join by relay no model audio reaches the caller's leg, which plays on; the caller's line is held exactly while the
  caller holds the call or waits on hold music (a caller resuming during a transfer still does not hear the model),
  put on hold music once per transfer and, undone, given back to the model exactly once; nothing is dialled, briefed
  or joined after the session ended either. `WarmTransferMachine` draws the warm transfer's steps often and mostly
  along the happy path, each decision interleaved with a recovery, a rollover's overlap or drain, a hold, a
  barge-in or a hang-up (its `event`s: tests/bench/properties.py --warm --statistics shows how far transfers got).

CI runs the machine on its `--quick` budget (`test_s1_to_s7_hold_over_the_machines_call_histories`, the same
histories every run); tests/bench/properties.py runs it over new ones (`--seed`, `--examples`); each case it
found is a regression test below.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from bridge.engine.amd import (
    AmdBeep,
    AmdChoice,
    AmdNoBeep,
    AmdPlan,
    AmdPolicy,
    AmdStart,
    AmdVerdict,
    carry_out,
)
from bridge.engine.card import CardCollector, CardOptions, CardResult
from bridge.engine.commands import DisclosureResult
from bridge.engine.coordinator import (
    ApproveRollover,
    AudioDiscontinuity,
    AuthorizeConnection,
    CloseTransport,
    CommitInput,
    CoordinatorOptions,
    EndSession,
    HangUp,
    NoInputTimeout,
    OpenReplacement,
    OpenRollover,
    RecoveryChanged,
    RequestClose,
    SendAudio,
    SessionCoordinator,
    Transcript,
)
from bridge.engine.delegations import DeliverResult, DispatchJob, JobChanged, SendContext
from bridge.engine.disclosure import CONSENT_ITEM, DISCLOSURE_ITEM, Disclosure
from bridge.engine.early_media import EarlyMediaWindow
from bridge.engine.no_input import GOODBYE, PROMPT, NoInputOptions
from bridge.engine.telephony import TelephonyOptions
from bridge.engine.warm_transfer import (
    ACCEPTED,
    BriefingSpoken,
    BriefTarget,
    CallerHungUp,
    DialTarget,
    HangUpCaller,
    HoldCaller,
    JoinLegs,
    Outcome,
    ReferCaller,
    ReferProgress,
    ReleaseCaller,
    SendTargetDigits,
    SessionEnded,
    TargetDigit,
    TargetHungUp,
    TargetProgress,
    WarmAction,
    WarmEvent,
    WarmOptions,
    WarmState,
    WarmTransfer,
    caller_side,
)
from bridge.server.recording import CallRecording
from bridge.server.session import CallerFrames, _unheard
from providers.base import Capabilities
from providers.events import (
    AudioReceived,
    InputTranscript,
    InputTranscriptFailed,
    ProviderError,
    ProviderEvent,
    ResponseDone,
    SessionClosed,
    SessionExpiring,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    UsageUpdated,
)
from providers.limits import GPT_LIVE, OPENAI_REALTIME
from providers.limits import AudioLimits as ProviderLimits
from rtp.audio import PCMU_8K
from rtp.playout import ClearResult, OutboundFrame, Playout
from sip.leg import FrameReceived, PlayoutLeg
from tests.support.rollover_session import SCALED
from tests.support.session_engine import GPT_LIVE_CAPS, MS, REALTIME, TICK, speech_frame

VAD_SILENCE_FRAMES = 10  # a provider's VAD ends an utterance after 200 ms of silence (Realtime allows it)
LATENCY_MS = 300  # a provider's event reaches the core this long after it was sent, at most
BARGE_IN_MS = 500  # the caller speaking this long has interrupted what played before (VAD + LATENCY_MS)
RECOVERY_BUDGET_MS = 5_000  # HR5
SETTLE_TICKS = 200  # teardown: 4 s of silence, past every wait of the scaled options
SPEECH = speech_frame()
SILENCE = bytes(320)
MARK = 0xA5  # the first byte of each 20 ms of assistant audio the fake providers send
UTTERANCE = re.compile(r"<u(\d+):(\d+)-(\d+)>")  # utterance, its first and last frame in the text
RECOVERY_CAUSES_OF_MEDIA = ("output_overflow", "output_stale", "provider_silent")
DISCLOSURE = Disclosure(audio=b"\x10\x00" * 24_000)  # 3 s the bridge plays first: the caller talks over it
CONSENT = Disclosure(audio=b"\x30\x00" * 8_000)  # 1 s "this call is recorded", after it
NO_INPUT_MS = 1_000  # the no-input timeout of the calls that have one (its least: a step's silence passes it)
CARD = CardOptions(min_digits=4, max_digits=8, digit_timeout_ms=1_500, timeout_ms=5_000)  # scaled down
WARM = WarmOptions(ring_timeout_ms=2_000, accept_timeout_ms=3_000)  # scaled down
WARM_STEPS: dict[str, WarmEvent] = {
    "ringing": TargetProgress(180),
    "answered": TargetProgress(200, refer_to="sip:agent@10.0.0.9?Replaces=t1%3Bto-tag%3Da%3Bfrom-tag%3Db"),
    "spoken": BriefingSpoken(),
    "accepts": TargetDigit("1"),
    "refuses": TargetDigit("2"),
    "hangs_up": TargetHungUp(),
    "busy": TargetProgress(486),
    "fails": TargetProgress(503),
    "replaced": ReferProgress(200, "OK", True),  # the join by REFER with Replaces: its outcome
    "refer_refused": ReferProgress(405, "Method Not Allowed", True),
}
COLD_STATUS = {"ringing": 180, "answered": 200, "accepts": 200, "busy": 486, "fails": 503, "refuses": 603}
KEYED_DIGIT = re.compile(r"pressed the key [0-9]")  # a card's key told to the model (outside keys: * and #)


def _event(what: str) -> None:
    """hypothesis's `event`, where the machine runs under hypothesis (the regression tests call its rules)."""
    try:
        event(what)
    except InvalidArgument:
        pass


@dataclass(frozen=True)
class Profile:
    name: str
    caps: Capabilities
    limits: ProviderLimits
    items: bool  # the provider names its audio items (Realtime) or not (GPT-Live: a pause ends one)

    @property
    def final_transcripts(self) -> bool:  # Realtime: a final text per utterance; GPT-Live: timed fragments
        return self.caps.server_vad


REALTIME_LIKE = Profile("realtime", REALTIME, OPENAI_REALTIME, items=True)
GPT_LIVE_LIKE = Profile("gpt-live", GPT_LIVE_CAPS, GPT_LIVE, items=False)
PROFILES = (REALTIME_LIKE, GPT_LIVE_LIKE)


@dataclass
class FakeConnection:
    """What one provider connection heard and has still to say."""

    token: int
    kind: str  # "first", "rollover" or "replacement"
    started: bool = False  # its SessionStarted reached the core
    closed: bool = False  # closed by the core, or died: it sends nothing more
    silent: bool = False  # half-open: it sends nothing at all
    frames: int = 0  # caller frames received: its audio clock, 20 ms each
    got_frame: bool = False  # it received the caller frame of this tick
    segment: list[int] = field(default_factory=list)  # the caller utterances its VAD's open segment holds
    spans: dict[int, list[int]] = field(default_factory=dict)  # of each, the first and last frame it heard
    uncaptioned_spans: dict[int, list[int]] = field(default_factory=dict)  # GPT-Live: not in a fragment yet
    segment_start_ms: int = 0
    caption_from_ms: int = 0
    uncaptioned: int = 0  # frames of speech heard since the last fragment
    speech_end_ms: int = 0  # its audio position after the last speech it heard
    quiet: int = 0  # silent frames received since
    heard: list[int] = field(default_factory=list)  # utterances it heard, in order (whole or in part)
    outbox: deque[tuple[int, ProviderEvent]] = field(default_factory=deque)  # (sent at, event)
    tooled: set[int] = field(default_factory=set)
    calls: list[ToolCallRequested] = field(default_factory=list)
    fail_next: bool = False
    failed: set[int] = field(default_factory=set)  # utterances whose transcription failed
    lost: str | None = None  # why it can no longer give what it holds
    seen: set[str] = field(default_factory=set)  # items whose SpeechStarted reached the core
    cut: bool = False  # its input stopped in mid-segment, uncommitted: the segment waits for a silence
    cut_unseen: bool = False  # ... before its SpeechStarted reached the core

    def item(self, uid: int) -> str:
        return f"in{self.token}-{uid}"


@dataclass
class Utterance:
    uid: int
    ended: bool = False
    frames: int = 0
    hearers: set[int] = field(default_factory=set)
    discarded_at: int | None = None  # the first of its frames no connection received (ns)
    texted_by: set[int] = field(default_factory=set)  # connections whose text of it reached the core
    began_ns: int = 0
    frame_ms: list[int] = field(default_factory=list)  # when each of its frames came (session ms)


class SessionMachine(RuleBasedStateMachine):
    """One call's session core and its providers on virtual time (see the module docstring)."""

    warm_options = WARM

    def __init__(self) -> None:
        super().__init__()
        self.profile = REALTIME_LIKE
        self.ready = False
        self.over = (
            False  # the shell has stopped: the core said it is `finished` (the close windows are over)
        )

    @property
    def live(self) -> bool:
        return self.ready and not self.over

    # --- set-up ------------------------------------------------------------------------------------------

    @initialize(
        profile=st.sampled_from(PROFILES),
        auto_answers=st.sampled_from([True, True, True, False]),  # unanswered questions end the call (RO6)
        slack=st.sampled_from([500, 0]),
        outbound=st.booleans(),
        amd=st.sampled_from([None, "hang_up", "recording", "message", "talk"]),
        disclosure=st.booleans(),
        early_to_provider=st.sampled_from([True, False]),
        consent=st.booleans(),
        no_input=st.sampled_from([None, NO_INPUT_MS]),
    )
    def start(
        self,
        profile: Profile,
        auto_answers: bool,
        slack: int,
        outbound: bool = False,
        amd: str | None = None,
        disclosure: bool = False,
        early_to_provider: bool = False,
        consent: bool = False,
        no_input: int | None = None,
    ) -> None:
        self.profile = profile
        self.auto_answers = auto_answers  # approve and authorize answered True at once, or by steps
        self.now = 0
        machine = self

        class TracedPlayout(Playout):
            def clear(self, epoch: int) -> ClearResult:
                machine.clears += 1
                return super().clear(epoch)

        self.clears = 0
        self.playout = TracedPlayout()
        # --record: the tap on the channel and on the shell's frame path; on the calls with a recording consent it
        # holds everything until the consent was delivered (`tap`, the consent's invariants)
        self.recording = CallRecording(consent=consent)
        self.tap = self.recording if consent else None
        self.taken: list[bytes] = []  # what the consent's invariant took of the recording, step by step
        leg = PlayoutLeg(self.playout)
        self.core = SessionCoordinator(
            limits=profile.limits.for_format(PCMU_8K),
            output_format=PCMU_8K,
            capabilities=profile.caps,
            channel=self.recording.channel(leg, 0),
            now=0,
            options=CoordinatorOptions(
                rollover=replace(SCALED, match_slack_ms=slack),
                disclosure=DISCLOSURE if disclosure else None,
                consent=CONSENT if consent else None,
                no_input=NoInputOptions(no_input) if no_input is not None else None,
                telephony=TelephonyOptions(dtmf_to_model=True),
            ),
        )
        self.card: CardCollector | None = None  # a payment-card collection under way
        self.disclosure_sent = 0  # frames of the disclosure the media clock took
        self.consent_sent = 0  # of the consent
        self.consent: DisclosureResult | None = None  # its result
        self.speech_at: list[int] = []  # when each caller speech frame reached the recording tap (ns)
        self.recorded_speech = 0  # caller speech frames in what the recording wrote
        self.conns: dict[int, FakeConnection] = {1: FakeConnection(1, "first")}
        self.utterances: dict[int, Utterance] = {}
        self.speaking: int | None = None  # the caller's utterance now
        self.next_uid = 0
        self.pulling = True
        self.held = False
        self.leg_ended = False
        self.ended = False  # EndSession
        self.emitted: dict[int, int] = {}  # utterance -> final caller transcripts naming it
        self.told: dict[int, set[int]] = {}  # utterance -> its frames a final caller transcript named
        self.input_discontinuities: list[int] = []  # when each input audio_discontinuity was reported (ns)
        self.unheard: list[tuple[int, int]] = []  # the stretch of each (session ms: its end is its `at_ms`)
        self.dispatched: dict[int, list[str]] = {}  # utterance -> job ids dispatched for it
        self.jobs: list[str] = []
        self.superseded: set[str] = set()
        self.opening: set[int] = set()  # replacements opened, not yet up, failed or closed
        self.recovering: dict[int, int] = {}  # replacement token -> when its recovery began
        self.questions: list[tuple[str, str]] = []  # ("approve", rollover id) / ("authorize", connection id)
        self.answered: set[tuple[str, str]] = set()
        self.chunks: dict[int, tuple[int, bool, int, int]] = {}  # serial -> (token, floor, clears, when) then
        self.serial = 0
        self.answers = 0
        self.log: list[str] = []
        self.amd: AmdChoice | None = None
        self.amd_waiting = False  # the callee answered and the chosen action has not started: the model waits
        self.amd_ended = False  # the action ended the call (a hang-up, a recording): nothing is funded after
        self.early_to_provider = early_to_provider  # the route gives the far end's early media to the model
        self.early_media = EarlyMediaWindow(0, to_provider=early_to_provider)
        # the shell's frame path (the leg's media tick into the core), with its early-media switch
        self.frame_path = CallerFrames(
            "props", asyncio.Queue(), lambda: self.now, self.recording, lambda core: None
        )
        self.in_early = False  # an early-media frame is being delivered
        self.early_frames = 0
        self.no_input = no_input  # the caller's no-input timeout (ms), or None: off
        self.last_speech_ns = -(10**12)  # the latest caller frame of speech the core was given
        self.prompted_at: int | None = None  # the latest no-input prompt
        self.goodbyes = 0
        self.settling = False  # teardown: the model speaks no check-in (S1 is judged on a call that goes on)
        self.transfer: str | None = None  # "cold" or "warm": the application's transfer awaiting its outcome
        self.warm: WarmTransfer | None = None
        self.parked = False  # the caller waits on hold music for a warm transfer
        self.transfers = 0  # transfers started
        self.replaces_first = 0  # 1: the first warm transfer joins by REFER with Replaces (0: the second)
        self.relayed = False  # a warm transfer joined by relay: the caller's leg (the channel) is the relay's
        self.line_holds = 0  # the warm transfer's holds of the caller's line (hold music)
        self.line_releases = 0  # and its releases (the caller back with the model)
        self.outcomes = 0  # their outcomes reported
        self.ready = True
        self._deliver_now(self.conns[1], SessionStarted(1, "sess_1"))
        self.ringing = outbound and hasattr(self.core, "ring")  # an outbound call rings until answered (S7)
        if self.ringing:
            self._call(self.core.ring, self.now)
        elif disclosure or consent:
            self._call(self.core.answered, self.now)  # an inbound call is up (the shell says so at its start)
        if (
            self.ringing and amd is not None
        ):  # AMD: the route's choice for a mailbox, its greeting and message
            for_mailbox = "message" if amd == "recording" else amd
            self.amd = AmdChoice(AmdPolicy(machine=for_mailbox), can_message=True)  # type: ignore[arg-type]
            self.amd_plan = AmdPlan(
                greeting="Greet the callee.",
                message="Call us back." if amd == "message" else None,
                message_audio=bytes(48_000) if amd == "recording" else None,  # 3 s: a window for S6
            )

    def _require(self, holds: bool, invariant: str, what: str) -> None:
        """One invariant's check (named after DESIGN §14)."""
        if not holds:
            raise AssertionError(f"{invariant}: {what}\n" + "\n".join(self.log[-40:]))

    # --- the harness: the shell's part ---------------------------------------------------------------

    def _call(self, method: object, *args: object) -> None:
        """One input to the core; then its commands are carried out and its notices read (as the shell)."""
        floor, listeners = self.core.connections.floor, set(self.core.connections.listeners)
        method(*args)  # type: ignore[operator]
        commands, notices = self.core.commands(), self.core.notices()
        recovery = any(isinstance(n, RecoveryChanged) and n.stage == "reconnecting" for n in notices)
        for command in commands:
            self._command(command, floor, listeners, recovery)
        for notice in notices:
            self._notice(notice)

    def _command(self, command: object, floor: int, listeners: set[int], recovery: bool) -> None:
        if isinstance(command, SendAudio):
            self._require(
                self.card is None,
                "CARD",
                f"a caller frame reached connection {command.token} while collecting",
            )
            self._require(
                self.early_to_provider or not self.in_early,
                "EARLY",
                f"early media reached connection {command.token}, and the route did not ask",
            )
            self._require(
                not self.parked, "WARM", f"a caller frame reached connection {command.token} on hold music"
            )
            conn = self.conns[command.token]
            assert not conn.closed, f"caller audio sent to closed connection {command.token}"
            conn.frames += 1
            conn.got_frame = True
            return
        self.log.append(f"{self.now // MS} ms: {command!r}"[:160])
        self._require(
            not KEYED_DIGIT.search(repr(command)), "CARD", f"a card's key reached the provider: {command}"
        )
        if isinstance(command, (OpenRollover, OpenReplacement, AuthorizeConnection, ApproveRollover)):
            self._require(not self.leg_ended, "S6", f"{type(command).__name__} after the call leg ended")
            self._require(not self.amd_ended, "S6", f"{type(command).__name__} after AMD ended the call")
        if isinstance(command, (OpenRollover, OpenReplacement)):
            kind = "rollover" if isinstance(command, OpenRollover) else "replacement"
            if command.token not in self.conns:
                self.conns[command.token] = FakeConnection(command.token, kind)
                self._send(self.conns[command.token], SessionStarted(command.token, f"sess_{command.token}"))
            if kind == "replacement":
                self.opening.add(command.token)
                self._require(
                    len(self.opening) <= 1, "S5", f"replacements being opened at once: {sorted(self.opening)}"
                )
        elif isinstance(command, CloseTransport):
            conn = self.conns.get(command.token)
            if conn is not None and not conn.closed:
                if recovery and command.token == floor:
                    why = "recovery-floor"
                elif recovery and command.token in listeners:
                    why = "recovery-listener"
                else:
                    why = "rollover-close"
                self._lose(conn, why)
            self.opening.discard(command.token)
        elif isinstance(command, CommitInput):
            conn = self.conns.get(command.token)
            if conn is not None and not conn.closed and conn.segment:
                self._segment_over(conn)  # RO2: the committed buffer is one utterance
        elif isinstance(command, RequestClose):
            conn = self.conns.get(command.token)
            if conn is not None and not conn.closed and not conn.silent:
                self._send(conn, UsageUpdated(conn.token, audio_seconds=1.0))
                self._send(conn, SessionClosed(conn.token, "client_close", finalized=True))
        elif isinstance(command, ApproveRollover):
            self.questions.append(("approve", command.rollover_id))
            if self.auto_answers:
                self.answered.add(("approve", command.rollover_id))
                self._call(self.core.rollover_approved, command.rollover_id, True, None, self.now)
        elif isinstance(command, AuthorizeConnection):
            self.questions.append(("authorize", command.connection_id))
            if self.auto_answers:
                self.answered.add(("authorize", command.connection_id))
                self._call(self.core.connection_authorized, command.connection_id, True, self.now)
        elif isinstance(command, DispatchJob):
            uid = json.loads(command.request.arguments)["utterance"]
            self.dispatched.setdefault(uid, []).append(command.request.job_id)
            self.jobs.append(command.request.job_id)
            self._require(
                len(self.dispatched[uid]) == 1,
                "S2",
                f"caller request <u{uid}> dispatched twice: {self.dispatched[uid]}",
            )
        elif isinstance(command, (DeliverResult, SendContext)):
            text = command.output if isinstance(command, DeliverResult) else command.text
            for job in self.superseded:
                self._require(
                    f"result-of-{job}-" not in text, "S4", f"the superseded {job}'s result announced: {text}"
                )
            if isinstance(command, SendContext) and text in (PROMPT, GOODBYE) and not self.settling:
                conn = self.conns.get(command.token)
                if conn is not None and conn.started:  # the model checks in, or says goodbye: 600 ms
                    self._answer(conn, 30)
        elif isinstance(command, EndSession):
            self.ended = True
            self.recovering.clear()
            if self.warm is not None and self.warm.active:  # as the shell: the transfer is undone
                warm = self.warm
                self._warm(lambda: warm.handle(SessionEnded(command.reason), self.now))
        elif isinstance(command, HangUp):
            self._leg_gone()

    def _notice(self, notice: object) -> None:
        if isinstance(notice, Transcript) and notice.role == "caller" and notice.final:
            self.log.append(f"{self.now // MS} ms: caller text {notice.text!r}")
            named: dict[int, set[int]] = {}
            for uid, first, last in UTTERANCE.findall(notice.text):
                named.setdefault(int(uid), set()).update(range(int(first), int(last) + 1))
            for uid, frames in named.items():
                self.emitted[uid] = self.emitted.get(uid, 0) + 1
                twice = sorted(frames & self.told.setdefault(uid, set()))
                self._require(
                    not twice,
                    "S1",
                    f"utterance <u{uid}> reached the application twice (its frames {twice[0]}-{twice[-1]})"
                    if twice
                    else "",
                )
                self.told[uid] |= frames
        elif isinstance(notice, AudioDiscontinuity) and notice.direction == "input":
            self.input_discontinuities.append(self.now)
            self.unheard.append((notice.at_ms - notice.amount * 20, notice.at_ms))
            self.log.append(f"{self.now // MS} ms: {notice!r}")
        elif isinstance(notice, RecoveryChanged):
            self.log.append(f"{self.now // MS} ms: {notice!r}")
            if notice.stage == "reconnecting":
                if self.held or self.ringing or self.amd_waiting or self.parked:
                    self._require(
                        notice.cause not in RECOVERY_CAUSES_OF_MEDIA,
                        "S7",
                        f"hold or ringing started a recovery: {notice}",
                    )
                self.recovering[notice.token] = self.now
            else:
                self.recovering.pop(notice.token, None)
        elif isinstance(notice, JobChanged) and notice.state == "superseded":
            self.superseded.add(notice.job_id)
        elif isinstance(notice, DisclosureResult) and notice.what == "consent" and self.tap is not None:
            self.log.append(f"{self.now // MS} ms: {notice!r}")
            self.consent = notice
            self.tap.verdict(notice)  # as the shell, through the call record
        elif isinstance(notice, NoInputTimeout):
            self._no_input_action(notice)

    def _no_input_action(self, notice: NoInputTimeout) -> None:
        """No-input: a prompt or a goodbye only in a silence that was the caller's (the module docstring)."""
        self.log.append(f"{self.now // MS} ms: {notice!r}")
        what = f"a no-input {notice.stage}"
        self._require(
            not self.leg_ended and not self.ended, "NO-INPUT", f"{what} after the call or session ended"
        )
        self._require(
            not self.held and not self.ringing and not self.amd_waiting,
            "NO-INPUT",
            f"{what} while held or ringing",
        )
        self._require(
            not self.recovering, "NO-INPUT", f"{what} while a recovery reconnects: {self.recovering}"
        )
        self._require(
            self.playout.depth == 0 and not self.core.output.busy,
            "NO-INPUT",
            f"{what} while the assistant is audible ({self.playout.depth} frames queued for the caller)",
        )
        if notice.stage == "prompt":
            self._require(
                self.prompted_at is None or self.last_speech_ns >= self.prompted_at - LATENCY_MS * MS,
                "NO-INPUT",
                f"a second prompt in one silence (the first at {(self.prompted_at or 0) // MS} ms, the caller's "
                f"last speech at {self.last_speech_ns // MS} ms)",
            )
            self.prompted_at = self.now
        else:
            self.goodbyes += 1
            self._require(
                self.prompted_at is not None and self.goodbyes == 1,
                "NO-INPUT",
                "a goodbye without a prompt, or two",
            )

    def _leg_gone(self) -> None:
        if not self.leg_ended:
            if self.card is not None:  # as the shell at the leg's CallEnded: the collection ends first
                self._card_over(self.card.end("hangup", self.now // MS))
            self.leg_ended = True
            self._call(self.core.call_ended, self.now)
            if self.warm is not None and self.warm.active:  # the shell: the target leg ended, undone
                warm = self.warm
                self._warm(lambda: warm.handle(CallerHungUp(), self.now))
            elif self.transfer == "cold":  # the engine's own final report: 487, the call ended first
                self._cold(487, True)

    def _lose(self, conn: FakeConnection, why: str) -> None:
        if why == "rollover-close" and self.profile.caps.server_vad:  # RO2, judged on what the core knew
            texts = {
                e.item_id for _, e in conn.outbox if isinstance(e, (InputTranscript, InputTranscriptFailed))
            }
            segment = bool(conn.segment) and not conn.cut_unseen and conn.item(conn.segment[0]) in conn.seen
            if (texts or conn.segment) and not (texts & conn.seen or segment):
                why = "rollover-close-unseen"  # the caller's speech there had not been reported to the core
        conn.closed = True
        conn.outbox.clear()
        conn.lost = conn.lost or why
        conn.heard += conn.segment  # what it was hearing is lost with it
        conn.segment, conn.spans, conn.uncaptioned_spans = [], {}, {}

    def _send(self, conn: FakeConnection, event: ProviderEvent) -> None:
        if not conn.closed and not conn.silent:
            conn.outbox.append((self.now, event))

    def _deliver_now(self, conn: FakeConnection, event: ProviderEvent) -> None:
        """An event reaches the core (recording what S1 and S3 need to know of it)."""
        core = self.core.connections
        known_floor = conn.token == core.floor
        known = known_floor or conn.token in core.listeners
        if isinstance(event, InputTranscript) and (event.final or not self.profile.final_transcripts):
            for uid in {int(label[0]) for label in UTTERANCE.findall(event.text)}:
                if known:
                    self.utterances[uid].texted_by.add(conn.token)
        elif isinstance(event, AudioReceived):
            floor = conn.token == core.floor
            for at in range(0, len(event.audio), 160):
                serial = int.from_bytes(event.audio[at + 2 : at + 5], "big")
                self.chunks[serial] = (conn.token, floor, self.clears, self.now)
        elif isinstance(event, SpeechStarted) and event.item_id is not None:
            conn.seen.add(event.item_id)
        elif isinstance(event, SessionStarted):
            conn.started = True
            self.opening.discard(conn.token)
        elif isinstance(event, SessionClosed):  # the provider's last word, final or not
            self._lose(
                conn, "closed" if event.finalized else "died-floor" if known_floor else "died-listener"
            )
        self._call(self.core.provider_event, event, self.now)
        if self.leg_ended and self.core.finished(self.now):
            self.over = True  # as the shell: nothing more is fed to the core, nothing more is carried out

    def _deliver(self, conn: FakeConnection, count: int) -> None:
        for _ in range(count):
            if not conn.outbox or conn.closed or conn.silent or self.over:
                return
            _, event = conn.outbox.popleft()
            self._deliver_now(conn, event)

    def _deliver_due(self) -> None:
        """The latency bound: every event older than LATENCY_MS arrives now."""
        for conn in list(self.conns.values()):
            while conn.outbox and not conn.closed and not conn.silent and not self.over:
                if self.now - conn.outbox[0][0] < LATENCY_MS * MS:
                    break
                self._deliver(conn, 1)

    def _tick(self, speech: bool, pull: bool = True) -> None:
        """20 ms: the media clock takes a frame, the caller's frame arrives, the timers, each provider's VAD."""
        if self.over:
            return
        speech = (
            speech and not self.parked
        )  # (on hold music the caller waits quietly: SendAudio still checked)
        self.now += TICK
        if self.leg_ended and self.core.finished(self.now):
            self.over = True  # as the shell: nothing more is fed to the core, nothing more is carried out
            return
        up = self.relayed or not self.leg_ended  # (joined by relay: the caller's leg plays on, the relay's)
        if pull and self.pulling and not self.held and not self.ringing and up:
            self._pulled(self.playout.pull(self.now))
        if (
            self.amd_waiting and not self.leg_ended and not self.held
        ):  # the callee while AMD listens: withheld
            for conn in self.conns.values():
                conn.got_frame = False
            self._call(self.core.caller_frame, SPEECH if speech else SILENCE, self.now)
            self._recorded(speech)
            heard = [c.token for c in self.conns.values() if c.got_frame]
            self._require(not heard, "AMD", f"the callee's audio before the AMD action reached {heard}")
        elif not self.leg_ended and not self.held and not self.ringing:
            if speech and self.speaking is None:
                self.next_uid += 1
                self.speaking = self.next_uid
                self.utterances[self.next_uid] = Utterance(self.next_uid, began_ns=self.now)
            elif not speech and self.speaking is not None:
                self.utterances[self.speaking].ended = True
                self.speaking = None
            for conn in self.conns.values():
                conn.got_frame = False
            if speech:
                self.last_speech_ns = self.now
            frame = FrameReceived(SPEECH if speech else SILENCE, 0, self.now)
            self._call(self.frame_path.feed, self.core, frame, self.now)  # the shell's frame path: tap, card
            self._recorded(speech, tapped=True)
            self._hear(speech)
        if self.card is not None and (due := self.card.next_deadline()) is not None and due <= self.now:
            self._card_over(self.card.handle_timer(self.now, self.now // MS))  # the shell's card timer
        deadline = self.core.next_deadline()
        if deadline is not None and deadline <= self.now:
            self._call(self.core.handle_timer, self.now)
        if self.amd is not None and (due := self.amd.next_deadline()) is not None and due <= self.now:
            self._amd_start(self.amd.handle_timer(self.now))
        if (warm := self.warm) is not None and (due := warm.next_deadline()) is not None and due <= self.now:
            self._warm(lambda: warm.handle_timer(self.now))  # the ring or the decision timed out
        self._deliver_due()

    def _recorded(self, speech: bool, *, tapped: bool = False) -> None:
        """The caller's frame to the recording tap too, as the shell's frame path gives it (one append; `tapped`:
        the frame path gave it already)."""
        if self.tap is not None:
            if not tapped:
                self.tap.caller(SPEECH if speech else SILENCE, self.now)
            if speech:
                self.speech_at.append(self.now)

    def _hear(self, speech: bool) -> None:
        """Each connection's server VAD and transcription, on what it received this tick."""
        utterance = self.utterances.get(self.speaking) if self.speaking is not None else None
        if utterance is not None:
            utterance.frames += 1
            utterance.frame_ms.append(self.now // MS)
            hearers = [c.token for c in self.conns.values() if c.got_frame]
            utterance.hearers.update(hearers)
            if not hearers and not self.ended and utterance.discarded_at is None:
                utterance.discarded_at = self.now
        for conn in self.conns.values():
            if conn.closed:
                continue
            speaking = conn.got_frame and speech and self.speaking is not None
            if conn.segment:
                if not conn.got_frame and not self.profile.caps.server_vad:
                    self._segment_over(conn)  # GPT-Live captions as it hears: what it heard is captioned
                elif not conn.got_frame:  # its input stopped, uncommitted: its VAD waits for a silence
                    if not conn.cut:
                        conn.cut, conn.cut_unseen = True, conn.item(conn.segment[0]) not in conn.seen
                elif speaking:
                    assert utterance is not None
                    conn.quiet, conn.speech_end_ms = 0, conn.frames * 20
                    if utterance.uid not in conn.segment:
                        conn.segment.append(utterance.uid)
                    self._heard_frame(conn, utterance)
                    conn.uncaptioned += 1
                    if not self.profile.caps.server_vad and conn.uncaptioned >= VAD_SILENCE_FRAMES:
                        self._caption(conn)  # GPT-Live captions what it hears as it hears it
                else:
                    conn.quiet += 1
                    if conn.quiet >= VAD_SILENCE_FRAMES:
                        self._segment_over(conn)
            elif speaking:
                assert utterance is not None
                conn.segment, conn.quiet, conn.spans, conn.uncaptioned_spans = [utterance.uid], 0, {}, {}
                self._heard_frame(conn, utterance)
                conn.segment_start_ms, conn.speech_end_ms = (conn.frames - 1) * 20, conn.frames * 20
                conn.caption_from_ms, conn.uncaptioned = conn.segment_start_ms, 1
                if self.profile.caps.server_vad:
                    self._send(
                        conn, SpeechStarted(conn.token, conn.segment_start_ms, conn.item(conn.segment[0]))
                    )

    @staticmethod
    def _heard_frame(conn: FakeConnection, utterance: Utterance) -> None:
        """The connection heard this tick's frame of the caller's utterance (its `frames - 1`th)."""
        frame = utterance.frames - 1
        for spans in (conn.spans, conn.uncaptioned_spans):
            spans.setdefault(utterance.uid, [frame, frame])[1] = frame

    @staticmethod
    def _label(spans: dict[int, list[int]]) -> str:
        """`<uN:a-b>`: text of the frames a to b of the caller's utterance N (whatever the words are: a provider
        transcribes what it heard, so two connections' texts of one utterance are the same words only where they
        heard the same frames)."""
        return " ".join(f"<u{uid}:{first}-{last}>" for uid, (first, last) in spans.items())

    def _segment_over(self, conn: FakeConnection) -> None:
        """The VAD's segment is over (a silence, or a commit): the speech events and the transcript of it,
        `<uN>` for each caller utterance in it."""
        segment, conn.segment, conn.cut = conn.segment, [], False
        conn.heard += segment
        item, end, text = conn.item(segment[0]), conn.speech_end_ms, self._label(conn.spans)
        conn.spans = {}
        if self.profile.caps.speech_end_events:
            self._send(conn, SpeechStopped(conn.token, end, item))
        if conn.fail_next:
            conn.fail_next = False
            conn.failed.update(segment)
            self._send(conn, InputTranscriptFailed(conn.token, item, "transcription failed"))
        elif self.profile.final_transcripts:
            self._send(conn, InputTranscript(conn.token, text, item, final=True))
        else:  # GPT-Live: the last of the segment's timed caption fragments (the core groups them)
            conn.segment = segment
            self._caption(conn)
            conn.segment = []

    def _caption(self, conn: FakeConnection) -> None:
        """GPT-Live: a timed caption fragment of what the connection heard since the last one (none when it
        heard no more speech: a provider sends no empty caption)."""
        text = self._label(conn.uncaptioned_spans)
        conn.uncaptioned_spans = {}
        start, end = conn.caption_from_ms, conn.speech_end_ms
        if text:
            self._send(conn, InputTranscript(conn.token, text, None, start, end, final=False))
        conn.caption_from_ms, conn.uncaptioned = end, 0

    def _pulled(self, frame: OutboundFrame | None) -> None:
        """S3: a transmitted frame came from the floor of its time, and after the latest clear. The disclosure: no
        model audio before all of it."""
        if frame is not None and frame.item_id == DISCLOSURE_ITEM:
            self._require(not self.ringing, "S7", "the disclosure transmitted before the callee answered")
            self.disclosure_sent += 1
            return
        first = self.core.disclosure.gate
        if frame is not None and frame.item_id == CONSENT_ITEM:
            self._require(
                first is None or self.disclosure_sent >= first.frames,
                "CONSENT",
                f"the consent transmitted after {self.disclosure_sent} of the disclosure's frames",
            )
            self.consent_sent += 1
            return
        if frame is None or frame.pcmu is None or frame.pcmu[0] != MARK:
            return  # silence, or the core's own closing message
        self._require(not self.relayed, "WARM", "the model's audio transmitted to a caller joined by relay")
        self._require(not self.parked, "WARM", "the model's audio transmitted to a caller on hold music")
        consent = self.core.disclosure.consent
        if consent is not None and not (self.leg_ended or self.core.ending.ended):
            self._require(
                consent.frames > 0 and self.consent_sent >= consent.frames,
                "CONSENT",
                f"model audio transmitted after {self.consent_sent} of the consent's {consent.frames} frames",
            )
        gate = first
        if gate is not None and not (self.leg_ended or self.core.ending.ended):
            self._require(
                gate.frames > 0 and self.disclosure_sent >= gate.frames,
                "DISCLOSURE",
                f"model audio transmitted after {self.disclosure_sent} of the disclosure's {gate.frames} frames",
            )
        serial = int.from_bytes(frame.pcmu[2:5], "big")
        token, floor, clears, arrived = self.chunks[serial]
        self._require(not self.ringing, "S7", f"connection {token}'s audio transmitted before the answer")
        self._require(
            not self.amd_waiting, "AMD", f"connection {token}'s audio transmitted before the AMD action"
        )
        self._require(
            floor, "S3", f"audio of connection {token}, not the floor when it arrived, was transmitted"
        )
        self._require(
            clears == self.clears,
            "S3",
            f"audio of connection {token} that arrived before a clear was transmitted after it",
        )
        talking = self.utterances[self.speaking] if self.speaking is not None else None
        floor_conn = self.conns.get(self.core.connections.floor)
        if (
            talking is not None
            and arrived < talking.began_ns
            and floor_conn is not None
            and not floor_conn.silent
            and bool(self.core.connections.audio_targets)  # (a refused rollover's last words: nobody hears)
        ):
            self._require(
                self.now - talking.began_ns < BARGE_IN_MS * MS,
                "SE5",
                f"the caller has spoken for {(self.now - talking.began_ns) // MS} ms and the answer connection "
                f"{token} gave before that still plays over them (no barge-in)",
            )

    def _audio(self, conn: FakeConnection, frames: int) -> bytes:
        chunks = []
        for _ in range(frames):
            self.serial += 1
            chunks.append(bytes([MARK, conn.token & 0xFF]) + self.serial.to_bytes(3, "big") + b"\xff" * 155)
        return b"".join(chunks)

    # --- choosing a connection ---------------------------------------------------------------------------

    def _talking(self) -> list[FakeConnection]:
        """Connections that can still send (open, not half-open, their session started), the floor first."""
        floor = self.core.connections.floor
        talking = [c for c in self.conns.values() if not c.closed and not c.silent and c.started]
        return sorted(talking, key=lambda c: c.token != floor)

    def _pick(self, index: int) -> FakeConnection | None:
        talking = self._talking()
        return talking[index % len(talking)] if talking else None

    # --- rules: the caller ----------------------------------------------------------------------------

    @precondition(lambda self: self.live)
    @rule(frames=st.integers(3, 60))
    def caller_talks(self, frames: int) -> None:
        for _ in range(frames):
            self._tick(True)

    @precondition(lambda self: self.ready)
    @rule(frames=st.integers(1, 100))
    def caller_pauses(self, frames: int) -> None:
        for _ in range(frames):
            self._tick(False)

    @precondition(lambda self: self.live and self.no_input is not None)
    @rule(frames=st.integers(40, 90))
    def caller_stays_silent(self, frames: int) -> None:
        """No-input: the caller says nothing for about the timeout (the media clock runs, the model may speak)."""
        for _ in range(frames):
            self._tick(False)

    @precondition(lambda self: self.live)
    @rule(frames=st.integers(11, 24))
    def caller_breathes(self, frames: int) -> None:
        """A pause shorter than `match_slack_ms` but longer than the VAD's silence: another utterance."""
        for _ in range(frames):
            self._tick(False)

    # --- rules: each connection's events ------------------------------------------------------------------

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7), count=st.integers(1, 6))
    def deliver(self, index: int, count: int) -> None:
        """Some of a connection's events arrive now, sooner than the latency bound."""
        conn = self._pick(index)
        if conn is not None:
            self._deliver(conn, count)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7), frames=st.integers(1, 60))
    def provider_speaks(self, index: int, frames: int) -> None:
        """Assistant audio: a response to the last utterance the connection heard (or a greeting)."""
        conn = self._pick(index)
        if conn is not None:
            self._answer(conn, frames)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    def provider_floods(self, index: int) -> None:
        """Fault: more audio at once than the reservoir holds (HR1 output_overflow)."""
        conn = self._pick(index)
        if conn is not None and not self.held and not self.ringing:
            self._answer(conn, self.profile.limits.for_format(PCMU_8K).capacity_bytes // 160 + 10)

    def _answer(self, conn: FakeConnection, frames: int) -> None:
        """`frames` of assistant audio answering the last utterance `conn` heard (or a greeting)."""
        uid = conn.heard[-1] if conn.heard else 0
        item = f"r{conn.token}-{uid}" if self.profile.items else None
        self._send(conn, AudioReceived(conn.token, self._audio(conn, frames), PCMU_8K, item))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    def provider_calls_a_tool(self, index: int) -> None:
        """A tool call answering the last utterance this connection heard (once per connection and utterance)."""
        conn = self._pick(index)
        if conn is not None and conn.heard and conn.heard[-1] not in conn.tooled:
            uid = conn.heard[-1]
            conn.tooled.add(uid)
            call = ToolCallRequested(
                conn.token, f"call-{conn.token}-{uid}", "lookup", json.dumps({"utterance": uid})
            )
            conn.calls.append(call)
            self._send(conn, call)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    def provider_redelivers_a_call(self, index: int) -> None:
        conn = self._pick(index)
        if conn is not None and conn.calls:
            self._send(conn, conn.calls[-1])

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    def provider_response_done(self, index: int) -> None:
        conn = self._pick(index)
        if conn is not None:
            self._send(conn, ResponseDone(conn.token, f"resp-{conn.token}-{len(conn.heard)}"))

    @precondition(lambda self: self.live and self.profile.final_transcripts)
    @rule(index=st.integers(0, 7))
    def provider_interim_text(self, index: int) -> None:
        conn = self._pick(index)
        if conn is not None and conn.segment:
            text = self._label(conn.spans) + " so far"
            self._send(conn, InputTranscript(conn.token, text, conn.item(conn.segment[0])))

    @precondition(lambda self: self.live and self.profile.items)
    @rule(index=st.integers(0, 7))
    def provider_will_fail_a_transcription(self, index: int) -> None:
        """The Realtime family's `transcription.failed`; GPT-Live reports no failed transcription (its adapter
        emits no InputTranscriptFailed: its captions are fragments as it hears)."""
        conn = self._pick(index)
        if conn is not None:
            conn.fail_next = True

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    def provider_usage(self, index: int) -> None:
        conn = self._pick(index)
        if conn is not None:
            self._send(conn, UsageUpdated(conn.token, audio_seconds=float(conn.frames) / 50))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7), kind=st.integers(0, 3))
    def provider_error(self, index: int, kind: int) -> None:
        """A provider error; one in four is fatal, invalid audio (HR1: a protocol error, not a media condition)."""
        conn, fatal = self._pick(index), kind == 3
        if conn is not None:
            code = "invalid_audio" if fatal else "rate_limited"
            self._send(conn, ProviderError(conn.token, code, "fault", fatal))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7), left_ms=st.sampled_from([1_500, 3_000, 6_000, 0]))
    def provider_goes_away(self, index: int, left_ms: int) -> None:
        """Gemini's goAway as an event, or an announced `expires_at` through the shell."""
        conn = self._pick(index)
        if conn is not None:
            self._send(conn, SessionExpiring(conn.token, left_ms, "go_away"))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7), left_ms=st.sampled_from([1_000, 3_000, 7_000]))
    def connection_expires(self, index: int, left_ms: int) -> None:
        conn = self._pick(index)
        if conn is not None:
            self._call(self.core.connection_expires, conn.token, left_ms, self.now)

    # --- rules: faults --------------------------------------------------------------------------------

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    def connection_drops(self, index: int) -> None:
        """Fault: the socket goes away (its queued events are lost with it)."""
        conn = self._pick(index)
        if conn is not None:
            conn.outbox.clear()
            self._deliver_now(conn, SessionClosed(conn.token, "connection_lost", finalized=False))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    def connection_goes_half_open(self, index: int) -> None:
        """Fault: nothing arrives any more, nothing fails (the shell's pings may find it later)."""
        conn = self._pick(index)
        if conn is not None:
            conn.silent = True
            conn.outbox.clear()
            conn.lost = conn.lost or "silent"

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    def pings_find_a_half_open_connection(self, index: int) -> None:
        silent = [c for c in self.conns.values() if c.silent and not c.closed]
        if silent:
            conn = silent[index % len(silent)]
            self._deliver_now(conn, SessionClosed(conn.token, "ping_timeout", finalized=False))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    def connection_fails_to_open(self, index: int) -> None:
        """The shell could not open a rollover's next connection or a replacement."""
        unopened = [c for c in self.conns.values() if not c.started and not c.closed]
        if unopened:
            conn = unopened[index % len(unopened)]
            self._lose(conn, "never-opened")
            if conn.kind == "replacement":
                self.opening.discard(conn.token)
                self._call(self.core.replacement_failed, conn.token, "handshake failed", self.now)
            else:
                self._call(self.core.rollover_failed, conn.token, "handshake failed", self.now)

    @precondition(lambda self: self.live)
    @rule(frames=st.integers(10, 200))
    def media_clock_stalls(self, frames: int) -> None:
        """Fault: the engine stops pulling the playout for a while (staleness, HR1)."""
        self.pulling = False
        for _ in range(frames):
            self._tick(False)
        self.pulling = True

    @precondition(lambda self: self.live and not self.profile.items)
    @rule()
    def media_clock_stalls_past_the_residence(self) -> None:
        """GPT-Live's 3 s residence deadline, passed with audio waiting."""
        self.media_clock_stalls(int(self.profile.limits.for_format(PCMU_8K).residence_ms // 20 + 10))

    # --- rules: the rollover's questions ------------------------------------------------------------------

    @precondition(lambda self: self.live and not self.auto_answers)
    @rule(
        kind=st.sampled_from(["approve", "authorize"]),
        answer=st.sampled_from([True, False, None]),
        age=st.integers(0, 3),
    )
    def application_answers(self, kind: str, answer: bool | None, age: int) -> None:
        """The approve hook (True, False, raised) or authorize (True, False) answers a question: the latest
        open one, or an older one (a late answer, RO6)."""
        asked = [q for q in self.questions if q[0] == kind]
        if not asked:
            return
        question = asked[-1 - age % len(asked)]
        self.answered.add(question)
        if kind == "approve":
            error = "hook raised" if answer is None else None
            self._call(self.core.rollover_approved, question[1], answer, error, self.now)
        else:
            self._call(self.core.connection_authorized, question[1], bool(answer), self.now)

    # --- rules: the application ---------------------------------------------------------------------------

    @precondition(lambda self: self.live and bool(self.jobs))
    @rule(index=st.integers(0, 7))
    def application_answers_a_job(self, index: int) -> None:
        job = self.jobs[index % len(self.jobs)]
        self.answers += 1
        self._call(self.core.job_answered, job, f'{{"r": "result-of-{job}-{self.answers}"}}', self.now)

    @precondition(lambda self: self.live)
    @rule(speak=st.booleans())
    def application_pushes_an_update(self, speak: bool) -> None:
        self._call(lambda: self.core.push_update("the order shipped", speak=speak, now=self.now))

    # --- rules: hold and hang-up ----------------------------------------------------------------------

    @precondition(lambda self: self.live and hasattr(SessionCoordinator, "hold") and not self.ringing)
    @rule(frames=st.integers(10, 400))
    def caller_holds(self, frames: int) -> None:
        """S7: the caller puts the call on hold (no media either way), then resumes."""
        self.held = True
        self._call(self.core.hold, self.now)  # type: ignore[attr-defined]
        for _ in range(frames):
            self._tick(False)
        self.held = False
        self._call(self.core.resume, self.now)  # type: ignore[attr-defined]

    @precondition(lambda self: self.live and self.ringing)
    @rule()
    def callee_answers(self) -> None:
        """The dialled callee answers: media starts (S7: what waited plays now; with AMD, once the action
        chosen after the verdict starts)."""
        self.ringing = False
        self.frame_path.early = None  # the shell at the answer: the callee's frames take the caller's path
        if self.amd is not None:
            self.amd_waiting = True
            return
        self._call(self.core.answered, self.now)  # type: ignore[attr-defined]

    @precondition(lambda self: self.live and self.ringing and not self.leg_ended)
    @rule(frames=st.integers(1, 60), speech=st.booleans())
    def far_end_early_media(self, frames: int, speech: bool) -> None:
        """The far end's early media (an IVR prompt, an announcement, ringback) before the answer, as the shell's
        frame path gives it (bridge/server/session.py `CallerFrames.early`): to `early_media_frame` when the route
        asks, else nowhere. The media clock runs meanwhile. Early media is neither a caller's turn nor the callee:
        no frame of it reaches a connection unless the route asked, none starts a caller turn, and no model audio
        leaves before the answer (S7)."""
        turns, path = self.core.turns, self.frame_path
        if self.early_media.started(183, self.now) is not None:  # as the shell at the leg's EarlyMediaStarted
            path.early = self.core.early_media_frame if self.early_media.to_provider else _unheard
        before = turns.local_turn
        for _ in range(frames):
            if self.over or not self.ringing:
                return
            self.now += TICK
            if self.pulling:
                self._pulled(self.playout.pull(self.now))
            self.early_frames += 1
            frame = FrameReceived(SPEECH if speech else SILENCE, self.early_frames, self.now)
            self.in_early = True
            self._call(path.feed, self.core, frame, self.now)
            self.in_early = False
            self._require(
                not turns.speaking and turns.local_turn == before and self.speaking is None,
                "EARLY",
                f"early media started a caller turn ({turns.local_turn})",
            )
            deadline = self.core.next_deadline()
            if deadline is not None and deadline <= self.now:
                self._call(self.core.handle_timer, self.now)
            self._deliver_due()

    # --- rules: answering-machine detection ---------------------------------------------------------------

    @precondition(
        lambda self: self.live and self.amd_waiting and self.amd is not None and self.amd.verdict is None
    )
    @rule(kind=st.sampled_from(["human", "machine", "beep", "silence", "unknown"]))
    def amd_verdict(self, kind: str) -> None:
        """The detector's verdict, at any moment after the answer."""
        assert self.amd is not None
        ms = self.now // MS
        verdict = AmdVerdict(kind, self.now, "drawn", ms, 0, 0, 0, 0, 0, 0, 0, 0, 0)  # type: ignore[arg-type]
        self.log.append(f"{ms} ms: AMD verdict {kind}")
        self._amd_start(self.amd.event(verdict, self.now))

    @precondition(lambda self: self.live and self.amd is not None and self.amd.verdict is not None)
    @rule(action=st.sampled_from([None, "talk", "message", "hang_up"]))
    def amd_application_answers(self, action: str | None) -> None:
        """The application's answer to the verdict (in time, or late: then ignored)."""
        assert self.amd is not None
        self._amd_start(self.amd.answer(action, self.now))

    @precondition(
        lambda self: (
            self.live
            and self.amd is not None
            and self.amd.verdict is not None
            and self.amd.verdict.kind == "machine"
        )
    )
    @rule(beep=st.booleans())
    def amd_greeting_ends(self, beep: bool) -> None:
        """The mailbox's beep, or its greeting ended without one."""
        assert self.amd is not None
        ms = self.now // MS
        event = AmdBeep(self.now, "drawn", ms, 300, 1000) if beep else AmdNoBeep(self.now, "drawn", ms)
        self._amd_start(self.amd.event(event, self.now))

    def _amd_start(self, start: AmdStart | None) -> None:
        """The chosen action on the core, as the shell's `AmdGate` carries it out."""
        if start is None or self.leg_ended:
            return
        self.log.append(f"{self.now // MS} ms: AMD {start.action} ({start.by})")
        self.amd_waiting = False
        machine = self

        class Core:  # the core as `carry_out` drives it, each input's commands carried out
            def answered(self, now: int) -> None:
                machine._call(machine.core.answered, now)

            def push_update(self, text: str, *, speak: bool, now: int) -> bool:
                machine._call(lambda: machine.core.push_update(text, speak=speak, now=now))
                return True

            def end(self, reason: str, now: int, *, message: bytes | None = None) -> None:
                machine.amd_ended = True
                machine._call(lambda: machine.core.end(reason, now, message=message))

            def end_after_speech(self, reason: str, now: int, within_ms: int) -> None:
                machine._call(machine.core.end_after_speech, reason, now, within_ms)

        carry_out(Core(), start, self.amd_plan, self.now)

    def _amd_settle(self) -> None:
        """Teardown: a call still listening gets its verdict (a mailbox where its route has a choice for one, so
        that every history with that choice takes it), its answer and the mailbox's beep."""
        if self.amd is None or self.amd.started is not None:
            return
        if self.amd.verdict is None:
            self.amd_verdict("human" if self.amd.policy.machine == "talk" else "machine")
        if self.amd.started is None and self.amd.chosen is None:
            self._amd_start(self.amd.answer(None, self.now))
        if self.amd.started is None:
            self.amd_greeting_ends(True)

    # --- rules: the recording and the payment-card mode (as the shell: bridge/server/session.py) -----------

    @precondition(lambda self: self.live and not self.leg_ended)
    @rule(pause=st.booleans())
    def model_pauses_or_resumes_the_recording(self, pause: bool) -> None:
        if pause:
            self.recording.pause(self.now, "model")
        else:
            self.recording.resume(self.now)

    @precondition(
        lambda self: (
            self.live
            and not self.leg_ended
            and not self.ended
            and self.card is None
            and not self.ringing
            and not self.amd_waiting
        )
    )
    @rule()
    def card_collection_starts(self) -> None:
        """collect_card: from now on the caller's frames are withheld (the frame path's `card`), the recording
        paused."""
        self.card = self.frame_path.card = CardCollector(CARD, self.now, self.now // MS, "model")
        self.recording.pause(self.now, "card", card=True)
        self.log.append(f"{self.now // MS} ms: card collection starts")

    @precondition(lambda self: self.live and not self.leg_ended)
    @rule(key=st.sampled_from("0123456789#*"))
    def caller_presses_a_key(self, key: str) -> None:
        """A key (RFC 4733), routed as the shell routes it (`CallerFrames.key`): to the collection while one runs
        (every key), else to the core (`dtmf_to_model`); outside a collection the caller presses `*` and `#` only
        (the module docstring)."""
        if self.card is None and key not in "*#":
            return
        results: list[CardResult | None] = []
        self._call(
            lambda: results.append(self.frame_path.key(self.core, key, self.now))
        )  # the shell's routing
        if results[0] is not None:
            self._card_over(results[0])

    @precondition(lambda self: self.live and self.card is not None)
    @rule()
    def card_collection_is_cancelled(self) -> None:
        assert self.card is not None
        self._card_over(self.card.end("cancelled", self.now // MS))

    def _card_over(self, result: CardResult | None) -> None:
        """The collection ended: the frames flow again, the recording resumes, the withheld stretch reported."""
        card, self.card = self.card, None
        self.frame_path.card = None
        self.recording.resume(self.now, card=True)
        assert card is not None and result is not None
        self.log.append(
            f"{self.now // MS} ms: card collection {result.outcome}, {card.withheld} frames withheld"
        )
        if (gap := card.discontinuity()) is not None:
            self._notice(gap)

    def _check_recording(self) -> None:
        """A paused recording writes nothing: silence on both channels for every slot inside a gap."""
        rec = self.recording
        gaps = [(start, self.now if end is None else end) for start, end, _ in rec.gaps]
        written = b"".join(self.taken) + rec.take(self.now, final=True)
        stereo = np.frombuffer(written, dtype="<i2").reshape(-1, 320)
        origin = (rec.start_ms or 0) * MS // TICK  # a recording consent: the file begins where it ended
        for start, end in gaps:
            first, last = max(start // TICK + 2 - origin, 0), min(end // TICK - 1 - origin, len(stereo))
            if first < last:
                self._require(
                    not stereo[first:last].any(),
                    "RECORDING",
                    f"audio recorded while paused ({start // MS}-{end // MS} ms)",
                )

    # --- rules: a transfer, cold or warm ----------------------------------------------------------------

    @precondition(
        lambda self: (
            self.live
            and not self.leg_ended
            and not self.ended
            and self.transfer is None
            and not self.ringing
            and not self.amd_waiting
        )
    )
    @rule(warm=st.booleans())
    def application_transfers(self, warm: bool) -> None:
        """`LiveCall.transfer`: the shell marks it (one at a time), then REFERs or starts the warm transfer."""
        self._require(
            not self.core.telephony.transferring, "WARM", "a transfer in progress with none started"
        )
        self._call(self.core.telephony.application_transfer)
        self.transfers += 1
        self.transfer = "warm" if warm else "cold"
        self.log.append(f"{self.now // MS} ms: {self.transfer} transfer starts")
        if warm:
            # every other caller takes a REFER with Replaces
            replaces = (self.transfers + self.replaces_first) % 2 == 0
            transfer = self.warm = WarmTransfer(
                "sip:agent@pbx.example", "brief", self.now, self.warm_options, "12", caller_replaces=replaces
            )
            self._warm(transfer.start)

    @precondition(lambda self: self.live and self.transfer is not None)
    @rule(step=st.sampled_from(sorted(WARM_STEPS)))
    def transfer_target_answers(self, step: str) -> None:
        """The target's next answer: a response to the warm transfer's INVITE, a key, a hang-up; or the cold
        transfer's NOTIFY."""
        if self.transfer == "cold":
            if step in COLD_STATUS:
                self._cold(COLD_STATUS[step], step != "ringing")
        elif (warm := self.warm) is not None:
            self._warm(lambda: warm.handle(WARM_STEPS[step], self.now))

    # The human's plausible next answers at each stage of a warm transfer: the happy path's next step, another
    # plausible one, a way out (the random steps above nearly never pass the ringing before its timeout) ...
    NEXT_STEPS = {
        WarmState.DIALING: ("answered", "ringing", "busy"),
        WarmState.RINGING: ("answered", "answered", "fails"),
        WarmState.BRIEFING: ("spoken", "accepts", "refuses"),  # (a key cuts the briefing short)
        WarmState.AWAITING: ("accepts", "accepts", "hangs_up"),
        WarmState.JOINING: ("replaced", "refer_refused", "hangs_up"),  # (the replaced leg's BYE first)
    }
    NEXT_CHOICE = (0, 0, 0, 0, 1, 0, 1, 2, 0, 0)  # ... drawn 7, 2 and 1 times in 10

    @precondition(lambda self: self.live and self.transfer == "warm")
    @rule(choice=st.integers(0, 9))
    def transfer_target_goes_on(self, choice: int) -> None:
        """The target's next answer, drawn among the plausible ones for the transfer's stage (a generator's
        choice: the stage is read only to pick the next event)."""
        if (warm := self.warm) is not None and warm.active:
            step = self.NEXT_STEPS[warm.state][self.NEXT_CHOICE[choice]]
            self.log.append(f"{self.now // MS} ms: the target: {step}")
            self._warm(lambda: warm.handle(WARM_STEPS[step], self.now))

    def _cold(self, status: int, final: bool) -> None:
        self._call(self.core.transfer_progress, status, "sipfrag", final, self.now)
        if final:
            self._reported(f"cold {status}")
            if 200 <= status < 300 and not self.leg_ended:  # as the shell: transferred, the bridge hangs up
                self._call(self.core.end, "transferred", self.now)

    def _warm(self, produce: object) -> None:
        """The warm transfer's actions (`produce()`), carried out on the core by `caller_side` as the shell does;
        the legs' part (hold music, the target leg, the relay) checked here."""
        actions: list[WarmAction] = []
        moment = self._moment()  # what else is going on as the transfer's actions are carried out
        self._call(lambda: actions.extend(caller_side(self.core, produce(), self.now)))  # type: ignore[operator]
        for action in actions:
            self.log.append(f"{self.now // MS} ms: warm {action!r}"[:160])
            _event(f"warm: {type(action).__name__}")  # (how far transfers get: properties.py --statistics)
            if isinstance(action, (DialTarget, BriefTarget, SendTargetDigits, ReferCaller, JoinLegs)):
                self._require(not self.leg_ended, "S6", f"warm transfer {action!r} after the call leg ended")
                self._require(not self.ended, "S6", f"warm transfer {action!r} after the session ended")
            if isinstance(action, (ReferCaller, JoinLegs)) and moment:
                _event(f"warm: {type(action).__name__} during {moment}")
            if isinstance(action, HoldCaller):
                self.parked = True
                self.line_holds, self.line_releases = self.line_holds + 1, 0
                self._require(self.line_holds == 1, "WARM", "the caller put on hold music twice")
            elif isinstance(action, ReleaseCaller):
                self.parked = False
                self.line_releases += 1
                self._require(
                    self.line_releases == 1 and not self.leg_ended,
                    "WARM",
                    "the caller given back to the model twice, or after the leg ended",
                )
            elif isinstance(action, Outcome):
                done = action.result
                _event(f"warm: {done.outcome}" + (f" by {done.join}" if done.join else ""))
                self.line_holds = 0
                self._reported(done.outcome)
                if done.outcome != ACCEPTED and not self.leg_ended:  # undone: back with the model, once
                    self._require(
                        self.line_releases == 1 and not self.parked,
                        "WARM",
                        f"a {done.outcome} transfer left the caller on hold music",
                    )
        joined = JoinLegs() in actions or any(isinstance(a, HangUpCaller) for a in actions)
        if joined and not self.leg_ended:
            self._require(self.line_releases == 0, "WARM", "the caller given back to the model, then joined")
            self.relayed = JoinLegs() in actions
            self._call(self.core.end, "transferred (warm)", self.now)  # as the shell: the AI leaves
        if joined:
            self._leg_gone()  # the caller's leg is the relay's, or replaced (S6 from here on)
        elif self.transfer is None:
            self.parked = False

    def _moment(self) -> str:
        """What else is going on (for the statistics of what a transfer's step met)."""
        rollover = self.core.rollover.controller
        stage = rollover.stage.value if rollover is not None else ""
        return " ".join(
            what
            for what, now in (
                ("recovery", bool(self.recovering) or self.core.recovery.reconnecting),
                (f"rollover-{stage}", stage in ("overlap", "draining")),
                ("caller-hold", self.held),
                ("barge-in", self.core.barge.suppressed),
                ("card", self.card is not None),
            )
            if now
        )

    def _reported(self, outcome: str) -> None:
        self.outcomes += 1
        self._require(
            self.outcomes == self.transfers and self.transfer is not None,
            "WARM",
            f"a transfer's outcome ({outcome}) reported twice, or for no transfer",
        )
        self.transfer = None
        self._require(not self.core.telephony.transferring, "WARM", f"still transferring after {outcome}")

    @precondition(lambda self: self.live and not self.leg_ended)
    @rule(now=st.integers(0, 7))
    def caller_hangs_up(self, now: int) -> None:
        """One draw in eight hangs up (a call that ended early has little left to explore)."""
        if now == 7:
            self._leg_gone()

    # --- invariants -----------------------------------------------------------------------------------

    @invariant()
    def consent_nothing_recorded_before_it_ended(self) -> None:
        """The recording (the writer's once-a-second `take`, here after every step) writes nothing until the
        consent was delivered; its stamp is where its last frame's audio ended (the ledger's own account); no
        more caller speech is in the recording than the caller said from that point on."""
        tap = self.tap
        if tap is None or not self.ready:
            return
        block = tap.take(self.now)
        if not block:
            return
        self.taken.append(block)  # the pauses' check (`_check_recording`) reads the whole file
        consent = self.consent
        self._require(
            consent is not None and consent.outcome == "delivered",
            "CONSENT",
            f"{len(block)} bytes recorded before the consent was delivered ({consent!r})",
        )
        assert consent is not None and consent.ended_ms is not None
        progress = self.playout.ledger.progress(CONSENT_ITEM)
        self._require(
            progress is not None and consent.ended_ms == progress.last_ns // MS + 20,
            "CONSENT",
            f"the consent stamped as ended at {consent.ended_ms} ms; the ledger says {progress!r}",
        )
        start = tap.start_ms
        self._require(
            start is not None and start >= consent.ended_ms, "CONSENT", f"the WAV begins at {start}"
        )
        left = np.frombuffer(block, dtype="<i2")[::2].reshape(-1, 160)
        self.recorded_speech += int(np.count_nonzero(left.any(axis=1)))
        after = sum(1 for at in self.speech_at if at >= consent.ended_ms * MS)
        self._require(
            self.recorded_speech <= after,
            "CONSENT",
            f"{self.recorded_speech} caller speech frames recorded; {after} came after the consent ended",
        )

    @invariant()
    def s5_every_recovery_reconnects_within_5_s(self) -> None:
        if not self.ready or self.ended or self.leg_ended:
            return
        for token, began in self.recovering.items():
            late = self.now - began - RECOVERY_BUDGET_MS * MS
            self._require(
                late <= TICK, "S5", f"the recovery opening {token} is still reconnecting {late // MS} ms late"
            )

    @invariant()
    def warm_the_line_is_held_by_its_holders_only(self) -> None:
        """S7 with a warm transfer: the caller's line is held exactly while the caller holds the call or waits on
        hold music; an undone transfer gives the caller back to the model, a caller who resumes during one does
        not hear the model."""
        if not self.live or self.leg_ended or self.ended or self.core.ending.ended:
            return
        self._require(
            self.core.call_line.on_hold == (self.held or self.parked),
            "WARM",
            f"the line {'held' if self.core.call_line.on_hold else 'up'} with the caller "
            f"{'holding' if self.held else 'not holding'}, {'on' if self.parked else 'off'} hold music",
        )

    def teardown(self) -> None:
        """S1 at a quiet settle: 6 s of silence with every event delivered; then each utterance the caller
        finished has reached the application, or its loss is accounted for."""
        if self.ready:
            self._check_recording()
            # (a cold one is the SIP engine's, decided by the leg's end at the latest: a session that ended with
            # the leg up hangs it up once its closing message has played)
            gone = self.leg_ended or (self.ended and self.transfer == "warm")
            self._require(
                self.transfer is None or not gone,
                "WARM",
                f"a {self.transfer} transfer left undecided after the call or the session ended",
            )
            if self.warm is not None and self.warm.active and not self.over:  # the human hangs up: undone
                warm = self.warm
                self._warm(lambda: warm.handle(TargetHungUp(), self.now))
            if self.transfer == "cold" and not self.over:
                self._cold(487, True)
        if self.card is not None and not self.over:  # the application cancels it: the settle hears the caller
            self._card_over(self.card.end("cancelled", self.now // MS))
        if not self.ready or self.ended or self.leg_ended:
            return
        self.held = False
        self.pulling = True
        self.settling = True
        if self.ringing:
            self.callee_answers()
        self._amd_settle()
        if self.ended or self.leg_ended:
            return
        for _ in range(SETTLE_TICKS):
            self._tick(False)
            if self.ended or self.leg_ended:
                return
        for conn in self.conns.values():
            self._deliver(conn, len(conn.outbox))
        if self.ended or self.leg_ended:
            return
        for utterance in self.utterances.values():
            self._check_reached(utterance)
            self._check_whole(utterance)

    def _check_whole(self, u: Utterance) -> None:
        """S1, stretch by stretch: an utterance every hearer transcribed, none lost by a fault, reaches the
        application whole — every stretch of it longer than `match_slack_ms` (RO3 counts two connections' spans
        within it as the same words) and than 200 ms (a caption fragment: no provider's text is finer) in a text
        told, or in a stretch reported unheard. (A caller talking through a rollover's hard stop: RO2 cuts the old
        connection's text there, the next connection's is of the rest.)"""
        if not u.ended or u.discarded_at is not None or not u.hearers:
            return
        for token in u.hearers:
            conn = self.conns[token]
            if (
                token not in u.texted_by
                or u.uid in conn.failed
                or conn.lost not in (None, "closed", "rollover-close")
            ):
                return
        told = self.told.get(u.uid, set())
        missing = [
            i
            for i, at in enumerate(u.frame_ms)
            if i not in told and not any(start - 20 <= at <= end for start, end in self.unheard)
        ]
        runs: list[list[int]] = []
        for i in missing:
            if runs and runs[-1][1] == i - 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        slack = self.core.rollover.options.match_slack_ms if self.core.rollover.options else 0
        least = (
            max(slack, VAD_SILENCE_FRAMES * 20) + 40
        )  # (RO3's slack; frames against the bridge's ms: 40 ms)
        lost = [(first, last) for first, last in runs if (last - first + 1) * 20 > least]
        self._require(
            not lost,
            "S1",
            f"<u{u.uid}>'s frames {lost} reached the application in no text and were not reported unheard",
        )

    def _check_reached(self, u: Utterance) -> None:
        if self.emitted.get(u.uid) or not u.ended:
            return
        if u.discarded_at is not None:
            reported = any(t >= u.discarded_at for t in self.input_discontinuities)
            self._require(
                reported or self.core.recovery.reconnecting,
                "S1",
                f"<u{u.uid}>'s frames were discarded and no input audio_discontinuity was reported",
            )
            return
        began = u.began_ns // MS  # (the session's timeline starts at 0; a report counts whole 20 ms frames)
        if any(start - 20 <= began < end for start, end in self.unheard):
            return  # it lies in a stretch the bridge reported unheard (`recovery_unheard`, `rollover_unheard`)
        hearers = {}  # each connection that heard it: what became of it
        for token in sorted(u.hearers):
            conn = self.conns[token]
            if u.uid in conn.failed:
                hearers[token] = "transcription-failed"
            else:
                texted = "its text reached the core, then " if token in u.texted_by else ""
                assert texted or conn.lost is not None, (
                    f"model: {token} heard <u{u.uid}>, is open and said nothing"
                )
                hearers[token] = f"{texted}{conn.lost or 'still open'}"
        # What the bridge could not have had: a provider's failed transcription or silence; the floor's words lost
        # with it in a fault that the recovery reports and repairs (HR2, HR7: the caller is asked to repeat); a
        # closed old connection whose speech-start had not reached the core (RO2 judged on what it knew).
        excused = {"transcription-failed", "silent", "recovery-floor", "died-floor", "rollover-close-unseen"}
        self._require(
            bool(u.hearers) and set(hearers.values()) <= excused,
            "S1",
            f"<u{u.uid}> never reached the application, with no input audio_discontinuity; its hearers: {hearers}",
        )


PROFILE = settings(
    max_examples=200,
    stateful_step_count=60,
    deadline=None,
    report_multiple_bugs=False,  # one broken promise, shrunk
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LONG = settings(PROFILE, max_examples=5_000, stateful_step_count=150)


def run_the_machine(
    profile: settings, shrink_seconds: int, machine: type[SessionMachine] | None = None
) -> None:
    """S1-S7 and barge-in after every step of every call history the machine draws (tests/bench/properties.py
    runs it; the cases it found are the regression tests of this module, which CI runs). `machine`: the
    session's (`SessionMachine`, the default) or `WarmTransferMachine`."""
    saved = engine.MAX_SHRINKING_SECONDS  # hypothesis's own bound on shrinking (300 s), read when it starts
    engine.MAX_SHRINKING_SECONDS = shrink_seconds
    try:
        run_state_machine_as_test(machine or SessionMachine, settings=profile)
    finally:
        engine.MAX_SHRINKING_SECONDS = saved


CI = settings(PROFILE, derandomize=True, database=None)  # the same 200 call histories on every run


def test_s1_to_s7_hold_over_the_machines_call_histories() -> None:
    """The machine itself, on CI's budget (`--quick`: 200 call histories of 60 steps, about 10 s here). The
    histories are the same on every run — a red build names a change of the code, never a new draw —
    and tests/bench/properties.py explores new ones (`--seed`, `--examples`); each case it finds is kept below."""
    run_the_machine(CI, 40)


class WarmTransferMachine(SessionMachine):
    """The session machine around warm transfers: an inbound call whose application begins a warm transfer after
    a drawn lead (past 4 s a rollover is under way) and, once it is decided, the next, with the target's answers
    drawn at the end of one time step in two (`transfer_target_goes_on`: mostly the happy path's next one) and
    each of the session's moments that can meet the human's decision — the floor lost, flooded, gone half-open
    and found, a connection failing to open, an early expiry or a goAway (a rollover squeezed in), the caller's
    own hold and resume (`MediaHeld`, `MediaResumed`: two steps here, so a transfer's steps fall between them),
    a barge-in, an update — in one rule, `amid`, the target's step in the same instant. The rules that reach
    none of it (AMD, early media, card collection, recording pauses, no-input, the long stalls) are left out,
    and the ring and decision timeouts are longer than `WARM`'s. Every invariant of `SessionMachine` is checked
    after every step.

    Measured on CI's 50 histories: 74 warm transfers, 40 accepted (24 relayed, 2 of them after a refused REFER;
    16 replaced), the acceptance during a recovery once, the caller's hold 8 times, a caller's turn still
    suppressing the model (a barge-in) 22 times; a rollover's overlap and drain are met by other draws (and by
    the `test_warm_an_acceptance_...` cases below on every run). `SessionMachine`'s own 200 histories reached the
    target's answer in none (16 transfers, 7 ringing; still about so with `transfer_target_goes_on`)."""

    warm_options = WarmOptions(ring_timeout_ms=4_000, accept_timeout_ms=6_000, join_timeout_ms=2_000)

    @initialize(
        profile=st.sampled_from(PROFILES),
        auto_answers=st.sampled_from([True, True, True, False]),
        slack=st.sampled_from([500, 0]),
        replaces_first=st.integers(0, 1),
        lead=st.sampled_from([0, 50, 150, 210, 230, 250, 270, 290]),
    )
    def start(
        self, profile: Profile, auto_answers: bool, slack: int, replaces_first: int = 1, lead: int = 0
    ) -> None:
        """The call is up; after `lead` frames of the caller's turns (talking 0.8 s, pausing 0.4 s: past 4 s a
        rollover is under way) the application begins a warm transfer."""
        SessionMachine.start(self, profile, auto_answers, slack)
        self.replaces_first = replaces_first
        for frame in range(lead):
            self._tick(frame % 60 < 40)
        self.application_transfers(True)

    @precondition(lambda self: self.ready)
    @rule(
        frames=st.integers(3, 30),
        caller=st.sampled_from(["talks", "waits", "waits", "holds"]),
        human=st.integers(0, 19),
    )
    def caller_talks_or_waits(self, frames: int, caller: str, human: int = 10) -> None:
        """The caller's turns in short steps (this machine's only steps of time besides a barge-in), or the caller
        holding the call for a while; at the end of one in two the target's next step (before the caller resumes):
        a transfer is decided within a few seconds, a recovery's, an overlap's or a hold's moments included."""
        if caller == "holds" and self.live:
            self._caller_holds(True)
        for _ in range(frames):
            self._tick(caller == "talks" and self.live)
        if human < 10 and self.live and self.transfer == "warm":
            self.transfer_target_goes_on(human)
        if caller == "holds" and self.live and not self.leg_ended:
            self._caller_holds(False)

    def _caller_holds(self, held: bool) -> None:
        """S7: the caller's own hold (a re-INVITE) and resume, on its own or over the transfer's hold music (the
        model is heard again only when the caller no longer waits on hold music)."""
        if held != self.held:
            self.held = held
            self._call(self.core.hold if held else self.core.resume, self.now)

    @precondition(lambda self: self.live)
    @rule(
        what=st.sampled_from(
            [
                "drop",
                "flood",
                "half-open",
                "found",
                "unopened",
                "expiry",
                "go-away",
                "hold",
                "resume",
                "barge-in",
                "update",
            ]
        ),
        then=st.sampled_from(["target", "target", "transfer", "nothing"]),
        choice=st.integers(0, 9),
    )
    def amid(self, what: str, then: str, choice: int) -> None:
        """Something happens, and in the same instant the target answers (its plausible next step) or, none under
        way, the application starts a warm transfer: the human's decision in the first tick of a recovery, a
        rollover, a hold, a barge-in (the faults' own rules are left out of this machine: they come here)."""
        if what == "drop":
            SessionMachine.connection_drops(self, 0)
        elif what == "flood":
            SessionMachine.provider_floods(self, 0)
            self.deliver(0, 1)
        elif what == "half-open":
            SessionMachine.connection_goes_half_open(self, 0)
        elif what == "found":  # the pings find it
            SessionMachine.pings_find_a_half_open_connection(self, 0)
        elif what == "unopened":  # a replacement or a next connection fails to open
            SessionMachine.connection_fails_to_open(self, 0)
        elif what == "update":  # (it waits while the caller is on hold music)
            SessionMachine.application_pushes_an_update(self, True)
        elif what == "expiry":
            SessionMachine.connection_expires(self, 0, 1_000)
        elif what == "go-away":
            SessionMachine.provider_goes_away(self, 0, 0)
            self.deliver(0, 1)
        elif what in ("hold", "resume"):
            self._caller_holds(what == "hold")
        elif what == "barge-in" and not self.parked and not self.held:
            self.provider_speaks(0, 40)
            self.deliver(0, 1)
            self.caller_talks_or_waits(BARGE_IN_MS // 20, "talks")
        if not self.live or self.leg_ended:
            return
        if then == "target" and self.transfer == "warm":
            self.transfer_target_goes_on(choice)
        elif then != "nothing" and self.transfer is None and not self.ended:  # the next one, soon
            self.application_transfers(True)

    def teardown(self) -> None:
        if self.live and not self.leg_ended:  # the caller resumes before the settle
            self._caller_holds(False)
        super().teardown()


# What `WarmTransferMachine` leaves out: a plain attribute is no rule
for _left_out in (
    "amd_verdict",
    "amd_application_answers",
    "amd_greeting_ends",
    "callee_answers",
    "far_end_early_media",
    "card_collection_starts",
    "card_collection_is_cancelled",
    "caller_presses_a_key",
    "model_pauses_or_resumes_the_recording",
    "caller_stays_silent",
    "caller_breathes",
    "caller_talks",
    "caller_pauses",
    "caller_holds",
    "media_clock_stalls",
    "media_clock_stalls_past_the_residence",
    "provider_interim_text",
    "provider_will_fail_a_transcription",
    "provider_usage",
    "provider_error",
    "provider_redelivers_a_call",
    "connection_drops",
    "connection_goes_half_open",
    "connection_expires",
    "provider_floods",
    "provider_goes_away",
    "provider_calls_a_tool",
    "application_answers_a_job",
    "pings_find_a_half_open_connection",
    "connection_fails_to_open",
    "application_pushes_an_update",
    "transfer_target_answers",  # (its steps in any order: SessionMachine's; here the plausible ones)
):
    setattr(WarmTransferMachine, _left_out, None)

WARM_CI = settings(CI, max_examples=50, stateful_step_count=40)


def test_warm_transfers_keep_every_promise_at_any_moment_of_the_session() -> None:
    """The warm transfer's machine on CI's budget (50 histories of 40 steps, the same on every run: about 2 s
    here, beside the 12 s of `SessionMachine`'s)."""
    run_state_machine_as_test(WarmTransferMachine, settings=WARM_CI)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_the_machine_runs_a_plain_call_without_a_violation(profile: Profile) -> None:
    """The model itself: a call of plain turns (no fault) keeps every promise, across rollovers."""
    machine = SessionMachine()
    machine.start(profile, True, 500)
    for _ in range(12):
        machine.caller_talks(40)
        machine.caller_pauses(40)
    machine.teardown()
    assert machine.emitted == {uid: 1 for uid in range(1, 13)}
    assert len([c for c in machine.conns.values() if c.kind == "rollover"]) >= 3


# --- the nasty cases the machine found, as plain regression tests (each names the broken promise) ---------


def _overlap(machine: SessionMachine) -> None:
    """Realtime, scaled ages: the next connection (conn-2) opens at the caller's first end of speech after 4 s
    and hears the second utterance with the first one (conn-1), whose VAD segments have just ended."""
    machine.start(REALTIME_LIKE, True, 500)
    machine.caller_pauses(200)
    machine.caller_talks(20)
    machine.caller_pauses(45)
    assert [c.kind for c in machine.conns.values()] == ["first", "rollover"]
    machine.caller_talks(20)  # <u2>: both connections hear it
    machine.caller_pauses(10)  # both VADs close it; their events are on the way


def test_s2_a_call_the_next_connection_began_as_a_listener_is_not_dispatched_again() -> None:
    """The old connection's reply to <u2> ends in a tool call, whose ResponseDone moves the floor (RO8); the
    next connection's own call for <u2>, begun while it listened, arrives once it holds the floor."""
    machine = SessionMachine()
    _overlap(machine)
    machine.caller_pauses(1)
    machine.deliver(0, 6)
    machine.deliver(1, 6)
    machine.provider_calls_a_tool(0)
    machine.provider_calls_a_tool(1)
    machine.provider_response_done(0)
    machine.deliver(0, 6)
    machine.caller_pauses(30)
    machine.teardown()


def test_se5_the_caller_interrupts_the_old_connection_during_the_hand_over() -> None:
    """The old connection stopped hearing the caller (RO2) and plays its answer; the caller speaks, only the
    next connection hears it: the answer must stop as it would on the floor (a barge-in)."""
    machine = SessionMachine()
    _overlap(machine)
    machine.caller_pauses(1)
    machine.deliver(0, 6)
    machine.deliver(1, 6)
    machine.provider_speaks(0, 60)
    machine.deliver(0, 6)
    machine.caller_pauses(5)
    machine.caller_talks(40)
    machine.teardown()


def test_s1_a_recovery_during_the_overlap_keeps_the_next_connections_text() -> None:
    """The old connection is lost before its text of <u2> arrives; the recovery quarantines the healthy next
    connection together with its text of <u2> (RO3: the new one's stands when the old one's never arrives)."""
    machine = SessionMachine()
    _overlap(machine)
    machine.deliver(1, 6)
    machine.connection_drops(0)
    machine.teardown()
    assert machine.emitted == {1: 1, 2: 1}  # (what the bridge held is told, not only reported)


def test_s1_the_next_connection_lost_during_the_drain_loses_no_utterance_silently() -> None:
    """The old connection stopped input; the caller's <u3> is heard by the next connection alone, which is lost
    before its text: no input audio_discontinuity, no recovery, nothing asks the caller to repeat."""
    machine = SessionMachine()
    _overlap(machine)
    machine.caller_pauses(1)
    machine.deliver(0, 6)
    machine.deliver(1, 6)
    machine.caller_talks(20)
    machine.caller_pauses(5)
    machine.connection_drops(1)
    machine.teardown()
    assert machine.emitted == {1: 1, 2: 1}  # (what the bridge held is told, not only reported)


def test_s1_gpt_live_an_utterance_only_the_old_connection_heard_survives_its_close() -> None:
    """GPT-Live: the caller's caption fragments are grouped until 1 s after the turn; the rollover closes the
    old connection (its close-by age) before that, and the group of a connection no longer known is dropped."""
    machine = SessionMachine()
    machine.start(GPT_LIVE_LIKE, True, 500)
    machine.caller_pauses(272)
    machine.caller_talks(40)  # <u1>, 5.44 s to 6.24 s; the next connection opens at 6 s and hears none of it
    machine.caller_pauses(100)
    machine.teardown()
    assert machine.emitted == {1: 1}  # (what the bridge held is told, not only reported)


def test_s1_gpt_live_caption_text_received_before_a_recovery_is_not_dropped() -> None:
    """GPT-Live: the floor's caption of <u1> has arrived and waits for the group's close when an overflow
    starts a recovery; the quarantined connection's group is dropped at the close."""
    machine = SessionMachine()
    machine.start(GPT_LIVE_LIKE, True, 500)
    machine.caller_talks(30)
    machine.caller_pauses(26)
    machine.provider_floods(0)
    machine.deliver(0, 1)
    machine.teardown()
    assert machine.emitted == {1: 1}  # (what the bridge held is told, not only reported)


def test_s6_a_connection_announcing_its_end_after_the_hang_up_starts_no_rollover() -> None:
    """The caller hung up; inside the close window (the provider's final usage is awaited) the connection
    announces its end: the rollover asks `approve` for a call that is gone."""
    machine = SessionMachine()
    machine.start(REALTIME_LIKE, False, 500)
    machine.caller_hangs_up(7)
    machine.connection_expires(0, 1_000)
    machine.caller_pauses(100)


def test_s1_two_utterances_closer_than_match_slack_ms_are_not_one() -> None:
    """Both connections hear <u2>; 220 ms later <u3> begins, as the old connection stops hearing the caller
    (RO2: its speech-start was not in yet), so only the next connection transcribes <u3>. RO3 lets the new
    one's text stand, but its span lies within `match_slack_ms` of <u2>'s, which the old one emitted: it is
    dropped as a duplicate (with `match_slack_ms` 0 it is emitted)."""
    machine = SessionMachine()
    machine.start(REALTIME_LIKE, True, 500)
    machine.caller_pauses(200)
    machine.caller_talks(20)
    machine.caller_pauses(40)  # the next connection opens and is confirmed
    machine.caller_talks(3)  # <u2>
    machine.caller_breathes(11)
    machine.caller_talks(5)  # <u3>
    machine.caller_pauses(60)
    machine.teardown()
    assert machine.emitted == {1: 1, 2: 1, 3: 1}  # (what the bridge held is told, not only reported)


def test_s1_a_text_begun_as_the_old_connection_stopped_hearing_is_emitted_once() -> None:
    """GPT-Live, rollovers in a row: the caller begins <u2> in the frame under way when the old connection
    stops hearing them; the old one's caption covers its first 20 ms, the new one's all of it, both begun at
    the same instant. The new one's text was taken for its own (begun not before the stop) and emitted beside
    the old one's."""
    machine = SessionMachine()
    machine.start(GPT_LIVE_LIKE, True, 500)
    machine.media_clock_stalls(10)
    for _ in range(3):
        machine.media_clock_stalls_past_the_residence()
    machine.caller_talks(4)
    machine.media_clock_stalls_past_the_residence()
    machine.caller_talks(26)
    machine.media_clock_stalls_past_the_residence()
    machine.teardown()
    assert machine.emitted == {1: 1, 2: 1}  # (what the bridge held is told, not only reported)


def test_s1_a_recovery_right_after_a_rollover_emits_the_floors_last_caption_group_once() -> None:
    """GPT-Live: the old connection is closed with its caption of <u1> emitted; the same instant the new floor
    is lost, and its own caption group of <u1>, still open, was emitted by the recovery around the rollover's
    matching: twice."""
    machine = SessionMachine()
    machine.start(GPT_LIVE_LIKE, True, 500)
    machine.media_clock_stalls_past_the_residence()
    machine.media_clock_stalls_past_the_residence()
    machine.caller_talks(55)
    machine.connection_drops(0)
    machine.teardown()
    assert machine.emitted == {1: 2}  # the old one's text, and the new one's of what followed its stop


def test_s1_an_utterance_cut_in_two_by_a_repair_is_told_as_two_stretches() -> None:
    """GPT-Live: the caller talks through two connection losses. The first connection's captions of the start
    are emitted at the first recovery, the frames while the replacement connects are reported (HR8), and the
    replacement's captions of the rest are emitted at the second: two texts of one utterance, of frames that
    do not overlap — different words, each told once (the machine counted them as one utterance told twice)."""
    machine = SessionMachine()
    machine.start(GPT_LIVE_LIKE, True, 500)
    machine.caller_talks(70)
    machine.connection_drops(0)
    machine.caller_talks(40)
    machine.connection_drops(0)
    machine.teardown()
    assert machine.emitted == {1: 2}
    assert machine.input_discontinuities


def test_s1_gpt_live_a_late_caption_of_one_turn_does_not_carry_the_next_turn_away() -> None:
    """GPT-Live, the next connection opens at the deadline in mid-<u2> and hears its last 40 ms; the old one
    stops hearing the caller as <u3> begins, 460 ms after <u2> (less than `match_slack_ms`). The next one's
    caption of <u2>'s tail arrives after the caller's turn ended and was grouped with its caption of <u3>, one
    text matched to the old connection's <u2> (RO3) and dropped as its duplicate: <u3> was lost."""
    machine = SessionMachine()
    machine.start(GPT_LIVE_LIKE, True, 500)
    machine.caller_pauses(19)
    machine.caller_talks(49)  # <u1>
    machine.caller_pauses(44)
    machine.media_clock_stalls(119)
    machine.caller_pauses(41)
    machine.caller_talks(45)  # <u2>, 5.44 s to 6.34 s: the next connection opens at 6 s, hears from 6.3 s
    machine.caller_pauses(23)
    machine.caller_talks(3)  # <u3>, from 6.8 s
    machine.teardown()
    assert machine.emitted == {1: 1, 2: 1, 3: 1}


def test_s1_an_old_connection_closed_by_a_go_away_with_its_text_on_the_way_is_told() -> None:
    """GPT-Live: a goAway squeezes the rollover; the next connection opens at the caller's first pause and
    hears them from 660 ms. <u2> (380-420 ms) only the old one heard; a goAway with no time left closes it at
    once, its caption of <u2> still on the way: lost, and nothing told the application."""
    machine = SessionMachine()
    machine.start(GPT_LIVE_LIKE, True, 500)
    machine.provider_goes_away(0, 3_000)
    machine.caller_talks(3)  # <u1>
    machine.caller_breathes(15)
    machine.caller_talks(3)  # <u2>
    machine.provider_goes_away(0, 0)
    machine.teardown()
    assert machine.emitted == {1: 1}
    assert machine.unheard == [(380, 660)]


def test_s1_gpt_live_words_after_the_old_connection_stopped_hearing_are_the_next_ones() -> None:
    """GPT-Live: the caller talks through the deadline; the next connection opens and hears the end of <u2>;
    the old one stops hearing at its hard stop (7 s) as <u3> begins, 280 ms after <u2> — within the local
    detector's hangover, so one caller turn. The next one's captions of <u2>'s end and of <u3> were one group,
    matched to the old one's <u2> (RO3) and dropped as its duplicate: <u3> was lost."""
    machine = SessionMachine()
    machine.start(GPT_LIVE_LIKE, True, 500)
    machine.caller_talks(89)  # <u1>
    machine.caller_breathes(14)
    machine.caller_talks(233)  # <u2>, 2.06 s to 6.72 s
    machine.caller_breathes(14)
    machine.caller_talks(3)  # <u3>, at 7 s
    machine.teardown()
    assert machine.emitted == {1: 1, 2: 1, 3: 1}


def test_s1_an_utterance_in_a_reported_unheard_stretch_is_accounted_for() -> None:
    """Realtime: the caller's <u1> goes on through a hold and after it; the next connection hears its last
    20 ms when the floor is lost. The recovery quarantines both and reports the caller audio no text accounts
    for, from <u1>'s start (`recovery_unheard`): S1's own exception, which the machine did not credit to the
    quarantined next connection."""
    machine = SessionMachine()
    machine.start(REALTIME_LIKE, True, 500)
    machine.caller_pauses(37)
    machine.caller_talks(37)  # <u1>, from 760 ms
    machine.caller_holds(211)
    machine.caller_talks(31)
    machine.connection_drops(0)
    machine.teardown()
    assert not machine.emitted and machine.unheard[0] == (760, 6320)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_s1_a_caller_talking_through_hard_stops_loses_no_stretch_silently(profile: Profile) -> None:
    """The caller talks for 20 s without a pause: each connection opens at its deadline in mid-utterance and is
    committed at its hard stop (RO2), so each transcribes a part of the one utterance, overlapping the next one's
    by the overlap. RO3 emitted the old connection's text and dropped the next one's as its duplicate — with it
    the stretch only the next one heard, seconds of speech, in no text and not reported."""
    machine = SessionMachine()
    machine.start(profile, True, 500)
    machine.caller_talks(1_000)
    machine.caller_pauses(30)
    machine.teardown()
    assert len([c for c in machine.conns.values() if c.kind == "rollover"]) >= 3
    assert machine.told[1] >= set(range(0, 300))  # the start, from the first connection


def test_s1_a_failed_next_connection_keeps_what_the_rollover_before_it_told() -> None:
    """GPT-Live with goAways: the first rollover hands over to conn-2 as <u2> is heard by both, and emits the
    old connection's text of it at its close; conn-2's own goAway opens the next rollover in the same instant,
    and its connection fails to open. The controller started afresh forgot the first hand-over, and conn-2's
    caption group of <u2>, closed later, was emitted again."""
    machine = SessionMachine()
    machine.start(GPT_LIVE_LIKE, True, 500)
    machine.caller_holds(70)
    machine.caller_pauses(112)
    machine.caller_talks(3)  # <u1>
    machine.caller_pauses(11)
    machine.provider_goes_away(0, 1_500)
    machine.caller_pauses(19)
    machine.provider_goes_away(1, 1_500)
    machine.caller_pauses(22)
    machine.caller_talks(16)  # <u2>, heard by conn-1 and conn-2
    machine.caller_pauses(24)
    machine.connection_fails_to_open(0)  # conn-3
    machine.teardown()
    assert machine.emitted == {1: 1, 2: 1}


def test_s1_a_rollover_after_a_failed_one_still_knows_the_texts_told_before() -> None:
    """Realtime with goAways: conn-2's text of <u2>, which the first rollover emitted from conn-1, is late; the
    next rollover's connection fails to open, and the one after it (conn-2 to conn-4) began with nothing known
    of the first, so conn-2's late text of <u2> was emitted again."""
    machine = SessionMachine()
    machine.start(REALTIME_LIKE, True, 500)
    machine.caller_talks(3)  # <u1>
    machine.connection_expires(0, 3_000)
    machine.caller_pauses(41)
    machine.provider_goes_away(1, 3_000)
    machine.caller_talks(3)  # <u2>
    machine.caller_holds(10)
    machine.caller_holds(78)
    machine.connection_fails_to_open(0)  # conn-3
    machine.provider_goes_away(0, 1_500)
    machine.teardown()
    assert machine.emitted == {1: 1, 2: 1}


def test_s6_a_mailboxs_recorded_message_then_bye_opens_and_funds_nothing() -> None:
    """AMD leaves a recorded message (3 s) at 4.5 s; the rollover's deadline (6 s) falls while it plays: the
    session is ending (`core.end`), so no next connection is asked for, authorised or approved (S6)."""
    machine = SessionMachine()
    machine.start(REALTIME_LIKE, True, 500, True, "recording")
    machine.callee_answers()
    machine.caller_pauses(200)  # 4 s: the callee's greeting, withheld
    machine.amd_verdict("beep")  # a mailbox whose tone has ended: its message after the application's 500 ms
    machine.caller_pauses(200)
    assert machine.amd is not None and machine.amd.started is not None
    assert (machine.amd.started.action, machine.amd_ended, machine.leg_ended) == ("message", True, True)
    assert not [c for c in machine.conns.values() if c.kind == "rollover"]  # (S6 is checked at each command)


def test_amd_the_models_words_wait_for_the_mailboxs_beep_then_play() -> None:
    """The model speaks while AMD listens (its greeting, as soon as the provider is up): every tick pulls and
    nothing of it leaves (checked at each pull) until the action — talk to a mailbox — starts at its beep."""
    machine = SessionMachine()
    machine.start(REALTIME_LIKE, True, 500, True, "talk")
    machine.callee_answers()
    machine.provider_speaks(0, 20)
    machine.caller_talks(50)  # the mailbox's greeting: withheld from the model, nothing played over it
    machine.amd_verdict("machine")
    machine.caller_pauses(50)  # the route's talk is chosen, the greeting still runs
    assert machine.amd is not None and machine.amd.chosen == "talk" and machine.amd.started is None
    assert machine.playout.ledger.frames_transmitted == 0 and machine.conns[1].frames == 0
    machine.amd_greeting_ends(True)
    machine.caller_pauses(50)
    assert machine.playout.ledger.frames_transmitted >= 20  # the held words, after the beep


@pytest.mark.parametrize("to_provider", [True, False], ids=["route-asks", "route-silent"])
@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_early_media_reaches_the_model_only_when_asked_and_nothing_plays_before_the_answer(
    profile: Profile, to_provider: bool
) -> None:
    """An outbound call rings with an IVR's prompt as early media while the model already speaks its greeting:
    the prompt reaches the connection only when the route asks, starts no caller turn, and the greeting waits
    for the answer (each checked at every frame), then plays."""
    machine = SessionMachine()
    machine.start(profile, True, 500, True, None, False, to_provider)
    machine.provider_speaks(0, 20)
    machine.caller_pauses(20)  # the greeting has reached the core: it waits
    machine.far_end_early_media(50, True)
    machine.far_end_early_media(20, False)
    assert machine.conns[1].frames == (70 if to_provider else 0)
    assert machine.playout.ledger.frames_transmitted == 0
    machine.callee_answers()
    machine.caller_pauses(30)
    assert machine.playout.ledger.frames_transmitted >= 20
    machine.teardown()


def _warm_call_until(machine: WarmTransferMachine, stage: str, replaces_first: int) -> None:
    """A call whose warm transfer begins at 5 s, the target answered; then time passes until the rollover
    (opened by its deadline: the caller on hold music ends no utterance) reaches `stage`."""
    machine.start(REALTIME_LIKE, True, 500, replaces_first, 250)
    machine.transfer_target_goes_on(0)  # answered: the briefing
    for _ in range(200):
        rollover = machine.core.rollover.controller
        if rollover is not None and rollover.stage.value == stage:
            return
        machine.caller_talks_or_waits(1, "waits")
    raise AssertionError(f"the rollover never reached {stage}")


@pytest.mark.parametrize("stage", ["overlap", "draining"])
@pytest.mark.parametrize("replaces_first", [1, 0], ids=["replaces", "relay"])
def test_warm_an_acceptance_during_a_rollover_joins_once_and_funds_nothing_after(
    stage: str, replaces_first: int
) -> None:
    """The human accepts while the rollover's next connection overlaps the old one or the old one drains: the
    transfer joins (by Replaces, or relayed), its outcome is told once, nothing is opened after (S6), no model
    audio reaches the relayed leg, and the machine's invariants hold at every step."""
    machine = WarmTransferMachine()
    _warm_call_until(machine, stage, replaces_first)
    machine.transfer_target_goes_on(4)  # the human keys 1 in the briefing
    if replaces_first:
        machine.transfer_target_goes_on(0)  # the caller's side replaced the bridge's dialog
    machine.warm_the_line_is_held_by_its_holders_only()
    assert machine.warm is not None and machine.warm.result is not None
    assert (machine.warm.result.outcome, machine.warm.result.join) == (
        "accepted",
        "replaces" if replaces_first else "relay",
    )
    assert machine.leg_ended and machine.outcomes == machine.transfers == 1
    machine.caller_talks_or_waits(30, "waits")
    machine.teardown()


def test_warm_an_acceptance_in_the_first_tick_of_a_recovery_joins_once() -> None:
    """The floor is lost and the human accepts in the same instant, a replacement being opened: the join goes
    on, the replacement is opened no further after the call was handed over (S6)."""
    machine = WarmTransferMachine()
    machine.start(REALTIME_LIKE, True, 500, 0, 50)
    machine.transfer_target_goes_on(0)
    machine.amid("drop", "target", 4)
    assert any("stage='reconnecting'" in line for line in machine.log)
    assert machine.warm is not None and machine.warm.result is not None
    assert machine.warm.result.outcome == "accepted" and machine.leg_ended
    machine.caller_talks_or_waits(30, "waits")
    machine.teardown()
