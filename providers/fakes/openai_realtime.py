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

from providers.fakes.realtime_family import Dialect, RealtimeFakeOptions, dialect_server, item_variants
from providers.fakes.schema import AnyOf, Anything, Bool, Int, ListOf, Nullable, Num, Obj, Str, Tagged
from providers.fakes.server import bearer_authorize, serving

__all__ = ["DIALECT", "RealtimeFakeOptions", "server", "serve", "session_length_text"]

_TYPE = Str()
FORMAT = Tagged(
    {
        "audio/pcm": Obj({"type": _TYPE, "rate": Int(choices=(24000,))}, defaults={"rate": 24000}),
        "audio/pcmu": Obj({"type": _TYPE}),
        "audio/pcma": Obj({"type": _TYPE}),
    }
)
SERVER_VAD_DEFAULTS: dict[str, Any] = {
    "threshold": 0.5,
    "prefix_padding_ms": 300,
    "silence_duration_ms": 500,
    "idle_timeout_ms": None,
    "create_response": True,
    "interrupt_response": True,
}
_TURN_DETECTION = Tagged(
    {
        "server_vad": Obj(
            {
                "type": _TYPE,
                "threshold": Num(0.0, 1.0),
                "prefix_padding_ms": Int(lo=0),
                "silence_duration_ms": Int(lo=0),
                "idle_timeout_ms": Nullable(Int(lo=0)),
                "create_response": Bool(),
                "interrupt_response": Bool(),
            },
            defaults=SERVER_VAD_DEFAULTS,
        ),
        "semantic_vad": Obj(
            {
                "type": _TYPE,
                "eagerness": Str(choices=("low", "medium", "high", "auto")),
                "create_response": Bool(),
                "interrupt_response": Bool(),
            },
            defaults={"eagerness": "auto", "create_response": True, "interrupt_response": True},
        ),
    }
)
_TRANSCRIPTION = Obj(
    {
        "model": Str(nonempty=True),
        "language": Str(),
        "languages": ListOf(Str()),
        "prompt": Str(),
        "keywords": ListOf(Str()),
        "delay": Str(choices=("minimal", "low", "medium", "high", "xhigh")),
    }
)
_VOICE = AnyOf((Str(nonempty=True), Obj({"id": Str(nonempty=True)}, required=("id",))))
_FUNCTION_TOOL = Obj(
    {"type": _TYPE, "name": Str(nonempty=True), "description": Str(), "parameters": Anything()},
    required=("name",),
)
_MCP_TOOL = Obj(
    {
        key: Anything()
        for key in (
            "type",
            "server_label",
            "server_url",
            "connector_id",
            "authorization",
            "headers",
            "allowed_tools",
            "allowed_callers",
            "require_approval",
            "server_description",
            "defer_loading",
            "tunnel_id",
        )
    },
    required=("server_label",),
)
_TOOLS = ListOf(Tagged({"function": _FUNCTION_TOOL, "mcp": _MCP_TOOL}))
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
_MAX_OUTPUT_TOKENS = AnyOf((Int(1, 4096), Str(choices=("inf",))))
_MODALITIES = ListOf(Str(choices=("audio", "text")))
_PROMPT = Nullable(Obj({"id": Str(), "variables": Anything(), "version": Nullable(Str())}, required=("id",)))
_REASONING = Obj({"effort": Str(choices=("minimal", "low", "medium", "high", "xhigh"))})

SESSION = Obj(
    {
        "type": Str(choices=("realtime",)),
        "model": Str(nonempty=True),
        "output_modalities": _MODALITIES,
        "instructions": Str(),
        "audio": Obj(
            {
                "input": Obj(
                    {
                        "format": FORMAT,
                        "noise_reduction": Nullable(
                            Obj(
                                {
                                    "type": Str(choices=("near_field", "far_field")),
                                    "strength": Num(0.0),
                                }
                            )
                        ),
                        "transcription": Nullable(_TRANSCRIPTION),
                        "turn_detection": Nullable(_TURN_DETECTION),
                    },
                    merge=True,
                ),
                "output": Obj({"format": FORMAT, "voice": _VOICE, "speed": Num(0.25, 1.5)}, merge=True),
            },
            merge=True,
        ),
        "tools": _TOOLS,
        "tool_choice": _TOOL_CHOICE,
        "max_output_tokens": _MAX_OUTPUT_TOKENS,
        "truncation": AnyOf(
            (
                Str(choices=("auto", "disabled")),
                Tagged(
                    {
                        "retention_ratio": Obj(
                            {
                                "type": _TYPE,
                                "retention_ratio": Num(0.0, 1.0),
                                "token_limits": Obj({"post_instructions": Int(lo=0)}),
                            },
                            required=("retention_ratio",),
                        )
                    }
                ),
            )
        ),
        "tracing": Nullable(
            AnyOf(
                (
                    Str(choices=("auto",)),
                    Obj({"group_id": Str(), "metadata": Anything(), "workflow_name": Str()}),
                )
            )
        ),
        "include": Nullable(ListOf(Str(choices=("item.input_audio_transcription.logprobs",)))),
        "prompt": _PROMPT,
        "reasoning": _REASONING,
        "parallel_tool_calls": Bool(),
    },
    required=("type",),
    merge=True,
)

RESPONSE = Obj(
    {
        "output_modalities": _MODALITIES,
        "instructions": Str(),
        "audio": Obj({"output": Obj({"format": FORMAT, "voice": _VOICE})}),
        "tools": _TOOLS,
        "tool_choice": _TOOL_CHOICE,
        "max_output_tokens": _MAX_OUTPUT_TOKENS,
        "metadata": Nullable(Anything()),
        "conversation": Str(),
        "input": ListOf(Anything()),
        "prompt": _PROMPT,
        "reasoning": _REASONING,
        "parallel_tool_calls": Bool(),
    }
)

_ITEM_COMMON = {
    "type": _TYPE,
    "id": Str(nonempty=True),
    "object": Str(choices=("realtime.item",)),
    "status": Str(choices=("completed", "incomplete", "in_progress")),
}
_CONTENT = Obj(
    {
        "type": Str(choices=("input_text", "input_audio", "input_image", "output_text", "output_audio")),
        "text": Str(),
        "audio": Str(),
        "transcript": Nullable(Str()),
        "image_url": Str(),
        "detail": Str(choices=("auto", "low", "high")),
    }
)
ITEM = Tagged(item_variants(_ITEM_COMMON, _CONTENT))


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
DIALECT = Dialect("openai_realtime", "gpt-realtime-2", SESSION, RESPONSE, ITEM, _new_session, _expiry_message)


server = dialect_server(DIALECT, bearer_authorize)
serve = serving(server)
