"""Child of test_tool_exits_wire.py: over FakeServer(argv[1]), a step of two calls, one of them
raising KeyboardInterrupt; the program catches it and goes on with the session. Prints, as one
JSON line, what propagated and the calls the next request left unanswered."""

from __future__ import annotations

import asyncio
import json
import sys

from provider_helpers import make
from wire_calls import unanswered

import kerman
from kerman.providers.testing import FakeServer, Reply, ToolCall

PROTOCOL = sys.argv[1]


async def interrupted(args, ctx):
    """Interrupted."""
    raise KeyboardInterrupt


async def slow(args, ctx):
    """Waits."""
    await asyncio.Event().wait()
    return "never"


def turn(log, prompt, first):
    async def main():
        model = make(PROTOCOL, server)
        loop = kerman.AgentLoop(model, log=log, tools=[kerman.Tool("slow", slow), kerman.Tool("interrupted", interrupted)])
        try:
            loop.followup(prompt)
            await loop.when_idle()
        finally:
            await model.aclose()

    asyncio.run(main())


with FakeServer(PROTOCOL) as server:
    server.add(Reply(tool_calls=[ToolCall("call_1", "slow", "{}"), ToolCall("call_2", "interrupted", "{}")]), Reply(text="Carrying on."))
    log = kerman.MemoryStore().create("s")
    propagated = None
    try:
        turn(log, "go", True)
    except KeyboardInterrupt as e:
        propagated = type(e).__name__
    turn(log, "again", False)
    print(
        json.dumps(
            {
                "propagated": propagated,
                "requests": len(server.requests),
                "unanswered": unanswered(PROTOCOL, server.requests[-1].body),
                "ends": [e.data["reason"] for e in log.events() if e.type == "turn/end"],
            }
        )
    )
