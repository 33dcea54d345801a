"""A Kerman ``AgentLoop`` opened over a session where a pydantic-ai run under
``KermanDurability`` paused for approvals, or was killed after asking (its ``pydantic-ai/run``
has no ``run-end``): the loop's ``run()`` answers, the loop is idle between turns, it lists the
run's requests and decides them, and the run goes on from the session as it would have without
the loop. ``asyncio.wait_for`` only turns a hang into a failure."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from pai_approval_agent import PROMPT, build, lines  # noqa: E402
from pydantic_ai import DeferredToolRequests  # noqa: E402

import kerman  # noqa: E402
from kerman.integrations.pydantic_ai import RUN, RUN_END, KermanDurability  # noqa: E402

CHILD = Path(__file__).with_name("pai_approval_agent.py")
EXPECTED = "r7: refunded 5 on order 7; r8: over the limit"
BOUND = 30.0  # far more than a turn of the echo model takes: reached only by a hang


async def _loop_beside(store: kerman.FileStore) -> None:
    """A loop over session ``s``: one run, then the pydantic-ai run's requests decided by it."""
    loop = kerman.AgentLoop(kerman.models.EchoModel(), log=store.open("s"))
    try:
        assert loop.status == "idle"
        result = await asyncio.wait_for(loop.run("hello"), BOUND)
        assert result.turn == 1 and loop.status == "idle"
        pending = {d.call_id: d for d in loop.decisions}
        assert sorted(pending) == ["r7", "r8"] and {d.turn for d in pending.values()} == {0}
        loop.decide(pending["r7"].decision_id, kerman.Approve(), by="ops")
        loop.decide(pending["r8"].decision_id, kerman.Deny("over the limit"))
        assert loop.decisions == [] and loop.status == "idle"
    finally:
        await loop.aclose()
        loop.log.close()


def test_a_loop_runs_beside_a_paused_run_and_decides_its_requests(tmp_path):
    store = kerman.FileStore(str(tmp_path / "sessions"))
    durability = KermanDurability(store, session_id="s")
    agent = build(tmp_path, [durability])
    assert isinstance(asyncio.run(agent.run(PROMPT)).output, DeferredToolRequests)
    asyncio.run(_loop_beside(store))
    result = asyncio.run(agent.run(**durability.deferred()))
    assert result.output == EXPECTED
    assert lines(tmp_path, "refund.log") == ["7:5"]
    durability.close()


@pytest.mark.timeout(300)
def test_a_loop_runs_beside_a_run_killed_after_it_asked(tmp_path):
    where = str(tmp_path / "sessions")
    trace = tmp_path / "trace"
    trace.mkdir()

    def child(mode: str) -> subprocess.CompletedProcess[str]:
        args = [sys.executable, str(CHILD), "file", where, "s", str(trace), mode]
        return subprocess.run(args, capture_output=True, text=True, timeout=120)

    killed = child("run-die")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    store = kerman.FileStore(where)
    follower = store.follow("s")
    kinds = [e.type for e in follower.events()]
    follower.close()
    assert kinds[0] == RUN and RUN_END not in kinds and kinds.count("decision/requested") == 2
    asyncio.run(_loop_beside(store))
    resumed = child("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == f'"{EXPECTED}"'
    assert lines(trace, "refund.log") == ["7:5"]
