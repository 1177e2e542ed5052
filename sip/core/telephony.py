"""What a caller's telephony requests may contain: DTMF digits to send and REFER targets.

Pure checks shared by every SIP engine, run in `CallLeg.send_dtmf` and `CallLeg.transfer` before anything
reaches the engine, so a bad argument is a ValueError at the call site and nothing is ever sent.
"""

from __future__ import annotations

import re

DTMF_DIGITS = frozenset("0123456789*#ABCD")  # RFC 4733 events 0-15 (no flash: "R" is pjmedia's, not DTMF)
# The contract's limit (CallLeg.send_dtmf): 1 to 32 digits per call. 32 is what pjmedia's stream queues
# (PJ_ETOOMANY beyond); the native engine keeps the same limit so both engines take the same input.
MAX_DTMF_DIGITS = 32
_TRANSFER_TARGET = re.compile(r"^(?:sips?|tel):[^\s<>\"]+$", re.IGNORECASE)


def validate_dtmf_digits(digits: str) -> str:
    """The digits to send, upper-cased; ValueError (with the offending characters) if any is not a DTMF key."""
    if not isinstance(digits, str) or not digits:
        raise ValueError("send_dtmf needs at least one digit (0-9, *, #, A-D)")
    normalized = digits.upper()
    bad = sorted({ch for ch in normalized if ch not in DTMF_DIGITS})
    if bad:
        raise ValueError(
            f"send_dtmf: {', '.join(map(repr, bad))} not DTMF digits: only 0-9, *, #, A-D are allowed"
        )
    if len(normalized) > MAX_DTMF_DIGITS:
        raise ValueError(f"send_dtmf: {len(normalized)} digits, at most {MAX_DTMF_DIGITS} per call")
    return normalized


def validate_transfer_target(target: str) -> str:
    """A bare sip:/sips:/tel: URI (angle brackets allowed); ValueError for anything else, e.g. a name, a
    number without a scheme, or text with whitespace or CR/LF that would corrupt the Refer-To header."""
    uri = target.strip() if isinstance(target, str) else ""
    if uri.startswith("<") and uri.endswith(">"):
        uri = uri[1:-1]
    if not _TRANSFER_TARGET.match(uri):
        raise ValueError(f"transfer target {target!r} is not a sip:, sips: or tel: URI")
    return uri
