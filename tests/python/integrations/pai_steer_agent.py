"""The pydantic-ai agent of the steering tests: a ``FunctionModel`` that calls ``weather`` once,
then answers with every user prompt it was given (``seen: a | b``), so the output says what
reached the model. Each model call appends the prompts it saw to ``model.log`` in ``trace_dir``.

Also a child process (``python pai_steer_agent.py KIND WHERE SESSION TRACE_DIR MODE``) that runs
the agent once under ``KermanDurability`` and prints the output; ``MODE``:

- ``plain``: nothing more;
- ``enqueue-die``: the tool puts "use Celsius" in the inbox, waits until it is durable, and the
  process kills itself (before any claim);
- ``claim-die``: the tool puts it in the inbox; the process kills itself right after the run
  claimed it and the claim is durable (before the model request it is for);
- ``answer-die``: the tool puts it in the inbox; the process kills itself right after the model
  response that read it is durable (before the run's end)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

PROMPT = "Weather in Lyon?"
STEER = "use Celsius"


def prompts(messages: list[ModelMessage]) -> list[str]:
    """The user prompts of a conversation, in order."""
    return [
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart) and isinstance(p.content, str)
    ]


def build(trace_dir: Path, capabilities: list[Any], on_tool: Optional[Callable[[], Any]] = None) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen = prompts(messages)
        with open(trace_dir / "model.log", "a", encoding="utf-8") as f:
            f.write(json.dumps(seen) + "\n")
        if not any(isinstance(p, ToolCallPart) for m in messages if isinstance(m, ModelResponse) for p in m.parts):
            return ModelResponse(parts=[ToolCallPart("weather", {"city": "Lyon"}, tool_call_id="w1")])
        return ModelResponse(parts=[TextPart("seen: " + " | ".join(seen))])

    agent = Agent(FunctionModel(model), name="steered", capabilities=capabilities)

    @agent.tool_plain(metadata={"kerman_effect": "read"})
    async def weather(city: str) -> str:
        """The weather in a city."""
        if on_tool is not None:
            done = on_tool()
            if asyncio.iscoroutine(done):
                await done
        return f"sunny in {city}"

    return agent


def model_calls(trace_dir: Path) -> list[list[str]]:
    path = trace_dir / "model.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _child(kind: str, where: str, session: str, trace_dir: Path, mode: str) -> None:
    import kerman
    from kerman.integrations import pydantic_ai as kp
    from kerman.integrations import pydantic_ai_steering as steering

    store: Any = kerman.FileStore(where) if kind == "file" else kerman.PostgresStore(where, lease_ttl=0)
    # A kill after the answer that read the steering must find that answer durable: every unit
    # is flushed (the default waits only around writes and before the run returns).
    durability = kp.KermanDurability(store, session_id=session, sync="units" if mode == "answer-die" else "effects")

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    async def enqueue_then_die() -> None:
        durability.enqueue(STEER)
        await durability.log.flush()
        die()

    async def flush_then_die(self: Any) -> None:
        await durability.log.flush()
        die()

    on_tool: Optional[Callable[[], Any]] = None
    if mode == "enqueue-die":
        on_tool = enqueue_then_die
    elif mode in ("claim-die", "answer-die"):
        on_tool = lambda: durability.enqueue(STEER)  # noqa: E731
    if mode == "claim-die":
        steering.Steering._claimed = flush_then_die  # type: ignore[method-assign]
    if mode == "answer-die":
        logged = 0

        def stop_after_the_answer(self: Any) -> None:
            nonlocal logged
            logged += 1
            if logged == 3:  # model request, weather, the model request that read the steering
                die()

        kp._Journal._logged = stop_after_the_answer  # type: ignore[method-assign]
    result = await build(trace_dir, [durability], on_tool).run(PROMPT)
    durability.close()
    print(json.dumps(result.output), flush=True)


if __name__ == "__main__":
    kind, where, session, trace, mode = sys.argv[1:6]
    asyncio.run(_child(kind, where, session, Path(trace), mode))
