#!/usr/bin/env python3
"""Instructions per operation of two Kerman installs, counted by callgrind: an A/B of two
builds of the same source (abi3 against a per-version wheel, say) that the noise of a shared
machine cannot blur.

    python3 scripts/instr-ab.py A_PYTHON B_PYTHON [--only P1,P3/0]

Each ``*_PYTHON`` is the interpreter of a venv holding one build. The loop cases are
``benches/python/turn_cost.py``'s P3/P4 turn shapes (Kerman only); P1 and P2 are bench.py's
inbox workloads (an append + remove pair; 10 appends and the claim of them). Every figure is the count
at two sizes, differenced and divided by the extra operations, so start-up and imports cancel.
Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TURN_COST = os.path.join(ROOT, "benches", "python", "turn_cost.py")

# The inbox workloads of bench.py (P1, P2) as a child program: argv[1] is the case, argv[2] the
# number of operations.
INBOX_CHILD = """
import sys, kerman
case, n = sys.argv[1], int(sys.argv[2])
log = kerman.MemoryStore().create("s")
inbox = kerman.Inbox(log)
if case == "P1":
    messages = [kerman.UserMessage("hello") for _ in range(n)]
    for m in messages:
        inbox.append("next-turn", m)
        inbox.remove(m.id)
else:
    for turn in range(n):
        for _ in range(10):
            inbox.append("next-step", kerman.UserMessage("hello"))
        inbox.claim("next-step", turn)
"""

# case: (argv after the interpreter, the two sizes)
CASES: Dict[str, Tuple[List[str], Tuple[int, int]]] = {
    "P1": (["-c", INBOX_CHILD, "P1"], (20_000, 60_000)),
    "P2": (["-c", INBOX_CHILD, "P2"], (2_000, 6_000)),
    "P3/0": ([TURN_COST, "--child", "kerman", "0", "0"], (1_000, 3_000)),
    "P3/1": ([TURN_COST, "--child", "kerman", "1", "0"], (1_000, 3_000)),
    "P3/5": ([TURN_COST, "--child", "kerman", "5", "0"], (1_000, 3_000)),
    "P4": ([TURN_COST, "--child", "kerman", "0", "1"], (1_000, 3_000)),
    # P4 gated (issue 27's target: what a gate that allows adds, as a share of P4): a
    # `return await next()` gate, a gate returning `Approve()`, a `needs_approval` predicate.
    "P4+gate": ([TURN_COST, "--child", "kerman", "0", "1", "{n}", "gate"], (500, 1_500)),
    "P4+approve": ([TURN_COST, "--child", "kerman", "0", "1", "{n}", "approve"], (500, 1_500)),
    "P4+predicate": ([TURN_COST, "--child", "kerman", "0", "1", "{n}", "predicate"], (500, 1_500)),
}
GATED = ("P4+gate", "P4+approve", "P4+predicate")


def with_size(argv: List[str], n: int) -> List[str]:
    """The child's argv with the number of operations: in place of ``{n}``, or last."""
    if "{n}" in argv:
        return [str(n) if a == "{n}" else a for a in argv]
    return [*argv, str(n)]


def count(python: str, argv: List[str], n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", python, *with_size(argv, n)],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if not found:
        raise SystemExit(f"no instruction count in callgrind's output:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def per_op(python: str, case: str) -> float:
    argv, (small, large) = CASES[case]
    return (count(python, argv, large) - count(python, argv, small)) / (large - small)


def main(args_in: List[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--only", help="comma-separated cases: " + ", ".join(CASES))
    args = ap.parse_args(args_in)
    names = args.only.split(",") if args.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}; expected some of {', '.join(CASES)}")
    print("| case | A instr/op | B instr/op | B / A |\n|---|---|---|---|")
    per: Dict[str, Tuple[float, float]] = {}
    for name in names:
        print(f"  {name}...", file=sys.stderr, flush=True)
        a, b = per_op(args.a, name), per_op(args.b, name)
        per[name] = (a, b)
        print(f"| {name} | {a:,.0f} | {b:,.0f} | {b / a:.3f} |", flush=True)
    gated = [n for n in GATED if n in per]
    if gated and "P4" in per:
        # What gating adds to a P4 turn, as a share of that build's own P4 turn.
        (pa, pb) = per["P4"]
        print("\n| gated P4 | A adds | B adds |\n|---|---|---|")
        for name in gated:
            a, b = per[name]
            print(f"| {name} | {a - pa:+,.0f} ({(a - pa) / pa:.1%}) | {b - pb:+,.0f} ({(b - pb) / pb:.1%}) |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
