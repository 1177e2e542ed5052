"""The limits that end a call nobody ends, sans-I/O: a maximum duration (with the goodbye's grace and the
backstop BYE after it), an RTP inactivity timeout and a hold limit. No clock, no I/O: the call's media core
(rtp/media.py `CallMedia`) keeps the time of the last caller packet the stream took and folds `deadline` into its
own, which the engine compares with `now` once per 20 ms slot (one integer comparison); only then is
`check(now, last_rtp)` asked, which says what to do (`Action`), once, or re-arms `deadline`.

The rules (what a telephony engineer expects of a trunk-facing UA; Asterisk's `rtptimeout`/`rtpholdtimeout`
are the same pair):
- `max_call_duration_s`: the call ends this long after its media started, whatever happens.
- `rtp_timeout_s`: the call ends when the caller, who by its SDP sends to us, has sent no RTP the stream took
  for this long. It is suspended while the caller by its SDP sends nothing (on hold: sendonly, inactive or
  c=0.0.0.0 from its side, or a recvonly stream), and it starts again from the moment the caller resumes:
  the silence of the hold never counts, so a call taken off hold is not ended at once for the RTP that did
  not come while it was held.
- `hold_timeout_s`: the call ends when it stays held (the RTP timeout suspended) for this long in one
  stretch: a caller that put the bridge on hold and vanished (its BYE lost) does not keep a paid provider
  connection for ever. A call that starts held (an initial offer that is inactive) is held from the start.
- the goodbye (`goodbye_grace_s`, set when the session asked to say it itself, `bridge.engine.telephony.TimeLimitedLeg`):
  at the maximum duration the shell asks the session for a goodbye instead of hanging up at once; if the call is
  still up `goodbye_grace_s` later, `check` says "backstop" and the shell sends the BYE all the same (a session
  that failed or hung must not keep the call up). The RTP and hold limits never wait for a goodbye: nobody is
  listening.
None or 0 switches a limit off. The first limit reached is the only one reported (then the backstop, if a
goodbye was asked for): the shell then hangs up.
"""

from __future__ import annotations

from typing import Literal

from rtp.units import NS_PER_S

__all__ = ["NEVER", "Action", "CallLimits", "Limit"]

Limit = Literal["max_call_duration", "rtp_timeout", "hold_timeout"]
Action = Literal["max_call_duration", "rtp_timeout", "hold_timeout", "backstop"]
NEVER = 1 << 62  # a deadline that never comes (an int: the media tick compares it with `now`)


def _ns(seconds: float | None) -> int | None:
    return int(seconds * NS_PER_S) if seconds else None


class CallLimits:
    """One call's limits from `now` (the media start, which counts as a caller packet); see the module
    docstring. `silent`: the caller sends nothing by its SDP (held) at the start."""

    __slots__ = (
        "_backstop_at",
        "_end_at",
        "_grace_ns",
        "_hold_ns",
        "_held_since",
        "_rtp_ns",
        "_rtp_since",
        "deadline",
        "reached",
    )

    def __init__(
        self,
        now: int,
        *,
        max_call_duration_s: float | None = None,
        rtp_timeout_s: float | None = None,
        hold_timeout_s: float | None = None,
        silent: bool = False,
        goodbye_grace_s: float | None = None,
    ) -> None:
        duration = _ns(max_call_duration_s)
        self._end_at = now + duration if duration is not None else NEVER
        self._rtp_ns = _ns(rtp_timeout_s)
        self._hold_ns = _ns(hold_timeout_s)
        self._rtp_since = now  # the RTP timeout counts from here (or from a later caller packet)
        self._held_since: int | None = now if silent else None
        self._grace_ns: int | None = None
        self._backstop_at = NEVER
        self.reached: Limit | None = None
        self.deadline = NEVER
        self._arm()
        self.goodbye(goodbye_grace_s)

    def goodbye(self, grace_s: float | None) -> None:
        """At the maximum duration, ask for a goodbye and BYE `grace_s` later if the call is still up (None: BYE
        at once). Takes effect for a limit not reached yet."""
        self._grace_ns = int(grace_s * NS_PER_S) if grace_s is not None else None

    @property
    def held(self) -> bool:
        return self._held_since is not None

    def media_changed(self, now: int, silent: bool) -> None:
        """A re-INVITE/UPDATE changed whether the caller sends (hold, resume): the hold limit starts with a
        hold; the RTP timeout starts again from a resume."""
        if silent and self._held_since is None:
            self._held_since = now
        elif not silent and self._held_since is not None:
            self._held_since = None
            self._rtp_since = now
        if self.reached is None:
            self._arm()

    def check(self, now: int, last_rtp: int) -> Action | None:
        """At or after `deadline`: the limit reached (reported once; `deadline` is then NEVER, or the backstop's
        when a goodbye was asked for, which is reported once too), else None with `deadline` re-armed.
        `last_rtp`: when the stream last took a caller packet."""
        if self.reached is not None:
            if now < self._backstop_at:
                return None
            self._backstop_at = self.deadline = NEVER
            return "backstop"
        if now >= self._end_at:
            reached = self._reach("max_call_duration")
            if self._grace_ns is not None:
                self._backstop_at = self.deadline = now + self._grace_ns
            return reached
        if self._held_since is not None:
            if self._hold_ns is not None and now - self._held_since >= self._hold_ns:
                return self._reach("hold_timeout")
        elif self._rtp_ns is not None:
            self._rtp_since = max(self._rtp_since, last_rtp)
            if now - self._rtp_since >= self._rtp_ns:
                return self._reach("rtp_timeout")
        self._arm()
        return None

    def _reach(self, limit: Limit) -> Limit:
        self.reached = limit
        self.deadline = NEVER
        return limit

    def _arm(self) -> None:
        deadline = self._end_at
        if self._held_since is not None:
            if self._hold_ns is not None:
                deadline = min(deadline, self._held_since + self._hold_ns)
        elif self._rtp_ns is not None:
            deadline = min(deadline, self._rtp_since + self._rtp_ns)
        self.deadline = deadline
