"""The client process of test_mcp_tasks.py: ``ROOT TASKS [URL]``. Creates session ``s`` in a
file store and runs one turn whose model calls the task server's ``slow`` tool (over stdio,
or at ``URL`` over streamable HTTP); once the task's id is logged and durable it prints
``{"task": id}`` as one JSON line, then waits until the parent kills it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import kerman
from kerman import FileStore, ModelReply
from kerman.mcp import MCPServer

SERVER = str(Path(__file__).with_name("mcp_task_server.py"))


def server(tasks: str, url: Optional[str] = None) -> MCPServer:
    if url:
        return MCPServer.http(url)
    return MCPServer.stdio(sys.executable, [SERVER], env={"KERMAN_MCP_TASKS": tasks})


def model() -> Any:
    async def reply(request: kerman.ModelRequest) -> ModelReply:
        if len(request.messages) > 1:  # the tool's result is in the history
            return ModelReply("done")
        return ModelReply([{"type": "tool-call", "id": "c1", "name": "slow", "arguments": '{"x": "a"}'}])

    return reply


async def main(root: str, tasks: str, url: Optional[str]) -> None:
    log = FileStore(root).create("s")
    here = asyncio.get_running_loop()
    logged: asyncio.Future[str] = here.create_future()

    def found(task: str) -> None:
        if not logged.done():
            logged.set_result(task)

    def seen(event: Any) -> None:  # may run on the log's thread
        if event.type == "tool/progress" and event.data.get("task"):
            here.call_soon_threadsafe(found, event.data["task"])

    log.subscribe(seen)
    loop = kerman.AgentLoop(model(), log=log, tools=[server(tasks, url)])
    loop.followup("go")
    task = await logged
    await log.flush()
    print(json.dumps({"task": task}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
