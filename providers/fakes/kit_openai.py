"""The kit's part for the OpenAI-shaped fakes (GPT-Live: openai_live.py; the Realtime family: realtime_family.py
with its dialects), and the audio helpers any fake may use.

Both OpenAI protocols speak JSON events named by `type`, with an optional client `event_id`; a client event
is looked up in the core's table of `ClientEvent`s, its members checked by the one schema validator
(schema.py), and a bad one answered by an `error` event, never raised out of the core. `OpenAICore` (a
connection.py `FakeCore`) owns that dispatch and the `event_id` of what it emits; the vendor core keeps its
events, its error shape and its model. Audio arrives as base64 in the session's format (`audio_format`):
`decode_audio` reads an append's payload (the record keeps its decoded length) and `whole_samples` keeps a
PCM16 sample split between two appends for the next one. `tone` and `ms_of` are the audio every scripted reply
speaks. `fake_server` makes a vendor module's `server()`, and each connection's core with `context_args`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Required, TypedDict

from providers.fakes.connection import FakeCore
from providers.fakes.faults import Fault
from providers.fakes.schema import ClientError, Str, members, validate
from providers.fakes.script import Script
from providers.fakes.server import Authorize, ConnectionContext, FakeConnection, FakeServer, IdSource
from rtp.audio import PCMA_8K, PCMU_8K, AudioFormat, Encoding

__all__ = [
    "ClientEvent",
    "CoreContext",
    "NOT_AN_OBJECT",
    "NOT_JSON",
    "OpenAICore",
    "audio_format",
    "b64_length",
    "context_args",
    "decode_audio",
    "fake_server",
    "ms_of",
    "whole_samples",
]

NOT_JSON = "The client event is not valid JSON."
NOT_AN_OBJECT = "A client event must be a JSON object."


# -- audio ----------------------------------------------------------------------------------------------------


def audio_format(fmt: Mapping[str, Any]) -> AudioFormat:
    """The audio format a (valid) OpenAI `format` object names: `audio/pcmu`, `audio/pcma` (8 kHz), else
    `audio/pcm` at its `rate` (24 kHz when it names none)."""
    kind = fmt.get("type")
    if kind == "audio/pcmu":
        return PCMU_8K
    if kind == "audio/pcma":
        return PCMA_8K
    return AudioFormat(Encoding.PCM16, int(fmt.get("rate") or 24000))


def ms_of(fmt: AudioFormat, nbytes: int) -> float:
    """How long `nbytes` of audio in `fmt` last, in ms."""
    return nbytes / fmt.sample_width * 1000 / fmt.rate


def whole_samples(carry: bytes, raw: bytes, width: int) -> tuple[bytes, bytes]:
    """`raw` after `carry` (what the previous append left) cut to whole samples of `width` bytes, and the rest."""
    if width == 1:
        return raw, b""
    data = carry + raw
    whole = len(data) - len(data) % width
    return data[:whole], data[whole:]


def b64_length(text: str) -> int | None:
    """The decoded length of strict base64 `text`, None when it is not."""
    try:
        return len(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        return None


def decode_audio(text: str, message: str) -> bytes:
    """An append's base64 `audio`, strictly decoded; else `invalid_value` on `audio` with the vendor's `message`."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ClientError("invalid_value", message, "audio") from None


class CoreContext(TypedDict, total=False):
    """What a core is made with, besides its vendor's options: the shell's `ConnectionContext` (`context_args`),
    or a test's virtual clock. `unix_time` is the wall clock (s) at `now`, for the `expires_at` a session names;
    `index` is 0-based; `faults` are the connection's (faults.py)."""

    now: Required[int]
    unix_time: Required[int]
    ids: IdSource | None
    index: int
    faults: Sequence[Fault]


def context_args(ctx: ConnectionContext) -> CoreContext:
    return {
        "now": ctx.now,
        "unix_time": ctx.unix_time,
        "ids": ctx.ids,
        "index": ctx.index,
        "faults": ctx.faults,
    }


