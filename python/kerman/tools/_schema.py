"""Typed tools, and the check of a tool's ``parameters``.

A **typed tool** is a function whose parameters are the tool's arguments
(``async def search(query: str, limit: int = 10, *, ctx)``). At registration its signature and
docstring give the JSON Schema the model sees, and a converter built once from the same types
checks each call's arguments and turns them into the values the body is called with (a
dataclass instance for a dataclass parameter, an ``Enum`` member, a tuple...). The function is
wrapped in an adapter with the ``fn(args, ctx)`` signature the loop calls: invalid arguments
become an error result naming the field, and the body is not called; valid ones call the body
with keywords, and what it returns (a value, a coroutine, any awaitable) or raises goes back to
the loop as a plain tool's would.

The **legacy form**, ``fn(args, ctx)`` with the whole arguments dict, is told apart by its first
positional parameter (see :func:`typed_tool`) and is called as it always was.

``check_parameters`` refuses a ``parameters`` that is not a JSON Schema a tool can have: a
structural check of the JSON Schema vocabulary (2020-12, with the older drafts' forms), done
here without a dependency (so a schema is accepted or refused alike on every install), plus
three rules for a tool (an object schema at the top, ``required`` naming declared properties,
``$ref`` pointing inside the schema); for a typed tool, the schema must also describe the
function's arguments.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import enum
import functools
import inspect
import json
import re
import sys
import types
import typing
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, NoReturn, Optional, Sequence, Tuple, Union

from ..errors import InvalidToolArgumentsError
from ..types import ToolContext

__all__ = ["Typed", "typed_tool", "check_parameters", "schema_problem", "parse_docstring", "Docstring"]

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


def _show(value: Any) -> str:
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


def _kind(value: Any) -> str:
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


def _conv_str(value: Any) -> Any:
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


def _conv_bool(value: Any) -> Any:
    if type(value) is bool:
        return value
    raise _Invalid(f"expected a boolean, got {_show(value)}")


def _conv_null(value: Any) -> Any:
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

    def __init__(self, name: str, type: _Type, required: bool, default: Any, description: Optional[str]) -> None:
        self.name = name
        self.type = type
        self.required = required
        self.default = default
        self.description = description


_NO_DEFAULT: Any = object()


def _json_default(value: Any) -> Any:
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

    def convert(value: Any, errors: Optional[List[_Invalid]] = None) -> Dict[str, Any]:
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


def _unexpected(key: Any, names: FrozenSet[str]) -> str:
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


def _is_pydantic_model(tp: Any) -> bool:
    # Only a program that imported pydantic can have a model: never imported here otherwise.
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel) \
        and hasattr(tp, "model_json_schema")


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__") \
        and hasattr(tp, "__total__")


def _own_doc(cls: type) -> Optional[str]:
    """A class's own docstring, not the one ``dataclass`` makes up (``Point(x: int, y: int)``)."""
    doc = cls.__dict__.get("__doc__")
    if not isinstance(doc, str) or (dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "(")):
        return None
    return doc


class _Unresolved:
    """An annotation that could not be evaluated at registration."""

    def __init__(self, text: str, error: BaseException) -> None:
        self.text = text
        self.error = error

    def __repr__(self) -> str:
        return repr(self.text)


