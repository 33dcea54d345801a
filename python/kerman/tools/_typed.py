"""Typed tools.

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
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import sys
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from ._context import ToolContext
from ._convert import _EMPTY, _P, _Field, _Invalid, _object_conv, _object_schema, _refused
from ._docstring import parse_docstring
from ._infer import _Compiler, _evaluate, _name, _namespace, _Unresolved

__all__ = ["Typed", "typed_tool"]


class Typed:
    """A typed tool function, analysed: its schema, the description from its docstring, the
    adapter the loop calls, and its fields (``name`` or ``name?`` when optional, for reprs)."""

    __slots__ = ("schema", "description", "adapter", "fields", "required")

    def __init__(
        self,
        schema: Dict[str, Any],
        description: str,
        adapter: Callable[[Any, Any], Any],
        fields: Tuple[str, ...],
        required: Tuple[str, ...],
    ) -> None:
        self.schema = schema
        self.description = description
        self.adapter = adapter
        self.fields = fields
        self.required = required

    def shape(self) -> str:
        return ", ".join(f if f in self.required else f + "?" for f in self.fields)


def _is_context(annotation: object) -> bool:
    if isinstance(annotation, _Unresolved):
        return annotation.text.rsplit(".", 1)[-1].strip() == "ToolContext"
    if isinstance(annotation, type) and issubclass(annotation, ToolContext):
        return True
    if typing.get_origin(annotation) is Union:  # Optional[ToolContext]
        return any(_is_context(a) for a in typing.get_args(annotation) if a is not type(None))
    return False


def _is_whole_arguments(p: inspect.Parameter, annotation: object) -> bool:
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


def _is_context_like(p: inspect.Parameter, annotation: object) -> bool:
    """Whether a second positional parameter can be the legacy form's context."""
    return p.name == "ctx" or annotation is _EMPTY or annotation is Any or _is_context(annotation) or isinstance(annotation, _Unresolved)


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
    if not positional and any(p.kind is _P.VAR_POSITIONAL for p in params) and all(p.annotation is _EMPTY for p in named):
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
                    f"{_param(second, False)})); for the (args, ctx) form, annotate the second parameter ToolContext"
                )
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
            compiler.fail(
                at,
                f"a typed tool cannot take {'*' if p.kind is _P.VAR_POSITIONAL else '**'}{p.name}; "
                "name each argument (or use the (args, ctx) form)",
            )
        annotation = _annotation(p, namespace)
        if p.name == "ctx" or _is_context(annotation):
            if p.kind is _P.POSITIONAL_ONLY:
                compiler.fail(at, "the context is passed by keyword, so it cannot be positional-only")
            if p.name == "ctx" and not (annotation is _EMPTY or annotation is Any or _is_context(annotation)):
                compiler.fail(
                    at,
                    f"a parameter named ctx receives the ToolContext, but it is annotated {_name(annotation)}; "
                    "annotate it ToolContext, or rename it to make it an argument",
                )
            if context is not None:
                compiler.fail(at, f"two parameters receive the ToolContext ({context!r} and {p.name!r})")
            context = p.name
            continue
        if p.kind is _P.POSITIONAL_ONLY:
            compiler.fail(at, "arguments are passed by keyword, so a typed tool's parameters cannot be positional-only")
        if annotation is _EMPTY:
            compiler.fail(at, "it has no annotation; a typed tool's arguments are annotated with their types (Any accepts any JSON value)")
        fields.append(_Field(p.name, compiler.compile(annotation, at), p.default is _EMPTY, p.default, docs.params.get(p.name)))
    schema = _object_schema(fields)
    if compiler.defs:
        schema["$defs"] = compiler.defs
    adapter = _adapter(fn, _object_conv(fields), context)
    return Typed(schema, docs.summary, adapter, tuple(f.name for f in fields), tuple(f.name for f in fields if f.required))


def _adapter(
    fn: Callable[..., Any], convert: Callable[[Any, Optional[List[_Invalid]]], Dict[str, Any]], context: Optional[str]
) -> Callable[[Any, Any], Any]:
    """``fn(args, ctx)`` for the loop: the arguments converted, or an error result naming what
    is wrong without calling the body; then the body called with keywords, its value (or
    awaitable) returned and its exception raised as they are."""

    def call(args: object, ctx: object) -> Any:
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
