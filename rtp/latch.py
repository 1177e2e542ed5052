"""Which source addresses a call takes RTP from, and where it sends (symmetric RTP, RFC 4961 in spirit).

The signalled address is the `c=`/`m=` address and port of the peer's SDP. Three policies:

- **learn** (the default, NAT mode off; Asterisk's `strictrtp = yes` with its learning): a valid packet from
  the signalled address is taken at once and latches the call to it. While nothing is latched, a packet
  from any other source is a *candidate*: the call latches to the first source that sends `probation`
  (4, Asterisk's default) consecutive valid packets — one SSRC, each sequence number the previous one plus
  one; the packet that completes the run is taken, the ones before it are dropped. A different source, SSRC
  or a sequence jump restarts the run, so a single spoofed packet, or a third party's packets interleaved
  with the caller's, latch nothing. Once latched the call is strict: packets from other sources are refused
  and counted. One exception, because the SDP is the authority a learned source only stands in for: the
  signalled address, if it ever sends, replaces a *learned* source.
  We keep *sending* to the signalled address (what Asterisk does without `comedia`/`nat`): learning decides
  what we take, not where we send; a peer whose SDP names an address it cannot be reached at needs `--nat`.
  Packet arrival intervals are not checked (Asterisk's `strictrtp = yes` also checks them, `seqno` does not):
  the sequence rule alone decides.
- **strict** (`--rtp-source strict`, NAT mode off): only packets from exactly the signalled (host, port) are
  accepted; we send there. (The behaviour before learning existed.)
- **NAT mode** (`--nat`, whatever the policy): the first *valid* packet (the stream asks only after it
  parsed) latches the call to its source, whatever the SDP said (behind NAT the SDP often names a private
  address); we then send to the latched source, which is what makes the media path work through the NAT.
  Re-latching: a packet from another source is accepted, and becomes the latched source, only if it carries a
  *new SSRC* and the latched source has sent nothing for `relatch_after_ms` (1 s default). This follows a
  carrier that hands the call to another media server (new source, new SSRC, after a gap) but resists a third
  party injecting packets into a live stream. Limitation, chosen on purpose: a NAT rebinding that keeps the
  SSRC (same phone, new public port) is not followed; such a peer's audio returns after a re-INVITE (which
  re-signals the address and resets the latch).

Re-signalling (`signal()`: the answer to a re-INVITE or UPDATE, hold and resume included). NAT mode drops the
latch every time. In learn mode (as Asterisk, which re-learns only when the signalled address differs from
the source it takes): a new signalled address drops the latch and learning starts over; the same address,
latched to itself, changes nothing (a hold, a resume or a session refresh loses no packet); the same address
while a *learned* source is latched re-opens learning for `relearn_ms` (5 s, Asterisk's learning timeout):
the learned source stays accepted meanwhile (no audio lost), and another source that completes a probation
run in that window replaces it (a phone that resumed from a new port). Strict mode follows the signalled
address.

Everything refused is counted (`refused`, RTCP in `rtcp_refused`; the first refused source is kept in `refused_from` for the call's
one diagnosis line) and dropped by the stream as `Drop.WRONG_SOURCE`; so are the packets of a probation run
(`probation_drops`). The hot path, a packet from the latched source, is one tuple comparison.

Addresses are compared as the shell gives them (host string, port): the shell normalises them (e.g. strips
IPv4-mapped IPv6 prefixes) the same way for the SDP and for `recvfrom`.
"""

from __future__ import annotations

from typing import Literal

from rtp.units import NS_PER_MS

__all__ = ["Address", "SourceLatch", "SourcePolicy", "SOURCE_POLICIES", "PROBATION"]

Address = tuple[str, int]
SourcePolicy = Literal["learn", "strict"]
SOURCE_POLICIES: tuple[SourcePolicy, ...] = ("learn", "strict")
PROBATION = 4  # consecutive packets a source other than the signalled one sends before it is taken (Asterisk)
RELEARN_MS = 5000  # learning re-opened by a re-INVITE while a learned source is latched (Asterisk's timeout)


