"""A turn's cost over a long history, with and without compaction.

    python3 benches/python/compaction_cost.py [--sizes 1000,10000,100000] [--turns 100] [--reps 21]

For each size, a session of that many events written by ``gen_log.py`` (28-event turns with a
tool call and a large result) is forked (the parent stays as generated) and opened from a
``FileStore``; an ``AgentLoop`` with a scripted model runs ``--turns`` one-step turns over it as
it is (every turn's request carries the whole history), then
``await loop.compact(SlidingWindow(keep=8))``. Every size's loop stays open, and the compacted
turns are then measured in ``--reps`` rounds, each running, on every size in turn, a compaction
(untimed: each block starts from the same window) and a block of ``--turns`` turns (interleaved,
so a load that comes and goes on a shared machine falls on every size alike); a size's cost is
the median over the rounds of its blocks' mean time per turn, in wall-clock and in CPU time
(``time.process_time``: only this process's, so the time other processes hold the cores on a
loaded machine is left out). The
target (docs/performance.md): with compaction, flat in the history length; the ratio of the
largest size's to the smallest's is printed, measured in this one run.

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

import kerman
from kerman.compaction import SlidingWindow

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_log  # noqa: E402

REPLY = kerman.ModelReply("ok", usage={"input": 10, "output": 1})


async def reply(request: kerman.ModelRequest) -> kerman.ModelReply:
    return REPLY


async def turns(loop: kerman.AgentLoop, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        loop.followup(f"q{i}")
        await loop.when_idle()
    return (time.perf_counter() - start) / n


async def cpu_turns(loop: kerman.AgentLoop, n: int) -> Tuple[float, float]:
    """Mean wall-clock and CPU seconds (this process's, `time.process_time`) per turn: the CPU
    time leaves out the time other processes of a loaded machine hold the cores."""
    cpu = time.process_time()
    wall = await turns(loop, n)
    return wall, (time.process_time() - cpu) / n


async def prepare(store: kerman.FileStore, root: str, events: int, n: int) -> Dict[str, Any]:
    """The session of `events` events, opened, `n` plain turns run on it, then compacted."""
    sid = f"s{events}"
    gen_log.write(os.path.join(root, f"{sid}.jsonl"), sid, events)
    log = store.open(store.fork(sid, events - 1, f"{sid}-run"))
    loop = kerman.AgentLoop(reply, log)
    history = len(loop.history)
    plain = await turns(loop, n)
    start = time.perf_counter()
    await loop.compact(SlidingWindow(keep=8))
    compact_s = time.perf_counter() - start
    return {"events": events, "history": history, "turn_us": plain * 1e6, "compact_ms": compact_s * 1e3, "loop": loop, "log": log}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as root:
        store = kerman.FileStore(root, durability="none")
        rows = [await prepare(store, root, size, args.turns) for size in sizes]
        blocks: List[List[Tuple[float, float]]] = [[] for _ in rows]
        for _ in range(args.reps):
            for i, row in enumerate(rows):
                # Each block starts from the same window: the turns of the blocks before it
                # are compacted away (untimed), else every block's history would be longer.
                await row["loop"].compact(SlidingWindow(keep=8))
                blocks[i].append(await cpu_turns(row["loop"], args.turns))
        for row, times in zip(rows, blocks, strict=True):
            wall = [w for w, _ in times]
            cpu = [c for _, c in times]
            row["turn_compacted_us"] = statistics.median(wall) * 1e6
            row["turn_compacted_cpu_us"] = statistics.median(cpu) * 1e6
            row["spread_us"] = [round(min(wall) * 1e6), round(max(wall) * 1e6)]
            await row.pop("loop").aclose()
            row.pop("log").close()
    print(f"{'events':>8} {'history':>8} {'turn µs':>9} {'compacted µs':>13} {'(min-max)':>12} {'CPU µs':>8} {'compact ms':>11}")
    for r in rows:
        spread = f"{r['spread_us'][0]}-{r['spread_us'][1]}"
        print(
            f"{r['events']:>8} {r['history']:>8} {r['turn_us']:>9.0f} {r['turn_compacted_us']:>13.0f} {spread:>12}"
            f" {r['turn_compacted_cpu_us']:>8.0f} {r['compact_ms']:>11.1f}"
        )
    ratio = rows[-1]["turn_compacted_us"] / rows[0]["turn_compacted_us"]
    cpu_ratio = rows[-1]["turn_compacted_cpu_us"] / rows[0]["turn_compacted_cpu_us"]
    first, last = rows[0]["events"], rows[-1]["events"]
    print(f"compacted turn at {last} events / at {first}: {ratio:.2f}x wall clock, {cpu_ratio:.2f}x CPU time (target: flat)")
    print(json.dumps({"bench": "compaction_cost", "rows": rows, "ratio": round(ratio, 3), "cpu_ratio": round(cpu_ratio, 3)}))


if __name__ == "__main__":
    asyncio.run(main())
