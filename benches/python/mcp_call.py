"""An MCP tool call through Kerman against the same call made directly with the ``mcp`` client.

    python3 benches/python/mcp_call.py [--calls 100] [--reps 9]
    python3 benches/python/mcp_call.py --callgrind [--cache] [--sizes 100,300]
    python3 benches/python/mcp_call.py --rounds [--calls 200]

The server is the tests' (``tests/python/mcp/mcp_server.py``) over stdio; the tool is ``add``.
Five ways, each timed per call over ``--calls`` calls, in ``--reps`` repetitions interleaved
(each repetition runs every way once, in an order rotated from one repetition to the next):

* ``direct``: ``await client.call_tool("add", ...)`` on an ``mcp.Client``;
* ``loop+client``: one turn of an ``AgentLoop`` whose scripted model calls a local ``add`` tool
  that makes the ``direct`` call and then answers: the turn around the same call;
* ``loop+mcp``: the same turn with the server's ``add`` through ``MCPServer``;
* ``loop+mcp -tasks``: ``loop+mcp`` with ``MCPServer(tasks=False)`` (the tasks extension not
  declared: the cost of declaring it, on a server that runs no tasks);
* ``loop+local``: the turn with a local ``add`` that returns at once: the turn alone.

``through kerman`` is ``direct + loop+mcp - loop+client``: the call through Kerman less the
turn it sits in, where the turn is measured around the same wait on the server (``loop+client
- direct``, the ``turn in context`` row). The turn alone (``loop+local``) is not subtracted: it
runs with nothing between its steps, hot in the caches, while around a call its steps run
after the client's ``mcp`` code and the wait on the pipe, and cost several times as much
(``--callgrind --cache`` counts it; docs/performance.md). The target is ``through kerman <=
1.1 x direct``: the ratio printed is the median over the repetitions of each repetition's own
ratio (the ways of one repetition share the host's load; a difference of two minima taken
from different repetitions is not the difference of anything measured together). The best
repetition of each way is printed too, and the derived rows of those bests, for comparison.
Prints a table and one JSON line. Needs ``kerman[mcp]``.

``--callgrind`` counts the client process's instructions instead (valgrind's callgrind, each
way run at two numbers of calls, the difference per call; the server process is not counted):
the same for the same build whatever the host's load, where the wall clock of a stdio round
trip on a shared host varies by milliseconds. With ``--cache``, cachegrind simulates this
host's L1 and L2 caches and counts their misses per call too, with an estimate of the cycles
(``_callgrind.misses_per_unit``): what an instruction count does not show.

``--rounds`` counts, in the client process, the asyncio event loop's rounds and the Python calls
per call each way (``_rounds.py``; no valgrind, a few seconds), and from ``getrusage`` and the
garbage collector the page faults, context switches, collections and user and system CPU per
call: what the wall clock pays for beyond the instructions, with the same subtraction.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Coroutine, Dict, List, Tuple

import _callgrind
import _rounds
import kerman
from kerman.models import ScriptedModel

SERVER = str(Path(__file__).resolve().parents[2] / "tests" / "python" / "mcp" / "mcp_server.py")
CALL = kerman.ModelReply([{"type": "tool-call", "id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'}])

#: The ways, by name, in the order a repetition starts from.
WAYS = ("direct", "loop+client", "loop+mcp", "loop+mcp -tasks", "loop+local")

Once = Callable[[], Coroutine[Any, Any, Any]]


def derived(per: Dict[str, float]) -> Dict[str, float]:
    """The derived rows of one measure of each way: the turn around a call, ``through kerman``
    with and without the tasks extension, and ``loop+mcp`` less the turn alone (which counts
    the turn's cost around a call as the call's)."""
    return {
        "turn in context": per["loop+client"] - per["direct"],
        "through kerman": per["direct"] + per["loop+mcp"] - per["loop+client"],
        "through kerman -tasks": per["direct"] + per["loop+mcp -tasks"] - per["loop+client"],
        "less turn alone": per["loop+mcp"] - per["loop+local"],
    }


def server_params() -> Any:
    from mcp import StdioServerParameters

    return StdioServerParameters(command=sys.executable, args=[SERVER])


def loop_over(way: str, client: Any = None) -> kerman.AgentLoop:
    """The loop of ``way`` (any but ``direct``); ``loop+client``'s tool calls ``client``."""
    from kerman.mcp import MCPServer

    model = ScriptedModel()
    if way.startswith("loop+mcp"):
        server = MCPServer.stdio(sys.executable, [SERVER], filter=["add"], tasks=not way.endswith("-tasks"))
        return kerman.AgentLoop(model, tools=[server])
    loop = kerman.AgentLoop(model)
    if way == "loop+client":

        @loop.tool
        async def add(a: int, b: int) -> str:
            """Adds two integers (on the MCP server, through the direct client)."""
            result = await client.call_tool("add", {"a": a, "b": b})
            return str(result.content[0].text)

    else:

        @loop.tool
        async def add(a: int, b: int) -> str:
            """Adds two integers."""
            return str(a + b)

    return loop


