"""The smallest complete agent: an ``AgentLoop``, a model function and one tool.

The "model" is a tiny deterministic function standing in for an LLM client (no network): when a
user asks for a sum it calls the ``add`` tool, and once the tool result is in the history it
answers with it. The loop records every step in a session log (here a private in-memory log;
pass ``log=kerman.FileStore("sessions/").create()`` to keep it on disk).

Run it: ``python examples/minimal_agent.py``
"""

from __future__ import annotations

import asyncio
import json
import re

import kerman


def tool_text(message: kerman.Message) -> str:
    """The text of a tool result (its single ``tool-result`` block holds the content blocks)."""
    return "".join(b.get("text", "") for b in message.content[0]["content"])


async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
    """Replace this with a call to your LLM: ``request.messages`` is the history, ``request.tools``
    the tool specs. Tool calls are ``tool-call`` content blocks."""
    last = request.messages[-1]
    if isinstance(last, kerman.ToolResultMessage):  # the tool answered: report its result
        return kerman.ModelReply(f"The sum is {tool_text(last)}.")
    numbers = [int(n) for n in re.findall(r"-?\d+", last.text)]
    if len(numbers) == 2:
        arguments = json.dumps({"a": numbers[0], "b": numbers[1]})
        return kerman.ModelReply(
            [
                {"type": "text", "text": "Let me add those."},
                {"type": "tool-call", "id": f"call-{request.turn}", "name": "add", "arguments": arguments},
            ]
        )
    return kerman.ModelReply("Ask me to add two numbers.")


async def main() -> None:
    loop = kerman.AgentLoop(model)

    @loop.tool(parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})
    async def add(args: dict, ctx: kerman.ToolContext) -> str:
        """Adds two integers."""
        return str(args["a"] + args["b"])

    loop.followup("What is 19 + 23?")  # queues the prompt and starts a turn
    await loop.when_idle()  # wait until the turn has ended

    # Everything that happened is in the log.
    for event in loop.log.events(types=("user/message", "assistant/message", "tool/call", "tool/result")):
        data = event.data
        if event.type == "user/message":
            print("user      ", kerman.Message.from_dict(data).text)
        elif event.type == "assistant/message":
            print("assistant ", kerman.Message.from_dict(data["message"]).text)
        elif event.type == "tool/call":
            print("tool call ", data["name"], data["arguments"])
        else:
            print("tool      ", tool_text(kerman.Message.from_dict(data["message"])))
    end = list(loop.log.events(types="turn/end"))[-1]
    print(f"turn {end.data['turn']} ended: {end.data['reason']['kind']}")
    await loop.aclose()


if __name__ == "__main__":
    asyncio.run(main())
