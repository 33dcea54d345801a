"""A process of its own over a file-store session, for test_processes.py.

``ask ROOT SID COUNTER (close|hang)``: a turn whose ``pay`` call needs approval; once it waits,
prints the pending decision id, then closes the loop (``close``) or waits to be killed
(``hang``). ``decide ROOT SID COUNTER DECISION_ID ARGS_JSON|approve``: reopens the session,
decides, waits for the turn, and prints a JSON summary. ``pay`` appends its arguments to
COUNTER each time it runs; the model counts its requests.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, List

import kerman
from kerman import AgentLoop, Approve, Edit, FileStore, ModelReply


def build(log: kerman.SessionLog, counter: str, requests: List[Any], first: bool) -> AgentLoop:
    async def model(request: kerman.ModelRequest) -> Any:
        requests.append([m.role for m in request.messages])
        if first and len(requests) == 1:
            return ModelReply([{"type": "tool-call", "id": "c1", "name": "pay", "arguments": '{"amount": 5}'}])
        return ModelReply("done")

    loop = AgentLoop(model, log=log)

    @loop.tool(needs_approval=True)
    async def pay(amount: int) -> str:
        """Pays."""
        with open(counter, "a") as f:
            f.write(json.dumps({"amount": amount}) + "\n")
        return "paid"

    return loop


async def ask(root: str, sid: str, counter: str, how: str) -> None:
    store = FileStore(root, durability="none")
    log = store.create(sid)
    loop = build(log, counter, [], True)
    loop.followup("pay bob")
    await loop.when_idle()
    assert loop.status == "waiting", loop.status
    await log.flush()
    print(loop.decisions[0].decision_id, flush=True)
    if how == "hang":
        await asyncio.Event().wait()
    await loop.aclose()
    log.close()


async def decide(root: str, sid: str, counter: str, decision_id: str, how: str) -> None:
    store = FileStore(root, durability="none")
    with store.open(sid) as log:
        requests: List[Any] = []
        loop = build(log, counter, requests, False)
        before = [(p.decision_id, loop.status) for p in loop.decisions]
        outcome = Approve() if how == "approve" else Edit(json.loads(how))
        loop.decide(decision_id, outcome, by="test", key="k")
        await loop.when_idle()
        ends = [e.data["reason"]["kind"] for e in log.events() if e.type == "turn/end"]
        print(json.dumps({"before": before, "requests": requests, "ends": ends, "status": loop.status}), flush=True)
        await loop.aclose()


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    asyncio.run(ask(*args) if mode == "ask" else decide(*args))
