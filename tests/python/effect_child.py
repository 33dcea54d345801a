"""The processes of the effect-class kill matrix (``effects/effect_harness.py``). Not a test
module.

Usage: ``python effect_child.py MODE SPEC_JSON [ARG]``; SPEC_JSON is the store's location and
the tools (``effect_harness.Place.spec``), each ``{"name", "effect", "policy"}`` with policy
``fail``, ``retry`` or ``reconcile``.

- ``run KILL``: creates the session and runs one turn whose first step calls every tool. KILL is
  ``-1`` (no kill: prints ``done`` when the turn has ended), an event seq ``K`` (SIGKILL right
  after event ``K`` is durable: nothing after it is ever appended), ``body:TOOL`` (SIGKILL
  inside TOOL's body, once its side effect is recorded: the call is in doubt) or
  ``stop:TOOL`` (inside TOOL's body, prints ``IN_BODY`` and waits for SIGCONT: the parent
  SIGSTOPs it until another owner has taken the session, then continues it; it then prints
  ``fenced`` or ``done`` when its loop is idle).
- ``resume``: opens the session (once a killed owner's PostgreSQL lease has lapsed) and
  resumes it with an ``AgentLoop`` and the same tools and model; prints ``done``.
- ``work``: a ``kerman.Worker`` takes the session (its dead owner's lease lapses) and runs it;
  prints ``done`` once the worker let it go.

Every tool body appends ``{"tool", "call", "key", "turn", "pid"}`` to the effects file before
anything else (the side effect). A reconcile function looks for its call's key in that file:
found, the call's result is ``reconciled <tool>``; not found, ``None`` (the call fails). The
model asks for every tool in step 1 of a turn and answers ``done`` once it has a tool result.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import kerman
from kerman import AgentLoop, ModelReply, Tool

sys.path.insert(0, str(Path(__file__).parent))
from kill_child import arm, make_store, open_when_free  # noqa: E402

WORKER_IDLE = 1.0  # seconds a Worker keeps a session that has nothing to do


def record(spec: Dict[str, Any], line: Dict[str, Any]) -> None:
    with open(spec["effects"], "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def recorded_keys(spec: Dict[str, Any]) -> List[str]:
    path = Path(spec["effects"])
    if not path.exists():
        return []
    return [json.loads(line).get("key", "") for line in path.read_text().splitlines()]


def build(spec: Dict[str, Any], log: kerman.SessionLog, kill: str = "") -> AgentLoop:
    calls = [{"type": "tool-call", "id": f"c{i + 1}", "name": t["name"], "arguments": "{}"} for i, t in enumerate(spec["tools"])]

    async def model(request: kerman.ModelRequest) -> Any:
        record(spec, {"model": True, "turn": request.turn, "step": request.step, "pid": os.getpid()})
        if any(isinstance(b, dict) and b.get("type") == "tool-result" for m in request.messages for b in m.content):
            return ModelReply("done")
        return ModelReply(calls)

    how, _, target = kill.partition(":")
    loop = AgentLoop(model, log=log, resume="continue")
    for tool in spec["tools"]:

        def body(name: str) -> Any:
            async def run(args: Dict[str, Any], ctx: kerman.ToolContext) -> str:
                record(spec, {"tool": name, "call": ctx.call_id, "key": ctx.idempotency_key, "turn": ctx.turn, "pid": os.getpid()})
                if name == target and how == "body":
                    os.kill(os.getpid(), signal.SIGKILL)
                if name == target and how == "stop":
                    continued = asyncio.Event()
                    asyncio.get_running_loop().add_signal_handler(signal.SIGCONT, continued.set)
                    print("IN_BODY", flush=True)
                    await continued.wait()
                return f"{name} ran"

            return run

        def reconcile(name: str) -> Any:
            def look(ctx: Any) -> Optional[str]:
                return f"reconciled {name}" if ctx.idempotency_key in recorded_keys(spec) else None

            return look

        policy: Any = reconcile(tool["name"]) if tool["policy"] == "reconcile" else tool["policy"]
        loop.tool(Tool(tool["name"], body(tool["name"]), effect=tool["effect"], on_in_doubt=policy))
    return loop


async def run(spec: Dict[str, Any], kill: str) -> None:
    store = make_store(spec)
    log = store.create(spec["session"])
    if kill.lstrip("-").isdigit() and int(kill) >= 0:
        arm(log, int(kill))
    loop = build(spec, log, kill)
    fenced: List[Any] = []
    loop.on("agent/error", lambda e: fenced.append(e) if (e.error or {}).get("code") == "FENCED" else None)
    loop.followup("run the tools")
    await loop.when_idle()
    await loop.aclose()
    try:
        await log.aclose()
    except kerman.LogError:
        if not fenced:
            raise
    print("fenced" if fenced else "done", flush=True)


async def resume(spec: Dict[str, Any]) -> None:
    store = make_store(spec)
    log = open_when_free(store, spec["session"]) if spec["store"] == "postgres" else store.open(spec["session"])
    loop = build(spec, log)
    loop.wake()
    await loop.when_idle()
    await loop.aclose()
    await log.aclose()
    print("done", flush=True)


async def work(spec: Dict[str, Any]) -> None:
    """A Worker takes the session once its dead owner's lease lapses, runs it, and lets it go
    when idle; then it stops."""
    store = make_store(spec)
    taken = asyncio.Event()

    def factory(log: kerman.SessionLog) -> AgentLoop:
        taken.set()
        return build(spec, log)

    worker = kerman.Worker(store, factory, idle_timeout=WORKER_IDLE, sweep_interval=0.2)
    serving = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait_for(taken.wait(), 60)
        print("took", flush=True)
        while spec["session"] in worker.sessions:
            await asyncio.sleep(0.05)  # pacing a poll of the worker's sessions (a release has no event)
    finally:
        worker.stop()
        await serving
    print("done", flush=True)


def main(argv: List[str]) -> None:
    mode, spec_json, *rest = argv
    spec = json.loads(spec_json)
    if mode == "run":
        asyncio.run(run(spec, rest[0] if rest else "-1"))
    elif mode == "resume":
        asyncio.run(resume(spec))
    elif mode == "work":
        asyncio.run(work(spec))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