class _Compiler:
    """Compiles annotations to _Types for one tool; refuses what it cannot describe."""

    def __init__(self, tool: str, namespace: Dict[str, Any]) -> None:
        self.tool = tool
        self.namespace = namespace
        self.building: List[Any] = []
        self.defs: Dict[str, Any] = {}
        self.markers = _optional_typeddict_markers()

    def fail(self, at: str, what: str) -> NoReturn:
        raise TypeError(f"tool {self.tool!r}, {at}: {what}")

    def resolve(self, tp: Any, at: str) -> Any:
        if isinstance(tp, typing.ForwardRef):
            tp = tp.__forward_arg__
        if isinstance(tp, str):
            tp = _evaluate(tp, self.namespace)
        if isinstance(tp, _Unresolved):
            self.fail(at, f"cannot resolve the annotation {tp.text!r} ({type(tp.error).__name__}: {tp.error}); "
                          "a typed tool's annotations are read at registration, so their names must be defined then")
        return tp

    def compile(self, tp: Any, at: str) -> _Type:
        tp = self.resolve(tp, at)
        simple = _SIMPLE.get(tp) if _hashable(tp) else None
        if simple is not None:
            return simple
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is typing.Annotated:
            inner = self.compile(args[0], at)
            description = next((a for a in args[1:] if isinstance(a, str)), None)
            if description is None:
                return inner
            return _Type({**inner.schema, "description": description}, inner.conv, inner.kinds, inner.label)
        if origin in self.markers:
            return self.compile(args[0], at)
        if origin is Union or origin is types.UnionType:
            return self.union([self.compile(a, at) for a in args])
        if origin is typing.Literal:
            return self.literal(args, at)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return self.enumeration(tp, at)
        if tp in (list, collections.abc.Sequence, collections.abc.MutableSequence) or \
                origin in (list, collections.abc.Sequence, collections.abc.MutableSequence):
            return self.array(self.compile(args[0], f"{at} items") if args else _ANY)
        if tp is tuple or origin is tuple:
            return self.tuple_of(args, at)
        if tp in (dict, collections.abc.Mapping, collections.abc.MutableMapping) or \
                origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
            if args and self.resolve(args[0], at) not in (str, Any):
                self.fail(at, f"{_name(tp)}: JSON object keys are strings, so the key type must be str")
            return self.mapping(self.compile(args[1], f"{at} values") if args else _ANY)
        if getattr(tp, "__supertype__", None) is not None:  # typing.NewType
            return self.compile(tp.__supertype__, at)
        if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or _is_typeddict(tp) or _is_pydantic_model(tp)):
            if tp in self.building:
                self.fail(at, f"{tp.__qualname__} refers to itself; recursive types are not supported in a typed tool")
            self.building.append(tp)
            try:
                if _is_pydantic_model(tp):
                    return self.pydantic(tp)
                if dataclasses.is_dataclass(tp):
                    return self.dataclass(tp, at)
                return self.typeddict(tp, at)
            finally:
                self.building.pop()
        self.fail(at, f"unsupported type {_name(tp)}; a typed tool's parameters may be str, int, float, bool, None, Any, "
                      "Optional/Union, Literal, an Enum, list, tuple, dict[str, X], a dataclass, a TypedDict or a pydantic model")

    # -- composite types --

    def union(self, alternatives: List[_Type]) -> _Type:
        schema = {"anyOf": [a.schema for a in alternatives]}
        label = " or ".join(a.label for a in alternatives)
        kinds = frozenset().union(*(a.kinds for a in alternatives))
        if len(alternatives) == 2 and _NULL in alternatives:  # Optional[X]
            other = alternatives[0] if alternatives[1] is _NULL else alternatives[1]
            inner = other.conv
            if inner is None:
                return _Type(schema, None, kinds, label)

            def optional(value: Any) -> Any:
                if value is None:
                    return None
                if _kind(value) not in other.kinds:
                    raise _Invalid(f"expected {label}, got {_show(value)}")
                return inner(value)

            return _Type(schema, optional, kinds, label)
        if any(a.conv is None for a in alternatives):  # Any is one of them
            return _Type(schema, None, kinds, label)
        options = tuple(alternatives)

        def union(value: Any) -> Any:
            kind = _kind(value)
            candidates = [a for a in options if kind in a.kinds]
            if not candidates:
                raise _Invalid(f"expected {label}, got {_show(value)}")
            first: Optional[_Invalid] = None
            for a in candidates:
                assert a.conv is not None
                try:
                    return a.conv(value)
                except _Invalid as e:
                    first = first or e
            if len(candidates) == 1 and first is not None:
                raise first  # the one alternative of that kind says best what is wrong
            raise _Invalid(f"expected {label}, got {_show(value)}")

        return _Type(schema, union, kinds, label)

    def values(self, values: Sequence[Any], at: str, what: str) -> Tuple[Dict[str, Any], Dict[Tuple[type, Any], Any]]:
        """The schema and the lookup table of a closed set of values (Literal, Enum)."""
        table: Dict[Tuple[type, Any], Any] = {}
        shown: List[Any] = []
        for value in values:
            json_value = value.value if isinstance(value, enum.Enum) else value
            if type(json_value) not in _JSON_TYPE:
                self.fail(at, f"{what} value {json_value!r} is not a JSON string, number, boolean or null")
            table[(type(json_value), json_value)] = value
            shown.append(json_value)
        schema: Dict[str, Any] = {}
        kinds = {_JSON_TYPE[type(v)] for v in shown}
        if len(kinds) == 1:
            schema["type"] = kinds.pop()
        schema["enum"] = shown
        return schema, table

    def closed(self, schema: Dict[str, Any], table: Dict[Tuple[type, Any], Any]) -> _Type:
        allowed = ", ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
        label = f"one of {allowed}"
        kinds = frozenset(_kind(v) for v in schema["enum"])

        def closed(value: Any) -> Any:
            try:
                return table[(type(value), value)]
            except (KeyError, TypeError):  # TypeError: an unhashable list or dict
                raise _Invalid(f"expected {label}, got {_show(value)}") from None

        return _Type(schema, closed, kinds, label)

    def literal(self, values: Sequence[Any], at: str) -> _Type:
        schema, table = self.values(values, at, "Literal")
        return self.closed(schema, table)

    def enumeration(self, tp: type, at: str) -> _Type:
        members: List[Any] = list(typing.cast(Any, tp))
        if not members:
            self.fail(at, f"{tp.__qualname__} has no members")
        schema, table = self.values(members, at, tp.__qualname__)
        return self.closed(schema, table)

    def array(self, item: _Type) -> _Type:
        schema: Dict[str, Any] = {"type": "array"}
        if item.schema:
            schema["items"] = item.schema
        conv = item.conv

        def array(value: Any) -> Any:
            if type(value) is not list:
                raise _Invalid(f"expected an array, got {_show(value)}")
            if conv is None:
                return value
            out = []
            i = 0
            try:
                for i, x in enumerate(value):  # noqa: B007 - i names the failing item
                    out.append(conv(x))
            except _Invalid as e:
                e.path.append(i)
                raise
            return out

        return _Type(schema, array, frozenset(("array",)), "an array")

    def tuple_of(self, args: Sequence[Any], at: str) -> _Type:
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            item = self.compile(args[0], f"{at} items") if args else _ANY
            listed = self.array(item)
            assert listed.conv is not None
            as_list = listed.conv

            def variadic(value: Any) -> Any:
                return tuple(as_list(value))

            return _Type(listed.schema, variadic, listed.kinds, "an array")
        if args == ((),):  # tuple[()]
            args = ()
        items = [self.compile(a, f"{at} item {i}") for i, a in enumerate(args)]
        n = len(items)
        schema: Dict[str, Any] = {"type": "array", "minItems": n, "maxItems": n}
        if items:
            schema["prefixItems"] = [i.schema for i in items]
        convs = tuple(i.conv for i in items)

        def fixed(value: Any) -> Any:
            if type(value) is not list:
                raise _Invalid(f"expected an array, got {_show(value)}")
            if len(value) != n:
                raise _Invalid(f"expected an array of {n} item{'s' if n != 1 else ''}, got {len(value)}")
            out = []
            for i, (conv, x) in enumerate(zip(convs, value, strict=True)):
                if conv is None:
                    out.append(x)
                    continue
                try:
                    out.append(conv(x))
                except _Invalid as e:
                    e.path.append(i)
                    raise
            return tuple(out)

        return _Type(schema, fixed, frozenset(("array",)), f"an array of {n}")

    def mapping(self, value_type: _Type) -> _Type:
        schema: Dict[str, Any] = {"type": "object"}
        if value_type.schema:
            schema["additionalProperties"] = value_type.schema
        conv = value_type.conv

        def mapping(value: Any) -> Any:
            if type(value) is not dict:
                raise _Invalid(f"expected an object, got {_show(value)}")
            if conv is None:
                return value
            out = {}
            for key, x in value.items():
                try:
                    out[key] = conv(x)
                except _Invalid as e:
                    e.path.append(key)
                    raise
            return out

        return _Type(schema, mapping, frozenset(("object",)), "an object")

    def hints(self, tp: type, at: str) -> Dict[str, Any]:
        try:
            return typing.get_type_hints(tp, include_extras=True)
        except Exception as e:  # NameError, mostly: an annotation naming what is not defined
            self.fail(at, f"cannot resolve the annotations of {tp.__qualname__} ({type(e).__name__}: {e})")

    def dataclass(self, tp: type, at: str) -> _Type:
        hints = self.hints(tp, at)
        if any(isinstance(h, dataclasses.InitVar) for h in hints.values()):
            self.fail(at, f"{tp.__qualname__} has InitVar fields, which a typed tool cannot fill")
        docs = parse_docstring(_own_doc(tp) or "")
        fields = []
        for f in dataclasses.fields(tp):
            if not f.init:
                continue
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            default = f.default if f.default is not dataclasses.MISSING else _NO_DEFAULT
            fields.append(_Field(f.name, self.compile(hints.get(f.name, f.type), f"field {tp.__qualname__}.{f.name}"),
                                 required, default, docs.params.get(f.name)))
        convert = _object_conv(fields)

        def build(value: Any) -> Any:
            return tp(**convert(value, None))

        return _Type(_object_schema(fields, docs.summary or None), build, frozenset(("object",)), "an object")

    def typeddict(self, tp: type, at: str) -> _Type:
        hints = self.hints(tp, at)
        required_keys: FrozenSet[str] = getattr(tp, "__required_keys__", frozenset())
        docs = parse_docstring(_own_doc(tp) or "")
        fields = [_Field(name, self.compile(hint, f"field {tp.__qualname__}.{name}"), self.key_required(hint, name in required_keys),
                         _NO_DEFAULT, docs.params.get(name)) for name, hint in hints.items()]
        convert = _object_conv(fields)

        def build(value: Any) -> Any:
            return convert(value, None)

        return _Type(_object_schema(fields, docs.summary or None), build, frozenset(("object",)), "an object")

    def key_required(self, hint: Any, listed: bool) -> bool:
        """Whether a TypedDict key is required: its Required/NotRequired marker, read here
        because ``__required_keys__`` misses the markers of str annotations (Python < 3.13)."""
        for _ in range(3):
            origin = typing.get_origin(hint)
            if origin is typing.Annotated or origin in self.markers:
                name = getattr(origin, "_name", None) or getattr(origin, "__name__", "")
                if name == "Required":
                    return True
                if name == "NotRequired":
                    return False
                hint = typing.get_args(hint)[0]
            else:
                break
        return listed

    def pydantic(self, tp: Any) -> _Type:
        schema: Dict[str, Any] = tp.model_json_schema()
        for name, definition in schema.pop("$defs", {}).items():
            if name in self.defs and self.defs[name] != definition:
                self.fail(f"model {tp.__qualname__}", f"two different pydantic models are named {name!r} in its schema")
            self.defs[name] = definition
        error_class = sys.modules["pydantic"].ValidationError
        validate = tp.model_validate

        def model(value: Any) -> Any:
            try:
                return validate(value)
            except error_class as e:
                raise _from_pydantic(e) from None

        return _Type(schema, model, frozenset(("object",)), "an object")


