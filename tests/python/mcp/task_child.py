"""The client process of test_mcp_tasks.py: ``ROOT TASKS [URL]``. Creates session ``s`` in a
file store and runs one turn whose model calls the task server's ``slow`` tool (over stdio,
or at ``URL`` over streamable HTTP); once the task's id is logged and durable it prints
``{"task": id}`` as one JSON line, then waits until the parent kills it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Optional

from task_helpers import first_task, model, server

import kerman
from kerman import FileStore


async def main(root: str, tasks: str, url: Optional[str]) -> None:
    log = FileStore(root).create("s")
    logged = first_task(log)
    loop = kerman.AgentLoop(model("slow"), log=log, tools=[server(tasks, url)])
    loop.followup("go")
    task = await logged
    await log.flush()
    print(json.dumps({"task": task}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
