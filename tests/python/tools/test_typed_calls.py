"""A typed tool's calls through a real AgentLoop: invalid arguments reach the model as an error
``tool/result`` naming the field, and the body does not run; valid ones are converted (a
dataclass instance, an Enum member, a tuple...) and the body runs as any tool's does. (No
``from __future__ import annotations`` here: these annotations are objects.)"""

import asyncio
import dataclasses
import enum
from typing import Any, Dict, List, Literal, Optional, Tuple, TypedDict, Union

import pytest
from tools_helpers import parameters_of, run

import kerman
from kerman import ToolContext, ToolResult


class Unit(enum.Enum):
    CELSIUS = "c"
    FAHRENHEIT = "f"


@dataclasses.dataclass
class Point:
    x: float
    y: float


@dataclasses.dataclass
class Filters:
    tags: List[str]
    near: Optional[Point] = None
    limit: int = 5


class Movie(TypedDict):
    title: str
    year: int


class Recorder:
    """A typed tool body that records what it was called with."""

    def __init__(self) -> None:
        self.calls: List[Dict[str, Any]] = []


def search_tool(seen: List[Dict[str, Any]]) -> Any:
    async def search(
        query: str,
        limit: int = 10,
        filters: Optional[Filters] = None,
        unit: Unit = Unit.CELSIUS,
        mode: Literal["fast", "exact"] = "fast",
        *,
        ctx: ToolContext,
    ) -> str:
        seen.append({"query": query, "limit": limit, "filters": filters, "unit": unit, "mode": mode, "call": ctx.call_id})
        return f"found {query}"

    return search


def refused(arguments: Any) -> str:
    """The text the model gets for a call of ``search`` with ``arguments``; asserts that it is
    an error result, that the body did not run and that nothing was reported as a bug."""
    seen: List[Dict[str, Any]] = []
    ran = run(search_tool(seen), arguments)
    assert seen == []
    assert ran.is_error()
    # As for arguments that are not JSON: the INVALID_ARGUMENTS code, and no report.
    assert ran.result.data["error"] == {"name": "ValueError", "code": "INVALID_ARGUMENTS"}
    assert ran.errors == [] and ran.loop.last_error is None
    assert [e.data["reason"]["kind"] for e in ran.loop.log.events(types="turn/end")] == ["completed"]
    text = ran.text()
    assert text.startswith("invalid tool arguments: ")
    return text[len("invalid tool arguments: ") :]


# ---- invalid arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"query": "x", "limit": "ten"}, 'limit: expected an integer, got "ten"'),
        ({"query": "x", "limit": "10"}, 'limit: expected an integer, got "10"'),  # no coercion from strings
        ({"query": "x", "limit": True}, "limit: expected an integer, got true"),  # a bool is not an int
        ({"query": "x", "limit": 2.5}, "limit: expected an integer, got 2.5"),
        ({"query": "x", "limit": None}, "limit: expected an integer, got null"),  # a default is not Optional
        ({"query": 3}, "query: expected a string, got 3"),
        ({"query": ["a"]}, "query: expected a string, got an array"),
        ({}, 'missing required field "query"'),
        ({"query": "x", "qeury": "y"}, 'unexpected field "qeury" (did you mean "query"?)'),
        ({"query": "x", "zzz": 1}, 'unexpected field "zzz"'),
        ({"query": "x", "filters": {"tags": ["a", "b", 3]}}, "filters.tags[2]: expected a string, got 3"),
        ({"query": "x", "filters": {}}, 'filters: missing required field "tags"'),
        ({"query": "x", "filters": {"tags": [], "size": 1}}, 'filters: unexpected field "size"'),
        ({"query": "x", "filters": {"tags": [], "near": {"x": 1, "y": "2"}}}, 'filters.near.y: expected a number, got "2"'),
        ({"query": "x", "filters": "tags"}, 'filters: expected an object or null, got "tags"'),
        ({"query": "x", "unit": "k"}, 'unit: expected one of "c", "f", got "k"'),
        ({"query": "x", "unit": "C"}, 'unit: expected one of "c", "f", got "C"'),
        ({"query": "x", "mode": "slow"}, 'mode: expected one of "fast", "exact", got "slow"'),
        ({"query": "x", "mode": ["fast"]}, 'mode: expected one of "fast", "exact", got an array'),
        ("[1, 2]", "expected an object, got an array"),
        ('"query"', 'expected an object, got "query"'),
    ],
    ids=[
        "wrong-type",
        "int-as-string",
        "bool-for-int",
        "fraction-for-int",
        "null-for-default",
        "int-for-str",
        "array-for-str",
        "missing",
        "unexpected-close",
        "unexpected",
        "nested-path",
        "nested-missing",
        "nested-unexpected",
        "deeper-path",
        "not-an-object",
        "enum",
        "enum-case",
        "literal",
        "literal-unhashable",
        "arguments-an-array",
        "arguments-a-string",
    ],
)
def test_invalid_arguments_are_an_error_result_naming_the_field(arguments: Any, message: str) -> None:
    assert refused(arguments) == message


