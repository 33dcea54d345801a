"""The tools of the in-doubt tests: one per effect class and policy. Each body appends one
line ``{"tool", "key"}`` to the counter file per execution (so a test counts executions), then
waits for ``hang`` when one is given (the child that is killed mid-call)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, Optional

from kerman import AgentLoop, Tool

RECONCILED = "found the write: id 42"


def build(model: Any, log: Any, counter: str, hang: Optional[asyncio.Event] = None) -> AgentLoop:
    loop = AgentLoop(model, log=log)

    def body(name: str):
        async def fn(args, ctx):
            with open(counter, "a") as f:
                f.write(json.dumps({"tool": name, "key": ctx.idempotency_key}) + "\n")
            if hang is not None:
                print("IN_BODY", flush=True)
                sys.stdout.flush()
                await hang.wait()
            return f"{name} ran"

        return fn

    def found(ctx):
        return RECONCILED

    async def nothing(ctx):
        return None

    for name, effect, policy in [
        ("look", "read", "retry"),
        ("put", "idempotent", "retry"),
        ("send", "write", "fail"),
        ("pay", "write", found),
        ("book", "write", nothing),
    ]:
        loop.tool(Tool(name, body(name), effect=effect, on_in_doubt=policy))
    return loop
