"""Telling a typed tool from the ``(args, ctx)`` form: the legacy form is called exactly as it
always was; a signature that reads as both, or as neither, is refused at registration with a
message naming the parameter."""

import dataclasses
import functools
import subprocess
import sys
from typing import Any, Dict, List, Mapping, Optional
from unittest import mock

import pytest
from tools_helpers import run, spec_of

import kerman
from kerman import Tool, ToolContext

EMPTY = {"type": "object", "properties": {}}


# ---- the (args, ctx) form ---------------------------------------------------------------------


def plain(args, ctx):
    """Echoes its arguments.

    Args:
        anything: goes.
    """
    return f"plain {sorted(args.items())} {ctx.call_id}"


def annotated(args: Dict[str, Any], ctx: ToolContext) -> str:
    return f"annotated {sorted(args.items())} {isinstance(ctx, ToolContext)}"


def any_args(args: Any, ctx: Any) -> str:
    return f"any {sorted(args.items())}"


def bare_dict(args: dict, ctx: "ToolContext") -> str:
    return f"dict {sorted(args.items())}"


def mapping(payload: Mapping[str, Any], context) -> str:
    return f"mapping {sorted(payload.items())}"


def undefined_names(args: "Payload", ctx: "Context") -> str:  # noqa: F821
    return f"undefined {sorted(args.items())}"


def with_default(args, ctx, extra=1):
    return f"default {extra}"


class Callable_:
    def __call__(self, args: Dict[str, Any], ctx: ToolContext) -> str:
        return f"object {sorted(args.items())}"


LEGACY = [
    plain,
    annotated,
    any_args,
    bare_dict,
    mapping,
    undefined_names,
    with_default,
    Callable_(),
    lambda args, ctx: f"lambda {sorted(args.items())}",
    lambda *_: "star",
    functools.partial(lambda tag, args, ctx: tag, "partial"),
]


@pytest.mark.parametrize("fn", LEGACY, ids=lambda f: getattr(f, "__name__", type(f).__name__))
def test_the_args_ctx_form_is_called_as_always(fn: Any) -> None:
    tool = Tool("t", fn)
    assert not tool.typed and tool.fn is fn
    assert tool.parameters == EMPTY and tool.description == ""
    assert repr(tool) == "Tool('t', parallel=True)"
    ran = run(fn, {"anything": [1, {"goes": None}], "n": "ten"})  # not validated
    assert not ran.is_error(), ran.text()
    assert "anything" in ran.text() or ran.text() in ("star", "partial", "default 1")


def test_the_args_ctx_form_keeps_its_whole_docstring_and_given_parameters() -> None:
    parameters = {"type": "object", "properties": {"env": {"type": "string"}}, "required": ["env"]}
    assert spec_of(plain, parameters=parameters) == {
        "name": "plain",
        "description": "Echoes its arguments.\n\nArgs:\n    anything: goes.",
        "parameters": parameters,
    }
    assert Tool("p", plain, parameters=parameters).parameters == parameters
    assert Tool("p", plain, description="Given.").description == "Given."


def test_arguments_that_are_not_an_object_still_reach_the_args_ctx_form() -> None:
    ran = run(lambda args, ctx: repr(args), "[1, 2]")
    assert ran.text() == "[1, 2]"


def test_a_lone_arguments_parameter_is_the_old_form_missing_its_context() -> None:
    async def clock(args: Any) -> str:
        return "12:00"

    ran = run(clock, {})
    assert ran.result.data["error"]["name"] == "TypeError" and len(ran.errors) == 1


def test_a_mock_or_a_builtin_is_the_args_ctx_form() -> None:
    body = mock.Mock(return_value="mocked")
    assert not Tool("m", body).typed and run(body, {"a": 1}).text() == "mocked"
    assert body.call_args.args[0] == {"a": 1}
    assert not Tool("b", print).typed


# ---- typed tools ----------------------------------------------------------------------------------


def test_a_typed_tool_wraps_its_function() -> None:
    async def search(query: str, limit: int = 10, *, ctx: ToolContext) -> str:
        """Searches."""
        return query

    tool = Tool("search", search)
    assert tool.typed and tool.fn is not search and tool.fn.__wrapped__ is search
    assert tool.fn.__qualname__ == search.__qualname__
    assert repr(tool) == "Tool('search', typed(query, limit?), parallel=True)"
    assert tool.description == "Searches."
    loop = kerman.AgentLoop(kerman.models.ScriptedModel([]))
    assert loop.tool(search) is search  # the decorator returns the function, still callable as written
    assert loop.tool(Tool("again", search)).typed


def test_a_typed_tools_adapter_registered_again_is_the_same_typed_tool() -> None:
    def lookup(key: str) -> str:
        return f"value of {key}"

    first = Tool("a", lookup)
    again = Tool("b", first.fn)
    assert again.typed and again.parameters == first.parameters and again.fn.__wrapped__ is lookup
    assert run(again, {"key": "k"}, name="b").text() == "value of k"


def test_typed_methods_and_partials() -> None:
    class Index:
        def __init__(self) -> None:
            self.prefix = "hit"

        def find(self, query: str) -> str:
            return f"{self.prefix} {query}"

    def scoped(scope: str, query: str, *, ctx: ToolContext) -> str:
        return f"{scope}:{query}"

    assert run(Index().find, {"query": "q"}).text() == "hit q"
    part = functools.partial(scoped, "docs")
    assert Tool("p", part).parameters["properties"] == {"query": {"type": "string"}}
    assert run(part, {"query": "q"}).text() == "docs:q"


