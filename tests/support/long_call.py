"""A long call on virtual time, for "memory flat for weeks": the session engine's in-process pieces
(the coordinator with a real `Playout`, the record builder over its carrier ledger, the server's metrics
observer and console feed) driven through turns, tool calls, rollovers and recoveries, with no sockets and no
sleeps. tests/unit/bridge/test_history_bounds.py asserts that what each piece keeps stays bounded;
tests/bench/history_growth.py measures it with tracemalloc over simulated hours.

One turn (`turn()`, `turn_s` seconds): the caller speaks, every connection hearing them reports speech
start/stop and a final transcript, the floor asks for a tool (answered at once by the "application"), then
says a reply (audio, its transcript, usage) that the media clock transmits. Rollovers come from the
controller's own schedule (`rollover_s`); `recover()` loses the floor connection, opens its replacement and
redelivers the last tool call on it (it must be answered from the ledger, never dispatched again).
"""

from __future__ import annotations

import numpy as np

from bridge.engine.commands import (
    ApproveRollover,
    AuthorizeConnection,
    CloseTransport,
    OpenReplacement,
    OpenRollover,
    SendAudio,
)
from bridge.engine.coordinator import CoordinatorOptions, SessionCoordinator
from bridge.engine.delegations import DeliverResult, DispatchJob
from bridge.engine.rollover import RolloverOptions
from bridge.server.console import ConsoleFeed
from bridge.server.observe import CallObserver
from bridge.server.records import CallInfo, RecordBuilder
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputTranscript,
    ProviderEvent,
    ResponseDone,
    SessionClosed,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    UsageUpdated,
)
from providers.limits import OPENAI_REALTIME
from rtp.audio import PCMU_8K
from rtp.g711 import ulaw_encode
from rtp.playout import Playout
from sip.leg import PlayoutLeg
from tests.support.session_engine import MS, REALTIME, TICK

CALL_ID = "call-long"


def rollover_every(seconds: int) -> RolloverOptions:
    """A schedule that rolls a connection over about every `seconds` (the campaign's --long: 30 s)."""
    s = seconds * 1000
    return RolloverOptions(
        after_ms=s - 3_000,
        deadline_ms=s,
        overlap_ms=1_000,
        hard_stop_ms=s + 2_000,
        cap_ms=s + 4_000,
        drain_ms=2_000,
        transcript_wait_ms=1_000,
    )


def _speech() -> bytes:
    t = np.arange(160) / 8000
    return (8000 * np.sin(2 * np.pi * 300 * t)).astype("<i2").tobytes()


