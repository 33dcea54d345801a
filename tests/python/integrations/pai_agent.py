"""The pydantic-ai agent of the KermanDurability tests: a ``FunctionModel`` scripted by the
conversation so far (so a resumed run asks for the same things), two tools and structured
output. Every model call and every tool execution appends one line to a file in ``trace_dir``,
so a test counts what ran, across processes.

The weather tool is a read (``kerman_effect`` in its metadata), book a write (the default): a
book call in doubt fails with an outcome-unknown result, a weather call runs again.

Also a child process (``python pai_agent.py KIND WHERE SESSION TRACE_DIR KILL_AFTER [KILL_IN [SYNC]]``):
runs the agent once under ``KermanDurability(..., sync=SYNC)`` (default ``units``), kills
itself with SIGKILL right after the ``KILL_AFTER``-th unit result of this process is appended
(0: never; with ``units`` it is durable then), or inside tool ``KILL_IN`` (``""``: none) right
after its effect (its trace line) is written, and prints the output as JSON when the run ends."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

PROMPT = "Plan a trip to Lyon and book it."


class Booking(BaseModel):
    city: str
    weather: str
    reference: str


def _trace(trace_dir: Path, name: str, line: str) -> None:
    with open(trace_dir / name, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def build(trace_dir: Path, capabilities: list[Any]) -> Agent[None, Booking]:
    """The agent: weather (read) then book (write), then the final output through its output tool."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        _trace(trace_dir, "model.log", str(len(returns)))
        if not returns:
            return ModelResponse(parts=[TextPart("Checking the weather."), ToolCallPart("weather", {"city": "Lyon"}, tool_call_id="c1")])
        if len(returns) == 1:
            return ModelResponse(parts=[ToolCallPart("book", {"city": "Lyon", "weather": returns[0].content}, tool_call_id="c2")])
        output = {"city": "Lyon", "weather": returns[0].content, "reference": returns[1].content}
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, output, tool_call_id="c3")])

    agent = Agent(FunctionModel(model), name="trip", output_type=Booking, capabilities=capabilities)

    @agent.tool_plain(metadata={"kerman_effect": "read"})
    def weather(city: str) -> str:
        """The weather in a city."""
        _trace(trace_dir, "weather.log", city)
        return f"sunny in {city}"

    @agent.tool_plain
    def book(city: str, weather: str) -> str:
        """Books a trip (a write: it must not run twice)."""
        _trace(trace_dir, "book.log", city)
        return f"BK-{city.upper()}-{len(weather)}"

    return agent


def _store(kind: str, where: str) -> Any:
    import kerman

    if kind == "file":
        return kerman.FileStore(where)
    return kerman.PostgresStore(where, lease_ttl=0)  # lease_ttl=0: a killed owner's lease lapses at once


async def _child(kind: str, where: str, session: str, trace_dir: Path, kill_after: int, kill_in: str = "", sync: str = "units") -> None:
    from kerman.integrations import pydantic_ai as kp

    if kill_in:
        real = _trace

        def trace_then_die(trace_dir: Path, name: str, line: str) -> None:
            real(trace_dir, name, line)
            if name == f"{kill_in}.log":
                os.kill(os.getpid(), signal.SIGKILL)

        globals()["_trace"] = trace_then_die

    if kill_after:
        logged = 0

        def stop_here(self: Any) -> None:
            nonlocal logged
            logged += 1
            if logged == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)

        kp._Journal._logged = stop_here  # type: ignore[method-assign]
    durability = kp.KermanDurability(_store(kind, where), session_id=session, sync=sync)
    result = await build(trace_dir, [durability]).run(PROMPT)
    durability.close()
    print(json.dumps(result.output.model_dump()), flush=True)


if __name__ == "__main__":
    kind, where, session, trace, kill = sys.argv[1:6]
    kill_in, sync = (sys.argv[6:] + ["", "units"][len(sys.argv[6:]) :])[:2]
    asyncio.run(_child(kind, where, session, Path(trace), int(kill), kill_in, sync))
