"""The connection base of the provider fakes: what every fake's sans-I/O core keeps and does the same way.

A vendor core (openai_live.py, realtime_family.py, gemini_live.py) subclasses `FakeCore` and keeps only its wire
vocabulary and its model. The base owns:

* the records: `record` (providers/fakes/server.py `ConnectionRecord`: the faults as they fire, the session id,
  the close code, the notes) and the client frames (`_received`; `last_frame` is built only when asked for,
  unless every frame is kept: a frozen dataclass a frame, 50 a second a call, that nobody reads is a cost);
* the outbound funnel `_send(frame)`, which every frame a core writes passes: a closing or half-open connection
  drops it (half-open ones are counted in `suppressed`), the `mutate` fault corrupts it (noted as `mutated`, by
  what it was), a hold (`_holding()`: a stall, a handshake not yet answered) keeps it back in order, and
  `_release()` lets what was held go, before anything sent after it;
* the close funnel `_close_with(request)`: once, and a half-open connection sends no close frame (it may still
  drop the TCP connection: `abrupt`);
* the pulled outputs `frames_to_send()` and `close_to_send()`, and `half_open` / `closed` for the shell;
* a client message read as a JSON object, or kept as its raw text when it is none (`parse_client`).
"""

from __future__ import annotations

import json
from typing import Any

from providers.fakes.faults import Fault, FaultKind, Mutator
from providers.fakes.script import Turn, label
from providers.fakes.server import (
    ClientFrameRecord,
    CloseRequest,
    ConnectionRecord,
    IdSource,
    SequentialIds,
    frame_kind,
    shorten_audio,
)

__all__ = ["FakeCore", "parse_client", "soonest"]


def soonest(*times: int | None) -> int | None:
    """The earliest of the deadlines that are set (None: none is). Asked every caller frame: a plain loop."""
    due = None
    for t in times:
        if t is not None and (due is None or t < due):
            due = t
    return due


