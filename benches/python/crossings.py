"""Native→Python operations per loop turn: how often the native driver calls into Python.

Run in a process of its own (``make bench`` runs it; or ``python3 benches/python/crossings.py``).
It runs the P3 shape (one prompt per turn, no listener) and the P4 shape (one tool call per turn)
and counts, per turn, while the driver's task runs:

* **calls**: Python functions entered straight from native code (the frame below them is
  asyncio's task step, which is where the native driver runs), split into the user's own
  functions (the model, the tool) and everything else (Kerman's Python, payload constructors);
* **attribute operations** the native side makes on the ``AgentLoop`` object (reads and writes
  of its attributes, counted by a subclass that overrides ``__getattribute__``/``__setattr__``
  and attributes an access to native code the same way).

This is a probe, not a timing: the counts are deterministic for a given build, so two builds
compare exactly. ``--json`` prints the numbers as JSON (bench.py reads them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, Dict, List

import kerman

_ASYNCIO = os.path.dirname(asyncio.__file__) + os.sep
TURNS = 200


def _in_driver() -> bool:
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return False
    return task is not None and type(task.get_coro()).__name__ == "Driver"


def _native_access(caller: Any) -> bool:
    """Whether an attribute access was made by the native driver: the topmost Python frame is
    asyncio's task step (so no Python code of ours is running) in the driver's task."""
    return caller.f_code.co_filename.startswith(_ASYNCIO) and _in_driver()


def _from_native(frame: Any) -> bool:
    """Whether `frame` was entered from the native driver: it runs in the driver's task (whose
    coroutine is the native ``Driver``) and the Python frame below it is asyncio's task step,
    which is what resumed the driver."""
    below = frame.f_back
    if below is not None and not below.f_code.co_filename.startswith(_ASYNCIO):
        return False
    return _in_driver()


def measure(tool: bool) -> Dict[str, float]:
    counts = {"user": 0, "other": 0, "attributes": 0}
    names: Dict[str, int] = {}
    user_codes = set()
    text = kerman.ModelReply("The last commit adds group commit to the writer thread.")
    call = kerman.ModelReply([{"type": "tool-call", "id": "call-1", "name": "git_log", "arguments": '{"n": 1}'}])
    watching = [False]

    async def model(request: Any) -> Any:
        return call if tool and request.step == 1 else text

    async def git_log(args: Any, ctx: Any) -> str:
        return "commit 4f1c2e: add group commit"

    user_codes.update({model.__code__, git_log.__code__})

    class Probe(kerman.AgentLoop):
        def __getattribute__(self, name: str) -> Any:
            if watching[0] and _native_access(sys._getframe(1)):
                counts["attributes"] += 1
                names["." + name] = names.get("." + name, 0) + 1
            return object.__getattribute__(self, name)

        def __setattr__(self, name: str, value: Any) -> None:
            if watching[0] and _native_access(sys._getframe(1)):
                counts["attributes"] += 1
                names["." + name + " ="] = names.get("." + name + " =", 0) + 1
            object.__setattr__(self, name, value)

    probe_codes = {Probe.__getattribute__.__code__, Probe.__setattr__.__code__}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not watching[0] or frame.f_code.co_filename.startswith(_ASYNCIO):
            return
        if frame.f_code in probe_codes:  # counted as attribute operations
            return
        if not _from_native(frame):
            return
        if frame.f_code in user_codes:
            counts["user"] += 1
        else:
            counts["other"] += 1
            key = f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)})"
            names[key] = names.get(key, 0) + 1

    async def main() -> None:
        loop = Probe(model)
        if tool:
            loop.tool(git_log)
        # One turn first: the first request's one-off work (its header) is not counted.
        loop.followup("warm up")
        await loop.when_idle()
        sys.setprofile(profile)
        watching[0] = True
        for i in range(TURNS):
            loop.followup(f"prompt {i}")
            await loop.when_idle()
        watching[0] = False
        sys.setprofile(None)
        await loop.aclose()

    asyncio.run(main())
    per_turn = {k: v / TURNS for k, v in counts.items()}
    per_turn["total"] = per_turn["user"] + per_turn["other"] + per_turn["attributes"]
    per_turn["top"] = sorted(((n / TURNS, k) for k, n in names.items()), reverse=True)[:12]  # type: ignore[assignment]
    return per_turn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = ap.parse_args()
    out: Dict[str, Any] = {"P3": measure(False), "P4": measure(True)}
    if args.json:
        print(json.dumps(out))
        return 0
    for shape, m in out.items():
        print(
            f"{shape}: {m['total']:.1f} native→Python operations per turn: {m['user']:.1f} user calls, "
            f"{m['other']:.1f} other calls, {m['attributes']:.1f} AgentLoop attribute operations"
        )
        top: List[Any] = m["top"]
        for n, name in top:
            print(f"    {n:5.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
