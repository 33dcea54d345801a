"""An MCP server that runs its ``slow`` tool as a task (the 2026-07-28 revision's tasks
extension, ``io.modelcontextprotocol/tasks``), for test_mcp_tasks.py; written with the ``mcp``
package's server side (its ``Extension``: a ``tools/call`` interceptor and the ``tasks/get`` and
``tasks/cancel`` methods). ``python mcp_task_server.py [http]``: stdio, or streamable HTTP on a
loopback port printed once it listens.

Tasks live in the folder ``KERMAN_MCP_TASKS`` names, as an external job system keeps them: each
task is a JSON file, and its body runs in a worker process of its own (started detached), so a
task outlives the server process that created it (a stdio server dies with its client) and a
server started again answers ``tasks/get`` for it. The body appends one line to ``runs`` in that
folder when it starts (the tests count executions), reports "halfway", and finishes once the
file ``gate`` exists, or stops once the task is cancelled. The ``ask`` tool's body, once ``gate``
exists, moves its task to ``input_required`` (a form elicitation per round, keyed ``confirm-1``,
``confirm-2`` ...) and goes on when ``tasks/update`` brings the answer (written to a file the
worker reads; each update appends its keys to ``updates``), or stops once the task is cancelled;
with ``kind="sampling"`` it asks for a completion by the client's model instead.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Sequence

from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp_types import RequestParams

from mcp import MCPError

IDENTIFIER = "io.modelcontextprotocol/tasks"
FOLDER = Path(os.environ.get("KERMAN_MCP_TASKS", "."))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def _write(path: Path, state: Dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _task(task_id: str) -> Path:
    return FOLDER / f"task-{task_id}.json"


class TaskParams(RequestParams):
    task_id: str


class UpdateParams(RequestParams):
    task_id: str
    input_responses: Dict[str, Any]


class Tasks(Extension):
    identifier = IDENTIFIER

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskParams, self.get),
            MethodBinding("tasks/update", UpdateParams, self.update),
            MethodBinding("tasks/cancel", TaskParams, self.cancel),
        )

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        capabilities = ctx.session.client_capabilities
        declared = (capabilities.extensions if capabilities else None) or {}
        if params.name not in ("slow", "ask") or IDENTIFIER not in declared:
            return await call_next(ctx)
        task_id = uuid.uuid4().hex
        state = {"taskId": task_id, "status": "working", "statusMessage": "queued", "createdAt": _now(), "lastUpdatedAt": _now()}
        _write(_task(task_id), state)  # durably created before the handle is returned
        x = str((params.arguments or {}).get("x", ""))
        rounds = str((params.arguments or {}).get("rounds", 0 if params.name == "slow" else 1))
        kind = str((params.arguments or {}).get("kind", "form"))
        subprocess.Popen(
            [sys.executable, __file__, "work", str(FOLDER), task_id, x, rounds, kind],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        return {"resultType": "task", **state, "ttlMs": None, "pollIntervalMs": 20}

    async def get(self, ctx: Any, params: TaskParams) -> Dict[str, Any]:
        path = _task(params.task_id)
        if not path.exists():
            raise MCPError(code=-32602, message=f"unknown task {params.task_id!r}")
        return {**json.loads(path.read_text()), "ttlMs": None, "pollIntervalMs": 20}

    async def update(self, ctx: Any, params: UpdateParams) -> Dict[str, Any]:
        path = _task(params.task_id)
        if not path.exists():
            raise MCPError(code=-32602, message=f"unknown task {params.task_id!r}")
        with open(FOLDER / "updates", "a") as f:
            f.write(" ".join(sorted(params.input_responses)) + "\n")
        outstanding = json.loads(path.read_text()).get("inputRequests") or {}
        for key, response in params.input_responses.items():
            answer = FOLDER / f"answer-{params.task_id}-{key}.json"
            if key in outstanding and not answer.exists():  # a key answered before is ignored
                _write(answer, response)
        return {}

    async def cancel(self, ctx: Any, params: TaskParams) -> Dict[str, Any]:
        path = _task(params.task_id)
        if not path.exists():
            raise MCPError(code=-32602, message=f"unknown task {params.task_id!r}")
        (FOLDER / f"cancel-{params.task_id}").touch()
        state = json.loads(path.read_text())
        if state["status"] not in ("completed", "failed", "cancelled"):
            _write(path, {**state, "status": "cancelled", "statusMessage": "cancelled by the client", "lastUpdatedAt": _now()})
        return {}


server = MCPServer("kerman-task-test", extensions=[Tasks()])


@server.tool()
def slow(x: str) -> str:
    """Takes a while (a task, for a client that declares tasks)."""
    return f"slow {x} (not a task)"


@server.tool()
def ask(x: str, rounds: int = 1, kind: str = "form") -> str:
    """Asks a person to confirm ``x`` ``rounds`` times while it runs (a task); with ``kind``
    ``sampling`` it asks the client's model instead."""
    return f"ask {x} (not a task)"


