"""The processes of test_continuation.py (crashed turns are answered). Not a test module.

Usage: ``python continuation_child.py MODE SPEC_JSON``. SPEC holds the store (``file`` with
``root``, or ``postgres`` with ``dsn``), the ``session``, the ``effects`` file, ``resume``
(``AgentLoop(resume=...)``: ``continue``, ``close`` or ``null`` for the default) and ``block``,
where this process stops and waits for the parent, which SIGKILLs it:

- ``model``: every model call prints ``BLOCKED model`` and blocks;
- ``tool``: the model asks for ``pay`` (a ``write`` tool, policy ``fail``) while the history has
  no tool result; its body appends to the effects file, prints ``BLOCKED tool`` and blocks;
- ``between``: the model asks for ``look`` (a ``read`` tool) while the history has no tool
  result; a ``pre_step`` listener prints ``BLOCKED between`` at step 2 and blocks (step 1 ended,
  step 2 not begun);
- ``stopping``: a ``turn_stopping`` hook prints ``BLOCKED stopping`` and blocks (the answer is
  logged, ``turn/end`` is not);
- ``concluded``: the model asks for ``finish`` (a tool whose result concludes the turn) while the
  history has no tool result; the ``turn_stopping`` hook prints ``BLOCKED concluded`` and blocks
  (the concluding result is logged, ``turn/end`` is not);
- ``none``: nothing blocks; the model answers ``answer`` once the history holds a tool result
  or when no tool is asked for.

Blocking is a read of this process's stdin, a pipe the parent holds and never writes to.

Modes: ``run TEXT`` creates the session and sends TEXT as a followup, then waits for the loop
to go idle and prints ``done``; ``resume`` opens the session (over PostgreSQL once a killed
owner's lease has lapsed), wakes the loop and prints ``done`` once it is idle; ``work`` runs a
``kerman.Worker`` (its factory builds the loop without ``resume=`` unless SPEC says) until the
session was released, then prints ``done``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any, Dict, List

import kerman
from kerman import AgentLoop, ModelReply

LEASE_TTL = 1.0


def record(spec: Dict[str, Any], line: Dict[str, Any]) -> None:
    with open(spec["effects"], "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


async def block(where: str) -> None:
    print(f"BLOCKED {where}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    raise SystemExit("the parent wrote to stdin: it should have killed this process")


def make_store(spec: Dict[str, Any]) -> Any:
    if spec["store"] == "file":
        return kerman.FileStore(spec["root"], durability="strict")
    return kerman.PostgresStore(spec["dsn"], lease_ttl=LEASE_TTL)


def build(spec: Dict[str, Any], log: kerman.SessionLog) -> AgentLoop:
    where = spec["block"]

    async def model(request: kerman.ModelRequest) -> Any:
        record(spec, {"model": True, "turn": request.turn, "step": request.step, "pid": os.getpid()})
        if where == "model":
            await block("model")
        has_result = any(isinstance(b, dict) and b.get("type") == "tool-result" for m in request.messages for b in m.content)
        if where in ("tool", "between", "concluded") and not has_result:
            name = {"tool": "pay", "between": "look", "concluded": "finish"}[where]
            return ModelReply([{"type": "tool-call", "id": f"c{request.turn}", "name": name, "arguments": "{}"}])
        return ModelReply("answer")

    options: Dict[str, Any] = {} if spec.get("resume") is None else {"resume": spec["resume"]}
    loop = AgentLoop(model, log=log, **options)

    @loop.tool
    async def pay(args: Dict[str, Any], ctx: kerman.ToolContext) -> str:
        """Pays (a write)."""
        record(spec, {"tool": "pay", "call": ctx.call_id, "turn": ctx.turn, "pid": os.getpid()})
        if where == "tool":
            await block("tool")
        return "paid"

    @loop.tool(effect="read")
    async def look(args: Dict[str, Any], ctx: kerman.ToolContext) -> str:
        """Looks (a read)."""
        record(spec, {"tool": "look", "call": ctx.call_id, "turn": ctx.turn, "pid": os.getpid()})
        return "seen"

    @loop.tool
    async def finish(args: Dict[str, Any], ctx: kerman.ToolContext) -> kerman.ToolResult:
        """Finishes the turn with its result."""
        record(spec, {"tool": "finish", "call": ctx.call_id, "turn": ctx.turn, "pid": os.getpid()})
        return kerman.ToolResult("finished", concludes_turn=True)

    @loop.pre_step
    async def stop_between(step: Any, next: Any) -> Any:
        if where == "between" and step.step == 2:
            await block("between")
        return await next()

    @loop.turn_stopping
    async def stop_at_the_end(stop: Any) -> None:
        if where in ("stopping", "concluded"):
            # The answer (or the concluding result) is durable before the kill: nothing flushes
            # between the last step and these hooks.
            await log.flush()
            await block(where)

    return loop


def open_when_free(store: Any, session: str, limit: float = 30.0) -> kerman.SessionLog:
    deadline = time.monotonic() + limit
    while True:
        try:
            return store.open(session)
        except kerman.SessionLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)  # pacing the poll of a lapsing lease, not synchronisation


async def run(spec: Dict[str, Any], text: str) -> None:
    store = make_store(spec)
    log = store.create(spec["session"])
    loop = build(spec, log)
    loop.followup(text)
    await loop.when_idle()
    await loop.aclose()
    await log.aclose()
    print("done", flush=True)


async def resume(spec: Dict[str, Any]) -> None:
    store = make_store(spec)
    log = open_when_free(store, spec["session"]) if spec["store"] == "postgres" else store.open(spec["session"])
    loop = build(spec, log)
    print(f"resume {loop.resume}", flush=True)
    loop.wake()
    await loop.when_idle()
    await loop.aclose()
    await log.aclose()
    print("done", flush=True)


async def work(spec: Dict[str, Any]) -> None:
    """A Worker takes the session (once the killed owner's lease lapsed, or for staged input)
    and runs it; once it has let the session go, this process stops it and ends."""
    store = make_store(spec)
    taken: List[AgentLoop] = []

    def factory(log: kerman.SessionLog) -> AgentLoop:
        agent = build(spec, log)
        taken.append(agent)
        return agent

    worker = kerman.Worker(store, factory, idle_timeout=0.2, sweep_interval=0.1)
    serving = asyncio.ensure_future(worker.run())
    try:
        while not (taken and spec["session"] not in worker.sessions):
            await asyncio.sleep(0.05)  # polling the worker's sessions: a release has no event
    finally:
        worker.stop()
        await serving
    print(json.dumps(worker.stats, sort_keys=True), flush=True)
    print("done", flush=True)


def main(argv: List[str]) -> None:
    mode, spec_json, *rest = argv
    spec = json.loads(spec_json)
    if mode == "run":
        asyncio.run(run(spec, rest[0]))
    elif mode == "resume":
        asyncio.run(resume(spec))
    elif mode == "work":
        asyncio.run(work(spec))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
