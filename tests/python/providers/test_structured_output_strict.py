"""OpenAI's strict structured output for pydantic types (docs/providers.md#structured-output):
the schema goes out in strict form (every object closed, every property required, the optional
ones nullable, ``$defs`` included) with ``strict: true``, through the real SDKs to a loopback
FakeServer; the reply is validated against the type itself, an optional field sent as ``null``
taking its default. Types without a strict form (an open map) go out as they are, not strict."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Literal, Optional, Union

import pytest
from provider_helpers import asynctest, done, make, of_type
from pydantic import BaseModel, Field

import kerman
from kerman.output import OutputSpec, strict_form
from kerman.providers.testing import FakeServer, Reply

OPENAI = ("openai-chat", "openai-responses")


class Address(BaseModel):
    street: str
    zip: Optional[str] = None


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = 9


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool = True


class Person(BaseModel):
    name: str = Field(description="the full name")
    age: int = 30
    home: Address
    work: Optional[Address] = None
    tags: List[str] = []
    pet: Union[Cat, Dog] = Field(discriminator="kind")


class Counts(BaseModel):
    by_word: Dict[str, int]


def sent_format(protocol: str, body: Dict[str, Any]) -> Dict[str, Any]:
    """``{"schema", "strict"}`` as the request carried them."""
    if protocol == "openai-chat":
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema"
        return fmt["json_schema"]
    fmt = body["text"]["format"]
    assert fmt["type"] == "json_schema"
    return fmt


def objects(schema: Any) -> List[Dict[str, Any]]:
    """Every object schema in ``schema``, ``$defs`` included."""
    found: List[Dict[str, Any]] = []
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            found.append(schema)
        for key, value in schema.items():
            if key not in ("enum", "const", "default", "examples"):
                found.extend(objects(value))
    elif isinstance(schema, list):
        for item in schema:
            found.extend(objects(item))
    return found


def assert_strict(schema: Dict[str, Any]) -> None:
    """OpenAI's strict rules: every object closed and all of its properties required; no
    ``oneOf``, no ``default``, no keyword beside a ``$ref``."""
    for obj in objects(schema):
        assert obj.get("additionalProperties") is False, obj
        assert obj.get("required") == list(obj.get("properties") or {}), obj
    text = json.dumps(schema)
    assert '"oneOf"' not in text and '"default"' not in text and '"discriminator"' not in text

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                assert list(node) == ["$ref"], node
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(schema)


@pytest.mark.parametrize("protocol", OPENAI)
@asynctest
async def test_a_pydantic_model_goes_out_strict_and_nulls_take_defaults(protocol: str) -> None:
    with FakeServer(protocol) as server:
        reply = {
            "name": "Ada",
            "age": None,
            "home": {"street": "1 Loop Rd", "zip": None},
            "work": None,
            "tags": None,
            "pet": {"kind": "cat", "lives": None},
        }
        server.add(Reply(text=json.dumps(reply)))
        model = make(protocol, server)
        loop = kerman.AgentLoop(model)
        result = await loop.run("who?", output_type=Person)
        assert result.output == Person(name="Ada", home=Address(street="1 Loop Rd"), pet=Cat(kind="cat"))
        assert result.output.age == 30 and result.output.pet.lives == 9 and result.output.tags == []
        fmt = sent_format(protocol, server.requests[0].body)
        assert fmt["strict"] is True
        schema = fmt["schema"]
        assert_strict(schema)
        assert set(schema["$defs"]) == {"Address", "Cat", "Dog"}
        assert schema["required"] == ["name", "age", "home", "work", "tags", "pet"]
        # Optional fields are nullable; required ones are not.
        assert {"type": "null"} in schema["properties"]["age"]["anyOf"]
        assert schema["properties"]["name"]["type"] == "string" and "anyOf" not in schema["properties"]["name"]
        assert schema["properties"]["name"]["description"] == "the full name"
        # The log keeps the validated value (the defaults applied), not the nulls sent.
        [validated] = of_type(loop.log, "output/validated")
        assert validated.data["output"]["age"] == 30 and validated.data["output"]["pet"] == {"kind": "cat", "lives": 9}
        await done(loop, model)


@pytest.mark.parametrize("protocol", OPENAI)
@asynctest
async def test_a_null_for_a_required_field_is_still_invalid(protocol: str) -> None:
    with FakeServer(protocol) as server:
        server.add(Reply(text='{"street": null, "zip": null}'), Reply(text='{"street": "2 Main St", "zip": "75001"}'))
        model = make(protocol, server)
        loop = kerman.AgentLoop(model)
        result = await loop.run("where?", output_type=Address)
        assert result.output == Address(street="2 Main St", zip="75001")
        assert len(server.requests) == 2  # the first reply went back with its validation error
        assert all(sent_format(protocol, r.body)["strict"] is True for r in server.requests)
        await done(loop, model)


@pytest.mark.parametrize("protocol", OPENAI)
@asynctest
async def test_a_type_without_a_strict_form_goes_out_as_it_is(protocol: str) -> None:
    with FakeServer(protocol) as server:
        server.add(Reply(text='{"by_word": {"a": 2}}'))
        model = make(protocol, server)
        loop = kerman.AgentLoop(model)
        result = await loop.run("count", output_type=Counts)
        assert result.output == Counts(by_word={"a": 2})
        fmt = sent_format(protocol, server.requests[0].body)
        assert fmt["strict"] is False and fmt["schema"] == OutputSpec(Counts).schema
        await done(loop, model)


def test_strict_form_leaves_the_original_schema_alone() -> None:
    spec = OutputSpec(Person)
    before = json.dumps(spec.schema, sort_keys=True)
    converted = strict_form(spec.schema)
    assert converted is not None and json.dumps(spec.schema, sort_keys=True) == before
    assert spec.strict and spec.strict_schema == converted and spec.wire()["strict_schema"] == converted
    assert strict_form(OutputSpec(Counts).schema) is None and not OutputSpec(Counts).strict
    # A JSON-schema dict is sent as it is: strict only when it already is.
    closed = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
    assert OutputSpec(closed).strict_schema is closed
    assert OutputSpec({"type": "object", "properties": {"a": {"type": "integer"}}}).strict_schema is None
