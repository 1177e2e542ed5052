"""What the OpenAI-family fakes share about bad client events: the error to raise and how a JSON value is named.

A fake's core raises `ClientError` deep inside validation and turns it into the protocol's `error` event in one
place, so peer input never raises out of the core.
"""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """A bad client event: its error `code`, human `message` and the dotted `param` path it concerns."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


TYPE_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    bool: "a boolean",
    dict: "an object",
    list: "an array",
}


def json_type(value: Any) -> str:
    """How an error message names the JSON type of `value`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    return TYPE_NAMES.get(type(value), "an unknown type")
