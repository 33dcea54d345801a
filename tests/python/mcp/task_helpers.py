"""Helpers of the MCP task tests (test_mcp_tasks.py, test_mcp_task_input.py) and of their client
processes (task_child.py, task_input_child.py): the task server (``mcp_task_server.py``) over
stdio or streamable HTTP, a scripted model that calls one of its tools, a folder of tasks per
test, one turn run to its end, a client process killed once it printed what it saw, a session
taken up in this process, and readers of what the loop logged. (Not a conftest.py: the suite's
top conftest is imported by name.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from mcp_helpers import serving_http

import kerman
from kerman import FileStore, ModelReply
from kerman.mcp import MCPServer

SERVER = str(Path(__file__).with_name("mcp_task_server.py"))


def server(folder: str, url: Optional[str] = None, **options: Any) -> MCPServer:
    """The task server keeping its tasks in ``folder``: a subprocess over stdio, or the one at
    ``url`` over streamable HTTP. ``options`` are those of :class:`MCPServer`."""
    if url:
        return MCPServer.http(url, **options)
    return MCPServer.stdio(sys.executable, [SERVER], env={"KERMAN_MCP_TASKS": folder}, **options)


def model(tool: str, arguments: str = '{"x": "a"}') -> Any:
    """A model that calls ``tool`` once (call ``c1``), then says "done"."""

    async def reply(request: kerman.ModelRequest) -> ModelReply:
        if len(request.messages) > 1:  # the tool's result is in the history
            return ModelReply("done")
        return ModelReply([{"type": "tool-call", "id": "c1", "name": tool, "arguments": arguments}])

    return reply


def first_task(log: Any) -> asyncio.Future[str]:
    """A future of the first task id ``log`` records (a ``tool/progress`` with ``task``). Call
    it in the event loop that awaits it, before the turn starts."""
    here = asyncio.get_running_loop()
    logged: asyncio.Future[str] = here.create_future()

    def found(task: str) -> None:
        if not logged.done():
            logged.set_result(task)

    def seen(event: Any) -> None:  # may run on the log's thread
        if event.type == "tool/progress" and event.data.get("task"):
            here.call_soon_threadsafe(found, event.data["task"])

    log.subscribe(seen)
    return logged


@pytest.fixture
def tasks(tmp_path: Path) -> Iterator[Path]:
    """The task server's folder of tasks."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    yield folder
    (folder / "gate").touch()  # a worker still waiting for the gate finishes
    for task in folder.glob("task-*.json"):  # a worker still waiting for an answer stops
        (folder / f"cancel-{task.stem[5:]}").touch()


@pytest.fixture
def task_url(tasks: Path) -> Iterator[str]:
    """The task server over streamable HTTP, keeping its tasks in ``tasks``."""
    with serving_http(SERVER, env={**os.environ, "KERMAN_MCP_TASKS": str(tasks)}) as url:
        yield url


def one_turn(reply: Any, mcp: MCPServer) -> List[Any]:
    """The events of one turn (prompt "go") of a loop with model ``reply`` and tools of ``mcp``,
    run until the loop is idle."""

    async def main() -> List[Any]:
        loop = kerman.AgentLoop(reply, tools=[mcp])
        loop.followup("go")
        return await idle_events(loop)

    return asyncio.run(main())


async def idle_events(loop: kerman.AgentLoop) -> List[Any]:
    """Once ``loop`` is idle, its log's events; the loop closed."""
    await loop.when_idle()
    events = list(loop.log.events())
    await loop.aclose()
    return events


def killed(child: str, *args: str) -> Dict[str, Any]:
    """Runs the client process ``child`` with ``args``; once it printed one JSON line, kills
    it (SIGKILL) and returns what it printed."""
    with subprocess.Popen([sys.executable, child, *args], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        seen: Dict[str, Any] = json.loads(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    return seen


def events_of(root: Path) -> List[Any]:
    """The events of session ``s`` in the file store at ``root``."""
    with FileStore(root).open("s") as log:
        events = list(log.events())
    return events


def take_up(root: Path, reply: Any, mcp: MCPServer, answer: Optional[Any] = None) -> List[Any]:
    """A loop in this process (model ``reply``, tools of ``mcp``) takes session ``s`` up until
    it is idle; ``answer``, if given, answers the request for input the resumed call logs.
    Returns the session's events."""

    async def main() -> List[Any]:
        with FileStore(root).open("s") as log:
            loop = kerman.AgentLoop(reply, log=log, tools=[mcp])
            loop.wake()
            await loop.when_idle()
            if answer is not None:
                [pending] = loop.decisions
                loop.decide(pending.decision_id, answer)
                await loop.when_idle()
            assert loop.status == "idle"
            await loop.aclose()
            events = list(log.events())
        return events

    return asyncio.run(main())


def lines(tasks: Path, name: str) -> List[str]:
    """The lines of file ``name`` in the folder of tasks (none if it is not there)."""
    path = tasks / name
    return path.read_text().splitlines() if path.exists() else []


def the_result(events: List[Any]) -> str:
    """The text of the one call's (``c1``) one result."""
    calls = [e for e in events if e.type == "tool/call"]
    results = [e.data for e in events if e.type == "tool/result"]
    assert [c.data["callId"] for c in calls] == ["c1"] and len(results) == 1
    [block] = results[0]["message"]["content"]
    content = block["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def logged_task(events: List[Any]) -> str:
    """The id of the one task the events record."""
    [task] = [e.data["task"] for e in events if e.type == "tool/progress" and e.data.get("task")]
    return str(task)


def endings(events: List[Any]) -> List[str]:
    """The kinds of the turns' ends, in order."""
    return [e.data["reason"]["kind"] for e in events if e.type == "turn/end"]
