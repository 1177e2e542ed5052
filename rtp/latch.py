"""Symmetric RTP (RFC 4961 in spirit): which source addresses this call takes RTP from, and where it sends.

Policy (the signalled address is the `c=`/`m=` address and port of the peer's SDP):
- NAT mode off: only packets from exactly the signalled (host, port) are accepted; we send there.
- NAT mode on: the first *valid* packet (the stream asks only after it parsed) latches the call to its source,
  whatever the SDP said (behind NAT the SDP often names a private address); we then send to the latched
  source, which is what makes the media path work through the NAT.
- Re-latching (NAT mode only): a packet from another source is accepted, and becomes the latched source, only
  if it carries a *new SSRC* and the latched source has sent nothing for `relatch_after_ms` (1 s default).
  This follows a carrier that hands the call to another media server (new source, new SSRC, after a gap) but
  resists a third party injecting packets into a live stream. Limitation, chosen on purpose: a NAT rebinding
  that keeps the SSRC (same phone, new public port) is not followed; such a peer's audio returns after a
  re-INVITE (which re-signals the address and resets the latch).
- A re-INVITE that changes the signalled address calls `signal()`, which also drops the latch.
Everything refused is counted (`refused`) and dropped by the stream as `Drop.WRONG_SOURCE`.

Addresses are compared as the shell gives them (host string, port): the shell normalises them (e.g. strips
IPv4-mapped IPv6 prefixes) the same way for the SDP and for `recvfrom`.
"""

from __future__ import annotations

__all__ = ["Address", "SourceLatch"]

Address = tuple[str, int]
_MS = 1_000_000


class SourceLatch:
    """The source policy of one call's RTP socket."""

    __slots__ = ("_signalled", "nat", "_relatch_ns", "_latched", "_ssrc", "_last_ns", "refused", "relatches")

    def __init__(self, signalled: Address | None, nat: bool = False, relatch_after_ms: int = 1000) -> None:
        self._signalled = signalled
        self.nat = nat
        self._relatch_ns = relatch_after_ms * _MS
        self._latched: Address | None = None
        self._ssrc = -1
        self._last_ns = 0
        self.refused = 0
        self.relatches = 0

    def signal(self, address: Address | None) -> None:
        """The peer signalled a (new) address (SDP answer, re-INVITE): any latch starts over."""
        self._signalled = address
        self._latched = None
        self._ssrc = -1

    @property
    def latched(self) -> Address | None:
        return self._latched

    @property
    def destination(self) -> Address | None:
        """Where to send RTP: the latched source once there is one, else the signalled address."""
        return self._latched if self._latched is not None else self._signalled

    def accept(self, source: Address, ssrc: int, now: int) -> bool:
        """Whether a valid RTP packet from `source` with `ssrc` is taken (and note it if so)."""
        latched = self._latched
        if latched is not None and source == latched:
            self._last_ns = now
            self._ssrc = ssrc
            return True
        if not self.nat:
            if source == self._signalled:
                self._latched = source
                self._ssrc, self._last_ns = ssrc, now
                return True
            self.refused += 1
            return False
        if latched is None:
            self._latched = source
            self._ssrc, self._last_ns = ssrc, now
            return True
        if ssrc != self._ssrc and now - self._last_ns >= self._relatch_ns:
            self._latched = source
            self._ssrc, self._last_ns = ssrc, now
            self.relatches += 1
            return True
        self.refused += 1
        return False

    def accept_rtcp(self, source: Address) -> bool:
        """RTCP is taken from the host RTP comes from (or, before any RTP, the signalled host), any port."""
        ref = self.destination
        if ref is not None and source[0] == ref[0]:
            return True
        if ref is None and self.nat:
            return True
        self.refused += 1
        return False
