"""Child of test_tool_exits.py: a tool raising KeyboardInterrupt in a step of ``argv[1]`` calls;
prints what the log and the next turn's request held, as one JSON line."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, List

import kerman
from kerman import AgentLoop, ModelReply

CALLS = int(sys.argv[1])
REQUESTED = [("c0", "slow"), ("c1", "interrupted"), ("c2", "slow")] if CALLS > 1 else [("c1", "interrupted")]
started: List[str] = []
seen: List[Any] = []


async def interrupted(args, ctx):
    raise KeyboardInterrupt


async def slow(args, ctx):
    started.append(ctx.call_id)
    await asyncio.Event().wait()  # until cancelled
    return "never"


def model_of(*replies: ModelReply) -> Any:
    queue = list(replies)

    async def model(request: kerman.ModelRequest) -> ModelReply:
        seen.append(list(request.messages))
        return queue.pop(0)

    return model


def run(loop: AgentLoop, prompt: str) -> None:
    async def main() -> None:
        loop.followup(prompt)
        await loop.when_idle()

    asyncio.run(main())


calls = ModelReply([{"type": "tool-call", "id": i, "name": n, "arguments": "{}"} for i, n in REQUESTED])
loop = AgentLoop(model_of(calls), tools=[kerman.Tool("interrupted", interrupted), kerman.Tool("slow", slow)], max_parallel_tool_calls=2)
propagated = None
try:
    run(loop, "go")
except KeyboardInterrupt as e:
    propagated = type(e).__name__
status = loop.status
resumed = AgentLoop(model_of(ModelReply("fine")), log=loop.log)
run(resumed, "again")
asked = [b["id"] for m in seen[-1] if m.role == "assistant" for b in m.content if b["type"] == "tool-call"]
answered = {b["toolCallId"] for m in seen[-1] if m.role == "user" for b in m.content if b["type"] == "tool-result"}
print(
    json.dumps(
        {
            "propagated": propagated,
            "status": status,
            "requested": [i for i, _ in REQUESTED],
            "started": started,
            "results": [
                (e.data["message"]["content"][0]["toolCallId"], e.data.get("error")) for e in loop.log.events() if e.type == "tool/result"
            ],
            "ends": [e.data["reason"] for e in loop.log.events() if e.type == "turn/end"],
            "unanswered": [c for c in asked if c not in answered],
        }
    )
)
