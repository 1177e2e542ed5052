"""Application events and the call record: what the application, the webhook and the CDR are told.

`RecordBuilder` is a sans-I/O core fed the session's existing notices (bridge/engine/commands.py: `Transcript`,
`BargedIn`, `RecoveryChanged`, `RolloverChanged`; bridge/engine/delegations.py: `WorkUncertain`) with `now`, and
reading the carrier ledger (rtp/ledger.py) for what was actually transmitted to the caller. It returns the
events in order:

- `CallStarted`: once, when the call's session begins (identity, route, provider).
- `Utterance`: each caller utterance (its final transcript; start and end on the session timeline) and each
  assistant utterance. An assistant utterance is timed by the ledger, never by the model's text: its start and
  end are when its first and last frames were handed to the carrier, and `heard_ms` is how much of it left.
  A reply whose frames still leave when the next reply's text comes (the provider streams faster than real
  time: a greeting and a goodbye asked right after it) is closed when its audio is over, before the next one.
  When the caller barged in, `cut` says when (session ms) and how far each interrupted item had been
  transmitted at that moment (`BargedIn.heard`, read from the ledger by bridge/engine/barrier.py).
  An assistant utterance that answers a turn carries its `latency` (`TurnLatency`, bridge/engine/latency.py):
  the caller's speech end, the first audio's arrival (the engine's `TurnTiming`), the first frame out (the
  ledger's first frame of that item) and, when cut, how much of it had left; the provider's share and the
  bridge's.
- `UncertainWork` (S8): work whose outcome became uncertain, from the job ledger's `WorkUncertain` notice
  (bridge/engine/delegations.py): each request (job id, tool, bounded arguments) with what is known of its outcome —
  `unknown` (sent on a connection lost before it acknowledged it, HR6), `cut_off` (still running when the
  session ended, after the grace) or `not_delivered` (answered, never given to the model).
- `AmdResult`: an outbound call's answering-machine detection (bridge/engine/amd.py, on by `[outbound] amd`): the
  verdict (`human`, `machine`, `beep`, `silence`, `unknown`) with its reason and the ms from the answer, then
  for a machine the beep (`beep`) or its absence (`no_beep`). The record keeps both (`amd`), and the action that
  followed (`amd_action`: talk, message or hang_up, chosen by the route or the application; not an event).
- `EarlyMediaReport`: the far end's early media on an outbound call (bridge/engine/early_media.py): when it
  started (the 183 or 180 that brought it), then how it ended — the answer, or a failure after it (an
  announcement, then 404 or 486) — and how long it lasted. The record keeps the last (`early_media`), and the
  end reason of a call that failed after it says so.
- (no event) the recording's pauses (`RecordingChanged`, from the session shell) and payment-card collections
  (bridge/engine/card.py `CardEnded`: the outcome, never a digit): the record lists both (`recording_gaps`,
  `card_collections`); each warm transfer's outcome (bridge/engine/warm_transfer.py `TransferResult`, from the
  session shell): `transfers`.
- `CallEnded`: the `CallRecord` — duration, who hung up and why, SIP status, provider and connections used,
  recoveries and rollovers, the uncertain work, QoS (`status()["qos"]`), usage with `complete` (HR12,
  bridge/engine/usage.py), its split and price (`cost`: conversation, recovery and rollover replay) and the
  turns' latency (`LatencySummary`: p50 and max of each share, the last `KEPT`
  turns).

An assistant utterance opens with its first transcript (or with the first frame a barge-in cuts) and closes
when the caller barges in, or once nothing of it has been transmitted for `quiet_ms` (the timer: the builder
has `next_deadline()` and `handle_timer(now)`), or at the end of the call. Each ledger item belongs to one
utterance.

Every event has `to_json()`: the webhook's body and, for the record, the CDR line (`CallRecord.cdr_line`).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from bridge.engine.amd import AmdBeep, AmdNoBeep, AmdStart, AmdVerdict
from bridge.engine.card import CardEnded
from bridge.engine.commands import (
    BargedIn,
    DisclosureResult,
    RecoveryChanged,
    RolloverChanged,
    Transcript,
    TurnTiming,
)
from bridge.engine.connections import connection_id
from bridge.engine.delegations import UncertainItem, WorkUncertain
from bridge.engine.disclosure import ANNOUNCEMENT_ITEMS, Disclosure, text_result
from bridge.engine.early_media import EarlyMedia
from bridge.engine.warm_transfer import TransferResult
from rtp.audio import FRAME_MS
from rtp.ledger import ItemProgress, LedgerEntry
from rtp.units import NS_PER_MS
from sip.core.attestation import ABSENT, Attestation, attestation_of
from sip.leg import CallIdentity

FRAME_NS = FRAME_MS * NS_PER_MS
# A reply whose last frame left this recently (past its own 20 ms) is still playing when the next reply's text
# comes: a provider streams faster than real time, so a greeting and the goodbye asked right after it (a
# budget's, the no-input room's) are both queued while the first plays. Three frames of pacing slack.
STILL_PLAYING_NS = 3 * FRAME_NS

FINAL_MESSAGE_ITEM = (
    "final-message"  # bridge/engine/reservoir.py: the closing message, not an utterance of the model
)


@dataclass(frozen=True, slots=True)
class RecordingChanged:
    """The call's recording paused or resumed (bridge/server/recording.py): `by` "application", "model" or
    "card" (a payment-card collection, bridge/engine/card.py); `at_ms` on the session timeline, which is the
    recording's own clock: the WAV begins at 0 there, or with a recording consent at `recording_start_ms`
    (the record's `recording_gaps` are offsets into the WAV: `_gaps_in_wav`)."""

    paused: bool
    by: str
    at_ms: int


RECORD_NOTICES = (
    Transcript,
    BargedIn,
    RecoveryChanged,
    RolloverChanged,
    WorkUncertain,
    AmdVerdict,
    AmdBeep,
    AmdNoBeep,
    DisclosureResult,
    AmdStart,
    EarlyMedia,
    TurnTiming,
    CardEnded,
    RecordingChanged,
    TransferResult,
)
"""The notice types the builder reads (a shell may drop every other notice before queueing it)."""


class LedgerView(Protocol):
    """What the builder reads of the carrier ledger (rtp.ledger.CarrierLedger)."""

    @property
    def frames_transmitted(self) -> int: ...

    def items_between(self, after_ns: int, until_ns: int) -> list[str]: ...

    def last(self) -> LedgerEntry | None: ...

    def progress(self, item_id: str) -> ItemProgress | None: ...


# --- the events ---


@dataclass(frozen=True, slots=True)
class CallInfo:
    """Who called whom: the call's identity as the SIP engine reported it, its route and provider."""

    call_id: str
    sip_call_id: str
    from_uri: str
    to_uri: str
    called: str
    source: str
    route: str | None
    provider: str
    trunk: str | None = None  # the trunk the call came in on (sip/core/trunks.py); None: none matched
    # STIR/SHAKEN as the carrier gave it (sip/core/attestation.py): verstat, the PASSporT's level, never verified
    attestation: Attestation = ABSENT
    # the allowlisted inbound headers, cleaned and bounded, and the caller ID's rule (sip/core/app_headers.py)
    sip_headers: tuple[tuple[str, str], ...] = ()
    headers_dropped: int = 0
    headers_cut: int = 0
    caller: str = ""
    diverted_from: str = ""
    identity_trusted: bool = False

    @classmethod
    def of(cls, identity: CallIdentity, *, route: str | None, provider: str) -> CallInfo:
        return cls(
            identity.call_id,
            identity.sip_call_id,
            identity.from_uri,
            identity.to_uri,
            identity.request_user,
            identity.source,
            route,
            provider,
            identity.trunk,
            attestation_of(identity.from_uri, identity.headers)
            if identity.direction == "inbound"
            else ABSENT,
            identity.sip_headers,
            identity.headers_dropped,
            identity.headers_cut,
            identity.caller,
            identity.diverted_from,
            identity.identity_trusted,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "sip_call_id": self.sip_call_id,
            "from": self.from_uri,
            "to": self.to_uri,
            "called": self.called,
            "source": self.source,
            "route": self.route,
            "provider": self.provider,
            "trunk": self.trunk,
            "attestation": self.attestation.to_json(),
            "caller": self.caller,
            "diverted_from": self.diverted_from,
            "identity_trusted": self.identity_trusted,
            "sip_headers": [[name, value] for name, value in self.sip_headers],
            "sip_headers_dropped": self.headers_dropped,
            "sip_headers_cut": self.headers_cut,
        }


@dataclass(frozen=True, slots=True)
class CallStarted:
    call: CallInfo
    started_at: float  # unix time (s) the session began

    def to_json(self) -> dict[str, Any]:
        return {"event": "call_started", "call": self.call.to_json(), "started_at": self.started_at}


@dataclass(frozen=True, slots=True)
class Cut:
    """An assistant utterance the caller interrupted: when, and what had been transmitted by then."""

    at_ms: int  # the barge-in, on the session timeline
    source: str  # "provider" (its speech-started / interrupted event) or "local_vad"
    items: tuple[tuple[str, int], ...]  # each interrupted item and the ms of it transmitted (the ledger)


@dataclass(frozen=True, slots=True)
class TurnLatency:
    """One assistant turn's times, ms on the session timeline (bridge/engine/latency.py says how each is taken):
    the caller's speech end on the wire (None: the item answers no caller turn), the first audio's arrival, the
    first frame handed to the carrier (None: none of it left), and on barge-in the ms of it transmitted."""

    kind: Literal["conversation", "recovery", "rollover"]
    speech_end_ms: int | None
    first_audio_ms: int
    first_frame_ms: int | None
    truncated_ms: int | None = None  # barge-in: how much of the answering item had left when it was cut

    @property
    def provider_ms(self) -> int | None:
        """The provider's share: its first audio after the caller's speech end."""
        return None if self.speech_end_ms is None else self.first_audio_ms - self.speech_end_ms

    @property
    def bridge_ms(self) -> int | None:
        """The bridge's share: from the first audio's arrival to its first frame out."""
        return None if self.first_frame_ms is None else self.first_frame_ms - self.first_audio_ms

    @property
    def wait_ms(self) -> int | None:
        """What the caller waited: from their speech end to the first frame out."""
        if self.speech_end_ms is None or self.first_frame_ms is None:
            return None
        return self.first_frame_ms - self.speech_end_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "speech_end_ms": self.speech_end_ms,
            "first_audio_ms": self.first_audio_ms,
            "first_frame_ms": self.first_frame_ms,
            "truncated_ms": self.truncated_ms,
            "provider_ms": self.provider_ms,
            "bridge_ms": self.bridge_ms,
            "wait_ms": self.wait_ms,
        }


