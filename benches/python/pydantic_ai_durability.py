"""What ``KermanDurability`` adds to a pydantic-ai run: the same agent (a ``FunctionModel`` that
calls one tool, then answers) run with no durability and journalled in a Kerman session on a
``MemoryStore``, on a ``FileStore`` (``durability="none"``: the journal's own cost, no fsync) and
on a ``FileStore`` in the default ``"checkpoint"`` mode, with the default ``sync="effects"`` (the
session written through; the run waits once, before it returns: its tool is a read) and with
``sync="units"`` (it waits for the disk after every unit). Each run has a session of its own, as
a new conversation would, except in the rows whose runs all go to one session opened beforehand
(a conversation's later runs). A row with pydantic-ai's
durable units and a backend that records nothing (``NoJournal``) separates what pydantic-ai's
durable-execution machinery costs from what the Kerman journal adds. With ``dbos`` installed, a
last row runs the agent under ``DBOSDurability`` on SQLite, each run a DBOS workflow.

    python3 benches/python/pydantic_ai_durability.py [--runs 100] [--reps 5]
    python3 benches/python/pydantic_ai_durability.py --callgrind [--sizes 10,30] [--rows none,memory,...]
    python3 benches/python/pydantic_ai_durability.py --syscalls [--sizes 10,30] [--rows ...]

A run is three durable units (model, tool, model), so the journal appends five events (run,
three units, run-end) and awaits one flush with ``sync="effects"`` (the run's end, with the units
before it) or three with ``sync="units"`` (one per unit; the end is not awaited, it rides with
the store's next sync); in a new session of a syncing file store the run's start is flushed
too, not awaited. Each figure is the best of ``--reps`` repetitions of ``--runs`` runs (a
loaded host only adds time; the repetitions interleave the rows), per run; the ratios to DBOS are
the median of each repetition's own; prints a table and one JSON line.

``--callgrind`` counts instructions instead (valgrind's callgrind, every thread of the process)
and ``--syscalls`` system calls (``strace -f -c``): each row in a process of its own that builds
as many agents at both ``--sizes`` and runs that many of them (closing their sessions), the
difference per run. Instructions are the same for the same binary whatever else the host does;
they leave out the kernel's and the disk's time (the syscall counts show those calls).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Awaitable, Callable, Dict, List

from pydantic_ai import Agent
from pydantic_ai.durable_exec import BaseDurabilityCapability, JournalCallableOperationBackend, RoleBasedOperationConfig
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import _callgrind
import kerman
from kerman.integrations.pydantic_ai import KermanDurability


def model(messages: List[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("clock", {"tz": "UTC"})])
    return ModelResponse(parts=[TextPart(f"It is {returns[0].content}.")])


class _RunBody(JournalCallableOperationBackend[None]):
    async def execute(self, *, operation_id: Any, name: str, body: Callable[[], Awaitable[object]], cache_key: Any, config: None) -> object:
        return await body()


class NoJournal(BaseDurabilityCapability[None]):
    """KermanDurability's engine spec with a backend that runs each unit and records nothing:
    what pydantic-ai's durable-execution machinery costs by itself (units, JSON codec)."""

    engine_spec = KermanDurability.engine_spec

    @property
    def in_durable_context(self) -> bool:
        return True

    def get_durable_operation_backend(self) -> _RunBody:
        none = RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None)
        return _RunBody(agent_name=self.name, default_model_id=self.default_model_id, config=none)


def agent(capabilities: List[Any]) -> Agent[None, str]:
    a = Agent(FunctionModel(model), name="bench", capabilities=capabilities)

    @a.tool_plain(metadata={"kerman_effect": "read"})  # a read: no started marker (a write would add one append)
    def clock(tz: str) -> str:
        """Returns the time in a time zone."""
        return f"12:00 {tz}"

    return a


async def runs(n: int, make: Callable[[int], Agent[None, str]], after: Callable[[], None]) -> float:
    """Seconds per run over ``n`` runs (agents built before the clock starts)."""
    agents = [make(i) for i in range(n)]
    start = time.perf_counter()
    for a in agents:
        out = await a.run("What time is it?")
        assert out.output == "It is 12:00 UTC.", out.output
    elapsed = time.perf_counter() - start
    after()
    return elapsed / n