def test_given_parameters_replace_the_inferred_schema_but_must_describe_the_function() -> None:
    def fetch(url: str, timeout: float = 10.0) -> str:
        return url

    given = {"type": "object", "properties": {"url": {"type": "string", "format": "uri"}}, "required": ["url"]}
    tool = Tool("fetch", fetch, parameters=given)
    assert tool.typed and tool.parameters == given
    assert run(tool, {"url": "u", "timeout": 1}, name="fetch").text() == "u"  # still checked by the signature
    with pytest.raises(
        ValueError,
        match=r"^tool 'fetch': parameters describes 'uri', which the function has no parameter for "
        r"\(it takes url, timeout\)$",
    ):
        Tool("fetch", fetch, parameters={"type": "object", "properties": {"uri": {"type": "string"}}})
    with pytest.raises(ValueError, match=r"^tool 'fetch': parameter 'url' is required by the function but not by parameters$"):
        Tool("fetch", fetch, parameters={"type": "object", "properties": {"url": {"type": "string"}}})


def test_import_kerman_and_typed_tools_do_not_import_pydantic() -> None:
    code = (
        "import sys, dataclasses, kerman\n"
        "@dataclasses.dataclass\nclass P:\n    x: int\n"
        "def t(p: P, n: int = 1) -> str:\n    return ''\n"
        "kerman.Tool('t', t)\n"
        "print('pydantic' in sys.modules, 'jsonschema' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ---- refused signatures -----------------------------------------------------------------------


def dict_then_int(args: dict, limit: int) -> str:
    return ""


def unannotated_then_int(args, limit: int) -> str:
    return ""


def unannotated_field(query: str, limit=10) -> str:
    return ""


def ctx_not_context(query: str, ctx: int) -> str:
    return ""


def two_contexts(query: str, a: ToolContext, b: ToolContext) -> str:
    return ""


def star_args(query: str, *more: str) -> str:
    return ""


def star_kwargs(query: str, **more: str) -> str:
    return ""


def positional_only(query: str, /) -> str:
    return ""


def unsupported(data: bytes) -> str:
    return ""


def int_keys(data: Dict[int, str]) -> str:
    return ""


def undefined(query: "Undefined") -> str:  # noqa: F821
    return ""


REFUSED = [
    (
        dict_then_int,
        "tool 't': the signature is ambiguous: its first parameter 'args: dict' reads as the arguments dict of the "
        "(args, ctx) form, whose second parameter is the ToolContext, but 'limit: int' is not. For a typed tool, "
        "give 'args' its own type (not Any or a dict of Any), or make the arguments keyword-only "
        "(def dict_then_int(*, args: dict, limit: int)); for the (args, ctx) form, annotate the second parameter "
        "ToolContext",
    ),
    (unannotated_then_int, "tool 't': the signature is ambiguous: its first parameter 'args' reads as the arguments dict"),
    (
        unannotated_field,
        "tool 't', parameter 'limit': it has no annotation; a typed tool's arguments are annotated with their "
        "types (Any accepts any JSON value)",
    ),
    (
        ctx_not_context,
        "tool 't', parameter 'ctx': a parameter named ctx receives the ToolContext, but it is annotated int; "
        "annotate it ToolContext, or rename it to make it an argument",
    ),
    (two_contexts, "tool 't', parameter 'b': two parameters receive the ToolContext ('a' and 'b')"),
    (star_args, "tool 't', parameter 'more': a typed tool cannot take *more; name each argument (or use the (args, ctx) form)"),
    (star_kwargs, "tool 't', parameter 'more': a typed tool cannot take **more"),
    (
        positional_only,
        "tool 't', parameter 'query': arguments are passed by keyword, so a typed tool's parameters cannot be positional-only",
    ),
    (
        unsupported,
        "tool 't', parameter 'data': unsupported type bytes; a typed tool's parameters may be str, int, float, bool, "
        "None, Any, Optional/Union, Literal, an Enum, list, tuple, dict[str, X], a dataclass, a TypedDict or a pydantic model",
    ),
    (int_keys, "tool 't', parameter 'data': typing.Dict[int, str]: JSON object keys are strings, so the key type must be str"),
    (
        undefined,
        "tool 't', parameter 'query': cannot resolve the annotation 'Undefined' (NameError: name 'Undefined' is not "
        "defined); a typed tool's annotations are read at registration, so their names must be defined then",
    ),
]


@pytest.mark.parametrize("fn, message", REFUSED, ids=[f.__name__ for f, _ in REFUSED])
def test_ambiguous_or_unsupported_signatures_are_refused_at_registration(fn: Any, message: str) -> None:
    with pytest.raises(TypeError) as raised:
        Tool("t", fn)
    assert str(raised.value).startswith(message)
    loop = kerman.AgentLoop(kerman.models.ScriptedModel([]))
    with pytest.raises(TypeError):
        loop.tool(fn, name="t")
    assert loop.tools == {}


@dataclasses.dataclass
class Tree:
    label: str
    children: List["Tree"]


def test_a_recursive_type_is_refused() -> None:
    def t(tree: Tree) -> str:
        return ""

    with pytest.raises(
        TypeError,
        match=r"^tool 't', field Tree.children items: Tree refers to itself; recursive types are "
        r"not supported in a typed tool$",
    ):
        Tool("t", t)


def test_optional_context_and_defaults_on_it_are_accepted() -> None:
    def t(query: str, ctx: Optional[ToolContext] = None) -> str:
        return f"{query} {ctx is not None}"

    assert run(t, {"query": "q"}).text() == "q True"


def test_a_typed_tools_calls_record_nothing_extra() -> None:
    seen: List[str] = []

    def t(query: str) -> str:
        seen.append(query)
        return "ok"

    ran = run(t, {"query": "q"})
    assert seen == ["q"]
    types = [e.type for e in ran.loop.log.events()]
    assert types.count("tool/call") == 1 and types.count("tool/result") == 1
    assert ran.result.data.keys() == {"turn", "step", "message"}
