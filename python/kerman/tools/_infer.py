"""Annotations compiled to a JSON Schema and a converter, once per tool at registration: scalars,
containers, unions, literals, enums, dataclasses, TypedDicts and pydantic models; what cannot be
described is refused naming the parameter."""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import inspect
import json
import sys
import types
import typing
from typing import Any, Dict, FrozenSet, List, NoReturn, Optional, Sequence, Tuple, Union

from ._convert import (
    _ANY,
    _JSON_TYPE,
    _NO_DEFAULT,
    _NULL,
    _SIMPLE,
    _Field,
    _Invalid,
    _is_pydantic_model,
    _is_typeddict,
    _kind,
    _object_conv,
    _object_schema,
    _optional_typeddict_markers,
    _own_doc,
    _show,
    _Type,
)
from ._docstring import parse_docstring


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

    def resolve(self, tp: object, at: str) -> Any:
        if isinstance(tp, typing.ForwardRef):
            tp = tp.__forward_arg__
        if isinstance(tp, str):
            tp = _evaluate(tp, self.namespace)
        if isinstance(tp, _Unresolved):
            self.fail(
                at,
                f"cannot resolve the annotation {tp.text!r} ({type(tp.error).__name__}: {tp.error}); "
                "a typed tool's annotations are read at registration, so their names must be defined then",
            )
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
        if tp in (list, collections.abc.Sequence, collections.abc.MutableSequence) or origin in (
            list,
            collections.abc.Sequence,
            collections.abc.MutableSequence,
        ):
            return self.array(self.compile(args[0], f"{at} items") if args else _ANY)
        if tp is tuple or origin is tuple:
            return self.tuple_of(args, at)
        if tp in (dict, collections.abc.Mapping, collections.abc.MutableMapping) or origin in (
            dict,
            collections.abc.Mapping,
            collections.abc.MutableMapping,
        ):
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
        self.fail(
            at,
            f"unsupported type {_name(tp)}; a typed tool's parameters may be str, int, float, bool, None, Any, "
            "Optional/Union, Literal, an Enum, list, tuple, dict[str, X], a dataclass, a TypedDict or a pydantic model",
        )

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

            def optional(value: object) -> Any:
                if value is None:
                    return None
                if _kind(value) not in other.kinds:
                    raise _Invalid(f"expected {label}, got {_show(value)}")
                return inner(value)

            return _Type(schema, optional, kinds, label)
        if any(a.conv is None for a in alternatives):  # Any is one of them
            return _Type(schema, None, kinds, label)
        options = tuple(alternatives)

        def union(value: object) -> Any:
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

        def closed(value: object) -> Any:
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

        def array(value: object) -> Any:
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

            def variadic(value: object) -> Any:
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

        def fixed(value: object) -> Any:
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

        def mapping(value: object) -> Any:
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
            fields.append(
                _Field(
                    f.name,
                    self.compile(hints.get(f.name, f.type), f"field {tp.__qualname__}.{f.name}"),
                    required,
                    default,
                    docs.params.get(f.name),
                )
            )
        convert = _object_conv(fields)

        def build(value: object) -> Any:
            return tp(**convert(value, None))

        return _Type(_object_schema(fields, docs.summary or None), build, frozenset(("object",)), "an object")

    def typeddict(self, tp: type, at: str) -> _Type:
        hints = self.hints(tp, at)
        required_keys: FrozenSet[str] = getattr(tp, "__required_keys__", frozenset())
        docs = parse_docstring(_own_doc(tp) or "")
        fields = [
            _Field(
                name,
                self.compile(hint, f"field {tp.__qualname__}.{name}"),
                self.key_required(hint, name in required_keys),
                _NO_DEFAULT,
                docs.params.get(name),
            )
            for name, hint in hints.items()
        ]
        convert = _object_conv(fields)

        def build(value: object) -> Any:
            return convert(value, None)

        return _Type(_object_schema(fields, docs.summary or None), build, frozenset(("object",)), "an object")

    def key_required(self, hint: object, listed: bool) -> bool:
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

        def model(value: object) -> Any:
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


def _hashable(tp: object) -> bool:
    try:
        hash(tp)
    except TypeError:
        return False
    return True


def _name(tp: object) -> str:
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
