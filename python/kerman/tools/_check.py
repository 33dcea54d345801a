"""The check of a tool's given ``parameters``.

``check_parameters`` refuses a ``parameters`` that is not a JSON Schema a tool can have: a
structural check of the JSON Schema vocabulary (2020-12, with the older drafts' forms), done
here without a dependency (so a schema is accepted or refused alike on every install), plus
three rules for a tool (an object schema at the top, ``required`` naming declared properties,
``$ref`` pointing inside the schema); for a typed tool, the schema must also describe the
function's arguments.
"""

from __future__ import annotations

import json
from typing import Any, List, Mapping, Optional, Tuple, Union

from ._convert import _path, _show
from ._typed import Typed

__all__ = ["check_parameters", "schema_problem"]

_TYPE_NAMES = ("array", "boolean", "integer", "null", "number", "object", "string")
_SCHEMA_KEYS = (
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
)
_SCHEMA_MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LIST_KEYS = ("allOf", "anyOf", "oneOf", "prefixItems")
_STRING_KEYS = (
    "title",
    "description",
    "$comment",
    "format",
    "pattern",
    "contentMediaType",
    "contentEncoding",
    "$id",
    "$schema",
    "$ref",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
)
_COUNT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains")
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_BOOL_KEYS = ("uniqueItems", "readOnly", "writeOnly", "deprecated", "$recursiveAnchor")
_JSON_KEYS = ("const", "default")
_MAX_DEPTH = 100


