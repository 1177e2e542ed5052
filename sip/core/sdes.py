"""SDES keys for SRTP (RFC 4568, RFC 3711): the ``a=crypto`` attribute, the suites we run, and where keys may
travel. No I/O, no clock.

- `parse_crypto` and `CryptoAttribute` read and write one ``a=crypto`` value (RFC 4568 §9.1); a malformed one
  is None (ignored, §7.1.1), a suite we do not know parses and is not `usable`. `usable` is what rtp.srtp
  (pylibsrtp) can run: a suite of `SRTP_KEY_LENGTHS` with one key of its length, no MKI, no session parameter
  but the WSH hint (pylibsrtp has no MKI and no key derivation rate; lifetimes are accepted and not enforced,
  libsrtp keeps its own 2^48 limit).
- `SrtpPolicy` ("off", "optional", "required") and `DEFAULT_CRYPTO_SUITES`; `SrtpKeys` is what one stream
  agreed: suite, tag, the key we send with and the key we receive with.
- `sdes_policy(policy, transport)` is the SRTP policy for a call's signalling transport: keys only travel over
  TLS (`SECURE_TRANSPORTS`, RFC 4568 §8.3).

Which a=crypto line an answer takes, and which key it carries, is offer/answer (sip.core.offer_answer).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Literal

from sip.core.headers import bounded_int

__all__ = [
    "DEFAULT_CRYPTO_SUITES",
    "SECURE_TRANSPORTS",
    "SRTP_KEY_LENGTHS",
    "CryptoAttribute",
    "CryptoKey",
    "SrtpKeys",
    "SrtpPolicy",
    "parse_crypto",
    "sdes_policy",
]

SrtpPolicy = Literal["off", "optional", "required"]
# master key || master salt length per suite (RFC 4568 §6.2, RFC 7714 §14.2); rtp.srtp.SUITES agrees (tested)
SRTP_KEY_LENGTHS: dict[str, int] = {
    "AES_CM_128_HMAC_SHA1_80": 30,
    "AES_CM_128_HMAC_SHA1_32": 30,
    "AEAD_AES_128_GCM": 28,
    "AEAD_AES_256_GCM": 44,
}
DEFAULT_CRYPTO_SUITES = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")
SECURE_TRANSPORTS = frozenset({"tls", "wss"})  # where SDES keys may travel (RFC 4568 §8.3)
_HINT_PARAMS = ("WSH=",)  # RFC 4568 §6.3.6 window size hint: a hint, safe to ignore
_MAX_TAG = 999_999_999  # RFC 4568 §9.1: 1*9DIGIT


@dataclass(frozen=True, slots=True)
class CryptoKey:
    """One ``inline:`` key parameter: master key || salt, and the optional lifetime and MKI:length."""

    key_salt: bytes
    lifetime: int | None = None  # in packets (``2^20`` or decimal)
    mki: tuple[int, int] | None = None  # (value, length in bytes)

    def __str__(self) -> str:
        text = "inline:" + base64.b64encode(self.key_salt).decode("ascii")
        if self.lifetime is not None:
            power = self.lifetime.bit_length() - 1
            text += f"|2^{power}" if self.lifetime == 1 << power else f"|{self.lifetime}"
        if self.mki is not None:
            text += f"|{self.mki[0]}:{self.mki[1]}"
        return text


@dataclass(frozen=True, slots=True)
class CryptoAttribute:
    """``a=crypto:<tag> <crypto-suite> <key-params> [<session-params>]`` (RFC 4568 §9.1)."""

    tag: int
    suite: str
    keys: tuple[CryptoKey, ...]
    session_params: tuple[str, ...] = ()

    @property
    def key(self) -> bytes:
        """The (first) master key || salt."""
        return self.keys[0].key_salt

    @property
    def usable(self) -> bool:
        """A suite we know with one key of the right length, no MKI and no session parameter we would have to
        honour (only the WSH hint): what rtp.srtp (pylibsrtp) can run."""
        return (
            self.suite in SRTP_KEY_LENGTHS
            and len(self.keys) == 1
            and self.keys[0].mki is None
            and len(self.keys[0].key_salt) == SRTP_KEY_LENGTHS[self.suite]
            and all(p.startswith(_HINT_PARAMS) for p in self.session_params)
        )

    def __str__(self) -> str:
        keys = ";".join(str(k) for k in self.keys)
        params = "".join(f" {p}" for p in self.session_params)
        return f"{self.tag} {self.suite} {keys}{params}"


def _b64(text: str) -> bytes | None:
    if not text or not text.isascii():
        return None
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def _crypto_key(text: str) -> CryptoKey | None:
    method, colon, info = text.partition(":")
    if method.lower() != "inline" or not colon:
        return None
    pieces = info.split("|")
    if len(pieces) > 3:
        return None
    key = _b64(pieces[0])
    if key is None:
        return None
    lifetime: int | None = None
    mki: tuple[int, int] | None = None
    for piece in pieces[1:]:
        if ":" in piece:  # MKI:length (RFC 4568 §6.1); lifetime, when present, comes first
            value_text, _, length_text = piece.partition(":")
            value, length = bounded_int(value_text, 38), bounded_int(length_text, 3)
            if mki is not None or value is None or length is None or not 1 <= length <= 128:
                return None
            mki = (value, length)
        else:
            if lifetime is not None or mki is not None:
                return None
            if piece.startswith("2^"):
                power = bounded_int(piece[2:], 2)
                lifetime = 1 << power if power is not None and power <= 64 else None
            else:
                lifetime = bounded_int(piece, 20)
            if not lifetime:  # absent, malformed, or 0 (a key for no packet at all)
                return None
    return CryptoKey(key, lifetime, mki)


def parse_crypto(value: str) -> CryptoAttribute | None:
    """One ``a=crypto`` value, or None when it is malformed (such a line is ignored, RFC 4568 §7.1.1: the
    answerer skips what it does not understand). A suite we do not know parses; `usable` says False."""
    pieces = value.split()
    if len(pieces) < 3:
        return None
    tag = bounded_int(pieces[0], 9)
    suite = pieces[1]
    if tag is None or tag > _MAX_TAG or not suite.isascii() or not suite.replace("_", "").isalnum():
        return None
    keys: list[CryptoKey] = []
    for text in pieces[2].split(";"):
        key = _crypto_key(text)
        if key is None:
            return None
        keys.append(key)
    return CryptoAttribute(tag, suite, tuple(keys), tuple(pieces[3:]))


@dataclass(frozen=True, slots=True)
class SrtpKeys:
    """What SDES agreed for one stream: the suite and a=crypto tag, the master key || salt we protect with
    (the one our SDP carried) and the one we unprotect with (the peer's)."""

    suite: str
    tag: int
    local_key: bytes = field(repr=False)
    remote_key: bytes = field(repr=False)


def sdes_policy(policy: SrtpPolicy, transport: str) -> SrtpPolicy | None:
    """The SRTP policy for one call's signalling transport (SDES keys only over TLS): `policy` over TLS (or
    WSS); elsewhere "off" for "off" and "optional", None for "required" (the call must be refused, 488)."""
    if transport.lower() in SECURE_TRANSPORTS:
        return policy
    return None if policy == "required" else "off"