@dataclass(frozen=True, slots=True)
class Utterance:
    """One caller or assistant utterance. Times are ms on the session timeline (None: not known)."""

    call_id: str
    seq: int  # 1, 2, ... in the order the utterances were complete
    role: Literal["caller", "assistant"]
    text: str
    start_ms: int | None
    end_ms: int | None
    heard_ms: int = 0  # assistant: audio of it transmitted to the carrier (ledger frames x 20 ms)
    cut: Cut | None = None  # assistant: the barge-in that cut it
    text_cut_chars: int = 0  # characters of the provider's text past MAX_TEXT_CHARS, not carried
    latency: TurnLatency | None = None  # assistant: the turn's times (None: no item of it was timed)

    @property
    def interrupted(self) -> bool:
        return self.cut is not None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "event": "utterance",
            "call_id": self.call_id,
            "seq": self.seq,
            "role": self.role,
            "text": self.text,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
        }
        if self.text_cut_chars:
            body["text_cut_chars"] = self.text_cut_chars
        if self.role == "assistant":
            cut = self.cut
            body["heard_ms"] = self.heard_ms
            body["interrupted"] = cut is not None
            body["cut"] = (
                None
                if cut is None
                else {"at_ms": cut.at_ms, "source": cut.source, "items": [list(i) for i in cut.items]}
            )
            if self.latency is not None:  # (absent when none of it was timed)
                body["latency"] = self.latency.to_json()
        return body


def bounded_text(text: str) -> tuple[str, int]:
    """`text` stripped and cut at MAX_TEXT_CHARS, and how many characters the cut dropped."""
    text = text.strip()
    over = len(text) - MAX_TEXT_CHARS
    return (text[:MAX_TEXT_CHARS], over) if over > 0 else (text, 0)