def test_every_field_in_error_is_named_at_once() -> None:
    assert (
        refused({"limit": "ten", "unit": 1, "extra": 0})
        == 'missing required field "query"; limit: expected an integer, got "ten"; unit: expected one of "c", "f", got 1; '
        'unexpected field "extra"'
    )


def test_a_long_value_is_cut_in_the_message() -> None:
    assert refused({"query": "x", "limit": "y" * 100}) == 'limit: expected an integer, got "' + "y" * 56 + "..."


def test_the_model_gets_the_error_in_the_next_request() -> None:
    seen: List[Dict[str, Any]] = []
    ran = run(search_tool(seen), {"qeury": "x"})
    model = ran.loop._model
    [_, second] = model.requests
    result = second.messages[-1]
    assert isinstance(result, kerman.ToolResultMessage)
    block = result.content[0]
    assert block["isError"] is True and block["toolCallId"] == "c1"
    assert block["content"][0]["text"].startswith('invalid tool arguments: missing required field "query"')


def test_several_calls_in_one_step_are_each_checked() -> None:
    seen: List[Dict[str, Any]] = []
    ran = run(search_tool(seen), {"query": "a"}, {"query": 1}, {"query": "c", "limit": 2})
    assert [ran.is_error(i) for i in range(3)] == [False, True, False]
    assert ran.text(1) == "invalid tool arguments: query: expected a string, got 1"
    assert sorted(c["query"] for c in seen) == ["a", "c"]


# ---- valid arguments, converted -----------------------------------------------------------------


def test_valid_arguments_are_converted_and_defaults_apply() -> None:
    seen: List[Dict[str, Any]] = []
    ran = run(
        search_tool(seen),
        {"query": "x"},
        {"query": "y", "limit": 3, "unit": "f", "mode": "exact", "filters": {"tags": ["a"], "near": {"x": 1, "y": 2.5}}},
    )
    assert [ran.text(0), ran.text(1)] == ["found x", "found y"]
    assert not ran.is_error(0) and not ran.is_error(1)
    first, second = sorted(seen, key=lambda c: c["call"])
    assert first == {"query": "x", "limit": 10, "filters": None, "unit": Unit.CELSIUS, "mode": "fast", "call": "c1"}
    assert second["filters"] == Filters(tags=["a"], near=Point(1.0, 2.5))
    assert isinstance(second["filters"], Filters) and isinstance(second["filters"].near, Point)
    assert type(second["filters"].near.x) is float  # an int is accepted for a float, as a float
    assert second["unit"] is Unit.FAHRENHEIT and second["mode"] == "exact" and second["limit"] == 3


def test_containers_are_built_as_annotated() -> None:
    got: List[Any] = []

    def t(
        pair: Tuple[int, str],
        rest: Tuple[float, ...],
        grid: Dict[str, List[Point]],
        movie: Movie,
        either: Union[int, Point],
        n: int,
        anything: Any = None,
    ) -> str:
        got.extend([pair, rest, grid, movie, either, n, anything])
        return "ok"

    ran = run(
        t,
        {
            "pair": [1, "a"],
            "rest": [1, 2.5],
            "grid": {"a b": [{"x": 0, "y": 1}]},
            "movie": {"title": "M", "year": 1999},
            "either": {"x": 1, "y": 2},
            "n": 10.0,
            "anything": {"k": [1]},
        },
    )
    assert ran.text() == "ok"
    assert got == [(1, "a"), (1.0, 2.5), {"a b": [Point(0, 1)]}, {"title": "M", "year": 1999}, Point(1, 2), 10, {"k": [1]}]
    assert type(got[5]) is int  # 10.0 is an integer to JSON Schema


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"pair": [1]}, "pair: expected an array of 2 items, got 1"),
        ({"pair": [1, 2]}, "pair[1]: expected a string, got 2"),
        ({"grid": {"a b": [{"x": 0}]}}, 'grid["a b"][0]: missing required field "y"'),
        ({"movie": {"title": "M", "year": "1999"}}, 'movie.year: expected an integer, got "1999"'),
        ({"either": "x"}, 'either: expected an integer or an object, got "x"'),
        ({"either": {"x": 1}}, 'either: missing required field "y"'),  # the one alternative that takes an object
    ],
)
def test_container_errors_name_the_path(arguments: Any, message: str) -> None:
    ran_with: List[Any] = []

    def t(
        pair: Tuple[int, str] = (0, ""),
        grid: Optional[Dict[str, List[Point]]] = None,
        movie: Optional[Movie] = None,
        either: Union[int, Point] = 0,
    ) -> str:
        ran_with.append(1)
        return "ok"

    ran = run(t, arguments)
    assert ran_with == [] and ran.text() == f"invalid tool arguments: {message}"


# ---- the body: sync, async, awaitables, results, exceptions -------------------------------------


