"""A server's request for input as a durable decision (``docs/mcp.md#input-as-decisions``).

With ``MCPServer(..., durable_input=True)`` a call is made with ``allow_input_required=True``:
an input-required result (the 2026-07-28 revision's, carrying the server's state token) is not
answered in this process but returned to the loop as :class:`kerman.InputRequired`, whose
payload (the server's input requests and its ``requestState``) the loop logs with the request.
When a person answers, the loop makes the call again, in this process or another, with
``ctx.input``: the answer goes back as the elicitation's ``accept`` content, with the state
token read from the log. A task's request for input (``kerman.mcp._tasks``) becomes the same
decision, its payload naming the task instead of a state token.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

from ..decisions import InputRequired
from ..tools import ToolContext

__all__ = ["call", "input_required"]

ELICIT = "elicitation/create"


def input_required(result: Any) -> Union[InputRequired, str]:
    """The decision request an input-required result becomes (or, given a dict, the payload
    of a task's request: ``{"task", "inputRequests"}``), or why it cannot be one (a request
    that is not a form elicitation). Several form elicitations in one result (the 2026-07-28
    revision allows them) become one decision whose answer is an object with one member per
    request, named by the request's key."""
    if isinstance(result, dict):
        payload = result
    else:
        payload = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        payload.pop("resultType", None)
    requests: Dict[str, Any] = payload.get("inputRequests") or {}
    if not requests:
        # Only a state token: the call is made again with it and an empty answer.
        return InputRequired(None, None, payload)
    for key, request in requests.items():
        params = request.get("params") or {}
        if request.get("method") != ELICIT or "requestedSchema" not in params:
            return f"the server asked for {request.get('method')!r} input ({key!r}), which is not a form elicitation"
    if len(requests) == 1:
        [params] = [request["params"] for request in requests.values()]
        return InputRequired(params.get("message"), params["requestedSchema"], payload)
    schema = {
        "type": "object",
        "properties": {key: request["params"]["requestedSchema"] for key, request in requests.items()},
        "required": list(requests),
        "additionalProperties": False,
    }
    note = "\n".join(f"{key}: {request['params'].get('message') or ''}" for key, request in requests.items())
    return InputRequired(note, schema, payload)


def responses(given: Dict[str, Any]) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """The ``input_responses`` and ``request_state`` of a call made again with ``ctx.input``:
    the answer is each request's ``accept`` content (one request), or its member named by the
    request's key (several)."""
    import mcp.types as types

    payload = given.get("payload") or {}
    answer = given.get("answer")
    keys = list((payload.get("inputRequests") or {}).keys())
    content = answer if isinstance(answer, dict) else None

    def of(key: str) -> Optional[Dict[str, Any]]:
        if len(keys) == 1 or content is None:
            return content
        member = content.get(key)
        return member if isinstance(member, dict) else None

    answers = {key: types.ElicitResult(action="accept", content=of(key)) for key in keys}
    return (answers or None), payload.get("requestState")


async def call(client: Any, name: str, args: Dict[str, Any], ctx: ToolContext, timeout: Optional[float], progress: Any) -> Any:
    """``tools/call`` that returns an input-required result as data (the first call, or the
    call made again with the person's answer)."""
    answers, state = responses(ctx.input) if ctx.input is not None else (None, None)
    return await client.session.call_tool(
        name,
        args,
        read_timeout_seconds=timeout,
        progress_callback=progress,
        input_responses=answers,
        request_state=state,
        allow_input_required=True,
        allow_claimed=True,  # a task (kerman.mcp._tasks), followed by the caller
    )