def arguments_json(text: str) -> object:
    """A job's arguments as the application is shown them: the JSON object parsed from the model's text, or,
    when that text is not a JSON object (or was cut), the raw text."""
    try:
        parsed = json.loads(text)
    except (ValueError, TypeError):
        parsed = None
    return parsed if isinstance(parsed, dict) else text


def uncertain_json(item: UncertainItem) -> dict[str, Any]:
    """One piece of uncertain work (S8): the request and what is known of its outcome."""
    return {
        "job_id": item.job_id,
        "name": item.name,
        "kind": item.kind,
        "arguments": arguments_json(item.arguments) if item.job_id is not None else item.arguments,
        "arguments_truncated": item.truncated,
        "requested_at_ms": item.requested_at_ms,
        "outcome": item.outcome,
        "detail": item.detail,
    }


@dataclass(frozen=True, slots=True)
class UncertainWork:
    """S8: work whose outcome became uncertain — commands a lost connection never acknowledged
    (`cause` "connection_lost"), jobs cut off and answers never delivered at the end ("session_ended")."""

    call_id: str
    seq: int  # 1, 2, ... within the call (the webhook's Idempotency-Key ends in work_uncertain-<seq>)
    cause: str
    at_ms: int  # on the session timeline
    items: tuple[UncertainItem, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "event": "work_uncertain",
            "call_id": self.call_id,
            "seq": self.seq,
            "cause": self.cause,
            "at_ms": self.at_ms,
            "items": [uncertain_json(i) for i in self.items],
        }


@dataclass(frozen=True, slots=True)
class AmdResult:
    """Answering-machine detection on an outbound call: `kind` "verdict" (then `verdict` is the detector's),
    "beep" or "no_beep" (after a machine); `since_answer_ms` from the callee's answer."""

    call_id: str
    kind: Literal["verdict", "beep", "no_beep"]
    verdict: str
    reason: str
    since_answer_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "event": "amd",
            "call_id": self.call_id,
            "kind": self.kind,
            "verdict": self.verdict,
            "reason": self.reason,
            "since_answer_ms": self.since_answer_ms,
        }


@dataclass(frozen=True, slots=True)
class EarlyMediaReport:
    """The far end's early media on an outbound call: `phase` "started" (`status` 183 or 180) or "ended"
    (`status` 200 and `outcome` "answered", or the final failure, e.g. 486 "486 Busy Here"); `at_ms` on the
    session timeline (the recording's), `duration_ms` how long it lasted; `to_provider` when the route gave it
    to the model too."""

    call_id: str
    phase: Literal["started", "ended"]
    status: int
    at_ms: int
    duration_ms: int
    outcome: str
    to_provider: bool

    @classmethod
    def of(cls, call_id: str, notice: EarlyMedia) -> EarlyMediaReport:
        return cls(
            call_id,
            notice.phase,
            notice.status,
            notice.at_ms,
            notice.duration_ms,
            notice.outcome,
            notice.to_provider,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "event": "early_media",
            "call_id": self.call_id,
            "phase": self.phase,
            "status": self.status,
            "at_ms": self.at_ms,
            "duration_ms": self.duration_ms,
            "outcome": self.outcome,
            "to_provider": self.to_provider,
        }


@dataclass(frozen=True, slots=True)
class UncertainEntry:
    """One piece of uncertain work as the call record lists it."""

    cause: str
    at_ms: int
    item: UncertainItem


@dataclass(frozen=True, slots=True)
class RecoveryEntry:
    connection_id: str  # the replacement connection
    cause: str
    outcome: Literal["recovered", "failed", "interrupted", "unfinished"]
    duration_ms: int | None  # from the condition to the outcome (None: the call ended first)


@dataclass(frozen=True, slots=True)
class RolloverEntry:
    connection_id: str  # the next connection (for a refusal: the one that could not be replaced)
    outcome: Literal["completed", "failed", "refused", "unfinished"]
    at_ms: int  # the outcome (or, unfinished, the opening) on the session timeline
    detail: str = ""


