"""``loop.run(prompt)`` against what it replaces: ``followup`` + ``when_idle`` + reading the
answer from the log, one turn per prompt, on a memory log (target: run() at most 1.05x).

    python3 benches/python/run_cost.py [--turns 1000] [--reps 5] [--model-ms 0 1]
    python3 benches/python/run_cost.py --callgrind [--sizes 200,600]
    python3 benches/python/run_cost.py --rounds [--turns 1000]

One row per ``--model-ms``: the model answers at once (``0``: the loop's own cost is all there
is to measure, the hardest case for the ratio) or after an ``asyncio.sleep`` (``1``: the
fastest a real model answers). Both ways read the same things: the turn's final text and its
usage (the usage ledger's totals of the turn, priced: ``RunResult.usage``, read when asked for),
and, in a second row, the text alone. Each figure is the best of ``--reps`` repetitions, the two ways interleaved (a loaded
host only adds time); prints a table and one JSON line. ``--callgrind`` counts instructions
instead (valgrind's callgrind, the instant model, one loop run at two sizes, the difference per
turn): the same for the same binary whatever else the host does. ``--rounds`` counts the
asyncio event loop's rounds and the Python calls per turn each way instead (``_rounds.py``; no
valgrind, a second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any, Callable, Coroutine, Dict, Tuple

import _callgrind
import _rounds
import kerman
from kerman.usage import ledger


def model_of(delay: float) -> Any:
    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        if delay:
            await asyncio.sleep(delay)
        return kerman.ModelReply("ok: " + request.entered[0].text, usage={"inputTokens": 10, "outputTokens": 2})

    return model


async def by_followup(loop: kerman.AgentLoop, prompt: str) -> str:
    """The turn's final text and its usage, as a user of followup() reads them: the usage
    ledger of the turn's events (priced as run() prices them)."""
    start = len(loop.log)  # the turn's events come after this
    loop.followup(prompt)
    await loop.when_idle()
    text = ""
    for event in loop.log.events(start, types="assistant/message"):
        text = kerman.Message.from_dict(event.data["message"]).text
    ledger(loop.log.events(start), model=None, provider=None).turn(loop.turn)
    return text


async def by_followup_text(loop: kerman.AgentLoop, prompt: str) -> str:
    start = len(loop.log)
    loop.followup(prompt)
    await loop.when_idle()
    text = ""
    for event in loop.log.events(start, types="assistant/message"):
        text = kerman.Message.from_dict(event.data["message"]).text
    return text


async def by_run(loop: kerman.AgentLoop, prompt: str) -> str:
    result = await loop.run(prompt)
    result.usage  # noqa: B018 - read, as by_followup reads it
    return result.text


async def by_run_text(loop: kerman.AgentLoop, prompt: str) -> str:
    return (await loop.run(prompt)).text


#: The pairs compared: what each way reads (text and usage; the text alone).
PAIRS = {"text+usage": (by_followup, by_run), "text": (by_followup_text, by_run_text)}


def measure(way: Callable[[kerman.AgentLoop, str], Coroutine[Any, Any, str]], turns: int, delay: float) -> float:
    async def main() -> float:
        loop = kerman.AgentLoop(model_of(delay))
        await way(loop, "warm-up")
        start = time.perf_counter()
        for i in range(turns):
            await way(loop, f"prompt {i}")
        elapsed = time.perf_counter() - start
        await loop.aclose()
        return elapsed

    return asyncio.run(main())


WAYS = {"followup": by_followup, "run": by_run, "followup-text": by_followup_text, "run-text": by_run_text}


def child(way: str, turns: int) -> None:
    """``--child WAY TURNS``: one loop, ``TURNS`` turns the given way (under callgrind)."""

    async def main() -> None:
        loop = kerman.AgentLoop(model_of(0))
        for i in range(turns):
            await WAYS[way](loop, f"prompt {i}")
        await loop.aclose()

    asyncio.run(main())


