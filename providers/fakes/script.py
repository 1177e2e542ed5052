"""Scripted answers for the provider fakes: what the fake model does after each caller utterance.

By default every fake is the echo model (it speaks each utterance back). A script replaces that turn by turn:
the N-th caller utterance gets the N-th `Turn`; when the script runs out, the `then` turn repeats (echo by
default). A turn may first call a tool; the fake then waits for the client's tool result before speaking,
as the real services do.

Scripts are plain JSON so a test, or `parlora-bridge fake-provider --script FILE`, can give one:

    {"turns": [{"reply": "tone", "duration_ms": 3000},
               {"tool_call": {"name": "lookup_order", "arguments": {"order_id": "42"}}, "reply": "tone",
                "duration_ms": 800}],
     "then": {"reply": "echo"}}

`"tools_answer_callers": true` keeps a turn's tool call for caller audio: a turn that answers a text input (an
application result given as context) speaks its reply instead, as a model that was told the result would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPLIES = ("echo", "tone", "silence")


@dataclass(frozen=True, slots=True)
class ToolCallScript:
    """A function call (or, on GPT-Live, a delegation to `name`) the fake model makes."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Turn:
    """One scripted answer: `echo` the utterance, or speak a `tone` (or `silence`) of `duration_ms`."""

    reply: str = "echo"
    duration_ms: int = 1000
    frequency_hz: float = 440.0
    tool_call: ToolCallScript | None = None
    transcript: str | None = None  # assistant text; a placeholder like "[tone 1, 3.0 s]" when None

    def __post_init__(self) -> None:
        if self.reply not in REPLIES:
            raise ValueError(f"reply must be one of {REPLIES}, got {self.reply!r}")
        if self.duration_ms <= 0:
            raise ValueError("duration_ms must be positive")


ECHO = Turn()


@dataclass(frozen=True, slots=True)
class Script:
    turns: tuple[Turn, ...] = ()
    then: Turn = ECHO
    # A model asks for a tool when the caller asks for something. With this set, a turn answering a text
    # input (an application result or update given as context) speaks its reply and calls nothing.
    tools_answer_callers: bool = False

    def turn(self, utterance_index: int) -> Turn:
        """The turn answering the `utterance_index`-th utterance (1-based)."""
        if 1 <= utterance_index <= len(self.turns):
            return self.turns[utterance_index - 1]
        return self.then


def label(kind: str, n: int, seconds: float) -> str:
    """The placeholder text of the fake model: what it heard (`[utterance 2, 0.6 s]`) or said (`[echo 2, 0.6 s]`,
    `[tone 3, 1.0 s]`) when the script gives no transcript."""
    return f"[{kind} {n}, {seconds:.1f} s]"


def _turn(data: dict[str, Any]) -> Turn:
    call = data.get("tool_call")
    tool = ToolCallScript(str(call["name"]), dict(call.get("arguments") or {})) if call else None
    return Turn(
        reply=str(data.get("reply", "echo")),
        duration_ms=int(data.get("duration_ms", 1000)),
        frequency_hz=float(data.get("frequency_hz", 440.0)),
        tool_call=tool,
        transcript=data.get("transcript"),
    )


def script_from_json(data: dict[str, Any]) -> Script:
    """A Script from its JSON form; ValueError/KeyError on a malformed one."""
    turns = tuple(_turn(t) for t in data.get("turns", ()))
    then = _turn(data["then"]) if "then" in data else ECHO
    return Script(turns, then, bool(data.get("tools_answer_callers", False)))


def load_script(path: str | Path) -> Script:
    return script_from_json(json.loads(Path(path).read_text()))
