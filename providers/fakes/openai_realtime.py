"""A faithful fake of the OpenAI Realtime API (GA) WebSocket, `/v1/realtime?model=...` (providers.md §1, §5.1).

The protocol and the fake model live in realtime_family.py (shared with the xAI fake); this module is the
OpenAI `Dialect`: the GA session schema (from the openai 3.57.0 types), the default session, and the switches
for what OpenAI does that xAI does not (`conversation.item.done`, `rate_limits.updated`, transcription deltas,
streamed function-call arguments, token usage, truncate/retrieve, idle timeout, the voice lock, the 60-minute
cap with `session_expired` + close 1001, and the retired beta header -> close 4000).

Choices where the real service is not documented (all deliberate, all in one place):
* Unknown keys anywhere in `session.update` (and in `response.create.response`, items) -> `unknown_parameter`
  with the dotted `param`; `audio/pcm` with a rate other than 24000, or a `rate` on pcmu/pcma -> error.
* `turn_detection`, formats, `transcription`, `noise_reduction` and tool lists are replaced, not merged, and a
  new `turn_detection` gets the server defaults for fields it leaves out; `audio`, `audio.input` and
  `audio.output` deep-merge.
* Error codes the fake invents: `item_not_found`, `duplicate_item_id`, `unsupported_event`
  (`output_audio_buffer.clear` on a WebSocket), `cannot_update_voice`, `invalid_json`.
* A missing `?model=` silently means `gpt-realtime-2`.
"""

from __future__ import annotations

from typing import Any

from providers.fakes import realtime_family as family
from providers.fakes.schema import (
    AnyOf,
    Anything,
    Bool,
    Int,
    ListOf,
    Nullable,
    Num,
    Obj,
    Spec,
    Str,
    Tagged,
    members,
)
from providers.fakes.server import bearer_authorize, serving

RealtimeFakeOptions = family.RealtimeFakeOptions

__all__ = ["DIALECT", "RealtimeFakeOptions", "server", "serve", "session_length_text"]

_TYPE = Str()
FORMAT = family.audio_formats((24000,), g711_rate=False)
SERVER_VAD_DEFAULTS: dict[str, Any] = {
    "threshold": 0.5,
    "prefix_padding_ms": 300,
    "silence_duration_ms": 500,
    "idle_timeout_ms": None,
    "create_response": True,
    "interrupt_response": True,
}
_RESPONDS: dict[str, Spec] = {"create_response": Bool(), "interrupt_response": Bool()}
_TURN_DETECTION = Tagged(
    {
        "server_vad": Obj(
            {
                "type": _TYPE,
                "threshold": Num(0.0, 1.0),
                "prefix_padding_ms": Int(lo=0),
                "silence_duration_ms": Int(lo=0),
                "idle_timeout_ms": Nullable(Int(lo=0)),
                **_RESPONDS,
            },
            defaults=SERVER_VAD_DEFAULTS,
        ),
        "semantic_vad": Obj(
            {"type": _TYPE, "eagerness": Str(choices=("low", "medium", "high", "auto")), **_RESPONDS},
            defaults={"eagerness": "auto", "create_response": True, "interrupt_response": True},
        ),
    }
)
_EFFORTS = ("minimal", "low", "medium", "high", "xhigh")
_TRANSCRIPTION = Obj(
    {
        "model": Str(nonempty=True),
        "language": Str(),
        "languages": ListOf(Str()),
        "prompt": Str(),
        "keywords": ListOf(Str()),
        "delay": Str(choices=_EFFORTS),
    }
)
_VOICE = AnyOf((Str(nonempty=True), Obj({"id": Str(nonempty=True)}, required=("id",))))
_MCP_KEYS = (
    "type",
    "server_label",
    "server_url",
    "connector_id",
    "authorization",
    "headers",
    "allowed_tools",
)
_MCP_TOOL = members(
    (*_MCP_KEYS, "allowed_callers", "require_approval", "server_description", "defer_loading", "tunnel_id"),
    required=("server_label",),
)
_TOOLS = ListOf(Tagged({"function": family.FUNCTION_TOOL, "mcp": _MCP_TOOL}))
_TOOL_CHOICE = AnyOf(
    (
        Str(choices=("none", "auto", "required")),
        Tagged(
            {
                "function": Obj({"type": _TYPE, "name": Str(nonempty=True)}, required=("name",)),
                "mcp": Obj(
                    {"type": _TYPE, "server_label": Str(), "name": Nullable(Str())},
                    required=("server_label",),
                ),
            }
        ),
    )
)
_MODALITIES = ListOf(Str(choices=("audio", "text")))
_PROMPT = Nullable(Obj({"id": Str(), "variables": Anything(), "version": Nullable(Str())}, required=("id",)))
_RESPONSE_COMMON: dict[str, Spec] = {
    "output_modalities": _MODALITIES,
    "instructions": Str(),
    "tools": _TOOLS,
    "tool_choice": _TOOL_CHOICE,
    "max_output_tokens": AnyOf((Int(1, 4096), family.UNLIMITED)),
    "prompt": _PROMPT,
    "reasoning": Obj({"effort": Str(choices=_EFFORTS)}),
    "parallel_tool_calls": Bool(),
}
_NOISE_REDUCTION = Obj({"type": Str(choices=("near_field", "far_field")), "strength": Num(0.0)})
_RETENTION = Obj(
    {"type": _TYPE, "retention_ratio": Num(0.0, 1.0), "token_limits": Obj({"post_instructions": Int(lo=0)})},
    required=("retention_ratio",),
)
_TRACING = Obj({"group_id": Str(), "metadata": Anything(), "workflow_name": Str()})

