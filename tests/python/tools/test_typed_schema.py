"""The JSON Schema a typed tool's signature and docstring give, for every supported type and
docstring style (exact dicts). This module uses ``from __future__ import annotations``, so
every annotation here is a str the registration evaluates; test_typed_calls.py has real ones."""

from __future__ import annotations

import dataclasses
import enum
import sys
from typing import Annotated, Any, Dict, List, Literal, Mapping, NewType, Optional, Sequence, Tuple, TypedDict, Union

import pytest
from tools_helpers import parameters_of, spec_of

import kerman
from kerman import ToolContext
from kerman.tools._check import schema_problem
from kerman.tools._docstring import parse_docstring

try:
    import jsonschema
except ImportError:  # the cross-check below is made when it is installed
    jsonschema = None


def obj(properties: Dict[str, Any], required: Optional[List[str]] = None, **extra: Any) -> Dict[str, Any]:
    """An object schema as a typed tool writes it."""
    schema: Dict[str, Any] = {"type": "object", **extra, "properties": properties}
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema


STRING, INTEGER, NUMBER, BOOLEAN, NULL = ({"type": t} for t in ("string", "integer", "number", "boolean", "null"))


class Unit(enum.Enum):
    CELSIUS = "c"
    FAHRENHEIT = "f"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mixed(enum.Enum):
    ONE = 1
    TWO = "two"


@dataclasses.dataclass
class Point:
    x: float
    y: float


@dataclasses.dataclass
class Filters:
    """Narrows a search.

    Attributes:
        tags: Tags that must all match.
        near: Where to look around.
    """

    tags: List[str]
    near: Optional[Point] = None
    year: int = 2024
    seen: List[str] = dataclasses.field(default_factory=list)
    internal: int = dataclasses.field(default=0, init=False)


class Movie(TypedDict):
    title: str
    year: int


class Partial(TypedDict, total=False):
    title: str
    year: int


UserId = NewType("UserId", int)


# ---- scalars, defaults, context --------------------------------------------------------------


def test_scalars_are_their_json_types_and_each_is_required() -> None:
    def t(s: str, i: int, f: float, b: bool, n: None) -> str:
        return ""

    assert parameters_of(t) == obj({"s": STRING, "i": INTEGER, "f": NUMBER, "b": BOOLEAN, "n": NULL}, ["s", "i", "f", "b", "n"])


