"""The one schema validator of the provider fakes: JSON values checked against declarative specs, and the error a
bad client value becomes.

A fake describes what a client may send (`Obj`, `Str`, `Int`, ... below) and `validate` checks a value against
it, raising `ClientError` with the OpenAI family's code, message and dotted `param` path for the first problem
(the order: an object's members in the order sent, each checked whole, then its missing required members). The
fake's core raises it deep inside validation and turns it into its protocol's `error` event in one place
(kit_openai.py `OpenAICore`), so peer input never raises out of the core.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class ClientError(Exception):
    """A bad client event: its error `code`, human `message` and the dotted `param` path it concerns."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


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
    return _TYPE_NAMES.get(type(value), "an unknown type")


_TYPE_NAMES: dict[type, str] = {str: "a string", dict: "an object", list: "an array"}


@dataclass(frozen=True, slots=True)
class Obj:
    """A JSON object with known `fields`. `merge`: a session.update deep-merges into it (else replaces it);
    `defaults` are filled in whenever the object is set anew."""

    fields: Mapping[str, Spec] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    merge: bool = False
    defaults: Mapping[str, Any] = field(default_factory=dict)
    open: bool = False
    """Members it does not list are let through unchecked."""


@dataclass(frozen=True, slots=True)
class Str:
    choices: tuple[str, ...] | None = None
    nonempty: bool = False


@dataclass(frozen=True, slots=True)
class Int:
    lo: int | None = None
    hi: int | None = None
    choices: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Num:
    lo: float | None = None
    hi: float | None = None


@dataclass(frozen=True, slots=True)
class Bool:
    pass


@dataclass(frozen=True, slots=True)
class Nullable:
    inner: Spec


@dataclass(frozen=True, slots=True)
class ListOf:
    item: Spec


@dataclass(frozen=True, slots=True)
class AnyOf:
    """The first option whose JSON type fits the value decides (e.g. a voice name or `{"id": ...}`)."""

    options: tuple[Spec, ...]


@dataclass(frozen=True, slots=True)
class Tagged:
    """An object discriminated by its `type` (or `key`) field; each variant lists that field too."""

    variants: Mapping[str, Obj]
    key: str = "type"


@dataclass(frozen=True, slots=True)
class Anything:
    pass


Spec = Obj | Str | Int | Num | Bool | Nullable | ListOf | AnyOf | Tagged | Anything


def _fits(spec: Spec, value: Any) -> bool:
    """Does the JSON type of `value` fit `spec` (without looking inside)?"""
    if isinstance(spec, Anything):
        return True
    if isinstance(spec, Nullable):
        return value is None or _fits(spec.inner, value)
    if isinstance(spec, (Obj, Tagged)):
        return isinstance(value, dict)
    if isinstance(spec, Str):
        return isinstance(value, str)
    if isinstance(spec, Bool):
        return isinstance(value, bool)
    if isinstance(spec, Int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(spec, Num):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(spec, ListOf):
        return isinstance(value, list)
    return any(_fits(o, value) for o in spec.options)


_EXPECTED = {
    Obj: "an object",
    Tagged: "an object",
    Str: "a string",
    Bool: "a boolean",
    Int: "an integer",
    Num: "a number",
    ListOf: "an array",
}


def invalid_value(value: Any, path: str, detail: str) -> ClientError:
    return ClientError("invalid_value", f"Invalid value: {json.dumps(value)}. {detail}", path)


def validate(spec: Spec, value: Any, path: str) -> None:
    """Check `value` against `spec`; raise `ClientError` naming the dotted `path` of the first problem."""
    if isinstance(spec, Anything):
        return
    if isinstance(spec, Nullable):
        if value is not None:
            validate(spec.inner, value, path)
        return
    if isinstance(spec, AnyOf):
        for option in spec.options:
            if _fits(option, value):
                validate(option, value, path)
                return
        raise ClientError("invalid_type", f"Invalid type for '{path}': got {json_type(value)}.", path)
    if not _fits(spec, value):
        expected = _EXPECTED[type(spec)]
        message = f"Invalid type for '{path}': expected {expected}, but got {json_type(value)} instead."
        raise ClientError("invalid_type", message, path)
    if isinstance(spec, Tagged):
        if spec.key not in value:
            message = f"Missing required parameter: '{path}.{spec.key}'."
            raise ClientError("missing_required_parameter", message, f"{path}.{spec.key}")
        tag = value[spec.key]
        if tag not in spec.variants:
            supported = ", ".join(f"'{v}'" for v in spec.variants)
            raise invalid_value(tag, f"{path}.{spec.key}", f"Supported values are: {supported}.")
        validate(spec.variants[tag], value, path)
    elif isinstance(spec, Obj):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if key not in spec.fields:
                if spec.open:
                    continue
                raise ClientError("unknown_parameter", f"Unknown parameter: '{sub}'.", sub)
            validate(spec.fields[key], item, sub)
        for key in spec.required:
            if key not in value:
                sub = f"{path}.{key}" if path else key
                raise ClientError("missing_required_parameter", f"Missing required parameter: '{sub}'.", sub)
    elif isinstance(spec, ListOf):
        for i, item in enumerate(value):
            validate(spec.item, item, f"{path}[{i}]")
    elif isinstance(spec, Str):
        if spec.choices is not None and value not in spec.choices:
            supported = ", ".join(f"'{c}'" for c in spec.choices)
            raise invalid_value(value, path, f"Supported values are: {supported}.")
        if spec.nonempty and not value:
            raise invalid_value(value, path, "Expected a non-empty string.")
    elif isinstance(spec, (Int, Num)):
        if isinstance(spec, Int) and spec.choices is not None and value not in spec.choices:
            supported = ", ".join(str(c) for c in spec.choices)
            raise invalid_value(value, path, f"Supported values are: {supported}.")
        if spec.lo is not None and value < spec.lo:
            raise invalid_value(value, path, f"Expected a value >= {spec.lo}.")
        if spec.hi is not None and value > spec.hi:
            raise invalid_value(value, path, f"Expected a value <= {spec.hi}.")


def _with_defaults(spec: Spec, value: Any) -> Any:
    """A fresh copy of a newly set value, its object's `defaults` filled in."""
    value = copy.deepcopy(value)
    if isinstance(spec, Nullable):
        spec = spec.inner
    if isinstance(spec, Tagged) and isinstance(value, dict):
        spec = spec.variants[value[spec.key]]
    if isinstance(spec, Obj) and isinstance(value, dict):
        for key, default in spec.defaults.items():
            value.setdefault(key, copy.deepcopy(default))
    return value


def merge(spec: Spec, current: Any, update: Any) -> Any:
    """`update` (already validated) applied to `current`: deep-merged where the schema says so, else replaced."""
    inner = spec.inner if isinstance(spec, Nullable) else spec
    if isinstance(inner, Obj) and inner.merge and isinstance(current, dict) and isinstance(update, dict):
        result = dict(current)
        for key, value in update.items():
            result[key] = merge(inner.fields[key], current.get(key), value)
        return result
    return _with_defaults(spec, update)


def members(allowed: Iterable[str], required: tuple[str, ...] = ()) -> Obj:
    """An object whose members may be `allowed` (any value) and must include `required`."""
    return Obj({k: Anything() for k in allowed}, required)
