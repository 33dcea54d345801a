"""The client process of test_mcp_task_input.py: ``ROOT TASKS UNTIL``. Creates session ``s``
in a file store and runs one turn whose model calls the task server's ``ask`` tool through a
server with ``durable_input=True``. With ``UNTIL`` = ``asked`` it prints ``{"status",
"decisions"}`` as one JSON line once the turn waits for the task's request for input; with
``logged`` it prints ``{"task": id}`` once the task's id is logged and durable (the task has
not asked yet). Then it waits until the parent kills it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import kerman
from kerman import FileStore, ModelReply
from kerman.mcp import MCPServer

SERVER = str(Path(__file__).with_name("mcp_task_server.py"))


def server(tasks: str) -> MCPServer:
    return MCPServer.stdio(sys.executable, [SERVER], env={"KERMAN_MCP_TASKS": tasks}, durable_input=True)


def model(arguments: str = '{"x": "a"}') -> Any:
    async def reply(request: kerman.ModelRequest) -> ModelReply:
        if len(request.messages) > 1:  # the tool's result is in the history
            return ModelReply("done")
        return ModelReply([{"type": "tool-call", "id": "c1", "name": "ask", "arguments": arguments}])

    return reply


async def main(root: str, tasks: str, until: str) -> None:
    log = FileStore(root, durability="strict").create("s")
    here = asyncio.get_running_loop()
    logged: asyncio.Future[str] = here.create_future()

    def found(task: str) -> None:
        if not logged.done():
            logged.set_result(task)

    def seen(event: Any) -> None:  # may run on the log's thread
        if event.type == "tool/progress" and event.data.get("task"):
            here.call_soon_threadsafe(found, event.data["task"])

    log.subscribe(seen)
    loop = kerman.AgentLoop(model(), log=log, tools=[server(tasks)])
    loop.followup("go")
    if until == "logged":
        task = await logged
        await log.flush()
        print(json.dumps({"task": task}), flush=True)
    else:
        await loop.when_idle()
        await log.flush()  # the request is on disk before the parent reads the store
        print(json.dumps({"status": loop.status, "decisions": [d.decision_id for d in loop.decisions]}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
