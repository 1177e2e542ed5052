"""Session timers (RFC 4028), sans-I/O: reading Session-Expires and Min-SE, and the choices a call makes with
them. The state (interval, who refreshes, the two deadlines) lives on the call (`sip.core.call.Call`); these are the
rules it follows.

- As UAS (§9): the caller's interval and refresher are accepted (a Session-Expires below our Min-SE gets 422
  with Min-SE before we get here). When the caller asks for none we ask for `UaConfig.session_expires_s`: with
  refresher=uac (and Require: timer) when it supports "timer", else refresher=uas (a UAC without the extension
  cannot refresh, so we do). A refresh without Session-Expires keeps the session's timer.
- As UAC (§7.1, §7.4): the INVITE offers `session_expires_s` with our Min-SE; after a 422 its Min-SE is ours.
- The refresher refreshes at half the interval; the other side gives up when the interval passes less
  min(32 s, interval/3) (§10).
"""

from __future__ import annotations

from rtp.units import NS_PER_S
from sip.core.message import Message
from sip.core.uabase import SUPPORTED, has_option


def supports_timer(message: Message) -> bool:
    return has_option(message, "Supported", "timer") or has_option(message, "Require", "timer")


def session_expires(message: Message) -> tuple[int | None, str | None]:
    """(delta-seconds, refresher) of Session-Expires (RFC 4028 §4), or (None, None); ValueError if bad."""
    value = message.headers.get("Session-Expires")
    if value is None:
        return None, None
    number, _, params = value.partition(";")
    if not number.strip().isdigit():
        raise ValueError("bad Session-Expires")
    refresher: str | None = None
    for param in params.split(";"):
        name, _, val = param.partition("=")
        if name.strip().lower() == "refresher":
            refresher = val.strip().lower()
            if refresher not in ("uac", "uas"):
                raise ValueError("bad Session-Expires refresher")
    return int(number.strip()), refresher


def session_expires_or_none(message: Message) -> tuple[int | None, str | None]:
    try:
        return session_expires(message)
    except ValueError:
        return None, None


def min_se(message: Message) -> int | None:
    value = message.headers.get("Min-SE")
    if value is None:
        return None
    number = value.split(";", 1)[0].strip()
    if not number.isdigit():
        raise ValueError("bad Min-SE")
    return int(number)


def check_refresh(request: Message, min_se_s: int) -> int:
    """0 when a re-INVITE/UPDATE's session timer headers may be accepted; 400 (unreadable) or 422 (an interval
    below our Min-SE)."""
    try:
        expires, _ = session_expires(request)
        min_se(request)
    except ValueError:
        return 400
    if expires is not None and expires < min_se_s:
        return 422
    return 0


def answer_timer(
    request: Message, current: int | None, we_refresh: bool, *, asked_s: int, min_se_s: int
) -> tuple[int | None, bool, tuple[tuple[str, str], ...]]:
    """The interval and refresher our 2xx to `request` sets (§9), and its headers: (interval or None for no
    timer, whether we refresh, headers). `current`/`we_refresh`: the session's timer so far (None: none)."""
    expires, refresher = session_expires(request)
    supports = supports_timer(request)
    if expires is None:
        if current is not None:  # a refresh without Session-Expires: keep the session's timer
            expires = current
            refresher = "uas" if we_refresh else "uac"
            if not supports:
                refresher = "uas"
        elif asked_s > 0:  # we ask for one; refresher below: uac if it can, else us
            expires = max(asked_s, min_se(request) or 0, min_se_s)
        else:
            return current, we_refresh, (("Supported", SUPPORTED),)
    if refresher is None:
        refresher = "uac" if supports else "uas"
    headers: list[tuple[str, str]] = [
        ("Supported", SUPPORTED),
        ("Session-Expires", f"{expires};refresher={refresher}"),
    ]
    if supports:
        headers.append(("Require", "timer"))
    return expires, refresher == "uas", tuple(headers)


def offered_timer(
    interval_s: int, min_se_s: int, *, min_se: int | None = None
) -> tuple[tuple[str, str], ...]:
    """Session-Expires and Min-SE of an INVITE we place (§7.1; after a 422 its Min-SE is ours, §7.4); none for
    an interval of 0."""
    if interval_s <= 0:
        return ()
    floor = max(min_se or 0, min_se_s)
    return (("Session-Expires", str(max(interval_s, floor))), ("Min-SE", str(floor)))


def timer_deadlines(now: int, interval_s: int | None, we_refresh: bool) -> tuple[int | None, int | None]:
    """(refresh at, expire at) of a session (re)started at `now` (§10): we refresh at half the interval, or
    the peer's refresh must have come by the interval less min(32 s, interval/3)."""
    if interval_s is None:
        return None, None
    interval = interval_s * NS_PER_S
    if we_refresh:
        return now + interval // 2, None
    return None, now + interval - min(32 * NS_PER_S, interval // 3)
