"""Structured output (``output_type=``) through each of the four wire protocols, via the vendor's
real SDK and a loopback FakeServer: the schema goes out with the vendor's own mechanism, a valid
reply is validated, logged (``output/validated``) and returned typed by ``run()``; an invalid
one goes back to the model with the validation error, and after ``output_retries`` the turn
fails with ``INVALID_OUTPUT``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List

import pytest
from provider_helpers import PROTOCOLS, asynctest, done, make, of_type
from pydantic import BaseModel
from typing_extensions import TypedDict

import kerman
from kerman.providers.testing import FakeServer, Reply

pytestmark = pytest.mark.parametrize("protocol", PROTOCOLS)


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


SCHEMA: Dict[str, Any] = {
    "title": "Answer",
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}


@pytest.fixture
def server(protocol: str):
    with FakeServer(protocol) as s:
        yield s


def schema_sent(protocol: str, body: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON schema a request carried, read the vendor's way (and checked to be that way)."""
    if protocol == "openai-chat":
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema" and isinstance(fmt["json_schema"]["strict"], bool)
        return fmt["json_schema"]["schema"]
    if protocol == "openai-responses":
        fmt = body["text"]["format"]
        assert fmt["type"] == "json_schema" and fmt["name"]
        return fmt["schema"]
    if protocol == "anthropic":
        fmt = body["output_config"]["format"]
        assert fmt["type"] == "json_schema"
        return fmt["schema"]
    config = body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    return config["responseJsonSchema"]


def user_texts(request_body: Dict[str, Any]) -> str:
    return json.dumps(request_body)


@asynctest
async def test_a_valid_reply_is_logged_and_returned_typed(protocol, server):
    server.add(Reply(text=['{"name": "Paris", ', '"population": 2100000}']))
    model = make(protocol, server)
    loop = kerman.AgentLoop(model)
    result = await loop.run("the capital of France?", output_type=City)
    assert result.output == City(name="Paris", population=2100000)
    assert result.text == '{"name": "Paris", "population": 2100000}'
    sent = schema_sent(protocol, server.requests[0].body)
    assert sent["properties"]["population"]["type"] == "integer" and sent["required"] == ["name", "population"]
    [validated] = of_type(loop.log, "output/validated")
    assert validated.data == {"turn": 1, "step": 1, "output": {"name": "Paris", "population": 2100000}}
    view = kerman.events.view(validated)
    assert isinstance(view, kerman.events.OutputValidated) and view.output["name"] == "Paris"
    await done(loop, model)


@asynctest
async def test_an_invalid_reply_goes_back_with_the_error_and_is_fixed(protocol, server):
    server.add(Reply(text='{"answer": "forty-two"}'), Reply(text='{"answer": 42}'))
    model = make(protocol, server)
    loop = kerman.AgentLoop(model, output_type=SCHEMA)
    result = await loop.run("6 x 7?")
    assert result.output == {"answer": 42} and result.turn == 1
    assert len(server.requests) == 2
    assert schema_sent(protocol, server.requests[1].body) == SCHEMA
    # The second request carried the validation error as context, in the same turn.
    assert "is not of type 'integer'" in user_texts(server.requests[1].body)
    contexts = [e.data for e in of_type(loop.log, "user/message") if e.data["source"]["kind"] == "context"]
    assert len(contexts) == 1 and contexts[0]["source"]["plugin"] == "kerman.output"
    assert [e.data["output"] for e in of_type(loop.log, "output/validated")] == [{"answer": 42}]
    await done(loop, model)


@asynctest
async def test_retries_exhausted_end_the_turn_with_invalid_output(protocol, server):
    server.add(Reply(text="not json"), Reply(text='{"x": "one", "y": 2}'), Reply(text="{}"))
    model = make(protocol, server)
    loop = kerman.AgentLoop(model, output_retries=2)
    with pytest.raises(kerman.RunError) as caught:
        await loop.run("a point", output_type=Point)
    error = caught.value
    assert error.kind == "error" and error.code == "INVALID_OUTPUT"
    assert "does not match output type 'Point' after 3 attempt(s)" in str(error)
    assert len(server.requests) == 3 and not of_type(loop.log, "output/validated")
    [end] = of_type(loop.log, "turn/end")
    assert end.data["reason"]["error"]["code"] == "INVALID_OUTPUT"
    # The loop's output type stays unset: a plain run afterwards is text.
    server.add(Reply(text="plain"))
    result = await loop.run("now text")
    assert result.output == "plain" and "response_format" not in server.requests[-1].body
    await done(loop, model)


@asynctest
async def test_a_typed_dict_output_type(protocol, server):
    server.add(Reply(text='{"left": "a", "right": "b"}'))
    model = make(protocol, server)
    loop = kerman.AgentLoop(model)
    result = await loop.run("a pair", output_type=Pair)
    assert result.output == {"left": "a", "right": "b"}
    assert set(schema_sent(protocol, server.requests[0].body)["properties"]) == {"left", "right"}
    await done(loop, model)


def test_output_type_is_checked_when_given(protocol: str) -> None:
    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        return kerman.ModelReply("")

    with pytest.raises(TypeError, match="output_type must be a pydantic model, a dataclass, a TypedDict or a JSON-schema dict, got 42"):
        kerman.AgentLoop(model, output_type=42)
    with pytest.raises(ValueError, match="output_type is not a valid JSON schema"):
        kerman.AgentLoop(model, output_type={"type": "no-such-type"})
    with pytest.raises(ValueError, match="output_retries must be an int >= 0, got -1"):
        kerman.AgentLoop(model, output_retries=-1)


def strict_flags(protocol: str, bodies: List[Dict[str, Any]]) -> List[Any]:
    if protocol == "openai-chat":
        return [b["response_format"]["json_schema"]["strict"] for b in bodies]
    if protocol == "openai-responses":
        return [b["text"]["format"]["strict"] for b in bodies]
    return []


@asynctest
async def test_strict_is_sent_when_the_schema_allows_it(protocol, server):
    server.add(Reply(text='{"answer": 1}'), Reply(text='{"name": "x", "population": 1}'))
    model = make(protocol, server)
    loop = kerman.AgentLoop(model)
    await loop.run("one", output_type=SCHEMA)
    await loop.run("two", output_type=City)  # pydantic's schema, sent in its strict form
    expected = [True, True] if protocol.startswith("openai") else []
    assert strict_flags(protocol, [r.body for r in server.requests]) == expected
    await done(loop, model)