def _wait(task_id: str, path: Path) -> bool:
    """Waits for ``path`` as a job system's worker waits for its input: False once the task
    is cancelled (or after two minutes)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (FOLDER / f"cancel-{task_id}").exists():
            return False
        if path.exists():
            return True
        time.sleep(0.01)
    return False


def _confirmation(x: str) -> Dict[str, Any]:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    return {"method": "elicitation/create", "params": {"mode": "form", "message": f"Go ahead with {x}?", "requestedSchema": schema}}


def _sampling(x: str) -> Dict[str, Any]:
    message = {"role": "user", "content": {"type": "text", "text": f"Should {x} go ahead?"}}
    return {"method": "sampling/createMessage", "params": {"messages": [message], "maxTokens": 20}}


def _said(response: Dict[str, Any]) -> str:
    if "role" in response:  # the client model's reply to a sampling request
        return str(response["content"]["text"])
    if response.get("action") != "accept":
        return str(response.get("action"))
    return "yes" if (response.get("content") or {}).get("ok") else "no"


def work(task_id: str, x: str, rounds: int, kind: str) -> None:
    """A task's body, in a worker process of its own."""
    with open(FOLDER / "runs", "a") as f:
        f.write(x + "\n")
    path = _task(task_id)
    state = json.loads(path.read_text())
    _write(path, {**state, "statusMessage": "halfway", "lastUpdatedAt": _now()})
    if not _wait(task_id, FOLDER / "gate"):
        return
    said = []
    for n in range(1, rounds + 1):
        key = f"confirm-{n}"
        asking = {
            "status": "input_required",
            "statusMessage": f"waiting for {key}",
            "inputRequests": {key: _sampling(x) if kind == "sampling" else _confirmation(x)},
        }
        _write(path, {**state, **asking, "lastUpdatedAt": _now()})
        answer = FOLDER / f"answer-{task_id}-{key}.json"
        if not _wait(task_id, answer):
            return
        said.append(_said(json.loads(answer.read_text())))
        _write(path, {**state, "statusMessage": f"{key} answered", "lastUpdatedAt": _now()})
    text = f"slow {x} done" if rounds == 0 else f"ask {x}: {' '.join(said)}"
    result = {"content": [{"type": "text", "text": text}], "structuredContent": {"result": text}, "isError": False}
    _write(path, {**state, "status": "completed", "statusMessage": "done", "result": result, "lastUpdatedAt": _now()})


def main(argv: list[str]) -> None:
    if len(argv) > 1 and argv[1] == "work":
        global FOLDER
        FOLDER = Path(argv[2])
        work(argv[3], argv[4], int(argv[5]), argv[6])
    elif len(argv) > 1 and argv[1] == "http":
        import socket

        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        srv = uvicorn.Server(uvicorn.Config(server.streamable_http_app(host="127.0.0.1"), log_level="warning"))

        async def serve() -> None:
            task = asyncio.create_task(srv.serve(sockets=[sock]))
            while not srv.started:  # uvicorn has no started event to await
                await asyncio.sleep(0.01)
            print(port, flush=True)
            await task

        asyncio.run(serve())
    else:
        server.run()


if __name__ == "__main__":
    main(sys.argv)