def test_sync_async_and_awaitable_returning_bodies_work() -> None:
    def sync(n: int) -> str:
        return f"sync {n}"

    async def coro(n: int) -> ToolResult:
        await asyncio.sleep(0)
        return ToolResult(f"async {n}", meta={"n": n})

    def awaitable(n: int) -> Any:
        future = asyncio.get_running_loop().create_future()
        future.set_result(f"future {n}")
        return future

    for fn, text in ((sync, "sync 1"), (coro, "async 1"), (awaitable, "future 1")):
        ran = run(fn, {"n": 1})
        assert ran.text() == text and not ran.is_error()
    assert run(coro, {"n": 2}).result.data["meta"] == {"n": 2}


def test_the_context_arrives_by_keyword() -> None:
    seen: List[Any] = []

    async def t(ctx: ToolContext, query: str) -> str:
        seen.append((query, ctx.call_id, ctx.turn, ctx.step, isinstance(ctx, ToolContext)))
        return "ok"

    run(t, {"query": "q"})
    assert seen == [("q", "c1", 1, 1, True)]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_an_exception_in_the_body_reports_as_any_tools(asynchronous: bool, caplog: Any) -> None:
    if asynchronous:

        async def lookup(key: str) -> str:
            raise KeyError(key)
    else:

        def lookup(key: str) -> str:
            raise KeyError(key)

    ran = run(lookup, {"key": "k"})
    error = ran.result.data["error"]
    assert ran.text() == "'k'" and ran.is_error()
    assert error["name"] == "KeyError" and error["code"] == "TOOL_ERROR"
    assert error["function"].endswith("lookup")  # the user's function, not the adapter
    assert "raise KeyError(key)" in error["traceback"] and "test_typed_calls.py" in error["traceback"]
    assert len(ran.errors) == 1 and isinstance(ran.errors[0].exception, KeyError)
    assert ran.errors[0].function == error["function"]


def test_a_dataclass_that_refuses_its_values_is_a_tool_error() -> None:
    @dataclasses.dataclass
    class Positive:
        n: int

        def __post_init__(self) -> None:
            if self.n <= 0:
                raise ValueError("n must be positive")

    def t(p: Positive) -> str:
        return "ran"

    ran = run(t, {"p": {"n": -1}})
    assert ran.text() == "n must be positive" and ran.result.data["error"]["name"] == "ValueError"
    assert "in __post_init__" in ran.result.data["error"]["traceback"]


# ---- pydantic -------------------------------------------------------------------------------------


def test_a_pydantic_model_is_validated_and_constructed() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Address(pydantic.BaseModel):
        city: str

    class Person(pydantic.BaseModel):
        name: str
        age: int = 0
        home: Address

    got: List[Any] = []

    def t(person: Person, note: str = "") -> str:
        got.append(person)
        return "ok"

    schema = parameters_of(t)
    person = Person.model_json_schema()
    definitions = person.pop("$defs")
    assert schema == {
        "type": "object",
        "properties": {"person": person, "note": {"type": "string", "default": ""}},
        "required": ["person"],
        "additionalProperties": False,
        "$defs": definitions,
    }
    assert schema["properties"]["person"]["properties"]["home"] == {"$ref": "#/$defs/Address"}

    ran = run(t, {"person": {"name": "Ada", "home": {"city": "London"}}})
    assert ran.text() == "ok" and isinstance(got[0], Person) and got[0].home.city == "London"

    cases = [
        ({"person": {"name": "Ada"}}, 'person: missing required field "home"'),
        ({"person": {"name": "Ada", "home": {"city": 3}}}, "person.home.city: Input should be a valid string, got 3"),
        ({"person": {"name": 1, "home": {}}}, "person.name: Input should be a valid string, got 1 (and 1 more error)"),
    ]
    for arguments, message in cases:
        ran = run(t, arguments)
        assert ran.text() == f"invalid tool arguments: {message}" and ran.is_error()
    assert len(got) == 1


@pytest.mark.parametrize("lone", [True, False], ids=["lone-call", "pooled-calls"])
def test_a_legacy_tool_raising_invalid_arguments_gets_the_same_result(lone):
    """``InvalidToolArgumentsError`` from an ``(args, ctx)`` body reads as the model's mistake,
    as a typed tool's refusal does: the INVALID_ARGUMENTS code, and no report."""

    async def picky(args: Dict[str, Any], ctx: ToolContext) -> str:
        if "path" not in args:
            raise kerman.InvalidToolArgumentsError('missing required field "path"')
        return "read"

    calls = [{}] if lone else [{}, {"path": "a"}]
    ran = run(picky, *calls)
    first = ran.results[0]
    assert ran.text(0) == 'invalid tool arguments: missing required field "path"'
    assert ran.is_error(0)
    assert first.data["error"] == {"name": "ValueError", "code": "INVALID_ARGUMENTS"}
    assert ran.errors == [] and ran.loop.last_error is None
    if not lone:
        assert ran.text(1) == "read" and not ran.is_error(1)
