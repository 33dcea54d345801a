"""Deeply nested JSON in a turn (issue 12, item 6): tool-call arguments nested past the parser's
limit are invalid arguments, for a lone call and in the pool, and deep values elsewhere in a
turn give clear errors, never a crash. No test sleeps or measures time."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest

from kerman import AgentLoop, ModelReply, Tool, ToolResult
from kerman.models import EchoModel, ScriptedModel

DEPTH = 100_000


def deep_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def run_calls(calls: List[Dict[str, Any]], tools: List[Tool]) -> List[Any]:
    """One turn: the model asks for ``calls``, then says "done"; returns the log's events."""
    return run_calls_with(ModelReply(calls), tools)


def results_of(events: List[Any]) -> List[Dict[str, Any]]:
    return [e.data for e in events if e.type == "tool/result"]


def end_of(events: List[Any]) -> Dict[str, Any]:
    ends = [e.data["reason"] for e in events if e.type == "turn/end"]
    assert len(ends) == 1, ends
    return ends[0]


# ---- item 6: deeply nested arguments ------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [deep_array(DEPTH), deep_object(DEPTH), deep_array(5_000), deep_array(1_001)],
    ids=["array-100k", "object-100k", "array-5k", "array-1001"],
)
@pytest.mark.parametrize("calls", [1, 2], ids=["lone", "pool"])
def test_deep_arguments_are_invalid_arguments(arguments, calls):
    seen: List[Any] = []

    async def body(args, ctx):
        seen.append(args)
        return "ran"

    blocks = [{"type": "tool-call", "id": f"c{i}", "name": "t", "arguments": arguments} for i in range(calls)]
    events = run_calls(blocks, [Tool("t", body)])
    results = results_of(events)
    assert len(results) == calls
    for data in results:
        assert data["error"] == {"name": "ValueError", "code": "INVALID_ARGUMENTS"}
        text = data["message"]["content"][0]["content"][0]["text"]
        assert text.startswith("invalid tool arguments: nested too deeply"), text
    assert seen == []  # the body never ran
    assert end_of(events) == {"kind": "completed"}  # the turn continued: the model saw the error


def deep_value(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def test_deep_values_elsewhere_in_a_turn_give_clear_errors():
    """The neighbours of deep arguments: a deep tool result is an error result (the turn goes
    on), deep request options and deep reply content fail the turn with a clear error; none is
    a RecursionError or a crash."""

    async def deep_result(args, ctx):
        return ToolResult([{"type": "text", "text": "x", "v": deep_value(DEPTH)}])

    events = run_calls([call("c1")], [Tool("t", deep_result)])
    [result] = results_of(events)
    assert result["error"]["code"] == "TOOL_ERROR"
    assert "nested deeper than 100 levels" in result["message"]["content"][0]["content"][0]["text"]
    assert end_of(events) == {"kind": "completed"}

    async def deep_options(request, next):
        request.options = {"v": deep_value(DEPTH)}
        return request

    async def main() -> List[Any]:
        loop = AgentLoop(EchoModel())
        loop.before_request(deep_options)
        loop.followup("hi")
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events

    reason = end_of(asyncio.run(main()))
    assert reason["error"]["code"] == "INVALID_REQUEST", reason
    assert reason["error"]["message"].startswith("request options are not lossless JSON"), reason

    reply = ModelReply([{"type": "tool-call", "id": "c1", "name": "t", "arguments": deep_value(DEPTH)}])
    reason = end_of(run_calls_with(reply, [Tool("t", lambda args, ctx: "ran")]))
    assert reason["kind"] == "error" and "nested deeper than 100 levels" in reason["error"]["message"], reason


def call(id: str, name: str = "t", arguments: str = "{}") -> Dict[str, Any]:
    return {"type": "tool-call", "id": id, "name": name, "arguments": arguments}


def run_calls_with(reply: Any, tools: List[Tool]) -> List[Any]:
    """One turn: the model gives ``reply``, then says "done"; returns the log's events."""

    async def main() -> List[Any]:
        loop = AgentLoop(ScriptedModel([reply, "done"]), tools=tools)
        loop.followup("hi")
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events

    return asyncio.run(main())
