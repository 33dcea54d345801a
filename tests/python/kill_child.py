"""The processes of the kill matrix (``kill_harness.py``). Not a test module.

Usage: ``python kill_child.py MODE SPEC_JSON [ARG]``, where SPEC_JSON is a
:class:`kill_harness.Scenario` with its store's location (``Scenario.to_json``).

- ``run K``: creates the session and runs one turn whose first step calls every tool of the
  scenario, deciding each request in this process (``loop.decide``) as the scenario says. With
  ``K >= 0`` a log observer, right after event ``K`` commits, waits until it is durable and
  SIGKILLs this process: nothing after event ``K`` is ever appended. Without a kill it prints
  ``done`` when the turn has ended.
- ``resume HOW``: opens the session (once a killed owner's PostgreSQL lease has lapsed) and
  takes it as far as it can with the same tools and model, printing ``waiting <decision ids>``
  whenever the turn waits. ``HOW`` is ``decide`` (the requests are decided here with
  ``loop.decide``), ``wait`` (another process decides through the store; this process, the
  owner, applies it and goes on) or ``wake`` (the process closes the session and ends once
  the turn waits: another process decides with ``FileStore.decide`` and opens it again).
  Prints ``done`` at the end.
- ``work``: a ``kerman.Worker`` (PostgreSQL) owns the session instead of a loop built here;
  it says ``waiting <decision ids>`` as ``resume wait`` does, and ``done`` once nothing is left.
- ``decide DECISION_ID TOOL``: decides one request (about a call of ``TOOL``) through the store (``FileStore.decide`` on a
  session nobody holds, ``PostgresStore.decide`` through its owner); prints the answer as JSON.

Every tool body appends one JSON line to the scenario's effects file before returning: the
tool, the call id, the arguments it got, this process's id and the log's length when it
started (so a reader can tell what the log held before the body ran). Every model request
appends a line too (turn, step). The model asks for every tool in step 1 of a turn and
answers ``done`` once the history holds a tool result.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import kerman
from kerman import AgentLoop, Approve, Deny, Edit, ModelReply

LEASE_TTL = 1.0  # seconds: a killed PostgreSQL owner's lease lapses about this long after it died
WORKER_IDLE = 1.0  # seconds a Worker keeps a session that has nothing to do


def record(spec: Dict[str, Any], line: Dict[str, Any]) -> None:
    with open(spec["effects"], "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def make_store(spec: Dict[str, Any]) -> Any:
    if spec["store"] == "file":
        return kerman.FileStore(spec["root"], durability=spec["durability"])
    return kerman.PostgresStore(spec["dsn"], lease_ttl=LEASE_TTL)


def outcome_of(tool: Dict[str, Any]) -> Any:
    how = tool["decision"]
    if how == "approve":
        return Approve()
    if how == "edit":
        return Edit(tool["edit"])
    if how == "deny":
        return Deny(f"{tool['name']} is not allowed")
    raise ValueError(f"unknown decision {how!r} for tool {tool['name']!r}")


def build(spec: Dict[str, Any], log: kerman.SessionLog) -> AgentLoop:
    calls = [{"type": "tool-call", "id": f"c{i + 1}", "name": t["name"], "arguments": t["arguments"]} for i, t in enumerate(spec["tools"])]

    async def model(request: kerman.ModelRequest) -> Any:
        record(spec, {"model": True, "turn": request.turn, "step": request.step, "pid": os.getpid()})
        if any(isinstance(b, dict) and b.get("type") == "tool-result" for m in request.messages for b in m.content):
            return ModelReply("done")
        return ModelReply(calls)

    loop = AgentLoop(model, log=log)
    for tool in spec["tools"]:

        def body(name: str) -> Any:
            async def run(args: Dict[str, Any], ctx: kerman.ToolContext) -> str:
                seen = len(log)
                record(spec, {"tool": name, "call": ctx.call_id, "turn": ctx.turn, "args": args, "seen": seen, "pid": os.getpid()})
                return f"{name} ran"

            run.__name__ = name
            run.__doc__ = f"The kill matrix's {name}."
            return run

        loop.tool(body(tool["name"]), needs_approval=tool["needs_approval"], **tool.get("options", {}))
    return loop


def decide_pending(spec: Dict[str, Any], loop: AgentLoop) -> None:
    by_name = {t["name"]: t for t in spec["tools"]}
    for pending in loop.decisions:
        loop.decide(pending.decision_id, outcome_of(by_name[pending.name]), by="kill-matrix", key=f"key-{pending.decision_id}")


def wait_durable(log: kerman.SessionLog) -> None:
    """Blocks this thread until everything appended is durable: the flush is awaited on an event
    loop of another thread (the observer that calls this runs on the loop's own thread)."""
    failed: List[BaseException] = []

    def flush() -> None:
        async def barrier() -> None:
            await log.flush()

        try:
            asyncio.run(barrier())
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)

    t = threading.Thread(target=flush)
    t.start()
    t.join()
    if failed:
        raise failed[0]


def arm(log: kerman.SessionLog, kill_after: int) -> None:
    def observe(ev: kerman.Event) -> None:
        if ev.seq == kill_after:
            wait_durable(log)
            os.kill(os.getpid(), signal.SIGKILL)

    log.subscribe(observe)