class _Bad(Exception):
    def __init__(self, path: List[Union[str, int]], message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def _what(value: object) -> str:
    return _show(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return _is_number(value) and value >= 0 and float(value).is_integer()


def _check_json(value: object, path: List[Union[str, int]]) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise _Bad(path, f"not JSON ({e})") from None


def _check_schema(schema: object, path: List[Union[str, int]], refs: List[Tuple[List[Union[str, int]], str]]) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise _Bad(path, f"expected a schema (an object or a boolean), got {_what(schema)}")
    if len(path) > _MAX_DEPTH:
        raise _Bad(path, f"nested deeper than {_MAX_DEPTH} levels")
    for key, value in schema.items():
        at = [*path, key]
        if not isinstance(key, str):
            raise _Bad(path, f"key {key!r} is not a string")
        if key == "type":
            names = value if isinstance(value, list) else [value]
            if isinstance(value, list) and (not value or len(set(map(repr, value))) != len(value)):
                raise _Bad(at, "expected a type name or a non-empty list of distinct type names")
            for name in names:
                if name not in _TYPE_NAMES:
                    shown = ", ".join(json.dumps(t) for t in _TYPE_NAMES)
                    raise _Bad(at, f"{_what(name)} is not a JSON Schema type (one of {shown})")
        elif key in _SCHEMA_KEYS:
            _check_schema(value, at, refs)
        elif key == "items":
            if isinstance(value, list):  # the form of drafts before 2020-12
                for i, item in enumerate(value):
                    _check_schema(item, [*at, i], refs)
            else:
                _check_schema(value, at, refs)
        elif key in _SCHEMA_MAP_KEYS:
            if not isinstance(value, dict):
                raise _Bad(at, f"expected an object mapping names to schemas, got {_what(value)}")
            for name, sub in value.items():
                _check_schema(sub, [*at, name], refs)
        elif key in _SCHEMA_LIST_KEYS:
            if not isinstance(value, list) or not value:
                raise _Bad(at, f"expected a non-empty list of schemas, got {_what(value)}")
            for i, sub in enumerate(value):
                _check_schema(sub, [*at, i], refs)
        elif key == "required":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise _Bad(at, f"expected a list of property names (strings), got {_what(value)}")
            if len(set(value)) != len(value):
                raise _Bad(at, "names a property twice")
        elif key in ("enum", "examples"):
            if not isinstance(value, list):
                raise _Bad(at, f"expected a list, got {_what(value)}")
            _check_json(value, at)
        elif key in _JSON_KEYS:
            _check_json(value, at)
        elif key in _STRING_KEYS:
            if not isinstance(value, str):
                raise _Bad(at, f"expected a string, got {_what(value)}")
            if key == "$ref":
                refs.append((at, value))
        elif key in _COUNT_KEYS:
            if not _is_count(value):
                raise _Bad(at, f"expected a non-negative integer, got {_what(value)}")
        elif key in _NUMBER_KEYS:
            if not _is_number(value):
                raise _Bad(at, f"expected a number, got {_what(value)}")
        elif key == "multipleOf":
            if not _is_number(value) or value <= 0:
                raise _Bad(at, f"expected a number greater than 0, got {_what(value)}")
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise _Bad(at, f"expected a boolean, got {_what(value)}")
        elif key in ("dependentRequired", "dependencies"):
            if not isinstance(value, dict):
                raise _Bad(at, f"expected an object, got {_what(value)}")
            for name, sub in value.items():
                if isinstance(sub, list) and all(isinstance(v, str) for v in sub):
                    continue
                if key == "dependencies":
                    _check_schema(sub, [*at, name], refs)
                else:
                    raise _Bad([*at, name], f"expected a list of property names (strings), got {_what(sub)}")
        elif key == "$vocabulary":
            if not isinstance(value, dict) or not all(isinstance(v, bool) for v in value.values()):
                raise _Bad(at, "expected an object of booleans")
        # Any other keyword is allowed, as JSON Schema allows it (an annotation).


def _pointer(root: object, ref: str) -> bool:
    """Whether a local ``$ref`` (``#`` or ``#/json/pointer``) names a part of ``root``."""
    if ref == "#":
        return True
    if not ref.startswith("#/"):
        return True  # a plain-name fragment ($anchor): not followed here
    node = root
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return True


def schema_problem(parameters: object) -> Optional[str]:
    """What makes ``parameters`` unfit as a tool's JSON Schema, or ``None``."""
    if not isinstance(parameters, Mapping):
        return f"expected a JSON Schema object (a dict), got {type(parameters).__name__}"
    root = dict(parameters)
    refs: List[Tuple[List[Union[str, int]], str]] = []
    try:
        _check_schema(root, [], refs)
    except _Bad as e:
        where = _path(e.path)
        return f"{where}: {e.message}" if where else e.message
    if root.get("type") != "object":
        return (
            f'a tool\'s arguments are an object: the schema needs "type": "object" at the top, got {_what(root.get("type"))}'
            if "type" in root
            else 'a tool\'s arguments are an object: the schema needs "type": "object" at the top'
        )
    properties = root.get("properties")
    if isinstance(properties, dict):
        for name in root.get("required", ()):
            if name not in properties:
                return f"required: names {json.dumps(name)}, which is not in properties"
    for at, ref in refs:
        if not ref.startswith("#"):
            return f"{_path(at)}: {json.dumps(ref)} points outside the schema; a tool's schema must be self-contained (#/$defs/...)"
        if not _pointer(root, ref):
            return f"{_path(at)}: {json.dumps(ref)} does not point to a part of the schema"
    return None


def check_parameters(name: str, parameters: Any, typed: Optional[Typed] = None) -> None:
    """Raises ``ValueError`` naming what is wrong when ``parameters`` is not a tool's JSON
    Schema; for a typed tool, also when it describes other arguments than the function has."""
    problem = schema_problem(parameters)
    if problem is not None:
        raise ValueError(f"tool {name!r}: invalid parameters schema: {problem}")
    if typed is None:
        return
    properties = parameters.get("properties")
    if isinstance(properties, dict):
        for prop in properties:
            if prop not in typed.fields:
                raise ValueError(
                    f"tool {name!r}: parameters describes {prop!r}, which the function has no parameter for "
                    f"(it takes {', '.join(typed.fields) or 'no arguments'})"
                )
        required = parameters.get("required", ())
        for field in typed.required:
            if field not in required:
                raise ValueError(f"tool {name!r}: parameter {field!r} is required by the function but not by parameters")