def _reply(ms: int) -> bytes:
    t = np.arange(ms * 8) / 8000
    return ulaw_encode((6000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes())


SPEECH = _speech()
SILENCE = bytes(320)


class LongCall:
    def __init__(self, *, rollover_s: int = 30, turn_s: int = 10, reply_ms: int = 2_000) -> None:
        self.now = 0
        self.playout = Playout()
        self.core = SessionCoordinator(
            limits=OPENAI_REALTIME.for_format(PCMU_8K),
            output_format=PCMU_8K,
            capabilities=REALTIME,
            channel=PlayoutLeg(self.playout),
            now=0,
            options=CoordinatorOptions(rollover=rollover_every(rollover_s)),
        )
        self.builder = RecordBuilder(
            CallInfo(CALL_ID, "sip-long", "sip:a@x", "sip:b@y", "1001", "127.0.0.1", None, "fake"),
            ledger=self.playout.ledger,
            start_ns=0,
            started_at=0.0,
        )
        self.observer = CallObserver()
        self.feed = ConsoleFeed()
        self.turn_ticks, self.reply = turn_s * 1000 // 20, _reply(reply_ms)
        self.open: set[int] = set()
        self.audio: dict[int, int] = {}  # token -> caller frames received since the last tick
        self.speaking: set[int] = set()
        self.turns = 0
        self.calls = 0
        self.dispatched = 0  # jobs the "application" ran (counts only: the driver keeps no history itself)
        self.redispatched = 0  # jobs run for a redelivered call (DL1: must stay 0)
        self.answered_from_ledger = 0  # results given again for a redelivered call
        self.last_call = ""
        self._watch = ""  # the call id being redelivered
        self.rollovers_opened = 0
        self.recoveries = 0
        self.redelivered = 0
        self.utterances = 0
        self._started(1)

    # --- the driver ---

    def _started(self, token: int) -> None:
        self.open.add(token)
        self.event(SessionStarted(token, f"sess_{token}"))

    def event(self, event: ProviderEvent) -> None:
        self.core.provider_event(event, self.now)
        self._carry_out()

    def _carry_out(self) -> None:
        core = self.core
        while commands := core.commands():
            for command in commands:
                if isinstance(command, SendAudio):
                    self.audio[command.token] = self.audio.get(command.token, 0) + 1
                elif isinstance(command, ApproveRollover):
                    core.rollover_approved(command.rollover_id, True, None, self.now)
                elif isinstance(command, AuthorizeConnection):
                    core.connection_authorized(command.connection_id, True, self.now)
                elif isinstance(command, OpenRollover):
                    self.rollovers_opened += 1
                    self._started(command.token)
                elif isinstance(command, OpenReplacement):
                    self._started(command.token)
                elif isinstance(command, CloseTransport):
                    if command.token in self.open:
                        self.open.discard(command.token)
                        core.provider_event(UsageUpdated(command.token, 30.0, 100, 100), self.now)
                        core.provider_event(SessionClosed(command.token, "closed", True), self.now)
                elif isinstance(command, DispatchJob):
                    self.dispatched += 1
                    core.job_answered(command.request.job_id, '{"status": "shipped"}', self.now)
                elif isinstance(command, DeliverResult) and command.call_id == self._watch:
                    self.answered_from_ledger += 1
        for notice in core.notices():
            self.utterances += len(self.builder.notice(notice, self.now))
            self.observer.notice(CALL_ID, notice)
            self.feed.notice(CALL_ID, notice)

    def step(self, speech: bool, count: int = 1) -> None:
        core, playout = self.core, self.playout
        for _ in range(count):
            self.now += TICK
            playout.pull(self.now)
            core.caller_frame(SPEECH if speech else SILENCE, self.now)
            if (deadline := core.next_deadline()) is not None and deadline <= self.now:
                core.handle_timer(self.now)
            if (due := self.builder.next_deadline()) is not None and due <= self.now:
                self.utterances += len(self.builder.handle_timer(self.now))
            self._carry_out()
            item = f"u{self.turns}"
            for token in sorted(self.open):  # each connection's server VAD, on what it was sent
                heard = self.audio.pop(token, 0) > 0
                if heard and speech and token not in self.speaking:
                    self.speaking.add(token)
                    self.event(SpeechStarted(token, None, f"{item}-{token}"))
                elif token in self.speaking and not speech:
                    self.speaking.discard(token)
                    self.event(SpeechStopped(token, None, f"{item}-{token}"))
                    self.event(
                        InputTranscript(token, f"utterance {self.turns}", f"{item}-{token}", final=True)
                    )

    def turn(self) -> None:
        """The caller speaks, the model calls a tool, then replies; silence to the end of the turn."""
        self.turns += 1
        self.step(True, 75)  # 1.5 s of speech
        self.step(False, 20)  # the end of speech is heard
        floor = self.core.token
        self.calls += 1
        self.last_call = f"call_{self.calls}"
        self.event(ToolCallRequested(floor, self.last_call, "lookup_order", '{"order_id": "42"}'))
        self.event(ResponseDone(floor, f"resp_t{self.turns}"))
        self.event(AudioReceived(floor, self.reply, PCMU_8K, f"item_{self.turns}"))
        self.event(OutputTranscript(floor, f"reply {self.turns}", f"item_{self.turns}", final=True))
        self.event(ResponseDone(floor, f"resp_{self.turns}"))
        self.event(UsageUpdated(floor, self.turns * 3.0, self.turns * 50, self.turns * 50))
        self.step(False, self.turn_ticks - 95)

    def recover(self) -> None:
        """The floor connection is lost; its replacement opens; the model redelivers its last tool call."""
        old = self.core.token
        self.recoveries += 1
        self.open.discard(old)
        self.speaking.discard(old)
        self.event(SessionClosed(old, "connection_lost", False))
        new = self.core.token
        if new != old and self.last_call:
            self.redelivered += 1
            self.redeliver(new, self.last_call)

    def redeliver(self, token: int, call_id: str) -> None:
        """The model asks again for a call it made before (DL1): answered from the ledger, never run again."""
        dispatched, self._watch = self.dispatched, call_id
        self.event(ToolCallRequested(token, call_id, "lookup_order", '{"order_id": "42"}'))
        self.redispatched += self.dispatched - dispatched
        self._watch = ""

    def run(self, minutes: float, *, recover_every: int = 37) -> None:
        """Turns for `minutes` of simulated call, a recovery every `recover_every` turns."""
        end = self.now + int(minutes * 60_000) * MS
        while self.now < end:
            self.turn()
            if self.turns % recover_every == 0:
                self.recover()