def parse_client(data: str | bytes) -> tuple[dict[str, Any] | None, str | None, bool]:
    """A client message as `(object, None, True)`; else `(None, its text, whether it was JSON at all)`."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        parsed = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, data if isinstance(data, str) else data.decode("utf-8", "replace"), False
    if not isinstance(parsed, dict):
        return None, text, True
    return parsed, None, True


class FakeCore:
    """The state and funnels every fake connection core shares (see the module docstring)."""

    append_type: str | None = None
    """The client event that carries input audio as `audio` (shortened in the record file); None: none."""

    def __init__(self, index: int, ids: IdSource | None, keep_frames: bool) -> None:
        self.record = ConnectionRecord(index)
        self._ids: IdSource = ids or SequentialIds()
        self._keep_frames = keep_frames
        self._out: list[str] = []
        self._held: list[str] = []  # frames a hold keeps back
        self._close: CloseRequest | None = None
        self._closing = False
        self._half_open = False
        self._mutate = Mutator()  # the `mutate` fault: the next frames go out corrupted
        self._audio_bytes: int | None = None  # decoded length of the audio in the client frame being handled
        self.suppressed = 0
        """Frames not sent because the connection is half-open."""
        self._last_frame: ClientFrameRecord | None = None
        self._last_fields: tuple[int, dict[str, Any] | None, str | None, int | None] | None = None

    # -- records --------------------------------------------------------------------------------------------

    def _received(self, now: int, frame: dict[str, Any] | None, raw: str | None) -> None:
        """The client frame just handled: the record keeps it (when it keeps every frame), `last_frame` names it."""
        if self._keep_frames:
            self._last_frame = ClientFrameRecord(now, frame, raw, self._audio_bytes)
            self.record.client_frames.append(self._last_frame)
        else:
            self._last_frame, self._last_fields = None, (now, frame, raw, self._audio_bytes)

    @property
    def last_frame(self) -> ClientFrameRecord | None:
        """The client frame most recently received (also when the record keeps no frames)."""
        if self._last_frame is None and self._last_fields is not None:
            self._last_frame, self._last_fields = ClientFrameRecord(*self._last_fields), None
        return self._last_frame

    def recorded(self, frame: dict[str, Any]) -> dict[str, Any]:
        """The frame for the record file: an audio payload as its decoded length plus the base64."""
        if self.append_type is None:
            return frame
        nbytes = self.last_frame.audio_bytes if self.last_frame is not None else None
        return shorten_audio(frame, self.append_type, nbytes)

    # -- the notes (server.py: what a harness joins with what the bridge emitted) -----------------------------

    def _heard(self, now: int, item: str, n: int, seconds: float, ms: float) -> str:
        """The model took caller utterance `n` (`item` its id, `ms` long): noted as `heard`, with the transcript
        it gets (returned)."""
        text = label("utterance", n, seconds)
        self.record.note(now, "heard", item=item, n=n, text=text, audio_ms=round(ms))
        return text

    def _answers(
        self, now: int, turn: Turn, source: str | None, kind: str | None, call_id: str | None = None
    ) -> None:
        """The model answers input `source` (of `kind` audio, text or None) with `turn`: noted as the
        `tool_call` it made (by `call_id`) or the `response` it began."""
        answers = {"for": source, "input": kind}
        if call_id is None:
            self.record.note(now, "response", reply=turn.reply, **answers)
        else:
            assert turn.tool_call is not None
            self.record.note(now, "tool_call", call_id=call_id, name=turn.tool_call.name, **answers)

    def _note_fault(self, fault: Fault) -> None:
        self.record.faults.append(str(fault))

    # -- faults (providers/fakes/faults.py) -----------------------------------------------------------------

    garbage = "}{"
    """What `garbage_json` sends: a frame of the vendor's that is not JSON."""

    def _fault(self, fault: Fault, now: int) -> None:
        """A fault fired: noted, and what every fake does alike done here (`half_open`, `abrupt_close`,
        `garbage_json`, `mutate`); the vendor's kinds, and its own part of `half_open`, in `_on_fault`. A
        half-open connection sends nothing more, whatever else goes wrong: only `abrupt_close` still acts."""
        self._note_fault(fault)
        kind = fault.kind
        if self._half_open and kind is not FaultKind.ABRUPT_CLOSE:
            return
        if kind is FaultKind.ABRUPT_CLOSE:
            self._close_with(CloseRequest(1006, abrupt=True))
        elif kind is FaultKind.GARBAGE_JSON:
            self._send(self.garbage)
        elif kind is FaultKind.MUTATE:
            self._mutate.arm(fault)
        else:
            if kind is FaultKind.HALF_OPEN:
                self._half_open = True
                self._drop_held()
            self._on_fault(fault, now)

    def _on_fault(self, fault: Fault, now: int) -> None:
        """The vendor's part of a fault (its `close`, `invalid_audio`, `slow_handshake`, ...)."""

    def _fire(self, faults: list[Fault], now: int) -> None:
        """Faults that came due, each through `_fault`, until one closes the connection."""
        for fault in faults:
            self._fault(fault, now)
            if self._closing:
                return

    # -- outputs --------------------------------------------------------------------------------------------

    def frames_to_send(self) -> list[str]:
        out, self._out = self._out, []
        self.record.server_frames += len(out)
        return out

    def close_to_send(self) -> CloseRequest | None:
        """The close the shell must perform after sending the frames, handed out once."""
        req, self._close = self._close, None
        return req

    @property
    def half_open(self) -> bool:
        """The shell stops reading and writing once this is true (a vanished peer)."""
        return self._half_open

    @property
    def closed(self) -> bool:
        return self._closing

    def connection_lost(self, code: int | None, now: int | None = None) -> None:
        """The socket is gone (either side closed it); stop all timers."""
        self._closing = True
        self.record.close_code = code

    # -- the funnels ----------------------------------------------------------------------------------------

    def _emit(self, event: dict[str, Any]) -> None:
        self._send(json.dumps(event, separators=(",", ":")))

    def _send(self, frame: str) -> None:
        """The single outbound funnel (the module docstring)."""
        if self._half_open or self._closing:
            self.suppressed += self._half_open
            return
        if self._mutate.left:
            self.record.note(None, "mutated", of=frame_kind(frame))
            frame = self._mutate(frame)
        if self._holding():
            self._held.append(frame)
            return
        if self._held:
            self._release()
        self._out.append(frame)

    def _holding(self) -> bool:
        """Whether a frame sent now waits in `_held` (a stall, a handshake not yet answered)."""
        return False

    def _release(self) -> None:
        """What a hold kept back goes out now, in order."""
        self._out += self._held
        self._held = []

    def _drop_held(self) -> None:
        """What a hold kept back is lost (half-open: nothing more leaves)."""
        self.suppressed += len(self._held)
        self._held = []

    def _close_with(self, request: CloseRequest) -> None:
        """The single close funnel: once; a half-open connection sends no close frame, only drops (`abrupt`)."""
        if self._closing or (self._half_open and not request.abrupt):
            return
        self._closing = True
        self._close = request
        self.record.close_code = request.code
