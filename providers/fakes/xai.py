"""A faithful fake of xAI's Grok Voice Agent WebSocket, `/v1/realtime?model=...` (providers.md §3, §5.3).

xAI's API is an OpenAI Realtime clone with listed differences (§3.6); the protocol and model are shared in
realtime_family.py, and this module is the xAI `Dialect`: `voice` and `turn_detection` at the top of the session
(no `session.type`), PCM at 8..48 kHz besides G.711, VAD defaults 0.85 / 333 ms, no `conversation.item.done`,
no `rate_limits.updated`, cumulative `...input_audio_transcription.updated` snapshots (grok-transcribe), text as
`response.text.delta`, function calls only as `arguments.done` + item done alongside `response.done`, usage
inside `response` and at the top level with a running `billable_audio_seconds`, truncate/retrieve unsupported,
a manual commit answered at once, a repeated bare `response.create` dropped, `create_response:false` echoed but
ignored, `force_message` items, and a periodic `{"type":"ping","timestamp":ms}`.

Guesses (the real behaviour is not documented), all deliberate:
* Auth: `Authorization: Bearer <key>`, or a `xai-client-secret.<token>` WebSocket subprotocol offer. The shared
  shell cannot select a subprotocol, so the offer is accepted for auth but **not echoed** (a browser would
  fail such a handshake; Python websockets clients do not).
* Session cap (default 30 min): no error event, close 1000 with a reason text.
* Unknown session keys -> `unknown_parameter` like OpenAI (strict, to catch OpenAI-shaped config sent to xAI);
  `session.type:"realtime"` is tolerated.
* Unsupported client events -> `error` code `unsupported_event`. The default silence duration is 500 ms.
* `billable_audio_seconds` = input audio received so far (s); token counts are made up like OpenAI's.
* With `modalities` containing "text" in `response.create`, `response.text.delta` copies of the transcript deltas
  are sent besides the audio (audio cannot be turned off).
* Ping every 15 s; the session object carries `id` (sess_*) but no `object`/`expires_at`; item ids are `msg_*`.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from websockets.http11 import Request

from providers.fakes import realtime_family as family
from providers.fakes.schema import AnyOf, Bool, Int, ListOf, Nullable, Num, Obj, Str, Tagged, members
from providers.fakes.server import bearer_authorize, serving

RealtimeFakeOptions = family.RealtimeFakeOptions

__all__ = ["DIALECT", "PCM_RATES", "RealtimeFakeOptions", "authorize", "server", "serve"]

PCM_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
SUBPROTOCOL_PREFIX = "xai-client-secret."

_TYPE = Str()
FORMAT = family.audio_formats(PCM_RATES, g711_rate=True)
TURN_DETECTION_DEFAULTS: dict[str, Any] = {
    "threshold": 0.85,
    "silence_duration_ms": 500,
    "prefix_padding_ms": 333,
}
_SERVER_VAD = Obj(
    {
        "type": _TYPE,
        "threshold": Num(0.0, 1.0),
        "silence_duration_ms": Int(0, 10_000),
        "prefix_padding_ms": Int(0, 10_000),
        "create_response": Bool(),
        "interrupt_response": Bool(),
    },
    defaults=TURN_DETECTION_DEFAULTS,
)
_MCP_KEYS = ("server_url", "server_label", "allowed_tools", "authorization", "headers", "require_approval")
_TOOLS = ListOf(
    Tagged(
        {
            "function": family.FUNCTION_TOOL,
            "web_search": Obj({"type": _TYPE}),
            "x_search": Obj({"type": _TYPE, "allowed_x_handles": ListOf(Str())}),
            "file_search": Obj(
                {"type": _TYPE, "vector_store_ids": ListOf(Str()), "max_num_results": Int(lo=1)}
            ),
            "mcp": members(("type", *_MCP_KEYS, "server_description")),
        }
    )
)
_FUNCTION_CHOICE = Obj(
    {"type": Str(choices=("function",)), "name": Str(nonempty=True)}, required=("type", "name")
)
_TOOL_CHOICE = AnyOf((Str(choices=("none", "auto", "required")), _FUNCTION_CHOICE))
_MAX_OUTPUT_TOKENS = AnyOf((Int(lo=1), family.UNLIMITED))
_TRANSCRIPTION = Obj(
    {"model": Str(nonempty=True), "language_hint": Str(), "language": Str(), "keyterms": ListOf(Str())}
)

SESSION = Obj(
    {
        "type": Str(choices=("realtime",)),
        "model": Str(nonempty=True),
        "instructions": Str(),
        "voice": Str(nonempty=True),
        "turn_detection": Nullable(Tagged({"server_vad": _SERVER_VAD})),
        "audio": family.session_audio(
            {"format": FORMAT, "transcription": Nullable(_TRANSCRIPTION)}, {"format": FORMAT}
        ),
        "tools": _TOOLS,
        "tool_choice": _TOOL_CHOICE,
        "reasoning": Obj({"effort": Str(choices=("high", "none"))}),
        "resumption": Obj({"enabled": Bool()}),
        "max_output_tokens": _MAX_OUTPUT_TOKENS,
        "parallel_tool_calls": Bool(),
    },
    merge=True,
)

RESPONSE = Obj(
    {
        "modalities": ListOf(Str(choices=("text", "audio"))),
        "instructions": Str(),
        "tools": _TOOLS,
        "tool_choice": _TOOL_CHOICE,
        "max_output_tokens": _MAX_OUTPUT_TOKENS,
        "metadata": family.METADATA,
        "conversation": Str(),
    }
)

_ITEM_COMMON = {"type": _TYPE, "id": Str(nonempty=True), "object": Str(), "status": Str()}
_CONTENT = family.content_part(("input_text", "input_audio", "output_text", "output_audio"))
_FORCED_TEXT = Obj({"type": Str(choices=("output_text",)), "text": Str()}, required=("type", "text"))
ITEM = Tagged(
    {
        **family.item_variants(_ITEM_COMMON, _CONTENT),
        "force_message": Obj(
            {
                "type": _TYPE,
                "role": Str(choices=("assistant",)),
                "interruptible": Bool(),
                "content": ListOf(_FORCED_TEXT),
            },
            required=("content",),
        ),
    }
)


def _new_session(model: str, session_id: str, expires_at: int) -> dict[str, Any]:
    pcm = {"type": "audio/pcm", "rate": 24000}
    return {
        "id": session_id,
        "model": model,
        "instructions": "",
        "voice": "eve",
        "turn_detection": {"type": "server_vad", **TURN_DETECTION_DEFAULTS},
        "audio": {"input": {"format": dict(pcm), "transcription": None}, "output": {"format": dict(pcm)}},
        "tools": [],
        "reasoning": {"effort": "high"},
    }


def _expiry_message(ms: int) -> str:
    minutes = ms / 60_000
    return f"Session expired: maximum session duration of {minutes:g} minutes reached."


DIALECT = family.Dialect(  # what differs from the GA protocol (realtime_family.Dialect's defaults)
    "xai",
    "grok-voice-think-fast-1.0",
    SESSION,
    RESPONSE,
    ITEM,
    _new_session,
    _expiry_message,
    voice_path=("voice",),
    turn_detection_path=("turn_detection",),
    modalities_path=None,
    response_modalities_key="modalities",
    text_alongside_audio=True,
    text_delta_type="response.text.delta",
    text_done_type=None,
    item_prefix="msg",
    item_done_events=False,
    rate_limits=False,
    transcription_events="snapshots",
    snapshot_model="grok-transcribe",
    function_call_events="at_done",
    usage="audio_seconds",
    rich_response=False,
    unsupported_events=frozenset({"conversation.item.truncate", "conversation.item.retrieve"}),
    commit_creates_response=True,
    commit_ignores_silence=True,
    drops_repeat_response_create=True,
    honours_create_response=False,
    voice_locked_after_audio=False,
    ping_interval_ms=15_000,
    idle_timeout=False,
    session_length_ms=30 * 60 * 1000,
    expiry_error=False,
    expiry_close_code=1000,
    beta_header_rejected=False,
)


def authorize(request: Request) -> HTTPStatus | None:
    """Bearer auth, or an ephemeral secret offered as the `xai-client-secret.<token>` subprotocol."""
    try:
        offers = [p.strip() for h in request.headers.get_all("Sec-WebSocket-Protocol") for p in h.split(",")]
    except Exception:
        offers = []
    if any(p.startswith(SUBPROTOCOL_PREFIX) and len(p) > len(SUBPROTOCOL_PREFIX) for p in offers):
        return None
    return bearer_authorize(request)


server = family.dialect_server(DIALECT, authorize)
serve = serving(server)
