#!/usr/bin/env python3
"""What tool approvals cost (docs/decisions.md), for ``make bench`` (bench.py's GATE and DECIDE
rows) or on their own:

    python3 benches/python/decisions_bench.py [--quick]

- **gate**: P4's turn (one tool call per turn, bench.py) with an approving ``before_tool`` gate
  (``return await next()``) against the same turn without one, interleaved repetition by
  repetition; the gate's cost per turn as a share of P4's turn time (target ≤ 10%).
- **decide → tool start**: from ``loop.decide(...)`` (or ``store.decide(...)`` in another
  process) to the first line of the tool body: in one process over a memory store and a file
  store (``checkpoint``: the loop syncs before the body); across processes with
  ``PostgresStore.decide`` while an ``AgentLoop`` owns the session and waits (the owner
  applies it); and with ``FileStore.decide`` on a session nobody holds, which the next process
  then opens and resumes. Times are ``CLOCK_MONOTONIC``, one clock for every process here.

Prints one JSON object per measure on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import kerman
from kerman import AgentLoop, Approve, ModelReply

now_ns = time.monotonic_ns  # CLOCK_MONOTONIC: comparable between processes of one machine
CALL = ModelReply([{"type": "tool-call", "id": "call-1", "name": "git_log", "arguments": '{"n": 1}'}])
TEXT = ModelReply("The last commit adds group commit to the writer thread.")


async def _model(request: Any) -> Any:
    return CALL if request.step == 1 else TEXT


# ---- the gate's cost per turn ------------------------------------------------------------------


def _p4_loop(gated: bool) -> AgentLoop:
    loop = AgentLoop(_model)

    @loop.tool
    async def git_log(args: Dict[str, Any], ctx: Any) -> str:
        """Reads the log."""
        return "commit 4f1c2e: add group commit"

    if gated:

        @loop.before_tool
        async def gate(call: Any, next: Any) -> Any:
            return await next()

    return loop


async def _turns(gated: bool, sessions: int, turns: int, burst: int = 50) -> float:
    """Turns per second, as bench.py's P4 measures them."""
    loops = [_p4_loop(gated) for _ in range(sessions)]
    t0 = time.perf_counter_ns()
    for loop in loops:
        for _ in range(turns // burst):
            for _ in range(burst):
                loop.followup("What changed in the last commit?")
            await loop.when_idle()
    dt = time.perf_counter_ns() - t0
    for loop in loops:
        assert loop.turn == turns and loop.log[-1].data["reason"] == {"kind": "completed"}, loop.log[-1].to_json()
    return sessions * turns / (dt / 1e9)


def gate_cost(reps: int, sessions: int = 30, turns: int = 100) -> Dict[str, float]:
    """Median turns/s without and with an approving gate, interleaved (the order alternates)."""
    plain: List[float] = []
    gated: List[float] = []
    for r in range(reps):
        for g in (False, True) if r % 2 == 0 else (True, False):
            gc.collect()
            (gated if g else plain).append(asyncio.run(_turns(g, sessions, turns)))
    p, g = statistics.median(plain), statistics.median(gated)
    per_turn_ns = 1e9 / g - 1e9 / p
    return {"plain_turns_s": p, "gated_turns_s": g, "gate_ns_per_turn": per_turn_ns, "share_of_p4_turn": per_turn_ns / (1e9 / p)}


# ---- decide -> tool start ----------------------------------------------------------------------


def _approval_loop(log: Optional[kerman.SessionLog], started: List[int], on_start: Optional[Callable[[], None]] = None) -> AgentLoop:
    loop = AgentLoop(_model, log=log)

    @loop.tool(needs_approval=True)
    async def git_log(args: Dict[str, Any], ctx: Any) -> str:
        """Reads the log."""
        started.append(now_ns())
        if on_start is not None:
            on_start()
        return "commit 4f1c2e: add group commit"

    return loop


async def _in_process(n: int, log_factory: Callable[[], Optional[kerman.SessionLog]]) -> List[int]:
    log = log_factory()
    started: List[int] = []
    loop = _approval_loop(log, started)
    samples = []
    for _ in range(n):
        loop.followup("What changed in the last commit?")
        await loop.when_idle()
        assert loop.status == "waiting", loop.status
        [pending] = loop.decisions
        t0 = now_ns()
        loop.decide(pending.decision_id, Approve())
        await loop.when_idle()
        samples.append(started[-1] - t0)
    await loop.aclose()
    if log is not None:
        await log.aclose()
    return samples


def decider(kind: str, where: str) -> None:
    """A process of its own that decides through the store: reads ``SESSION DECISION_ID``
    lines, answers ``T0 T_RETURNED`` (monotonic ns) after each ``store.decide``."""
    store: Any = kerman.PostgresStore(where) if kind == "postgres" else kerman.FileStore(where)
    print("ready", flush=True)
    for line in sys.stdin:
        session, decision_id = line.split()
        t0 = now_ns()
        answer = store.decide(session, decision_id, Approve(), key=decision_id)
        t1 = now_ns()
        assert answer.get("applied") is True, answer
        print(t0, t1, flush=True)


def _spawn_decider(kind: str, where: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--decider", kind, where], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


async def _postgres_cross(n: int, dsn: str) -> Dict[str, List[int]]:
    """An AgentLoop owns the session and waits; another process decides with PostgresStore.decide."""
    store = kerman.PostgresStore(dsn)
    log = store.create(f"bench-decide-{uuid.uuid4()}")
    started: List[int] = []
    ran = asyncio.Event()
    aio = asyncio.get_running_loop()
    loop = _approval_loop(log, started, ran.set)
    proc = _spawn_decider("postgres", dsn)
    assert proc.stdin is not None and proc.stdout is not None
    tool: List[int] = []
    call: List[int] = []
    try:
        for _ in range(n):
            ran.clear()
            loop.followup("What changed in the last commit?")
            await loop.when_idle()
            [pending] = loop.decisions
            proc.stdin.write(f"{log.id} {pending.decision_id}\n")
            proc.stdin.flush()
            await ran.wait()
            t0, t_ret = map(int, (await aio.run_in_executor(None, proc.stdout.readline)).split())
            await loop.when_idle()
            assert loop.status == "idle", loop.status
            tool.append(started[-1] - t0)
            call.append(t_ret - t0)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    await loop.aclose()
    await log.aclose()
    return {"tool": tool, "call": call}


async def _file_cross(n: int, root: str) -> Dict[str, List[int]]:
    """Each turn waits and its loop closes; another process decides with FileStore.decide; this
    process then opens the session again and the call runs at the new loop's wake()."""
    store = kerman.FileStore(root)
    session = f"bench-decide-{uuid.uuid4()}"
    store.create(session).close()
    proc = _spawn_decider("file", root)
    assert proc.stdin is not None and proc.stdout is not None
    tool: List[int] = []
    call: List[int] = []
    try:
        for _ in range(n):
            started: List[int] = []
            log = store.open(session)
            loop = _approval_loop(log, started)
            loop.followup("What changed in the last commit?")
            await loop.when_idle()
            [pending] = loop.decisions
            await loop.aclose()
            await log.aclose()
            proc.stdin.write(f"{session} {pending.decision_id}\n")
            proc.stdin.flush()
            t0, t_ret = map(int, proc.stdout.readline().split())
            log = store.open(session)
            loop = _approval_loop(log, started)
            loop.wake()
            await loop.when_idle()
            assert loop.status == "idle" and started, loop.status
            tool.append(started[-1] - t0)
            call.append(t_ret - t0)
            await loop.aclose()
            await log.aclose()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    return {"tool": tool, "call": call}


def _summary(samples: List[int]) -> Dict[str, float]:
    s = sorted(samples)
    return {"n": len(s), "p50_us": s[len(s) // 2] / 1000, "p99_us": s[min(len(s) - 1, int(0.99 * len(s)))] / 1000}


def decide_latency(n: int, workdir: str, dsn: Optional[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    out["memory"] = _summary(asyncio.run(_in_process(n, lambda: None)))
    out["file"] = _summary(asyncio.run(_in_process(n, lambda: kerman.FileStore(os.path.join(workdir, "in")).create())))
    cross = asyncio.run(_file_cross(n, os.path.join(workdir, "cross")))
    out["file_cross"] = {"tool": _summary(cross["tool"]), "decide_call": _summary(cross["call"])}
    if dsn:
        pg = asyncio.run(_postgres_cross(n, dsn))
        out["postgres_cross"] = {"tool": _summary(pg["tool"]), "decide_call": _summary(pg["call"])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--decider", nargs=2, metavar=("KIND", "WHERE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.decider:
        decider(*args.decider)
        return
    with tempfile.TemporaryDirectory() as workdir:
        result = {
            "gate": gate_cost(5 if args.quick else 11, sessions=10 if args.quick else 30),
            "decide": decide_latency(30 if args.quick else 200, workdir, os.environ.get("KERMAN_PG_DSN")),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
