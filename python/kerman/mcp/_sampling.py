"""A server's sampling request (``sampling/createMessage``) answered by the model the user
named (``MCPServer(sampling_model=...)``)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Dict, List

from .._core import AssistantMessage, UserMessage
from ..hooks import ModelReply, ModelRequest
from ..signal import Signal
from ._content import block_of

if TYPE_CHECKING:
    from ._server import MCPServer

__all__ = ["answer"]


def _blocks(content: Any) -> List[Dict[str, Any]]:
    items = content if isinstance(content, list) else [content]
    return [block_of(item) for item in items]


async def _reply(model: Any, request: ModelRequest) -> ModelReply:
    """One model call: an awaitable reply, or a stream of chunks whose text is gathered."""
    produced = model(request)
    if hasattr(produced, "__anext__"):
        text = []
        async for chunk in produced:
            if chunk.get("type") == "text-delta" and isinstance(chunk.get("text"), str):
                text.append(chunk["text"])
        return ModelReply("".join(text))
    if inspect.isawaitable(produced):
        produced = await produced
    if isinstance(produced, ModelReply):
        return produced
    if isinstance(produced, str):
        return ModelReply(produced)
    raise TypeError(f"the sampling model returned {type(produced).__name__}, not a ModelReply")


async def answer(server: MCPServer, params: Any) -> Any:
    import mcp.types as types

    messages: List[Any] = []
    for m in params.messages:
        blocks = _blocks(m.content)
        messages.append(AssistantMessage(blocks) if m.role == "assistant" else UserMessage(blocks, source={"kind": "mcp-sampling"}))
    # The request's maxTokens is not passed on: each vendor names that option differently, and
    # the model the user named keeps its own limit. temperature is the same name everywhere.
    options: Dict[str, Any] = {}
    if params.temperature is not None:
        options["temperature"] = params.temperature
    request = ModelRequest(messages, [], options, 0, 0, Signal(), instructions=params.system_prompt)
    try:
        reply = await _reply(server.sampling_model, request)
    except Exception as e:
        return types.ErrorData(code=types.INTERNAL_ERROR, message=f"the client's sampling model failed: {type(e).__name__}: {e}")
    text = "".join(b.get("text") or "" for b in reply.content if b.get("type") == "text")
    name = getattr(server.sampling_model, "model", None)
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(text=text),
        model=name if isinstance(name, str) else type(server.sampling_model).__name__,
        stop_reason="maxTokens" if reply.finish == "max-tokens" else "endTurn",
    )