def callgrind(sizes: str) -> None:
    _callgrind.require_valgrind()
    small, large = (int(n) for n in sizes.split(","))
    rows = {}
    print("instructions per turn (instant model), followup + when_idle against run(), target <= 1.05x")
    for name, (followup, run) in PAIRS.items():
        per = []
        for way in (followup, run):
            key = next(k for k, v in WAYS.items() if v is way)
            print(f"  {key}: callgrind at {small} and {large} turns...", file=sys.stderr, flush=True)
            per.append(_callgrind.per_unit(__file__, ["--child", key], small, large))
        a, b = per
        rows[name] = {"followup": a, "run": b, "ratio": round(b / a, 4)}
        print(f"  reading {name:<10}  {a:>9,.0f}  {b:>9,.0f}  {b / a:.3f}x", flush=True)
    print(json.dumps({"bench": "run_cost_callgrind", "rows": rows}))


def counted(turns: int) -> None:
    """``--rounds``: event-loop rounds and Python calls per turn, each way, the instant model
    (``_rounds.py``)."""

    async def main() -> Dict[str, Tuple[float, float]]:
        loop = kerman.AgentLoop(model_of(0))
        per = {}
        for key, way in WAYS.items():
            await way(loop, "warm-up")
            per[key] = await _rounds.count(turns, lambda: way(loop, "prompt"))  # noqa: B023 - awaited in the iteration
        await loop.aclose()
        return per

    per = asyncio.run(main())
    print(f"per turn (instant model, mean of {turns}): event-loop rounds and Python calls, followup + when_idle against run()")
    rows = {}
    for name, (followup, run) in PAIRS.items():
        a, b = (per[next(k for k, v in WAYS.items() if v is way)] for way in (followup, run))
        rows[name] = {"followup": {"rounds": a[0], "python_calls": a[1]}, "run": {"rounds": b[0], "python_calls": b[1]}}
        print(f"  reading {name:<10}  rounds {a[0]:.2f} vs {b[0]:.2f}   Python calls {a[1]:.1f} vs {b[1]:.1f}")
    print(json.dumps({"bench": "run_cost_rounds", "rows": rows}))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=1000, help="turns per repetition with an instant model (a tenth per ms)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--model-ms", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--callgrind", action="store_true", help="count instructions (valgrind) instead of timing")
    parser.add_argument("--sizes", default="200,600", help="with --callgrind: the two numbers of turns")
    parser.add_argument("--rounds", action="store_true", help="count event-loop rounds and Python calls per turn instead of timing")
    args = parser.parse_args()
    if args.rounds:
        counted(args.turns)
        return
    if args.callgrind:
        callgrind(args.sizes)
        return
    rows = []
    print(f"one turn per prompt on a memory log, best of {args.reps}")
    print(f"  {'model':>8}  {'reading':>10}  {'followup + when_idle':>22}  {'run()':>12}  ratio (target <= 1.05x)")
    for ms in args.model_ms:
        turns = max(50, int(args.turns / (1 + 3 * ms)))
        delay = ms / 1000
        for name, (followup, run) in PAIRS.items():
            best = {"followup": float("inf"), "run": float("inf")}
            for _ in range(args.reps):
                best["followup"] = min(best["followup"], measure(followup, turns, delay))
                best["run"] = min(best["run"], measure(run, turns, delay))
            per = {k: v / turns * 1e6 for k, v in best.items()}
            ratio = best["run"] / best["followup"]
            print(f"  {ms:>6g}ms  {name:>10}  {per['followup']:>17.1f} us/turn  {per['run']:>7.1f} us/turn  {ratio:.3f}x")
            rows.append({"model_ms": ms, "reading": name, "us_per_turn": per, "ratio": round(ratio, 4)})
    print(json.dumps({"bench": "run_cost", "rows": rows}))


if __name__ == "__main__":
    main()
