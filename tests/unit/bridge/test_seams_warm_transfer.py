"""A warm transfer meeting the session's other mechanisms, on virtual time: the coordinator driven as in
tests/support/session_engine.py, the transfer's state machine (bridge/engine/warm_transfer.py) beside it, its
caller-side actions carried out by `caller_side` as the shell does."""

from __future__ import annotations

import json

from bridge.engine.commands import (
    CancelResponse,
    EndSession,
    SendAudio,
    TransferCall,
    WarmTransferCall,
)
from bridge.engine.delegations import DeliverResult, SendContext
from bridge.engine.telephony import TelephonyOptions
from bridge.engine.warm_transfer import (
    ACCEPTED,
    CALLER_HUNG_UP,
    REFUSED,
    CallerHungUp,
    DropTarget,
    JoinLegs,
    Outcome,
    ReleaseCaller,
    TargetDigit,
    TargetProgress,
    WarmAction,
    WarmEvent,
    WarmOptions,
    WarmTransfer,
    caller_side,
)
from providers.events import (
    AudioReceived,
    SessionClosed,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
)
from rtp.audio import PCMU_8K
from tests.support.recovery import commands_of, recovery_notices
from tests.support.session_engine import Call, pcmu_tone, speech_frame

TARGETS = TelephonyOptions(transfer_targets={"sales": "sip:sales@pbx.example"}, warm=WarmOptions())


class WarmCall(Call):
    """A call whose caller audio sent to the provider is counted (`to_provider`)."""

    def __init__(self, **options: object) -> None:
        self.to_provider = 0
        super().__init__(telephony=TARGETS, **options)

    def _drain(self) -> None:
        self.notices += self.core.notices()
        for command in self.core.commands():
            if isinstance(command, SendAudio):
                self.to_provider += 1
            else:
                self.commands.append(command)

    def start(self, transfer: WarmTransfer) -> list[WarmAction]:
        actions = caller_side(self.core, transfer.start(), self.now)
        self._drain()
        return actions

    def warm(self, transfer: WarmTransfer, event: WarmEvent) -> list[WarmAction]:
        actions = caller_side(self.core, transfer.handle(event, self.now), self.now)
        self._drain()
        return actions


def application_transfer(call: WarmCall) -> WarmTransfer:
    call.core.telephony.application_transfer()  # the shell's LiveCall.transfer checks and marks it
    transfer = WarmTransfer("sip:sales@pbx.example", "brief", call.now, WarmOptions())
    call.start(transfer)
    return transfer


def test_while_the_caller_waits_the_provider_hears_nothing_and_the_model_is_not_heard() -> None:
    call = WarmCall()
    call.provider(AudioReceived(1, pcmu_tone(1_500), PCMU_8K, "item_a"))
    call.tick(count=10)
    transfer = application_transfer(call)
    assert call.core.status(call.now)["line"] == "held"
    assert commands_of(call, CancelResponse) == [CancelResponse(1)]  # the model stops at what was heard
    sent, forwarded = len(call.sent), call.to_provider
    call.tick(speech_frame(), count=50)  # the caller talks over the hold music: no barge-in reaches anyone
    call.provider(AudioReceived(1, pcmu_tone(500), PCMU_8K, "item_b"))
    call.tick(count=50)
    assert call.to_provider == forwarded and len(call.sent) == sent
    call.warm(transfer, TargetProgress(486, "Busy Here"))
    assert call.core.status(call.now)["line"] == "up"
    [told] = commands_of(call, SendContext)  # the application's transfer: the model is told why, to speak
    assert "busy (SIP 486)" in told.text and told.speak
    call.tick(speech_frame(), count=5)
    assert call.to_provider > forwarded  # the caller is back with the model
    assert not call.core.telephony.transferring


def test_the_caller_resuming_their_own_hold_during_the_transfer_still_does_not_reach_the_model() -> None:
    call = WarmCall()
    call.core.hold(call.now)  # the caller's phone holds first
    transfer = application_transfer(call)
    call.core.resume(call.now)  # and takes it off hold while the transfer goes on
    forwarded = call.to_provider
    call.tick(speech_frame(), count=20)
    assert call.to_provider == forwarded and call.core.status(call.now)["line"] == "held"
    actions = call.warm(transfer, TargetProgress(603, "Decline"))
    assert ReleaseCaller() in actions and call.core.status(call.now)["line"] == "up"


