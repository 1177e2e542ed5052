"""Caller-ID attestation (STIR/SHAKEN) from an INVITE, read as the carrier gave it; sans-I/O, pure.

Two signals, both from the terminating carrier or its verification service:
- `verstat` (ATIS-1000074, 3GPP TS 24.229 §7.2A.20): a URI parameter on the P-Asserted-Identity URI or, when
  no P-Asserted-Identity has one, on the From URI: `TN-Validation-Passed` → "passed",
  `TN-Validation-Failed` → "failed", `No-TN-Validation` → "none"; none present, or a value we do not know →
  "absent". P-Asserted-Identity is read first: it is the network's assertion, From is the caller's claim.
- the `Identity` header (RFC 8224, compact form `y`): a PASSporT (RFC 8225; the SHAKEN extension, RFC 8588)
  then `;info=<...>;alg=ES256;ppt=shaken`. Its JWT header and payload are decoded for `attest` (A/B/C),
  `orig.tn`, `dest.tn`, `origid` and `iat`. The signature is NOT verified (`verified` is always False): that
  needs the certificate at `info`, fetched over the network, and the STI-CA trust anchors, which the bridge
  has neither of; the carrier's `verstat` is its verdict and the one the policy acts on.

Policy (`[inbound] refuse_failed_attestation`, off by default; applied by `bridge.server.api.Server` before the
application, any route or provider): a call whose verstat is "failed" is refused with 608 Rejected (RFC 8688),
not 403: 608 says an analytics verdict on the call refused it, so the originating network can tell the caller
(and a legitimate caller wrongly flagged knows to seek redress), where 403 reads as "this trunk or user may not
call here" and sends the carrier's engineers looking at credentials and allowlists. The 608 carries no Call-Info
jCard (RFC 8688 §3.2 SHOULD): the bridge has no redress contact to put there. "none" and "absent" are never
refused: most carriers still deliver calls unsigned, and refusing them would refuse most callers.

Hostile input never raises: an Identity header over `MAX_IDENTITY` characters is ignored (`reason`
"identity_oversize"), bad base64 or JSON or a payload that is not an object gives no level with a `reason`
("identity_bad_base64", "identity_bad_json", "identity_not_jws"); strings kept from the payload are cut at
`MAX_FIELD` characters and a non-string where a string belongs is dropped. The Server counts each reason
in `parlora_identity_ignored_total{reason}` (bridge/server/metrics.py).

Trust: anyone who reaches the port can write `verstat=TN-Validation-Passed` or an Identity header; the fields
are only as good as the trunk that delivered them (an allowlisted carrier's). That is why the policy only ever
refuses on "failed" (forging it harms only the forger) and never admits on "passed".
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

Verstat = Literal["passed", "failed", "none", "absent"]
VERSTATS: tuple[Verstat, ...] = get_args(Verstat)
Level = Literal["A", "B", "C"]
IgnoredReason = Literal[
    "identity_oversize", "identity_bad_base64", "identity_bad_json", "identity_not_jws", "unreadable"
]
IGNORED_REASONS: tuple[IgnoredReason, ...] = get_args(IgnoredReason)

MAX_IDENTITY = 8192  # characters of one Identity header; a SHAKEN PASSporT is ~600
MAX_FIELD = 64  # characters kept of each string of the payload (a TN, an origid UUID)
_VERSTAT: dict[str, Verstat] = {
    "tn-validation-passed": "passed",
    "tn-validation-failed": "failed",
    "no-tn-validation": "none",
}
_LEVELS: tuple[Level, ...] = ("A", "B", "C")


@dataclass(frozen=True, slots=True)
class Attestation:
    """What the carrier said about the caller's number. `signed`: an Identity header was present (whatever
    could be read of it); `verified` is always False: the PASSporT's signature is never checked here (see the
    module docstring). `reason`: why an Identity header gave nothing ("" when it was read, or absent)."""

    verstat: Verstat = "absent"
    level: Level | None = None
    orig_tn: str | None = None
    dest_tn: str | None = None
    origid: str | None = None
    iat: int | None = None
    signed: bool = False
    verified: bool = False  # never: no certificate fetch, no trust anchors (module docstring)
    reason: IgnoredReason | Literal[""] = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "verstat": self.verstat,
            "level": self.level,
            "orig_tn": self.orig_tn,
            "dest_tn": self.dest_tn,
            "origid": self.origid,
            "iat": self.iat,
            "signed": self.signed,
            "verified": self.verified,
            "reason": self.reason,
        }


ABSENT = Attestation()


def uri_verstat(value: str) -> Verstat:
    """The `verstat` parameter of a name-addr or URI (From, P-Asserted-Identity), "absent" when it has none."""
    text = value[:MAX_IDENTITY]
    start, end = text.find("<"), text.find(">")
    uri = text[start + 1 : end] if 0 <= start < end else text
    for param in uri.split(";")[1:]:
        name, _, val = param.partition("=")
        if name.strip().lower() == "verstat":
            return _VERSTAT.get(val.strip().lower(), "absent")
    return "absent"


def _b64(part: str) -> bytes:
    return base64.b64decode(part + "=" * (-len(part) % 4), altchars=b"-_", validate=True)


def _text(value: object) -> str | None:
    return value[:MAX_FIELD] if isinstance(value, str) else None


def _tn(claim: object) -> str | None:
    """`orig`/`dest` of a PASSporT: {"tn": "..."} or {"tn": ["...", ...]} (RFC 8225 §5.2.1)."""
    if not isinstance(claim, dict):
        return None
    tn = claim.get("tn")
    if isinstance(tn, list):
        tn = tn[0] if tn else None
    return _text(tn)


def parse_identity(value: str) -> Attestation:
    """The PASSporT of one Identity header, decoded without verification (`verstat` left "absent")."""
    if len(value) > MAX_IDENTITY:
        return Attestation(signed=True, reason="identity_oversize")
    token = value.split(";", 1)[0].strip().strip("<>").strip()
    parts = token.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        return Attestation(signed=True, reason="identity_not_jws")
    try:
        header = json.loads(_b64(parts[0]))
        payload = json.loads(_b64(parts[1]))
    except (binascii.Error, ValueError):  # bad base64; JSONDecodeError and UnicodeDecodeError are ValueErrors
        return Attestation(
            signed=True, reason="identity_bad_json" if _decodes(parts) else "identity_bad_base64"
        )
    except RecursionError:
        return Attestation(signed=True, reason="identity_bad_json")
    if not isinstance(header, dict) or not isinstance(payload, dict):
        return Attestation(signed=True, reason="identity_not_jws")
    attest = payload.get("attest")
    level = next((lv for lv in _LEVELS if lv == attest), None)
    iat = payload.get("iat")
    return Attestation(
        level=level,
        orig_tn=_tn(payload.get("orig")),
        dest_tn=_tn(payload.get("dest")),
        origid=_text(payload.get("origid")),
        iat=iat if isinstance(iat, int) and not isinstance(iat, bool) else None,
        signed=True,
    )


def _decodes(parts: list[str]) -> bool:
    try:
        _b64(parts[0])
        _b64(parts[1])
    except (binascii.Error, ValueError):
        return False
    return True


def _header(headers: tuple[tuple[str, str], ...], *names: str) -> list[str]:
    wanted = {n.lower() for n in names}
    return [v for k, v in headers if k.strip().lower() in wanted]


def attestation_of(from_uri: str, headers: tuple[tuple[str, str], ...]) -> Attestation:
    """The attestation of an INVITE from its From (name-addr or URI) and its header fields; never raises."""
    try:
        verstat: Verstat = "absent"
        for pai in _header(headers, "P-Asserted-Identity")[:4]:
            for element in pai[:MAX_IDENTITY].split(","):  # a PAI may list a sip: and a tel: URI
                verstat = uri_verstat(element)
                if verstat != "absent":
                    break
            if verstat != "absent":
                break
        if verstat == "absent":
            froms = _header(headers, "From", "f")
            verstat = uri_verstat(froms[0] if froms else from_uri)
        identities = _header(headers, "Identity", "y")
        base = parse_identity(identities[0]) if identities else ABSENT
        return replace(base, verstat=verstat)
    except Exception:  # peer input never raises
        return Attestation(reason="unreadable")