def fake_server(
    name: str,
    path: str,
    authorize: Authorize,
    core: Callable[[Any, Script | None, ConnectionContext], FakeConnection],
) -> Callable[..., FakeServer]:
    """A vendor module's `server(options=None, *, faults=(), script=None, record_path=None)`: a fake (not yet
    listening: `await server(...).start(host, port)`) that takes any path ending as `path` does after `/v1`, and
    makes each connection's `core(options, script, context)`."""
    suffix = path.removeprefix("/v1")

    def server(
        options: Any = None,
        *,
        faults: Sequence[Fault] = (),
        script: Script | None = None,
        record_path: str | None = None,
    ) -> FakeServer:
        return FakeServer(
            name,
            lambda ctx: core(options, script, ctx),
            path=path,
            accepts_path=lambda requested: requested.endswith(suffix),
            authorize=authorize,
            faults=faults,
            record_path=record_path,
        )

    server.__doc__ = f"A {name} fake (see kit_openai.fake_server)."
    return server


# -- the core -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientEvent:
    """A client event a core takes: its handler, the members it may carry besides `type` and `event_id` (None:
    the handler checks them) and those it must."""

    handler: Callable[[Any, dict[str, Any], int], None]
    keys: tuple[str, ...] | None = ()
    required: tuple[str, ...] = ()


class OpenAICore(FakeCore):
    """A `FakeCore` for JSON events named by `type` (see the module docstring)."""

    client_events: ClassVar[Mapping[str, ClientEvent]] = {}
    client_event_key: ClassVar[str] = "event_id"
    """The member of an `error` that echoes the client's `event_id` (GPT-Live's `client_event_id` also names it at
    the top of every event that answers one: `_answering`)."""

    def __init__(self, keep_frames: bool, context: CoreContext) -> None:
        super().__init__(context.get("index", 0), context.get("ids"), keep_frames)
        self._created_now = context["now"]
        self._unix_time = context["unix_time"]

    def _event(self, kind: str, **fields: Any) -> None:
        self._emit({"type": kind, "event_id": self._ids.new("event"), **fields})

    def _client_frame(self, frame: dict[str, Any] | None, is_json: bool, now: int) -> None:
        """A client message (`parse_client`'s object, or None when it was none) dispatched; an error answered."""
        try:
            if frame is None:
                raise ClientError("invalid_json", NOT_AN_OBJECT if is_json else NOT_JSON)
            self._dispatch(frame, now)
        except ClientError as exc:
            event_id = frame.get("event_id") if frame is not None else None
            self._error(exc.code, exc.message, exc.param, event_id if isinstance(event_id, str) else None)

    def _dispatch(self, event: dict[str, Any], now: int) -> None:
        if "type" not in event:
            raise ClientError("missing_required_parameter", "Missing required parameter: 'type'.", "type")
        kind = event["type"]
        validate(Str(), kind, "type")
        if event.get("event_id") is not None:
            validate(Str(), event["event_id"], "event_id")
        entry = self._events().get(kind)
        if entry is None:
            raise self._unknown_event(kind)
        self._admit(kind)
        if entry.keys is not None:
            validate(members(("type", "event_id", *entry.keys), entry.required), event, "")
        entry.handler(self, event, now)

    def _events(self) -> Mapping[str, ClientEvent]:
        return self.client_events

    def _admit(self, kind: str) -> None:
        """Whether the session takes `kind` now (raises `ClientError` when not), before its members are checked."""

    def _unknown_event(self, kind: str) -> ClientError:
        raise NotImplementedError

    def _error(
        self, code: str, message: str, param: str | None = None, client_event_id: str | None = None
    ) -> None:
        error = {"type": "invalid_request_error", "code": code, "message": message, "param": param}
        event = {"type": "error", "event_id": self._ids.new("event")}
        error[self.client_event_key] = client_event_id
        self._emit(self._answering({**event, "error": error}, client_event_id))

    def _answering(self, event: dict[str, Any], client_event_id: Any) -> dict[str, Any]:
        """`event` naming the client event it answers (`client_event_id`), when the vendor does and that had a
        string id."""
        if self.client_event_key == "client_event_id" and isinstance(client_event_id, str):
            event["client_event_id"] = client_event_id
        return event

    def _fire(self, faults: list[Fault], now: int) -> None:
        """Faults that came due, each through the fault funnel, until one closes the connection."""
        for fault in faults:
            self._fault(fault, now)
            if self._closing:
                return