def turn_of(loop: kerman.AgentLoop) -> Once:
    model: ScriptedModel = loop._model  # type: ignore[attr-defined]

    async def turn() -> None:
        # The scripted model keeps every request, each holding the session's history: kept
        # over a run, they grow the process by a page a turn more at each thousand turns, and
        # the page faults with them (--rounds counts them), none of which a model that
        # answers over the network keeps.
        model.requests.clear()
        model.add(CALL, "done")
        loop.followup("go")
        await loop.when_idle()

    return turn


async def ways_over(client: Any) -> Tuple[Dict[str, Once], List[kerman.AgentLoop]]:
    """Each way's one call (``direct`` on ``client``), and the loops to close."""
    runs: Dict[str, Once] = {"direct": lambda: client.call_tool("add", {"a": 1, "b": 2})}
    loops: List[kerman.AgentLoop] = []
    for way in WAYS[1:]:
        loop = loop_over(way, client)
        loops.append(loop)
        runs[way] = turn_of(loop)
    for once in runs.values():
        await once()  # warm up: the server started, the tools listed
    return runs, loops


async def timed(calls: int, once: Once) -> Tuple[float, float]:
    """``calls`` calls of ``once``: (wall seconds, this process's CPU seconds) per call."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await once()
    return (time.perf_counter() - start) / calls, (time.process_time() - cpu) / calls


def median(values: List[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


async def measure(calls: int, reps: int) -> Dict[str, List[Dict[str, float]]]:
    """Each repetition's wall and CPU seconds per call of every way (``{"wall": [...],
    "cpu": [...]}``, one dict of ways per repetition)."""
    from mcp import Client

    out: Dict[str, List[Dict[str, float]]] = {"wall": [], "cpu": []}
    async with Client(server_params(), cache=None) as client:
        runs, loops = await ways_over(client)
        names = list(runs)
        for rep in range(reps):
            wall: Dict[str, float] = {}
            cpu: Dict[str, float] = {}
            for k in range(len(names)):
                name = names[(rep + k) % len(names)]
                wall[name], cpu[name] = await timed(calls, runs[name])
            out["wall"].append(wall)
            out["cpu"].append(cpu)
        for loop in loops:
            await loop.aclose()
    return out


async def child(way: str, calls: int) -> None:
    """``--child WAY CALLS``: ``CALLS`` calls made ``WAY`` after a warm-up (under valgrind)."""
    from mcp import Client

    async with Client(server_params(), cache=None) as client:
        if way == "direct":
            for _ in range(calls + 1):
                await client.call_tool("add", {"a": 1, "b": 2})
            return
        loop = loop_over(way, client)
        turn = turn_of(loop)
        for _ in range(calls + 1):
            await turn()
        await loop.aclose()


def callgrind(sizes: str, cache: bool) -> None:
    _callgrind.require_valgrind()
    small, large = (int(n) for n in sizes.split(","))
    columns = ("instructions", "l1_misses", "ll_misses", "cycles") if cache else ("instructions",)
    per: Dict[str, Dict[str, float]] = {}
    for way in WAYS:
        print(f"  {way}: {'cachegrind' if cache else 'callgrind'} at {small} and {large} calls...", file=sys.stderr, flush=True)
        if cache:
            per[way] = _callgrind.misses_per_unit(__file__, ["--child", way], small, large)
        else:
            per[way] = {"instructions": _callgrind.per_unit(__file__, ["--child", way], small, large)}
    for column in columns:
        rows = derived({way: per[way][column] for way in WAYS})
        for name, value in rows.items():
            per.setdefault(name, {})[column] = value
    what = "instructions and simulated L1/L2 misses (cachegrind)" if cache else "instructions (callgrind)"
    print(f"MCP tool call over stdio, client {what} per call")
    print(f"  {'':<22}" + "".join(f"{c.replace('_', ' '):>14}" for c in columns))
    for name, row in per.items():
        print(f"  {name:<22}" + "".join(f"{row[c]:>14,.0f}" for c in columns))
    figures: Dict[str, Any] = {"bench": "mcp_call_cachegrind" if cache else "mcp_call_callgrind"}
    for column in columns:
        ratio = per["through kerman"][column] / per["direct"][column]
        no_tasks = per["through kerman -tasks"][column] / per["direct"][column]
        alone = per["less turn alone"][column] / per["direct"][column]
        print(
            f"  {column.replace('_', ' ')}: through kerman / direct {ratio:.3f}x (target <= 1.10x); "
            f"without the tasks extension {no_tasks:.3f}x; less the turn alone {alone:.3f}x"
        )
        suffix = "" if column == "instructions" else "_" + column
        figures["ratio" + suffix] = round(ratio, 4)
        figures["ratio_without_tasks" + suffix] = round(no_tasks, 4)
        figures["ratio_less_turn_alone" + suffix] = round(alone, 4)
    for name, row in per.items():
        key = _key(name)
        for column in columns:
            figures[key if column == "instructions" else f"{key}_{column}"] = round(row[column])
    print(json.dumps(figures))


def _key(name: str) -> str:
    return name.replace(" -", "_no_").replace(" ", "_").replace("+", "_")


async def counted(calls: int) -> None:
    """``--rounds``: event-loop rounds, Python calls, faults, context switches, collections and
    CPU per call, each way (``_rounds.py``)."""
    from mcp import Client

    per: Dict[str, Dict[str, float]] = {}
    async with Client(server_params(), cache=None) as client:
        runs, loops = await ways_over(client)
        for way, once in runs.items():
            per[way] = await _rounds.count_all(calls, once)
        for loop in loops:
            await loop.aclose()
    columns = list(per["direct"])
    for column in columns:
        for name, value in derived({way: per[way][column] for way in WAYS}).items():
            per.setdefault(name, {})[column] = value
    print(f"MCP tool call over stdio, per call (mean of {calls}; the client process)")
    print(f"  {'':<22}" + "".join(f"{_rounds.LABELS[c]:>14}" for c in columns))
    for name, row in per.items():
        print(f"  {name:<22}" + "".join(f"{row[c]:>14.2f}" for c in columns))
    figures: Dict[str, Any] = {"bench": "mcp_call_rounds"}
    for name, row in per.items():
        for column in columns:
            figures[f"{_key(name)}_{column}"] = round(row[column], 3)
    print(json.dumps(figures))


def report(times: Dict[str, List[Dict[str, float]]], calls: int, reps: int) -> None:
    print(f"MCP tool call over stdio, per call ({reps} repetitions of {calls} calls, interleaved)")
    figures: Dict[str, Any] = {"bench": "mcp_call", "calls": calls, "reps": reps}
    for kind, label in (("wall", "wall"), ("cpu", "client cpu")):
        reps_of = [{**rep, **derived(rep)} for rep in times[kind]]
        best = {name: min(rep[name] for rep in times[kind]) for name in times[kind][0]}
        best.update(derived(best))
        mid = {name: median([rep[name] for rep in reps_of]) for name in reps_of[0]}
        print(f"  {label}: {'median':>10}{'best':>10}")
        for name in mid:
            print(f"  {name:<24}{mid[name] * 1e6:8.1f} us{best[name] * 1e6:8.1f} us")
        ratios = {
            name: median([rep[name] / rep["direct"] for rep in reps_of])
            for name in ("through kerman", "through kerman -tasks", "less turn alone")
        }
        key = label.replace(" ", "_")
        print(
            f"  through kerman / direct ({label}, median of the repetitions' ratios): {ratios['through kerman']:.2f}x "
            f"(target <= 1.10x); without the tasks extension {ratios['through kerman -tasks']:.2f}x; "
            f"less the turn alone {ratios['less turn alone']:.2f}x"
        )
        figures[key + "_ratio"] = round(ratios["through kerman"], 3)
        figures[key + "_ratio_without_tasks"] = round(ratios["through kerman -tasks"], 3)
        figures[key + "_ratio_less_turn_alone"] = round(ratios["less turn alone"], 3)
        figures.update({f"{_key(name)}_{key}_us": round(value * 1e6, 1) for name, value in mid.items()})
    print(json.dumps(figures))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--callgrind", action="store_true", help="count the client's instructions (valgrind) instead of timing")
    parser.add_argument("--cache", action="store_true", help="with --callgrind: simulate the caches (cachegrind) and count misses too")
    parser.add_argument("--sizes", default="100,300", help="with --callgrind: the two numbers of calls")
    parser.add_argument("--rounds", action="store_true", help="count loop rounds, Python calls, faults and CPU per call instead of timing")
    args = parser.parse_args()
    if args.rounds:
        await counted(args.calls)
    elif args.callgrind:
        callgrind(args.sizes, args.cache)
    else:
        report(await measure(args.calls, args.reps), args.calls, args.reps)


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
