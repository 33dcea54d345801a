"""A process of its own over a file-store session, for test_ask_in_doubt.py.

``ROOT SID COUNTER TOOL``: the first turn of session SID (created) asks for one call of TOOL
(``ask_write``: a write tool, or ``ask_read``: a read tool, both ``on_in_doubt="ask"``), whose
body appends ``{"tool", "key"}`` to COUNTER, prints ``IN_BODY`` and hangs until the parent
kills the process with SIGKILL. ``ROOT SID COUNTER resume``: opens the session, lists what is
pending (one JSON line ``{"status", "decisions"}``) and, once a decision is in, takes the step
up with bodies that return at once.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, Optional

from kerman import AgentLoop, FileStore, ModelReply, Tool


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


async def main(root: str, sid: str, counter: str, tool: str) -> None:
    store = FileStore(root, durability="strict")
    log = store.open(sid) if tool == "resume" else store.create(sid)

    async def model(request):
        if tool == "resume":
            return ModelReply("answered")
        return ModelReply([{"type": "tool-call", "id": "c1", "name": tool, "arguments": '{"n": 1}'}])

    loop = build(model, log, counter, None if tool == "resume" else asyncio.Event())
    if tool == "resume":
        loop.wake()
        await loop.when_idle()
        print(json.dumps({"status": loop.status, "decisions": [d.decision_id for d in loop.decisions]}), flush=True)
        await loop.aclose()
        return
    loop.followup("go")
    await loop.when_idle()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