class SourceLatch:
    """The source policy of one call's RTP socket."""

    __slots__ = (
        "_signalled",
        "nat",
        "learn",
        "probation",
        "_relatch_ns",
        "_relearn_ns",
        "_latched",
        "_ssrc",
        "_last_ns",
        "_learned",
        "_open_until",
        "_cand",
        "_cand_ssrc",
        "_cand_seq",
        "_cand_run",
        "refused",
        "refused_from",
        "relatches",
        "learned",
        "probation_drops",
        "rtcp_refused",
    )

    def __init__(
        self,
        signalled: Address | None,
        nat: bool = False,
        relatch_after_ms: int = 1000,
        *,
        policy: SourcePolicy = "learn",
        probation: int = PROBATION,
        relearn_ms: int = RELEARN_MS,
    ) -> None:
        self._signalled = signalled
        self.nat = nat
        self.learn = policy == "learn"
        self.probation = max(1, probation)
        self._relatch_ns = relatch_after_ms * NS_PER_MS
        self._relearn_ns = relearn_ms * NS_PER_MS
        self._latched: Address | None = None
        self._ssrc = -1
        self._last_ns = 0
        self._learned = False  # the latched source is a learned one, not the signalled address
        self._open_until: int | None = None  # learning re-opened while a learned source stays latched
        self._cand: Address | None = None  # the probation run under way: source, SSRC, next sequence, length
        self._cand_ssrc = -1
        self._cand_seq = -1
        self._cand_run = 0
        self.refused = 0
        self.refused_from: Address | None = None
        self.relatches = 0
        self.learned = 0  # sources latched by a probation run
        self.probation_drops = 0
        self.rtcp_refused = 0

    def signal(self, address: Address | None, now: int | None = None) -> None:
        """The peer signalled a (new) address (SDP answer, re-INVITE, UPDATE); see the module docstring.
        `now` (monotonic ns) times a re-opened learning window; without it the latch starts over."""
        same = address == self._signalled
        self._signalled = address
        self._cand = None
        self._cand_run = 0
        if self.nat or not self.learn or not same or now is None or self._latched is None:
            self._latched = None
            self._learned = False
            self._open_until = None
            self._ssrc = -1
        elif self._learned:
            self._open_until = now + self._relearn_ns

    @property
    def latched(self) -> Address | None:
        return self._latched

    @property
    def signalled(self) -> Address | None:
        return self._signalled

    @property
    def candidate(self) -> Address | None:
        """The source of the probation run under way (None: none)."""
        return self._cand

    @property
    def destination(self) -> Address | None:
        """Where to send RTP: in NAT mode the latched source once there is one, else the signalled address."""
        if self.nat and self._latched is not None:
            return self._latched
        return self._signalled if self._signalled is not None else self._latched

    def accept(self, source: Address, ssrc: int, now: int, seq: int = -1) -> bool:
        """Whether a valid RTP packet from `source` (`ssrc`, sequence number `seq`) is taken (noted if so)."""
        latched = self._latched
        if latched is not None and source == latched:
            self._last_ns = now
            self._ssrc = ssrc
            return True
        if self.nat:
            return self._accept_nat(source, ssrc, now, latched)
        if source == self._signalled:
            if latched is None or self._learned:  # the SDP's address outranks a learned source
                if latched is not None:
                    self.relatches += 1
                self._take(source, ssrc, now, learned=False)
                return True
        elif self.learn and (latched is None or self._open(now)):
            return self._probe(source, ssrc, seq, now)
        return self._refuse(source)

    def _accept_nat(self, source: Address, ssrc: int, now: int, latched: Address | None) -> bool:
        if latched is None:
            self._take(source, ssrc, now, learned=False)
            return True
        if ssrc != self._ssrc and now - self._last_ns >= self._relatch_ns:
            self._take(source, ssrc, now, learned=False)
            self.relatches += 1
            return True
        return self._refuse(source)

    def _open(self, now: int) -> bool:
        until = self._open_until
        if until is None:
            return False
        if now < until:
            return True
        self._open_until = None
        self._cand = None
        return False

    def _probe(self, source: Address, ssrc: int, seq: int, now: int) -> bool:
        """One packet of a candidate source: it extends the run or starts a new one; a full run latches."""
        if source == self._cand and ssrc == self._cand_ssrc and seq == self._cand_seq and seq >= 0:
            self._cand_run += 1
        else:
            self._cand, self._cand_ssrc, self._cand_run = source, ssrc, 1
        self._cand_seq = (seq + 1) & 0xFFFF if seq >= 0 else -1
        if self._cand_run < self.probation:
            self.probation_drops += 1
            return False
        if self._latched is not None:
            self.relatches += 1
        self._take(source, ssrc, now, learned=True)
        self.learned += 1
        return True

    def _take(self, source: Address, ssrc: int, now: int, *, learned: bool) -> None:
        self._latched = source
        self._learned = learned
        self._ssrc, self._last_ns = ssrc, now
        self._open_until = None
        self._cand = None
        self._cand_run = 0

    def _refuse(self, source: Address) -> bool:
        self.refused += 1
        if self.refused_from is None:
            self.refused_from = source
        return False

    def accept_rtcp(self, source: Address) -> bool:
        """RTCP is taken from the host RTP comes from (before any RTP, the signalled host), any port."""
        ref = self._latched if self._latched is not None else self._signalled
        if ref is not None and source[0] == ref[0]:
            return True
        if ref is None and self.nat:
            return True
        self.rtcp_refused += 1
        return False
