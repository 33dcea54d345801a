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

__all__ = ["instructions", "per_unit", "require_valgrind", "seeded"]


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
