"""Long-running calls as MCP tasks (``docs/mcp.md#long-running-tasks``).

The 2026-07-28 revision moved tasks into an extension, ``io.modelcontextprotocol/tasks``: a
client that declares it may get, for a ``tools/call``, a task handle (``resultType: "task"``)
in place of the result, and polls ``tasks/get`` until the task is terminal (its result, or its
JSON-RPC error, is inlined in the answer); ``tasks/cancel`` cancels it. The ``mcp`` package has
the extension machinery (``ClientExtension``, ``ResultClaim``) and no tasks client, so this
module is one: the claim's model, the three requests, and the follow-up of one task.

A task that needs input while it runs shows ``status: "input_required"`` and its
``inputRequests`` in ``tasks/get``; the answers go back with ``tasks/update`` (never by making
the ``tools/call`` again), and the task goes on. The call's ``answer`` function answers them in
this process (``on_elicit``); without one (``durable_input=True``) the call ends with
:class:`kerman.InputRequired` naming the task, and the call made again with the person's
answer sends it to the same task (``kerman.mcp._task_input``), from whichever process took
the session up.

Before it waits, Kerman logs the task id against the call (a ``tool/progress`` record with
``task``, flushed): a session resumed after the client process died finds the id of a call
without a result and polls the task (the call's reconcile function, :func:`reconcile`), so the
call is not in doubt and its body on the server does not run twice.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Collection, Dict, List, Optional, Union

from ..decisions import InputRequired
from . import _input
from ._transport import describe

if TYPE_CHECKING:
    from ._server import MCPServer

__all__ = ["IDENTIFIER", "extension", "follow", "logged_task", "Call", "CURRENT"]

logger = logging.getLogger("kerman.mcp")

IDENTIFIER = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")
# How often to poll when the server suggests nothing, and the bounds of what it may suggest.
DEFAULT_POLL = 0.5
MIN_POLL, MAX_POLL = 0.005, 5.0

ProgressSink = Callable[[float, Optional[float], Optional[str]], Awaitable[None]]
#: Answers a task's input requests in this process: the ``inputResponses`` (wire JSON, by the
#: requests' keys), or why they cannot be answered.
Answerer = Callable[[Dict[str, Any]], Awaitable[Union[Dict[str, Any], str]]]


class Call:
    """The call a task belongs to, for the claim's resolver (which the ``mcp`` client calls
    with its own context only): its ``ToolContext``, where its progress goes, its deadline,
    and what answers the task's requests for input (``None``: a person, through a durable
    decision)."""

    __slots__ = ("ctx", "on_progress", "deadline", "answer")

    def __init__(self, ctx: Any, on_progress: Optional[ProgressSink], deadline: Optional[float], answer: Optional[Answerer] = None) -> None:
        self.ctx = ctx
        self.on_progress = on_progress
        self.deadline = deadline
        self.answer = answer


#: The call being made in this asyncio task (set by ``MCPServer._call`` around ``call_tool``).
CURRENT: contextvars.ContextVar[Optional[Call]] = contextvars.ContextVar("kerman_mcp_call", default=None)

_models: Dict[str, Any] = {}


def _model(name: str) -> Any:
    """The pydantic models of the extension, built once the ``mcp`` package is imported."""
    if not _models:
        from typing import Literal

        from mcp_types import Request, RequestParams, Result

        class TaskCreated(Result):
            """``CreateTaskResult``: the task a ``tools/call`` became."""

            result_type: Literal["task"] = "task"
            task_id: str
            status: str = "working"
            status_message: Optional[str] = None
            poll_interval_ms: Optional[int] = None

        class TaskParams(RequestParams):
            task_id: str

        class GetTask(Request[TaskParams, Literal["tasks/get"]]):
            method: Literal["tasks/get"] = "tasks/get"
            params: TaskParams
            name_param = "taskId"

        class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
            method: Literal["tasks/cancel"] = "tasks/cancel"
            params: TaskParams
            name_param = "taskId"

        class UpdateParams(RequestParams):
            task_id: str
            input_responses: Dict[str, Any]

        class UpdateTask(Request[UpdateParams, Literal["tasks/update"]]):
            method: Literal["tasks/update"] = "tasks/update"
            params: UpdateParams
            name_param = "taskId"

        _models.update(
            TaskCreated=TaskCreated,
            TaskParams=TaskParams,
            GetTask=GetTask,
            CancelTask=CancelTask,
            UpdateParams=UpdateParams,
            UpdateTask=UpdateTask,
        )
    return _models[name]


def extension() -> Any:
    """The ``ClientExtension`` a client declares so that a server may answer with a task."""
    from mcp.client.extension import ClientExtension, ResultClaim

    async def resolve(created: Any, claim: Any) -> Any:
        return await follow(claim.session, created, CURRENT.get())

    class Tasks(ClientExtension):
        identifier = IDENTIFIER

        def claims(self) -> Any:
            return (ResultClaim(result_type="task", model=_model("TaskCreated"), resolve=resolve),)

    return Tasks()


def is_task(result: Any) -> bool:
    return getattr(result, "result_type", None) == "task"


async def _get(session: Any, task_id: str) -> Dict[str, Any]:
    from pydantic import TypeAdapter

    request = _model("GetTask")(params=_model("TaskParams")(task_id=task_id))
    return await session.send_request(request, TypeAdapter(Dict[str, Any]))  # type: ignore[no-any-return]


async def cancel(session: Any, task_id: str) -> None:
    """``tasks/cancel``, bounded and shielded: sent while the call itself is being cancelled."""
    from pydantic import TypeAdapter

    request = _model("CancelTask")(params=_model("TaskParams")(task_id=task_id))
    try:
        await asyncio.wait_for(asyncio.shield(session.send_request(request, TypeAdapter(Dict[str, Any]))), 5.0)
    except BaseException as e:  # noqa: BLE001 - the call ends anyway; say why the server was not told
        logger.warning("MCP task %s: tasks/cancel failed: %s", task_id, describe(e))


async def update(session: Any, task_id: str, responses: Dict[str, Any]) -> None:
    """``tasks/update``: the answers to the task's outstanding input requests."""
    from pydantic import TypeAdapter

    request = _model("UpdateTask")(params=_model("UpdateParams")(task_id=task_id, input_responses=responses))
    await session.send_request(request, TypeAdapter(Dict[str, Any]))