@dataclass(frozen=True, slots=True)
class UsageRecord:
    audio_seconds: float | None
    input_tokens: int
    output_tokens: int
    complete: bool  # every connection's usage was finalised by the provider (HR12)

    @classmethod
    def of(cls, usage: Mapping[str, Any]) -> UsageRecord:
        seconds = usage.get("audio_seconds")
        return cls(
            float(seconds) if isinstance(seconds, int | float) else None,
            int(usage.get("input_tokens") or 0),
            int(usage.get("output_tokens") or 0),
            bool(usage.get("complete", False)),
        )


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What the shell knows at the end of a call (bridge/server/session.py `CallSummary` and the final status)."""

    duration_s: float
    ended_by: str  # "caller", "bridge", "provider" or "unknown"
    reason: str
    sip_status: int  # 200 for an answered call, else the final response the caller got
    status: Mapping[str, Any]  # the session's final status(): its "qos" and "usage"
    frames_in: int
    frames_out: int
    recording: str | None = None  # the WAV file (`--record`)
    dial: Mapping[str, Any] | None = (
        None  # a placed call's attempt of its dial's series (bridge/engine/dial_retry.py)
    )
    recording_start_ms: int | None = None  # where the WAV begins on the session timeline (None: no recording)


class TurnLog:
    """The turns' latency as the record lists it: the last `KEPT` turns, a count of every one, and each share's
    maximum over all of them (the median is the kept turns': a long call's last 64)."""

    SHARES = ("provider_ms", "bridge_ms", "wait_ms")

    def __init__(self) -> None:
        self.kept: deque[TurnLatency] = deque(maxlen=KEPT)
        self.total = 0
        self.maxima: dict[str, int] = {}

    def add(self, turn: TurnLatency) -> None:
        self.kept.append(turn)
        self.total += 1
        maxima = self.maxima
        for share in self.SHARES:
            value = getattr(turn, share)
            if value is not None and value > maxima.get(share, value - 1):
                maxima[share] = value

    def summary(self) -> LatencySummary:
        return LatencySummary(tuple(self.kept), self.total, tuple(sorted(self.maxima.items())))


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """The record's `latency`: the last `KEPT` turns, how many there were, each share's maximum over all."""

    turns: tuple[TurnLatency, ...] = ()
    total: int = 0
    maxima: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        maxima = dict(self.maxima)
        body: dict[str, Any] = {"turns": self.total}
        for share in TurnLog.SHARES:
            values = sorted(v for t in self.turns if (v := getattr(t, share)) is not None)
            body[share] = {
                "p50": values[(len(values) - 1) // 2] if values else None,
                "max": maxima.get(share),
            }
        body["items"] = [t.to_json() for t in self.turns]
        return _counted(body, len(self.turns), self.total)


@dataclass(frozen=True, slots=True)
class CallRecord:
    call: CallInfo
    started_at: float  # unix s
    duration_s: float
    ended_by: str
    reason: str
    sip_status: int
    connections: tuple[str, ...]  # every provider connection opened, in order ("conn-1", ...)
    recoveries: tuple[RecoveryEntry, ...]
    rollovers: tuple[RolloverEntry, ...]
    qos: Mapping[str, Any]
    usage: UsageRecord
    frames_in: int
    frames_out: int  # frames transmitted to the carrier (the ledger)
    utterances: int
    barge_ins: int
    recording: str | None = None
    # Bounded: a long call's record keeps the last `KEPT` connections, recoveries and rollovers (the tuples
    # above) and counts every one: None means "the tuple is all of them".
    connections_total: int | None = None
    recoveries_total: int | None = None
    rollovers_total: int | None = None
    rollovers_completed: int | None = None
    uncertain: tuple[UncertainEntry, ...] = ()  # S8: the last `KEPT` pieces of uncertain work
    uncertain_total: int | None = None
    # No usable RTP from the caller a few seconds into the media: the cause (rtp/stream.py ONE_WAY_CAUSES),
    # read from the leg's RTP figures (qos["rtp"]["one_way_audio"]); None when audio came (or no figures)
    one_way_audio: str | None = None
    amd: tuple[AmdResult, ...] = ()  # an outbound call's machine detection: the verdict, then the beep
    # a call the bridge placed: which attempt of its dial it was, its outcome, and the next attempt or the series'
    # end (bridge/engine/dial_retry.py)
    dial: Mapping[str, Any] | None = None
    # the route's disclosure: delivered (the ledger shows it reached the carrier), partial or not_delivered, and
    # why (bridge/engine/disclosure.py); None: the route has none
    disclosure: DisclosureResult | None = None
    # what followed the verdict: {"action": talk | message | hang_up, "by": route | application, "verdict",
    # "since_answer_ms"} (bridge/engine/amd.py `AmdChoice`); None: no AMD, or the call ended before it
    amd_action: Mapping[str, Any] | None = None
    early_media: EarlyMediaReport | None = None  # the far end's early media (outbound), as it ended
    # the route's recording consent (bridge/server/recording.py): None, the route asks for none
    consent: ConsentStamp | None = None
    latency: LatencySummary = LatencySummary()  # the turns' times (bridge/engine/latency.py)
    # the usage split into conversation, recovery and rollover replay, its price and the route's budget
    # (bridge/engine/usage.py `UsageMeter.cost_status`); None: the session never started
    cost: Mapping[str, Any] | None = None
    # the recording's pauses: {"start_ms", "end_ms" (None: to the end), "by"}, offsets into the WAV; and each
    # payment-card collection's outcome (bridge/engine/card.py: never a digit)
    recording_gaps: tuple[Mapping[str, Any], ...] = ()
    card_collections: tuple[CardEnded, ...] = ()
    # each warm transfer's outcome (bridge/engine/warm_transfer.py): the target, the typed outcome, its SIP status
    transfers: tuple[TransferResult, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "call": self.call.to_json(),
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "ended_by": self.ended_by,
            "reason": self.reason,
            "sip_status": self.sip_status,
            "provider": self.call.provider,
            "connections": _counted(
                {"count": _total(self.connections_total, self.connections), "ids": list(self.connections)},
                len(self.connections),
                self.connections_total,
            ),
            "recoveries": _counted(
                {
                    "count": _total(self.recoveries_total, self.recoveries),
                    "items": [
                        {
                            "connection_id": r.connection_id,
                            "cause": r.cause,
                            "outcome": r.outcome,
                            "duration_ms": r.duration_ms,
                        }
                        for r in self.recoveries
                    ],
                },
                len(self.recoveries),
                self.recoveries_total,
            ),
            "rollovers": _counted(
                {
                    "count": sum(1 for r in self.rollovers if r.outcome == "completed")
                    if self.rollovers_completed is None
                    else self.rollovers_completed,
                    "items": [
                        {
                            "connection_id": r.connection_id,
                            "outcome": r.outcome,
                            "at_ms": r.at_ms,
                            "detail": r.detail,
                        }
                        for r in self.rollovers
                    ],
                },
                len(self.rollovers),
                self.rollovers_total,
            ),
            "uncertain": _counted(
                {
                    "count": _total(self.uncertain_total, self.uncertain),
                    "items": [
                        {"cause": u.cause, "at_ms": u.at_ms, **uncertain_json(u.item)} for u in self.uncertain
                    ],
                },
                len(self.uncertain),
                self.uncertain_total,
            ),
            "qos": dict(self.qos),
            "usage": {
                "audio_seconds": self.usage.audio_seconds,
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
                "complete": self.usage.complete,
            },
            "frames_in": self.frames_in,
            "frames_out": self.frames_out,
            "utterances": self.utterances,
            "barge_ins": self.barge_ins,
            "recording": self.recording,
            "one_way_audio": self.one_way_audio,
            "latency": self.latency.to_json(),
            "cost": None if self.cost is None else dict(self.cost),
            **({"amd": [_amd_json(a) for a in self.amd]} if self.amd else {}),
            **({"dial": dict(self.dial)} if self.dial is not None else {}),
            **({"disclosure": self.disclosure.to_json()} if self.disclosure is not None else {}),
            **({"amd_action": dict(self.amd_action)} if self.amd_action is not None else {}),
            **({"early_media": _early_json(self.early_media)} if self.early_media is not None else {}),
            **({"consent": self.consent.to_json()} if self.consent is not None else {}),
            **({"recording_gaps": [dict(g) for g in self.recording_gaps]} if self.recording_gaps else {}),
            **({"transfers": [_transfer_json(t) for t in self.transfers]} if self.transfers else {}),
            **(
                {
                    "card_collections": [
                        {"outcome": c.outcome, "started_ms": c.started_ms, "ended_ms": c.ended_ms, "by": c.by}
                        for c in self.card_collections
                    ]
                }
                if self.card_collections
                else {}
            ),
        }

    def cdr_line(self) -> str:
        """One line of `--cdr FILE`: the record as compact JSON (no newline inside)."""
        return json.dumps(self.to_json(), separators=(",", ":"), default=str)


@dataclass(frozen=True, slots=True)
class ConsentStamp:
    """The record's recording consent: whether the announcement was heard whole (`announced`), how (`wav`: a
    recording the bridge played, `text`: the model's first words), why not, when it ended on the wire (session
    ms, from the carrier ledger) and where the WAV begins (`recording_start_ms`; None: recording never started)."""

    announced: bool
    how: Literal["wav", "text"]
    outcome: str  # delivered, partial, not_delivered (DisclosureResult)
    reason: str
    ended_ms: int | None
    recording_start_ms: int | None

    @classmethod
    def of(cls, result: DisclosureResult, recording_start_ms: int | None) -> ConsentStamp:
        delivered = result.outcome == "delivered"
        return cls(
            delivered,
            "wav" if result.kind == "audio" else "text",
            result.outcome,
            result.reason,
            result.ended_ms if delivered else None,
            recording_start_ms if delivered else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "announced": self.announced,
            "how": self.how,
            "outcome": self.outcome,
            "reason": self.reason,
            "ended_ms": self.ended_ms,
            "recording_start_ms": self.recording_start_ms,
        }


def _amd_json(result: AmdResult) -> dict[str, Any]:
    body = result.to_json()
    del body["event"], body["call_id"]
    return body


def _early_json(report: EarlyMediaReport) -> dict[str, Any]:
    """The record's `early_media`: when it started, how long it lasted and how it ended ("answered", or the
    failure after it). `start_ms` and `duration_ms` place it in the recording."""
    start = report.at_ms - report.duration_ms if report.phase == "ended" else report.at_ms
    return {
        "start_ms": start,
        "duration_ms": report.duration_ms,
        "outcome": report.outcome or "unfinished",
        "status": report.status,
        "to_provider": report.to_provider,
    }


def _total(total: int | None, kept: tuple[object, ...]) -> int:
    return len(kept) if total is None else max(total, len(kept))


def _counted(body: dict[str, Any], kept: int, total: int | None) -> dict[str, Any]:
    """A CDR list that kept only the last of `total` (bounded): `omitted` says how many of the oldest its
    items leave out (absent when they are all there)."""
    if total is not None and total > kept:
        body["omitted"] = total - kept
    return body


@dataclass(frozen=True, slots=True)
class DialRow:
    """A CDR row that is no call's record: a dial refused before anything was sent (`kind` "dial_refused":
    the trunk's queue, the route's calling hours, the application's do-not-call hook; an inbound call refused for
    its failed attestation), or the end of a dial's attempt series (`kind` "dial_series", when it could have
    more than one attempt). `body` is the rest of the row."""

    kind: Literal["dial_refused", "dial_series", "call_refused"]
    at: float  # unix s
    body: Mapping[str, Any]

    @property
    def label(self) -> str:
        return str(self.body.get("series") or self.body.get("to") or self.kind)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "at": self.at, **self.body}

    def cdr_line(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), default=str)


@dataclass(frozen=True, slots=True)
class CallEnded:
    record: CallRecord

    def to_json(self) -> dict[str, Any]:
        return {"event": "call_ended", "call_id": self.record.call.call_id, "record": self.record.to_json()}


AppEvent = CallStarted | Utterance | UncertainWork | AmdResult | EarlyMediaReport | CallEnded


# --- the builder ---

KEPT = 64  # bounded: connections, recoveries and rollovers kept by name in a call's record (the last ones)
MAX_TEXT_CHARS = 8_192  # an utterance's text as records, events and webhooks carry it: about nine minutes of
# speech at 150 words a minute, far past any turn a provider transcribes; a longer text (a corrupt or hostile
# frame once sent 64 KiB as one caller transcript) is cut here, and the cut counted in `text_cut_chars`
CLAIMED_ITEMS = 64  # ledger items remembered as given to an utterance (as many as the carrier ledger times)
OPENING = 8  # rollover connections remembered as opening (one at a time; a recovery may abandon one)


class CallHistory:
    """What the record lists of a call's connections, recoveries and rollovers: the last `KEPT` of each by
    name, and a count of every one (a three-hour call with faults lists a bounded tail, its totals
    stay exact). Notices about a connection come while it lives, so an id that left the tail never returns."""

    def __init__(self, first: str) -> None:
        self.connections: dict[str, None] = {first: None}
        self.connections_total = 1
        self.recoveries: dict[int, tuple[str, str, int]] = {}  # token -> (cause, stage, elapsed)
        self.recoveries_total = 0
        self.rollovers: deque[RolloverEntry] = deque(maxlen=KEPT)
        self.rollovers_total = 0
        self.rollovers_completed = 0
        self.opening: dict[str, int] = {}  # rollover connections opening -> at_ms

    def connection(self, cid: str) -> None:
        if cid not in self.connections:
            self.connections[cid] = None
            self.connections_total += 1
            _trim(self.connections, KEPT)

    def recovery(self, token: int, cause: str, stage: str, elapsed_ms: int) -> None:
        if token not in self.recoveries:
            self.recoveries_total += 1
        self.recoveries[token] = (cause, stage, elapsed_ms)
        _trim(self.recoveries, KEPT)

    def rollover(self, entry: RolloverEntry) -> None:
        self.opening.pop(entry.connection_id, None)
        self.rollovers.append(entry)
        self.rollovers_total += 1
        self.rollovers_completed += entry.outcome == "completed"

    def opened(self, cid: str, at_ms: int) -> None:
        self.connection(cid)
        self.opening[cid] = at_ms
        while len(self.opening) > OPENING:  # abandoned by a recovery: it never ended as a rollover
            old = next(iter(self.opening))
            self.rollover(RolloverEntry(old, "unfinished", self.opening[old]))


def _trim(kept: dict[Any, Any], limit: int) -> None:
    while len(kept) > limit:
        del kept[next(iter(kept))]


@dataclass(slots=True)
class _Assistant:
    """The assistant utterance being heard now."""

    opened_ms: int
    last_text_ns: int
    parts: list[str] = field(default_factory=list)
    final_text: str | None = None
    items: dict[str, None] = field(default_factory=dict)  # ledger items, in order
    chars: int = 0  # the length of `parts` joined
    dropped: int = 0  # characters of fragments that came past MAX_TEXT_CHARS
    # why the rest of it was never heard, though no barge-in cut it: a provider recovery began while it played
    # (its output was cleared, HR3), or the call ended before it was over
    lost: str | None = None


class RecordBuilder:
    """One call's events and record (see the module docstring). Feed `notice(n, now)`; call `handle_timer`
    at `next_deadline()`; `finish(outcome, now)` gives the last events and the record."""

    def __init__(
        self,
        call: CallInfo,
        *,
        ledger: LedgerView,
        start_ns: int,
        started_at: float,
        first_token: int = 1,
        quiet_ms: int = 600,
        disclosure: Disclosure | None = None,
        consent: Disclosure | None = None,
    ) -> None:
        self.call = call
        self._consent = consent  # the recording consent: its outcome is `consent` (as the disclosure's)
        self.consent: DisclosureResult | None = None
        self._disclosure = (
            disclosure  # the route's: its outcome is `disclosure` (the gate's, or the first utterance's)
        )
        self.disclosure: DisclosureResult | None = None
        self._ledger = ledger
        self._start_ns = start_ns
        self._started_at = started_at
        self._quiet_ns = quiet_ms * NS_PER_MS
        self._seen_ns = start_ns - 1  # ledger entries up to here have been given to an utterance
        self._claimed: dict[str, None] = {}  # ledger items already given to an utterance (the last ones)
        self._open: _Assistant | None = None
        # replies that are over (a new one began) while their audio still leaves: each closes, in order, when
        # its audio is over (the quiet rule), before anything after it; its items are claimed already
        self._ending: list[_Assistant] = []
        self._seq = 0
        self.barge_ins = 0
        self.history = CallHistory(connection_id(first_token))
        self.uncertain: deque[UncertainEntry] = deque(maxlen=KEPT)  # S8
        self.uncertain_total = 0
        self._uncertain_seq = 0
        self.amd: list[AmdResult] = []  # at most a verdict and a beep (or its absence)
        self.amd_action: dict[str, Any] | None = None
        self.early_media: EarlyMediaReport | None = None  # the last early-media report (outbound)
        self._timings: dict[str, TurnTiming] = {}  # the items' first audio, until their utterance closes
        self.turns = TurnLog()
        self.recording_gaps: deque[dict[str, Any]] = deque(maxlen=KEPT)  # the last ones
        self.card_collections: deque[CardEnded] = deque(maxlen=KEPT)
        self.transfers: deque[TransferResult] = deque(maxlen=KEPT)  # warm transfers' outcomes

    def started(self) -> CallStarted:
        return CallStarted(self.call, self._started_at)

    def _ms(self, ns: int) -> int:
        return (ns - self._start_ns) // NS_PER_MS

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    # --- inputs ---

    def notice(self, notice: object, now: int) -> list[AppEvent]:
        """One of the session's notices; anything the builder does not read is ignored."""
        out: list[AppEvent] = []
        if isinstance(notice, Transcript):
            if notice.role == "caller":
                text, cut_chars = bounded_text(notice.text)
                if notice.final and text:
                    out.append(
                        Utterance(
                            self.call.call_id,
                            self._next(),
                            "caller",
                            text,
                            notice.at_ms,
                            notice.end_ms,
                            text_cut_chars=cut_chars,
                        )
                    )
            else:
                self._assistant_text(notice, now, out)
        elif isinstance(notice, BargedIn):
            self._barged_in(notice, now, out)
        elif isinstance(notice, RecoveryChanged):
            self.history.connection(connection_id(notice.token))
            if notice.stage == "reconnecting":
                for cut_off in (*self._ending, *([self._open] if self._open is not None else [])):
                    cut_off.lost = cut_off.lost or "a provider recovery cut it"
            if notice.stage not in ("awaiting_user",):
                self.history.recovery(notice.token, notice.cause, notice.stage, notice.elapsed_ms)
        elif isinstance(notice, RolloverChanged):
            self._rollover(notice)
        elif isinstance(notice, WorkUncertain):
            out.append(self._uncertain(notice))
        elif isinstance(
            notice, AmdStart
        ):  # the record's, not an event: the application chose it or was asked
            self.amd_action = {
                "action": notice.action,
                "by": notice.by,
                "verdict": notice.verdict,
                "since_answer_ms": notice.since_answer_ms,
            }
        elif isinstance(notice, AmdVerdict | AmdBeep | AmdNoBeep):
            if isinstance(notice, AmdVerdict):
                kind: Literal["verdict", "beep", "no_beep"] = "verdict"
                verdict: str = notice.kind
            else:
                kind = "beep" if isinstance(notice, AmdBeep) else "no_beep"
                verdict = self.amd[0].verdict if self.amd else "machine"
            result = AmdResult(self.call.call_id, kind, verdict, notice.reason, notice.since_answer_ms)
            self.amd.append(result)
            out.append(result)
        elif isinstance(notice, DisclosureResult) and notice.what == "consent":
            self.consent = self.consent or notice
        elif isinstance(notice, DisclosureResult) and self.disclosure is None:
            self.disclosure = notice
        elif isinstance(notice, EarlyMedia):
            self.early_media = EarlyMediaReport.of(self.call.call_id, notice)
            out.append(self.early_media)
        elif isinstance(notice, TurnTiming):
            self._timings[notice.item_id] = notice
            _trim(self._timings, CLAIMED_ITEMS)
        elif isinstance(notice, RecordingChanged):
            gaps = self.recording_gaps
            if notice.paused:
                gaps.append({"start_ms": notice.at_ms, "end_ms": None, "by": notice.by})
            elif gaps and gaps[-1]["end_ms"] is None:
                gaps[-1]["end_ms"] = notice.at_ms
        elif isinstance(notice, CardEnded):
            self.card_collections.append(notice)
        elif isinstance(notice, TransferResult):
            self.transfers.append(notice)
        return out

    def _uncertain(self, notice: WorkUncertain) -> UncertainWork:
        self._uncertain_seq += 1
        self.uncertain_total += len(notice.items)
        self.uncertain.extend(UncertainEntry(notice.cause, notice.at_ms, i) for i in notice.items)
        return UncertainWork(self.call.call_id, self._uncertain_seq, notice.cause, notice.at_ms, notice.items)

    def _assistant_text(self, notice: Transcript, now: int, out: list[AppEvent]) -> None:
        current = self._open
        if current is not None and current.final_text is not None:  # a new reply after a final transcript
            self._scan(current, now)
            if self._last_frame_ns(current) + FRAME_NS + STILL_PLAYING_NS > now:  # its audio still leaves
                self._claimed.update(dict.fromkeys(current.items))
                self._ending.append(current)
                self._open = None
            else:
                out.extend(self._close(ending, None) for ending in self._take_ending())
                out.append(self._close(current, None))
            current = None
        if current is None:
            current = self._open = _Assistant(notice.at_ms, now)
        current.last_text_ns = now
        if notice.final:
            current.final_text = notice.text
        elif current.chars < MAX_TEXT_CHARS:
            current.parts.append(notice.text)
            current.chars += len(notice.text)
        else:  # past the bound only counted: a stream of fragments cannot grow the open utterance without end
            current.dropped += len(notice.text)

    def _barged_in(self, notice: BargedIn, now: int, out: list[AppEvent]) -> None:
        self.barge_ins += 1
        if not notice.cleared_ms and not notice.heard:
            return  # nothing was playing: nothing was cut
        cut = Cut(notice.at_ms, notice.source, notice.heard)
        cut_items = {item for item, _ in notice.heard}
        for ending in self._take_ending():  # cut too, when the caller cut into its audio
            out.append(self._close(ending, cut if cut_items.intersection(ending.items) else None))
        current = self._open or _Assistant(notice.at_ms, now)
        self._scan(current, now)
        for item, _ in notice.heard:
            if item not in self._claimed:
                current.items.setdefault(item, None)
        out.append(self._close(current, cut))

    def _rollover(self, notice: RolloverChanged) -> None:
        cid = notice.connection_id
        if notice.what == "opening":
            self.history.opened(cid, notice.at_ms)
        elif notice.what == "floor":
            self.history.rollover(RolloverEntry(cid, "completed", notice.at_ms, notice.detail))
        elif notice.what in ("failed", "refused"):
            outcome: Literal["failed", "refused"] = "failed" if notice.what == "failed" else "refused"
            self.history.rollover(RolloverEntry(cid, outcome, notice.at_ms, notice.detail))

    # --- the timer: an assistant utterance whose audio is over ---

    def next_deadline(self) -> int | None:
        current = self._ending[0] if self._ending else self._open
        if current is None:
            return None
        return self._over_at(current)

    def handle_timer(self, now: int) -> list[AppEvent]:
        out: list[AppEvent] = []
        while self._ending and now >= self._over_at(self._ending[0]):
            out.append(self._close(self._ending.pop(0), None))
        current = self._open
        if current is None or self._ending:
            return out
        self._scan(current, now)
        if now < self._over_at(current):
            return out
        return [*out, self._close(current, None)]

    def _over_at(self, current: _Assistant) -> int:
        """When an utterance is over: the quiet rule after its last text and its last frame."""
        return max(current.last_text_ns, self._last_frame_ns(current)) + self._quiet_ns

    def _take_ending(self) -> list[_Assistant]:
        ending, self._ending = self._ending, []
        return ending

    def _last_frame_ns(self, current: _Assistant) -> int:
        ends = [p.last_ns for item in current.items if (p := self._ledger.progress(item)) is not None]
        return max(ends, default=0)

    def _scan(self, current: _Assistant, until: int) -> None:
        """Give the ledger items transmitted since the last look (and by `until`) to the open utterance."""
        seen, claimed = self._seen_ns, self._claimed
        for item in self._ledger.items_between(seen, until):  # (not the entries, which are bounded)
            if item not in claimed and item != FINAL_MESSAGE_ITEM and item not in ANNOUNCEMENT_ITEMS:
                current.items.setdefault(item, None)
        if (last := self._ledger.last()) is not None:
            self._seen_ns = max(seen, min(until, last.transmitted_ns))

    def _close(self, current: _Assistant, cut: Cut | None) -> Utterance:
        if current is self._open:
            self._open = None
        progress = [p for item in current.items if (p := self._ledger.progress(item)) is not None]
        self._claimed.update(dict.fromkeys(current.items))
        _trim(self._claimed, CLAIMED_ITEMS)
        final = current.final_text
        text, cut_chars = bounded_text(final if final is not None else "".join(current.parts))
        cut_chars += current.dropped if final is None else 0
        if progress:
            start: int | None = self._ms(min(p.first_ns for p in progress))
            end: int | None = self._ms(max(p.last_ns for p in progress) + FRAME_NS)
        else:
            start = end = None
        heard = sum(p.frames for p in progress) * FRAME_MS
        latency = self._latency(current, cut, heard)
        call_id = self.call.call_id
        line = self._disclosure.text if self._disclosure is not None else None
        at_ms = start if start is not None else current.opened_ms
        if (
            line is not None and self.disclosure is None
        ):  # a line of text: the first assistant utterance says it
            self.disclosure = _first_words(line, text, cut is not None, current.lost, heard, at_ms)
        consent = self._consent.text if self._consent is not None else None
        if consent is not None and self.consent is None:  # in the same first utterance, after the disclosure
            result = _first_words(consent, text, cut is not None, current.lost, heard, at_ms)
            self.consent = replace(
                result, what="consent", ended_ms=end if result.outcome == "delivered" else None
            )
        return Utterance(call_id, self._next(), "assistant", text, start, end, heard, cut, cut_chars, latency)

    def _latency(self, current: _Assistant, cut: Cut | None, heard: int) -> TurnLatency | None:
        """The turn's times: its first timed item's first audio, that item's first frame in the ledger and, when
        cut, the ms of it transmitted then (the cut's own figure; the utterance's when the cut names it not)."""
        timing = next((t for item in current.items if (t := self._timings.pop(item, None)) is not None), None)
        if timing is None:
            return None
        first = self._ledger.progress(timing.item_id)
        truncated = None if cut is None else dict(cut.items).get(timing.item_id, heard)
        latency = TurnLatency(
            timing.kind,
            timing.speech_end_ms,
            timing.first_audio_ms,
            None if first is None else self._ms(first.first_ns),
            truncated,
        )
        self.turns.add(latency)
        return latency

    # --- the end ---

    def finish(self, outcome: CallOutcome, now: int) -> tuple[list[AppEvent], CallRecord]:
        """The call is over: the open utterance (if any) and the record. Call it once."""
        out: list[AppEvent] = []
        for ending in self._take_ending():
            if now < self._over_at(ending):  # it may still have played
                ending.lost = ending.lost or "the call ended while it played"
            out.append(self._close(ending, None))
        if self._open is not None:
            self._scan(self._open, now)
            if (deadline := self.next_deadline()) is not None and now < deadline:  # it may still have played
                self._open.lost = self._open.lost or "the call ended while it played"
            out.append(self._close(self._open, None))
        history = self.history
        recoveries = tuple(
            RecoveryEntry(
                connection_id(token),
                cause,
                _RECOVERY_OUTCOMES.get(stage, "unfinished"),
                elapsed if stage in _RECOVERY_OUTCOMES else None,
            )
            for token, (cause, stage, elapsed) in history.recoveries.items()
        )
        for cid, at in list(history.opening.items()):
            history.rollover(RolloverEntry(cid, "unfinished", at))
        status = outcome.status
        qos = status.get("qos")
        usage = status.get("usage")
        record = CallRecord(
            call=self.call,
            started_at=self._started_at,
            duration_s=outcome.duration_s,
            ended_by=outcome.ended_by,
            reason=outcome.reason,
            sip_status=outcome.sip_status,
            connections=tuple(history.connections),
            recoveries=recoveries,
            rollovers=tuple(history.rollovers),
            qos=dict(qos) if isinstance(qos, Mapping) else {},
            usage=UsageRecord.of(usage if isinstance(usage, Mapping) else {}),
            frames_in=outcome.frames_in,
            frames_out=outcome.frames_out,
            utterances=self._seq,
            barge_ins=self.barge_ins,
            recording=outcome.recording,
            connections_total=history.connections_total,
            recoveries_total=history.recoveries_total,
            rollovers_total=history.rollovers_total,
            rollovers_completed=history.rollovers_completed,
            uncertain=tuple(self.uncertain),
            uncertain_total=self.uncertain_total,
            one_way_audio=_one_way_audio(qos),
            amd=tuple(self.amd),
            dial=outcome.dial,
            disclosure=self._disclosure_outcome(),
            amd_action=self.amd_action,
            early_media=self.early_media,
            consent=self._consent_stamp(outcome.recording_start_ms),
            latency=self.turns.summary(),
            cost=cost if isinstance(cost := status.get("cost"), Mapping) else None,
            recording_gaps=_gaps_in_wav(self.recording_gaps, outcome.recording_start_ms),
            card_collections=_cards_in_wav(self.card_collections, outcome.recording_start_ms),
            transfers=tuple(self.transfers),
        )
        return out, record

    def _consent_stamp(self, recording_start_ms: int | None) -> ConsentStamp | None:
        """The route's recording consent at the end: its result (none came: not delivered, as the disclosure)."""
        if self._consent is None:
            return None
        result = self.consent
        if result is None:
            why = "the call ended before it" if self._consent.kind == "audio" else "the model said nothing"
            result = DisclosureResult("not_delivered", self._consent.kind, why, 0, None, 0, "consent")
        return ConsentStamp.of(result, recording_start_ms)

    def _disclosure_outcome(self) -> DisclosureResult | None:
        """The route's disclosure at the end: its result, or not delivered when none came (the session never
        started, or the model never spoke)."""
        if self._disclosure is None or self.disclosure is not None:
            return self.disclosure
        why = "the call ended before it" if self._disclosure.kind == "audio" else "the model said nothing"
        return DisclosureResult("not_delivered", self._disclosure.kind, why, 0, None, 0)


