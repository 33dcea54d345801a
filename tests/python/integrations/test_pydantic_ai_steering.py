"""In-run steering under KermanDurability: the run's pending messages are the session's inbox.

A message put in the inbox (``durability.enqueue``, pydantic-ai's own ``AgentRun.enqueue``,
``store.enqueue`` from another process) reaches the running run at its next claim point, claimed
by one splice naming the run (``by``); a child process SIGKILLed between the enqueue and the claim,
right after the claim, and right after the model response that read it, finishes in a new
process with the message delivered exactly once."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from pai_steer_agent import PROMPT, STEER, build, model_calls  # noqa: E402
from pydantic_ai import Agent  # noqa: E402

import kerman  # noqa: E402
from conftest import fresh_schema_dsn  # noqa: E402
from kerman.integrations.pydantic_ai import KermanDurability  # noqa: E402

CHILD = Path(__file__).with_name("pai_steer_agent.py")
SPLICED = "agent/inbox/spliced"


def _claims(log: kerman.SessionLog) -> list[dict]:
    return [e.data["by"] for e in log.events(types=[SPLICED]) if "by" in e.data]


def _inserted(log: kerman.SessionLog) -> list[str]:
    return [m["content"][0]["text"] for e in log.events(types=[SPLICED]) for m in e.data["inserted"]]


def test_a_message_enqueued_while_the_run_runs_reaches_its_next_model_request(tmp_path):
    durability = KermanDurability(kerman.MemoryStore(), session_id="s")
    agent = build(tmp_path, [durability], on_tool=lambda: durability.enqueue(STEER))
    result = asyncio.run(agent.run(PROMPT))
    assert result.output == f"seen: {PROMPT} | {STEER}"
    assert model_calls(tmp_path) == [[PROMPT], [PROMPT, STEER]]
    log = durability.log
    # One insert, then one claim that names the run and its claim point (1: the second request).
    assert _inserted(log) == [STEER]
    assert _claims(log) == [{"kind": "pydantic-ai", "run": 1, "at": 1}]
    assert len(durability.inbox) == 0
    durability.close()


def test_a_message_pending_before_the_run_goes_with_its_first_request(tmp_path):
    durability = KermanDurability(kerman.MemoryStore(), session_id="s")
    message = durability.enqueue("be brief")
    assert message.text == "be brief" and message.id in durability.inbox
    result = asyncio.run(build(tmp_path, [durability]).run(PROMPT))
    assert result.output == f"seen: {PROMPT} | be brief"
    assert model_calls(tmp_path)[0] == [PROMPT, "be brief"]
    assert _claims(durability.log) == [{"kind": "pydantic-ai", "run": 1, "at": 0}]
    durability.close()


def test_when_idle_continues_the_run_where_it_would_have_ended(tmp_path):
    durability = KermanDurability(kerman.MemoryStore(), session_id="s")
    agent = build(tmp_path, [durability], on_tool=lambda: durability.enqueue("and Paris?", priority="when_idle"))
    result = asyncio.run(agent.run(PROMPT))
    # Not at the second request (it is not asap): when the agent would end, then once more.
    assert model_calls(tmp_path) == [[PROMPT], [PROMPT], [PROMPT, "and Paris?"]]
    assert result.output == f"seen: {PROMPT} | and Paris?"
    assert _claims(durability.log) == [{"kind": "pydantic-ai", "run": 1, "at": 2}]
    with pytest.raises(ValueError, match='priority must be "asap" or "when_idle", not \'later\''):
        durability.enqueue("x", priority="later")
    durability.close()


def test_pydantic_ais_own_enqueue_goes_through_the_inbox(tmp_path):
    durability = KermanDurability(kerman.MemoryStore(), session_id="s")
    agent = build(tmp_path, [durability])

    sent: list = []

    async def main() -> str:
        async with agent.iter(PROMPT) as run:
            async for node in run:
                if Agent.is_call_tools_node(node) and not sent:
                    sent.append(run.enqueue("from iter"))
        assert run.result is not None
        return run.result.output

    assert asyncio.run(main()) == f"seen: {PROMPT} | from iter"
    assert _inserted(durability.log) == ["from iter"]
    assert _claims(durability.log) == [{"kind": "pydantic-ai", "run": 1, "at": 1}]
    durability.close()


def test_the_claim_is_on_the_timeline_and_the_queue_in_the_ui_streams(tmp_path, capsys):
    from kerman import cli
    from kerman.ui import agui

    root = tmp_path / "sessions"
    durability = KermanDurability(kerman.FileStore(str(root)), session_id="s")
    asyncio.run(build(tmp_path, [durability], on_tool=lambda: durability.enqueue(STEER)).run(PROMPT))
    updates = [u.data for u in agui(durability.log.events(), thread_id="s")]
    durability.close()
    queued = [u for u in updates if u["type"] in ("STATE_SNAPSHOT", "STATE_DELTA") and STEER in json.dumps(u)]
    assert queued, updates
    capsys.readouterr()
    assert cli.main(["log", "show", str(root), "s"]) == 0
    out = capsys.readouterr().out
    assert 'claim next-step ×1 by {"kind":"pydantic-ai","run":1,"at":1}' in out, out


@pytest.mark.timeout(120)
def test_a_message_from_another_process_reaches_the_running_run(tmp_path):
    """PostgreSQL: another store object (as another process would) stages the message with
    ``store.enqueue``; the run's inbox takes it and the run's next request carries it."""
    dsn = fresh_schema_dsn()
    other = kerman.PostgresStore(dsn)
    durability = KermanDurability(kerman.PostgresStore(dsn), session_id="s")

    async def from_elsewhere() -> None:
        staged = await asyncio.to_thread(other.enqueue, "s", STEER, target="next-step")
        # The owner takes staged input on its store's thread; the tool waits for it to arrive.
        for _ in range(2000):
            if staged.id in durability.inbox:
                return
            await asyncio.sleep(0.005)
        raise AssertionError("the staged message never reached the run's inbox")

    result = asyncio.run(build(tmp_path, [durability], on_tool=from_elsewhere).run(PROMPT))
    assert result.output == f"seen: {PROMPT} | {STEER}"
    assert _claims(durability.log) == [{"kind": "pydantic-ai", "run": 1, "at": 1}]
    durability.close()


def _child(where: str, trace: Path, mode: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, str(CHILD), "file", where, "s", str(trace), mode]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["enqueue-die", "claim-die", "answer-die"])
def test_a_kill_around_the_claim_loses_nothing_and_delivers_nothing_twice(tmp_path, mode):
    where = str(tmp_path / "sessions")
    trace = tmp_path / "trace"
    trace.mkdir()
    killed = _child(where, trace, mode)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = _child(where, trace, "plain")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == f"seen: {PROMPT} | {STEER}"
    # The steering message reached exactly one model request (the one after the tool), and the
    # model was asked for a logged answer again in no process.
    calls = model_calls(trace)
    assert [c for c in calls if STEER in c] == [[PROMPT, STEER]]
    assert len(calls) == {"enqueue-die": 2, "claim-die": 2, "answer-die": 2}[mode]
    log = kerman.FileStore(where).open("s")
    try:
        assert _inserted(log) == [STEER]
        assert _claims(log) == [{"kind": "pydantic-ai", "run": 1, "at": 1}]
        assert kerman.InboxProjection.fold(log.splices()).items() == []
    finally:
        log.close()
