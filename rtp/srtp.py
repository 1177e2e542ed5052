"""SRTP and SRTCP for one call (RFC 3711), on libsrtp through pylibsrtp: no cryptography is written here.

Sans-I/O: bytes in, bytes out, no clock, no socket. One `SrtpContext` per call holds two libsrtp sessions:
the outbound one keyed with *our* master key (the one our SDP's ``a=crypto`` line carried, RFC 4568) for any
SSRC we send, and the inbound one keyed with the *peer's* key for any SSRC it sends.

    ctx = SrtpContext(suite, local_key, remote_key)     # key = master key || master salt (raw bytes)
    wire = ctx.protect(rtp)                              # RTP datagram -> SRTP datagram
    rtp = ctx.unprotect(wire)                            # SRTP -> RTP, or None (counted: HR-style drop)
    ctx.protect_rtcp(rtcp) / ctx.unprotect_rtcp(srtcp)   # the same for RTCP (the E flag and index are libsrtp's)
    ctx.rekey(remote_key=...)                            # a re-INVITE brought a new key: a fresh context

Peer input never raises: a packet whose authentication tag does not verify is dropped and counted in
`auth_failures` (RFC 3711 §3.3 step 5, the issue's "a failed authentication tag is counted and the packet
dropped"), a replayed or too old one in `replays` (§3.3.2), anything else libsrtp refuses (truncated, too
long, unknown SSRC for the inbound template) in `errors`. `protect` raises `SrtpError` only for our own misuse
(a packet too long for the 1500-byte work buffer, or not a packet at all).

Suites (`SUITES`, the RFC 4568 §6.2 / RFC 7714 §14.2 names): AES_CM_128_HMAC_SHA1_80, AES_CM_128_HMAC_SHA1_32,
AEAD_AES_128_GCM and AEAD_AES_256_GCM. pylibsrtp 1.0.0 has no MKI and no key-derivation-rate setting, so the
SDP layer declines offers that need them (sip.core.sdp).

Cost (tests/bench/srtp_micro.py prints it): a few microseconds per 172-byte packet each way, most of it the
binding's per-call copy into its buffer; the media path runs it 50 times a second per call and direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import pylibsrtp

__all__ = ["SUITES", "SrtpContext", "SrtpError", "SrtpSuite", "suite"]


class SrtpError(ValueError):
    """Our own misuse: an unknown suite, a key of the wrong length, a packet we cannot protect."""


@dataclass(frozen=True, slots=True)
class SrtpSuite:
    """One crypto suite: its SDP name, the libsrtp profile, the master key and salt lengths (bytes), and
    the authentication tag length on the wire (RTP)."""

    name: str
    profile: int
    key_length: int
    salt_length: int
    tag_length: int

    @property
    def key_salt_length(self) -> int:
        """The length of the SDES inline key (master key || master salt)."""
        return self.key_length + self.salt_length


_P = pylibsrtp.Policy
SUITES: dict[str, SrtpSuite] = {
    s.name: s
    for s in (
        SrtpSuite("AES_CM_128_HMAC_SHA1_80", _P.SRTP_PROFILE_AES128_CM_SHA1_80, 16, 14, 10),  # RFC 4568
        SrtpSuite("AES_CM_128_HMAC_SHA1_32", _P.SRTP_PROFILE_AES128_CM_SHA1_32, 16, 14, 4),  # RFC 4568
        SrtpSuite("AEAD_AES_128_GCM", _P.SRTP_PROFILE_AEAD_AES_128_GCM, 16, 12, 16),  # RFC 7714
        SrtpSuite("AEAD_AES_256_GCM", _P.SRTP_PROFILE_AEAD_AES_256_GCM, 32, 12, 16),  # RFC 7714
    )
}

# libsrtp's error texts as pylibsrtp raises them (pylibsrtp.Error carries only the text).
_AUTH_FAILURES = frozenset({"authentication failure", "cipher failure"})  # GCM's tag check is the cipher's
_REPLAYS = frozenset(
    {
        "replay check failed (bad index)",
        "replay check failed (index too old)",
        "packet index is too old to consider",
    }
)


def suite(name: str) -> SrtpSuite:
    """The suite called `name` (SDP spelling), SrtpError if we do not support it."""
    found = SUITES.get(name)
    if found is None:
        raise SrtpError(f"unsupported SRTP crypto suite {name!r}")
    return found


def _session(info: SrtpSuite, key: bytes, ssrc_type: int) -> pylibsrtp.Session:
    if len(key) != info.key_salt_length:
        raise SrtpError(f"{info.name} needs a {info.key_salt_length}-byte key||salt, not {len(key)} bytes")
    policy = pylibsrtp.Policy(key=bytes(key), ssrc_type=ssrc_type, srtp_profile=info.profile)
    return pylibsrtp.Session(policy)


class SrtpContext:
    """The SRTP state of one call, both directions (see the module docstring)."""

    def __init__(self, suite_name: str, local_key: bytes, remote_key: bytes) -> None:
        self.suite = suite(suite_name)
        self._local_key = bytes(local_key)
        self._remote_key = bytes(remote_key)
        self._out = _session(self.suite, self._local_key, _P.SSRC_ANY_OUTBOUND)
        self._in = _session(self.suite, self._remote_key, _P.SSRC_ANY_INBOUND)
        self._protect = self._out.protect
        self._unprotect = self._in.unprotect
        self.packets_protected = 0
        self.packets_unprotected = 0
        self.rtcp_protected = 0
        self.rtcp_unprotected = 0
        self.auth_failures = 0
        self.replays = 0
        self.errors = 0
        self.rekeys = 0

    # --- RTP (the per-frame path: no allocation but the binding's, no logging) ---

    def protect(self, rtp: bytes | bytearray | memoryview) -> bytes:
        """Our RTP packet as SRTP (encrypted payload, authentication tag appended)."""
        try:
            out = self._protect(rtp if type(rtp) is bytes else bytes(rtp))
        except (pylibsrtp.Error, ValueError, TypeError) as exc:
            raise SrtpError(f"cannot protect an RTP packet of {len(rtp)} bytes: {exc}") from exc
        self.packets_protected += 1
        return out

    def unprotect(self, srtp: bytes | bytearray | memoryview) -> bytes | None:
        """The peer's SRTP packet as RTP, or None when it must be dropped (counted: `auth_failures`,
        `replays`, `errors`)."""
        try:
            out = self._unprotect(srtp if type(srtp) is bytes else bytes(srtp))
        except pylibsrtp.Error as exc:
            self._count(str(exc))
            return None
        except (ValueError, TypeError):  # longer than the binding's 1500-byte buffer
            self.errors += 1
            return None
        self.packets_unprotected += 1
        return out

    # --- RTCP ---

    def protect_rtcp(self, rtcp: bytes | bytearray | memoryview) -> bytes:
        """Our RTCP compound packet as SRTCP (encrypted, SRTCP index and tag appended)."""
        try:
            out = self._out.protect_rtcp(bytes(rtcp))
        except (pylibsrtp.Error, ValueError, TypeError) as exc:
            raise SrtpError(f"cannot protect an RTCP packet of {len(rtcp)} bytes: {exc}") from exc
        self.rtcp_protected += 1
        return out

    def unprotect_rtcp(self, srtcp: bytes | bytearray | memoryview) -> bytes | None:
        """The peer's SRTCP packet as RTCP, or None (counted like `unprotect`)."""
        try:
            out = self._in.unprotect_rtcp(bytes(srtcp))
        except pylibsrtp.Error as exc:
            self._count(str(exc))
            return None
        except (ValueError, TypeError):
            self.errors += 1
            return None
        self.rtcp_unprotected += 1
        return out

    def _count(self, why: str) -> None:
        if why in _AUTH_FAILURES:
            self.auth_failures += 1
        elif why in _REPLAYS:
            self.replays += 1
        else:
            self.errors += 1

    # --- re-keying (a re-INVITE's new a=crypto, RFC 4568 §7.1.4) ---

    def rekey(
        self,
        *,
        suite_name: str | None = None,
        local_key: bytes | None = None,
        remote_key: bytes | None = None,
    ) -> bool:
        """Apply what a new offer/answer agreed; a direction whose suite and key did not change keeps its
        context (its rollover counter and replay window), a changed one starts afresh. True if anything
        changed. SrtpError (nothing changed) for an unknown suite or a bad key length."""
        new_suite = suite(suite_name) if suite_name is not None else self.suite
        local = self._local_key if local_key is None else bytes(local_key)
        remote = self._remote_key if remote_key is None else bytes(remote_key)
        suite_changed = new_suite != self.suite
        out = (
            _session(new_suite, local, _P.SSRC_ANY_OUTBOUND)
            if suite_changed or local != self._local_key
            else None
        )
        inbound = (
            _session(new_suite, remote, _P.SSRC_ANY_INBOUND)
            if suite_changed or remote != self._remote_key
            else None
        )
        if out is None and inbound is None:
            return False
        self.suite = new_suite
        if out is not None:
            self._local_key, self._out, self._protect = local, out, out.protect
        if inbound is not None:
            self._remote_key, self._in, self._unprotect = remote, inbound, inbound.unprotect
        self.rekeys += 1
        return True

    def counters(self) -> dict[str, int]:
        """For status and metrics (prefix them ``srtp_``)."""
        return {
            "srtp_packets_protected": self.packets_protected,
            "srtp_packets_unprotected": self.packets_unprotected,
            "srtcp_protected": self.rtcp_protected,
            "srtcp_unprotected": self.rtcp_unprotected,
            "srtp_auth_failures": self.auth_failures,
            "srtp_replays": self.replays,
            "srtp_errors": self.errors,
            "srtp_rekeys": self.rekeys,
        }