def _first_words(
    line: str, text: str | None, cut: bool, lost: str | None, heard: int, at_ms: int
) -> DisclosureResult:
    """A line of text the first assistant utterance must say (bridge/engine/disclosure.py `text_result`). A
    provider recovery that began while it was open cleared the rest of it (HR3), as a barge-in would, and a
    call that ended within `quiet_ms` of its last frame may have cut it: either way (`lost`) it was not proven
    heard whole, whatever its transcript says (which runs ahead of the audio)."""
    result = text_result(line, text, cut, heard, at_ms)
    if lost is not None and result.outcome == "delivered":
        return replace(result, outcome="partial", reason=lost)
    return result


def _gaps_in_wav(gaps: Iterable[Mapping[str, Any]], start_ms: int | None) -> tuple[dict[str, Any], ...]:
    """The recording's gaps as offsets into the WAV, which begins at `start_ms` on the session timeline (a
    recording consent: where the announcement ended; None: no WAV began later than the call, the times stand):
    a gap that began before the WAV starts at 0, one that ended before it is not in the file and is left out
    (as the file's cue points, bridge/server/recording.py `marks`)."""
    if not start_ms:
        return tuple(dict(g) for g in gaps)
    kept = []
    for gap in gaps:
        end = gap["end_ms"]
        if end is None or end > start_ms:
            begin = max(0, gap["start_ms"] - start_ms)
            kept.append({**gap, "start_ms": begin, "end_ms": None if end is None else end - start_ms})
    return tuple(kept)


