"""Instructions a child process executes, counted by valgrind's callgrind: the benches'
deterministic measure (``mcp_call.py``, ``run_cost.py``, ``turn_cost.py``,
``pydantic_ai_durability.py``, each with its ``--child`` workload).

A count is the same for the same build and input whatever else the host does, where a wall
clock on a shared host varies by tens of percent. Each bench runs its workload at two sizes and
divides the difference by the extra units (calls, turns), so start-up and imports cancel out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, Sequence

__all__ = ["cache_misses", "instructions", "misses_per_unit", "per_unit", "require_valgrind", "seeded"]


def seeded() -> Dict[str, str]:
    """This process's environment with a fixed ``PYTHONHASHSEED``: the children hash strings
    alike, so dict and set layouts, and the counts, are the same from one run to the next. Read
    when a child starts, so a variable a bench sets before (an endpoint) reaches it."""
    return {**os.environ, "PYTHONHASHSEED": "0"}


def require_valgrind() -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")


def instructions(script: str, args: Sequence[object]) -> int:
    """The instructions of ``python script args...`` (every thread of it) under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable, os.path.abspath(script)]
        out = subprocess.run(argv + [str(a) for a in args], capture_output=True, text=True, check=True, env=seeded())
    found = re.search(r"Collected : (\d+)", out.stderr)
    if not found:
        raise SystemExit(f"no instruction count in callgrind's output:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def per_unit(script: str, args: Sequence[object], small: int, large: int, after: Sequence[object] = ()) -> float:
    """Instructions per unit of work of ``python script *args N *after`` (the workload at ``N``
    units): the difference between ``N = small`` and ``N = large`` over the extra units."""
    counts = [instructions(script, [*args, n, *after]) for n in (small, large)]
    return (counts[1] - counts[0]) / (large - small)


#: The simulated caches of ``cache_misses``: this host's L1 (32 KiB, 8 ways) and its 1 MiB L2
#: as cachegrind's last level (its L3, 32 MiB, is shared with every other process: what
#: evicts a process's lines there is not in a simulation of that process alone).
CACHES = ("--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,8,64")

_CACHE_LINES = {
    "instructions": r"I\s+refs:\s+([\d,]+)",
    "data": r"D\s+refs:\s+([\d,]+)",
    "l1_misses": r"I1\s+misses:\s+([\d,]+)",
    "d1_misses": r"D1\s+misses:\s+([\d,]+)",
    "ll_misses": r"LL misses:\s+([\d,]+)",
}


def cache_misses(script: str, args: Sequence[object]) -> Dict[str, int]:
    """The references and simulated cache misses of ``python script args...`` under
    cachegrind (``CACHES``): instructions, data references, L1 misses (instruction and data)
    and last-level misses."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", *CACHES, f"--cachegrind-out-file={tmp}/cg.out"]
        argv += [sys.executable, os.path.abspath(script), *(str(a) for a in args)]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, env=seeded())
    counts = {}
    for name, pattern in _CACHE_LINES.items():
        found = re.search(pattern, out.stderr)
        if not found:
            raise SystemExit(f"no {name} in cachegrind's output:\n{out.stderr[-2000:]}")
        counts[name] = int(found.group(1).replace(",", ""))
    counts["l1_misses"] += counts.pop("d1_misses")
    return counts


def misses_per_unit(script: str, args: Sequence[object], small: int, large: int) -> Dict[str, float]:
    """``cache_misses`` per unit of work (the difference between ``small`` and ``large``
    units over the extra units), with iai's estimate of the cycles they cost: an L1 hit 1, a
    last-level hit 5, a miss there (memory) 35."""
    counts = [cache_misses(script, [*args, n]) for n in (small, large)]
    per = {name: (counts[1][name] - counts[0][name]) / (large - small) for name in counts[0]}
    refs = per["instructions"] + per["data"]
    per["cycles"] = (refs - per["l1_misses"]) + 5 * (per["l1_misses"] - per["ll_misses"]) + 35 * per["ll_misses"]
    return per
