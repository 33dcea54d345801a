"""A task's request for input as a durable decision (``docs/mcp.md#input-inside-a-task``).

With ``durable_input=True``, a task that asks for input while it runs (``tasks/get`` shows it
``input_required``) ends its call with :class:`kerman.InputRequired` whose payload names the
task (:func:`kerman.mcp._tasks.follow`); the turn waits while the task waits on the server.
The call made again with the person's answer sends it to that task (:func:`answer`), from
whichever process took the session up. A request declined (or expired, or whose turn was
cancelled) leaves the task unanswered: the session's next resume cancels it (:func:`abandoned`).
"""

from __future__ import annotations

from typing import Any, Collection, Dict, List, Optional, Union

from ..decisions import InputRequired
from . import _input
from ._tasks import Call, _model, follow, update

__all__ = ["task_of", "answer", "abandoned", "ABANDONED_TYPES"]


def task_of(given: Optional[Dict[str, Any]]) -> Optional[str]:
    """The task a call made again with ``ctx.input`` answers: the ``task`` of its request's
    payload (a task's request for input), or ``None`` (an input-required result's)."""
    payload = (given or {}).get("payload")
    task = payload.get("task") if isinstance(payload, dict) else None
    return task if isinstance(task, str) else None


async def answer(session: Any, task_id: str, given: Dict[str, Any], call: Call) -> Union[Any, InputRequired]:
    """The call made again with a person's answer (``given``: ``ctx.input``) to task
    ``task_id``'s request for input: the answer goes to the task (``tasks/update``), whose
    result is then followed as before. The task id is in the log already. Sent again after a
    crash, an answer is ignored by the server (its keys were answered)."""
    responses, _state = _input.responses(given)
    wire = {key: r.model_dump(mode="json", by_alias=True, exclude_none=True) for key, r in (responses or {}).items()}
    await update(session, task_id, wire)
    created = _model("TaskCreated")(task_id=task_id, status="working")
    return await follow(session, created, call, logged=True, answered=list(wire))


#: The records :func:`abandoned` reads.
ABANDONED_TYPES = ("turn/start", "decision/requested", "decision/resolved", "tool/result")


def abandoned(events: Any, names: Collection[str]) -> List[str]:
    """The tasks of the open turn whose request for input a person declined (or that expired,
    or whose turn was cancelled while it waited), their calls (of tools in ``names``) not
    closed yet: the call's result will be the decision's, so nothing will answer the task."""
    from .._doubt import result_call_id

    asked: Dict[str, Dict[str, Any]] = {}
    left: Dict[str, str] = {}  # call id -> task
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if event.type == "turn/start":
            asked.clear()
            left.clear()
        elif event.type == "decision/requested" and data.get("kind") == "input" and data.get("name") in names:
            task = task_of({"payload": data.get("payload")})
            if task is not None:
                asked[str(data.get("decisionId"))] = {"task": task, "callId": data.get("callId")}
        elif event.type == "decision/resolved" and data.get("decisionId") in asked:
            if data.get("outcome") in ("denied", "expired", "cancelled"):
                request = asked[data["decisionId"]]
                left[str(request["callId"])] = request["task"]
        elif event.type == "tool/result":
            left.pop(result_call_id(data), None)
    return list(left.values())