def _cards_in_wav(cards: Iterable[CardEnded], start_ms: int | None) -> tuple[CardEnded, ...]:
    """The card collections as offsets into the WAV, as its gaps (`_gaps_in_wav`: a card's gap is the same
    span): one that began before the WAV starts at 0. One that ended before it is kept, at 0 to 0: the record
    lists every collection (its outcome matters beyond the file), where a gap not in the file has nothing to
    mark."""
    if not start_ms:
        return tuple(cards)
    return tuple(
        replace(c, started_ms=max(0, c.started_ms - start_ms), ended_ms=max(0, c.ended_ms - start_ms))
        for c in cards
    )


def _one_way_audio(qos: object) -> str | None:
    rtp = qos.get("rtp") if isinstance(qos, Mapping) else None
    cause = rtp.get("one_way_audio") if isinstance(rtp, Mapping) else None
    return cause if isinstance(cause, str) else None


_RECOVERY_OUTCOMES: dict[str, Literal["recovered", "failed", "interrupted"]] = {
    "done": "recovered",
    "failed": "failed",
    "interrupted": "interrupted",
}


def _transfer_json(result: TransferResult) -> dict[str, Any]:
    return {
        "target": result.target,
        "mode": "warm",
        "outcome": result.outcome,
        "status": result.status,
        "reason": result.reason,
        "elapsed_ms": result.elapsed_ms,
        **({"join": result.join} if result.join else {}),
    }