def dbos_row(root: str, n: int) -> Callable[[], float] | None:
    """``DBOSDurability`` on SQLite: each run one DBOS workflow (``None`` without ``dbos``)."""
    try:
        from dbos import DBOS
        from pydantic_ai.durable_exec.dbos import DBOSDurability
    except ImportError:
        return None
    DBOS(config={"name": "kerman-bench", "system_database_url": f"sqlite:///{root}/dbos.sqlite", "log_level": "WARNING"})
    dbos_agent = agent([DBOSDurability()])

    @DBOS.workflow()
    async def workflow(prompt: str) -> str:
        return (await dbos_agent.run(prompt)).output

    DBOS.launch()

    async def timed() -> float:
        start = time.perf_counter()
        for _ in range(n):
            assert await workflow("What time is it?") == "It is 12:00 UTC."
        return (time.perf_counter() - start) / n

    return lambda: asyncio.run(timed())


#: The rows ``--callgrind`` and ``--syscalls`` count, by short name (the table's rows; DBOS
#: when ``dbos`` is installed).
CHILD_ROWS = {
    "none": "no durability",
    "nojournal": "pydantic-ai durable units, no journal",
    "memory": "KermanDurability, MemoryStore",
    "file-none": "KermanDurability, FileStore none",
    "file-checkpoint": "KermanDurability, FileStore checkpoint",
    "file-checkpoint-units": "KermanDurability, FileStore checkpoint, sync=units",
    "one-session": "KermanDurability, FileStore checkpoint, one session",
    "one-session-units": "KermanDurability, FileStore checkpoint, one session, sync=units",
    "dbos": "DBOSDurability, SQLite",
}


def child(row: str, built: int, ran: int) -> None:
    """``--child ROW BUILT RAN``: builds ``BUILT`` agents of row ``ROW`` and runs the first
    ``RAN`` of them, one run each (under callgrind or strace). Both sizes build as many agents,
    so the difference between two sizes is the runs' alone, as the timed rows exclude building."""
    with tempfile.TemporaryDirectory() as root:
        if row == "dbos":
            go = dbos_row(root, ran)
            assert go is not None, "dbos is not installed"
            go()
            from dbos import DBOS

            DBOS.destroy()
            return
        sync = "units" if row.endswith("-units") else None
        one = None
        if row.startswith("one-session"):
            one = KermanDurability(kerman.FileStore(f"{root}/o"), session_id="conversation", sync=sync)
        stores = {"memory": kerman.MemoryStore, "file-none": lambda: kerman.FileStore(f"{root}/n", durability="none")}
        store = stores.get(row, lambda: kerman.FileStore(f"{root}/c"))()

        caps: List[KermanDurability[None]] = [one] if one is not None else []

        def make(i: int) -> Agent[None, str]:
            if row == "none":
                return agent([])
            if row == "nojournal":
                return agent([NoJournal()])
            if one is None:
                caps.append(KermanDurability(store, session_id=f"s{i}", sync=sync))
            return agent([caps[-1]])

        agents = [make(i) for i in range(built)]
        if one is not None:
            _ = one.log

        async def go() -> None:
            for a in agents[:ran]:
                assert (await a.run("What time is it?")).output == "It is 12:00 UTC."
            for cap in caps:
                cap.close()

        asyncio.run(go())


