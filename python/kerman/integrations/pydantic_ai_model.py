"""Any pydantic-ai ``Model`` as a Kerman model: ``kerman.integrations.pydantic_ai.model(m)``.

pydantic-ai has one ``Model`` class per vendor (Bedrock, Mistral, Groq, Cohere, Hugging Face,
Ollama, ...). ``PydanticAIModel`` puts one under an ``AgentLoop``: Kerman's history, tools and
structured output become pydantic-ai messages and ``ModelRequestParameters``; the model's stream
becomes Kerman chunks (text and reasoning deltas, tool calls, usage, finish); pydantic-ai's
failures become Kerman's classified ``ModelError``\\ s, so the retry policy and ``Fallback`` treat
them as they treat a Kerman provider's. The requests go through pydantic-ai's public direct API
(``pydantic_ai.direct``), which prepares the messages for the model as an agent run would.
docs/frameworks.md has the guide.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

try:
    from pydantic_ai import exceptions as pai_errors
    from pydantic_ai.direct import model_request, model_request_stream
    from pydantic_ai.messages import (
        BinaryContent,
        ImageUrl,
        ModelMessage,
        ModelRequest,
        ModelResponse,
        PartDeltaEvent,
        PartStartEvent,
        TextPart,
        TextPartDelta,
        ThinkingPart,
        ThinkingPartDelta,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models import Model, ModelRequestParameters, infer_model
    from pydantic_ai.output import OutputObjectDefinition
    from pydantic_ai.tools import ToolDefinition
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("kerman.integrations.pydantic_ai needs pydantic-ai: pip install 'kerman[pydantic-ai]'") from error

from .. import errors
from .._core import AssistantMessage, ToolResultMessage
from ..hooks import ModelReply
from ..providers._base import DEFAULT_RETRY, Provider, image_parts, mint_call_id, tool_result_text, usage_chunk, usage_dict
from ..providers._errors import classify, error_fields, shorten

__all__ = ["PydanticAIModel", "model", "tool_definition", "kerman_tool"]


def tool_definition(tool: Dict[str, Any]) -> ToolDefinition:
    """A Kerman tool definition (``{"name", "description", "parameters"}``, as in
    ``ModelRequest.tools``) as pydantic-ai's ``ToolDefinition``."""
    name = tool.get("name") if isinstance(tool, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"a Kerman tool definition needs a non-empty 'name', got {tool!r}")
    return ToolDefinition(
        name=name,
        description=tool.get("description") or None,
        parameters_json_schema=tool.get("parameters") or {"type": "object", "properties": {}},
    )


def kerman_tool(definition: ToolDefinition) -> Dict[str, Any]:
    """pydantic-ai's ``ToolDefinition`` as a Kerman tool definition (the inverse of ``tool_definition``)."""
    return {
        "name": definition.name,
        "description": definition.description or "",
        "parameters": definition.parameters_json_schema,
    }


# -- the failure classes ------------------------------------------------------------------------

# pydantic-ai's category classes (each adapter sorts its vendor's errors into them), most specific
# first, with the Kerman class and code each one is.
_CATEGORIES: List[Tuple[str, type, str]] = [
    ("ModelQuotaExceededError", errors.RateLimitError, "QUOTA_EXCEEDED"),
    ("ModelRateLimitError", errors.RateLimitError, "RATE_LIMITED"),
    ("ModelOverloadedError", errors.OverloadedError, "OVERLOADED"),
    ("ModelUnavailableError", errors.OverloadedError, "OVERLOADED"),
    ("ModelServerError", errors.ServerError, "SERVER_ERROR"),
    ("ModelTimeoutError", errors.ModelTimeoutError, "TIMEOUT"),
    ("ModelRequestTimeout", errors.ModelTimeoutError, "TIMEOUT"),
    ("ModelConnectionError", errors.ModelConnectionError, "CONNECTION_ERROR"),
    ("ModelContextWindowExceededError", errors.ContextLengthError, "CONTEXT_LENGTH_EXCEEDED"),
    ("ModelAuthenticationError", errors.AuthenticationError, "AUTHENTICATION_FAILED"),
    ("ModelNotFoundError", errors.InvalidRequestError, "NOT_FOUND"),
    ("ModelRequestRejectedError", errors.InvalidRequestError, "BAD_REQUEST"),
]