def test_the_model_s_warm_transfer_is_answered_once_with_the_typed_outcome_and_a_second_is_refused() -> None:
    call = WarmCall()
    args = {"destination": "sales", "mode": "warm", "brief": "wants a refund"}
    call.provider(ToolCallRequested(1, "call_1", "transfer_call", json.dumps(args)))
    [warm] = commands_of(call, WarmTransferCall)
    assert warm.target == "sip:sales@pbx.example" and warm.brief == "wants a refund"
    transfer = WarmTransfer(warm.target, warm.brief or "", call.now, WarmOptions())
    call.start(transfer)
    call.provider(ToolCallRequested(1, "call_2", "transfer_call", '{"destination": "sales"}'))
    assert commands_of(call, TransferCall) == []  # one transfer at a time, cold or warm
    call.warm(transfer, TargetProgress(200))
    assert commands_of(call, DeliverResult) == []  # the answers wait: the caller is on hold music
    actions = call.warm(transfer, TargetDigit("2"))
    assert [a.result.outcome for a in actions if isinstance(a, Outcome)] == [REFUSED]
    answers = {d.call_id: json.loads(d.output) for d in commands_of(call, DeliverResult)}
    assert answers["call_2"] == {"transferred": False, "error": "a transfer is already in progress"}
    assert answers["call_1"] == {
        "transferred": False,
        "mode": "warm",
        "outcome": REFUSED,
        "status": 200,
        "reason": "the target refused (keyed)",
    }
    assert commands_of(call, SendContext) == []  # the model's own transfer: told by its answer only
    assert not call.core.telephony.transferring


def test_once_joined_the_model_is_never_heard_again_and_the_transfer_is_over() -> None:
    call = WarmCall()
    transfer = application_transfer(call)
    call.warm(transfer, TargetProgress(200))
    actions = call.warm(transfer, TargetDigit("1"))
    assert JoinLegs() in actions and [a.result.outcome for a in actions if isinstance(a, Outcome)] == [
        ACCEPTED
    ]
    assert ReleaseCaller() not in actions and call.core.status(call.now)["line"] == "held"
    sent = len(call.sent)
    call.provider(AudioReceived(1, pcmu_tone(500), PCMU_8K, "item_b"))
    call.tick(count=40)
    assert len(call.sent) == sent and commands_of(call, SendContext) == []
    assert not call.core.telephony.transferring


def test_a_cold_transfer_is_the_default_mode() -> None:
    call = WarmCall()
    call.provider(ToolCallRequested(1, "call_1", "transfer_call", '{"destination": "sales"}'))
    assert commands_of(call, TransferCall) == [TransferCall("sip:sales@pbx.example")]
    assert commands_of(call, WarmTransferCall) == []


def test_a_recovery_under_way_goes_on_during_the_transfer_and_completes_after_the_caller_is_back() -> None:
    call = WarmCall()
    call.provider(SessionClosed(1, "connection lost", False))
    transfer = application_transfer(call)
    call.advance(1_000)
    call.provider(SessionStarted(2, "sess_2", None))
    call.advance(20_000)  # the replacement is up while the caller waits on hold music
    assert recovery_notices(call) == ["reconnecting", "awaiting_user"] and not call.core.ending.ended
    call.warm(transfer, TargetProgress(180))
    call.advance(30_000)
    call.warm(transfer, TargetProgress(0, "no route"))  # let the ring timeout or a failure undo it
    call.provider(SpeechStarted(2, 100))
    call.provider(SpeechStopped(2, 900))
    assert recovery_notices(call) == ["reconnecting", "awaiting_user", "done"]


def test_the_caller_hanging_up_during_the_transfer_ends_the_target_leg_and_opens_nothing() -> None:
    call = WarmCall()
    transfer = application_transfer(call)
    call.warm(transfer, TargetProgress(200))
    call.core.call_ended(call.now)
    actions = call.warm(transfer, CallerHungUp())
    assert actions[0] == DropTarget(True, "the caller hung up first") and ReleaseCaller() not in actions
    assert [a.result.outcome for a in actions if isinstance(a, Outcome)] == [CALLER_HUNG_UP]
    call.advance(5_000)
    assert call.core.finished(call.now)
    assert [c for c in call.commands if isinstance(c, SendContext)] == []  # nobody to tell
    assert all(not isinstance(c, EndSession) or not c.failed for c in call.commands)