def test_a_default_makes_a_field_optional_and_is_the_schemas_default() -> None:
    def t(query: str, limit: int = 10, exact: bool = False, unit: Unit = Unit.CELSIUS, pair: Tuple[int, int] = (1, 2)) -> str:
        return ""

    assert parameters_of(t) == obj(
        {
            "query": STRING,
            "limit": {"type": "integer", "default": 10},
            "exact": {"type": "boolean", "default": False},
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "pair": {"type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [INTEGER, INTEGER], "default": [1, 2]},
        },
        ["query"],
    )


def test_a_default_that_is_not_json_is_left_out_of_the_schema() -> None:
    marker = object()

    def t(*, x: Any = marker) -> str:
        return ""

    assert parameters_of(t) == obj({"x": {}})


def test_the_context_is_not_an_argument() -> None:
    def by_name(query: str, *, ctx) -> str:
        return ""

    def by_annotation(context: ToolContext, query: str) -> str:
        return ""

    def annotated_ctx(query: str, ctx: kerman.ToolContext) -> str:
        return ""

    for fn in (by_name, by_annotation, annotated_ctx):
        assert parameters_of(fn) == obj({"query": STRING}, ["query"]), fn


def test_a_tool_without_parameters_has_an_empty_object_schema() -> None:
    def now() -> str:
        return "12:00"

    def now_ctx(*, ctx: ToolContext) -> str:
        return "12:00"

    assert parameters_of(now) == parameters_of(now_ctx) == {"type": "object", "properties": {}, "additionalProperties": False}


def test_any_is_the_empty_schema() -> None:
    def t(n: int, value: Any, data: object) -> str:
        return ""

    assert parameters_of(t) == obj({"n": INTEGER, "value": {}, "data": {}}, ["n", "value", "data"])


# ---- unions, literals, enums ----------------------------------------------------------------


def test_optional_and_unions_are_any_of() -> None:
    def t(a: Optional[str], b: int | None, c: Union[int, str], d: str | None = None) -> str:
        return ""

    assert parameters_of(t) == obj(
        {
            "a": {"anyOf": [STRING, NULL]},
            "b": {"anyOf": [INTEGER, NULL]},
            "c": {"anyOf": [INTEGER, STRING]},
            "d": {"anyOf": [STRING, NULL], "default": None},
        },
        ["a", "b", "c"],
    )


def test_literals_and_enums_are_enums_typed_when_their_values_share_a_type() -> None:
    def t(
        mode: Literal["fast", "slow"],
        n: Literal[1, 2, 3],
        mixed: Literal["a", 1, None],
        unit: Unit,
        level: Level,
        m: Mixed,
        pick: Literal[Unit.CELSIUS],
    ) -> str:
        return ""

    assert parameters_of(t) == obj(
        {
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "n": {"type": "integer", "enum": [1, 2, 3]},
            "mixed": {"enum": ["a", 1, None]},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "level": {"type": "integer", "enum": [1, 2]},
            "m": {"enum": [1, "two"]},
            "pick": {"type": "string", "enum": ["c"]},
        },
        ["mode", "n", "mixed", "unit", "level", "m", "pick"],
    )


# ---- containers -------------------------------------------------------------------------------


def test_lists_tuples_and_dicts() -> None:
    def t(
        a: list[str],
        b: List[int],
        c: list,
        d: tuple[int, str],
        e: Tuple[float, ...],
        f: tuple,
        g: dict[str, int],
        h: Dict[str, List[bool]],
        i: dict,
        j: Mapping[str, float],
        k: list[list[int]],
        m: Sequence[str],
    ) -> str:
        return ""

    assert parameters_of(t) == obj(
        {
            "a": {"type": "array", "items": STRING},
            "b": {"type": "array", "items": INTEGER},
            "c": {"type": "array"},
            "d": {"type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [INTEGER, STRING]},
            "e": {"type": "array", "items": NUMBER},
            "f": {"type": "array"},
            "g": {"type": "object", "additionalProperties": INTEGER},
            "h": {"type": "object", "additionalProperties": {"type": "array", "items": BOOLEAN}},
            "i": {"type": "object"},
            "j": {"type": "object", "additionalProperties": NUMBER},
            "k": {"type": "array", "items": {"type": "array", "items": INTEGER}},
            "m": {"type": "array", "items": STRING},
        },
        list("abcdefghijkm"),
    )


def test_a_dataclass_is_a_closed_object_with_its_docstring_and_defaults() -> None:
    def t(filters: Filters, origin: Point | None = None) -> str:
        return ""

    point = obj({"x": NUMBER, "y": NUMBER}, ["x", "y"])
    assert parameters_of(t) == obj(
        {
            "filters": obj(
                {
                    "tags": {"type": "array", "items": STRING, "description": "Tags that must all match."},
                    "near": {"anyOf": [point, NULL], "description": "Where to look around.", "default": None},
                    "year": {"type": "integer", "default": 2024},
                    "seen": {"type": "array", "items": STRING},  # a default_factory: optional, no default shown
                },
                ["tags"],
                description="Narrows a search.",
            ),  # init=False fields are not arguments
            "origin": {"anyOf": [point, NULL], "default": None},
        },
        ["filters"],
    )


def test_typeddicts_keep_their_required_keys() -> None:
    def t(movie: Movie, partial: Partial) -> str:
        return ""

    assert parameters_of(t) == obj(
        {
            "movie": obj({"title": STRING, "year": INTEGER}, ["title", "year"]),
            "partial": obj({"title": STRING, "year": INTEGER}),
        },
        ["movie", "partial"],
    )


if sys.version_info >= (3, 11):
    from typing import NotRequired, Required

    class Marked(TypedDict, total=False):
        title: Required[str]
        year: NotRequired[int]
        note: str

    def test_typeddict_required_and_not_required_markers() -> None:
        def t(m: Marked) -> str:
            return ""

        assert parameters_of(t) == obj({"m": obj({"title": STRING, "year": INTEGER, "note": STRING}, ["title"])}, ["m"])


def test_annotated_gives_a_description_and_newtype_its_base() -> None:
    def t(query: Annotated[str, "What to look for."], user: UserId, n: Annotated[int, 42, "Count."] = 3) -> str:
        return ""

    assert parameters_of(t) == obj(
        {
            "query": {"type": "string", "description": "What to look for."},
            "user": INTEGER,
            "n": {"type": "integer", "description": "Count.", "default": 3},
        },
        ["query", "user"],
    )


# ---- docstrings --------------------------------------------------------------------------------


def google(query: str, limit: int = 10) -> str:
    """Searches the index for documents.

    Only the first paragraph is the tool's description.

    Args:
        query: The words to look for,
            all of them.
        limit (int): At most this many results.

    Returns:
        The matches, one a line.
    """
    return ""


def numpy(query: str, limit: int = 10) -> str:
    """Searches the index for documents.

    Parameters
    ----------
    query : str
        The words to look for,
        all of them.
    limit : int, optional
        At most this many results.

    Returns
    -------
    str
        The matches.
    """
    return ""


def sphinx(query: str, limit: int = 10) -> str:
    """Searches the index for documents.

    :param query: The words to look for,
        all of them.
    :param int limit: At most this many results.
    :returns: The matches.
    """
    return ""


@pytest.mark.parametrize("fn", [google, numpy, sphinx], ids=lambda f: f.__name__)
def test_docstring_styles_give_descriptions(fn: Any) -> None:
    assert spec_of(fn) == {
        "name": fn.__name__,
        "description": "Searches the index for documents.",
        "parameters": obj(
            {
                "query": {"type": "string", "description": "The words to look for, all of them."},
                "limit": {"type": "integer", "description": "At most this many results.", "default": 10},
            },
            ["query"],
        ),
    }


def test_the_description_is_the_first_paragraph_joined_and_annotated_wins() -> None:
    def t(query: Annotated[str, "From Annotated."]) -> str:
        """Looks things
        up quickly.
        Args:
            query: From the docstring.
        """
        return ""

    assert spec_of(t) == {
        "name": "t",
        "description": "Looks things up quickly.",
        "parameters": obj({"query": {"type": "string", "description": "From Annotated."}}, ["query"]),
    }


def test_a_given_description_wins_and_no_docstring_is_empty() -> None:
    def t(query: str) -> str:
        return ""

    assert spec_of(t)["description"] == ""
    assert spec_of(google, description="Mine.")["description"] == "Mine."
    assert kerman.Tool("g", google).description == "Searches the index for documents."


def test_parse_docstring_edge_cases() -> None:
    assert parse_docstring("").summary == ""
    doc = parse_docstring("""Args:
        a: First.
        *args: Rest.
        **kwargs: Options,
            more of them.
    Raises:
        ValueError: never an argument.
    """)
    assert doc.summary == "" and doc.params == {"a": "First.", "args": "Rest.", "kwargs": "Options, more of them."}
    doc = parse_docstring("Summary.\n\nParameters\n----------\nx, y : int\n    Coordinates.\nz\n    Height.\n")
    assert doc.params == {"x": "Coordinates.", "y": "Coordinates.", "z": "Height."}


# ---- every inferred schema is a valid tool schema ---------------------------------------------


@pytest.mark.parametrize("fn", [google, numpy, sphinx], ids=lambda f: f.__name__)
def test_inferred_schemas_pass_the_parameters_check(fn: Any) -> None:
    def rich(
        a: Filters,
        b: Movie,
        c: Literal["x", 1],
        d: Unit,
        e: tuple[int, str],
        f: dict[str, list[Point]],
        g: Optional[Union[int, str]] = None,
    ) -> str:
        return ""

    for schema in (parameters_of(fn), parameters_of(rich)):
        assert schema_problem(schema) is None
        if jsonschema is not None:
            jsonschema.Draft202012Validator.check_schema(schema)
