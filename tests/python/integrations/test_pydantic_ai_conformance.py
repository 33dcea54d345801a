"""Conformance of pydantic-ai's durable engines: the agents of ``pai_conformance.py`` (tools,
structured output, streaming, deferred approvals) under ``KermanDurability`` and under
``DBOSDurability`` on SQLite, each SIGKILLed at a journal boundary (right after the engine's
k-th journal write) or inside a write tool right after its effect, then restarted in a new
process that is given no prompt (it finds the interrupted run in the engine's journal).

Kerman runs with ``sync="units"`` here (every unit durable before the next, so each is a journal
write); with the default ``sync="effects"`` the kills inside each write tool are checked too (the
marker's flush before the body made every earlier unit durable).

Checked for both engines: the restarted run ends with the uninterrupted run's output (the prompt
was not lost) and no model response that was journalled is requested again. Write tools:
under Kerman each write happens once (a call in doubt is reconciled from the tool's ledger);
under DBOS a function tool is not a step, so a restarted workflow runs every tool call it
replays again: the test pins that (writes = writes before the kill + 1), which docs/frameworks.md
reports.

Default run: every agent uninterrupted, then a sample of kill points per engine and agent
(inside each write tool, or the middle journal write of an agent that writes nothing).
``KERMAN_SLOW=1``: every journal write, and inside each write tool.
``python test_pydantic_ai_conformance.py`` prints the table of docs/frameworks.md."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("dbos")

HERE = Path(__file__).parent
CHILD = HERE / "pai_conformance.py"
sys.path.insert(0, str(HERE))
from pai_conformance import AGENTS, WRITES  # noqa: E402

ENGINES = ["kerman", "dbos"]
SLOW = os.environ.get("KERMAN_SLOW") == "1"


def _child(engine: str, agent: str, work: Path, kill: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), engine, agent, str(work), kill], capture_output=True, text=True, timeout=180, cwd=str(work)
    )


def _lines(work: Path, name: str) -> list[str]:
    path = work / name
    return path.read_text().splitlines() if path.exists() else []


@cache
def uninterrupted(engine: str, agent: str) -> dict[str, Any]:
    """The agent's run without a kill: its output, journal writes and model calls."""
    with tempfile.TemporaryDirectory() as d:
        done = _child(engine, agent, Path(d), "0")
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.splitlines()[-1])
        return {"output": result["output"], "writes": result["writes"], "model": len(_lines(Path(d), "model.log"))}


def killed_and_restarted(engine: str, agent: str, kill: str, work: Path) -> dict[str, Any]:
    """Kill at ``kill``, restart with no prompt; what the two processes did."""
    killed = _child(engine, agent, work, kill)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    before = {tool: len(_lines(work, f"{tool}.write.log")) for tool in WRITES[agent]}
    restarted = _child(engine, agent, work, "0")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    return {
        "output": json.loads(restarted.stdout.splitlines()[-1])["output"],
        "model": len(_lines(work, "model.log")),
        "before": before,
        "writes": {tool: len(_lines(work, f"{tool}.write.log")) for tool in WRITES[agent]},
    }


def kill_points(engine: str, agent: str, every: bool) -> list[str]:
    """Every journal write (``every``), else a sample: inside each write tool, or the middle
    journal write of an agent that writes nothing."""
    n = uninterrupted(engine, agent)["writes"]
    inside = [f"in:{tool}" for tool in WRITES[agent]]
    if every:
        return [str(k) for k in range(1, n + 1)] + inside
    return inside or [str(max(1, n // 2))]


CASES = [(engine, agent) for engine in ENGINES for agent in AGENTS]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("engine, agent", CASES, ids=[f"{e}-{a}" for e, a in CASES])
def test_killed_and_restarted_ends_as_uninterrupted(engine, agent, tmp_path):
    base = uninterrupted(engine, agent)
    for i, kill in enumerate(kill_points(engine, agent, SLOW)):
        work = tmp_path / f"k{i}"
        work.mkdir()
        got = killed_and_restarted(engine, agent, kill, work)
        where = f"{engine} {agent} killed at {kill}"
        assert got["output"] == base["output"], where
        # No journalled model response was requested again (the kills land after a write).
        assert got["model"] == base["model"], where
        for tool, count in got["writes"].items():
            if engine == "kerman":
                assert count == 1, f"{where}: {tool} ran {count} times"
            else:  # DBOS replays the workflow's code, function tools included
                assert count == got["before"][tool] + 1, f"{where}: {tool} ran {count} times"


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("agent", [a for a in AGENTS if WRITES[a]])
def test_the_default_sync_killed_inside_each_write_ends_as_uninterrupted(agent, tmp_path):
    base = uninterrupted("kerman-effects", agent)
    for tool in WRITES[agent]:
        work = tmp_path / tool
        work.mkdir()
        got = killed_and_restarted("kerman-effects", agent, f"in:{tool}", work)
        where = f"kerman-effects {agent} killed in {tool}"
        assert got["output"] == base["output"], where
        assert got["model"] == base["model"], where
        assert all(count == 1 for count in got["writes"].values()), (where, got["writes"])


def table() -> str:
    """The results table of docs/frameworks.md, measured at every journal write."""
    rows = [
        "| agent | engine | kill points | same output | model requests repeated | write tool calls run twice |",
        "|---|---|---|---|---|---|",
    ]
    for agent in AGENTS:
        for engine in ENGINES:
            base = uninterrupted(engine, agent)
            points = kill_points(engine, agent, True)
            same = repeated = twice = 0
            for kill in points:
                with tempfile.TemporaryDirectory() as d:
                    got = killed_and_restarted(engine, agent, kill, Path(d))
                same += got["output"] == base["output"]
                repeated += got["model"] - base["model"]
                twice += sum(1 for count in got["writes"].values() if count > 1)
            rows.append(f"| {agent} | {engine} | {len(points)} | {same}/{len(points)} | {repeated} | {twice} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