def _from_pydantic(error: Any) -> _Invalid:
    """A pydantic ValidationError as an _Invalid: its first error, with its location as path."""
    errors = error.errors(include_url=False)
    first = errors[0]
    loc = list(first.get("loc", ()))
    if first.get("type") == "missing" and loc:
        message = f"missing required field {json.dumps(str(loc.pop()))}"
    elif first.get("type") == "extra_forbidden" and loc:
        message = f"unexpected field {json.dumps(str(loc.pop()))}"
    else:
        message = str(first.get("msg", "invalid value"))
        if "input" in first and first.get("type") != "missing":
            message += f", got {_show(first['input'])}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    out = _Invalid(message)
    out.path = list(reversed(loc))
    return out


def _hashable(tp: Any) -> bool:
    try:
        hash(tp)
    except TypeError:
        return False
    return True


def _name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__qualname__ if tp.__module__ in ("builtins", "typing") else f"{tp.__module__}.{tp.__qualname__}"
    return repr(tp)


def _evaluate(text: str, namespace: Dict[str, Any]) -> Any:
    try:
        return eval(text, namespace if "__builtins__" in namespace else dict(namespace))  # noqa: S307 - what typing.get_type_hints does with a str annotation
    except Exception as e:
        return _Unresolved(text, e)


