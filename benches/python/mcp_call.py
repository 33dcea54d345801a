"""An MCP tool call through Kerman against the same call made directly with the ``mcp`` client.

    python3 benches/python/mcp_call.py [--calls 200] [--reps 5]

The server is the tests' (``tests/python/mcp/mcp_server.py``) over stdio; the tool is ``add``.
Three figures, each per call and the best of ``--reps`` repetitions (a loaded host only adds
time):

* ``direct``: ``await client.call_tool("add", ...)`` on an ``mcp.Client``;
* ``loop+mcp``: one turn of an ``AgentLoop`` whose scripted model calls the server's ``add``
  once and then answers;
* ``loop+local``: the same turn with a local ``add`` tool: the loop's own cost (the model's two
  requests, the log appends) without MCP.

``through kerman`` is ``loop+mcp - loop+local``: what a call costs through Kerman beyond the
turn it sits in. The target is ``through kerman <= 1.1 x direct``. Prints a table and one JSON
line. Needs ``kerman[mcp]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Coroutine, List

import kerman
from kerman.mcp import MCPServer
from kerman.models import ScriptedModel

SERVER = str(Path(__file__).resolve().parents[2] / "tests" / "python" / "mcp" / "mcp_server.py")
CALL = kerman.ModelReply([{"type": "tool-call", "id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'}])


async def best(reps: int, calls: int, once: Callable[[], Coroutine[Any, Any, Any]]) -> float:
    """The best of ``reps`` repetitions of ``calls`` calls of ``once``, in seconds per call."""
    await once()  # warm up (starts the server, lists the tools)
    figures: List[float] = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            await once()
        figures.append((time.perf_counter() - start) / calls)
    return min(figures)


async def direct(calls: int, reps: int) -> float:
    from mcp import Client, StdioServerParameters

    async with Client(StdioServerParameters(command=sys.executable, args=[SERVER]), cache=None) as client:
        await client.list_tools()
        return await best(reps, calls, lambda: client.call_tool("add", {"a": 1, "b": 2}))


async def through_loop(calls: int, reps: int, mcp: bool) -> float:
    model = ScriptedModel()
    if mcp:
        loop = kerman.AgentLoop(model, tools=[MCPServer.stdio(sys.executable, [SERVER])])
    else:
        loop = kerman.AgentLoop(model)

        @loop.tool
        async def add(a: int, b: int) -> str:
            """Adds two integers."""
            return str(a + b)

    async def turn() -> None:
        model.add(CALL, "done")
        loop.followup("go")
        await loop.when_idle()

    try:
        return await best(reps, calls, turn)
    finally:
        await loop.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    d = await direct(args.calls, args.reps)
    with_mcp = await through_loop(args.calls, args.reps, True)
    local = await through_loop(args.calls, args.reps, False)
    through = with_mcp - local
    rows = [("direct", d), ("loop+mcp", with_mcp), ("loop+local", local), ("through kerman", through)]
    print(f"MCP tool call over stdio, per call (best of {args.reps} x {args.calls})")
    for name, value in rows:
        print(f"  {name:<16}{value * 1e6:10.1f} us")
    ratio = through / d if d else float("nan")
    print(f"  through kerman / direct: {ratio:.2f}x (target <= 1.10x)")
    print(
        json.dumps({"bench": "mcp_call", "direct_us": d * 1e6, "loop_mcp_us": with_mcp * 1e6, "loop_local_us": local * 1e6, "ratio": ratio})
    )


if __name__ == "__main__":
    asyncio.run(main())