def _interval(state: Dict[str, Any]) -> float:
    ms = state.get("pollIntervalMs")
    if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0:
        return min(max(ms / 1000, MIN_POLL), MAX_POLL)
    return DEFAULT_POLL


def _error_result(text: str) -> Any:
    from mcp.types import CallToolResult, TextContent

    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


async def log_task(ctx: Any, task_id: str, message: Optional[str]) -> None:
    """Logs the task id against the call of ``ctx`` and waits until it is durable: a process
    that dies from here on leaves the id for the session's next owner."""
    loop: Any = getattr(ctx, "loop", None)
    if loop is None or getattr(loop, "_core", None) is None:  # a tool run outside a loop: nothing to log into
        return
    loop._core.record_progress(ctx.turn, ctx.step, ctx.call_id, 0.0, None, message, task_id)
    await loop.log.flush()


async def follow(
    session: Any, created: Any, call: Optional[Call], *, logged: bool = False, answered: Collection[str] = ()
) -> Union[Any, InputRequired]:
    """The ``CallToolResult`` of the task ``created`` (a ``TaskCreated``): the task id logged
    (unless ``logged``: a resumed call whose id is in the log), then ``tasks/get`` until the task
    is terminal. Cancelling the caller cancels the task; past the call's deadline the task is
    cancelled and the result is an error saying so. A request for input the task shows (its keys
    not in ``answered``) is answered by ``call.answer``; without one it ends the call as
    :class:`kerman.InputRequired` (the task waits on the server for :func:`answer`)."""
    from mcp.types import CallToolResult

    task_id = created.task_id
    state: Dict[str, Any] = {"status": created.status, "statusMessage": created.status_message, "pollIntervalMs": created.poll_interval_ms}
    if call is not None and not logged:
        await log_task(call.ctx, task_id, created.status_message or f"task {task_id} {created.status}")
    last_message = created.status_message
    # A key's request is answered once: a snapshot taken before the server saw the answer
    # still shows it (the keys of a task's requests are never used again).
    done: List[str] = list(answered)
    try:
        while state.get("status") not in TERMINAL:
            wait = _interval(state)
            if call is not None and call.deadline is not None:
                left = call.deadline - time.monotonic()
                if left <= 0:
                    await cancel(session, task_id)
                    return _error_result(f"task {task_id}: no result within the call's timeout; the task was cancelled")
                wait = min(wait, left)
            await asyncio.sleep(wait)
            state = await _get(session, task_id)
            message = state.get("statusMessage")
            if message != last_message and isinstance(message, str) and call is not None and call.on_progress is not None:
                last_message = message
                await call.on_progress(0.0, None, message)
            if state.get("status") != "input_required":
                continue
            requests = {k: v for k, v in (state.get("inputRequests") or {}).items() if k not in done}
            if not requests:
                continue
            responses: Union[Dict[str, Any], str, InputRequired]
            if call is not None and call.answer is not None:
                responses = await call.answer(requests)
            elif call is not None:
                responses = _input.input_required({"task": task_id, "inputRequests": requests})
                if isinstance(responses, InputRequired):
                    return responses  # the task waits for the person's answer
            else:
                responses = "no call to answer it for"
            if isinstance(responses, str):
                await cancel(session, task_id)
                return _error_result(f"task {task_id} asked for input that cannot be given ({responses}); the task was cancelled")
            await update(session, task_id, responses)
            done.extend(requests)
    except asyncio.CancelledError:
        await cancel(session, task_id)
        raise
    status = state.get("status")
    if status == "completed":
        return CallToolResult.model_validate(state.get("result") or {"content": []})
    if status == "failed":
        error = state.get("error") or {}
        return _error_result(f"task {task_id} failed: {error.get('message', error)}")
    why = state.get("statusMessage")
    return _error_result(f"task {task_id} was cancelled on the server" + (f": {why}" if why else ""))