def _namespace(fn: Any) -> Dict[str, Any]:
    """The globals a function's string annotations are evaluated in."""
    for _ in range(100):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif inspect.ismethod(fn):
            fn = fn.__func__
        elif getattr(fn, "__wrapped__", None) is not None:
            fn = fn.__wrapped__
        else:
            break
    if not inspect.isfunction(fn):
        try:
            call: Any = type(fn).__call__
        except AttributeError:
            call = None
        fn = getattr(call, "__func__", call)
    found = getattr(fn, "__globals__", None)
    return found if isinstance(found, dict) else {}


# ---- docstrings ---------------------------------------------------------------------------------


class Docstring:
    """What a docstring says: its first paragraph and each parameter's description."""

    __slots__ = ("summary", "params")

    def __init__(self, summary: str, params: Dict[str, str]) -> None:
        self.summary = summary
        self.params = params


_SECTIONS = ("args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "other parameters",
             "attributes", "returns", "return", "yields", "yield", "raises", "raise", "examples", "example", "notes", "note",
             "see also", "warnings", "warning", "todo", "references")
_PARAM_SECTIONS = ("args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "other parameters",
                   "attributes")
_GOOGLE_HEADER = re.compile(r"^([A-Za-z][A-Za-z ]*?)\s*:\s*$")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:(.*)$")
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")
_NUMPY_ENTRY = re.compile(r"^\*{0,2}(\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?$")
_SPHINX = re.compile(r"^:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]+\s+)?\*{0,2}(\w+)\s*:(.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _google_header(line: str) -> Optional[str]:
    m = _GOOGLE_HEADER.match(line.strip())
    return m.group(1).lower() if m and m.group(1).lower() in _SECTIONS else None


def _numpy_header(lines: List[str], i: int) -> Optional[str]:
    if i + 1 < len(lines) and lines[i].strip() and _NUMPY_RULE.match(lines[i + 1]):
        return lines[i].strip().lower()
    return None


def parse_docstring(doc: str) -> Docstring:
    """The first paragraph (its lines joined by spaces) and the parameter descriptions of a
    Google-style (``Args:``), NumPy-style (``Parameters`` over a rule of dashes) or Sphinx-style
    (``:param name:``) docstring."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    summary: List[str] = []
    for i, line in enumerate(lines):
        if not line.strip() or _google_header(line) or _numpy_header(lines, i) or line.lstrip().startswith(":"):
            break
        summary.append(line.strip())
    params: Dict[str, str] = {}
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        numpy = _numpy_header(lines, i)
        if numpy is not None:
            base = _indent(line)
            i += 2
            name: Optional[List[str]] = None
            text: List[str] = []
            while i < n and _numpy_header(lines, i) is None and not _google_header(lines[i]):
                entry = lines[i]
                if entry.strip() and _indent(entry) <= base:
                    if name and numpy in _PARAM_SECTIONS:
                        _put(params, name, text)
                    m = _NUMPY_ENTRY.match(entry.strip())
                    name, text = ([s.strip().lstrip("*") for s in m.group(1).split(",")] if m else None), []
                elif name is not None:
                    text.append(entry.strip())
                i += 1
            if name and numpy in _PARAM_SECTIONS:
                _put(params, name, text)
            continue
        google = _google_header(line)
        if google is not None:
            base = _indent(line)
            i += 1
            entry_indent: Optional[int] = None
            name = None
            text = []
            while i < n and (not lines[i].strip() or _indent(lines[i]) > base):
                entry = lines[i]
                if entry.strip():
                    if entry_indent is None:
                        entry_indent = _indent(entry)
                    m = _GOOGLE_ENTRY.match(entry.strip()) if _indent(entry) <= entry_indent else None
                    if m:
                        if name and google in _PARAM_SECTIONS:
                            _put(params, name, text)
                        name, text = [m.group(1)], [m.group(3).strip()]
                    elif name is not None:
                        text.append(entry.strip())
                i += 1
            if name and google in _PARAM_SECTIONS:
                _put(params, name, text)
            continue
        m = _SPHINX.match(line.strip())
        if m:
            base = _indent(line)
            text = [m.group(2).strip()]
            i += 1
            while i < n and lines[i].strip() and _indent(lines[i]) > base and not lines[i].lstrip().startswith(":"):
                text.append(lines[i].strip())
                i += 1
            _put(params, [m.group(1)], text)
            continue
        i += 1
    return Docstring(" ".join(summary), params)


def _put(params: Dict[str, str], names: List[str], text: List[str]) -> None:
    description = " ".join(t for t in text if t)
    if description:
        for name in names:
            params.setdefault(name, description)


# ---- typed functions ----------------------------------------------------------------------------


class Typed:
    """A typed tool function, analysed: its schema, the description from its docstring, the
    adapter the loop calls, and its fields (``name`` or ``name?`` when optional, for reprs)."""

    __slots__ = ("schema", "description", "adapter", "fields", "required")

    def __init__(self, schema: Dict[str, Any], description: str, adapter: Callable[[Any, Any], Any],
                 fields: Tuple[str, ...], required: Tuple[str, ...]) -> None:
        self.schema = schema
        self.description = description
        self.adapter = adapter
        self.fields = fields
        self.required = required

    def shape(self) -> str:
        return ", ".join(f if f in self.required else f + "?" for f in self.fields)


def _is_context(annotation: Any) -> bool:
    if isinstance(annotation, _Unresolved):
        return annotation.text.rsplit(".", 1)[-1].strip() == "ToolContext"
    if isinstance(annotation, type) and issubclass(annotation, ToolContext):
        return True
    if typing.get_origin(annotation) is Union:  # Optional[ToolContext]
        return any(_is_context(a) for a in typing.get_args(annotation) if a is not type(None))
    return False


def _is_whole_arguments(p: inspect.Parameter, annotation: Any) -> bool:
    """Whether a first positional parameter reads as the legacy form's arguments dict:
    unannotated, ``Any``, an annotation not defined at run time, or a dict/Mapping of ``Any``."""
    if p.name == "ctx" or _is_context(annotation):
        return False
    if annotation is _EMPTY or annotation is Any or isinstance(annotation, _Unresolved):
        return True
    origin = typing.get_origin(annotation) or annotation
    if origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        args = typing.get_args(annotation)
        return not args or args[-1] in (Any, object)
    return False


def _is_context_like(p: inspect.Parameter, annotation: Any) -> bool:
    """Whether a second positional parameter can be the legacy form's context."""
    return p.name == "ctx" or annotation is _EMPTY or annotation is Any or _is_context(annotation) \
        or isinstance(annotation, _Unresolved)


def _signature(fn: Any) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(fn)
    except NameError:  # Python 3.14+: annotations are evaluated when asked for
        annotationlib = sys.modules.get("annotationlib")
        if annotationlib is None:
            raise
        return inspect.signature(fn, annotation_format=annotationlib.Format.FORWARDREF)  # type: ignore[call-arg]
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return None


def _annotation(p: inspect.Parameter, namespace: Dict[str, Any]) -> Any:
    a = p.annotation
    for _ in range(3):  # "'Point'" under `from __future__ import annotations` is a str twice
        if isinstance(a, typing.ForwardRef):
            a = a.__forward_arg__
        if not isinstance(a, str):
            break
        a = _evaluate(a, namespace)
    return a


def typed_tool(name: str, fn: Callable[..., Any]) -> Optional[Typed]:
    """The analysis of ``fn`` as a typed tool, or ``None`` for the legacy ``fn(args, ctx)`` form.

    The legacy form: the first positional parameter is the arguments dict (unannotated,
    ``Any``, ``dict``/``Mapping`` of ``Any``) and a second one, if any, is the context
    (unannotated, ``Any``, ``ToolContext``, or named ``ctx``); also a function taking only
    ``*args``, and a callable without a signature. (A lone arguments parameter is the legacy form
    missing its context: called as always, it fails with the call's ``TypeError``.) Anything
    else is typed; what reads as both, or as neither, raises ``TypeError`` naming the parameter.
    """
    if getattr(fn, "__kerman_adapter__", False):  # a typed tool's adapter, registered again
        fn = fn.__wrapped__  # type: ignore[attr-defined]
    sig = _signature(fn)
    if sig is None:
        return None
    namespace = _namespace(fn)
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
    named = [p for p in params if p.kind is not _P.VAR_POSITIONAL and p.kind is not _P.VAR_KEYWORD]
    where = f"tool {name!r}"
    if not positional and any(p.kind is _P.VAR_POSITIONAL for p in params) and \
            all(p.annotation is _EMPTY for p in named):
        return None  # lambda *_: ...
    if positional:
        first = positional[0]
        first_annotation = _annotation(first, namespace)
        if _is_whole_arguments(first, first_annotation):
            if len(positional) == 1:
                if len(named) == 1 and not isinstance(first_annotation, _Unresolved):
                    return None  # the legacy form missing its context parameter: as before
            else:
                second = positional[1]
                second_annotation = _annotation(second, namespace)
                if _is_context_like(second, second_annotation):
                    return None
                raise TypeError(
                    f"{where}: the signature is ambiguous: its first parameter {_param(first)} reads as the arguments "
                    f"dict of the (args, ctx) form, whose second parameter is the ToolContext, but {_param(second)} is "
                    f"not. For a typed tool, give {first.name!r} its own type (not Any or a dict of Any), or make the "
                    f"arguments keyword-only (def {getattr(fn, '__name__', 'f')}(*, {_param(first, False)}, "
                    f"{_param(second, False)})); for the (args, ctx) form, annotate the second parameter ToolContext")
    return _typed(name, fn, sig, namespace)


def _param(p: inspect.Parameter, quoted: bool = True) -> str:
    """``name: annotation`` as written (a str annotation without its quotes)."""
    a = p.annotation
    text = p.name if a is _EMPTY else f"{p.name}: {a if isinstance(a, str) else inspect.formatannotation(a)}"
    return repr(text) if quoted else text


def _typed(name: str, fn: Callable[..., Any], sig: inspect.Signature, namespace: Dict[str, Any]) -> Typed:
    compiler = _Compiler(name, namespace)
    docs = parse_docstring(inspect.getdoc(fn) or "")
    context: Optional[str] = None
    fields: List[_Field] = []
    for p in sig.parameters.values():
        at = f"parameter {p.name!r}"
        if p.kind is _P.VAR_POSITIONAL or p.kind is _P.VAR_KEYWORD:
            compiler.fail(at, f"a typed tool cannot take {'*' if p.kind is _P.VAR_POSITIONAL else '**'}{p.name}; "
                              "name each argument (or use the (args, ctx) form)")
        annotation = _annotation(p, namespace)
        if p.name == "ctx" or _is_context(annotation):
            if p.kind is _P.POSITIONAL_ONLY:
                compiler.fail(at, "the context is passed by keyword, so it cannot be positional-only")
            if p.name == "ctx" and not (annotation is _EMPTY or annotation is Any or _is_context(annotation)):
                compiler.fail(at, f"a parameter named ctx receives the ToolContext, but it is annotated {_name(annotation)}; "
                                  "annotate it ToolContext, or rename it to make it an argument")
            if context is not None:
                compiler.fail(at, f"two parameters receive the ToolContext ({context!r} and {p.name!r})")
            context = p.name
            continue
        if p.kind is _P.POSITIONAL_ONLY:
            compiler.fail(at, "arguments are passed by keyword, so a typed tool's parameters cannot be positional-only")
        if annotation is _EMPTY:
            compiler.fail(at, "it has no annotation; a typed tool's arguments are annotated with their types "
                              "(Any accepts any JSON value)")
        fields.append(_Field(p.name, compiler.compile(annotation, at), p.default is _EMPTY, p.default,
                             docs.params.get(p.name)))
    schema = _object_schema(fields)
    if compiler.defs:
        schema["$defs"] = compiler.defs
    adapter = _adapter(fn, _object_conv(fields), context)
    return Typed(schema, docs.summary, adapter, tuple(f.name for f in fields), tuple(f.name for f in fields if f.required))


def _adapter(fn: Callable[..., Any], convert: Callable[[Any, Optional[List[_Invalid]]], Dict[str, Any]],
             context: Optional[str]) -> Callable[[Any, Any], Any]:
    """``fn(args, ctx)`` for the loop: the arguments converted, or an error result naming what
    is wrong without calling the body; then the body called with keywords, its value (or
    awaitable) returned and its exception raised as they are."""

    def call(args: Any, ctx: Any) -> Any:
        errors: List[_Invalid] = []
        try:
            kwargs = convert(args, errors)
        except _Invalid as e:  # not an object at all
            raise _refused([e]) from None
        if errors:
            raise _refused(errors)
        if context is not None:
            kwargs[context] = ctx
        return fn(**kwargs)

    functools.update_wrapper(call, fn)
    call.__kerman_adapter__ = True  # type: ignore[attr-defined]
    mark = getattr(inspect, "markcoroutinefunction", None)  # Python 3.12+
    if mark is not None and inspect.iscoroutinefunction(fn):
        mark(call)
    return call


# ---- checking a given parameters schema ---------------------------------------------------------

_TYPE_NAMES = ("array", "boolean", "integer", "null", "number", "object", "string")
_SCHEMA_KEYS = ("additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems", "contains",
                "propertyNames", "not", "if", "then", "else", "contentSchema")
_SCHEMA_MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LIST_KEYS = ("allOf", "anyOf", "oneOf", "prefixItems")
_STRING_KEYS = ("title", "description", "$comment", "format", "pattern", "contentMediaType", "contentEncoding", "$id",
                "$schema", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef")
_COUNT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
               "maxContains")
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_BOOL_KEYS = ("uniqueItems", "readOnly", "writeOnly", "deprecated", "$recursiveAnchor")
_JSON_KEYS = ("const", "default")
_MAX_DEPTH = 100


class _Bad(Exception):
    def __init__(self, path: List[Union[str, int]], message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def _what(value: Any) -> str:
    return _show(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return _is_number(value) and value >= 0 and float(value).is_integer()


def _check_json(value: Any, path: List[Union[str, int]]) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise _Bad(path, f"not JSON ({e})") from None


def _check_schema(schema: Any, path: List[Union[str, int]], refs: List[Tuple[List[Union[str, int]], str]]) -> None:
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


def _pointer(root: Any, ref: str) -> bool:
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


def schema_problem(parameters: Any) -> Optional[str]:
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
        return f'a tool\'s arguments are an object: the schema needs "type": "object" at the top, got {_what(root.get("type"))}' \
            if "type" in root else 'a tool\'s arguments are an object: the schema needs "type": "object" at the top'
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
                raise ValueError(f"tool {name!r}: parameters describes {prop!r}, which the function has no parameter for "
                                 f"(it takes {', '.join(typed.fields) or 'no arguments'})")
        required = parameters.get("required", ())
        for field in typed.required:
            if field not in required:
                raise ValueError(f"tool {name!r}: parameter {field!r} is required by the function but not by parameters")