def measured(tool: List[str], row: str, built: int, ran: int) -> str:
    """Runs ``--child`` under ``tool`` (its output file ``{out}``) and returns that file's text."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/out"
        argv = [a.replace("{out}", out) for a in tool] + [sys.executable, os.path.abspath(__file__)]
        subprocess.run(argv + ["--child", row, str(built), str(ran)], capture_output=True, text=True, check=True, env=_callgrind.seeded())
        with open(out) as f:
            return f.read()


#: The system calls ``--syscalls`` reports per run (the rest are summed into ``all``).
SYSCALLS = ("fsync", "fdatasync", "openat", "close", "write", "pwrite64", "futex", "clone", "clone3", "mkdir", "rename")


def syscalls(row: str, built: int, ran: int) -> Dict[str, int]:
    """Calls per system call name of the child and all its threads (``strace -f -c``)."""
    text = measured(["strace", "-f", "-c", "-o", "{out}"], row, built, ran)
    calls: Dict[str, int] = {}
    for line in text.splitlines():
        cols = line.split()
        # A row: % time, seconds, usecs/call, calls, [errors,] name.
        if len(cols) >= 5 and cols[3].isdigit() and not cols[-1].startswith("total"):
            calls[cols[-1]] = int(cols[3])
    calls["all"] = sum(calls.values())
    return calls


def counted(kind: str, sizes: str, rows: List[str]) -> None:
    """``--callgrind`` or ``--syscalls``: per run, the difference between two numbers of runs."""
    if kind == "callgrind":
        _callgrind.require_valgrind()
    elif shutil.which("strace") is None:
        raise SystemExit("strace is not installed (Debian: apt-get install strace)")
    small, large = (int(n) for n in sizes.split(","))
    if "dbos" in rows and dbos_missing():
        rows = [r for r in rows if r != "dbos"]
    per: Dict[str, Any] = {}
    for row in rows:
        print(f"  {row}: {kind} at {small} and {large} runs...", file=sys.stderr, flush=True)
        if kind == "callgrind":
            # As many agents built at both sizes (the child's BUILT): the difference is the runs' alone.
            per[row] = _callgrind.per_unit(__file__, ["--child", row, large], small, large)
        else:
            a, b = syscalls(row, large, small), syscalls(row, large, large)
            per[row] = {k: round((b.get(k, 0) - a.get(k, 0)) / (large - small), 2) for k in (*SYSCALLS, "all")}
        # Each row as it is counted: a slow host's partial run still says something.
        print(f"  {row}: {per[row]}", file=sys.stderr, flush=True)
    if kind == "callgrind":
        base = per.get("none", 0.0)
        print(f"{'instructions per pydantic-ai run (3 units)':52}  {'per run':>12}  {'overhead':>12}")
        for row, n in per.items():
            print(f"{CHILD_ROWS[row]:52}  {n:12,.0f}  {n - base:12,.0f}")
        if "dbos" in per and "none" in per:
            for row in ("file-checkpoint", "file-checkpoint-units", "one-session", "one-session-units", "memory"):
                if row in per:
                    print(f"DBOS overhead / {CHILD_ROWS[row]} overhead: {(per['dbos'] - base) / max(per[row] - base, 1):.1f}x")
    else:
        print(f"{'system calls per pydantic-ai run':52}  " + "  ".join(f"{k:>9}" for k in (*SYSCALLS, "all")))
        for row, calls in per.items():
            print(f"{CHILD_ROWS[row]:52}  " + "  ".join(f"{calls[k]:9g}" for k in (*SYSCALLS, "all")))
    print(json.dumps({"bench": f"pydantic_ai_durability_{kind}", "sizes": [small, large], "per_run": per}))


def dbos_missing() -> bool:
    try:
        import dbos  # noqa: F401
    except ImportError:
        return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true", help="count instructions per run (valgrind) instead of timing")
    parser.add_argument("--syscalls", action="store_true", help="count system calls per run (strace -f) instead of timing")
    parser.add_argument("--sizes", default="10,30", help="with --callgrind/--syscalls: the two numbers of runs")
    parser.add_argument("--rows", default=",".join(CHILD_ROWS), help="with --callgrind/--syscalls: the rows, by short name")
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    args = parser.parse_args()
    if args.callgrind or args.syscalls:
        counted("callgrind" if args.callgrind else "syscalls", args.sizes, args.rows.split(","))
        return

    def plain(i: int) -> Agent[None, str]:
        return agent([])

    def journalled(store_factory: Callable[[], Any], sync: str | None = None) -> Callable[[], float]:
        caps: List[KermanDurability[None]] = []
        store = store_factory()

        def make(i: int) -> Agent[None, str]:
            cap: KermanDurability[None] = KermanDurability(store, session_id=f"s{len(caps)}", sync=sync)
            caps.append(cap)
            return agent([cap])

        def close() -> None:
            for cap in caps:
                cap.close()

        return lambda: asyncio.run(runs(args.runs, make, close))

    def one_session(store_factory: Callable[[], Any], sync: str | None = None) -> float:
        """Every run in one session, opened before the clock starts: a conversation's later runs."""
        cap: KermanDurability[None] = KermanDurability(store_factory(), session_id="conversation", sync=sync)
        _ = cap.log
        return asyncio.run(runs(args.runs, lambda i: agent([cap]), cap.close))

    with tempfile.TemporaryDirectory() as root:
        rows: Dict[str, Callable[[], float]] = {
            "no durability": lambda: asyncio.run(runs(args.runs, plain, lambda: None)),
            "pydantic-ai durable units, no journal": lambda: asyncio.run(runs(args.runs, lambda i: agent([NoJournal()]), lambda: None)),
            "KermanDurability, MemoryStore": journalled(kerman.MemoryStore),
        }
        rep = iter(range(10**6))
        rows["KermanDurability, FileStore none"] = lambda: journalled(lambda: kerman.FileStore(f"{root}/n{next(rep)}", durability="none"))()
        rows["KermanDurability, FileStore checkpoint"] = lambda: journalled(lambda: kerman.FileStore(f"{root}/c{next(rep)}"))()
        rows["KermanDurability, FileStore checkpoint, sync=units"] = lambda: journalled(
            lambda: kerman.FileStore(f"{root}/u{next(rep)}"), "units"
        )()
        rows["KermanDurability, FileStore checkpoint, one session"] = lambda: one_session(lambda: kerman.FileStore(f"{root}/o{next(rep)}"))
        rows["KermanDurability, FileStore checkpoint, one session, sync=units"] = lambda: one_session(
            lambda: kerman.FileStore(f"{root}/p{next(rep)}"), "units"
        )
        dbos = dbos_row(root, args.runs)
        if dbos is not None:
            rows["DBOSDurability, SQLite"] = dbos
        # Repetitions interleave the rows, so a burst of load on a shared host reaches each row
        # alike rather than the ones measured at that moment.
        seen: Dict[str, List[float]] = {name: [] for name in rows}
        for _ in range(args.reps):
            for name, fn in rows.items():
                seen[name].append(fn())
        best = {name: min(times) for name, times in seen.items()}
        if dbos is not None:
            from dbos import DBOS

            DBOS.destroy()

    base = best["no durability"]
    print(f"{'per pydantic-ai run (3 units)':52}  {'µs/run':>9}  {'overhead µs':>11}")
    for name, seconds in best.items():
        print(f"{name:52}  {seconds * 1e6:9.0f}  {(seconds - base) * 1e6:11.0f}")
    ratios: Dict[str, float] = {}
    if "DBOSDurability, SQLite" in best:
        # The target, as ratios measured in this one run: DBOS's overhead per durable run
        # over Kerman's (a new session per run, as DBOS starts a new workflow per run; and a
        # conversation's later runs in one session). Both engines run on pydantic-ai's durable
        # units: what each adds is measured from the cheaper of the two rows without a journal.
        # The headline is the median of each repetition's own ratio (the rows of one repetition
        # ran within seconds of each other, so a host that speeds up or slows down between
        # repetitions moves all of them); the ratio of the best figures is printed beside it.
        def ratio(at: Callable[[str], float], name: str) -> float:
            floor = min(at("no durability"), at("pydantic-ai durable units, no journal"))
            return (at("DBOSDurability, SQLite") - floor) / max(at(name) - floor, 1e-6)

        for name in (
            "KermanDurability, FileStore checkpoint",
            "KermanDurability, FileStore checkpoint, sync=units",
            "KermanDurability, FileStore checkpoint, one session",
            "KermanDurability, FileStore checkpoint, one session, sync=units",
        ):
            each = sorted(ratio(lambda row, i=i: seen[row][i], name) for i in range(args.reps))
            ratios[name] = round(each[len(each) // 2], 1)
            of_best = ratio(best.__getitem__, name)
            print(f"DBOS overhead / {name} overhead: {ratios[name]}x (median of {args.reps} repetitions; best figures: {of_best:.1f}x)")
    us = {k: round(v * 1e6, 1) for k, v in best.items()}
    print(json.dumps({"bench": "pydantic_ai_durability", "us_per_run": us, "dbos_over_kerman": ratios}))


if __name__ == "__main__":
    main()
