"""The outcome of a blind transfer (RFC 3515 REFER), as `CallLeg.transfer` promises it: sans-I/O.

One `TransferTracker` per call. The engine tells it what happened (a transfer asked for, the ACK arrived,
the REFER could not be sent, the REFER's response, each NOTIFY's sipfrag, the subscription ended, the call
ended) with `now` (int monotonic ns), and carries out what it returns, in order:
- `TransferProgress`: post it to the leg's events;
- `SendRefer`: send the REFER with Refer-To `target` and the application's `headers` now (if that fails:
  `refer_failed`);
- `EndTransferredCall`: the transferee reached the target; hang up (BYE) with `reason`, status 200.
`next_deadline()` and `handle_timer(now)` keep the transfer timeout: no report (REFER response or NOTIFY)
for `timeout_ns` ends the transfer with a final 408, and the call stays up.

The rules (sip/leg.py, `CallLeg.transfer`): exactly one final `TransferProgress` per `start`, always before
the call ends; 491 while another transfer of the call is in progress (including one that timed out but whose
subscription may still report: the engine cannot tell which REFER a late report belongs to); 500 when the
REFER is not sent or the subscription ends without a final NOTIFY; 487 when the call ends first; a 2xx
outcome, even a late one after the 408, ends the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sip.leg import TransferProgress

DEFAULT_TRANSFER_TIMEOUT_NS = 30_000_000_000  # 30 s: just under a REFER's own UDP Timer F (64·T1 = 32 s)


class DialogStage(Enum):
    """Where the INVITE dialog is when a transfer is asked for."""

    NOT_ANSWERED = "not answered"  # no 2xx sent yet: there is no dialog to send a REFER in
    AWAITING_ACK = "awaiting ack"  # 2xx sent, ACK not in: a REFER now would cross it, so it waits
    CONFIRMED = "confirmed"


@dataclass(frozen=True, slots=True)
class SendRefer:
    """Send the REFER (Refer-To `target`, then the application's `headers`, sip.core.app_headers) in the call's
    dialog now."""

    target: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class EndTransferredCall:
    """The transfer succeeded: hang up the call (BYE, status 200) with this reason."""

    target: str
    reason: str


TransferOutput = TransferProgress | SendRefer | EndTransferredCall


class TransferTracker:
    """At most one transfer per call, from `start` to its one final report."""

    def __init__(self, timeout_ns: int = DEFAULT_TRANSFER_TIMEOUT_NS) -> None:
        if timeout_ns <= 0:
            raise ValueError(f"transfer timeout must be positive, got {timeout_ns} ns")
        self.timeout_ns = timeout_ns
        self._target: str | None = None  # the transfer in progress
        self._headers: tuple[tuple[str, str], ...] = ()  # the application's, on its REFER
        self._deferred = False  # its REFER waits for the ACK
        self._deadline: int | None = None
        self._expired: str | None = None  # timed out (408 reported), REFER sent: a late report may still come

    @property
    def target(self) -> str | None:
        """The transfer in progress, if any."""
        return self._target

    @property
    def pending(self) -> bool:
        """An outcome is still awaited: a transfer in progress, or one that timed out after its REFER was sent.
        An engine whose subscription reports can be declined (pjsua's `cont`) keeps listening while true."""
        return self._target is not None or self._expired is not None

    def next_deadline(self) -> int | None:
        return self._deadline

    def start(
        self, target: str, now: int, stage: DialogStage, headers: tuple[tuple[str, str], ...] = ()
    ) -> list[TransferOutput]:
        """A transfer to `target` (already validated: sip.core.telephony.validate_transfer_target) was asked for,
        its REFER to carry `headers` (checked: sip.core.app_headers `check_app_headers`)."""
        busy = self._target or self._expired
        if busy is not None:
            return [TransferProgress(target, 491, f"a transfer to {busy} is still in progress", True)]
        if stage is DialogStage.NOT_ANSWERED:
            return [TransferProgress(target, 500, "REFER not sent: the call is not answered", True)]
        self._target, self._headers = target, headers
        self._deadline = now + self.timeout_ns
        if stage is DialogStage.AWAITING_ACK:
            self._deferred = True
            return []
        return [SendRefer(target, headers)]

    @property
    def waiting_for_ack(self) -> bool:
        return self._deferred

    def confirmed(self, now: int) -> list[TransferOutput]:
        """The ACK arrived: a REFER that waited for it goes now."""
        if not self._deferred or self._target is None:
            return []
        self._deferred = False
        return [SendRefer(self._target, self._headers)]

    def refer_failed(self, reason: str, now: int) -> list[TransferOutput]:
        """The REFER could not be sent (engine or transport error)."""
        target = self._target
        if target is None:
            return []
        self._clear()
        return [TransferProgress(target, 500, f"REFER not sent: {reason}", True)]

    def report(self, status_code: int, reason: str, now: int, *, final: bool) -> list[TransferOutput]:
        """A report on the REFER: (100, "Accepted") for its 2xx, a NOTIFY sipfrag status, or its error
        response (`final`). A status of 200 or more is the outcome even when the subscription goes on."""
        final = final or status_code >= 200
        target = self._target
        if target is None:
            late = self._expired
            if late is None or not final:  # nothing of ours, or progress on one we gave up on (408 reported)
                return []
            self._expired = None
            return [EndTransferredCall(late, f"transferred to {late}")] if 200 <= status_code < 300 else []
        if not final:
            self._deadline = now + self.timeout_ns  # a report: the transferee is still working on it
            return [TransferProgress(target, status_code, reason, False)]
        self._clear()
        out: list[TransferOutput] = [TransferProgress(target, status_code, reason, True)]
        if 200 <= status_code < 300:
            out.append(EndTransferredCall(target, f"transferred to {target}"))
        return out

    def refer_response(
        self, status_code: int, reason: str, now: int, *, refer_sub: bool = True
    ) -> list[TransferOutput]:
        """The REFER's final response (a 1xx is no report). A 2xx opens the subscription: (100, "Accepted");
        with "Refer-Sub: false" (RFC 4488) there is none, so a 2xx is the outcome."""
        if status_code < 200:
            return []
        if status_code < 300 and refer_sub:
            return self.report(100, "Accepted", now, final=False)
        return self.report(status_code, reason, now, final=True)

    def notify(self, status_code: int, reason: str, now: int, *, terminated: bool) -> list[TransferOutput]:
        """A NOTIFY's sipfrag status line; `terminated` when its Subscription-State ends the subscription."""
        return self.report(status_code, reason, now, final=terminated)

    def subscription_ended(self, now: int) -> list[TransferOutput]:
        """The subscription ended with no final NOTIFY (expired, refused, transport error)."""
        if self._target is None:
            self._expired = None
            return []
        return self.report(500, "the subscription ended without a final NOTIFY", now, final=True)

    def call_ended(self, now: int) -> list[TransferOutput]:
        """The call is over: a transfer in progress ends with 487 (before the leg's CallEnded)."""
        target = self._target
        self._clear()
        self._expired = None
        if target is None:
            return []
        return [TransferProgress(target, 487, "the call ended before the transfer's outcome", True)]

    def handle_timer(self, now: int) -> list[TransferOutput]:
        """408 once the transfer has had no report for `timeout_ns`; the call stays up."""
        target = self._target
        if target is None or self._deadline is None or now < self._deadline:
            return []
        # A REFER that was sent may still be answered: its late reports are read (a 2xx ends the call) and
        # other transfers wait (491) until it is settled. One that never left (waiting for the ACK) cannot.
        sent = not self._deferred
        self._clear()
        self._expired = target if sent else None
        timeout = f"{self.timeout_ns / 1e9:g}"
        return [TransferProgress(target, 408, f"no answer to the transfer within {timeout} s", True)]

    def _clear(self) -> None:
        self._target = None
        self._deferred = False
        self._deadline = None
