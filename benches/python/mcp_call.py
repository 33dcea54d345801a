"""An MCP tool call through Kerman against the same call made directly with the ``mcp`` client.

    python3 benches/python/mcp_call.py [--calls 200] [--reps 5]
    python3 benches/python/mcp_call.py --callgrind [--sizes 100,300]
    python3 benches/python/mcp_call.py --rounds [--calls 200]

The server is the tests' (``tests/python/mcp/mcp_server.py``) over stdio; the tool is ``add``.
Three figures, each per call and the best of ``--reps`` repetitions, interleaved (a loaded
host only adds time, and its load changes during a run):

* ``direct``: ``await client.call_tool("add", ...)`` on an ``mcp.Client``;
* ``loop+mcp``: one turn of an ``AgentLoop`` whose scripted model calls the server's ``add``
  once and then answers;
* ``loop+local``: the same turn with a local ``add`` tool: the loop's own cost (the model's two
  requests, the log appends) without MCP;
* ``loop+mcp -tasks``: ``loop+mcp`` with ``MCPServer(tasks=False)`` (the tasks extension not
  declared: the cost of declaring it, on a server that runs no tasks).

``through kerman`` is ``loop+mcp - loop+local``: what a call costs through Kerman beyond the
turn it sits in. The target is ``through kerman <= 1.1 x direct``. Prints a table and one JSON
line. Needs ``kerman[mcp]``.

``--callgrind`` counts the client process's instructions instead (valgrind's callgrind, each
way run at two numbers of calls, the difference per call; the server process is not counted):
the same for the same build whatever the host's load, where the wall clock of a stdio round
trip on a shared host varies by milliseconds.

``--rounds`` counts, in the client process, the asyncio event loop's rounds and the Python calls
per call each way (``_rounds.py``; no valgrind, a few seconds): what the wall clock pays for
beyond the instructions (each round is an ``epoll`` wait), with the same subtraction.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Coroutine, Dict, Tuple

import _callgrind
import _rounds
import kerman
from kerman.models import ScriptedModel

SERVER = str(Path(__file__).resolve().parents[2] / "tests" / "python" / "mcp" / "mcp_server.py")
CALL = kerman.ModelReply([{"type": "tool-call", "id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'}])


async def timed(calls: int, once: Callable[[], Coroutine[Any, Any, Any]]) -> Tuple[float, float]:
    """``calls`` calls of ``once``: (wall seconds, this process's CPU seconds) per call."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await once()
    return (time.perf_counter() - start) / calls, (time.process_time() - cpu) / calls


def loop_over(mcp: bool, tasks: bool = True) -> kerman.AgentLoop:
    from kerman.mcp import MCPServer

    model = ScriptedModel()
    if mcp:
        loop = kerman.AgentLoop(model, tools=[MCPServer.stdio(sys.executable, [SERVER], filter=["add"], tasks=tasks)])
    else:
        loop = kerman.AgentLoop(model)

        @loop.tool
        async def add(a: int, b: int) -> str:
            """Adds two integers."""
            return str(a + b)

    return loop


def turn_of(loop: kerman.AgentLoop) -> Callable[[], Coroutine[Any, Any, None]]:
    async def turn() -> None:
        loop._model.add(CALL, "done")  # type: ignore[attr-defined]
        loop.followup("go")
        await loop.when_idle()

    return turn


async def measure(calls: int, reps: int) -> Dict[str, float]:
    """The three figures, their repetitions interleaved so a host whose load changes during
    the run weighs on each alike; the best repetition of each."""
    from mcp import Client, StdioServerParameters

    with_mcp, local, no_tasks = loop_over(True), loop_over(False), loop_over(True, tasks=False)
    async with Client(StdioServerParameters(command=sys.executable, args=[SERVER]), cache=None) as client:
        runs = {
            "direct": lambda: client.call_tool("add", {"a": 1, "b": 2}),
            "loop+mcp": turn_of(with_mcp),
            "loop+local": turn_of(local),
            "loop+mcp -tasks": turn_of(no_tasks),
        }
        best = {name: float("inf") for name in runs}
        best.update({name + " cpu": float("inf") for name in runs})
        for once in runs.values():
            await once()  # warm up: the server started, the tools listed
        for _ in range(reps):
            for name, once in runs.items():
                wall, cpu = await timed(calls, once)
                best[name] = min(best[name], wall)
                best[name + " cpu"] = min(best[name + " cpu"], cpu)
    await with_mcp.aclose()
    await local.aclose()
    await no_tasks.aclose()
    return best


#: The ways ``--callgrind`` counts, by name.
WAYS = ("direct", "loop+mcp", "loop+local", "loop+mcp -tasks")


async def child(way: str, calls: int) -> None:
    """``--child WAY CALLS``: ``CALLS`` calls made ``WAY`` after a warm-up (under callgrind)."""
    if way == "direct":
        from mcp import Client, StdioServerParameters

        async with Client(StdioServerParameters(command=sys.executable, args=[SERVER]), cache=None) as client:
            for _ in range(calls + 1):
                await client.call_tool("add", {"a": 1, "b": 2})
        return
    loop = loop_over(way != "loop+local", tasks=not way.endswith("-tasks"))
    turn = turn_of(loop)
    for _ in range(calls + 1):
        await turn()
    await loop.aclose()


def callgrind(sizes: str) -> None:
    _callgrind.require_valgrind()
    small, large = (int(n) for n in sizes.split(","))
    per: Dict[str, float] = {}
    for way in WAYS:
        print(f"  {way}: callgrind at {small} and {large} calls...", file=sys.stderr, flush=True)
        per[way] = _callgrind.per_unit(__file__, ["--child", way], small, large)
    per["through kerman"] = per["loop+mcp"] - per["loop+local"]
    per["through kerman -tasks"] = per["loop+mcp -tasks"] - per["loop+local"]
    print("MCP tool call over stdio, client instructions per call (callgrind)")
    for name, value in per.items():
        print(f"  {name:<22}{value:>12,.0f}")
    ratio, no_tasks = per["through kerman"] / per["direct"], per["through kerman -tasks"] / per["direct"]
    print(f"  through kerman / direct: {ratio:.3f}x (target <= 1.10x); without the tasks extension: {no_tasks:.3f}x")
    figures = {"bench": "mcp_call_callgrind", "ratio": round(ratio, 4), "ratio_without_tasks": round(no_tasks, 4)}
    figures.update({name: round(value) for name, value in per.items()})
    print(json.dumps(figures))


async def counted(calls: int) -> None:
    """``--rounds``: event-loop rounds and Python calls per call, each way (``_rounds.py``)."""
    from mcp import Client, StdioServerParameters

    per: Dict[str, Tuple[float, float]] = {}
    async with Client(StdioServerParameters(command=sys.executable, args=[SERVER]), cache=None) as client:
        for way in WAYS:
            if way == "direct":
                loop = None
                once: Callable[[], Coroutine[Any, Any, Any]] = lambda: client.call_tool("add", {"a": 1, "b": 2})  # noqa: E731
            else:
                loop = loop_over(way != "loop+local", tasks=not way.endswith("-tasks"))
                once = turn_of(loop)
            await once()  # warm up: the server started, the tools listed
            per[way] = await _rounds.count(calls, once)
            if loop is not None:
                await loop.aclose()
    for name, way in (("through kerman", "loop+mcp"), ("through kerman -tasks", "loop+mcp -tasks")):
        per[name] = (per[way][0] - per["loop+local"][0], per[way][1] - per["loop+local"][1])
    print(f"MCP tool call over stdio, per call (mean of {calls}; the client process's main thread)")
    print(f"  {'':<22}{'loop rounds':>12}{'Python calls':>14}")
    for name, (rounds, py) in per.items():
        print(f"  {name:<22}{rounds:>12.2f}{py:>14.1f}")
    direct = per["direct"]
    through = per["through kerman"]
    print(f"  through kerman - direct: {through[0] - direct[0]:+.2f} rounds, {through[1] - direct[1]:+.1f} Python calls")
    figures: Dict[str, Any] = {"bench": "mcp_call_rounds"}
    for name, (rounds, py) in per.items():
        key = name.replace(" -", "_no_").replace(" ", "_").replace("+", "_")
        figures[key + "_rounds"] = round(rounds, 2)
        figures[key + "_python_calls"] = round(py, 1)
    print(json.dumps(figures))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true", help="count the client's instructions (valgrind) instead of timing")
    parser.add_argument("--sizes", default="100,300", help="with --callgrind: the two numbers of calls")
    parser.add_argument("--rounds", action="store_true", help="count event-loop rounds and Python calls per call instead of timing")
    args = parser.parse_args()
    if args.rounds:
        await counted(args.calls)
        return
    if args.callgrind:
        callgrind(args.sizes)
        return
    best = await measure(args.calls, args.reps)
    print(f"MCP tool call over stdio, per call (best of {args.reps} x {args.calls}, interleaved)")
    print(f"  {'':<16}{'wall':>10}{'client cpu':>14}")
    figures: Dict[str, Any] = {"bench": "mcp_call"}
    for kind in ("", " cpu"):
        best["through kerman" + kind] = best["loop+mcp" + kind] - best["loop+local" + kind]
        best["through kerman -tasks" + kind] = best["loop+mcp -tasks" + kind] - best["loop+local" + kind]
    for name in ("direct", "loop+mcp", "loop+mcp -tasks", "loop+local", "through kerman", "through kerman -tasks"):
        print(f"  {name:<16}{best[name] * 1e6:8.1f} us{best[name + ' cpu'] * 1e6:10.1f} us")
    for kind, label in (("", "wall"), (" cpu", "client cpu")):
        ratio = best["through kerman" + kind] / best["direct" + kind]
        figures[label.replace(" ", "_") + "_ratio"] = round(ratio, 3)
        print(f"  through kerman / direct ({label}): {ratio:.2f}x (target <= 1.10x)")
        no_tasks_ratio = best["through kerman -tasks" + kind] / best["direct" + kind]
        figures[label.replace(" ", "_") + "_ratio_without_tasks"] = round(no_tasks_ratio, 3)
        print(f"  without the tasks extension ({label}): {no_tasks_ratio:.2f}x")
    key = {name: name.replace(" -", "_no_").replace(" ", "_").replace("+", "_") + "_us" for name in best}
    figures.update({key[name]: round(value * 1e6, 1) for name, value in best.items()})
    print(json.dumps(figures))


if __name__ == "__main__":
    try:
        import mcp  # noqa: F401
    except ImportError:
        print('mcp_call: skipped, the mcp package is not installed (pip install "kerman[mcp]")')
        sys.exit(0)
    if sys.argv[1:2] == ["--child"]:
        asyncio.run(child(sys.argv[2], int(sys.argv[3])))
    else:
        asyncio.run(main())
