"""Telephony tools (DL6): what the model may do to the call itself, offered only when enabled.

- `end_call`: the model says a short goodbye, then the bridge sends BYE (once the goodbye has been played, or
  after `goodbye_timeout_ms` at most).
- `transfer_call`: a blind transfer by SIP REFER to one of the configured targets; the model is told the
  outcome the transferee reported by NOTIFY (answered, busy, refused...). After a successful transfer the
  bridge leaves the call. With `warm` set, the tool takes `mode` ("cold", the default, or "warm") and an optional
  `brief`: a warm transfer (bridge/engine/warm_transfer.py) holds the caller, dials and briefs the human, and
  joins the legs on acceptance; the model is told the typed outcome (`outcome`, `status`) when it is decided.
  One transfer at a time per call, whoever asked (the model's tool or the application's `LiveCall.transfer`),
  as RFC 3515 implementations keep one REFER at a time per dialog: a leg's `TransferProgress` events do not
  say which REFER they answer, so the final one belongs to the one transfer in progress. A second one is
  refused where it is asked: the model's tool gets `transferred: false` with the error, the application a
  `TransferInProgress`, and nothing is sent.
- `send_dtmf`: RFC 4733 digits to the caller's side (an IVR behind the caller, a conference PIN).
- `pause_recording` / `resume_recording` (`recording_tools`): the call's recording (bridge/server/recording.py);
  the model is told whether it changed anything.
- `collect_card` (`card`: its shape, bridge/engine/card.py): the bridge collects the digits the caller keys in;
  the model is told the outcome only, the application gets the digits.

The caller's own key presses reach the application, and, with `dtmf_to_model`, the model as silent context.
These tools never go to the application's handler: `TelephonyTools` decides, the shell carries the leg
commands out.

`CallEnding` is the one mechanism for "let the caller hear the goodbye, then BYE", whoever ends the call: the
model's end_call (its own goodbye, once played), a failed session or a refused rollover (the closing message,
then BYE), and the windows after the call: a caller BYE waits `close_ms` for the provider's final usage, a
BYE the bridge sent waits `drain_ms` for the leg to end. All of them are core deadlines, never sleeps.
A goodbye asked with a reason of its own (the no-input timeout, the route's budget, the time limit, the drain,
an answering machine's message) is the bridge's policy ending the call, not the model's choice: once it has
ended the session, `CallEnding.by_bridge` says so, and the call record's `ended_by` is "bridge" (the reason
says which); the model's end_call, a failed session and the provider's close stay "provider".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from bridge.engine.card import CardOptions
from bridge.engine.commands import (
    CollectCard,
    EndSession,
    HangUp,
    Outbox,
    RecordingTool,
    RequestClose,
    SendDtmf,
    TransferCall,
    WarmTransferCall,
)
from bridge.engine.delegations import Delegations, DispatchJob, JobRequest
from bridge.engine.reservoir import TICK_NS, OutputPath
from bridge.engine.warm_transfer import ACCEPTED, WarmOptions
from providers.base import ToolSpec
from rtp.units import NS_PER_MS
from sip.core.telephony import DTMF_DIGITS, MAX_DTMF_DIGITS

END_CALL = "end_call"
TRANSFER_CALL = "transfer_call"
SEND_DTMF = "send_dtmf"
PAUSE_RECORDING = "pause_recording"
RESUME_RECORDING = "resume_recording"
COLLECT_CARD = "collect_card"


@dataclass(frozen=True, slots=True)
class TelephonyOptions:
    end_call: bool = False
    transfer_targets: dict[str, str] = field(default_factory=dict)  # name the model uses -> SIP URI
    send_dtmf: bool = False
    dtmf_to_model: bool = False
    goodbye_timeout_ms: int = 10_000
    close_ms: int = 2_000  # after the caller's BYE, how long the provider's final usage is waited for
    drain_ms: int = 5_000  # after the bridge's BYE, how long the leg's end is waited for
    recording_tools: bool = False  # pause_recording and resume_recording
    card: CardOptions | None = None  # collect_card, with this shape
    warm: WarmOptions | None = None  # transfer_call may be warm (bridge/engine/warm_transfer.py)

    @property
    def names(self) -> frozenset[str]:
        enabled = {
            END_CALL: self.end_call,
            TRANSFER_CALL: bool(self.transfer_targets),
            SEND_DTMF: self.send_dtmf,
            PAUSE_RECORDING: self.recording_tools,
            RESUME_RECORDING: self.recording_tools,
            COLLECT_CARD: self.card is not None,
        }
        return frozenset(name for name, on in enabled.items() if on)


def tool_specs(options: TelephonyOptions) -> tuple[ToolSpec, ...]:
    """The function declarations offered to the model for the enabled tools."""
    specs = []
    if options.end_call:
        specs.append(
            ToolSpec(
                END_CALL,
                "End the phone call. Say a short goodbye first; the line is closed when "
                "you have finished speaking.",
                {"type": "object", "properties": {}},
            )
        )
    if options.transfer_targets:
        names = sorted(options.transfer_targets)
        properties: dict[str, object] = {"destination": {"type": "string", "enum": names}}
        what = "Transfer the caller to a person or department. You will be told whether the transfer was answered."
        if options.warm is not None:
            properties["mode"] = {"type": "string", "enum": ["cold", "warm"]}
            properties["brief"] = {"type": "string"}
            what += (
                " mode warm: the caller waits on hold while a colleague is called and briefed (brief: what to "
                "tell them; a summary of the call when empty); if they decline, the caller is back with you."
            )
        specs.append(
            ToolSpec(
                TRANSFER_CALL,
                what,
                {"type": "object", "properties": properties, "required": ["destination"]},
            )
        )
    if options.send_dtmf:
        specs.append(
            ToolSpec(
                SEND_DTMF,
                "Send touch-tone digits on the line (0-9, *, #).",
                {"type": "object", "properties": {"digits": {"type": "string"}}, "required": ["digits"]},
            )
        )
    if options.recording_tools:
        for name, what in ((PAUSE_RECORDING, "Pause"), (RESUME_RECORDING, "Resume")):
            specs.append(
                ToolSpec(name, f"{what} the call's recording.", {"type": "object", "properties": {}})
            )
    if options.card is not None:
        specs.append(
            ToolSpec(
                COLLECT_CARD,
                "Collect a payment card number the caller keys in on their keypad. Ask them to key it in, "
                "then the hash key, before you call this. You never hear or see the digits: you are told "
                "only the outcome (collected, timeout, invalid, cancelled). Never ask the caller to say it.",
                {"type": "object", "properties": {}},
            )
        )
    return tuple(specs)


def argument(arguments: str, name: str) -> str | None:
    """One string argument of a tool call, or None when absent or unparsable."""
    try:
        value = json.loads(arguments or "{}").get(name)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def transfer_target(options: TelephonyOptions, arguments: str) -> tuple[str, str] | None:
    """(destination name, SIP URI) the model asked for; the only target when it named none."""
    destination = argument(arguments, "destination")
    if destination in options.transfer_targets:
        return destination, options.transfer_targets[destination]
    if destination is None and len(options.transfer_targets) == 1:
        return next(iter(options.transfer_targets.items()))
    return None


def untransferred(outcome: str, status: int, reason: str) -> str:
    """What the model is told when the application's warm transfer was undone (its own tool's: the answer)."""
    sip = f" (SIP {status})" if status else ""
    return (
        f"The warm transfer did not go through: {outcome}{sip}, {reason}. The caller is back with you and "
        "heard hold music meanwhile; tell them and go on helping."
    )


class TransferInProgress(RuntimeError):
    """`LiveCall.transfer` while another transfer of the call (the model's or the application's) awaits its
    final outcome: nothing was sent (one REFER at a time per dialog)."""


def result(**fields: object) -> str:
    return json.dumps(fields)


END_CALL_REASON = "the model ended the call (end_call)"
END_CALL_NOTE = "Say a short goodbye now; the call ends when you finish."
TIME_LIMIT_NOTE = (
    "This call has reached its time limit. Tell the caller so and say a short goodbye now; the call ends "
    "when you finish."
)


def time_limit_grace_s(options: TelephonyOptions) -> float:
    """How long the engine waits for the goodbye's BYE before sending its own: the goodbye timeout and 2 s."""
    return options.goodbye_timeout_ms / 1000 + 2.0


