"""kerman.integrations.pydantic_ai.model(m): pydantic-ai models under an AgentLoop. A streamed
FunctionModel (text deltas, a tool call), TestModel, pydantic-ai's OpenAIChatModel against the
loopback Chat Completions server: the loop's tools reach the model as ToolDefinitions, tool
calls come back as Kerman tool calls and their results go back to the model with the tool's
name; usage reaches the usage ledger; pydantic-ai's failures become Kerman's classified errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic import BaseModel  # noqa: E402
from pydantic_ai import exceptions as pai  # noqa: E402
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel  # noqa: E402
from pydantic_ai.models.test import TestModel  # noqa: E402
from pydantic_ai.tools import ToolDefinition  # noqa: E402
from pydantic_ai.usage import RequestUsage  # noqa: E402

import kerman  # noqa: E402
from kerman.integrations.pydantic_ai import PydanticAIModel, kerman_tool, model, tool_definition  # noqa: E402
from kerman.integrations.pydantic_ai_model import failure  # noqa: E402
from kerman.providers.testing import FakeServer, HttpError, Reply, ToolCall  # noqa: E402
from kerman.usage import ledger  # noqa: E402


def _returns(messages: list[Any]) -> list[ToolReturnPart]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]


async def _turn(loop: kerman.AgentLoop, text: str) -> None:
    loop.followup(text)
    await loop.when_idle()


def _chunks(loop: kerman.AgentLoop) -> list[dict[str, Any]]:
    return [e.data["chunk"] for e in loop.log.events(types=["assistant/chunk"])]


def _turn_end(loop: kerman.AgentLoop) -> dict[str, Any]:
    return [e.data["reason"] for e in loop.log.events(types=["turn/end"])][-1]


def test_a_streamed_function_model_drives_a_loop_with_a_tool():
    seen: list[AgentInfo] = []

    async def stream(messages, info):
        seen.append(info)
        returns = _returns(messages)
        if not returns:
            yield "Let me "
            yield "look."
            yield {0: DeltaToolCall(name="weather", json_args='{"city": ', tool_call_id="call_1")}
            yield {0: DeltaToolCall(json_args='"Lyon"}')}
        else:
            yield f"It is {returns[0].content} ({returns[0].tool_name})."

    async def main():
        loop = kerman.AgentLoop(model(FunctionModel(stream_function=stream)), instructions="Be brief.")

        @loop.tool
        async def weather(args, ctx):
            "The weather in a city."
            return f"sunny in {args['city']}"

        await _turn(loop, "Weather in Lyon?")
        await loop.aclose()
        return loop

    loop = asyncio.run(main())
    assert loop.log.transcript()[-1].text == "It is sunny in Lyon (weather)."
    chunks = _chunks(loop)
    deltas = [c["text"] for c in chunks if c["type"] == "text-delta"]
    assert deltas[:2] == ["Let me ", "look."]
    calls = [c for c in chunks if c["type"] == "tool-call"]
    assert calls == [{"type": "tool-call", "id": "call_1", "name": "weather", "arguments": '{"city": "Lyon"}'}]
    assert [c["type"] for c in chunks].count("usage") == 2 and [c["type"] for c in chunks].count("finish") == 2
    # The loop's tool reached the model as a ToolDefinition, the instructions as its instructions.
    tool = seen[0].function_tools[0]
    assert (tool.name, tool.description) == ("weather", "The weather in a city.")
    assert seen[0].instructions == "Be brief."


def test_a_non_streamed_function_model_and_structured_output():
    class City(BaseModel):
        name: str
        country: str

    seen: list[AgentInfo] = []

    def reply(messages, info):
        seen.append(info)
        return ModelResponse(
            parts=[TextPart('{"name": "Lyon", "country": "FR"}')],
            usage=RequestUsage(input_tokens=30, output_tokens=7, cache_read_tokens=10),
        )

    async def main():
        loop = kerman.AgentLoop(model(FunctionModel(reply)), output_type=City)  # no stream_function: answered whole
        await _turn(loop, "Which city?")
        await loop.aclose()
        return loop

    loop = asyncio.run(main())
    params = seen[0].model_request_parameters
    assert params.output_mode == "native" and params.output_object.json_schema["properties"]["name"] == {"title": "Name", "type": "string"}
    assert loop.log.transcript()[-1].text == '{"name": "Lyon", "country": "FR"}'
    session = ledger(loop.log).session
    assert (session.input, session.cache_read, session.output) == (20, 10, 7)


def test_test_model_calls_every_tool_then_answers():
    async def main():
        loop = kerman.AgentLoop(model(TestModel()))
        ran = []

        @loop.tool
        async def clock(args, ctx):
            "Returns the time."
            ran.append(args)
            return "12:00"

        await _turn(loop, "What time is it?")
        await loop.aclose()
        return loop, ran

    loop, ran = asyncio.run(main())
    assert ran == [{}]
    assert "clock" in loop.log.transcript()[-1].text and "12:00" in loop.log.transcript()[-1].text
    assert _turn_end(loop)["kind"] == "completed"


def test_pydantic_ais_openai_model_against_the_loopback_chat_server():
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async def main():
        with FakeServer("openai-chat") as server:
            server.add(
                Reply(
                    text=["Checking ", "the clock."],
                    tool_calls=[ToolCall("call_9", "clock", '{"tz": "UTC"}')],
                    usage={"input": 40, "output": 12},
                ),
                Reply(text="It is 12:00 UTC.", usage={"input": 60, "output": 6, "cacheRead": 32}),
            )
            provider = OpenAIProvider(base_url=server.url, api_key="sk-test")
            loop = kerman.AgentLoop(model(OpenAIChatModel("gpt-test", provider=provider)), instructions="Be brief.")

            @loop.tool
            async def clock(args, ctx):
                "Returns the time in a time zone."
                return f"12:00 {args['tz']}"

            await _turn(loop, "What time is it?")
            await loop.aclose()
            await provider.client.close()
            return loop, server.requests

    loop, requests = asyncio.run(main())
    assert loop.log.transcript()[-1].text == "It is 12:00 UTC."
    first, second = requests[0].body, requests[1].body
    assert first["stream"] is True
    assert first["messages"][0] == {"role": "system", "content": "Be brief."}
    assert first["tools"][0]["function"]["name"] == "clock"
    assert first["tools"][0]["function"]["parameters"]["type"] == "object"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_9", "content": "12:00 UTC"}
    assert [c for c in _chunks(loop) if c["type"] == "text-delta"][:2] == [
        {"type": "text-delta", "text": "Checking "},
        {"type": "text-delta", "text": "the clock."},
    ]
    session = ledger(loop.log).session
    assert (session.input, session.output, session.cache_read) == (100 - 32, 18, 32)


@pytest.mark.parametrize(
    "error, code, cls",
    [
        (HttpError(429, "Rate limit reached", kind="rate_limit_exceeded", headers={"retry-after": "3"}), "RATE_LIMITED", "RateLimitError"),
        (HttpError(429, "You exceeded your quota", kind="insufficient_quota"), "QUOTA_EXCEEDED", "RateLimitError"),
        (
            HttpError(400, "This model's maximum context length is 8192 tokens", kind="context_length_exceeded"),
            "CONTEXT_LENGTH_EXCEEDED",
            "ContextLengthError",
        ),
        (HttpError(401, "Incorrect API key provided", kind="invalid_api_key"), "AUTHENTICATION_FAILED", "AuthenticationError"),
        (HttpError(503, "The server is overloaded"), "OVERLOADED", "OverloadedError"),
        (HttpError(500, "The model had an error", kind="server_error"), "SERVER_ERROR", "ServerError"),
        (HttpError(404, "The model does not exist", kind="model_not_found"), "NOT_FOUND", "InvalidRequestError"),
    ],
)
def test_the_openai_models_http_errors_are_classified(error, code, cls):
    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async def main():
        with FakeServer("openai-chat") as server:
            server.add(error)
            client = AsyncOpenAI(base_url=server.url, api_key="sk-test", max_retries=0)
            loop = kerman.AgentLoop(model(OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=client)), retry=None))
            await _turn(loop, "hi")
            await loop.aclose()
            await client.close()
            return loop

    end = _turn_end(asyncio.run(main()))
    assert end["kind"] == "error", end
    assert end["error"]["message"].startswith(f"pydantic-ai: HTTP {error.status} {error.message}")
    assert (end["error"]["code"], end["error"]["status"], end["error"]["exceptionType"]) == (code, error.status, cls)
    if "retry-after" in error.headers:
        assert end["error"]["retryAfterMs"] == 3000


@pytest.mark.parametrize(
    "exc, code, status",
    [
        (pai.ModelHTTPError(429, "m", body={"error": {"message": "slow down"}}), "RATE_LIMITED", 429),
        (pai.ModelHTTPError(403, "m", body=None), "PERMISSION_DENIED", 403),
        (pai.ModelHTTPError(413, "m", body=None), "CONTEXT_LENGTH_EXCEEDED", 413),
        (pai.ModelHTTPError(529, "m", body=None), "OVERLOADED", 529),
        (pai.ModelAPIError("m", "connection refused"), "SERVER_ERROR", None),
        (pai.UnexpectedModelBehavior("the reply has no parts"), "SERVER_ERROR", None),
    ],
)
def test_pydantic_ai_failures_from_any_model_are_classified(exc, code, status):
    mapped = failure("pydantic-ai", exc)
    assert isinstance(mapped, kerman.ModelError)
    assert (mapped.code, mapped.status) == (code, status), mapped
    assert str(mapped).startswith("pydantic-ai: ")


def test_a_failure_raised_by_a_function_model_ends_the_turn_classified():
    def reply(messages, info):
        raise pai.ModelHTTPError(429, "function:reply", body={"error": {"message": "slow down"}})

    async def main():
        loop = kerman.AgentLoop(model(FunctionModel(reply), retry=None))
        await _turn(loop, "hi")
        await loop.aclose()
        return loop

    end = _turn_end(asyncio.run(main()))
    assert (end["kind"], end["error"]["code"], end["error"]["status"]) == ("error", "RATE_LIMITED", 429)


def test_errors_that_are_not_model_failures_are_not_classified():
    assert failure("pydantic-ai", pai.UserError("bad setting")) is None
    assert failure("pydantic-ai", RuntimeError("a bug")) is None


def test_tool_definitions_go_both_ways_and_bad_input_is_named():
    kt = {"name": "clock", "description": "The time.", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
    td = tool_definition(kt)
    assert isinstance(td, ToolDefinition) and td.parameters_json_schema == kt["parameters"]
    assert kerman_tool(td) == kt
    with pytest.raises(ValueError, match="needs a non-empty 'name'"):
        tool_definition({"description": "nameless"})
    with pytest.raises(TypeError, match="takes a pydantic-ai Model .* not 42"):
        model(42)
    m = model(TestModel(), temperature=0.2)
    assert isinstance(m, PydanticAIModel) and m.params == {"temperature": 0.2}
    assert repr(m) == "PydanticAIModel('test:test', model=TestModel)"


def test_history_with_tool_results_and_images_converts_to_pydantic_ai_messages():
    from kerman.integrations.pydantic_ai_model import to_messages

    history = [
        kerman.UserMessage([{"type": "text", "text": "look"}, {"type": "image", "mediaType": "image/png", "data": "aGk="}]),
        kerman.AssistantMessage(
            [{"type": "reasoning", "text": "hmm"}, {"type": "tool-call", "id": "c1", "name": "zoom", "arguments": '{"x": 1}'}]
        ),
        kerman.ToolResultMessage("c1", "zoomed", is_error=True),
        kerman.UserMessage("and now?"),
    ]
    out = to_messages(history, "Be brief.")
    assert [type(m).__name__ for m in out] == ["ModelRequest", "ModelResponse", "ModelRequest"]
    image = out[0].parts[0].content[1]
    assert (image.data, image.media_type) == (b"hi", "image/png")
    call = out[1].parts[1]
    assert isinstance(call, ToolCallPart) and (call.tool_name, call.args_as_dict()) == ("zoom", {"x": 1})
    ret, user = out[2].parts
    assert (ret.tool_name, ret.content, ret.outcome) == ("zoom", "zoomed", "failed")
    assert user.content == "and now?"
    assert out[2].instructions == "Be brief." and out[0].instructions is None
