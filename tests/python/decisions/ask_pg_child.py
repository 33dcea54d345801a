"""A process of its own over a PostgreSQL session, for test_ask_in_doubt_postgres.py. Not a test
module.

``DSN SID COUNTER TOOL TTL``: creates session SID with a lease of TTL seconds and runs a turn
whose model asks for one call of TOOL (``ask_write`` or ``ask_read``, both
``on_in_doubt="ask"``); the body appends ``{"tool", "key"}`` to COUNTER, prints ``IN_BODY`` and
hangs until the parent kills the process with SIGKILL. :func:`build` is also the factory the
parent's ``Worker`` uses (bodies that return at once).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, Optional

from kerman import AgentLoop, ModelReply, PostgresStore, Tool


def build(model: Any, log: Any, counter: str, hang: Optional[asyncio.Event] = None) -> AgentLoop:
    loop = AgentLoop(model, log=log)

    def body(name: str):
        async def fn(args, ctx):
            with open(counter, "a") as f:
                f.write(json.dumps({"tool": name, "key": ctx.idempotency_key}) + "\n")
            if hang is not None:
                print("IN_BODY", flush=True)
                await hang.wait()
            return f"{name} ran"

        return fn

    loop.tool(Tool("ask_write", body("ask_write"), on_in_doubt="ask"))
    loop.tool(Tool("ask_read", body("ask_read"), effect="read", on_in_doubt="ask"))
    return loop


async def main(dsn: str, sid: str, counter: str, tool: str, ttl: str) -> None:
    log = PostgresStore(dsn, lease_ttl=float(ttl)).create(sid)

    async def model(request):
        return ModelReply([{"type": "tool-call", "id": "c1", "name": tool, "arguments": '{"n": 1}'}])

    loop = build(model, log, counter, asyncio.Event())
    loop.followup("go")
    await loop.when_idle()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