SESSION = Obj(
    {
        "type": Str(choices=("realtime",)),
        "model": Str(nonempty=True),
        "audio": family.session_audio(
            {
                "format": FORMAT,
                "noise_reduction": Nullable(_NOISE_REDUCTION),
                "transcription": Nullable(_TRANSCRIPTION),
                "turn_detection": Nullable(_TURN_DETECTION),
            },
            {"format": FORMAT, "voice": _VOICE, "speed": Num(0.25, 1.5)},
        ),
        "truncation": AnyOf((Str(choices=("auto", "disabled")), Tagged({"retention_ratio": _RETENTION}))),
        "tracing": Nullable(AnyOf((Str(choices=("auto",)), _TRACING))),
        "include": Nullable(ListOf(Str(choices=("item.input_audio_transcription.logprobs",)))),
        **_RESPONSE_COMMON,
    },
    required=("type",),
    merge=True,
)

RESPONSE = Obj(
    {
        "audio": Obj({"output": Obj({"format": FORMAT, "voice": _VOICE})}),
        "metadata": family.METADATA,
        "conversation": Str(),
        "input": ListOf(Anything()),
        **_RESPONSE_COMMON,
    }
)

_ITEM_COMMON = {
    "type": _TYPE,
    "id": Str(nonempty=True),
    "object": Str(choices=("realtime.item",)),
    "status": Str(choices=("completed", "incomplete", "in_progress")),
}
_CONTENT_TYPES = ("input_text", "input_audio", "input_image", "output_text", "output_audio")
_CONTENT = family.content_part(_CONTENT_TYPES, image_url=Str(), detail=Str(choices=("auto", "low", "high")))
ITEM = Tagged(family.item_variants(_ITEM_COMMON, _CONTENT))


def _new_session(model: str, session_id: str, expires_at: int) -> dict[str, Any]:
    pcm = {"type": "audio/pcm", "rate": 24000}
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": model,
        "output_modalities": ["audio"],
        "instructions": "",
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "tracing": None,
        "truncation": "auto",
        "prompt": None,
        "expires_at": expires_at,
        "include": None,
        "audio": {
            "input": {
                "format": dict(pcm),
                "transcription": None,
                "noise_reduction": None,
                "turn_detection": {"type": "server_vad", **SERVER_VAD_DEFAULTS},
            },
            "output": {"format": dict(pcm), "voice": "marin", "speed": 1.0},
        },
    }


def session_length_text(ms: int) -> str:
    """`3_600_000` -> "60 minutes" (the unit the real message uses), seconds for test-sized caps."""
    if ms % 60_000 == 0:
        n, unit = ms // 60_000, "minute"
    elif ms % 1000 == 0:
        n, unit = ms // 1000, "second"
    else:
        n, unit = ms, "millisecond"
    return f"{n} {unit}{'' if n == 1 else 's'}"


def _expiry_message(ms: int) -> str:
    return f"Your session hit the maximum duration of {session_length_text(ms)}."


# every switch the GA protocol's, as realtime_family.Dialect's defaults say
DIALECT = family.Dialect(
    "openai_realtime", "gpt-realtime-2", SESSION, RESPONSE, ITEM, _new_session, _expiry_message
)


server = family.dialect_server(DIALECT, bearer_authorize)
serve = serving(server)