class TelephonyTools:
    """DL6 decisions: which jobs are telephony tools, what each one does to the call, and its answer to the
    model through the job ledger."""

    def __init__(
        self, out: Outbox, options: TelephonyOptions, delegations: Delegations, ending: CallEnding
    ) -> None:
        self._out = out
        self.options = options
        self._delegations = delegations
        self._ending = ending
        self._transfer_job: str | None = None  # the transfer_call job waiting for the transferee's answer
        self._application_transfer = False  # LiveCall.transfer's REFER waits for its final outcome

    @property
    def transferring(self) -> bool:
        """A transfer (the model's or the application's) waits for its final outcome."""
        return self._transfer_job is not None or self._application_transfer

    def application_transfer(self) -> None:
        """The application's REFER was sent (the shell checked `transferring` first): its final outcome is its
        own, never the answer to a transfer_call job."""
        self._application_transfer = True

    def handles(self, request: JobRequest) -> bool:
        return request.name in self.options.names

    def route(self, token: int, at_ms: int, now: int) -> None:
        """The job ledger's commands: telephony jobs are carried out here (DL6), the rest go to the shell."""
        while commands := self._delegations.commands():
            for command in commands:
                if isinstance(command, DispatchJob) and self.handles(command.request):
                    self.requested(command.request, token, at_ms, now)
                else:
                    self._out.commands.append(command)

    def requested(self, request: JobRequest, token: int, at_ms: int, now: int) -> None:
        """Carry a telephony job out, on the leg; its answer goes to the model now or when the leg reports."""
        answer = self._decide(request, now)
        if answer is not None:
            self._delegations.job_answered(request.job_id, answer, token, at_ms)

    def _decide(self, request: JobRequest, now: int) -> str | None:
        if request.name == END_CALL:
            self._ending.end_after_goodbye(now)
            return result(ok=True, note=END_CALL_NOTE)
        if request.name == TRANSFER_CALL:
            target = transfer_target(self.options, request.arguments)
            if target is None or self.transferring:
                why = "a transfer is already in progress" if target else "unknown destination"
                return result(transferred=False, error=why)
            self._transfer_job = request.job_id
            if self.options.warm is not None and argument(request.arguments, "mode") == "warm":
                brief = argument(request.arguments, "brief")
                self._out.commands.append(WarmTransferCall(target[1], brief or None, request.job_id))
            else:
                self._out.commands.append(TransferCall(target[1]))
            return None  # answered when the transferee's (or the warm transfer's) final status arrives
        if request.name in (PAUSE_RECORDING, RESUME_RECORDING):
            self._out.commands.append(RecordingTool(request.name == PAUSE_RECORDING, request.job_id))
            return None  # answered by the shell, which holds the recording
        if request.name == COLLECT_CARD:
            self._out.commands.append(CollectCard(request.job_id))
            return None  # answered by the shell when the collection ends: its outcome only
        digits = argument(request.arguments, "digits") or ""
        if not 0 < len(digits) <= MAX_DTMF_DIGITS or set(digits) - DTMF_DIGITS:
            return result(sent="", error=f"not DTMF digits: {digits!r}")
        self._out.commands.append(SendDtmf(digits, request.job_id))
        return result(sent=digits)

    def transfer_progress(
        self, status: int, reason: str, final: bool, token: int, at_ms: int, outcome: str = ""
    ) -> None:
        """The transferee's answer, for the model once it is final (the application's transfer: for nobody
        here, the shell logs it). `outcome`: a warm transfer's typed reason (bridge/engine/warm_transfer.py),
        its status the one the target leg gave."""
        if final and self._application_transfer:
            self._application_transfer = False
            if outcome and outcome != ACCEPTED:  # the caller is back with the model, who is told why
                self._delegations.push_update(untransferred(outcome, status, reason), True, token)
        elif final and self._transfer_job is not None:
            job, self._transfer_job = self._transfer_job, None
            if outcome:
                output = result(
                    transferred=outcome == "accepted",
                    mode="warm",
                    outcome=outcome,
                    status=status,
                    reason=reason,
                )
            else:
                output = result(transferred=200 <= status < 300, status=status, reason=reason)
            self._delegations.job_answered(job, output, token, at_ms)

    def caller_pressed(self, digit: str, token: int) -> None:
        """The caller's key, as silent context for the model when enabled."""
        if self.options.dtmf_to_model:
            self._delegations.push_update(
                f"The caller pressed the key {digit} on their keypad.", False, token
            )


