"""The console's live event feed (`GET /events`, Server-Sent Events) and the routes the page uses.

`ConsoleFeed` is a small publish/subscribe object, sans-I/O: `snapshot(now, calls)` diffs `status()`
snapshots into `call` (new or changed) and `gone` events; `notice(call_id, notice, now)` turns the session's
notices (captions, barge-ins, recovery and rollover stages) into events. Each subscriber has a bounded queue:
a slow browser never blocks a call — when its queue is full the oldest event is dropped and counted, and the
subscriber is told how many it missed (`dropped` in the next event it reads). The shell (`poll_status`) feeds
snapshots once a second; notices arrive whenever the session hands them over.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from bridge.engine.commands import BargedIn, RecoveryChanged, RolloverChanged, Transcript

DEFAULT_QUEUE = 256
POLL_INTERVAL_S = 1.0

StatusMap = Mapping[str, Callable[[], dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """One server-sent event: `kind` names it (call, gone, caption, barge_in, recovery, rollover)."""

    seq: int
    kind: str
    call_id: str
    data: dict[str, Any]

    def sse(self, dropped: int = 0) -> bytes:
        body = {"call_id": self.call_id, **self.data}
        if dropped:
            body["dropped"] = dropped
        return f"id: {self.seq}\nevent: {self.kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


@dataclass(slots=True)
class Subscription:
    """A subscriber's bounded queue; `dropped` counts events it lost by being slow."""

    maxlen: int
    queue: deque[FeedEvent] = field(default_factory=deque)
    dropped: int = 0
    unreported: int = 0
    wake: asyncio.Event | None = None

    def offer(self, event: FeedEvent) -> None:
        if len(self.queue) >= self.maxlen:
            self.queue.popleft()
            self.dropped += 1
            self.unreported += 1
        self.queue.append(event)
        if self.wake is not None:
            self.wake.set()

    def take(self) -> tuple[FeedEvent, int] | None:
        """The oldest event and how many were dropped before it (reported once)."""
        if not self.queue:
            return None
        dropped, self.unreported = self.unreported, 0
        return self.queue.popleft(), dropped


def _rollover(status: Any) -> dict[str, Any] | None:
    """The rollover fields the console shows (its connection ages move on every poll: left out)."""
    if not isinstance(status, dict):
        return None
    return {k: status.get(k) for k in ("stage", "current", "next", "rollovers", "refusal")}


def _summary(status: dict[str, Any]) -> dict[str, Any]:
    """What the console shows of one `status()`: list columns and the per-call panel."""
    reservoir = status.get("reservoir") or {}
    return {
        "from": status.get("from"),
        "to": status.get("to"),
        "called": status.get("called"),
        "source": status.get("source"),
        "provider": status.get("provider"),
        "state": status.get("state"),
        "engine": status.get("engine"),
        "channel": status.get("channel"),
        "duration_ms": status.get("duration_ms"),
        "output_recovery": status.get("output_recovery"),
        "rollover": _rollover(status.get("rollover")),
        "transport_token": status.get("transport_token"),
        "reservoir_ms": reservoir.get("depth_ms"),
        "qos": status.get("qos"),
        "playback": status.get("playback"),
    }


_STAGES = ("state", "output_recovery", "rollover", "transport_token")


class ConsoleFeed:
    """Publish/subscribe of console events; never blocks a publisher."""

    def __init__(self, queue_len: int = DEFAULT_QUEUE) -> None:
        self._queue_len = queue_len
        self._subs: list[Subscription] = []
        self._last: dict[str, dict[str, Any]] = {}
        self._seq = 0
        self.published = 0

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def subscribe(self, *, wake: asyncio.Event | None = None, maxlen: int | None = None) -> Subscription:
        """A new subscriber, primed with the current calls (so a fresh page draws the list at once)."""
        sub = Subscription(maxlen or self._queue_len, wake=wake)
        for call_id, summary in self._last.items():
            sub.offer(self._event("call", call_id, summary))
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)

    def publish(self, kind: str, call_id: str, data: dict[str, Any]) -> None:
        event = self._event(kind, call_id, data)
        self.published += 1
        for sub in self._subs:
            sub.offer(event)

    def snapshot(self, calls: Mapping[str, dict[str, Any]], *, full: bool = True) -> None:
        """Diff a set of `status()` results against the previous one: `call` when new or changed, `gone` when
        it left. With `full` false only a change of state, recovery or rollover stage counts (the counters
        and the duration move on every poll), so a fast poll costs nothing while nothing happens."""
        for call_id, status in calls.items():
            summary = _summary(status)
            last = self._last.get(call_id)
            changed = (
                last != summary
                if full
                else last is None or any(last.get(k) != summary.get(k) for k in _STAGES)
            )
            if changed:
                self._last[call_id] = summary
                self.publish("call", call_id, summary)
        for call_id in [c for c in self._last if c not in calls]:
            del self._last[call_id]
            self.publish("gone", call_id, {})

    def notice(self, call_id: str, notice: object) -> None:
        """A session notice, as it happens (the hook the session calls beside `bridge.server.log.log_notice`)."""
        if isinstance(notice, Transcript):
            self.publish(
                "caption",
                call_id,
                {
                    "role": notice.role,
                    "text": notice.text,
                    "at_ms": notice.at_ms,
                    "final": notice.final,
                    "epoch": notice.caption_epoch,
                },
            )
        elif isinstance(notice, BargedIn):
            self.publish(
                "barge_in",
                call_id,
                {
                    "at_ms": notice.at_ms,
                    "source": notice.source,
                    "cleared_ms": notice.cleared_ms,
                    "heard": [list(h) for h in notice.heard],
                },
            )
        elif isinstance(notice, RecoveryChanged):
            self.publish(
                "recovery",
                call_id,
                {
                    "stage": notice.stage,
                    "token": notice.token,
                    "cause": notice.cause,
                    "elapsed_ms": notice.elapsed_ms,
                },
            )
        elif isinstance(notice, RolloverChanged):
            self.publish(
                "rollover",
                call_id,
                {
                    "what": notice.what,
                    "connection_id": notice.connection_id,
                    "detail": notice.detail,
                    "at_ms": notice.at_ms,
                },
            )

    def forget(self) -> None:
        """Drop the last snapshot (no subscriber is left to diff it for)."""
        self._last.clear()

    def _event(self, kind: str, call_id: str, data: dict[str, Any]) -> FeedEvent:
        self._seq += 1
        return FeedEvent(self._seq, kind, call_id, data)


