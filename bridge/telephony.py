"""Telephony tools (DL6): what the model may do to the call itself, offered only when enabled.

- `end_call`: the model says a short goodbye, then the bridge sends BYE (once the goodbye has been played, or
  after `goodbye_timeout_ms` at most).
- `transfer_call`: a blind transfer by SIP REFER to one of the configured targets; the model is told the
  outcome the transferee reported by NOTIFY (answered, busy, refused...). After a successful transfer the
  bridge leaves the call.
- `send_dtmf`: RFC 4733 digits to the caller's side (an IVR behind the caller, a conference PIN).

The caller's own key presses reach the application, and, with `dtmf_to_model`, the model as silent context.
These tools never go to the application's handler: the session carries them out on the call leg.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from providers.base import ToolSpec

END_CALL = "end_call"
TRANSFER_CALL = "transfer_call"
SEND_DTMF = "send_dtmf"
DTMF_DIGITS = frozenset("0123456789*#ABCD")


@dataclass(frozen=True, slots=True)
class TelephonyOptions:
    end_call: bool = False
    transfer_targets: dict[str, str] = field(default_factory=dict)  # name the model uses -> SIP URI
    send_dtmf: bool = False
    dtmf_to_model: bool = False
    goodbye_timeout_ms: int = 10_000

    @property
    def names(self) -> frozenset[str]:
        enabled = {END_CALL: self.end_call, TRANSFER_CALL: bool(self.transfer_targets), SEND_DTMF: self.send_dtmf}
        return frozenset(name for name, on in enabled.items() if on)


def tool_specs(options: TelephonyOptions) -> tuple[ToolSpec, ...]:
    """The function declarations offered to the model for the enabled tools."""
    specs = []
    if options.end_call:
        specs.append(ToolSpec(END_CALL, "End the phone call. Say a short goodbye first; the line is closed when "
                              "you have finished speaking.", {"type": "object", "properties": {}}))
    if options.transfer_targets:
        names = sorted(options.transfer_targets)
        specs.append(ToolSpec(TRANSFER_CALL, "Transfer the caller to a person or department. You will be told "
                              "whether the transfer was answered.",
                              {"type": "object", "properties": {"destination": {"type": "string", "enum": names}},
                               "required": ["destination"]}))
    if options.send_dtmf:
        specs.append(ToolSpec(SEND_DTMF, "Send touch-tone digits on the line (0-9, *, #).",
                              {"type": "object", "properties": {"digits": {"type": "string"}},
                               "required": ["digits"]}))
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


def result(**fields: object) -> str:
    return json.dumps(fields)