def _header(headers: Any, name: str) -> Optional[str]:
    try:
        value = headers.get(name) if headers is not None else None
    except Exception:
        return None
    return value if isinstance(value, str) else None


def failure(protocol: str, exc: BaseException) -> Optional[errors.ModelError]:
    """The Kerman ``ModelError`` for a pydantic-ai failure, or ``None`` (not a model failure: a
    ``UserError``, a bug, a cancellation; raised as it is)."""
    if isinstance(exc, errors.ModelError):
        return exc
    if not isinstance(exc, (pai_errors.ModelAPIError, pai_errors.UnexpectedModelBehavior)):
        return None
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    # The vendor's own message when the error carries its body ({"error": {"message"}} or the
    # inner dict), else pydantic-ai's.
    body_kind, body_message = error_fields(getattr(exc, "body", None))
    message = shorten(body_message or str(getattr(exc, "message", None) or exc))
    retry_after = getattr(exc, "retry_after", None)
    retry_ms = int(retry_after * 1000) if isinstance(retry_after, (int, float)) and retry_after >= 0 else None
    headers = getattr(exc, "headers", None)
    request_id = _header(headers, "x-request-id") or _header(headers, "request-id")
    where = f"{protocol}: " + (f"HTTP {status} " if status else "")
    for name, cls, code in _CATEGORIES:
        category = getattr(pai_errors, name, None)
        if category is not None and isinstance(exc, category):
            if code == "AUTHENTICATION_FAILED" and status == 403:
                code = "PERMISSION_DENIED"
            elif code == "CONNECTION_ERROR" and getattr(exc, "in_stream", False):
                code = "STREAM_INTERRUPTED"
            return cls(f"{where}{message}", code, status=status, retry_after_ms=retry_ms, request_id=request_id)  # type: ignore[no-any-return]
    # An error no category claimed: read its status, the vendor's type or code and its message.
    kind = getattr(exc, "provider_error_code", None) or getattr(exc, "provider_error_type", None) or body_kind
    if isinstance(exc, pai_errors.UnexpectedModelBehavior) and not isinstance(exc, pai_errors.ModelAPIError):
        # A reply pydantic-ai could not read (empty, malformed): another attempt may read one.
        return errors.ServerError(f"{protocol}: {message}", "SERVER_ERROR")
    return classify(protocol, status=status, kind=kind, message=message, retry_after=retry_ms, request_id=request_id)


# -- the model ------------------------------------------------------------------------------------


