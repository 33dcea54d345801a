"""A turn's cost over a long history, with and without compaction.

    python3 benches/python/compaction_cost.py [--sizes 1000,10000,100000] [--turns 200] [--reps 3]

For each size, a session of that many events written by ``gen_log.py`` (28-event turns with a
tool call and a large result) is opened from a ``FileStore``; an ``AgentLoop`` with a scripted
model runs ``--turns`` one-step turns over it as it is (every turn's request carries the whole
history), then ``await loop.compact(SlidingWindow(keep=8))`` and ``--turns`` more. The cost
of a turn is the median over ``--reps`` repetitions of the mean time per turn. The target
(docs/performance.md): with compaction, flat in the history length; the ratio of the largest
size's to the smallest's is printed, measured in this one run.

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
from typing import Any, Dict, List

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


async def measure(root: str, events: int, n: int, reps: int) -> Dict[str, Any]:
    store = kerman.FileStore(root, durability="none")
    sid = f"s{events}"
    gen_log.write(os.path.join(root, f"{sid}.jsonl"), sid, events)
    plain: List[float] = []
    compacted: List[float] = []
    for rep in range(reps):
        fork = store.fork(sid, events - 1, f"{sid}-{rep}")
        with store.open(fork) as log:
            loop = kerman.AgentLoop(reply, log)
            history = len(loop.history)
            plain.append(await turns(loop, n))
            start = time.perf_counter()
            await loop.compact(SlidingWindow(keep=8))
            compact_s = time.perf_counter() - start
            compacted.append(await turns(loop, n))
            await loop.aclose()
    return {
        "events": events,
        "history": history,
        "turn_us": statistics.median(plain) * 1e6,
        "turn_compacted_us": statistics.median(compacted) * 1e6,
        "compact_ms": compact_s * 1e3,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for size in sizes:
            rows.append(await measure(root, size, args.turns, args.reps))
    print(f"{'events':>8} {'history':>8} {'turn µs':>9} {'compacted µs':>13} {'compact ms':>11}")
    for r in rows:
        print(f"{r['events']:>8} {r['history']:>8} {r['turn_us']:>9.0f} {r['turn_compacted_us']:>13.0f} {r['compact_ms']:>11.1f}")
    ratio = rows[-1]["turn_compacted_us"] / rows[0]["turn_compacted_us"]
    print(f"compacted turn at {rows[-1]['events']} events / at {rows[0]['events']}: {ratio:.2f}x (target: flat)")
    print(json.dumps({"bench": "compaction_cost", "rows": rows, "ratio": round(ratio, 3)}))


if __name__ == "__main__":
    asyncio.run(main())
