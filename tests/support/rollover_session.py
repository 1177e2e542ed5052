"""Harness moved unchanged from tests/unit/bridge/test_rollover_session.py: CLIENT_CAPS, ClientCommitCall, RolloverCall, SCALED."""

from __future__ import annotations

from bridge.engine.coordinator import (
    ApproveRollover,
    AuthorizeConnection,
    CloseTransport,
    CommitInput,
    CoordinatorOptions,
    OpenRollover,
    SendAudio,
    SessionCoordinator,
)
from bridge.engine.rollover import RolloverOptions
from providers.base import Capabilities, SessionSettings
from providers.events import (
    InputTranscript,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
)
from providers.limits import OPENAI_REALTIME
from rtp.audio import PCMU_8K
from rtp.playout import Playout
from sip.leg import PlayoutLeg
from tests.support.session_engine import REALTIME, TICK, speech_frame

SCALED = RolloverOptions(
    after_ms=4_000,
    deadline_ms=6_000,
    overlap_ms=500,
    hard_stop_ms=7_000,
    cap_ms=8_000,
    drain_ms=1_000,
    transcript_wait_ms=1_000,
)


class RolloverCall:
    """A coordinator with rollover on, a virtual media clock, and a provider per connection whose server VAD
    follows the caller's speech (each connection hears only what it was sent)."""

    def __init__(self, rollover: RolloverOptions = SCALED, capabilities: Capabilities = REALTIME) -> None:
        self.now = 0
        self.playout = Playout()
        self.core = SessionCoordinator(
            limits=OPENAI_REALTIME.for_format(PCMU_8K),
            output_format=PCMU_8K,
            capabilities=capabilities,
            channel=PlayoutLeg(self.playout),
            now=0,
            options=CoordinatorOptions(rollover=rollover),
        )
        self.core.provider_event(SessionStarted(1, "sess_1"), 0)
        self.commands: list[object] = []
        self.notices: list[object] = []
        self.audio: dict[int, int] = {}  # token -> caller frames it received
        self.speaking: dict[int, bool] = {}
        self.utterance = 0
        self.open: set[int] = {1}
        self._seen: dict[int, int] = {}  # token -> caller frames it had received at the previous tick

    def step(self, speech: bool, count: int = 1) -> None:
        for _ in range(count):
            self.now += TICK
            self.playout.pull(self.now)
            self.core.caller_frame(speech_frame() if speech else bytes(320), self.now)
            if (deadline := self.core.next_deadline()) is not None and deadline <= self.now:
                self.core.handle_timer(self.now)
            self._carry_out()
            for token in sorted(self.open):  # each connection's server VAD, on what it received this tick
                heard = self.audio.get(token, 0) != self._seen.get(token, 0)
                self._seen[token] = self.audio.get(token, 0)
                if heard and speech and not self.speaking.get(token):
                    self.speaking[token] = True
                    self.core.provider_event(
                        SpeechStarted(token, None, f"u{token}-{self.utterance}"), self.now
                    )
                elif self.speaking.get(token) and not speech:
                    self.speaking[token] = False
                    self.core.provider_event(
                        SpeechStopped(token, None, f"u{token}-{self.utterance}"), self.now
                    )
                    self.core.provider_event(
                        InputTranscript(
                            token, f"utterance {self.utterance}", f"u{token}-{self.utterance}", final=True
                        ),
                        self.now,
                    )
                self._carry_out()

    def _carry_out(self) -> None:
        for command in self.core.commands():
            if isinstance(command, SendAudio):
                self.audio[command.token] = self.audio.get(command.token, 0) + 1
                continue
            self.commands.append(command)
            if isinstance(command, ApproveRollover):
                self.core.rollover_approved(command.rollover_id, True, None, self.now)
            elif isinstance(command, AuthorizeConnection):
                self.core.connection_authorized(command.connection_id, True, self.now)
            elif isinstance(command, OpenRollover):
                self.open.add(command.token)
                self.core.provider_event(SessionStarted(command.token, f"sess_{command.token}"), self.now)
            elif isinstance(command, CloseTransport):
                self.open.discard(command.token)
        self.notices += self.core.notices()

    def turn(self, talk_ms: int = 1_500, pause_ms: int = 1_000) -> None:
        self.utterance += 1
        self.step(True, talk_ms // 20)
        self.step(False, pause_ms // 20)

    def talk_until_a_rollover_opens(self) -> OpenRollover:
        """Short turns (at most ten) until the next connection is opened; that one command."""
        for _ in range(10):
            self.turn(talk_ms=1_000, pause_ms=200)
            if any(isinstance(c, OpenRollover) for c in self.commands):
                break
        [opening] = [c for c in self.commands if isinstance(c, OpenRollover)]
        return opening


CLIENT_CAPS = Capabilities(
    server_vad=True, speech_end_events=True, timed_captions=True, truncate=True, client_commits=True
)


class ClientCommitCall:
    """Turn detection off: the bridge's own VAD ends each caller turn, the session commits it and flushes the
    rollover controller; each connection transcribes what it was committed."""

    def __init__(self, options: RolloverOptions = SCALED) -> None:
        self.now = 0
        self.playout = Playout()
        self.core = SessionCoordinator(
            limits=OPENAI_REALTIME.for_format(PCMU_8K),
            output_format=PCMU_8K,
            capabilities=CLIENT_CAPS,
            channel=PlayoutLeg(self.playout),
            now=0,
            options=CoordinatorOptions(rollover=options),
            settings=SessionSettings(turn_detection="client"),
        )
        self.core.provider_event(SessionStarted(1, "sess_1"), 0)
        self.commands: list[object] = []
        self.notices: list[object] = []
        self.receiving: list[tuple[int, ...]] = []  # per caller frame: the tokens it was sent to
        self.frame_times: list[int] = []
        self.commit_times: dict[int, list[int]] = {}  # token -> when it was committed
        self.heard: dict[int, int] = {}  # token -> caller frames since its last commit
        self.utterance = 0

    def step(self, speech: bool, count: int = 1) -> None:
        for _ in range(count):
            self.now += TICK
            self.playout.pull(self.now)
            self.core.caller_frame(speech_frame() if speech else bytes(320), self.now)
            if (deadline := self.core.next_deadline()) is not None and deadline <= self.now:
                self.core.handle_timer(self.now)
            self._carry_out()

    def _carry_out(self) -> None:
        sent: list[int] = []
        while commands := self.core.commands():
            self._answer(commands, sent)
        if sent:
            self.receiving.append(tuple(sent))
            self.frame_times.append(self.now)
        self.notices += self.core.notices()

    def _answer(self, commands: list[object], sent: list[int]) -> None:
        for command in commands:
            if isinstance(command, SendAudio):
                sent.append(command.token)
                self.heard[command.token] = self.heard.get(command.token, 0) + 1
                continue
            self.commands.append(command)
            if isinstance(command, ApproveRollover):
                self.core.rollover_approved(command.rollover_id, True, None, self.now)
            elif isinstance(command, AuthorizeConnection):
                self.core.connection_authorized(command.connection_id, True, self.now)
            elif isinstance(command, OpenRollover):
                self.core.provider_event(SessionStarted(command.token, f"sess_{command.token}"), self.now)
            if isinstance(command, CommitInput):
                self.commit_times.setdefault(command.token, []).append(self.now)
            if isinstance(command, CommitInput) and self.heard.pop(command.token, 0) > 10:
                self.core.provider_event(
                    InputTranscript(
                        command.token,
                        f"utterance {self.utterance}",
                        f"u{command.token}-{self.utterance}",
                        final=True,
                    ),
                    self.now,
                )

    def turn(self, talk_ms: int = 1_000, pause_ms: int = 600) -> None:
        self.utterance += 1
        self.step(True, talk_ms // 20)
        self.step(False, pause_ms // 20)