class PydanticAIModel(Provider):
    """A Kerman model over a pydantic-ai ``Model`` (build it with :func:`model`).

    Streams by default (``Model.request_stream``; ``stream=False`` for ``Model.request``), except
    a ``FunctionModel`` given no ``stream_function``, which can only answer whole.
    Keyword arguments are pydantic-ai ``ModelSettings`` sent with every request
    (``temperature=0.2``, ``max_tokens=512``...), and ``request.options`` over them. ``retry=``
    and ``deadline=`` as for every Kerman provider (docs/providers.md). ``model`` is the
    pydantic-ai model itself."""

    protocol = "pydantic-ai"
    vendor = "pydantic_ai"
    opaque = False  # the model's opaque state (signatures...) is not kept across requests

    def __init__(
        self,
        model: Any,
        *,
        instructions: Optional[str] = None,
        stream: Optional[bool] = None,
        retry: Any = DEFAULT_RETRY,
        deadline: Optional[float] = None,
        **settings: Any,
    ) -> None:
        if isinstance(model, str):
            model = infer_model(model)
        if not isinstance(model, Model):
            raise TypeError(f"model() takes a pydantic-ai Model (or a model name such as 'openai:gpt-5'), not {model!r}")
        if stream is None:
            stream = getattr(model, "stream_function", True) is not None
        super().__init__(
            f"{model.system}:{model.model_name}",
            instructions=instructions,
            stream=stream,
            params=settings,
            retry=retry,
            deadline=deadline,
        )
        self.pydantic_ai_model = model

    def _repr_extra(self) -> str:
        return f", model={type(self.pydantic_ai_model).__name__}"

    # -- request --

    def _build(self, request: Any) -> Dict[str, Any]:
        messages = to_messages(request.messages, self._instructions_for(request))
        tools = [tool_definition(t) for t in request.tools or ()]
        output = getattr(request, "output", None)
        if output:
            parameters = ModelRequestParameters(
                function_tools=tools,
                output_mode="native",
                output_object=OutputObjectDefinition(json_schema=output["schema"], name=output.get("name"), strict=output.get("strict")),
                allow_text_output=True,
            )
        else:
            parameters = ModelRequestParameters(function_tools=tools)
        settings = self._params_for(request)
        return {"messages": messages, "model_settings": settings or None, "model_request_parameters": parameters}

    # -- reply --

    def _fail(self, exc: BaseException) -> BaseException:
        mapped = failure(self.protocol, exc)
        return exc if mapped is None else mapped

    async def _stream(self, request: Any, kwargs: Dict[str, Any]) -> AsyncIterator[Dict[str, Any]]:
        try:
            async with model_request_stream(self.pydantic_ai_model, **kwargs) as stream:
                async for event in stream:
                    chunk = _delta(event)
                    if chunk is not None:
                        yield chunk
                response = stream.get()
        except Exception as e:
            mapped = self._fail(e)
            if mapped is e:
                raise
            raise mapped from e
        for block in _tool_calls(response):
            yield block
        yield _usage(response)
        yield _finish(response)

    async def _complete(self, request: Any, kwargs: Dict[str, Any]) -> ModelReply:
        try:
            response = await model_request(self.pydantic_ai_model, **kwargs)
        except Exception as e:
            mapped = self._fail(e)
            if mapped is e:
                raise
            raise mapped from e
        blocks: List[Dict[str, Any]] = []
        for part in response.parts:
            if isinstance(part, ThinkingPart) and part.content:
                blocks.append({"type": "reasoning", "text": part.content})
            elif isinstance(part, TextPart) and part.content:
                blocks.append({"type": "text", "text": part.content})
        blocks.extend(_tool_calls(response))
        finish = _finish(response)["reason"]
        return ModelReply(blocks, usage=usage_dict(_usage(response)), finish=finish)


def model(m: Any, **options: Any) -> PydanticAIModel:
    """Any pydantic-ai ``Model`` (or a pydantic-ai model name, ``"groq:llama-3.3-70b"``) as a
    Kerman model: ``kerman.AgentLoop(model(MistralModel("mistral-large-latest")))``. Options as
    for :class:`PydanticAIModel`."""
    return PydanticAIModel(m, **options)


# -- Kerman → pydantic-ai ------------------------------------------------------------------------


def _user_content(blocks: Any) -> Any:
    parts: List[Any] = []
    for b in blocks:
        kind = b.get("type")
        if kind == "text":
            parts.append(b.get("text") or "")
        elif kind == "image":
            media, data, url = image_parts(b)
            if url:
                parts.append(ImageUrl(url=url))
            elif data:
                try:
                    raw = base64.b64decode(data, validate=True)
                except (binascii.Error, ValueError):
                    raise ValueError(f"an image block's data is not base64 (media type {media!r})") from None
                parts.append(BinaryContent(data=raw, media_type=media or "image/png"))
    if all(isinstance(p, str) for p in parts):
        return "\n".join(parts)
    return parts