def logged_task(ctx: Any) -> Optional[str]:
    """The task id logged against the call of ``ctx`` in its step (``tool/progress`` with
    ``task``), if any."""
    log = getattr(getattr(ctx, "loop", None), "log", None)
    if log is None:
        return None
    found = None
    for event in log.events(types="tool/progress"):
        data = event.data
        if data.get("callId") == ctx.call_id and data.get("turn") == ctx.turn and data.get("step") == ctx.step and data.get("task"):
            found = data["task"]
    return found


async def reconcile(server: MCPServer, tool: Any, ctx: Any) -> Any:
    """The result of a call in doubt whose task id is in the log: the task is polled (not
    started again); ``None`` (the outcome stays unknown) when no task was logged, or the
    server no longer knows the task. A task that asks for input meanwhile is answered as in
    the call (:func:`follow`): with ``durable_input`` the result is :class:`kerman.InputRequired`."""
    from mcp import MCPError

    task_id = logged_task(ctx)
    if task_id is None:
        return None
    client = await server._connect()
    created = _model("TaskCreated")(task_id=task_id, status="working")
    deadline = None if server.timeout is None else time.monotonic() + server.timeout
    try:
        result = await follow(client.session, created, Call(ctx, None, deadline, server._task_answerer()), logged=True)
    except MCPError as e:
        logger.warning("MCP server %r: task %s of call %s could not be polled: %s", server.name, task_id, ctx.call_id, e.error.message)
        return None
    logger.info("MCP server %r: call %s took up its task %s after a restart", server.name, ctx.call_id, task_id)
    return result
