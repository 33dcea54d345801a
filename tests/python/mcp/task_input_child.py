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

from task_helpers import first_task, model, server

import kerman
from kerman import FileStore


async def main(root: str, tasks: str, until: str) -> None:
    log = FileStore(root, durability="strict").create("s")
    logged = first_task(log)
    loop = kerman.AgentLoop(model("ask"), log=log, tools=[server(tasks, durable_input=True)])
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
