"""Reading a session through kerman.events, as a user would: a streamed turn, a tool call and
a failure, without one string key, from the views the log's readers hand out
(``log.events(view=True)``, ``log.tail(view=True)``, ``log.subscribe(..., view=True)``).
Type-checked with mypy --strict and executed by tests/python/events/test_events_typing.py."""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, assert_type

import kerman
from kerman import events


async def streamed(request: kerman.ModelRequest) -> AsyncIterator[dict[str, object]]:
    """A streaming model: a tool call first, then the answer; a failure on the second turn."""
    if request.turn == 2:
        raise kerman.ModelError("rate limited", code="RATE_LIMITED", status=429)
    if request.step == 1:
        yield {"type": "text-delta", "text": "Checking the "}
        yield {"type": "text-delta", "text": "weather."}
        yield {"type": "tool-call", "id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'}
    else:
        yield {"type": "text-delta", "text": "Sunny in Oslo."}
    yield {"type": "usage", "input": 12, "output": 4}
    yield {"type": "finish", "reason": "stop"}


async def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: sunny"


async def run() -> tuple[kerman.SessionLog, list[str]]:
    loop = kerman.AgentLoop(streamed)
    loop.tool(weather)
    ended: list[str] = []

    def on_commit(event: events.EventView) -> None:
        if isinstance(event, events.TurnEnd):
            ended.append(f"committed turn {event.turn} {event.reason.kind}")

    loop.log.subscribe(on_commit, view=True)
    loop.followup("Weather in Oslo?")
    await loop.when_idle()
    loop.followup("And tomorrow?")
    await loop.when_idle()
    await loop.aclose()
    loop.log.close()
    async for event in loop.log.tail(types=events.TOOL_RESULT, view=True):
        assert_type(event, events.EventView)
        if isinstance(event, events.ToolResultEvent):
            ended.append(f"tailed result of {event.call_id}")
    return loop.log, ended


def read(log: kerman.SessionLog) -> list[str]:
    lines: list[str] = []
    text = ""
    for event in log.events(view=True):
        assert_type(event, events.EventView)
        if isinstance(event, events.AssistantChunk):
            chunk = event.chunk
            if isinstance(chunk, events.TextDelta):
                text += chunk.text
            elif isinstance(chunk, events.ToolCallChunk):
                lines.append(f"streamed call {chunk.name}({chunk.arguments})")
            elif isinstance(chunk, events.UsageChunk):
                lines.append(f"usage {chunk.usage.input}+{chunk.usage.output}")
        elif isinstance(event, events.AssistantMessageEvent):
            lines.append(f"step {event.step}: {text!r} = {event.message.text!r}")
            text = ""
            for call in event.message.tool_calls:
                lines.append(f"asked for {call.name} ({call.id})")
        elif isinstance(event, events.ToolCall):
            lines.append(f"call {event.call_id} {event.name} {event.arguments}")
        elif isinstance(event, events.ToolResultEvent):
            lines.append(f"result {event.call_id}: {event.text} error={event.is_error}")
        elif isinstance(event, events.TurnEnd):
            ending = event.reason
            failure: events.Failure | None = ending.error
            if failure is not None:
                lines.append(f"turn {event.turn} failed: {failure.message} [{failure.code}, {failure.status}]")
            else:
                lines.append(f"turn {event.turn} {ending.kind}")
    return lines


def main() -> None:
    logging.getLogger("kerman").addHandler(logging.NullHandler())  # the failed turn's report
    log, seen = asyncio.run(run())
    for line in read(log) + seen:
        print(line)


if __name__ == "__main__":
    main()
