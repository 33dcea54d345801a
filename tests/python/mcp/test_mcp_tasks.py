"""Long-running MCP calls as tasks (the 2026-07-28 revision's tasks extension,
``docs/mcp.md#long-running-tasks``), against ``mcp_task_server.py`` (the ``mcp`` package's
server side) over stdio and streamable HTTP: the task id is logged against the call (a
``tool/progress`` record with ``task``) before the client waits; the call's result is the
task's; cancelling the turn cancels the task. The client process is killed while the task
runs; a loop in another process takes the session up, polls the logged task, and logs the
call's one ``tool/result``, the task's body (which counts its runs in a file) not started
again."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

pytest.importorskip("mcp")

from task_helpers import endings, events_of, first_task, killed, lines, model, one_turn, server, take_up, task_url, tasks, the_result  # noqa: E402, F401 (task_url, tasks: fixtures)

import kerman  # noqa: E402

CHILD = str(Path(__file__).with_name("task_child.py"))

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL, detached workers")


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_call_that_becomes_a_task_logs_its_id_then_gets_the_task_s_result(transport: str, tasks: Path, request: Any) -> None:  # noqa: F811 - the fixture
    url = request.getfixturevalue("task_url") if transport == "http" else None
    (tasks / "gate").touch()  # the task finishes as soon as it runs

    events = one_turn(model("slow"), server(str(tasks), url))
    [record] = [e for e in events if e.type == "tool/progress" and e.data.get("task")]
    [result] = [e for e in events if e.type == "tool/result"]
    assert record.seq < result.seq and record.data["callId"] == "c1"
    assert (tasks / f"task-{record.data['task']}.json").exists()  # the server's id
    assert kerman.events.view(record).task == record.data["task"]
    assert the_result(events) == "slow a done"
    assert lines(tasks, "runs") == ["a"]
    assert endings(events) == ["completed"]


def test_without_tasks_the_server_runs_the_call_as_an_ordinary_call(tasks: Path) -> None:  # noqa: F811 - the fixture
    events = one_turn(model("slow"), server(str(tasks), tasks=False))
    assert the_result(events) == "slow a (not a task)"
    assert not [e for e in events if e.type == "tool/progress"]
    assert lines(tasks, "runs") == []


def test_cancelling_the_turn_cancels_the_task(tasks: Path) -> None:  # noqa: F811 - the fixture
    async def main() -> Optional[str]:
        loop = kerman.AgentLoop(model("slow"), tools=[server(str(tasks))])
        logged = first_task(loop.log)
        loop.followup("go")
        task = await logged
        loop.cancel()
        await loop.when_idle()
        await loop.aclose()
        return task

    task = asyncio.run(main())
    assert (tasks / f"cancel-{task}").exists()  # tasks/cancel reached the server before the turn ended
    assert json.loads((tasks / f"task-{task}.json").read_text())["status"] == "cancelled"


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_session_resumed_after_the_client_was_killed_polls_the_logged_task(
    transport: str,
    tmp_path: Path,
    tasks: Path,  # noqa: F811 - the fixture
    request: Any,
) -> None:
    url = request.getfixturevalue("task_url") if transport == "http" else None
    root = tmp_path / "store"
    task = killed(CHILD, str(root), str(tasks), *([url] if url else []))["task"]
    before = events_of(root)
    assert [e.type for e in before if e.type in ("tool/call", "tool/result")] == ["tool/call"]  # in flight, not closed
    assert [e.data.get("task") for e in before if e.type == "tool/progress"] == [task]
    (tasks / "gate").touch()  # the task may finish now, with no client connected

    events = take_up(root, model("slow"), server(str(tasks), url))
    assert the_result(events) == "slow a done"
    [result] = [e.data for e in events if e.type == "tool/result"]
    assert "error" not in result
    assert lines(tasks, "runs") == ["a"]  # polled, not run again
    assert endings(events) == ["completed"]


def test_a_server_with_durable_input_follows_its_tasks_too(tasks: Path) -> None:  # noqa: F811 - the fixture
    (tasks / "gate").touch()
    events = one_turn(model("slow"), server(str(tasks), durable_input=True))
    assert [e.data["callId"] for e in events if e.type == "tool/progress" and e.data.get("task")] == ["c1"]
    assert the_result(events) == "slow a done"
    assert lines(tasks, "runs") == ["a"]
