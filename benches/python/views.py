"""Reading a log as typed views: ``log.events(view=True)`` against ``view(e) for e in
log.events()``, ``kerman.events.views(log.events())`` and plain ``log.events()``.

    python3 benches/python/views.py [--turns 300] [--rounds 7]

The log is what a loop writes: streamed turns with a tool call (chunks, messages, tool calls and
results, step and turn bounds, splices), so every view class of a real session is built. The
readers run interleaved, round by round, and each figure is the best of a round's repetitions
(ns per event); the table gives the median and the best round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import timeit
from typing import Any, AsyncIterator, Callable, Dict, List

import kerman
from kerman import events
from kerman.events import view


async def _model(request: kerman.ModelRequest) -> AsyncIterator[Dict[str, Any]]:
    yield {"type": "text-delta", "text": "Looking "}
    yield {"type": "text-delta", "text": "it up."}
    if request.step == 1:
        yield {"type": "tool-call", "id": f"c{request.turn}", "name": "lookup", "arguments": '{"q": "k"}'}
    yield {"type": "usage", "input": 10, "output": 4}
    yield {"type": "finish", "reason": "stop"}


async def _record(turns: int) -> kerman.SessionLog:
    loop = kerman.AgentLoop(_model)

    @loop.tool
    async def lookup(q: str) -> str:
        """Looks something up."""
        return f"{q}: found"

    for n in range(turns):
        loop.followup(f"question {n}")
        await loop.when_idle()
    await loop.aclose()
    return loop.log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    log = asyncio.run(_record(args.turns))
    size = len(log)

    def native() -> None:
        for _ in log.events(view=True):
            pass

    def genexp() -> None:
        for _ in (view(e) for e in log.events()):
            pass

    def mapped() -> None:
        for _ in events.views(log.events()):
            pass

    def plain() -> None:
        for _ in log.events():
            pass

    readers: Dict[str, Callable[[], None]] = {
        "log.events(view=True)": native,
        "view(e) for e in log.events()": genexp,
        "events.views(log.events())": mapped,
        "log.events() (Events, no view)": plain,
    }
    figures: Dict[str, List[float]] = {name: [] for name in readers}
    for _ in range(args.rounds):
        for name, reader in readers.items():
            figures[name].append(min(timeit.repeat(reader, number=3, repeat=3)) / 3 / size * 1e9)
    print(f"{size} events ({args.turns} turns), {args.rounds} rounds; ns per event")
    print(f"{'reader':34} {'median':>8} {'best':>8}")
    for name, values in figures.items():
        print(f"{name:34} {statistics.median(values):8.0f} {min(values):8.0f}")


if __name__ == "__main__":
    main()
