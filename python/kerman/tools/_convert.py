"""The pieces a typed tool's schema and converters are built from: the error an argument that does
not fit its type raises (its path built on the way out), the compiled type of a JSON scalar, and
the schema and converter of an object with named fields (a function's parameters, a dataclass, a
TypedDict)."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import inspect
import json
import re
import sys
import typing
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

from ..errors import InvalidToolArgumentsError

_EMPTY: Any = inspect.Parameter.empty
_P = inspect.Parameter

# ---- validation errors --------------------------------------------------------------------------


class _Invalid(Exception):
    """An argument that does not fit its type. ``path`` is built innermost first while the
    error travels out through the containers."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: List[Union[str, int]] = []

    def text(self) -> str:
        path = _path(reversed(self.path))
        return f"{path}: {self.message}" if path else self.message


_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*\Z")


def _path(segments: typing.Iterable[Union[str, int]]) -> str:
    """``filters.tags[2]``; a key that is not a name is quoted: ``counts["a b"]``."""
    out = ""
    for segment in segments:
        if isinstance(segment, int):
            out += f"[{segment}]"
        elif _IDENTIFIER.match(segment):
            out += f".{segment}" if out else segment
        else:
            out += f"[{json.dumps(segment, ensure_ascii=False)}]"
    return out


def _show(value: object) -> str:
    """A value as the error shows it: JSON for a scalar (cut when long), else its kind."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: object) -> str:
    """The JSON kind of a decoded value."""
    t = type(value)
    if t is str:
        return "string"
    if t is bool:
        return "boolean"
    if t is int:
        return "integer"
    if t is float:
        return "number"
    if value is None:
        return "null"
    if t is list:
        return "array"
    if t is dict:
        return "object"
    return t.__name__


def _refused(errors: Sequence[_Invalid]) -> InvalidToolArgumentsError:
    return InvalidToolArgumentsError("; ".join(e.text() for e in errors))


# ---- compiled types -----------------------------------------------------------------------------

# A converter takes a decoded JSON value and returns the value the body gets, or raises
# _Invalid. ``None`` stands for "any value, as it is" (no call at all).
Conv = Optional[Callable[[Any], Any]]
ALL_KINDS: FrozenSet[str] = frozenset(("string", "integer", "number", "boolean", "null", "array", "object"))


class _Type:
    """A type compiled once: its schema, its converter, the JSON kinds it can accept (to pick
    the alternatives of a union worth trying) and how an error names it."""

    __slots__ = ("schema", "conv", "kinds", "label")

    def __init__(self, schema: Dict[str, Any], conv: Conv, kinds: FrozenSet[str], label: str) -> None:
        self.schema = schema
        self.conv = conv
        self.kinds = kinds
        self.label = label


def _conv_str(value: object) -> Any:
    if type(value) is str:
        return value
    raise _Invalid(f"expected a string, got {_show(value)}")


def _conv_int(value: Any) -> Any:
    t = type(value)
    if t is int:
        return value
    if t is float and value.is_integer():  # 10.0 is an integer to JSON Schema
        return int(value)
    raise _Invalid(f"expected an integer, got {_show(value)}")


def _conv_float(value: Any) -> Any:
    t = type(value)
    if t is float:
        return value
    if t is int:
        try:
            return float(value)
        except OverflowError:
            raise _Invalid(f"number out of range: {_show(value)}") from None
    raise _Invalid(f"expected a number, got {_show(value)}")


def _conv_bool(value: object) -> Any:
    if type(value) is bool:
        return value
    raise _Invalid(f"expected a boolean, got {_show(value)}")


def _conv_null(value: object) -> Any:
    if value is None:
        return None
    raise _Invalid(f"expected null, got {_show(value)}")


_STR = _Type({"type": "string"}, _conv_str, frozenset(("string",)), "a string")
_INT = _Type({"type": "integer"}, _conv_int, frozenset(("integer", "number")), "an integer")
_FLOAT = _Type({"type": "number"}, _conv_float, frozenset(("integer", "number")), "a number")
_BOOL = _Type({"type": "boolean"}, _conv_bool, frozenset(("boolean",)), "a boolean")
_NULL = _Type({"type": "null"}, _conv_null, frozenset(("null",)), "null")
_ANY = _Type({}, None, ALL_KINDS, "any value")
_SIMPLE = {str: _STR, int: _INT, float: _FLOAT, bool: _BOOL, type(None): _NULL, None: _NULL, Any: _ANY, object: _ANY}

_JSON_TYPE = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


class _Field:
    __slots__ = ("name", "type", "required", "default", "description")

    def __init__(self, name: str, type: _Type, required: bool, default: object, description: Optional[str]) -> None:
        self.name = name
        self.type = type
        self.required = required
        self.default = default
        self.description = description


_NO_DEFAULT: Any = object()


def _json_default(value: object) -> Any:
    """The schema's ``default`` for a Python default, or _NO_DEFAULT when it is not JSON."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return _NO_DEFAULT
    return value


