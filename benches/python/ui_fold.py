"""The UI projections' cost per log event: a recorded session folded through ``AgUiProjection``
and ``VercelProjection`` (``feed``, what ``kerman serve`` runs once per session and protocol),
and through ``kerman.ui.agui()`` / ``vercel()`` (the iterators, which also number each protocol
event as a ``UiEvent``).

    python3 benches/python/ui_fold.py [--turns 20] [--chunks 40] [--reps 7]

The session is recorded once, in memory, by an ``AgentLoop`` whose model streams reasoning,
``--chunks`` text deltas and a tool call, then answers the tool's result with a short streamed
reply: mostly ``assistant/chunk`` events, as a streamed UI sees them. The events are read back
as ``kerman.Event`` values with their payloads decoded once beforehand (the web feed decodes each
payload once too), so the figure is the fold's and the mapping's alone. Each figure is the best
of ``--reps`` repetitions (a loaded host only adds time); prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time
from typing import Any, AsyncIterator, Callable, Dict, List

import kerman
from kerman.ui import AgUiProjection, VercelProjection, agui, vercel


def record(turns: int, chunks: int) -> List[kerman.Event]:
    """A session of ``turns`` turns: streamed reasoning, text and a tool call, then the reply."""

    async def model(request: kerman.ModelRequest) -> AsyncIterator[Dict[str, Any]]:
        if (
            request.messages
            and request.messages[-1].role == "user"
            and any(b.get("type") == "tool-result" for b in request.messages[-1].to_dict()["content"])
        ):
            for word in ("Found ", "it."):
                yield {"type": "text-delta", "text": word}
            yield {"type": "finish", "reason": "stop"}
            return
        yield {"type": "reasoning-delta", "text": "The user asks; look it up."}
        for i in range(chunks):
            yield {"type": "text-delta", "text": f"word{i} "}
        yield {"type": "tool-call", "id": f"c{len(request.messages)}", "name": "lookup", "arguments": '{"q": "kerman"}'}
        yield {"type": "usage", "input": 120, "output": chunks + 10}
        yield {"type": "finish", "reason": "stop"}

    async def run() -> List[kerman.Event]:
        log = kerman.MemoryStore().create("ui-fold")
        loop = kerman.AgentLoop(model, log=log)

        @loop.tool
        async def lookup(q: str) -> str:
            """Looks something up."""
            return f"{q}: found"

        for turn in range(turns):
            loop.followup(f"question {turn}")
            await loop.when_idle()
        await loop.aclose()
        return list(log.events())

    events = asyncio.run(run())
    for event in events:
        _ = event.data  # decoded and cached, as the web feed's first read leaves it
    return events


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=40, help="text deltas per streamed reply")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    events = record(args.turns, args.chunks)
    n = len(events)
    kinds = collections.Counter(e.type for e in events)

    def feed(make: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            projection = make()
            for event in events:
                projection.feed(event)

        return run

    rows = {
        "agui feed": feed(lambda: AgUiProjection("session")),
        "vercel feed": feed(VercelProjection),
        "agui()": lambda: collections.deque(agui(events, thread_id="session"), maxlen=0),
        "vercel()": lambda: collections.deque(vercel(events), maxlen=0),
    }
    for fn in rows.values():  # warm-up
        fn()
    # the rows alternate within each repetition, so a change in the host's load hits all of them
    figures = {name: float("inf") for name in rows}
    for _ in range(args.reps):
        for name, fn in rows.items():
            figures[name] = min(figures[name], timed(fn) / n * 1e6)
    print(f"\n## UI projections: {n} events ({kinds['assistant/chunk']} assistant/chunk), best of {args.reps}\n")
    print("| projection | µs / event |")
    print("|---|---:|")
    for name, value in figures.items():
        print(f"| {name} | {value:.2f} |")
    per_event = {name: round(value, 3) for name, value in figures.items()}
    print(json.dumps({"ui_fold": {"events": n, "chunks": kinds["assistant/chunk"], "us_per_event": per_event}}))


if __name__ == "__main__":
    main()
