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
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, List, Optional

import pytest

pytest.importorskip("mcp")

from mcp_helpers import serving_http  # noqa: E402
from task_child import model, server  # noqa: E402

import kerman  # noqa: E402
from kerman import FileStore  # noqa: E402

CHILD = str(Path(__file__).with_name("task_child.py"))
SERVER = str(Path(__file__).with_name("mcp_task_server.py"))

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL, detached workers")


@pytest.fixture
def tasks(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "tasks"
    folder.mkdir()
    yield folder
    (folder / "gate").touch()  # a worker still waiting finishes


@pytest.fixture
def task_url(tasks: Path) -> Iterator[str]:
    with serving_http(SERVER, env={**os.environ, "KERMAN_MCP_TASKS": str(tasks)}) as url:
        yield url


def runs(tasks: Path) -> List[str]:
    path = tasks / "runs"
    return path.read_text().splitlines() if path.exists() else []


def result_text(events: List[Any]) -> str:
    [result] = [e.data for e in events if e.type == "tool/result"]
    [block] = result["message"]["content"]
    content = block["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_call_that_becomes_a_task_logs_its_id_then_gets_the_task_s_result(transport: str, tasks: Path, request: Any) -> None:
    url = request.getfixturevalue("task_url") if transport == "http" else None
    (tasks / "gate").touch()  # the task finishes as soon as it runs

    async def main() -> List[Any]:
        loop = kerman.AgentLoop(model(), tools=[server(str(tasks), url)])
        loop.followup("go")
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events

    events = asyncio.run(main())
    [record] = [e for e in events if e.type == "tool/progress" and e.data.get("task")]
    [result] = [e for e in events if e.type == "tool/result"]
    assert record.seq < result.seq and record.data["callId"] == "c1"
    assert (tasks / f"task-{record.data['task']}.json").exists()  # the server's id
    assert kerman.events.view(record).task == record.data["task"]
    assert result_text(events) == "slow a done"
    assert runs(tasks) == ["a"]
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed"]


def test_without_tasks_the_server_runs_the_call_as_an_ordinary_call(tasks: Path) -> None:
    async def main() -> List[Any]:
        no_tasks = kerman.mcp.MCPServer.stdio(sys.executable, [SERVER], env={"KERMAN_MCP_TASKS": str(tasks)}, tasks=False)
        loop = kerman.AgentLoop(model(), tools=[no_tasks])
        loop.followup("go")
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events

    events = asyncio.run(main())
    assert result_text(events) == "slow a (not a task)"
    assert not [e for e in events if e.type == "tool/progress"]
    assert runs(tasks) == []


def test_cancelling_the_turn_cancels_the_task(tasks: Path) -> None:
    async def main() -> Optional[str]:
        loop = kerman.AgentLoop(model(), tools=[server(str(tasks))])
        logged: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def seen(event: Any) -> None:
            if event.type == "tool/progress" and event.data.get("task") and not logged.done():
                logged.set_result(event.data["task"])

        loop.log.subscribe(seen)
        loop.followup("go")
        task = await logged
        loop.cancel()
        await loop.when_idle()
        await loop.aclose()
        return task

    task = asyncio.run(main())
    assert (tasks / f"cancel-{task}").exists()  # tasks/cancel reached the server before the turn ended
    assert json.loads((tasks / f"task-{task}.json").read_text())["status"] == "cancelled"


def killed_while_the_task_runs(root: Path, tasks: Path, url: Optional[str]) -> str:
    argv = [sys.executable, CHILD, str(root), str(tasks)] + ([url] if url else [])
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        seen = json.loads(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    return str(seen["task"])


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_session_resumed_after_the_client_was_killed_polls_the_logged_task(
    transport: str, tmp_path: Path, tasks: Path, request: Any
) -> None:
    url = request.getfixturevalue("task_url") if transport == "http" else None
    root = tmp_path / "store"
    task = killed_while_the_task_runs(root, tasks, url)
    with FileStore(root).open("s") as log:
        before = list(log.events())
    assert [e.type for e in before if e.type in ("tool/call", "tool/result")] == ["tool/call"]  # in flight, not closed
    assert [e.data.get("task") for e in before if e.type == "tool/progress"] == [task]
    (tasks / "gate").touch()  # the task may finish now, with no client connected

    async def take_up() -> List[Any]:
        with FileStore(root).open("s") as log:
            loop = kerman.AgentLoop(model(), log=log, tools=[server(str(tasks), url)])
            loop.wake()
            await loop.when_idle()
            await loop.aclose()
            return list(log.events())

    events = asyncio.run(take_up())
    assert result_text(events) == "slow a done"
    [result] = [e.data for e in events if e.type == "tool/result"]
    assert "error" not in result
    assert runs(tasks) == ["a"]  # polled, not run again
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed"]


def test_a_server_with_durable_input_follows_its_tasks_too(tasks: Path) -> None:
    (tasks / "gate").touch()

    async def main() -> List[Any]:
        durable = kerman.mcp.MCPServer.stdio(sys.executable, [SERVER], env={"KERMAN_MCP_TASKS": str(tasks)}, durable_input=True)
        loop = kerman.AgentLoop(model(), tools=[durable])
        loop.followup("go")
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events

    events = asyncio.run(main())
    assert [e.data["callId"] for e in events if e.type == "tool/progress" and e.data.get("task")] == ["c1"]
    assert result_text(events) == "slow a done"
    assert runs(tasks) == ["a"]