class CallEnding:
    """The end of the call as core deadlines: the goodbye, the closing message, BYE, the close windows."""

    def __init__(
        self, out: Outbox, output: OutputPath, options: TelephonyOptions, closing_message: bytes
    ) -> None:
        self._out = out
        self._output = output
        self._options = options
        self._message = closing_message
        self.ended = False  # the session is over (EndSession was given)
        self.leg_ended = False
        self._goodbye: tuple[int, int] | None = None  # end_call: (next check, give up at), ns
        self._goodbye_spoken = False
        self._goodbye_reason = END_CALL_REASON
        self.by_bridge = False  # the session was ended by a goodbye the bridge's policy asked for
        self._hangup: tuple[int, str] | None = None  # BYE once the closing message has played: (at, reason)
        self._close_due: int | None = None
        self._drain_due: int | None = None

    def end_after_goodbye(self, now: int, reason: str = "", within_ms: int | None = None) -> None:
        """DL6 end_call: once the model's goodbye has been played — or after the timeout if it says nothing — the
        session ends and the call is hung up (`reason`: why, when it is not the model's end_call: a drain;
        `within_ms`: another timeout, e.g. for a voicemail message longer than a goodbye)."""
        if self._goodbye is None and not self.ended:
            self._goodbye_reason = reason or END_CALL_REASON
            timeout_ms = self._options.goodbye_timeout_ms if within_ms is None else within_ms
            self._goodbye = (now + TICK_NS, now + timeout_ms * NS_PER_MS)
            self._goodbye_spoken = False

    @property
    def goodbye_due(self) -> bool:
        """A goodbye is under way: the call ends once it has been played (or timed out)."""
        return self._goodbye is not None

    def assistant_audio(self) -> None:
        if self._goodbye is not None:
            self._goodbye_spoken = True

    def end(
        self,
        reason: str,
        now: int,
        *,
        failed: bool = False,
        goodbye: bool = False,
        message: bytes | None = None,
    ) -> bool:
        """The session ends; the caller hears a short message first when it failed or a goodbye is due — never
        a silent line that just drops (`message`: that one instead of the closing message, e.g. a voicemail
        message). False when it had already ended."""
        if self.ended:
            return False
        self.ended = True
        self._goodbye = None
        self._out.commands.append(EndSession(reason, failed, goodbye))
        if self.leg_ended:
            return True
        if failed or goodbye:  # HR5 (a failed repair), RO6 (a refused rollover): a clean goodbye, then BYE
            ms = self._output.play_final_message(self._message if message is None else message)
            self._hangup = (now + (ms + 100) * NS_PER_MS, reason)
        else:
            self._hang_up(reason, now)
        return True

    def _hang_up(self, reason: str, now: int) -> None:
        self._hangup = None
        self._out.commands.append(HangUp(reason))
        self._drain_due = now + self._options.drain_ms * NS_PER_MS

    def call_ended(self, floor: int, now: int, *, reconnecting: bool) -> None:
        """The call leg is gone: ask the provider for its final usage (HR12), within `close_ms`."""
        self.leg_ended = True
        self._hangup = self._goodbye = None
        if not self.ended and not reconnecting:
            self._out.commands.append(RequestClose(floor))
            self._close_due = now + self._options.close_ms * NS_PER_MS
        else:
            self._close_due = (
                now  # (while reconnecting there is no session whose final usage could be waited for)
            )

    def finished(self, now: int) -> bool:
        """Nothing is left to wait for: the shell may stop."""
        if self.leg_ended:
            return self.ended or (self._close_due is not None and now >= self._close_due)
        return self._drain_due is not None and now >= self._drain_due

    def handle_timer(self, now: int) -> str | None:
        """Returns the reason to end the session when the model's goodbye has been played (or timed out)."""
        if self._hangup is not None and now >= self._hangup[0]:
            self._hang_up(self._hangup[1], now)
        if self._goodbye is not None and now >= self._goodbye[0]:
            played = self._goodbye_spoken and self._output.drained(now)
            if played or now >= self._goodbye[1]:
                self._goodbye = None
                self.by_bridge = self._goodbye_reason != END_CALL_REASON  # the session ends with it (`end`)
                return self._goodbye_reason
            self._goodbye = (now + TICK_NS, self._goodbye[1])
        return None

    def next_deadline(self) -> int | None:
        due = self._close_due
        for t in (self._goodbye[0] if self._goodbye else None, self._hangup[0] if self._hangup else None):
            if t is not None and (due is None or t < due):
                due = t
        drain = self._drain_due
        return drain if due is None or (drain is not None and drain < due) else due