async def settle(loop: AgentLoop, log: kerman.SessionLog, spec: Dict[str, Any], how: str) -> None:
    """Runs the session until no turn is open and nothing is pending. A request is decided
    here (``decide``), or by another process through the store: while this process owns the
    session (``wait``: it says which requests wait and applies what the store hands it), or
    while nobody does (``wake``: it says which wait and returns, to be opened again)."""
    while True:
        await loop.when_idle()
        if loop.status == "waiting":
            ids = [p.decision_id for p in loop.decisions]
            await log.flush()  # the requests are durable before another process reads them
            print("waiting " + " ".join(ids), flush=True)
            if how == "decide":
                decide_pending(spec, loop)
            elif how == "wait":
                await resolved_elsewhere(log, ids)
            else:
                return
            continue
        if loop.wake():
            continue
        return


async def resolved_elsewhere(log: kerman.SessionLog, ids: List[str]) -> None:
    """Waits until every request in ``ids`` is resolved and the step has gone on (the owner
    appended something after the last resolution)."""
    unresolved = set(ids)
    async for ev in log.tail(len(log)):
        if ev.type == "decision/resolved":
            unresolved.discard(ev.data["decisionId"])
        elif not unresolved:
            return


async def run(spec: Dict[str, Any], kill_after: int) -> None:
    store = make_store(spec)
    log = store.create(spec["session"])
    if kill_after >= 0:
        arm(log, kill_after)
    loop = build(spec, log)
    loop.followup("run the tools")
    await settle(loop, log, spec, "decide")
    await loop.aclose()
    await log.aclose()
    print("done", flush=True)


def open_when_free(store: Any, session: str, limit: float = 30.0) -> kerman.SessionLog:
    """Opens the session once a killed owner's lease has lapsed (polling the database)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return store.open(session)
        except kerman.SessionLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)  # pacing the poll, not synchronisation


async def resume(spec: Dict[str, Any], how: str) -> None:
    store = make_store(spec)
    log = open_when_free(store, spec["session"]) if spec["store"] == "postgres" else store.open(spec["session"])
    loop = build(spec, log)
    await settle(loop, log, spec, how)
    await loop.aclose()
    await log.aclose()
    print("done", flush=True)


async def work(spec: Dict[str, Any]) -> None:
    """A ``kerman.Worker`` over the PostgreSQL store takes the session (a killed owner's lease
    lapses; a staged decision makes it takeable) and runs it with the same tools and model,
    saying ``waiting <decision ids>`` when its loop waits. The worker releases the session once
    it has nothing left to do (after ``WORKER_IDLE``); then the log must hold no open turn, no
    pending request and no pending input, and the worker stops."""
    store = make_store(spec)
    agents: List[AgentLoop] = []
    changed = asyncio.Event()

    def factory(log: kerman.SessionLog) -> AgentLoop:
        agent = build(spec, log)
        agents.append(agent)
        agent.on("agent/status", lambda _: changed.set())
        changed.set()
        return agent

    worker = kerman.Worker(store, factory, idle_timeout=WORKER_IDLE)
    serving = asyncio.ensure_future(worker.run())
    said: List[str] = []
    try:
        while True:
            try:
                await asyncio.wait_for(changed.wait(), 0.1)
            except asyncio.TimeoutError:
                pass  # a release has no event: the worker's sessions are polled
            changed.clear()
            if not agents:
                continue
            if agents[-1].status == "waiting":
                ids = [p.decision_id for p in agents[-1].decisions]
                if not set(ids) <= set(said):  # a new round (what was said is being decided)
                    await agents[-1].log.flush()  # the requests are in the table before anyone reads it
                    print("waiting " + " ".join(ids), flush=True)
                    said += ids
                continue
            if spec["session"] in worker.sessions:
                continue
            with kerman.PostgresStore(spec["dsn"]).follow(spec["session"]) as log:
                starts = len(list(log.events(types=["turn/start"])))
                ends = len(list(log.events(types=["turn/end"])))
                pending = kerman.decisions.pending(log)
                queued = len(kerman.InboxProjection.fold(log.splices()))
            if starts != ends or pending or queued:
                raise AssertionError(f"the worker released the session with work left: {starts} turns, {ends} ended, {pending}, {queued}")
            break
    finally:
        worker.stop()
        await serving
    print("done", flush=True)


def decide(spec: Dict[str, Any], decision_id: str, name: str) -> None:
    store = make_store(spec)
    tool = {t["name"]: t for t in spec["tools"]}[name]
    answer = store.decide(spec["session"], decision_id, outcome_of(tool), by="other-process", key=f"key-{decision_id}")
    print(json.dumps(answer, sort_keys=True), flush=True)


def main(argv: List[str]) -> None:
    mode, spec_json, *rest = argv
    spec = json.loads(spec_json)
    arg: Optional[str] = rest[0] if rest else None
    if mode == "run":
        asyncio.run(run(spec, int(arg if arg is not None else -1)))
    elif mode == "resume":
        asyncio.run(resume(spec, arg or "decide"))
    elif mode == "work":
        asyncio.run(work(spec))
    elif mode == "decide":
        decide(spec, rest[0], rest[1])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