def collect(source: StatusMap) -> dict[str, dict[str, Any]]:
    """Every call's `status()` now; a status function that fails is skipped (the call is ending)."""
    out: dict[str, dict[str, Any]] = {}
    for call_id, status in list(source.items()):
        try:
            out[call_id] = status()
        except Exception:  # a session tearing down: it shows as gone on the next poll at worst
            continue
    return out


async def poll_status(
    feed: ConsoleFeed,
    source: Callable[[], StatusMap],
    interval_s: float = POLL_INTERVAL_S,
    fast_per_full: int = 4,
) -> None:
    """The shell: a `status()` snapshot into the feed `fast_per_full` times per `interval_s` (stage changes),
    a full one every `interval_s` (counters, duration), until cancelled."""
    n = 0
    while True:
        if feed.subscribers:
            feed.snapshot(collect(source()), full=n % fast_per_full == 0)
            n += 1
        else:
            feed.forget()  # nobody watches: no status() calls at all; the next page is primed afresh
            n = 0
        await asyncio.sleep(interval_s / fast_per_full)


STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console.css": ("console.css", "text/css; charset=utf-8"),
}


def static_file(path: str) -> tuple[bytes, str] | None:
    """The console's page and assets (package data in bridge/server/console/), or None."""
    entry = STATIC.get(path)
    if entry is None:
        return None
    name, ctype = entry
    return resources.files("bridge.server").joinpath("console", name).read_bytes(), ctype


# What aiortc can use of a STUN URL (RFC 7064): `stun:HOST[:PORT]`; `stuns:` (TLS) and IPv6 literals it would
# drop silently, so they are refused.
_STUN_URL = re.compile(
    r"stun:(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)(?::(?P<port>[0-9]{1,5}))?"
)


def parse_stun_url(url: str) -> str:
    """A STUN server's URL, checked: `stun:HOST[:PORT]` (port 3478 by default); ValueError otherwise."""
    match = _STUN_URL.fullmatch(url.strip())
    if match is None or (match["port"] is not None and not 0 < int(match["port"]) < 65536):
        raise ValueError(f"expected stun:HOST[:PORT] (no stuns:, no IPv6 literal); got {url!r}")
    return match[0]


def parse_webrtc_address(text: str) -> str:
    """The address WebRTC candidates are gathered on: one IP address of this host, not a wildcard (leave the
    option out for every interface address); ValueError otherwise. Whether it is this host's is checked when
    the channel starts (bridge/server/browser.py)."""
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        raise ValueError(f"expected an IP address of this host; got {text!r}") from None
    if address.is_unspecified or address.is_multicast:
        raise ValueError(
            f"expected one address of this host; got {text!r} (leave the option out: a listener on a wildcard "
            "gathers on every interface address)"
        )
    return str(address)


@dataclass(frozen=True)
class ConsoleHooks:
    """What the HTTP listener needs beyond `status()` to serve the console: the feed, hang-up and (when the
    browser channel is on) the WebRTC offer/answer. `talk` returns (call id, answer SDP); ValueError is a 400.
    `ice_servers` (STUN URLs) is what the page's RTCPeerConnection is given (`GET /talk`)."""

    feed: ConsoleFeed
    hangup: Callable[[str], bool]
    talk: Callable[[str, str], Awaitable[tuple[str, str]]] | None = None
    ice_servers: tuple[str, ...] = ()

    def rtc_configuration(self) -> dict[str, Any]:
        """The page's RTCConfiguration: the configured STUN servers, no others (a browser's own default is none)."""
        return {"iceServers": [{"urls": list(self.ice_servers)}] if self.ice_servers else []}