def _object_schema(fields: Sequence[_Field], description: Optional[str] = None) -> Dict[str, Any]:
    properties: Dict[str, Any] = {}
    for f in fields:
        schema = dict(f.type.schema)
        if f.description and "description" not in schema:
            schema["description"] = f.description
        if not f.required and f.default is not _NO_DEFAULT:
            default = _json_default(f.default)
            if default is not _NO_DEFAULT:
                schema["default"] = default
        properties[f.name] = schema
    out: Dict[str, Any] = {"type": "object"}
    if description:
        out["description"] = description
    out["properties"] = properties
    required = [f.name for f in fields if f.required]
    if required:
        out["required"] = required
    out["additionalProperties"] = False
    return out


def _object_conv(fields: Sequence[_Field]) -> Callable[[Any, Optional[List[_Invalid]]], Dict[str, Any]]:
    """The converter of an object with these fields: a dict of the converted values of the
    fields present. Unknown keys and missing required fields are errors. With ``errors`` (the
    top level) every field's error is collected there; without, the first one is raised."""
    items = tuple((f.name, f.type.conv, f.required) for f in fields)
    names = frozenset(f.name for f in fields)

    def convert(value: object, errors: Optional[List[_Invalid]] = None) -> Dict[str, Any]:
        if type(value) is not dict:
            raise _Invalid(f"expected an object, got {_show(value)}")
        out: Dict[str, Any] = {}
        found = 0
        for name, conv, required in items:
            if name in value:
                found += 1
                if conv is None:
                    out[name] = value[name]
                    continue
                try:
                    out[name] = conv(value[name])
                except _Invalid as e:
                    e.path.append(name)
                    if errors is None:
                        raise
                    errors.append(e)
            elif required:
                missing = _Invalid(f"missing required field {json.dumps(name)}")
                if errors is None:
                    raise missing
                errors.append(missing)
        if found != len(value):
            for key in value:
                if key not in names:
                    unexpected = _Invalid(_unexpected(key, names))
                    if errors is None:
                        raise unexpected
                    errors.append(unexpected)
        return out

    return convert


def _unexpected(key: object, names: FrozenSet[str]) -> str:
    text = f"unexpected field {json.dumps(key, ensure_ascii=False)}"
    close = difflib.get_close_matches(str(key), sorted(names), n=1)
    return f"{text} (did you mean {json.dumps(close[0])}?)" if close else text


def _optional_typeddict_markers() -> Tuple[Any, ...]:
    markers = []
    for module in (typing, sys.modules.get("typing_extensions")):
        for name in ("Required", "NotRequired", "ReadOnly"):
            marker = getattr(module, name, None)
            if marker is not None:
                markers.append(marker)
    return tuple(markers)


def _is_pydantic_model(tp: object) -> bool:
    # Only a program that imported pydantic can have a model: never imported here otherwise.
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel) and hasattr(tp, "model_json_schema")


def _is_typeddict(tp: object) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__") and hasattr(tp, "__total__")


def _own_doc(cls: type) -> Optional[str]:
    """A class's own docstring, not the one ``dataclass`` makes up (``Point(x: int, y: int)``)."""
    doc = cls.__dict__.get("__doc__")
    if not isinstance(doc, str) or (dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "(")):
        return None
    return doc
