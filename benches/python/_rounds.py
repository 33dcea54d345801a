"""Two counts of what an awaited operation costs, taken in-process and without valgrind (the
benches' ``--rounds`` mode: ``mcp_call.py``, ``run_cost.py``).

* **rounds**: iterations of the asyncio event loop (``BaseEventLoop._run_once``), each one an
  ``epoll`` wait and a pass over the ready callbacks. A hop from one task to another (a future
  set in one, awaited in the other) costs one; a wall clock pays each one's system call and,
  when the process had to sleep, its wake-up, which an instruction count does not show.
* **Python calls**: ``'call'`` events of ``sys.setprofile`` in this thread, a Python function
  entered or a coroutine or generator resumed (each frame of an await chain counts once per
  resumption); C functions are not counted.

``resources`` adds what ``getrusage`` and the garbage collector count for the process: minor
page faults, voluntary and involuntary context switches, collections, and user and system CPU
(microseconds; a time, not a count, there to show which of the two a difference is in).

The first is not exact where another process answers (a reply that is already there when the
loop looks saves a round): it is the mean over many operations, and stable to a tenth or so.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import sys
from typing import Any, Callable, Coroutine, Dict, Tuple

__all__ = ["LABELS", "count", "count_all", "resources"]

Once = Callable[[], Coroutine[Any, Any, Any]]


async def rounds(n: int, once: Once) -> float:
    """Event-loop iterations per ``await once()``, the mean of ``n``."""
    loop = asyncio.get_running_loop()
    inner = loop._run_once  # type: ignore[attr-defined]
    seen = [0]

    def counted() -> None:
        seen[0] += 1
        inner()

    loop._run_once = counted  # type: ignore[attr-defined]
    try:
        for _ in range(n):
            await once()
    finally:
        del loop._run_once  # type: ignore[attr-defined]
    return seen[0] / n


async def python_calls(n: int, once: Once) -> float:
    """Python frames entered or resumed per ``await once()``, the mean of ``n``."""
    seen = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen[0] += 1

    sys.setprofile(profile)
    try:
        for _ in range(n):
            await once()
    finally:
        sys.setprofile(None)
    return seen[0] / n


async def count(n: int, once: Once) -> Tuple[float, float]:
    """``(rounds, Python calls)`` per ``await once()``, each the mean of ``n`` in a pass of
    its own (the profiler slows the process, which changes how often a reply is already
    waiting)."""
    return await rounds(n, once), await python_calls(n, once)


#: The columns of ``count_all``, as a table heads them.
LABELS = {
    "rounds": "loop rounds",
    "python_calls": "Python calls",
    "minor_faults": "minor faults",
    "voluntary_switches": "vol. switch",
    "involuntary_switches": "invol. switch",
    "collections": "GCs",
    "user_us": "user us",
    "system_us": "system us",
}


async def resources(n: int, once: Once) -> Dict[str, float]:
    """Page faults, context switches, garbage collections and CPU per ``await once()``, the
    mean of ``n``."""
    collections = [0]

    def collected(phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            collections[0] += 1

    gc.callbacks.append(collected)
    before = resource.getrusage(resource.RUSAGE_SELF)
    try:
        for _ in range(n):
            await once()
    finally:
        after = resource.getrusage(resource.RUSAGE_SELF)
        gc.callbacks.remove(collected)
    return {
        "minor_faults": (after.ru_minflt - before.ru_minflt) / n,
        "voluntary_switches": (after.ru_nvcsw - before.ru_nvcsw) / n,
        "involuntary_switches": (after.ru_nivcsw - before.ru_nivcsw) / n,
        "collections": collections[0] / n,
        "user_us": (after.ru_utime - before.ru_utime) * 1e6 / n,
        "system_us": (after.ru_stime - before.ru_stime) * 1e6 / n,
    }


async def count_all(n: int, once: Once) -> Dict[str, float]:
    """``count``'s two counts and ``resources``' figures per ``await once()``, each pass of
    ``n`` on its own (the resources' pass runs without the profiler)."""
    rounds_, calls = await count(n, once)
    return {"rounds": rounds_, "python_calls": calls, **await resources(n, once)}