def to_messages(history: Any, instructions: Optional[str]) -> List[ModelMessage]:
    """Kerman's history as pydantic-ai messages: user messages and tool results as request parts
    (adjacent ones in one ``ModelRequest``), assistant messages as ``ModelResponse``\\ s, the
    instructions on the last request."""
    out: List[ModelMessage] = []
    names: Dict[str, str] = {}  # tool call id -> tool name (a tool result names only the call)
    pending: List[Any] = []

    def close() -> None:
        if pending:
            out.append(ModelRequest(parts=list(pending)))
            pending.clear()

    for m in history:
        kind = type(m)
        if kind is AssistantMessage:
            parts: List[Any] = []
            for b in m.content:
                t = b.get("type")
                if t == "text" and b.get("text"):
                    parts.append(TextPart(content=b["text"]))
                elif t == "reasoning" and b.get("text"):
                    parts.append(ThinkingPart(content=b["text"]))
                elif t == "tool-call":
                    call_id = str(b.get("id") or "")
                    names[call_id] = str(b.get("name") or "")
                    parts.append(ToolCallPart(tool_name=names[call_id], args=b.get("arguments") or "{}", tool_call_id=call_id))
            if parts:
                close()
                out.append(ModelResponse(parts=parts))
        elif kind is ToolResultMessage:
            inner = m.content[0] if m.content else {}
            pending.append(
                ToolReturnPart(
                    tool_name=names.get(m.call_id, ""),
                    content=tool_result_text(inner),
                    tool_call_id=m.call_id,
                    outcome="failed" if m.is_error else "success",
                )
            )
        else:
            content = _user_content(m.content)
            if content:
                pending.append(UserPromptPart(content=content))
    close()
    if instructions:
        for i in range(len(out) - 1, -1, -1):
            message = out[i]
            if isinstance(message, ModelRequest):
                out[i] = ModelRequest(parts=message.parts, instructions=instructions)
                break
        else:
            out.append(ModelRequest(parts=[], instructions=instructions))
    return out


# -- pydantic-ai → Kerman chunks -----------------------------------------------------------------


def _delta(event: Any) -> Optional[Dict[str, Any]]:
    """The text or reasoning chunk of a stream event (tool calls are taken whole at the end)."""
    if isinstance(event, PartStartEvent):
        part = event.part
        if isinstance(part, TextPart) and part.content:
            return {"type": "text-delta", "text": part.content}
        if isinstance(part, ThinkingPart) and part.content:
            return {"type": "reasoning-delta", "text": part.content}
    elif isinstance(event, PartDeltaEvent):
        delta = event.delta
        if isinstance(delta, TextPartDelta) and delta.content_delta:
            return {"type": "text-delta", "text": delta.content_delta}
        if isinstance(delta, ThinkingPartDelta) and delta.content_delta:
            return {"type": "reasoning-delta", "text": delta.content_delta}
    return None


def _tool_calls(response: ModelResponse) -> List[Dict[str, Any]]:
    calls = []
    for part in response.parts:
        if isinstance(part, ToolCallPart):
            # The arguments as the model wrote them when it sent a string (a stream's pieces, joined).
            arguments = part.args if isinstance(part.args, str) and part.args else part.args_as_json_str()
            calls.append({"type": "tool-call", "id": part.tool_call_id or mint_call_id(), "name": part.tool_name, "arguments": arguments})
    return calls


def _usage(response: ModelResponse) -> Dict[str, Any]:
    u = response.usage
    details = getattr(u, "details", None) or {}
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return usage_chunk(u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens, reasoning)


def _finish(response: ModelResponse) -> Dict[str, Any]:
    reason = response.finish_reason
    provider_reason = (response.provider_details or {}).get("finish_reason") if isinstance(response.provider_details, dict) else None
    return {
        "type": "finish",
        "reason": "max-tokens" if reason == "length" else "stop",
        "providerReason": str(provider_reason or reason or "stop"),
    }
