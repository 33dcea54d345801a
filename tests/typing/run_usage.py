"""A user's script with ``loop.run()`` and structured output, type-checked with
``mypy --strict`` (tests/python/stubs/test_run_typing.py): ``RunResult.output`` has the type
given as ``output_type``."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel
from typing_extensions import TypedDict, assert_type

import kerman


class City(BaseModel):
    name: str
    population: int


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Pair(TypedDict):
    left: str
    right: str


async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
    return kerman.ModelReply('{"name": "Paris", "population": 1, "x": 1, "y": 2}')


async def main() -> None:
    loop = kerman.AgentLoop(model)
    city = await loop.run("the capital of France?", output_type=City)
    assert_type(city, kerman.RunResult[City])
    assert_type(city.output, City)
    print(city.output.population + 1)
    point = await loop.run("a point", output_type=Point)
    assert_type(point.output, Point)
    pair = await loop.run("a pair", output_type=Pair)
    assert_type(pair.output, Pair)
    text = await loop.run("hello")
    assert_type(text.output, Any)
    assert_type(text.text, str)
    try:
        await loop.run("x", output_type={"type": "object"})
    except kerman.RunError as e:
        code: str | None = e.code
        print(code, e.ending, e.turn)
    await loop.aclose()


def script() -> None:
    loop = kerman.AgentLoop(model)
    result = loop.run_sync("the capital?", output_type=City)
    assert_type(result.output, City)
